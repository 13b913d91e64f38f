/*
 * store_tcp.c -- the client of the embedded TCP store (store_server.c holds the wire
 * format). One blocking request/reply exchange per call on a non-blocking socket, each
 * bounded by a deadline: GET by the caller's deadline (sent to the server, which answers
 * "timeout" itself), the others by STORE_TCP_OP_MS.
 *
 * Every error sentence starts with "store at HOST:PORT: OP 'KEY':" so a rank's log says
 * which store, which call and which key went wrong, then the cause.
 */
#include "store_proto.h"

#include "base/auth.h"
#include "base/log.h"
#include "base/sock.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A live server answers SET/ADD/DEL in microseconds; a minute means it is stopped or gone. */
#define STORE_TCP_OP_MS 60000
/* The server drops a silent handshake after 10 s; waiting longer than this is pointless. */
#define STORE_TCP_HANDSHAKE_MS 30000
/* The server times a GET out itself; the client waits this much longer for that answer. */
#define STORE_TCP_GET_GRACE_MS 5000
/* Requests with values up to this size go out in one write. */
#define STORE_TCP_INLINE_VALUE 4096

struct store_tcp {
	store base;
	int fd;
	/* Set when an exchange broke off half way: the stream is out of step for good. */
	bool broken;
	char where[300]; /* "store at HOST:PORT" */
};

struct store_reply {
	uint8_t status;
	int64_t arg;
	uint8_t *val; /* malloc'd, NUL-terminated; NULL when val_len is 0 and none asked for */
	uint32_t val_len;
};

static const char *const op_names[] = { "?", "set", "get", "add", "del" };

/*
 * Sends one request and reads its reply. A failed send or receive, or a reply that breaks
 * the format, marks the connection broken: the next reply could no longer be matched to
 * its request.
 */
static khor_status tcp_call(struct store_tcp *t, uint8_t op, const char *key, const void *val,
                            size_t val_len, int64_t arg, kdeadline dl,
                            struct store_reply *rep_out, kerr *err)
{
	uint8_t buf[STORE_REQ_HDR_LEN + STORE_KEY_MAX + STORE_TCP_INLINE_VALUE];
	uint8_t h[STORE_REP_HDR_LEN];
	const char *opn = op_names[op];
	size_t key_len = strlen(key), n;
	struct store_reply rep;
	char what[STORE_KEY_MAX + 400];
	khor_status st;

	if (t->broken)
		return kerr_set(err, KHOR_ERR_REMOTE,
		                "%s: %s '%s': the connection failed earlier and cannot be used "
		                "again; connect anew",
		                t->where, opn, key);
	if (key_len == 0 || key_len > STORE_KEY_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "%s: %s '%.64s': the key is %zu bytes; it must be 1 to %d", t->where,
		                opn, key, key_len, STORE_KEY_MAX);
	if (val_len > STORE_VALUE_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "%s: %s '%s': the value is %zu bytes, over the limit of %u; the store "
		                "is meant for small bootstrap data",
		                t->where, opn, key, val_len, STORE_VALUE_MAX);

	memset(buf, 0, STORE_REQ_HDR_LEN);
	store_put_be32(buf, STORE_MAGIC_REQUEST);
	buf[4] = STORE_PROTO_VERSION;
	buf[5] = op;
	store_put_be32(buf + 8, (uint32_t)key_len);
	store_put_be32(buf + 12, (uint32_t)val_len);
	store_put_be64(buf + 16, (uint64_t)arg);
	memcpy(buf + STORE_REQ_HDR_LEN, key, key_len);
	n = STORE_REQ_HDR_LEN + key_len;
	if (val_len <= STORE_TCP_INLINE_VALUE) {
		if (val_len > 0)
			memcpy(buf + n, val, val_len);
		n += val_len;
	}
	snprintf(what, sizeof(what), "%s: %s '%s': sending the request", t->where, opn, key);
	st = ksock_write_all(t->fd, buf, n, dl, what, err);
	if (st == KHOR_SUCCESS && val_len > STORE_TCP_INLINE_VALUE)
		st = ksock_write_all(t->fd, val, val_len, dl, what, err);
	if (st != KHOR_SUCCESS)
		goto fail_break_connection;

