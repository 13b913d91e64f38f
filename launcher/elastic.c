/*
 * elastic.c -- khorrun's elastic driver (docs/ELASTIC.md, "The driver"). It runs on
 * khorrun's one thread, between the turns of the poll loop (loop.c), so a worker's end is
 * seen within the turn it is reaped in and its generation's abort written right after:
 *
 *   loop_turn: output, reaping, ssh  ->  ends(): a loss writes <job>/<g>/abort at once
 *                                     ->  discovery: a run of the script, or the fixed hosts
 *                                     ->  every POLL_MS: el/want/<g>, the heartbeats
 *                                     ->  a new generation when one is needed and possible
 *
 * It talks to khorrun's own store as a client, like any rank, through the generic store
 * interface, and keeps no state there but what the contract names: el/plan/<g>, el/gen,
 * el/update/<g>, el/done and the aborts. What a generation is made of comes from
 * elastic_plan.c, what a loss or a request does to it from elastic_core.c (shared with the
 * etcd agents' leader); the processes are started by batch.c and signalled by procs.c.
 *
 * A generation ends by a loss (a worker exited non-zero, was killed, its host's connection
 * ended, or its heartbeat stalled and khorrun killed it), or by the workers asking for a new
 * one (el/want/<g>: after el/update/<g>, or after an error of their own). The next one is
 * planned as soon as --min-np slots are there; the fenced must be reaped first, so that a
 * slot given again never has two processes under one worker id.
 */
#include "elastic.h"

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/parse.h"
#include "khor.h"
#include "rendezvous/store.h"
#include "runtime/config.h"

#include "batch.h"
#include "discover.h"
#include "elastic_core.h"
#include "elastic_plan.h"
#include "env.h"
#include "hosts.h"
#include "loop.h"
#include "output.h"
#include "procs.h"
#include "say.h"
#include "spawn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* How often the store is asked for el/want/<g> and the heartbeats. */
#define POLL_MS 100
/* Horovod's discovery period. */
#define DISCOVER_EVERY_MS 1000

/* What the driver knows of one worker; e->w[i] is j->ranks[i]. */
struct ew {
	int host, slot;    /* index into st.hosts; its slot there */
	int rank;          /* its rank in generation e->c.gen; -1: none */
	bool dropped;      /* a plan dropped it: it should exit 0 */
	bool fenced;       /* khorrun killed it (its heartbeat stalled, or its id is wanted) */
	int64_t killed_at; /* when khorrun sent it SIGKILL (fenced, or dropped and stopped) */
	bool abandoned;    /* its host did not answer: khorrun closed the ssh connection */
	int64_t hb, hb_at; /* the last heartbeat count seen in generation e->c.gen, and when */
	/*
	 * A survivor kept into generation e->c.gen, until it joins it: its rank in the
	 * generation before (-1: none to watch), the heartbeat count last seen there and when
	 * it last moved (or the plan was written), so that one stopped between generations is
	 * fenced.
	 */
	int prev_rank;
	int64_t prev_hb, alive_at;
	int64_t stop_at; /* dropped: when to signal it if it has not exited */
	int stop_sigs;   /* signals sent to it since it was dropped */
};

struct elastic {
	struct job *j;
	const struct elastic_env *env;
	const sigset_t *child_mask;
	struct ec c; /* the generations (elastic_core.h) */
	bool *here; /* per host of st: this host (no ssh) */
	int nhere;
	bool have_script;
	struct discover disc;
	struct ep_list fixed; /* the hosts, without a script */
	int64_t disc_next;
	/* The last failure said, so that a script failing every second is said once. */
	char disc_err[512];
	store *s;
	struct ew *w;
	int nw;

	int64_t lost_at;      /* the first loss in generation c.gen; 0: none */
	int64_t settle_check; /* when settled() may ask the store again */
	int64_t next_poll;
	bool done_said; /* el/done written */
	int rc;
	char *path; /* the program here, once looked up */

	int64_t hb_every_ms, next_hb; /* c.hb_timeout_ms -1: no heartbeat check */
};

static int64_t now_ms(void)
{
	return (int64_t)(kclock_ns() / 1000000u);
}

/* Makes e->w cover every rank started so far. */
static bool ew_room(struct elastic *e)
{
	struct ew *w;

	if (e->nw >= e->j->nstarted)
		return true;
	w = realloc(e->w, (size_t)e->j->cap_ranks * sizeof(*w));
	if (w == NULL)
		return false;
	e->w = w;
	memset(w + e->nw, 0, (size_t)(e->j->cap_ranks - e->nw) * sizeof(*w));
	for (int i = e->nw; i < e->j->cap_ranks; i++)
		w[i].rank = -1;
	e->nw = e->j->cap_ranks;
	return true;
}

static void tell_done(struct elastic *e)
{
	kerr err;

	if (e->done_said || e->s == NULL)
		return;
	e->done_said = true;
	store_set_prefix(e->s, e->env->job_id, 0);
	if (store_set(e->s, "el/done", "1", 1, &err) != KHOR_SUCCESS)
		KLOG_WARN("khorrun: elastic: cannot write el/done: %s", err.text);
}

