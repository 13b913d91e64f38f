/*
 * test_allreduce.c -- multi-rank allreduce, broadcast and barrier over real TCP links.
 *
 * Every dtype (f16, bf16, f32, f64, i8, u8, i16, i32, i64) x op x edge count (0, 1, n-1, n, n+1, primes, counts n does not divide), in
 * place and out of place, n = 1..8, for the ring and recursive doubling; tiny slices and
 * several sockets per link so pipelining and striping run on small buffers too. Inputs
 * are small integers so every result is exact and compared element by element with a
 * reference computed in double; outputs are poisoned first so an unwritten element fails.
 */
#include "tests/harness.h"
#include "collectives/reduce.h"
#include "collectives/select.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const khor_dtype dtypes[] = { KHOR_FLOAT32, KHOR_FLOAT64, KHOR_INT32, KHOR_INT64,
                                     KHOR_FLOAT16, KHOR_BFLOAT16, KHOR_INT8, KHOR_UINT8,
                                     KHOR_INT16 };
static const khor_op ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX, KHOR_PROD };

/*
 * Input element i of rank r: small integers, so every partial result is exact in every dtype
 * (sums of 8 stay within int8 and uint8; products stay within 2^8 in general and within 4
 * for the 8-bit types).
 */
static double input_of(int r, size_t i, khor_op op, khor_dtype dt)
{
	bool narrow = dt == KHOR_INT8 || dt == KHOR_UINT8;
	if (op == KHOR_PROD && narrow)
		return (r < 2 && (r + i) % 3 == 0) ? 2 : (dt == KHOR_INT8 && (r + i) % 2 ? -1 : 1);
	if (op == KHOR_PROD)
		return (double)((int)((r * 7 + i * 3) % 3) - 1 == 0 ? 2 : (int)((r * 7 + i * 3) % 3) - 1);
	if (dt == KHOR_UINT8)
		return (double)((r * 131 + i * 7) % 23);
	return (double)((long)((r * 131 + i * 7) % 23) - 11);
}

static double expect_of(int n, size_t i, khor_op op, khor_dtype dt)
{
	double acc = input_of(0, i, op, dt);
	for (int r = 1; r < n; r++) {
		double x = input_of(r, i, op, dt);
		switch (op) {
		case KHOR_SUM: case KHOR_AVG: acc += x; break;
		case KHOR_MIN: acc = x < acc ? x : acc; break;
		case KHOR_MAX: acc = x > acc ? x : acc; break;
		case KHOR_PROD: acc *= x; break;
		}
	}
	if (op == KHOR_AVG) {
		if (dt == KHOR_INT32 || dt == KHOR_INT64 || dt == KHOR_INT8 || dt == KHOR_UINT8 ||
		    dt == KHOR_INT16)
			acc = trunc(acc / n);
		else if (dt == KHOR_FLOAT32)
			acc = (double)((float)acc / (float)n);
		else if (dt == KHOR_FLOAT16) /* widened, divided in float, rounded once */
			acc = reduce_f16_to_f32(reduce_f32_to_f16((float)acc / (float)n));
		else if (dt == KHOR_BFLOAT16)
			acc = reduce_bf16_to_f32(reduce_f32_to_bf16((float)acc / (float)n));
		else
			acc = acc / n;
	}
	return acc;
}

static void put(void *buf, khor_dtype dt, size_t i, double v)
{
	switch (dt) {
	case KHOR_FLOAT32: ((float *)buf)[i] = (float)v; break;
	case KHOR_FLOAT64: ((double *)buf)[i] = v; break;
	case KHOR_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case KHOR_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
	case KHOR_FLOAT16: ((uint16_t *)buf)[i] = reduce_f32_to_f16((float)v); break;
	case KHOR_BFLOAT16: ((uint16_t *)buf)[i] = reduce_f32_to_bf16((float)v); break;
	case KHOR_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case KHOR_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case KHOR_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
	default: break;
	}
}

static double get(const void *buf, khor_dtype dt, size_t i)
{
	switch (dt) {
	case KHOR_FLOAT32: return ((const float *)buf)[i];
	case KHOR_FLOAT64: return ((const double *)buf)[i];
	case KHOR_INT32: return ((const int32_t *)buf)[i];
	case KHOR_INT64: return (double)((const int64_t *)buf)[i];
	case KHOR_FLOAT16: return reduce_f16_to_f32(((const uint16_t *)buf)[i]);
	case KHOR_BFLOAT16: return reduce_bf16_to_f32(((const uint16_t *)buf)[i]);
	case KHOR_INT8: return ((const int8_t *)buf)[i];
	case KHOR_UINT8: return ((const uint8_t *)buf)[i];
	case KHOR_INT16: return ((const int16_t *)buf)[i];
	default: return NAN;
	}
}

