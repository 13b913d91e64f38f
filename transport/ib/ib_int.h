/*
 * ib_int.h -- what the files of the verbs transport share: the wire formats, the link and
 * instance structs, and the functions one phase calls in another. Not for outside
 * transport/ib/; the transport's face is ib.h.
 *
 *     ib.c          the ops table, progress, create and destroy
 *     ib_common.c   requests and link failure, which every other file calls
 *     ib_dev.c      device and port choice (KHOR_IB_HCA), GIDs, the flush QP, async events
 *     ib_connect.c  the bootstrap socket, the handshake, QP set-up
 *     ib_p2p.c      eager slots, credits, rendezvous writes, matching, completions
 *     ib_reg.c      memory registration and the GPUDirect flush
 *     ib_gdr.c      registration of device memory (dmabuf, peer-memory)
 *     ib_load.c     libibverbs, loaded at run time
 *
 * Calls go one way, ib.c -> ib_connect.c -> ib_p2p.c -> ib_reg.c -> ib_common.c (ib.c ->
 * ib_dev.c -> ib_reg.c; ib_reg.c -> ib_gdr.c): no file calls back into one that calls it.
 *
 * Every function here is called with the instance's lock (the skeleton's, ctx->sk.mu) held,
 * but for ib_reg_mr, ib_dereg_mr and ib_flush, which are ops and take it themselves.
 */
#ifndef KHOR_TRANSPORT_IB_INT_H
#define KHOR_TRANSPORT_IB_INT_H

#include "ib.h"

#include "base/auth.h"
#include "base/list.h"
#include "base/clock.h"
#include "base/sleeper.h"
#include "base/sock.h"
#include "transport/handshake.h"
#include "transport/skel.h"
#include "ib_gdr.h"
#include "ib_load.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define IB_PROTO 1
#define IB_MAX_QPS 8
#define IB_SLOTS 32                 /* eager receive slots per link (QP 0) */
#define IB_SEND_SLOTS 32            /* eager send slots per link */
#define IB_SLOT_BYTES 65536
#define IB_HDR_BYTES 128
#define IB_EAGER_MAX (IB_SLOT_BYTES - IB_HDR_BYTES)
#define IB_IMM_WQES 64              /* receives posted on QPs 1.. (immediates only) */
#define IB_SQ_DEPTH 256             /* send work requests in flight per QP */
#define IB_RDV_MAX 64               /* rendezvous receives in flight per link */
#define IB_MIN_STRIPE (256u << 10)  /* parts of a large message over the QPs */
#define IB_UNEXPECTED_MAX (8u << 20) /* early messages copied aside, each with its record */
/* CTSs kept for sends not posted yet: a peer has at most IB_RDV_MAX receives asking at once;
 * one past this many fails the link (the tcp transport's TCP_UNEXPECTED_RTS_MAX). */
#define IB_CTS_EARLY_MAX 1024
#define IB_HS_BUF 512

enum msg_kind { MSG_EAGER = 1, MSG_CTS = 2 };

/* The header in front of every eager message and CTS (fits IB_HDR_BYTES). */
struct msg_hdr {
	uint32_t kind;
	uint32_t comm, seq, step, meta;
	uint32_t rdv_id;      /* CTS: echoed as the immediate of the writes */
	uint64_t len;         /* the message's length (eager: payload bytes that follow) */
	uint64_t addr;        /* CTS: where to write */
	uint32_t rkey;        /* CTS */
	uint32_t nqp;         /* the sender's count of posted[] */
	uint32_t posted[IB_MAX_QPS]; /* receives the sender has posted in all, per QP */
};
_Static_assert(sizeof(struct msg_hdr) <= IB_HDR_BYTES, "header fits");

/* What each side tells the other after the handshake. */
struct qp_info {
	uint32_t magic;
	uint32_t nqp;
	uint32_t qpn[IB_MAX_QPS];
	uint32_t psn[IB_MAX_QPS];
	uint32_t posted[IB_MAX_QPS];
	uint8_t gid[16];
	uint16_t lid;
	uint8_t mtu;          /* enum ibv_mtu */
	uint8_t link_layer;
	uint32_t max_msg;     /* the port's max_msg_sz, capped at 1 GiB */
	uint64_t credit_addr; /* where our credit words are */
	uint32_t credit_rkey;
	uint32_t pad;
};

struct ib_ready { uint32_t magic, ok; };

