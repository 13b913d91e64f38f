/*
 * store_cases.h -- the store's contract, the cases every backend must pass: set and get,
 * waiting and timeouts, atomic counters across processes, deletion, key prefixes, many
 * waiters and many clients. Included by each backend's test file (test_store.c for the
 * embedded TCP store, test_store_etcd.c for etcd), which first defines:
 *
 *   STORE_SUITE         the Criterion suite the cases are named under
 *   STORE_ADD_ROUNDS    adds per process in add_is_atomic_across_processes
 *   STORE_MANY_CLIENTS  connections open at once in many_clients
 *   JOB                 the job id the cases prefix their keys with
 *   static uint16_t backend_start(void);  starts a store on 127.0.0.1, returns its port
 *   static void backend_stop(void);
 *   static khor_status backend_connect(uint16_t port, store **s, kerr *err);  no prefix
 */
#ifndef KHOR_TESTS_STORE_CASES_H
#define KHOR_TESTS_STORE_CASES_H

#include "base/clock.h"
#include "rendezvous/store.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t elapsed_ms(uint64_t t0)
{
	return (int64_t)((kclock_ns() - t0) / 1000000);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/*
 * Child processes are forked before the server thread exists (a fork while another thread
 * holds a libc, libcrypto or sanitizer lock can leave the child deadlocked) and learn the
 * server's port through this pipe once it runs.
 */
static uint16_t gate_wait(int gate[2])
{
	uint16_t port = 0;

	close(gate[1]);
	if (read(gate[0], &port, sizeof(port)) != sizeof(port))
		_exit(10);
	close(gate[0]);
	return port;
}

static void gate_open(int gate[2], int children, uint16_t port)
{
	close(gate[0]);
	for (int i = 0; i < children; i++)
		cr_assert_eq(write(gate[1], &port, sizeof(port)), sizeof(port));
	close(gate[1]);
}

static khor_status child_connect(uint16_t port, store **s, kerr *err)
{
	khor_status st = backend_connect(port, s, err);
	if (st == KHOR_SUCCESS)
		store_set_prefix(*s, JOB, 0);
	return st;
}

static store *case_connect_raw(uint16_t port)
{
	store *s = NULL;
	kerr err;

	kerr_clear(&err);
	khor_status st = backend_connect(port, &s, &err);
	cr_assert_eq(st, KHOR_SUCCESS, "connect: %s", err.text);
	return s;
}

static store *case_connect(uint16_t port)
{
	store *s = case_connect_raw(port);

	store_set_prefix(s, JOB, 0);
	return s;
}

Test(STORE_SUITE, set_get_roundtrip, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	void *v = NULL;
	size_t len = 0;
	kerr err;

	kerr_clear(&err);
	cr_assert_eq(store_set(s, "addr/0", "10.0.0.1:4000", 13, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(1000), &v, &len, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_eq(len, 13);
	cr_assert_str_eq(v, "10.0.0.1:4000"); /* NUL-terminated one past the length */
	free(v);

	/* Overwrite, then an empty value. */
	cr_assert_eq(store_set(s, "addr/0", "x", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "x");
	free(v);
	cr_assert_eq(store_set(s, "empty", "", 0, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "empty", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_eq(len, 0);
	cr_assert_eq(((char *)v)[0], '\0');
	free(v);

	/* The largest value allowed goes through intact; one byte more is refused locally. */
	uint8_t *big = malloc(STORE_VALUE_MAX + 1);
	for (size_t i = 0; i <= STORE_VALUE_MAX; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	cr_assert_eq(store_set(s, "big", big, STORE_VALUE_MAX, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(store_get(s, "big", kdeadline_in_ms(5000), &v, &len, &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(len, STORE_VALUE_MAX);
	cr_assert_eq(memcmp(v, big, len), 0);
	free(v);
	cr_assert_eq(store_set(s, "big", big, STORE_VALUE_MAX + 1, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "'job-test/0/big'") != NULL, "%s", err.text);
	free(big);

	/* Still usable after a refused call. */
	cr_assert_eq(store_get(s, "addr/0", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	free(v);
	store_close(s);
	backend_stop();
}

struct setter_arg {
	uint16_t port;
	int delay_ms;
	const char *key;
	const char *val;
	khor_status st; /* Criterion asserts only on the test's own thread */
};

static void *setter_thread(void *p)
{
	struct setter_arg *a = p;
	store *s = NULL;
	kerr err;

	a->st = backend_connect(a->port, &s, &err);
	if (a->st != KHOR_SUCCESS)
		return NULL;
	store_set_prefix(s, JOB, 0);
	sleep_ms(a->delay_ms);
	a->st = store_set(s, a->key, a->val, strlen(a->val), &err);
	store_close(s);
	return NULL;
}

Test(STORE_SUITE, get_waits_for_a_thread, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	struct setter_arg a = { port, 300, "late", "here", KHOR_ERR_INTERNAL };
	pthread_t th;
	void *v = NULL;
	size_t len;
	kerr err;

	pthread_create(&th, NULL, setter_thread, &a);
	uint64_t t0 = kclock_ns();
	cr_assert_eq(store_get(s, "late", kdeadline_in_ms(10000), &v, &len, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_geq(elapsed_ms(t0), 200);
	cr_assert_str_eq(v, "here");
	free(v);
	pthread_join(th, NULL);
	cr_assert_eq(a.st, KHOR_SUCCESS);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, get_waits_for_another_process, .timeout = 30)
{
	int gate[2];
	void *v = NULL;
	size_t len;
	kerr err;
	int status;

	cr_assert_eq(pipe(gate), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		store *c = NULL;
		uint16_t port = gate_wait(gate);
		sleep_ms(300);
		if (child_connect(port, &c, &err) != KHOR_SUCCESS)
			_exit(2);
		_exit(store_set(c, "from-child", "42", 2, &err) == KHOR_SUCCESS ? 0 : 3);
	}
	uint16_t port = backend_start();
	gate_open(gate, 1, port);
	store *s = case_connect(port);
	cr_assert_eq(store_get(s, "from-child", kdeadline_in_ms(10000), &v, &len, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_str_eq(v, "42");
	free(v);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, get_times_out, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	void *v = NULL;
	size_t len;
	kerr err;
	char colon_port[16];

	uint64_t t0 = kclock_ns();
	cr_assert_eq(store_get(s, "never", kdeadline_in_ms(300), &v, &len, &err), KHOR_ERR_TIMEOUT);
	int64_t ms = elapsed_ms(t0);
	cr_assert(ms >= 250 && ms < 3000, "took %lld ms", (long long)ms);
	cr_assert(strstr(err.text, "'job-test/0/never'") != NULL, "%s", err.text);
	snprintf(colon_port, sizeof(colon_port), ":%u", port);
	cr_assert(strstr(err.text, "127.0.0.1") != NULL && strstr(err.text, colon_port) != NULL,
	          "%s",
	          err.text);

	/* A deadline already passed is a plain lookup. */
	t0 = kclock_ns();
	cr_assert_eq(store_get(s, "never", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_lt(elapsed_ms(t0), 1000);
	cr_assert_eq(store_set(s, "now", "1", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "now", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	free(v);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, add_is_atomic_across_processes, .timeout = 60)
{
	pid_t pids[4];
	int gate[2];
	kerr err;

	cr_assert_eq(pipe(gate), 0);
	for (int p = 0; p < 4; p++) {
		pids[p] = fork();
		cr_assert_geq(pids[p], 0);
		if (pids[p] == 0) {
			store *c = NULL;
			int64_t last = 0, now;
			if (child_connect(gate_wait(gate), &c, &err) != KHOR_SUCCESS)
				_exit(2);
			for (int i = 0; i < STORE_ADD_ROUNDS; i++) {
				if (store_add(c, "counter", 1, &now, &err) != KHOR_SUCCESS)
					_exit(3);
				/* each sees strictly growing values */
				if (now <= last || now > 4 * STORE_ADD_ROUNDS)
					_exit(4);
				last = now;
			}
			store_close(c);
			_exit(0);
		}
	}
	uint16_t port = backend_start();
	gate_open(gate, 4, port);
	for (int p = 0; p < 4; p++) {
		int status;
		cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d exit %d", p,
		          WEXITSTATUS(status));
	}
	store *s = case_connect(port);
	int64_t v;
	void *txt;
	size_t len;
	cr_assert_eq(store_add(s, "counter", 0, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, 4 * STORE_ADD_ROUNDS);
	cr_assert_eq(store_get(s, "counter", kdeadline_in_ms(0), &txt, &len, &err), KHOR_SUCCESS);
	char want[16];
	snprintf(want, sizeof(want), "%d", 4 * STORE_ADD_ROUNDS);
	cr_assert_str_eq(txt, want);
	free(txt);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, add_semantics, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	int64_t v = 0;
	kerr err;

	cr_assert_eq(store_add(s, "n", -5, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, -5);
	cr_assert_eq(store_add(s, "n", 7, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, 2);
	cr_assert_eq(store_set(s, "n", "9223372036854775806", 19, &err), KHOR_SUCCESS);
	cr_assert_eq(store_add(s, "n", 1, &v, &err), KHOR_SUCCESS);
	cr_assert_eq(v, INT64_MAX);
	cr_assert_eq(store_add(s, "n", 1, &v, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "overflow") != NULL, "%s", err.text);
	cr_assert_eq(store_set(s, "word", "ten", 3, &err), KHOR_SUCCESS);
	cr_assert_eq(store_add(s, "word", 1, &v, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "not a decimal integer") != NULL, "%s", err.text);
	/* The connection survives refused values. */
	cr_assert_eq(store_add(s, "fresh", 3, &v, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(v, 3);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, del_removes_keys, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	void *v = NULL;
	size_t len;
	kerr err;

	cr_assert_eq(store_set(s, "k", "v", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_del(s, "k", &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_del(s, "k", &err), KHOR_SUCCESS); /* absent is fine */
	cr_assert_eq(store_del(s, "never-set", &err), KHOR_SUCCESS);
	cr_assert_eq(store_set(s, "k", "w", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(s, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "w");
	free(v);
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, prefix_isolates_jobs_and_generations, .timeout = 30)
{
	uint16_t port = backend_start();
	store *a = case_connect(port), *b = case_connect(port);
	void *v = NULL;
	size_t len;
	kerr err;

	store_set_prefix(a, "jobA", 0);
	store_set_prefix(b, "jobA", 1);
	cr_assert_eq(store_set(a, "k", "gen0", 4, &err), KHOR_SUCCESS);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_set(b, "k", "gen1", 4, &err), KHOR_SUCCESS);
	store_set_prefix(b, "jobB", 0);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_TIMEOUT);
	cr_assert_eq(store_get(a, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "gen0");
	free(v);
	/* Without a prefix, the full key names the same entry. */
	store *raw = case_connect_raw(port);
	cr_assert_eq(store_get(raw, "jobA/1/k", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS);
	cr_assert_str_eq(v, "gen1");
	free(v);
	store_close(raw);

	/* A job id that cannot make a prefix, and keys over the limit, are refused. */
	store_set_prefix(b, "a/b", 0);
	cr_assert_eq(store_set(b, "k", "x", 1, &err), KHOR_ERR_INVALID_ARG);
	char longjob[200];
	memset(longjob, 'j', sizeof(longjob) - 1);
	longjob[sizeof(longjob) - 1] = '\0';
	store_set_prefix(b, longjob, 0);
	cr_assert_eq(store_get(b, "k", kdeadline_in_ms(0), &v, &len, &err), KHOR_ERR_INVALID_ARG);
	char longkey[STORE_KEY_MAX + 1];
	memset(longkey, 'k', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	cr_assert_eq(store_set(a, longkey, "x", 1, &err), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(err.text, "over the limit") != NULL, "%s", err.text);
	cr_assert_eq(store_set(a, "", "x", 1, &err), KHOR_ERR_INVALID_ARG);
	store_close(a);
	store_close(b);
	backend_stop();
}

Test(STORE_SUITE, many_waiters_all_woken, .timeout = 30)
{
	enum { N = 32 };
	pid_t pids[N];
	int gate[2];
	kerr err;

	cr_assert_eq(pipe(gate), 0);
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		cr_assert_geq(pids[i], 0);
		if (pids[i] == 0) {
			store *c = NULL;
			void *v;
			size_t len;
			if (child_connect(gate_wait(gate), &c, &err) != KHOR_SUCCESS)
				_exit(2);
			if (store_add(c, "ready", 1, NULL, &err) != KHOR_SUCCESS)
				_exit(3);
			if (store_get(c, "go", kdeadline_in_ms(10000), &v, &len, &err) != KHOR_SUCCESS)
				_exit(4);
			_exit(strcmp(v, "now") == 0 ? 0 : 5);
		}
	}
	uint16_t port = backend_start();
	gate_open(gate, N, port);
	store *s = case_connect(port);
	int64_t ready = 0;
	uint64_t t0 = kclock_ns();
	while (ready < N && elapsed_ms(t0) < 10000) {
		cr_assert_eq(store_add(s, "ready", 0, &ready, &err), KHOR_SUCCESS);
		sleep_ms(10);
	}
	cr_assert_eq(ready, N);
	cr_assert_eq(store_set(s, "go", "now", 3, &err), KHOR_SUCCESS);
	for (int i = 0; i < N; i++) {
		int status;
		cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "waiter %d exit %d", i,
		          WEXITSTATUS(status));
	}
	store_close(s);
	backend_stop();
}

Test(STORE_SUITE, many_clients, .timeout = 60)
{
	enum { N = STORE_MANY_CLIENTS };
	uint16_t port = backend_start();
	store *c[N];
	char key[32], val[32];
	kerr err;

	for (int i = 0; i < N; i++) {
		c[i] = case_connect(port);
		snprintf(key, sizeof(key), "addr/%d", i);
		snprintf(val, sizeof(val), "host%d", i);
		cr_assert_eq(store_set(c[i], key, val, strlen(val), &err), KHOR_SUCCESS, "%s", err.text);
	}
	for (int i = 0; i < N; i++) {
		void *v;
		size_t len;
		snprintf(key, sizeof(key), "addr/%d", (i + 1) % N);
		snprintf(val, sizeof(val), "host%d", (i + 1) % N);
		cr_assert_eq(store_get(c[i], key, kdeadline_in_ms(2000), &v, &len, &err), KHOR_SUCCESS);
		cr_assert_str_eq(v, val);
		free(v);
	}
	for (int i = 0; i < N; i++)
		store_close(c[i]);
	backend_stop();
}

#endif
