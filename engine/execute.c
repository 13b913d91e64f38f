/*
 * execute.c -- runs one cycle's response list on the set's data comm, in the order every
 * rank got it, and completes the handles: errors first, then the allreduces in the runs of
 * the fusion plan (fusion.c), then everything else in response order.
 *
 * A rank that has joined has no tensor of its own: it takes part with zeros, in the fusion
 * buffer, and the average still divides by the whole set.
 *
 * Device memory (collectives/mem.h): a tensor's kind is found at enqueue, and the fusion
 * classes split by it too, so host and device tensors of a cycle never share a run. Host
 * tensors take the CPU paths below (memcpy, reduce_scale) as they always have. Device
 * tensors go, in order, onto the set's own stream (types.h: edev): the copies into the
 * device fusion buffer, the scale factors, the collective as a stream-form call on that same
 * stream (so it starts after the copies, with no host wait between), the copies out; then
 * one wait for the stream, with the comm's timeout, before the handles complete. A tensor
 * enqueued with a ready event (khor.h: the _event forms) is waited for here, on the set
 * thread, before the first run that reads it.
 */
#include "execute.h"

#include "fusion.h"
#include "queue.h"
#include "timeline.h"

#include "base/dtype.h"
#include "base/log.h"
#include "collectives/algos.h"
#include "collectives/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kdeadline comm_deadline(const eset *s)
{
	return kdeadline_in_ms(s->data->cc.timeout_ms);
}

void execute_dev_release(eset *s)
{
	edev *d = &s->dev;
	kerr ignore;

	if (d->be == NULL)
		return;
	/* As mem.c's state_release: better a leak than a device writing into freed memory. */
	if (d->be->bind(d->ctx, &ignore) == KHOR_SUCCESS &&
	    (d->stream == NULL ||
	     kmem_stream_sync(d->be, d->stream, kdeadline_in_ms(5000),
	                      "freeing an engine set's stream", &ignore) == KHOR_SUCCESS)) {
		if (d->fusion != NULL) {
			if (s->data != NULL)
				comm_reg_invalidate(s->data->ctx, d->fusion, d->fusion_len);
			d->be->dev_free(d->fusion);
		}
		if (d->stream != NULL)
			d->be->stream_destroy(d->stream);
	}
	/* else the context is gone, and what was made in it with it, or the stream still runs */
	memset(d, 0, sizeof(*d));
}

/* The set's device side, bound on this thread for memory w (one device at a time). */
static khor_status dev_begin(eset *s, const kmem_where *w, edev **d_out, kerr *err)
{
	edev *d = &s->dev;
	khor_status st;

	if (d->be != NULL && (d->be != w->be || d->ctx != w->ctx || d->device != w->device))
		execute_dev_release(s);
	if ((st = w->be->bind(w->ctx, err)) != KHOR_SUCCESS)
		goto fail;
	d->be = w->be;
	d->ctx = w->ctx;
	d->device = w->device;
	if (d->stream == NULL && (st = d->be->stream_create(&d->stream, err)) != KHOR_SUCCESS)
		goto fail;
	*d_out = d;
	return KHOR_SUCCESS;

fail:
	kerr_prefix(err, "rank %d, engine set %d on %s device %d", s->rank, s->id, w->be->name,
	            w->device);
	return st;
}

/*
 * The end of a run on d (NULL: host memory, nothing to do): everything queued on the stream
 * has run before the handles complete. After a failure the stream is drained briefly too,
 * so that nothing queued still writes into a buffer whose handle has failed.
 */
static khor_status dev_end(eset *s, edev *d, khor_status st, const char *what, kerr *err)
{
	kerr ignore;

	if (d == NULL)
		return st;
	if (st == KHOR_SUCCESS)
		st = kmem_stream_sync(d->be, d->stream, comm_deadline(s), "the engine set's stream",
		                      err);
	else
		(void)kmem_stream_sync(d->be, d->stream, kdeadline_in_ms(2000),
		                       "the engine set's stream", &ignore);
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "%s on %s device %d", what, d->be->name, d->device);
	return st;
}

/* The operations on a run's memory: the CPU's on host memory (d NULL), else d's stream's. */
static khor_status m_copy(edev *d, void *dst, const void *src, size_t len, kerr *err)
{
	if (d == NULL) {
		memcpy(dst, src, len);
		return KHOR_SUCCESS;
	}
	return d->be->copy(dst, src, len, d->stream, err);
}

