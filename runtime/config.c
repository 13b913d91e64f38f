/* config.c -- the table of KHOR_* variables and their parsing (see config.h). */
#include "config.h"

#include "base/log.h"
#include "base/parse.h"
#include "base/secret.h"
#include "collectives/select.h"
#include "base/sock.h"
#include "rendezvous/store.h"

#include <stddef.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const struct config_var config_vars[] = {
	{ "KHOR_RANK", NULL, "This process's rank (set by khorrun; else, first found: torchrun's RANK, an MPI launcher's (OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK, PMI_RANK of Hydra or PMI-1/2, PMIX_RANK), SLURM_PROCID in an srun step, JOB_COMPLETION_INDEX)", NULL, NULL },
	{ "KHOR_SIZE", NULL, "Number of ranks (set by khorrun; else from the same source as the rank: WORLD_SIZE, OMPI_COMM_WORLD_SIZE, MV2_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS, KHOR_K8S_SIZE)", NULL, NULL },
	{ "KHOR_LOCAL_RANK", NULL, "Rank among the ranks on this host (else the launcher's: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID; else computed from host names)", NULL, NULL },
	{ "KHOR_LOCAL_SIZE", NULL, "Ranks on this host (else the launcher's: LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MV2_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS; else computed)", NULL, NULL },
	{ "KHOR_CROSS_RANK", NULL, "Rank among ranks with the same local rank (else computed)", NULL, NULL },
	{ "KHOR_CROSS_SIZE", NULL, "Number of ranks with this local rank (else computed)", NULL, NULL },
	{ "KHOR_LOCAL_CPUS", NULL, "CPUs this host's ranks share (set by khorrun; else this process's CPU set, or all online CPUs when it is one CPU)", NULL, NULL },
	{ "KHOR_STORE_ADDR", NULL, "host:port of the rendezvous store, or etcd://host:port for an etcd server (set by khorrun; else MASTER_ADDR:MASTER_PORT, or the srun step's first node, or Kubernetes index 0, where rank 0 starts it; under mpirun/mpiexec MASTER_ADDR and MASTER_PORT or this must be set, else every rank fails at init saying so)", NULL, NULL },
	{ "KHOR_K8S_SIZE", NULL, "Kubernetes indexed Job: number of ranks (the Job's completions); the rank is JOB_COMPLETION_INDEX, one per pod", NULL, NULL },
	{ "KHOR_K8S_SERVICE", NULL, "Kubernetes: the headless Service named as the pods' subdomain; the store is then on JOB-0.SERVICE, JOB being this pod's host name less its -INDEX", NULL, NULL },
	{ "KHOR_K8S_STORE_HOST", NULL, "Kubernetes: host of the store, served by index 0, instead of JOB-0.KHOR_K8S_SERVICE", NULL, NULL },
	{ "KHOR_K8S_STORE_PORT", "29500", "Kubernetes: port index 0 serves the store on", NULL, NULL },
	{ "KHOR_SECRET", NULL, "Job secret proven by every store and link handshake (khorrun makes one); unset = unauthenticated", NULL, NULL },
	{ "KHOR_JOB_ID", "default", "Job id; keys and links of other jobs are refused", NULL, NULL },
	{ "KHOR_TIMEOUT", "300s", "After this long a collective or wait warns and asks whether the ranks it waits for are alive (KHOR_HEARTBEAT_TIMEOUT): it waits on while they are and fails naming one that is not; without heartbeats to judge by (one rank, KHOR_HEARTBEAT_TIMEOUT=-1) it fails (e.g. 30s, 500ms, 5m; -1 = never)", NULL, NULL },
	{ "KHOR_INIT_TIMEOUT", NULL, "Deadline for all ranks to join at init (default: KHOR_TIMEOUT; alias HOROVOD_GLOO_TIMEOUT_SECONDS, seconds, which bounds only the rendezvous here)", "HOROVOD_GLOO_TIMEOUT_SECONDS", NULL },
	{ "KHOR_ELASTIC", "0", "1 = an elastic job: ranks rejoin a new generation after a loss or a host change instead of ending (needs khorrun's or etcd's store; alias HOROVOD_ELASTIC)", "HOROVOD_ELASTIC", NULL },
	{ "KHOR_WORKER_ID", NULL, "Elastic: this worker's id, HOST:SLOT (set by khorrun's elastic driver)", NULL, NULL },
	{ "KHOR_ELASTIC_TIMEOUT", "600s", "Elastic: how long khor_init waits for a generation that includes this worker", NULL, NULL },
	{ "KHOR_HEARTBEAT_TIMEOUT", "10s", "A rank whose heartbeat (through the store) has not moved for this long is not alive: khorrun kills it and the waits on it fail (-1 = off: nobody is judged, and KHOR_TIMEOUT is a deadline again)", NULL, NULL },
	{ "KHOR_HEARTBEAT_INTERVAL", "1s", "How often each rank beats its heartbeat (at most a fifth of KHOR_HEARTBEAT_TIMEOUT is used)", NULL, NULL },
	{ "KHOR_HOSTNAME", NULL, "Host identity used to group ranks per node (default: gethostname)", NULL, NULL },
	{ "KHOR_SOCKET_IFNAME", NULL, "Interface for links: prefixes (eth,ib), =exact, ^excluded, or a CIDR (198.18.0.0/15); unset = tcp publishes every usable address, the store's subnet first, and each peer dials one it can reach; when unset, HOROVOD_GLOO_IFACE (exact names, as khorrun --network-interface) and then NCCL_SOCKET_IFNAME (same syntax as this) are read", NULL, NULL },
	{ "KHOR_SOCKET_NSOCKS", "2", "TCP sockets per link; large messages are striped over them (1-16)", NULL, NULL },
	{ "KHOR_SOCKET_BUFSIZE", "0", "SO_SNDBUF/SO_RCVBUF of link sockets (0 = kernel autotuning, usually fastest)", NULL, NULL },
	{ "KHOR_MIN_STRIPE", "256K", "Smallest piece a message is striped into across sockets", NULL, NULL },
	{ "KHOR_SLICE_BYTES", "512K", "Pipeline slice of ring allreduce and chain broadcast", NULL, NULL },
	{ "KHOR_PIPELINE_DEPTH", "4", "Slices in flight per collective (1-64)", NULL, NULL },
	{ "KHOR_ALGO", "auto", "Allreduce algorithm: ring, tree (double binary), rd (recursive doubling), hd (halving-doubling) or auto (cost model)", NULL, NULL },
	{ "KHOR_AUTO_TRIALS", "3", "Auto: rounds of timed calls of each allreduce schedule the model predicts close, inside the first call of each power-of-two size (0 = the model alone; 0 when KHOR_COST_* are set)", NULL, NULL },
	{ "KHOR_HIER", "auto", "Node-aware allreduce/broadcast/allgather across hosts: on, off or auto (cost model); when unset, HOROVOD_HIERARCHICAL_ALLREDUCE and HOROVOD_HIERARCHICAL_ALLGATHER (1 on, 0 off) set allreduce's and allgather's alone", NULL, NULL },
	{ "KHOR_NCCL", "auto", "Device buffers: NCCL inside each node (libnccl.so.2, loaded at run time), khor across nodes: auto (CUDA memory, a dtype NCCL has, more than one rank per node), on (also one rank per node; a call NCCL can't take fails saying why) or off", NULL, NULL },
	{ "KHOR_RD_MAX_BYTES", NULL, "When set: broadcast uses the binomial tree, allgather Bruck and reduce-scatter recursive halving up to this size (total bytes), chain and ring above; unset = cost model", NULL, NULL },
	{ "KHOR_COST_ALPHA_US", NULL, "Cost model: per-message time in us (with BETA and GAMMA set, init skips its measurement)", NULL, NULL },
	{ "KHOR_COST_BETA_GBPS", NULL, "Cost model: link bandwidth in GB/s", NULL, NULL },
	{ "KHOR_COST_GAMMA_GBPS", NULL, "Cost model: reduction speed in GB/s", NULL, NULL },
	{ "KHOR_SPIN_US", "300", "Busy-poll this many microseconds before sleeping in a wait (0 = sleep at once)", NULL, NULL },
	{ "KHOR_TRANSPORT", "auto", "Links: ib (verbs, every peer), tcp, shm (same-host peers only) or auto (shm within a host; ib across where both ranks have it, else tcp)", NULL, NULL },
	{ "KHOR_SHM_CMA", "0", "shm: 1 = the receiver reads messages over 16 MiB straight from the sender's memory with process_vm_readv (one copy; where ptrace rules allow it, else the ring); 0 = every message goes through the shared ring, which measured faster", NULL, NULL },
	{ "KHOR_CHECKSUM", "0", "1 = every frame carries a 64-bit checksum of its payload, checked on arrival: a frame damaged anywhere between the two processes' memories fails the call naming the peer (shm and RDMA have no check of their own; tcp's covers only the wire); costs one pass over the data each way (64 MiB over tcp: 1.04x the time, docs/PERFORMANCE.md section 23)", NULL, NULL },
	{ "KHOR_FAULTS", NULL, "Tests only: faults to inject under the transports, as rules FROM>TO:KIND[=VALUE][@AT] (drop, trunc, hdr=FIELD, data, delay=MS, stall=MS, regfail, fail; transport/filter/filter.h has the grammar); unset = none, and nothing between the collectives and the transports", NULL, NULL },
	{ "KHOR_IB_HCA", NULL, "ib: devices and ports to use, as NCCL_IB_HCA: name prefixes (mlx5), =exact names, ^excluded, :port (mlx5_0:1); unset = the first active port", NULL, NULL },
	{ "KHOR_IB_GID_INDEX", NULL, "ib: GID table index (RoCE); unset = the RoCE v2 GID of the interface KHOR_SOCKET_IFNAME (or the store's route) selects", NULL, NULL },
	{ "KHOR_IB_QPS_PER_CONN", "2", "ib: reliable-connected queue pairs per link; large messages are split over them (1-8)", NULL, NULL },
	{ "KHOR_IB_TIMEOUT", "14", "ib: QP ack timeout exponent, 4.096 us x 2^N per retry (1-31)", NULL, NULL },
	{ "KHOR_IB_RETRY_CNT", "7", "ib: QP retries before a link fails with retry-exceeded (0-7)", NULL, NULL },
	{ "KHOR_IB_MAX_WR_BYTES", "0", "ib: largest RDMA write per work request (0 = the ports' max_msg_sz)", NULL, NULL },
	{ "KHOR_IB_FLUSH", "auto", "ib: flush after receives into registered memory: auto (device memory only) or always", NULL, NULL },
	{ "KHOR_REG_CACHE_ENTRIES", "64", "ib: unused memory registrations kept for reuse, at most this many (0 = none kept)", NULL, NULL },
	{ "KHOR_REG_CACHE_MB", "1024", "ib: ... and at most this many MiB registered in all (the locked-memory limit, ulimit -l, also bounds it)", NULL, NULL },
	{ "KHOR_REG_CACHE_USER", "0", "ib: 1 = keep user buffers registered across calls (the application never frees a buffer it passed, as MPI's leave_pinned); 0 = drop them at the end of each call", NULL, NULL },
	{ "KHOR_FUSION_THRESHOLD", "64M", "Engine: allreduces ready in one cycle are packed into one buffer up to this many bytes (0 = no fusion; alias HOROVOD_FUSION_THRESHOLD)", "HOROVOD_FUSION_THRESHOLD", NULL },
	{ "KHOR_CYCLE_TIME", "0", "Engine: least ms between the starts of two negotiation cycles (0 = start one as soon as work arrives; alias HOROVOD_CYCLE_TIME)", "HOROVOD_CYCLE_TIME", NULL },
	{ "KHOR_CACHE_CAPACITY", "1024", "Engine: response cache entries per process set (0 = off; alias HOROVOD_CACHE_CAPACITY)", "HOROVOD_CACHE_CAPACITY", NULL },
	{ "KHOR_TIMELINE", NULL, "Engine: write a Chrome trace-event timeline to this file (rank 0; %r in the name = every rank its own; alias HOROVOD_TIMELINE)", "HOROVOD_TIMELINE", NULL },
	{ "KHOR_TIMELINE_MARK_CYCLES", "0", "Engine: mark each negotiation cycle in the timeline (alias HOROVOD_TIMELINE_MARK_CYCLES)", "HOROVOD_TIMELINE_MARK_CYCLES", NULL },
	{ "KHOR_STALL_CHECK_TIME", "60", "Engine: seconds a tensor may wait for missing ranks before the coordinator warns (0 = off; alias HOROVOD_STALL_CHECK_TIME_SECONDS; HOROVOD_STALL_CHECK_DISABLE=1 turns it off)", "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE" },
	{ "KHOR_STALL_SHUTDOWN_TIME", "0", "Engine: seconds after which stalled tensors fail on every rank (0 = never; alias HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", NULL },
	{ "KHOR_AUTOTUNE", "0", "Engine: search fusion threshold and cycle time by measured throughput (alias HOROVOD_AUTOTUNE)", "HOROVOD_AUTOTUNE", NULL },
	{ "KHOR_AUTOTUNE_LOG", NULL, "Engine: CSV file of autotune's samples (alias HOROVOD_AUTOTUNE_LOG)", "HOROVOD_AUTOTUNE_LOG", NULL },
	{ "KHOR_AUTOTUNE_WARMUP_SAMPLES", "3", "Engine: autotune windows discarded at the start (alias HOROVOD_AUTOTUNE_WARMUP_SAMPLES)", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", NULL },
	{ "KHOR_AUTOTUNE_STEPS_PER_SAMPLE", "10", "Engine: cycles with work per autotune window (alias HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE)", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", NULL },
	{ "KHOR_LOG", "warn", "Log level: error, warn, info, debug, trace (alias HOROVOD_LOG_LEVEL)", NULL, NULL },
};
const int config_nvars = sizeof(config_vars) / sizeof(config_vars[0]);

bool config_known(const char *name)
{
	for (int i = 0; i < config_nvars; i++)
		if (strcmp(config_vars[i].name, name) == 0)
			return true;
	return false;
}

static const struct config_var *config_var_of(const char *name)
{
	for (int i = 0; i < config_nvars; i++)
		if (strcmp(config_vars[i].name, name) == 0)
			return &config_vars[i];
	return NULL;
}

const char *config_default(const char *name)
{
	const struct config_var *cv = config_var_of(name);

	return cv != NULL ? cv->def : NULL;
}

const char *config_lookup(const struct khor_config *cfg, const char *name)
{
	const char *v = NULL;

	for (int i = 0; cfg != NULL && i < cfg->n; i++)
		if (strcmp(cfg->keys[i], name) == 0)
			v = cfg->values[i];
	if (v == NULL)
		v = getenv(name);
	return v != NULL && *v != '\0' ? v : NULL;
}

/* An environment variable, with an empty value taken as unset. */
static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v != NULL && *v != '\0' ? v : NULL;
}

