/*
 * tuning.c -- horovodrun's tuning flags and its --config-file (Horovod's
 * runner/common/util/config_parser.py: the sections, keys and variables are its own). Each
 * setting becomes a variable in every rank's environment, which runtime/config.c reads:
 * the KHOR_* name where khor has the knob (its HOROVOD_* alias would lose to a KHOR_* one
 * in the shell), horovodrun's HOROVOD_* name where khor has none, so that a script that
 * reads it still sees it. A flag wins over the file, as in horovodrun.
 */
#include "tuning.h"

#include "base/err.h"
#include "base/parse.h"
#include "job.h"
#include "say.h"
#include "yaml.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum kind { K_MB, K_INT, K_FLOAT, K_NOISE, K_BOOL, K_STR, K_LEVEL, K_NICS };

struct knob {
	const char *flag, *noflag; /* the switch and its negation ("--autotune", "--no-autotune") */
	const char *section, *key; /* its place in --config-file; NULL: not there */
	const char *var;           /* what the ranks get */
	enum kind kind;
	bool invert; /* true (the flag, the file's key) sets var to 0: stall_check.enabled */
	const char *help;
};

/*
 * In the order the variables are added: a later one wins, so --no-stall-check (which also
 * sets KHOR_STALL_CHECK_TIME=0) comes after the warning time it turns off.
 */
static const struct knob knobs[] = {
	{ "--fusion-threshold-mb", NULL, "params", "fusion_threshold_mb", "KHOR_FUSION_THRESHOLD",
	  K_MB, false, "MB  KHOR_FUSION_THRESHOLD (in bytes)" },
	{ "--cycle-time-ms", NULL, "params", "cycle_time_ms", "KHOR_CYCLE_TIME", K_FLOAT, false,
	  "MS  KHOR_CYCLE_TIME" },
	{ "--cache-capacity", NULL, "params", "cache_capacity", "KHOR_CACHE_CAPACITY", K_INT, false,
	  "N  KHOR_CACHE_CAPACITY" },
	{ "--hierarchical-allreduce", "--no-hierarchical-allreduce", "params",
	  "hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", K_BOOL, false,
	  "HOROVOD_HIERARCHICAL_ALLREDUCE=1 (0)" },
	{ "--hierarchical-allgather", "--no-hierarchical-allgather", "params",
	  "hierarchical_allgather", "HOROVOD_HIERARCHICAL_ALLGATHER", K_BOOL, false,
	  "HOROVOD_HIERARCHICAL_ALLGATHER=1 (0)" },
	{ "--torus-allreduce", "--no-torus-allreduce", "params", "torus_allreduce",
	  "HOROVOD_TORUS_ALLREDUCE", K_BOOL, false, "HOROVOD_TORUS_ALLREDUCE=1 (0; khor has none)" },
	{ "--autotune", "--no-autotune", "autotune", "enabled", "KHOR_AUTOTUNE", K_BOOL, false,
	  "KHOR_AUTOTUNE=1 (0)" },
	{ "--autotune-log-file", NULL, "autotune", "log_file", "KHOR_AUTOTUNE_LOG", K_STR, false,
	  "FILE  KHOR_AUTOTUNE_LOG" },
	{ "--autotune-warmup-samples", NULL, "autotune", "warmup_samples",
	  "KHOR_AUTOTUNE_WARMUP_SAMPLES", K_INT, false, "N  KHOR_AUTOTUNE_WARMUP_SAMPLES" },
	{ "--autotune-steps-per-sample", NULL, "autotune", "steps_per_sample",
	  "KHOR_AUTOTUNE_STEPS_PER_SAMPLE", K_INT, false, "N  KHOR_AUTOTUNE_STEPS_PER_SAMPLE" },
	{ "--autotune-bayes-opt-max-samples", NULL, "autotune", "bayes_opt_max_samples",
	  "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", K_INT, false,
	  "N  HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (khor: unused)" },
	{ "--autotune-gaussian-process-noise", NULL, "autotune", "gaussian_process_noise",
	  "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", K_NOISE, false,
	  "X  HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, 0 to 1 (khor: unused)" },
	{ "--timeline-filename", NULL, "timeline", "filename", "KHOR_TIMELINE", K_STR, false,
	  "FILE  KHOR_TIMELINE" },
	{ "--timeline-mark-cycles", "--no-timeline-mark-cycles", "timeline", "mark_cycles",
	  "KHOR_TIMELINE_MARK_CYCLES", K_BOOL, false, "KHOR_TIMELINE_MARK_CYCLES=1 (0)" },
	{ "--stall-check-warning-time-seconds", NULL, "stall_check", "warning_time_seconds",
	  "KHOR_STALL_CHECK_TIME", K_INT, false, "S  KHOR_STALL_CHECK_TIME" },
	{ "--stall-check-shutdown-time-seconds", NULL, "stall_check", "shutdown_time_seconds",
	  "KHOR_STALL_SHUTDOWN_TIME", K_INT, false, "S  KHOR_STALL_SHUTDOWN_TIME" },
	{ "--stall-check", "--no-stall-check", "stall_check", "enabled",
	  "HOROVOD_STALL_CHECK_DISABLE", K_BOOL, true,
	  "HOROVOD_STALL_CHECK_DISABLE=0 (1, and KHOR_STALL_CHECK_TIME=0)" },
	{ "--mpi-threads-disable", "--no-mpi-threads-disable", "library_options",
	  "mpi_threads_disable", "HOROVOD_MPI_THREADS_DISABLE", K_BOOL, false,
	  "HOROVOD_MPI_THREADS_DISABLE=1 (khor has no MPI)" },
	{ "--num-nccl-streams", NULL, "library_options", "num_nccl_streams",
	  "HOROVOD_NUM_NCCL_STREAMS", K_INT, false, "N  HOROVOD_NUM_NCCL_STREAMS (khor: unused)" },
	{ "--thread-affinity", NULL, "library_options", "thread_affinity", "HOROVOD_THREAD_AFFINITY",
	  K_INT, false, "N  HOROVOD_THREAD_AFFINITY (khor: unused)" },
	{ "--gloo-timeout-seconds", NULL, "library_options", "gloo_timeout_seconds",
	  "HOROVOD_GLOO_TIMEOUT_SECONDS", K_INT, false,
	  "S  HOROVOD_GLOO_TIMEOUT_SECONDS (khor's deadline: --timeout)" },
	{ "--tcp", NULL, NULL, NULL, "NCCL_IB_DISABLE", K_BOOL, false, "NCCL_IB_DISABLE=1" },
	{ "--log-level", NULL, "logging", "level", "KHOR_LOG", K_LEVEL, false,
	  "LEVEL  KHOR_LOG: TRACE, DEBUG, INFO, WARNING, ERROR, FATAL (= error)" },
	{ "--log-with-timestamp", "--log-without-timestamp", "logging", "with_timestamp",
	  "HOROVOD_LOG_HIDE_TIME", K_BOOL, true, "HOROVOD_LOG_HIDE_TIME=0 (1)" },
	{ "--no-log-hide-timestamp", "--log-hide-timestamp", NULL, NULL, "HOROVOD_LOG_HIDE_TIME",
	  K_BOOL, true, "HOROVOD_LOG_HIDE_TIME=0 (1)" },
	{ "--network-interfaces", NULL, NULL, NULL, "KHOR_SOCKET_IFNAME", K_NICS, false,
	  "NIC,...  KHOR_SOCKET_IFNAME==NIC,..., NCCL_SOCKET_IFNAME and\n"
	  "                       HOROVOD_GLOO_IFACE (the first); also --network-interface" },
};
#define NKNOBS (sizeof(knobs) / sizeof(knobs[0]))

