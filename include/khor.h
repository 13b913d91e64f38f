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
	KHOR_ERR_INTERNAL = 10,
	KHOR_ERR_MEMBERSHIP = 11,  /* elastic: a rank was lost or the hosts changed; the text names
	                            * who and why. Finalize and khor_init again to rejoin */
	KHOR_ERR_REMOVED = 12      /* elastic, khor_init: this worker is no longer in the job; exit 0 */
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
	KHOR_BOOL = 8,
	KHOR_INT16 = 9
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
/*
 * What this library was built with: a static string of space-separated key=value words,
 * "version=X.Y.Z tcp=1 shm=1 ib=B cuda=B nccl=B [nccl_version=N] gdr=B", each B 0 or 1:
 * ib = the verbs transport, cuda = the CUDA memory backend (device buffers), nccl = NCCL
 * for device collectives inside a node (libnccl.so.2 is loaded at run time), nccl_version
 * (only with nccl=1) = NCCL_VERSION_CODE of the header built against, gdr = GPUDirect RDMA
 * (ib with cuda). Readers should look words up by key: more may come. Built in does not mean usable here: libibverbs, libcuda
 * and libnccl are opened when first needed, and a missing one is reported then.
 */
KHOR_API const char *khor_build_info(void);
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
 * Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID inside an srun step (the store on the
 * step's first node), a Kubernetes indexed Job's JOB_COMPLETION_INDEX with KHOR_K8S_SIZE
 * (the store on pod 0, README "Kubernetes"); with none of them, a one-rank job.
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
 * Elastic jobs (KHOR_ELASTIC=1, docs/ELASTIC.md). A lost rank fails every pending call of
 * the survivors with KHOR_ERR_MEMBERSHIP naming it; khor_finalize and khor_init then join
 * the next generation, with new ranks and links. khor_init returns KHOR_ERR_REMOVED to a
 * worker that is not in the job any more. The generation the context joined (a fixed job:
 * this process's count of inits), and the driver's announcement of a host change for the
 * next one (bit 1: hosts added, bit 2: removed; 0: none): a local read, free to poll.
 */
KHOR_API int khor_generation(const khor_comm *comm);
KHOR_API int khor_hosts_updated(const khor_comm *comm);
/* 1 when the comm's job is elastic (a lost rank is a reason to reset, not to end), else 0. */
KHOR_API int khor_is_elastic(const khor_comm *comm);
/*
 * The training state's record, job-wide, in an elastic job: hold = 1 says that this worker
 * now holds the state (its first sync is done; once per process is enough), hold = 0 only
 * asks. *held_out (may be NULL): how many times workers of the job have said so; 0 means no
 * worker ever held the state. One store round trip; KHOR_ERR_INVALID_ARG in a fixed job.
 */
KHOR_API khor_status khor_elastic_state(khor_comm *comm, int hold, int64_t *held_out);

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
 * an error on them (once they have waited for each other for twice KHOR_TIMEOUT, or, with
 * KHOR_HEARTBEAT_TIMEOUT=-1, after KHOR_TIMEOUT), never a hang.
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
 * Device memory. Every collective above takes CUDA device pointers as well as host ones
 * (the kind is found per call). Every rank of one call must use the same kind: a rank
 * that receives data from a rank of the other kind fails the call with an error saying
 * which side used which, and the job fails with it (a rank whose part of a one-way
 * collective, such as a broadcast's root, saw nothing of the other kind learns it at its
 * next call, which fails with that cause). The blocking forms order themselves after
 * work queued on the legacy default stream and return when the result is in place
 * (work on other streams, a per-thread default stream included, is not waited for: use
 * the _stream forms, or synchronise first). The _stream forms take a CUDA stream (a cudaStream_t or CUstream,
 * as void *; NULL is the legacy default stream): the collective starts after the work
 * already queued on it and later work queued on it waits for the collective, with no
 * synchronisation of the host with the device beyond what moving the data between hosts
 * needs. They return when this rank's part of the communication is done; the result is
 * in place once the stream has reached that point. Host buffers passed to a _stream form
 * are handled as by the plain form (the stream is not used).
 */
KHOR_API khor_status khor_allreduce_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, khor_dtype dtype, khor_op op,
                                           void *stream);
KHOR_API khor_status khor_broadcast_stream(khor_comm *comm, void *buf, size_t count,
                                           khor_dtype dtype, int root, void *stream);
KHOR_API khor_status khor_reduce_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, khor_dtype dtype, khor_op op, int root,
                                        void *stream);
