/*
 * hostlist.c -- the hosts as the user names them: -H HOST[:SLOTS],... and hostfiles in
 * mpirun's and horovodrun's forms. A name given twice is one host with the slots added, and
 * every name is checked here, since it ends up on ssh's command line.
 */
#include "hosts.h"

#include "base/err.h"
#include "base/parse.h"
#include "say.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hostlist_free(struct hostlist *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->h[i].name);
	free(l->h);
	free(l->index);
	memset(l, 0, sizeof(*l));
}

static size_t name_hash(const char *name, size_t len)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
	return (size_t)h;
}

/* Room in the index for one more name (at most half full); false when out of memory. */
static bool index_room(struct hostlist *l)
{
	size_t cap = l->index_cap ? l->index_cap : 64;

	if ((size_t)l->n + 1 <= l->index_cap / 2)
		return true;
	while ((size_t)l->n + 1 > cap / 2)
		cap *= 2;
	int *ix = calloc(cap, sizeof(*ix));
	if (ix == NULL)
		return false;
	for (int i = 0; i < l->n; i++) {
		size_t at = name_hash(l->h[i].name, strlen(l->h[i].name)) & (cap - 1);
		while (ix[at] != 0)
			at = (at + 1) & (cap - 1);
		ix[at] = i + 1;
	}
	free(l->index);
	l->index = ix;
	l->index_cap = cap;
	return true;
}

bool hostlist_add(struct hostlist *l, const char *name, size_t len, int slots)
{
	if (!index_room(l)) {
		say("out of memory for the host list");
		return false;
	}
	/* The name as it would be kept (strndup stops at a NUL). */
	len = strnlen(name, len);
	size_t at = name_hash(name, len) & (l->index_cap - 1);
	for (; l->index[at] != 0; at = (at + 1) & (l->index_cap - 1)) {
		struct host *o = &l->h[l->index[at] - 1];
		if (strlen(o->name) == len && memcmp(o->name, name, len) == 0) {
			o->slots = o->slots + slots > MAX_RANKS ? MAX_RANKS : o->slots + slots;
			return true;
		}
	}
	if (l->n == MAX_HOSTS) {
		say("more than %d hosts", MAX_HOSTS);
		return false;
	}
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 16;
		struct host *h = realloc(l->h, (size_t)cap * sizeof(*h));

		if (h == NULL) {
			say("out of memory for the host list");
			return false;
		}
		l->h = h;
		l->cap = cap;
	}
	memset(&l->h[l->n], 0, sizeof(l->h[l->n]));
	l->h[l->n].name = strndup(name, len);
	if (l->h[l->n].name == NULL) {
		say("out of memory for the host list");
		return false;
	}
	l->h[l->n].slots = slots;
	l->index[at] = l->n + 1;
	l->n++;
	return true;
}

static bool parse_slots(const char *s, size_t len, int *out)
{
	char buf[32];
	int64_t v;

	if (len == 0 || len >= sizeof(buf))
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (!kparse_i64(buf, &v) || v < 1 || v > MAX_RANKS)
		return false;
	*out = (int)v;
	return true;
}

/*
 * A host name as -H and --hostfile take it (a v6 address without its brackets): not empty,
 * not an option, and nothing a shell or ssh would read otherwise (space, quotes,
 * brackets).
 */
static bool host_name_ok(const char *name, size_t nlen, const char *where, const char *as_given)
{
	if (nlen == 0) {
		say("%s: '%s' has no host name", where, as_given);
		return false;
	}
	bool ok = name[0] != '-';
	for (size_t i = 0; ok && i < nlen; i++)
		ok = !isspace((unsigned char)name[i]) && strchr("'\"[]", name[i]) == NULL;
	if (!ok)
		say("%s: '%.*s' is not a host name", where, (int)nlen, name);
	return ok;
}

/*
 * One "HOST", "HOST:SLOTS", "[V6]" or "[V6]:SLOTS" (len bytes at s). A bare address with
 * more than one colon is a v6 address of 1 slot. where says where it came from.
 */
