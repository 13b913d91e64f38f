/*
 * elastic_core.c -- the generations of an elastic job as both of khorrun's drivers run
 * them (see elastic_core.h).
 */
#include "elastic_core.h"

#include "base/clock.h"
#include "base/parse.h"
#include "runtime/config.h"

#include "env.h"
#include "say.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int64_t now_ms(void)
{
	return (int64_t)(kclock_ns() / 1000000u);
}

void ec_init(struct ec *c, const struct ec_ops *ops, void *ctx)
{
	memset(c, 0, sizeof(*c));
	c->ops = ops;
	c->ctx = ctx;
	c->rnd = kclock_ns() | 1;
	c->wait_since = -1;
}

/*
 * A duration the ranks read too: -x VAR=..., else khorrun's environment (then alias),
 * else the settings table's default (runtime/config.c). False with the reason said.
 */
static bool rank_duration(const struct opts *o, const char *name, const char *alias, int64_t *out)
{
	const char *v = env_rank_value(o, name), *from = name;

	if ((v == NULL || *v == '\0') && alias != NULL) {
		v = env_rank_value(o, alias);
		from = alias;
	}
	if (v == NULL || *v == '\0') {
		v = config_default(name);
		from = name;
	}
	if (v == NULL || !kparse_duration_ms(v, out)) {
		say("%s=%s: wants a duration like 10s, 500ms or 2m", from,
		    v != NULL ? v : "(no default)");
		return false;
	}
	return true;
}

bool ec_timeouts(struct ec *c, const struct opts *o, const char *alias)
{
	if (!rank_duration(o, "KHOR_HEARTBEAT_TIMEOUT", NULL, &c->hb_timeout_ms))
		return false;
	if (o->elastic_timeout_ms >= 0) {
		c->elastic_timeout_ms = o->elastic_timeout_ms;
		/* The ranks wait in khor_init as long as the driver waits for slots, unless told.
		 */
		if (env_rank_value(o, "KHOR_ELASTIC_TIMEOUT") == NULL) {
			snprintf(c->timeout_arg, sizeof(c->timeout_arg), "%lldms",
			         (long long)o->elastic_timeout_ms + 10000);
			c->elastic_timeout_arg = c->timeout_arg;
		}
	} else if (!rank_duration(o, "KHOR_ELASTIC_TIMEOUT", alias, &c->elastic_timeout_ms)) {
		return false;
	}
	if (c->elastic_timeout_ms < 0)
		c->elastic_timeout_ms = INT64_MAX / 2;
	return true;
}

void ec_fail(struct ec *c, int rc, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->ops->fail(c->ctx, rc, msg);
}

void ec_want_gen(struct ec *c)
{
	if (c->need_gen || c->ending || c->finishing)
		return;
	if (c->gen > 0 && !ep_take_reset(&c->st)) {
		ec_fail(c, 3, EP_RESET_LIMIT_FMT, c->st.reset_limit);
		return;
	}
	if (c->gen > 0 && c->ops->reset_taken != NULL)
		c->ops->reset_taken(c->ctx);
	c->need_gen = true;
}

void ec_lost(struct ec *c, const struct ec_loss *l)
{
	const char *host = c->st.hosts[l->host].name;
	char text[1200], tail[160] = "";
	int64_t cd = 0;

	if (c->finishing) {
		ec_fail(
		    c, l->finish_rc,
		    "elastic: rank %d on %s (worker %s) failed after the job began to finish: %s",
		    l->rank, host, l->worker, l->why);
		return;
	}
	ep_lost_text(text, sizeof(text), c->gen, l->rank, host, l->worker, l->why);
	if (!c->gen_over) {
		c->ops->abort_gen(c->ctx, c->gen, text);
		c->gen_over = true;
	}
	if (l->blacklist) {
		switch (ep_lose(&c->st, c->plan, c->nplan, l->host, l->unstartable, now_ms(),
		                &c->rnd, &cd, tail, sizeof(tail))) {
		case EP_LOSS_BLACKLISTED:
			if (c->ops->blacklisted != NULL)
				c->ops->blacklisted(c->ctx, l->host, cd);
			break;
		case EP_LOSS_ALREADY:
			if (l->quiet_already)
				tail[0] = '\0';
			break;
		case EP_LOSS_FRESH:
			break;
		}
	}
	say("elastic: generation %d: rank %d on %s (worker %s) was lost: %s%s", c->gen, l->rank,
	    host, l->worker, l->why, tail);
	if (ep_all_blacklisted(&c->st, c->plan, c->nplan)) {
		ec_fail(c, 1,
		        "elastic: every host of generation %d is blacklisted; the job cannot go on",
		        c->gen);
		return;
	}
	ec_want_gen(c);
}

