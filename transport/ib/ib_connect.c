/*
 * ib_connect.c -- how an ib link comes up: the TCP bootstrap socket, the shared handshake
 * of handshake.h over it, then the exchange of QP numbers, PSNs, GIDs and credit words,
 * and the QPs' way through INIT, RTR and RTS (ib.c's top comment says why the bootstrap
 * and not rdma_cm). The socket stays open after READY to carry a failure's reason and to
 * tell at once that the peer exited.
 */
#include "ib_int.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

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
		                ctx->dev_name, ib_errstr(errno));
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
			                ib_errstr(errno));
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
			                ctx->dev_name, ib_errstr(errno));
	}
	l->mem_len = (size_t)(IB_SLOTS + IB_SEND_SLOTS) * IB_SLOT_BYTES + 4096;
	if (posix_memalign((void **)&l->mem, 4096, l->mem_len) != 0) {
		l->mem = NULL;
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib link: out of memory for %zu bytes of "
		                "message slots", l->mem_len);
	}
	memset(l->mem, 0, l->mem_len);
	khor_status st =
	    ib_reg_host(ctx, l->mem, l->mem_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
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
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "the peer's queue-pair information is malformed");
		return false;
	}
	if (pi->link_layer != ctx->link_layer) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "the peer's port is %s and ours %s: they cannot "
		             "reach each other",
		             pi->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB",
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
			ib_link_fail(l, KHOR_ERR_SYSTEM,
			             "ibv_modify_qp(RTR) of QP %d on %s (GID index %d): %s", q,
			             ctx->dev_name, ctx->gid_index, ib_errstr(errno));
			return false;
		}
		struct ibv_qp_attr b = {
			.qp_state = IBV_QPS_RTS, .timeout = (uint8_t)ctx->timeout,
			.retry_cnt = (uint8_t)ctx->retry_cnt, .rnr_retry = 7, .sq_psn = Q->psn,
			.max_rd_atomic = 1,
		};
		if (api->modify_qp(Q->qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
			ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_modify_qp(RTS) of QP %d on %s: %s", q,
			             ctx->dev_name, ib_errstr(errno));
			return false;
		}
		Q->peer_posted = pi->posted[q];
	}
	l->state = LS_READY; /* for the posts below; READY_WAIT until the peer's READY */
	for (int i = 0; i < IB_SLOTS; i++)
		if (!ib_post_recv_slot(l, &l->rslots[i]))
			return false;
	for (int q = 1; q < l->nqp; q++)
		for (int i = 0; i < IB_IMM_WQES; i++)
			if (!ib_post_recv_imm(&l->qps[q]))
				return false;
	for (int q = 0; q < l->nqp; q++)
		l->qps[q].rx_told = l->qps[q].rx_posted;
	l->state = LS_READY_WAIT;
	if (ibv_req_notify_cq(l->cq, 0) != 0) {
		ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_req_notify_cq failed");
		return false;
	}
	return true;
}

/* ---- the bootstrap socket ------------------------------------------------------------ */

static void hs_queue(tp_link *l, const void *p, uint32_t n)
{
	if (l->out_len - l->out_off + n > sizeof(l->out)) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL, "handshake output overflow");
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

/* A zeroed link with its lists empty, on no list of the instance yet. */
static tp_link *link_alloc(void)
{
	tp_link *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return NULL;
	klist_init(&l->recvs);
	klist_init(&l->sends_eager);
	klist_init(&l->sends_rdv);
	klist_init(&l->ctl_q);
	klist_init(&l->uq);
	klist_init(&l->node_all);
	return l;
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
		ib_link_fail(l, e.status, "%s", e.text);
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
		ib_link_fail(l, st, "%s", e.text);
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
		ib_link_fail(l, st, "%s", e.text);
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
			ib_link_fail(l, KHOR_ERR_PROTOCOL,
			             "the peer could not bring its queue pairs up");
			return;
		}
		l->state = LS_READY;
		hs_expect(l, sizeof(struct ib_abort)); /* all that may still come: a failure */
		KLOG_DEBUG("ib link to rank %d (%s) ready with %d QP(s)", l->peer, l->peer_addr,
		           l->nqp);
		ib_link_push(l);
		return;
	}
	default:
		return;
	}
}

