/*
 * ib.c -- the verbs transport: reliable-connected queue pairs on an InfiniBand or RoCE HCA
 * (soft-RoCE included), behind the ops table of transport.h. This file holds the ops
 * table, progress, create and destroy; the phases have their own files, listed in
 * ib_int.h.
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
 * Threads: every op takes the instance's lock (the skeleton's, transport/skel.h);
 * progress() lets go of it while it sleeps, and only one thread sleeps at a time
 * (base/sleeper.h), as in tcp.c.
 */
#include "ib.h"
#include "ib_int.h"

#include "base/log.h"
#include "base/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- progress ------------------------------------------------------------------------ */

static bool drive_all(tp_ctx *ctx)
{
	bool moved = false;

	IB_FOR_EACH_LINK(l, ctx) {
		if (l->state == LS_READY || l->state == LS_READY_WAIT)
			moved |= ib_poll_link(l);
		else if (l->cq != NULL && l->state == LS_DEAD)
			ib_poll_link(l); /* reap flushed work requests */
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
	tp_skel *sk = &ctx->sk;
	struct epoll_event evs[64];
	bool moved, sleeper = false;
	int n, e;

	if (!tp_skel_progress_begin(sk, timeout_ms, moved_out))
		return KHOR_SUCCESS;
	moved = drive_all(ctx);
	moved |= tp_skel_seen(sk);
	/*
	 * A spinning caller polls the completion queues only: the poll set (bootstrap sockets,
	 * new connections, device events) is looked at every 64th spin. Completions need no
	 * system call; an epoll_wait per spin doubled the 8-byte latency in the VM.
	 */
	if (timeout_ms == 0 && (++ctx->spins & 63) != 0) {
		if (moved)
			tp_skel_moved(sk);
		kmutex_unlock(&sk->mu);
		if (moved_out != NULL)
			*moved_out = moved;
		return KHOR_SUCCESS;
	}
	if (!moved && timeout_ms != 0) {
		if (!tp_skel_sleep_begin(sk, timeout_ms)) {
			/* Another thread slept in the kernel for both of us and has returned. */
			moved = drive_all(ctx);
			tp_skel_progress_end(sk, false, moved_out);
			if (moved_out != NULL)
				*moved_out |= moved;
			return KHOR_SUCCESS;
		}
		sleeper = true;
		/* Completions that came after the poll above but before the CQs were armed
		 * raised no event: look once more (the CQs stay armed from the last event); and
		 * a wake since our last look means no sleep either. */
		moved = drive_all(ctx);
		moved |= tp_skel_seen(sk);
		kmutex_unlock(&sk->mu);
	}
	n = epoll_wait(ctx->epfd, evs, 64, moved ? 0 : timeout_ms);
	e = errno;
	if (sleeper) {
		bool woke = false;
		for (int i = 0; i < n; i++)
			woke |= evs[i].data.ptr == (void *)&sk->sl;
		kmutex_lock(&sk->mu);
		tp_skel_sleep_end(sk, woke);
	}
	if (n < 0) {
		kmutex_unlock(&sk->mu);
		if (moved_out != NULL)
			*moved_out = moved;
		if (e == EINTR)
			return KHOR_SUCCESS;
		return kerr_set(err, KHOR_ERR_SYSTEM, "epoll_wait: %s", ib_errstr(e));
	}
	for (int i = 0; i < n; i++) {
		void *p = evs[i].data.ptr;
		/* A wake-up is nobody's progress: the sleeper drained it, a spinner leaves it
		 * (tp_skel_sleep_end). Every other event may have moved something. */
		if (p == (void *)&sk->sl)
			continue;
		moved = true;
		if (p == NULL)
			ib_conn_accept(ctx);
		else if (p == (void *)ctx->ch)
			drain_cq_events(ctx);
		else if (p == (void *)ctx->dev)
			ib_dev_events(ctx);
		else
			ib_conn_drive(p);
	}
	moved |= drive_all(ctx);
	ib_conn_sweep(ctx);
	tp_skel_progress_end(sk, moved, moved_out);
	return KHOR_SUCCESS;
}

/* ---- ops ----------------------------------------------------------------------------- */

static khor_status ib_test_locked(tp_req *r, bool *done_out, kerr *err)
{
	tp_link *l = r->link;
	khor_status st = KHOR_SUCCESS;

	if (!r->done && l->err.status != KHOR_SUCCESS)
		ib_req_finish(r, l->err.status);
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
			ib_req_release(r);
	}
	return st;
}

