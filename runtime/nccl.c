/*
 * nccl.c -- collectives on CUDA device memory with NCCL inside each node and khor's own
 * schedules across nodes: Horovod's hierarchical allreduce with MPI replaced by khor.
 *
 * With L ranks on each of H hosts and q = count / L:
 *
 *   host A: a0 a1 | t        1. inside the node: ncclReduceScatter in place into recvbuf
 *   host B: b0 b1 | t           (local rank k holds shard [k q, (k+1) q) of its node's
 *                               sum), and ncclReduce of the tail [L q, count) to local
 *                               rank L-1, whose shard it continues
 *     a0 <-> b0              2. across nodes: khor's allreduce of each rank's shard on its
 *     a1+t <-> b1+t             cross group (the ranks of its local index, one per host),
 *                               rank L-1's shard and tail as one call
 *                            3. inside the node: ncclAllGather in place, and ncclBroadcast
 *                               of the tail from local rank L-1
 *
 * The tail goes with rank L-1's shard rather than as a second allreduce on every cross
 * group: two calls of one sequence number on one group would send frames with the same
 * tags, which the transports could match to the wrong call. avg sums throughout and
 * divides by the comm's size once, on the shard, so every rank holds the same bits. One
 * host is a single ncclAllReduce.
 *
 * Broadcast: khor's broadcast across hosts among the ranks of the root's local index, then
 * ncclBroadcast in every node from that rank. Allgather: ncclAllGather inside the node;
 * with several hosts (ranks numbered host by host) local rank 0 gathers the host regions
 * across hosts and ncclBroadcast spreads them in the node. Reduce-scatter: one host and
 * equal blocks only. Everything else is left to khor's own schedules.
 *
 * NCCL is loaded with dlopen (no link dependency); nccl.h only gives the types. The
 * communicator of a comm's node group is made on the first call that needs it: local rank
 * 0 makes the unique id and publishes it in the store, the others read it; init runs
 * nonblocking (config.blocking = 0) and is polled with a deadline, so a rank that never
 * comes is a timeout naming who waited, not a hang. Every NCCL call is enqueued on the
 * call's stream (c->mem.stream) and polled until it is enqueued (a nonblocking comm may
 * answer ncclInProgress); nothing here waits for the stream itself.
 */
#include "nccl.h"

#include "collectives/hier.h"

#include "base/dtype.h"
#include "base/log.h"
#include "collectives/algos.h"
#include "collectives/ring.h"
#include "collectives/select.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<nccl.h>)
/* nccl.h declares GroupStart() and friends without (void), which -Wstrict-prototypes
 * refuses when the header is not on a system include path. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#define KHOR_NCCL_HEADER 1
#endif
#endif

enum { NCCL_MODE_OFF = 0, NCCL_MODE_ON = 1, NCCL_MODE_AUTO = 2 };

#ifdef KHOR_NCCL_HEADER

/* ncclCommInitRankConfig and nonblocking communicators came with 2.14. */
#define NCCL_MIN_VERSION 21400

