/*
 * soak.c -- khor-soak, one rank of a soak (bench/soak.sh starts them under khorrun): for
 * --seconds, two threads of traffic at once, every result checked.
 *   - The collectives thread, on the world comm: allreduce, allgather, broadcast, alltoall,
 *     reduce_scatter and barrier in a sequence every rank draws alike (one seed), of 0 B to
 *     64 MiB (most small, a 64 MiB one now and then); every 50 calls a comm split off the
 *     world, used once and freed.
 *   - The engine thread: batches of 1 to 8 named float32 allreduces of 0 to 4 MiB through
 *     an engine started on the world, waited for together, as a training step's gradients.
 * Values are small integers, so every sum is exact and checked element by element. Each
 * thread decides with the others when to stop (a MAX over "my time is up" every 20 steps),
 * so all ranks end at the same call. Every --every seconds the main thread prints a line:
 *
 *   soak rank R at t S calls C bytes B errors E rss KIB fds F threads T heap KIB kept KIB
 *
 * (heap: malloc'd and not freed; kept: free bytes the allocator holds in its arenas)
 *
 * and at the end "soak rank R done ...". An error ends the rank with exit 1 after printing it.
 */
#include "khor.h"

#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double duration_s = 60, every_s = 10;
static khor_comm *world;
static int me, n;
static atomic_ullong calls, bytes;
static atomic_int errors, threads_done;
static double t0;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *why)
{
	atomic_fetch_add(&errors, 1);
	fprintf(stderr, "soak rank %d: %s failed: %s\n", me, what, why);
	fflush(NULL);
	_exit(1);
}

/* xorshift: the same sequence on every rank. */
static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Elements of the next call: mostly small, now and then 1 MiB, rarely 64 MiB (int32). */
static size_t draw_count(uint64_t *s)
{
	uint64_t r = next(s) % 1000;
	if (r < 20)
		return 0;
	if (r < 600)
		return 1 + next(s) % 64;
	if (r < 950)
		return 1024 + next(s) % 16384;
	if (r < 998)
		return (size_t)1 << 18;
	return (size_t)16 << 20;
}

/* Both threads stop together: true once any rank's time is up (a MAX over the world). */
static bool time_up_world(void)
{
	int32_t up = now() - t0 >= duration_s;
	if (khor_allreduce(world, &up, &up, 1, KHOR_INT32, KHOR_MAX) != KHOR_SUCCESS)
		die("the stop decision", khor_comm_error(world));
	return up != 0;
}

static int32_t val(int rank, uint64_t i, size_t k)
{
	return (int32_t)((rank + 1) * 3 + (int)(i % 7) + (int)(k % 13));
}

/* The sum over every rank of val(rank, i, k): what a sum of the element k gives. */
static int32_t val_sum(uint64_t i, size_t k)
{
	int32_t want = 0;

	for (int r = 0; r < n; r++)
		want += val(r, i, k);
	return want;
}

static void check(bool ok, const char *what, uint64_t i)
{
	if (!ok) {
		char why[64];
		snprintf(why, sizeof(why), "a wrong result at call %llu", (unsigned long long)i);
		die(what, why);
	}
}

