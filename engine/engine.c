/*
 * engine.c -- the engine's lifecycle, its process sets and their threads, enqueue and the
 * handles (engine.h draws the whole).
 *
 * Locking: the engine's mu covers every handle's completion state and each set's lists
 * and maps (fresh, pending, names, keys, stop, failed). A set thread takes it only to move
 * handles between lists and to complete them; it never holds it across a network wait.
 * Handles hold a reference on the engine, so a handle freed after khor_engine_stop still
 * finds its lock.
 */
#include "engine.h"

#include "autotune.h"
#include "desc.h"
#include "execute.h"
#include "fusion.h"
#include "negotiate.h"
#include "queue.h"
#include "response.h"
#include "response_cache.h"
#include "settings.h"
#include "table.h"
#include "timeline.h"

#include "base/dtype.h"
#include "base/log.h"
#include "collectives/reduce.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static void engine_free(struct khor_engine *e);

static khor_status bad(kerr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static eset *find_set(struct khor_engine *e, int id)
{
	for (int i = 0; i < e->nsets; i++)
		if (e->sets[i]->id == id)
			return e->sets[i];
	return NULL;
}

static void set_wake(eset *s)
{
	atomic_store(&s->woken, true);
	if (s->size == 1) {
		pthread_cond_broadcast(&s->cv);
		return;
	}
	kctx *x = s->ctl->ctx;
	for (int i = 0; i < x->ntps; i++)
		if (x->tps[i].ops->wake != NULL)
			x->tps[i].ops->wake(x->tps[i].ctx);
}

static void engine_unref_locked(struct khor_engine *e, bool *free_it)
{
	*free_it = --e->refs == 0;
}

static bool is_float(khor_dtype d)
{
	return d == KHOR_FLOAT32 || d == KHOR_FLOAT64 || d == KHOR_FLOAT16 || d == KHOR_BFLOAT16;
}

static khor_status bad(kerr *err, const char *fmt, ...)
{
	va_list ap;
	char msg[KERR_TEXT_MAX];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s", msg);
}

/*
 * The memory of a tensor's buffers (t->mem, collectives/mem.h): the one the collective runs
 * on (the input, or a broadcast's output where the input is not read) and, when used, the
 * other must be of the same kind: both host (pageable or pinned) memory or both memory of
 * one device. A ready event needs a backend to wait with, which the input's memory names.
 */
static khor_status mem_check(int kind, const eng_targ *a, bool in_used, bool out_used,
                             etensor *t, kerr *err)
{
	const char *fn = eng_kind_name(kind);
	char x[64], y[64];

	if (in_used)
		kmem_query(a->in, &t->mem);
	else if (out_used)
		kmem_query(a->out, &t->mem);
	else
		kmem_query(NULL, &t->mem);
	if (in_used && out_used && a->out != a->in) {
		kmem_where w;
		kmem_query(a->out, &w);
		bool dev_in = t->mem.kind == KMEM_DEVICE, dev_out = w.kind == KMEM_DEVICE;
		if (dev_in != dev_out ||
		    (dev_in && (w.be != t->mem.be || w.device != t->mem.device)))
			return bad(err, "%s '%s': the input is %s but the output is %s: a tensor's input "
			           "and output must both be host memory or both memory of one device",
			           fn, a->name, kmem_describe(&t->mem, x, sizeof(x)),
			           kmem_describe(&w, y, sizeof(y)));
	}
	if (a->ready != NULL && t->count > 0) {
		if (t->mem.be == NULL)
			return bad(err, "%s '%s': a ready event was given for a tensor in host memory: "
			           "the event is waited for with the backend of the input's memory "
			           "(device or pinned host memory); pass NULL when the input is ready",
			           fn, a->name);
		t->ready = a->ready;
	}
	return KHOR_SUCCESS;
}

/* One tensor's checks; fills t (name copied). */
static khor_status tensor_check(const eset *s, int kind, const eng_targ *a, bool need_out,
                                khor_op op, int root, etensor *t, kerr *err)
{
	const char *fn = eng_kind_name(kind);
	size_t esz = kdtype_size(a->dtype), count = 1;

	if (a->name == NULL || a->name[0] == '\0')
		return bad(err, "%s: the tensor has no name", fn);
	if (strchr(a->name, '\n') != NULL || strlen(a->name) > 1000)
		return bad(err, "%s '%.64s': names may not hold a newline or exceed 1000 bytes", fn,
		           a->name);
	if (esz == 0)
		return bad(err, "%s '%s': unknown dtype %d", fn, a->name, (int)a->dtype);
	if (a->ndim < 0 || a->ndim > ENG_MAX_DIMS || (a->ndim > 0 && a->dims == NULL))
		return bad(err, "%s '%s': ndim %d (0 to %d dims, given in dims)", fn, a->name,
		           a->ndim, ENG_MAX_DIMS);
	for (int d = 0; d < a->ndim; d++) {
		if (a->dims[d] < 0)
			return bad(err, "%s '%s': dim %d is %lld", fn, a->name, d, (long long)a->dims[d]);
		if (a->dims[d] > 0 && count > SIZE_MAX / esz / (size_t)s->size / (size_t)a->dims[d])
			return bad(err, "%s '%s': the shape overflows the buffer size", fn, a->name);
		count *= (size_t)a->dims[d];
	}
	if ((kind == EK_ALLGATHER || kind == EK_ALLTOALL || kind == EK_REDUCESCATTER) &&
	    a->ndim < 1)
		return bad(err, "%s '%s': needs a tensor of at least one dimension", fn, a->name);
	if ((kind == EK_ALLREDUCE || kind == EK_REDUCESCATTER) && !reduce_supported(a->dtype, op))
		return bad(err, "%s '%s': op %s is not supported for %s", fn, a->name,
		           kop_name(op), kdtype_name(a->dtype));
	if (kind == EK_BARRIER || kind == EK_JOIN)
		need_out = false;
	else if (count > 0 && a->in == NULL)
		return bad(err, "%s '%s': NULL input with %zu elements", fn, a->name, count);
	size_t out_count = count;
	if (kind == EK_REDUCESCATTER && a->ndim > 0) {
		/* Only this rank's rows land in the output: none when dim 0 < ranks here. */
		size_t d0 = (size_t)a->dims[0], n = (size_t)s->size;
		size_t rows = d0 / n + ((size_t)s->rank < d0 % n ? 1 : 0);
		out_count = d0 > 0 ? count / d0 * rows : 0;
	}
	if (need_out && out_count > 0 && a->out == NULL)
		return bad(err, "%s '%s': NULL output with %zu elements", fn, a->name, out_count);
	memset(t, 0, sizeof(*t));
	t->dtype = a->dtype;
	t->ndim = a->ndim;
	for (int d = 0; d < a->ndim; d++)
		t->dims[d] = a->dims[d];
	t->count = count;
	t->in = a->in;
	t->out = a->out;
	bool in_used = count > 0 && kind != EK_BARRIER && kind != EK_JOIN &&
	               (kind != EK_BROADCAST || s->rank == root);
	khor_status st = mem_check(kind, a, in_used, need_out && out_count > 0, t, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (kind == EK_ALLTOALL) {
		int64_t sum = 0;
		if (a->splits == NULL && a->dims[0] % s->size != 0)
			return bad(err, "alltoall '%s': dim 0 (%lld) does not divide over %d ranks; give "
			           "splits", a->name, (long long)a->dims[0], s->size);
		t->splits = malloc(sizeof(int64_t) * (size_t)s->size);
		t->rsplits = calloc((size_t)s->size, sizeof(int64_t));
		if (t->splits == NULL || t->rsplits == NULL)
			return bad(err, "alltoall '%s': out of memory", a->name);
		for (int r = 0; r < s->size; r++) {
			t->splits[r] = a->splits != NULL ? a->splits[r] : a->dims[0] / s->size;
			if (t->splits[r] < 0)
				return bad(err, "alltoall '%s': splits[%d] is %lld", a->name, r,
				           (long long)t->splits[r]);
			sum += t->splits[r];
		}
		if (sum != a->dims[0])
			return bad(err, "alltoall '%s': splits add up to %lld rows, dim 0 is %lld",
			           a->name, (long long)sum, (long long)a->dims[0]);
	}
	if ((t->name = strdup(a->name)) == NULL)
		return bad(err, "%s '%s': out of memory", fn, a->name);
	return KHOR_SUCCESS;
}

khor_status engine_enqueue(struct khor_engine *e, int set, int kind, int n, const eng_targ *ta,
                           khor_op op, double prescale, double postscale, int root,
                           khor_alloc_fn alloc, void *alloc_arg, khor_handle **out, kerr *err)
{
	eset *s;
	khor_handle *h;
	khor_status st;
	size_t keylen = 0;
	bool need_out = kind == EK_ALLREDUCE || kind == EK_BROADCAST || kind == EK_REDUCESCATTER;

	pthread_mutex_lock(&e->mu);
	s = find_set(e, set);
	pthread_mutex_unlock(&e->mu);
	if (s == NULL)
		return bad(err, "%s: no process set %d in this engine", eng_kind_name(kind), set);
	if (n < 1 || n > 65535)
		return bad(err, "%s: %d tensors in one call (1 to 65535)", eng_kind_name(kind), n);
	if (prescale != prescale || postscale != postscale || prescale * 0 != 0 ||
	    postscale * 0 != 0)
		return bad(err, "%s '%s': prescale and postscale must be finite", eng_kind_name(kind),
		           ta[0].name != NULL ? ta[0].name : "");
	if (kind == EK_BROADCAST && (root < 0 || root >= s->size))
		return bad(err, "broadcast '%s': root %d is not a rank of set %d (%d ranks)",
		           ta[0].name != NULL ? ta[0].name : "", root, set, s->size);
	h = calloc(1, sizeof(*h));
	if (h == NULL || (h->t = calloc((size_t)n, sizeof(*h->t))) == NULL) {
		free(h);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "enqueue: out of memory");
	}
	klist_init(&h->link);
	klist_init(&h->named_link);
	h->set = s;
	h->eng = e;
	h->set_rank = s->rank;
	h->set_size = s->size;
	h->kind = kind;
	h->op = op;
	h->root = root;
	h->prescale = prescale;
	h->postscale = postscale;
	h->alloc = alloc;
	h->alloc_arg = alloc_arg;
	h->join_rank = -1;
	h->n = n;
	for (int i = 0; i < n; i++) {
		if ((st = tensor_check(s, kind, &ta[i], need_out, op, root, &h->t[i], err)) !=
		    KHOR_SUCCESS)
			goto fail_free;
		if ((kind == EK_ALLGATHER || kind == EK_ALLTOALL) && alloc == NULL &&
		    h->t[i].mem.kind == KMEM_DEVICE) {
			char w[64];
			st = bad(err, "%s '%s': the input is %s, and a device tensor's %s needs an alloc "
			         "callback that returns device memory (the engine allocates host memory "
			         "only)", eng_kind_name(kind), ta[i].name,
			         kmem_describe(&h->t[i].mem, w, sizeof(w)), eng_kind_name(kind));
			goto fail_free;
		}
		if (!is_float(ta[i].dtype) && (prescale != 1.0 || postscale != 1.0) &&
		    kind != EK_BARRIER) {
			st = bad(err, "%s '%s': prescale/postscale apply to floating-point tensors only "
			         "(%s)", eng_kind_name(kind), ta[i].name, kdtype_name(ta[i].dtype));
			goto fail_free;
		}
		keylen += strlen(ta[i].name) + 1;
	}
	if ((h->key = malloc(keylen)) == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "enqueue: out of memory");
		goto fail_free;
	}
	h->key[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (i > 0)
			strcat(h->key, "\n");
		strcat(h->key, ta[i].name);
	}
	if ((st = desc_make(h, err)) != KHOR_SUCCESS)
		goto fail_free;
	h->t_enqueue = kclock_ns();

	pthread_mutex_lock(&e->mu);
	if (s->first_stopper >= 0) {
		st = kerr_set(err, KHOR_ERR_REMOTE, "%s '%s' not started: rank %d has stopped %s, so "
		              "nothing more can run on set %d (Horovod: \"Horovod has been shut "
		              "down\"); stop this rank's engine too", eng_kind_name(kind),
		              h->t[0].name, s->first_stopper,
		              s->id == 0 ? "its engine (khor_engine_stop, Horovod's shutdown)"
		                         : "its engine or removed this process set", s->id);
		goto fail_unlock;
	}
	if (e->stopped || s->stop) {
		st = kerr_set(err, KHOR_ERR_INVALID_ARG, "%s '%s': the engine is stopping",
		              eng_kind_name(kind), h->key);
		goto fail_unlock;
	}
	if (s->failed) {
		st = s->err.status;
		kerr_set(err, st, "%s '%s' not started, set %d failed earlier: %s",
		         eng_kind_name(kind), h->t[0].name, s->id, s->err.text);
		goto fail_unlock;
	}
	if (kind == EK_JOIN && s->join != NULL) {
		st = bad(err, "join: this rank's join on set %d is still in flight", s->id);
		goto fail_unlock;
	}
	if (kind != EK_JOIN && s->join != NULL) {
		st = bad(err, "%s '%s': this rank has joined set %d; enqueue again after the join "
		         "completes", eng_kind_name(kind), h->t[0].name, s->id);
		goto fail_unlock;
	}
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < i; j++) {
			if (strcmp(h->t[i].name, h->t[j].name) == 0) {
				st = bad(err, "%s: tensor '%s' appears twice in one group",
				         eng_kind_name(kind), h->t[i].name);
				goto fail_unlock;
			}
		}
		khor_handle *o = emap_get(&s->names, h->t[i].name);
		if (o != NULL) {
			st = bad(err, "%s '%s': a tensor of this name is already in flight on set %d "
			         "(an earlier %s, whose handle %s); a name is taken until its handle has been "
			         "waited for (khor_handle_wait, khor_handle_test) or freed: use "
			         "another name, or synchronize the first", eng_kind_name(kind),
			         h->t[i].name, s->id, eng_kind_name(o->kind),
			         o->done ? "completed but has not been waited for or freed"
			                 : "has not completed");
			goto fail_unlock;
		}
	}
	if (queue_push_locked(s, h) != KHOR_SUCCESS)
		goto fail_nomem;
	for (int i = 0; i < n; i++)
		if (h->t[i].mem.be != NULL || h->t[i].ready != NULL)
			s->dev_seen = true; /* its cycles run on the set thread (drive_while_waiting) */
	e->refs++;
	pthread_mutex_unlock(&e->mu);
	set_wake(s);
	*out = h;
	return KHOR_SUCCESS;