/* The functions used, resolved once per process; types from nccl.h, so they can't drift. */
static struct {
	void *h;
	int version;
	__typeof__(ncclGetVersion) *GetVersion;
	__typeof__(ncclGetUniqueId) *GetUniqueId;
	__typeof__(ncclCommInitRankConfig) *CommInitRankConfig;
	__typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
	__typeof__(ncclCommFinalize) *CommFinalize;
	__typeof__(ncclCommDestroy) *CommDestroy;
	__typeof__(ncclCommAbort) *CommAbort;
	__typeof__(ncclGetErrorString) *GetErrorString;
	__typeof__(ncclGetLastError) *GetLastError;
	__typeof__(ncclAllReduce) *AllReduce;
	__typeof__(ncclReduceScatter) *ReduceScatter;
	__typeof__(ncclAllGather) *AllGather;
	__typeof__(ncclBroadcast) *Broadcast;
	__typeof__(ncclReduce) *Reduce;
	__typeof__(ncclGroupStart) *GroupStart;
	__typeof__(ncclGroupEnd) *GroupEnd;
	char why[512]; /* when h == NULL */
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void lib_load(void)
{
	static const char *const names[] = { "libnccl.so.2", "libnccl.so" };
	const char *e = NULL;
	char first[256] = "";

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && lib.h == NULL; i++) {
		lib.h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (lib.h == NULL && i == 0 && (e = dlerror()) != NULL)
			kstrlcpy(first, e, sizeof(first));
	}
	if (lib.h == NULL) {
		snprintf(lib.why, sizeof(lib.why), "NCCL's library could not be loaded: %s (install "
		         "NCCL, or put the directory of libnccl.so.2 on LD_LIBRARY_PATH)",
		         first[0] ? first : "dlopen failed");
		return;
	}
	/* The header's prototypes fix each pointer's type; dlsym gives an object pointer. */
#define SYM(field, name)                                                                   \
	do {                                                                               \
		if ((*(void **)&lib.field = dlsym(lib.h, name)) == NULL) {                 \
			snprintf(lib.why, sizeof(lib.why), "NCCL's library has no %s: it is " \
			         "older than 2.14 or not NCCL", name);                          \
			goto fail;                                                         \
		}                                                                          \
	} while (0)
	SYM(GetVersion, "ncclGetVersion");
	SYM(GetUniqueId, "ncclGetUniqueId");
	SYM(CommInitRankConfig, "ncclCommInitRankConfig");
	SYM(CommGetAsyncError, "ncclCommGetAsyncError");
	SYM(CommFinalize, "ncclCommFinalize");
	SYM(CommDestroy, "ncclCommDestroy");
	SYM(CommAbort, "ncclCommAbort");
	SYM(GetErrorString, "ncclGetErrorString");
	SYM(GetLastError, "ncclGetLastError");
	SYM(AllReduce, "ncclAllReduce");
	SYM(ReduceScatter, "ncclReduceScatter");
	SYM(AllGather, "ncclAllGather");
	SYM(Broadcast, "ncclBroadcast");
	SYM(Reduce, "ncclReduce");
	SYM(GroupStart, "ncclGroupStart");
	SYM(GroupEnd, "ncclGroupEnd");
#undef SYM
	if (lib.GetVersion(&lib.version) != ncclSuccess || lib.version < NCCL_MIN_VERSION) {
		snprintf(lib.why, sizeof(lib.why), "NCCL's library is version %d; khor needs 2.14 "
		         "or later (nonblocking communicators)", lib.version);
		goto fail;
	}
	KLOG_DEBUG("NCCL %d.%d.%d loaded", lib.version / 10000, lib.version / 100 % 100,
	           lib.version % 100);
	return;
fail:
	dlclose(lib.h);
	lib.h = NULL;
}

bool nccl_available(char *why, size_t len)
{
	pthread_once(&lib_once, lib_load);
	if (lib.h == NULL && why != NULL)
		kstrlcpy(why, lib.why, len);
	return lib.h != NULL;
}

/* The node group's communicator, and what it was made for. */
typedef struct nccl_state {
	ncclComm_t comm;
	int device;         /* the CUDA device and context it was made on */
	void *ctx;
	unsigned instance;  /* communicators made for this comm so far, for unique store keys */
	char name[96];      /* config.commName, for NCCL's own log */
} nccl_state;

static bool nccl_dtype(khor_dtype d, ncclDataType_t *out)
{
	switch (d) {
	case KHOR_FLOAT32: *out = ncclFloat32; return true;
	case KHOR_FLOAT64: *out = ncclFloat64; return true;
	case KHOR_INT32: *out = ncclInt32; return true;
	case KHOR_INT64: *out = ncclInt64; return true;
	case KHOR_FLOAT16: *out = ncclFloat16; return true;
	case KHOR_BFLOAT16: *out = ncclBfloat16; return true;
	case KHOR_INT8: *out = ncclInt8; return true;
	case KHOR_UINT8: *out = ncclUint8; return true;
	default: return false; /* bool, int16: NCCL has no such type */
	}
}

/* avg is a sum here: khor divides once, with its own kernel, so the bits are khor's. */
static ncclRedOp_t nccl_op(khor_op op)
{
	switch (op) {
	case KHOR_MIN: return ncclMin;
	case KHOR_MAX: return ncclMax;
	case KHOR_PROD: return ncclProd;
	default: return ncclSum;
	}
}

