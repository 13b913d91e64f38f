/*
 * khorrun.c -- the launcher: `khorrun -np N [options] [--] prog args...` starts N ranks of
 * prog on this host.
 *
 * It runs the job's rendezvous store on a thread of its own (runtime/store.h), gives every
 * rank its identity, the store's address, the job id and a fresh job secret through the
 * environment, and then sits in one poll loop that
 *   - copies each rank's stdout and stderr to its own, every line prefixed "[rank] ", whole
 *     lines per write so ranks never interleave inside a line, and
 *   - reads a signalfd for SIGCHLD, SIGINT, SIGTERM and SIGHUP.
 *
 * Stopping. The first rank that exits non-zero or dies of a signal is "the first failure":
 * khorrun signals every other rank's process group (SIGTERM, then SIGKILL after --grace),
 * drains what they still print, names that rank last, and exits with its status. The ranks
 * that die afterwards mostly die *because* a peer vanished; naming the first one points the
 * user at the root cause. A Ctrl-C (or SIGTERM/SIGHUP) is forwarded as that signal first, so
 * Python ranks get their KeyboardInterrupt and can clean up, then escalates the same way;
 * a second one kills at once.
 *
 * No leftovers. Each rank leads its own process group, so stopping a rank stops what it
 * forked. khorrun is also a child subreaper: whatever a rank leaves running when it exits is
 * re-parented to khorrun, where it is found (in /proc), stopped and reaped before khorrun
 * exits. Every wait after the ranks are told to stop is bounded by --grace.
 *
 * Launching on several hosts (hostfile, -H, ssh, Slurm) comes later; -H is refused for now.
 */
#include "base/auth.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/parse.h"
#include "khor.h"
#include "runtime/config.h"
#include "runtime/cpubind.h"
#include "runtime/store.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/*
 * Per stream line buffer. A line longer than this is cut into pieces of this size, each
 * printed as its own prefixed line: lossless, and it bounds memory at 2 buffers per rank.
 */
#define LINE_BUF (64 * 1024)
/* Lines gathered into one writev; two iovecs each keeps us well under IOV_MAX (1024). */
#define WRITE_BATCH 256
/* After SIGKILL the kernel needs a moment to tear processes down; this bounds that wait. */
#define KILL_WAIT_MS 2000
#define MAX_RANKS 65536
#define MAX_ORPHANS 1024
#define DEFAULT_GRACE_MS 3000

enum { OUT_STDOUT = 0, OUT_STDERR = 1 };

/* Why the job is ending early; the first cause wins and decides the exit status. */
enum cause { CAUSE_NONE = 0, CAUSE_FAILURE, CAUSE_SIGNAL, CAUSE_SPAWN };

struct opts {
	int np;
	const char *bind_host;
	uint16_t store_port;
	const char **xvars; /* "VAR=VALUE" from -x, in command-line order */
	int nxvars;
	const char *timeout;
	int64_t grace_ms;
	bool no_prefix;
	const char *job_id;
	cpubind_mode bind;
	char **prog_argv; /* NULL-terminated, points into argv */
};

struct stream {
	int fd; /* read end of the rank's pipe; -1 once closed */
	int which; /* OUT_STDOUT or OUT_STDERR */
	size_t len;
	char *buf; /* LINE_BUF bytes */
};

struct rank {
	pid_t pid; /* also its process group id */
	bool running; /* spawned and not yet reaped */
	int wstatus;
	char prefix[24];
	size_t prefix_len;
	struct stream out[2];
};

struct job {
	struct opts o;
	struct rank *ranks;
	int nstarted;
	int nrunning;
	int nopen; /* streams not yet at EOF */
	int sfd; /* signalfd */
	bool out_dead[2]; /* our stdout/stderr is gone (EPIPE): drop output, keep running */

	/* Stopping: signals sent in order, --grace apart (KILL_WAIT_MS after SIGKILL). */
	bool stopping;
	int stop_sigs[3];
	int nstop_sigs;
	int stop_step; /* index of the signal sent last */
	kdeadline stop_next;
	bool gave_up; /* stopped waiting after SIGKILL + KILL_WAIT_MS */
	/* Ranks all exited but something they started still holds their pipes open. */
	bool draining;
	kdeadline drain_until;

	enum cause cause;
	int first_fail; /* rank index, for CAUSE_FAILURE */
	int intr_sig; /* for CAUSE_SIGNAL */
	int intr_nrunning; /* ranks running when the signal came */
	int spawn_exit; /* for CAUSE_SPAWN: 126, 127 or 1 */
};

/* khorrun's own messages: one write per line, so they never split a rank's line. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	n = snprintf(line, sizeof(line), "khorrun: ");
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* stderr is gone; there is nowhere left to say anything. */
	}
}

static const char *sig_name(int sig, char *buf, size_t len)
{
	const char *abbrev = sigabbrev_np(sig);

	if (abbrev != NULL)
		snprintf(buf, len, "SIG%s", abbrev);
	else
		snprintf(buf, len, "signal %d", sig);
	return buf;
}

/* "exited with status 3" / "killed by signal SIGKILL (9)" */
static void describe_status(int wstatus, char *buf, size_t len)
{
	char name[32];

	if (WIFEXITED(wstatus))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(wstatus));
	else if (WIFSIGNALED(wstatus))
		snprintf(buf, len, "killed by signal %s (%d)%s",
		         sig_name(WTERMSIG(wstatus), name, sizeof(name)), WTERMSIG(wstatus),
		         WCOREDUMP(wstatus) ? " (core dumped)" : "");
	else
		snprintf(buf, len, "ended with wait status 0x%x", (unsigned)wstatus);
}

static int status_to_exit(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 1;
}