struct tuning {
	char *raw[NKNOBS]; /* as given (malloc'd); NULL: not given */
	bool cli[NKNOBS];  /* given on the command line: the file does not change it */
	char *owned[NKNOBS * 3];
	size_t nowned;
	const char *config_file;
};

/* The knob a flag names, and whether it is the negation; NULL when none. */
static const struct knob *knob_of_flag(const char *name, bool *neg_out)
{
	if (strcmp(name, "--network-interface") == 0)
		name = "--network-interfaces"; /* horovodrun's older spelling, still taken */
	for (size_t i = 0; i < NKNOBS; i++) {
		if (strcmp(name, knobs[i].flag) == 0 ||
		    (knobs[i].noflag != NULL && strcmp(name, knobs[i].noflag) == 0)) {
			*neg_out = strcmp(name, knobs[i].flag) != 0;
			return &knobs[i];
		}
	}
	return NULL;
}

bool tuning_knows(const char *name, bool *takes_value_out)
{
	bool neg;
	const struct knob *k = knob_of_flag(name, &neg);

	if (strcmp(name, "--config-file") == 0) {
		*takes_value_out = true;
		return true;
	}
	if (k == NULL)
		return false;
	*takes_value_out = k->kind != K_BOOL;
	return true;
}

static struct tuning *tuning_of(struct opts *o)
{
	if (o->tune == NULL)
		o->tune = calloc(1, sizeof(*o->tune));
	return o->tune;
}

/* YAML 1.1's booleans, as PyYAML reads them, and the 1 and 0 horovodrun's int() takes. */
static int parse_bool(const char *v)
{
	static const char *const yes[] = { "true", "yes", "on", "1", "y" };
	static const char *const no[] = { "false", "no", "off", "0", "n" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(v, yes[i]) == 0)
			return 1;
		if (strcasecmp(v, no[i]) == 0)
			return 0;
	}
	return -1;
}

