/*
 * test_elastic_driver.c -- khorrun's elastic driver with real workers (elastic_worker.c,
 * on the public C API and the real core): a worker killed, exiting 1 or stopped (fenced
 * by its heartbeat), on one host (a fresh worker takes the slot) and on two hosts of this
 * machine, "localhost" and "127.0.0.1" (the failed host is blacklisted, its other workers
 * dropped); a discovery script that adds and removes a host, fails at its first run,
 * later, or hangs; --reset-limit and --elastic-timeout; a host reached over (a stand-in
 * for) ssh. Each case reads what the user reads: khorrun's exit status and stderr, and the
 * workers' own lines ("join W gen G rank R size S ..."), and ends the job through the
 * workers' stop file once it has seen what it came for.
 */
#include <criterion/criterion.h>

#include "tests/support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Short waits, no cost measuring at init: the tests are about membership. */
static const char *const job_env[] = {
	"KHOR_TIMEOUT=20s", "KHOR_COST_ALPHA_US=5", "KHOR_COST_BETA_GBPS=2",
	"KHOR_COST_GAMMA_GBPS=4", "KHOR_HEARTBEAT_TIMEOUT=10s", NULL,
};

static char dir[64], stop_file[128], stop_x[160];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/khor-elastic-XXXXXX");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(stop_file, sizeof(stop_file), "%s/stop", dir);
	snprintf(stop_x, sizeof(stop_x), "EW_STOP=%s", stop_file);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

TestSuite(elastic_driver, .init = setup, .fini = teardown, .timeout = 60);

static const char *worker(void)
{
	const char *w = getenv("ELASTIC_WORKER");

	return w != NULL && *w != '\0' ? w : "./elastic_worker";
}

static void write_file(const char *path, const char *text)
{
	char tmp[256];
	FILE *f;

	/* Whole or not at all: a discovery script must never read half a host list. */
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	cr_assert_not_null(f, "%s: %s", tmp, strerror(errno));
	fputs(text, f);
	fclose(f);
	cr_assert_eq(rename(tmp, path), 0);
}

/* Ends the job as its workers see fit: all of them finish at the same step. */
static void finish(struct proc *p)
{
	write_file(stop_file, "");
	proc_finish(p, 30);
}

/* The pid of the n-th (1-based) worker that started as id, waiting for it. */
static pid_t pid_of(struct proc *p, const char *id, size_t n)
{
	char needle[128];
	const char *s;

	snprintf(needle, sizeof(needle), "] up %s pid ", id);
	wait_for(p, needle, n, 20);
	s = p->b[0].data;
	for (size_t i = 0; i < n; i++)
		s = strstr(s, needle) + strlen(needle);
	return (pid_t)atoi(s);
}

static void expect(const struct proc *p, int k, const char *text)
{
	cr_assert_not_null(strstr(p->b[k].data, text), "no '%s' in khorrun's %s:\n%s\n--\n%s", text,
	                   k == 0 ? "stdout" : "stderr", p->b[0].data, p->b[1].data);
}

static void expect_status(const struct proc *p, int want)
{
	cr_assert_eq(exit_code(p), want, "khorrun exited %d, not %d\nstdout:\n%s\nstderr:\n%s",
	             exit_code(p), want, p->b[0].data, p->b[1].data);
}

