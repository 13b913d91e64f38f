/*
 * test_shm.c -- the shared-memory transport between real processes: each test forks two
 * ranks that make their own transport instance, trade addresses through a shared page (the
 * stand-in for the store), link up and move data. The parent only watches: it kills a rank
 * when a test asks for it, and kills everything that outlives the test's deadline.
 *
 * The transport-generic cases run three times: over shm as configured by default (every
 * message through the ring; suite shm), over shm with messages over 16 MiB read by
 * process_vm_readv (shm_cma, KHOR_SHM_CMA=1) and over tcp on loopback (tcp), so the two
 * transports are held to the
 * same contract: tag matching in any posting order, no overrun on a length mismatch, a
 * dead peer named within seconds, and data sent before a peer exits still delivered.
 * The shm-only cases check the handshake's refusal of strangers, wake-ups of a sleeping
 * rank, fairness between one huge and many small messages, and that nothing (no /dev/shm
 * entry, no memfd, no socket) is left behind, also after kill -9.
 */
#include "collectives/coll.h"
#include "transport/ib/ib.h"
#include "transport/shm/shm.h"
#include "base/log.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
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
static const kerr *lerr(const struct transport_ops *tp, tp_link *l)
{
	static kerr e;

	kerr_clear(&e);
	tp->link_error(l, &e);
	return &e;
}

#define MSG_MAX 2048
#define LOG_MAX 8192

/* The page both ranks and the parent share. */
struct board {
	char addr[2][TP_ADDR_MAX];
	_Atomic int ready[2];
	_Atomic int phase[2];
	_Atomic uint64_t killed_at_ns;
	_Atomic int pid[2];
	char msg[2][MSG_MAX];
	char log[LOG_MAX]; /* captured stderr of one rank */
};

struct rank_env {
	int rank;
	const struct transport_ops *tp;
	tp_ctx *ctx;
	tp_link *link;
	struct board *b;
	const struct job *job;
};

typedef void (*rank_body)(struct rank_env *env);

struct job {
	const struct transport_ops *tp;
	const char *cma;       /* KHOR_SHM_CMA for the ranks, or NULL */
	rank_body body[2];
	const char *secret[2]; /* NULL: "test-secret" */
	bool no_link;          /* the bodies link up themselves */
	int kill_rank;         /* -1: none; else SIGKILL it once phase[kill_rank] >= kill_phase */
	int kill_phase;
	int kill_delay_ms;
	int capture_stderr;    /* -1: none; else that rank's stderr ends up in board->log */
	int deadline_s;
	char job_id[64];
	void *arg;
};

static struct board *board_new(void)
{
	struct board *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	                       -1, 0);
	cr_assert(b != MAP_FAILED);
	memset(b, 0, sizeof(*b));
	return b;
}

/* ---- inside a rank ------------------------------------------------------------------- */

