/*
 * test_elastic_plan.c -- the elastic driver's rules alone (launcher/elastic_plan.c), with
 * the examples Horovod's own tests and docs give: a discovery script's lines, the order of
 * hosts that come and go, get_host_assignments' ranks, the blacklist's cooldown doubling
 * within its range, the reset limit, who is kept, started or dropped, and the plan text
 * the C core reads.
 */
#include <criterion/criterion.h>

#include "launcher/elastic_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ep_list parse_ok(const char *text, int def)
{
	struct ep_list l;
	char why[256];

	cr_assert(ep_parse_hosts(text, strlen(text), def, &l, why, sizeof(why)), "%s: %s", text,
	          why);
	return l;
}

static void parse_bad(const char *text, const char *want)
{
	struct ep_list l = { 0 };
	char why[256] = "";

	cr_assert_not(ep_parse_hosts(text, strlen(text), 1, &l, why, sizeof(why)),
	              "'%s' was taken", text);
	cr_assert_not_null(strstr(why, want), "'%s': %s", text, why);
	cr_assert_eq(l.n, 0);
}

Test(elastic_plan, discovery_lines)
{
	struct ep_list l = parse_ok("node1:4\n\n  node2  \r\nnode3:2\nnode1:4\n", 3);

	cr_assert_eq(l.n, 3);
	cr_assert_str_eq(l.h[0].name, "node1");
	cr_assert_eq(l.h[0].slots, 4);
	cr_assert_str_eq(l.h[1].name, "node2");
	cr_assert_eq(l.h[1].slots, 3, "no slots: --slots-per-host");
	cr_assert_eq(l.h[2].slots, 2);
	ep_list_free(&l);
	/* A host listed twice keeps its place and takes its last slots. */
	l = parse_ok("a:1\nb:1\na:5", 1);
	cr_assert_eq(l.n, 2);
	cr_assert_str_eq(l.h[0].name, "a");
	cr_assert_eq(l.h[0].slots, 5);
	ep_list_free(&l);
	/* Nothing listed is an empty list, not an error (no host is ready yet). */
	l = parse_ok("\n  \n", 1);
	cr_assert_eq(l.n, 0);
	ep_list_free(&l);
	parse_bad("node1:x\n", "want a number");
	parse_bad("node1:-1\n", "from 0 to");
	parse_bad("node1:\n", "not a number");
	parse_bad(":3\n", "no host name");
	parse_bad("node 1:3\n", "is not a host name");
	parse_bad("-oProxyCommand=x\n", "is not a host name");
}

/*
 * A NUL in the script's output after a host's slots ("host1:0", NUL, NUL, "@") is junk
 * after the number, refused as any other: strtol stopped at the NUL, so "4", NUL, "junk"
 * was taken as 4. Found by tests/launcher/fuzz_config.c (its input is in
 * tests/launcher/fuzz_corpus/config).
 */
Test(elastic_plan, a_nul_after_the_slots_is_refused)
{
	const char text[] = "host1:0\0\0@\nnode2:3\n";
	struct ep_list l = { 0 };
	char why[256] = "";

	cr_assert_not(ep_parse_hosts(text, sizeof(text) - 1, 1, &l, why, sizeof(why)),
	              "slots with a NUL in them were taken");
	cr_assert_not_null(strstr(why, "want a number"), "%s", why);
	cr_assert_eq(l.n, 0);
	/* The same line without the junk is fine. */
	cr_assert(ep_parse_hosts(text, 7, 1, &l, why, sizeof(why)), "%s", why);
	cr_assert_eq(l.n, 1);
	cr_assert_eq(l.h[0].slots, 0);
	ep_list_free(&l);
}

static struct ep_state state(int min, int max, const char *hosts, int64_t now)
{
	struct ep_state st;
	struct ep_list l = parse_ok(hosts, 1);

	ep_init(&st, min, max, 0, 0, -1);
	cr_assert_eq(ep_update(&st, &l, now), (int)EP_ADDED);
	ep_list_free(&l);
	return st;
}

static int update(struct ep_state *st, const char *hosts, int64_t now)
{
	struct ep_list l = parse_ok(hosts, 1);
	int flags = ep_update(st, &l, now);

	ep_list_free(&l);
	return flags;
}

static const char *order(const struct ep_state *st)
{
	static char buf[256];
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < st->norder; i++)
		off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%s", i ? "," : "",
		                        st->hosts[st->order[i]].name);
	return buf;
}