/* A worker killed on a one-host job: a fresh one takes its slot, the survivor goes on. */
Test(elastic_driver, one_host_kill9_starts_a_fresh_worker)
{
	const char *args[] = { "--min-np", "2", "-np", "2", "-x", stop_x, worker(), "1000000", "5",
		               NULL };
	struct proc p;
	pid_t old;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	expect(&p, 0, "[localhost:1] up localhost:1 pid ");
	expect(&p, 0, " rank 1 size 2 host localhost elastic 1\n");
	old = pid_of(&p, "localhost:1", 1);
	cr_assert_eq(kill(old, SIGKILL), 0);
	wait_for(&p, "join localhost:1 gen 2 rank 1 size 2 local 1/2", 1, 20);
	wait_for(&p, "join localhost:0 gen 2 rank 0 size 2 local 0/2", 1, 20);
	cr_assert_neq(pid_of(&p, "localhost:1", 2), old);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 1 on localhost (worker localhost:1) "
	              "was lost: killed by signal 9 (SIGKILL); a fresh worker takes its slot\n");
	expect(&p, 1, "khorrun: elastic: generation 2: 2 ranks on 1 host (localhost:2)\n");
	/* The survivor heard it from the driver, with who, where and why. */
	expect(&p, 0, "lost localhost:0 gen 1: ");
	expect(&p, 0, "rank 1 on localhost (worker localhost:1) was lost in generation 1: killed "
	              "by signal 9 (SIGKILL)");
	expect(&p, 0, "done localhost:0 gen 2 rank 0 size 2");
	expect(&p, 0, "done localhost:1 gen 2 rank 1 size 2");
	proc_free(&p);
}

/* Two hosts of this machine: the failed worker's host is out, the job goes on halved. */
Test(elastic_driver, two_hosts_kill9_blacklists_the_host)
{
	const char *args[] = { "-H", "localhost:2,127.0.0.1:2", "--min-np", "2", "-np", "4", "-x",
		               stop_x, worker(), "1000000", "5", NULL };
	struct proc p;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 4, 20);
	expect(&p, 0, "[127.0.0.1:1] up 127.0.0.1:1 pid ");
	expect(&p, 0, " rank 3 size 4 host 127.0.0.1 elastic 1\n");
	cr_assert_eq(kill(pid_of(&p, "127.0.0.1:0", 1), SIGKILL), 0);
	wait_for(&p, "join localhost:0 gen 2 rank 0 size 2 local 0/2", 1, 20);
	wait_for(&p, "join localhost:1 gen 2 rank 1 size 2 local 1/2", 1, 20);
	wait_for(&p, "removed 127.0.0.1:1: ", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 2 on 127.0.0.1 (worker 127.0.0.1:0) "
	              "was lost: killed by signal 9 (SIGKILL); host 127.0.0.1 blacklisted\n");
	expect(&p, 1, "khorrun: elastic: generation 2: 2 ranks on 1 host (localhost:2); "
	              "1 dropped\n");
	cr_assert_eq(count_str(p.b[0].data, "] up "), 4, "no worker was started again:\n%s",
	             p.b[0].data);
	proc_free(&p);
}

/* A worker that exits 1 is lost as a killed one is. */
Test(elastic_driver, worker_exiting_1)
{
	const char *args[] = { "--min-np", "2", "-np", "2", "-x", stop_x, "-x",
		               "EW_EXIT=localhost:0@20", worker(), "1000000", "5", NULL };
	struct proc p;

	proc_start(&p, args, job_env);
	wait_for(&p, "exit1 localhost:0 gen 1 step 20", 1, 20);
	wait_for(&p, "join localhost:0 gen 2 rank 0 size 2", 1, 20);
	wait_for(&p, "join localhost:1 gen 2 rank 1 size 2", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 0 on localhost (worker localhost:0) "
	              "was lost: exited with status 1; a fresh worker takes its slot\n");
	expect(&p, 0, "was lost in generation 1: exited with status 1");
	proc_free(&p);
}

