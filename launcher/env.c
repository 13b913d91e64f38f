/*
 * env.c -- the ranks' environment. khorrun's own variables must win over the shell's (a
 * stale KHOR_RANK would break the job), and the per-rank entries are buffers rewritten in
 * place, so starting N ranks builds the vector once, not N times.
 */
#include "env.h"

#include "base/err.h"
#include "base/parse.h"
#include "runtime/config.h"
#include "say.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

/* Does the "NAME=value" entry have the same NAME as the "NAME=..." string `def`? */
static bool same_name(const char *entry, const char *def)
{
	size_t n = strcspn(def, "=");

	return strncmp(entry, def, n) == 0 && entry[n] == '=';
}

static bool env_has(char **env, size_t n, const char *def)
{
	for (size_t i = 0; i < n; i++) {
		if (same_name(env[i], def))
			return true;
	}
	return false;
}

const char *const env_id_prefixes[NPREFIXES] = { "KHOR_", "HOROVOD_" };

/*
 * The variables that stay on their own host: a rank on another host keeps what its login
 * there set, and gets every other variable of khorrun's environment (as horovodrun's ranks
 * get its whole environment, less env.py's IGNORE_REGEXES). Each names this host, this
 * login session or this terminal, and would be wrong, or harmful, elsewhere:
 *   HOSTNAME                the other host has its own name
 *   HOME USER LOGNAME SHELL MAIL  the login there (ssh may log in as another user, whose
 *                           home and shell differ)
 *   SSH_*                   this session's ssh (SSH_CLIENT, SSH_CONNECTION, SSH_TTY,
 *                           SSH_AUTH_SOCK: a socket path on this host)
 *   DISPLAY XAUTHORITY WAYLAND_DISPLAY  this host's display
 *   TERM TERMCAP COLORTERM TMUX TMUX_PANE STY WINDOWID  this terminal: the ranks there
 *                           have none (ssh -T)
 *   OLDPWD SHLVL _          the launching shell's own bookkeeping
 *   XDG_*                   this login's session (XDG_RUNTIME_DIR=/run/user/UID exists
 *                           only while the session does, XDG_SESSION_ID, ...)
 *   DBUS_SESSION_BUS_ADDRESS  a socket of this session
 *   KRB5CCNAME              a credential cache file on this host
 *   BASH_FUNC_*             exported shell functions (Horovod drops them too)
 *   *CUDA_VISIBLE_DEVICES   this host's GPUs (Horovod drops it too)
 * PWD is forwarded: the ranks run in khorrun's working directory.
 */
static const char *const host_local_names[] = {
	"HOSTNAME", "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "DISPLAY", "XAUTHORITY",
	"WAYLAND_DISPLAY", "TERM", "TERMCAP", "COLORTERM", "TMUX", "TMUX_PANE", "STY",
	"WINDOWID", "OLDPWD", "SHLVL", "_", "DBUS_SESSION_BUS_ADDRESS", "KRB5CCNAME",
};
static const char *const host_local_prefixes[] = { "SSH_", "XDG_", "BASH_FUNC_" };

bool env_host_local(const char *entry)
{
	size_t n = strcspn(entry, "=");
	static const char cvd[] = "CUDA_VISIBLE_DEVICES";

	for (size_t i = 0; i < sizeof(host_local_names) / sizeof(host_local_names[0]); i++) {
		if (strlen(host_local_names[i]) == n && strncmp(entry, host_local_names[i], n) == 0)
			return true;
	}
	for (size_t i = 0; i < sizeof(host_local_prefixes) / sizeof(host_local_prefixes[0]); i++) {
		if (strncmp(entry, host_local_prefixes[i], strlen(host_local_prefixes[i])) == 0)
			return true;
	}
	return n >= sizeof(cvd) - 1 && strncmp(entry + n - (sizeof(cvd) - 1), cvd, sizeof(cvd) - 1) == 0;
}

void env_fill_slots(char (*slots)[SLOT_LEN], const struct rank *rk)
{
	for (size_t p = 0; p < NPREFIXES; p++) {
		char(*s)[SLOT_LEN] = slots + SLOTS_PER_PREFIX * p;
		const char *pre = env_id_prefixes[p];

		snprintf(s[0], SLOT_LEN, "%sRANK=%d", pre, rk->rank);
		snprintf(s[1], SLOT_LEN, "%sLOCAL_RANK=%d", pre, rk->lrank);
		snprintf(s[2], SLOT_LEN, "%sLOCAL_SIZE=%d", pre, rk->lsize);
		snprintf(s[3], SLOT_LEN, "%sCROSS_RANK=%d", pre, rk->xrank);
		snprintf(s[4], SLOT_LEN, "%sCROSS_SIZE=%d", pre, rk->xsize);
	}
	if (rk->worker != NULL)
		snprintf(slots[NSLOTS - 1], SLOT_LEN, "KHOR_WORKER_ID=%s", rk->worker);
	else
		slots[NSLOTS - 1][0] = '\0';
}

