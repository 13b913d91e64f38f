/* harness.c -- forking multi-rank jobs against an in-process store (see harness.h). */
#include "harness.h"

#include "rendezvous/store.h"

#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define HARNESS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HARNESS_ASAN 1
#endif
#endif
#ifdef HARNESS_ASAN
#include <sanitizer/lsan_interface.h>
#endif

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void *harness_shared(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0, bytes);
	return p;
}

void harness_shared_free(void *p, size_t bytes)
{
	if (p != NULL)
		munmap(p, bytes);
}

uint64_t harness_hash(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	return h;
}

static bool skipped(const harness_opts *o, int r)
{
	for (const int *s = o->skip_ranks; s != NULL && *s >= 0; s++)
		if (*s == r)
			return true;
	return false;
}

bool harness_run(const harness_opts *o, harness_body body, void *arg, harness_result *res)
{
	static int job_counter;
	const char *secret = o->secret ? o->secret : "test-secret-0123456789";
	store_server *srv;
	kerr err;
	pid_t pids[HARNESS_MAX_RANKS];
	char addr[64], job[64];
	double t0 = now_s(), deadline = o->deadline_s > 0 ? o->deadline_s : 60;
	bool ok = true;
	int left = 0;

	memset(res, 0, sizeof(*res));
	if (o->n < 1 || o->n > HARNESS_MAX_RANKS)
		return false;
	snprintf(job, sizeof(job), "%s", o->job_id ? o->job_id : "");
	if (job[0] == '\0')
		snprintf(job, sizeof(job), "t%d-%d", (int)getpid(), job_counter++);
	/*
	 * Fork every rank before the store's thread exists: a fork while another thread holds
	 * a lock (allocator, libc, a sanitizer's) can leave the child stuck on it. Each rank
	 * learns the store's port through its pipe.
	 */
	int port_pipe[HARNESS_MAX_RANKS][2];
	pid_t parent = getpid();
	fflush(NULL);
	for (int r = 0; r < o->n; r++) {
		pids[r] = -1;
		if (skipped(o, r)) {
			res->status[r] = -1;
			continue;
		}
		if (pipe(port_pipe[r]) != 0)
			return false;
		pids[r] = fork();
		if (pids[r] == 0) {
			khor_config *cfg;
			char v[32];
			uint16_t port = 0;
			/* A rank outlives no harness: when Criterion kills a test that ran past its
			 * .timeout, its ranks go with it instead of holding CTest's output pipe open
			 * (and CTest waiting) until the whole binary's TIMEOUT. */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(98); /* it died before prctl */
			close(port_pipe[r][1]);
			if (read(port_pipe[r][0], &port, sizeof(port)) != (ssize_t)sizeof(port))
				_exit(99); /* the parent could not start the store */
			close(port_pipe[r][0]);
			snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
			khor_config_create(&cfg);
			snprintf(v, sizeof(v), "%d", r);
			khor_config_set(cfg, "KHOR_RANK", v);
			snprintf(v, sizeof(v), "%d", o->n);
			khor_config_set(cfg, "KHOR_SIZE", v);
			khor_config_set(cfg, "KHOR_STORE_ADDR", addr);
			khor_config_set(cfg, "KHOR_SECRET", secret);
			khor_config_set(cfg, "KHOR_JOB_ID", job);
			khor_config_set(cfg, "KHOR_TIMEOUT", o->timeout ? o->timeout : "30s");
			int rc = body(r, o->n, cfg, arg);
			khor_config_destroy(cfg);
			fflush(NULL);
			_exit(rc);
		}
		close(port_pipe[r][0]);
		left++;
	}
	khor_status sst = store_server_start("127.0.0.1", 0, secret, job, &srv, &err);
	uint16_t port = sst == KHOR_SUCCESS ? store_server_port(srv) : 0;
	if (sst != KHOR_SUCCESS)
		fprintf(stderr, "harness: store: %s\n", err.text);
	for (int r = 0; r < o->n; r++) {
		if (pids[r] <= 0)
			continue;
		if (sst == KHOR_SUCCESS && write(port_pipe[r][1], &port, sizeof(port)) != sizeof(port))
			fprintf(stderr, "harness: cannot hand the store port to rank %d\n", r);
		close(port_pipe[r][1]);
	}
	while (left > 0) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) {
			for (int r = 0; r < o->n; r++) {
				if (pids[r] == p) {
					res->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
					res->seconds[r] = now_s() - t0;
					if (res->status[r] != 0)
						ok = false;
					if (r == o->kill_rank && o->kill_after_s > 0 && res->killed_at == 0)
						res->killed_at = -1; /* it ended before we could kill it */
					pids[r] = -1;
					left--;
				}
			}
			continue;
		}
		if (o->kill_after_s > 0 && res->killed_at == 0 && now_s() - t0 > o->kill_after_s &&
		    o->kill_rank >= 0 && o->kill_rank < o->n && pids[o->kill_rank] > 0 &&
		    (o->kill_ready == NULL || o->kill_ready(arg))) {
			kill(pids[o->kill_rank], SIGKILL);
			res->killed_at = now_s() - t0;
		}
		if (now_s() - t0 > deadline) {
			res->timed_out = true;
			ok = false;
			for (int r = 0; r < o->n; r++)
				if (pids[r] > 0)
					kill(pids[r], SIGKILL);
			deadline += 1e9; /* reap them on the next turns */
			continue;
		}
		struct timespec ts = { 0, 2 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	if (sst == KHOR_SUCCESS) {
		res->store_values = store_server_values(srv);
		store_server_stop(srv);
	}
	return ok && sst == KHOR_SUCCESS;
}

int harness_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int k = 0;

	if (d == NULL)
		return -1;
	while (readdir(d) != NULL)
		k++;
	closedir(d);
	return k;
}

int harness_count_threads(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int k = -1;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "Threads: %d", &k) == 1)
			break;
	fclose(f);
	return k;
}

long long harness_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long long size = 0, res = 0;

	if (f == NULL)
		return -1;
	if (fscanf(f, "%lld %lld", &size, &res) != 2)
		res = -1;
	fclose(f);
	return res * sysconf(_SC_PAGESIZE);
}

long long harness_heap_bytes(void)
{
	struct mallinfo2 mi = mallinfo2();
	return (long long)(mi.uordblks + mi.hblkhd);
}

double harness_now(void)
{
	return now_s();
}

void harness_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

int harness_fail(char *err, size_t len, int rank, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	fprintf(stderr, "rank %d: %s\n", rank, err);
	return code;
}

bool harness_leaks(void)
{
#ifdef HARNESS_ASAN
	return __lsan_do_recoverable_leak_check() != 0;
#else
	return false;
#endif
}
