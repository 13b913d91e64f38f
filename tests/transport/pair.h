/*
 * pair.h -- two ranks of a transport between real processes, for the transport tests
 * (test_contract.c over every transport built, test_shm.c's shm-only cases): each test
 * forks two ranks that make their own transport instance, trade addresses through a shared
 * page (the board, standing in for the store), link up and run a body each. The parent
 * only watches: it kills a rank when the job asks for it, and kills everything that
 * outlives the job's deadline.
 */
#ifndef KHOR_TESTS_TRANSPORT_PAIR_H
#define KHOR_TESTS_TRANSPORT_PAIR_H

#include "base/clock.h"
#include "transport/transport.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define MSG_MAX 2048
#define LOG_MAX 8192

/* The page both ranks and the parent share. */
struct board {
	char addr[2][TP_ADDR_MAX];
	_Atomic int ready[2];
	_Atomic int phase[2];
	_Atomic uint64_t killed_at_ns;
	_Atomic int pid[2];
	char msg[2][MSG_MAX];
	char log[LOG_MAX]; /* captured stderr of one rank */
};

struct rank_env {
	int rank;
	const struct transport_ops *tp;
	tp_ctx *ctx;
	tp_link *link;
	struct board *b;
	const struct job *job;
};

typedef void (*rank_body)(struct rank_env *env);

struct job {
	const struct transport_ops *tp;
	const char *cma; /* KHOR_SHM_CMA for the ranks, or NULL */
	rank_body body[2];
	const char *secret[2]; /* NULL: "test-secret" */
	bool no_link;          /* the bodies link up themselves */
	int kill_rank;         /* -1: none; else SIGKILL it once phase[kill_rank] >= kill_phase */
	int kill_phase;
	int kill_delay_ms;
	int capture_stderr; /* -1: none; else that rank's stderr ends up in board->log */
	int deadline_s;
	char job_id[64];
	void *arg;
};

/* A link's error, copied out (link_error gives it by copy, since another thread may be
 * setting it). */
const kerr *pair_link_error(const struct transport_ops *tp, tp_link *l);

/* ---- inside a rank ------------------------------------------------------------------- */

/* Fails the rank: the message goes to the board (the parent reports it), exit status 1. */
void pair_fail(struct rank_env *env, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

#define CHECK(cond, fmt, ...)                                                                      \
	do {                                                                                       \
		if (!(cond))                                                                       \
			pair_fail(env, "line %d: %s: " fmt, __LINE__, #cond, ##__VA_ARGS__);       \
	} while (0)

/* A transport instance of env's rank (secret NULL: "test-secret"). */
tp_ctx *pair_ctx(struct rank_env *env, const char *secret);
/* Rank 0 connects to rank 1 (whose address is on the board); rank 1 accepts. */
tp_link *pair_link_up(struct rank_env *env, tp_ctx *c);
/* Waits for r, driving progress with timeout_ms per call (so sleeping and wake-ups get
 * exercised). Returns the request's status; e gets its error. */
khor_status pair_wait(struct rank_env *env, tp_req *r, int timeout_ms, kerr *e);
/* A pseudo-random pattern of seed, and whether p holds it. */
void pair_fill(uint8_t *p, size_t len, uint32_t seed);
bool pair_check_fill(const uint8_t *p, size_t len, uint32_t seed);
/* memfd descriptors and mappings of this process ("nothing left behind"). */
void pair_count_memfd(int *fds_out, int *maps_out);

/* A rank to be killed: streams 64 MiB messages for ever, phase[0] counting them. */
void pair_stream_forever(struct rank_env *env);

/* ---- in the parent ------------------------------------------------------------------- */

/* A job of body b0 on rank 0 and b1 on rank 1 over tp (cma: KHOR_SHM_CMA, or NULL). */
struct job pair_job(const struct transport_ops *tp, const char *cma, rank_body b0, rank_body b1);
/* Runs both ranks; returns the board for extra checks. Asserts each rank's exit. */
struct board *pair_run(struct job *j);

#endif
