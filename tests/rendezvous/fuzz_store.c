/*
 * fuzz_store.c -- libFuzzer harness for the store server's parsers, the code that reads
 * bytes from any process able to connect. The first input byte picks the parser; the rest
 * is what a client would have sent. Requests are parsed in a loop the way the server walks
 * its input buffer, and every result is checked against the limits the server relies on.
 *
 *   clang -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DKHOR_BUILDING_LIBRARY \
 *         -Iinclude -I. tests/rendezvous/fuzz_store.c rendezvous/store_server.c base/err.c \
 *         base/clock.c base/log.c base/auth.c base/sock.c -lcrypto -lpthread -o fuzz_store
 *   ./fuzz_store -max_total_time=60
 */
#include "rendezvous/store_proto.h"
#include "tests/support/fuzz_split.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

static void fuzz_requests(const uint8_t *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		struct store_request r;
		enum store_parse_result pr = store_parse_request(buf + off, len - off, &r);
		if (pr == STORE_PARSE_BAD) {
			CHECK(r.why != NULL);
			return;
		}
		if (pr == STORE_PARSE_NEED_MORE) {
			CHECK(r.total > len - off);
			CHECK(r.total <= STORE_REQ_HDR_LEN + STORE_KEY_MAX + STORE_VALUE_MAX);
			return;
		}
		CHECK(r.total <= len - off);
		CHECK(r.key_len >= 1 && r.key_len <= STORE_KEY_MAX);
		CHECK(r.val_len <= STORE_VALUE_MAX);
		CHECK(r.key == buf + off + STORE_REQ_HDR_LEN);
		CHECK(r.val + r.val_len == buf + off + r.total);
		CHECK(memchr(r.key, 0, r.key_len) == NULL);
		CHECK(r.op >= STORE_OP_SET && r.op <= STORE_OP_DEL);
		CHECK(r.op == STORE_OP_SET || r.val_len == 0);
		CHECK(r.op != STORE_OP_GET || r.arg >= 0);
		if (r.op == STORE_OP_SET) {
			/* A stored value is later parsed by ADD. */
			int64_t v;
			(void)store_parse_int64(r.val, r.val_len, &v);
		}
		off += r.total;
	}
}

static void fuzz_hello(const uint8_t *buf, size_t len)
{
	struct store_client_hello h;
	enum store_parse_result pr = store_parse_client_hello(buf, len, &h);

	if (pr == STORE_PARSE_OK) {
		CHECK(h.total <= len);
		CHECK(h.job_len <= STORE_JOB_ID_MAX);
		CHECK(h.job_id + h.job_len == buf + h.total);
	} else if (pr == STORE_PARSE_NEED_MORE) {
		CHECK(h.total > len && h.total <= STORE_CLIENT_HELLO_LEN + STORE_JOB_ID_MAX);
	} else {
		CHECK(h.why != NULL);
	}
}

static void fuzz_int64(const uint8_t *buf, size_t len)
{
	int64_t v;
	char back[32];

	if (!store_parse_int64(buf, len, &v))
		return;
	/* What parses prints back as the same text, except leading zeros and "-0" (accepted). */
	int n = snprintf(back, sizeof(back), "%lld", (long long)v);
	if (len > 0 && buf[0] != '0' && !(len > 1 && buf[0] == '-' && buf[1] == '0'))
		CHECK((size_t)n == len && memcmp(back, buf, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const fuzz_part parts[] = { fuzz_requests, fuzz_hello, fuzz_int64 };

	fuzz_split(data, size, 0, parts, sizeof(parts) / sizeof(parts[0]));
	return 0;
}
