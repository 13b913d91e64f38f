/*
 * json.c -- the strict JSON reader and base64 of json.h. A recursive-descent parser whose
 * depth is bounded by JSON_MAX_DEPTH; every byte is checked against the grammar, so the
 * lookups that follow can trust the token boundaries.
 */
#include "json.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
	const char *s;
	size_t len, pos;
	struct json_tok *toks;
	int max, n;
	char *why;
	size_t why_len;
};

static bool fail(struct parser *p, const char *what)
{
	snprintf(p->why, p->why_len, "at byte %zu of %zu: %s", p->pos, p->len, what);
	return false;
}

static void skip_ws(struct parser *p)
{
	while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
	                           p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
		p->pos++;
}

static int new_tok(struct parser *p, enum json_type type)
{
	if (p->n >= p->max)
		return -1;
	p->toks[p->n] = (struct json_tok){ .type = (uint8_t)type, .start = (uint32_t)p->pos };
	return p->n++;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_hex(char c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool parse_string(struct parser *p, int t)
{
	p->pos++; /* the opening quote */
	p->toks[t].start = (uint32_t)p->pos;
	while (p->pos < p->len) {
		unsigned char c = (unsigned char)p->s[p->pos];
		if (c == '"') {
			p->toks[t].len = (uint32_t)(p->pos - p->toks[t].start);
			p->pos++;
			return true;
		}
		if (c < 0x20)
			return fail(p, "control character in a string");
		if (c == '\\') {
			if (p->pos + 1 >= p->len)
				break;
			c = (unsigned char)p->s[p->pos + 1];
			if (c == 'u') {
				if (p->pos + 6 > p->len)
					break;
				for (int i = 2; i < 6; i++)
					if (!is_hex(p->s[p->pos + (size_t)i]))
						return fail(p, "bad \\u escape");
				p->pos += 6;
				continue;
			}
			if (strchr("\"\\/bfnrt", (int)c) == NULL || c == '\0')
				return fail(p, "bad escape in a string");
			p->pos += 2;
			continue;
		}
		p->pos++;
	}
	return fail(p, "unterminated string");
}

static bool parse_number(struct parser *p, int t)
{
	size_t start = p->pos;

	if (p->pos < p->len && p->s[p->pos] == '-')
		p->pos++;
	if (p->pos >= p->len || !is_digit(p->s[p->pos]))
		return fail(p, "bad number");
	if (p->s[p->pos] == '0')
		p->pos++;
	else
		while (p->pos < p->len && is_digit(p->s[p->pos]))
			p->pos++;
	if (p->pos < p->len && p->s[p->pos] == '.') {
		p->pos++;
		if (p->pos >= p->len || !is_digit(p->s[p->pos]))
			return fail(p, "bad fraction");
		while (p->pos < p->len && is_digit(p->s[p->pos]))
			p->pos++;
	}
	if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
		p->pos++;
		if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
			p->pos++;
		if (p->pos >= p->len || !is_digit(p->s[p->pos]))
			return fail(p, "bad exponent");
		while (p->pos < p->len && is_digit(p->s[p->pos]))
			p->pos++;
	}
	p->toks[t].len = (uint32_t)(p->pos - start);
	return true;
}

static bool parse_literal(struct parser *p, int t, const char *word)
{
	size_t n = strlen(word);

	if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
		return fail(p, "unexpected character");
	p->pos += n;
	p->toks[t].len = (uint32_t)n;
	return true;
}

static bool parse_value(struct parser *p, int depth);

/* An array or an object: elements (or key: value members) separated by commas. */
static bool parse_container(struct parser *p, int t, bool object, int depth)
{
	char close = object ? '}' : ']';

	p->pos++;
	skip_ws(p);
	if (p->pos < p->len && p->s[p->pos] == close) {
		p->pos++;
		return true;
	}
	for (;;) {
		skip_ws(p);
		if (object) {
			if (p->pos >= p->len || p->s[p->pos] != '"')
				return fail(p, "expected a member name");
			int k = new_tok(p, JSON_STRING);
			if (k < 0)
				return fail(p, "too many values");
			if (!parse_string(p, k))
				return false;
			p->toks[k].next = (uint32_t)p->n;
			skip_ws(p);
			if (p->pos >= p->len || p->s[p->pos] != ':')
				return fail(p, "expected ':'");
			p->pos++;
		}
		if (!parse_value(p, depth + 1))
			return false;
		p->toks[t].count++;
		skip_ws(p);
		if (p->pos < p->len && p->s[p->pos] == ',') {
			p->pos++;
			continue;
		}
		if (p->pos < p->len && p->s[p->pos] == close) {
			p->pos++;
			return true;
		}
		return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

static bool parse_value(struct parser *p, int depth)
{
	bool ok;
	int t;

	if (depth > JSON_MAX_DEPTH)
		return fail(p, "nested too deep");
	skip_ws(p);
	if (p->pos >= p->len)
		return fail(p, "unexpected end");
	switch (p->s[p->pos]) {
	case '{':
	case '[':
		t = new_tok(p, p->s[p->pos] == '{' ? JSON_OBJECT : JSON_ARRAY);
		if (t < 0)
			return fail(p, "too many values");
		ok = parse_container(p, t, p->toks[t].type == JSON_OBJECT, depth);
		if (ok)
			p->toks[t].len = (uint32_t)(p->pos - p->toks[t].start);
		break;
	case '"':
		t = new_tok(p, JSON_STRING);
		ok = t >= 0 ? parse_string(p, t) : fail(p, "too many values");
		break;
	case 't':
	case 'f':
		t = new_tok(p, JSON_BOOL);
		ok = t >= 0 ? parse_literal(p, t, p->s[p->pos] == 't' ? "true" : "false")
		            : fail(p, "too many values");
		break;
	case 'n':
		t = new_tok(p, JSON_NULL);
		ok = t >= 0 ? parse_literal(p, t, "null") : fail(p, "too many values");
		break;
	default:
		t = new_tok(p, JSON_NUMBER);
		ok = t >= 0 ? parse_number(p, t) : fail(p, "too many values");
		break;
	}
	if (ok)
		p->toks[t].next = (uint32_t)p->n;
	return ok;
}

bool json_parse(const char *text, size_t len, struct json_tok *toks, int max_toks,
                json_doc *doc_out, char *why, size_t why_len)
{
	struct parser p = { text, len, 0, toks, max_toks, 0, why, why_len };

	if (len > JSON_MAX_TEXT) {
		snprintf(why, why_len, "%zu bytes, over the limit of %u", len, JSON_MAX_TEXT);
		return false;
	}
	if (!parse_value(&p, 0))
		return false;
	skip_ws(&p);
	if (p.pos != len)
		return fail(&p, "text after the value");
	doc_out->text = text;
	doc_out->tok = toks;
	doc_out->ntok = p.n;
	return true;
}

static bool valid(const json_doc *d, int t)
{
	return t >= 0 && t < d->ntok;
}

int json_member(const json_doc *d, int obj, const char *name)
{
	size_t nl = strlen(name);

	if (!valid(d, obj) || d->tok[obj].type != JSON_OBJECT)
		return -1;
	int k = obj + 1;
	for (uint32_t i = 0; i < d->tok[obj].count; i++) {
		int v = k + 1;
		if (d->tok[k].len == nl && memcmp(d->text + d->tok[k].start, name, nl) == 0)
			return v;
		k = (int)d->tok[v].next;
	}
	return -1;
}

int json_first(const json_doc *d, int arr)
{
	if (!valid(d, arr) || d->tok[arr].type != JSON_ARRAY || d->tok[arr].count == 0)
		return -1;
	return arr + 1;
}

int json_after(const json_doc *d, int arr, int elem)
{
	if (!valid(d, arr) || !valid(d, elem))
		return -1;
	int n = (int)d->tok[elem].next;
	return n < (int)d->tok[arr].next ? n : -1;
}

bool json_i64(const json_doc *d, int t, int64_t *out)
{
	char buf[24];
	char *end;

	if (!valid(d, t) || (d->tok[t].type != JSON_STRING && d->tok[t].type != JSON_NUMBER) ||
	    d->tok[t].len == 0 || d->tok[t].len >= sizeof(buf))
		return false;
	memcpy(buf, d->text + d->tok[t].start, d->tok[t].len);
	buf[d->tok[t].len] = '\0';
	if (buf[0] != '-' && !is_digit(buf[0]))
		return false;
	long long v = strtoll(buf, &end, 10);
	if (*end != '\0' || (v == LLONG_MAX && strcmp(buf, "9223372036854775807") != 0) ||
	    (v == LLONG_MIN && strcmp(buf, "-9223372036854775808") != 0))
		return false;
	*out = (int64_t)v;
	return true;
}

bool json_bool(const json_doc *d, int t, bool *out)
{
	if (!valid(d, t) || d->tok[t].type != JSON_BOOL)
		return false;
	*out = d->text[d->tok[t].start] == 't';
	return true;
}

bool json_str_is(const json_doc *d, int t, const char *s)
{
	return valid(d, t) && d->tok[t].type == JSON_STRING && d->tok[t].len == strlen(s) &&
	       memcmp(d->text + d->tok[t].start, s, d->tok[t].len) == 0;
}

static unsigned hex4(const char *s)
{
	unsigned v = 0;

	for (int i = 0; i < 4; i++) {
		char c = s[i];
		v = v * 16 + (unsigned)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
	}
	return v;
}

/* Appends code point cp as UTF-8 if it fits in buf[*n .. cap - 1). */
static void put_utf8(char *buf, size_t cap, size_t *n, unsigned cp)
{
	char u[4];
	size_t k;

	if (cp < 0x80) {
		u[0] = (char)cp;
		k = 1;
	} else if (cp < 0x800) {
		u[0] = (char)(0xC0 | (cp >> 6));
		u[1] = (char)(0x80 | (cp & 0x3F));
		k = 2;
	} else if (cp < 0x10000) {
		u[0] = (char)(0xE0 | (cp >> 12));
		u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		u[2] = (char)(0x80 | (cp & 0x3F));
		k = 3;
	} else {
		u[0] = (char)(0xF0 | (cp >> 18));
		u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
		u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
		u[3] = (char)(0x80 | (cp & 0x3F));
		k = 4;
	}
	if (*n + k < cap) {
		memcpy(buf + *n, u, k);
		*n += k;
	}
}

bool json_str(const json_doc *d, int t, char *buf, size_t cap)
{
	size_t n = 0;

	if (!valid(d, t) || d->tok[t].type != JSON_STRING)
		return false;
	const char *s = d->text + d->tok[t].start, *end = s + d->tok[t].len;
	while (s < end && n + 1 < cap) {
		if (*s != '\\') {
			buf[n++] = *s++;
			continue;
		}
		char e = s[1];
		s += 2;
		if (e == 'u') {
			unsigned cp = hex4(s);
			s += 4;
			/* A surrogate pair makes one code point; a lone half becomes U+FFFD. */
			if (cp >= 0xD800 && cp < 0xDC00 && end - s >= 6 && s[0] == '\\' &&
			    s[1] == 'u' && hex4(s + 2) >= 0xDC00 && hex4(s + 2) < 0xE000) {
				cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(s + 2) - 0xDC00);
				s += 6;
			} else if (cp >= 0xD800 && cp < 0xE000) {
				cp = 0xFFFD;
			}
			put_utf8(buf, cap, &n, cp);
			continue;
		}
		static const char from[] = "bfnrt", to[] = "\b\f\n\r\t";
		const char *f = strchr(from, e);
		buf[n++] = f != NULL ? to[f - from] : e; /* \" \\ \/ stand for themselves */
	}
	buf[n] = '\0';
	return true;
}

static const char b64_chars[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_val(char c)
{
	const char *p = c != '\0' ? strchr(b64_chars, c) : NULL;

	return p != NULL ? (int)(p - b64_chars) : -1;
}

bool json_b64(const json_doc *d, int t, uint8_t **out, size_t *len_out)
{
	if (!valid(d, t) || d->tok[t].type != JSON_STRING || d->tok[t].len % 4 != 0)
		return false;
	const char *s = d->text + d->tok[t].start;
	size_t n = d->tok[t].len, pad = 0;
	if (n > 0 && s[n - 1] == '=')
		pad = n > 1 && s[n - 2] == '=' ? 2 : 1;
	size_t len = n / 4 * 3 - pad;
	uint8_t *buf = malloc(len + 1);
	if (buf == NULL)
		return false;
	size_t o = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		for (int k = 0; k < 4; k++) {
			bool padding = i + 4 == n && (size_t)k >= 4 - pad;
			v[k] = padding ? 0 : b64_val(s[i + (size_t)k]);
			if (v[k] < 0) {
				free(buf);
				return false;
			}
		}
		uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
		             (uint32_t)v[3];
		uint8_t b[3] = { (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w };
		for (int k = 0; k < 3 && o < len; k++)
			buf[o++] = b[k];
	}
	buf[len] = '\0';
	*out = buf;
	*len_out = len;
	return true;
}

size_t json_b64_len(size_t len)
{
	return (len + 2) / 3 * 4;
}

void json_b64_encode(const void *src, size_t len, char *dst)
{
	const uint8_t *p = src;
	size_t o = 0;

	for (size_t i = 0; i < len; i += 3) {
		uint32_t w = (uint32_t)p[i] << 16;
		if (i + 1 < len)
			w |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < len)
			w |= p[i + 2];
		dst[o++] = b64_chars[(w >> 18) & 63];
		dst[o++] = b64_chars[(w >> 12) & 63];
		dst[o++] = i + 1 < len ? b64_chars[(w >> 6) & 63] : '=';
		dst[o++] = i + 2 < len ? b64_chars[w & 63] : '=';
	}
	dst[o] = '\0';
}
