/*
 * shm_int.h -- what the files of the shared-memory transport share: the segment's layout,
 * the link and instance structs, and the functions one file calls in the other. Not for
 * outside transport/shm/.
 *
 *     shm.c       the rings: sending, receiving, CMA, waking, progress and the ops
 *     shm_link.c  how a link comes up: its segment and the handshake over the socket
 *     shm_fail.c  a link's failure, and how the peer hears of it
 *
 * Calls go one way, shm.c -> shm_link.c -> shm_fail.c: no file calls back into one that
 * calls it.
 *
 * Every function here is called with the instance's lock (ctx->sk.mu) held.
 */
#ifndef KHOR_TRANSPORT_SHM_INT_H
#define KHOR_TRANSPORT_SHM_INT_H

#include "shm.h"

#include "transport/handshake.h"
#include "transport/skel.h"
#include "base/auth.h"
#include "base/clock.h"
#include "base/list.h"

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#define SHM_MAGIC 0x4d48534bu     /* "KSHM": the segment header */
#define SHM_REC_MAGIC 0x43455253u /* "SREC": every ring record */
#define SHM_VERSION 3             /* 2: the shared handshake of handshake.h; 3: a long
                                   * message's first piece names an ack slot */
#define SHM_LINE 64
/* Tunables; the -D overrides exist to measure other choices (see the numbers above). */
#ifndef SHM_RING_BYTES
#define SHM_RING_BYTES (1u << 20)   /* per direction; a power of two */
#endif
#ifndef SHM_PIECE_MAX
#define SHM_PIECE_MAX (64u << 10)   /* payload of one eager record */
#endif
#define SHM_PIECE_MIN (4u << 10)    /* below this, wait for room instead of cutting finer */
#define SHM_UNMATCHED_MAX (2 * SHM_PIECE_MAX) /* ring bytes of a message not matched yet */
#ifndef SHM_EAGER_MAX
#define SHM_EAGER_MAX (16u << 20)   /* larger messages go by CMA when the peer can read us */
#endif
#ifndef SHM_CMA_PIECE
#define SHM_CMA_PIECE (2u << 20)    /* bytes read per process_vm_readv call */
#endif
#define SHM_CMA_SLOTS 64            /* CMA and long unmatched messages in flight per direction */
#define SHM_NO_SLOT 0xffffffffu      /* a record that names no done[] slot */
/* Payload bytes of parked records a link copies out of its ring (to the heap) when they
 * hold more than half of it, so that records of other comms can get in behind them; past
 * this, they stay parked and the sender waits for room. */
#ifndef SHM_ASIDE_MAX
#define SHM_ASIDE_MAX (8u << 20)
#endif
#define SHM_CHECK_NS 1000000ull     /* a busy link's socket is looked at once per ms */
#define SHM_RETRY_NS 5000000ull     /* connect retry interval while the peer starts */
#define SHM_HS_MSG_MAX 256

/* The HELLO's aux words (handshake.h): the ring size, and the address of the connector's
 * nonce_c for the CMA probe. */
enum { SHM_AUX_RING_BYTES = 0, SHM_AUX_NONCE_ADDR = 1 };

/* ---- what lives in the segment ------------------------------------------------------- */

struct shm_line32 {
	_Alignas(SHM_LINE) _Atomic uint32_t v;
};

/* One direction. Each counter has its own cache line: the producer writes tail, the
 * consumer writes head and done[], and neither should pull the other's line on a store. */
struct shm_dir {
	_Alignas(SHM_LINE) _Atomic uint64_t tail; /* producer: bytes ever written */
	_Alignas(SHM_LINE) _Atomic uint64_t head; /* consumer: bytes ever released */
	/* consumer: msg id of the CMA message finished, or of the long message whose first
	 * piece met its receive, in the slot its record named */
	_Alignas(SHM_LINE) _Atomic uint64_t done[SHM_CMA_SLOTS];
};

struct shm_seg {
	uint32_t magic;
	uint32_t version;
	uint32_t ring_bytes;
	uint32_t pad;
	struct shm_line32 sleeping[2]; /* side s waits in poll(): ring its doorbell */
	struct shm_line32 broken[2];   /* side s failed the link: stop trusting its buffers */
	struct shm_dir dir[2];         /* dir[s] carries side s's messages */
	char why[2][512];              /* side s's first error, written before broken[s] */
};

#define SHM_SEG_HDR ((sizeof(struct shm_seg) + 4095) & ~(size_t)4095)

_Static_assert(offsetof(struct shm_seg, dir) == 320 && offsetof(struct shm_seg, why) == 1600 &&
               SHM_SEG_HDR == 4096,
               "the segment drawing at the top of this file is out of date");

enum rec_kind { REC_DATA = 1, REC_RTS = 2, REC_WRAP = 3 };

/* A ring record: this header on one cache line, then the payload, padded to a line. */
struct rec_hdr {
	uint32_t magic;
	uint32_t rec_len; /* header + payload + padding */
	uint32_t kind;
	uint32_t meta;
	uint32_t comm, seq, step;
	uint32_t slot;      /* RTS: the done[] slot the receiver writes when finished; the
	                     * first DATA piece of a message over SHM_UNMATCHED_MAX: the slot it
	                     * writes when the message meets its receive; else SHM_NO_SLOT */
	uint64_t msg_id;    /* per direction, from 1; ties the pieces of one message */
	uint64_t total_len; /* length of the whole message */
	uint64_t arg;       /* DATA: offset of this piece; RTS: the sender's buffer address */
	uint32_t piece_len; /* DATA: payload bytes in this record */
	uint32_t consumed;  /* written by the consumer only: taken out of order */
};

