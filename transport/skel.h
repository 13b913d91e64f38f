/*
 * skel.h -- the part of a transport that is the same in tcp, shm and ib, written once.
 *
 * Like nng's framework, which takes the pipe's lock before it calls a transport, the
 * skeleton owns the instance's lock (transport.h: "every op takes the instance's lock") and
 * what hangs off it: the one-sleeper rule (base/sleeper.h), the count of completions that
 * tells a thread another one finished its transfers, the pool of free requests, the
 * prologue and epilogue of progress(), wake, and the ops that only take the lock around a
 * body of the transport's own (connect, accept, link_ready, describe, isend, irecv, test,
 * cancel, link_error, sever). A transport puts a tp_skel first in its struct tp_ctx, writes those
 * bodies as static <tp>_<op>_locked functions, and gets the ops from TP_SKEL_LOCKED_OPS.
 *
 * The wrappers are made by a macro and not called through a table of the transport's
 * bodies, so isend/irecv/test, the hot path, cost no indirect call: each is the lock, a
 * direct call the compiler inlines, the unlock, as before.
 *
 * wake() is lock-free (transport.h): it bumps the completion count and, only when a thread
 * sleeps in the kernel, writes the eventfd that thread waits on. The sleeper raises
 * in_kernel before its last look at the count (tp_skel_sleep_begin), and the waker bumps
 * the count before it looks at in_kernel, both sequentially consistent, so one of the two
 * always sees the other: a wake is never lost between the sleeper's last look and its
 * kernel wait.
 */
#ifndef KHOR_TRANSPORT_SKEL_H
#define KHOR_TRANSPORT_SKEL_H

#include "transport.h"

#include "base/sleeper.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct tp_skel {
	kmutex mu;                    /* the instance's lock: taken by every op */
	ksleeper sl;                  /* who sleeps in the kernel for the instance */
	_Atomic uint64_t completions; /* requests finished, and wakes, for kseen_changed */
	atomic_bool in_kernel;        /* the sleeper is (about to be) in its kernel wait */
	atomic_bool rung;             /* wake() wrote sl.wake_fd: the sleeper drains it */
	void *free_reqs;              /* released requests, linked through their first word */
	bool ready;                   /* tp_skel_init succeeded: destroy has work to do */
} tp_skel;

/* Lock, sleeper and eventfd; on failure nothing is left to destroy. */
khor_status tp_skel_init(tp_skel *sk, kerr *err);
/* Frees the pooled requests and what init made. Safe on a zeroed tp_skel, and on one
 * whose init failed. */
void tp_skel_destroy(tp_skel *sk);

/* The wake op, for any transport whose tp_ctx starts with its tp_skel. Lock-free. */
void tp_skel_wake(tp_ctx *ctx);
/* The caps op of a transport that takes any host memory as it is: nothing to register,
 * nothing to flush (tcp, shm). */
void tp_skel_caps_plain(const tp_ctx *ctx, tp_caps *out);

/*
 * A request from the pool, or malloc'ed when the pool is empty (NULL without memory); not
 * zeroed. Every request of an instance has the same size. The pool is the instance's:
 * requests are recycled, never freed, until destroy.
 */
static inline void *tp_skel_req_get(tp_skel *sk, size_t size)
{
	void **r = sk->free_reqs;

	if (r == NULL)
		return malloc(size);
	sk->free_reqs = *r;
	return r;
}

static inline void tp_skel_req_put(tp_skel *sk, void *req)
{
	*(void **)req = sk->free_reqs;
	sk->free_reqs = req;
}

/* A request finished: every thread's next progress() hears of it (kseen_changed). */
static inline void tp_skel_completed(tp_skel *sk)
{
	atomic_fetch_add_explicit(&sk->completions, 1, memory_order_relaxed);
}

/* Whether a request finished (or a wake came) since this thread last asked. */
static inline bool tp_skel_seen(tp_skel *sk)
{
	return kseen_changed(sk, atomic_load(&sk->completions));
}

/* Something moved: the sleeper and the threads waiting for it may want it. Lock held. */
static inline void tp_skel_moved(tp_skel *sk)
{
	if (sk->sl.asleep || sk->sl.waiting > 0)
		ksleeper_moved(&sk->sl);
}

/*
 * The prologue of progress(): takes the lock; false when the caller spins (timeout 0) and
 * the lock is busy or wanted by a waiting thread (kmutex_trylock_polite): it should give
 * way and return at once, with *moved_out already set from the completion count.
 */
static inline bool tp_skel_progress_begin(tp_skel *sk, int timeout_ms, bool *moved_out)
{
	if (timeout_ms != 0) {
		kmutex_lock(&sk->mu);
		return true;
	}
	if (kmutex_trylock_polite(&sk->mu))
		return true;
	if (moved_out != NULL)
		*moved_out = tp_skel_seen(sk);
	return false;
}

/*
 * The epilogue: wakes the others when this call moved something (which may be what they
 * wait for), unlocks, and reports moved, or a completion this thread has not seen yet.
 */
static inline void tp_skel_progress_end(tp_skel *sk, bool moved, bool *moved_out)
{
	if (moved)
		tp_skel_moved(sk);
	bool seen = tp_skel_seen(sk);
	kmutex_unlock(&sk->mu);
	if (moved_out != NULL)
		*moved_out = moved || seen;
}