	snprintf(what, sizeof(what), "%s: %s '%s': waiting for the reply", t->where, opn, key);
	st = ksock_read_all(t->fd, h, sizeof(h), dl, what, err);
	if (st != KHOR_SUCCESS)
		goto fail_break_connection;
	rep.status = h[5];
	rep.val_len = store_get_be32(h + 8);
	rep.arg = (int64_t)store_get_be64(h + 16);
	rep.val = NULL;
	if (store_get_be32(h) != STORE_MAGIC_REPLY || h[4] != STORE_PROTO_VERSION ||
	    rep.val_len > (rep.status == STORE_REPLY_OK ? STORE_VALUE_MAX : STORE_REPLY_TEXT_MAX)) {
		st = kerr_set(err, KHOR_ERR_PROTOCOL,
		              "%s: %s '%s': the reply is malformed (magic 0x%08x, version %u, "
		              "%u-byte value)",
		              t->where, opn, key, store_get_be32(h), h[4], rep.val_len);
		goto fail_break_connection;
	}
	rep.val = malloc((size_t)rep.val_len + 1);
	if (rep.val == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: %s '%s': no memory for a %u-byte reply",
		              t->where, opn, key, rep.val_len);
		goto fail_break_connection;
	}
	st = ksock_read_all(t->fd, rep.val, rep.val_len, dl, what, err);
	if (st != KHOR_SUCCESS)
		goto fail_free_value;
	rep.val[rep.val_len] = '\0';

	switch (rep.status) {
	case STORE_REPLY_OK:
		*rep_out = rep;
		return KHOR_SUCCESS;
	case STORE_REPLY_TIMEOUT:
		st = kerr_set(err, KHOR_ERR_TIMEOUT,
		              "%s: get '%s': timed out: nobody set the key within %lld ms (is the "
		              "process that publishes it running, and in the same job?)",
		              t->where, key, (long long)arg);
		break;
	case STORE_REPLY_FULL:
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: %s '%s': refused: %s", t->where, opn, key,
		              (const char *)rep.val);
		break;
	case STORE_REPLY_BAD_VALUE:
		st = kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: %s '%s': refused: %s", t->where, opn,
		              key, (const char *)rep.val);
		break;
	case STORE_REPLY_MALFORMED:
		/* The server drops us after this reply. */
		t->broken = true;
		st = kerr_set(err, KHOR_ERR_PROTOCOL,
		              "%s: %s '%s': the store refused the request (%s); are khorrun and this "
		              "rank the same khor version?",
		              t->where, opn, key, (const char *)rep.val);
		break;
	default:
		t->broken = true;
		st = kerr_set(err, KHOR_ERR_PROTOCOL, "%s: %s '%s': unknown reply status %u",
		              t->where, opn, key, rep.status);
		break;
	}
	free(rep.val);
	return st;

fail_free_value:
	free(rep.val);
fail_break_connection:
	t->broken = true;
	if (st == KHOR_ERR_REMOTE && err != NULL) {
		size_t used = strlen(err->text);
		snprintf(err->text + used, sizeof(err->text) - used,
		         " (the process running the store, khorrun or rank 0, may have exited)");
	}
	return st;
}

static khor_status tcp_set(store *s, const char *key, const void *val, size_t len, kerr *err)
{
	struct store_tcp *t = (struct store_tcp *)s;
	struct store_reply rep;
	khor_status st = tcp_call(t, STORE_OP_SET, key, val, len, 0,
	                          kdeadline_in_ms(STORE_TCP_OP_MS), &rep, err);

	if (st == KHOR_SUCCESS)
		free(rep.val);
	return st;
}

static khor_status tcp_get(store *s, const char *key, kdeadline dl, void **val_out,
                           size_t *len_out, kerr *err)
{
	struct store_tcp *t = (struct store_tcp *)s;
	struct store_reply rep;
	/* Whole milliseconds still left; 0 when the deadline has passed (a plain lookup). */
	int ms = kdeadline_left_ms(dl, INT_MAX - STORE_TCP_GET_GRACE_MS);
	khor_status st = tcp_call(t, STORE_OP_GET, key, NULL, 0, ms,
	                          kdeadline_in_ms((int64_t)ms + STORE_TCP_GET_GRACE_MS), &rep, err);

	if (st != KHOR_SUCCESS)
		return st;
	*val_out = rep.val;
	*len_out = rep.val_len;
	return KHOR_SUCCESS;
}

