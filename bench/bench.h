/*
 * bench.h -- what khor-bench and its OpenMPI peer, mpi-bench, share: the types of the
 * benchmark body that both are built from.
 *
 * Both programs must print exactly the same columns, parse exactly the same flags and check
 * results the same way, or comparing them means nothing. So everything but the library calls
 * lives in the bench_*.c files, one concern each: flag parsing (bench_args, nccl-tests'
 * flags), the table of collectives with nccl-tests' size conventions and bus-bandwidth
 * factors (bench_colls), the data patterns and their checks (bench_data), buffers of a
 * memory kind (bench_bufs), the clock and medians (bench_stats), the table, CSV and JSON
 * output (bench_output), the timed sweep and progress lines (bench_sweep) and several comms
 * at once (bench_comms). A program supplies a bench_backend (its rank, size and
 * collectives) and calls bench_run(). The gloo peer (peers/gloo_bench.py) cannot link C; it
 * follows the same rules and prints the same columns, so a change to the patterns or the
 * columns here must be made there too.
 *
 * None of these files includes khor.h or mpi.h: khor-bench may use only khor's public API
 * and mpi-bench must never see khor at all. khor-bench links them as the static library
 * khor_bench_body; mpi-bench's mpicc command compiles them in (bench/CMakeLists.txt).
 *
 * Sizes follow nccl-tests: "size" is the bytes of the largest buffer of one rank, so for
 * allgather and gather it is the gathered result, for reducescatter and scatter the full
 * input, for alltoall each rank's whole send buffer. algbw = size / time and
 * busbw = algbw x factor (allreduce 2(n-1)/n; allgather, reducescatter, alltoall, gather,
 * scatter (n-1)/n; broadcast and reduce 1), so busbw compares with the link speed whatever
 * the collective.
 *
 * Output, on rank 0 only (nccl-tests' layout):
 *
 *   # khor-bench allreduce: 4 ranks, dtype float, op sum, iters 20, warmup 5, check 1
 *   # library: khor 0.1.0 (transport auto, algo auto)
 *   #
 *   #       size         count      type   redop     time   algbw   busbw  #wrong
 *   #        (B)    (elements)                       (us)  (GB/s)  (GB/s)
 *              8             2     float     sum    41.20    0.00    0.00       0
 *   ...
 *   # Out of bounds values : 0 OK
 *   # Avg bus bandwidth    : 1.234
 *
 * Several comms at once (khor-bench --comms 1,2): bench_run_comms() (bench_comms) runs each size on
 * K comms over the same ranks, one thread each, for every K of the list in turn, and prints a row
 * per size and K with each comm's time and busbw and their sum. It needs the backend's dup and
 * free_comm, and pthreads; a program that never calls it needs neither.
 *
 * Device buffers (khor-bench --mem cuda|both): a program may give bench_run() memory kinds
 * other than host memory (struct bench_mem). The patterns are still written and checked by
 * the CPU, in host copies of the buffers, moved to and from the device outside the timed
 * calls. With two kinds (host and cuda) each size is timed on both, interleaved in rounds as
 * the algorithms of --algo a,b are, and the row shows both and the ratio of their busbw. A
 * run on host memory alone prints what it always did; the mem column of the CSV and JSON is
 * there only when a run has device buffers.
 */
#ifndef KHOR_BENCH_H
#define KHOR_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* The benchmark's own dtype and op names; each backend maps them onto its library's. */
enum bench_dtype {
	BENCH_F32,
	BENCH_F64,
	BENCH_I32,
	BENCH_I64,
	BENCH_F16,
	BENCH_BF16,
	BENCH_I8,
	BENCH_U8,
	BENCH_I16
};
#define BENCH_NDTYPES 9
enum bench_op { BENCH_SUM, BENCH_AVG, BENCH_MIN, BENCH_MAX, BENCH_PROD };
#define BENCH_MAX_ALGOS 8
/* In comparison mode the timed calls run in this many rounds, each algorithm in turn. */
#define BENCH_ROUNDS 5
#define BENCH_MAX_MEMS 2

/*
 * A kind of memory other than the host's, for the buffers the collectives get (a program's
 * device memory). The benchmark never touches it directly: it fills and checks host copies
 * and moves them with put and get, which return when the copy is done. alloc returns NULL,
 * and put and get -1, with the reason written to why (len bytes). Called from any of the
 * benchmark's threads (--comms), so each op makes whatever state it needs current itself.
 */
struct bench_mem {
	const char *name;  /* "cuda": the mem column and the table's column names */
	const char *where; /* the header's words for it: "cuda device 0 of 1 (NVIDIA H200)" */
	void *ctx;
	void *(*alloc)(const struct bench_mem *m, size_t bytes, char *why, size_t len);
	void (*free)(const struct bench_mem *m, void *p);
	int (*put)(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
	           size_t len);
	int (*get)(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
	           size_t len);
};

/*
 * What a program gives bench_run(). Each collective returns 0 on success and -1 on failure,
 * after which error() returns text that says why (khor_comm_error, MPI_Error_string). A
 * library that lacks a collective leaves its pointer NULL and bench_run() says so. Counts
 * are in elements and mean what khor.h says for the khor call of the same name.
 */