/* A stopped worker: its heartbeat stalls, khorrun kills it and the generation ends. */
Test(elastic_driver, stopped_worker_is_fenced)
{
	const char *args[] = { "--min-np", "2", "-np", "3", "-x", stop_x, "-x",
		               "KHOR_HEARTBEAT_TIMEOUT=2s", worker(), "1000000", "5", NULL };
	struct proc p;
	pid_t stopped;
	double t0, took;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 3, 20);
	stopped = pid_of(&p, "localhost:1", 1);
	cr_assert_eq(kill(stopped, SIGSTOP), 0);
	t0 = now_s();
	wait_for_in(&p, 1, "was lost: its heartbeat stopped for ", 1, 20);
	took = now_s() - t0;
	wait_for(&p, "join localhost:1 gen 2 rank 1 size 3", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	/* The contract's bound: fenced within the heartbeat timeout and 2 s. */
	cr_assert_lt(took, 4.0, "fenced %.2f s after SIGSTOP", took);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 1 on localhost (worker localhost:1) "
	              "was lost: its heartbeat stopped for ");
	expect(&p, 1, "(KHOR_HEARTBEAT_TIMEOUT 2.0 s); khorrun killed it; a fresh worker takes its "
	              "slot\n");
	cr_assert(pid_gone(stopped), "the stopped worker %d was not killed", (int)stopped);
	proc_free(&p);
}

/* The discovery script adds a host (its worker starts), then takes it away (dropped). */
Test(elastic_driver, discovery_adds_and_removes_a_host)
{
	char hosts[160], script[200];
	const char *args[] = { "--min-np", "2", "--host-discovery-script", script, "-x", stop_x,
		               worker(), "1000000", "5", NULL };
	struct proc p;

	snprintf(hosts, sizeof(hosts), "%s/hosts", dir);
	snprintf(script, sizeof(script), "cat %s", hosts);
	write_file(hosts, "localhost:2\n");
	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	write_file(hosts, "localhost:2\n127.0.0.1:1\n");
	wait_for(&p, "hosts localhost:0 gen 1 updated 1\n", 1, 20);
	wait_for(&p, "join 127.0.0.1:0 gen 2 rank 2 size 3 local 0/1", 1, 20);
	wait_for(&p, "join localhost:1 gen 2 rank 1 size 3 local 1/2", 1, 20);
	write_file(hosts, "localhost:2\n");
	wait_for(&p, "hosts localhost:1 gen 2 updated 2\n", 1, 20);
	wait_for(&p, "removed 127.0.0.1:0: ", 1, 20);
	wait_for(&p, "join localhost:0 gen 3 rank 0 size 2", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: hosts added during generation 1; the ranks go to a new "
	              "generation at their next commit (localhost:2, 127.0.0.1:1)\n");
	expect(&p, 1, "khorrun: elastic: generation 2: 3 ranks on 2 hosts (localhost:2, "
	              "127.0.0.1:1)\n");
	expect(&p, 1, "khorrun: elastic: hosts removed during generation 2");
	expect(&p, 1, "khorrun: elastic: generation 3: 2 ranks on 1 host (localhost:2); "
	              "1 dropped\n");
	proc_free(&p);
}

/* --reset-limit 1: the second loss would need a third generation. Horovod's message. */
Test(elastic_driver, reset_limit_exceeded)
{
	const char *args[] = { "--min-np", "2", "-np", "2", "--reset-limit", "1", "-x", stop_x,
		               worker(), "1000000", "5", NULL };
	struct proc p;
	pid_t pids[3];

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	pids[0] = pid_of(&p, "localhost:0", 1);
	cr_assert_eq(kill(pid_of(&p, "localhost:1", 1), SIGKILL), 0);
	wait_for(&p, " gen 2 rank ", 2, 20);
	pids[1] = pid_of(&p, "localhost:1", 2);
	pids[2] = pid_of(&p, "localhost:1", 1);
	cr_assert_eq(kill(pids[1], SIGKILL), 0);
	proc_finish(&p, 30);
	expect_status(&p, 3);
	expect(&p, 1, "khorrun: Horovod was shutdown because number of resets during elastic job "
	              "exceeded limit: 1\n");
	assert_all_gone(pids, 3);
	proc_free(&p);
}

