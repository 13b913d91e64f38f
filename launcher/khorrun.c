/*
 * khorrun.c -- the launcher: `khorrun -np N [options] [--] prog args...` starts N ranks of
 * prog on this host, or on the hosts of -H, --hostfile or the Slurm allocation it runs in.
 *
 * It runs the job's rendezvous store on a thread of its own (rendezvous/store.h), gives every
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
 * Other hosts. Ranks are placed host by host (block placement). A host that is this one
 * (localhost, 127.x, ::1, this host's name or one of its addresses) runs its ranks directly;
 * every other host gets ONE ssh connection whose remote command is this same khorrun in
 * helper mode (`khorrun --remote-helper`):
 *
 *   khorrun --ssh host2--> sshd -> khorrun --remote-helper -> rank 4..7 (own process groups)
 *      ^  stdin:  frames "cwd, argv, environment (the secret), ranks, go", then "signal N"
 *      |  stdout: frames "started pid", "output of rank r", "rank r exited: wait status"
 *      +- stderr: ssh's own errors, shown with the host's name
 *
 * Why a helper rather than "ssh host env KHOR_SECRET=... prog" per rank: the secret must
 * never be on a command line (any user's `ps` would show it), one connection per host starts
 * 16 ranks about as fast as 4, and the helper is a supervisor on the far side: it runs the
 * same subreaper and stop logic as here, reports exit statuses exactly, and when its ssh
 * session ends for any reason (khorrun killed, the network gone) it sees EOF on stdin and
 * stops its ranks (SIGTERM, SIGKILL after the grace period). The helper does no placement
 * and no line splitting: output travels as raw chunks and is cut into lines here, so
 * --output-filename and the "[rank] " prefix work the same for every host.
 *
 * The store must be reachable from every host: with remote hosts it listens on this host's
 * address toward the first of them (the source address of the route, found by connect() on
 * a UDP socket), unless --bind-store says otherwise.
 */
#include "base/auth.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/parse.h"
#include "khor.h"
#include "runtime/config.h"
#include "runtime/cpubind.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
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
#include <sys/socket.h>
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
#define MAX_HOSTS 65536
#define MAX_ORPHANS 1024
#define DEFAULT_GRACE_MS 3000
#define DEFAULT_START_TIMEOUT_MS 30000
/* A frame between khorrun and a helper: type byte, 4-byte big-endian length, payload. */
#define FRAME_HDR 5
#define FRAME_MAX (LINE_BUF + 64)
/* Bumped whenever the frames change: both ends must be the same khorrun. */
#define HELPER_PROTO "khorrun-helper 1"

enum { OUT_STDOUT = 0, OUT_STDERR = 1 };

/* Why the job is ending early; the first cause wins and decides the exit status. */
enum cause { CAUSE_NONE = 0, CAUSE_FAILURE, CAUSE_SIGNAL, CAUSE_SPAWN };

struct opts {
	int np;
	const char *bind_host;
	bool bind_given; /* --bind-store was given */
	uint16_t store_port;
	const char **xvars; /* "VAR=VALUE" from -x, in command-line order */
	int nxvars;
	const char **xnames; /* "VAR" from -x: forwarded to other hosts with khorrun's value */
	int nxnames;
	const char *timeout;
	int64_t grace_ms;
	int64_t start_timeout_ms;
	bool no_prefix;
	const char *job_id;
	cpubind_mode bind;
	const char **host_args; /* each -H's value */
	int nhost_args;
	const char *hostfile;
	const char *ssh_command; /* NULL: "ssh" */
	const char *ssh_port;
	const char *ssh_identity;
	const char *remote_khorrun; /* NULL: this khorrun's own path */
	const char *output_dir;
	bool dry_run;
	char **prog_argv; /* NULL-terminated, points into argv */
};

struct stream {
	int fd; /* read end of the rank's pipe; -1 once closed (always -1 for remote ranks) */
	int which; /* OUT_STDOUT or OUT_STDERR */
	size_t len;
	char *buf; /* LINE_BUF bytes */
	int file; /* --output-filename: DIR/rank.N/stdout or stderr; else -1 */
};

struct rank {
	pid_t pid; /* also its process group id; -1 for a rank on another host */
	bool running; /* spawned and not yet reaped (remote: started and no exit reported) */
	bool lost; /* remote: its host's connection ended before it reported an exit */
	int wstatus;
	int rpid; /* remote: its pid there, once the helper says */
	int id; /* its rank in the job (the helper keeps only its own ranks) */
	int host; /* index into job.hosts */
	int lrank, lsize, xrank, xsize; /* local and cross rank and size */
	char prefix[24];
	size_t prefix_len;
	struct stream out[2];
};

/* Bytes waiting to be written to a non-blocking fd. */
struct wbuf {
	char *data;
	size_t len, off, cap;
};

/*
 * A host of the job. For another host: its ssh process and the three pipes to it, and what
 * the helper there has said so far.
 */
struct host {
	char *name; /* as given: -H, the hostfile or Slurm */
	int slots;
	int first, n; /* ranks first .. first+n-1 are placed here */
	bool local; /* this host: ranks start without ssh */
	pid_t ssh_pid; /* also its process group */
	bool ssh_running;
	int ssh_status;
	int to_fd, from_fd, err_fd; /* ssh's stdin, stdout (frames), stderr; -1 once closed */
	struct wbuf out;
	char *rx; /* frames from the helper, FRAME_MAX + FRAME_HDR bytes */
	size_t rx_len;
	char errline[1024]; /* ssh's stderr, the line being read */
	size_t errline_len;
	char last_err[512]; /* the last non-empty line ssh or the helper wrote there */
	char *early; /* stderr lines before the helper was ready: shown only if it starts */
	size_t early_len;
	bool synced; /* the helper's magic has come: frames from here on */
	bool ready; /* the helper has started every rank */
	bool failed; /* its start failed; already said why */
	bool finished; /* ssh reaped and its pipes closed */
};

struct job {
	struct opts o;
	struct rank *ranks;
	int nstarted;
	int nrunning;
	int nopen; /* streams (and helper pipes) not yet at EOF */
	int sfd; /* signalfd */
	bool out_dead[2]; /* our stdout/stderr is gone (EPIPE): drop output, keep running */

	struct host *hosts; /* the hosts that have ranks */
	int nhosts;
	bool multi; /* ranks on more than one host: say which host in messages */
	int nssh; /* ssh processes not yet reaped */
	int nhostfds; /* their stdout and stderr pipes not yet at EOF */
	int nremote, nready; /* hosts reached over ssh; of them, those whose ranks started */
	kdeadline start_dl;
	bool helper; /* this is `khorrun --remote-helper` */
	sigset_t child_mask; /* helper: the mask its ranks start with */
	bool stdin_open; /* helper: khorrun's frames still come */

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

/* In the helper, say() sends its line to khorrun as a frame (see helper_main). */
static bool say_as_frame;
static void helper_send(char type, const void *a, size_t alen, const void *b, size_t blen);

/* khorrun's own messages: one write per line, so they never split a rank's line. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	n = say_as_frame ? 0 : snprintf(line, sizeof(line), "khorrun: ");
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	if (say_as_frame) {
		helper_send('M', line, (size_t)n, NULL, 0);
		return;
	}
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
	        "       khorrun [-np N] -H HOST:SLOTS,... | --hostfile FILE [options] program ...\n"
	        "\n"
	        "Starts N ranks of program on this host, or host by host on the hosts given (over\n"
	        "ssh for every host but this one), with a rendezvous store, prefixes their output\n"
	        "with \"[rank] \", and stops them all when one fails.\n"
	        "\n"
	        "options:\n"
	        "  -np N, -n N          number of ranks to start (required without hosts; with\n"
	        "                       hosts, the default is every slot)\n"
	        "  -x VAR=VALUE, -x VAR set VAR in every rank's environment, or pass khorrun's\n"
	        "                       own VAR to the ranks on other hosts (repeatable)\n"
	        "  --timeout DURATION   set KHOR_TIMEOUT in the ranks (30s, 500ms, 2m, inf)\n"
	        "  --grace DURATION     time between SIGTERM and SIGKILL when stopping ranks\n"
	        "                       (default 3s)\n"
	        "  --bind-store ADDR[:PORT]  address the rendezvous store listens on (default\n"
	        "                       127.0.0.1; with other hosts, this host's address on the\n"
	        "                       route to the first of them)\n"
	        "  --store-port PORT    its port (default 0: any free port)\n"
	        "  --job-id ID          job id (default khor-<8 random hex digits>)\n"
	        "  --no-prefix          do not prefix output lines with \"[rank] \"\n"
	        "  --output-filename DIR  also write each rank's output, unprefixed, to\n"
	        "                       DIR/rank.N/stdout and DIR/rank.N/stderr (on this host)\n"
	        "  --bind MODE          cores: pin each rank to its own equal block of khorrun's\n"
	        "                       CPUs (hardware threads of a core together), or to CPU\n"
	        "                       r mod CPUs when ranks outnumber them; none (default)\n"
	        "\n"
	        "hosts:\n"
	        "  -H, --host HOST[:SLOTS],...  hosts and their slots (no SLOTS: 1); repeatable\n"
	        "  --hostfile FILE      one host a line: \"HOST slots=N\", \"HOST:N\" or \"HOST\"\n"
	        "                       (1 slot); '#' starts a comment\n"
	        "                       Without either, inside a Slurm allocation\n"
	        "                       (SLURM_JOB_NODELIST), its nodes and tasks per node.\n"
	        "  --ssh-command CMD    how to reach a host (default \"ssh\"); khorrun appends\n"
	        "                       HOST and its command, and for ssh itself -T and\n"
	        "                       -o BatchMode=yes -o ConnectTimeout=<start timeout>\n"
	        "  --ssh-port PORT      ssh -p PORT\n"
	        "  --ssh-identity FILE  ssh -i FILE\n"
	        "  --start-timeout DURATION  time for every host to start its ranks (default 30s)\n"
	        "  --remote-khorrun PATH  khorrun on the other hosts (default: this one's path)\n"
	        "  --dry-run            print where each rank would run and exit\n"
	        "\n"
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
	        "On other hosts the ranks get, on top of their login environment, khorrun's\n"
	        "KHOR_* and HOROVOD_* variables, the -x ones, and KHOR_HOSTNAME = the host's name\n"
	        "as given; they run in khorrun's working directory.\n"
	        "Ranks read stdin from /dev/null. Exit status: the first failed rank's\n"
	        "(128+signal if killed), 130/143 when interrupted by SIGINT/SIGTERM, 2 for a bad\n"
	        "command line, 127 when the program is not found, 126 when it cannot be run,\n"
	        "1 when a host cannot be reached or does not start its ranks in time.\n");
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

/* The options that take a value ("-x V", "--grace=3s"). */
static bool takes_value(const char *name)
{
	static const char *const names[] = {
		"-np", "-n", "--np", "-x", "--timeout", "--grace", "--bind-store", "--store-port",
		"--job-id", "--bind", "-H", "--host", "--hostfile", "--ssh-command", "--ssh-port",
		"--ssh-identity", "--start-timeout", "--remote-khorrun", "--output-filename",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(name, names[i]) == 0)
			return true;
	}
	return false;
}

/*
 * "--bind-store ADDR[:PORT]": one colon means a port; a v6 address takes brackets for one
 * ("[::1]:5000"), or none at all ("::").
 */
