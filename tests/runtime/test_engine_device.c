/*
 * test_engine_device.c -- the engine with device tensors, on the emulated device
 * (collectives/mem_emu.h: memory the process cannot touch, streams on threads of their own):
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
#include "../harness.h"

#include "../../collectives/mem_emu.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifdef UNDER_ASAN
#include <sanitizer/lsan_interface.h>
#endif

#define TEXT 2048
#define SLOTS 8

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	char text[HARNESS_MAX_RANKS][SLOTS][TEXT];
	double secs[HARNESS_MAX_RANKS][SLOTS];
	int progress[HARNESS_MAX_RANKS];
};

static const kmem_backend *const emu = &kmem_emu_backend;

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static int fail(struct shared *sh, int rank, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(struct shared *sh, int rank, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(sh->err[rank], TEXT, fmt, ap);
	va_end(ap);
	fprintf(stderr, "rank %d: %s\n", rank, sh->err[rank]);
	return code;
}

static int leak_check(struct shared *sh, int rank)
{
#ifdef UNDER_ASAN
	if (__lsan_do_recoverable_leak_check() != 0)
		return fail(sh, rank, 90, "LeakSanitizer found leaks after khor_finalize");
#else
	(void)sh;
	(void)rank;
#endif
	return 0;
}

/* khor_init (ring schedule: no timed trials) and an engine with the settings kv. */
static int start(struct shared *sh, int rank, khor_config *cfg, const char *const *kv,
                 khor_comm **world, khor_engine **eng)
{
	char err[TEXT];
	khor_config *ecfg;

	/* Every stream operation first sleeps up to 200 us: stale reads show. */
	setenv("KHOR_MEM_EMU_DELAY_US", "200", 1);
	khor_config_set(cfg, "KHOR_ALGO", "ring");
	if (khor_init(cfg, err, sizeof(err), world) != KHOR_SUCCESS)
		return fail(sh, rank, 10, "init: %s", err);
	if (khor_config_create(&ecfg) != KHOR_SUCCESS)
		return fail(sh, rank, 11, "khor_config_create failed");
	for (int i = 0; kv != NULL && kv[i] != NULL; i += 2)
		khor_config_set(ecfg, kv[i], kv[i + 1]);
	khor_status st = khor_engine_start(*world, ecfg, eng);
	khor_config_destroy(ecfg);
	if (st != KHOR_SUCCESS)
		return fail(sh, rank, 12, "khor_engine_start: %s", khor_comm_error(*world));
	return 0;
}

static int finish(struct shared *sh, int rank, khor_comm *world, khor_engine *eng)
{
	if (khor_engine_stop(eng) != KHOR_SUCCESS)
		return fail(sh, rank, 13, "khor_engine_stop failed");
	khor_finalize(world);
	return leak_check(sh, rank);
}

/* Device memory holding count values v(j) of dtype (float32 or float64). */
static void *dev_fill(khor_dtype dt, size_t count, double (*v)(int, size_t), int rank)
{
	size_t esz = dt == KHOR_FLOAT64 ? 8 : 4;
	void *d = kmem_emu_alloc(count * esz > 0 ? count * esz : 1);
	char *h = malloc(count * esz + 1);

	for (size_t j = 0; j < count; j++) {
		if (dt == KHOR_FLOAT64)
			((double *)h)[j] = v(rank, j);
		else
			((float *)h)[j] = (float)v(rank, j);
	}
	if (d != NULL && count > 0 && kmem_emu_copy_sync(d, h, count * esz) != KHOR_SUCCESS) {
		kmem_emu_free(d);
		d = NULL;
	}
	free(h);
	return d;
}

