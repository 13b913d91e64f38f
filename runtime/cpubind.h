/*
 * cpubind.h -- which CPUs each rank of a local job may run on (khorrun --bind).
 *
 * With --bind cores the launcher takes the CPUs it was itself given (a taskset, a cgroup
 * cpuset, Slurm's allocation), orders them by package, core and hardware thread, and hands
 * each rank a share: with np ranks on n CPUs, rank r gets the r-th of np equal contiguous
 * blocks when np <= n (hardware threads of one core stay with one rank when the blocks are
 * whole cores), else the (r mod n)-th CPU, so ring neighbours run on different CPUs.
 *
 * Not the default. With 4 ranks on 2 CPUs, pinned ranks ran the ring up to 30% faster (no
 * migrations: about 400 per 256 MiB allreduce unpinned) but not halving-doubling, and the
 * cost model kept picking halving-doubling: auto's choice was 10-40% off at 10 of 52 sizes
 * pinned, 3 unpinned (docs/PERFORMANCE.md, "Pinning ranks"). With a CPU per rank nothing
 * measurable changed, and a framework's own threads are better left the whole machine.
 */
#ifndef KHOR_RUNTIME_CPUBIND_H
#define KHOR_RUNTIME_CPUBIND_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
	CPUBIND_NONE, /* leave the scheduler alone (the default) */
	CPUBIND_CORES, /* give each rank its share */
} cpubind_mode;

/* The calling thread's CPUs, ordered package, core, thread; and its mask, to restore. */
typedef struct {
	int *cpu;
	int n;
	void *saved; /* cpu_set_t of CPU_ALLOC_SIZE(setsize) */
	int setsize; /* CPUs the sets can hold */
} cpubind_cpus;

/* "cores" or "none". */
bool cpubind_parse(const char *s, cpubind_mode *mode_out);

/* Reads the calling thread's affinity and the CPUs' topology. Returns 0 or an errno. */
int cpubind_load(cpubind_cpus *c);
void cpubind_free(cpubind_cpus *c);

/* Rank r's share of n ordered CPUs: count of them starting at index first. */
void cpubind_share(int n, int np, int r, int *first_out, int *count_out);

/*
 * Puts the calling thread on c->cpu[first .. first + count - 1] (what it spawns inherits
 * that), or back on its saved mask when count is 0. Returns 0 or an errno.
 */
int cpubind_apply(const cpubind_cpus *c, int first, int count);

/* Writes CPUs as a list such as "0-3,8" into buf (truncated to len). */
void cpubind_format(const int *cpu, int n, char *buf, size_t len);

#endif
