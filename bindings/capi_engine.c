/*
 * capi_engine.c -- the exported engine ABI (include/khor.h, "The engine"): argument checks
 * and error texts, then engine/engine.c.
 *
 * A failed call leaves its sentence in khor_engine_error, prefixed with this rank and host,
 * as khor_comm_error does for the direct collectives.
 */
#include "khor.h"

#include "base/err.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static khor_status failed(struct khor_engine *e, const kerr *err)
{
	pthread_mutex_lock(&e->mu);
	kerr_set(&e->last, err->status, "rank %d on %s, engine: %s", e->comm->ctx->rank,
	         e->comm->ctx->cfg.hostname, err->text);
	pthread_mutex_unlock(&e->mu);
	return err->status;
}

KHOR_API khor_status khor_engine_start(khor_comm *comm, const khor_config *config,
                                       khor_engine **engine_out)
{
	kerr err;
	khor_status st;

	if (comm == NULL || engine_out == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&err);
	st = engine_start(comm, config, engine_out, &err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(&err, "rank %d on %s, khor_engine_start", comm->ctx->rank,
		            comm->ctx->cfg.hostname);
		comm_set_last(comm, &err);
	}
	return st;
}

KHOR_API khor_status khor_engine_stop(khor_engine *engine)
{
	kerr err;

	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	/* The engine is gone once stopped: its error goes to its comm's khor_comm_error. */
	khor_comm *comm = engine->comm;
	khor_status st = engine_stop(engine, &err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(&err, "rank %d on %s, khor_engine_stop", comm->ctx->rank,
		            comm->ctx->cfg.hostname);
		comm_set_last(comm, &err);
	}
	return st;
}

KHOR_API const char *khor_engine_error(const khor_engine *engine)
{
	static _Thread_local char text[KERR_TEXT_MAX];
	struct khor_engine *e = (struct khor_engine *)engine;

	if (engine == NULL)
		return "engine is NULL";
	pthread_mutex_lock(&e->mu);
	kstrlcpy(text, e->last.text, sizeof(text));
	pthread_mutex_unlock(&e->mu);
	return text;
}

KHOR_API khor_status khor_engine_add_process_set(khor_engine *engine, khor_comm *comm,
                                                 int *set_out)
{
	kerr err;
	khor_status st;
	int id;

	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&err);
	if (comm == NULL || set_out == NULL) {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "khor_engine_add_process_set: NULL %s",
		         comm == NULL ? "comm" : "set_out");
		return failed(engine, &err);
	}
	st = engine_add_set(engine, comm, &id, &err);
	if (st != KHOR_SUCCESS)
		return failed(engine, &err);
	*set_out = id;
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_engine_remove_process_set(khor_engine *engine, int set)
{
	kerr err;

	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&err);
	if (engine_remove_set(engine, set, &err) != KHOR_SUCCESS)
		return failed(engine, &err);
	return KHOR_SUCCESS;
}

KHOR_API int khor_engine_fd(const khor_engine *engine)
{
	return engine == NULL ? -1 : engine->efd;
}

KHOR_API khor_status khor_engine_timeline_start(khor_engine *engine, const char *path,
                                                int mark_cycles)
{
	kerr err;

	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&err);
	if (path == NULL || path[0] == '\0') {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "khor_engine_timeline_start: no path");
		return failed(engine, &err);
	}
	if (engine_timeline(engine, path, mark_cycles != 0, &err) != KHOR_SUCCESS)
		return failed(engine, &err);
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_engine_timeline_stop(khor_engine *engine)
{
	kerr err;

	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	return engine_timeline(engine, NULL, false, &err);
}

