/*
 * watch.c -- the launcher's reading of the ranks' heartbeats (watch.h).
 *
 * Every interval it reads each watched rank's counter, one get with no wait each, on the
 * store thread of this same process or the elastic job's store. The counter's value says
 * nothing about when it moved; the read that first saw a value does, on this process's
 * monotonic clock, so "silent for the timeout" means unchanged through reads that span it.
 * A fixed job's rank that finalizes and inits again beats in its next generation: a
 * counter that stops moving is looked for there (its count of inits) before it counts as
 * silent.
 */
#include "watch.h"

#include "base/clock.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct beat {
	int gen;           /* the generation its counter is read in; 0: not known yet */
	int64_t count;     /* the value last read */
	uint64_t moved_ns; /* the read that first saw count; 0: not watched (no counter) */
	bool reported;     /* silent, and said so */
	bool gone;         /* ended (watch_forget) */
	char host[64];
};

struct watch {
	store *st;
	char job[128];
	int gen; /* > 0: every rank's; 0: each rank's own */
	int n;
	uint64_t timeout_ns, interval_ns;
	uint64_t next_ns;
	bool broken; /* the store failed: watching nothing more */
	struct beat b[];
};

struct watch *watch_new(store *st, const char *job_id, int gen, int n, int64_t timeout_ms,
                        int64_t interval_ms)
{
	struct watch *w = calloc(1, sizeof(*w) + (size_t)n * sizeof(w->b[0]));

	if (w == NULL)
		return NULL;
	w->st = st;
	snprintf(w->job, sizeof(w->job), "%s", job_id);
	w->gen = gen;
	w->n = n;
	w->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
	w->interval_ns = (uint64_t)(interval_ms > 0 ? interval_ms : 1000) * 1000000ull;
	w->next_ns = kclock_ns() + w->interval_ns;
	for (int r = 0; r < n; r++)
		w->b[r].gen = gen;
	return w;
}

int watch_due_ms(const struct watch *w)
{
	uint64_t now = kclock_ns();

	if (w->broken)
		return 1 << 30;
	return now >= w->next_ns ? 0 : (int)((w->next_ns - now) / 1000000ull) + 1;
}

/* The decimal at key in generation gen into *out; -1 when absent. */
static khor_status get_number(struct watch *w, int gen, const char *key, int64_t *out,
                              kerr *err)
{
	void *v;
	size_t len;
	kerr e;

	store_set_prefix(w->st, w->job, gen);
	khor_status st = store_get(w->st, key, kdeadline_in_ms(0), &v, &len, &e);
	*out = -1;
	if (st == KHOR_ERR_TIMEOUT)
		return KHOR_SUCCESS;
	if (st != KHOR_SUCCESS) {
		*err = e;
		return st;
	}
	*out = strtoll(v, NULL, 10);
	free(v);
	return KHOR_SUCCESS;
}

/* Rank r's counter in the generation b watches; -1 when it has none (or none is known). */
static khor_status get_count(struct watch *w, int r, const struct beat *b, int64_t *out,
                             kerr *err)
{
	char key[32];

	*out = -1;
	if (b->gen <= 0)
		return KHOR_SUCCESS;
	snprintf(key, sizeof(key), "hb/%d", r);
	return get_number(w, b->gen, key, out, err);
}

/* The rank's host as it published it in its generation, for messages. */
static void read_host(struct watch *w, int r, struct beat *b)
{
	char key[32];
	void *v;
	size_t len;
	kerr e;

	snprintf(key, sizeof(key), "host/%d", r);
	store_set_prefix(w->st, w->job, b->gen);
	if (store_get(w->st, key, kdeadline_in_ms(0), &v, &len, &e) == KHOR_SUCCESS) {
		snprintf(b->host, sizeof(b->host), "%.*s", (int)strcspn(v, "\t"), (char *)v);
		free(v);
	}
}

/*
 * Reads rank r's counter; true when it has been silent for the timeout. In a fixed job a
 * counter that does not move may belong to a generation the rank has left: its count of
 * inits says where it beats now.
 */
static bool read_one(struct watch *w, int r, uint64_t now, kerr *err)
{
	struct beat *b = &w->b[r];
	int64_t count, inits;
	char key[32];

	if (get_count(w, r, b, &count, err) != KHOR_SUCCESS)
		return false;
	if (w->gen == 0 && (count < 0 || b->moved_ns == 0 || count == b->count)) {
		snprintf(key, sizeof(key), "inits/%d", r);
		if (get_number(w, 0, key, &inits, err) != KHOR_SUCCESS)
			return false;
		if (inits > b->gen) {
			b->gen = (int)inits; /* it joined again: start over there */
			b->moved_ns = 0;
			b->host[0] = '\0';
			if (get_count(w, r, b, &count, err) != KHOR_SUCCESS)
				return false;
		}
	}
	if (count < 0) {
		b->moved_ns = 0; /* no counter: not beating yet, or left */
		b->reported = false;
		return false;
	}
	if (b->moved_ns == 0 || count != b->count) {
		b->count = count;
		b->moved_ns = now;
		b->reported = false;
		if (b->host[0] == '\0')
			read_host(w, r, b);
		return false;
	}
	return !b->reported && now - b->moved_ns >= w->timeout_ns;
}

int watch_poll(struct watch *w, struct watch_silent *out, int cap, const char **why)
{
	static char broke[KERR_TEXT_MAX + 64];
	uint64_t now = kclock_ns();
	int k = 0;
	kerr err;

	if (w->broken || now < w->next_ns)
		return 0;
	w->next_ns = now + w->interval_ns;
	kerr_clear(&err);
	for (int r = 0; r < w->n && k < cap; r++) {
		struct beat *b = &w->b[r];
		if (b->gone)
			continue;
		bool silent = read_one(w, r, now, &err);
		if (err.status != KHOR_SUCCESS) {
			w->broken = true;
			snprintf(broke, sizeof(broke), "cannot read the ranks' heartbeats from the store "
			         "any more (%s); not watching them", err.text);
			if (why != NULL)
				*why = broke;
			return k;
		}
		if (!silent)
			continue;
		b->reported = true;
		out[k] = (struct watch_silent){ .rank = r, .gen = b->gen,
		                                .silent_ms = (int64_t)((now - b->moved_ns) / 1000000) };
		snprintf(out[k].host, sizeof(out[k].host), "%s", b->host);
		k++;
	}
	return k;
}

void watch_forget(struct watch *w, int r)
{
	if (r >= 0 && r < w->n)
		w->b[r].gone = true;
}

void watch_abort(struct watch *w, int gen, const char *text)
{
	int64_t n = 0;
	kerr e;

	store_set_prefix(w->st, w->job, gen);
	if (store_add(w->st, "abort_count", 1, &n, &e) == KHOR_SUCCESS && n == 1)
		(void)store_set(w->st, "abort", text, strlen(text), &e);
}

void watch_free(struct watch *w)
{
	if (w == NULL)
		return;
	store_close(w->st);
	free(w);
}
