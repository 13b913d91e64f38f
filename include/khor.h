/*
 * khor.h -- the one public header of khor, a collective-communication library for
 * distributed deep learning (TCP, shared-memory and verbs transports; ring, tree and
 * recursive-doubling collectives; no MPI).
 *
 * Threads. One khor_init makes a context (transports, links, the store connection, the
 * topology) and its world comm; khor_comm_split and khor_comm_create_group make more comms
 * over the same links. The rules:
 *   - Different comms may be used from different threads at the same time, in any order,
 *     and their collectives run concurrently over the shared links: one comm's frames never
 *     wait behind another comm's (a bounded per-link queue takes frames nobody has asked
 *     for yet; a sender that overruns it is slowed down, never dropped).
 *   - One comm is meant for one thread at a time. Calls that several threads make on the
 *     same comm at once are serialised by the library in the order they enter it (each takes
 *     its sequence number on entry), and every rank must end up with the same order, which
 *     in practice only holds if the application orders them itself.
 *   - khor_comm_split is a collective on the parent comm and follows its rule: ordered
 *     with the parent's other calls, on every rank. khor_comm_create_group involves the
 *     listed ranks only and meets through the store, not the parent's order.
 *   - Getters (khor_rank, khor_size, local and cross rank and size, khor_comm_id,
 *     khor_comm_world_rank), khor_comm_error, khor_request_error and khor_test may be
 *     called from any thread at any time while the comm or request exists.
 *   - khor_wait and khor_request_free on one request from one thread at a time.
 *   - khor_comm_free on a comm that no other thread is calling into; it waits for the
 *     comm's queued non-blocking calls first. khor_finalize after every other thread has
 *     stopped calling into any comm of the context; it frees the comms not freed yet.
 *   - khor_init itself from one thread at a time.
 * Progress: whoever waits drives. A blocking call moves its own bytes and those of any
 * other comm on the links it touches; the i* calls run on the comm's collective thread.
 *
 * ABI rules: every type a caller sees is either an opaque handle or a fixed-value enum;
 * there are no public structs, so fields can change without breaking binaries built
 * against an older libkhor.so.0. Every function returns khor_status; on failure the
 * detail (this rank and host, the peer, the operation, its sequence number, the cause)
 * is in khor_comm_error(). Output parameters come last, are named *_out and are written
 * only on success.
 */
#ifndef KHOR_H
#define KHOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KHOR_BUILDING_LIBRARY)
#define KHOR_API __attribute__((visibility("default")))
#else
#define KHOR_API
#endif

#define KHOR_VERSION_MAJOR 0
#define KHOR_VERSION_MINOR 1
#define KHOR_VERSION_PATCH 0

typedef enum khor_status {
	KHOR_SUCCESS = 0,
	KHOR_IN_PROGRESS = 1,      /* khor_test: the request has not completed yet */
	KHOR_ERR_INVALID_ARG = 2,  /* a bad argument or configuration value */
	KHOR_ERR_NO_MEMORY = 3,
	KHOR_ERR_SYSTEM = 4,       /* a system call failed; the error text has errno's message */
	KHOR_ERR_TIMEOUT = 5,      /* a deadline (KHOR_TIMEOUT) passed; the text names who was late */
	KHOR_ERR_REMOTE = 6,       /* a peer failed, closed its connection or reported an error */
	KHOR_ERR_PROTOCOL = 7,     /* malformed or mismatched bytes on a link or from the store */
	KHOR_ERR_AUTH = 8,         /* the job secret did not match */
	KHOR_ERR_NOT_SUPPORTED = 9,
	KHOR_ERR_INTERNAL = 10
} khor_status;

typedef enum khor_dtype {
	KHOR_FLOAT32 = 0,
	KHOR_FLOAT64 = 1,
	KHOR_INT32 = 2,
	KHOR_INT64 = 3,
	KHOR_FLOAT16 = 4,
	KHOR_BFLOAT16 = 5,
	KHOR_INT8 = 6,
	KHOR_UINT8 = 7,
	KHOR_BOOL = 8
} khor_dtype;

/* avg on integer types is the sum divided by the number of ranks, truncated toward zero. */
typedef enum khor_op {
	KHOR_SUM = 0,
	KHOR_AVG = 1,
	KHOR_MIN = 2,
	KHOR_MAX = 3,
	KHOR_PROD = 4
} khor_op;

typedef struct khor_config khor_config;   /* key/value settings given to khor_init */
typedef struct khor_comm khor_comm;       /* a group of ranks with its links and error */
typedef struct khor_request khor_request; /* a non-blocking collective in flight */

/* Library identity: "0.1.0". */
KHOR_API const char *khor_version(void);
/* A fixed English sentence for a status code (never NULL). */
KHOR_API const char *khor_strerror(khor_status status);
/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
KHOR_API size_t khor_dtype_size(khor_dtype dtype);