KHOR_API khor_status khor_engine_tuning(const khor_engine *engine, int64_t *fusion_bytes_out,
                                        double *cycle_ms_out)
{
	if (engine == NULL)
		return KHOR_ERR_INVALID_ARG;
	if (fusion_bytes_out != NULL)
		*fusion_bytes_out = (int64_t)atomic_load(&engine->fusion_bytes);
	if (cycle_ms_out != NULL)
		*cycle_ms_out = (double)atomic_load(&engine->cycle_us) / 1000.0;
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_engine_stats(const khor_engine *engine, int set, uint64_t *cycles_out,
                                       uint64_t *negotiate_ns_out, uint64_t *bytes_out)
{
	struct khor_engine *e = (struct khor_engine *)engine;
	eset *s = NULL;

	if (e == NULL)
		return KHOR_ERR_INVALID_ARG;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nsets; i++)
		if (e->sets[i]->id == set)
			s = e->sets[i];
	if (s != NULL) {
		if (cycles_out != NULL)
			*cycles_out = atomic_load(&s->cycles);
		if (negotiate_ns_out != NULL)
			*negotiate_ns_out = atomic_load(&s->negotiate_ns);
		if (bytes_out != NULL)
			*bytes_out = atomic_load(&s->bytes_done);
	}
	pthread_mutex_unlock(&e->mu);
	return s != NULL ? KHOR_SUCCESS : KHOR_ERR_INVALID_ARG;
}

/* Every enqueue ends here. */
static khor_status enqueue(khor_engine *e, int set, int kind, int n, const eng_targ *ta,
                           khor_op op, double pre, double post, int root, khor_alloc_fn alloc,
                           void *alloc_arg, khor_handle **handle_out)
{
	kerr err;
	khor_handle *h;
	khor_status st;

	if (e == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&err);
	if (handle_out == NULL) {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "%s: handle_out is NULL", eng_kind_name(kind));
		return failed(e, &err);
	}
	st = engine_enqueue(e, set, kind, n, ta, op, pre, post, root, alloc, alloc_arg, &h, &err);
	if (st != KHOR_SUCCESS)
		return failed(e, &err);
	*handle_out = h;
	return KHOR_SUCCESS;
}

static eng_targ one(const char *name, const void *in, void *out, khor_dtype dtype, int ndim,
                    const int64_t *dims)
{
	eng_targ t = { name, in, out, dtype, ndim, dims, NULL, NULL };
	return t;
}

/* The tensors of a grouped call; NULL (and the error recorded) when the arrays are bad. */
static eng_targ *group(khor_engine *e, const char *fn, int n, const char *const *names,
                       const void *const *inputs, void *const *outputs,
                       const khor_dtype *dtypes, const int *ndims, const int64_t *dims)
{
	kerr err;
	eng_targ *t;
	size_t off = 0;

	if (n < 1 || names == NULL || inputs == NULL || dtypes == NULL || ndims == NULL) {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "%s: %d tensors, or a NULL array", fn, n);
		failed(e, &err);
		return NULL;
	}
	t = calloc((size_t)n, sizeof(*t));
	if (t == NULL) {
		kerr_set(&err, KHOR_ERR_NO_MEMORY, "%s: out of memory", fn);
		failed(e, &err);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		if (ndims[i] > 0 && dims == NULL) {
			free(t);
			kerr_set(&err, KHOR_ERR_INVALID_ARG, "%s: dims is NULL", fn);
			failed(e, &err);
			return NULL;
		}
		t[i] = one(names[i], inputs[i], outputs != NULL ? outputs[i] : NULL, dtypes[i],
		           ndims[i], ndims[i] > 0 ? dims + off : NULL);
		off += ndims[i] > 0 ? (size_t)ndims[i] : 0;
	}
	return t;
}

/* A grouped call: the arrays checked and turned into tensors, then one enqueue. ready: the
 * inputs' ready events (n, any NULL), or NULL. */
static khor_status grouped(khor_engine *e, int set, int kind, const char *fn, int n,
                           const char *const *names, const void *const *inputs,
                           void *const *outputs, const khor_dtype *dtypes, const int *ndims,
                           const int64_t *dims, khor_op op, double pre, double post,
                           khor_alloc_fn alloc, void *alloc_arg, void *const *ready,
                           khor_handle **handle_out)
{
	if (e == NULL)
		return KHOR_ERR_INVALID_ARG;
	eng_targ *t = group(e, fn, n, names, inputs, outputs, dtypes, ndims, dims);
	if (t == NULL)
		return e->last.status;
	for (int i = 0; ready != NULL && i < n; i++)
		t[i].ready = ready[i];
	khor_status st = enqueue(e, set, kind, n, t, op, pre, post, 0, alloc, alloc_arg,
	                         handle_out);
	free(t);
	return st;
}

