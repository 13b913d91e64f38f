/*
 * capi.c -- the exported C ABI (include/khor.h): argument checks, then the runtime.
 *
 * Everything here is a thin, defensive wrapper: a bad argument is reported through
 * khor_comm_error with the call's name and never reaches the collectives, so the lower
 * layers may assume valid input.
 */
#include "khor.h"

#include "base/dtype.h"
#include "base/err.h"
#include "base/secret.h"
#include "collectives/algos.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "runtime/build_info.h"
#include "runtime/comm.h"
#include "runtime/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

KHOR_API const char *khor_version(void)
{
	return "0.1.0";
}

KHOR_API const char *khor_build_info(void)
{
	return build_info_string();
}

KHOR_API const char *khor_strerror(khor_status status)
{
	switch (status) {
	case KHOR_SUCCESS: return "success";
	case KHOR_IN_PROGRESS: return "operation still in progress";
	case KHOR_ERR_INVALID_ARG: return "invalid argument or configuration";
	case KHOR_ERR_NO_MEMORY: return "out of memory";
	case KHOR_ERR_SYSTEM: return "system call failed";
	case KHOR_ERR_TIMEOUT: return "timed out";
	case KHOR_ERR_REMOTE: return "a peer rank failed or closed its connection";
	case KHOR_ERR_PROTOCOL: return "malformed or mismatched data from a peer";
	case KHOR_ERR_AUTH: return "job secret check failed";
	case KHOR_ERR_NOT_SUPPORTED: return "not supported";
	case KHOR_ERR_INTERNAL: return "internal error";
	case KHOR_ERR_MEMBERSHIP: return "the elastic job's membership changed: rejoin";
	case KHOR_ERR_REMOVED: return "this worker is no longer part of the elastic job";
	}
	return "unknown status";
}

KHOR_API size_t khor_dtype_size(khor_dtype dtype)
{
	return kdtype_size(dtype);
}

KHOR_API khor_status khor_config_create(khor_config **config_out)
{
	khor_config *c;

	if (config_out == NULL)
		return KHOR_ERR_INVALID_ARG;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return KHOR_ERR_NO_MEMORY;
	*config_out = c;
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_config_set(khor_config *cfg, const char *key, const char *value)
{
	if (cfg == NULL || key == NULL || value == NULL || !config_known(key))
		return KHOR_ERR_INVALID_ARG;
	if (strcmp(key, "KHOR_SECRET") == 0) {
		/* Not a copy on the heap: the kept one, which core dumps leave out. */
		if (strlen(value) > KSECRET_MAX)
			return KHOR_ERR_INVALID_ARG;
		const char *k = ksecret_keep(value);
		if (k == NULL)
			return KHOR_ERR_NO_MEMORY;
		cfg->secret = k;
		return KHOR_SUCCESS;
	}
	for (int i = 0; i < cfg->n; i++) {
		if (strcmp(cfg->keys[i], key) == 0) {
			char *v = strdup(value);
			if (v == NULL)
				return KHOR_ERR_NO_MEMORY;
			free(cfg->values[i]);
			cfg->values[i] = v;
			return KHOR_SUCCESS;
		}
	}
	if (cfg->n == (int)(sizeof(cfg->keys) / sizeof(cfg->keys[0])))
		return KHOR_ERR_NO_MEMORY;
	cfg->keys[cfg->n] = strdup(key);
	cfg->values[cfg->n] = strdup(value);
	if (cfg->keys[cfg->n] == NULL || cfg->values[cfg->n] == NULL) {
		free(cfg->keys[cfg->n]);
		free(cfg->values[cfg->n]);
		return KHOR_ERR_NO_MEMORY;
	}
	cfg->n++;
	return KHOR_SUCCESS;
}

KHOR_API void khor_config_destroy(khor_config *cfg)
{
	if (cfg == NULL)
		return;
	for (int i = 0; i < cfg->n; i++) {
		free(cfg->keys[i]);
		free(cfg->values[i]);
	}
	free(cfg);
}

KHOR_API khor_status khor_init(const khor_config *config, char *error_out, size_t error_len,
                               khor_comm **comm_out)
{
	kerr err;
	khor_status st;

	kerr_clear(&err);
	if (comm_out == NULL) {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "khor_init: comm_out is NULL");
		st = KHOR_ERR_INVALID_ARG;
	} else {
		st = comm_init(config, comm_out, &err);
	}
	if (st != KHOR_SUCCESS && error_out != NULL && error_len > 0)
		kstrlcpy(error_out, err.text, error_len);
	return st;
}

