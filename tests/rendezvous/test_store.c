/*
 * test_store.c -- the embedded TCP store over real loopback sockets: the operations, waiting
 * and timeouts, atomic counters across processes, key prefixes, and a server that keeps
 * serving good clients while strangers, garbage and silent sockets come at it.
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

/*
 * Child processes are forked before the server thread exists (a fork while another thread
 * holds a libc, libcrypto or sanitizer lock can leave the child deadlocked) and learn the
 * server's port through this pipe once it runs.
 */
static uint16_t gate_wait(int gate[2])
{
	uint16_t port = 0;

	close(gate[1]);
	if (read(gate[0], &port, sizeof(port)) != sizeof(port))
		_exit(10);
	close(gate[0]);
	return port;
}

static void gate_open(int gate[2], int children, uint16_t port)
{
	close(gate[0]);
	for (int i = 0; i < children; i++)
		cr_assert_eq(write(gate[1], &port, sizeof(port)), sizeof(port));
	close(gate[1]);
}

static khor_status child_connect(uint16_t port, store **s, kerr *err)
{
	khor_status st = store_tcp_connect("127.0.0.1", port, SECRET, JOB, kdeadline_in_ms(5000),
	                                   s, err);
	if (st == KHOR_SUCCESS)
		store_set_prefix(*s, JOB, 0);
	return st;
}

static store *connect_unprefixed(store_server *srv)
{
	store *s = NULL;
	kerr err;

	khor_status st = try_connect(srv, SECRET, JOB, &s, &err);
	cr_assert_eq(st, KHOR_SUCCESS, "connect: %s", err.text);
	return s;
}

