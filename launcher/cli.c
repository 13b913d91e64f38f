/*
 * cli.c -- khorrun's command line. Every option is checked here, before anything starts,
 * and a bad one is named with what it wants, followed by the usage (exit status 2).
 */
#include "cli.h"

#include "base/err.h"
#include "base/log.h"
#include "base/parse.h"
#include "khor.h"
#include "runtime/config.h"
#include "checkbuild.h"
#include "elastic_plan.h"
#include "say.h"
#include "tuning.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	        "                       DIR/rank.N/stdout and DIR/rank.N/stderr (on this host),\n"
	        "                       N zero-padded to the digits of the last rank (rank.07)\n"
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
	        "  -p, --ssh-port PORT  ssh -p PORT\n"
	        "  -i, --ssh-identity-file FILE  ssh -i FILE (also --ssh-identity)\n"
	        "  --start-timeout DURATION  time for every host to start its ranks (default 30s)\n"
	        "  --remote-khorrun PATH  khorrun on the other hosts (default: this one's path)\n"
	        "  --dry-run            print where each rank would run and exit\n"
	        "\n"
	        "elastic jobs (on with --min-np, --max-np or --host-discovery-script; the ranks\n"
	        "must call khor_init again after a KHOR_ERR_MEMBERSHIP: docs/ELASTIC.md):\n"
	        "  --min-np N, --min-num-proc N  fewest ranks to train with (default -np); with\n"
	        "                       fewer slots the job waits for hosts (--elastic-timeout)\n"
	        "  --max-np N, --max-num-proc N  most ranks (default: every slot there is)\n"
	        "  -np N                the first generation starts once N slots are there\n"
	        "                       (default --min-np); it takes every slot up to --max-np\n"
	        "  --host-discovery-script CMD  prints the hosts there are now, HOST or HOST:SLOTS\n"
	        "                       a line; run by /bin/sh every second; its first failure\n"
	        "                       ends the job, later ones are said and retried. Without\n"
	        "                       it the hosts are those of -H, --hostfile or Slurm, else\n"
	        "                       localhost with --max-np (else -np) slots\n"
	        "  --host-discovery-timeout DURATION  how long one run of it may take (10s)\n"
	        "  --slots-per-host N   slots of a discovered host given without :SLOTS (1)\n"
	        "  --reset-limit N      fail (status 3) when the job would need more than N new\n"
	        "                       generations after its first\n"
	        "  --blacklist-cooldown-range MIN MAX  seconds a failed host stays out: MIN*2^k\n"
	        "                       plus up to MIN more, within MIN..MAX (k: its failures);\n"
	        "                       without it, a failed host is out for good\n"
	        "  --elastic-timeout DURATION  how long to wait for --min-np slots (default\n"
	        "                       KHOR_ELASTIC_TIMEOUT, else 600s); failing names why\n"
	        "  A rank that exits non-zero, is killed, or whose heartbeat stalls for\n"
	        "  KHOR_HEARTBEAT_TIMEOUT (khorrun kills it first) ends its generation: with\n"
	        "  ranks on several hosts its host is blacklisted and its other ranks dropped;\n"
	        "  on one host a fresh rank takes its slot. The survivors go on in the next\n"
	        "  generation. A rank that exits 0 starts the job's end: no new generation, and\n"
	        "  once every rank has exited 0, so does khorrun. Each rank gets KHOR_ELASTIC=1,\n"
	        "  HOROVOD_ELASTIC=1, KHOR_WORKER_ID=HOST:SLOT, KHOR_HOSTNAME=HOST (the name as\n"
	        "  given; every name of this host runs here, without ssh) and its rank and sizes\n"
	        "  in the generation it starts in; its output lines start \"[HOST:SLOT] \".\n"
	        "\n"
	        "elastic jobs over etcd: one khorrun per host, each its host's agent, all with\n"
	        "the same options (as torchrun's agents); no khorrun is the job's own:\n"
	        "  --rdzv-backend etcd  meet in etcd (its JSON gateway; no TLS or etcd users)\n"
	        "  --rdzv-endpoint HOST:PORT  etcd's client port, the job's store\n"
	        "  --rdzv-id JOB        the job, the same on every host\n"
	        "  --rdzv-host NAME     this host's name in the job (default: its host name)\n"
	        "  --rdzv-ttl SECONDS   the agent's etcd lease (10): an agent not heard from for\n"
	        "                       so long is gone, and its workers with it\n"
	        "  Each agent offers --slots-per-host slots; one of them, elected in etcd, plans\n"
	        "  the generations by the rules above; when it dies another takes over. -np,\n"
	        "  --min-np and --max-np count ranks of the whole job.\n"
	        "\n"
	        "horovodrun's tuning flags (each sets a variable in every rank; the names\n"
	        "without --no- form set 1, their --no- forms 0; a flag wins over the file):\n");
	tuning_usage(f);
	fprintf(f,
	        "  --config-file FILE   horovodrun's YAML: controller, and the sections params,\n"
	        "                       autotune, timeline, stall_check, library_options and\n"
	        "                       logging with the keys of the flags above (fusion_threshold_mb,\n"
	        "                       enabled, log_file, filename, mark_cycles, ...); a key it\n"
	        "                       does not know is an error naming its line\n"
	        "  --verbose            khorrun says more (its own log at info)\n"
	        "  -cb, --check-build   print what this khor was built with and exit\n"
	        "  --gloo, --disable-cache  taken and ignored (khorrun is always \"gloo\", and has\n"
	        "                       no checks to cache); --mpi, --jsrun, --mpi-args and\n"
	        "                       --binding-args are refused: khor has no MPI\n"
	        "  -np, --num-proc, -H, --hosts, -hostfile, -v (--version): horovodrun's names\n"
	        "\n"
	        "  -h, --help           show this help\n"
	        "  --help-env           list the KHOR_* variables the ranks read\n"
	        "  --version, -v        print the version\n"
	        "\n"
	        "Each rank gets KHOR_RANK, KHOR_SIZE, KHOR_LOCAL_RANK, KHOR_LOCAL_SIZE,\n"
	        "KHOR_CROSS_RANK, KHOR_CROSS_SIZE, KHOR_LOCAL_CPUS, KHOR_STORE_ADDR, KHOR_SECRET,\n"
	        "KHOR_JOB_ID, KHOR_LAUNCHER=khorrun and the KHOR_HEARTBEAT_TIMEOUT and\n"
	        "KHOR_HEARTBEAT_INTERVAL khorrun watches them with (a rank whose heartbeat stops\n"
	        "for that long is killed) on top of khorrun's own environment, and\n"
	        "for Horovod scripts HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK,\n"
	        "HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE (the same values)\n"
	        "and HOROVOD_HOSTNAME (KHOR_HOSTNAME as the ranks see it, else this host's name).\n"
	        "Every rank gets khorrun's whole environment under those and the -x ones, and\n"
	        "PYTHONUNBUFFERED=1 unless it is set. On other hosts the ranks get it on top of\n"
	        "their login environment, less what stays on its own host: HOSTNAME, HOME, USER,\n"
	        "LOGNAME, SHELL, MAIL, SSH_*, DISPLAY, XAUTHORITY, WAYLAND_DISPLAY, TERM,\n"
	        "TERMCAP, COLORTERM, TMUX, TMUX_PANE, STY, WINDOWID, OLDPWD, SHLVL, _, XDG_*,\n"
	        "DBUS_SESSION_BUS_ADDRESS, KRB5CCNAME, BASH_FUNC_*, *CUDA_VISIBLE_DEVICES (-x\n"
	        "VAR sends one of those anyway); with KHOR_HOSTNAME = the host's name as given;\n"
	        "they run in khorrun's working directory.\n"
	        "Ranks read stdin from /dev/null. Exit status: the first failed rank's\n"
	        "(128+signal if killed), 130/143 when interrupted by SIGINT/SIGTERM, 2 for a bad\n"
	        "command line, 127 when the program is not found, 126 when it cannot be run,\n"
	        "1 when a host cannot be reached or does not start its ranks in time.\n"
	        "Elastic jobs: 0 when every rank of the last generation exited 0; 1 when the job\n"
	        "cannot go on (every host blacklisted, every rank of a generation lost, no\n"
	        "--min-np slots within --elastic-timeout, the discovery script's first run\n"
	        "failed, no host of the last generation left);\n"
	        "3 when --reset-limit is exceeded; a rank's own status (as above) when it fails\n"
	        "after another exited 0.\n");
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