/* Value j of a device buffer (read back whole each time: the tests are small). */
static int dev_check(const void *d, khor_dtype dt, size_t count, double (*want)(int, size_t), int n,
                     char *why, size_t len, const char *what)
{
	size_t esz = dt == KHOR_FLOAT64 ? 8 : 4;
	char *h = malloc(count * esz + 1);

	if (count > 0 && kmem_emu_copy_sync(h, d, count * esz) != KHOR_SUCCESS) {
		snprintf(why, len, "%s: reading the device buffer back failed", what);
		free(h);
		return -1;
	}
	for (size_t j = 0; j < count; j++) {
		double got = dt == KHOR_FLOAT64 ? ((double *)h)[j] : (double)((float *)h)[j];
		if (got != want(n, j)) {
			snprintf(why, len, "%s[%zu] = %.17g, want %.17g", what, j, got, want(n, j));
			free(h);
			return -1;
		}
	}
	free(h);
	return 0;
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

static int wait_ok(struct shared *sh, int rank, khor_handle *h, const char *what)
{
	khor_status st = khor_handle_wait(h);
	if (st != KHOR_SUCCESS)
		return fail(sh, rank, 30, "%s: status %d: %s", what, st, khor_handle_error(h));
	return 0;
}

static void expect_all_ok(const struct shared *sh, const harness_result *res, int n,
                          const char *what)
{
	if (res->timed_out)
		for (int r = 0; r < n; r++)
			fprintf(stderr, "%s: hung: rank %d was at step %d\n", what, r,
			        sh->progress[r]);
	cr_assert(!res->timed_out, "%s: the job hung (killed at the deadline)", what);
	for (int r = 0; r < n; r++)
		cr_expect_eq(res->status[r], 0, "%s: rank %d exited %d: %s", what, r,
		             res->status[r], sh->err[r]);
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
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h;
	char why[TEXT];
	int rc;

	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
		return rc;
	/* 1. One tensor, out of place, plain sum; then in place with scale factors and avg. */
	sh->progress[rank] = 1;
	size_t cnt = 1000;
	void *in = dev_fill(KHOR_FLOAT32, cnt, val, rank), *out = kmem_emu_alloc(cnt * 4);
	if (in == NULL || out == NULL)
		return fail(sh, rank, 20, "kmem_emu_alloc failed");
	if (khor_enqueue_allreduce(eng, 0, "dev/one", in, out, KHOR_FLOAT32, 1,
	                           (int64_t[]){(int64_t)cnt}, KHOR_SUM, 1.0, 1.0,
	                           &h) != KHOR_SUCCESS)
		return fail(sh, rank, 21, "dev/one refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "dev/one")) != 0)
		return rc;
	khor_handle_free(h);
	if (dev_check(out, KHOR_FLOAT32, cnt, sum_n, n, why, sizeof(why), "dev/one") != 0)
		return fail(sh, rank, 22, "%s", why);
	if (khor_enqueue_allreduce(eng, 0, "dev/one_avg", in, out, KHOR_FLOAT32, 1,
	                           (int64_t[]){(int64_t)cnt}, KHOR_AVG, 0.5, 4.0,
	                           &h) != KHOR_SUCCESS)
		return fail(sh, rank, 23, "dev/one_avg refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "dev/one_avg")) != 0)
		return rc;
	khor_handle_free(h);
	if (dev_check(out, KHOR_FLOAT32, cnt, scaled_avg, n, why, sizeof(why), "dev/one_avg") != 0)
		return fail(sh, rank, 24, "%s", why);
	if (dev_check(in, KHOR_FLOAT32, cnt, val, rank, why, sizeof(why), "dev/one_avg's input") !=
	    0)
		return fail(sh, rank, 25, "the input changed (out of place): %s", why);
	kmem_emu_free(in);
	kmem_emu_free(out);

	/*
	 * 2. Fused: a grouped allreduce (one negotiation, so one cycle) of float32 and float64
	 * tensors, some in place, prescale 0.5 and postscale 4; then the same sizes as separate
	 * handles enqueued at once with avg.
	 */
	sh->progress[rank] = 2;
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
				return fail(sh, rank, 26, "kmem_emu_alloc failed");
			snprintf(nbuf[t], sizeof(nbuf[t]), "dev/fused%d/%d", pass, t);
			names[t] = nbuf[t];
			ndims[t] = 1;
			dims[t] = (int64_t)counts[t];
		}
		if (pass == 0) {
			if (khor_enqueue_grouped_allreduce(
			        eng, 0, NT, names, (const void *const *)ins, outs, dts, ndims, dims,
			        KHOR_SUM, 0.5, 4.0, &hs[0]) != KHOR_SUCCESS)
				return fail(sh, rank, 27, "grouped refused: %s",
				            khor_engine_error(eng));
			if ((rc = wait_ok(sh, rank, hs[0], "dev/fused0")) != 0)
				return rc;
			khor_handle_free(hs[0]);
		} else {
			for (int t = 0; t < NT; t++)
				if (khor_enqueue_allreduce(eng, 0, names[t], ins[t], outs[t],
				                           dts[t], 1, &dims[t], KHOR_AVG, 0.5, 4.0,
				                           &hs[t]) != KHOR_SUCCESS)
					return fail(sh, rank, 28, "%s refused: %s", names[t],
					            khor_engine_error(eng));
			for (int t = 0; t < NT; t++) {
				if ((rc = wait_ok(sh, rank, hs[t], names[t])) != 0)
					return rc;
				khor_handle_free(hs[t]);
			}
		}
		for (int t = 0; t < NT; t++) {
			if (dev_check(outs[t], dts[t], counts[t],
			              pass == 0 ? scaled_sum : scaled_avg, n, why, sizeof(why),
			              names[t]) != 0)
				return fail(sh, rank, 29, "%s", why);
			if (outs[t] != ins[t])
				kmem_emu_free(outs[t]);
			kmem_emu_free(ins[t]);
		}
	}
	return finish(sh, rank, world, eng);
}

Test(engine_device, allreduce_alone_and_fused_with_scale_factors_and_avg_n3, .timeout = 180)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 3, .timeout = "30s", .deadline_s = 150};
	harness_result res;

	harness_run(&o, body_allreduce, sh, &res);
	expect_all_ok(sh, &res, 3, "device allreduce");
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- broadcast, allgather, alltoall, reducescatter ----------------------------------------- */

