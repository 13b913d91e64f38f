/*
 * elastic.c -- a worker finding its place in an elastic job's newest generation.
 *
 * The driver writes "el/plan/<g>" and then "el/gen" (both under "<job>/0/"); a worker that
 * left generation p adds 1 to "el/want/<p>" (the driver starts the next generation at the
 * first one) and waits for a plan newer than p. docs/ELASTIC.md has the plan's format.
 */
#include "elastic.h"

#include "base/log.h"
#include "base/parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads one line of at most cap - 1 bytes into line; returns the offset after it. */
static size_t next_line(const char *t, size_t len, size_t off, char *line, size_t cap)
{
	size_t n = 0;
	while (off < len && t[off] != '\n') {
		if (n + 1 < cap)
			line[n++] = t[off];
		off++;
	}
	line[n] = '\0';
	return off < len ? off + 1 : off;
}

khor_status elastic_plan_find(const char *t, size_t len, const char *id, struct el_place *out,
                              kerr *err)
{
	char line[512], who[128], host[256];
	size_t off = 0;
	int lineno = 0, ranks = 0;

	memset(out, 0, sizeof(*out));
	out->gen = -1;
	out->size = -1;
	out->what = EL_ABSENT;
	while (off < len) {
		off = next_line(t, len, off, line, sizeof(line));
		lineno++;
		if (line[0] == '\0')
			continue;
		if (lineno == 1) {
			if (strcmp(line, ELASTIC_PLAN_MAGIC) != 0)
				break;
			continue;
		}
		int r, lr, ls, xr, xs, n = 0;
		if (sscanf(line, "gen %d%n", &out->gen, &n) == 1 && line[n] == '\0' && out->gen > 0)
			continue;
		if (sscanf(line, "size %d%n", &out->size, &n) == 1 && line[n] == '\0' && out->size > 0)
			continue;
		if (sscanf(line, "rank %d %127s %255s %d %d %d %d%n", &r, who, host, &lr, &ls, &xr,
		           &xs, &n) == 7 && line[n] == '\0') {
			if (r != ranks++ || out->size < 1 || r >= out->size || lr < 0 || lr >= ls ||
			    xr < 0 || xr >= xs)
				return kerr_set(err, KHOR_ERR_PROTOCOL, "the elastic plan's line %d "
				                "('%.80s') is out of order or out of range", lineno, line);
			if (strcmp(who, id) == 0) {
				out->what = EL_IN;
				out->rank = r;
				out->local_rank = lr;
				out->local_size = ls;
				out->cross_rank = xr;
				out->cross_size = xs;
				snprintf(out->host, sizeof(out->host), "%s", host);
			}
			continue;
		}
		if (sscanf(line, "drop %127s%n", who, &n) == 1 && line[n] == '\0') {
			if (strcmp(who, id) == 0 && out->what == EL_ABSENT)
				out->what = EL_DROPPED;
			continue;
		}
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the elastic plan's line %d is not understood: "
		                "'%.80s'", lineno, line);
	}
	if (lineno == 0 || strncmp(t, ELASTIC_PLAN_MAGIC, strlen(ELASTIC_PLAN_MAGIC)) != 0)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the elastic plan does not start with '%s'",
		                ELASTIC_PLAN_MAGIC);
	if (out->gen < 1 || out->size < 1 || ranks != out->size)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the elastic plan of generation %d lists %d "
		                "ranks for size %d", out->gen, ranks, out->size);
	return KHOR_SUCCESS;
}

/* The decimal at key, or -1 when absent (waiting until dl for it to appear). */
static khor_status get_number(store *st, const char *key, kdeadline dl, int64_t *v, kerr *err)
{
	void *val;
	size_t len;
	khor_status rc = store_get(st, key, dl, &val, &len, err);
	if (rc != KHOR_SUCCESS)
		return rc;
	bool ok = kparse_i64(val, v) && *v >= 0 && *v <= INT32_MAX;
	free(val);
	if (!ok)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the store's '%s' is not a generation number",
		                key);
	return KHOR_SUCCESS;
}

static khor_status ask_next(store *st, const settings *s, int after, const char *why, kerr *err)
{
	char key[192];
	int64_t n;
	khor_status rc;

	snprintf(key, sizeof(key), "el/why/%d/%s", after, s->worker_id);
	if ((rc = store_set(st, key, why, strlen(why), err)) != KHOR_SUCCESS)
		return rc;
	snprintf(key, sizeof(key), "el/want/%d", after);
	return store_add(st, key, 1, &n, err);
}

khor_status elastic_join(store *st, const settings *s, int after, const char *why,
                         kdeadline dl, struct el_place *out, kerr *err)
{
	khor_status rc;
	char key[64];
	int64_t gen;

	store_set_prefix(st, s->job_id, 0);
	if (after > 0 && (rc = ask_next(st, s, after, why, err)) != KHOR_SUCCESS)
		return rc;
	for (int last = after;;) {
		/* Plans appear in order; the one after `last` means el/gen has moved past it. */
		snprintf(key, sizeof(key), "el/plan/%d", last + 1);
		for (;;) {
			void *v;
			size_t len;
			kerr e;
			rc = store_get(st, key, kdeadline_in_ms(kdeadline_left_ms(dl, 200)), &v, &len, &e);
			if (rc == KHOR_SUCCESS) {
				free(v);
				break;
			}
			if (rc != KHOR_ERR_TIMEOUT) {
				*err = e;
				return rc;
			}
			if (store_get(st, "el/done", kdeadline_in_ms(0), &v, &len, &e) == KHOR_SUCCESS) {
				free(v);
				return kerr_set(err, KHOR_ERR_REMOVED, "worker %s: the elastic job is over",
				                s->worker_id);
			}
			if (kdeadline_passed(dl))
				return kerr_set(err, KHOR_ERR_TIMEOUT, "worker %s waited %lld ms "
				                "(KHOR_ELASTIC_TIMEOUT) for a generation after %d; the "
				                "driver planned none", s->worker_id,
				                (long long)s->elastic_timeout_ms, last);
		}
		if ((rc = get_number(st, "el/gen", kdeadline_in_ms(1000), &gen, err)) != KHOR_SUCCESS)
			return rc;
		if (gen <= last)
			gen = last + 1;
		void *v;
		size_t len;
		snprintf(key, sizeof(key), "el/plan/%lld", (long long)gen);
		if ((rc = store_get(st, key, kdeadline_in_ms(1000), &v, &len, err)) != KHOR_SUCCESS)
			return rc;
		rc = elastic_plan_find(v, len, s->worker_id, out, err);
		free(v);
		if (rc != KHOR_SUCCESS)
			return rc;
		if (out->gen != gen)
			return kerr_set(err, KHOR_ERR_PROTOCOL, "the store's plan %lld says it is "
			                "generation %d", (long long)gen, out->gen);
		if (out->what == EL_IN)
			return KHOR_SUCCESS;
		if (out->what == EL_DROPPED)
			return kerr_set(err, KHOR_ERR_REMOVED, "worker %s is not in the elastic job from "
			                "generation %d on (its host was removed or blacklisted)",
			                s->worker_id, out->gen);
		last = (int)gen; /* not placed yet: a later plan will say */
	}
}
