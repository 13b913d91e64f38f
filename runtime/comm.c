/*
 * comm.c -- joining a job (bootstrap), the context's links, and making and freeing comms.
 *
 * Bootstrap, through the store, under "<job>/<generation>/" (generation k for a rank's k-th
 * init in the job, counted in "<job>/0/inits/<rank>"):
 *   1. every rank publishes "addr/<transport>/<rank>" for each transport it created
 *      (tcp's is a list of addresses, best first, of which the connector dials the first
 *      that answers: docs/DESIGN-NOTES.md, "Bootstrap and store"), "tps/<rank>" (their
 *      names, "ib,tcp,shm": a peer tells "not created" from "not yet published" by it)
 *      and "host/<rank>";
 *   2. it adds 1 to "joined"; the rank that brings it to n sets "ready";
 *   3. everyone waits for "ready" until KHOR_INIT_TIMEOUT; on timeout the error lists the
 *      ranks whose "tps/<rank>" never appeared.
 * Links are made lazily, on first use by a collective: the lower rank connects (reading
 * only that one peer's address from the store), the higher rank accepts. So a rank reads
 * the addresses of the peers its algorithms talk to, not all n. Both ends pick the link's
 * transport by the same rule from the same facts (choose_transport), so they agree.
 *
 * Comms: the world and every comm made from it (split.c) share the context's links; a comm
 * only maps its ranks to world ranks, so making one opens no socket. A link is made by
 * whichever comm first needs it, under the context's link_mu, and is then found without
 * the lock (ctx->ready).
 *
 * Failure: the first error of a collective becomes the comm's sticky error; the rank also
 * writes it under "abort" (first writer wins, via the "abort_count" counter) so that ranks
 * not directly connected to the failed one stop with the root cause within about a second
 * instead of at their own deadline.
 */
#include "comm.h"
#include "alive.h"
#include "elastic.h"
#include "liveness.h"
#include "nccl.h"

#include "base/dtype.h"

#include "base/log.h"
#include "base/sock.h"
#include "collectives/algos.h"
#include "collectives/rd.h"
#include "collectives/ring.h"
#include "collectives/select.h"
#include "transport/filter/filter.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static khor_status comm_get_link(void *owner, int peer, kdeadline dl, tp_link **link_out,
                                 int *tp_out, kerr *err);
static khor_status comm_check_abort(void *owner, kerr *err);

/*
 * An elastic job's process remembers, across its contexts, the generation it last joined
 * and why it left it: the next khor_init tells the driver (elastic.c) and waits for a
 * newer one. And the cost model it last measured, with what it was measured on, so that a
 * generation on the same hosts with the same ranks per host need not measure again.
 */
static struct {
	pthread_mutex_t mu;
	int last_gen;
	char why[KERR_TEXT_MAX];
	bool have_model;
	int size, nhosts, on_machine;
	char tps[32];
	double v[7];
} el = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void el_left(const char *why)
{
	pthread_mutex_lock(&el.mu);
	if (el.why[0] == '\0')
		snprintf(el.why, sizeof(el.why), "%s", why);
	pthread_mutex_unlock(&el.mu);
}

/* Elastic: the place of this worker in the newest generation; sets rank, size, prefix. */
static khor_status elastic_place(kctx *c, kerr *err)
{
	settings *s = &c->cfg;
	struct el_place p;
	char why[KERR_TEXT_MAX];
	int after;

	pthread_mutex_lock(&el.mu);
	after = el.last_gen;
	snprintf(why, sizeof(why), "%s", el.why[0] ? el.why : "it finalized and joined again");
	pthread_mutex_unlock(&el.mu);
	khor_status st = elastic_join(c->store, s, after, why,
	                              kdeadline_in_ms(s->elastic_timeout_ms), &p, err);
	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&el.mu);
	el.last_gen = p.gen;
	el.why[0] = '\0';
	pthread_mutex_unlock(&el.mu);
	c->generation = p.gen;
	c->rank = s->rank = p.rank;
	c->size = s->size = p.size;
	s->local_rank = p.local_rank;
	s->local_size = p.local_size;
	s->cross_rank = p.cross_rank;
	s->cross_size = p.cross_size;
	snprintf(c->tp_job, sizeof(c->tp_job), "g%d/%s", p.gen, s->job_id);
	store_set_prefix(c->store, s->job_id, c->generation);
	klog_set_identity(c->rank, s->hostname);
	KLOG_INFO("worker %s joins generation %d of elastic job '%s' as rank %d of %d",
	          s->worker_id, p.gen, s->job_id, p.rank, p.size);
	return KHOR_SUCCESS;
}

static khor_status start_store(kctx *c, kerr *err)
{
	settings *s = &c->cfg;
	khor_status st;
	kdeadline dl = kdeadline_in_ms(s->init_timeout_ms);

	if (s->serve_store) {
		st = store_server_start(NULL, s->store_port, s->secret, s->job_id, &c->server, err);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "rank 0 could not start the rendezvous store on port %u",
			            s->store_port);
			return st;
		}
		KLOG_INFO("serving the rendezvous store on port %u", s->store_port);
	}
	snprintf(c->store_addr, sizeof(c->store_addr), "%s%s:%u",
	         s->store_etcd ? STORE_ETCD_SCHEME : "", s->store_host, s->store_port);
	st = store_connect(c->store_addr, s->secret, s->job_id, dl, &c->store, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (s->elastic)
		return elastic_place(c, err);
	/*
	 * The k-th init of each rank meets in generation k. A job that finalizes and inits
	 * again (Horovod's shutdown() and init(), a rank script running two programs) would
	 * otherwise read the first init's addresses, counters and abort notice, and wait out
	 * its timeout on a peer that left. Generation 0 holds only these counters.
	 */
	char key[32];
	int64_t k = 0;
	store_set_prefix(c->store, s->job_id, 0);
	snprintf(key, sizeof(key), "inits/%d", c->rank);
	st = store_add(c->store, key, 1, &k, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "rank %d: counting its inits in the store at %s", c->rank,
		            c->store_addr);
		return st;
	}
	if (k < 1 || k > INT32_MAX)
		return kerr_set(err, KHOR_ERR_INTERNAL, "rank %d: the store counted %lld inits of "
		                "this rank", c->rank, (long long)k);
	c->generation = (int)k;
	store_set_prefix(c->store, s->job_id, c->generation);
	if (k > 1)
		KLOG_INFO("init %lld of rank %d in job '%s': store generation %d", (long long)k,
		          c->rank, s->job_id, c->generation);
	return KHOR_SUCCESS;
}

/* Lists the ranks that never published their address (for the init timeout message). */
static void name_missing(kctx *c, char *out, size_t len)
{
	size_t off = 0;
	int missing = 0;
	kdeadline now = kdeadline_in_ms(0);

	out[0] = '\0';
	for (int r = 0; r < c->size && off + 16 < len; r++) {
		char key[32];
		void *v;
		size_t vl;
		kerr e;
		snprintf(key, sizeof(key), "tps/%d", r);
		if (store_get(c->store, key, now, &v, &vl, &e) == KHOR_SUCCESS) {
			free(v);
			continue;
		}
		if (missing++ < 32)
			off += (size_t)snprintf(out + off, len - off, "%s%d", off ? ", " : "", r);
	}
	if (missing > 32 && off + 16 < len)
		snprintf(out + off, len - off, " and %d more", missing - 32);
}

/* This machine's boot id: the same for every process on it, whatever its network namespace. */
static const char *machine_id(void)
{
	static char id[64];
	FILE *f;

	if (id[0] != '\0')
		return id;
	f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f == NULL || fgets(id, sizeof(id), f) == NULL)
		gethostname(id, sizeof(id) - 1);
	if (f != NULL)
		fclose(f);
	id[strcspn(id, "\n")] = '\0';
	return id;
}

/*
 * The cores this machine's ranks share: what the launcher says (KHOR_LOCAL_CPUS: khorrun
 * counts the CPUs it was given, before it pins any rank), else the online CPUs, or fewer
 * when this process may run on fewer (a container's cpuset, taskset). Without the launcher's
 * word a set of one core is taken as a rank pinned to its own core (Slurm's --cpu-bind),
 * which says nothing about the others.
 */
static int shared_cores(const kctx *c)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	int n = online > 0 ? (int)online : 1;
	cpu_set_t set;

	if (c->cfg.local_cpus > 0)
		return c->cfg.local_cpus;

	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		int mine = CPU_COUNT(&set);
		if (mine > 1 && mine < n)
			n = mine;
	}
	return n;
}

