/*
 * tcp.c -- the TCP transport: links over non-blocking sockets driven by one epoll set.
 *
 * A link to a peer is nsocks TCP connections. A message of L bytes is cut into at most
 * nsocks chunks of at least min_stripe_bytes; chunk i travels on socket (step + i) % nsocks,
 * so both sides agree on the split without telling each other, and small messages of
 * consecutive steps still spread over the sockets. Every chunk is preceded by a 64-byte
 * frame header and followed by zeros up to a multiple of 64 bytes:
 *
 *     magic u32 | comm u32 | seq u32 | step u32 | meta u32 | kind u32 | total_len u64 |
 *     chunk_len u64 | sum u64 | flags u32 | reserved, 12 zero bytes || payload ||
 *     zeros to a multiple of 64
 *
 * sum and flags are KHOR_CHECKSUM's (isend_sum): the sum of the whole message, in the header
 * of each of its chunks, so that no frame of its own carries it.
 *
 * The framing keeps every payload 64-byte aligned in the stream, and so, mostly, in the page
 * fragments that the kernel copies a send into (on loopback, the receiver copies straight
 * out of them). With the earlier 40-byte header, allreduces of 256 KiB-1 MiB ran 1.15-1.7x
 * as long on buffers 64 bytes past a page boundary, and up to 1.4x on page-aligned ones;
 * why the kernel's copies care is our guess (docs/PERFORMANCE.md, "Frame alignment").
 *
 * The receiver reads the header, finds the posted receive with that tag on that socket and
 * reads the payload straight into the user's buffer (no staging copy). A header whose tag
 * has no posted receive is parked: the socket is not read further while nobody waits on
 * it, so unexpected data waits in the kernel buffer, never in ours. But several comms
 * share a link, and one comm's early frame must not hold up another comm's frames behind
 * it: once a receive with another tag is posted on a socket with a parked header, that
 * frame is read aside into the link's queue of unexpected frames (bounded by
 * TCP_UNEXPECTED_MAX bytes per link) and the socket is read on. When the queue is full
 * the header stays parked, so a sender that runs too far ahead is slowed by TCP's flow
 * control, never dropped. A receive posted later takes its frame from the queue (one
 * copy). Within one comm, schedules post receives in the order the peer sends, so their
 * frames never take this detour. A header whose lengths do not match the posted receive
 * breaks the link with an error naming both lengths.
 *
 * Large chunks (over TCP_EAGER_MAX) go by rendezvous, so that no early frame is ever too big
 * to read aside: the sender sends an RTS header alone (kind FRAME_RTS, with the lengths),
 * the receiver answers with a CTS header (FRAME_CTS) once its receive is posted (at once if
 * it is), and only then does the sender send the payload (FRAME_DATA), which is read
 * straight into the posted buffer. An RTS that finds no receive waits in the unexpected
 * queue at the cost of its header. Meanwhile the socket carries other frames both ways.
 * The price is one round trip per chunk over 1 MiB (docs/PERFORMANCE.md, section 9).
 *
 * Threads: every op takes the instance's lock (the skeleton's, transport/skel.h, which also
 * makes the ops that do nothing but take it around this file's *_locked bodies).
 * progress() lets go of it while it sleeps in epoll_wait, and only one thread sleeps there
 * at a time (base/sleeper.h).
 *
 * Handshake (tcp_hs.c): every socket runs the shared one of handshake.h (HELLO, CHALLENGE,
 * PROOF, RESULT), non-blocking and bounded by handshake_timeout_ms; tcp_hs.c only moves its
 * bytes over the stream. The HELLO's aux words are the socket's index and the link's socket count
 * (TCP_AUX_*), which the acceptor checks itself. A stranger (bad magic, another transport,
 * wrong job, wrong secret, wrong target rank, impossible socket count) is refused and logged,
 * and the listener goes on serving the real ranks.
 *
 * Sockets are registered edge-triggered; rd_ready/wr_ready remember readiness until a call
 * returns EAGAIN, so no syscall is made on a socket that cannot move bytes.
 *
 * Addresses (tcp_dial.c): hosts may have several networks, named differently on every host,
 * and not all reach every peer. Without KHOR_SOCKET_IFNAME an instance listens on every
 * address and publishes a list, best first ("198.19.10.2:4100,10.0.0.2:4100": the store's
 * subnet, then the other interfaces; ksock_order_candidates). The connector dials the
 * peer's addresses in its own order (ksock_order_peer: those on one of its subnets first),
 * all the link's sockets at once, one address at a time: the first address on which any
 * socket connects is the link's, and the others are never tried. An address that refuses,
 * is unreachable or does not answer within TCP_ATTEMPT_MS (doubled on each pass over the
 * list) gives way to the next one, until every address failed outright or the handshake
 * timeout passed; the error then names each address and why it failed. With one address or
 * a first address on a shared subnet this is exactly one connect per socket, as before.
 */
#include "tcp_int.h"

#include "base/log.h"
#include "base/secret.h"
#include "base/sleeper.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
static const uint8_t frame_zeros[TCP_FRAME_ALIGN];

/* ---- small helpers ------------------------------------------------------------------- */

/* Which sockets carry a message: count and first index. Identical on both sides. */
static void stripe_plan(const tp_link *l, uint64_t len, uint32_t step, int *nchunks, int *first)
{
	uint64_t n = l->ctx->min_stripe ? len / l->ctx->min_stripe : (uint64_t)l->nsocks;

	if (n < 1)
		n = 1;
	if (n > (uint64_t)l->nsocks)
		n = (uint64_t)l->nsocks;
	*nchunks = (int)n;
	*first = (int)(step % (uint32_t)l->nsocks);
}

static uint64_t chunk_len(uint64_t len, int nchunks, int i, uint64_t *off)
{
	/* Cut on 64-byte boundaries so receive buffers stay aligned for the reduce kernels. */
	uint64_t per = (len / (uint64_t)nchunks) & ~(uint64_t)63;
	*off = per * (uint64_t)i;
	return i == nchunks - 1 ? len - per * (uint64_t)(nchunks - 1) : per;
}

#define CHUNK(n) KLIST_ENTRY(n, struct chunk, node)
#define UFRAME(n) KLIST_ENTRY(n, struct uframe, node)
#define TSOCK(n) KLIST_ENTRY(n, struct tsock, node_all)

/* Every socket of ctx, newest first (the body must not unlink it: sweep does that). */
#define FOR_EACH_SOCK(t, ctx)                                                                 \
	for (struct tsock *t = TSOCK((ctx)->all.next); &t->node_all != &(ctx)->all;            \
	     t = TSOCK(t->node_all.next))

/* A new socket object (zeroed, its queues empty) on ctx's list of every socket. */
static struct tsock *sock_alloc(tp_ctx *ctx)
{
	struct tsock *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->ctx = ctx;
	s->hs_deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
	klist_init(&s->sq);
	klist_init(&s->rq);
	klist_init(&s->uq);
	klist_init(&s->rts_wait);
	klist_init(&s->rdv_wait);
	klist_add_head(&ctx->all, &s->node_all);
	return s;
}

