/*
 * store_etcd.c -- etcd as the rendezvous store (store.h's ops over etcd.h). A job that
 * names its store "etcd://host:port" needs no khorrun or rank 0 to serve one, and its keys
 * outlive every process of the job, as an elastic job's plans must.
 *
 *   set  a put;  del  a delete;
 *   add  a compare-and-swap loop: read the counter, then a transaction that puts the sum
 *        only if the key's mod revision is still the one read (0: absent), else returns
 *        the newer value to try again from; no increment is lost or doubled;
 *   get  a range, then a watch from the range's revision on, so a waiting rank costs etcd
 *        one idle stream, not a poll loop; the watch stays open across the wrappers'
 *        50 ms slices of one get and is dropped when the key comes or another key is
 *        waited for.
 *
 * etcd unreachable in the middle of a get (stopped, restarting) is retried until the get's
 * deadline: a restart within it is not noticed by the caller; past it the error says that
 * etcd could not be reached, not that nobody set the key.
 *
 * etcd knows nothing of khor's job secret: anyone who can reach its port can read and write
 * the job's keys (the links between ranks still prove the secret). TLS and etcd's own users
 * are not supported yet.
 */
#include "store_proto.h"

#include "base/log.h"
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As the tcp store's: a live etcd answers in milliseconds; this is for one that restarts. */
#define STORE_ETCD_OP_MS 60000
/*
 * A get's requests (the range, the watch's creation) may take this long even when its own
 * deadline is nearer or has passed (a plain look): a round trip through raft is not free.
 * Not while etcd is found out of reach: then reconnecting stops at the get's deadline, so
 * that the error comes by it.
 */
#define STORE_ETCD_LOOK_MS 2000

struct store_etcd {
	store base;
	etcd *e;
	char watch_key[STORE_KEY_MAX + 1]; /* the key the open watch waits for */
	bool down; /* the last get found etcd out of reach */
};

static khor_status etcd_store_set(store *s, const char *key, const void *val, size_t len,
                                  kerr *err)
{
	struct store_etcd *t = (struct store_etcd *)s;

	if (len > STORE_VALUE_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "%s: set '%s': the value is %zu bytes, over the limit of %u; the "
		                "store is meant for small bootstrap data",
		                etcd_where(t->e), key, len, STORE_VALUE_MAX);
	return etcd_put(t->e, key, val, len, 0, kdeadline_in_ms(STORE_ETCD_OP_MS), err);
}

static khor_status timed_out(struct store_etcd *t, const char *key, kerr *err)
{
	t->down = false;
	return kerr_set(err, KHOR_ERR_TIMEOUT,
	                "%s: get '%s': timed out: nobody set the key before the deadline (is "
	                "the process that publishes it running, and in the same job?)",
	                etcd_where(t->e), key);
}

/*
 * etcd out of reach: in a slice before the last, a timeout of the slice (the wrapper goes
 * on, and a restarted etcd is found again); in the last, the error it is.
 */
static khor_status unreachable_in_slice(store *s, kdeadline dl, khor_status st, kerr *err)
{
	((struct store_etcd *)s)->down = st == KHOR_ERR_REMOTE;
	if (st == KHOR_ERR_REMOTE && dl.at_ns < s->get_until.at_ns) {
		err->status = KHOR_ERR_TIMEOUT;
		return KHOR_ERR_TIMEOUT;
	}
	return st;
}