/* Sent on the bootstrap when a link fails on our side (a length mismatch found by the
 * sender of a rendezvous, say), so the peer fails it too, with the reason, at once. */
struct ib_abort {
	uint32_t magic;
	uint32_t status;
	char text[IB_HS_BUF - 8];
};

/* wr_id = pointer | type (pointers are 8-aligned). */
enum wr_type { WR_RSLOT = 1, WR_RIMM = 2, WR_SSLOT = 3, WR_RDV = 4, WR_CREDIT = 5, WR_FLUSH = 6 };
#define WR_ID(p, t) ((uint64_t)(uintptr_t)(p) | (uint64_t)(t))
#define WR_PTR(id) ((void *)(uintptr_t)((id) & ~(uint64_t)7))
#define WR_TYPE(id) ((int)((id) & 7))

struct tp_mr {
	struct ibv_mr *mr;
	tp_mem_kind kind;
	uint8_t *buf;
	size_t len;
};

struct qp {
	struct ibv_qp *qp;
	tp_link *link;
	int idx;
	uint32_t psn;
	int sq_out;          /* send work requests not completed yet */
	uint32_t rx_posted;  /* receives we posted in all */
	uint32_t rx_told;    /* ... as the peer last heard it */
	uint32_t tx_used;    /* receives of the peer we consumed */
	uint32_t peer_posted;
};

struct slot {
	tp_link *link;
	int idx;
	uint8_t *mem;
	struct slot *next; /* send slots: the free list; receive slots: held ones */
};

/* A message that arrived before its receive: a copy, or the slot itself when over bound. */
struct unexp {
	klist node;           /* on the link's uq, in arrival order */
	struct msg_hdr hdr;
	uint8_t *data;        /* heap copy, or NULL when the slot is held */
	struct slot *held;
};

struct tp_req {
	klist node;          /* on one of the link's lists: recvs, sends_eager, sends_rdv, ctl_q */
	tp_link *link;
	uint8_t *buf;
	uint64_t len;
	tp_tag tag;
	bool is_send, done, orphan, rdv, active;
	khor_status st;
	struct ibv_mr *own_mr; /* made for this request (the caller passed none) */
	uint32_t lkey, rkey;
	/* send, rendezvous: the CTS and how far the writes have been posted */
	uint64_t raddr;
	uint32_t rrkey, rdv_id;
	int nparts;
	uint64_t part_done[IB_MAX_QPS]; /* bytes of each part posted */
	int wr_out;          /* posted writes not completed */
	/* receive, rendezvous */
	int imm_seen;
	bool cts_sent;
	/* flush */
	bool flush;
};

enum link_state { LS_CONNECTING, LS_HS, LS_QPINFO, LS_READY_WAIT, LS_READY, LS_DEAD };

struct tp_link {
	tp_ctx *ctx;
	klist node_all;       /* on ctx->all */
	int peer;             /* -1 on the accepting side until the HELLO names it */
	bool acceptor, claimed, refused;
	bool peer_failed;     /* the peer sent us its reason: nothing to tell it back */
	enum link_state state;
	int fd;               /* the bootstrap socket */
	int hs_phase;
	kdeadline hs_deadline;
	hs_hello hello;
	uint8_t nonce_s[KAUTH_NONCE_LEN];
	uint8_t out[IB_HS_BUF];
	uint32_t out_len, out_off;
	uint8_t in[IB_HS_BUF];
	uint32_t in_need, in_got;
	char peer_addr[TP_ADDR_MAX];
	kerr err;             /* first error; sticky */
	/* verbs */
	struct ibv_cq *cq;
	int nqp;
	struct qp qps[IB_MAX_QPS];
	struct qp_info peer_info;
	uint32_t max_wr_bytes;
	uint8_t *mem;         /* receive slots, send slots, credit words: one MR */
	size_t mem_len;
	struct ibv_mr *mem_mr;
	struct slot rslots[IB_SLOTS];
	struct slot sslots[IB_SEND_SLOTS];
	struct slot *sfree;
	volatile uint32_t *credit_in;  /* the peer RDMA-writes its posted counts here */
	uint32_t *credit_out;          /* the source of our credit writes */
	bool credit_busy;
	/* requests */
	klist recvs;          /* posted eager receives, in order */
	klist sends_eager;    /* eager sends waiting for a slot or credit, in order */
	klist sends_rdv;      /* rendezvous sends: waiting for a CTS or writing, newest first */
	klist ctl_q;          /* rendezvous receives whose CTS is still to be sent, in order */
	klist uq;             /* struct unexp: messages that came before their receive */
	uint64_t ubytes;
	struct msg_hdr *cts_early; /* CTSs that came before their send */
	int ncts_early, cts_early_cap;
	tp_req *rdv[IB_RDV_MAX];
	uint32_t rdv_gen;
	int pending;          /* requests posted and not released */
};

