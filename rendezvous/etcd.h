/*
 * etcd.h -- a small etcd v3 client over etcd's JSON gateway (HTTP/1.1 and JSON on the
 * client port, 2379 by default; no gRPC): keys, compare-and-swap, leases and a watch. It
 * carries the rendezvous store's etcd backend (store_etcd.c) and the launcher's agents,
 * which need a lease to register under and a compare-and-swap to elect a leader with.
 *
 * Every call has a deadline. While etcd cannot be reached (stopped, restarting, no leader
 * yet) a call that is safe to repeat retries until its deadline; a write whose reply was
 * lost is not repeated (it may have been applied), and says so. Errors read "etcd at
 * HOST:PORT: OP 'KEY': cause", etcd's own error text included; a reply that is not etcd's
 * JSON is KHOR_ERR_PROTOCOL, and etcd out of reach is KHOR_ERR_REMOTE.
 *
 * Not done: TLS and etcd's own authentication (user/password, client certificates); the
 * endpoint must accept plain HTTP from this host. One endpoint, not a member list.
 *
 * An etcd object is used by one thread at a time. Values returned are malloc'd, owned by
 * the caller and NUL-terminated one byte past their length.
 */
#ifndef KHOR_RENDEZVOUS_ETCD_H
#define KHOR_RENDEZVOUS_ETCD_H

#include "base/clock.h"
#include "base/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct etcd etcd;

/* A key's value and revisions, as a range or a failed compare returns it. */
struct etcd_kv {
	bool found;
	char *key;    /* the key (etcd_list's entries; NULL elsewhere) */
	uint8_t *val; /* NULL when not found */
	size_t len;
	int64_t mod_revision, create_revision, lease;
};

void etcd_kv_free(struct etcd_kv *kv);

/* Connects to etcd's client port and checks that etcd answers there (retrying until dl). */
khor_status etcd_open(const char *host, uint16_t port, kdeadline dl, etcd **out, kerr *err);
void etcd_close(etcd *e);
/* "etcd at HOST:PORT", for messages. */
const char *etcd_where(const etcd *e);

/* *kv_out gets the key's value or found = false; *revision_out (may be NULL) the store's. */
khor_status etcd_get(etcd *e, const char *key, kdeadline dl, struct etcd_kv *kv_out,
                     int64_t *revision_out, kerr *err);
/* Puts a value, bound to lease (0: none): the key goes when the lease does. */
khor_status etcd_put(etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                     kdeadline dl, kerr *err);
/*
 * Every key that starts with prefix, oldest first (by create revision): *kvs_out is a
 * malloc'd array of *n_out entries with their keys (free with etcd_kvs_free). More than
 * ETCD_LIST_MAX keys is an error: the listing is for a job's hosts, not a database.
 */
#define ETCD_LIST_MAX 500
khor_status etcd_list(etcd *e, const char *prefix, kdeadline dl, struct etcd_kv **kvs_out,
                      int *n_out, kerr *err);
void etcd_kvs_free(struct etcd_kv *kvs, int n);
/* Deletes a key; an absent key is not an error. */
khor_status etcd_del(etcd *e, const char *key, kdeadline dl, kerr *err);
/* Deletes every key that starts with prefix; *deleted_out (may be NULL) says how many. */
khor_status etcd_del_prefix(etcd *e, const char *prefix, kdeadline dl, int64_t *deleted_out,
                            kerr *err);

/*
 * Compare-and-swap: puts val (bound to lease, 0: none) if the key is absent (expect NULL)
 * or holds exactly expect[0..expect_len). *swapped_out says whether it did; when it did
 * not, *cur_out (may be NULL) gets what the key holds (found or not).
 */
khor_status etcd_cas(etcd *e, const char *key, const void *expect, size_t expect_len,
                     const void *val, size_t len, int64_t lease, kdeadline dl, bool *swapped_out,
                     struct etcd_kv *cur_out, kerr *err);
/* The same with the key's mod revision as the condition (0: absent). */
khor_status etcd_cas_revision(etcd *e, const char *key, int64_t mod_revision, const void *val,
                              size_t len, kdeadline dl, bool *swapped_out,
                              struct etcd_kv *cur_out, kerr *err);

/* A lease of ttl_s seconds; its keys go when it expires unkept or is revoked. */
khor_status etcd_lease_grant(etcd *e, int64_t ttl_s, kdeadline dl, int64_t *id_out, kerr *err);
/* Renews the lease; *ttl_out is its new TTL in seconds, 0 when it no longer exists. */
khor_status etcd_lease_keepalive(etcd *e, int64_t id, kdeadline dl, int64_t *ttl_out,
                                 kerr *err);
/* Revokes the lease and deletes its keys; a lease already gone is not an error. */
khor_status etcd_lease_revoke(etcd *e, int64_t id, kdeadline dl, kerr *err);

/*
 * A watch on one key from start_revision on, on a connection of its own (the other calls
 * go on meanwhile). One at a time: a new watch ends the old one. etcd_watch_next returns
 * the key's newest state after the next batch of changes (a put: found with the value; a
 * delete: not found), KHOR_ERR_TIMEOUT at dl (the watch goes on), or an error when the
 * watch broke (etcd went away, or compacted start_revision): then watch again from a
 * fresh etcd_get.
 */
khor_status etcd_watch(etcd *e, const char *key, int64_t start_revision, kdeadline dl,
                       kerr *err);
khor_status etcd_watch_next(etcd *e, kdeadline dl, struct etcd_kv *kv_out, kerr *err);
void etcd_watch_stop(etcd *e);
bool etcd_watching(const etcd *e);

#endif
