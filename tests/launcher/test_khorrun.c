/*
 * test_khorrun.c -- runs the real khorrun binary (path in $KHORRUN, default ./khorrun) on
 * real child programs (/bin/sh scripts) and checks what a user sees: each rank's
 * environment, prefixed and complete output, the exit status and message when a rank fails
 * or khorrun is interrupted, and that no rank or anything a rank started outlives khorrun
 * (checked by pid). For the store, this binary is itself the rank program: started with
 * KHORRUN_TEST_RANK set, it connects to khorrun's store with what khorrun gave it and
 * exits before Criterion's main runs.
 */
#include <criterion/criterion.h>

#include "runtime/cpubind.h"
#include "rendezvous/store.h"
#include "tests/support/proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/*
 * The rank side of the store tests: connect to KHOR_STORE_ADDR with KHOR_SECRET and
 * KHOR_JOB_ID, publish a key, read every other rank's. With bad_secret it checks instead
 * that the store refuses a rank without the job's secret.
 */
static int store_rank(bool bad_secret)
{
	const char *addr = getenv("KHOR_STORE_ADDR"), *job = getenv("KHOR_JOB_ID");
	const char *secret = bad_secret ? "not-the-secret" : getenv("KHOR_SECRET");
	int rank = atoi(getenv("KHOR_RANK")), size = atoi(getenv("KHOR_SIZE"));
	char host[256], key[32], want[32];
	const char *colon = strrchr(addr, ':');
	store *s;
	kerr err;
	int64_t count;

	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
	kerr_clear(&err);
	if (store_tcp_connect(host, (uint16_t)atoi(colon + 1), secret, job, kdeadline_in_ms(5000),
	                      &s, &err) != KHOR_SUCCESS) {
		printf("%s: %s\n", bad_secret ? "refused" : "connect failed", err.text);
		return bad_secret ? 0 : 10;
	}
	if (bad_secret) {
		printf("store accepted a wrong secret\n");
		return 11;
	}
	store_set_prefix(s, job, 0);
	snprintf(key, sizeof(key), "r%d", rank);
	snprintf(want, sizeof(want), "hello %d", rank);
	if (store_set(s, key, want, strlen(want), &err) != KHOR_SUCCESS ||
	    store_add(s, "count", 1, &count, &err) != KHOR_SUCCESS)
		goto fail;
	for (int q = 0; q < size; q++) {
		void *val;
		size_t len;

		snprintf(key, sizeof(key), "r%d", q);
		snprintf(want, sizeof(want), "hello %d", q);
		if (store_get(s, key, kdeadline_in_ms(10000), &val, &len, &err) != KHOR_SUCCESS)
			goto fail;
		if (len != strlen(want) || memcmp(val, want, len) != 0) {
			printf("rank %d's key holds '%.*s'\n", q, (int)len, (char *)val);
			free(val);
			store_close(s);
			return 12;
		}
		free(val);
	}
	printf("store ok\n");
	store_close(s);
	return 0;
fail:
	printf("store failed: %s\n", err.text);
	store_close(s);
	return 13;
}

__attribute__((constructor)) static void maybe_be_a_rank(void)
{
	const char *mode = getenv("KHORRUN_TEST_RANK");

	if (mode == NULL)
		return;
	fflush(stdout);
	exit(store_rank(strcmp(mode, "bad-secret") == 0));
}

static void self_path(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);

	cr_assert_gt(n, 0);
	buf[n] = '\0';
}

Test(khorrun, ranks_meet_in_the_store, .timeout = 30)
{
	char self[4096];
	const char *args[] = { "-np", "4", "-x", "KHORRUN_TEST_RANK=good", self, NULL };
	struct proc p;

	self_path(self, sizeof(self));
	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 0, "stdout:\n%s\nstderr:\n%s", p.b[0].data, p.b[1].data);
	cr_assert_eq(count_str(p.b[0].data, "store ok\n"), 4, "%s", p.b[0].data);
	proc_free(&p);
}

Test(khorrun, store_refuses_a_wrong_secret, .timeout = 30)
{
	char self[4096];
	const char *args[] = { "-np", "1", "-x", "KHORRUN_TEST_RANK=bad-secret", self, NULL };
	struct proc p;

	self_path(self, sizeof(self));
	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 0, "stdout:\n%s\nstderr:\n%s", p.b[0].data, p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "[0] refused: "), "%s", p.b[0].data);
	proc_free(&p);
}

Test(khorrun, env_per_rank, .timeout = 30)
{
	const char *args[] = {
		"-np", "3", "-x", "FOO=bar", "-x", "KHOR_RANK=77", "--timeout", "10s", "/bin/sh", "-c",
		"echo \"rank=$KHOR_RANK size=$KHOR_SIZE local=$KHOR_LOCAL_RANK/$KHOR_LOCAL_SIZE "
		"cross=$KHOR_CROSS_RANK/$KHOR_CROSS_SIZE addr=$KHOR_STORE_ADDR job=$KHOR_JOB_ID "
		"launcher=$KHOR_LAUNCHER secret=${#KHOR_SECRET} foo=$FOO timeout=$KHOR_TIMEOUT "
		"inherited=$INHERITED\"",
		NULL
	};
	const char *env[] = { "KHOR_RANK=99", "KHOR_SECRET=stale", "INHERITED=yes", NULL };
	char addr0[64] = "", job0[64] = "";
	struct proc p;

	proc_start(&p, args, env);
	proc_finish(&p, 20);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 3; r++) {
		char want[256], *line, addr[64], job[64];
		unsigned port = 0;

		snprintf(want, sizeof(want),
		         "[%d] rank=%d size=3 local=%d/3 cross=0/1 addr=", r, r, r);
		line = strstr(p.b[0].data, want);
		cr_assert_not_null(line, "no line '%s...' in:\n%s", want, p.b[0].data);
		cr_assert_eq(sscanf(line + strlen(want), "%63s job=%63s", addr, job), 2);
		cr_assert_eq(strncmp(addr, "127.0.0.1:", 10), 0, "store address %s", addr);
		port = (unsigned)atoi(addr + 10);
		cr_assert(port > 0 && port < 65536, "store port in %s", addr);
		cr_assert_eq(strncmp(job, "khor-", 5), 0, "job id %s", job);
		cr_assert_eq(strlen(job), 13, "job id %s", job);
		if (r == 0) {
			strcpy(addr0, addr);
			strcpy(job0, job);
		} else {
			cr_assert_str_eq(addr, addr0, "ranks disagree on the store address");
			cr_assert_str_eq(job, job0, "ranks disagree on the job id");
		}
		cr_assert_not_null(strstr(line, "launcher=khorrun secret=64 foo=bar timeout=10s "
		                                "inherited=yes\n"),
		                   "rank %d line: %.300s", r, line);
	}
	proc_free(&p);
}

/*
 * Runs `khorrun -np 3 -x HOROVOD_RANK=42 [-x KHOR_HOSTNAME=xhost]` with a stale HOROVOD_SIZE
 * inherited and checks that every rank sees horovodrun's variables with khorrun's values,
 * the same as its KHOR_* ones, and HOROVOD_HOSTNAME = want_host.
 */
static void check_horovod_env(const char *xhost, const char *want_host)
{
	char xhost_var[128];
	const char *args[] = {
		"-np", "3", "-x", "HOROVOD_RANK=42", "-x", xhost_var, "/bin/sh", "-c",
		"echo \"hvd rank=$HOROVOD_RANK size=$HOROVOD_SIZE "
		"local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE "
		"cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE host=$HOROVOD_HOSTNAME "
		"khor=$KHOR_RANK/$KHOR_SIZE/$KHOR_LOCAL_RANK/$KHOR_LOCAL_SIZE/$KHOR_CROSS_RANK/"
		"$KHOR_CROSS_SIZE end\"",
		NULL
	};
	const char *env[] = { "HOROVOD_SIZE=9", "HOROVOD_LOCAL_RANK=7", NULL };
	struct proc p;

	/* Without a host to pretend, a harmless -x takes its place in args. */
	if (xhost != NULL)
		snprintf(xhost_var, sizeof(xhost_var), "KHOR_HOSTNAME=%s", xhost);
	else
		snprintf(xhost_var, sizeof(xhost_var), "KHORRUN_TEST_NO_HOST=1");
	unsetenv("KHOR_HOSTNAME");
	proc_start(&p, args, env);
	proc_finish(&p, 20);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 3; r++) {
		char want[512];

		snprintf(want, sizeof(want),
		         "[%d] hvd rank=%d size=3 local=%d/3 cross=0/1 host=%s khor=%d/3/%d/3/0/1 end\n",
		         r, r, r, want_host, r, r);
		cr_assert_not_null(strstr(p.b[0].data, want), "no line '%s' in:\n%s", want,
		                   p.b[0].data);
	}
	proc_free(&p);
}

Test(khorrun, horovod_env_per_rank, .timeout = 30)
{
	char host[256] = "";

	cr_assert_eq(gethostname(host, sizeof(host) - 1), 0);
	check_horovod_env(NULL, host);
	/* A pretended host (KHOR_HOSTNAME, as test_hier uses) is the one khor groups by. */
	check_horovod_env("pretend-node", "pretend-node");
}

Test(khorrun, store_listens_while_ranks_run_and_sigterm_stops_them, .timeout = 30)
{
	const char *args[] = { "--job-id", "myjob.1", "-np", "1", "/bin/sh", "-c",
		               "echo addr=$KHOR_STORE_ADDR job=$KHOR_JOB_ID pid=$$; exec sleep 1000",
		               NULL };
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct proc p;
	pid_t pid;
	int fd;

	proc_start(&p, args, NULL);
	wait_for(&p, "pid=", 1, 10);
	cr_assert_not_null(strstr(p.b[0].data, "job=myjob.1 "), "%s", p.b[0].data);
	sa.sin_port = htons((uint16_t)atoi(strstr(p.b[0].data, "addr=127.0.0.1:") + 15));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0,
	             "store not listening: %s", strerror(errno));
	close(fd);
	collect_pids(p.b[0].data, "pid=", &pid, 1);

	kill(p.pid, SIGTERM);
	proc_finish(&p, 10);
	cr_assert_eq(exit_code(&p), 143, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "interrupted by SIGTERM"), "%s", p.b[1].data);
	assert_all_gone(&pid, 1);
	proc_free(&p);
}

