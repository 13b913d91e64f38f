/*
 * fuzz_etcd.c -- libFuzzer harness for what reads an etcd endpoint's bytes: the JSON reader
 * (json.c) and the HTTP reply parser (http.c). The first input byte picks which; the rest
 * is a reply body, or a whole HTTP reply arriving on a socket, which is then parsed as a
 * unary reply or as a stream of lines. Every result is checked against the bounds the
 * etcd client relies on.
 *
 *   clang -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DKHOR_BUILDING_LIBRARY \
 *         -Iinclude -I. tests/rendezvous/fuzz_etcd.c rendezvous/json.c rendezvous/http.c \
 *         base/err.c base/clock.c base/log.c base/sock.c -lcrypto -o fuzz_etcd
 *   ./fuzz_etcd -max_total_time=60
 */
#include "rendezvous/http.h"
#include "rendezvous/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

/* Walks every token the way etcd.c reads replies: members, arrays, values. */
static void walk(const json_doc *d, int t, int depth)
{
	char s[64];
	uint8_t *b;
	size_t len;
	int64_t v;
	bool f;

	CHECK(t >= 0 && t < d->ntok);
	CHECK(depth <= JSON_MAX_DEPTH + 1);
	CHECK(d->tok[t].next > (uint32_t)t && d->tok[t].next <= (uint32_t)d->ntok);
	(void)json_i64(d, t, &v);
	(void)json_bool(d, t, &f);
	if (json_str(d, t, s, sizeof(s)))
		CHECK(strlen(s) < sizeof(s));
	if (json_b64(d, t, &b, &len)) {
		CHECK(b[len] == '\0');
		free(b);
	}
	if (d->tok[t].type == JSON_ARRAY) {
		uint32_t n = 0;
		for (int e = json_first(d, t); e >= 0; e = json_after(d, t, e), n++)
			walk(d, e, depth + 1);
		CHECK(n == d->tok[t].count);
	}
	if (d->tok[t].type == JSON_OBJECT) {
		(void)json_member(d, t, "header");
		(void)json_member(d, t, "kvs");
		int k = t + 1;
		for (uint32_t i = 0; i < d->tok[t].count; i++) {
			CHECK(d->tok[k].type == JSON_STRING);
			walk(d, k + 1, depth + 1);
			k = (int)d->tok[k + 1].next;
		}
		CHECK((uint32_t)k == d->tok[t].next);
	}
}

static void fuzz_json(const char *buf, size_t len)
{
	struct json_tok tok[256];
	char why[128];
	json_doc d;

	if (json_parse(buf, len, tok, 256, &d, why, sizeof(why))) {
		CHECK(d.ntok >= 1 && tok[0].next == (uint32_t)d.ntok);
		walk(&d, 0, 0);
	} else {
		CHECK(why[0] != '\0');
	}
}

/* The input as a server's reply on a socket, read as a call's reply or as a stream. */
static void fuzz_http(const uint8_t *buf, size_t len, bool stream)
{
	struct http_conn c;
	struct http_reply rep;
	ksockaddr none;
	int sv[2];
	kerr err;

	if (len > 100000 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return;
	memset(&none, 0, sizeof(none));
	http_init(&c, &none, "fuzz:1");
	c.in = malloc(65536);
	c.fd = sv[0];
	if (c.in == NULL || ksock_set_nonblock(sv[0], &err) != KHOR_SUCCESS ||
	    write(sv[1], buf, len) != (ssize_t)len) {
		close(sv[1]);
		http_free(&c);
		return;
	}
	shutdown(sv[1], SHUT_WR);
	if (!stream) {
		if (http_post(&c, "/v3/kv/range", "{}", 2, 4096, kdeadline_in_ms(1000), &rep, &err) ==
		    KHOR_SUCCESS) {
			CHECK(rep.len <= 4096 && rep.body[rep.len] == '\0');
			free(rep.body);
		}
	} else if (http_post_stream(&c, "/v3/watch", "{}", 2, 4096, kdeadline_in_ms(1000), &rep,
	                            &err) == KHOR_SUCCESS) {
		if (rep.body != NULL) {
			free(rep.body);
		} else {
			char *line;
			size_t n;
			for (int i = 0; i < 1000 && http_next_line(&c, kdeadline_in_ms(1000), &line, &n,
			                                            &err) == KHOR_SUCCESS;
			     i++)
				CHECK(n <= 4096 && line[n] == '\0' && memchr(line, '\n', n) == NULL);
		}
	}
	close(sv[1]);
	http_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *copy;

	if (size == 0)
		return 0;
	/* An exact-size heap copy, so ASan sees any read past the end of what arrived. */
	copy = malloc(size - 1 ? size - 1 : 1);
	if (copy == NULL)
		return 0;
	memcpy(copy, data + 1, size - 1);
	switch (data[0] % 3) {
	case 0:
		fuzz_json(copy, size - 1);
		break;
	case 1:
		fuzz_http((const uint8_t *)copy, size - 1, false);
		break;
	default:
		fuzz_http((const uint8_t *)copy, size - 1, true);
		break;
	}
	free(copy);
	return 0;
}
