/*
 * test_base.c -- the base layer: strict parsers, deadlines, HMAC proofs, address parsing,
 * the choice of addresses to publish and to dial (on made-up interface tables), and error
 * sentences, and the intrusive list.
 */
#include "base/auth.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/list.h"
#include "base/parse.h"
#include "base/sock.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct item {
	int v;
	klist node;
};

static int list_values(klist *head, int *out, int max)
{
	int n = 0;
	for (klist *p = head->next; p != head && n < max; p = p->next)
		out[n++] = KLIST_ENTRY(p, struct item, node)->v;
	return n;
}

Test(list, order_unlink_and_safe_walk)
{
	klist head = KLIST_INIT(head);
	struct item it[5];
	int got[8];

	cr_assert(klist_empty(&head) && klist_first(&head) == NULL);
	for (int i = 0; i < 5; i++) {
		it[i].v = i;
		klist_init(&it[i].node);
		cr_assert(!klist_linked(&it[i].node));
	}
	klist_add_tail(&head, &it[1].node);
	klist_add_tail(&head, &it[2].node);
	klist_add_head(&head, &it[0].node);
	klist_add_tail(&head, &it[3].node);
	cr_assert_eq(list_values(&head, got, 8), 4);
	cr_assert(got[0] == 0 && got[1] == 1 && got[2] == 2 && got[3] == 3);

	klist_del(&it[2].node); /* the middle */
	klist_del(&it[2].node); /* again: a node on no list stays as it is */
	cr_assert(!klist_linked(&it[2].node));
	klist_del(&it[0].node); /* the first */
	cr_assert_eq(list_values(&head, got, 8), 2);
	cr_assert(got[0] == 1 && got[1] == 3);
	cr_assert_eq(KLIST_ENTRY(klist_first(&head), struct item, node), &it[1]);

	klist *n, *tmp;
	int seen = 0;
	KLIST_FOREACH_SAFE(n, tmp, &head) {
		klist_del(n);
		seen++;
	}
	cr_assert_eq(seen, 2);
	cr_assert(klist_empty(&head));
}

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

/* NCCL_SOCKET_IFNAME's "^=name": exact names excluded, where "^" alone excludes prefixes. */
Test(sock, pick_address_excludes_exact_names)
{
	ksockaddr a;
	char first[64], ifn[64], spec[80];
	kerr e;
	if (ksock_pick_address("^lo", NULL, &a, first, sizeof(first), &e) != KHOR_SUCCESS)
		cr_skip_test("no interface but lo is up: %s", e.text);
	snprintf(spec, sizeof(spec), "^=%s", first);
	khor_status st = ksock_pick_address(spec, NULL, &a, ifn, sizeof(ifn), &e);
	cr_assert(st != KHOR_SUCCESS || strcmp(ifn, first) != 0, "%s picked %s", spec, ifn);
	/* Exact: a name of which first is a longer form excludes nothing here. */
	snprintf(spec, sizeof(spec), "^=%.*s", (int)strlen(first) - 1, first);
	cr_assert_eq(ksock_pick_address(spec, NULL, &a, ifn, sizeof(ifn), &e), KHOR_SUCCESS, "%s",
	             e.text);
	snprintf(spec, sizeof(spec), "^=lo,%s", first);
	st = ksock_pick_address(spec, NULL, &a, ifn, sizeof(ifn), &e);
	cr_assert(st != KHOR_SUCCESS || (strcmp(ifn, first) != 0 && strcmp(ifn, "lo") != 0),
	          "%s picked %s", spec, ifn);
}

/* An interface table as ksock_list_ifaces would give it. */
static ksock_iface iface(const char *name, const char *ip, int prefix)
{
	ksock_iface f;
	kerr e;

	memset(&f, 0, sizeof(f));
	kstrlcpy(f.name, name, sizeof(f.name));
	cr_assert_eq(ksock_resolve(ip, 0, &f.addr, &e), KHOR_SUCCESS, "%s", e.text);
	f.prefix = prefix;
	f.loopback = ksock_addr_is_loopback(&f.addr);
	f.running = true;
	return f;
}

static ksockaddr addr(const char *ip)
{
	ksockaddr a;
	kerr e;

	cr_assert_eq(ksock_resolve(ip, 0, &a, &e), KHOR_SUCCESS, "%s", e.text);
	return a;
}

