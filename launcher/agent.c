/*
 * agent.c -- khorrun as one host's agent of an elastic job over etcd (agent.h). Every host
 * runs one, all with the same options; etcd is the job's store and its memory:
 *
 *   el/agent/<host>   "<slots>", under the agent's lease (kept alive every TTL/3): the
 *                     job's hosts are the agents alive, oldest first
 *   el/leader         "<host>", under the leader's lease: won by compare-and-swap (create if
 *                     absent); when its agent dies the lease expires and another wins it
 *   el/exit/<g>/<id>  "<status> <how>": a worker the agent of its host saw end, g being the
 *                     newest generation that gave it a rank
 *   el/fence/<g>/<id> the leader asks the worker's agent to kill it (its heartbeat stalled)
 *   el/resets, el/blacklist/<host>  what the leader has counted and ruled, for the next one
 *   el/result         "<status> <why>": the job is over; every agent stops and exits so
 *   el/secret         the job secret the workers prove on their links (none given: the first
 *                     agent makes one; it is as private as etcd's keys are)
 *
 * plus docs/ELASTIC.md's keys, which the leader writes as khorrun's driver does (el/plan/<g>,
 * el/gen, el/update/<g>, el/done, <job>/<g>/abort) and the workers read as in any elastic
 * job. The leader plans with the driver's rules (elastic_core.c, elastic_plan.c); every
 * agent starts the workers the newest plan gives its host, lets the dropped ones go, kills
 * the fenced ones and reports every end. A new leader rebuilds what it needs from those
 * keys, so no agent is the job's single point of failure: killing the leader's host loses
 * its workers, as losing any host does, and the job goes on in the next generation.
 *
 * Everything runs on khorrun's one thread between the turns of the poll loop (loop.c).
 */
#include "agent.h"

#include "base/auth.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/parse.h"
#include "base/sock.h"
#include "rendezvous/etcd.h"
#include "rendezvous/store.h"
#include "runtime/config.h"

#include "batch.h"
#include "elastic_core.h"
#include "elastic_plan.h"
#include "env.h"
#include "loop.h"
#include "output.h"
#include "procs.h"
#include "say.h"
#include "spawn.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define POLL_MS 100
/* An etcd call of the agent's own (the lease, the election) waits at most this. */
#define OP_MS 5000

/* A worker this agent started: j->ranks[i]. */
struct lw {
	int gen;         /* the newest generation that gave it a rank */
	bool doomed;     /* dropped or fenced: its id starts afresh only once it is reaped */
	bool reported;   /* its end is in etcd */
	int64_t stop_at; /* dropped: when to signal it if it has not exited */
	int stop_sigs;
};

/* The leader's view of one rank of its newest plan. */
struct pr {
	char id[EP_HOST_MAX + 16];
	int64_t hb, hb_at;
	/* Kept from the plan before, until it joins this one: its rank there (-1: none to
	 * watch), the count last seen there and when it moved (elastic.c's join_stalled). */
	int prev_rank;
	int64_t prev_hb, alive_at;
	bool ended;  /* its end is known: reported, fenced, or its host's agent gone */
	bool fresh;  /* started for this generation: its reports are under this one only */
	bool ok;     /* it exited 0 */
};

struct agent {
	struct job *j;
	const struct agent_env *env;
	const char *job;
	char host[EP_HOST_MAX + 1];
	char store_addr[300], secret[65];
	char *fixed[MAX_FIXED];
	size_t nfixed;
	etcd *e;
	store *s;
	int64_t lease, keep_at;
	bool etcd_down; /* said once per outage */
	struct lw *w;
	int nw;
	int applied; /* the newest generation applied here */
	char *path;
	bool over;
	int rc;
	int64_t next_poll;

	bool leader;
	struct ec c;    /* the generations, as the leader knows them (elastic_core.h) */
	struct pr *pr;  /* per rank of c.plan */
};

static int64_t now_ms(void)
{
	return (int64_t)(kclock_ns() / 1000000u);
}