static struct tsock *sock_new(tp_ctx *ctx, int fd, enum sock_state st)
{
	struct tsock *s = sock_alloc(ctx);

	if (s == NULL)
		return NULL;
	if (!tcp_sock_attach(s, fd, st)) {
		klist_del(&s->node_all);
		free(s);
		return NULL;
	}
	return s;
}

static void sock_peer_str(struct tsock *s)
{
	ksockaddr a;

	a.len = sizeof(a.ss);
	if (getpeername(s->fd, (struct sockaddr *)&a.ss, &a.len) == 0)
		ksock_addr_str(&a, s->peer_str, sizeof(s->peer_str));
	else
		kstrlcpy(s->peer_str, "?", sizeof(s->peer_str));
}

/* ---- data path ----------------------------------------------------------------------- */

static void uframe_deliver(struct tsock *s, struct uframe *u);
static bool send_drive(struct tsock *s);

static void chunk_finished(struct tsock *s, struct chunk *c)
{
	if (c->req != NULL) {
		c->req->chunks_done++;
		tp_skel_completed(&s->ctx->sk);
		return;
	}
	struct uframe *u = (struct uframe *)c;
	u->complete = true;
	if (u->want != NULL)
		uframe_deliver(s, u);
}

/* ---- pool ---------------------------------------------------------------------------
 *
 * Every unexpected frame costs a record (struct uframe) and a copy of its payload, and every
 * CTS a chunk; all three were malloc'd and freed per frame. The payloads come in every size
 * up to TCP_EAGER_MAX, between the heap's other blocks, and a soak's tcp ranks grew 1-3% in
 * RSS over hours while the heap's bytes in use stayed flat: glibc kept the pages those
 * blocks had fragmented (docs/PERFORMANCE.md, sections 21, 22 and 24). So the small ones
 * come from per-instance lists by power-of-two class, and go back there; the lists hold
 * under TCP_POOL_KEEP bytes and free the rest. Payloads of TCP_POOL_MAX bytes and more are
 * pages of their own (mmap), given back to the kernel when freed.
 */

static void *pool_take(struct tcp_free **list, uint64_t size, struct tcp_pool *p)
{
	struct tcp_free *f = *list;

	if (f == NULL)
		return malloc(size);
	*list = f->next;
	p->kept -= size;
	return f;
}

static void pool_give(struct tcp_free **list, uint64_t size, struct tcp_pool *p, void *b)
{
	if (p->kept + size > TCP_POOL_KEEP) {
		free(b);
		return;
	}
	struct tcp_free *f = b;
	f->next = *list;
	*list = f;
	p->kept += size;
}

static void pool_drain(struct tcp_free **list)
{
	while (*list != NULL) {
		struct tcp_free *f = *list;
		*list = f->next;
		free(f);
	}
}

static void pool_destroy(struct tcp_pool *p)
{
	for (int i = 0; i < TCP_POOL_CLASSES; i++)
		pool_drain(&p->payload[i]);
	pool_drain(&p->frames);
	pool_drain(&p->ctl);
	p->kept = 0;
}

/* The class of a payload of len bytes (len < TCP_POOL_MAX) and its blocks' size. */
static int pool_class(uint64_t len, uint64_t *size)
{
	int c = 0;

	while (((uint64_t)1 << (TCP_POOL_MIN_SHIFT + c)) < len)
		c++;
	*size = (uint64_t)1 << (TCP_POOL_MIN_SHIFT + c);
	return c;
}