/*
 * Configuration. Keys are the KHOR_* variable names of the README table (for example
 * "KHOR_RANK", "KHOR_SIZE", "KHOR_STORE_ADDR", "KHOR_TIMEOUT"); a value set here wins over
 * the environment. Unknown keys are refused with KHOR_ERR_INVALID_ARG.
 */
KHOR_API khor_status khor_config_create(khor_config **config_out);
KHOR_API khor_status khor_config_set(khor_config *config, const char *key, const char *value);
KHOR_API void khor_config_destroy(khor_config *config);

/*
 * Joins the job. The rank, size and rendezvous address come from, in order: the config,
 * khorrun's KHOR_* variables, torchrun's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT,
 * Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; with none of them, a one-rank job.
 * config may be NULL. Blocks until every rank has joined or KHOR_TIMEOUT passes, in which
 * case the error names the ranks that never came. On failure *comm_out is untouched and, if
 * error_out is not NULL, a description is copied there (error_len bytes at most).
 */
KHOR_API khor_status khor_init(const khor_config *config, char *error_out, size_t error_len,
                               khor_comm **comm_out);
/* Leaves the job: frees the context of comm (any of its comms may be given) with the world
 * and every comm made from it that was not freed yet. Safe to call after an error. */
KHOR_API khor_status khor_finalize(khor_comm *comm);

KHOR_API int khor_rank(const khor_comm *comm);
KHOR_API int khor_size(const khor_comm *comm);
KHOR_API int khor_local_rank(const khor_comm *comm);  /* rank among the ranks on this host */
KHOR_API int khor_local_size(const khor_comm *comm);
KHOR_API int khor_cross_rank(const khor_comm *comm);  /* rank among ranks of equal local_rank */
KHOR_API int khor_cross_size(const khor_comm *comm);

/*
 * Comms that share the parent's links (no socket is opened; a few store round trips at
 * most). Split is a collective on its parent, called in the same order with the parent's
 * other collectives; create_group is called by the listed ranks only.
 *
 * khor_comm_split (MPI_Comm_split): every rank of comm calls it; ranks with the same
 * color >= 0 form a new comm, ranked by key and then by their rank in comm. A negative
 * color means "in no new comm": *newcomm_out is set to NULL and KHOR_SUCCESS returned.
 *
 * khor_comm_create_group: the nranks ranks listed (ranks of comm, no repeats) form a new
 * comm, ranked in list order. Every listed rank calls it with the same list; the others
 * need not call it (one that does gets NULL). A list that differs between its members is
 * an error on them (at the latest after KHOR_TIMEOUT), never a hang.
 *
 * The new comm has its own id, sequence numbers, scratch, tuning (a copy of the parent's
 * KHOR_ALGO and KHOR_HIER) and sticky error; its local and cross ranks count its own
 * members. Free it with khor_comm_free (or let khor_finalize do it).
 */
KHOR_API khor_status khor_comm_split(khor_comm *comm, int color, int key,
                                     khor_comm **newcomm_out);
KHOR_API khor_status khor_comm_create_group(khor_comm *comm, const int *ranks, int nranks,
                                            khor_comm **newcomm_out);
/* Frees a comm made by split or create_group (waits for its queued calls first). Not the
 * world comm: that one goes with khor_finalize (KHOR_ERR_INVALID_ARG). Requests of the
 * comm that are not freed yet stay valid for khor_wait, khor_test, khor_request_error
 * and khor_request_free. */
KHOR_API khor_status khor_comm_free(khor_comm *comm);
/* The comm's id, the same on all its members (0 for the world); -1 for NULL. */
KHOR_API int64_t khor_comm_id(const khor_comm *comm);
/* The world rank of this comm's rank r, or -1 when r is out of range. */
KHOR_API int khor_comm_world_rank(const khor_comm *comm, int rank);

/*
 * The comm's first error, which is sticky: after it every call on the comm fails fast with
 * the same status. "" when there was none.
 */
KHOR_API const char *khor_comm_error(const khor_comm *comm);

/*
 * Changes a setting of a joined comm for the calls made after it; calls already made (an
 * i* call still queued) keep the value they were made with. Only KHOR_ALGO and KHOR_HIER
 * can change; other keys, and values that khor_init would refuse, give
 * KHOR_ERR_INVALID_ARG with the reason in khor_comm_error. Every rank must make the same
 * change between the same two calls, like any collective argument: a rank that picks
 * another algorithm for the same call is seen as a mismatch (an error, never a hang beyond
 * KHOR_TIMEOUT). Used by khor-bench to compare algorithms inside one job.
 */
KHOR_API khor_status khor_comm_set(khor_comm *comm, const char *key, const char *value);