/* Fewer slots than --min-np for --elastic-timeout: the job fails saying what there is. */
Test(elastic_driver, min_np_never_reached)
{
	const char *args[] = { "-H", "localhost:1,127.0.0.1:1", "--min-np", "2",
		               "--elastic-timeout", "2", "-x", stop_x, worker(), "1000000", "5",
		               NULL };
	struct proc p;
	pid_t survivor;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	survivor = pid_of(&p, "localhost:0", 1);
	cr_assert_eq(kill(pid_of(&p, "127.0.0.1:0", 1), SIGKILL), 0);
	proc_finish(&p, 30);
	expect_status(&p, 1);
	expect(&p, 1, "khorrun: elastic: generation 2 waits for 2 slots: 1 slot available "
	              "(localhost:1), 2 needed; blacklisted: 127.0.0.1 (for good) (at most 2 s, "
	              "--elastic-timeout)\n");
	expect(&p, 1, "khorrun: elastic: timed out after 2 s (--elastic-timeout) waiting for the "
	              "slots of generation 2: 1 slot available (localhost:1), 2 needed; "
	              "blacklisted: 127.0.0.1 (for good). Check that there are enough hosts to run "
	              "at least 2 processes\n");
	assert_all_gone(&survivor, 1);
	proc_free(&p);
}

/* The script's first run fails: nothing starts. */
Test(elastic_driver, discovery_fails_at_its_first_run)
{
	const char *args[] = { "--min-np", "1", "--host-discovery-script",
		               "echo no inventory >&2; exit 3", worker(), "10", "5", NULL };
	struct proc p = run(args, 20);

	expect_status(&p, 1);
	expect(&p, 1, "no inventory\n");
	expect(&p, 1, "khorrun: elastic: the host discovery script failed on its first run, so the "
	              "job does not start: it exited with status 3\n");
	cr_assert_eq(p.b[0].len, 0, "something started:\n%s", p.b[0].data);
	proc_free(&p);
}

