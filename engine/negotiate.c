/*
 * negotiate.c -- one cycle of a process set's negotiation: which tensors are ready on every
 * member, in which order they run, and which fail (mismatch, stall, join, stop).
 *
 * The coordinator is the set's rank 0. A cycle k is started by whoever has news: a worker
 * with new tensors sends its report (REQ) at once; the coordinator, once it has news of its
 * own or a report, asks the workers that have not reported yet (GO), collects every report,
 * and answers each worker with the cycle's responses (RESP). Every rank then runs the
 * same responses in the same order, which keeps the response cache and the fusion plan
 * identical everywhere. Messages per cycle, worker w and coordinator c:
 *
 *   w has news:   w --REQ(k)--> c          c --RESP(k), step 0--> w
 *   w had none:   c --GO(k), step 0--> w   w --REQ(k)--> c   c --RESP(k), step 2--> w
 *
 * A worker learns from the first message of the cycle (step 0) whether the RESP is that
 * message or comes later (step 2), so no receive is ever left posted for a message that
 * will not come. Each message is a 256-byte header carrying up to 240 bytes of payload; a
 * longer payload follows as a second frame (step + 1) of the length the header gives.
 * Between cycles nobody sends anything: an idle set sleeps in the transport, and an enqueue
 * wakes it (transport wake).
 *
 * The cycle hands its response back, read into items (response.c), and the set's loop runs
 * them (engine.c -> execute.c): negotiation never executes anything itself. The pieces it
 * uses: ctl.c (messages), report.c (this rank's news), table.c (the coordinator's record of
 * every report), coordinator.c (its answer), response_cache.c (why steady state is small).
 */
#include "negotiate.h"

#include "autotune.h"
#include "bbuf.h"
#include "coordinator.h"
#include "ctl.h"
#include "queue.h"
#include "report.h"
#include "response.h"
#include "table.h"
#include "timeline.h"

#include <stdlib.h>
#include <string.h>

static void fail_with(eset *s, khor_status st, kerr *err, const char *what)
{
	kerr e2;

	if (err->status == KHOR_SUCCESS)
		kerr_set(err, st, "failed");
	kerr_set(&e2, err->status, "rank %d on %s, engine set %d, negotiation cycle %u: %s: %s",
	         s->ctl->ctx->rank, s->ctl->ctx->cfg.hostname, s->id, s->cycle, what, err->text);
	queue_fail_set(s, &e2);
}

/* Builds this rank's report into b and sends it to the coordinator (xs: its transfers). */
static khor_status send_report(eset *s, bbuf *b, msg_hdr *hdr, coll_xfer *xs, kerr *err)
{
	b->len = 0;
	b->oom = false;
	report_build(s, b);
	if (b->oom)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory");
	return ctl_send(s, 0, M_REQ, 0, b, hdr, xs, err);
}

/* The coordinator's ABORT: its cause, as this rank's error. */
static void coordinator_failed(const msg_hdr *in, kerr *err)
{
	kerr_set(err, KHOR_ERR_REMOTE, "the coordinator (rank 0) failed: %.*s",
	         (int)(in->len < MSG_INLINE ? in->len : MSG_INLINE), (const char *)in->data);
}

/*
 * This rank asked to stop KHOR_TIMEOUT ago and the set's stop has not come: the error names
 * the ranks that have not asked (the coordinator's count; a worker's from the 'Q' records).
 */
static khor_status stop_late(eset *s, kerr *err)
{
	bbuf m = { 0 };
	int *late = malloc(sizeof(int) * (size_t)s->size), nl = 0;

	pthread_mutex_lock(&s->e->mu);
	for (int r = 0; late != NULL && r < s->size; r++)
		if (r != s->rank && !(s->rank == 0 ? s->stop_r[r] : s->peer_stop[r]))
			late[nl++] = r;
	pthread_mutex_unlock(&s->e->mu);
	bbuf_printf(&m, "%s ", nl > 1 ? "ranks" : "rank");
	bbuf_rank_list(&m, late, nl);
	bput_u8(&m, 0);
	if (nl == 0)
		kerr_set(err, KHOR_ERR_TIMEOUT, "every rank asked to stop, but the stop did not "
		         "complete within KHOR_TIMEOUT (%lld ms) of this rank's khor_engine_stop: a "
		         "rank's engine failed or hangs (see the others' logs)",
		         (long long)s->ctl->cc.timeout_ms);
	else
		kerr_set(err, KHOR_ERR_TIMEOUT, "%s never joined the stop: %s not call %s within "
		         "KHOR_TIMEOUT (%lld ms) of this rank",
		         m.p != NULL ? (const char *)m.p : "?", nl > 1 ? "they did" : "it did",
		         s->id == 0 ? "khor_engine_stop" : "khor_engine_stop or remove the process set",
		         (long long)s->ctl->cc.timeout_ms);
	free(m.p);
	free(late);
	return KHOR_ERR_TIMEOUT;
}