/* CPUs in a sysfs list such as "0-3,8-11"; 0 when unreadable. */
static int count_cpu_list(const char *s)
{
	int n = 0;

	while (*s >= '0' && *s <= '9') {
		char *end;
		long a = strtol(s, &end, 10), b = a;
		if (*end == '-')
			b = strtol(end + 1, &end, 10);
		if (b >= a)
			n += (int)(b - a + 1);
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

/* The first line of cpu0's cache attribute index<i>/<name> into buf; false if unreadable. */
static bool cache_attr(int i, const char *name, char *buf, int len)
{
	char path[96];
	FILE *f;
	bool ok;

	snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, name);
	if ((f = fopen(path, "r")) == NULL)
		return false;
	ok = fgets(buf, len, f) != NULL;
	fclose(f);
	return ok;
}

/*
 * Bytes of last-level cache one of ranks_here ranks can count on: the biggest data or
 * unified cache of cpu0 (sysfs), times how many of them the machine has (online CPUs over
 * the CPUs sharing one), over the ranks. sysfs rather than sysconf: on a 2-core VM glibc's
 * LEVEL3_CACHE_SIZE said 256 MiB (the host's), sysfs 32 MiB shared by both cores. 0 when
 * unknown, and 0 when ranks outnumber cores: they take turns on a core and each evicts
 * what the last one left, pipelined or not (measured: with 4 and 8 ranks on 2 cores
 * halving-doubling stayed level with the ring up to 256 MiB).
 */
static double cache_share(int ranks_here, int cores)
{
	double size = 0;
	int shared = 1, best_level = 0;
	char buf[256];

	if (ranks_here < 1 || ranks_here > cores)
		return 0;
	for (int i = 0; i < 16 && cache_attr(i, "level", buf, sizeof buf); i++) {
		int level = atoi(buf);
		char *unit;
		double sz;

		if (level <= best_level ||
		    (cache_attr(i, "type", buf, sizeof buf) && strncmp(buf, "Instruction", 11) == 0) ||
		    !cache_attr(i, "size", buf, sizeof buf))
			continue;
		sz = strtod(buf, &unit);
		sz *= *unit == 'K' ? 1024 : *unit == 'M' ? 1024 * 1024 : 1;
		if (sz <= 0)
			continue;
		best_level = level;
		size = sz;
		shared = cache_attr(i, "shared_cpu_list", buf, sizeof buf) ? count_cpu_list(buf) : 1;
		if (shared < 1)
			shared = 1;
	}
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	int domains = online > shared ? (int)(online / shared) : 1;
	return size * domains / ranks_here;
}

/*
 * Measures the cost model: with node groups, intra-host pairs (node group) and inter-host
 * pairs (cross group) separately; otherwise neighbours in the world. One allreduce(max)
 * over the world then gives every rank the same numbers, so every rank picks the same
 * algorithm for every call.
 */
static khor_status calibrate(khor_comm *c, kerr *err)
{
	double v[7] = { 0, 0, 0, 0, 0, 0, 0 };
	khor_status st;
	uint32_t seq = c->next_seq++;
	kctx *x = c->ctx;
	const int ncpu = shared_cores(x);
	const bool own = x->on_machine <= ncpu;

	/*
	 * Elastic: a generation on the same hosts and ranks per host as the one this process
	 * measured in reuses that model, when every rank has one (the MAX below then still
	 * makes them one). The vote is a call of its own before the measurement's.
	 */
	double need = 1;
	if (x->cfg.elastic) {
		pthread_mutex_lock(&el.mu);
		if (el.have_model && el.size == x->size && el.nhosts == x->nhosts &&
		    el.on_machine == x->on_machine && strcmp(el.tps, x->tp_names) == 0) {
			memcpy(v, el.v, sizeof(v));
			need = 0;
		}
		pthread_mutex_unlock(&el.mu);
		st = rd_allreduce(&c->cc, &need, &need, 1, KHOR_FLOAT64, KHOR_MAX, seq, COLL_ALLREDUCE,
		                  err);
		if (st != KHOR_SUCCESS)
			return st;
		seq = c->next_seq++;
		if (need == 0) {
			KLOG_INFO("elastic: the cost model of the last generation is reused (same hosts "
			          "and ranks per host)");
			goto agree;
		}
		memset(v, 0, sizeof(v));
	}
	if (c->hier_ok) {
		st = cost_measure(&c->node_cc, seq, own, v, err);
		if (st == KHOR_SUCCESS)
			st = cost_measure(&c->cross_cc, seq, own, v + 3, err);
	} else {
		st = cost_measure(&c->cc, seq, own, c->nhosts > 1 ? v + 3 : v, err);
		memcpy(c->nhosts > 1 ? v : v + 3, c->nhosts > 1 ? v + 3 : v, 3 * sizeof(double));
	}
	/*
	 * Ranks outnumbering cores share them for as long as a large collective runs, so each
	 * moves and reduces bytes at cores/ranks of the speed measured: a 1 MiB swap is shorter
	 * than a scheduler time slice and often runs with its pair alone on the cores. Without
	 * this the model saw 4 ranks on 2 cores at 2x, 8 at 4x their real bandwidth and kept
	 * recursive doubling up to 4x too large a size. Latency (alpha, a median of swaps made
	 * while every rank is busy) already carries the contention. Scaled before the max, so
	 * machines with different crowding still agree on one model.
	 */
	v[6] = -cache_share(x->on_machine, ncpu); /* the max of -x is the smallest cache */
	if (x->on_machine > ncpu) {
		double k = (double)x->on_machine / (double)ncpu;
		v[1] *= k;
		v[2] *= k;
		v[4] *= k;
		v[5] *= k;
	}
	KLOG_DEBUG("cost model measured here: intra alpha %.1f us, %.2f GB/s; inter alpha %.1f us, "
	           "%.2f GB/s; reduce %.2f GB/s", v[0] * 1e6, v[1] > 0 ? 1e-9 / v[1] : 0.0,
	           v[3] * 1e6, v[4] > 0 ? 1e-9 / v[4] : 0.0, v[2] > 0 ? 1e-9 / v[2] : 0.0);
agree:
	/* A call of its own: messages of one (comm, seq) must all be of one collective. */
	if (st == KHOR_SUCCESS)
		st = rd_allreduce(&c->cc, v, v, 7, KHOR_FLOAT64, KHOR_MAX, c->next_seq++,
		                  COLL_ALLREDUCE, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (x->cfg.elastic) {
		pthread_mutex_lock(&el.mu);
		el.have_model = true;
		el.size = x->size;
		el.nhosts = x->nhosts;
		el.on_machine = x->on_machine;
		snprintf(el.tps, sizeof(el.tps), "%s", x->tp_names);
		memcpy(el.v, v, sizeof(v));
		pthread_mutex_unlock(&el.mu);
	}
	x->inner = (cost_model){ .alpha = v[0], .beta = v[1], .gamma = v[2], .cache = -v[6] };
	x->outer = (cost_model){ .alpha = v[3], .beta = v[4], .gamma = v[5], .cache = -v[6] };
	return KHOR_SUCCESS;
}

/*
 * Settings that decide which messages a collective sends must be the same on every rank, or
 * the ranks run different schedules whose messages never meet and the first collective
 * waits out KHOR_TIMEOUT. A KHOR_ALGO exported on one host only is an easy mistake: compare
 * them once at init (an allreduce of each value and its negation, MAX) and name the setting.
 * The same allreduce tells every rank whether any host has more ranks than cores, which sets
 * how far auto's trials reach (comm_exec.c): a host-local answer would give two hosts different
 * candidates, and so different trial calls, for one call.
 */
static khor_status agree_settings(khor_comm *c, const struct khor_config *cfg, kerr *err)
{
	const settings *s = &c->ctx->cfg;
	static const char *const algos[] = { "auto", "ring", "rd", "tree", "hd" };
	static const char *const hiers[] = { "off", "on", "auto" };
	const struct {
		const char *name;
		double v;
	} mine[] = {
		{ "KHOR_ALGO", s->algo },
		{ "KHOR_HIER", s->hier },
		{ "KHOR_SLICE_BYTES", (double)s->slice_bytes },
		{ "KHOR_PIPELINE_DEPTH", s->pipeline_depth }, /* sets the tree's slice */
		{ "KHOR_MIN_STRIPE", (double)s->min_stripe },
		{ "KHOR_RD_MAX_BYTES", s->rd_max_set ? (double)s->rd_max_bytes : -1.0 },
		{ "KHOR_AUTO_TRIALS", s->auto_trials },
		{ "KHOR_COST_ALPHA_US", s->cost[0] },
		{ "KHOR_COST_BETA_GBPS", s->cost[1] },
		{ "KHOR_COST_GAMMA_GBPS", s->cost[2] },
	};
	enum { K = sizeof(mine) / sizeof(mine[0]) };
	double v[2 * K + 1];
	khor_status st;

	for (int i = 0; i < K; i++) {
		v[i] = mine[i].v;
		v[K + i] = -mine[i].v;
	}
	v[2 * K] = c->cc.spin_yield ? 1 : 0;
	st = rd_allreduce(&c->cc, v, v, 2 * K + 1, KHOR_FLOAT64, KHOR_MAX, c->next_seq++,
	                  COLL_ALLREDUCE, err);
	if (st != KHOR_SUCCESS)
		return st;
	c->ctx->crowded_any = v[2 * K] > 0;
	for (int i = 0; i < K; i++) {
		if (v[i] == -v[K + i])
			continue;
		char here[64];
		const char *given = config_lookup(cfg, mine[i].name);
		if (i == 0)
			snprintf(here, sizeof(here), "%s", algos[s->algo]);
		else if (i == 1)
			snprintf(here, sizeof(here), "%s", hiers[s->hier]);
		else if (given == NULL && strcmp(mine[i].name, "KHOR_AUTO_TRIALS") == 0)
			snprintf(here, sizeof(here), "unset (%g in effect%s)", mine[i].v,
			         s->cost[0] > 0 ? ", as KHOR_COST_* are set" : "");
		else
			snprintf(here, sizeof(here), "%s", given != NULL ? given : "unset");
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s is %s here but not the same on every "
		                "rank: set it alike everywhere (or nowhere), since it decides which "
		                "messages a collective sends", mine[i].name, here);
	}
	return KHOR_SUCCESS;
}


/*
 * Host names of every rank give the topology. "host/<rank>" is "<name>\t<boot id>\t<sum>":
 * the name (KHOR_HOSTNAME may pretend) groups ranks into hosts, numbered by their lowest
 * rank; the boot id tells which ranks really share this machine's cores; sum is
 * KHOR_CHECKSUM (0 or 1), which changes every frame a rank sends and expects: ranks that
 * differ would meet in no frame, and the first collective would wait out its deadline, so
 * every rank names the first rank whose sum differs from rank 0's (the same words
 * everywhere). Read once, at init.
 */
static khor_status read_hosts(kctx *x, kdeadline dl, kerr *err)
{
	char (*hosts)[256] = calloc((size_t)x->size, sizeof(*hosts));
	khor_status st = KHOR_SUCCESS;

	x->host_of = calloc((size_t)x->size, sizeof(int));
	if (hosts == NULL || x->host_of == NULL) {
		free(hosts);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "init: out of memory for %d host names",
		                x->size);
	}
	char sum0 = '0';
	for (int r = 0; r < x->size && st == KHOR_SUCCESS; r++) {
		char key[32];
		void *v;
		size_t vl;
		snprintf(key, sizeof(key), "host/%d", r);
		st = store_get(x->store, key, dl, &v, &vl, err);
		if (st != KHOR_SUCCESS)
			break;
		char *boot = strchr(v, '\t'), *sum = NULL;
		if (boot != NULL) {
			*boot++ = '\0';
			if ((sum = strchr(boot, '\t')) != NULL)
				*sum++ = '\0';
			if (strcmp(boot, machine_id()) == 0)
				x->on_machine++;
		}
		const char mine = sum != NULL && strcmp(sum, "1") == 0 ? '1' : '0';
		if (r == 0)
			sum0 = mine;
		else if (mine != sum0 && st == KHOR_SUCCESS)
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, "init: KHOR_CHECKSUM is %c on rank 0 "
			              "on %s but %c on rank %d on %s: set it alike on every rank (or on "
			              "none), since it changes every frame a rank sends and expects",
			              sum0, hosts[0], mine, r, (char *)v);
		kstrlcpy(hosts[r], v, sizeof(hosts[r]));
		free(v);
		int h = -1;
		for (int q = 0; q < r && h < 0; q++)
			if (strcmp(hosts[q], hosts[r]) == 0)
				h = x->host_of[q];
		x->host_of[r] = h >= 0 ? h : x->nhosts++;
	}
	free(hosts);
	return st;
}

