/*
 * elastic_plan.c -- the elastic driver's rules, without processes, clocks or a store (see
 * elastic_plan.h). They follow Horovod's runner (discovery.py's HostManager and HostState,
 * hosts.py's get_host_assignments, registration.py's reset count) so that a job moved from
 * horovodrun to khorrun gets the same ranks on the same hosts after the same events.
 */
#include "elastic_plan.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ep_list_free(struct ep_list *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->h[i].name);
	free(l->h);
	memset(l, 0, sizeof(*l));
}

static int list_find(const struct ep_list *l, const char *name, size_t len)
{
	for (int i = 0; i < l->n; i++) {
		if (strlen(l->h[i].name) == len && memcmp(l->h[i].name, name, len) == 0)
			return i;
	}
	return -1;
}

static bool list_add_n(struct ep_list *l, const char *name, size_t len, int slots)
{
	int at = list_find(l, name, len);

	if (at >= 0) {
		l->h[at].slots = slots;
		return true;
	}
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 8;
		struct ep_found *h = realloc(l->h, (size_t)cap * sizeof(*h));

		if (h == NULL)
			return false;
		l->h = h;
		l->cap = cap;
	}
	l->h[l->n].name = strndup(name, len);
	if (l->h[l->n].name == NULL)
		return false;
	l->h[l->n++].slots = slots;
	return true;
}

bool ep_list_add(struct ep_list *l, const char *name, int slots)
{
	return list_add_n(l, name, strlen(name), slots);
}

/* One line, blanks trimmed: "HOST" or "HOST:SLOTS". */
static bool parse_line(const char *p, size_t n, int default_slots, struct ep_list *out, char *why,
                       size_t wlen)
{
	const char *colon = memchr(p, ':', n);
	size_t hl = colon != NULL ? (size_t)(colon - p) : n;
	long slots = default_slots;

	if (hl == 0 || hl > EP_HOST_MAX) {
		snprintf(why, wlen, "'%.*s': %s", (int)(n < 80 ? n : 80), p,
		         hl == 0 ? "no host name before the ':'" : "the host name is too long");
		return false;
	}
	/* It goes to ssh's command line and into the plan's space-separated lines. */
	for (size_t i = 0; i < hl; i++) {
		if (isspace((unsigned char)p[i]) || iscntrl((unsigned char)p[i]) ||
		    strchr("'\"[]", p[i]) != NULL || (i == 0 && p[i] == '-')) {
			snprintf(why, wlen,
			         "'%.*s' is not a host name (one host a line: HOST or HOST:SLOTS)",
			         (int)(n < 80 ? n : 80), p);
			return false;
		}
	}
	if (colon != NULL) {
		char num[16], *end;
		size_t sl = n - hl - 1;

		if (sl == 0 || sl >= sizeof(num)) {
			snprintf(why, wlen, "'%.*s': the slots after ':' are not a number",
			         (int)(n < 80 ? n : 80), p);
			return false;
		}
		memcpy(num, colon + 1, sl);
		num[sl] = '\0';
		slots = strtol(num, &end, 10);
		/* All of it a number: a NUL in the script's output ends strtol's reading too. */
		if (end != num + sl || !isdigit((unsigned char)num[0]) || slots > EP_SLOTS_MAX) {
			snprintf(why, wlen,
			         "'%.*s': the slots after ':' want a number from 0 to %d",
			         (int)(n < 80 ? n : 80), p, EP_SLOTS_MAX);
			return false;
		}
	}
	if (!list_add_n(out, p, hl, (int)slots)) {
		snprintf(why, wlen, "out of memory");
		return false;
	}
	return true;
}

