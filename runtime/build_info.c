/*
 * build_info.c -- what this khor was built with, as one line of key=value words: the
 * string of khor_build_info() (bindings/capi.c), `khorrun --check-build` and the Python
 * package's cuda_built()/nccl_built(). It lives here, in khor_runtime, because khorrun
 * links the layers statically rather than libkhor, and both must tell the same story
 * (libkhor exports only what bindings/ defines: --exclude-libs hides the archives').
 *
 *   tcp, shm  always built
 *   ib        the verbs transport (built when infiniband/verbs.h was there: KHOR_HAVE_IB;
 *             libibverbs itself is loaded at run time)
 *   cuda      the cuda memory backend with its reduction kernels (KHOR_HAVE_CUDA_KERNELS:
 *             without it every buffer is host memory)
 *   nccl      nccl.h was there, so runtime/nccl.c can load libnccl.so.2 at run time (the
 *             same __has_include test nccl.c makes, with the same include path)
 *   nccl_version  NCCL_VERSION_CODE of that header (2.27.3 = 22703), only with nccl=1:
 *             Horovod's nccl_built() returns it, and its tests compare it with 2700
 *   gdr       GPUDirect RDMA: ib registers device memory, which needs both ib and cuda
 */
#include "build_info.h"

#include "khor.h"

#define BI_STR2(x) #x
#define BI_STR(x) BI_STR2(x)

#ifdef KHOR_HAVE_IB
#define BI_IB 1
#else
#define BI_IB 0
#endif
#ifdef KHOR_BUILT_CUDA_KERNELS
#define BI_CUDA 1
#else
#define BI_CUDA 0
#endif
#if __has_include(<nccl.h>)
/* nccl.h declares GroupStart() and friends without (void) (see runtime/nccl.c). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#define BI_NCCL 1
#define BI_NCCL_WORDS " nccl=1 nccl_version=" BI_STR(NCCL_VERSION_CODE)
#else
#define BI_NCCL 0
#define BI_NCCL_WORDS " nccl=0"
#endif
#if BI_IB && BI_CUDA
#define BI_GDR 1
#else
#define BI_GDR 0
#endif

const char *build_info_string(void)
{
	return "version=" BI_STR(KHOR_VERSION_MAJOR) "." BI_STR(KHOR_VERSION_MINOR) "." BI_STR(
		KHOR_VERSION_PATCH) " tcp=1 shm=1 ib=" BI_STR(BI_IB) " cuda=" BI_STR(BI_CUDA)
		BI_NCCL_WORDS " gdr=" BI_STR(BI_GDR);
}