KHOR_API khor_status khor_finalize(khor_comm *comm)
{
	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	/* A comm of the context stands for it: finalize the whole context either way. */
	comm_finalize(comm->ctx->world);
	return KHOR_SUCCESS;
}

#define GETTER(name, field)                                   \
	KHOR_API int khor_##name(const khor_comm *comm)       \
	{                                                     \
		return comm == NULL ? -1 : comm->field;       \
	}
GETTER(rank, rank)
GETTER(size, size)
GETTER(local_rank, local_rank)
GETTER(local_size, local_size)
GETTER(cross_rank, cross_rank)
GETTER(cross_size, cross_size)

KHOR_API int khor_generation(const khor_comm *comm)
{
	return comm != NULL ? comm_generation(comm) : -1;
}

KHOR_API int khor_hosts_updated(const khor_comm *comm)
{
	return comm != NULL ? comm_hosts_updated(comm) : 0;
}

KHOR_API int khor_is_elastic(const khor_comm *comm)
{
	return comm != NULL && comm_is_elastic(comm);
}

KHOR_API khor_status khor_elastic_state(khor_comm *comm, int hold, int64_t *held_out)
{
	int64_t held = 0;
	kerr e = { 0 };
	khor_status st;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	st = comm_elastic_state(comm, hold != 0, &held, &e);
	if (st != KHOR_SUCCESS)
		comm_set_last(comm, &e);
	else if (held_out != NULL)
		*held_out = held;
	return st;
}

/*
 * Error texts are copied out under the comm's lock into a buffer of the calling thread,
 * since another thread may be writing them; the pointer stays valid until this thread's
 * next call of the same function.
 */
KHOR_API const char *khor_comm_error(const khor_comm *comm)
{
	static _Thread_local char text[KERR_TEXT_MAX];
	khor_comm *c = (khor_comm *)comm;

	if (comm == NULL)
		return "comm is NULL";
	pthread_mutex_lock(&c->mu);
	kstrlcpy(text, c->err.status != KHOR_SUCCESS ? c->err.text : c->last.text, sizeof(text));
	pthread_mutex_unlock(&c->mu);
	return text;
}

KHOR_API const char *khor_request_error(const khor_request *request)
{
	static _Thread_local char text[KERR_TEXT_MAX];
	khor_comm *c;

	if (request == NULL)
		return "request is NULL";
	c = request->comm;
	pthread_mutex_lock(&c->mu);
	kstrlcpy(text, request->done && request->status != KHOR_SUCCESS ? request->err.text : "",
	         sizeof(text));
	pthread_mutex_unlock(&c->mu);
	return text;
}

KHOR_API int64_t khor_comm_id(const khor_comm *comm)
{
	return comm == NULL ? -1 : (int64_t)comm->id;
}

KHOR_API int khor_comm_world_rank(const khor_comm *comm, int rank)
{
	if (comm == NULL || rank < 0 || rank >= comm->size)
		return -1;
	return comm_world_rank(comm, rank);
}

static khor_status call_failed(khor_comm *c, const kerr *e)
{
	comm_set_last(c, e);
	return e->status;
}

KHOR_API khor_status khor_comm_split(khor_comm *comm, int color, int key,
                                     khor_comm **newcomm_out)
{
	struct khor_request r;
	khor_status st;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	if (newcomm_out == NULL) {
		kerr e;
		kerr_set(&e, KHOR_ERR_INVALID_ARG, "rank %d: khor_comm_split: newcomm_out is NULL",
		         comm->rank);
		return call_failed(comm, &e);
	}
	memset(&r, 0, sizeof(r));
	r.kind = COLL_SPLIT;
	r.color = color < 0 ? -1 : color;
	r.key = key;
	st = comm_run(comm, &r);
	if (st == KHOR_SUCCESS)
		*newcomm_out = r.newcomm;
	return st;
}

