/*
 * settings.c -- an engine's settings: fusion, cycle time, cache, timeline, stall inspector and
 * autotune, each from runtime/config.c's table (the caller's khor_config, then KHOR_*, then
 * Horovod's alias, then the table's default), checked here where their units are known.
 */
#include "settings.h"

#include "base/parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* name's value, else its table default; *given says whether anyone set it. */
static const char *value(const khor_config *cfg, const char *name, const char **from,
                         bool *given)
{
	const char *v = config_lookup_alias(cfg, name, from);

	if (given != NULL)
		*given = v != NULL;
	if (v == NULL) {
		v = config_default(name);
		*from = name;
	}
	return v;
}

static khor_status get_seconds(const khor_config *cfg, const char *name, double *out, kerr *err)
{
	const char *from, *v = value(cfg, name, &from, NULL);
	char *end;

	errno = 0;
	double d = strtod(v, &end);
	if (end != v && *end == 's' && end[1] == '\0')
		end++;
	if (errno != 0 || end == v || *end != '\0' || d < 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected seconds >= 0 (e.g. 60)",
		                from, v);
	*out = d;
	return KHOR_SUCCESS;
}

khor_status settings_read(const khor_config *cfg, eng_settings *s, kerr *err)
{
	const char *from, *v;
	khor_status st;
	char *end;
	int64_t n;

	memset(s, 0, sizeof(*s));
	v = value(cfg, "KHOR_FUSION_THRESHOLD", &from, &s->fusion_set);
	if (!kparse_size(v, &s->fusion_bytes) || s->fusion_bytes > (1ull << 40))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected bytes (suffixes K, M, "
		                "G allowed; 0 = no fusion)", from, v);
	v = value(cfg, "KHOR_CYCLE_TIME", &from, &s->cycle_set);
	errno = 0;
	s->cycle_ms = strtod(v, &end);
	if (end != v && strcmp(end, "ms") == 0)
		end += 2;
	if (errno != 0 || end == v || *end != '\0' || s->cycle_ms < 0 || s->cycle_ms > 60000)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected milliseconds from 0 to "
		                "60000", from, v);
	v = value(cfg, "KHOR_CACHE_CAPACITY", &from, NULL);
	if (!kparse_i64(v, &n) || n < 0 || n > (1 << 20))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected entries from 0 to "
		                "1048576 (0 = no cache)", from, v);
	s->cache_capacity = (int)n;
	v = value(cfg, "KHOR_TIMELINE", &from, NULL);
	if (v != NULL && kstrlcpy(s->timeline, v, sizeof(s->timeline)) >= sizeof(s->timeline))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: path longer than %zu bytes", from,
		                sizeof(s->timeline) - 1);
	s->mark_cycles = kparse_is_true(value(cfg, "KHOR_TIMELINE_MARK_CYCLES", &from, NULL));
	if ((st = get_seconds(cfg, "KHOR_STALL_CHECK_TIME", &s->stall_check_s, err)) !=
	    KHOR_SUCCESS)
		return st;
	if ((st = get_seconds(cfg, "KHOR_STALL_SHUTDOWN_TIME", &s->stall_shutdown_s, err)) !=
	    KHOR_SUCCESS)
		return st;
	/* Horovod's switch to turn the inspector off (HOROVOD_STALL_CHECK_DISABLE). */
	if (config_alias_off(cfg, "KHOR_STALL_CHECK_TIME"))
		s->stall_check_s = 0;
	s->autotune = kparse_is_true(value(cfg, "KHOR_AUTOTUNE", &from, NULL));
	v = value(cfg, "KHOR_AUTOTUNE_LOG", &from, NULL);
	if (v != NULL)
		kstrlcpy(s->autotune_log, v, sizeof(s->autotune_log));
	const char *ints[2] = { "KHOR_AUTOTUNE_WARMUP_SAMPLES", "KHOR_AUTOTUNE_STEPS_PER_SAMPLE" };
	int *dst[2] = { &s->warmup_samples, &s->steps_per_sample };
	for (int i = 0; i < 2; i++) {
		v = value(cfg, ints[i], &from, NULL);
		if (!kparse_i64(v, &n) || n < i || n > 100000)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s='%s': expected an integer from "
			                "%d to 100000", from, v, i);
		*dst[i] = (int)n;
	}
	return KHOR_SUCCESS;
}