int cli_bad_usage(const char *fmt, ...)
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
		"--min-np", "--min-num-proc", "--max-np", "--max-num-proc", "--host-discovery-script",
		"--host-discovery-timeout", "--slots-per-host", "--reset-limit", "--elastic-timeout",
		"--blacklist-cooldown-range", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
		"--rdzv-host", "--rdzv-ttl",
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
			return cli_bad_usage("--bind-store wants ADDR, ADDR:PORT or [V6ADDR]:PORT, not '%s'",
			                     val);
		memcpy(host, val + 1, (size_t)(end - val - 1));
		host[end - val - 1] = '\0';
		if (end[1] == ':')
			port = end + 2;
	} else {
		const char *c = strchr(val, ':');

		if (c != NULL && strchr(c + 1, ':') == NULL) {
			if ((size_t)(c - val) >= sizeof(host) || c == val)
				return cli_bad_usage("--bind-store wants ADDR or ADDR:PORT, not '%s'", val);
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
			return cli_bad_usage("--bind-store: the port wants a number from 0 to 65535, not "
			                     "'%s'", port);
		o->store_port = (uint16_t)v;
	}
	o->bind_host = host;
	o->bind_given = true;
	return -1;
}

/* A count option (--min-np 2): false with the usage said. */
static bool parse_count(const char *name, const char *val, int lo, int hi, int *out)
{
	int64_t v;

	if (!kparse_i64(val, &v) || v < lo || v > hi) {
		cli_bad_usage("%s wants a number from %d to %d, not '%s'", name, lo, hi, val);
		return false;
	}
	*out = (int)v;
	return true;
}

