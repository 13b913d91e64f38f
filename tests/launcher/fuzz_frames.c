/*
 * fuzz_frames.c -- libFuzzer harness for khorrun's frames and its remote helper's start-up:
 * the bytes between khorrun and `khorrun --remote-helper` over ssh (launcher/frames.h).
 * Input byte 0 picks the target (mod 2), the rest is what the other end sent:
 *
 *   0  a stream cut into frames by frame_next, as khorrun reads a helper (ssh.c) and a
 *      helper reads khorrun after the start (loop.c): each frame lies inside the bytes, is
 *      at most FRAME_MAX, and written again with frame_put gives the very bytes it took; a
 *      garbled header is refused, never skipped over;
 *   1  the helper's start-up: the stream on the helper's stdin (a pipe), read by frame_read
 *      and taken by helper_take as helper_main does, up to "go" or the first refusal. What
 *      it keeps is what the frames said: terminated strings, a NULL-terminated argv, at most
 *      MAX_RANKS ranks, a grace period that is not negative (as --grace requires).
 *
 *   .ci/fuzz builds it with every launcher file but khorrun.c (helper.c's callers' callees)
 *   ./fuzz_frames -max_total_time=60
 */
#include "launcher/frames.h"
#include "launcher/helper.h"
#include "launcher/job.h"
#include "tests/support/fuzz_split.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

static void fuzz_stream(const uint8_t *d, size_t n)
{
	const char *buf = (const char *)d;
	size_t pos = 0;

	for (;;) {
		char type;
		const char *payload;
		size_t plen;
		int rc = frame_next(buf + pos, n - pos, &type, &payload, &plen);
		if (rc == 0) {
			/* Not all there: a header is short, or announces more than came. */
			CHECK(n - pos < FRAME_HDR ||
			      FRAME_HDR + (size_t)frame_get_u32(d + pos + 1) > n - pos);
			return;
		}
		if (rc < 0) {
			CHECK(n - pos >= FRAME_HDR && frame_get_u32(d + pos + 1) > FRAME_MAX);
			return;
		}
		CHECK(rc == 1 && plen <= FRAME_MAX && payload == buf + pos + FRAME_HDR);
		CHECK(pos + FRAME_HDR + plen <= n && type == buf[pos]);
		/* The same frame written again is the same bytes. */
		struct wbuf w = { 0 };
		size_t half = plen / 2;
		CHECK(frame_put(&w, type, payload, half, payload + half, plen - half));
		CHECK(w.len - w.off == FRAME_HDR + plen && memcmp(w.data + w.off, buf + pos, w.len) == 0);
		free(w.data);
		pos += FRAME_HDR + plen;
	}
}

static void fuzz_startup(const uint8_t *d, size_t n)
{
	int p[2];
	struct helper_start hs;
	char *buf = malloc(FRAME_MAX + 1);

	CHECK(buf != NULL && pipe(p) == 0);
	(void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	CHECK(dup2(p[0], STDIN_FILENO) == STDIN_FILENO);
	close(p[0]);
	if (n > 0)
		CHECK(write(p[1], d, n) == (ssize_t)n);
	close(p[1]);
	helper_start_init(&hs);
	kdeadline dl = kdeadline_in_ms(1000);
	int rc = 0;
	while (rc == 0) {
		char type;
		size_t len;
		if (!frame_read(&type, buf, &len, dl))
			break;
		CHECK(len <= FRAME_MAX && buf[len] == '\0');
		rc = helper_take(&hs, type, buf, len);
		CHECK(rc >= -1 && rc <= 1);
		CHECK((rc == 1) == hs.go);
		CHECK(memchr(hs.why, '\0', sizeof(hs.why)) != NULL);
	}
	CHECK(hs.nranks >= 0 && hs.nranks <= MAX_RANKS);
	CHECK(hs.nranks == 0 || (hs.ids != NULL && hs.hslots != NULL));
	for (int r = 0; r < hs.nranks; r++)
		for (size_t k = 0; k < NSLOTS; k++)
			CHECK(memchr(hs.hslots[r][k], '\0', SLOT_LEN) != NULL);
	CHECK(hs.nargv == 0 || hs.argv[hs.nargv] == NULL);
	for (size_t i = 0; i < hs.nargv; i++)
		CHECK(hs.argv[i] != NULL);
	for (size_t i = 0; i < hs.nenv; i++)
		CHECK(strchr(hs.env[i], '=') != NULL);
	if (hs.go)
		CHECK(hs.grace >= 0);
	helper_start_free(&hs);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const fuzz_part parts[] = { fuzz_stream, fuzz_startup };

	fuzz_split(data, size, 512u << 10, parts, sizeof(parts) / sizeof(parts[0]));
	return 0;
}
