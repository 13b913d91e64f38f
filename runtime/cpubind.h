/*
 * cpubind.h -- which CPUs each rank of a local job may run on (khorrun --bind).
 *
 * The launcher takes the CPUs it was itself given (a taskset, a cgroup cpuset, Slurm's
 * allocation), orders them by package, core and hardware thread, and hands each rank a share:
 * with np ranks on n CPUs, rank r gets the r-th of np equal contiguous blocks when np <= n
 * (so hardware threads of one core stay with one rank), else the (r mod n)-th CPU, so
 * neighbouring ranks, which talk the most in a ring, run on different CPUs.
 *
 * Why bind at all: with more ranks than CPUs, unbound ranks migrate between CPUs hundreds of
 * times per large collective and every migration costs the caches its copies were using
 * (see docs/PERFORMANCE.md, "Binding"). With a CPU or more per rank the scheduler already
 * keeps ranks apart, and a framework's own threads are better left the whole machine, so the
 * default binds only when ranks outnumber CPUs.
 */
#ifndef KHOR_RUNTIME_CPUBIND_H
#define KHOR_RUNTIME_CPUBIND_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
	CPUBIND_AUTO, /* bind only when ranks outnumber CPUs */
	CPUBIND_CORES, /* always give each rank its share */
	CPUBIND_NONE, /* leave the scheduler alone */
} cpubind_mode;

/* The calling thread's CPUs, ordered package, core, thread; and its mask, to restore. */
typedef struct {
	int *cpu;
	int n;
	void *saved; /* cpu_set_t of CPU_ALLOC_SIZE(setsize) */
	int setsize; /* CPUs the sets can hold */
} cpubind_cpus;

/* "auto", "cores" or "none". */
bool cpubind_parse(const char *s, cpubind_mode *mode_out);

/* Reads the calling thread's affinity and the CPUs' topology. Returns 0 or an errno. */
int cpubind_load(cpubind_cpus *c);
void cpubind_free(cpubind_cpus *c);

/* Whether mode binds np ranks on n CPUs. */
bool cpubind_wanted(cpubind_mode mode, int np, int n);

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
