/*
 * secret.h -- where a process keeps the job secret: one copy, in pages of their own that a
 * core dump leaves out (MADV_DONTDUMP), never freed. Everything that needs the secret (the
 * settings, the store's client and server, every transport's handshake) points there
 * instead of copying it; the environment's copy is wiped once read.
 */
#ifndef KHOR_BASE_SECRET_H
#define KHOR_BASE_SECRET_H

#include <stddef.h>

/* The longest secret kept (KHOR_SECRET is checked against it). */
#define KSECRET_MAX 255

/*
 * The kept copy of s ("" for NULL); the same string gives the same copy. NULL when s is
 * longer than KSECRET_MAX, or when no page can be had (a few per process: one per job an
 * elastic process joins, and 16 secrets fit in a page).
 */
const char *ksecret_keep(const char *s);

/*
 * The environment variable name, kept: the first call that finds it set keeps its value
 * and wipes it in the environment (which then reads ""), so that a core dump or
 * /proc/<pid>/environ shows nothing; that call and every later one return the kept copy.
 * NULL when it was never set (or is empty), or as ksecret_keep.
 */
const char *ksecret_env(const char *name);

#endif
