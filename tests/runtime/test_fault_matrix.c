/*
 * test_fault_matrix.c -- the collectives and the engine under injected faults (KHOR_FAULTS,
 * the layer of transport/filter): for every fault of the matrix, at n = 2, 4 and 8 over tcp
 * and shm (ib in the soft-RoCE VM, KHOR_TRANSPORT=ib), a job of real processes runs
 * allreduce, broadcast and allgather (the fault_matrix tests), or named tensors through the engine
 * as a training step does, eight allreduces and a broadcast at once (engine_faults),
 * checking every element, while rank 0's link to rank 1 fails on schedule. Each case must end one of two ways, within its deadline:
 *
 *   - every rank finished with the right results (a delay, a stall: slow is not broken);
 *   - every rank failed with the same named error: the first failure's text, which the
 *     ranks that failed later carry as "aborted by another rank: <it>", and which says
 *     what the case's fault looks like from the inside (the cut connection, the short
 *     frame, the other operation, the checksum, the deadline).
 *
 * Never a hang (the harness's deadline), never a wrong result reported as success (each
 * rank checks every element, and a damaged payload must be caught by KHOR_CHECKSUM).
 */
#include "tests/harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT 1024
#define ITERS 6

enum outcome { OK, FAILS };

typedef struct fault_case {
	const char *rule;     /* KHOR_FAULTS */
	bool checksum;        /* KHOR_CHECKSUM=1 */
	enum outcome want;
	const char *marks;    /* FAILS: words the first failure's text holds, '|' between choices */
	bool ib_only, not_ib; /* regfail needs registration; stall's timing needs no emulation */
	bool sum_rank0_only;  /* KHOR_CHECKSUM=1 on rank 0 alone: a mistake the ranks must name */
} fault_case;

