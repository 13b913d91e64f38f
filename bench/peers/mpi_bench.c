/*
 * mpi_bench.c -- mpi-bench, khor-bench's twin on OpenMPI, the yardstick khor is measured by.
 *
 *   mpirun -np 4 --mca btl tcp,self --mca btl_tcp_if_include lo mpi-bench allreduce -e 64M
 *
 * Same flags, sweep, checks and columns as khor-bench (all of it in ../bench_*.c, compiled
 * in, and ../bench.h); only the calls differ: MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Allgather, MPI_Reduce_scatter
 * (_block when the blocks are even), MPI_Alltoall, MPI_Gather, MPI_Scatter, MPI_Barrier.
 * Built with mpicc on its own (never linked with khor), so it measures MPI and nothing else.
 *
 * What MPI lacks is done the way an MPI user does it, and timed with the call:
 * - avg is MPI_SUM followed by a local division on the ranks that get a result;
 * - half and bfloat16 have no MPI type (before MPI 4.1): they travel as MPI_UINT16_T and are
 *   reduced by user-defined ops that widen to float and round once, as khor's kernels do.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_args.h"
#include "bench/bench_data.h"
#include "bench/bench_sweep.h"

#define PROG "mpi-bench"

static MPI_Datatype to_mpi_dtype(enum bench_dtype d)
{
	switch (d) {
	case BENCH_F32: return MPI_FLOAT;
	case BENCH_F64: return MPI_DOUBLE;
	case BENCH_I32: return MPI_INT32_T;
	case BENCH_I64: return MPI_INT64_T;
	case BENCH_F16:
	case BENCH_BF16: return MPI_UINT16_T;
	case BENCH_I8: return MPI_INT8_T;
	case BENCH_U8: return MPI_UINT8_T;
	case BENCH_I16: return MPI_INT16_T;
	}
	return MPI_FLOAT;
}

/*
 * User ops for the 16-bit floats: [dtype - BENCH_F16][op]. MPI calls them with the
 * MPI_UINT16_T buffers; each element is widened, combined and rounded back.
 */
#define MB_HALF_OP(name, to32, from32, expr)                                          \
	static void name(void *in, void *inout, int *len, MPI_Datatype *dt)           \
	{                                                                             \
		(void)dt;                                                                 \
		const uint16_t *x = in;                                                   \
		uint16_t *y = inout;                                                      \
		for (int i = 0; i < *len; i++) {                                          \
			float a = to32(x[i]), b = to32(y[i]);                                 \
			y[i] = from32(expr);                                                  \
		}                                                                         \
	}
MB_HALF_OP(mb_f16_sum, bench_f16_to_f32, bench_f32_to_f16, a + b)
MB_HALF_OP(mb_f16_min, bench_f16_to_f32, bench_f32_to_f16, a < b ? a : b)
MB_HALF_OP(mb_f16_max, bench_f16_to_f32, bench_f32_to_f16, a > b ? a : b)
MB_HALF_OP(mb_f16_prod, bench_f16_to_f32, bench_f32_to_f16, a * b)
MB_HALF_OP(mb_bf16_sum, bench_bf16_to_f32, bench_f32_to_bf16, a + b)
MB_HALF_OP(mb_bf16_min, bench_bf16_to_f32, bench_f32_to_bf16, a < b ? a : b)
MB_HALF_OP(mb_bf16_max, bench_bf16_to_f32, bench_f32_to_bf16, a > b ? a : b)
MB_HALF_OP(mb_bf16_prod, bench_bf16_to_f32, bench_f32_to_bf16, a * b)
#undef MB_HALF_OP

static MPI_Op mb_half_ops[2][5];

static void mb_create_half_ops(void)
{
	static MPI_User_function *const fns[2][4] = {
		{mb_f16_sum, mb_f16_min, mb_f16_max, mb_f16_prod},
		{mb_bf16_sum, mb_bf16_min, mb_bf16_max, mb_bf16_prod},
	};
	for (int t = 0; t < 2; t++) {
		MPI_Op_create(fns[t][0], 1, &mb_half_ops[t][BENCH_SUM]);
		mb_half_ops[t][BENCH_AVG] = mb_half_ops[t][BENCH_SUM];
		MPI_Op_create(fns[t][1], 1, &mb_half_ops[t][BENCH_MIN]);
		MPI_Op_create(fns[t][2], 1, &mb_half_ops[t][BENCH_MAX]);
		MPI_Op_create(fns[t][3], 1, &mb_half_ops[t][BENCH_PROD]);
	}
}

static void mb_free_half_ops(void)
{
	for (int t = 0; t < 2; t++)
		for (int op = BENCH_SUM; op <= BENCH_PROD; op++)
			if (op != BENCH_AVG)
				MPI_Op_free(&mb_half_ops[t][op]);
}