static khor_status m_zero(edev *d, void *p, size_t len, kerr *err)
{
	if (d == NULL) {
		memset(p, 0, len);
		return KHOR_SUCCESS;
	}
	return d->be->memset_zero(p, len, d->stream, err);
}

static khor_status m_scale(edev *d, void *p, size_t count, khor_dtype dt, double f, kerr *err)
{
	if (d == NULL) {
		reduce_scale(p, count, dt, f);
		return KHOR_SUCCESS;
	}
	if (f == 1.0 || count == 0)
		return KHOR_SUCCESS;
	return d->be->scale(p, count, dt, f, d->stream, err);
}

/*
 * Waits, on this thread, for the ready events of it's tensors (etensor.ready), at most the
 * comm's timeout each: an event that never completes fails here, naming the tensor, and
 * not as a hang. Each is waited for once, at the first run that reads it.
 */
static khor_status wait_ready(eset *s, eitem *it, kerr *err)
{
	if (it->h == NULL)
		return KHOR_SUCCESS;
	for (int i = 0; i < it->n; i++) {
		etensor *t = &it->t[i];
		khor_status st = KHOR_SUCCESS;
		if (t->ready == NULL)
			continue;
		if (t->mem.ctx != NULL)
			st = t->mem.be->bind(t->mem.ctx, err);
		if (st == KHOR_SUCCESS)
			st = kmem_event_wait(t->mem.be, t->ready, comm_deadline(s),
			                     "the input's ready event", err);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "rank %d on %s, engine set %d: %s '%s' cannot start: its input "
			            "never became ready (was the event recorded after the work that "
			            "produces it, on a stream that runs?)", s->rank,
			            s->data->ctx->cfg.hostname, s->id, eng_kind_name(it->kind), t->name);
			return st;
		}
		t->ready = NULL;
	}
	return KHOR_SUCCESS;
}

/* The device a tensor's run goes to, or NULL for host memory. */
static const kmem_where *tensor_dev(const etensor *t)
{
	return t->mem.kind == KMEM_DEVICE ? &t->mem : NULL;
}

static const char *transport_name(const eset *s)
{
	const kctx *x = s->data->ctx;

	if (x->ntps == 1)
		return x->tps[0].ops->name;
	if (s->data->nhosts <= 1 && comm_tp_index(x, "shm") >= 0)
		return "shm";
	return x->tp_names;
}

/*
 * One collective on the data comm; the error (named) in err. On device memory (d) it is a
 * stream-form call on d's stream: ordered after the copies queued there, and not waited for
 * (dev_end waits once for the whole run).
 */
static khor_status run(eset *s, edev *d, struct khor_request *r, kerr *err)
{
	khor_status st;
	const void *fb = d != NULL ? d->fusion : (const void *)s->fusion;

	/* Tensors are the framework's, freed without telling us: registered for the call only.
	 * The fusion buffer is ours, invalidated when it is reallocated or freed. */
	r->reg_policy = r->sendbuf == fb && r->recvbuf == fb ? REG_POLICY_KEEP : REG_POLICY_CALL;
	if (d != NULL) {
		r->stream = d->stream;
		r->has_stream = true;
	}
	st = comm_run(s->data, r);
	if (st != KHOR_SUCCESS)
		*err = r->err;
	return st;
}

static void req_init(struct khor_request *r, unsigned kind, const void *in, void *out,
                     size_t count, khor_dtype dt, khor_op op)
{
	memset(r, 0, sizeof(*r));
	r->kind = kind;
	r->sendbuf = in;
	r->recvbuf = out;
	r->count = count;
	r->dtype = dt;
	r->op = op;
}

/*
 * The timeline's view of one tensor of an item: its negotiation and queueing, then the op
 * from start (its end event is the caller's). Written once the op ran, so the schedule is
 * known; the events carry their own times.
 */
