/*
 * shm_pingpong.c -- how fast the shm transport moves one message between two processes of
 * this host, next to what a plain memcpy of the same size does in one process.
 *
 *     shm-pingpong [max_bytes [cma|ring|both|tcp|ib]]     (default: 64 MiB, both)
 *
 * tcp and ib run the same ping-pong over that transport instead (ib: on the device
 * KHOR_IB_HCA names, the bootstrap on KHOR_SOCKET_IFNAME), to separate a transport's own
 * latency from what the collectives add on top (PERFORMANCE section 12).
 * Rank 0 sends, rank 1 sends the same bytes back; one-way time is half the fastest round
 * trip, and bandwidth is size / one-way time. Each size runs twice: with KHOR_SHM_CMA=1
 * (messages over 16 MiB read by the receiver with process_vm_readv, one copy) and with the
 * default (every message through the ring, two copies). Both processes spin on
 * progress(timeout 0), as the runtime does before it sleeps, so on a machine with fewer
 * free cores than two the numbers mostly measure the scheduler; the fastest round trip of
 * many is the one that was not interrupted.
 * This is a measurement, not a test: it asserts nothing about speed.
 */
#include "transport/ib/ib.h"
#include "transport/shm/shm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A link's error, copied out (link_error gives it by copy, since another thread may be
 * setting it). */
static const kerr *lerr(const struct transport_ops *tp, tp_link *l)
{
	static kerr e;

	kerr_clear(&e);
	tp->link_error(l, &e);
	return &e;
}

static const struct transport_ops *tp = &shm_transport_ops;

static const size_t sizes[] = { 8, 64, 512, 4096, 32768, 65536, 262144, 1u << 20, 4u << 20,
                                16u << 20, 64u << 20 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

struct shared {
	volatile int ready;
	char addr[TP_ADDR_MAX];
	double one_way_s[64];
};

static void die(const char *what, const kerr *e)
{
	fprintf(stderr, "shm-pingpong: %s: %s\n", what, e ? e->text : "");
	_exit(1);
}

static void wait_req(tp_ctx *c, tp_req *r)
{
	kdeadline dl = kdeadline_in_ms(60000);
	kerr e;

	for (;;) {
		bool done = false;
		khor_status st = tp->test(r, &done, &e);
		if (done) {
			if (st != KHOR_SUCCESS)
				die("transfer", &e);
			return;
		}
		if (kdeadline_passed(dl))
			die("transfer did not finish within 60 s", NULL);
		tp->progress(c, 0, NULL, &e);
	}
}

static int iters_for(size_t len)
{
	size_t n = (1u << 30) / (len ? len : 1);
	return n < 30 ? 30 : n > 5000 ? 5000 : (int)n;
}

static void rank_main(int rank, struct shared *sh, size_t max)
{
	tp_options o = { .rank = rank, .size = 2, .job_id = "shm-pingpong", .secret = "bench",
	                 .handshake_timeout_ms = 10000, .nsocks = 1,
	                 .ifname_spec = getenv("KHOR_SOCKET_IFNAME") };
	tp_ctx *c;
	tp_link *l = NULL;
	kerr e;
	uint8_t *buf = malloc(max ? max : 1);
	int k = 0;

	memset(buf, rank + 1, max);
	if (tp->create(&o, &c, &e) != KHOR_SUCCESS)
		die("create", &e);
	if (rank == 1) {
		kstrlcpy(sh->addr, tp->address(c), sizeof(sh->addr));
		__atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
		while (l == NULL) {
			tp->progress(c, 10, NULL, &e);
			tp->accept(c, 0, &l, &e);
		}
	} else {
		while (!__atomic_load_n(&sh->ready, __ATOMIC_ACQUIRE))
			usleep(1000);
		if (tp->connect(c, 1, sh->addr, &l, &e) != KHOR_SUCCESS)
			die("connect", &e);
		while (!tp->link_ready(l)) {
			if (lerr(tp, l)->status != KHOR_SUCCESS)
				die("connect", lerr(tp, l));
			tp->progress(c, 10, NULL, &e);
		}
	}
	for (; k < (int)NSIZES && sizes[k] <= max; k++) {
		size_t len = sizes[k];
		int n = iters_for(len);
		double best = 1e30;
		/* The fastest round trip of many: on a shared machine any slower one lost its core
		 * to another process and measures the scheduler, not the transport. */
		for (int i = -2; i < n; i++) { /* two rounds of warm-up */
			tp_tag t = { 1, (uint32_t)(k * 1000000 + i + 2), 0, 0 };
			tp_req *s, *r;
			uint64_t t0 = kclock_ns();
			if (rank == 0) {
				if (tp->isend(l, buf, len, t, NULL, &s, &e) != KHOR_SUCCESS)
					die("isend", &e);
				wait_req(c, s);
				t.step = 1;
				if (tp->irecv(l, buf, len, t, NULL, &r, &e) != KHOR_SUCCESS)
					die("irecv", &e);
				wait_req(c, r);
			} else {
				if (tp->irecv(l, buf, len, t, NULL, &r, &e) != KHOR_SUCCESS)
					die("irecv", &e);
				wait_req(c, r);
				t.step = 1;
				if (tp->isend(l, buf, len, t, NULL, &s, &e) != KHOR_SUCCESS)
					die("isend", &e);
				wait_req(c, s);
			}
			double one_way = (double)(kclock_ns() - t0) / 1e9 / 2;
			if (i >= 0 && one_way < best)
				best = one_way;
		}
		if (rank == 0)
			sh->one_way_s[k] = best;
	}
	/* Let the last echo drain before either side closes. */
	for (int i = 0; i < 20; i++)
		tp->progress(c, 1, NULL, &e);
	tp->destroy(c);
	free(buf);
	_exit(0);
}

static bool run(size_t max, bool cma, double *one_way)
{
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
	                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pids[2];
	bool ok = true;

	memset(sh, 0, sizeof(*sh));
	setenv("KHOR_SHM_CMA", cma ? "1" : "0", 1);
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		if (pids[r] == 0)
			rank_main(r, sh, max);
	}
	for (int r = 0; r < 2; r++) {
		int ws;
		waitpid(pids[r], &ws, 0);
		ok &= WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
	}
	memcpy(one_way, sh->one_way_s, sizeof(sh->one_way_s));
	munmap(sh, sizeof(*sh));
	return ok;
}