/*
 * A comm's topology from its members' hosts: local rank and size, cross rank and size
 * (Horovod's meaning: the index among ranks with the same local rank), and the two groups
 * the node-aware collectives run on, which exist only when every host of the comm has the
 * same number of its ranks. node_map and cross_map hold world ranks (links are the
 * world's); host_ranks holds comm ranks.
 */
static khor_status comm_topology(khor_comm *c, kerr *err)
{
	kctx *x = c->ctx;
	const int n = c->size;
	int *hidx = calloc((size_t)n, sizeof(int)), *seen = calloc((size_t)x->nhosts + 1,
	                                                          sizeof(int));
	int *per_host = calloc((size_t)n, sizeof(int)), *fill = calloc((size_t)n, sizeof(int));
	khor_status st = KHOR_SUCCESS;
	int nh = 0, lr = 0, ls = 0;

	c->node_map = calloc((size_t)n, sizeof(int));
	c->cross_map = calloc((size_t)n, sizeof(int));
	c->host_ranks = calloc((size_t)n, sizeof(int));
	if (hidx == NULL || seen == NULL || per_host == NULL || fill == NULL ||
	    c->node_map == NULL || c->cross_map == NULL || c->host_ranks == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for its topology", c->name);
		goto out;
	}
	/* hidx[r]: the comm's own numbering of r's host, hosts by their lowest comm rank. */
	for (int h = 0; h <= x->nhosts; h++)
		seen[h] = -1;
	for (int r = 0; r < n; r++) {
		int wh = x->size > 1 ? x->host_of[comm_world_rank(c, r)] : 0;
		if (seen[wh] < 0)
			seen[wh] = nh++;
		hidx[r] = seen[wh];
		per_host[hidx[r]]++;
	}
	const int me_h = hidx[c->rank];
	for (int r = 0; r < n; r++) {
		if (hidx[r] != me_h)
			continue;
		if (r < c->rank)
			lr++;
		c->node_map[ls++] = comm_world_rank(c, r);
	}
	bool uniform = true;
	for (int h = 0; h < nh; h++)
		uniform = uniform && per_host[h] == ls;
	c->nhosts = nh;
	c->node_n = ls;
	c->node_me = lr;
	c->local_rank = lr;
	c->local_size = ls;
	c->cross_rank = me_h;
	c->cross_size = nh;
	c->hier_ok = uniform && nh > 1 && ls > 1;
	c->cross_n = 0;
	if (uniform) {
		/* The cross group: on every host, the rank with my local index. */
		for (int r = 0; r < n; r++) {
			int k = fill[hidx[r]]++;
			c->host_ranks[hidx[r] * ls + k] = r;
		}
		for (int h = 0; h < nh; h++) {
			int r = c->host_ranks[h * ls + lr];
			if (r == c->rank)
				c->cross_me = c->cross_n;
			c->cross_map[c->cross_n++] = comm_world_rank(c, r);
		}
		c->hier_blocked = c->hier_ok;
		for (int r = 0; r < n; r++)
			c->hier_blocked = c->hier_blocked && c->host_ranks[r] == r;
	} else {
		c->hier_ok = false;
	}
	if (c->world_ranks == NULL) {
		/* Launcher-given values win for the world's getters. */
		const settings *s = &x->cfg;
		if (s->local_rank >= 0)
			c->local_rank = s->local_rank;
		if (s->local_size > 0)
			c->local_size = s->local_size;
		if (s->cross_rank >= 0)
			c->cross_rank = s->cross_rank;
		if (s->cross_size > 0)
			c->cross_size = s->cross_size;
	}
out:
	free(hidx);
	free(seen);
	free(per_host);
	free(fill);
	return st;
}

/* A sub-group comm that shares the comm's links, scratch and model. */
static void make_group(const khor_comm *c, coll_comm *g, uint32_t id, const int *map, int n,
                       int me)
{
	*g = c->cc;
	g->comm_id = id;
	g->map = map;
	g->size = n;
	g->rank = me;
	memset(g->logged, 0, sizeof(g->logged));
}

int comm_world_rank(const khor_comm *c, int r)
{
	return c->world_ranks != NULL ? c->world_ranks[r] : r;
}

/* "comm 8 (world ranks 0, 2, 4, 6)", runs of ranks shortened ("0-7"), for error texts. */
static void comm_name(khor_comm *c)
{
	size_t off;

	if (c->world_ranks == NULL) {
		snprintf(c->name, sizeof(c->name), "comm 0 (the world, %d ranks)", c->size);
		return;
	}
	off = (size_t)snprintf(c->name, sizeof(c->name), "comm %u (world ranks ", c->id);
	for (int i = 0; i < c->size && off + 16 < sizeof(c->name); i++) {
		int j = i;
		while (j + 1 < c->size && c->world_ranks[j + 1] == c->world_ranks[j] + 1)
			j++;
		if (j > i + 1)
			off += (size_t)snprintf(c->name + off, sizeof(c->name) - off, "%s%d-%d",
			                        i ? ", " : "", c->world_ranks[i], c->world_ranks[j]);
		else
			off += (size_t)snprintf(c->name + off, sizeof(c->name) - off, "%s%d",
			                        i ? ", " : "", c->world_ranks[(j = i)]);
		i = j;
		if (i + 1 < c->size && off + 16 >= sizeof(c->name))
			off += (size_t)snprintf(c->name + off, sizeof(c->name) - off, ", ...");
	}
	snprintf(c->name + off, sizeof(c->name) - off, ")");
}

