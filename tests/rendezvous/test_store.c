/*
 * test_store.c -- the embedded TCP store over real loopback sockets: the contract every
 * backend passes (store_cases.h: the operations, waiting and timeouts, atomic counters
 * across processes, key prefixes), then what only this store does: its byte cap, its
 * handshake, and a server that keeps serving good clients while strangers, garbage and
 * silent sockets come at it.
 */
#include "base/auth.h"
#include "base/clock.h"
#include "rendezvous/store.h"
#include "rendezvous/store_proto.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define JOB "job-test"
#define SECRET "0123456789abcdef"

static store_server *start_server(const char *secret, const char *job)
{
	store_server *srv = NULL;
	kerr err;

	kerr_clear(&err);
	khor_status st = store_server_start("127.0.0.1", 0, secret, job, &srv, &err);
	cr_assert_eq(st, KHOR_SUCCESS, "server start: %s", err.text);
	cr_assert_neq(store_server_port(srv), 0);
	return srv;
}

static khor_status try_connect(store_server *srv, const char *secret, const char *job, store **s,
                               kerr *err)
{
	kerr_clear(err);
	return store_tcp_connect("127.0.0.1", store_server_port(srv), secret, job,
	                         kdeadline_in_ms(5000), s, err);
}

static store *connect_ok(store_server *srv)
{
	store *s = NULL;
	kerr err;

	khor_status st = try_connect(srv, SECRET, JOB, &s, &err);
	cr_assert_eq(st, KHOR_SUCCESS, "connect: %s", err.text);
	store_set_prefix(s, JOB, 0);
	return s;
}