/* Every rank's lines arrive whole, in order, with the right prefix, on the right stream. */
Test(khorrun, output_prefixed_complete_and_ordered, .timeout = 60)
{
	const char *args[] = { "-np", "4", "/bin/sh", "-c",
		               "i=0; while [ $i -lt 3000 ]; do echo \"out $KHOR_RANK $i\"; "
		               "if [ $((i % 6)) = 0 ]; then echo \"err $KHOR_RANK $i\" >&2; fi; "
		               "i=$((i+1)); done",
		               NULL };
	struct proc p = run(args, 50);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%.2000s", p.b[1].data);
	for (int k = 0; k < 2; k++) {
		int next[4] = { 0, 0, 0, 0 };
		int step = k == 0 ? 1 : 6;
		char *save = NULL;

		for (char *l = strtok_r(p.b[k].data, "\n", &save); l != NULL;
		     l = strtok_r(NULL, "\n", &save)) {
			int r, r2, i;

			cr_assert_eq(sscanf(l, "[%d] %*s %d %d", &r, &r2, &i), 3, "bad line '%s'", l);
			cr_assert(r >= 0 && r < 4 && r == r2, "line '%s' has the wrong prefix", l);
			cr_assert_eq(strncmp(strchr(l, ']') + 2, k == 0 ? "out " : "err ", 4), 0,
			             "line '%s' on the wrong stream", l);
			cr_assert_eq(i, next[r], "rank %d: line %d arrived, expected %d", r, i,
			             next[r]);
			next[r] += step;
		}
		for (int r = 0; r < 4; r++)
			cr_assert_eq(next[r], 3000, "stream %d rank %d: %d lines", k, r, next[r] / step);
	}
	proc_free(&p);
}

/* A line longer than khorrun's buffer is split but not lost; a partial last line shows. */
Test(khorrun, long_lines_and_partial_last_line, .timeout = 30)
{
	const char *args[] = { "-np", "2", "/bin/sh", "-c",
		               "head -c 300000 /dev/zero | tr '\\0' x; echo; printf 'tail %s' "
		               "$KHOR_RANK",
		               NULL };
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 2; r++) {
		char prefix[16], tail[32];
		size_t xs = 0, n = strlen(p.b[0].data);
		int plen = snprintf(prefix, sizeof(prefix), "[%d] ", r);
		char *last = NULL;

		for (char *l = p.b[0].data; l < p.b[0].data + n;) {
			char *e = strchr(l, '\n');

			cr_assert_not_null(e, "output does not end in a newline");
			if (strncmp(l, prefix, (size_t)plen) == 0) {
				size_t len = (size_t)(e - l) - (size_t)plen;

				if (len > 0 && l[plen] == 'x') {
					cr_assert_eq(strspn(l + plen, "x"), len, "garbage in a long line");
					xs += len;
				} else {
					last = l + plen;
				}
			}
			l = e + 1;
		}
		cr_assert_eq(xs, 300000, "rank %d: %zu of 300000 bytes of its long line", r, xs);
		snprintf(tail, sizeof(tail), "tail %d\n", r);
		cr_assert_not_null(last);
		cr_assert_eq(strncmp(last, tail, strlen(tail)), 0, "partial last line: '%.20s'", last);
	}
	proc_free(&p);
}

Test(khorrun, no_prefix, .timeout = 30)
{
	const char *args[] = { "--no-prefix", "-np", "2", "/bin/sh", "-c", "echo plain", NULL };
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), 0);
	cr_assert_str_eq(p.b[0].data, "plain\nplain\n");
	proc_free(&p);
}

Test(khorrun, failing_rank_stops_the_others, .timeout = 30)
{
	const char *args[] = { "-np", "4", "/bin/sh", "-c",
		               "if [ $KHOR_RANK = 2 ]; then sleep 0.5; echo bye; exit 3; fi; "
		               "echo pid=$$; exec sleep 1000",
		               NULL };
	struct proc p;
	pid_t pids[4];
	size_t n;

	proc_start(&p, args, NULL);
	wait_for(&p, "pid=", 3, 10);
	proc_finish(&p, 20);
	cr_assert_eq(exit_code(&p), 3, "stderr:\n%s", p.b[1].data);
	/* The others die of SIGTERM at once: no waiting out the 3 s grace period. */
	cr_assert_lt(p.secs, 2.5, "khorrun took %.2f s", p.secs);
	cr_assert_not_null(strstr(p.b[0].data, "[2] bye\n"), "%s", p.b[0].data);
	cr_assert_not_null(strstr(p.b[1].data, "khorrun: rank 2 (pid "), "%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "failed first: exited with status 3"), "%s",
	                   p.b[1].data);
	n = collect_pids(p.b[0].data, "pid=", pids, 4);
	cr_assert_eq(n, 3);
	assert_all_gone(pids, n);
	proc_free(&p);
}

/* A rank that ignores SIGTERM gets SIGKILL after --grace. */
Test(khorrun, sigkill_after_grace, .timeout = 30)
{
	const char *args[] = { "--grace", "500ms", "-np", "2", "/bin/sh", "-c",
		               "if [ $KHOR_RANK = 0 ]; then sleep 0.3; exit 5; fi; "
		               "trap '' TERM; echo pid=$$; while :; do sleep 0.05; done",
		               NULL };
	struct proc p;
	pid_t pid;

	proc_start(&p, args, NULL);
	wait_for(&p, "pid=", 1, 10);
	proc_finish(&p, 20);
	cr_assert_eq(exit_code(&p), 5, "stderr:\n%s", p.b[1].data);
	cr_assert(p.secs > 0.7 && p.secs < 4, "khorrun took %.2f s", p.secs);
	cr_assert_not_null(strstr(p.b[1].data, "sending SIGKILL"), "%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "rank 0 (pid "), "%s", p.b[1].data);
	collect_pids(p.b[0].data, "pid=", &pid, 1);
	assert_all_gone(&pid, 1);
	proc_free(&p);
}

Test(khorrun, rank_killed_by_signal, .timeout = 30)
{
	const char *args[] = { "-np", "3", "/bin/sh", "-c",
		               "if [ $KHOR_RANK = 1 ]; then sleep 0.2; kill -KILL $$; fi; "
		               "exec sleep 1000",
		               NULL };
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), 137, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "rank 1 (pid "), "%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "killed by signal SIGKILL (9)"), "%s", p.b[1].data);
	proc_free(&p);
}

Test(khorrun, all_ranks_succeed_at_different_times, .timeout = 30)
{
	const char *args[] = { "-np", "3", "/bin/sh", "-c",
		               "[ $KHOR_RANK = 0 ] && exit 0; sleep 0.5; echo done", NULL };
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_eq(count_str(p.b[0].data, "done\n"), 2, "%s", p.b[0].data);
	cr_assert_str_eq(p.b[1].data, "");
	proc_free(&p);
}

/* Ctrl-C: every rank and what it forked is stopped, by pid, and khorrun exits 130. */
Test(khorrun, sigint_stops_everything, .timeout = 30)
{
	const char *args[] = { "--grace", "300ms", "-np", "3", "/bin/sh", "-c",
		               /* The shell ignores SIGINT, its background sleep too: SIGTERM must follow. */
		               "trap '' INT; sleep 1000 & echo pid=$$ pid=$!; wait",
		               NULL };
	struct proc p;
	pid_t pids[6];
	size_t n;

	proc_start(&p, args, NULL);
	wait_for(&p, "pid=", 6, 10);
	kill(p.pid, SIGINT);
	proc_finish(&p, 10);
	cr_assert_eq(exit_code(&p), 130, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "interrupted by SIGINT"), "%s", p.b[1].data);
	n = collect_pids(p.b[0].data, "pid=", pids, 6);
	cr_assert_eq(n, 6);
	assert_all_gone(pids, n);
	proc_free(&p);
}

Test(khorrun, sigint_forwarded_first, .timeout = 30)
{
	const char *args[] = { "-np", "2", "/bin/sh", "-c",
		               "trap 'echo got-int; exit 0' INT; echo ready; "
		               "while :; do sleep 0.05; done",
		               NULL };
	struct proc p;

	proc_start(&p, args, NULL);
	wait_for(&p, "ready", 2, 10);
	kill(p.pid, SIGINT);
	proc_finish(&p, 10);
	cr_assert_eq(exit_code(&p), 130, "stderr:\n%s", p.b[1].data);
	cr_assert_eq(count_str(p.b[0].data, "got-int\n"), 2, "%s", p.b[0].data);
	cr_assert_lt(p.secs, 2.5, "took %.2f s: SIGINT should have ended the ranks", p.secs);
	proc_free(&p);
}

/*
 * Ranks that exit 0 but leave processes behind: one keeps the output pipe open, one
 * detached itself completely (setsid, output closed). Both are stopped before khorrun exits.
 */
Test(khorrun, leftovers_of_successful_ranks_are_stopped, .timeout = 30)
{
	const char *args[] = { "--grace", "300ms", "-np", "2", "/bin/sh", "-c",
		               "sleep 1000 & echo pid=$!; "
		               "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo pid=$!",
		               NULL };
	struct proc p = run(args, 20);
	pid_t pids[4];
	size_t n;

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_lt(p.secs, 5, "took %.2f s", p.secs);
	cr_assert_not_null(strstr(p.b[1].data, "stopping them"), "%s", p.b[1].data);
	n = collect_pids(p.b[0].data, "pid=", pids, 4);
	cr_assert_eq(n, 4, "%s", p.b[0].data);
	assert_all_gone(pids, n);
	proc_free(&p);
}

static void expect_usage_error(const char *const *args, const char *msg)
{
	struct proc p = run(args, 10);

	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, msg), "wanted '%s' in:\n%s", msg, p.b[1].data);
	cr_assert_str_eq(p.b[0].data, "");
	proc_free(&p);
}