fail_nomem:
	st = kerr_set(err, KHOR_ERR_NO_MEMORY, "enqueue '%s': out of memory", h->key);
fail_unlock:
	pthread_mutex_unlock(&e->mu);
fail_free:
	queue_handle_free(h);
	return st;
}

/*
 * A one-rank set needs no negotiation: everything enqueued is ready at once, and runs in
 * one turn (by the holder of the baton). False: the set failed (out of memory).
 */
static bool solo_turn(eset *s)
{
	struct khor_engine *e = s->e;

	pthread_mutex_lock(&e->mu);
	int n = 0;
	klist *node, *tmp;
	KLIST_FOREACH_SAFE(node, tmp, &s->fresh)
		n++;
	if (n == 0) {
		pthread_mutex_unlock(&e->mu);
		return true;
	}
	eitem *items = calloc((size_t)n, sizeof(*items));
	if (items == NULL) {
		pthread_mutex_unlock(&e->mu);
		kerr x;
		kerr_set(&x, KHOR_ERR_NO_MEMORY, "engine set %d: out of memory", s->id);
		queue_fail_set(s, &x);
		return false;
	}
	int i = 0;
	KLIST_FOREACH_SAFE(node, tmp, &s->fresh) {
		khor_handle *h = KLIST_ENTRY(node, khor_handle, link);
		klist_del(&h->link);
		h->t_response = kclock_ns();
		if (h->kind == EK_JOIN) {
			/* Every member (this one) has joined: it is the last. */
			h->join_rank = 0;
			queue_complete_locked(e, h, KHOR_SUCCESS, NULL);
			continue;
		}
		items[i].h = h;
		items[i].kind = h->kind;
		items[i].op = h->op;
		items[i].root = h->root;
		items[i].prescale = h->prescale;
		items[i].postscale = h->postscale;
		items[i].n = h->n;
		items[i].t = h->t;
		i++;
	}
	queue_signal_locked(e);
	pthread_mutex_unlock(&e->mu);
	execute_items(s, items, i);
	free(items);
	s->cycles++;
	return true;
}