static khor_status status_of(ncclResult_t rc)
{
	switch (rc) {
	case ncclInvalidArgument: case ncclInvalidUsage: return KHOR_ERR_INVALID_ARG;
	case ncclRemoteError: return KHOR_ERR_REMOTE;
	case ncclInternalError: return KHOR_ERR_INTERNAL;
	default: return KHOR_ERR_SYSTEM;
	}
}

/*
 * After an error the communicator is aborted at once: the comm's error is sticky, so it
 * runs nothing more, and an abort frees kernels that still wait for a peer, which a
 * destroy would wait for.
 */
static void nccl_abort(khor_comm *c)
{
	nccl_state *s = c->nccl;

	if (s == NULL || s->comm == NULL)
		return;
	(void)lib.CommAbort(s->comm);
	s->comm = NULL;
}

/* The error of a failed NCCL step, with NCCL's code and its last message. */
static khor_status nccl_fail(khor_comm *c, ncclComm_t comm, ncclResult_t rc, const char *what,
                             kerr *err)
{
	const char *last = lib.GetLastError(comm);

	/* NCCL's own strings already say "run with NCCL_DEBUG=INFO for details". */
	kerr_set(err, status_of(rc), "NCCL %s on local rank %d of %d (host %s) failed: %s%s%s "
	         "(KHOR_NCCL=off runs khor's own schedules instead)", what, c->node_me, c->node_n,
	         c->ctx->cfg.hostname, lib.GetErrorString(rc), last != NULL && *last ? ": " : "",
	         last != NULL ? last : "");
	nccl_abort(c);
	return err->status;
}

/* Sleeps a little between polls: spins first, since an enqueue takes microseconds. */
static void poll_nap(unsigned i)
{
	const struct timespec nap = { 0, i < 1000 ? 20000 : 1000000 };

	if (i < 64)
		sched_yield();
	else
		nanosleep(&nap, NULL);
}

/*
 * Waits until comm is no longer busy with what returned rc (a nonblocking comm answers
 * ncclInProgress while it works in the background), up to dl, checking once a second
 * whether another rank has failed the job. Then reports any asynchronous error.
 */
static khor_status nccl_wait(khor_comm *c, ncclComm_t comm, ncclResult_t rc, kdeadline dl,
                             const char *what, kerr *err)
{
	uint64_t last_check = kclock_ns();

	for (unsigned i = 0; rc == ncclInProgress; i++) {
		ncclResult_t q = lib.CommGetAsyncError(comm, &rc);
		if (q != ncclSuccess)
			rc = q;
		if (rc != ncclInProgress)
			break;
		if (kdeadline_passed(dl)) {
			kerr_set(err, KHOR_ERR_TIMEOUT, "NCCL %s on local rank %d of %d (host %s) timed "
			         "out: a rank of this node is not in the call, or NCCL is stuck "
			         "(NCCL_DEBUG=INFO shows where)", what, c->node_me, c->node_n,
			         c->ctx->cfg.hostname);
			nccl_abort(c);
			return KHOR_ERR_TIMEOUT;
		}
		if (kclock_ns() - last_check > 1000000000ull) {
			khor_status st = c->cc.check_abort(c->cc.owner, err);
			if (st != KHOR_SUCCESS) {
				nccl_abort(c);
				return st;
			}
			last_check = kclock_ns();
		}
		poll_nap(i);
	}
	if (rc == ncclSuccess) {
		ncclResult_t q = lib.CommGetAsyncError(comm, &rc);
		if (q != ncclSuccess)
			rc = q;
		if (rc == ncclInProgress)
			rc = ncclSuccess; /* an earlier group still finishing: stream-ordered anyway */
	}
	return rc == ncclSuccess ? KHOR_SUCCESS : nccl_fail(c, comm, rc, what, err);
}

static khor_status enqueued(khor_comm *c, ncclResult_t rc, const char *what, kerr *err)
{
	nccl_state *s = c->nccl;
	return nccl_wait(c, s->comm, rc, kdeadline_in_ms(c->cc.timeout_ms), what, err);
}

