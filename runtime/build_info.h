/*
 * build_info.h -- what this khor was built with, as khor_build_info() returns it (the ABI
 * wrapper is in bindings/capi.c; khorrun, which links the layers statically, calls this).
 */
#ifndef KHOR_RUNTIME_BUILD_INFO_H
#define KHOR_RUNTIME_BUILD_INFO_H

/* "version=X.Y.Z tcp=1 shm=1 ib=B cuda=B nccl=B gdr=B": see include/khor.h. */
const char *build_info_string(void);

#endif
