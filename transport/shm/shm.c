/*
 * shm.c -- the shared-memory transport: links between ranks of one host through a memory
 * segment that both processes map, with a Unix-domain socket beside it for the handshake,
 * the wake-ups and the news of a peer's death.
 *
 * How a link comes up (its segment, the handshake) is shm_link.c's; this file is the rings.
 *
 * Setup. create() listens on an abstract-namespace Unix socket (SOCK_SEQPACKET) named
 * "khor-shm.<job hash>.<rank>.<pid>.<random>" and publishes "shm:<boot id>/<netns>:<name>",
 * so a peer on another host, or in another network namespace (where our abstract socket
 * cannot be reached), is refused at once instead of after a connect timeout. The connector (the lower rank)
 * makes the link's segment with memfd_create, seals it against shrinking and growing, and
 * hands the descriptor over inside the authenticated handshake of handshake.h (HELLO,
 * CHALLENGE, PROOF, RESULT), with the descriptor attached to the PROOF (SCM_RIGHTS); both
 * sides then close their descriptors and keep only the mapping. Our aux words: the HELLO's
 * carry the ring size and where nonce_c lives in the connector (SHM_AUX_*), the
 * CHALLENGE's where nonce_s lives in the acceptor (each side reads the other's nonce back
 * to probe CMA), the PROOF's and the RESULT's whether that read worked (cma_ok).
 *
 * A stranger is refused and logged while the job goes on; SEQPACKET delivers each message
 * whole, so there is no partial-read state. Why a memfd passed over a socket: it has no
 * name in any file system, so a kill -9 at any moment leaves nothing behind (shm_open +
 * shm_unlink leaves a /dev/shm name between the two calls, for ever if the process dies
 * there), and it needs no ptrace rights (opening /proc/<pid>/fd/<n> does, and races with
 * the owner closing it). Why keep the socket: it is the side channel. A byte on it wakes a rank asleep in progress(); its EOF
 * tells at once that the peer died, however it died, with no pid polling (pids are
 * reused). Abstract names vanish with their process, so no socket file is left either.
 *
 * The segment, one per link, mapped by both processes:
 *
 *     0      magic, version, ring_bytes
 *     64     sleeping[0]   \  one cache line each. sleeping[s]: side s sleeps in poll(),
 *     128    sleeping[1]    | ring its doorbell. broken[s]: side s gave up on the link,
 *     192    broken[0]      | trust none of its buffers any more
 *     256    broken[1]     /
 *     320    dir[0]  tail      connector -> acceptor. tail: written by the producer only;
 *     384            head      head and done[]: by the consumer only; own lines, so a store
 *     448            done[64]  never pulls the other side's line (done[]: msg id of each
 *     960    dir[1]  ...       finished CMA message, by slot)  acceptor -> connector
 *     1600   why[2]            each side's first error, so the other reports the cause
 *     4096   ring 0: 1 MiB     connector -> acceptor
 *            ring 1: 1 MiB     acceptor -> connector
 *
 * A ring, single producer and single consumer; head and tail count bytes since the start:
 *
 *            head                                             tail
 *             v                                                v
 *     | free | HDR payload pad | HDR payload | HDR | HDR payload |  free   | WRAP |
 *                ^ parked (no receive yet)     ^ consumed out of order
 *
 *     HDR = 64 bytes: kind, tag, meta, msg id, total length, offset (or the sender's
 *     address), piece length, consumed. Records are 64-byte aligned and never wrap: a WRAP
 *     record fills the end of the ring and the next one starts at 0.
 *
 * The producer writes a record, then publishes it with a release store of tail. The
 * consumer looks at every published record in order and takes the ones whose tag has a
 * posted receive, marking them consumed in place; it moves head (release) over the consumed
 * prefix only. A record without a receive stays parked (never dropped) and the ones behind
 * it are still taken, so receives may be posted in any order. When parked records hold
 * more than half the ring, the receiver copies them out to the heap (up to SHM_ASIDE_MAX
 * bytes a link), so that another comm's records can still get in behind one comm's early
 * ones; past that bound the sender waits for room, as with a full socket. Waiting: the
 * caller spins on progress(0); progress(timeout) raises sleeping[s], looks at the rings once
 * more and sleeps in poll() on the sockets. A side that published, released room or
 * finished a message checks the flag after a full fence and, if set, sends one byte.
 *
 * Threads: every op takes the instance's lock (the skeleton's, transport/skel.h); the
 * caller that sleeps in poll() lets go of it there, one such caller at a time
 * (base/sleeper.h), with an eventfd in its poll set so
 * that a thread which moved its bytes meanwhile can wake it. The ring is the link's bounded
 * queue of unexpected frames: records of one comm parked in it never hold up another
 * comm's records behind them, and a message whose receive is not posted yet sends at most
 * SHM_UNMATCHED_MAX bytes (two pieces) before the receiver says, in the done[] slot the
 * first piece named, that it met its receive, so one comm's early large message cannot
 * fill the ring (or the copies aside) for the others. Many early messages are copied aside.
 *
 * Messages travel through the ring in pieces of up to 64 KiB: the receiver copies piece k
 * out while the sender writes piece k+1 (pipelining), and the sender takes turns between
 * its queued messages, one piece each, so a 64 MiB message shares the ring with the small
 * ones posted after it. With KHOR_SHM_CMA=1, a message over 16 MiB instead sends one RTS
 * record with its address; the receiver reads it with process_vm_readv (CMA, one copy) in
 * 2 MiB pieces between its other work, then writes the msg id into the done[] slot the
 * sender watches. The handshake probes CMA (each side reads the other's nonce back) and
 * falls back to the ring where ptrace rules or seccomp forbid it.
 *
 * Why the ring by default: measured with bench/shm_pingpong.c (two processes; one-way time
 * = half the fastest of 30 or more round trips, GB/s = size / one-way) on this 2-vCPU AMD
 * EPYC VM, kernel 6.18, no Yama (process_vm_readv allowed), shared with other jobs (load 3
 * to 7, hence the fastest round trip; runs at load 10 came out 2-5x slower for both):
 *
 *     size      ring, 2 copies      CMA, 2 MiB pieces    CMA, 512 KiB   memcpy
 *     64 KiB    19.5 GB/s    3.4 us   6.3 GB/s    10 us    7.2 GB/s       49 GB/s
 *     256 KiB   26.8         9.8      9.1         29       9.4            45
 *     1 MiB     27.4          38     11.1         95      10.5            39
 *     4 MiB     28.3         148     11.1        378      10.5            37
 *     16 MiB    17.8         945      4.4       3836       5.5            19
 *     64 MiB     6.4       10484      4.7      14257       3.0            9.8
 *     (8 bytes: 0.16 us one-way; memcpy: one process copying a buffer of that size)
 *
 * The ring wins at every size: a 1 MiB ring stays in cache, its two copies run at once on
 * two cores, and it makes no system call; CMA pins the sender's pages on every call and its
 * single copy runs on one core. At 64 MiB both are bounded by memory bandwidth. CMA keeps
 * two merits, hence the option: only the receiver needs to run (a sender that computes or
 * lost its core does not hold the transfer up; in runs under heavier load CMA kept 3.5-4.3
 * GB/s at 16-64 MiB where the ring fell to 2.4-2.9), and it burns half the CPU.
 */#include "shm_int.h"