static int64_t elapsed_ms(uint64_t t0)
{
	return (int64_t)((kclock_ns() - t0) / 1000000);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

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

Test(store, set_get_roundtrip, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	void *v = NULL;
	size_t len = 0;
	kerr err;

	kerr_clear(&err);
	cr_assert_eq(store_set(s, "addr/0", "10.0.0.1:4000", 13, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(1000), &v, &len, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_eq(len, 13);
	cr_assert_str_eq(v, "10.0.0.1:4000"); /* NUL-terminated one past the length */
	free(v);

	/* Overwrite, then an empty value. */
	cr_assert_eq(store_set(s, "addr/0", "x", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "x");
	free(v);
	cr_assert_eq(store_set(s, "empty", "", 0, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "empty", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_eq(len, 0);
	cr_assert_eq(((char *)v)[0], '\0');
	free(v);

	/* The largest value allowed goes through intact; one byte more is refused locally. */
	uint8_t *big = malloc(STORE_VALUE_MAX + 1);
	for (size_t i = 0; i <= STORE_VALUE_MAX; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	cr_assert_eq(store_set(s, "big", big, STORE_VALUE_MAX, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_get(s, "big", kdeadline_in_ms(5000), &v, &len, &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(len, STORE_VALUE_MAX);
	cr_assert_eq(memcmp(v, big, len), 0);
	free(v);
	cr_assert_eq(store_set(s, "big", big, STORE_VALUE_MAX + 1, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "'job-test/0/big'") != NULL, "%s", err.text);
	free(big);

	/* Still usable after a refused call. */
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	free(v);
	store_close(s);
	store_server_stop(srv);
}

struct setter_arg {
	store_server *srv;
	int delay_ms;
	const char *key;
	const char *val;
	khor_status st; /* Criterion asserts only on the test's own thread */
};

static void *setter_thread(void *p)
{
	struct setter_arg *a = p;
	store *s = NULL;
	kerr err;

	a->st = try_connect(a->srv, SECRET, JOB, &s, &err);
	if (a->st != KHOR_SUCCESS)
		return NULL;
	store_set_prefix(s, JOB, 0);
	sleep_ms(a->delay_ms);
	a->st = store_set(s, a->key, a->val, strlen(a->val), &err);
	store_close(s);
	return NULL;
}

Test(store, get_waits_for_a_thread, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	struct setter_arg a = { srv, 300, "late", "here", KHOR_ERR_INTERNAL };
	pthread_t th;
	void *v = NULL;
	size_t len;
	kerr err;

	pthread_create(&th, NULL, setter_thread, &a);
	uint64_t t0 = kclock_ns();
	cr_assert_eq(store_get(s, "late", kdeadline_in_ms(10000), &v, &len, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_geq(elapsed_ms(t0), 200);
	cr_assert_str_eq(v, "here");
	free(v);
	pthread_join(th, NULL);
	cr_assert_eq(a.st, KHOR_SUCCESS);
	store_close(s);
	store_server_stop(srv);
}

Test(store, get_waits_for_another_process, .timeout = 30)
{
	int gate[2];
	void *v = NULL;
	size_t len;
	kerr err;
	int status;

	cr_assert_eq(pipe(gate), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		store *c = NULL;
		uint16_t port = gate_wait(gate);
		sleep_ms(300);
		if (child_connect(port, &c, &err) != KHOR_SUCCESS)
			_exit(2);
		_exit(store_set(c, "from-child", "42", 2, &err) == KHOR_SUCCESS ? 0 : 3);
	}
	store_server *srv = start_server(SECRET, JOB);
	gate_open(gate, 1, store_server_port(srv));
	store *s = connect_ok(srv);
	cr_assert_eq(store_get(s, "from-child", kdeadline_in_ms(10000), &v, &len, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_str_eq(v, "42");
	free(v);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	store_close(s);
	store_server_stop(srv);
}

Test(store, get_times_out, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	void *v = NULL;
	size_t len;
	kerr err;
	char port[16];

	uint64_t t0 = kclock_ns();
	cr_assert_eq(store_get(s, "never", kdeadline_in_ms(300), &v, &len, &err), KHOR_ERR_TIMEOUT);
	int64_t ms = elapsed_ms(t0);
	cr_assert(ms >= 250 && ms < 3000, "took %lld ms", (long long)ms);
	cr_assert(strstr(err.text, "'job-test/0/never'") != NULL, "%s", err.text);
	snprintf(port, sizeof(port), ":%u", store_server_port(srv));
	cr_assert(strstr(err.text, "127.0.0.1") != NULL && strstr(err.text, port) != NULL, "%s",
	          err.text);

	/* A deadline already passed is a plain lookup. */
	t0 = kclock_ns();
	cr_assert_eq(store_get(s, "never", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_lt(elapsed_ms(t0), 1000);
	cr_assert_eq(store_set(s, "now", "1", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "now", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	free(v);
	store_close(s);
	store_server_stop(srv);
}

Test(store, add_is_atomic_across_processes, .timeout = 60)
{
	pid_t pids[4];
	int gate[2];
	kerr err;

	cr_assert_eq(pipe(gate), 0);
	for (int p = 0; p < 4; p++) {
		pids[p] = fork();
		cr_assert_geq(pids[p], 0);
		if (pids[p] == 0) {
			store *c = NULL;
			int64_t last = 0, now;
			if (child_connect(gate_wait(gate), &c, &err) != KHOR_SUCCESS)
				_exit(2);
			for (int i = 0; i < 1000; i++) {
				if (store_add(c, "counter", 1, &now, &err) != KHOR_SUCCESS)
					_exit(3);
				if (now <= last || now > 4000) /* each sees strictly growing values */
					_exit(4);
				last = now;
			}
			store_close(c);
			_exit(0);
		}
	}
	store_server *srv = start_server(SECRET, JOB);
	gate_open(gate, 4, store_server_port(srv));
	for (int p = 0; p < 4; p++) {
		int status;
		cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d exit %d", p,
		          WEXITSTATUS(status));
	}
	store *s = connect_ok(srv);
	int64_t v;
	void *txt;
	size_t len;
	cr_assert_eq(store_add(s, "counter", 0, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, 4000);
	cr_assert_eq(store_get(s, "counter", kdeadline_in_ms(0), &txt, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(txt, "4000");
	free(txt);
	store_close(s);
	store_server_stop(srv);
}

Test(store, add_semantics, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	int64_t v = 0;
	kerr err;

	cr_assert_eq(store_add(s, "n", -5, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, -5);
	cr_assert_eq(store_add(s, "n", 7, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, 2);
	cr_assert_eq(store_set(s, "n", "9223372036854775806", 19, &err), KHOR_SUCCESS);
	cr_assert_eq(store_add(s, "n", 1, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, INT64_MAX);
	cr_assert_eq(store_add(s, "n", 1, &v, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "overflow") != NULL, "%s", err.text);
	cr_assert_eq(store_set(s, "word", "ten", 3, &err), KHOR_SUCCESS);
	cr_assert_eq(store_add(s, "word", 1, &v, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "not a decimal integer") != NULL, "%s", err.text);
	/* The connection survives refused values. */
	cr_assert_eq(store_add(s, "fresh", 3, &v, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(v, 3);
	store_close(s);
	store_server_stop(srv);
}

Test(store, del_removes_keys, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *s = connect_ok(srv);
	void *v = NULL;
	size_t len;
	kerr err;

	cr_assert_eq(store_set(s, "k", "v", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_del(s, "k", &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_del(s, "k", &err), KHOR_SUCCESS); /* absent is fine */
	cr_assert_eq(store_del(s, "never-set", &err), KHOR_SUCCESS);
	cr_assert_eq(store_set(s, "k", "w", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "w");
	free(v);
	store_close(s);
	store_server_stop(srv);
}

Test(store, prefix_isolates_jobs_and_generations, .timeout = 30)
{
	store_server *srv = start_server(SECRET, JOB);
	store *a = connect_ok(srv), *b = connect_ok(srv);
	void *v = NULL;
	size_t len;
	kerr err;

	store_set_prefix(a, "jobA", 0);
	store_set_prefix(b, "jobA", 1);
	cr_assert_eq(store_set(a, "k", "gen0", 4, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_set(b, "k", "gen1", 4, &err), KHOR_SUCCESS);
	store_set_prefix(b, "jobB", 0);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_get(a, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "gen0");
	free(v);
	/* Without a prefix, the full key names the same entry. */
	store *raw = connect_unprefixed(srv);
	cr_assert_eq(store_get(raw, "jobA/1/k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "gen1");
	free(v);
	store_close(raw);

	/* A job id that cannot make a prefix, and keys over the limit, are refused. */
	store_set_prefix(b, "a/b", 0);
	cr_assert_eq(store_set(b, "k", "x", 1, &err), KHOR_ERR_INVALID_ARG);
	char longjob[200];
	memset(longjob, 'j', sizeof(longjob) - 1);
	longjob[sizeof(longjob) - 1] = '\0';
	store_set_prefix(b, longjob, 0);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_INVALID_ARG);
	char longkey[STORE_KEY_MAX + 1];
	memset(longkey, 'k', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	cr_assert_eq(store_set(a, longkey, "x", 1, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "over the limit") != NULL, "%s", err.text);
	cr_assert_eq(store_set(a, "", "x", 1, &err), KHOR_ERR_INVALID_ARG);
	store_close(a);
	store_close(b);
	store_server_stop(srv);
}

Test(store, many_waiters_all_woken, .timeout = 30)
{
	enum { N = 32 };
	pid_t pids[N];
	int gate[2];
	kerr err;

	cr_assert_eq(pipe(gate), 0);
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		cr_assert_geq(pids[i], 0);
		if (pids[i] == 0) {
			store *c = NULL;
			void *v;
			size_t len;
			if (child_connect(gate_wait(gate), &c, &err) != KHOR_SUCCESS)
				_exit(2);
			if (store_add(c, "ready", 1, NULL, &err) != KHOR_SUCCESS)
				_exit(3);
			if (store_get(c, "go", kdeadline_in_ms(10000), &v, &len, &err) != KHOR_SUCCESS)
				_exit(4);
			_exit(strcmp(v, "now") == 0 ? 0 : 5);
		}
	}
	store_server *srv = start_server(SECRET, JOB);
	gate_open(gate, N, store_server_port(srv));
	store *s = connect_ok(srv);
	int64_t ready = 0;
	uint64_t t0 = kclock_ns();
	while (ready < N && elapsed_ms(t0) < 10000) {
		cr_assert_eq(store_add(s, "ready", 0, &ready, &err), KHOR_SUCCESS);
		sleep_ms(10);
	}
	cr_assert_eq(ready, N);
	cr_assert_eq(store_set(s, "go", "now", 3, &err), KHOR_SUCCESS);
	for (int i = 0; i < N; i++) {
		int status;
		cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "waiter %d exit %d", i,
		          WEXITSTATUS(status));
	}
	store_close(s);
	store_server_stop(srv);
}

Test(store, many_clients, .timeout = 60)
{
	enum { N = 300 };
	store_server *srv = start_server(SECRET, JOB);
	store *c[N];
	char key[32], val[32];
	kerr err;

	for (int i = 0; i < N; i++) {
		c[i] = connect_ok(srv);
		snprintf(key, sizeof(key), "addr/%d", i);
		snprintf(val, sizeof(val), "host%d", i);
		cr_assert_eq(store_set(c[i], key, val, strlen(val), &err), KHOR_SUCCESS, "%s", err.text);
	}
	for (int i = 0; i < N; i++) {
		void *v;
		size_t len;
		snprintf(key, sizeof(key), "addr/%d", (i + 1) % N);
		snprintf(val, sizeof(val), "host%d", (i + 1) % N);
		cr_assert_eq(store_get(c[i], key, kdeadline_in_ms(2000), &v, &len, &err), KHOR_SUCCESS);
		cr_assert_str_eq(v, val);
		free(v);
	}
	for (int i = 0; i < N; i++)
		store_close(c[i]);
	store_server_stop(srv);
}

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

	store *s = connect_unprefixed(srv);
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