static void tl_start(eset *s, const eitem *it, int ti, const char *what, size_t bytes,
                     int tensors, const char *sched, uint64_t start)
{
	struct khor_engine *e = s->e;
	char args[256];
	const char *name = it->t[ti].name;

	if (it->h != NULL) {
		char neg[32];
		snprintf(neg, sizeof(neg), "NEGOTIATE_%s", eng_kind_upper(it->kind));
		uint64_t t0 = it->h->t_negotiate != 0 && it->h->t_negotiate < it->h->t_enqueue
		              ? it->h->t_negotiate : it->h->t_enqueue;
		timeline_begin(e, name, neg, t0, NULL);
		timeline_end(e, name, it->h->t_response);
		timeline_begin(e, name, "QUEUE", it->h->t_response, NULL);
		timeline_end(e, name, start);
	}
	snprintf(args, sizeof(args), "{\"algorithm\":\"%s\",\"transport\":\"%s\",\"bytes\":%zu,"
	         "\"tensors\":%d,\"set\":%d}", sched != NULL ? sched : "?", transport_name(s),
	         bytes, tensors, s->id);
	timeline_begin(e, name, what, start, args);
}

/*
 * The output of an allgather or alltoall, once its size is known. A device tensor's comes
 * from the alloc callback (enqueue refused it without one) and must be memory of the
 * input's device.
 */