static void solo_loop(eset *s)
{
	struct khor_engine *e = s->e;

	for (;;) {
		pthread_mutex_lock(&e->mu);
		while (klist_empty(&s->fresh) && !s->stop && !s->failed)
			pthread_cond_wait(&s->cv, &e->mu);
		bool end = s->failed || (klist_empty(&s->fresh) && s->stop);
		pthread_mutex_unlock(&e->mu);
		if (end)
			return;
		/* What a waiting caller took meanwhile is gone from fresh: the turn finds less. */
		pthread_mutex_lock(&s->drive);
		bool ok = solo_turn(s);
		pthread_mutex_unlock(&s->drive);
		if (!ok)
			return;
	}
}

/*
 * One turn of set s by the holder of its baton: a cycle (negotiation hands back its
 * responses, which run here, in order, on every rank alike), or, with y, a look that found
 * nothing to do yet (NEG_IDLE: sleep as y says, the baton let go). NEG_END: the set's loop
 * is over (s->over): it failed, or every rank stopped.
 */
static int set_turn(eset *s, ctl_yield *y)
{
	eresp r = { 0 };
	int t = negotiate_turn(s, y, &r);

	if (t == NEG_IDLE)
		return NEG_IDLE;
	if (t == NEG_END) {
		s->over = true;
		return NEG_END;
	}
	bool stop = r.stop;
	if (r.n > 0)
		execute_items(s, r.items, r.n);
	response_free(&r);
	s->cycles++;
	pthread_mutex_lock(&s->e->mu);
	bool failed = s->failed;
	pthread_mutex_unlock(&s->e->mu);
	if (stop || failed) {
		s->over = true;
		return NEG_END;
	}
	return NEG_RAN;
}

