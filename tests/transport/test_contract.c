/*
 * test_contract.c -- the contract every transport keeps, between real processes (two ranks
 * forked per case: pair.h), written once and run over each transport built: shm as
 * configured by default (every message through the ring; suite shm), shm with messages
 * over 16 MiB read by process_vm_readv (shm_cma, KHOR_SHM_CMA=1), tcp on loopback (tcp),
 * and ib (suite ib: where an RDMA device is, as in the soft-RoCE VM that
 * tests/ib/ib_suite.sh runs it in; elsewhere each ib case skips, saying why).
 *
 * The contract: tag matching in any posting order, many small messages in flight both
 * ways, no overrun on a length or dtype mismatch, a cancelled unmatched receive that
 * leaves the link healthy, data sent before a peer exits still delivered, a dead peer (a
 * sender or a receiver killed with -9) named within seconds, and a wrong secret refused
 * with a log line while the job goes on. Each transport's own behaviour is tested beside
 * it: test_shm.c, test_tcp.c, test_ib.c.
 */
#include "pair.h"

#include "transport/ib/ib.h"
#include "transport/shm/shm.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KHOR_HAVE_IB
/* ib runs where a device is (the soft-RoCE VM, tests/ib/); elsewhere its cases skip. */
static void need_ib(void)
{
	tp_options o = {.rank = 0,
	                .size = 2,
	                .job_id = "probe",
	                .secret = "",
	                .nsocks = 1,
	                .handshake_timeout_ms = 1000};
	tp_ctx *c;
	kerr e;

	if (ib_transport_ops.create(&o, &c, &e) != KHOR_SUCCESS)
		cr_skip_test("no usable RDMA device here: %s", e.text);
	ib_transport_ops.destroy(c);
}
#define IB_CASE(name, secs)                                                                        \
	Test(ib, name, .timeout = 4 * (secs))                                                      \
	{                                                                                          \
		need_ib();                                                                         \
		name##_run(&ib_transport_ops, NULL);                                               \
	}
#else
#define IB_CASE(name, secs)
#endif

/* One case, run over shm (ring only), shm with CMA for large messages, tcp and ib. */
#define TRANSPORT_TEST(name, secs)                                                                 \
	static void name##_run(const struct transport_ops *tp, const char *cma);                   \
	Test(shm, name, .timeout = secs)                                                           \
	{                                                                                          \
		name##_run(&shm_transport_ops, NULL);                                              \
	}                                                                                          \
	Test(shm_cma, name, .timeout = secs)                                                       \
	{                                                                                          \
		name##_run(&shm_transport_ops, "1");                                               \
	}                                                                                          \
	Test(tcp, name, .timeout = secs)                                                           \
	{                                                                                          \
		name##_run(&tcp_transport_ops, NULL);                                              \
	}                                                                                          \
	IB_CASE(name, secs)                                                                        \
	static void name##_run(const struct transport_ops *tp, const char *cma)
/* ---- sizes and tag matching ---------------------------------------------------------- */

