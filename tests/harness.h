/*
 * harness.h -- multi-rank tests: real processes, real sockets, an in-process store.
 *
 * harness_run starts the embedded store on 127.0.0.1 in the test process, forks n ranks,
 * and in each calls body(rank, n, cfg, arg) with a khor_config already holding the rank,
 * size, store address, secret and job id (the body adds its own keys, then khor_init).
 * A rank's return value is its exit status. The parent waits with a deadline and kills
 * every rank that outlives it, so a hung test fails instead of hanging CI.
 *
 * harness_shared gives memory visible to all ranks and the parent (MAP_SHARED), used to
 * bring results back for cross-rank comparison.
 */
#ifndef KHOR_TESTS_HARNESS_H
#define KHOR_TESTS_HARNESS_H

#include "khor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HARNESS_MAX_RANKS 16

/* UNDER_ASAN: defined in an AddressSanitizer build (gcc's macro, clang's feature test), for
 * tests that skip or check what only such a build can. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

typedef int (*harness_body)(int rank, int n, khor_config *cfg, void *arg);

typedef struct harness_result {
	int status[HARNESS_MAX_RANKS];   /* exit status, or 128 + signal */
	double seconds[HARNESS_MAX_RANKS]; /* when each rank ended, since the start */
	bool timed_out;
	double killed_at;        /* seconds since the start, when kill_rank was killed */
	size_t store_values;     /* keys holding a value in the store when the job ended */
} harness_result;

typedef struct harness_opts {
	int n;
	const char *secret;      /* NULL: a fixed test secret */
	const char *timeout;     /* KHOR_TIMEOUT for the ranks, e.g. "20s" */
	double deadline_s;       /* parent kills everything after this */
	const int *skip_ranks;   /* ranks that are never started (-1 terminated), or NULL */
	const char *job_id;
	int kill_rank;           /* with kill_after_s > 0: SIGKILL this rank then */
	double kill_after_s;
	/* With kill_after_s: the kill also waits for kill_ready(arg) (body's arg) to be true,
	 * e.g. for the ranks to have done some work on a slow machine; NULL: no wait. */
	bool (*kill_ready)(void *arg);
} harness_opts;

/* Runs a job; returns true when every started rank exited 0. */
bool harness_run(const harness_opts *o, harness_body body, void *arg, harness_result *res);
void *harness_shared(size_t bytes);
void harness_shared_free(void *p, size_t bytes);
/* This process's open fds, threads, resident bytes and heap bytes in use (mallinfo2), for
 * tests that check that cycles of work leave nothing behind; -1 when unreadable. */
int harness_count_fds(void);
int harness_count_threads(void);
long long harness_rss_bytes(void);
long long harness_heap_bytes(void);
/* FNV-1a over bytes, to compare buffers across ranks. */
uint64_t harness_hash(const void *p, size_t len);

/* CLOCK_MONOTONIC, in seconds. */
double harness_now(void);
/* Sleeps ms milliseconds, through signals. */
void harness_sleep_ms(int ms);
/*
 * A rank's failure: writes the message into err (len bytes, for the parent to report, e.g.
 * a slot of shared memory), prints it as "rank R: ..." and returns code, the rank's exit
 * status: `return harness_fail(...)`.
 */
int harness_fail(char *err, size_t len, int rank, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Under AddressSanitizer, whether LeakSanitizer finds leaks now (reported on stderr, and
 * the process goes on); false in other builds. For a rank after khor_finalize. */
bool harness_leaks(void);

#endif