static void *set_main(void *arg)
{
	eset *s = arg;

	if (s->size == 1) {
		solo_loop(s);
		execute_dev_release(s); /* on this thread, where its context is bound */
		return NULL;
	}
	/*
	 * The set's loop: turns under the baton, and between them, when there is nothing to
	 * do, a wait with the baton let go, for a waiting caller to take: for the comm's spin
	 * time after a cycle a poll of the transports (more is likely to come soon), then a
	 * sleep in them.
	 */
	const uint64_t spin_ns = s->ctl->cc.spin_ns;
	uint64_t hot_until = 0;
	for (;;) {
		ctl_yield y;
		pthread_mutex_lock(&s->drive);
		int t = s->over ? NEG_END : set_turn(s, &y);
		if (t == NEG_END)
			negotiate_release(s);
		pthread_mutex_unlock(&s->drive);
		if (t == NEG_END)
			break;
		uint64_t now = kclock_ns();
		if (t == NEG_RAN) {
			hot_until = now + spin_ns;
		} else if (now < hot_until) {
			y.ms = 0;
			ctl_sleep(s, &y);
			sched_yield(); /* the application's threads share the cores (ctl.c) */
		} else {
			ctl_sleep(s, &y);
		}
	}
	execute_dev_release(s);
	/* Whatever is left (after a failure, or a stop) completes now. */
	kerr x;
	pthread_mutex_lock(&s->e->mu);
	bool failed = s->failed;
	if (failed)
		x = s->err;
	else
		kerr_set(&x, KHOR_ERR_INVALID_ARG, "rank %d, engine set %d: the engine was stopped "
		         "before this tensor completed", s->user->ctx->rank, s->id);
	if (!failed) {
		/* Not a failure of the set: no error log, and the set stays usable for nothing. */
		s->failed = true;
		s->err = x;
	} else if (s->stop_sent) {
		/* It failed once this rank had asked to stop: khor_engine_stop's own error. */
		s->stop_failed = true;
	}
	pthread_mutex_unlock(&s->e->mu);
	queue_fail_set(s, &x);
	return NULL;
}