#include "base/log.h"
#include "base/secret.h"
#include "base/sleeper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>


/* ---- lists and requests -------------------------------------------------------------- */

static void rl_push(klist *list, tp_req *r)
{
	r->on = list;
	klist_add_tail(list, &r->node);
}

static void rl_remove(tp_req *r)
{
	if (r->on == NULL)
		return;
	klist_del(&r->node);
	r->on = NULL;
}

static void req_finish(tp_req *r)
{
	rl_remove(r);
	r->finished = true;
	r->link->nbusy--;
	tp_skel_completed(&r->link->ctx->sk);
}

/* ---- wake-ups ------------------------------------------------------------------------ */

/*
 * After we changed anything the peer may wait for (records published, room released, a
 * CMA message finished) it gets one byte on the socket if, and only if, it said it sleeps.
 * Both sides use store; full fence; load (Dekker): either the sleeper sees our change in
 * its last look before poll(), or we see its flag and wake it.
 */
static void notify_peer(tp_link *l)
{
	struct shm_line32 *f;

	if (!l->notify)
		return;
	l->notify = false;
	f = &l->seg->sleeping[1 - l->side];
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&f->v, memory_order_relaxed) &&
	    atomic_exchange_explicit(&f->v, 0, memory_order_relaxed)) {
		char b = 1;
		/* EAGAIN means bytes are already queued, so the peer will wake anyway. */
		if (send(l->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
		    errno != EINTR) {
			/* the socket's own events report a dead peer */
		}
	}
}

/* ---- sending ------------------------------------------------------------------------- */

static uint32_t rec_size(uint64_t payload)
{
	return (uint32_t)((sizeof(struct rec_hdr) + payload + SHM_LINE - 1) & ~(uint64_t)(SHM_LINE - 1));
}

static uint64_t tx_room_seen(const tp_link *l)
{
	uint64_t size = l->ring_bytes, free, to_end, a, b;

	free = size - (l->tx_tail - l->tx_head_seen);
	to_end = size - (l->tx_tail & (size - 1));
	a = free < to_end ? free : to_end;
	b = free > to_end ? free - to_end : 0;
	return a > b ? a : b;
}

/*
 * Largest record that fits now (wrapping if the space at the end is shorter). The peer's
 * head is read only when the last one we saw leaves less than want: that line is the
 * consumer's, and reading it on every record would bounce it between the two caches.
 */
static uint64_t tx_room(tp_link *l, uint64_t want)
{
	uint64_t room = tx_room_seen(l), h;

	if (room >= want)
		return room;
	h = atomic_load_explicit(&l->tx->head, memory_order_acquire);
	if (h > l->tx_tail || l->tx_tail - h > l->ring_bytes || h < l->tx_head_seen) {
		shm_link_fail(l, KHOR_ERR_PROTOCOL,
		              "the peer wrote an impossible ring position (head "
		              "%llu, tail %llu); the segment is corrupt, closing the link",
		              (unsigned long long)h, (unsigned long long)l->tx_tail);
		return 0;
	}
	l->tx_head_seen = h;
	return tx_room_seen(l);
}

/* Claims rec bytes at the tail (room was checked), writing a WRAP record first if needed. */
static struct rec_hdr *tx_claim(tp_link *l, uint32_t rec)
{
	uint64_t size = l->ring_bytes, off = l->tx_tail & (size - 1), to_end = size - off;

	if (rec > to_end) {
		struct rec_hdr w = { .magic = SHM_REC_MAGIC, .rec_len = (uint32_t)to_end,
		                     .kind = REC_WRAP };
		memcpy(l->tx_ring + off, &w, sizeof(w));
		l->tx_tail += to_end;
		off = 0;
	}
	return (struct rec_hdr *)(l->tx_ring + off);
}

static void tx_publish(tp_link *l, struct rec_hdr *slot, const struct rec_hdr *h)
{
	memcpy(slot, h, sizeof(*h));
	l->tx_tail += h->rec_len;
	atomic_store_explicit(&l->tx->tail, l->tx_tail, memory_order_release);
	l->notify = true;
}

static void hdr_for(const tp_req *r, struct rec_hdr *h, enum rec_kind kind)
{
	memset(h, 0, sizeof(*h));
	h->magic = SHM_REC_MAGIC;
	h->kind = kind;
	h->meta = r->tag.meta;
	h->comm = r->tag.comm;
	h->seq = r->tag.seq;
	h->step = r->tag.step;
	h->msg_id = r->msg_id;
	h->total_len = r->len;
	h->slot = SHM_NO_SLOT;
}

/* Writes one record of r: an RTS, or its next eager piece. False when the ring is full. */
static bool tx_one(tp_link *l, tp_req *r)
{
	struct rec_hdr h, *slot;

	if (r->cma) {
		int i;
		if (l->slots_used == ~(uint64_t)0)
			return false;
		if (tx_room(l, sizeof(h)) < sizeof(h))
			return false;
		for (i = 0; l->slots_used >> i & 1; i++)
			;
		l->slots_used |= (uint64_t)1 << i;
		r->slot = (uint32_t)i;
		hdr_for(r, &h, REC_RTS);
		h.rec_len = sizeof(h);
		h.slot = r->slot;
		h.arg = (uint64_t)(uintptr_t)r->buf;
		tx_publish(l, tx_claim(l, h.rec_len), &h);
		rl_remove(r);
		rl_push(&l->cma_wait, r);
		return true;
	}
	/* A message longer than its unmatched share needs a slot for the receiver's word that
	 * it met its receive (unmatched_full): taken with its first piece. */
	const bool long_msg = r->done == 0 && r->len > SHM_UNMATCHED_MAX;
	if (long_msg && l->slots_used == ~(uint64_t)0)
		return false;
	uint64_t left = r->len - r->done, piece = left < SHM_PIECE_MAX ? left : SHM_PIECE_MAX;
	uint64_t room = tx_room(l, rec_size(piece));
	if (room < rec_size(piece)) {
		/* Cut a smaller piece rather than wait for the whole one: the receiver is copying
		 * out and the room grows as it goes. */
		if (room < rec_size(SHM_PIECE_MIN))
			return false;
		piece = (room - sizeof(h)) & ~(uint64_t)(SHM_LINE - 1);
	}
	hdr_for(r, &h, REC_DATA);
	h.rec_len = rec_size(piece);
	h.arg = r->done;
	h.piece_len = (uint32_t)piece;
	if (long_msg) {
		int i;
		for (i = 0; l->slots_used >> i & 1; i++)
			;
		l->slots_used |= (uint64_t)1 << i;
		r->slot = (uint32_t)i;
		h.slot = r->slot;
	}
	slot = tx_claim(l, h.rec_len);
	if (piece > 0) /* an empty message may come with a NULL buffer */
		memcpy((uint8_t *)slot + sizeof(h), r->buf + r->done, piece);
	tx_publish(l, slot, &h);
	r->done += piece;
	if (r->done == r->len)
		req_finish(r); /* the bytes are in the ring: the caller may reuse its buffer */
	return true;
}

