/*
 * test_engine_device.c -- the engine with device tensors, on the emulated device
 * (tests/support/mem_emu.h: memory the process cannot touch, streams on threads of their own):
 * allreduce alone and fused (prescale, postscale, avg), broadcast, allgather, alltoall and
 * reducescatter on device buffers against a host reference; ready events that complete
 * only after a delayed fill on another stream (the result must be the fill's), and one that
 * never completes (the handle fails naming the tensor, nothing hangs); host and device
 * tensors in one cycle; join with device tensors; the enqueue errors of device tensors.
 *
 * Real ranks (forked by the harness), real links. Every value is a small integer and every
 * scale factor a power of two, so the results are exact and compared element by element.
 * KHOR_MEM_EMU_DELAY_US makes every emulated stream operation sleep a little first, so a
 * missing stream-ordered wait in the engine shows as stale data, not as luck. A direct CPU
 * access to device memory by the engine crashes the rank (it is PROT_NONE), which the
 * parent reports as a signal.
 */
#include "tests/harness.h"

#include "tests/support/mem_emu.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TEXT 2048
#define SLOTS 8

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	char text[HARNESS_MAX_RANKS][SLOTS][TEXT];
	double secs[HARNESS_MAX_RANKS][SLOTS];
	int progress[HARNESS_MAX_RANKS];
};

/* One rank of a job: where it reports (its slots of the shared memory), its comm, engine. */
struct rank_env {
	struct shared *sh;
	int rank, n;
	khor_comm *world;
	khor_engine *eng;
};

static const kmem_backend *const emu = &kmem_emu_backend;

/* Records why the rank failed, for the parent's message; returns code, its exit status. */
#define fail(rk, code, ...)                                                                        \
	harness_fail((rk)->sh->err[(rk)->rank], TEXT, (rk)->rank, (code), __VA_ARGS__)

/* The step a rank is at, for a hang's report. */
static void at_step(struct rank_env *rk, int step)
{
	rk->sh->progress[rk->rank] = step;
}

/* khor_init (ring schedule: no timed trials) and an engine with the default settings. */
static int start(struct rank_env *rk, void *arg, int rank, int n, khor_config *cfg)
{
	char err[TEXT];

	*rk = (struct rank_env){.sh = arg, .rank = rank, .n = n};
	/* Every stream operation first sleeps up to 200 us: stale reads show. */
	setenv("KHOR_MEM_EMU_DELAY_US", "200", 1);
	khor_config_set(cfg, "KHOR_ALGO", "ring");
	if (khor_init(cfg, err, sizeof(err), &rk->world) != KHOR_SUCCESS)
		return fail(rk, 10, "init: %s", err);
	if (khor_engine_start(rk->world, NULL, &rk->eng) != KHOR_SUCCESS)
		return fail(rk, 12, "khor_engine_start: %s", khor_comm_error(rk->world));
	return 0;
}

static int finish(struct rank_env *rk)
{
	if (khor_engine_stop(rk->eng) != KHOR_SUCCESS)
		return fail(rk, 13, "khor_engine_stop failed");
	khor_finalize(rk->world);
	if (harness_leaks())
		return fail(rk, 90, "LeakSanitizer found leaks after khor_finalize");
	return 0;
}

static size_t esize(khor_dtype dt)
{
	return dt == KHOR_FLOAT64 ? 8 : 4;
}

/* Host memory (malloc) holding count values v(rank, j) of dtype (float32 or float64). */
static void *host_fill(khor_dtype dt, size_t count, double (*v)(int, size_t), int rank)
{
	char *h = malloc(count * esize(dt) + 1);

	for (size_t j = 0; h != NULL && j < count; j++) {
		if (dt == KHOR_FLOAT64)
			((double *)h)[j] = v(rank, j);
		else
			((float *)h)[j] = (float)v(rank, j);
	}
	return h;
}

/* The same in device memory. */
static void *dev_fill(khor_dtype dt, size_t count, double (*v)(int, size_t), int rank)
{
	size_t len = count * esize(dt);
	void *d = kmem_emu_alloc(len > 0 ? len : 1), *h = host_fill(dt, count, v, rank);

	if (d != NULL &&
	    (h == NULL || (len > 0 && kmem_emu_copy_sync(d, h, len) != KHOR_SUCCESS))) {
		kmem_emu_free(d);
		d = NULL;
	}
	free(h);
	return d;
}

/*
 * Whether buf (device or host memory) holds nblocks blocks of per values of dtype dt, value
 * k of block q being want(a + q, first + k); else the rank fails with code, naming what and
 * the first wrong value. Read back whole each time: the tests are small.
 */
static int expect_blocks(struct rank_env *rk, int code, const void *buf, khor_dtype dt, int nblocks,
                         size_t per, double (*want)(int, size_t), int a, size_t first,
                         const char *what)
{
	size_t count = (size_t)nblocks * per, len = count * esize(dt);
	char *h = malloc(len + 1);
	int rc = 0;

	if (h == NULL)
		return fail(rk, code, "%s: no host memory to read it back", what);
	if (len > 0 && kmem_emu_copy_sync(h, buf, len) != KHOR_SUCCESS)
		rc = fail(rk, code, "%s: reading the buffer back failed", what);
	for (size_t i = 0; i < count && rc == 0; i++) {
		int q = (int)(i / per);
		size_t k = i % per;
		double got = dt == KHOR_FLOAT64 ? ((double *)h)[i] : (double)((float *)h)[i];
		double w = want(a + q, first + k);
		if (got != w && nblocks == 1)
			rc = fail(rk, code, "%s[%zu] = %.17g, want %.17g", what, k, got, w);
		else if (got != w)
			rc = fail(rk, code, "%s: block %d's [%zu] = %.17g, want %.17g", what, q, k,
			          got, w);
	}
	free(h);
	return rc;
}

