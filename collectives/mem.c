/*
 * mem.c -- the backend-independent half of the memory seam (mem.h): finding a pointer's
 * kind, host waits on events with a deadline, and a comm's device state: its stream, its
 * grow-only device buffers, its pinned staging slots and its events.
 */
#include "mem.h"

#include "base/log.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifdef KHOR_HAVE_CUDA_KERNELS
extern const kmem_backend kmem_cuda_backend;
#endif

/* The built-in backends, and room ahead of them for those a test adds (kmem_backend_add). */
#define KMEM_BACKENDS_ADDED 4
const kmem_backend *kmem_backends[KMEM_BACKENDS_ADDED + 2] = {
#ifdef KHOR_HAVE_CUDA_KERNELS
	&kmem_cuda_backend,
#endif
	NULL,
};
static int nadded;

bool kmem_backend_add(const kmem_backend *be)
{
	int n = 0;

	if (nadded == KMEM_BACKENDS_ADDED)
		return false;
	while (kmem_backends[n] != NULL)
		n++;
	memmove(&kmem_backends[1], &kmem_backends[0], (size_t)(n + 1) * sizeof(kmem_backends[0]));
	kmem_backends[0] = be;
	nadded++;
	return true;
}

void kmem_query(const void *p, kmem_where *out)
{
	out->kind = KMEM_HOST;
	out->be = NULL;
	out->device = -1;
	out->ctx = NULL;
	if (p == NULL)
		return;
	for (int i = 0; kmem_backends[i] != NULL; i++)
		if (kmem_backends[i]->query(p, out))
			return;
}

const char *kmem_describe(const kmem_where *w, char *buf, size_t len)
{
	switch (w->kind) {
	case KMEM_PINNED:
		snprintf(buf, len, "pinned host memory (%s)", w->be != NULL ? w->be->name : "?");
		break;
	case KMEM_DEVICE:
		/* "cuda device 0 memory", "emulated device 0 memory" */
		snprintf(buf, len, "%s%s %d memory", w->be != NULL ? w->be->name : "?",
		         w->be != NULL && strstr(w->be->name, "device") != NULL ? "" : " device",
		         w->device);
		break;
	default:
		snprintf(buf, len, "host memory");
		break;
	}
	return buf;
}

khor_status kmem_event_wait(const kmem_backend *be, void *ev, kdeadline dl, const char *what,
                            kerr *err)
{
	const struct timespec nap = { 0, 20000 };

	for (unsigned i = 0;; i++) {
		bool done = false;
		khor_status st = be->event_query(ev, &done, err);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "waiting for the %s stream (%s)", be->name, what);
			return st;
		}
		if (done)
			return KHOR_SUCCESS;
		if (kdeadline_passed(dl))
			return kerr_set(err, KHOR_ERR_TIMEOUT, "waiting for the %s stream (%s): timed "
			                "out (KHOR_TIMEOUT); the device is hung or the stream waits for "
			                "work that never comes", be->name, what);
		/* Spin briefly: a copy of a slice takes microseconds. Then nap. */
		if (i < 64)
			sched_yield();
		else
			nanosleep(&nap, NULL);
	}
}

khor_status kmem_stream_sync(const kmem_backend *be, void *stream, kdeadline dl,
                             const char *what, kerr *err)
{
	void *ev;
	khor_status st = be->event_create(&ev, err);

	if (st != KHOR_SUCCESS)
		return st;
	st = be->event_record(ev, stream, err);
	if (st == KHOR_SUCCESS)
		st = kmem_event_wait(be, ev, dl, what, err);
	be->event_destroy(ev);
	return st;
}

