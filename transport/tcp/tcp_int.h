/*
 * tcp_int.h -- what the files of the TCP transport share: the frame format, the socket,
 * link and instance structs, and the functions one file calls in another. Not for outside
 * transport/tcp/ (but for the tests that include tcp.c whole).
 *
 *     tcp.c       framing, the data path (sending, matching, reading aside), the ops
 *     tcp_hs.c    the handshake of every socket, over the stream
 *     tcp_dial.c  finding the peer's address: dialing its candidates in order
 *     tcp_sock.c  one socket: attached, closed, failed
 *
 * Calls go one way, tcp.c -> tcp_hs.c -> tcp_dial.c -> tcp_sock.c: no file calls back into
 * one that calls it.
 *
 * Every function here is called with the instance's lock (ctx->sk.mu) held.
 */
#ifndef KHOR_TRANSPORT_TCP_INT_H
#define KHOR_TRANSPORT_TCP_INT_H

#include "transport/transport.h"

#include "transport/handshake.h"
#include "transport/skel.h"
#include "base/list.h"
#include "base/sock.h"

#include <stdbool.h>
#include <stdint.h>

#define TCP_FRAME_MAGIC 0x4d52464bu
/* 2: 64-byte frame headers, frames padded to 64 bytes; 3: rendezvous; 4: the shared
 * handshake of handshake.h */
#define TCP_VERSION 4
#define TCP_FRAME_ALIGN 64
#define TCP_MAX_SOCKS 16
/* Bytes of unexpected frames a link holds before it leaves the rest in the kernel. */
#define TCP_UNEXPECTED_MAX (8u << 20)
/* Request-to-send headers a link holds read aside (each costs a queue entry, not its
 * payload). One more breaks the link with an error naming the bound: parking it instead
 * would stall the payloads this rank already asked for behind it, and no schedule leaves
 * a thousand large sends unmatched. */
#define TCP_UNEXPECTED_RTS_MAX 1024u
/* Chunks above this go by rendezvous; below, they go at once (eager). */
#define TCP_EAGER_MAX (1u << 20)
/*
 * How long one of several addresses of a peer may stay silent before the next is tried
 * (doubled on every pass over the list). Long enough for one lost SYN (retransmitted after
 * 1 s) on a loaded but working network; an address on a dead subnet otherwise costs an ARP
 * timeout (3 s) or a full SYN back-off (over 2 minutes).
 */
#define TCP_ATTEMPT_MS 1500

enum frame_kind { FRAME_EAGER = 0, FRAME_RTS = 1, FRAME_CTS = 2, FRAME_DATA = 3 };

/* frame_hdr.flags: the header carries the sender's sum (isend_sum). */
#define TCP_HDR_SUM 1u

/* The HELLO's aux words (handshake.h): which socket of how many this connection is. */
enum { TCP_AUX_SOCK_IDX = 0, TCP_AUX_NSOCKS = 1 };

struct frame_hdr {
	uint32_t magic;
	uint32_t comm;
	uint32_t seq;
	uint32_t step;
	uint32_t meta; /* what the sender is doing (collective, dtype, op); must match */
	uint32_t kind; /* enum frame_kind */
	uint64_t total_len;
	uint64_t chunk_len;
	uint64_t sum;   /* KHOR_CHECKSUM's sum of the whole message, where flags say so */
	uint32_t flags; /* TCP_HDR_SUM */
	uint8_t reserved[12]; /* zero; rounds the header up to TCP_FRAME_ALIGN */
};
_Static_assert(sizeof(struct frame_hdr) == TCP_FRAME_ALIGN, "the frame header is one unit");

/* Zeros after a payload of len bytes, so that the next header starts on the alignment. */
static inline uint32_t frame_pad(uint64_t len)
{
	return (uint32_t)(-len & (TCP_FRAME_ALIGN - 1));
}


enum sock_state {
	SS_CONNECTING,  /* connector: waiting for connect() to finish */
	SS_HS_CONN,     /* connector: handshake in progress */
	SS_HS_ACC,      /* acceptor: handshake in progress */
	SS_DATA,        /* carrying frames */
	SS_DEAD
};

/* One chunk of a request, queued on one socket. */
struct chunk {
	klist node;        /* on one of its socket's queues: sq, rq, rts_wait or rdv_wait */
	tp_req *req;
	uint8_t *buf;
	uint64_t len;
	uint64_t done;   /* payload bytes moved */
	uint32_t hdr_done; /* header bytes sent (send side) */
	uint32_t pad_left; /* padding bytes still to send (send side) */
	bool ctl;          /* a CTS of ours, freed once sent (req NULL) */
	struct frame_hdr hdr;
};

/*
 * A frame read before its receive was posted (see the top of the file): ch holds its header
 * and a heap copy of its payload, with ch.req NULL; want is the receive that claimed it
 * while the payload was still arriving.
 */
struct uframe {
	struct chunk ch;
	klist node; /* on its socket's uq */
	struct chunk *want;
	bool complete;
};

struct tp_req {
	tp_link *link;
	int nchunks;
	int chunks_done;
	bool is_send;
	tp_sum *sum_out;      /* irecv_sum's: where the carried sum goes; NULL for irecv */
	struct chunk chunks[TCP_MAX_SOCKS];
};

