/* dtype.c -- element sizes and names (dtype.h). */
#include "dtype.h"

size_t kdtype_size(khor_dtype dtype)
{
	switch (dtype) {
	case KHOR_FLOAT32: case KHOR_INT32: return 4;
	case KHOR_FLOAT64: case KHOR_INT64: return 8;
	case KHOR_FLOAT16: case KHOR_BFLOAT16: case KHOR_INT16: return 2;
	case KHOR_INT8: case KHOR_UINT8: case KHOR_BOOL: return 1;
	}
	return 0;
}

const char *kdtype_name(unsigned dtype)
{
	static const char *const names[] = { "float32", "float64", "int32", "int64", "float16",
	                                     "bfloat16", "int8", "uint8", "bool", "int16" };

	return dtype < sizeof(names) / sizeof(names[0]) ? names[dtype] : "?";
}

const char *kop_name(unsigned op)
{
	static const char *const names[] = { "sum", "avg", "min", "max", "prod" };

	return op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}