/* Frees everything that belongs to the device st last ran on (its stream waited for first). */
static void state_release(kmem_state *st)
{
	const kmem_backend *be = st->dev_be;
	void *prev;
	kerr ignore;

	if (be == NULL)
		return;
	prev = be->current != NULL ? be->current() : NULL;
	if (be->bind(st->dev_ctx, &ignore) != KHOR_SUCCESS)
		goto forget; /* the context is gone: so is what was in it */
	/*
	 * Nothing may still run on what is freed below: the own stream's work, the last call's
	 * on a stream of the caller's (a stream form the caller has not waited for yet), and
	 * the copies out of the staging slots.
	 */
	const kdeadline dl = kdeadline_in_ms(5000);
	bool idle = true;
	if (st->own_stream != NULL)
		idle &= kmem_stream_sync(be, st->own_stream, dl, "freeing a comm", &ignore) ==
		        KHOR_SUCCESS;
	if (st->last_set)
		idle &= kmem_event_wait(be, st->last_ev, dl, "freeing a comm", &ignore) ==
		        KHOR_SUCCESS;
	for (int i = 0; i < KMEM_POOL_SLOTS; i++)
		if (st->pool[i].after != NULL)
			idle &= kmem_event_wait(be, st->pool[i].after, dl, "freeing a comm",
			                        &ignore) == KHOR_SUCCESS;
	if (!idle) {
		/* Better a leak than a device writing into freed memory. */
		KLOG_WARN("freeing a comm's %s memory: its streams did not finish within 5 s; "
		          "its device buffers and pinned staging memory are left allocated",
		          be->name);
		goto forget;
	}
	for (int i = 0; i < KMEM_POOL_SLOTS; i++) {
		if (st->pool[i].after != NULL)
			be->event_destroy(st->pool[i].after);
		if (st->pool[i].p != NULL)
			be->host_free(st->pool[i].p);
	}
	if (st->scratch != NULL)
		be->dev_free(st->scratch);
	if (st->big != NULL)
		be->dev_free(st->big);
	if (st->tmp != NULL)
		be->dev_free(st->tmp);
	for (int i = 0; i < st->nevents; i++)
		be->event_destroy(st->events[i]);
	if (st->last_ev != NULL)
		be->event_destroy(st->last_ev);
	if (st->own_stream != NULL)
		be->stream_destroy(st->own_stream);
	if (be->restore != NULL && prev != st->dev_ctx)
		be->restore(prev);
forget:
	memset(st, 0, sizeof(*st));
}

khor_status kmem_state_begin(kmem_state *st, const kmem_where *where, bool given,
                             void *stream, size_t scratch_len, kerr *err)
{
	const kmem_backend *be = where->be;
	khor_status s;

	if (st->dev_be != NULL && (st->dev_be != be || st->dev_ctx != where->ctx ||
	                           st->device != where->device))
		state_release(st);
	st->prev_ctx = be->current != NULL ? be->current() : NULL;
	if ((s = be->bind(where->ctx, err)) != KHOR_SUCCESS)
		return s;
	st->dev_be = be;
	st->dev_ctx = where->ctx;
	st->device = where->device;
	if (!given && st->own_stream == NULL &&
	    (s = be->stream_create(&st->own_stream, err)) != KHOR_SUCCESS)
		return s;
	st->stream = given ? stream : st->own_stream;
	if (st->last_set && st->last_stream != st->stream &&
	    (s = be->stream_wait_event(st->stream, st->last_ev, err)) != KHOR_SUCCESS)
		return s;
	if (st->scratch == NULL || st->scratch_len < scratch_len) {
		if (st->scratch != NULL) {
			s = kmem_stream_sync(be, st->stream, kdeadline_in_ms(5000),
			                     "growing the device scratch", err);
			if (s != KHOR_SUCCESS)
				return s; /* not freed under work that may still use it */
			be->dev_free(st->scratch);
			st->scratch = NULL;
		}
		if ((s = be->dev_alloc(scratch_len, &st->scratch, err)) != KHOR_SUCCESS)
			return s;
		st->scratch_len = scratch_len;
	}
	st->be = be;
	return KHOR_SUCCESS;
}

void kmem_state_end(kmem_state *st)
{
	kerr ignore;

	if (st->be != NULL && (st->last_ev != NULL ||
	                       st->be->event_create(&st->last_ev, &ignore) == KHOR_SUCCESS))
		st->last_set = st->be->event_record(st->last_ev, st->stream, &ignore) == KHOR_SUCCESS;
	st->last_stream = st->stream;
	if (st->be != NULL && st->be->restore != NULL && st->prev_ctx != st->dev_ctx)
		st->be->restore(st->prev_ctx);
	st->be = NULL;
	st->stream = NULL;
}