static void *aside_alloc(tp_ctx *ctx, uint64_t len)
{
	if (len < TCP_POOL_MAX) {
		uint64_t size;
		int c = pool_class(len, &size);
		return pool_take(&ctx->pool.payload[c], size, &ctx->pool);
	}
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void aside_free(tp_ctx *ctx, void *p, uint64_t len)
{
	if (p == NULL)
		return;
	if (len < TCP_POOL_MAX) {
		uint64_t size;
		int c = pool_class(len, &size);
		pool_give(&ctx->pool.payload[c], size, &ctx->pool, p);
	} else {
		munmap(p, len);
	}
}

/* A frame record or a CTS chunk, zeroed as calloc would; NULL: no memory. */
static struct uframe *uframe_new(tp_ctx *ctx)
{
	struct uframe *u = pool_take(&ctx->pool.frames, sizeof(*u), &ctx->pool);
	if (u != NULL)
		memset(u, 0, sizeof(*u));
	return u;
}

static struct chunk *ctl_new(tp_ctx *ctx)
{
	struct chunk *k = pool_take(&ctx->pool.ctl, sizeof(*k), &ctx->pool);
	if (k != NULL)
		memset(k, 0, sizeof(*k));
	return k;
}

static void ctl_free(tp_ctx *ctx, struct chunk *k)
{
	pool_give(&ctx->pool.ctl, sizeof(*k), &ctx->pool, k);
}

/* Takes u off its socket's queue and frees it. */
static void uframe_drop(struct tsock *s, struct uframe *u)
{
	klist_del(&u->node);
	if (s->link != NULL) {
		s->link->ubytes -= u->ch.len;
		if (u->ch.hdr.kind == FRAME_RTS)
			s->link->urts--;
	}
	aside_free(s->ctx, u->ch.buf, u->ch.len);
	pool_give(&s->ctx->pool.frames, sizeof(*u), &s->ctx->pool, u);
}

/* A header h has met c, a chunk of a receive: irecv_sum's caller learns what it carried. */
static void take_sum(struct chunk *c, const struct frame_hdr *h)
{
	tp_sum *out = c->req != NULL ? c->req->sum_out : NULL;
	if (out != NULL && (h->flags & TCP_HDR_SUM) != 0) {
		out->value = h->sum;
		out->carried = true;
	}
}

/* A complete unexpected frame meets its receive: one copy, and both are done. */
static void uframe_deliver(struct tsock *s, struct uframe *u)
{
	struct chunk *c = u->want;

	take_sum(c, &u->ch.hdr);
	if (c->len > 0)
		memcpy(c->buf, u->ch.buf, c->len);
	c->done = c->len;
	uframe_drop(s, u);
	chunk_finished(s, c);
}

/* Frees what the socket owns: unexpected frames and CTS frames not sent yet. The chunks of
 * requests still queued on it are only taken off its queues, which go with it. */
static void sock_free_uq(struct tsock *s)
{
	klist *queues[] = { &s->sq, &s->rq, &s->rts_wait, &s->rdv_wait }, *n, *next;

	while (!klist_empty(&s->uq))
		uframe_drop(s, UFRAME(klist_first(&s->uq)));
	for (size_t i = 0; i < sizeof(queues) / sizeof(queues[0]); i++) {
		KLIST_FOREACH_SAFE(n, next, queues[i]) {
			klist_del(n);
			if (CHUNK(n)->ctl)
				ctl_free(s->ctx, CHUNK(n));
		}
	}
}

/* Someone waits for a frame on s: a posted receive, a CTS for our RTS, or the payload
 * after our CTS. Otherwise frames are left in the kernel. */
static bool sock_expects(const struct tsock *s)
{
	return !klist_empty(&s->rq) || !klist_empty(&s->rts_wait) || !klist_empty(&s->rdv_wait);
}

/* Payload bytes the frame of c carries on the wire: none for an RTS or a CTS. */
static uint64_t frame_payload(const struct chunk *c)
{
	return c->hdr.kind == FRAME_RTS || c->hdr.kind == FRAME_CTS ? 0 : c->len;
}

static void sq_push(struct tsock *s, struct chunk *c)
{
	klist_add_tail(&s->sq, &c->node);
}

/* Takes the chunk of this tag off a queue; NULL if absent. */
static struct chunk *list_take(klist *queue, const struct frame_hdr *h)
{
	for (klist *n = queue->next; n != queue; n = n->next) {
		struct chunk *c = CHUNK(n);
		if (c->hdr.comm == h->comm && c->hdr.seq == h->seq && c->hdr.step == h->step) {
			klist_del(n);
			return c;
		}
	}
	return NULL;
}

/* Our receive c has met its RTS: ask for the payload and wait for it. False: no memory. */
static bool send_cts(struct tsock *s, struct chunk *c)
{
	struct chunk *k = ctl_new(s->ctx);

	if (k == NULL) {
		tcp_sock_fail(s, KHOR_ERR_NO_MEMORY, "out of memory for a clear-to-send frame");
		return false;
	}
	k->ctl = true;
	k->hdr = c->hdr;
	k->hdr.kind = FRAME_CTS;
	k->len = c->len;
	klist_add_head(&s->rdv_wait, &c->node);
	sq_push(s, k);
	send_drive(s);
	return true;
}

/* Writes queued frames until the socket is full or the queue empty. */
static bool send_drive(struct tsock *s)
{
	bool moved = false;

	while (!klist_empty(&s->sq) && s->wr_ready) {
		struct chunk *c = CHUNK(s->sq.next);
		struct iovec iov[3];
		int n_iov = 0;
		ssize_t n;

		if (c->hdr_done < sizeof(c->hdr)) {
			iov[n_iov].iov_base = (uint8_t *)&c->hdr + c->hdr_done;
			iov[n_iov].iov_len = sizeof(c->hdr) - c->hdr_done;
			n_iov++;
		}
		const uint64_t wire = frame_payload(c);
		if (c->done < wire) {
			iov[n_iov].iov_base = c->buf + c->done;
			iov[n_iov].iov_len = wire - c->done;
			n_iov++;
		}
		if (c->pad_left > 0) {
			iov[n_iov].iov_base = (void *)frame_zeros;
			iov[n_iov].iov_len = c->pad_left;
			n_iov++;
		}
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n_iov };
		n = sendmsg(s->fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				s->wr_ready = false;
				break;
			}
			tcp_sock_fail(s, KHOR_ERR_REMOTE, "send: %s%s", tcp_errstr(errno),
			              errno == EPIPE || errno == ECONNRESET
			                  ? " (the peer process exited or closed the link)"
			                  : "");
			return true;
		}
		moved = true;
		size_t left = (size_t)n;
		if (c->hdr_done < sizeof(c->hdr)) {
			size_t h = sizeof(c->hdr) - c->hdr_done;
			h = h < left ? h : left;
			c->hdr_done += (uint32_t)h;
			left -= h;
		}
		size_t p = wire - c->done < left ? (size_t)(wire - c->done) : left;
		c->done += p;
		c->pad_left -= (uint32_t)(left - p);
		if (c->hdr_done == sizeof(c->hdr) && c->done == wire && c->pad_left == 0) {
			klist_del(&c->node);
			if (c->ctl) {
				ctl_free(s->ctx, c);
			} else if (c->hdr.kind == FRAME_RTS) {
				/* The payload waits for the receiver's CTS. */
				klist_add_head(&s->rts_wait, &c->node);
			} else {
				chunk_finished(s, c);
			}
		}
	}
	return moved;
}

/*
 * A receive posted on any link for the same call (comm, seq) as h by another allreduce
 * schedule: the ranks chose different algorithms, whose steps need not ever match, so h
 * would stay parked until the deadline. Every link, since a schedule may wait on another
 * peer first and never post a receive on this one.
 */
static struct chunk *sched_conflict(tp_ctx *ctx, const struct frame_hdr *h)
{
	FOR_EACH_SOCK(t, ctx) {
		for (klist *n = t->rq.next; n != &t->rq; n = n->next) {
			struct chunk *c = CHUNK(n);
			if (c->hdr.comm == h->comm && c->hdr.seq == h->seq &&
			    tp_meta_conflict(ctx->meta, c->hdr.meta, h->meta))
				return c;
		}
	}
	return NULL;
}

/* h's frame goes to receive c: same meta and lengths, or the link breaks (false). */
static bool frame_fits(struct tsock *s, const struct frame_hdr *h, const struct chunk *c)
{
	char b1[96], b2[96];

	if (h->meta != c->hdr.meta) {
		tcp_sock_fail(
		    s, KHOR_ERR_PROTOCOL,
		    "message (comm %u, seq %u, step %u) was sent by %s but this rank posted %s: "
		    "the ranks called different collectives, dtypes/ops, algorithms or memory "
		    "kinds",
		    h->comm, h->seq, h->step,
		    tp_meta_describe(s->ctx->meta, h->meta, b1, sizeof(b1)),
		    tp_meta_describe(s->ctx->meta, c->hdr.meta, b2, sizeof(b2)));
		return false;
	}
	if (h->total_len != c->hdr.total_len || h->chunk_len != c->len) {
		tcp_sock_fail(
		    s, KHOR_ERR_PROTOCOL,
		    "message (comm %u, seq %u, step %u) is %llu bytes but the receive posted "
		    "here is %llu bytes: the ranks disagree on count or dtype",
		    h->comm, h->seq, h->step, (unsigned long long)h->total_len,
		    (unsigned long long)c->hdr.total_len);
		return false;
	}
	return true;
}

/*
 * The parked header's frame is read aside into the link's unexpected queue, so that the
 * socket can carry the frames behind it: a request-to-send as its header alone (recv_match
 * holds those to TCP_UNEXPECTED_RTS_MAX first), other frames while their payloads fit in
 * TCP_UNEXPECTED_MAX. False when that bound or memory is reached: it stays parked.
 */
static bool spill(struct tsock *s)
{
	const struct frame_hdr *h = &s->rhdr;
	const bool rts = h->kind == FRAME_RTS;
	tp_link *l = s->link;
	const uint64_t len = rts ? 0 : h->chunk_len;
	struct uframe *u;

	if (l == NULL || (!rts && l->ubytes + len > TCP_UNEXPECTED_MAX))
		return false;
	u = uframe_new(s->ctx);
	if (u != NULL && (u->ch.buf = aside_alloc(s->ctx, len)) == NULL) {
		pool_give(&s->ctx->pool.frames, sizeof(*u), &s->ctx->pool, u);
		u = NULL;
	}
	if (u == NULL)
		return false;
	u->ch.hdr = *h;
	u->ch.len = len;
	klist_init(&u->ch.node); /* on no queue: it is u that is queued */
	klist_add_tail(&s->uq, &u->node);
	l->ubytes += u->ch.len;
	l->urts += rts;
	s->parked = false;
	s->rcur = &u->ch;
	s->rhdr_got = 0;
	if (u->ch.len == 0) {
		s->rcur = NULL;
		chunk_finished(s, &u->ch);
	}
	return true;
}

