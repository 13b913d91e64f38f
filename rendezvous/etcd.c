/*
 * etcd.c -- the etcd v3 client of etcd.h, over http.c and json.c. Each call builds one
 * JSON request (keys and values in base64), POSTs it to the gateway's path for the gRPC
 * method (/v3/kv/range, /v3/kv/txn, /v3/lease/grant, ...) on a kept-alive connection, and
 * reads the few fields it needs from the reply. The watch streams on a second connection,
 * so a rank can wait for a key while it sets others.
 *
 * Retrying: a call that failed before its request went out (no connection), or one that
 * is safe to repeat (a read, a put of the same value, a delete, a lease renewal), is tried
 * again with a short backoff until its deadline, so that a restart of etcd within the
 * deadline is survived. A compare-and-swap whose reply was lost is not repeated.
 */
#include "etcd.h"

#include "base/log.h"
#include "base/sock.h"
#include "http.h"
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Tokens of one reply: a range of one key needs ~20, a watch batch and a listed key ~15. */
#define ETCD_TOKENS (16 * ETCD_LIST_MAX + 64)
/* The largest reply: a 1 MiB value (the store's limit) is 1.4 MiB in base64. */
#define ETCD_REPLY_MAX (2u << 20)
#define ETCD_BACKOFF_FIRST_MS 10
#define ETCD_BACKOFF_MAX_MS 200

/* gRPC status codes etcd's gateway reports in "code". */
enum {
	GRPC_INVALID_ARGUMENT = 3,
	GRPC_NOT_FOUND = 5,
	GRPC_PERMISSION_DENIED = 7,
	GRPC_RESOURCE_EXHAUSTED = 8,
	GRPC_UNIMPLEMENTED = 12,
	GRPC_UNAVAILABLE = 14,
	GRPC_UNAUTHENTICATED = 16,
};

struct etcd {
	char where[300]; /* "etcd at HOST:PORT" */
	struct http_conn kv, watch;
	bool watching;
	char *watch_key_b64;
	char watch_key[128]; /* for messages; may be cut short */
	int last_code;       /* etcd's gRPC code of the last refusal, 0 if none */
	struct http_reply rep;
	struct json_tok tok[ETCD_TOKENS];
};

/* --- request bodies ------------------------------------------------------------------- */

struct jbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static bool jb_room(struct jbuf *b, size_t n)
{
	if (b->oom)
		return false;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap > 0 ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *np = realloc(b->p, cap);
		if (np == NULL) {
			b->oom = true;
			return false;
		}
		b->p = np;
		b->cap = cap;
	}
	return true;
}