/* A first run that hangs is killed (with what it started) after its timeout. */
Test(elastic_driver, discovery_hangs_at_its_first_run)
{
	char script[200], pidfile[160], buf[32] = "";
	const char *args[] = { "--min-np", "1", "--host-discovery-timeout", "500ms",
		               "--host-discovery-script", script, worker(), "10", "5", NULL };
	struct proc p;
	FILE *f;

	snprintf(pidfile, sizeof(pidfile), "%s/pid", dir);
	snprintf(script, sizeof(script), "sleep 100 & echo $! > %s; wait", pidfile);
	p = run(args, 20);
	expect_status(&p, 1);
	expect(&p, 1, "khorrun: elastic: the host discovery script failed on its first run, so the "
	              "job does not start: it did not finish within 0.5 s "
	              "(--host-discovery-timeout)\n");
	f = fopen(pidfile, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	cr_assert(pid_gone(atoi(buf)), "the script's sleep (pid %s) outlived it", buf);
	proc_free(&p);
}

/* Later failures are said (once, not every second) and the job goes on with its hosts. */
Test(elastic_driver, discovery_fails_later)
{
	char script[400], flag[160], runs[160];
	const char *args[] = { "--min-np", "2", "--host-discovery-script", script, "-x", stop_x,
		               worker(), "1000000", "5", NULL };
	struct proc p;

	snprintf(flag, sizeof(flag), "%s/broken", dir);
	snprintf(runs, sizeof(runs), "%s/runs", dir);
	snprintf(script, sizeof(script),
	         "echo run >> %s; if [ -e %s ]; then echo no inventory >&2; exit 4; fi; "
	         "echo localhost:2", runs, flag);
	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	write_file(flag, "");
	wait_for_in(&p, 1, "failed: it exited with status 4", 1, 20);
	/* Two more runs fail the same way: still said once. */
	{
		double deadline = now_s() + 20;
		size_t n0 = 0;
		FILE *f = fopen(runs, "r");
		char line[16];

		while (f != NULL && fgets(line, sizeof(line), f) != NULL)
			n0++;
		if (f != NULL)
			fclose(f);
		for (size_t n = n0; n < n0 + 2 && now_s() < deadline;) {
			proc_pump(&p, 200);
			n = 0;
			f = fopen(runs, "r");
			while (f != NULL && fgets(line, sizeof(line), f) != NULL)
				n++;
			if (f != NULL)
				fclose(f);
		}
	}
	cr_assert_eq(unlink(flag), 0);
	wait_for_in(&p, 1, "khorrun: elastic: the host discovery script works again\n", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: the host discovery script failed: it exited with status "
	              "4; the hosts stay as they were, and it runs again every second\n");
	cr_assert_eq(count_str(p.b[1].data, "failed: it exited with status 4"), 1, "%s",
	             p.b[1].data);
	cr_assert_eq(count_str(p.b[0].data, " gen 2 "), 0, "the failure changed the job:\n%s",
	             p.b[0].data);
	proc_free(&p);
}

/*
 * A host reached over ssh (a stand-in that runs ssh's remote command here, as a real ssh
 * would there): its worker starts through the remote helper, its output and exit come back
 * through it, and khorrun fences it there when it stops.
 */
Test(elastic_driver, worker_over_ssh_is_fenced_through_its_helper)
{
	const char *args[] = { "--ssh-command", "/bin/sh -c 'exec /bin/sh -c \"$1\"'", "-H",
		               "localhost:1,192.0.2.1:1", "--min-np", "1", "-np", "2", "-x", stop_x,
		               "-x", "KHOR_HEARTBEAT_TIMEOUT=2s", worker(), "1000000", "5", NULL };
	struct proc p;
	pid_t remote;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	expect(&p, 0, "[192.0.2.1:0] up 192.0.2.1:0 pid ");
	expect(&p, 0, " rank 1 size 2 host 192.0.2.1 elastic 1\n");
	remote = pid_of(&p, "192.0.2.1:0", 1);
	cr_assert_eq(kill(remote, SIGSTOP), 0);
	wait_for(&p, "join localhost:0 gen 2 rank 0 size 1", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 1 on 192.0.2.1 (worker 192.0.2.1:0) "
	              "was lost: its heartbeat stopped for ");
	expect(&p, 1, "khorrun killed it; host 192.0.2.1 blacklisted\n");
	cr_assert(pid_gone(remote), "the stopped worker %d was not killed", (int)remote);
	proc_free(&p);
}

/* A host whose workers cannot even start (ssh refused) is blacklisted; the rest goes on. */
Test(elastic_driver, host_that_cannot_be_reached_is_left_out)
{
	const char *args[] = { "--ssh-command",
		               "/bin/sh -c 'echo \"ssh: connect to host $0 port 22: Connection "
		               "refused\" >&2; exit 255'",
		               "-H", "localhost:1,192.0.2.1:1", "--min-np", "1", "-np", "2", "-x",
		               stop_x, worker(), "1000000", "5", NULL };
	struct proc p;

	proc_start(&p, args, job_env);
	wait_for(&p, "join localhost:0 gen 2 rank 0 size 1", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: cannot start worker 192.0.2.1:0 on 192.0.2.1: ssh: connect to host "
	              "192.0.2.1 port 22: Connection refused\n");
	expect(&p, 1, "khorrun: elastic: generation 1: rank 1 on 192.0.2.1 (worker 192.0.2.1:0) "
	              "was lost: it could not be started there: ssh: connect to host 192.0.2.1 "
	              "port 22: Connection refused; host 192.0.2.1 blacklisted\n");
	proc_free(&p);
}

/*
 * A job on one other host whose ssh starts refusing (its sshd died): after a loss there
 * the fresh worker cannot be started, and another would fail the same way, generation
 * after generation. That host is blacklisted like a failed host of a larger job, and the
 * job ends with the host and ssh's error named.
 */
Test(elastic_driver, one_host_whose_ssh_refuses_is_a_named_failure)
{
	char ssh[160], down[160];
	const char *args[] = { "--ssh-command", ssh, "-H", "192.0.2.1:2", "--min-np", "1", "-np",
		               "2", "-x", stop_x, worker(), "1000000", "5", NULL };
	FILE *f;
	struct proc p;

	/*
	 * A stand-in for ssh (not named ssh, which would get ssh's options) that runs the
	 * remote command here, until DIR/down exists.
	 */
	snprintf(ssh, sizeof(ssh), "%s/fake-ssh", dir);
	snprintf(down, sizeof(down), "%s/down", dir);
	f = fopen(ssh, "w");
	cr_assert_not_null(f);
	fprintf(f, "#!/bin/sh\nif [ -e %s ]; then\n"
	           "\techo \"ssh: connect to host $1 port 22: Connection refused\" >&2\n"
	           "\texit 255\nfi\nexec /bin/sh -c \"$2\"\n", down);
	fclose(f);
	cr_assert_eq(chmod(ssh, 0755), 0);
	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 2, 20);
	write_file(down, "");
	cr_assert_eq(kill(pid_of(&p, "192.0.2.1:1", 1), SIGKILL), 0);
	proc_finish(&p, 30);
	expect_status(&p, 1);
	expect(&p, 1, "khorrun: elastic: generation 1: rank 1 on 192.0.2.1 (worker 192.0.2.1:1) was "
	              "lost: killed by signal 9 (SIGKILL); a fresh worker takes its slot\n");
	expect(&p, 1, "khorrun: elastic: generation 2: rank 1 on 192.0.2.1 (worker 192.0.2.1:1) was "
	              "lost: it could not be started there: ssh: connect to host 192.0.2.1 port 22: "
	              "Connection refused; host 192.0.2.1 blacklisted\n");
	expect(&p, 1, "khorrun: elastic: every host of generation 2 is blacklisted; the job cannot "
	              "go on\n");
	cr_assert_eq(count_str(p.b[0].data, "] up "), 2, "a worker was started again:\n%s",
	             p.b[0].data);
	proc_free(&p);
}