/* The server still answers a fresh, good client. */
static void assert_serves(store_server *srv, const char *key)
{
	store *s = connect_ok(srv);
	void *v = NULL;
	size_t len = 0;
	kerr err;

	kerr_clear(&err);
	cr_assert_eq(store_set(s, key, "alive", 5, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_get(s, key, kdeadline_in_ms(2000), &v, &len, &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(len, 5);
	cr_assert_str_eq(v, "alive");
	free(v);
	store_close(s);
}

/* The backend the shared cases (store_cases.h) run against: the embedded TCP store. */
static store_server *backend_srv;

static uint16_t backend_start(void)
{
	backend_srv = start_server(SECRET, JOB);
	return store_server_port(backend_srv);
}

static void backend_stop(void)
{
	store_server_stop(backend_srv);
}

static khor_status backend_connect(uint16_t port, store **s, kerr *err)
{
	return store_tcp_connect("127.0.0.1", port, SECRET, JOB, kdeadline_in_ms(5000), s, err);
}

#define STORE_SUITE store
#define STORE_ADD_ROUNDS 1000
#define STORE_MANY_CLIENTS 300
#include "store_cases.h"

/* --- raw sockets, to speak bad protocol on purpose ------------------------------------- */

static int raw_connect(store_server *srv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(store_server_port(srv)) };
	struct timeval tv = { 3, 0 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static bool raw_read(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = recv(fd, p, len, 0);
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static void raw_send(int fd, const void *buf, size_t len)
{
	/* The server may already have dropped us; that is what some tests want. */
	(void)!send(fd, buf, len, MSG_NOSIGNAL);
}

/* True when the server closes fd (EOF or reset) within about 3 s. */
static bool raw_closed_by_server(int fd)
{
	uint8_t junk[4096];

	for (;;) {
		ssize_t n = recv(fd, junk, sizeof(junk), 0);
		if (n == 0)
			return true;
		if (n < 0)
			return errno == ECONNRESET;
	}
}

static void raw_handshake(int fd, const char *secret, const char *job)
{
	uint8_t sh[STORE_SERVER_HELLO_LEN], ch[STORE_CLIENT_HELLO_LEN + 64], w[STORE_WELCOME_LEN];
	size_t jl = strlen(job);

	cr_assert(raw_read(fd, sh, sizeof(sh)));
	cr_assert_eq(store_get_be32(sh), STORE_MAGIC_SERVER_HELLO);
	memset(ch, 0, sizeof(ch));
	store_put_be32(ch, STORE_MAGIC_CLIENT_HELLO);
	ch[4] = STORE_PROTO_VERSION;
	store_put_be16(ch + 6, (uint16_t)jl);
	cr_assert(kauth_random(ch + 8, 16));
	cr_assert(kauth_mac(secret, strlen(secret), STORE_LABEL_CLIENT, sh + 8, 16, job, jl, ch + 24));
	memcpy(ch + STORE_CLIENT_HELLO_LEN, job, jl);
	raw_send(fd, ch, STORE_CLIENT_HELLO_LEN + jl);
	cr_assert(raw_read(fd, w, sizeof(w)));
	cr_assert_eq(store_get_be32(w), STORE_MAGIC_WELCOME);
	cr_assert_eq(w[5], STORE_WELCOME_OK);
}

static size_t raw_request(uint8_t *buf, uint8_t op, uint32_t key_len, uint32_t val_len,
                          int64_t arg, const char *key, const char *val)
{
	memset(buf, 0, STORE_REQ_HDR_LEN);
	store_put_be32(buf, STORE_MAGIC_REQUEST);
	buf[4] = STORE_PROTO_VERSION;
	buf[5] = op;
	store_put_be32(buf + 8, key_len);
	store_put_be32(buf + 12, val_len);
	store_put_be64(buf + 16, (uint64_t)arg);
	size_t n = STORE_REQ_HDR_LEN;
	if (key != NULL) {
		memcpy(buf + n, key, strlen(key));
		n += strlen(key);
	}
	if (val != NULL) {
		memcpy(buf + n, val, strlen(val));
		n += strlen(val);
	}
	return n;
}

/* Reads one reply; returns its status and copies its value (NUL-terminated) into val. */
static int raw_reply(int fd, int64_t *arg, char *val, size_t val_cap)
{
	uint8_t h[STORE_REP_HDR_LEN];
	uint32_t vl;

	if (!raw_read(fd, h, sizeof(h)))
		return -1;
	cr_assert_eq(store_get_be32(h), STORE_MAGIC_REPLY);
	vl = store_get_be32(h + 8);
	cr_assert_lt(vl, val_cap);
	cr_assert(raw_read(fd, val, vl));
	val[vl] = '\0';
	if (arg != NULL)
		*arg = (int64_t)store_get_be64(h + 16);
	return h[5];
}

/* --- operations ------------------------------------------------------------------------ */

Test(store, store_byte_cap, .timeout = 30)
{
	store_server_bytes_max = 8192;
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	static char big[16384];
	void *v;
	size_t len;
	kerr err;

	memset(big, 'b', sizeof(big));
	cr_assert_eq(store_set(s, "small", "1", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_set(s, "big", big, sizeof(big), &err), KHOR_ERR_NO_MEMORY);
	cr_assert(strstr(err.text, "full") != NULL, "%s", err.text);
	cr_assert_eq(store_get(s, "small", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	free(v);
	/* Freed room can be used again. */
	cr_assert_eq(store_set(s, "a", big, 6000, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_set(s, "b", big, 6000, &err), KHOR_ERR_NO_MEMORY);
	cr_assert_eq(store_del(s, "a", &err), KHOR_SUCCESS);
	cr_assert_eq(store_set(s, "b", big, 6000, &err), KHOR_SUCCESS, "%s", err.text);
	store_close(s);
	store_server_stop(srv);
}

Test(store, stopped_server_is_a_remote_error, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	char port[16];
	kerr err;

	snprintf(port, sizeof(port), ":%u", store_server_port(srv));
	store_server_stop(srv);
	cr_assert_eq(store_set(s, "k", "v", 1, &err), KHOR_ERR_REMOTE);
	cr_assert(strstr(err.text, "store at 127.0.0.1") != NULL && strstr(err.text, port) != NULL &&
	              strstr(err.text, "set 'job-test/0/k'") != NULL,
	          "%s", err.text);
	/* And stays failed, saying so. */
	cr_assert_eq(store_set(s, "k", "v", 1, &err), KHOR_ERR_REMOTE);
	store_close(s);
}

/* --- strangers and garbage ------------------------------------------------------------- */

Test(store, wrong_secret_or_job_refused, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = NULL;
	kerr err;

	cr_assert_eq(try_connect(srv, "not-the-secret", JOB, &s, &err), KHOR_ERR_AUTH);
	cr_assert(strstr(err.text, "secret") != NULL, "%s", err.text);
	cr_assert_eq(try_connect(srv, "", JOB, &s, &err), KHOR_ERR_AUTH);
	cr_assert_eq(try_connect(srv, SECRET, "other-job", &s, &err), KHOR_ERR_AUTH);
	cr_assert(strstr(err.text, "other-job") != NULL, "%s", err.text);
	assert_serves(srv, "after-strangers");
	store_server_stop(srv);

	/* Without a secret, framing and the job id are still checked. */
	srv = start_server("", JOB);
	cr_assert_eq(try_connect(srv, "", JOB, &s, &err), KHOR_SUCCESS, "%s", err.text);
	store_close(s);
	cr_assert_eq(try_connect(srv, "something", JOB, &s, &err), KHOR_ERR_AUTH);
	cr_assert_eq(try_connect(srv, "", "other-job", &s, &err), KHOR_ERR_AUTH);
	store_server_stop(srv);
}

struct fake_server {
	int listen_fd;
	bool speak_khor; /* false: greet like an SSH server */
};

/* Greets like a store, then "welcomes" the client with a proof it cannot have made. */
static void *fake_server_main(void *p)
{
	struct fake_server *f = p;
	uint8_t buf[STORE_CLIENT_HELLO_LEN + 64] = { 0 };
	int fd = accept(f->listen_fd, NULL, NULL);

	if (fd < 0)
		return NULL;
	if (!f->speak_khor) {
		raw_send(fd, "SSH-2.0-OpenSSH_9.6\r\nxxxxxx", 27);
	} else {
		store_put_be32(buf, STORE_MAGIC_SERVER_HELLO);
		buf[4] = STORE_PROTO_VERSION;
		raw_send(fd, buf, STORE_SERVER_HELLO_LEN);
		raw_read(fd, buf, STORE_CLIENT_HELLO_LEN + strlen(JOB));
		memset(buf, 0, sizeof(buf));
		store_put_be32(buf, STORE_MAGIC_WELCOME);
		buf[4] = STORE_PROTO_VERSION;
		buf[5] = STORE_WELCOME_OK;
		raw_send(fd, buf, STORE_WELCOME_LEN);
	}
	raw_closed_by_server(fd); /* wait for the client to hang up */
	close(fd);
	return NULL;
}

static khor_status connect_to_fake(bool speak_khor, kerr *err)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	struct fake_server f = { socket(AF_INET, SOCK_STREAM, 0), speak_khor };
	pthread_t th;
	store *s = NULL;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(f.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(f.listen_fd, 4), 0);
	getsockname(f.listen_fd, (struct sockaddr *)&a, &al);
	pthread_create(&th, NULL, fake_server_main, &f);
	kerr_clear(err);
	khor_status st = store_tcp_connect("127.0.0.1", ntohs(a.sin_port), SECRET, JOB,
	                                   kdeadline_in_ms(5000), &s, err);
	cr_assert_neq(st, KHOR_SUCCESS);
	pthread_join(th, NULL);
	close(f.listen_fd);
	return st;
}

Test(store, impostor_or_stranger_server_detected, .timeout = 30)
{
	kerr err;

	cr_assert_eq(connect_to_fake(true, &err), KHOR_ERR_AUTH);
	cr_assert(strstr(err.text, "not this job's store") != NULL, "%s", err.text);
	cr_assert_eq(connect_to_fake(false, &err), KHOR_ERR_PROTOCOL);
	cr_assert(strstr(err.text, "not a khor store") != NULL, "%s", err.text);
}

Test(store, garbage_before_handshake, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	uint8_t junk[4096];
	int fd;

	/* Random bytes. */
	fd = raw_connect(srv);
	cr_assert(kauth_random(junk, sizeof(junk)));
	junk[0] = 'G'; /* make sure the magic is wrong */
	raw_send(fd, junk, sizeof(junk));
	cr_assert(raw_closed_by_server(fd));
	close(fd);

	/* An HTTP request, a common stray. */
	fd = raw_connect(srv);
	raw_send(fd, "GET / HTTP/1.0\r\n\r\n", 18);
	cr_assert(raw_closed_by_server(fd));
	close(fd);

	/* A client hello declaring a 60000-byte job id. */
	uint8_t ch[STORE_CLIENT_HELLO_LEN] = { 0 };
	store_put_be32(ch, STORE_MAGIC_CLIENT_HELLO);
	ch[4] = STORE_PROTO_VERSION;
	store_put_be16(ch + 6, 60000);
	fd = raw_connect(srv);
	raw_send(fd, ch, sizeof(ch));
	cr_assert(raw_closed_by_server(fd));
	close(fd);

	/* A truncated hello, then gone. */
	fd = raw_connect(srv);
	raw_send(fd, ch, 10);
	close(fd);

	assert_serves(srv, "after-garbage");
	store_server_stop(srv);
}

static void expect_malformed(store_server *srv, const void *req, size_t len)
{
	char text[STORE_REPLY_TEXT_MAX + 1];
	int fd = raw_connect(srv);

	raw_handshake(fd, SECRET, JOB);
	raw_send(fd, req, len);
	cr_assert_eq(raw_reply(fd, NULL, text, sizeof(text)), STORE_REPLY_MALFORMED);
	cr_assert(strstr(text, "malformed") != NULL, "%s", text);
	cr_assert(raw_closed_by_server(fd));
	close(fd);
}

Test(store, garbage_after_handshake, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	uint8_t req[STORE_REQ_HDR_LEN + 1024];
	int fd;

	/* A header declaring a 4 GiB value. */
	raw_request(req, STORE_OP_SET, 3, 0xFFFFFFFFu, 0, "abc", NULL);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 3);
	/* A key over the limit. */
	raw_request(req, STORE_OP_SET, STORE_KEY_MAX + 1, 1, 0, NULL, NULL);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN);
	/* A key length of 4 GiB, an unknown op, a bad version, a NUL in the key. */
	raw_request(req, STORE_OP_GET, 0xFFFFFFFFu, 0, 0, NULL, NULL);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN);
	raw_request(req, 77, 1, 0, 0, "k", NULL);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 1);
	raw_request(req, STORE_OP_GET, 1, 0, 0, "k", NULL);
	req[4] = 9;
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 1);
	raw_request(req, STORE_OP_DEL, 3, 0, 0, "a", NULL);
	memcpy(req + STORE_REQ_HDR_LEN, "a\0b", 3);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 3);
	/* A GET with a value, a negative timeout. */
	raw_request(req, STORE_OP_GET, 1, 1, 0, "k", "v");
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 2);
	raw_request(req, STORE_OP_GET, 1, 0, -1, "k", NULL);
	expect_malformed(srv, req, STORE_REQ_HDR_LEN + 1);
	/* Random junk. */
	cr_assert(kauth_random(req, sizeof(req)));
	req[0] = 'X';
	expect_malformed(srv, req, sizeof(req));

	/* A truncated header, then the client leaves. */
	fd = raw_connect(srv);
	raw_handshake(fd, SECRET, JOB);
	raw_request(req, STORE_OP_SET, 1, 1, 0, "k", "v");
	raw_send(fd, req, 10);
	close(fd);
	/* A whole header and half its value, then the client leaves. */
	fd = raw_connect(srv);
	raw_handshake(fd, SECRET, JOB);
	raw_request(req, STORE_OP_SET, 1, 1000, 0, "k", NULL);
	raw_send(fd, req, STORE_REQ_HDR_LEN + 1 + 500);
	close(fd);

	assert_serves(srv, "after-garbage");
	store_server_stop(srv);
}

Test(store, pipelined_requests_answered_in_order, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	uint8_t req[4096];
	char text[128];
	int64_t arg;
	size_t n = 0;
	int fd = raw_connect(srv);

	raw_handshake(fd, SECRET, JOB);
	/* A GET that must wait, with more requests queued behind it. */
	n += raw_request(req + n, STORE_OP_GET, 1, 0, 5000, "w", NULL);
	n += raw_request(req + n, STORE_OP_ADD, 1, 0, 5, "c", NULL);
	n += raw_request(req + n, STORE_OP_GET, 1, 0, 0, "c", NULL);
	raw_send(fd, req, n);
	sleep_ms(100);

	store *s = case_connect_raw(store_server_port(srv));
	kerr err;
	cr_assert_eq(store_set(s, "w", "woken", 5, &err), KHOR_SUCCESS);
	cr_assert_eq(raw_reply(fd, NULL, text, sizeof(text)), STORE_REPLY_OK);
	cr_assert_str_eq(text, "woken");
	cr_assert_eq(raw_reply(fd, &arg, text, sizeof(text)), STORE_REPLY_OK);
	cr_assert_eq(arg, 5);
	cr_assert_eq(raw_reply(fd, NULL, text, sizeof(text)), STORE_REPLY_OK);
	cr_assert_str_eq(text, "5");
	close(fd);
	store_close(s);
	store_server_stop(srv);
}

Test(store, silent_clients_block_nobody, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	uint8_t req[64];
	int quiet = raw_connect(srv);  /* never answers the greeting */
	int half = raw_connect(srv);   /* authenticates, then sends half a header */
	int waiter = raw_connect(srv); /* a GET that waits, and never reads its replies */

	raw_handshake(half, SECRET, JOB);
	raw_request(req, STORE_OP_SET, 1, 1, 0, "k", "v");
	raw_send(half, req, 7);
	raw_handshake(waiter, SECRET, JOB);
	raw_send(waiter, req, raw_request(req, STORE_OP_GET, 4, 0, 20000, "zzzz", NULL));

	uint64_t t0 = kclock_ns();
	assert_serves(srv, "busy");
	cr_assert_lt(elapsed_ms(t0), 2000);
	close(quiet);
	close(half);
	close(waiter);
	assert_serves(srv, "busy2");
	store_server_stop(srv);
}

Test(store, silent_handshake_dropped_at_deadline, .timeout = 30)
{
	store_server_handshake_ms = 300;
	store_server *srv = start_server(SECRET, JOB);
	int fd = raw_connect(srv);
	uint8_t sh[STORE_SERVER_HELLO_LEN];

	uint64_t t0 = kclock_ns();
	cr_assert(raw_read(fd, sh, sizeof(sh)));
	cr_assert(raw_closed_by_server(fd));
	int64_t ms = elapsed_ms(t0);
	cr_assert(ms >= 200 && ms < 2900, "dropped after %lld ms", (long long)ms);
	close(fd);
	assert_serves(srv, "after-silence");
	store_server_stop(srv);
}