Test(khorrun, bad_command_lines, .timeout = 30)
{
	const char *bogus[] = { "--bogus", "-np", "2", "true", NULL };
	const char *no_np[] = { "true", NULL };
	const char *np0[] = { "-np", "0", "true", NULL };
	const char *npx[] = { "-np", "4x", "true", NULL };
	const char *grace[] = { "--grace", "inf", "-np", "1", "true", NULL };
	const char *xbad[] = { "-x", "=v", "-np", "1", "true", NULL };
	const char *noprog[] = { "-np", "2", NULL };
	const char *noval[] = { "-np", NULL };
	const char *hosts0[] = { "-H", "a:0", "true", NULL };
	const char *hostsx[] = { "-H", "a:2,b:x", "true", NULL };
	const char *hostsempty[] = { "-H", "a:2,,b", "true", NULL };
	const char *hostsdash[] = { "-H", "-oProxyCommand=x:1", "true", NULL };
	const char *toomany[] = { "-np", "10", "-H", "a:4,b:4", "true", NULL };
	const char *both[] = { "-H", "a", "--hostfile", "/dev/null", "true", NULL };
	const char *bind[] = { "--bind", "socket", "-np", "2", "true", NULL };

	expect_usage_error(bogus, "usage: khorrun");
	expect_usage_error(bogus, "unknown option '--bogus'");
	expect_usage_error(no_np, "-np N is required");
	expect_usage_error(np0, "-np");
	expect_usage_error(npx, "'4x'");
	expect_usage_error(grace, "--grace");
	expect_usage_error(xbad, "-x");
	expect_usage_error(noprog, "no program");
	expect_usage_error(noval, "needs a value");
	expect_usage_error(hosts0, "-H a:0: host 'a' wants a slot count from 1 to 65536, not '0'");
	expect_usage_error(hostsx, "host 'b' wants a slot count from 1 to 65536, not 'x'");
	expect_usage_error(hostsempty, "empty host entry");
	expect_usage_error(hostsdash, "is not a host name");
	expect_usage_error(toomany, "-np 10 but the hosts give 8 slots: a:4, b:4");
	expect_usage_error(both, "give one of them");
	expect_usage_error(bind, "--bind wants cores or none, not 'socket'");
}

Test(khorrun, help_and_version, .timeout = 30)
{
	const char *help[] = { "--help", NULL };
	const char *ver[] = { "--version", NULL };
	struct proc p = run(help, 10);

	cr_assert_eq(exit_code(&p), 0);
	cr_assert_not_null(strstr(p.b[0].data, "usage: khorrun -np N"));
	cr_assert_not_null(strstr(p.b[0].data, "HOROVOD_CROSS_SIZE"), "%s", p.b[0].data);
	proc_free(&p);
	p = run(ver, 10);
	cr_assert_eq(exit_code(&p), 0);
	cr_assert_eq(strncmp(p.b[0].data, "khorrun (khor) ", 15), 0, "%s", p.b[0].data);
	proc_free(&p);
}

Test(khorrun, missing_or_unrunnable_program, .timeout = 30)
{
	const char *missing[] = { "-np", "2", "khor-no-such-program", NULL };
	const char *missing_path[] = { "-np", "2", "/nonexistent/prog", NULL };
	char file[] = "/tmp/khorrun-test-XXXXXX";
	const char *noexec[] = { "-np", "2", file, NULL };
	struct proc p;
	int fd;

	p = run(missing, 10);
	cr_assert_eq(exit_code(&p), 127, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "'khor-no-such-program'"), "%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "not found"), "%s", p.b[1].data);
	proc_free(&p);

	p = run(missing_path, 10);
	cr_assert_eq(exit_code(&p), 127, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "/nonexistent/prog"), "%s", p.b[1].data);
	proc_free(&p);

	/* Found but not executable: 126, as a shell says. */
	fd = mkstemp(file);
	cr_assert_geq(fd, 0);
	close(fd);
	chmod(file, 0644);
	p = run(noexec, 10);
	unlink(file);
	cr_assert_eq(exit_code(&p), 126, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, file), "%s", p.b[1].data);
	proc_free(&p);
}

/*
 * Runs np ranks that print the CPUs they may run on (the kernel's own list in
 * /proc/self/status) and returns rank r's list in lists[r]; each must be told that the job
 * has m CPUs (KHOR_LOCAL_CPUS).
 */
static void rank_cpu_lists(const char *mode, int np, int m, char lists[][256])
{
	char nps[16];
	const char *args[] = { "--bind", mode, "-np", nps, "/bin/sh", "-c",
		               "sed -n 's/^Cpus_allowed_list:[[:space:]]*/cpus=/p' /proc/self/status; "
		               "echo \"shared=$KHOR_LOCAL_CPUS\"",
		               NULL };
	struct proc p;

	snprintf(nps, sizeof(nps), "%d", np);
	/* mode NULL: no --bind at all, the default. */
	proc_start(&p, mode != NULL ? args : args + 2, NULL);
	proc_finish(&p, 30);
	cr_assert_eq(exit_code(&p), 0, "--bind %s -np %d; stderr:\n%s", mode ? mode : "(none given)",
	             np, p.b[1].data);
	for (int r = 0; r < np; r++) {
		char want[32];
		const char *line;

		snprintf(want, sizeof(want), "[%d] cpus=", r);
		line = strstr(p.b[0].data, want);
		cr_assert_not_null(line, "no '%s' in:\n%s", want, p.b[0].data);
		cr_assert_eq(sscanf(line + strlen(want), "%255s", lists[r]), 1);
		/* Every rank is told how many CPUs the job has, pinned or not. */
		snprintf(want, sizeof(want), "[%d] shared=%d\n", r, m);
		cr_assert_not_null(strstr(p.b[0].data, want), "no '%s' in:\n%s", want, p.b[0].data);
	}
	proc_free(&p);
}

/* The ranks' CPUs, read back from each rank, under every --bind mode. */
Test(khorrun, bind_cores_gives_ranks_their_share_of_khorruns_cpus, .timeout = 120)
{
	cpubind_cpus own;
	char own_list[256], want[256], lists[9][256];
	int m;

	/* At most 4 CPUs, so "more ranks than CPUs" stays a handful of processes anywhere. */
	cr_assert_eq(cpubind_load(&own), 0);
	if (own.n > 4) {
		cpu_set_t set;
		CPU_ZERO(&set);
		for (int i = 0; i < 4; i++)
			CPU_SET(own.cpu[i], &set);
		cr_assert_eq(sched_setaffinity(0, sizeof(set), &set), 0, "%s", strerror(errno));
		cpubind_free(&own);
		cr_assert_eq(cpubind_load(&own), 0);
	}
	m = own.n;
	cr_assert(m >= 1 && m <= 4);
	cpubind_format(own.cpu, m, own_list, sizeof(own_list));

	/* cores, ranks outnumber CPUs: rank r on CPU r mod m alone. */
	rank_cpu_lists("cores", 2 * m + 1, m, lists);
	for (int r = 0; r < 2 * m + 1; r++) {
		cpubind_format(&own.cpu[r % m], 1, want, sizeof(want));
		cr_assert_str_eq(lists[r], want, "cores, rank %d of %d on %d CPUs", r, 2 * m + 1, m);
	}
	/* none (the default), however many ranks: khorrun's own CPUs. */
	rank_cpu_lists("none", 2 * m + 1, m, lists);
	for (int r = 0; r < 2 * m + 1; r++)
		cr_assert_str_eq(lists[r], own_list, "none, rank %d", r);
	rank_cpu_lists(NULL, 2 * m + 1, m, lists);
	for (int r = 0; r < 2 * m + 1; r++)
		cr_assert_str_eq(lists[r], own_list, "no --bind, rank %d", r);
	/* cores: one rank gets them all; m ranks one each, in topology order. */
	rank_cpu_lists("cores", 1, m, lists);
	cr_assert_str_eq(lists[0], own_list, "cores, one rank");
	rank_cpu_lists("cores", m, m, lists);
	for (int r = 0; r < m; r++) {
		cpubind_format(&own.cpu[r], 1, want, sizeof(want));
		cr_assert_str_eq(lists[r], want, "cores, rank %d of %d", r, m);
	}
	cpubind_free(&own);
}

/* Blocks cover every CPU exactly once and differ by at most one; past n, ranks go round. */
Test(khorrun, bind_shares_are_even_blocks_then_round_robin)
{
	for (int n = 1; n <= 12; n++) {
		for (int np = 1; np <= 3 * n; np++) {
			int next = 0, minc = n, maxc = 0;

			for (int r = 0; r < np; r++) {
				int first, count;

				cpubind_share(n, np, r, &first, &count);
				if (np > n) {
					cr_assert(first == r % n && count == 1, "n %d np %d r %d", n, np, r);
					continue;
				}
				cr_assert_eq(first, next, "n %d np %d r %d: gap or overlap", n, np, r);
				cr_assert_geq(count, 1);
				next += count;
				minc = count < minc ? count : minc;
				maxc = count > maxc ? count : maxc;
			}
			if (np <= n) {
				cr_assert_eq(next, n, "n %d np %d: CPUs left over", n, np);
				cr_assert_leq(maxc - minc, 1, "n %d np %d: uneven blocks", n, np);
			}
		}
	}
	char buf[64];
	int cpus[] = { 9, 1, 2, 3, 8, 5 };
	cpubind_format(cpus, 6, buf, sizeof(buf));
	cr_assert_str_eq(buf, "1-3,5,8-9");
}

/* The line of rank r's stderr (prefixed "[r] ") that contains text, or NULL. */
static const char *rank_line(const char *out, int r, const char *text)
{
	char prefix[16];
	const char *at = out;

	snprintf(prefix, sizeof(prefix), "[%d] ", r);
	while ((at = strstr(at, text)) != NULL) {
		const char *bol = at;
		while (bol > out && bol[-1] != '\n')
			bol--;
		if (strncmp(bol, prefix, strlen(prefix)) == 0)
			return at;
		at++;
	}
	return NULL;
}