static khor_status tcp_add(store *s, const char *key, int64_t delta, int64_t *value_out,
                           kerr *err)
{
	struct store_tcp *t = (struct store_tcp *)s;
	struct store_reply rep;
	khor_status st = tcp_call(t, STORE_OP_ADD, key, NULL, 0, delta,
	                          kdeadline_in_ms(STORE_TCP_OP_MS), &rep, err);

	if (st != KHOR_SUCCESS)
		return st;
	free(rep.val);
	if (value_out != NULL)
		*value_out = rep.arg;
	return KHOR_SUCCESS;
}

static khor_status tcp_del(store *s, const char *key, kerr *err)
{
	struct store_tcp *t = (struct store_tcp *)s;
	struct store_reply rep;
	khor_status st = tcp_call(t, STORE_OP_DEL, key, NULL, 0, 0,
	                          kdeadline_in_ms(STORE_TCP_OP_MS), &rep, err);

	if (st == KHOR_SUCCESS)
		free(rep.val);
	return st;
}

static void tcp_close(store *s)
{
	struct store_tcp *t = (struct store_tcp *)s;

	close(t->fd);
	free(t);
}

/*
 * The socket is the store's for its whole life (a broken connection is never redialled),
 * so shutting it down from another thread cannot touch a descriptor reused for something
 * else; the call blocked on it reads end-of-file and fails, and so does every later one.
 */
static void tcp_interrupt(store *s)
{
	(void)shutdown(((struct store_tcp *)s)->fd, SHUT_RDWR);
}

static const struct store_ops store_tcp_ops = {
	.set = tcp_set,
	.get = tcp_get,
	.add = tcp_add,
	.del = tcp_del,
	.close = tcp_close,
	.interrupt = tcp_interrupt,
};

/* Checks the server's greeting, proves the secret and checks the server's proof back. */
static khor_status tcp_handshake(int fd, const char *where, const char *secret,
                                 const char *job_id, kdeadline dl, kerr *err)
{
	uint8_t sh[STORE_SERVER_HELLO_LEN], w[STORE_WELCOME_LEN], proof[KAUTH_MAC_LEN];
	uint8_t ch[STORE_CLIENT_HELLO_LEN + STORE_JOB_ID_MAX];
	size_t secret_len = strlen(secret), job_len = strlen(job_id);
	char what[400];
	khor_status st;

	snprintf(what, sizeof(what), "%s: handshake: waiting for the store's greeting", where);
	st = ksock_read_all(fd, sh, sizeof(sh), dl, what, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (store_get_be32(sh) != STORE_MAGIC_SERVER_HELLO)
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: handshake: the process at this address is not a khor store (it "
		                "greeted with 0x%08x); check the store's host and port",
		                where, store_get_be32(sh));
	if (sh[4] != STORE_PROTO_VERSION)
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: handshake: the store speaks protocol version %u, this library "
		                "speaks %u; use the same khor version for khorrun and every rank",
		                where, sh[4], STORE_PROTO_VERSION);

	memset(ch, 0, STORE_CLIENT_HELLO_LEN);
	store_put_be32(ch, STORE_MAGIC_CLIENT_HELLO);
	ch[4] = STORE_PROTO_VERSION;
	store_put_be16(ch + 6, (uint16_t)job_len);
	if (!kauth_random(ch + 8, KAUTH_NONCE_LEN) ||
	    !kauth_mac(secret, secret_len, STORE_LABEL_CLIENT, sh + 8, KAUTH_NONCE_LEN, job_id,
	               job_len, ch + 24) ||
	    !kauth_mac(secret, secret_len, STORE_LABEL_SERVER, ch + 8, KAUTH_NONCE_LEN, job_id,
	               job_len, proof))
		return kerr_set(err, KHOR_ERR_SYSTEM,
		                "%s: handshake: getrandom or libcrypto's HMAC-SHA256 failed", where);
	memcpy(ch + STORE_CLIENT_HELLO_LEN, job_id, job_len);
	snprintf(what, sizeof(what), "%s: handshake: sending this rank's proof", where);
	st = ksock_write_all(fd, ch, STORE_CLIENT_HELLO_LEN + job_len, dl, what, err);
	if (st != KHOR_SUCCESS)
		return st;
	snprintf(what, sizeof(what), "%s: handshake: waiting for the store's answer", where);
	st = ksock_read_all(fd, w, sizeof(w), dl, what, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (store_get_be32(w) != STORE_MAGIC_WELCOME)
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: handshake: the store's answer is malformed (magic 0x%08x)", where,
		                store_get_be32(w));
	switch (w[5]) {
	case STORE_WELCOME_OK:
		break;
	case STORE_WELCOME_BAD_MAC:
		return kerr_set(err, KHOR_ERR_AUTH,
		                "%s: handshake: the store refused this process: the job secret does "
		                "not match (KHOR_SECRET must be the one this job's khorrun made)",
		                where);
	case STORE_WELCOME_BAD_JOB:
		return kerr_set(err, KHOR_ERR_AUTH,
		                "%s: handshake: the store refused this process: it serves another job, "
		                "not '%s'; check the job id and the store address",
		                where, job_id);
	case STORE_WELCOME_BAD_VERSION:
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: handshake: the store speaks protocol version %u, this library "
		                "speaks %u; use the same khor version for khorrun and every rank",
		                where, w[4], STORE_PROTO_VERSION);
	default:
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: handshake: the store refused the greeting as malformed (status %u)",
		                where, w[5]);
	}
	if (!kauth_equal(w + 8, proof, KAUTH_MAC_LEN))
		return kerr_set(err, KHOR_ERR_AUTH,
		                "%s: handshake: the store could not prove it knows the job secret; it "
		                "is not this job's store (check the store address)",
		                where);
	return KHOR_SUCCESS;
}