void kmem_state_destroy(kmem_state *st)
{
	state_release(st);
}

void *kmem_state_buffer(kmem_state *st, int which, size_t len, kerr *err)
{
	void **p = which == 0 ? &st->big : &st->tmp;
	size_t *plen = which == 0 ? &st->big_len : &st->tmp_len;
	const kmem_backend *be = st->dev_be;

	if (be == NULL)
		return NULL;
	if (*plen >= len && *p != NULL)
		return *p;
	if (*p != NULL) {
		/* Work queued on the old buffer must have run before it goes. */
		if (kmem_stream_sync(be, st->stream, kdeadline_in_ms(5000), "growing a device buffer",
		                     err) != KHOR_SUCCESS)
			return NULL;
		be->dev_free(*p);
		*p = NULL;
		*plen = 0;
	}
	/* Round up, so a sequence of slightly larger calls does not free and allocate each time. */
	size_t want = len < 4096 ? 4096 : len + len / 8;
	if (be->dev_alloc(want, p, err) != KHOR_SUCCESS)
		return NULL;
	*plen = want;
	return *p;
}

khor_status kmem_pool_get(kmem_state *st, size_t len, int *slot_out, kerr *err)
{
	const kmem_backend *be = st->dev_be;
	int best = -1, empty = -1, spare = -1;

	for (int i = 0; i < KMEM_POOL_SLOTS; i++) {
		kmem_pool_slot *s = &st->pool[i];
		bool done = false;
		kerr ignore;
		if (s->busy && s->after != NULL &&
		    be->event_query(s->after, &done, &ignore) == KHOR_SUCCESS && done) {
			kmem_event_put(st, s->after);
			s->after = NULL;
			s->busy = false;
		}
		if (s->busy)
			continue;
		if (s->p == NULL) {
			if (empty < 0)
				empty = i;
		} else if (s->len >= len) {
			if (best < 0 || s->len < st->pool[best].len)
				best = i;
		} else if (spare < 0) {
			spare = i;
		}
	}
	if (best < 0) {
		/* Slots are 64 KiB to the next power of two: a few sizes serve every schedule. */
		size_t want = 65536;
		while (want < len)
			want *= 2;
		if (empty < 0 && spare >= 0) {
			be->host_free(st->pool[spare].p);
			st->pool[spare].p = NULL;
			empty = spare;
		}
		if (empty < 0)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "staging device memory: all %d pinned "
			                "slots are in use", KMEM_POOL_SLOTS);
		khor_status s = be->host_alloc(want, &st->pool[empty].p, err);
		if (s != KHOR_SUCCESS) {
			kerr_prefix(err, "allocating a %zu B pinned staging buffer", want);
			return s;
		}
		st->pool[empty].len = want;
		best = empty;
	}
	st->pool[best].busy = true;
	*slot_out = best;
	return KHOR_SUCCESS;
}

void kmem_pool_put(kmem_state *st, int slot)
{
	if (slot >= 0 && slot < KMEM_POOL_SLOTS)
		st->pool[slot].busy = false;
}

void kmem_pool_put_after(kmem_state *st, int slot, void *ev)
{
	if (slot >= 0 && slot < KMEM_POOL_SLOTS)
		st->pool[slot].after = ev;
}

khor_status kmem_event_get(kmem_state *st, void **ev_out, kerr *err)
{
	if (st->nevents > 0) {
		*ev_out = st->events[--st->nevents];
		return KHOR_SUCCESS;
	}
	return st->dev_be->event_create(ev_out, err);
}

void kmem_event_put(kmem_state *st, void *ev)
{
	if (ev == NULL)
		return;
	if (st->nevents < KMEM_EVENTS)
		st->events[st->nevents++] = ev;
	else
		st->dev_be->event_destroy(ev);
}