/* A header is complete: find its receive, read it aside or park it. Returns false if the
 * link broke. */
static bool recv_match(struct tsock *s)
{
	struct frame_hdr *h = &s->rhdr;
	struct chunk *c;
	char b1[96], b2[96];

	if (h->kind == FRAME_CTS) {
		/* The peer is ready for the payload of our large send. */
		c = list_take(&s->rts_wait, h);
		s->rhdr_got = 0;
		if (c == NULL) {
			tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
			              "clear-to-send for (comm %u, seq %u, step %u), "
			              "which this rank never announced",
			              h->comm, h->seq, h->step);
			return false;
		}
		c->hdr.kind = FRAME_DATA;
		c->hdr_done = 0;
		c->done = 0;
		c->pad_left = frame_pad(c->len);
		sq_push(s, c);
		send_drive(s);
		return true;
	}
	if (h->kind == FRAME_DATA) {
		c = list_take(&s->rdv_wait, h);
		if (c == NULL) {
			tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
			              "data for (comm %u, seq %u, step %u), for which "
			              "this rank sent no clear-to-send",
			              h->comm, h->seq, h->step);
			return false;
		}
		if (!frame_fits(s, h, c))
			return false;
		take_sum(c, h);
		s->rcur = c;
		s->rhdr_got = 0;
		return true;
	}
	if (h->kind != FRAME_EAGER && h->kind != FRAME_RTS) {
		tcp_sock_fail(s, KHOR_ERR_PROTOCOL, "malformed frame header (kind %u)", h->kind);
		return false;
	}
	c = list_take(&s->rq, h);
	if (c == NULL && h->kind == FRAME_RTS) {
		/* Only the header waits: read it aside whatever the payload queue holds. */
		if (s->link != NULL && s->link->urts >= TCP_UNEXPECTED_RTS_MAX) {
			tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
			              "the peer announced more than %u large sends that no "
			              "receive here matches (the newest: comm %u, seq %u, step %u; "
			              "the bound is TCP_UNEXPECTED_RTS_MAX per link): the ranks' "
			              "calls differ, or one runs that far ahead",
			              TCP_UNEXPECTED_RTS_MAX, h->comm, h->seq, h->step);
			return false;
		}
		if (!spill(s)) {
			tcp_sock_fail(s, KHOR_ERR_NO_MEMORY,
			              "out of memory for an early request-to-send");
			return false;
		}
		return true;
	}
	if (c == NULL) {
		c = sched_conflict(s->ctx, h);
		if (c != NULL) {
			tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
			              "message (comm %u, seq %u, step %u) was sent by %s but this "
			              "rank posted "
			              "%s for the same call: the ranks chose different algorithms",
			              h->comm, h->seq, h->step,
			              tp_meta_describe(s->ctx->meta, h->meta, b1, sizeof(b1)),
			              tp_meta_describe(s->ctx->meta, c->hdr.meta, b2, sizeof(b2)));
			return false;
		}
		/* Someone waits for another frame on this socket: don't make them wait behind
		 * this one. */
		if (!sock_expects(s) || !spill(s))
			s->parked = true;
		return true;
	}
	s->parked = false;
	if (!frame_fits(s, h, c))
		return false;
	if (h->kind == FRAME_RTS) {
		s->rhdr_got = 0;
		return send_cts(s, c);
	}
	take_sum(c, h);
	s->rcur = c;
	s->rhdr_got = 0;
	if (c->len == 0) {
		s->rcur = NULL;
		chunk_finished(s, c);
	}
	return true;
}

/*
 * Reads into the eager buffer. Small frames usually arrive whole with the header before
 * them, so one recv() takes header and payload (and often the next frames) instead of two
 * syscalls per frame. Returns bytes read, 0 for "nothing now" (EAGAIN), -1 if the socket
 * failed (already reported).
 */
static ssize_t eager_fill(struct tsock *s)
{
	size_t avail = s->e_len - s->e_off;
	ssize_t n;

	if (avail == 0) {
		s->e_off = s->e_len = 0;
	} else if (s->e_off > 0) {
		memmove(s->ebuf, s->ebuf + s->e_off, avail);
		s->e_off = 0;
		s->e_len = (uint32_t)avail;
	}
	for (;;) {
		n = recv(s->fd, s->ebuf + s->e_len, sizeof(s->ebuf) - s->e_len, 0);
		if (n > 0) {
			s->e_len += (uint32_t)n;
			return n;
		}
		if (n < 0 && errno == EINTR)
			continue;
		break;
	}
	if (n < 0 && errno == EAGAIN) {
		s->rd_ready = false;
		return 0;
	}
	if (n == 0)
		tcp_sock_fail(s, KHOR_ERR_REMOTE,
		              "connection closed by the peer while %s (the peer "
		              "process exited, crashed or closed the link)",
		              s->rcur ? "receiving a message" : "waiting for a message");
	else
		tcp_sock_fail(s, KHOR_ERR_REMOTE, "receive: %s", tcp_errstr(errno));
	return -1;
}

static size_t eager_take(struct tsock *s, void *dst, size_t want)
{
	size_t avail = s->e_len - s->e_off, n = want < avail ? want : avail;

	memcpy(dst, s->ebuf + s->e_off, n);
	s->e_off += (uint32_t)n;
	return n;
}

