/*
 * test_base.c -- the base layer: strict parsers, deadlines, HMAC proofs, address parsing
 * and error sentences.
 */
#include "../../base/auth.h"
#include "../../base/clock.h"
#include "../../base/err.h"
#include "../../base/parse.h"
#include "../../base/sock.h"

#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

Test(parse, sizes)
{
	uint64_t v;
	cr_assert(kparse_size("0", &v) && v == 0);
	cr_assert(kparse_size("64", &v) && v == 64);
	cr_assert(kparse_size("8K", &v) && v == 8192);
	cr_assert(kparse_size("64M", &v) && v == 64ull << 20);
	cr_assert(kparse_size("1G", &v) && v == 1ull << 30);
	cr_assert(kparse_size("4KiB", &v) && v == 4096);
	cr_assert(kparse_size("2kb", &v) && v == 2048);
	cr_assert(!kparse_size("", &v));
	cr_assert(!kparse_size("-1", &v));
	cr_assert(!kparse_size("12Q", &v));
	cr_assert(!kparse_size("1.5M", &v));
	cr_assert(!kparse_size("99999999999999999999", &v));
	cr_assert(!kparse_size("20000000000G", &v), "overflow must be refused");
}

Test(parse, durations_and_ints)
{
	int64_t v;
	cr_assert(kparse_duration_ms("30", &v) && v == 30000);
	cr_assert(kparse_duration_ms("30s", &v) && v == 30000);
	cr_assert(kparse_duration_ms("500ms", &v) && v == 500);
	cr_assert(kparse_duration_ms("2m", &v) && v == 120000);
	cr_assert(kparse_duration_ms("-1", &v) && v == -1);
	cr_assert(kparse_duration_ms("inf", &v) && v == -1);
	cr_assert(!kparse_duration_ms("5 s", &v));
	cr_assert(!kparse_duration_ms("s", &v));
	cr_assert(kparse_i64("-42", &v) && v == -42);
	cr_assert(!kparse_i64("42x", &v));
	cr_assert(!kparse_i64("", &v));
	bool b;
	cr_assert(kparse_bool("yes", &b) && b);
	cr_assert(kparse_bool("0", &b) && !b);
	cr_assert(!kparse_bool("maybe", &b));
}

Test(clock, deadlines)
{
	kdeadline never = kdeadline_in_ms(-1), soon = kdeadline_in_ms(30);
	cr_assert(!kdeadline_passed(never));
	cr_assert_eq(kdeadline_left_ms(never, 77), 77);
	cr_assert(!kdeadline_passed(soon));
	cr_assert(kdeadline_left_ms(soon, 1000) <= 30);
	struct timespec ts = { 0, 40 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	cr_assert(kdeadline_passed(soon));
	cr_assert_eq(kdeadline_left_ms(soon, 1000), 0);
}

Test(auth, hmac_known_answer_and_binding)
{
	/* RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?". */
	static const uint8_t want[32] = {
		0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
		0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43
	};
	uint8_t mac[32], mac2[32];
	cr_assert(kauth_mac("Jefe", 4, "what do ya ", "want for ", 9, "nothing?", 8, mac));
	cr_assert(kauth_equal(mac, want, 32));
	/* The label is part of the proof: an acceptor's MAC is not a connector's. */
	cr_assert(kauth_mac("Jefe", 4, "label-a", "x", 1, NULL, 0, mac));
	cr_assert(kauth_mac("Jefe", 4, "label-b", "x", 1, NULL, 0, mac2));
	cr_assert(!kauth_equal(mac, mac2, 32));
	/* An empty key still works (unauthenticated jobs). */
	cr_assert(kauth_mac("", 0, "l", "x", 1, NULL, 0, mac));
	char s1[65], s2[65];
	cr_assert(kauth_new_secret(s1) && kauth_new_secret(s2));
	cr_assert_eq(strlen(s1), 64);
	cr_assert(strcmp(s1, s2) != 0);
}

Test(sock, host_port_split)
{
	char h[256];
	uint16_t p;
	cr_assert(ksock_split_hostport("127.0.0.1:29500", h, sizeof(h), &p));
	cr_assert_str_eq(h, "127.0.0.1");
	cr_assert_eq(p, 29500);
	cr_assert(ksock_split_hostport("[::1]:80", h, sizeof(h), &p));
	cr_assert_str_eq(h, "::1");
	cr_assert(!ksock_split_hostport("nohost", h, sizeof(h), &p));
	cr_assert(!ksock_split_hostport(":80", h, sizeof(h), &p));
	cr_assert(!ksock_split_hostport("h:99999", h, sizeof(h), &p));
	cr_assert(!ksock_split_hostport("h:80x", h, sizeof(h), &p));
	cr_assert(!ksock_split_hostport("[::1]80", h, sizeof(h), &p));
}

Test(sock, pick_address_by_prefix_exclusion_and_cidr)
{
	ksockaddr a;
	char ifn[64], s[64];
	kerr e;
	cr_assert_eq(ksock_pick_address("lo", NULL, &a, ifn, sizeof(ifn), &e), KHOR_SUCCESS);
	cr_assert_str_eq(ifn, "lo");
	cr_assert_eq(ksock_pick_address("=lo", NULL, &a, ifn, sizeof(ifn), &e), KHOR_SUCCESS);
	cr_assert_eq(ksock_pick_address("127.0.0.0/8", NULL, &a, ifn, sizeof(ifn), &e), KHOR_SUCCESS);
	cr_assert(strncmp(ksock_addr_str(&a, s, sizeof(s)), "127.", 4) == 0);
	cr_assert_eq(ksock_pick_address("198.18.0.0/15", NULL, &a, ifn, sizeof(ifn), &e),
	             KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "interfaces that are up") != NULL, "%s", e.text);
	/* With a loopback hint and no spec, loopback wins. */
	ksockaddr hint;
	cr_assert_eq(ksock_resolve("127.0.0.1", 1, &hint, &e), KHOR_SUCCESS);
	cr_assert_eq(ksock_pick_address(NULL, &hint, &a, ifn, sizeof(ifn), &e), KHOR_SUCCESS);
	cr_assert(ksock_addr_is_loopback(&a));
}

Test(err, sentences_and_prefixes)
{
	kerr e;
	kerr_clear(&e);
	cr_assert_eq(kerr_set(&e, KHOR_ERR_REMOTE, "peer rank %d closed", 3), KHOR_ERR_REMOTE);
	kerr_prefix(&e, "allreduce seq %d", 9);
	cr_assert_str_eq(e.text, "allreduce seq 9: peer rank 3 closed");
	char big[3000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	kerr_set(&e, KHOR_ERR_SYSTEM, "%s", big);
	cr_assert_eq(strlen(e.text), KERR_TEXT_MAX - 1);
	kerr_prefix(&e, "p");
	cr_assert_eq(strlen(e.text), KERR_TEXT_MAX - 1);
}