static khor_status alloc_out(eset *s, edev *d, eitem *it, etensor *t, int64_t rows,
                             size_t bytes, kerr *err)
{
	t->out_ndim = t->ndim;
	for (int k = 0; k < t->ndim; k++)
		t->out_dims[k] = t->dims[k];
	t->out_dims[0] = rows;
	khor_handle *h = it->h;
	void *p;
	if (h->alloc != NULL)
		p = h->alloc(h->alloc_arg, t->out_ndim, t->out_dims, bytes);
	else
		p = t->owned_out = malloc(bytes > 0 ? bytes : 1);
	char msg[KERR_TEXT_MAX];
	msg[0] = '\0';
	if (p == NULL) {
		snprintf(msg, sizeof(msg), "%s '%s': cannot allocate the %zu-byte output (%s)",
		         eng_kind_name(it->kind), t->name, bytes,
		         h->alloc != NULL ? "the allocation callback returned NULL" : "out of memory");
	} else if (d != NULL) {
		kmem_where w;
		kmem_query(p, &w);
		if (w.kind != KMEM_DEVICE || w.be != t->mem.be || w.device != t->mem.device) {
			char got[64], want[64];
			snprintf(msg, sizeof(msg), "%s '%s': the allocation callback returned %s for "
			         "the output of a tensor in %s; it must return memory of the input's "
			         "device", eng_kind_name(it->kind), t->name,
			         kmem_describe(&w, got, sizeof(got)),
			         kmem_describe(&t->mem, want, sizeof(want)));
			p = NULL; /* not ours to free */
		}
	}
	if (p == NULL) {
		/*
		 * This rank still takes part, into the fusion buffer, so that the others' handles
		 * complete; only this handle fails. Without even that memory the set fails.
		 */
		kerr e;
		if (it->msg == NULL)
			it->msg = strdup(msg);
		p = fusion_buffer(s, d, bytes > 0 ? bytes : 1, &e);
		if (p == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s", msg);
	}
	t->out = p;
	return KHOR_SUCCESS;
}

static size_t row_elems(const etensor *t)
{
	size_t row = 1;
	for (int d = 1; d < t->ndim; d++)
		row *= (size_t)t->dims[d];
	return row;
}

static khor_status run_allgather(eset *s, edev *d, eitem *it, int i, kerr *err)
{
	etensor *t = &it->t[i];
	size_t esz = kdtype_size(t->dtype), row = row_elems(t), n = (size_t)s->size;
	size_t *cnt = malloc(sizeof(size_t) * n * 2);
	int64_t rows = 0;
	struct khor_request r;
	khor_status st;

	if (cnt == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allgather '%s': out of memory", t->name);
	for (size_t q = 0; q < n; q++) {
		/* A one-rank set negotiates nothing: its own dim 0 is all there is. */
		int64_t d0 = it->dim0 != NULL ? it->dim0[(size_t)i * n + q] : t->dims[0];
		cnt[q] = (size_t)d0 * row;
		cnt[n + q] = (size_t)rows * row;
		rows += d0;
	}
	if ((st = alloc_out(s, d, it, t, rows, (size_t)rows * row * esz, err)) != KHOR_SUCCESS) {
		free(cnt);
		return st;
	}
	req_init(&r, COLL_ALLGATHER, t->in, t->out, cnt[s->rank], t->dtype, KHOR_SUM);
	r.rcounts = cnt;
	r.rdispls = cnt + n;
	st = run(s, d, &r, err);
	free(cnt);
	return st;
}

static khor_status run_alltoall(eset *s, edev *d, eitem *it, int i, kerr *err)
{
	etensor *t = &it->t[i];
	size_t esz = kdtype_size(t->dtype), row = row_elems(t), n = (size_t)s->size;
	struct khor_request r;
	khor_status st;

	/* The splits are the engine's own host arrays, whatever the tensor's memory. */
	req_init(&r, COLL_ALLTOALL, t->splits, t->rsplits, 1, KHOR_INT64, KHOR_SUM);
	if ((st = run(s, NULL, &r, err)) != KHOR_SUCCESS)
		return st;
	size_t *v = malloc(sizeof(size_t) * n * 4);
	if (v == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "alltoall '%s': out of memory", t->name);
	int64_t rows = 0;
	size_t so = 0, ro = 0;
	for (size_t q = 0; q < n; q++) {
		if (t->rsplits[q] < 0) {
			free(v);
			return kerr_set(err, KHOR_ERR_PROTOCOL, "alltoall '%s': rank %zu sends %lld rows",
			                t->name, q, (long long)t->rsplits[q]);
		}
		v[q] = (size_t)t->splits[q] * row;
		v[n + q] = so;
		so += v[q];
		v[2 * n + q] = (size_t)t->rsplits[q] * row;
		v[3 * n + q] = ro;
		ro += v[2 * n + q];
		rows += t->rsplits[q];
	}
	if ((st = alloc_out(s, d, it, t, rows, ro * esz, err)) != KHOR_SUCCESS) {
		free(v);
		return st;
	}
	req_init(&r, COLL_ALLTOALL, t->in, t->out, 0, t->dtype, KHOR_SUM);
	r.scounts = v;
	r.sdispls = v + n;
	r.rcounts = v + 2 * n;
	r.rdispls = v + 3 * n;
	st = run(s, d, &r, err);
	free(v);
	return st;
}

/*
 * Reduce-scatter along dim 0 (the first d0 % n ranks get a row more). The schedule's blocks
 * are in elements; when rows divide evenly they are the rows, else the whole reduction
 * runs as an allreduce and this rank keeps its rows.
 */
static khor_status run_reducescatter(eset *s, edev *d, eitem *it, int i, kerr *err)
{
	etensor *t = &it->t[i];
	size_t esz = kdtype_size(t->dtype), row = row_elems(t), off, len;
	size_t d0 = (size_t)t->dims[0];
	struct khor_request r;
	khor_status st = KHOR_SUCCESS;
	const void *in = t->in;

	coll_block(d0, s->size, s->rank, &off, &len);
	bool even = d0 % (size_t)s->size == 0;
	size_t need = (it->prescale != 1.0 || !even) ? t->count * esz : 0;
	uint8_t *tmp = need > 0 ? fusion_buffer(s, d, need, err) : NULL;
	if (need > 0 && tmp == NULL) {
		if (d != NULL) {
			kerr_prefix(err, "reducescatter '%s': the device fusion buffer", t->name);
			return err->status;
		}
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "reducescatter '%s': out of memory", t->name);
	}
	if (it->prescale != 1.0) {
		if ((st = m_copy(d, tmp, t->in, t->count * esz, err)) == KHOR_SUCCESS)
			st = m_scale(d, tmp, t->count, t->dtype, it->prescale, err);
		in = tmp;
	}
	if (st != KHOR_SUCCESS) {
		/* a device operation failed to queue: its own words */
	} else if (even) {
		req_init(&r, COLL_REDUCESCATTER, in, t->out, t->count, t->dtype, it->op);
		st = run(s, d, &r, err);
	} else {
		req_init(&r, COLL_ALLREDUCE, in, tmp, t->count, t->dtype, it->op);
		st = run(s, d, &r, err);
		if (st == KHOR_SUCCESS && len > 0)
			st = m_copy(d, t->out, tmp + off * row * esz, len * row * esz, err);
	}
	if (st == KHOR_SUCCESS)
		st = m_scale(d, t->out, len * row, t->dtype, it->postscale, err);
	return st;
}

/*
 * Runs pieces [0, m) as one allreduce (fused when m > 1), on host memory or on the device
 * of p[0] (a run is of one class, so of one memory).
 */
static khor_status run_fused(eset *s, piece *p, int m, kerr *err)
{
	eitem *it0 = p[0].it;
	etensor *t0 = &it0->t[p[0].ti];
	khor_dtype dt = t0->dtype;
	size_t esz = kdtype_size(dt), total = 0;
	struct khor_engine *e = s->e;
	bool tl = timeline_on(e);
	struct khor_request r;
	khor_status st = KHOR_SUCCESS;
	edev *d = NULL;
	char what[160] = "";

	if (p[0].dev != NULL && (st = dev_begin(s, p[0].dev, &d, err)) != KHOR_SUCCESS)
		return st;
	if (it0->h != NULL)
		s->join_on_dev = d != NULL;
	for (int k = 0; k < m; k++)
		total += p[k].it->t[p[k].ti].count;
	if (d != NULL)
		snprintf(what, sizeof(what), "allreduce '%s'%s", t0->name,
		         m > 1 ? " and the tensors fused with it" : "");
	if (m == 1 && it0->h != NULL) {
		/* Straight from input to output: no copy. */
		const void *in = t0->in;
		if (it0->prescale != 1.0) {
			if (t0->out != t0->in)
				st = m_copy(d, t0->out, t0->in, t0->count * esz, err);
			if (st == KHOR_SUCCESS)
				st = m_scale(d, t0->out, t0->count, dt, it0->prescale, err);
			in = t0->out;
		}
		uint64_t t_start = kclock_ns();
		req_init(&r, COLL_ALLREDUCE, in, t0->out, t0->count, dt, it0->op);
		if (st == KHOR_SUCCESS)
			st = run(s, d, &r, err);
		if (st == KHOR_SUCCESS)
			st = m_scale(d, t0->out, t0->count, dt, it0->postscale, err);
		st = dev_end(s, d, st, what, err);
		if (tl) {
			tl_start(s, it0, p[0].ti, "ALLREDUCE", t0->count * esz, 1, s->data->last_sched,
			         t_start);
			timeline_end(e, t0->name, kclock_ns());
		}
		s->bytes_done += t0->count * esz;
		return st;
	}
	uint8_t *buf = fusion_buffer(s, d, total * esz, err);
	uint64_t *ts = tl ? malloc(sizeof(uint64_t) * 4 * (size_t)m) : NULL;
	if (buf == NULL) {
		free(ts);
		if (d != NULL) {
			kerr_prefix(err, "allreduce of %d tensors: the %zu-byte device fusion buffer", m,
			            total * esz);
			return err->status;
		}
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allreduce of %d tensors: cannot allocate "
		                "a %zu-byte fusion buffer", m, total * esz);
	}
	/* On device memory the times are those of queueing the copies, not of running them. */
	uint64_t t_start = kclock_ns();
	size_t off = 0;
	for (int k = 0; k < m && st == KHOR_SUCCESS; k++) {
		etensor *t = &p[k].it->t[p[k].ti];
		if (ts != NULL)
			ts[4 * k] = kclock_ns();
		if (p[k].it->h != NULL)
			st = m_copy(d, buf + off * esz, t->in, t->count * esz, err);
		else
			st = m_zero(d, buf + off * esz, t->count * esz, err);
		if (ts != NULL)
			ts[4 * k + 1] = kclock_ns();
		off += t->count;
	}
	if (st == KHOR_SUCCESS)
		st = m_scale(d, buf, total, dt, it0->prescale, err);
	req_init(&r, COLL_ALLREDUCE, buf, buf, total, dt, it0->op);
	if (st == KHOR_SUCCESS)
		st = run(s, d, &r, err);
	if (st == KHOR_SUCCESS)
		st = m_scale(d, buf, total, dt, it0->postscale, err);
	off = 0;
	for (int k = 0; k < m && st == KHOR_SUCCESS; k++) {
		etensor *t = &p[k].it->t[p[k].ti];
		if (ts != NULL)
			ts[4 * k + 2] = kclock_ns();
		if (p[k].it->h != NULL)
			st = m_copy(d, t->out, buf + off * esz, t->count * esz, err);
		if (ts != NULL)
			ts[4 * k + 3] = kclock_ns();
		off += t->count;
	}
	if ((st = dev_end(s, d, st, what, err)) != KHOR_SUCCESS) {
		free(ts);
		return st;
	}
	/* The timeline, in nesting order: op, copy in, copy out, end of op. */
	for (int k = 0; ts != NULL && k < m; k++) {
		if (p[k].it->h == NULL)
			continue;
		const char *nm = p[k].it->t[p[k].ti].name;
		tl_start(s, p[k].it, p[k].ti, "ALLREDUCE", total * esz, m, s->data->last_sched,
		         t_start);
		timeline_begin(e, nm, "MEMCPY_IN_FUSION_BUFFER", ts[4 * k], NULL);
		timeline_end(e, nm, ts[4 * k + 1]);
		timeline_begin(e, nm, "MEMCPY_OUT_FUSION_BUFFER", ts[4 * k + 2], NULL);
		timeline_end(e, nm, ts[4 * k + 3]);
		timeline_end(e, nm, ts[4 * k + 3]);
	}
	free(ts);
	s->bytes_done += total * esz;
	return KHOR_SUCCESS;
}