static int64_t wall_ms(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* --- the store ------------------------------------------------------------------------ */

static bool put(struct agent *a, int gen, const char *key, const char *val)
{
	kerr err;

	kerr_clear(&err);
	store_set_prefix(a->s, a->job, gen);
	if (store_set(a->s, key, val, strlen(val), &err) != KHOR_SUCCESS) {
		say("agent %s: cannot write %s: %s", a->host, key, err.text);
		return false;
	}
	return true;
}

/*
 * A key's value now: KHOR_SUCCESS with *val_out malloc'd, KHOR_ERR_TIMEOUT when absent,
 * another status when etcd could not tell.
 */
static khor_status peek(struct agent *a, int gen, const char *key, char **val_out)
{
	void *v = NULL;
	size_t len;
	kerr err;
	khor_status st;

	kerr_clear(&err);
	*val_out = NULL;
	store_set_prefix(a->s, a->job, gen);
	st = store_get(a->s, key, kdeadline_in_ms(0), &v, &len, &err);
	if (st == KHOR_SUCCESS)
		*val_out = v;
	else if (st != KHOR_ERR_TIMEOUT)
		KLOG_WARN("khorrun: agent %s: reading %s: %s", a->host, key, err.text);
	return st;
}

static int64_t peek_int(struct agent *a, int gen, const char *key, int64_t dflt)
{
	char *v;
	int64_t n = dflt;

	if (peek(a, gen, key, &v) == KHOR_SUCCESS) {
		if (!kparse_i64(v, &n))
			n = dflt;
		free(v);
	}
	return n;
}

/* --- the leader's part: the driver's rules over etcd ---------------------------------- */

static void persist_resets(void *ctx)
{
	struct agent *a = ctx;
	char n[16];

	snprintf(n, sizeof(n), "%d", a->c.st.resets);
	(void)put(a, 0, "el/resets", n);
}

/* The job is over: every agent stops its workers and exits with rc. */
static void job_over(void *ctx, int rc, const char *msg)
{
	struct agent *a = ctx;
	char val[1600];

	if (a->c.ending)
		return;
	if (rc != 0)
		say("%s", msg);
	a->c.ending = true;
	(void)put(a, 0, "el/done", "1");
	snprintf(val, sizeof(val), "%d %s", rc, msg);
	(void)put(a, 0, "el/result", val);
}

static void write_abort(void *ctx, int gen, const char *text)
{
	struct agent *a = ctx;
	int64_t n = 0;
	kerr err;

	kerr_clear(&err);
	store_set_prefix(a->s, a->job, gen);
	if (store_add(a->s, "abort_count", 1, &n, &err) != KHOR_SUCCESS)
		say("agent %s: cannot end generation %d: %s", a->host, gen, err.text);
	else if (n == 1)
		(void)put(a, gen, "abort", text);
}

/* Records a blacklisting for the leaders after this one (wall clock: they run elsewhere). */
static void persist_blacklist(void *ctx, int h, int64_t cooldown_ms)
{
	struct agent *a = ctx;
	char key[EP_HOST_MAX + 32], val[32];

	snprintf(key, sizeof(key), "el/blacklist/%s", a->c.st.hosts[h].name);
	snprintf(val, sizeof(val), "%lld", cooldown_ms < 0 ? 0LL : (long long)(wall_ms() +
	                                                                       cooldown_ms));
	(void)put(a, 0, key, val);
}

/*
 * Rank r of the plan is lost. As khorrun's driver rules: its generation ends; on several
 * hosts its host is blacklisted (unless it is gone already), on one a fresh worker takes
 * its slot.
 */
static void lost(struct agent *a, int r, const char *why, bool blacklist)
{
	struct ec_loss l = { .rank = r,
		             .host = a->c.plan[r].host,
		             .worker = a->pr[r].id,
		             .why = why,
		             .finish_rc = 1,
		             .blacklist = blacklist,
		             .quiet_already = true };

	a->pr[r].ended = true;
	ec_lost(&a->c, &l);
}

static const struct ec_ops agent_ops = { .fail = job_over,
	                                 .abort_gen = write_abort,
	                                 .blacklisted = persist_blacklist,
	                                 .reset_taken = persist_resets };

/* The agents alive, oldest first, as a discovery. */
static bool list_agents(struct agent *a, struct ep_list *out)
{
	char prefix[200];
	struct etcd_kv *kvs;
	int n;
	kerr err;

	memset(out, 0, sizeof(*out));
	snprintf(prefix, sizeof(prefix), "%s/0/el/agent/", a->job);
	kerr_clear(&err);
	if (etcd_list(a->e, prefix, kdeadline_in_ms(OP_MS), &kvs, &n, &err) != KHOR_SUCCESS) {
		KLOG_WARN("khorrun: agent %s: listing the agents: %s", a->host, err.text);
		return false;
	}
	for (int i = 0; i < n; i++) {
		int64_t slots;
		if (!kparse_i64((char *)kvs[i].val, &slots) || slots < 1 || slots > EP_SLOTS_MAX)
			continue;
		if (!ep_list_add(out, kvs[i].key + strlen(prefix), (int)slots)) {
			ep_list_free(out);
			etcd_kvs_free(kvs, n);
			return false;
		}
	}
	etcd_kvs_free(kvs, n);
	return true;
}

/* The hosts now: as khorrun's driver takes a discovery in, and a gone agent's ranks lost. */
static void take_hosts(struct agent *a, const struct ep_list *l)
{
	int flags = ep_update(&a->c.st, l, now_ms());
	char words[32], key[64];

	if (flags < 0) {
		ec_fail(&a->c, 1, "elastic: out of memory taking in the hosts");
		return;
	}
	for (int r = 0; r < a->c.nplan && a->c.gen > 0 && !a->c.ending; r++) {
		if (!a->pr[r].ended && !a->c.st.hosts[a->c.plan[r].host].listed && !a->pr[r].ok)
			lost(a, r, "its host's agent is gone (its etcd lease expired)", false);
	}
	/* Nothing the ranks would do differently (a host past --max-np, one not in the plan
	 * leaving): no update, as khorrun's driver and Horovod skip it. */
	if (!ec_hosts_changed(&a->c, flags, NULL, 0))
		return;
	ep_update_words(a->c.updates, words, sizeof(words));
	snprintf(key, sizeof(key), "el/update/%d", a->c.gen);
	if (put(a, 0, key, words))
		say("elastic: hosts %s during generation %d; the ranks go to a new generation at "
		    "their next commit", words, a->c.gen);
}

/* A worker's end, as its agent reported it: "<status> <how>". */
static void check_exits(struct agent *a)
{
	for (int r = 0; r < a->c.nplan && !a->c.ending; r++) {
		struct pr *p = &a->pr[r];
		char key[EP_HOST_MAX + 48], *v = NULL;
		int64_t code;

		if (p->ended)
			continue;
		for (int g = a->c.gen; g >= a->c.gen - (p->fresh ? 0 : 1) && g > 0 && v == NULL;
		     g--) {
			snprintf(key, sizeof(key), "el/exit/%d/%s", g, p->id);
			(void)peek(a, 0, key, &v);
		}
		if (v == NULL)
			continue;
		const char *how = strchr(v, ' ');
		code = strtoll(v, NULL, 10);
		how = how != NULL ? how + 1 : "ended";
		if (code == 0) {
			p->ended = p->ok = true;
			if (!a->c.finishing)
				KLOG_INFO("khorrun: elastic: worker %s exited 0: the job is finishing",
				          p->id);
			a->c.finishing = true;
			a->c.need_gen = false;
			(void)put(a, 0, "el/done", "1");
		} else {
			lost(a, r, how, true);
		}
		free(v);
	}
	if (a->c.finishing && !a->c.ending) {
		for (int r = 0; r < a->c.nplan; r++) {
			if (!a->pr[r].ok)
				return;
		}
		ec_fail(&a->c, 0, "the job succeeded");
	}
}

/* el/want/<gen>: the ranks asked for a new generation. */
static void check_want(struct agent *a)
{
	char key[64], *why = NULL;
	int who = -1;

	snprintf(key, sizeof(key), "el/want/%d", a->c.gen);
	if (peek_int(a, 0, key, 0) <= 0)
		return;
	a->c.gen_over = true;
	if (a->c.updates != 0) {
		ec_want_gen(&a->c);
		return;
	}
	for (int r = 0; r < a->c.nplan && why == NULL; r++) {
		snprintf(key, sizeof(key), "el/why/%d/%s", a->c.gen, a->pr[r].id);
		if (peek(a, 0, key, &why) == KHOR_SUCCESS)
			who = r;
	}
	if (who >= 0)
		ec_asked(&a->c, who, a->c.st.hosts[a->c.plan[who].host].name, a->pr[who].id, why);
	else
		ec_asked(&a->c, -1, NULL, NULL, NULL);
	free(why);
}

/*
 * Rank r, kept from the generation before, has not joined this one: its heartbeat there,
 * which stops at its finalize, is all there is to watch until it does (elastic.c's
 * join_stalled). *stalled > 0 when it has not moved for the heartbeat timeout; a status
 * other than KHOR_SUCCESS when etcd could not tell.
 */
static khor_status join_stall(struct agent *a, struct pr *p, int r, int64_t now, int64_t *stalled)
{
	char key[32], *val;
	khor_status st;

	*stalled = 0;
	if (p->prev_rank < 0 || p->hb > 0)
		return KHOR_SUCCESS;
	snprintf(key, sizeof(key), "host/%d", r);
	st = peek(a, a->c.gen, key, &val);
	free(val);
	if (st == KHOR_SUCCESS)
		p->prev_rank = -1; /* it joined: from here on, its heartbeat in this generation */
	if (st != KHOR_ERR_TIMEOUT)
		return st;
	snprintf(key, sizeof(key), "hb/%d", p->prev_rank);
	st = peek(a, a->c.gen - 1, key, &val);
	if (st == KHOR_SUCCESS || st == KHOR_ERR_TIMEOUT) {
		*stalled = ep_join_stall(&p->prev_hb, &p->alive_at, val, now, a->c.hb_timeout_ms);
		st = KHOR_SUCCESS;
	}
	free(val);
	return st;
}

/*
 * The heartbeats of the plan's ranks; a stalled one is fenced by its agent. A poll that
 * could not read them does not count: after an etcd outage every rank gets its whole
 * timeout again, so a restart of etcd is not a stall.
 */
static void check_heartbeats(struct agent *a, int64_t now)
{
	bool failed = false;

	for (int r = 0; r < a->c.nplan && !a->c.gen_over && !failed; r++) {
		struct pr *p = &a->pr[r];
		char key[32], *val;
		int64_t stalled;
		int left = 0;
		khor_status st;

		if (p->ended)
			continue;
		st = join_stall(a, p, r, now, &stalled);
		if (st == KHOR_SUCCESS && stalled > 0) {
			left = a->c.gen - 1;
		} else if (st == KHOR_SUCCESS) {
			snprintf(key, sizeof(key), "hb/%d", r);
			st = peek(a, a->c.gen, key, &val);
			if (st == KHOR_SUCCESS || st == KHOR_ERR_TIMEOUT) {
				stalled = ep_heartbeat(&p->hb, &p->hb_at, &a->c.gen_beat_at, val,
				                       now, a->c.hb_timeout_ms);
				st = KHOR_SUCCESS;
			}
			free(val);
		}
		if (st != KHOR_SUCCESS) {
			failed = true;
			break;
		}
		if (stalled > 0) {
			char why[256], fkey[EP_HOST_MAX + 48];

			ep_fence_text(why, sizeof(why), stalled, a->c.hb_timeout_ms, "its agent",
			              left);
			snprintf(fkey, sizeof(fkey), "el/fence/%d/%s", a->c.gen, p->id);
			if (put(a, 0, fkey, why))
				lost(a, r, why, true);
		}
	}
	if (failed) {
		for (int r = 0; r < a->c.nplan; r++)
			a->pr[r].hb_at = a->pr[r].alive_at = now;
		if (a->c.gen_beat_at > 0)
			a->c.gen_beat_at = now;
	}
}

/* Plans the next generation once there are slots for it (elastic.c's plan_next, over etcd). */
/*
 * Generation g's own keys (its workers' addresses, heartbeats, aborts: "<job>/<g>/"), once
 * generation g + 2 is planned: every worker of g has moved on to g + 1 or gone by then, and
 * a job that lives through many losses must not grow etcd by a generation each time. The
 * agents' keys (under generation 0, "el/...") stay until the job's end.
 */
static void forget_gen(struct agent *a, int g)
{
	char prefix[200];
	kerr err;

	if (g < 1)
		return;
	snprintf(prefix, sizeof(prefix), "%s/%d/", a->job, g);
	kerr_clear(&err);
	if (etcd_del_prefix(a->e, prefix, kdeadline_in_ms(OP_MS), NULL, &err) != KHOR_SUCCESS)
		KLOG_WARN("khorrun: agent %s: deleting generation %d's keys: %s", a->host, g,
		          err.text);
}

static void plan_next(struct agent *a)
{
	int need = a->c.gen == 0 ? a->j->o.np : a->c.st.min_np;
	struct ec_plan x;
	bool room = ec_plan_new(&a->c, a->c.nplan, &x);
	struct pr *pr = calloc((size_t)x.cap, sizeof(*pr));
	char *text = NULL, key[32], num[16], msg[1400];
	int n, nl = 0, nd = 0, g = a->c.gen + 1;
	int64_t now = now_ms();

	if (!room || pr == NULL) {
		ec_fail(&a->c, 1, "elastic: out of memory planning generation %d", g);
		goto out;
	}
	n = ep_assign(&a->c.st, x.s, x.cap);
	if (n < need) {
		ec_short_of_slots(&a->c, need, now, false);
		goto out;
	}
	if (!ep_keeps_a_host(a->c.plan, a->c.nplan, x.s, n)) {
		ec_fail(&a->c, 1,
		        "elastic: generation %d would have none of generation %d's hosts, so no "
		        "rank to take the state from; the job cannot go on",
		        g, a->c.gen);
		goto out;
	}
	/* The workers that go on: those of the last plan not known to have ended. */
	for (int r = 0; r < a->c.nplan; r++) {
		if (a->pr[r].ended)
			continue;
		x.lw[nl] = (struct ep_worker){ a->c.plan[r].host, a->c.plan[r].local_rank };
		x.idx[nl++] = r;
	}
	ep_match(x.s, n, x.lw, nl, x.keep, x.drop);
	for (int k = 0; k < nl; k++) {
		if (x.drop[k])
			x.drops[nd++] = a->pr[x.idx[k]].id;
	}
	text = ep_plan_text(&a->c.st, g, x.s, n, x.drops, nd);
	if (text == NULL) {
		ec_fail(&a->c, 1, "elastic: out of memory planning generation %d", g);
		goto out;
	}
	snprintf(key, sizeof(key), "el/plan/%d", g);
	snprintf(num, sizeof(num), "%d", g);
	if (!put(a, 0, key, text) || !put(a, 0, "el/gen", num))
		goto out;
	forget_gen(a, g - 2);
	for (int r = 0; r < n; r++) {
		snprintf(pr[r].id, sizeof(pr[r].id), "%s:%d", a->c.st.hosts[x.s[r].host].name,
		         x.s[r].local_rank);
		pr[r].fresh = x.keep[r] < 0;
		pr[r].prev_rank = -1;
		if (x.keep[r] >= 0) {
			int old = x.idx[x.keep[r]];

			pr[r].prev_rank = old;
			pr[r].prev_hb = a->pr[old].hb;
			pr[r].alive_at = now;
		}
	}
	free(a->pr);
	a->pr = pr;
	pr = NULL;
	ec_begin_gen(&a->c, g, x.s, n);
	x.s = NULL;
	ep_describe_gen(&a->c.st, g, a->c.plan, n, msg, sizeof(msg));
	say("elastic: %s%s", msg, nd > 0 ? "; some dropped" : "");
out:
	free(pr);
	free(text);
	ec_plan_free(&x);
}

static int list_has(const struct ep_list *l, const char *name)
{
	for (int i = 0; i < l->n; i++) {
		if (strcmp(l->h[i].name, name) == 0)
			return i;
	}
	return -1;
}

/* Parses "rank R ID HOST LR LS CR CS"; false when the line is not one. */
static bool plan_rank_line(const char *line, int *r, char *id, char *host, int *lr, int *ls,
                           int *cr, int *cs)
{
	return sscanf(line, "rank %d %270s %255s %d %d %d %d", r, id, host, lr, ls, cr, cs) == 7;
}

/*
 * This agent has just won the election: what the leader before it left in etcd becomes
 * its state (the newest plan, the resets counted, the hosts blacklisted), and each rank
 * gets a whole heartbeat timeout from now.
 */
static void become_leader(struct agent *a)
{
	struct ep_list first = { 0 }, agents;
	char key[64], blp[200], *text = NULL, *v;
	struct etcd_kv *bl;
	int nbl;
	int64_t now = now_ms();
	kerr err;

	a->leader = true;
	free(a->c.plan);
	free(a->pr);
	a->c.plan = NULL;
	a->pr = NULL;
	a->c.nplan = 0;
	ep_init(&a->c.st, a->j->o.min_np, a->j->o.max_np, a->j->o.cool_min_ms, a->j->o.cool_max_ms,
	        a->j->o.reset_limit);
	a->c.gen = (int)peek_int(a, 0, "el/gen", 0);
	a->c.wait_since = -1;
	if (!list_agents(a, &agents)) {
		ep_free(&a->c.st);
		a->leader = false;
		return;
	}
	snprintf(key, sizeof(key), "el/plan/%d", a->c.gen);
	if (a->c.gen > 0 && peek(a, 0, key, &text) != KHOR_SUCCESS) {
		say("agent %s: elected, but generation %d's plan cannot be read; trying again",
		    a->host, a->c.gen);
		ep_list_free(&agents);
		ep_free(&a->c.st);
		a->leader = false;
		return;
	}
	/* The plan's hosts first, in its order (the order the job has given them), then the
	 * others; a host whose agent has gone is then taken out as a discovery would. */
	int cap = 0;
	for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		cap += strncmp(l, "rank ", 5) == 0;
	a->c.plan = calloc((size_t)cap + 1, sizeof(*a->c.plan));
	a->pr = calloc((size_t)cap + 1, sizeof(*a->pr));
	char (*hosts)[EP_HOST_MAX + 1] = calloc((size_t)cap + 1, sizeof(*hosts));
	if (a->c.plan == NULL || a->pr == NULL || hosts == NULL) {
		free(hosts);
		free(text);
		ep_list_free(&agents);
		ec_fail(&a->c, 1, "elastic: out of memory taking over");
		return;
	}
	a->c.nplan = 0;
	for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		struct ep_slot *s = &a->c.plan[a->c.nplan];
		char id[EP_HOST_MAX + 16];
		int r;

		if (!plan_rank_line(l, &r, id, hosts[a->c.nplan], &s->local_rank, &s->local_size,
		                    &s->cross_rank, &s->cross_size))
			continue;
		s->rank = r;
		kstrlcpy(a->pr[a->c.nplan].id, id, sizeof(a->pr[a->c.nplan].id));
		a->pr[a->c.nplan].fresh = true;
		a->pr[a->c.nplan].prev_rank = -1; /* what the leader before saw of it is gone */
		a->pr[a->c.nplan].hb_at = now;
		a->c.nplan++;
	}
	for (int r = 0; r < a->c.nplan; r++) {
		int slots = a->c.plan[r].local_size;
		for (int k = 0; k < agents.n; k++) {
			if (strcmp(agents.h[k].name, hosts[r]) == 0)
				slots = agents.h[k].slots;
		}
		if (list_has(&first, hosts[r]) < 0)
			(void)ep_list_add(&first, hosts[r], slots);
	}
	for (int k = 0; k < agents.n; k++) {
		if (list_has(&first, agents.h[k].name) < 0)
			(void)ep_list_add(&first, agents.h[k].name, agents.h[k].slots);
	}
	/* Blacklisted hosts are known too, so that one whose agent comes back stays out. */
	snprintf(blp, sizeof(blp), "%s/0/el/blacklist/", a->job);
	if (etcd_list(a->e, blp, kdeadline_in_ms(OP_MS), &bl, &nbl, &err) != KHOR_SUCCESS) {
		bl = NULL;
		nbl = 0;
	}
	for (int i = 0; i < nbl; i++) {
		if (list_has(&first, bl[i].key + strlen(blp)) < 0)
			(void)ep_list_add(&first, bl[i].key + strlen(blp), 1);
	}
	(void)ep_update(&a->c.st, &first, now);
	for (int r = 0; r < a->c.nplan; r++)
		a->c.plan[r].host = ep_host_index(&a->c.st, hosts[r]);
	free(hosts);
	free(text);
	ep_list_free(&first);
	ep_list_free(&agents);

	a->c.st.resets = (int)peek_int(a, 0, "el/resets", 0);
	for (int i = 0; i < nbl; i++) {
		int h = ep_host_index(&a->c.st, bl[i].key + strlen(blp));
		int64_t until = strtoll((char *)bl[i].val, NULL, 10);

		if (h < 0 || (until != 0 && until <= wall_ms()))
			continue;
		(void)ep_blacklist(&a->c.st, h, now, ep_draw(&a->c.rnd));
		if (until != 0 && a->c.st.hosts[h].cool_until_ms > 0)
			a->c.st.hosts[h].cool_until_ms = now + (until - wall_ms());
	}
	etcd_kvs_free(bl, nbl);
	snprintf(key, sizeof(key), "abort");
	if (a->c.gen > 0 && peek(a, a->c.gen, key, &v) == KHOR_SUCCESS) {
		free(v);
		a->c.gen_over = true;
	}
	if (peek(a, 0, "el/done", &v) == KHOR_SUCCESS) {
		free(v);
		a->c.finishing = true;
	}
	a->c.need_gen = a->c.gen == 0 || (a->c.gen_over && !a->c.finishing);
	a->c.gen_beat_at = a->c.gen > 0 ? now : 0;
	if (a->c.gen > 0)
		say("agent %s: leads the job now, from generation %d", a->host, a->c.gen);
	else
		KLOG_INFO("khorrun: agent %s: leads the job", a->host);
}

