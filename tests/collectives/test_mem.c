/*
 * test_mem.c -- the memory seam's backend contract (collectives/mem.h) on the emulated
 * device, and mem.c's generic helpers on top of it.
 *
 * What kind a pointer is (device, offsets into it, pinned, host); that the CPU really cannot
 * touch device memory (a child that reads it dies of SIGSEGV); copies in every direction;
 * reduce, avg_finish and scale for every dtype x op giving the CPU kernels' bits; stream
 * order and events, waits across streams, host waits that time out with a clear error; and
 * the comm state of mem.c: device buffers, pinned staging slots that are reused and given
 * back only after their event, the event pool.
 *
 * Criterion's runner does not start under ThreadSanitizer, so the same file also builds
 * without it (TEST_MEM_PLAIN: tests/CMakeLists.txt's tsan_mem): a small runner below forks
 * one child per test, as Criterion does.
 */
#include "base/dtype.h"
#include "tests/support/mem_emu.h"
#include "collectives/reduce.h"
#include "tests/mem_check.h"
#include "tests/values.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TEST_MEM_PLAIN
#include <criterion/criterion.h>
#else
/* Just what this file uses of Criterion: Test, cr_assert(_eq), cr_expect. */
typedef struct plain_test {
	const char *name;
	void (*fn)(void);
} plain_test;
static plain_test plain_tests[32];
static int plain_ntests;
static int plain_failed; /* a cr_expect failed in this (child) process */

static void plain_add(const char *name, void (*fn)(void))
{
	plain_tests[plain_ntests].name = name;
	plain_tests[plain_ntests++].fn = fn;
}

/* The message of a failed assertion ("" when it has none). */
static void plain_msg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

#define Test(suite, name, ...)                                                             \
	static void suite##_##name(void);                                                  \
	__attribute__((constructor)) static void plain_reg_##suite##_##name(void)          \
	{                                                                                  \
		plain_add(#suite "::" #name, suite##_##name);                              \
	}                                                                                  \
	static void suite##_##name(void)
#define PLAIN_REPORT(fatal, cond, ...)                                                     \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: failed: %s: ", __FILE__, __LINE__, #cond); \
			plain_msg("" __VA_ARGS__);                                         \
			fprintf(stderr, "\n");                                             \
			if (fatal)                                                         \
				_exit(1);                                                  \
			plain_failed = 1;                                                  \
		}                                                                          \
	} while (0)
#define cr_assert(cond, ...) PLAIN_REPORT(1, cond, __VA_ARGS__)
#define cr_expect(cond, ...) PLAIN_REPORT(0, cond, __VA_ARGS__)
#define cr_assert_eq(a, b, ...) PLAIN_REPORT(1, (a) == (b), __VA_ARGS__)

#if defined(__SANITIZE_THREAD__)
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
	return "halt_on_error=1:second_deadlock_stack=1";
}
#endif

/* Runs every test (or those whose name contains argv[1]) in a child of its own. */
int main(int argc, char **argv)
{
	int failed = 0;

	for (int i = 0; i < plain_ntests; i++) {
		if (argc > 1 && strstr(plain_tests[i].name, argv[1]) == NULL)
			continue;
		fflush(NULL);
		pid_t pid = fork();
		if (pid == 0) {
			plain_tests[i].fn();
			exit(plain_failed);
		}
		int status = 0;
		waitpid(pid, &status, 0);
		bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
		printf("%s %s\n", ok ? "PASS" : "FAIL", plain_tests[i].name);
		failed += !ok;
	}
	printf("%d failed\n", failed);
	return failed != 0;
}
#endif

static const kmem_backend *const be = &kmem_emu_backend;