/* ---- command line ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: khorrun -np N [options] [--] program [args...]\n"
	        "\n"
	        "Starts N ranks of program on this host with a rendezvous store, prefixes their\n"
	        "output with \"[rank] \", and stops them all when one fails.\n"
	        "\n"
	        "options:\n"
	        "  -np N, -n N          number of ranks to start (required)\n"
	        "  -x VAR=VALUE         set VAR in every rank's environment (repeatable)\n"
	        "  --timeout DURATION   set KHOR_TIMEOUT in the ranks (30s, 500ms, 2m, inf)\n"
	        "  --grace DURATION     time between SIGTERM and SIGKILL when stopping ranks\n"
	        "                       (default 3s)\n"
	        "  --bind-store HOST    address the rendezvous store listens on (default 127.0.0.1)\n"
	        "  --store-port PORT    its port (default 0: any free port)\n"
	        "  --job-id ID          job id (default khor-<8 random hex digits>)\n"
	        "  --no-prefix          do not prefix output lines with \"[rank] \"\n"
	        "  --bind MODE          cores: pin each rank to its own equal block of khorrun's\n"
	        "                       CPUs (hardware threads of a core together), or to CPU\n"
	        "                       r mod CPUs when ranks outnumber them; none (default)\n"
	        "  -H HOST:SLOTS,...    start ranks on other hosts (not supported yet)\n"
	        "  -h, --help           show this help\n"
	        "  --help-env           list the KHOR_* variables the ranks read\n"
	        "  --version            print the version\n"
	        "\n"
	        "Each rank gets KHOR_RANK, KHOR_SIZE, KHOR_LOCAL_RANK, KHOR_LOCAL_SIZE,\n"
	        "KHOR_CROSS_RANK, KHOR_CROSS_SIZE, KHOR_LOCAL_CPUS, KHOR_STORE_ADDR, KHOR_SECRET,\n"
	        "KHOR_JOB_ID and KHOR_LAUNCHER=khorrun on top of khorrun's own environment, and\n"
	        "for Horovod scripts HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK,\n"
	        "HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE (the same values)\n"
	        "and HOROVOD_HOSTNAME (KHOR_HOSTNAME as the ranks see it, else this host's name).\n"
	        "Ranks read stdin from /dev/null. Exit status: the first failed rank's\n"
	        "(128+signal if killed), 130/143 when interrupted by SIGINT/SIGTERM, 2 for a bad\n"
	        "command line, 127 when the program is not found, 126 when it cannot be run.\n");
}

/* The variables every rank reads (runtime/config.c's table, as in the README). */
static void print_env_help(void)
{
	printf("Variables khor reads in every rank (set them in khorrun's environment or with\n"
	       "-x VAR=VALUE):\n\n");
	for (int i = 0; i < config_nvars; i++)
		printf("  %-20s %-8s %s\n", config_vars[i].name,
		       config_vars[i].def != NULL ? config_vars[i].def : "-", config_vars[i].help);
	printf("\nDurations take ms, s, m suffixes; sizes take K, M, G (powers of 1024).\n");
}

static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	say("%s", msg);
	usage(stderr);
	return 2;
}

static bool valid_job_id(const char *s)
{
	size_t n = strlen(s);

	/* It becomes a store key prefix, so keep it short and free of '/'. */
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
			return false;
	}
	return true;
}

static bool valid_env_name(const char *s, size_t n)
{
	if (n == 0 || isdigit((unsigned char)s[0]))
		return false;
	for (size_t i = 0; i < n; i++) {
		if (!isalnum((unsigned char)s[i]) && s[i] != '_')
			return false;
	}
	return true;
}

/*
 * Parses argv into o. Returns -1 to go on, or the exit status to exit with (0 after --help
 * or --version, 2 after a bad command line, which it has explained on stderr).
 */
static int parse_args(int argc, char **argv, struct opts *o)
{
	int i;

	o->np = 0;
	o->bind_host = "127.0.0.1";
	o->store_port = 0;
	o->nxvars = 0;
	o->timeout = NULL;
	o->grace_ms = DEFAULT_GRACE_MS;
	o->no_prefix = false;
	o->job_id = NULL;
	o->bind = CPUBIND_NONE;
	o->prog_argv = NULL;
	o->xvars = calloc((size_t)argc, sizeof(*o->xvars));
	if (o->xvars == NULL) {
		say("out of memory");
		return 1;
	}

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		char name[64];
		const char *eq;

		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (a[0] != '-' || a[1] == '\0')
			break;
		/* "--flag=value" is split here; single-dash flags always take the next word. */
		eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
		if (eq != NULL) {
			if ((size_t)(eq - a) >= sizeof(name))
				return bad_usage("unknown option '%s'", a);
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = '\0';
			val = eq + 1;
		} else {
			kstrlcpy(name, a, sizeof(name));
		}

		if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
			usage(stdout);
			return 0;
		}
		if (strcmp(name, "--help-env") == 0) {
			print_env_help();
			return 0;
		}
		if (strcmp(name, "--version") == 0) {
			printf("khorrun (khor) %d.%d.%d\n", KHOR_VERSION_MAJOR, KHOR_VERSION_MINOR,
			       KHOR_VERSION_PATCH);
			return 0;
		}
		if (strcmp(name, "-H") == 0 || strcmp(name, "--host") == 0 ||
		    strcmp(name, "--hostfile") == 0) {
			say("%s: starting ranks on other hosts is not supported yet; "
			    "run khorrun on each host, or start ranks with torchrun-style or Slurm "
			    "variables", name);
			return 2;
		}
		if (strcmp(name, "--no-prefix") == 0) {
			if (val != NULL)
				return bad_usage("--no-prefix takes no value");
			o->no_prefix = true;
			continue;
		}

		/* Every other option takes a value. */
		if (strcmp(name, "-np") != 0 && strcmp(name, "-n") != 0 &&
		    strcmp(name, "--np") != 0 && strcmp(name, "-x") != 0 &&
		    strcmp(name, "--timeout") != 0 && strcmp(name, "--grace") != 0 &&
		    strcmp(name, "--bind-store") != 0 && strcmp(name, "--store-port") != 0 &&
		    strcmp(name, "--job-id") != 0 && strcmp(name, "--bind") != 0)
			return bad_usage("unknown option '%s'", a);
		if (val == NULL) {
			if (i + 1 >= argc)
				return bad_usage("option '%s' needs a value", name);
			val = argv[++i];
		}

		if (strcmp(name, "-np") == 0 || strcmp(name, "-n") == 0 ||
		    strcmp(name, "--np") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 1 || v > MAX_RANKS)
				return bad_usage("%s wants a number of ranks from 1 to %d, not '%s'",
				                 name, MAX_RANKS, val);
			o->np = (int)v;
		} else if (strcmp(name, "-x") == 0) {
			const char *e = strchr(val, '=');
			size_t n = e != NULL ? (size_t)(e - val) : strlen(val);

			if (!valid_env_name(val, n))
				return bad_usage("-x wants VAR=VALUE with VAR a variable name, not '%s'",
				                 val);
			/*
			 * "-x VAR" alone (mpirun's way to export a variable) is accepted: the
			 * ranks inherit khorrun's whole environment anyway.
			 */
			if (e != NULL)
				o->xvars[o->nxvars++] = val;
		} else if (strcmp(name, "--timeout") == 0) {
			int64_t ms;

			if (!kparse_duration_ms(val, &ms))
				return bad_usage("--timeout wants a duration like 30s, 500ms, 2m or inf, "
				                 "not '%s'", val);
			o->timeout = val;
		} else if (strcmp(name, "--grace") == 0) {
			/* A grace period without end would let a stuck rank hold khorrun forever. */
			if (!kparse_duration_ms(val, &o->grace_ms) || o->grace_ms < 0)
				return bad_usage("--grace wants a finite duration like 3s or 500ms, "
				                 "not '%s'", val);
		} else if (strcmp(name, "--bind-store") == 0) {
			if (val[0] == '\0')
				return bad_usage("--bind-store wants a host name or address");
			o->bind_host = val;
		} else if (strcmp(name, "--store-port") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 0 || v > 65535)
				return bad_usage("--store-port wants a port from 0 to 65535, not '%s'",
				                 val);
			o->store_port = (uint16_t)v;
		} else if (strcmp(name, "--job-id") == 0) {
			if (!valid_job_id(val))
				return bad_usage("--job-id wants 1 to 64 letters, digits, '-', '_' or "
				                 "'.', not '%s'", val);
			o->job_id = val;
		} else if (strcmp(name, "--bind") == 0) {
			if (!cpubind_parse(val, &o->bind))
				return bad_usage("--bind wants cores or none, not '%s'", val);
		}
	}

	if (i >= argc)
		return bad_usage("no program given");
	if (o->np == 0)
		return bad_usage("-np N is required");
	o->prog_argv = &argv[i];
	return -1;
}

