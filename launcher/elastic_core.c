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
