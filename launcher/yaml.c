/*
 * yaml.c -- a reader for the YAML subset of yaml.h, line by line. horovodrun's config
 * files are two levels of "key: value"; a full YAML parser would be most of this program
 * again, and PyYAML's quiet guesses (a list where a map was meant, 1e3 as a string) are
 * exactly what a launcher should not make. So the shape is fixed, and what does not fit
 * it is an error that names the line.
 */
#include "yaml.h"

#include "base/err.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define YAML_LINE_MAX 4096

struct yaml_state {
	const char *path;
	int line;
	char section[128]; /* the open section; "" when none */
	bool section_open; /* its line had no value: lines under it belong to it */
	int indent;        /* its entries' indentation; 0 until the first one */
	char *err;
	size_t errlen;
};

static bool yaml_fail(struct yaml_state *s, const char *fmt, const char *what)
{
	char msg[512];

	snprintf(msg, sizeof(msg), fmt, what);
	snprintf(s->err, s->errlen, "%s:%d: %s", s->path, s->line, msg);
	return false;
}

/* Cuts a comment (a '#' at the start or after a blank, outside quotes) and trailing blanks. */
static void cut_comment(char *p)
{
	char q = 0;

	for (char *c = p; *c != '\0'; c++) {
		if (q != 0) {
			if (*c == q)
				q = 0;
		} else if (*c == '\'' || *c == '"') {
			q = *c;
		} else if (*c == '#' && (c == p || c[-1] == ' ' || c[-1] == '\t')) {
			*c = '\0';
			break;
		}
	}
	for (size_t n = strlen(p); n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t' ||
	                                     p[n - 1] == '\r' || p[n - 1] == '\n');
	     n--)
		p[n - 1] = '\0';
}

/* The scalar after "key:", in place: quotes taken off, or the plain text as is. */
static bool yaml_value(struct yaml_state *s, char *v, char **out)
{
	char q = v[0];

	if (q == '\'' || q == '"') {
		char *w = v, *r = v + 1;

		for (;; r++) {
			if (*r == '\0')
				return yaml_fail(s, "unterminated %s quote", q == '\'' ? "'" : "\"");
			if (q == '\'' && r[0] == '\'' && r[1] == '\'') {
				*w++ = '\'';
				r++;
			} else if (q == '"' && r[0] == '\\' && (r[1] == '"' || r[1] == '\\')) {
				*w++ = r[1];
				r++;
			} else if (q == '"' && r[0] == '\\') {
				return yaml_fail(s, "escape '\\%.1s' in a \"...\" scalar: only \\\" and \\\\ "
				                 "are read here", r + 1);
			} else if (*r == q) {
				break;
			} else {
				*w++ = *r;
			}
		}
		*w = '\0';
		if (r[1 + strspn(r + 1, " \t")] != '\0')
			return yaml_fail(s, "text after the closing quote: '%s'", r + 1);
		*out = v;
		return true;
	}
	if (strchr("[{", q) != NULL)
		return yaml_fail(s, "flow style ('%s') is not read here: write one key: value a "
		                 "line", v);
	if (strchr("|>", q) != NULL)
		return yaml_fail(s, "block scalars ('%s') are not read here: write the value on "
		                 "one line", v);
	if (strchr("&*!", q) != NULL)
		return yaml_fail(s, "anchors, aliases and tags ('%s') are not read here", v);
	if (strchr("%@`", q) != NULL)
		return yaml_fail(s, "a plain scalar cannot start with '%.1s'", v);
	*out = v;
	return true;
}

/* One line that is not blank or a comment, its indentation already counted. */
static bool yaml_line(struct yaml_state *s, char *p, int indent, yaml_scalar_fn fn, void *arg)
{
	char *colon, *key = p, *val = NULL;
	size_t klen;

	if (p[0] == '-' && (p[1] == ' ' || p[1] == '\0'))
		return yaml_fail(s, "a list item ('%s'): only maps of key: value are read here", p);
	klen = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.");
	colon = p + klen;
	if (klen == 0 || *colon != ':' || (colon[1] != '\0' && colon[1] != ' ' && colon[1] != '\t'))
		return yaml_fail(s, "expected 'key: value' or 'key:' (a key of letters, digits, "
		                 "'_', '-' or '.'), not '%s'", p);
	*colon = '\0';
	val = colon + 1 + strspn(colon + 1, " \t");
	if (*val == '\0')
		val = NULL;
	else if (!yaml_value(s, val, &val))
		return false;

	if (indent == 0) {
		if (strlen(key) >= sizeof(s->section))
			return yaml_fail(s, "key '%s' is too long", key);
		snprintf(s->section, sizeof(s->section), "%s", key);
		s->section_open = val == NULL;
		s->indent = 0;
		return fn(arg, NULL, key, val, s->line, s->err, s->errlen);
	}
	if (s->section[0] == '\0')
		return yaml_fail(s, "indented '%s' with no key above it", key);
	if (!s->section_open)
		return yaml_fail(s, "'%s' is indented under a key that has a value of its own "
		                 "(give it no value to make it a section)", key);
	if (s->indent == 0)
		s->indent = indent;
	else if (indent > s->indent)
		return yaml_fail(s, "'%s' is nested deeper than one level: sections hold key: value "
		                 "lines only", key);
	else if (indent != s->indent)
		return yaml_fail(s, "'%s' is indented unlike the lines above it in its section", key);
	if (val == NULL)
		return yaml_fail(s, "'%s' has no value (a section inside a section is not read "
		                 "here)", key);
	return fn(arg, s->section, key, val, s->line, s->err, s->errlen);
}

bool yaml_read(const char *path, yaml_scalar_fn fn, void *arg, char *err, size_t errlen)
{
	struct yaml_state s = { .path = path, .err = err, .errlen = errlen };
	char buf[YAML_LINE_MAX + 2], ebuf[128];
	FILE *f = fopen(path, "r");
	bool ok = true, started = false;

	if (f == NULL) {
		snprintf(err, errlen, "%s: %s", path, kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		return false;
	}
	while (ok && fgets(buf, sizeof(buf), f) != NULL) {
		int indent = 0;
		char *p = buf;

		s.line++;
		if (strchr(buf, '\n') == NULL && !feof(f)) {
			ok = yaml_fail(&s, "line longer than %s bytes", "4096");
			break;
		}
		while (*p == ' ') {
			p++;
			indent++;
		}
		if (*p == '\t') {
			ok = yaml_fail(&s, "a tab in the indentation%s (YAML indents with spaces only)",
			               "");
			break;
		}
		cut_comment(p);
		if (*p == '\0')
			continue;
		if (indent == 0 && (strcmp(p, "---") == 0 || strcmp(p, "...") == 0)) {
			/* One document: a second "---" would start another, which horovodrun's
			 * yaml.load refuses too. */
			if (strcmp(p, "---") == 0 && started)
				ok = yaml_fail(&s, "a second document ('%s'): one is read", p);
			started = true;
			continue;
		}
		started = true;
		ok = yaml_line(&s, p, indent, fn, arg);
	}
	if (ok && ferror(f))
		ok = yaml_fail(&s, "read error%s", "");
	fclose(f);
	return ok;
}