/* The cost model every comm takes from the context: flat schedules are only as fast as the
 * slowest links they cross. */
static void comm_apply_model(khor_comm *c)
{
	kctx *x = c->ctx;

	c->cc.model = c->nhosts > 1 ? x->outer : x->inner;
	c->node_cc.model = x->inner;
	c->cross_cc.model = x->outer;
}

khor_status comm_create(kctx *x, const khor_comm *parent, const int *members, int n, int me,
                        uint32_t id, khor_comm **comm_out, kerr *err)
{
	const settings *s = &x->cfg;
	khor_comm *c = calloc(1, sizeof(*c));
	khor_status st;

	if (c == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "rank %d: out of memory for a comm", x->rank);
	c->ctx = x;
	klist_init(&c->in_ctx);
	c->rank = me;
	c->size = n;
	c->id = id;
	c->refs = 1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	kerr_clear(&c->err);
	kerr_clear(&c->last);
	c->tune_algo = parent != NULL ? parent->tune_algo : s->algo;
	c->tune_hier = parent != NULL ? parent->tune_hier : s->hier;
	c->tune_hier_allreduce = parent != NULL ? parent->tune_hier_allreduce : s->hier_allreduce;
	c->tune_hier_allgather = parent != NULL ? parent->tune_hier_allgather : s->hier_allgather;
	c->run_hier = c->tune_hier;
	if (members != NULL) {
		c->world_ranks = malloc((size_t)n * sizeof(int));
		if (c->world_ranks == NULL) {
			free(c);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "rank %d: out of memory for a comm",
			                x->rank);
		}
		memcpy(c->world_ranks, members, (size_t)n * sizeof(int));
	}
	comm_name(c);
	c->cc.scratch_len = (size_t)s->pipeline_depth * s->slice_bytes;
	c->cc.scratch = aligned_alloc(64, (c->cc.scratch_len + 63) & ~(size_t)63);
	if (c->cc.scratch == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory", c->name);
		goto fail;
	}
	if ((st = comm_topology(c, err)) != KHOR_SUCCESS)
		goto fail;
	memcpy(c->cc.tps, x->tps, sizeof(x->tps));
	c->cc.ntps = x->ntps;
	c->cc.rank = me;
	c->cc.size = n;
	c->cc.map = c->world_ranks;
	c->cc.big = &c->big;
	c->cc.big_len = &c->big_len;
	c->cc.tmp = &c->tmp;
	c->cc.tmp_len = &c->tmp_len;
	c->cc.mem = &c->mem;
	c->reg_call.scope = REGCACHE_ONESHOT;
	c->cc.reg_call = x->ncaches > 0 ? &c->reg_call : NULL;
	c->cc.comm_id = id;
	c->cc.owner = c;
	c->cc.get_link = comm_get_link;
	c->cc.check_abort = comm_check_abort;
	c->cc.aborted = &x->aborted;
	c->cc.slice_bytes = s->slice_bytes;
	c->cc.max_lanes = s->pipeline_depth;
	c->cc.timeout_ms = s->timeout_ms;
	c->cc.check_alive = liveness_on(x) ? liveness_comm_check : NULL;
	c->cc.rd_max_bytes = s->rd_max_bytes;
	c->cc.algo = c->tune_algo;
	c->cc.spin_ns = s->spin_us * 1000;
	/*
	 * When this machine has more ranks than cores (counted by boot id, so ranks in network
	 * namespaces or with pretend host names count too), a spinning rank steals the core its
	 * peer needs: yield while spinning. With exactly one rank per core, yielding measured
	 * slower (a syscall and a pass through the scheduler per spin).
	 */
	c->cc.spin_yield = x->on_machine > shared_cores(x);
	c->cc.spinning = &x->spinning;
	c->cc.max_spinners = x->on_machine > 0 ? shared_cores(x) / x->on_machine : 1;
	if (c->cc.max_spinners < 1)
		c->cc.max_spinners = 1;
	make_group(c, &c->node_cc, id + 1, c->node_map, c->node_n, c->node_me);
	make_group(c, &c->cross_cc, id + 2, c->cross_map, c->cross_n, c->cross_me);
	comm_apply_model(c);
	*comm_out = c;
	return KHOR_SUCCESS;
fail:
	comm_destroy(c);
	return st;
}

void comm_root_position(const khor_comm *c, int root, int *host_out, int *local_out)
{
	*host_out = *local_out = 0;
	for (int i = 0; i < c->cross_n * c->node_n; i++) {
		if (c->host_ranks[i] == root) {
			*host_out = i / c->node_n;
			*local_out = i % c->node_n;
			return;
		}
	}
}

/*
 * Frees what comm_create made; the caller has stopped the thread. The struct itself (its
 * lock, and the requests' view of it) lives on while requests of it are not freed yet
 * (comm_release), so khor_request_free after khor_comm_free or khor_finalize is safe.
 */
static void comm_free_fields(khor_comm *c)
{
	if (c->ctx != NULL) {
		comm_reg_invalidate(c->ctx, c->big, c->big_len);
		comm_reg_invalidate(c->ctx, c->tmp, c->tmp_len);
		comm_reg_invalidate(c->ctx, c->cc.scratch, c->cc.scratch_len);
	}
	if (c->nccl_free != NULL)
		c->nccl_free(c);
	kmem_state_destroy(&c->mem);
	free(c->world_ranks);
	free(c->big);
	free(c->tmp);
	free(c->node_map);
	free(c->cross_map);
	free(c->host_ranks);
	free(c->cc.scratch);
	c->world_ranks = c->node_map = c->cross_map = c->host_ranks = NULL;
	c->big = c->tmp = c->cc.scratch = NULL;
	c->ctx = NULL;
	comm_release(c);
}

