/*
 * sleeper.h -- one thread sleeps in the kernel for a transport that several threads drive.
 *
 * A transport instance is shared by every comm of a context, so two threads may wait on it
 * at once, each for its own transfers. Bytes for either can arrive on any socket, and
 * whoever drives the transport moves them all. If both slept in epoll_wait, an event would
 * wake only one of them, and the other would sleep out its timeout although its data had
 * come. So at most one thread (the sleeper) waits in the kernel, with the transport's lock
 * released; the others wait on a condition variable, and the sleeper wakes them when it
 * returns. A thread that moves bytes while someone sleeps in the kernel rings wake_fd, an
 * eventfd in the transport's poll set, since what it moved may be what the sleeper waits for.
 *
 * Every function is called with the transport's lock (mu) held.
 */
#ifndef KHOR_BASE_SLEEPER_H
#define KHOR_BASE_SLEEPER_H

#include "err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * The transport's lock, with a count of threads blocked on it. A thread that spins on
 * progress(0) would otherwise take the lock again and again while another thread waits
 * for it (glibc's mutex is not fair): measured, two comms' 8-byte allreduces took 10-20 ms
 * instead of microseconds, one scheduler tick each. A spinner asks kmutex_trylock_polite,
 * which gives way while anyone waits.
 */
typedef struct kmutex {
	pthread_mutex_t m;
	atomic_int waiting;
} kmutex;

static inline void kmutex_init(kmutex *k)
{
	pthread_mutex_init(&k->m, NULL);
	atomic_init(&k->waiting, 0);
}

static inline void kmutex_lock(kmutex *k)
{
	if (pthread_mutex_trylock(&k->m) == 0)
		return;
	atomic_fetch_add_explicit(&k->waiting, 1, memory_order_relaxed);
	pthread_mutex_lock(&k->m);
	atomic_fetch_sub_explicit(&k->waiting, 1, memory_order_relaxed);
}

/* The lock if it is free and nobody waits for it; false (not locked) otherwise. */
static inline bool kmutex_trylock_polite(kmutex *k)
{
	if (atomic_load_explicit(&k->waiting, memory_order_relaxed) > 0)
		return false;
	return pthread_mutex_trylock(&k->m) == 0;
}

static inline void kmutex_unlock(kmutex *k)
{
	pthread_mutex_unlock(&k->m);
}

typedef struct ksleeper {
	pthread_mutex_t cmu; /* cv's own lock: the waiters take the transport's lock back
	                      * through kmutex_lock, so that spinners give way to them */
	pthread_cond_t cv;
	unsigned long gen;   /* bumped (under the transport's lock and cmu) on every wake */
	int wake_fd;   /* eventfd, readable when the sleeper should return */
	bool asleep;   /* a thread is inside the kernel wait */
	bool rung;     /* wake_fd was written since the sleeper went in */
	int waiting;   /* threads waiting on cv */
} ksleeper;

khor_status ksleeper_init(ksleeper *s, kerr *err);
void ksleeper_destroy(ksleeper *s);
/*
 * Nothing moved and the caller would sleep up to timeout_ms: true means it is now the
 * sleeper and must unlock mu, wait in the kernel, lock mu and call ksleeper_leave; false
 * means another thread was the sleeper and this one waited on cv instead (mu held again).
 */
bool ksleeper_enter(ksleeper *s, kmutex *mu, int timeout_ms);
/* The kernel wait is over: drains wake_fd and wakes the threads waiting on cv. */
void ksleeper_leave(ksleeper *s);
/* Something moved: the sleeper and the cv waiters may have been waiting for it. */
void ksleeper_moved(ksleeper *s);

/*
 * Completions seen per thread. A thread that waits for its transfers learns from progress()
 * that something moved, and then tests them; but with several threads on one transport,
 * another thread may move (and complete) them, and the waiter's own progress() would find
 * nothing to do and sleep out its timeout. So each transport counts its completions, and
 * progress() also reports as moved any completion this thread has not seen yet.
 * kseen_changed compares the count with what this thread saw of ctx last and remembers it.
 */
bool kseen_changed(const void *ctx, uint64_t count);

#endif