const char *config_lookup_alias(const struct khor_config *cfg, const char *name,
                                const char **from_out)
{
	const struct config_var *cv = config_var_of(name);
	const char *v = config_lookup(cfg, name);

	*from_out = name;
	if (v == NULL && cv != NULL && cv->alias != NULL) {
		v = env(cv->alias);
		*from_out = cv->alias;
	}
	return v;
}

bool config_alias_off(const struct khor_config *cfg, const char *name)
{
	const struct config_var *cv = config_var_of(name);
	const char *v = cv != NULL && cv->alias_off != NULL ? getenv(cv->alias_off) : NULL;

	return kparse_is_true(v) && config_lookup(cfg, name) == NULL;
}

static khor_status get_int(const struct khor_config *cfg, const char *name, const char *alt,
                           int64_t lo, int64_t hi, int64_t *out, bool *found, kerr *err)
{
	const char *v = config_lookup(cfg, name);
	const char *from = name;

	if (v == NULL && alt != NULL) {
		v = env(alt);
		from = alt;
	}
	if (v == NULL) {
		*found = false;
		return KHOR_SUCCESS;
	}
	if (!kparse_i64(v, out) || *out < lo || *out > hi)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected an integer from %lld "
		                "to %lld", from, v, (long long)lo, (long long)hi);
	*found = true;
	return KHOR_SUCCESS;
}