static void ib_cancel_locked(tp_req *r)
{
	tp_link *l = r->link;

	if (!r->done) {
		bool quiet = false;
		/* Not started yet: still on recvs, sends_eager, sends_rdv or ctl_q. */
		if (!r->rdv || (r->is_send && !r->active))
			quiet = ib_req_unlink(r);
		else if (!r->is_send && !r->cts_sent) {
			quiet = ib_req_unlink(r);
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
			ib_link_fail(l, KHOR_ERR_REMOTE,
			             "the link was given up after an error on its side "
			             "(a transfer was abandoned mid-message)");
		ib_req_finish(r, KHOR_ERR_REMOTE);
	}
	if (r->wr_out > 0)
		r->orphan = true;
	else
		ib_req_release(r);
}

static bool ib_link_ready_locked(const tp_link *l)
{
	return l->state == LS_READY && l->err.status == KHOR_SUCCESS;
}

static void ib_describe_locked(const tp_link *l, char *buf, size_t len)
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

static khor_status ib_accept_locked(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err)
{
	if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "ib accept: bad peer rank %d", peer);
	tp_link *l = ctx->incoming[peer];
	if (l != NULL && (l->state == LS_READY || l->state == LS_DEAD)) {
		l->claimed = true;
		*link_out = l;
	} else {
		*link_out = NULL;
	}
	return KHOR_SUCCESS;
}

/* A lost connection, on command (transport.h: sever): the link fails as on any error here
 * (ib_common.c: the peer is told, the queue pairs go to the error state). */
static void ib_sever_locked(tp_link *l, const char *why)
{
	ib_link_fail(l, KHOR_ERR_SYSTEM, "%s", why);
}

/* The ops that take the lock around the bodies above and in ib_connect.c and ib_p2p.c. */
TP_SKEL_LOCKED_OPS(ib)

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
			ib_poll_link(l);
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
	klist *n, *next;
	KLIST_FOREACH_SAFE(n, next, &l->uq) {
		struct unexp *u = KLIST_ENTRY(n, struct unexp, node);
		free(u->data);
		free(u);
	}
	free(l->cts_early);
	free(l);
}

static void ib_destroy(tp_ctx *ctx)
{
	const struct ib_api *api = ctx->api;

	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->all)
		link_free(ctx, IB_LINK(n));
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
	if (ctx->ch != NULL)
		api->destroy_comp_channel(ctx->ch);
	if (ctx->pd != NULL)
		api->dealloc_pd(ctx->pd);
	if (ctx->dev != NULL)
		api->close_device(ctx->dev);
	tp_skel_destroy(&ctx->sk);
	free(ctx->incoming);
	free(ctx->outgoing);
	free(ctx);
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
	klist_init(&ctx->all);
	ctx->api = api;
	ctx->rank = opt->rank;
	ctx->size = opt->size;
	ctx->meta = opt->meta;
	ctx->listen_fd = ctx->epfd = -1;
	ctx->hs_timeout_ms = opt->handshake_timeout_ms > 0 ? opt->handshake_timeout_ms : 30000;
	ctx->secret = ksecret_keep(opt->secret); /* not a copy of its own: base/secret.h */
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
	if ((st = tp_skel_init(&ctx->sk, err)) != KHOR_SUCCESS)
		goto fail;
	ctx->incoming = calloc((size_t)opt->size, sizeof(tp_link *));
	ctx->outgoing = calloc((size_t)opt->size, sizeof(tp_link *));
	if (ctx->secret == NULL || ctx->incoming == NULL || ctx->outgoing == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib transport: out of memory");
		goto fail;
	}
	if ((st = ib_dev_open(ctx, err)) != KHOR_SUCCESS)
		goto fail;
	/* The bootstrap address: the interface KHOR_SOCKET_IFNAME (or the store's route) picks. */
	ksockaddr local;
	st = ksock_pick_address(opt->ifname_spec, (const ksockaddr *)opt->hint_addr, &local, ifname,
	                        sizeof(ifname), err);
	if (st != KHOR_SUCCESS)
		goto fail;
	if ((st = ib_dev_gid(ctx, &local, ifname, err)) != KHOR_SUCCESS)
		goto fail;
	if ((ctx->pd = api->alloc_pd(ctx->dev)) == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ibv_alloc_pd on %s: %s", ctx->dev_name,
		              ib_errstr(errno));
		goto fail;
	}
	if ((ctx->ch = api->create_comp_channel(ctx->dev)) == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_comp_channel on %s: %s", ctx->dev_name,
		              ib_errstr(errno));
		goto fail;
	}
	kerr fe;
	kerr_clear(&fe);
	if (ib_dev_flush_qp(ctx, &fe) != KHOR_SUCCESS) {
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
		st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_create1: %s", ib_errstr(errno));
		goto fail;
	}
	ksock_addr_set_port(&local, 0);
	if ((st = ksock_listen(&local, 1024, &ctx->listen_fd, err)) != KHOR_SUCCESS) {
		kerr_prefix(err, "ib bootstrap on interface %s", ifname);
		goto fail;
	}
	int fds[4] = { ctx->listen_fd, ctx->sk.sl.wake_fd, ctx->ch->fd, ctx->dev->async_fd };
	void *tags[4] = { NULL, &ctx->sk.sl, ctx->ch, ctx->dev };
	for (int i = 0; i < 4; i++) {
		if (i >= 2)
			fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tags[i] };
		if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fds[i], &ev) < 0) {
			st = kerr_set(err, KHOR_ERR_SYSTEM, "epoll_ctl: %s", ib_errstr(errno));
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
	.wake = tp_skel_wake,
	.sever = ib_sever,
	.destroy = ib_destroy,
};
