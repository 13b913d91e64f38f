/*
 * khor's TensorFlow ops, in C against TensorFlow's stable C API (tensorflow/c/ops.h and
 * kernels.h): loaded with tf.load_op_library, they enqueue into the engine that khor's
 * Python package started (khor_tf_set_engine) and complete from the engine's callback, so a
 * collective that waits for other ranks holds none of TensorFlow's executor threads.
 *
 * Ops: KhorAllreduce, KhorGroupedAllreduce, KhorAllgather, KhorGroupedAllgather,
 * KhorBroadcast, KhorAlltoall, KhorReducescatter, KhorGroupedReducescatter, KhorJoin and
 * KhorBarrier. Every op has the attrs tensor_name (the engine's name; "" = the node's name,
 * which is what a graph gives), ignore_name_scope (drop the node name's scopes) and
 * process_set_id. khor.tensorflow (bindings/python) is the Python side: it names the
 * tensors, registers the gradients and maps the engine's errors.
 *
 * Errors: an argument the engine refuses at enqueue is TF_INVALID_ARGUMENT; a mismatch
 * between ranks (the engine fails the handle with KHOR_ERR_INVALID_ARG) is
 * TF_FAILED_PRECONDITION, as Horovod's; a peer or link failure is TF_UNKNOWN (Horovod's
 * UnknownError, which its elastic mode turns into HorovodInternalError).
 */
#define _GNU_SOURCE /* memrchr */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tensorflow/c/c_api.h>
/* ops.h uses these C struct names without declaring them in C (it does in C++) */
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_DimensionHandle TF_DimensionHandle;
#include <tensorflow/c/ops.h>
#include <tensorflow/c/kernels.h>

#include "khor.h"

#ifndef KHOR_TF_BUILT_VERSION
#define KHOR_TF_BUILT_VERSION "unknown"
#endif

#define EXPORT __attribute__((visibility("default")))

void *khor_tf_done_keep(void *done);
void khor_tf_done_run(void *kept);

#define MAX_DIMS 32
#define MAX_TENSORS 1024

/*
 * Set by Python after khor.init has started the engine, cleared (NULL) at shutdown before
 * the engine stops; kernels read it on TensorFlow's threads. `users` counts the kernels
 * between reading it and returning from their enqueue, so that clearing it can wait for
 * them: with both sequentially consistent, a kernel either sees NULL or is seen by the
 * clearing thread, never enqueues into an engine that is being stopped. An enqueue never
 * blocks, so the wait is short; it gives up (saying so) after WAIT_NS all the same.
 */
static _Atomic(khor_engine *) engine;
static atomic_int users;

#define WAIT_NS 5000000000LL

EXPORT void khor_tf_set_engine(khor_engine *e)
{
	atomic_store(&engine, e);
	if (e != NULL)
		return;
	struct timespec nap = {0, 100000};
	for (long long waited = 0; atomic_load(&users) > 0; waited += nap.tv_nsec) {
		if (waited >= WAIT_NS) {
			fprintf(stderr, "khor: TensorFlow ops: %d op(s) still entering the engine "
			        "after %lld s; stopping it anyway\n", atomic_load(&users),
			        WAIT_NS / 1000000000LL);
			return;
		}
		nanosleep(&nap, NULL);
	}
}

/*
 * The TensorFlow version this library was compiled against (tf.__version__ at build time),
 * so that Python can name both versions when the running one differs. Python reads it from
 * the file (the marker's bytes) before loading the library: a library built for another
 * TensorFlow may not load at all, and loading it registers its ops.
 */
__attribute__((used)) static const char built_for[] = "KHOR_TF_BUILT_FOR=" KHOR_TF_BUILT_VERSION;

EXPORT const char *khor_tf_built_version(void)
{
	return built_for + sizeof("KHOR_TF_BUILT_FOR=") - 1;
}

static int khor_dtype_of(TF_DataType t, khor_dtype *out)
{
	switch (t) {
	case TF_FLOAT: *out = KHOR_FLOAT32; return 1;
	case TF_DOUBLE: *out = KHOR_FLOAT64; return 1;
	case TF_HALF: *out = KHOR_FLOAT16; return 1;
	case TF_BFLOAT16: *out = KHOR_BFLOAT16; return 1;
	case TF_INT32: *out = KHOR_INT32; return 1;
	case TF_INT64: *out = KHOR_INT64; return 1;
	case TF_INT8: *out = KHOR_INT8; return 1;
	case TF_UINT8: *out = KHOR_UINT8; return 1;
	case TF_INT16: *out = KHOR_INT16; return 1;
	case TF_BOOL: *out = KHOR_BOOL; return 1;
	/* Only the ops that move bytes without arithmetic take uint16 (MOVED_TYPES, as
	 * Horovod's allgather, broadcast and alltoall do): the engine has no uint16, and its
	 * int16 of the same width moves the same bytes. */
	case TF_UINT16: *out = KHOR_INT16; return 1;
	default: return 0;
	}
}

