/*
 * elastic_plan.h -- the decisions of an elastic driver, as pure functions over plain data:
 * the hosts a discovery gave (parsed from a script's lines), which of them are usable
 * (Horovod's blacklist with its cooldown), which slots a generation gets (Horovod's
 * get_host_assignments), which running workers stay, start or are dropped, how many resets
 * are left, and the plan text the workers read (docs/ELASTIC.md). Nothing here touches a
 * process, a clock or the store: times and random draws come in as arguments, so khorrun's
 * driver (elastic.c) and the per-host agents of an etcd job reach the same plan from the
 * same inputs, and the rules are tested alone (tests/elastic/test_elastic_plan.c).
 */
#ifndef KHOR_LAUNCHER_ELASTIC_PLAN_H
#define KHOR_LAUNCHER_ELASTIC_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What changed between two discoveries (Horovod's HostUpdateResult), as el/update says. */
#define EP_ADDED 1u
#define EP_REMOVED 2u

#define EP_HOST_MAX 255 /* a host name's longest */
#define EP_SLOTS_MAX 65536

/* One discovered host, in the order the discovery listed it. */
struct ep_found {
	char *name;
	int slots;
};

struct ep_list {
	struct ep_found *h;
	int n, cap;
};

/*
 * Parses a discovery script's output: one "HOST" or "HOST:SLOTS" a line (default_slots when
 * a line has none), blank lines skipped, blanks around a line ignored, a host listed twice
 * keeping its first place and its last slots. Returns false with the reason in why (the
 * line, what is wrong with it); out is then empty.
 */
bool ep_parse_hosts(const char *text, size_t len, int default_slots, struct ep_list *out, char *why,
                    size_t wlen);
/* Adds one host (a copy of name); false when out of memory. */
bool ep_list_add(struct ep_list *l, const char *name, int slots);
void ep_list_free(struct ep_list *l);

/* A host as the driver knows it, from its first discovery on (never forgotten). */
struct ep_host {
	char *name;
	bool listed; /* in the newest discovery */
	int slots;   /* there; 0 when it is not listed */
	bool blacklisted;
	int nblacklist;        /* cooldowns started: the next one is twice as long */
	int64_t cool_until_ms; /* the end of its cooldown; 0: none (for good, or never out) */
};

struct ep_state {
	struct ep_host *hosts;
	int nhosts, cap;
	int *order; /* Horovod's host_assignment_order: usable hosts, oldest first */
	int norder;
	bool discovered;                  /* a discovery has been taken in */
	int min_np, max_np;               /* max_np 0: no limit */
	int64_t cool_min_ms, cool_max_ms; /* both 0: a blacklisted host is out for good */
	int reset_limit;                  /* -1: no limit */
	int resets;                       /* generations after the first so far */
};

/* Horovod's bounds on --blacklist-cooldown-range (seconds). */
#define EP_COOLDOWN_MIN_S 1
#define EP_COOLDOWN_MAX_S 3600

void ep_init(struct ep_state *st, int min_np, int max_np, int64_t cool_min_ms, int64_t cool_max_ms,
             int reset_limit);
void ep_free(struct ep_state *st);
/* The index of host name, or -1. */
int ep_host_index(const struct ep_state *st, const char *name);

/*
 * Takes in a discovery at time now_ms: new hosts are appended to the order (in the order
 * listed), hosts gone leave it, hosts whose cooldown has ended come back at its end.
 * Returns EP_ADDED and/or EP_REMOVED (a host or slots came or went, a host came back), or
 * 0 when nothing changed (Horovod's update_available_hosts). -1: out of memory.
 */
int ep_update(struct ep_state *st, const struct ep_list *found, int64_t now_ms);

/*
 * Blacklists host h at now_ms. Without a cooldown range it is out for good; with one, a
 * host not already cooling down is out for min * 2^n + rnd01 * min (n: its cooldowns so
 * far, counting this one), kept within [min, max] (Horovod's rule). Returns the cooldown
 * in ms, 0 when one was already running, -1 when it is for good.
 */
