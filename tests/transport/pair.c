/*
 * pair.c -- two ranks of a transport between real processes (pair.h): the forks, the
 * shared board, and the parent that watches, kills on request and enforces the deadline.
 */
#include "pair.h"

#include "base/log.h"
#include "collectives/coll.h"
#include "transport/shm/shm.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* A link's error, copied out (link_error gives it by copy, since another thread may be
 * setting it). */
const kerr *pair_link_error(const struct transport_ops *tp, tp_link *l)
{
	static kerr e;

	kerr_clear(&e);
	tp->link_error(l, &e);
	return &e;
}

static struct board *board_new(void)
{
	struct board *b =
	    mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert(b != MAP_FAILED);
	memset(b, 0, sizeof(*b));
	return b;
}

/* ---- inside a rank ------------------------------------------------------------------- */

void pair_fail(struct rank_env *env, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(env->b->msg[env->rank], MSG_MAX, fmt, ap);
	va_end(ap);
	_exit(1);
}

tp_ctx *pair_ctx(struct rank_env *env, const char *secret)
{
	/* ib's bootstrap goes where the device is (KHOR_SOCKET_IFNAME in the VM). */
	const char *ifname = env->tp == &tcp_transport_ops || env->tp == &shm_transport_ops ||
	                             getenv("KHOR_SOCKET_IFNAME") == NULL
	                         ? "lo"
	                         : getenv("KHOR_SOCKET_IFNAME");
	tp_options o = {.rank = env->rank,
	                .size = 2,
	                .job_id = env->job->job_id,
	                .secret = secret ? secret : "test-secret",
	                .ifname_spec = ifname,
	                .nsocks = 2,
	                .min_stripe_bytes = 65536,
	                .handshake_timeout_ms = 5000,
	                .shm_cma = env->job->cma != NULL && strcmp(env->job->cma, "1") == 0,
	                .meta = &coll_meta_rules};
	tp_ctx *c = NULL;
	kerr e;

	CHECK(env->tp->create(&o, &c, &e) == KHOR_SUCCESS, "create: %s", e.text);
	return c;
}

/* Rank 0 connects to rank 1 (whose address is on the board); rank 1 accepts. */
tp_link *pair_link_up(struct rank_env *env, tp_ctx *c)
{
	const struct transport_ops *tp = env->tp;
	kdeadline dl = kdeadline_in_ms(10000);
	tp_link *l = NULL;
	kerr e;

	if (env->rank == 0) {
		while (!atomic_load(&env->b->ready[1]))
			CHECK(!kdeadline_passed(dl), "rank 1 never published its address");
		CHECK(tp->connect(c, 1, env->b->addr[1], &l, &e) == KHOR_SUCCESS, "connect: %s",
		      e.text);
		while (!tp->link_ready(l)) {
			CHECK(pair_link_error(tp, l)->status == KHOR_SUCCESS, "link: %s",
			      pair_link_error(tp, l)->text);
			CHECK(!kdeadline_passed(dl), "link did not come up");
			tp->progress(c, 5, NULL, &e);
		}
	} else {
		while (l == NULL) {
			CHECK(!kdeadline_passed(dl), "rank 0 never connected");
			tp->progress(c, 5, NULL, &e);
			CHECK(tp->accept(c, 0, &l, &e) == KHOR_SUCCESS, "accept: %s", e.text);
		}
	}
	char d[128];
	tp->describe(l, d, sizeof(d));
	if (tp == &shm_transport_ops) {
		CHECK(strncmp(d, "pid ", 4) == 0 && strstr(d, ", large messages by ") != NULL,
		      "describe: %s", d);
		/* The cma cases must really read by process_vm_readv where the kernel allows it
		 * (Yama's ptrace_scope above 0 forbids it between sibling processes). */
		const bool cma = env->job->cma != NULL && strcmp(env->job->cma, "1") == 0;
		FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
		int scope = 0;
		if (f != NULL) {
			if (fscanf(f, "%d", &scope) != 1)
				scope = 1;
			fclose(f);
		}
		if (!cma || scope == 0)
			CHECK(strstr(d, cma ? "process_vm_readv" : "the ring") != NULL,
			      "KHOR_SHM_CMA=%s, but describe says: %s", cma ? "1" : "0", d);
	}
	else if (tp == &tcp_transport_ops)
		CHECK(strstr(d, ", 2 sockets") != NULL, "describe: %s", d);
	else
		CHECK(strstr(d, " port ") != NULL && strstr(d, "GID") != NULL &&
		          strstr(d, "QP") != NULL,
		      "describe: %s", d);
	return l;
}

/* Waits for r, driving progress with timeout_ms per call (so sleeping and wake-ups get
 * exercised). Returns the request's status; e gets its error. */
khor_status pair_wait(struct rank_env *env, tp_req *r, int timeout_ms, kerr *e)
{
	kdeadline dl = kdeadline_in_ms(60000);

	for (;;) {
		bool done = false;
		khor_status st = env->tp->test(r, &done, e);
		if (done)
			return st;
		CHECK(!kdeadline_passed(dl), "request never completed");
		CHECK(env->tp->progress(env->ctx, timeout_ms, NULL, e) == KHOR_SUCCESS,
		      "progress: %s", e->text);
	}
}

void pair_fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

bool pair_check_fill(const uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		if (p[i] != (uint8_t)(x >> 16))
			return false;
	}
	return true;
}