/*
 * Collectives on host memory. Every rank calls them in the same order with the same count,
 * dtype and op. sendbuf == recvbuf means in place.
 */
KHOR_API khor_status khor_allreduce(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype, khor_op op);
KHOR_API khor_status khor_broadcast(khor_comm *comm, void *buf, size_t count,
                                    khor_dtype dtype, int root);
KHOR_API khor_status khor_barrier(khor_comm *comm);

/* reduce: the reduction of every rank's sendbuf lands in root's recvbuf (ignored elsewhere). */
KHOR_API khor_status khor_reduce(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 khor_dtype dtype, khor_op op, int root);
/* allgather: rank r's count elements land at recvbuf + r * count on every rank. */
KHOR_API khor_status khor_allgather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype);
/*
 * allgatherv: rank r sends sendcount (== recvcounts[r]) elements, which land at
 * recvbuf + displs[r] elements on every rank; displs NULL packs the blocks in rank order.
 */
KHOR_API khor_status khor_allgatherv(khor_comm *comm, const void *sendbuf, size_t sendcount,
                                     void *recvbuf, const size_t *recvcounts,
                                     const size_t *displs, khor_dtype dtype);
/*
 * reduce_scatter: sendbuf holds count elements on every rank; rank r receives block r of
 * the reduction. Blocks are count / n elements, and the first count % n ranks get one more.
 */
KHOR_API khor_status khor_reduce_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, khor_dtype dtype, khor_op op);
/* alltoall: block j (count elements) of rank i's sendbuf lands in block i of rank j's recvbuf. */
KHOR_API khor_status khor_alltoall(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype);
/* alltoallv: per-peer counts and displacements in elements (NULL displs = packed). */
KHOR_API khor_status khor_alltoallv(khor_comm *comm, const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf,
                                    const size_t *recvcounts, const size_t *rdispls,
                                    khor_dtype dtype);
/* gather: rank r's count elements land at root's recvbuf + r * count. */
KHOR_API khor_status khor_gather(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 khor_dtype dtype, int root);
/* scatter: block r (count elements) of root's sendbuf lands in rank r's recvbuf. */
KHOR_API khor_status khor_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  khor_dtype dtype, int root);

/*
 * Non-blocking forms. The collective runs on the comm's collective thread (started on first
 * use) in call order, after any earlier collective on the same comm; blocking calls keep that
 * order too. Buffers must stay valid until the request completes.
 */
KHOR_API khor_status khor_iallreduce(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, khor_dtype dtype, khor_op op,
                                     khor_request **request_out);
KHOR_API khor_status khor_ibroadcast(khor_comm *comm, void *buf, size_t count,
                                     khor_dtype dtype, int root, khor_request **request_out);
KHOR_API khor_status khor_ibarrier(khor_comm *comm, khor_request **request_out);
KHOR_API khor_status khor_ireduce(khor_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  khor_dtype dtype, khor_op op, int root,
                                  khor_request **request_out);
KHOR_API khor_status khor_iallgather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, khor_dtype dtype, khor_request **request_out);
/* The count and displacement arrays of the v forms are copied; they need not stay valid. */
KHOR_API khor_status khor_iallgatherv(khor_comm *comm, const void *sendbuf, size_t sendcount,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *displs, khor_dtype dtype,
                                      khor_request **request_out);
KHOR_API khor_status khor_ireduce_scatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, khor_dtype dtype, khor_op op,
                                          khor_request **request_out);
KHOR_API khor_status khor_ialltoall(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, khor_dtype dtype, khor_request **request_out);
KHOR_API khor_status khor_ialltoallv(khor_comm *comm, const void *sendbuf,
                                     const size_t *sendcounts, const size_t *sdispls,
                                     void *recvbuf, const size_t *recvcounts,
                                     const size_t *rdispls, khor_dtype dtype,
                                     khor_request **request_out);
KHOR_API khor_status khor_igather(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t count, khor_dtype dtype, int root,
                                  khor_request **request_out);
KHOR_API khor_status khor_iscatter(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype, int root,
                                   khor_request **request_out);
/* Waits for completion (bounded by KHOR_TIMEOUT) and returns the collective's status. */
KHOR_API khor_status khor_wait(khor_request *request);
/* KHOR_SUCCESS or an error when complete, KHOR_IN_PROGRESS when not. Never blocks. */
KHOR_API khor_status khor_test(khor_request *request);
/* The request's own error text once it has failed ("" while running or after success).
 * It names this rank, the comm, the peer, the operation and the cause. */
KHOR_API const char *khor_request_error(const khor_request *request);
/* Frees a request; waits for it first if it is still running. */
KHOR_API void khor_request_free(khor_request *request);

#ifdef __cplusplus
}
#endif
#endif /* KHOR_H */