KHOR_API khor_status khor_allgather_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, khor_dtype dtype, void *stream);
KHOR_API khor_status khor_reduce_scatter_stream(khor_comm *comm, const void *sendbuf,
                                                void *recvbuf, size_t count, khor_dtype dtype,
                                                khor_op op, void *stream);
KHOR_API khor_status khor_alltoall_stream(khor_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, khor_dtype dtype, void *stream);

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
/*
 * Waits for completion and returns the collective's status. Past KHOR_TIMEOUT it waits on
 * while the comm's ranks are alive (README "Slow, stopped and lost ranks").
 */
KHOR_API khor_status khor_wait(khor_request *request);
/* KHOR_SUCCESS or an error when complete, KHOR_IN_PROGRESS when not. Never blocks. */
KHOR_API khor_status khor_test(khor_request *request);
/* The request's own error text once it has failed ("" while running or after success).
 * It names this rank, the comm, the peer, the operation and the cause. */
KHOR_API const char *khor_request_error(const khor_request *request);
/* Frees a request; waits for it first if it is still running. */
KHOR_API void khor_request_free(khor_request *request);


/*
 * The engine: named tensors, Horovod style. Framework hooks hand tensors over by name, from
 * any thread, in any order; a background thread per process set matches the names across
 * ranks (negotiation, with a response cache so that steady state costs one small message
 * each way per cycle), fuses small allreduces into one buffer, runs the collectives and
 * completes handles. It sleeps while nothing is queued and starts a cycle as soon as work
 * arrives; there is no fixed tick.
 *
 * Settings come from the config given to khor_engine_start, then the environment (KHOR_*
 * first, then the HOROVOD_* alias): KHOR_FUSION_THRESHOLD (HOROVOD_FUSION_THRESHOLD,
 * bytes, 0 = no fusion), KHOR_CYCLE_TIME (HOROVOD_CYCLE_TIME, ms between the starts of
 * two cycles, 0 = start at once), KHOR_CACHE_CAPACITY (HOROVOD_CACHE_CAPACITY, 0 = off),
 * KHOR_TIMELINE (HOROVOD_TIMELINE; a path, "%r" in it becomes the rank; DYNAMIC = no file
 * until khor_engine_timeline_start), KHOR_TIMELINE_MARK_CYCLES (HOROVOD_TIMELINE_MARK_CYCLES),
 * KHOR_STALL_CHECK_TIME (HOROVOD_STALL_CHECK_TIME_SECONDS; seconds, 0 = off),
 * KHOR_STALL_SHUTDOWN_TIME (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; 0 = off), KHOR_AUTOTUNE
 * (HOROVOD_AUTOTUNE), KHOR_AUTOTUNE_LOG (HOROVOD_AUTOTUNE_LOG).
 *
 * Process sets: set 0 is the comm the engine was started on; khor_engine_add_process_set
 * adds a comm made from it (khor_comm_split or khor_comm_create_group), named by the id it
 * returns (the same on every member). Each set has its own thread, coordinator and cache.
 *
 * Names: one tensor name is in flight at most once per set. A name is taken from its
 * enqueue until the handle's owner has seen it complete (khor_handle_wait or
 * khor_handle_test returning its status, or its callback) or freed it; a second enqueue of
 * a taken name fails at once with KHOR_ERR_INVALID_ARG and khor_engine_error naming the
 * tensor, however fast the first ran. Every member must enqueue the same names
 * with matching arguments, in any order; a mismatch fails that name on every member with
 * a message naming the tensor, the ranks and what differs.
 *
 * Failures: a collective that fails (a dead rank, a timeout) completes every pending handle
 * of the set with that cause, and every later enqueue on the set fails at once with it.
 *
 * Handles: every enqueue gives one (a grouped call gives one for the whole group). Input
 * and output buffers must stay valid until it completes. khor_handle_free frees a handle
 * that has completed, or detaches one that has not (the engine frees it when done, and
 * its buffers must still stay valid until then).
 */