/* A private split of comm (every member calls it): the engine's traffic never meets the
 * caller's own collectives on comm. */
static khor_status dup_comm(khor_comm *comm, khor_comm **out, kerr *err)
{
	struct khor_request r;
	khor_status st;

	memset(&r, 0, sizeof(r));
	r.kind = COLL_SPLIT;
	r.color = 0;
	r.key = comm->rank;
	st = comm_run(comm, &r);
	if (st != KHOR_SUCCESS) {
		*err = r.err;
		return st;
	}
	*out = r.newcomm;
	return KHOR_SUCCESS;
}

static void set_free(eset *s)
{
	if (s == NULL)
		return;
	/* Handles that outlive the set must not reach for its names map. */
	pthread_mutex_lock(&s->e->mu);
	queue_release_all_locked(s);
	pthread_mutex_unlock(&s->e->mu);
	table_free(s);
	if (s->ctl != NULL)
		negotiate_release(s); /* nothing left: the set's loop let it go */
	execute_dev_release(s); /* nothing left, unless its thread never ended */
	fusion_release(s);
	if (s->data != NULL)
		comm_free(s->data);
	if (s->ctl != NULL)
		comm_free(s->ctl);
	free(s->peer_stop);
	emap_free(&s->names);
	emap_free(&s->keys);
	response_cache_free(&s->cache);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->drive);
	free(s);
}

khor_status engine_add_set(struct khor_engine *e, khor_comm *comm, int *id_out, kerr *err)
{
	eset *s = calloc(1, sizeof(*s));
	khor_status st;

	if (s == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "engine: out of memory");
	s->e = e;
	s->user = comm;
	s->rank = comm->rank;
	s->size = comm->size;
	s->id = e->nsets == 0 ? 0 : (int)comm->id;
	klist_init(&s->fresh);
	klist_init(&s->pending);
	klist_init(&s->named);
	klist_init(&s->arrivals);
	pthread_cond_init(&s->cv, NULL);
	pthread_mutex_init(&s->drive, NULL);
	atomic_init(&s->woken, false);
	s->cache.cap = e->s.cache_capacity;
	s->first_stopper = -1;
	if (e->nsets > 0 && find_set(e, s->id) != NULL) {
		set_free(s);
		return bad(err, "comm %s is already a process set of this engine", comm->name);
	}
	if (comm->ctx != e->comm->ctx) {
		set_free(s);
		return bad(err, "comm %s belongs to another khor_init than the engine's comm",
		           comm->name);
	}
	if ((st = dup_comm(comm, &s->data, err)) != KHOR_SUCCESS) {
		set_free(s);
		return st;
	}
	if (s->size > 1) {
		if ((st = dup_comm(comm, &s->ctl, err)) != KHOR_SUCCESS) {
			set_free(s);
			return st;
		}
		if ((s->peer_stop = calloc((size_t)s->size, sizeof(bool))) == NULL) {
			set_free(s);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "engine: out of memory");
		}
		if (s->rank == 0) {
			s->joined_r = calloc((size_t)s->size, sizeof(bool));
			s->stop_r = calloc((size_t)s->size, sizeof(bool));
			s->stop_told = calloc((size_t)s->size, sizeof(bool));
			if (s->joined_r == NULL || s->stop_r == NULL || s->stop_told == NULL) {
				set_free(s);
				return kerr_set(err, KHOR_ERR_NO_MEMORY, "engine: out of memory");
			}
		}
	}
	pthread_mutex_lock(&e->mu);
	if (e->nsets == e->cap) {
		int cap = e->cap == 0 ? 4 : e->cap * 2;
		eset **v = realloc(e->sets, sizeof(*v) * (size_t)cap);
		if (v == NULL) {
			pthread_mutex_unlock(&e->mu);
			set_free(s);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "engine: out of memory");
		}
		e->sets = v;
		e->cap = cap;
	}
	if (pthread_create(&s->thread, NULL, set_main, s) != 0) {
		pthread_mutex_unlock(&e->mu);
		set_free(s);
		return kerr_set(err, KHOR_ERR_SYSTEM, "engine: cannot start the set's thread");
	}
	s->started = true;
	e->sets[e->nsets++] = s;
	pthread_mutex_unlock(&e->mu);
	*id_out = s->id;
	return KHOR_SUCCESS;
}

