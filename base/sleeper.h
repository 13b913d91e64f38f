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
#include <stdbool.h>

typedef struct ksleeper {
	pthread_cond_t cv;
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
bool ksleeper_enter(ksleeper *s, pthread_mutex_t *mu, int timeout_ms);
/* The kernel wait is over: drains wake_fd and wakes the threads waiting on cv. */
void ksleeper_leave(ksleeper *s);
/* Something moved: the sleeper and the cv waiters may have been waiting for it. */
void ksleeper_moved(ksleeper *s);

#endif