static void jb_add(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jb_add(struct jbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !jb_room(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* "name":"<base64 of p>" */
static void jb_b64(struct jbuf *b, const char *name, const void *p, size_t n)
{
	jb_add(b, "\"%s\":\"", name);
	if (!jb_room(b, json_b64_len(n) + 1))
		return;
	json_b64_encode(p, n, b->p + b->len);
	b->len += json_b64_len(n);
	jb_add(b, "\"");
}

static void jb_key(struct jbuf *b, const char *key)
{
	jb_b64(b, "key", key, strlen(key));
}

/* --- one call ------------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* A failure of the connection itself is the same to a caller however it came. */
static khor_status unreachable(khor_status st, kerr *err, bool sent)
{
	if (st == KHOR_ERR_PROTOCOL || st == KHOR_ERR_NO_MEMORY || st == KHOR_ERR_INTERNAL)
		return st;
	kerr_prefix(err, sent ? "etcd did not answer" : "cannot reach etcd");
	err->status = KHOR_ERR_REMOTE;
	return KHOR_ERR_REMOTE;
}

static khor_status code_status(int code)
{
	switch (code) {
	case GRPC_INVALID_ARGUMENT:
		return KHOR_ERR_INVALID_ARG;
	case GRPC_PERMISSION_DENIED:
	case GRPC_UNAUTHENTICATED:
		return KHOR_ERR_AUTH;
	case GRPC_RESOURCE_EXHAUSTED:
		return KHOR_ERR_NO_MEMORY;
	case GRPC_UNIMPLEMENTED:
		return KHOR_ERR_NOT_SUPPORTED;
	default:
		return KHOR_ERR_REMOTE;
	}
}

/*
 * etcd's refusal, from an error body: {"error":"...","message":"...","code":N} for a call,
 * {"error":{"grpc_code":N,"message":"..."}} inside a stream.
 */
static khor_status etcd_refusal(etcd *e, const json_doc *d, int obj, int http_status,
                                bool *unavailable_out, kerr *err)
{
	char msg[512] = "";
	int64_t code = 0;
	int m = json_member(d, obj, "message");

	if (!json_str(d, m, msg, sizeof(msg)))
		json_str(d, json_member(d, obj, "error"), msg, sizeof(msg));
	if (!json_i64(d, json_member(d, obj, "code"), &code))
		json_i64(d, json_member(d, obj, "grpc_code"), &code);
	e->last_code = (int)code;
	*unavailable_out = code == GRPC_UNAVAILABLE || http_status == 503;
	bool auth = code == GRPC_UNAUTHENTICATED || code == GRPC_PERMISSION_DENIED ||
	            strstr(msg, "user name") != NULL || strstr(msg, "token") != NULL;
	return kerr_set(err, code_status((int)code), "etcd refused it (HTTP %d, code %lld): %s%s",
	                http_status, (long long)code, msg[0] ? msg : "(no message)",
	                auth ? " (khor does not log in to etcd: run it without authentication "
	                       "for now, or on a port that needs none)"
	                     : "");
}

static khor_status not_json(const char *body, size_t len, const char *why, int status,
                            kerr *err)
{
	char shown[100];
	size_t n = len < 80 ? len : 80, o = 0;

	for (size_t i = 0; i < n; i++)
		shown[o++] = body[i] >= 0x20 && body[i] < 0x7f ? body[i] : '?';
	shown[o] = '\0';
	return kerr_set(err, KHOR_ERR_PROTOCOL,
	                "the reply (HTTP %d) is not etcd's JSON (%s): \"%s%s\"; is this etcd's "
	                "client port?",
	                status, why, shown, len > n ? "..." : "");
}

/*
 * Checks a reply and parses it into e->tok; *root_out is the object that holds the answer
 * (the top one, or "result" of a streamed one when wrapped).
 */
static khor_status check_reply(etcd *e, const char *body, size_t len, int status, bool wrapped,
                               json_doc *d, int *root_out, bool *unavailable_out, kerr *err)
{
	char why[128];
	int root = 0;

	*unavailable_out = false;
	if (!json_parse(body, len, e->tok, ETCD_TOKENS, d, why, sizeof(why)))
		return not_json(body, len, why, status, err);
	if (d->tok[0].type != JSON_OBJECT)
		return not_json(body, len, "not an object", status, err);
	if (status != 200)
		return etcd_refusal(e, d, 0, status, unavailable_out, err);
	if (wrapped) {
		int eobj = json_member(d, 0, "error");
		if (eobj >= 0)
			return etcd_refusal(e, d, eobj, status, unavailable_out, err);
		root = json_member(d, 0, "result");
	}
	if (json_member(d, root, "header") < 0)
		return not_json(body, len, "no header", status, err);
	*root_out = root;
	return KHOR_SUCCESS;
}

/* One request on the kv connection, connecting first if need be. */
static khor_status attempt(etcd *e, const char *path, const struct jbuf *body, kdeadline dl,
                           kerr *err)
{
	khor_status st;

	free(e->rep.body);
	e->rep.body = NULL;
	e->kv.sent = false;
	if (e->kv.fd >= 0 && !http_idle_ok(&e->kv))
		http_close(&e->kv);
	if (e->kv.fd < 0 && (st = http_connect(&e->kv, dl, err)) != KHOR_SUCCESS)
		return unreachable(st, err, false);
	st = http_post(&e->kv, path, body->p, body->len, ETCD_REPLY_MAX, dl, &e->rep, err);
	return st == KHOR_SUCCESS ? st : unreachable(st, err, e->kv.sent);
}

/*
 * Sends body to path and checks the reply, retrying as the file's comment says. On
 * success *d holds the reply (valid until the next call on e) and *root_out its answer.
 */
static khor_status call(etcd *e, const char *op, const char *key, const char *path,
                        struct jbuf *body, bool repeatable, bool wrapped, kdeadline dl,
                        json_doc *d, int *root_out, kerr *err)
{
	int backoff = ETCD_BACKOFF_FIRST_MS, tries = 0;
	uint64_t t0 = kclock_ns();
	char first[256] = "";
	khor_status st;

	e->last_code = 0;
	if (body->oom) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "no memory for the request");
		goto fail;
	}
	for (;;) {
		bool unavailable = false;
		st = attempt(e, path, body, dl, err);
		if (st == KHOR_SUCCESS) {
			st = check_reply(e, e->rep.body, e->rep.len, e->rep.status, wrapped, d,
			                 root_out, &unavailable, err);
			if (st == KHOR_SUCCESS || !unavailable)
				goto fail;
		} else if (st != KHOR_ERR_REMOTE) {
			goto fail;
		}
		if (!repeatable && e->kv.sent) {
			size_t used = strlen(err->text);
			snprintf(err->text + used, sizeof(err->text) - used,
			         " (not repeated: it may or may not have been applied)");
			goto fail;
		}
		if (++tries == 1)
			kstrlcpy(first, err->text, sizeof(first));
		if (kdeadline_passed(dl)) {
			/* The last try ran into the deadline; the first one's cause says more. */
			size_t used = strlen(err->text);
			if (tries > 1 && strcmp(first, err->text) != 0)
				snprintf(err->text + used, sizeof(err->text) - used,
				         " (tried %d times in %llu ms; the first try: %s)", tries,
				         (unsigned long long)((kclock_ns() - t0) / 1000000), first);
			goto fail;
		}
		int left = kdeadline_left_ms(dl, backoff);
		KLOG_DEBUG("%s: %s '%s': %s; again in %d ms", e->where, op, key, err->text, left);
		sleep_ms(left);
		backoff = backoff * 2 > ETCD_BACKOFF_MAX_MS ? ETCD_BACKOFF_MAX_MS : backoff * 2;
	}
fail:
	free(body->p);
	body->p = NULL;
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "%s: %s '%s'", e->where, op, key);
	return st;
}