static MPI_Op to_mpi_op(enum bench_dtype d, enum bench_op op)
{
	if (d == BENCH_F16 || d == BENCH_BF16)
		return mb_half_ops[d - BENCH_F16][op];
	switch (op) {
	case BENCH_SUM:
	case BENCH_AVG: return MPI_SUM;
	case BENCH_MIN: return MPI_MIN;
	case BENCH_MAX: return MPI_MAX;
	case BENCH_PROD: return MPI_PROD;
	}
	return MPI_SUM;
}

/*
 * The text of the last failed call (MPI_ERRORS_RETURN makes failures come back here) and the
 * per-rank counts of an uneven MPI_Reduce_scatter.
 */
struct mpi_ctx {
	char error[MPI_MAX_ERROR_STRING + 64];
	int *rs_counts;
};

static int mb_result(struct bench_backend *b, int mpi_rc, const char *call)
{
	if (mpi_rc == MPI_SUCCESS)
		return 0;
	struct mpi_ctx *m = b->ctx;
	char text[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS)
		snprintf(text, sizeof text, "MPI error code %d", mpi_rc);
	snprintf(m->error, sizeof m->error, "%s: %s", call, text);
	return -1;
}

/* MPI counts are int: refuse what would wrap rather than send a truncated message. */
static int mb_count(struct bench_backend *b, size_t count, const char *call)
{
	if (count <= INT_MAX)
		return 0;
	struct mpi_ctx *m = b->ctx;
	snprintf(m->error, sizeof m->error, "%s: %zu elements exceed MPI's int count; lower -e",
	         call, count);
	return -1;
}

/* avg: the sum divided by n, here; integer avg truncates toward zero as khor.h defines it. */
static void mb_divide(void *buf, size_t count, enum bench_dtype d, int n)
{
	for (size_t i = 0; i < count; i++) {
		switch (d) {
		case BENCH_F32: ((float *)buf)[i] /= (float)n; break;
		case BENCH_F64: ((double *)buf)[i] /= n; break;
		case BENCH_I32: ((int32_t *)buf)[i] /= n; break;
		case BENCH_I64: ((int64_t *)buf)[i] /= n; break;
		case BENCH_I8: ((int8_t *)buf)[i] = (int8_t)(((int8_t *)buf)[i] / n); break;
		case BENCH_U8: ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / n); break;
		case BENCH_I16: ((int16_t *)buf)[i] = (int16_t)(((int16_t *)buf)[i] / n); break;
		case BENCH_F16:
			((uint16_t *)buf)[i] =
				bench_f32_to_f16(bench_f16_to_f32(((uint16_t *)buf)[i]) / (float)n);
			break;
		case BENCH_BF16:
			((uint16_t *)buf)[i] =
				bench_f32_to_bf16(bench_bf16_to_f32(((uint16_t *)buf)[i]) / (float)n);
			break;
		}
	}
}

static int mb_allreduce(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                        size_t count, enum bench_dtype dtype, enum bench_op op)
{
	if (mb_count(b, count, "MPI_Allreduce"))
		return -1;
	int rc = MPI_Allreduce(sendbuf, recvbuf, (int)count, to_mpi_dtype(dtype),
	                       to_mpi_op(dtype, op), MPI_COMM_WORLD);
	if (mb_result(b, rc, "MPI_Allreduce"))
		return -1;
	if (op == BENCH_AVG)
		mb_divide(recvbuf, count, dtype, b->size);
	return 0;
}

static int mb_reduce(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                     enum bench_dtype dtype, enum bench_op op, int root)
{
	if (mb_count(b, count, "MPI_Reduce"))
		return -1;
	int rc = MPI_Reduce(sendbuf, recvbuf, (int)count, to_mpi_dtype(dtype), to_mpi_op(dtype, op),
	                    root, MPI_COMM_WORLD);
	if (mb_result(b, rc, "MPI_Reduce"))
		return -1;
	if (op == BENCH_AVG && b->rank == root)
		mb_divide(recvbuf, count, dtype, b->size);
	return 0;
}

static int mb_allgather(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                        size_t count, enum bench_dtype dtype)
{
	if (mb_count(b, count, "MPI_Allgather"))
		return -1;
	MPI_Datatype t = to_mpi_dtype(dtype);
	return mb_result(b, MPI_Allgather(sendbuf, (int)count, t, recvbuf, (int)count, t,
	                                  MPI_COMM_WORLD), "MPI_Allgather");
}