/* Destroys s->comm: finalized and destroyed when healthy, aborted after an error. */
static void comm_release_nccl(nccl_state *s, bool failed)
{
	if (s->comm == NULL)
		return;
	if (!failed) {
		ncclResult_t rc = lib.CommFinalize(s->comm);
		kdeadline dl = kdeadline_in_ms(5000);
		for (unsigned i = 0; rc == ncclInProgress && !kdeadline_passed(dl); i++) {
			ncclResult_t q = lib.CommGetAsyncError(s->comm, &rc);
			if (q != ncclSuccess)
				rc = q;
			poll_nap(i);
		}
		if (rc == ncclSuccess && lib.CommDestroy(s->comm) == ncclSuccess) {
			s->comm = NULL;
			return;
		}
		KLOG_WARN("NCCL communicator %s: finalize failed (%s): aborting it", s->name,
		          lib.GetErrorString(rc));
	}
	(void)lib.CommAbort(s->comm);
	s->comm = NULL;
}

/*
 * Makes the node group's communicator on where's device. Local rank 0 publishes the unique
 * id under a key of this comm, its node and the instance; a failure there is published in
 * its place ("!" and the reason, never an id's length), so the others report it instead of
 * timing out.
 */
static khor_status comm_init_nccl(khor_comm *c, nccl_state *s, const kmem_where *where,
                                  kerr *err)
{
	const int L = c->node_n, me = c->node_me;
	kdeadline dl = kdeadline_in_ms(c->ctx->cfg.init_timeout_ms);
	ncclUniqueId id;
	char key[96];
	khor_status st;
	ncclResult_t rc;
	uint64_t t0 = kclock_ns();

	snprintf(key, sizeof(key), "nccl/%u/%d/%u", c->id, c->node_map[0], s->instance++);
	snprintf(s->name, sizeof(s->name), "khor comm %u node of world rank %d", c->id,
	         c->node_map[0]);
	if (me == 0) {
		rc = lib.GetUniqueId(&id);
		if (rc != ncclSuccess) {
			st = nccl_fail(c, NULL, rc, "ncclGetUniqueId", err);
			if (L > 1) {
				char msg[KERR_TEXT_MAX + 1];
				kerr ignore;
				snprintf(msg, sizeof(msg), "!%s", err->text);
				if (strlen(msg) == sizeof(id)) /* an id's length: it must not pass as one */
					msg[sizeof(id) - 1] = '\0';
				(void)store_set(c->ctx->store, key, msg, strlen(msg), &ignore);
			}
			return st;
		}
		if (L > 1 && (st = store_set(c->ctx->store, key, &id, sizeof(id), err)) != KHOR_SUCCESS) {
			kerr_prefix(err, "publishing NCCL's unique id for this node");
			return st;
		}
	} else {
		void *v = NULL;
		size_t len = 0;
		/* In slices, so that a job another rank has failed ends this wait too. */
		for (;;) {
			kdeadline slice = kdeadline_in_ms(1000);
			if (dl.at_ns < slice.at_ns)
				slice = dl;
			st = store_get(c->ctx->store, key, slice, &v, &len, err);
			if (st != KHOR_ERR_TIMEOUT)
				break;
			if (kdeadline_passed(dl)) {
				kerr_set(err, KHOR_ERR_TIMEOUT, "local rank %d of %d (host %s): waited "
				         "for local rank 0 (world rank %d) to publish NCCL's unique id "
				         "(KHOR_INIT_TIMEOUT): is that rank in this call, on device memory "
				         "too?", me, L, c->ctx->cfg.hostname, c->node_map[0]);
				err->peer = c->node_map[0];
				return KHOR_ERR_TIMEOUT;
			}
			if ((st = c->cc.check_abort(c->cc.owner, err)) != KHOR_SUCCESS)
				return st;
		}
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "reading NCCL's unique id for this node");
			return st;
		}
		if (len != sizeof(id) && len > 0 && ((char *)v)[0] == '!') {
			st = kerr_set(err, KHOR_ERR_REMOTE, "local rank 0 (world rank %d) could not "
			              "start NCCL: %s", c->node_map[0], (char *)v + 1);
			free(v);
			return st;
		}
		if (len != sizeof(id)) {
			free(v);
			return kerr_set(err, KHOR_ERR_PROTOCOL, "NCCL's unique id in the store under "
			                "%s is %zu bytes, not %zu", key, len, sizeof(id));
		}
		memcpy(&id, v, sizeof(id));
		free(v);
	}
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	cfg.commName = s->name;
	s->comm = NULL;
	rc = lib.CommInitRankConfig(&s->comm, L, id, me, &cfg);
	if (s->comm == NULL && rc != ncclSuccess)
		return nccl_fail(c, NULL, rc, "communicator init (ncclCommInitRankConfig)", err);
	st = nccl_wait(c, s->comm, rc, dl, "communicator init (ncclCommInitRankConfig)", err);
	if (st != KHOR_SUCCESS)
		return st; /* nccl_wait aborted the communicator */
	s->device = where->device;
	s->ctx = where->ctx;
	KLOG_INFO("NCCL %d.%d.%d: communicator of %d local ranks on host %s (this is local rank "
	          "%d, device %d) ready in %.0f ms", lib.version / 10000, lib.version / 100 % 100,
	          lib.version % 100, L, c->ctx->cfg.hostname, me, where->device,
	          (double)(kclock_ns() - t0) * 1e-6);
	return KHOR_SUCCESS;
}

