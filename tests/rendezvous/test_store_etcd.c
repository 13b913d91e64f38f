/*
 * test_store_etcd.c -- etcd as the rendezvous store, against a real etcd server started
 * for each test (etcd_proc.h): the store's contract (store_cases.h), then what is etcd's
 * own: leases that expire and take their keys, compare-and-swap, etcd killed in the middle
 * of a wait (a clear error by the deadline) or restarted within it (the wait goes on), a
 * multi-rank job that meets through etcd, and replies that are not etcd's (each an error
 * naming the endpoint, never a crash), down to the JSON reader's grammar.
 */
#include "base/clock.h"
#include "rendezvous/etcd.h"
#include "rendezvous/json.h"
#include "rendezvous/store.h"

#include "etcd_proc.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define JOB "job-test"

static struct etcd_proc the_etcd;

static uint16_t backend_start(void)
{
	etcd_up(&the_etcd);
	return the_etcd.port;
}

static void backend_stop(void)
{
	etcd_down(&the_etcd);
}

static khor_status backend_connect(uint16_t port, store **s, kerr *err)
{
	char addr[64];

	snprintf(addr, sizeof(addr), "etcd://127.0.0.1:%u", port);
	return store_connect(addr, "", JOB, kdeadline_in_ms(5000), s, err);
}

/* Each add is a read and a transaction through raft: fewer rounds than the tcp store's. */
#define STORE_SUITE etcd_store
#define STORE_ADD_ROUNDS 150
#define STORE_MANY_CLIENTS 100
#include "store_cases.h"

static etcd *open_etcd(uint16_t port)
{
	etcd *e = NULL;
	kerr err;

	kerr_clear(&err);
	cr_assert_eq(etcd_open("127.0.0.1", port, kdeadline_in_ms(5000), &e, &err), KHOR_SUCCESS,
	             "%s", err.text);
	return e;
}

static bool has(const char *text, const char *part)
{
	return strstr(text, part) != NULL;
}

/* --- etcd's own ----------------------------------------------------------------------- */