static int parse_bind_store(const char *val, struct opts *o)
{
	static char host[256];
	const char *port = NULL;

	if (val[0] == '[') {
		const char *end = strchr(val, ']');

		if (end == NULL || (end[1] != '\0' && end[1] != ':') || end == val + 1 ||
		    (size_t)(end - val - 1) >= sizeof(host))
			return bad_usage("--bind-store wants ADDR, ADDR:PORT or [V6ADDR]:PORT, not '%s'",
			                 val);
		memcpy(host, val + 1, (size_t)(end - val - 1));
		host[end - val - 1] = '\0';
		if (end[1] == ':')
			port = end + 2;
	} else {
		const char *c = strchr(val, ':');

		if (c != NULL && strchr(c + 1, ':') == NULL) {
			if ((size_t)(c - val) >= sizeof(host) || c == val)
				return bad_usage("--bind-store wants ADDR or ADDR:PORT, not '%s'", val);
			memcpy(host, val, (size_t)(c - val));
			host[c - val] = '\0';
			port = c + 1;
		} else {
			kstrlcpy(host, val, sizeof(host));
		}
	}
	if (port != NULL) {
		int64_t v;

		if (!kparse_i64(port, &v) || v < 0 || v > 65535)
			return bad_usage("--bind-store: the port wants a number from 0 to 65535, not "
			                 "'%s'", port);
		o->store_port = (uint16_t)v;
	}
	o->bind_host = host;
	o->bind_given = true;
	return -1;
}

/*
 * Parses argv into o. Returns -1 to go on, or the exit status to exit with (0 after --help
 * or --version, 2 after a bad command line, which it has explained on stderr).
 */
static int parse_args(int argc, char **argv, struct opts *o)
{
	int i;

	memset(o, 0, sizeof(*o));
	o->bind_host = "127.0.0.1";
	o->grace_ms = DEFAULT_GRACE_MS;
	o->start_timeout_ms = DEFAULT_START_TIMEOUT_MS;
	o->bind = CPUBIND_NONE;
	o->xvars = calloc((size_t)argc, sizeof(*o->xvars));
	o->xnames = calloc((size_t)argc, sizeof(*o->xnames));
	o->host_args = calloc((size_t)argc, sizeof(*o->host_args));
	if (o->xvars == NULL || o->xnames == NULL || o->host_args == NULL) {
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
		if (strcmp(name, "--no-prefix") == 0 || strcmp(name, "--dry-run") == 0) {
			if (val != NULL)
				return bad_usage("%s takes no value", name);
			if (name[2] == 'n')
				o->no_prefix = true;
			else
				o->dry_run = true;
			continue;
		}

		/* Every other option takes a value. */
		if (!takes_value(name))
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
				return bad_usage("-x wants VAR=VALUE or VAR with VAR a variable name, not "
				                 "'%s'", val);
			/*
			 * "-x VAR" alone (mpirun's way to export a variable): the ranks here inherit
			 * khorrun's whole environment anyway; those on other hosts get it this way.
			 */
			if (e != NULL)
				o->xvars[o->nxvars++] = val;
			else
				o->xnames[o->nxnames++] = val;
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
		} else if (strcmp(name, "--start-timeout") == 0) {
			if (!kparse_duration_ms(val, &o->start_timeout_ms) || o->start_timeout_ms <= 0)
				return bad_usage("--start-timeout wants a finite duration like 30s, not "
				                 "'%s'", val);
		} else if (strcmp(name, "--bind-store") == 0) {
			int rc;

			if (val[0] == '\0')
				return bad_usage("--bind-store wants a host name or address");
			if ((rc = parse_bind_store(val, o)) >= 0)
				return rc;
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
		} else if (strcmp(name, "-H") == 0 || strcmp(name, "--host") == 0) {
			o->host_args[o->nhost_args++] = val;
		} else if (strcmp(name, "--hostfile") == 0) {
			o->hostfile = val;
		} else if (strcmp(name, "--ssh-command") == 0) {
			if (strspn(val, " \t") == strlen(val))
				return bad_usage("--ssh-command wants a command such as \"ssh -F cfg\"");
			o->ssh_command = val;
		} else if (strcmp(name, "--ssh-port") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 1 || v > 65535)
				return bad_usage("--ssh-port wants a port from 1 to 65535, not '%s'", val);
			o->ssh_port = val;
		} else if (strcmp(name, "--ssh-identity") == 0) {
			o->ssh_identity = val;
		} else if (strcmp(name, "--remote-khorrun") == 0) {
			if (val[0] != '/')
				return bad_usage("--remote-khorrun wants an absolute path, not '%s'", val);
			o->remote_khorrun = val;
		} else if (strcmp(name, "--output-filename") == 0) {
			if (val[0] == '\0')
				return bad_usage("--output-filename wants a directory");
			o->output_dir = val;
		}
	}

	if (i >= argc)
		return bad_usage("no program given");
	if (o->nhost_args > 0 && o->hostfile != NULL)
		return bad_usage("-H and --hostfile both name the hosts; give one of them");
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

/* ---- hosts ------------------------------------------------------------------------------- */

/*
 * The hosts as given, before placement. Errors are explained on stderr by whoever finds
 * them, with where the bad text came from (-H, FILE:LINE, a Slurm variable).
 */
struct hostlist {
	struct host *h;
	int n, cap;
};

static void hostlist_free(struct hostlist *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->h[i].name);
	free(l->h);
	memset(l, 0, sizeof(*l));
}

/* Adds slots to host `name` (len bytes), merging a name given twice as mpirun does. */
static bool hostlist_add(struct hostlist *l, const char *name, size_t len, int slots)
{
	for (int i = 0; i < l->n; i++) {
		if (strlen(l->h[i].name) == len && memcmp(l->h[i].name, name, len) == 0) {
			l->h[i].slots = l->h[i].slots + slots > MAX_RANKS ? MAX_RANKS
			                                                  : l->h[i].slots + slots;
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
 * One "HOST", "HOST:SLOTS", "[V6]" or "[V6]:SLOTS" (len bytes at s). A bare address with
 * more than one colon is a v6 address of 1 slot. where says where it came from.
 */
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

/* -H a:2,b:2 (each -H given adds its hosts). */
static bool parse_host_arg(const char *arg, struct hostlist *l)
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

/*
 * A hostfile: "HOST slots=N" (mpirun's form; max_slots=M is accepted and ignored),
 * "HOST:N" (horovodrun's) or "HOST" for one slot; '#' starts a comment.
 */
static bool parse_hostfile(const char *path, struct hostlist *l)
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

/*
 * Slurm's compressed host list, as in SLURM_JOB_NODELIST: "node[01-03,07],gpu5" is node01,
 * node02, node03, node07, gpu5; several brackets multiply ("r[1-2]n[1-2]"); a range keeps
 * the width of its first number ("[08-10]" is 08, 09, 10). Appends to out (1 slot each).
 */
static bool slurm_expand_item(const char *item, struct hostlist *out, const char *var)
{
	const char *lb = strchr(item, '['), *rb;
	const char *p;

	if (lb == NULL)
		return hostlist_add(out, item, strlen(item), 1);
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
			if (!slurm_expand_item(name, out, var)) {
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
		ok = slurm_expand_item(item, out, var);
		free(item);
		if (!ok)
			return false;
		p = *q == ',' ? q + 1 : q;
	}
	return true;
}

/*
 * The allocation's hosts and slots: SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE ("2(x3),1"
 * is 2, 2, 2, 1), else SLURM_JOB_CPUS_PER_NODE in the same form. Returns false with
 * nothing said when there is no allocation, or with the reason said when it is malformed
 * (*bad_out set).
 */
static bool slurm_hosts(struct hostlist *l, bool *bad_out)
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

static bool addr_is_local(const struct sockaddr *sa, const struct ifaddrs *ifs)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;

		if ((ntohl(a->sin_addr.s_addr) >> 24) == 127)
			return true;
		for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
			if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
			    ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
			            a->sin_addr.s_addr)
				return true;
		}
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;

		if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
			return true;
		for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
			if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET6 &&
			    memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
			           &a->sin6_addr, sizeof(a->sin6_addr)) == 0)
				return true;
		}
	}
	return false;
}

/*
 * Is `name` this host? localhost, this host's name (with or without its domain) or a name
 * or address that resolves to one of this host's addresses.
 */
static bool is_local_host(const char *name, const char *self, const struct ifaddrs *ifs)
{
	size_t sl = strcspn(self, "."), nl = strcspn(name, ".");
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res, *ai;
	bool local = false;

	if (strcmp(name, "localhost") == 0 || strncmp(name, "localhost.", 10) == 0 ||
	    strcmp(name, "ip6-localhost") == 0 || strcmp(name, self) == 0)
		return true;
	/* "node1" and "node1.cluster" are one host when either is given without a domain. */
	if ((self[sl] == '\0' || name[nl] == '\0') && sl == nl && strncmp(name, self, sl) == 0)
		return true;
	if (getaddrinfo(name, NULL, &hints, &res) != 0)
		return false;
	for (ai = res; ai != NULL && !local; ai = ai->ai_next)
		local = addr_is_local(ai->ai_addr, ifs);
	freeaddrinfo(res);
	return local;
}

/*
 * Gathers the hosts (-H, --hostfile, else a Slurm allocation, else this host alone),
 * decides which are this host (merged into the first of them: one machine, one block of
 * ranks), places -np ranks host by host, and fills j->hosts, j->ranks' placement and
 * j->o.np. Returns -1 to go on, else khorrun's exit status (the reason said).
 */
static int place_ranks(struct job *j)
{
	struct hostlist l = { 0 };
	struct ifaddrs *ifs = NULL;
	char self[256] = "";
	long long total = 0;
	int left, local_at = -1, nh = 0;
	int *seen = NULL, *count = NULL;
	bool from_slurm = false;

	if (j->o.nhost_args > 0) {
		for (int i = 0; i < j->o.nhost_args; i++) {
			if (!parse_host_arg(j->o.host_args[i], &l))
				goto fail_usage;
		}
	} else if (j->o.hostfile != NULL) {
		if (!parse_hostfile(j->o.hostfile, &l))
			goto fail_usage;
	} else {
		bool bad;

		from_slurm = slurm_hosts(&l, &bad);
		if (bad)
			goto fail_usage;
	}
	if (l.n == 0) {
		/* No hosts: -np ranks here, as always. */
		if (j->o.np == 0) {
			hostlist_free(&l);
			return bad_usage("-np N is required");
		}
		if (!hostlist_add(&l, "localhost", 9, j->o.np))
			goto fail;
		l.h[0].local = true;
	} else {
		(void)gethostname(self, sizeof(self) - 1);
		if (getifaddrs(&ifs) != 0)
			ifs = NULL;
		for (int i = 0; i < l.n; i++) {
			if (!is_local_host(l.h[i].name, self, ifs))
				continue;
			if (local_at < 0) {
				local_at = i;
				l.h[i].local = true;
			} else {
				/* Another name of this host: its slots join the first one's. */
				l.h[local_at].slots = l.h[local_at].slots + l.h[i].slots > MAX_RANKS
				                              ? MAX_RANKS
				                              : l.h[local_at].slots + l.h[i].slots;
				l.h[i].slots = 0;
			}
		}
		if (ifs != NULL)
			freeifaddrs(ifs);
	}
	for (int i = 0; i < l.n; i++)
		total += l.h[i].slots;
	if (j->o.np == 0)
		j->o.np = total > MAX_RANKS ? MAX_RANKS : (int)total;
	if (j->o.np > total) {
		char list[512];
		size_t off = 0;
		int shown = 0;

		list[0] = '\0';
		for (int i = 0; i < l.n && off < sizeof(list); i++) {
			if (l.h[i].slots == 0)
				continue;
			if (shown++ == 8) {
				snprintf(list + off, sizeof(list) - off, ", ...");
				break;
			}
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s:%d",
			                        shown > 1 ? ", " : "", l.h[i].name, l.h[i].slots);
		}
		say("-np %d but the hosts give %lld slot%s: %s%s", j->o.np, total, total == 1 ? "" : "s",
		    list, from_slurm ? " (from the Slurm allocation; -H localhost:N runs here only)"
		                     : "");
		hostlist_free(&l);
		return 2;
	}

	/* Block placement: fill each host's slots in turn; hosts left without ranks drop out. */
	j->ranks = calloc((size_t)j->o.np, sizeof(*j->ranks));
	j->hosts = calloc((size_t)l.n, sizeof(*j->hosts));
	seen = calloc((size_t)j->o.np, sizeof(int));
	count = calloc((size_t)j->o.np, sizeof(int));
	if (j->ranks == NULL || j->hosts == NULL || seen == NULL || count == NULL) {
		say("out of memory placing %d ranks", j->o.np);
		goto fail;
	}
	left = j->o.np;
	for (int i = 0; i < l.n && left > 0; i++) {
		struct host *h = &j->hosts[nh];
		int n = l.h[i].slots < left ? l.h[i].slots : left;

		if (n == 0)
			continue;
		*h = l.h[i];
		l.h[i].name = NULL; /* now the job's */
		h->first = j->o.np - left;
		h->n = n;
		h->ssh_pid = -1;
		h->to_fd = h->from_fd = h->err_fd = -1;
		for (int k = 0; k < n; k++)
			count[k]++;
		left -= n;
		nh++;
	}
	j->nhosts = nh;
	j->multi = nh > 1;
	/*
	 * Cross rank: among the ranks with the same local rank k, the order of their hosts;
	 * cross size: how many hosts have a local rank k (Horovod's definition, which holds
	 * for uneven hosts too).
	 */
	for (int hi = 0; hi < nh; hi++) {
		struct host *h = &j->hosts[hi];

		for (int k = 0; k < h->n; k++) {
			struct rank *rk = &j->ranks[h->first + k];

			rk->host = hi;
			rk->lrank = k;
			rk->lsize = h->n;
			rk->xrank = seen[k]++;
			rk->xsize = count[k];
		}
		if (!h->local)
			j->nremote++;
	}
	free(seen);
	free(count);
	hostlist_free(&l);
	return -1;