/* KHOR_LOG=debug names each schedule auto chose, with the model's predictions, per rank. */
Test(khorrun, debug_log_shows_choices_with_predictions, .timeout = 90)
{
	static const struct {
		const char *np, *args; /* khor-bench's */
		const char *want[2];
	} jobs[] = {
		{ "2", "allreduce -b 8 -e 4M -f 512",
		  { "allreduce 8 B on 2 ranks: ", "allreduce 2097152 B on 2 ranks: " } },
		{ "2", "broadcast -b 8 -e 4M -f 512",
		  { "broadcast 8 B on 2 ranks: ", "broadcast 2097152 B on 2 ranks: " } },
		{ "2", "allgather -b 64 -e 4M -f 65536",
		  { "allgather 64 B on 2 ranks: ", "allgather 4194304 B on 2 ranks: " } },
		{ "4", "reducescatter -b 64 -e 4M -f 65536",
		  { "reduce_scatter 64 B on 4 ranks: ", "reduce_scatter 4194304 B on 4 ranks: " } },
		{ "2", "allreduce -b 8 -e 8 --algo ring",
		  { "allreduce 8 B on 2 ranks: ring (forced", NULL } },
	};
	const char *bench = getenv("KHOR_BENCH");
	const char *env[] = { "KHOR_LOG=debug", NULL };

	if (bench == NULL || *bench == '\0')
		cr_skip_test("KHOR_BENCH is not set (ctest sets it to the built khor-bench)");
	/* Settings that replace the model's choice would print no predictions. */
	unsetenv("KHOR_ALGO");
	unsetenv("KHOR_RD_MAX_BYTES");
	for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++) {
		char script[1024];
		const char *args[] = { "-np", jobs[j].np, "/bin/sh", "-c", script, NULL };
		struct proc p;

		snprintf(script, sizeof(script), "exec %s %s -n 1 -w 0 --transport tcp", bench,
		         jobs[j].args);
		proc_start(&p, args, env);
		proc_finish(&p, 40);
		cr_assert_eq(exit_code(&p), 0, "%s; stderr:\n%s", script, p.b[1].data);
		for (int r = 0; r < 2; r++) {
			for (int k = 0; k < 2 && jobs[j].want[k] != NULL; k++) {
				const char *line = rank_line(p.b[1].data, r, jobs[j].want[k]);
				cr_assert_not_null(line, "rank %d: no '%s' line in:\n%s", r, jobs[j].want[k],
				                   p.b[1].data);
				cr_assert_not_null(strstr(line, "(predicted us: "), "rank %d: %.200s", r,
				                   line);
			}
		}
		proc_free(&p);
	}
}

/* rank_line's first line that also holds `also`, after the text. */
static const char *rank_line_with(const char *out, int r, const char *text, const char *also)
{
	for (const char *at = out; (at = rank_line(at, r, text)) != NULL;) {
		const char *eol = strchr(at, '\n'), *hit = strstr(at, also);
		if (hit != NULL && (eol == NULL || hit < eol))
			return at;
		if (eol == NULL)
			return NULL;
		at = eol + 1;
	}
	return NULL;
}

/*
 * Auto's timed trials: with a model given (so the candidates are known: at 64 KiB on 4 ranks
 * it predicts halving-doubling, the ring 1.2x and recursive doubling 1.4x slower) and trials
 * asked for, every rank tries them inside the first call, and every rank reports the same
 * outcome; khor-bench checks every call's result. KHOR_AUTO_TRIALS=0 leaves the model alone.
 * With trials, the buffers start 2000 bytes into a page (not even cache-line aligned), and
 * so do the trial buffers that mirror them.
 */
Test(khorrun, auto_trials_agree_on_every_rank, .timeout = 90)
{
	const char *bench = getenv("KHOR_BENCH");
	const char *trials[] = { "KHOR_AUTO_TRIALS=2", "KHOR_AUTO_TRIALS=0" };

	if (bench == NULL || *bench == '\0')
		cr_skip_test("KHOR_BENCH is not set (ctest sets it to the built khor-bench)");
	unsetenv("KHOR_ALGO");
	for (int j = 0; j < 2; j++) {
		char script[1024];
		const char *args[] = { "-np", "4", "/bin/sh", "-c", script, NULL };
		const char *env[] = { "KHOR_LOG=debug", "KHOR_COST_ALPHA_US=10",
		                      "KHOR_COST_BETA_GBPS=2", "KHOR_COST_GAMMA_GBPS=10", trials[j],
		                      NULL };
		char first[16] = "";
		struct proc p;

		snprintf(script, sizeof(script), "exec %s allreduce -b 64K -e 64K -n 4 -w 0 -c all "
		         "--offset %d --transport tcp", bench, j == 0 ? 2000 : 0);
		proc_start(&p, args, env);
		proc_finish(&p, 60);
		cr_assert_eq(exit_code(&p), 0, "%s; stderr:\n%s", trials[j], p.b[1].data);
		for (int r = 0; r < 4; r++) {
			const char *want = "allreduce 65536 B on 4 ranks: ";
			const char *line = rank_line(p.b[1].data, r, want);
			cr_assert_not_null(line, "rank %d: no '%s' line in:\n%s", r, want, p.b[1].data);
			const char *done = rank_line_with(p.b[1].data, r, want, " after trials (");
			if (j == 1) {
				cr_expect_null(done, "rank %d tried with %s: %.200s", r, trials[j], done);
				cr_expect_null(strstr(line, "; trying"), "rank %d: %.200s", r, line);
				continue;
			}
			cr_assert_not_null(strstr(line, "; trying hd, ring, rd"),
			                   "rank %d: %.200s", r, line);
			cr_assert_not_null(done, "rank %d: no outcome of the trials in:\n%s", r,
			                   p.b[1].data);
			/* "... 4 ranks: <algo> after trials": the same algo on every rank */
			char algo[16];
			done += strlen(want);
			snprintf(algo, sizeof(algo), "%.*s", (int)strcspn(done, " "), done);
			if (r == 0)
				snprintf(first, sizeof(first), "%s", algo);
			cr_expect_str_eq(algo, first, "rank %d chose %s, rank 0 %s", r, algo, first);
		}
		proc_free(&p);
	}
}

/* A rank script that runs two khor programs in turn: the second meets in a fresh generation. */
Test(khorrun, ranks_run_two_programs_in_turn, .timeout = 60)
{
	const char *bench = getenv("KHOR_BENCH");
	char script[1024];
	const char *args[] = { "-np", "3", "--timeout", "10s", "/bin/sh", "-c", script, NULL };
	struct proc p;

	if (bench == NULL || *bench == '\0')
		cr_skip_test("KHOR_BENCH is not set (ctest sets it to the built khor-bench)");
	/* Rank 2 starts its second program late, so rank 0 would find its old address first. */
	snprintf(script, sizeof(script),
	         "%s allreduce -b 8 -e 64K -f 64 -n 2 -w 0 -c all --transport tcp && "
	         "{ [ \"$KHOR_RANK\" != 2 ] || sleep 0.5; } && "
	         "%s allgather -b 64 -e 64K -f 32 -n 2 -w 0 -c all --transport tcp", bench, bench);
	proc_start(&p, args, NULL);
	proc_finish(&p, 50);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	/* Rank 0 prints the table: one per program, every call checked. */
	cr_assert_eq(count_str(p.b[0].data, "Out of bounds values : 0 OK"), 2, "stdout:\n%s",
	             p.b[0].data);
	proc_free(&p);
}

/*
 * khorrun started on one CPU (a taskset, a one-CPU container): its ranks, each allowed that
 * one CPU, must still know they share it. A one-CPU set alone reads as "pinned to my own
 * core" (Slurm's --cpu-bind), which would make them spin against each other.
 */
Test(khorrun, ranks_on_one_cpu_know_they_share_it, .timeout = 60)
{
	const char *bench = getenv("KHOR_BENCH");
	char script[1024];
	const char *args[] = { "-np", "2", "/bin/sh", "-c", script, NULL };
	const char *env[] = { "KHOR_LOG=info", NULL };
	cpubind_cpus own;
	cpu_set_t one;
	struct proc p;

	if (bench == NULL || *bench == '\0')
		cr_skip_test("KHOR_BENCH is not set (ctest sets it to the built khor-bench)");
	cr_assert_eq(cpubind_load(&own), 0);
	CPU_ZERO(&one);
	CPU_SET(own.cpu[0], &one);
	cpubind_free(&own);
	cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0, "%s", strerror(errno));
	snprintf(script, sizeof(script), "exec %s allreduce -b 8 -e 8 -n 2 -w 0", bench);
	proc_start(&p, args, env);
	proc_finish(&p, 40);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 2; r++)
		cr_assert_not_null(rank_line(p.b[1].data, r, "2 rank(s) on this machine's 1 CPU(s), "
		                                             "yielding while spinning"),
		                   "rank %d:\n%s", r, p.b[1].data);
	proc_free(&p);
}

/* ---- hosts: placement (--dry-run), hostfiles, Slurm's lists, this host without ssh ------- */

/* Runs `khorrun --dry-run args...` with env and returns its stdout (caller frees p). */
static struct proc dry_run(const char *const *args, const char *const *env)
{
	const char *all[32] = { "--dry-run" };
	size_t n = 1;
	struct proc p;

	for (size_t i = 0; args[i] != NULL && n < 30; i++)
		all[n++] = args[i];
	all[n] = NULL;
	proc_start(&p, all, env);
	proc_finish(&p, 20);
	return p;
}

static void expect_line(const struct proc *p, const char *line)
{
	char want[512];

	snprintf(want, sizeof(want), "%s\n", line);
	cr_assert_not_null(strstr(p->b[0].data, want), "no line '%s' in:\n%s\nstderr:\n%s", line,
	                   p->b[0].data, p->b[1].data);
}