static bool recv_drive(struct tsock *s)
{
	bool moved = false;

	while (s->state == SS_DATA) {
		if (s->parked && (!sock_expects(s) || !spill(s)))
			break;
		if (s->rcur == NULL) {
			size_t avail = s->e_len - s->e_off;
			if (s->rskip > 0) { /* the last frame's padding */
				size_t k = avail < s->rskip ? avail : s->rskip;
				s->e_off += (uint32_t)k;
				s->rskip -= (uint32_t)k;
				avail -= k;
			}
			size_t need = s->rskip + sizeof(s->rhdr) - s->rhdr_got;
			if (avail < need && (!sock_expects(s) || !s->rd_ready))
				break; /* nothing posted, or nothing to read: leave it in the kernel */
			if (s->rskip == 0)
				s->rhdr_got += (uint32_t)eager_take(s, (uint8_t *)&s->rhdr + s->rhdr_got,
				                                    need);
			if (s->rskip > 0 || s->rhdr_got < sizeof(s->rhdr)) {
				ssize_t n = eager_fill(s);
				if (n <= 0)
					return moved || n < 0;
				moved = true;
				continue;
			}
			moved = true;
			if (s->rhdr.magic != TCP_FRAME_MAGIC) {
				tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
				              "malformed frame header (magic 0x%08x); "
				              "closing the link",
				              s->rhdr.magic);
				return true;
			}
			if (s->rhdr.chunk_len > s->rhdr.total_len) {
				tcp_sock_fail(s, KHOR_ERR_PROTOCOL,
				              "malformed frame header (chunk of %llu "
				              "bytes in a message of %llu)",
				              (unsigned long long)s->rhdr.chunk_len,
				              (unsigned long long)s->rhdr.total_len);
				return true;
			}
			if (!recv_match(s))
				return true;
			continue;
		}
		struct chunk *c = s->rcur;
		uint64_t need = c->len - c->done;
		if (s->e_len > s->e_off) {
			c->done += eager_take(s, c->buf + c->done, need);
		} else if (!s->rd_ready) {
			break;
		} else if (need >= sizeof(s->ebuf) / 2) {
			/* Large payloads go straight from the socket into the user's buffer. */
			ssize_t n = recv(s->fd, c->buf + c->done, need, 0);
			if (n <= 0) {
				if (n < 0 && errno == EINTR)
					continue;
				if (n < 0 && errno == EAGAIN) {
					s->rd_ready = false;
					break;
				}
				tcp_sock_fail(s, KHOR_ERR_REMOTE,
				              n == 0 ? "connection closed by the peer "
				                       "while receiving a message (the peer "
				                       "process exited, crashed or "
				                       "closed the link)"
				                     : "receive: %s",
				              tcp_errstr(errno));
				return true;
			}
			c->done += (uint64_t)n;
		} else {
			ssize_t n = eager_fill(s);
			if (n <= 0)
				return moved || n < 0;
			moved = true;
			continue;
		}
		moved = true;
		if (c->done == c->len) {
			s->rcur = NULL;
			s->rhdr_got = 0;
			s->rskip = frame_pad(c->len);
			chunk_finished(s, c);
		}
	}
	return moved;
}

static bool sock_drive(struct tsock *s)
{
	bool moved;

	if (s->state == SS_DEAD)
		return false;
	if (s->state != SS_DATA) {
		moved = tcp_hs_drive(s);
		if (s->state != SS_DATA)
			return moved;
	} else {
		moved = false;
	}
	moved |= send_drive(s);
	if (s->state == SS_DATA)
		moved |= recv_drive(s);
	return moved;
}

/* ---- ops ----------------------------------------------------------------------------- */

static khor_status tcp_create(const tp_options *opt, tp_ctx **ctx_out, kerr *err)
{
	tp_ctx *ctx;
	ksockaddr local;
	ksock_iface cand[KSOCK_MAX_CANDS];
	int ncand = 0;
	char as[64], pub[2 * TP_ADDR_MAX];
	khor_status st;

	if (opt->nsocks < 1 || opt->nsocks > TCP_MAX_SOCKS)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_SOCKET_NSOCKS=%d: must be 1 to %d",
		                opt->nsocks, TCP_MAX_SOCKS);
	if (strlen(opt->job_id) >= HS_JOB_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "job id '%s' is longer than %d bytes",
		                opt->job_id, HS_JOB_MAX - 1);
	st = ksock_pick_candidates(opt->ifname_spec, opt->hint_addr, cand, KSOCK_MAX_CANDS, &ncand,
	                           err);
	if (st != KHOR_SUCCESS)
		return st;
	/* Several addresses: one listener on all of them, so every one has the same port. */
	local = cand[0].addr;
	if (ncand > 1) {
		memset(&local.ss, 0, sizeof(local.ss));
		local.ss.ss_family = cand[0].addr.ss.ss_family;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "tcp transport: out of memory");
	klist_init(&ctx->all);
	klist_init(&ctx->dialing);
	ctx->rank = opt->rank;
	ctx->size = opt->size;
	ctx->secret = ksecret_keep(opt->secret); /* not a copy of its own: base/secret.h */
	ctx->hs = (hs_self){ .transport = HS_TP_TCP, .version = TCP_VERSION, .rank = opt->rank,
	                     .size = opt->size, .name = "tcp", .secret = ctx->secret,
	                     .secret_len = ctx->secret ? strlen(ctx->secret) : 0 };
	kstrlcpy(ctx->hs.job_id, opt->job_id, sizeof(ctx->hs.job_id));
	ctx->nsocks = opt->nsocks;
	ctx->min_stripe = opt->min_stripe_bytes;
	ctx->bufsize = opt->sock_bufsize;
	ctx->hs_timeout_ms = opt->handshake_timeout_ms > 0 ? opt->handshake_timeout_ms : 30000;
	ctx->meta = opt->meta;
	ctx->spec_set = opt->ifname_spec != NULL && opt->ifname_spec[0] != '\0';
	ctx->incoming = calloc((size_t)opt->size, sizeof(tp_link *));
	ctx->outgoing = calloc((size_t)opt->size, sizeof(tp_link *));
	ctx->listen_fd = -1;
	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ctx->secret == NULL || ctx->incoming == NULL || ctx->outgoing == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "tcp transport: out of memory");
		goto fail_free;
	}
	if (ctx->epfd < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_create1: %s", tcp_errstr(errno));
		goto fail_free;
	}
	st = ksock_listen(&local, 1024, &ctx->listen_fd, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "tcp transport on interface %s", ncand == 1 ? cand[0].name : "(all)");
		goto fail_free;
	}
	/* This host's addresses, to order a peer's by (none known: every peer is "routed"). */
	ctx->mine = malloc(KSOCK_MAX_IFACES * sizeof(*ctx->mine));
	if (ctx->mine == NULL || ksock_list_ifaces(ctx->mine, KSOCK_MAX_IFACES, &ctx->nmine,
	                                           &(kerr){ 0 }) != KHOR_SUCCESS)
		ctx->nmine = 0;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->listen_fd, &ev) < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_ctl(listener): %s", tcp_errstr(errno));
		goto fail_free;
	}
	if ((st = tp_skel_init(&ctx->sk, err)) != KHOR_SUCCESS)
		goto fail_free;
	ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = &ctx->sk.sl };
	if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->sk.sl.wake_fd, &ev) < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_ctl(eventfd): %s", tcp_errstr(errno));
		goto fail_free;
	}
	/* The blob: every address with the listener's port, as many as fit; and, for the log,
	 * why each is there. */
	size_t off = 0, poff = 0;
	for (int i = 0; i < ncand; i++) {
		char sub[64], why[96];
		ksockaddr a = cand[i].addr;
		ksock_addr_set_port(&a, ksock_addr_port(&local));
		ksock_addr_str(&a, as, sizeof(as));
		if (off + strlen(as) + 2 > sizeof(ctx->addr))
			break;
		off += (size_t)snprintf(ctx->addr + off, sizeof(ctx->addr) - off, "%s%s",
		                        i ? "," : "", as);
		if (ctx->spec_set)
			snprintf(why, sizeof(why), "KHOR_SOCKET_IFNAME=%s", opt->ifname_spec);
		else if (cand[i].loopback)
			snprintf(why, sizeof(why), "loopback: %s",
			         opt->hint_addr != NULL && ksock_addr_is_loopback(opt->hint_addr)
			                 ? "the store is on this host, so the whole job is"
			                 : "no other interface is up");
		else if (opt->hint_addr != NULL &&
		         ksock_same_subnet(&cand[i].addr, opt->hint_addr, cand[i].prefix))
			snprintf(why, sizeof(why), "the store's subnet %s",
			         ksock_subnet_str(&cand[i].addr, cand[i].prefix, sub, sizeof(sub)));
		else
			snprintf(why, sizeof(why), "%s",
			         ksock_subnet_str(&cand[i].addr, cand[i].prefix, sub, sizeof(sub)));
		poff += (size_t)snprintf(pub + poff, poff < sizeof(pub) ? sizeof(pub) - poff : 0,
		                         "%s%s (%s, %s)", i ? ", " : "", as, cand[i].name, why);
		if (poff >= sizeof(pub))
			poff = sizeof(pub) - 1;
	}
	KLOG_INFO("tcp transport listening on %s, %d socket(s) per link; publishes %s",
	          ksock_addr_str(&local, as, sizeof(as)), ctx->nsocks, pub);
	*ctx_out = ctx;
	return KHOR_SUCCESS;