/* Horovod's op numbers (the reduce_op attr, which Horovod's gradient rules read) as khor's */
static int khor_op_of(int32_t horovod_op, khor_op *out)
{
	switch (horovod_op) {
	case 0: *out = KHOR_AVG; return 1;
	case 1: *out = KHOR_SUM; return 1;
	case 3: *out = KHOR_MIN; return 1;
	case 4: *out = KHOR_MAX; return 1;
	case 5: *out = KHOR_PROD; return 1;
	default: return 0;
	}
}

enum kind { ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, JOIN, BARRIER };
static const char *const kind_names[] = {"allreduce", "allgather", "broadcast", "alltoall",
                                         "reducescatter", "join", "barrier"};

/* One op node's attributes, read once when TensorFlow makes its kernel. */
struct kernel {
	enum kind kind;
	char name[1024];
	int32_t set, op, root, set_size, set_rank;
	float prescale, postscale;
};

/* One op in flight: what the engine's callbacks need to finish it. */
struct pending {
	const struct kernel *k;
	TF_OpKernelContext *ctx;
	int n;                       /* tensors (inputs; alltoall: 1) */
	int nout;                    /* outputs allocated so far by alloc_output */
	TF_DataType type;
	void *done;
	char alloc_err[256];         /* why TF_AllocateOutput failed on the engine's thread */
	TF_Tensor **in, **out;       /* n each, in t */
	TF_Tensor *t[];
};

static void fail(TF_OpKernelContext *ctx, TF_Code code, const char *msg)
{
	TF_Status *s = TF_NewStatus();
	TF_SetStatus(s, code, msg);
	TF_OpKernelContext_Failure(ctx, s);
	TF_DeleteStatus(s);
}

/* The engine's name: the tensor_name attr, else the node's name (its scopes dropped with
 * ignore_name_scope). A graph's node names are the same on every rank that builds the same
 * graph, which is what lets tf.function's ops find each other across ranks. */
static void kernel_name(TF_OpKernelConstruction *c, struct kernel *k, TF_Status *s)
{
	int32_t list_size, attr_len;
	const char *p = k->name;
	size_t len = 0;
	TF_Bool ignore = 0;
	char msg[160];

	TF_OpKernelConstruction_GetAttrSize(c, "tensor_name", &list_size, &attr_len, s);
	if (TF_GetCode(s) == TF_OK && attr_len > 0) {
		len = (size_t)attr_len;
		if (len < sizeof(k->name))
			TF_OpKernelConstruction_GetAttrString(c, "tensor_name", k->name, len, s);
		p = k->name;
	} else if (TF_GetCode(s) == TF_OK) {
		TF_StringView node = TF_OpKernelConstruction_GetName(c);
		p = node.data;
		len = node.len;
	}
	if (TF_GetCode(s) != TF_OK)
		return;
	TF_OpKernelConstruction_GetAttrBool(c, "ignore_name_scope", &ignore, s);
	if (TF_GetCode(s) != TF_OK)
		return;
	if (ignore) {
		const char *slash = memrchr(p, '/', len);
		if (slash != NULL) {
			len -= (size_t)(slash + 1 - p);
			p = slash + 1;
		}
	}
	/* a cut name could equal another's: refuse it instead */
	if (len >= sizeof(k->name)) {
		snprintf(msg, sizeof(msg), "khor: a tensor name of %zu bytes (%.40s...); khor takes "
		         "at most %zu: give the op a shorter name", len, p, sizeof(k->name) - 1);
		TF_SetStatus(s, TF_INVALID_ARGUMENT, msg);
		return;
	}
	memmove(k->name, p, len);
	k->name[len] = '\0';
}

