/*
 * ib.c -- the verbs transport: reliable-connected queue pairs on an InfiniBand or RoCE HCA
 * (soft-RoCE included), behind the ops table of transport.h.
 *
 * Set-up. Each instance opens one device and port (KHOR_IB_HCA, as NCCL's NCCL_IB_HCA:
 * "mlx5" prefixes, "^mlx5_1" excludes, "=mlx5_0" exact names, ":2" a port), picks a GID
 * (KHOR_IB_GID_INDEX, or on RoCE the RoCE v2 GID of the interface the bootstrap address
 * sits on, which KHOR_SOCKET_IFNAME selects) and listens on a TCP bootstrap socket. A link
 * is opened over that socket: the shared handshake (handshake.h: job, ranks, HMAC proof of
 * the secret), then each side sends its QP numbers, PSNs, GID/LID, MTU and where its credit
 * words live; both move their QPs to RTR and RTS, post their receives and say READY. The
 * QP information travels over the bootstrap and not through rdma_cm because the bootstrap
 * is already there, authenticated and non-blocking in our own poll set; rdma_cm would add
 * a second listener, its own port space and its own event channel for no gain, and
 * librdmacm would be one more library to load (NCCL's IB plugin makes the same choice).
 * The socket stays open: its end tells us at once that the peer exited (kill -9 included),
 * long before RC's retries would.
 *
 * Data. A link has KHOR_IB_QPS_PER_CONN queue pairs (default 2) on one completion queue.
 *   - Small messages (<= IB_EAGER_MAX) go eagerly on QP 0: copied into a registered send
 *     slot behind a 128-byte header and sent (IBV_WR_SEND) into one of the peer's
 *     pre-posted receive slots. The receiver copies the payload into the posted receive
 *     buffer, or aside into a bounded queue of unexpected messages when none is posted yet
 *     (beyond IB_UNEXPECTED_MAX it keeps the slot instead, which back-pressures the sender).
 *   - Large messages are receiver-driven: the receive posts a CTS (an eager control
 *     message with address, rkey, length, tag, meta and a rendezvous id); the sender,
 *     once it has both its send and the CTS, RDMA-writes the payload, split over the QPs
 *     (parts of at least IB_MIN_STRIPE) and into work requests no larger than either
 *     port's max_msg_sz; the last write of each part carries the rendezvous id as
 *     immediate data, and the receive is done when every part's immediate has arrived
 *     (RC delivers a QP's writes in order).
 *   - Credits: every send and every write-with-immediate consumes one receive the peer
 *     posted on that QP. Each side counts what it posted and tells the other in every
 *     header it sends, or, when it has nothing to send, by an RDMA write of its counts into
 *     the peer's credit words. A sender never posts without a credit, so receiver-not-ready
 *     retries don't happen in normal operation.
 *   - Completions are polled in progress(), which sleeps on the completion channel, the
 *     bootstrap sockets, the device's async events and the wake eventfd.
 *
 * Registration. Buffers of messages over IB_EAGER_MAX need an MR: the caller's (from the
 * registration cache above, regcache.h) or, when it passes none, one made for the request
 * and dropped when it completes. Device memory is registered through ib_gdr.h.
 *
 * Threads: every op takes the instance's lock; progress() lets go of it while it sleeps,
 * and only one thread sleeps at a time (base/sleeper.h), as in tcp.c.
 */
#include "ib.h"

#include "base/auth.h"
#include "base/log.h"
#include "base/sleeper.h"
#include "base/sock.h"
#include "transport/handshake.h"
#include "ib_gdr.h"
#include "ib_load.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

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
#define IB_UNEXPECTED_MAX (8u << 20)
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
	struct unexp *next;
	struct msg_hdr hdr;
	uint8_t *data;        /* heap copy, or NULL when the slot is held */
	struct slot *held;
};

struct tp_req {
	tp_req *next;        /* on one of the link's lists, or the free list */
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
	tp_link *next_all;
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
	tp_req *recvs;        /* posted receives in order (eager and rendezvous) */
	tp_req *sends_eager, *sends_eager_tail; /* eager sends waiting for a slot or credit */
	tp_req *sends_rdv;    /* rendezvous sends: waiting for a CTS or writing */
	tp_req *ctl_q, *ctl_q_tail; /* receives whose CTS is still to be sent */
	struct unexp *uq, *uq_tail;
	uint64_t ubytes;
	struct msg_hdr *cts_early; /* CTSs that came before their send */
	int ncts_early, cts_early_cap;
	tp_req *rdv[IB_RDV_MAX];
	uint32_t rdv_gen;
	int pending;          /* requests posted and not released */
};

struct tp_ctx {
	int rank, size;
	hs_self self;
	char *secret;
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
	tp_link *all;
	tp_req *free_reqs;
	kmutex mu;
	ksleeper sl;
	_Atomic uint64_t completions;
	unsigned spins;        /* progress(0) calls, for the poll set's turn */
};

static void link_fail(tp_link *l, khor_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static const char *errstr(int e)
{
	static __thread char buf[128];
	return kerr_errno_str(e, buf, sizeof(buf));
}

/* ---- requests ------------------------------------------------------------------------ */

static tp_req *req_new(tp_link *l)
{
	tp_ctx *ctx = l->ctx;
	tp_req *r = ctx->free_reqs;

	if (r != NULL)
		ctx->free_reqs = r->next;
	else if ((r = malloc(sizeof(*r))) == NULL)
		return NULL;
	memset(r, 0, sizeof(*r));
	r->link = l;
	l->pending++;
	return r;
}

static void req_release(tp_req *r)
{
	tp_ctx *ctx = r->link->ctx;

	if (r->own_mr != NULL)
		ctx->api->dereg_mr(r->own_mr);
	r->link->pending--;
	r->next = ctx->free_reqs;
	ctx->free_reqs = r;
}

static void req_finish(tp_req *r, khor_status st)
{
	if (r->done)
		return;
	r->done = true;
	r->st = st;
	atomic_fetch_add_explicit(&r->link->ctx->completions, 1, memory_order_relaxed);
	if (r->orphan && r->wr_out == 0)
		req_release(r);
}

/* Takes r off a singly linked list; true if it was there. */
static bool list_remove(tp_req **head, tp_req **tail, tp_req *r)
{
	tp_req *prev = NULL;

	for (tp_req *p = *head; p != NULL; prev = p, p = p->next) {
		if (p != r)
			continue;
		if (prev == NULL)
			*head = p->next;
		else
			prev->next = p->next;
		if (tail != NULL && *tail == p)
			*tail = prev;
		p->next = NULL;
		return true;
	}
	return false;
}

/* ---- failure ------------------------------------------------------------------------- */

/* Moves every QP to the error state: the HCA stops writing into our buffers and flushes
 * what is posted, so the requests can be released. */
static void qps_to_error(tp_link *l)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	for (int q = 0; q < l->nqp; q++)
		if (l->qps[q].qp != NULL)
			l->ctx->api->modify_qp(l->qps[q].qp, &a, IBV_QP_STATE);
}

static void fail_list(tp_req *head, khor_status st)
{
	for (tp_req *r = head, *next; r != NULL; r = next) {
		next = r->next;
		req_finish(r, st);
	}
}

static void link_fail(tp_link *l, khor_status st, const char *fmt, ...)
{
	char what[KERR_TEXT_MAX];
	va_list ap;

	if (l->err.status != KHOR_SUCCESS)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (l->peer >= 0)
		kerr_set(&l->err, st, "ib link to peer rank %d (%s): %s", l->peer,
		         l->peer_addr[0] ? l->peer_addr : "address unknown", what);
	else
		kerr_set(&l->err, st, "ib link from %s: %s", l->peer_addr, what);
	KLOG_DEBUG("%s", l->err.text);
	bool was_ready = l->state == LS_READY;
	if ((l->state == LS_READY || l->state == LS_READY_WAIT) && l->fd >= 0 && !l->peer_failed) {
		struct ib_abort a = { .magic = HS_MAGIC, .status = (uint32_t)st };
		kstrlcpy(a.text, what, sizeof(a.text));
		if (send(l->fd, &a, sizeof(a), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			/* the peer learns from the closed connection instead */
		}
		shutdown(l->fd, SHUT_WR);
	}
	l->state = LS_DEAD;
	if (was_ready)
		qps_to_error(l);
	/* Every request on the link fails now; those whose buffers the HCA may still touch
	 * stay allocated (orphans) until their work requests are flushed. */
	fail_list(l->recvs, st);
	fail_list(l->sends_eager, st);
	fail_list(l->sends_rdv, st);
	for (int i = 0; i < IB_RDV_MAX; i++)
		if (l->rdv[i] != NULL)
			req_finish(l->rdv[i], st);
	l->recvs = l->sends_eager = l->sends_eager_tail = l->sends_rdv = NULL;
	l->ctl_q = l->ctl_q_tail = NULL;
	memset(l->rdv, 0, sizeof(l->rdv));
	atomic_fetch_add_explicit(&l->ctx->completions, 1, memory_order_relaxed);
}

/* ---- memory ------------------------------------------------------------------------ */

static khor_status reg_host(tp_ctx *ctx, void *buf, size_t len, int access, const char *what,
                            struct ibv_mr **mr_out, kerr *err)
{
	struct ibv_mr *mr = ctx->api->reg_mr(ctx->pd, buf, len, access);
	int e = errno;

	if (mr != NULL) {
		*mr_out = mr;
		return KHOR_SUCCESS;
	}
	struct rlimit rl;
	char lim[64] = "unknown";
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		if (rl.rlim_cur == RLIM_INFINITY)
			snprintf(lim, sizeof(lim), "unlimited");
		else
			snprintf(lim, sizeof(lim), "%llu KiB", (unsigned long long)(rl.rlim_cur >> 10));
	}
	if (e == ENOMEM || e == EPERM || e == EAGAIN)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib on %s: registering %s at %p (%zu bytes) "
		                "failed: %s; the locked-memory limit is %s: raise ulimit -l (now %s; "
		                "'ulimit -l unlimited', or memlock in /etc/security/limits.conf, or "
		                "LimitMEMLOCK= for a systemd service)", ctx->dev_name, what, buf, len,
		                errstr(e), lim, lim);
	return kerr_set(err, KHOR_ERR_SYSTEM, "ib on %s: registering %s at %p (%zu bytes) failed: "
	                "%s (locked-memory limit %s)", ctx->dev_name, what, buf, len, errstr(e), lim);
}