fail_free:
	free(ctx->mine);
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	if (ctx->epfd >= 0)
		close(ctx->epfd);
	tp_skel_destroy(&ctx->sk);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx);
	return st;
}

static const char *tcp_address(const tp_ctx *ctx)
{
	return ctx->addr;
}

static khor_status tcp_connect_locked(tp_ctx *ctx, int peer, const char *peer_addr,
                                  tp_link **link_out, kerr *err)
{
	khor_status st;
	struct tcp_dial *d;
	tp_link *l;

	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "tcp connect: bad peer rank %d", peer);
	if (ctx->outgoing[peer] != NULL) {
		*link_out = ctx->outgoing[peer];
		return KHOR_SUCCESS;
	}
	d = calloc(1, sizeof(*d));
	if (d == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "tcp connect: out of memory");
	klist_init(&d->node);
	if ((st = tcp_dial_plan(ctx, peer, peer_addr, d, err)) != KHOR_SUCCESS) {
		free(d);
		return st;
	}
	l = calloc(1, sizeof(*l));
	if (l == NULL) {
		free(d);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "tcp connect: out of memory");
	}
	l->ctx = ctx;
	l->peer = peer;
	l->nsocks = ctx->nsocks;
	l->dial = d;
	kstrlcpy(l->peer_addr, peer_addr, sizeof(l->peer_addr));
	ctx->outgoing[peer] = l;
	for (int i = 0; i < l->nsocks; i++) {
		struct tsock *s = sock_alloc(ctx);
		if (s == NULL) {
			tcp_link_fail(l, KHOR_ERR_NO_MEMORY, "out of memory for socket %d", i + 1);
			break;
		}
		s->fd = -1;
		s->state = SS_DEAD;
		s->link = l;
		s->idx = i;
		l->socks[i] = s;
		uint64_t aux[4] = { [TCP_AUX_SOCK_IDX] = (uint64_t)i,
		                    [TCP_AUX_NSOCKS] = (uint64_t)l->nsocks };
		hs_hello_make(&ctx->hs, peer, aux, &s->hello);
	}
	if (l->err.status == KHOR_SUCCESS) {
		d->deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
		d->link = l;
		klist_add_head(&ctx->dialing, &d->node);
		int e = tcp_dial_start(l);
		if (e != 0)
			tcp_dial_next(l, tcp_errstr(e), false);
	}
	*link_out = l;
	return KHOR_SUCCESS;
}

static khor_status tcp_accept_locked(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err)
{
	tp_link *l;

	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "tcp accept: bad peer rank %d", peer);
	l = ctx->incoming[peer];
	if (l != NULL && l->nready == l->nsocks) {
		l->claimed = true;
		*link_out = l;
	} else {
		*link_out = NULL;
	}
	return KHOR_SUCCESS;
}

static bool tcp_link_ready_locked(const tp_link *l)
{
	return l->nready == l->nsocks && l->err.status == KHOR_SUCCESS;
}

/*
 * Accepted: "198.19.10.1:53422 (it connected to us), 4 sockets". Opened: the address and
 * why it was taken, "198.19.10.3:4100 (same subnet as 198.19.10.1/24 on eth0), 4 sockets",
 * with the addresses that failed before it; still looking: what was tried so far.
 */
static void tcp_describe_locked(const tp_link *l, char *buf, size_t len)
{
	const struct tcp_dial *d = l->dial;
	size_t off;

	if (d == NULL) {
		snprintf(buf, len, "%s (it connected to us), %d socket%s",
		         l->peer_addr[0] ? l->peer_addr : "address unknown", l->nsocks,
		         l->nsocks == 1 ? "" : "s");
	} else {
		off = (size_t)snprintf(buf, len, "%s%s (%s", d->chosen ? "" : "still connecting to ",
		                       d->str[d->cur], d->why[d->cur]);
		for (int i = 0; i < d->n && off < len; i++)
			if (i != d->cur && d->fail[i][0])
				off += (size_t)snprintf(buf + off, len - off, "; %s: %s", d->str[i],
				                        d->fail[i]);
		if (off < len)
			snprintf(buf + off, len - off, "), %d socket%s", l->nsocks,
			         l->nsocks == 1 ? "" : "s");
	}
}

/* The queued unexpected frame of this tag that no receive has claimed yet. */
static struct uframe *uq_find(struct tsock *s, tp_tag tag)
{
	for (klist *n = s->uq.next; n != &s->uq; n = n->next) {
		struct uframe *u = UFRAME(n);
		if (u->want == NULL && u->ch.hdr.comm == tag.comm && u->ch.hdr.seq == tag.seq &&
		    u->ch.hdr.step == tag.step)
			return u;
	}
	return NULL;
}

/* A send (is_send) or a receive; sum: a send's, carried when with_sum; sum_out: a
 * receive's, for irecv_sum (else NULL). */