/* --- keys ----------------------------------------------------------------------------- */

void etcd_kv_free(struct etcd_kv *kv)
{
	if (kv != NULL) {
		free(kv->key);
		free(kv->val);
		kv->key = NULL;
		kv->val = NULL;
		kv->found = false;
	}
}

void etcd_kvs_free(struct etcd_kv *kvs, int n)
{
	for (int i = 0; i < n; i++)
		etcd_kv_free(&kvs[i]);
	free(kvs);
}

/* Reads a kv object ({"key", "value", "mod_revision", ...}; absent fields are zero). */
static bool read_kv(const json_doc *d, int obj, struct etcd_kv *out)
{
	int v = json_member(d, obj, "value"), t;

	memset(out, 0, sizeof(*out));
	if (d->tok[obj].type != JSON_OBJECT)
		return false;
	if (v < 0) {
		out->val = calloc(1, 1);
		if (out->val == NULL)
			return false;
	} else if (!json_b64(d, v, &out->val, &out->len)) {
		return false;
	}
	out->found = true;
	if ((t = json_member(d, obj, "mod_revision")) >= 0 && !json_i64(d, t, &out->mod_revision))
		goto fail_free;
	if ((t = json_member(d, obj, "create_revision")) >= 0 &&
	    !json_i64(d, t, &out->create_revision))
		goto fail_free;
	if ((t = json_member(d, obj, "lease")) >= 0 && !json_i64(d, t, &out->lease))
		goto fail_free;
	return true;
fail_free:
	etcd_kv_free(out);
	return false;
}