/* Whether el/leader is still this agent's: one cut off from etcd longer than its lease
 * has been replaced, and must not plan beside its successor. */
static bool still_leader(struct agent *a)
{
	char key[200];
	struct etcd_kv cur = { 0 };
	bool mine;
	kerr err;

	snprintf(key, sizeof(key), "%s/0/el/leader", a->job);
	kerr_clear(&err);
	if (etcd_get(a->e, key, kdeadline_in_ms(OP_MS), &cur, NULL, &err) != KHOR_SUCCESS)
		return false; /* no word from etcd: no decisions either */
	mine = cur.found && cur.lease == a->lease && cur.len == strlen(a->host) &&
	       memcmp(cur.val, a->host, cur.len) == 0;
	if (cur.found && !mine) {
		say("agent %s: another agent leads the job now", a->host);
		a->leader = false;
		ep_free(&a->c.st);
	}
	etcd_kv_free(&cur);
	return mine;
}

static void lead(struct agent *a, int64_t now)
{
	struct ep_list l;

	if (a->c.ending || !still_leader(a))
		return;
	if (list_agents(a, &l)) {
		take_hosts(a, &l);
		ep_list_free(&l);
	}
	if (a->c.gen > 0 && !a->c.ending)
		check_exits(a);
	if (a->c.gen > 0 && !a->c.gen_over && !a->c.finishing && !a->c.ending)
		check_want(a);
	if (a->c.gen > 0 && !a->c.gen_over && !a->c.finishing && !a->c.ending &&
	    a->c.hb_timeout_ms > 0)
		check_heartbeats(a, now);
	if (a->c.need_gen && !a->c.ending)
		plan_next(a);
}