typedef struct khor_engine khor_engine;
typedef struct khor_handle khor_handle;

/*
 * Allocation callback for outputs whose size is known only after negotiation (allgather,
 * alltoall): called on the engine's thread (or on a thread waiting in khor_handle_wait for
 * a handle of the same process set, which runs the engine's cycle itself while the
 * engine's thread is idle) with the output's shape and size in bytes; returns
 * the buffer (NULL = out of memory, which fails the handle). alloc == NULL: the engine
 * allocates the buffer itself; khor_handle_output gives it and khor_handle_free frees it.
 */
typedef void *(*khor_alloc_fn)(void *arg, int ndim, const int64_t *dims, size_t bytes);
/* Completion callback: called once on the engine's thread when the handle completes (or on
 * a thread waiting in khor_handle_wait that ran the cycle which completed it, see
 * khor_alloc_fn; or at once on the calling thread, when it had completed before the callback
 * was set). */
typedef void (*khor_done_fn)(void *arg, khor_handle *handle, khor_status status);

/* Starts an engine on comm (collective over comm). config may be NULL. */
KHOR_API khor_status khor_engine_start(khor_comm *comm, const khor_config *config,
                                       khor_engine **engine_out);
/*
 * Stops the engine (every member calls it): fails the handles still pending with "engine
 * stopped", then ends the threads and frees the engine and its process sets' own comms
 * (not the comms given to it). Handles not freed yet stay valid for the khor_handle_*
 * calls until freed. Call it before khor_finalize and before freeing a comm that is one
 * of its process sets: those free the links and comms the engine's threads use.
 *
 * One rank's stop is news to the others at once (as Horovod's shutdown is): what they wait
 * for that the stopped rank never submitted (a barrier, a join, an allreduce) fails with
 * an error naming it, their later enqueues fail at once the same way, and their engines
 * end the set themselves (their own khor_engine_stop then returns at once). A rank that
 * hangs has KHOR_TIMEOUT from this rank's call to join the stop, alive or not: past it
 * this returns KHOR_ERR_TIMEOUT (the engine is freed all the same) with khor_comm_error(comm)
 * naming the ranks that never joined the stop, and those ranks' sets fail with that cause.
 */
KHOR_API khor_status khor_engine_stop(khor_engine *engine);
/* The engine's last error (a failed enqueue, the sticky failure of a set), "" if none. */
KHOR_API const char *khor_engine_error(const khor_engine *engine);
/* Adds comm as a process set (collective over comm's members); *set_out is its id. */
KHOR_API khor_status khor_engine_add_process_set(khor_engine *engine, khor_comm *comm,
                                                 int *set_out);
/*
 * Removes process set `set` (not 0), collective over its members: its pending handles fail
 * with "stopped", its thread ends and its own comms are freed (not the comm given to add).
 */
KHOR_API khor_status khor_engine_remove_process_set(khor_engine *engine, int set);
/* A file descriptor that becomes readable when a handle completes (reading it clears it). */
KHOR_API int khor_engine_fd(const khor_engine *engine);
/*
 * Timeline from now on, into path ("%r": the rank's own file; without it rank 0 alone
 * writes); mark_cycles adds cycle marks. Chrome's trace-event array form, one event a line
 * each followed by ",": it loads in chrome://tracing and Perfetto even when the process dies
 * without stopping it, and is strict JSON once stopped (khor_engine_timeline_stop, _stop).
 */