bool ep_parse_hosts(const char *text, size_t len, int default_slots, struct ep_list *out, char *why,
                    size_t wlen)
{
	const char *p = text, *end = text + len;

	memset(out, 0, sizeof(*out));
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl != NULL ? nl : end;
		const char *a = p;

		while (a < e && isspace((unsigned char)*a))
			a++;
		while (e > a && isspace((unsigned char)e[-1]))
			e--;
		if (e > a && !parse_line(a, (size_t)(e - a), default_slots, out, why, wlen)) {
			ep_list_free(out);
			return false;
		}
		p = nl != NULL ? nl + 1 : end;
	}
	return true;
}

void ep_init(struct ep_state *st, int min_np, int max_np, int64_t cool_min_ms, int64_t cool_max_ms,
             int reset_limit)
{
	memset(st, 0, sizeof(*st));
	st->min_np = min_np;
	st->max_np = max_np;
	st->cool_min_ms = cool_min_ms;
	st->cool_max_ms = cool_max_ms;
	st->reset_limit = reset_limit;
}

void ep_free(struct ep_state *st)
{
	for (int i = 0; i < st->nhosts; i++)
		free(st->hosts[i].name);
	free(st->hosts);
	free(st->order);
	memset(st, 0, sizeof(*st));
}

int ep_host_index(const struct ep_state *st, const char *name)
{
	for (int i = 0; i < st->nhosts; i++) {
		if (strcmp(st->hosts[i].name, name) == 0)
			return i;
	}
	return -1;
}

static int add_host(struct ep_state *st, const char *name)
{
	if (st->nhosts == st->cap) {
		int cap = st->cap ? 2 * st->cap : 8;
		struct ep_host *h = realloc(st->hosts, (size_t)cap * sizeof(*h));
		int *o;

		if (h == NULL)
			return -1;
		st->hosts = h;
		o = realloc(st->order, (size_t)cap * sizeof(*o));
		if (o == NULL)
			return -1;
		st->order = o;
		st->cap = cap;
	}
	memset(&st->hosts[st->nhosts], 0, sizeof(st->hosts[0]));
	st->hosts[st->nhosts].name = strdup(name);
	if (st->hosts[st->nhosts].name == NULL)
		return -1;
	return st->nhosts++;
}

/* Its cooldown has ended (Horovod's is_resurrected): it may come back. */
static bool resurrected(const struct ep_host *h, int64_t now_ms)
{
	return h->cool_until_ms > 0 && h->cool_until_ms <= now_ms;
}

static bool in_order(const struct ep_state *st, int h)
{
	for (int i = 0; i < st->norder; i++) {
		if (st->order[i] == h)
			return true;
	}
	return false;
}

static void order_remove(struct ep_state *st, int h)
{
	int k = 0;

	for (int i = 0; i < st->norder; i++) {
		if (st->order[i] != h)
			st->order[k++] = st->order[i];
	}
	st->norder = k;
}

int ep_update(struct ep_state *st, const struct ep_list *found, int64_t now_ms)
{
	bool changed = !st->discovered;
	unsigned flags = 0;
	int *idx = found->n > 0 ? calloc((size_t)found->n, sizeof(int)) : NULL;

	if (found->n > 0 && idx == NULL)
		return -1;
	/* Every listed host is known from here on, in the order first listed. */
	for (int i = 0; i < found->n; i++) {
		idx[i] = ep_host_index(st, found->h[i].name);
		if (idx[i] < 0 && (idx[i] = add_host(st, found->h[i].name)) < 0) {
			free(idx);
			return -1;
		}
	}
	/* Horovod looks again only when the slots differ or a cooldown has ended. */
	for (int i = 0; i < st->nhosts && !changed; i++) {
		const struct ep_host *h = &st->hosts[i];
		int at = -1;

		for (int k = 0; k < found->n && at < 0; k++) {
			if (idx[k] == i)
				at = k;
		}
		if (at < 0 ? h->listed
		           : !h->listed || h->slots != found->h[at].slots ||
		                 (h->blacklisted && resurrected(h, now_ms)))
			changed = true;
	}
	if (!changed) {
		free(idx);
		return 0;
	}
	for (int i = 0; i < st->nhosts; i++) {
		struct ep_host *h = &st->hosts[i];
		int at = -1;

		for (int k = 0; k < found->n && at < 0; k++) {
			if (idx[k] == i)
				at = k;
		}
		if (at < 0) {
			if (h->listed)
				flags |= EP_REMOVED;
			h->listed = false;
			h->slots = 0;
			order_remove(st, i);
			continue;
		}
		if (!h->listed || found->h[at].slots > h->slots)
			flags |= EP_ADDED;
		else if (found->h[at].slots < h->slots)
			flags |= EP_REMOVED;
		else if (h->blacklisted && resurrected(h, now_ms))
			flags |= EP_ADDED;
		h->listed = true;
		h->slots = found->h[at].slots;
	}
	/* Oldest first: kept hosts keep their place, the others join at the end. */
	for (int k = 0; k < found->n; k++) {
		struct ep_host *h = &st->hosts[idx[k]];

		if (h->blacklisted && resurrected(h, now_ms)) {
			h->blacklisted = false;
			h->cool_until_ms = 0;
		}
		if (!h->blacklisted && !in_order(st, idx[k]))
			st->order[st->norder++] = idx[k];
	}
	st->discovered = true;
	free(idx);
	return (int)flags;
}