/* The same for one block: count values want(a, j). */
static int expect(struct rank_env *rk, int code, const void *buf, khor_dtype dt, size_t count,
                  double (*want)(int, size_t), int a, const char *what)
{
	return expect_blocks(rk, code, buf, dt, 1, count, want, a, 0, what);
}

/* Rank r's value j, and what the reductions of every rank's give. */
static double val(int r, size_t j)
{
	return (double)((r + 1) * (int)(j % 7 + 1));
}

static double sum_n(int n, size_t j)
{
	return (double)(n * (n + 1) / 2) * (double)(j % 7 + 1);
}

static double avg_n(int n, size_t j)
{
	return sum_n(n, j) / n;
}

static int wait_ok(struct rank_env *rk, khor_handle *h, const char *what)
{
	khor_status st = khor_handle_wait(h);
	if (st != KHOR_SUCCESS)
		return fail(rk, 30, "%s: status %d: %s", what, st, khor_handle_error(h));
	return 0;
}

static int wait_free(struct rank_env *rk, khor_handle *h, const char *what)
{
	int rc = wait_ok(rk, h, what);
	if (rc == 0)
		khor_handle_free(h);
	return rc;
}

/* After an enqueue that gave st and h: fails with code when it was refused, else waits for
 * h (failing when the handle does) and frees it. */
static int settle(struct rank_env *rk, khor_status st, khor_handle *h, int code, const char *what)
{
	if (st != KHOR_SUCCESS)
		return fail(rk, code, "%s refused: %s", what, khor_engine_error(rk->eng));
	return wait_free(rk, h, what);
}

/*
 * Runs body on n ranks (KHOR_TIMEOUT timeout, all killed after deadline_s) and expects
 * each to exit 0; returns the ranks' shared memory, for the caller to read and free.
 */
static struct shared *run_job(int n, const char *timeout, double deadline_s, harness_body body,
                              const char *what)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = n, .timeout = timeout, .deadline_s = deadline_s};
	harness_result res;

	cr_assert_not_null(sh, "%s: no shared memory", what);
	harness_run(&o, body, sh, &res);
	if (res.timed_out)
		for (int r = 0; r < n; r++)
			fprintf(stderr, "%s: hung: rank %d was at step %d\n", what, r,
			        sh->progress[r]);
	cr_assert(!res.timed_out, "%s: the job hung (killed at the deadline)", what);
	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "%s: rank %d exited %d: %s", what, r, res.status[r],
		             sh->err[r]);
	return sh;
}

/* ---- allreduce: alone, fused, scaled, averaged -------------------------------------------- */

/* postscale * sum over ranks of (prescale * v), prescale 0.5, postscale 4: 2 * sum. */
static double scaled_sum(int n, size_t j)
{
	return 2.0 * sum_n(n, j);
}

static double scaled_avg(int n, size_t j)
{
	return 2.0 * avg_n(n, j);
}

