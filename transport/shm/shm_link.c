/*
 * shm_link.c -- how a shared-memory link comes up: the connector makes the segment (a
 * sealed memfd, shm.c's top comment draws it) and both sides run the shared handshake of
 * handshake.h over the Unix socket, the segment's descriptor riding on the PROOF and the
 * CMA probe on the aux words. A stranger is refused and logged; the job goes on.
 */
#include "shm_int.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the segment --------------------------------------------------------------------- */

static void seg_attach(tp_link *l, void *base, size_t len)
{
	l->seg = base;
	l->seg_len = len;
	l->ring_bytes = l->seg->ring_bytes;
	l->tx = &l->seg->dir[l->side];
	l->rx = &l->seg->dir[1 - l->side];
	l->tx_ring = (uint8_t *)base + SHM_SEG_HDR + (size_t)l->side * l->ring_bytes;
	l->rx_ring = (uint8_t *)base + SHM_SEG_HDR + (size_t)(1 - l->side) * l->ring_bytes;
	l->next_msg_id = 1;
}

/*
 * The connector makes the segment. memfd_create gives memory with no name in any file
 * system, so nothing can outlive the processes that map it, whatever kills them. The
 * seals stop the peer from shrinking it under us (which would turn our next access into
 * SIGBUS) or growing it.
 */
khor_status shm_seg_create(tp_link *l, kerr *err)
{
	size_t len = SHM_SEG_HDR + 2 * (size_t)SHM_RING_BYTES;
	void *base;
	int fd;

	fd = memfd_create("khor-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		int e = errno;
		return kerr_set(err, KHOR_ERR_SYSTEM, "shm link to peer rank %d: memfd_create: %s%s",
		                l->peer, shm_errstr(e), e == ENOSYS || e == EINVAL ?
		                " (the kernel must be 3.17 or newer; use KHOR_TRANSPORT=tcp otherwise)"
		                : "");
	}
	if (ftruncate(fd, (off_t)len) < 0) {
		kerr_set(err, KHOR_ERR_SYSTEM, "shm link to peer rank %d: sizing the %zu-byte "
		         "segment: %s", l->peer, len, shm_errstr(errno));
		goto fail_close;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		kerr_set(err, KHOR_ERR_SYSTEM, "shm link to peer rank %d: sealing the segment: %s",
		         l->peer, shm_errstr(errno));
		goto fail_close;
	}
	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		kerr_set(err, KHOR_ERR_SYSTEM, "shm link to peer rank %d: mapping the %zu-byte "
		         "segment: %s (check ulimit -v and /proc/sys/vm/max_map_count)", l->peer, len,
		         shm_errstr(errno));
		goto fail_close;
	}
	struct shm_seg *s = base;
	s->magic = SHM_MAGIC;
	s->version = SHM_VERSION;
	s->ring_bytes = SHM_RING_BYTES;
	l->seg_fd = fd;
	seg_attach(l, base, len);
	return KHOR_SUCCESS;

fail_close:
	close(fd);
	return err->status;
}

/* The acceptor checks the fd it was given before it maps it: a peer holding the secret may
 * still be buggy, and a short or unsealed file could SIGBUS this process later. */
static bool seg_map_peer(tp_link *l, int fd, const char **why)
{
	uint64_t ring_bytes = l->hello.aux[SHM_AUX_RING_BYTES]; /* checked by acc_hello */
	size_t len = SHM_SEG_HDR + 2 * (size_t)ring_bytes;
	struct stat st;
	int seals;
	void *base;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len) {
		*why = "the segment is not a file of the announced size";
		return false;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		*why = "the segment is not sealed against shrinking";
		return false;
	}
	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		*why = "mmap of the segment failed";
		return false;
	}
	struct shm_seg *s = base;
	if (s->magic != SHM_MAGIC || s->version != SHM_VERSION ||
	    s->ring_bytes != ring_bytes) {
		munmap(base, len);
		*why = "the segment header is wrong";
		return false;
	}
	seg_attach(l, base, len);
	return true;
}

/* ---- handshake ----------------------------------------------------------------------- */