int64_t ep_blacklist(struct ep_state *st, int h, int64_t now_ms, double rnd01)
{
	struct ep_host *hp = &st->hosts[h];
	double delay;
	int n;

	hp->blacklisted = true;
	order_remove(st, h);
	if (st->cool_min_ms <= 0)
		return -1;
	if (hp->cool_until_ms > now_ms)
		return 0;
	n = ++hp->nblacklist;
	delay = (double)st->cool_min_ms * (double)(1ull << (n < 40 ? n : 40)) +
	        rnd01 * (double)st->cool_min_ms;
	if (delay > (double)st->cool_max_ms)
		delay = (double)st->cool_max_ms;
	if (delay < (double)st->cool_min_ms)
		delay = (double)st->cool_min_ms;
	hp->cool_until_ms = now_ms + (int64_t)delay;
	return (int64_t)delay;
}

void ep_exclude(struct ep_state *st, int h)
{
	st->hosts[h].blacklisted = true;
	st->hosts[h].cool_until_ms = 0;
	order_remove(st, h);
}

int ep_available_slots(const struct ep_state *st)
{
	long long n = 0;

	for (int i = 0; i < st->norder; i++)
		n += st->hosts[st->order[i]].slots;
	return n > EP_SLOTS_MAX ? EP_SLOTS_MAX : (int)n;
}

int ep_assign(const struct ep_state *st, struct ep_slot *out, int cap)
{
	int rank = 0, maxslots = 0;
	int *seen, *count;

	for (int i = 0; i < st->norder; i++) {
		if (st->hosts[st->order[i]].slots > maxslots)
			maxslots = st->hosts[st->order[i]].slots;
	}
	seen = calloc((size_t)maxslots + 1, sizeof(int));
	count = calloc((size_t)maxslots + 1, sizeof(int));
	if (seen == NULL || count == NULL) {
		free(seen);
		free(count);
		return -1;
	}
	for (int i = 0; i < st->norder; i++) {
		int h = st->order[i], first = rank;

		for (int k = 0; k < st->hosts[h].slots; k++) {
			if (st->max_np > 0 && rank == st->max_np)
				break;
			if (rank == cap) {
				free(seen);
				free(count);
				return -1;
			}
			out[rank] = (struct ep_slot){
				.host = h, .rank = rank, .local_rank = k, .cross_rank = seen[k]++
			};
			count[k]++;
			rank++;
		}
		for (int r = first; r < rank; r++)
			out[r].local_size = rank - first;
	}
	/* Cross size: how many hosts have a rank with that local rank (Horovod's definition). */
	for (int r = 0; r < rank; r++)
		out[r].cross_size = count[out[r].local_rank];
	free(seen);
	free(count);
	return rank;
}

