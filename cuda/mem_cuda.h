/*
 * mem_cuda.h -- what the cuda backend of the memory seam (mem_cuda.c) offers besides its
 * ops table: whether a GPU is usable at all, and a device's primary context. The table
 * itself is kmem_cuda_backend, listed in kmem_backends (collectives/mem.c).
 */
#ifndef KHOR_CUDA_MEM_CUDA_H
#define KHOR_CUDA_MEM_CUDA_H

#include "collectives/mem.h"

#include <stdbool.h>
#include <stddef.h>

extern const kmem_backend kmem_cuda_backend;

/*
 * Loads the driver if that has not happened, initialises it (cuInit, which query never
 * calls: see mem_cuda.c) and counts the devices: false, with the reason in why ("cannot
 * load the CUDA driver: libcuda.so.1: cannot open shared object file ..."), when there is
 * no usable GPU. For tests and for callers about to create CUDA state of their own.
 */
bool mem_cuda_usable(char *why, size_t len);

/* The primary context of device ordinal (retained once, kept for the process's life). */
khor_status mem_cuda_device_ctx(int ordinal, void **ctx_out, kerr *err);

#endif
