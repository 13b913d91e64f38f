/*
 * store.h -- the rendezvous key-value store interface.
 *
 * The store carries bootstrap data only: addresses, host names, counters, the abort
 * notice. Tensors never go through it. Backends (the embedded TCP store, etcd; a file on
 * a shared disk later) implement store_ops; callers use the store_* wrappers, which
 * put every key under "<job id>/<generation>/" so jobs and elastic generations never see
 * each other's keys.
 *
 * Ownership: a store object is used by one thread at a time (the runtime serialises its
 * use). Values returned by get are malloc'd and owned by the caller.
 */
#ifndef KHOR_RUNTIME_STORE_H
#define KHOR_RUNTIME_STORE_H

#include "base/clock.h"
#include "base/err.h"

#include <stdbool.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Limits enforced by every backend and by the TCP server on the wire. */
#define STORE_KEY_MAX 512
#define STORE_VALUE_MAX (1u << 20)
#define STORE_PREFIX_MAX 128

typedef struct store store;

struct store_ops {
	/* Sets key to value, replacing any old value, and wakes getters waiting on it. */
	khor_status (*set)(store *s, const char *key, const void *val, size_t len, kerr *err);
	/*
	 * Waits until key exists or the deadline passes (KHOR_ERR_TIMEOUT, err names the key).
	 * A deadline already passed makes it a non-blocking check. *val_out is malloc'd and
	 * NUL-terminated one byte past *len_out for convenience.
	 */
	khor_status (*get)(store *s, const char *key, kdeadline dl, void **val_out,
	                   size_t *len_out, kerr *err);
	/* Atomically adds delta to the decimal integer at key (absent = 0); returns the new value. */
	khor_status (*add)(store *s, const char *key, int64_t delta, int64_t *value_out, kerr *err);
	/* Removes key; absent keys are not an error. */
	khor_status (*del)(store *s, const char *key, kerr *err);
	/* Closes the connection and frees s. */
	void (*close)(store *s);
	/*
	 * Optional, and the one op that may be called while another thread is inside a call
	 * on s: makes that call return at once with an error, and every later one fail, so
	 * that a thread parked in a long get can be stopped without waiting out its slice.
	 * Only close may follow. NULL where the backend cannot do it safely (its call then
	 * ends at the slice's end).
	 */
	void (*interrupt)(store *s);
};

/*
 * The wrappers may be called from several threads at once (the comms of a context share
 * one store connection): each call holds mu for its round trip, and a get with a long
 * deadline waits in slices of STORE_WAIT_SLICE_MS with mu released between them, so that a
 * thread checking for an abort is not held up behind another's long wait.
 */
#define STORE_WAIT_SLICE_MS 50

struct store {
	const struct store_ops *ops;
	char prefix[STORE_PREFIX_MAX];     /* "<job>/<generation>/" */
	char job_prefix[STORE_PREFIX_MAX]; /* "<job>/0/": the job-wide keys, at any generation */
	pthread_mutex_t mu;
	/*
	 * The deadline of the whole get in progress, of which ops->get sees one slice: a
	 * backend that retries an unreachable server within slices (etcd's) reports it as a
	 * timeout of the slice, and as the error it is only in the last one.
	 */
	kdeadline get_until;
};

/* For backends: sets up the fields above (ops and the lock). */
void store_base_init(store *s, const struct store_ops *ops);

/* Wrappers that apply the prefix. */
void store_set_prefix(store *s, const char *job_id, int generation);
khor_status store_set(store *s, const char *key, const void *val, size_t len, kerr *err);
khor_status store_get(store *s, const char *key, kdeadline dl, void **val_out, size_t *len_out,
                      kerr *err);
khor_status store_add(store *s, const char *key, int64_t delta, int64_t *value_out, kerr *err);
khor_status store_del(store *s, const char *key, kerr *err);
/*
 * store_add on a job-wide key (generation 0's), without moving the prefix: safe while
 * other threads use s under the generation's prefix.
 */
khor_status store_add_job(store *s, const char *key, int64_t delta, int64_t *value_out,
                          kerr *err);
void store_close(store *s);
/* ops->interrupt where the backend has one; a no-op elsewhere. */
void store_interrupt(store *s);

/*
 * The embedded TCP store. The client connects (retrying until dl while the server starts),
 * proves the job secret (secret may be "" for an unauthenticated job) and returns a store.
 */
khor_status store_tcp_connect(const char *host, uint16_t port, const char *secret,
                              const char *job_id, kdeadline dl, store **store_out, kerr *err);

/*
 * etcd as the store (store_etcd.c), through its JSON gateway on the client port. Keys are
 * the full keys; the job's isolation is the prefix alone: etcd knows nothing of khor's
 * job secret, and TLS and etcd's own authentication are not supported yet.
 */
khor_status store_etcd_connect(const char *host, uint16_t port, kdeadline dl,
                               store **store_out, kerr *err);

/*
 * Connects to the store at addr (store_connect.c): "host:port" or "[v6]:port" is the
 * embedded TCP store, proven with the secret and job id; "etcd://host:port" an etcd server
 * (the secret is then not used: see store_etcd_connect).
 */
#define STORE_ETCD_SCHEME "etcd://"
khor_status store_connect(const char *addr, const char *secret, const char *job_id,
                          kdeadline dl, store **store_out, kerr *err);

/*
 * The server runs on its own thread with epoll. bind_host may be NULL for all interfaces;
 * port 0 picks a free port, reported by store_server_port. Refuses clients that fail the
 * handshake (logged, others unharmed) and malformed or oversized requests (that client is
 * answered with an error and dropped).
 */
typedef struct store_server store_server;
khor_status store_server_start(const char *bind_host, uint16_t port, const char *secret,
                               const char *job_id, store_server **server_out, kerr *err);
uint16_t store_server_port(const store_server *srv);
/* How many keys hold a value now (from any thread): a job that cleans up after itself keeps
 * this flat however many groups it makes. */
size_t store_server_values(const store_server *srv);
void store_server_stop(store_server *srv); /* joins the thread, closes every socket */

#endif