/* Completes item it (when it has a handle) with st. */
static void finish(eset *s, eitem *it, khor_status st, const kerr *err)
{
	struct khor_engine *e = s->e;
	char msg[KERR_TEXT_MAX];

	if (it->h == NULL)
		return;
	if (st != KHOR_SUCCESS)
		snprintf(msg, sizeof(msg), "%s", err->text);
	pthread_mutex_lock(&e->mu);
	queue_complete_locked(e, it->h, st, st != KHOR_SUCCESS ? msg : NULL);
	pthread_mutex_unlock(&e->mu);
	it->h = NULL;
	it->t = NULL; /* they were the handle's */
	it->n = 0;
}

/* A collective failed: the set fails, and so does every item of this cycle not done yet. */
static void fail_rest(eset *s, eitem *items, int n, const kerr *cause)
{
	kerr verdict = *cause;

	/* The job's words for it: the comm's sticky error when the collective failed there
	 * (another rank's cause, when that rank was first: runtime/comm.c, adopt_abort), else
	 * this one, told to the other ranks. */
	if (s->data != NULL && cause->status != KHOR_ERR_INVALID_ARG) {
		pthread_mutex_lock(&s->data->mu);
		if (s->data->err.status != KHOR_SUCCESS)
			verdict = s->data->err;
		pthread_mutex_unlock(&s->data->mu);
		comm_job_failure(s->data->ctx, &verdict);
	}
	for (int i = 0; i < n; i++)
		finish(s, &items[i], verdict.status, &verdict);
	queue_fail_set(s, &verdict);
}