/* The first kv of a range answer (absent: not found). */
static khor_status read_range(etcd *e, const json_doc *d, int obj, const char *op,
                              const char *key, struct etcd_kv *kv_out, kerr *err)
{
	int kvs = json_member(d, obj, "kvs");
	int first = json_first(d, kvs);

	memset(kv_out, 0, sizeof(*kv_out));
	if (kvs < 0)
		return KHOR_SUCCESS;
	if (first < 0 || !read_kv(d, first, kv_out))
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "%s: %s '%s': the reply's kvs are not etcd's (a key-value object "
		                "with base64 value and decimal revisions)",
		                e->where, op, key);
	return KHOR_SUCCESS;
}

khor_status etcd_get(etcd *e, const char *key, kdeadline dl, struct etcd_kv *kv_out,
                     int64_t *revision_out, kerr *err)
{
	struct jbuf b = { 0 };
	json_doc d;
	int root;
	khor_status st;

	jb_add(&b, "{");
	jb_key(&b, key);
	jb_add(&b, "}");
	st = call(e, "get", key, "/v3/kv/range", &b, true, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (revision_out != NULL &&
	    !json_i64(&d, json_member(&d, json_member(&d, root, "header"), "revision"),
	              revision_out))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "%s: get '%s': the reply has no revision",
		                e->where, key);
	return read_range(e, &d, root, "get", key, kv_out, err);
}

/*
 * {"key": prefix, "range_end": the prefix with its last byte one up} into b: every key that
 * starts with prefix (a prefix ending in 0xff would need another end; never one of ours).
 * False when prefix cannot be a range.
 */
static bool jb_prefix_range(struct jbuf *b, const char *prefix)
{
	size_t pl = strlen(prefix);
	char *end;

	if (pl == 0 || (unsigned char)prefix[pl - 1] == 0xff || (end = malloc(pl)) == NULL)
		return false;
	memcpy(end, prefix, pl);
	end[pl - 1] = (char)((unsigned char)end[pl - 1] + 1);
	jb_key(b, prefix);
	jb_add(b, ",");
	jb_b64(b, "range_end", end, pl);
	free(end);
	return true;
}

khor_status etcd_list(etcd *e, const char *prefix, kdeadline dl, struct etcd_kv **kvs_out,
                      int *n_out, kerr *err)
{
	struct jbuf b = { 0 };
	struct etcd_kv *kvs;
	bool more = false;
	json_doc d;
	int root, list, n = 0;
	khor_status st;

	jb_add(&b, "{");
	if (!jb_prefix_range(&b, prefix)) {
		free(b.p);
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: list '%s': not a prefix that can be "
		                "listed", e->where, prefix);
	}
	jb_add(&b, ",\"limit\":\"%d\",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\"}",
	       ETCD_LIST_MAX + 1);
	st = call(e, "list", prefix, "/v3/kv/range", &b, true, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	list = json_member(&d, root, "kvs");
	(void)json_bool(&d, json_member(&d, root, "more"), &more);
	if (more || (list >= 0 && d.tok[list].count > ETCD_LIST_MAX))
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s: list '%s': over %d keys", e->where,
		                prefix, ETCD_LIST_MAX);
	kvs = calloc(list >= 0 ? d.tok[list].count + 1 : 1, sizeof(*kvs));
	if (kvs == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: list '%s': out of memory", e->where,
		                prefix);
	for (int kv = json_first(&d, list); kv >= 0; kv = json_after(&d, list, kv), n++) {
		uint8_t *key = NULL;
		size_t kl;
		if (!read_kv(&d, kv, &kvs[n]) ||
		    !json_b64(&d, json_member(&d, kv, "key"), &key, &kl) || strlen((char *)key) != kl) {
			free(key);
			etcd_kvs_free(kvs, n + 1);
			return kerr_set(err, KHOR_ERR_PROTOCOL,
			                "%s: list '%s': the reply's kvs are not etcd's", e->where, prefix);
		}
		kvs[n].key = (char *)key;
	}
	*kvs_out = kvs;
	*n_out = n;
	return KHOR_SUCCESS;
}