Test(sock, address_lists)
{
	ksockaddr a[4];
	char s[64];

	cr_assert_eq(ksock_parse_addr_list("198.19.10.2:4100", a, 4), 1);
	cr_assert_str_eq(ksock_addr_str(&a[0], s, sizeof(s)), "198.19.10.2:4100");
	cr_assert_eq(ksock_parse_addr_list("198.19.10.2:4100,10.0.0.2:4100,[fd00::2]:7", a, 4), 3);
	cr_assert_str_eq(ksock_addr_str(&a[1], s, sizeof(s)), "10.0.0.2:4100");
	cr_assert_str_eq(ksock_addr_str(&a[2], s, sizeof(s)), "[fd00::2]:7");
	cr_assert_eq(ksock_parse_addr_list("1.1.1.1:1,2.2.2.2:2,3.3.3.3:3", a, 2), 2,
	             "entries past max are dropped, not written");
	const char *bad[] = { "", ",", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:5,", ",1.2.3.4:5",
		              "1.2.3.4:70000", "host:80", "fd00::2:7", "[1.2.3.4]:5",
		              "1.2.3.4:5,,6.7.8.9:1", "1.2.3.4:5 " };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(ksock_parse_addr_list(bad[i], a, 4), -1, "'%s' was accepted", bad[i]);
	cr_assert_eq(ksock_parse_addr_list(NULL, a, 4), -1);
	/* An entry longer than any address (a store value is the peer's to write). */
	char longone[300];
	memset(longone, '1', sizeof(longone) - 1);
	longone[sizeof(longone) - 1] = '\0';
	longone[200] = ':';
	cr_assert_eq(ksock_parse_addr_list(longone, a, 4), -1, "a 299-byte entry was accepted");
}

Test(sock, subnets)
{
	ksockaddr x = addr("198.19.10.7"), y = addr("198.19.10.1"), z = addr("198.19.11.1");
	ksockaddr v6 = addr("fd00::7"), w6 = addr("fd00::1:1");
	char s[64];

	cr_assert(ksock_same_subnet(&x, &y, 24));
	cr_assert(!ksock_same_subnet(&x, &y, 32));
	cr_assert(!ksock_same_subnet(&x, &z, 24));
	cr_assert(ksock_same_subnet(&x, &z, 22));
	cr_assert(ksock_same_subnet(&x, &z, 0));
	cr_assert(!ksock_same_subnet(&x, &v6, 0), "families never match");
	cr_assert(!ksock_same_subnet(&x, &y, -1), "an unknown prefix never matches");
	cr_assert(ksock_same_subnet(&v6, &w6, 64) && !ksock_same_subnet(&v6, &w6, 112));
	cr_assert(ksock_same_ip(&x, &x) && !ksock_same_ip(&x, &y));
	cr_assert_str_eq(ksock_subnet_str(&x, 24, s, sizeof(s)), "198.19.10.0/24");
	cr_assert_str_eq(ksock_subnet_str(&x, 21, s, sizeof(s)), "198.19.8.0/21");
	cr_assert_str_eq(ksock_subnet_str(&w6, 64, s, sizeof(s)), "fd00::/64");
	cr_assert(ksock_is_virtual_ifname("docker0") && ksock_is_virtual_ifname("br-3f2a9c1d0e11") &&
	          ksock_is_virtual_ifname("virbr0") && ksock_is_virtual_ifname("veth12ab"));
	cr_assert(!ksock_is_virtual_ifname("eth0") && !ksock_is_virtual_ifname("ens5") &&
	          !ksock_is_virtual_ifname("enp129s0f1") && !ksock_is_virtual_ifname("br0") &&
	          !ksock_is_virtual_ifname("ib0"));
}

Test(sock, a_store_named_loopback_is_not_proof_of_one_host)
{
	ksockaddr lo = addr("127.0.0.1"), lo1 = addr("127.0.1.1"), real = addr("198.19.10.1");
	ksockaddr lo6 = addr("::1");

	cr_assert(ksock_store_is_local_only("127.0.0.1", &lo));
	cr_assert(ksock_store_is_local_only("localhost", &lo));
	cr_assert(ksock_store_is_local_only("::1", &lo6));
	cr_assert(!ksock_store_is_local_only("node1", &lo1), "Debian's own-name 127.0.1.1");
	cr_assert(!ksock_store_is_local_only("198.19.10.1", &real));
	cr_assert(!ksock_store_is_local_only("node1", &real));
}

/* The names of the chosen interfaces, comma-separated. */
static const char *chosen(const ksock_iface *ifs, int n, const ksockaddr *hint)
{
	static char out[256];
	int idx[KSOCK_MAX_CANDS], k = ksock_order_candidates(ifs, n, hint, idx, KSOCK_MAX_CANDS);
	size_t off = 0;

	out[0] = '\0';
	for (int i = 0; i < k; i++)
		off += (size_t)snprintf(out + off, sizeof(out) - off, "%s%s", i ? "," : "",
		                        ifs[idx[i]].name);
	return out;
}