/* The node communicator for a call on where's device, made (or remade) when needed. */
static khor_status get_comm(khor_comm *c, const kmem_where *where, kerr *err)
{
	nccl_state *s = c->nccl;

	if (s == NULL) {
		s = calloc(1, sizeof(*s));
		if (s == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory for NCCL's state");
		c->nccl = s;
		c->nccl_free = nccl_comm_free;
	}
	if (s->comm != NULL && (s->device != where->device || s->ctx != where->ctx))
		comm_release_nccl(s, false); /* the buffers moved to another device: every rank's did */
	if (s->comm != NULL)
		return KHOR_SUCCESS;
	return comm_init_nccl(c, s, where, err);
}

static khor_status run_allreduce(khor_comm *c, struct khor_request *r, ncclDataType_t t,
                                 kerr *err)
{
	nccl_state *s = c->nccl;
	void *stream = c->mem.stream;
	const int L = c->node_n, H = c->nhosts, k = c->node_me;
	const size_t esz = kdtype_size(r->dtype), n = r->count;
	const ncclRedOp_t op = nccl_op(r->op);
	const khor_op inner = r->op == KHOR_AVG ? KHOR_SUM : r->op;
	const char *in = r->sendbuf;
	char *out = r->recvbuf;
	khor_status st;

	if (H == 1) {
		c->last_sched = "nccl";
		st = enqueued(c, lib.AllReduce(in, out, n, t, op, s->comm, stream), "allreduce", err);
		if (st == KHOR_SUCCESS && r->op == KHOR_AVG)
			st = coll_avg_finish(&c->node_cc, out, n, r->dtype, c->size, err);
		return st;
	}
	c->last_sched = "nccl hierarchical";
	const size_t q = n / (size_t)L, tail = n - q * (size_t)L;
	const size_t off = (size_t)k * q, len = q + (k == L - 1 ? tail : 0);
	ncclResult_t rc = lib.GroupStart();
	if (rc == ncclSuccess && q > 0)
		rc = lib.ReduceScatter(in, out + off * esz, q, t, op, s->comm, stream);
	if (rc == ncclSuccess && tail > 0)
		rc = lib.Reduce(in + q * (size_t)L * esz, out + q * (size_t)L * esz, tail, t, op,
		                L - 1, s->comm, stream);
	ncclResult_t end = lib.GroupEnd();
	if ((st = enqueued(c, rc != ncclSuccess ? rc : end, "reduce-scatter inside the node",
	                   err)) != KHOR_SUCCESS)
		return st;
	if (len > 0) {
		st = hier_group_allreduce(&c->cross_cc, out + off * esz, len, r->dtype, inner, r->seq,
		                          err);
		if (st == KHOR_SUCCESS && r->op == KHOR_AVG)
			st = coll_avg_finish(&c->cross_cc, out + off * esz, len, r->dtype, c->size, err);
		if (st != KHOR_SUCCESS) {
			/* The node's other ranks may wait in NCCL for this one: free their kernels. */
			nccl_abort(c);
			kerr_prefix(err, "across hosts (elements %zu-%zu)", off, off + len);
			return st;
		}
	}
	rc = lib.GroupStart();
	if (rc == ncclSuccess && q > 0)
		rc = lib.AllGather(out + off * esz, out, q, t, s->comm, stream);
	if (rc == ncclSuccess && tail > 0)
		rc = lib.Broadcast(out + q * (size_t)L * esz, out + q * (size_t)L * esz, tail, t,
		                   L - 1, s->comm, stream);
	end = lib.GroupEnd();
	return enqueued(c, rc != ncclSuccess ? rc : end, "allgather inside the node", err);
}

static khor_status run_broadcast(khor_comm *c, struct khor_request *r, kerr *err)
{
	nccl_state *s = c->nccl;
	const size_t bytes = r->count * kdtype_size(r->dtype);
	coll_comm *g = &c->cross_cc;
	int host, local;
	khor_status st = KHOR_SUCCESS;

	comm_root_position(c, r->root, &host, &local);
	if (c->nhosts > 1 && c->node_me == local) {
		bool binomial = c->ctx->cfg.rd_max_set
		                ? bytes <= g->rd_max_bytes
		                : cost_pick_broadcast(&g->model, g->size, bytes, g->slice_bytes) ==
		                  BCAST_BINOMIAL;
		st = binomial ? binomial_broadcast(g, r->recvbuf, r->count, r->dtype, host, r->seq, err)
		              : chain_broadcast(g, r->recvbuf, r->count, r->dtype, host, r->seq, err);
		if (st != KHOR_SUCCESS) {
			nccl_abort(c); /* the node's other ranks may wait in NCCL for this one */
			kerr_prefix(err, "across hosts");
			return st;
		}
	}
	return enqueued(c, lib.Broadcast(r->recvbuf, r->recvbuf, bytes, ncclUint8, local, s->comm,
	                                 c->mem.stream), "broadcast inside the node", err);
}

/* Equal blocks; one host, or ranks numbered host by host (checked by the caller). */
static khor_status run_allgather(khor_comm *c, struct khor_request *r, kerr *err)
{
	nccl_state *s = c->nccl;
	const int L = c->node_n, H = c->nhosts;
	const size_t bytes = r->count * kdtype_size(r->dtype);
	char *out = r->recvbuf, *region = out + (size_t)c->cross_me * (size_t)L * bytes;
	char *mine = out + (size_t)c->rank * bytes; /* = region + node_me * bytes: blocked */
	khor_status st;

	/* In place is the one overlap NCCL takes: put this rank's block there first (a copy
	 * on the stream, nothing when the caller already has). */
	if ((st = coll_copy(&c->node_cc, mine, r->sendbuf, bytes, err)) != KHOR_SUCCESS)
		return st;
	st = enqueued(c, lib.AllGather(mine, region, bytes, ncclUint8, s->comm, c->mem.stream),
	              "allgather inside the node", err);
	if (st != KHOR_SUCCESS || H == 1)
		return st;
	if (c->node_me == 0) {
		size_t *a = malloc(2 * (size_t)H * sizeof(size_t));
		if (a == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "allgather seq %u (nccl): out of memory",
			                r->seq);
		for (int h = 0; h < H; h++) {
			a[h] = (size_t)L * r->count;
			a[H + h] = (size_t)h * (size_t)L * r->count;
		}
		st = ring_allgatherv(&c->cross_cc, region, out, a, a + H, r->dtype, r->seq, err);
		free(a);
		if (st != KHOR_SUCCESS) {
			nccl_abort(c); /* the node's other ranks may wait in NCCL for this one */
			kerr_prefix(err, "across hosts");
			return st;
		}
	}
	return enqueued(c, lib.Broadcast(out, out, bytes * (size_t)c->size, ncclUint8, 0, s->comm,
	                                 c->mem.stream), "broadcast inside the node", err);
}

/* Whether ranges [a, a + alen) and [b, b + blen) share a byte. */
static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
	const char *x = a, *y = b;
	return alen > 0 && blen > 0 && x < y + blen && y < x + alen;
}