static khor_status get_size(const struct khor_config *cfg, const char *name, uint64_t lo,
                            uint64_t hi, uint64_t *out, kerr *err)
{
	const char *v = config_lookup(cfg, name);

	if (v == NULL)
		v = config_default(name);
	if (v == NULL) {
		*out = lo;
		return KHOR_SUCCESS;
	}
	if (!kparse_size(v, out) || *out < lo || *out > hi)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected a size from %llu to "
		                "%llu bytes (suffixes K, M, G allowed)", name, v,
		                (unsigned long long)lo, (unsigned long long)hi);
	return KHOR_SUCCESS;
}

static khor_status get_duration(const struct khor_config *cfg, const char *name, const char *def,
                                int64_t *out, kerr *err)
{
	const char *v = config_lookup(cfg, name);

	if (v == NULL)
		v = def;
	if (!kparse_duration_ms(v, out))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected a duration such as "
		                "30s, 500ms or 5m (-1 for none)", name, v);
	return KHOR_SUCCESS;
}

/*
 * First host of a Slurm node list, the node where task 0 of a block- or cyclic-distributed
 * step runs: "node[03-05,7],gpu1" -> "node03", "rack[1-2]-n[08-09]" -> "rack1-n08". Each
 * bracket stands for its first number, leading zeros kept; text around brackets is copied.
 */
static bool slurm_first_host(const char *list, char *out, size_t len)
{
	size_t o = 0;
	const char *p = list;

	while (*p != '\0' && *p != ',') {
		if (*p == '[') {
			p++;
			if (*p < '0' || *p > '9')
				return false;
			while (*p >= '0' && *p <= '9') {
				if (o + 1 >= len)
					return false;
				out[o++] = *p++;
			}
			while (*p != '\0' && *p != ']')
				p++;
			if (*p++ != ']')
				return false;
		} else {
			if (o + 1 >= len)
				return false;
			out[o++] = *p++;
		}
	}
	out[o] = '\0';
	return o > 0;
}

/*
 * The store port of an srun step: 20000 + 10 x (job id mod 1000) + (step id mod 10). Two
 * steps of one job running at once (srun ... & srun ... &) must not meet on one port, nor a
 * job and the one before it, whose store may still be closing; below 32768 to stay out of
 * Linux's ephemeral range, where the links' own ports come from.
 */