static const khor_dtype dtypes[] = { KHOR_FLOAT32, KHOR_FLOAT64, KHOR_FLOAT16, KHOR_BFLOAT16,
	                             KHOR_INT8,    KHOR_UINT8,   KHOR_INT16,   KHOR_INT32,
	                             KHOR_INT64,   KHOR_BOOL };
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
static const khor_op ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX, KHOR_PROD };
#define NOPS (sizeof(ops) / sizeof(ops[0]))

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Random bytes, with a few small values and zeros mixed in so results are not all NaN. */
static void fill(void *p, size_t len)
{
	uint8_t *b = p;

	for (size_t i = 0; i < len; i++) {
		uint64_t r = values_xorshift64s(&rng_state);
		b[i] = (uint8_t)(r % 5 == 0 ? (r >> 8) % 4 : r >> 24);
	}
}

static void *dalloc(size_t len)
{
	void *p = NULL;
	kerr e;

	kerr_clear(&e);
	cr_assert_eq(be->dev_alloc(len, &p, &e), KHOR_SUCCESS, "dev_alloc(%zu): %s", len, e.text);
	return p;
}

static void *palloc(size_t len)
{
	void *p = NULL;
	kerr e;

	kerr_clear(&e);
	cr_assert_eq(be->host_alloc(len, &p, &e), KHOR_SUCCESS, "host_alloc(%zu): %s", len, e.text);
	return p;
}

static void *stream_new(void)
{
	void *s = NULL;
	kerr e;

	kerr_clear(&e);
	cr_assert_eq(be->stream_create(&s, &e), KHOR_SUCCESS, "stream_create: %s", e.text);
	return s;
}

static void *event_new(void)
{
	void *ev = NULL;
	kerr e;

	kerr_clear(&e);
	cr_assert_eq(be->event_create(&ev, &e), KHOR_SUCCESS, "event_create: %s", e.text);
	return ev;
}

#define OK(expr)                                                                           \
	do {                                                                               \
		kerr e_;                                                                   \
		kerr_clear(&e_);                                                           \
		khor_status st_ = (expr);                                                  \
		cr_assert_eq(st_, KHOR_SUCCESS, "%s: status %d: %s", #expr, st_, e_.text); \
	} while (0)
/* For OK(): the kerr the expression fills. */
#define E (&e_)

static void sync_stream(void *s)
{
	OK(kmem_stream_sync(be, s, kdeadline_in_ms(30000), "test sync", E));
}

static double ms_since(uint64_t t0)
{
	return (double)(kclock_ns() - t0) / 1e6;
}

Test(mem, query_kinds)
{
	kmem_where w;
	char text[128];
	int on_stack = 0;
	void *heap = malloc(64);
	char *dev = dalloc(10000), *zero = dalloc(0);
	char *pin = palloc(100);

	kmem_query(dev, &w);
	cr_assert(w.kind == KMEM_DEVICE && w.be == be && w.device == 0 && w.ctx != NULL,
	          "a device pointer: kind %d device %d", w.kind, w.device);
	void *ctx = w.ctx;
	kmem_query(dev + 5000, &w);
	cr_assert(w.kind == KMEM_DEVICE && w.be == be && w.ctx == ctx, "an offset into it");
	kmem_query(dev + 9999, &w);
	cr_assert(w.kind == KMEM_DEVICE, "its last byte");
	cr_assert(strstr(kmem_describe(&w, text, sizeof(text)), "emulated device") != NULL,
	          "described as %s", text);
	kmem_query(zero, &w);
	cr_assert(w.kind == KMEM_DEVICE, "a 0-byte allocation still owns its address");

	kmem_query(pin, &w);
	cr_assert(w.kind == KMEM_PINNED && w.be == be && w.device == -1, "pinned: kind %d", w.kind);
	kmem_query(pin + 99, &w);
	cr_assert(w.kind == KMEM_PINNED);
	memset(pin, 1, 100); /* the CPU reaches pinned memory */
	cr_assert(strstr(kmem_describe(&w, text, sizeof(text)), "pinned") != NULL);

	kmem_query(heap, &w);
	cr_assert(w.kind == KMEM_HOST && w.be == NULL && w.device == -1 && w.ctx == NULL);
	kmem_query(&on_stack, &w);
	cr_assert(w.kind == KMEM_HOST && w.be == NULL);
	kmem_query(NULL, &w);
	cr_assert(w.kind == KMEM_HOST);
	cr_assert(!be->query(heap, &w), "the backend does not claim host memory");
	cr_assert(be->dmabuf_fd(dev, 10000, &(uint64_t){ 0 }) == -1);

	be->dev_free(dev);
	be->dev_free(zero);
	be->host_free(pin);
	kmem_query(dev, &w);
	cr_assert(w.kind == KMEM_HOST, "freed device memory is no longer claimed");
	kmem_query(pin, &w);
	cr_assert(w.kind == KMEM_HOST, "freed pinned memory is no longer claimed");
	free(heap);
}

/* A child that touches p: how it ended. */
static int touch_in_child(volatile char *p, bool write)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL); /* no sanitizer's or runner's report: just die */
		if (write)
			p[0] = 1;
		else
			(void)p[0];
		_exit(0);
	}
	int status = 0;
	cr_assert(waitpid(pid, &status, 0) == pid);
	return status;
}