KHOR_API khor_status khor_engine_timeline_start(khor_engine *engine, const char *path,
                                                int mark_cycles);
KHOR_API khor_status khor_engine_timeline_stop(khor_engine *engine);
/*
 * The engine's current tuning (for autotune's result): fusion threshold in bytes, cycle
 * time in ms; either pointer may be NULL.
 */
KHOR_API khor_status khor_engine_tuning(const khor_engine *engine, int64_t *fusion_bytes_out,
                                        double *cycle_ms_out);

/*
 * Counters of process set `set` since the engine started: negotiation cycles, the time spent
 * negotiating (from a cycle's start to its responses, on this rank) and bytes run through
 * collectives. Any pointer may be NULL. For benchmarks and autotune's log.
 */
KHOR_API khor_status khor_engine_stats(const khor_engine *engine, int set, uint64_t *cycles_out,
                                       uint64_t *negotiate_ns_out, uint64_t *bytes_out);

/*
 * Enqueue calls. set: a process set id (0 = the engine's comm). name: the tensor's name,
 * unique among the set's names in flight. dims: ndim sizes (ndim 0 = a scalar). input and
 * output may be the same buffer (in place) where the shapes allow.
 *
 * Memory: a tensor's buffers are host memory or device memory (CUDA), found per tensor at
 * enqueue; its input and output must both be host memory or both memory of one device.
 * Host and device tensors may be enqueued in the same cycle: they run, and fuse, apart
 * (device tensors through a device fusion buffer, on the engine's own stream). The kind is
 * not negotiated: every rank must give a tensor of the same kind. An allgather or alltoall
 * of a device tensor needs an alloc callback that returns memory of the input's device (the
 * engine allocates host memory only; alloc == NULL fails the enqueue). Device inputs that a
 * stream is still producing go through the _event forms below; the plain forms read them at
 * once. Either way a handle completes when its output is in place, with nothing of it left
 * on any stream.
 *
 * allreduce: output = postscale * op over ranks of (prescale * input). Scale factors
 * apply to floating-point dtypes only (1.0 elsewhere).
 */
KHOR_API khor_status khor_enqueue_allreduce(khor_engine *engine, int set, const char *name,
                                            const void *input, void *output, khor_dtype dtype,
                                            int ndim, const int64_t *dims, khor_op op,
                                            double prescale, double postscale,
                                            khor_handle **handle_out);
/*
 * Grouped allreduce: n tensors negotiated and completed as one (one handle); each tensor i
 * has names[i], inputs[i], outputs[i], dtypes[i], ndims[i] and its dims at
 * dims + (sum of ndims[j] for j < i).
 */
KHOR_API khor_status khor_enqueue_grouped_allreduce(khor_engine *engine, int set, int n,
                                                    const char *const *names,
                                                    const void *const *inputs,
                                                    void *const *outputs,
                                                    const khor_dtype *dtypes,
                                                    const int *ndims, const int64_t *dims,
                                                    khor_op op, double prescale,
                                                    double postscale,
                                                    khor_handle **handle_out);
/* allgather: dim 0 may differ per rank; the output is every rank's input, in rank order
 * along dim 0 (alloc: see khor_alloc_fn). */
KHOR_API khor_status khor_enqueue_allgather(khor_engine *engine, int set, const char *name,
                                            const void *input, khor_dtype dtype, int ndim,
                                            const int64_t *dims, khor_alloc_fn alloc,
                                            void *alloc_arg, khor_handle **handle_out);
/* Grouped allgather: tensor i's output is khor_handle_output(handle, i, ...). */
KHOR_API khor_status khor_enqueue_grouped_allgather(khor_engine *engine, int set, int n,
                                                    const char *const *names,
                                                    const void *const *inputs,
                                                    const khor_dtype *dtypes,
                                                    const int *ndims, const int64_t *dims,
                                                    khor_alloc_fn alloc, void *alloc_arg,
                                                    khor_handle **handle_out);