/* Block placement, Horovod's local and cross ranks on uneven hosts, -np from the slots. */
Test(khorrun, hosts_placed_host_by_host, .timeout = 30)
{
	const char *args[] = { "-H", "nodea.invalid:3,nodeb.invalid:1", "-H", "nodec.invalid:2",
		               "true", NULL };
	const char *args5[] = { "-np", "5", "-H", "nodea.invalid:3,nodeb.invalid,nodec.invalid:2",
		                "--ssh-port", "2222", "--ssh-identity", "/k/id", "--start-timeout",
		                "7s", "true", NULL };
	struct proc p = dry_run(args, NULL);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "6 ranks on 3 hosts");
	expect_line(&p, "host nodea.invalid: ranks 0-2 (3 of 3 slots), over ssh");
	expect_line(&p, "host nodeb.invalid: rank 3 (1 of 1 slots), over ssh");
	expect_line(&p, "host nodec.invalid: ranks 4-5 (2 of 2 slots), over ssh");
	expect_line(&p, "rank 0: host nodea.invalid local_rank 0 local_size 3 cross_rank 0 cross_size 3");
	expect_line(&p, "rank 2: host nodea.invalid local_rank 2 local_size 3 cross_rank 0 cross_size 1");
	expect_line(&p, "rank 3: host nodeb.invalid local_rank 0 local_size 1 cross_rank 1 cross_size 3");
	expect_line(&p, "rank 5: host nodec.invalid local_rank 1 local_size 2 cross_rank 1 cross_size 2");
	/* ssh options; nothing secret on the command line (there is no secret yet anyway). */
	cr_assert_not_null(strstr(p.b[0].data, "  command: ssh -T -o BatchMode=yes -o "
	                                       "ConnectTimeout=30 "),
	                   "%s", p.b[0].data);
	cr_assert_not_null(strstr(p.b[0].data, " nodeb.invalid exec '"), "%s", p.b[0].data);
	cr_assert_not_null(strstr(p.b[0].data, "' --remote-helper\n"), "%s", p.b[0].data);
	proc_free(&p);

	/* -np below the slots fills the first hosts; a host with no slot count has one. */
	p = dry_run(args5, NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "5 ranks on 3 hosts");
	expect_line(&p, "host nodec.invalid: rank 4 (1 of 2 slots), over ssh");
	cr_assert_not_null(strstr(p.b[0].data, "ConnectTimeout=7 "), "%s", p.b[0].data);
	cr_assert_not_null(strstr(p.b[0].data, " -p 2222 -i /k/id nodea.invalid exec "), "%s",
	                   p.b[0].data);
	proc_free(&p);
}

/* A user's --ssh-command: quotes kept, khorrun's ssh options after the user's own. */
Test(khorrun, ssh_command_is_split_like_a_shell, .timeout = 30)
{
	const char *args[] = { "--ssh-command", "ssh -F '/a b/cfg' -o \"User=x y\"", "-H",
		               "n1.invalid:1,n2.invalid:1", "true", NULL };
	const char *other[] = { "--ssh-command", "/opt/rsh -l me", "-H", "n1.invalid:1,n2.invalid",
		                "true", NULL };
	struct proc p = dry_run(args, NULL);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "  command: ssh -F /a b/cfg -o User=x y -T -o "
	                                       "BatchMode=yes"),
	                   "%s", p.b[0].data);
	proc_free(&p);
	/* Not ssh: only the host and the command are added. */
	p = dry_run(other, NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "  command: /opt/rsh -l me n1.invalid exec '"), "%s",
	                   p.b[0].data);
	proc_free(&p);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

Test(khorrun, hostfile_forms_and_errors, .timeout = 30)
{
	char file[] = "/tmp/khorrun-hostfile-XXXXXX", bad[] = "/tmp/khorrun-hostfile-XXXXXX";
	const char *args[] = { "--hostfile", file, "true", NULL };
	const char *badargs[] = { "--hostfile", bad, "true", NULL };
	struct proc p;

	close(mkstemp(file));
	close(mkstemp(bad));
	write_file(file, "# mpirun's and horovodrun's forms\n"
	                 "\n"
	                 "h1.invalid slots=2   # trailing comment\n"
	                 "  h2.invalid:3\n"
	                 "h3.invalid slots=1 max_slots=8\n"
	                 "h4.invalid\n"
	                 "h1.invalid:1\n" /* named twice: the slots add up */
	                 "[fd00::5]:2\n");
	p = dry_run(args, NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "10 ranks on 5 hosts");
	expect_line(&p, "host h1.invalid: ranks 0-2 (3 of 3 slots), over ssh");
	expect_line(&p, "host h2.invalid: ranks 3-5 (3 of 3 slots), over ssh");
	expect_line(&p, "host h3.invalid: rank 6 (1 of 1 slots), over ssh");
	expect_line(&p, "host h4.invalid: rank 7 (1 of 1 slots), over ssh");
	expect_line(&p, "host fd00::5: ranks 8-9 (2 of 2 slots), over ssh");
	proc_free(&p);

	write_file(bad, "h1 slots=2\nh2 slots=0\n");
	p = run(badargs, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, ":2: host 'h2' wants slots=N with N from 1 to 65536, "
	                                       "not 'slots=0'"),
	                   "%s", p.b[1].data);
	proc_free(&p);
	write_file(bad, "h1 cpus=2\n");
	p = run(badargs, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, ":1: 'cpus=2' is not understood"), "%s", p.b[1].data);
	proc_free(&p);
	write_file(bad, "# nothing\n\n");
	p = run(badargs, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "names no host"), "%s", p.b[1].data);
	proc_free(&p);
	/* HOST slots=N checks the name as HOST:N does (it once let quotes and brackets by). */
	write_file(bad, "h'x slots=2\n");
	p = run(badargs, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "'h'x' is not a host name"), "%s", p.b[1].data);
	proc_free(&p);
	unlink(file);
	unlink(bad);
}

/*
 * What a remote khorrun sends back over ssh is a wire too: an output frame for a rank that
 * host doesn't have is dropped, and a length past the frame limit stops that host with an
 * error, never a crash or a hang. The "ssh" here is a script that answers with those bytes.
 */
Test(khorrun, garbled_frames_from_a_remote_host_stop_it, .timeout = 60)
{
	char script[] = "/tmp/khorrun-fake-ssh-XXXXXX";
	const char *args[] = { "--ssh-command", script, "--start-timeout", "10s", "-H",
		               "192.0.2.1:1", "true", NULL };

	close(mkstemp(script));
	/* The helper's magic; an 'O' frame of rank 0x7fffffff; a length over FRAME_MAX. */
	write_file(script, "#!/bin/sh\n"
	                   "printf '\\001khorrun-helper\\002'\n"
	                   "printf 'O\\000\\000\\000\\006\\177\\377\\377\\377\\000x'\n"
	                   "printf 'M\\377\\377\\377\\377'\n"
	                   "exec cat >/dev/null\n");
	chmod(script, 0700);
	struct proc p = run(args, 30);
	cr_assert_neq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "192.0.2.1: garbled data from the remote khorrun"),
	                   "%s", p.b[1].data);
	proc_free(&p);
	unlink(script);
}

/*
 * Brackets that multiply into names without end, all the same ("[1,1,..]" twice: merged
 * into one host, so no host bound was ever met), are refused at 65536 names instead of
 * running on. Found by tests/launcher/fuzz_config.c (its inputs, with one of 28224 nodes
 * that took over 100 s when each name was compared with all before it, are in
 * tests/launcher/fuzz_corpus/config).
 */
Test(khorrun, slurm_names_without_end_are_refused, .timeout = 30)
{
	const char *args[] = { "-np", "1", "true", NULL };
	static char repeat[2 * 2 * 512 + 64];
	size_t o = (size_t)snprintf(repeat, sizeof(repeat), "SLURM_JOB_NODELIST=n");
	for (int b = 0; b < 2; b++) {
		repeat[o++] = '[';
		for (int i = 0; i < 511; i++) {
			repeat[o++] = '1';
			repeat[o++] = ',';
		}
		repeat[o++] = '1';
		repeat[o++] = ']';
	}
	repeat[o] = '\0';
	const char *rep[] = { repeat, "SLURM_TASKS_PER_NODE=1", NULL };
	struct proc p = dry_run(args, rep);

	/* 512 x 512 names of one host. */
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "more than 65536 node names"), "%s", p.b[1].data);
	proc_free(&p);
}

/* Inside a Slurm allocation (sbatch, salloc) and without -H: its nodes and tasks. */
Test(khorrun, slurm_allocation_gives_the_hosts, .timeout = 30)
{
	const char *args[] = { "true", NULL };
	const char *np3[] = { "-np", "3", "true", NULL };
	const char *env[] = { "SLURM_JOB_NODELIST=node[01-03,07],gpu5,r[1-2]n[08-10]",
		              "SLURM_TASKS_PER_NODE=2(x3),1,4,1(x6)", NULL };
	const char *cpus[] = { "SLURM_JOB_NODELIST=c[9-10]", "SLURM_TASKS_PER_NODE=",
		               "SLURM_JOB_CPUS_PER_NODE=8(x2)", NULL };
	const char *bad1[] = { "SLURM_JOB_NODELIST=n[1-3]", "SLURM_TASKS_PER_NODE=2(x2)", NULL };
	const char *bad2[] = { "SLURM_JOB_NODELIST=n[1-3", "SLURM_TASKS_PER_NODE=1", NULL };
	const char *bad3[] = { "SLURM_JOB_NODELIST=n[1-3]", "SLURM_TASKS_PER_NODE=2(y3)", NULL };
	/* A number past unsigned long once counted up to ULONG_MAX, wrapped and spun. */
	const char *bad4[] = { "SLURM_JOB_NODELIST=n[99999999999999999999]",
	                       "SLURM_TASKS_PER_NODE=1", NULL };
	struct proc p = dry_run(args, env);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "17 ranks on 11 hosts");
	expect_line(&p, "host node01: ranks 0-1 (2 of 2 slots), over ssh");
	expect_line(&p, "host node03: ranks 4-5 (2 of 2 slots), over ssh");
	expect_line(&p, "host node07: rank 6 (1 of 1 slots), over ssh");
	expect_line(&p, "host gpu5: ranks 7-10 (4 of 4 slots), over ssh");
	expect_line(&p, "host r1n08: rank 11 (1 of 1 slots), over ssh");
	expect_line(&p, "host r1n10: rank 13 (1 of 1 slots), over ssh");
	expect_line(&p, "host r2n10: rank 16 (1 of 1 slots), over ssh");
	proc_free(&p);

	p = dry_run(np3, cpus);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "host c9: ranks 0-2 (3 of 8 slots), over ssh");
	proc_free(&p);

	p = dry_run(args, bad1);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "counts 2 nodes but SLURM_JOB_NODELIST='n[1-3]' "
	                                       "lists 3"),
	                   "%s", p.b[1].data);
	proc_free(&p);
	p = dry_run(args, bad2);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "unclosed"), "%s", p.b[1].data);
	proc_free(&p);
	p = dry_run(args, bad3);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "is not a list like \"2(x3),1\""), "%s", p.b[1].data);
	proc_free(&p);
	p = dry_run(args, bad4);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "is not a number or a range"), "%s", p.b[1].data);
	proc_free(&p);
}