/* ---- finding the program ----------------------------------------------------------------- */

/* 0 if path is a file we may execute; else an errno that says why not. */
static int check_exec(const char *path)
{
	struct stat st;

	if (stat(path, &st) != 0)
		return errno;
	if (S_ISDIR(st.st_mode))
		return EISDIR;
	if (access(path, X_OK) != 0)
		return errno;
	return 0;
}

/*
 * Finds prog the way a shell would, before anything is started, so a typo costs no store
 * and no ranks. Returns 0 with *path_out malloc'd, or a shell's exit status: 127 when not
 * found, 126 when found but not runnable. The reason is already on stderr.
 */
static int resolve_program(const char *prog, char **path_out)
{
	char ebuf[128];
	const char *path_env;
	char *dirs, *save = NULL;
	int denied = 0;
	int rc;

	if (strchr(prog, '/') != NULL) {
		rc = check_exec(prog);
		if (rc == 0) {
			*path_out = strdup(prog);
			return *path_out != NULL ? 0 : 1;
		}
		say("cannot run '%s': %s%s", prog, kerr_errno_str(rc, ebuf, sizeof(ebuf)),
		    rc == EACCES ? " (is it executable? chmod +x it)" : "");
		return rc == ENOENT || rc == ENOTDIR ? 127 : 126;
	}
	if (prog[0] == '\0') {
		say("cannot run '': empty program name");
		return 127;
	}

	path_env = getenv("PATH");
	if (path_env == NULL)
		path_env = "/usr/local/bin:/usr/bin:/bin";
	dirs = strdup(path_env);
	if (dirs == NULL) {
		say("out of memory");
		return 1;
	}
	/*
	 * strtok_r skips empty PATH entries (which mean the current directory); that legacy
	 * meaning is a security trap, and "./prog" says it explicitly.
	 */
	for (char *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
		char *cand;

		if (asprintf(&cand, "%s/%s", d, prog) < 0) {
			free(dirs);
			say("out of memory");
			return 1;
		}
		rc = check_exec(cand);
		if (rc == 0) {
			free(dirs);
			*path_out = cand;
			return 0;
		}
		if (rc == EACCES || rc == EISDIR)
			denied = rc;
		free(cand);
	}
	free(dirs);
	if (denied != 0) {
		say("cannot run '%s': %s (found in PATH, but not as an executable file)", prog,
		    kerr_errno_str(denied, ebuf, sizeof(ebuf)));
		return 126;
	}
	say("cannot run '%s': command not found in PATH (%s)", prog, path_env);
	return 127;
}

/* ---- environment ------------------------------------------------------------------------- */

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

/*
 * Every rank's identity goes out under two prefixes: KHOR_ for khor itself and HOROVOD_ for
 * scripts written for horovodrun, which read HOROVOD_RANK and friends directly.
 */
static const char *const id_prefixes[] = { "KHOR_", "HOROVOD_" };
#define NPREFIXES (sizeof(id_prefixes) / sizeof(id_prefixes[0]))
/* Rank and local rank under each prefix: the entries rewritten before each spawn. */
#define NSLOTS (2 * NPREFIXES)
#define SLOT_LEN 40
/* The entries that are the same in every rank: see main. */
#define MAX_FIXED 24

/*
 * Rank r's slots. Every rank of a khorrun job is on this host, so, as comm.c computes it
 * from host names, its local rank is its rank (and, in main, local size the job's size,
 * cross rank 0 of cross size 1).
 */
static void fill_slots(char (*slots)[SLOT_LEN], int r)
{
	for (size_t p = 0; p < NPREFIXES; p++) {
		snprintf(slots[2 * p], SLOT_LEN, "%sRANK=%d", id_prefixes[p], r);
		snprintf(slots[2 * p + 1], SLOT_LEN, "%sLOCAL_RANK=%d", id_prefixes[p], r);
	}
}