khor_status store_tcp_connect(const char *host, uint16_t port, const char *secret,
                              const char *job_id, kdeadline dl, store **store_out, kerr *err)
{
	struct store_tcp *t;
	char where[300];
	ksockaddr addr;
	kdeadline hs_dl;
	khor_status st;
	int fd;

	if (secret == NULL)
		secret = "";
	if (job_id == NULL)
		job_id = "";
	if (strchr(host, ':') != NULL)
		snprintf(where, sizeof(where), "store at [%s]:%u", host, port);
	else
		snprintf(where, sizeof(where), "store at %s:%u", host, port);
	if (strlen(job_id) > STORE_JOB_ID_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "%s: connect: the job id is %zu bytes, over the limit of %d", where,
		                strlen(job_id), STORE_JOB_ID_MAX);
	/*
	 * A name may not resolve yet: in a Kubernetes indexed Job, pods 1..N-1 often start
	 * before the headless service has a record for pod 0. Retry until the deadline, and
	 * say so once, so a misspelt host is not a silent wait.
	 */
	for (int tries = 0;; tries++) {
		st = ksock_resolve(host, port, &addr, err);
		if (st == KHOR_SUCCESS)
			break;
		if (kdeadline_passed(dl)) {
			kerr_prefix(err, "%s: connect%s", where,
			            tries > 0 ? " (retried until the deadline)" : "");
			return st;
		}
		if (tries == 20)
			KLOG_WARN("%s: %s; retrying until the init deadline (a pod whose DNS record "
			          "is not there yet, or a misspelt host?)", where, err->text);
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	st = ksock_connect_deadline(&addr, dl, true, &fd, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "%s: connect", where);
		return st;
	}
	ksock_tune_stream(fd, 0);
	/* A caller willing to wait forever still should not wait forever on a mute listener. */
	hs_dl = kdeadline_in_ms(STORE_TCP_HANDSHAKE_MS);
	if (dl.at_ns > hs_dl.at_ns)
		dl = hs_dl;
	st = tcp_handshake(fd, where, secret, job_id, dl, err);
	if (st != KHOR_SUCCESS)
		goto fail_close_socket;
	t = calloc(1, sizeof(*t));
	if (t == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: connect: out of memory", where);
		goto fail_close_socket;
	}
	store_base_init(&t->base, &store_tcp_ops);
	t->fd = fd;
	kstrlcpy(t->where, where, sizeof(t->where));
	*store_out = &t->base;
	return KHOR_SUCCESS;

fail_close_socket:
	close(fd);
	return st;
}
