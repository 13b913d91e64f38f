/*
 * ib_gdr.h -- GPUDirect RDMA registration of CUDA device memory for the verbs transport.
 *
 * Three ways, tried in NCCL's order and probed once per device:
 *   1. dmabuf: the CUDA driver exports the allocation's pages as a dmabuf fd
 *      (cuMemGetHandleForAddressRange) and the HCA registers that (ibv_reg_dmabuf_mr).
 *      Needs rdma-core >= 34, a kernel with dmabuf support in the HCA driver and a GPU
 *      whose driver reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.
 *   2. the peer-memory module (nvidia-peermem, or Mellanox's nv_peer_mem), found by its
 *      sysfs entries: plain ibv_reg_mr on the device pointer then works.
 *   3. neither: registration fails with KHOR_ERR_NOT_SUPPORTED and the reason, and the
 *      caller stages device data through pinned host memory. The reason is logged once.
 * libcuda is loaded at run time like libibverbs; nothing here runs on a machine without a
 * GPU (the probe says "no CUDA driver").
 */
#ifndef KHOR_TRANSPORT_IB_GDR_H
#define KHOR_TRANSPORT_IB_GDR_H

#include "base/err.h"
#include "transport/transport.h"
#include "ib_load.h"

enum ib_gdr_mode { IB_GDR_NONE = 0, IB_GDR_DMABUF, IB_GDR_PEERMEM };

/*
 * Which way device memory can be registered on pd's device; why gets the reason when
 * IB_GDR_NONE (or the way chosen, for the log). Cheap after the first call per pd.
 */
enum ib_gdr_mode ib_gdr_probe(const struct ib_api *api, struct ibv_pd *pd, char *why,
                              size_t why_len);

/*
 * Registers d (kind TP_MEM_CUDA) on pd in the given mode with verbs access flags. Uses
 * d->dmabuf_fd when the caller has one, else asks the CUDA driver for it (and closes it
 * after registering: the MR keeps the pages). Errors name the buffer and the cause.
 */
khor_status ib_gdr_reg(const struct ib_api *api, struct ibv_pd *pd, enum ib_gdr_mode mode,
                       const tp_reg_desc *d, int access, struct ibv_mr **mr_out, kerr *err);

#endif