Test(mem, cpu_access_to_device_memory_faults)
{
	char *dev = dalloc(1 << 16);

	for (int write = 0; write < 2; write++) {
		for (size_t off = 0; off < (1 << 16); off += 40000) {
			int status = touch_in_child(dev + off, write);
			cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
			          "a CPU %s at offset %zu of device memory must die of SIGSEGV "
			          "(status %#x)", write ? "write" : "read", off, status);
		}
	}
	/* The control: pinned memory does not fault. */
	char *pin = palloc(64);
	int status = touch_in_child(pin, true);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	be->host_free(pin);
	be->dev_free(dev);
}

Test(mem, copies_in_every_direction)
{
	static const size_t sizes[] = { 1, 4095, 4097, (1 << 20) + 3 };
	void *s = stream_new();

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t len = sizes[k];
		uint8_t *src = malloc(len), *out1 = malloc(len), *out2 = malloc(len);
		char *d1 = dalloc(len), *d2 = dalloc(len + 32), *d3 = dalloc(2 * len);
		uint8_t *pin = palloc(len);

		fill(src, len);
		memset(out1, 0, len);
		memset(out2, 0, len);
		/* host -> device -> device (offset) -> pinned -> device -> host, on one stream */
		OK(be->copy(d1, src, len, s, E));
		OK(be->copy(d2 + 32, d1, len, s, E));
		OK(be->copy(pin, d2 + 32, len, s, E));
		OK(be->copy(d3 + len, pin, len, s, E));
		/* within one allocation, then out, on the default stream after a sync */
		sync_stream(s);
		OK(be->copy(d3, d3 + len, len, NULL, E));
		OK(be->copy(out1, d3, len, NULL, E));
		OK(be->copy(out2, src, len, NULL, E)); /* host -> host works too */
		sync_stream(NULL);
		cr_assert(memcmp(out1, src, len) == 0, "len %zu: the chain of copies changed bytes",
		          len);
		cr_assert(memcmp(pin, src, len) == 0, "len %zu: the pinned copy", len);
		cr_assert(memcmp(out2, src, len) == 0, "len %zu: host to host", len);
		/* The tests' blocking helper. */
		memset(out2, 0, len);
		cr_assert_eq(kmem_emu_copy_sync(d1 + len / 3, src, len - len / 3), KHOR_SUCCESS);
		cr_assert_eq(kmem_emu_copy_sync(out2, d1 + len / 3, len - len / 3), KHOR_SUCCESS);
		cr_assert(memcmp(out2, src, len - len / 3) == 0, "len %zu: kmem_emu_copy_sync",
		          len);
		OK(be->copy(d1, src, len, s, E));

		/* memset_zero of the second half */
		OK(be->memset_zero(d1 + len / 2, len - len / 2, s, E));
		OK(be->copy(out1, d1, len, s, E));
		sync_stream(s);
		cr_assert(memcmp(out1, src, len / 2) == 0, "len %zu: memset_zero wrote too early",
		          len);
		for (size_t i = len / 2; i < len; i++)
			cr_assert(out1[i] == 0, "len %zu: memset_zero missed byte %zu", len, i);

		/* Errors: past the end, overlap; dst == src does nothing. */
		kerr e;
		kerr_clear(&e);
		cr_assert_eq(be->copy(out1, d1, len + 1, s, &e), KHOR_ERR_INVALID_ARG);
		cr_assert(strstr(e.text, "past the end") != NULL &&
		              strstr(e.text, "emulated") != NULL,
		          "error text: %s", e.text);
		kerr_clear(&e);
		cr_assert_eq(be->copy(d1 + 1, out1, len, s, &e), KHOR_ERR_INVALID_ARG);
		if (len > 1) {
			kerr_clear(&e);
			cr_assert_eq(be->copy(d2 + 1, d2, len, s, &e), KHOR_ERR_INVALID_ARG);
			cr_assert(strstr(e.text, "overlap") != NULL, "error text: %s", e.text);
		}
		OK(be->copy(d1, d1, len, s, E));
		OK(be->copy(d1, src, 0, s, E));

		be->dev_free(d1);
		be->dev_free(d2);
		be->dev_free(d3);
		be->host_free(pin);
		free(src);
		free(out1);
		free(out2);
	}
	be->stream_destroy(s);
}