fail_usage:
	hostlist_free(&l);
	return 2;
fail:
	free(seen);
	free(count);
	hostlist_free(&l);
	return 1;
}

/*
 * The address of this host that `host` reaches it by: the source address of the route to
 * it, which connect() on a UDP socket picks without sending anything (what `ip route get`
 * prints). Returns false with the reason in why.
 */
static bool route_source(const char *host, char *out, size_t len, char *why, size_t wlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM };
	struct addrinfo *res, *ai;
	char ebuf[128];
	int rc = getaddrinfo(host, "9", &hints, &res);

	if (rc != 0) {
		snprintf(why, wlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
		return false;
	}
	snprintf(why, wlen, "no address of '%s' can be routed to", host);
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
		    getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
			snprintf(why, wlen, "no route to '%s': %s", host,
			         kerr_errno_str(errno, ebuf, sizeof(ebuf)));
			close(fd);
			continue;
		}
		close(fd);
		if (getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0,
		                NI_NUMERICHOST) == 0) {
			char *pct = strchr(out, '%'); /* a link-local scope is not for others */

			if (pct != NULL)
				*pct = '\0';
			freeaddrinfo(res);
			return true;
		}
	}
	freeaddrinfo(res);
	return false;
}

/* "4-7" or "4" */
static void rank_range(const struct host *h, char *buf, size_t len)
{
	if (h->n == 1)
		snprintf(buf, len, "rank %d", h->first);
	else
		snprintf(buf, len, "ranks %d-%d", h->first, h->first + h->n - 1);
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
/* The entries that differ between ranks, under each prefix: see fill_slots. */
#define SLOTS_PER_PREFIX 5
#define NSLOTS (SLOTS_PER_PREFIX * NPREFIXES)
#define SLOT_LEN 40
/* The entries that are the same in every rank of a host: see main. */
#define MAX_FIXED 24

/* Rank rk's identity, as placed by place_ranks (one host: local rank = rank). */
static void fill_slots(char (*slots)[SLOT_LEN], const struct rank *rk, int r)
{
	for (size_t p = 0; p < NPREFIXES; p++) {
		char(*s)[SLOT_LEN] = slots + SLOTS_PER_PREFIX * p;
		const char *pre = id_prefixes[p];

		snprintf(s[0], SLOT_LEN, "%sRANK=%d", pre, r);
		snprintf(s[1], SLOT_LEN, "%sLOCAL_RANK=%d", pre, rk->lrank);
		snprintf(s[2], SLOT_LEN, "%sLOCAL_SIZE=%d", pre, rk->lsize);
		snprintf(s[3], SLOT_LEN, "%sCROSS_RANK=%d", pre, rk->xrank);
		snprintf(s[4], SLOT_LEN, "%sCROSS_SIZE=%d", pre, rk->xsize);
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

/* ---- frames between khorrun and its helpers ---------------------------------------------- */

/*
 * What a helper writes before its first frame, so that whatever a login script prints on
 * stdout ("Welcome to ...") is passed over and shown, not taken for a frame.
 */
static const char helper_magic[] = "\001khorrun-helper\002";
#define HELPER_MAGIC_LEN (sizeof(helper_magic) - 1)

/* The one coding of the frames' big-endian numbers (lengths, and the rank of an 'O'). */
static void frame_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t frame_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static bool wbuf_put(struct wbuf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *d;

		while (cap < b->len + n)
			cap *= 2;
		d = realloc(b->data, cap);
		if (d == NULL)
			return false;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return true;
}

static bool frame_put(struct wbuf *b, char type, const void *a, size_t alen, const void *c,
                      size_t clen)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t len = (uint32_t)(alen + clen);

	hdr[0] = (uint8_t)type;
	frame_put_u32(hdr + 1, len);
	return wbuf_put(b, hdr, sizeof(hdr)) && wbuf_put(b, a, alen) &&
	       (clen == 0 || wbuf_put(b, c, clen));
}

static bool frame_puts(struct wbuf *b, char type, const char *text)
{
	return frame_put(b, type, text, strlen(text), NULL, 0);
}

/* Writes what it can of b to a non-blocking fd; false when the fd is gone. */
static bool wbuf_flush(struct wbuf *b, int fd)
{
	while (b->off < b->len) {
		ssize_t w = write(fd, b->data + b->off, b->len - b->off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN;
		}
		b->off += (size_t)w;
	}
	b->off = b->len = 0;
	return true;
}

/*
 * Takes the first complete frame off buf (len bytes). Returns 1 with its type, payload and
 * size (the frame is hdr + *plen bytes), 0 when it is not all there yet, -1 when garbled.
 */
static int frame_next(const char *buf, size_t len, char *type_out, const char **payload_out,
                      size_t *plen_out)
{
	const uint8_t *u = (const uint8_t *)buf;
	uint32_t n;

	if (len < FRAME_HDR)
		return 0;
	n = frame_get_u32(u + 1);
	if (n > FRAME_MAX)
		return -1;
	if (len < FRAME_HDR + n)
		return 0;
	*type_out = buf[0];
	*payload_out = buf + FRAME_HDR;
	*plen_out = n;
	return 1;
}

/*
 * Writes all of iov (cnt entries, updated in place) to fd, retrying short writes and EINTR
 * and waiting out EAGAIN (someone made our stdout non-blocking); false once fd is gone.
 */
static bool writev_all(int fd, struct iovec *iov, int cnt)
{
	while (cnt > 0) {
		ssize_t w = writev(fd, iov, cnt);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = fd, .events = POLLOUT };

				(void)poll(&p, 1, 1000);
				continue;
			}
			return false;
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
	return true;
}

/*
 * The helper's side: a frame to khorrun on stdout, written whole (blocking; khorrun reads
 * its helpers all the time). Once stdout is gone every frame is dropped.
 */
static bool helper_out_dead;

static void helper_send(char type, const void *a, size_t alen, const void *b, size_t blen)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t len = (uint32_t)(alen + blen);
	struct iovec iov[3] = { { hdr, sizeof(hdr) }, { (void *)a, alen }, { (void *)b, blen } };
	struct iovec *v = iov;
	int cnt = 3;

	hdr[0] = (uint8_t)type;
	frame_put_u32(hdr + 1, len);
	if (!helper_out_dead && !writev_all(STDOUT_FILENO, v, cnt))
		helper_out_dead = true;
}