Test(elastic_plan, hosts_keep_their_order_and_new_ones_come_last)
{
	struct ep_state st = state(1, 0, "a:2\nb:2\n", 0);

	cr_assert_str_eq(order(&st), "a,b");
	cr_assert_eq(update(&st, "b:2\na:2\n", 1), 0, "the same hosts in another order: no change");
	cr_assert_eq(update(&st, "c:2\nb:2\na:2\n", 2), (int)EP_ADDED);
	cr_assert_str_eq(order(&st), "a,b,c");
	cr_assert_eq(update(&st, "c:2\na:2\n", 3), (int)EP_REMOVED);
	cr_assert_str_eq(order(&st), "a,c");
	cr_assert_eq(update(&st, "c:2\na:2\nb:2\n", 4), (int)EP_ADDED);
	cr_assert_str_eq(order(&st), "a,c,b", "a host that comes back comes back last");
	cr_assert_eq(update(&st, "c:1\na:3\nb:2\n", 5), (int)(EP_ADDED | EP_REMOVED),
	             "slots added on one host and taken on another");
	cr_assert_eq(ep_available_slots(&st), 6);
	ep_free(&st);
}

/* Horovod's get_host_assignments: host by host, local rank = slot, cross ranks by host. */
Test(elastic_plan, assignment)
{
	struct ep_state st = state(1, 5, "a:2\nb:3\nc:2\n", 0);
	struct ep_slot s[8];
	int n = ep_assign(&st, s, 8);
	const int host[] = { 0, 0, 1, 1, 1 }, local[] = { 0, 1, 0, 1, 2 },
		  lsize[] = { 2, 2, 3, 3, 3 }, xrank[] = { 0, 0, 1, 1, 0 },
		  xsize[] = { 2, 2, 2, 2, 1 };

	cr_assert_eq(n, 5, "--max-np 5 stops the filling");
	for (int r = 0; r < n; r++) {
		cr_assert_eq(s[r].rank, r);
		cr_assert_eq(s[r].host, host[r], "rank %d", r);
		cr_assert_eq(s[r].local_rank, local[r], "rank %d", r);
		cr_assert_eq(s[r].local_size, lsize[r], "rank %d", r);
		cr_assert_eq(s[r].cross_rank, xrank[r], "rank %d", r);
		cr_assert_eq(s[r].cross_size, xsize[r], "rank %d", r);
	}
	cr_assert_eq(ep_count_hosts(s, n), 2);
	cr_assert_eq(ep_assign(&st, s, 3), -1, "too little room is said, not overrun");
	st.max_np = 0;
	cr_assert_eq(ep_assign(&st, s, 8), 7, "no --max-np: every slot");
	ep_free(&st);
}

Test(elastic_plan, blacklist_without_cooldown_is_for_good)
{
	struct ep_state st = state(1, 0, "a:2\nb:2\n", 0);

	cr_assert_eq(ep_blacklist(&st, 1, 10, 0.5), -1);
	cr_assert_str_eq(order(&st), "a");
	cr_assert_eq(update(&st, "a:2\nb:2\n", 1000000), 0, "b stays out however long");
	cr_assert_str_eq(order(&st), "a");
	ep_free(&st);
}

Test(elastic_plan, cooldown_doubles_within_its_range)
{
	struct ep_state st = state(1, 0, "a:1\nb:1\n", 0);

	st.cool_min_ms = 10000;
	st.cool_max_ms = 100000;
	/* min * 2^k + rnd * min, within [min, max] (Horovod's HostState._set_cooldown_period) */
	cr_assert_eq(ep_blacklist(&st, 1, 0, 0.0), 20000);
	cr_assert_eq(ep_blacklist(&st, 1, 5000, 0.9), 0,
	             "a second failure in the cooldown: no change");
	cr_assert_eq(update(&st, "a:1\nb:1\n", 19999), 0, "not yet");
	cr_assert_str_eq(order(&st), "a");
	cr_assert_eq(update(&st, "a:1\nb:1\n", 20000), (int)EP_ADDED, "back after its cooldown");
	cr_assert_str_eq(order(&st), "a,b");
	cr_assert_not(st.hosts[1].blacklisted);
	cr_assert_eq(ep_blacklist(&st, 1, 30000, 0.5), 45000, "2nd time: 10 s * 4 + 5 s");
	cr_assert_eq(update(&st, "a:1\nb:1\n", 75000), (int)EP_ADDED);
	cr_assert_eq(ep_blacklist(&st, 1, 80000, 0.5), 85000,
	             "3rd time: 10 s * 8 + 5 s = 85 s");
	cr_assert_eq(update(&st, "a:1\nb:1\n", 180000), (int)EP_ADDED);
	cr_assert_eq(ep_blacklist(&st, 1, 200000, 0.5), 100000, "4th: 165 s, cut to the max");
	/* A host that cooled down but is not listed stays out until it is. */
	cr_assert_eq(update(&st, "a:1\n", 400000), (int)EP_REMOVED);
	cr_assert(st.hosts[1].blacklisted);
	cr_assert_eq(update(&st, "a:1\nb:1\n", 400001), (int)EP_ADDED);
	cr_assert_not(st.hosts[1].blacklisted);
	ep_free(&st);
}

