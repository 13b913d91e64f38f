/*
 * dtype.h -- the element types every layer shares: their sizes and names. The collectives
 * size their buffers with these, the C ABI exports kdtype_size as khor_dtype_size, and the
 * error messages name types with kdtype_name.
 */
#ifndef KHOR_BASE_DTYPE_H
#define KHOR_BASE_DTYPE_H

#include "khor.h"

#include <stddef.h>

/* Bytes of one element, 0 for an unknown dtype. */
size_t kdtype_size(khor_dtype dtype);
/* "float32", ..., "?" for an unknown dtype. */
const char *kdtype_name(unsigned dtype);
/* "sum", ..., "?" for an unknown op. */
const char *kop_name(unsigned op);

#endif
