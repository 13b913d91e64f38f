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
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &a);
	pthread_condattr_destroy(&a);
	return KHOR_SUCCESS;
}

void ksleeper_destroy(ksleeper *s)
{
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	s->wake_fd = -1;
	pthread_cond_destroy(&s->cv);
}

bool ksleeper_enter(ksleeper *s, pthread_mutex_t *mu, int timeout_ms)
{
	struct timespec ts;

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
	s->waiting++;
	pthread_cond_timedwait(&s->cv, mu, &ts);
	s->waiting--;
	return false;
}

void ksleeper_leave(ksleeper *s)
{
	uint64_t v;

	s->asleep = false;
	if (s->rung && read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		(void)0; /* nothing else to do: the next ring retries */
	s->rung = false;
	if (s->waiting > 0)
		pthread_cond_broadcast(&s->cv);
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
		pthread_cond_broadcast(&s->cv);
}
