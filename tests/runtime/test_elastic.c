/*
 * test_elastic.c -- the C core's side of an elastic job (docs/ELASTIC.md), with this test
 * process as the driver: it serves a real store (khor's, or an etcd server it starts),
 * writes the plans, kills a worker, ends its generation and watches the real worker
 * processes leave one generation and join the next in-process, with new ranks, size and
 * links.
 */
#include "runtime/elastic.h"
#include "tests/harness.h"
#include "transport/transport.h"
#include "tests/rendezvous/etcd_proc.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define NW 3
#define TEXT 1024
#define JOB "eljob"
#define SECRET "elastic-test-secret"

struct worker_view {
	_Atomic int gen, rank, size, local_rank, iters;
	_Atomic int status; /* the last khor_status of a failed call */
	double failed_at;  /* harness_now() of the first failure */
	char err[TEXT];    /* its text */
	_Atomic int hosts_seen; /* khor_hosts_updated as the allreduce of it said */
};

struct shared {
	struct worker_view w[NW];
	_Atomic int stop;
};

static char store_addr[64]; /* KHOR_STORE_ADDR of the workers */

static void worker_env(int i)
{
	char v[64];
	setenv("KHOR_ELASTIC", "1", 1);
	snprintf(v, sizeof(v), "h:%d", i);
	setenv("KHOR_WORKER_ID", v, 1);
	setenv("KHOR_HOSTNAME", "h", 1);
	setenv("KHOR_STORE_ADDR", store_addr, 1);
	setenv("KHOR_SECRET", SECRET, 1);
	setenv("KHOR_JOB_ID", JOB, 1);
	setenv("KHOR_TIMEOUT", "20s", 1);
	setenv("KHOR_ELASTIC_TIMEOUT", "30s", 1);
	setenv("KHOR_HEARTBEAT_INTERVAL", "100ms", 1);
	setenv("KHOR_COST_ALPHA_US", "5", 1); /* no measuring: the test is about membership */
	setenv("KHOR_COST_BETA_GBPS", "2", 1);
	setenv("KHOR_COST_GAMMA_GBPS", "4", 1);
}

/* A worker as a training loop would be: allreduce, check, and on a loss rejoin. */
static int worker(int i, struct shared *sh)
{
	struct worker_view *me = &sh->w[i];
	size_t count = 1 << 14;
	float *buf = malloc(count * sizeof(float));
	char err[TEXT];

	worker_env(i);
	for (;;) {
		khor_comm *c;
		khor_status st = khor_init(NULL, err, sizeof(err), &c);
		if (st == KHOR_ERR_REMOVED)
			return 0;
		if (st != KHOR_SUCCESS)
			return harness_fail(me->err, TEXT, i, 10, "init: %s", err);
		me->rank = khor_rank(c);
		me->size = khor_size(c);
		me->local_rank = khor_local_rank(c);
		me->iters = 0;
		me->gen = khor_generation(c);
		if (me->gen == 1) {
			/* The job's record of the training state: as a worker's first sync adds. */
			int64_t held = 0;
			if (khor_elastic_state(c, 1, &held) != KHOR_SUCCESS || held < 1 || held > NW)
				return harness_fail(me->err, TEXT, i, 14, "khor_elastic_state gave %lld: %s",
				                    (long long)held, khor_comm_error(c));
		}
		khor_engine *eng;
		if ((st = khor_engine_start(c, NULL, &eng)) != KHOR_SUCCESS)
			return harness_fail(me->err, TEXT, i, 13, "engine: %s", khor_comm_error(c));
		while (!sh->stop) {
			for (size_t k = 0; k < count; k++)
				buf[k] = 1.0f;
			st = khor_allreduce(c, buf, buf, count, KHOR_FLOAT32, KHOR_SUM);
			if (st == KHOR_SUCCESS && buf[count - 1] != (float)khor_size(c))
				return harness_fail(me->err, TEXT, i, 11, "allreduce gave %g at size %d",
				                    buf[count - 1], khor_size(c));
			/*
			 * A host update is acted on by every rank at the same step: one allreduce,
			 * through the engine as the Python layer makes it (a pending handle must fail
			 * with the loss too).
			 */
			int32_t up = khor_hosts_updated(c), out = 0;
			int64_t one = 1;
			khor_handle *h = NULL;
			const char *text = khor_comm_error(c);
			if (st == KHOR_SUCCESS &&
			    (st = khor_enqueue_allreduce(eng, 0, "hosts_updated", &up, &out, KHOR_INT32,
			                                 1, &one, KHOR_MAX, 1.0, 1.0, &h)) ==
			        KHOR_SUCCESS) {
				st = khor_handle_wait(h);
				text = khor_handle_error(h);
			}
			up = out;
			if (st != KHOR_SUCCESS) {
				if (me->status == 0) {
					me->failed_at = harness_now();
					snprintf(me->err, TEXT, "%s", text);
				}
				me->status = st;
				if (h != NULL)
					khor_handle_free(h);
				break;
			}
			khor_handle_free(h);
			me->iters++;
			if (up != 0) {
				me->hosts_seen = up;
				break;
			}
		}
		khor_engine_stop(eng);
		khor_finalize(c);
		if (sh->stop)
			return 0;
		if (st != KHOR_SUCCESS && st != KHOR_ERR_MEMBERSHIP)
			return 12;
	}
}

