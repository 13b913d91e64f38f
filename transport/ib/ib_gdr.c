/* ib_gdr.c -- GPUDirect RDMA registration (ib_gdr.h). */
#include "ib_gdr.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef KHOR_HAVE_CUDA_H
#include <cuda.h>
/* The numbers below are the driver API's; check them against the header when we have it. */
_Static_assert(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == 1, "CUDA dmabuf handle type");
_Static_assert(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED == 124, "CUDA dmabuf attribute");
_Static_assert(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == 9, "CUDA pointer attribute");
_Static_assert(CUDA_SUCCESS == 0, "CUDA success");
#endif

#define GDR_HANDLE_DMABUF_FD 1
#define GDR_ATTR_DMA_BUF_SUPPORTED 124
#define GDR_PTR_DEVICE_ORDINAL 9

/* The few driver entry points we need, with plain C types (no cuda.h at run time). */
static struct {
	int (*init)(unsigned flags);
	int (*get_error_string)(int res, const char **s);
	int (*pointer_get_attribute)(void *data, int attr, uint64_t ptr);
	int (*device_get_attribute)(int *v, int attr, int dev);
	int (*mem_get_address_range)(uint64_t *base, size_t *size, uint64_t ptr);
	int (*mem_get_handle_for_address_range)(void *handle, uint64_t ptr, size_t size, int type,
	                                        unsigned long long flags);
	bool ok;
	char why[256];
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h == NULL) {
		snprintf(cu.why, sizeof(cu.why), "no CUDA driver (%s)", dlerror());
		return;
	}
	*(void **)&cu.init = dlsym(h, "cuInit");
	*(void **)&cu.get_error_string = dlsym(h, "cuGetErrorString");
	*(void **)&cu.pointer_get_attribute = dlsym(h, "cuPointerGetAttribute");
	*(void **)&cu.device_get_attribute = dlsym(h, "cuDeviceGetAttribute");
	*(void **)&cu.mem_get_address_range = dlsym(h, "cuMemGetAddressRange_v2");
	*(void **)&cu.mem_get_handle_for_address_range = dlsym(h, "cuMemGetHandleForAddressRange");
	if (cu.init == NULL || cu.pointer_get_attribute == NULL || cu.device_get_attribute == NULL ||
	    cu.mem_get_address_range == NULL) {
		snprintf(cu.why, sizeof(cu.why), "the CUDA driver lacks the pointer queries");
		return;
	}
	int r = cu.init(0);
	if (r != 0) {
		snprintf(cu.why, sizeof(cu.why), "cuInit failed with CUDA error %d (no GPU?)", r);
		return;
	}
	cu.ok = true;
}

static const char *cu_err(int r)
{
	const char *s = NULL;

	if (cu.get_error_string != NULL)
		cu.get_error_string(r, &s);
	return s != NULL ? s : "unknown CUDA error";
}

/* nvidia-peermem (or the older nv_peer_mem) is loaded: the HCA can pin device pages. */
static bool peermem_loaded(void)
{
	static const char *const paths[] = {
		"/sys/kernel/mm/memory_peers/nv_mem/version",
		"/sys/kernel/mm/memory_peers/nvidia-peermem/version",
		"/sys/module/nvidia_peermem/version",
		"/sys/module/nv_peer_mem/version",
	};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (access(paths[i], F_OK) == 0)
			return true;
	return false;
}