void comm_release(khor_comm *c)
{
	pthread_mutex_lock(&c->mu);
	bool last = --c->refs == 0;
	pthread_mutex_unlock(&c->mu);
	if (!last)
		return;
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static void comm_stop_worker(khor_comm *c)
{
	pthread_mutex_lock(&c->mu);
	c->worker_stop = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (c->worker_started)
		pthread_join(c->worker, NULL);
	c->worker_started = false;
}

void comm_destroy(khor_comm *c)
{
	if (c == NULL)
		return;
	comm_stop_worker(c);
	comm_free_fields(c);
}

/* Tears down a context whose comms are gone (or were never made). */
static void ctx_destroy(kctx *x)
{
	alive_stop(x);
	liveness_free(x);
	if (x->store != NULL)
		store_close(x->store);
	for (int i = 0; i < x->ntps; i++) {
		regcache_destroy(x->tps[i].cache);
		x->tps[i].ops->destroy(x->tps[i].ctx);
	}
	if (x->server != NULL)
		store_server_stop(x->server);
	free(x->links);
	free(x->link_tp);
	free((void *)x->ready);
	free(x->host_of);
	free(x->cg);
	pthread_mutex_destroy(&x->link_mu);
	pthread_mutex_destroy(&x->comms_mu);
	free(x);
}

int comm_tp_index(const kctx *x, const char *name)
{
	for (int i = 0; i < x->ntps; i++)
		if (strcmp(x->tps[i].ops->name, name) == 0)
			return i;
	return -1;
}

/* Why a transport is not in this library, for KHOR_TRANSPORT=<it>. */
static const char *missing_why(const char *name)
{
	if (strcmp(name, "ib") == 0)
		return "it was built without infiniband/verbs.h (install libibverbs-dev and rebuild)";
	return "it was built without it";
}

/*
 * Creates the transports: under KHOR_TRANSPORT=auto every one compiled in (one that cannot
 * run here, such as ib without rdma-core or an active port, is left out with the reason at
 * KLOG_INFO; tcp, everyone's fallback, must start); under KHOR_TRANSPORT=X only X, which
 * then carries every link. Publishes each one's address, then "tps/<rank>", and makes the
 * registration caches and the link tables.
 */
static khor_status start_transports(kctx *x, kerr *err)
{
	const settings *s = &x->cfg;
	khor_status st;
	char key[48], list[64] = "";
	const bool any = strcmp(s->transport, "auto") == 0;
	int n;
	const struct transport_ops *const *all = transport_list(&n);

	if (!any && transport_find(s->transport) == NULL)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "KHOR_TRANSPORT=%s, but this library "
		                "has no %s transport: %s", s->transport, s->transport,
		                missing_why(s->transport));
	ksockaddr hint;
	kerr ignore;
	bool have_hint = ksock_resolve(s->store_host, s->store_port, &hint, &ignore) == KHOR_SUCCESS;
	if (have_hint && ksock_addr_is_loopback(&hint) &&
	    !ksock_store_is_local_only(s->store_host, &hint)) {
		char hs[64];
		KLOG_INFO("the store's host '%s' is %s here, a loopback address, but other hosts may "
		          "see another one: choosing this rank's addresses without it",
		          s->store_host, ksock_addr_str(&hint, hs, sizeof(hs)));
		have_hint = false;
	}
	tp_options o = {
		.rank = x->rank, .size = x->size, .job_id = x->tp_job, .secret = s->secret,
		.ifname_spec = s->ifname[0] ? s->ifname : NULL, .hint_addr = have_hint ? &hint : NULL,
		.nsocks = s->nsocks, .min_stripe_bytes = s->min_stripe,
		.sock_bufsize = s->sock_bufsize, .handshake_timeout_ms = 30000,
		.meta = &coll_meta_rules, .hostname = s->hostname,
		.ib_hca = s->ib_hca, .ib_gid_index = s->ib_gid_index, .ib_qps = s->ib_qps,
		.ib_timeout = s->ib_timeout, .ib_retry_cnt = s->ib_retry_cnt, .ib_max_wr = s->ib_max_wr,
		.ib_flush_always = s->ib_flush_always, .shm_cma = s->shm_cma,
	};
	for (int i = 0; i < n && x->ntps < COLL_MAX_TP; i++) {
		const struct transport_ops *ops = all[i];
		if (!any && strcmp(ops->name, s->transport) != 0)
			continue;
		/* Checksums or injected faults: the filter layer over the transport (and nothing
		 * in between without them). */
		if ((s->checksum || s->faults[0] != '\0') &&
		    (st = filter_wrap(ops, s->faults, s->checksum, &ops, err)) != KHOR_SUCCESS)
			return st;
		coll_tp *t = &x->tps[x->ntps];
		memset(t, 0, sizeof(*t));
		st = ops->create(&o, &t->ctx, err);
		if (st == KHOR_ERR_NOT_SUPPORTED && any && strcmp(ops->name, "tcp") != 0) {
			KLOG_INFO("%s transport unavailable: %s", ops->name, err->text);
			kerr_clear(err);
			continue;
		}
		if (st != KHOR_SUCCESS) {
			if (!any)
				kerr_prefix(err, "KHOR_TRANSPORT=%s", s->transport);
			return st;
		}
		t->ops = ops;
		x->ntps++;
		if (ops->caps != NULL)
			ops->caps(t->ctx, &t->caps);
		if (t->caps.needs_reg) {
			regcache_limits lim = { .max_entries = s->reg_entries,
			                        .max_bytes = (size_t)s->reg_bytes };
			if ((st = regcache_create(ops, t->ctx, &lim, &t->cache, err)) != KHOR_SUCCESS)
				return st;
			x->ncaches++;
		}
		const char *addr = ops->address(t->ctx);
		snprintf(key, sizeof(key), "addr/%s/%d", ops->name, x->rank);
		if ((st = store_set(x->store, key, addr, strlen(addr), err)))
			return st;
		size_t l = strlen(list);
		snprintf(list + l, sizeof(list) - l, "%s%s", l ? "," : "", ops->name);
		l = strlen(x->tp_names);
		snprintf(x->tp_names + l, sizeof(x->tp_names) - l, "%s%s", l ? "+" : "", ops->name);
	}
	snprintf(key, sizeof(key), "tps/%d", x->rank);
	if ((st = store_set(x->store, key, list, strlen(list), err)))
		return st;
	x->links = calloc((size_t)x->size, sizeof(tp_link *));
	x->link_tp = malloc((size_t)x->size);
	x->ready = calloc((size_t)x->size, sizeof(*x->ready));
	if (x->links == NULL || x->link_tp == NULL || x->ready == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "init: out of memory");
	memset(x->link_tp, -1, (size_t)x->size);
	return KHOR_SUCCESS;
}

/*
 * Waits for "ready". In an elastic job a planned rank may die before it joins: the driver
 * then ends the generation (its abort key), and this init gives up at once to join the
 * next one instead of waiting out its deadline.
 */
static khor_status wait_ready(kctx *x, kdeadline dl, kerr *err)
{
	void *v;
	size_t vl;
	khor_status st;

	for (;;) {
		kdeadline slice = x->cfg.elastic ? kdeadline_in_ms(kdeadline_left_ms(dl, 100)) : dl;
		st = store_get(x->store, "ready", slice, &v, &vl, err);
		if (st == KHOR_SUCCESS) {
			free(v);
			return st;
		}
		if (st != KHOR_ERR_TIMEOUT || kdeadline_passed(dl))
			return st;
		kerr e;
		if (store_get(x->store, "abort", kdeadline_in_ms(0), &v, &vl, &e) == KHOR_SUCCESS) {
			st = kerr_set(err, KHOR_ERR_MEMBERSHIP, "generation %d ended before every rank "
			              "joined: %s", x->generation, (char *)v);
			free(v);
			return st;
		}
	}
}

/* The job's first failure, for the other ranks: "abort" is written by the first writer
 * only ("abort_count" decides who that is). False when another rank was first. */
static bool publish_abort(kctx *x, const char *text)
{
	int64_t n = 0;
	kerr ignore;

	if (store_add(x->store, "abort_count", 1, &n, &ignore) != KHOR_SUCCESS)
		return true; /* no store to tell: this rank's own words are all there is */
	if (n == 1) {
		atomic_store(&x->abort_mine, true);
		store_set(x->store, "abort", text, strlen(text), &ignore);
	}
	return n == 1;
}

/*
 * The job's first failure, when another rank wrote it within wait_ms: e becomes it, with this
 * rank's own view after it, so that every rank reports the same cause. True when it did.
 */
static bool adopt_abort(kctx *x, kerr *e, int wait_ms)
{
	void *v;
	size_t vl;
	kerr ignore;
	char mine[KERR_TEXT_MAX];

	if (store_get(x->store, "abort", kdeadline_in_ms(wait_ms), &v, &vl, &ignore) !=
	    KHOR_SUCCESS)
		return false;
	kstrlcpy(mine, e->text, sizeof(mine));
	kerr_set(e, KHOR_ERR_REMOTE, "the job was aborted by another rank: %s (seen here as: %s)",
	         (char *)v, mine);
	free(v);
	return true;
}

/*
 * A fixed job's failure seen here: told to the others (mine: e's text as they are to read
 * it), or, when another rank was first, e becomes that rank's cause. A closed or reset link
 * (KHOR_ERR_REMOTE) is usually the echo of the far end's own failure, which that end is
 * about to write: it waits for that first, so that the cause and not its echo is what every
 * rank reports. Two ranks that fail at once of their own (the two halves of a cycle) are
 * settled by the count: the second takes the first's words. True when e was rewritten.
 */
static bool job_verdict(kctx *x, const char *mine, kerr *e)
{
	if (e->status == KHOR_ERR_REMOTE && adopt_abort(x, e, 300))
		return true;
	if (publish_abort(x, mine))
		return false;
	return adopt_abort(x, e, 300);
}

/* Whether a failure seen here is for job_verdict: a fixed job with a store, whose first
 * failure this rank has not written already and which is not another rank's already. */
static bool job_may_tell(kctx *x, const kerr *e)
{
	return x != NULL && x->store != NULL && !x->cfg.elastic && !atomic_load(&x->abort_mine) &&
	       strstr(e->text, "aborted by another rank") == NULL;
}

void comm_job_failure(kctx *x, kerr *e)
{
	if (e->status == KHOR_ERR_INVALID_ARG || !job_may_tell(x, e))
		return;
	char mine[KERR_TEXT_MAX];
	kstrlcpy(mine, e->text, sizeof(mine));
	job_verdict(x, mine, e);
}