static store *driver;

static void put(const char *key, const char *val)
{
	kerr e;
	cr_assert_eq(store_set(driver, key, val, strlen(val), &e), KHOR_SUCCESS, "%s", e.text);
}

static void plan(int gen, const int *ids, int n, const char *drop)
{
	char text[1024], key[32];
	int off = snprintf(text, sizeof(text), "%s\ngen %d\nsize %d\n", ELASTIC_PLAN_MAGIC, gen, n);
	for (int r = 0; r < n; r++)
		off += snprintf(text + off, sizeof(text) - (size_t)off, "rank %d h:%d h %d %d 0 1\n",
		                r, ids[r], r, n);
	if (drop != NULL)
		off += snprintf(text + off, sizeof(text) - (size_t)off, "drop %s\n", drop);
	store_set_prefix(driver, JOB, 0);
	snprintf(key, sizeof(key), "el/plan/%d", gen);
	put(key, text);
	snprintf(key, sizeof(key), "%d", gen);
	put("el/gen", key);
}

/*
 * Fencing: a transport of generation 1, as a rank of it that missed the end would still
 * hold, dials a rank of generation `gen` and must be refused at the handshake, before a
 * byte of the new generation's traffic could be mixed with its own.
 */
static void old_link_refused(int gen)
{
	const struct transport_ops *tcp = transport_find("tcp");
	char job[64], key[32];
	void *addr;
	size_t len;
	tp_ctx *ctx;
	tp_link *l;
	kerr e;

	cr_assert(tcp != NULL);
	snprintf(job, sizeof(job), "g1/%s", JOB);
	tp_options o = { .rank = 0, .size = 2, .job_id = job, .secret = SECRET, .nsocks = 1,
	                 .min_stripe_bytes = 1 << 18, .handshake_timeout_ms = 5000 };
	cr_assert_eq(tcp->create(&o, &ctx, &e), KHOR_SUCCESS, "%s", e.text);
	store_set_prefix(driver, JOB, gen);
	snprintf(key, sizeof(key), "addr/tcp/1");
	cr_assert_eq(store_get(driver, key, kdeadline_in_ms(5000), &addr, &len, &e), KHOR_SUCCESS,
	             "%s", e.text);
	cr_assert_eq(tcp->connect(ctx, 1, addr, &l, &e), KHOR_SUCCESS, "%s", e.text);
	free(addr);
	khor_status st = KHOR_SUCCESS;
	kdeadline dl = kdeadline_in_ms(10000);
	while (st == KHOR_SUCCESS && !tcp->link_ready(l) && !kdeadline_passed(dl)) {
		bool moved;
		st = tcp->progress(ctx, 10, &moved, &e);
		if (st == KHOR_SUCCESS)
			st = tcp->link_error(l, &e);
	}
	cr_expect(!tcp->link_ready(l), "a link of generation 1 was let into generation %d", gen);
	cr_expect(st != KHOR_SUCCESS && strstr(e.text, "job id") != NULL,
	          "the old generation's link was not refused for its job id: %s", e.text);
	printf("generation 1's link into generation %d: %s\n", gen, e.text);
	tcp->destroy(ctx);
	store_set_prefix(driver, JOB, 0);
}

static int64_t counter(const char *key)
{
	void *v;
	size_t len;
	kerr e;
	int64_t n = 0;
	store_set_prefix(driver, JOB, 0);
	if (store_get(driver, key, kdeadline_in_ms(0), &v, &len, &e) != KHOR_SUCCESS)
		return 0;
	n = atoll(v);
	free(v);
	return n;
}