bool ep_same_assignment(const struct ep_slot *a, int na, const struct ep_slot *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++) {
		if (a[i].host != b[i].host || a[i].local_rank != b[i].local_rank)
			return false;
	}
	return true;
}

bool ep_keeps_a_host(const struct ep_slot *prev, int nprev, const struct ep_slot *next, int nnext)
{
	if (nprev == 0)
		return true;
	for (int i = 0; i < nnext; i++) {
		for (int k = 0; k < nprev; k++) {
			if (next[i].host == prev[k].host)
				return true;
		}
	}
	return false;
}

int ep_count_hosts(const struct ep_slot *s, int n)
{
	int hosts = 0;

	/* A generation's ranks come host by host, so a new host starts a new run. */
	for (int i = 0; i < n; i++) {
		if (i == 0 || s[i].host != s[i - 1].host)
			hosts++;
	}
	return hosts;
}

void ep_match(const struct ep_slot *s, int n, const struct ep_worker *w, int nw, int *keep,
              bool *drop)
{
	for (int i = 0; i < nw; i++)
		drop[i] = true;
	for (int r = 0; r < n; r++) {
		keep[r] = -1;
		for (int i = 0; i < nw && keep[r] < 0; i++) {
			if (drop[i] && w[i].host == s[r].host && w[i].slot == s[r].local_rank) {
				keep[r] = i;
				drop[i] = false;
			}
		}
	}
}

bool ep_take_reset(struct ep_state *st)
{
	if (st->reset_limit >= 0 && st->resets >= st->reset_limit)
		return false;
	st->resets++;
	return true;
}

/* Appends printf output to a growing string; false when out of memory. */
static bool append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
		va_end(ap);
		if (n < 0)
			return false;
		if ((size_t)n < *cap - *len) {
			*len += (size_t)n;
			return true;
		}
		char *b = realloc(*buf, *cap * 2 + (size_t)n);

		if (b == NULL)
			return false;
		*buf = b;
		*cap = *cap * 2 + (size_t)n;
	}
}

char *ep_plan_text(const struct ep_state *st, int gen, const struct ep_slot *s, int n,
                   char *const *drops, int ndrops)
{
	size_t len = 0, cap = 256;
	char *buf = malloc(cap);
	bool ok = buf != NULL;

	ok = ok && append(&buf, &len, &cap, "khor-plan 1\ngen %d\nsize %d\n", gen, n);
	for (int r = 0; ok && r < n; r++) {
		const char *h = st->hosts[s[r].host].name;

		ok = append(&buf, &len, &cap, "rank %d %s:%d %s %d %d %d %d\n", r, h,
		            s[r].local_rank, h, s[r].local_rank, s[r].local_size, s[r].cross_rank,
		            s[r].cross_size);
	}
	for (int i = 0; ok && i < ndrops; i++)
		ok = append(&buf, &len, &cap, "drop %s\n", drops[i]);
	if (!ok) {
		free(buf);
		return NULL;
	}
	return buf;
}

void ep_describe_slots(const struct ep_state *st, const struct ep_slot *s, int n, char *buf,
                       size_t len)
{
	size_t off = 0;
	int shown = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && off < len; i++) {
		if (i > 0 && s[i].host == s[i - 1].host)
			continue;
		if (shown++ == 8) {
			snprintf(buf + off, len - off, ", ...");
			return;
		}
		off += (size_t)snprintf(buf + off, len - off, "%s%s:%d", shown > 1 ? ", " : "",
		                        st->hosts[s[i].host].name, s[i].local_size);
	}
}