/* Appends one printf-made "NAME=value" to fixed; false when out of memory or room. */
static bool add_fixed(char **fixed, size_t *nfixed, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static bool add_fixed(char **fixed, size_t *nfixed, const char *fmt, ...)
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
static void rank_hostname(const struct opts *o, char *out, size_t len)
{
	const char *v = NULL;
	bool from_x = false;

	for (int i = o->nxvars - 1; i >= 0 && !from_x; i--) {
		if (same_name(o->xvars[i], "KHOR_HOSTNAME=")) {
			v = o->xvars[i] + strlen("KHOR_HOSTNAME=");
			from_x = true;
		}
	}
	if (!from_x)
		v = getenv("KHOR_HOSTNAME");
	if (v != NULL && *v != '\0') {
		kstrlcpy(out, v, len);
		return;
	}
	memset(out, 0, len);
	if (gethostname(out, len - 1) != 0)
		kstrlcpy(out, "localhost", len);
}

/*
 * The ranks' environment: khorrun's own, under the -x variables, under the launcher's
 * KHOR_* and HOROVOD_* variables (which must win, or a stale KHOR_RANK in the shell would
 * break the job). Entries are added highest priority first and a name already present is
 * skipped. slots are the NSLOTS buffers the caller rewrites before each spawn.
 */
static char **build_env(const struct opts *o, char **fixed, size_t nfixed,
                        char (*slots)[SLOT_LEN])
{
	size_t nenv = 0, n = 0;
	char **env;

	while (environ != NULL && environ[nenv] != NULL)
		nenv++;
	env = calloc(nfixed + NSLOTS + (size_t)o->nxvars + nenv + 1, sizeof(*env));
	if (env == NULL)
		return NULL;
	for (size_t i = 0; i < NSLOTS; i++)
		env[n++] = slots[i];
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
	env[n] = NULL;
	return env;
}

/* ---- output ------------------------------------------------------------------------------ */

/* Writes all of iov to our stdout or stderr; on EPIPE and the like drops it from then on. */
static void write_out(struct job *j, int which, struct iovec *iov, int cnt)
{
	int fd = which == OUT_STDOUT ? STDOUT_FILENO : STDERR_FILENO;

	while (cnt > 0 && !j->out_dead[which]) {
		ssize_t w = writev(fd, iov, cnt);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				/* Someone made our stdout non-blocking; wait for room. */
				struct pollfd p = { .fd = fd, .events = POLLOUT };

				(void)poll(&p, 1, 1000);
				continue;
			}
			/* Reader gone: keep the ranks running, as a shell pipeline would not. */
			j->out_dead[which] = true;
			return;
		}
		while (cnt > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
}

/*
 * Prints the complete lines in s->buf with the rank's prefix and keeps the rest. A full
 * buffer without a newline is printed as a line of its own (split, never lost); at EOF a
 * partial last line is printed with a newline added so the next prefix starts a line.
 */
static void stream_emit(struct job *j, struct rank *rk, struct stream *s, bool eof)
{
	static const char nl = '\n';
	struct iovec iov[WRITE_BATCH * 3];
	int cnt = 0;
	size_t pos = 0;

	for (;;) {
		char *line = s->buf + pos;
		size_t left = s->len - pos;
		char *end = memchr(line, '\n', left);
		size_t ll;
		bool add_nl = false;

		if (left == 0)
			break;
		if (end != NULL) {
			ll = (size_t)(end - line) + 1;
		} else if (left == LINE_BUF || eof) {
			ll = left;
			add_nl = true;
		} else {
			break;
		}
		if (rk->prefix_len > 0)
			iov[cnt++] = (struct iovec){ rk->prefix, rk->prefix_len };
		iov[cnt++] = (struct iovec){ line, ll };
		if (add_nl)
			iov[cnt++] = (struct iovec){ (void *)&nl, 1 };
		pos += ll;
		if (cnt > (WRITE_BATCH - 1) * 3) {
			write_out(j, s->which, iov, cnt);
			cnt = 0;
		}
	}
	if (cnt > 0)
		write_out(j, s->which, iov, cnt);
	if (pos > 0) {
		memmove(s->buf, s->buf + pos, s->len - pos);
		s->len -= pos;
	}
}

static void stream_close(struct job *j, struct rank *rk, struct stream *s)
{
	if (s->fd < 0)
		return;
	stream_emit(j, rk, s, true);
	close(s->fd);
	s->fd = -1;
	j->nopen--;
}

/* One read per wakeup and stream, so a chatty rank cannot starve the others. */
static void stream_read(struct job *j, struct rank *rk, struct stream *s)
{
	ssize_t n = read(s->fd, s->buf + s->len, LINE_BUF - s->len);

	if (n > 0) {
		s->len += (size_t)n;
		stream_emit(j, rk, s, false);
	} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		stream_close(j, rk, s);
	}
}

/* ---- processes --------------------------------------------------------------------------- */

static struct rank *rank_of_pid(struct job *j, pid_t pid)
{
	for (int r = 0; r < j->nstarted; r++) {
		if (j->ranks[r].pid == pid)
			return &j->ranks[r];
	}
	return NULL;
}

/*
 * Finds the processes whose parent is khorrun but which are not running ranks: what ranks
 * left behind, re-parented to us because we are a subreaper. The live ones are listed in
 * pids (up to cap) and counted in *live_out. Zombies are counted in the result too: one
 * that died just after our last waitpid must still be reaped, or it would pass to init as
 * a zombie when we exit.
 */
static size_t find_orphans(struct job *j, pid_t *pids, size_t cap, size_t *live_out)
{
	pid_t self = getpid();
	size_t n = 0, live = 0;
	struct dirent *de;
	DIR *d = opendir("/proc");

	if (d == NULL)
		return 0;
	while ((de = readdir(d)) != NULL) {
		char path[300], buf[512], state;
		char *rp;
		int fd, ppid;
		ssize_t len;
		pid_t pid;
		struct rank *rk;

		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		/* The command name is in parentheses and may itself contain ") ". */
		rp = strrchr(buf, ')');
		if (rp == NULL || sscanf(rp + 1, " %c %d", &state, &ppid) != 2)
			continue;
		if (ppid != self)
			continue;
		pid = (pid_t)atoi(de->d_name);
		rk = rank_of_pid(j, pid);
		if (rk != NULL && rk->running)
			continue;
		n++;
		if (state == 'Z')
			continue;
		if (live < cap)
			pids[live] = pid;
		live++;
	}
	closedir(d);
	*live_out = live;
	return n;
}

/*
 * Sends sig to every running rank's process group, and to whatever exited ranks left
 * behind. Ranks are signalled by group so that what they forked stops with them; a rank's
 * group is only used while the rank is unreaped, because once it is reaped its number may
 * be reused by somebody else's process group.
 */
static void signal_all(struct job *j, int sig)
{
	pid_t orphans[MAX_ORPHANS];
	size_t live;

	for (int r = 0; r < j->nstarted; r++) {
		struct rank *rk = &j->ranks[r];

		if (!rk->running)
			continue;
		if (kill(-rk->pid, sig) != 0)
			(void)kill(rk->pid, sig); /* it left its group; still reach the rank */
	}
	(void)find_orphans(j, orphans, MAX_ORPHANS, &live);
	for (size_t i = 0; i < live && i < MAX_ORPHANS; i++)
		(void)kill(orphans[i], sig);
}