/*
 * This host under any of its names runs its ranks directly, as one host (its names
 * merged): an ssh command that always fails proves no ssh was used.
 */
Test(khorrun, this_host_runs_without_ssh, .timeout = 30)
{
	char self[256] = "", hosts[400];
	const char *args[] = { "--ssh-command", "/bin/false", "-H", hosts, "/bin/sh", "-c",
		               "echo \"$KHOR_RANK $KHOR_LOCAL_RANK/$KHOR_LOCAL_SIZE "
		               "$KHOR_CROSS_RANK/$KHOR_CROSS_SIZE\"",
		               NULL };
	struct proc p;

	gethostname(self, sizeof(self) - 1);
	snprintf(hosts, sizeof(hosts), "localhost:2,127.0.0.1:1,%s:1", self);
	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 4; r++) {
		char want[64];

		snprintf(want, sizeof(want), "[%d] %d %d/4 0/1\n", r, r, r);
		cr_assert_not_null(strstr(p.b[0].data, want), "no '%s' in:\n%s", want, p.b[0].data);
	}
	cr_assert_str_eq(p.b[1].data, "");
	proc_free(&p);
}

/* --output-filename DIR: each rank's lines, unprefixed, in DIR/rank.N/{stdout,stderr}. */
Test(khorrun, output_filename_writes_each_ranks_files, .timeout = 30)
{
	char dir[] = "/tmp/khorrun-out-XXXXXX";
	const char *args[] = { "--output-filename", dir, "-np", "2", "/bin/sh", "-c",
		               "echo \"out $KHOR_RANK\"; printf 'err %s' $KHOR_RANK >&2", NULL };
	struct proc p;

	cr_assert_not_null(mkdtemp(dir));
	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "[1] out 1\n"), "%s", p.b[0].data);
	for (int r = 0; r < 2; r++) {
		char path[300], buf[64] = "", want[32];
		FILE *f;

		for (int k = 0; k < 2; k++) {
			snprintf(path, sizeof(path), "%s/rank.%d/%s", dir, r, k ? "stderr" : "stdout");
			f = fopen(path, "r");
			cr_assert_not_null(f, "%s: %s", path, strerror(errno));
			buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
			fclose(f);
			/* A partial last line is completed, as on the terminal. */
			snprintf(want, sizeof(want), "%s %d\n", k ? "err" : "out", r);
			cr_assert_str_eq(buf, want, "%s", path);
			unlink(path);
		}
		snprintf(path, sizeof(path), "%s/rank.%d", dir, r);
		rmdir(path);
	}
	rmdir(dir);
	proc_free(&p);
}

/* --bind-store ADDR:PORT sets both; a store on loopback cannot serve other hosts. */
Test(khorrun, bind_store_address_and_port, .timeout = 30)
{
	const char *args[] = { "--bind-store", "127.0.0.1:0", "-np", "1", "/bin/sh", "-c",
		               "echo \"store $KHOR_STORE_ADDR\"", NULL };
	const char *loop[] = { "--bind-store", "127.0.0.1", "--ssh-command", "/bin/false", "-H",
		               "localhost:1,192.0.2.1:1", "true", NULL };
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "[0] store 127.0.0.1:"), "%s", p.b[0].data);
	proc_free(&p);
	p = run(loop, 20);
	cr_assert_eq(exit_code(&p), 1, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "--bind-store 127.0.0.1 is loopback, which "
	                                       "192.0.2.1 cannot reach"),
	                   "%s", p.b[1].data);
	proc_free(&p);
}

/* A host whose ssh fails at once: its error named with the host, the local ranks stopped. */
Test(khorrun, failed_ssh_is_named_and_stops_the_job, .timeout = 30)
{
	const char *args[] = { "--ssh-command", "/bin/sh -c 'echo \"ssh: connect to host $0 port "
		                                "22: Connection refused\" >&2; exit 255'",
		               "-H", "localhost:2,192.0.2.1:2", "/bin/sh", "-c",
		               "echo pid=$$; exec sleep 1000", NULL };
	struct proc p;
	pid_t pids[2];
	size_t n;

	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 1, "stderr:\n%s", p.b[1].data);
	cr_assert_lt(p.secs, 5, "took %.2f s", p.secs);
	cr_assert_not_null(strstr(p.b[1].data, "khorrun: cannot start ranks 2-3 on 192.0.2.1: ssh: "
	                                       "connect to host 192.0.2.1 port 22: Connection "
	                                       "refused\n"),
	                   "%s", p.b[1].data);
	n = collect_pids(p.b[0].data, "pid=", pids, 2);
	assert_all_gone(pids, n);
	proc_free(&p);
}

/* A host that never answers (ssh hangs): --start-timeout ends the job, naming the host. */
Test(khorrun, start_timeout_names_the_host, .timeout = 30)
{
	const char *args[] = { "--ssh-command", "/bin/sh -c 'echo connecting... >&2; exec sleep 100'",
		               "--start-timeout", "1s", "--grace", "300ms", "-H",
		               "localhost:1,192.0.2.1:1", "/bin/sh", "-c",
		               "echo pid=$$; exec sleep 1000", NULL };
	struct proc p;
	pid_t pid;

	p = run(args, 20);
	cr_assert_eq(exit_code(&p), 1, "stderr:\n%s", p.b[1].data);
	cr_assert(p.secs > 0.9 && p.secs < 4, "took %.2f s", p.secs);
	cr_assert_not_null(strstr(p.b[1].data, "khorrun: cannot start rank 1 on 192.0.2.1: no answer "
	                                       "within 1.0 s (--start-timeout); ssh said: "
	                                       "connecting...\n"),
	                   "%s", p.b[1].data);
	if (collect_pids(p.b[0].data, "pid=", &pid, 1) == 1)
		assert_all_gone(&pid, 1);
	proc_free(&p);
}

/* Ctrl-C while a host is still connecting ends the job at once, not after the grace periods. */
Test(khorrun, sigint_during_the_start, .timeout = 30)
{
	const char *args[] = { "--ssh-command", "/bin/sh -c 'exec sleep 100'", "-H",
		               "localhost:1,192.0.2.1:1", "/bin/sh", "-c", "echo ready; exec sleep 1000",
		               NULL };
	struct proc p;
	double t;

	proc_start(&p, args, NULL);
	wait_for(&p, "ready", 1, 10);
	t = now_s();
	kill(p.pid, SIGINT);
	proc_finish(&p, 10);
	cr_assert_eq(exit_code(&p), 130, "stderr:\n%s", p.b[1].data);
	cr_assert_lt(now_s() - t, 1.5, "took %.2f s after SIGINT", now_s() - t);
	proc_free(&p);
}

/* sbatch on one node, this one: the allocation's tasks run here, without ssh, -np from them. */
Test(khorrun, slurm_allocation_of_this_host_runs_here, .timeout = 30)
{
	char self[256] = "", nodes[300];
	const char *args[] = { "--ssh-command", "/bin/false", "/bin/sh", "-c",
		               "echo \"r=$KHOR_RANK/$KHOR_SIZE\"", NULL };
	const char *env[] = { nodes, "SLURM_TASKS_PER_NODE=3", NULL };
	struct proc p;

	gethostname(self, sizeof(self) - 1);
	snprintf(nodes, sizeof(nodes), "SLURM_JOB_NODELIST=%s", self);
	proc_start(&p, args, env);
	proc_finish(&p, 20);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 3; r++) {
		char want[32];

		snprintf(want, sizeof(want), "[%d] r=%d/3\n", r, r);
		cr_assert_not_null(strstr(p.b[0].data, want), "no '%s' in:\n%s", want, p.b[0].data);
	}
	proc_free(&p);
}

/*
 * The remote helper's stdin is a wire: bytes that are not its frames (an oversized length,
 * text, a truncated payload), frames it doesn't know (skipped) and a start-up that says
 * "go" before it has said what to run all end it with an error, never a hang.
 */
Test(khorrun, remote_helper_refuses_bad_bytes_on_stdin, .timeout = 60)
{
	char hello[64], go_alone[160], truncated[160];
	int hn = snprintf(hello, sizeof(hello), "khorrun-helper 2 %d.%d.%d", KHOR_VERSION_MAJOR,
	                  KHOR_VERSION_MINOR, KHOR_VERSION_PATCH);
	/* A valid hello, then "go" with no cwd, argv or ranks: "incomplete start-up". */
	snprintf(go_alone, sizeof(go_alone), "H\\000\\000\\000\\%03o%sG\\000\\000\\000\\000", hn,
	         hello);
	/* A valid hello, then a frame that promises 50 bytes and brings 5. */
	snprintf(truncated, sizeof(truncated), "H\\000\\000\\000\\%03o%sC\\000\\000\\000\\062/tmp/",
	         hn, hello);
	const char *const inputs[] = {
		"\\377\\377\\377\\377\\377\\377",       /* a length over FRAME_MAX */
		"Zjunk that is not a frame at all", /* text */
		"\\001\\000\\000\\000\\003abc",          /* a frame of an unknown type, then EOF */
		"",                                 /* nothing: stdin closed at once */
		go_alone,
		truncated,
	};
	char cmd[1024];

	for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
		snprintf(cmd, sizeof(cmd), "printf '%s' | timeout 20 '%s' --remote-helper "
		         ">/dev/null 2>&1", inputs[i], khorrun_path());
		int st = system(cmd);
		cr_assert(WIFEXITED(st), "input %zu: the helper did not exit", i);
		cr_expect_neq(WEXITSTATUS(st), 0, "input %zu was accepted", i);
		cr_expect_neq(WEXITSTATUS(st), 124, "input %zu: the helper hung", i);
	}
}

/*
 * A "host" reached by a script in place of ssh that runs the helper in a login-like
 * environment of its own (env -i, as sshd gives a fresh login): what the ranks there see of
 * khorrun's environment is what forwarding gave them. Returns the script's path (static).
 */
