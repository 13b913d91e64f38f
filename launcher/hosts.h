/*
 * hosts.h -- where the ranks run: the hosts as given (-H, --hostfile: hostlist.c; a Slurm
 * allocation: slurm.c) and the placement of the ranks on them (place.c). Errors are said on
 * stderr by whoever finds them, with where the bad text came from (-H, FILE:LINE, a Slurm
 * variable); the functions return false (or an exit status) after saying it.
 */
#ifndef KHOR_LAUNCHER_HOSTS_H
#define KHOR_LAUNCHER_HOSTS_H

#include "job.h"

/* The hosts as given, before placement (only name, slots and local are set). */
struct hostlist {
	struct host *h;
	int n, cap;
	/* h's positions + 1 by name, open addressing (hostlist_add's merge: a Slurm list of
	 * 65536 nodes took minutes to compare each name with all before it). */
	int *index;
	size_t index_cap;
};

void hostlist_free(struct hostlist *l);
/* Adds slots to host `name` (len bytes), merging a name given twice as mpirun does. */
bool hostlist_add(struct hostlist *l, const char *name, size_t len, int slots);
/* -H a:2,b:2 (each -H given adds its hosts). */
bool hostlist_parse_arg(const char *arg, struct hostlist *l);
/*
 * A hostfile: "HOST slots=N" (mpirun's form; max_slots=M is accepted and ignored),
 * "HOST:N" (horovodrun's) or "HOST" for one slot; '#' starts a comment.
 */
bool hostlist_parse_file(const char *path, struct hostlist *l);

/*
 * The allocation's hosts and slots: SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE ("2(x3),1"
 * is 2, 2, 2, 1), else SLURM_JOB_CPUS_PER_NODE in the same form. Returns false with
 * nothing said when there is no allocation, or with the reason said when it is malformed
 * (*bad_out set).
 */
bool slurm_hosts(struct hostlist *l, bool *bad_out);

/*
 * Gathers the hosts (-H, --hostfile, else a Slurm allocation, else this host alone),
 * decides which are this host (merged into the first of them: one machine, one block of
 * ranks), places -np ranks host by host, and fills j->hosts, j->ranks' placement and
 * j->o.np. Returns -1 to go on, else khorrun's exit status (the reason said).
 */
int place_ranks(struct job *j);
/*
 * The hosts as given: -H, else --hostfile, else the Slurm allocation (*from_slurm_out),
 * else none. False when they are malformed (the reason said).
 */
bool place_gather_hosts(const struct opts *o, struct hostlist *l, bool *from_slurm_out);
/*
 * Is name this host (localhost, 127.x, ::1, its name or one of its addresses)? Each name
 * is a host of its own in an elastic job ("localhost" and "127.0.0.1" are two hosts, both
 * here), where place_ranks would merge them.
 */
bool place_host_is_here(const char *name);
/*
 * The address of this host that `host` reaches it by: the source address of the route to
 * it. Returns false with the reason in why.
 */
bool place_route_source(const char *host, char *out, size_t len, char *why, size_t wlen);
/* "ranks 4-7" or "rank 4": the ranks placed on h. */
void place_rank_range(const struct host *h, char *buf, size_t len);

#endif