/*
 * Nothing moved and the caller would wait up to timeout_ms. True: it is the sleeper; it
 * must look once more (tp_skel_seen and its own queues: a wake or a completion may have
 * come since it last looked), then unlock, wait in the kernel (not at all if that look found
 * something), lock, and call tp_skel_sleep_end. False: another thread was the sleeper and
 * has returned; the lock is held again.
 */
static inline bool tp_skel_sleep_begin(tp_skel *sk, int timeout_ms)
{
	if (!ksleeper_enter(&sk->sl, &sk->mu, timeout_ms))
		return false;
	atomic_store(&sk->in_kernel, true);
	return true;
}

/*
 * The kernel wait is over (lock held): drains the wakes and lets the waiting threads go.
 * saw_wake: the wait reported the eventfd readable. It is drained then even when the waker
 * has not raised its flag yet (it writes first): a count left in it would make every
 * spinning thread's poll of it return at once, and a wake-up is never anyone's progress.
 */
void tp_skel_sleep_end(tp_skel *sk, bool saw_wake);

/*
 * Records a link's first error in err, as "who: what" (who NULL: "what"), and logs it at
 * debug level; a link keeps its first error, so a later failure changes nothing and
 * returns false. True when this call set it: the caller then does what a failure does to
 * its link (shut a socket, tell the peer, fail the requests).
 */
bool tp_skel_fail(kerr *err, khor_status st, const char *who, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
bool tp_skel_vfail(kerr *err, khor_status st, const char *who, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));

/*
 * The ops that take the lock around the transport's body, for transport tp: defines
 * tp_connect, tp_accept, tp_link_ready, tp_describe, tp_isend, tp_irecv, tp_test, tp_cancel,
 * tp_link_error and tp_sever on top of the static tp_connect_locked ... tp_sever_locked
 * written above it (sever also wakes the instance's sleeper, which has a link to report). Needs l->ctx, ctx->sk and l->err (the link's first error).
 */
#define TP_SKEL_LOCKED_OPS(tp)                                                                    \
	static khor_status tp##_connect(tp_ctx *ctx, int peer, const char *peer_addr,             \
	                                tp_link **link_out, kerr *err)                             \
	{                                                                                          \
		kmutex_lock(&ctx->sk.mu);                                                          \
		khor_status st = tp##_connect_locked(ctx, peer, peer_addr, link_out, err);         \
		kmutex_unlock(&ctx->sk.mu);                                                        \
		return st;                                                                         \
	}                                                                                          \
	static khor_status tp##_accept(tp_ctx *ctx, int peer, tp_link **link_out, kerr *err)     \
	{                                                                                          \
		kmutex_lock(&ctx->sk.mu);                                                          \
		khor_status st = tp##_accept_locked(ctx, peer, link_out, err);                     \
		kmutex_unlock(&ctx->sk.mu);                                                        \
		return st;                                                                         \
	}                                                                                          \
	static bool tp##_link_ready(const tp_link *l)                                              \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		bool ready = tp##_link_ready_locked(l);                                            \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
		return ready;                                                                      \
	}                                                                                          \
	static void tp##_describe(const tp_link *l, char *buf, size_t len)                        \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		tp##_describe_locked(l, buf, len);                                                 \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
	}                                                                                          \
	static khor_status tp##_isend(tp_link *l, const void *buf, size_t len, tp_tag tag,        \
	                              tp_mr *mr, tp_req **req_out, kerr *err)                      \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		khor_status st = tp##_isend_locked(l, buf, len, tag, mr, req_out, err);            \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
		return st;                                                                         \
	}                                                                                          \
	static khor_status tp##_irecv(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,   \
	                              tp_req **req_out, kerr *err)                                 \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		khor_status st = tp##_irecv_locked(l, buf, len, tag, mr, req_out, err);            \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
		return st;                                                                         \
	}                                                                                          \
	static khor_status tp##_test(tp_req *r, bool *done_out, kerr *err)                        \
	{                                                                                          \
		tp_ctx *ctx = r->link->ctx;                                                        \
		kmutex_lock(&ctx->sk.mu);                                                          \
		khor_status st = tp##_test_locked(r, done_out, err);                               \
		kmutex_unlock(&ctx->sk.mu);                                                        \
		return st;                                                                         \
	}                                                                                          \
	static void tp##_cancel(tp_req *r)                                                         \
	{                                                                                          \
		tp_ctx *ctx = r->link->ctx;                                                        \
		kmutex_lock(&ctx->sk.mu);                                                          \
		tp##_cancel_locked(r);                                                             \
		kmutex_unlock(&ctx->sk.mu);                                                        \
	}                                                                                          \
	static khor_status tp##_link_error(tp_link *l, kerr *err_out)                             \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		khor_status st = l->err.status;                                                    \
		if (st != KHOR_SUCCESS && err_out != NULL)                                         \
			*err_out = l->err;                                                         \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
		return st;                                                                         \
	}                                                                                          \
	static void tp##_sever(tp_link *l, const char *why)                                        \
	{                                                                                          \
		kmutex_lock(&l->ctx->sk.mu);                                                       \
		tp##_sever_locked(l, why);                                                         \
		kmutex_unlock(&l->ctx->sk.mu);                                                     \
		tp_skel_wake(l->ctx);                                                              \
	}

#endif