/* One host, count a multiple of the ranks (checked by the caller). */
static khor_status run_reduce_scatter(khor_comm *c, struct khor_request *r, ncclDataType_t t,
                                      kerr *err)
{
	nccl_state *s = c->nccl;
	const size_t esz = kdtype_size(r->dtype), q = r->count / (size_t)c->size;
	const void *in = r->sendbuf;
	khor_status st;

	/* NCCL takes in place (recvbuf at this rank's block of sendbuf) or no overlap at all:
	 * any other overlap goes from a copy of the input. */
	if (r->recvbuf != (const char *)in + (size_t)c->rank * q * esz &&
	    overlaps(in, r->count * esz, r->recvbuf, q * esz)) {
		void *tmp = coll_tmp(&c->node_cc, r->count * esz);
		if (tmp == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "reduce_scatter seq %u (nccl): no "
			                "device memory for a copy of the input", r->seq);
		if ((st = coll_copy(&c->node_cc, tmp, in, r->count * esz, err)) != KHOR_SUCCESS)
			return st;
		in = tmp;
	}
	st = enqueued(c, lib.ReduceScatter(in, r->recvbuf, q, t, nccl_op(r->op), s->comm,
	                                   c->mem.stream), "reduce-scatter", err);
	if (st == KHOR_SUCCESS && r->op == KHOR_AVG)
		st = coll_avg_finish(&c->node_cc, r->recvbuf, q, r->dtype, c->size, err);
	return st;
}

