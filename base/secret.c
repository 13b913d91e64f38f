/* secret.c -- the job secret's one copy in a process (secret.h). */
#include "secret.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SLOT (KSECRET_MAX + 1)
#define PAGE 4096
#define SLOTS_PER_PAGE (PAGE / SLOT)
#define PAGES_MAX 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *pages[PAGES_MAX];
static int used; /* slots taken, over all pages */

/* The environment variables taken (a name and its kept value). */
static struct {
	char name[32];
	const char *kept;
} taken[4];

static char *slot(int i)
{
	return pages[i / SLOTS_PER_PAGE] + (size_t)(i % SLOTS_PER_PAGE) * SLOT;
}

static const char *keep_locked(const char *s)
{
	size_t len = strlen(s);

	if (len > KSECRET_MAX)
		return NULL;
	for (int i = 0; i < used; i++)
		if (strcmp(slot(i), s) == 0)
			return slot(i);
	if (used % SLOTS_PER_PAGE == 0) {
		int p = used / SLOTS_PER_PAGE;
		if (p == PAGES_MAX)
			return NULL;
		void *m = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		/* Best effort: a kernel without it dumps the page like any other. */
		(void)madvise(m, PAGE, MADV_DONTDUMP);
		pages[p] = m;
	}
	char *d = slot(used++);
	memcpy(d, s, len + 1);
	return d;
}

const char *ksecret_keep(const char *s)
{
	pthread_mutex_lock(&mu);
	const char *k = keep_locked(s != NULL ? s : "");
	pthread_mutex_unlock(&mu);
	return k;
}

const char *ksecret_env(const char *name)
{
	const char *k = NULL;
	size_t i, n = sizeof(taken) / sizeof(taken[0]);

	pthread_mutex_lock(&mu);
	for (i = 0; i < n && taken[i].name[0] != '\0'; i++)
		if (strcmp(taken[i].name, name) == 0)
			break;
	char *v = getenv(name);
	if (v != NULL && *v != '\0') {
		/* Set (again, or for the first time): the environment's value is the one. */
		k = keep_locked(v);
		if (k != NULL) {
			volatile char *w = v;
			while (*w != '\0')
				*w++ = '\0';
			if (i < n && strlen(name) < sizeof(taken[i].name)) {
				strcpy(taken[i].name, name);
				taken[i].kept = k;
			}
		}
	} else if (i < n && taken[i].name[0] != '\0') {
		k = taken[i].kept;
	}
	pthread_mutex_unlock(&mu);
	return k != NULL && *k != '\0' ? k : NULL;
}
