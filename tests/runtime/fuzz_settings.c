/*
 * fuzz_settings.c -- libFuzzer harness for every settings string: the KHOR_* table's values
 * as the runtime reads them (config_parse: the caller's khor_config, then the environment,
 * then torchrun's, an MPI launcher's, an srun step's and a Kubernetes Job's variables), the
 * engine's (settings_read, with Horovod's aliases), the log level (klog_init_from_env), the
 * interface spec (ksock_pick_address), KHOR_FAULTS' rules (filter_parse) and the strict
 * number parsers of base/parse.c.
 *
 * The input is lines "<n><d><value>\n": byte n picks a variable (mod the list below: the
 * table's names, their Horovod aliases and the other launchers' names), byte d whether it
 * goes into the khor_config (odd, KHOR_* names only) or the environment (even), the rest of
 * the line is its value. Every variable of the list is unset before each input. A value
 * also runs through each number parser alone. Invariants: what is accepted is within the
 * bounds the table promises (rank below size, 1-16 sockets, ...), strings stay terminated,
 * and a sized value printed back parses to the same number.
 *
 *   clang -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DKHOR_BUILDING_LIBRARY -Iinclude \
 *         -I. tests/runtime/fuzz_settings.c runtime/config.c engine/settings.c base/err.c \
 *         base/clock.c base/log.c base/sock.c base/parse.c base/auth.c -lcrypto \
 *         -o fuzz_settings
 *   ./fuzz_settings -max_total_time=60
 */
#include "runtime/config.h"
#include "engine/settings.h"
#include "transport/filter/filter.h"

#include "base/log.h"
#include "base/parse.h"
#include "base/secret.h"
#include "base/sock.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

/* What config_parse reads besides the table: the other launchers' variables. */
static const char *const others[] = {
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
	"MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_RANK",
	"MV2_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	"PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEPID",
	"SLURM_JOB_ID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NODELIST",
	"SLURM_JOB_NODELIST", "JOB_COMPLETION_INDEX", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME",
	"HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_LOG_LEVEL",
};

/*
 * The secrets an input may set. A process keeps every secret it is given for as long as it
 * lives (base/secret.h: a few pages, one slot each), so the fuzzer's values of KHOR_SECRET
 * map onto these few; one too long to keep stays as it is, and is refused before a slot is
 * taken.
 */
static const char *const secrets[] = { "", "s", "a-job-secret", "0123456789abcdef0123456789abcdef" };

static const char *names[256];
static int nnames;
/* putenv's strings, one per name: setenv would keep every value it was ever given. */
static char envbuf[256][4200];

static void setup(void)
{
	for (int i = 0; i < config_nvars && nnames < 256; i++) {
		names[nnames++] = config_vars[i].name;
		if (config_vars[i].alias != NULL)
			names[nnames++] = config_vars[i].alias;
		if (config_vars[i].alias_off != NULL)
			names[nnames++] = config_vars[i].alias_off;
	}
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]) && nnames < 256; i++)
		names[nnames++] = others[i];
}

static bool terminated(const char *s, size_t n)
{
	return memchr(s, '\0', n) != NULL;
}