static int body_allreduce(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h;
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	/* 1. One tensor, out of place, plain sum; then again with scale factors and avg. */
	at_step(&rk, 1);
	size_t cnt = 1000;
	int64_t dim = (int64_t)cnt;
	void *in = dev_fill(KHOR_FLOAT32, cnt, val, rank), *out = kmem_emu_alloc(cnt * 4);
	if (in == NULL || out == NULL)
		return fail(&rk, 20, "kmem_emu_alloc failed");
	khor_status st = khor_enqueue_allreduce(rk.eng, 0, "dev/one", in, out, KHOR_FLOAT32, 1,
	                                        &dim, KHOR_SUM, 1.0, 1.0, &h);
	if ((rc = settle(&rk, st, h, 21, "dev/one")) != 0 ||
	    (rc = expect(&rk, 22, out, KHOR_FLOAT32, cnt, sum_n, n, "dev/one")) != 0)
		return rc;
	st = khor_enqueue_allreduce(rk.eng, 0, "dev/one_avg", in, out, KHOR_FLOAT32, 1, &dim,
	                            KHOR_AVG, 0.5, 4.0, &h);
	if ((rc = settle(&rk, st, h, 23, "dev/one_avg")) != 0 ||
	    (rc = expect(&rk, 24, out, KHOR_FLOAT32, cnt, scaled_avg, n, "dev/one_avg")) != 0 ||
	    (rc = expect(&rk, 25, in, KHOR_FLOAT32, cnt, val, rank,
	                 "dev/one_avg's input (out of place: it must not change)")) != 0)
		return rc;
	kmem_emu_free(in);
	kmem_emu_free(out);

	/*
	 * 2. Fused: a grouped allreduce (one negotiation, so one cycle) of float32 and float64
	 * tensors, some in place, prescale 0.5 and postscale 4; then the same sizes as separate
	 * handles enqueued at once with avg.
	 */
	at_step(&rk, 2);
	enum { NT = 6 };
	static const size_t counts[NT] = {1, 33, 257, 1000, 64, 4099};
	static const khor_dtype dts[NT] = {KHOR_FLOAT32, KHOR_FLOAT64, KHOR_FLOAT32,
	                                   KHOR_FLOAT32, KHOR_FLOAT64, KHOR_FLOAT32};
	for (int pass = 0; pass < 2; pass++) {
		void *ins[NT], *outs[NT];
		const char *names[NT];
		char nbuf[NT][32];
		int ndims[NT];
		int64_t dims[NT];
		khor_handle *hs[NT];
		for (int t = 0; t < NT; t++) {
			ins[t] = dev_fill(dts[t], counts[t], val, rank);
			outs[t] = t % 2 == 0 ? ins[t] : kmem_emu_alloc(counts[t] * 8);
			if (ins[t] == NULL || outs[t] == NULL)
				return fail(&rk, 26, "kmem_emu_alloc failed");
			snprintf(nbuf[t], sizeof(nbuf[t]), "dev/fused%d/%d", pass, t);
			names[t] = nbuf[t];
			ndims[t] = 1;
			dims[t] = (int64_t)counts[t];
		}
		if (pass == 0) {
			st = khor_enqueue_grouped_allreduce(
			    rk.eng, 0, NT, names, (const void *const *)ins, outs, dts, ndims, dims,
			    KHOR_SUM, 0.5, 4.0, &hs[0]);
			if ((rc = settle(&rk, st, hs[0], 27, "dev/fused0")) != 0)
				return rc;
		} else {
			for (int t = 0; t < NT; t++)
				if (khor_enqueue_allreduce(rk.eng, 0, names[t], ins[t], outs[t],
				                           dts[t], 1, &dims[t], KHOR_AVG, 0.5, 4.0,
				                           &hs[t]) != KHOR_SUCCESS)
					return fail(&rk, 28, "%s refused: %s", names[t],
					            khor_engine_error(rk.eng));
			for (int t = 0; t < NT; t++)
				if ((rc = wait_free(&rk, hs[t], names[t])) != 0)
					return rc;
		}
		for (int t = 0; t < NT; t++) {
			if ((rc = expect(&rk, 29, outs[t], dts[t], counts[t],
			                 pass == 0 ? scaled_sum : scaled_avg, n, names[t])) != 0)
				return rc;
			if (outs[t] != ins[t])
				kmem_emu_free(outs[t]);
			kmem_emu_free(ins[t]);
		}
	}
	return finish(&rk);
}

