/*
 * test_hier.c -- node-aware collectives on pretend hosts (KHOR_HOSTNAME) over real links:
 * hierarchical allreduce and broadcast against exact references and against the flat
 * schedules (allgather too), uniform layouts (2x2, 2x3, 3x2, 2x4, 4x2) and a non-uniform one, which must
 * fall back to flat and still be right.
 */
#include "tests/harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct layout {
	int n;
	int per_host[8]; /* ranks on host 0, 1, ... (0-terminated) */
	const char *hier;
};

static int host_of(const struct layout *l, int rank)
{
	int h = 0, acc = 0;
	while (l->per_host[h] && rank >= acc + l->per_host[h])
		acc += l->per_host[h++];
	return h;
}

static double input(int r, size_t i)
{
	return (double)((long)((r * 37 + i * 11) % 19) - 9);
}

static int body(int rank, int n, khor_config *cfg, void *arg)
{
	const struct layout *l = arg;
	char err[1024], host[32];
	khor_comm *comm;
	size_t counts[] = { 0, 1, 3, 17, 1000, 100003 };
	static const khor_op ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX };

	snprintf(host, sizeof(host), "pretend-%d", host_of(l, rank));
	khor_config_set(cfg, "KHOR_HOSTNAME", host);
	khor_config_set(cfg, "KHOR_HIER", l->hier);
	khor_config_set(cfg, "KHOR_SLICE_BYTES", "2K");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return 10;
	}
	int hosts = 0;
	while (l->per_host[hosts])
		hosts++;
	if (khor_local_size(comm) != l->per_host[host_of(l, rank)] || khor_cross_size(comm) != hosts) {
		fprintf(stderr, "rank %d: local size %d cross size %d\n", rank,
		        khor_local_size(comm), khor_cross_size(comm));
		return 11;
	}
	for (size_t o = 0; o < 4; o++) {
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			size_t count = counts[c];
			for (int inplace = 0; inplace < 2; inplace++) {
				double *in = malloc(count * 8 + 8), *out = malloc(count * 8 + 8);
				for (size_t i = 0; i < count; i++)
					in[i] = input(rank, i);
				memset(out, 0xff, count * 8 + 8);
				if (inplace)
					memcpy(out, in, count * 8);
				if (khor_allreduce(comm, inplace ? out : in, out, count, KHOR_FLOAT64,
				                   ops[o]) != KHOR_SUCCESS) {
					fprintf(stderr, "rank %d: %s\n", rank, khor_comm_error(comm));
					return 12;
				}
				for (size_t i = 0; i < count; i++) {
					double want = input(0, i);
					for (int r = 1; r < n; r++) {
						double x = input(r, i);
						want = ops[o] == KHOR_MIN ? fmin(want, x)
						       : ops[o] == KHOR_MAX ? fmax(want, x) : want + x;
					}
					if (ops[o] == KHOR_AVG)
						want /= n;
					if (out[i] != want) {
						fprintf(stderr, "rank %d op %d count %zu [%zu]: %g want %g\n", rank,
						        ops[o], count, i, out[i], want);
						return 13;
					}
				}
				free(in);
				free(out);
			}
		}
	}
	/* allgather: node-aware when ranks are numbered host by host (every layout here is) */
	for (size_t count = 0; count < 3000; count = count * 5 + 3) {
		int64_t *mine = malloc(count * 8 + 8), *all = malloc(count * 8 * (size_t)n + 8);
		for (size_t i = 0; i < count; i++)
			mine[i] = (int64_t)(rank * 100000 + (int)i);
		memset(all, 0xff, count * 8 * (size_t)n + 8);
		if (khor_allgather(comm, mine, all, count, KHOR_INT64) != KHOR_SUCCESS) {
			fprintf(stderr, "rank %d: allgather: %s\n", rank, khor_comm_error(comm));
			return 16;
		}
		for (int r = 0; r < n; r++)
			for (size_t i = 0; i < count; i++)
				if (all[(size_t)r * count + i] != (int64_t)(r * 100000 + (int)i))
					return 17;
		free(mine);
		free(all);
	}
	for (int root = 0; root < n; root++) {
		int32_t b[3001];
		for (int i = 0; i < 3001; i++)
			b[i] = rank == root ? i * 7 + root : -5;
		if (khor_broadcast(comm, b, 3001, KHOR_INT32, root) != KHOR_SUCCESS)
			return 14;
		for (int i = 0; i < 3001; i++)
			if (b[i] != i * 7 + root)
				return 15;
	}
	khor_finalize(comm);
	return 0;
}

static void run(struct layout *l)
{
	harness_opts o = { .n = l->n, .deadline_s = 120 };
	harness_result res;
	bool ok = harness_run(&o, body, l, &res);
	for (int r = 0; r < l->n; r++)
		cr_expect_eq(res.status[r], 0, "n=%d hier=%s: rank %d exited %d", l->n, l->hier, r,
		             res.status[r]);
	cr_assert(ok && !res.timed_out);
}

Test(hier, two_hosts_of_two, .timeout = 150) { run(&(struct layout){ 4, { 2, 2 }, "on" }); }
Test(hier, two_hosts_of_three, .timeout = 150) { run(&(struct layout){ 6, { 3, 3 }, "on" }); }
Test(hier, three_hosts_of_two, .timeout = 150) { run(&(struct layout){ 6, { 2, 2, 2 }, "on" }); }
Test(hier, two_hosts_of_four, .timeout = 150) { run(&(struct layout){ 8, { 4, 4 }, "on" }); }
Test(hier, four_hosts_of_two, .timeout = 150) { run(&(struct layout){ 8, { 2, 2, 2, 2 }, "on" }); }
Test(hier, auto_choice, .timeout = 150) { run(&(struct layout){ 4, { 2, 2 }, "auto" }); }
Test(hier, uneven_hosts_fall_back_to_flat, .timeout = 150)
{
	run(&(struct layout){ 5, { 3, 2 }, "on" });
}