/* The pre- and postscale rule of engine/execute.c, on host memory. */
static void scale_ref(void *p, size_t count, khor_dtype dt, double f)
{
	if (f == 1.0)
		return;
	for (size_t i = 0; i < count; i++) {
		switch (dt) {
		case KHOR_FLOAT32: ((float *)p)[i] *= (float)f; break;
		case KHOR_FLOAT64: ((double *)p)[i] *= f; break;
		case KHOR_FLOAT16: {
			uint16_t *v = p;
			v[i] = reduce_f32_to_f16(reduce_f16_to_f32(v[i]) * (float)f);
			break;
		}
		case KHOR_BFLOAT16: {
			uint16_t *v = p;
			v[i] = reduce_f32_to_bf16(reduce_bf16_to_f32(v[i]) * (float)f);
			break;
		}
		default: return;
		}
	}
}

Test(mem, reduce_avg_scale_match_the_cpu_kernels, .timeout = 120)
{
	static const size_t counts[] = { 1, 1003, 65537 };
	void *s = stream_new();
	bool unsupported_seen = false;

	for (size_t d = 0; d < NDTYPES; d++) {
		khor_dtype dt = dtypes[d];
		size_t esz = kdtype_size(dt);
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			size_t n = counts[c], len = n * esz;
			mem_check m;
			OK(mem_check_alloc(&m, be, len, E));
			fill(m.a, len);
			fill(m.b, len);
			for (size_t o = 0; o < NOPS; o++) {
				khor_op op = ops[o];
				if (!reduce_supported(dt, op)) {
					kerr e;
					kerr_clear(&e);
					cr_assert_eq(
					    be->reduce(m.dout, m.da, m.db, n, dt, op, s, &e),
					    KHOR_ERR_NOT_SUPPORTED, "dtype %d op %d", dt, op);
					cr_assert(strstr(e.text, "not supported") != NULL, "%s",
					          e.text);
					unsupported_seen = true;
					continue;
				}
				for (int inplace = 0; inplace < 2; inplace++) {
					OK(mem_check_reduce(&m, s, n, dt, op, inplace, 3, E));
					cr_assert(memcmp(m.got, m.want, len) == 0,
					          "dtype %d op %d n %zu%s: the device result "
					          "differs from the CPU's",
					          dt, op, n, inplace ? " in place" : "");
				}
			}
			static const double factors[] = { 0.5, 3.0, 1.0 / 3.0, 1.0 };
			for (size_t f = 0; f < sizeof(factors) / sizeof(factors[0]); f++) {
				memcpy(m.want, m.a, len);
				scale_ref(m.want, n, dt, factors[f]);
				OK(be->copy(m.da, m.a, len, s, E));
				OK(be->scale(m.da, n, dt, factors[f], s, E));
				OK(be->copy(m.got, m.da, len, s, E));
				sync_stream(s);
				cr_assert(memcmp(m.got, m.want, len) == 0,
				          "dtype %d n %zu: scale by %g differs", dt, n, factors[f]);
			}
			mem_check_free(&m);
		}
	}
	cr_expect(unsupported_seen, "bool has no reductions: expected one refused pair");
	be->stream_destroy(s);
}