static khor_status ib_reg_mr(tp_ctx *ctx, const tp_reg_desc *d, tp_mr **mr_out, kerr *err)
{
	tp_mr *m = calloc(1, sizeof(*m));
	khor_status st;
	int access = 0;

	if (m == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib registration: out of memory");
	if (d->access & TP_ACCESS_LOCAL_WRITE)
		access |= IBV_ACCESS_LOCAL_WRITE;
	if (d->access & TP_ACCESS_REMOTE_WRITE)
		access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	if (d->access & TP_ACCESS_REMOTE_READ)
		access |= IBV_ACCESS_REMOTE_READ;
	kmutex_lock(&ctx->mu);
	if (d->kind == TP_MEM_CUDA) {
		if (!ctx->gdr_probed) {
			ctx->gdr = ib_gdr_probe(ctx->api, ctx->pd, ctx->gdr_why, sizeof(ctx->gdr_why));
			ctx->gdr_probed = true;
		}
		if (ctx->gdr == IB_GDR_NONE) {
			if (!ctx->gdr_logged)
				KLOG_INFO("ib on %s: device buffers are staged through host memory: %s",
				          ctx->dev_name, ctx->gdr_why);
			ctx->gdr_logged = true;
			st = kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "ib on %s: device buffer %p (%zu "
			              "bytes) cannot be registered: %s", ctx->dev_name, d->buf, d->len,
			              ctx->gdr_why);
		} else {
			if (!ctx->gdr_logged)
				KLOG_INFO("ib on %s: GPUDirect RDMA through %s", ctx->dev_name, ctx->gdr_why);
			ctx->gdr_logged = true;
			st = ib_gdr_reg(ctx->api, ctx->pd, ctx->gdr, d, access, &m->mr, err);
		}
	} else {
		st = reg_host(ctx, d->buf, d->len, access, "a buffer", &m->mr, err);
	}
	kmutex_unlock(&ctx->mu);
	if (st != KHOR_SUCCESS) {
		free(m);
		return st;
	}
	m->kind = d->kind;
	m->buf = d->buf;
	m->len = d->len;
	*mr_out = m;
	return KHOR_SUCCESS;
}

static void ib_dereg_mr(tp_ctx *ctx, tp_mr *m)
{
	if (m == NULL)
		return;
	kmutex_lock(&ctx->mu);
	ctx->api->dereg_mr(m->mr);
	kmutex_unlock(&ctx->mu);
	free(m);
}

static void ib_mr_key(const tp_mr *m, tp_rkey *out)
{
	out->addr = (uint64_t)(uintptr_t)m->buf;
	out->len = m->len;
	out->rkey = m->mr->rkey;
	out->pad = 0;
}

/* The keys for [buf, buf+len): from the caller's mr, or a registration of our own. */
static khor_status req_keys(tp_req *r, tp_mr *mr, int access, kerr *err)
{
	tp_link *l = r->link;

	if (mr != NULL) {
		if (r->buf < mr->buf || r->buf + r->len > mr->buf + mr->len)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "ib link to peer rank %d: buffer %p "
			                "(%llu bytes) lies outside the registration given with it (%p, "
			                "%zu bytes)", l->peer, (void *)r->buf, (unsigned long long)r->len,
			                (void *)mr->buf, mr->len);
		r->lkey = mr->mr->lkey;
		r->rkey = mr->mr->rkey;
		return KHOR_SUCCESS;
	}
	khor_status st = reg_host(l->ctx, r->buf, r->len, access, "a message buffer", &r->own_mr,
	                          err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "ib link to peer rank %d", l->peer);
		return st;
	}
	r->lkey = r->own_mr->lkey;
	r->rkey = r->own_mr->rkey;
	return KHOR_SUCCESS;
}

/* ---- posting ------------------------------------------------------------------------- */

/* Receives may be (re)posted: from our RTR on, until the link fails. */
static inline bool live(const tp_link *l)
{
	return l->state == LS_READY || l->state == LS_READY_WAIT;
}

static inline bool credit_ok(const struct qp *q)
{
	return (int32_t)(q->peer_posted - q->tx_used) > 0;
}

static inline bool sq_ok(const struct qp *q)
{
	return q->sq_out < IB_SQ_DEPTH;
}