static bool parse_host_slots(const char *s, size_t len, const char *where, struct hostlist *l)
{
	const char *name = s, *colon = NULL;
	size_t nlen = len;
	int slots = 1;

	if (len > 0 && s[0] == '[') {
		const char *rb = memchr(s, ']', len);

		if (rb == NULL || rb == s + 1 || (rb + 1 < s + len && rb[1] != ':')) {
			say("%s: '%.*s' is not HOST:SLOTS or [V6ADDR]:SLOTS", where, (int)len, s);
			return false;
		}
		name = s + 1;
		nlen = (size_t)(rb - s - 1);
		if (rb + 1 < s + len)
			colon = rb + 1;
	} else {
		const char *c = memchr(s, ':', len);

		if (c != NULL && memchr(c + 1, ':', len - (size_t)(c + 1 - s)) == NULL) {
			colon = c;
			nlen = (size_t)(c - s);
		}
	}
	char given[256];
	snprintf(given, sizeof(given), "%.*s", (int)len, s);
	if (!host_name_ok(name, nlen, where, given))
		return false;
	if (colon != NULL) {
		size_t sl = len - (size_t)(colon + 1 - s);

		if (!parse_slots(colon + 1, sl, &slots)) {
			say("%s: host '%.*s' wants a slot count from 1 to %d, not '%.*s'", where,
			    (int)nlen, name, MAX_RANKS, (int)sl, colon + 1);
			return false;
		}
	}
	return hostlist_add(l, name, nlen, slots);
}

bool hostlist_parse_arg(const char *arg, struct hostlist *l)
{
	char where[300];
	const char *p = arg;

	snprintf(where, sizeof(where), "-H %s", arg);
	if (*arg == '\0') {
		say("-H wants HOST:SLOTS,...");
		return false;
	}
	for (;;) {
		size_t n = strcspn(p, ",");

		if (n == 0) {
			say("%s: empty host entry", where);
			return false;
		}
		if (!parse_host_slots(p, n, where, l))
			return false;
		if (p[n] == '\0')
			return true;
		p += n + 1;
	}
}

bool hostlist_parse_file(const char *path, struct hostlist *l)
{
	char ebuf[128];
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0;
	bool ok = true;
	FILE *f = fopen(path, "r");

	if (f == NULL) {
		say("--hostfile %s: %s", path, kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		return false;
	}
	while (ok && getline(&line, &cap, f) >= 0) {
		char where[300], *save = NULL, *tok, *hostw;
		char *hash = strchr(line, '#');
		int slots = 0;

		lineno++;
		snprintf(where, sizeof(where), "%s:%d", path, lineno);
		if (hash != NULL)
			*hash = '\0';
		hostw = strtok_r(line, " \t\r\n", &save);
		if (hostw == NULL)
			continue;
		while (ok && (tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
			if (strncmp(tok, "slots=", 6) == 0) {
				if (!parse_slots(tok + 6, strlen(tok + 6), &slots)) {
					say("%s: host '%s' wants slots=N with N from 1 to %d, not '%s'", where,
					    hostw, MAX_RANKS, tok);
					ok = false;
				}
			} else if (strncmp(tok, "max_slots=", 10) != 0) {
				say("%s: '%s' is not understood; a line is \"HOST slots=N\", \"HOST:N\" or "
				    "\"HOST\"", where, tok);
				ok = false;
			}
		}
		if (!ok)
			break;
		if (slots > 0) {
			if (strchr(hostw, ':') != NULL && hostw[0] != '[' &&
			    strchr(strchr(hostw, ':') + 1, ':') == NULL) {
				say("%s: '%s' gives its slots twice (HOST:N and slots=N)", where, hostw);
				ok = false;
			} else {
				const char *nm = hostw;
				size_t nl = strlen(hostw);

				if (nl > 2 && hostw[0] == '[' && hostw[nl - 1] == ']') {
					nm++;
					nl -= 2;
				}
				ok = host_name_ok(nm, nl, where, hostw) && hostlist_add(l, nm, nl, slots);
			}
		} else {
			ok = parse_host_slots(hostw, strlen(hostw), where, l);
		}
	}
	free(line);
	fclose(f);
	if (ok && l->n == 0) {
		say("--hostfile %s names no host", path);
		ok = false;
	}
	return ok;
}