Test(engine_device, allreduce_alone_and_fused_with_scale_factors_and_avg_n3, .timeout = 180)
{
	struct shared *sh = run_job(3, "30s", 150, body_allreduce, "device allreduce");
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- broadcast, allgather, alltoall, reducescatter ----------------------------------------- */

/* Memory for the engine's allgather and alltoall outputs (alloc_cb): device memory, or host
 * memory where host is set; allocs_free frees it. */
struct allocs {
	void *p[8];
	int n;
	bool host;
};

static void *alloc_cb(void *arg, int ndim, const int64_t *dims, size_t bytes)
{
	struct allocs *a = arg;
	size_t len = bytes > 0 ? bytes : 1;
	(void)ndim;
	(void)dims;
	if (a->n == 8)
		return NULL;
	void *p = a->host ? malloc(len) : kmem_emu_alloc(len);
	a->p[a->n++] = p;
	return p;
}

static void allocs_free(struct allocs *a)
{
	for (int i = 0; i < a->n; i++) {
		if (a->host)
			free(a->p[i]);
		else
			kmem_emu_free(a->p[i]);
	}
	a->n = 0;
}

/* Rank r's row i, column c (4 columns): r * 100 + i * 4 + c. */
static double row_val(int r, size_t k)
{
	return (double)(r * 100) + (double)k;
}

/* Reducescatter's values of a [rows, 3] tensor, j = i * 3 + c: (r + 1) * (j + 1). */
static double rs_val(int r, size_t j)
{
	return (double)((r + 1) * (int)(j + 1));
}

/* Their sum over n ranks, and that with prescale 0.5 and postscale 4. */
static double rs_sum(int n, size_t j)
{
	return (double)(n * (n + 1) / 2) * (double)(j + 1);
}

static double rs_scaled(int n, size_t j)
{
	return 2.0 * rs_sum(n, j);
}

/* The engine's reducescatter block of rows rows over n ranks, the first rows % n ranks one
 * row more: how many rows rank gets, and (*first) the first of them. */
static size_t rs_block(size_t rows, int n, int rank, size_t *first)
{
	size_t base = rows / (size_t)n, rem = rows % (size_t)n, r = (size_t)rank;

	*first = r * base + (r < rem ? r : rem);
	return base + (r < rem ? 1 : 0);
}

static int body_others(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h;
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	char(*text)[TEXT] = rk.sh->text[rank];
	/* broadcast from rank 1: out of place there, in place elsewhere. */
	at_step(&rk, 1);
	size_t cnt = 777;
	void *b_in = dev_fill(KHOR_FLOAT64, cnt, val, rank);
	void *b_out = rank == 1 ? kmem_emu_alloc(cnt * 8) : b_in;
	khor_status st = khor_enqueue_broadcast(rk.eng, 0, "dev/bcast", b_in, b_out, KHOR_FLOAT64,
	                                        1, (int64_t[]){(int64_t)cnt}, 1, &h);
	if ((rc = settle(&rk, st, h, 40, "dev/bcast")) != 0 ||
	    (rc = expect(&rk, 41, b_out, KHOR_FLOAT64, cnt, val, 1, "dev/bcast")) != 0)
		return rc;
	if (b_out != b_in)
		kmem_emu_free(b_out);
	kmem_emu_free(b_in);

	/* allgather: rank r gives r + 1 rows of 4; the output is every rank's rows in order. */
	at_step(&rk, 2);
	struct allocs al = {.n = 0};
	size_t rows = (size_t)rank + 1;
	void *g_in = dev_fill(KHOR_FLOAT32, rows * 4, row_val, rank);
	if (khor_enqueue_allgather(rk.eng, 0, "dev/ag", g_in, KHOR_FLOAT32, 2,
	                           (int64_t[]){(int64_t)rows, 4}, alloc_cb, &al,
	                           &h) != KHOR_SUCCESS)
		return fail(&rk, 42, "dev/ag refused: %s", khor_engine_error(rk.eng));
	if ((rc = wait_ok(&rk, h, "dev/ag")) != 0)
		return rc;
	void *g_out = NULL;
	int64_t odims[2] = {0, 0};
	if (khor_handle_output(h, 0, &g_out, NULL, odims) != KHOR_SUCCESS || g_out != al.p[0])
		return fail(&rk, 43, "dev/ag: khor_handle_output gave %p, the callback %p", g_out,
		            al.p[0]);
	khor_handle_free(h);
	int64_t total = (int64_t)n * (n + 1) / 2;
	if (odims[0] != total || odims[1] != 4)
		return fail(&rk, 44, "dev/ag: output dims [%lld, %lld], want [%lld, 4]",
		            (long long)odims[0], (long long)odims[1], (long long)total);
	for (int r = 0, at = 0; r < n; at += (r + 1) * 4, r++) {
		char what[48];
		snprintf(what, sizeof(what), "dev/ag: rank %d's rows", r);
		if ((rc = expect_blocks(&rk, 45, (float *)g_out + at, KHOR_FLOAT32, 1,
		                        (size_t)(r + 1) * 4, row_val, r, 0, what)) != 0)
			return rc;
	}
	allocs_free(&al);

	/* A device allgather without an alloc callback is refused at once, saying why; one
	 * whose callback returns host memory fails its handle, and the set goes on. */
	st = khor_enqueue_allgather(rk.eng, 0, "dev/ag_noalloc", g_in, KHOR_FLOAT32, 2,
	                            (int64_t[]){(int64_t)rows, 4}, NULL, NULL, &h);
	snprintf(text[0], TEXT, "%s", khor_engine_error(rk.eng));
	if (st == KHOR_SUCCESS)
		return fail(&rk, 46, "a device allgather without an alloc callback was taken");
	if (strstr(text[0], "dev/ag_noalloc") == NULL ||
	    strcasestr(text[0], "alloc callback") == NULL)
		return fail(&rk, 47, "the refusal does not name the tensor and the callback: %s",
		            text[0]);
	al.host = true;
	if (khor_enqueue_allgather(rk.eng, 0, "dev/ag_hostcb", g_in, KHOR_FLOAT32, 2,
	                           (int64_t[]){(int64_t)rows, 4}, alloc_cb, &al,
	                           &h) != KHOR_SUCCESS)
		return fail(&rk, 48, "dev/ag_hostcb refused: %s", khor_engine_error(rk.eng));
	st = khor_handle_wait(h);
	snprintf(text[1], TEXT, "%s", khor_handle_error(h));
	khor_handle_free(h);
	allocs_free(&al);
	al.host = false;
	if (st == KHOR_SUCCESS || strstr(text[1], "dev/ag_hostcb") == NULL ||
	    strcasestr(text[1], "host memory") == NULL)
		return fail(&rk, 49, "dev/ag_hostcb: status %d, error: %s", st, text[1]);
	kmem_emu_free(g_in);

	/* alltoall: rank r sends q + 1 rows of 4 to rank q. */
	at_step(&rk, 3);
	int64_t splits[HARNESS_MAX_RANKS], srows = 0;
	for (int q = 0; q < n; q++)
		srows += splits[q] = q + 1;
	void *a_in = dev_fill(KHOR_FLOAT32, (size_t)srows * 4, row_val, rank);
	st = khor_enqueue_alltoall(rk.eng, 0, "dev/a2a", a_in, KHOR_FLOAT32, 2,
	                           (int64_t[]){srows, 4}, splits, alloc_cb, &al, &h);
	/* From rank q: its rows starting at sum_{p < rank} (p + 1), rank + 1 of them. */
	size_t off = (size_t)rank * (size_t)(rank + 1) / 2 * 4, per = (size_t)(rank + 1) * 4;
	if ((rc = settle(&rk, st, h, 50, "dev/a2a")) != 0 ||
	    (rc = expect_blocks(&rk, 51, al.p[0], KHOR_FLOAT32, n, per, row_val, 0, off,
	                        "dev/a2a (block q: from rank q)")) != 0)
		return rc;
	allocs_free(&al);
	kmem_emu_free(a_in);

	/* reducescatter of [rows, 3], rows even and uneven over the ranks, prescale 0.5 and
	 * postscale 4 on one of them. */
	at_step(&rk, 4);
	static const int rs_rows[2] = {6, 7};
	for (int v = 0; v < 2; v++) {
		size_t d0 = (size_t)rs_rows[v], first;
		size_t mine = rs_block(d0, n, rank, &first);
		double pre = v == 1 ? 0.5 : 1.0, post = v == 1 ? 4.0 : 1.0;
		void *r_in = dev_fill(KHOR_FLOAT32, d0 * 3, rs_val, rank);
		void *r_out = kmem_emu_alloc(mine * 12 + 1);
		char nm[32];
		snprintf(nm, sizeof(nm), "dev/rs%zu", d0);
		st = khor_enqueue_reducescatter(rk.eng, 0, nm, r_in, r_out, KHOR_FLOAT32, 2,
		                                (int64_t[]){(int64_t)d0, 3}, KHOR_SUM, pre, post,
		                                &h);
		if ((rc = settle(&rk, st, h, 52, nm)) != 0 ||
		    (rc = expect_blocks(&rk, 53, r_out, KHOR_FLOAT32, 1, mine * 3,
		                        v == 1 ? rs_scaled : rs_sum, n, first * 3, nm)) != 0)
			return rc;
		kmem_emu_free(r_in);
		kmem_emu_free(r_out);
	}
	return finish(&rk);
}

Test(engine_device, broadcast_allgather_alltoall_reducescatter_n3, .timeout = 180)
{
	struct shared *sh = run_job(3, "30s", 150, body_others,
	                            "device broadcast, allgather, alltoall, reducescatter");
	fprintf(stderr, "rank 0: a device allgather without alloc: %s\n", sh->text[0][0]);
	fprintf(stderr, "rank 0: a device allgather whose alloc gives host memory: %s\n",
	        sh->text[0][1]);
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- ready events ----------------------------------------------------------------------- */

#define READY_DELAY_US 300000u

/*
 * On a stream of the test's own: a 300 ms delay, then the fill of dev from host, then the
 * event. The engine must not read dev before the event: until then it holds 999s.
 */
static int delayed_fill(struct rank_env *rk, int code, void *stream, void *ev, void *dev,
                        const void *host, size_t bytes)
{
	kerr e;

	kerr_clear(&e);
	if (kmem_emu_delay(stream, READY_DELAY_US, &e) != KHOR_SUCCESS ||
	    emu->copy(dev, host, bytes, stream, &e) != KHOR_SUCCESS ||
	    emu->event_record(ev, stream, &e) != KHOR_SUCCESS)
		return fail(rk, code, "queueing the delayed fill: %s", e.text);
	return 0;
}

static double nines(int r, size_t j)
{
	(void)r;
	(void)j;
	return 999.0;
}

static int body_ready(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h;
	void *stream, *ev[4];
	kerr e;
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	kerr_clear(&e);
	if (emu->stream_create(&stream, &e) != KHOR_SUCCESS)
		return fail(&rk, 60, "stream_create: %s", e.text);
	for (int i = 0; i < 4; i++)
		if (emu->event_create(&ev[i], &e) != KHOR_SUCCESS)
			return fail(&rk, 61, "event_create: %s", e.text);
	size_t cnt = 4096;
	float *host = host_fill(KHOR_FLOAT32, cnt, val, rank);

	/* 1. allreduce, in place. */
	at_step(&rk, 1);
	void *d = dev_fill(KHOR_FLOAT32, cnt, nines, rank);
	if ((rc = delayed_fill(&rk, 62, stream, ev[0], d, host, cnt * 4)) != 0)
		return rc;
	double t0 = harness_now();
	khor_status st =
	    khor_enqueue_allreduce_event(rk.eng, 0, "ready/ar", d, d, KHOR_FLOAT32, 1,
	                                 (int64_t[]){(int64_t)cnt}, KHOR_SUM, 1.0, 1.0, ev[0], &h);
	if ((rc = settle(&rk, st, h, 63, "ready/ar")) != 0)
		return rc;
	rk.sh->secs[rank][0] = harness_now() - t0;
	if ((rc = expect(&rk, 64, d, KHOR_FLOAT32, cnt, sum_n, n,
	                 "ready/ar (the engine read its input before its ready event?)")) != 0)
		return rc;

	/* 2. A grouped allreduce, fused, each tensor with its own delayed event. */
	at_step(&rk, 2);
	void *g[2] = {dev_fill(KHOR_FLOAT32, 100, nines, rank),
	              dev_fill(KHOR_FLOAT32, 300, nines, rank)};
	if ((rc = delayed_fill(&rk, 65, stream, ev[1], g[0], host, 100 * 4)) != 0 ||
	    (rc = delayed_fill(&rk, 65, stream, ev[2], g[1], host, 300 * 4)) != 0)
		return rc;
	const char *gn[2] = {"ready/g0", "ready/g1"};
	khor_dtype gdt[2] = {KHOR_FLOAT32, KHOR_FLOAT32};
	int gnd[2] = {1, 1};
	int64_t gdims[2] = {100, 300};
	void *gev[2] = {ev[1], ev[2]};
	st = khor_enqueue_grouped_allreduce_event(rk.eng, 0, 2, gn, (const void *const *)g, g, gdt,
	                                          gnd, gdims, KHOR_AVG, 0.5, 4.0, gev, &h);
	if ((rc = settle(&rk, st, h, 66, "ready/g")) != 0 ||
	    (rc = expect(&rk, 67, g[0], KHOR_FLOAT32, 100, scaled_avg, n, "ready/g0")) != 0 ||
	    (rc = expect(&rk, 67, g[1], KHOR_FLOAT32, 300, scaled_avg, n, "ready/g1")) != 0)
		return rc;
	kmem_emu_free(g[0]);
	kmem_emu_free(g[1]);

	/* 3. broadcast from rank 0 and reducescatter, each behind a delayed fill. */
	at_step(&rk, 3);
	if ((rc = delayed_fill(&rk, 68, stream, ev[3], d, host, cnt * 4)) != 0)
		return rc;
	st = khor_enqueue_broadcast_event(rk.eng, 0, "ready/bc", d, d, KHOR_FLOAT32, 1,
	                                  (int64_t[]){(int64_t)cnt}, 0, ev[3], &h);
	if ((rc = settle(&rk, st, h, 69, "ready/bc")) != 0 ||
	    (rc = expect(&rk, 70, d, KHOR_FLOAT32, cnt, val, 0, "ready/bc")) != 0)
		return rc;
	void *rs_out = kmem_emu_alloc(cnt * 4);
	if ((rc = delayed_fill(&rk, 71, stream, ev[0], d, host, cnt * 4)) != 0)
		return rc;
	st = khor_enqueue_reducescatter_event(rk.eng, 0, "ready/rs", d, rs_out, KHOR_FLOAT32, 1,
	                                      (int64_t[]){(int64_t)cnt}, KHOR_SUM, 1.0, 1.0, ev[0],
	                                      &h);
	size_t first, mine = rs_block(cnt, n, rank, &first);
	if ((rc = settle(&rk, st, h, 72, "ready/rs")) != 0 ||
	    (rc = expect_blocks(&rk, 73, rs_out, KHOR_FLOAT32, 1, mine, sum_n, n, first,
	                        "ready/rs")) != 0)
		return rc;
	kmem_emu_free(rs_out);

	/* 4. allgather behind a delayed fill, into device memory from the callback. */
	at_step(&rk, 4);
	struct allocs al = {.n = 0};
	if ((rc = delayed_fill(&rk, 74, stream, ev[1], d, host, 64 * 4)) != 0)
		return rc;
	st = khor_enqueue_allgather_event(rk.eng, 0, "ready/ag", d, KHOR_FLOAT32, 1,
	                                  (int64_t[]){64}, alloc_cb, &al, ev[1], &h);
	if ((rc = settle(&rk, st, h, 75, "ready/ag")) != 0 ||
	    (rc = expect_blocks(&rk, 76, al.p[0], KHOR_FLOAT32, n, 64, val, 0, 0,
	                        "ready/ag (block r: rank r's)")) != 0)
		return rc;
	allocs_free(&al);

	/* 5. A ready event for a host tensor is refused: it has no backend to wait with. */
	char *text = rk.sh->text[rank][0];
	float hv[4] = {1, 2, 3, 4};
	st = khor_enqueue_allreduce_event(rk.eng, 0, "ready/host", hv, hv, KHOR_FLOAT32, 1,
	                                  (int64_t[]){4}, KHOR_SUM, 1.0, 1.0, ev[2], &h);
	snprintf(text, TEXT, "%s", khor_engine_error(rk.eng));
	if (st == KHOR_SUCCESS)
		return fail(&rk, 77, "a ready event for a host tensor was taken");
	if (strstr(text, "ready/host") == NULL)
		return fail(&rk, 78, "the refusal does not name the tensor: %s", text);

	kmem_emu_free(d);
	free(host);
	for (int i = 0; i < 4; i++)
		emu->event_destroy(ev[i]);
	emu->stream_destroy(stream);
	return finish(&rk);
}

Test(engine_device, ready_events_hold_the_engine_until_the_producing_stream_ran_n2, .timeout = 120)
{
	struct shared *sh = run_job(2, "30s", 100, body_ready, "ready events");

	for (int r = 0; r < 2; r++)
		if (sh->err[r][0] == '\0')
			cr_expect_geq(
			    sh->secs[r][0], READY_DELAY_US / 1e6 * 0.9,
			    "rank %d: ready/ar completed %.3f s after its enqueue, before "
			    "its event could have",
			    r, sh->secs[r][0]);
	fprintf(stderr, "rank 0: a host tensor with a ready event: %s\n", sh->text[0][0]);
	harness_shared_free(sh, sizeof(*sh));
}

/* An event that never completes (a 60 s delay before it, KHOR_TIMEOUT 2 s): the handle
 * fails, naming the tensor and its ready event, in about the timeout. */
static int body_never(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h;
	void *stream, *ev;
	kerr e;
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	kerr_clear(&e);
	if (emu->stream_create(&stream, &e) != KHOR_SUCCESS ||
	    emu->event_create(&ev, &e) != KHOR_SUCCESS)
		return fail(&rk, 80, "stream or event: %s", e.text);
	void *d = kmem_emu_alloc(64 * 4);
	if (kmem_emu_delay(stream, 60u * 1000000u, &e) != KHOR_SUCCESS ||
	    emu->event_record(ev, stream, &e) != KHOR_SUCCESS)
		return fail(&rk, 81, "queueing: %s", e.text);
	double t0 = harness_now();
	if (khor_enqueue_allreduce_event(rk.eng, 0, "never/ar", d, d, KHOR_FLOAT32, 1,
	                                 (int64_t[]){64}, KHOR_SUM, 1.0, 1.0, ev,
	                                 &h) != KHOR_SUCCESS)
		return fail(&rk, 82, "never/ar refused: %s", khor_engine_error(rk.eng));
	/* Not khor_handle_wait: its own KHOR_TIMEOUT began before the engine's wait did. */
	khor_status st;
	while ((st = khor_handle_test(h)) == KHOR_IN_PROGRESS && harness_now() - t0 < 20)
		harness_sleep_ms(5);
	rk.sh->secs[rank][0] = harness_now() - t0;
	snprintf(rk.sh->text[rank][0], TEXT, "%s", khor_handle_error(h));
	khor_handle_free(h);
	if (st == KHOR_IN_PROGRESS)
		return fail(&rk, 83, "never/ar still pending after 20 s (KHOR_TIMEOUT 2 s)");
	if (st == KHOR_SUCCESS)
		return fail(&rk, 84, "never/ar succeeded, its event never completed");
	/* The stream's delay is cut short when it is destroyed. */
	emu->stream_destroy(stream);
	emu->event_destroy(ev);
	kmem_emu_free(d);
	return finish(&rk);
}

Test(engine_device, a_ready_event_that_never_completes_fails_the_handle_naming_it, .timeout = 60)
{
	struct shared *sh = run_job(2, "2s", 40, body_never, "a ready event that never completes");

	for (int r = 0; r < 2; r++) {
		fprintf(stderr, "rank %d: failed after %.2f s: %s\n", r, sh->secs[r][0],
		        sh->text[r][0]);
		cr_expect(strstr(sh->text[r][0], "never/ar") != NULL &&
		              strcasestr(sh->text[r][0], "ready") != NULL,
		          "rank %d's error does not name the tensor and its ready event: %s", r,
		          sh->text[r][0]);
		cr_expect_lt(sh->secs[r][0], 15.0, "rank %d took %.1f s to fail (KHOR_TIMEOUT 2 s)",
		             r, sh->secs[r][0]);
	}
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- host and device tensors in one cycle --------------------------------------------------- */

static int body_mixed(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h[3];
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	/*
	 * One group (one cycle) of float32 tensors alternating host and device, in one fusion
	 * class but for their memory, then a host and a device broadcast enqueued together.
	 */
	enum { NT = 6 };
	size_t cnt[NT] = {10, 200, 33, 1000, 5, 64};
	void *b[NT];
	const char *names[NT];
	char nbuf[NT][32];
	khor_dtype dts[NT];
	int ndims[NT];
	int64_t dims[NT];
	for (int step = 0; step < 3; step++) {
		at_step(&rk, step);
		for (int t = 0; t < NT; t++) {
			b[t] = t % 2 == 0 ? host_fill(KHOR_FLOAT32, cnt[t], val, rank)
			                  : dev_fill(KHOR_FLOAT32, cnt[t], val, rank);
			snprintf(nbuf[t], sizeof(nbuf[t]), "mixed/%d/%s%d", step,
			         t % 2 == 0 ? "host" : "dev", t);
			names[t] = nbuf[t];
			dts[t] = KHOR_FLOAT32;
			ndims[t] = 1;
			dims[t] = (int64_t)cnt[t];
		}
		if (khor_enqueue_grouped_allreduce(rk.eng, 0, NT, names, (const void *const *)b, b,
		                                   dts, ndims, dims, KHOR_SUM, 0.5, 4.0,
		                                   &h[0]) != KHOR_SUCCESS)
			return fail(&rk, 100, "mixed group refused: %s", khor_engine_error(rk.eng));
		size_t bc = 300;
		double *hb = host_fill(KHOR_FLOAT64, bc, val, rank);
		void *db = dev_fill(KHOR_FLOAT64, bc, val, rank);
		char n1[32], n2[32];
		snprintf(n1, sizeof(n1), "mixed/%d/bc_host", step);
		snprintf(n2, sizeof(n2), "mixed/%d/bc_dev", step);
		if (khor_enqueue_broadcast(rk.eng, 0, n1, hb, hb, KHOR_FLOAT64, 1,
		                           (int64_t[]){(int64_t)bc}, 1, &h[1]) != KHOR_SUCCESS ||
		    khor_enqueue_broadcast(rk.eng, 0, n2, db, db, KHOR_FLOAT64, 1,
		                           (int64_t[]){(int64_t)bc}, 0, &h[2]) != KHOR_SUCCESS)
			return fail(&rk, 101, "a broadcast refused: %s", khor_engine_error(rk.eng));
		for (int i = 0; i < 3; i++)
			if ((rc = wait_free(&rk, h[i], i == 0 ? "mixed group" : "a broadcast")) !=
			    0)
				return rc;
		for (int t = 0; t < NT; t++) {
			if ((rc = expect(&rk, t % 2 == 0 ? 102 : 103, b[t], KHOR_FLOAT32, cnt[t],
			                 scaled_sum, n, names[t])) != 0)
				return rc;
			if (t % 2 == 0)
				free(b[t]);
			else
				kmem_emu_free(b[t]);
		}
		if ((rc = expect(&rk, 104, hb, KHOR_FLOAT64, bc, val, 1, n1)) != 0 ||
		    (rc = expect(&rk, 105, db, KHOR_FLOAT64, bc, val, 0, n2)) != 0)
			return rc;
		free(hb);
		kmem_emu_free(db);
	}
	/* A tensor whose input is device memory and output host memory is refused. */
	char *text = rk.sh->text[rank][0];
	float hv[16];
	void *dv = kmem_emu_alloc(64);
	khor_handle *x;
	khor_status st = khor_enqueue_allreduce(rk.eng, 0, "mixed/split", dv, hv, KHOR_FLOAT32, 1,
	                                        (int64_t[]){16}, KHOR_SUM, 1.0, 1.0, &x);
	snprintf(text, TEXT, "%s", khor_engine_error(rk.eng));
	kmem_emu_free(dv);
	if (st == KHOR_SUCCESS)
		return fail(&rk, 106, "a device input with a host output was taken");
	if (strstr(text, "mixed/split") == NULL)
		return fail(&rk, 107, "the refusal does not name the tensor: %s", text);
	return finish(&rk);
}

Test(engine_device, host_and_device_tensors_in_one_cycle_run_apart_n2, .timeout = 120)
{
	struct shared *sh =
	    run_job(2, "30s", 100, body_mixed, "host and device tensors in one cycle");
	fprintf(stderr, "rank 0: a device input with a host output: %s\n", sh->text[0][0]);
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- join --------------------------------------------------------------------------------- */

/*
 * Rank r joins after step r: at step s the ranks s.. still run device allreduces (sum and
 * avg, alone and fused in a group), the joined ones take part with zeros in device memory.
 */
static int join_sum(int from, int n, size_t j)
{
	int s = 0;
	for (int r = from; r < n; r++)
		s += (r + 1) * (int)(j % 7 + 1);
	return s;
}

static int body_join(int rank, int n, khor_config *cfg, void *arg)
{
	struct rank_env rk;
	khor_handle *h;
	int rc;

	if ((rc = start(&rk, arg, rank, n, cfg)) != 0)
		return rc;
	enum { NT = 3 };
	static const size_t cnt[NT] = {100, 17, 2000};
	static const khor_op ops[NT] = {KHOR_SUM, KHOR_SUM, KHOR_AVG};
	for (int step = 0; step <= rank; step++) {
		at_step(&rk, step);
		void *b[NT];
		const char *names[2];
		char nbuf[NT][32], what[64];
		for (int t = 0; t < NT; t++) {
			b[t] = dev_fill(KHOR_FLOAT32, cnt[t], val, rank);
			snprintf(nbuf[t], sizeof(nbuf[t]), "join/%d", t);
		}
		/* tensors 0 and 1 in a group (fused), tensor 2 alone */
		names[0] = nbuf[0];
		names[1] = nbuf[1];
		khor_status st = khor_enqueue_grouped_allreduce(
		    rk.eng, 0, 2, names, (const void *const *)b, b,
		    (khor_dtype[]){KHOR_FLOAT32, KHOR_FLOAT32}, (int[]){1, 1},
		    (int64_t[]){(int64_t)cnt[0], (int64_t)cnt[1]}, KHOR_SUM, 1.0, 1.0, &h);
		snprintf(what, sizeof(what), "step %d: the join group", step);
		if ((rc = settle(&rk, st, h, 120, what)) != 0)
			return rc;
		st = khor_enqueue_allreduce(rk.eng, 0, nbuf[2], b[2], b[2], KHOR_FLOAT32, 1,
		                            (int64_t[]){(int64_t)cnt[2]}, KHOR_AVG, 1.0, 1.0, &h);
		snprintf(what, sizeof(what), "step %d: %s", step, nbuf[2]);
		if ((rc = settle(&rk, st, h, 121, what)) != 0)
			return rc;
		for (int t = 0; t < NT; t++) {
			float *hb = malloc(cnt[t] * 4);
			kmem_emu_copy_sync(hb, b[t], cnt[t] * 4);
			for (size_t j = 0; j < cnt[t]; j++) {
				double want = join_sum(step, n, j);
				if (ops[t] == KHOR_AVG)
					want /= n;
				if (hb[j] != (float)want) {
					fail(&rk, 122,
					     "step %d (%d ranks joined): %s[%zu] = %g, "
					     "want %g (the joined ranks as zeros)",
					     step, step, nbuf[t], j, hb[j], want);
					free(hb);
					return 122;
				}
			}
			free(hb);
			kmem_emu_free(b[t]);
		}
	}
	khor_handle *jh;
	if (khor_enqueue_join(rk.eng, 0, &jh) != KHOR_SUCCESS)
		return fail(&rk, 123, "join refused: %s", khor_engine_error(rk.eng));
	if ((rc = wait_ok(&rk, jh, "join")) != 0)
		return rc;
	if (khor_handle_join_rank(jh) != n - 1)
		return fail(&rk, 124, "join rank %d, want %d", khor_handle_join_rank(jh), n - 1);
	khor_handle_free(jh);
	return finish(&rk);
}

Test(engine_device, join_with_device_tensors_n3, .timeout = 120)
{
	struct shared *sh = run_job(3, "30s", 100, body_join, "join with device tensors");
	harness_shared_free(sh, sizeof(*sh));
}