/* --- every agent's part: its lease, the election, its host's workers ------------------ */

/* Registers this host under a fresh lease; false (said) when it cannot. */
static bool register_host(struct agent *a, bool first)
{
	char key[EP_HOST_MAX + 64], slots[16];
	struct etcd_kv cur = { 0 };
	bool swapped = false;
	kerr err;

	kerr_clear(&err);
	if (etcd_lease_grant(a->e, a->j->o.rdzv_ttl_s, kdeadline_in_ms(OP_MS), &a->lease, &err) !=
	    KHOR_SUCCESS) {
		say("agent %s: %s", a->host, err.text);
		return false;
	}
	snprintf(key, sizeof(key), "%s/0/el/agent/%s", a->job, a->host);
	snprintf(slots, sizeof(slots), "%d", a->j->o.slots_per_host);
	if (etcd_cas(a->e, key, NULL, 0, slots, strlen(slots), a->lease, kdeadline_in_ms(OP_MS),
	             &swapped, &cur, &err) != KHOR_SUCCESS) {
		say("agent %s: %s", a->host, err.text);
		return false;
	}
	etcd_kv_free(&cur);
	if (!swapped) {
		say("agent %s: another agent of job %s has registered host %s and keeps it alive; "
		    "give each agent its own --rdzv-host (or wait %lld s for a dead one's lease to "
		    "expire)", a->host, a->job, a->host, (long long)a->j->o.rdzv_ttl_s);
		(void)etcd_lease_revoke(a->e, a->lease, kdeadline_in_ms(OP_MS), &err);
		return false;
	}
	a->keep_at = now_ms() + a->j->o.rdzv_ttl_s * 1000 / 3;
	if (!first)
		say("agent %s: registered again under a new lease", a->host);
	return true;
}