static khor_status etcd_store_get(store *s, const char *key, kdeadline dl, void **val_out,
                                  size_t *len_out, kerr *err)
{
	struct store_etcd *t = (struct store_etcd *)s;
	bool look = kdeadline_passed(dl); /* a non-blocking check */
	kdeadline rdl = kdeadline_in_ms(STORE_ETCD_LOOK_MS);
	struct etcd_kv kv;
	int64_t rev;
	khor_status st;

	if (t->down || rdl.at_ns < dl.at_ns)
		rdl = dl;
	/* Waiting for another key ends the old wait's watch; a mere look leaves it be. */
	if (!look && etcd_watching(t->e) && strcmp(t->watch_key, key) != 0)
		etcd_watch_stop(t->e);
	for (;;) {
		if (!look && etcd_watching(t->e)) {
			st = etcd_watch_next(t->e, dl, &kv, err);
			if (st == KHOR_SUCCESS && kv.found)
				break;
			if (st == KHOR_SUCCESS)
				continue; /* deleted again: wait on */
			if (st == KHOR_ERR_TIMEOUT)
				return timed_out(t, key, err);
			if (st != KHOR_ERR_REMOTE)
				return st;
			/* The watch broke (etcd went away?): look again, then watch anew. */
			KLOG_DEBUG("%s", err->text);
		}
		st = etcd_get(t->e, key, rdl, &kv, &rev, err);
		if (st != KHOR_SUCCESS)
			return unreachable_in_slice(s, dl, st, err);
		if (kv.found)
			break;
		if (kdeadline_passed(dl))
			return timed_out(t, key, err);
		st = etcd_watch(t->e, key, rev + 1, rdl, err);
		if (st != KHOR_SUCCESS)
			return unreachable_in_slice(s, dl, st, err);
		kstrlcpy(t->watch_key, key, sizeof(t->watch_key));
	}
	t->down = false;
	if (etcd_watching(t->e) && strcmp(t->watch_key, key) == 0)
		etcd_watch_stop(t->e);
	*val_out = kv.val;
	*len_out = kv.len;
	return KHOR_SUCCESS;
}

static khor_status etcd_store_add(store *s, const char *key, int64_t delta, int64_t *value_out,
                                  kerr *err)
{
	struct store_etcd *t = (struct store_etcd *)s;
	kdeadline dl = kdeadline_in_ms(STORE_ETCD_OP_MS);
	struct etcd_kv cur, next;
	khor_status st;
	bool swapped;

	st = etcd_get(t->e, key, dl, &cur, NULL, err);
	for (int tries = 1; st == KHOR_SUCCESS; tries++) {
		int64_t old = 0, now = 0;
		char text[24];
		if (cur.found && !store_parse_int64(cur.val, cur.len, &old))
			st = kerr_set(err, KHOR_ERR_INVALID_ARG,
			              "%s: add '%s': refused: the value at this key is not a decimal "
			              "integer",
			              etcd_where(t->e), key);
		else if (__builtin_add_overflow(old, delta, &now))
			st = kerr_set(err, KHOR_ERR_INVALID_ARG,
			              "%s: add '%s': refused: the counter would overflow int64",
			              etcd_where(t->e), key);
		else if (tries > 1 && kdeadline_passed(dl))
			st = kerr_set(err, KHOR_ERR_TIMEOUT,
			              "%s: add '%s': lost the race to other writers %d times until the "
			              "deadline",
			              etcd_where(t->e), key, tries - 1);
		if (st != KHOR_SUCCESS)
			break;
		int n = snprintf(text, sizeof(text), "%lld", (long long)now);
		st = etcd_cas_revision(t->e, key, cur.found ? cur.mod_revision : 0, text, (size_t)n,
		                       dl, &swapped, &next, err);
		etcd_kv_free(&cur);
		if (st != KHOR_SUCCESS)
			return st;
		if (swapped) {
			if (value_out != NULL)
				*value_out = now;
			return KHOR_SUCCESS;
		}
		cur = next; /* what the winner wrote, from the failed transaction */
	}
	etcd_kv_free(&cur);
	return st;
}

static khor_status etcd_store_del(store *s, const char *key, kerr *err)
{
	struct store_etcd *t = (struct store_etcd *)s;

	return etcd_del(t->e, key, kdeadline_in_ms(STORE_ETCD_OP_MS), err);
}

static void etcd_store_close(store *s)
{
	struct store_etcd *t = (struct store_etcd *)s;

	etcd_close(t->e);
	free(t);
}

/*
 * No interrupt op: a get redials etcd inside its slices, so the connection's descriptor is
 * not fixed and may not be shut down from another thread; a get there ends with its slice.
 */
static const struct store_ops store_etcd_ops = {
	.set = etcd_store_set,
	.get = etcd_store_get,
	.add = etcd_store_add,
	.del = etcd_store_del,
	.close = etcd_store_close,
};

khor_status store_etcd_connect(const char *host, uint16_t port, kdeadline dl,
                               store **store_out, kerr *err)
{
	struct store_etcd *t = calloc(1, sizeof(*t));
	khor_status st;

	if (t == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "etcd at %s:%u: connect: out of memory",
		                host, port);
	st = etcd_open(host, port, dl, &t->e, err);
	if (st != KHOR_SUCCESS) {
		free(t);
		return st;
	}
	store_base_init(&t->base, &store_etcd_ops);
	*store_out = &t->base;
	return KHOR_SUCCESS;
}