/* The job cannot go on: say why, tell the workers waiting in init, stop the others. */
static void job_failed(void *ctx, int rc, const char *msg)
{
	struct elastic *e = ctx;

	if (e->c.ending)
		return;
	say("%s", msg);
	e->c.ending = true;
	e->rc = rc;
	tell_done(e);
	e->j->keep_open = false;
	if (e->j->nrunning > 0 && !e->j->stopping)
		procs_begin_stop(e->j, SIGTERM);
}

static void store_failed(struct elastic *e, const char *what, const kerr *err)
{
	ec_fail(&e->c, 1, "elastic: the store failed (%s): %s", what, err->text);
}

static bool put(struct elastic *e, int gen, const char *key, const char *val)
{
	kerr err;

	kerr_clear(&err);
	store_set_prefix(e->s, e->env->job_id, gen);
	if (store_set(e->s, key, val, strlen(val), &err) != KHOR_SUCCESS) {
		store_failed(e, key, &err);
		return false;
	}
	return true;
}

/* A counter's value without changing it (absent: 0). */
static bool count(struct elastic *e, int gen, const char *key, int64_t *out)
{
	kerr err;

	kerr_clear(&err);
	store_set_prefix(e->s, e->env->job_id, gen);
	if (store_add(e->s, key, 0, out, &err) != KHOR_SUCCESS) {
		store_failed(e, key, &err);
		return false;
	}
	return true;
}

/* A key's value if it is there now (malloc'd), else NULL. */
static char *peek(struct elastic *e, int gen, const char *key)
{
	void *v = NULL;
	size_t len;
	kerr err;

	kerr_clear(&err);
	store_set_prefix(e->s, e->env->job_id, gen);
	if (store_get(e->s, key, kdeadline_in_ms(0), &v, &len, &err) != KHOR_SUCCESS)
		return NULL;
	return v;
}

/* Ends generation gen for its ranks: the first abort written is the one they report. */
static void write_abort(void *ctx, int gen, const char *text)
{
	struct elastic *e = ctx;
	int64_t n = 0;
	kerr err;

	kerr_clear(&err);
	store_set_prefix(e->s, e->env->job_id, gen);
	if (store_add(e->s, "abort_count", 1, &n, &err) != KHOR_SUCCESS) {
		store_failed(e, "abort_count", &err);
		return;
	}
	if (n == 1)
		(void)put(e, gen, "abort", text);
}

static const struct ec_ops elastic_ops = { .fail = job_failed, .abort_gen = write_abort };

/* "killed by signal 9 (SIGKILL)", or what is known of a rank on a host now gone. */
static void end_text(const struct elastic *e, int i, char *buf, size_t len)
{
	const struct rank *rk = &e->j->ranks[i];
	const struct host *h = &e->j->hosts[rk->host];

	if (rk->lost) {
		if (h->failed && !h->ready)
			snprintf(buf, len, "it could not be started there%s%s",
			         h->last_err[0] ? ": " : "", h->last_err);
		else
			snprintf(buf, len,
			         "the ssh connection to %s ended before its exit was known%s%s",
			         h->name, h->last_err[0] ? ": " : "", h->last_err);
	} else {
		ec_end_words(rk->wstatus, buf, len);
	}
}

/*
 * Worker i is lost (why: how). Its generation ends for everyone at once; on several hosts
 * its host is blacklisted (its other workers are dropped by the next plan), on one host
 * its slot gets a fresh worker, unless it could not even be started there (ssh refused):
 * a fresh one would fail the same way, generation after generation, so that host is
 * blacklisted too.
 */
static void lost(struct elastic *e, int i, const char *why)
{
	const struct ew *w = &e->w[i];
	const struct rank *rk = &e->j->ranks[i];
	const struct host *h = &e->j->hosts[rk->host];
	struct ec_loss l = { .rank = w->rank,
		             .host = w->host,
		             .worker = rk->worker,
		             .why = why,
		             .finish_rc = rk->lost ? 255 : ec_exit_status(rk->wstatus),
		             .blacklist = true,
		             .unstartable = rk->lost && h->failed && !h->ready };

	if (!e->c.finishing && e->lost_at == 0)
		e->lost_at = now_ms();
	ec_lost(&e->c, &l);
}

/*
 * Kills worker i, whose heartbeat stalled (in generation e->c.gen, or between the one it
 * left and this one it has not joined), before anyone hears of it (fencing).
 */
static void fence(struct elastic *e, int i, int64_t stalled_ms, bool joining)
{
	char why[256];

	procs_signal_rank(e->j, &e->j->ranks[i], SIGKILL);
	e->w[i].fenced = true;
	e->w[i].killed_at = now_ms();
	ep_fence_text(why, sizeof(why), stalled_ms, e->c.hb_timeout_ms, "khorrun",
	              joining ? e->c.gen - 1 : 0);
	lost(e, i, why);
}

