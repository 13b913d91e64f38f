/*
 * test_tcp.c -- the TCP transport on real loopback sockets, two instances in one process
 * driven in turn: connecting, tag matching (also out of order), striping, zero-length
 * frames, length mismatches, and strangers: a wrong secret, garbage bytes and a silent
 * client are refused while the real ranks carry on. A peer that publishes several
 * addresses is reached on the first that answers: past a refusing one and a silent one
 * (a listener whose backlog is full drops SYNs), with requests posted meanwhile intact, and
 * a peer none of whose addresses answers is an error naming each one. Announcements of
 * large sends that nobody receives yet are read aside up to TCP_UNEXPECTED_RTS_MAX per link
 * (all of them arrive once their receives come), and one more breaks the link, naming it.
 */
#include "collectives/coll.h"
#include "transport/transport.h"
#include "transport/tcp/tcp_int.h"
#include "base/sock.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A link's error, copied out (link_error gives it by copy, since another thread may be
 * setting it). */
static const kerr *lerr(const struct transport_ops *tp, tp_link *l)
{
	static kerr e;

	kerr_clear(&e);
	tp->link_error(l, &e);
	return &e;
}

static const struct transport_ops *tp = &tcp_transport_ops;

static tp_ctx *make(int rank, int size, const char *secret, int nsocks)
{
	tp_options o = { .rank = rank, .size = size, .job_id = "tcp-test", .secret = secret,
	                 .ifname_spec = "lo", .nsocks = nsocks, .min_stripe_bytes = 4096,
	                 .handshake_timeout_ms = 2000,
	                 .meta = &coll_meta_rules };
	tp_ctx *c = NULL;
	kerr e;
	cr_assert_eq(tp->create(&o, &c, &e), KHOR_SUCCESS, "%s", e.text);
	return c;
}

static void pump(tp_ctx **ctxs, int n, int ms)
{
	for (int i = 0; i < n; i++) {
		kerr e;
		cr_assert_eq(tp->progress(ctxs[i], ms, NULL, &e), KHOR_SUCCESS);
	}
}

/* Connects rank 0 -> rank 1 and returns both ends once ready. */
static void link_up(tp_ctx *a, tp_ctx *b, tp_link **la, tp_link **lb)
{
	kerr e;
	tp_ctx *both[2] = { a, b };

	cr_assert_eq(tp->connect(a, 1, tp->address(b), la, &e), KHOR_SUCCESS, "%s", e.text);
	*lb = NULL;
	for (int i = 0; i < 2000 && (*lb == NULL || !tp->link_ready(*la)); i++) {
		pump(both, 2, 1);
		if (*lb == NULL)
			tp->accept(b, 0, lb, &e);
	}
	cr_assert(*lb != NULL && tp->link_ready(*la), "link did not come up: %s",
	          lerr(tp, *la)->text);
}

static khor_status wait_req(tp_ctx **ctxs, tp_req *r, kerr *e)
{
	for (int i = 0; i < 5000; i++) {
		bool done = false;
		khor_status st = tp->test(r, &done, e);
		if (done)
			return st;
		pump(ctxs, 2, 1);
	}
	cr_assert_fail("request never completed");
	return KHOR_ERR_TIMEOUT;
}

