/*
 * khor's TensorFlow ops, in C against TensorFlow's stable C API (tensorflow/c/ops.h and
 * kernels.h): loaded with tf.load_op_library, they enqueue into the engine that khor's
 * Python package started (khor_tf_set_engine) and complete from the engine's callback, so a
 * collective that waits for other ranks holds none of TensorFlow's executor threads.
 *
 * A first piece of issue 28: allreduce, broadcast and allgather; not yet built by CMake
 * (README.md here).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tensorflow/c/c_api.h>
/* ops.h uses these C struct names without declaring them in C (it does in C++) */
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_DimensionHandle TF_DimensionHandle;
#include <tensorflow/c/ops.h>
#include <tensorflow/c/kernels.h>

#include "khor.h"

void *khor_tf_done_keep(void *done);
void khor_tf_done_run(void *kept);

#define KHOR_TF_MAX_DIMS 32

static khor_engine *engine;

/* Python hands the engine over once khor.init has started it (NULL at shutdown). */
__attribute__((visibility("default"))) void khor_tf_set_engine(khor_engine *e)
{
	engine = e;
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
	default: return 0;
	}
}

enum kind { ALLREDUCE, BROADCAST, ALLGATHER };
static const char *const kind_names[] = {"allreduce", "broadcast", "allgather"};

/* One op node's attributes, read once when TensorFlow makes its kernel. */
struct kernel {
	enum kind kind;
	char name[256];
	int32_t set, op, root;
	float prescale, postscale;
};

/* One op in flight: what the engine's callbacks need to finish it. */
struct pending {
	TF_OpKernelContext *ctx;
	TF_Tensor *in, *out;
	TF_DataType type;
	void *done;
};

static void fail(TF_OpKernelContext *ctx, TF_Code code, const char *msg)
{
	TF_Status *s = TF_NewStatus();
	TF_SetStatus(s, code, msg);
	TF_OpKernelContext_Failure(ctx, s);
	TF_DeleteStatus(s);
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
	TF_OpKernelConstruction_GetAttrString(c, "tensor_name", k->name, sizeof(k->name) - 1, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrInt32(c, "process_set", &k->set, s);
	if (TF_GetCode(s) == TF_OK && kind == ALLREDUCE) {
		TF_OpKernelConstruction_GetAttrInt32(c, "reduce_op", &k->op, s);
		if (TF_GetCode(s) == TF_OK)
			TF_OpKernelConstruction_GetAttrFloat(c, "prescale_factor", &k->prescale, s);
		if (TF_GetCode(s) == TF_OK)
			TF_OpKernelConstruction_GetAttrFloat(c, "postscale_factor", &k->postscale, s);
	}
	if (TF_GetCode(s) == TF_OK && kind == BROADCAST)
		TF_OpKernelConstruction_GetAttrInt32(c, "root_rank", &k->root, s);
	if (TF_GetCode(s) != TF_OK)
		TF_OpKernelConstruction_Failure(c, s);
	TF_DeleteStatus(s);
	return k;
}

static void *create_allreduce(TF_OpKernelConstruction *c) { return create(c, ALLREDUCE); }
static void *create_broadcast(TF_OpKernelConstruction *c) { return create(c, BROADCAST); }
static void *create_allgather(TF_OpKernelConstruction *c) { return create(c, ALLGATHER); }

/* allgather's output, once negotiation knows its first dimension (on the engine's thread,
 * while TensorFlow keeps the context alive for the async kernel) */
static void *alloc_output(void *arg, int ndim, const int64_t *dims, size_t bytes)
{
	static char empty[1];
	struct pending *p = arg;
	TF_Status *s = TF_NewStatus();
	p->out = TF_AllocateOutput(p->ctx, 0, p->type, dims, ndim, bytes, s);
	int ok = TF_GetCode(s) == TF_OK;
	TF_DeleteStatus(s);
	if (!ok)
		return NULL;
	return bytes == 0 ? empty : TF_TensorData(p->out);
}

static void finish(struct pending *p)
{
	void *done = p->done;
	TF_DeleteTensor(p->in);
	TF_DeleteTensor(p->out);
	free(p);
	khor_tf_done_run(done);
}

static void on_done(void *arg, khor_handle *h, khor_status st)
{
	struct pending *p = arg;
	if (st != KHOR_SUCCESS)
		fail(p->ctx, TF_INTERNAL, khor_handle_error(h));
	khor_handle_free(h);
	finish(p);
}

static void compute(void *kernel, TF_OpKernelContext *ctx, TF_AsyncOpKernelDoneCallback *done)
{
	struct kernel *k = kernel;
	TF_Status *s = TF_NewStatus();
	struct pending *p = calloc(1, sizeof(*p));
	khor_dtype dt;
	int64_t dims[KHOR_TF_MAX_DIMS];
	char msg[512];
	khor_handle *h;
	khor_status st;

	if (p == NULL || s == NULL) {
		TF_DeleteStatus(s);
		free(p);
		fail(ctx, TF_RESOURCE_EXHAUSTED, "khor: out of memory");
		TF_RunAsyncOpKernelDoneCallback(done);
		return;
	}
	p->ctx = ctx;
	TF_GetInput(ctx, 0, &p->in, s);
	if (TF_GetCode(s) != TF_OK) {
		TF_OpKernelContext_Failure(ctx, s);
		goto out;
	}
	int nd = TF_NumDims(p->in);
	p->type = TF_TensorType(p->in);
	if (!khor_dtype_of(p->type, &dt) || nd > KHOR_TF_MAX_DIMS) {
		snprintf(msg, sizeof(msg), "khor %s '%s': dtype %d or rank %d is not supported",
		         kind_names[k->kind], k->name, (int)p->type, nd);
		fail(ctx, TF_INVALID_ARGUMENT, msg);
		goto out;
	}
	if (k->kind == ALLGATHER && nd == 0) {
		snprintf(msg, sizeof(msg), "khor allgather '%s': the tensor is a scalar; allgather "
		         "needs at least one dimension", k->name);
		fail(ctx, TF_INVALID_ARGUMENT, msg);
		goto out;
	}
	for (int i = 0; i < nd; i++)
		dims[i] = TF_Dim(p->in, i);
	if (engine == NULL) {
		snprintf(msg, sizeof(msg), "khor %s '%s': khor is not initialized (call hvd.init() "
		         "first)", kind_names[k->kind], k->name);
		fail(ctx, TF_FAILED_PRECONDITION, msg);
		goto out;
	}
	if (k->kind != ALLGATHER) {
		p->out = TF_AllocateOutput(ctx, 0, p->type, dims, nd, TF_TensorByteSize(p->in), s);
		if (TF_GetCode(s) != TF_OK) {
			TF_OpKernelContext_Failure(ctx, s);
			goto out;
		}
	}
	/* from here p ends in finish() exactly once: at a refused enqueue, or from on_done */
	p->done = khor_tf_done_keep(done);
	TF_DeleteStatus(s);
	s = NULL;
	switch (k->kind) {
	case ALLREDUCE:
		st = khor_enqueue_allreduce(engine, k->set, k->name, TF_TensorData(p->in),
		                            TF_TensorData(p->out), dt, nd, dims, (khor_op)k->op,
		                            k->prescale, k->postscale, &h);
		break;
	case BROADCAST:
		st = khor_enqueue_broadcast(engine, k->set, k->name, TF_TensorData(p->in),
		                            TF_TensorData(p->out), dt, nd, dims, k->root, &h);
		break;
	default:
		st = khor_enqueue_allgather(engine, k->set, k->name, TF_TensorData(p->in), dt, nd,
		                            dims, alloc_output, p, &h);
		break;
	}
	if (st != KHOR_SUCCESS) {
		fail(ctx, st == KHOR_ERR_INVALID_ARG ? TF_INVALID_ARGUMENT : TF_INTERNAL,
		     khor_engine_error(engine));
		finish(p);
		return;
	}
	/* may run on_done here, at once; if the callback cannot be set, wait (the engine's
	 * own deadlines bound it) so that the op still ends */
	if (khor_handle_set_callback(h, on_done, p) != KHOR_SUCCESS)
		on_done(p, h, khor_handle_wait(h));
	return;
out:
	TF_DeleteTensor(p->in);
	TF_DeleteTensor(p->out);
	free(p);
	TF_DeleteStatus(s);
	TF_RunAsyncOpKernelDoneCallback(done);
}

static void kernel_delete(void *k)
{
	free(k);
}

static void same_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	TF_ShapeHandle *h = TF_NewShapeHandle();
	TF_ShapeInferenceContextGetInput(ctx, 0, h, s);
	if (TF_GetCode(s) == TF_OK)
		TF_ShapeInferenceContextSetOutput(ctx, 0, h, s);
	TF_DeleteShapeHandle(h);
}