static void engine_free(struct khor_engine *e)
{
	if (e->efd >= 0)
		close(e->efd);
	free(e->sets);
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	pthread_mutex_destroy(&e->tl_mu);
	free(e);
}

khor_status engine_start(khor_comm *comm, const khor_config *cfg, struct khor_engine **out,
                         kerr *err)
{
	struct khor_engine *e = calloc(1, sizeof(*e));
	khor_status st;
	int id;

	if (e == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "engine: out of memory");
	e->comm = comm;
	e->refs = 1;
	pthread_mutex_init(&e->mu, NULL);
	pthread_mutex_init(&e->tl_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* engine_wait's timed waits */
	pthread_cond_init(&e->cv, &ca);
	pthread_condattr_destroy(&ca);
	e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->efd < 0) {
		char b[128];
		st = kerr_set(err, KHOR_ERR_SYSTEM, "engine: eventfd: %s",
		              kerr_errno_str(errno, b, sizeof(b)));
		engine_free(e);
		return st;
	}
	if ((st = settings_read(cfg, &e->s, err)) != KHOR_SUCCESS) {
		engine_free(e);
		return st;
	}
	atomic_init(&e->fusion_bytes, e->s.fusion_bytes);
	atomic_init(&e->cycle_us, (uint64_t)(e->s.cycle_ms * 1000.0));
	/*
	 * HOROVOD_TIMELINE=DYNAMIC (Horovod's word): no file now; the script starts one later
	 * (hvd.start_timeline, khor_engine_timeline_start). It once made a file named DYNAMIC.
	 */
	if (e->s.timeline[0] != '\0' && strcmp(e->s.timeline, "DYNAMIC") != 0 &&
	    (st = engine_timeline(e, e->s.timeline, e->s.mark_cycles, err)) != KHOR_SUCCESS) {
		engine_free(e);
		return st;
	}
	if (e->s.autotune && comm->rank == 0) {
		e->at = autotune_create(&e->s, comm->rank, err);
		if (e->at == NULL) {
			timeline_close(e->tl);
			engine_free(e);
			return err->status;
		}
	}
	if ((st = engine_add_set(e, comm, &id, err)) != KHOR_SUCCESS) {
		timeline_close(e->tl);
		autotune_free(e->at);
		engine_free(e);
		return st;
	}
	*out = e;
	return KHOR_SUCCESS;
}

khor_status engine_remove_set(struct khor_engine *e, int id, kerr *err)
{
	eset *s = NULL;
	int at = -1;

	if (id == 0)
		return bad(err, "khor_engine_remove_process_set: set 0 is the engine's own comm; "
		           "stop the engine instead");
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nsets; i++) {
		if (e->sets[i]->id == id) {
			s = e->sets[i];
			at = i;
		}
	}
	if (s != NULL)
		set_stop_locked(s);
	pthread_mutex_unlock(&e->mu);
	if (s == NULL)
		return bad(err, "khor_engine_remove_process_set: no process set %d", id);
	/* The set's own negotiated stop: every member asks, then its thread ends. */
	set_wake(s);
	if (s->started)
		pthread_join(s->thread, NULL);
	pthread_mutex_lock(&e->mu);
	for (int i = at; i + 1 < e->nsets; i++)
		e->sets[i] = e->sets[i + 1];
	e->nsets--;
	pthread_mutex_unlock(&e->mu);
	khor_status st = KHOR_SUCCESS;
	if (s->stop_failed)
		st = kerr_set(err, s->err.status, "khor_engine_remove_process_set(%d): %s", id,
		              s->err.text);
	set_free(s);
	return st;
}

khor_status engine_stop(struct khor_engine *e, kerr *err)
{
	bool free_it;

	kerr_clear(err);
	pthread_mutex_lock(&e->mu);
	e->stopped = true;
	for (int i = 0; i < e->nsets; i++)
		set_stop_locked(e->sets[i]);
	pthread_mutex_unlock(&e->mu);
	for (int i = 0; i < e->nsets; i++) {
		set_wake(e->sets[i]);
		if (e->sets[i]->started)
			pthread_join(e->sets[i]->thread, NULL);
	}
	khor_status st = KHOR_SUCCESS;
	for (int i = 0; i < e->nsets && st == KHOR_SUCCESS; i++)
		if (e->sets[i]->stop_failed)
			st = kerr_set(err, e->sets[i]->err.status, "%s", e->sets[i]->err.text);
	pthread_mutex_lock(&e->tl_mu);
	atomic_store(&e->tl_on, false);
	timeline_close(e->tl);
	e->tl = NULL;
	pthread_mutex_unlock(&e->tl_mu);
	autotune_free(e->at);
	e->at = NULL;
	/* Sets in reverse: their comms were split from one another's parents. */
	for (int i = e->nsets - 1; i >= 0; i--) {
		/* Handles that outlive the engine point at their set: keep only what they use. */
		set_free(e->sets[i]);
	}
	pthread_mutex_lock(&e->mu);
	e->nsets = 0;
	engine_unref_locked(e, &free_it);
	pthread_mutex_unlock(&e->mu);
	if (free_it)
		engine_free(e);
	return st;
}