/* Waits until every listed worker runs generation gen with a few calls done. */
static void await_gen(struct shared *sh, const int *ids, int n, int gen, int size)
{
	double end = harness_now() + 30;
	for (;;) {
		int ok = 0;
		for (int k = 0; k < n; k++)
			ok += sh->w[ids[k]].gen == gen && sh->w[ids[k]].iters > 3;
		if (ok == n)
			break;
		cr_assert_lt(harness_now(), end, "workers never all ran generation %d", gen);
		harness_sleep_ms(10);
	}
	for (int k = 0; k < n; k++)
		cr_expect_eq(sh->w[ids[k]].size, size, "worker %d: size %d in generation %d", ids[k],
		             sh->w[ids[k]].size, gen);
}

/* The driver's part, over the store at store_addr (driver connected to it). */
static void loss_rejoin_update_removal(void)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	kerr e;
	pid_t pid[NW];

	int all[NW] = { 0, 1, 2 };
	plan(1, all, NW, NULL);
	for (int i = 0; i < NW; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed assertion ends the test's process */
			_exit(worker(i, sh));
		}
	}
	await_gen(sh, all, NW, 1, NW);
	for (int i = 0; i < NW; i++)
		cr_expect_eq(sh->w[i].rank, i, "worker %d is rank %d of generation 1", i, sh->w[i].rank);
	cr_expect_eq(counter("el/held"), NW, "el/held is %lld after every worker said it holds "
	             "the state", (long long)counter("el/held"));

	/* The loss: what a driver does when it reaps a killed worker. */
	kill(pid[2], SIGKILL);
	double killed = harness_now();
	int ws;
	cr_assert_eq(waitpid(pid[2], &ws, 0), pid[2]);
	int64_t n;
	store_set_prefix(driver, JOB, 1);
	cr_assert_eq(store_add(driver, "abort_count", 1, &n, &e), KHOR_SUCCESS);
	put("abort", "rank 2 on h (worker h:2) was lost in generation 1: killed by signal 9");
	int two[2] = { 0, 1 };
	plan(2, two, 2, NULL);
	await_gen(sh, two, 2, 2, 2);
	for (int i = 0; i < 2; i++) {
		cr_expect_eq(sh->w[i].status, KHOR_ERR_MEMBERSHIP, "worker %d failed with %d: %s", i,
		             sh->w[i].status, sh->w[i].err);
		cr_expect(strstr(sh->w[i].err, "rank 2 on h (worker h:2)") != NULL &&
		          strstr(sh->w[i].err, "killed by signal 9") != NULL,
		          "worker %d's error does not name the loss: %s", i, sh->w[i].err);
		double after = sh->w[i].failed_at - killed;
		printf("worker %d failed %.0f ms after the kill: %s\n", i, after * 1e3, sh->w[i].err);
		cr_expect_lt(after, 3.0, "worker %d noticed the loss only after %.1f s", i, after);
		cr_expect_eq(sh->w[i].local_rank, i, "worker %d's local rank moved to %d", i,
		             sh->w[i].local_rank);
	}
	cr_expect_eq(counter("el/want/1"), 2, "both survivors asked for a new generation");
	int before = sh->w[1].iters;
	old_link_refused(2);
	double until = harness_now() + 10;
	while (sh->w[1].iters < before + 3 && harness_now() < until)
		harness_sleep_ms(10);
	cr_expect_geq(sh->w[1].iters, before + 3, "generation 2 stopped after the refused link");

	/* A host change: noticed by both at the same step, then worker 1 is dropped. */
	put("el/update/2", "removed");
	double end = harness_now() + 20;
	while (counter("el/want/2") < 2 && harness_now() < end)
		harness_sleep_ms(10);
	cr_expect_eq(counter("el/want/2"), 2, "the workers did not act on the host update");
	cr_expect_eq(sh->w[0].hosts_seen, 2);
	cr_expect_eq(sh->w[1].hosts_seen, 2);
	int one[1] = { 0 };
	plan(3, one, 1, "h:1");
	cr_assert_eq(waitpid(pid[1], &ws, 0), pid[1]);
	cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the dropped worker did not exit 0 (%d)",
	          ws);
	await_gen(sh, one, 1, 3, 1);
	sh->stop = 1;
	cr_assert_eq(waitpid(pid[0], &ws, 0), pid[0]);
	cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "worker 0 ended with %d: %s", ws,
	          sh->w[0].err);
	store_close(driver);
}

Test(elastic, loss_rejoin_update_removal, .timeout = 120)
{
	store_server *srv;
	kerr e;

	cr_assert_eq(store_server_start("127.0.0.1", 0, SECRET, JOB, &srv, &e), KHOR_SUCCESS, "%s",
	             e.text);
	snprintf(store_addr, sizeof(store_addr), "127.0.0.1:%u", store_server_port(srv));
	cr_assert_eq(store_connect(store_addr, SECRET, JOB, kdeadline_in_ms(5000), &driver, &e),
	             KHOR_SUCCESS, "%s", e.text);
	loss_rejoin_update_removal();
	store_server_stop(srv);
}

