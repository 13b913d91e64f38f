/*
 * ib_load.h -- libibverbs, loaded at run time. libkhor has no link-time dependency on
 * rdma-core: ib_api_get() dlopens libibverbs.so.1 once and fills this table, or says why
 * it could not ("libibverbs.so.1: cannot open shared object file", a missing symbol). The
 * fast-path verbs (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are
 * inline functions of verbs.h that call through the device context's ops, so they need
 * no symbol from the library and are used directly.
 */
#ifndef KHOR_TRANSPORT_IB_LOAD_H
#define KHOR_TRANSPORT_IB_LOAD_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>

struct ib_api {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	/* The exported (compat) entry point: fills the fields every rdma-core has. */
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	/* NULL in rdma-core before v34 (IBVERBS_1.12). */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
	                                uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
	                            struct ibv_comp_channel *ch, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);
	const char *(*wc_status_str)(enum ibv_wc_status status);
	const char *(*event_type_str)(enum ibv_event_type ev);
	const char *(*port_state_str)(enum ibv_port_state st);
};

/*
 * The table, loaded on first call (thread-safe); NULL when libibverbs is not there, with
 * the reason in why (valid for the life of the process).
 */
const struct ib_api *ib_api_get(const char **why);

#endif
