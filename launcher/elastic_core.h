/*
 * elastic_core.h -- the part of an elastic driver that khorrun's own (elastic.c) and the
 * leader of an etcd job's agents (agent.c) share: the state of the generations and what
 * a loss, a request of the ranks, a host change or a shortage of slots does to it
 * (docs/ELASTIC.md). The rules themselves are elastic_plan.c's pure functions; this file
 * keeps their order and their words in one place. What differs between the two drivers
 * (their store, how a job ends, what a leader after this one must know) comes in as
 * callbacks, so neither driver is called from here by name.
 */
#ifndef KHOR_LAUNCHER_ELASTIC_CORE_H
#define KHOR_LAUNCHER_ELASTIC_CORE_H

#include "elastic_plan.h"
#include "job.h"

#include <stdbool.h>
#include <stdint.h>

struct ec_ops {
	/* The job cannot go on (msg says why, for the user): stop it with status rc. */
	void (*fail)(void *ctx, int rc, const char *msg);
	/* Ends generation gen for its ranks with text (the first abort written is theirs). */
	void (*abort_gen)(void *ctx, int gen, const char *text);
	/* Host h was blacklisted (ep_blacklist's cooldown); NULL: nothing to record. */
	void (*blacklisted)(void *ctx, int h, int64_t cooldown_ms);
	/* A generation was counted against --reset-limit; NULL: nothing to record. */
	void (*reset_taken)(void *ctx);
};

struct ec {
	struct ep_state st;
	struct ep_slot *plan; /* the ranks of generation gen */
	int nplan;
	int gen;             /* the newest generation planned; 0: none yet */
	bool gen_over;       /* it has ended (a loss, or its ranks asked for a new one) */
	bool need_gen;       /* a new one is to be planned */
	bool finishing;      /* a worker exited 0: no new generation */
	bool ending;         /* the job is over */
	unsigned updates;    /* el/update/<gen> as said so far */
	int64_t wait_since;  /* waiting for slots since then; -1: not waiting */
	int64_t gen_beat_at; /* the first heartbeat of any rank of gen; 0: none yet */
	int64_t hb_timeout_ms, elastic_timeout_ms;
	const char *elastic_timeout_arg; /* KHOR_ELASTIC_TIMEOUT for the ranks; NULL: theirs */
	char timeout_arg[32];
	uint64_t rnd; /* the cooldowns' draws (ep_draw) */
	const struct ec_ops *ops;
	void *ctx;
};

/* Sets up c for a driver whose callbacks get ctx; no generation yet. */
void ec_init(struct ec *c, const struct ec_ops *ops, void *ctx);

/*
 * KHOR_HEARTBEAT_TIMEOUT and the time to wait for slots (--elastic-timeout, else
 * KHOR_ELASTIC_TIMEOUT, else alias when not NULL) as the ranks read them; with
 * --elastic-timeout the ranks are told to wait in khor_init a little longer. False with
 * the reason said.
 */
bool ec_timeouts(struct ec *c, const struct opts *o, const char *alias);

/* The job cannot go on: ops->fail with the message made from fmt. */
void ec_fail(struct ec *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A new generation is needed (counted against --reset-limit once: past it the job ends). */
void ec_want_gen(struct ec *c);

/* A lost worker. */
struct ec_loss {
	int rank, host; /* its rank in generation gen, its host in st */
	const char *worker, *why;
	int finish_rc;      /* the job's status when it was finishing already */
	bool blacklist;     /* false: its host is gone, nothing is done to it */
	bool unstartable;   /* its workers cannot even be started there */
	bool quiet_already; /* say nothing of a host blacklisted already */
};

/*
 * Worker l was lost: its generation ends for everyone at once, its host is blacklisted or
 * a fresh worker takes its slot (ep_lose), and a new generation is wanted, unless the job
 * cannot go on (it was finishing, or every host of the generation is blacklisted now).
 */
void ec_lost(struct ec *c, const struct ec_loss *l);

/* The ranks asked for a new generation; rank < 0 when none of them said why. */
void ec_asked(struct ec *c, int rank, const char *host, const char *worker, const char *why);

/*
 * ep_update gave flags during generation gen: true when the ranks must be told (a change
 * that moves one of them, and updates counts it); slots, unless NULL, then says where they
 * go. False with nothing to tell, or when out of memory (the job then fails).
 */
bool ec_hosts_changed(struct ec *c, int flags, char *slots, size_t len);

/*
 * The next generation has fewer slots than need: the wait is said when it begins, and the
 * job fails when it has lasted --elastic-timeout (hint: with a line on what to check).
 */
void ec_short_of_slots(struct ec *c, int need, int64_t now, bool hint);

/*
 * A worker's end in words ("exited with status 1", "killed by signal 9 (SIGKILL), core
 * dumped"), and the exit status of the job it stands for (its status, 128 + the signal).
 */
void ec_end_words(int wstatus, char *buf, size_t len);
int ec_exit_status(int wstatus);

/*
 * The environment of workers of a generation of size ranks: common (ncommon_in entries),
 * each prefix's SIZE and ELASTIC=1, and KHOR_ELASTIC_TIMEOUT when the ranks are to be told;
 * *ncommon counts those. Then, for a host (not NULL) whose workers this process starts
 * itself, its name and KHOR_LOCAL_CPUS (when local_cpus > 0). Returns how many went into
 * fixed; 0 when out of memory or room, with fixed left empty.
 */
size_t ec_worker_env(const struct ec *c, char *const *common, size_t ncommon_in, int size,
                     const char *host, int local_cpus, char **fixed, size_t *ncommon);

/* The arrays the next generation is planned in (ep_assign, ep_match, ep_plan_text). */
struct ec_plan {
	struct ep_slot *s; /* its slots: room for every usable one */
	int cap;
	int *keep;            /* per slot: ep_match's */
	struct ep_worker *lw; /* the workers that may go on */
	int *idx;             /* per such worker: the driver's own index of it */
	bool *drop;           /* per such worker: ep_match's */
	char **drops;         /* the ids of those dropped, for the plan text */
};

/*
 * Allocates x for the usable slots of c and nw workers; false when out of memory. Either
 * way x is then ec_plan_free's to free, and x->cap is set.
 */
bool ec_plan_new(const struct ec *c, int nw, struct ec_plan *x);
void ec_plan_free(struct ec_plan *x);

/* Generation g, ranks s (n, malloc'd: c owns them now), has been planned and published. */
void ec_begin_gen(struct ec *c, int g, struct ep_slot *s, int n);

#endif