/* The ends the loop reaped (or hosts reported) since the last turn. */
static void ends(struct elastic *e)
{
	struct job *j = e->j;

	for (int i = 0; i < j->nstarted; i++) {
		struct rank *rk = &j->ranks[i];
		struct ew *w = &e->w[i];
		char why[600];

		if (rk->running || rk->noted)
			continue;
		rk->noted = true;
		if (e->c.ending || w->dropped || w->fenced)
			continue; /* expected, or said when it was fenced */
		if (!rk->lost && WIFEXITED(rk->wstatus) && WEXITSTATUS(rk->wstatus) == 0) {
			if (!e->c.finishing)
				KLOG_INFO("khorrun: elastic: worker %s (rank %d of generation %d) "
				          "exited 0: the job is finishing, no new generation",
				          rk->worker, w->rank, e->c.gen);
			e->c.finishing = true;
			e->c.need_gen = false;
			tell_done(e);
			continue;
		}
		end_text(e, i, why, sizeof(why));
		lost(e, i, why);
	}
	/* Buffers of ranks whose output has all come are not kept for the rest of the job. */
	for (int i = 0; i < j->nstarted; i++) {
		const struct rank *rk = &j->ranks[i];

		if (rk->noted && (rk->pid >= 0 || j->hosts[rk->host].finished))
			output_release_rank(&j->ranks[i]);
	}
}

/*
 * Whether each host first seen is this one (computed once: it may ask DNS); one the ranks
 * could not reach the store from is left out for good.
 */
static bool note_new_hosts(struct elastic *e)
{
	if (e->nhere >= e->c.st.nhosts)
		return true;
	bool *h = realloc(e->here, (size_t)e->c.st.cap * sizeof(*h));

	if (h == NULL)
		return false;
	e->here = h;
	for (int i = e->nhere; i < e->c.st.nhosts; i++) {
		h[i] = place_host_is_here(e->c.st.hosts[i].name);
		if (!h[i] && e->env != NULL && e->env->store_loopback) {
			say("elastic: host %s cannot reach the store, which listens on %s only; "
			    "it is left out (give --bind-store with an address every host reaches)",
			    e->c.st.hosts[i].name, e->env->store_host);
			ep_exclude(&e->c.st, i);
		}
	}
	e->nhere = e->c.st.nhosts;
	return true;
}

/* A discovery's hosts: the state takes them in; a change the ranks must act on is told. */
static void take_hosts(struct elastic *e, const struct ep_list *l)
{
	int flags = ep_update(&e->c.st, l, now_ms());
	char words[32], slots[512], key[64];

	if (flags < 0 || !note_new_hosts(e)) {
		ec_fail(&e->c, 1, "elastic: out of memory taking in the hosts");
		return;
	}
	if (!ec_hosts_changed(&e->c, flags, slots, sizeof(slots)))
		return;
	ep_update_words(e->c.updates, words, sizeof(words));
	snprintf(key, sizeof(key), "el/update/%d", e->c.gen);
	if (!put(e, 0, key, words))
		return;
	ep_update_words((unsigned)flags, words, sizeof(words));
	say("elastic: hosts %s during generation %d; the ranks go to a new generation at their "
	    "next commit (%s)",
	    words, e->c.gen, slots[0] ? slots : "no slots");
}

/* The discovery script, or the fixed hosts again (a cooldown may have ended). */
static void discovery(struct elastic *e, short revents)
{
	int64_t now = now_ms();
	char why[512];
	bool ok;

	if (!e->have_script) {
		if (now >= e->disc_next) {
			take_hosts(e, &e->fixed);
			e->disc_next = now + DISCOVER_EVERY_MS;
		}
		return;
	}
	if (!e->disc.running) {
		if (now < e->disc_next)
			return;
		if (!discover_start(e->j, &e->disc, e->child_mask, why, sizeof(why))) {
			say("elastic: cannot run the host discovery script: %s; trying again "
			    "in 1 s",
			    why);
			e->disc_next = now + DISCOVER_EVERY_MS;
		}
		return;
	}
	if (!discover_step(e->j, &e->disc, revents, &ok, why, sizeof(why)))
		return;
	e->disc_next = now_ms() + DISCOVER_EVERY_MS;
	if (ok) {
		struct ep_list l;

		if (ep_parse_hosts(e->disc.out, e->disc.len, e->j->o.slots_per_host, &l, why,
		                   sizeof(why))) {
			if (e->disc_err[0] != '\0')
				say("elastic: the host discovery script works again");
			e->disc_err[0] = '\0';
			take_hosts(e, &l);
			ep_list_free(&l);
			return;
		}
	}
	/* Horovod's rule: after the first run, a failure is said and the hosts stay. */
	if (strcmp(why, e->disc_err) != 0)
		say("elastic: the host discovery script failed: %s; the hosts stay as they were, "
		    "and it runs again every second",
		    why);
	kstrlcpy(e->disc_err, why, sizeof(e->disc_err));
}