static void check_settings(const settings *s)
{
	CHECK(s->rank >= 0 && s->rank < s->size && s->size <= (1 << 24));
	CHECK(s->local_rank >= -1 && s->local_size >= -1 && s->cross_rank >= -1 &&
	      s->cross_size >= -1);
	CHECK(s->local_cpus == -1 || (s->local_cpus >= 1 && s->local_cpus <= (1 << 20)));
	CHECK(terminated(s->store_host, sizeof(s->store_host)) &&
	      terminated(s->job_id, sizeof(s->job_id)) &&
	      terminated(s->hostname, sizeof(s->hostname)) &&
	      terminated(s->ifname, sizeof(s->ifname)) &&
	      terminated(s->transport, sizeof(s->transport)) &&
	      terminated(s->source, sizeof(s->source)) &&
	      terminated(s->ib_hca, sizeof(s->ib_hca)) &&
	      terminated(s->worker_id, sizeof(s->worker_id)));
	CHECK(s->secret != NULL && strlen(s->secret) <= KSECRET_MAX);
	CHECK(strchr(s->job_id, '/') == NULL);
	CHECK(!s->elastic || strpbrk(s->worker_id, " \t\n/") == NULL);
	CHECK(s->nsocks >= 1 && s->nsocks <= 16);
	CHECK(s->sock_bufsize >= 0 && s->sock_bufsize <= (1 << 30));
	CHECK(s->min_stripe >= 64 && s->min_stripe <= (1ull << 30));
	CHECK(s->slice_bytes >= 64 && s->slice_bytes <= (1ull << 30));
	CHECK(s->pipeline_depth >= 1 && s->pipeline_depth <= 64);
	CHECK(s->rd_max_bytes <= (1ull << 30) && s->spin_us <= 10000000);
	CHECK(s->algo >= 0 && s->algo <= 4 && s->hier >= 0 && s->hier <= 2 && s->nccl >= 0 &&
	      s->nccl <= 2);
	CHECK(s->ib_qps >= 1 && s->ib_qps <= 8 && s->ib_timeout >= 1 && s->ib_timeout <= 31 &&
	      s->ib_retry_cnt >= 0 && s->ib_retry_cnt <= 7 && s->ib_max_wr <= (1u << 30));
	CHECK(s->ib_gid_index >= -1 && s->ib_gid_index <= (1 << 16));
	CHECK(s->reg_entries >= 0 && s->reg_entries <= (1 << 20));
	CHECK(s->timeout_ms >= -1 && s->init_timeout_ms >= -1 && s->elastic_timeout_ms >= -1);
	CHECK(s->hb_interval_ms > 0);
	CHECK(s->hb_timeout_ms <= 0 || s->hb_interval_ms <= s->hb_timeout_ms / 5 ||
	      s->hb_interval_ms == 1);
	CHECK(s->auto_trials >= 0);
	CHECK(!s->serve_store || s->rank == 0);
}

static void check_engine(const eng_settings *s)
{
	CHECK(s->fusion_bytes <= (1ull << 40));
	CHECK(s->cycle_ms >= 0 && s->cycle_ms <= 60000);
	CHECK(s->cache_capacity >= 0 && s->cache_capacity <= (1 << 20));
	CHECK(terminated(s->timeline, sizeof(s->timeline)) &&
	      terminated(s->autotune_log, sizeof(s->autotune_log)));
	CHECK(s->stall_check_s >= 0 && s->stall_shutdown_s >= 0);
	CHECK(s->warmup_samples >= 0 && s->warmup_samples <= 100000);
	CHECK(s->steps_per_sample >= 1 && s->steps_per_sample <= 100000);
}