static void *create(TF_OpKernelConstruction *c, enum kind kind)
{
	struct kernel *k = calloc(1, sizeof(*k));
	TF_Status *s = TF_NewStatus();
	if (k == NULL || s == NULL) {
		free(k);
		TF_DeleteStatus(s);
		return NULL;
	}
	k->kind = kind;
	k->prescale = k->postscale = 1.0f;
	k->set_size = 1;
	if (kind == JOIN || kind == BARRIER)
		strcpy(k->name, kind_names[kind]);
	else
		kernel_name(c, k, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrInt32(c, "process_set_id", &k->set, s);
	if (TF_GetCode(s) == TF_OK && (kind == ALLREDUCE || kind == REDUCESCATTER)) {
		TF_OpKernelConstruction_GetAttrInt32(c, "reduce_op", &k->op, s);
		if (TF_GetCode(s) == TF_OK)
			TF_OpKernelConstruction_GetAttrFloat(c, "prescale_factor", &k->prescale, s);
		if (TF_GetCode(s) == TF_OK)
			TF_OpKernelConstruction_GetAttrFloat(c, "postscale_factor", &k->postscale, s);
	}
	if (TF_GetCode(s) == TF_OK && kind == BROADCAST)
		TF_OpKernelConstruction_GetAttrInt32(c, "set_root_rank", &k->root, s);
	if (TF_GetCode(s) == TF_OK && (kind == ALLTOALL || kind == REDUCESCATTER)) {
		TF_OpKernelConstruction_GetAttrInt32(c, "set_size", &k->set_size, s);
		if (TF_GetCode(s) == TF_OK)
			TF_OpKernelConstruction_GetAttrInt32(c, "set_rank", &k->set_rank, s);
	}
	if (TF_GetCode(s) == TF_OK && (kind == ALLREDUCE || kind == REDUCESCATTER)) {
		khor_op op = KHOR_SUM;
		if (!khor_op_of(k->op, &op)) {
			char msg[320];
			snprintf(msg, sizeof(msg), "khor %s '%s': reduce_op %d is not one khor has "
			         "(Average 0, Sum 1, Min 3, Max 4, Product 5; no Adasum)",
			         kind_names[kind], k->name, (int)k->op);
			TF_SetStatus(s, TF_INVALID_ARGUMENT, msg);
		}
		k->op = (int32_t)op;
	}
	if (TF_GetCode(s) != TF_OK)
		TF_OpKernelConstruction_Failure(c, s);
	TF_DeleteStatus(s);
	return k;
}

static void *create_allreduce(TF_OpKernelConstruction *c) { return create(c, ALLREDUCE); }
static void *create_allgather(TF_OpKernelConstruction *c) { return create(c, ALLGATHER); }
static void *create_broadcast(TF_OpKernelConstruction *c) { return create(c, BROADCAST); }
static void *create_alltoall(TF_OpKernelConstruction *c) { return create(c, ALLTOALL); }
static void *create_reducescatter(TF_OpKernelConstruction *c) { return create(c, REDUCESCATTER); }
static void *create_join(TF_OpKernelConstruction *c) { return create(c, JOIN); }
static void *create_barrier(TF_OpKernelConstruction *c) { return create(c, BARRIER); }

/*
 * The output of an allgather or alltoall, once negotiation knows its first dimension: on
 * the engine's thread, while TensorFlow keeps the async kernel's context alive. A grouped
 * allgather's outputs come in tensor order. TensorFlow's reason for a failure is kept here,
 * since the engine fails the handle with a text of its own.
 */
static void *alloc_output(void *arg, int ndim, const int64_t *dims, size_t bytes)
{
	static char empty[1];
	struct pending *p = arg;
	int i = p->nout;
	if (i >= p->n) {
		snprintf(p->alloc_err, sizeof(p->alloc_err), "khor %s '%s': the engine asked for "
		         "output %d of %d", kind_names[p->k->kind], p->k->name, i + 1, p->n);
		return NULL;
	}
	TF_Status *s = TF_NewStatus();
	p->out[i] = TF_AllocateOutput(p->ctx, i, p->type, dims, ndim, bytes, s);
	int ok = TF_GetCode(s) == TF_OK;
	if (!ok)
		snprintf(p->alloc_err, sizeof(p->alloc_err), "khor %s '%s': allocating its %zu-byte "
		         "output %d failed: %s", kind_names[p->k->kind], p->k->name, bytes, i,
		         TF_Message(s));
	TF_DeleteStatus(s);
	if (!ok)
		return NULL;
	p->nout++;
	return bytes == 0 ? empty : TF_TensorData(p->out[i]);
}

static void pending_free(struct pending *p)
{
	for (int i = 0; i < p->n; i++) {
		TF_DeleteTensor(p->in[i]);
		TF_DeleteTensor(p->out[i]);
	}
	free(p);
}

static void finish(struct pending *p)
{
	void *done = p->done;
	pending_free(p);
	khor_tf_done_run(done);
}

static TF_Code tf_code(khor_status st)
{
	switch (st) {
	case KHOR_ERR_INVALID_ARG: return TF_FAILED_PRECONDITION;
	case KHOR_ERR_NO_MEMORY: return TF_RESOURCE_EXHAUSTED;
	case KHOR_ERR_NOT_SUPPORTED: return TF_UNIMPLEMENTED;
	default: return TF_UNKNOWN;
	}
}

/* The scalar or vector outputs made once the handle has completed (join, alltoall). */
static void finish_outputs(struct pending *p, khor_handle *h)
{
	TF_Status *s = TF_NewStatus();
	if (p->k->kind == JOIN) {
		TF_Tensor *t = TF_AllocateOutput(p->ctx, 0, TF_INT32, NULL, 0, sizeof(int32_t), s);
		if (TF_GetCode(s) == TF_OK) {
			*(int32_t *)TF_TensorData(t) = khor_handle_join_rank(h);
			TF_DeleteTensor(t);
		}
	} else if (p->k->kind == ALLTOALL) {
		int64_t n = p->k->set_size, rs[MAX_TENSORS];
		TF_DataType st = TF_ExpectedOutputDataType(p->ctx, 1);
		if (n > MAX_TENSORS || khor_handle_splits(h, rs, (int)n) != KHOR_SUCCESS) {
			TF_SetStatus(s, TF_INTERNAL, "khor alltoall: no received splits");
		} else {
			size_t esz = st == TF_INT64 ? 8 : 4;
			TF_Tensor *t = TF_AllocateOutput(p->ctx, 1, st, &n, 1, (size_t)n * esz, s);
			if (TF_GetCode(s) == TF_OK) {
				for (int64_t j = 0; j < n; j++) {
					if (st == TF_INT64)
						((int64_t *)TF_TensorData(t))[j] = rs[j];
					else
						((int32_t *)TF_TensorData(t))[j] = (int32_t)rs[j];
				}
				TF_DeleteTensor(t);
			}
		}
	}
	if (TF_GetCode(s) != TF_OK)
		TF_OpKernelContext_Failure(p->ctx, s);
	TF_DeleteStatus(s);
}

static void on_done(void *arg, khor_handle *h, khor_status st)
{
	struct pending *p = arg;
	if (st != KHOR_SUCCESS)
		fail(p->ctx, p->alloc_err[0] ? TF_RESOURCE_EXHAUSTED : tf_code(st),
		     p->alloc_err[0] ? p->alloc_err : khor_handle_error(h));
	else
		finish_outputs(p, h);
	khor_handle_free(h);
	finish(p);
}

/* alltoall's splits input as int64, checked as Horovod checks it; 0 = even splits. */
static int read_splits(struct pending *p, int64_t d0, int64_t *sp, char *msg, size_t len)
{
	TF_Status *s = TF_NewStatus();
	TF_Tensor *t = NULL;
	int64_t n = p->k->set_size, total = 0, cnt;
	int rc = -1;
	TF_GetInput(p->ctx, 1, &t, s);
	if (TF_GetCode(s) != TF_OK) {
		snprintf(msg, len, "khor alltoall '%s': %s", p->k->name, TF_Message(s));
		goto out;
	}
	cnt = TF_TensorElementCount(t);
	if (cnt == 0) {
		rc = 0;
		if (n > 0 && d0 % n != 0) {
			snprintf(msg, len, "khor alltoall '%s': dim 0 (%lld) does not divide by the "
			         "%lld ranks of the process set; pass splits", p->k->name,
			         (long long)d0, (long long)n);
			rc = -1;
		}
		goto out;
	}
	if (cnt != n || n > MAX_TENSORS) {
		snprintf(msg, len, "khor alltoall '%s': %lld splits for a process set of %lld ranks",
		         p->k->name, (long long)cnt, (long long)n);
		goto out;
	}
	for (int64_t j = 0; j < n; j++) {
		sp[j] = TF_TensorType(t) == TF_INT64 ? ((int64_t *)TF_TensorData(t))[j]
		                                     : ((int32_t *)TF_TensorData(t))[j];
		if (sp[j] < 0) {
			snprintf(msg, len, "khor alltoall '%s': split %lld is negative (%lld)",
			         p->k->name, (long long)j, (long long)sp[j]);
			goto out;
		}
		total += sp[j];
	}
	if (total > d0) {
		snprintf(msg, len, "khor alltoall '%s': the splits ask for %lld rows of dim 0, which "
		         "has %lld", p->k->name, (long long)total, (long long)d0);
		goto out;
	}
	rc = 1;
out:
	TF_DeleteTensor(t);
	TF_DeleteStatus(s);
	return rc;
}

static khor_status enqueue(struct pending *p, khor_engine *e, khor_dtype *dts, int *nds,
                           int64_t *dims, const int64_t *splits, khor_handle **h)
{
	const struct kernel *k = p->k;
	const char *names[MAX_TENSORS];
	const void *ins[MAX_TENSORS];
	void *outs[MAX_TENSORS];
	char *namebuf = NULL;
	khor_status st;

	if (k->kind == JOIN)
		return khor_enqueue_join(e, k->set, h);
	if (k->kind == BARRIER)
		return khor_enqueue_barrier(e, k->set, h);
	for (int i = 0; i < p->n; i++) {
		ins[i] = TF_TensorData(p->in[i]);
		outs[i] = p->out[i] != NULL ? TF_TensorData(p->out[i]) : NULL;
	}
	if (p->n == 1) {
		names[0] = k->name;
	} else {
		/* a group: "<name>.<i>" */
		size_t w = strlen(k->name) + 8;
		namebuf = malloc(w * (size_t)p->n);
		if (namebuf == NULL)
			return KHOR_ERR_NO_MEMORY;
		for (int i = 0; i < p->n; i++) {
			snprintf(namebuf + w * (size_t)i, w, "%s.%d", k->name, i);
			names[i] = namebuf + w * (size_t)i;
		}
	}
	switch (k->kind) {
	case ALLREDUCE:
		st = p->n == 1 ? khor_enqueue_allreduce(e, k->set, names[0], ins[0], outs[0], dts[0],
		                                        nds[0], dims, (khor_op)k->op, k->prescale,
		                                        k->postscale, h)
		               : khor_enqueue_grouped_allreduce(e, k->set, p->n, names, ins, outs, dts,
		                                                nds, dims, (khor_op)k->op,
		                                                k->prescale, k->postscale, h);
		break;
	case REDUCESCATTER:
		st = p->n == 1 ? khor_enqueue_reducescatter(e, k->set, names[0], ins[0], outs[0],
		                                            dts[0], nds[0], dims, (khor_op)k->op,
		                                            k->prescale, k->postscale, h)
		               : khor_enqueue_grouped_reducescatter(e, k->set, p->n, names, ins, outs,
		                                                    dts, nds, dims, (khor_op)k->op,
		                                                    k->prescale, k->postscale, h);
		break;
	case ALLGATHER:
		st = p->n == 1 ? khor_enqueue_allgather(e, k->set, names[0], ins[0], dts[0], nds[0],
		                                        dims, alloc_output, p, h)
		               : khor_enqueue_grouped_allgather(e, k->set, p->n, names, ins, dts, nds,
		                                                dims, alloc_output, p, h);
		break;
	case BROADCAST:
		st = khor_enqueue_broadcast(e, k->set, names[0], ins[0], outs[0], dts[0], nds[0],
		                            dims, k->root, h);
		break;
	default:
		st = khor_enqueue_alltoall(e, k->set, names[0], ins[0], dts[0], nds[0], dims, splits,
		                           alloc_output, p, h);
		break;
	}
	free(namebuf);
	return st;
}

/* rows of dim 0 that reducescatter leaves on this rank (khor.h) */
static int64_t scatter_rows(const struct kernel *k, int64_t d0)
{
	int64_t n = k->set_size > 0 ? k->set_size : 1;
	return d0 / n + (k->set_rank < d0 % n ? 1 : 0);
}

/*
 * An allreduce's output i: input i's own buffer when TensorFlow may hand it over (nothing
 * else holds it: a gradient that only this op reads), so that the engine reduces in place,
 * writing 1x the bytes instead of reading one buffer and writing another; else a new
 * tensor. *in (which TF_GetInput made, holding a reference that would make the buffer look
 * shared) is dropped first and taken again after.
 */
static TF_Tensor *forward_or_allocate(TF_OpKernelContext *ctx, int i, TF_Tensor **in,
                                      const int64_t *d, int nd, TF_Status *s)
{
	int forwarded = -1;
	TF_Tensor *out;

	TF_DeleteTensor(*in);
	*in = NULL;
	out = TF_ForwardInputOrAllocateOutput(ctx, &i, 1, i, d, nd, &forwarded, s);
	if (TF_GetCode(s) != TF_OK)
		return out;
	TF_GetInput(ctx, i, in, s);
	return out;
}

static void compute(void *kernel, TF_OpKernelContext *ctx, TF_AsyncOpKernelDoneCallback *done)
{
	struct kernel *k = kernel;
	TF_Status *s = TF_NewStatus();
	int n = k->kind == JOIN || k->kind == BARRIER ? 0 : k->kind == ALLTOALL ? 1
	        : TF_NumInputs(ctx);
	struct pending *p = n <= MAX_TENSORS ? calloc(1, sizeof(*p) + 2 * sizeof(TF_Tensor *) *
	                                              (size_t)n) : NULL;
	khor_dtype dts[MAX_TENSORS];
	int nds[MAX_TENSORS];
	int64_t *dims = NULL, splits[MAX_TENSORS];
	int have_splits = 0;
	char msg[512];
	khor_handle *h;
	khor_status st;
	TF_Code code = TF_INVALID_ARGUMENT;

	if (p == NULL || s == NULL) {
		TF_DeleteStatus(s);
		free(p);
		snprintf(msg, sizeof(msg), n > MAX_TENSORS ? "khor %s '%s': %d tensors in one group; "
		         "at most %d" : "khor %s '%s': out of memory (%d tensors)",
		         kind_names[k->kind], k->name, n, MAX_TENSORS);
		fail(ctx, n > MAX_TENSORS ? TF_INVALID_ARGUMENT : TF_RESOURCE_EXHAUSTED, msg);
		TF_RunAsyncOpKernelDoneCallback(done);
		return;
	}
	msg[0] = '\0';
	p->k = k;
	p->ctx = ctx;
	p->n = n;
	p->in = p->t;
	p->out = p->t + n;
	dims = malloc(sizeof(int64_t) * MAX_DIMS * (size_t)(p->n > 0 ? p->n : 1));
	if (dims == NULL) {
		code = TF_RESOURCE_EXHAUSTED;
		snprintf(msg, sizeof(msg), "khor %s '%s': out of memory", kind_names[k->kind],
		         k->name);
		goto fail_early;
	}
	int64_t *d = dims;
	for (int i = 0; i < p->n; i++) {
		TF_GetInput(ctx, i, &p->in[i], s);
		if (TF_GetCode(s) != TF_OK) {
			code = TF_GetCode(s);
			snprintf(msg, sizeof(msg), "khor %s '%s': %s", kind_names[k->kind], k->name,
			         TF_Message(s));
			goto fail_early;
		}
		int nd = TF_NumDims(p->in[i]);
		p->type = TF_TensorType(p->in[i]);
		if (!khor_dtype_of(p->type, &dts[i]) || nd > MAX_DIMS) {
			snprintf(msg, sizeof(msg), "khor %s '%s': dtype %d or rank %d is not supported",
			         kind_names[k->kind], k->name, (int)p->type, nd);
			goto fail_early;
		}
		if (nd == 0 && k->kind != ALLREDUCE && k->kind != BROADCAST) {
			snprintf(msg, sizeof(msg), "khor %s '%s': the tensor is a scalar; %s needs at "
			         "least one dimension", kind_names[k->kind], k->name, kind_names[k->kind]);
			goto fail_early;
		}
		nds[i] = nd;
		for (int j = 0; j < nd; j++)
			d[j] = TF_Dim(p->in[i], j);
		if (k->kind == ALLREDUCE || k->kind == BROADCAST || k->kind == REDUCESCATTER) {
			size_t bytes = TF_TensorByteSize(p->in[i]);
			if (k->kind == REDUCESCATTER) {
				int64_t rows = scatter_rows(k, d[0]);
				bytes = d[0] > 0 ? bytes / (size_t)d[0] * (size_t)rows : 0;
				int64_t save = d[0];
				d[0] = rows;
				p->out[i] = TF_AllocateOutput(ctx, i, p->type, d, nd, bytes, s);
				d[0] = save;
			} else if (k->kind == ALLREDUCE) {
				p->out[i] = forward_or_allocate(ctx, i, &p->in[i], d, nd, s);
			} else {
				p->out[i] = TF_AllocateOutput(ctx, i, p->type, d, nd, bytes, s);
			}
			if (TF_GetCode(s) != TF_OK) {
				code = TF_GetCode(s);
				snprintf(msg, sizeof(msg), "khor %s '%s': allocating the output: %s",
				         kind_names[k->kind], k->name, TF_Message(s));
				goto fail_early;
			}
		}
		d += nd;
	}
	if (k->kind == ALLTOALL) {
		int rc = read_splits(p, dims[0], splits, msg, sizeof(msg));
		if (rc < 0)
			goto fail_early;
		have_splits = rc;
		/* Horovod lets the splits leave rows at the end unsent; the engine wants them to
		 * add up to dim 0, and the rows sent are a prefix of the (contiguous) input */
		if (have_splits) {
			int64_t total = 0;
			for (int64_t j = 0; j < k->set_size; j++)
				total += splits[j];
			dims[0] = total;
		}
	}
	atomic_fetch_add(&users, 1);
	khor_engine *e = atomic_load(&engine);
	if (e == NULL) {
		atomic_fetch_sub(&users, 1);
		code = TF_FAILED_PRECONDITION;
		snprintf(msg, sizeof(msg), "khor %s '%s': khor is not initialized (call hvd.init() "
		         "first)", kind_names[k->kind], k->name);
		goto fail_early;
	}
	/* from here p ends in finish() exactly once: at a refused enqueue, or from on_done */
	p->done = khor_tf_done_keep(done);
	TF_DeleteStatus(s);
	st = enqueue(p, e, dts, nds, dims, have_splits ? splits : NULL, &h);
	free(dims);
	if (st != KHOR_SUCCESS)
		snprintf(msg, sizeof(msg), "khor %s '%s': %s", kind_names[k->kind], k->name,
		         st == KHOR_ERR_NO_MEMORY ? "out of memory" : khor_engine_error(e));
	/* done with the engine itself: its handles outlive it (khor.h) */
	atomic_fetch_sub(&users, 1);
	if (st != KHOR_SUCCESS) {
		fail(ctx, st == KHOR_ERR_INVALID_ARG ? TF_INVALID_ARGUMENT : tf_code(st), msg);
		finish(p);
		return;
	}
	/* may run on_done here, at once; if the callback cannot be set, wait (the engine's
	 * own deadlines bound it) so that the op still ends */
	if (khor_handle_set_callback(h, on_done, p) != KHOR_SUCCESS)
		on_done(p, h, khor_handle_wait(h));
	return;
fail_early:
	fail(ctx, code, msg);
	free(dims);
	pending_free(p);
	TF_DeleteStatus(s);
	TF_RunAsyncOpKernelDoneCallback(done);
}

static void kernel_delete(void *k)
{
	free(k);
}

/* output i has input i's shape */
static void same_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	TF_ShapeHandle *h = TF_NewShapeHandle();
	int64_t n = TF_ShapeInferenceContextNumInputs(ctx);
	for (int64_t i = 0; i < n && TF_GetCode(s) == TF_OK; i++) {
		TF_ShapeInferenceContextGetInput(ctx, (int)i, h, s);
		if (TF_GetCode(s) == TF_OK)
			TF_ShapeInferenceContextSetOutput(ctx, (int)i, h, s);
	}
	TF_DeleteShapeHandle(h);
}

