/*
 * select.h -- the cost model that picks an algorithm per call.
 *
 * Every schedule's time is predicted from three numbers: alpha, the cost of one message
 * (latency plus per-message software overhead, seconds); beta, seconds per byte moved over
 * a link; gamma, seconds per byte reduced on the CPU. They are measured at init with a few
 * short exchanges between neighbouring ranks and a local kernel run, then agreed on by an
 * allreduce(max) so that every rank predicts the same times and picks the same algorithm
 * (KHOR_COST_ALPHA_US, KHOR_COST_BETA_GBPS, KHOR_COST_GAMMA_GBPS skip the measurement).
 */
#ifndef KHOR_SELECT_H
#define KHOR_SELECT_H

#include "coll.h"

#include <stdbool.h>
#include <stddef.h>

enum bcast_algo { BCAST_BINOMIAL = 0, BCAST_CHAIN };
enum allgather_algo { AG_RD = 0, AG_RING };
/* Reduce-scatter: ring, recursive-doubling allreduce then a copy, recursive halving. */
enum rs_algo { RS_RING = 0, RS_RD, RS_HALVING };

/* Predicted seconds of an allreduce of `bytes` on n ranks with algorithm a (enum allreduce_algo). */
double cost_allreduce(const cost_model *m, int a, int n, size_t bytes, size_t slice);
double cost_broadcast(const cost_model *m, int a, int n, size_t bytes, size_t slice);
/* bytes = the whole gathered buffer. */
double cost_allgather(const cost_model *m, int a, int n, size_t bytes);
/* bytes = the whole input; RS_HALVING only for n a power of two. */
double cost_reduce_scatter(const cost_model *m, int a, int n, size_t bytes);

/* The cheapest allreduce that fits (rd and hd need scratch or memory; all fit here). */
int cost_pick_allreduce(const cost_model *m, int n, size_t bytes, size_t slice, double *t_out);
int cost_pick_broadcast(const cost_model *m, int n, size_t bytes, size_t slice);
int cost_pick_allgather(const cost_model *m, int n, size_t bytes);
/* Recursive halving only when n is a power of two and its first half fits one slice. */
int cost_pick_reduce_scatter(const cost_model *m, int n, size_t bytes, size_t slice);

/*
 * Auto's trials (KHOR_AUTO_TRIALS). The model ranks schedules by the messages and bytes they
 * move, not by what it cannot see, such as four ranks taking turns on one core: there it
 * over-predicted the tree 2.3x at 64 KiB on 8 ranks and picked halving-doubling, 1.13-1.17x
 * slower. So the first call of each power-of-two size first runs, on trial buffers of its
 * own, every schedule predicted within `spread` of the best: `rounds` blocks of calls each
 * (a block lasts about TRIAL_BLOCK_S as predicted, at most TRIAL_BLOCK_MAX calls: single
 * calls of 100 us timed the scheduler's time slices more than the schedules; its first call
 * is not counted), in an order that rotates and reverses from round to round. Each rank
 * keeps each schedule's median block mean of measured / predicted time (a preempted block is
 * slow, a lucky one fast), the ranks agree on the largest of those (the slowest rank's), and
 * every call of that size runs the candidate whose prediction times its factor is lowest.
 * Every rank runs the same schedule for every call: the trial order depends only on the
 * count of calls, the pick only on agreed numbers.
 */
enum { TRIAL_NEW = 0, TRIAL_RUNNING, TRIAL_DONE, TRIAL_MODEL /* one candidate: the model */ };
#define TRIAL_MAX_CAND 4
/* Comm ids of trial calls: TRIAL_COMM_ID | the comm's own id << TRIAL_ID_BITS | the
 * trial's number (at most TRIAL_MAX_ROUNDS x TRIAL_MAX_CAND x TRIAL_BLOCK_MAX, + 1). */
#define TRIAL_COMM_ID 0x80000000u
#define TRIAL_ID_BITS 13
#define TRIAL_BLOCK_S 0.004
#define TRIAL_MAX_ROUNDS 16
#define TRIAL_BLOCK_MAX 64
#define TRIAL_BLOCK_MIN 4

typedef struct trial_slot {
	int state;
	int ncand;
	int cand[TRIAL_MAX_CAND];          /* enum allreduce_algo, best predicted first */
	double factor[TRIAL_MAX_CAND];     /* median block of measured / predicted, per candidate */
	double blocks[TRIAL_MAX_CAND][TRIAL_MAX_ROUNDS]; /* each block's mean, in order */
	unsigned block;                    /* calls per block */
	unsigned rounds;                   /* blocks per candidate */
	unsigned calls;                    /* trial calls made */
	double sum;                        /* measured / predicted of the block so far */
	size_t last_bytes;                 /* trial_pick's last size + 1 and its answer */
	int last_pick;
} trial_slot;

/*
 * Chooses the candidates for a size: TRIAL_RUNNING, or TRIAL_MODEL when only one is close or
 * a block would hold fewer than TRIAL_BLOCK_MIN calls. Short blocks of long calls measured
 * something else than a long run of one schedule: at 1 MiB on 4 ranks (blocks of 3 calls)
 * halving-doubling took 1.3-1.4x and the tree 0.9-1.3x their time in khor-bench's runs of
 * 12, and the trials chose the tree, 1.04-1.32x slower, in 2 jobs of 2; with 4 to 8 ranks
 * on 2 cores the scheduler seems to need a while to settle each pattern of who wakes whom.
 * Blocks hold a count of calls sized by the best prediction, so the trials take about
 * rounds x TRIAL_BLOCK_S x (the candidates' predictions summed / the best): 50-85 ms at 4
 * and 8 ranks here with 3 rounds, up to about 3 x 4 ms x (1 + 3 x 3) = 120 ms predicted.
 */
void trial_begin(trial_slot *t, const cost_model *m, int n, size_t bytes, size_t slice,
                 double spread, unsigned rounds);
/* The candidate whose turn the next trial call is. */
int trial_algo(const trial_slot *t);
/* Records the trial call of trial_algo(t) that took measured s; true when it was the last
 * of the last round. */
bool trial_record(trial_slot *t, double measured, double predicted);
/* After the agreement (TRIAL_DONE): the schedule for a call of this many bytes. */
int trial_pick(trial_slot *t, const cost_model *m, int n, size_t bytes, size_t slice);

/*
 * Measures alpha, beta (with neighbour r^1 of the group, if any; else zeros) and gamma into
 * v[0..2]. own_cores: every rank here has a core of its own, so a batch of swaps that ran
 * far slower than its fast tenth caught two ranks on one core for a while, not their
 * steady state. The caller agrees on the values with an allreduce(max) over the world.
 */
khor_status cost_measure(coll_comm *cc, uint32_t seq, bool own_cores, double v[3], kerr *err);
/* One batch's alpha from its k swap times, sorted (select.c says why). */
uint64_t cost_batch_alpha(const uint64_t *sorted, int k, bool own_cores);

/* Node-aware allreduce: inner = intra-host links, outer = inter-host links. */
double cost_hier_allreduce(const cost_model *inner, const cost_model *outer, int L, int H,
                           size_t bytes, size_t slice);

#endif
