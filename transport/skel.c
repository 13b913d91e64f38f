/*
 * skel.c -- the shared transport skeleton's functions that are not inline (skel.h): set-up
 * and teardown, the lock-free wake and the end of a kernel wait, and first-error records.
 */
#include "skel.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

khor_status tp_skel_init(tp_skel *sk, kerr *err)
{
	khor_status st;

	memset(sk, 0, sizeof(*sk));
	kmutex_init(&sk->mu);
	if ((st = ksleeper_init(&sk->sl, err)) != KHOR_SUCCESS) {
		pthread_mutex_destroy(&sk->mu.m);
		return st;
	}
	atomic_init(&sk->completions, 0);
	atomic_init(&sk->in_kernel, false);
	atomic_init(&sk->rung, false);
	sk->ready = true;
	return KHOR_SUCCESS;
}

void tp_skel_destroy(tp_skel *sk)
{
	while (sk->free_reqs != NULL) {
		void **r = sk->free_reqs;
		sk->free_reqs = *r;
		free(r);
	}
	if (sk->ready) {
		ksleeper_destroy(&sk->sl);
		pthread_mutex_destroy(&sk->mu.m);
		sk->ready = false;
	}
}

/*
 * A wake counts as a completion, so that kseen_changed reports it to every thread once.
 * The eventfd is written only while a thread sleeps in the kernel; skel.h says why none is
 * lost. The flag goes up after the write: a sleeper that finds it drains a count that is
 * surely there. A sleeper that leaves between the write and the flag leaves the count
 * behind; the next one finds the eventfd readable and drains it (saw_wake), and until then
 * the spinning threads' polls see it and count it as nothing (tcp, ib and shm alike: once
 * tcp counted it as progress, and a collective's wait spun on it for ever, never reaching
 * its deadline).
 */
void tp_skel_wake(tp_ctx *ctx)
{
	tp_skel *sk = (tp_skel *)(void *)ctx;
	uint64_t one = 1;

	atomic_fetch_add(&sk->completions, 1);
	if (!atomic_load(&sk->in_kernel))
		return;
	if (write(sk->sl.wake_fd, &one, sizeof(one)) == (ssize_t)sizeof(one))
		atomic_store(&sk->rung, true);
}

void tp_skel_sleep_end(tp_skel *sk, bool saw_wake)
{
	uint64_t v;

	atomic_store(&sk->in_kernel, false);
	/* Not "rung || saw_wake": the exchange must happen whatever saw_wake is. */
	bool rung = atomic_exchange(&sk->rung, false);
	if ((rung || saw_wake) && !sk->sl.rung)
		(void)!read(sk->sl.wake_fd, &v, sizeof(v)); /* if it failed, the next one retries */
	ksleeper_leave(&sk->sl);
}

void tp_skel_caps_plain(const tp_ctx *ctx, tp_caps *out)
{
	(void)ctx;
	*out = (tp_caps){ .needs_reg = false, .reg_min = 0, .device_mem = false,
	                  .one_sided = false, .needs_flush = false };
}

bool tp_skel_vfail(kerr *err, khor_status st, const char *who, const char *fmt, va_list ap)
{
	char what[KERR_TEXT_MAX];

	if (err->status != KHOR_SUCCESS)
		return false;
	vsnprintf(what, sizeof(what), fmt, ap);
	if (who != NULL)
		kerr_set(err, st, "%s: %s", who, what);
	else
		kerr_set(err, st, "%s", what);
	KLOG_DEBUG("%s", err->text);
	return true;
}

bool tp_skel_fail(kerr *err, khor_status st, const char *who, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	bool set = tp_skel_vfail(err, st, who, fmt, ap);
	va_end(ap);
	return set;
}