Test(mem, stream_order_and_events)
{
	const size_t len = 1 << 16;
	void *s = stream_new(), *ev0 = event_new(), *ev1 = event_new(), *never = event_new();
	uint8_t *x = malloc(len), *out = malloc(len);
	char *d = dalloc(len);
	bool done = true;

	fill(x, len);
	OK(be->event_query(never, &done, E));
	cr_assert(done, "an event never recorded counts as complete");

	uint64_t t0 = kclock_ns();
	OK(be->event_record(ev0, s, E));
	OK(kmem_emu_delay(s, 300000, E));
	OK(be->copy(d, x, len, s, E));
	OK(be->copy(out, d, len, s, E));
	OK(be->event_record(ev1, s, E));
	OK(kmem_event_wait(be, ev0, kdeadline_in_ms(5000), "ev0", E));
	double t_ev0 = ms_since(t0);
	OK(be->event_query(ev1, &done, E));
	double t_q1 = ms_since(t0);
	cr_assert(!done || t_q1 >= 300, "ev1 complete after %.1f ms, before the 300 ms delay ran",
	          t_q1);
	cr_assert(t_ev0 < 300, "the event recorded before the delay completed only after %.1f ms",
	          t_ev0);
	OK(kmem_event_wait(be, ev1, kdeadline_in_ms(10000), "ev1", E));
	cr_assert(ms_since(t0) >= 300, "ev1 completed before the delay had run");
	cr_assert(memcmp(out, x, len) == 0, "the copies after the delay did not run in order");

	/* Many copies into one buffer: the last one enqueued wins. */
	uint8_t *y = malloc(len);
	fill(y, len);
	for (int i = 0; i < 101; i++)
		OK(be->copy(d, i % 2 ? x : y, len, s, E));
	OK(be->copy(out, d, len, s, E));
	sync_stream(s);
	cr_assert(memcmp(out, y, len) == 0, "stream order lost among 101 copies");

	/* An event outlives its stream (destroy drains it first). */
	void *s2 = stream_new();
	OK(kmem_emu_delay(s2, 20000, E));
	OK(be->event_record(ev0, s2, E));
	be->stream_destroy(s2);
	OK(be->event_query(ev0, &done, E));
	cr_assert(done, "an event of a destroyed stream: everything before it ran");

	be->event_destroy(ev0);
	be->event_destroy(ev1);
	be->event_destroy(never);
	be->stream_destroy(s);
	be->dev_free(d);
	free(x);
	free(y);
	free(out);
}