/* Outputs whose first dimension is known only at run time: the C API cannot make one
 * unknown dimension, so the shape is unknown here and khor.tensorflow sets the rest of it
 * (set_shape) on the graph's tensor. */
static void unknown_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	TF_ShapeInferenceContextSetUnknownShape(ctx, s);
}

static void scalar_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	TF_ShapeHandle *h = TF_ShapeInferenceContextScalar(ctx);
	TF_ShapeInferenceContextSetOutput(ctx, 0, h, s);
	TF_DeleteShapeHandle(h);
}

static void no_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	(void)ctx;
	(void)s;
}

struct opdef {
	const char *name;
	const char *const *attrs;    /* beyond the common ones, NULL-terminated */
	const char *const *inputs;
	const char *const *outputs;
	int stateful;
	void (*shape_fn)(TF_ShapeInferenceContext *, TF_Status *);
	void *(*create_fn)(TF_OpKernelConstruction *);
};

static void register_op(const struct opdef *o)
{
	TF_Status *s = TF_NewStatus();
	TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder(o->name);
	TF_OpDefinitionBuilderAddAttr(b, "process_set_id: int = 0");
	for (const char *const *a = o->attrs; *a != NULL; a++)
		TF_OpDefinitionBuilderAddAttr(b, *a);
	for (const char *const *a = o->inputs; *a != NULL; a++)
		TF_OpDefinitionBuilderAddInput(b, *a);
	for (const char *const *a = o->outputs; *a != NULL; a++)
		TF_OpDefinitionBuilderAddOutput(b, *a);
	/* Not stateful but for join and barrier: tf.function orders stateful ops as written,
	 * and ranks that write two collectives in different orders would then wait for each
	 * other forever. Join and barrier have no data output to keep them in the graph. */
	if (o->stateful)
		TF_OpDefinitionBuilderSetIsStateful(b, 1);
	TF_OpDefinitionBuilderSetShapeInferenceFunction(b, o->shape_fn);
	TF_RegisterOpDefinition(b, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering %s: %s\n", o->name, TF_Message(s));
	TF_KernelBuilder *kb = TF_NewAsyncKernelBuilder(o->name, "CPU", o->create_fn, compute,
	                                                kernel_delete);
	TF_RegisterKernelBuilder(o->name, kb, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering %s's kernel: %s\n", o->name, TF_Message(s));
	TF_DeleteStatus(s);
}

#define TYPES "T: {half, bfloat16, float, double, int8, uint8, int16, int32, int64, bool}"
#define MOVED_TYPES "T: {half, bfloat16, float, double, int8, uint8, int16, uint16, int32, " \
	"int64, bool}"
#define NAMED "tensor_name: string = ''", "ignore_name_scope: bool = false"
#define REDUCE "reduce_op: int = 1", "prescale_factor: float = 1.0", \
	"postscale_factor: float = 1.0"
#define SET "set_size: int = 1", "set_rank: int = 0"

__attribute__((constructor)) static void register_ops(void)
{
	static const char *const reduce[] = {TYPES, NAMED, REDUCE, NULL};
	static const char *const greduce[] = {TYPES, NAMED, REDUCE, "N: int >= 1", NULL};
	static const char *const rscatter[] = {TYPES, NAMED, REDUCE, SET, NULL};
	static const char *const grscatter[] = {TYPES, NAMED, REDUCE, SET, "N: int >= 1", NULL};
	static const char *const plain[] = {MOVED_TYPES, NAMED, NULL};
	static const char *const gplain[] = {MOVED_TYPES, NAMED, "N: int >= 1", NULL};
	static const char *const bcast[] = {MOVED_TYPES, NAMED, "root_rank: int = 0",
	                                    "set_root_rank: int = 0", NULL};
	static const char *const a2a[] = {MOVED_TYPES, NAMED, SET,
	                                  "Tsplits: {int32, int64} = DT_INT32", NULL};
	static const char *const none[] = {NULL};
	static const char *const one_in[] = {"tensor: T", NULL};
	static const char *const n_in[] = {"tensors: N * T", NULL};
	static const char *const a2a_in[] = {"tensor: T", "splits: Tsplits", NULL};
	static const char *const sum[] = {"sum: T", NULL};
	static const char *const nsum[] = {"sum: N * T", NULL};
	static const char *const out[] = {"output: T", NULL};
	static const char *const nout[] = {"output: N * T", NULL};
	static const char *const a2a_out[] = {"output: T", "received_splits: Tsplits", NULL};
	static const char *const last[] = {"last_joined_rank: int32", NULL};
	static const struct opdef ops[] = {
		{"KhorAllreduce", reduce, one_in, sum, 0, same_shape, create_allreduce},
		{"KhorGroupedAllreduce", greduce, n_in, nsum, 0, same_shape, create_allreduce},
		{"KhorAllgather", plain, one_in, out, 0, unknown_shape, create_allgather},
		{"KhorGroupedAllgather", gplain, n_in, nout, 0, unknown_shape, create_allgather},
		{"KhorBroadcast", bcast, one_in, out, 0, same_shape, create_broadcast},
		{"KhorAlltoall", a2a, a2a_in, a2a_out, 0, unknown_shape, create_alltoall},
		{"KhorReducescatter", rscatter, one_in, out, 0, unknown_shape, create_reducescatter},
		{"KhorGroupedReducescatter", grscatter, n_in, nout, 0, unknown_shape,
		 create_reducescatter},
		{"KhorJoin", none, none, last, 1, scalar_shape, create_join},
		{"KhorBarrier", none, none, none, 1, no_shape, create_barrier},
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		register_op(&ops[i]);
}
