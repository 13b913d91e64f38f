/*
 * tcp_sock.c -- one socket of a TCP link: given its descriptor and put in the poll set,
 * closed, and failed, which records the link's first error (tcp_link_fail) with the
 * socket's number and the cause. The other files of the transport call these; these call
 * none of them.
 */
#include "tcp_int.h"

#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

const char *tcp_errstr(int e)
{
	static __thread char buf[256];
	return kerr_errno_str(e, buf, sizeof(buf));
}

void tcp_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
{
	char who[TP_ADDR_MAX + 64];
	va_list ap;

	if (l->err.status != KHOR_SUCCESS)
		return;
	snprintf(who, sizeof(who), "link to peer rank %d (%s)", l->peer,
	         l->peer_addr[0] ? l->peer_addr : "address unknown");
	va_start(ap, fmt);
	tp_skel_vfail(&l->err, st, who, fmt, ap);
	va_end(ap);
}

void tcp_sock_close_fd(struct tsock *s)
{
	if (s->fd >= 0) {
		epoll_ctl(s->ctx->epfd, EPOLL_CTL_DEL, s->fd, NULL);
		close(s->fd);
		s->fd = -1;
	}
	s->state = SS_DEAD;
}

void tcp_sock_fail(struct tsock *s, khor_status st, const char *fmt, ...)
{
	char what[KERR_TEXT_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (s->link != NULL)
		tcp_link_fail(s->link, st, "socket %d of %d: %s", s->idx + 1, s->link->nsocks,
		              what);
	tcp_sock_close_fd(s);
}

/* Gives s the socket fd (in state st) and registers it; false (errno set) if epoll refuses. */
bool tcp_sock_attach(struct tsock *s, int fd, enum sock_state st)
{
	struct epoll_event ev;

	s->fd = fd;
	s->state = st;
	s->rd_ready = true;
	/* A connecting socket is writable only once connect() finished; epoll tells us. */
	s->wr_ready = st != SS_CONNECTING;
	ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
	ev.data.ptr = s;
	if (epoll_ctl(s->ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		s->fd = -1;
		s->state = SS_DEAD;
		return false;
	}
	return true;
}
