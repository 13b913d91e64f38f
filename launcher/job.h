/*
 * job.h -- the job as khorrun (and its helper) hold it: the options, the ranks with their
 * output streams, the hosts with their ssh connections, and the state of a stop. Every part
 * of launcher/ works on one struct job; this header has the types and the limits, no code.
 */
#ifndef KHOR_LAUNCHER_JOB_H
#define KHOR_LAUNCHER_JOB_H

#include "base/clock.h"
#include "runtime/cpubind.h"
#include "frames.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* After SIGKILL the kernel needs a moment to tear processes down; this bounds that wait. */
#define KILL_WAIT_MS 2000
#define MAX_RANKS 65536
#define MAX_HOSTS 65536
#define MAX_ORPHANS 1024
#define DEFAULT_GRACE_MS 3000
#define DEFAULT_START_TIMEOUT_MS 30000

enum { OUT_STDOUT = 0, OUT_STDERR = 1 };
/* "[rank] ", or in an elastic job "[HOST:SLOT] " (a host name is at most 255 bytes). */
#define PREFIX_MAX 272

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
	bool verbose;            /* --verbose: khorrun says more (its log at info) */
	struct tuning *tune;     /* horovodrun's tuning flags and --config-file (tuning.h) */
	/* Elastic (any of --min-np, --max-np, --host-discovery-script given). */
	bool elastic;
	int min_np, max_np; /* 0: not given */
	const char *discovery; /* --host-discovery-script */
	int64_t discovery_timeout_ms;
	int slots_per_host;
	int reset_limit; /* -1: none */
	int64_t cool_min_ms, cool_max_ms; /* --blacklist-cooldown-range; 0: none */
	int64_t elastic_timeout_ms; /* -1: not given */
	/* An elastic job over etcd (--rdzv-backend etcd): this khorrun is one host's agent. */
	const char *rdzv_backend;
	const char *rdzv_endpoint; /* HOST:PORT, etcd's client port */
	const char *rdzv_id;       /* the job's id in etcd */
	const char *rdzv_host;     /* this host's name in the job; NULL: its host name */
	int64_t rdzv_ttl_s;        /* the agent's lease */
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
	int id; /* its index in job.ranks (the helper: the one khorrun gave it) */
	int rank; /* its rank as its environment says (elastic: in the generation it starts in) */
	int host; /* index into job.hosts */
	int lrank, lsize, xrank, xsize; /* local and cross rank and size */
	int64_t fenced_ms; /* > 0: killed by khorrun, its heartbeat silent this long */
	char *worker; /* elastic: its worker id HOST:SLOT (malloc'd); NULL otherwise */
	bool noted; /* elastic: the driver has dealt with its end */
	char prefix[PREFIX_MAX];
	size_t prefix_len;
	struct stream out[2];
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
	kdeadline start_dl; /* its ranks must have started by then (--start-timeout) */
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

	struct host *hosts; /* the hosts that have ranks (elastic: one per start on a host) */
	int nhosts;
	int cap_ranks, cap_hosts; /* elastic: room in ranks and hosts */
	bool multi; /* ranks on more than one host: say which host in messages */
	int nssh; /* ssh processes not yet reaped */
	int nhostfds; /* their stdout and stderr pipes not yet at EOF */
	int nremote, nready; /* hosts reached over ssh; of them, those whose ranks started */
	bool helper; /* this is `khorrun --remote-helper` */
	bool die_with_khorrun; /* ranks get PR_SET_PDEATHSIG (the helper's, an etcd agent's) */
	sigset_t child_mask; /* helper: the mask its ranks start with */
	bool stdin_open; /* helper: khorrun's frames still come */

	/*
	 * Elastic: ranks end without stopping the job (the driver decides, elastic.c), and
	 * while keep_open the loop goes on with none running, waiting for the next start.
	 */
	bool elastic;
	bool keep_open;
	/* A child that is neither rank nor ssh whose end matters (the discovery script). */
	pid_t script_pid; /* -1: none */
	bool script_reaped;
	int script_status;

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

	/*
	 * The ranks' heartbeats (watch.h; NULL when KHOR_HEARTBEAT_TIMEOUT is off). A rank
	 * that stops answering is killed at once (fencing), and the others get --grace to fail
	 * on their own, naming it, before the stop begins (fence_stop).
	 */
	struct watch *watch;
	bool fencing;
	kdeadline fence_stop;
	char fence_host[64]; /* the first fenced rank's host, as it named itself */

	enum cause cause;
	int first_fail; /* rank index, for CAUSE_FAILURE */
	int intr_sig; /* for CAUSE_SIGNAL */
	int intr_nrunning; /* ranks running when the signal came */
	int spawn_exit; /* for CAUSE_SPAWN: 126, 127 or 1 */
};

#endif