/*
 * The value var gets from raw, into out; false with what the knob wants in why. Numbers
 * must be >= 0 (config_parser.validate_config_args).
 */
static bool knob_value(const struct knob *k, const char *raw, char *out, size_t outlen,
                       char *why, size_t whylen)
{
	int64_t v;
	double d;
	char *end;

	switch (k->kind) {
	case K_MB:
		if (!kparse_i64(raw, &v) || v < 0 || v > (INT64_MAX >> 20))
			break;
		snprintf(out, outlen, "%lld", (long long)(v << 20));
		return true;
	case K_INT:
		if (!kparse_i64(raw, &v) || v < 0)
			break;
		snprintf(out, outlen, "%lld", (long long)v);
		return true;
	case K_FLOAT:
	case K_NOISE:
		d = strtod(raw, &end);
		if (end == raw || *end != '\0' || !isfinite(d) || d < 0 ||
		    (k->kind == K_NOISE && d > 1))
			break;
		snprintf(out, outlen, "%s", raw);
		return true;
	case K_BOOL: {
		int b = parse_bool(raw);

		if (b < 0)
			break;
		snprintf(out, outlen, "%d", k->invert ? !b : b);
		return true;
	}
	case K_LEVEL: {
		static const char *const hvd[] = { "trace", "debug", "info", "warning", "warn",
			                           "error", "fatal" };
		static const char *const mine[] = { "trace", "debug", "info", "warn", "warn",
			                            "error", "error" };

		for (size_t i = 0; i < sizeof(hvd) / sizeof(hvd[0]); i++) {
			if (strcasecmp(raw, hvd[i]) == 0) {
				snprintf(out, outlen, "%s", mine[i]);
				return true;
			}
		}
		break;
	}
	case K_STR:
	case K_NICS:
		if (raw[0] == '\0' || (k->kind == K_NICS && strpbrk(raw, " \t=^/") != NULL))
			break;
		snprintf(out, outlen, "%s", raw);
		return true;
	}
	static const char *const wants[] = {
		[K_MB] = "a whole number of MB >= 0", [K_INT] = "a whole number >= 0",
		[K_FLOAT] = "a number >= 0", [K_NOISE] = "a number from 0 to 1",
		[K_BOOL] = "true or false", [K_STR] = "a file name",
		[K_LEVEL] = "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL",
		[K_NICS] = "interface names separated by commas",
	};
	snprintf(why, whylen, "wants %s, not '%s'", wants[k->kind], raw);
	return false;
}

bool tuning_set_flag(struct opts *o, const char *name, const char *val, char *why,
                     size_t whylen)
{
	struct tuning *t = tuning_of(o);
	bool neg = false;
	const struct knob *k = knob_of_flag(name, &neg);
	char out[512], w[600];
	size_t i;

	if (t == NULL) {
		snprintf(why, whylen, "out of memory");
		return false;
	}
	if (strcmp(name, "--config-file") == 0) {
		t->config_file = val;
		return true;
	}
	if (k == NULL) {
		snprintf(why, whylen, "unknown option '%s'", name);
		return false;
	}
	i = (size_t)(k - knobs);
	if (k->kind == K_BOOL)
		val = neg ? "false" : "true";
	if (!knob_value(k, val, out, sizeof(out), w, sizeof(w))) {
		snprintf(why, whylen, "%s %s", name, w);
		return false;
	}
	free(t->raw[i]);
	t->raw[i] = strdup(val);
	t->cli[i] = true;
	if (t->raw[i] == NULL) {
		snprintf(why, whylen, "out of memory");
		return false;
	}
	return true;
}

struct file_ctx {
	struct tuning *t;
	const char *path;
};

