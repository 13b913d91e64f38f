/*
 * loop.c -- the one poll loop that khorrun and its helper both run: rank output first (so
 * what a rank printed just before it failed is not cut off), then the signalfd (children
 * that ended, interrupts), the hosts' pipes and the deadlines of a stop or a start. After
 * it, the sweep stops and reaps whatever the ranks left behind.
 */
#include "loop.h"

#include "base/err.h"
#include "frames.h"
#include "output.h"
#include "procs.h"
#include "say.h"
#include "ssh.h"
#include "watch.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

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
		h = procs_host_of_ssh(j, pid);
		if (h != NULL) {
			h->ssh_running = false;
			h->ssh_status = st;
			j->nssh--;
			ssh_check(j, h);
			continue;
		}
		if (pid == j->script_pid) {
			j->script_pid = -1;
			j->script_reaped = true;
			j->script_status = st;
			continue;
		}
		rk = procs_rank_of_pid(j, pid);
		if (rk == NULL || !rk->running)
			continue; /* something a rank left behind */
		procs_rank_ended(j, rk, st);
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
		say_sig_name(sig, name, sizeof(name));
		if (sig == SIGTERM)
			say("%s: stopping %d rank%s (SIGTERM now, SIGKILL after %lld ms; send it again "
			    "to kill now)", name, j->nrunning, j->nrunning == 1 ? "" : "s",
			    (long long)j->o.grace_ms);
		else
			say("%s: stopping %d rank%s (%s now, SIGTERM after %lld ms, SIGKILL after %lld "
			    "ms; send it again to kill now)", name, j->nrunning,
			    j->nrunning == 1 ? "" : "s", name, (long long)j->o.grace_ms,
			    (long long)(2 * j->o.grace_ms));
		procs_begin_stop(j, sig);
		return;
	}
	/* A second interrupt means "now": skip the rest of the grace period. */
	if (j->stop_sigs[j->stop_step] != SIGKILL) {
		say("%s again: killing the ranks now", say_sig_name(sig, name, sizeof(name)));
		j->stop_step = j->nstop_sigs - 1;
		procs_signal_all(j, SIGKILL);
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
 * khorrun: the ranks whose heartbeat stopped. Each is killed at once and named; the others
 * learn why from the abort key, fail on their own within --grace, and then the stop begins.
 */
static void watch_ranks(struct job *j)
{
	struct watch_silent s[16];
	const char *why = NULL;
	int n = watch_poll(j->watch, s, 16, &why);

	if (why != NULL)
		say("%s", why);
	for (int i = 0; i < n; i++) {
		struct rank *rk = &j->ranks[s[i].rank];
		char text[256];

		if (!rk->running || j->stopping) {
			watch_forget(j->watch, s[i].rank);
			continue;
		}
		snprintf(text, sizeof(text), "khorrun: rank %d on %s stopped answering: no heartbeat "
		         "for %.1f s (stopped or hung); killed it", s[i].rank,
		         s[i].host[0] ? s[i].host : j->hosts[rk->host].name,
		         (double)s[i].silent_ms / 1e3);
		if (j->fence_host[0] == '\0')
			snprintf(j->fence_host, sizeof(j->fence_host), "%s",
			         s[i].host[0] ? s[i].host : j->hosts[rk->host].name);
		watch_abort(j->watch, s[i].gen, text);
		say("%s", text + strlen("khorrun: "));
		procs_fence(j, rk, s[i].silent_ms);
		watch_forget(j->watch, s[i].rank);
	}
}

/* Helper: khorrun's frames after the start ("signal N"), and EOF when it is gone. */
static void helper_read_stdin(struct job *j, char *rx, size_t *rx_len)
{
	ssize_t n = read(STDIN_FILENO, rx + *rx_len, FRAME_MAX + FRAME_HDR - *rx_len);
	size_t pos = 0;

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		/* ssh's session ended: khorrun, or the network, is gone. Stop everything. */
		j->stdin_open = false;
		if (!j->stopping && (j->nrunning > 0 || j->nopen > 0))
			procs_begin_stop(j, SIGTERM);
		return;
	}
	if (n < 0)
		return;
	*rx_len += (size_t)n;
	for (;;) {
		char type, buf[32];
		const char *payload;
		size_t plen;
		int rc = frame_next(rx + pos, *rx_len - pos, &type, &payload, &plen);

		if (rc <= 0) {
			if (rc < 0) {
				j->stdin_open = false;
				if (!j->stopping)
					procs_begin_stop(j, SIGTERM);
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
				procs_signal_all(j, sig);
		} else if (type == 'k' && plen < sizeof(buf)) {
			/* "id sig": one rank (the elastic driver fencing or dropping it). */
			int id, sig;

			memcpy(buf, payload, plen);
			buf[plen] = '\0';
			for (int r = 0; sscanf(buf, "%d %d", &id, &sig) == 2 && r < j->nstarted; r++) {
				if (j->ranks[r].id == id && sig > 0 && sig < NSIG)
					procs_signal_rank(j, &j->ranks[r], sig);
			}
		}
		pos += FRAME_HDR + plen;
	}
	memmove(rx, rx + pos, *rx_len - pos);
	*rx_len -= pos;
}

/* Room in l's arrays for what one turn may watch; false when out of memory. */
static bool loop_room(struct job *j, struct loop *l, int nextra)
{
	size_t need = 2 + 2 * (size_t)j->nstarted + 3 * (size_t)j->nhosts + (size_t)nextra;
	size_t cap = l->cap;

	if (need <= cap)
		return true;
	while (cap < need)
		cap = cap ? 2 * cap : 64;
	struct pollfd *pfd = realloc(l->pfd, cap * sizeof(*pfd));
	if (pfd != NULL)
		l->pfd = pfd;
	struct stream **who = realloc(l->who, cap * sizeof(*who));
	if (who != NULL)
		l->who = who;
	struct rank **whose = realloc(l->whose, cap * sizeof(*whose));
	if (whose != NULL)
		l->whose = whose;
	struct host **whost = realloc(l->whost, cap * sizeof(*whost));
	if (whost != NULL)
		l->whost = whost;
	if (pfd == NULL || who == NULL || whose == NULL || whost == NULL)
		return false;
	l->cap = cap;
	return true;
}

bool loop_open(struct job *j, struct loop *l)
{
	memset(l, 0, sizeof(*l));
	if (j->helper && (l->hrx = malloc(FRAME_MAX + FRAME_HDR)) == NULL)
		return false;
	return loop_room(j, l, 0);
}

/* The soonest start deadline of a host still starting, or one that never passes. */
static kdeadline next_start_deadline(const struct job *j)
{
	kdeadline d = kdeadline_in_ms(-1);

	for (int i = 0; i < j->nhosts; i++) {
		const struct host *h = &j->hosts[i];

		if (!h->local && !h->ready && !h->failed && h->ssh_running &&
		    h->start_dl.at_ns < d.at_ns)
			d = h->start_dl;
	}
	return d;
}

/*
 * One turn of the loop: forward output, reap, stop. It reports false (and does nothing)
 * when the job has nothing left: every rank reaped (or reported from its host), every pipe
 * at EOF and every ssh reaped, unless keep_open; or, after SIGKILL, the ranks still do not
 * go away. extra are the caller's own fds; their revents are set when this returns.
 */
bool loop_turn(struct job *j, struct loop *l, struct pollfd *extra, int nextra,
               int timeout_ms)
{
	int timeout = timeout_ms >= 0 && timeout_ms < 1000 ? timeout_ms : 1000;
	int n = 1, stdin_at = -1, extra_at;
	int rc;

	for (int i = 0; i < nextra; i++)
		extra[i].revents = 0;
	if (!((j->nrunning > 0 || j->nopen > 0 || j->nssh > 0 || j->nhostfds > 0 || j->keep_open) &&
	      !j->gave_up))
		return false;
	if (!loop_room(j, l, nextra)) {
		say("out of memory while watching the ranks; killing them");
		procs_signal_all(j, SIGKILL);
		j->gave_up = true;
		return false;
	}
	if (j->helper && frame_send_failed() && !j->stopping)
		procs_begin_stop(j, SIGTERM); /* khorrun can no longer hear us: stop */
	if (j->nready < j->nremote && !j->stopping && kdeadline_passed(next_start_deadline(j)))
		ssh_start_timed_out(j);
	/*
	 * Every rank is gone but something they started still holds a pipe open (a
	 * daemon, "sleep &"). Give it the grace period to finish, then stop it.
	 */
	if (j->nrunning == 0 && !j->stopping && !j->keep_open) {
		if (!j->draining) {
			j->draining = true;
			j->drain_until = kdeadline_in_ms(j->o.grace_ms);
		} else if (kdeadline_passed(j->drain_until)) {
			/* Only ssh left: a helper that does not finish is stopped the same way. */
			if (j->nopen > 0)
				say("every rank exited, but processes they started still hold their "
				    "output open after %lld ms; stopping them",
				    (long long)j->o.grace_ms);
			procs_begin_stop(j, SIGTERM);
		}
	}
	if (j->watch != NULL && !j->stopping) {
		watch_ranks(j);
		if (watch_due_ms(j->watch) < timeout)
			timeout = watch_due_ms(j->watch);
	}
	if (j->fencing && !j->stopping) {
		if (kdeadline_passed(j->fence_stop)) {
			if (j->nrunning > 0)
				say("stopping the other ranks, %lld ms after the rank that stopped "
				    "answering was killed", (long long)j->o.grace_ms);
			procs_begin_stop(j, SIGTERM);
		} else if (ms_left(j->fence_stop) < (uint64_t)timeout) {
			timeout = (int)ms_left(j->fence_stop);
		}
	}
	if (j->stopping && kdeadline_passed(j->stop_next)) {
		procs_escalate(j);
		if (j->gave_up)
			return false;
	}
	if (j->stopping && ms_left(j->stop_next) < (uint64_t)timeout)
		timeout = (int)ms_left(j->stop_next);
	if (j->draining && !j->stopping && ms_left(j->drain_until) < (uint64_t)timeout)
		timeout = (int)ms_left(j->drain_until);
	if (j->nready < j->nremote && !j->stopping &&
	    ms_left(next_start_deadline(j)) < (uint64_t)timeout)
		timeout = (int)ms_left(next_start_deadline(j));

	l->pfd[0] = (struct pollfd){ .fd = j->sfd, .events = POLLIN };
	if (j->helper && j->stdin_open) {
		stdin_at = n;
		l->pfd[n++] = (struct pollfd){ .fd = STDIN_FILENO, .events = POLLIN };
	}
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			struct stream *s = &j->ranks[r].out[k];

			if (s->fd < 0)
				continue;
			l->pfd[n] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
			l->who[n] = s;
			l->whose[n] = &j->ranks[r];
			l->whost[n] = NULL;
			n++;
		}
	}
	for (int h = 0; h < j->nhosts; h++) {
		struct host *hp = &j->hosts[h];
		int fds[3] = { hp->from_fd, hp->err_fd, hp->to_fd };

		for (int k = 0; k < 3; k++) {
			if (fds[k] < 0 || (k == 2 && hp->out.len == 0))
				continue;
			l->pfd[n] = (struct pollfd){ .fd = fds[k], .events = k == 2 ? POLLOUT : POLLIN };
			l->who[n] = NULL;
			l->whose[n] = NULL;
			l->whost[n] = hp;
			n++;
		}
	}
	extra_at = n;
	for (int i = 0; i < nextra; i++)
		l->pfd[n++] = extra[i];
	rc = poll(l->pfd, (nfds_t)n, timeout);
	if (rc < 0 && errno != EINTR) {
		char ebuf[128];

		say("poll failed: %s; killing the ranks", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		procs_signal_all(j, SIGKILL);
		j->gave_up = true;
		return false;
	}
	if (rc <= 0)
		return true;
	for (int i = 0; i < nextra; i++)
		extra[i].revents = l->pfd[extra_at + i].revents;
	/* Output first, so what a rank printed just before it failed is not cut off. */
	for (int i = 1; i < extra_at; i++) {
		struct host *hp = l->whost[i];

		if (l->pfd[i].revents == 0)
			continue;
		if (i == stdin_at) {
			helper_read_stdin(j, l->hrx, &l->hrx_len);
		} else if (hp == NULL) {
			output_read(j, l->whose[i], l->who[i]);
		} else if (l->pfd[i].fd == hp->from_fd) {
			ssh_read(j, hp);
		} else if (l->pfd[i].fd == hp->err_fd) {
			ssh_read_err(j, hp);
		} else if (l->pfd[i].fd == hp->to_fd && !frame_buf_flush(&hp->out, hp->to_fd)) {
			close(hp->to_fd);
			hp->to_fd = -1;
		}
	}
	if (l->pfd[0].revents != 0)
		handle_signals(j);
	return true;
}