Test(etcd, lease_expiry_deletes_its_keys, .timeout = 30)
{
	etcd *e = open_etcd(backend_start());
	struct etcd_kv kv;
	int64_t lease, ttl = -1;
	kerr err;

	cr_assert_eq(etcd_lease_grant(e, 1, kdeadline_in_ms(5000), &lease, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_eq(etcd_put(e, "agent/host1", "4 slots", 7, lease, kdeadline_in_ms(5000), &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(etcd_lease_keepalive(e, lease, kdeadline_in_ms(5000), &ttl, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(ttl, 1);
	cr_assert_eq(etcd_get(e, "agent/host1", kdeadline_in_ms(5000), &kv, NULL, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert(kv.found);
	cr_assert_eq(kv.lease, lease);
	cr_assert_str_eq((char *)kv.val, "4 slots");
	etcd_kv_free(&kv);

	/* Unkept, the lease expires and takes the key with it. */
	uint64_t t0 = kclock_ns();
	bool found = true;
	while (found && elapsed_ms(t0) < 10000) {
		sleep_ms(100);
		cr_assert_eq(etcd_get(e, "agent/host1", kdeadline_in_ms(5000), &kv, NULL, &err),
		             KHOR_SUCCESS, "%s", err.text);
		found = kv.found;
		etcd_kv_free(&kv);
	}
	cr_assert(!found, "the key outlived its 1 s lease by 10 s");
	cr_assert_eq(etcd_lease_keepalive(e, lease, kdeadline_in_ms(5000), &ttl, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(ttl, 0, "a lease that expired cannot be kept alive");

	/* Revoked, a lease's keys go at once; revoking it again is no error. */
	cr_assert_eq(etcd_lease_grant(e, 60, kdeadline_in_ms(5000), &lease, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_put(e, "agent/host2", "x", 1, lease, kdeadline_in_ms(5000), &err),
	             KHOR_SUCCESS);
	cr_assert_eq(etcd_lease_revoke(e, lease, kdeadline_in_ms(5000), &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(etcd_get(e, "agent/host2", kdeadline_in_ms(5000), &kv, NULL, &err),
	             KHOR_SUCCESS);
	cr_assert(!kv.found);
	cr_assert_eq(etcd_lease_revoke(e, lease, kdeadline_in_ms(5000), &err), KHOR_SUCCESS, "%s",
	             err.text);
	/* A put bound to a lease that is gone is refused with etcd's reason. */
	cr_assert_eq(etcd_put(e, "agent/host3", "x", 1, lease, kdeadline_in_ms(5000), &err),
	             KHOR_ERR_REMOTE);
	cr_assert(has(err.text, "lease not found") && has(err.text, "'agent/host3'"), "%s",
	          err.text);
	etcd_close(e);
	backend_stop();
}

static void expect_value(const struct etcd_kv *kv, const char *want)
{
	cr_assert(kv->found);
	cr_assert_str_eq((const char *)kv->val, want);
}

Test(etcd, compare_and_swap, .timeout = 30)
{
	etcd *e = open_etcd(backend_start());
	kdeadline dl = kdeadline_in_ms(10000);
	struct etcd_kv cur, kv;
	int64_t lease, rev;
	bool swapped;
	kerr err;

	/* Create if absent: once. The loser learns what won. */
	cr_assert_eq(etcd_cas(e, "leader", NULL, 0, "a", 1, 0, dl, &swapped, &cur, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert(swapped);
	cr_assert_eq(etcd_cas(e, "leader", NULL, 0, "b", 1, 0, dl, &swapped, &cur, &err),
	             KHOR_SUCCESS, "%s", err.text);
	cr_assert(!swapped);
	expect_value(&cur, "a");
	etcd_kv_free(&cur);

	/* Replace if the value is what we think. */
	cr_assert_eq(etcd_cas(e, "leader", "x", 1, "c", 1, 0, dl, &swapped, &cur, &err),
	             KHOR_SUCCESS);
	cr_assert(!swapped);
	expect_value(&cur, "a");
	etcd_kv_free(&cur);
	cr_assert_eq(etcd_cas(e, "leader", "a", 1, "c", 1, 0, dl, &swapped, NULL, &err),
	             KHOR_SUCCESS);
	cr_assert(swapped);
	cr_assert_eq(etcd_get(e, "leader", dl, &kv, NULL, &err), KHOR_SUCCESS);
	expect_value(&kv, "c");
	/* An empty expected value is not an absent key. */
	cr_assert_eq(etcd_cas(e, "nobody", "", 0, "z", 1, 0, dl, &swapped, &cur, &err),
	             KHOR_SUCCESS);
	cr_assert(!swapped);
	cr_assert(!cur.found);

	/* By mod revision: an old one loses, the current one wins. */
	cr_assert_eq(etcd_cas_revision(e, "leader", kv.mod_revision - 1, "d", 1, dl, &swapped,
	                               &cur, &err),
	             KHOR_SUCCESS);
	cr_assert(!swapped);
	cr_assert_eq(cur.mod_revision, kv.mod_revision);
	etcd_kv_free(&cur);
	cr_assert_eq(etcd_cas_revision(e, "leader", kv.mod_revision, "d", 1, dl, &swapped, NULL,
	                               &err),
	             KHOR_SUCCESS);
	cr_assert(swapped);
	etcd_kv_free(&kv);
	cr_assert_eq(etcd_cas_revision(e, "fresh", 0, "1", 1, dl, &swapped, NULL, &err),
	             KHOR_SUCCESS);
	cr_assert(swapped, "mod revision 0 means absent");

	/* A leader key bound to a lease: when the lease goes, another can take over. */
	cr_assert_eq(etcd_lease_grant(e, 30, dl, &lease, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_cas(e, "el/leader", NULL, 0, "agent1", 6, lease, dl, &swapped, NULL,
	                      &err),
	             KHOR_SUCCESS);
	cr_assert(swapped);
	cr_assert_eq(etcd_cas(e, "el/leader", NULL, 0, "agent2", 6, 0, dl, &swapped, &cur, &err),
	             KHOR_SUCCESS);
	cr_assert(!swapped);
	expect_value(&cur, "agent1");
	cr_assert_eq(cur.lease, lease);
	etcd_kv_free(&cur);
	cr_assert_eq(etcd_lease_revoke(e, lease, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_cas(e, "el/leader", NULL, 0, "agent2", 6, 0, dl, &swapped, NULL, &err),
	             KHOR_SUCCESS);
	cr_assert(swapped);
	cr_assert_eq(etcd_get(e, "el/leader", dl, &kv, &rev, &err), KHOR_SUCCESS);
	expect_value(&kv, "agent2");
	cr_assert_geq(rev, kv.mod_revision);
	etcd_kv_free(&kv);
	etcd_close(e);
	backend_stop();
}

Test(etcd, list_a_prefix_oldest_first, .timeout = 30)
{
	etcd *e = open_etcd(backend_start());
	kdeadline dl = kdeadline_in_ms(10000);
	struct etcd_kv *kvs;
	int n;
	kerr err;

	cr_assert_eq(etcd_list(e, "job/0/el/agent/", dl, &kvs, &n, &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(n, 0);
	etcd_kvs_free(kvs, n);
	/* Registered in this order; names that sort otherwise, and keys just outside. */
	cr_assert_eq(etcd_put(e, "job/0/el/agent/zeta", "2", 1, 0, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_put(e, "job/0/el/agent/alpha", "4", 1, 0, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_put(e, "job/0/el/agent0", "x", 1, 0, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_put(e, "job/0/el/agent.", "x", 1, 0, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_put(e, "job/0/el/agent/mid", "", 0, 0, dl, &err), KHOR_SUCCESS);
	cr_assert_eq(etcd_list(e, "job/0/el/agent/", dl, &kvs, &n, &err), KHOR_SUCCESS, "%s",
	             err.text);
	cr_assert_eq(n, 3);
	cr_assert_str_eq(kvs[0].key, "job/0/el/agent/zeta");
	cr_assert_str_eq((char *)kvs[0].val, "2");
	cr_assert_str_eq(kvs[1].key, "job/0/el/agent/alpha");
	cr_assert_str_eq(kvs[2].key, "job/0/el/agent/mid");
	cr_assert_eq(kvs[2].len, 0);
	cr_assert_lt(kvs[0].create_revision, kvs[1].create_revision);
	etcd_kvs_free(kvs, n);
	etcd_close(e);
	backend_stop();
}

struct killer {
	struct etcd_proc *p;
	int after_ms;
};

static void *kill_later(void *arg)
{
	struct killer *k = arg;

	sleep_ms(k->after_ms);
	etcd_kill(k->p, SIGKILL);
	return NULL;
}

Test(etcd, killed_mid_wait_is_a_clear_error_by_the_deadline, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	struct killer k = { &the_etcd, 300 };
	char where[64];
	pthread_t th;
	void *v;
	size_t len;
	kerr err;

	pthread_create(&th, NULL, kill_later, &k);
	uint64_t t0 = kclock_ns();
	khor_status st = store_get(s, "never", kdeadline_in_ms(2000), &v, &len, &err);
	int64_t ms = elapsed_ms(t0);
	pthread_join(th, NULL);
	cr_assert_eq(st, KHOR_ERR_REMOTE, "%s", err.text);
	cr_assert(ms >= 1500 && ms < 4000, "gave up after %lld ms", (long long)ms);
	snprintf(where, sizeof(where), "etcd at 127.0.0.1:%u", port);
	cr_assert(has(err.text, where) && has(err.text, "get 'job-test/0/never'") &&
	              has(err.text, "cannot reach etcd"),
	          "%s", err.text);
	store_close(s);
	backend_stop();
}

struct getter {
	store *s;
	const char *key;
	int ms;
	khor_status st;
	char val[64];
	char text[KERR_TEXT_MAX];
};

static void *get_in_thread(void *arg)
{
	struct getter *g = arg;
	void *v = NULL;
	size_t len;
	kerr err;

	kerr_clear(&err);
	g->st = store_get(g->s, g->key, kdeadline_in_ms(g->ms), &v, &len, &err);
	if (g->st == KHOR_SUCCESS)
		kstrlcpy(g->val, v, sizeof(g->val));
	kstrlcpy(g->text, err.text, sizeof(g->text));
	free(v);
	return NULL;
}

Test(etcd, restarted_within_a_get_deadline_the_wait_goes_on, .timeout = 40)
{
	uint16_t port = backend_start();
	store *s = case_connect(port);
	struct getter g = { s, "after", 15000, KHOR_ERR_INTERNAL, "", "" };
	pthread_t th;
	void *v;
	size_t len;
	int64_t n;
	kerr err;

	cr_assert_eq(store_set(s, "before", "kept", 4, &err), KHOR_SUCCESS, "%s", err.text);
	pthread_create(&th, NULL, get_in_thread, &g);
	sleep_ms(300);
	/* etcd dies under the waiting get, stays away a while, and comes back on its data. */
	etcd_kill(&the_etcd, SIGKILL);
	sleep_ms(500);
	etcd_restart(&the_etcd);
	store *other = case_connect(port);
	cr_assert_eq(store_set(other, "after", "back", 4, &err), KHOR_SUCCESS, "%s", err.text);
	pthread_join(th, NULL);
	cr_assert_eq(g.st, KHOR_SUCCESS, "%s", g.text);
	cr_assert_str_eq(g.val, "back");
	/* The first connection works on: what it set survived, and it can write. */
	cr_assert_eq(store_get(s, "before", kdeadline_in_ms(0), &v, &len, &err), KHOR_SUCCESS,
	             "%s", err.text);
	cr_assert_str_eq(v, "kept");
	free(v);
	cr_assert_eq(store_add(s, "n", 2, &n, &err), KHOR_SUCCESS, "%s", err.text);
	cr_assert_eq(n, 2);
	store_close(other);
	store_close(s);
	backend_stop();
}

Test(etcd, get_sees_a_key_deleted_and_set_again, .timeout = 30)
{
	uint16_t port = backend_start();
	store *s = case_connect(port), *w = case_connect(port);
	struct getter g = { s, "k", 10000, KHOR_ERR_INTERNAL, "", "" };
	pthread_t th;
	kerr err;

	/* The watch sees a put and a delete before the put that stays. */
	pthread_create(&th, NULL, get_in_thread, &g);
	sleep_ms(200);
	cr_assert_eq(store_set(w, "other", "x", 1, &err), KHOR_SUCCESS);
	cr_assert_eq(store_set(w, "k", "first", 5, &err), KHOR_SUCCESS);
	pthread_join(th, NULL);
	cr_assert_eq(g.st, KHOR_SUCCESS, "%s", g.text);
	cr_assert_str_eq(g.val, "first");
	cr_assert_eq(store_del(w, "k", &err), KHOR_SUCCESS);
	g.st = KHOR_ERR_INTERNAL;
	pthread_create(&th, NULL, get_in_thread, &g);
	sleep_ms(200);
	cr_assert_eq(store_set(w, "k", "second", 6, &err), KHOR_SUCCESS);
	pthread_join(th, NULL);
	cr_assert_eq(g.st, KHOR_SUCCESS, "%s", g.text);
	cr_assert_str_eq(g.val, "second");
	store_close(w);
	store_close(s);
	backend_stop();
}

/* --- a job ---------------------------------------------------------------------------- */

Test(etcd, allreduce_job_meets_through_etcd, .timeout = 60)
{
	enum { N = 3 };
	uint16_t port = backend_start();
	char addr[64], job[64], rank[8], key[96];
	pid_t pids[N];

	snprintf(addr, sizeof(addr), "etcd://127.0.0.1:%u", port);
	snprintf(job, sizeof(job), "etcd-job-%d", (int)getpid());
	for (int r = 0; r < N; r++) {
		pids[r] = fork();
		cr_assert_geq(pids[r], 0);
		if (pids[r] == 0) {
			int fd = open("/dev/null", O_WRONLY);
			if (fd >= 0)
				dup2(fd, 1);
			snprintf(rank, sizeof(rank), "%d", r);
			unsetenv("MASTER_ADDR");
			unsetenv("MASTER_PORT");
			setenv("KHOR_RANK", rank, 1);
			setenv("KHOR_SIZE", "3", 1);
			setenv("KHOR_STORE_ADDR", addr, 1);
			setenv("KHOR_JOB_ID", job, 1);
			setenv("KHOR_SECRET", "0123456789abcdef0123456789abcdef", 1);
			setenv("KHOR_TIMEOUT", "30s", 1);
			execl(KHOR_EXAMPLE_ALLREDUCE, KHOR_EXAMPLE_ALLREDUCE, (char *)NULL);
			_exit(127);
		}
	}
	for (int r = 0; r < N; r++) {
		int status;
		cr_assert_eq(waitpid(pids[r], &status, 0), pids[r]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		          "rank %d of the job over etcd: status 0x%x", r, status);
	}
	/* The ranks met in etcd: their init counters are there under the job's prefix. */
	etcd *e = open_etcd(port);
	struct etcd_kv kv;
	kerr err;
	for (int r = 0; r < N; r++) {
		snprintf(key, sizeof(key), "%s/0/inits/%d", job, r);
		cr_assert_eq(etcd_get(e, key, kdeadline_in_ms(5000), &kv, NULL, &err), KHOR_SUCCESS);
		expect_value(&kv, "1");
		etcd_kv_free(&kv);
	}
	etcd_close(e);
	backend_stop();
}

/* --- what is not etcd ----------------------------------------------------------------- */

/* An HTTP server that answers every request with the next canned reply (the last repeats),
 * then closes the connection. */
struct fake_http {
	int listen_fd;
	uint16_t port;
	const char *const *replies;
	size_t nreplies, served;
	pthread_t th;
};

static void fake_read_request(int fd)
{
	char buf[8192];
	size_t n = 0;
	long body = -1;

	for (;;) {
		ssize_t r = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
		if (r <= 0)
			return;
		n += (size_t)r;
		buf[n] = '\0';
		char *end = strstr(buf, "\r\n\r\n");
		if (end == NULL)
			continue;
		char *cl = strcasestr(buf, "Content-Length:");
		body = cl != NULL ? atol(cl + 15) : 0;
		size_t have = n - (size_t)(end + 4 - buf);
		while ((long)have < body) {
			r = recv(fd, buf, sizeof(buf), 0);
			if (r <= 0)
				return;
			have += (size_t)r;
		}
		return;
	}
}

static void *fake_http_main(void *arg)
{
	struct fake_http *f = arg;

	for (;;) {
		int fd = accept(f->listen_fd, NULL, NULL);
		if (fd < 0)
			return NULL;
		struct timeval tv = { 2, 0 };
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		fake_read_request(fd);
		size_t i = f->served < f->nreplies ? f->served : f->nreplies - 1;
		f->served++;
		(void)!send(fd, f->replies[i], strlen(f->replies[i]), MSG_NOSIGNAL);
		shutdown(fd, SHUT_WR);
		sleep_ms(20);
		close(fd);
	}
}

static void fake_start(struct fake_http *f, const char *const *replies, size_t n)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);

	memset(f, 0, sizeof(*f));
	f->replies = replies;
	f->nreplies = n;
	f->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(f->listen_fd, 16), 0);
	getsockname(f->listen_fd, (struct sockaddr *)&a, &al);
	f->port = ntohs(a.sin_port);
	pthread_create(&f->th, NULL, fake_http_main, f);
}

static void fake_stop(struct fake_http *f)
{
	shutdown(f->listen_fd, SHUT_RDWR);
	pthread_join(f->th, NULL);
	close(f->listen_fd);
}

/* Connects a store to a server that answers with reply; returns the status, err filled. */
static khor_status against(const char *reply, kerr *err)
{
	const char *replies[] = { reply };
	struct fake_http f;
	store *s = NULL;
	char where[64];

	fake_start(&f, replies, 1);
	kerr_clear(err);
	khor_status st = store_etcd_connect("127.0.0.1", f.port, kdeadline_in_ms(300), &s, err);
	fake_stop(&f);
	cr_assert_neq(st, KHOR_SUCCESS, "a store came up against: %s", reply);
	snprintf(where, sizeof(where), "etcd at 127.0.0.1:%u: connect 'status'", f.port);
	cr_assert(has(err->text, where), "%s", err->text);
	return st;
}

/* "HTTP/1.1 <status>" with body and its right Content-Length, in one of a few buffers. */
static const char *http_reply(const char *status, const char *body)
{
	static char bufs[4][1024];
	static int next;
	char *b = bufs[next++ % 4];

	snprintf(b, sizeof(bufs[0]), "HTTP/1.1 %s\r\nContent-Length: %zu\r\n\r\n%s", status,
	         strlen(body), body);
	return b;
}

#define STATUS_OK_BODY "{\"header\":{\"cluster_id\":\"1\",\"revision\":\"7\"},\"version\":\"3.4.23\"}"

Test(etcd, replies_that_are_not_etcds_are_errors, .timeout = 60)
{
	static char deep[400], long_header[20100];
	kerr err;

	cr_assert_eq(against("SSH-2.0-OpenSSH_9.6\r\n", &err), KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "not HTTP") && has(err.text, "SSH-2.0"), "%s", err.text);
	cr_assert_eq(against(http_reply("200 OK", "hello"), &err), KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "not etcd's JSON") && has(err.text, "hello"), "%s", err.text);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"hea", &err),
	             KHOR_ERR_REMOTE, "%s", err.text);
	cr_assert(has(err.text, "closed"), "%s", err.text);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "over the limit"), "%s", err.text);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "chunk size"), "%s", err.text);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	                     "3\r\n{}\n\r\n0\r\n\r\n",
	                     &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "no header"), "%s", err.text);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
	                     "Transfer-Encoding: chunked\r\n\r\n{}",
	                     &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert_eq(against("HTTP/1.1 2x0 OK\r\n\r\n", &err), KHOR_ERR_PROTOCOL);
	cr_assert_eq(against("HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", &err),
	             KHOR_ERR_PROTOCOL);
	/* Nested past the reader's depth. */
	int n = snprintf(deep, sizeof(deep), "HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n");
	memset(deep + n, '[', 100);
	memset(deep + n + 100, ']', 100);
	cr_assert_eq(against(deep, &err), KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "nested too deep"), "%s", err.text);
	/* A header line over the bound. */
	n = snprintf(long_header, sizeof(long_header), "HTTP/1.1 200 OK\r\nX-Junk: ");
	memset(long_header + n, 'j', 20000);
	memcpy(long_header + n + 20000, "\r\n\r\n", 5);
	cr_assert_eq(against(long_header, &err), KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "over 16384 bytes"), "%s", err.text);
	/* etcd's own refusal, its text passed on. */
	cr_assert_eq(against(http_reply("500 Internal Server Error",
	                                "{\"error\":\"etcdserver: mvcc: database space exceeded\","
	                                "\"message\":\"etcdserver: mvcc: database space exceeded\","
	                                "\"code\":8}"),
	                     &err),
	             KHOR_ERR_NO_MEMORY);
	cr_assert(has(err.text, "HTTP 500, code 8") && has(err.text, "database space exceeded"),
	          "%s", err.text);
	cr_assert_eq(against(http_reply("401 Unauthorized",
	                                "{\"error\":\"etcdserver: user name is empty\",\"code\":3}"),
	                     &err),
	             KHOR_ERR_INVALID_ARG);
	cr_assert(has(err.text, "user name is empty") && has(err.text, "authentication"), "%s",
	          err.text);
}

Test(etcd, a_bad_kv_in_a_reply_names_the_key, .timeout = 30)
{
	const char *replies[] = {
		http_reply("200 OK", STATUS_OK_BODY),
		http_reply("200 OK", "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"YQ==\","
		                     "\"value\":\"not base64!\"}],\"count\":\"1\"}"),
	};
	struct fake_http f;
	store *s = NULL;
	void *v;
	size_t len;
	kerr err;

	fake_start(&f, replies, 2);
	kerr_clear(&err);
	cr_assert_eq(store_etcd_connect("127.0.0.1", f.port, kdeadline_in_ms(2000), &s, &err),
	             KHOR_SUCCESS, "%s", err.text);
	store_set_prefix(s, JOB, 0);
	cr_assert_eq(store_get(s, "a", kdeadline_in_ms(1000), &v, &len, &err), KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "get 'job-test/0/a'") && has(err.text, "base64"), "%s", err.text);
	store_close(s);
	fake_stop(&f);
}

Test(etcd, addresses_that_are_not_an_etcd, .timeout = 30)
{
	store_server *srv = NULL;
	store *s = NULL;
	char addr[64];
	kerr err;

	kerr_clear(&err);
	cr_assert_eq(store_connect("etcd://no-port", "", JOB, kdeadline_in_ms(100), &s, &err),
	             KHOR_ERR_INVALID_ARG);
	cr_assert(has(err.text, "etcd://host:port"), "%s", err.text);
	/* Nobody on the port: retried until the deadline, then said so. */
	snprintf(addr, sizeof(addr), "etcd://127.0.0.1:%u", etcd_free_port());
	cr_assert_eq(store_connect(addr, "", JOB, kdeadline_in_ms(300), &s, &err),
	             KHOR_ERR_REMOTE);
	cr_assert(has(err.text, "cannot reach etcd") && has(err.text, "refused"), "%s", err.text);
	/* A khor store where etcd was meant. */
	cr_assert_eq(store_server_start("127.0.0.1", 0, "", JOB, &srv, &err), KHOR_SUCCESS);
	snprintf(addr, sizeof(addr), "etcd://127.0.0.1:%u", store_server_port(srv));
	cr_assert_eq(store_connect(addr, "", JOB, kdeadline_in_ms(2000), &s, &err),
	             KHOR_ERR_PROTOCOL);
	cr_assert(has(err.text, "not HTTP"), "%s", err.text);
	store_server_stop(srv);
}

/* --- the JSON reader ------------------------------------------------------------------ */

static bool parses(const char *text, json_doc *d, struct json_tok *tok, int max)
{
	char why[128];

	return json_parse(text, strlen(text), tok, max, d, why, sizeof(why));
}

Test(json, strict_grammar)
{
	static const char *const good[] = {
		"{}", "[]", " {\"a\" : [1, -2.5e+3, true, false, null, \"\"]} \n", "0", "-0.1",
		"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"", "[[[]]]", "{\"a\":{\"b\":{}}}",
	};
	static const char *const bad[] = {
		"", " ", "{", "}", "[1,]", "[,1]", "{\"a\":}", "{\"a\" 1}", "{a:1}", "{\"a\":1,}",
		"[1 2]", "01", "1.", ".5", "-", "1e", "+1", "tru", "nul", "\"abc", "\"a\\x\"",
		"\"a\\u12g4\"", "\"a\nb\"", "{} {}", "[1]]", "\"\\u12\"", "NaN", "[\"a\"\"b\"]",
	};
	struct json_tok tok[64];
	json_doc d;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert(parses(good[i], &d, tok, 64), "refused: %s", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert(!parses(bad[i], &d, tok, 64), "accepted: %s", bad[i]);
	/* Depth and token bounds. */
	char deep[200];
	memset(deep, '[', 40);
	memset(deep + 40, ']', 40);
	deep[80] = '\0';
	cr_assert(!parses(deep, &d, tok, 64));
	cr_assert(!parses("[1,2,3,4,5,6,7,8]", &d, tok, 8));
	cr_assert(parses("[1,2,3,4,5,6,7]", &d, tok, 8));
}

Test(json, lookups_and_values)
{
	const char *text = "{\"header\":{\"revision\":\"42\"},\"kvs\":[{\"key\":\"YQ==\","
	                   "\"value\":\"aGVsbG8=\",\"mod_revision\":\"9223372036854775807\"},"
	                   "{\"value\":\"\"}],\"big\":\"9223372036854775808\",\"n\":-7,"
	                   "\"f\":1.5,\"ok\":true,\"s\":\"\\u00e9\\n\\ud83d\\ude00\\ud800x\"}";
	struct json_tok tok[64];
	json_doc d;
	int64_t v;
	bool b;
	uint8_t *bytes;
	size_t len;
	char s[32];

	cr_assert(parses(text, &d, tok, 64));
	cr_assert(json_i64(&d, json_member(&d, json_member(&d, 0, "header"), "revision"), &v));
	cr_assert_eq(v, 42);
	int kvs = json_member(&d, 0, "kvs"), first = json_first(&d, kvs);
	cr_assert(json_b64(&d, json_member(&d, first, "value"), &bytes, &len));
	cr_assert_eq(len, 5);
	cr_assert_str_eq((char *)bytes, "hello");
	free(bytes);
	cr_assert(json_i64(&d, json_member(&d, first, "mod_revision"), &v));
	cr_assert_eq(v, INT64_MAX);
	int second = json_after(&d, kvs, first);
	cr_assert_geq(second, 0);
	cr_assert_eq(json_after(&d, kvs, second), -1);
	cr_assert(json_b64(&d, json_member(&d, second, "value"), &bytes, &len));
	cr_assert_eq(len, 0);
	free(bytes);
	cr_assert(!json_i64(&d, json_member(&d, 0, "big"), &v), "int64 overflow accepted");
	cr_assert(json_i64(&d, json_member(&d, 0, "n"), &v));
	cr_assert_eq(v, -7);
	cr_assert(!json_i64(&d, json_member(&d, 0, "f"), &v));
	cr_assert(json_bool(&d, json_member(&d, 0, "ok"), &b) && b);
	cr_assert(!json_bool(&d, json_member(&d, 0, "n"), &b));
	cr_assert_eq(json_member(&d, 0, "absent"), -1);
	cr_assert_eq(json_member(&d, kvs, "key"), -1, "an array has no members");
	cr_assert(json_str(&d, json_member(&d, 0, "s"), s, sizeof(s)));
	cr_assert_str_eq(s, "\xc3\xa9\n\xf0\x9f\x98\x80\xef\xbf\xbdx");
	cr_assert(json_str(&d, json_member(&d, 0, "s"), s, 3)); /* cut short, terminated */
	cr_assert_eq(strlen(s), 2);

	static const char *const bad_b64[] = { "\"aGVsbG8\"", "\"a===\"", "\"aGV=bG8=\"",
	                                       "\"aGVsbG8*\"", "\"====\"" };
	for (size_t i = 0; i < sizeof(bad_b64) / sizeof(bad_b64[0]); i++) {
		cr_assert(parses(bad_b64[i], &d, tok, 64));
		cr_assert(!json_b64(&d, 0, &bytes, &len), "accepted %s", bad_b64[i]);
	}
	char enc[16];
	json_b64_encode("hello", 5, enc);
	cr_assert_str_eq(enc, "aGVsbG8=");
	json_b64_encode("hi", 2, enc);
	cr_assert_str_eq(enc, "aGk=");
	cr_assert_eq(json_b64_len(5), 8);
}

/* Every prefix and every one-byte change of a real reply: refused or read, never a crash. */
Test(json, mangled_replies_never_crash)
{
	const char *reply = "{\"header\":{\"cluster_id\":\"15118495548433857066\",\"revision\":"
	                    "\"2\"},\"kvs\":[{\"key\":\"YQ==\",\"create_revision\":\"2\","
	                    "\"mod_revision\":\"2\",\"version\":\"1\",\"value\":\"MQ==\"}],"
	                    "\"count\":\"1\"}";
	size_t n = strlen(reply);
	char buf[512];
	struct json_tok tok[64];
	json_doc d;
	char why[128];
	static const char swaps[] = "\"{}[],:\\0a-e\x01\xff ";

	for (size_t cut = 0; cut < n; cut++)
		cr_assert(!json_parse(reply, cut, tok, 64, &d, why, sizeof(why)), "prefix %zu", cut);
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < sizeof(swaps) - 1; k++) {
			memcpy(buf, reply, n);
			buf[i] = swaps[k];
			if (!json_parse(buf, n, tok, 64, &d, why, sizeof(why)))
				continue;
			int kvs = json_member(&d, 0, "kvs");
			for (int kv = json_first(&d, kvs); kv >= 0; kv = json_after(&d, kvs, kv)) {
				uint8_t *bytes;
				size_t len;
				int64_t v;
				if (json_b64(&d, json_member(&d, kv, "value"), &bytes, &len))
					free(bytes);
				json_i64(&d, json_member(&d, kv, "mod_revision"), &v);
			}
		}
	}
}
