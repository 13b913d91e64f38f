/*
 * test_ib.c -- what only the verbs transport has, on a real device: soft-RoCE in the VM
 * that tests/ib/vm.sh boots (CTest label ib), or a real HCA (bench/ib/). On a machine
 * without one, the device tests skip with the reason ib gave, and one test checks that
 * reason is given (libkhor runs without rdma-core or a device; ib says why it is off).
 *
 *   - messages far over one work request's limit (the port's max_msg_sz, and a forced
 *     1 MiB one), split over 1 and 3 queue pairs, byte-exact;
 *   - the registration cache under real registrations: a buffer reused across calls hits,
 *     user buffers are dropped at the end of each call unless KHOR_REG_CACHE_USER=1;
 *   - a locked-memory limit too small for the link's buffers: the error names the size, the
 *     limit and the fix (as an unprivileged user: root ignores RLIMIT_MEMLOCK);
 *   - KHOR_LOG=info names each link's transport, device, port, GID and QP count.
 */
#include "runtime/comm.h"
#include "transport/ib/ib.h"
#include "transport/regcache.h"
#include "tests/harness.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define TEXT 2048

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	uint64_t hits[HARNESS_MAX_RANKS], misses[HARNESS_MAX_RANKS];
	uint64_t invalidations[HARNESS_MAX_RANKS];
};

#ifdef KHOR_HAVE_IB
/* Does this machine have a usable device? If not, why (for the skip message). */
static bool ib_here(char *why, size_t len)
{
	tp_options o = { .rank = 0, .size = 2, .job_id = "probe", .secret = "", .nsocks = 1,
	                 .handshake_timeout_ms = 1000 };
	tp_ctx *ctx;
	kerr e;

	kerr_clear(&e);
	if (ib_transport_ops.create(&o, &ctx, &e) != KHOR_SUCCESS) {
		snprintf(why, len, "%s", e.text);
		return false;
	}
	ib_transport_ops.destroy(ctx);
	return true;
}

#define NEED_IB()                                                                      \
	do {                                                                           \
		char why_[KERR_TEXT_MAX];                                              \
		if (!ib_here(why_, sizeof(why_)))                                      \
			cr_skip_test("no usable RDMA device here: %s", why_);          \
	} while (0)

Test(ib, unavailable_says_why_and_the_job_runs_on_tcp, .timeout = 30)
{
	char why[KERR_TEXT_MAX];

	if (ib_here(why, sizeof(why)))
		cr_skip_test("this machine has an RDMA device (the VM tests cover it)");
	cr_assert(strstr(why, "libibverbs") != NULL || strstr(why, "RDMA") != NULL,
	          "the reason should say what is missing: '%s'", why);
}

static uint8_t pattern(size_t i, int salt)
{
	return (uint8_t)((i * 2654435761u) >> 13 ^ (size_t)salt);
}

/* ---- two instances in one process: registration, keys, flush, the cache ------------- */

struct pair {
	tp_ctx *c[2];
	tp_link *l[2];
};

static void pair_up(struct pair *p, bool flush_always)
{
	const struct transport_ops *tp = &ib_transport_ops;
	kerr e;

	for (int r = 0; r < 2; r++) {
		tp_options o = { .rank = r, .size = 2, .job_id = "pair", .secret = "s", .nsocks = 1,
		                 .handshake_timeout_ms = 10000, .ifname_spec = getenv("KHOR_SOCKET_IFNAME"),
		                 .ib_qps = 2, .ib_timeout = 14, .ib_retry_cnt = 7, .ib_gid_index = -1,
		                 .ib_flush_always = flush_always };
		cr_assert_eq(tp->create(&o, &p->c[r], &e), KHOR_SUCCESS, "create: %s", e.text);
	}
	cr_assert_eq(tp->connect(p->c[0], 1, tp->address(p->c[1]), &p->l[0], &e), KHOR_SUCCESS,
	             "%s", e.text);
	p->l[1] = NULL;
	kdeadline dl = kdeadline_in_ms(20000);
	while (p->l[1] == NULL || !tp->link_ready(p->l[0]) || !tp->link_ready(p->l[1])) {
		cr_assert(!kdeadline_passed(dl), "the link did not come up");
		cr_assert_eq(tp->link_error(p->l[0], &e), KHOR_SUCCESS, "%s", e.text);
		tp->progress(p->c[0], 0, NULL, &e);
		tp->progress(p->c[1], 0, NULL, &e);
		if (p->l[1] == NULL)
			tp->accept(p->c[1], 0, &p->l[1], &e);
	}
}