/* Sends one handshake message (and maybe an fd); keeps it if the socket is full. */
bool shm_hs_send(tp_link *l, const void *msg, uint32_t len, int fd)
{
	if (msg != NULL) {
		memcpy(l->out, msg, len);
		l->out_len = len;
		l->out_fd = fd;
	}
	if (l->out_len == 0)
		return true;
	struct iovec iov = { l->out, l->out_len };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (l->out_fd >= 0) {
		memset(&cb, 0, sizeof(cb));
		mh.msg_control = cb.buf;
		mh.msg_controllen = sizeof(cb.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &l->out_fd, sizeof(int));
	}
	if (sendmsg(l->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return true;
		return false;
	}
	l->out_len = 0;
	return true;
}

/*
 * Receives one handshake message of exactly want bytes. Returns 1, 0 when nothing is there
 * yet, -1 on EOF, error or a wrong size. Descriptors that come along are kept in *fd_out
 * when asked for and closed otherwise, so a stranger cannot fill our descriptor table.
 */
static int hs_recv(tp_link *l, void *buf, size_t want, int *fd_out, const char **why)
{
	uint8_t tmp[SHM_HS_MSG_MAX];
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cb;
	struct iovec iov = { tmp, sizeof(tmp) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf,
	                     .msg_controllen = sizeof(cb.buf) };
	ssize_t n = recvmsg(l->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c != NULL;
	     c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (fd_out != NULL && *fd_out < 0)
				*fd_out = fd;
			else
				close(fd);
		}
	}
	if (n < 0) {
		*why = shm_errstr(errno);
		return -1;
	}
	if (n == 0) {
		*why = "connection closed";
		return -1;
	}
	if ((size_t)n != want || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		*why = "a message of the wrong size";
		return -1;
	}
	memcpy(buf, tmp, want);
	return 1;
}

/*
 * Can we read the peer's memory? The peer told us where its nonce lives; reading it back
 * through process_vm_readv proves both that CMA is allowed here (ptrace permission, no
 * seccomp filter) and that the pid we hold is really the peer.
 */
static bool cma_probe(tp_link *l, uint64_t addr, const uint8_t *expect)
{
	uint8_t got[KAUTH_NONCE_LEN];
	struct iovec lio = { got, sizeof(got) }, rio = { (void *)(uintptr_t)addr, sizeof(got) };

	if (!l->ctx->cma_enabled || l->peer_pid <= 0)
		return false;
	if (process_vm_readv(l->peer_pid, &lio, 1, &rio, 1, 0) != (ssize_t)sizeof(got)) {
		KLOG_INFO("shm link to peer rank %d (pid %d): process_vm_readv is not allowed (%s); "
		          "large messages take the two-copy path through the ring", l->peer,
		          (int)l->peer_pid, shm_errstr(errno));
		return false;
	}
	return memcmp(got, expect, sizeof(got)) == 0;
}

void shm_peer_cred(tp_link *l)
{
	struct ucred uc;
	socklen_t sl = sizeof(uc);

	if (getsockopt(l->fd, SOL_SOCKET, SO_PEERCRED, &uc, &sl) == 0)
		l->peer_pid = uc.pid;
}

static void link_ready(tp_link *l, bool cma_send)
{
	l->state = LS_READY;
	l->cma_send = cma_send && l->ctx->cma_enabled;
	KLOG_DEBUG("shm link to rank %d (pid %d) ready; large messages by %s", l->peer,
	           (int)l->peer_pid, l->cma_send ? "process_vm_readv" : "the ring");
}