Test(tcp, send_receive_sizes_and_out_of_order_tags)
{
	tp_ctx *a = make(0, 2, "s3cret", 3), *b = make(1, 2, "s3cret", 3);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	size_t sizes[] = { 0, 1, 63, 4096, 12289, 1 << 20 };
	tp_caps caps;
	char d[128];

	link_up(a, b, &la, &lb);
	/* Table version 2: no registration, and one line per link for KHOR_LOG=info. */
	cr_assert_eq(tp->version, TP_VERSION);
	cr_assert(tp->reg_mr == NULL && tp->dereg_mr == NULL && tp->mr_key == NULL &&
	          tp->flush == NULL);
	tp->caps(a, &caps);
	cr_assert(!caps.needs_reg && !caps.device_mem && !caps.one_sided && !caps.needs_flush);
	tp->describe(la, d, sizeof(d));
	cr_assert(strstr(d, tp->address(b)) != NULL && strstr(d, ", 3 sockets") != NULL, "%s", d);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t len = sizes[k];
		uint8_t *x = malloc(len + 1), *y = malloc(len + 1), *z = malloc(len + 1);
		for (size_t i = 0; i < len; i++)
			x[i] = (uint8_t)(i * 7 + k);
		memset(y, 0xee, len + 1);
		memset(z, 0xee, len + 1);
		tp_tag t1 = { 1, (uint32_t)k, 1, 0 }, t2 = { 1, (uint32_t)k, 2, 0 };
		tp_req *s1, *s2, *r1, *r2;
		/* Sender sends t1 then t2; receiver posts t2 first: t1 must wait parked. */
		cr_assert_eq(tp->isend(la, x, len, t1, NULL, &s1, &e), KHOR_SUCCESS);
		cr_assert_eq(tp->isend(la, x, len, t2, NULL, &s2, &e), KHOR_SUCCESS);
		pump(both, 2, 1);
		cr_assert_eq(tp->irecv(lb, z, len, t2, NULL, &r2, &e), KHOR_SUCCESS);
		cr_assert_eq(tp->irecv(lb, y, len, t1, NULL, &r1, &e), KHOR_SUCCESS);
		cr_assert_eq(wait_req(both, r2, &e), KHOR_SUCCESS, "%s", e.text);
		cr_assert_eq(wait_req(both, r1, &e), KHOR_SUCCESS, "%s", e.text);
		cr_assert_eq(wait_req(both, s1, &e), KHOR_SUCCESS);
		cr_assert_eq(wait_req(both, s2, &e), KHOR_SUCCESS);
		cr_assert(memcmp(x, y, len) == 0 && memcmp(x, z, len) == 0, "size %zu corrupted", len);
		cr_assert(y[len] == 0xee && z[len] == 0xee, "wrote past the end at size %zu", len);
		free(x);
		free(y);
		free(z);
	}
	tp->destroy(a);
	tp->destroy(b);
}

/*
 * Frames are padded to 64 bytes on the wire. Many frames of odd lengths, all sent before
 * any receive is posted, put paddings in every position: inside the eager buffer, split
 * between it and the kernel, and between two striped chunks. Every payload must land intact
 * and nothing past it.
 */
/*
 * Announcements of large sends (request-to-send headers) that no receive matches yet are
 * read aside, up to TCP_UNEXPECTED_RTS_MAX per link. The whole bound's worth arrives
 * intact, last first; each request has its own length, so a receive matched to the wrong
 * announcement would fail on the length check.
 */
