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
static bool parse_line(const char *p, size_t n, int default_slots, struct ep_list *out,
                       char *why, size_t wlen)
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
			snprintf(why, wlen, "'%.*s' is not a host name (one host a line: HOST or "
			         "HOST:SLOTS)", (int)(n < 80 ? n : 80), p);
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
		if (*end != '\0' || !isdigit((unsigned char)num[0]) || slots > EP_SLOTS_MAX) {
			snprintf(why, wlen, "'%.*s': the slots after ':' want a number from 0 to %d",
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

bool ep_parse_hosts(const char *text, size_t len, int default_slots, struct ep_list *out,
                    char *why, size_t wlen)
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

void ep_init(struct ep_state *st, int min_np, int max_np, int64_t cool_min_ms,
             int64_t cool_max_ms, int reset_limit)
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
		if (at < 0 ? h->listed : !h->listed || h->slots != found->h[at].slots ||
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
			out[rank] = (struct ep_slot){ .host = h, .rank = rank, .local_rank = k,
				                      .cross_rank = seen[k]++ };
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

bool ep_keeps_a_host(const struct ep_slot *prev, int nprev, const struct ep_slot *next,
                     int nnext)
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

		ok = append(&buf, &len, &cap, "rank %d %s:%d %s %d %d %d %d\n", r, h, s[r].local_rank,
		            h, s[r].local_rank, s[r].local_size, s[r].cross_rank, s[r].cross_size);
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

		off += (size_t)snprintf(buf + off, len - off, "%s%s:%d", i == 0 ? " (" : ", ", h->name,
		                        h->slots);
		if (i + 1 == st->norder && off < len)
			off += (size_t)snprintf(buf + off, len - off, ")");
	}
	if (off < len)
		off += (size_t)snprintf(buf + off, len - off, ", %d needed", need);
	for (int i = 0; i < st->nhosts && off < len; i++) {
		const struct ep_host *h = &st->hosts[i];

		if (!h->blacklisted)
			continue;
		off += (size_t)snprintf(buf + off, len - off, "%s%s", shown++ == 0 ? "; blacklisted: "
		                                                                   : ", ", h->name);
		if (off >= len)
			break;
		if (h->cool_until_ms > now_ms)
			off += (size_t)snprintf(buf + off, len - off, " (for %lld s more)",
			                        (long long)((h->cool_until_ms - now_ms + 999) / 1000));
		else if (h->cool_until_ms == 0)
			off += (size_t)snprintf(buf + off, len - off, " (for good)");
		else
			off += (size_t)snprintf(buf + off, len - off, " (cooled down, not listed)");
	}
}