static void jb_put(struct jbuf *b, const char *key, const void *val, size_t len, int64_t lease)
{
	jb_key(b, key);
	jb_add(b, ",");
	jb_b64(b, "value", val, len);
	if (lease != 0)
		jb_add(b, ",\"lease\":\"%lld\"", (long long)lease);
}

khor_status etcd_put(etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                     kdeadline dl, kerr *err)
{
	struct jbuf b = { 0 };
	json_doc d;
	int root;

	jb_add(&b, "{");
	jb_put(&b, key, val, len, lease);
	jb_add(&b, "}");
	return call(e, "put", key, "/v3/kv/put", &b, true, false, dl, &d, &root, err);
}

khor_status etcd_del(etcd *e, const char *key, kdeadline dl, kerr *err)
{
	struct jbuf b = { 0 };
	json_doc d;
	int root;

	jb_add(&b, "{");
	jb_key(&b, key);
	jb_add(&b, "}");
	return call(e, "delete", key, "/v3/kv/deleterange", &b, true, false, dl, &d, &root, err);
}

khor_status etcd_del_prefix(etcd *e, const char *prefix, kdeadline dl, int64_t *deleted_out,
                            kerr *err)
{
	struct jbuf b = { 0 };
	json_doc d;
	int root;
	int64_t n = 0;
	khor_status st;

	jb_add(&b, "{");
	if (!jb_prefix_range(&b, prefix)) {
		free(b.p);
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: delete '%s': not a prefix that can "
		                "be deleted", e->where, prefix);
	}
	jb_add(&b, "}");
	st = call(e, "delete", prefix, "/v3/kv/deleterange", &b, true, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	(void)json_i64(&d, json_member(&d, root, "deleted"), &n); /* absent: none */
	if (deleted_out != NULL)
		*deleted_out = n;
	return KHOR_SUCCESS;
}

/*
 * A transaction: if the compare (already in b, up to "compare":[...]) holds, put val;
 * else read the key, so a caller that lost the race learns what won in the same trip.
 */
static khor_status txn_put(etcd *e, const char *op, const char *key, struct jbuf *b,
                           const void *val, size_t len, int64_t lease, kdeadline dl,
                           bool *swapped_out, struct etcd_kv *cur_out, kerr *err)
{
	struct etcd_kv cur;
	json_doc d;
	int root, t;
	bool ok = false;
	khor_status st;

	jb_add(b, "],\"success\":[{\"request_put\":{");
	jb_put(b, key, val, len, lease);
	jb_add(b, "}}],\"failure\":[{\"request_range\":{");
	jb_key(b, key);
	jb_add(b, "}}]}");
	st = call(e, op, key, "/v3/kv/txn", b, false, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	t = json_member(&d, root, "succeeded");
	if (t >= 0 && !json_bool(&d, t, &ok))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "%s: %s '%s': \"succeeded\" is not a boolean",
		                e->where, op, key);
	if (!ok) {
		t = json_member(&d, json_first(&d, json_member(&d, root, "responses")),
		                "response_range");
		if (t < 0)
			return kerr_set(err, KHOR_ERR_PROTOCOL,
			                "%s: %s '%s': a failed compare came back without the key's "
			                "range",
			                e->where, op, key);
		st = read_range(e, &d, t, op, key, &cur, err);
		if (st != KHOR_SUCCESS)
			return st;
		if (cur_out != NULL)
			*cur_out = cur;
		else
			etcd_kv_free(&cur);
	}
	*swapped_out = ok;
	return KHOR_SUCCESS;
}

