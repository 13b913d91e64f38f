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
/*
 * The same from the kernel's tick clock (CLOCK_MONOTONIC_COARSE): a quarter of the cost
 * (6 against 24 ns here), for the hot paths that start a deadline on every call and almost
 * never need it. The tick clock lags the fine one by up to a tick, so the tick's length
 * is added: such a deadline passes up to one tick late, never early. *now_ns gets the tick
 * clock's time (for "waited N ms" texts), or is left alone when now_ns is NULL.
 */
kdeadline kdeadline_in_ms_coarse(int64_t ms, uint64_t *now_ns);
bool kdeadline_passed(kdeadline d);
/* Milliseconds left, clamped to [0, cap_ms]; suited to poll() and epoll_wait(). */
int kdeadline_left_ms(kdeadline d, int cap_ms);

#endif