static const char *fake_login_ssh(void)
{
	static char script[] = "/tmp/khorrun-login-ssh-XXXXXX";

	if (script[sizeof(script) - 2] == 'X') {
		close(mkstemp(script));
		write_file(script, "#!/bin/sh\n"
		                   "shift\n"
		                   "exec env -i PATH=/usr/bin:/bin HOME=/far HOSTNAME=farhost "
		                   "USER=faruser PYTHONUNBUFFERED=far /bin/sh -c \"$1\"\n");
		chmod(script, 0700);
	}
	return script;
}

/*
 * Every variable of khorrun's environment reaches the ranks on another host (PATH,
 * PYTHONPATH, anything), except the host-local ones, which keep the far login's values or
 * stay unset; khorrun's own rank variables still win over stale ones from the shell; and
 * PYTHONUNBUFFERED=1 unless the user set it, here and there.
 */
Test(khorrun, environment_is_forwarded_to_other_hosts, .timeout = 60)
{
	const char *args[] = {
		"--ssh-command", fake_login_ssh(), "-H", "far.invalid:2", "/bin/sh", "-c",
		"echo \"foo=$FOO pp=$PYTHONPATH path=$PATH host=$HOSTNAME home=$HOME "
		"user=$USER ssh=${SSH_CLIENT-unset} xdg=${XDG_RUNTIME_DIR-unset} "
		"term=${TERM-unset} shlvl=${SHLVL-unset} cvd=${CUDA_VISIBLE_DEVICES-unset} "
		"rank=$KHOR_RANK unbuf=$PYTHONUNBUFFERED end\"",
		NULL
	};
	const char *env[] = { "FOO=bar baz 'q' \"d\" $x", "PYTHONPATH=/opt/pp",
		              "PATH=/opt/venv/bin:/usr/bin:/bin", "HOSTNAME=nearhost", "HOME=/near",
		              "USER=nearuser", "SSH_CLIENT=10.0.0.1 22 22", "XDG_RUNTIME_DIR=/run/1",
		              "TERM=xterm", "SHLVL=3", "CUDA_VISIBLE_DEVICES=1", "KHOR_RANK=99",
		              NULL };
	const char *set[] = { "PYTHONUNBUFFERED=0", NULL };
	const char *local[] = { "-np", "2", "/bin/sh", "-c", "echo unbuf=$PYTHONUNBUFFERED", NULL };
	struct proc p;

	unsetenv("PYTHONUNBUFFERED");
	proc_start(&p, args, env);
	proc_finish(&p, 30);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 2; r++) {
		char want[512];

		snprintf(want, sizeof(want),
		         "[%d] foo=bar baz 'q' \"d\" $x pp=/opt/pp path=/opt/venv/bin:/usr/bin:/bin "
		         "host=farhost home=/far user=faruser ssh=unset xdg=unset term=unset "
		         "shlvl=unset cvd=unset rank=%d unbuf=1 end\n", r, r);
		cr_assert_not_null(strstr(p.b[0].data, want), "no line '%s' in:\n%s", want,
		                   p.b[0].data);
	}
	proc_free(&p);
	/* The user's own value wins, on the other host and on this one. */
	args[6] = "echo unbuf=$PYTHONUNBUFFERED";
	proc_start(&p, args, set);
	proc_finish(&p, 30);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_eq(count_str(p.b[0].data, "unbuf=0\n"), 2, "%s", p.b[0].data);
	proc_free(&p);
	proc_start(&p, local, NULL);
	proc_finish(&p, 30);
	cr_assert_eq(count_str(p.b[0].data, "unbuf=1\n"), 2, "%s", p.b[0].data);
	proc_free(&p);
	proc_start(&p, local, set);
	proc_finish(&p, 30);
	cr_assert_eq(count_str(p.b[0].data, "unbuf=0\n"), 2, "%s", p.b[0].data);
	proc_free(&p);
	unlink(fake_login_ssh());
}

/*
 * The variables a job's ranks see, one "[r] NAME=value" line each for the names listed
 * (a shell loop over them in every rank; unset ones print "NAME=-").
 */
static struct proc run_show(const char *const *flags, const char *names, const char *const *env)
{
	char script[1024];
	const char *args[64];
	size_t n = 0;
	struct proc p;

	snprintf(script, sizeof(script),
	         "for v in %s; do eval \"echo $v=\\${$v--}\"; done", names);
	for (; flags[n] != NULL; n++)
		args[n] = flags[n];
	args[n++] = "/bin/sh";
	args[n++] = "-c";
	args[n++] = script;
	args[n] = NULL;
	proc_start(&p, args, env);
	proc_finish(&p, 30);
	return p;
}

static void expect_in_ranks(const struct proc *p, int np, const char *var_value)
{
	for (int r = 0; r < np; r++) {
		char want[512];

		snprintf(want, sizeof(want), "[%d] %s\n", r, var_value);
		cr_expect_not_null(strstr(p->b[0].data, want), "no '%s' in:\n%s\nstderr:\n%s", want,
		                   p->b[0].data, p->b[1].data);
	}
}

/*
 * horovodrun's tuning flags each set their variable, in the ranks here and on another host
 * (the fake login "ssh"), overriding the shell's; the --no- forms set 0.
 */
Test(khorrun, horovodrun_tuning_flags_reach_every_rank, .timeout = 60)
{
	const char *flags[] = {
		"--ssh-command", fake_login_ssh(), "-H", "localhost:1,far.invalid:1",
		"--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
		"--hierarchical-allreduce", "--no-hierarchical-allgather", "--autotune",
		"--autotune-log-file", "/tmp/at.csv", "--autotune-warmup-samples", "4",
		"--autotune-steps-per-sample", "12", "--timeline-filename", "/tmp/tl.json",
		"--timeline-mark-cycles", "--stall-check-warning-time-seconds", "30",
		"--stall-check-shutdown-time-seconds", "90", "--log-level", "WARNING",
		"--network-interface", "eth0,ib0", "--num-nccl-streams", "2", "--tcp",
		"--log-hide-timestamp", NULL
	};
	const char *names = "KHOR_FUSION_THRESHOLD KHOR_CYCLE_TIME KHOR_CACHE_CAPACITY "
	                    "HOROVOD_HIERARCHICAL_ALLREDUCE HOROVOD_HIERARCHICAL_ALLGATHER "
	                    "KHOR_AUTOTUNE KHOR_AUTOTUNE_LOG KHOR_AUTOTUNE_WARMUP_SAMPLES "
	                    "KHOR_AUTOTUNE_STEPS_PER_SAMPLE KHOR_TIMELINE KHOR_TIMELINE_MARK_CYCLES "
	                    "KHOR_STALL_CHECK_TIME KHOR_STALL_SHUTDOWN_TIME KHOR_LOG "
	                    "KHOR_SOCKET_IFNAME NCCL_SOCKET_IFNAME HOROVOD_GLOO_IFACE "
	                    "HOROVOD_NUM_NCCL_STREAMS NCCL_IB_DISABLE HOROVOD_LOG_HIDE_TIME "
	                    "HOROVOD_STALL_CHECK_DISABLE";
	const char *env[] = { "KHOR_FUSION_THRESHOLD=1", "KHOR_LOG=trace", NULL };
	static const char *const want[] = {
		"KHOR_FUSION_THRESHOLD=33554432", "KHOR_CYCLE_TIME=2.5", "KHOR_CACHE_CAPACITY=0",
		"HOROVOD_HIERARCHICAL_ALLREDUCE=1", "HOROVOD_HIERARCHICAL_ALLGATHER=0",
		"KHOR_AUTOTUNE=1", "KHOR_AUTOTUNE_LOG=/tmp/at.csv", "KHOR_AUTOTUNE_WARMUP_SAMPLES=4",
		"KHOR_AUTOTUNE_STEPS_PER_SAMPLE=12", "KHOR_TIMELINE=/tmp/tl.json",
		"KHOR_TIMELINE_MARK_CYCLES=1", "KHOR_STALL_CHECK_TIME=30",
		"KHOR_STALL_SHUTDOWN_TIME=90", "KHOR_LOG=warn", "KHOR_SOCKET_IFNAME==eth0,ib0",
		"NCCL_SOCKET_IFNAME=eth0,ib0", "HOROVOD_GLOO_IFACE=eth0",
		"HOROVOD_NUM_NCCL_STREAMS=2", "NCCL_IB_DISABLE=1", "HOROVOD_LOG_HIDE_TIME=1",
		"HOROVOD_STALL_CHECK_DISABLE=-",
	};
	const char *nostall[] = { "-np", "2", "--stall-check-warning-time-seconds", "30",
		                  "--no-stall-check", "--no-autotune", NULL };
	const char *bad[][3] = {
		{ "--fusion-threshold-mb", "-1", "--fusion-threshold-mb wants a whole number of MB" },
		{ "--cycle-time-ms", "fast", "--cycle-time-ms wants a number >= 0, not 'fast'" },
		{ "--log-level", "LOUD", "--log-level wants TRACE, DEBUG, INFO, WARNING, ERROR or" },
		{ "--autotune-gaussian-process-noise", "2", "wants a number from 0 to 1" },
	};
	struct proc p = run_show(flags, names, env);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		expect_in_ranks(&p, 2, want[i]);
	proc_free(&p);
	unlink(fake_login_ssh());

	/* --no-stall-check turns the check off even with a warning time given. */
	p = run_show(nostall, "KHOR_STALL_CHECK_TIME HOROVOD_STALL_CHECK_DISABLE KHOR_AUTOTUNE", NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_in_ranks(&p, 2, "KHOR_STALL_CHECK_TIME=0");
	expect_in_ranks(&p, 2, "HOROVOD_STALL_CHECK_DISABLE=1");
	expect_in_ranks(&p, 2, "KHOR_AUTOTUNE=0");
	proc_free(&p);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *args[] = { "-np", "1", bad[i][0], bad[i][1], "true", NULL };

		p = run(args, 10);
		cr_expect_eq(exit_code(&p), 2, "%s %s: stderr:\n%s", bad[i][0], bad[i][1], p.b[1].data);
		cr_expect_not_null(strstr(p.b[1].data, bad[i][2]), "%s", p.b[1].data);
		proc_free(&p);
	}
}

