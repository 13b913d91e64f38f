/*
 * store_server.c -- the embedded rendezvous store: one thread, one epoll loop, non-blocking
 * sockets, any number of clients (khorrun plus thousands of ranks). No client can stall the
 * thread: every socket is non-blocking, a request is acted on only once all its bytes are
 * in, and each connection that waits for anything (a handshake, a key) has a deadline in a
 * min-heap whose top sets the epoll_wait timeout.
 *
 * Wire format, all integers big-endian, version 1:
 *
 *   server hello   "KSTH" ver:u8 0:u24 server_nonce[16]                            24 bytes
 *   client hello   "KSTC" ver:u8 0:u8 job_len:u16 client_nonce[16] mac[32] job_id  56+job_len
 *                  mac = HMAC-SHA256(secret, "khor-store-v1 client" || server_nonce || job_id)
 *   welcome        "KSTW" ver:u8 status:u8 0:u16 proof[32]                          40 bytes
 *                  proof = HMAC-SHA256(secret, "khor-store-v1 server" || client_nonce || job_id)
 *                  (all zero unless status is OK; the server then closes)
 *   request        "KSRQ" ver:u8 op:u8 0:u16 key_len:u32 val_len:u32 arg:i64 key val
 *   reply          "KSRP" ver:u8 status:u8 0:u16 val_len:u32 0:u32 arg:i64 val
 *
 * Ops: SET (key, val), GET (key; arg = ms to wait, 0 = just look), ADD (key; arg = delta;
 * reply arg = new value; the value is kept as decimal text so GET reads it), DEL (key).
 * 1 <= key_len <= STORE_KEY_MAX with no NUL byte; val_len <= STORE_VALUE_MAX and 0 for
 * everything but SET. Error replies carry a short reason as their value. A request that
 * breaks the format gets a MALFORMED reply, is logged, and its client is dropped; a failed
 * handshake is logged with the client's address and dropped. Either way the others go on.
 *
 * A client sends one request at a time and waits for its reply (store.h: one thread per
 * store object); the server still copes with pipelined requests, answering them in order.
 */
#include "store_proto.h"

#include "base/auth.h"
#include "base/secret.h"
#include "base/log.h"
#include "base/sock.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

int store_server_handshake_ms = 10000;
size_t store_server_bytes_max = (size_t)256 << 20;

/* Input buffer kept by an idle connection; larger ones are given back after a big request. */
#define CONN_IN_BASE 4096
/* Stop reading a client's next request while this much of its replies is still unsent. */
#define CONN_OUT_HIGH (64u << 10)
/* A dropped client gets this long to read its error reply before the socket is closed. */
#define CONN_DRAIN_MS 2000
/* Accepting resumes this long after the process ran out of file descriptors. */
#define ACCEPT_PAUSE_MS 100
/* Each entry costs this much on top of its key and value against the byte cap. */
#define ENTRY_OVERHEAD 64

/* --- parsers (pure; shared with tests/rendezvous/fuzz_store.c) ---------------------------- */

enum store_parse_result store_parse_request(const uint8_t *buf, size_t len,
                                            struct store_request *req)
{
	uint32_t key_len, val_len;
	uint8_t op;
	int64_t arg;
	size_t total;

	if (len < STORE_REQ_HDR_LEN) {
		/* Reject a bad magic as soon as it is visible, not after a 24-byte wait. */
		uint8_t magic[4];
		store_put_be32(magic, STORE_MAGIC_REQUEST);
		if (memcmp(buf, magic, len < 4 ? len : 4) != 0) {
			req->why = "bad magic (not a khor store request)";
			return STORE_PARSE_BAD;
		}
		req->total = STORE_REQ_HDR_LEN;
		return STORE_PARSE_NEED_MORE;
	}
	if (store_get_be32(buf) != STORE_MAGIC_REQUEST) {
		req->why = "bad magic (not a khor store request)";
		return STORE_PARSE_BAD;
	}
	if (buf[4] != STORE_PROTO_VERSION) {
		req->why = "unsupported protocol version";
		return STORE_PARSE_BAD;
	}
	op = buf[5];
	if (op < STORE_OP_SET || op > STORE_OP_DEL) {
		req->why = "unknown operation";
		return STORE_PARSE_BAD;
	}
	if (buf[6] != 0 || buf[7] != 0) {
		req->why = "reserved bytes not zero";
		return STORE_PARSE_BAD;
	}
	key_len = store_get_be32(buf + 8);
	val_len = store_get_be32(buf + 12);
	arg = (int64_t)store_get_be64(buf + 16);
	if (key_len == 0) {
		req->why = "empty key";
		return STORE_PARSE_BAD;
	}
	if (key_len > STORE_KEY_MAX) {
		req->why = "key longer than STORE_KEY_MAX (512 bytes)";
		return STORE_PARSE_BAD;
	}
	if (val_len > STORE_VALUE_MAX) {
		req->why = "value longer than STORE_VALUE_MAX (1 MiB)";
		return STORE_PARSE_BAD;
	}
	if (op != STORE_OP_SET && val_len != 0) {
		req->why = "value given for an operation that takes none";
		return STORE_PARSE_BAD;
	}
	if (op == STORE_OP_GET && arg < 0) {
		req->why = "negative GET timeout";
		return STORE_PARSE_BAD;
	}
	if ((op == STORE_OP_SET || op == STORE_OP_DEL) && arg != 0) {
		req->why = "argument given for an operation that takes none";
		return STORE_PARSE_BAD;
	}
	/* Both lengths are bounded above, so this sum cannot overflow. */
	total = STORE_REQ_HDR_LEN + (size_t)key_len + (size_t)val_len;
	if (len < total) {
		req->total = total;
		return STORE_PARSE_NEED_MORE;
	}
	if (memchr(buf + STORE_REQ_HDR_LEN, '\0', key_len) != NULL) {
		req->why = "NUL byte in key";
		return STORE_PARSE_BAD;
	}
	req->op = op;
	req->key = buf + STORE_REQ_HDR_LEN;
	req->key_len = key_len;
	req->val = buf + STORE_REQ_HDR_LEN + key_len;
	req->val_len = val_len;
	req->arg = arg;
	req->total = total;
	req->why = NULL;
	return STORE_PARSE_OK;
}