Test(mem, stream_wait_event_orders_two_streams)
{
	const size_t len = 100003;
	void *a = stream_new(), *b = stream_new();
	void *eva = event_new(), *evb = event_new(), *never = event_new();
	uint8_t *x = malloc(len), *out = malloc(len);
	char *d = dalloc(len);
	bool done = true;

	fill(x, len);
	OK(kmem_emu_delay(a, 300000, E));
	OK(be->copy(d, x, len, a, E));
	OK(be->event_record(eva, a, E));
	OK(be->stream_wait_event(b, eva, E));
	OK(be->copy(out, d, len, b, E));
	OK(be->event_record(evb, b, E));
	OK(be->event_query(evb, &done, E));
	cr_assert(!done, "stream b ran past its wait for stream a");
	OK(kmem_event_wait(be, evb, kdeadline_in_ms(10000), "evb", E));
	cr_assert(memcmp(out, x, len) == 0, "b copied before a had written");
	OK(be->event_query(eva, &done, E));
	cr_assert(done);

	/* Waiting for an event never recorded does not block; nor does one on the same stream. */
	uint64_t t0 = kclock_ns();
	OK(be->stream_wait_event(b, never, E));
	OK(be->stream_wait_event(b, evb, E));
	OK(be->event_record(evb, b, E));
	OK(kmem_event_wait(be, evb, kdeadline_in_ms(5000), "evb again", E));
	cr_assert(ms_since(t0) < 2000);

	/* The default stream can wait for another stream too. */
	OK(kmem_emu_delay(a, 100000, E));
	OK(be->memset_zero(d, len, a, E));
	OK(be->event_record(eva, a, E));
	OK(be->stream_wait_event(NULL, eva, E));
	OK(be->copy(out, d, len, NULL, E));
	sync_stream(NULL);
	for (size_t i = 0; i < len; i++)
		cr_assert(out[i] == 0, "the default stream did not wait: byte %zu", i);

	be->event_destroy(eva);
	be->event_destroy(evb);
	be->event_destroy(never);
	be->stream_destroy(a);
	be->stream_destroy(b);
	be->dev_free(d);
	free(x);
	free(out);
}

/* The default stream orders as CUDA's legacy one: after every stream, and they after it. */
Test(mem, default_stream_orders_with_the_others)
{
	const size_t len = 65537;
	void *s = stream_new(), *ev = event_new();
	uint8_t *x = malloc(len), *out = malloc(len);
	char *d = dalloc(len);
	bool done = true;

	fill(x, len);
	/* Work on the default stream first: s's copy waits for it. */
	OK(kmem_emu_delay(NULL, 300000, E));
	OK(be->copy(d, x, len, NULL, E));
	OK(be->copy(out, d, len, s, E));
	OK(be->event_record(ev, s, E));
	OK(be->event_query(ev, &done, E));
	cr_assert(!done, "a stream did not wait for the default stream's earlier work");
	OK(kmem_event_wait(be, ev, kdeadline_in_ms(10000), "after the default stream", E));
	cr_assert(memcmp(out, x, len) == 0, "the copy on s ran before the default stream's");

	/* Work on s first: the default stream's copy waits for it. */
	OK(kmem_emu_delay(s, 300000, E));
	OK(be->memset_zero(d, len, s, E));
	OK(be->copy(out, d, len, NULL, E));
	OK(be->event_record(ev, NULL, E));
	OK(be->event_query(ev, &done, E));
	cr_assert(!done, "the default stream did not wait for another stream's earlier work");
	OK(kmem_event_wait(be, ev, kdeadline_in_ms(10000), "after s", E));
	for (size_t i = 0; i < len; i++)
		cr_assert(out[i] == 0, "the default stream's copy ran before s's memset (byte %zu)",
		          i);

	/* Two other streams do not wait for each other. */
	void *t = stream_new();
	OK(kmem_emu_delay(s, 2000000, E));
	OK(be->event_record(ev, t, E));
	OK(kmem_event_wait(be, ev, kdeadline_in_ms(1000), "t while s sleeps", E));
	be->event_destroy(ev);
	be->stream_destroy(t);
	be->stream_destroy(s);
	be->dev_free(d);
	free(x);
	free(out);
}

