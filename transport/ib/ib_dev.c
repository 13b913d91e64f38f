/*
 * ib_dev.c -- which device, port and GID an ib instance uses (KHOR_IB_HCA,
 * KHOR_IB_GID_INDEX, or the RoCE v2 GID of the bootstrap interface), the loopback QP for
 * GPUDirect flushes, and the device's asynchronous events, which fail the links they name.
 */
#include "ib_int.h"

#include "base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

khor_status ib_dev_flush_qp(tp_ctx *ctx, kerr *err)
{
	const struct ib_api *api = ctx->api;

	ctx->fcq = api->create_cq(ctx->dev, 4, NULL, NULL, 0);
	if (ctx->fcq == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_cq(flush): %s", ib_errstr(errno));
	struct ibv_qp_init_attr ia = { .send_cq = ctx->fcq, .recv_cq = ctx->fcq,
	                               .qp_type = IBV_QPT_RC,
	                               .cap = { .max_send_wr = 4, .max_recv_wr = 1,
	                                        .max_send_sge = 1, .max_recv_sge = 1 } };
	ctx->fqp = api->create_qp(ctx->pd, &ia);
	if (ctx->fqp == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "ibv_create_qp(flush): %s", ib_errstr(errno));
	khor_status st = ib_reg_host(ctx, &ctx->fbuf, sizeof(ctx->fbuf), IBV_ACCESS_LOCAL_WRITE,
	                             "the flush word", &ctx->fmr, err);
	if (st != KHOR_SUCCESS)
		return st;
	ctx->fbuf = (uint64_t)(uintptr_t)&ctx->fbuf;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = (uint8_t)ctx->port,
	                         .qp_access_flags = IBV_ACCESS_REMOTE_READ };
	if (api->modify_qp(ctx->fqp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
	                   IBV_QP_ACCESS_FLAGS) != 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP INIT: %s", ib_errstr(errno));
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
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP RTR: %s", ib_errstr(errno));
	struct ibv_qp_attr c = { .qp_state = IBV_QPS_RTS, .timeout = (uint8_t)ctx->timeout,
	                         .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	if (api->modify_qp(ctx->fqp, &c, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
	                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "flush QP RTS: %s", ib_errstr(errno));
	return KHOR_SUCCESS;
}

/* Opens the first device and active port KHOR_IB_HCA allows. */
khor_status ib_dev_open(tp_ctx *ctx, kerr *err)
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

/*
 * Chooses the GID: KHOR_IB_GID_INDEX when given, else on RoCE the RoCE v2 entry of the
 * interface the bootstrap address (local, on ifname) sits on, else index 0.
 */
khor_status ib_dev_gid(tp_ctx *ctx, const ksockaddr *local, const char *ifname, kerr *err)
{
	const struct ib_api *api = ctx->api;
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
		if (local->ss.ss_family == AF_INET)
			ip4 = (const uint8_t *)&((struct sockaddr_in *)&local->ss)->sin_addr;
		ctx->gid_index = pick_gid(ctx, tbl_len, ifname, ip4, &ctx->gid_type);
	} else {
		ctx->gid_index = 0;
	}
	if (api->query_gid(ctx->dev, (uint8_t)ctx->port, ctx->gid_index, &ctx->gid) != 0)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s port %d has no GID at index %d "
		                "(KHOR_IB_GID_INDEX)", ctx->dev_name, ctx->port, ctx->gid_index);
	inet_ntop(AF_INET6, ctx->gid.raw, ctx->gid_str, sizeof(ctx->gid_str));
	return KHOR_SUCCESS;
}

/* The device's asynchronous events: a port or device error fails every link, a QP or CQ
 * error the link it names. */
void ib_dev_events(tp_ctx *ctx)
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
			IB_FOR_EACH_LINK(l, ctx)
				ib_link_fail(l, KHOR_ERR_REMOTE, "device %s port %d reported %s",
				             ctx->dev_name, ctx->port, what);
			break;
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_CQ_ERR: {
			KLOG_WARN("ib device %s: %s", ctx->dev_name, what);
			IB_FOR_EACH_LINK(l, ctx) {
				bool mine = t == IBV_EVENT_CQ_ERR ? ev.element.cq == l->cq : false;
				for (int q = 0; q < l->nqp && !mine; q++)
					mine = t != IBV_EVENT_CQ_ERR && ev.element.qp == l->qps[q].qp;
				if (mine)
					ib_link_fail(l, KHOR_ERR_REMOTE, "device %s reported %s",
					             ctx->dev_name, what);
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
