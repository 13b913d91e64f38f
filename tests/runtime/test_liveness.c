/*
 * test_liveness.c -- KHOR_TIMEOUT is a liveness rule, not a deadline: real jobs of this
 * binary's own ranks (started with LIVENESS_MODE set, a rank runs before Criterion's main
 * and exits), under khorrun ($KHORRUN) and without it, KHOR_TIMEOUT 1 s and
 * KHOR_HEARTBEAT_TIMEOUT 2 s:
 *   - a rank that sleeps 3 s before an allreduce, and again before an engine allreduce, is
 *     waited for: the job succeeds, and the others warned that it is alive;
 *   - a rank stopped with SIGSTOP in the middle of allreduces is killed by khorrun, which
 *     names it, the others fail naming it, and nothing of the job is left;
 *   - without khorrun (rank 0 serves the store), the waiting ranks fail naming the stopped
 *     rank as not alive.
 */
#include <criterion/criterion.h>

#include "khor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOW_RANK 1
#define STOP_RANK 2

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int rank_fail(khor_comm *c, const char *what, const char *err)
{
	printf("failed: %s: %s\n", what, err);
	fflush(stdout);
	if (c != NULL)
		khor_finalize(c);
	return 3;
}

/* An allreduce of (rank + 1) whose sum is checked: 3 on a failure, 4 on a wrong sum. */
static int sum_check(khor_comm *c, int n)
{
	float v[64], want = (float)(n * (n + 1) / 2);

	for (int i = 0; i < 64; i++)
		v[i] = (float)(khor_rank(c) + 1);
	if (khor_allreduce(c, v, v, 64, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
		return rank_fail(c, "allreduce", khor_comm_error(c));
	for (int i = 0; i < 64; i++) {
		if (v[i] != want) {
			printf("failed: allreduce: [%d] = %g, want %g\n", i, (double)v[i], (double)want);
			return 4;
		}
	}
	return 0;
}

/* The same through the engine, named tensor "slow". */
static int engine_check(khor_comm *c, int n)
{
	khor_engine *e;
	khor_handle *h;
	float v[16], out[16], want = (float)(n * (n + 1) / 2);
	int64_t dims[1] = { 16 };

	if (khor_engine_start(c, NULL, &e) != KHOR_SUCCESS)
		return rank_fail(c, "engine start", khor_comm_error(c));
	if (khor_rank(c) == SLOW_RANK)
		sleep(3);
	for (int i = 0; i < 16; i++)
		v[i] = (float)(khor_rank(c) + 1);
	if (khor_enqueue_allreduce(e, 0, "slow", v, out, KHOR_FLOAT32, 1, dims, KHOR_SUM, 1.0, 1.0,
	                           &h) != KHOR_SUCCESS)
		return rank_fail(c, "enqueue", khor_engine_error(e));
	if (khor_handle_wait(h) != KHOR_SUCCESS)
		return rank_fail(c, "engine allreduce", khor_handle_error(h));
	khor_handle_free(h);
	if (khor_engine_stop(e) != KHOR_SUCCESS)
		return rank_fail(c, "engine stop", "");
	for (int i = 0; i < 16; i++)
		if (out[i] != want)
			return rank_fail(c, "engine allreduce", "wrong sum");
	return 0;
}

static int rank_main(const char *mode)
{
	char err[1024];
	khor_comm *c;
	int rc;

	printf("pid=%d\n", (int)getpid());
	fflush(stdout);
	if (khor_init(NULL, err, sizeof(err), &c) != KHOR_SUCCESS)
		return rank_fail(NULL, "init", err);
	int n = khor_size(c), me = khor_rank(c);
	if ((rc = sum_check(c, n)) != 0)
		return rc;
	if (strcmp(mode, "slow") == 0) {
		if (me == SLOW_RANK)
			sleep(3); /* three times KHOR_TIMEOUT */
		if ((rc = sum_check(c, n)) != 0 || (rc = engine_check(c, n)) != 0)
			return rc;
		printf("ok\n");
		khor_finalize(c);
		return 0;
	}
	/* "stop": allreduces until one fails; STOP_RANK stops itself after a few. */
	double end = now_s() + 30;
	for (int i = 0; now_s() < end; i++) {
		if (me == STOP_RANK && i == 20) {
			printf("stopping\n");
			fflush(stdout);
			raise(SIGSTOP);
		}
		if ((rc = sum_check(c, n)) != 0)
			return rc;
	}
	printf("no failure in 30 s\n");
	khor_finalize(c);
	return 5;
}

__attribute__((constructor)) static void maybe_be_a_rank(void)
{
	const char *mode = getenv("LIVENESS_MODE");

	if (mode == NULL)
		return;
	setvbuf(stdout, NULL, _IOLBF, 0);
	exit(rank_main(mode));
}

struct out {
	char *data;
	size_t len, cap;
};

static void out_add(struct out *o, const char *p, size_t n)
{
	if (o->len + n + 1 > o->cap) {
		o->cap = (o->len + n + 1) * 2;
		o->data = realloc(o->data, o->cap);
		cr_assert_not_null(o->data);
	}
	memcpy(o->data + o->len, p, n);
	o->len += n;
	o->data[o->len] = '\0';
}

static void self_path(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);

	cr_assert_gt(n, 0);
	buf[n] = '\0';
}

/* Starts argv with env added, stdout and stderr into one pipe (*fd_out). */
static pid_t start(char *const *argv, const char *const *env, int *fd_out)
{
	int p[2];
	pid_t pid;

	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		for (size_t i = 0; env[i] != NULL; i++)
			putenv((char *)env[i]);
		execv(argv[0], argv);
		_exit(99);
	}
	close(p[1]);
	*fd_out = p[0];
	return pid;
}