/* horovodrun's other names: -p, -i, --ssh-identity-file, --num-proc, --hosts, -hostfile. */
Test(khorrun, horovodrun_option_names, .timeout = 30)
{
	char file[] = "/tmp/khorrun-hostfile-XXXXXX";
	const char *ssh[] = { "--num-proc", "2", "--hosts", "a.invalid:2", "-p", "2222",
		              "--ssh-identity-file", "/k/id", "true", NULL };
	const char *ssh_i[] = { "-i", "/k/id2", "-hostfile", file, "true", NULL };
	const char *mpi[] = { "--mpi", "-np", "1", "true", NULL };
	const char *gloo[] = { "--gloo", "--disable-cache", "--verbose", "-np", "1", "true", NULL };
	struct proc p = dry_run(ssh, NULL);

	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "host a.invalid: ranks 0-1 (2 of 2 slots), over ssh");
	cr_assert_not_null(strstr(p.b[0].data, " -p 2222 -i /k/id a.invalid exec "), "%s",
	                   p.b[0].data);
	proc_free(&p);
	close(mkstemp(file));
	write_file(file, "b.invalid slots=3\n");
	p = dry_run(ssh_i, NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_line(&p, "host b.invalid: ranks 0-2 (3 of 3 slots), over ssh");
	cr_assert_not_null(strstr(p.b[0].data, " -i /k/id2 b.invalid exec "), "%s", p.b[0].data);
	proc_free(&p);
	unlink(file);
	p = run(mpi, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "--mpi: khor has no MPI"), "%s", p.b[1].data);
	proc_free(&p);
	p = run(gloo, 10);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	proc_free(&p);
}

/*
 * --config-file: horovodrun's YAML sets what the command line does not (the command line
 * wins, value by value), and a file that is not that shape fails naming its line.
 */
Test(khorrun, config_file_settings_and_errors, .timeout = 60)
{
	char file[] = "/tmp/khorrun-config-XXXXXX";
	const char *flags[] = { "-np", "2", "--config-file", file, "--cycle-time-ms", "7",
		                "--no-timeline-mark-cycles", NULL };
	const char *names = "KHOR_FUSION_THRESHOLD KHOR_CYCLE_TIME HOROVOD_HIERARCHICAL_ALLREDUCE "
	                    "KHOR_AUTOTUNE KHOR_AUTOTUNE_LOG KHOR_TIMELINE KHOR_TIMELINE_MARK_CYCLES "
	                    "KHOR_STALL_CHECK_TIME HOROVOD_STALL_CHECK_DISABLE KHOR_LOG "
	                    "HOROVOD_THREAD_AFFINITY";
	static const char *const bad[][2] = {
		{ "params:\n  fusion_threshold_mb: 32\n    deeper: 1\n",
		  ":3: 'deeper' is nested deeper than one level" },
		{ "# ok\nparams:\n\tcycle_time_ms: 1\n", ":3: a tab in the indentation" },
		{ "params:\n  - 1\n", ":2: a list item" },
		{ "params: {cycle_time_ms: 1}\n", ":1: flow style" },
		{ "params:\n  cycle_time_ms 1\n", ":2: expected 'key: value'" },
		{ "\n\nparams:\n  cycle_time_ms: slow\n", ":4: params.cycle_time_ms wants a number" },
		{ "params:\n  cycle_time: 1\n", ":2: unknown key 'cycle_time' in section 'params'" },
		{ "controller: mpi\n", ":1: controller: mpi: khor has no such controller" },
		{ "parms:\n  cycle_time_ms: 1\n", ":1: unknown key 'parms'" },
		{ "timeline:\n  filename: 'a.json\n", ":2: unterminated ' quote" },
		{ "params:\n  cache_capacity: 1\n cycle_time_ms: 2\n",
		  ":3: 'cycle_time_ms' is indented unlike" },
	};
	const char *bad_args[] = { "-np", "1", "--config-file", file, "true", NULL };
	struct proc p;

	close(mkstemp(file));
	write_file(file, "# horovodrun --config-file\n"
	                 "---\n"
	                 "controller: gloo\n"
	                 "params:\n"
	                 "  fusion_threshold_mb: 16   # MB\n"
	                 "  cycle_time_ms: 3.5\n"
	                 "  hierarchical_allreduce: true\n"
	                 "\n"
	                 "autotune:\n"
	                 "  enabled: True\n"
	                 "  log_file: \"/tmp/a # b.csv\"\n"
	                 "timeline:\n"
	                 "  filename: 'it''s.json'\n"
	                 "  mark_cycles: yes\n"
	                 "stall_check:\n"
	                 "  enabled: false\n"
	                 "  warning_time_seconds: 5\n"
	                 "library_options:\n"
	                 "  thread_affinity: 3\n"
	                 "logging:\n"
	                 "  level: debug\n");
	p = run_show(flags, names, NULL);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	expect_in_ranks(&p, 2, "KHOR_FUSION_THRESHOLD=16777216");
	expect_in_ranks(&p, 2, "KHOR_CYCLE_TIME=7"); /* the flag, not the file's 3.5 */
	expect_in_ranks(&p, 2, "HOROVOD_HIERARCHICAL_ALLREDUCE=1");
	expect_in_ranks(&p, 2, "KHOR_AUTOTUNE=1");
	expect_in_ranks(&p, 2, "KHOR_AUTOTUNE_LOG=/tmp/a # b.csv");
	expect_in_ranks(&p, 2, "KHOR_TIMELINE=it's.json");
	expect_in_ranks(&p, 2, "KHOR_TIMELINE_MARK_CYCLES=0"); /* the flag again */
	expect_in_ranks(&p, 2, "KHOR_STALL_CHECK_TIME=0");
	expect_in_ranks(&p, 2, "HOROVOD_STALL_CHECK_DISABLE=1");
	expect_in_ranks(&p, 2, "HOROVOD_THREAD_AFFINITY=3");
	expect_in_ranks(&p, 2, "KHOR_LOG=debug");
	proc_free(&p);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[300];

		write_file(file, bad[i][0]);
		p = run(bad_args, 10);
		snprintf(want, sizeof(want), "khorrun: --config-file %s%s", file, bad[i][1]);
		cr_expect_eq(exit_code(&p), 2, "case %zu: stderr:\n%s", i, p.b[1].data);
		cr_expect_not_null(strstr(p.b[1].data, want), "case %zu: no '%s' in:\n%s", i, want,
		                   p.b[1].data);
		proc_free(&p);
	}
	unlink(file);
	bad_args[3] = "/nonexistent/khorrun.yaml";
	p = run(bad_args, 10);
	cr_assert_eq(exit_code(&p), 2, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, "/nonexistent/khorrun.yaml: No such file"), "%s",
	                   p.b[1].data);
	proc_free(&p);
}

/*
 * --check-build (and -cb) needs no program and no -np, and reports what the build has: its
 * last line is khor_build_info()'s exact words, checked against this build's own
 * definitions (KHOR_HAVE_IB comes from the transport layer this test links).
 */
Test(khorrun, check_build_reports_the_build, .timeout = 60)
{
	const char *args[] = { "--check-build", NULL };
	const char *cb[] = { "-cb", NULL };
	char want[160];
	struct proc p = run(args, 50);

	snprintf(want, sizeof(want), "version=%d.%d.%d tcp=1 shm=1 ib=%d ", KHOR_VERSION_MAJOR,
	         KHOR_VERSION_MINOR, KHOR_VERSION_PATCH,
#ifdef KHOR_HAVE_IB
	         1
#else
	         0
#endif
	);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	char last[200];

	snprintf(last, sizeof(last), "\n%s\n", khor_build_info());
	cr_assert_not_null(strstr(p.b[0].data, "\nversion="), "%s", p.b[0].data);
	cr_assert_str_eq(strstr(p.b[0].data, "\nversion="), last, "%s", p.b[0].data);
	cr_assert_not_null(strstr(khor_build_info(), want), "%s", khor_build_info());
	cr_assert_not_null(strstr(p.b[0].data, "    [X] tcp\n    [X] shm\n"), "%s", p.b[0].data);
	cr_assert_not_null(strstr(p.b[0].data, strstr(khor_build_info(), "ib=1") != NULL
	                                               ? "    [X] ib (verbs"
	                                               : "    [ ] ib (verbs"),
	                   "%s", p.b[0].data);
	/* PyTorch is marked exactly when this machine's python3 imports torch. */
	int torch = system("python3 -c 'import torch' >/dev/null 2>&1");
	cr_assert_not_null(strstr(p.b[0].data, torch == 0 ? "[X] PyTorch" : "[ ] PyTorch"), "%s",
	                   p.b[0].data);
	proc_free(&p);
	p = run(cb, 50);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[0].data, "Available Transports:"), "%s", p.b[0].data);
	proc_free(&p);
}

/* --output-filename pads rank.N as horovodrun does: to the digits of the last rank. */
Test(khorrun, output_filename_pads_rank_directories, .timeout = 60)
{
	char dir[] = "/tmp/khorrun-out-XXXXXX";
	const char *args[] = { "--output-filename", dir, "-np", "11", "/bin/sh", "-c",
		               "echo \"out $KHOR_RANK\"", NULL };
	struct proc p;

	cr_assert_not_null(mkdtemp(dir));
	p = run(args, 40);
	cr_assert_eq(exit_code(&p), 0, "stderr:\n%s", p.b[1].data);
	for (int r = 0; r < 11; r++) {
		char path[300], buf[64] = "", want[32];
		FILE *f;

		snprintf(path, sizeof(path), "%s/rank.%02d/stdout", dir, r);
		f = fopen(path, "r");
		cr_assert_not_null(f, "%s: %s", path, strerror(errno));
		buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
		fclose(f);
		snprintf(want, sizeof(want), "out %d\n", r);
		cr_assert_str_eq(buf, want, "%s", path);
		unlink(path);
		snprintf(path, sizeof(path), "%s/rank.%02d/stderr", dir, r);
		unlink(path);
		snprintf(path, sizeof(path), "%s/rank.%02d", dir, r);
		cr_assert_eq(rmdir(path), 0, "%s: %s", path, strerror(errno));
	}
	cr_assert_eq(rmdir(dir), 0, "%s left over: %s", dir, strerror(errno));
	proc_free(&p);
}