static bool post_recv_slot(tp_link *l, struct slot *s)
{
	struct ibv_sge sge = { (uint64_t)(uintptr_t)s->mem, IB_SLOT_BYTES, l->mem_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WR_ID(s, WR_RSLOT), .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	int rc = ibv_post_recv(l->qps[0].qp, &wr, &bad);

	if (rc != 0) {
		link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_recv on QP 0: %s", errstr(rc));
		return false;
	}
	l->qps[0].rx_posted++;
	return true;
}

static bool post_recv_imm(struct qp *q)
{
	struct ibv_recv_wr wr = { .wr_id = WR_ID(q, WR_RIMM), .sg_list = NULL, .num_sge = 0 };
	struct ibv_recv_wr *bad;
	int rc = ibv_post_recv(q->qp, &wr, &bad);

	if (rc != 0) {
		link_fail(q->link, KHOR_ERR_SYSTEM, "ibv_post_recv on QP %d: %s", q->idx, errstr(rc));
		return false;
	}
	q->rx_posted++;
	return true;
}

static void hdr_credits(tp_link *l, struct msg_hdr *h)
{
	h->nqp = (uint32_t)l->nqp;
	for (int q = 0; q < l->nqp; q++) {
		h->posted[q] = l->qps[q].rx_posted;
		l->qps[q].rx_told = l->qps[q].rx_posted;
	}
}

static void take_credits(tp_link *l, const uint32_t *posted, uint32_t n)
{
	for (uint32_t q = 0; q < n && q < (uint32_t)l->nqp; q++)
		if ((int32_t)(posted[q] - l->qps[q].peer_posted) > 0)
			l->qps[q].peer_posted = posted[q];
}

/*
 * Sends a header (and len payload bytes from src) through a send slot on QP 0. False when
 * there is no slot, credit or room now (nothing done).
 */
static bool post_msg(tp_link *l, struct msg_hdr *h, const void *src, size_t len)
{
	struct qp *q = &l->qps[0];
	struct slot *s = l->sfree;

	if (s == NULL || !credit_ok(q) || !sq_ok(q))
		return false;
	l->sfree = s->next;
	hdr_credits(l, h);
	memcpy(s->mem, h, sizeof(*h));
	if (len > 0)
		memcpy(s->mem + IB_HDR_BYTES, src, len);
	struct ibv_sge sge = { (uint64_t)(uintptr_t)s->mem, (uint32_t)(IB_HDR_BYTES + len),
	                       l->mem_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_ID(s, WR_SSLOT), .sg_list = &sge, .num_sge = 1,
	                          .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(q->qp, &wr, &bad);
	if (rc != 0) {
		s->next = l->sfree;
		l->sfree = s;
		link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_send on QP 0: %s", errstr(rc));
		return false;
	}
	q->tx_used++;
	q->sq_out++;
	return true;
}

/* Our posted counts into the peer's credit words, when it has not heard of enough of them. */
static void maybe_write_credits(tp_link *l)
{
	struct qp *q0 = &l->qps[0];
	bool need = false;

	if (l->credit_busy || l->state != LS_READY || !sq_ok(q0))
		return;
	for (int q = 0; q < l->nqp; q++) {
		uint32_t unsaid = l->qps[q].rx_posted - l->qps[q].rx_told;
		uint32_t half = (q == 0 ? IB_SLOTS : IB_IMM_WQES) / 2;
		if (unsaid >= half)
			need = true;
	}
	if (!need)
		return;
	for (int q = 0; q < l->nqp; q++) {
		l->credit_out[q] = l->qps[q].rx_posted;
		l->qps[q].rx_told = l->qps[q].rx_posted;
	}
	struct ibv_sge sge = { (uint64_t)(uintptr_t)l->credit_out,
	                       (uint32_t)(sizeof(uint32_t) * (size_t)l->nqp), l->mem_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_ID(l, WR_CREDIT), .sg_list = &sge, .num_sge = 1,
	                          .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = l->peer_info.credit_addr;
	wr.wr.rdma.rkey = l->peer_info.credit_rkey;
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(q0->qp, &wr, &bad);
	if (rc != 0) {
		link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_send (credits) on QP 0: %s", errstr(rc));
		return;
	}
	q0->sq_out++;
	l->credit_busy = true;
}

/* Parts of a large message: identical on both sides. */
static int rdv_parts(const tp_link *l, uint64_t len)
{
	uint64_t n = len / IB_MIN_STRIPE;

	if (n < 1)
		n = 1;
	if (n > (uint64_t)l->nqp)
		n = (uint64_t)l->nqp;
	return (int)n;
}

static void part_range(uint64_t len, int nparts, int i, uint64_t *off, uint64_t *plen)
{
	uint64_t per = (len / (uint64_t)nparts) & ~(uint64_t)63;

	*off = per * (uint64_t)i;
	*plen = i == nparts - 1 ? len - per * (uint64_t)(nparts - 1) : per;
}

/* Posts as many writes of an active rendezvous send as the QPs take. */
static void rdv_push(tp_link *l, tp_req *r)
{
	for (int p = 0; p < r->nparts; p++) {
		struct qp *q = &l->qps[p];
		uint64_t off, plen;

		part_range(r->len, r->nparts, p, &off, &plen);
		while (r->part_done[p] < plen) {
			uint64_t left = plen - r->part_done[p];
			uint64_t n = left < l->max_wr_bytes ? left : l->max_wr_bytes;
			bool last = n == left;
			if (!sq_ok(q) || (last && !credit_ok(q)))
				break;
			struct ibv_sge sge = { (uint64_t)(uintptr_t)(r->buf + off + r->part_done[p]),
			                       (uint32_t)n, r->lkey };
			struct ibv_send_wr wr = {
				.wr_id = WR_ID(r, WR_RDV), .sg_list = &sge, .num_sge = 1,
				.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
			};
			if (last)
				wr.imm_data = htonl(r->rdv_id);
			wr.wr.rdma.remote_addr = r->raddr + off + r->part_done[p];
			wr.wr.rdma.rkey = r->rrkey;
			struct ibv_send_wr *bad;
			int rc = ibv_post_send(q->qp, &wr, &bad);
			if (rc != 0) {
				link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_send (RDMA write) on QP %d: %s", p,
				          errstr(rc));
				return;
			}
			q->sq_out++;
			r->wr_out++;
			if (last)
				q->tx_used++;
			r->part_done[p] += n;
		}
	}
}

static bool rdv_fully_posted(const tp_req *r)
{
	for (int p = 0; p < r->nparts; p++) {
		uint64_t off, plen;
		part_range(r->len, r->nparts, p, &off, &plen);
		if (r->part_done[p] < plen)
			return false;
	}
	return true;
}

static void send_cts(tp_link *l, tp_req *r, bool *sent)
{
	struct msg_hdr h = {
		.kind = MSG_CTS, .comm = r->tag.comm, .seq = r->tag.seq, .step = r->tag.step,
		.meta = r->tag.meta, .rdv_id = r->rdv_id, .len = r->len,
		.addr = (uint64_t)(uintptr_t)r->buf, .rkey = r->rkey,
	};
	*sent = post_msg(l, &h, NULL, 0);
	if (*sent)
		r->cts_sent = true;
}

/* Everything that waits for a slot, a credit or send-queue room, in order. */
static bool link_push(tp_link *l)
{
	bool moved = false;

	if (l->state != LS_READY)
		return false;
	while (l->ctl_q != NULL) {
		bool sent;
		send_cts(l, l->ctl_q, &sent);
		if (!sent)
			break;
		tp_req *r = l->ctl_q;
		l->ctl_q = r->next;
		if (l->ctl_q == NULL)
			l->ctl_q_tail = NULL;
		r->next = NULL;
		moved = true;
	}
	while (l->sends_eager != NULL && l->state == LS_READY) {
		tp_req *r = l->sends_eager;
		struct msg_hdr h = { .kind = MSG_EAGER, .comm = r->tag.comm, .seq = r->tag.seq,
		                     .step = r->tag.step, .meta = r->tag.meta, .len = r->len };
		if (!post_msg(l, &h, r->buf, r->len))
			break;
		l->sends_eager = r->next;
		if (l->sends_eager == NULL)
			l->sends_eager_tail = NULL;
		r->next = NULL;
		req_finish(r, KHOR_SUCCESS); /* copied into the slot: the buffer is free */
		moved = true;
	}
	for (tp_req *r = l->sends_rdv; r != NULL && l->state == LS_READY; r = r->next) {
		if (!r->active || rdv_fully_posted(r))
			continue;
		int before = r->wr_out;
		rdv_push(l, r);
		moved |= r->wr_out != before;
	}
	maybe_write_credits(l);
	return moved;
}

/* ---- matching ------------------------------------------------------------------------ */

static bool tag_is(const struct msg_hdr *h, tp_tag t)
{
	return h->comm == t.comm && h->seq == t.seq && h->step == t.step;
}

static const char *meta_words(const tp_ctx *ctx, uint32_t meta, char *buf, size_t len)
{
	return tp_meta_describe(ctx->meta, meta, buf, len);
}

/* A message or CTS of r's tag: false (and the link failed) when meta or length differ. */
static bool check_match(tp_link *l, tp_req *r, const struct msg_hdr *h, const char *what)
{
	char a[96], b[96];

	if (h->meta != r->tag.meta) {
		link_fail(l, KHOR_ERR_PROTOCOL, "comm %u call %u step %u: the peer's %s is for %s, "
		          "this rank's %s is for %s (the ranks are not running the same collective)",
		          h->comm, h->seq, h->step, what, meta_words(l->ctx, h->meta, a, sizeof(a)),
		          r->is_send ? "send" : "receive", meta_words(l->ctx, r->tag.meta, b, sizeof(b)));
		return false;
	}
	if (h->len != r->len) {
		link_fail(l, KHOR_ERR_PROTOCOL, "comm %u call %u step %u: the peer's %s has %llu "
		          "bytes, this rank's %s %llu bytes (the ranks disagree on a count or dtype)",
		          h->comm, h->seq, h->step, what, (unsigned long long)h->len,
		          r->is_send ? "send" : "receive", (unsigned long long)r->len);
		return false;
	}
	return true;
}

/* A CTS for send r: start writing. */
static void rdv_start(tp_link *l, tp_req *r, const struct msg_hdr *h)
{
	if (!check_match(l, r, h, "receive")) {
		return;
	}
	r->raddr = h->addr;
	r->rrkey = h->rkey;
	r->rdv_id = h->rdv_id;
	r->nparts = rdv_parts(l, r->len);
	r->active = true;
	rdv_push(l, r);
}

static void on_cts(tp_link *l, const struct msg_hdr *h)
{
	for (tp_req *r = l->sends_rdv; r != NULL; r = r->next) {
		if (!r->active && tag_is(h, r->tag)) {
			rdv_start(l, r, h);
			return;
		}
	}
	if (l->ncts_early == l->cts_early_cap) {
		int cap = l->cts_early_cap ? 2 * l->cts_early_cap : 8;
		struct msg_hdr *p = realloc(l->cts_early, (size_t)cap * sizeof(*p));
		if (p == NULL) {
			link_fail(l, KHOR_ERR_NO_MEMORY, "out of memory keeping an early CTS");
			return;
		}
		l->cts_early = p;
		l->cts_early_cap = cap;
	}
	l->cts_early[l->ncts_early++] = *h;
}

/* An eager message for receive r (data: its payload). */
static void eager_deliver(tp_link *l, tp_req *r, const struct msg_hdr *h, const uint8_t *data)
{
	list_remove(&l->recvs, NULL, r);
	if (!check_match(l, r, h, "message")) {
		req_finish(r, l->err.status);
		return;
	}
	if (h->len > 0)
		memcpy(r->buf, data, h->len);
	req_finish(r, KHOR_SUCCESS);
}

static void on_eager(tp_link *l, struct slot *s, const struct msg_hdr *h, bool *keep_slot)
{
	*keep_slot = false;
	if (h->len > IB_EAGER_MAX) {
		link_fail(l, KHOR_ERR_PROTOCOL, "an eager message announces %llu bytes (at most %u)",
		          (unsigned long long)h->len, IB_EAGER_MAX);
		return;
	}
	for (tp_req *r = l->recvs; r != NULL; r = r->next) {
		if (tag_is(h, r->tag)) {
			eager_deliver(l, r, h, s->mem + IB_HDR_BYTES);
			return;
		}
	}
	for (int i = 0; i < IB_RDV_MAX; i++) {
		tp_req *r = l->rdv[i];
		if (r != NULL && tag_is(h, r->tag)) {
			/* We expect a large message, the sender sent a small one. */
			check_match(l, r, h, "message");
			return;
		}
	}
	struct unexp *u = calloc(1, sizeof(*u));
	if (u == NULL) {
		link_fail(l, KHOR_ERR_NO_MEMORY, "out of memory keeping an early message");
		return;
	}
	u->hdr = *h;
	if (l->ubytes + h->len <= IB_UNEXPECTED_MAX && (h->len == 0 || (u->data = malloc(h->len)))) {
		if (h->len > 0)
			memcpy(u->data, s->mem + IB_HDR_BYTES, h->len);
		l->ubytes += h->len;
	} else {
		u->held = s; /* the slot stays ours until a receive takes it: back-pressure */
		*keep_slot = true;
	}
	if (l->uq_tail != NULL)
		l->uq_tail->next = u;
	else
		l->uq = u;
	l->uq_tail = u;
}

static void on_recv_slot(tp_link *l, struct slot *s, uint32_t byte_len, bool with_imm,
                         uint32_t imm);

static void on_imm(tp_link *l, uint32_t imm)
{
	uint32_t idx = imm & (IB_RDV_MAX - 1);
	tp_req *r = l->rdv[idx];

	if (r == NULL || r->rdv_id != imm) {
		link_fail(l, KHOR_ERR_PROTOCOL, "an RDMA write completed for rendezvous %u, which "
		          "this rank is not waiting for", imm);
		return;
	}
	if (++r->imm_seen < rdv_parts(l, r->len))
		return;
	l->rdv[idx] = NULL;
	req_finish(r, KHOR_SUCCESS);
}

static void on_recv_slot(tp_link *l, struct slot *s, uint32_t byte_len, bool with_imm,
                         uint32_t imm)
{
	bool keep = false;

	if (with_imm) {
		on_imm(l, imm);
	} else if (byte_len < IB_HDR_BYTES) {
		link_fail(l, KHOR_ERR_PROTOCOL, "a message of %u bytes is shorter than its header",
		          byte_len);
	} else {
		struct msg_hdr h;
		memcpy(&h, s->mem, sizeof(h));
		take_credits(l, h.posted, h.nqp);
		if (h.kind == MSG_EAGER && byte_len == IB_HDR_BYTES + h.len)
			on_eager(l, s, &h, &keep);
		else if (h.kind == MSG_CTS)
			on_cts(l, &h);
		else
			link_fail(l, KHOR_ERR_PROTOCOL, "a message of kind %u and %u bytes makes no "
			          "sense", h.kind, byte_len);
	}
	if (!keep && live(l))
		post_recv_slot(l, s);
}

/* ---- completions --------------------------------------------------------------------- */

static tp_link *link_of_qpn(tp_link *l, uint32_t qpn, int *idx)
{
	for (int q = 0; q < l->nqp; q++)
		if (l->qps[q].qp->qp_num == qpn) {
			*idx = q;
			return l;
		}
	*idx = -1;
	return l;
}

static void wc_error(tp_link *l, const struct ibv_wc *wc)
{
	int q;

	link_of_qpn(l, wc->qp_num, &q);
	if (l->err.status != KHOR_SUCCESS)
		return; /* flushes after the first error say nothing new */
	const char *hint = "";
	switch (wc->status) {
	case IBV_WC_RETRY_EXC_ERR:
		hint = " (the peer stopped answering: it died, or the network between us is down)";
		break;
	case IBV_WC_REM_ACCESS_ERR:
		hint = " (the peer refused our RDMA write: a stale or wrong key)";
		break;
	case IBV_WC_RNR_RETRY_EXC_ERR:
		hint = " (the peer had no receive posted)";
		break;
	default:
		break;
	}
	link_fail(l, KHOR_ERR_REMOTE, "work completion with error on QP %d: %s (status %d, vendor "
	          "error 0x%x)%s", q, l->ctx->api->wc_status_str(wc->status), (int)wc->status,
	          wc->vendor_err, hint);
}

static void on_wc(tp_link *l, const struct ibv_wc *wc)
{
	void *p = WR_PTR(wc->wr_id);
	int type = WR_TYPE(wc->wr_id);

	switch (type) {
	case WR_RSLOT:
		if (wc->status == IBV_WC_SUCCESS)
			on_recv_slot(l, p, wc->byte_len, wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM,
			             (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0);
		else
			wc_error(l, wc);
		return;
	case WR_RIMM: {
		struct qp *q = p;
		if (wc->status != IBV_WC_SUCCESS) {
			wc_error(l, wc);
			return;
		}
		on_imm(l, ntohl(wc->imm_data));
		if (live(l))
			post_recv_imm(q);
		return;
	}
	case WR_SSLOT: {
		struct slot *s = p;
		l->qps[0].sq_out--;
		s->next = l->sfree;
		l->sfree = s;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		return;
	}
	case WR_CREDIT:
		l->qps[0].sq_out--;
		l->credit_busy = false;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		return;
	case WR_RDV: {
		tp_req *r = p;
		int q;
		link_of_qpn(l, wc->qp_num, &q);
		if (q >= 0)
			l->qps[q].sq_out--;
		r->wr_out--;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		if (r->orphan) {
			if (r->wr_out == 0 && r->done)
				req_release(r);
			return;
		}
		if (r->wr_out == 0 && !r->done && rdv_fully_posted(r)) {
			list_remove(&l->sends_rdv, NULL, r);
			req_finish(r, KHOR_SUCCESS);
		}
		return;
	}
	default:
		link_fail(l, KHOR_ERR_PROTOCOL, "a completion of unknown kind %d", type);
	}
}

static bool poll_link(tp_link *l)
{
	struct ibv_wc wcs[32];
	bool moved = false;
	int n;

	if (l->cq == NULL)
		return false;
	while ((n = ibv_poll_cq(l->cq, 32, wcs)) > 0) {
		for (int i = 0; i < n; i++)
			on_wc(l, &wcs[i]);
		moved = true;
	}
	if (n < 0)
		link_fail(l, KHOR_ERR_SYSTEM, "ibv_poll_cq failed");
	if (l->state == LS_READY) {
		/* The peer may have written new credit words. */
		uint32_t c[IB_MAX_QPS] = { 0 }; /* all set below; gcc -O3 cannot see that */
		for (int q = 0; q < l->nqp; q++)
			c[q] = l->credit_in[q];
		take_credits(l, c, (uint32_t)l->nqp);
		moved |= link_push(l);
	}
	return moved;
}

/* ---- link set-up --------------------------------------------------------------------- */

static khor_status link_verbs(tp_link *l, kerr *err)
{
	tp_ctx *ctx = l->ctx;
	const struct ib_api *api = ctx->api;
	int nqp = ctx->nqp;
	int cqe = nqp * (IB_SQ_DEPTH + 1) + IB_SLOTS + (nqp - 1) * IB_IMM_WQES + 16;

	l->nqp = nqp;
	l->cq = api->create_cq(ctx->dev, cqe, l, ctx->ch, 0);
	if (l->cq == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_cq(%d entries) on %s: %s", cqe,
		                ctx->dev_name, errstr(errno));
	for (int q = 0; q < nqp; q++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = l->cq, .recv_cq = l->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = IB_SQ_DEPTH + 1,
			         .max_recv_wr = q == 0 ? IB_SLOTS : IB_IMM_WQES,
			         .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct qp *Q = &l->qps[q];
		Q->qp = api->create_qp(ctx->pd, &ia);
		if (Q->qp == NULL)
			return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_qp on %s: %s", ctx->dev_name,
			                errstr(errno));
		Q->link = l;
		Q->idx = q;
		kauth_random(&Q->psn, sizeof(Q->psn));
		Q->psn &= 0xffffff;
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = (uint8_t)ctx->port,
			.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
		};
		if (api->modify_qp(Q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		                   IBV_QP_ACCESS_FLAGS) != 0)
			return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_modify_qp(INIT) on %s: %s",
			                ctx->dev_name, errstr(errno));
	}
	l->mem_len = (size_t)(IB_SLOTS + IB_SEND_SLOTS) * IB_SLOT_BYTES + 4096;
	if (posix_memalign((void **)&l->mem, 4096, l->mem_len) != 0) {
		l->mem = NULL;
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib link: out of memory for %zu bytes of "
		                "message slots", l->mem_len);
	}
	memset(l->mem, 0, l->mem_len);
	khor_status st = reg_host(ctx, l->mem, l->mem_len,
	                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	                          "the link's message slots", &l->mem_mr, err);
	if (st != KHOR_SUCCESS)
		return st;
	for (int i = 0; i < IB_SLOTS; i++)
		l->rslots[i] = (struct slot){ l, i, l->mem + (size_t)i * IB_SLOT_BYTES, NULL };
	for (int i = 0; i < IB_SEND_SLOTS; i++) {
		l->sslots[i] = (struct slot){ l, i, l->mem + (size_t)(IB_SLOTS + i) * IB_SLOT_BYTES,
		                              l->sfree };
		l->sfree = &l->sslots[i];
	}
	uint8_t *words = l->mem + (size_t)(IB_SLOTS + IB_SEND_SLOTS) * IB_SLOT_BYTES;
	l->credit_in = (volatile uint32_t *)words;
	l->credit_out = (uint32_t *)(words + 256);
	return KHOR_SUCCESS;
}

