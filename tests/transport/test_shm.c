/*
 * test_shm.c -- what only the shared-memory transport does, between real processes (two
 * ranks forked per case: pair.h): it refuses another job's rank and another host's
 * address, wakes a rank asleep in progress when a message comes, lets small messages
 * overtake a 64 MiB one, and leaves nothing behind (no /dev/shm entry, no memfd, no
 * socket), also after kill -9. The contract shm shares with every transport (tag order,
 * mismatches, dead peers, strangers) is test_contract.c's.
 */
#include "pair.h"

#include "transport/shm/shm.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- strangers ----------------------------------------------------------------------- */

static void wrong_job_connector(struct rank_env *env)
{
	const struct transport_ops *tp = env->tp;
	tp_options o = { .rank = 0, .size = 2, .job_id = "some-other-job", .secret = "test-secret",
	                 .handshake_timeout_ms = 5000 };
	tp_ctx *other;
	tp_link *l;
	kerr e;
	kdeadline dl = kdeadline_in_ms(10000);

	while (!atomic_load(&env->b->ready[1]))
		CHECK(!kdeadline_passed(dl), "rank 1 never published its address");
	CHECK(tp->create(&o, &other, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(tp->connect(other, 1, env->b->addr[1], &l, &e) == KHOR_SUCCESS, "%s", e.text);
	while (pair_link_error(tp, l)->status == KHOR_SUCCESS) {
		CHECK(!kdeadline_passed(dl), "the stranger was neither refused nor accepted");
		tp->progress(other, 5, NULL, &e);
	}
	CHECK(strstr(pair_link_error(tp, l)->text, "job id differs") != NULL, "%s",
	      pair_link_error(tp, l)->text);
	tp->destroy(other);
	/* An address of another host is refused before anything is sent. */
	CHECK(tp->connect(env->ctx, 1, "shm:00000000-0000-0000-0000-000000000000:x", &l, &e) ==
	              KHOR_ERR_INVALID_ARG && strstr(e.text, "another host") != NULL, "%s", e.text);
	CHECK(tp->connect(env->ctx, 1, "tcp:1.2.3.4:5", &l, &e) == KHOR_ERR_PROTOCOL, "%s", e.text);
	atomic_store(&env->b->phase[0], 1);
}

static void wrong_job_acceptor(struct rank_env *env)
{
	tp_link *l;
	kerr e;

	while (atomic_load(&env->b->phase[0]) == 0)
		env->tp->progress(env->ctx, 5, NULL, &e);
	CHECK(env->tp->accept(env->ctx, 0, &l, &e) == KHOR_SUCCESS && l == NULL,
	      "a stranger became rank 0's link");
}

Test(shm, other_job_and_other_host_are_refused, .timeout = 30)
{
	struct job j = pair_job(&shm_transport_ops, NULL, wrong_job_connector, wrong_job_acceptor);
	j.no_link = true;
	pair_run(&j);
}

/* ---- shm only: wake-ups and fairness ------------------------------------------------- */

static void late_sender(struct rank_env *env)
{
	uint32_t x = 42;
	tp_req *s;
	kerr e;
	tp_tag t = { 7, 1, 0, 0 };

	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &e);
	usleep(200000); /* rank 1 is asleep in progress(5000) by now */
	CHECK(env->tp->isend(env->link, &x, 4, t, NULL, &s, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
}

static void sleeper(struct rank_env *env)
{
	uint32_t y = 0;
	tp_req *r;
	kerr e;
	tp_tag t = { 7, 1, 0, 0 };

	CHECK(env->tp->irecv(env->link, &y, 4, t, NULL, &r, &e) == KHOR_SUCCESS, "%s", e.text);
	atomic_store(&env->b->phase[1], 1);
	uint64_t t0 = kclock_ns();
	bool done = false;
	while (!done) {
		CHECK(env->tp->progress(env->ctx, 5000, NULL, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(env->tp->test(r, &done, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK((kclock_ns() - t0) / 1000000 < 3000, "not woken: the doorbell was lost");
	}
	CHECK(y == 42, "payload");
}

Test(shm, a_rank_asleep_in_progress_is_woken_by_the_sender, .timeout = 30)
{
	struct job j = pair_job(&shm_transport_ops, NULL, late_sender, sleeper);
	pair_run(&j);
}

static void fair_sender(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *big = malloc(len), small[128];
	tp_req *sb, *ss[8];
	kerr e;

	pair_fill(big, len, 3);
	pair_fill(small, sizeof(small), 4);
	tp_tag tb = { 8, 0, 0, 0 };
	CHECK(env->tp->isend(env->link, big, len, tb, NULL, &sb, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < 8; i++) {
		tp_tag t = { 8, 1, (uint32_t)i, 0 };
		CHECK(env->tp->isend(env->link, small, sizeof(small), t, NULL, &ss[i], &e) ==
		              KHOR_SUCCESS, "%s", e.text);
	}
	for (int i = 0; i < 8; i++)
		CHECK(pair_wait(env, ss[i], 0, &e) == KHOR_SUCCESS, "%s", e.text);
	CHECK(pair_wait(env, sb, 0, &e) == KHOR_SUCCESS, "%s", e.text);
	free(big);
}

static void fair_receiver(struct rank_env *env)
{
	size_t len = 64u << 20;
	uint8_t *big = malloc(len), small[8][128];
	tp_req *rb, *rs[8];
	bool big_done = false, small_done[8] = { false };
	int nsmall = 0, small_before_big = 0;
	kerr e;

	tp_tag tb = { 8, 0, 0, 0 };
	CHECK(env->tp->irecv(env->link, big, len, tb, NULL, &rb, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < 8; i++) {
		tp_tag t = { 8, 1, (uint32_t)i, 0 };
		CHECK(env->tp->irecv(env->link, small[i], 128, t, NULL, &rs[i], &e) == KHOR_SUCCESS,
		      "%s", e.text);
	}
	kdeadline dl = kdeadline_in_ms(30000);
	while (!big_done || nsmall < 8) {
		CHECK(!kdeadline_passed(dl), "transfers did not finish");
		env->tp->progress(env->ctx, 0, NULL, &e);
		for (int i = 0; i < 8; i++) {
			if (!small_done[i]) {
				CHECK(env->tp->test(rs[i], &small_done[i], &e) == KHOR_SUCCESS, "%s", e.text);
				if (small_done[i]) {
					nsmall++;
					small_before_big += !big_done;
					CHECK(pair_check_fill(small[i], 128, 4), "small message %d corrupted", i);
				}
			}
		}
		if (!big_done)
			CHECK(env->tp->test(rb, &big_done, &e) == KHOR_SUCCESS, "%s", e.text);
	}
	CHECK(pair_check_fill(big, len, 3), "big message corrupted");
	CHECK(small_before_big == 8, "only %d of 8 small messages overtook the 64 MiB one",
	      small_before_big);
	free(big);
}

Test(shm, small_messages_overtake_a_64MiB_one, .timeout = 60)
{
	for (int cma = 0; cma < 2; cma++) {
		struct job j = pair_job(&shm_transport_ops, cma ? "1" : "0", fair_sender, fair_receiver);
		pair_run(&j);
	}
}

/*
 * Two comms share the link, and one of them runs ahead: rank 0 sends 40 small and 8 large
 * messages on comm 20 that rank 1 will receive only later, then one on comm 30, which rank
 * 1 waits for first. The early ones are more than the ring holds (3.5 MiB against 1 MiB),
 * so the receiver must take them out of the ring (bounded), or comm 30's message never
 * gets in and the two wait on each other for ever. Then every early message arrives
 * intact, received in reverse order.
 */
#define EARLY_SMALL 40
#define EARLY_LARGE 8
#define LARGE_LEN (1u << 20)

static void early_sender(struct rank_env *env)
{
	static uint8_t small[EARLY_SMALL][64 << 10], large[EARLY_LARGE][LARGE_LEN], last[4096];
	tp_req *rs[EARLY_SMALL], *rl[EARLY_LARGE], *rb;
	kerr e;

	for (int i = 0; i < EARLY_SMALL; i++) {
		tp_tag t = { 20, 0, (uint32_t)i, 0 };
		pair_fill(small[i], sizeof(small[i]), 100 + (uint32_t)i);
		CHECK(env->tp->isend(env->link, small[i], sizeof(small[i]), t, NULL, &rs[i], &e) ==
		      KHOR_SUCCESS, "%s", e.text);
	}
	for (int i = 0; i < EARLY_LARGE; i++) {
		tp_tag t = { 20, 1, (uint32_t)i, 0 };
		pair_fill(large[i], LARGE_LEN, 200 + (uint32_t)i);
		CHECK(env->tp->isend(env->link, large[i], LARGE_LEN, t, NULL, &rl[i], &e) ==
		      KHOR_SUCCESS, "%s", e.text);
	}
	tp_tag tb = { 30, 0, 0, 0 };
	pair_fill(last, sizeof(last), 300);
	CHECK(env->tp->isend(env->link, last, sizeof(last), tb, NULL, &rb, &e) == KHOR_SUCCESS,
	      "%s", e.text);
	CHECK(pair_wait(env, rb, 0, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < EARLY_SMALL; i++)
		CHECK(pair_wait(env, rs[i], 0, &e) == KHOR_SUCCESS, "%s", e.text);
	for (int i = 0; i < EARLY_LARGE; i++)
		CHECK(pair_wait(env, rl[i], 0, &e) == KHOR_SUCCESS, "%s", e.text);
}

static void early_receiver(struct rank_env *env)
{
	static uint8_t small[64 << 10], large[LARGE_LEN], last[4096];
	tp_req *r;
	kerr e;

	tp_tag tb = { 30, 0, 0, 0 };
	CHECK(env->tp->irecv(env->link, last, sizeof(last), tb, NULL, &r, &e) == KHOR_SUCCESS,
	      "%s", e.text);
	kdeadline dl = kdeadline_in_ms(10000);
	for (bool done = false; !done;) {
		CHECK(!kdeadline_passed(dl), "comm 30's message never came: it waits behind comm "
		      "20's early ones in a full ring");
		CHECK(env->tp->progress(env->ctx, 1, NULL, &e) == KHOR_SUCCESS, "%s", e.text);
		CHECK(env->tp->test(r, &done, &e) == KHOR_SUCCESS, "%s", e.text);
	}
	CHECK(pair_check_fill(last, sizeof(last), 300), "comm 30's message corrupted");
	for (int i = EARLY_LARGE - 1; i >= 0; i--) {
		tp_tag t = { 20, 1, (uint32_t)i, 0 };
		CHECK(env->tp->irecv(env->link, large, LARGE_LEN, t, NULL, &r, &e) == KHOR_SUCCESS,
		      "%s", e.text);
		CHECK(pair_wait(env, r, 0, &e) == KHOR_SUCCESS, "large %d: %s", i, e.text);
		CHECK(pair_check_fill(large, LARGE_LEN, 200 + (uint32_t)i), "large %d corrupted", i);
	}
	for (int i = EARLY_SMALL - 1; i >= 0; i--) {
		tp_tag t = { 20, 0, (uint32_t)i, 0 };
		CHECK(env->tp->irecv(env->link, small, sizeof(small), t, NULL, &r, &e) ==
		      KHOR_SUCCESS, "%s", e.text);
		CHECK(pair_wait(env, r, 0, &e) == KHOR_SUCCESS, "small %d: %s", i, e.text);
		CHECK(pair_check_fill(small, sizeof(small), 100 + (uint32_t)i), "small %d corrupted",
		      i);
	}
}

Test(shm, one_comm_running_ahead_does_not_block_another, .timeout = 60)
{
	for (int cma = 0; cma < 2; cma++) {
		struct job j = pair_job(&shm_transport_ops, cma ? "1" : "0", early_sender,
		                        early_receiver);
		pair_run(&j);
	}
}

/* ---- shm only: nothing left behind --------------------------------------------------- */

static void list_dir(const char *path, char *out, size_t len)
{
	DIR *d = opendir(path);
	struct dirent *de;

	out[0] = '\0';
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		strncat(out, de->d_name, len - strlen(out) - 2);
		strncat(out, "\n", len - strlen(out) - 1);
	}
	if (d != NULL)
		closedir(d);
}

/* Abstract sockets named after one of the ranks still exist in this network namespace? */
static bool rank_socket_left(const struct board *b)
{
	char line[512], pat[64];
	FILE *f = fopen("/proc/net/unix", "r");
	bool found = false;

	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		for (int r = 0; r < 2; r++) {
			snprintf(pat, sizeof(pat), "@khor-shm.");
			char *p = strstr(line, pat);
			snprintf(pat, sizeof(pat), ".%d.%d.", r, atomic_load(&b->pid[r]));
			if (p != NULL && strstr(p, pat) != NULL)
				found = true;
		}
	}
	if (f != NULL)
		fclose(f);
	return found;
}

static void linked_no_fd_a(struct rank_env *env)
{
	int fds, maps;
	uint8_t buf[1000];
	tp_req *s;
	kerr e;
	tp_tag t = { 10, 0, 0, 0 };

	/* Once the link is up the memory lives on in the mappings only. */
	pair_count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 1, "while linked: %d memfd fds, %d maps", fds, maps);
	pair_fill(buf, sizeof(buf), 10);
	CHECK(env->tp->isend(env->link, buf, sizeof(buf), t, NULL, &s, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(pair_wait(env, s, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	while (atomic_load(&env->b->phase[1]) == 0)
		env->tp->progress(env->ctx, 1, NULL, &e);
}

static void linked_no_fd_b(struct rank_env *env)
{
	int fds, maps;
	uint8_t buf[1000];
	tp_req *r;
	kerr e;
	tp_tag t = { 10, 0, 0, 0 };

	CHECK(env->tp->irecv(env->link, buf, sizeof(buf), t, NULL, &r, &e) == KHOR_SUCCESS, "%s",
	      e.text);
	CHECK(pair_wait(env, r, 1, &e) == KHOR_SUCCESS, "%s", e.text);
	pair_count_memfd(&fds, &maps);
	CHECK(fds == 0 && maps == 1, "while linked: %d memfd fds, %d maps", fds, maps);
	atomic_store(&env->b->phase[1], 1);
}

static void victim_linking(struct rank_env *env)
{
	env->link = pair_link_up(env, env->ctx);
	atomic_store(&env->b->phase[0], 1);
	pair_stream_forever(env);
}

/* Links up if the victim lives long enough, then receives until the link breaks. */
static void survivor_after_kill(struct rank_env *env)
{
	kerr e;
	kdeadline dl = kdeadline_in_ms(20000);
	uint8_t *y;

	while (env->link == NULL) {
		uint64_t killed = atomic_load(&env->b->killed_at_ns);
		if (killed != 0 && kclock_ns() - killed > 2000000000ull)
			return; /* it died before the link came up */
		CHECK(!kdeadline_passed(dl), "neither linked nor killed");
		env->tp->progress(env->ctx, 5, NULL, &e);
		CHECK(env->tp->accept(env->ctx, 0, &env->link, &e) == KHOR_SUCCESS, "%s", e.text);
	}
	y = malloc(64u << 20);
	for (uint32_t i = 0;; i++) {
		tp_req *r;
		tp_tag t = { 5, i, 0, 0 };
		khor_status st = env->tp->irecv(env->link, y, 64u << 20, t, NULL, &r, &e);
		if (st == KHOR_SUCCESS)
			st = pair_wait(env, r, 100, &e);
		if (st != KHOR_SUCCESS)
			break;
	}
	free(y);
	/* rank_main destroys the ctx and checks that no memfd fd or mapping is left. */
}

Test(shm, nothing_is_left_behind_even_after_kill_9, .timeout = 120)
{
	char before[8192], after[8192];

	list_dir("/dev/shm", before, sizeof(before));
	/* A clean job. */
	struct job j = pair_job(&shm_transport_ops, NULL, linked_no_fd_a, linked_no_fd_b);
	struct board *b = pair_run(&j);
	cr_assert(!rank_socket_left(b), "an abstract socket of the job is still listed");
	/* Kills at several moments: before or while linking, then in the middle of a transfer
	 * (phase 1: linked; phase n + 1: n messages sent). */
	static const int when[][2] = { { 0, 0 }, { 0, 3 }, { 1, 0 }, { 2, 1 }, { 3, 5 } };
	for (size_t k = 0; k < sizeof(when) / sizeof(when[0]); k++) {
		for (int cma = 0; cma < 2; cma++) {
			j = pair_job(&shm_transport_ops, cma ? "1" : "0", victim_linking,
			           survivor_after_kill);
			j.no_link = true;
			j.kill_rank = 0;
			j.kill_phase = when[k][0];
			j.kill_delay_ms = when[k][1];
			b = pair_run(&j);
			cr_assert(!rank_socket_left(b), "an abstract socket of the job is still listed");
		}
	}
	list_dir("/dev/shm", after, sizeof(after));
	cr_assert_str_eq(after, before, "/dev/shm changed: before '%s', after '%s'", before, after);
}