/* The reason a worker gave for asking for a new generation. */
static char *asked_why(struct elastic *e, int *who)
{
	for (int i = 0; i < e->j->nstarted; i++) {
		char key[STORE_KEY_MAX];
		char *v;

		if (e->w[i].rank < 0 || e->w[i].dropped)
			continue;
		snprintf(key, sizeof(key), "el/why/%d/%s", e->c.gen, e->j->ranks[i].worker);
		v = peek(e, 0, key);
		if (v != NULL) {
			*who = i;
			return v;
		}
	}
	*who = -1;
	return NULL;
}

/* el/want/<gen>: the ranks want a new generation (a host update, or an error of theirs). */
static void check_want(struct elastic *e)
{
	char key[64];
	int64_t n = 0;
	int who;
	char *why;

	snprintf(key, sizeof(key), "el/want/%d", e->c.gen);
	if (!count(e, 0, key, &n) || n == 0)
		return;
	e->c.gen_over = true;
	if (e->c.updates != 0) {
		KLOG_INFO("khorrun: elastic: the ranks of generation %d asked for a new one after "
		          "the host update",
		          e->c.gen);
		ec_want_gen(&e->c);
		return;
	}
	why = asked_why(e, &who);
	if (who >= 0)
		ec_asked(&e->c, e->w[who].rank, e->c.st.hosts[e->w[who].host].name,
		         e->j->ranks[who].worker, why);
	else
		ec_asked(&e->c, -1, NULL, NULL, NULL);
	free(why);
}

/*
 * A survivor kept into this generation that has not joined it yet (no host/<rank> key of
 * its bootstrap): until it does, its heartbeat is the one of the generation it left, which
 * stops at its khor_finalize, and from there to its join it has no heartbeat at all. Its
 * init needs no time but the bootstrap's, so one whose old heartbeat has not moved for
 * the heartbeat timeout (counted from the plan at the earliest) is stopped or hung: left
 * alone, every generation would wait for it until KHOR_INIT_TIMEOUT, and plan it again.
 * True when it is fenced.
 */
static bool join_stalled(struct elastic *e, int i, int64_t now)
{
	struct ew *w = &e->w[i];
	char key[32], *val;
	int64_t stalled;

	if (w->prev_rank < 0 || w->hb > 0)
		return false;
	snprintf(key, sizeof(key), "host/%d", w->rank);
	val = peek(e, e->c.gen, key);
	if (val != NULL) {
		free(val);
		w->prev_rank = -1; /* it joined: from here on, its heartbeat in this generation */
		return false;
	}
	snprintf(key, sizeof(key), "hb/%d", w->prev_rank);
	val = peek(e, e->c.gen - 1, key);
	stalled = ep_join_stall(&w->prev_hb, &w->alive_at, val, now, e->c.hb_timeout_ms);
	free(val);
	if (stalled == 0)
		return false;
	fence(e, i, stalled, true);
	return true;
}

/* Each rank's heartbeat in this generation; a stalled one is fenced. */
static void check_heartbeats(struct elastic *e, int64_t now)
{
	for (int i = 0; i < e->j->nstarted && !e->c.gen_over; i++) {
		struct ew *w = &e->w[i];
		char key[32], *val;
		int64_t stalled;

		if (w->rank < 0 || w->dropped || w->fenced || !e->j->ranks[i].running)
			continue;
		if (join_stalled(e, i, now))
			continue;
		/* Read, never added to: khor_finalize removes the counter, and it must stay gone.
		 */
		snprintf(key, sizeof(key), "hb/%d", w->rank);
		val = peek(e, e->c.gen, key);
		stalled = ep_heartbeat(&w->hb, &w->hb_at, &e->c.gen_beat_at, val, now,
		                       e->c.hb_timeout_ms);
		free(val);
		if (stalled > 0)
			fence(e, i, stalled, false);
	}
}

/* Dropped workers exit 0 on their own; one that does not is stopped, in steps. */
static void stop_dropped(struct elastic *e, int64_t now)
{
	for (int i = 0; i < e->j->nstarted; i++) {
		struct ew *w = &e->w[i];
		struct rank *rk = &e->j->ranks[i];

		if (!w->dropped || !rk->running || now < w->stop_at || w->stop_sigs >= 2)
			continue;
		if (w->stop_sigs == 0)
			say("elastic: worker %s was dropped but has not exited; stopping it",
			    rk->worker);
		procs_signal_rank(e->j, rk, w->stop_sigs == 0 ? SIGTERM : SIGKILL);
		if (w->stop_sigs == 1)
			w->killed_at = now;
		w->stop_sigs++;
		w->stop_at = now + e->j->o.grace_ms;
	}
}