static void qp_info_make(tp_link *l, struct qp_info *qi)
{
	tp_ctx *ctx = l->ctx;

	memset(qi, 0, sizeof(*qi));
	qi->magic = HS_MAGIC;
	qi->nqp = (uint32_t)l->nqp;
	for (int q = 0; q < l->nqp; q++) {
		qi->qpn[q] = l->qps[q].qp->qp_num;
		qi->psn[q] = l->qps[q].psn;
		qi->posted[q] = q == 0 ? IB_SLOTS : IB_IMM_WQES;
	}
	memcpy(qi->gid, ctx->gid.raw, 16);
	qi->lid = ctx->lid;
	qi->mtu = (uint8_t)ctx->mtu;
	qi->link_layer = ctx->link_layer;
	qi->max_msg = ctx->max_msg;
	qi->credit_addr = (uint64_t)(uintptr_t)l->credit_in;
	qi->credit_rkey = l->mem_mr->rkey;
}

/* The peer's QP information arrived: connect the QPs and post the receives. */
static bool link_connect_qps(tp_link *l, const struct qp_info *pi)
{
	tp_ctx *ctx = l->ctx;
	const struct ib_api *api = ctx->api;

	if (pi->magic != HS_MAGIC || pi->nqp < 1 || pi->nqp > IB_MAX_QPS ||
	    pi->mtu < IBV_MTU_256 || pi->mtu > IBV_MTU_4096) {
		link_fail(l, KHOR_ERR_PROTOCOL, "the peer's queue-pair information is malformed");
		return false;
	}
	if (pi->link_layer != ctx->link_layer) {
		link_fail(l, KHOR_ERR_PROTOCOL, "the peer's port is %s and ours %s: they cannot "
		          "reach each other", pi->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB",
		          ctx->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB");
		return false;
	}
	l->peer_info = *pi;
	/* Both sides use the smaller QP count; extra QPs stay unused in INIT. */
	if ((int)pi->nqp < l->nqp)
		l->nqp = (int)pi->nqp;
	enum ibv_mtu mtu = pi->mtu < ctx->mtu ? (enum ibv_mtu)pi->mtu : ctx->mtu;
	uint32_t max_msg = pi->max_msg < ctx->max_msg ? pi->max_msg : ctx->max_msg;
	uint32_t cap = ctx->max_wr;
	l->max_wr_bytes = cap > 0 && cap < max_msg ? cap : max_msg;
	if (l->max_wr_bytes < 4096)
		l->max_wr_bytes = 4096;
	for (int q = 0; q < l->nqp; q++) {
		struct qp *Q = &l->qps[q];
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = pi->qpn[q],
			.rq_psn = pi->psn[q], .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		};
		a.ah_attr.port_num = (uint8_t)ctx->port;
		a.ah_attr.dlid = pi->lid;
		if (ctx->link_layer == IBV_LINK_LAYER_ETHERNET || ctx->gid_index > 0) {
			a.ah_attr.is_global = 1;
			memcpy(a.ah_attr.grh.dgid.raw, pi->gid, 16);
			a.ah_attr.grh.sgid_index = (uint8_t)ctx->gid_index;
			a.ah_attr.grh.hop_limit = 64;
		}
		if (api->modify_qp(Q->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
		                   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
		                   IBV_QP_MIN_RNR_TIMER) != 0) {
			link_fail(l, KHOR_ERR_SYSTEM, "ibv_modify_qp(RTR) of QP %d on %s (GID index %d): "
			          "%s", q, ctx->dev_name, ctx->gid_index, errstr(errno));
			return false;
		}
		struct ibv_qp_attr b = {
			.qp_state = IBV_QPS_RTS, .timeout = (uint8_t)ctx->timeout,
			.retry_cnt = (uint8_t)ctx->retry_cnt, .rnr_retry = 7, .sq_psn = Q->psn,
			.max_rd_atomic = 1,
		};
		if (api->modify_qp(Q->qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
			link_fail(l, KHOR_ERR_SYSTEM, "ibv_modify_qp(RTS) of QP %d on %s: %s", q,
			          ctx->dev_name, errstr(errno));
			return false;
		}
		Q->peer_posted = pi->posted[q];
	}
	l->state = LS_READY; /* for the posts below; READY_WAIT until the peer's READY */
	for (int i = 0; i < IB_SLOTS; i++)
		if (!post_recv_slot(l, &l->rslots[i]))
			return false;
	for (int q = 1; q < l->nqp; q++)
		for (int i = 0; i < IB_IMM_WQES; i++)
			if (!post_recv_imm(&l->qps[q]))
				return false;
	for (int q = 0; q < l->nqp; q++)
		l->qps[q].rx_told = l->qps[q].rx_posted;
	l->state = LS_READY_WAIT;
	if (ibv_req_notify_cq(l->cq, 0) != 0) {
		link_fail(l, KHOR_ERR_SYSTEM, "ibv_req_notify_cq failed");
		return false;
	}
	return true;
}

/* ---- the bootstrap socket ------------------------------------------------------------ */

static void hs_queue(tp_link *l, const void *p, uint32_t n)
{
	if (l->out_len - l->out_off + n > sizeof(l->out)) {
		link_fail(l, KHOR_ERR_PROTOCOL, "handshake output overflow");
		return;
	}
	memmove(l->out, l->out + l->out_off, l->out_len - l->out_off);
	l->out_len -= l->out_off;
	l->out_off = 0;
	memcpy(l->out + l->out_len, p, n);
	l->out_len += n;
}

static void hs_expect(tp_link *l, uint32_t n)
{
	l->in_need = n;
	l->in_got = 0;
}

/* Authenticated: our QP information goes out, the peer's is awaited. */
static void send_qp_info(tp_link *l)
{
	struct qp_info qi;

	qp_info_make(l, &qi);
	hs_queue(l, &qi, sizeof(qi));
	hs_expect(l, sizeof(struct qp_info));
	l->state = LS_QPINFO;
}

/* An acceptor-side connection that never became a link: log why, forget it. */
static void acc_drop(tp_link *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void acc_drop(tp_link *l, const char *fmt, ...)
{
	char what[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	KLOG_WARN("ib transport (rank %d): %s connection from %s: %s", l->ctx->rank,
	          l->refused ? "refused a" : "dropped a", l->peer_addr, what);
	l->state = LS_DEAD;
	if (l->err.status == KHOR_SUCCESS)
		kerr_set(&l->err, KHOR_ERR_REMOTE, "dropped");
}

static void send_best_effort(int fd, const void *p, size_t n)
{
	if (send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* a refused peer; nothing more to tell it */
	}
}

static void acc_hello(tp_link *l)
{
	tp_ctx *ctx = l->ctx;
	hs_challenge c;

	memcpy(&l->hello, l->in, sizeof(l->hello));
	l->refused = true;
	if (l->hello.magic != HS_MAGIC) {
		acc_drop(l, "bad magic 0x%08x (not a khor peer)", l->hello.magic);
		return;
	}
	uint32_t status = hs_hello_check(&ctx->self, &l->hello);
	if (status != HS_OK) {
		hs_refusal(status, &c);
		send_best_effort(l->fd, &c, sizeof(c));
		acc_drop(l, "it claims rank %d of job '%s', protocol %u: %s", l->hello.from_rank,
		         l->hello.job_id, l->hello.version, hs_status_str(status));
		return;
	}
	l->refused = false;
	hs_challenge_make(&ctx->self, &l->hello, 0, l->nonce_s, &c);
	hs_queue(l, &c, sizeof(c));
	hs_expect(l, sizeof(hs_proof));
	l->hs_phase = 1;
}

static void acc_proof(tp_link *l)
{
	tp_ctx *ctx = l->ctx;
	hs_proof p;
	hs_result r;
	kerr e;

	memcpy(&p, l->in, sizeof(p));
	int from = l->hello.from_rank;
	if (!hs_proof_check(&ctx->self, &l->hello, l->nonce_s, &p)) {
		l->refused = true;
		hs_result_make(HS_BAD_AUTH, 0, &r);
		send_best_effort(l->fd, &r, sizeof(r));
		acc_drop(l, "it claims rank %d of job '%s' but failed the job secret check (a "
		         "stranger, or its KHOR_SECRET differs)", from, l->hello.job_id);
		return;
	}
	if (ctx->incoming[from] != NULL) {
		l->refused = true;
		hs_result_make(HS_DUPLICATE, 0, &r);
		send_best_effort(l->fd, &r, sizeof(r));
		acc_drop(l, "rank %d already has an ib link to this rank", from);
		return;
	}
	l->peer = from;
	ctx->incoming[from] = l;
	hs_result_make(HS_OK, 0, &r);
	hs_queue(l, &r, sizeof(r));
	kerr_clear(&e);
	if (link_verbs(l, &e) != KHOR_SUCCESS) {
		link_fail(l, e.status, "%s", e.text);
		return;
	}
	send_qp_info(l);
}

static void conn_challenge(tp_link *l)
{
	hs_challenge c;
	hs_proof p;
	kerr e;

	memcpy(&c, l->in, sizeof(c));
	kerr_clear(&e);
	khor_status st = hs_challenge_check(&l->ctx->self, &l->hello, &c, 0, &p, &e);
	if (st != KHOR_SUCCESS) {
		send_best_effort(l->fd, &p, sizeof(p));
		link_fail(l, st, "%s", e.text);
		return;
	}
	hs_queue(l, &p, sizeof(p));
	hs_expect(l, sizeof(hs_result));
	l->hs_phase = 1;
}

static void conn_result(tp_link *l)
{
	hs_result r;
	kerr e;

	memcpy(&r, l->in, sizeof(r));
	kerr_clear(&e);
	khor_status st = hs_result_check(&r, &e);
	if (st != KHOR_SUCCESS) {
		link_fail(l, st, "%s", e.text);
		return;
	}
	send_qp_info(l);
}

/* A complete message of in_need bytes is in l->in. */
static void hs_step(tp_link *l)
{
	switch (l->state) {
	case LS_HS:
		if (l->acceptor)
			(l->hs_phase == 0 ? acc_hello : acc_proof)(l);
		else
			(l->hs_phase == 0 ? conn_challenge : conn_result)(l);
		return;
	case LS_QPINFO: {
		struct qp_info pi;
		memcpy(&pi, l->in, sizeof(pi));
		if (!link_connect_qps(l, &pi))
			return;
		struct ib_ready rd = { HS_MAGIC, 1 };
		hs_queue(l, &rd, sizeof(rd));
		hs_expect(l, sizeof(struct ib_ready));
		return;
	}
	case LS_READY_WAIT: {
		struct ib_ready rd;
		memcpy(&rd, l->in, sizeof(rd));
		if (rd.magic != HS_MAGIC || rd.ok != 1) {
			link_fail(l, KHOR_ERR_PROTOCOL, "the peer could not bring its queue pairs up");
			return;
		}
		l->state = LS_READY;
		hs_expect(l, sizeof(struct ib_abort)); /* all that may still come: a failure */
		KLOG_DEBUG("ib link to rank %d (%s) ready with %d QP(s)", l->peer, l->peer_addr,
		           l->nqp);
		link_push(l);
		return;
	}
	default:
		return;
	}
}

/* Moves bootstrap bytes and handshake steps; true if anything moved. */
static bool sock_drive(tp_link *l)
{
	bool moved = false;

	if (l->fd < 0 || l->state == LS_DEAD)
		return false;
	if (l->state == LS_CONNECTING) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (getpeername(l->fd, (struct sockaddr *)&ss, &sl) != 0) {
			int e = 0;
			socklen_t el = sizeof(e);
			getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &e, &el);
			if (e != 0 && e != EINPROGRESS)
				link_fail(l, KHOR_ERR_REMOTE, "connecting the bootstrap socket: %s", errstr(e));
			return e != 0;
		}
		l->state = LS_HS;
		moved = true;
	}
	for (bool step = true; step && l->state != LS_DEAD;) {
		step = false;
		while (l->out_off < l->out_len) {
			ssize_t n = send(l->fd, l->out + l->out_off, l->out_len - l->out_off,
			                 MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n < 0) {
				if (errno == EAGAIN || errno == EINTR)
					break;
				if (l->acceptor && l->peer < 0)
					acc_drop(l, "sending: %s", errstr(errno));
				else
					link_fail(l, KHOR_ERR_REMOTE, "bootstrap send: %s", errstr(errno));
				return true;
			}
			l->out_off += (uint32_t)n;
			moved = true;
		}
		if (l->in_need == 0)
			break;
		ssize_t n = recv(l->fd, l->in + l->in_got, l->in_need - l->in_got, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0) {
			const char *why = n == 0 ? "the peer closed the connection" : errstr(errno);
			if (l->acceptor && l->peer < 0)
				acc_drop(l, "during the handshake: %s", why);
			else if (l->state == LS_READY) {
				poll_link(l); /* what it sent before it went is already here */
				link_fail(l, KHOR_ERR_REMOTE, "the peer closed its bootstrap connection (%s): "
				          "it exited or was killed", why);
			} else
				link_fail(l, KHOR_ERR_REMOTE, "during the handshake: %s (is the peer of the "
				          "same job and khor version?)", why);
			return true;
		}
		l->in_got += (uint32_t)n;
		moved = step = true;
		if (l->state == LS_READY) {
			if (l->in_got < l->in_need)
				continue;
			struct ib_abort a;
			memcpy(&a, l->in, sizeof(a));
			a.text[sizeof(a.text) - 1] = '\0';
			l->peer_failed = true;
			poll_link(l);
			if (a.magic != HS_MAGIC)
				link_fail(l, KHOR_ERR_PROTOCOL, "unexpected bytes on the bootstrap connection");
			else
				link_fail(l, a.status >= 1 && a.status <= KHOR_ERR_INTERNAL
				                     ? (khor_status)a.status : KHOR_ERR_REMOTE,
				          "the peer failed the link: %s", a.text);
			return true;
		}
		if (l->in_got == l->in_need)
			hs_step(l);
	}
	return moved;
}

static void accept_new(tp_ctx *ctx)
{
	for (;;) {
		int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN)
				KLOG_WARN("ib bootstrap accept on %s: %s", ctx->addr, errstr(errno));
			return;
		}
		tp_link *l = calloc(1, sizeof(*l));
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET };
		if (l == NULL) {
			close(fd);
			continue;
		}
		l->ctx = ctx;
		l->fd = fd;
		l->peer = -1;
		l->acceptor = true;
		l->state = LS_HS;
		l->hs_deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
		ksockaddr a;
		a.len = sizeof(a.ss);
		if (getpeername(fd, (struct sockaddr *)&a.ss, &a.len) == 0)
			ksock_addr_str(&a, l->peer_addr, sizeof(l->peer_addr));
		hs_expect(l, sizeof(hs_hello));
		ev.data.ptr = l;
		if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			close(fd);
			free(l);
			continue;
		}
		l->next_all = ctx->all;
		ctx->all = l;
	}
}

