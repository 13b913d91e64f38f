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

bool tp_meta_conflict(const tp_meta_rules *r, uint32_t a, uint32_t b)
{
	return r != NULL && r->conflict != NULL && r->conflict(a, b);
}

const char *tp_meta_describe(const tp_meta_rules *r, uint32_t meta, char *buf, size_t len)
{
	if (r != NULL && r->describe != NULL)
		return r->describe(meta, buf, len);
	snprintf(buf, len, "meta 0x%08x", meta);
	return buf;
}