static uint16_t slurm_store_port(void)
{
	int64_t job = 0, step = 0;
	const char *j = env("SLURM_JOB_ID"), *t = env("SLURM_STEP_ID");

	if (t == NULL)
		t = env("SLURM_STEPID");
	if (j == NULL || !kparse_i64(j, &job) || job < 0)
		job = 0;
	if (t == NULL || !kparse_i64(t, &step) || step < 0)
		step = 0;
	return (uint16_t)(20000 + 10 * (job % 1000) + step % 10);
}

/*
 * A pod of an indexed Job is named <job>-<index> (Kubernetes sets its host name so, and
 * JOB_COMPLETION_INDEX to the index): the Job's name is the host name less that suffix.
 * False when the name is not of that form (a pod template that sets hostname itself).
 */
static bool k8s_job_name(const char *hostname, int64_t index, char *out, size_t len)
{
	char suffix[32];
	size_t hl = strlen(hostname), sl;

	snprintf(suffix, sizeof(suffix), "-%lld", (long long)index);
	sl = strlen(suffix);
	if (hl <= sl || strcmp(hostname + hl - sl, suffix) != 0 || hl - sl >= len)
		return false;
	memcpy(out, hostname, hl - sl);
	out[hl - sl] = '\0';
	return true;
}

khor_status config_parse_algo(const char *p, int *algo, kerr *err)
{
	static const char *const names[] = { "auto", "ring", "rd", "tree", "hd" };

	if (p == NULL)
		p = "auto";
	for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++) {
		if (strcmp(p, names[i]) == 0) {
			*algo = i; /* enum allreduce_algo's order */
			return KHOR_SUCCESS;
		}
	}
	return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_ALGO='%s': expected ring, tree, rd, hd "
	                "or auto", p);
}

/* off (0), on (1) or auto (2, also when unset): KHOR_HIER's and KHOR_NCCL's values. */
static khor_status parse_tristate(const char *name, const char *expected, const char *p, int *out,
                                  kerr *err)
{
	bool on = false;

	if (p == NULL || strcmp(p, "auto") == 0) {
		*out = 2;
		return KHOR_SUCCESS;
	}
	if (!kparse_bool(p, &on))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected %s", name, p, expected);
	*out = on ? 1 : 0;
	return KHOR_SUCCESS;
}

khor_status config_parse_hier(const char *p, int *hier, kerr *err)
{
	return parse_tristate("KHOR_HIER", "on, off or auto", p, hier, err);
}

khor_status config_parse_nccl(const char *p, int *nccl, kerr *err)
{
	return parse_tristate("KHOR_NCCL", "auto, on or off", p, nccl, err);
}

/*
 * MPI launchers. khor links no MPI; it reads the rank and size they export, so that
 * `mpirun -np 4 prog` is one 4-rank job and not, as it was, four one-rank jobs. Tried in
 * this order: OpenMPI also sets PMIX_RANK, and MVAPICH2 may set PMI_RANK, so their own names
 * come first for their local ranks to be read. PMI-1/2 is MPICH's Hydra (mpiexec.hydra),
 * Intel MPI and srun --mpi=pmi2; PMIx exports no size, so PMIX_RANK alone is refused.
 */
struct mpi_launcher {
	const char *what;   /* for messages */
	const char *source; /* settings.source */
	const char *rank, *size, *local_rank, *local_size;
};

static const struct mpi_launcher mpi_launchers[] = {
	{ "OpenMPI's mpirun", "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE" },
	{ "MVAPICH2's launcher", "mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
	  "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE" },
	{ "a PMI launcher (MPICH's Hydra mpiexec, Intel MPI, srun --mpi=pmi2)", "pmi", "PMI_RANK",
	  "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" },
	{ "a PMIx launcher (prterun, srun --mpi=pmix)", "pmix", "PMIX_RANK", NULL, NULL, NULL },
};

static const struct mpi_launcher *mpi_detect(void)
{
	for (size_t i = 0; i < sizeof(mpi_launchers) / sizeof(mpi_launchers[0]); i++)
		if (env(mpi_launchers[i].rank) != NULL)
			return &mpi_launchers[i];
	return NULL;
}

/*
 * srun --mpi=pmi2/pmix sets both Slurm's and PMI's variables, with the same values: that is
 * an srun step (whose store Slurm's variables give). mpirun inside an allocation starts its
 * daemons with srun, and its ranks inherit the daemon's SLURM_PROCID and SLURM_NTASKS (a
 * node's index and the node count): there the MPI launcher's numbers are the ranks'.
 */
static bool mpi_is_the_srun_step(const struct mpi_launcher *m)
{
	if (strcmp(env(m->rank), env("SLURM_PROCID")) != 0)
		return false;
	return m->size == NULL || env(m->size) == NULL ||
	       strcmp(env(m->size), env("SLURM_NTASKS")) == 0;
}

/* HOROVOD_* names khor reads besides the table's aliases (or khorrun exports for scripts). */
static const char *const horovod_read[] = {
	"HOROVOD_LOG_LEVEL", /* base/log.c */
	"HOROVOD_GLOO_IFACE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER",
	/* khorrun's, for scripts written for horovodrun (launcher/env.h), and its own. */
	"HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
	"HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_ELASTIC_TIMEOUT",
};

bool config_horovod_read(const char *name)
{
	for (size_t i = 0; i < sizeof(horovod_read) / sizeof(horovod_read[0]); i++)
		if (strcmp(horovod_read[i], name) == 0)
			return true;
	for (int i = 0; i < config_nvars; i++)
		if ((config_vars[i].alias != NULL && strcmp(config_vars[i].alias, name) == 0) ||
		    (config_vars[i].alias_off != NULL && strcmp(config_vars[i].alias_off, name) == 0))
			return true;
	return false;
}

extern char **environ;

int config_warn_unread_horovod(void)
{
	int n = 0;

	for (char **e = environ; *e != NULL; e++) {
		const char *eq = strchr(*e, '=');
		char name[128];
		if (strncmp(*e, "HOROVOD_", 8) != 0 || eq == NULL ||
		    (size_t)(eq - *e) >= sizeof(name))
			continue;
		memcpy(name, *e, (size_t)(eq - *e));
		name[eq - *e] = '\0';
		if (config_horovod_read(name))
			continue;
		KLOG_WARN("%s is set but khor does not read it, so it has no effect: khor's "
		          "settings and the Horovod names it reads are listed by khorrun --help-env "
		          "and the README's Configuration table", name);
		n++;
	}
	return n;
}