Test(mem, host_waits_time_out_with_a_clear_error)
{
	void *s = stream_new(), *ev = event_new();
	kerr e;

	OK(kmem_emu_delay(s, 5000000, E)); /* 5 s */
	OK(be->event_record(ev, s, E));
	uint64_t t0 = kclock_ns();
	kerr_clear(&e);
	cr_assert_eq(kmem_stream_sync(be, s, kdeadline_in_ms(100), "allreduce seq 4", &e),
	             KHOR_ERR_TIMEOUT);
	cr_assert(ms_since(t0) < 2000, "the sync took %.0f ms for a 100 ms deadline", ms_since(t0));
	cr_assert(strstr(e.text, "emulated device stream") != NULL &&
	          strstr(e.text, "allreduce seq 4") != NULL && strstr(e.text, "timed out") != NULL,
	          "error text: %s", e.text);
	kerr_clear(&e);
	cr_assert_eq(kmem_event_wait(be, ev, kdeadline_in_ms(50), "the test event", &e),
	             KHOR_ERR_TIMEOUT);
	cr_assert(strstr(e.text, "the test event") != NULL && strstr(e.text, "timed out") != NULL,
	          "error text: %s", e.text);
	/* Destroying the stream cuts the delay short rather than wait 5 s. */
	t0 = kclock_ns();
	be->stream_destroy(s);
	cr_assert(ms_since(t0) < 2000, "stream_destroy waited %.0f ms", ms_since(t0));
	bool done = false;
	OK(be->event_query(ev, &done, E));
	cr_assert(done);
	be->event_destroy(ev);
}

Test(mem, comm_state_buffers_pool_and_events)
{
	kmem_state st;
	kmem_where w, q;
	char *dev = dalloc(64);
	void *user = stream_new();
	kerr e;

	memset(&st, 0, sizeof(st));
	kmem_query(dev, &w);
	OK(kmem_state_begin(&st, &w, false, NULL, 1 << 16, E));
	cr_assert(st.be == be && st.stream != NULL && st.stream == st.own_stream);
	kmem_query(st.scratch, &q);
	cr_assert(q.kind == KMEM_DEVICE && st.scratch_len >= (1 << 16), "device scratch");

	/* Grow-only device buffers. */
	kerr_clear(&e);
	void *big = kmem_state_buffer(&st, 0, 10000, &e);
	cr_assert(big != NULL, "%s", e.text);
	kmem_query(big, &q);
	cr_assert(q.kind == KMEM_DEVICE);
	cr_assert(kmem_state_buffer(&st, 0, 5000, &e) == big, "a smaller request reuses it");
	void *tmp = kmem_state_buffer(&st, 1, 10000, &e);
	cr_assert(tmp != NULL && tmp != big);
	void *big2 = kmem_state_buffer(&st, 0, 1 << 20, &e);
	cr_assert(big2 != NULL && st.big_len >= (1 << 20));
	kmem_query(big2, &q);
	cr_assert(q.kind == KMEM_DEVICE);

	/* Pinned slots: reused after put, distinct while busy, sized in powers of two. */
	int s0 = -1, s1 = -1, s2 = -1, s3 = -1;
	OK(kmem_pool_get(&st, 1000, &s0, E));
	cr_assert(st.pool[s0].len == 65536 && st.pool[s0].busy);
	kmem_query(st.pool[s0].p, &q);
	cr_assert(q.kind == KMEM_PINNED, "staging slots are pinned");
	memset(st.pool[s0].p, 7, 1000); /* and the CPU reaches them */
	kmem_pool_put(&st, s0);
	OK(kmem_pool_get(&st, 2000, &s1, E));
	cr_assert_eq(s1, s0, "a free slot is reused");
	OK(kmem_pool_get(&st, 1000, &s2, E));
	cr_assert(s2 != s0, "a busy slot is not handed out twice");
	OK(kmem_pool_get(&st, 200000, &s3, E));
	cr_assert(st.pool[s3].len == 262144, "200000 B: a %zu B slot", st.pool[s3].len);
	kmem_pool_put(&st, s2);
	kmem_pool_put(&st, s3);

	/* put_after: s0 comes back only when its event has completed. */
	void *ev = NULL;
	OK(kmem_event_get(&st, &ev, E));
	OK(kmem_emu_delay(st.stream, 300000, E));
	OK(be->copy(dev, st.pool[s0].p, 64, st.stream, E));
	OK(be->event_record(ev, st.stream, E));
	kmem_pool_put_after(&st, s0, ev);
	int nev = st.nevents, x = -1;
	OK(kmem_pool_get(&st, 1000, &x, E));
	cr_assert(x != s0, "slot %d handed out while its copy is still queued", s0);
	kmem_pool_put(&st, x);
	OK(kmem_event_wait(be, ev, kdeadline_in_ms(10000), "put_after", E));
	OK(kmem_pool_get(&st, 1000, &x, E));
	cr_assert_eq(x, s0, "slot %d not given back after its event completed (got %d)", s0, x);
	cr_assert(st.pool[s0].after == NULL && st.nevents == nev + 1,
	          "the event went back to the pool");
	kmem_pool_put(&st, x);

	/* The event pool: put then get returns the same event. */
	void *e1 = NULL, *e2 = NULL;
	OK(kmem_event_get(&st, &e1, E));
	kmem_event_put(&st, e1);
	OK(kmem_event_get(&st, &e2, E));
	cr_assert(e1 == e2, "a put event is reused");
	kmem_event_put(&st, e2);

	/* A call on the caller's stream keeps the comm's own stream for later. */
	void *own = st.own_stream;
	kmem_state_end(&st);
	cr_assert(st.be == NULL && st.stream == NULL);
	OK(kmem_state_begin(&st, &w, true, user, 1 << 18, E));
	cr_assert(st.stream == user && st.own_stream == own && st.scratch_len >= (1 << 18));
	kmem_query(st.scratch, &q);
	cr_assert(q.kind == KMEM_DEVICE, "the grown scratch");
	OK(kmem_state_begin(&st, &w, true, NULL, 1 << 10, E));
	cr_assert(st.stream == NULL, "the default stream when the caller passes NULL");
	kmem_state_end(&st);

	void *scratch = st.scratch, *pin = st.pool[s0].p;
	kmem_state_destroy(&st);
	be->dev_free(dev);
	kmem_query(scratch, &q);
	cr_assert(q.kind == KMEM_HOST, "destroy freed the device scratch");
	kmem_query(pin, &q);
	cr_assert(q.kind == KMEM_HOST, "destroy freed the pinned slots");
	be->stream_destroy(user);
}

