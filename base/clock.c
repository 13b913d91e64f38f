/* clock.c -- monotonic clock and deadline arithmetic (see clock.h). */
#include "clock.h"

#include <time.h>

uint64_t kclock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

kdeadline kdeadline_in_ms(int64_t ms)
{
	kdeadline d;

	d.at_ns = ms < 0 ? UINT64_MAX : kclock_ns() + (uint64_t)ms * 1000000ull;
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
