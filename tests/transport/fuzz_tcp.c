/*
 * fuzz_tcp.c -- libFuzzer harness for the TCP transport's parsers: the handshake an acceptor
 * runs on bytes from anyone who connects, the frame reader that runs on an established
 * link, and the peer's published address list the dialer reads from the store. The
 * transport is included whole so the harness can put a socketpair's end in any state:
 * input byte 0 picks the target (mod 3), the rest is what the other end sends. Invariants:
 * no crash, no write outside the posted buffers (guards after each), and a broken stream
 * always ends as a link error, never as a silently completed receive of the wrong size.
 *
 *   clang -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DKHOR_BUILDING_LIBRARY -Iinclude \
 *         -I. tests/transport/fuzz_tcp.c base/err.c base/clock.c base/log.c base/auth.c \
 *         base/sock.c base/sleeper.c base/parse.c transport/transport.c transport/skel.c \
 *         transport/tcp/tcp_dial.c transport/tcp/tcp_hs.c transport/tcp/tcp_sock.c \
 *         transport/shm/shm.c transport/shm/shm_link.c transport/shm/shm_fail.c \
 *         transport/handshake.c -lcrypto -o fuzz_tcp
 *   ./fuzz_tcp -max_total_time=60
 */
#include "transport/tcp/tcp.c"

#include <sys/socket.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

static tp_ctx *ctx;

static void setup(void)
{
	tp_options o = { .rank = 1, .size = 4, .job_id = "fuzz", .secret = "s", .ifname_spec = "lo",
	                 .nsocks = 1, .min_stripe_bytes = 64, .handshake_timeout_ms = 1000 };
	kerr e;

	klog_threshold = -1; /* strangers are logged at WARN: keep the fuzzer's output clean */
	if (tcp_create(&o, &ctx, &e) != KHOR_SUCCESS)
		abort();
}

/* Handshake: the acceptor side of a fresh connection reads HELLO / PROOF from the input. */
static void fuzz_handshake(const uint8_t *d, size_t n, int sv[2])
{
	struct tsock *s = sock_new(ctx, sv[0], SS_HS_ACC);

	CHECK(s != NULL);
	kstrlcpy(s->peer_str, "fuzzer", sizeof(s->peer_str));
	tcp_hs_expect(s, sizeof(hs_hello));
	if (n > 0 && write(sv[1], d, n) < 0)
		return;
	shutdown(sv[1], SHUT_WR);
	for (int i = 0; i < 8 && s->state != SS_DEAD; i++) {
		s->rd_ready = s->wr_ready = true;
		sock_drive(s);
	}
	/* A stranger must never become a ready link. */
	for (int r = 0; r < ctx->size; r++)
		if (ctx->incoming[r] != NULL)
			CHECK(ctx->incoming[r]->nready == 0 || ctx->incoming[r]->err.status == 0);
	if (s->state != SS_DEAD)
		tcp_sock_close_fd(s);
	if (s->link != NULL)
		s->link->socks[s->idx] = NULL;
	s->link = NULL;
	sweep(ctx);
}

/* Frames: an established link with two posted receives reads whatever the input holds. */
static void fuzz_frames(const uint8_t *d, size_t n, int sv[2])
{
	tp_link *l = calloc(1, sizeof(*l));
	struct tsock *s;
	uint8_t a[64 + 16], b[300 + 16];
	tp_req *ra, *rb;
	kerr e;

	CHECK(l != NULL);
	l->ctx = ctx;
	l->peer = 0;
	l->nsocks = 1;
	kstrlcpy(l->peer_addr, "fuzzer", sizeof(l->peer_addr));
	s = sock_new(ctx, sv[0], SS_DATA);
	CHECK(s != NULL);
	s->link = l;
	l->socks[0] = s;
	l->nready = 1;
	memset(a, 0xa5, sizeof(a));
	memset(b, 0xa5, sizeof(b));
	/* The second receive takes a sum (irecv_sum), when a header carries one. */
	tp_sum sum;
	CHECK(post(l, a, 64, (tp_tag){ 0, 1, 0, 7 }, false, false, 0, NULL, &ra, &e) ==
	      KHOR_SUCCESS);
	CHECK(post(l, b, 300, (tp_tag){ 0, 1, 1, 7 }, false, false, 0, &sum, &rb, &e) ==
	      KHOR_SUCCESS);
	if (n > 0 && write(sv[1], d, n) < 0)
		return;
	shutdown(sv[1], SHUT_WR);
	for (int i = 0; i < 16 && s->state != SS_DEAD; i++) {
		s->rd_ready = true;
		sock_drive(s);
	}
	for (int i = 0; i < 16; i++)
		CHECK(a[64 + i] == 0xa5 && b[300 + i] == 0xa5);
	bool done;
	if (tcp_test(ra, &done, &e) == KHOR_SUCCESS && !done)
		tcp_cancel(ra);
	if (tcp_test(rb, &done, &e) == KHOR_SUCCESS && !done)
		tcp_cancel(rb);
	tcp_sock_close_fd(s);
	s->link = NULL;
	sweep(ctx);
	free(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	int sv[2];

	if (ctx == NULL)
		setup();
	if (n < 1 || n > 65536 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
		return 0;
	switch (d[0] % 3) {
	case 0:
		fuzz_handshake(d + 1, n - 1, sv);
		break;
	case 1:
		fuzz_frames(d + 1, n - 1, sv);
		break;
	default: {
		/* A peer's published address list, as the store hands it to the dialer. */
		char *list = malloc(n);
		ksockaddr a[8];
		CHECK(list != NULL);
		memcpy(list, d + 1, n - 1);
		list[n - 1] = '\0';
		(void)ksock_parse_addr_list(list, a, 8);
		free(list);
		break;
	}
	}
	close(sv[1]);
	return 0;
}
