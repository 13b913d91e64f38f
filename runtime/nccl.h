/*
 * nccl.h -- NCCL inside one node, for collectives on CUDA device memory (DESIGN.md,
 * "Hierarchical"): loaded at run time, its communicator bootstrapped through khor's store,
 * never used across nodes.
 */
#ifndef KHOR_NCCL_H
#define KHOR_NCCL_H

#include "comm.h"

/*
 * Runs r (a call on device memory, where) with NCCL inside the node and khor's own
 * schedules across nodes, when KHOR_NCCL and the call allow it; *handled false means
 * "not for NCCL", and the caller runs khor's own schedules. Called by comm_exec.c with the
 * comm's device state begun (c->mem.be and c->mem.stream set, the device's context
 * current): every NCCL and cross-node step is enqueued on c->mem.stream, and nothing here
 * waits for the stream to finish, so the caller syncs it where the call must be complete.
 *
 * Taken: allreduce, broadcast, allgather (equal blocks; one host, or ranks numbered host
 * by host) and reduce_scatter (one host, count a multiple of the ranks), on comms whose
 * hosts have equal rank counts; not float min and max, whose NaN NCCL drops. KHOR_NCCL=on fails the call (*handled true, an error)
 * when NCCL can't run it for a reason the user can fix: the library does not load, the
 * buffers are not CUDA memory, NCCL has no such dtype. Every rank of a call decides alike
 * from what it shares with the others (settings, topology, count, dtype, memory kind).
 */
khor_status nccl_run(khor_comm *c, struct khor_request *r, const kmem_where *where,
                     bool *handled, kerr *err);
/* Frees c's NCCL communicator, if it has one: destroyed, or aborted after an error. */
void nccl_comm_free(khor_comm *c);
/*
 * Aborts c's NCCL communicator, if it has one (the call failed, or its stream did not
 * finish in time): kernels of this rank and of its node's other ranks that wait inside
 * NCCL are freed; the next device call makes a new communicator.
 */
void nccl_comm_abort(khor_comm *c);
/*
 * Whether libnccl.so.2 can be used here (loaded once per process); when not, why (dlerror,
 * a missing symbol, too old a version, or a libkhor built without nccl.h) into why.
 */
bool nccl_available(char *why, size_t len);

#endif