/*
 * A worker khorrun killed that has not ended KILL_WAIT_MS later is on a host that does not
 * answer (its link is down): the SIGKILL waits in the ssh connection, which ssh gives up
 * on only after ServerAlive's 30 s or so. Once the job is finishing nothing else waits for
 * such workers, so a host whose running workers are all of that kind has its connection
 * closed: they end here as lost (said when they were fenced or dropped), and its helper
 * stops them there when the end of the session reaches it.
 */
static void abandon_silent(struct elastic *e, int64_t now)
{
	struct job *j = e->j;

	for (int h = 0; h < j->nhosts; h++) {
		struct host *hp = &j->hosts[h];
		int silent = -1;
		bool other = false;

		if (hp->local || !hp->ssh_running)
			continue;
		for (int r = hp->first; r < hp->first + hp->n && !other; r++) {
			const struct ew *w = &e->w[r];

			if (!j->ranks[r].running)
				continue;
			if (w->killed_at > 0 && now - w->killed_at >= KILL_WAIT_MS && !w->abandoned)
				silent = r;
			else
				other = true;
		}
		if (silent < 0 || other)
			continue;
		say("elastic: %s does not answer: worker %s did not end %.1f s after khorrun killed "
		    "it; closing the ssh connection to %s (its helper stops what is left there when "
		    "the connection's end reaches it)", hp->name, j->ranks[silent].worker,
		    (double)(now - e->w[silent].killed_at) / 1000.0, hp->name);
		for (int r = hp->first; r < hp->first + hp->n; r++)
			e->w[r].abandoned = true;
		(void)kill(-hp->ssh_pid, SIGKILL);
	}
}

/* The environment of a batch of workers of this generation (fixed[], returns how many). */
static size_t batch_env(struct elastic *e, const char *host, bool here, char **fixed,
                        size_t *ncommon)
{
	return ec_worker_env(&e->c, e->env->common, e->env->ncommon, e->c.nplan,
	                     here ? host : NULL, e->env->local_cpus, fixed, ncommon);
}

/* Starts the fresh workers of the new plan, one batch per host. */
static void start_workers(struct elastic *e, const int *keep)
{
	struct batch_rank *br = calloc((size_t)e->c.nplan, sizeof(*br));

	if (br == NULL) {
		ec_fail(&e->c, 1, "elastic: out of memory starting generation %d", e->c.gen);
		return;
	}
	for (int r = 0; r < e->c.nplan && !e->c.ending && e->j->cause == CAUSE_NONE; r++) {
		int h = e->c.plan[r].host, n = 0, first;
		char *fixed[MAX_FIXED];
		size_t nfixed, ncommon;
		struct batch b;

		if (r > 0 && e->c.plan[r - 1].host == h)
			continue; /* each host once, at its first rank */
		for (int q = r; q < e->c.nplan && e->c.plan[q].host == h; q++) {
			const struct ep_slot *s = &e->c.plan[q];

			if (keep[q] < 0)
				br[n++] = (struct batch_rank){ s->rank,       s->local_rank,
					                       s->local_size, s->cross_rank,
					                       s->cross_size, s->local_rank };
		}
		if (n == 0)
			continue;
		if (e->here[h] && e->path == NULL) {
			int rc = spawn_resolve_program(e->j->o.prog_argv[0], &e->path);

			if (rc != 0) {
				e->j->cause = CAUSE_SPAWN;
				e->j->spawn_exit = rc;
				break;
			}
		}
		nfixed = batch_env(e, e->c.st.hosts[h].name, e->here[h], fixed, &ncommon);
		if (nfixed == 0) {
			ec_fail(&e->c, 1, "elastic: out of memory building the ranks' environment");
			break;
		}
		b = (struct batch){ .host = e->c.st.hosts[h].name,
			            .here = e->here[h],
			            .r = br,
			            .n = n,
			            .fixed = fixed,
			            .nfixed = nfixed,
			            .ncommon = ncommon,
			            .path = e->path,
			            .self_path = e->env->self_path,
			            .cwd = e->env->cwd,
			            .child_mask = e->child_mask };
		first = batch_start(e->j, &b);
		for (size_t i = 0; i < nfixed; i++)
			free(fixed[i]);
		if (first < 0 || !ew_room(e)) {
			ec_fail(&e->c, 1, "elastic: cannot start generation %d's workers on %s",
			        e->c.gen, e->c.st.hosts[h].name);
			break;
		}
		for (int k = 0; k < n; k++)
			e->w[first + k] = (struct ew){ .host = h, .slot = br[k].slot,
				                       .rank = br[k].rank, .prev_rank = -1 };
	}
	free(br);
}

/* The workers that go on into a new generation: running, and neither dropped nor fenced. */
static int live_workers(const struct elastic *e, struct ep_worker *lw, int *idx)
{
	int n = 0;

	for (int i = 0; i < e->j->nstarted; i++) {
		const struct ew *w = &e->w[i];

		if (!e->j->ranks[i].running || w->dropped || w->fenced)
			continue;
		lw[n] = (struct ep_worker){ w->host, w->slot };
		idx[n++] = i;
	}
	return n;
}