int64_t ep_blacklist(struct ep_state *st, int h, int64_t now_ms, double rnd01);

/* Takes host h out for good, whatever the cooldown range (it cannot be reached at all). */
void ep_exclude(struct ep_state *st, int h);

/* Slots of the usable hosts (those in the order), up to no limit. */
int ep_available_slots(const struct ep_state *st);

/* One rank of a generation. */
struct ep_slot {
	int host; /* index into st->hosts */
	int rank, local_rank, local_size, cross_rank, cross_size;
};

/*
 * Horovod's get_host_assignments over the usable hosts in their order: slots filled host by
 * host, local rank = slot index, up to max_np ranks. Fills out (room for cap) and returns
 * how many ranks; -1 when cap is too small. The caller compares it with min_np.
 */
int ep_assign(const struct ep_state *st, struct ep_slot *out, int cap);

/* Do a and b give the same ranks the same host and slot? (No update to tell about.) */
bool ep_same_assignment(const struct ep_slot *a, int na, const struct ep_slot *b, int nb);
/* Does the next generation keep a host of the last (someone to sync the state from)? */
bool ep_keeps_a_host(const struct ep_slot *prev, int nprev, const struct ep_slot *next, int nnext);
/* How many hosts the ranks of a generation are on. */
int ep_count_hosts(const struct ep_slot *s, int n);

/* A running worker: where it sits. */
struct ep_worker {
	int host, slot;
};

/*
 * Matches a generation's slots to the running workers: keep[r] is the index in w of the
 * worker that takes rank r, or -1 when a fresh worker starts there; drop[i] is true for a
 * worker with no rank (its host left, was blacklisted, or lost slots). keep has room for
 * n, drop for nw.
 */
void ep_match(const struct ep_slot *s, int n, const struct ep_worker *w, int nw, int *keep,
              bool *drop);

/*
 * A new generation is about to be planned: false when --reset-limit would be exceeded
 * (Horovod: fails once resets reach the limit), else counts it.
 */
bool ep_take_reset(struct ep_state *st);

/*
 * The plan of generation gen (docs/ELASTIC.md, "khor-plan 1"): the ranks in order, each
 * with its worker id HOST:LOCAL_RANK, then a "drop" line per worker id in drops. Returns a
 * malloc'd string, NULL when out of memory.
 */
char *ep_plan_text(const struct ep_state *st, int gen, const struct ep_slot *s, int n,
                   char *const *drops, int ndrops);

/*
 * Why a generation cannot start, for the user: "1 slot available (localhost:1), 2 needed;
 * blacklisted: 127.0.0.1 (for good), node3 (for 12 s more)".
 */
void ep_describe_shortage(const struct ep_state *st, int need, int64_t now_ms, char *buf,
                          size_t len);
/* "localhost:2, 127.0.0.1:2": the hosts of a generation with their ranks. */
void ep_describe_slots(const struct ep_state *st, const struct ep_slot *s, int n, char *buf,
                       size_t len);


/* A draw in [0, 1) from the state *rnd (xorshift, never 0; its quality does not matter). */
double ep_draw(uint64_t *rnd);

/* Is every host of generation s (n ranks) blacklisted? Horovod's end of the job. */
bool ep_all_blacklisted(const struct ep_state *st, const struct ep_slot *s, int n);

/* What a loss did to the lost worker's host. */
enum ep_loss {
	EP_LOSS_FRESH,       /* one host: a fresh worker takes the slot */
	EP_LOSS_BLACKLISTED, /* blacklisted now */
	EP_LOSS_ALREADY,     /* blacklisted already */
};

/*
 * A worker on host h of generation s (n ranks) was lost at now_ms. On several hosts, or
 * when unstartable (its workers cannot even be started there: they would only fail again),
 * the host is blacklisted (the cooldown drawn from *rnd) unless it is already; on one host
 * a fresh worker takes the slot. tail gets what happened, for the user ("; host node3
 * blacklisted for 2 s"), *cooldown_ms ep_blacklist's answer when it is EP_LOSS_BLACKLISTED.
 */