static khor_status post(tp_link *l, uint8_t *buf, size_t len, tp_tag tag, bool is_send,
                        bool with_sum, uint64_t sum, tp_sum *sum_out, tp_req **req_out,
                        kerr *err)
{
	struct uframe *u;
	tp_req *r;
	int nchunks, first;

	if (l->err.status != KHOR_SUCCESS) {
		*err = l->err;
		return l->err.status;
	}
	r = tp_skel_req_get(&l->ctx->sk, sizeof(*r));
	if (r == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "tcp: out of memory for a request");
	stripe_plan(l, len, tag.step, &nchunks, &first);
	r->link = l;
	r->nchunks = nchunks;
	r->chunks_done = 0;
	r->is_send = is_send;
	r->sum_out = sum_out;
	if (sum_out != NULL)
		*sum_out = (tp_sum){ 0, false };
	for (int i = 0; i < nchunks; i++) {
		struct chunk *c = &r->chunks[i];
		struct tsock *s = l->socks[(first + i) % l->nsocks];
		uint64_t off;

		klist_init(&c->node);
		c->req = r;
		c->len = chunk_len(len, nchunks, i, &off);
		c->buf = buf + off;
		c->done = 0;
		c->hdr_done = 0;
		c->ctl = false;
		c->hdr = (struct frame_hdr){ .magic = TCP_FRAME_MAGIC, .comm = tag.comm,
		                             .seq = tag.seq, .step = tag.step, .meta = tag.meta,
		                             .kind = is_send && c->len > TCP_EAGER_MAX ? FRAME_RTS
		                                                                       : FRAME_EAGER,
		                             .total_len = len, .chunk_len = c->len,
		                             .sum = with_sum ? sum : 0,
		                             .flags = with_sum ? TCP_HDR_SUM : 0 };
		c->pad_left = is_send ? frame_pad(frame_payload(c)) : 0;
		if (is_send) {
			sq_push(s, c);
		} else if ((u = uq_find(s, tag)) != NULL) {
			/* It came before us: take it from the queue (now, or once it is all in). */
			if (!frame_fits(s, &u->ch.hdr, c))
				continue; /* the link's error fails the request in test() */
			if (u->ch.hdr.kind == FRAME_RTS) {
				uframe_drop(s, u);
				send_cts(s, c);
				continue;
			}
			u->want = c;
			if (u->complete)
				uframe_deliver(s, u);
		} else if (s->parked && s->rhdr.comm == tag.comm && s->rhdr.seq == tag.seq &&
		           s->rhdr.step == tag.step) {
			klist_add_head(&s->rq, &c->node);
			recv_match(s);
		} else {
			klist_add_head(&s->rq, &c->node);
			/* A parked frame of another tag would hold this one up: read it aside. */
			if (s->parked)
				spill(s);
		}
	}
	/*
	 * The first receive of a call: a frame of the same call parked on any socket from another
	 * schedule is a conflict that recv_match reports (later frames are checked as they park).
	 */
	if (!is_send && (tag.comm != l->ctx->recv_comm || tag.seq != l->ctx->recv_seq)) {
		l->ctx->recv_comm = tag.comm;
		l->ctx->recv_seq = tag.seq;
		FOR_EACH_SOCK(t, l->ctx) {
			if (t->parked && t->rhdr.comm == tag.comm && t->rhdr.seq == tag.seq &&
			    tp_meta_conflict(l->ctx->meta, t->rhdr.meta, tag.meta))
				recv_match(t);
			for (klist *n = t->uq.next; n != &t->uq && t->state == SS_DATA;
			     n = n->next) {
				char b1[96], b2[96];
				u = UFRAME(n);
				if (u->ch.hdr.comm != tag.comm || u->ch.hdr.seq != tag.seq ||
				    !tp_meta_conflict(l->ctx->meta, u->ch.hdr.meta, tag.meta))
					continue;
				tcp_sock_fail(
				    t, KHOR_ERR_PROTOCOL,
				    "message (comm %u, seq %u, step %u) was "
				    "sent by %s but this rank posted %s for the same call: the "
				    "ranks "
				    "chose different algorithms",
				    tag.comm, tag.seq, u->ch.hdr.step,
				    tp_meta_describe(l->ctx->meta, u->ch.hdr.meta, b1, sizeof(b1)),
				    tp_meta_describe(l->ctx->meta, tag.meta, b2, sizeof(b2)));
				break;
			}
		}
	}
	l->pending++;
	/* Try at once: a small message usually goes out without waiting for progress. */
	for (int i = 0; i < nchunks && is_send; i++) {
		struct tsock *s = l->socks[(first + i) % l->nsocks];
		if (s->state == SS_DATA)
			send_drive(s);
	}
	*req_out = r;
	return KHOR_SUCCESS;
}

static khor_status tcp_isend_locked(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                                    tp_req **req_out, kerr *err)
{
	(void)mr;
	return post(l, (uint8_t *)buf, len, tag, true, false, 0, NULL, req_out, err);
}

static khor_status tcp_irecv_locked(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                                    tp_req **req_out, kerr *err)
{
	(void)mr;
	return post(l, buf, len, tag, false, false, 0, NULL, req_out, err);
}

/* isend_sum and irecv_sum (transport.h): the lock, as TP_SKEL_LOCKED_OPS gives the rest. */
static khor_status tcp_isend_sum(tp_link *l, const void *buf, size_t len, tp_tag tag,
                                 tp_mr *mr, uint64_t sum, tp_req **req_out, kerr *err)
{
	(void)mr;
	kmutex_lock(&l->ctx->sk.mu);
	khor_status st = post(l, (uint8_t *)buf, len, tag, true, true, sum, NULL, req_out, err);
	kmutex_unlock(&l->ctx->sk.mu);
	return st;
}

static khor_status tcp_irecv_sum(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                                 tp_sum *sum_out, tp_req **req_out, kerr *err)
{
	(void)mr;
	kmutex_lock(&l->ctx->sk.mu);
	khor_status st = post(l, buf, len, tag, false, false, 0, sum_out, req_out, err);
	kmutex_unlock(&l->ctx->sk.mu);
	return st;
}

/* Takes a finished or failed request's chunks off the socket queues. */
static void req_unlink(tp_req *r)
{
	tp_link *l = r->link;

	for (int i = 0; i < r->nchunks; i++) {
		struct chunk *c = &r->chunks[i];
		klist_del(&c->node); /* from sq or rq, rts_wait or rdv_wait, wherever it is */
		for (int k = 0; k < l->nsocks; k++) {
			struct tsock *s = l->socks[k];
			if (s == NULL)
				continue;
			if (s->rcur == c)
				s->rcur = NULL;
			for (klist *n = s->uq.next; n != &s->uq; n = n->next)
				if (UFRAME(n)->want == c)
					UFRAME(n)->want = NULL;
		}
	}
}

static khor_status tcp_test_locked(tp_req *r, bool *done_out, kerr *err)
{
	tp_link *l = r->link;

	if (r->chunks_done == r->nchunks) {
		*done_out = true;
		l->pending--;
		tp_skel_req_put(&l->ctx->sk, r);
		return KHOR_SUCCESS;
	}
	if (l->err.status != KHOR_SUCCESS) {
		*done_out = true;
		*err = l->err;
		req_unlink(r);
		l->pending--;
		tp_skel_req_put(&l->ctx->sk, r);
		return l->err.status;
	}
	*done_out = false;
	return KHOR_SUCCESS;
}

static void tcp_cancel_locked(tp_req *r)
{
	tp_link *l = r->link;

	for (int i = 0; i < r->nchunks; i++) {
		struct chunk *c = &r->chunks[i];
		bool started = c->done > 0 || (r->is_send && c->hdr_done > 0);
		for (int k = 0; k < l->nsocks && !started; k++) {
			struct tsock *t = l->socks[k];
			started = t != NULL && t->rcur == c;
			/* A CTS went out: the peer will send the payload to this buffer. */
			for (klist *n = t != NULL ? t->rdv_wait.next : NULL;
			     n != NULL && n != &t->rdv_wait && !started; n = n->next)
				started = CHUNK(n) == c;
		}
		if (started && (c->done < c->len ||
		                (r->is_send && (c->hdr_done < sizeof(c->hdr) || c->pad_left > 0))))
			tcp_link_fail(l, KHOR_ERR_INTERNAL,
			              "a transfer was abandoned mid-message after an "
			              "earlier error; the link is closed");
	}
	req_unlink(r);
	if (l->err.status != KHOR_SUCCESS)
		for (int k = 0; k < l->nsocks; k++)
			if (l->socks[k] != NULL)
				tcp_sock_close_fd(l->socks[k]);
	l->pending--;
	tp_skel_req_put(&l->ctx->sk, r);
}