struct job {
	const char *algo;
	const char *slice;
	const char *nsocks;
	const char *transport;
};

static int body_all(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	char err[1024];
	khor_comm *comm;
	size_t counts[] = { 0, 1, (size_t)(n > 1 ? n - 1 : 2), (size_t)n, (size_t)n + 1, 13, 97,
	                    1031, 4099, 20011 };
	/* 20011 elements: recursive doubling moves rounds above 32 KiB in pieces, both it and
	 * halving-doubling read a separate input in place of copying it first; the ring with
	 * its tiny test slices would only repeat what smaller counts do. */
	size_t ncounts = sizeof(counts) / sizeof(counts[0]);
	if (strcmp(j->algo, "rd") != 0 && strcmp(j->algo, "hd") != 0)
		ncounts--;

	khor_config_set(cfg, "KHOR_ALGO", j->algo);
	khor_config_set(cfg, "KHOR_TRANSPORT", j->transport);
	khor_config_set(cfg, "KHOR_SLICE_BYTES", j->slice);
	khor_config_set(cfg, "KHOR_PIPELINE_DEPTH", "3");
	khor_config_set(cfg, "KHOR_SOCKET_NSOCKS", j->nsocks);
	khor_config_set(cfg, "KHOR_MIN_STRIPE", "64");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err);
		return 10;
	}
	if (khor_rank(comm) != rank || khor_size(comm) != n)
		return 11;
	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
		khor_dtype dt = dtypes[d];
		size_t esz = khor_dtype_size(dt);
		for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
			for (size_t c = 0; c < ncounts; c++) {
				size_t count = counts[c];
				for (int inplace = 0; inplace < 2; inplace++) {
					uint8_t *in = malloc(count * esz + 1), *out = malloc(count * esz + 1);
					for (size_t i = 0; i < count; i++)
						put(in, dt, i, input_of(rank, i, ops[o], dt));
					memset(out, 0xff, count * esz + 1);
					if (inplace)
						memcpy(out, in, count * esz);
					khor_status st = khor_allreduce(comm, inplace ? out : in, out, count,
					                                dt, ops[o]);
					if (st != KHOR_SUCCESS) {
						fprintf(stderr, "rank %d: allreduce dt %d op %d count %zu: %s\n",
						        rank, dt, ops[o], count, khor_comm_error(comm));
						return 12;
					}
					for (size_t i = 0; i < count; i++) {
						double want = expect_of(n, i, ops[o], dt), got = get(out, dt, i);
						if (got != want) {
							fprintf(stderr, "rank %d: dt %d op %d count %zu inplace %d "
							        "[%zu] = %g, want %g (algo %s)\n", rank, dt, ops[o],
							        count, inplace, i, got, want, j->algo);
							return 13;
						}
					}
					if (out[count * esz] != 0xff)
						return 14; /* wrote past the end */
					free(in);
					free(out);
				}
			}
		}
	}
	/* broadcast from every root, a few sizes */
	for (int root = 0; root < n; root++) {
		for (size_t count = 0; count < 5000; count = count * 3 + 7) {
			int32_t *b = malloc(count * 4 + 4);
			for (size_t i = 0; i < count; i++)
				b[i] = rank == root ? (int32_t)(i * 31 + (size_t)root) : -1;
			if (khor_broadcast(comm, b, count, KHOR_INT32, root) != KHOR_SUCCESS) {
				fprintf(stderr, "rank %d: broadcast: %s\n", rank, khor_comm_error(comm));
				return 15;
			}
			for (size_t i = 0; i < count; i++)
				if (b[i] != (int32_t)(i * 31 + (size_t)root))
					return 16;
			free(b);
		}
	}
	if (khor_barrier(comm) != KHOR_SUCCESS)
		return 17;
	khor_finalize(comm);
	return 0;
}

static void run_all(int n, struct job *j)
{
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 120 };
	harness_result res;
	bool ok = harness_run(&o, body_all, j, &res);
	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "n=%d algo=%s slice=%s rank %d exited %d", n, j->algo,
		             j->slice, r, res.status[r]);
	cr_assert(ok && !res.timed_out, "n=%d algo=%s failed", n, j->algo);
}