enum store_parse_result store_parse_client_hello(const uint8_t *buf, size_t len,
                                                 struct store_client_hello *hello)
{
	uint16_t job_len;
	size_t total;

	if (len < STORE_CLIENT_HELLO_LEN) {
		uint8_t magic[4];
		store_put_be32(magic, STORE_MAGIC_CLIENT_HELLO);
		if (memcmp(buf, magic, len < 4 ? len : 4) != 0) {
			hello->why = "bad magic (not a khor store client)";
			return STORE_PARSE_BAD;
		}
		hello->total = STORE_CLIENT_HELLO_LEN;
		return STORE_PARSE_NEED_MORE;
	}
	if (store_get_be32(buf) != STORE_MAGIC_CLIENT_HELLO) {
		hello->why = "bad magic (not a khor store client)";
		return STORE_PARSE_BAD;
	}
	if (buf[5] != 0) {
		hello->why = "reserved byte not zero";
		return STORE_PARSE_BAD;
	}
	job_len = store_get_be16(buf + 6);
	if (job_len > STORE_JOB_ID_MAX) {
		hello->why = "job id longer than 255 bytes";
		return STORE_PARSE_BAD;
	}
	total = STORE_CLIENT_HELLO_LEN + (size_t)job_len;
	if (len < total) {
		hello->total = total;
		return STORE_PARSE_NEED_MORE;
	}
	/* The version is checked by the caller so that it can answer with its own version. */
	hello->version = buf[4];
	memcpy(hello->nonce, buf + 8, 16);
	memcpy(hello->mac, buf + 24, 32);
	hello->job_id = buf + STORE_CLIENT_HELLO_LEN;
	hello->job_len = job_len;
	hello->total = total;
	hello->why = NULL;
	return STORE_PARSE_OK;
}