static double memcpy_gbs(size_t len)
{
	/* b is 64 bytes past a page boundary from a, so stores do not alias loads (4K aliasing). */
	uint8_t *a = malloc(len + 4096), *b0 = malloc(len + 4096), *b = b0 + 64;
	int n = iters_for(len);
	double s = 1e30;

	memset(a, 1, len);
	memset(b, 2, len);
	for (int i = 0; i < n; i++) {
		uint64_t t0 = kclock_ns();
		memcpy(b, a, len);
		__asm__ volatile("" : : "r"(b) : "memory");
		double t = (double)(kclock_ns() - t0) / 1e9;
		s = t < s ? t : s;
	}
	free(a);
	free(b0);
	return (double)len / s / 1e9;
}

int main(int argc, char **argv)
{
	size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
	const char *mode = argc > 2 ? argv[2] : "both";
	if (strcmp(mode, "tcp") == 0 || strcmp(mode, "ib") == 0) {
		double one[64] = { 0 };
		tp = transport_find(mode);
		if (tp == NULL) {
			fprintf(stderr, "shm-pingpong: transport %s is not built in\n", mode);
			return 1;
		}
		if (!run(max, false, one)) {
			fprintf(stderr, "shm-pingpong: a rank failed\n");
			return 1;
		}
		printf("%10s %12s %9s   (%s)\n", "bytes", "one-way", "GB/s", mode);
		for (size_t k = 0; k < NSIZES && sizes[k] <= max; k++)
			printf("%10zu %10.2fus %9.3f\n", sizes[k], one[k] * 1e6,
			       one[k] > 0 ? (double)sizes[k] / one[k] / 1e9 : 0);
		return 0;
	}
	bool do_cma = strcmp(mode, "ring") != 0, do_ring = strcmp(mode, "cma") != 0;
	double cma[64] = { 0 }, ring[64] = { 0 };

	if ((do_cma && !run(max, true, cma)) || (do_ring && !run(max, false, ring))) {
		fprintf(stderr, "shm-pingpong: a rank failed\n");
		return 1;
	}
	printf("%10s %12s %9s %12s %9s %12s\n", "bytes", "cma one-way", "cma GB/s", "ring one-way",
	       "ring GB/s", "memcpy GB/s");
	for (size_t k = 0; k < NSIZES && sizes[k] <= max; k++) {
		size_t len = sizes[k];
		printf("%10zu %10.2fus %9.2f %10.2fus %9.2f %12.2f\n", len, cma[k] * 1e6,
		       cma[k] > 0 ? (double)len / cma[k] / 1e9 : 0, ring[k] * 1e6,
		       ring[k] > 0 ? (double)len / ring[k] / 1e9 : 0, memcpy_gbs(len));
	}
	return 0;
}