/*
 * The timeline's file for this rank: "%r" in the path becomes the rank, and each rank
 * writes its own; without it only rank 0 writes (the coordinator of set 0, which sees when
 * every rank became ready).
 */
khor_status engine_timeline(struct khor_engine *e, const char *path, bool mark, kerr *err)
{
	struct timeline *t = NULL;
	int rank = e->comm->rank;
	char buf[600];

	if (path != NULL) {
		const char *pct = strstr(path, "%r");
		if (pct != NULL)
			snprintf(buf, sizeof(buf), "%.*s%d%s", (int)(pct - path), path, rank, pct + 2);
		else
			kstrlcpy(buf, path, sizeof(buf));
		if (pct == NULL && rank != 0)
			return KHOR_SUCCESS;
	}
	/*
	 * The old timeline is closed before the new one opens: a restart into the same path
	 * would otherwise truncate the file under the old stream, whose closing "]" then lands
	 * past the new events (found in review). Events in between are not recorded.
	 */
	pthread_mutex_lock(&e->tl_mu);
	atomic_store(&e->tl_on, false);
	timeline_close(e->tl);
	e->tl = NULL;
	if (path != NULL && (t = timeline_open(buf, rank, mark, err)) == NULL) {
		pthread_mutex_unlock(&e->tl_mu);
		return err->status;
	}
	e->tl = t;
	atomic_store(&e->tl_on, t != NULL);
	pthread_mutex_unlock(&e->tl_mu);
	return KHOR_SUCCESS;
}

/*
 * engine_wait passed KHOR_TIMEOUT (under e->mu, let go meanwhile): while the engine's ranks
 * are alive it waits on (a later *dl); a handle in its collective is judged there, and
 * warned about there, so this check of it is quiet. Else the handle's error says who is not
 * alive.
 */
static khor_status wait_alive(khor_handle *h, uint64_t t0, kdeadline *dl)
{
	struct khor_engine *e = h->eng;
	char what[KERR_TEXT_MAX / 2];
	int64_t again;
	kerr err;

	snprintf(what, sizeof(what), "waiting for '%s' (%s)", h->key,
	         h->in_cycle ? "in its collective" : "for every rank to submit it");
	coll_alive_ask q = { .what = h->in_cycle ? NULL : what,
	                     .waited_ms = (int64_t)((kclock_ns() - t0) / 1000000) };
	pthread_mutex_unlock(&e->mu);
	khor_status st = e->comm->cc.check_alive(e->comm, &q, &again, &err);
	pthread_mutex_lock(&e->mu);
	if (st == KHOR_SUCCESS)
		*dl = kdeadline_in_ms(again);
	else if (!h->done)
		kerr_set(&h->err, st, "'%s': %s", h->key, err.text);
	return st;
}

/*
 * A caller waiting for h runs the set's turns itself while the set thread sleeps (its baton
 * is free then): a lone call costs no hand-off to the set thread and back, the two
 * wake-ups that were most of its time (docs/PERFORMANCE.md). It drives until h completes,
 * or until a turn has found nothing to do for the length of a spin (then the set thread
 * listens again, as it always has, and this thread waits below). It leaves to the set
 * thread the sets whose tensors are not in host memory (their device context is bound
 * there, and the caller's thread keeps its own) and a stop under way. Completion callbacks
 * of the handles its turns complete run on this thread.
 */
/*
 * Whether h is the only handle its set has in flight (under mu): a lone call. With more
 * (a backward pass's gradients, enqueued by one thread while another waits), the set
 * thread runs the cycles as before: a waiting caller that drove them took the core from
 * the thread still enqueueing (measured at n = 2 over shm on 2 cores: 64 tensors of 8 B
 * 1.69x their time, 1000 of 4 KiB 1.59x).
 */
static bool alone_locked(const khor_handle *h)
{
	const eset *s = h->set;
	const klist *f = &s->fresh, *p = &s->pending;

	if (klist_empty(f))
		return p->next == &h->link && p->prev == &h->link;
	return klist_empty(p) && f->next == &h->link && f->prev == &h->link;
}

