/*
 * procs.c -- the ranks as processes, and stopping them. Ranks are signalled by process
 * group, so what they forked stops with them; leftovers re-parented to khorrun (a
 * subreaper) are found in /proc. A stop is a sequence of signals --grace apart, so every
 * wait after the ranks are told to stop is bounded. Other hosts are told by a frame.
 */
#include "procs.h"

#include "base/err.h"
#include "say.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

struct rank *procs_rank_of_pid(struct job *j, pid_t pid)
{
	for (int r = 0; r < j->nstarted; r++) {
		if (j->ranks[r].pid == pid)
			return &j->ranks[r];
	}
	return NULL;
}

struct host *procs_host_of_ssh(struct job *j, pid_t pid)
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
	if (!frame_puts(&h->out, 'K', buf) || !frame_buf_flush(&h->out, h->to_fd)) {
		/* Its ssh is gone or we are out of memory: the helper sees EOF and stops all. */
		close(h->to_fd);
		h->to_fd = -1;
	}
}

void procs_signal_rank(struct job *j, struct rank *rk, int sig)
{
	struct host *h;
	char buf[32];

	if (!rk->running)
		return;
	if (rk->pid >= 0) {
		if (kill(-rk->pid, sig) != 0)
			(void)kill(rk->pid, sig);
		return;
	}
	/* On another host: its helper signals it there ("k id sig"). */
	h = &j->hosts[rk->host];
	if (h->to_fd < 0)
		return;
	snprintf(buf, sizeof(buf), "%d %d", rk->id, sig);
	if (!frame_puts(&h->out, 'k', buf) || !frame_buf_flush(&h->out, h->to_fd)) {
		close(h->to_fd);
		h->to_fd = -1;
	}
}

void procs_fence(struct job *j, struct rank *rk, int64_t silent_ms)
{
	rk->fenced_ms = silent_ms > 0 ? silent_ms : 1;
	procs_signal_rank(j, rk, SIGKILL);
	if (j->cause == CAUSE_NONE) {
		j->cause = CAUSE_FAILURE;
		j->first_fail = (int)(rk - j->ranks);
	}
	if (!j->stopping && !j->fencing) {
		j->fencing = true;
		j->fence_stop = kdeadline_in_ms(j->o.grace_ms);
	}
}

/*
 * Finds the processes whose parent is khorrun but which are not running ranks: what ranks
 * left behind, re-parented to us because we are a subreaper. The live ones are listed in
 * pids (up to cap) and counted in *live_out. Zombies are counted in the result too: one
 * that died just after our last waitpid must still be reaped, or it would pass to init as
 * a zombie when we exit.
 */
size_t procs_find_orphans(struct job *j, pid_t *pids, size_t cap, size_t *live_out)
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
		rk = procs_rank_of_pid(j, pid);
		if (rk != NULL && rk->running)
			continue;
		if (procs_host_of_ssh(j, pid) != NULL)
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
void procs_signal_all(struct job *j, int sig)
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
	(void)procs_find_orphans(j, orphans, MAX_ORPHANS, &live);
	for (size_t i = 0; i < live && i < MAX_ORPHANS; i++)
		(void)kill(orphans[i], sig);
}

void procs_begin_stop(struct job *j, int first_sig)
{
	j->stopping = true;
	j->nstop_sigs = 0;
	j->stop_sigs[j->nstop_sigs++] = first_sig;
	if (first_sig != SIGTERM && first_sig != SIGKILL)
		j->stop_sigs[j->nstop_sigs++] = SIGTERM;
	if (first_sig != SIGKILL)
		j->stop_sigs[j->nstop_sigs++] = SIGKILL;
	j->stop_step = 0;
	procs_signal_all(j, first_sig);
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
		if (j->ranks[r].worker != NULL)
			off += (size_t)snprintf(buf + off, len - off, "%s%s", shown > 0 ? ", " : "",
			                        j->ranks[r].worker);
		else
			off += (size_t)snprintf(buf + off, len - off, "%s%d", shown > 0 ? ", " : "", r);
		shown++;
	}
}

/* The grace period passed: send the next signal, or stop waiting after SIGKILL. */
void procs_escalate(struct job *j)
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
		    say_sig_name(j->stop_sigs[j->stop_step - 1], prev, sizeof(prev)),
		    say_sig_name(sig, name, sizeof(name)));
	}
	procs_signal_all(j, sig);
	j->stop_next = kdeadline_in_ms(sig == SIGKILL ? KILL_WAIT_MS : j->o.grace_ms);
}

/*
 * Rank rk ended with wait status st: here the first failure stops the job; in the helper
 * it is reported to khorrun, which decides; in an elastic job the driver decides.
 */
void procs_rank_ended(struct job *j, struct rank *rk, int st)
{
	rk->running = false;
	rk->wstatus = st;
	j->nrunning--;
	if (j->helper) {
		frame_sendf('X', "%d %d", rk->id, st);
		return;
	}
	if (j->elastic)
		return; /* the driver looks at every end after this turn (elastic.c) */
	if (j->cause == CAUSE_NONE && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		j->cause = CAUSE_FAILURE;
		j->first_fail = (int)(rk - j->ranks);
		if (!j->stopping)
			procs_begin_stop(j, SIGTERM);
	}
}

/*
 * Blocks the signals we handle (before any thread exists, so every thread inherits the
 * mask and they all arrive at the signalfd instead of killing us halfway through a stop),
 * opens the signalfd and makes us a subreaper. Returns false with the reason said.
 */
bool procs_setup_signals(struct job *j, sigset_t *old_mask)
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
