/* ib_load.c -- dlopen of libibverbs (ib_load.h). */
#include "ib_load.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct ib_api api;
static const struct ib_api *loaded;
static char why_not[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A required symbol; a missing one makes the whole library unusable. */
#define NEED(field, sym)                                                                  \
	do {                                                                              \
		*(void **)&api.field = dlsym(h, sym);                                     \
		if (api.field == NULL) {                                                  \
			snprintf(why_not, sizeof(why_not), "libibverbs.so.1 has no %s: %s", sym, \
			         dlerror());                                              \
			dlclose(h);                                                       \
			return;                                                           \
		}                                                                         \
	} while (0)

static void load(void)
{
	/* RTLD_LOCAL: the application's own verbs users (if any) keep their view. */
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h == NULL) {
		snprintf(why_not, sizeof(why_not), "%s (install rdma-core and ibverbs-providers)",
		         dlerror());
		return;
	}
	NEED(get_device_list, "ibv_get_device_list");
	NEED(free_device_list, "ibv_free_device_list");
	NEED(get_device_name, "ibv_get_device_name");
	NEED(open_device, "ibv_open_device");
	NEED(close_device, "ibv_close_device");
	NEED(query_device, "ibv_query_device");
	NEED(query_port, "ibv_query_port");
	NEED(query_gid, "ibv_query_gid");
	NEED(alloc_pd, "ibv_alloc_pd");
	NEED(dealloc_pd, "ibv_dealloc_pd");
	NEED(reg_mr, "ibv_reg_mr");
	NEED(dereg_mr, "ibv_dereg_mr");
	NEED(create_comp_channel, "ibv_create_comp_channel");
	NEED(destroy_comp_channel, "ibv_destroy_comp_channel");
	NEED(create_cq, "ibv_create_cq");
	NEED(destroy_cq, "ibv_destroy_cq");
	NEED(get_cq_event, "ibv_get_cq_event");
	NEED(ack_cq_events, "ibv_ack_cq_events");
	NEED(create_qp, "ibv_create_qp");
	NEED(modify_qp, "ibv_modify_qp");
	NEED(destroy_qp, "ibv_destroy_qp");
	NEED(get_async_event, "ibv_get_async_event");
	NEED(ack_async_event, "ibv_ack_async_event");
	NEED(wc_status_str, "ibv_wc_status_str");
	NEED(event_type_str, "ibv_event_type_str");
	NEED(port_state_str, "ibv_port_state_str");
	*(void **)&api.reg_dmabuf_mr = dlsym(h, "ibv_reg_dmabuf_mr"); /* optional */
	loaded = &api; /* the handle stays open for the life of the process */
}

const struct ib_api *ib_api_get(const char **why)
{
	pthread_once(&once, load);
	if (loaded == NULL && why != NULL)
		*why = why_not;
	return loaded;
}
