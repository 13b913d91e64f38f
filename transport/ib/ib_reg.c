/*
 * ib_reg.c -- memory registration for the verbs transport: host buffers (with the
 * locked-memory advice when pinning fails), device buffers through ib_gdr.h, the keys a
 * request uses, and the flush that makes GPUDirect writes visible to the GPU.
 */
#include "ib_int.h"

#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

/* ---- memory ------------------------------------------------------------------------ */

khor_status ib_reg_host(tp_ctx *ctx, void *buf, size_t len, int access, const char *what,
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
		                ib_errstr(e), lim, lim);
	return kerr_set(err, KHOR_ERR_SYSTEM,
	                "ib on %s: registering %s at %p (%zu bytes) failed: "
	                "%s (locked-memory limit %s)",
	                ctx->dev_name, what, buf, len, ib_errstr(e), lim);
}

khor_status ib_reg_mr(tp_ctx *ctx, const tp_reg_desc *d, tp_mr **mr_out, kerr *err)
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
	kmutex_lock(&ctx->sk.mu);
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
		st = ib_reg_host(ctx, d->buf, d->len, access, "a buffer", &m->mr, err);
	}
	kmutex_unlock(&ctx->sk.mu);
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

void ib_dereg_mr(tp_ctx *ctx, tp_mr *m)
{
	if (m == NULL)
		return;
	kmutex_lock(&ctx->sk.mu);
	ctx->api->dereg_mr(m->mr);
	kmutex_unlock(&ctx->sk.mu);
	free(m);
}

void ib_mr_key(const tp_mr *m, tp_rkey *out)
{
	out->addr = (uint64_t)(uintptr_t)m->buf;
	out->len = m->len;
	out->rkey = m->mr->rkey;
	out->pad = 0;
}

/* The keys for [buf, buf+len): from the caller's mr, or a registration of our own. */
khor_status ib_req_keys(tp_req *r, tp_mr *mr, int access, kerr *err)
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
	khor_status st =
	    ib_reg_host(l->ctx, r->buf, r->len, access, "a message buffer", &r->own_mr, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "ib link to peer rank %d", l->peer);
		return st;
	}
	r->lkey = r->own_mr->lkey;
	r->rkey = r->own_mr->rkey;
	return KHOR_SUCCESS;
}

khor_status ib_flush(tp_link *l, void *buf, size_t len, tp_mr *mr, tp_req **req_out,
                     kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	*req_out = NULL;
	if (len == 0 || mr == NULL || (mr->kind != TP_MEM_CUDA && !ctx->flush_always))
		return KHOR_SUCCESS;
	kmutex_lock(&ctx->sk.mu);
	if (ctx->fqp == NULL) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib on %s: no flush queue pair", ctx->dev_name);
		goto out;
	}
	tp_req *r = ib_req_new(l);
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
		ib_req_release(r);
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib flush on %s: ibv_post_send: %s", ctx->dev_name,
		              ib_errstr(rc));
		goto out;
	}
	/* The flush QP's completions are polled here: it is rare and short. */
	struct ibv_wc wc;
	kdeadline dl = kdeadline_in_ms(ctx->hs_timeout_ms);
	int n;
	while ((n = ibv_poll_cq(ctx->fcq, 1, &wc)) == 0 && !kdeadline_passed(dl))
		;
	if (n <= 0 || wc.status != IBV_WC_SUCCESS) {
		ib_req_release(r);
		st = kerr_set(err, KHOR_ERR_SYSTEM, "ib flush on %s: %s", ctx->dev_name,
		              n <= 0 ? "no completion within the deadline"
		                     : ctx->api->wc_status_str(wc.status));
		goto out;
	}
	ib_req_finish(r, KHOR_SUCCESS);
	*req_out = r;
out:
	kmutex_unlock(&ctx->sk.mu);
	return st;
}
