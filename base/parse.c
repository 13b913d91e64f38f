/* parse.c -- strict number parsers (see parse.h). */
#include "parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool kparse_i64(const char *s, int64_t *out)
{
	char *end;
	long long v;

	if (s == NULL || *s == '\0')
		return false;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*out = v;
	return true;
}

static bool parse_u64_prefix(const char *s, uint64_t *v, const char **rest)
{
	char *end;
	unsigned long long x;

	if (s == NULL || *s < '0' || *s > '9')
		return false;
	errno = 0;
	x = strtoull(s, &end, 10);
	if (errno != 0)
		return false;
	*v = x;
	*rest = end;
	return true;
}

bool kparse_size(const char *s, uint64_t *out)
{
	uint64_t v, mul = 1;
	const char *r;

	if (!parse_u64_prefix(s, &v, &r))
		return false;
	if (*r != '\0') {
		switch (*r == '\0' ? 0 : (*r | 0x20)) {
		case 'k': mul = 1ull << 10; break;
		case 'm': mul = 1ull << 20; break;
		case 'g': mul = 1ull << 30; break;
		case 't': mul = 1ull << 40; break;
		case 'b': mul = 1; r--; break;
		default: return false;
		}
		r++;
		if (strcasecmp(r, "") != 0 && strcasecmp(r, "b") != 0 && strcasecmp(r, "ib") != 0)
			return false;
	}
	if (v != 0 && mul > UINT64_MAX / v)
		return false;
	*out = v * mul;
	return true;
}

bool kparse_duration_ms(const char *s, int64_t *out)
{
	uint64_t v;
	const char *r;
	uint64_t mul;

	if (s == NULL)
		return false;
	if (strcmp(s, "-1") == 0 || strcasecmp(s, "inf") == 0 || strcasecmp(s, "none") == 0) {
		*out = -1;
		return true;
	}
	if (!parse_u64_prefix(s, &v, &r))
		return false;
	if (*r == '\0' || strcmp(r, "s") == 0)
		mul = 1000;
	else if (strcmp(r, "ms") == 0)
		mul = 1;
	else if (strcmp(r, "m") == 0 || strcmp(r, "min") == 0)
		mul = 60000;
	else if (strcmp(r, "h") == 0)
		mul = 3600000;
	else
		return false;
	if (v > (uint64_t)INT64_MAX / mul)
		return false;
	*out = (int64_t)(v * mul);
	return true;
}

bool kparse_is_true(const char *s)
{
	bool b;

	return kparse_bool(s, &b) && b;
}

bool kparse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };

	if (s == NULL)
		return false;
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return true;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return true;
		}
	}
	return false;
}