/* --blacklist-cooldown-range MIN MAX: whole seconds, within Horovod's bounds. */
static int parse_cooldown(const char *lo, const char *hi, struct opts *o)
{
	int a, b;

	if (!parse_count("--blacklist-cooldown-range MIN", lo, EP_COOLDOWN_MIN_S, EP_COOLDOWN_MAX_S,
	                 &a) ||
	    !parse_count("--blacklist-cooldown-range MAX", hi, EP_COOLDOWN_MIN_S, EP_COOLDOWN_MAX_S,
	                 &b))
		return 2;
	if (a > b)
		return cli_bad_usage("--blacklist-cooldown-range wants MIN <= MAX, not %d %d", a, b);
	o->cool_min_ms = (int64_t)a * 1000;
	o->cool_max_ms = (int64_t)b * 1000;
	return -1;
}

/* An etcd job's agent: what it needs, and what it cannot take (the hosts are the agents). */
static int check_rdzv(struct opts *o)
{
	bool any = o->rdzv_backend != NULL || o->rdzv_endpoint != NULL || o->rdzv_id != NULL ||
	           o->rdzv_host != NULL;

	if (!any)
		return -1;
	if (o->rdzv_backend == NULL || strcmp(o->rdzv_backend, "etcd") != 0)
		return cli_bad_usage("--rdzv-endpoint, --rdzv-id and --rdzv-host go with "
		                     "--rdzv-backend etcd (the one backend there is)");
	if (o->rdzv_endpoint == NULL || o->rdzv_id == NULL)
		return cli_bad_usage("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT (etcd's "
		                     "client port) and --rdzv-id JOB (the same on every host)");
	if (o->nhost_args > 0 || o->hostfile != NULL || o->discovery != NULL)
		return cli_bad_usage("an etcd job's hosts are its agents, one khorrun per host: "
		                     "-H, --hostfile and --host-discovery-script do not go with "
		                     "--rdzv-backend");
	if (o->np == 0 && o->min_np == 0)
		o->min_np = 1;
	o->elastic = true;
	return -1;
}