void ep_describe_shortage(const struct ep_state *st, int need, int64_t now_ms, char *buf,
                          size_t len)
{
	int avail = ep_available_slots(st), shown = 0;
	size_t off;

	off = (size_t)snprintf(buf, len, "%d slot%s available", avail, avail == 1 ? "" : "s");
	for (int i = 0; i < st->norder && off < len; i++) {
		const struct ep_host *h = &st->hosts[st->order[i]];

		off += (size_t)snprintf(buf + off, len - off, "%s%s:%d", i == 0 ? " (" : ", ",
		                        h->name, h->slots);
		if (i + 1 == st->norder && off < len)
			off += (size_t)snprintf(buf + off, len - off, ")");
	}
	if (off < len)
		off += (size_t)snprintf(buf + off, len - off, ", %d needed", need);
	for (int i = 0; i < st->nhosts && off < len; i++) {
		const struct ep_host *h = &st->hosts[i];

		if (!h->blacklisted)
			continue;
		off += (size_t)snprintf(buf + off, len - off, "%s%s",
		                        shown++ == 0 ? "; blacklisted: " : ", ", h->name);
		if (off >= len)
			break;
		if (h->cool_until_ms > now_ms)
			off +=
			    (size_t)snprintf(buf + off, len - off, " (for %lld s more)",
			                     (long long)((h->cool_until_ms - now_ms + 999) / 1000));
		else if (h->cool_until_ms == 0)
			off += (size_t)snprintf(buf + off, len - off, " (for good)");
		else
			off += (size_t)snprintf(buf + off, len - off, " (cooled down, not listed)");
	}
}

double ep_draw(uint64_t *rnd)
{
	*rnd ^= *rnd << 13;
	*rnd ^= *rnd >> 7;
	*rnd ^= *rnd << 17;
	return (double)(*rnd >> 11) / (double)(1ull << 53);
}

bool ep_all_blacklisted(const struct ep_state *st, const struct ep_slot *s, int n)
{
	for (int r = 0; r < n; r++) {
		if (!st->hosts[s[r].host].blacklisted)
			return false;
	}
	return n > 0;
}

enum ep_loss ep_lose(struct ep_state *st, const struct ep_slot *s, int n, int h, bool unstartable,
                     int64_t now_ms, uint64_t *rnd, int64_t *cooldown_ms, char *tail,
                     size_t len)
{
	const char *host = st->hosts[h].name;
	int64_t cd;

	if (ep_count_hosts(s, n) <= 1 && !unstartable) {
		snprintf(tail, len, "; a fresh worker takes its slot");
		return EP_LOSS_FRESH;
	}
	if (st->hosts[h].blacklisted) {
		snprintf(tail, len, "; host %s is blacklisted already", host);
		return EP_LOSS_ALREADY;
	}
	cd = ep_blacklist(st, h, now_ms, ep_draw(rnd));
	*cooldown_ms = cd;
	if (cd < 0)
		snprintf(tail, len, "; host %s blacklisted", host);
	else
		snprintf(tail, len, "; host %s blacklisted for %lld s", host,
		         (long long)((cd + 999) / 1000));
	return EP_LOSS_BLACKLISTED;
}

void ep_lost_text(char *buf, size_t len, int gen, int rank, const char *host,
                  const char *worker, const char *why)
{
	snprintf(buf, len, "rank %d on %s (worker %s) was lost in generation %d: %s", rank, host,
	         worker, gen, why);
}

int ep_update_moves(const struct ep_state *st, const struct ep_slot *plan, int n, char *slots,
                    size_t len)
{
	int cap = ep_available_slots(st) + 1, nn;
	struct ep_slot *next = calloc((size_t)cap, sizeof(*next));

	if (next == NULL)
		return -1;
	nn = ep_assign(st, next, cap);
	if (nn >= 0 && ep_same_assignment(plan, n, next, nn)) {
		free(next);
		return 0;
	}
	if (slots != NULL)
		ep_describe_slots(st, next, nn < 0 ? 0 : nn, slots, len);
	free(next);
	return 1;
}

void ep_update_words(unsigned flags, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s", flags & EP_ADDED ? "added" : "",
	         flags == (EP_ADDED | EP_REMOVED) ? "," : "", flags & EP_REMOVED ? "removed" : "");
}