static void pair_down(struct pair *p)
{
	ib_transport_ops.destroy(p->c[0]);
	ib_transport_ops.destroy(p->c[1]);
}

/* Drives both instances until req is done; its status. */
static khor_status pair_wait(struct pair *p, tp_req *req, kerr *e)
{
	kdeadline dl = kdeadline_in_ms(30000);
	bool done = false;

	for (;;) {
		khor_status st = ib_transport_ops.test(req, &done, e);
		if (done)
			return st;
		cr_assert(!kdeadline_passed(dl), "a request never finished");
		ib_transport_ops.progress(p->c[0], 0, NULL, e);
		ib_transport_ops.progress(p->c[1], 0, NULL, e);
	}
}

Test(ib, registered_buffers_move_with_their_keys_and_flush_completes, .timeout = 120)
{
	NEED_IB();
	const struct transport_ops *tp = &ib_transport_ops;
	struct pair p;
	size_t len = (3u << 20) + 17;
	uint8_t *x = malloc(len), *y = calloc(1, len);
	tp_mr *mx, *my;
	kerr e;

	pair_up(&p, true);
	tp_caps caps;
	tp->caps(p.c[0], &caps);
	cr_assert(caps.needs_reg && caps.one_sided && caps.reg_min > 0 && caps.reg_min < len);
	for (size_t i = 0; i < len; i++)
		x[i] = pattern(i, 5);
	tp_reg_desc dx = { x, len, TP_MEM_HOST, TP_ACCESS_LOCAL_WRITE, -1, 0 };
	tp_reg_desc dy = { y, len, TP_MEM_HOST,
	                   TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_WRITE | TP_ACCESS_REMOTE_READ, -1, 0 };
	cr_assert_eq(tp->reg_mr(p.c[0], &dx, &mx, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(tp->reg_mr(p.c[1], &dy, &my, &e), KHOR_SUCCESS, "%s", e.text);
	tp_rkey k;
	tp->mr_key(my, &k);
	cr_assert(k.addr == (uint64_t)(uintptr_t)y && k.len == len && k.rkey != 0);
	tp_req *s, *r, *f;
	tp_tag t = { 9, 1, 0, 0 };
	cr_assert_eq(tp->irecv(p.l[1], y, len, t, my, &r, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(tp->isend(p.l[0], x, len, t, mx, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(pair_wait(&p, s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(pair_wait(&p, r, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(memcmp(x, y, len) == 0, "the payload differs");
	/* The GPUDirect flush path (forced on for host memory): a loopback RDMA read. */
	cr_assert_eq(tp->flush(p.l[1], y, len, my, &f, &e), KHOR_SUCCESS, "flush: %s", e.text);
	cr_assert_not_null(f, "KHOR_IB_FLUSH=always must post a flush");
	cr_assert_eq(pair_wait(&p, f, &e), KHOR_SUCCESS, "%s", e.text);
	/* A buffer outside its registration is refused, not sent. */
	cr_assert_eq(tp->isend(p.l[0], x + 4096, len, t, mx, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "outside the registration") != NULL, "%s", e.text);
	tp->dereg_mr(p.c[0], mx);
	tp->dereg_mr(p.c[1], my);
	pair_down(&p);
	free(x);
	free(y);
}

Test(ib, the_registration_cache_on_real_registrations, .timeout = 120)
{
	NEED_IB();
	struct pair p;
	regcache_limits lim = { .max_entries = 2, .max_bytes = 64u << 20 };
	tp_regcache *c;
	regcache_entry *a, *b, *g;
	regcache_stats st;
	size_t len = 1u << 20;
	uint8_t *buf = aligned_alloc(4096, 4 * len);
	kerr e;

	pair_up(&p, false);
	cr_assert_eq(regcache_create(&ib_transport_ops, p.c[0], &lim, &c, &e), KHOR_SUCCESS, "%s",
	             e.text);
	tp_reg_desc d = { buf, len, TP_MEM_HOST, TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_WRITE, -1, 0 };
	cr_assert_eq(regcache_get(c, &d, REGCACHE_KEEP, &a, &e), KHOR_SUCCESS, "%s", e.text);
	d.buf = buf + 100;
	d.len = 1000;
	cr_assert_eq(regcache_get(c, &d, REGCACHE_KEEP, &b, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(regcache_mr(a), regcache_mr(b), "a slice of a registered buffer must hit");
	regcache_put(c, a);
	regcache_put(c, b);
	/* The next megabyte touches the first: one registration of both. */
	d.buf = buf + len;
	d.len = len;
	cr_assert_eq(regcache_get(c, &d, REGCACHE_KEEP, &g, &e), KHOR_SUCCESS, "%s", e.text);
	tp_rkey k;
	ib_transport_ops.mr_key(regcache_mr(g), &k);
	cr_assert(k.addr <= (uint64_t)(uintptr_t)buf && k.addr + k.len >= (uint64_t)(uintptr_t)buf + 2 * len,
	          "the grown entry must cover both megabytes");
	regcache_put(c, g);
	cr_assert_eq(regcache_invalidate(c, buf, 4 * len), 1);
	regcache_stats_get(c, &st);
	cr_assert(st.hits == 1 && st.grows == 1 && st.entries == 0 && st.regs == st.deregs,
	          "hits %llu grows %llu entries %d regs %llu deregs %llu", (unsigned long long)st.hits,
	          (unsigned long long)st.grows, st.entries, (unsigned long long)st.regs,
	          (unsigned long long)st.deregs);
	regcache_destroy(c);
	pair_down(&p);
	free(buf);
}

/* Broadcasts and allreduces of tens of MiB: many work requests per part, parts per QP. */
static int body_large(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	const size_t big = (40u << 20) + 4099; /* odd on purpose */

	khor_config_set(cfg, "KHOR_TRANSPORT", "ib");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "init: %s", err);
		return 10;
	}
	uint8_t *b = malloc(big);
	for (int root = 0; root < n; root++) {
		for (size_t i = 0; i < big; i++)
			b[i] = rank == root ? pattern(i, root) : 0;
		if (khor_broadcast(comm, b, big, KHOR_UINT8, root) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "broadcast: %s", khor_comm_error(comm));
			return 20;
		}
		for (size_t i = 0; i < big; i++)
			if (b[i] != pattern(i, root)) {
				snprintf(sh->err[rank], TEXT, "broadcast from %d: byte %zu is %u, not %u", root,
				         i, b[i], pattern(i, root));
				return 21;
			}
	}
	size_t count = (24u << 20) / 4 + 1001;
	int32_t *x = malloc(count * 4);
	for (size_t i = 0; i < count; i++)
		x[i] = (int32_t)(i % 1000) + rank;
	if (khor_allreduce(comm, x, x, count, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "allreduce: %s", khor_comm_error(comm));
		return 22;
	}
	for (size_t i = 0; i < count; i++)
		if (x[i] != n * (int32_t)(i % 1000) + n * (n - 1) / 2) {
			snprintf(sh->err[rank], TEXT, "allreduce: element %zu is %d", i, x[i]);
			return 23;
		}
	free(x);
	free(b);
	khor_finalize(comm);
	return 0;
}

static void run(int n, harness_body body, struct shared *sh, double deadline)
{
	harness_opts o = { .n = n, .timeout = "60s", .deadline_s = deadline };
	harness_result res;
	bool ok = harness_run(&o, body, sh, &res);

	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "rank %d exited %d: %s", r, res.status[r], sh->err[r]);
	cr_assert(ok && !res.timed_out, "the job failed or timed out");
}

Test(ib, messages_over_the_work_request_limit_on_1_and_3_qps, .timeout = 600)
{
	NEED_IB();
	struct shared *sh = harness_shared(sizeof(*sh));
	setenv("KHOR_IB_QPS_PER_CONN", "1", 1);
	run(2, body_large, sh, 280);
	setenv("KHOR_IB_QPS_PER_CONN", "3", 1);
	setenv("KHOR_IB_MAX_WR_BYTES", "1048576", 1);
	run(3, body_large, sh, 280);
	unsetenv("KHOR_IB_QPS_PER_CONN");
	unsetenv("KHOR_IB_MAX_WR_BYTES");
	harness_shared_free(sh, sizeof(*sh));
}

/* The ib transport's cache, found through the runtime's context. */
static tp_regcache *ib_cache(khor_comm *comm)
{
	kctx *x = comm->ctx;
	for (int i = 0; i < x->ntps; i++)
		if (strcmp(x->tps[i].ops->name, "ib") == 0)
			return x->tps[i].cache;
	return NULL;
}

static int body_cache(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	size_t count = (4u << 20) / 4;

	khor_config_set(cfg, "KHOR_TRANSPORT", "ib");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "init: %s", err);
		return 10;
	}
	float *x = malloc(count * 4);
	for (int it = 0; it < 6; it++) {
		for (size_t i = 0; i < count; i++)
			x[i] = (float)(i % 77);
		if (khor_allreduce(comm, x, x, count, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "allreduce: %s", khor_comm_error(comm));
			return 20;
		}
		for (size_t i = 0; i < count; i++)
			if (x[i] != (float)(n * (int)(i % 77))) {
				snprintf(sh->err[rank], TEXT, "iteration %d: element %zu is %g", it, i, x[i]);
				return 21;
			}
	}
	tp_regcache *c = ib_cache(comm);
	if (c == NULL) {
		snprintf(sh->err[rank], TEXT, "no registration cache on the ib transport");
		return 22;
	}
	regcache_stats s;
	regcache_stats_get(c, &s);
	sh->hits[rank] = s.hits;
	sh->misses[rank] = s.misses;
	sh->invalidations[rank] = s.invalidations;
	free(x);
	khor_finalize(comm);
	return 0;
}

Test(ib, registration_cache_hits_and_drops_user_buffers_after_each_call, .timeout = 300)
{
	NEED_IB();
	struct shared *sh = harness_shared(sizeof(*sh));

	unsetenv("KHOR_REG_CACHE_USER");
	run(2, body_cache, sh, 200);
	/* Per call: the user buffer registered once, its slices hit; dropped at the end. */
	for (int r = 0; r < 2; r++) {
		cr_expect(sh->hits[r] > 6, "rank %d: %llu hits", r, (unsigned long long)sh->hits[r]);
		cr_expect(sh->invalidations[r] >= 6, "rank %d: %llu invalidations: user buffers "
		          "must not stay registered across calls", r,
		          (unsigned long long)sh->invalidations[r]);
	}
	uint64_t misses_default = sh->misses[0];
	setenv("KHOR_REG_CACHE_USER", "1", 1);
	run(2, body_cache, sh, 200);
	unsetenv("KHOR_REG_CACHE_USER");
	/* Kept: six calls on one buffer register it about once. */
	for (int r = 0; r < 2; r++)
		cr_expect(sh->misses[r] < misses_default, "rank %d: %llu misses with the user cache, "
		          "%llu without", r, (unsigned long long)sh->misses[r],
		          (unsigned long long)misses_default);
	harness_shared_free(sh, sizeof(*sh));
}

static int body_memlock(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	struct rlimit rl = { 64 << 10, 64 << 10 };

	/* Root may lock any amount (CAP_IPC_LOCK): become nobody, as most users are. */
	if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
		snprintf(sh->err[rank], TEXT, "setuid(nobody) failed");
		return 5;
	}
	if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
		snprintf(sh->err[rank], TEXT, "setrlimit failed");
		return 6;
	}
	khor_config_set(cfg, "KHOR_TRANSPORT", "ib");
	khor_config_set(cfg, "KHOR_TIMEOUT", "10s");
	khor_status st = khor_init(cfg, err, sizeof(err), &comm);
	if (st == KHOR_SUCCESS) {
		float x[4] = { 1, 2, 3, 4 };
		st = khor_allreduce(comm, x, x, 4, KHOR_FLOAT32, KHOR_SUM);
		snprintf(err, sizeof(err), "%s", st == KHOR_SUCCESS ? "" : khor_comm_error(comm));
		khor_finalize(comm);
	}
	snprintf(sh->err[rank], TEXT, "%s", err);
	return st == KHOR_SUCCESS ? 1 : 0;
}

Test(ib, a_small_locked_memory_limit_gives_the_fix, .timeout = 120)
{
	NEED_IB();
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "10s", .deadline_s = 60 };
	harness_result res;

	harness_run(&o, body_memlock, sh, &res);
	/* At least the rank whose registration failed first says why in full. */
	bool said = false;
	for (int r = 0; r < 2; r++) {
		cr_expect_eq(res.status[r], 0, "rank %d: the job should fail: %s", r, sh->err[r]);
		if (strstr(sh->err[r], "ulimit -l") != NULL && strstr(sh->err[r], "64 KiB") != NULL &&
		    strstr(sh->err[r], "bytes") != NULL)
			said = true;
	}
	cr_assert(said, "no rank named the limit and the fix: '%s' / '%s'", sh->err[0], sh->err[1]);
	harness_shared_free(sh, sizeof(*sh));
}

static int body_info(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT], path[64];
	khor_comm *comm;

	snprintf(path, sizeof(path), "/tmp/khor-test-ib-log.%d.%d", (int)getppid(), rank);
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	dup2(fd, 2);
	close(fd);
	khor_config_set(cfg, "KHOR_TRANSPORT", "auto");
	khor_config_set(cfg, "KHOR_HOSTNAME", rank == 0 ? "pretend-a" : "pretend-b");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "init: %s", err);
		return 10;
	}
	int32_t v = rank;
	if (khor_allreduce(comm, &v, &v, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS || v != 1) {
		snprintf(sh->err[rank], TEXT, "allreduce: %s", khor_comm_error(comm));
		return 20;
	}
	khor_finalize(comm);
	return 0;
}

Test(ib, auto_picks_ib_across_hosts_and_the_log_says_how, .timeout = 120)
{
	NEED_IB();
	struct shared *sh = harness_shared(sizeof(*sh));
	char path[64], log[16384];

	setenv("KHOR_LOG", "info", 1);
	run(2, body_info, sh, 60);
	unsetenv("KHOR_LOG");
	snprintf(path, sizeof(path), "/tmp/khor-test-ib-log.%d.0", (int)getpid());
	FILE *f = fopen(path, "r");
	cr_assert(f != NULL);
	size_t got = fread(log, 1, sizeof(log) - 1, f);
	log[got] = '\0';
	fclose(f);
	unlink(path);
	snprintf(path, sizeof(path), "/tmp/khor-test-ib-log.%d.1", (int)getpid());
	unlink(path);
	/* Two pretend hosts: the link between them is ib, and the line says on what. */
	cr_expect(strstr(log, "link to rank 1 uses ib") != NULL, "log: %s", log);
	cr_expect(strstr(log, "port 1") != NULL && strstr(log, "GID") != NULL &&
	          strstr(log, "QP") != NULL, "log: %s", log);
	harness_shared_free(sh, sizeof(*sh));
}
/* ---- the port goes down under a running job --------------------------------------- */

struct port_shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	int down_status; /* of rank 0's `ip link set va down`, -2 = not run */
};

