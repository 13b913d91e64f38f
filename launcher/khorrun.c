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
 * Liveness. Every rank's heartbeat thread adds 1 to a counter in the store each
 * KHOR_HEARTBEAT_INTERVAL; khorrun reads them (watch.c) and kills a rank whose counter has
 * not moved for KHOR_HEARTBEAT_TIMEOUT: stopped (SIGSTOP, a debugger), hung or cut off. It
 * writes the job's abort key naming that rank first, so the others fail with the cause
 * rather than a reset link, gives them --grace to do so, then stops them as above. A rank
 * that is only slow beats on and is left alone however long it takes, as are the ranks
 * that wait for it (past KHOR_TIMEOUT they warn). khorrun passes both settings to every
 * rank, so the ranks' own judgement of their peers (runtime/liveness.c) and its own agree.
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
 *      |          and "kill rank R"
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
 *
 * The pieces, lowest first (each calls only those listed before it):
 *   frames.c     the frame format between khorrun and a helper
 *   say.c        khorrun's own messages
 *   watch.c      the ranks' heartbeats, read from the store
 *   cli.c        the command line
 *   hostlist.c   the hosts of -H and --hostfile
 *   slurm.c      the hosts of a Slurm allocation
 *   place.c      which host is this one, and which ranks run where
 *   env.c        the ranks' environment
 *   output.c     the ranks' output, cut into prefixed lines
 *   procs.c      the ranks as processes: signals, stopping in steps, a rank's end
 *   spawn.c      starting the ranks of this host
 *   ssh.c        khorrun's side of each other host
 *   loop.c       the poll loop, and the sweep after it
 *   batch.c      starting ranks on one host while the job runs (elastic generations)
 *   discover.c   running --host-discovery-script, one polled run at a time
 *   elastic_plan.c  the elastic rules: hosts, blacklist, assignment, plan text (pure)
 *   elastic.c    the elastic driver, between the loop's turns (docs/ELASTIC.md)
 *   agent.c      one host's agent of an elastic job over etcd (--rdzv-backend etcd)
 *   helper.c     the remote helper's side (khorrun --remote-helper)
 *   khorrun.c    main: the flow that ties them together
 *
 * Elastic jobs (--min-np, --max-np, --host-discovery-script) take another road after the
 * command line: elastic.c takes the hosts (running the discovery script once), main starts
 * the store and builds the environment every rank shares, and the driver runs the job,
 * generation by generation, on the same loop, spawn and ssh code as a fixed job.
 */
#include "base/auth.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/sock.h"
#include "khor.h"
#include "rendezvous/store.h"
#include "runtime/cpubind.h"

#include "agent.h"
#include "cli.h"
#include "elastic.h"
#include "env.h"
#include "tuning.h"
#include "helper.h"
#include "hosts.h"
#include "job.h"
#include "loop.h"
#include "output.h"
#include "procs.h"
#include "say.h"
#include "spawn.h"
#include "ssh.h"
#include "watch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int status_to_exit(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 1;
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
		say("interrupted by %s; stopped %d rank%s", say_sig_name(j->intr_sig, name, sizeof(name)),
		    j->intr_nrunning, j->intr_nrunning == 1 ? "" : "s");
		return 128 + j->intr_sig;
	case CAUSE_FAILURE:
		rk = &j->ranks[j->first_fail];
		if (rk->lost) {
			struct host *h = &j->hosts[rk->host];
			char st[96];

			say_status(h->ssh_status, st, sizeof(st));
			say("rank %d on %s was lost first: its ssh connection ended (ssh %s%s%s) before "
			    "the rank's end was known", j->first_fail, h->name, st,
			    h->last_err[0] ? ": " : "", h->last_err);
			return 255;
		}
		if (rk->fenced_ms > 0) {
			say("rank %d on %s failed first: it stopped answering (no heartbeat for %.1f s, "
			    "KHOR_HEARTBEAT_TIMEOUT) and khorrun killed it", j->first_fail,
			    j->fence_host, (double)rk->fenced_ms / 1e3);
			return 128 + SIGKILL;
		}
		say_status(rk->wstatus, what, sizeof(what));
		if (j->multi)
			say("rank %d on %s (pid %d) failed first: %s", j->first_fail,
			    j->hosts[rk->host].name, rk->pid >= 0 ? (int)rk->pid : rk->rpid, what);
		else
			say("rank %d (pid %d) failed first: %s", j->first_fail, (int)rk->pid, what);
		return status_to_exit(rk->wstatus);
	}
	return 1;
}

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

