/*
 * slurm.c -- the hosts of the Slurm allocation khorrun runs in, when neither -H nor
 * --hostfile names any: Slurm's compressed node list and its per-node task counts, both
 * bounded, since they are text from outside.
 */
#include "hosts.h"

#include "say.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Slurm's compressed host list, as in SLURM_JOB_NODELIST: "node[01-03,07],gpu5" is node01,
 * node02, node03, node07, gpu5; several brackets multiply ("r[1-2]n[1-2]"); a range keeps
 * the width of its first number ("[08-10]" is 08, 09, 10). Appends to out (1 slot each).
 */
static bool slurm_expand_item(const char *item, struct hostlist *out, const char *var,
                              size_t *made)
{
	const char *lb = strchr(item, '['), *rb;
	const char *p;

	if (lb == NULL) {
		/* Every name counts, a repeated one too: brackets multiply, and "[1,1,1][1,1,1]"
		 * would otherwise make names without end that all merge into one host. */
		if (++*made > MAX_HOSTS) {
			say("%s: more than %d node names", var, MAX_HOSTS);
			return false;
		}
		return hostlist_add(out, item, strlen(item), 1);
	}
	rb = strchr(lb, ']');
	if (rb == NULL || rb == lb + 1) {
		say("%s: '%s' has an unclosed or empty '['", var, item);
		return false;
	}
	for (p = lb + 1; p < rb;) {
		size_t n = (size_t)(memchr(p, ',', (size_t)(rb - p)) != NULL
		                            ? (const char *)memchr(p, ',', (size_t)(rb - p)) - p
		                            : rb - p);
		const char *dash = memchr(p, '-', n);
		unsigned long lo, hi;
		int width;
		char *end;

		if (n == 0 || !isdigit((unsigned char)p[0]))
			goto bad;
		/* At most 18 digits: the numbers then fit, and counting up to hi can't wrap. */
		lo = strtoul(p, &end, 10);
		width = (int)(end - p);
		if (width > 18)
			goto bad;
		if (dash != NULL) {
			if (end != dash || !isdigit((unsigned char)dash[1]))
				goto bad;
			hi = strtoul(dash + 1, &end, 10);
			if (end - (dash + 1) > 18)
				goto bad;
		} else {
			hi = lo;
		}
		if (end != p + n || hi < lo || hi - lo >= MAX_HOSTS)
			goto bad;
		for (unsigned long v = lo; v <= hi; v++) {
			char *name;

			if (asprintf(&name, "%.*s%0*lu%s", (int)(lb - item), item, width, v, rb + 1) < 0) {
				say("out of memory expanding %s", var);
				return false;
			}
			if (!slurm_expand_item(name, out, var, made)) {
				free(name);
				return false;
			}
			free(name);
		}
		p += n + (p + n < rb);
	}
	return true;
bad:
	say("%s: '%.*s' in '%s' is not a number or a range like 01-03", var, (int)(rb - lb - 1),
	    lb + 1, item);
	return false;
}

static bool slurm_expand_nodelist(const char *list, struct hostlist *out, const char *var)
{
	const char *p = list;
	size_t made = 0;

	while (*p != '\0') {
		const char *q = p;
		int depth = 0;
		char *item;
		bool ok;

		/* The next comma outside brackets. */
		while (*q != '\0' && (*q != ',' || depth > 0)) {
			depth += *q == '[' ? 1 : *q == ']' ? -1 : 0;
			q++;
		}
		if (q == p) {
			say("%s='%s': empty entry", var, list);
			return false;
		}
		item = strndup(p, (size_t)(q - p));
		if (item == NULL)
			return false;
		ok = slurm_expand_item(item, out, var, &made);
		free(item);
		if (!ok)
			return false;
		p = *q == ',' ? q + 1 : q;
	}
	return true;
}

bool slurm_hosts(struct hostlist *l, bool *bad_out)
{
	const char *var = "SLURM_JOB_NODELIST", *nodes = getenv(var);
	const char *cvar = "SLURM_TASKS_PER_NODE", *counts = getenv(cvar);
	const char *p;
	int h = 0;

	*bad_out = false;
	if (nodes == NULL || *nodes == '\0') {
		var = "SLURM_NODELIST";
		nodes = getenv(var);
	}
	if (counts == NULL || *counts == '\0') {
		cvar = "SLURM_JOB_CPUS_PER_NODE";
		counts = getenv(cvar);
	}
	if (nodes == NULL || *nodes == '\0' || counts == NULL || *counts == '\0')
		return false;
	*bad_out = true;
	if (!slurm_expand_nodelist(nodes, l, var))
		return false;
	for (p = counts; *p != '\0';) {
		char *end;
		long c = strtol(p, &end, 10), rep = 1;

		if (end == p || c < 1 || c > MAX_RANKS)
			goto bad;
		if (*end == '(') {
			if (end[1] != 'x')
				goto bad;
			rep = strtol(end + 2, &end, 10);
			if (rep < 1 || *end != ')')
				goto bad;
			end++;
		}
		for (long k = 0; k < rep; k++, h++) {
			if (h >= l->n) {
				say("%s='%s' counts more nodes than %s='%s' lists (%d)", cvar, counts, var,
				    nodes, l->n);
				return false;
			}
			l->h[h].slots = (int)c;
		}
		if (*end == ',')
			end++;
		else if (*end != '\0')
			goto bad;
		p = end;
	}
	if (h != l->n) {
		say("%s='%s' counts %d nodes but %s='%s' lists %d", cvar, counts, h, var, nodes, l->n);
		return false;
	}
	*bad_out = false;
	return true;
bad:
	say("%s='%s' is not a list like \"2(x3),1\"", cvar, counts);
	return false;
}