static int mb_reduce_scatter(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                             size_t count, enum bench_dtype dtype, enum bench_op op)
{
	struct mpi_ctx *m = b->ctx;
	int n = b->size, rc;
	const char *call;
	if (mb_count(b, count, "MPI_Reduce_scatter"))
		return -1;
	if (count % (size_t)n == 0) {
		call = "MPI_Reduce_scatter_block";
		rc = MPI_Reduce_scatter_block(sendbuf, recvbuf, (int)(count / (size_t)n),
		                              to_mpi_dtype(dtype), to_mpi_op(dtype, op),
		                              MPI_COMM_WORLD);
	} else {
		/* khor.h's split: count/n each, the first count%n ranks one more. */
		call = "MPI_Reduce_scatter";
		for (int r = 0; r < n; r++)
			m->rs_counts[r] = (int)bench_rs_count(count, n, r);
		rc = MPI_Reduce_scatter(sendbuf, recvbuf, m->rs_counts, to_mpi_dtype(dtype),
		                        to_mpi_op(dtype, op), MPI_COMM_WORLD);
	}
	if (mb_result(b, rc, call))
		return -1;
	if (op == BENCH_AVG)
		mb_divide(recvbuf, bench_rs_count(count, n, b->rank), dtype, n);
	return 0;
}

static int mb_alltoall(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                       enum bench_dtype dtype)
{
	if (mb_count(b, count, "MPI_Alltoall"))
		return -1;
	MPI_Datatype t = to_mpi_dtype(dtype);
	return mb_result(b, MPI_Alltoall(sendbuf, (int)count, t, recvbuf, (int)count, t,
	                                 MPI_COMM_WORLD), "MPI_Alltoall");
}

static int mb_gather(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                     enum bench_dtype dtype, int root)
{
	if (mb_count(b, count, "MPI_Gather"))
		return -1;
	MPI_Datatype t = to_mpi_dtype(dtype);
	return mb_result(b, MPI_Gather(sendbuf, (int)count, t, recvbuf, (int)count, t, root,
	                               MPI_COMM_WORLD), "MPI_Gather");
}

static int mb_scatter(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                      enum bench_dtype dtype, int root)
{
	if (mb_count(b, count, "MPI_Scatter"))
		return -1;
	MPI_Datatype t = to_mpi_dtype(dtype);
	return mb_result(b, MPI_Scatter(sendbuf, (int)count, t, recvbuf, (int)count, t, root,
	                                MPI_COMM_WORLD), "MPI_Scatter");
}

static int mb_broadcast(struct bench_backend *b, void *buf, size_t count, enum bench_dtype dtype,
                        int root)
{
	if (mb_count(b, count, "MPI_Bcast"))
		return -1;
	return mb_result(b, MPI_Bcast(buf, (int)count, to_mpi_dtype(dtype), root, MPI_COMM_WORLD),
	                 "MPI_Bcast");
}

static int mb_barrier(struct bench_backend *b)
{
	return mb_result(b, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

static const char *mb_error(struct bench_backend *b)
{
	return ((struct mpi_ctx *)b->ctx)->error;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	/* Parsed after MPI_Init, which may remove its own arguments from argv. Every rank sees
	 * the same flags, so every rank leaves the same way. */
	struct bench_args args;
	int rc = bench_parse_args(argc, argv, PROG, NULL, &args);
	if (rc) {
		MPI_Finalize();
		return rc == 1 ? 0 : 2;
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

	char library[64];
#if defined(OMPI_MAJOR_VERSION)
	snprintf(library, sizeof library, "Open MPI %d.%d.%d", OMPI_MAJOR_VERSION,
	         OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#else
	int major = 0, minor = 0;
	MPI_Get_version(&major, &minor);
	snprintf(library, sizeof library, "MPI %d.%d", major, minor);
#endif
	/* mpirun passes --mca btl X to the ranks as OMPI_MCA_btl: say which transport ran. */
	const char *btl = getenv("OMPI_MCA_btl"), *pml = getenv("OMPI_MCA_pml");
	char transport[128];
	snprintf(transport, sizeof transport, "%s%s%s", pml ? pml : "", pml ? "/" : "",
	         btl ? btl : "default");
	struct mpi_ctx ctx = {{0}, NULL};
	struct bench_backend b = {
		.prog = PROG,
		.library = library,
		.transport = transport,
		.algo = "default",
		.ctx = &ctx,
		.allreduce = mb_allreduce,
		.broadcast = mb_broadcast,
		.barrier = mb_barrier,
		.reduce = mb_reduce,
		.allgather = mb_allgather,
		.reduce_scatter = mb_reduce_scatter,
		.alltoall = mb_alltoall,
		.gather = mb_gather,
		.scatter = mb_scatter,
		.error = mb_error,
	};
	MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &b.size);
	ctx.rs_counts = calloc((size_t)b.size, sizeof *ctx.rs_counts);
	if (!ctx.rs_counts) {
		fprintf(stderr, PROG ": rank %d: out of memory\n", b.rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	mb_create_half_ops();
	rc = bench_run(&b, &args);
	/* After a failed call the other ranks may never reach MPI_Finalize; abort the job so
	 * mpirun does not wait on them. Wrong results alone end every rank the same way. */
	if (ctx.error[0])
		MPI_Abort(MPI_COMM_WORLD, 1);
	mb_free_half_ops();
	free(ctx.rs_counts);
	MPI_Finalize();
	return rc;
}
