/*
 * proc.c -- a program run by a test as a child, its output read as it comes (see proc.h).
 */
#include "proc.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *khorrun_path(void)
{
	const char *p = getenv("KHORRUN");

	return p != NULL && *p != '\0' ? p : "./khorrun";
}

/* Starts khorrun with args (NULL-terminated, without argv[0]); env is "NAME=VALUE"s or NULL. */
void proc_start(struct proc *p, const char *const *args, const char *const *env)
{
	int po[2], pe[2];
	size_t n = 0;

	memset(p, 0, sizeof(*p));
	while (args[n] != NULL)
		n++;
	cr_assert_eq(pipe(po), 0);
	cr_assert_eq(pipe(pe), 0);
	p->secs = now_s();
	p->pid = fork();
	cr_assert_geq(p->pid, 0, "fork: %s", strerror(errno));
	if (p->pid == 0) {
		const char **argv = calloc(n + 2, sizeof(*argv));

		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(po[1]);
		close(pe[0]);
		close(pe[1]);
		for (size_t i = 0; env != NULL && env[i] != NULL; i++)
			putenv((char *)env[i]);
		argv[0] = khorrun_path();
		memcpy(argv + 1, args, n * sizeof(*argv));
		execv(argv[0], (char **)argv);
		fprintf(stderr, "exec %s: %s (set KHORRUN to the built binary)\n", argv[0],
		        strerror(errno));
		_exit(99);
	}
	close(po[1]);
	close(pe[1]);
	p->fd[0] = po[0];
	p->fd[1] = pe[0];
}

/* Reads what is there (waiting up to ms); returns false once both pipes are at EOF. */
bool proc_pump(struct proc *p, int ms)
{
	struct pollfd pfd[2];
	int n = 0, map[2];

	for (int k = 0; k < 2; k++) {
		if (!p->b[k].eof) {
			pfd[n] = (struct pollfd){ .fd = p->fd[k], .events = POLLIN };
			map[n++] = k;
		}
	}
	if (n == 0)
		return false;
	if (poll(pfd, (nfds_t)n, ms) <= 0)
		return true;
	for (int i = 0; i < n; i++) {
		struct buf *b = &p->b[map[i]];
		ssize_t r;

		if (pfd[i].revents == 0)
			continue;
		if (b->cap - b->len < 65536 + 1) {
			b->cap = b->cap * 2 + 65536 + 1;
			b->data = realloc(b->data, b->cap);
			cr_assert_not_null(b->data);
		}
		r = read(p->fd[map[i]], b->data + b->len, b->cap - b->len - 1);
		if (r > 0)
			b->len += (size_t)r;
		else if (r == 0 || errno != EINTR)
			b->eof = true;
		b->data[b->len] = '\0';
	}
	return true;
}

/* Collects the rest of the output and the exit status; fails the test after timeout_s. */
void proc_finish(struct proc *p, double timeout_s)
{
	double start = p->secs, deadline = now_s() + timeout_s;
	pid_t w = 0;

	while (proc_pump(p, 100)) {
		if (now_s() > deadline)
			break;
	}
	while (now_s() <= deadline && (w = waitpid(p->pid, &p->status, WNOHANG)) == 0)
		usleep(10000);
	if (w != p->pid) {
		kill(p->pid, SIGKILL);
		waitpid(p->pid, &p->status, 0);
		cr_assert_fail("khorrun did not exit within %.1f s\nstdout:\n%s\nstderr:\n%s",
		               timeout_s, p->b[0].data ? p->b[0].data : "",
		               p->b[1].data ? p->b[1].data : "");
	}
	p->secs = now_s() - start;
	for (int k = 0; k < 2; k++) {
		close(p->fd[k]);
		if (p->b[k].data == NULL)
			p->b[k].data = calloc(1, 1);
	}
}

void proc_free(struct proc *p)
{
	free(p->b[0].data);
	free(p->b[1].data);
}

int exit_code(const struct proc *p)
{
	cr_assert(WIFEXITED(p->status), "khorrun did not exit normally (status 0x%x)", p->status);
	return WEXITSTATUS(p->status);
}

struct proc run(const char *const *args, double timeout_s)
{
	struct proc p;

	proc_start(&p, args, NULL);
	proc_finish(&p, timeout_s);
	return p;
}

size_t count_str(const char *hay, const char *needle)
{
	size_t n = 0;

	for (const char *s = strstr(hay, needle); s != NULL; s = strstr(s + 1, needle))
		n++;
	return n;
}

/* Waits until stream k (0 stdout, 1 stderr) holds n occurrences of needle. */
void wait_for_in(struct proc *p, int k, const char *needle, size_t n, double timeout_s)
{
	double deadline = now_s() + timeout_s;

	while (count_str(p->b[k].data ? p->b[k].data : "", needle) < n) {
		cr_assert(now_s() < deadline, "no %zu x '%s' in khorrun's %s after %.1f s:\n%s\n%s",
		          n, needle, k == 0 ? "stdout" : "stderr", timeout_s,
		          p->b[0].data ? p->b[0].data : "", p->b[1].data ? p->b[1].data : "");
		if (!proc_pump(p, 100))
			cr_assert_fail("khorrun exited before printing %zu x '%s':\n%s\n%s", n,
			               needle, p->b[0].data ? p->b[0].data : "",
			               p->b[1].data ? p->b[1].data : "");
	}
}

void wait_for(struct proc *p, const char *needle, size_t n, double timeout_s)
{
	wait_for_in(p, 0, needle, n, timeout_s);
}

/* Every number that follows `key` (e.g. "pid=") in text, up to max. */
size_t collect_pids(const char *text, const char *key, pid_t *pids, size_t max)
{
	size_t n = 0;

	for (const char *s = strstr(text, key); s != NULL && n < max; s = strstr(s + 1, key))
		pids[n++] = (pid_t)atoi(s + strlen(key));
	return n;
}

/* True when no process has this pid any more (zombies count as alive: nobody reaped them). */
bool pid_gone(pid_t pid)
{
	return kill(pid, 0) != 0 && errno == ESRCH;
}

void assert_all_gone(const pid_t *pids, size_t n)
{
	/* khorrun reaps what it started before it exits, so there is no wait here. */
	for (size_t i = 0; i < n; i++)
		cr_assert(pid_gone(pids[i]), "process %d outlived khorrun", (int)pids[i]);
}
