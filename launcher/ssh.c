/*
 * ssh.c -- khorrun's side of each other host. One ssh connection per host runs
 * `khorrun --remote-helper` there (helper.c); the secret and the ranks' identities travel
 * as frames on ssh's stdin, never on a command line, and the helper's frames come back on
 * its stdout. Until the helper's magic arrives, what comes is a login script's text and is
 * shown as such; ssh's own stderr is kept and named if the start fails.
 */
#include "ssh.h"

#include "base/err.h"
#include "base/log.h"
#include "env.h"
#include "frames.h"
#include "hosts.h"
#include "khor.h"
#include "output.h"
#include "procs.h"
#include "say.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

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

/* "ranks 4-7", or in an elastic job "worker node2:0" / "2 workers (node2:0, ...)". */
static void host_ranks(const struct job *j, const struct host *h, char *buf, size_t len)
{
	const char *w = h->n > 0 ? j->ranks[h->first].worker : NULL;

	if (w == NULL)
		place_rank_range(h, buf, len);
	else if (h->n == 1)
		snprintf(buf, len, "worker %s", w);
	else
		snprintf(buf, len, "%d workers (%s, ...)", h->n, w);
}

static void host_close_fd(struct job *j, int *fd)
{
	if (*fd < 0)
		return;
	close(*fd);
	*fd = -1;
	j->nhostfds--;
}

void ssh_start_failed(struct job *j, struct host *h, int code)
{
	h->failed = true;
	if (j->elastic) {
		/* Its ranks end as lost (ssh_check) and the driver decides; the job goes on. */
		if (h->ssh_running)
			(void)kill(-h->ssh_pid, SIGKILL);
		return;
	}
	if (j->cause == CAUSE_NONE) {
		j->cause = CAUSE_SPAWN;
		j->spawn_exit = code;
	}
	if (!j->stopping)
		procs_begin_stop(j, SIGTERM);
}

/*
 * Called whenever something of h ends: once ssh is reaped and both its pipes are at EOF,
 * the host is finished, and ranks it never reported on are failed starts or lost.
 */
void ssh_check(struct job *j, struct host *h)
{
	char ranks[320], what[96];

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
	host_ranks(j, h, ranks, sizeof(ranks));
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
			say_status(st, what, sizeof(what));
			say("cannot start %s on %s: the ssh session %s before the ranks started%s%s",
			    ranks, h->name, what, h->last_err[0] ? ": " : "", h->last_err);
		}
		ssh_start_failed(j, h, 1);
	}
	for (int r = h->first; r < h->first + h->n; r++) {
		struct rank *rk = &j->ranks[r];

		for (int k = 0; k < 2; k++)
			output_emit(j, rk, &rk->out[k], true);
		if (!rk->running)
			continue;
		if (h->failed && !j->elastic) {
			/* Never started, or stopped by the helper when the start failed. */
			rk->running = false;
			j->nrunning--;
			continue;
		}
		rk->lost = true;
		procs_rank_ended(j, rk, 255 << 8);
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
			ssh_start_failed(j, h, r > 0 ? r : 1);
		break;
	case 'O': /* 4-byte rank, stream, bytes (none: the stream ended) */
		if (n >= 5) {
			const uint8_t *u = (const uint8_t *)p;
			int id = (int)frame_get_u32(u);

			if (id >= h->first && id < h->first + h->n && u[4] <= 1) {
				rk = &j->ranks[id];
				if (n == 5)
					output_emit(j, rk, &rk->out[u[4]], true);
				else
					output_feed(j, rk, &rk->out[u[4]], p + 5, n - 5);
			}
		}
		break;
	case 'X': /* "rank wait-status" */
		if (rk != NULL && rk->running)
			procs_rank_ended(j, rk, v);
		break;
	case 'M':
		say("%s: %.*s", h->name, (int)n, p);
		break;
	default: /* 'D' and anything newer: nothing to do */
		break;
	}
}