/*
 * Whether this rank has asked to stop, so that the stop's deadline bounds the wait: from
 * the request on, also in a cycle whose report went out before it (that cycle's answer may
 * never come from a peer that hangs).
 */
static bool stopping(eset *s)
{
	bool asked;

	if (s->stop_sent)
		return true;
	pthread_mutex_lock(&s->e->mu);
	asked = s->stop;
	pthread_mutex_unlock(&s->e->mu);
	return asked;
}

/*
 * A turn's idle wait, kept in the set (s->idle) from one turn to the next, whoever holds the
 * baton: the receives of the cycle's first messages stay posted while the set thread
 * sleeps with the baton let go, or while a waiting caller runs the turn instead.
 */
typedef struct nidle {
	bool posted;      /* the receives below are posted for cycle s->cycle */
	msg_hdr *in;      /* worker: in[0], the coordinator's first message; coordinator:
	                   * in[w], worker w's report */
	coll_xfer *rx;    /* worker: rx[0]; coordinator: rx[w - 1] */
	bool *got;        /* coordinator: got[w], worker w's report is in */
	int ngot;
	kdeadline look;   /* coordinator: when to judge the ranks missing from its table */
	/* The rest of a cycle's buffers, kept for the next (no allocation per cycle once they
	 * have grown): the coordinator's per worker, and every rank's report and response. */
	msg_hdr *out, *go;
	coll_xfer *tx;    /* coordinator: per worker, its GO, then its RESP (header, payload) */
	bool *go_sent;
	uint8_t **payload;
	bbuf rep, resp;   /* this rank's report; the coordinator's response */
} nidle;

static void idle_free(nidle *id)
{
	if (id == NULL)
		return;
	free(id->in);
	free(id->rx);
	free(id->got);
	free(id->out);
	free(id->go);
	free(id->tx);
	free(id->go_sent);
	free(id->payload);
	free(id->rep.p);
	free(id->resp.p);
	free(id);
}

void negotiate_release(eset *s)
{
	if (s->idle == NULL)
		return;
	if (s->idle->posted)
		coll_drain(&s->ctl->cc, s->idle->rx, s->rank == 0 ? s->size - 1 : 1);
	idle_free(s->idle);
	s->idle = NULL;
}

/* How often a worker waiting for the coordinator's answer looks for a stop request (that
 * wait has no deadline of its own: the coordinator answers when there is news). */
#define STOP_LOOK_MS 500