/* Reads fd to EOF into o, for at most until (CLOCK_MONOTONIC); false when it ran out. */
static bool read_all(int fd, struct out *o, double until, double *seen_at, const char *mark)
{
	char buf[4096];

	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		double left = until - now_s();
		if (left <= 0)
			return false;
		if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf));
		if (r <= 0)
			return true;
		out_add(o, buf, (size_t)r);
		if (mark != NULL && *seen_at == 0 && strstr(o->data, mark) != NULL)
			*seen_at = now_s();
	}
}

static int wait_exit(pid_t pid, double until)
{
	int st;

	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (now_s() > until) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			cr_assert_fail("process %d still running at its deadline", (int)pid);
		}
		usleep(20000);
	}
	return st;
}

/* Runs khorrun -np n on this binary in mode; returns its output and exit status. */
static int run_khorrun(const char *mode, int n, struct out *o, double *kill_at,
                       double *stop_at)
{
	char self[4096], np[16], modevar[64];
	const char *kr = getenv("KHORRUN");
	snprintf(np, sizeof(np), "%d", n);
	snprintf(modevar, sizeof(modevar), "LIVENESS_MODE=%s", mode);
	self_path(self, sizeof(self));
	/*
	 * A stopped rank is khorrun's to judge here (at KHOR_HEARTBEAT_TIMEOUT); the waiting
	 * ranks would judge it themselves at KHOR_TIMEOUT + KHOR_HEARTBEAT_TIMEOUT, which on a
	 * loaded machine came first with KHOR_TIMEOUT at 1 s: give khorrun a clear lead.
	 */
	char *timeout = strcmp(mode, "stop") == 0 ? "KHOR_TIMEOUT=6s" : "KHOR_TIMEOUT=1s";
	char *argv[] = { (char *)(kr != NULL && *kr ? kr : "./khorrun"), "-np", np, "-x", modevar,
	                 "-x", timeout, "-x", "KHOR_HEARTBEAT_TIMEOUT=2s", self, NULL };
	const char *env[] = { "KHOR_LOG=warn", NULL };
	int fd, st;
	pid_t pid = start(argv, env, &fd);

	double t0 = now_s();
	*kill_at = *stop_at = 0;
	/* The stop time is when the rank said so; the kill, when khorrun's line came. */
	char buf[4096];
	bool eof = false;
	while (!eof && now_s() < t0 + 40) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, 100) <= 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf));
		if (r <= 0) {
			eof = true;
			break;
		}
		out_add(o, buf, (size_t)r);
		if (*stop_at == 0 && strstr(o->data, "] stopping\n") != NULL)
			*stop_at = now_s();
		if (*kill_at == 0 && strstr(o->data, "stopped answering") != NULL)
			*kill_at = now_s();
	}
	close(fd);
	st = wait_exit(pid, t0 + 45);
	cr_assert(eof, "khorrun's output still open after 40 s:\n%s", o->data ? o->data : "");
	return st;
}

static void assert_gone(const char *text)
{
	for (const char *s = strstr(text, "pid="); s != NULL; s = strstr(s + 1, "pid=")) {
		pid_t pid = (pid_t)atoi(s + 4);
		cr_assert(kill(pid, 0) != 0 && errno == ESRCH, "rank process %d outlived the job",
		          (int)pid);
	}
}

Test(liveness, slow_rank_is_waited_for_not_killed, .timeout = 60)
{
	struct out o = { 0 };
	double k, s;
	int st = run_khorrun("slow", 3, &o, &k, &s);
	char want[64];

	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "khorrun exited 0x%x:\n%s", st, o.data);
	cr_assert_eq(k, 0, "a slow rank was killed:\n%s", o.data);
	for (int r = 0; r < 3; r++) {
		snprintf(want, sizeof(want), "[%d] ok\n", r);
		cr_assert_not_null(strstr(o.data, want), "no '%s' in:\n%s", want, o.data);
	}
	/* Both the direct allreduce and the engine's wait warned, naming the slow rank alive. */
	snprintf(want, sizeof(want), "on rank %d on ", SLOW_RANK);
	const char *w = strstr(o.data, want);
	cr_assert_not_null(w, "no warning naming rank %d:\n%s", SLOW_RANK, o.data);
	cr_assert_not_null(strstr(o.data, ": alive (heartbeat "), "%s", o.data);
	cr_assert_not_null(strstr(o.data, "a slow rank is not killed"), "%s", o.data);
	cr_assert_not_null(strstr(o.data, "waiting for 'slow'"), "the engine's wait did not warn:"
	                   "\n%s", o.data);
	free(o.data);
}