khor_status etcd_cas(etcd *e, const char *key, const void *expect, size_t expect_len,
                     const void *val, size_t len, int64_t lease, kdeadline dl, bool *swapped_out,
                     struct etcd_kv *cur_out, kerr *err)
{
	struct jbuf b = { 0 };

	jb_add(&b, "{\"compare\":[{\"result\":\"EQUAL\",");
	jb_key(&b, key);
	if (expect == NULL) {
		/* A key that does not exist has create revision 0. */
		jb_add(&b, ",\"target\":\"CREATE\",\"create_revision\":\"0\"}");
	} else {
		jb_add(&b, ",\"target\":\"VALUE\",");
		jb_b64(&b, "value", expect, expect_len);
		jb_add(&b, "}");
	}
	return txn_put(e, "compare-and-swap", key, &b, val, len, lease, dl, swapped_out, cur_out,
	               err);
}

khor_status etcd_cas_revision(etcd *e, const char *key, int64_t mod_revision, const void *val,
                              size_t len, kdeadline dl, bool *swapped_out,
                              struct etcd_kv *cur_out, kerr *err)
{
	struct jbuf b = { 0 };

	jb_add(&b, "{\"compare\":[{\"result\":\"EQUAL\",\"target\":\"MOD\",");
	jb_key(&b, key);
	jb_add(&b, ",\"mod_revision\":\"%lld\"}", (long long)mod_revision);
	return txn_put(e, "compare-and-swap", key, &b, val, len, 0, dl, swapped_out, cur_out,
	               err);
}

/* --- leases --------------------------------------------------------------------------- */

khor_status etcd_lease_grant(etcd *e, int64_t ttl_s, kdeadline dl, int64_t *id_out, kerr *err)
{
	struct jbuf b = { 0 };
	char what[64], msg[256];
	json_doc d;
	int root;
	int64_t id = 0;
	khor_status st;

	snprintf(what, sizeof(what), "TTL %lld s", (long long)ttl_s);
	jb_add(&b, "{\"TTL\":\"%lld\"}", (long long)ttl_s);
	/* Repeating a grant whose reply was lost only leaves an unused lease to expire. */
	st = call(e, "lease grant", what, "/v3/lease/grant", &b, true, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (json_str(&d, json_member(&d, root, "error"), msg, sizeof(msg)) && msg[0] != '\0')
		return kerr_set(err, KHOR_ERR_REMOTE, "%s: lease grant '%s': etcd refused it: %s",
		                e->where, what, msg);
	if (!json_i64(&d, json_member(&d, root, "ID"), &id) || id == 0)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "%s: lease grant '%s': the reply has no ID",
		                e->where, what);
	*id_out = id;
	return KHOR_SUCCESS;
}

khor_status etcd_lease_keepalive(etcd *e, int64_t id, kdeadline dl, int64_t *ttl_out,
                                 kerr *err)
{
	struct jbuf b = { 0 };
	char what[32];
	json_doc d;
	int root, t;
	int64_t ttl = 0;
	khor_status st;

	snprintf(what, sizeof(what), "%lld", (long long)id);
	jb_add(&b, "{\"ID\":\"%lld\"}", (long long)id);
	/* A stream in gRPC: one request in, one {"result":...} out, and the reply ends. */
	st = call(e, "lease keepalive", what, "/v3/lease/keepalive", &b, true, true, dl, &d,
	          &root, err);
	if (st != KHOR_SUCCESS)
		return st;
	if ((t = json_member(&d, root, "TTL")) >= 0 && !json_i64(&d, t, &ttl))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "%s: lease keepalive '%s': bad TTL", e->where,
		                what);
	*ttl_out = ttl > 0 ? ttl : 0;
	return KHOR_SUCCESS;
}