KHOR_API khor_status khor_comm_create_group(khor_comm *comm, const int *ranks, int nranks,
                                            khor_comm **newcomm_out)
{
	kerr e;
	khor_comm *nc = NULL;
	khor_status st;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr_clear(&e);
	if (newcomm_out == NULL) {
		kerr_set(&e, KHOR_ERR_INVALID_ARG, "khor_comm_create_group: newcomm_out is NULL");
		st = KHOR_ERR_INVALID_ARG;
	} else {
		st = comm_create_group(comm, ranks, nranks, &nc, &e);
	}
	if (st != KHOR_SUCCESS) {
		kerr_prefix(&e, "rank %d on %s, %s", comm->ctx->rank, comm->ctx->cfg.hostname,
		            comm->name);
		return call_failed(comm, &e);
	}
	*newcomm_out = nc;
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_comm_free(khor_comm *comm)
{
	kctx *x;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	x = comm->ctx;
	if (comm == x->world) {
		kerr e;
		kerr_set(&e, KHOR_ERR_INVALID_ARG, "rank %d: khor_comm_free: the world comm is freed "
		         "by khor_finalize", comm->rank);
		return call_failed(comm, &e);
	}
	comm_free(comm);
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_comm_set(khor_comm *comm, const char *key, const char *value)
{
	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	kerr err;
	kerr_clear(&err);
	if (key == NULL || value == NULL) {
		kerr_set(&err, KHOR_ERR_INVALID_ARG, "rank %d: khor_comm_set: NULL %s", comm->rank,
		         key == NULL ? "key" : "value");
		return call_failed(comm, &err);
	}
	khor_status st = comm_set(comm, key, value, &err);
	if (st != KHOR_SUCCESS)
		comm_set_last(comm, &err);
	return st;
}

static khor_status bad_arg(khor_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static khor_status bad_arg(khor_comm *c, const char *fmt, ...)
{
	va_list ap;
	char msg[KERR_TEXT_MAX - 64];

	kerr e;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kerr_set(&e, KHOR_ERR_INVALID_ARG, "rank %d, %s: %s", c->ctx->rank, c->name, msg);
	return call_failed(c, &e);
}

/* Checks what every collective shares; fills the request. */
static khor_status prepare(khor_comm *c, const char *fn, unsigned kind, const void *sendbuf,
                           void *recvbuf, size_t count, khor_dtype dtype, khor_op op, int root,
                           struct khor_request *r)
{
	size_t esz = kdtype_size(dtype);

	memset(r, 0, sizeof(*r)); /* first: the caller frees r's arrays even after a failure */
	if (c == NULL)
		return KHOR_ERR_INVALID_ARG;
	if (esz == 0)
		return bad_arg(c, "%s: unknown dtype %d", fn, (int)dtype);
	bool reduces = kind == COLL_ALLREDUCE || kind == COLL_REDUCE || kind == COLL_REDUCESCATTER;
	if (reduces && !reduce_supported(dtype, op))
		return bad_arg(c, "%s: op %d is not supported for dtype %d", fn, (int)op, (int)dtype);
	if (count > SIZE_MAX / esz / (size_t)c->size)
		return bad_arg(c, "%s: count %zu overflows the buffer size", fn, count);
	bool rooted = kind == COLL_BROADCAST || kind == COLL_REDUCE || kind == COLL_GATHER ||
	              kind == COLL_SCATTER;
	if (rooted && (root < 0 || root >= c->size))
		return bad_arg(c, "%s: root %d is not a rank of this %d-rank comm", fn, root, c->size);
	bool is_root = !rooted || root == c->rank;
	/* Which buffers this rank really uses for this collective. */
	bool need_send = count > 0 && kind != COLL_BROADCAST && kind != COLL_BARRIER &&
	                 (kind != COLL_SCATTER || is_root);
	bool need_recv = count > 0 && kind != COLL_BARRIER &&
	                 (kind == COLL_BROADCAST || kind == COLL_SCATTER ||
	                  (kind != COLL_REDUCE && kind != COLL_GATHER) || is_root);
	if ((need_send && sendbuf == NULL) || (need_recv && recvbuf == NULL))
		return bad_arg(c, "%s: NULL %s buffer with count %zu", fn,
		               need_send && sendbuf == NULL ? "send" : "receive", count);
	if (kind == COLL_ALLREDUCE && sendbuf != recvbuf && count > 0) {
		const char *s = sendbuf, *d = recvbuf;
		size_t b = count * esz;
		if (s < d + b && d < s + b)
			return bad_arg(c, "%s: send and receive buffers overlap without being the same",
			               fn);
	}
	r->kind = kind;
	r->sendbuf = sendbuf;
	r->recvbuf = recvbuf;
	r->count = count;
	r->dtype = dtype;
	r->op = op;
	r->root = root;
	return KHOR_SUCCESS;
}

static void free_arrays(struct khor_request *r)
{
	/* One allocation holds every array of a v request (see take_arrays). */
	free(r->scounts != NULL ? r->scounts : r->rcounts);
	r->scounts = r->sdispls = r->rcounts = r->rdispls = NULL;
}

static khor_status run_blocking(khor_comm *c, struct khor_request *r, khor_status st)
{
	if (st == KHOR_SUCCESS)
		st = comm_run(c, r);
	free_arrays(r);
	return st;
}

/*
 * Copies the count arrays of a v collective (and packs displacements when NULL) into one
 * allocation the request owns, after checking them: negative space can't be expressed with
 * size_t, but overflow and regions past the buffer's implied end can.
 */
static khor_status take_arrays(khor_comm *c, const char *fn, struct khor_request *r,
                               const size_t *scounts, const size_t *sdispls,
                               const size_t *rcounts, const size_t *rdispls)
{
	size_t n = (size_t)c->size, esz = kdtype_size(r->dtype);
	size_t *block;
	bool two = scounts != NULL;

	if (rcounts == NULL)
		return bad_arg(c, "%s: receive counts are NULL", fn);
	block = calloc(two ? 4 * n : 2 * n, sizeof(size_t));
	if (block == NULL)
		return bad_arg(c, "%s: out of memory for %zu counts", fn, n);
	r->rcounts = block;
	r->rdispls = block + n;
	if (two) {
		r->scounts = block;
		r->sdispls = block + n;
		r->rcounts = block + 2 * n;
		r->rdispls = block + 3 * n;
	}
	const size_t *in_c[2] = { scounts, rcounts }, *in_d[2] = { sdispls, rdispls };
	size_t *out_c[2] = { r->scounts, r->rcounts }, *out_d[2] = { r->sdispls, r->rdispls };
	for (int k = two ? 0 : 1; k < 2; k++) {
		size_t packed = 0;
		for (size_t i = 0; i < n; i++) {
			out_c[k][i] = in_c[k][i];
			out_d[k][i] = in_d[k] != NULL ? in_d[k][i] : packed;
			if (in_c[k][i] > SIZE_MAX / esz / 2 || packed > SIZE_MAX / esz / 2 ||
			    out_d[k][i] > SIZE_MAX / esz / 2) {
				free_arrays(r);
				return bad_arg(c, "%s: count or displacement of rank %zu overflows", fn, i);
			}
			packed += in_c[k][i];
		}
	}
	return KHOR_SUCCESS;
}

static khor_status run_async(khor_comm *c, struct khor_request *tmpl, khor_status st,
                             khor_request **out)
{
	struct khor_request *r;

	if (st != KHOR_SUCCESS)
		return st;
	if (out == NULL)
		return bad_arg(c, "request_out is NULL");
	r = malloc(sizeof(*r));
	if (r == NULL) {
		free_arrays(tmpl);
		return bad_arg(c, "out of memory for a request");
	}
	*r = *tmpl;
	r->heap = true;
	st = comm_submit(c, r);
	if (st != KHOR_SUCCESS) {
		free_arrays(r);
		free(r);
		return st;
	}
	*out = r;
	return KHOR_SUCCESS;
}

KHOR_API khor_status khor_allreduce(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype, khor_op op)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_allreduce", COLL_ALLREDUCE, sendbuf, recvbuf, count,
	                         dtype, op, 0, &r);
	return run_blocking(comm, &r, st);
}

KHOR_API khor_status khor_iallreduce(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, khor_dtype dtype, khor_op op,
                                     khor_request **request_out)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_iallreduce", COLL_ALLREDUCE, sendbuf, recvbuf, count,
	                         dtype, op, 0, &r);
	return run_async(comm, &r, st, request_out);
}