/* AT = 512K: past init's own traffic, inside the second or third iteration at every n. */
static const fault_case cases[] = {
	{ "", false, OK, NULL, false, false, false },
	{ "", true, OK, NULL, false, false, false },
	{ "0>1:drop@512K", false, FAILS, "connection|closed|KHOR_FAULTS rule 0", false, false, false },
	/* ib finds a length or an operation at the sender, from the receiver's clear-to-send
	 * (its words say the receive's, then this rank's send), or an operation at the
	 * receiver, from an eager message's header (this rank's receive), whichever comes
	 * first. */
	{ "0>1:trunc@512K", false, FAILS, "but the receive posted here is|message has|this rank's send",
	  false, false, false },
	{ "0>1:hdr=len@512K", false, FAILS, "but the receive posted here is|message has|this rank's send",
	  false, false, false },
	{ "0>1:hdr=meta@512K", false, FAILS,
	  "was sent by|but this rank posted|this rank's send is for|this rank's receive is for",
	  false, false, false },
	{ "0>1:hdr=seq@512K", false, FAILS, "KHOR_TIMEOUT|deadlock|cycle", false, false, false },
	{ "0>1:data@512K", true, FAILS, "KHOR_CHECKSUM", false, false, false },
	{ "0>1:fail@12", false, FAILS, "KHOR_FAULTS rule 0|closed|connection|reset", false, false, false },
	{ "0>1:delay=20ms@512K", false, OK, NULL, false, false, false },
	{ "0>1:stall=1500ms@512K", true, OK, NULL, false, true, false },
	{ "0>*:regfail@0", false, FAILS, "KHOR_FAULTS rule 0", true, false, false },
	{ "", true, FAILS, "KHOR_CHECKSUM", false, false, true },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

struct shared {
	const fault_case *c;
	const char *tp;
	bool engine;
	char err[HARNESS_MAX_RANKS][TEXT];
	double ended[HARNESS_MAX_RANKS];
	int iters[HARNESS_MAX_RANKS];
};

static int fail_rank(struct shared *sh, int rank, int code, const char *fmt, const char *a)
{
	snprintf(sh->err[rank], TEXT, fmt, a);
	sh->ended[rank] = harness_now();
	return code;
}

/* The engine's share: ITERS steps of eight named allreduces of 8K floats and a broadcast,
 * enqueued at once and waited for in order, each element checked. */
#define EN_T 8
#define EN_COUNT 8192
static int engine_steps(struct shared *sh, int rank, int n, khor_comm *comm)
{
	khor_engine *eng;
	khor_handle *h[EN_T + 1];
	static float in[EN_T + 1][EN_COUNT], out[EN_T + 1][EN_COUNT];
	int64_t dims[1] = { EN_COUNT };
	char name[32];
	const char *why = NULL;
	int code = 0;

	if (khor_engine_start(comm, NULL, &eng) != KHOR_SUCCESS) {
		code = fail_rank(sh, rank, 3, "%s", khor_comm_error(comm));
		khor_finalize(comm);
		return code;
	}
	for (int it = 0; it < ITERS && why == NULL && code == 0; it++) {
		int posted = 0;
		for (int t = 0; t <= EN_T; t++) {
			for (int i = 0; i < EN_COUNT; i++)
				in[t][i] = t < EN_T ? (float)(rank + t + i % 31 + it) : (float)(i + it);
			snprintf(name, sizeof(name), "step.%s.%d", t < EN_T ? "grad" : "bcast", t);
			khor_status st = t < EN_T
			    ? khor_enqueue_allreduce(eng, 0, name, in[t], out[t], KHOR_FLOAT32, 1, dims,
			                             KHOR_SUM, 1.0, 1.0, &h[t])
			    : khor_enqueue_broadcast(eng, 0, name, in[t], out[t], KHOR_FLOAT32, 1, dims,
			                             it % n, &h[t]);
			if (st != KHOR_SUCCESS) {
				code = fail_rank(sh, rank, 3, "%s", khor_engine_error(eng));
				break;
			}
			posted++;
		}
		for (int t = 0; t < posted; t++) {
			if (khor_handle_wait(h[t]) != KHOR_SUCCESS && code == 0)
				code = fail_rank(sh, rank, 3, "%s", khor_handle_error(h[t]));
			for (int i = 0; i < EN_COUNT && code == 0 && why == NULL; i++) {
				float want = t < EN_T ? (float)(n * (n - 1) / 2 + n * (t + i % 31 + it))
				                      : (float)(i + it);
				if (out[t][i] != want)
					why = t < EN_T ? "an engine allreduce" : "an engine broadcast";
			}
			khor_handle_free(h[t]);
		}
		if (code == 0 && why == NULL)
			sh->iters[rank]++;
	}
	khor_engine_stop(eng);
	khor_finalize(comm);
	if (why != NULL)
		return fail_rank(sh, rank, 20, "WRONG RESULT reported as success: %s", why);
	if (code == 0)
		sh->ended[rank] = harness_now();
	return code;
}

static int body(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	const fault_case *c = sh->c;
	char err[TEXT];
	khor_comm *comm;
	const size_t count = 64 * 1024, bcount = 16 * 1024, gcount = 1024;
	float *buf = malloc(count * sizeof(float)), *all = malloc(gcount * n * sizeof(float));
	float mine[1024];

	khor_config_set(cfg, "KHOR_TRANSPORT", sh->tp);
	/* The engine fuses a step's tensors and moves fewer bytes per link: its faults come
	 * at 64K, in its first steps, at every n. */
	char rule[64];
	snprintf(rule, sizeof(rule), "%s", c->rule);
	char *at512 = strstr(rule, "@512K");
	const char *at = getenv("KHOR_TEST_FAULT_AT"); /* by hand: another AT for the engine */
	if (sh->engine && at512 != NULL)
		snprintf(at512, sizeof(rule) - (size_t)(at512 - rule), "@%s", at ? at : "64K");
	khor_config_set(cfg, "KHOR_FAULTS", rule);
	khor_config_set(cfg, "KHOR_CHECKSUM",
	                c->checksum && (!c->sum_rank0_only || rank == 0) ? "1" : "0");
	/* KHOR_TIMEOUT is 1 s (the harness): init gets longer, for the slow VM and n = 8. */
	khor_config_set(cfg, "KHOR_INIT_TIMEOUT", "60s");
	/* No calibration: init's traffic stays small, and the same on every run. */
	khor_config_set(cfg, "KHOR_COST_ALPHA_US", "10");
	khor_config_set(cfg, "KHOR_COST_BETA_GBPS", "2");
	khor_config_set(cfg, "KHOR_COST_GAMMA_GBPS", "4");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return fail_rank(sh, rank, 10, "%s", err);
	if (sh->engine) {
		free(buf);
		free(all);
		return engine_steps(sh, rank, n, comm);
	}
	for (int it = 0; it < ITERS; it++) {
		for (size_t i = 0; i < count; i++)
			buf[i] = (float)(rank + (int)(i % 97) + it);
		if (khor_allreduce(comm, buf, buf, count, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
			break;
		for (size_t i = 0; i < count; i++) {
			float want = (float)(n * (n - 1) / 2 + n * ((int)(i % 97) + it));
			if (buf[i] != want) {
				char w[128];
				snprintf(w, sizeof(w), "allreduce %d element %zu is %g, not %g", it, i,
				         (double)buf[i], (double)want);
				return fail_rank(sh, rank, 20, "WRONG RESULT reported as success: %s", w);
			}
		}
		int root = it % n;
		for (size_t i = 0; i < bcount; i++)
			buf[i] = rank == root ? (float)(i + (size_t)it) : -1.0f;
		if (khor_broadcast(comm, buf, bcount, KHOR_FLOAT32, root) != KHOR_SUCCESS)
			break;
		for (size_t i = 0; i < bcount; i++)
			if (buf[i] != (float)(i + (size_t)it))
				return fail_rank(sh, rank, 20, "WRONG RESULT reported as success: %s",
				                 "broadcast");
		for (size_t i = 0; i < gcount; i++)
			mine[i] = (float)(rank * 10000 + (int)i + it);
		if (khor_allgather(comm, mine, all, gcount, KHOR_FLOAT32) != KHOR_SUCCESS)
			break;
		for (int r = 0; r < n; r++)
			for (size_t i = 0; i < gcount; i++)
				if (all[(size_t)r * gcount + i] != (float)(r * 10000 + (int)i + it))
					return fail_rank(sh, rank, 20,
					                 "WRONG RESULT reported as success: %s", "allgather");
		sh->iters[rank]++;
	}
	free(buf);
	free(all);
	if (sh->iters[rank] < ITERS) {
		int code = fail_rank(sh, rank, 3, "%s", khor_comm_error(comm));
		khor_finalize(comm);
		return code;
	}
	sh->ended[rank] = harness_now();
	return khor_finalize(comm) == KHOR_SUCCESS ? 0 : 4;
}

/* Whether text holds one of marks' '|'-separated words. */
static bool has_mark(const char *text, const char *marks)
{
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", marks);
	for (char *save = NULL, *w = strtok_r(buf, "|", &save); w != NULL;
	     w = strtok_r(NULL, "|", &save))
		if (strstr(text, w) != NULL)
			return true;
	return false;
}

static void run_case(const char *tp, int n, const fault_case *c, bool engine)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	sh->c = c;
	sh->tp = tp;
	sh->engine = engine;
	harness_opts o = { .n = n, .timeout = "1s", .deadline_s = 60 };
	harness_result res;
	char what[160];
	double t0 = harness_now();

	snprintf(what, sizeof(what), "%s%s n=%d [%s]%s", engine ? "engine " : "", tp, n,
	         c->rule[0] ? c->rule : "no fault",
	         c->checksum ? (c->sum_rank0_only ? " KHOR_CHECKSUM=1 on rank 0 only"
	                                          : " KHOR_CHECKSUM=1") : "");
	harness_run(&o, body, sh, &res);
	cr_expect(!res.timed_out, "%s: the job hung (killed at the harness's deadline)", what);
	for (int r = 0; r < n; r++)
		cr_expect(res.status[r] != 20, "%s: rank %d: %s", what, r, sh->err[r]);
	if (c->want == OK) {
		for (int r = 0; r < n; r++)
			cr_expect_eq(res.status[r], 0, "%s: rank %d exited %d: %s", what, r,
			             res.status[r], sh->err[r]);
		fprintf(stderr, "%s: right results on every rank in %.1f s\n", what,
		        harness_now() - t0);
		harness_shared_free(sh, sizeof(*sh));
		return;
	}
	/* The first failure: a rank that did not learn of it from another. */
	int root = -1;
	for (int r = 0; r < n && root < 0; r++)
		if (res.status[r] != 0 && strstr(sh->err[r], "aborted by another rank") == NULL)
			root = r;
	cr_expect(root >= 0, "%s: no rank failed with an error of its own", what);
	if (root < 0) {
		harness_shared_free(sh, sizeof(*sh));
		return;
	}
	/* The job's error: a sentence of the root's text that names a rank ("rank R on HOST")
	 * and is in every rank's error (the engine puts its own words in front of a failed
	 * collective's, and a rank that learnt of it from the store its view after it). */
	char core[160] = "";
	for (const char *p = strstr(sh->err[root], "rank "); p != NULL && !core[0];
	     p = strstr(p + 1, "rank ")) {
		char cand[160];
		snprintf(cand, sizeof(cand), "%s", p);
		if (strlen(cand) < 60)
			break;
		bool everywhere = true;
		for (int r = 0; r < n && everywhere; r++)
			everywhere = strstr(sh->err[r], cand) != NULL;
		if (everywhere)
			snprintf(core, sizeof(core), "%s", cand);
	}
	if (!core[0])
		snprintf(core, sizeof(core), "%s", sh->err[root]);
	cr_expect(has_mark(sh->err[root], c->marks), "%s: the first failure (rank %d) does not "
	          "say %s: %s", what, root, c->marks, sh->err[root]);
	double first = 1e30, last = 0;
	for (int r = 0; r < n; r++) {
		cr_expect(res.status[r] == 3 || res.status[r] == 10, "%s: rank %d exited %d, not "
		          "with the job's error: %s", what, r, res.status[r], sh->err[r]);
		cr_expect(strstr(sh->err[r], core) != NULL, "%s: rank %d's error is not the job's "
		          "first failure (rank %d: %s): %s", what, r, root, core, sh->err[r]);
		if (getenv("KHOR_TEST_VERBOSE") != NULL)
			fprintf(stderr, "  rank %d: %s\n", r, sh->err[r]);
		first = sh->ended[r] < first ? sh->ended[r] : first;
		last = sh->ended[r] > last ? sh->ended[r] : last;
	}
	/* The deadline: KHOR_TIMEOUT (1 s) for the case that waits on a frame nobody sends, and
	 * the once-a-second look at the job's abort key for the ranks it reaches. */
	cr_expect(last - first < 10.0, "%s: the ranks failed %.1f s apart", what, last - first);
	fprintf(stderr, "%s: every rank failed in %.1f s (%.1f s apart), first rank %d: %.300s\n",
	        what, harness_now() - t0, last - first, root, sh->err[root]);
	harness_shared_free(sh, sizeof(*sh));
}

static void matrix(const char *tp, int n, bool engine)
{
	const char *env = getenv("KHOR_TRANSPORT");
	bool ib = strcmp(tp, "ib") == 0;
	if (ib && (env == NULL || strcmp(env, "ib") != 0))
		cr_skip_test("ib: only in the soft-RoCE VM (tests/ib/ib_suite.sh sets KHOR_TRANSPORT=ib)");
	if (!ib && env != NULL && strcmp(env, "ib") == 0)
		cr_skip_test("KHOR_TRANSPORT=ib: this run is the ib matrix's");
	/* KHOR_TEST_FAULT_NS: the sizes to run ("2", "2,4"); the sanitizer build's CTest runs
	 * n = 2 only (tests.cmake), the plain build all three. */
	const char *ns = getenv("KHOR_TEST_FAULT_NS");
	char nstr[8];
	snprintf(nstr, sizeof(nstr), "%d", n);
	if (ns != NULL && ns[0] != '\0' && strstr(ns, nstr) == NULL)
		cr_skip_test("n = %d: KHOR_TEST_FAULT_NS=%s", n, ns);
	for (size_t i = 0; i < NCASES; i++) {
		const char *only = getenv("KHOR_TEST_FAULT_CASE"); /* by hand: rules holding this */
		if ((cases[i].ib_only && !ib) || (cases[i].not_ib && ib) ||
		    (only != NULL && strstr(cases[i].rule, only) == NULL))
			continue;
		run_case(tp, n, &cases[i], engine);
	}
}

Test(fault_matrix, tcp_n2, .timeout = 400) { matrix("tcp", 2, false); }
Test(fault_matrix, tcp_n4, .timeout = 400) { matrix("tcp", 4, false); }
Test(fault_matrix, tcp_n8, .timeout = 600) { matrix("tcp", 8, false); }
Test(fault_matrix, shm_n2, .timeout = 400) { matrix("shm", 2, false); }
Test(fault_matrix, shm_n4, .timeout = 400) { matrix("shm", 4, false); }
Test(fault_matrix, shm_n8, .timeout = 600) { matrix("shm", 8, false); }
Test(fault_matrix, ib_n2, .timeout = 600) { matrix("ib", 2, false); }
Test(fault_matrix, ib_n4, .timeout = 900) { matrix("ib", 4, false); }
Test(fault_matrix, ib_n8, .timeout = 900) { matrix("ib", 8, false); }

Test(engine_faults, tcp_n2, .timeout = 400) { matrix("tcp", 2, true); }
Test(engine_faults, tcp_n4, .timeout = 400) { matrix("tcp", 4, true); }
Test(engine_faults, tcp_n8, .timeout = 600) { matrix("tcp", 8, true); }
Test(engine_faults, shm_n2, .timeout = 400) { matrix("shm", 2, true); }
Test(engine_faults, shm_n4, .timeout = 400) { matrix("shm", 4, true); }
Test(engine_faults, shm_n8, .timeout = 600) { matrix("shm", 8, true); }
Test(engine_faults, ib_n2, .timeout = 600) { matrix("ib", 2, true); }
Test(engine_faults, ib_n4, .timeout = 900) { matrix("ib", 4, true); }
Test(engine_faults, ib_n8, .timeout = 900) { matrix("ib", 8, true); }