enum ep_loss ep_lose(struct ep_state *st, const struct ep_slot *s, int n, int h, bool unstartable,
                     int64_t now_ms, uint64_t *rnd, int64_t *cooldown_ms, char *tail,
                     size_t len);

/* "rank 2 on node3 (worker node3:0) was lost in generation 4: WHY": the abort the ranks
 * report. */
void ep_lost_text(char *buf, size_t len, int gen, int rank, const char *host,
                  const char *worker, const char *why);

/* Why a job ends when a generation after the first would exceed --reset-limit (Horovod's
 * words, with the limit). */
#define EP_RESET_LIMIT_FMT \
	"Horovod was shutdown because number of resets during elastic job exceeded limit: %d"

/*
 * ep_update said the hosts changed during a generation of n ranks plan: would the ranks go
 * anywhere else? 1: yes, slots (unless NULL) then describes where (ep_describe_slots); 0: no,
 * nothing to tell them (Horovod skips it too); -1: out of memory.
 */
int ep_update_moves(const struct ep_state *st, const struct ep_slot *plan, int n, char *slots,
                    size_t len);
/* "added", "removed" or "added,removed": el/update/<gen>'s value for flags. */
void ep_update_words(unsigned flags, char *buf, size_t len);

/*
 * Takes in a read of a rank's heartbeat counter at now (val: its text, NULL when absent);
 * *hb and *hb_at are the last count seen and when, *gen_beat_at the first beat of any rank
 * of the generation (0: none yet). Returns how long the rank has stalled when that is past
 * timeout_ms (it is to be fenced), else 0.
 */
int64_t ep_heartbeat(int64_t *hb, int64_t *hb_at, int64_t *gen_beat_at, const char *val,
                     int64_t now, int64_t timeout_ms);
/*
 * A survivor kept into a new generation that has not joined it yet beats only in the one
 * it left (prev_val: that counter's text, NULL when absent), and not at all from its
 * finalize there to its join here. *prev_hb and *alive_at are the count last seen and when
 * it moved (the plan's time at first). Returns how long it has not moved when that is past
 * timeout_ms (it is stopped or hung between generations: to be fenced), else 0.
 */
int64_t ep_join_stall(int64_t *prev_hb, int64_t *alive_at, const char *prev_val, int64_t now,
                      int64_t timeout_ms);
/*
 * "its heartbeat stopped for 3.2 s (KHOR_HEARTBEAT_TIMEOUT 3.0 s); KILLER killed it"; with
 * left_gen > 0 (a survivor stalled between generations) "... for 3.2 s since it left
 * generation G, and it has not joined generation G+1 (...".
 */
void ep_fence_text(char *buf, size_t len, int64_t stalled_ms, int64_t timeout_ms,
                   const char *killer, int left_gen);

/* The text of a generation's end its ranks asked for: rank < 0 when none said why. */
void ep_want_text(char *buf, size_t len, int gen, int rank, const char *host,
                  const char *worker, const char *why);

/* What waiting for the slots of a generation comes to. */
enum ep_wait {
	EP_WAIT_ON,    /* still waiting */
	EP_WAIT_BEGUN, /* it begins now: buf says so */
	EP_WAIT_OVER,  /* --elastic-timeout has passed: buf says why the job ends */
};

/*
 * Generation gen needs need slots and the usable hosts have fewer at now: the wait begins
 * (*wait_since, -1 while not waiting) or goes on, at most timeout_ms.
 */
enum ep_wait ep_wait_slots(const struct ep_state *st, int gen, int need, int64_t *wait_since,
                           int64_t now, int64_t timeout_ms, char *buf, size_t len);

/* "generation 2: 3 ranks on 2 hosts (localhost:2, 127.0.0.1:1)". */
void ep_describe_gen(const struct ep_state *st, int gen, const struct ep_slot *s, int n,
                     char *buf, size_t len);

#endif