#define N_TEST(N)                                                          \
	Test(allreduce, ring_n##N, .timeout = 180)                         \
	{                                                                  \
		struct job j = { "ring", "256", "3", "tcp" };                     \
		run_all(N, &j);                                            \
	}                                                                  \
	Test(allreduce, rd_n##N, .timeout = 180)                           \
	{                                                                  \
		struct job j = { "rd", "64K", "1", "shm" };                       \
		run_all(N, &j);                                            \
	}                                                                  \
	Test(allreduce, tree_n##N, .timeout = 180)                         \
	{                                                                  \
		struct job j = { "tree", "512", "2", "tcp" };                     \
		run_all(N, &j);                                            \
	}                                                                  \
	Test(allreduce, hd_n##N, .timeout = 180)                           \
	{                                                                  \
		struct job j = { "hd", "1K", "2", "auto" };                        \
		run_all(N, &j);                                            \
	}

N_TEST(1)
N_TEST(2)
N_TEST(3)
N_TEST(4)
N_TEST(5)
N_TEST(6)
N_TEST(7)
N_TEST(8)

/* The ring over shared memory too, with small slices so the rings wrap many times. */
Test(allreduce, ring_shm_n4, .timeout = 180)
{
	struct job j = { "ring", "1K", "1", "shm" };
	run_all(4, &j);
}

/*
 * Random floats: every rank must hold the same bits, and a second run the same again, for
 * each algorithm. (auto picks by a model measured at init, so two runs may pick differently
 * near a crossover: reproducible bits need KHOR_ALGO, or KHOR_COST_* to pin the model.)
 */
struct bits_job {
	const char *algo;
	uint64_t *hashes; /* [size index * 16 + rank] */
};

static int body_bits(int rank, int n, khor_config *cfg, void *arg)
{
	const struct bits_job *j = arg;
	char err[1024];
	khor_comm *comm;
	static const size_t counts[] = { 1000, 100003 };
	float *buf = malloc(100003 * sizeof(float)), *out = malloc(100003 * sizeof(float));

	khor_config_set(cfg, "KHOR_SLICE_BYTES", "4K");
	khor_config_set(cfg, "KHOR_ALGO", j->algo);
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	srand(1234u + (unsigned)rank);
	for (size_t i = 0; i < 100003; i++)
		buf[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
	for (size_t c = 0; c < 2; c++) {
		if (khor_allreduce(comm, buf, out, counts[c], KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
			return 11;
		j->hashes[c * 16 + (size_t)rank] = harness_hash(out, counts[c] * sizeof(float));
	}
	khor_finalize(comm);
	free(buf);
	free(out);
	return 0;
}

Test(allreduce, identical_bits_across_ranks_and_runs, .timeout = 180)
{
	static const char *const algos[] = { "ring", "tree", "rd", "hd" };
	for (int n = 3; n <= 7; n += 4) {
		for (size_t a = 0; a < 4; a++) {
			struct bits_job j1 = { algos[a], harness_shared(4096) };
			struct bits_job j2 = { algos[a], harness_shared(4096) };
			harness_opts o = { .n = n, .deadline_s = 60 };
			harness_result res;
			cr_assert(harness_run(&o, body_bits, &j1, &res));
			cr_assert(harness_run(&o, body_bits, &j2, &res));
			for (int c = 0; c < 2; c++) {
				for (int r = 0; r < n; r++) {
					cr_expect_eq(j1.hashes[c * 16 + r], j1.hashes[c * 16], "n=%d %s: rank %d "
					             "differs from rank 0", n, algos[a], r);
					cr_expect_eq(j1.hashes[c * 16 + r], j2.hashes[c * 16 + r], "n=%d %s: rank "
					             "%d differs between runs", n, algos[a], r);
				}
			}
			harness_shared_free(j1.hashes, 4096);
			harness_shared_free(j2.hashes, 4096);
		}
	}
}

/*
 * Auto's timed trials run inside the first call of a size on buffers of their own, so every
 * call of that size, the first included, runs the one schedule they chose: the same input
 * gives the same bits in every call, and on every rank. (Trials in the user's own calls
 * would have run several schedules over the first calls, each with its own bits.) The
 * model is given so that trials surely run: at 64 KiB on 4 and 7 ranks it predicts
 * halving-doubling and the ring within 1.5x of each other.
 */
static int body_trial_bits(int rank, int n, khor_config *cfg, void *arg)
{
	uint64_t *hashes = arg; /* [call * 16 + rank] */
	char err[1024];
	khor_comm *comm;
	enum { COUNT = 16384, CALLS = 4 };
	float *buf = malloc(COUNT * sizeof(float)), *out = malloc(COUNT * sizeof(float));

	(void)n;
	khor_config_set(cfg, "KHOR_ALGO", "auto");
	khor_config_set(cfg, "KHOR_COST_ALPHA_US", "10");
	khor_config_set(cfg, "KHOR_COST_BETA_GBPS", "2");
	khor_config_set(cfg, "KHOR_COST_GAMMA_GBPS", "10");
	khor_config_set(cfg, "KHOR_AUTO_TRIALS", "2");
	/*
	 * Half the ranks think they share one CPU, half that they have 64: how far the trials
	 * reach (3x or 1.5x the best prediction: with the tree or without, here) must still be
	 * one answer for all, or their trial calls would not meet.
	 */
	khor_config_set(cfg, "KHOR_LOCAL_CPUS", rank % 2 ? "1" : "64");
	if (buf == NULL || out == NULL || khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	srand(99u + (unsigned)rank);
	for (size_t i = 0; i < COUNT; i++)
		buf[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
	for (int c = 0; c < CALLS; c++) {
		memset(out, 0xff, COUNT * sizeof(float));
		if (khor_allreduce(comm, buf, out, COUNT, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
			return 11;
		hashes[c * 16 + rank] = harness_hash(out, COUNT * sizeof(float));
	}
	khor_finalize(comm);
	free(buf);
	free(out);
	return 0;
}

Test(allreduce, auto_trials_never_change_a_result_within_a_run, .timeout = 120)
{
	for (int n = 4; n <= 7; n += 3) {
		uint64_t *h = harness_shared(4096);
		harness_opts o = { .n = n, .deadline_s = 60 };
		harness_result res;
		cr_assert(harness_run(&o, body_trial_bits, h, &res));
		for (int c = 0; c < 4; c++)
			for (int r = 0; r < n; r++)
				cr_expect_eq(h[c * 16 + r], h[0], "n=%d: call %d on rank %d differs from call "
				             "0 on rank 0", n, c, r);
		harness_shared_free(h, 4096);
	}
}

/* Non-blocking calls complete in order, mixed with blocking ones. */
static int body_nonblocking(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024];
	khor_comm *comm;
	enum { K = 8, C = 5000 };
	static int32_t bufs[K][C];
	khor_request *req[K];

	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	for (int k = 0; k < K; k++) {
		for (int i = 0; i < C; i++)
			bufs[k][i] = rank + k + i;
		if (khor_iallreduce(comm, bufs[k], bufs[k], C, KHOR_INT32, KHOR_SUM, &req[k]) !=
		    KHOR_SUCCESS)
			return 11;
	}
	int32_t one = 1;
	if (khor_allreduce(comm, &one, &one, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS || one != n)
		return 12;
	for (int k = K - 1; k >= 0; k--) {
		if (khor_wait(req[k]) != KHOR_SUCCESS)
			return 13;
		if (khor_test(req[k]) != KHOR_SUCCESS)
			return 14;
		khor_request_free(req[k]);
		for (int i = 0; i < C; i++)
			if (bufs[k][i] != n * (k + i) + n * (n - 1) / 2)
				return 15;
	}
	khor_finalize(comm);
	return 0;
}

/* Runs body on n ranks; every rank must exit 0 before the deadline. */
static void expect_every_rank_ok(int n, harness_body body, void *arg, const char *what)
{
	harness_opts o = { .n = n, .deadline_s = 45 };
	harness_result res;

	harness_run(&o, body, arg, &res);
	cr_expect(!res.timed_out, "%s: timed out", what);
	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "%s: rank %d exited %d", what, r, res.status[r]);
}

Test(allreduce, nonblocking_in_order, .timeout = 60)
{
	expect_every_rank_ok(4, body_nonblocking, NULL, "non-blocking");
}

/* Ranks that disagree on count or dtype get an error, not a hang or an overrun. */
static int body_mismatch(int rank, int n, khor_config *cfg, void *arg)
{
	int kind = *(int *)arg;
	char err[1024];
	khor_comm *comm;
	float buf[64] = { 0 };

	khor_config_set(cfg, "KHOR_TIMEOUT", "20s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	size_t count = kind == 0 && rank == 1 ? 40 : 32;
	khor_dtype dt = kind == 1 && rank == 1 ? KHOR_INT32 : KHOR_FLOAT32;
	khor_status st = khor_allreduce(comm, buf, buf, count, dt, KHOR_SUM);
	if (st == KHOR_SUCCESS)
		return 20; /* must not succeed */
	if (st == KHOR_ERR_TIMEOUT)
		return 21; /* must be detected, not waited out */
	fprintf(stderr, "rank %d saw: %s\n", rank, khor_comm_error(comm));
	khor_finalize(comm);
	return 0;
}

Test(allreduce, count_or_dtype_mismatch_is_an_error, .timeout = 100)
{
	for (int kind = 0; kind < 2; kind++)
		expect_every_rank_ok(3, body_mismatch, &kind, kind == 0 ? "count" : "dtype");
}

/*
 * khor_comm_set switches the algorithm between calls on a running comm. A non-blocking call
 * still queued keeps the algorithm it was made with: were the switch applied when the queue
 * runs it, ranks whose queues drain at different moments would run different schedules for
 * one call, which the frame headers report as an error.
 */
static int body_comm_set(int rank, int n, khor_config *cfg, void *arg)
{
	static const char *const algos[] = { "ring", "tree", "rd", "hd", "auto" };
	enum { C = 3001, K = 5 };
	static int32_t a[K][C], b[C];
	char err[1024];
	khor_comm *comm;
	khor_request *req[K];

	(void)arg;
	khor_config_set(cfg, "KHOR_TIMEOUT", "20s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	for (int round = 0; round < 3; round++) {
		for (int k = 0; k < K; k++) {
			if (khor_comm_set(comm, "KHOR_ALGO", algos[k]) != KHOR_SUCCESS)
				return 11;
			for (int i = 0; i < C; i++)
				a[k][i] = rank * 7 + k + i;
			if (khor_iallreduce(comm, a[k], a[k], C, KHOR_INT32, KHOR_SUM, &req[k]))
				return 12;
		}
		/* a blocking call with yet another setting, behind the queued ones */
		if (khor_comm_set(comm, "KHOR_ALGO", algos[round]) != KHOR_SUCCESS)
			return 13;
		for (int i = 0; i < C; i++)
			b[i] = rank - i;
		if (khor_allreduce(comm, b, b, C, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS) {
			fprintf(stderr, "rank %d: %s\n", rank, khor_comm_error(comm));
			return 14;
		}
		for (int i = 0; i < C; i++)
			if (b[i] != n * (n - 1) / 2 - n * i)
				return 15;
		for (int k = 0; k < K; k++) {
			if (khor_wait(req[k]) != KHOR_SUCCESS)
				return 16;
			khor_request_free(req[k]);
			for (int i = 0; i < C; i++)
				if (a[k][i] != 7 * n * (n - 1) / 2 + n * (k + i))
					return 17;
		}
	}
	/* Refused: a key that cannot change after init, a bad value, NULLs. */
	if (khor_comm_set(comm, "KHOR_TIMEOUT", "5s") != KHOR_ERR_INVALID_ARG ||
	    strstr(khor_comm_error(comm), "KHOR_TIMEOUT") == NULL)
		return 18;
	if (khor_comm_set(comm, "KHOR_ALGO", "fastest") != KHOR_ERR_INVALID_ARG ||
	    strstr(khor_comm_error(comm), "fastest") == NULL)
		return 19;
	if (khor_comm_set(comm, "KHOR_HIER", "maybe") != KHOR_ERR_INVALID_ARG ||
	    khor_comm_set(comm, NULL, "on") != KHOR_ERR_INVALID_ARG ||
	    khor_comm_set(NULL, "KHOR_ALGO", "ring") != KHOR_ERR_INVALID_ARG)
		return 20;
	/* A refused setting changed nothing and the comm still works. */
	int32_t one = 1;
	if (khor_allreduce(comm, &one, &one, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS || one != n)
		return 21;
	khor_finalize(comm);
	return 0;
}

Test(allreduce, comm_set_switches_algorithm_between_calls, .timeout = 60)
{
	expect_every_rank_ok(4, body_comm_set, NULL, "khor_comm_set");
}

/* Ranks that run different algorithms for one call get an error naming both, not a hang. */
static int body_algo_mismatch(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024];
	khor_comm *comm;
	static float buf[100000];

	(void)n;
	(void)arg;
	khor_config_set(cfg, "KHOR_TIMEOUT", "20s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err);
		return 10;
	}
	if (khor_comm_set(comm, "KHOR_ALGO", rank == 0 ? "ring" : "tree") != KHOR_SUCCESS)
		return 11;
	khor_status st = khor_allreduce(comm, buf, buf, 100000, KHOR_FLOAT32, KHOR_SUM);
	if (st == KHOR_SUCCESS)
		return 20;
	if (st == KHOR_ERR_TIMEOUT)
		return 21;
	const char *e = khor_comm_error(comm);
	fprintf(stderr, "rank %d saw: %s\n", rank, e);
	if (strstr(e, "ring") == NULL || strstr(e, "double binary tree") == NULL)
		return 22;
	khor_finalize(comm);
	return 0;
}

Test(allreduce, different_algorithms_on_ranks_is_an_error, .timeout = 60)
{
	expect_every_rank_ok(4, body_algo_mismatch, NULL, "ring against tree");
}

/* KHOR_ALGO set on one rank only is refused at init, by name, on every rank. */
static int body_algo_env(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024] = "";
	khor_comm *comm;

	(void)n;
	(void)arg;
	if (rank == 2)
		khor_config_set(cfg, "KHOR_ALGO", "tree");
	khor_status st = khor_init(cfg, err, sizeof(err), &comm);
	if (st == KHOR_SUCCESS)
		return 20;
	/* Rank 2 finds it, or a rank comparing the settings finds it itself; a rank that
	 * learns of rank 2's failure first carries it as the job's abort. */
	bool own = st == KHOR_ERR_INVALID_ARG,
	     told = st == KHOR_ERR_REMOTE && strstr(err, "aborted by another rank") != NULL;
	if (!(own || told) || strstr(err, "KHOR_ALGO") == NULL) {
		fprintf(stderr, "rank %d: status %d: %s\n", rank, (int)st, err);
		return 21;
	}
	return 0;
}

Test(allreduce, algo_setting_must_agree_at_init, .timeout = 60)
{
	expect_every_rank_ok(3, body_algo_env, NULL, "KHOR_ALGO on one rank");
}

/*
 * The cost model alone, with fixed numbers: at 2 ranks the ring and halving-doubling move
 * the same bytes, so what separates them is the ring's slices (a message each) and
 * halving-doubling's whole halves outgrowing the cache before they are folded.
 */
Test(cost_model, ring_slices_and_cache_spills_separate_ring_and_hd)
{
	cost_model m = { .alpha = 10e-6, .beta = 1 / 2e9, .gamma = 1 / 10e9,
	                 .ring_slice = 512 << 10, .cache = 16 << 20 };
	const size_t MiB = 1 << 20;

	/* One slice per chunk: the same messages and bytes, a tie, and ties go to the ring. */
	cr_expect_float_eq(cost_allreduce(&m, ALGO_RING, 2, MiB, 0),
	                   cost_allreduce(&m, ALGO_HD, 2, MiB, 0), 1e-12);
	cr_expect_eq(cost_pick_allreduce(&m, 2, MiB, 128 << 10, NULL), ALGO_RING);
	/* 4 MiB: eight ring messages against two; the 2 MiB halves (6 MiB folded) still fit. */
	cr_expect_eq(cost_pick_allreduce(&m, 2, 4 * MiB, 128 << 10, NULL), ALGO_HD);
	cr_expect_float_eq(cost_allreduce(&m, ALGO_RING, 2, 4 * MiB, 0) -
	                       cost_allreduce(&m, ALGO_HD, 2, 4 * MiB, 0),
	                   6 * m.alpha, 1e-9);
	/* 16 MiB: halves of 8 MiB need 24 MiB cached: out to memory and back, 2 x 8 MiB x gamma. */
	cost_model nocache = m;
	nocache.cache = 0;
	cr_expect_float_eq(cost_allreduce(&m, ALGO_HD, 2, 16 * MiB, 0) -
	                       cost_allreduce(&nocache, ALGO_HD, 2, 16 * MiB, 0),
	                   2 * 8 * MiB * m.gamma, 1e-9);
	cr_expect_float_eq(cost_allreduce(&m, ALGO_HD, 2, 4 * MiB, 0),
	                   cost_allreduce(&nocache, ALGO_HD, 2, 4 * MiB, 0), 1e-12);
	cr_expect_eq(cost_pick_allreduce(&m, 2, 64 * MiB, 128 << 10, NULL), ALGO_RING);
	/* Without a cache to count on (ranks outnumber cores) the ring's 128 messages lose. */
	cr_expect_eq(cost_pick_allreduce(&nocache, 2, 64 * MiB, 128 << 10, NULL), ALGO_HD);
	/* The pipelined schedules never spill. */
	cr_expect_float_eq(cost_allreduce(&m, ALGO_TREE, 8, 64 * MiB, 128 << 10),
	                   cost_allreduce(&nocache, ALGO_TREE, 8, 64 * MiB, 128 << 10), 1e-12);
}

/*
 * The model the namespace cluster measures at init (8 hosts on 2 cores: alpha 11 us, the
 * tbf's 23.9 MB/s, reduce 7 GB/s, no cache to count on): it puts halving-doubling a hair
 * under the ring from 512 KiB to 256 MiB, where hd measured 1.1-3x slower; near-ties go to
 * the ring. A clear hd win (fewer messages at 4 MiB on 2 fast ranks, as above) is untouched.
 */
Test(cost_model, near_ties_with_halving_doubling_go_to_the_ring)
{
	cost_model m = { .alpha = 11e-6, .beta = 1 / 23.9e6, .gamma = 1 / 7e9,
	                 .ring_slice = 512 << 10, .cache = 0 };
	const size_t MiB = 1 << 20;

	for (size_t S = MiB / 2; S <= 256 * MiB; S *= 4) {
		double ring = cost_allreduce(&m, ALGO_RING, 8, S, 128 << 10);
		double hd = cost_allreduce(&m, ALGO_HD, 8, S, 128 << 10);
		cr_expect(hd < ring && ring < hd * 1.02, "%zu KiB: hd %g s, ring %g s: not a near-tie",
		          S >> 10, hd, ring);
		double t;
		cr_expect_eq(cost_pick_allreduce(&m, 8, S, 128 << 10, &t), ALGO_RING, "%zu KiB", S >> 10);
		cr_expect_float_eq(t, ring, 1e-12, "the time returned is the pick's");
	}
	cost_model fast = { .alpha = 10e-6, .beta = 1 / 2e9, .gamma = 1 / 10e9,
	                    .ring_slice = 512 << 10, .cache = 16 << 20 };
	cr_expect_eq(cost_pick_allreduce(&fast, 2, 4 * MiB, 128 << 10, NULL), ALGO_HD);
}

/* A batch of swaps half of which caught both ranks on one core: its median is not alpha. */
Test(cost_model, reduce_scatter_halves_only_powers_of_two_within_a_slice)
{
	cost_model m = { .alpha = 10e-6, .beta = 1 / 2e9, .gamma = 1 / 10e9,
	                 .ring_slice = 512 << 10, .cache = 0 };
	const size_t KiB = 1 << 10, slice = 512 << 10;

	/* log2(n) messages against n-1, the same bytes: halving at 4 and 8 ranks. */
	cr_expect_float_eq(cost_reduce_scatter(&m, RS_RING, 8, 64 * KiB) -
	                       cost_reduce_scatter(&m, RS_HALVING, 8, 64 * KiB),
	                   4 * m.alpha, 1e-12);
	cr_expect_eq(cost_pick_reduce_scatter(&m, 4, 64 * KiB, slice), RS_HALVING);
	cr_expect_eq(cost_pick_reduce_scatter(&m, 8, 1024 * KiB, slice), RS_HALVING);
	/* Not a power of two: never halving; small, recursive doubling and a copy wins. */
	cr_expect_eq(cost_pick_reduce_scatter(&m, 6, 64, slice), RS_RD);
	cr_expect_eq(cost_pick_reduce_scatter(&m, 6, 1024 * KiB, slice), RS_RING);
	/* A first half larger than a ring slice goes to the ring's overlapping slices. */
	cr_expect_eq(cost_pick_reduce_scatter(&m, 4, 2048 * KiB, slice), RS_RING);
}

/*
 * Auto's trials with made-up timings: every round runs each candidate once, neither the block
 * that a preemption stretched 5x nor the first call of each block counts, and the tree, predicted 1.9x slower than
 * halving-doubling but measured at a third of its prediction, is chosen.
 */
Test(cost_model, trials_time_close_schedules_and_pick_by_measurement)
{
	cost_model m = { .alpha = 16e-6, .beta = 1.8e-9, .gamma = 2.7e-10,
	                 .ring_slice = 512 << 10, .cache = 0 };
	const size_t bytes = 64 << 10, slice = 32 << 10;
	const unsigned rounds = 3;
	trial_slot t;

	trial_begin(&t, &m, 8, bytes, slice, 3.0, rounds);
	cr_assert_eq(t.state, TRIAL_RUNNING);
	cr_assert_eq(t.cand[0], cost_pick_allreduce(&m, 8, bytes, slice, NULL), "model's pick first");
	double best = cost_allreduce(&m, t.cand[0], 8, bytes, slice);
	bool has_tree = false;
	for (int i = 0; i < t.ncand; i++) {
		double p = cost_allreduce(&m, t.cand[i], 8, bytes, slice);
		cr_expect_leq(p, 3.0 * best, "%d is no candidate", t.cand[i]);
		cr_expect(i == 0 || p >= cost_allreduce(&m, t.cand[i - 1], 8, bytes, slice));
		has_tree = has_tree || t.cand[i] == ALGO_TREE;
	}
	cr_assert(has_tree && t.ncand >= 2);
	cr_expect_geq(t.block * best, TRIAL_BLOCK_S * 0.999, "a block lasts TRIAL_BLOCK_S");

	unsigned calls = 0, seen[5][TRIAL_MAX_ROUNDS] = { { 0 } };
	for (;;) {
		int a = trial_algo(&t);
		unsigned round = calls / t.block / (unsigned)t.ncand;
		double pred = cost_allreduce(&m, a, 8, bytes, slice);
		double f = a == ALGO_TREE ? 0.35 : 1.0;
		if (round == 1 && a == t.cand[0])
			f *= 5; /* one preempted block */
		if (calls % t.block == 0)
			f *= 10; /* a block's first call, right after another schedule: not counted */
		seen[a][round]++;
		calls++;
		if (trial_record(&t, pred * f, pred))
			break;
		cr_assert_lt(calls, 10000u);
	}
	cr_expect_eq(calls, rounds * t.block * (unsigned)t.ncand);
	for (int i = 0; i < t.ncand; i++)
		for (unsigned k = 0; k < rounds; k++)
			cr_expect_eq(seen[t.cand[i]][k], t.block, "candidate %d, round %u", t.cand[i], k);
	for (int i = 0; i < t.ncand; i++)
		cr_expect_float_eq(t.factor[i], t.cand[i] == ALGO_TREE ? 0.35 : 1.0, 1e-9);
	t.state = TRIAL_DONE;
	cr_expect_eq(trial_pick(&t, &m, 8, bytes, slice), ALGO_TREE);
	cr_expect_eq(trial_pick(&t, &m, 8, bytes + 1000, slice), ALGO_TREE, "same size bucket");

	/* Nothing close to the model's pick, no rounds, or calls too long for a block: the model. */
	trial_begin(&t, &m, 8, bytes, slice, 1.0, rounds);
	cr_expect_eq(t.state, TRIAL_MODEL);
	trial_begin(&t, &m, 8, bytes, slice, 3.0, 0);
	cr_expect_eq(t.state, TRIAL_MODEL);
	trial_begin(&t, &m, 8, (size_t)256 << 20, slice, 3.0, rounds);
	cr_expect_eq(t.state, TRIAL_MODEL, "no block of 4 calls of 256 MiB fits TRIAL_BLOCK_S");
}

Test(cost_model, batch_alpha_ignores_a_transient_shared_core)
{
	uint64_t t[30];

	for (int i = 0; i < 30; i++) /* 12 fast swaps of 9-10 us, then 18 of 75-80 us */
		t[i] = i < 12 ? 9000 + (uint64_t)i * 100 : 75000 + (uint64_t)(i - 12) * 250;
	cr_expect_eq(cost_batch_alpha(t, 30, true), 9300 * 3 / 2, "capped at 1.5x the 10th percentile");
	cr_expect_eq(cost_batch_alpha(t, 30, false), t[15], "ranks outnumber cores: the median");
	for (int i = 0; i < 30; i++) /* a plain batch: median 1.2x the 10th percentile */
		t[i] = 12000 + (uint64_t)i * 200;
	cr_expect_eq(cost_batch_alpha(t, 30, true), t[15]);
}