/*
 * A fresh worker is about to get the id of a process that has not gone yet (a dropped
 * worker of a host that came back, a fenced one not yet reaped): kill it and wait. True
 * while such a wait is on.
 */
static bool id_taken(struct elastic *e, const struct ep_slot *s, int n, const int *keep)
{
	bool wait = false;
	int64_t now = now_ms();

	for (int i = 0; i < e->j->nstarted; i++) {
		struct ew *w = &e->w[i];

		if (!e->j->ranks[i].running || !(w->dropped || w->fenced))
			continue;
		for (int r = 0; r < n; r++) {
			if (keep[r] >= 0 || s[r].host != w->host || s[r].local_rank != w->slot)
				continue;
			if (!w->fenced) {
				procs_signal_rank(e->j, &e->j->ranks[i], SIGKILL);
				w->fenced = true;
				w->killed_at = now;
			}
			/* One that SIGKILL does not end (a host gone silent) is not waited for
			 * forever; its helper kills it when the host is reached again. */
			if (now - w->killed_at < KILL_WAIT_MS)
				wait = true;
		}
	}
	return wait;
}

/*
 * After a loss, the next generation waits until every other worker of the old one has
 * either asked for it or gone too, for at most SETTLE_MS: workers that fail together (a
 * host's power, a bug every rank hits at the same step) then end one generation, not one
 * each, and when none is left the job ends as Horovod's does, instead of going on from
 * workers that never had the state.
 */
#define SETTLE_MS 500

static bool settled(struct elastic *e, int64_t now)
{
	char key[64];
	int64_t asked = 0;
	int alive = 0;

	if (e->c.gen == 0 || e->lost_at == 0 || now - e->lost_at >= SETTLE_MS)
		return true;
	if (now < e->settle_check)
		return false;
	e->settle_check = now + 10;
	for (int i = 0; i < e->j->nstarted; i++) {
		const struct ew *w = &e->w[i];

		if (w->rank >= 0 && !w->dropped && !w->fenced && e->j->ranks[i].running)
			alive++;
	}
	snprintf(key, sizeof(key), "el/want/%d", e->c.gen);
	return count(e, 0, key, &asked) && asked >= alive;
}

/* Plans the next generation and starts its fresh workers, once it can. */
static void plan_next(struct elastic *e)
{
	int need = e->c.gen == 0 ? e->j->o.np : e->c.st.min_np;
	struct ec_plan x;
	char *text = NULL, num[32], slots[512], said[1200];
	int n, nl, nd = 0, g = e->c.gen + 1;

	if (!ec_plan_new(&e->c, e->j->nstarted, &x)) {
		ec_fail(&e->c, 1, "elastic: out of memory planning generation %d", g);
		goto out;
	}
	n = ep_assign(&e->c.st, x.s, x.cap);
	if (n < need) {
		ec_short_of_slots(&e->c, need, now_ms(), true);
		goto out;
	}
	if (!ep_keeps_a_host(e->c.plan, e->c.nplan, x.s, n)) {
		ep_describe_slots(&e->c.st, x.s, n, slots, sizeof(slots));
		ec_fail(&e->c, 1,
		        "elastic: generation %d would have none of generation %d's hosts (%s), "
		        "so no rank to take the state from; the job cannot go on",
		        g, e->c.gen, slots);
		goto out;
	}
	nl = live_workers(e, x.lw, x.idx);
	ep_match(x.s, n, x.lw, nl, x.keep, x.drop);
	int kept = 0;
	for (int r = 0; r < n; r++) {
		x.keep[r] = x.keep[r] >= 0 ? x.idx[x.keep[r]] : -1;
		kept += x.keep[r] >= 0;
	}
	/* Only fresh workers: the state would start over, which is a failure (Horovod's too). */
	if (e->c.gen > 0 && kept == 0) {
		ec_fail(&e->c, 1,
		        "elastic: every worker of generation %d was lost, so no rank is left to "
		        "take the state from; the job cannot go on",
		        e->c.gen);
		goto out;
	}
	if (id_taken(e, x.s, n, x.keep))
		goto out;
	for (int k = 0; k < nl; k++) {
		if (x.drop[k])
			x.drops[nd++] = e->j->ranks[x.idx[k]].worker;
	}
	text = ep_plan_text(&e->c.st, g, x.s, n, x.drops, nd);
	if (text == NULL) {
		ec_fail(&e->c, 1, "elastic: out of memory planning generation %d", g);
		goto out;
	}
	snprintf(num, sizeof(num), "%d", g);
	{
		char key[32];

		snprintf(key, sizeof(key), "el/plan/%d", g);
		if (!put(e, 0, key, text) || !put(e, 0, "el/gen", num))
			goto out;
	}
	for (int i = 0; i < e->j->nstarted; i++) {
		struct ew *w = &e->w[i];

		w->prev_rank = w->rank;
		w->prev_hb = w->hb;
		w->alive_at = now_ms();
		w->rank = -1;
	}
	for (int k = 0; k < nl; k++) {
		struct ew *w = &e->w[x.idx[k]];

		if (x.drop[k]) {
			w->dropped = true;
			w->stop_at = now_ms() +
			             (e->c.hb_timeout_ms > 0 ? e->c.hb_timeout_ms : 10000) +
			             e->j->o.grace_ms;
		}
	}
	for (int r = 0; r < n; r++) {
		if (x.keep[r] >= 0) {
			e->w[x.keep[r]].rank = r;
			e->w[x.keep[r]].hb = e->w[x.keep[r]].hb_at = 0;
		}
	}
	ec_begin_gen(&e->c, g, x.s, n);
	x.s = NULL;
	e->lost_at = 0;
	ep_describe_gen(&e->c.st, g, e->c.plan, n, said, sizeof(said));
	if (nd > 0)
		snprintf(num, sizeof(num), "; %d dropped", nd);
	else
		num[0] = '\0';
	if (g == 1)
		KLOG_INFO("khorrun: elastic: %s", said);
	else
		say("elastic: %s%s", said, num);
	start_workers(e, x.keep);
out:
	free(text);
	ec_plan_free(&x);
}

