/*
 * ctl.c -- the cycle's messages on a set's control comm (a private split of its comm): each
 * is a 256-byte header (ctl.h: msg_hdr) carrying up to 240 bytes of payload; a longer payload
 * follows as a second frame (step + 1) of the length the header gives. Waits here drive the
 * transports themselves, sleep when idle, and wake on an enqueue (the set's woken flag).
 */
#include "ctl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A wait of the negotiation passed dl: it goes on (a later *dl) while the peers it waits
 * for are alive (coll_wait_alive); else the error, or "timed out" for the caller to say
 * what was late.
 */
static khor_status alive_or_timeout(eset *s, coll_xfer *xs, int nxs, uint64_t t0, bool quiet,
                                    kdeadline *dl, kerr *err)
{
	char what[64];
	size_t k;

	k = (size_t)snprintf(what, sizeof(what), "engine set %d, negotiation cycle %u", s->id,
	                     s->cycle);
	khor_status st = quiet ? coll_wait_alive_quiet(&s->ctl->cc, what, xs, nxs, t0, dl, err)
	                       : coll_wait_alive(&s->ctl->cc, what, xs, nxs, t0, dl, err);
	if (st == KHOR_ERR_TIMEOUT)
		return kerr_set(err, KHOR_ERR_TIMEOUT, "timed out");
	/* The callers name the set and cycle themselves. */
	if (st != KHOR_SUCCESS && strncmp(err->text, what, k) == 0 && err->text[k] == ':')
		memmove(err->text, err->text + k + 2, strlen(err->text + k + 2) + 1);
	return st;
}

/*
 * A waiting caller that runs the cycle (engine.c) spins this long before it yields the
 * core: it is the application thread itself, and a yield then mostly hands the core to
 * the set thread woken by the caller's own traffic (measured: a lone 8-byte allreduce
 * 3.1 us instead of 18-28 us at n = 2 over shm; docs/PERFORMANCE.md section 27). A
 * longer wait yields, for the application's other threads (a backward pass that enqueues
 * the next gradients).
 */
#define CALLER_YIELD_NS 20000u

khor_status ctl_wait(eset *s, coll_xfer *xs, int nxs, bool wake_ok, kdeadline dl,
                     bool spin, int idle_ms, ctl_yield *y, int *which, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	uint64_t t0 = kclock_ns(), last_abort = t0;
	unsigned mask = 0;

	for (int i = 0; i < nxs; i++)
		if (xs[i].req != NULL)
			mask |= 1u << xs[i].tpi;
	if (mask == 0)
		mask = (1u << cc->ntps) - 1;
	for (;;) {
		for (int i = 0; i < nxs; i++) {
			khor_status st = KHOR_SUCCESS;
			if (xs[i].req != NULL && coll_done(cc, &xs[i], &st, err)) {
				*which = i;
				return st;
			}
		}
		if (wake_ok && atomic_exchange(&s->woken, false)) {
			*which = -1;
			return KHOR_SUCCESS;
		}
		uint64_t now = kclock_ns();
		if (kdeadline_passed(dl)) {
			khor_status st = alive_or_timeout(s, xs, nxs, t0, false, &dl, err);
			if (st != KHOR_SUCCESS)
				return st;
		}
		if (idle_ms > 0 && now - t0 > (uint64_t)idle_ms * 1000000ull) {
			*which = -2; /* the caller's timer */
			return KHOR_SUCCESS;
		}
		if (dl.at_ns != UINT64_MAX && now - last_abort > 1000000000ull) {
			last_abort = now;
			khor_status st = cc->check_abort(cc->owner, err);
			if (st != KHOR_SUCCESS)
				return st;
		}
		bool fast = spin && now - t0 < cc->spin_ns;
		/* Sleep in slices, never past the caller's timer or deadline. */
		int t = fast ? 0 : kdeadline_left_ms(dl, 200);
		if (!fast && idle_ms > 0) {
			int64_t left = (int64_t)idle_ms - (int64_t)((now - t0) / 1000000ull);
			if (left < t)
				t = left < 1 ? 1 : (int)left;
		}
		if (!fast && y != NULL) {
			y->ms = t;
			y->mask = mask;
			*which = -3;
			return KHOR_SUCCESS;
		}
		khor_status st = coll_progress(cc, t, mask, NULL, err);
		if (st != KHOR_SUCCESS)
			return st;
		/*
		 * The application's threads share the cores with this one: a spinning engine
		 * thread that never yields keeps them off the CPU until the scheduler's tick
		 * (measured: 4 ms per lone allreduce instead of 0.2 ms on 2 cores, 2 ranks).
		 */
		if (fast && (!s->caller || now - t0 > CALLER_YIELD_NS))
			sched_yield();
	}
}

void ctl_sleep(eset *s, const ctl_yield *y)
{
	const coll_comm *cc = &s->ctl->cc; /* tps and ntps only: fixed for the comm's life */
	int n = 0;

	for (int i = 0; i < cc->ntps; i++)
		n += (y->mask >> i) & 1u;
	for (int i = 0; i < cc->ntps; i++) {
		if (!(y->mask & (1u << i)))
			continue;
		/* Several transports: a 1 ms slice each, as coll_progress sleeps. Their errors
		 * come back at the next turn's own progress: a broken instance stays broken. */
		int t = n == 1 || y->ms < 1 ? y->ms : 1;
		bool moved = false;
		kerr ignore;
		if (cc->tps[i].ops->progress(cc->tps[i].ctx, t, &moved, &ignore) != KHOR_SUCCESS ||
		    moved)
			return;
	}
}