/* The elastic options once all are read: what goes with what, and the defaults. */
static int check_elastic(struct opts *o)
{
	int rc = check_rdzv(o);

	if (rc >= 0)
		return rc;
	o->elastic = o->elastic || o->min_np > 0 || o->max_np > 0 || o->discovery != NULL;
	if (!o->elastic) {
		if (o->reset_limit >= 0 || o->cool_min_ms > 0 || o->elastic_timeout_ms >= 0)
			return cli_bad_usage("--reset-limit, --blacklist-cooldown-range and "
			                     "--elastic-timeout are for elastic jobs: give --min-np, "
			                     "--max-np or --host-discovery-script too");
		return -1;
	}
	if (o->discovery != NULL && (o->nhost_args > 0 || o->hostfile != NULL))
		return cli_bad_usage("--host-discovery-script and %s both name the hosts; give one "
		                     "of them", o->hostfile != NULL ? "--hostfile" : "-H");
	bool np_given = o->np > 0;

	if (o->np == 0 && o->min_np == 0)
		return cli_bad_usage("an elastic job needs -np N or --min-np N");
	if (o->min_np == 0)
		o->min_np = o->np;
	if (o->np == 0)
		o->np = o->min_np;
	if (o->np < o->min_np)
		return cli_bad_usage("-np %d is less than --min-np %d", o->np, o->min_np);
	if (o->max_np > 0 && o->max_np < o->np)
		return cli_bad_usage("--max-np %d is less than -np %d%s", o->max_np, o->np,
		                     np_given ? "" : " (-np defaults to --min-np)");
	if (o->bind == CPUBIND_CORES)
		return cli_bad_usage("--bind cores is for fixed jobs: an elastic job's ranks per "
		                     "host change from one generation to the next");
	if (o->dry_run)
		return cli_bad_usage("--dry-run shows a fixed job's placement; an elastic job's "
		                     "comes from the hosts there are when it runs");
	return -1;
}

/*
 * Parses argv into o. Returns -1 to go on, or the exit status to exit with (0 after --help
 * or --version, 2 after a bad command line, which it has explained on stderr).
 */
