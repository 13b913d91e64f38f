/*
 * batch.c -- starting ranks on one host while the job runs (see batch.h). job.ranks and
 * job.hosts grow here; nothing keeps a pointer into them across the loop's turns, so they
 * may move.
 */
#include "batch.h"

#include "output.h"
#include "say.h"
#include "spawn.h"
#include "ssh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more ranks and one more host; false when out of memory. */
static bool make_room(struct job *j, int n)
{
	if (j->nstarted + n > j->cap_ranks) {
		int cap = j->cap_ranks ? j->cap_ranks : 16;
		struct rank *r;

		while (cap < j->nstarted + n)
			cap *= 2;
		r = realloc(j->ranks, (size_t)cap * sizeof(*r));
		if (r == NULL)
			return false;
		memset(r + j->cap_ranks, 0, (size_t)(cap - j->cap_ranks) * sizeof(*r));
		j->ranks = r;
		j->cap_ranks = cap;
	}
	if (j->nhosts + 1 > j->cap_hosts) {
		int cap = j->cap_hosts ? 2 * j->cap_hosts : 8;
		struct host *h = realloc(j->hosts, (size_t)cap * sizeof(*h));

		if (h == NULL)
			return false;
		memset(h + j->cap_hosts, 0, (size_t)(cap - j->cap_hosts) * sizeof(*h));
		j->hosts = h;
		j->cap_hosts = cap;
	}
	return true;
}

int batch_start(struct job *j, const struct batch *b)
{
	int first = j->nstarted;
	struct host *h;

	if (!make_room(j, b->n)) {
		say("out of memory starting %d rank%s on %s", b->n, b->n == 1 ? "" : "s", b->host);
		return -1;
	}
	h = &j->hosts[j->nhosts];
	memset(h, 0, sizeof(*h));
	h->name = strdup(b->host);
	h->slots = b->n;
	h->first = first;
	h->n = b->n;
	h->local = b->here;
	h->ssh_pid = -1;
	h->to_fd = h->from_fd = h->err_fd = -1;
	if (h->name == NULL) {
		say("out of memory starting %d rank%s on %s", b->n, b->n == 1 ? "" : "s", b->host);
		return -1;
	}
	for (int i = 0; i < b->n; i++) {
		struct rank *rk = &j->ranks[first + i];
		const struct batch_rank *br = &b->r[i];

		memset(rk, 0, sizeof(*rk));
		rk->id = first + i;
		rk->rank = br->rank;
		rk->lrank = br->lrank;
		rk->lsize = br->lsize;
		rk->xrank = br->xrank;
		rk->xsize = br->xsize;
		rk->host = j->nhosts;
		/* Until it runs it counts as lost: a rank that never started did not exit 0. */
		rk->lost = true;
		rk->wstatus = 255 << 8;
		if (asprintf(&rk->worker, "%s:%d", b->host, br->slot) < 0) {
			rk->worker = NULL;
			say("out of memory starting %d rank%s on %s", b->n, b->n == 1 ? "" : "s",
			    b->host);
			return -1;
		}
		j->nstarted++;
		if (!output_init_rank(j, rk))
			return -1;
	}
	j->nhosts++;
	if (b->here) {
		spawn_all(j, b->path, b->fixed, b->nfixed, b->child_mask, NULL, first, b->n, NULL);
	} else {
		j->nremote++;
		if (!ssh_start(j, h, b->self_path, b->cwd, b->fixed, b->ncommon, b->child_mask))
			ssh_start_failed(j, h, 1);
	}
	for (int i = 0; i < b->n; i++) {
		if (j->ranks[first + i].running)
			j->ranks[first + i].lost = false;
	}
	return first;
}