/* Each operation sleeps a random 0..N us first; order and results must not change. */
Test(mem, random_delays_keep_stream_order)
{
	const size_t len = 4099;
	uint8_t *x = malloc(len), *y = malloc(len), *out = malloc(len);

	/* Read at the first use of the backend: this test's process has not used it yet. */
	setenv("KHOR_MEM_EMU_DELAY_US", "400", 1);
	void *a = stream_new(), *b = stream_new(), *ev = event_new();
	char *d = dalloc(len), *d2 = dalloc(len);
	fill(x, len);
	fill(y, len);
	uint64_t t0 = kclock_ns();
	for (int i = 0; i < 100; i++) {
		OK(be->copy(d, i % 2 ? x : y, len, a, E));
		OK(be->event_record(ev, a, E));
		OK(be->stream_wait_event(b, ev, E));
		OK(be->copy(d2, d, len, b, E));
		OK(be->copy(out, d2, len, b, E));
		OK(be->event_record(ev, b, E));
		OK(be->stream_wait_event(a, ev, E)); /* a's next copy waits until b has read */
		OK(kmem_event_wait(be, ev, kdeadline_in_ms(10000), "round", E));
		cr_assert(memcmp(out, i % 2 ? x : y, len) == 0, "round %d: stale data", i);
	}
	/* 100 rounds of 7 operations at 200 us on average: well over 50 ms if the knob works. */
	cr_expect(ms_since(t0) > 50, "KHOR_MEM_EMU_DELAY_US=400 had no effect (%.1f ms)",
	          ms_since(t0));
	be->event_destroy(ev);
	be->stream_destroy(a);
	be->stream_destroy(b);
	be->dev_free(d);
	be->dev_free(d2);
	free(x);
	free(y);
	free(out);
}