KHOR_API khor_status khor_broadcast(khor_comm *comm, void *buf, size_t count, khor_dtype dtype,
                                    int root)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_broadcast", COLL_BROADCAST, buf, buf, count, dtype,
	                         KHOR_SUM, root, &r);
	return run_blocking(comm, &r, st);
}

KHOR_API khor_status khor_ibroadcast(khor_comm *comm, void *buf, size_t count, khor_dtype dtype,
                                     int root, khor_request **request_out)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_ibroadcast", COLL_BROADCAST, buf, buf, count, dtype,
	                         KHOR_SUM, root, &r);
	return run_async(comm, &r, st, request_out);
}

KHOR_API khor_status khor_barrier(khor_comm *comm)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_barrier", COLL_BARRIER, NULL, NULL, 0, KHOR_INT32,
	                         KHOR_SUM, 0, &r);
	return run_blocking(comm, &r, st);
}

KHOR_API khor_status khor_ibarrier(khor_comm *comm, khor_request **request_out)
{
	struct khor_request r;
	khor_status st = prepare(comm, "khor_ibarrier", COLL_BARRIER, NULL, NULL, 0, KHOR_INT32,
	                         KHOR_SUM, 0, &r);
	return run_async(comm, &r, st, request_out);
}

KHOR_API khor_status khor_wait(khor_request *request)
{
	if (request == NULL)
		return KHOR_ERR_INVALID_ARG;
	return comm_wait(request->comm, request);
}

