/*
 * filter_rules.c -- KHOR_FAULTS' rules, from text (filter.h has the grammar). Strict like
 * base/parse.c: a rule that does not parse is refused with its text and the reason, never
 * read as something nearby.
 */
#include "filter.h"

#include "base/parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	enum filter_kind kind;
} kinds[] = {
	{ "drop", FK_DROP },   { "trunc", FK_TRUNC },     { "hdr", FK_HDR },   { "data", FK_DATA },
	{ "delay", FK_DELAY }, { "stall", FK_STALL },     { "regfail", FK_REGFAIL },
	{ "fail", FK_FAIL },
};

static const char *const fields[] = { "comm", "seq", "step", "meta", "len" };

/* A rank, or '*' (-1). */
static bool parse_rank(const char *s, int *out)
{
	int64_t v;

	if (strcmp(s, "*") == 0) {
		*out = -1;
		return true;
	}
	if (!kparse_i64(s, &v) || v < 0 || v > 1000000)
		return false;
	*out = (int)v;
	return true;
}

/* One rule, in rule[] (NUL-terminated, writable). */
static khor_status parse_one(char *rule, const char *text, filter_rule *r, kerr *err)
{
	char *colon = strchr(rule, ':'), *gt = strchr(rule, '>');

	memset(r, 0, sizeof(*r));
	r->field = FF_SEQ;
	if (colon == NULL || gt == NULL || gt > colon)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': expected "
		                "FROM>TO:KIND[=VALUE][@AT], e.g. 0>1:drop@64K", text);
	*gt = *colon = '\0';
	if (!parse_rank(rule, &r->from) || !parse_rank(gt + 1, &r->to))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': FROM and TO are "
		                "ranks or '*'", text);
	char *kind = colon + 1, *at = strchr(kind, '@'), *val;
	if (at != NULL)
		*at++ = '\0';
	if ((val = strchr(kind, '=')) != NULL)
		*val++ = '\0';
	size_t k = 0;
	while (k < sizeof(kinds) / sizeof(kinds[0]) && strcmp(kinds[k].name, kind) != 0)
		k++;
	if (k == sizeof(kinds) / sizeof(kinds[0]))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': unknown kind "
		                "'%s' (drop, trunc, hdr, data, delay, stall, regfail, fail)", text,
		                kind);
	r->kind = kinds[k].kind;
	if (at != NULL && !kparse_size(at, &r->at))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': @%s is not a "
		                "count of bytes (64K, 1M) or transfers", text, at);
	switch (r->kind) {
	case FK_HDR:
		if (val != NULL) {
			size_t f = 0;
			while (f < sizeof(fields) / sizeof(fields[0]) && strcmp(fields[f], val) != 0)
				f++;
			if (f == sizeof(fields) / sizeof(fields[0]))
				return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': hdr="
				                "%s: the fields are comm, seq, step, meta and len", text,
				                val);
			r->field = (enum filter_field)f;
		}
		return KHOR_SUCCESS;
	case FK_DELAY:
	case FK_STALL:
		if (val == NULL || !kparse_duration_ms(val, &r->ms) || r->ms < 0)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': %s needs "
			                "a duration (=500ms, =2s)", text, kinds[k].name);
		return KHOR_SUCCESS;
	default:
		if (val != NULL)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%s': %s takes "
			                "no value", text, kinds[k].name);
		return KHOR_SUCCESS;
	}
}

khor_status filter_parse(const char *spec, filter_rule *rules, int *n_out, kerr *err)
{
	char buf[1024], one[128];
	int n = 0;

	*n_out = 0;
	if (spec == NULL)
		return KHOR_SUCCESS;
	if (strlen(spec) >= sizeof(buf))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS: %zu characters, more "
		                "than the %zu it takes", strlen(spec), sizeof(buf) - 1);
	memcpy(buf, spec, strlen(spec) + 1);
	for (char *save = NULL, *t = strtok_r(buf, ",;", &save); t != NULL;
	     t = strtok_r(NULL, ",;", &save)) {
		while (*t == ' ')
			t++;
		size_t l = strlen(t);
		while (l > 0 && t[l - 1] == ' ')
			t[--l] = '\0';
		if (l == 0)
			continue;
		if (n == FILTER_RULES_MAX)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS: more than %d rules",
			                FILTER_RULES_MAX);
		if (l >= sizeof(one))
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule '%.40s...': too "
			                "long", t);
		memcpy(one, t, l + 1);
		khor_status st = parse_one(one, t, &rules[n], err);
		if (st != KHOR_SUCCESS)
			return st;
		n++;
	}
	*n_out = n;
	return KHOR_SUCCESS;
}