bool store_parse_int64(const uint8_t *s, size_t len, int64_t *value_out)
{
	bool neg = false;
	uint64_t v = 0;
	/* Accumulate as a magnitude so INT64_MIN parses without overflow. */
	uint64_t limit = (uint64_t)INT64_MAX;
	size_t i = 0;

	if (len > 0 && s[0] == '-') {
		neg = true;
		limit = (uint64_t)INT64_MAX + 1;
		i = 1;
	}
	if (i == len || len - i > 19)
		return false;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		uint64_t d = (uint64_t)(s[i] - '0');
		if (v > (limit - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*value_out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return true;
}

/* --- state ----------------------------------------------------------------------------- */

enum conn_state {
	CONN_HELLO, /* server hello sent, waiting for the client's */
	CONN_READY, /* authenticated; serving requests */
	CONN_DRAIN  /* dropped: flushing the last reply, discarding input, then closed */
};

struct entry;

struct conn {
	int fd;
	enum conn_state state;
	uint32_t events; /* the interest registered with epoll now */
	char addr[64];
	uint8_t nonce[KAUTH_NONCE_LEN];
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off;
	/* Deadline of the handshake, of a waiting GET, or of the drain; in the heap if set. */
	uint64_t deadline_ns;
	size_t heap_idx; /* SIZE_MAX when not in the heap */
	/* A GET waiting for its key. */
	struct entry *wait_entry;
	struct conn *wait_prev, *wait_next;
	bool dead, runnable;
	struct conn *dead_next, *run_next;
	struct conn *all_prev, *all_next;
};

/* A key; kept without a value while getters wait for it. */
struct entry {
	struct entry *next; /* hash chain */
	uint64_t hash;
	uint8_t *val;
	uint32_t val_len;
	bool has_val;
	struct conn *waiters;
	uint32_t key_len;
	char key[]; /* NUL-terminated */
};

struct store_server {
	pthread_t thread;
	int epfd, listen_fd, stop_fd;
	uint16_t port;
	const char *secret; /* the kept copy (base/secret.h) */
	size_t secret_len;
	char job_id[STORE_JOB_ID_MAX + 1];
	size_t job_len;
	int handshake_ms;
	size_t bytes_max;

	struct entry **buckets;
	size_t nbuckets, nentries, bytes;
	_Atomic size_t nvalues; /* keys that hold a value (store_server_values reads it) */

	struct conn **heap;
	size_t heap_len, heap_cap;

	struct conn *all, *dead, *runnable;
	uint64_t accept_paused_until; /* 0 when accepting */
	/* Their addresses tag the listening socket and the stop eventfd in epoll. */
	char listen_tag, stop_tag;
};

static uint64_t ms_to_ns(int64_t ms)
{
	return (uint64_t)ms * 1000000ull;
}

/* --- deadline heap --------------------------------------------------------------------- */

static void heap_swap(store_server *srv, size_t a, size_t b)
{
	struct conn *t = srv->heap[a];

	srv->heap[a] = srv->heap[b];
	srv->heap[b] = t;
	srv->heap[a]->heap_idx = a;
	srv->heap[b]->heap_idx = b;
}

static void heap_sift(store_server *srv, size_t i)
{
	while (i > 0 && srv->heap[(i - 1) / 2]->deadline_ns > srv->heap[i]->deadline_ns) {
		heap_swap(srv, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < srv->heap_len && srv->heap[l]->deadline_ns < srv->heap[m]->deadline_ns)
			m = l;
		if (r < srv->heap_len && srv->heap[r]->deadline_ns < srv->heap[m]->deadline_ns)
			m = r;
		if (m == i)
			break;
		heap_swap(srv, i, m);
		i = m;
	}
}

static void heap_remove(store_server *srv, struct conn *c)
{
	size_t i = c->heap_idx;

	if (i == SIZE_MAX)
		return;
	srv->heap_len--;
	if (i != srv->heap_len) {
		srv->heap[i] = srv->heap[srv->heap_len];
		srv->heap[i]->heap_idx = i;
		heap_sift(srv, i);
	}
	c->heap_idx = SIZE_MAX;
}

/* (Re)arms c's deadline. Returns false when out of memory. */
static bool heap_set(store_server *srv, struct conn *c, uint64_t deadline_ns)
{
	heap_remove(srv, c);
	if (srv->heap_len == srv->heap_cap) {
		size_t cap = srv->heap_cap ? srv->heap_cap * 2 : 64;
		struct conn **h = realloc(srv->heap, cap * sizeof(*h));
		if (h == NULL)
			return false;
		srv->heap = h;
		srv->heap_cap = cap;
	}
	c->deadline_ns = deadline_ns;
	c->heap_idx = srv->heap_len;
	srv->heap[srv->heap_len++] = c;
	heap_sift(srv, c->heap_idx);
	return true;
}

/* --- key table ------------------------------------------------------------------------- */

static uint64_t key_hash(const uint8_t *k, size_t len)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (size_t i = 0; i < len; i++) {
		h ^= k[i];
		h *= 1099511628211ull;
	}
	return h;
}

static struct entry *entry_find(store_server *srv, const uint8_t *key, uint32_t key_len,
                                uint64_t h)
{
	for (struct entry *e = srv->buckets[h & (srv->nbuckets - 1)]; e != NULL; e = e->next) {
		if (e->hash == h && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
			return e;
	}
	return NULL;
}

static void table_grow(store_server *srv)
{
	size_t n = srv->nbuckets * 2;
	struct entry **b = calloc(n, sizeof(*b));

	if (b == NULL)
		return; /* longer chains, still correct */
	for (size_t i = 0; i < srv->nbuckets; i++) {
		struct entry *e = srv->buckets[i];
		while (e != NULL) {
			struct entry *next = e->next;
			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
			e = next;
		}
	}
	free(srv->buckets);
	srv->buckets = b;
	srv->nbuckets = n;
}

static struct entry *entry_get_or_add(store_server *srv, const uint8_t *key, uint32_t key_len)
{
	uint64_t h = key_hash(key, key_len);
	struct entry *e = entry_find(srv, key, key_len, h);

	if (e != NULL)
		return e;
	e = calloc(1, sizeof(*e) + key_len + 1);
	if (e == NULL)
		return NULL;
	e->hash = h;
	e->key_len = key_len;
	memcpy(e->key, key, key_len);
	e->next = srv->buckets[h & (srv->nbuckets - 1)];
	srv->buckets[h & (srv->nbuckets - 1)] = e;
	srv->nentries++;
	srv->bytes += ENTRY_OVERHEAD + key_len;
	if (srv->nentries > srv->nbuckets)
		table_grow(srv);
	return e;
}

/* Frees e once it holds neither a value nor waiters. */
static void entry_release_if_unused(store_server *srv, struct entry *e)
{
	struct entry **pp;

	if (e->has_val || e->waiters != NULL)
		return;
	for (pp = &srv->buckets[e->hash & (srv->nbuckets - 1)]; *pp != e; pp = &(*pp)->next)
		;
	*pp = e->next;
	srv->nentries--;
	srv->bytes -= ENTRY_OVERHEAD + e->key_len;
	free(e);
}

static void entry_drop_value(store_server *srv, struct entry *e)
{
	if (!e->has_val)
		return;
	srv->bytes -= e->val_len;
	free(e->val);
	e->val = NULL;
	e->val_len = 0;
	e->has_val = false;
	srv->nvalues--;
}

/* --- connections ----------------------------------------------------------------------- */

static void waiter_unlink(store_server *srv, struct conn *c)
{
	struct entry *e = c->wait_entry;

	if (e == NULL)
		return;
	if (c->wait_prev != NULL)
		c->wait_prev->wait_next = c->wait_next;
	else
		e->waiters = c->wait_next;
	if (c->wait_next != NULL)
		c->wait_next->wait_prev = c->wait_prev;
	c->wait_prev = c->wait_next = NULL;
	c->wait_entry = NULL;
	heap_remove(srv, c);
	entry_release_if_unused(srv, e);
}

/*
 * Marks c for closing at the end of this loop turn. Freeing it now could leave a dangling
 * pointer in the epoll event batch being walked, so the close is deferred.
 */
static void conn_kill(store_server *srv, struct conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	waiter_unlink(srv, c);
	heap_remove(srv, c);
	c->dead_next = srv->dead;
	srv->dead = c;
}

static void conn_free(store_server *srv, struct conn *c)
{
	waiter_unlink(srv, c);
	heap_remove(srv, c);
	epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	if (c->all_prev != NULL)
		c->all_prev->all_next = c->all_next;
	else
		srv->all = c->all_next;
	if (c->all_next != NULL)
		c->all_next->all_prev = c->all_prev;
	free(c->in);
	free(c->out);
	free(c);
}

static void conn_make_runnable(store_server *srv, struct conn *c)
{
	if (c->runnable || c->dead)
		return;
	c->runnable = true;
	c->run_next = srv->runnable;
	srv->runnable = c;
}

static size_t conn_out_pending(const struct conn *c)
{
	return c->out_len - c->out_off;
}

/* Re-registers c's epoll interest to match what it can do now. */
static void conn_update_events(store_server *srv, struct conn *c)
{
	uint32_t ev = EPOLLRDHUP;
	struct epoll_event e;

	if (c->dead)
		return;
	if (c->state != CONN_READY ||
	    (c->wait_entry == NULL && conn_out_pending(c) < CONN_OUT_HIGH && c->in_len < c->in_cap))
		ev |= EPOLLIN;
	if (conn_out_pending(c) > 0)
		ev |= EPOLLOUT;
	if (ev == c->events)
		return;
	e.events = ev;
	e.data.ptr = c;
	if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &e) < 0) {
		char eb[128];
		KLOG_WARN("store: dropped client %s: epoll_ctl: %s", c->addr,
		          kerr_errno_str(errno, eb, sizeof(eb)));
		conn_kill(srv, c);
		return;
	}
	c->events = ev;
}