khor_status etcd_lease_revoke(etcd *e, int64_t id, kdeadline dl, kerr *err)
{
	struct jbuf b = { 0 };
	char what[32];
	json_doc d;
	int root;
	khor_status st;

	snprintf(what, sizeof(what), "%lld", (long long)id);
	jb_add(&b, "{\"ID\":\"%lld\"}", (long long)id);
	st = call(e, "lease revoke", what, "/v3/lease/revoke", &b, true, false, dl, &d, &root, err);
	if (st != KHOR_SUCCESS && e->last_code == GRPC_NOT_FOUND)
		return KHOR_SUCCESS;
	return st;
}

/* --- the watch ------------------------------------------------------------------------ */

bool etcd_watching(const etcd *e)
{
	return e->watching;
}

void etcd_watch_stop(etcd *e)
{
	http_close(&e->watch);
	free(e->watch_key_b64);
	e->watch_key_b64 = NULL;
	e->watching = false;
}

khor_status etcd_watch(etcd *e, const char *key, int64_t start_revision, kdeadline dl,
                       kerr *err)
{
	struct jbuf b = { 0 };
	struct http_reply rep;
	khor_status st;
	json_doc d;
	int root;
	bool unavailable;

	etcd_watch_stop(e);
	kstrlcpy(e->watch_key, key, sizeof(e->watch_key));
	e->watch_key_b64 = malloc(json_b64_len(strlen(key)) + 1);
	if (e->watch_key_b64 == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: watch '%s': out of memory", e->where,
		                key);
	json_b64_encode(key, strlen(key), e->watch_key_b64);
	jb_add(&b, "{\"create_request\":{");
	jb_key(&b, key);
	jb_add(&b, ",\"start_revision\":\"%lld\"}}", (long long)start_revision);
	if (b.oom) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory");
		goto fail;
	}
	st = http_connect(&e->watch, dl, err);
	if (st != KHOR_SUCCESS) {
		st = unreachable(st, err, false);
		goto fail;
	}
	st = http_post_stream(&e->watch, "/v3/watch", b.p, b.len, ETCD_REPLY_MAX, dl, &rep, err);
	if (st != KHOR_SUCCESS) {
		st = unreachable(st, err, true);
		goto fail;
	}
	if (rep.status != 200) {
		st = check_reply(e, rep.body, rep.len, rep.status, false, &d, &root, &unavailable,
		                 err);
		free(rep.body);
		if (st == KHOR_SUCCESS)
			st = kerr_set(err, KHOR_ERR_PROTOCOL, "HTTP %d", rep.status);
		goto fail;
	}
	free(b.p);
	e->watching = true;
	return KHOR_SUCCESS;

fail:
	free(b.p);
	etcd_watch_stop(e);
	kerr_prefix(err, "%s: watch '%s'", e->where, key);
	return st;
}

