/*
 * err.h -- the error context every layer fills in.
 *
 * The function that first sees a failure writes the full sentence (peer, operation, phase,
 * the system's own message) into a kerr the caller owns, and returns the status; callers
 * pass the status up without logging or rewriting it. The comm adds "rank R on HOST:" in
 * front when it stores the error as its sticky error.
 */
#ifndef KHOR_BASE_ERR_H
#define KHOR_BASE_ERR_H

#include "khor.h"

#include <stddef.h>

#define KERR_TEXT_MAX 1024

typedef struct kerr {
	khor_status status;
	int peer; /* for a timeout: the rank that was being waited on, else -1 */
	char text[KERR_TEXT_MAX];
} kerr;

static inline void kerr_clear(kerr *e)
{
	e->status = KHOR_SUCCESS;
	e->peer = -1;
	e->text[0] = '\0';
}

/* Records status and a printf-style sentence; returns status so callers can `return kerr_set(...)`. */
khor_status kerr_set(kerr *e, khor_status status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Puts "prefix: " in front of the existing text (used to add context on the way up). */
void kerr_prefix(kerr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* strerror_r that always returns a usable string, with the limit that was hit for
 * EMFILE, ENFILE and ENOMEM ("Too many open files: the limit is 64 (ulimit -n); ..."). */
const char *kerr_errno_str(int errnum, char *buf, size_t len);

/* Bounded string copy that always terminates (strlcpy semantics). */
size_t kstrlcpy(char *dst, const char *src, size_t size);

#endif