static void begin_stop(struct job *j, int first_sig)
{
	j->stopping = true;
	j->nstop_sigs = 0;
	j->stop_sigs[j->nstop_sigs++] = first_sig;
	if (first_sig != SIGTERM && first_sig != SIGKILL)
		j->stop_sigs[j->nstop_sigs++] = SIGTERM;
	if (first_sig != SIGKILL)
		j->stop_sigs[j->nstop_sigs++] = SIGKILL;
	j->stop_step = 0;
	signal_all(j, first_sig);
	j->stop_next = kdeadline_in_ms(first_sig == SIGKILL ? KILL_WAIT_MS : j->o.grace_ms);
}

/* "0, 2, 5" (at most 8 listed) of the ranks still running. */
static void running_list(struct job *j, char *buf, size_t len)
{
	size_t off = 0;
	int shown = 0;

	buf[0] = '\0';
	for (int r = 0; r < j->nstarted && off < len; r++) {
		if (!j->ranks[r].running)
			continue;
		if (shown == 8) {
			snprintf(buf + off, len - off, ", ...");
			return;
		}
		off += (size_t)snprintf(buf + off, len - off, "%s%d", shown > 0 ? ", " : "", r);
		shown++;
	}
}

/* The grace period passed: send the next signal, or stop waiting after SIGKILL. */
static void stop_escalate(struct job *j)
{
	char list[128], name[32], prev[32];
	int sig;

	if (j->stop_step + 1 >= j->nstop_sigs) {
		if (j->nrunning > 0) {
			running_list(j, list, sizeof(list));
			say("rank%s %s did not exit %d ms after SIGKILL (stuck in the kernel?); "
			    "giving up on %s", j->nrunning > 1 ? "s" : "", list, KILL_WAIT_MS,
			    j->nrunning > 1 ? "them" : "it");
		}
		j->gave_up = true;
		return;
	}
	sig = j->stop_sigs[++j->stop_step];
	if (j->nrunning > 0) {
		running_list(j, list, sizeof(list));
		say("rank%s %s still running %lld ms after %s; sending %s",
		    j->nrunning > 1 ? "s" : "", list, (long long)j->o.grace_ms,
		    sig_name(j->stop_sigs[j->stop_step - 1], prev, sizeof(prev)),
		    sig_name(sig, name, sizeof(name)));
	}
	signal_all(j, sig);
	j->stop_next = kdeadline_in_ms(sig == SIGKILL ? KILL_WAIT_MS : j->o.grace_ms);
}

/* Collects every exited child: ranks (the first failure stops the job) and orphans. */
static void reap_children(struct job *j)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		struct rank *rk;

		if (pid <= 0)
			return;
		rk = rank_of_pid(j, pid);
		if (rk == NULL || !rk->running)
			continue; /* something a rank left behind */
		rk->running = false;
		rk->wstatus = st;
		j->nrunning--;
		if (j->cause == CAUSE_NONE && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			j->cause = CAUSE_FAILURE;
			j->first_fail = (int)(rk - j->ranks);
			if (!j->stopping)
				begin_stop(j, SIGTERM);
		}
	}
}

static void on_interrupt(struct job *j, int sig)
{
	char name[32];

	if (j->cause == CAUSE_NONE) {
		j->cause = CAUSE_SIGNAL;
		j->intr_sig = sig;
		j->intr_nrunning = j->nrunning;
	}
	if (!j->stopping) {
		sig_name(sig, name, sizeof(name));
		if (sig == SIGTERM)
			say("%s: stopping %d rank%s (SIGTERM now, SIGKILL after %lld ms; send it again "
			    "to kill now)", name, j->nrunning, j->nrunning == 1 ? "" : "s",
			    (long long)j->o.grace_ms);
		else
			say("%s: stopping %d rank%s (%s now, SIGTERM after %lld ms, SIGKILL after %lld "
			    "ms; send it again to kill now)", name, j->nrunning,
			    j->nrunning == 1 ? "" : "s", name, (long long)j->o.grace_ms,
			    (long long)(2 * j->o.grace_ms));
		begin_stop(j, sig);
		return;
	}
	/* A second interrupt means "now": skip the rest of the grace period. */
	if (j->stop_sigs[j->stop_step] != SIGKILL) {
		say("%s again: killing the ranks now", sig_name(sig, name, sizeof(name)));
		j->stop_step = j->nstop_sigs - 1;
		signal_all(j, SIGKILL);
		j->stop_next = kdeadline_in_ms(KILL_WAIT_MS);
	}
}

static void handle_signals(struct job *j)
{
	struct signalfd_siginfo si[16];
	bool chld = false;

	for (;;) {
		ssize_t n = read(j->sfd, si, sizeof(si));

		if (n <= 0)
			break;
		for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++) {
			if (si[i].ssi_signo == SIGCHLD)
				chld = true;
			else
				on_interrupt(j, (int)si[i].ssi_signo);
		}
	}
	if (chld)
		reap_children(j);
}

static uint64_t ms_left(kdeadline d)
{
	return (uint64_t)kdeadline_left_ms(d, INT_MAX);
}

/*
 * The loop: forward output, reap, stop. It ends when every rank is reaped and every pipe is
 * at EOF, or when, after SIGKILL, the ranks still do not go away.
 */
static void run_loop(struct job *j)
{
	size_t cap = 1 + 2 * (size_t)j->nstarted;
	struct pollfd *pfd = calloc(cap, sizeof(*pfd));
	struct stream **who = calloc(cap, sizeof(*who));
	struct rank **whose = calloc(cap, sizeof(*whose));

	if (pfd == NULL || who == NULL || whose == NULL) {
		say("out of memory while watching the ranks; killing them");
		signal_all(j, SIGKILL);
		goto out;
	}

	while ((j->nrunning > 0 || j->nopen > 0) && !j->gave_up) {
		int timeout = 1000;
		int n = 1;
		int rc;

		/*
		 * Every rank is gone but something they started still holds a pipe open (a
		 * daemon, "sleep &"). Give it the grace period to finish, then stop it.
		 */
		if (j->nrunning == 0 && !j->stopping) {
			if (!j->draining) {
				j->draining = true;
				j->drain_until = kdeadline_in_ms(j->o.grace_ms);
			} else if (kdeadline_passed(j->drain_until)) {
				say("every rank exited, but processes they started still hold their "
				    "output open after %lld ms; stopping them", (long long)j->o.grace_ms);
				begin_stop(j, SIGTERM);
			}
		}
		if (j->stopping && kdeadline_passed(j->stop_next)) {
			stop_escalate(j);
			if (j->gave_up)
				break;
		}
		if (j->stopping && ms_left(j->stop_next) < (uint64_t)timeout)
			timeout = (int)ms_left(j->stop_next);
		if (j->draining && !j->stopping && ms_left(j->drain_until) < (uint64_t)timeout)
			timeout = (int)ms_left(j->drain_until);

		pfd[0] = (struct pollfd){ .fd = j->sfd, .events = POLLIN };
		for (int r = 0; r < j->nstarted; r++) {
			for (int k = 0; k < 2; k++) {
				struct stream *s = &j->ranks[r].out[k];

				if (s->fd < 0)
					continue;
				pfd[n] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
				who[n] = s;
				whose[n] = &j->ranks[r];
				n++;
			}
		}
		rc = poll(pfd, (nfds_t)n, timeout);
		if (rc < 0 && errno != EINTR) {
			char ebuf[128];

			say("poll failed: %s; killing the ranks", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
			signal_all(j, SIGKILL);
			break;
		}
		if (rc <= 0)
			continue;
		/* Output first, so what a rank printed just before it failed is not cut off. */
		for (int i = 1; i < n; i++) {
			if (pfd[i].revents != 0)
				stream_read(j, whose[i], who[i]);
		}
		if (pfd[0].revents != 0)
			handle_signals(j);
	}

out:
	/* Whatever is still open here is abandoned: print what we have of it. */
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++)
			stream_close(j, &j->ranks[r], &j->ranks[r].out[k]);
	}
	free(whose);
	free(who);
	free(pfd);
}

