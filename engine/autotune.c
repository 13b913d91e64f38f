/*
 * autotune.c -- KHOR_AUTOTUNE: searches the fusion threshold and the cycle time by measured
 * throughput (bytes reduced per second of wall time) over windows of cycles with work.
 *
 * The search is a coordinate sweep, which needs few windows and is easy to follow in the log:
 * first every fusion threshold at the starting cycle time, then every cycle time at the best
 * threshold; the best pair measured is kept. The first KHOR_AUTOTUNE_WARMUP_SAMPLES windows
 * are discarded (caches, the cost model's trials, page faults), and so is the window right
 * after each change (it may hold cycles planned before the change). A value the user set is
 * never searched. Only set 0's coordinator runs it; its choices reach every rank in a
 * response, so all ranks switch between the same two cycles. Each window is one CSV row.
 */
#include "autotune.h"

#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint64_t fusion_cands[] = { 1u << 20, 4u << 20, 16u << 20, 64u << 20, 128u << 20 };
static const double cycle_cands[] = { 0.0, 1.0, 2.5, 5.0 };
#define NF (int)(sizeof(fusion_cands) / sizeof(fusion_cands[0]))
#define NC (int)(sizeof(cycle_cands) / sizeof(cycle_cands[0]))

struct autotune {
	FILE *log;
	int warmup, steps;
	bool tune_fusion, tune_cycle;
	int phase;            /* 0 warm-up, 1 fusion sweep, 2 cycle sweep, 3 done */
	int cand;             /* index in the phase's list */
	bool discard;         /* the window after a change */
	int windows;          /* windows seen */
	int in_window;        /* cycles with work in this window */
	uint64_t w_bytes, w_ns, last_bytes;
	uint64_t fusion;      /* in force */
	double cycle;
	double best_rate;
	uint64_t best_fusion;
	double best_cycle;
};

struct autotune *autotune_create(const eng_settings *s, int rank, kerr *err)
{
	struct autotune *a = calloc(1, sizeof(*a));

	(void)rank;
	if (a == NULL) {
		kerr_set(err, KHOR_ERR_NO_MEMORY, "autotune: out of memory");
		return NULL;
	}
	a->warmup = s->warmup_samples;
	a->steps = s->steps_per_sample > 0 ? s->steps_per_sample : 1;
	a->tune_fusion = !s->fusion_set;
	a->tune_cycle = !s->cycle_set;
	a->fusion = a->best_fusion = s->fusion_bytes;
	a->cycle = a->best_cycle = s->cycle_ms;
	a->best_rate = -1;
	if (!a->tune_fusion && !a->tune_cycle) {
		KLOG_WARN("KHOR_AUTOTUNE: both KHOR_FUSION_THRESHOLD and KHOR_CYCLE_TIME are set; "
		          "nothing to tune");
		a->phase = 3;
	}
	if (s->autotune_log[0] != '\0') {
		a->log = fopen(s->autotune_log, "w");
		if (a->log == NULL) {
			char b[128];
			kerr_set(err, KHOR_ERR_SYSTEM, "KHOR_AUTOTUNE_LOG: cannot write '%s': %s",
			         s->autotune_log, kerr_errno_str(errno, b, sizeof(b)));
			free(a);
			return NULL;
		}
		fprintf(a->log, "window,phase,fusion_bytes,cycle_ms,bytes,seconds,bytes_per_s,"
		        "kept\n");
	}
	return a;
}

void autotune_free(struct autotune *a)
{
	if (a == NULL)
		return;
	if (a->log != NULL)
		fclose(a->log);
	free(a);
}

static const char *phase_name(int p, bool discard)
{
	if (p == 0)
		return "warmup";
	if (discard)
		return "settling";
	return p == 1 ? "fusion" : p == 2 ? "cycle" : "final";
}

/* Moves to the next candidate; false when the search is over. */
static bool next_cand(struct autotune *a)
{
	for (;;) {
		if (a->phase == 0) {
			a->phase = 1;
			a->cand = 0;
		} else {
			a->cand++;
		}
		if (a->phase == 1) {
			if (!a->tune_fusion || a->cand >= NF) {
				a->phase = 2;
				a->cand = -1;
				continue;
			}
			a->fusion = fusion_cands[a->cand];
			a->cycle = a->best_cycle;
			return true;
		}
		if (a->phase == 2) {
			if (!a->tune_cycle || a->cand >= NC) {
				a->phase = 3;
				a->fusion = a->best_fusion;
				a->cycle = a->best_cycle;
				KLOG_INFO("autotune: done: fusion threshold %llu bytes, cycle time %.2f ms "
				          "(%.3g MB/s)", (unsigned long long)a->fusion, a->cycle,
				          a->best_rate / 1e6);
				return false;
			}
			a->fusion = a->best_fusion;
			a->cycle = cycle_cands[a->cand];
			return true;
		}
		return false;
	}
}

bool autotune_cycle(struct autotune *a, uint64_t bytes, uint64_t *fusion, double *cycle_ms)
{
	if (a->phase == 3)
		return false;
	uint64_t now = kclock_ns();
	if (bytes == a->last_bytes)
		return false; /* a cycle without data: not a step */
	if (a->in_window == 0) {
		a->w_ns = now;
		a->w_bytes = a->last_bytes;
	}
	a->last_bytes = bytes;
	if (++a->in_window < a->steps)
		return false;
	double secs = (double)(now - a->w_ns) / 1e9;
	double rate = secs > 0 ? (double)(bytes - a->w_bytes) / secs : 0;
	bool counted = a->phase > 0 && !a->discard;
	bool kept = false;
	if (counted && rate > a->best_rate) {
		a->best_rate = rate;
		a->best_fusion = a->fusion;
		a->best_cycle = a->cycle;
		kept = true;
	}
	if (a->log != NULL) {
		fprintf(a->log, "%d,%s,%llu,%.3f,%llu,%.6f,%.1f,%d\n", a->windows,
		        phase_name(a->phase, a->discard), (unsigned long long)a->fusion, a->cycle,
		        (unsigned long long)(bytes - a->w_bytes), secs, rate, kept ? 1 : 0);
		fflush(a->log);
	}
	a->windows++;
	a->in_window = 0;
	if (a->phase == 0 && a->windows < a->warmup)
		return false;
	if (a->discard) {
		a->discard = false;
		return false;
	}
	bool more = next_cand(a);
	a->discard = more;
	*fusion = a->fusion;
	*cycle_ms = a->cycle;
	if (a->log != NULL && !more)
		fprintf(a->log, "%d,final,%llu,%.3f,0,0,%.1f,1\n", a->windows,
		        (unsigned long long)a->fusion, a->cycle, a->best_rate);
	return true;
}