static int worker_turn(eset *s, ctl_yield *y, eresp *resp_out)
{
	msg_hdr out;
	coll_xfer tx[2] = { { 0 }, { 0 } };
	bool sent = false, ok = false;
	uint8_t *payload = NULL;
	khor_status st;
	kerr err;
	int which;
	uint64_t t_neg = 0;
	coll_comm *cc = &s->ctl->cc;
	kdeadline never = kdeadline_in_ms(-1);
	nidle *id = s->idle;
	msg_hdr *in = &id->in[0];
	coll_xfer *rx = &id->rx[0];
	bbuf *rep = &id->rep; /* send_report empties it */

	kerr_clear(&err);
	if (!id->posted) {
		st = coll_post(cc, rx, 0, false, in, sizeof(*in), ctl_tag(s, 0),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		if (st != KHOR_SUCCESS) {
			fail_with(s, st, &err, "waiting for the coordinator (rank 0)");
			return NEG_END;
		}
		id->posted = true;
	}
	/* Until the coordinator speaks: report news as soon as there is some. */
	/* A waiting caller spins here; the set thread spins between turns, the baton let go
	 * (engine.c), so that a caller can take it meanwhile. */
	bool spin = y == NULL || s->caller;
	kdeadline look = never; /* when to judge the coordinator, once this rank has asked */
	for (;;) {
		if (!sent && report_has_news(s)) {
			if ((st = send_report(s, rep, &out, tx, &err)) != KHOR_SUCCESS)
				goto fail;
			sent = true;
			t_neg = kclock_ns();
			look = kdeadline_in_ms(cc->timeout_ms);
		}
		/*
		 * Once this rank has asked to stop, the others have KHOR_TIMEOUT to do the same:
		 * a hard deadline, checked here by the clock (idle_ms) because ctl_wait's own
		 * waits on while the peers are alive, and they are: they just never stop.
		 */
		int idle = sent ? STOP_LOOK_MS : 0;
		bool stop = stopping(s);
		if (stop) {
			if (kdeadline_passed(s->stop_dl)) {
				st = stop_late(s, &err);
				goto fail;
			}
			idle = kdeadline_left_ms(s->stop_dl, 1000) + 1;
		}
		/* Only an idle wait yields: once the report is out, the turn sees its cycle to
		 * the end. */
		st = ctl_wait(s, rx, 1, !sent, stop ? s->stop_dl : never, spin, idle,
		              sent || stop ? NULL : y, &which, &err);
		if (st == KHOR_ERR_TIMEOUT)
			st = stop_late(s, &err);
		if (st == KHOR_SUCCESS && which != 0 && sent)
			st = ctl_look(s, rx, 1, t_neg, &look, &err);
		if (st != KHOR_SUCCESS)
			goto fail;
		if (which == -3)
			return NEG_IDLE; /* the receives stay posted for the next turn */
		spin = false;
		if (which == 0)
			break;
	}
	id->posted = false; /* its message came: the rest of the cycle is this turn's */
	if ((st = ctl_check_hdr(s, in, 0, &err)) != KHOR_SUCCESS)
		goto fail;
	if (t_neg == 0)
		t_neg = kclock_ns();
	if (in->type == M_ABORT)
		goto aborted;
	uint32_t step = 0;
	if (in->type == M_GO) {
		if (!sent) {
			if ((st = send_report(s, rep, &out, tx, &err)) != KHOR_SUCCESS)
				goto fail;
			sent = true;
		}
		step = 2;
		st = coll_post(cc, rx, 0, false, in, sizeof(*in), ctl_tag(s, 2),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		/* The answer to a GO: the stop's deadline bounds this wait too, by the clock. */
		kdeadline dl = kdeadline_in_ms(cc->timeout_ms * 2 + 5000);
		while (st == KHOR_SUCCESS) {
			/* Past dl the wait is liveness's own (it warns and measures from its
			 * start): no more turns of this loop then, unless stopping. */
			int idle = kdeadline_passed(dl) ? 0 : STOP_LOOK_MS;
			if (stopping(s)) {
				if (kdeadline_passed(s->stop_dl)) {
					st = stop_late(s, &err);
					break;
				}
				idle = kdeadline_left_ms(s->stop_dl, 1000) + 1;
			}
			st = ctl_wait(s, rx, 1, false, dl, true, idle, NULL, &which, &err);
			if (st == KHOR_SUCCESS && which == 0)
				break;
		}
		if (st != KHOR_SUCCESS)
			goto fail;
		if ((st = ctl_check_hdr(s, in, 0, &err)) != KHOR_SUCCESS)
			goto fail;
		if (in->type == M_ABORT)
			goto aborted;
	}
	if (in->type != M_RESP) {
		st = kerr_set(&err, KHOR_ERR_PROTOCOL, "expected a response from rank 0, got type %u",
		              in->type);
		goto fail;
	}
	if ((st = ctl_payload(s, 0, in, step, &payload, &err)) != KHOR_SUCCESS)
		goto fail;
	if ((st = ctl_flush(s, tx, 2, &err)) != KHOR_SUCCESS)
		goto fail;
	s->negotiate_ns += kclock_ns() - t_neg;
	ok = response_parse(s, payload, in->len, resp_out);
	free(payload);
	s->cycle++;
	return ok ? NEG_RAN : NEG_END;
aborted:
	/* The coordinator's cause, as it is: it already names rank, host and cycle. */
	coordinator_failed(in, &err);
	ctl_drain(s, tx, 2);
	queue_fail_set(s, &err);
	return NEG_END;
fail:
	ctl_drain(s, rx, 1);
	id->posted = false;
	ctl_drain(s, tx, 2);
	free(payload);
	fail_with(s, st, &err, "talking to the coordinator (rank 0)");
	return NEG_END;
}

/*
 * The coordinator idles while tensors wait for ranks that have not submitted them: a real
 * wait for those ranks, with no deadline of its own (a rank may compute for as long as it
 * likes). Once *next passed, it judges them quietly, as a worker judges the coordinator
 * (ctl_look): its wait is published, so that a missing rank that waits for this one in
 * turn finds the deadlock (a collective of this set that this rank finished and that one
 * cannot: a lost frame), and a dead one fails it. rx: the posted receives, one per worker.
 */
static khor_status look_at_missing(eset *s, coll_xfer *rx, kdeadline *next, kerr *err)
{
	if (!kdeadline_passed(*next))
		return KHOR_SUCCESS;
	const centry *c = KLIST_ENTRY(s->arrivals.next, centry, link);
	int *miss = malloc(sizeof(int) * (size_t)s->size);
	coll_xfer *sub = malloc(sizeof(coll_xfer) * (size_t)s->size);
	int nm, nsub = 0;
	khor_status st = KHOR_SUCCESS;

	if (miss != NULL && sub != NULL) {
		nm = table_missing(s, c, miss);
		for (int i = 0; i < nm; i++)
			if (miss[i] > 0 && rx[miss[i] - 1].req != NULL)
				sub[nsub++] = rx[miss[i] - 1];
	}
	if (nsub > 0)
		st = ctl_look(s, sub, nsub, c->first_ns, next, err);
	else
		*next = kdeadline_in_ms(s->ctl->cc.timeout_ms);
	free(miss);
	free(sub);
	return st;
}

static int coord_turn(eset *s, ctl_yield *y, eresp *resp_out)
{
	struct khor_engine *e = s->e;
	coll_comm *cc = &s->ctl->cc;
	int n = s->size, nw = n - 1;
	nidle *id = s->idle;
	msg_hdr *in = id->in;
	coll_xfer *rx = id->rx;
	bool *got = id->got;
	msg_hdr *out = id->out, *go = id->go;
	coll_xfer *tx = id->tx;
	bool *go_sent = id->go_sent;
	uint8_t **payload = id->payload;
	bbuf *mine = &id->rep, *resp = &id->resp;
	khor_status st = KHOR_SUCCESS;
	kerr err;
	int which;
	bool ok = false;
	kdeadline never = kdeadline_in_ms(-1);
	const char *doing = "waiting for reports";

	kerr_clear(&err);
	if (!id->posted) {
		memset(got, 0, sizeof(bool) * (size_t)n);
		memset(go_sent, 0, sizeof(bool) * (size_t)n); /* ctl_abort reads it from here on */
		id->ngot = 0;
		id->look = kdeadline_in_ms(cc->timeout_ms); /* when to judge the missing ranks */
		for (int w = 1; w < n; w++) {
			st = coll_post(cc, &rx[w - 1], w, false, &in[w], sizeof(in[w]), ctl_tag(s, 0),
			               kdeadline_in_ms(cc->timeout_ms), &err);
			if (st != KHOR_SUCCESS)
				goto fail;
		}
		id->posted = true;
	}
	/* Idle until there is news: ours, a worker's report, or a stall to look at. */
	/* A waiting caller spins here; the set thread spins between turns, the baton let go
	 * (engine.c), so that a caller can take it meanwhile. */
	bool spin = y == NULL || s->caller;
	for (;;) {
		if (report_has_news(s) || id->ngot > 0)
			break;
		/* A stall check is due: a cycle of its own, so that shutdowns go out (by the
		 * clock: a turn's wait starts anew each time, its idle timer with it). */
		if (!klist_empty(&s->arrivals) && e->s.stall_check_s > 0 &&
		    kclock_ns() >= s->next_stall_check_ns)
			break;
		int idle = 0;
		if (!klist_empty(&s->arrivals) && e->s.stall_check_s > 0) {
			int64_t left = (int64_t)(s->next_stall_check_ns - kclock_ns()) / 1000000;
			idle = left < 1 ? 1 : left > 1000 ? 1000 : (int)left;
		}
		if (!klist_empty(&s->arrivals)) {
			if ((st = look_at_missing(s, rx, &id->look, &err)) != KHOR_SUCCESS)
				goto fail;
			int left = kdeadline_left_ms(id->look, 1000) + 1;
			if (idle == 0 || left < idle)
				idle = left;
		}
		/* The stop's hard deadline, by the clock (see the worker's loop). */
		bool stop = stopping(s);
		if (stop) {
			if (kdeadline_passed(s->stop_dl)) {
				st = stop_late(s, &err);
				goto fail;
			}
			int left = kdeadline_left_ms(s->stop_dl, 1000) + 1;
			if (idle == 0 || left < idle)
				idle = left;
		}
		st = ctl_wait(s, rx, nw, true, stop ? s->stop_dl : never, spin, idle,
		              stop ? NULL : y, &which, &err);
		spin = false;
		if (st == KHOR_ERR_TIMEOUT)
			st = stop_late(s, &err);
		if (st != KHOR_SUCCESS) {
			doing = "waiting for reports";
			goto fail;
		}
		if (which == -3)
			return NEG_IDLE; /* the receives stay posted for the next turn */
		if (which == -2 && stop && kdeadline_passed(s->stop_dl))
			continue; /* the check above fails the stop */
		if (which >= 0) {
			got[which + 1] = true;
			id->ngot++;
		} else if (which == -2 && !klist_empty(&s->arrivals)) {
			/* A stall check is due: a cycle of its own, so that shutdowns go out. */
			if (kclock_ns() >= s->next_stall_check_ns)
				break;
		}
	}
	/* The rest of the cycle is this turn's. */
	int ngot = id->ngot;
	id->posted = false;
	memset(tx, 0, sizeof(*tx) * 3 * (size_t)n);
	mine->len = resp->len = 0;
	mine->oom = resp->oom = false;
	/* KHOR_CYCLE_TIME: at most one cycle per period; what arrives meanwhile joins it. */
	uint64_t cyc_ns = atomic_load(&e->cycle_us) * 1000ull;
	if (cyc_ns > 0) {
		uint64_t start_at = s->last_cycle_ns + cyc_ns;
		while (kclock_ns() < start_at) {
			int ms = (int)((start_at - kclock_ns()) / 1000000) + 1;
			st = ctl_wait(s, rx, nw, false, never, false, ms, NULL, &which, &err);
			if (st != KHOR_SUCCESS)
				goto fail;
			if (which >= 0) {
				got[which + 1] = true;
				ngot++;
			}
		}
	}
	uint64_t t_neg = kclock_ns();
	s->last_cycle_ns = t_neg;
	if (timeline_on(e) && e->s.mark_cycles)
		timeline_cycle(e, s->id, s->cycle, t_neg);
	/* Ask the workers that have not reported. */
	doing = "asking for reports";
	for (int w = 1; w < n; w++) {
		if (got[w])
			continue;
		memset(&go[w], 0, sizeof(go[w]));
		go[w].magic = MSG_MAGIC;
		go[w].type = M_GO;
		go[w].cycle = s->cycle;
		st = coll_post(cc, &tx[3 * w], w, true, &go[w], sizeof(go[w]), ctl_tag(s, 0),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		if (st != KHOR_SUCCESS)
			goto fail;
		go_sent[w] = true;
	}
	/* Our own report goes through the same merge as theirs. */
	report_build(s, mine);
	if (mine->oom) {
		st = kerr_set(&err, KHOR_ERR_NO_MEMORY, "out of memory");
		goto fail;
	}
	if ((st = table_merge(s, 0, mine->p, mine->len, &err)) != KHOR_SUCCESS)
		goto fail;
	doing = "collecting reports";
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	while (ngot < nw) {
		/* A worker that hangs (stopped, busy) while this rank stops: the stop's deadline
		 * holds here too, alive or not. */
		int idle = 0;
		if (stopping(s)) {
			if (kdeadline_passed(s->stop_dl)) {
				st = stop_late(s, &err);
				goto fail;
			}
			idle = kdeadline_left_ms(s->stop_dl, 1000) + 1;
		}
		st = ctl_wait(s, rx, nw, false, dl, true, idle, NULL, &which, &err);
		if (st == KHOR_SUCCESS && which == -2)
			continue;
		if (st == KHOR_ERR_TIMEOUT) {
			int *late = malloc(sizeof(int) * (size_t)n), nl = 0;
			bbuf m = { 0 };
			for (int w = 1; late != NULL && w < n; w++)
				if (!got[w])
					late[nl++] = w;
			bbuf_printf(&m, "%s ", nl > 1 ? "ranks" : "rank");
			bbuf_rank_list(&m, late, nl);
			bput_u8(&m, 0);
			kerr_set(&err, KHOR_ERR_TIMEOUT, "%s did not report within KHOR_TIMEOUT "
			         "(%lld ms); the coordinator asked every rank at the cycle's start",
			         m.p != NULL ? (const char *)m.p : "some ranks", (long long)cc->timeout_ms);
			free(m.p);
			free(late);
			goto fail;
		}
		if (st != KHOR_SUCCESS)
			goto fail;
		got[which + 1] = true;
		ngot++;
	}
	for (int w = 1; w < n; w++) {
		if ((st = ctl_check_hdr(s, &in[w], w, &err)) != KHOR_SUCCESS)
			goto fail;
		if (in[w].type != M_REQ) {
			st = kerr_set(&err, KHOR_ERR_PROTOCOL, "rank %d sent message type %u, not a "
			              "report", w, in[w].type);
			goto fail;
		}
		if ((st = ctl_payload(s, w, &in[w], 0, &payload[w], &err)) != KHOR_SUCCESS)
			goto fail;
		if ((st = table_merge(s, w, payload[w], in[w].len, &err)) != KHOR_SUCCESS)
			goto fail;
	}
	/* Autotune's agreed values ride on the response. */
	if (e->at != NULL && s->id == 0 && s->cycles > 0) {
		uint64_t fb;
		double cm;
		if (autotune_cycle(e->at, s->bytes_done, &fb, &cm)) {
			bput_u8(resp, 'T');
			bput_u64(resp, fb);
			bput_u64(resp, (uint64_t)(cm * 1000.0));
		}
	}
	doing = "answering";
	if ((st = coordinator_respond(s, resp, &err)) != KHOR_SUCCESS)
		goto fail;
	for (int w = 1; w < n; w++) {
		st = ctl_send(s, w, M_RESP, go_sent[w] ? 2 : 0, resp, &out[w], &tx[3 * w + 1], &err);
		if (st != KHOR_SUCCESS)
			goto fail;
	}
	if ((st = ctl_flush(s, tx, 3 * n, &err)) != KHOR_SUCCESS)
		goto fail;
	s->negotiate_ns += kclock_ns() - t_neg;
	ok = response_parse(s, resp->p, resp->len, resp_out);
	s->cycle++;
	goto out;
fail:
	coll_drain(cc, rx, nw);
	id->posted = false;
	coll_drain(cc, tx, 3 * n);
	{
		kerr e2;
		kerr_set(&e2, err.status != KHOR_SUCCESS ? err.status : st,
		         "rank %d on %s, engine set %d, negotiation cycle %u (coordinator), %s: %s",
		         s->ctl->ctx->rank, s->ctl->ctx->cfg.hostname, s->id, s->cycle, doing,
		         err.text);
		if (go_sent != NULL)
			ctl_abort(s, go_sent, &e2);
		queue_fail_set(s, &e2);
	}
out:
	for (int w = 0; w < n; w++) {
		free(payload[w]);
		payload[w] = NULL;
	}
	return ok ? NEG_RAN : NEG_END;
}

int negotiate_turn(eset *s, ctl_yield *y, eresp *out)
{
	if (s->idle == NULL) {
		nidle *id = calloc(1, sizeof(*id));
		size_t n = (size_t)s->size;
		if (id != NULL) {
			id->in = calloc(n, sizeof(*id->in));
			id->rx = calloc(n, sizeof(*id->rx));
			id->got = calloc(n, sizeof(*id->got));
			id->out = calloc(n, sizeof(*id->out));
			id->go = calloc(n, sizeof(*id->go));
			id->tx = calloc(3 * n, sizeof(*id->tx));
			id->go_sent = calloc(n, sizeof(*id->go_sent));
			id->payload = calloc(n, sizeof(*id->payload));
		}
		if (id == NULL || id->in == NULL || id->rx == NULL || id->got == NULL ||
		    id->out == NULL || id->go == NULL || id->tx == NULL || id->go_sent == NULL ||
		    id->payload == NULL) {
			kerr err;
			idle_free(id);
			kerr_set(&err, KHOR_ERR_NO_MEMORY, "out of memory");
			fail_with(s, KHOR_ERR_NO_MEMORY, &err, "starting a cycle");
			return NEG_END;
		}
		s->idle = id;
	}
	return s->rank == 0 ? coord_turn(s, y, out) : worker_turn(s, y, out);
}