static void conn_flush(store_server *srv, struct conn *c)
{
	while (conn_out_pending(c) > 0) {
		ssize_t n = send(c->fd, c->out + c->out_off, conn_out_pending(c),
		                 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		/* The client went away; nothing to tell it, and it is not worth a warning. */
		conn_kill(srv, c);
		return;
	}
	c->out_off = c->out_len = 0;
	/* Give back the room a large GET reply took. */
	if (c->out != NULL) {
		free(c->out);
		c->out = NULL;
	}
	if (c->state == CONN_DRAIN)
		shutdown(c->fd, SHUT_WR);
}

static bool conn_append(store_server *srv, struct conn *c, const void *a, size_t alen,
                        const void *b, size_t blen)
{
	size_t need = c->out_len + alen + blen;
	uint8_t *o = realloc(c->out, need);

	if (o == NULL) {
		KLOG_WARN("store: dropped client %s: out of memory for a %zu-byte reply", c->addr,
		          alen + blen);
		conn_kill(srv, c);
		return false;
	}
	c->out = o;
	memcpy(o + c->out_len, a, alen);
	if (blen > 0)
		memcpy(o + c->out_len + alen, b, blen);
	c->out_len = need;
	return true;
}

static void conn_reply(store_server *srv, struct conn *c, uint8_t status, int64_t arg,
                       const void *val, uint32_t val_len)
{
	uint8_t h[STORE_REP_HDR_LEN] = { 0 };

	if (c->dead)
		return;
	store_put_be32(h, STORE_MAGIC_REPLY);
	h[4] = STORE_PROTO_VERSION;
	h[5] = status;
	store_put_be32(h + 8, val_len);
	store_put_be64(h + 16, (uint64_t)arg);
	if (conn_append(srv, c, h, sizeof(h), val, val_len))
		conn_flush(srv, c);
}

static void conn_reply_text(store_server *srv, struct conn *c, uint8_t status, const char *text)
{
	conn_reply(srv, c, status, 0, text, (uint32_t)strlen(text));
}

/*
 * Drops c after its last reply: the socket stays open a short while so the client can read
 * why (closing with unread input would reset the connection and lose the reply).
 */
static void conn_drain(store_server *srv, struct conn *c)
{
	if (c->dead)
		return;
	waiter_unlink(srv, c);
	c->state = CONN_DRAIN;
	c->in_len = 0;
	if (!heap_set(srv, c, kclock_ns() + ms_to_ns(CONN_DRAIN_MS))) {
		conn_kill(srv, c);
		return;
	}
	if (conn_out_pending(c) == 0)
		shutdown(c->fd, SHUT_WR);
}

static void conn_refuse_request(store_server *srv, struct conn *c, const char *why)
{
	char text[128];

	KLOG_WARN("store: dropped client %s: malformed request: %s", c->addr, why);
	snprintf(text, sizeof(text), "malformed request: %s", why);
	conn_reply_text(srv, c, STORE_REPLY_MALFORMED, text);
	conn_drain(srv, c);
}

/* Makes room for need bytes of input. Returns false (and drops c) when out of memory. */
static bool conn_reserve_in(store_server *srv, struct conn *c, size_t need)
{
	uint8_t *p;

	if (need <= c->in_cap)
		return true;
	p = realloc(c->in, need);
	if (p == NULL) {
		KLOG_WARN("store: dropped client %s: out of memory for a %zu-byte request", c->addr,
		          need);
		conn_kill(srv, c);
		return false;
	}
	c->in = p;
	c->in_cap = need;
	return true;
}

/* --- operations ------------------------------------------------------------------------ */

/* Answers and releases every getter waiting on e, which now has a value. */
static void entry_wake(store_server *srv, struct entry *e)
{
	while (e->waiters != NULL) {
		struct conn *w = e->waiters;
		waiter_unlink(srv, w);
		conn_reply(srv, w, STORE_REPLY_OK, 0, e->val, e->val_len);
		conn_make_runnable(srv, w);
		/* waiter_unlink never frees e here: it still holds its value. */
	}
}

/* Stores val (copied) at e, keeping the byte cap. Returns false with the reply sent. */
static bool entry_store(store_server *srv, struct conn *c, struct entry *e, const uint8_t *val,
                        uint32_t val_len)
{
	size_t old = e->has_val ? e->val_len : 0;
	uint8_t *copy;

	if (srv->bytes - old + val_len > srv->bytes_max) {
		char text[160];
		snprintf(text, sizeof(text),
		         "the store is full (%zu of %zu bytes used); it is meant for small bootstrap "
		         "values",
		         srv->bytes, srv->bytes_max);
		KLOG_WARN("store: client %s: refused to store %u bytes at '%s': %s", c->addr, val_len,
		          e->key, text);
		conn_reply_text(srv, c, STORE_REPLY_FULL, text);
		return false;
	}
	/* One spare byte so a value is always NUL-terminated in memory. */
	copy = malloc((size_t)val_len + 1);
	if (copy == NULL) {
		conn_reply_text(srv, c, STORE_REPLY_FULL, "the store's host is out of memory");
		return false;
	}
	memcpy(copy, val, val_len);
	copy[val_len] = '\0';
	entry_drop_value(srv, e);
	e->val = copy;
	e->val_len = val_len;
	e->has_val = true;
	srv->bytes += val_len;
	srv->nvalues++;
	return true;
}

static void op_set(store_server *srv, struct conn *c, const struct store_request *r)
{
	struct entry *e = entry_get_or_add(srv, r->key, r->key_len);

	if (e == NULL) {
		conn_reply_text(srv, c, STORE_REPLY_FULL, "the store's host is out of memory");
		return;
	}
	if (!entry_store(srv, c, e, r->val, r->val_len)) {
		entry_release_if_unused(srv, e);
		return;
	}
	entry_wake(srv, e);
	conn_reply(srv, c, STORE_REPLY_OK, 0, NULL, 0);
}

static void op_get(store_server *srv, struct conn *c, const struct store_request *r)
{
	uint64_t h = key_hash(r->key, r->key_len);
	struct entry *e = entry_find(srv, r->key, r->key_len, h);
	/* A month is "forever" for bootstrap; the clamp keeps the deadline arithmetic in range. */
	int64_t ms = r->arg > 30ll * 86400 * 1000 ? 30ll * 86400 * 1000 : r->arg;

	if (e != NULL && e->has_val) {
		conn_reply(srv, c, STORE_REPLY_OK, 0, e->val, e->val_len);
		return;
	}
	if (ms == 0) {
		conn_reply_text(srv, c, STORE_REPLY_TIMEOUT, "key not set");
		return;
	}
	e = entry_get_or_add(srv, r->key, r->key_len);
	if (e == NULL || !heap_set(srv, c, kclock_ns() + ms_to_ns(ms))) {
		if (e != NULL)
			entry_release_if_unused(srv, e);
		conn_reply_text(srv, c, STORE_REPLY_FULL, "the store's host is out of memory");
		return;
	}
	c->wait_entry = e;
	c->wait_prev = NULL;
	c->wait_next = e->waiters;
	if (e->waiters != NULL)
		e->waiters->wait_prev = c;
	e->waiters = c;
}

static void op_add(store_server *srv, struct conn *c, const struct store_request *r)
{
	struct entry *e = entry_get_or_add(srv, r->key, r->key_len);
	int64_t old = 0, now;
	char text[32];
	int n;

	if (e == NULL) {
		conn_reply_text(srv, c, STORE_REPLY_FULL, "the store's host is out of memory");
		return;
	}
	if (e->has_val && !store_parse_int64(e->val, e->val_len, &old)) {
		conn_reply_text(srv, c, STORE_REPLY_BAD_VALUE,
		                "the value at this key is not a decimal integer");
		return;
	}
	if (__builtin_add_overflow(old, r->arg, &now)) {
		conn_reply_text(srv, c, STORE_REPLY_BAD_VALUE, "the counter would overflow int64");
		entry_release_if_unused(srv, e);
		return;
	}
	n = snprintf(text, sizeof(text), "%" PRId64, now);
	if (!entry_store(srv, c, e, (const uint8_t *)text, (uint32_t)n)) {
		entry_release_if_unused(srv, e);
		return;
	}
	entry_wake(srv, e);
	conn_reply(srv, c, STORE_REPLY_OK, now, NULL, 0);
}

static void op_del(store_server *srv, struct conn *c, const struct store_request *r)
{
	struct entry *e = entry_find(srv, r->key, r->key_len, key_hash(r->key, r->key_len));

	if (e != NULL) {
		entry_drop_value(srv, e);
		entry_release_if_unused(srv, e);
	}
	conn_reply(srv, c, STORE_REPLY_OK, 0, NULL, 0);
}

/* --- per-connection protocol ----------------------------------------------------------- */

static void conn_consume(struct conn *c, size_t n)
{
	memmove(c->in, c->in + n, c->in_len - n);
	c->in_len -= n;
}

static void conn_send_welcome(store_server *srv, struct conn *c, uint8_t status,
                              const uint8_t proof[KAUTH_MAC_LEN])
{
	uint8_t w[STORE_WELCOME_LEN] = { 0 };

	store_put_be32(w, STORE_MAGIC_WELCOME);
	w[4] = STORE_PROTO_VERSION;
	w[5] = status;
	if (proof != NULL)
		memcpy(w + 8, proof, KAUTH_MAC_LEN);
	if (conn_append(srv, c, w, sizeof(w), NULL, 0))
		conn_flush(srv, c);
}

static void conn_refuse_hello(store_server *srv, struct conn *c, uint8_t status, const char *why)
{
	KLOG_WARN("store: refused client %s: %s", c->addr, why);
	conn_send_welcome(srv, c, status, NULL);
	conn_drain(srv, c);
}

static void conn_handshake(store_server *srv, struct conn *c)
{
	struct store_client_hello h;
	uint8_t want[KAUTH_MAC_LEN], proof[KAUTH_MAC_LEN];
	enum store_parse_result r = store_parse_client_hello(c->in, c->in_len, &h);
	char why[400];

	if (r == STORE_PARSE_NEED_MORE)
		return; /* the input buffer (CONN_IN_BASE) always holds a whole hello */
	if (r == STORE_PARSE_BAD) {
		snprintf(why, sizeof(why), "handshake garbage: %s", h.why);
		conn_refuse_hello(srv, c, STORE_WELCOME_MALFORMED, why);
		return;
	}
	if (h.version != STORE_PROTO_VERSION) {
		snprintf(why, sizeof(why),
		         "it speaks store protocol version %u, this server speaks %u (mixed khor "
		         "versions in one job?)",
		         h.version, STORE_PROTO_VERSION);
		conn_refuse_hello(srv, c, STORE_WELCOME_BAD_VERSION, why);
		return;
	}
	if (h.job_len != srv->job_len || memcmp(h.job_id, srv->job_id, h.job_len) != 0) {
		char job[65];
		size_t n = h.job_len < sizeof(job) - 1 ? h.job_len : sizeof(job) - 1;
		/* Unauthenticated bytes: keep control characters out of the log. */
		for (size_t i = 0; i < n; i++)
			job[i] = h.job_id[i] >= 0x20 && h.job_id[i] < 0x7f ? (char)h.job_id[i] : '?';
		job[n] = '\0';
		snprintf(why, sizeof(why), "it belongs to job '%s', this store serves job '%s'", job,
		         srv->job_id);
		conn_refuse_hello(srv, c, STORE_WELCOME_BAD_JOB, why);
		return;
	}
	if (!kauth_mac(srv->secret, srv->secret_len, STORE_LABEL_CLIENT, c->nonce, sizeof(c->nonce),
	               h.job_id, h.job_len, want) ||
	    !kauth_mac(srv->secret, srv->secret_len, STORE_LABEL_SERVER, h.nonce, sizeof(h.nonce),
	               h.job_id, h.job_len, proof)) {
		conn_refuse_hello(srv, c, STORE_WELCOME_MALFORMED, "HMAC computation failed in libcrypto");
		return;
	}
	if (!kauth_equal(want, h.mac, KAUTH_MAC_LEN)) {
		conn_refuse_hello(srv, c, STORE_WELCOME_BAD_MAC,
		                  "wrong job secret (its handshake MAC does not match)");
		return;
	}
	conn_consume(c, h.total);
	heap_remove(srv, c);
	c->state = CONN_READY;
	KLOG_DEBUG("store: client %s joined", c->addr);
	conn_send_welcome(srv, c, STORE_WELCOME_OK, proof);
}

/* Acts on every whole request in c's input buffer, as far as c may go on. */
static void conn_process(store_server *srv, struct conn *c)
{
	if (c->dead)
		return;
	if (c->state == CONN_HELLO)
		conn_handshake(srv, c);
	while (!c->dead && c->state == CONN_READY && c->wait_entry == NULL &&
	       conn_out_pending(c) < CONN_OUT_HIGH && c->in_len > 0) {
		struct store_request r;
		enum store_parse_result pr = store_parse_request(c->in, c->in_len, &r);
		if (pr == STORE_PARSE_NEED_MORE) {
			conn_reserve_in(srv, c, r.total);
			break;
		}
		if (pr == STORE_PARSE_BAD) {
			conn_refuse_request(srv, c, r.why);
			return;
		}
		switch (r.op) {
		case STORE_OP_SET:
			op_set(srv, c, &r);
			break;
		case STORE_OP_GET:
			op_get(srv, c, &r);
			break;
		case STORE_OP_ADD:
			op_add(srv, c, &r);
			break;
		default:
			op_del(srv, c, &r);
			break;
		}
		conn_consume(c, r.total);
	}
	/*
	 * After a large SET, give back its room so idle clients stay small. Only when the buffer
	 * is empty: a partial request may just have reserved the room it needs.
	 */
	if (!c->dead && c->in_cap > CONN_IN_BASE && c->in_len == 0) {
		uint8_t *p = realloc(c->in, CONN_IN_BASE);
		if (p != NULL) {
			c->in = p;
			c->in_cap = CONN_IN_BASE;
		}
	}
}

static void conn_on_readable(store_server *srv, struct conn *c)
{
	/* Bounded so one fast client cannot starve the others in this turn. */
	for (int round = 0; round < 16 && !c->dead; round++) {
		ssize_t n;
		if (c->state == CONN_DRAIN) {
			uint8_t junk[4096];
			n = recv(c->fd, junk, sizeof(junk), 0);
		} else {
			if (c->in_len == c->in_cap)
				break; /* blocked on a waiting GET or unsent replies */
			n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
		}
		if (n > 0) {
			if (c->state != CONN_DRAIN) {
				c->in_len += (size_t)n;
				conn_process(srv, c);
			}
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (c->state == CONN_HELLO)
			KLOG_WARN("store: refused client %s: it closed the connection during the "
			          "handshake%s",
			          c->addr, c->in_len > 0 ? " after a partial hello" : "");
		else if (c->state == CONN_READY && c->in_len > 0)
			KLOG_WARN("store: dropped client %s: it closed the connection in the middle "
			          "of a request (%zu bytes of it received)",
			          c->addr, c->in_len);
		conn_kill(srv, c);
	}
}

static void conn_on_event(store_server *srv, struct conn *c, uint32_t ev)
{
	if (c->dead)
		return;
	if (ev & EPOLLERR) {
		conn_kill(srv, c);
		return;
	}
	if (ev & EPOLLOUT) {
		conn_flush(srv, c);
		conn_make_runnable(srv, c); /* it may read on now that its replies went out */
	}
	if (c->dead)
		return;
	if ((ev & (EPOLLRDHUP | EPOLLHUP)) && !(c->events & EPOLLIN)) {
		/* Gone while blocked: its waiting GET or unread replies have no one to go to. */
		conn_kill(srv, c);
		return;
	}
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))
		conn_on_readable(srv, c);
	if (!c->dead)
		conn_update_events(srv, c);
}