static void rank_fail(struct rank_env *env, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

static void rank_fail(struct rank_env *env, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(env->b->msg[env->rank], MSG_MAX, fmt, ap);
	va_end(ap);
	_exit(1);
}

#define CHECK(cond, fmt, ...)                                                             \
	do {                                                                              \
		if (!(cond))                                                              \
			rank_fail(env, "line %d: %s: " fmt, __LINE__, #cond, ##__VA_ARGS__); \
	} while (0)

static uint64_t now_ns(void)
{
	return kclock_ns();
}

static tp_ctx *make_ctx(struct rank_env *env, const char *secret)
{
	/* ib's bootstrap goes where the device is (KHOR_SOCKET_IFNAME in the VM). */
	const char *ifname = env->tp == &tcp_transport_ops || env->tp == &shm_transport_ops ||
	                             getenv("KHOR_SOCKET_IFNAME") == NULL
	                     ? "lo" : getenv("KHOR_SOCKET_IFNAME");
	tp_options o = { .rank = env->rank, .size = 2, .job_id = env->job->job_id,
	                 .secret = secret ? secret : "test-secret", .ifname_spec = ifname,
	                 .nsocks = 2, .min_stripe_bytes = 65536, .handshake_timeout_ms = 5000,
	                 .meta = &coll_meta_rules };
	tp_ctx *c = NULL;
	kerr e;

	CHECK(env->tp->create(&o, &c, &e) == KHOR_SUCCESS, "create: %s", e.text);
	return c;
}

/* Rank 0 connects to rank 1 (whose address is on the board); rank 1 accepts. */
static tp_link *link_up_ctx(struct rank_env *env, tp_ctx *c)
{
	const struct transport_ops *tp = env->tp;
	kdeadline dl = kdeadline_in_ms(10000);
	tp_link *l = NULL;
	kerr e;

	if (env->rank == 0) {
		while (!atomic_load(&env->b->ready[1]))
			CHECK(!kdeadline_passed(dl), "rank 1 never published its address");
		CHECK(tp->connect(c, 1, env->b->addr[1], &l, &e) == KHOR_SUCCESS, "connect: %s", e.text);
		while (!tp->link_ready(l)) {
			CHECK(lerr(tp, l)->status == KHOR_SUCCESS, "link: %s",
			      lerr(tp, l)->text);
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
	if (tp == &shm_transport_ops)
		CHECK(strncmp(d, "pid ", 4) == 0 && strstr(d, ", large messages by ") != NULL,
		      "describe: %s", d);
	else if (tp == &tcp_transport_ops)
		CHECK(strstr(d, ", 2 sockets") != NULL, "describe: %s", d);
	else
		CHECK(strstr(d, " port ") != NULL && strstr(d, "GID") != NULL &&
		      strstr(d, "QP") != NULL, "describe: %s", d);
	return l;
}

/* Waits for r, driving progress with timeout_ms per call (so sleeping and wake-ups get
 * exercised). Returns the request's status; e gets its error. */
static khor_status wait_req(struct rank_env *env, tp_req *r, int timeout_ms, kerr *e)
{
	kdeadline dl = kdeadline_in_ms(60000);

	for (;;) {
		bool done = false;
		khor_status st = env->tp->test(r, &done, e);
		if (done)
			return st;
		CHECK(!kdeadline_passed(dl), "request never completed");
		CHECK(env->tp->progress(env->ctx, timeout_ms, NULL, e) == KHOR_SUCCESS, "progress: %s",
		      e->text);
	}
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

static bool check_fill(const uint8_t *p, size_t len, uint32_t seed)
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
static void count_memfd(int *fds_out, int *maps_out)
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
	struct rank_env env_s = { .rank = rank, .tp = j->tp, .b = b, .job = j }, *env = &env_s;
	int fds, maps;

	atomic_store(&b->pid[rank], (int)getpid());
	klog_init_from_env(); /* KHOR_LOG=debug shows each link's path and each failure */
	if (j->cma != NULL)
		setenv("KHOR_SHM_CMA", j->cma, 1);
	count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 0, "memfd before the job: %d fds, %d maps", fds, maps);
	env->ctx = make_ctx(env, j->secret[rank]);
	kstrlcpy(b->addr[rank], j->tp->address(env->ctx), TP_ADDR_MAX);
	atomic_store(&b->ready[rank], 1);
	if (!j->no_link)
		env->link = link_up_ctx(env, env->ctx);
	j->body[rank](env);
	if (env->ctx != NULL) {
		/* Let the last frames drain before closing (the peer may still be reading). */
		for (int i = 0; i < 10; i++)
			j->tp->progress(env->ctx, 1, NULL, &(kerr){ 0 });
		j->tp->destroy(env->ctx);
	}
	count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 0, "memfd left after destroy: %d fds, %d maps", fds, maps);
#if defined(__SANITIZE_ADDRESS__)
	/* _exit skips LeakSanitizer's exit hook: ask for the check here (it exits non-zero on a
	 * leak, which fails the test). */
	__lsan_do_leak_check();
#endif
	_exit(0);
}

/* ---- in the parent ------------------------------------------------------------------- */

static void list_dir(const char *path, char *out, size_t len)
{
	DIR *d = opendir(path);
	struct dirent *de;

	out[0] = '\0';
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		strncat(out, de->d_name, len - strlen(out) - 2);
		strncat(out, "\n", len - strlen(out) - 1);
	}
	if (d != NULL)
		closedir(d);
}

/* Abstract sockets named after one of the ranks still exist in this network namespace? */
static bool rank_socket_left(const struct board *b)
{
	char line[512], pat[64];
	FILE *f = fopen("/proc/net/unix", "r");
	bool found = false;

	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		for (int r = 0; r < 2; r++) {
			snprintf(pat, sizeof(pat), "@khor-shm.");
			char *p = strstr(line, pat);
			snprintf(pat, sizeof(pat), ".%d.%d.", r, atomic_load(&b->pid[r]));
			if (p != NULL && strstr(p, pat) != NULL)
				found = true;
		}
	}
	if (f != NULL)
		fclose(f);
	return found;
}

/* Runs both ranks; returns the board for extra checks. Asserts each rank's exit. */
static struct board *run_job(struct job *j)
{
	static int counter;
	struct board *b = board_new();
	pid_t pids[2];
	int status[2] = { -1, -1 };
	int pipefd[2] = { -1, -1 };
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
			atomic_store(&b->killed_at_ns, now_ns());
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
			cr_assert_eq(status[r], 128 + SIGKILL, "rank %d was to be killed but exited %d: %s",
			             r, status[r], b->msg[r]);
			continue;
		}
		cr_assert_eq(status[r], 0, "rank %d failed (exit %d): %s", r, status[r], b->msg[r]);
	}
	if (j->kill_rank >= 0)
		cr_assert(killed, "the kill never happened");
	return b;
}

static struct job job_of(const struct transport_ops *tp, const char *cma, rank_body b0,
                         rank_body b1)
{
	struct job j = { .tp = tp, .cma = cma, .body = { b0, b1 }, .kill_rank = -1,
	                 .capture_stderr = -1 };
	return j;
}