static void execute_all(eset *s, eitem *items, int n)
{
	struct khor_engine *e = s->e;
	kerr err;
	khor_status st = KHOR_SUCCESS;

	kerr_clear(&err);
	/* Errors first: they need nothing from the other ranks. */
	for (int i = 0; i < n; i++) {
		if (!items[i].error)
			continue;
		kerr x;
		const char *nm = items[i].h != NULL ? items[i].h->key : "?";
		(void)nm;
		kerr_set(&x, items[i].status, "rank %d on %s, engine set %d: %s", s->rank,
		         s->data != NULL ? s->data->ctx->cfg.hostname : "", s->id,
		         items[i].msg != NULL ? items[i].msg : "failed");
		finish(s, &items[i], items[i].status, &x);
	}
	/* A joined rank's zeros go where its own last allreduce went (types.h: join_on_dev). */
	kmem_where joined = { KMEM_DEVICE, s->dev.be, s->dev.device, s->dev.ctx };
	const kmem_where *ghost_dev = s->join_on_dev && s->dev.be != NULL ? &joined : NULL;
	fusion_plan plan;
	if (!fusion_plan_make(items, n, atomic_load(&e->fusion_bytes), ghost_dev, &plan)) {
		kerr_set(&err, KHOR_ERR_NO_MEMORY, "engine set %d: out of memory", s->id);
		fail_rest(s, items, n, &err);
		return;
	}
	int *left = calloc((size_t)n + 1, sizeof(int));
	if (left == NULL) {
		fusion_plan_free(&plan);
		kerr_set(&err, KHOR_ERR_NO_MEMORY, "engine set %d: out of memory", s->id);
		fail_rest(s, items, n, &err);
		return;
	}
	for (int i = 0; i < n; i++)
		if (!items[i].error && items[i].kind == EK_ALLREDUCE)
			left[i] = items[i].n;
	for (int r = 0; r < plan.nruns && st == KHOR_SUCCESS; r++) {
		int m = plan.start[r + 1] - plan.start[r];
		piece *rp = plan.pieces + plan.start[r];
		for (int q = 0; q < m && st == KHOR_SUCCESS; q++)
			st = wait_ready(s, rp[q].it, &err);
		if (st != KHOR_SUCCESS)
			break;
		st = run_fused(s, rp, m, &err);
		if (st != KHOR_SUCCESS)
			break;
		for (int q = 0; q < m; q++) {
			int idx = (int)(rp[q].it - items);
			if (--left[idx] == 0)
				finish(s, &items[idx], KHOR_SUCCESS, NULL);
		}
	}
	fusion_plan_free(&plan);
	free(left);
	if (st != KHOR_SUCCESS) {
		fail_rest(s, items, n, &err);
		return;
	}
	/* Everything else, in response order. */
	for (int i = 0; i < n && st == KHOR_SUCCESS; i++) {
		eitem *it = &items[i];
		if (it->error || it->kind == EK_ALLREDUCE || it->h == NULL) {
			if (!it->error && it->kind != EK_ALLREDUCE && it->h == NULL) {
				st = kerr_set(&err, KHOR_ERR_INTERNAL, "engine set %d: %s '%s' ran on a rank "
				              "without it", s->id, eng_kind_name(it->kind), it->t[0].name);
			}
			continue;
		}
		bool tl = timeline_on(e);
		if ((st = wait_ready(s, it, &err)) != KHOR_SUCCESS)
			break;
		for (int ti = 0; ti < it->n && st == KHOR_SUCCESS; ti++) {
			etensor *t = &it->t[ti];
			size_t esz = kdtype_size(t->dtype);
			struct khor_request r;
			uint64_t t_start = kclock_ns();
			edev *d = NULL;
			if (tensor_dev(t) != NULL && (st = dev_begin(s, &t->mem, &d, &err)) != KHOR_SUCCESS)
				break;
			switch (it->kind) {
			case EK_ALLGATHER:
				st = run_allgather(s, d, it, ti, &err);
				break;
			case EK_BROADCAST:
				if (s->rank == it->root && t->out != t->in && t->count > 0)
					st = m_copy(d, t->out, t->in, t->count * esz, &err);
				req_init(&r, COLL_BROADCAST, t->out, t->out, t->count, t->dtype, KHOR_SUM);
				r.root = it->root;
				if (st == KHOR_SUCCESS)
					st = run(s, d, &r, &err);
				break;
			case EK_ALLTOALL:
				st = run_alltoall(s, d, it, ti, &err);
				break;
			case EK_REDUCESCATTER:
				st = run_reducescatter(s, d, it, ti, &err);
				break;
			case EK_BARRIER:
				req_init(&r, COLL_BARRIER, NULL, NULL, 0, KHOR_FLOAT32, KHOR_SUM);
				st = run(s, NULL, &r, &err);
				break;
			default:
				st = kerr_set(&err, KHOR_ERR_INTERNAL, "engine: unknown kind %d", it->kind);
			}
			if (d != NULL) {
				char what[160];
				snprintf(what, sizeof(what), "%s '%s'", eng_kind_name(it->kind), t->name);
				st = dev_end(s, d, st, what, &err);
			}
			if (tl) {
				tl_start(s, it, ti, eng_kind_upper(it->kind), t->count * esz, 1,
				         eng_kind_name(it->kind), t_start);
				timeline_end(e, t->name, kclock_ns());
			}
			s->bytes_done += t->count * esz;
		}
		if (st == KHOR_SUCCESS && it->msg != NULL) {
			/* Its collective ran, but this rank could not keep the result. */
			kerr x;
			kerr_set(&x, KHOR_ERR_NO_MEMORY, "rank %d on %s, engine set %d: %s", s->rank,
			         s->data->ctx->cfg.hostname, s->id, it->msg);
			for (int ti = 0; ti < it->n; ti++)
				if (it->t[ti].out == s->fusion ||
				    (s->dev.fusion != NULL && it->t[ti].out == s->dev.fusion))
					it->t[ti].out = NULL;
			finish(s, it, KHOR_ERR_NO_MEMORY, &x);
		} else if (st == KHOR_SUCCESS) {
			finish(s, it, KHOR_SUCCESS, NULL);
		}
	}
	if (st != KHOR_SUCCESS)
		fail_rest(s, items, n, &err);
}

void execute_items(eset *s, eitem *items, int n)
{
	execute_all(s, items, n);
	pthread_mutex_lock(&s->e->mu);
	queue_signal_locked(s->e);
	pthread_mutex_unlock(&s->e->mu);
}