enum ib_gdr_mode ib_gdr_probe(const struct ib_api *api, struct ibv_pd *pd, char *why,
                              size_t why_len)
{
	pthread_once(&cu_once, cu_load);
	if (!cu.ok) {
		snprintf(why, why_len, "%s", cu.why);
		return IB_GDR_NONE;
	}
	/*
	 * dmabuf as NCCL probes it: a registration of fd -1 fails with EOPNOTSUPP or
	 * EPROTONOSUPPORT where the kernel or provider can't do dmabuf at all, and with
	 * another error (EBADF) where it could with a real fd.
	 */
	bool kernel_dmabuf = false;
	if (api->reg_dmabuf_mr != NULL && cu.mem_get_handle_for_address_range != NULL) {
		errno = 0;
		struct ibv_mr *mr = api->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
		if (mr != NULL)
			api->dereg_mr(mr);
		kernel_dmabuf = errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
	}
	int dev_dmabuf = 0;
	if (kernel_dmabuf && cu.device_get_attribute(&dev_dmabuf, GDR_ATTR_DMA_BUF_SUPPORTED, 0) != 0)
		dev_dmabuf = 0;
	if (kernel_dmabuf && dev_dmabuf) {
		snprintf(why, why_len, "dmabuf (ibv_reg_dmabuf_mr)");
		return IB_GDR_DMABUF;
	}
	if (peermem_loaded()) {
		snprintf(why, why_len, "the peer-memory module (nvidia-peermem)");
		return IB_GDR_PEERMEM;
	}
	snprintf(why, why_len, "no GPUDirect RDMA: %s, and no peer-memory module is loaded "
	         "(modprobe nvidia-peermem)",
	         api->reg_dmabuf_mr == NULL ? "this rdma-core has no ibv_reg_dmabuf_mr"
	         : !kernel_dmabuf          ? "the HCA's kernel driver refuses dmabuf"
	                                   : "the GPU driver does not export dmabuf");
	return IB_GDR_NONE;
}

khor_status ib_gdr_reg(const struct ib_api *api, struct ibv_pd *pd, enum ib_gdr_mode mode,
                       const tp_reg_desc *d, int access, struct ibv_mr **mr_out, kerr *err)
{
	struct ibv_mr *mr = NULL;
	char eb[128];

	if (mode == IB_GDR_PEERMEM) {
		mr = api->reg_mr(pd, d->buf, d->len, access);
		if (mr == NULL)
			return kerr_set(err, KHOR_ERR_SYSTEM, "registering device buffer %p (%zu bytes) "
			                "through the peer-memory module: %s", d->buf, d->len,
			                kerr_errno_str(errno, eb, sizeof(eb)));
		*mr_out = mr;
		return KHOR_SUCCESS;
	}
	if (mode != IB_GDR_DMABUF)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "device buffer %p (%zu bytes): no "
		                "GPUDirect RDMA on this HCA", d->buf, d->len);
	int fd = d->dmabuf_fd;
	uint64_t offset = d->dmabuf_offset;
	bool own_fd = false;
	if (fd < 0) {
		/* The driver exports whole pages of the allocation the buffer belongs to. */
		uint64_t base = 0, ptr = (uint64_t)(uintptr_t)d->buf;
		size_t size = 0;
		int r = cu.mem_get_address_range(&base, &size, ptr);
		if (r != 0)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "device buffer %p (%zu bytes): "
			                "cuMemGetAddressRange: %s", d->buf, d->len, cu_err(r));
		long page = sysconf(_SC_PAGESIZE);
		uint64_t start = base & ~(uint64_t)(page - 1);
		uint64_t end = (base + size + (uint64_t)page - 1) & ~(uint64_t)(page - 1);
		r = cu.mem_get_handle_for_address_range(&fd, start, (size_t)(end - start),
		                                         GDR_HANDLE_DMABUF_FD, 0);
		if (r != 0)
			return kerr_set(err, KHOR_ERR_SYSTEM, "device buffer %p (%zu bytes): "
			                "cuMemGetHandleForAddressRange: %s", d->buf, d->len, cu_err(r));
		offset = ptr - start;
		own_fd = true;
	}
	mr = api->reg_dmabuf_mr(pd, offset, d->len, (uint64_t)(uintptr_t)d->buf, fd, access);
	int e = errno;
	if (own_fd)
		close(fd);
	if (mr == NULL)
		return kerr_set(err, KHOR_ERR_SYSTEM, "registering device buffer %p (%zu bytes) "
		                "through dmabuf: ibv_reg_dmabuf_mr: %s", d->buf, d->len,
		                kerr_errno_str(e, eb, sizeof(eb)));
	*mr_out = mr;
	return KHOR_SUCCESS;
}
