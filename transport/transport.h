/*
 * transport.h -- the transport ops table: how khor moves bytes between two processes.
 *
 * Modelled on NCCL's network plugin and nng's ops tables. A transport instance (tp_ctx)
 * belongs to one process and one job; it listens on a local address whose text form (the
 * "address blob") the runtime publishes through the store. A link (tp_link) is one
 * connection to one peer rank, possibly striped over several sockets. Transfers are
 * non-blocking: isend/irecv post a tagged byte range and return a tp_req that completes
 * later; test() polls it, progress() drives all I/O. Memory registration is separate from
 * I/O so that verbs (which must pin memory) fits the same table; tcp ignores it.
 *
 * Matching: a frame carries (comm, seq, step), a meta and its length. A receive completes
 * only with a frame of the same tag; a frame of that tag with another meta or length is an
 * error on both the request and the link (never a silent overrun). Several comms share a
 * link, so a frame whose tag has no posted receive yet must never hold up frames of other
 * tags behind it: each transport keeps such frames in a bounded per-link queue (tcp: read
 * aside once another receive waits on the socket; shm: left in place in the ring while
 * later records are taken) and back-pressures the sender when the bound is reached.
 *
 * Threads and ownership: every op may be called from any thread at any time; each takes
 * the instance's lock (one per tp_ctx, covering its links and requests). A request is
 * tested, cancelled or waited for by one thread at a time (the one that posted it).
 * progress() drives every link of the instance, whoever's requests they carry, and lets go
 * of the lock while it sleeps in the kernel; at most one thread sleeps there per instance
 * while the others wait for it to return (base/sleeper.h), and a thread that moves bytes
 * while another sleeps wakes it. No op blocks except progress(), and only for the timeout
 * it is given. The runtime owns the tp_ctx and destroys it after every thread has
 * stopped using it. Every error sentence written to a kerr names the peer rank and address
 * and the system's cause; the caller adds the operation.
 */
#ifndef KHOR_TRANSPORT_H
#define KHOR_TRANSPORT_H

#include "../base/clock.h"
#include "../base/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TP_ADDR_MAX 256

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

bool tp_meta_conflict(const tp_meta_rules *r, uint32_t a, uint32_t b);
const char *tp_meta_describe(const tp_meta_rules *r, uint32_t meta, char *buf, size_t len);

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
} tp_options;

struct transport_ops {
	const char *name;
	/* Makes the instance and starts listening. */
	khor_status (*create)(const tp_options *opt, tp_ctx **ctx_out, kerr *err);
	/* The address blob to publish (NUL-terminated, < TP_ADDR_MAX). Valid until destroy. */
	const char *(*address)(const tp_ctx *ctx);
	/*
	 * Starts a link to peer, whose blob is peer_addr. Returns at once; the link becomes
	 * usable through progress(). Requests may be posted on it immediately.
	 */
	khor_status (*connect)(tp_ctx *ctx, int peer, const char *peer_addr, tp_link **link_out,
	                       kerr *err);
	/*
	 * The link that peer opened to us, once its handshake has completed; *link_out = NULL
	 * (and KHOR_SUCCESS) while it has not arrived yet. Never blocks.
	 */
	khor_status (*accept)(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err);
	/* True once every socket of the link finished its handshake. */
	bool (*link_ready)(const tp_link *link);
	/* Registration: buffers passed to isend/irecv may be given with their mr (or NULL). */
	khor_status (*reg_mr)(tp_ctx *ctx, void *buf, size_t len, tp_mr **mr_out, kerr *err);
	void (*dereg_mr)(tp_ctx *ctx, tp_mr *mr);
	/* Post a send or receive of len bytes with tag. buf must stay valid until completion. */
	khor_status (*isend)(tp_link *link, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
	                     tp_req **req_out, kerr *err);
	khor_status (*irecv)(tp_link *link, void *buf, size_t len, tp_tag tag, tp_mr *mr,
	                     tp_req **req_out, kerr *err);
	/*
	 * *done_out = true when the request finished; the request is then released and must not
	 * be used again. A failed request also counts as done and returns its error.
	 */
	khor_status (*test)(tp_req *req, bool *done_out, kerr *err);
	/*
	 * Moves bytes on every link; waits up to timeout_ms for socket events when nothing could
	 * be done at once (0 = never wait). *moved_out (if not NULL) tells whether any byte or
	 * connection moved. Errors on a link are reported through that link's requests, not
	 * here; progress fails only when the instance itself is broken.
	 */
	khor_status (*progress)(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err);
	/*
	 * Abandons a request after an error elsewhere: its buffer is never touched again. A
	 * request cut off mid-message breaks its link (the byte stream can't be resynchronised).
	 */
	void (*cancel)(tp_req *req);
	/* The link's first error: its status (KHOR_SUCCESS when healthy), copied to *err_out
	 * (which may be NULL) when there is one. */
	khor_status (*link_error)(tp_link *link, kerr *err_out);
	/*
	 * Makes progress() return at once as if something had moved: for the thread asleep in
	 * it now, and for the next call of every other thread that has not seen the wake yet.
	 * For a thread that waits on both the network and work of its own process (the engine's).
	 */
	void (*wake)(tp_ctx *ctx);
	/* Releases every resource. Pending requests on the ctx's links must be finished first. */
	void (*destroy)(tp_ctx *ctx);
};

extern const struct transport_ops tcp_transport_ops;

/* Looks up a transport by name ("tcp"); NULL if unknown or not built. */
const struct transport_ops *transport_find(const char *name);

#endif