static void *collectives(void *arg)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	const size_t cap = ((size_t)16 << 20) + (size_t)n + 64; /* blk * n <= count + n */
	int32_t *a = malloc(cap * sizeof(int32_t)), *b = malloc(cap * sizeof(int32_t));

	(void)arg;
	if (a == NULL || b == NULL)
		die("the collectives' buffers", "out of memory");
	/* Touched now, so that the RSS samples measure khor, not which buffer a call used first. */
	memset(a, 0, cap * sizeof(int32_t));
	memset(b, 0, cap * sizeof(int32_t));
	for (uint64_t i = 0;; i++) {
		if (i % 20 == 0 && time_up_world())
			break;
		/* The first six calls: each operation at the largest size, so that what grows
		 * with a call's size (the collectives' scratch, tcp's read-aside) has grown before
		 * the warm-up ends; a first 64 MiB call of some operation minutes in once read
		 * as RSS growth (+16% in a 5-minute run). */
		int op = i < 6 ? (int)i : (int)(next(&seed) % 6);
		size_t c = i < 6 ? (size_t)16 << 20 : draw_count(&seed), blk = c / (size_t)n + 1;
		khor_status st = KHOR_SUCCESS;
		const char *what = "";
		switch (op) {
		case 0: /* allreduce */
			what = "allreduce";
			for (size_t k = 0; k < c; k++)
				a[k] = val(me, i, k);
			st = khor_allreduce(world, a, b, c, KHOR_INT32, KHOR_SUM);
			for (size_t k = 0; st == KHOR_SUCCESS && k < c; k++)
				check(b[k] == val_sum(i, k), what, i);
			bytes += c * 4;
			break;
		case 1: /* allgather of blk each */
			what = "allgather";
			for (size_t k = 0; k < blk; k++)
				a[k] = val(me, i, k);
			st = khor_allgather(world, a, b, blk, KHOR_INT32);
			for (int r = 0; st == KHOR_SUCCESS && r < n; r++)
				for (size_t k = 0; k < blk; k++)
					check(b[(size_t)r * blk + k] == val(r, i, k), what, i);
			bytes += blk * 4 * (size_t)n;
			break;
		case 2: /* broadcast from a rank that moves */
			what = "broadcast";
			for (size_t k = 0; k < c; k++)
				a[k] = me == (int)(i % (uint64_t)n) ? val(me, i, k) : -1;
			st = khor_broadcast(world, a, c, KHOR_INT32, (int)(i % (uint64_t)n));
			for (size_t k = 0; st == KHOR_SUCCESS && k < c; k++)
				check(a[k] == val((int)(i % (uint64_t)n), i, k), what, i);
			bytes += c * 4;
			break;
		case 3: /* alltoall: block j to rank j */
			what = "alltoall";
			for (int j = 0; j < n; j++)
				for (size_t k = 0; k < blk; k++)
					a[(size_t)j * blk + k] = val(me, i, k) * 31 + j;
			st = khor_alltoall(world, a, b, blk, KHOR_INT32);
			for (int r = 0; st == KHOR_SUCCESS && r < n; r++)
				for (size_t k = 0; k < blk; k++)
					check(b[(size_t)r * blk + k] == val(r, i, k) * 31 + me, what, i);
			bytes += blk * 4 * (size_t)n;
			break;
		case 4: { /* reduce_scatter of blk * n: block me of the sum */
			what = "reduce_scatter";
			size_t total = blk * (size_t)n;
			for (size_t k = 0; k < total; k++)
				a[k] = val(me, i, k);
			st = khor_reduce_scatter(world, a, b, total, KHOR_INT32, KHOR_SUM);
			for (size_t k = 0; st == KHOR_SUCCESS && k < blk; k++)
				check(b[k] == val_sum(i, (size_t)me * blk + k), what, i);
			bytes += total * 4;
			break;
		}
		default:
			what = "barrier";
			st = khor_barrier(world);
			break;
		}
		if (st != KHOR_SUCCESS)
			die(what, khor_comm_error(world));
		calls++;
		if (i % 50 == 49) { /* a comm made and freed */
			khor_comm *half;
			int32_t v = me, sum = 0, want = 0;
			if (khor_comm_split(world, me % 2, me, &half) != KHOR_SUCCESS)
				die("comm_split", khor_comm_error(world));
			if (khor_allreduce(half, &v, &sum, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS)
				die("allreduce on a split comm", khor_comm_error(half));
			for (int r = me % 2; r < n; r += 2)
				want += r;
			check(sum == want, "allreduce on a split comm", i);
			if (khor_comm_free(half) != KHOR_SUCCESS)
				die("comm_free", khor_comm_error(world));
			calls += 3;
		}
	}
	free(a);
	free(b);
	atomic_fetch_add(&threads_done, 1);
	return NULL;
}

static void *engine_traffic(void *arg)
{
	khor_engine *e = arg;
	uint64_t seed = 0x243f6a8885a308d3ull;
	enum { BATCH = 8 };
	const size_t cap = (size_t)1 << 20;
	float *in[BATCH], *out[BATCH];
	khor_handle *h[BATCH];

	for (int t = 0; t < BATCH; t++) {
		in[t] = malloc(cap * sizeof(float));
		out[t] = malloc(cap * sizeof(float));
		if (in[t] == NULL || out[t] == NULL)
			die("the engine's buffers", "out of memory");
		memset(in[t], 0, cap * sizeof(float));
		memset(out[t], 0, cap * sizeof(float));
	}
	for (uint64_t j = 0;; j++) {
		if (j % 20 == 0) { /* the stop decision, through the engine */
			float up = now() - t0 >= duration_s, all = 0;
			khor_handle *d;
			int64_t one = 1;
			if (khor_enqueue_allreduce(e, 0, "soak/stop", &up, &all, KHOR_FLOAT32, 1, &one,
			                           KHOR_MAX, 1.0, 1.0, &d) != KHOR_SUCCESS ||
			    khor_handle_wait(d) != KHOR_SUCCESS)
				die("the engine's stop decision", khor_engine_error(e));
			khor_handle_free(d);
			if (all > 0)
				break;
		}
		/* The first batch: every tensor at its largest (the fusion buffer at its
		 * largest, as above for the collectives). */
		int nt = j == 0 ? BATCH : 1 + (int)(next(&seed) % BATCH);
		size_t cnt[BATCH];
		for (int t = 0; t < nt; t++) {
			char name[48];
			uint64_t r = next(&seed) % 100;
			cnt[t] = j == 0 ? cap : r < 5 ? 0 : r < 80 ? 1 + next(&seed) % 4096
			                                          : 1 + next(&seed) % cap;
			for (size_t k = 0; k < cnt[t]; k++)
				in[t][k] = (float)val(me, j, k);
			int64_t dim = (int64_t)cnt[t];
			snprintf(name, sizeof(name), "soak/grad%d", t);
			if (khor_enqueue_allreduce(e, 0, name, in[t], out[t], KHOR_FLOAT32, 1, &dim,
			                           KHOR_SUM, 1.0, 1.0, &h[t]) != KHOR_SUCCESS)
				die("enqueue_allreduce", khor_engine_error(e));
		}
		for (int t = 0; t < nt; t++) {
			if (khor_handle_wait(h[t]) != KHOR_SUCCESS)
				die("an engine allreduce", khor_handle_error(h[t]));
			khor_handle_free(h[t]);
			for (size_t k = 0; k < cnt[t]; k++)
				check(out[t][k] == (float)val_sum(j, k), "an engine allreduce", j);
			bytes += cnt[t] * 4;
			calls++;
		}
	}
	for (int t = 0; t < BATCH; t++) {
		free(in[t]);
		free(out[t]);
	}
	atomic_fetch_add(&threads_done, 1);
	return NULL;
}