/* Kills this host's workers (the lease was lost: the job counts them gone already). */
static void kill_workers(struct agent *a)
{
	for (int i = 0; i < a->j->nstarted; i++) {
		if (a->j->ranks[i].running) {
			procs_signal_rank(a->j, &a->j->ranks[i], SIGKILL);
			a->w[i].doomed = true;
		}
	}
}

static void keepalive(struct agent *a, int64_t now)
{
	int64_t ttl = 0;
	kerr err;

	if (now < a->keep_at)
		return;
	kerr_clear(&err);
	if (etcd_lease_keepalive(a->e, a->lease, kdeadline_in_ms(OP_MS), &ttl, &err) !=
	    KHOR_SUCCESS) {
		if (!a->etcd_down)
			say("agent %s: cannot renew its lease (%s); trying on", a->host, err.text);
		a->etcd_down = true;
		a->keep_at = now + 500;
		return;
	}
	if (a->etcd_down)
		say("agent %s: etcd answers again", a->host);
	a->etcd_down = false;
	if (ttl > 0) {
		a->keep_at = now + a->j->o.rdzv_ttl_s * 1000 / 3;
		return;
	}
	say("agent %s: its lease expired (etcd did not hear from it for %lld s): the job counts "
	    "its workers lost; it stops them and joins again", a->host,
	    (long long)a->j->o.rdzv_ttl_s);
	kill_workers(a);
	if (a->leader) {
		a->leader = false;
		ep_free(&a->c.st);
	}
	if (!register_host(a, false))
		a->keep_at = now + 1000;
}