khor_status ctl_look(eset *s, coll_xfer *xs, int nxs, uint64_t t0, kdeadline *next, kerr *err)
{
	if (!kdeadline_passed(*next))
		return KHOR_SUCCESS;
	khor_status st = alive_or_timeout(s, xs, nxs, t0, true, next, err);
	if (st == KHOR_ERR_TIMEOUT) {
		/* Nothing to judge by (no heartbeats): the wait stays as it was, open-ended. */
		*next = kdeadline_in_ms(-1);
		return KHOR_SUCCESS;
	}
	return st;
}

tp_tag ctl_tag(const eset *s, uint32_t step)
{
	tp_tag t = { s->ctl->cc.comm_id, s->cycle, step, coll_meta_make(COLL_NEGOTIATE, 0, 0) };
	return t;
}

/* Sends a header (+ payload frame) to peer; the transfers go into xs[0..1]. */
khor_status ctl_send(eset *s, int peer, uint8_t type, uint32_t step, const bbuf *pl,
                     msg_hdr *hdr, coll_xfer *xs, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	khor_status st;

	memset(hdr, 0, sizeof(*hdr));
	hdr->magic = MSG_MAGIC;
	hdr->type = type;
	hdr->cycle = s->cycle;
	hdr->len = pl != NULL ? (uint32_t)pl->len : 0;
	if (hdr->len <= MSG_INLINE && hdr->len > 0)
		memcpy(hdr->data, pl->p, hdr->len);
	xs[0].req = xs[1].req = NULL;
	st = coll_post(cc, &xs[0], peer, true, hdr, sizeof(*hdr), ctl_tag(s, step), dl, err);
	if (st == KHOR_SUCCESS && hdr->len > MSG_INLINE)
		st = coll_post(cc, &xs[1], peer, true, pl->p, pl->len, ctl_tag(s, step + 1), dl, err);
	return st;
}

/* Waits for sends to finish (bounded). */
khor_status ctl_flush(eset *s, coll_xfer *xs, int nxs, kerr *err)
{
	kdeadline dl = kdeadline_in_ms(s->ctl->cc.timeout_ms);
	int which;

	for (;;) {
		bool left = false;
		for (int i = 0; i < nxs; i++)
			left |= xs[i].req != NULL;
		if (!left)
			return KHOR_SUCCESS;
		khor_status st = ctl_wait(s, xs, nxs, false, dl, true, 0, NULL, &which, err);
		if (st != KHOR_SUCCESS)
			return st;
	}
}

void ctl_drain(eset *s, coll_xfer *xs, int nxs)
{
	coll_drain(&s->ctl->cc, xs, nxs);
}

/* Receives the payload that follows hdr (when it did not fit), into *out (malloc'd). */
khor_status ctl_payload(eset *s, int peer, const msg_hdr *hdr, uint32_t step,
                        uint8_t **out, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	uint8_t *p = malloc(hdr->len + 1u);
	coll_xfer x = { 0 };
	khor_status st;
	int which;

	if (p == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
	if (hdr->len <= MSG_INLINE) {
		memcpy(p, hdr->data, hdr->len);
		*out = p;
		return KHOR_SUCCESS;
	}
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	st = coll_post(cc, &x, peer, false, p, hdr->len, ctl_tag(s, step + 1), dl, err);
	if (st == KHOR_SUCCESS)
		st = ctl_wait(s, &x, 1, false, dl, true, 0, NULL, &which, err);
	if (st != KHOR_SUCCESS) {
		ctl_drain(s, &x, 1);
		free(p);
		return st;
	}
	*out = p;
	return KHOR_SUCCESS;
}

khor_status ctl_check_hdr(const eset *s, const msg_hdr *h, int peer, kerr *err)
{
	if (h->magic != MSG_MAGIC || h->cycle != s->cycle || h->type < M_REQ || h->type > M_ABORT)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed message "
		                "from rank %d (type %u, cycle %u)", s->cycle, peer, h->type, h->cycle);
	if (h->len > MSG_MAX)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: rank %d announces a "
		                "%u-byte message (at most %u)", s->cycle, peer, h->len, MSG_MAX);
	return KHOR_SUCCESS;
}

/* Tells every worker the set failed (best effort: a short wait, then give up). */
void ctl_abort(eset *s, const bool *go_sent, const kerr *cause)
{
	coll_comm *cc = &s->ctl->cc;
	int nw = s->size - 1;
	msg_hdr *h = calloc((size_t)nw, sizeof(*h));
	coll_xfer *xs = calloc((size_t)nw, sizeof(*xs));
	kerr err;

	if (h == NULL || xs == NULL) {
		free(h);
		free(xs);
		return;
	}
	for (int w = 1; w < s->size; w++) {
		msg_hdr *m = &h[w - 1];
		m->magic = MSG_MAGIC;
		m->type = M_ABORT;
		m->cycle = s->cycle;
		size_t l = strlen(cause->text);
		m->len = (uint32_t)(l < MSG_INLINE ? l : MSG_INLINE);
		memcpy(m->data, cause->text, m->len);
		if (coll_post(cc, &xs[w - 1], w, true, m, sizeof(*m),
		              ctl_tag(s, go_sent != NULL && go_sent[w] ? 2 : 0), kdeadline_in_ms(100),
		              &err) != KHOR_SUCCESS)
			xs[w - 1].req = NULL;
	}
	kdeadline dl = kdeadline_in_ms(200);
	for (;;) {
		bool left = false;
		for (int i = 0; i < nw; i++) {
			khor_status st = KHOR_SUCCESS;
			if (xs[i].req != NULL && !coll_done(cc, &xs[i], &st, &err))
				left = true;
		}
		if (!left || kdeadline_passed(dl))
			break;
		coll_progress(cc, 1, (1u << cc->ntps) - 1, NULL, &err);
	}
	coll_drain(cc, xs, nw);
	free(h);
	free(xs);
}