/*
 * A message whose receive is not posted yet may hold SHM_UNMATCHED_MAX bytes of the ring,
 * no more: several comms share the link, and one comm's early message must not fill the
 * ring and stop another comm's messages behind it. Its further pieces wait until the
 * receiver says, in the done[] slot its first piece named, that the message met its
 * receive. (Not the ring's head: the receiver may have copied the piece aside unmatched.)
 */
static bool unmatched_full(tp_link *l, tp_req *r)
{
	if (r->cma || r->matched || r->done < SHM_UNMATCHED_MAX)
		return false;
	if (atomic_load_explicit(&l->tx->done[r->slot], memory_order_acquire) == r->msg_id) {
		r->matched = true;
		l->slots_used &= ~((uint64_t)1 << r->slot);
		return false;
	}
	return true;
}

/*
 * Round robin over the queued sends, one record each per pass, so a huge message shares
 * the ring with the small ones posted after it. The pass stops at the first request that
 * does not fit: first records must go out in posting order, or two messages of one tag
 * could be matched the wrong way round. A message still unmatched past its share
 * (unmatched_full) is passed over; it sent its first record already.
 */
static bool tx_drive(tp_link *l)
{
	bool moved = false, more = true;

	while (more && !klist_empty(&l->sendq) && l->err.status == KHOR_SUCCESS) {
		klist *n, *next;
		more = false;
		KLIST_FOREACH_SAFE(n, next, &l->sendq) {
			tp_req *r = REQ(n);
			if (unmatched_full(l, r))
				continue;
			if (!tx_one(l, r))
				break;
			moved = more = true;
		}
	}
	return moved;
}

/* A CMA send is finished when the receiver wrote its msg id into the slot. */
static bool cma_wait_drive(tp_link *l)
{
	bool moved = false;
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &l->cma_wait) {
		tp_req *r = REQ(n);
		if (atomic_load_explicit(&l->tx->done[r->slot], memory_order_acquire) == r->msg_id) {
			l->slots_used &= ~((uint64_t)1 << r->slot);
			req_finish(r);
			moved = true;
		}
	}
	return moved;
}

/* ---- receiving ----------------------------------------------------------------------- */

static tp_req *posted_take(tp_link *l, const struct rec_hdr *h)
{
	for (klist *n = l->posted.next; n != &l->posted; n = n->next) {
		tp_req *r = REQ(n);
		if (r->tag.comm == h->comm && r->tag.seq == h->seq && r->tag.step == h->step)
			return r;
	}
	return NULL;
}

/*
 * No receive matches h yet. If one is posted for the same collective call (comm, seq) by
 * another allreduce schedule, on any link, the ranks chose different algorithms: their
 * steps need not line up, so waiting would only end at the deadline (a schedule may wait on
 * another peer first and never post a receive on this link). Fail now.
 */
static bool rx_conflict(tp_link *l, const struct rec_hdr *h)
{
	char b1[96], b2[96];

	FOR_EACH_LINK(o, l->ctx) {
		for (klist *n = o->posted.next; n != &o->posted; n = n->next) {
			tp_req *r = REQ(n);
			if (r->tag.comm != h->comm || r->tag.seq != h->seq ||
			    !tp_meta_conflict(l->ctx->meta, r->tag.meta, h->meta))
				continue;
			shm_link_fail(
			    l, KHOR_ERR_PROTOCOL,
			    "message (comm %u, seq %u, step %u) was sent by "
			    "%s but this rank posted %s for the same call: the ranks chose "
			    "different algorithms",
			    h->comm, h->seq, h->step,
			    tp_meta_describe(l->ctx->meta, h->meta, b1, sizeof(b1)),
			    tp_meta_describe(l->ctx->meta, r->tag.meta, b2, sizeof(b2)));
			return true;
		}
	}
	return false;
}

/* The first record of a message met its receive: both sides must agree on what it is. */
static bool rx_check(tp_link *l, tp_req *r, const struct rec_hdr *h)
{
	char b1[96], b2[96];

	if (h->meta != r->tag.meta) {
		shm_link_fail(l, KHOR_ERR_PROTOCOL,
		              "message (comm %u, seq %u, step %u) was sent by %s but "
		              "this rank posted %s: the ranks called different collectives, "
		              "dtypes/ops, algorithms or memory kinds",
		              h->comm, h->seq, h->step,
		              tp_meta_describe(l->ctx->meta, h->meta, b1, sizeof(b1)),
		              tp_meta_describe(l->ctx->meta, r->tag.meta, b2, sizeof(b2)));
		return false;
	}
	if (h->total_len != r->len) {
		shm_link_fail(
		    l, KHOR_ERR_PROTOCOL,
		    "message (comm %u, seq %u, step %u) from peer rank %d "
		    "is %llu bytes but the receive posted here is %llu bytes: the ranks disagree "
		    "on count or dtype",
		    h->comm, h->seq, h->step, l->peer, (unsigned long long)h->total_len,
		    (unsigned long long)r->len);
		return false;
	}
	return true;
}

/* Handles one record. Returns 1 if it was taken, 0 if it must wait (parked), -1 on error. */
static int rx_record(tp_link *l, const struct rec_hdr *h, const uint8_t *payload)
{
	tp_req *r;

	switch (h->kind) {
	case REC_WRAP:
		return 1;
	case REC_RTS:
		if (h->slot >= SHM_CMA_SLOTS || h->total_len == 0) {
			shm_link_fail(l, KHOR_ERR_PROTOCOL,
			              "malformed large-message record (slot %u, %llu "
			              "bytes); closing the link",
			              h->slot, (unsigned long long)h->total_len);
			return -1;
		}
		r = posted_take(l, h);
		if (r == NULL)
			return rx_conflict(l, h) ? -1 : 0;
		if (!rx_check(l, r, h))
			return -1;
		r->cma = true;
		r->msg_id = h->msg_id;
		r->slot = h->slot;
		r->peer_addr = h->arg;
		rl_remove(r);
		rl_push(&l->cma_active, r);
		return 1;
	case REC_DATA:
		if (h->arg == 0) {
			if (h->slot != SHM_NO_SLOT &&
			    (h->slot >= SHM_CMA_SLOTS || h->total_len <= SHM_UNMATCHED_MAX)) {
				shm_link_fail(l, KHOR_ERR_PROTOCOL,
				              "malformed first piece (slot %u, %llu bytes); closing "
				              "the link", h->slot, (unsigned long long)h->total_len);
				return -1;
			}
			r = posted_take(l, h);
			if (r == NULL)
				return rx_conflict(l, h) ? -1 : 0;
			if (!rx_check(l, r, h))
				return -1;
			r->msg_id = h->msg_id;
			rl_remove(r);
			rl_push(&l->active, r);
			if (h->slot != SHM_NO_SLOT) {
				/* The sender holds the rest back until it reads this. */
				atomic_store_explicit(&l->rx->done[h->slot], h->msg_id,
				                      memory_order_release);
				l->notify = true;
			}
		} else {
			r = NULL;
			for (klist *n = l->active.next; n != &l->active && r == NULL; n = n->next)
				if (REQ(n)->msg_id == h->msg_id)
					r = REQ(n);
			if (r == NULL)
				return 0; /* a later piece of a message still parked */
		}
		if (h->arg != r->done || h->piece_len > r->len - r->done ||
		    sizeof(*h) + h->piece_len > h->rec_len) {
			shm_link_fail(
			    l, KHOR_ERR_PROTOCOL,
			    "malformed piece (offset %llu, %u bytes) of a "
			    "%llu-byte message (comm %u, seq %u, step %u); closing the link",
			    (unsigned long long)h->arg, h->piece_len, (unsigned long long)r->len,
			    h->comm, h->seq, h->step);
			return -1;
		}
		if (h->piece_len > 0)
			memcpy(r->buf + r->done, payload, h->piece_len);
		r->done += h->piece_len;
		if (r->done == r->len)
			req_finish(r);
		return 1;
	default:
		shm_link_fail(l, KHOR_ERR_PROTOCOL,
		              "malformed ring record (kind %u); closing the link", h->kind);
		return -1;
	}
}