static void campaign(struct agent *a)
{
	char key[200];
	struct etcd_kv cur = { 0 };
	bool swapped = false;
	kerr err;

	snprintf(key, sizeof(key), "%s/0/el/leader", a->job);
	kerr_clear(&err);
	if (etcd_get(a->e, key, kdeadline_in_ms(OP_MS), &cur, NULL, &err) != KHOR_SUCCESS)
		return;
	if (cur.found) {
		bool mine = cur.lease == a->lease && cur.len == strlen(a->host) &&
		            memcmp(cur.val, a->host, cur.len) == 0;
		etcd_kv_free(&cur);
		if (mine)
			become_leader(a);
		return;
	}
	if (etcd_cas(a->e, key, NULL, 0, a->host, strlen(a->host), a->lease,
	             kdeadline_in_ms(OP_MS), &swapped, NULL, &err) == KHOR_SUCCESS && swapped)
		become_leader(a);
}

/* "exited with status 1", "killed by signal 9 (SIGKILL)". */
static int end_text(const struct rank *rk, char *buf, size_t len)
{
	if (rk->lost) {
		snprintf(buf, len, "it could not be started");
		return 255;
	}
	ec_end_words(rk->wstatus, buf, len);
	return ec_exit_status(rk->wstatus);
}

static bool lw_room(struct agent *a)
{
	struct lw *w;

	if (a->nw >= a->j->cap_ranks)
		return true;
	w = realloc(a->w, (size_t)a->j->cap_ranks * sizeof(*w));
	if (w == NULL)
		return false;
	memset(w + a->nw, 0, (size_t)(a->j->cap_ranks - a->nw) * sizeof(*w));
	a->w = w;
	a->nw = a->j->cap_ranks;
	return true;
}

/* Reports every end the loop reaped here since the last turn. */
static void report_ends(struct agent *a)
{
	for (int i = 0; i < a->j->nstarted; i++) {
		struct rank *rk = &a->j->ranks[i];
		char key[EP_HOST_MAX + 48], val[300], how[256];
		int code;

		if (rk->running || a->w[i].reported)
			continue;
		code = end_text(rk, how, sizeof(how));
		snprintf(key, sizeof(key), "el/exit/%d/%s", a->w[i].gen, rk->worker);
		snprintf(val, sizeof(val), "%d %s", code, how);
		if (!put(a, 0, key, val))
			return; /* etcd away: again next turn */
		a->w[i].reported = true;
		if (code != 0 && !a->w[i].doomed && !a->over)
			say("agent %s: worker %s %s", a->host, rk->worker, how);
		if (rk->pid >= 0)
			output_release_rank(rk);
	}
}

/* The ranks' environment on this host for a generation of size n (fixed[], count). */
static size_t worker_env(struct agent *a, int n, char **fixed)
{
	size_t ncommon;

	return ec_worker_env(&a->c, a->fixed, a->nfixed, n, a->host, a->env->local_cpus, fixed,
	                     &ncommon);
}

/* The running worker with this id, or -1; doomed ones only when doomed is true. */
static int find_worker(struct agent *a, const char *id, bool doomed)
{
	for (int i = 0; i < a->j->nstarted; i++) {
		if (a->j->ranks[i].running && a->w[i].doomed == doomed &&
		    strcmp(a->j->ranks[i].worker, id) == 0)
			return i;
	}
	return -1;
}

/*
 * The newest plan: this host's ranks go on in their workers or start in fresh ones, the
 * dropped are let go. A fresh worker whose id an old process still has waits until that
 * one is reaped (it is killed first), so an id never names two processes.
 */