static void helper_sendf(char type, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void helper_sendf(char type, const char *fmt, ...)
{
	char buf[256];
	int n;
	va_list ap;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	helper_send(type, buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1, NULL, 0);
}

/* ---- output ------------------------------------------------------------------------------ */

/* Writes all of iov to our stdout or stderr; on EPIPE and the like drops it from then on. */
static void write_out(struct job *j, int which, struct iovec *iov, int cnt)
{
	int fd = which == OUT_STDOUT ? STDOUT_FILENO : STDERR_FILENO;

	/* Reader gone: keep the ranks running, as a shell pipeline would not. */
	if (!j->out_dead[which] && !writev_all(fd, iov, cnt))
		j->out_dead[which] = true;
}

/* Writes all of iov to a --output-filename file; a failed write is said once. */
static void write_file(struct rank *rk, struct stream *s, struct iovec *iov, int cnt)
{
	char ebuf[128];

	if (s->file < 0 || writev_all(s->file, iov, cnt))
		return;
	say("cannot write rank %d's %s file: %s; it goes to the terminal only", rk->id,
	    s->which == OUT_STDOUT ? "stdout" : "stderr", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
	close(s->file);
	s->file = -1;
}

/*
 * Prints the complete lines in s->buf with the rank's prefix and keeps the rest. A full
 * buffer without a newline is printed as a line of its own (split, never lost); at EOF a
 * partial last line is printed with a newline added so the next prefix starts a line.
 * With --output-filename the same lines, unprefixed, go to the rank's file too.
 */
static void stream_emit(struct job *j, struct rank *rk, struct stream *s, bool eof)
{
	static const char nl = '\n';
	struct iovec iov[WRITE_BATCH * 3], fiov[WRITE_BATCH * 2];
	int cnt = 0, fcnt = 0;
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
		if (s->file >= 0)
			fiov[fcnt++] = (struct iovec){ line, ll };
		if (add_nl) {
			iov[cnt++] = (struct iovec){ (void *)&nl, 1 };
			if (s->file >= 0)
				fiov[fcnt++] = (struct iovec){ (void *)&nl, 1 };
		}
		pos += ll;
		if (cnt > (WRITE_BATCH - 1) * 3) {
			write_out(j, s->which, iov, cnt);
			write_file(rk, s, fiov, fcnt);
			cnt = fcnt = 0;
		}
	}
	if (cnt > 0)
		write_out(j, s->which, iov, cnt);
	if (fcnt > 0)
		write_file(rk, s, fiov, fcnt);
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

/* Output of a rank on another host, as its helper sent it: cut into lines as here. */
static void stream_feed(struct job *j, struct rank *rk, struct stream *s, const char *p,
                        size_t n)
{
	while (n > 0) {
		size_t take = LINE_BUF - s->len < n ? LINE_BUF - s->len : n;

		memcpy(s->buf + s->len, p, take);
		s->len += take;
		p += take;
		n -= take;
		stream_emit(j, rk, s, false);
	}
}

/*
 * One read per wakeup and stream, so a chatty rank cannot starve the others. The helper
 * sends what it read to khorrun as it is; an empty chunk says the stream ended.
 */
static void stream_read(struct job *j, struct rank *rk, struct stream *s)
{
	/* The helper keeps nothing back (s->len stays 0). */
	ssize_t n = read(s->fd, s->buf + s->len, LINE_BUF - s->len);

	if (j->helper) {
		uint8_t tag[5];

		frame_put_u32(tag, (uint32_t)rk->id);
		tag[4] = (uint8_t)s->which;

		if (n > 0) {
			helper_send('O', tag, sizeof(tag), s->buf, (size_t)n);
		} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
			helper_send('O', tag, sizeof(tag), NULL, 0);
			close(s->fd);
			s->fd = -1;
			j->nopen--;
		}
		return;
	}
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

static struct host *host_of_ssh(struct job *j, pid_t pid)
{
	for (int h = 0; h < j->nhosts; h++) {
		if (j->hosts[h].ssh_running && j->hosts[h].ssh_pid == pid)
			return &j->hosts[h];
	}
	return NULL;
}

/* Queues "signal N" for a host's helper; it reaches the helper once ssh has connected. */
static void host_signal(struct host *h, int sig)
{
	char buf[16];

	if (h->to_fd < 0)
		return;
	snprintf(buf, sizeof(buf), "%d", sig);
	if (!frame_puts(&h->out, 'K', buf) || !wbuf_flush(&h->out, h->to_fd)) {
		/* Its ssh is gone or we are out of memory: the helper sees EOF and stops all. */
		close(h->to_fd);
		h->to_fd = -1;
	}
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
		if (host_of_ssh(j, pid) != NULL)
			continue; /* a host's ssh: it ends when its helper does */
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
		if (rk->pid < 0)
			continue; /* on another host: see below */
		if (kill(-rk->pid, sig) != 0)
			(void)kill(rk->pid, sig); /* it left its group; still reach the rank */
	}
	for (int h = 0; h < j->nhosts; h++) {
		struct host *hp = &j->hosts[h];

		if (hp->local || !hp->ssh_running)
			continue;
		host_signal(hp, sig);
		/*
		 * A host whose helper has not said its ranks started (ssh still connecting, or
		 * hung) has nothing to be gentle with: stop its ssh now, which ends the
		 * connection, and the helper, if it got that far, stops its ranks on the EOF.
		 */
		if (!hp->ready) {
			hp->failed = true; /* abandoned: the cause of the stop is said elsewhere */
			(void)kill(-hp->ssh_pid, sig == SIGKILL ? SIGKILL : SIGTERM);
		}
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

/*
 * Rank rk ended with wait status st: here the first failure stops the job; in the helper
 * it is reported to khorrun, which decides.
 */
static void rank_ended(struct job *j, struct rank *rk, int st)
{
	rk->running = false;
	rk->wstatus = st;
	j->nrunning--;
	if (j->helper) {
		helper_sendf('X', "%d %d", rk->id, st);
		return;
	}
	if (j->cause == CAUSE_NONE && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		j->cause = CAUSE_FAILURE;
		j->first_fail = (int)(rk - j->ranks);
		if (!j->stopping)
			begin_stop(j, SIGTERM);
	}
}

static void host_check(struct job *j, struct host *h);

/* Collects every exited child: ranks (the first failure stops the job), ssh and orphans. */
static void reap_children(struct job *j)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		struct rank *rk;
		struct host *h;

		if (pid <= 0)
			return;
		h = host_of_ssh(j, pid);
		if (h != NULL) {
			h->ssh_running = false;
			h->ssh_status = st;
			j->nssh--;
			host_check(j, h);
			continue;
		}
		rk = rank_of_pid(j, pid);
		if (rk == NULL || !rk->running)
			continue; /* something a rank left behind */
		rank_ended(j, rk, st);
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

/* ---- other hosts: khorrun's side of each ssh connection ---------------------------------- */

static void host_say_lines(const struct host *h, const char *text, size_t len)
{
	while (len > 0) {
		size_t n = strcspn(text, "\n");

		if (n > len)
			n = len;
		if (n > 0)
			say("%s: %.*s", h->name, (int)n, text);
		if (n < len)
			n++;
		text += n;
		len -= n;
	}
}

/* A line ssh (or the remote shell) wrote on stderr. */
static void host_err_line(struct host *h, const char *line, size_t n)
{
	while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
		n--;
	if (n == 0)
		return;
	snprintf(h->last_err, sizeof(h->last_err), "%.*s", (int)n, line);
	if (h->ready || h->failed) {
		say("%s: %.*s", h->name, (int)n, line);
		return;
	}
	/* Before the start: kept, to be shown if the start succeeds or named if it fails. */
	if (h->early_len < 8192) {
		char *e = realloc(h->early, h->early_len + n + 1);

		if (e != NULL) {
			memcpy(e + h->early_len, line, n);
			e[h->early_len + n] = '\n';
			h->early = e;
			h->early_len += n + 1;
		}
	}
}

static void host_err_bytes(struct host *h, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\n' || h->errline_len == sizeof(h->errline)) {
			host_err_line(h, h->errline, h->errline_len);
			h->errline_len = 0;
			if (p[i] == '\n')
				continue;
		}
		h->errline[h->errline_len++] = p[i];
	}
}

static void host_close_fd(struct job *j, int *fd)
{
	if (*fd < 0)
		return;
	close(*fd);
	*fd = -1;
	j->nhostfds--;
}

/* The start of h failed (the reason said): the job stops with status code. */
static void host_start_failed(struct job *j, struct host *h, int code)
{
	h->failed = true;
	if (j->cause == CAUSE_NONE) {
		j->cause = CAUSE_SPAWN;
		j->spawn_exit = code;
	}
	if (!j->stopping)
		begin_stop(j, SIGTERM);
}

/*
 * Called whenever something of h ends: once ssh is reaped and both its pipes are at EOF,
 * the host is finished, and ranks it never reported on are failed starts or lost.
 */
static void host_check(struct job *j, struct host *h)
{
	char ranks[48], what[96];

	if (h->finished || h->ssh_running || h->from_fd >= 0 || h->err_fd >= 0)
		return;
	h->finished = true;
	if (h->to_fd >= 0) {
		close(h->to_fd);
		h->to_fd = -1;
	}
	if (h->errline_len > 0) {
		host_err_line(h, h->errline, h->errline_len);
		h->errline_len = 0;
	}
	rank_range(h, ranks, sizeof(ranks));
	if (!h->ready && !h->failed) {
		int st = h->ssh_status;
		size_t keep = h->early_len;

		/* Every line but the last (which the message names) as ssh wrote it. */
		if (keep > 0) {
			keep--;
			while (keep > 0 && h->early[keep - 1] != '\n')
				keep--;
			host_say_lines(h, h->early, keep);
		}
		if (WIFEXITED(st) && WEXITSTATUS(st) == 255)
			say("cannot start %s on %s: %s", ranks, h->name,
			    h->last_err[0] ? h->last_err : "ssh failed (status 255) and said nothing");
		else if (WIFEXITED(st) && (WEXITSTATUS(st) == 126 || WEXITSTATUS(st) == 127))
			say("cannot start %s on %s: the remote khorrun could not be run (status %d)%s%s; "
			    "khorrun must be at the same path on every host, or give --remote-khorrun",
			    ranks, h->name, WEXITSTATUS(st), h->last_err[0] ? ": " : "", h->last_err);
		else {
			describe_status(st, what, sizeof(what));
			say("cannot start %s on %s: the ssh session %s before the ranks started%s%s",
			    ranks, h->name, what, h->last_err[0] ? ": " : "", h->last_err);
		}
		host_start_failed(j, h, 1);
	}
	for (int r = h->first; r < h->first + h->n; r++) {
		struct rank *rk = &j->ranks[r];

		for (int k = 0; k < 2; k++)
			stream_emit(j, rk, &rk->out[k], true);
		if (!rk->running)
			continue;
		if (h->failed) {
			/* Never started, or stopped by the helper when the start failed. */
			rk->running = false;
			j->nrunning--;
			continue;
		}
		rk->lost = true;
		rank_ended(j, rk, 255 << 8);
	}
}

static void host_frame(struct job *j, struct host *h, char type, const char *p, size_t n)
{
	char text[128];
	int r = -1, v = 0;
	struct rank *rk = NULL;

	if (type != 'O' && type != 'M') {
		snprintf(text, sizeof(text), "%.*s", (int)(n < sizeof(text) ? n : sizeof(text) - 1), p);
		if (sscanf(text, "%d %d", &r, &v) >= 1 && r >= h->first && r < h->first + h->n)
			rk = &j->ranks[r];
	}
	switch (type) {
	case 'P': /* "rank pid": started */
		if (rk != NULL)
			rk->rpid = v;
		break;
	case 'Y': /* every rank started */
		if (!h->ready && !h->failed) {
			h->ready = true;
			j->nready++;
			host_say_lines(h, h->early, h->early_len);
			if (j->nready == j->nremote)
				KLOG_INFO("khorrun: the ranks of %s %d other host%s started",
				          j->nremote == 1 ? "the" : "all", j->nremote,
				          j->nremote == 1 ? "" : "s");
		}
		break;
	case 'F': /* "status": the start failed there; the 'M' before it said why */
		if (!h->failed)
			host_start_failed(j, h, r > 0 ? r : 1);
		break;
	case 'O': /* 4-byte rank, stream, bytes (none: the stream ended) */
		if (n >= 5) {
			const uint8_t *u = (const uint8_t *)p;
			int id = (int)frame_get_u32(u);

			if (id >= h->first && id < h->first + h->n && u[4] <= 1) {
				rk = &j->ranks[id];
				if (n == 5)
					stream_emit(j, rk, &rk->out[u[4]], true);
				else
					stream_feed(j, rk, &rk->out[u[4]], p + 5, n - 5);
			}
		}
		break;
	case 'X': /* "rank wait-status" */
		if (rk != NULL && rk->running)
			rank_ended(j, rk, v);
		break;
	case 'M':
		say("%s: %.*s", h->name, (int)n, p);
		break;
	default: /* 'D' and anything newer: nothing to do */
		break;
	}
}

static void host_read(struct job *j, struct host *h)
{
	ssize_t n = read(h->from_fd, h->rx + h->rx_len, FRAME_MAX + FRAME_HDR - h->rx_len);
	size_t pos = 0;

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		if (!h->synced)
			host_err_bytes(h, h->rx, h->rx_len);
		host_close_fd(j, &h->from_fd);
		host_check(j, h);
		return;
	}
	if (n < 0)
		return;
	h->rx_len += (size_t)n;
	if (!h->synced) {
		/* Until the magic, what comes is text a login script printed: show it as such. */
		char *m = memmem(h->rx, h->rx_len, helper_magic, HELPER_MAGIC_LEN);
		size_t junk = m != NULL ? (size_t)(m - h->rx)
		              : h->rx_len >= HELPER_MAGIC_LEN ? h->rx_len - HELPER_MAGIC_LEN + 1
		                                              : 0; /* the magic may be cut in two */

		host_err_bytes(h, h->rx, junk);
		pos = junk;
		if (m != NULL) {
			h->synced = true;
			pos += HELPER_MAGIC_LEN;
		}
	}
	while (h->synced) {
		char type;
		const char *payload;
		size_t plen;
		int rc = frame_next(h->rx + pos, h->rx_len - pos, &type, &payload, &plen);

		if (rc == 0)
			break;
		if (rc < 0) {
			say("%s: garbled data from the remote khorrun; stopping that host", h->name);
			(void)kill(-h->ssh_pid, SIGKILL);
			h->rx_len = 0;
			host_close_fd(j, &h->from_fd);
			host_check(j, h);
			return;
		}
		host_frame(j, h, type, payload, plen);
		pos += FRAME_HDR + plen;
	}
	memmove(h->rx, h->rx + pos, h->rx_len - pos);
	h->rx_len -= pos;
}

