/*
 * store_connect.c -- picks the store's backend from its address: "host:port" is the
 * embedded TCP store (khorrun's, or rank 0's), "etcd://host:port" an etcd server.
 */
#include "store.h"

#include "base/sock.h"

#include <string.h>

khor_status store_connect(const char *addr, const char *secret, const char *job_id,
                          kdeadline dl, store **store_out, kerr *err)
{
	size_t scheme = strlen(STORE_ETCD_SCHEME);
	bool etcd = strncmp(addr, STORE_ETCD_SCHEME, scheme) == 0;
	char host[256];
	uint16_t port;

	if (!ksock_split_hostport(etcd ? addr + scheme : addr, host, sizeof(host), &port))
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "store address '%s': expected host:port (the khor store) or "
		                "etcd://host:port (an etcd server's client port)",
		                addr);
	if (etcd)
		return store_etcd_connect(host, port, dl, store_out, err);
	return store_tcp_connect(host, port, secret, job_id, dl, store_out, err);
}