int64_t ep_heartbeat(int64_t *hb, int64_t *hb_at, int64_t *gen_beat_at, const char *val,
                     int64_t now, int64_t timeout_ms)
{
	int64_t v, since;

	if (val == NULL && *hb > 0)
		return 0; /* it beat, then left the generation (finalize): going, not stalled */
	v = val != NULL ? strtoll(val, NULL, 10) : 0;
	if (v != *hb) {
		if (*gen_beat_at == 0)
			*gen_beat_at = now;
		*hb = v;
		*hb_at = now;
		return 0;
	}
	/*
	 * Before its first beat a rank is still joining; but once any rank of the generation
	 * beats, all have joined (the bootstrap is collective), so one that has not beaten
	 * since then is stalled too.
	 */
	since = *hb > 0 ? *hb_at : *gen_beat_at;
	if (since > 0 && now - since > timeout_ms)
		return now - since;
	return 0;
}

int64_t ep_join_stall(int64_t *prev_hb, int64_t *alive_at, const char *prev_val, int64_t now,
                      int64_t timeout_ms)
{
	if (prev_val != NULL) {
		int64_t v = strtoll(prev_val, NULL, 10);

		if (v != *prev_hb) {
			*prev_hb = v;
			*alive_at = now;
		}
	}
	return now - *alive_at > timeout_ms ? now - *alive_at : 0;
}

void ep_fence_text(char *buf, size_t len, int64_t stalled_ms, int64_t timeout_ms,
                   const char *killer, int left_gen)
{
	char where[96] = "";

	if (left_gen > 0)
		snprintf(where, sizeof(where), " since it left generation %d, and it has not "
		         "joined generation %d", left_gen, left_gen + 1);
	snprintf(buf, len, "its heartbeat stopped for %.1f s%s (KHOR_HEARTBEAT_TIMEOUT %.1f s); "
	         "%s killed it", (double)stalled_ms / 1000.0, where, (double)timeout_ms / 1000.0,
	         killer);
}

void ep_want_text(char *buf, size_t len, int gen, int rank, const char *host,
                  const char *worker, const char *why)
{
	if (rank >= 0)
		snprintf(buf, len, "generation %d ended: rank %d on %s (worker %s) asked for a new "
		         "one: %s", gen, rank, host, worker, why);
	else
		snprintf(buf, len, "generation %d ended: a rank asked for a new one", gen);
}

enum ep_wait ep_wait_slots(const struct ep_state *st, int gen, int need, int64_t *wait_since,
                           int64_t now, int64_t timeout_ms, char *buf, size_t len)
{
	char why[1024];

	ep_describe_shortage(st, need, now, why, sizeof(why));
	if (*wait_since < 0) {
		*wait_since = now;
		snprintf(buf, len,
		         "elastic: generation %d waits for %d slot%s: %s (at most %.0f s, "
		         "--elastic-timeout)",
		         gen, need, need == 1 ? "" : "s", why, (double)timeout_ms / 1000.0);
		return EP_WAIT_BEGUN;
	}
	if (now - *wait_since < timeout_ms)
		return EP_WAIT_ON;
	snprintf(buf, len, "elastic: timed out after %.0f s (--elastic-timeout) waiting for the "
	         "slots of generation %d: %s", (double)timeout_ms / 1000.0, gen, why);
	return EP_WAIT_OVER;
}

void ep_describe_gen(const struct ep_state *st, int gen, const struct ep_slot *s, int n,
                     char *buf, size_t len)
{
	char slots[1024];
	int hosts = ep_count_hosts(s, n);

	ep_describe_slots(st, s, n, slots, sizeof(slots));
	snprintf(buf, len, "generation %d: %d rank%s on %d host%s (%s)", gen, n, n == 1 ? "" : "s",
	         hosts, hosts == 1 ? "" : "s", slots);
}