/* Moves head over the consumed records at the front of the ring; true if it moved. */
static bool rx_release(tp_link *l)
{
	uint64_t size = l->ring_bytes, head = l->rx_head;

	while (head < l->rx_scan) {
		const struct rec_hdr *p = (const struct rec_hdr *)(l->rx_ring + (head & (size - 1)));
		if (!p->consumed)
			break;
		head += p->rec_len;
	}
	if (head == l->rx_head)
		return false;
	l->rx_head = head;
	atomic_store_explicit(&l->rx->head, head, memory_order_release);
	l->notify = true;
	return true;
}

/*
 * Parked records hold more than half the ring: copy them out, oldest first, while their
 * payloads fit in SHM_ASIDE_MAX, and mark them consumed, so that head moves and the
 * sender's records behind them (another comm's, which this rank may be waiting for) get
 * in. Without it two comms could wait on each other for ever: one's early messages fill
 * the ring, and the other's message, which the receiver needs first, cannot enter.
 */
static void rx_aside(tp_link *l)
{
	uint64_t size = l->ring_bytes, pos = l->rx_head;

	while (pos < l->rx_scan) {
		uint64_t off = pos & (size - 1);
		uint8_t *at = l->rx_ring + off;
		struct rec_hdr h;
		memcpy(&h, at, sizeof(h));
		/* The scan checked these, but the peer writes this memory: check them again. */
		if (h.rec_len < sizeof(h) || h.rec_len % SHM_LINE != 0 || h.rec_len > size - off ||
		    h.piece_len > h.rec_len - sizeof(h))
			return;
		if (!h.consumed) {
			struct aside *a;
			if (l->aside_bytes + h.piece_len > SHM_ASIDE_MAX ||
			    (a = malloc(sizeof(*a) + h.piece_len)) == NULL)
				return; /* parked it stays: the sender waits for room */
			a->h = h;
			memcpy(a->payload, at + sizeof(h), h.piece_len);
			klist_add_tail(&l->aside, &a->node);
			l->aside_bytes += h.piece_len;
			__atomic_store_n(&((struct rec_hdr *)at)->consumed, 1, __ATOMIC_RELEASE);
		}
		pos += h.rec_len;
	}
}

/* A receive was posted: the records copied aside, which are older than the ring's, get
 * their look first. Returns 1 if one was taken, 0 if none, -1 if the link broke. */
static int aside_drive(tp_link *l)
{
	klist *n, *next;
	int moved = 0;

	KLIST_FOREACH_SAFE(n, next, &l->aside) {
		struct aside *a = KLIST_ENTRY(n, struct aside, node);
		int rc = rx_record(l, &a->h, a->payload);
		if (rc < 0)
			return -1;
		if (rc > 0) {
			l->aside_bytes -= a->h.piece_len;
			klist_del(&a->node);
			free(a);
			moved = 1;
		}
	}
	return moved;
}

/*
 * Looks at the records the peer published, in order. A record whose tag has no receive
 * yet stays where it is (parked), and records behind it are still examined, so receives
 * can be posted in any order without copying anything aside. Space is released only up to
 * the first parked record; when parked records hold more than half the ring they are
 * copied out (rx_aside, bounded), and past that bound a sender that fills the ring with
 * unmatched messages waits, which is the same back-pressure a full socket gives.
 */
static bool rx_drive(tp_link *l)
{
	uint64_t size = l->ring_bytes, tail, pos;
	bool moved = false;

	/*
	 * The next record's first two lines (header, then the payload of a small message) are
	 * fetched while the load of tail waits for the producer's line: a spinning receiver
	 * would otherwise pay the three cache misses one after another. (At the ring's last
	 * line the second address is past it, maybe past the mapping: a prefetch never faults.)
	 */
	const uint8_t *next = l->rx_ring + (l->rx_scan & (size - 1));
	__builtin_prefetch(next);
	__builtin_prefetch(next + SHM_LINE);
	tail = atomic_load_explicit(&l->rx->tail, memory_order_acquire);
	if (tail < l->rx_head || tail - l->rx_head > size) {
		shm_link_fail(l, KHOR_ERR_PROTOCOL,
		              "the peer wrote an impossible ring position (tail "
		              "%llu, head %llu); the segment is corrupt, closing the link",
		              (unsigned long long)tail, (unsigned long long)l->rx_head);
		return false;
	}
	if (l->rescan && !klist_empty(&l->aside)) {
		int rc = aside_drive(l);
		if (rc < 0)
			return true;
		moved = rc > 0;
	}
	pos = l->rescan ? l->rx_head : l->rx_scan;
	l->rescan = false;
	while (pos < tail) {
		uint64_t off = pos & (size - 1);
		struct rec_hdr h;
		memcpy(&h, l->rx_ring + off, sizeof(h));
		if (h.magic != SHM_REC_MAGIC || h.rec_len < sizeof(h) || h.rec_len % SHM_LINE != 0 ||
		    h.rec_len > size - off || h.rec_len > tail - pos) {
			shm_link_fail(l, KHOR_ERR_PROTOCOL,
			              "malformed ring record at position %llu (magic "
			              "0x%08x, %u bytes); closing the link",
			              (unsigned long long)pos, h.magic, h.rec_len);
			return true;
		}
		if (!h.consumed) {
			int rc = rx_record(l, &h, l->rx_ring + off + sizeof(h));
			if (rc < 0)
				return true;
			if (rc > 0) {
				__atomic_store_n(&((struct rec_hdr *)(l->rx_ring + off))->consumed, 1,
				                 __ATOMIC_RELEASE);
				moved = true;
				/* The sender may be holding this message's next pieces back for it. */
				if (h.kind == REC_DATA && h.arg == 0 && h.piece_len < h.total_len)
					l->notify = true;
			}
		}
		pos += h.rec_len;
	}
	l->rx_scan = pos;
	rx_release(l);
	if (tail - l->rx_head > size / 2 && l->aside_bytes < SHM_ASIDE_MAX) {
		rx_aside(l);
		rx_release(l);
	}
	return moved;
}

