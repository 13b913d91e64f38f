/* sleeper.c -- the one-sleeper rule for shared transports (sleeper.h says why). */
#include "sleeper.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

khor_status ksleeper_init(ksleeper *s, kerr *err)
{
	pthread_condattr_t a;

	memset(s, 0, sizeof(*s));
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_fd < 0) {
		char b[128];
		return kerr_set(err, KHOR_ERR_SYSTEM, "eventfd: %s",
		                kerr_errno_str(errno, b, sizeof(b)));
	}
	pthread_mutex_init(&s->cmu, NULL);
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &a);
	pthread_condattr_destroy(&a);
	return KHOR_SUCCESS;
}

void ksleeper_destroy(ksleeper *s)
{
	if (s->wake_fd < 0)
		return;
	close(s->wake_fd);
	s->wake_fd = -1;
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->cmu);
}

bool ksleeper_enter(ksleeper *s, kmutex *mu, int timeout_ms)
{
	struct timespec ts;
	unsigned long gen;

	if (!s->asleep) {
		s->asleep = true;
		s->rung = false;
		return true;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (timeout_ms < 0)
		timeout_ms = 1000; /* the caller loops on its own deadline */
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	gen = s->gen;
	s->waiting++;
	kmutex_unlock(mu);
	pthread_mutex_lock(&s->cmu);
	/* gen only moves under cmu: a wake between our unlock and this lock is not lost. */
	while (s->gen == gen && pthread_cond_timedwait(&s->cv, &s->cmu, &ts) == 0)
		;
	pthread_mutex_unlock(&s->cmu);
	kmutex_lock(mu);
	s->waiting--;
	return false;
}

static void wake_waiters(ksleeper *s)
{
	pthread_mutex_lock(&s->cmu);
	s->gen++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->cmu);
}

void ksleeper_leave(ksleeper *s)
{
	uint64_t v;

	s->asleep = false;
	if (s->rung)
		(void)!read(s->wake_fd, &v, sizeof(v)); /* if it failed, the next ring retries */
	s->rung = false;
	if (s->waiting > 0)
		wake_waiters(s);
}

void ksleeper_moved(ksleeper *s)
{
	uint64_t one = 1;

	if (s->asleep && !s->rung) {
		s->rung = true;
		if (write(s->wake_fd, &one, sizeof(one)) < 0)
			s->rung = false;
	}
	if (s->waiting > 0)
		wake_waiters(s);
}

bool kseen_changed(const void *ctx, uint64_t count)
{
	/* A thread drives a few instances (tcp, shm, later ib): a small table, oldest out. */
	static _Thread_local struct {
		const void *ctx;
		uint64_t count;
	} seen[8];
	static _Thread_local unsigned next;

	for (unsigned i = 0; i < 8; i++) {
		if (seen[i].ctx == ctx) {
			bool changed = seen[i].count != count;
			seen[i].count = count;
			return changed;
		}
	}
	seen[next].ctx = ctx;
	seen[next].count = count;
	next = (next + 1) % 8;
	return true;
}