/*
 * After the ranks: processes they left behind that closed their output (so the loop did not
 * wait for them) are still re-parented to us. Stop them with SIGTERM, then SIGKILL, each
 * bounded, and reap them, so khorrun leaves nothing running.
 */
static void sweep_leftovers(struct job *j)
{
	pid_t pids[MAX_ORPHANS];
	size_t n, live;

	reap_children(j);
	n = find_orphans(j, pids, MAX_ORPHANS, &live);
	if (live > 0)
		say("the ranks left %zu process%s running (pid %d%s); stopping %s", live,
		    live == 1 ? "" : "es", (int)pids[0], live > 1 ? ", ..." : "",
		    live == 1 ? "it" : "them");
	for (int phase = 0; phase < 2 && n > 0; phase++) {
		int sig = phase == 0 ? SIGTERM : SIGKILL;
		kdeadline dl = kdeadline_in_ms(phase == 0 ? j->o.grace_ms : KILL_WAIT_MS);

		for (size_t i = 0; i < live && i < MAX_ORPHANS; i++)
			(void)kill(pids[i], sig);
		while (n > 0 && !kdeadline_passed(dl)) {
			struct pollfd p = { .fd = j->sfd, .events = POLLIN };
			struct signalfd_siginfo si[16];

			/* SIGCHLD wakes us; an interrupt here needs nothing we are not doing. */
			(void)poll(&p, 1, kdeadline_left_ms(dl, 50));
			while (read(j->sfd, si, sizeof(si)) > 0) {
			}
			reap_children(j);
			n = find_orphans(j, pids, MAX_ORPHANS, &live);
			/* Grandchildren re-parented during the SIGKILL phase get theirs too. */
			if (sig == SIGKILL) {
				for (size_t i = 0; i < live && i < MAX_ORPHANS; i++)
					(void)kill(pids[i], SIGKILL);
			}
		}
	}
	if (n > 0)
		say("%zu process%s left by the ranks did not exit after SIGKILL (pid %d%s)", n,
		    n == 1 ? "" : "es", live > 0 ? (int)pids[0] : -1, n > 1 ? ", ..." : "");
}

/* ---- setup ------------------------------------------------------------------------------- */

/* Make sure fds 0-2 exist, or our first pipe would become somebody's "stdout". */
static bool ensure_std_fds(void)
{
	for (int fd = 0; fd < 3; fd++) {
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
			int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);

			if (nfd < 0)
				return false;
			if (nfd != fd) {
				close(nfd);
				return false;
			}
		}
	}
	return true;
}

/*
 * Each rank costs two pipe ends here and a store connection; raise the soft limit toward
 * the hard one when N is large rather than fail halfway through the start.
 */
static bool ensure_fd_limit(int np)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)np * 3 + 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
		return true;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
		say("-np %d needs about %llu file descriptors, but the hard limit is %llu; "
		    "raise it (ulimit -Hn, /etc/security/limits.conf) or start fewer ranks",
		    np, (unsigned long long)need, (unsigned long long)rl.rlim_max);
		return false;
	}
	rl.rlim_cur = need;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
		say("cannot raise the open file limit to %llu for -np %d; raise it with ulimit -n",
		    (unsigned long long)need, np);
		return false;
	}
	return true;
}

static int spawn_exit_code(int err)
{
	if (err == ENOENT || err == ENOTDIR)
		return 127;
	if (err == EACCES || err == ENOEXEC || err == EISDIR || err == EPERM)
		return 126;
	return 1;
}

/* Starts rank r with its stdout and stderr on fresh pipes. Returns 0 or an errno. */
static int spawn_rank(struct job *j, int r, const char *path, char **env,
                      const posix_spawnattr_t *attr, int devnull)
{
	struct rank *rk = &j->ranks[r];
	posix_spawn_file_actions_t fa;
	int p[2][2] = { { -1, -1 }, { -1, -1 } };
	int err;

	for (int k = 0; k < 2; k++) {
		/* CLOEXEC: rank r+1 must not inherit rank r's pipes, or EOF would never come. */
		if (pipe2(p[k], O_CLOEXEC) != 0) {
			err = errno;
			goto fail_close_pipes;
		}
		(void)fcntl(p[k][0], F_SETFL, O_NONBLOCK);
	}
	err = posix_spawn_file_actions_init(&fa);
	if (err != 0)
		goto fail_close_pipes;
	if ((err = posix_spawn_file_actions_adddup2(&fa, devnull, STDIN_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, p[0][1], STDOUT_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, p[1][1], STDERR_FILENO)) != 0)
		goto fail_destroy_actions;
	/* glibc's posix_spawn returns exec's own errno, so ENOENT etc. surface right here. */
	err = posix_spawn(&rk->pid, path, &fa, attr, j->o.prog_argv, env);
	if (err != 0)
		goto fail_destroy_actions;
	posix_spawn_file_actions_destroy(&fa);

	rk->running = true;
	for (int k = 0; k < 2; k++) {
		close(p[k][1]);
		rk->out[k].fd = p[k][0];
		rk->out[k].which = k;
		rk->out[k].len = 0;
	}
	j->nrunning++;
	j->nopen += 2;
	return 0;

fail_destroy_actions:
	posix_spawn_file_actions_destroy(&fa);
fail_close_pipes:
	for (int k = 0; k < 2; k++) {
		if (p[k][0] >= 0)
			close(p[k][0]);
		if (p[k][1] >= 0)
			close(p[k][1]);
	}
	return err;
}

