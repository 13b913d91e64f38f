/*
 * test_elastic_etcd.c -- an elastic job over etcd with no khorrun of its own: one khorrun
 * agent per "host" (two or three on this machine, with --rdzv-host names of their own) and
 * a real etcd server the test starts (tests/rendezvous/etcd_proc.h), running the driver's
 * test worker (elastic_worker.c). The leader agent killed: another takes over and the job
 * goes on without that host. etcd killed and restarted within the agents' lease: the job
 * does not notice. A worker that exits 1: its host is blacklisted by the leader, its other
 * worker dropped, the job goes on. An agent that comes late: the job grows to its slots.
 * Every job that ends leaves no key of its own in etcd. Each case reads what the user reads: the agents' exit
 * statuses and stderr, and the workers' own lines.
 */
#include <criterion/criterion.h>

#include "tests/rendezvous/etcd_proc.h"
#include "tests/support/proc.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Short waits, no cost measuring at init: the tests are about membership. */
static const char *const job_env[] = {
	"KHOR_TIMEOUT=20s", "KHOR_COST_ALPHA_US=5", "KHOR_COST_BETA_GBPS=2",
	"KHOR_COST_GAMMA_GBPS=4", "KHOR_HEARTBEAT_TIMEOUT=10s", NULL,
};

static struct etcd_proc server;
static char endpoint[64], stop_file[160], stop_x[200], job[64];

static void setup(void)
{
	etcd_up(&server);
	snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%u", server.port);
	snprintf(stop_file, sizeof(stop_file), "%s/stop", server.dir);
	snprintf(stop_x, sizeof(stop_x), "EW_STOP=%s", stop_file);
	snprintf(job, sizeof(job), "ej-%d", (int)getpid());
}

static void teardown(void)
{
	etcd_down(&server);
}

TestSuite(elastic_etcd, .init = setup, .fini = teardown, .timeout = 60);

static const char *worker(void)
{
	const char *w = getenv("ELASTIC_WORKER");

	return w != NULL && *w != '\0' ? w : "./elastic_worker";
}