#ifdef KHOR_HAVE_IB
/* ib runs where a device is (the soft-RoCE VM, tests/ib/); elsewhere its cases skip. */
static void need_ib(void)
{
	tp_options o = { .rank = 0, .size = 2, .job_id = "probe", .secret = "", .nsocks = 1,
	                 .handshake_timeout_ms = 1000 };
	tp_ctx *c;
	kerr e;

	if (ib_transport_ops.create(&o, &c, &e) != KHOR_SUCCESS)
		cr_skip_test("no usable RDMA device here: %s", e.text);
	ib_transport_ops.destroy(c);
}
#define IB_CASE(name, secs)                                                               \
	Test(ib, name, .timeout = 4 * (secs))                                             \
	{                                                                                 \
		need_ib();                                                                \
		name##_run(&ib_transport_ops, NULL);                                      \
	}
#else
#define IB_CASE(name, secs)
#endif

/* One test body, run over shm (ring only), shm with CMA for large messages, tcp and ib. */
#define TRANSPORT_TEST(name, secs)                                                        \
	static void name##_run(const struct transport_ops *tp, const char *cma);          \
	Test(shm, name, .timeout = secs) { name##_run(&shm_transport_ops, NULL); }        \
	Test(shm_cma, name, .timeout = secs) { name##_run(&shm_transport_ops, "1"); }     \
	Test(tcp, name, .timeout = secs) { name##_run(&tcp_transport_ops, NULL); }        \
	IB_CASE(name, secs)                                                               \
	static void name##_run(const struct transport_ops *tp, const char *cma)

/* ---- sizes and tag matching ---------------------------------------------------------- */

static const size_t sizes[] = { 0, 1, 63, 4096, 65537, 1u << 20, 64u << 20 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void sizes_sender(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	kerr e;

	for (size_t k = 0; k < NSIZES; k++) {
		size_t len = sizes[k];
		uint8_t *x = malloc(len + 1), *y = malloc(len + 1);
		tp_tag t1 = { 1, (uint32_t)k, 1, 0 }, t2 = { 1, (uint32_t)k, 2, 0 };
		tp_req *s1, *s2;
		fill(x, len, (uint32_t)k * 2 + 1);
		fill(y, len, (uint32_t)k * 2 + 2);
		/* t1 then t2; the receiver posts t2 first, so t1 must wait for it. */
		CHECK(tp->isend(env->link, x, len, t1, NULL, &s1, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(tp->isend(env->link, y, len, t2, NULL, &s2, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(wait_req(env, s1, 0, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(wait_req(env, s2, 0, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		free(x);
		free(y);
	}
	/* And back the other way, with a receive posted before the send exists. */
	uint8_t *z = malloc(1u << 20);
	tp_req *r;
	tp_tag t = { 2, 0, 0, 0 };
	CHECK(tp->irecv(env->link, z, 1u << 20, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, r, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(check_fill(z, 1u << 20, 99), "reverse direction corrupted");
	free(z);
}

static void sizes_receiver(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	kerr e;

	for (size_t k = 0; k < NSIZES; k++) {
		size_t len = sizes[k];
		uint8_t *x = malloc(len + 64), *y = malloc(len + 64);
		tp_tag t1 = { 1, (uint32_t)k, 1, 0 }, t2 = { 1, (uint32_t)k, 2, 0 };
		tp_req *r1, *r2;
		memset(x, 0xee, len + 64);
		memset(y, 0xee, len + 64);
		/* Give the sender time to put both messages in flight before anything is posted. */
		for (int i = 0; i < 5; i++)
			tp->progress(env->ctx, 1, NULL, &e);
		/* Posted in the other order than sent; a large t1 may fill the ring (or socket) ahead
		 * of t2, so both are posted before waiting, as a collective does. */
		CHECK(tp->irecv(env->link, y, len, t2, NULL, &r2, &e) == KHOR_SUCCESS, "%s", e.text);
		for (int i = 0; i < 3; i++)
			tp->progress(env->ctx, 1, NULL, &e);
		CHECK(tp->irecv(env->link, x, len, t1, NULL, &r1, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(wait_req(env, r2, 1, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(wait_req(env, r1, 1, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(check_fill(x, len, (uint32_t)k * 2 + 1), "size %zu: first message corrupted", len);
		CHECK(check_fill(y, len, (uint32_t)k * 2 + 2), "size %zu: second message corrupted",
		      len);
		for (int i = 0; i < 64; i++)
			CHECK(x[len + i] == 0xee && y[len + i] == 0xee, "size %zu: wrote past the end", len);
		free(x);
		free(y);
	}
	uint8_t *z = malloc(1u << 20);
	tp_req *s;
	tp_tag t = { 2, 0, 0, 0 };
	fill(z, 1u << 20, 99);
	CHECK(tp->isend(env->link, z, 1u << 20, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, s, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	free(z);
}

TRANSPORT_TEST(sizes_0_to_64MiB_with_out_of_order_tags, 120)
{
	struct job j = job_of(tp, cma, sizes_sender, sizes_receiver);
	run_job(&j);
}

/* ---- many small messages in flight, both ways at once -------------------------------- */

#define NSMALL 3000

static void many_body(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	static uint8_t out[NSMALL][300], in[NSMALL][300];
	tp_req *s[NSMALL], *r[NSMALL];
	kerr e;

	/* Each rank sends in increasing order and posts its receives in decreasing order. */
	for (int i = 0; i < NSMALL; i++) {
		size_t len = (size_t)(i * 37) % 300;
		tp_tag t = { 3, (uint32_t)i, (uint32_t)env->rank, 0 };
		fill(out[i], len, (uint32_t)(i * 2 + env->rank));
		CHECK(tp->isend(env->link, out[i], len, t, NULL, &s[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	for (int i = NSMALL - 1; i >= 0; i--) {
		size_t len = (size_t)(i * 37) % 300;
		tp_tag t = { 3, (uint32_t)i, (uint32_t)(1 - env->rank), 0 };
		CHECK(tp->irecv(env->link, in[i], len, t, NULL, &r[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	for (int i = 0; i < NSMALL; i++) {
		CHECK(wait_req(env, s[i], 1, &e) == KHOR_SUCCESS, "send %d: %s", i, e.text);
		CHECK(wait_req(env, r[i], 1, &e) == KHOR_SUCCESS, "recv %d: %s", i, e.text);
		CHECK(check_fill(in[i], (size_t)(i * 37) % 300, (uint32_t)(i * 2 + 1 - env->rank)),
		      "message %d corrupted or misrouted", i);
	}
}

TRANSPORT_TEST(many_small_messages_in_flight_both_ways, 120)
{
	struct job j = job_of(tp, cma, many_body, many_body);
	run_job(&j);
}

/* ---- mismatches ---------------------------------------------------------------------- */

struct mismatch {
	size_t send_len, recv_len;
	uint32_t send_meta, recv_meta;
};

static const struct mismatch mismatches[] = {
	{ 100, 50, 0, 0 },                  /* eager, shorter receive */
	{ 2u << 20, 1u << 20, 0, 0 },       /* ring pieces */
	{ 32u << 20, 1u << 20, 0, 0 },      /* large: CMA in shm_cma, ring pieces elsewhere */
	{ 64, 64, 0x000100u, 0x000200u },  /* same length, different dtype */
};

static void mismatch_sender(struct rank_env *env)
{
	const struct mismatch *m = env->job->arg;
	uint8_t *x = calloc(1, m->send_len);
	tp_req *s;
	kerr e;
	tp_tag t = { 0, 7, 0, m->send_meta };

	CHECK(env->tp->isend(env->link, x, m->send_len, t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	/* Either it went out before the receiver noticed, or the link broke: never a hang. */
	wait_req(env, s, 2, &e);
	atomic_store(&env->b->phase[0], 1);
	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 2, NULL, &e);
	free(x);
}

static void mismatch_receiver(struct rank_env *env)
{
	const struct mismatch *m = env->job->arg;
	uint8_t *y = malloc(m->recv_len + 64);
	tp_req *r;
	kerr e;
	char want[64];
	tp_tag t = { 0, 7, 0, m->recv_meta };

	memset(y, 0x5a, m->recv_len + 64);
	CHECK(env->tp->irecv(env->link, y, m->recv_len, t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	khor_status st = wait_req(env, r, 2, &e);
	CHECK(st == KHOR_ERR_PROTOCOL, "status %d: %s", st, e.text);
	CHECK(strstr(e.text, "peer rank 0") != NULL, "error should name the peer: %s", e.text);
	if (m->send_len != m->recv_len) {
		snprintf(want, sizeof(want), "%zu bytes", m->send_len);
		CHECK(strstr(e.text, want) != NULL, "error should give the sent length: %s", e.text);
		snprintf(want, sizeof(want), "%zu bytes", m->recv_len);
		CHECK(strstr(e.text, want) != NULL, "error should give the posted length: %s", e.text);
	} else {
		CHECK(strstr(e.text, "float64") != NULL && strstr(e.text, "int32") != NULL,
		      "error should name both dtypes: %s", e.text);
	}
	for (size_t i = 0; i < 64; i++)
		CHECK(y[m->recv_len + i] == 0x5a, "wrote past the posted buffer");
	atomic_store(&env->b->phase[1], 1);
	free(y);
}

TRANSPORT_TEST(length_or_meta_mismatch_fails_without_overrun, 60)
{
	for (size_t i = 0; i < sizeof(mismatches) / sizeof(mismatches[0]); i++) {
		struct job j = job_of(tp, cma, mismatch_sender, mismatch_receiver);
		j.arg = (void *)&mismatches[i];
		run_job(&j);
	}
}

/* ---- cancel -------------------------------------------------------------------------- */

static void cancel_a(struct rank_env *env)
{
	uint8_t buf[32];
	tp_req *r, *r2;
	kerr e;
	tp_tag never = { 9, 9, 9, 0 }, t = { 9, 1, 0, 0 };

	CHECK(env->tp->irecv(env->link, buf, 32, never, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	env->tp->progress(env->ctx, 1, NULL, &e);
	env->tp->cancel(r); /* never matched: the link stays healthy */
	CHECK(env->tp->irecv(env->link, buf, 32, t, NULL, &r2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, r2, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(check_fill(buf, 32, 5), "payload after cancel corrupted");
	CHECK(lerr(env->tp, env->link)->status == KHOR_SUCCESS, "link broke");
}

static void cancel_b(struct rank_env *env)
{
	uint8_t buf[32];
	tp_req *s;
	kerr e;
	tp_tag t = { 9, 1, 0, 0 };

	fill(buf, 32, 5);
	CHECK(env->tp->isend(env->link, buf, 32, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, s, 2, &e) == KHOR_SUCCESS, "%s", e.text);
}

TRANSPORT_TEST(cancelled_unmatched_receive_leaves_link_healthy, 30)
{
	struct job j = job_of(tp, cma, cancel_a, cancel_b);
	run_job(&j);
}

/* ---- a peer that exits right after sending ------------------------------------------- */

static void early_exit_sender(struct rank_env *env)
{
	uint8_t buf[4096];
	tp_req *s;
	kerr e;
	tp_tag t = { 4, 1, 0, 0 };

	fill(buf, sizeof(buf), 77);
	CHECK(env->tp->isend(env->link, buf, sizeof(buf), t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(wait_req(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	env->tp->destroy(env->ctx); /* gone before the receiver even posted */
	env->ctx = NULL;
	atomic_store(&env->b->phase[0], 1);
}

static void early_exit_receiver(struct rank_env *env)
{
	uint8_t buf[4096];
	tp_req *r;
	kerr e;
	tp_tag t = { 4, 1, 0, 0 };

	while (atomic_load(&env->b->phase[0]) == 0)
		usleep(1000);
	for (int i = 0; i < 20; i++) /* let the transport notice the close first */
		env->tp->progress(env->ctx, 2, NULL, &e);
	CHECK(env->tp->irecv(env->link, buf, sizeof(buf), t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(wait_req(env, r, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(check_fill(buf, sizeof(buf), 77), "payload corrupted");
	/* But a second receive can never be satisfied: it must fail, naming the peer. */
	t.seq = 2;
	khor_status st = env->tp->irecv(env->link, buf, 16, t, NULL, &r, &e);
	if (st == KHOR_SUCCESS)
		st = wait_req(env, r, 2, &e);
	CHECK(st != KHOR_SUCCESS && strstr(e.text, "peer rank 0") != NULL, "status %d: %s", st,
	      e.text);
}

TRANSPORT_TEST(message_sent_before_the_peer_exits_is_still_delivered, 30)
{
	struct job j = job_of(tp, cma, early_exit_sender, early_exit_receiver);
	run_job(&j);
}

/* ---- kill -9 ------------------------------------------------------------------------- */

/* The rank that will be killed: streams 64 MiB messages for ever. */
static void streaming_victim(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *x = malloc(len);
	kerr e;

	fill(x, 4096, 1);
	for (uint32_t i = 0;; i++) {
		tp_req *s;
		tp_tag t = { 5, i, 0, 0 };
		CHECK(env->tp->isend(env->link, x, len, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
		wait_req(env, s, 0, &e);
		atomic_store(&env->b->phase[0], (int)i + 1);
	}
}

static void check_death_error(struct rank_env *env, khor_status st, const kerr *e, int peer)
{
	uint64_t killed = atomic_load(&env->b->killed_at_ns);
	double after = killed ? (double)(now_ns() - killed) / 1e9 : -1;
	char want[64];

	CHECK(st == KHOR_ERR_REMOTE, "status %d: %s", st, e->text);
	snprintf(want, sizeof(want), "peer rank %d", peer);
	CHECK(strstr(e->text, want) != NULL, "error should name %s: %s", want, e->text);
	if (env->tp == &shm_transport_ops) {
		snprintf(want, sizeof(want), "pid %d", atomic_load(&env->b->pid[peer]));
		CHECK(strstr(e->text, want) != NULL && strstr(e->text, "died") != NULL,
		      "error should say that pid %d died: %s", atomic_load(&env->b->pid[peer]), e->text);
	}
	CHECK(killed != 0 && after < 5.0, "the death was noticed %.2f s after the kill", after);
	CHECK(lerr(env->tp, env->link)->status == KHOR_ERR_REMOTE, "the link should be broken");
}

static void streaming_survivor(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *y = malloc(len);
	kerr e;

	for (uint32_t i = 0;; i++) {
		tp_req *r;
		tp_tag t = { 5, i, 0, 0 };
		khor_status st = env->tp->irecv(env->link, y, len, t, NULL, &r, &e);
		/* Long timeouts: the death must wake the sleeping poll(), not a timer. */
		if (st == KHOR_SUCCESS)
			st = wait_req(env, r, 10000, &e);
		if (st != KHOR_SUCCESS) {
			check_death_error(env, st, &e, 0);
			break;
		}
		CHECK(atomic_load(&env->b->killed_at_ns) == 0 || i > 0, "kill before any data");
	}
	free(y);
}

TRANSPORT_TEST(sender_killed_mid_transfer_is_named_within_seconds, 60)
{
	struct job j = job_of(tp, cma, streaming_victim, streaming_survivor);
	j.kill_rank = 0;
	j.kill_phase = 2; /* after two whole messages, in the middle of the third */
	j.kill_delay_ms = 1;
	run_job(&j);
}

static void blocked_sender(struct rank_env *env)
{
	size_t len = 32u << 20;
	uint8_t *x = calloc(1, len);
	tp_req *s[4];
	kerr e;

	/* The receiver posts nothing: these fill the ring (or wait as RTS, or fill the socket). */
	for (int i = 0; i < 4; i++) {
		tp_tag t = { 6, (uint32_t)i, 0, 0 };
		CHECK(env->tp->isend(env->link, x, len, t, NULL, &s[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	atomic_store(&env->b->phase[0], 1);
	khor_status st = wait_req(env, s[0], 10000, &e);
	check_death_error(env, st, &e, 1);
	for (int i = 1; i < 4; i++)
		wait_req(env, s[i], 10, &e);
	free(x);
}

static void idle_victim(struct rank_env *env)
{
	while (atomic_load(&env->b->phase[0]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &(kerr){ 0 });
	atomic_store(&env->b->phase[1], 1);
	for (;;)
		pause();
}

TRANSPORT_TEST(receiver_killed_while_sender_waits_is_named_within_seconds, 60)
{
	struct job j = job_of(tp, cma, blocked_sender, idle_victim);
	j.kill_rank = 1;
	j.kill_phase = 1;
	j.kill_delay_ms = 200;
	run_job(&j);
}

/* ---- shm only: strangers ------------------------------------------------------------- */

static void stranger_then_real(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	tp_link *bad;
	kerr e;
	kdeadline dl = kdeadline_in_ms(10000);

	/* env->ctx has the wrong secret. */
	while (!atomic_load(&env->b->ready[1]))
		CHECK(!kdeadline_passed(dl), "rank 1 never published its address");
	CHECK(tp->connect(env->ctx, 1, env->b->addr[1], &bad, &e) == KHOR_SUCCESS, "%s", e.text);
	while (lerr(tp, bad)->status == KHOR_SUCCESS) {
		CHECK(!tp->link_ready(bad), "a link with the wrong secret came up");
		CHECK(!kdeadline_passed(dl), "the stranger was neither refused nor accepted");
		tp->progress(env->ctx, 5, NULL, &e);
	}
	CHECK(lerr(tp, bad)->status == KHOR_ERR_AUTH, "%s", lerr(tp, bad)->text);
	CHECK(strstr(lerr(tp, bad)->text, "secret") != NULL, "%s", lerr(tp, bad)->text);
	tp->destroy(env->ctx);
	/* The same rank with the right secret gets in, and the job goes on. */
	env->ctx = make_ctx(env, "test-secret");
	env->link = link_up_ctx(env, env->ctx);
	uint64_t x = 0x1122334455667788ull;
	tp_req *s;
	tp_tag t = { 0, 1, 0, 0 };
	CHECK(tp->isend(env->link, &x, 8, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
}

static void gatekeeper(struct rank_env *env)
{
	uint64_t y = 0;
	tp_req *r;
	kerr e;
	tp_tag t = { 0, 1, 0, 0 };

	env->link = link_up_ctx(env, env->ctx);
	CHECK(env->tp->irecv(env->link, &y, 8, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, r, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(y == 0x1122334455667788ull, "wrong payload");
}

Test(shm, wrong_secret_is_refused_with_a_log_line_and_the_job_goes_on, .timeout = 30)
{
	struct job j = job_of(&shm_transport_ops, NULL, stranger_then_real, gatekeeper);
	j.no_link = true;
	j.secret[0] = "not-the-secret";
	j.capture_stderr = 1;
	struct board *b = run_job(&j);
	cr_assert(strstr(b->log, "refused") && strstr(b->log, "secret"),
	          "rank 1 should log the refusal: '%s'", b->log);
}

#ifdef KHOR_HAVE_IB
Test(ib, wrong_secret_is_refused_with_a_log_line_and_the_job_goes_on, .timeout = 60)
{
	need_ib();
	struct job j = job_of(&ib_transport_ops, NULL, stranger_then_real, gatekeeper);
	j.no_link = true;
	j.secret[0] = "not-the-secret";
	j.capture_stderr = 1;
	struct board *b = run_job(&j);
	cr_assert(strstr(b->log, "refused") && strstr(b->log, "secret"),
	          "rank 1 should log the refusal: '%s'", b->log);
}
#endif

static void wrong_job_connector(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	tp_options o = { .rank = 0, .size = 2, .job_id = "some-other-job", .secret = "test-secret",
	                 .handshake_timeout_ms = 5000 };
	tp_ctx *other;
	tp_link *l;
	kerr e;
	kdeadline dl = kdeadline_in_ms(10000);

	while (!atomic_load(&env->b->ready[1]))
		CHECK(!kdeadline_passed(dl), "rank 1 never published its address");
	CHECK(tp->create(&o, &other, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(tp->connect(other, 1, env->b->addr[1], &l, &e) == KHOR_SUCCESS, "%s", e.text);
	while (lerr(tp, l)->status == KHOR_SUCCESS) {
		CHECK(!kdeadline_passed(dl), "the stranger was neither refused nor accepted");
		tp->progress(other, 5, NULL, &e);
	}
	CHECK(strstr(lerr(tp, l)->text, "job id differs") != NULL, "%s",
	      lerr(tp, l)->text);
	tp->destroy(other);
	/* An address of another host is refused before anything is sent. */
	CHECK(tp->connect(env->ctx, 1, "shm:00000000-0000-0000-0000-000000000000:x", &l, &e) ==
	              KHOR_ERR_INVALID_ARG && strstr(e.text, "another host") != NULL, "%s", e.text);
	CHECK(tp->connect(env->ctx, 1, "tcp:1.2.3.4:5", &l, &e) == KHOR_ERR_PROTOCOL, "%s", e.text);
	atomic_store(&env->b->phase[0], 1);
}

static void wrong_job_acceptor(struct rank_env *env)
{
	tp_link *l;
	kerr e;

	while (atomic_load(&env->b->phase[0]) == 0)
		env->tp->progress(env->ctx, 5, NULL, &e);
	CHECK(env->tp->accept(env->ctx, 0, &l, &e) == KHOR_SUCCESS && l == NULL,
	      "a stranger became rank 0's link");
}

Test(shm, other_job_and_other_host_are_refused, .timeout = 30)
{
	struct job j = job_of(&shm_transport_ops, NULL, wrong_job_connector, wrong_job_acceptor);
	j.no_link = true;
	run_job(&j);
}

/* ---- shm only: wake-ups and fairness ------------------------------------------------- */

static void late_sender(struct rank_env *env)
{
	uint32_t x = 42;
	tp_req *s;
	kerr e;
	tp_tag t = { 7, 1, 0, 0 };

	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &e);
	usleep(200000); /* rank 1 is asleep in progress(5000) by now */
	CHECK(env->tp->isend(env->link, &x, 4, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
}

static void sleeper(struct rank_env *env)
{
	uint32_t y = 0;
	tp_req *r;
	kerr e;
	tp_tag t = { 7, 1, 0, 0 };

	CHECK(env->tp->irecv(env->link, &y, 4, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	atomic_store(&env->b->phase[1], 1);
	uint64_t t0 = now_ns();
	bool done = false;
	while (!done) {
		CHECK(env->tp->progress(env->ctx, 5000, NULL, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(env->tp->test(r, &done, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK((now_ns() - t0) / 1000000 < 3000, "not woken: the doorbell was lost");
	}
	CHECK(y == 42, "payload");
}

Test(shm, a_rank_asleep_in_progress_is_woken_by_the_sender, .timeout = 30)
{
	struct job j = job_of(&shm_transport_ops, NULL, late_sender, sleeper);
	run_job(&j);
}

static void fair_sender(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *big = malloc(len), small[128];
	tp_req *sb, *ss[8];
	kerr e;

	fill(big, len, 3);
	fill(small, sizeof(small), 4);
	tp_tag tb = { 8, 0, 0, 0 };
	CHECK(env->tp->isend(env->link, big, len, tb, NULL, &sb, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < 8; i++) {
		tp_tag t = { 8, 1, (uint32_t)i, 0 };
		CHECK(env->tp->isend(env->link, small, sizeof(small), t, NULL, &ss[i], &e) ==
		              KHOR_SUCCESS, "%s", e.text);
	}
	for (int i = 0; i < 8; i++)
		CHECK(wait_req(env, ss[i], 0, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(wait_req(env, sb, 0, &e) == KHOR_SUCCESS, "%s", e.text);
	free(big);
}

static void fair_receiver(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *big = malloc(len), small[8][128];
	tp_req *rb, *rs[8];
	bool big_done = false, small_done[8] = { false };
	int nsmall = 0, small_before_big = 0;
	kerr e;

	tp_tag tb = { 8, 0, 0, 0 };
	CHECK(env->tp->irecv(env->link, big, len, tb, NULL, &rb, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < 8; i++) {
		tp_tag t = { 8, 1, (uint32_t)i, 0 };
		CHECK(env->tp->irecv(env->link, small[i], 128, t, NULL, &rs[i], &e) == KHOR_SUCCESS,
		      "%s", e.text);
	}
	kdeadline dl = kdeadline_in_ms(30000);
	while (!big_done || nsmall < 8) {
		CHECK(!kdeadline_passed(dl), "transfers did not finish");
		env->tp->progress(env->ctx, 0, NULL, &e);
		for (int i = 0; i < 8; i++) {
			if (!small_done[i]) {
				CHECK(env->tp->test(rs[i], &small_done[i], &e) == KHOR_SUCCESS, "%s", e.text);
				if (small_done[i]) {
					nsmall++;
					small_before_big += !big_done;
					CHECK(check_fill(small[i], 128, 4), "small message %d corrupted", i);
				}
			}
		}
		if (!big_done)
			CHECK(env->tp->test(rb, &big_done, &e) == KHOR_SUCCESS, "%s", e.text);
	}
	CHECK(check_fill(big, len, 3), "big message corrupted");
	CHECK(small_before_big == 8, "only %d of 8 small messages overtook the 64 MiB one",
	      small_before_big);
	free(big);
}

Test(shm, small_messages_overtake_a_64MiB_one, .timeout = 60)
{
	for (int cma = 0; cma < 2; cma++) {
		struct job j = job_of(&shm_transport_ops, cma ? "1" : "0", fair_sender, fair_receiver);
		run_job(&j);
	}
}

/* ---- shm only: nothing left behind --------------------------------------------------- */

static void linked_no_fd_a(struct rank_env *env)
{
	int fds, maps;
	uint8_t buf[1000];
	tp_req *s;
	kerr e;
	tp_tag t = { 10, 0, 0, 0 };

	/* Once the link is up the memory lives on in the mappings only. */
	count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 1, "while linked: %d memfd fds, %d maps", fds, maps);
	fill(buf, sizeof(buf), 10);
	CHECK(env->tp->isend(env->link, buf, sizeof(buf), t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(wait_req(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &e);
}

static void linked_no_fd_b(struct rank_env *env)
{
	int fds, maps;
	uint8_t buf[1000];
	tp_req *r;
	kerr e;
	tp_tag t = { 10, 0, 0, 0 };

	CHECK(env->tp->irecv(env->link, buf, sizeof(buf), t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(wait_req(env, r, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 1, "while linked: %d memfd fds, %d maps", fds, maps);
	atomic_store(&env->b->phase[1], 1);
}

static void victim_linking(struct rank_env *env)
{
	env->link = link_up_ctx(env, env->ctx);
	atomic_store(&env->b->phase[0], 1);
	streaming_victim(env);
}

/* Links up if the victim lives long enough, then receives until the link breaks. */
static void survivor_after_kill(struct rank_env *env)
{
	kerr e;
	kdeadline dl = kdeadline_in_ms(20000);
	uint8_t *y;

	while (env->link == NULL) {
		uint64_t killed = atomic_load(&env->b->killed_at_ns);
		if (killed != 0 && now_ns() - killed > 2000000000ull)
			return; /* it died before the link came up */
		CHECK(!kdeadline_passed(dl), "neither linked nor killed");
		env->tp->progress(env->ctx, 5, NULL, &e);
		CHECK(env->tp->accept(env->ctx, 0, &env->link, &e) == KHOR_SUCCESS, "%s", e.text);
	}
	y = malloc(64u << 20);
	for (uint32_t i = 0;; i++) {
		tp_req *r;
		tp_tag t = { 5, i, 0, 0 };
		khor_status st = env->tp->irecv(env->link, y, 64u << 20, t, NULL, &r, &e);
		if (st == KHOR_SUCCESS)
			st = wait_req(env, r, 100, &e);
		if (st != KHOR_SUCCESS)
			break;
	}
	free(y);
	/* rank_main destroys the ctx and checks that no memfd fd or mapping is left. */
}

Test(shm, nothing_is_left_behind_even_after_kill_9, .timeout = 120)
{
	char before[8192], after[8192];

	list_dir("/dev/shm", before, sizeof(before));
	/* A clean job. */
	struct job j = job_of(&shm_transport_ops, NULL, linked_no_fd_a, linked_no_fd_b);
	struct board *b = run_job(&j);
	cr_assert(!rank_socket_left(b), "an abstract socket of the job is still listed");
	/* Kills at several moments: before or while linking, then in the middle of a transfer
	 * (phase 1: linked; phase n + 1: n messages sent). */
	static const int when[][2] = { { 0, 0 }, { 0, 3 }, { 1, 0 }, { 2, 1 }, { 3, 5 } };
	for (size_t k = 0; k < sizeof(when) / sizeof(when[0]); k++) {
		for (int cma = 0; cma < 2; cma++) {
			j = job_of(&shm_transport_ops, cma ? "1" : "0", victim_linking,
			           survivor_after_kill);
			j.no_link = true;
			j.kill_rank = 0;
			j.kill_phase = when[k][0];
			j.kill_delay_ms = when[k][1];
			b = run_job(&j);
			cr_assert(!rank_socket_left(b), "an abstract socket of the job is still listed");
		}
	}
	list_dir("/dev/shm", after, sizeof(after));
	cr_assert_str_eq(after, before, "/dev/shm changed: before '%s', after '%s'", before, after);
}
