/*
 * transport.h -- the transport ops table, version 2: how khor moves bytes between two
 * processes.
 *
 * Modelled on NCCL's network plugin and nng's ops tables. A transport instance (tp_ctx)
 * belongs to one process and one job; it listens on a local address whose text form (the
 * "address blob") the runtime publishes through the store. A link (tp_link) is one
 * connection to one peer rank, possibly striped over several sockets or queue pairs.
 * Transfers are non-blocking: isend/irecv post a tagged byte range and return a tp_req that
 * completes later; test() polls it, progress() drives all I/O. Memory registration is
 * separate from I/O (tp_reg_desc, below): verbs must pin memory and hand the peer a remote
 * key; tcp and shm accept any memory and register nothing (caps.needs_reg false). Any number
 * of transports may be compiled in (transport_list()); the runtime picks one per peer.
 *
 * Matching: a frame carries (comm, seq, step), a meta and its length. A receive completes
 * only with a frame of the same tag; a frame of that tag with another meta or length is an
 * error on both the request and the link (never a silent overrun). Several comms share a
 * link, so a frame whose tag has no posted receive yet must never hold up frames of other
 * tags behind it: each transport keeps such frames in a bounded per-link queue (tcp: read
 * aside once another receive waits on the socket; shm: left in place in the ring while
 * later records are taken; ib: copied out of its eager slot) and back-pressures the sender
 * when the bound is reached.
 *
 * The handshake that opens every link (magic, version, job id, ranks, HMAC proof of the
 * job secret) is transport/handshake.h, shared by every transport; only the bytes' carrier
 * differs (a TCP stream, a Unix seqpacket socket, ib's bootstrap socket).
 *
 * Threads, locks and ownership (field by field in struct transport_ops below):
 *   - every op may be called from any thread at any time; each takes the instance's own
 *     lock (one per tp_ctx, covering its links, requests and registrations) and releases
 *     it before returning. The lock, the one-sleeper rule and the ops that only take the
 *     lock around a transport's own body are written once, in transport/skel.h. The
 *     caller must hold no lock of this transport; it may hold its own locks (the
 *     runtime's link_mu is held around connect/accept/link_ready), since a transport
 *     never calls back into its caller.
 *   - a request is tested, cancelled or waited for by one thread at a time (the one that
 *     posted it).
 *   - progress() drives every link of the instance, whoever's requests they carry, and
 *     lets go of the lock while it sleeps in the kernel; at most one thread sleeps there
 *     per instance while the others wait for it to return (base/sleeper.h), and a thread
 *     that moves bytes while another sleeps wakes it. No op blocks except progress(), and
 *     only for the timeout it is given.
 *   - the runtime owns the tp_ctx and destroys it after every thread has stopped using it;
 *     the tp_ctx owns its links, requests and mrs; a caller owns the buffers it posts and
 *     keeps them valid (and registered, if it passed an mr) until the request is done.
 *   - every error sentence written to a kerr names the peer rank and address and the
 *     system's cause; the caller adds the operation.
 */
#ifndef KHOR_TRANSPORT_H
#define KHOR_TRANSPORT_H

#include "base/clock.h"
#include "base/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TP_ADDR_MAX 256
#define TP_VERSION 4 /* of this table; transports compiled against another are refused */

typedef struct tp_ctx tp_ctx;
typedef struct tp_link tp_link;
typedef struct tp_req tp_req;
typedef struct tp_mr tp_mr;

typedef struct tp_tag {
	uint32_t comm; /* communicator id */
	uint32_t seq;  /* collective sequence number on that comm */
	uint32_t step; /* step (and slice) inside the collective */
	uint32_t meta; /* not matched but compared: what the collective is (tp_meta_rules) */
} tp_tag;

/* Where a buffer lives. The runtime finds it per call; transports take it as given. */
typedef enum tp_mem_kind {
	TP_MEM_HOST = 0, /* ordinary or pinned host memory */
	TP_MEM_CUDA = 1, /* CUDA device memory (GPUDirect RDMA where the transport can) */
} tp_mem_kind;