/* memfd descriptors and mappings of this process ("nothing left behind"). */
void pair_count_memfd(int *fds_out, int *maps_out)
{
	char path[64], target[256], line[512];
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	FILE *f;

	*fds_out = *maps_out = 0;
	while (d != NULL && (de = readdir(d)) != NULL) {
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n > 0) {
			target[n] = '\0';
			if (strstr(target, "memfd:khor") != NULL)
				(*fds_out)++;
		}
	}
	if (d != NULL)
		closedir(d);
	f = fopen("/proc/self/maps", "r");
	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if (strstr(line, "memfd:khor") != NULL)
			(*maps_out)++;
	if (f != NULL)
		fclose(f);
}

static void rank_main(struct job *j, struct board *b, int rank)
{
	struct rank_env env_s = {.rank = rank, .tp = j->tp, .b = b, .job = j}, *env = &env_s;
	int fds, maps;

	atomic_store(&b->pid[rank], (int)getpid());
	klog_init_from_env(); /* KHOR_LOG=debug shows each link's path and each failure */
	pair_count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 0, "memfd before the job: %d fds, %d maps", fds, maps);
	env->ctx = pair_ctx(env, j->secret[rank]);
	kstrlcpy(b->addr[rank], j->tp->address(env->ctx), TP_ADDR_MAX);
	atomic_store(&b->ready[rank], 1);
	if (!j->no_link)
		env->link = pair_link_up(env, env->ctx);
	j->body[rank](env);
	if (env->ctx != NULL) {
		/* Let the last frames drain before closing (the peer may still be reading). */
		for (int i = 0; i < 10; i++)
			j->tp->progress(env->ctx, 1, NULL, &(kerr){0});
		j->tp->destroy(env->ctx);
	}
	pair_count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 0, "memfd left after destroy: %d fds, %d maps", fds, maps);
#if defined(__SANITIZE_ADDRESS__)
	/* _exit skips LeakSanitizer's exit hook: ask for the check here (it exits non-zero on a
	 * leak, which fails the test). */
	__lsan_do_leak_check();
#endif
	_exit(0);
}

/* Runs both ranks; returns the board for extra checks. Asserts each rank's exit. */
struct board *pair_run(struct job *j)
{
	static int counter;
	struct board *b = board_new();
	pid_t pids[2];
	int status[2] = {-1, -1};
	int pipefd[2] = {-1, -1};
	bool killed = false;
	kdeadline dl = kdeadline_in_ms((int64_t)(j->deadline_s ? j->deadline_s : 60) * 1000);

	snprintf(j->job_id, sizeof(j->job_id), "test-shm-%d-%d", (int)getpid(), counter++);
	if (j->capture_stderr >= 0)
		cr_assert(pipe(pipefd) == 0);
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		cr_assert(pids[r] >= 0);
		if (pids[r] == 0) {
			if (r == j->capture_stderr) {
				dup2(pipefd[1], 2);
				close(pipefd[0]);
			}
			rank_main(j, b, r);
		}
	}
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	while (status[0] == -1 || status[1] == -1) {
		for (int r = 0; r < 2; r++) {
			int ws;
			if (status[r] == -1 && waitpid(pids[r], &ws, WNOHANG) == pids[r])
				status[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
		}
		if (!killed && j->kill_rank >= 0 && status[j->kill_rank] == -1 &&
		    atomic_load(&b->phase[j->kill_rank]) >= j->kill_phase) {
			usleep((useconds_t)j->kill_delay_ms * 1000);
			atomic_store(&b->killed_at_ns, kclock_ns());
			kill(pids[j->kill_rank], SIGKILL);
			killed = true;
		}
		if (kdeadline_passed(dl)) {
			for (int r = 0; r < 2; r++)
				if (status[r] == -1)
					kill(pids[r], SIGKILL);
			for (int r = 0; r < 2; r++)
				if (status[r] == -1)
					waitpid(pids[r], NULL, 0);
			cr_assert_fail("job did not finish within %d s (rank 0: %s; rank 1: %s)",
			               j->deadline_s ? j->deadline_s : 60, b->msg[0], b->msg[1]);
		}
		usleep(1000);
	}
	if (pipefd[0] >= 0) {
		ssize_t n = read(pipefd[0], b->log, LOG_MAX - 1);
		b->log[n > 0 ? n : 0] = '\0';
		close(pipefd[0]);
	}
	for (int r = 0; r < 2; r++) {
		if (killed && r == j->kill_rank) {
			cr_assert_eq(status[r], 128 + SIGKILL,
			             "rank %d was to be killed but exited %d: %s", r, status[r],
			             b->msg[r]);
			continue;
		}
		cr_assert_eq(status[r], 0, "rank %d failed (exit %d): %s", r, status[r], b->msg[r]);
	}
	if (j->kill_rank >= 0)
		cr_assert(killed, "the kill never happened");
	return b;
}

struct job pair_job(const struct transport_ops *tp, const char *cma, rank_body b0, rank_body b1)
{
	struct job j = {
	    .tp = tp, .cma = cma, .body = {b0, b1}, .kill_rank = -1, .capture_stderr = -1};
	return j;
}

/* ---- bodies more than one test file runs ------------------------------------------- */

void pair_stream_forever(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *x = malloc(len);
	kerr e;

	pair_fill(x, 4096, 1);
	for (uint32_t i = 0;; i++) {
		tp_req *s;
		tp_tag t = {5, i, 0, 0};
		CHECK(env->tp->isend(env->link, x, len, t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
		      e.text);
		pair_wait(env, s, 0, &e);
		atomic_store(&env->b->phase[0], (int)i + 1);
	}
}