/*
 * Puts khorrun's main thread on rank r's CPUs so the rank, spawned next, inherits them (the
 * store thread keeps its own). A rank that cannot be bound runs unbound, with a warning.
 */
static void bind_next(const cpubind_cpus *cpus, int np, int r)
{
	char list[256], ebuf[128];
	int first, count, err;

	cpubind_share(cpus->n, np, r, &first, &count);
	cpubind_format(cpus->cpu + first, count, list, sizeof(list));
	err = cpubind_apply(cpus, first, count);
	if (err != 0) {
		say("cannot bind rank %d to CPU %s (%s); it runs on khorrun's CPUs", r, list,
		    kerr_errno_str(err, ebuf, sizeof(ebuf)));
		(void)cpubind_apply(cpus, 0, 0);
		return;
	}
	KLOG_DEBUG("khorrun: rank %d runs on CPU %s", r, list);
}

static void unbind(const cpubind_cpus *cpus)
{
	char ebuf[128];
	int err;

	if (cpus == NULL)
		return;
	err = cpubind_apply(cpus, 0, 0);
	if (err != 0)
		say("cannot restore khorrun's own CPUs (%s)", kerr_errno_str(err, ebuf, sizeof(ebuf)));
}

/* Starts all ranks; on a failure stops those already running and records why. */
static void spawn_all(struct job *j, const char *path, char **fixed, size_t nfixed,
                      const sigset_t *child_mask, const cpubind_cpus *cpus)
{
	char slots[NSLOTS][SLOT_LEN];
	char **env = NULL;
	posix_spawnattr_t attr;
	sigset_t def;
	int devnull;
	int err;
	char ebuf[128];

	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (devnull < 0) {
		err = errno;
		say("cannot open /dev/null for the ranks' stdin: %s",
		    kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail;
	}
	/* The slots are rewritten per rank, but build_env reads their names now. */
	fill_slots(slots, 0);
	env = build_env(&j->o, fixed, nfixed, slots);
	if (env == NULL) {
		err = ENOMEM;
		say("out of memory building the ranks' environment");
		goto fail_close_devnull;
	}
	err = posix_spawnattr_init(&attr);
	if (err != 0) {
		say("posix_spawnattr_init: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail_free_env;
	}
	/*
	 * Own process group per rank, so a stop reaches what the rank forked; the signal mask
	 * khorrun was started with (we block signals for the signalfd); SIGPIPE back to default
	 * (we ignore it, and an ignored disposition would survive exec).
	 */
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	if ((err = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
	                                                   POSIX_SPAWN_SETSIGDEF)) != 0 ||
	    (err = posix_spawnattr_setpgroup(&attr, 0)) != 0 ||
	    (err = posix_spawnattr_setsigmask(&attr, child_mask)) != 0 ||
	    (err = posix_spawnattr_setsigdefault(&attr, &def)) != 0) {
		say("posix_spawnattr: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail_destroy_attr;
	}

	for (int r = 0; r < j->o.np; r++) {
		fill_slots(slots, r);
		if (cpus != NULL)
			bind_next(cpus, j->o.np, r);
		err = spawn_rank(j, r, path, env, &attr, devnull);
		if (err != 0) {
			say("cannot start rank %d (%s): %s%s", r, path,
			    kerr_errno_str(err, ebuf, sizeof(ebuf)),
			    err == EAGAIN || err == EMFILE || err == ENFILE
			            ? " (process or file limit reached; see ulimit -u / -n)"
			            : "");
			goto fail_destroy_attr;
		}
		j->nstarted = r + 1;
	}
	unbind(cpus);
	posix_spawnattr_destroy(&attr);
	free(env);
	close(devnull);
	return;

fail_destroy_attr:
	unbind(cpus);
	posix_spawnattr_destroy(&attr);
fail_free_env:
	free(env);
fail_close_devnull:
	close(devnull);
fail:
	j->cause = CAUSE_SPAWN;
	j->spawn_exit = spawn_exit_code(err);
	if (j->nstarted > 0)
		begin_stop(j, SIGTERM);
}

/* Tells the user how the job ended and returns khorrun's exit status. */
static int report(struct job *j)
{
	char what[96], name[32];
	struct rank *rk;

	switch (j->cause) {
	case CAUSE_NONE:
		return 0;
	case CAUSE_SPAWN:
		return j->spawn_exit;
	case CAUSE_SIGNAL:
		say("interrupted by %s; stopped %d rank%s", sig_name(j->intr_sig, name, sizeof(name)),
		    j->intr_nrunning, j->intr_nrunning == 1 ? "" : "s");
		return 128 + j->intr_sig;
	case CAUSE_FAILURE:
		rk = &j->ranks[j->first_fail];
		describe_status(rk->wstatus, what, sizeof(what));
		say("rank %d (pid %d) failed first: %s", j->first_fail, (int)rk->pid, what);
		return status_to_exit(rk->wstatus);
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct job job;
	struct job *j = &job;
	char secret[65], job_id[80], store_addr[300], hostname[256];
	char *fixed[MAX_FIXED];
	size_t nfixed = 0;
	bool ok = true;
	char *path = NULL;
	sigset_t block, old_mask;
	store_server *srv = NULL;
	kerr err;
	uint8_t rnd[4];
	const char *host;
	cpubind_cpus cpus = { 0 };
	bool bind = false, have_cpus = false;
	int rc;

	memset(j, 0, sizeof(*j));
	j->sfd = -1;
	j->first_fail = -1;
	klog_init_from_env();
	if (!ensure_std_fds())
		return 1;
	rc = parse_args(argc, argv, &j->o);
	if (rc >= 0)
		goto out_free_opts;
	rc = resolve_program(j->o.prog_argv[0], &path);
	if (rc != 0)
		goto out_free_opts;
	/*
	 * Before the store thread exists: its CPUs are the ones khorrun was given. The ranks
	 * learn how many (KHOR_LOCAL_CPUS): pinned to one or a few, they cannot tell from
	 * their own CPU set how crowded the machine is.
	 */
	{
		int e = cpubind_load(&cpus);
		char ebuf[128];

		if (e != 0 && j->o.bind == CPUBIND_CORES)
			say("cannot read khorrun's CPUs (%s); ranks run unbound",
			    kerr_errno_str(e, ebuf, sizeof(ebuf)));
		have_cpus = e == 0 && cpus.n > 0;
		bind = have_cpus && j->o.bind == CPUBIND_CORES;
	}
	rc = 1;
	if (!ensure_fd_limit(j->o.np))
		goto out_free_path;

	/*
	 * Block the signals we handle before the store thread exists, so every thread
	 * inherits the mask and they all arrive at the signalfd instead of killing us halfway
	 * through a stop.
	 */
	sigemptyset(&block);
	sigaddset(&block, SIGCHLD);
	for (int i = 0; i < 3; i++) {
		static const int stop_sigs[3] = { SIGINT, SIGTERM, SIGHUP };
		struct sigaction sa;

		/*
		 * Started ignoring it (nohup, a background job of a script): whoever started us
		 * asked that it not stop the job, so neither we nor the ranks react to it.
		 */
		if (sigaction(stop_sigs[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
			continue;
		sigaddset(&block, stop_sigs[i]);
	}
	if (sigprocmask(SIG_BLOCK, &block, &old_mask) != 0) {
		say("sigprocmask failed");
		goto out_free_path;
	}
	j->sfd = signalfd(-1, &block, SFD_NONBLOCK | SFD_CLOEXEC);
	if (j->sfd < 0) {
		char ebuf[128];

		say("signalfd failed: %s", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		goto out_restore_mask;
	}
	/* A closed stdout must not kill khorrun while ranks still run (see write_out). */
	signal(SIGPIPE, SIG_IGN);
	/* Orphans of the ranks come to us, not to init, so none outlives the job. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
		say("cannot become a child subreaper; processes the ranks leave behind may "
		    "outlive the job");

	if (!kauth_new_secret(secret) || !kauth_random(rnd, sizeof(rnd))) {
		say("cannot get random bytes for the job secret (getrandom failed)");
		goto out_close_sfd;
	}
	if (j->o.job_id != NULL)
		kstrlcpy(job_id, j->o.job_id, sizeof(job_id));
	else
		snprintf(job_id, sizeof(job_id), "khor-%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
		         rnd[3]);

	kerr_clear(&err);
	if (store_server_start(j->o.bind_host, j->o.store_port, secret, job_id, &srv, &err) !=
	    KHOR_SUCCESS) {
		say("cannot start the rendezvous store on %s:%u: %s%s", j->o.bind_host,
		    (unsigned)j->o.store_port, err.text,
		    j->o.store_port != 0 ? " (is the port in use? --store-port 0 picks a free one)"
		                         : "");
		goto out_close_sfd;
	}

	/* Ranks are local: a wildcard bind is reached through loopback. */
	host = j->o.bind_host;
	if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0)
		host = "127.0.0.1";
	else if (strcmp(host, "::") == 0)
		host = "::1";
	if (strchr(host, ':') != NULL)
		snprintf(store_addr, sizeof(store_addr), "[%s]:%u", host,
		         (unsigned)store_server_port(srv));
	else
		snprintf(store_addr, sizeof(store_addr), "%s:%u", host,
		         (unsigned)store_server_port(srv));

	j->ranks = calloc((size_t)j->o.np, sizeof(*j->ranks));
	if (j->ranks == NULL) {
		say("out of memory for %d ranks", j->o.np);
		goto out_stop_store;
	}
	for (int r = 0; r < j->o.np; r++) {
		j->ranks[r].pid = -1;
		j->ranks[r].out[0].fd = -1;
		j->ranks[r].out[1].fd = -1;
	}
	for (int r = 0; r < j->o.np; r++) {
		struct rank *rk = &j->ranks[r];

		if (!j->o.no_prefix)
			rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ", r);
		for (int k = 0; k < 2; k++) {
			rk->out[k].buf = malloc(LINE_BUF);
			if (rk->out[k].buf == NULL) {
				say("out of memory for %d ranks' output buffers", j->o.np);
				goto out_free_ranks;
			}
		}
	}

	/* One host (see fill_slots): every rank is local, and the only one of its cross group. */
	for (size_t p = 0; p < NPREFIXES && ok; p++) {
		const char *pre = id_prefixes[p];

		ok = add_fixed(fixed, &nfixed, "%sSIZE=%d", pre, j->o.np) &&
		     add_fixed(fixed, &nfixed, "%sLOCAL_SIZE=%d", pre, j->o.np) &&
		     add_fixed(fixed, &nfixed, "%sCROSS_RANK=0", pre) &&
		     add_fixed(fixed, &nfixed, "%sCROSS_SIZE=1", pre);
	}
	rank_hostname(&j->o, hostname, sizeof(hostname));
	if (!ok || !add_fixed(fixed, &nfixed, "HOROVOD_HOSTNAME=%s", hostname) ||
	    !add_fixed(fixed, &nfixed, "KHOR_STORE_ADDR=%s", store_addr) ||
	    !add_fixed(fixed, &nfixed, "KHOR_SECRET=%s", secret) ||
	    !add_fixed(fixed, &nfixed, "KHOR_JOB_ID=%s", job_id) ||
	    !add_fixed(fixed, &nfixed, "KHOR_LAUNCHER=khorrun") ||
	    (have_cpus && !add_fixed(fixed, &nfixed, "KHOR_LOCAL_CPUS=%d", cpus.n)) ||
	    (j->o.timeout != NULL && !add_fixed(fixed, &nfixed, "KHOR_TIMEOUT=%s", j->o.timeout))) {
		say("out of memory building the ranks' environment");
		goto out_free_fixed;
	}

	spawn_all(j, path, fixed, nfixed, &old_mask, bind ? &cpus : NULL);
	run_loop(j);
	sweep_leftovers(j);
	rc = report(j);

out_free_fixed:
	for (size_t i = 0; i < nfixed; i++)
		free(fixed[i]);
out_free_ranks:
	for (int r = 0; r < j->o.np; r++) {
		for (int k = 0; k < 2; k++) {
			if (j->ranks[r].out[k].fd >= 0)
				close(j->ranks[r].out[k].fd);
			free(j->ranks[r].out[k].buf);
		}
	}
	free(j->ranks);
out_stop_store:
	store_server_stop(srv);
out_close_sfd:
	close(j->sfd);
out_restore_mask:
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
out_free_path:
	cpubind_free(&cpus);
	free(path);
out_free_opts:
	free(j->o.xvars);
	return rc;
}