/* What a registration allows (ORed). Local read is always allowed. */
enum tp_access {
	TP_ACCESS_LOCAL_WRITE = 1u << 0,  /* receives land in it */
	TP_ACCESS_REMOTE_WRITE = 1u << 1, /* a peer may RDMA-write into it */
	TP_ACCESS_REMOTE_READ = 1u << 2,  /* a peer may RDMA-read from it */
};

/* One buffer to register. dmabuf_fd is for device memory only (-1: none; the transport
 * may then find one itself, or use the peer-memory module, or refuse). */
typedef struct tp_reg_desc {
	void *buf;
	size_t len;
	tp_mem_kind kind;
	unsigned access;        /* enum tp_access */
	int dmabuf_fd;          /* -1 unless kind == TP_MEM_CUDA and the caller has one */
	uint64_t dmabuf_offset; /* of buf inside the dmabuf */
} tp_reg_desc;

/* What a peer needs to reach a registered buffer remotely: sendable as bytes. */
typedef struct tp_rkey {
	uint64_t addr; /* the buffer's address in the owner's space */
	uint64_t len;
	uint32_t rkey; /* the transport's key (verbs: the MR's rkey); 0 when not one-sided */
	uint32_t pad;
} tp_rkey;

/* What a transport can do, for the layers above (caps op). */
typedef struct tp_caps {
	bool needs_reg;    /* isend/irecv of more than reg_min bytes want an mr (ib) */
	size_t reg_min;    /* below this, messages are copied into the transport's own memory */
	bool device_mem;   /* takes TP_MEM_CUDA buffers (with an mr) without staging */
	bool one_sided;    /* rkeys are meaningful: peers can write/read registered memory */
	bool needs_flush;  /* a receive into device memory must be flushed before a kernel reads it */
} tp_caps;

/*
 * What a frame's meta means is the collectives' business, not the transport's: the
 * transport compares metas and asks these rules (tp_options.meta) two questions. Both
 * pointers may be NULL (then metas are only compared for equality and shown in hex).
 */
typedef struct tp_meta_rules {
	/* Two frames of one call (comm, seq) carry metas that cannot both be right (for example
	 * two allreduce schedules whose steps never meet): an error, not a frame to park. */
	bool (*conflict)(uint32_t a, uint32_t b);
	/* Words for a meta in an error message ("allreduce float32 sum, ring"). */
	const char *(*describe)(uint32_t meta, char *buf, size_t len);
} tp_meta_rules;

/*
 * The rules' two questions, asked by every transport. Inline, so that the transports need
 * nothing from transport.c, the registry that lists them.
 */
static inline bool tp_meta_conflict(const tp_meta_rules *r, uint32_t a, uint32_t b)
{
	return r != NULL && r->conflict != NULL && r->conflict(a, b);
}

static inline const char *tp_meta_describe(const tp_meta_rules *r, uint32_t meta, char *buf,
                                            size_t len)
{
	if (r != NULL && r->describe != NULL)
		return r->describe(meta, buf, len);
	snprintf(buf, len, "meta 0x%08x", meta);
	return buf;
}

/* The sum a received frame carried (isend_sum/irecv_sum below). */
typedef struct tp_sum {
	uint64_t value;
	bool carried; /* false: the sender's frame carried none */
} tp_sum;

static inline bool tp_tag_eq(tp_tag a, tp_tag b)
{
	return a.comm == b.comm && a.seq == b.seq && a.step == b.step;
}

/* What the runtime tells a transport when creating it. Strings are copied. */
typedef struct tp_options {
	int rank;
	int size;
	const char *job_id;
	const char *secret;        /* "" for an unauthenticated job */
	const char *ifname_spec;   /* KHOR_SOCKET_IFNAME or NULL */
	const void *hint_addr;     /* ksockaddr* of the store, to pick an interface; may be NULL */
	int nsocks;                /* sockets per link (tcp) */
	uint64_t min_stripe_bytes; /* messages below this use one socket */
	int sock_bufsize;          /* SO_SNDBUF/SO_RCVBUF, 0 = kernel default */
	int64_t handshake_timeout_ms;
	const tp_meta_rules *meta; /* may be NULL; must outlive the instance */
	const char *hostname;      /* for messages; may be NULL */
	/*
	 * ib (KHOR_IB_*, runtime/config.c). ib_qps == 0 means "not given": the defaults for all
	 * of them (the first active port, automatic GID, 2 QPs, timeout 14, 7 retries), so
	 * callers other than the runtime may leave them zero.
	 */
	const char *ib_hca;        /* NULL or "" = the first active port */
	int ib_gid_index;          /* < 0 = automatic */
	int ib_qps;
	int ib_timeout;
	int ib_retry_cnt;
	uint32_t ib_max_wr;        /* 0 = the ports' max_msg_sz */
	bool ib_flush_always;
	/* shm (KHOR_SHM_CMA): messages over 16 MiB are read by the receiver with
	 * process_vm_readv where the peer allows it; false (the default) = the ring only. */
	bool shm_cma;
} tp_options;

