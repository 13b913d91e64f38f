/*
 * test_tcp_frames.c -- the TCP frame reader on hand-made bytes: the rendezvous kinds of
 * protocol version 3 (RTS, CTS, DATA), KHOR_CHECKSUM's sums in the headers, and headers that
 * break the rules. The transport is
 * included whole, as in fuzz_tcp.c, so a socketpair's end can be made an established link
 * and fed frames the real sender would never write.
 */
#include "transport/tcp/tcp.c"

#include <criterion/criterion.h>
#include <sys/socket.h>

struct rig {
	tp_ctx *ctx;
	tp_link *l;
	struct tsock *s;
	int peer_fd; /* what the test writes is what the link reads */
	tp_req *reqs[4];
	int nreqs;
};

static struct rig rig_up(void)
{
	tp_options o = { .rank = 1, .size = 2, .job_id = "frames", .secret = "s",
	                 .ifname_spec = "lo", .nsocks = 1, .min_stripe_bytes = 64,
	                 .handshake_timeout_ms = 1000 };
	struct rig g = { 0 };
	int sv[2];
	kerr e;

	cr_assert_eq(tcp_create(&o, &g.ctx, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	g.l = calloc(1, sizeof(*g.l));
	cr_assert(g.l != NULL);
	g.l->ctx = g.ctx;
	g.l->nsocks = 1;
	kstrlcpy(g.l->peer_addr, "test", sizeof(g.l->peer_addr));
	g.s = sock_new(g.ctx, sv[0], SS_DATA);
	cr_assert(g.s != NULL);
	g.s->link = g.l;
	g.l->socks[0] = g.s;
	g.l->nready = 1;
	g.peer_fd = sv[1];
	return g;
}

static void rig_down(struct rig *g)
{
	for (int i = 0; i < g->nreqs; i++)
		tcp_cancel(g->reqs[i]);
	tcp_sock_close_fd(g->s);
	close(g->peer_fd);
	tcp_destroy(g->ctx); /* frees the socket and the requests, not our link */
	free(g->l);
}

static void feed(struct rig *g, enum frame_kind kind, uint32_t step, uint64_t len)
{
	struct frame_hdr h = { .magic = TCP_FRAME_MAGIC, .comm = 3, .seq = 1, .step = step,
	                       .kind = kind, .total_len = len, .chunk_len = len };

	cr_assert_eq(write(g->peer_fd, &h, sizeof(h)), (ssize_t)sizeof(h));
	for (int i = 0; i < 8 && g->s->state != SS_DEAD; i++) {
		g->s->rd_ready = true;
		sock_drive(g->s);
	}
}

/* Posts a receive (which makes the socket read) and returns it. */
static tp_req *expect(struct rig *g, void *buf, uint64_t len, uint32_t step)
{
	tp_req *r;
	kerr e;

	cr_assert_eq(post(g->l, buf, len, (tp_tag){ 3, 1, step, 0 }, false, false, 0, NULL, &r,
	                  &e),
	             KHOR_SUCCESS);
	g->reqs[g->nreqs++] = r;
	return r;
}

Test(tcp_frames, unknown_kind_breaks_the_link)
{
	struct rig g = rig_up();
	uint8_t buf[64];

	expect(&g, buf, sizeof(buf), 0);
	feed(&g, 9, 0, 64);
	cr_assert_eq(g.l->err.status, KHOR_ERR_PROTOCOL);
	cr_assert(strstr(g.l->err.text, "kind 9") != NULL, "%s", g.l->err.text);
	rig_down(&g);
}

Test(tcp_frames, clear_to_send_nobody_asked_for_breaks_the_link)
{
	struct rig g = rig_up();
	uint8_t buf[64];

	expect(&g, buf, sizeof(buf), 0);
	feed(&g, FRAME_CTS, 5, 4u << 20);
	cr_assert_eq(g.l->err.status, KHOR_ERR_PROTOCOL);
	cr_assert(strstr(g.l->err.text, "never announced") != NULL, "%s", g.l->err.text);
	rig_down(&g);
}

Test(tcp_frames, data_without_clear_to_send_breaks_the_link)
{
	struct rig g = rig_up();
	uint8_t buf[64];

	expect(&g, buf, sizeof(buf), 0);
	feed(&g, FRAME_DATA, 0, 64);
	cr_assert_eq(g.l->err.status, KHOR_ERR_PROTOCOL);
	cr_assert(strstr(g.l->err.text, "no clear-to-send") != NULL, "%s", g.l->err.text);
	rig_down(&g);
}

Test(tcp_frames, early_request_to_send_waits_and_is_answered_when_posted)
{
	struct rig g = rig_up();
	const uint64_t len = 2u << 20;
	uint8_t other[64], *big = malloc(len);
	struct frame_hdr cts;

	cr_assert(big != NULL);
	expect(&g, other, sizeof(other), 9); /* makes the socket read, matches nothing */
	feed(&g, FRAME_RTS, 4, len);
	cr_assert_eq(g.l->err.status, KHOR_SUCCESS, "%s", g.l->err.text);
	cr_assert(!klist_empty(&g.s->uq) && UFRAME(klist_first(&g.s->uq))->ch.hdr.kind == FRAME_RTS);
	cr_assert_eq(g.l->ubytes, 0, "an early RTS holds no payload");
	expect(&g, big, len, 4);
	cr_assert(klist_empty(&g.s->uq), "the RTS was taken by the receive");
	cr_assert_eq(read(g.peer_fd, &cts, sizeof(cts)), (ssize_t)sizeof(cts));
	cr_assert_eq(cts.kind, FRAME_CTS);
	cr_assert(cts.step == 4 && cts.chunk_len == len);
	/* A payload of the wrong length after the CTS is refused, not read into big. */
	feed(&g, FRAME_DATA, 4, len / 2);
	cr_assert_eq(g.l->err.status, KHOR_ERR_PROTOCOL);
	free(big);
	rig_down(&g);
}

/* An eager frame of 64 bytes with its payload, carrying sum when flags say so. */
static void feed_eager(struct rig *g, uint32_t step, uint32_t flags, uint64_t sum)
{
	struct {
		struct frame_hdr h;
		uint8_t payload[64];
	} f = { .h = { .magic = TCP_FRAME_MAGIC, .comm = 3, .seq = 1, .step = step,
	               .kind = FRAME_EAGER, .total_len = 64, .chunk_len = 64, .sum = sum,
	               .flags = flags } };
	memset(f.payload, (int)step, sizeof(f.payload));
	cr_assert_eq(write(g->peer_fd, &f, sizeof(f)), (ssize_t)sizeof(f));
	for (int i = 0; i < 8 && g->s->state != SS_DEAD; i++) {
		g->s->rd_ready = true;
		sock_drive(g->s);
	}
}

static tp_req *expect_sum(struct rig *g, void *buf, uint32_t step, tp_sum *sum)
{
	tp_req *r;
	kerr e;

	cr_assert_eq(tcp_irecv_sum(g->l, buf, 64, (tp_tag){ 3, 1, step, 0 }, NULL, sum, &r, &e),
	             KHOR_SUCCESS, "%s", e.text);
	return r;
}

static void finished(tp_req *r)
{
	bool done = false;
	kerr e;
	cr_assert_eq(tcp_test(r, &done, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(done);
}

Test(tcp_frames, sums_in_the_headers_reach_irecv_sum_posted_before_or_after)
{
	struct rig g = rig_up();
	uint8_t a[64], b[64], c[64], other[64];
	tp_sum sa, sb, sc;

	/* Posted first: read straight into a. */
	tp_req *ra = expect_sum(&g, a, 1, &sa);
	feed_eager(&g, 1, TCP_HDR_SUM, 0x1122334455667788ull);
	finished(ra);
	cr_assert(sa.carried && sa.value == 0x1122334455667788ull);
	cr_assert_eq(a[0], 1);
	/* Arrived first and read aside (another receive waits on the socket), then posted. */
	expect(&g, other, sizeof(other), 9);
	feed_eager(&g, 2, TCP_HDR_SUM, 42);
	cr_assert(!klist_empty(&g.s->uq), "the early frame was read aside");
	tp_req *rb = expect_sum(&g, b, 2, &sb);
	finished(rb);
	cr_assert(sb.carried && sb.value == 42);
	cr_assert_eq(b[63], 2);
	/* A frame that carries none says so. */
	tp_req *rc = expect_sum(&g, c, 3, &sc);
	feed_eager(&g, 3, 0, 7);
	finished(rc);
	cr_assert(!sc.carried);
	cr_assert_eq(g.l->err.status, KHOR_SUCCESS, "%s", g.l->err.text);
	rig_down(&g);
}