Test(sock, candidates_to_publish)
{
	/* A management NIC first (the lowest index), a container bridge, the fast NIC. */
	ksock_iface ifs[] = { iface("lo", "127.0.0.1", 8), iface("eno1", "198.19.20.1", 24),
		              iface("docker0", "172.17.0.1", 16), iface("eth0", "198.19.10.1", 24),
		              iface("eth0", "fd00::1", 64), iface("eth0:1", "198.19.10.1", 24) };
	int n = sizeof(ifs) / sizeof(ifs[0]);
	ksockaddr store = addr("198.19.10.9"), lo = addr("127.0.0.1"), far = addr("10.9.9.9");
	ksockaddr v6 = addr("fd00::9"), dock = addr("172.17.0.5");

	cr_assert_str_eq(chosen(ifs, n, &store), "eth0,eno1", "the store's subnet first, an "
	                 "address once, no container bridge, no loopback, one family");
	cr_assert_str_eq(chosen(ifs, n, &far), "eno1,eth0", "a routed store: interface order");
	cr_assert_str_eq(chosen(ifs, n, NULL), "eno1,eth0");
	cr_assert_str_eq(chosen(ifs, n, &lo), "lo", "a loopback store: the job is on this host");
	cr_assert_str_eq(chosen(ifs, n, &v6), "eth0", "a v6 store: v6 addresses");
	cr_assert_str_eq(chosen(ifs, n, &dock), "docker0,eno1,eth0",
	                 "a store on the bridge's own subnet: the bridge first");
	ksock_iface only_virtual[] = { iface("lo", "127.0.0.1", 8),
		                       iface("docker0", "172.17.0.1", 16) };
	cr_assert_str_eq(chosen(only_virtual, 2, &far), "docker0", "a bridge beats nothing");
	cr_assert_str_eq(chosen(only_virtual, 1, &far), "lo", "loopback only when alone");
	cr_assert_str_eq(chosen(ifs + 4, 1, &far), "eth0", "no v4 address: v6 rather than none");
	ksock_iface unplugged[] = { iface("eth0", "198.19.30.1", 24),
		                    iface("eth1", "198.19.31.1", 24) };
	unplugged[0].running = false;
	cr_assert_str_eq(chosen(unplugged, 2, &far), "eth1", "no carrier: not published");
	cr_assert_str_eq(chosen(unplugged, 1, &far), "eth0", "unless there is nothing else");
	ksockaddr on0 = addr("198.19.30.7");
	cr_assert_str_eq(chosen(unplugged, 2, &on0), "eth0,eth1", "the store's subnet first, "
	                 "whatever its carrier says");
	cr_assert_str_eq(chosen(ifs, 0, &far), "");
}

/* The peer's addresses in dialing order, as "index:kind" pairs. */
static const char *dial_order(const ksockaddr *peer, int n, const ksock_iface *mine, int nmine)
{
	static char out[128];
	int order[KSOCK_MAX_CANDS], via[KSOCK_MAX_CANDS];
	enum ksock_reach kind[KSOCK_MAX_CANDS];
	size_t off = 0;

	ksock_order_peer(peer, n, mine, nmine, order, kind, via);
	out[0] = '\0';
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(out + off, sizeof(out) - off, "%s%d:%d", i ? "," : "",
		                        order[i], (int)kind[i]);
	return out;
}

Test(sock, peer_addresses_in_dialing_order)
{
	ksock_iface mine[] = { iface("lo", "127.0.0.1", 8), iface("eno1", "198.19.20.1", 24),
		               iface("ens5", "198.19.0.9", 16), iface("eth0", "198.19.10.1", 24) };
	int nm = sizeof(mine) / sizeof(mine[0]);
	ksockaddr both[] = { addr("198.19.20.3"), addr("198.19.10.3") };
	ksockaddr routed_first[] = { addr("10.5.5.5"), addr("198.19.10.3") };
	ksockaddr own_first[] = { addr("198.19.20.1"), addr("198.19.10.3") };
	ksockaddr all_own[] = { addr("198.19.10.1"), addr("198.19.20.1") };
	int order[2], via[2];
	enum ksock_reach kind[2];

	cr_assert_str_eq(dial_order(both, 2, mine, nm), "0:1,1:1", "both on our subnets: the "
	                 "peer's order");
	cr_assert_str_eq(dial_order(routed_first, 2, mine, nm), "1:1,0:2");
	cr_assert_str_eq(dial_order(own_first, 2, mine, nm), "1:1,0:3",
	                 "an address that is also ours reaches us, not the peer: last");
	cr_assert_str_eq(dial_order(all_own, 2, mine, nm), "0:0,1:0", "same host: as published");
	cr_assert_str_eq(dial_order(both, 2, mine, 0), "0:2,1:2", "no interfaces known: as given");
	ksock_order_peer(both + 1, 1, mine, nm, order, kind, via);
	cr_assert_eq(via[0], 3, "the narrowest subnet that holds it (eth0 /24, not ens5 /16)");
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