/* ---- progress ------------------------------------------------------------------------ */

static void async_events(tp_ctx *ctx)
{
	struct ibv_async_event ev;

	while (ctx->api->get_async_event(ctx->dev, &ev) == 0) {
		enum ibv_event_type t = ev.event_type;
		const char *what = ctx->api->event_type_str(t);
		switch (t) {
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_DEVICE_FATAL:
			KLOG_ERR("ib device %s port %d: %s: every ib link of this rank fails",
			           ctx->dev_name, ctx->port, what);
			for (tp_link *l = ctx->all; l != NULL; l = l->next_all)
				link_fail(l, KHOR_ERR_REMOTE, "device %s port %d reported %s", ctx->dev_name,
				          ctx->port, what);
			break;
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_CQ_ERR: {
			KLOG_WARN("ib device %s: %s", ctx->dev_name, what);
			for (tp_link *l = ctx->all; l != NULL; l = l->next_all) {
				bool mine = t == IBV_EVENT_CQ_ERR ? ev.element.cq == l->cq : false;
				for (int q = 0; q < l->nqp && !mine; q++)
					mine = t != IBV_EVENT_CQ_ERR && ev.element.qp == l->qps[q].qp;
				if (mine)
					link_fail(l, KHOR_ERR_REMOTE, "device %s reported %s", ctx->dev_name, what);
			}
			break;
		}
		default:
			KLOG_INFO("ib device %s port %d: %s", ctx->dev_name, ctx->port, what);
			break;
		}
		ctx->api->ack_async_event(&ev);
	}
}

/* Drops handshakes that ran out of time and reaps refused connections. */
static void sweep(tp_ctx *ctx)
{
	tp_link **pp = &ctx->all;

	while (*pp != NULL) {
		tp_link *l = *pp;
		if (l->state != LS_READY && l->state != LS_DEAD && kdeadline_passed(l->hs_deadline)) {
			if (l->acceptor && l->peer < 0)
				acc_drop(l, "no complete handshake within %lld ms", (long long)ctx->hs_timeout_ms);
			else
				link_fail(l, KHOR_ERR_TIMEOUT, "the link's set-up did not finish within %lld "
				          "ms", (long long)ctx->hs_timeout_ms);
		}
		if (l->acceptor && l->peer < 0 && l->state == LS_DEAD) {
			*pp = l->next_all;
			if (l->fd >= 0)
				close(l->fd);
			free(l);
			continue;
		}
		pp = &l->next_all;
	}
}

static bool drive_all(tp_ctx *ctx)
{
	bool moved = false;

	for (tp_link *l = ctx->all; l != NULL; l = l->next_all) {
		if (l->state == LS_READY || l->state == LS_READY_WAIT)
			moved |= poll_link(l);
		else if (l->cq != NULL && l->state == LS_DEAD)
			poll_link(l); /* reap flushed work requests */
	}
	return moved;
}

static void drain_cq_events(tp_ctx *ctx)
{
	struct ibv_cq *cq;
	void *cctx;

	while (ctx->api->get_cq_event(ctx->ch, &cq, &cctx) == 0) {
		ctx->api->ack_cq_events(cq, 1);
		if (ibv_req_notify_cq(cq, 0) != 0)
			KLOG_WARN("ib: ibv_req_notify_cq failed");
	}
}

static khor_status ib_progress(tp_ctx *ctx, int timeout_ms, bool *moved_out, kerr *err)
{
	struct epoll_event evs[64];
	bool moved, sleeper = false;
	int n, e;

	if (timeout_ms == 0) {
		if (!kmutex_trylock_polite(&ctx->mu)) {
			if (moved_out != NULL)
				*moved_out = kseen_changed(ctx, atomic_load(&ctx->completions));
			return KHOR_SUCCESS;
		}
	} else {
		kmutex_lock(&ctx->mu);
	}
	moved = drive_all(ctx);
	moved |= kseen_changed(ctx, atomic_load(&ctx->completions));
	/*
	 * A spinning caller polls the completion queues only: the poll set (bootstrap sockets,
	 * new connections, device events) is looked at every 64th spin. Completions need no
	 * system call; an epoll_wait per spin doubled the 8-byte latency in the VM.
	 */
	if (timeout_ms == 0 && (++ctx->spins & 63) != 0) {
		if (moved && (ctx->sl.asleep || ctx->sl.waiting > 0))
			ksleeper_moved(&ctx->sl);
		kmutex_unlock(&ctx->mu);
		if (moved_out != NULL)
			*moved_out = moved;
		return KHOR_SUCCESS;
	}
	if (!moved && timeout_ms != 0) {
		if (!ksleeper_enter(&ctx->sl, &ctx->mu, timeout_ms)) {
			moved = drive_all(ctx);
			moved |= kseen_changed(ctx, atomic_load(&ctx->completions));
			kmutex_unlock(&ctx->mu);
			if (moved_out != NULL)
				*moved_out = moved;
			return KHOR_SUCCESS;
		}
		sleeper = true;
		/* Completions that came after the poll above but before the CQs were armed
		 * raised no event: look once more (the CQs stay armed from the last event). */
		moved = drive_all(ctx);
		kmutex_unlock(&ctx->mu);
	}
	n = epoll_wait(ctx->epfd, evs, 64, moved ? 0 : timeout_ms);
	e = errno;
	if (sleeper) {
		kmutex_lock(&ctx->mu);
		ksleeper_leave(&ctx->sl);
	}
	if (n < 0) {
		kmutex_unlock(&ctx->mu);
		if (moved_out != NULL)
			*moved_out = moved;
		if (e == EINTR)
			return KHOR_SUCCESS;
		return kerr_set(err, KHOR_ERR_SYSTEM, "epoll_wait: %s", errstr(e));
	}
	for (int i = 0; i < n; i++) {
		void *p = evs[i].data.ptr;
		if (p == NULL)
			accept_new(ctx);
		else if (p == (void *)&ctx->sl)
			continue;
		else if (p == (void *)ctx->ch)
			drain_cq_events(ctx);
		else if (p == (void *)ctx->dev)
			async_events(ctx);
		else
			moved |= sock_drive(p);
	}
	moved |= drive_all(ctx);
	sweep(ctx);
	if ((moved || n > 0) && (ctx->sl.asleep || ctx->sl.waiting > 0))
		ksleeper_moved(&ctx->sl);
	if (moved_out != NULL)
		*moved_out = moved || n > 0 || kseen_changed(ctx, atomic_load(&ctx->completions));
	kmutex_unlock(&ctx->mu);
	return KHOR_SUCCESS;
}