static void host_read_err(struct job *j, struct host *h)
{
	char buf[4096];
	ssize_t n = read(h->err_fd, buf, sizeof(buf));

	if (n > 0) {
		host_err_bytes(h, buf, (size_t)n);
		return;
	}
	if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		host_close_fd(j, &h->err_fd);
		host_check(j, h);
	}
}

/* --start-timeout passed: every host whose ranks have not started is a failed start. */
static void start_timed_out(struct job *j)
{
	char ranks[48];

	for (int i = 0; i < j->nhosts; i++) {
		struct host *h = &j->hosts[i];

		if (h->local || h->ready || h->failed || !h->ssh_running)
			continue;
		rank_range(h, ranks, sizeof(ranks));
		if (h->early_len > 1) {
			size_t keep = h->early_len - 1;

			while (keep > 0 && h->early[keep - 1] != '\n')
				keep--;
			host_say_lines(h, h->early, keep);
		}
		say("cannot start %s on %s: no answer within %.1f s (--start-timeout)%s%s", ranks,
		    h->name, (double)j->o.start_timeout_ms / 1000.0,
		    h->last_err[0] ? "; ssh said: " : "", h->last_err);
		(void)kill(-h->ssh_pid, SIGKILL);
		host_start_failed(j, h, 1);
	}
}

/* ---- the loop ---------------------------------------------------------------------------- */

/* Helper: khorrun's frames after the start ("signal N"), and EOF when it is gone. */
static void helper_read_stdin(struct job *j, char *rx, size_t *rx_len)
{
	ssize_t n = read(STDIN_FILENO, rx + *rx_len, FRAME_MAX + FRAME_HDR - *rx_len);
	size_t pos = 0;

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		/* ssh's session ended: khorrun, or the network, is gone. Stop everything. */
		j->stdin_open = false;
		if (!j->stopping && (j->nrunning > 0 || j->nopen > 0))
			begin_stop(j, SIGTERM);
		return;
	}
	if (n < 0)
		return;
	*rx_len += (size_t)n;
	for (;;) {
		char type, buf[16];
		const char *payload;
		size_t plen;
		int rc = frame_next(rx + pos, *rx_len - pos, &type, &payload, &plen);

		if (rc <= 0) {
			if (rc < 0) {
				j->stdin_open = false;
				if (!j->stopping)
					begin_stop(j, SIGTERM);
				*rx_len = 0;
				return;
			}
			break;
		}
		if (type == 'K' && plen < sizeof(buf)) {
			int sig;

			memcpy(buf, payload, plen);
			buf[plen] = '\0';
			sig = atoi(buf);
			if (sig > 0 && sig < NSIG)
				signal_all(j, sig);
		}
		pos += FRAME_HDR + plen;
	}
	memmove(rx, rx + pos, *rx_len - pos);
	*rx_len -= pos;
}

/*
 * The loop: forward output, reap, stop. It ends when every rank is reaped (or has reported
 * its end from its host), every pipe is at EOF and every ssh is reaped, or when, after
 * SIGKILL, the ranks still do not go away.
 */