/* VmRSS (KiB) and Threads from /proc/self/status; open fds from /proc/self/fd. */
static void sample(long *rss_kib, int *fds, int *threads)
{
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");
	DIR *d = opendir("/proc/self/fd");

	*rss_kib = -1;
	*threads = -1;
	*fds = -1;
	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		sscanf(line, "VmRSS: %ld", rss_kib);
		sscanf(line, "Threads: %d", threads);
	}
	if (f != NULL)
		fclose(f);
	if (d != NULL) {
		*fds = -1; /* the directory's own */
		while (readdir(d) != NULL)
			(*fds)++;
		*fds -= 2; /* . and .. */
		closedir(d);
	}
}

static void report(const char *what)
{
	long rss;
	int fds, thr;

	sample(&rss, &fds, &thr);
	/* The heap in use (malloc'd and not freed), beside RSS, which also holds what the
	 * allocator keeps after a free (kept: the free bytes inside its arenas, some of them
	 * resident). */
	struct mallinfo2 mi = mallinfo2();
	printf("soak rank %d %s t %.0f calls %llu bytes %llu errors %d rss %ld fds %d threads %d "
	       "heap %zu kept %zu\n", me, what, now() - t0, (unsigned long long)calls,
	       (unsigned long long)bytes, atomic_load(&errors), rss, fds, thr,
	       (mi.uordblks + mi.hblkhd) >> 10, mi.fordblks >> 10);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char err[1024];
	khor_engine *eng;
	pthread_t ta, tb;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			duration_s = atof(argv[++i]);
		else if (strcmp(argv[i], "--every") == 0 && i + 1 < argc)
			every_s = atof(argv[++i]);
		else {
			fprintf(stderr, "usage: khor-soak [--seconds S (60)] [--every S (10)]\n");
			return 2;
		}
	}
	if (khor_init(NULL, err, sizeof(err), &world) != KHOR_SUCCESS) {
		fprintf(stderr, "soak: khor_init failed: %s\n", err);
		return 1;
	}
	me = khor_rank(world);
	n = khor_size(world);
	if (khor_engine_start(world, NULL, &eng) != KHOR_SUCCESS) {
		fprintf(stderr, "soak rank %d: engine_start failed: %s\n", me, khor_comm_error(world));
		return 1;
	}
	t0 = now();
	if (pthread_create(&ta, NULL, collectives, NULL) != 0 ||
	    pthread_create(&tb, NULL, engine_traffic, eng) != 0) {
		fprintf(stderr, "soak rank %d: pthread_create failed\n", me);
		return 1;
	}
	report("start");
	/* Until both threads are done: a line every --every seconds. */
	double next_at = t0 + every_s;
	void *unused;
	for (;;) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		if (atomic_load(&threads_done) == 2)
			break;
		if (now() >= next_at) {
			report("at");
			next_at += every_s;
		}
		if (now() - t0 > duration_s + 600) {
			fprintf(stderr, "soak rank %d: the threads did not stop 600 s past the end\n", me);
			return 1;
		}
	}
	pthread_join(ta, &unused);
	pthread_join(tb, &unused);
	if (khor_engine_stop(eng) != KHOR_SUCCESS)
		die("engine_stop", khor_comm_error(world));
	report("done");
	khor_finalize(world);
	return 0;
}
