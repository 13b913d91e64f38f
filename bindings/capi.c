/*
 * capi.c -- the exported C ABI (include/khor.h): argument checks, then the runtime.
 *
 * Everything here is a thin, defensive wrapper: a bad argument is reported through
 * khor_comm_error with the call's name and never reaches the collectives, so the lower
 * layers may assume valid input.
 */
#include "khor.h"

#include "../base/err.h"
#include "../collectives/coll.h"
#include "../collectives/reduce.h"
#include "../runtime/comm.h"
#include "../runtime/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

KHOR_API const char *khor_version(void)
{
	return "0.1.0";
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
	}
	return "unknown status";
}

KHOR_API size_t khor_dtype_size(khor_dtype dtype)
{
	switch (dtype) {
	case KHOR_FLOAT32: case KHOR_INT32: return 4;
	case KHOR_FLOAT64: case KHOR_INT64: return 8;
	case KHOR_FLOAT16: case KHOR_BFLOAT16: return 2;
	case KHOR_INT8: case KHOR_UINT8: case KHOR_BOOL: return 1;
	}
	return 0;
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
	comm_finalize(comm);
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

KHOR_API const char *khor_comm_error(const khor_comm *comm)
{
	if (comm == NULL)
		return "comm is NULL";
	if (comm->err.status != KHOR_SUCCESS)
		return comm->err.text;
	return comm->last.text;
}

static khor_status bad_arg(khor_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static khor_status bad_arg(khor_comm *c, const char *fmt, ...)
{
	va_list ap;
	char msg[KERR_TEXT_MAX - 64];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kerr_set(&c->last, KHOR_ERR_INVALID_ARG, "rank %d: %s", c->rank, msg);
}

/* Checks what every collective shares; fills the request. */
static khor_status prepare(khor_comm *c, const char *fn, unsigned kind, const void *sendbuf,
                           void *recvbuf, size_t count, khor_dtype dtype, khor_op op, int root,
                           struct khor_request *r)
{
	size_t esz = khor_dtype_size(dtype);

	if (c == NULL)
		return KHOR_ERR_INVALID_ARG;
	memset(r, 0, sizeof(*r));
	if (esz == 0)
		return bad_arg(c, "%s: unknown dtype %d", fn, (int)dtype);
	if (kind == COLL_ALLREDUCE && !reduce_supported(dtype, op))
		return bad_arg(c, "%s: op %d is not supported for dtype %d", fn, (int)op, (int)dtype);
	if (count > 0 && (recvbuf == NULL || (kind == COLL_ALLREDUCE && sendbuf == NULL)))
		return bad_arg(c, "%s: NULL buffer with count %zu", fn, count);
	if (count > SIZE_MAX / esz)
		return bad_arg(c, "%s: count %zu overflows the buffer size", fn, count);
	if (kind == COLL_BROADCAST && (root < 0 || root >= c->size))
		return bad_arg(c, "%s: root %d is not a rank of this %d-rank comm", fn, root, c->size);
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

static khor_status run_blocking(khor_comm *c, struct khor_request *r, khor_status st)
{
	return st != KHOR_SUCCESS ? st : comm_run(c, r);
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
	if (r == NULL)
		return bad_arg(c, "out of memory for a request");
	*r = *tmpl;
	r->heap = true;
	st = comm_submit(c, r);
	if (st != KHOR_SUCCESS) {
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
	comm_wait(request->comm, request);
	free(request);
}