KHOR_API khor_status khor_test(khor_request *request)
{
	khor_status st;

	if (request == NULL)
		return KHOR_ERR_INVALID_ARG;
	pthread_mutex_lock(&request->comm->mu);
	st = request->done ? request->status : KHOR_IN_PROGRESS;
	pthread_mutex_unlock(&request->comm->mu);
	return st;
}

KHOR_API void khor_request_free(khor_request *request)
{
	if (request == NULL)
		return;
	khor_comm *c = request->comm;
	comm_wait(c, request);
	free_arrays(request);
	free(request);
	comm_release(c);
}

/* Blocking and non-blocking twins share one preparation; B(...) and I(...) run it. */
#define B(prep) \
	struct khor_request r; \
	khor_status st = (prep); \
	return run_blocking(comm, &r, st)
#define I(prep) \
	struct khor_request r; \
	khor_status st = (prep); \
	return run_async(comm, &r, st, request_out)

static khor_status prep_reduce(khor_comm *comm, const char *fn, const void *sendbuf,
                               void *recvbuf, size_t count, khor_dtype dtype, khor_op op,
                               int root, struct khor_request *r)
{
	return prepare(comm, fn, COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, r);
}

KHOR_API khor_status khor_reduce(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 khor_dtype dtype, khor_op op, int root)
{
	B(prep_reduce(comm, "khor_reduce", sendbuf, recvbuf, count, dtype, op, root, &r));
}

KHOR_API khor_status khor_ireduce(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  khor_dtype dtype, khor_op op, int root,
                                  khor_request **request_out)
{
	I(prep_reduce(comm, "khor_ireduce", sendbuf, recvbuf, count, dtype, op, root, &r));
}

KHOR_API khor_status khor_allgather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype)
{
	B(prepare(comm, "khor_allgather", COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          0, &r));
}

KHOR_API khor_status khor_iallgather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, khor_dtype dtype, khor_request **request_out)
{
	I(prepare(comm, "khor_iallgather", COLL_ALLGATHER, sendbuf, recvbuf, count, dtype,
	          KHOR_SUM, 0, &r));
}