static khor_status comm_init_once(const struct khor_config *cfg, khor_comm **comm_out,
                                  kerr *err)
{
	kctx *x;
	khor_comm *c = NULL;
	khor_status st;
	char key[32];

	klog_init_from_env();
	x = calloc(1, sizeof(*x));
	if (x == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "init: out of memory");
	pthread_mutex_init(&x->link_mu, NULL);
	pthread_mutex_init(&x->comms_mu, NULL);
	klist_init(&x->comms);
	st = config_parse(cfg, &x->cfg, err);
	if (st != KHOR_SUCCESS) {
		ctx_destroy(x);
		return st;
	}
	settings *s = &x->cfg;
	x->rank = s->rank;
	x->size = s->size;
	snprintf(x->tp_job, sizeof(x->tp_job), "%s", s->job_id);
	klog_set_identity(x->rank, s->hostname);
	/* Once per process: an elastic job's every new generation inits again. */
	static atomic_flag horovod_warned = ATOMIC_FLAG_INIT;
	if (x->rank == 0 && !atomic_flag_test_and_set(&horovod_warned))
		config_warn_unread_horovod();
	if (x->size == 1 && !s->elastic) {
		x->nhosts = x->on_machine = 1;
		if ((st = comm_create(x, NULL, NULL, 1, 0, 0, &c, err)) != KHOR_SUCCESS)
			goto fail;
		x->world = c;
		*comm_out = c;
		return KHOR_SUCCESS;
	}

	kdeadline dl = kdeadline_in_ms(s->init_timeout_ms);
	if ((st = start_store(x, err)) != KHOR_SUCCESS)
		goto fail;
	if (s->secret[0] == '\0' && x->rank == 0)
		KLOG_WARN("job '%s' runs unauthenticated: no KHOR_SECRET is set (khorrun sets one)",
		          s->job_id);
	if ((st = start_transports(x, err)) != KHOR_SUCCESS)
		goto fail;
	/*
	 * "host/<rank>" = "<host name>\t<boot id>\t<KHOR_CHECKSUM>" (read_hosts).
	 */
	char hostval[320];
	snprintf(hostval, sizeof(hostval), "%s\t%s\t%d", s->hostname, machine_id(),
	         s->checksum ? 1 : 0);
	snprintf(key, sizeof(key), "host/%d", x->rank);
	if ((st = store_set(x->store, key, hostval, strlen(hostval), err)))
		goto fail;
	int64_t joined;
	if ((st = store_add(x->store, "joined", 1, &joined, err)))
		goto fail;
	if (joined == x->size && (st = store_set(x->store, "ready", "1", 1, err)))
		goto fail;
	st = wait_ready(x, dl, err);
	if (st == KHOR_ERR_TIMEOUT) {
		char missing[256], again[128] = "";
		name_missing(x, missing, sizeof(missing));
		if (x->generation > 1)
			snprintf(again, sizeof(again), " (this was rank %d's init number %d in this job: "
			         "the others must init as often)", x->rank, x->generation);
		st = kerr_set(err, KHOR_ERR_TIMEOUT, "init: timed out after %lld ms "
		              "(KHOR_INIT_TIMEOUT) waiting for all %d ranks to join the store at %s; "
		              "ranks that never came: %s%s", (long long)s->init_timeout_ms, x->size,
		              x->store_addr, missing[0] ? missing : "(none missing now; retry?)",
		              again);
		goto fail;
	}
	if (st != KHOR_SUCCESS)
		goto fail;
	if ((st = alive_start(x, err)) != KHOR_SUCCESS)
		goto fail;
	if ((st = read_hosts(x, dl, err)))
		goto fail;
	if ((st = comm_create(x, NULL, NULL, x->size, x->rank, 0, &c, err)) != KHOR_SUCCESS)
		goto fail;
	x->world = c;
	if ((st = agree_settings(c, cfg, err)) != KHOR_SUCCESS)
		goto fail;
	if (s->cost[0] > 0) {
		x->inner = (cost_model){ .alpha = s->cost[0], .beta = s->cost[1], .gamma = s->cost[2] };
		x->outer = x->inner;
	} else if ((st = calibrate(c, err)) != KHOR_SUCCESS) {
		goto fail;
	}
	x->inner.ring_slice = x->outer.ring_slice = (double)s->slice_bytes;
	comm_apply_model(c);
	KLOG_INFO("cost model (%s): intra-host alpha %.1f us, link %.2f GB/s; inter-host alpha "
	          "%.1f us, link %.2f GB/s; reduce %.2f GB/s; cache %.1f MiB per rank; %d host(s), "
	          "node-aware %s; %d rank(s) on this machine's %d CPU(s)%s",
	          s->cost[0] > 0 ? "from KHOR_COST_*" : "measured at init", x->inner.alpha * 1e6,
	          1e-9 / x->inner.beta, x->outer.alpha * 1e6, 1e-9 / x->outer.beta,
	          1e-9 / x->inner.gamma, x->inner.cache / (1 << 20), x->nhosts,
	          c->hier_ok ? "possible" : "off", x->on_machine, shared_cores(x),
	          c->cc.spin_yield ? ", yielding while spinning" : "");
	if (klog_threshold >= KLOG_INFO) {
		char tps[4 * (TP_ADDR_MAX + 16)] = "";
		size_t off = 0;
		for (int i = 0; i < x->ntps && off < sizeof(tps); i++)
			off += (size_t)snprintf(tps + off, sizeof(tps) - off, "%s%s at %s", i ? ", " : "",
			                        x->tps[i].ops->name, x->tps[i].ops->address(x->tps[i].ctx));
		KLOG_INFO("joined job '%s' as rank %d of %d (local %d/%d, cross %d/%d) via %s; "
		          "transports: %s", s->job_id, x->rank, x->size, c->local_rank,
		          c->local_size, c->cross_rank, c->cross_size, s->source, tps);
	}
	*comm_out = c;
	return KHOR_SUCCESS;

fail:
	/* Placed in a generation that broke before it was whole: a membership change too. */
	if (s->elastic && x->generation > 0 && (st == KHOR_ERR_REMOTE || st == KHOR_ERR_SYSTEM ||
	                                        st == KHOR_ERR_PROTOCOL || st == KHOR_ERR_TIMEOUT))
		st = err->status = KHOR_ERR_MEMBERSHIP;
	if (st == KHOR_ERR_MEMBERSHIP)
		el_left(err->text);
	kerr_prefix(err, "rank %d on %s", x->rank, s->hostname);
	/*
	 * The others are in init too, waiting for this rank (to join, or in the first
	 * collectives): tell them why it will not come, as a failed call does, so that they
	 * fail now with this cause instead of judging it gone at KHOR_TIMEOUT. Not when the
	 * abort is theirs (this rank read it), nor in an elastic job, whose driver decides.
	 */
	if (x->store != NULL && !s->elastic && strstr(err->text, "aborted by another rank") ==
	    NULL && strstr(err->text, "ended before every rank joined") == NULL) {
		char mine[KERR_TEXT_MAX];
		kstrlcpy(mine, err->text, sizeof(mine));
		job_verdict(x, mine, err);
	}
	if (c != NULL) {
		x->world = NULL;
		comm_destroy(c);
	}
	ctx_destroy(x);
	return st;
}

khor_status comm_init(const struct khor_config *cfg, khor_comm **comm_out, kerr *err)
{
	for (int attempt = 1;; attempt++) {
		khor_status st = comm_init_once(cfg, comm_out, err);
		if (st != KHOR_ERR_MEMBERSHIP)
			return st;
		KLOG_WARN("elastic: joining again after attempt %d failed: %s", attempt, err->text);
		kerr_clear(err);
	}
}

int comm_generation(const khor_comm *c)
{
	return c->ctx->generation;
}

int comm_hosts_updated(const khor_comm *c)
{
	return atomic_load_explicit(&c->ctx->hosts_updated, memory_order_acquire);
}

bool comm_is_elastic(const khor_comm *c)
{
	return c->ctx->cfg.elastic;
}

/*
 * The job-wide count of workers that came to hold the training state (docs/ELASTIC.md,
 * el/held): a worker adds 1 once its first sync is done, and one without the state asks
 * (delta 0) whether anyone ever had it. It outlives every worker, so a generation of only
 * fresh workers can tell "the state never existed" (start from the first step) from "every
 * holder was lost" (the job cannot go on), which the ranks alone cannot.
 */
khor_status comm_elastic_state(khor_comm *c, bool hold, int64_t *held_out, kerr *err)
{
	kctx *x = c->ctx;
	khor_status st;

	if (!x->cfg.elastic || x->store == NULL)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "rank %d: khor_elastic_state: not an "
		                "elastic job (KHOR_ELASTIC=1 under an elastic driver)", c->rank);
	st = store_add_job(x->store, "el/held", hold ? 1 : 0, held_out, err);
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "rank %d (worker %s): khor_elastic_state: the store at %s", c->rank,
		            x->cfg.worker_id, x->store_addr);
	return st;
}

/* Whether the comma list l (a "tps/<rank>" value) names transport name. */
static bool list_has(const char *l, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = l; *p != '\0'; p += strcspn(p, ",") + (p[strcspn(p, ",")] != '\0')) {
		if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return true;
	}
	return false;
}

/*
 * Which transport carries the link to peer. Under KHOR_TRANSPORT=X the one this rank made
 * (shm refuses a peer on another host here, with the reason). Under auto: shm when both
 * share a host and both made shm; else ib when both made it; else tcp. Both ends apply
 * this rule to the same facts ("host/<rank>", "tps/<rank>"), so they pick alike. Read from
 * the store once per peer, on first use. Under link_mu.
 */