Test(elastic_plan, shortage_names_slots_and_blacklist)
{
	struct ep_state st = state(2, 0, "localhost:1\n127.0.0.1:1\nnode3:1\n", 0);
	char buf[512];

	st.cool_min_ms = 5000;
	st.cool_max_ms = 60000;
	(void)ep_blacklist(&st, 2, 0, 0.4); /* 12 s */
	ep_exclude(&st, 1);
	ep_describe_shortage(&st, 2, 1000, buf, sizeof(buf));
	cr_assert_str_eq(buf, "1 slot available (localhost:1), 2 needed; blacklisted: 127.0.0.1 "
	                      "(for good), node3 (for 11 s more)");
	ep_free(&st);
}

Test(elastic_plan, reset_limit)
{
	struct ep_state st;

	ep_init(&st, 1, 0, 0, 0, 2);
	cr_assert(ep_take_reset(&st));
	cr_assert(ep_take_reset(&st));
	cr_assert_not(ep_take_reset(&st), "the third reset exceeds --reset-limit 2");
	ep_init(&st, 1, 0, 0, 0, -1);
	for (int i = 0; i < 1000; i++)
		cr_assert(ep_take_reset(&st));
	ep_free(&st);
}

Test(elastic_plan, survivors_keep_their_slot_new_ones_start_the_rest_drop)
{
	struct ep_state st = state(1, 0, "a:2\nb:2\nc:1\n", 0);
	struct ep_slot s[8];
	/* Running: a:0, a:1, b:0, b:1, c:0; b fails and is blacklisted. */
	struct ep_worker w[] = { { 0, 0 }, { 0, 1 }, { 1, 0 }, { 1, 1 }, { 2, 0 } };
	int keep[8], n;
	bool drop[5];

	(void)ep_blacklist(&st, 1, 0, 0);
	n = ep_assign(&st, s, 8);
	cr_assert_eq(n, 3);
	ep_match(s, n, w, 4 /* b:1 was the one lost */, keep, drop);
	cr_assert_eq(keep[0], 0);
	cr_assert_eq(keep[1], 1);
	cr_assert_eq(keep[2], -1, "c:0 was not given as running: a fresh worker");
	cr_assert_not(drop[0]);
	cr_assert_not(drop[1]);
	cr_assert(drop[2], "b:0, on the blacklisted host, is dropped");
	cr_assert(drop[3]);
	ep_match(s, n, w, 5, keep, drop);
	cr_assert_eq(keep[2], 4, "c:0 running: it stays, as rank 2");
	cr_assert_eq(s[2].local_rank, 0);
	ep_free(&st);
}

Test(elastic_plan, host_checks)
{
	struct ep_slot a[] = { { .host = 0 }, { .host = 1 } }, b[] = { { .host = 2 } },
		       c[] = { { .host = 1, .local_rank = 0 }, { .host = 2 } };

	cr_assert(ep_keeps_a_host(NULL, 0, b, 1), "the first generation has nothing to keep");
	cr_assert_not(ep_keeps_a_host(a, 2, b, 1));
	cr_assert(ep_keeps_a_host(a, 2, c, 2));
	cr_assert(ep_same_assignment(a, 2, a, 2));
	cr_assert_not(ep_same_assignment(a, 2, c, 2));
	cr_assert_not(ep_same_assignment(a, 2, a, 1));
}

