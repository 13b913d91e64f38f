/*
 * mismatch.c -- the coordinator's check that every rank asked for the same thing under one
 * key, and the sentence when not: "grad/fc1: rank 2 has shape [128, 64], ranks 0, 1, 3 have
 * [128, 32]", the attribute that differs first, the odd ranks first.
 */
#include "mismatch.h"

#include "bbuf.h"
#include "desc.h"

#include "base/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(const etensor *t, char *out, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(out + o, len - o, "[");
	for (int d = 0; d < t->ndim && o < len; d++)
		o += (size_t)snprintf(out + o, len - o, "%s%lld", d > 0 ? ", " : "",
		                      (long long)t->dims[d]);
	if (o < len)
		snprintf(out + o, len - o, "]");
}

/*
 * "grad/fc1: rank 2 has shape [128, 64], ranks 0, 1, 3 have [128, 32]": the groups of
 * ranks by value of the first attribute that differs, smallest group first.
 */
static bool differ_msg(eset *s, const char *name, const char *label, char (*vals)[160],
                       const bool *has, bbuf *msg)
{
	int n = s->size, first = -1;
	bool differ = false;

	for (int r = 0; r < n; r++) {
		if (!has[r])
			continue;
		if (first < 0)
			first = r;
		else if (strcmp(vals[r], vals[first]) != 0)
			differ = true;
	}
	if (!differ)
		return false;
	int *group = malloc(sizeof(int) * (size_t)n), *members = malloc(sizeof(int) * (size_t)n);
	bool *done = calloc((size_t)n, sizeof(bool));
	if (group == NULL || members == NULL || done == NULL) {
		free(group);
		free(members);
		free(done);
		bbuf_printf(msg, "%s: ranks disagree on %s", name, label);
		return true;
	}
	/* The groups, by value. */
	int ng = 0;
	for (int r = 0; r < n; r++) {
		if (!has[r] || done[r])
			continue;
		group[ng++] = r;
		for (int q = r; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[r]) == 0)
				done[q] = true;
	}
	/* Smallest group first (ties: lowest rank), so the odd one out leads. */
	int *size = calloc((size_t)ng, sizeof(int));
	for (int g = 0; size != NULL && g < ng; g++)
		for (int q = 0; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[group[g]]) == 0)
				size[g]++;
	for (int a = 0; size != NULL && a < ng; a++) {
		for (int b = a + 1; b < ng; b++) {
			if (size[b] < size[a]) {
				int t = size[a]; size[a] = size[b]; size[b] = t;
				t = group[a]; group[a] = group[b]; group[b] = t;
			}
		}
	}
	bbuf_printf(msg, "%s: ", name);
	for (int g = 0; g < ng; g++) {
		int m = 0;
		for (int q = 0; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[group[g]]) == 0)
				members[m++] = q;
		bbuf_printf(msg, "%s%s ", g > 0 ? ", " : "", m > 1 ? "ranks" : "rank");
		bbuf_rank_list(msg, members, m);
		bbuf_printf(msg, " %s %s%s%s", m > 1 ? "have" : "has", g == 0 ? label : "",
		            g == 0 && label[0] != '\0' ? " " : "", vals[group[g]]);
	}
	free(size);
	free(group);
	free(members);
	free(done);
	return true;
}

static bool mismatch_slow(eset *s, centry *c, bbuf *msg);

/*
 * Compares every reporting rank's descriptor of c; on a difference writes the message and
 * returns true. Dim 0 of allgather and alltoall may differ.
 */
bool mismatch_find(eset *s, centry *c, bbuf *msg)
{
	/* The usual case, and the cheap one: every rank sent the very same descriptor. */
	int first = -1;
	bool same = true;
	for (int r = 0; r < s->size && same; r++) {
		if (c->desc[r] == NULL)
			continue;
		if (first < 0)
			first = r;
		else if (c->desc_len[r] != c->desc_len[first] ||
		         memcmp(c->desc[r], c->desc[first], c->desc_len[r]) != 0)
			same = false;
	}
	if (same)
		return false;
	return mismatch_slow(s, c, msg);
}