/* An acceptor-side connection that never became a link: log why and forget it. */
void shm_acc_drop(tp_link *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "refused" when we turned a stranger away, "dropped" when the connection broke. */
void shm_acc_drop(tp_link *l, const char *fmt, ...)
{
	char what[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	KLOG_WARN("shm transport (rank %d): %s connection from pid %d: %s", l->ctx->rank,
	          l->refused ? "refused a" : "dropped a", (int)l->peer_pid, what);
	l->state = LS_DEAD;
}

/* Best effort: tell a refused peer why before dropping it. */
static void acc_send_last(tp_link *l, const void *msg, size_t len)
{
	if (send(l->fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* nothing more to do for a refused peer */
	}
}

static bool acc_hello(tp_link *l)
{
	tp_ctx *ctx = l->ctx;
	hs_hello *h = &l->hello;
	hs_challenge c;
	uint64_t ring = h->aux[SHM_AUX_RING_BYTES];
	uint32_t status;

	l->refused = true; /* until the checks pass */
	status = hs_hello_check(&ctx->hs, h);
	if (status == HS_NOT_KHOR) {
		shm_acc_drop(l, "bad magic 0x%08x (not a khor peer)", h->magic);
		return true;
	}
	if (status == HS_OK && (ring < 65536 || ring > (64u << 20) || (ring & (ring - 1)) != 0))
		status = HS_BAD_PARAMS;
	if (status != HS_OK) {
		hs_refusal(status, &c);
		acc_send_last(l, &c, sizeof(c));
		if (status == HS_BAD_PARAMS)
			shm_acc_drop(
			    l,
			    "it claims rank %d of job '%s', protocol %u: a ring of %llu bytes "
			    "(must be a power of two from 64 KiB to 64 MiB)",
			    h->from_rank, h->job_id, h->version, (unsigned long long)ring);
		else
			shm_acc_drop(l, "it claims rank %d of job '%s', protocol %u: %s",
			             h->from_rank, h->job_id, h->version, hs_status_str(status));
		return true;
	}
	l->refused = false;
	hs_challenge_make(&ctx->hs, h, (uint64_t)(uintptr_t)l->nonce_s, l->nonce_s, &c);
	if (!shm_hs_send(l, &c, sizeof(c), -1)) {
		shm_acc_drop(l, "sending the challenge: %s", shm_errstr(errno));
		return true;
	}
	l->hs_phase = 1;
	return true;
}

static bool acc_proof(tp_link *l, const hs_proof *p, int seg_fd)
{
	tp_ctx *ctx = l->ctx;
	hs_hello *h = &l->hello;
	hs_result r;
	const char *why = NULL;

	if (!hs_proof_check(&ctx->hs, h, l->nonce_s, p)) {
		l->refused = true;
		hs_result_make(HS_BAD_AUTH, 0, &r);
		acc_send_last(l, &r, sizeof(r));
		shm_acc_drop(l,
		             "it claims rank %d of job '%s' but failed the job secret check (a "
		             "stranger, or its KHOR_SECRET differs)",
		             h->from_rank, h->job_id);
		return true;
	}
	l->peer = h->from_rank;
	if (ctx->incoming[l->peer] != NULL) {
		l->refused = true;
		hs_result_make(HS_DUPLICATE, 0, &r);
		acc_send_last(l, &r, sizeof(r));
		shm_acc_drop(l, "rank %d already has a shared-memory link to this rank", l->peer);
		return true;
	}
	if (seg_fd < 0 || !seg_map_peer(l, seg_fd, &why)) {
		l->refused = true;
		hs_result_make(HS_BAD_PARAMS, 0, &r);
		acc_send_last(l, &r, sizeof(r));
		shm_acc_drop(l, "rank %d: %s", l->peer,
		             seg_fd < 0 ? "no segment came with its proof" : why);
		return true;
	}
	hs_result_make(HS_OK, cma_probe(l, h->aux[SHM_AUX_NONCE_ADDR], h->nonce_c), &r);
	if (!shm_hs_send(l, &r, sizeof(r), -1)) {
		shm_acc_drop(l, "rank %d: sending the handshake result: %s", l->peer,
		             shm_errstr(errno));
		return true;
	}
	ctx->incoming[l->peer] = l;
	link_ready(l, p->aux != 0);
	return true;
}

static bool conn_challenge(tp_link *l, const hs_challenge *c)
{
	hs_proof p;
	kerr e;
	khor_status st;

	st = hs_challenge_check(&l->ctx->hs, &l->hello, c, 0, &p, &e);
	if (st != KHOR_SUCCESS) {
		/* An acceptor that failed to prove the secret gets a proof that cannot pass (and no
		 * segment), so it logs a secret mismatch instead of a connection that went away. */
		if (c->magic == HS_MAGIC && c->status == HS_OK &&
		    send(l->fd, &p, sizeof(p), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			/* it is refused either way */
		}
		shm_link_fail(l, st, "%s", e.text);
		return true;
	}
	p.aux = cma_probe(l, c->aux, c->nonce_s);
	if (!shm_hs_send(l, &p, sizeof(p), l->seg_fd)) {
		shm_link_fail(l, KHOR_ERR_REMOTE, "handshake: sending the segment: %s",
		              shm_errstr(errno));
		return true;
	}
	l->hs_phase = 1;
	return true;
}

static bool conn_result(tp_link *l, const hs_result *r)
{
	kerr e;
	khor_status st = hs_result_check(r, &e);

	if (st != KHOR_SUCCESS) {
		shm_link_fail(l, st, "%s", e.text);
		return true;
	}
	/* The peer mapped the segment: our descriptor has done its job. From now on only the
	 * two mappings keep the memory alive, and both die with their processes. */
	close(l->seg_fd);
	l->seg_fd = -1;
	link_ready(l, r->aux != 0);
	return true;
}

/* Moves one handshake step if the socket allows. Returns true if anything happened. */
bool shm_hs_step(tp_link *l)
{
	const char *why = "?";
	int rc;

	if (l->state == LS_CONNECTING) {
		uint64_t now = kclock_ns();
		if (now < l->retry_at)
			return false;
		if (connect(l->fd, (struct sockaddr *)&l->peer_sa, l->peer_sa_len) < 0) {
			int e = errno;
			/* Refused: the peer has not bound yet (or died); full backlog: EAGAIN. */
			if ((e == ECONNREFUSED || e == EAGAIN || e == EINTR || e == ENOENT) &&
			    !kdeadline_passed(l->hs_deadline)) {
				l->retry_at = now + SHM_RETRY_NS;
				return false;
			}
			shm_link_fail(l, KHOR_ERR_REMOTE,
			              "connect to its socket: %s (is the peer on this "
			              "host, in this network namespace, and still running?)",
			              shm_errstr(e));
			return true;
		}
		shm_peer_cred(l);
		l->state = LS_HS;
		l->hs_phase = 0;
		if (!shm_hs_send(l, &l->hello, sizeof(l->hello), -1)) {
			shm_link_fail(l, KHOR_ERR_REMOTE, "handshake: sending HELLO: %s",
			              shm_errstr(errno));
			return true;
		}
		return true;
	}
	if (l->state != LS_HS)
		return false;
	if (l->out_len > 0) {
		if (!shm_hs_send(l, NULL, 0, -1)) {
			if (l->side == 1)
				shm_acc_drop(l, "handshake send: %s", shm_errstr(errno));
			else
				shm_link_fail(l, KHOR_ERR_REMOTE, "handshake send: %s",
				              shm_errstr(errno));
			return true;
		}
		if (l->out_len > 0)
			return false;
	}
	if (l->side == 1) {
		if (l->hs_phase == 0) {
			rc = hs_recv(l, &l->hello, sizeof(l->hello), NULL, &why);
			if (rc > 0)
				return acc_hello(l);
		} else {
			hs_proof p;
			int fd = -1;
			bool moved;
			rc = hs_recv(l, &p, sizeof(p), &fd, &why);
			if (rc > 0) {
				moved = acc_proof(l, &p, fd);
				if (fd >= 0)
					close(fd); /* mapped or refused: the mapping is all we keep */
				return moved;
			}
			if (fd >= 0)
				close(fd);
		}
		if (rc < 0) {
			shm_acc_drop(l, "during the handshake: %s", why);
			return true;
		}
		return false;
	}
	if (l->hs_phase == 0) {
		hs_challenge c;
		rc = hs_recv(l, &c, sizeof(c), NULL, &why);
		if (rc > 0)
			return conn_challenge(l, &c);
	} else {
		hs_result r;
		rc = hs_recv(l, &r, sizeof(r), NULL, &why);
		if (rc > 0)
			return conn_result(l, &r);
	}
	if (rc < 0) {
		shm_link_fail(l, KHOR_ERR_REMOTE,
		              "handshake: %s (the peer closed the connection: it "
		              "refused us, see its log, or it exited)",
		              why);
		return true;
	}
	return false;
}