/*
 * Large messages: this process reads the sender's buffer itself with process_vm_readv (one
 * copy, no staging), one piece per active message per call, so other links and the small
 * messages of this link are served between pieces.
 */
static bool cma_drive(tp_link *l)
{
	bool moved = false;
	klist *node, *next;

	KLIST_FOREACH_SAFE(node, next, &l->cma_active) {
		tp_req *r = REQ(node);
		if (l->err.status != KHOR_SUCCESS)
			break;
		uint64_t n = r->len - r->done < SHM_CMA_PIECE ? r->len - r->done : SHM_CMA_PIECE;
		struct iovec lio = { r->buf + r->done, n };
		struct iovec rio = { (void *)(uintptr_t)(r->peer_addr + r->done), n };
		ssize_t k = process_vm_readv(l->peer_pid, &lio, 1, &rio, 1, 0);

		if (k <= 0) {
			int e = k < 0 ? errno : EFAULT;
			if (e == EINTR || e == EAGAIN || e == ENOMEM)
				continue;
			if (e == ESRCH) {
				shm_link_fail_peer_gone(
				    l, "its process is gone: process_vm_readv found no such "
				       "process");
			} else if (e == EPERM) {
				shm_link_fail(
				    l, KHOR_ERR_SYSTEM,
				    "process_vm_readv of a %llu-byte message: %s "
				    "(this process may not read the peer's memory any more; allow "
				    "ptrace between the ranks or set KHOR_SHM_CMA=0)",
				    (unsigned long long)r->len, shm_errstr(e));
			} else {
				shm_link_fail(l, KHOR_ERR_PROTOCOL,
				              "process_vm_readv of a %llu-byte message "
				              "at offset %llu: %s (the peer's send buffer is not "
				              "mapped: it was "
				              "freed before the send completed)",
				              (unsigned long long)r->len,
				              (unsigned long long)r->done, shm_errstr(e));
			}
			return true;
		}
		r->done += (uint64_t)k;
		moved = true;
		if (r->done == r->len) {
			/* Did the sender give up on this buffer while we read it? It raises broken
			 * before it may free the buffer, so a clear flag here means what we read was
			 * still its data. */
			atomic_thread_fence(memory_order_seq_cst);
			if (atomic_load_explicit(&l->seg->broken[1 - l->side].v, memory_order_relaxed)) {
				shm_link_fail(l, KHOR_ERR_REMOTE,
				              "the peer abandoned the link (after an error "
				              "on its side; see that rank's log) while this rank "
				              "read a message");
				return true;
			}
			atomic_store_explicit(&l->rx->done[r->slot], r->msg_id, memory_order_release);
			l->notify = true;
			req_finish(r);
		}
	}
	return moved;
}

/* Everything a ready link can do without a system call (except CMA reads). */
static bool link_drive(tp_link *l)
{
	bool moved = false;

	if (l->state != LS_READY || l->err.status != KHOR_SUCCESS)
		return false;
	if (l->out_len > 0 && !shm_hs_send(l, NULL, 0, -1)) {
		shm_link_fail(l, KHOR_ERR_REMOTE, "handshake: sending the result: %s",
		              shm_errstr(errno));
		return true;
	}
	if (atomic_load_explicit(&l->seg->broken[1 - l->side].v, memory_order_acquire)) {
		char why[sizeof(l->seg->why[0])];
		/* The peer's bytes: bound them and keep them printable before they reach a log. */
		memcpy(why, l->seg->why[1 - l->side], sizeof(why));
		why[sizeof(why) - 1] = '\0';
		for (char *q = why; *q != '\0'; q++)
			if (*q < 0x20 || *q > 0x7e)
				*q = '?';
		shm_link_fail(l, KHOR_ERR_REMOTE,
		              "the peer closed the link after an error on its side: "
		              "[%s]",
		              why[0] ? why : "no reason given");
		return true;
	}
	moved |= tx_drive(l);
	moved |= cma_wait_drive(l);
	moved |= rx_drive(l);
	moved |= cma_drive(l);
	/* A gone peer leaves its last records in our mapping; fail only what cannot finish. */
	if (l->peer_gone && l->nbusy > 0 && l->err.status == KHOR_SUCCESS)
		shm_link_fail_peer_gone(l, "its end of the socket closed");
	if (l->err.status == KHOR_SUCCESS)
		notify_peer(l);
	return moved;
}

/* ---- the socket side: accepting, doorbells, deaths ----------------------------------- */

static tp_link *link_new(tp_ctx *ctx, int peer, int side, int fd)
{
	tp_link *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return NULL;
	l->ctx = ctx;
	l->peer = peer;
	l->side = side;
	l->fd = fd;
	l->seg_fd = -1;
	l->out_fd = -1;
	l->hs_deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
	klist_init(&l->sendq);
	klist_init(&l->cma_wait);
	klist_init(&l->posted);
	klist_init(&l->active);
	klist_init(&l->cma_active);
	klist_init(&l->aside);
	klist_add_head(&ctx->all, &l->node_all);
	return l;
}

static bool accept_new(tp_ctx *ctx)
{
	bool moved = false;

	for (;;) {
		int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		tp_link *l;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN)
				KLOG_WARN("shm transport (rank %d): accept: %s", ctx->rank,
				          shm_errstr(errno));
			return moved;
		}
		l = link_new(ctx, -1, 1, fd);
		if (l == NULL) {
			close(fd);
			continue;
		}
		shm_peer_cred(l);
		l->state = LS_HS;
		l->hs_phase = 0;
		moved = true;
	}
}

/* Drains doorbell bytes; notices EOF. */
static bool link_socket_event(tp_link *l, short revents)
{
	char buf[64];
	bool moved = false;

	if (l->state != LS_READY)
		return shm_hs_step(l);
	for (;;) {
		ssize_t n = recv(l->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			moved = true;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || (n < 0 && errno != EAGAIN)) {
			if (!l->peer_gone)
				moved = true;
			l->peer_gone = true;
		}
		break;
	}
	if (revents & (POLLHUP | POLLERR)) {
		if (!l->peer_gone)
			moved = true;
		l->peer_gone = true;
	}
	return moved;
}

static bool poll_grow(struct pollset *ps, size_t n)
{
	if (n <= ps->pcap)
		return true;
	struct pollfd *p = realloc(ps->pfds, n * sizeof(*p));
	if (p == NULL)
		return false;
	ps->pfds = p;
	tp_link **q = realloc(ps->plinks, n * sizeof(*q));
	if (q == NULL)
		return false;
	ps->plinks = q;
	ps->pcap = n;
	return true;
}

