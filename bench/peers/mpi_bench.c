/*
 * mpi_bench.c -- mpi-bench, khor-bench's twin on OpenMPI, the yardstick khor is measured by.
 *
 *   mpirun -np 4 --mca btl tcp,self --mca btl_tcp_if_include lo mpi-bench allreduce -e 64M
 *
 * Same flags, sweep, checks and columns as khor-bench (all of it in ../bench_common.h); only
 * the three calls differ: MPI_Allreduce, MPI_Bcast, MPI_Barrier. Built with mpicc on its own
 * (never linked with khor), so it measures MPI and nothing else.
 *
 * MPI has no average: avg is MPI_SUM followed by a local division, which is what a user
 * of MPI does too, and the division is timed with it.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include "../bench_common.h"

#define PROG "mpi-bench"

static MPI_Datatype to_mpi_dtype(enum bench_dtype d)
{
	switch (d) {
	case BENCH_F32: return MPI_FLOAT;
	case BENCH_F64: return MPI_DOUBLE;
	case BENCH_I32: return MPI_INT32_T;
	case BENCH_I64: return MPI_INT64_T;
	}
	return MPI_FLOAT;
}

static MPI_Op to_mpi_op(enum bench_op op)
{
	switch (op) {
	case BENCH_SUM:
	case BENCH_AVG: return MPI_SUM;
	case BENCH_MIN: return MPI_MIN;
	case BENCH_MAX: return MPI_MAX;
	case BENCH_PROD: return MPI_PROD;
	}
	return MPI_SUM;
}

/* The text of the last failed call; MPI_ERRORS_RETURN makes failures come back here. */
struct mpi_ctx {
	char error[MPI_MAX_ERROR_STRING + 64];
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

static int mb_allreduce(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                        size_t count, enum bench_dtype dtype, enum bench_op op)
{
	if (mb_count(b, count, "MPI_Allreduce"))
		return -1;
	int rc = MPI_Allreduce(sendbuf, recvbuf, (int)count, to_mpi_dtype(dtype), to_mpi_op(op),
	                       MPI_COMM_WORLD);
	if (mb_result(b, rc, "MPI_Allreduce"))
		return -1;
	if (op == BENCH_AVG) {
		int n = b->size;
		/* Integer avg truncates toward zero, as khor.h defines it; C's / does the same. */
		for (size_t i = 0; i < count; i++) {
			switch (dtype) {
			case BENCH_F32: ((float *)recvbuf)[i] /= (float)n; break;
			case BENCH_F64: ((double *)recvbuf)[i] /= n; break;
			case BENCH_I32: ((int32_t *)recvbuf)[i] /= n; break;
			case BENCH_I64: ((int64_t *)recvbuf)[i] /= n; break;
			}
		}
	}
	return 0;
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
	int rc = bench_parse_args(argc, argv, PROG, &args);
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
	struct mpi_ctx ctx = {{0}};
	struct bench_backend b = {
		.prog = PROG,
		.library = library,
		.ctx = &ctx,
		.allreduce = mb_allreduce,
		.broadcast = mb_broadcast,
		.barrier = mb_barrier,
		.error = mb_error,
	};
	MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &b.size);
	rc = bench_run(&b, &args);
	/* After a failed call the other ranks may never reach MPI_Finalize; abort the job so
	 * mpirun does not wait on them. Wrong results alone end every rank the same way. */
	if (ctx.error[0])
		MPI_Abort(MPI_COMM_WORLD, 1);
	MPI_Finalize();
	return rc;
}