/* One turn of the driver, after one turn of the loop. */
static void drive(struct elastic *e, short disc_revents)
{
	struct job *j = e->j;
	int64_t now;

	if (!ew_room(e)) {
		ec_fail(&e->c, 1, "elastic: out of memory");
		return;
	}
	if (j->cause != CAUSE_NONE && !e->c.ending) {
		/* Interrupted, or a start failed here: the job stops as a fixed one would. */
		e->c.ending = true;
		e->rc = -1;
		tell_done(e);
		j->keep_open = false;
	}
	ends(e);
	if (e->c.ending)
		return;
	discovery(e, disc_revents);
	now = now_ms();
	if (now >= e->next_poll && e->c.gen > 0 && !e->c.ending) {
		e->next_poll = now + POLL_MS;
		if (!e->c.gen_over && !e->c.finishing)
			check_want(e);
		if (!e->c.gen_over && !e->c.finishing && e->c.hb_timeout_ms > 0 &&
		    now >= e->next_hb) {
			e->next_hb = now + e->hb_every_ms;
			check_heartbeats(e, now);
		}
	}
	stop_dropped(e, now);
	if (e->c.finishing)
		abandon_silent(e, now);
	if (e->c.need_gen && !e->c.ending && settled(e, now))
		plan_next(e);
	if (e->c.finishing && j->nrunning == 0 && !e->c.ending) {
		e->c.ending = true;
		e->rc = 0;
		j->keep_open = false;
	}
}

int elastic_run(struct elastic *e, const struct elastic_env *env)
{
	struct job *j = e->j;
	struct loop l;
	kerr err;

	e->env = env;
	if (!note_new_hosts(e)) /* now that the store's reach is known */
		return 1;
	kerr_clear(&err);
	if (store_tcp_connect(env->store_host, env->store_port, env->secret, env->job_id,
	                      kdeadline_in_ms(10000), &e->s, &err) != KHOR_SUCCESS) {
		say("elastic: cannot reach the job's store at %s:%u: %s", env->store_host,
		    (unsigned)env->store_port, err.text);
		return 1;
	}
	if (!output_init_ranks(j) || !loop_open(j, &l)) {
		say("elastic: cannot set up the ranks' output");
		return 1;
	}
	j->keep_open = true;
	e->c.need_gen = true;
	e->c.wait_since = -1;
	e->disc_next = now_ms() + DISCOVER_EVERY_MS;
	drive(e, 0);
	for (;;) {
		struct pollfd extra = { .fd = e->disc.fd, .events = POLLIN };
		int nextra = e->have_script && e->disc.fd >= 0 ? 1 : 0;
		int timeout = POLL_MS;

		if (e->have_script)
			timeout = discover_wait_ms(&e->disc, timeout);
		if (!loop_turn(j, &l, &extra, nextra, timeout))
			break;
		drive(e, nextra > 0 ? extra.revents : 0);
	}
	loop_close(j, &l);
	/* A discovery run still going is khorrun's, not something the ranks left behind. */
	if (e->disc.running && !j->script_reaped && j->script_pid > 0) {
		(void)kill(-j->script_pid, SIGKILL);
		(void)waitpid(j->script_pid, NULL, 0);
		j->script_pid = -1;
	}
	if (e->rc < 0 || j->cause != CAUSE_NONE)
		return -1;
	return e->rc;
}

