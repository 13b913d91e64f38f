/*
 * fusion.c -- fusion (Horovod's fusion buffer manager and its grouping of responses): the
 * allreduce tensors of a cycle are grouped by (dtype, op, prescale, postscale, memory) in
 * order of first appearance, and each group is cut into runs of at most the fusion
 * threshold; a run of several tensors is copied into the fusion buffer, reduced as one
 * allreduce and copied back out (execute.c). Every rank computes the same plan from the
 * same responses and the same threshold (autotune changes it only through a response).
 *
 *   cycle's allreduces:  a(f32) b(f32) c(f64) d(f32) ...
 *   classes:             [a b d ...](f32 sum)  [c](f64 sum)
 *   runs (threshold T):  [a b] [d ...]          [c]
 *
 * The buffers, one for host memory and one on the device of the set's stream, only grow.
 */
#include "fusion.h"

#include "base/dtype.h"

#include <stdlib.h>
#include <string.h>

static kdeadline comm_deadline(const eset *s)
{
	return kdeadline_in_ms(s->data->cc.timeout_ms);
}

/* The host fusion buffer, grown to at least len bytes. */
static void *fusion(eset *s, size_t len)
{
	if (s->fusion_len < len) {
		void *p = malloc(len);
		if (p == NULL)
			return NULL;
		comm_reg_invalidate(s->data->ctx, s->fusion, s->fusion_len);
		free(s->fusion);
		s->fusion = p;
		s->fusion_len = len;
	}
	return s->fusion;
}

/*
 * The fusion buffer of the run's memory, grown to at least len bytes; NULL when it cannot
 * be had (for device memory, with the backend's reason in err). Growing the device one
 * waits for its stream first: work queued on the old buffer must have run before it goes.
 */
void *fusion_buffer(eset *s, edev *d, size_t len, kerr *err)
{
	void *p;

	if (d == NULL)
		return fusion(s, len);
	if (d->fusion_len >= len && d->fusion != NULL)
		return d->fusion;
	if (d->fusion != NULL) {
		if (kmem_stream_sync(d->be, d->stream, comm_deadline(s), "growing the engine's "
		                     "device fusion buffer", err) != KHOR_SUCCESS)
			return NULL;
		comm_reg_invalidate(s->data->ctx, d->fusion, d->fusion_len);
		d->be->dev_free(d->fusion);
		d->fusion = NULL;
		d->fusion_len = 0;
	}
	if (d->be->dev_alloc(len, &p, err) != KHOR_SUCCESS)
		return NULL;
	d->fusion = p;
	d->fusion_len = len;
	return p;
}

static bool same_class(const piece *a, const piece *b)
{
	const kmem_where *x = a->dev, *y = b->dev;

	return a->it->t[a->ti].dtype == b->it->t[b->ti].dtype && a->it->op == b->it->op &&
	       a->it->prescale == b->it->prescale && a->it->postscale == b->it->postscale &&
	       (x == NULL ? y == NULL
	                  : y != NULL && x->be == y->be && x->ctx == y->ctx && x->device == y->device);
}

static size_t piece_bytes(const piece *p)
{
	const etensor *t = &p->it->t[p->ti];
	return t->count * kdtype_size(t->dtype);
}

/*
 * Tensors of this size or more never go through the fusion buffer: copying them in and
 * out costs more than the call it saves. Measured with khor-bench step on ResNet-50's
 * gradients (2 ranks, shm): with every tensor fused up to 64 MiB the step took 3.0x one
 * flat allreduce of the same bytes, the copies (2 x 102 MB) being most of the difference.
 */
#define ENG_FUSE_MAX (1u << 20)

void fusion_release(eset *s)
{
	if (s->data != NULL)
		comm_reg_invalidate(s->data->ctx, s->fusion, s->fusion_len);
	free(s->fusion);
	s->fusion = NULL;
	s->fusion_len = 0;
}

void fusion_plan_free(fusion_plan *p)
{
	free(p->pieces);
	free(p->start);
	memset(p, 0, sizeof(*p));
}

bool fusion_plan_make(eitem *items, int n, uint64_t threshold, const kmem_where *ghost_dev,
                      fusion_plan *out)
{
	int np = 0;
	bool ok = true;

	memset(out, 0, sizeof(*out));
	for (int i = 0; i < n; i++)
		if (!items[i].error && items[i].kind == EK_ALLREDUCE)
			np += items[i].n;
	piece *p = np > 0 ? malloc(sizeof(*p) * (size_t)np) : NULL;
	piece *run_p = np > 0 ? malloc(sizeof(*run_p) * (size_t)np) : NULL;
	if (np > 0 && (p == NULL || run_p == NULL)) {
		free(p);
		free(run_p);
		return false;
	}
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (items[i].error || items[i].kind != EK_ALLREDUCE)
			continue;
		for (int t = 0; t < items[i].n; t++) {
			const etensor *te = &items[i].t[t];
			const kmem_where *dev = te->mem.kind == KMEM_DEVICE ? &te->mem : NULL;
			p[k++] = (piece){ &items[i], t, items[i].h != NULL ? dev : ghost_dev };
		}
	}
	/*
	 * The plan, in one pass: each class keeps one open run; a piece that does not fit its
	 * class's run closes it and opens the next. Runs execute in the order they were opened.
	 * Big pieces, and every piece without fusion, are runs of their own.
	 */
	int nruns = 0, ncls = 0;
	int *open_run = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));  /* class -> run */
	int *cls_first = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1)); /* class -> piece */
	int *run_of = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));    /* piece -> run */
	size_t *run_bytes = malloc(sizeof(size_t) * (size_t)(np > 0 ? np : 1));
	int *run_n = calloc((size_t)(np > 0 ? np : 1), sizeof(int));
	int *pos = NULL;
	if (open_run == NULL || cls_first == NULL || run_of == NULL || run_bytes == NULL ||
	    run_n == NULL) {
		ok = false;
		goto out;
	}
	for (int a = 0; a < np; a++) {
		size_t tb = piece_bytes(&p[a]);
		int c = 0;
		while (c < ncls && !same_class(&p[cls_first[c]], &p[a]))
			c++;
		if (c == ncls) {
			cls_first[ncls++] = a;
			open_run[c] = -1;
		}
		int r = open_run[c];
		bool fits = r >= 0 && threshold > 0 && tb < ENG_FUSE_MAX &&
		            run_bytes[r] < ENG_FUSE_MAX && run_bytes[r] + tb <= threshold;
		if (!fits) {
			r = nruns++;
			run_bytes[r] = 0;
			open_run[c] = tb < ENG_FUSE_MAX && threshold > 0 ? r : -1;
		}
		run_of[a] = r;
		run_bytes[r] += tb;
		run_n[r]++;
	}
	/* Pieces grouped by run, in piece order within a run (a counting sort). */
	pos = calloc((size_t)nruns + 1, sizeof(int));
	if (pos == NULL) {
		ok = false;
		goto out;
	}
	for (int r = 0; r < nruns; r++) {
		pos[r + 1] = pos[r] + run_n[r];
		run_n[r] = pos[r]; /* now: where the run's next piece goes */
	}
	for (int a = 0; a < np; a++)
		run_p[run_n[run_of[a]]++] = p[a];
	out->pieces = run_p;
	out->start = pos;
	out->nruns = nruns;
	run_p = NULL;
	pos = NULL;
out:
	free(pos);
	free(open_run);
	free(cls_first);
	free(run_of);
	free(run_bytes);
	free(run_n);
	free(p);
	free(run_p);
	return ok;
}