struct tp_ctx {
	tp_skel sk;             /* first: the lock, the sleeper, the request pool (skel.h) */
	int rank, size;
	hs_self self;
	const char *secret;   /* the kept copy (base/secret.h): never freed */
	const tp_meta_rules *meta;
	int64_t hs_timeout_ms;
	const struct ib_api *api;
	struct ibv_context *dev;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	char dev_name[64];
	int port;
	int gid_index;
	union ibv_gid gid;
	char gid_str[64];
	const char *gid_type;
	uint16_t lid;
	enum ibv_mtu mtu;
	uint8_t link_layer;
	uint32_t max_msg;
	int nqp;
	int timeout, retry_cnt;
	uint32_t max_wr;        /* KHOR_IB_MAX_WR_BYTES, 0 = the ports' limit */
	int gid_forced;         /* KHOR_IB_GID_INDEX, -1 = automatic */
	char hca[256];          /* KHOR_IB_HCA, "" = any */
	enum ib_gdr_mode gdr;
	char gdr_why[256];
	bool gdr_probed, gdr_logged;
	bool flush_always;
	/* the flush QP: connected to itself, for RDMA reads that fence GPUDirect writes */
	struct ibv_cq *fcq;
	struct ibv_qp *fqp;
	struct ibv_mr *fmr;
	uint64_t fbuf;
	int listen_fd, epfd;
	char addr[TP_ADDR_MAX];
	char bind_ip[64];
	tp_link **incoming;
	tp_link **outgoing;
	klist all;              /* every link (tp_link), newest first */
	unsigned spins;        /* progress(0) calls, for the poll set's turn */
};

/* ib_common.c */
const char *ib_errstr(int e);
void ib_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
tp_req *ib_req_new(tp_link *l);
void ib_req_release(tp_req *r);
void ib_req_finish(tp_req *r, khor_status st);
bool ib_req_unlink(tp_req *r);

#define IB_REQ(n) KLIST_ENTRY(n, tp_req, node)
#define IB_LINK(n) KLIST_ENTRY(n, tp_link, node_all)

/* Every link of ctx, newest first (the body must not unlink it: ib_conn_sweep does that). */
#define IB_FOR_EACH_LINK(l, ctx)                                                              \
	for (tp_link *l = IB_LINK((ctx)->all.next); &l->node_all != &(ctx)->all;              \
	     l = IB_LINK(l->node_all.next))

/* ib_dev.c */
khor_status ib_dev_open(tp_ctx *ctx, kerr *err);
khor_status ib_dev_gid(tp_ctx *ctx, const ksockaddr *local, const char *ifname, kerr *err);
khor_status ib_dev_flush_qp(tp_ctx *ctx, kerr *err);
void ib_dev_events(tp_ctx *ctx);

/* ib_connect.c */
khor_status ib_connect_locked(tp_ctx *ctx, int peer, const char *peer_addr, tp_link **link_out,
                              kerr *err);
bool ib_conn_drive(tp_link *l);
void ib_conn_accept(tp_ctx *ctx);
void ib_conn_sweep(tp_ctx *ctx);

/* ib_p2p.c */
bool ib_post_recv_slot(tp_link *l, struct slot *s);
bool ib_post_recv_imm(struct qp *q);
bool ib_link_push(tp_link *l);
bool ib_poll_link(tp_link *l);
khor_status ib_isend_locked(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err);
khor_status ib_irecv_locked(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err);

/* ib_reg.c */
khor_status ib_reg_host(tp_ctx *ctx, void *buf, size_t len, int access, const char *what,
                        struct ibv_mr **mr_out, kerr *err);
khor_status ib_req_keys(tp_req *r, tp_mr *mr, int access, kerr *err);
khor_status ib_reg_mr(tp_ctx *ctx, const tp_reg_desc *d, tp_mr **mr_out, kerr *err);
void ib_dereg_mr(tp_ctx *ctx, tp_mr *m);
void ib_mr_key(const tp_mr *m, tp_rkey *out);
khor_status ib_flush(tp_link *l, void *buf, size_t len, tp_mr *mr, tp_req **req_out,
                     kerr *err);

#endif