static void run_loop(struct job *j)
{
	size_t cap = 2 + 2 * (size_t)j->nstarted + 3 * (size_t)j->nhosts;
	struct pollfd *pfd = calloc(cap, sizeof(*pfd));
	struct stream **who = calloc(cap, sizeof(*who));
	struct rank **whose = calloc(cap, sizeof(*whose));
	struct host **whost = calloc(cap, sizeof(*whost));
	char *hrx = j->helper ? malloc(FRAME_MAX + FRAME_HDR) : NULL;
	size_t hrx_len = 0;

	if (pfd == NULL || who == NULL || whose == NULL || whost == NULL ||
	    (j->helper && hrx == NULL)) {
		say("out of memory while watching the ranks; killing them");
		signal_all(j, SIGKILL);
		goto out;
	}

	while ((j->nrunning > 0 || j->nopen > 0 || j->nssh > 0 || j->nhostfds > 0) && !j->gave_up) {
		int timeout = 1000;
		int n = 1, stdin_at = -1;
		int rc;

		if (j->helper && helper_out_dead && !j->stopping)
			begin_stop(j, SIGTERM); /* khorrun can no longer hear us: stop */
		if (j->nready < j->nremote && !j->stopping && kdeadline_passed(j->start_dl))
			start_timed_out(j);
		/*
		 * Every rank is gone but something they started still holds a pipe open (a
		 * daemon, "sleep &"). Give it the grace period to finish, then stop it.
		 */
		if (j->nrunning == 0 && !j->stopping) {
			if (!j->draining) {
				j->draining = true;
				j->drain_until = kdeadline_in_ms(j->o.grace_ms);
			} else if (kdeadline_passed(j->drain_until)) {
				/* Only ssh left: a helper that does not finish is stopped the same way. */
				if (j->nopen > 0)
					say("every rank exited, but processes they started still hold their "
					    "output open after %lld ms; stopping them",
					    (long long)j->o.grace_ms);
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
		if (j->nready < j->nremote && !j->stopping &&
		    ms_left(j->start_dl) < (uint64_t)timeout)
			timeout = (int)ms_left(j->start_dl);

		pfd[0] = (struct pollfd){ .fd = j->sfd, .events = POLLIN };
		if (j->helper && j->stdin_open) {
			stdin_at = n;
			pfd[n++] = (struct pollfd){ .fd = STDIN_FILENO, .events = POLLIN };
		}
		for (int r = 0; r < j->nstarted; r++) {
			for (int k = 0; k < 2; k++) {
				struct stream *s = &j->ranks[r].out[k];

				if (s->fd < 0)
					continue;
				pfd[n] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
				who[n] = s;
				whose[n] = &j->ranks[r];
				whost[n] = NULL;
				n++;
			}
		}
		for (int h = 0; h < j->nhosts; h++) {
			struct host *hp = &j->hosts[h];
			int fds[3] = { hp->from_fd, hp->err_fd, hp->to_fd };

			for (int k = 0; k < 3; k++) {
				if (fds[k] < 0 || (k == 2 && hp->out.len == 0))
					continue;
				pfd[n] = (struct pollfd){ .fd = fds[k], .events = k == 2 ? POLLOUT : POLLIN };
				who[n] = NULL;
				whose[n] = NULL;
				whost[n] = hp;
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
			struct host *hp = whost[i];

			if (pfd[i].revents == 0)
				continue;
			if (i == stdin_at) {
				helper_read_stdin(j, hrx, &hrx_len);
			} else if (hp == NULL) {
				stream_read(j, whose[i], who[i]);
			} else if (pfd[i].fd == hp->from_fd) {
				host_read(j, hp);
			} else if (pfd[i].fd == hp->err_fd) {
				host_read_err(j, hp);
			} else if (pfd[i].fd == hp->to_fd && !wbuf_flush(&hp->out, hp->to_fd)) {
				close(hp->to_fd);
				hp->to_fd = -1;
			}
		}
		if (pfd[0].revents != 0)
			handle_signals(j);
	}

out:
	/* Whatever is still open here is abandoned: print what we have of it. */
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			stream_close(j, &j->ranks[r], &j->ranks[r].out[k]);
			if (!j->helper)
				stream_emit(j, &j->ranks[r], &j->ranks[r].out[k], true);
		}
	}
	free(hrx);
	free(whost);
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
	kdeadline ssh_dl = kdeadline_in_ms(KILL_WAIT_MS);

	/*
	 * An ssh still running here is one khorrun gave up on (after SIGKILL its host never
	 * answered): end the connection, which makes its helper stop whatever is left there.
	 */
	for (int h = 0; h < j->nhosts; h++) {
		if (j->hosts[h].ssh_running)
			(void)kill(-j->hosts[h].ssh_pid, SIGKILL);
	}
	while (j->nssh > 0 && !kdeadline_passed(ssh_dl)) {
		struct pollfd p = { .fd = j->sfd, .events = POLLIN };
		struct signalfd_siginfo si[16];

		(void)poll(&p, 1, kdeadline_left_ms(ssh_dl, 50));
		while (read(j->sfd, si, sizeof(si)) > 0) {
		}
		reap_children(j);
	}
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

/*
 * The helper's way to start a rank: as posix_spawn would (own process group, khorrun's
 * signal mask, SIGPIPE default), plus PR_SET_PDEATHSIG, which posix_spawn cannot set: if
 * the helper itself is killed (kill -9, the OOM killer), its ranks die with it instead of
 * running on unwatched. The helper has one thread, so fork is safe. Returns 0 or exec's
 * errno, passed back on a CLOEXEC pipe.
 */
static int helper_fork_exec(struct job *j, pid_t *pid_out, const char *path, char **env,
                            int in, int out, int err_fd)
{
	int ep[2], e = 0;
	pid_t parent = getpid(), pid;
	ssize_t n;

	if (pipe2(ep, O_CLOEXEC) != 0)
		return errno;
	pid = fork();
	if (pid < 0) {
		e = errno;
		close(ep[0]);
		close(ep[1]);
		return e;
	}
	if (pid == 0) {
		(void)setpgid(0, 0);
		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127); /* the helper died before the line above */
		if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
		    dup2(err_fd, STDERR_FILENO) < 0)
			e = errno;
		if (e == 0) {
			signal(SIGPIPE, SIG_DFL);
			sigprocmask(SIG_SETMASK, &j->child_mask, NULL);
			execve(path, j->o.prog_argv, env);
			e = errno;
		}
		if (write(ep[1], &e, sizeof(e)) < 0) {
			/* nobody to tell */
		}
		_exit(127);
	}
	close(ep[1]);
	do
		n = read(ep[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(ep[0]);
	if (n == (ssize_t)sizeof(e)) {
		(void)waitpid(pid, NULL, 0);
		return e;
	}
	*pid_out = pid;
	return 0;
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
	if (j->helper)
		err = helper_fork_exec(j, &rk->pid, path, env, devnull, p[0][1], p[1][1]);
	else
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

/*
 * Starts the ranks of this host (in the helper: all of its ranks, whose identities khorrun
 * sent in hslots); on a failure stops those already running and records why.
 */
static void spawn_all(struct job *j, const char *path, char **fixed, size_t nfixed,
                      const sigset_t *child_mask, const cpubind_cpus *cpus, int first, int count,
                      char (*hslots)[NSLOTS][SLOT_LEN])
{
	char slots[NSLOTS][SLOT_LEN];
	char **env = NULL;
	posix_spawnattr_t attr;
	sigset_t def;
	int devnull;
	int err;
	char ebuf[128];

	j->child_mask = *child_mask;
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (devnull < 0) {
		err = errno;
		say("cannot open /dev/null for the ranks' stdin: %s",
		    kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail;
	}
	/* The slots are rewritten per rank, but build_env reads their names now. */
	fill_slots(slots, &j->ranks[first], first);
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

	for (int i = 0; i < count; i++) {
		int r = first + i;
		struct rank *rk = &j->ranks[r];

		if (hslots != NULL)
			memcpy(slots, hslots[i], sizeof(slots));
		else
			fill_slots(slots, rk, r);
		if (cpus != NULL)
			bind_next(cpus, count, i);
		err = spawn_rank(j, r, path, env, &attr, devnull);
		if (err != 0) {
			say("cannot start rank %d (%s): %s%s", rk->id, path,
			    kerr_errno_str(err, ebuf, sizeof(ebuf)),
			    err == EAGAIN || err == EMFILE || err == ENFILE
			            ? " (process or file limit reached; see ulimit -u / -n)"
			            : "");
			goto fail_destroy_attr;
		}
		if (j->helper)
			helper_sendf('P', "%d %d", rk->id, (int)rk->pid);
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
	if (j->nrunning > 0 && !j->stopping)
		begin_stop(j, SIGTERM);
}

/* ---- starting the ranks of another host -------------------------------------------------- */

/*
 * Splits --ssh-command into words as a shell would for plain words: blanks separate,
 * '...' and "..." quote, backslash escapes. No expansion. Returns a NULL-terminated
 * malloc'd vector with room for `extra` more entries, or NULL with the reason said.
 */
static char **split_command(const char *cmd, size_t extra, size_t *n_out)
{
	size_t len = strlen(cmd), n = 0, cap = len / 2 + 2 + extra;
	char **v = calloc(cap, sizeof(*v));
	char *buf = malloc(len + 1), *w;
	const char *p = cmd;

	if (v == NULL || buf == NULL) {
		free(v);
		free(buf);
		say("out of memory");
		return NULL;
	}
	/* One buffer holds every word; v[0] owns it. */
	w = buf;
	while (*p != '\0') {
		char q = 0;
		char *start = w;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '\0')
			break;
		while (*p != '\0' && (q != 0 || (*p != ' ' && *p != '\t'))) {
			if (q == 0 && (*p == '\'' || *p == '"')) {
				q = *p++;
			} else if (q != 0 && *p == q) {
				q = 0;
				p++;
			} else if (*p == '\\' && q != '\'' && p[1] != '\0') {
				*w++ = p[1];
				p += 2;
			} else {
				*w++ = *p++;
			}
		}
		if (q != 0) {
			say("--ssh-command '%s': unterminated %c quote", cmd, q);
			free(v);
			free(buf);
			return NULL;
		}
		*w++ = '\0';
		v[n++] = start;
	}
	if (n == 0) {
		free(v);
		free(buf);
		say("--ssh-command is empty");
		return NULL;
	}
	*n_out = n;
	return v;
}

/* "'...'" for sh, with ' written as '\'' */
static char *sh_quote(const char *s)
{
	size_t n = 3;
	char *out, *o;

	for (const char *p = s; *p; p++)
		n += *p == '\'' ? 4 : 1;
	out = malloc(n);
	if (out == NULL)
		return NULL;
	o = out;
	*o++ = '\'';
	for (const char *p = s; *p; p++) {
		if (*p == '\'') {
			memcpy(o, "'\\''", 4);
			o += 4;
		} else {
			*o++ = *p;
		}
	}
	*o++ = '\'';
	*o = '\0';
	return out;
}

/*
 * The ssh command line for host h: --ssh-command (or ssh) with khorrun's options, then the
 * host and the remote command. Nothing secret is on it. Returns a vector whose v[0]
 * owns the words from --ssh-command; the rest point into opts or static text, except the
 * last, the malloc'd remote command (freed by free_ssh_argv).
 */
static char **ssh_argv(const struct job *j, const struct host *h, const char *remote_cmd,
                       char *timeout_opt)
{
	size_t n;
	char **v = split_command(j->o.ssh_command != NULL ? j->o.ssh_command : "ssh", 16, &n);
	const char *base;

	if (v == NULL)
		return NULL;
	base = strrchr(v[0], '/') != NULL ? strrchr(v[0], '/') + 1 : v[0];
	/*
	 * For ssh itself: no tty (the frames are binary), never a password prompt that
	 * would hang the start, and a connect timeout within the start timeout. ssh takes the
	 * first value it sees for an option, so the user's own -o in --ssh-command win.
	 */
	if (strcmp(base, "ssh") == 0) {
		snprintf(timeout_opt, 48, "ConnectTimeout=%lld",
		         (long long)((j->o.start_timeout_ms + 999) / 1000));
		v[n++] = "-T";
		v[n++] = "-o";
		v[n++] = "BatchMode=yes";
		v[n++] = "-o";
		v[n++] = timeout_opt;
		/* A host that dies mid-job is noticed in about 30 s, not TCP's many minutes. */
		v[n++] = "-o";
		v[n++] = "ServerAliveInterval=10";
		v[n++] = "-o";
		v[n++] = "ServerAliveCountMax=3";
	}
	if (j->o.ssh_port != NULL) {
		v[n++] = "-p";
		v[n++] = (char *)j->o.ssh_port;
	}
	if (j->o.ssh_identity != NULL) {
		v[n++] = "-i";
		v[n++] = (char *)j->o.ssh_identity;
	}
	v[n++] = h->name;
	v[n++] = (char *)remote_cmd;
	v[n] = NULL;
	return v;
}

/*
 * The setup frames for h's helper: protocol, working directory, program, the
 * environment (forwarded variables, then khorrun's, which win), each rank's identity,
 * and "go". The secret travels here, on ssh's stdin, and nowhere else.
 */
static bool host_setup_frames(struct job *j, struct host *h, const char *cwd,
                              char **common, size_t ncommon)
{
	char buf[320];
	struct wbuf *b = &h->out;
	bool ok;

	snprintf(buf, sizeof(buf), "%s %d.%d.%d", HELPER_PROTO, KHOR_VERSION_MAJOR,
	         KHOR_VERSION_MINOR, KHOR_VERSION_PATCH);
	ok = frame_puts(b, 'H', buf) && frame_puts(b, 'C', cwd);
	for (char **a = j->o.prog_argv; ok && *a != NULL; a++)
		ok = frame_puts(b, 'A', *a);
	for (size_t i = 0; ok && environ != NULL && environ[i] != NULL; i++) {
		if ((strncmp(environ[i], "KHOR_", 5) == 0 || strncmp(environ[i], "HOROVOD_", 8) == 0) &&
		    strchr(environ[i], '=') != NULL)
			ok = frame_puts(b, 'V', environ[i]);
	}
	for (int i = 0; ok && i < j->o.nxnames; i++) {
		const char *v = getenv(j->o.xnames[i]);
		char *e;

		if (v == NULL)
			continue; /* as mpirun: an unset -x VAR forwards nothing */
		ok = asprintf(&e, "%s=%s", j->o.xnames[i], v) >= 0;
		if (ok) {
			ok = frame_puts(b, 'V', e);
			free(e);
		}
	}
	for (int i = 0; ok && i < j->o.nxvars; i++)
		ok = frame_puts(b, 'V', j->o.xvars[i]);
	for (size_t i = 0; ok && i < ncommon; i++)
		ok = frame_puts(b, 'V', common[i]);
	if (ok) {
		/* Always, for a host reached by its name: see main's comment on this host's own. */
		snprintf(buf, sizeof(buf), "KHOR_HOSTNAME=%s", h->name);
		ok = frame_puts(b, 'V', buf);
		snprintf(buf, sizeof(buf), "HOROVOD_HOSTNAME=%s", h->name);
		ok = ok && frame_puts(b, 'V', buf);
	}
	for (int r = h->first; ok && r < h->first + h->n; r++) {
		char slots[NSLOTS][SLOT_LEN], head[16];
		struct wbuf one = { 0 };

		fill_slots(slots, &j->ranks[r], r);
		snprintf(head, sizeof(head), "%d", r);
		ok = wbuf_put(&one, head, strlen(head) + 1);
		for (size_t k = 0; ok && k < NSLOTS; k++)
			ok = wbuf_put(&one, slots[k], strlen(slots[k]) + 1);
		ok = ok && frame_put(b, 'R', one.data, one.len, NULL, 0);
		free(one.data);
	}
	snprintf(buf, sizeof(buf), "%lld %d", (long long)j->o.grace_ms,
	         j->o.bind == CPUBIND_CORES ? 1 : 0);
	return ok && frame_puts(b, 'G', buf);
}

/*
 * Starts ssh to host h with its helper as the remote command and queues the setup frames.
 * Its ranks count as running from here until their host reports their end. ssh gets
 * khorrun's own environment (no secret in it) and a process group of its own, so that a
 * Ctrl-C in the terminal reaches khorrun, which forwards it, and not ssh, which would drop
 * the connection.
 */
static bool start_remote(struct job *j, struct host *h, const char *khorrun_path,
                         const char *cwd, char **common, size_t ncommon,
                         const sigset_t *child_mask)
{
	char ebuf[128], timeout_opt[48];
	char *qpath = sh_quote(khorrun_path), *remote_cmd = NULL;
	char **argv = NULL;
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, errp[2] = { -1, -1 };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t def;
	int err;

	if (qpath == NULL || asprintf(&remote_cmd, "exec %s --remote-helper", qpath) < 0) {
		remote_cmd = NULL;
		say("out of memory");
		goto fail;
	}
	argv = ssh_argv(j, h, remote_cmd, timeout_opt);
	if (argv == NULL)
		goto fail;
	h->rx = malloc(FRAME_MAX + FRAME_HDR);
	if (h->rx == NULL || !host_setup_frames(j, h, cwd, common, ncommon)) {
		say("out of memory for %s's start", h->name);
		goto fail;
	}
	if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
	    pipe2(errp, O_CLOEXEC) != 0) {
		say("cannot make pipes for ssh to %s: %s", h->name,
		    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		goto fail;
	}
	(void)fcntl(in[1], F_SETFL, O_NONBLOCK);
	(void)fcntl(out[0], F_SETFL, O_NONBLOCK);
	(void)fcntl(errp[0], F_SETFL, O_NONBLOCK);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	if ((err = posix_spawn_file_actions_init(&fa)) != 0) {
		say("posix_spawn_file_actions_init: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail;
	}
	if ((err = posix_spawnattr_init(&attr)) != 0) {
		posix_spawn_file_actions_destroy(&fa);
		say("posix_spawnattr_init: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail;
	}
	if ((err = posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, errp[1], STDERR_FILENO)) != 0 ||
	    (err = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
	                                                   POSIX_SPAWN_SETSIGDEF)) != 0 ||
	    (err = posix_spawnattr_setpgroup(&attr, 0)) != 0 ||
	    (err = posix_spawnattr_setsigmask(&attr, child_mask)) != 0 ||
	    (err = posix_spawnattr_setsigdefault(&attr, &def)) != 0 ||
	    (err = posix_spawnp(&h->ssh_pid, argv[0], &fa, &attr, argv, environ)) != 0) {
		posix_spawnattr_destroy(&attr);
		posix_spawn_file_actions_destroy(&fa);
		say("cannot start '%s' to reach %s: %s%s", argv[0], h->name,
		    kerr_errno_str(err, ebuf, sizeof(ebuf)),
		    err == ENOENT ? " (install openssh-client, or give --ssh-command)" : "");
		goto fail;
	}
	posix_spawnattr_destroy(&attr);
	posix_spawn_file_actions_destroy(&fa);
	close(in[0]);
	close(out[1]);
	close(errp[1]);
	h->to_fd = in[1];
	h->from_fd = out[0];
	h->err_fd = errp[0];
	h->ssh_running = true;
	j->nssh++;
	j->nhostfds += 2;
	for (int r = h->first; r < h->first + h->n; r++) {
		j->ranks[r].running = true;
		j->nrunning++;
	}
	if (!wbuf_flush(&h->out, h->to_fd)) {
		close(h->to_fd);
		h->to_fd = -1;
	}
	free(argv[0]);
	free(argv);
	free(remote_cmd);
	free(qpath);
	return true;

fail:
	for (int k = 0; k < 2; k++) {
		int *fds[3] = { &in[k], &out[k], &errp[k] };

		for (int f = 0; f < 3; f++) {
			if (*fds[f] >= 0)
				close(*fds[f]);
		}
	}
	if (argv != NULL)
		free(argv[0]);
	free(argv);
	free(remote_cmd);
	free(qpath);
	return false;
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
		if (rk->lost) {
			struct host *h = &j->hosts[rk->host];
			char st[96];

			describe_status(h->ssh_status, st, sizeof(st));
			say("rank %d on %s was lost first: its ssh connection ended (ssh %s%s%s) before "
			    "the rank's end was known", j->first_fail, h->name, st,
			    h->last_err[0] ? ": " : "", h->last_err);
			return 255;
		}
		describe_status(rk->wstatus, what, sizeof(what));
		if (j->multi)
			say("rank %d on %s (pid %d) failed first: %s", j->first_fail,
			    j->hosts[rk->host].name, rk->pid >= 0 ? (int)rk->pid : rk->rpid, what);
		else
			say("rank %d (pid %d) failed first: %s", j->first_fail, (int)rk->pid, what);
		return status_to_exit(rk->wstatus);
	}
	return 1;
}

/*
 * Blocks the signals we handle (before any thread exists, so every thread inherits the
 * mask and they all arrive at the signalfd instead of killing us halfway through a stop),
 * opens the signalfd and makes us a subreaper. Returns false with the reason said.
 */
static bool setup_signals(struct job *j, sigset_t *old_mask)
{
	sigset_t block;
	char ebuf[128];

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
	if (sigprocmask(SIG_BLOCK, &block, old_mask) != 0) {
		say("sigprocmask failed");
		return false;
	}
	j->sfd = signalfd(-1, &block, SFD_NONBLOCK | SFD_CLOEXEC);
	if (j->sfd < 0) {
		say("signalfd failed: %s", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		sigprocmask(SIG_SETMASK, old_mask, NULL);
		return false;
	}
	/* A closed stdout must not kill khorrun while ranks still run (see write_out). */
	signal(SIGPIPE, SIG_IGN);
	/* Orphans of the ranks come to us, not to init, so none outlives the job. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
		say("cannot become a child subreaper; processes the ranks leave behind may "
		    "outlive the job");
	return true;
}

/* Frees what init_ranks allocated and closes what the ranks left open. */
static void free_ranks(struct job *j)
{
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			if (j->ranks[r].out[k].fd >= 0)
				close(j->ranks[r].out[k].fd);
			if (j->ranks[r].out[k].file >= 0)
				close(j->ranks[r].out[k].file);
			free(j->ranks[r].out[k].buf);
		}
	}
	free(j->ranks);
	j->ranks = NULL;
}

/* Line buffers, prefixes and, with --output-filename, the files of all j->nstarted ranks. */
static bool init_ranks(struct job *j)
{
	char ebuf[128];

	for (int r = 0; r < j->nstarted; r++) {
		struct rank *rk = &j->ranks[r];

		rk->pid = -1;
		for (int k = 0; k < 2; k++) {
			rk->out[k].fd = -1;
			rk->out[k].file = -1;
			rk->out[k].which = k;
		}
	}
	if (j->o.output_dir != NULL && mkdir(j->o.output_dir, 0755) != 0 && errno != EEXIST) {
		say("--output-filename %s: %s", j->o.output_dir,
		    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		return false;
	}
	for (int r = 0; r < j->nstarted; r++) {
		struct rank *rk = &j->ranks[r];

		if (!j->o.no_prefix && !j->helper)
			rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ", rk->id);
		for (int k = 0; k < 2; k++) {
			rk->out[k].buf = malloc(LINE_BUF);
			if (rk->out[k].buf == NULL) {
				say("out of memory for %d ranks' output buffers", j->nstarted);
				return false;
			}
		}
		if (j->o.output_dir != NULL && !j->helper) {
			char dir[PATH_MAX], file[PATH_MAX + 16];

			snprintf(dir, sizeof(dir), "%s/rank.%d", j->o.output_dir, r);
			if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
				say("--output-filename: cannot make %s: %s", dir,
				    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
				return false;
			}
			for (int k = 0; k < 2; k++) {
				snprintf(file, sizeof(file), "%s/%s", dir, k == 0 ? "stdout" : "stderr");
				rk->out[k].file = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
				if (rk->out[k].file < 0) {
					say("--output-filename: cannot open %s: %s", file,
					    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
					return false;
				}
			}
		}
	}
	return true;
}

/* ---- the helper: `khorrun --remote-helper`, run by ssh on another host ------------------- */

/*
 * How long the helper waits for khorrun's start-up frames: khorrun sends them as soon as
 * ssh is up and gives up itself after --start-timeout (30 s by default), closing the
 * connection; this bounds a connection that stays open but silent.
 */
#define HELPER_START_MS (10 * 60 * 1000)

/* n bytes from fd, up to dl (a silent peer is an error, like a closed one). */
static bool read_full(int fd, void *buf, size_t n, kdeadline dl)
{
	char *p = buf;

	while (n > 0) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int pr = poll(&pfd, 1, kdeadline_left_ms(dl, 1000));

		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0 || (pr == 0 && kdeadline_passed(dl)))
			return false;
		if (pr == 0)
			continue;
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

/* One frame from stdin, up to dl; its payload NUL-terminated in buf (FRAME_MAX + 1). */
static bool read_frame(char *type_out, char *buf, size_t *len_out, kdeadline dl)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t n;

	if (!read_full(STDIN_FILENO, hdr, sizeof(hdr), dl))
		return false;
	n = frame_get_u32(hdr + 1);
	if (n > FRAME_MAX || !read_full(STDIN_FILENO, buf, n, dl))
		return false;
	buf[n] = '\0';
	*type_out = (char)hdr[0];
	*len_out = n;
	return true;
}

/*
 * The far side of one ssh connection: reads what khorrun sends (see host_setup_frames),
 * starts this host's ranks as khorrun would start local ones, and reports their output and
 * ends as frames until all are gone. Its ranks are stopped when khorrun says so, and when
 * the session ends (EOF on stdin). Its messages go to khorrun as frames too (say()).
 */
static int helper_main(void)
{
	struct job job;
	struct job *j = &job;
	char *buf = malloc(FRAME_MAX + 1), *path = NULL, *cwd = NULL, hostname[256] = "";
	char **argv = NULL, *fixed[1];
	char (*hslots)[NSLOTS][SLOT_LEN] = NULL;
	size_t nfixed = 0, nargv = 0;
	int nranks = 0, rc = 1, bindm = 0;
	bool go = false, proto_ok = false;
	long long grace = DEFAULT_GRACE_MS;
	sigset_t old_mask;
	cpubind_cpus cpus = { 0 };
	char ebuf[128];

	memset(j, 0, sizeof(*j));
	j->helper = true;
	j->sfd = -1;
	j->first_fail = -1;
	say_as_frame = true;
	signal(SIGPIPE, SIG_IGN);
	if (write(STDOUT_FILENO, helper_magic, HELPER_MAGIC_LEN) != (ssize_t)HELPER_MAGIC_LEN ||
	    buf == NULL)
		return 1;
	(void)gethostname(hostname, sizeof(hostname) - 1);
	const kdeadline start_dl = kdeadline_in_ms(HELPER_START_MS);
	while (!go) {
		char type;
		size_t n;

		if (!read_frame(&type, buf, &n, start_dl))
			goto out; /* khorrun went away (or fell silent) before "go": nothing started */
		switch (type) {
		case 'H': {
			char mine[128];

			snprintf(mine, sizeof(mine), "%s %d.%d.%d", HELPER_PROTO, KHOR_VERSION_MAJOR,
			         KHOR_VERSION_MINOR, KHOR_VERSION_PATCH);
			if (strcmp(buf, mine) != 0) {
				say("the khorrun here (%s) is not the one that started the job (%s); "
				    "install the same khor on every host", mine, buf);
				helper_sendf('F', "1");
				goto out;
			}
			proto_ok = true;
			break;
		}
		case 'C':
			free(cwd);
			cwd = strdup(buf);
			break;
		case 'A': {
			char **a = realloc(argv, (nargv + 2) * sizeof(*argv));

			if (a == NULL)
				goto out;
			argv = a;
			argv[nargv++] = strdup(buf);
			argv[nargv] = NULL;
			break;
		}
		case 'V': {
			char *e = strdup(buf);

			/* The secret among them: only this process and the ranks hold it. */
			if (e == NULL || strchr(e, '=') == NULL || putenv(e) != 0)
				free(e);
			break;
		}
		case 'R': {
			void *p = realloc(hslots, (size_t)(nranks + 1) * sizeof(*hslots));
			const char *q = buf + strlen(buf) + 1;

			if (p == NULL || nranks >= MAX_RANKS)
				goto out;
			hslots = p;
			memset(hslots[nranks], 0, sizeof(hslots[nranks]));
			for (size_t k = 0; k < NSLOTS && q < buf + n; k++) {
				kstrlcpy(hslots[nranks][k], q, SLOT_LEN);
				q += strlen(q) + 1;
			}
			nranks++;
			/* The rank's id is the frame's first word; ranks are kept in that order. */
			break;
		}
		case 'G':
			if (sscanf(buf, "%lld %d", &grace, &bindm) < 1)
				grace = DEFAULT_GRACE_MS;
			go = true;
			break;
		default:
			break;
		}
	}
	if (!proto_ok || argv == NULL || cwd == NULL || nranks == 0) {
		say("incomplete start-up from khorrun");
		helper_sendf('F', "1");
		goto out;
	}
	if (chdir(cwd) != 0) {
		say("cannot cd to %s on %s: %s (the ranks run in khorrun's working directory)", cwd,
		    hostname, kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		helper_sendf('F', "1");
		goto out;
	}
	j->o.prog_argv = argv;
	j->o.grace_ms = grace;
	j->o.np = nranks;
	rc = resolve_program(argv[0], &path);
	if (rc != 0) {
		helper_sendf('F', "%d", rc);
		rc = 1;
		goto out;
	}
	rc = 1;
	if (cpubind_load(&cpus) == 0 && cpus.n > 0 &&
	    asprintf(&fixed[0], "KHOR_LOCAL_CPUS=%d", cpus.n) >= 0)
		nfixed = 1;
	if (!ensure_fd_limit(nranks) || !setup_signals(j, &old_mask)) {
		helper_sendf('F', "1");
		goto out;
	}
	j->ranks = calloc((size_t)nranks, sizeof(*j->ranks));
	if (j->ranks == NULL) {
		helper_sendf('F', "1");
		goto out_signals;
	}
	j->nstarted = nranks;
	for (int i = 0; i < nranks; i++)
		j->ranks[i].id = atoi(hslots[i][0] + strlen("KHOR_RANK="));
	if (!init_ranks(j)) {
		helper_sendf('F', "1");
		goto out_ranks;
	}
	spawn_all(j, path, fixed, nfixed, &old_mask,
	          bindm == 1 && cpus.n > 0 ? &cpus : NULL, 0, nranks, hslots);
	if (j->cause == CAUSE_SPAWN)
		helper_sendf('F', "%d", j->spawn_exit);
	else
		helper_send('Y', NULL, 0, NULL, 0);
	(void)fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
	j->stdin_open = true;
	run_loop(j);
	sweep_leftovers(j);
	helper_send('D', NULL, 0, NULL, 0);
	rc = 0;
out_ranks:
	free_ranks(j);
out_signals:
	close(j->sfd);
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
out:
	if (nfixed > 0)
		free(fixed[0]);
	cpubind_free(&cpus);
	for (size_t i = 0; i < nargv; i++)
		free(argv[i]);
	free(argv);
	free(hslots);
	free(cwd);
	free(path);
	free(buf);
	return rc;
}

/* ---- main -------------------------------------------------------------------------------- */

/* --dry-run: where each rank would run, and how each other host would be reached. */
static void print_placement(const struct job *j, const char *khorrun_path)
{
	char ranks[48], timeout_opt[48];

	printf("%d rank%s on %d host%s\n", j->o.np, j->o.np == 1 ? "" : "s", j->nhosts,
	       j->nhosts == 1 ? "" : "s");
	for (int i = 0; i < j->nhosts; i++) {
		const struct host *h = &j->hosts[i];

		rank_range(h, ranks, sizeof(ranks));
		printf("host %s: %s (%d of %d slots), %s\n", h->name, ranks, h->n, h->slots,
		       h->local ? "here" : "over ssh");
		if (!h->local) {
			char *q = sh_quote(khorrun_path), *cmd = NULL;
			char **v;

			if (q != NULL && asprintf(&cmd, "exec %s --remote-helper", q) >= 0 &&
			    (v = ssh_argv(j, h, cmd, timeout_opt)) != NULL) {
				printf("  command:");
				for (char **a = v; *a != NULL; a++)
					printf(" %s", *a);
				printf("\n");
				free(v[0]);
				free(v);
			}
			free(cmd);
			free(q);
		}
	}
	for (int r = 0; r < j->o.np; r++) {
		const struct rank *rk = &j->ranks[r];

		printf("rank %d: host %s local_rank %d local_size %d cross_rank %d cross_size %d\n", r,
		       j->hosts[rk->host].name, rk->lrank, rk->lsize, rk->xrank, rk->xsize);
	}
}

/*
 * Where the store listens and what address the ranks are told. All ranks here: as asked
 * (127.0.0.1 by default), a wildcard reached through loopback. With other hosts: as asked,
 * a wildcard or nothing asked meaning this host's address on the route to the first other
 * host. Returns false with the reason said.
 */
static bool store_address(struct job *j, char *bind_out, size_t blen, char *adv_out,
                          size_t alen)
{
	const char *want = j->o.bind_host;
	bool wild = strcmp(want, "0.0.0.0") == 0 || strcmp(want, "*") == 0 ||
	            strcmp(want, "::") == 0;
	const struct host *first = NULL;
	char why[300];

	for (int i = 0; i < j->nhosts && first == NULL; i++) {
		if (!j->hosts[i].local)
			first = &j->hosts[i];
	}
	kstrlcpy(bind_out, strcmp(want, "*") == 0 ? "0.0.0.0" : want, blen);
	if (first == NULL) {
		kstrlcpy(adv_out, !wild ? want : strcmp(want, "::") == 0 ? "::1" : "127.0.0.1", alen);
		return true;
	}
	if (j->o.bind_given && !wild) {
		struct in6_addr a6;
		struct in_addr a4;

		if ((inet_pton(AF_INET, want, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
		    (inet_pton(AF_INET6, want, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)) ||
		    strcmp(want, "localhost") == 0) {
			say("--bind-store %s is loopback, which %s cannot reach; give an address of "
			    "this host that the other hosts reach, or leave --bind-store out", want,
			    first->name);
			return false;
		}
		kstrlcpy(adv_out, want, alen);
		return true;
	}
	if (!route_source(first->name, adv_out, alen, why, sizeof(why))) {
		/*
		 * A name only ssh knows (an alias of ~/.ssh/config) or no route from here: listen
		 * everywhere and give the ranks this host's name, which on a cluster they resolve.
		 * If the host really cannot be reached, ssh says so next.
		 */
		if (gethostname(adv_out, alen - 1) != 0 || adv_out[0] == '\0') {
			say("cannot find this host's address toward %s for the rendezvous store: %s; "
			    "give --bind-store with an address of this host that every host reaches",
			    first->name, why);
			return false;
		}
		adv_out[alen - 1] = '\0';
		KLOG_INFO("khorrun: %s; the store listens on every address and the ranks reach it "
		          "by this host's name, %s (--bind-store ADDR chooses)", why, adv_out);
		if (!j->o.bind_given)
			kstrlcpy(bind_out, "0.0.0.0", blen);
		return true;
	}
	if (!j->o.bind_given)
		kstrlcpy(bind_out, adv_out, blen);
	return true;
}

int main(int argc, char **argv)
{
	struct job job;
	struct job *j = &job;
	char secret[65], job_id[80], store_addr[300], hostname[256], bind_addr[256], adv[256];
	char self_path[PATH_MAX], cwd[PATH_MAX];
	char *fixed[MAX_FIXED];
	size_t nfixed = 0, ncommon;
	bool ok = true;
	char *path = NULL;
	sigset_t old_mask;
	store_server *srv = NULL;
	kerr err;
	uint8_t rnd[4];
	cpubind_cpus cpus = { 0 };
	bool bind = false, have_cpus = false;
	int rc, lh = -1;
	ssize_t sl;

	memset(j, 0, sizeof(*j));
	j->sfd = -1;
	j->first_fail = -1;
	klog_init_from_env();
	if (!ensure_std_fds())
		return 1;
	if (argc == 2 && strcmp(argv[1], "--remote-helper") == 0)
		return helper_main();
	rc = parse_args(argc, argv, &j->o);
	if (rc >= 0)
		goto out_free_opts;
	rc = place_ranks(j);
	if (rc >= 0)
		goto out_free_hosts;
	j->nstarted = j->o.np;
	for (int i = 0; i < j->nhosts; i++) {
		if (j->hosts[i].local)
			lh = i;
	}
	for (int r = 0; r < j->o.np; r++)
		j->ranks[r].id = r;
	sl = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
	self_path[sl > 0 ? sl : 0] = '\0';
	if (j->o.remote_khorrun != NULL)
		kstrlcpy(self_path, j->o.remote_khorrun, sizeof(self_path));
	if (j->o.dry_run) {
		print_placement(j, self_path);
		rc = 0;
		goto out_free_hosts;
	}
	rc = 1;
	if (j->nremote > 0 && getcwd(cwd, sizeof(cwd)) == NULL) {
		char ebuf[128];

		say("cannot tell the working directory for the other hosts: %s",
		    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		goto out_free_hosts;
	}
	/* The program is looked up here only for ranks here; each helper looks for its own. */
	if (lh >= 0) {
		rc = resolve_program(j->o.prog_argv[0], &path);
		if (rc != 0)
			goto out_free_hosts;
	}
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
	if (!ensure_fd_limit(j->o.np + j->nhosts + (j->o.output_dir != NULL ? j->o.np : 0)))
		goto out_free_path;
	if (!setup_signals(j, &old_mask))
		goto out_free_path;

	if (!kauth_new_secret(secret) || !kauth_random(rnd, sizeof(rnd))) {
		say("cannot get random bytes for the job secret (getrandom failed)");
		goto out_close_sfd;
	}
	if (j->o.job_id != NULL)
		kstrlcpy(job_id, j->o.job_id, sizeof(job_id));
	else
		snprintf(job_id, sizeof(job_id), "khor-%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
		         rnd[3]);

	if (!store_address(j, bind_addr, sizeof(bind_addr), adv, sizeof(adv)))
		goto out_close_sfd;
	kerr_clear(&err);
	if (store_server_start(bind_addr, j->o.store_port, secret, job_id, &srv, &err) !=
	    KHOR_SUCCESS) {
		say("cannot start the rendezvous store on %s:%u: %s%s", bind_addr,
		    (unsigned)j->o.store_port, err.text,
		    j->o.store_port != 0 ? " (is the port in use? --store-port 0 picks a free one)"
		                         : "");
		goto out_close_sfd;
	}
	if (strchr(adv, ':') != NULL)
		snprintf(store_addr, sizeof(store_addr), "[%s]:%u", adv,
		         (unsigned)store_server_port(srv));
	else
		snprintf(store_addr, sizeof(store_addr), "%s:%u", adv,
		         (unsigned)store_server_port(srv));
	if (j->nremote > 0)
		KLOG_INFO("khorrun: the rendezvous store listens on %s:%u, the ranks reach it at %s",
		          bind_addr, (unsigned)store_server_port(srv), store_addr);

	if (!init_ranks(j))
		goto out_free_ranks;

	/* The same in every rank, on every host; the identity of each is in its slots. */
	for (size_t p = 0; p < NPREFIXES && ok; p++)
		ok = add_fixed(fixed, &nfixed, "%sSIZE=%d", id_prefixes[p], j->o.np);
	if (!ok || !add_fixed(fixed, &nfixed, "KHOR_STORE_ADDR=%s", store_addr) ||
	    !add_fixed(fixed, &nfixed, "KHOR_SECRET=%s", secret) ||
	    !add_fixed(fixed, &nfixed, "KHOR_JOB_ID=%s", job_id) ||
	    !add_fixed(fixed, &nfixed, "KHOR_LAUNCHER=khorrun") ||
	    (j->o.timeout != NULL && !add_fixed(fixed, &nfixed, "KHOR_TIMEOUT=%s", j->o.timeout))) {
		say("out of memory building the ranks' environment");
		goto out_free_fixed;
	}
	ncommon = nfixed;
	/*
	 * This host's own. With several hosts the ranks are told which host they are on by
	 * its name as given: khor groups ranks into hosts by KHOR_HOSTNAME, and this way its
	 * grouping is khorrun's placement even where hosts share a name (containers).
	 */
	if (j->multi && lh >= 0)
		kstrlcpy(hostname, j->hosts[lh].name, sizeof(hostname));
	else
		rank_hostname(&j->o, hostname, sizeof(hostname));
	if (!add_fixed(fixed, &nfixed, "HOROVOD_HOSTNAME=%s", hostname) ||
	    (j->multi && !add_fixed(fixed, &nfixed, "KHOR_HOSTNAME=%s", hostname)) ||
	    (have_cpus && !add_fixed(fixed, &nfixed, "KHOR_LOCAL_CPUS=%d", cpus.n))) {
		say("out of memory building the ranks' environment");
		goto out_free_fixed;
	}

	/* Other hosts first: their ssh connections take longest. */
	j->start_dl = kdeadline_in_ms(j->o.start_timeout_ms);
	for (int i = 0; i < j->nhosts; i++) {
		struct host *h = &j->hosts[i];

		if (h->local)
			continue;
		if (!start_remote(j, h, self_path, cwd, fixed, ncommon, &old_mask)) {
			host_start_failed(j, h, 1);
			break;
		}
	}
	if (lh >= 0 && j->cause == CAUSE_NONE)
		spawn_all(j, path, fixed, nfixed, &old_mask, bind ? &cpus : NULL, j->hosts[lh].first,
		          j->hosts[lh].n, NULL);
	run_loop(j);
	sweep_leftovers(j);
	rc = report(j);

out_free_fixed:
	for (size_t i = 0; i < nfixed; i++)
		free(fixed[i]);
out_free_ranks:
	free_ranks(j);
	store_server_stop(srv);
out_close_sfd:
	close(j->sfd);
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
out_free_path:
	cpubind_free(&cpus);
	free(path);
out_free_hosts:
	for (int i = 0; i < j->nhosts; i++) {
		free(j->hosts[i].name);
		free(j->hosts[i].out.data);
		free(j->hosts[i].rx);
		free(j->hosts[i].early);
		for (int k = 0; k < 3; k++) {
			int fd = k == 0 ? j->hosts[i].to_fd : k == 1 ? j->hosts[i].from_fd
			                                              : j->hosts[i].err_fd;

			if (fd >= 0)
				close(fd);
		}
	}
	free(j->hosts);
	free(j->ranks);
out_free_opts:
	free(j->o.xvars);
	free(j->o.xnames);
	free(j->o.host_args);
	return rc;
}
