/*
 * config.h -- every KHOR_* setting, parsed in one place.
 *
 * config_vars[] is the single table of variables (name, default, meaning); the README table
 * and `khorrun --help-env` show it (test_config checks the README row for row). A value
 * comes from the caller's khor_config first, then the environment, then the other
 * launchers' variables (torchrun, an MPI launcher, an srun step, a Kubernetes indexed Job),
 * then the default.
 */
#ifndef KHOR_RUNTIME_CONFIG_H
#define KHOR_RUNTIME_CONFIG_H

#include "base/err.h"

#include <stdbool.h>
#include <stdint.h>

struct config_var {
	const char *name;
	const char *def;  /* NULL: no default */
	const char *help;
	/* Horovod's name for the same setting, read from the environment when name is not
	 * given anywhere (HOROVOD_FUSION_THRESHOLD); NULL: none. */
	const char *alias;
	/* Horovod's switch that turns the setting off (HOROVOD_STALL_CHECK_DISABLE): when true
	 * and name itself is not given, the setting is 0 whatever the alias says; NULL: none. */
	const char *alias_off;
};

extern const struct config_var config_vars[];
extern const int config_nvars;

struct khor_config {
	int n;
	char *keys[64];
	char *values[64];
	const char *secret; /* KHOR_SECRET, kept apart (base/secret.h); NULL: not set here */
};

/* The settings a comm runs with, after parsing and checking. */
typedef struct settings {
	int rank, size;
	int local_rank, local_size, cross_rank, cross_size; /* -1: compute from host names */
	int local_cpus;          /* CPUs this host's ranks share; -1: from the CPU set */
	char store_host[256];
	uint16_t store_port;
	bool serve_store;       /* this process (rank 0) runs the store */
	bool store_etcd;        /* the store is an etcd server (KHOR_STORE_ADDR=etcd://...) */
	const char *secret; /* "" or the kept copy (base/secret.h): never a copy of its own */
	char job_id[64];
	char hostname[256];
	char ifname[256];
	char transport[16];
	char source[32];        /* rank/size from "khor" (KHOR_* or none), torchrun, slurm, k8s */
	int64_t timeout_ms;
	int64_t init_timeout_ms;
	int nsocks;
	uint64_t min_stripe;
	int sock_bufsize;
	uint64_t slice_bytes;
	int pipeline_depth;
	int algo;               /* enum allreduce_algo */
	uint64_t rd_max_bytes;
	bool rd_max_set;        /* KHOR_RD_MAX_BYTES given: thresholds instead of the model */
	uint64_t spin_us;
	int auto_trials;        /* KHOR_AUTO_TRIALS: timed calls per close schedule and size */
	int hier;               /* 0 off, 1 on, 2 auto */
	/* HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER: 0 off, 1 on for that collective alone;
	 * -1: as hier (always -1 when KHOR_HIER is given) */
	int hier_allreduce, hier_allgather;
	int nccl;               /* KHOR_NCCL: 0 off, 1 on, 2 auto (runtime/nccl.c) */
	double cost[3];         /* alpha s, beta s/B, gamma s/B from config; 0 = measure */
	int reg_entries;        /* KHOR_REG_CACHE_ENTRIES */
	uint64_t reg_bytes;     /* KHOR_REG_CACHE_MB, in bytes */
	bool reg_user;          /* KHOR_REG_CACHE_USER=1 */
	char ib_hca[256];       /* KHOR_IB_HCA, "" = any */
	int ib_gid_index;       /* -1 = automatic */
	int ib_qps, ib_timeout, ib_retry_cnt;
	uint32_t ib_max_wr;     /* 0 = the ports' limit */
	bool ib_flush_always;
	bool shm_cma;           /* KHOR_SHM_CMA=1 */
	bool checksum;          /* KHOR_CHECKSUM=1 (transport/filter) */
	char faults[1024];      /* KHOR_FAULTS, "" = none (transport/filter, tests only) */
	bool elastic;           /* KHOR_ELASTIC=1 (docs/ELASTIC.md) */
	char worker_id[128];    /* KHOR_WORKER_ID, else "<hostname>:<rank>" */
	int64_t elastic_timeout_ms;
	int64_t hb_timeout_ms;  /* KHOR_HEARTBEAT_TIMEOUT; < 0: off (liveness.h) */
	int64_t hb_interval_ms;
} settings;

/* Looks up name in cfg, then the environment; NULL when unset or empty. */
const char *config_lookup(const struct khor_config *cfg, const char *name);
bool config_known(const char *name);
/* The table's default of name; NULL when it has none (or name is not in the table). */
const char *config_default(const char *name);
/*
 * name as config_lookup finds it, else its Horovod alias from the environment (empty counts
 * as unset); *from_out is the variable the value came from, for error messages (name when
 * neither is set, then NULL is returned).
 */
const char *config_lookup_alias(const struct khor_config *cfg, const char *name,
                                const char **from_out);
/* True when name's Horovod off switch is set to 1, true, yes or on and name is not given. */
bool config_alias_off(const struct khor_config *cfg, const char *name);
khor_status config_parse(const struct khor_config *cfg, settings *out, kerr *err);
/* True for a HOROVOD_* name khor reads (an alias in the table, or one of a short list). */
bool config_horovod_read(const char *name);
/* Warns once per HOROVOD_* variable in the environment khor does not read; their count. */
int config_warn_unread_horovod(void);
/* KHOR_ALGO (NULL = auto) as enum allreduce_algo; KHOR_HIER (NULL = auto) as 0/1/2. */
khor_status config_parse_algo(const char *value, int *algo, kerr *err);
khor_status config_parse_hier(const char *value, int *hier, kerr *err);
/* KHOR_NCCL (NULL = auto) as 0 off, 1 on, 2 auto. */
khor_status config_parse_nccl(const char *value, int *nccl, kerr *err);

#endif