void ec_asked(struct ec *c, int rank, const char *host, const char *worker, const char *why)
{
	char text[1400];

	ep_want_text(text, sizeof(text), c->gen, rank, host, worker, why);
	c->ops->abort_gen(c->ctx, c->gen, text);
	say("elastic: %s", text);
	ec_want_gen(c);
}

bool ec_hosts_changed(struct ec *c, int flags, char *slots, size_t len)
{
	int moves;

	if (flags == 0 || c->gen == 0 || c->gen_over || c->finishing || c->ending)
		return false;
	moves = ep_update_moves(&c->st, c->plan, c->nplan, slots, len);
	if (moves < 0) {
		ec_fail(c, 1, "elastic: out of memory taking in the hosts");
		return false;
	}
	if (moves == 0)
		return false; /* nothing the ranks would do differently (Horovod skips it too) */
	c->updates |= (unsigned)flags;
	return true;
}

void ec_short_of_slots(struct ec *c, int need, int64_t now, bool hint)
{
	char msg[1400];

	switch (ep_wait_slots(&c->st, c->gen + 1, need, &c->wait_since, now, c->elastic_timeout_ms,
	                      msg, sizeof(msg))) {
	case EP_WAIT_BEGUN:
		say("%s", msg);
		break;
	case EP_WAIT_OVER:
		if (hint)
			ec_fail(c, 1,
			        "%s. Check that there are enough hosts to run at least %d "
			        "processes",
			        msg, need);
		else
			ec_fail(c, 1, "%s", msg);
		break;
	case EP_WAIT_ON:
		break;
	}
}

void ec_end_words(int wstatus, char *buf, size_t len)
{
	char name[32];

	if (WIFEXITED(wstatus))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(wstatus));
	else if (WIFSIGNALED(wstatus))
		snprintf(buf, len, "killed by signal %d (%s)%s", WTERMSIG(wstatus),
		         say_sig_name(WTERMSIG(wstatus), name, sizeof(name)),
		         WCOREDUMP(wstatus) ? ", core dumped" : "");
	else
		snprintf(buf, len, "ended with wait status 0x%x", (unsigned)wstatus);
}

int ec_exit_status(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 1;
}

size_t ec_worker_env(const struct ec *c, char *const *common, size_t ncommon_in, int size,
                     const char *host, int local_cpus, char **fixed, size_t *ncommon)
{
	size_t n = 0;
	bool ok = true;

	for (size_t i = 0; i < ncommon_in && ok; i++)
		ok = env_add_fixed(fixed, &n, "%s", common[i]);
	for (size_t p = 0; p < NPREFIXES && ok; p++)
		ok = env_add_fixed(fixed, &n, "%sSIZE=%d", env_id_prefixes[p], size) &&
		     env_add_fixed(fixed, &n, "%sELASTIC=1", env_id_prefixes[p]);
	if (ok && c->elastic_timeout_arg != NULL)
		ok = env_add_fixed(fixed, &n, "KHOR_ELASTIC_TIMEOUT=%s", c->elastic_timeout_arg);
	*ncommon = n;
	if (ok && host != NULL)
		ok = env_add_fixed(fixed, &n, "KHOR_HOSTNAME=%s", host) &&
		     env_add_fixed(fixed, &n, "HOROVOD_HOSTNAME=%s", host) &&
		     (local_cpus <= 0 ||
		      env_add_fixed(fixed, &n, "KHOR_LOCAL_CPUS=%d", local_cpus));
	if (!ok) {
		for (size_t i = 0; i < n; i++)
			free(fixed[i]);
		return 0;
	}
	return n;
}

bool ec_plan_new(const struct ec *c, int nw, struct ec_plan *x)
{
	x->cap = ep_available_slots(&c->st) + 1;
	x->s = calloc((size_t)x->cap, sizeof(*x->s));
	x->keep = calloc((size_t)x->cap, sizeof(*x->keep));
	x->lw = calloc((size_t)nw + 1, sizeof(*x->lw));
	x->idx = calloc((size_t)nw + 1, sizeof(*x->idx));
	x->drop = calloc((size_t)nw + 1, sizeof(*x->drop));
	x->drops = calloc((size_t)nw + 1, sizeof(*x->drops));
	return x->s != NULL && x->keep != NULL && x->lw != NULL && x->idx != NULL &&
	       x->drop != NULL && x->drops != NULL;
}

void ec_plan_free(struct ec_plan *x)
{
	free(x->s);
	free(x->keep);
	free(x->lw);
	free(x->idx);
	free(x->drop);
	free(x->drops);
	memset(x, 0, sizeof(*x));
}

void ec_begin_gen(struct ec *c, int g, struct ep_slot *s, int n)
{
	free(c->plan);
	c->plan = s;
	c->nplan = n;
	c->gen = g;
	c->gen_over = false;
	c->need_gen = false;
	c->updates = 0;
	c->wait_since = -1;
	c->gen_beat_at = 0;
}