struct tsock {
	int fd;
	int idx;
	enum sock_state state;
	tp_link *link;        /* NULL for an acceptor socket before its HELLO arrived */
	tp_ctx *ctx;
	bool rd_ready, wr_ready;
	kdeadline hs_deadline;
	char peer_str[64];    /* address of the other end, for messages */
	/* handshake buffers */
	uint8_t hs_out[128];
	uint32_t hs_out_len, hs_out_off;
	uint8_t hs_in[128];
	uint32_t hs_in_need, hs_in_got;
	int hs_phase;
	hs_hello hello;        /* the HELLO of this socket, kept for the MACs */
	uint8_t nonce_s[KAUTH_NONCE_LEN];
	klist sq;             /* chunks to send, in order */
	klist rq;             /* posted receives (matched by tag), newest first */
	struct frame_hdr rhdr;
	uint32_t rhdr_got;
	uint32_t rskip;       /* padding of the last frame still to read and drop */
	struct chunk *rcur;   /* chunk receiving the current payload */
	bool parked;          /* rhdr complete but no matching receive yet */
	klist uq;             /* frames read aside (struct uframe), in arrival order */
	klist rts_wait;       /* our large sends whose RTS went out: waiting for a CTS */
	klist rdv_wait;       /* our receives that sent a CTS: waiting for the DATA */
	uint32_t e_off, e_len; /* unread bytes of the stream in ebuf */
	uint8_t ebuf[8192];
	klist node_all;       /* on ctx->all */
};

_Static_assert(sizeof(hs_hello) <= sizeof(((struct tsock *)0)->hs_in) &&
               sizeof(hs_challenge) <= sizeof(((struct tsock *)0)->hs_out),
               "a handshake message must fit the socket's buffers");

/* A link we opened: the peer's addresses, in the order we try them, and how it went. */
struct tcp_dial {
	int n;
	int cur;              /* the address the sockets are connecting to */
	bool chosen;          /* a socket connected to addr[cur]: the link's address for good */
	int round;            /* passes over the list so far */
	bool soft;            /* an address of this pass timed out (rather than failed) */
	kdeadline attempt_dl; /* when addr[cur] has had its time */
	kdeadline deadline;   /* when the whole link has (the handshake timeout) */
	klist node;           /* on ctx->dialing while the address is not settled */
	tp_link *link;
	ksockaddr addr[KSOCK_MAX_CANDS];
	char str[KSOCK_MAX_CANDS][64];
	char why[KSOCK_MAX_CANDS][96];  /* why it is tried where it is, for the log */
	char fail[KSOCK_MAX_CANDS][96]; /* its last failure, "" if none */
};

struct tp_link {
	tp_ctx *ctx;
	int peer;
	int nsocks;
	int nready;
	bool claimed;         /* acceptor side: handed out by accept() */
	char peer_addr[TP_ADDR_MAX];
	struct tsock *socks[TCP_MAX_SOCKS];
	kerr err;             /* first error; sticky */
	int pending;          /* requests posted and not finished */
	uint64_t ubytes;      /* payload bytes of the sockets' unexpected frames */
	uint32_t urts;        /* request-to-send headers among them */
	struct tcp_dial *dial; /* links we opened; NULL for accepted ones */
};

/*
 * The blocks of the data path that come and go with every unexpected frame (tcp.c,
 * "pool"): frame records, CTS chunks and read-aside payloads under TCP_POOL_MAX bytes, in
 * power-of-two classes from 64 bytes. A block freed goes on its list, while the lists hold
 * under TCP_POOL_KEEP bytes, and the next one of its class comes from there.
 */
#define TCP_POOL_MIN_SHIFT 6
#define TCP_POOL_CLASSES 12 /* 64 B .. 128 KiB */
#define TCP_POOL_MAX (1u << (TCP_POOL_MIN_SHIFT + TCP_POOL_CLASSES - 1))
#define TCP_POOL_KEEP (8u << 20)

struct tcp_free {
	struct tcp_free *next;
};

struct tcp_pool {
	struct tcp_free *payload[TCP_POOL_CLASSES];
	struct tcp_free *frames;  /* struct uframe */
	struct tcp_free *ctl;     /* struct chunk */
	uint64_t kept;            /* bytes on the lists */
};

struct tp_ctx {
	tp_skel sk;           /* first: the lock, the sleeper, the request pool (skel.h) */
	int rank, size;
	hs_self hs;           /* who we are in handshakes; its secret is ours below */
	const char *secret;   /* the kept copy (base/secret.h): never freed */
	int nsocks;
	uint64_t min_stripe;
	int bufsize;
	int64_t hs_timeout_ms;
	int epfd;
	int listen_fd;
	char addr[TP_ADDR_MAX]; /* the published list, best first */
	bool spec_set;        /* KHOR_SOCKET_IFNAME chose the address */
	ksock_iface *mine;    /* this host's addresses, to order a peer's */
	int nmine;
	klist dialing;        /* struct tcp_dial of links whose address is not settled yet */
	tp_link **incoming;   /* [size]: links opened to us, by peer rank */
	tp_link **outgoing;   /* [size]: links we opened */
	klist all;            /* every socket (struct tsock), for progress and cleanup */
	uint32_t recv_comm, recv_seq; /* the call of the last receive posted */
	const tp_meta_rules *meta;
	struct tcp_pool pool;
};

/* tcp_sock.c */
const char *tcp_errstr(int e);
void tcp_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void tcp_sock_close_fd(struct tsock *s);
void tcp_sock_fail(struct tsock *s, khor_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
bool tcp_sock_attach(struct tsock *s, int fd, enum sock_state st);

/* tcp_dial.c */
khor_status tcp_dial_plan(tp_ctx *ctx, int peer, const char *peer_addr, struct tcp_dial *d,
                          kerr *err);
int tcp_dial_start(tp_link *l);
void tcp_dial_next(tp_link *l, const char *why, bool timed_out);
void tcp_dial_chosen(tp_link *l);
void tcp_dial_tick(tp_ctx *ctx);
bool tcp_sock_connected(const struct tsock *s);

/* tcp_hs.c */
void tcp_hs_expect(struct tsock *s, uint32_t n);
bool tcp_hs_drive(struct tsock *s);

#endif