static khor_status prep_allgatherv(khor_comm *comm, const char *fn, const void *sendbuf,
                                   size_t sendcount, void *recvbuf, const size_t *recvcounts,
                                   const size_t *displs, khor_dtype dtype,
                                   struct khor_request *r)
{
	/* count is the total, for the overflow and NULL checks of prepare. */
	size_t total = 0;
	khor_status st;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	if (recvcounts == NULL)
		return bad_arg(comm, "%s: recvcounts is NULL", fn);
	if (recvcounts[comm->rank] != sendcount)
		return bad_arg(comm, "%s: sendcount %zu differs from recvcounts[%d] = %zu", fn,
		               sendcount, comm->rank, recvcounts[comm->rank]);
	for (int i = 0; i < comm->size; i++) {
		if (recvcounts[i] > SIZE_MAX / 2 - total)
			return bad_arg(comm, "%s: the counts overflow", fn);
		total += recvcounts[i];
	}
	/* An empty contribution may come with a NULL sendbuf; hand prepare a valid pointer. */
	st = prepare(comm, fn, COLL_ALLGATHER, sendcount ? sendbuf : recvbuf, recvbuf,
	             total > 0 ? 1 : 0, dtype, KHOR_SUM, 0, r);
	if (st != KHOR_SUCCESS)
		return st;
	if (sendcount > 0 && sendbuf == NULL)
		return bad_arg(comm, "%s: NULL send buffer with count %zu", fn, sendcount);
	r->count = sendcount;
	return take_arrays(comm, fn, r, NULL, NULL, recvcounts, displs);
}

KHOR_API khor_status khor_allgatherv(khor_comm *comm, const void *sendbuf, size_t sendcount,
                                     void *recvbuf, const size_t *recvcounts,
                                     const size_t *displs, khor_dtype dtype)
{
	B(prep_allgatherv(comm, "khor_allgatherv", sendbuf, sendcount, recvbuf, recvcounts, displs,
	                  dtype, &r));
}

KHOR_API khor_status khor_iallgatherv(khor_comm *comm, const void *sendbuf, size_t sendcount,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *displs, khor_dtype dtype,
                                      khor_request **request_out)
{
	I(prep_allgatherv(comm, "khor_iallgatherv", sendbuf, sendcount, recvbuf, recvcounts,
	                  displs, dtype, &r));
}

KHOR_API khor_status khor_reduce_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, khor_dtype dtype, khor_op op)
{
	B(prepare(comm, "khor_reduce_scatter", COLL_REDUCESCATTER, sendbuf, recvbuf, count, dtype,
	          op, 0, &r));
}

KHOR_API khor_status khor_ireduce_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, khor_dtype dtype, khor_op op,
                                          khor_request **request_out)
{
	I(prepare(comm, "khor_ireduce_scatter", COLL_REDUCESCATTER, sendbuf, recvbuf, count, dtype,
	          op, 0, &r));
}

KHOR_API khor_status khor_alltoall(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype)
{
	B(prepare(comm, "khor_alltoall", COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          0, &r));
}

/*
 * The stream forms (khor.h): the blocking forms with the caller's stream, which device
 * calls run on instead of the comm's own and do not wait for at the end (comm_exec.c: mem_end).
 */
#define S(prep) \
	struct khor_request r; \
	khor_status st = (prep); \
	r.stream = stream; \
	r.has_stream = true; \
	return run_blocking(comm, &r, st)

KHOR_API khor_status khor_allreduce_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, khor_dtype dtype, khor_op op,
                                           void *stream)
{
	S(prepare(comm, "khor_allreduce_stream", COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype,
	          op, 0, &r));
}

KHOR_API khor_status khor_broadcast_stream(khor_comm *comm, void *buf, size_t count,
                                           khor_dtype dtype, int root, void *stream)
{
	S(prepare(comm, "khor_broadcast_stream", COLL_BROADCAST, buf, buf, count, dtype, KHOR_SUM,
	          root, &r));
}

KHOR_API khor_status khor_reduce_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, khor_dtype dtype, khor_op op, int root,
                                        void *stream)
{
	S(prep_reduce(comm, "khor_reduce_stream", sendbuf, recvbuf, count, dtype, op, root, &r));
}

