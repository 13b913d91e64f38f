/*
 * frames.h -- the bytes between khorrun and its remote helper: one frame is a type byte, a
 * 4-byte big-endian length and the payload. Both ends of an ssh connection are the same
 * khorrun, so this header is the whole protocol; it sits below everything else in launcher/.
 */
#ifndef KHOR_LAUNCHER_FRAMES_H
#define KHOR_LAUNCHER_FRAMES_H

#include "base/clock.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/*
 * Per stream line buffer. A line longer than this is cut into pieces of this size, each
 * printed as its own prefixed line: lossless, and it bounds memory at 2 buffers per rank.
 * A helper sends at most this much output in one frame.
 */
#define LINE_BUF (64 * 1024)
/* A frame between khorrun and a helper: type byte, 4-byte big-endian length, payload. */
#define FRAME_HDR 5
#define FRAME_MAX (LINE_BUF + 64)
/* Bumped whenever the frames change: both ends must be the same khorrun. */
#define HELPER_PROTO "khorrun-helper 2"

/*
 * What a helper writes before its first frame, so that whatever a login script prints on
 * stdout ("Welcome to ...") is passed over and shown, not taken for a frame.
 */
extern const char frame_magic[];
#define FRAME_MAGIC_LEN (sizeof("\001khorrun-helper\002") - 1)

/* Bytes waiting to be written to a non-blocking fd. */
struct wbuf {
	char *data;
	size_t len, off, cap;
};

/* The one coding of the frames' big-endian numbers (lengths, and the rank of an 'O'). */
void frame_put_u32(uint8_t *p, uint32_t v);
uint32_t frame_get_u32(const uint8_t *p);

/* khorrun's side: frames queued on a host's wbuf, flushed as its ssh's stdin takes them. */
bool frame_buf_put(struct wbuf *b, const void *p, size_t n);
bool frame_put(struct wbuf *b, char type, const void *a, size_t alen, const void *c,
               size_t clen);
bool frame_puts(struct wbuf *b, char type, const char *text);
bool frame_buf_flush(struct wbuf *b, int fd);
int frame_next(const char *buf, size_t len, char *type_out, const char **payload_out,
               size_t *plen_out);

bool frame_write_all(int fd, struct iovec *iov, int cnt);

/* The helper's side: frames to khorrun on stdout, and the start-up frames from stdin. */
void frame_send(char type, const void *a, size_t alen, const void *b, size_t blen);
void frame_sendf(char type, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool frame_send_failed(void);
bool frame_read(char *type_out, char *buf, size_t *len_out, kdeadline dl);

#endif