/* allgather's first dimension is the sum over ranks, known only at run time; the C API
 * cannot make an unknown dimension, so the whole shape is left unknown for now */
static void unknown_shape(TF_ShapeInferenceContext *ctx, TF_Status *s)
{
	TF_ShapeInferenceContextSetUnknownShape(ctx, s);
}

static void register_op(const char *op, const char *const *attrs, const char *output,
                        void (*shape_fn)(TF_ShapeInferenceContext *, TF_Status *),
                        void *(*create_fn)(TF_OpKernelConstruction *))
{
	TF_Status *s = TF_NewStatus();
	TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder(op);
	TF_OpDefinitionBuilderAddAttr(b, "T: {half, bfloat16, float, double, int8, uint8, int16, "
	                                 "int32, int64, bool}");
	TF_OpDefinitionBuilderAddAttr(b, "tensor_name: string");
	TF_OpDefinitionBuilderAddAttr(b, "process_set: int = 0");
	for (; *attrs != NULL; attrs++)
		TF_OpDefinitionBuilderAddAttr(b, *attrs);
	TF_OpDefinitionBuilderAddInput(b, "tensor: T");
	TF_OpDefinitionBuilderAddOutput(b, output);
	/* not stateful: tf.function orders stateful ops as written, and ranks that write them
	 * in different orders would then wait for each other forever */
	TF_OpDefinitionBuilderSetShapeInferenceFunction(b, shape_fn);
	TF_RegisterOpDefinition(b, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering %s: %s\n", op, TF_Message(s));
	TF_KernelBuilder *kb = TF_NewAsyncKernelBuilder(op, "CPU", create_fn, compute,
	                                                kernel_delete);
	TF_RegisterKernelBuilder(op, kb, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering %s's kernel: %s\n", op, TF_Message(s));
	TF_DeleteStatus(s);
}

__attribute__((constructor)) static void register_ops(void)
{
	static const char *const reduce[] = {"reduce_op: int = 0", "prescale_factor: float = 1.0",
	                                     "postscale_factor: float = 1.0", NULL};
	static const char *const root[] = {"root_rank: int = 0", NULL};
	static const char *const none[] = {NULL};
	register_op("KhorAllreduce", reduce, "sum: T", same_shape, create_allreduce);
	register_op("KhorBroadcast", root, "output: T", same_shape, create_broadcast);
	register_op("KhorAllgather", none, "output: T", unknown_shape, create_allgather);
}