/* ---- ops ----------------------------------------------------------------------------- */

static khor_status ib_isend(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	kmutex_lock(&ctx->mu);
	if (l->err.status != KHOR_SUCCESS) {
		st = l->err.status;
		*err = l->err;
		goto out;
	}
	tp_req *r = req_new(l);
	if (r == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib send: out of memory");
		goto out;
	}
	r->is_send = true;
	r->buf = (uint8_t *)buf;
	r->len = len;
	r->tag = tag;
	if (len <= IB_EAGER_MAX) {
		if (l->sends_eager_tail != NULL)
			l->sends_eager_tail->next = r;
		else
			l->sends_eager = r;
		l->sends_eager_tail = r;
	} else {
		r->rdv = true;
		if ((st = req_keys(r, mr, 0, err)) != KHOR_SUCCESS) {
			req_release(r);
			goto out;
		}
		r->next = l->sends_rdv;
		l->sends_rdv = r;
		for (int i = 0; i < l->ncts_early; i++) {
			if (tag_is(&l->cts_early[i], tag)) {
				struct msg_hdr h = l->cts_early[i];
				l->cts_early[i] = l->cts_early[--l->ncts_early];
				rdv_start(l, r, &h);
				break;
			}
		}
	}
	*req_out = r;
	if (link_push(l) && (ctx->sl.asleep || ctx->sl.waiting > 0))
		ksleeper_moved(&ctx->sl);
out:
	kmutex_unlock(&ctx->mu);
	return st;
}

static khor_status ib_irecv(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	kmutex_lock(&ctx->mu);
	tp_req *r = req_new(l);
	if (r == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib receive: out of memory");
		goto out;
	}
	r->buf = buf;
	r->len = len;
	r->tag = tag;
	*req_out = r;
	/* A message that came early is delivered even when the link died since. */
	struct unexp *prev = NULL;
	for (struct unexp *u = l->uq; u != NULL; prev = u, u = u->next) {
		if (!tag_is(&u->hdr, tag))
			continue;
		if (prev == NULL)
			l->uq = u->next;
		else
			prev->next = u->next;
		if (l->uq_tail == u)
			l->uq_tail = prev;
		if (len > IB_EAGER_MAX) {
			r->rdv = true;
			check_match(l, r, &u->hdr, "message");
			req_finish(r, l->err.status ? l->err.status : KHOR_ERR_PROTOCOL);
		} else if (check_match(l, r, &u->hdr, "message")) {
			const uint8_t *data = u->held ? u->held->mem + IB_HDR_BYTES : u->data;
			if (len > 0)
				memcpy(buf, data, len);
			req_finish(r, KHOR_SUCCESS);
		} else {
			req_finish(r, l->err.status);
		}
		if (u->held != NULL) {
			if (live(l))
				post_recv_slot(l, u->held);
		} else {
			l->ubytes -= u->hdr.len;
			free(u->data);
		}
		free(u);
		goto pushed;
	}
	if (l->err.status != KHOR_SUCCESS) {
		req_finish(r, l->err.status);
		goto out;
	}
	if (len > IB_EAGER_MAX) {
		r->rdv = true;
		if ((st = req_keys(r, mr, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, err)) !=
		    KHOR_SUCCESS) {
			req_release(r);
			goto out;
		}
		/* A rendezvous id names this receive in the sender's immediates. */
		int idx = -1;
		for (int i = 0; i < IB_RDV_MAX; i++)
			if (l->rdv[i] == NULL) {
				idx = i;
				break;
			}
		if (idx < 0) {
			req_release(r);
			st = kerr_set(err, KHOR_ERR_INTERNAL, "ib link to peer rank %d: more than %d large "
			              "receives in flight", l->peer, IB_RDV_MAX);
			goto out;
		}
		l->rdv_gen++;
		r->rdv_id = (uint32_t)idx | (l->rdv_gen << 6);
		l->rdv[idx] = r;
		if (l->ctl_q_tail != NULL)
			l->ctl_q_tail->next = r;
		else
			l->ctl_q = r;
		l->ctl_q_tail = r;
	}
	/* Eager receives wait in recvs, in posting order; rendezvous ones are found through
	 * l->rdv (their ->next serves ctl_q until the CTS is out). */
	if (!r->rdv) {
		tp_req **pp = &l->recvs;
		while (*pp != NULL)
			pp = &(*pp)->next;
		*pp = r;
	}
pushed:
	if (link_push(l) && (ctx->sl.asleep || ctx->sl.waiting > 0))
		ksleeper_moved(&ctx->sl);
out:
	kmutex_unlock(&ctx->mu);
	return st;
}

static khor_status ib_test(tp_req *r, bool *done_out, kerr *err)
{
	tp_link *l = r->link;
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	kmutex_lock(&ctx->mu);
	if (!r->done && l->err.status != KHOR_SUCCESS)
		req_finish(r, l->err.status);
	*done_out = r->done;
	if (r->done) {
		st = r->st;
		if (st != KHOR_SUCCESS) {
			if (l->err.status != KHOR_SUCCESS)
				*err = l->err;
			else
				kerr_set(err, st, "ib link to peer rank %d (%s): request failed", l->peer,
				         l->peer_addr);
		}
		if (r->wr_out > 0)
			r->orphan = true; /* released when its writes are flushed */
		else
			req_release(r);
	}
	kmutex_unlock(&ctx->mu);
	return st;
}

static void ib_cancel(tp_req *r)
{
	tp_link *l = r->link;
	tp_ctx *ctx = l->ctx;

	kmutex_lock(&ctx->mu);
	if (!r->done) {
		bool quiet = false;
		if (!r->is_send && !r->rdv)
			quiet = list_remove(&l->recvs, NULL, r);
		else if (r->is_send && !r->rdv)
			quiet = list_remove(&l->sends_eager, &l->sends_eager_tail, r);
		else if (r->is_send && !r->active)
			quiet = list_remove(&l->sends_rdv, NULL, r);
		else if (!r->is_send && !r->cts_sent) {
			quiet = list_remove(&l->ctl_q, &l->ctl_q_tail, r);
			for (int i = 0; quiet && i < IB_RDV_MAX; i++)
				if (l->rdv[i] == r)
					l->rdv[i] = NULL;
		}
		/*
		 * The peer may be writing into it: stop the QPs. A cancel follows an error
		 * elsewhere, so the peer is told in the words runtime/comm_exec.c waits longer on for
		 * the job's root cause ("after an error on its side").
		 */
		if (!quiet)
			link_fail(l, KHOR_ERR_REMOTE, "the link was given up after an error on its side "
			          "(a transfer was abandoned mid-message)");
		req_finish(r, KHOR_ERR_REMOTE);
	}
	if (r->wr_out > 0)
		r->orphan = true;
	else
		req_release(r);
	kmutex_unlock(&ctx->mu);
}

static khor_status ib_flush(tp_link *l, void *buf, size_t len, tp_mr *mr, tp_req **req_out,
                            kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	*req_out = NULL;
	if (len == 0 || mr == NULL || (mr->kind != TP_MEM_CUDA && !ctx->flush_always))
		return KHOR_SUCCESS;
	kmutex_lock(&ctx->mu);
	if (ctx->fqp == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib on %s: no flush queue pair", ctx->dev_name);
		goto out;
	}
	tp_req *r = req_new(l);
	if (r == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib flush: out of memory");
		goto out;
	}
	r->flush = true;
	/* A 1-byte RDMA read of the buffer through the loopback QP: it completes only after
	 * every PCIe write before it has landed (NCCL's GPUDirect flush). */
	struct ibv_sge sge = { ctx->fbuf, 1, ctx->fmr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_ID(r, WR_FLUSH), .sg_list = &sge, .num_sge = 1,
	                          .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)buf;
	wr.wr.rdma.rkey = mr->mr->rkey;
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(ctx->fqp, &wr, &bad);
	if (rc != 0) {
		req_release(r);
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib flush on %s: ibv_post_send: %s", ctx->dev_name,
		              errstr(rc));
		goto out;
	}
	/* The flush QP's completions are polled here: it is rare and short. */
	struct ibv_wc wc;
	kdeadline dl = kdeadline_in_ms(ctx->hs_timeout_ms);
	int n;
	while ((n = ibv_poll_cq(ctx->fcq, 1, &wc)) == 0 && !kdeadline_passed(dl))
		;
	if (n <= 0 || wc.status != IBV_WC_SUCCESS) {
		req_release(r);
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib flush on %s: %s", ctx->dev_name,
		              n <= 0 ? "no completion within the deadline"
		                     : ctx->api->wc_status_str(wc.status));
		goto out;
	}
	req_finish(r, KHOR_SUCCESS);
	*req_out = r;
out:
	kmutex_unlock(&ctx->mu);
	return st;
}

static khor_status ib_link_error(tp_link *l, kerr *err_out)
{
	kmutex_lock(&l->ctx->mu);
	khor_status st = l->err.status;
	if (st != KHOR_SUCCESS && err_out != NULL)
		*err_out = l->err;
	kmutex_unlock(&l->ctx->mu);
	return st;
}

static bool ib_link_ready(const tp_link *l)
{
	kmutex_lock(&l->ctx->mu);
	bool ready = l->state == LS_READY && l->err.status == KHOR_SUCCESS;
	kmutex_unlock(&l->ctx->mu);
	return ready;
}

static void ib_describe(const tp_link *l, char *buf, size_t len)
{
	const tp_ctx *ctx = l->ctx;

	snprintf(buf, len, "%s port %d, GID %s (index %d, %s), %d QP(s), %u-byte writes, "
	         "peer %s", ctx->dev_name, ctx->port, ctx->gid_str, ctx->gid_index, ctx->gid_type,
	         l->nqp, l->max_wr_bytes, l->peer_addr);
}