/* One value through each number parser alone. */
static void fuzz_value(const char *v)
{
	int64_t i;
	uint64_t u;
	bool b;
	char back[32];

	if (kparse_i64(v, &i)) {
		/* What parses as an integer prints back as one with the same value. */
		int64_t j;
		snprintf(back, sizeof(back), "%" PRId64, i);
		CHECK(kparse_i64(back, &j) && j == i);
	}
	if (kparse_size(v, &u)) {
		uint64_t w;
		snprintf(back, sizeof(back), "%" PRIu64, u);
		CHECK(kparse_size(back, &w) && w == u);
		CHECK(v[0] >= '0' && v[0] <= '9');
	}
	if (kparse_duration_ms(v, &i)) {
		CHECK(i >= -1);
		if (i >= 0) {
			int64_t j;
			snprintf(back, sizeof(back), "%" PRId64 "ms", i);
			CHECK(kparse_duration_ms(back, &j) && j == i);
		}
	}
	if (kparse_bool(v, &b))
		CHECK(kparse_is_true(v) == b);
	int algo, tri;
	kerr err;
	if (config_parse_algo(v, &algo, &err) == KHOR_SUCCESS)
		CHECK(algo >= 0 && algo <= 4);
	if (config_parse_hier(v, &tri, &err) == KHOR_SUCCESS)
		CHECK(tri >= 0 && tri <= 2);
	char host[256];
	uint16_t port;
	if (ksock_split_hostport(v, host, sizeof(host), &port))
		CHECK(terminated(host, sizeof(host)));
	/* KHOR_FAULTS: at most the table's rules, each of a known kind and field. */
	filter_rule rules[FILTER_RULES_MAX];
	int nr = -1;
	if (filter_parse(v, rules, &nr, &err) == KHOR_SUCCESS) {
		CHECK(nr >= 0 && nr <= FILTER_RULES_MAX);
		for (int k = 0; k < nr; k++)
			CHECK(rules[k].kind >= FK_DROP && rules[k].kind <= FK_FAIL &&
			      rules[k].field >= FF_COMM && rules[k].field <= FF_LEN &&
			      rules[k].from >= -1 && rules[k].to >= -1 && rules[k].ms >= 0);
	} else {
		CHECK(err.status == KHOR_ERR_INVALID_ARG && terminated(err.text, sizeof(err.text)));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct khor_config cfg;
	char *text, *p, *spec = NULL;

	if (nnames == 0)
		setup();
	if (size > 8192)
		return 0;
	for (int i = 0; i < nnames; i++)
		unsetenv(names[i]);
	memset(&cfg, 0, sizeof(cfg));
	text = malloc(size + 1);
	CHECK(text != NULL);
	memcpy(text, data, size);
	text[size] = '\0';
	p = text;
	while (p < text + size) {
		char *nl = memchr(p, '\n', (size_t)(text + size - p));
		char *end = nl != NULL ? nl : text + size;
		*end = '\0';
		if (end - p >= 2) {
			const char *name = names[(uint8_t)p[0] % nnames];
			char *v = p + 2;
			fuzz_value(v);
			if (strcmp(name, "KHOR_SECRET") == 0 && strlen(v) <= KSECRET_MAX)
				v = (char *)secrets[(uint8_t)v[0] % (sizeof(secrets) / sizeof(secrets[0]))];
			if ((p[1] & 1) && strncmp(name, "KHOR_", 5) == 0 && cfg.n < 64) {
				cfg.keys[cfg.n] = (char *)name;
				cfg.values[cfg.n++] = v;
			} else if (strlen(v) < 4096) {
				char *e = envbuf[(uint8_t)p[0] % nnames];
				unsetenv(name);
				snprintf(e, sizeof(envbuf[0]), "%s=%s", name, v);
				putenv(e);
			}
			if (strcmp(name, "KHOR_SOCKET_IFNAME") == 0)
				spec = v;
		}
		p = end + 1;
	}
	settings s;
	eng_settings es;
	kerr err;
	kerr_clear(&err);
	if (config_parse(&cfg, &s, &err) == KHOR_SUCCESS)
		check_settings(&s);
	else
		CHECK(err.status == KHOR_ERR_INVALID_ARG && err.text[0] != '\0');
	kerr_clear(&err);
	if (settings_read(&cfg, &es, &err) == KHOR_SUCCESS)
		check_engine(&es);
	else
		CHECK(err.status == KHOR_ERR_INVALID_ARG && err.text[0] != '\0');
	klog_threshold = KLOG_WARN;
	klog_init_from_env();
	CHECK(klog_threshold >= KLOG_ERROR && klog_threshold <= KLOG_TRACE);
	klog_threshold = -1;
	if (spec != NULL) {
		/* The interface spec against this host's interfaces, the store on loopback. */
		ksockaddr hint, out;
		char ifname[64];
		CHECK(ksock_parse_addr_list("127.0.0.1:1", &hint, 1) == 1);
		if (ksock_pick_address(spec, &hint, &out, ifname, sizeof(ifname), &err) ==
		    KHOR_SUCCESS)
			CHECK(terminated(ifname, sizeof(ifname)));
	}
	free(text);
	return 0;
}