void loop_close(struct job *j, struct loop *l)
{
	/* Whatever is still open here is abandoned: print what we have of it. */
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			output_close(j, &j->ranks[r], &j->ranks[r].out[k]);
			if (!j->helper)
				output_emit(j, &j->ranks[r], &j->ranks[r].out[k], true);
		}
	}
	free(l->hrx);
	free(l->whost);
	free(l->whose);
	free(l->who);
	free(l->pfd);
	memset(l, 0, sizeof(*l));
}

void loop_run(struct job *j)
{
	struct loop l;

	if (!loop_open(j, &l)) {
		say("out of memory while watching the ranks; killing them");
		procs_signal_all(j, SIGKILL);
	} else {
		while (loop_turn(j, &l, NULL, 0, 1000)) {
		}
	}
	loop_close(j, &l);
}

/*
 * After the ranks: processes they left behind that closed their output (so the loop did not
 * wait for them) are still re-parented to us. Stop them with SIGTERM, then SIGKILL, each
 * bounded, and reap them, so khorrun leaves nothing running.
 */
void loop_sweep_leftovers(struct job *j)
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
	n = procs_find_orphans(j, pids, MAX_ORPHANS, &live);
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
			n = procs_find_orphans(j, pids, MAX_ORPHANS, &live);
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
