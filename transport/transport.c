/*
 * transport.c -- the registry of transports compiled into this build, in order of
 * preference for peers on other hosts (transport.h: transport_list). A table built against
 * another version of transport.h is left out with a warning, so a half-updated transport
 * can never be called through fields it does not have.
 */
#include "transport.h"

#include "base/log.h"
#include "transport/ib/ib.h"
#include "transport/shm/shm.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const struct transport_ops *const compiled[] = {
#ifdef KHOR_HAVE_IB
    &ib_transport_ops,
#endif
    &tcp_transport_ops,
    &shm_transport_ops,
};
#define NCOMPILED ((int)(sizeof(compiled) / sizeof(compiled[0])))

/* The tables of the right version; filled once (pthread_once: any thread may ask first). */
static const struct transport_ops *usable[NCOMPILED];
static int nusable;
static pthread_once_t usable_once = PTHREAD_ONCE_INIT;

static void check_versions(void)
{
	for (int i = 0; i < NCOMPILED; i++) {
		if (compiled[i]->version != TP_VERSION) {
			KLOG_WARN(
			    "transport '%s' left out: its ops table is version %d, this library's "
			    "transport.h is version %d (rebuild it against this tree)",
			    compiled[i]->name, compiled[i]->version, TP_VERSION);
			continue;
		}
		usable[nusable++] = compiled[i];
	}
}

const struct transport_ops *const *transport_list(int *n_out)
{
	pthread_once(&usable_once, check_versions);
	*n_out = nusable;
	return usable;
}

const struct transport_ops *transport_find(const char *name)
{
	int n;
	const struct transport_ops *const *l = transport_list(&n);

	for (int i = 0; i < n; i++)
		if (strcmp(l[i]->name, name) == 0)
			return l[i];
	return NULL;
}