/* The same job with etcd as its store: plans, heartbeats and the abort all go through it. */
Test(elastic, loss_rejoin_update_removal_over_etcd, .timeout = 120)
{
	struct etcd_proc server;
	kerr e;

	etcd_up(&server);
	snprintf(store_addr, sizeof(store_addr), "etcd://127.0.0.1:%u", server.port);
	cr_assert_eq(store_connect(store_addr, SECRET, JOB, kdeadline_in_ms(5000), &driver, &e),
	             KHOR_SUCCESS, "%s", e.text);
	loss_rejoin_update_removal();
	etcd_down(&server);
}

Test(elastic, refused_without_a_lasting_store)
{
	khor_config *cfg;
	khor_comm *c;
	char err[TEXT];

	khor_config_create(&cfg);
	khor_config_set(cfg, "KHOR_ELASTIC", "1");
	khor_config_set(cfg, "KHOR_RANK", "0");
	khor_config_set(cfg, "KHOR_SIZE", "2");
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "29999", 1);
	cr_expect_eq(khor_init(cfg, err, sizeof(err), &c), KHOR_ERR_INVALID_ARG);
	cr_expect(strstr(err, "outlives the ranks") != NULL && strstr(err, "rank 0") != NULL,
	          "%s", err);
	/* And a fixed job has no record of an elastic state to keep. */
	khor_config_set(cfg, "KHOR_ELASTIC", "0");
	khor_config_set(cfg, "KHOR_SIZE", "1");
	cr_assert_eq(khor_init(cfg, err, sizeof(err), &c), KHOR_SUCCESS, "%s", err);
	cr_expect_eq(khor_elastic_state(c, 0, NULL), KHOR_ERR_INVALID_ARG);
	cr_expect(strstr(khor_comm_error(c), "not an elastic job") != NULL, "%s",
	          khor_comm_error(c));
	khor_finalize(c);
	unsetenv("MASTER_ADDR");
	unsetenv("MASTER_PORT");
	khor_config_destroy(cfg);
}

Test(elastic, plan_parser)
{
	struct el_place p;
	kerr e;
	const char *good = ELASTIC_PLAN_MAGIC "\ngen 4\nsize 2\nrank 0 a:0 a 0 1 0 2\n"
	                   "rank 1 b:0 b 0 1 1 2\ndrop c:1\n";
	cr_assert_eq(elastic_plan_find(good, strlen(good), "b:0", &p, &e), KHOR_SUCCESS, "%s",
	             e.text);
	cr_expect(p.what == EL_IN && p.gen == 4 && p.rank == 1 && p.size == 2 && p.cross_rank == 1);
	cr_expect_str_eq(p.host, "b");
	cr_assert_eq(elastic_plan_find(good, strlen(good), "c:1", &p, &e), KHOR_SUCCESS);
	cr_expect_eq(p.what, EL_DROPPED);
	cr_assert_eq(elastic_plan_find(good, strlen(good), "z:0", &p, &e), KHOR_SUCCESS);
	cr_expect_eq(p.what, EL_ABSENT);
	static const char *const bad[] = {
		"", "khor-plan 2\ngen 1\nsize 1\nrank 0 a:0 a 0 1 0 1\n",
		ELASTIC_PLAN_MAGIC "\ngen 1\nsize 2\nrank 0 a:0 a 0 1 0 1\n", /* too few */
		ELASTIC_PLAN_MAGIC "\ngen 1\nsize 1\nrank 1 a:0 a 0 1 0 1\n", /* out of order */
		ELASTIC_PLAN_MAGIC "\ngen 1\nsize 1\nrank 0 a:0 a 1 1 0 1\n", /* local 1 of 1 */
		ELASTIC_PLAN_MAGIC "\ngen 1\nsize 1\nrank 0 a:0 a 0 1 0 1 x\n",
		ELASTIC_PLAN_MAGIC "\nsize 1\nrank 0 a:0 a 0 1 0 1\n", /* no generation */
		ELASTIC_PLAN_MAGIC "\ngen 1\nsize 1\nbogus\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_eq(elastic_plan_find(bad[i], strlen(bad[i]), "a:0", &p, &e),
		             KHOR_ERR_PROTOCOL, "bad plan %zu was taken", i);
}