static void drive_while_waiting(khor_handle *h)
{
	struct khor_engine *e = h->eng;
	eset *s = NULL;

	/*
	 * Not done: its set is alive (a set ends only once its handles have completed). The
	 * trylock never blocks, so taking it under mu keeps the lock order (baton, then mu).
	 * The set thread holds the baton only for a look of a microsecond or so between its
	 * sleeps, unless a cycle is under way: a few tries, a yield of the core between them.
	 */
	for (int tries = 0; s == NULL && tries < 20; tries++) {
		bool busy = false;
		pthread_mutex_lock(&e->mu);
		if (!h->done && !h->set->stop && !h->set->failed && !h->set->dev_seen &&
		    alone_locked(h)) {
			if (pthread_mutex_trylock(&h->set->drive) == 0)
				s = h->set;
			else
				busy = true;
		}
		pthread_mutex_unlock(&e->mu);
		if (!busy)
			break;
		if (s == NULL)
			sched_yield();
	}
	if (s == NULL)
		return;
	s->caller = true;
	while (!s->over && !atomic_load_explicit(&h->done_flag, memory_order_acquire)) {
		pthread_mutex_lock(&e->mu);
		bool leave = s->stop || s->dev_seen;
		pthread_mutex_unlock(&e->mu);
		if (leave)
			break;
		if (s->size == 1) {
			if (!solo_turn(s))
				pthread_cond_broadcast(&s->cv); /* it failed: the set thread ends */
			break;
		}
		ctl_yield y;
		if (set_turn(s, &y) != NEG_RAN)
			break;
	}
	s->caller = false;
	pthread_mutex_unlock(&s->drive);
}

khor_status engine_wait(khor_handle *h)
{
	struct khor_engine *e = h->eng;
	khor_status st;
	int64_t t = e->comm->ctx->cfg.timeout_ms;
	kdeadline dl = kdeadline_in_ms(t);
	const uint64_t t0 = kclock_ns();

	drive_while_waiting(h);
	/*
	 * A short spin first, when this rank has a core for it besides the set thread's: a
	 * small tensor's whole round is often shorter than a wake-up. Without one, spinning
	 * takes the core the set thread needs: measured on 2 cores, 2 ranks, a lone 8-byte
	 * allreduce took 30-107 us with a 20 us spin and 7.5-7.9 us without.
	 */
	uint64_t spin_until = kclock_ns() + (e->comm->cc.max_spinners >= 2 ? 20000 : 0);
	while (!atomic_load_explicit(&h->done_flag, memory_order_acquire) &&
	       kclock_ns() < spin_until)
		;
	pthread_mutex_lock(&e->mu);
	while (!h->done) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&e->cv, &e->mu, &ts);
		if (!h->done && kdeadline_passed(dl) && e->comm->cc.check_alive != NULL) {
			st = wait_alive(h, t0, &dl);
			if (st == KHOR_SUCCESS || h->done)
				continue;
			pthread_mutex_unlock(&e->mu);
			return st;
		}
		if (!h->done && kdeadline_passed(dl)) {
			kerr_set(&h->err, KHOR_ERR_TIMEOUT, "'%s' did not complete within KHOR_TIMEOUT "
			         "(%lld ms); it waits for %s (the coordinator's stall warnings name the "
			         "ranks that have not submitted it)", h->key, (long long)t,
			         h->in_cycle ? "its collective" : "every rank to submit it");
			pthread_mutex_unlock(&e->mu);
			return KHOR_ERR_TIMEOUT;
		}
	}
	st = h->status;
	queue_release_locked(h);
	pthread_mutex_unlock(&e->mu);
	return st;
}

khor_status engine_test(khor_handle *h)
{
	struct khor_engine *e = h->eng;
	khor_status st;

	if (!atomic_load_explicit(&h->done_flag, memory_order_acquire))
		return KHOR_IN_PROGRESS;
	pthread_mutex_lock(&e->mu);
	st = h->status;
	queue_release_locked(h);
	pthread_mutex_unlock(&e->mu);
	return st;
}

khor_status engine_set_callback(khor_handle *h, khor_done_fn fn, void *arg)
{
	struct khor_engine *e = h->eng;

	pthread_mutex_lock(&e->mu);
	if (!h->done) {
		h->cb = fn;
		h->cb_arg = arg;
		pthread_mutex_unlock(&e->mu);
		return KHOR_SUCCESS;
	}
	khor_status st = h->status;
	queue_release_locked(h);
	pthread_mutex_unlock(&e->mu);
	fn(arg, h, st);
	return KHOR_SUCCESS;
}

void engine_handle_free(khor_handle *h)
{
	struct khor_engine *e = h->eng;
	bool free_engine = false;

	pthread_mutex_lock(&e->mu);
	if (!h->done || h->in_cb) {
		h->detached = true;
		pthread_mutex_unlock(&e->mu);
		return;
	}
	queue_release_locked(h);
	queue_handle_free(h);
	engine_unref_locked(e, &free_engine);
	pthread_mutex_unlock(&e->mu);
	if (free_engine)
		engine_free(e);
}
