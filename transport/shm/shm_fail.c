/*
 * shm_fail.c -- a shared-memory link's failure: its first error is kept, and the peer is
 * told through memory first (broken[], with the reason in why[], since it may be reading
 * our buffers with CMA) and then through the socket, which wakes it. The other files of
 * the transport call these; these call none of them.
 */
#include "shm_int.h"

#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>

const char *shm_errstr(int e)
{
	static __thread char buf[256];
	return kerr_errno_str(e, buf, sizeof(buf));
}

void shm_link_fail_text(tp_link *l, khor_status st, const char *text)
{
	if (!tp_skel_fail(&l->err, st, NULL, "%s", text))
		return;
	l->err.peer = l->peer;
	if (l->seg != NULL) {
		/* Tell the peer first through memory (it may be reading our buffers with CMA and
		 * must not trust what it read after this), then through the socket (wakes it).
		 * The text lets it report the root cause rather than "the link broke". */
		kstrlcpy(l->seg->why[l->side], text, sizeof(l->seg->why[0]));
		atomic_store_explicit(&l->seg->broken[l->side].v, 1, memory_order_seq_cst);
	}
	if (l->fd >= 0)
		shutdown(l->fd, SHUT_RDWR);
}

void shm_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
{
	char what[KERR_TEXT_MAX], text[KERR_TEXT_MAX];
	va_list ap;

	if (l->err.status != KHOR_SUCCESS)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (l->peer_pid > 0)
		snprintf(text, sizeof(text), "shm link to peer rank %d (pid %d): %s", l->peer,
		         (int)l->peer_pid, what);
	else
		snprintf(text, sizeof(text), "shm link to peer rank %d (%s): %s", l->peer,
		         l->peer_addr[0] ? l->peer_addr : "address unknown", what);
	shm_link_fail_text(l, st, text);
}

/* The peer's process is gone (or closed its end): say so in the words the issue asks for. */
void shm_link_fail_peer_gone(tp_link *l, const char *how)
{
	char text[KERR_TEXT_MAX];

	snprintf(text, sizeof(text), "peer rank %d (pid %d) died or closed its shared-memory link "
	         "while %d transfer(s) with it were pending (%s); check that rank's log and exit "
	         "status for the cause", l->peer, (int)l->peer_pid, l->nbusy, how);
	shm_link_fail_text(l, KHOR_ERR_REMOTE, text);
}