static void apply_plan(struct agent *a)
{
	struct batch_rank *br;
	char key[32], *text = NULL, *fixed[MAX_FIXED];
	int g = (int)peek_int(a, 0, "el/gen", 0), n = 0, size = 0, lines = 0;
	bool wait = false;
	size_t nfixed;

	if (g <= a->applied)
		return;
	snprintf(key, sizeof(key), "el/plan/%d", g);
	if (peek(a, 0, key, &text) != KHOR_SUCCESS)
		return;
	for (const char *l = text; (l = strchr(l, '\n')) != NULL; l++)
		lines++;
	br = calloc((size_t)lines + 1, sizeof(*br));
	if (br == NULL) {
		free(text);
		say("agent %s: out of memory reading generation %d's plan", a->host, g);
		return;
	}
	for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		char id[EP_HOST_MAX + 16], host[EP_HOST_MAX + 1];
		struct batch_rank b;
		int i;

		if (sscanf(l, "size %d", &size) == 1)
			continue;
		if (sscanf(l, "drop %270s", id) == 1) {
			if ((i = find_worker(a, id, false)) >= 0) {
				a->w[i].doomed = true;
				a->w[i].stop_at = now_ms() + a->c.hb_timeout_ms + a->j->o.grace_ms;
			}
			continue;
		}
		if (!plan_rank_line(l, &b.rank, id, host, &b.lrank, &b.lsize, &b.xrank, &b.xsize) ||
		    strcmp(host, a->host) != 0)
			continue;
		if ((i = find_worker(a, id, false)) >= 0) {
			a->w[i].gen = g;
			continue;
		}
		if ((i = find_worker(a, id, true)) >= 0) {
			procs_signal_rank(a->j, &a->j->ranks[i], SIGKILL);
			wait = true;
			continue;
		}
		b.slot = b.lrank;
		if (n < lines)
			br[n++] = b;
	}
	free(text);
	if (wait || n == 0) {
		if (!wait)
			a->applied = g;
		free(br); /* waiting: again next turn, once the old ones are reaped */
		return;
	}
	a->applied = g;
	if (a->path == NULL) {
		int rc = spawn_resolve_program(a->j->o.prog_argv[0], &a->path);
		if (rc != 0) {
			a->j->cause = CAUSE_SPAWN;
			a->j->spawn_exit = rc;
			free(br);
			return;
		}
	}
	nfixed = worker_env(a, size, fixed);
	if (nfixed == 0) {
		say("agent %s: out of memory building the ranks' environment", a->host);
		free(br);
		return;
	}
	struct batch b = { .host = a->host, .here = true, .r = br, .n = n, .fixed = fixed,
		           .nfixed = nfixed, .ncommon = nfixed, .path = a->path,
		           .cwd = a->env->cwd, .child_mask = a->env->child_mask };
	int first = batch_start(a->j, &b);
	for (size_t i = 0; i < nfixed; i++)
		free(fixed[i]);
	free(br);
	if (first < 0 || !lw_room(a)) {
		say("agent %s: cannot start generation %d's workers", a->host, g);
		return;
	}
	for (int k = 0; k < n; k++)
		a->w[first + k] = (struct lw){ .gen = g };
}

/* The leader asked for a worker here to be killed (its heartbeat stalled). */
static void fences(struct agent *a)
{
	for (int i = 0; i < a->j->nstarted; i++) {
		char key[EP_HOST_MAX + 48], *v;

		if (!a->j->ranks[i].running || a->w[i].doomed)
			continue;
		snprintf(key, sizeof(key), "el/fence/%d/%s", a->w[i].gen, a->j->ranks[i].worker);
		if (peek(a, 0, key, &v) != KHOR_SUCCESS)
			continue;
		say("agent %s: killing worker %s: %s", a->host, a->j->ranks[i].worker, v);
		free(v);
		procs_signal_rank(a->j, &a->j->ranks[i], SIGKILL);
		a->w[i].doomed = true;
	}
}

/* Dropped workers exit 0 on their own; one that does not is stopped, in steps. */
static void stop_dropped(struct agent *a, int64_t now)
{
	for (int i = 0; i < a->j->nstarted; i++) {
		struct lw *w = &a->w[i];

		if (!w->doomed || !a->j->ranks[i].running || w->stop_at == 0 || now < w->stop_at ||
		    w->stop_sigs >= 2)
			continue;
		procs_signal_rank(a->j, &a->j->ranks[i], w->stop_sigs == 0 ? SIGTERM : SIGKILL);
		w->stop_sigs++;
		w->stop_at = now + a->j->o.grace_ms;
	}
}

/* el/result: the job is over; this host stops what still runs and exits with its status. */
static void check_result(struct agent *a)
{
	char *v;

	if (a->over || peek(a, 0, "el/result", &v) != KHOR_SUCCESS)
		return;
	a->over = true;
	a->rc = atoi(v);
	free(v);
	if (a->j->nrunning > 0 && !a->j->stopping)
		procs_begin_stop(a->j, SIGTERM);
	a->j->keep_open = false;
}

static void turn(struct agent *a)
{
	struct job *j = a->j;
	int64_t now = now_ms();

	if (!lw_room(a)) {
		say("agent %s: out of memory", a->host);
		j->cause = CAUSE_SPAWN;
		j->spawn_exit = 1;
	}
	if (j->cause != CAUSE_NONE && !a->over) {
		/* Interrupted, or a start failed here: this host stops, the job counts it gone. */
		a->over = true;
		a->rc = -1;
		j->keep_open = false;
		return;
	}
	keepalive(a, now);
	if (now < a->next_poll)
		return;
	a->next_poll = now + POLL_MS;
	report_ends(a);
	check_result(a);
	if (a->over)
		return;
	if (!a->leader)
		campaign(a);
	if (a->leader)
		lead(a, now);
	apply_plan(a);
	fences(a);
	stop_dropped(a, now);
}

/* --- the start ------------------------------------------------------------------------ */

/* A duration the ranks read too: -x VAR=..., else khorrun's environment, else dflt. */
/* The job secret: given to every agent, or made by the first one and kept in etcd. */
static bool job_secret(struct agent *a)
{
	const char *given = env_rank_value(&a->j->o, "KHOR_SECRET");
	char key[200], fresh[65];
	struct etcd_kv cur = { 0 };
	bool swapped = false;
	kerr err;

	if (given != NULL && *given != '\0') {
		kstrlcpy(a->secret, given, sizeof(a->secret));
		return true;
	}
	if (!kauth_new_secret(fresh)) {
		say("cannot get random bytes for the job secret (getrandom failed)");
		return false;
	}
	snprintf(key, sizeof(key), "%s/0/el/secret", a->job);
	kerr_clear(&err);
	if (etcd_cas(a->e, key, NULL, 0, fresh, strlen(fresh), 0, kdeadline_in_ms(OP_MS), &swapped,
	             &cur, &err) != KHOR_SUCCESS) {
		say("agent %s: %s", a->host, err.text);
		return false;
	}
	kstrlcpy(a->secret, swapped ? fresh : (const char *)cur.val, sizeof(a->secret));
	etcd_kv_free(&cur);
	return true;
}