KHOR_API khor_status khor_enqueue_allreduce(khor_engine *engine, int set, const char *name,
                                            const void *input, void *output, khor_dtype dtype,
                                            int ndim, const int64_t *dims, khor_op op,
                                            double prescale, double postscale,
                                            khor_handle **handle_out)
{
	return khor_enqueue_allreduce_event(engine, set, name, input, output, dtype, ndim, dims, op,
	                                    prescale, postscale, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_allreduce(khor_engine *engine, int set, int n,
                                                    const char *const *names,
                                                    const void *const *inputs,
                                                    void *const *outputs,
                                                    const khor_dtype *dtypes,
                                                    const int *ndims, const int64_t *dims,
                                                    khor_op op, double prescale,
                                                    double postscale,
                                                    khor_handle **handle_out)
{
	return grouped(engine, set, EK_ALLREDUCE, "grouped allreduce", n, names, inputs, outputs,
	               dtypes, ndims, dims, op, prescale, postscale, NULL, NULL, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_allgather(khor_engine *engine, int set, const char *name,
                                            const void *input, khor_dtype dtype, int ndim,
                                            const int64_t *dims, khor_alloc_fn alloc,
                                            void *alloc_arg, khor_handle **handle_out)
{
	return khor_enqueue_allgather_event(engine, set, name, input, dtype, ndim, dims, alloc,
	                                    alloc_arg, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_allgather(khor_engine *engine, int set, int n,
                                                    const char *const *names,
                                                    const void *const *inputs,
                                                    const khor_dtype *dtypes,
                                                    const int *ndims, const int64_t *dims,
                                                    khor_alloc_fn alloc, void *alloc_arg,
                                                    khor_handle **handle_out)
{
	return grouped(engine, set, EK_ALLGATHER, "grouped allgather", n, names, inputs, NULL,
	               dtypes, ndims, dims, KHOR_SUM, 1.0, 1.0, alloc, alloc_arg, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_broadcast(khor_engine *engine, int set, const char *name,
                                            const void *input, void *output, khor_dtype dtype,
                                            int ndim, const int64_t *dims, int root,
                                            khor_handle **handle_out)
{
	return khor_enqueue_broadcast_event(engine, set, name, input, output, dtype, ndim, dims,
	                                    root, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_alltoall(khor_engine *engine, int set, const char *name,
                                           const void *input, khor_dtype dtype, int ndim,
                                           const int64_t *dims, const int64_t *splits,
                                           khor_alloc_fn alloc, void *alloc_arg,
                                           khor_handle **handle_out)
{
	return khor_enqueue_alltoall_event(engine, set, name, input, dtype, ndim, dims, splits,
	                                   alloc, alloc_arg, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_reducescatter(khor_engine *engine, int set, const char *name,
                                                const void *input, void *output,
                                                khor_dtype dtype, int ndim, const int64_t *dims,
                                                khor_op op, double prescale, double postscale,
                                                khor_handle **handle_out)
{
	return khor_enqueue_reducescatter_event(engine, set, name, input, output, dtype, ndim, dims,
	                                        op, prescale, postscale, NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_reducescatter(khor_engine *engine, int set, int n,
                                                        const char *const *names,
                                                        const void *const *inputs,
                                                        void *const *outputs,
                                                        const khor_dtype *dtypes,
                                                        const int *ndims, const int64_t *dims,
                                                        khor_op op, double prescale,
                                                        double postscale,
                                                        khor_handle **handle_out)
{
	return grouped(engine, set, EK_REDUCESCATTER, "grouped reducescatter", n, names, inputs,
	               outputs, dtypes, ndims, dims, op, prescale, postscale, NULL, NULL, NULL,
	               handle_out);
}

/*
 * The _event forms (khor.h): the calls above with the input's ready event, which the set
 * thread waits for before it reads the input (engine/execute.c: wait_ready).
 */
KHOR_API khor_status khor_enqueue_allreduce_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  void *output, khor_dtype dtype, int ndim,
                                                  const int64_t *dims, khor_op op,
                                                  double prescale, double postscale,
                                                  void *ready_event, khor_handle **handle_out)
{
	eng_targ t = one(name, input, output, dtype, ndim, dims);
	t.ready = ready_event;
	return enqueue(engine, set, EK_ALLREDUCE, 1, &t, op, prescale, postscale, 0, NULL, NULL,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_allreduce_event(khor_engine *engine, int set, int n,
                                                          const char *const *names,
                                                          const void *const *inputs,
                                                          void *const *outputs,
                                                          const khor_dtype *dtypes,
                                                          const int *ndims,
                                                          const int64_t *dims, khor_op op,
                                                          double prescale, double postscale,
                                                          void *const *ready_events,
                                                          khor_handle **handle_out)
{
	return grouped(engine, set, EK_ALLREDUCE, "grouped allreduce", n, names, inputs, outputs,
	               dtypes, ndims, dims, op, prescale, postscale, NULL, NULL, ready_events,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_allgather_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  khor_dtype dtype, int ndim,
                                                  const int64_t *dims, khor_alloc_fn alloc,
                                                  void *alloc_arg, void *ready_event,
                                                  khor_handle **handle_out)
{
	eng_targ t = one(name, input, NULL, dtype, ndim, dims);
	t.ready = ready_event;
	return enqueue(engine, set, EK_ALLGATHER, 1, &t, KHOR_SUM, 1.0, 1.0, 0, alloc, alloc_arg,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_allgather_event(khor_engine *engine, int set, int n,
                                                          const char *const *names,
                                                          const void *const *inputs,
                                                          const khor_dtype *dtypes,
                                                          const int *ndims,
                                                          const int64_t *dims,
                                                          khor_alloc_fn alloc, void *alloc_arg,
                                                          void *const *ready_events,
                                                          khor_handle **handle_out)
{
	return grouped(engine, set, EK_ALLGATHER, "grouped allgather", n, names, inputs, NULL,
	               dtypes, ndims, dims, KHOR_SUM, 1.0, 1.0, alloc, alloc_arg, ready_events,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_broadcast_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  void *output, khor_dtype dtype, int ndim,
                                                  const int64_t *dims, int root,
                                                  void *ready_event, khor_handle **handle_out)
{
	eng_targ t = one(name, input, output, dtype, ndim, dims);
	t.ready = ready_event;
	return enqueue(engine, set, EK_BROADCAST, 1, &t, KHOR_SUM, 1.0, 1.0, root, NULL, NULL,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_alltoall_event(khor_engine *engine, int set,
                                                 const char *name, const void *input,
                                                 khor_dtype dtype, int ndim,
                                                 const int64_t *dims, const int64_t *splits,
                                                 khor_alloc_fn alloc, void *alloc_arg,
                                                 void *ready_event, khor_handle **handle_out)
{
	eng_targ t = one(name, input, NULL, dtype, ndim, dims);
	t.splits = splits;
	t.ready = ready_event;
	return enqueue(engine, set, EK_ALLTOALL, 1, &t, KHOR_SUM, 1.0, 1.0, 0, alloc, alloc_arg,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_reducescatter_event(khor_engine *engine, int set,
                                                      const char *name, const void *input,
                                                      void *output, khor_dtype dtype,
                                                      int ndim, const int64_t *dims,
                                                      khor_op op, double prescale,
                                                      double postscale, void *ready_event,
                                                      khor_handle **handle_out)
{
	eng_targ t = one(name, input, output, dtype, ndim, dims);
	t.ready = ready_event;
	return enqueue(engine, set, EK_REDUCESCATTER, 1, &t, op, prescale, postscale, 0, NULL,
	               NULL, handle_out);
}

KHOR_API khor_status khor_enqueue_grouped_reducescatter_event(
	khor_engine *engine, int set, int n, const char *const *names, const void *const *inputs,
	void *const *outputs, const khor_dtype *dtypes, const int *ndims, const int64_t *dims,
	khor_op op, double prescale, double postscale, void *const *ready_events,
	khor_handle **handle_out)
{
	return grouped(engine, set, EK_REDUCESCATTER, "grouped reducescatter", n, names, inputs,
	               outputs, dtypes, ndims, dims, op, prescale, postscale, NULL, NULL,
	               ready_events, handle_out);
}

KHOR_API khor_status khor_enqueue_barrier(khor_engine *engine, int set, khor_handle **handle_out)
{
	eng_targ t = one("khor.barrier", NULL, NULL, KHOR_UINT8, 0, NULL);
	return enqueue(engine, set, EK_BARRIER, 1, &t, KHOR_SUM, 1.0, 1.0, 0, NULL, NULL,
	               handle_out);
}

KHOR_API khor_status khor_enqueue_join(khor_engine *engine, int set, khor_handle **handle_out)
{
	eng_targ t = one("khor.join", NULL, NULL, KHOR_UINT8, 0, NULL);
	return enqueue(engine, set, EK_JOIN, 1, &t, KHOR_SUM, 1.0, 1.0, 0, NULL, NULL, handle_out);
}

KHOR_API khor_status khor_handle_test(khor_handle *handle)
{
	if (handle == NULL)
		return KHOR_ERR_INVALID_ARG;
	return engine_test(handle);
}

KHOR_API khor_status khor_handle_wait(khor_handle *handle)
{
	if (handle == NULL)
		return KHOR_ERR_INVALID_ARG;
	return engine_wait(handle);
}

KHOR_API const char *khor_handle_error(const khor_handle *handle)
{
	static _Thread_local char text[KERR_TEXT_MAX];
	khor_handle *h = (khor_handle *)handle;

	if (h == NULL)
		return "handle is NULL";
	pthread_mutex_lock(&h->eng->mu);
	kstrlcpy(text, h->err.status != KHOR_SUCCESS ? h->err.text : "", sizeof(text));
	pthread_mutex_unlock(&h->eng->mu);
	return text;
}

KHOR_API khor_status khor_handle_set_callback(khor_handle *handle, khor_done_fn fn, void *arg)
{
	if (handle == NULL || fn == NULL)
		return KHOR_ERR_INVALID_ARG;
	return engine_set_callback(handle, fn, arg);
}

KHOR_API khor_status khor_handle_output(const khor_handle *handle, int i, void **data_out,
                                        int *ndim_out, int64_t *dims_out)
{
	const khor_handle *h = handle;

	if (h == NULL || i < 0 || i >= h->n || !atomic_load(&h->done_flag) ||
	    h->status != KHOR_SUCCESS)
		return KHOR_ERR_INVALID_ARG;
	const etensor *t = &h->t[i];
	bool shaped = h->kind == EK_ALLGATHER || h->kind == EK_ALLTOALL;
	if (data_out != NULL)
		*data_out = t->out;
	if (ndim_out != NULL)
		*ndim_out = t->ndim;
	for (int d = 0; dims_out != NULL && d < t->ndim; d++)
		dims_out[d] = shaped ? t->out_dims[d] : t->dims[d];
	if (dims_out != NULL && h->kind == EK_REDUCESCATTER && t->ndim > 0) {
		int n = h->set_size, r = h->set_rank;
		int64_t d0 = t->dims[0];
		dims_out[0] = d0 / n + (r < d0 % n ? 1 : 0);
	}
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_handle_splits(const khor_handle *handle, int64_t *splits_out, int n)
{
	const khor_handle *h = handle;

	if (h == NULL || splits_out == NULL || h->kind != EK_ALLTOALL || n != h->set_size ||
	    !atomic_load(&h->done_flag) || h->status != KHOR_SUCCESS)
		return KHOR_ERR_INVALID_ARG;
	memcpy(splits_out, h->t[0].rsplits, sizeof(int64_t) * (size_t)n);
	return KHOR_SUCCESS;
}

KHOR_API int khor_handle_join_rank(const khor_handle *handle)
{
	if (handle == NULL || !atomic_load(&handle->done_flag))
		return -1;
	return handle->join_rank;
}

KHOR_API void khor_handle_free(khor_handle *handle)
{
	if (handle != NULL)
		engine_handle_free(handle);
}