struct bench_backend {
	const char *prog;      /* "khor-bench": the header's first word */
	const char *library;   /* "khor 0.1.0", printed in the header */
	const char *transport; /* as asked for: "auto", "shm"; MPI: "ob1/tcp,self" */
	const char *algo;      /* the algorithm asked for: "auto", "ring", "default" */
	/*
	 * Comparison mode (khor-bench --algo ring,tree,auto): nalgos > 1 algorithms, switched
	 * with set_algo on every rank between calls. nalgos 0 or 1: one algorithm, as algo says.
	 */
	int nalgos;
	const char *algos[BENCH_MAX_ALGOS];
	int (*set_algo)(struct bench_backend *b, const char *algo);
	int rank;
	int size;
	void *ctx;
	int (*allreduce)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	                 enum bench_dtype dtype, enum bench_op op);
	int (*broadcast)(struct bench_backend *b, void *buf, size_t count, enum bench_dtype dtype,
	                 int root);
	int (*barrier)(struct bench_backend *b);
	int (*reduce)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	              enum bench_dtype dtype, enum bench_op op, int root);
	/* count: elements each rank contributes */
	int (*allgather)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	                 enum bench_dtype dtype);
	/* count: the whole input; rank r gets count/n elements, one more when r < count%n */
	int (*reduce_scatter)(struct bench_backend *b, const void *sendbuf, void *recvbuf,
	                      size_t count, enum bench_dtype dtype, enum bench_op op);
	/* count: elements per block, n blocks each way */
	int (*alltoall)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	                enum bench_dtype dtype);
	int (*gather)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	              enum bench_dtype dtype, int root);
	int (*scatter)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	               enum bench_dtype dtype, int root);
	const char *(*error)(struct bench_backend *b);
	/*
	 * Several comms at once (bench_run_comms), NULL in a program without that mode. dup is a
	 * collective on b: every rank calls it, and each gets in *out a copy of b for a new comm
	 * over the same ranks, with its own ctx and, in prog, a label naming that comm (index is
	 * its place among the comms of the run; -1 for one made only to be timed). On failure it
	 * returns -1 and b's error() says why. free_comm undoes dup; as the comm and its error
	 * text go with it, it says why itself on stderr when it fails. The output names the two
	 * calls dup_name and free_name.
	 */
	int (*dup)(struct bench_backend *b, int index, struct bench_backend *out);
	int (*free_comm)(struct bench_backend *b);
	const char *dup_name;  /* "khor_comm_split" */
	const char *free_name; /* "khor_comm_free" */
	/* Set by bench_run_comms while a thread of its own drives this backend; else NULL. */
	struct bench_thread *thread;
	/*
	 * Where the buffers live: nmems kinds, a NULL entry for host memory; nmems 0 is host
	 * memory alone. Two kinds are timed side by side (bench_run only, one algorithm).
	 */
	int nmems;
	const struct bench_mem *mems[BENCH_MAX_MEMS];
};

/* -c: nccl-tests' 0 and 1, and "all" (--check): every iteration, warm-up included. */
enum bench_check { BENCH_CHECK_NONE = 0, BENCH_CHECK_ONCE = 1, BENCH_CHECK_ALL = 2 };

struct bench_args {
	const struct bench_coll *coll;
	size_t minbytes;
	size_t maxbytes;
	size_t stepfactor; /* used when stepbytes is 0 */
	size_t stepbytes;
	int iters;
	int warmup;
	enum bench_check check;
	enum bench_dtype dtype;
	enum bench_op op;
	int root;
	int quiet;         /* no table on stdout (CSV or JSON only) */
	double progress_s; /* a progress line once a size has run this long; 0: never */
	size_t offset;     /* buffers start this many bytes past a page boundary */
	const char *csv;
	const char *json;
};

/*
 * The element counts of one row. total is nccl-tests' count (size / element size, rounded
 * down to what the collective can split evenly); param is the count the library call takes;
 * send and recv are the elements each rank's buffers hold.
 */
struct bench_shape {
	size_t total;
	size_t param;
	size_t send;
	size_t recv;
};

/*
 * One collective of the sweep. shape() turns a total element count into the call's counts;
 * fill() writes the inputs of a checked iteration and a sentinel over the outputs, check()
 * counts wrong output elements on this rank, run() is one call of the collective.
 */
#define BENCH_USES_OP 1u   /* the header and rows print the op */
#define BENCH_USES_ROOT 2u /* -r applies */
#define BENCH_NO_DATA 4u   /* barrier: one row, no sizes, no data */

struct bench_coll {
	const char *name;
	unsigned flags;
	int (*available)(const struct bench_backend *b); /* does the library have it? */
	double (*busbw_factor)(int nranks);
	void (*shape)(size_t total, int nranks, struct bench_shape *s);
	int (*run)(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
	           void *sendbuf, void *recvbuf);
	void (*fill)(const struct bench_backend *b, const struct bench_args *a,
	             const struct bench_shape *s, void *sendbuf, void *recvbuf);
	int64_t (*check)(const struct bench_backend *b, const struct bench_args *a,
	                 const struct bench_shape *s, const void *recvbuf);
};

#endif