bool env_add_fixed(char **fixed, size_t *nfixed, const char *fmt, ...)
{
	va_list ap;
	int rc;

	if (*nfixed >= MAX_FIXED)
		return false;
	va_start(ap, fmt);
	rc = vasprintf(&fixed[*nfixed], fmt, ap);
	va_end(ap);
	if (rc < 0)
		return false; /* vasprintf leaves the pointer undefined; it is not counted */
	(*nfixed)++;
	return true;
}

/*
 * The host name the ranks go by, for HOROVOD_HOSTNAME: KHOR_HOSTNAME as the ranks will see
 * it (the last -x, else khorrun's environment; empty means unset), else gethostname(), which
 * is what runtime/config.c groups ranks into hosts by.
 */
const char *env_rank_value(const struct opts *o, const char *name)
{
	size_t n = strlen(name);

	for (int i = o->nxvars - 1; i >= 0; i--) {
		if (strncmp(o->xvars[i], name, n) == 0 && o->xvars[i][n] == '=')
			return o->xvars[i] + n + 1;
	}
	return getenv(name);
}

void env_rank_hostname(const struct opts *o, char *out, size_t len)
{
	const char *v = env_rank_value(o, "KHOR_HOSTNAME");

	if (v != NULL && *v != '\0') {
		kstrlcpy(out, v, len);
		return;
	}
	memset(out, 0, len);
	if (gethostname(out, len - 1) != 0)
		kstrlcpy(out, "localhost", len);
}

bool env_heartbeat(const struct opts *o, int64_t *timeout_ms, int64_t *interval_ms)
{
	static const char *const names[2] = { "KHOR_HEARTBEAT_TIMEOUT", "KHOR_HEARTBEAT_INTERVAL" };
	int64_t *out[2] = { timeout_ms, interval_ms };

	for (int i = 0; i < 2; i++) {
		const char *v = env_rank_value(o, names[i]);
		if (v == NULL || *v == '\0')
			v = config_default(names[i]);
		if (v == NULL || !kparse_duration_ms(v, out[i])) {
			say("%s='%s': expected a duration such as 10s or 500ms (-1: off)", names[i],
			    v != NULL ? v : "");
			return false;
		}
	}
	if (*interval_ms <= 0) {
		say("KHOR_HEARTBEAT_INTERVAL must be positive");
		return false;
	}
	/* As runtime/config.c does: at least five beats in a timeout. */
	if (*timeout_ms > 0 && *interval_ms > *timeout_ms / 5)
		*interval_ms = *timeout_ms / 5 > 0 ? *timeout_ms / 5 : 1;
	return true;
}

/*
 * The ranks' environment: khorrun's own, under the -x variables, under the launcher's
 * KHOR_* and HOROVOD_* variables (which must win, or a stale KHOR_RANK in the shell would
 * break the job). Entries are added highest priority first and a name already present is
 * skipped. slots are the NSLOTS buffers the caller rewrites before each spawn.
 */
char **env_build(const struct opts *o, char **fixed, size_t nfixed,
                 char (*slots)[SLOT_LEN])
{
	size_t nenv = 0, n = 0;
	char **env;

	while (environ != NULL && environ[nenv] != NULL)
		nenv++;
	env = calloc(nfixed + NSLOTS + (size_t)o->nxvars + nenv + 2, sizeof(*env));
	if (env == NULL)
		return NULL;
	for (size_t i = 0; i < NSLOTS; i++) {
		if (slots[i][0] != '\0')
			env[n++] = slots[i];
	}
	for (size_t i = 0; i < nfixed; i++)
		env[n++] = fixed[i];
	for (int i = o->nxvars - 1; i >= 0; i--) {
		if (!env_has(env, n, o->xvars[i]))
			env[n++] = (char *)o->xvars[i];
	}
	for (size_t i = 0; i < nenv; i++) {
		if (strchr(environ[i], '=') != NULL && !env_has(env, n, environ[i]))
			env[n++] = environ[i];
	}
	/*
	 * Python block-buffers a pipe, so a rank's prints would reach khorrun late and out of
	 * step with the other ranks' (horovodrun sets it for the same reason); the user's own
	 * value wins.
	 */
	if (!env_has(env, n, "PYTHONUNBUFFERED="))
		env[n++] = (char *)"PYTHONUNBUFFERED=1";
	env[n] = NULL;
	return env;
}