/* One scalar of --config-file: a known key, a value it takes, or the line is an error. */
static bool file_scalar_why(struct tuning *t, const char *section, const char *key,
                            const char *value, char *err, size_t errlen)
{
	char out[512], why[600];
	bool known_section = false;

	if (section == NULL) {
		if (strcmp(key, "controller") == 0) {
			if (value == NULL || strcasecmp(value, "gloo") == 0)
				return true;
			snprintf(err, errlen, "controller: %s: khor has no such controller (%s)",
			         value, strcasecmp(value, "mpi") == 0
			                        ? "khorrun starts the ranks itself, without MPI; drop the "
			                          "line or write gloo"
			                        : "gloo is the one horovodrun name khorrun takes");
			return false;
		}
		for (size_t i = 0; i < NKNOBS; i++)
			known_section = known_section ||
			                (knobs[i].section != NULL && strcmp(knobs[i].section, key) == 0);
		if (!known_section) {
			snprintf(err, errlen, "unknown key '%s' (horovodrun's are controller, params, "
			         "autotune, timeline, stall_check, library_options, logging)", key);
			return false;
		}
		if (value != NULL) {
			snprintf(err, errlen, "'%s' is a section: its settings go on the lines under it, "
			         "indented", key);
			return false;
		}
		return true;
	}
	for (size_t i = 0; i < NKNOBS; i++) {
		const struct knob *k = &knobs[i];

		if (k->section == NULL || strcmp(k->section, section) != 0 || strcmp(k->key, key) != 0)
			continue;
		if (!knob_value(k, value, out, sizeof(out), why, sizeof(why))) {
			snprintf(err, errlen, "%s.%s %s", section, key, why);
			return false;
		}
		if (t->cli[i])
			return true; /* the command line wins */
		free(t->raw[i]);
		t->raw[i] = strdup(value);
		return t->raw[i] != NULL || (snprintf(err, errlen, "out of memory"), false);
	}
	snprintf(err, errlen, "unknown key '%s' in section '%s'", key, section);
	return false;
}

/* Appends "VAR=value" (owned by t) to o->xvars, which has room. */
static bool add_var(struct opts *o, struct tuning *t, const char *var, const char *value)
{
	char *e;

	if (asprintf(&e, "%s=%s", var, value) < 0)
		return false;
	t->owned[t->nowned++] = e;
	o->xvars[o->nxvars++] = e;
	return true;
}

/* file_scalar_why, its error named with the file and line as yaml.c names its own. */
static bool file_scalar(void *arg, const char *section, const char *key, const char *value,
                        int line, char *err, size_t errlen)
{
	struct file_ctx *c = arg;
	char why[900];

	if (file_scalar_why(c->t, section, key, value, why, sizeof(why)))
		return true;
	snprintf(err, errlen, "%s:%d: %s", c->path, line, why);
	return false;
}

bool tuning_finish(struct opts *o)
{
	struct tuning *t = o->tune;
	const char **x;
	char out[512], why[600], err[1200];

	if (t == NULL)
		return true;
	if (t->config_file != NULL) {
		struct file_ctx c = { t, t->config_file };

		if (!yaml_read(t->config_file, file_scalar, &c, err, sizeof(err))) {
			say("--config-file %s", err);
			return false;
		}
	}
	x = realloc(o->xvars, ((size_t)o->nxvars + NKNOBS * 3 + 1) * sizeof(*x));
	if (x == NULL) {
		say("out of memory");
		return false;
	}
	o->xvars = x;
	for (size_t i = 0; i < NKNOBS; i++) {
		const struct knob *k = &knobs[i];

		if (t->raw[i] == NULL)
			continue;
		/* Checked when it was set; a value that fails here would be a bug. */
		if (!knob_value(k, t->raw[i], out, sizeof(out), why, sizeof(why)) ||
		    (strcmp(k->flag, "--tcp") == 0 && strcmp(out, "1") != 0))
			continue;
		if (k->kind == K_NICS) {
			char first[256];
			char excl[520];

			snprintf(first, sizeof(first), "%.*s", (int)strcspn(out, ","), out);
			snprintf(excl, sizeof(excl), "=%s", out);
			if (!add_var(o, t, "KHOR_SOCKET_IFNAME", excl) ||
			    !add_var(o, t, "NCCL_SOCKET_IFNAME", out) ||
			    !add_var(o, t, "HOROVOD_GLOO_IFACE", first))
				goto oom;
			continue;
		}
		if (!add_var(o, t, k->var, out))
			goto oom;
		if (strcmp(k->var, "HOROVOD_STALL_CHECK_DISABLE") == 0 && strcmp(out, "1") == 0 &&
		    !add_var(o, t, "KHOR_STALL_CHECK_TIME", "0"))
			goto oom;
	}
	return true;
oom:
	say("out of memory");
	return false;
}

void tuning_usage(FILE *f)
{
	for (size_t i = 0; i < NKNOBS; i++) {
		char names[96];
		const struct knob *k = &knobs[i];

		if (k->noflag != NULL)
			snprintf(names, sizeof(names), "%s, %s", k->flag, k->noflag);
		else
			snprintf(names, sizeof(names), "%s", k->flag);
		if (strlen(names) > 20)
			fprintf(f, "  %s\n                       %s\n", names, k->help);
		else
			fprintf(f, "  %-20s %s\n", names, k->help);
	}
}

void tuning_free(struct opts *o)
{
	struct tuning *t = o->tune;

	if (t == NULL)
		return;
	for (size_t i = 0; i < NKNOBS; i++)
		free(t->raw[i]);
	for (size_t i = 0; i < t->nowned; i++)
		free(t->owned[i]);
	free(t);
	o->tune = NULL;
}
