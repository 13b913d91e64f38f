/*
 * khor's TensorFlow ops, in C against TensorFlow's stable C API (tensorflow/c/ops.h and
 * kernels.h): loaded with tf.load_op_library, they enqueue into the engine that khor's
 * Python package started (khor_tf_set_engine) and complete from the engine's callback, so a
 * collective that waits for other ranks holds none of TensorFlow's executor threads.
 *
 * A first piece of issue 28: KhorAllreduce only, not yet built by CMake (see README.md here).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct allreduce_kernel {
	char name[256];
	int32_t set, op;
	float prescale, postscale;
};

/* One op in flight: what the engine's callback needs to finish it. */
struct pending {
	TF_OpKernelContext *ctx;
	TF_Tensor *in, *out;
	void *done;
};

static void fail(TF_OpKernelContext *ctx, TF_Code code, const char *msg)
{
	TF_Status *s = TF_NewStatus();
	TF_SetStatus(s, code, msg);
	TF_OpKernelContext_Failure(ctx, s);
	TF_DeleteStatus(s);
}

static void *allreduce_create(TF_OpKernelConstruction *c)
{
	struct allreduce_kernel *k = calloc(1, sizeof(*k));
	TF_Status *s = TF_NewStatus();
	if (k == NULL)
		return NULL;
	TF_OpKernelConstruction_GetAttrString(c, "tensor_name", k->name, sizeof(k->name) - 1, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrInt32(c, "process_set", &k->set, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrInt32(c, "reduce_op", &k->op, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrFloat(c, "prescale_factor", &k->prescale, s);
	if (TF_GetCode(s) == TF_OK)
		TF_OpKernelConstruction_GetAttrFloat(c, "postscale_factor", &k->postscale, s);
	if (TF_GetCode(s) != TF_OK)
		TF_OpKernelConstruction_Failure(c, s);
	TF_DeleteStatus(s);
	return k;
}

static void on_done(void *arg, khor_handle *h, khor_status st)
{
	struct pending *p = arg;
	if (st != KHOR_SUCCESS)
		fail(p->ctx, TF_INTERNAL, khor_handle_error(h));
	khor_handle_free(h);
	TF_DeleteTensor(p->in);
	TF_DeleteTensor(p->out);
	void *done = p->done;
	free(p);
	khor_tf_done_run(done);
}

static void allreduce_compute(void *kernel, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done)
{
	struct allreduce_kernel *k = kernel;
	TF_Status *s = TF_NewStatus();
	TF_Tensor *in = NULL, *out = NULL;
	khor_dtype dt;
	int64_t dims[KHOR_TF_MAX_DIMS];
	char msg[512];

	TF_GetInput(ctx, 0, &in, s);
	if (TF_GetCode(s) != TF_OK) {
		TF_OpKernelContext_Failure(ctx, s);
		goto out;
	}
	int nd = TF_NumDims(in);
	for (int i = 0; i < nd && i < KHOR_TF_MAX_DIMS; i++)
		dims[i] = TF_Dim(in, i);
	if (!khor_dtype_of(TF_TensorType(in), &dt) || nd > KHOR_TF_MAX_DIMS) {
		snprintf(msg, sizeof(msg), "khor allreduce '%s': dtype %d or rank %d not supported",
		         k->name, (int)TF_TensorType(in), nd);
		fail(ctx, TF_INVALID_ARGUMENT, msg);
		goto out;
	}
	out = TF_AllocateOutput(ctx, 0, TF_TensorType(in), dims, nd, TF_TensorByteSize(in), s);
	if (TF_GetCode(s) != TF_OK) {
		TF_OpKernelContext_Failure(ctx, s);
		goto out;
	}
	if (engine == NULL) {
		fail(ctx, TF_FAILED_PRECONDITION, "khor allreduce: khor is not initialized "
		     "(call hvd.init() first)");
		goto out;
	}
	khor_handle *h;
	khor_status st = khor_enqueue_allreduce(engine, k->set, k->name, TF_TensorData(in),
	                                        TF_TensorData(out), dt, nd, dims,
	                                        (khor_op)k->op, k->prescale, k->postscale, &h);
	if (st != KHOR_SUCCESS) {
		fail(ctx, st == KHOR_ERR_INVALID_ARG ? TF_INVALID_ARGUMENT : TF_INTERNAL,
		     khor_engine_error(engine));
		goto out;
	}
	struct pending *p = malloc(sizeof(*p));
	if (p == NULL) {
		khor_handle_wait(h);
		khor_handle_free(h);
		fail(ctx, TF_RESOURCE_EXHAUSTED, "khor allreduce: out of memory");
		goto out;
	}
	*p = (struct pending){.ctx = ctx, .in = in, .out = out,
	                      .done = khor_tf_done_keep(done)};
	TF_DeleteStatus(s);
	khor_handle_set_callback(h, on_done, p);	/* may run on_done here, at once */
	return;
out:
	TF_DeleteTensor(in);
	TF_DeleteTensor(out);
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

__attribute__((constructor)) static void register_ops(void)
{
	TF_Status *s = TF_NewStatus();
	TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder("KhorAllreduce");
	TF_OpDefinitionBuilderAddAttr(b, "T: {half, bfloat16, float, double, int8, uint8, int16, "
	                                 "int32, int64, bool}");
	TF_OpDefinitionBuilderAddAttr(b, "tensor_name: string");
	TF_OpDefinitionBuilderAddAttr(b, "process_set: int = 0");
	TF_OpDefinitionBuilderAddAttr(b, "reduce_op: int = 0");
	TF_OpDefinitionBuilderAddAttr(b, "prescale_factor: float = 1.0");
	TF_OpDefinitionBuilderAddAttr(b, "postscale_factor: float = 1.0");
	TF_OpDefinitionBuilderAddInput(b, "tensor: T");
	TF_OpDefinitionBuilderAddOutput(b, "sum: T");
	/* not stateful: tf.function orders stateful ops as written, and ranks that write them
	 * in different orders would then wait for each other forever */
	TF_OpDefinitionBuilderSetShapeInferenceFunction(b, same_shape);
	TF_RegisterOpDefinition(b, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering KhorAllreduce: %s\n", TF_Message(s));

	TF_KernelBuilder *kb = TF_NewAsyncKernelBuilder("KhorAllreduce", "CPU", allreduce_create,
	                                                allreduce_compute, kernel_delete);
	TF_RegisterKernelBuilder("KhorAllreduce", kb, s);
	if (TF_GetCode(s) != TF_OK)
		fprintf(stderr, "khor: registering KhorAllreduce's kernel: %s\n", TF_Message(s));
	TF_DeleteStatus(s);
}