static khor_status choose_transport(kctx *c, int peer, kdeadline dl, int *tpi_out, kerr *err)
{
	char key[32];
	void *host = NULL, *theirs = NULL;
	size_t len;
	khor_status st;
	const int shm = comm_tp_index(c, "shm"), ib = comm_tp_index(c, "ib");
	const bool forced = strcmp(c->cfg.transport, "auto") != 0;
	int tpi;

	if (c->link_tp[peer] >= 0) {
		*tpi_out = c->link_tp[peer];
		return KHOR_SUCCESS;
	}
	if (c->ntps == 1 && (!forced || shm < 0)) {
		c->link_tp[peer] = 0;
		*tpi_out = 0;
		return KHOR_SUCCESS;
	}
	snprintf(key, sizeof(key), "host/%d", peer);
	st = store_get(c->store, key, dl, &host, &len, err);
	if (st != KHOR_SUCCESS)
		return st;
	((char *)host)[strcspn(host, "\t")] = '\0';
	const bool same = strcmp(host, c->cfg.hostname) == 0;
	if (forced) {
		/* KHOR_TRANSPORT=shm: the only transport made, and it reaches this host only. */
		if (!same) {
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_TRANSPORT=shm, but rank %d is on "
			              "host '%s' and this rank on '%s': shared memory reaches only the "
			              "same host (use auto, tcp or ib)", peer, (char *)host,
			              c->cfg.hostname);
			goto out;
		}
		tpi = 0;
	} else {
		snprintf(key, sizeof(key), "tps/%d", peer);
		if ((st = store_get(c->store, key, dl, &theirs, &len, err)) != KHOR_SUCCESS)
			goto out;
		if (same && shm >= 0 && list_has(theirs, "shm"))
			tpi = shm;
		else if (ib >= 0 && list_has(theirs, "ib"))
			tpi = ib;
		else
			tpi = comm_tp_index(c, "tcp");
		if (tpi < 0 || !list_has(theirs, c->tps[tpi].ops->name)) {
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, "no transport in common with rank %d "
			              "on host '%s': it made %s, this rank %s (is KHOR_TRANSPORT the "
			              "same on every rank?)", peer, (char *)host,
			              ((char *)theirs)[0] ? (char *)theirs : "none", c->tp_names);
			err->peer = peer;
			goto out;
		}
	}
	c->link_tp[peer] = (int8_t)tpi;
	*tpi_out = tpi;
out:
	free(host);
	free(theirs);
	return st;
}

/*
 * Makes (or waits for) the link to world rank peer, under link_mu. Another thread of this
 * rank may need a link too meanwhile and waits for the lock; the handshakes themselves
 * move in any thread's progress, so no rank's link waits on another rank's lock.
 */
static khor_status make_link(khor_comm *owner, int peer, kdeadline dl, tp_link **link_out,
                             int *tp_out, kerr *err)
{
	kctx *c = owner->ctx;
	tp_link *l = c->links[peer];
	khor_status st;
	int tpi = 0;
	const uint64_t t0 = kclock_ns();

	st = choose_transport(c, peer, dl, &tpi, err);
	if (st != KHOR_SUCCESS)
		return st;
	const struct transport_ops *ops = c->tps[tpi].ops;
	tp_ctx *ctx = c->tps[tpi].ctx;
	if (l == NULL && c->rank < peer) {
		char key[48];
		void *addr;
		size_t len;
		snprintf(key, sizeof(key), "addr/%s/%d", ops->name, peer);
		st = store_get(c->store, key, dl, &addr, &len, err);
		if (st != KHOR_SUCCESS)
			return st;
		st = ops->connect(ctx, peer, addr, &l, err);
		free(addr);
		if (st != KHOR_SUCCESS)
			return st;
		c->links[peer] = l;
	}
	for (;;) {
		if (l == NULL) {
			st = ops->accept(ctx, peer, &l, err);
			if (st != KHOR_SUCCESS)
				return st;
			c->links[peer] = l;
		}
		if (l != NULL && (st = ops->link_error(l, err)) != KHOR_SUCCESS)
			return st;
		if (l != NULL && ops->link_ready(l)) {
			if (klog_threshold >= KLOG_INFO) {
				char what[256] = "";
				if (ops->describe != NULL)
					ops->describe(l, what, sizeof(what));
				KLOG_INFO("link to rank %d uses %s: %s", peer, ops->name,
				          what[0] ? what : "ready");
			}
			atomic_store_explicit(&c->ready[peer], l, memory_order_release);
			*link_out = l;
			*tp_out = tpi;
			return KHOR_SUCCESS;
		}
		if (kdeadline_passed(dl) && owner->cc.check_alive != NULL) {
			/* A peer that is alive comes when it is done with what it does first. */
			int64_t again;
			char what[64];
			snprintf(what, sizeof(what), "%s rank %d over %s", c->rank < peer ?
			         "connecting to" : "waiting for a connection from", peer, ops->name);
			coll_alive_ask q = { .what = what, .peers = &peer, .n = 1,
			                     .waited_ms = (int64_t)((kclock_ns() - t0) / 1000000) };
			st = owner->cc.check_alive(owner, &q, &again, err);
			if (st != KHOR_SUCCESS)
				return st;
			dl = kdeadline_in_ms(again);
		}
		if (kdeadline_passed(dl)) {
			/* What tcp tried so far (each address of the peer and why it failed), when we
			 * were the side that connects. transport.h promises describe() on ready links
			 * only; tcp's also describes one still connecting. */
			char what[512] = "";
			if (l != NULL && c->rank < peer && strcmp(ops->name, "tcp") == 0) {
				snprintf(what, sizeof(what), "; %s: ", ops->name);
				ops->describe(l, what + strlen(what), sizeof(what) - strlen(what));
			}
			kerr_set(err, KHOR_ERR_TIMEOUT, "timed out %s rank %d over %s (is it alive and "
			         "inside the same collective?)%s",
			         c->rank < peer ? "connecting to" : "waiting for a connection from", peer,
			         ops->name, what);
			err->peer = peer;
			return KHOR_ERR_TIMEOUT;
		}
		st = coll_progress(&owner->cc, kdeadline_left_ms(dl, 100), 1u << tpi, NULL, err);
		if (st != KHOR_SUCCESS)
			return st;
		if ((st = comm_check_abort(owner, err)) != KHOR_SUCCESS)
			return st;
	}
}

static khor_status comm_get_link(void *owner, int peer, kdeadline dl, tp_link **link_out,
                                 int *tp_out, kerr *err)
{
	khor_comm *cm = owner;
	kctx *c = cm->ctx;
	tp_link *l = atomic_load_explicit(&c->ready[peer], memory_order_acquire);
	khor_status st;

	if (l != NULL) {
		*link_out = l;
		*tp_out = c->link_tp[peer];
		return KHOR_SUCCESS;
	}
	pthread_mutex_lock(&c->link_mu);
	st = make_link(cm, peer, dl, link_out, tp_out, err);
	pthread_mutex_unlock(&c->link_mu);
	return st;
}

static khor_status comm_check_abort(void *owner, kerr *err)
{
	kctx *c = ((khor_comm *)owner)->ctx;
	void *v;
	size_t len;
	kerr e;

	if (c->store == NULL)
		return KHOR_SUCCESS;
	if (c->alive != NULL) { /* the heartbeat thread waits on the key for us */
		if (!atomic_load_explicit(&c->aborted, memory_order_acquire))
			return KHOR_SUCCESS;
		if (c->cfg.elastic)
			return kerr_set(err, KHOR_ERR_MEMBERSHIP, "generation %d of the elastic job "
			                "ended: %s", c->generation, c->abort_text);
		return kerr_set(err, KHOR_ERR_REMOTE, "the job was aborted by another rank: %s",
		                c->abort_text);
	}
	if (store_get(c->store, "abort", kdeadline_in_ms(0), &v, &len, &e) != KHOR_SUCCESS)
		return KHOR_SUCCESS; /* absent, or the store is gone: the links will tell */
	kerr_set(err, KHOR_ERR_REMOTE, "the job was aborted by another rank: %s", (char *)v);
	free(v);
	return KHOR_ERR_REMOTE;
}

/*
 * Elastic: the driver, not a rank, ends a generation and says why (it saw the process die
 * or stop). A rank that saw the loss first, as a closed link, waits up to a second for
 * that verdict so that every survivor reports the same root cause; without one, it
 * reports what it saw and asks the driver for a new generation.
 */
