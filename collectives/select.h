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