/* --dry-run: where each rank would run, and how each other host would be reached. */
static void print_placement(const struct job *j, const char *khorrun_path)
{
	char ranks[48], timeout_opt[48];

	printf("%d rank%s on %d host%s\n", j->o.np, j->o.np == 1 ? "" : "s", j->nhosts,
	       j->nhosts == 1 ? "" : "s");
	for (int i = 0; i < j->nhosts; i++) {
		const struct host *h = &j->hosts[i];

		place_rank_range(h, ranks, sizeof(ranks));
		printf("host %s: %s (%d of %d slots), %s\n", h->name, ranks, h->n, h->slots,
		       h->local ? "here" : "over ssh");
		if (!h->local) {
			char *q = ssh_quote(khorrun_path), *cmd = NULL;
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
static bool store_address(struct job *j, const char *first, char *bind_out, size_t blen,
                          char *adv_out, size_t alen)
{
	const char *want = j->o.bind_host;
	bool wild = strcmp(want, "0.0.0.0") == 0 || strcmp(want, "*") == 0 ||
	            strcmp(want, "::") == 0;
	char why[300];

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
			    first);
			return false;
		}
		kstrlcpy(adv_out, want, alen);
		return true;
	}
	if (!place_route_source(first, adv_out, alen, why, sizeof(why))) {
		/*
		 * A name only ssh knows (an alias of ~/.ssh/config) or no route from here: listen
		 * everywhere and give the ranks this host's name, which on a cluster they resolve.
		 * If the host really cannot be reached, ssh says so next.
		 */
		if (gethostname(adv_out, alen - 1) != 0 || adv_out[0] == '\0') {
			say("cannot find this host's address toward %s for the rendezvous store: %s; "
			    "give --bind-store with an address of this host that every host reaches",
			    first, why);
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

/*
 * The heartbeat watcher of a fixed job, on a store connection of its own to the store of
 * this process (a client, as the ranks are; the store thread answers it like any other).
 * False with the reason said.
 */
static bool start_watch(struct job *j, const char *store_addr, const char *secret,
                        const char *job_id, int64_t timeout_ms, int64_t interval_ms)
{
	char host[300];
	uint16_t port;
	store *st;
	kerr err;

	kerr_clear(&err);
	if (!ksock_split_hostport(store_addr, host, sizeof(host), &port) ||
	    store_tcp_connect(host, port, secret, job_id, kdeadline_in_ms(5000), &st, &err) !=
	        KHOR_SUCCESS) {
		say("cannot reach the job's store at %s to watch the ranks' heartbeats: %s",
		    store_addr, err.text[0] ? err.text : "bad address");
		return false;
	}
	j->watch = watch_new(st, job_id, 0, j->o.np, timeout_ms, interval_ms);
	if (j->watch == NULL) {
		store_close(st);
		say("out of memory for the heartbeat watcher");
		return false;
	}
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
	int64_t hb_timeout, hb_interval;
	struct elastic *el = NULL;
	const char *remote = NULL; /* the first host reached over ssh */

	memset(j, 0, sizeof(*j));
	j->sfd = -1;
	j->first_fail = -1;
	klog_init_from_env();
	if (!ensure_std_fds())
		return 1;
	if (argc == 2 && strcmp(argv[1], "--remote-helper") == 0)
		return helper_main();
	rc = cli_parse(argc, argv, &j->o);
	if (rc >= 0)
		goto out_free_opts;
	/* An elastic job's hosts and ranks come later, generation by generation. */
	if (!j->o.elastic) {
		rc = place_ranks(j);
		if (rc >= 0)
			goto out_free_hosts;
		j->nstarted = j->o.np;
		for (int i = 0; i < j->nhosts; i++) {
			if (j->hosts[i].local)
				lh = i;
		}
		for (int r = 0; r < j->o.np; r++)
			j->ranks[r].id = j->ranks[r].rank = r;
	}
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
	if ((j->nremote > 0 || j->o.elastic) && getcwd(cwd, sizeof(cwd)) == NULL) {
		char ebuf[128];

		say("cannot tell the working directory for the other hosts: %s",
		    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		goto out_free_hosts;
	}
	/* The program is looked up here only for ranks here; each helper looks for its own. */
	if (lh >= 0) {
		rc = spawn_resolve_program(j->o.prog_argv[0], &path);
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
	{
		int most = j->o.elastic && j->o.max_np > 0 ? j->o.max_np : j->o.np;

		if (!spawn_ensure_fd_limit(most + j->nhosts + (j->o.output_dir != NULL ? most : 0)))
			goto out_free_path;
	}
	if (!procs_setup_signals(j, &old_mask))
		goto out_free_path;
	if (j->o.rdzv_backend != NULL) {
		struct agent_env env = { .cwd = cwd, .child_mask = &old_mask,
			                 .local_cpus = have_cpus ? cpus.n : 0 };

		/* One host's agent: etcd is the store, and the job has no khorrun of its own. */
		rc = agent_run(j, &env);
		loop_sweep_leftovers(j);
		if (rc < 0)
			rc = report(j);
		output_free_ranks(j);
		goto out_close_sfd;
	}
	if (j->o.elastic) {
		rc = elastic_prepare(j, &old_mask, &el);
		if (rc >= 0) {
			loop_sweep_leftovers(j); /* what a hung discovery script started */
			goto out_close_sfd;
		}
		rc = 1;
		remote = elastic_remote_host(el);
	} else {
		for (int i = 0; i < j->nhosts && remote == NULL; i++) {
			if (!j->hosts[i].local)
				remote = j->hosts[i].name;
		}
	}

	if (!kauth_new_secret(secret) || !kauth_random(rnd, sizeof(rnd))) {
		say("cannot get random bytes for the job secret (getrandom failed)");
		goto out_close_sfd;
	}
	if (j->o.job_id != NULL)
		kstrlcpy(job_id, j->o.job_id, sizeof(job_id));
	else
		snprintf(job_id, sizeof(job_id), "khor-%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
		         rnd[3]);

	if (!store_address(j, remote, bind_addr, sizeof(bind_addr), adv, sizeof(adv)))
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
	if (remote != NULL)
		KLOG_INFO("khorrun: the rendezvous store listens on %s:%u, the ranks reach it at %s",
		          bind_addr, (unsigned)store_server_port(srv), store_addr);

	if (!j->o.elastic && !output_init_ranks(j))
		goto out_free_ranks;

	/* The same in every rank, on every host; the identity of each is in its slots. */
	if (!env_heartbeat(&j->o, &hb_timeout, &hb_interval))
		goto out_free_fixed;
	if (!env_add_fixed(fixed, &nfixed, "KHOR_STORE_ADDR=%s", store_addr) ||
	    !env_add_fixed(fixed, &nfixed, "KHOR_HEARTBEAT_TIMEOUT=%lldms", (long long)hb_timeout) ||
	    !env_add_fixed(fixed, &nfixed, "KHOR_HEARTBEAT_INTERVAL=%lldms",
	                   (long long)hb_interval) ||
	    !env_add_fixed(fixed, &nfixed, "KHOR_SECRET=%s", secret) ||
	    !env_add_fixed(fixed, &nfixed, "KHOR_JOB_ID=%s", job_id) ||
	    !env_add_fixed(fixed, &nfixed, "KHOR_LAUNCHER=khorrun") ||
	    (j->o.timeout != NULL && !env_add_fixed(fixed, &nfixed, "KHOR_TIMEOUT=%s", j->o.timeout))) {
		say("out of memory building the ranks' environment");
		goto out_free_fixed;
	}
	if (j->o.elastic) {
		struct elastic_env env = {
			.common = fixed, .ncommon = nfixed, .local_cpus = have_cpus ? cpus.n : 0,
			.self_path = self_path, .cwd = cwd, .child_mask = &old_mask,
			.store_host = adv, .store_port = store_server_port(srv),
			.store_loopback = remote == NULL && !j->o.bind_given,
			.secret = secret, .job_id = job_id,
		};

		rc = elastic_run(el, &env);
		loop_sweep_leftovers(j);
		if (rc < 0)
			rc = report(j);
		goto out_free_fixed;
	}
	/* The size is the same in every rank of a fixed job too. */
	for (size_t p = 0; p < NPREFIXES && ok; p++)
		ok = env_add_fixed(fixed, &nfixed, "%sSIZE=%d", env_id_prefixes[p], j->o.np);
	if (!ok) {
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
		env_rank_hostname(&j->o, hostname, sizeof(hostname));
	if (!env_add_fixed(fixed, &nfixed, "HOROVOD_HOSTNAME=%s", hostname) ||
	    (j->multi && !env_add_fixed(fixed, &nfixed, "KHOR_HOSTNAME=%s", hostname)) ||
	    (have_cpus && !env_add_fixed(fixed, &nfixed, "KHOR_LOCAL_CPUS=%d", cpus.n))) {
		say("out of memory building the ranks' environment");
		goto out_free_fixed;
	}

	if (hb_timeout > 0 && !start_watch(j, store_addr, secret, job_id, hb_timeout, hb_interval))
		goto out_free_fixed;

	/* Other hosts first: their ssh connections take longest. */
	for (int i = 0; i < j->nhosts; i++) {
		struct host *h = &j->hosts[i];

		if (h->local)
			continue;
		if (!ssh_start(j, h, self_path, cwd, fixed, ncommon, &old_mask)) {
			ssh_start_failed(j, h, 1);
			break;
		}
	}
	if (lh >= 0 && j->cause == CAUSE_NONE)
		spawn_all(j, path, fixed, nfixed, &old_mask, bind ? &cpus : NULL, j->hosts[lh].first,
		          j->hosts[lh].n, NULL);
	loop_run(j);
	loop_sweep_leftovers(j);
	rc = report(j);

out_free_fixed:
	watch_free(j->watch);
	for (size_t i = 0; i < nfixed; i++)
		free(fixed[i]);
out_free_ranks:
	output_free_ranks(j);
	elastic_free(el);
	el = NULL;
	store_server_stop(srv);
out_close_sfd:
	elastic_free(el);
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
	tuning_free(&j->o);
	free(j->o.xvars);
	free(j->o.xnames);
	free(j->o.host_args);
	return rc;
}