static void ib_caps(const tp_ctx *ctx, tp_caps *out)
{
	out->needs_reg = true;
	out->reg_min = IB_EAGER_MAX;
	/* Maybe: the first device registration probes GPUDirect (reg_mr), and where it
	 * fails the collectives stage instead. */
	out->device_mem = !ctx->gdr_probed || ctx->gdr != IB_GDR_NONE;
	out->one_sided = true;
	out->needs_flush = true;
}

static const char *ib_address(const tp_ctx *ctx)
{
	return ctx->addr;
}

static khor_status ib_connect(tp_ctx *ctx, int peer, const char *peer_addr, tp_link **link_out,
                              kerr *err)
{
	char host[256];
	uint16_t port;
	ksockaddr a;
	khor_status st;

	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "ib connect: bad peer rank %d", peer);
	/* The blob is "ip:port device:port"; the bootstrap needs the first word. */
	char first[TP_ADDR_MAX];
	kstrlcpy(first, peer_addr, sizeof(first));
	first[strcspn(first, " ")] = '\0';
	if (!ksock_split_hostport(first, host, sizeof(host), &port))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "ib connect to rank %d: bad address '%s'",
		                peer, peer_addr);
	if ((st = ksock_resolve(host, port, &a, err)) != KHOR_SUCCESS)
		return st;
	kmutex_lock(&ctx->mu);
	if (ctx->outgoing[peer] != NULL) {
		*link_out = ctx->outgoing[peer];
		kmutex_unlock(&ctx->mu);
		return KHOR_SUCCESS;
	}
	tp_link *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		kmutex_unlock(&ctx->mu);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib connect: out of memory");
	}
	l->ctx = ctx;
	l->peer = peer;
	l->fd = -1;
	l->state = LS_CONNECTING;
	l->hs_deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
	kstrlcpy(l->peer_addr, peer_addr, sizeof(l->peer_addr));
	l->next_all = ctx->all;
	ctx->all = l;
	ctx->outgoing[peer] = l;
	*link_out = l;
	kerr e;
	kerr_clear(&e);
	if (link_verbs(l, &e) != KHOR_SUCCESS) {
		link_fail(l, e.status, "%s", e.text);
		goto done;
	}
	int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		link_fail(l, KHOR_ERR_SYSTEM, "socket: %s", errstr(errno));
		goto done;
	}
	ksock_tune_stream(fd, 0);
	if (connect(fd, (struct sockaddr *)&a.ss, a.len) < 0 && errno != EINPROGRESS) {
		link_fail(l, KHOR_ERR_REMOTE, "connect: %s", errstr(errno));
		close(fd);
		goto done;
	}
	l->fd = fd;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
	                          .data.ptr = l };
	if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		link_fail(l, KHOR_ERR_SYSTEM, "epoll_ctl: %s", errstr(errno));
		goto done;
	}
	hs_hello_make(&ctx->self, peer, (const uint64_t[4]){ 0, 0, 0, 0 }, &l->hello);
	hs_queue(l, &l->hello, sizeof(l->hello));
	hs_expect(l, sizeof(hs_challenge));
	sock_drive(l);
done:
	kmutex_unlock(&ctx->mu);
	return KHOR_SUCCESS;
}

static khor_status ib_accept(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err)
{
	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "ib accept: bad peer rank %d", peer);
	kmutex_lock(&ctx->mu);
	tp_link *l = ctx->incoming[peer];
	if (l != NULL && (l->state == LS_READY || l->state == LS_DEAD)) {
		l->claimed = true;
		*link_out = l;
	} else {
		*link_out = NULL;
	}
	kmutex_unlock(&ctx->mu);
	return KHOR_SUCCESS;
}

static void ib_wake(tp_ctx *ctx)
{
	kmutex_lock(&ctx->mu);
	atomic_fetch_add_explicit(&ctx->completions, 1, memory_order_relaxed);
	ksleeper_moved(&ctx->sl);
	kmutex_unlock(&ctx->mu);
}

/* ---- create and destroy -------------------------------------------------------------- */

static void link_free(tp_ctx *ctx, tp_link *l)
{
	const struct ib_api *api = ctx->api;

	/* What we sent must leave before the QPs go: a send counts as done once copied. */
	if (l->state == LS_READY) {
		kdeadline dl = kdeadline_in_ms(2000);
		for (;;) {
			int out = 0;
			for (int q = 0; q < l->nqp; q++)
				out += l->qps[q].sq_out;
			if (out == 0 || l->state != LS_READY || kdeadline_passed(dl))
				break;
			poll_link(l);
		}
	}
	if (l->fd >= 0)
		close(l->fd);
	for (int q = 0; q < IB_MAX_QPS; q++)
		if (l->qps[q].qp != NULL)
			api->destroy_qp(l->qps[q].qp);
	if (l->cq != NULL)
		api->destroy_cq(l->cq);
	if (l->mem_mr != NULL)
		api->dereg_mr(l->mem_mr);
	free(l->mem);
	for (struct unexp *u = l->uq, *n; u != NULL; u = n) {
		n = u->next;
		free(u->data);
		free(u);
	}
	free(l->cts_early);
	free(l);
}

static void ib_destroy(tp_ctx *ctx)
{
	const struct ib_api *api = ctx->api;

	for (tp_link *l = ctx->all, *n; l != NULL; l = n) {
		n = l->next_all;
		link_free(ctx, l);
	}
	while (ctx->free_reqs != NULL) {
		tp_req *r = ctx->free_reqs;
		ctx->free_reqs = r->next;
		free(r);
	}
	if (ctx->fqp != NULL)
		api->destroy_qp(ctx->fqp);
	if (ctx->fcq != NULL)
		api->destroy_cq(ctx->fcq);
	if (ctx->fmr != NULL)
		api->dereg_mr(ctx->fmr);
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	if (ctx->epfd >= 0)
		close(ctx->epfd);
	if (ctx->sl.wake_fd >= 0)
		ksleeper_destroy(&ctx->sl);
	if (ctx->ch != NULL)
		api->destroy_comp_channel(ctx->ch);
	if (ctx->pd != NULL)
		api->dealloc_pd(ctx->pd);
	if (ctx->dev != NULL)
		api->close_device(ctx->dev);
	pthread_mutex_destroy(&ctx->mu.m);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx->secret);
	free(ctx);
}

/* Does device name (and port) pass KHOR_IB_HCA? port_out = the spec's port or 0 (any). */
static bool hca_match(const char *spec, const char *name, int *port_out)
{
	bool exclude = false, exact = false;

	*port_out = 0;
	if (spec == NULL || *spec == '\0')
		return true;
	if (*spec == '^') {
		exclude = true;
		spec++;
	}
	if (*spec == '=') {
		exact = true;
		spec++;
	}
	char list[256];
	kstrlcpy(list, spec, sizeof(list));
	bool hit = false;
	for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL;
	     tok = strtok_r(NULL, ",", &save)) {
		int port = 0;
		char *colon = strchr(tok, ':');
		if (colon != NULL) {
			port = atoi(colon + 1);
			*colon = '\0';
		}
		bool m = exact ? strcmp(name, tok) == 0 : strncmp(name, tok, strlen(tok)) == 0;
		if (m) {
			hit = true;
			*port_out = port;
			break;
		}
	}
	if (exclude) {
		*port_out = 0;
		return !hit;
	}
	return hit;
}

static bool read_sysfs(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	if (f == NULL)
		return false;
	bool ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok;
}

/*
 * The GID to use on a RoCE port: the RoCE v2 entry of interface ifname whose address is
 * ip4 (when given), else any RoCE v2 entry of that interface, else any IPv4-mapped RoCE v2
 * entry, else index 0.
 */
static int pick_gid(tp_ctx *ctx, int tbl_len, const char *ifname, const uint8_t *ip4,
                    const char **type_out)
{
	char path[256], buf[64];
	int best = -1, score = -1;

	for (int i = 0; i < tbl_len; i++) {
		union ibv_gid g;
		if (ctx->api->query_gid(ctx->dev, (uint8_t)ctx->port, i, &g) != 0)
			continue;
		static const uint8_t zero[16];
		if (memcmp(g.raw, zero, 16) == 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
		         ctx->dev_name, ctx->port, i);
		bool v2 = read_sysfs(path, buf, sizeof(buf)) && strstr(buf, "v2") != NULL;
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d",
		         ctx->dev_name, ctx->port, i);
		bool on_if = ifname != NULL && read_sysfs(path, buf, sizeof(buf)) &&
		             strcmp(buf, ifname) == 0;
		static const uint8_t v4pre[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
		bool mapped = memcmp(g.raw, v4pre, 12) == 0;
		bool same_ip = mapped && ip4 != NULL && memcmp(g.raw + 12, ip4, 4) == 0;
		int s = (v2 ? 8 : 0) + (on_if ? 4 : 0) + (same_ip ? 2 : 0) + (mapped ? 1 : 0);
		if (s > score) {
			score = s;
			best = i;
			*type_out = v2 ? "RoCE v2" : "RoCE v1";
		}
	}
	return best < 0 ? 0 : best;
}