Test(elastic_plan, plan_text)
{
	struct ep_state st = state(1, 0, "node1:2\nnode2:2\n", 0);
	struct ep_slot s[4];
	char *drops[] = { "node3:0" };
	int n = ep_assign(&st, s, 4);
	char *t = ep_plan_text(&st, 3, s, n, drops, 1), buf[64];

	cr_assert_str_eq(t, "khor-plan 1\n"
	                    "gen 3\n"
	                    "size 4\n"
	                    "rank 0 node1:0 node1 0 2 0 2\n"
	                    "rank 1 node1:1 node1 1 2 0 2\n"
	                    "rank 2 node2:0 node2 0 2 1 2\n"
	                    "rank 3 node2:1 node2 1 2 1 2\n"
	                    "drop node3:0\n");
	free(t);
	ep_describe_slots(&st, s, n, buf, sizeof(buf));
	cr_assert_str_eq(buf, "node1:2, node2:2");
	ep_free(&st);
}

Test(elastic_plan, a_loss_blacklists_on_several_hosts_and_restarts_on_one)
{
	struct ep_state st = state(1, 0, "a:2\nb:1\n", 0);
	struct ep_slot s[4];
	int n = ep_assign(&st, s, 4);
	uint64_t rnd = 1;
	int64_t cd = 7;
	char tail[160];

	cr_assert_eq(n, 3);
	cr_assert_not(ep_all_blacklisted(&st, s, n));
	cr_assert_eq(ep_lose(&st, s, n, 1, false, 0, &rnd, &cd, tail, sizeof(tail)),
	             EP_LOSS_BLACKLISTED);
	cr_assert_eq(cd, -1, "no cooldown range: for good");
	cr_assert_str_eq(tail, "; host b blacklisted");
	cr_assert(st.hosts[1].blacklisted);
	cr_assert_eq(ep_lose(&st, s, n, 1, false, 0, &rnd, &cd, tail, sizeof(tail)),
	             EP_LOSS_ALREADY);
	cr_assert_str_eq(tail, "; host b is blacklisted already");
	cr_assert_not(ep_all_blacklisted(&st, s, n), "a is still in");
	/* On one host a fresh worker takes the slot, unless none can start there at all. */
	cr_assert_eq(ep_lose(&st, s, 2, 0, false, 0, &rnd, &cd, tail, sizeof(tail)),
	             EP_LOSS_FRESH);
	cr_assert_str_eq(tail, "; a fresh worker takes its slot");
	cr_assert_not(st.hosts[0].blacklisted);
	st.cool_min_ms = 1000;
	st.cool_max_ms = 60000;
	cr_assert_eq(ep_lose(&st, s, 2, 0, true, 0, &rnd, &cd, tail, sizeof(tail)),
	             EP_LOSS_BLACKLISTED);
	cr_assert(cd >= 2000 && cd < 3000, "1 s * 2 + a draw of 1 s: %lld", (long long)cd);
	cr_assert(ep_all_blacklisted(&st, s, n));
	cr_assert_not(ep_all_blacklisted(&st, s, 0), "no generation: not its end");
	ep_free(&st);
}

Test(elastic_plan, draws_are_in_the_unit_interval)
{
	uint64_t rnd = 12345;

	for (int i = 0; i < 1000; i++) {
		double d = ep_draw(&rnd);

		cr_assert(d >= 0.0 && d < 1.0, "%f", d);
	}
}

Test(elastic_plan, a_stalled_heartbeat_is_told_after_its_timeout)
{
	int64_t hb = 0, at = 0, gen_beat = 0, hb2 = 0, at2 = 0;

	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, NULL, 100, 1000), 0, "not joined yet");
	cr_assert_eq(ep_heartbeat(&hb2, &at2, &gen_beat, NULL, 5000, 1000), 0,
	             "no rank has beaten: all may still be joining");
	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, "1", 6000, 1000), 0);
	cr_assert_eq(gen_beat, 6000);
	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, "2", 6900, 1000), 0);
	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, "2", 7900, 1000), 0, "exactly the timeout");
	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, "2", 8000, 1000), 1100);
	cr_assert_eq(ep_heartbeat(&hb2, &at2, &gen_beat, NULL, 7500, 1000), 1500,
	             "one never beaten since another beat has stalled too");
	cr_assert_eq(ep_heartbeat(&hb, &at, &gen_beat, NULL, 90000, 1000), 0,
	             "beat, then gone: finalized, not stalled");
}