/*
 * One poll() over the listener, every live link's socket and the wake-up fd. The sleeper
 * (sleeping) lets go of the lock inside poll(), on arrays of its own. *woke (if not NULL):
 * whether the wake-up fd was readable, for tp_skel_sleep_end.
 */
static bool poll_sockets(tp_ctx *ctx, int timeout_ms, bool sleeping, bool *woke, kerr *err)
{
	struct pollset *ps = sleeping ? &ctx->sleep : &ctx->busy;
	size_t n = 2;
	bool moved = false;
	int rc;

	FOR_EACH_LINK(l, ctx)
		n++;
	if (!poll_grow(ps, n))
		return false;
	n = 0;
	ps->pfds[n].fd = ctx->listen_fd;
	ps->pfds[n].events = POLLIN;
	ps->plinks[n++] = NULL;
	ps->pfds[n].fd = ctx->sk.sl.wake_fd;
	ps->pfds[n].events = POLLIN;
	ps->plinks[n++] = NULL;
	FOR_EACH_LINK(l, ctx) {
		if (l->fd < 0 || l->state == LS_DEAD || l->state == LS_CONNECTING ||
		    l->err.status != KHOR_SUCCESS || l->peer_gone)
			continue;
		ps->pfds[n].fd = l->fd;
		ps->pfds[n].events = (short)(POLLIN | (l->out_len > 0 ? POLLOUT : 0));
		ps->plinks[n++] = l;
	}
	if (sleeping)
		kmutex_unlock(&ctx->sk.mu);
	rc = poll(ps->pfds, (nfds_t)n, timeout_ms);
	if (sleeping)
		kmutex_lock(&ctx->sk.mu);
	if (rc <= 0)
		return false;
	if (woke != NULL)
		*woke = ps->pfds[1].revents != 0;
	for (size_t i = 0; i < n; i++) {
		short re = ps->pfds[i].revents;
		if (re == 0 || i == 1) /* 1: a wake-up, nobody's progress (tp_skel_sleep_end) */
			continue;
		/* A link that failed while we slept keeps its fd until sweep, which waits for us. */
		if (ps->plinks[i] == NULL)
			moved |= accept_new(ctx);
		else
			moved |= link_socket_event(ps->plinks[i], re);
	}
	(void)err;
	return moved;
}

static void link_free(tp_link *l)
{
	while (!klist_empty(&l->aside)) {
		struct aside *a = KLIST_ENTRY(l->aside.next, struct aside, node);
		klist_del(&a->node);
		free(a);
	}
	if (l->fd >= 0)
		close(l->fd);
	if (l->seg_fd >= 0)
		close(l->seg_fd);
	if (l->seg != NULL)
		munmap(l->seg, l->seg_len);
	free(l);
}

/* Retries connects, ends handshakes that ran out of time, frees refused connections. */
static bool sweep(tp_ctx *ctx, bool *handshaking)
{
	bool moved = false;
	klist *n, *next;

	*handshaking = false;
	KLIST_FOREACH_SAFE(n, next, &ctx->all) {
		tp_link *l = LINK(n);
		if (l->state == LS_CONNECTING && l->err.status == KHOR_SUCCESS)
			moved |= shm_hs_step(l);
		if ((l->state == LS_CONNECTING || l->state == LS_HS) && l->err.status == KHOR_SUCCESS &&
		    kdeadline_passed(l->hs_deadline)) {
			if (l->side == 1)
				shm_acc_drop(l, "no complete handshake within %lld ms",
				             (long long)ctx->hs_timeout_ms);
			else
				shm_link_fail(l, KHOR_ERR_TIMEOUT,
				              "handshake did not finish within %lld ms "
				              "(the peer is stuck or not polling its transport)",
				              (long long)ctx->hs_timeout_ms);
		}
		/* Not while a thread sleeps in poll(): its arrays may name l. */
		if (l->side == 1 && l->state == LS_DEAD && !l->claimed && !ctx->sk.sl.asleep &&
		    (l->peer < 0 || ctx->incoming[l->peer] != l)) {
			klist_del(&l->node_all);
			link_free(l);
			continue;
		}
		if ((l->state == LS_CONNECTING || l->state == LS_HS) && l->err.status == KHOR_SUCCESS)
			*handshaking = true;
	}
	return moved;
}

static bool drive_links(tp_ctx *ctx)
{
	bool moved = false;

	FOR_EACH_LINK(l, ctx)
		moved |= link_drive(l);
	return moved;
}

/* Raises (or lowers) our sleeping flag on every ready link. */
static void set_sleeping(tp_ctx *ctx, uint32_t v)
{
	FOR_EACH_LINK(l, ctx)
		if (l->state == LS_READY && l->err.status == KHOR_SUCCESS)
			atomic_store_explicit(&l->seg->sleeping[l->side].v, v, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
}

/* ---- ops ----------------------------------------------------------------------------- */

/* Boot id and network namespace: two ranks with the same key can share memory and reach
 * each other's abstract sockets. Containers on one host share the boot id but may not
 * share the namespace. */
static bool read_host_key(char *out, size_t len)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	char boot[64], ns[64];
	ssize_t n;
	bool ok;

	if (f == NULL)
		return false;
	ok = fgets(boot, sizeof(boot), f) != NULL;
	fclose(f);
	boot[strcspn(boot, "\n")] = '\0';
	n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
	if (!ok || boot[0] == '\0' || n <= 0)
		return false;
	ns[n] = '\0'; /* "net:[4026531840]" */
	snprintf(out, len, "%s/%s", boot, ns + strcspn(ns, "0123456789"));
	out[strcspn(out, "]")] = '\0';
	return true;
}