int cli_parse(int argc, char **argv, struct opts *o)
{
	int i;
	bool check_build = false;

	memset(o, 0, sizeof(*o));
	o->bind_host = "127.0.0.1";
	o->grace_ms = DEFAULT_GRACE_MS;
	o->start_timeout_ms = DEFAULT_START_TIMEOUT_MS;
	o->bind = CPUBIND_NONE;
	o->slots_per_host = 1;
	o->reset_limit = -1;
	o->elastic_timeout_ms = -1;
	o->discovery_timeout_ms = 10000;
	o->rdzv_ttl_s = 10;
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
				return cli_bad_usage("unknown option '%s'", a);
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = '\0';
			val = eq + 1;
		} else {
			kstrlcpy(name, a, sizeof(name));
		}

		/* horovodrun's names for khorrun's options. */
		{
			static const char *const alias[][2] = {
				{ "-p", "--ssh-port" },        { "-i", "--ssh-identity" },
				{ "--ssh-identity-file", "--ssh-identity" },
				{ "--num-proc", "-np" },       { "--hosts", "-H" },
				{ "-hostfile", "--hostfile" }, { "-v", "--version" },
				{ "-cb", "--check-build" },
			};

			for (size_t k = 0; k < sizeof(alias) / sizeof(alias[0]); k++) {
				if (strcmp(name, alias[k][0]) == 0) {
					kstrlcpy(name, alias[k][1], sizeof(name));
					break;
				}
			}
		}
		if (strcmp(name, "--check-build") == 0 || strcmp(name, "--verbose") == 0 ||
		    strcmp(name, "--gloo") == 0 || strcmp(name, "--disable-cache") == 0) {
			if (val != NULL)
				return cli_bad_usage("%s takes no value", name);
			if (name[2] == 'c')
				check_build = true;
			else if (name[2] == 'v')
				o->verbose = true;
			continue;
		}
		if (strcmp(name, "--mpi") == 0 || strcmp(name, "--jsrun") == 0 ||
		    strcmp(name, "--mpi-args") == 0 || strcmp(name, "--binding-args") == 0)
			return cli_bad_usage("%s: khor has no MPI; khorrun starts the ranks itself "
			                     "(horovodrun's --gloo way)", name);
		{
			bool tv;

			if (tuning_knows(name, &tv)) {
				if (!tv && val != NULL)
					return cli_bad_usage("%s takes no value", name);
				if (tv && val == NULL) {
					if (i + 1 >= argc)
						return cli_bad_usage("option '%s' needs a value", name);
					val = argv[++i];
				}
				char why[700];

				if (!tuning_set_flag(o, name, val, why, sizeof(why)))
					return cli_bad_usage("%s", why);
				continue;
			}
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
				return cli_bad_usage("%s takes no value", name);
			if (name[2] == 'n')
				o->no_prefix = true;
			else
				o->dry_run = true;
			continue;
		}

		/* Every other option takes a value. */
		if (!takes_value(name))
			return cli_bad_usage("unknown option '%s'", a);
		if (val == NULL) {
			if (i + 1 >= argc)
				return cli_bad_usage("option '%s' needs a value", name);
			val = argv[++i];
		}

		if (strcmp(name, "-np") == 0 || strcmp(name, "-n") == 0 ||
		    strcmp(name, "--np") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 1 || v > MAX_RANKS)
				return cli_bad_usage("%s wants a number of ranks from 1 to %d, not '%s'",
				                     name, MAX_RANKS, val);
			o->np = (int)v;
		} else if (strcmp(name, "-x") == 0) {
			const char *e = strchr(val, '=');
			size_t n = e != NULL ? (size_t)(e - val) : strlen(val);

			if (!valid_env_name(val, n))
				return cli_bad_usage("-x wants VAR=VALUE or VAR with VAR a variable name, not "
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
				return cli_bad_usage("--timeout wants a duration like 30s, 500ms, 2m or inf, "
				                     "not '%s'", val);
			o->timeout = val;
		} else if (strcmp(name, "--grace") == 0) {
			/* A grace period without end would let a stuck rank hold khorrun forever. */
			if (!kparse_duration_ms(val, &o->grace_ms) || o->grace_ms < 0)
				return cli_bad_usage("--grace wants a finite duration like 3s or 500ms, "
				                     "not '%s'", val);
		} else if (strcmp(name, "--start-timeout") == 0) {
			if (!kparse_duration_ms(val, &o->start_timeout_ms) || o->start_timeout_ms <= 0)
				return cli_bad_usage("--start-timeout wants a finite duration like 30s, not "
				                     "'%s'", val);
		} else if (strcmp(name, "--bind-store") == 0) {
			int rc;

			if (val[0] == '\0')
				return cli_bad_usage("--bind-store wants a host name or address");
			if ((rc = parse_bind_store(val, o)) >= 0)
				return rc;
		} else if (strcmp(name, "--store-port") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 0 || v > 65535)
				return cli_bad_usage("--store-port wants a port from 0 to 65535, not '%s'",
				                     val);
			o->store_port = (uint16_t)v;
		} else if (strcmp(name, "--job-id") == 0) {
			if (!valid_job_id(val))
				return cli_bad_usage("--job-id wants 1 to 64 letters, digits, '-', '_' or "
				                     "'.', not '%s'", val);
			o->job_id = val;
		} else if (strcmp(name, "--bind") == 0) {
			if (!cpubind_parse(val, &o->bind))
				return cli_bad_usage("--bind wants cores or none, not '%s'", val);
		} else if (strcmp(name, "-H") == 0 || strcmp(name, "--host") == 0) {
			o->host_args[o->nhost_args++] = val;
		} else if (strcmp(name, "--hostfile") == 0) {
			o->hostfile = val;
		} else if (strcmp(name, "--ssh-command") == 0) {
			if (strspn(val, " \t") == strlen(val))
				return cli_bad_usage("--ssh-command wants a command such as \"ssh -F cfg\"");
			o->ssh_command = val;
		} else if (strcmp(name, "--ssh-port") == 0) {
			int64_t v;

			if (!kparse_i64(val, &v) || v < 1 || v > 65535)
				return cli_bad_usage("--ssh-port wants a port from 1 to 65535, not '%s'", val);
			o->ssh_port = val;
		} else if (strcmp(name, "--ssh-identity") == 0) {
			o->ssh_identity = val;
		} else if (strcmp(name, "--remote-khorrun") == 0) {
			if (val[0] != '/')
				return cli_bad_usage("--remote-khorrun wants an absolute path, not '%s'", val);
			o->remote_khorrun = val;
		} else if (strcmp(name, "--output-filename") == 0) {
			if (val[0] == '\0')
				return cli_bad_usage("--output-filename wants a directory");
			o->output_dir = val;
		} else if (strcmp(name, "--min-np") == 0 || strcmp(name, "--min-num-proc") == 0) {
			if (!parse_count(name, val, 1, MAX_RANKS, &o->min_np))
				return 2;
		} else if (strcmp(name, "--max-np") == 0 || strcmp(name, "--max-num-proc") == 0) {
			if (!parse_count(name, val, 1, MAX_RANKS, &o->max_np))
				return 2;
		} else if (strcmp(name, "--slots-per-host") == 0) {
			if (!parse_count(name, val, 1, MAX_RANKS, &o->slots_per_host))
				return 2;
		} else if (strcmp(name, "--reset-limit") == 0) {
			if (!parse_count(name, val, 0, INT32_MAX, &o->reset_limit))
				return 2;
		} else if (strcmp(name, "--host-discovery-script") == 0) {
			if (strspn(val, " \t") == strlen(val))
				return cli_bad_usage("--host-discovery-script wants a command");
			o->discovery = val;
		} else if (strcmp(name, "--host-discovery-timeout") == 0) {
			if (!kparse_duration_ms(val, &o->discovery_timeout_ms) ||
			    o->discovery_timeout_ms <= 0)
				return cli_bad_usage("--host-discovery-timeout wants a finite duration like "
				                     "10s, not '%s'", val);
		} else if (strcmp(name, "--elastic-timeout") == 0) {
			if (!kparse_duration_ms(val, &o->elastic_timeout_ms) || o->elastic_timeout_ms < 0)
				return cli_bad_usage("--elastic-timeout wants a finite duration like 600 (s), "
				                     "30s or 10m, not '%s'", val);
		} else if (strcmp(name, "--rdzv-backend") == 0) {
			if (strcmp(val, "etcd") != 0)
				return cli_bad_usage("--rdzv-backend wants etcd, not '%s'", val);
			o->rdzv_backend = val;
		} else if (strcmp(name, "--rdzv-endpoint") == 0) {
			o->rdzv_endpoint = val;
		} else if (strcmp(name, "--rdzv-id") == 0) {
			if (!valid_job_id(val))
				return cli_bad_usage("--rdzv-id wants 1 to 64 letters, digits, '-', '_' or "
				                     "'.', not '%s'", val);
			o->rdzv_id = val;
		} else if (strcmp(name, "--rdzv-host") == 0) {
			if (val[0] == '\0' || strlen(val) > EP_HOST_MAX || strpbrk(val, "/: \t") != NULL)
				return cli_bad_usage("--rdzv-host wants a host name (no '/', ':' or blanks), "
				                     "not '%s'", val);
			o->rdzv_host = val;
		} else if (strcmp(name, "--rdzv-ttl") == 0) {
			int ttl;

			if (!parse_count(name, val, 1, 3600, &ttl))
				return 2;
			o->rdzv_ttl_s = ttl;
		} else if (strcmp(name, "--blacklist-cooldown-range") == 0) {
			int rc;

			/* Horovod's form: two words, MIN MAX. */
			if (i + 1 >= argc)
				return cli_bad_usage("--blacklist-cooldown-range wants MIN MAX (seconds)");
			if ((rc = parse_cooldown(val, argv[++i], o)) >= 0)
				return rc;
		}
	}

	if (!tuning_finish(o))
		return 2;
	if (o->verbose && klog_threshold < KLOG_INFO)
		klog_threshold = KLOG_INFO;
	if (check_build)
		return checkbuild_print(o->verbose);
	if (i >= argc)
		return cli_bad_usage("no program given");
	if (o->nhost_args > 0 && o->hostfile != NULL)
		return cli_bad_usage("-H and --hostfile both name the hosts; give one of them");
	o->prog_argv = &argv[i];
	return check_elastic(o);
}