_Static_assert(sizeof(struct rec_hdr) == SHM_LINE, "a record header is one cache line");

/* ---- process-local state ------------------------------------------------------------- */

struct tp_req {
	klist node;       /* on one of the link's request lists, while on is not NULL */
	klist *on;        /* the list the request is on, NULL once finished */
	tp_link *link;
	uint8_t *buf;
	uint64_t len, done;
	tp_tag tag;
	uint64_t msg_id;
	uint64_t peer_addr; /* CMA receive: the sender's buffer */
	uint32_t slot;
	bool is_send, cma, finished;
	bool matched;               /* send: the receiver took its first piece */
};

/* A parked record copied out of the ring (rx_aside), waiting for its receive there. */
struct aside {
	klist node; /* on the link's aside list, in ring order */
	struct rec_hdr h;
	uint8_t payload[];
};

enum link_state { LS_CONNECTING, LS_HS, LS_READY, LS_DEAD };

struct tp_link {
	klist node_all; /* on ctx->all */
	tp_ctx *ctx;
	int peer;    /* -1 on the accepting side until the HELLO names it */
	int side;    /* 0 = connector, 1 = acceptor: which direction we produce */
	int fd;
	int seg_fd;  /* connector: the memfd until it has been passed */
	pid_t peer_pid;
	enum link_state state;
	bool claimed, peer_gone, notify;
	bool refused; /* acceptor: we turned it away (vs. it broke off) */
	int hs_phase;
	kdeadline hs_deadline;
	uint64_t retry_at;
	struct sockaddr_un peer_sa;
	socklen_t peer_sa_len;
	hs_hello hello; /* ours (connector) or the peer's (acceptor), kept for the MACs */
	uint8_t nonce_s[KAUTH_NONCE_LEN];
	uint8_t out[SHM_HS_MSG_MAX]; /* a handshake message the socket did not take yet */
	uint32_t out_len;
	int out_fd;
	char peer_addr[TP_ADDR_MAX];
	/* the segment */
	struct shm_seg *seg;
	size_t seg_len;
	uint32_t ring_bytes;
	uint8_t *tx_ring, *rx_ring;
	struct shm_dir *tx, *rx;
	uint64_t tx_tail, tx_head_seen; /* our copy of tail, and the last head we read */
	uint64_t rx_head, rx_scan;      /* released up to rx_head; examined up to rx_scan */
	bool rescan;                    /* a receive was posted: look at parked records again */
	bool cma_send;                  /* the peer reads our large messages itself */
	uint64_t next_msg_id;
	uint64_t slots_used;            /* bitmap of SHM_CMA_SLOTS */
	klist sendq, cma_wait, posted, active, cma_active; /* of tp_req, in posting order */
	klist aside;                    /* struct aside, older than anything in the ring */
	uint64_t aside_bytes;           /* their payload bytes */
	int nbusy;   /* requests posted and not finished */
	int pending; /* requests posted and not yet released by test or cancel */
	kerr err;
};

/* The arrays of one poll() over the listener, the links' sockets and the wake-up fd. */
struct pollset {
	struct pollfd *pfds;
	tp_link **plinks;
	size_t pcap;
};

struct tp_ctx {
	tp_skel sk;         /* first: the lock, the sleeper, the request pool (skel.h) */
	int rank, size;
	hs_self hs;         /* who we are in handshakes; its secret is ours below */
	const char *secret;   /* the kept copy (base/secret.h): never freed */
	int64_t hs_timeout_ms;
	bool cma_enabled;
	int listen_fd;
	char host_key[80]; /* boot id / network namespace inode: "can we reach each other" */
	char addr[TP_ADDR_MAX];
	tp_link **incoming; /* [size]: links opened to us, once ready */
	tp_link **outgoing; /* [size]: links we opened */
	klist all;          /* every link, newest first */
	uint64_t next_check_ns;
	unsigned busy_calls;  /* progress(0) calls, to sweep and read the clock now and then */
	bool handshaking;     /* a link is still connecting: sweep on every call */
	uint32_t recv_comm, recv_seq; /* the call of the last receive posted */
	struct pollset busy, sleep; /* poll() arrays of spinning callers, and of the sleeper */
	const tp_meta_rules *meta;
};

#define REQ(n) KLIST_ENTRY(n, tp_req, node)
#define LINK(n) KLIST_ENTRY(n, tp_link, node_all)

/* Every link of ctx, newest first (the body must not unlink it: sweep does that). */
#define FOR_EACH_LINK(l, ctx)                                                                 \
	for (tp_link *l = LINK((ctx)->all.next); &l->node_all != &(ctx)->all;                  \
	     l = LINK(l->node_all.next))

/* shm_fail.c */
const char *shm_errstr(int e);
void shm_link_fail_text(tp_link *l, khor_status st, const char *text);
void shm_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void shm_link_fail_peer_gone(tp_link *l, const char *how);

/* shm_link.c */
khor_status shm_seg_create(tp_link *l, kerr *err);
bool shm_hs_send(tp_link *l, const void *msg, uint32_t len, int fd);
bool shm_hs_step(tp_link *l);
void shm_peer_cred(tp_link *l);
void shm_acc_drop(tp_link *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
