/* transport.c -- the registry of transports compiled into this build. */
#include "transport.h"

#include "shm.h"

#include <stdio.h>
#include <string.h>

static const struct transport_ops *const transports[] = {
	&tcp_transport_ops,
	&shm_transport_ops,
};

const struct transport_ops *transport_find(const char *name)
{
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (strcmp(transports[i]->name, name) == 0)
			return transports[i];
	return NULL;
}

const char *tp_meta_str(uint32_t meta, char *buf, size_t len)
{
	static const char *const colls[] = { "allreduce", "broadcast", "barrier", "reduce",
	                                     "allgather", "reducescatter", "alltoall", "gather",
	                                     "scatter", "probe" };
	static const char *const dtypes[] = { "float32", "float64", "int32", "int64", "float16",
	                                      "bfloat16", "int8", "uint8", "bool" };
	static const char *const ops[] = { "sum", "avg", "min", "max", "prod" };
	static const char *const scheds[] = { "", ", ring", ", recursive doubling",
	                                      ", double binary tree", ", halving-doubling" };
	unsigned c = meta >> 16 & 0xff, d = meta >> 8 & 0xff, o = meta & 0xff, s = meta >> 24;

	snprintf(buf, len, "%s %s %s%s", c < 10 ? colls[c] : "?", d < 9 ? dtypes[d] : "?",
	         o < 5 ? ops[o] : "?", s < 5 ? scheds[s] : ", ?");
	return buf;
}