/*
 * Horovod's per-collective switches, read only when KHOR_HIER is not given (which, being
 * khor's own, wins as every KHOR_* name wins over its alias). Each sets its collective
 * alone: Horovod's default for the other is flat, khor's stays KHOR_HIER's auto.
 */
static khor_status parse_hier_aliases(const struct khor_config *cfg, settings *s, kerr *err)
{
	static const char *const names[2] = { "HOROVOD_HIERARCHICAL_ALLREDUCE",
		                               "HOROVOD_HIERARCHICAL_ALLGATHER" };
	int *out[2] = { &s->hier_allreduce, &s->hier_allgather };

	for (int i = 0; i < 2; i++) {
		const char *p = config_lookup(cfg, "KHOR_HIER") == NULL ? env(names[i]) : NULL;
		bool on;
		*out[i] = -1;
		if (p == NULL)
			continue;
		if (!kparse_bool(p, &on))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%.32s': expected 1 or 0",
			                names[i], p);
		*out[i] = on ? 1 : 0;
	}
	return KHOR_SUCCESS;
}

/* KHOR_ELASTIC and the heartbeat: parsed after the store, which elastic mode needs. */
static khor_status parse_elastic(const struct khor_config *cfg, settings *s, kerr *err)
{
	const char *from;
	const char *p = config_lookup_alias(cfg, "KHOR_ELASTIC", &from);
	khor_status st;

	s->elastic = false;
	if (p != NULL && !kparse_bool(p, &s->elastic))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%.32s': expected 0 or 1", from, p);
	p = config_lookup(cfg, "KHOR_WORKER_ID");
	if (p != NULL && (strlen(p) >= sizeof(s->worker_id) || strpbrk(p, " \t\n/") != NULL))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_WORKER_ID='%.64s': at most %zu "
		                "characters, no spaces or '/'", p, sizeof(s->worker_id) - 1);
	if (p != NULL)
		kstrlcpy(s->worker_id, p, sizeof(s->worker_id));
	else
		snprintf(s->worker_id, sizeof(s->worker_id), "%s:%d", s->hostname, s->rank);
	/* The id names this worker in the driver's plans and the store's keys. */
	if (p == NULL && s->elastic && strpbrk(s->worker_id, " \t\n/") != NULL)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "this worker's elastic id '%.64s', made of "
		                "the host name (KHOR_HOSTNAME) and the rank, holds a space or a '/': "
		                "set KHOR_WORKER_ID", s->worker_id);
	if ((st = get_duration(cfg, "KHOR_ELASTIC_TIMEOUT", config_default("KHOR_ELASTIC_TIMEOUT"),
	                       &s->elastic_timeout_ms, err)) ||
	    (st = get_duration(cfg, "KHOR_HEARTBEAT_TIMEOUT",
	                       config_default("KHOR_HEARTBEAT_TIMEOUT"), &s->hb_timeout_ms, err)) ||
	    (st = get_duration(cfg, "KHOR_HEARTBEAT_INTERVAL",
	                       config_default("KHOR_HEARTBEAT_INTERVAL"), &s->hb_interval_ms, err)))
		return st;
	if (s->hb_interval_ms <= 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_HEARTBEAT_INTERVAL must be positive");
	if (s->hb_timeout_ms > 0 && s->hb_interval_ms > s->hb_timeout_ms / 5)
		s->hb_interval_ms = s->hb_timeout_ms / 5 > 0 ? s->hb_timeout_ms / 5 : 1;
	if (!s->elastic)
		return KHOR_SUCCESS;
	if (config_lookup(cfg, "KHOR_STORE_ADDR") == NULL)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s=1 needs a rendezvous store that outlives "
		                "the ranks: start the job with khorrun's elastic flags (--min-np, "
		                "--max-np, --host-discovery-script) or set KHOR_STORE_ADDR to khorrun's "
		                "store or etcd://HOST:PORT; %s", from,
		                s->serve_store || s->store_host[0] != '\0'
		                    ? "here rank 0 would serve the store itself, and it would go with "
		                      "rank 0"
		                    : "here no store is set");
	return KHOR_SUCCESS;
}

