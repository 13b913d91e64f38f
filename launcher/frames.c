/*
 * frames.c -- the frame format between khorrun and its remote helper, and the writes under
 * it. khorrun queues frames per host and flushes them without blocking (it has many hosts
 * and ranks to watch); the helper has one peer and writes each frame whole, blocking.
 */
#include "frames.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * What a helper writes before its first frame, so that whatever a login script prints on
 * stdout ("Welcome to ...") is passed over and shown, not taken for a frame.
 */
const char frame_magic[] = "\001khorrun-helper\002";
_Static_assert(sizeof(frame_magic) - 1 == FRAME_MAGIC_LEN, "frames.h has the magic's length");

void frame_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

uint32_t frame_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

bool frame_buf_put(struct wbuf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *d;

		while (cap < b->len + n)
			cap *= 2;
		d = realloc(b->data, cap);
		if (d == NULL)
			return false;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return true;
}

bool frame_put(struct wbuf *b, char type, const void *a, size_t alen, const void *c,
               size_t clen)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t len = (uint32_t)(alen + clen);

	hdr[0] = (uint8_t)type;
	frame_put_u32(hdr + 1, len);
	return frame_buf_put(b, hdr, sizeof(hdr)) && frame_buf_put(b, a, alen) &&
	       (clen == 0 || frame_buf_put(b, c, clen));
}

bool frame_puts(struct wbuf *b, char type, const char *text)
{
	return frame_put(b, type, text, strlen(text), NULL, 0);
}

/* Writes what it can of b to a non-blocking fd; false when the fd is gone. */
bool frame_buf_flush(struct wbuf *b, int fd)
{
	while (b->off < b->len) {
		ssize_t w = write(fd, b->data + b->off, b->len - b->off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN;
		}
		b->off += (size_t)w;
	}
	b->off = b->len = 0;
	return true;
}

/*
 * Takes the first complete frame off buf (len bytes). Returns 1 with its type, payload and
 * size (the frame is hdr + *plen bytes), 0 when it is not all there yet, -1 when garbled.
 */
int frame_next(const char *buf, size_t len, char *type_out, const char **payload_out,
               size_t *plen_out)
{
	const uint8_t *u = (const uint8_t *)buf;
	uint32_t n;

	if (len < FRAME_HDR)
		return 0;
	n = frame_get_u32(u + 1);
	if (n > FRAME_MAX)
		return -1;
	if (len < FRAME_HDR + n)
		return 0;
	*type_out = buf[0];
	*payload_out = buf + FRAME_HDR;
	*plen_out = n;
	return 1;
}

/*
 * Writes all of iov (cnt entries, updated in place) to fd, retrying short writes and EINTR
 * and waiting out EAGAIN (someone made our stdout non-blocking); false once fd is gone.
 */
bool frame_write_all(int fd, struct iovec *iov, int cnt)
{
	while (cnt > 0) {
		ssize_t w = writev(fd, iov, cnt);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = fd, .events = POLLOUT };

				(void)poll(&p, 1, 1000);
				continue;
			}
			return false;
		}
		while (cnt > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return true;
}

/*
 * The helper's side: a frame to khorrun on stdout, written whole (blocking; khorrun reads
 * its helpers all the time). Once stdout is gone every frame is dropped.
 */
static bool helper_out_dead;

void frame_send(char type, const void *a, size_t alen, const void *b, size_t blen)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t len = (uint32_t)(alen + blen);
	struct iovec iov[3] = { { hdr, sizeof(hdr) }, { (void *)a, alen }, { (void *)b, blen } };
	struct iovec *v = iov;
	int cnt = 3;

	hdr[0] = (uint8_t)type;
	frame_put_u32(hdr + 1, len);
	if (!helper_out_dead && !frame_write_all(STDOUT_FILENO, v, cnt))
		helper_out_dead = true;
}

/* The helper stops its ranks once khorrun can no longer hear it. */
bool frame_send_failed(void)
{
	return helper_out_dead;
}

void frame_sendf(char type, const char *fmt, ...)
{
	char buf[256];
	int n;
	va_list ap;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	frame_send(type, buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1, NULL, 0);
}

/* n bytes from fd, up to dl (a silent peer is an error, like a closed one). */
static bool read_full(int fd, void *buf, size_t n, kdeadline dl)
{
	char *p = buf;

	while (n > 0) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int pr = poll(&pfd, 1, kdeadline_left_ms(dl, 1000));

		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0 || (pr == 0 && kdeadline_passed(dl)))
			return false;
		if (pr == 0)
			continue;
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

/* One frame from stdin, up to dl; its payload NUL-terminated in buf (FRAME_MAX + 1). */
bool frame_read(char *type_out, char *buf, size_t *len_out, kdeadline dl)
{
	uint8_t hdr[FRAME_HDR];
	uint32_t n;

	if (!read_full(STDIN_FILENO, hdr, sizeof(hdr), dl))
		return false;
	n = frame_get_u32(hdr + 1);
	if (n > FRAME_MAX || !read_full(STDIN_FILENO, buf, n, dl))
		return false;
	buf[n] = '\0';
	*type_out = (char)hdr[0];
	*len_out = n;
	return true;
}