static bool prepare(struct agent *a)
{
	struct opts *o = &a->j->o;
	char host[256];
	uint16_t port;
	kerr err;

	a->job = o->rdzv_id;
	if (o->rdzv_host != NULL)
		kstrlcpy(a->host, o->rdzv_host, sizeof(a->host));
	else if (gethostname(a->host, sizeof(a->host)) != 0)
		kstrlcpy(a->host, "localhost", sizeof(a->host));
	ec_init(&a->c, &agent_ops, a);
	/* No HOROVOD_ELASTIC_TIMEOUT here: the agents read KHOR_ELASTIC_TIMEOUT only. */
	if (!ec_timeouts(&a->c, o, NULL))
		return false;
	if (!ksock_split_hostport(o->rdzv_endpoint, host, sizeof(host), &port)) {
		say("--rdzv-endpoint wants HOST:PORT (etcd's client port), not '%s'",
		    o->rdzv_endpoint);
		return false;
	}
	snprintf(a->store_addr, sizeof(a->store_addr), "%s%s", STORE_ETCD_SCHEME,
	         o->rdzv_endpoint);
	kerr_clear(&err);
	if (etcd_open(host, port, kdeadline_in_ms(30000), &a->e, &err) != KHOR_SUCCESS ||
	    store_connect(a->store_addr, "", a->job, kdeadline_in_ms(30000), &a->s, &err) !=
	        KHOR_SUCCESS) {
		say("agent %s: cannot reach the job's etcd: %s", a->host, err.text);
		return false;
	}
	if (!job_secret(a) || !register_host(a, true))
		return false;
	if (!env_add_fixed(a->fixed, &a->nfixed, "KHOR_STORE_ADDR=%s", a->store_addr) ||
	    !env_add_fixed(a->fixed, &a->nfixed, "KHOR_SECRET=%s", a->secret) ||
	    !env_add_fixed(a->fixed, &a->nfixed, "KHOR_JOB_ID=%s", a->job) ||
	    !env_add_fixed(a->fixed, &a->nfixed, "KHOR_LAUNCHER=khorrun") ||
	    (o->timeout != NULL && !env_add_fixed(a->fixed, &a->nfixed, "KHOR_TIMEOUT=%s",
	                                          o->timeout))) {
		say("out of memory building the ranks' environment");
		return false;
	}
	KLOG_INFO("khorrun: agent %s of job %s: %d slot%s, etcd at %s", a->host, a->job,
	          o->slots_per_host, o->slots_per_host == 1 ? "" : "s", o->rdzv_endpoint);
	return true;
}

/*
 * The job is over and this agent has left: the last one out deletes every key the job
 * wrote ("<job>/"), so that etcd keeps nothing of a finished job (and a job started again
 * under the same id does not read the last one's result). An agent killed before it could
 * leave keeps its registration until its lease runs out; then nobody is the last, and the
 * keys stay: the README says how to delete them.
 */
static void forget_job(struct agent *a)
{
	char prefix[200];
	struct etcd_kv *kvs;
	int n;
	int64_t deleted = 0;
	kerr err;

	snprintf(prefix, sizeof(prefix), "%s/0/el/agent/", a->job);
	kerr_clear(&err);
	if (etcd_list(a->e, prefix, kdeadline_in_ms(OP_MS), &kvs, &n, &err) != KHOR_SUCCESS)
		return;
	etcd_kvs_free(kvs, n);
	if (n > 0)
		return; /* not the last: that one deletes them */
	snprintf(prefix, sizeof(prefix), "%s/", a->job);
	if (etcd_del_prefix(a->e, prefix, kdeadline_in_ms(OP_MS), &deleted, &err) != KHOR_SUCCESS)
		say("agent %s: cannot delete the job's keys from etcd (%s*): %s", a->host, prefix,
		    err.text);
	else
		KLOG_INFO("khorrun: agent %s: the last agent out deleted the job's %lld keys",
		          a->host, (long long)deleted);
}

static void agent_free(struct agent *a)
{
	kerr err;

	if (a->e != NULL && a->lease != 0) {
		(void)etcd_lease_revoke(a->e, a->lease, kdeadline_in_ms(OP_MS), &err);
		if (a->over)
			forget_job(a);
	}
	if (a->leader)
		ep_free(&a->c.st);
	if (a->s != NULL)
		store_close(a->s);
	etcd_close(a->e);
	for (size_t i = 0; i < a->nfixed; i++)
		free(a->fixed[i]);
	free(a->c.plan);
	free(a->pr);
	free(a->w);
	free(a->path);
}

int agent_run(struct job *j, const struct agent_env *env)
{
	struct agent a = { .j = j, .env = env };
	struct loop l;
	int rc = 1;

	j->elastic = true;
	j->script_pid = -1;
	/* A killed agent's workers must not run on unwatched: they die with it. */
	j->die_with_khorrun = true;
	j->child_mask = *env->child_mask;
	if (!prepare(&a))
		goto out;
	if (!output_init_ranks(j) || !loop_open(j, &l)) {
		say("agent %s: cannot set up the ranks' output", a.host);
		goto out;
	}
	j->keep_open = true;
	turn(&a);
	while (loop_turn(j, &l, NULL, 0, POLL_MS))
		turn(&a);
	loop_close(j, &l);
	report_ends(&a); /* the last ones, for the leader's count */
	rc = a.rc < 0 || j->cause != CAUSE_NONE ? -1 : a.rc;
out:
	agent_free(&a);
	return rc;
}