khor_status config_parse(const struct khor_config *cfg, settings *s, kerr *err)
{
	int64_t v;
	bool found, have_rank, have_size;
	khor_status st;
	const char *p;
	int64_t rank = 0, size = 1;

	memset(s, 0, sizeof(*s));
	s->local_rank = s->local_size = s->cross_rank = s->cross_size = -1;
	s->local_cpus = -1;

	p = config_lookup(cfg, "KHOR_HOSTNAME");
	if (p != NULL)
		kstrlcpy(s->hostname, p, sizeof(s->hostname));
	else if (gethostname(s->hostname, sizeof(s->hostname) - 1) != 0)
		kstrlcpy(s->hostname, "localhost", sizeof(s->hostname));

	/*
	 * Rank and size: khorrun / caller, then torchrun, then an MPI launcher (unless it is
	 * the srun step's own PMI), then an srun step, then a Kubernetes indexed Job, else a
	 * one-rank job. Slurm counts only inside a step: the batch script
	 * itself also has SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but no step id,
	 * and a program it runs directly would otherwise wait out its timeout for ranks that
	 * srun never starts. JOB_COMPLETION_INDEX alone is an indexed Job of independent
	 * pods (each its own one-rank job); KHOR_K8S_SIZE makes them one job.
	 */
	kstrlcpy(s->source, "khor", sizeof(s->source));
	if ((st = get_int(cfg, "KHOR_RANK", NULL, 0, 1 << 24, &rank, &have_rank, err)) ||
	    (st = get_int(cfg, "KHOR_SIZE", NULL, 1, 1 << 24, &size, &have_size, err)))
		return st;
	if (have_rank != have_size)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_RANK and KHOR_SIZE must be set "
		                "together (got only %s)", have_rank ? "KHOR_RANK" : "KHOR_SIZE");
	const struct mpi_launcher *mpi = have_rank ? NULL : mpi_detect();
	bool srun_step = env("SLURM_PROCID") && env("SLURM_NTASKS") &&
	                 (env("SLURM_STEP_ID") || env("SLURM_STEPID"));
	if (mpi != NULL && srun_step && mpi_is_the_srun_step(mpi))
		mpi = NULL;
	if (!have_rank && env("RANK") && env("WORLD_SIZE")) {
		mpi = NULL;
		kstrlcpy(s->source, "torchrun", sizeof(s->source));
		if ((st = get_int(NULL, "", "RANK", 0, 1 << 24, &rank, &found, err)) ||
		    (st = get_int(NULL, "", "WORLD_SIZE", 1, 1 << 24, &size, &found, err)))
			return st;
		have_rank = true;
	} else if (!have_rank && mpi != NULL) {
		if (mpi->size == NULL || env(mpi->size) == NULL)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "started by %s (%s=%s), which does "
			                "not export the number of ranks: set KHOR_RANK and KHOR_SIZE "
			                "(and MASTER_ADDR and MASTER_PORT), or start the job with "
			                "khorrun, OpenMPI's mpirun or MPICH's mpiexec", mpi->what,
			                mpi->rank, env(mpi->rank));
		kstrlcpy(s->source, mpi->source, sizeof(s->source));
		if ((st = get_int(NULL, "", mpi->rank, 0, 1 << 24, &rank, &found, err)) ||
		    (st = get_int(NULL, "", mpi->size, 1, 1 << 24, &size, &found, err)))
			return st;
		have_rank = true;
	} else if (!have_rank && srun_step) {
		kstrlcpy(s->source, "slurm", sizeof(s->source));
		if ((st = get_int(NULL, "", "SLURM_PROCID", 0, 1 << 24, &rank, &found, err)) ||
		    (st = get_int(NULL, "", "SLURM_NTASKS", 1, 1 << 24, &size, &found, err)))
			return st;
		have_rank = true;
	} else if (!have_rank && config_lookup(cfg, "KHOR_K8S_SIZE")) {
		if (!env("JOB_COMPLETION_INDEX"))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_K8S_SIZE is set but "
			                "JOB_COMPLETION_INDEX is not: Kubernetes sets it in the pods of a "
			                "Job with completionMode: Indexed (else set KHOR_RANK and "
			                "KHOR_SIZE)");
		kstrlcpy(s->source, "k8s", sizeof(s->source));
		if ((st = get_int(NULL, "", "JOB_COMPLETION_INDEX", 0, 1 << 24, &rank, &found, err)) ||
		    (st = get_int(cfg, "KHOR_K8S_SIZE", NULL, 1, 1 << 24, &size, &found, err)))
			return st;
		have_rank = true;
	}
	if (rank >= size)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "rank %lld is not below size %lld (from %s)",
		                (long long)rank, (long long)size, s->source);
	s->rank = (int)rank;
	s->size = (int)size;

	static const struct { const char *name, *torch, *slurm; size_t off; } topo[] = {
		{ "KHOR_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", offsetof(settings, local_rank) },
		{ "KHOR_LOCAL_SIZE", "LOCAL_WORLD_SIZE", NULL, offsetof(settings, local_size) },
		{ "KHOR_CROSS_RANK", "GROUP_RANK", "SLURM_NODEID", offsetof(settings, cross_rank) },
		{ "KHOR_CROSS_SIZE", NULL, "SLURM_NNODES", offsetof(settings, cross_size) },
	};
	for (size_t i = 0; i < sizeof(topo) / sizeof(topo[0]); i++) {
		const char *alt = strcmp(s->source, "torchrun") == 0 ? topo[i].torch
		                  : strcmp(s->source, "slurm") == 0 ? topo[i].slurm
		                  : mpi == NULL                     ? NULL
		                  : i == 0                          ? mpi->local_rank
		                  : i == 1                          ? mpi->local_size
		                                                    : NULL;
		st = get_int(cfg, topo[i].name, alt, 0, 1 << 24, &v, &found, err);
		if (st != KHOR_SUCCESS)
			return st;
		if (found)
			*(int *)((char *)s + topo[i].off) = (int)v;
	}

	if ((st = get_int(cfg, "KHOR_LOCAL_CPUS", NULL, 1, 1 << 20, &v, &found, err)))
		return st;
	if (found)
		s->local_cpus = (int)v;

	/* The store: given, or derived from torchrun/Slurm variables with rank 0 serving it. */
	p = config_lookup(cfg, "KHOR_STORE_ADDR");
	if (p != NULL) {
		/* An etcd server outlives the job and is never served by a rank. */
		s->store_etcd = strncmp(p, STORE_ETCD_SCHEME, strlen(STORE_ETCD_SCHEME)) == 0;
		if (!ksock_split_hostport(s->store_etcd ? p + strlen(STORE_ETCD_SCHEME) : p,
		                          s->store_host, sizeof(s->store_host), &s->store_port))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_STORE_ADDR='%s': expected "
			                "host:port, or etcd://host:port for an etcd server", p);
	} else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
		if ((st = get_int(NULL, "", "MASTER_PORT", 1, 65535, &v, &found, err)))
			return st;
		kstrlcpy(s->store_host, env("MASTER_ADDR"), sizeof(s->store_host));
		/* torchrun's own TCPStore already holds MASTER_PORT; khor takes the next one. */
		s->store_port = (uint16_t)(env("TORCHELASTIC_RUN_ID") && v < 65535 ? v + 1 : v);
		s->serve_store = true;
	} else if (strcmp(s->source, "slurm") == 0 &&
	           (env("SLURM_STEP_NODELIST") || env("SLURM_JOB_NODELIST"))) {
		/* The step's nodes, not the job's: a step may run on a part of the allocation. */
		const char *var = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
		                                             : "SLURM_JOB_NODELIST";
		if (!slurm_first_host(env(var), s->store_host, sizeof(s->store_host)))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': cannot read its first host; "
			                "set MASTER_ADDR and MASTER_PORT (rank 0 serves the store there)",
			                var, env(var));
		s->store_port = slurm_store_port();
		s->serve_store = true;
	} else if (strcmp(s->source, "k8s") == 0) {
		if ((st = get_int(cfg, "KHOR_K8S_STORE_PORT", NULL, 1, 65535, &v, &found, err)))
			return st;
		s->store_port = (uint16_t)(found ? v : atoi(config_default("KHOR_K8S_STORE_PORT")));
		p = config_lookup(cfg, "KHOR_K8S_STORE_HOST");
		const char *svc = config_lookup(cfg, "KHOR_K8S_SERVICE");
		char job[256];
		if (p != NULL) {
			kstrlcpy(s->store_host, p, sizeof(s->store_host));
		} else if (svc != NULL && k8s_job_name(s->hostname, rank, job, sizeof(job))) {
			snprintf(s->store_host, sizeof(s->store_host), "%s-0.%s", job, svc);
		} else if (s->size > 1) {
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "a %d-rank Kubernetes job needs the "
			                "store's host: set KHOR_K8S_SERVICE to the headless Service "
			                "named as the pod template's subdomain (the store is then on "
			                "<job>-0.<service>%s), or KHOR_K8S_STORE_HOST", s->size,
			                svc == NULL ? ""
			                            : "; this pod's host name does not end in -<index>");
		}
		s->serve_store = true;
	} else if (s->size > 1 && mpi != NULL) {
		/* Every rank fails here at once, before any network: no rank waits for a store. */
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "rank %d of %d: started by %s (%s=%s, "
		                "%s=%s) with no rendezvous address: set MASTER_ADDR and MASTER_PORT "
		                "for every rank (rank 0 serves the store there, e.g. mpirun -x "
		                "MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500 ...), or "
		                "KHOR_STORE_ADDR to a running store, or start the job with khorrun%s",
		                s->rank, s->size, mpi->what, mpi->rank, env(mpi->rank), mpi->size,
		                env(mpi->size),
		                env("MASTER_ADDR") ? " (MASTER_ADDR is set, MASTER_PORT is not)"
		                : env("MASTER_PORT") ? " (MASTER_PORT is set, MASTER_ADDR is not)"
		                                     : "");
	} else if (s->size > 1) {
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "a %d-rank job needs a rendezvous store: "
		                "start it with khorrun, or set KHOR_STORE_ADDR (or MASTER_ADDR and "
		                "MASTER_PORT, where rank 0 will serve it)", s->size);
	}
	s->serve_store = s->serve_store && s->rank == 0;

	/* The config object's value, else the environment's, which is wiped once read: the
	 * one copy is the kept one (base/secret.h), left out of core dumps. */
	p = cfg != NULL ? cfg->secret : NULL;
	if (p == NULL || *p == '\0')
		p = ksecret_env("KHOR_SECRET");
	if (p != NULL && strlen(p) > KSECRET_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_SECRET is longer than %d bytes",
		                KSECRET_MAX);
	if ((s->secret = ksecret_keep(p)) == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "no page to keep KHOR_SECRET in");
	/* Each srun step and each indexed Job a job of its own, by default. */
	char job_id[128];
	p = config_lookup(cfg, "KHOR_JOB_ID");
	if (p == NULL)
		p = env("TORCHELASTIC_RUN_ID");
	if (p == NULL && strcmp(s->source, "slurm") == 0 && env("SLURM_JOB_ID")) {
		const char *step = env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : env("SLURM_STEPID");
		snprintf(job_id, sizeof(job_id), "%s.%s", env("SLURM_JOB_ID"), step);
		p = job_id;
	}
	if (p == NULL && strcmp(s->source, "k8s") == 0 &&
	    k8s_job_name(s->hostname, s->rank, job_id, sizeof(job_id)))
		p = job_id;
	if (p == NULL)
		p = env("SLURM_JOB_ID");
	if (p == NULL)
		p = "default";
	if (strlen(p) >= sizeof(s->job_id) || strchr(p, '/') != NULL)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_JOB_ID='%s': at most %zu characters "
		                "and no '/'", p, sizeof(s->job_id) - 1);
	kstrlcpy(s->job_id, p, sizeof(s->job_id));

	/*
	 * KHOR_SOCKET_IFNAME, else Horovod's (gloo takes exact names, as khorrun's
	 * --network-interface), else NCCL's, whose syntax is this one's.
	 */
	const char *ifvar = "KHOR_SOCKET_IFNAME";
	p = config_lookup(cfg, ifvar);
	bool exact = false;
	if (p == NULL && (p = env("HOROVOD_GLOO_IFACE")) != NULL) {
		ifvar = "HOROVOD_GLOO_IFACE";
		exact = p[0] != '=' && p[0] != '^' && strchr(p, '/') == NULL;
	} else if (p == NULL && (p = env("NCCL_SOCKET_IFNAME")) != NULL) {
		ifvar = "NCCL_SOCKET_IFNAME";
	}
	if (p != NULL && strlen(p) + (exact ? 1 : 0) >= sizeof(s->ifname))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s is longer than %zu characters", ifvar,
		                sizeof(s->ifname) - 2);
	snprintf(s->ifname, sizeof(s->ifname), "%s%s", exact ? "=" : "", p ? p : "");
	p = config_lookup(cfg, "KHOR_TRANSPORT");
	kstrlcpy(s->transport, p ? p : "auto", sizeof(s->transport));
	if (strcmp(s->transport, "ib") != 0 && strcmp(s->transport, "tcp") != 0 &&
	    strcmp(s->transport, "shm") != 0 && strcmp(s->transport, "auto") != 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_TRANSPORT='%s': expected ib, tcp, shm "
		                "or auto", s->transport);
	p = config_lookup(cfg, "KHOR_CHECKSUM");
	s->checksum = false;
	if (p != NULL && !kparse_bool(p, &s->checksum))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_CHECKSUM='%.32s': expected 0 or 1", p);
	p = config_lookup(cfg, "KHOR_FAULTS");
	s->faults[0] = '\0';
	if (p != NULL && strlen(p) >= sizeof(s->faults))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS: %zu characters, more than "
		                "the %zu it takes", strlen(p), sizeof(s->faults) - 1);
	if (p != NULL)
		kstrlcpy(s->faults, p, sizeof(s->faults));
	p = config_lookup(cfg, "KHOR_SHM_CMA");
	s->shm_cma = false;
	if (p != NULL && !kparse_bool(p, &s->shm_cma))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_SHM_CMA='%.32s': expected 0 or 1", p);
	p = config_lookup(cfg, "KHOR_IB_HCA");
	kstrlcpy(s->ib_hca, p ? p : "", sizeof(s->ib_hca));
	p = config_lookup(cfg, "KHOR_IB_FLUSH");
	if (p != NULL && strcmp(p, "auto") != 0 && strcmp(p, "always") != 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_IB_FLUSH='%s': expected auto or always",
		                p);
	s->ib_flush_always = p != NULL && strcmp(p, "always") == 0;
	{
		int64_t rv;
		bool given;
		if ((st = get_int(cfg, "KHOR_IB_GID_INDEX", NULL, 0, 1 << 16, &rv, &given, err)))
			return st;
		s->ib_gid_index = given ? (int)rv : -1;
		if ((st = get_int(cfg, "KHOR_IB_QPS_PER_CONN", NULL, 1, 8, &rv, &given, err)))
			return st;
		s->ib_qps = (int)(given ? rv : atoll(config_default("KHOR_IB_QPS_PER_CONN")));
		if ((st = get_int(cfg, "KHOR_IB_TIMEOUT", NULL, 1, 31, &rv, &given, err)))
			return st;
		s->ib_timeout = (int)(given ? rv : atoll(config_default("KHOR_IB_TIMEOUT")));
		if ((st = get_int(cfg, "KHOR_IB_RETRY_CNT", NULL, 0, 7, &rv, &given, err)))
			return st;
		s->ib_retry_cnt = (int)(given ? rv : atoll(config_default("KHOR_IB_RETRY_CNT")));
		if ((st = get_int(cfg, "KHOR_IB_MAX_WR_BYTES", NULL, 0, 1 << 30, &rv, &given, err)))
			return st;
		s->ib_max_wr = (uint32_t)(given ? rv : atoll(config_default("KHOR_IB_MAX_WR_BYTES")));
	}
	{
		int64_t rv;
		bool given;
		if ((st = get_int(cfg, "KHOR_REG_CACHE_ENTRIES", NULL, 0, 1 << 20, &rv, &given, err)))
			return st;
		s->reg_entries = given ? (int)rv : atoi(config_default("KHOR_REG_CACHE_ENTRIES"));
		if ((st = get_int(cfg, "KHOR_REG_CACHE_MB", NULL, 0, 1 << 24, &rv, &given, err)))
			return st;
		s->reg_bytes = (uint64_t)(given ? rv : atoll(config_default("KHOR_REG_CACHE_MB"))) << 20;
		if ((st = get_int(cfg, "KHOR_REG_CACHE_USER", NULL, 0, 1, &rv, &given, err)))
			return st;
		s->reg_user = given && rv == 1;
	}

	if ((st = get_duration(cfg, "KHOR_TIMEOUT", config_default("KHOR_TIMEOUT"), &s->timeout_ms,
	                       err)))
		return st;
	{
		char def[32];
		snprintf(def, sizeof(def), "%lldms", (long long)s->timeout_ms);
		if (s->timeout_ms < 0)
			kstrlcpy(def, "-1", sizeof(def));
		const char *from;
		p = config_lookup_alias(cfg, "KHOR_INIT_TIMEOUT", &from);
		if (p == NULL)
			p = def;
		if (!kparse_duration_ms(p, &s->init_timeout_ms))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected a duration such "
			                "as 30s, 500ms or 5m (-1 for none; a plain number is seconds)",
			                from, p);
	}
	if ((st = parse_elastic(cfg, s, err)))
		return st;
	uint64_t u;
	if ((st = get_size(cfg, "KHOR_SOCKET_NSOCKS", 1, 16, &u, err)))
		return st;
	s->nsocks = (int)u;
	if ((st = get_size(cfg, "KHOR_SOCKET_BUFSIZE", 0, 1u << 30, &u, err)))
		return st;
	s->sock_bufsize = (int)u;
	if ((st = get_size(cfg, "KHOR_MIN_STRIPE", 64, 1ull << 30, &s->min_stripe, err)) ||
	    (st = get_size(cfg, "KHOR_SLICE_BYTES", 64, 1ull << 30, &s->slice_bytes, err)) ||
	    (st = get_size(cfg, "KHOR_PIPELINE_DEPTH", 1, 64, &u, err)))
		return st;
	s->pipeline_depth = (int)u;
	s->rd_max_set = config_lookup(cfg, "KHOR_RD_MAX_BYTES") != NULL;
	if ((st = get_size(cfg, "KHOR_RD_MAX_BYTES", 0, 1ull << 30, &s->rd_max_bytes, err)) ||
	    (st = get_size(cfg, "KHOR_SPIN_US", 0, 10000000, &s->spin_us, err)))
		return st;
	static const char *const cost_names[3] = { "KHOR_COST_ALPHA_US", "KHOR_COST_BETA_GBPS",
	                                           "KHOR_COST_GAMMA_GBPS" };
	int ncost = 0;
	for (int i = 0; i < 3; i++) {
		const char *cv = config_lookup(cfg, cost_names[i]);
		char *end;
		if (cv == NULL)
			continue;
		double d = strtod(cv, &end);
		if (*end != '\0' || !(d > 0))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected a positive number",
			                cost_names[i], cv);
		s->cost[i] = i == 0 ? d * 1e-6 : 1.0 / (d * 1e9);
		ncost++;
	}
	if (ncost != 0 && ncost != 3)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "set all of KHOR_COST_ALPHA_US, "
		                "KHOR_COST_BETA_GBPS and KHOR_COST_GAMMA_GBPS, or none");
	/* A model given by hand is a request for its choices, run after run: no trials. */
	int64_t rounds;
	bool given;
	if ((st = get_int(cfg, "KHOR_AUTO_TRIALS", NULL, 0, TRIAL_MAX_ROUNDS, &rounds, &given,
	                  err)))
		return st;
	s->auto_trials = given      ? (int)rounds
	                 : ncost != 0 ? 0
	                              : atoi(config_default("KHOR_AUTO_TRIALS"));
	if ((st = parse_hier_aliases(cfg, s, err)) ||
	    (st = config_parse_hier(config_lookup(cfg, "KHOR_HIER"), &s->hier, err)) ||
	    (st = config_parse_nccl(config_lookup(cfg, "KHOR_NCCL"), &s->nccl, err)) ||
	    (st = config_parse_algo(config_lookup(cfg, "KHOR_ALGO"), &s->algo, err)))
		return st;
	return KHOR_SUCCESS;
}