static void announce(tp_link *la, tp_link *lb, tp_ctx **both, int n, const uint8_t *x,
                     size_t base, tp_req **sends, tp_req **small_s, tp_req **small_r,
                     uint8_t *small)
{
	tp_tag last = { 7, (uint32_t)n, 1, 0 };
	kerr e;

	for (int i = 0; i < n; i++) {
		tp_tag t = { 7, (uint32_t)i, 1, 0 };
		cr_assert_eq(tp->isend(la, x, base + (size_t)i, t, NULL, &sends[i], &e),
		             KHOR_SUCCESS, "%s", e.text);
	}
	/* A small frame sent after them all, whose receive comes first: the receiver reads
	 * every announcement in front of it. */
	cr_assert_eq(tp->isend(la, x, 1, last, NULL, small_s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(tp->irecv(lb, small, 1, last, NULL, small_r, &e), KHOR_SUCCESS, "%s",
	             e.text);
	for (int i = 0; i < 500 && lb->urts < (uint32_t)n && tp->link_ready(lb); i++)
		pump(both, 2, 1);
}

Test(tcp, early_request_to_send_headers_up_to_the_bound_all_arrive)
{
	tp_ctx *a = make(0, 2, "s3cret", 1), *b = make(1, 2, "s3cret", 1);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	const int n = (int)TCP_UNEXPECTED_RTS_MAX;
	const size_t base = TCP_EAGER_MAX + 1;
	uint8_t *x = malloc(base + (size_t)n), *y = malloc(base + (size_t)n + 1), small = 0;
	tp_req **sends = calloc((size_t)n, sizeof(*sends)), *small_s, *small_r;

	cr_assert(x != NULL && y != NULL && sends != NULL);
	for (size_t i = 0; i < base + (size_t)n; i++)
		x[i] = (uint8_t)(i * 13 + 5);
	link_up(a, b, &la, &lb);
	announce(la, lb, both, n, x, base, sends, &small_s, &small_r, &small);
	cr_assert_eq(wait_req(both, small_r, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(small, x[0]);
	cr_assert_eq(lb->urts, TCP_UNEXPECTED_RTS_MAX, "%u read aside", (unsigned)lb->urts);
	cr_assert_eq(lb->ubytes, 0);
	for (int i = n - 1; i >= 0; i--) {
		size_t len = base + (size_t)i;
		tp_tag t = { 7, (uint32_t)i, 1, 0 };
		tp_req *r;
		y[len] = 0xee;
		cr_assert_eq(tp->irecv(lb, y, len, t, NULL, &r, &e), KHOR_SUCCESS, "%s", e.text);
		cr_assert_eq(wait_req(both, r, &e), KHOR_SUCCESS, "receive %d: %s", i, e.text);
		cr_assert(memcmp(x, y, len) == 0 && y[len] == 0xee, "receive %d corrupted", i);
		cr_assert_eq(wait_req(both, sends[i], &e), KHOR_SUCCESS, "send %d: %s", i, e.text);
	}
	cr_assert_eq(wait_req(both, small_s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(lb->urts, 0);
	free(sends);
	free(x);
	free(y);
	tp->destroy(a);
	tp->destroy(b);
}

/* One announcement past the bound breaks the link, on both sides, with an error naming the
 * bound and the newest call; nothing is allocated for it. */
Test(tcp, one_announcement_past_the_bound_fails_the_link_naming_it)
{
	tp_ctx *a = make(0, 2, "s3cret", 1), *b = make(1, 2, "s3cret", 1);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	const int n = (int)TCP_UNEXPECTED_RTS_MAX + 1;
	const size_t base = TCP_EAGER_MAX + 1;
	uint8_t *x = calloc(1, base + (size_t)n), small = 0;
	tp_req **sends = calloc((size_t)n, sizeof(*sends)), *small_s, *small_r;
	char want[64];

	cr_assert(x != NULL && sends != NULL);
	link_up(a, b, &la, &lb);
	announce(la, lb, both, n, x, base, sends, &small_s, &small_r, &small);
	cr_assert_neq(wait_req(both, small_r, &e), KHOR_SUCCESS);
	snprintf(want, sizeof(want), "more than %u large sends", TCP_UNEXPECTED_RTS_MAX);
	cr_assert(strstr(e.text, want) != NULL && strstr(e.text, "seq 1024, step 1") != NULL &&
	          strstr(e.text, "TCP_UNEXPECTED_RTS_MAX") != NULL, "%s", e.text);
	cr_assert(strstr(e.text, "rank 0") != NULL, "the error names no peer: %s", e.text);
	cr_assert_neq(wait_req(both, sends[0], &e), KHOR_SUCCESS, "the sender's side went on");
	free(sends);
	free(x);
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, back_to_back_frames_of_odd_lengths_arrive_intact)
{
	tp_ctx *a = make(0, 2, "s3cret", 2), *b = make(1, 2, "s3cret", 2);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	enum { N = 96 };
	size_t len[N];
	uint8_t *x[N], *y[N];
	tp_req *s[N], *r[N];

	link_up(a, b, &la, &lb);
	for (int k = 0; k < N; k++) {
		/* 0-200 bytes, then a few around the eager buffer and striping sizes */
		len[k] = k % 8 == 7 ? 4096 + (size_t)k * 131 : (size_t)(k * 37) % 201;
		x[k] = malloc(len[k] + 1);
		y[k] = malloc(len[k] + 1);
		cr_assert(x[k] != NULL && y[k] != NULL);
		for (size_t i = 0; i < len[k]; i++)
			x[k][i] = (uint8_t)(i * 13 + (size_t)k * 5 + 1);
		memset(y[k], 0xee, len[k] + 1);
		tp_tag t = { 4, 9, (uint32_t)k, 0 };
		cr_assert_eq(tp->isend(la, x[k], len[k], t, NULL, &s[k], &e), KHOR_SUCCESS);
	}
	pump(both, 2, 1);
	for (int k = 0; k < N; k++) {
		tp_tag t = { 4, 9, (uint32_t)k, 0 };
		cr_assert_eq(tp->irecv(lb, y[k], len[k], t, NULL, &r[k], &e), KHOR_SUCCESS);
	}
	for (int k = 0; k < N; k++) {
		cr_assert_eq(wait_req(both, r[k], &e), KHOR_SUCCESS, "frame %d: %s", k, e.text);
		cr_assert_eq(wait_req(both, s[k], &e), KHOR_SUCCESS, "frame %d: %s", k, e.text);
		cr_assert(memcmp(x[k], y[k], len[k]) == 0, "frame %d (%zu bytes) corrupted", k,
		          len[k]);
		cr_assert(y[k][len[k]] == 0xee, "frame %d wrote past its %zu bytes", k, len[k]);
		free(x[k]);
		free(y[k]);
	}
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, length_mismatch_fails_both_requests_without_overrun)
{
	tp_ctx *a = make(0, 2, "", 1), *b = make(1, 2, "", 1);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	uint8_t big[100] = { 0 }, small[51];
	tp_req *s, *r;

	memset(small, 0x5a, sizeof(small));
	link_up(a, b, &la, &lb);
	tp_tag t = { 0, 7, 0, 0 };
	tp->isend(la, big, 100, t, NULL, &s, &e);
	tp->irecv(lb, small, 50, t, NULL, &r, &e);
	cr_assert_eq(wait_req(both, r, &e), KHOR_ERR_PROTOCOL);
	cr_assert(strstr(e.text, "100 bytes") && strstr(e.text, "50 bytes"), "%s", e.text);
	cr_assert(strstr(e.text, "peer rank 0"), "error should name the peer: %s", e.text);
	cr_assert_eq(small[50], 0x5a);
	wait_req(both, s, &e);
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, wrong_secret_is_refused_and_the_job_carries_on)
{
	tp_ctx *b = make(1, 2, "right", 1);
	tp_ctx *bad = make(0, 2, "wrong", 1), *good = make(0, 2, "right", 1);
	tp_ctx *pair_bad[2] = { bad, b };
	tp_link *lbad, *la, *lb;
	kerr e;

	cr_assert_eq(tp->connect(bad, 1, tp->address(b), &lbad, &e), KHOR_SUCCESS);
	for (int i = 0; i < 2000 && lerr(tp, lbad)->status == KHOR_SUCCESS; i++)
		pump(pair_bad, 2, 1);
	cr_assert_eq(lerr(tp, lbad)->status, KHOR_ERR_AUTH, "%s", lerr(tp, lbad)->text);
	tp->accept(b, 0, &lb, &e);
	cr_assert_null(lb, "the stranger must not become rank 0's link");
	link_up(good, b, &la, &lb);
	tp->destroy(bad);
	tp->destroy(good);
	tp->destroy(b);
}

static int raw_connect(tp_ctx *c)
{
	char host[256];
	uint16_t port;
	ksockaddr a;
	kerr e;
	int fd;

	cr_assert(ksock_split_hostport(tp->address(c), host, sizeof(host), &port));
	cr_assert_eq(ksock_resolve(host, port, &a, &e), KHOR_SUCCESS);
	cr_assert_eq(ksock_connect_deadline(&a, kdeadline_in_ms(2000), false, &fd, &e), KHOR_SUCCESS);
	return fd;
}

Test(tcp, garbage_and_silent_clients_do_not_harm_the_listener)
{
	tp_ctx *a = make(0, 2, "k", 2), *b = make(1, 2, "k", 2);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	kerr e;
	uint8_t junk[4096];

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 131 + 17);
	int silent = raw_connect(b);
	int noisy = raw_connect(b);
	cr_assert(write(noisy, junk, sizeof(junk)) > 0);
	/* A hello-sized blob with the right magic but nonsense inside. */
	int liar = raw_connect(b);
	uint32_t fake[32];
	memset(fake, 0xff, sizeof(fake));
	fake[0] = 0x524f484bu;
	cr_assert(write(liar, fake, sizeof(fake)) > 0);
	pump(both, 2, 5);
	link_up(a, b, &la, &lb);
	/* The real link still moves data. */
	uint32_t x = 0xdeadbeef, y = 0;
	tp_req *s, *r;
	tp_tag t = { 0, 1, 0, 0 };
	tp->isend(la, &x, 4, t, NULL, &s, &e);
	tp->irecv(lb, &y, 4, t, NULL, &r, &e);
	cr_assert_eq(wait_req(both, r, &e), KHOR_SUCCESS);
	cr_assert_eq(wait_req(both, s, &e), KHOR_SUCCESS);
	cr_assert_eq(y, x);
	/* The garbage senders were dropped: reading gives EOF or reset, not silence. */
	char c;
	cr_assert(read(noisy, &c, 1) <= 0);
	close(silent);
	close(noisy);
	close(liar);
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, closed_peer_fails_pending_receive_naming_the_rank)
{
	tp_ctx *a = make(0, 2, "", 1), *b = make(1, 2, "", 1);
	tp_link *la, *lb;
	kerr e;
	uint8_t buf[16];
	tp_req *r;

	link_up(a, b, &la, &lb);
	tp_tag t = { 0, 1, 0, 0 };
	tp->irecv(la, buf, 16, t, NULL, &r, &e);
	(void)lb;
	tp->destroy(b);
	tp_ctx *only[2] = { a, a };
	for (int i = 0; i < 1000; i++) {
		bool done = false;
		khor_status st = tp->test(r, &done, &e);
		if (done) {
			cr_assert_eq(st, KHOR_ERR_REMOTE);
			cr_assert(strstr(e.text, "peer rank 1"), "%s", e.text);
			tp->destroy(a);
			return;
		}
		pump(only, 1, 2);
	}
	cr_assert_fail("the receive did not fail after the peer closed");
}

Test(tcp, interface_spec_that_matches_nothing_lists_interfaces)
{
	tp_options o = { .rank = 0, .size = 2, .job_id = "x", .secret = "",
	                 .ifname_spec = "nosuchif", .nsocks = 1 };
	tp_ctx *c;
	kerr e;

	cr_assert_eq(tp->create(&o, &c, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "nosuchif") && strstr(e.text, "lo="), "%s", e.text);
	o.ifname_spec = "127.0.0.0/8";
	cr_assert_eq(tp->create(&o, &c, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(strncmp(tp->address(c), "127.", 4) == 0);
	tp->destroy(c);
	o.ifname_spec = "10.0.0.0/33";
	cr_assert_eq(tp->create(&o, &c, &e), KHOR_ERR_INVALID_ARG);
}

static int64_t now_ms(void)
{
	return (int64_t)(kclock_ns() / 1000000);
}

/* A loopback port with nothing listening on it (bound, then closed): connects are refused. */
static uint16_t refusing_port(void)
{
	ksockaddr a;
	int fd;
	kerr e;

	cr_assert_eq(ksock_resolve("127.0.0.1", 0, &a, &e), KHOR_SUCCESS);
	cr_assert_eq(ksock_listen(&a, 1, &fd, &e), KHOR_SUCCESS, "%s", e.text);
	close(fd);
	return ksock_addr_port(&a);
}

/* Waits (up to ms) until la is ready and b accepted it, or la failed. */
static bool wait_link(tp_ctx *a, tp_ctx *b, tp_link *la, tp_link **lb, int ms)
{
	tp_ctx *both[2] = { a, b };
	kdeadline dl = kdeadline_in_ms(ms);
	kerr e;

	*lb = NULL;
	while (!kdeadline_passed(dl)) {
		pump(both, 2, 5);
		if (*lb == NULL)
			tp->accept(b, 0, lb, &e);
		if (tp->link_error(la, NULL) != KHOR_SUCCESS)
			return false;
		if (*lb != NULL && tp->link_ready(la))
			return true;
	}
	return false;
}

Test(tcp, dials_past_a_refusing_address_and_keeps_requests_posted_meanwhile)
{
	tp_ctx *a = make(0, 2, "s3cret", 2), *b = make(1, 2, "s3cret", 2);
	tp_ctx *both[2] = { a, b };
	tp_link *la, *lb;
	char blob[TP_ADDR_MAX], d[512];
	uint8_t x[10000], y[10000];
	tp_req *sr, *rr;
	kerr e;

	snprintf(blob, sizeof(blob), "127.0.0.1:%u,%s", refusing_port(), tp->address(b));
	cr_assert_eq(tp->connect(a, 1, blob, &la, &e), KHOR_SUCCESS, "%s", e.text);
	for (size_t i = 0; i < sizeof(x); i++)
		x[i] = (uint8_t)(i * 13);
	/* Posted before the link knows its address: it must travel on the one that works. */
	cr_assert_eq(tp->isend(la, x, sizeof(x), (tp_tag){ 1, 1, 1, 0 }, NULL, &sr, &e),
	             KHOR_SUCCESS, "%s", e.text);
	cr_assert(wait_link(a, b, la, &lb, 5000), "link did not come up: %s", lerr(tp, la)->text);
	tp->describe(la, d, sizeof(d));
	cr_assert(strncmp(d, tp->address(b), strlen(tp->address(b))) == 0 &&
	          strstr(d, "Connection refused") != NULL && strstr(d, ", 2 sockets") != NULL,
	          "%s", d);
	cr_assert_eq(tp->irecv(lb, y, sizeof(y), (tp_tag){ 1, 1, 1, 0 }, NULL, &rr, &e),
	             KHOR_SUCCESS);
	cr_assert_eq(wait_req(both, rr, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(wait_req(both, sr, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(memcmp(x, y, sizeof(x)) == 0);
	tp->describe(lb, d, sizeof(d));
	cr_assert(strstr(d, "it connected to us") != NULL, "%s", d);
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, a_silent_address_gives_way_after_its_attempt_time)
{
	tp_ctx *a = make(0, 2, "s3cret", 1), *b = make(1, 2, "s3cret", 1);
	tp_link *la, *lb;
	ksockaddr q;
	int qfd, filler;
	char blob[TP_ADDR_MAX], d[512];
	kerr e;

	/* A listener that never accepts, its backlog of one already taken: SYNs are dropped. */
	cr_assert_eq(ksock_resolve("127.0.0.1", 0, &q, &e), KHOR_SUCCESS);
	cr_assert_eq(ksock_listen(&q, 0, &qfd, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(ksock_connect_deadline(&q, kdeadline_in_ms(1000), false, &filler, &e),
	             KHOR_SUCCESS, "%s", e.text);
	snprintf(blob, sizeof(blob), "127.0.0.1:%u,%s", ksock_addr_port(&q), tp->address(b));
	int64_t t0 = now_ms();
	cr_assert_eq(tp->connect(a, 1, blob, &la, &e), KHOR_SUCCESS, "%s", e.text);
	/* What a timeout of the caller's reports meanwhile (runtime/comm.c make_link). */
	char want[64];
	snprintf(want, sizeof(want), "still connecting to 127.0.0.1:%u (", ksock_addr_port(&q));
	tp->describe(la, d, sizeof(d));
	cr_assert(strncmp(d, want, strlen(want)) == 0, "%s", d);
	cr_assert(wait_link(a, b, la, &lb, 8000), "link did not come up: %s", lerr(tp, la)->text);
	int64_t took = now_ms() - t0;
	tp->describe(la, d, sizeof(d));
	cr_assert(strstr(d, "no answer within 1500 ms") != NULL, "%s", d);
	cr_assert(took >= 1400 && took < 5000, "took %lld ms", (long long)took);
	close(filler);
	close(qfd);
	tp->destroy(a);
	tp->destroy(b);
}

Test(tcp, no_address_answering_is_an_error_naming_each_one)
{
	tp_ctx *a = make(0, 2, "s3cret", 2);
	tp_link *la;
	char blob[TP_ADDR_MAX], one[32], two[32];
	kerr e;

	snprintf(one, sizeof(one), "127.0.0.1:%u", refusing_port());
	snprintf(two, sizeof(two), "127.0.0.2:%u", refusing_port());
	snprintf(blob, sizeof(blob), "%s,%s", one, two);
	int64_t t0 = now_ms();
	cr_assert_eq(tp->connect(a, 1, blob, &la, &e), KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < 400 && tp->link_error(la, NULL) == KHOR_SUCCESS; i++)
		pump(&a, 1, 5);
	const kerr *le = lerr(tp, la);
	cr_assert_eq(le->status, KHOR_ERR_REMOTE, "%s", le->text);
	cr_assert(now_ms() - t0 < 1000, "refusals must not wait for a timeout");
	cr_assert(strstr(le->text, "peer rank 1") && strstr(le->text, one) && strstr(le->text, two),
	          "%s", le->text);
	/* 127.0.0.1 is also an address of this host, so it goes last; each has its error. */
	char w1[96], w2[96];
	snprintf(w1, sizeof(w1), "%s (same subnet as 127.0.0.1/8 on lo): Connection refused", two);
	snprintf(w2, sizeof(w2), "%s (also this host's own address on lo, tried last): "
	         "Connection refused", one);
	const char *p1 = strstr(le->text, w1), *p2 = strstr(le->text, w2);
	cr_assert(p1 != NULL && p2 != NULL && p1 < p2, "%s", le->text);
	cr_assert(strstr(le->text, "KHOR_SOCKET_IFNAME") != NULL, "%s", le->text);
	tp->destroy(a);
}