/*
 * A survivor stopped between generations (after its khor_finalize, before it joins the
 * next): it has no heartbeat in either, and every generation would wait for it until
 * KHOR_INIT_TIMEOUT and plan it again. Its old heartbeat stopped: fenced like a stalled
 * rank, within the heartbeat timeout of the plan.
 */
Test(elastic_driver, survivor_stopped_between_generations_is_fenced)
{
	const char *args[] = { "--min-np", "2", "-np", "3", "-x", stop_x, "-x",
		               "KHOR_HEARTBEAT_TIMEOUT=2s", "-x", "EW_STOP_REJOIN=localhost:2",
		               worker(), "1000000", "5", NULL };
	struct proc p;
	pid_t stopped;

	proc_start(&p, args, job_env);
	wait_for(&p, " gen 1 rank ", 3, 20);
	stopped = pid_of(&p, "localhost:2", 1);
	cr_assert_eq(kill(pid_of(&p, "localhost:1", 1), SIGKILL), 0);
	wait_for(&p, "between localhost:2: stopping", 1, 20);
	wait_for(&p, "join localhost:2 gen 3 rank 2 size 3", 1, 20);
	finish(&p);
	expect_status(&p, 0);
	expect(&p, 1, "khorrun: elastic: generation 2: rank 2 on localhost (worker localhost:2) was "
	              "lost: its heartbeat stopped for ");
	expect(&p, 1, " s since it left generation 1, and it has not joined generation 2 "
	              "(KHOR_HEARTBEAT_TIMEOUT 2.0 s); khorrun killed it; a fresh worker takes its "
	              "slot\n");
	cr_assert(pid_gone(stopped), "the stopped worker %d was not killed", (int)stopped);
	proc_free(&p);
}