/* broadcast: root's input lands in every rank's output (same shape everywhere). */
KHOR_API khor_status khor_enqueue_broadcast(khor_engine *engine, int set, const char *name,
                                            const void *input, void *output, khor_dtype dtype,
                                            int ndim, const int64_t *dims, int root,
                                            khor_handle **handle_out);
/*
 * alltoall: splits[j] rows (along dim 0) of input go to rank j, in rank order; splits NULL
 * means dim 0 divided evenly (it must divide). The output holds the rows received from each
 * rank in rank order; khor_handle_splits gives how many came from each.
 */
KHOR_API khor_status khor_enqueue_alltoall(khor_engine *engine, int set, const char *name,
                                           const void *input, khor_dtype dtype, int ndim,
                                           const int64_t *dims, const int64_t *splits,
                                           khor_alloc_fn alloc, void *alloc_arg,
                                           khor_handle **handle_out);
/*
 * reducescatter: the reduction over ranks is cut along dim 0; rank r gets rows
 * [r * (d0 / n) + min(r, d0 % n), ... + d0 / n + (r < d0 % n)) (the first d0 % n ranks get
 * one more row), into output, which must hold that many rows.
 */
KHOR_API khor_status khor_enqueue_reducescatter(khor_engine *engine, int set, const char *name,
                                                const void *input, void *output,
                                                khor_dtype dtype, int ndim, const int64_t *dims,
                                                khor_op op, double prescale, double postscale,
                                                khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_grouped_reducescatter(khor_engine *engine, int set, int n,
                                                        const char *const *names,
                                                        const void *const *inputs,
                                                        void *const *outputs,
                                                        const khor_dtype *dtypes,
                                                        const int *ndims, const int64_t *dims,
                                                        khor_op op, double prescale,
                                                        double postscale,
                                                        khor_handle **handle_out);
/* barrier: completes once every member has enqueued its barrier. */
KHOR_API khor_status khor_enqueue_barrier(khor_engine *engine, int set,
                                          khor_handle **handle_out);
/*
 * join: this rank has no more data. Until every member has joined, the others' allreduces
 * run with the joined ranks contributing zeros (avg still divides by the set's size); other
 * ops fail while a rank has joined. Completes when every member has joined;
 * khor_handle_join_rank then gives the rank that joined last (the same on every rank).
 * A joined rank's zeros are in the kind of memory of the last allreduce it ran itself
 * (host memory if it ran none): join works with device tensors where a job's allreduces are
 * all host or all device memory, not where it mixes them.
 */
KHOR_API khor_status khor_enqueue_join(khor_engine *engine, int set, khor_handle **handle_out);

/*
 * The _event forms: the enqueue calls above, for inputs that a device stream is still
 * producing (Horovod's ready events). ready_event is a CUDA event (cudaEvent_t or CUevent,
 * as void *) recorded on the stream that produces the input, after the producing work;
 * NULL means the input is ready now (the plain form). The grouped forms take one event per
 * tensor (ready_events: n entries, any NULL; or NULL for none). The event stays the
 * caller's and must stay valid until the handle completes. The engine waits for it on its
 * own thread, at most KHOR_TIMEOUT, before it reads the input; an event that never
 * completes fails the handle with an error naming the tensor, and the rest of its process
 * set with it (the other ranks' collective cannot run without this rank's input). Only
 * inputs in device (or pinned host) memory may have an event: it is waited for with the
 * backend of the input's memory.
 */
KHOR_API khor_status khor_enqueue_allreduce_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  void *output, khor_dtype dtype, int ndim,
                                                  const int64_t *dims, khor_op op,
                                                  double prescale, double postscale,
                                                  void *ready_event, khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_grouped_allreduce_event(khor_engine *engine, int set, int n,
                                                          const char *const *names,
                                                          const void *const *inputs,
                                                          void *const *outputs,
                                                          const khor_dtype *dtypes,
                                                          const int *ndims,
                                                          const int64_t *dims, khor_op op,
                                                          double prescale, double postscale,
                                                          void *const *ready_events,
                                                          khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_allgather_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  khor_dtype dtype, int ndim,
                                                  const int64_t *dims, khor_alloc_fn alloc,
                                                  void *alloc_arg, void *ready_event,
                                                  khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_grouped_allgather_event(khor_engine *engine, int set, int n,
                                                          const char *const *names,
                                                          const void *const *inputs,
                                                          const khor_dtype *dtypes,
                                                          const int *ndims,
                                                          const int64_t *dims,
                                                          khor_alloc_fn alloc, void *alloc_arg,
                                                          void *const *ready_events,
                                                          khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_broadcast_event(khor_engine *engine, int set,
                                                  const char *name, const void *input,
                                                  void *output, khor_dtype dtype, int ndim,
                                                  const int64_t *dims, int root,
                                                  void *ready_event, khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_alltoall_event(khor_engine *engine, int set,
                                                 const char *name, const void *input,
                                                 khor_dtype dtype, int ndim,
                                                 const int64_t *dims, const int64_t *splits,
                                                 khor_alloc_fn alloc, void *alloc_arg,
                                                 void *ready_event, khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_reducescatter_event(khor_engine *engine, int set,
                                                      const char *name, const void *input,
                                                      void *output, khor_dtype dtype,
                                                      int ndim, const int64_t *dims,
                                                      khor_op op, double prescale,
                                                      double postscale, void *ready_event,
                                                      khor_handle **handle_out);
KHOR_API khor_status khor_enqueue_grouped_reducescatter_event(
	khor_engine *engine, int set, int n, const char *const *names, const void *const *inputs,
	void *const *outputs, const khor_dtype *dtypes, const int *ndims, const int64_t *dims,
	khor_op op, double prescale, double postscale, void *const *ready_events,
	khor_handle **handle_out);

/* KHOR_SUCCESS or the handle's error once complete; KHOR_IN_PROGRESS before. Never blocks. */
KHOR_API khor_status khor_handle_test(khor_handle *handle);
/*
 * Waits for completion. Past KHOR_TIMEOUT of the engine's comm it warns and waits on while
 * the ranks are alive, and fails naming one that is not (the handle stays pending); without
 * heartbeats to judge by (KHOR_HEARTBEAT_TIMEOUT=-1) it returns KHOR_ERR_TIMEOUT there,
 * with what it waits for in khor_handle_error, the handle still pending.
 */
KHOR_API khor_status khor_handle_wait(khor_handle *handle);
/* The handle's error text once failed (or after a timed-out wait); "" otherwise. */
KHOR_API const char *khor_handle_error(const khor_handle *handle);
/* Completion callback (see khor_done_fn). Set it once, before or after completion. */
KHOR_API khor_status khor_handle_set_callback(khor_handle *handle, khor_done_fn fn, void *arg);
/*
 * The output of tensor i of a completed allgather or alltoall: its buffer, rank and dims
 * (dims_out holds at least the input's ndim entries); any pointer may be NULL.
 */
KHOR_API khor_status khor_handle_output(const khor_handle *handle, int i, void **data_out,
                                        int *ndim_out, int64_t *dims_out);
/* alltoall: rows received from each rank (n entries, n = the set's size). */
KHOR_API khor_status khor_handle_splits(const khor_handle *handle, int64_t *splits_out, int n);
/* join: the rank (in the set) that joined last; -1 before completion. */
KHOR_API int khor_handle_join_rank(const khor_handle *handle);
KHOR_API void khor_handle_free(khor_handle *handle);

#ifdef __cplusplus
}
#endif
#endif /* KHOR_H */
