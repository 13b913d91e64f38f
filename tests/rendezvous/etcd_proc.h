/*
 * etcd_proc.h -- a real etcd server for a test: Debian's etcd on 127.0.0.1 with free ports
 * and a data directory of its own (on /dev/shm when there is one: etcd syncs every write),
 * started, killed and restarted by pid. A test calls etcd_up from its main thread (etcd
 * dies with that thread: PR_SET_PDEATHSIG, so a crashed test leaves no server behind).
 * Without the etcd binary (.ci/packages --etcd installs it) the test is skipped.
 */
#ifndef KHOR_TESTS_ETCD_PROC_H
#define KHOR_TESTS_ETCD_PROC_H

#include "rendezvous/etcd.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct etcd_proc {
	pid_t pid; /* 0 when not running */
	uint16_t port, peer_port;
	char dir[128]; /* holds data/ and etcd.log */
};

static inline bool etcd_installed(void)
{
	const char *path = getenv("PATH");
	char buf[4096], *save = NULL;

	kstrlcpy(buf, path != NULL ? path : "/usr/bin:/bin", sizeof(buf));
	for (char *d = strtok_r(buf, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
		char f[4200];
		snprintf(f, sizeof(f), "%s/etcd", d);
		if (access(f, X_OK) == 0)
			return true;
	}
	return false;
}

static inline uint16_t etcd_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	getsockname(fd, (struct sockaddr *)&a, &al);
	close(fd);
	return ntohs(a.sin_port);
}

static inline void etcd_spawn(struct etcd_proc *p)
{
	char client[64], peer[64], cluster[96], data[160], logf[160];
	pid_t parent = getpid();

	snprintf(client, sizeof(client), "http://127.0.0.1:%u", p->port);
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", p->peer_port);
	snprintf(cluster, sizeof(cluster), "khor-test=%s", peer);
	snprintf(data, sizeof(data), "%s/data", p->dir);
	snprintf(logf, sizeof(logf), "%s/etcd.log", p->dir);
	p->pid = fork();
	cr_assert_geq(p->pid, 0);
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
		int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		/* A short election timeout: a one-member cluster is up in ~0.1 s, not ~1 s. */
		execlp("etcd", "etcd", "--name", "khor-test", "--data-dir", data,
		       "--listen-client-urls", client, "--advertise-client-urls", client,
		       "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		       "--initial-cluster", cluster, "--logger", "zap", "--log-level", "error",
		       "--heartbeat-interval", "10", "--election-timeout", "100", (char *)NULL);
		_exit(127);
	}
}

/* Waits until etcd answers (true) or exits or 10 s pass (false). */
static inline bool etcd_wait_ready(struct etcd_proc *p)
{
	uint64_t until = kclock_ns() + 10000000000ull;

	while (kclock_ns() < until) {
		int status;
		etcd *e;
		kerr err;
		if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
			p->pid = 0;
			return false;
		}
		if (etcd_open("127.0.0.1", p->port, kdeadline_in_ms(100), &e, &err) == KHOR_SUCCESS) {
			etcd_close(e);
			return true;
		}
	}
	return false;
}

static inline void etcd_kill(struct etcd_proc *p, int sig)
{
	if (p->pid > 0) {
		kill(p->pid, sig);
		waitpid(p->pid, NULL, 0);
		p->pid = 0;
	}
}

static inline void etcd_log_tail(const struct etcd_proc *p, char *buf, size_t cap)
{
	char logf[160];
	FILE *f;
	size_t n = 0;

	buf[0] = '\0';
	snprintf(logf, sizeof(logf), "%s/etcd.log", p->dir);
	if ((f = fopen(logf, "r")) == NULL)
		return;
	fseek(f, -(long)(cap - 1), SEEK_END);
	n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* Starts etcd again on the same ports and data (after etcd_kill). */
static inline void etcd_restart(struct etcd_proc *p)
{
	char log[1024];

	etcd_spawn(p);
	if (!etcd_wait_ready(p)) {
		etcd_log_tail(p, log, sizeof(log));
		cr_assert_fail("etcd did not come back on port %u: %s", p->port, log);
	}
}

static inline int etcd_rm_entry(const char *path, const struct stat *sb, int type,
                                struct FTW *ftw)
{
	(void)sb;
	(void)type;
	(void)ftw;
	return remove(path);
}

static struct etcd_proc *etcd_atexit_proc;
static pid_t etcd_owner; /* the test process; its forked children leave etcd alone */

static inline void etcd_down(struct etcd_proc *p)
{
	etcd_kill(p, SIGKILL);
	if (p->dir[0] != '\0')
		nftw(p->dir, etcd_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	p->dir[0] = '\0';
}

/* A failed assertion ends the test without its last lines: the server goes anyway. */
static inline void etcd_down_at_exit(void)
{
	if (etcd_atexit_proc != NULL && getpid() == etcd_owner)
		etcd_down(etcd_atexit_proc);
}

static inline void etcd_up(struct etcd_proc *p)
{
	char log[1024];

	if (!etcd_installed())
		cr_skip_test("etcd is not installed (.ci/packages --etcd installs it)");
	memset(p, 0, sizeof(*p));
	snprintf(p->dir, sizeof(p->dir), "%s/khor-etcd.XXXXXX",
	         access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	cr_assert_not_null(mkdtemp(p->dir));
	if (etcd_atexit_proc == NULL)
		atexit(etcd_down_at_exit);
	etcd_atexit_proc = p;
	etcd_owner = getpid();
	/* A free port found here may be taken before etcd binds it: then try others. */
	for (int tries = 0; tries < 3; tries++) {
		p->port = etcd_free_port();
		do
			p->peer_port = etcd_free_port();
		while (p->peer_port == p->port);
		etcd_spawn(p);
		if (etcd_wait_ready(p))
			return;
		etcd_kill(p, SIGKILL);
	}
	etcd_log_tail(p, log, sizeof(log));
	cr_assert_fail("etcd did not start: %s", log);
}

#endif
