/*
 * cpubind.c -- the CPUs each rank of a local job runs on; see cpubind.h for the policy.
 */
#include "cpubind.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cpubind_parse(const char *s, cpubind_mode *mode_out)
{
	static const struct {
		const char *name;
		cpubind_mode mode;
	} modes[] = { { "cores", CPUBIND_CORES }, { "none", CPUBIND_NONE } };

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		if (strcmp(s, modes[i].name) == 0) {
			*mode_out = modes[i].mode;
			return true;
		}
	}
	return false;
}

/* The (first) number in a sysfs topology file of cpu, or fallback when it is missing. */
static long topo_id(int cpu, const char *what, long fallback)
{
	char path[128];
	long v = fallback;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
	f = fopen(path, "re");
	if (f == NULL)
		return fallback;
	if (fscanf(f, "%ld", &v) != 1 || v < 0)
		v = fallback;
	fclose(f);
	return v;
}

struct cpu_key {
	long pkg, core;
	int cpu;
};

static int cmp_key(const void *pa, const void *pb)
{
	const struct cpu_key *a = pa, *b = pb;

	if (a->pkg != b->pkg)
		return a->pkg < b->pkg ? -1 : 1;
	if (a->core != b->core)
		return a->core < b->core ? -1 : 1;
	return (a->cpu > b->cpu) - (a->cpu < b->cpu);
}

int cpubind_load(cpubind_cpus *c)
{
	cpu_set_t *set = NULL;
	size_t size = 0;
	struct cpu_key *keys;
	int setsize, n = 0;

	memset(c, 0, sizeof(*c));
	/* The kernel refuses a mask smaller than its own (EINVAL): grow until it fits. */
	for (setsize = 1024; setsize <= (1 << 20); setsize *= 2) {
		set = CPU_ALLOC((size_t)setsize);
		if (set == NULL)
			return ENOMEM;
		size = CPU_ALLOC_SIZE((size_t)setsize);
		if (sched_getaffinity(0, size, set) == 0)
			break;
		int err = errno;
		CPU_FREE(set);
		set = NULL;
		if (err != EINVAL)
			return err;
	}
	if (set == NULL)
		return EINVAL;

	int count = CPU_COUNT_S(size, set);
	keys = calloc((size_t)(count > 0 ? count : 1), sizeof(*keys));
	c->cpu = calloc((size_t)(count > 0 ? count : 1), sizeof(*c->cpu));
	if (keys == NULL || c->cpu == NULL) {
		free(keys);
		free(c->cpu);
		c->cpu = NULL;
		CPU_FREE(set);
		return ENOMEM;
	}
	for (int i = 0; i < setsize && n < count; i++) {
		if (!CPU_ISSET_S((size_t)i, size, set))
			continue;
		keys[n].cpu = i;
		keys[n].pkg = topo_id(i, "physical_package_id", 0);
		/*
		 * A core is named by its first hardware thread (the first number of its
		 * thread_siblings_list, e.g. "0-1" or "0,8"): core_id is not unique within a
		 * package everywhere (some arm64 and multi-die parts).
		 */
		keys[n].core = topo_id(i, "thread_siblings_list", i);
		n++;
	}
	qsort(keys, (size_t)n, sizeof(*keys), cmp_key);
	for (int i = 0; i < n; i++)
		c->cpu[i] = keys[i].cpu;
	free(keys);
	c->n = n;
	c->saved = set;
	c->setsize = setsize;
	return 0;
}

void cpubind_free(cpubind_cpus *c)
{
	free(c->cpu);
	if (c->saved != NULL)
		CPU_FREE((cpu_set_t *)c->saved);
	memset(c, 0, sizeof(*c));
}

void cpubind_share(int n, int np, int r, int *first_out, int *count_out)
{
	if (np > n) {
		*first_out = r % n;
		*count_out = 1;
		return;
	}
	/* Block boundaries at floor(r * n / np): sizes differ by at most one CPU. */
	long lo = (long)r * n / np, hi = (long)(r + 1) * n / np;
	*first_out = (int)lo;
	*count_out = (int)(hi - lo);
}

int cpubind_apply(const cpubind_cpus *c, int first, int count)
{
	size_t size = CPU_ALLOC_SIZE((size_t)c->setsize);
	cpu_set_t *set;
	int rc = 0;

	if (count == 0)
		return sched_setaffinity(0, size, (cpu_set_t *)c->saved) == 0 ? 0 : errno;
	if (first < 0 || count < 0 || first + count > c->n)
		return EINVAL;
	set = CPU_ALLOC((size_t)c->setsize);
	if (set == NULL)
		return ENOMEM;
	CPU_ZERO_S(size, set);
	for (int i = first; i < first + count; i++)
		CPU_SET_S((size_t)c->cpu[i], size, set);
	if (sched_setaffinity(0, size, set) != 0)
		rc = errno;
	CPU_FREE(set);
	return rc;
}

static int cmp_int(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;

	return (a > b) - (a < b);
}

void cpubind_format(const int *cpu, int n, char *buf, size_t len)
{
	int sorted[64];
	size_t off = 0;
	int m = n < 64 ? n : 64;

	if (len == 0)
		return;
	buf[0] = '\0';
	memcpy(sorted, cpu, (size_t)m * sizeof(int));
	qsort(sorted, (size_t)m, sizeof(int), cmp_int);
	for (int i = 0; i < m && off < len;) {
		int j = i;
		while (j + 1 < m && sorted[j + 1] == sorted[j] + 1)
			j++;
		int w = j > i ? snprintf(buf + off, len - off, "%s%d-%d", off ? "," : "", sorted[i],
		                         sorted[j])
		              : snprintf(buf + off, len - off, "%s%d", off ? "," : "", sorted[i]);
		if (w < 0)
			break;
		off += (size_t)w;
		i = j + 1;
	}
	if (n > m && off < len)
		snprintf(buf + off, len - off, ",... (%d CPUs)", n);
}
