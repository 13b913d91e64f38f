/*
 * test_limits.c -- init and calls under the process's resource limits. Each rank lowers
 * its own limit (setrlimit: what `ulimit` does for a shell's children), calls khor_init and
 * expects an error that names the limit and what to change, with nothing left behind (the
 * same open fds as before the call); then it puts the limit back and the job runs. Over
 * tcp and over shm, 4 ranks: the open-file limit just above what the process has open; the
 * address-space limit just above what it has mapped (less than a thread's stack). (A full /dev/shm does not matter to khor: its shared memory is memfd, which
 * has no name there.)
 */
#include "tests/harness.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define TEXT 1024


struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	char first[HARNESS_MAX_RANKS][TEXT]; /* the refused init's message */
};

static const char *transport;

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

/* After the refused init: the limit back, and a normal job on the same config. */
static int then_runs(struct shared *sh, int rank, int n, khor_config *cfg)
{
	char err[TEXT];
	khor_comm *world;
	float v = (float)(rank + 1), sum = 0;

	if (khor_init(cfg, err, sizeof(err), &world) != KHOR_SUCCESS)
		return fail(sh, rank, 20, "init with the limit put back: %s", err);
	if (khor_allreduce(world, &v, &sum, 1, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
		return fail(sh, rank, 21, "allreduce: %s", khor_comm_error(world));
	khor_finalize(world);
	if (sum != (float)(n * (n + 1) / 2))
		return fail(sh, rank, 22, "sum %g", (double)sum);
	return 0;
}

/* After the refused init (err): keeps its message, checks that it left no fd open, then
 * runs the job with the limit put back. */
static int refused(struct shared *sh, int rank, int n, khor_config *cfg, const char *err,
                   int fds_before)
{
	snprintf(sh->first[rank], TEXT, "%s", err);
	int after = harness_count_fds();
	if (after != fds_before)
		return fail(sh, rank, 12, "%d fds open before the refused init and %d after",
		            fds_before, after);
	return then_runs(sh, rank, n, cfg);
}

static int body_nofile(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	struct rlimit old, low;
	char err[TEXT];
	khor_comm *world = NULL;

	khor_config_set(cfg, "KHOR_TRANSPORT", transport);
	khor_config_set(cfg, "KHOR_TIMEOUT", "5s");
	getrlimit(RLIMIT_NOFILE, &old);
	int before = harness_count_fds();
	/* Room for the store's connection and one more, not for the links. */
	low = old;
	low.rlim_cur = (rlim_t)before + 2;
	if (setrlimit(RLIMIT_NOFILE, &low) != 0)
		return fail(sh, rank, 10, "setrlimit");
	khor_status st = khor_init(cfg, err, sizeof(err), &world);
	setrlimit(RLIMIT_NOFILE, &old);
	if (st == KHOR_SUCCESS) {
		/* The links come with the first call here, then. */
		float v = 1;
		st = khor_allreduce(world, &v, &v, 1, KHOR_FLOAT32, KHOR_SUM);
		snprintf(err, sizeof(err), "%s", khor_comm_error(world));
		khor_finalize(world);
		if (st == KHOR_SUCCESS)
			return fail(sh, rank, 11, "init and a call worked under ulimit -n %d",
			            before + 2);
	}
	return refused(sh, rank, n, cfg, err, before);
}

static int body_as(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	struct rlimit old, low;
	char err[TEXT];
	khor_comm *world = NULL;
	long long vm = 0;

	khor_config_set(cfg, "KHOR_TRANSPORT", transport);
	khor_config_set(cfg, "KHOR_TIMEOUT", "5s");
	/* 4 MiB to spare: less than one thread's stack. */
	FILE *f = fopen("/proc/self/statm", "r");
	if (f == NULL || fscanf(f, "%lld", &vm) != 1)
		return fail(sh, rank, 10, "statm");
	fclose(f);
	int before = harness_count_fds();
	getrlimit(RLIMIT_AS, &old);
	low = old;
	low.rlim_cur = (rlim_t)vm * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)4 << 20);
	if (setrlimit(RLIMIT_AS, &low) != 0)
		return fail(sh, rank, 10, "setrlimit");
	khor_status st = khor_init(cfg, err, sizeof(err), &world);
	setrlimit(RLIMIT_AS, &old);
	if (st == KHOR_SUCCESS) {
		khor_finalize(world);
		return fail(sh, rank, 11, "init worked with 4 MiB of address space to spare");
	}
	return refused(sh, rank, n, cfg, err, before);
}

static void run(harness_body body, const char *tp, const char *want)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 4, .timeout = "5s", .deadline_s = 60 };
	harness_result res;

	transport = tp;
	harness_run(&o, body, sh, &res);
	cr_assert(!res.timed_out, "%s: the job hung", tp);
	for (int r = 0; r < 4; r++) {
		fprintf(stderr, "%s: rank %d refused: %s\n", tp, r, sh->first[r]);
		cr_expect_eq(res.status[r], 0, "%s: rank %d exited %d: %s", tp, r, res.status[r],
		             sh->err[r]);
	}
	/* Every rank hit the limit itself, so every one names it. */
	for (int r = 0; r < 4; r++)
		cr_expect(strstr(sh->first[r], want) != NULL, "%s: rank %d's error does not name "
		          "'%s': %s", tp, r, want, sh->first[r]);
	harness_shared_free(sh, sizeof(*sh));
}

Test(limits, open_file_limit_is_named_and_nothing_leaks_tcp, .timeout = 90)
{
	run(body_nofile, "tcp", "(ulimit -n); raise it");
}

Test(limits, open_file_limit_is_named_and_nothing_leaks_shm, .timeout = 90)
{
	run(body_nofile, "shm", "(ulimit -n); raise it");
}

/* AddressSanitizer maps its shadow and allocator regions as it goes: under an address-space
 * limit it cannot run at all (a CI run of this hung in ASan's own allocator). */
static void as_run(const char *tp)
{
#ifdef UNDER_ASAN
	(void)tp;
	(void)body_as;
	cr_skip_test("under AddressSanitizer, whose shadow memory needs the address space the test "
	             "takes away");
#else
	run(body_as, tp, "(ulimit -v); raise it");
#endif
}

Test(limits, address_space_limit_is_named_tcp, .timeout = 90)
{
	as_run("tcp");
}

Test(limits, address_space_limit_is_named_shm, .timeout = 90)
{
	as_run("shm");
}
