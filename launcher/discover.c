/*
 * discover.c -- one run of --host-discovery-script at a time (see discover.h). The script
 * runs under /bin/sh -c, so the option takes what a shell takes ("./hosts.sh --zone a").
 * Its stdin is /dev/null, its stderr khorrun's own (a script that explains its failure is
 * read by the user), and its process group is its own, so killing a hung run also kills
 * what it started (an ssh, a curl).
 */
#include "discover.h"

#include "base/err.h"
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

/* More than any discovery needs; a script that prints more is failed, not believed. */
#define DISCOVER_OUT_MAX (1u << 20)

void discover_init(struct discover *d, const char *cmd, int64_t timeout_ms)
{
	memset(d, 0, sizeof(*d));
	d->cmd = cmd;
	d->timeout_ms = timeout_ms;
	d->fd = -1;
}

void discover_free(struct discover *d)
{
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	free(d->out);
	d->out = NULL;
}

bool discover_start(struct job *j, struct discover *d, const sigset_t *child_mask, char *why,
                    size_t wlen)
{
	char *argv[] = { "/bin/sh", "-c", (char *)d->cmd, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t def;
	char ebuf[128];
	int p[2], err;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) != 0) {
		snprintf(why, wlen, "cannot make a pipe: %s",
		         kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		return false;
	}
	(void)fcntl(p[0], F_SETFL, O_NONBLOCK);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	err = posix_spawn_file_actions_init(&fa);
	if (err == 0 && (err = posix_spawnattr_init(&attr)) != 0)
		posix_spawn_file_actions_destroy(&fa);
	if (err == 0) {
		if ((err = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null",
		                                            O_RDONLY, 0)) == 0 &&
		    (err = posix_spawn_file_actions_adddup2(&fa, p[1], STDOUT_FILENO)) == 0 &&
		    (err = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
		                                               POSIX_SPAWN_SETSIGMASK |
		                                               POSIX_SPAWN_SETSIGDEF)) == 0 &&
		    (err = posix_spawnattr_setpgroup(&attr, 0)) == 0 &&
		    (err = posix_spawnattr_setsigmask(&attr, child_mask)) == 0 &&
		    (err = posix_spawnattr_setsigdefault(&attr, &def)) == 0)
			err = posix_spawn(&pid, argv[0], &fa, &attr, argv, environ);
		posix_spawnattr_destroy(&attr);
		posix_spawn_file_actions_destroy(&fa);
	}
	close(p[1]);
	if (err != 0) {
		close(p[0]);
		snprintf(why, wlen, "cannot run /bin/sh: %s",
		         kerr_errno_str(err, ebuf, sizeof(ebuf)));
		return false;
	}
	j->script_pid = pid;
	j->script_reaped = false;
	d->fd = p[0];
	d->running = true;
	d->killed = false;
	d->len = 0;
	d->dl = kdeadline_in_ms(d->timeout_ms);
	return true;
}

/* Reads what the pipe holds now; false at EOF or on an error (the fd is then closed). */
static bool drain(struct discover *d)
{
	for (;;) {
		ssize_t n;

		if (d->cap - d->len < 4096 + 1) {
			size_t cap = d->cap * 2 + 4096 + 1;
			char *o = realloc(d->out, cap);

			if (o == NULL)
				break;
			d->out = o;
			d->cap = cap;
		}
		n = read(d->fd, d->out + d->len, d->cap - d->len - 1);
		if (n > 0) {
			d->len += (size_t)n;
			if (d->len > DISCOVER_OUT_MAX)
				break;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return true;
		break;
	}
	close(d->fd);
	d->fd = -1;
	return false;
}

bool discover_step(struct job *j, struct discover *d, short revents, bool *ok, char *why,
                   size_t wlen)
{
	char name[32];
	int st;

	if (!d->running)
		return false;
	if (d->fd >= 0 && revents != 0)
		(void)drain(d);
	if (!d->killed && kdeadline_passed(d->dl) && !j->script_reaped) {
		/* Hung: its whole group goes, and the run counts as failed once it is reaped. */
		(void)kill(-j->script_pid, SIGKILL);
		d->killed = true;
	}
	if (!j->script_reaped)
		return false;
	/* It has ended: what is still in the pipe is its output (a child it left may hold the
	 * pipe open; that is not waited for). */
	if (d->fd >= 0 && drain(d)) {
		close(d->fd);
		d->fd = -1;
	}
	d->running = false;
	st = j->script_status;
	if (d->out != NULL)
		d->out[d->len] = '\0';
	*ok = false;
	if (d->killed)
		snprintf(why, wlen, "it did not finish within %.1f s (--host-discovery-timeout)",
		         (double)d->timeout_ms / 1000.0);
	else if (d->len > DISCOVER_OUT_MAX)
		snprintf(why, wlen, "it printed more than %u bytes", DISCOVER_OUT_MAX);
	else if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		*ok = true;
	else if (WIFEXITED(st))
		snprintf(why, wlen, "it exited with status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(why, wlen, "it was killed by signal %d (%s)", WTERMSIG(st),
		         say_sig_name(WTERMSIG(st), name, sizeof(name)));
	else
		snprintf(why, wlen, "it ended with wait status 0x%x", (unsigned)st);
	if (*ok && d->out == NULL) {
		d->out = malloc(1);
		if (d->out == NULL) {
			*ok = false;
			snprintf(why, wlen, "out of memory");
		} else {
			d->out[0] = '\0';
		}
	}
	return true;
}

int discover_wait_ms(const struct discover *d, int cap)
{
	if (!d->running || d->killed)
		return cap;
	return kdeadline_left_ms(d->dl, cap);
}