/* One streamed message: *kv_out set and true when it carried events for the key. */
static khor_status watch_message(etcd *e, const char *line, size_t len, struct etcd_kv *kv_out,
                                 bool *got_out, kerr *err)
{
	json_doc d;
	int root, events, ev;
	bool unavailable, canceled = false;
	khor_status st;

	*got_out = false;
	st = check_reply(e, line, len, 200, true, &d, &root, &unavailable, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (json_bool(&d, json_member(&d, root, "canceled"), &canceled) && canceled) {
		char why[256] = "";
		int64_t compacted = 0;
		json_str(&d, json_member(&d, root, "cancel_reason"), why, sizeof(why));
		json_i64(&d, json_member(&d, root, "compact_revision"), &compacted);
		return kerr_set(err, KHOR_ERR_REMOTE,
		                "etcd canceled the watch (%s; compacted up to revision %lld)",
		                why[0] ? why : "no reason given", (long long)compacted);
	}
	events = json_member(&d, root, "events");
	for (ev = json_first(&d, events); ev >= 0; ev = json_after(&d, events, ev)) {
		int kv = json_member(&d, ev, "kv"), type = json_member(&d, ev, "type");
		struct etcd_kv one;
		if (!json_str_is(&d, json_member(&d, kv, "key"), e->watch_key_b64))
			continue; /* not ours; a watch on one key should not see it */
		if (type >= 0 && json_str_is(&d, type, "DELETE")) {
			etcd_kv_free(kv_out);
			memset(kv_out, 0, sizeof(*kv_out));
		} else if (type < 0 || json_str_is(&d, type, "PUT")) {
			if (!read_kv(&d, kv, &one)) {
				etcd_kv_free(kv_out);
				return kerr_set(err, KHOR_ERR_PROTOCOL,
				                "an event's key-value is not etcd's");
			}
			etcd_kv_free(kv_out);
			*kv_out = one;
		} else {
			continue;
		}
		*got_out = true;
	}
	return KHOR_SUCCESS;
}

khor_status etcd_watch_next(etcd *e, kdeadline dl, struct etcd_kv *kv_out, kerr *err)
{
	khor_status st;
	bool got;

	memset(kv_out, 0, sizeof(*kv_out));
	if (!e->watching)
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: no watch is open", e->where);
	for (;;) {
		char *line;
		size_t len;
		st = http_next_line(&e->watch, dl, &line, &len, err);
		if (st == KHOR_ERR_TIMEOUT) {
			kerr_prefix(err, "%s: watch '%s'", e->where, e->watch_key);
			return st;
		}
		if (st == KHOR_SUCCESS && len == 0)
			continue;
		if (st == KHOR_SUCCESS)
			st = watch_message(e, line, len, kv_out, &got, err);
		else
			st = unreachable(st, err, true);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "%s: watch '%s'", e->where, e->watch_key);
			etcd_watch_stop(e);
			etcd_kv_free(kv_out);
			return st;
		}
		if (got)
			return KHOR_SUCCESS;
	}
}

/* --- connecting ----------------------------------------------------------------------- */

khor_status etcd_open(const char *host, uint16_t port, kdeadline dl, etcd **out, kerr *err)
{
	char hostport[300], version[64] = "?";
	struct jbuf b = { 0 };
	ksockaddr addr;
	json_doc d;
	int root;
	khor_status st;
	etcd *e;

	snprintf(hostport, sizeof(hostport), strchr(host, ':') != NULL ? "[%s]:%u" : "%s:%u", host,
	         port);
	/* A name may not resolve yet (a pod whose DNS record comes later): retry until dl. */
	while ((st = ksock_resolve(host, port, &addr, err)) != KHOR_SUCCESS) {
		if (kdeadline_passed(dl)) {
			kerr_prefix(err, "etcd at %s: connect", hostport);
			return st;
		}
		sleep_ms(100);
	}
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "etcd at %s: connect: out of memory",
		                hostport);
	snprintf(e->where, sizeof(e->where), "etcd at %s", hostport);
	http_init(&e->kv, &addr, hostport);
	http_init(&e->watch, &addr, hostport);
	/* Proves that etcd answers there, not some other HTTP server or a khor store. */
	jb_add(&b, "{}");
	st = call(e, "connect", "status", "/v3/maintenance/status", &b, true, false, dl, &d, &root,
	          err);
	if (st != KHOR_SUCCESS) {
		etcd_close(e);
		return st;
	}
	json_str(&d, json_member(&d, root, "version"), version, sizeof(version));
	KLOG_DEBUG("%s: connected (etcd %s)", e->where, version);
	*out = e;
	return KHOR_SUCCESS;
}

void etcd_close(etcd *e)
{
	if (e == NULL)
		return;
	etcd_watch_stop(e);
	http_free(&e->kv);
	http_free(&e->watch);
	free(e->rep.body);
	free(e);
}

const char *etcd_where(const etcd *e)
{
	return e->where;
}