static khor_status shm_create(const tp_options *opt, tp_ctx **ctx_out, kerr *err)
{
	tp_ctx *ctx;
	struct sockaddr_un sa;
	char name[96];
	uint8_t rnd[8];
	uint64_t job_hash = 1469598103934665603ull;
	khor_status st;
	socklen_t sl;

	if (strlen(opt->job_id) >= HS_JOB_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "job id '%s' is longer than %d bytes",
		                opt->job_id, HS_JOB_MAX - 1);
	if (opt->size < 1 || opt->rank < 0 || opt->rank >= opt->size)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "shm transport: rank %d of %d is not valid",
		                opt->rank, opt->size);
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "shm transport: out of memory");
	klist_init(&ctx->all);
	ctx->rank = opt->rank;
	ctx->size = opt->size;
	ctx->listen_fd = -1;
	ctx->secret = ksecret_keep(opt->secret); /* not a copy of its own: base/secret.h */
	ctx->hs = (hs_self){ .transport = HS_TP_SHM, .version = SHM_VERSION, .rank = opt->rank,
	                     .size = opt->size, .name = "shm", .secret = ctx->secret,
	                     .secret_len = ctx->secret ? strlen(ctx->secret) : 0 };
	kstrlcpy(ctx->hs.job_id, opt->job_id, sizeof(ctx->hs.job_id));
	ctx->hs_timeout_ms = opt->handshake_timeout_ms > 0 ? opt->handshake_timeout_ms : 30000;
	ctx->meta = opt->meta;
	if ((st = tp_skel_init(&ctx->sk, err)) != KHOR_SUCCESS) {
		free(ctx);
		return st;
	}
	ctx->incoming = calloc((size_t)opt->size, sizeof(tp_link *));
	ctx->outgoing = calloc((size_t)opt->size, sizeof(tp_link *));
	/* KHOR_SHM_CMA=1 (opt->shm_cma) reads messages over SHM_EAGER_MAX with
	 * process_vm_readv; by default everything takes the ring, which measured faster here
	 * (see the top comment). */
	ctx->cma_enabled = opt->shm_cma;
	if (ctx->secret == NULL || ctx->incoming == NULL || ctx->outgoing == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "shm transport: out of memory");
		goto fail_free;
	}
	if (!read_host_key(ctx->host_key, sizeof(ctx->host_key))) {
		int e = errno;
		st = kerr_set(
		    err, KHOR_ERR_SYSTEM,
		    "shm transport: cannot read "
		    "/proc/sys/kernel/random/boot_id or /proc/self/ns/net (%s), which tell "
		    "whether two ranks can share memory%s", shm_errstr(e),
		    e == ENOENT ? "; is /proc mounted?" : "");
		goto fail_free;
	}
	/*
	 * The listener lives in the abstract namespace: it has no file to clean up, vanishes
	 * when the process dies, and its name never collides with an earlier job's because of
	 * the random part.
	 */
	for (const char *q = opt->job_id; *q != '\0'; q++)
		job_hash = (job_hash ^ (uint8_t)*q) * 1099511628211ull;
	kauth_random(rnd, sizeof(rnd));
	snprintf(name, sizeof(name), "khor-shm.%016llx.%d.%d.%02x%02x%02x%02x%02x%02x%02x%02x",
	         (unsigned long long)job_hash, opt->rank, (int)getpid(), rnd[0], rnd[1], rnd[2],
	         rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path + 1, name, strlen(name));
	sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
	ctx->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ctx->listen_fd < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "shm transport: socket(AF_UNIX): %s",
		              shm_errstr(errno));
		goto fail_free;
	}
	if (bind(ctx->listen_fd, (struct sockaddr *)&sa, sl) < 0 ||
	    listen(ctx->listen_fd, 128) < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "shm transport: listening on @%s: %s", name,
		              shm_errstr(errno));
		goto fail_free;
	}
	snprintf(ctx->addr, sizeof(ctx->addr), "shm:%s:%s", ctx->host_key, name);
	KLOG_INFO("shm transport listening on @%s", name);
	*ctx_out = ctx;
	return KHOR_SUCCESS;

fail_free:
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	tp_skel_destroy(&ctx->sk);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx);
	return st;
}

static const char *shm_address(const tp_ctx *ctx)
{
	return ctx->addr;
}

static khor_status shm_connect_locked(tp_ctx *ctx, int peer, const char *peer_addr,
                                      tp_link **link_out, kerr *err)
{
	const char *key, *name;
	size_t key_len, name_len;
	tp_link *l;
	int fd;
	khor_status st;

	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "shm connect: bad peer rank %d", peer);
	if (ctx->outgoing[peer] != NULL) {
		*link_out = ctx->outgoing[peer];
		return KHOR_SUCCESS;
	}
	key = strncmp(peer_addr, "shm:", 4) == 0 ? peer_addr + 4 : NULL;
	name = key != NULL ? strchr(key, ':') : NULL;
	if (name == NULL || name[1] == '\0')
		return kerr_set(err, KHOR_ERR_PROTOCOL, "peer rank %d published a malformed shm "
		                "address '%.64s'", peer, peer_addr);
	key_len = (size_t)(name - key);
	name++;
	name_len = strlen(name);
	if (key_len != strlen(ctx->host_key) || memcmp(key, ctx->host_key, key_len) != 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "peer rank %d is on another host or in "
		                "another network namespace (boot id/netns %.*s, ours %s): shared "
		                "memory only links ranks that share both; use tcp for it", peer,
		                (int)(key_len < 64 ? key_len : 64), key, ctx->host_key);
	if (name_len + 2 > sizeof(((struct sockaddr_un *)0)->sun_path))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "peer rank %d published a malformed shm "
		                "address '%.64s'", peer, peer_addr);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "shm connect to peer rank %d: socket: %s", peer,
		                shm_errstr(errno));
	l = link_new(ctx, peer, 0, fd);
	if (l == NULL) {
		close(fd);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "shm connect: out of memory");
	}
	kstrlcpy(l->peer_addr, peer_addr, sizeof(l->peer_addr));
	l->peer_sa.sun_family = AF_UNIX;
	memcpy(l->peer_sa.sun_path + 1, name, name_len);
	l->peer_sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + name_len);
	st = shm_seg_create(l, err);
	if (st != KHOR_SUCCESS) {
		/* Leave a failed link behind so later calls see the same error. */
		shm_link_fail_text(l, st, err->text);
		l->state = LS_DEAD;
	} else {
		/* The CMA probe reads nonce_c where hs_hello_make puts it: in l->hello. */
		uint64_t aux[4] = { [SHM_AUX_RING_BYTES] = l->ring_bytes,
		                    [SHM_AUX_NONCE_ADDR] = (uint64_t)(uintptr_t)l->hello.nonce_c };
		hs_hello_make(&ctx->hs, peer, aux, &l->hello);
		l->state = LS_CONNECTING;
		shm_hs_step(l);
	}
	ctx->outgoing[peer] = l;
	*link_out = l;
	return KHOR_SUCCESS;
}

static khor_status shm_accept_locked(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err)
{
	tp_link *l;

	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "shm accept: bad peer rank %d", peer);
	l = ctx->incoming[peer];
	if (l != NULL) {
		l->claimed = true;
		*link_out = l;
	} else {
		*link_out = NULL;
	}
	return KHOR_SUCCESS;
}

static bool shm_link_ready_locked(const tp_link *l)
{
	return l->state == LS_READY && l->err.status == KHOR_SUCCESS;
}

static void shm_describe_locked(const tp_link *l, char *buf, size_t len)
{
	snprintf(buf, len, "pid %d, large messages by %s", (int)l->peer_pid,
	         l->cma_send ? "process_vm_readv" : "the ring");
}