/*
 * The table (version 3 added sever, 4 isend_sum and irecv_sum). "Lock" below is the instance's own lock, which each op takes itself; none is
 * held by the caller. Ownership is stated where it moves.
 */
struct transport_ops {
	const char *name;  /* "tcp", "shm", "ib": KHOR_TRANSPORT's words and the store keys' */
	int version;       /* TP_VERSION */
	/*
	 * Makes the instance and starts listening; *ctx_out is the caller's until destroy().
	 * KHOR_ERR_NOT_SUPPORTED (with the reason in err) when the transport cannot run here
	 * (no rdma-core, no active device): the runtime then goes on without it.
	 */
	khor_status (*create)(const tp_options *opt, tp_ctx **ctx_out, kerr *err);
	/* The address blob to publish (NUL-terminated, < TP_ADDR_MAX); owned by ctx, valid
	 * until destroy. Lock-free: it never changes after create. */
	const char *(*address)(const tp_ctx *ctx);
	/* What this instance can do; lock-free, constant after create. */
	void (*caps)(const tp_ctx *ctx, tp_caps *out);
	/*
	 * Starts a link to peer, whose blob is peer_addr. Returns at once; the link becomes
	 * usable through progress(). Requests may be posted on it immediately. The link is
	 * owned by ctx (freed by destroy). Lock: taken.
	 */
	khor_status (*connect)(tp_ctx *ctx, int peer, const char *peer_addr, tp_link **link_out,
	                       kerr *err);
	/*
	 * The link that peer opened to us, once its handshake has completed; *link_out = NULL
	 * (and KHOR_SUCCESS) while it has not arrived yet. Never blocks. Owned by ctx. Lock:
	 * taken.
	 */
	khor_status (*accept)(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err);
	/* True once every socket (queue pair) of the link finished its handshake. Lock: taken. */
	bool (*link_ready)(const tp_link *link);
	/*
	 * One line about a ready link for KHOR_LOG=info ("198.18.0.2:4242, 4 sockets";
	 * "rxe0 port 1, GID ::ffff:198.18.1.1 (index 1, RoCE v2), 2 QPs"). Lock: taken.
	 */
	void (*describe)(const tp_link *link, char *buf, size_t len);
	/*
	 * Registration: pins (if needed) d->buf..+len and returns an mr owned by the caller
	 * until dereg_mr; it must be deregistered before the memory is freed and before
	 * destroy(). A buffer passed to isend/irecv may come with an mr that covers it (or
	 * NULL). Errors name the buffer, its size and, for pinning, the locked-memory limit.
	 * NULL in a transport that needs none (then caps.needs_reg is false). Lock: taken.
	 */
	khor_status (*reg_mr)(tp_ctx *ctx, const tp_reg_desc *d, tp_mr **mr_out, kerr *err);
	void (*dereg_mr)(tp_ctx *ctx, tp_mr *mr);
	/* The remote key of an mr, for a peer (NULL when reg_mr is NULL). Lock-free. */
	void (*mr_key)(const tp_mr *mr, tp_rkey *out);
	/* Post a send or receive of len bytes with tag. buf must stay valid until completion.
	 * The request is owned by ctx; the caller holds it until test() says done. Lock: taken. */
	khor_status (*isend)(tp_link *link, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
	                     tp_req **req_out, kerr *err);
	khor_status (*irecv)(tp_link *link, void *buf, size_t len, tp_tag tag, tp_mr *mr,
	                     tp_req **req_out, kerr *err);
	/*
	 * KHOR_CHECKSUM's sums carried in the transport's own frame headers (transport/filter
	 * computes and compares them): isend_sum sends as isend does, with sum in the header
	 * of every frame of the message; irecv_sum receives as irecv does and, before test()
	 * says done, stores in *sum_out (the caller's until then) what the sender's frame
	 * carried. NULL in a transport whose frames have no room: the layer then sends each
	 * sum in a frame of its own, after the payload's. Lock: taken.
	 */
	khor_status (*isend_sum)(tp_link *link, const void *buf, size_t len, tp_tag tag,
	                         tp_mr *mr, uint64_t sum, tp_req **req_out, kerr *err);
	khor_status (*irecv_sum)(tp_link *link, void *buf, size_t len, tp_tag tag, tp_mr *mr,
	                         tp_sum *sum_out, tp_req **req_out, kerr *err);
	/*
	 * After a receive into device memory completed: makes the data visible to the GPU
	 * (GPUDirect writes may still sit in the PCIe path). *req_out = NULL when nothing
	 * needs doing (host memory, or a transport without caps.needs_flush); else a request
	 * to test() like any other. NULL in transports that never need it. Lock: taken.
	 */
	khor_status (*flush)(tp_link *link, void *buf, size_t len, tp_mr *mr, tp_req **req_out,
	                     kerr *err);
	/*
	 * *done_out = true when the request finished; the request is then released and must not
	 * be used again. A failed request also counts as done and returns its error. Lock: taken.
	 */
	khor_status (*test)(tp_req *req, bool *done_out, kerr *err);
	/*
	 * Moves bytes on every link; waits up to timeout_ms for events when nothing could be
	 * done at once (0 = never wait). *moved_out (if not NULL) tells whether any byte or
	 * connection moved. Errors on a link are reported through that link's requests, not
	 * here; progress fails only when the instance itself is broken. Lock: taken, and let go
	 * while sleeping.
	 */
	khor_status (*progress)(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err);
	/*
	 * Abandons a request after an error elsewhere: its buffer is never touched again. A
	 * request cut off mid-message breaks its link (the stream can't be resynchronised).
	 * Lock: taken.
	 */
	void (*cancel)(tp_req *req);
	/* The link's first error: its status (KHOR_SUCCESS when healthy), copied to *err_out
	 * (which may be NULL) when there is one. Lock: taken. */
	khor_status (*link_error)(tp_link *link, kerr *err_out);
	/*
	 * Makes progress() return at once as if something had moved: for the thread asleep in
	 * it now, and for the next call of every other thread that has not seen the wake yet.
	 * For a thread that waits on both the network and work of its own process (the engine's).
	 * Lock-free: an atomic count, and an eventfd write only while a thread sleeps in
	 * progress() (transport/skel.h says why no wake is lost).
	 */
	void (*wake)(tp_ctx *ctx);
	/*
	 * Breaks the link as a lost connection would: its requests fail with why (a sentence,
	 * copied; KHOR_ERR_SYSTEM, this end's own failure), and the peer finds its end broken
	 * the way it finds a real failure (tcp: the sockets close; shm: the segment's broken
	 * flag and the socket; ib: the queue pairs go to the error state and the bootstrap
	 * socket closes). For the fault injector of
	 * transport/filter (KHOR_FAULTS); NULL in a transport that cannot. Lock: taken.
	 */
	void (*sever)(tp_link *link, const char *why);
	/* Releases every resource: links, requests, mrs still registered. Pending requests on
	 * the ctx's links must be finished first. Called once, by the owner, with no other
	 * thread inside any op. */
	void (*destroy)(tp_ctx *ctx);
};

extern const struct transport_ops tcp_transport_ops;

/* Looks up a transport by name ("tcp"); NULL if unknown or not built. */
const struct transport_ops *transport_find(const char *name);
/* Every transport compiled in, in order of preference for peers on other hosts
 * (ib before tcp; shm reaches only its own host); *n_out gets the count. */
const struct transport_ops *const *transport_list(int *n_out);

#endif
