/*
 * fuzz_config.c -- libFuzzer harness for khorrun's parsers of text a user or a script
 * wrote: --config-file (yaml.c, through tuning.c as khorrun reads it), -H and --hostfile
 * (hostlist.c), a Slurm allocation's SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE (slurm.c)
 * and a host discovery script's output (elastic_plan.c). Input byte 0 picks the target
 * (mod 4), the rest is the text (for Slurm: the node list, a newline, the tasks per node).
 * Files are written to a temporary file first, as khorrun reads them from a path.
 * Invariants: what is accepted holds hosts with names and slots >= 1, and the settings a
 * config file gives are "VAR=value" for a variable of khor's or Horovod's; a discovered
 * host's slots are all of the number after its ':' (what the script wrote, NUL and all).
 *
 *   .ci/fuzz builds it with every launcher file but khorrun.c
 *   ./fuzz_config -max_total_time=60
 */
#include "launcher/elastic_plan.h"
#include "launcher/hosts.h"
#include "launcher/job.h"
#include "launcher/say.h"
#include "launcher/tuning.h"
#include "tests/support/fuzz_split.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

static char path[64];

static void setup(void)
{
	int fd = open("/dev/null", O_WRONLY);

	/* khorrun's messages (say) go out as frames on stdout: into /dev/null. */
	CHECK(fd >= 0 && dup2(fd, STDOUT_FILENO) == STDOUT_FILENO);
	close(fd);
	say_to_frames();
	snprintf(path, sizeof(path), "/tmp/fuzz_config.%d", (int)getpid());
}

static void write_file(const uint8_t *d, size_t n)
{
	FILE *f = fopen(path, "w");

	CHECK(f != NULL);
	CHECK(fwrite(d, 1, n, f) == n || n == 0);
	CHECK(fclose(f) == 0);
}

static void fuzz_config_file(const uint8_t *d, size_t n)
{
	struct opts o;
	char why[256];

	memset(&o, 0, sizeof(o));
	write_file(d, n);
	CHECK(tuning_set_flag(&o, "--config-file", path, why, sizeof(why)));
	if (tuning_finish(&o)) {
		for (int i = 0; i < o.nxvars; i++) {
			const char *x = o.xvars[i], *eq = strchr(x, '=');
			CHECK(eq != NULL && eq > x);
			CHECK(strncmp(x, "KHOR_", 5) == 0 || strncmp(x, "HOROVOD_", 8) == 0 ||
			      strncmp(x, "NCCL_", 5) == 0);
			CHECK(strchr(x, '\n') == NULL);
		}
	}
	tuning_free(&o);
	free(o.xvars);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_hosts(const struct hostlist *l)
{
	const char **names = malloc(sizeof(*names) * (size_t)(l->n + 1));

	CHECK(names != NULL && l->n >= 0 && l->n <= l->cap && l->n <= MAX_HOSTS);
	for (int i = 0; i < l->n; i++) {
		CHECK(l->h[i].name != NULL && l->h[i].name[0] != '\0');
		CHECK(l->h[i].slots >= 1);
		names[i] = l->h[i].name;
	}
	/* A name given twice is one host (merged). */
	qsort(names, (size_t)l->n, sizeof(*names), by_name);
	for (int i = 1; i < l->n; i++)
		CHECK(strcmp(names[i - 1], names[i]) != 0);
	free(names);
}

static void fuzz_hosts(const uint8_t *d, size_t n)
{
	struct hostlist l = { 0 };
	char *arg = malloc(n + 1);

	CHECK(arg != NULL);
	memcpy(arg, d, n);
	arg[n] = '\0';
	if (hostlist_parse_arg(arg, &l))
		check_hosts(&l);
	hostlist_free(&l);
	memset(&l, 0, sizeof(l));
	write_file(d, n);
	if (hostlist_parse_file(path, &l))
		check_hosts(&l);
	hostlist_free(&l);
	free(arg);
}

static void fuzz_slurm(const uint8_t *d, size_t n)
{
	struct hostlist l = { 0 };
	char *text = malloc(n + 1), *nl;
	bool bad = false;

	CHECK(text != NULL);
	memcpy(text, d, n);
	text[n] = '\0';
	nl = strchr(text, '\n');
	if (nl != NULL)
		*nl = '\0';
	/* putenv's strings, kept: setenv would keep every value it was ever given. */
	static char list[65600], tasks[65600];
	unsetenv("SLURM_JOB_NODELIST");
	unsetenv("SLURM_TASKS_PER_NODE");
	snprintf(list, sizeof(list), "SLURM_JOB_NODELIST=%s", text);
	putenv(list);
	if (nl != NULL) {
		snprintf(tasks, sizeof(tasks), "SLURM_TASKS_PER_NODE=%s", nl + 1);
		putenv(tasks);
	}
	if (slurm_hosts(&l, &bad))
		check_hosts(&l);
	hostlist_free(&l);
	free(text);
}

static void fuzz_discovery(const uint8_t *d, size_t n)
{
	struct ep_list l = { 0 };
	char why[256];
	int def = n > 0 ? d[0] % 4 + 1 : 1;

	if (ep_parse_hosts((const char *)d, n, def, &l, why, sizeof(why))) {
		CHECK(l.n >= 0 && l.n <= l.cap);
		/* Every ':' of the text is followed by digits alone up to its line's end. */
		for (size_t i = 0; i < n; i++) {
			if (d[i] != ':')
				continue;
			size_t k = i + 1;
			while (k < n && d[k] >= '0' && d[k] <= '9')
				k++;
			while (k < n && d[k] != '\n' && isspace(d[k]))
				k++;
			CHECK(k == n || d[k] == '\n');
		}
		for (int i = 0; i < l.n; i++) {
			CHECK(l.h[i].name != NULL && l.h[i].name[0] != '\0');
			CHECK(strlen(l.h[i].name) <= EP_HOST_MAX);
			/* 0 slots is taken (parse_line: "a number from 0 to 65536"). */
			CHECK(l.h[i].slots >= 0 && l.h[i].slots <= EP_SLOTS_MAX);
			for (int k = 0; k < i; k++)
				CHECK(strcmp(l.h[i].name, l.h[k].name) != 0);
		}
	} else {
		CHECK(l.n == 0 && memchr(why, '\0', sizeof(why)) != NULL && why[0] != '\0');
	}
	ep_list_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const fuzz_part parts[] = { fuzz_config_file, fuzz_hosts, fuzz_slurm,
		                           fuzz_discovery };

	if (path[0] == '\0')
		setup();
	fuzz_split(data, size, 65536, parts, sizeof(parts) / sizeof(parts[0]));
	unlink(path);
	return 0;
}