static int body_port(int rank, int n, khor_config *cfg, void *arg)
{
	struct port_shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	size_t count = (256u << 10) / 4;
	float *x = calloc(count, 4);

	khor_config_set(cfg, "KHOR_TRANSPORT", "ib");
	khor_config_set(cfg, "KHOR_TIMEOUT", "20s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "init: %s", err);
		return 10;
	}
	for (int i = 0; i < 100000; i++) {
		if (khor_allreduce(comm, x, x, count, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "%s", khor_comm_error(comm));
			khor_finalize(comm);
			return 0;
		}
		/* Rank 0 pulls the cable once the job is running (a child of the parent would be
		 * reaped by the harness's waitpid). */
		if (rank == 0 && i == 20)
			sh->down_status = system("ip link set va down");
	}
	snprintf(sh->err[rank], TEXT, "the job ran on with the port down");
	return 20;
}

static bool port_active(void)
{
	char buf[64] = "";
	FILE *f = fopen("/sys/class/infiniband/rxe0/ports/1/state", "r");

	if (f == NULL)
		return false;
	bool ok = fgets(buf, sizeof(buf), f) != NULL && strstr(buf, "ACTIVE") != NULL;
	fclose(f);
	return ok;
}

Test(ib, a_port_that_goes_down_fails_the_job_naming_the_device, .timeout = 180)
{
	NEED_IB();
	/* It takes the VM's netdev down: only where tests/ib/vm.sh set up rxe0 on va. */
	if (getenv("IB_VM_GID_INDEX") == NULL || access("/sys/class/net/va", F_OK) != 0)
		cr_skip_test("needs the soft-RoCE VM of tests/ib/vm.sh (it takes rxe0's netdev down)");
	struct port_shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "20s", .deadline_s = 90 };
	harness_result res;

	sh->down_status = -2;
	harness_run(&o, body_port, sh, &res);
	int up = system("ip link set va up");
	for (int i = 0; i < 200 && !port_active(); i++)
		usleep(50000);
	cr_assert(up == 0 && port_active(), "rxe0's port did not come back");
	cr_assert_eq(sh->down_status, 0, "rank 0 could not take va down");
	for (int r = 0; r < 2; r++) {
		cr_expect_eq(res.status[r], 0, "rank %d: %s", r, sh->err[r]);
		cr_expect(strstr(sh->err[r], "rank") != NULL, "rank %d: %s", r, sh->err[r]);
	}
	/* Whoever saw it first names the device's event; the other the failure it caused. */
	cr_assert(strstr(sh->err[0], "rxe0") != NULL || strstr(sh->err[1], "rxe0") != NULL,
	          "no rank named the device: '%s' / '%s'", sh->err[0], sh->err[1]);
	harness_shared_free(sh, sizeof(*sh));
}

#else
Test(ib, not_built, .timeout = 10)
{
	cr_skip_test("built without infiniband/verbs.h (apt-get install libibverbs-dev)");
}
#endif