Test(elastic_plan, a_survivor_that_does_not_join_is_told_after_its_timeout)
{
	int64_t hb = 5, at = 1000; /* the plan at 1000, its count 5 in the generation it left */

	cr_assert_eq(ep_join_stall(&hb, &at, "6", 1500, 1000), 0, "still training there");
	cr_assert_eq(at, 1500);
	cr_assert_eq(ep_join_stall(&hb, &at, NULL, 2500, 1000), 0, "finalized, exactly the timeout");
	cr_assert_eq(ep_join_stall(&hb, &at, NULL, 2600, 1000), 1100,
	             "neither beating there nor joined here: stopped between generations");
	cr_assert_eq(hb, 6);
}

Test(elastic_plan, waiting_for_slots_ends_at_the_timeout)
{
	struct ep_state st = state(2, 0, "a:1\n", 0);
	int64_t since = -1;
	char buf[1400];

	cr_assert_eq(ep_wait_slots(&st, 3, 2, &since, 1000, 5000, buf, sizeof(buf)),
	             EP_WAIT_BEGUN);
	cr_assert_eq(since, 1000);
	cr_assert_str_eq(buf, "elastic: generation 3 waits for 2 slots: 1 slot available (a:1), "
	                      "2 needed (at most 5 s, --elastic-timeout)");
	cr_assert_eq(ep_wait_slots(&st, 3, 2, &since, 5999, 5000, buf, sizeof(buf)), EP_WAIT_ON);
	cr_assert_eq(ep_wait_slots(&st, 3, 2, &since, 6000, 5000, buf, sizeof(buf)),
	             EP_WAIT_OVER);
	cr_assert_str_eq(buf, "elastic: timed out after 5 s (--elastic-timeout) waiting for the "
	                      "slots of generation 3: 1 slot available (a:1), 2 needed");
	ep_free(&st);
}

Test(elastic_plan, an_update_is_told_only_when_ranks_would_move)
{
	struct ep_state st = state(1, 2, "a:1\nb:1\n", 0);
	struct ep_slot s[4];
	int n = ep_assign(&st, s, 4);
	char slots[128], words[32];

	cr_assert_eq(update(&st, "a:1\nb:1\nc:1\n", 10), (int)EP_ADDED);
	cr_assert_eq(ep_update_moves(&st, s, n, slots, sizeof(slots)), 0, "c is past --max-np");
	cr_assert_eq(update(&st, "a:1\nc:1\n", 20), (int)EP_REMOVED);
	cr_assert_eq(ep_update_moves(&st, s, n, slots, sizeof(slots)), 1);
	cr_assert_str_eq(slots, "a:1, c:1");
	cr_assert_eq(ep_update_moves(&st, s, n, NULL, 0), 1);
	ep_update_words(EP_ADDED | EP_REMOVED, words, sizeof(words));
	cr_assert_str_eq(words, "added,removed");
	ep_update_words(EP_REMOVED, words, sizeof(words));
	cr_assert_str_eq(words, "removed");
	ep_free(&st);
}

Test(elastic_plan, the_texts_the_drivers_say)
{
	struct ep_state st = state(1, 0, "a:2\nb:1\n", 0);
	struct ep_slot s[4];
	int n = ep_assign(&st, s, 4);
	char buf[256];

	ep_describe_gen(&st, 2, s, n, buf, sizeof(buf));
	cr_assert_str_eq(buf, "generation 2: 3 ranks on 2 hosts (a:2, b:1)");
	ep_lost_text(buf, sizeof(buf), 4, 2, "b", "b:0", "exited with status 1");
	cr_assert_str_eq(buf, "rank 2 on b (worker b:0) was lost in generation 4: exited with "
	                      "status 1");
	ep_want_text(buf, sizeof(buf), 4, -1, NULL, NULL, NULL);
	cr_assert_str_eq(buf, "generation 4 ended: a rank asked for a new one");
	ep_fence_text(buf, sizeof(buf), 3200, 3000, "khorrun", 0);
	cr_assert_str_eq(buf, "its heartbeat stopped for 3.2 s (KHOR_HEARTBEAT_TIMEOUT 3.0 s); "
	                      "khorrun killed it");
	ep_fence_text(buf, sizeof(buf), 3200, 3000, "khorrun", 4);
	cr_assert_str_eq(buf, "its heartbeat stopped for 3.2 s since it left generation 4, and it "
	                      "has not joined generation 5 (KHOR_HEARTBEAT_TIMEOUT 3.0 s); "
	                      "khorrun killed it");
	ep_free(&st);
}