KHOR_API khor_status khor_allgather_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, khor_dtype dtype, void *stream)
{
	S(prepare(comm, "khor_allgather_stream", COLL_ALLGATHER, sendbuf, recvbuf, count, dtype,
	          KHOR_SUM, 0, &r));
}

KHOR_API khor_status khor_reduce_scatter_stream(khor_comm *comm, const void *sendbuf,
                                                void *recvbuf, size_t count, khor_dtype dtype,
                                                khor_op op, void *stream)
{
	S(prepare(comm, "khor_reduce_scatter_stream", COLL_REDUCESCATTER, sendbuf, recvbuf, count,
	          dtype, op, 0, &r));
}

KHOR_API khor_status khor_alltoall_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, khor_dtype dtype, void *stream)
{
	S(prepare(comm, "khor_alltoall_stream", COLL_ALLTOALL, sendbuf, recvbuf, count, dtype,
	          KHOR_SUM, 0, &r));
}

KHOR_API khor_status khor_ialltoall(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype, khor_request **request_out)
{
	I(prepare(comm, "khor_ialltoall", COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          0, &r));
}

static khor_status prep_alltoallv(khor_comm *comm, const char *fn, const void *sendbuf,
                                  const size_t *sendcounts, const size_t *sdispls,
                                  void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, khor_dtype dtype,
                                  struct khor_request *r)
{
	khor_status st;

	if (comm == NULL)
		return KHOR_ERR_INVALID_ARG;
	if (sendcounts == NULL || recvcounts == NULL)
		return bad_arg(comm, "%s: sendcounts or recvcounts is NULL", fn);
	/* Buffers may be NULL only where every count on that side is 0. */
	size_t s = 0, rc = 0;
	for (int i = 0; i < comm->size; i++) {
		s |= sendcounts[i];
		rc |= recvcounts[i];
	}
	if ((s && sendbuf == NULL) || (rc && recvbuf == NULL))
		return bad_arg(comm, "%s: NULL buffer with non-zero counts", fn);
	st = prepare(comm, fn, COLL_ALLTOALL, sendbuf, recvbuf, 0, dtype, KHOR_SUM, 0, r);
	if (st != KHOR_SUCCESS)
		return st;
	r->count = SIZE_MAX; /* marks the v form for the dispatcher */
	return take_arrays(comm, fn, r, sendcounts, sdispls, recvcounts, rdispls);
}

KHOR_API khor_status khor_alltoallv(khor_comm *comm, const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf,
                                    const size_t *recvcounts, const size_t *rdispls,
                                    khor_dtype dtype)
{
	B(prep_alltoallv(comm, "khor_alltoallv", sendbuf, sendcounts, sdispls, recvbuf,
	                 recvcounts, rdispls, dtype, &r));
}

KHOR_API khor_status khor_ialltoallv(khor_comm *comm, const void *sendbuf,
                                     const size_t *sendcounts, const size_t *sdispls,
                                     void *recvbuf, const size_t *recvcounts,
                                     const size_t *rdispls, khor_dtype dtype,
                                     khor_request **request_out)
{
	I(prep_alltoallv(comm, "khor_ialltoallv", sendbuf, sendcounts, sdispls, recvbuf,
	                 recvcounts, rdispls, dtype, &r));
}

KHOR_API khor_status khor_gather(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 khor_dtype dtype, int root)
{
	B(prepare(comm, "khor_gather", COLL_GATHER, sendbuf, recvbuf, count, dtype, KHOR_SUM, root,
	          &r));
}

KHOR_API khor_status khor_igather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, khor_dtype dtype, int root,
                                  khor_request **request_out)
{
	I(prepare(comm, "khor_igather", COLL_GATHER, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          root, &r));
}

KHOR_API khor_status khor_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  khor_dtype dtype, int root)
{
	B(prepare(comm, "khor_scatter", COLL_SCATTER, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          root, &r));
}

KHOR_API khor_status khor_iscatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype, int root,
                                   khor_request **request_out)
{
	I(prepare(comm, "khor_iscatter", COLL_SCATTER, sendbuf, recvbuf, count, dtype, KHOR_SUM,
	          root, &r));
}