/* Moves bootstrap bytes and handshake steps; true if anything moved. */
bool ib_conn_drive(tp_link *l)
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
				ib_link_fail(l, KHOR_ERR_REMOTE,
				             "connecting the bootstrap socket: %s", ib_errstr(e));
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
					acc_drop(l, "sending: %s", ib_errstr(errno));
				else
					ib_link_fail(l, KHOR_ERR_REMOTE, "bootstrap send: %s",
					             ib_errstr(errno));
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
			const char *why =
			    n == 0 ? "the peer closed the connection" : ib_errstr(errno);
			if (l->acceptor && l->peer < 0)
				acc_drop(l, "during the handshake: %s", why);
			else if (l->state == LS_READY) {
				ib_poll_link(l); /* what it sent before it went is already here */
				ib_link_fail(l, KHOR_ERR_REMOTE,
				             "the peer closed its bootstrap connection (%s): "
				             "it exited or was killed",
				             why);
			} else
				ib_link_fail(l, KHOR_ERR_REMOTE,
				             "during the handshake: %s (is the peer of the "
				             "same job and khor version?)",
				             why);
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
			ib_poll_link(l);
			if (a.magic != HS_MAGIC)
				ib_link_fail(l, KHOR_ERR_PROTOCOL,
				             "unexpected bytes on the bootstrap connection");
			else
				ib_link_fail(l,
				             a.status >= 1 && a.status <= KHOR_ERR_INTERNAL
				                 ? (khor_status)a.status
				                 : KHOR_ERR_REMOTE,
				             "the peer failed the link: %s", a.text);
			return true;
		}
		if (l->in_got == l->in_need)
			hs_step(l);
	}
	return moved;
}

void ib_conn_accept(tp_ctx *ctx)
{
	for (;;) {
		int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN)
				KLOG_WARN("ib bootstrap accept on %s: %s", ctx->addr,
				          ib_errstr(errno));
			return;
		}
		tp_link *l = link_alloc();
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
		klist_add_head(&ctx->all, &l->node_all);
	}
}

/* Drops handshakes that ran out of time and reaps refused connections. */
void ib_conn_sweep(tp_ctx *ctx)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->all) {
		tp_link *l = IB_LINK(n);
		if (l->state != LS_READY && l->state != LS_DEAD && kdeadline_passed(l->hs_deadline)) {
			if (l->acceptor && l->peer < 0)
				acc_drop(l, "no complete handshake within %lld ms", (long long)ctx->hs_timeout_ms);
			else
				ib_link_fail(l, KHOR_ERR_TIMEOUT,
				             "the link's set-up did not finish within %lld ms",
				             (long long)ctx->hs_timeout_ms);
		}
		if (l->acceptor && l->peer < 0 && l->state == LS_DEAD) {
			klist_del(&l->node_all);
			if (l->fd >= 0)
				close(l->fd);
			free(l);
		}
	}
}

khor_status ib_connect_locked(tp_ctx *ctx, int peer, const char *peer_addr, tp_link **link_out,
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
		return st; /* a number: resolving it never waits for a name server */
	if (ctx->outgoing[peer] != NULL) {
		*link_out = ctx->outgoing[peer];
		return KHOR_SUCCESS;
	}
	tp_link *l = link_alloc();
	if (l == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "ib connect: out of memory");
	l->ctx = ctx;
	l->peer = peer;
	l->fd = -1;
	l->state = LS_CONNECTING;
	l->hs_deadline = kdeadline_in_ms(ctx->hs_timeout_ms);
	kstrlcpy(l->peer_addr, peer_addr, sizeof(l->peer_addr));
	klist_add_head(&ctx->all, &l->node_all);
	ctx->outgoing[peer] = l;
	*link_out = l;
	kerr e;
	kerr_clear(&e);
	if (link_verbs(l, &e) != KHOR_SUCCESS) {
		ib_link_fail(l, e.status, "%s", e.text);
		goto done;
	}
	int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		ib_link_fail(l, KHOR_ERR_SYSTEM, "socket: %s", ib_errstr(errno));
		goto done;
	}
	ksock_tune_stream(fd, 0);
	if (connect(fd, (struct sockaddr *)&a.ss, a.len) < 0 && errno != EINPROGRESS) {
		ib_link_fail(l, KHOR_ERR_REMOTE, "connect: %s", ib_errstr(errno));
		close(fd);
		goto done;
	}
	l->fd = fd;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
	                          .data.ptr = l };
	if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		ib_link_fail(l, KHOR_ERR_SYSTEM, "epoll_ctl: %s", ib_errstr(errno));
		goto done;
	}
	hs_hello_make(&ctx->self, peer, (const uint64_t[4]){ 0, 0, 0, 0 }, &l->hello);
	hs_queue(l, &l->hello, sizeof(l->hello));
	hs_expect(l, sizeof(hs_challenge));
	ib_conn_drive(l);
done:
	return KHOR_SUCCESS;
}
