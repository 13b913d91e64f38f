/*
 * clock.h -- monotonic time and deadlines. Every blocking wait in khor takes a deadline
 * made here, so "how long may this still take" is computed in one way everywhere.
 */
#ifndef KHOR_BASE_CLOCK_H
#define KHOR_BASE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kdeadline {
	uint64_t at_ns; /* CLOCK_MONOTONIC; UINT64_MAX means never */
} kdeadline;

uint64_t kclock_ns(void);
kdeadline kdeadline_in_ms(int64_t ms); /* ms < 0: never */
bool kdeadline_passed(kdeadline d);
/* Milliseconds left, clamped to [0, cap_ms]; suited to poll() and epoll_wait(). */
int kdeadline_left_ms(kdeadline d, int cap_ms);

#endif