static khor_status post(tp_link *l, uint8_t *buf, size_t len, tp_tag tag, bool is_send,
                        tp_req **req_out, kerr *err)
{
	tp_req *r;

	if (l->err.status != KHOR_SUCCESS) {
		*err = l->err;
		return l->err.status;
	}
	r = tp_skel_req_get(&l->ctx->sk, sizeof(*r));
	if (r == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "shm: out of memory for a request");
	memset(r, 0, sizeof(*r));
	r->link = l;
	r->buf = buf;
	r->len = len;
	r->tag = tag;
	r->is_send = is_send;
	l->nbusy++;
	l->pending++;
	if (is_send) {
		r->msg_id = l->next_msg_id++;
		r->cma = l->cma_send && len > SHM_EAGER_MAX;
		rl_push(&l->sendq, r);
	} else {
		rl_push(&l->posted, r);
		l->rescan = true;
		if (tag.comm != l->ctx->recv_comm || tag.seq != l->ctx->recv_seq) {
			/* The first receive of a call: records parked on other links are checked
			 * against it (rx_conflict) once. */
			l->ctx->recv_comm = tag.comm;
			l->ctx->recv_seq = tag.seq;
			FOR_EACH_LINK(o, l->ctx)
				o->rescan = true;
		}
	}
	/* Try at once: a small message usually goes out (or is found) without progress(). What
	 * moves may be another thread's, and that thread may be asleep. */
	if (link_drive(l))
		tp_skel_moved(&l->ctx->sk);
	*req_out = r;
	return KHOR_SUCCESS;
}

static khor_status shm_isend_locked(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                                    tp_req **req_out, kerr *err)
{
	(void)mr;
	return post(l, (uint8_t *)buf, len, tag, true, req_out, err);
}

static khor_status shm_irecv_locked(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                                    tp_req **req_out, kerr *err)
{
	(void)mr;
	return post(l, buf, len, tag, false, req_out, err);
}

static khor_status shm_test_locked(tp_req *r, bool *done_out, kerr *err)
{
	tp_link *l = r->link;

	if (r->finished) {
		*done_out = true;
		l->pending--;
		tp_skel_req_put(&l->ctx->sk, r);
		return KHOR_SUCCESS;
	}
	if (l->err.status != KHOR_SUCCESS) {
		*done_out = true;
		*err = l->err;
		req_finish(r);
		l->pending--;
		tp_skel_req_put(&l->ctx->sk, r);
		return l->err.status;
	}
	*done_out = false;
	return KHOR_SUCCESS;
}

static void shm_cancel_locked(tp_req *r)
{
	tp_link *l = r->link;

	if (!r->finished) {
		/* Part of it is in the ring, or the peer may be reading (or writing to us) this
		 * very buffer: the stream of this link cannot be trusted any more. */
		bool cut = r->is_send ? r->done > 0 || r->on == &l->cma_wait : r->on != &l->posted;
		if (cut)
			shm_link_fail(l, KHOR_ERR_INTERNAL,
			              "a transfer was abandoned mid-message after an "
			              "earlier error; the link is closed");
		req_finish(r);
	}
	l->pending--;
	tp_skel_req_put(&l->ctx->sk, r);
}

static khor_status shm_progress_locked(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err)
{
	bool moved, handshaking;
	uint64_t now;

	moved = drive_links(ctx);
	/*
	 * A spinning caller comes here millions of times a second: sweep the links (deadlines)
	 * and read the clock only every 32nd busy call, since both cost as much as a look at
	 * the rings.
	 */
	if ((++ctx->busy_calls & 31) != 0 && timeout_ms == 0 && !ctx->handshaking) {
		if (moved_out != NULL)
			*moved_out = moved;
		return KHOR_SUCCESS;
	}
	moved |= sweep(ctx, &handshaking);
	ctx->handshaking = handshaking;
	now = kclock_ns();
	if (moved || timeout_ms == 0) {
		/* Busy: look at the sockets (new connections, deaths) only now and then, so the
		 * fast path of a spinning caller stays free of system calls. */
		if (handshaking || now >= ctx->next_check_ns) {
			ctx->next_check_ns = now + SHM_CHECK_NS;
			if (poll_sockets(ctx, 0, false, NULL, err)) {
				moved = true;
				drive_links(ctx);
			}
		}
	} else {
		/* Nothing to do: sleep in poll() until a doorbell, a death, a connection or the
		 * timeout. The flag goes up before our last look at the rings (see notify_peer). */
		int wait_ms = timeout_ms;
		if (handshaking && wait_ms > (int)(SHM_RETRY_NS / 1000000))
			wait_ms = (int)(SHM_RETRY_NS / 1000000);
		if (tp_skel_sleep_begin(&ctx->sk, wait_ms)) {
			bool woke = false;
			set_sleeping(ctx, 1);
			moved = drive_links(ctx);
			moved |=
			    tp_skel_seen(&ctx->sk); /* a wake since our last look: don't sleep */
			if (!moved)
				moved = poll_sockets(ctx, wait_ms, true, &woke, err);
			ctx->next_check_ns = kclock_ns() + SHM_CHECK_NS;
			set_sleeping(ctx, 0);
			tp_skel_sleep_end(&ctx->sk, woke);
		}
		moved |= drive_links(ctx);
		moved |= sweep(ctx, &handshaking);
	}
	if (moved_out != NULL)
		*moved_out = moved;
	return KHOR_SUCCESS;
}

/* A lost connection, on command (transport.h: sever): the link fails as on any error here
 * (shm_fail.c: the segment's broken flag with why, then the socket's shutdown). */
static void shm_sever_locked(tp_link *l, const char *why)
{
	shm_link_fail_text(l, KHOR_ERR_SYSTEM, why);
}

/* ---- the ops: the skeleton's lock around the _locked bodies above ------------------- */

TP_SKEL_LOCKED_OPS(shm)

static khor_status shm_progress(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err)
{
	tp_skel *sk = &ctx->sk;
	bool moved = false, mine = false;

	if (!tp_skel_progress_begin(sk, timeout_ms, moved_out))
		return KHOR_SUCCESS;
	/* Another thread may have finished our transfers since we last looked: no sleep. */
	if (tp_skel_seen(sk)) {
		timeout_ms = 0;
		moved = true;
	}
	khor_status st = shm_progress_locked(ctx, timeout_ms, &mine, err);
	/* What we moved may be what a thread asleep (in poll() or on the cv) waits for. */
	tp_skel_progress_end(sk, moved || mine, moved_out);
	return st;
}

static void shm_destroy(tp_ctx *ctx)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->all)
		link_free(LINK(n));
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	free(ctx->busy.pfds);
	free(ctx->busy.plinks);
	free(ctx->sleep.pfds);
	free(ctx->sleep.plinks);
	tp_skel_destroy(&ctx->sk);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx);
}

const struct transport_ops shm_transport_ops = {
	.name = "shm",
	.version = TP_VERSION,
	.create = shm_create,
	.address = shm_address,
	.caps = tp_skel_caps_plain, /* CMA and memcpy take any mapped host memory */
	.connect = shm_connect,
	.accept = shm_accept,
	.link_ready = shm_link_ready,
	.describe = shm_describe,
	.reg_mr = NULL, /* caps.needs_reg is false */
	.dereg_mr = NULL,
	.mr_key = NULL,
	.isend = shm_isend,
	.irecv = shm_irecv,
	.flush = NULL,
	.test = shm_test,
	.progress = shm_progress,
	.cancel = shm_cancel,
	.link_error = shm_link_error,
	.wake = tp_skel_wake,
	.sever = shm_sever,
	.destroy = shm_destroy,
};