static const size_t sizes[] = {0, 1, 63, 4096, 65537, 1u << 20, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void sizes_sender(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	kerr e;

	for (size_t k = 0; k < NSIZES; k++) {
		size_t len = sizes[k];
		uint8_t *x = malloc(len + 1), *y = malloc(len + 1);
		tp_tag t1 = {1, (uint32_t)k, 1, 0}, t2 = {1, (uint32_t)k, 2, 0};
		tp_req *s1, *s2;
		pair_fill(x, len, (uint32_t)k * 2 + 1);
		pair_fill(y, len, (uint32_t)k * 2 + 2);
		/* t1 then t2; the receiver posts t2 first, so t1 must wait for it. */
		CHECK(tp->isend(env->link, x, len, t1, NULL, &s1, &e) == KHOR_SUCCESS, "%s",
		      e.text);
		CHECK(tp->isend(env->link, y, len, t2, NULL, &s2, &e) == KHOR_SUCCESS, "%s",
		      e.text);
		CHECK(pair_wait(env, s1, 0, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(pair_wait(env, s2, 0, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		free(x);
		free(y);
	}
	/* And back the other way, with a receive posted before the send exists. */
	uint8_t *z = malloc(1u << 20);
	tp_req *r;
	tp_tag t = {2, 0, 0, 0};
	CHECK(tp->irecv(env->link, z, 1u << 20, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, r, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_check_fill(z, 1u << 20, 99), "reverse direction corrupted");
	free(z);
}

static void sizes_receiver(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	kerr e;

	for (size_t k = 0; k < NSIZES; k++) {
		size_t len = sizes[k];
		uint8_t *x = malloc(len + 64), *y = malloc(len + 64);
		tp_tag t1 = {1, (uint32_t)k, 1, 0}, t2 = {1, (uint32_t)k, 2, 0};
		tp_req *r1, *r2;
		memset(x, 0xee, len + 64);
		memset(y, 0xee, len + 64);
		/* Give the sender time to put both messages in flight before anything is posted. */
		for (int i = 0; i < 5; i++)
			tp->progress(env->ctx, 1, NULL, &e);
		/* Posted in the other order than sent; a large t1 may fill the ring (or socket)
		 * ahead of t2, so both are posted before waiting, as a collective does. */
		CHECK(tp->irecv(env->link, y, len, t2, NULL, &r2, &e) == KHOR_SUCCESS, "%s",
		      e.text);
		for (int i = 0; i < 3; i++)
			tp->progress(env->ctx, 1, NULL, &e);
		CHECK(tp->irecv(env->link, x, len, t1, NULL, &r1, &e) == KHOR_SUCCESS, "%s",
		      e.text);
		CHECK(pair_wait(env, r2, 1, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(pair_wait(env, r1, 1, &e) == KHOR_SUCCESS, "size %zu: %s", len, e.text);
		CHECK(pair_check_fill(x, len, (uint32_t)k * 2 + 1),
		      "size %zu: first message corrupted", len);
		CHECK(pair_check_fill(y, len, (uint32_t)k * 2 + 2),
		      "size %zu: second message corrupted", len);
		for (int i = 0; i < 64; i++)
			CHECK(x[len + i] == 0xee && y[len + i] == 0xee,
			      "size %zu: wrote past the end", len);
		free(x);
		free(y);
	}
	uint8_t *z = malloc(1u << 20);
	tp_req *s;
	tp_tag t = {2, 0, 0, 0};
	pair_fill(z, 1u << 20, 99);
	CHECK(tp->isend(env->link, z, 1u << 20, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, s, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	free(z);
}

TRANSPORT_TEST(sizes_0_to_64MiB_with_out_of_order_tags, 120)
{
	struct job j = pair_job(tp, cma, sizes_sender, sizes_receiver);
	pair_run(&j);
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
		tp_tag t = {3, (uint32_t)i, (uint32_t)env->rank, 0};
		pair_fill(out[i], len, (uint32_t)(i * 2 + env->rank));
		CHECK(tp->isend(env->link, out[i], len, t, NULL, &s[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	for (int i = NSMALL - 1; i >= 0; i--) {
		size_t len = (size_t)(i * 37) % 300;
		tp_tag t = {3, (uint32_t)i, (uint32_t)(1 - env->rank), 0};
		CHECK(tp->irecv(env->link, in[i], len, t, NULL, &r[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	for (int i = 0; i < NSMALL; i++) {
		CHECK(pair_wait(env, s[i], 1, &e) == KHOR_SUCCESS, "send %d: %s", i, e.text);
		CHECK(pair_wait(env, r[i], 1, &e) == KHOR_SUCCESS, "recv %d: %s", i, e.text);
		CHECK(pair_check_fill(in[i], (size_t)(i * 37) % 300,
		                      (uint32_t)(i * 2 + 1 - env->rank)),
		      "message %d corrupted or misrouted", i);
	}
}

TRANSPORT_TEST(many_small_messages_in_flight_both_ways, 120)
{
	struct job j = pair_job(tp, cma, many_body, many_body);
	pair_run(&j);
}

/* ---- mismatches ---------------------------------------------------------------------- */

struct mismatch {
	size_t send_len, recv_len;
	uint32_t send_meta, recv_meta;
};

static const struct mismatch mismatches[] = {
	{100, 50, 0, 0},                /* eager, shorter receive */
	{2u << 20, 1u << 20, 0, 0},     /* ring pieces */
	{32u << 20, 1u << 20, 0, 0},    /* large: CMA in shm_cma, ring pieces elsewhere */
	{64, 64, 0x000100u, 0x000200u}, /* same length, different dtype */
};

static void mismatch_sender(struct rank_env *env)
{
	const struct mismatch *m = env->job->arg;
	uint8_t *x = calloc(1, m->send_len);
	tp_req *s;
	kerr e;
	tp_tag t = {0, 7, 0, m->send_meta};

	CHECK(env->tp->isend(env->link, x, m->send_len, t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	/* Either it went out before the receiver noticed, or the link broke: never a hang. */
	pair_wait(env, s, 2, &e);
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
	tp_tag t = {0, 7, 0, m->recv_meta};

	memset(y, 0x5a, m->recv_len + 64);
	CHECK(env->tp->irecv(env->link, y, m->recv_len, t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	khor_status st = pair_wait(env, r, 2, &e);
	CHECK(st == KHOR_ERR_PROTOCOL, "status %d: %s", st, e.text);
	CHECK(strstr(e.text, "peer rank 0") != NULL, "error should name the peer: %s", e.text);
	if (m->send_len != m->recv_len) {
		snprintf(want, sizeof(want), "%zu bytes", m->send_len);
		CHECK(strstr(e.text, want) != NULL, "error should give the sent length: %s",
		      e.text);
		snprintf(want, sizeof(want), "%zu bytes", m->recv_len);
		CHECK(strstr(e.text, want) != NULL, "error should give the posted length: %s",
		      e.text);
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
		struct job j = pair_job(tp, cma, mismatch_sender, mismatch_receiver);
		j.arg = (void *)&mismatches[i];
		pair_run(&j);
	}
}

/* ---- cancel -------------------------------------------------------------------------- */

static void cancel_a(struct rank_env *env)
{
	uint8_t buf[32];
	tp_req *r, *r2;
	kerr e;
	tp_tag never = {9, 9, 9, 0}, t = {9, 1, 0, 0};

	CHECK(env->tp->irecv(env->link, buf, 32, never, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	env->tp->progress(env->ctx, 1, NULL, &e);
	env->tp->cancel(r); /* never matched: the link stays healthy */
	CHECK(env->tp->irecv(env->link, buf, 32, t, NULL, &r2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, r2, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_check_fill(buf, 32, 5), "payload after cancel corrupted");
	CHECK(pair_link_error(env->tp, env->link)->status == KHOR_SUCCESS, "link broke");
	atomic_store(&env->b->phase[1], 1);
}

static void cancel_b(struct rank_env *env)
{
	uint8_t buf[32];
	tp_req *s;
	kerr e;
	tp_tag t = {9, 1, 0, 0};

	pair_fill(buf, 32, 5);
	CHECK(env->tp->isend(env->link, buf, 32, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, s, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	/* Stay until the receiver has looked at its link: an exit here breaks it, which on a
	 * slow machine (the soft-RoCE VM under load) it saw before its look. */
	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 2, NULL, &e);
}

TRANSPORT_TEST(cancelled_unmatched_receive_leaves_link_healthy, 30)
{
	struct job j = pair_job(tp, cma, cancel_a, cancel_b);
	pair_run(&j);
}

/* ---- a peer that exits right after sending ------------------------------------------- */

static void early_exit_sender(struct rank_env *env)
{
	uint8_t buf[4096];
	tp_req *s;
	kerr e;
	tp_tag t = {4, 1, 0, 0};

	pair_fill(buf, sizeof(buf), 77);
	CHECK(env->tp->isend(env->link, buf, sizeof(buf), t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(pair_wait(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	env->tp->destroy(env->ctx); /* gone before the receiver even posted */
	env->ctx = NULL;
	atomic_store(&env->b->phase[0], 1);
}

static void early_exit_receiver(struct rank_env *env)
{
	uint8_t buf[4096];
	tp_req *r;
	kerr e;
	tp_tag t = {4, 1, 0, 0};

	while (atomic_load(&env->b->phase[0]) == 0)
		usleep(1000);
	for (int i = 0; i < 20; i++) /* let the transport notice the close first */
		env->tp->progress(env->ctx, 2, NULL, &e);
	CHECK(env->tp->irecv(env->link, buf, sizeof(buf), t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(pair_wait(env, r, 2, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_check_fill(buf, sizeof(buf), 77), "payload corrupted");
	/* But a second receive can never be satisfied: it must fail, naming the peer. */
	t.seq = 2;
	khor_status st = env->tp->irecv(env->link, buf, 16, t, NULL, &r, &e);
	if (st == KHOR_SUCCESS)
		st = pair_wait(env, r, 2, &e);
	CHECK(st != KHOR_SUCCESS && strstr(e.text, "peer rank 0") != NULL, "status %d: %s", st,
	      e.text);
}

TRANSPORT_TEST(message_sent_before_the_peer_exits_is_still_delivered, 30)
{
	struct job j = pair_job(tp, cma, early_exit_sender, early_exit_receiver);
	pair_run(&j);
}

/* ---- kill -9 ------------------------------------------------------------------------- */

static void check_death_error(struct rank_env *env, khor_status st, const kerr *e, int peer)
{
	uint64_t killed = atomic_load(&env->b->killed_at_ns);
	double after = killed ? (double)(kclock_ns() - killed) / 1e9 : -1;
	char want[64];

	CHECK(st == KHOR_ERR_REMOTE, "status %d: %s", st, e->text);
	snprintf(want, sizeof(want), "peer rank %d", peer);
	CHECK(strstr(e->text, want) != NULL, "error should name %s: %s", want, e->text);
	if (env->tp == &shm_transport_ops) {
		snprintf(want, sizeof(want), "pid %d", atomic_load(&env->b->pid[peer]));
		CHECK(strstr(e->text, want) != NULL && strstr(e->text, "died") != NULL,
		      "error should say that pid %d died: %s", atomic_load(&env->b->pid[peer]),
		      e->text);
	}
	CHECK(killed != 0 && after < 5.0, "the death was noticed %.2f s after the kill", after);
	CHECK(pair_link_error(env->tp, env->link)->status == KHOR_ERR_REMOTE,
	      "the link should be broken");
}

static void streaming_survivor(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *y = malloc(len);
	kerr e;

	for (uint32_t i = 0;; i++) {
		tp_req *r;
		tp_tag t = {5, i, 0, 0};
		khor_status st = env->tp->irecv(env->link, y, len, t, NULL, &r, &e);
		/* Long timeouts: the death must wake the sleeping poll(), not a timer. */
		if (st == KHOR_SUCCESS)
			st = pair_wait(env, r, 10000, &e);
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
	struct job j = pair_job(tp, cma, pair_stream_forever, streaming_survivor);
	j.kill_rank = 0;
	j.kill_phase = 2; /* after two whole messages, in the middle of the third */
	j.kill_delay_ms = 1;
	pair_run(&j);
}

static void blocked_sender(struct rank_env *env)
{
	size_t len = 32u << 20;
	uint8_t *x = calloc(1, len);
	tp_req *s[4];
	kerr e;

	/* The receiver posts nothing: these fill the ring (or wait as RTS, or fill the socket). */
	for (int i = 0; i < 4; i++) {
		tp_tag t = {6, (uint32_t)i, 0, 0};
		CHECK(env->tp->isend(env->link, x, len, t, NULL, &s[i], &e) == KHOR_SUCCESS, "%s",
		      e.text);
	}
	atomic_store(&env->b->phase[0], 1);
	khor_status st = pair_wait(env, s[0], 10000, &e);
	check_death_error(env, st, &e, 1);
	for (int i = 1; i < 4; i++)
		pair_wait(env, s[i], 10, &e);
	free(x);
}

static void idle_victim(struct rank_env *env)
{
	while (atomic_load(&env->b->phase[0]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &(kerr){0});
	atomic_store(&env->b->phase[1], 1);
	for (;;)
		pause();
}

TRANSPORT_TEST(receiver_killed_while_sender_waits_is_named_within_seconds, 60)
{
	struct job j = pair_job(tp, cma, blocked_sender, idle_victim);
	j.kill_rank = 1;
	j.kill_phase = 1;
	j.kill_delay_ms = 200;
	pair_run(&j);
}
/* ---- strangers ----------------------------------------------------------------------- */

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
	while (pair_link_error(tp, bad)->status == KHOR_SUCCESS) {
		CHECK(!tp->link_ready(bad), "a link with the wrong secret came up");
		CHECK(!kdeadline_passed(dl), "the stranger was neither refused nor accepted");
		tp->progress(env->ctx, 5, NULL, &e);
	}
	CHECK(pair_link_error(tp, bad)->status == KHOR_ERR_AUTH, "%s",
	      pair_link_error(tp, bad)->text);
	CHECK(strstr(pair_link_error(tp, bad)->text, "secret") != NULL, "%s",
	      pair_link_error(tp, bad)->text);
	tp->destroy(env->ctx);
	/* The same rank with the right secret gets in, and the job goes on. */
	env->ctx = pair_ctx(env, "test-secret");
	env->link = pair_link_up(env, env->ctx);
	uint64_t x = 0x1122334455667788ull;
	tp_req *s;
	tp_tag t = {0, 1, 0, 0};
	CHECK(tp->isend(env->link, &x, 8, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
}

static void gatekeeper(struct rank_env *env)
{
	uint64_t y = 0;
	tp_req *r;
	kerr e;
	tp_tag t = {0, 1, 0, 0};

	env->link = pair_link_up(env, env->ctx);
	CHECK(env->tp->irecv(env->link, &y, 8, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, r, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(y == 0x1122334455667788ull, "wrong payload");
}

TRANSPORT_TEST(wrong_secret_is_refused_with_a_log_line_and_the_job_goes_on, 30)
{
	struct job j = pair_job(tp, cma, stranger_then_real, gatekeeper);
	j.no_link = true;
	j.secret[0] = "not-the-secret";
	j.capture_stderr = 1;
	struct board *b = pair_run(&j);
	cr_assert(strstr(b->log, "refused") && strstr(b->log, "secret"),
	          "rank 1 should log the refusal: '%s'", b->log);
}