/* A lost connection, on command (transport.h: sever): the link fails with why and its
 * sockets close, so the peer reads the end of its streams as it would after a reset. */
static void tcp_sever_locked(tp_link *l, const char *why)
{
	tcp_link_fail(l, KHOR_ERR_SYSTEM, "%s", why);
	for (int k = 0; k < l->nsocks; k++)
		if (l->socks[k] != NULL)
			tcp_sock_close_fd(l->socks[k]);
}

TP_SKEL_LOCKED_OPS(tcp)

static void accept_new(tp_ctx *ctx)
{
	for (;;) {
		int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct tsock *s;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				KLOG_WARN("accept on %s: %s", ctx->addr, tcp_errstr(errno));
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;
		}
		ksock_tune_stream(fd, ctx->bufsize);
		s = sock_new(ctx, fd, SS_HS_ACC);
		if (s == NULL) {
			close(fd);
			continue;
		}
		sock_peer_str(s);
		tcp_hs_expect(s, sizeof(hs_hello));
		s->hs_phase = 0;
	}
}

/* Drops handshakes that ran out of time; reaps closed acceptor sockets. */
static void sweep(tp_ctx *ctx)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->all) {
		struct tsock *s = TSOCK(n);
		if ((s->state == SS_HS_ACC || s->state == SS_HS_CONN || s->state == SS_CONNECTING) &&
		    kdeadline_passed(s->hs_deadline) &&
		    !(s->link != NULL && s->link->dial != NULL && !s->link->dial->chosen)) {
			if (s->link == NULL || s->state == SS_HS_ACC) {
				KLOG_WARN("dropped connection from %s: no complete handshake within %lld ms",
				          s->peer_str, (long long)ctx->hs_timeout_ms);
				if (s->link != NULL)
					s->link->socks[s->idx] = NULL;
				tcp_sock_close_fd(s);
			} else {
				tcp_sock_fail(s, KHOR_ERR_TIMEOUT,
				              "handshake did not finish within %lld ms",
				              (long long)ctx->hs_timeout_ms);
			}
		}
		/* Not while a thread sleeps in epoll_wait: it may hold an event naming s. */
		if (s->state == SS_DEAD && s->link == NULL && !ctx->sk.sl.asleep) {
			klist_del(&s->node_all);
			sock_free_uq(s);
			free(s);
		}
	}
}

static bool drive_all(tp_ctx *ctx)
{
	bool moved = false;

	if (!klist_empty(&ctx->dialing))
		tcp_dial_tick(ctx);
	FOR_EACH_SOCK(s, ctx)
		moved |= sock_drive(s);
	return moved;
}

static khor_status tcp_progress(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err)
{
	tp_skel *sk = &ctx->sk;
	struct epoll_event evs[64];
	int n, e;
	bool moved, sleeper = false;

	if (!tp_skel_progress_begin(sk, timeout_ms, moved_out))
		return KHOR_SUCCESS;
	moved = drive_all(ctx);
	/* Another thread may have finished our transfers since we last looked. */
	moved |= tp_skel_seen(sk);
	if (!moved && timeout_ms != 0) {
		if (!tp_skel_sleep_begin(sk, timeout_ms)) {
			/* Another thread slept in the kernel for both of us and has returned. */
			moved = drive_all(ctx);
			tp_skel_progress_end(sk, false, moved_out);
			if (moved_out != NULL)
				*moved_out |= moved;
			return KHOR_SUCCESS;
		}
		sleeper = true;
		moved = tp_skel_seen(sk); /* a wake since our last look: don't sleep */
		kmutex_unlock(&sk->mu);
	}
	n = epoll_wait(ctx->epfd, evs, 64, moved ? 0 : timeout_ms);
	e = errno;
	if (sleeper) {
		bool woke = false;
		for (int i = 0; i < n; i++)
			woke |= evs[i].data.ptr == (void *)&sk->sl;
		kmutex_lock(&sk->mu);
		tp_skel_sleep_end(sk, woke);
	}
	if (n < 0) {
		kmutex_unlock(&sk->mu);
		if (moved_out != NULL)
			*moved_out = moved;
		if (e == EINTR)
			return KHOR_SUCCESS;
		return kerr_set(err, KHOR_ERR_SYSTEM, "epoll_wait: %s", tcp_errstr(e));
	}
	for (int i = 0; i < n; i++) {
		struct tsock *s = evs[i].data.ptr;
		if (s == NULL) {
			accept_new(ctx);
			moved = true;
			continue;
		}
		/* A wake-up is nobody's progress: the sleeper drained it, a spinner leaves it. */
		if ((void *)s == (void *)&sk->sl)
			continue;
		if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
			s->rd_ready = true;
		if (evs[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
			s->wr_ready = true;
		moved |= sock_drive(s);
	}
	sweep(ctx);
	/* What we moved may be what a thread asleep (in the kernel or on the cv) waits for. */
	tp_skel_progress_end(sk, moved, moved_out);
	return KHOR_SUCCESS;
}

static void tcp_destroy(tp_ctx *ctx)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->all) {
		struct tsock *s = TSOCK(n);
		tcp_sock_close_fd(s);
		sock_free_uq(s);
		free(s);
	}
	for (int i = 0; i < ctx->size; i++) {
		free(ctx->incoming[i]);
		if (ctx->outgoing[i] != NULL)
			free(ctx->outgoing[i]->dial);
		free(ctx->outgoing[i]);
	}
	free(ctx->mine);
	pool_destroy(&ctx->pool);
	close(ctx->listen_fd);
	close(ctx->epfd);
	tp_skel_destroy(&ctx->sk);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx);
}

const struct transport_ops tcp_transport_ops = {
	.name = "tcp",
	.version = TP_VERSION,
	.create = tcp_create,
	.address = tcp_address,
	.caps = tp_skel_caps_plain,
	.connect = tcp_connect,
	.accept = tcp_accept,
	.link_ready = tcp_link_ready,
	.describe = tcp_describe,
	.reg_mr = NULL, /* caps.needs_reg is false */
	.dereg_mr = NULL,
	.mr_key = NULL,
	.isend = tcp_isend,
	.irecv = tcp_irecv,
	.isend_sum = tcp_isend_sum,
	.irecv_sum = tcp_irecv_sum,
	.flush = NULL,
	.test = tcp_test,
	.progress = tcp_progress,
	.cancel = tcp_cancel,
	.link_error = tcp_link_error,
	.wake = tp_skel_wake,
	.sever = tcp_sever,
	.destroy = tcp_destroy,
};