void ssh_read(struct job *j, struct host *h)
{
	ssize_t n = read(h->from_fd, h->rx + h->rx_len, FRAME_MAX + FRAME_HDR - h->rx_len);
	size_t pos = 0;

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		if (!h->synced)
			host_err_bytes(h, h->rx, h->rx_len);
		host_close_fd(j, &h->from_fd);
		ssh_check(j, h);
		return;
	}
	if (n < 0)
		return;
	h->rx_len += (size_t)n;
	if (!h->synced) {
		/* Until the magic, what comes is text a login script printed: show it as such. */
		char *m = memmem(h->rx, h->rx_len, frame_magic, FRAME_MAGIC_LEN);
		size_t junk = m != NULL ? (size_t)(m - h->rx)
		              : h->rx_len >= FRAME_MAGIC_LEN ? h->rx_len - FRAME_MAGIC_LEN + 1
		                                              : 0; /* the magic may be cut in two */

		host_err_bytes(h, h->rx, junk);
		pos = junk;
		if (m != NULL) {
			h->synced = true;
			pos += FRAME_MAGIC_LEN;
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
			ssh_check(j, h);
			return;
		}
		host_frame(j, h, type, payload, plen);
		pos += FRAME_HDR + plen;
	}
	memmove(h->rx, h->rx + pos, h->rx_len - pos);
	h->rx_len -= pos;
}

void ssh_read_err(struct job *j, struct host *h)
{
	char buf[4096];
	ssize_t n = read(h->err_fd, buf, sizeof(buf));

	if (n > 0) {
		host_err_bytes(h, buf, (size_t)n);
		return;
	}
	if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		host_close_fd(j, &h->err_fd);
		ssh_check(j, h);
	}
}

void ssh_start_timed_out(struct job *j)
{
	char ranks[320];

	for (int i = 0; i < j->nhosts; i++) {
		struct host *h = &j->hosts[i];

		if (h->local || h->ready || h->failed || !h->ssh_running ||
		    !kdeadline_passed(h->start_dl))
			continue;
		host_ranks(j, h, ranks, sizeof(ranks));
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
		ssh_start_failed(j, h, 1);
	}
}

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
char *ssh_quote(const char *s)
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
char **ssh_argv(const struct job *j, const struct host *h, const char *remote_cmd,
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
 * environment (khorrun's own, the -x ones, then the launcher's, each later one winning in
 * the helper's putenv), each rank's identity,
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
	/*
	 * khorrun's whole environment (PATH, PYTHONPATH, LD_LIBRARY_PATH, a virtualenv's
	 * VIRTUAL_ENV, ...) less what stays on its own host (env_host_local): the helper
	 * puts each on top of its login environment, so the ranks there run as those here do.
	 * As frames, not on ssh's command line: no length limit of a command line, no quoting.
	 */
	for (size_t i = 0; ok && environ != NULL && environ[i] != NULL; i++) {
		size_t len = strlen(environ[i]);

		if (strchr(environ[i], '=') == NULL || env_host_local(environ[i]))
			continue;
		if (len > FRAME_MAX) {
			static bool said; /* once a job, not once a host */

			if (!said)
				say("%.*s is %zu bytes, more than a frame to another host holds (%d): "
				    "not forwarded to other hosts; set it there, or pass it in a file",
				    (int)strcspn(environ[i], "="), environ[i], len, (int)FRAME_MAX);
			said = true;
			continue;
		}
		ok = frame_puts(b, 'V', environ[i]);
	}
	/* As env_build does here, and over whatever the login there set: see its comment. */
	if (ok && env_rank_value(&j->o, "PYTHONUNBUFFERED") == NULL)
		ok = frame_puts(b, 'V', "PYTHONUNBUFFERED=1");
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

		env_fill_slots(slots, &j->ranks[r]);
		snprintf(head, sizeof(head), "%d", r);
		ok = frame_buf_put(&one, head, strlen(head) + 1);
		for (size_t k = 0; ok && k < NSLOTS; k++)
			ok = frame_buf_put(&one, slots[k], strlen(slots[k]) + 1);
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
bool ssh_start(struct job *j, struct host *h, const char *khorrun_path,
               const char *cwd, char **common, size_t ncommon,
               const sigset_t *child_mask)
{
	char ebuf[128], timeout_opt[48];
	char *qpath = ssh_quote(khorrun_path), *remote_cmd = NULL;
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
	h->start_dl = kdeadline_in_ms(j->o.start_timeout_ms);
	j->nssh++;
	j->nhostfds += 2;
	for (int r = h->first; r < h->first + h->n; r++) {
		j->ranks[r].running = true;
		j->nrunning++;
	}
	if (!frame_buf_flush(&h->out, h->to_fd)) {
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