khor_status comm_elastic_verdict(kctx *x, kerr *e)
{
	kdeadline dl = kdeadline_in_ms(1000);
	char mine[KERR_TEXT_MAX];

	if (e->status == KHOR_ERR_MEMBERSHIP)
		return KHOR_ERR_MEMBERSHIP;
	kstrlcpy(mine, e->text, sizeof(mine));
	while (x->alive != NULL && !atomic_load_explicit(&x->aborted, memory_order_acquire) &&
	       !kdeadline_passed(dl)) {
		struct timespec ts = { 0, 2 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	int peer = e->peer;
	if (atomic_load_explicit(&x->aborted, memory_order_acquire))
		kerr_set(e, KHOR_ERR_MEMBERSHIP, "generation %d of the elastic job ended: %s "
		         "(seen here as: %s)", x->generation, x->abort_text, mine);
	else
		kerr_set(e, KHOR_ERR_MEMBERSHIP, "generation %d of the elastic job broke: %s",
		         x->generation, mine);
	e->peer = peer;
	return KHOR_ERR_MEMBERSHIP;
}

void comm_fail(khor_comm *c, const kerr *e)
{
	comm_fail_tell(c, e, e->status != KHOR_ERR_INVALID_ARG);
}

void comm_fail_tell(khor_comm *c, const kerr *e, bool tell)
{
	kctx *x = c->ctx;
	char text[KERR_TEXT_MAX];

	kerr verdict;

	if (x->cfg.elastic && tell && e->status != KHOR_ERR_MEMBERSHIP) {
		verdict = *e;
		comm_elastic_verdict(x, &verdict);
		e = &verdict;
	}
	pthread_mutex_lock(&c->mu);
	bool first = c->err.status == KHOR_SUCCESS;
	pthread_mutex_unlock(&c->mu);
	if (!first)
		return;
	kerr named;
	comm_name_error(c, e, &named);
	/* Told before it is kept: a rank that lost the race to be first keeps the winner's
	 * cause, with its own view after it (adopt_abort). */
	if (tell && job_may_tell(x, e)) {
		kerr adopted = *e;
		if (job_verdict(x, named.text, &adopted))
			comm_name_error(c, &adopted, &named);
	}
	pthread_mutex_lock(&c->mu);
	first = c->err.status == KHOR_SUCCESS;
	if (first)
		c->err = named;
	memcpy(text, named.text, sizeof(text));
	pthread_mutex_unlock(&c->mu);
	if (!first)
		return;
	KLOG_ERR("%s", text);
	if (x->cfg.elastic && tell)
		el_left(text);
}

void comm_name_error(const khor_comm *c, const kerr *e, kerr *out)
{
	out->status = e->status;
	out->peer = e->peer;
	/* Remote aborts already name the rank that failed; prefix ours in front of all. */
	snprintf(out->text, sizeof(out->text), "rank %d on %s, %s: %s", c->ctx->rank,
	         c->ctx->cfg.hostname, c->name, e->text);
}

void comm_set_last(khor_comm *c, const kerr *e)
{
	pthread_mutex_lock(&c->mu);
	c->last = *e;
	pthread_mutex_unlock(&c->mu);
}

void comm_finalize(khor_comm *c)
{
	if (c == NULL)
		return;
	kctx *x = c->ctx;
	if (c != x->world) {
		comm_destroy(c);
		return;
	}
	/* The comms made from this context and never freed go with it. */
	pthread_mutex_lock(&x->comms_mu);
	klist left;
	klist_move(&left, &x->comms);
	pthread_mutex_unlock(&x->comms_mu);
	klist *node, *tmp;
	KLIST_FOREACH_SAFE(node, tmp, &left) {
		klist_del(node);
		comm_destroy(KLIST_ENTRY(node, khor_comm, in_ctx));
	}
	comm_stop_worker(c);
	if (x->store != NULL) {
		kerr e;
		int64_t n;
		/* The rank serving the store keeps it up until every rank has left, bounded. */
		if (store_add(x->store, "finalized", 1, &n, &e) == KHOR_SUCCESS && x->server != NULL) {
			kdeadline dl = kdeadline_in_ms(c->err.status ? 2000 : x->cfg.timeout_ms);
			while (n < x->size && !kdeadline_passed(dl)) {
				struct timespec ts = { 0, 5 * 1000 * 1000 };
				nanosleep(&ts, NULL);
				if (store_add(x->store, "finalized", 0, &n, &e) != KHOR_SUCCESS)
					break;
			}
		}
	}
	if (x->cfg.elastic && atomic_load(&x->hosts_updated) != 0)
		el_left("the driver announced a change of hosts");
	comm_free_fields(c);
	ctx_destroy(x);
}

/* The extent in bytes of v-form counts and displacements (elements) of n ranks. */
static size_t extent(const size_t *counts, const size_t *displs, int n, size_t esz)
{
	size_t hi = 0;

	for (int q = 0; q < n; q++)
		if (counts[q] > 0 && displs[q] + counts[q] > hi)
			hi = displs[q] + counts[q];
	return hi * esz;
}

static void reg_add(coll_reg_call *rc, const void *buf, size_t len, uint64_t scope)
{
	uintptr_t lo = (uintptr_t)buf;

	if (buf == NULL || len == 0)
		return;
	/* In place, or send and receive buffers that meet: one registration for both. */
	for (int i = 0; i < rc->n; i++) {
		uintptr_t a = rc->buf[i].lo, b = a + rc->buf[i].len;
		if (lo <= b && a <= lo + len) {
			uintptr_t nlo = a < lo ? a : lo, nhi = b > lo + len ? b : lo + len;
			rc->buf[i].lo = nlo;
			rc->buf[i].len = nhi - nlo;
			return;
		}
	}
	rc->buf[rc->n].lo = lo;
	rc->buf[rc->n].len = len;
	rc->buf[rc->n].scope = scope;
	rc->n++;
}

void comm_reg_begin(khor_comm *c, const struct khor_request *r)
{
	coll_reg_call *rc = c->cc.reg_call;
	kctx *x = c->ctx;

	if (rc == NULL)
		return;
	rc->scope = atomic_fetch_add(&x->reg_scopes, 1) + 1;
	if (rc->scope == REGCACHE_ONESHOT) /* after 2^64 calls, but never mistake one */
		rc->scope = atomic_fetch_add(&x->reg_scopes, 2) + 2;
	rc->n = 0;
	const uint64_t user = r->reg_policy == REG_POLICY_KEEP ||
	                      (r->reg_policy == REG_POLICY_USER && x->cfg.reg_user)
	                      ? REGCACHE_KEEP : rc->scope;
	/*
	 * The bytes of the user's buffers this rank's schedules touch, no more: registering
	 * past the end of an allocation would fail (or pin a stranger's pages). Where a size is
	 * not known here, slices register on their own (coll.c), which is only slower.
	 */
	const size_t esz = kdtype_size(r->dtype), n = (size_t)c->size, bytes = r->count * esz;
	const bool root = r->root == c->rank;
	size_t off, len;
	switch (r->kind) {
	case COLL_ALLREDUCE:
		reg_add(rc, r->sendbuf, bytes, user);
		reg_add(rc, r->recvbuf, bytes, user);
		break;
	case COLL_REDUCE:
		reg_add(rc, r->sendbuf, bytes, user);
		if (root)
			reg_add(rc, r->recvbuf, bytes, user);
		break;
	case COLL_BROADCAST:
		reg_add(rc, r->recvbuf, bytes, user);
		break;
	case COLL_ALLGATHER:
		reg_add(rc, r->sendbuf, bytes, user);
		reg_add(rc, r->recvbuf, r->rcounts != NULL ? extent(r->rcounts, r->rdispls, c->size, esz)
		                                           : bytes * n, user);
		break;
	case COLL_REDUCESCATTER:
		coll_block(r->count, c->size, c->rank, &off, &len);
		reg_add(rc, r->sendbuf, bytes, user);
		reg_add(rc, r->recvbuf, len * esz, user);
		break;
	case COLL_ALLTOALL:
		if (r->scounts != NULL) {
			reg_add(rc, r->sendbuf, extent(r->scounts, r->sdispls, c->size, esz), user);
			reg_add(rc, r->recvbuf, extent(r->rcounts, r->rdispls, c->size, esz), user);
		} else {
			reg_add(rc, r->sendbuf, bytes * n, user);
			reg_add(rc, r->recvbuf, bytes * n, user);
		}
		break;
	case COLL_GATHER:
		reg_add(rc, r->sendbuf, bytes, user);
		if (root)
			reg_add(rc, r->recvbuf, bytes * n, user);
		break;
	case COLL_SCATTER:
		if (root)
			reg_add(rc, r->sendbuf, bytes * n, user);
		reg_add(rc, r->recvbuf, bytes, user);
		break;
	default:
		break;
	}
}

void comm_reg_end(khor_comm *c)
{
	coll_reg_call *rc = c->cc.reg_call;
	kctx *x = c->ctx;

	if (rc == NULL)
		return;
	for (int i = 0; i < x->ntps; i++)
		regcache_invalidate_scope(x->tps[i].cache, rc->scope);
	rc->scope = REGCACHE_ONESHOT;
	rc->n = 0;
}

void comm_reg_invalidate(kctx *x, const void *buf, size_t len)
{
	if (x == NULL || x->ncaches == 0 || buf == NULL)
		return;
	for (int i = 0; i < x->ntps; i++)
		regcache_invalidate(x->tps[i].cache, buf, len);
}