static void conn_on_deadline(store_server *srv, struct conn *c)
{
	heap_remove(srv, c);
	if (c->state == CONN_HELLO) {
		KLOG_WARN("store: refused client %s: no handshake within %d ms", c->addr,
		          srv->handshake_ms);
		conn_kill(srv, c);
	} else if (c->state == CONN_READY && c->wait_entry != NULL) {
		waiter_unlink(srv, c);
		conn_reply_text(srv, c, STORE_REPLY_TIMEOUT, "key not set before the timeout");
		conn_make_runnable(srv, c);
	} else {
		conn_kill(srv, c);
	}
}

static void server_accept(store_server *srv)
{
	char eb[128];

	for (int i = 0; i < 64; i++) {
		ksockaddr peer;
		struct conn *c;
		struct epoll_event e;
		uint8_t hello[STORE_SERVER_HELLO_LEN] = { 0 };
		int fd;

		peer.len = sizeof(peer.ss);
		fd = accept4(srv->listen_fd, (struct sockaddr *)&peer.ss, &peer.len,
		             SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* The pending connection keeps the socket readable: pause, don't spin. */
				struct epoll_event off = { .events = 0, .data.ptr = &srv->listen_tag };
				KLOG_WARN("store: cannot accept clients: %s; retrying in %d ms (raise the "
				          "open-file limit, ulimit -n, for jobs this large)",
				          kerr_errno_str(errno, eb, sizeof(eb)), ACCEPT_PAUSE_MS);
				epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &off);
				srv->accept_paused_until = kclock_ns() + ms_to_ns(ACCEPT_PAUSE_MS);
			}
			return;
		}
		c = calloc(1, sizeof(*c));
		if (c == NULL || (c->in = malloc(CONN_IN_BASE)) == NULL) {
			free(c);
			close(fd);
			continue;
		}
		c->fd = fd;
		c->in_cap = CONN_IN_BASE;
		c->heap_idx = SIZE_MAX;
		c->state = CONN_HELLO;
		ksock_addr_str(&peer, c->addr, sizeof(c->addr));
		ksock_tune_stream(fd, 0);
		c->all_next = srv->all;
		if (srv->all != NULL)
			srv->all->all_prev = c;
		srv->all = c;
		c->events = EPOLLIN | EPOLLRDHUP;
		e.events = c->events;
		e.data.ptr = c;
		if (!kauth_random(c->nonce, sizeof(c->nonce)) ||
		    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e) < 0 ||
		    !heap_set(srv, c, kclock_ns() + ms_to_ns(srv->handshake_ms))) {
			KLOG_WARN("store: dropped client %s: cannot set up its connection", c->addr);
			conn_kill(srv, c);
			continue;
		}
		store_put_be32(hello, STORE_MAGIC_SERVER_HELLO);
		hello[4] = STORE_PROTO_VERSION;
		memcpy(hello + 8, c->nonce, sizeof(c->nonce));
		if (conn_append(srv, c, hello, sizeof(hello), NULL, 0))
			conn_flush(srv, c);
		conn_update_events(srv, c);
	}
}

