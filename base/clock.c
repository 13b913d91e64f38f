/* clock.c -- monotonic clock and deadline arithmetic (see clock.h). */
#include "clock.h"

#include <stdatomic.h>
#include <time.h>

static uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

uint64_t kclock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts_ns(&ts);
}

kdeadline kdeadline_in_ms(int64_t ms)
{
	kdeadline d;

	d.at_ns = ms < 0 ? UINT64_MAX : kclock_ns() + (uint64_t)ms * 1000000ull;
	return d;
}

kdeadline kdeadline_in_ms_coarse(int64_t ms, uint64_t *now_ns)
{
	static _Atomic uint64_t tick_ns; /* the coarse clock's resolution, once known */
	struct timespec ts;
	kdeadline d;

	uint64_t tick = atomic_load_explicit(&tick_ns, memory_order_relaxed);
	if (tick == 0) {
		if (clock_getres(CLOCK_MONOTONIC_COARSE, &ts) != 0)
			ts = (struct timespec){ .tv_sec = 0, .tv_nsec = 10000000 };
		tick = ts_ns(&ts);
		atomic_store_explicit(&tick_ns, tick, memory_order_relaxed);
	}
	if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
		clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = ts_ns(&ts);
	if (now_ns != NULL)
		*now_ns = now;
	d.at_ns = ms < 0 ? UINT64_MAX : now + tick + (uint64_t)ms * 1000000ull;
	return d;
}

bool kdeadline_passed(kdeadline d)
{
	return d.at_ns != UINT64_MAX && kclock_ns() >= d.at_ns;
}

int kdeadline_left_ms(kdeadline d, int cap_ms)
{
	uint64_t now, left;

	if (d.at_ns == UINT64_MAX)
		return cap_ms;
	now = kclock_ns();
	if (now >= d.at_ns)
		return 0;
	left = (d.at_ns - now + 999999ull) / 1000000ull;
	return left > (uint64_t)cap_ms ? cap_ms : (int)left;
}