static khor_status flush_qp_create(tp_ctx *ctx, kerr *err)
{
	const struct ib_api *api = ctx->api;

	ctx->fcq = api->create_cq(ctx->dev, 4, NULL, NULL, 0);
	if (ctx->fcq == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_cq(flush): %s", errstr(errno));
	struct ibv_qp_init_attr ia = { .send_cq = ctx->fcq, .recv_cq = ctx->fcq,
	                               .qp_type = IBV_QPT_RC,
	                               .cap = { .max_send_wr = 4, .max_recv_wr = 1,
	                                        .max_send_sge = 1, .max_recv_sge = 1 } };
	ctx->fqp = api->create_qp(ctx->pd, &ia);
	if (ctx->fqp == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_qp(flush): %s", errstr(errno));
	khor_status st = reg_host(ctx, &ctx->fbuf, sizeof(ctx->fbuf), IBV_ACCESS_LOCAL_WRITE,
	                          "the flush word", &ctx->fmr, err);
	if (st != KHOR_SUCCESS)
		return st;
	ctx->fbuf = (uint64_t)(uintptr_t)&ctx->fbuf;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = (uint8_t)ctx->port,
	                         .qp_access_flags = IBV_ACCESS_REMOTE_READ };
	if (api->modify_qp(ctx->fqp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
	                   IBV_QP_ACCESS_FLAGS) != 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP INIT: %s", errstr(errno));
	struct ibv_qp_attr b = { .qp_state = IBV_QPS_RTR, .path_mtu = ctx->mtu,
	                         .dest_qp_num = ctx->fqp->qp_num, .rq_psn = 0,
	                         .max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
	b.ah_attr.port_num = (uint8_t)ctx->port;
	b.ah_attr.dlid = ctx->lid;
	if (ctx->link_layer == IBV_LINK_LAYER_ETHERNET || ctx->gid_index > 0) {
		b.ah_attr.is_global = 1;
		b.ah_attr.grh.dgid = ctx->gid;
		b.ah_attr.grh.sgid_index = (uint8_t)ctx->gid_index;
		b.ah_attr.grh.hop_limit = 64;
	}
	if (api->modify_qp(ctx->fqp, &b, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
	                   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	                   IBV_QP_MIN_RNR_TIMER) != 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP RTR: %s", errstr(errno));
	struct ibv_qp_attr c = { .qp_state = IBV_QPS_RTS, .timeout = (uint8_t)ctx->timeout,
	                         .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	if (api->modify_qp(ctx->fqp, &c, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
	                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP RTS: %s", errstr(errno));
	return KHOR_SUCCESS;
}

/* Opens the first device and active port KHOR_IB_HCA allows. */
static khor_status open_device(tp_ctx *ctx, kerr *err)
{
	const struct ib_api *api = ctx->api;
	const char *spec = ctx->hca[0] ? ctx->hca : NULL;
	int n = 0;
	struct ibv_device **list = api->get_device_list(&n);
	char seen[512] = "";
	size_t used = 0;

	if (list == NULL || n == 0) {
		if (list != NULL)
			api->free_device_list(list);
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "no RDMA device (ibv_get_device_list "
		                "found none%s)", list == NULL ? ": the kernel has no RDMA support" : "");
	}
	for (int i = 0; i < n && ctx->dev == NULL; i++) {
		const char *name = api->get_device_name(list[i]);
		int want_port;
		bool ok = hca_match(spec, name, &want_port);
		struct ibv_context *dev = ok ? api->open_device(list[i]) : NULL;
		struct ibv_device_attr da;
		if (dev == NULL || api->query_device(dev, &da) != 0) {
			used += (size_t)snprintf(seen + used, used < sizeof(seen) ? sizeof(seen) - used : 0,
			                         "%s%s (%s)", used ? ", " : "", name,
			                         ok ? "cannot open" : "not in KHOR_IB_HCA");
			if (dev != NULL)
				api->close_device(dev);
			continue;
		}
		for (int p = 1; p <= da.phys_port_cnt; p++) {
			struct ibv_port_attr pa;
			memset(&pa, 0, sizeof(pa));
			if (want_port > 0 && p != want_port)
				continue;
			if (api->query_port(dev, (uint8_t)p, (struct _compat_ibv_port_attr *)&pa) != 0)
				continue;
			if (pa.state != IBV_PORT_ACTIVE) {
				used += (size_t)snprintf(seen + used,
				                         used < sizeof(seen) ? sizeof(seen) - used : 0,
				                         "%s%s port %d (%s)", used ? ", " : "", name, p,
				                         api->port_state_str(pa.state));
				continue;
			}
			ctx->dev = dev;
			ctx->port = p;
			kstrlcpy(ctx->dev_name, name, sizeof(ctx->dev_name));
			ctx->lid = pa.lid;
			ctx->mtu = pa.active_mtu;
			ctx->link_layer = pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED
			                          ? IBV_LINK_LAYER_INFINIBAND : pa.link_layer;
			ctx->max_msg = pa.max_msg_sz > (1u << 30) || pa.max_msg_sz == 0 ? 1u << 30
			                                                                : pa.max_msg_sz;
			ctx->gid_index = pa.gid_tbl_len; /* the table's length, for pick_gid */
			break;
		}
		if (ctx->dev == NULL)
			api->close_device(dev);
	}
	api->free_device_list(list);
	if (ctx->dev == NULL)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "no active RDMA port%s%s (devices: %s)",
		                spec ? " in KHOR_IB_HCA=" : "", spec ? spec : "", seen);
	return KHOR_SUCCESS;
}

static khor_status ib_create(const tp_options *opt, tp_ctx **ctx_out, kerr *err)
{
	const char *why = NULL;
	const struct ib_api *api = ib_api_get(&why);
	khor_status st;
	char ifname[64] = "";

	if (api == NULL)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "libibverbs is not available: %s", why);
	tp_ctx *ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib transport: out of memory");
	ctx->api = api;
	ctx->rank = opt->rank;
	ctx->size = opt->size;
	ctx->meta = opt->meta;
	ctx->listen_fd = ctx->epfd = -1;
	ctx->sl.wake_fd = -1;
	ctx->hs_timeout_ms = opt->handshake_timeout_ms > 0 ? opt->handshake_timeout_ms : 30000;
	ctx->secret = strdup(opt->secret ? opt->secret : "");
	ctx->self = (hs_self){ .transport = HS_TP_IB, .version = IB_PROTO, .rank = opt->rank,
	                       .size = opt->size, .name = "ib", .secret = ctx->secret,
	                       .secret_len = ctx->secret ? strlen(ctx->secret) : 0 };
	kstrlcpy(ctx->self.job_id, opt->job_id, sizeof(ctx->self.job_id));
	bool given = opt->ib_qps > 0;
	ctx->nqp = given ? (opt->ib_qps < IB_MAX_QPS ? opt->ib_qps : IB_MAX_QPS) : 2;
	ctx->timeout = given ? opt->ib_timeout : 14;
	ctx->retry_cnt = given ? opt->ib_retry_cnt : 7;
	ctx->max_wr = given ? opt->ib_max_wr : 0;
	ctx->flush_always = given && opt->ib_flush_always;
	ctx->gid_forced = given ? opt->ib_gid_index : -1;
	if (given && opt->ib_hca != NULL && opt->ib_hca[0] != '\0')
		kstrlcpy(ctx->hca, opt->ib_hca, sizeof(ctx->hca));
	kmutex_init(&ctx->mu);
	ctx->incoming = calloc((size_t)opt->size, sizeof(tp_link *));
	ctx->outgoing = calloc((size_t)opt->size, sizeof(tp_link *));
	if (ctx->secret == NULL || ctx->incoming == NULL || ctx->outgoing == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib transport: out of memory");
		goto fail;
	}
	if ((st = open_device(ctx, err)) != KHOR_SUCCESS)
		goto fail;
	/* The bootstrap address: the interface KHOR_SOCKET_IFNAME (or the store's route) picks. */
	ksockaddr local;
	st = ksock_pick_address(opt->ifname_spec, (const ksockaddr *)opt->hint_addr, &local, ifname,
	                        sizeof(ifname), err);
	if (st != KHOR_SUCCESS)
		goto fail;
	int tbl_len = ctx->gid_index;
	ctx->gid_type = ctx->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB";
	int forced = ctx->gid_forced;
	if (forced >= 0) {
		ctx->gid_index = forced;
		if (ctx->link_layer == IBV_LINK_LAYER_ETHERNET) {
			char path[256], buf[64];
			snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
			         ctx->dev_name, ctx->port, forced);
			ctx->gid_type = read_sysfs(path, buf, sizeof(buf)) && strstr(buf, "v2")
			                        ? "RoCE v2" : "RoCE v1";
		}
	} else if (ctx->link_layer == IBV_LINK_LAYER_ETHERNET) {
		const uint8_t *ip4 = NULL;
		if (local.ss.ss_family == AF_INET)
			ip4 = (const uint8_t *)&((struct sockaddr_in *)&local.ss)->sin_addr;
		ctx->gid_index = pick_gid(ctx, tbl_len, ifname, ip4, &ctx->gid_type);
	} else {
		ctx->gid_index = 0;
	}
	if (api->query_gid(ctx->dev, (uint8_t)ctx->port, ctx->gid_index, &ctx->gid) != 0) {
		st = kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s port %d has no GID at index %d "
		              "(KHOR_IB_GID_INDEX)", ctx->dev_name, ctx->port, ctx->gid_index);
		goto fail;
	}
	inet_ntop(AF_INET6, ctx->gid.raw, ctx->gid_str, sizeof(ctx->gid_str));
	if ((ctx->pd = api->alloc_pd(ctx->dev)) == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ibv_alloc_pd on %s: %s", ctx->dev_name,
		              errstr(errno));
		goto fail;
	}
	if ((ctx->ch = api->create_comp_channel(ctx->dev)) == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_comp_channel on %s: %s", ctx->dev_name,
		              errstr(errno));
		goto fail;
	}
	kerr fe;
	kerr_clear(&fe);
	if (flush_qp_create(ctx, &fe) != KHOR_SUCCESS) {
		KLOG_INFO("ib on %s: no loopback queue pair for GPUDirect flushes (%s); device "
		          "buffers will be staged", ctx->dev_name, fe.text);
		if (ctx->fqp != NULL)
			api->destroy_qp(ctx->fqp);
		if (ctx->fcq != NULL)
			api->destroy_cq(ctx->fcq);
		if (ctx->fmr != NULL)
			api->dereg_mr(ctx->fmr);
		ctx->fqp = NULL;
		ctx->fcq = NULL;
		ctx->fmr = NULL;
	}
	/*
	 * GPUDirect is probed at the first registration of device memory, not here: the probe
	 * starts the CUDA driver (cuInit), which a job on host memory must not pay for, and
	 * after which CUDA would not work in children forked later.
	 */
	ctx->gdr = IB_GDR_NONE;
	ctx->gdr_probed = ctx->fqp == NULL;
	if (ctx->fqp == NULL)
		snprintf(ctx->gdr_why, sizeof(ctx->gdr_why), "no loopback queue pair for flushes");
	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ctx->epfd < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_create1: %s", errstr(errno));
		goto fail;
	}
	ksock_addr_set_port(&local, 0);
	if ((st = ksock_listen(&local, 1024, &ctx->listen_fd, err)) != KHOR_SUCCESS) {
		kerr_prefix(err, "ib bootstrap on interface %s", ifname);
		goto fail;
	}
	if ((st = ksleeper_init(&ctx->sl, err)) != KHOR_SUCCESS)
		goto fail;
	int fds[4] = { ctx->listen_fd, ctx->sl.wake_fd, ctx->ch->fd, ctx->dev->async_fd };
	void *tags[4] = { NULL, &ctx->sl, ctx->ch, ctx->dev };
	for (int i = 0; i < 4; i++) {
		if (i >= 2)
			fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tags[i] };
		if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fds[i], &ev) < 0) {
			st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_ctl: %s", errstr(errno));
			goto fail;
		}
	}
	char as[64];
	snprintf(ctx->addr, sizeof(ctx->addr), "%s %s:%d", ksock_addr_str(&local, as, sizeof(as)),
	         ctx->dev_name, ctx->port);
	KLOG_INFO("ib transport on %s port %d: GID %s (index %d, %s), MTU %d, max message %u "
	          "bytes, %d QP(s) per link; bootstrap on %s (interface %s)", ctx->dev_name,
	          ctx->port, ctx->gid_str, ctx->gid_index, ctx->gid_type, 128 << ctx->mtu,
	          ctx->max_msg, ctx->nqp, as, ifname);
	*ctx_out = ctx;
	return KHOR_SUCCESS;

fail:
	ib_destroy(ctx);
	return st;
}

const struct transport_ops ib_transport_ops = {
	.name = "ib",
	.version = TP_VERSION,
	.create = ib_create,
	.address = ib_address,
	.caps = ib_caps,
	.connect = ib_connect,
	.accept = ib_accept,
	.link_ready = ib_link_ready,
	.describe = ib_describe,
	.reg_mr = ib_reg_mr,
	.dereg_mr = ib_dereg_mr,
	.mr_key = ib_mr_key,
	.isend = ib_isend,
	.irecv = ib_irecv,
	.flush = ib_flush,
	.test = ib_test,
	.progress = ib_progress,
	.cancel = ib_cancel,
	.link_error = ib_link_error,
	.wake = ib_wake,
	.destroy = ib_destroy,
};