static int server_wait_ms(const store_server *srv)
{
	uint64_t now = kclock_ns(), at = UINT64_MAX, ms;

	if (srv->runnable != NULL)
		return 0;
	if (srv->heap_len > 0)
		at = srv->heap[0]->deadline_ns;
	if (srv->accept_paused_until != 0 && srv->accept_paused_until < at)
		at = srv->accept_paused_until;
	if (at == UINT64_MAX)
		return -1;
	if (at <= now)
		return 0;
	ms = (at - now + 999999) / 1000000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void *server_main(void *arg)
{
	store_server *srv = arg;
	struct epoll_event events[64];
	char eb[128];

	for (;;) {
		int n = epoll_wait(srv->epfd, events, 64, server_wait_ms(srv));
		uint64_t now;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			KLOG_ERR("store: epoll_wait failed: %s; the store stops serving",
			         kerr_errno_str(errno, eb, sizeof(eb)));
			break;
		}
		for (int i = 0; i < n; i++) {
			void *p = events[i].data.ptr;
			if (p == &srv->stop_tag)
				return NULL;
			if (p == &srv->listen_tag)
				server_accept(srv);
			else
				conn_on_event(srv, p, events[i].events);
		}
		now = kclock_ns();
		while (srv->heap_len > 0 && srv->heap[0]->deadline_ns <= now)
			conn_on_deadline(srv, srv->heap[0]);
		if (srv->accept_paused_until != 0 && srv->accept_paused_until <= now) {
			struct epoll_event on = { .events = EPOLLIN, .data.ptr = &srv->listen_tag };
			epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &on);
			srv->accept_paused_until = 0;
		}
		/* Requests left buffered behind a GET that was just answered, or behind output. */
		while (srv->runnable != NULL) {
			struct conn *c = srv->runnable;
			srv->runnable = c->run_next;
			c->runnable = false;
			conn_process(srv, c);
			conn_update_events(srv, c);
		}
		while (srv->dead != NULL) {
			struct conn *c = srv->dead;
			srv->dead = c->dead_next;
			conn_free(srv, c);
		}
	}
	return NULL;
}