Test(liveness, stopped_rank_is_killed_by_khorrun_and_named, .timeout = 60)
{
	struct out o = { 0 };
	double kill_at, stop_at;
	int st = run_khorrun("stop", 3, &o, &kill_at, &stop_at);
	char want[128];

	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL, "khorrun exited 0x%x:\n%s",
	          st, o.data);
	snprintf(want, sizeof(want), "khorrun: rank %d on ", STOP_RANK);
	cr_assert_not_null(strstr(o.data, want), "%s", o.data);
	cr_assert_not_null(strstr(o.data, "stopped answering: no heartbeat for "), "%s", o.data);
	cr_assert_not_null(strstr(o.data, "(stopped or hung); killed it"), "%s", o.data);
	cr_assert(stop_at > 0 && kill_at > stop_at, "%s", o.data);
	/* KHOR_HEARTBEAT_TIMEOUT and a margin for the reads an interval apart. */
	cr_expect_lt(kill_at - stop_at, 2.0 + 2.0, "killed %.1f s after it stopped",
	             kill_at - stop_at);
	for (int r = 0; r < 3; r++) {
		if (r == STOP_RANK)
			continue;
		snprintf(want, sizeof(want), "[%d] failed: allreduce: ", r);
		const char *line = strstr(o.data, want);
		cr_assert_not_null(line, "rank %d did not fail:\n%s", r, o.data);
		snprintf(want, sizeof(want), "rank %d on ", STOP_RANK);
		const char *eol = strchr(line, '\n');
		const char *named = strstr(line, want);
		cr_assert(named != NULL && (eol == NULL || named < eol), "rank %d's error does not "
		          "name rank %d: %.400s", r, STOP_RANK, line);
	}
	assert_gone(o.data);
	free(o.data);
}

/* A free TCP port on 127.0.0.1 (closed again; rank 0 binds it next). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

Test(liveness, stopped_rank_is_named_not_alive_without_khorrun, .timeout = 60)
{
	char self[4096], port[32], rankv[3][32];
	char *argv[] = { self, NULL };
	struct out o[3] = { { 0 } };
	int fd[3];
	pid_t pid[3];

	self_path(self, sizeof(self));
	snprintf(port, sizeof(port), "MASTER_PORT=%d", free_port());
	for (int r = 0; r < 3; r++) {
		snprintf(rankv[r], sizeof(rankv[r]), "KHOR_RANK=%d", r);
		const char *env[] = { rankv[r], "KHOR_SIZE=3", "MASTER_ADDR=127.0.0.1", port,
		                      "KHOR_TIMEOUT=1s", "KHOR_HEARTBEAT_TIMEOUT=2s",
		                      "LIVENESS_MODE=stop", "KHOR_LOG=warn", NULL };
		pid[r] = start(argv, env, &fd[r]);
	}
	double t0 = now_s(), unused = 0;
	for (int r = 0; r < 3; r++) {
		if (r == STOP_RANK)
			continue;
		bool done = read_all(fd[r], &o[r], t0 + 30, &unused, NULL);
		int st = wait_exit(pid[r], t0 + 35);
		cr_assert(done, "rank %d still printing after 30 s:\n%s", r, o[r].data);
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 3, "rank %d exited 0x%x:\n%s", r, st,
		          o[r].data);
	}
	/* The stopped rank is the test's to end. */
	kill(pid[STOP_RANK], SIGKILL);
	(void)read_all(fd[STOP_RANK], &o[STOP_RANK], now_s() + 5, &unused, NULL);
	(void)wait_exit(pid[STOP_RANK], now_s() + 5);
	cr_assert_not_null(o[STOP_RANK].data);
	cr_assert_not_null(strstr(o[STOP_RANK].data, "stopping\n"), "%s", o[STOP_RANK].data);
	for (int r = 0; r < 3; r++) {
		char want[64];
		if (r == STOP_RANK)
			continue;
		cr_assert_not_null(o[r].data);
		const char *line = strstr(o[r].data, "failed: allreduce: ");
		cr_assert_not_null(line, "rank %d:\n%s", r, o[r].data);
		snprintf(want, sizeof(want), "rank %d on ", STOP_RANK);
		cr_expect_not_null(strstr(line, want), "rank %d does not name rank %d: %s", r,
		                   STOP_RANK, line);
		cr_expect_not_null(strstr(line, "is not alive: no heartbeat for "), "rank %d: %s", r,
		                   line);
		cr_expect_not_null(strstr(line, "(stopped, hung or cut off"), "rank %d: %s", r, line);
	}
	for (int r = 0; r < 3; r++) {
		close(fd[r]);
		free(o[r].data);
	}
}