static bool mismatch_slow(eset *s, centry *c, bbuf *msg)
{
	int n = s->size;
	size_t nz = (size_t)(unsigned)n;
	eitem *it = calloc(nz, sizeof(*it));
	char (*vals)[160] = calloc(nz, sizeof(*vals));
	bool *has = calloc(nz, sizeof(bool));
	bool found = false;
	kerr err;

	if (it == NULL || vals == NULL || has == NULL) {
		free(it);
		free(vals);
		free(has);
		return false;
	}
	int ref = -1;
	for (int r = 0; r < n; r++) {
		if (c->desc[r] == NULL)
			continue;
		if (desc_parse(c->desc[r], c->desc_len[r], &it[r], &err) != KHOR_SUCCESS) {
			bbuf_printf(msg, "%s: rank %d sent a malformed descriptor", c->key, r);
			found = true;
			goto out;
		}
		has[r] = true;
		if (ref < 0)
			ref = r;
	}
	const char *name0 = it[ref].t[0].name;
#define CMP(label, fmt, expr, nm)                                                       \
	do {                                                                            \
		for (int r = 0; r < n; r++)                                             \
			if (has[r])                                                     \
				snprintf(vals[r], sizeof(vals[r]), fmt, expr);          \
		if (differ_msg(s, nm, label, vals, has, msg)) {                         \
			found = true;                                                   \
			goto out;                                                       \
		}                                                                       \
	} while (0)
	CMP("", "%s", eng_kind_name(it[r].kind), name0);
	CMP("group size", "%d", it[r].n, name0);
	if (it[ref].kind == EK_ALLREDUCE || it[ref].kind == EK_REDUCESCATTER)
		CMP("op", "%s", kop_name(it[r].op), name0);
	if (it[ref].kind == EK_BROADCAST)
		CMP("root", "%d", it[r].root, name0);
	if (it[ref].kind == EK_ALLREDUCE || it[ref].kind == EK_REDUCESCATTER) {
		CMP("prescale", "%g", it[r].prescale, name0);
		CMP("postscale", "%g", it[r].postscale, name0);
	}
	for (int i = 0; i < it[ref].n; i++) {
		const char *nm = it[ref].t[i].name;
		CMP("dtype", "%s", kdtype_name(it[r].t[i].dtype), nm);
		bool skip0 = it[ref].kind == EK_ALLGATHER || it[ref].kind == EK_ALLTOALL;
		for (int r = 0; r < n; r++) {
			if (!has[r])
				continue;
			shape_str(&it[r].t[i], vals[r], sizeof(vals[r]));
		}
		if (skip0) {
			/* Compare the shapes without dim 0, show them whole. */
			char (*tails)[160] = calloc(nz, sizeof(*tails));
			bool differ = false;
			for (int r = 0; tails != NULL && r < n; r++) {
				if (!has[r])
					continue;
				etensor t = it[r].t[i];
				if (t.ndim > 0)
					t.dims[0] = 0;
				shape_str(&t, tails[r], sizeof(tails[r]));
				if (strcmp(tails[r], tails[ref]) != 0)
					differ = true;
			}
			free(tails);
			if (differ && differ_msg(s, nm, "shape", vals, has, msg)) {
				bbuf_printf(msg, " (only dim 0 may differ in %s)", eng_kind_name(it[ref].kind));
				found = true;
				goto out;
			}
		} else if (differ_msg(s, nm, "shape", vals, has, msg)) {
			found = true;
			goto out;
		}
	}
#undef CMP
out:
	for (int r = 0; r < n; r++)
		if (has[r])
			desc_free_tensors(&it[r]);
	free(it);
	free(vals);
	free(has);
	return found;
}