/* The first run of the discovery script, before anything else of the job exists. */
static int first_discovery(struct elastic *e, struct ep_list *out)
{
	struct job *j = e->j;
	struct discover *d = &e->disc;
	char why[512];
	bool ok = false;

	if (!discover_start(j, d, e->child_mask, why, sizeof(why))) {
		say("elastic: cannot run the host discovery script: %s", why);
		return 1;
	}
	while (d->running) {
		struct pollfd p[2] = { { .fd = j->sfd, .events = POLLIN },
			               { .fd = d->fd, .events = POLLIN } };
		struct signalfd_siginfo si;
		int st;

		(void)poll(p, d->fd >= 0 ? 2 : 1, discover_wait_ms(d, 100));
		while (read(j->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
			char name[32];

			if (si.ssi_signo == SIGCHLD)
				continue;
			(void)kill(-j->script_pid, SIGKILL);
			(void)waitpid(j->script_pid, NULL, 0);
			say("interrupted by %s during the first host discovery",
			    say_sig_name((int)si.ssi_signo, name, sizeof(name)));
			return 128 + (int)si.ssi_signo;
		}
		if (!j->script_reaped && waitpid(j->script_pid, &st, WNOHANG) == j->script_pid) {
			j->script_reaped = true;
			j->script_status = st;
			j->script_pid = -1;
		}
		if (discover_step(j, d, d->fd >= 0 ? p[1].revents : 0, &ok, why, sizeof(why)))
			break;
	}
	if (!ok) {
		say("elastic: the host discovery script failed on its first run, so the job "
		    "does not start: %s",
		    why);
		return 1;
	}
	if (!ep_parse_hosts(d->out, d->len, j->o.slots_per_host, out, why, sizeof(why))) {
		say("elastic: the host discovery script's first output is not a list of hosts, "
		    "so the job does not start: %s",
		    why);
		return 1;
	}
	return -1;
}

/* The hosts without a script: -H, --hostfile, Slurm, else this host. */
static int fixed_hosts(struct elastic *e)
{
	struct job *j = e->j;
	struct hostlist l = { 0 };
	bool slurm;

	if (!place_gather_hosts(&j->o, &l, &slurm)) {
		hostlist_free(&l);
		return 2;
	}
	for (int i = 0; i < l.n; i++) {
		if (!ep_list_add(&e->fixed, l.h[i].name, l.h[i].slots)) {
			hostlist_free(&l);
			say("out of memory");
			return 1;
		}
	}
	hostlist_free(&l);
	if (e->fixed.n == 0 &&
	    !ep_list_add(&e->fixed, "localhost", j->o.max_np > 0 ? j->o.max_np : j->o.np)) {
		say("out of memory");
		return 1;
	}
	return -1;
}

int elastic_prepare(struct job *j, const sigset_t *child_mask, struct elastic **out)
{
	struct elastic *e = calloc(1, sizeof(*e));
	struct ep_list first = { 0 };
	int rc;

	if (e == NULL) {
		say("out of memory");
		return 1;
	}
	*out = e;
	e->j = j;
	e->child_mask = child_mask;
	ec_init(&e->c, &elastic_ops, e);
	j->elastic = true;
	j->script_pid = -1;
	ep_init(&e->c.st, j->o.min_np, j->o.max_np, j->o.cool_min_ms, j->o.cool_max_ms,
	        j->o.reset_limit);
	if (!ec_timeouts(&e->c, &j->o, "HOROVOD_ELASTIC_TIMEOUT"))
		return 2;
	/*
	 * A stall is seen within a fortieth of the timeout, at most 250 ms after it (a store
	 * round trip per rank each time): a fenced rank's slot is given again that much sooner,
	 * and at 10 s, 1.25 s of polling period was an eighth of a SIGSTOP's recovery.
	 */
	e->hb_every_ms = e->c.hb_timeout_ms / 40 < POLL_MS ? POLL_MS
	                 : e->c.hb_timeout_ms / 40 > 250  ? 250
	                                                  : e->c.hb_timeout_ms / 40;
	if (j->o.discovery != NULL) {
		e->have_script = true;
		discover_init(&e->disc, j->o.discovery, j->o.discovery_timeout_ms);
		rc = first_discovery(e, &first);
		if (rc >= 0)
			return rc;
		rc = ep_update(&e->c.st, &first, now_ms()) < 0 ? 1 : -1;
		ep_list_free(&first);
	} else {
		rc = fixed_hosts(e);
		if (rc >= 0)
			return rc;
		rc = ep_update(&e->c.st, &e->fixed, now_ms()) < 0 ? 1 : -1;
	}
	if (rc < 0 && !note_new_hosts(e))
		rc = 1;
	if (rc == 1)
		say("out of memory");
	return rc;
}

const char *elastic_remote_host(const struct elastic *e)
{
	for (int i = 0; i < e->c.st.norder; i++) {
		if (!e->here[e->c.st.order[i]])
			return e->c.st.hosts[e->c.st.order[i]].name;
	}
	return NULL;
}

void elastic_free(struct elastic *e)
{
	if (e == NULL)
		return;
	if (e->s != NULL)
		store_close(e->s);
	discover_free(&e->disc);
	ep_list_free(&e->fixed);
	ep_free(&e->c.st);
	free(e->c.plan);
	free(e->here);
	free(e->w);
	free(e->path);
	free(e);
}