/* --- lifecycle ------------------------------------------------------------------------- */

static void server_free(store_server *srv)
{
	while (srv->all != NULL)
		conn_free(srv, srv->all);
	for (size_t i = 0; i < srv->nbuckets; i++) {
		struct entry *e = srv->buckets[i];
		while (e != NULL) {
			struct entry *next = e->next;
			free(e->val);
			free(e);
			e = next;
		}
	}
	free(srv->buckets);
	free(srv->heap);
	if (srv->epfd >= 0)
		close(srv->epfd);
	if (srv->stop_fd >= 0)
		close(srv->stop_fd);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	free(srv);
}

khor_status store_server_start(const char *bind_host, uint16_t port, const char *secret,
                               const char *job_id, store_server **server_out, kerr *err)
{
	store_server *srv;
	ksockaddr addr;
	struct epoll_event e;
	char eb[128];
	khor_status st;
	int rc;

	if (secret == NULL)
		secret = "";
	if (job_id == NULL)
		job_id = "";
	if (strlen(job_id) > STORE_JOB_ID_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "store server: job id '%.40s...' is %zu bytes, over the limit of %d",
		                job_id, strlen(job_id), STORE_JOB_ID_MAX);
	srv = calloc(1, sizeof(*srv));
	if (srv == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "store server: out of memory");
	srv->epfd = srv->listen_fd = srv->stop_fd = -1;
	srv->job_len = kstrlcpy(srv->job_id, job_id, sizeof(srv->job_id));
	srv->secret = ksecret_keep(secret); /* not a copy of its own: base/secret.h */
	srv->secret_len = srv->secret != NULL ? strlen(srv->secret) : 0;
	srv->nbuckets = 1024;
	srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
	srv->handshake_ms = store_server_handshake_ms;
	srv->bytes_max = store_server_bytes_max;
	if (srv->secret == NULL || srv->buckets == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "store server: out of memory");
		goto fail_free_server;
	}

	if (bind_host == NULL)
		bind_host = "0.0.0.0";
	st = ksock_resolve(bind_host, port, &addr, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "store server");
		goto fail_free_server;
	}
	st = ksock_listen(&addr, 4096, &srv->listen_fd, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "store server");
		goto fail_free_server;
	}
	srv->port = ksock_addr_port(&addr);

	srv->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (srv->stop_fd < 0 || srv->epfd < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "store server: eventfd/epoll_create1: %s",
		              kerr_errno_str(errno, eb, sizeof(eb)));
		goto fail_free_server;
	}
	e.events = EPOLLIN;
	e.data.ptr = &srv->listen_tag;
	rc = epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->listen_fd, &e);
	e.data.ptr = &srv->stop_tag;
	if (rc < 0 || epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->stop_fd, &e) < 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "store server: epoll_ctl: %s",
		              kerr_errno_str(errno, eb, sizeof(eb)));
		goto fail_free_server;
	}
	rc = pthread_create(&srv->thread, NULL, server_main, srv);
	if (rc != 0) {
		st = kerr_set(err, KHOR_ERR_SYSTEM, "store server: pthread_create: %s",
		              kerr_errno_str(rc, eb, sizeof(eb)));
		goto fail_free_server;
	}
	KLOG_DEBUG("store: serving job '%s' on %s%s", srv->job_id,
	           ksock_addr_str(&addr, eb, sizeof(eb)),
	           srv->secret_len == 0 ? " without a secret" : "");
	*server_out = srv;
	return KHOR_SUCCESS;

fail_free_server: /* also closes whichever sockets were opened */
	server_free(srv);
	return st;
}

uint16_t store_server_port(const store_server *srv)
{
	return srv->port;
}

size_t store_server_values(const store_server *srv)
{
	return srv->nvalues;
}

void store_server_stop(store_server *srv)
{
	uint64_t one = 1;

	if (srv == NULL)
		return;
	/* An eventfd counter cannot be full after one write, so this write cannot block or fail. */
	if (write(srv->stop_fd, &one, sizeof(one)) != sizeof(one))
		KLOG_ERR("store: cannot wake the server thread to stop it");
	pthread_join(srv->thread, NULL);
	server_free(srv);
}