/* Device memory for the engine's allgather and alltoall outputs, freed by the test. */
struct dev_allocs {
	void *p[8];
	int n;
};

static void *dev_alloc_cb(void *arg, int ndim, const int64_t *dims, size_t bytes)
{
	struct dev_allocs *a = arg;
	(void)ndim;
	(void)dims;
	if (a->n == 8)
		return NULL;
	void *p = kmem_emu_alloc(bytes > 0 ? bytes : 1);
	a->p[a->n++] = p;
	return p;
}

static void *host_alloc_cb(void *arg, int ndim, const int64_t *dims, size_t bytes)
{
	struct dev_allocs *a = arg;
	(void)ndim;
	(void)dims;
	if (a->n == 8)
		return NULL;
	void *p = malloc(bytes > 0 ? bytes : 1);
	a->p[a->n++] = p;
	return p;
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

static int body_others(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h;
	char why[TEXT];
	int rc;

	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
		return rc;
	/* broadcast from rank 1: out of place there, in place elsewhere. */
	sh->progress[rank] = 1;
	size_t cnt = 777;
	void *b_in = dev_fill(KHOR_FLOAT64, cnt, val, rank);
	void *b_out = rank == 1 ? kmem_emu_alloc(cnt * 8) : b_in;
	if (khor_enqueue_broadcast(eng, 0, "dev/bcast", b_in, b_out, KHOR_FLOAT64, 1,
	                           (int64_t[]){(int64_t)cnt}, 1, &h) != KHOR_SUCCESS)
		return fail(sh, rank, 40, "dev/bcast refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "dev/bcast")) != 0)
		return rc;
	khor_handle_free(h);
	if (dev_check(b_out, KHOR_FLOAT64, cnt, val, 1, why, sizeof(why), "dev/bcast") != 0)
		return fail(sh, rank, 41, "%s", why);
	if (b_out != b_in)
		kmem_emu_free(b_out);
	kmem_emu_free(b_in);

	/* allgather: rank r gives r + 1 rows of 4; the output is every rank's rows in order. */
	sh->progress[rank] = 2;
	struct dev_allocs al = {{0}, 0};
	size_t rows = (size_t)rank + 1;
	void *g_in = dev_fill(KHOR_FLOAT32, rows * 4, row_val, rank);
	if (khor_enqueue_allgather(eng, 0, "dev/ag", g_in, KHOR_FLOAT32, 2,
	                           (int64_t[]){(int64_t)rows, 4}, dev_alloc_cb, &al,
	                           &h) != KHOR_SUCCESS)
		return fail(sh, rank, 42, "dev/ag refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "dev/ag")) != 0)
		return rc;
	void *g_out = NULL;
	int64_t odims[2] = {0, 0};
	if (khor_handle_output(h, 0, &g_out, NULL, odims) != KHOR_SUCCESS || g_out != al.p[0])
		return fail(sh, rank, 43, "dev/ag: khor_handle_output gave %p, the callback %p",
		            g_out, al.p[0]);
	khor_handle_free(h);
	int64_t total = (int64_t)n * (n + 1) / 2;
	if (odims[0] != total || odims[1] != 4)
		return fail(sh, rank, 44, "dev/ag: output dims [%lld, %lld], want [%lld, 4]",
		            (long long)odims[0], (long long)odims[1], (long long)total);
	float *gh = malloc((size_t)total * 16);
	kmem_emu_copy_sync(gh, g_out, (size_t)total * 16);
	for (int r = 0, at = 0; r < n; r++)
		for (int k = 0; k < (r + 1) * 4; k++, at++)
			if (gh[at] != (float)row_val(r, (size_t)k)) {
				fail(sh, rank, 45,
				     "dev/ag: element %d (rank %d's %d) = %g, want %g", at, r, k,
				     gh[at], row_val(r, (size_t)k));
				free(gh);
				return 45;
			}
	free(gh);
	kmem_emu_free(g_out);
	al.n = 0;

	/* A device allgather without an alloc callback is refused at once, saying why; one
	 * whose callback returns host memory fails its handle, and the set goes on. */
	khor_status st = khor_enqueue_allgather(eng, 0, "dev/ag_noalloc", g_in, KHOR_FLOAT32, 2,
	                                        (int64_t[]){(int64_t)rows, 4}, NULL, NULL, &h);
	snprintf(sh->text[rank][0], TEXT, "%s", khor_engine_error(eng));
	if (st == KHOR_SUCCESS)
		return fail(sh, rank, 46, "a device allgather without an alloc callback was taken");
	if (strstr(sh->text[rank][0], "dev/ag_noalloc") == NULL ||
	    strcasestr(sh->text[rank][0], "alloc callback") == NULL)
		return fail(sh, rank, 47,
		            "the refusal does not name the tensor and the callback: %s",
		            sh->text[rank][0]);
	if (khor_enqueue_allgather(eng, 0, "dev/ag_hostcb", g_in, KHOR_FLOAT32, 2,
	                           (int64_t[]){(int64_t)rows, 4}, host_alloc_cb, &al,
	                           &h) != KHOR_SUCCESS)
		return fail(sh, rank, 48, "dev/ag_hostcb refused: %s", khor_engine_error(eng));
	st = khor_handle_wait(h);
	snprintf(sh->text[rank][1], TEXT, "%s", khor_handle_error(h));
	khor_handle_free(h);
	for (int i = 0; i < al.n; i++)
		free(al.p[i]);
	al.n = 0;
	if (st == KHOR_SUCCESS || strstr(sh->text[rank][1], "dev/ag_hostcb") == NULL ||
	    strcasestr(sh->text[rank][1], "host memory") == NULL)
		return fail(sh, rank, 49, "dev/ag_hostcb: status %d, error: %s", st,
		            sh->text[rank][1]);
	kmem_emu_free(g_in);

	/* alltoall: rank r sends q + 1 rows of 4 to rank q. */
	sh->progress[rank] = 3;
	int64_t splits[HARNESS_MAX_RANKS], srows = 0;
	for (int q = 0; q < n; q++)
		srows += splits[q] = q + 1;
	void *a_in = dev_fill(KHOR_FLOAT32, (size_t)srows * 4, row_val, rank);
	if (khor_enqueue_alltoall(eng, 0, "dev/a2a", a_in, KHOR_FLOAT32, 2, (int64_t[]){srows, 4},
	                          splits, dev_alloc_cb, &al, &h) != KHOR_SUCCESS)
		return fail(sh, rank, 50, "dev/a2a refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "dev/a2a")) != 0)
		return rc;
	khor_handle_free(h);
	/* From rank q: its rows starting at sum_{p < rank} (p + 1), rank + 1 of them. */
	size_t off = (size_t)rank * (size_t)(rank + 1) / 2 * 4, per = (size_t)(rank + 1) * 4;
	float *ah = malloc((size_t)n * per * 4);
	kmem_emu_copy_sync(ah, al.p[0], (size_t)n * per * 4);
	for (int q = 0; q < n; q++)
		for (size_t k = 0; k < per; k++)
			if (ah[(size_t)q * per + k] != (float)row_val(q, off + k)) {
				fail(sh, rank, 51,
				     "dev/a2a: from rank %d, element %zu = %g, want %g", q, k,
				     ah[(size_t)q * per + k], row_val(q, off + k));
				free(ah);
				return 51;
			}
	free(ah);
	kmem_emu_free(al.p[0]);
	kmem_emu_free(a_in);
	al.n = 0;

	/* reducescatter of [rows, 3], rows even and uneven over the ranks, prescale 0.5 and
	 * postscale 4 on one of them. */
	sh->progress[rank] = 4;
	static const int rs_rows[2] = {6, 7};
	for (int v = 0; v < 2; v++) {
		size_t d0 = (size_t)rs_rows[v], c = d0 * 3;
		size_t mine = d0 / (size_t)n + ((size_t)rank < d0 % (size_t)n ? 1 : 0);
		size_t first = (size_t)rank * (d0 / (size_t)n) +
		               ((size_t)rank < d0 % (size_t)n ? (size_t)rank : d0 % (size_t)n);
		double pre = v == 1 ? 0.5 : 1.0, post = v == 1 ? 4.0 : 1.0;
		void *r_in = dev_fill(KHOR_FLOAT32, c, rs_val, rank);
		void *r_out = kmem_emu_alloc(mine * 12 + 1);
		char nm[32];
		snprintf(nm, sizeof(nm), "dev/rs%zu", d0);
		if (khor_enqueue_reducescatter(eng, 0, nm, r_in, r_out, KHOR_FLOAT32, 2,
		                               (int64_t[]){(int64_t)d0, 3}, KHOR_SUM, pre, post,
		                               &h) != KHOR_SUCCESS)
			return fail(sh, rank, 52, "%s refused: %s", nm, khor_engine_error(eng));
		if ((rc = wait_ok(sh, rank, h, nm)) != 0)
			return rc;
		khor_handle_free(h);
		float *rh = malloc(mine * 12 + 1);
		kmem_emu_copy_sync(rh, r_out, mine * 12);
		for (size_t k = 0; k < mine * 3; k++) {
			size_t j = first * 3 + k;
			double want = pre * post * (double)(n * (n + 1) / 2) * (double)(j + 1);
			if (rh[k] != (float)want) {
				fail(sh, rank, 53,
				     "%s: element %zu (of the whole, %zu) = %g, want %g", nm, k, j,
				     rh[k], want);
				free(rh);
				return 53;
			}
		}
		free(rh);
		kmem_emu_free(r_in);
		kmem_emu_free(r_out);
	}
	return finish(sh, rank, world, eng);
}

Test(engine_device, broadcast_allgather_alltoall_reducescatter_n3, .timeout = 180)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 3, .timeout = "30s", .deadline_s = 150};
	harness_result res;

	harness_run(&o, body_others, sh, &res);
	expect_all_ok(sh, &res, 3, "device broadcast, allgather, alltoall, reducescatter");
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
static int delayed_fill(void *stream, void *ev, void *dev, const void *host, size_t bytes,
                        char *why, size_t len)
{
	kerr e;

	kerr_clear(&e);
	if (kmem_emu_delay(stream, READY_DELAY_US, &e) != KHOR_SUCCESS ||
	    emu->copy(dev, host, bytes, stream, &e) != KHOR_SUCCESS ||
	    emu->event_record(ev, stream, &e) != KHOR_SUCCESS) {
		snprintf(why, len, "queueing the delayed fill: %s", e.text);
		return -1;
	}
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
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h;
	char why[TEXT];
	void *stream, *ev[4];
	kerr e;
	int rc;

	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
		return rc;
	kerr_clear(&e);
	if (emu->stream_create(&stream, &e) != KHOR_SUCCESS)
		return fail(sh, rank, 60, "stream_create: %s", e.text);
	for (int i = 0; i < 4; i++)
		if (emu->event_create(&ev[i], &e) != KHOR_SUCCESS)
			return fail(sh, rank, 61, "event_create: %s", e.text);
	size_t cnt = 4096;
	float *host = malloc(cnt * 4);
	for (size_t j = 0; j < cnt; j++)
		host[j] = (float)val(rank, j);

	/* 1. allreduce, in place. */
	sh->progress[rank] = 1;
	void *d = dev_fill(KHOR_FLOAT32, cnt, nines, rank);
	if (delayed_fill(stream, ev[0], d, host, cnt * 4, why, sizeof(why)) != 0)
		return fail(sh, rank, 62, "%s", why);
	double t0 = mono();
	if (khor_enqueue_allreduce_event(eng, 0, "ready/ar", d, d, KHOR_FLOAT32, 1,
	                                 (int64_t[]){(int64_t)cnt}, KHOR_SUM, 1.0, 1.0, ev[0],
	                                 &h) != KHOR_SUCCESS)
		return fail(sh, rank, 63, "ready/ar refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "ready/ar")) != 0)
		return rc;
	sh->secs[rank][0] = mono() - t0;
	khor_handle_free(h);
	if (dev_check(d, KHOR_FLOAT32, cnt, sum_n, n, why, sizeof(why), "ready/ar") != 0)
		return fail(sh, rank, 64, "the engine read the input before its ready event: %s",
		            why);

	/* 2. A grouped allreduce, fused, each tensor with its own delayed event. */
	sh->progress[rank] = 2;
	void *g[2] = {dev_fill(KHOR_FLOAT32, 100, nines, rank),
	              dev_fill(KHOR_FLOAT32, 300, nines, rank)};
	if (delayed_fill(stream, ev[1], g[0], host, 100 * 4, why, sizeof(why)) != 0 ||
	    delayed_fill(stream, ev[2], g[1], host, 300 * 4, why, sizeof(why)) != 0)
		return fail(sh, rank, 65, "%s", why);
	const char *gn[2] = {"ready/g0", "ready/g1"};
	khor_dtype gdt[2] = {KHOR_FLOAT32, KHOR_FLOAT32};
	int gnd[2] = {1, 1};
	int64_t gdims[2] = {100, 300};
	void *gev[2] = {ev[1], ev[2]};
	if (khor_enqueue_grouped_allreduce_event(eng, 0, 2, gn, (const void *const *)g, g, gdt, gnd,
	                                         gdims, KHOR_AVG, 0.5, 4.0, gev,
	                                         &h) != KHOR_SUCCESS)
		return fail(sh, rank, 66, "ready/g refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "ready/g")) != 0)
		return rc;
	khor_handle_free(h);
	if (dev_check(g[0], KHOR_FLOAT32, 100, scaled_avg, n, why, sizeof(why), "ready/g0") != 0 ||
	    dev_check(g[1], KHOR_FLOAT32, 300, scaled_avg, n, why, sizeof(why), "ready/g1") != 0)
		return fail(sh, rank, 67, "%s", why);
	kmem_emu_free(g[0]);
	kmem_emu_free(g[1]);

	/* 3. broadcast from rank 0 and reducescatter, each behind a delayed fill. */
	sh->progress[rank] = 3;
	if (delayed_fill(stream, ev[3], d, host, cnt * 4, why, sizeof(why)) != 0)
		return fail(sh, rank, 68, "%s", why);
	if (khor_enqueue_broadcast_event(eng, 0, "ready/bc", d, d, KHOR_FLOAT32, 1,
	                                 (int64_t[]){(int64_t)cnt}, 0, ev[3], &h) != KHOR_SUCCESS)
		return fail(sh, rank, 69, "ready/bc refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "ready/bc")) != 0)
		return rc;
	khor_handle_free(h);
	if (dev_check(d, KHOR_FLOAT32, cnt, val, 0, why, sizeof(why), "ready/bc") != 0)
		return fail(sh, rank, 70, "%s", why);
	void *rs_out = kmem_emu_alloc(cnt * 4);
	if (delayed_fill(stream, ev[0], d, host, cnt * 4, why, sizeof(why)) != 0)
		return fail(sh, rank, 71, "%s", why);
	if (khor_enqueue_reducescatter_event(eng, 0, "ready/rs", d, rs_out, KHOR_FLOAT32, 1,
	                                     (int64_t[]){(int64_t)cnt}, KHOR_SUM, 1.0, 1.0, ev[0],
	                                     &h) != KHOR_SUCCESS)
		return fail(sh, rank, 72, "ready/rs refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "ready/rs")) != 0)
		return rc;
	khor_handle_free(h);
	size_t mine = cnt / (size_t)n + ((size_t)rank < cnt % (size_t)n ? 1 : 0);
	size_t first = (size_t)rank * (cnt / (size_t)n) +
	               ((size_t)rank < cnt % (size_t)n ? (size_t)rank : cnt % (size_t)n);
	float *rh = malloc(mine * 4 + 4);
	kmem_emu_copy_sync(rh, rs_out, mine * 4);
	for (size_t k = 0; k < mine; k++)
		if (rh[k] != (float)sum_n(n, first + k)) {
			fail(sh, rank, 73, "ready/rs[%zu] = %g, want %g", k, rh[k],
			     sum_n(n, first + k));
			free(rh);
			return 73;
		}
	free(rh);
	kmem_emu_free(rs_out);

	/* 4. allgather behind a delayed fill, into device memory from the callback. */
	sh->progress[rank] = 4;
	struct dev_allocs al = {{0}, 0};
	if (delayed_fill(stream, ev[1], d, host, 64 * 4, why, sizeof(why)) != 0)
		return fail(sh, rank, 74, "%s", why);
	if (khor_enqueue_allgather_event(eng, 0, "ready/ag", d, KHOR_FLOAT32, 1, (int64_t[]){64},
	                                 dev_alloc_cb, &al, ev[1], &h) != KHOR_SUCCESS)
		return fail(sh, rank, 75, "ready/ag refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, h, "ready/ag")) != 0)
		return rc;
	khor_handle_free(h);
	float *agh = malloc((size_t)n * 64 * 4);
	kmem_emu_copy_sync(agh, al.p[0], (size_t)n * 64 * 4);
	for (int r = 0; r < n; r++)
		for (size_t j = 0; j < 64; j++)
			if (agh[(size_t)r * 64 + j] != (float)val(r, j)) {
				fail(sh, rank, 76, "ready/ag: rank %d's [%zu] = %g, want %g", r, j,
				     agh[(size_t)r * 64 + j], val(r, j));
				free(agh);
				return 76;
			}
	free(agh);
	kmem_emu_free(al.p[0]);

	/* 5. A ready event for a host tensor is refused: it has no backend to wait with. */
	float hv[4] = {1, 2, 3, 4};
	khor_status st =
	    khor_enqueue_allreduce_event(eng, 0, "ready/host", hv, hv, KHOR_FLOAT32, 1,
	                                 (int64_t[]){4}, KHOR_SUM, 1.0, 1.0, ev[2], &h);
	snprintf(sh->text[rank][0], TEXT, "%s", khor_engine_error(eng));
	if (st == KHOR_SUCCESS)
		return fail(sh, rank, 77, "a ready event for a host tensor was taken");
	if (strstr(sh->text[rank][0], "ready/host") == NULL)
		return fail(sh, rank, 78, "the refusal does not name the tensor: %s",
		            sh->text[rank][0]);

	kmem_emu_free(d);
	free(host);
	for (int i = 0; i < 4; i++)
		emu->event_destroy(ev[i]);
	emu->stream_destroy(stream);
	return finish(sh, rank, world, eng);
}

Test(engine_device, ready_events_hold_the_engine_until_the_producing_stream_ran_n2, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 2, .timeout = "30s", .deadline_s = 100};
	harness_result res;

	harness_run(&o, body_ready, sh, &res);
	expect_all_ok(sh, &res, 2, "ready events");
	for (int r = 0; r < 2; r++)
		if (res.status[r] == 0)
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
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h;
	void *stream, *ev;
	kerr e;
	int rc;

	(void)n;
	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
		return rc;
	kerr_clear(&e);
	if (emu->stream_create(&stream, &e) != KHOR_SUCCESS ||
	    emu->event_create(&ev, &e) != KHOR_SUCCESS)
		return fail(sh, rank, 80, "stream or event: %s", e.text);
	void *d = kmem_emu_alloc(64 * 4);
	if (kmem_emu_delay(stream, 60u * 1000000u, &e) != KHOR_SUCCESS ||
	    emu->event_record(ev, stream, &e) != KHOR_SUCCESS)
		return fail(sh, rank, 81, "queueing: %s", e.text);
	double t0 = mono();
	if (khor_enqueue_allreduce_event(eng, 0, "never/ar", d, d, KHOR_FLOAT32, 1, (int64_t[]){64},
	                                 KHOR_SUM, 1.0, 1.0, ev, &h) != KHOR_SUCCESS)
		return fail(sh, rank, 82, "never/ar refused: %s", khor_engine_error(eng));
	/* Not khor_handle_wait: its own KHOR_TIMEOUT began before the engine's wait did. */
	khor_status st;
	while ((st = khor_handle_test(h)) == KHOR_IN_PROGRESS && mono() - t0 < 20)
		sleep_ms(5);
	sh->secs[rank][0] = mono() - t0;
	snprintf(sh->text[rank][0], TEXT, "%s", khor_handle_error(h));
	khor_handle_free(h);
	if (st == KHOR_IN_PROGRESS)
		return fail(sh, rank, 83, "never/ar still pending after 20 s (KHOR_TIMEOUT 2 s)");
	if (st == KHOR_SUCCESS)
		return fail(sh, rank, 84, "never/ar succeeded, its event never completed");
	/* The stream's delay is cut short when it is destroyed. */
	emu->stream_destroy(stream);
	emu->event_destroy(ev);
	kmem_emu_free(d);
	return finish(sh, rank, world, eng);
}

Test(engine_device, a_ready_event_that_never_completes_fails_the_handle_naming_it, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 2, .timeout = "2s", .deadline_s = 40};
	harness_result res;

	harness_run(&o, body_never, sh, &res);
	expect_all_ok(sh, &res, 2, "a ready event that never completes");
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
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h[3];
	char why[TEXT];
	int rc;

	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
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
		sh->progress[rank] = step;
		for (int t = 0; t < NT; t++) {
			if (t % 2 == 0) {
				float *p = malloc(cnt[t] * 4);
				for (size_t j = 0; j < cnt[t]; j++)
					p[j] = (float)val(rank, j);
				b[t] = p;
			} else {
				b[t] = dev_fill(KHOR_FLOAT32, cnt[t], val, rank);
			}
			snprintf(nbuf[t], sizeof(nbuf[t]), "mixed/%d/%s%d", step,
			         t % 2 == 0 ? "host" : "dev", t);
			names[t] = nbuf[t];
			dts[t] = KHOR_FLOAT32;
			ndims[t] = 1;
			dims[t] = (int64_t)cnt[t];
		}
		if (khor_enqueue_grouped_allreduce(eng, 0, NT, names, (const void *const *)b, b,
		                                   dts, ndims, dims, KHOR_SUM, 0.5, 4.0,
		                                   &h[0]) != KHOR_SUCCESS)
			return fail(sh, rank, 100, "mixed group refused: %s",
			            khor_engine_error(eng));
		size_t bc = 300;
		double *hb = malloc(bc * 8);
		for (size_t j = 0; j < bc; j++)
			hb[j] = val(rank, j);
		void *db = dev_fill(KHOR_FLOAT64, bc, val, rank);
		char n1[32], n2[32];
		snprintf(n1, sizeof(n1), "mixed/%d/bc_host", step);
		snprintf(n2, sizeof(n2), "mixed/%d/bc_dev", step);
		if (khor_enqueue_broadcast(eng, 0, n1, hb, hb, KHOR_FLOAT64, 1,
		                           (int64_t[]){(int64_t)bc}, 1, &h[1]) != KHOR_SUCCESS ||
		    khor_enqueue_broadcast(eng, 0, n2, db, db, KHOR_FLOAT64, 1,
		                           (int64_t[]){(int64_t)bc}, 0, &h[2]) != KHOR_SUCCESS)
			return fail(sh, rank, 101, "a broadcast refused: %s",
			            khor_engine_error(eng));
		for (int i = 0; i < 3; i++) {
			if ((rc = wait_ok(sh, rank, h[i],
			                  i == 0 ? "mixed group" : "a broadcast")) != 0)
				return rc;
			khor_handle_free(h[i]);
		}
		for (int t = 0; t < NT; t++) {
			if (t % 2 == 0) {
				for (size_t j = 0; j < cnt[t]; j++)
					if (((float *)b[t])[j] != (float)scaled_sum(n, j))
						return fail(sh, rank, 102, "%s[%zu] = %g, want %g",
						            names[t], j, ((float *)b[t])[j],
						            scaled_sum(n, j));
				free(b[t]);
			} else {
				if (dev_check(b[t], KHOR_FLOAT32, cnt[t], scaled_sum, n, why,
				              sizeof(why), names[t]) != 0)
					return fail(sh, rank, 103, "%s", why);
				kmem_emu_free(b[t]);
			}
		}
		for (size_t j = 0; j < bc; j++)
			if (hb[j] != val(1, j))
				return fail(sh, rank, 104, "%s[%zu] = %g, want %g", n1, j, hb[j],
				            val(1, j));
		if (dev_check(db, KHOR_FLOAT64, bc, val, 0, why, sizeof(why), n2) != 0)
			return fail(sh, rank, 105, "%s", why);
		free(hb);
		kmem_emu_free(db);
	}
	/* A tensor whose input is device memory and output host memory is refused. */
	float hv[16];
	void *dv = kmem_emu_alloc(64);
	khor_handle *x;
	khor_status st = khor_enqueue_allreduce(eng, 0, "mixed/split", dv, hv, KHOR_FLOAT32, 1,
	                                        (int64_t[]){16}, KHOR_SUM, 1.0, 1.0, &x);
	snprintf(sh->text[rank][0], TEXT, "%s", khor_engine_error(eng));
	kmem_emu_free(dv);
	if (st == KHOR_SUCCESS)
		return fail(sh, rank, 106, "a device input with a host output was taken");
	if (strstr(sh->text[rank][0], "mixed/split") == NULL)
		return fail(sh, rank, 107, "the refusal does not name the tensor: %s",
		            sh->text[rank][0]);
	return finish(sh, rank, world, eng);
}

Test(engine_device, host_and_device_tensors_in_one_cycle_run_apart_n2, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 2, .timeout = "30s", .deadline_s = 100};
	harness_result res;

	harness_run(&o, body_mixed, sh, &res);
	expect_all_ok(sh, &res, 2, "host and device tensors in one cycle");
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
	struct shared *sh = arg;
	khor_comm *world;
	khor_engine *eng;
	khor_handle *h;
	int rc;

	if ((rc = start(sh, rank, cfg, NULL, &world, &eng)) != 0)
		return rc;
	enum { NT = 3 };
	static const size_t cnt[NT] = {100, 17, 2000};
	static const khor_op ops[NT] = {KHOR_SUM, KHOR_SUM, KHOR_AVG};
	for (int step = 0; step <= rank; step++) {
		sh->progress[rank] = step;
		void *b[NT];
		const char *names[2];
		char nbuf[NT][32];
		for (int t = 0; t < NT; t++) {
			b[t] = dev_fill(KHOR_FLOAT32, cnt[t], val, rank);
			snprintf(nbuf[t], sizeof(nbuf[t]), "join/%d", t);
		}
		/* tensors 0 and 1 in a group (fused), tensor 2 alone */
		names[0] = nbuf[0];
		names[1] = nbuf[1];
		if (khor_enqueue_grouped_allreduce(eng, 0, 2, names, (const void *const *)b, b,
		                                   (khor_dtype[]){KHOR_FLOAT32, KHOR_FLOAT32},
		                                   (int[]){1, 1},
		                                   (int64_t[]){(int64_t)cnt[0], (int64_t)cnt[1]},
		                                   KHOR_SUM, 1.0, 1.0, &h) != KHOR_SUCCESS)
			return fail(sh, rank, 120, "step %d: group refused: %s", step,
			            khor_engine_error(eng));
		if ((rc = wait_ok(sh, rank, h, "join group")) != 0)
			return rc;
		khor_handle_free(h);
		if (khor_enqueue_allreduce(eng, 0, nbuf[2], b[2], b[2], KHOR_FLOAT32, 1,
		                           (int64_t[]){(int64_t)cnt[2]}, KHOR_AVG, 1.0, 1.0,
		                           &h) != KHOR_SUCCESS)
			return fail(sh, rank, 121, "step %d: %s refused: %s", step, nbuf[2],
			            khor_engine_error(eng));
		if ((rc = wait_ok(sh, rank, h, nbuf[2])) != 0)
			return rc;
		khor_handle_free(h);
		for (int t = 0; t < NT; t++) {
			float *hb = malloc(cnt[t] * 4);
			kmem_emu_copy_sync(hb, b[t], cnt[t] * 4);
			for (size_t j = 0; j < cnt[t]; j++) {
				double want = join_sum(step, n, j);
				if (ops[t] == KHOR_AVG)
					want /= n;
				if (hb[j] != (float)want) {
					fail(sh, rank, 122,
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
	if (khor_enqueue_join(eng, 0, &jh) != KHOR_SUCCESS)
		return fail(sh, rank, 123, "join refused: %s", khor_engine_error(eng));
	if ((rc = wait_ok(sh, rank, jh, "join")) != 0)
		return rc;
	if (khor_handle_join_rank(jh) != n - 1)
		return fail(sh, rank, 124, "join rank %d, want %d", khor_handle_join_rank(jh),
		            n - 1);
	khor_handle_free(jh);
	return finish(sh, rank, world, eng);
}

Test(engine_device, join_with_device_tensors_n3, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = {.n = 3, .timeout = "30s", .deadline_s = 100};
	harness_result res;

	harness_run(&o, body_join, sh, &res);
	expect_all_ok(sh, &res, 3, "join with device tensors");
	harness_shared_free(sh, sizeof(*sh));
}