static khor_status run_plan(khor_comm *c, struct khor_request *r, ncclDataType_t t, kerr *err)
{
	switch (r->kind) {
	case COLL_ALLREDUCE:
		return run_allreduce(c, r, t, err);
	case COLL_BROADCAST:
		return run_broadcast(c, r, err);
	case COLL_ALLGATHER:
		return run_allgather(c, r, err);
	default:
		return run_reduce_scatter(c, r, t, err);
	}
}

void nccl_comm_free(khor_comm *c)
{
	nccl_state *s = c->nccl;

	if (s == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	bool failed = c->err.status != KHOR_SUCCESS;
	pthread_mutex_unlock(&c->mu);
	comm_release_nccl(s, failed);
	free(s);
	c->nccl = NULL;
}

void nccl_comm_abort(khor_comm *c)
{
	nccl_abort(c);
}

#else /* no nccl.h at build time */

typedef int ncclDataType_t;

bool nccl_available(char *why, size_t len)
{
	if (why != NULL)
		kstrlcpy(why, "this libkhor was built without NCCL's header nccl.h (install NCCL's "
		          "development files where CMake finds them and rebuild)", len);
	return false;
}

static bool nccl_dtype(khor_dtype d, ncclDataType_t *out)
{
	*out = 0;
	return d != KHOR_BOOL && d != KHOR_INT16;
}

void nccl_comm_free(khor_comm *c)
{
	c->nccl = NULL;
}

void nccl_comm_abort(khor_comm *c)
{
	(void)c;
}

#endif

/*
 * Whether this call has an NCCL plan at all, whatever its memory: a collective and a form
 * the code above runs. Every rank answers alike (count, form and topology are the comm's).
 */
static bool has_plan(const khor_comm *c, const struct khor_request *r, bool blocked)
{
	switch (r->kind) {
	case COLL_ALLREDUCE:
	case COLL_BROADCAST:
		return true;
	/*
	 * Not the buffers' addresses: each rank has its own, and a plan chosen from them could
	 * differ between ranks. Overlaps NCCL can't take are moved out of its way instead
	 * (run_allgather, run_reduce_scatter).
	 */
	case COLL_ALLGATHER:
		return r->rcounts == NULL && (c->nhosts == 1 || blocked);
	case COLL_REDUCESCATTER:
		/* khor's blocks differ in length where the count doesn't divide: NCCL's are equal */
		return c->nhosts == 1 && r->count % (size_t)c->size == 0;
	default:
		return false;
	}
}

khor_status nccl_run(khor_comm *c, struct khor_request *r, const kmem_where *where,
                     bool *handled, kerr *err)
{
	const int mode = c->ctx->cfg.nccl;
	const bool reduces = r->kind == COLL_ALLREDUCE || r->kind == COLL_REDUCESCATTER;
	const char *name = r->kind == COLL_ALLREDUCE ? "allreduce"
	                   : r->kind == COLL_BROADCAST ? "broadcast"
	                   : r->kind == COLL_ALLGATHER ? "allgather" : "reduce_scatter";
	char why[512], desc[64];
	ncclDataType_t t = (ncclDataType_t)0;

	*handled = false;
	if (mode == NCCL_MODE_OFF || c->size == 1 || r->count == 0)
		return KHOR_SUCCESS;
	/*
	 * Hosts with unequal rank counts have no cross groups to run the middle step on: leave
	 * the call to khor rather than guess (every rank sees the same topology).
	 */
	const bool uniform = c->cross_n == c->nhosts && c->node_n * c->nhosts == c->size;
	if (!uniform)
		return KHOR_SUCCESS;
	bool blocked = true;
	for (int i = 0; i < c->size && blocked; i++)
		blocked = c->host_ranks[i] == i;
	if (!has_plan(c, r, blocked))
		return KHOR_SUCCESS;
	if (where->kind != KMEM_DEVICE || where->be == NULL || strcmp(where->be->name, "cuda") != 0) {
		if (mode == NCCL_MODE_AUTO)
			return KHOR_SUCCESS;
		*handled = true;
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s seq %u: KHOR_NCCL=on: NCCL needs CUDA "
		                "device memory, and this call's buffers are %s (set KHOR_NCCL=auto to "
		                "run khor's own schedules on them)", name, r->seq,
		                kmem_describe(where, desc, sizeof(desc)));
	}
	if (reduces && !nccl_dtype(r->dtype, &t)) {
		if (mode == NCCL_MODE_AUTO)
			return KHOR_SUCCESS;
		*handled = true;
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s seq %u: KHOR_NCCL=on: NCCL has no %s "
		                "type, so it can't reduce this call (KHOR_NCCL=auto runs khor's own "
		                "kernels for it)", name, r->seq, kdtype_name(r->dtype));
	}
	/*
	 * NCCL's float min and max drop a NaN (fminf/fmaxf); khor's propagate it, as
	 * torch.minimum does. The result must not depend on whether NCCL ran, so these stay on
	 * khor's kernels, with KHOR_NCCL=on too (said once).
	 */
	const bool floating = r->dtype == KHOR_FLOAT32 || r->dtype == KHOR_FLOAT64 ||
	                      r->dtype == KHOR_FLOAT16 || r->dtype == KHOR_BFLOAT16;
	if (reduces && floating && (r->op == KHOR_MIN || r->op == KHOR_MAX)) {
		static _Atomic int said_nan;
		if (mode == NCCL_MODE_ON && said_nan++ == 0)
			KLOG_INFO("KHOR_NCCL=on: float min and max run khor's own kernels, which keep "
			          "NaN as the CPU path does (NCCL's drop it)");
		return KHOR_SUCCESS;
	}
	if (mode == NCCL_MODE_AUTO && c->node_n < 2)
		return KHOR_SUCCESS; /* one rank per node: nothing for NCCL to do that khor can't */
	if (!nccl_available(why, sizeof(why))) {
		if (mode == NCCL_MODE_AUTO) {
			static _Atomic int said;
			if (said++ == 0)
				KLOG_INFO("KHOR_NCCL=auto: device collectives use khor's own schedules: %s",
				          why);
			return KHOR_SUCCESS;
		}
		*handled = true;
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s seq %u: KHOR_NCCL=on: %s", name,
		                r->seq, why);
	}
	*handled = true;
#ifdef KHOR_NCCL_HEADER
	khor_status st = get_comm(c, where, err);
	if (st == KHOR_SUCCESS)
		st = run_plan(c, r, t, err);
	if (st != KHOR_SUCCESS && strstr(err->text, " (nccl)") == NULL)
		kerr_prefix(err, "%s seq %u (nccl)", name, r->seq);
	return st;
#else
	(void)t;
	return kerr_set(err, KHOR_ERR_INTERNAL, "NCCL reported available without nccl.h");
#endif
}