static void nap(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* An agent of this test's job for host; extra ("VAR=VALUE" or NULL) goes to its workers. */
static void agent_max(struct proc *p, const char *host, const char *np, const char *max,
                      const char *extra)
{
	const char *args[32];
	int n = 0;

	args[n++] = "--rdzv-backend";
	args[n++] = "etcd";
	args[n++] = "--rdzv-endpoint";
	args[n++] = endpoint;
	args[n++] = "--rdzv-id";
	args[n++] = job;
	args[n++] = "--rdzv-host";
	args[n++] = host;
	args[n++] = "--rdzv-ttl"; /* a killed agent's host is gone 2 s later */
	args[n++] = "2";
	args[n++] = "--slots-per-host";
	args[n++] = "2";
	args[n++] = "-np";
	args[n++] = np;
	args[n++] = "--min-np";
	args[n++] = "2";
	if (max != NULL) {
		args[n++] = "--max-np";
		args[n++] = max;
	}
	args[n++] = "-x";
	args[n++] = stop_x;
	if (extra != NULL) {
		args[n++] = "-x";
		args[n++] = extra;
	}
	args[n++] = worker();
	args[n++] = "1000000";
	args[n++] = "5";
	args[n] = NULL;
	proc_start(p, args, job_env);
}

static void agent(struct proc *p, const char *host, const char *np, const char *extra)
{
	agent_max(p, host, np, NULL, extra);
}

static void expect(const struct proc *p, int k, const char *text)
{
	cr_assert_not_null(strstr(p->b[k].data, text), "no '%s' in the agent's %s:\n%s\n--\n%s",
	                   text, k == 0 ? "stdout" : "stderr", p->b[0].data, p->b[1].data);
}

static void expect_status(const struct proc *p, int want)
{
	cr_assert_eq(exit_code(p), want, "the agent exited %d, not %d\nstdout:\n%s\nstderr:\n%s",
	             exit_code(p), want, p->b[0].data, p->b[1].data);
}

/* How many keys etcd holds under the job's prefix ("<job>/"). */
static int job_keys(void)
{
	char prefix[80];
	struct etcd_kv *kvs;
	etcd *e;
	int n = -1;
	kerr err;

	snprintf(prefix, sizeof(prefix), "%s/", job);
	cr_assert_eq(etcd_open("127.0.0.1", server.port, kdeadline_in_ms(5000), &e, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(etcd_list(e, prefix, kdeadline_in_ms(5000), &kvs, &n, &err), KHOR_SUCCESS,
	             "%s", err.text);
	etcd_kvs_free(kvs, n);
	etcd_close(e);
	return n;
}

/* The last agent out deleted every key of the finished job. */
static void expect_no_keys_left(void)
{
	int n = job_keys();
	cr_assert_eq(n, 0, "etcd still holds %d keys of the finished job %s", n, job);
}

/* Every rank finishes at the same step; each agent then exits with the job's status. */
static void finish(struct proc *ps, int n)
{
	FILE *f = fopen(stop_file, "w");

	cr_assert_not_null(f, "%s: %s", stop_file, strerror(errno));
	fclose(f);
	for (int i = 0; i < n; i++)
		proc_finish(&ps[i], 30);
}

Test(elastic_etcd, leader_killed_another_leads_and_the_job_goes_on)
{
	struct proc p[2];
	pid_t pids[2];

	agent(&p[0], "hA", "4", NULL);
	wait_for_in(&p[0], 1, "generation 1 waits for 4 slots", 1, 20); /* hA leads */
	agent(&p[1], "hB", "4", NULL);
	wait_for(&p[0], " gen 1 rank ", 2, 20);
	wait_for(&p[1], " gen 1 rank ", 2, 20);
	cr_assert_eq(collect_pids(p[0].b[0].data, " pid ", pids, 2), 2);
	/* The leader's host goes: its agent and (they die with it) its workers. */
	cr_assert_eq(kill(p[0].pid, SIGKILL), 0);
	wait_for(&p[1], "join hB:0 gen 2 rank 0 size 2 local 0/2", 1, 30);
	wait_for(&p[1], "join hB:1 gen 2 rank 1 size 2 local 1/2", 1, 30);
	assert_all_gone(pids, 2);
	finish(&p[1], 1);
	proc_finish(&p[0], 10);
	expect_status(&p[1], 0);
	expect(&p[1], 1, "khorrun: agent hB: leads the job now, from generation 1\n");
	expect(&p[1], 1, "rank 0 on hA (worker hA:0) was lost: its host's agent is gone (its etcd "
	                 "lease expired)");
	expect(&p[1], 1, "khorrun: elastic: generation 2: 2 ranks on 1 host (hB:2)\n");
	expect(&p[1], 0, "done hB:0 gen 2 rank 0 size 2");
	expect_no_keys_left();
	proc_free(&p[0]);
	proc_free(&p[1]);
}

Test(elastic_etcd, etcd_restarted_within_the_lease_the_job_goes_on)
{
	struct proc p[2];

	agent(&p[0], "hA", "4", NULL);
	wait_for_in(&p[0], 1, "generation 1 waits for 4 slots", 1, 20); /* hA leads */
	agent(&p[1], "hB", "4", NULL);
	wait_for(&p[0], " gen 1 rank ", 2, 20);
	wait_for(&p[1], " gen 1 rank ", 2, 20);
	/* etcd dies under the running job and comes back on its data before a lease ends. */
	etcd_kill(&server, SIGKILL);
	nap(500);
	etcd_restart(&server);
	nap(1500);
	finish(p, 2);
	for (int i = 0; i < 2; i++) {
		expect_status(&p[i], 0);
		cr_assert_null(strstr(p[i].b[0].data, " gen 2 "), "the job changed generation:\n%s",
		               p[i].b[0].data);
	}
	expect(&p[0], 0, "done hA:0 gen 1 rank 0 size 4");
	expect(&p[1], 0, "done hB:1 gen 1 rank 3 size 4");
	expect_no_keys_left();
	proc_free(&p[0]);
	proc_free(&p[1]);
}

Test(elastic_etcd, a_failed_worker_blacklists_its_host)
{
	struct proc p[2];

	agent(&p[0], "hA", "4", NULL);
	wait_for_in(&p[0], 1, "generation 1 waits for 4 slots", 1, 20);
	agent(&p[1], "hB", "4", "EW_EXIT=hB:1@30");
	wait_for(&p[1], "exit1 hB:1 gen 1", 1, 20);
	/* Its host is out: the other worker there is dropped, hA's go on in generation 2. */
	wait_for(&p[1], "removed hB:0", 1, 30);
	wait_for(&p[0], "join hA:1 gen 2 rank 1 size 2", 1, 30);
	finish(p, 2);
	expect_status(&p[0], 0);
	expect_status(&p[1], 0);
	expect(&p[0], 1, "khorrun: elastic: generation 1: rank 3 on hB (worker hB:1) was lost: "
	                 "exited with status 1; host hB blacklisted\n");
	expect(&p[0], 0, "lost hA:0 gen 1: ");
	expect(&p[0], 0, "rank 3 on hB (worker hB:1) was lost in generation 1: exited with status 1");
	expect(&p[0], 0, "done hA:0 gen 2 rank 0 size 2");
	expect_no_keys_left();
	proc_free(&p[0]);
	proc_free(&p[1]);
}

Test(elastic_etcd, a_late_agent_grows_the_job)
{
	struct proc p[3];

	agent_max(&p[0], "hA", "4", "6", NULL);
	wait_for_in(&p[0], 1, "generation 1 waits for 4 slots", 1, 20);
	agent_max(&p[1], "hB", "4", "6", NULL);
	wait_for(&p[0], " gen 1 rank ", 2, 20);
	agent_max(&p[2], "hC", "4", "6", NULL);
	/* The ranks hear of the new host at their next check and rejoin, six now. */
	wait_for(&p[2], "join hC:1 gen 2 rank 5 size 6 local 1/2", 1, 30);
	wait_for(&p[0], "join hA:0 gen 2 rank 0 size 6", 1, 30);
	finish(p, 3);
	for (int i = 0; i < 3; i++)
		expect_status(&p[i], 0);
	expect(&p[0], 0, "hosts hA:0 gen 1 updated 1");
	expect(&p[0], 1, "khorrun: elastic: hosts added during generation 1; the ranks go to a new "
	                 "generation at their next commit\n");
	expect(&p[0], 1, "khorrun: elastic: generation 2: 6 ranks on 3 hosts (hA:2, hB:2, hC:2)\n");
	expect_no_keys_left();
	for (int i = 0; i < 3; i++)
		proc_free(&p[i]);
}

static void expect_refusal(const char *const *args, int status, const char *msg)
{
	struct proc p = run(args, 20);

	cr_assert_eq(exit_code(&p), status, "stderr:\n%s", p.b[1].data);
	cr_assert_not_null(strstr(p.b[1].data, msg), "wanted '%s' in:\n%s", msg, p.b[1].data);
	proc_free(&p);
}

Test(elastic_etcd, command_lines_and_a_host_taken_twice)
{
	const char *zk[] = { "--rdzv-backend", "zk", "-np", "2", "true", NULL };
	const char *noend[] = { "--rdzv-backend", "etcd", "-np", "2", "true", NULL };
	const char *alone[] = { "--rdzv-id", "j", "-np", "2", "true", NULL };
	const char *hosts[] = { "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id",
		                "j", "-H", "a:2", "true", NULL };
	const char *badhost[] = { "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
		                  "--rdzv-id", "j", "--rdzv-host", "a:b", "true", NULL };
	const char *twice[] = { "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id",
		                job, "--rdzv-host", "hA", "-np", "4", "true", NULL };
	struct proc p;

	expect_refusal(zk, 2, "--rdzv-backend wants etcd, not 'zk'");
	expect_refusal(noend, 2, "needs --rdzv-endpoint HOST:PORT");
	expect_refusal(alone, 2, "go with --rdzv-backend etcd");
	expect_refusal(hosts, 2, "an etcd job's hosts are its agents");
	expect_refusal(badhost, 2, "--rdzv-host wants a host name");
	/* Two live agents cannot be one host: the second is told, the first goes on. */
	agent(&p, "hA", "4", NULL);
	wait_for_in(&p, 1, "generation 1 waits for 4 slots", 1, 20);
	expect_refusal(twice, 1, "another agent of job");
	cr_assert_eq(kill(p.pid, SIGTERM), 0);
	proc_finish(&p, 20);
	proc_free(&p);
}
