/*
 * test_handshake.c -- the shared link handshake (transport/handshake.h) as pure functions,
 * without sockets: a full exchange, every refusal of a doctored HELLO, wrong secrets on
 * either side, a replayed proof, a HELLO for another transport, bad magic. The transports'
 * own tests (test_tcp, test_shm) and the contract they share (test_contract) run the same
 * checks over real sockets.
 */
#include "transport/handshake.h"

#include <criterion/criterion.h>
#include <string.h>

/* Rank `rank` of a 4-rank job "hs-test" of transport tp with secret sec. */
static hs_self self_of(uint16_t tp, int rank, const char *sec)
{
	hs_self s = { .transport = tp, .version = 7, .rank = rank, .size = 4,
	              .name = tp == HS_TP_TCP ? "tcp" : "shm", .secret = sec,
	              .secret_len = strlen(sec) };
	kstrlcpy(s.job_id, "hs-test", sizeof(s.job_id));
	return s;
}

static const uint64_t aux4[4] = { 1, 2, 3, 4 };

/* The acceptor's side of one HELLO: check it and, if accepted, challenge it. */
static uint32_t accept_hello(const hs_self *acc, const hs_hello *sent, hs_hello *got,
                             uint8_t nonce_s[KAUTH_NONCE_LEN], hs_challenge *c)
{
	uint32_t st;

	*got = *sent; /* the bytes as they arrived */
	st = hs_hello_check(acc, got);
	if (st == HS_OK)
		hs_challenge_make(acc, got, 99, nonce_s, c);
	else
		hs_refusal(st, c);
	return st;
}

Test(handshake, full_exchange_succeeds_and_carries_aux)
{
	hs_self con = self_of(HS_TP_TCP, 0, "s3cret"), acc = self_of(HS_TP_TCP, 2, "s3cret");
	hs_hello h, got;
	hs_challenge c;
	hs_proof p;
	hs_result r;
	uint8_t ns[KAUTH_NONCE_LEN];
	kerr e;

	hs_hello_make(&con, 2, aux4, &h);
	cr_assert_eq(h.magic, HS_MAGIC);
	cr_assert_eq(h.from_rank, 0);
	cr_assert_eq(h.to_rank, 2);
	cr_assert_str_eq(h.job_id, "hs-test");
	cr_assert_eq(memcmp(h.aux, aux4, sizeof(aux4)), 0);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns, &c), HS_OK);
	cr_assert_eq(c.aux, 99);
	cr_assert_eq(memcmp(c.nonce_s, ns, sizeof(ns)), 0);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 5, &p, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(p.aux, 5);
	cr_assert(hs_proof_check(&acc, &got, ns, &p));
	hs_result_make(HS_OK, 1, &r);
	cr_assert_eq(hs_result_check(&r, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(r.aux, 1);

	/* Without a secret the exchange works too (the MAC only proves the peer speaks khor). */
	con = self_of(HS_TP_SHM, 1, "");
	acc = self_of(HS_TP_SHM, 0, "");
	hs_hello_make(&con, 0, aux4, &h);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns, &c), HS_OK);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(hs_proof_check(&acc, &got, ns, &p));
}

/* hs_hello_check of a HELLO doctored by fix; the refusal's sentence at the connector. */
static void expect_refusal(void (*fix)(hs_hello *), uint32_t want, const char *words)
{
	hs_self con = self_of(HS_TP_TCP, 1, "k"), acc = self_of(HS_TP_TCP, 3, "k");
	hs_hello h, got;
	hs_challenge c;
	hs_proof p;
	uint8_t ns[KAUTH_NONCE_LEN];
	kerr e;

	hs_hello_make(&con, 3, aux4, &h);
	fix(&h);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns, &c), want, "status %u, wanted %u",
	             hs_hello_check(&acc, &got), want);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_ERR_PROTOCOL, "%s", e.text);
	cr_assert(strstr(e.text, "handshake refused by the peer: ") != NULL, "%s", e.text);
	cr_assert(strstr(e.text, words) != NULL, "%s", e.text);
	cr_assert_str_eq(hs_status_str(want), e.text + strlen("handshake refused by the peer: "));
}

static void other_transport(hs_hello *h) { h->transport = HS_TP_IB; }
static void other_version(hs_hello *h) { h->version = 6; }
static void other_job(hs_hello *h) { kstrlcpy(h->job_id, "other-job", sizeof(h->job_id)); }
static void other_target(hs_hello *h) { h->to_rank = 2; }
static void from_too_high(hs_hello *h) { h->from_rank = 4; }
static void from_negative(hs_hello *h) { h->from_rank = -1; }
static void from_self(hs_hello *h) { h->from_rank = 3; }

Test(handshake, doctored_hellos_are_refused_with_their_reason)
{
	expect_refusal(other_transport, HS_BAD_TRANSPORT, "another transport");
	expect_refusal(other_version, HS_BAD_VERSION, "version differs");
	expect_refusal(other_job, HS_BAD_JOB, "job id differs");
	expect_refusal(other_target, HS_BAD_TARGET, "another rank");
	expect_refusal(from_too_high, HS_BAD_TARGET, "another rank");
	expect_refusal(from_negative, HS_BAD_TARGET, "another rank");
	expect_refusal(from_self, HS_BAD_TARGET, "another rank");
}

Test(handshake, a_hello_for_shm_is_refused_by_tcp)
{
	hs_self shm = self_of(HS_TP_SHM, 0, "k"), tcp = self_of(HS_TP_TCP, 1, "k");
	hs_hello h;

	hs_hello_make(&shm, 1, aux4, &h);
	cr_assert_eq(hs_hello_check(&tcp, &h), HS_BAD_TRANSPORT);
	/* Even if the number were forged, the MAC labels differ: tcp's challenge fails at shm. */
	hs_challenge c;
	hs_proof p;
	uint8_t ns[KAUTH_NONCE_LEN];
	kerr e;
	h.transport = HS_TP_TCP;
	tcp.version = shm.version;
	cr_assert_eq(hs_hello_check(&tcp, &h), HS_OK);
	hs_challenge_make(&tcp, &h, 0, ns, &c);
	h.transport = HS_TP_SHM;
	cr_assert_eq(hs_challenge_check(&shm, &h, &c, 0, &p, &e), KHOR_ERR_AUTH);
}

Test(handshake, bad_magic_is_not_khor_and_gets_no_answer)
{
	hs_self acc = self_of(HS_TP_TCP, 0, "k"), con = self_of(HS_TP_TCP, 1, "k");
	hs_hello h;
	hs_challenge c;
	hs_result r;
	hs_proof p;
	kerr e;

	memset(&h, 0xff, sizeof(h));
	cr_assert_eq(hs_hello_check(&acc, &h), HS_NOT_KHOR);
	cr_assert_geq(HS_NOT_KHOR, HS_STATUS_COUNT, "never a status that is sent");

	/* Our magic but garbage inside: a refusal, and the job id is made printable. */
	h.magic = HS_MAGIC;
	cr_assert_neq(hs_hello_check(&acc, &h), HS_OK);
	cr_assert_eq(strlen(h.job_id), HS_JOB_MAX - 1);
	for (size_t i = 0; i < strlen(h.job_id); i++)
		cr_assert(h.job_id[i] >= 0x20 && h.job_id[i] <= 0x7e);

	/* A connector answered with bad magic names it and the likely cause. */
	hs_hello_make(&con, 0, aux4, &h);
	memset(&c, 0, sizeof(c));
	c.magic = 0x50545448; /* "HTTP" */
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_ERR_PROTOCOL);
	cr_assert_str_eq(e.text, "handshake: the peer answered with bad magic 0x50545448 (is "
	                 "another program listening at that address?)");
	cr_assert_not(hs_proof_check(&acc, &h, c.nonce_s, &p), "the proof sent anyway must fail");
	memset(&r, 0, sizeof(r));
	cr_assert_eq(hs_result_check(&r, &e), KHOR_ERR_PROTOCOL);
	cr_assert(strstr(e.text, "malformed answer") != NULL, "%s", e.text);
	/* An unknown status from a newer peer is reported as such. */
	hs_refusal(HS_STATUS_COUNT + 3, &c);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_ERR_PROTOCOL);
	cr_assert(strstr(e.text, "unknown reason") != NULL, "%s", e.text);
}

Test(handshake, wrong_secret_at_the_acceptor_fails_the_connectors_check)
{
	hs_self con = self_of(HS_TP_TCP, 0, "right"), acc = self_of(HS_TP_TCP, 1, "wrong");
	hs_hello h, got;
	hs_challenge c;
	hs_proof p;
	uint8_t ns[KAUTH_NONCE_LEN];
	kerr e;

	hs_hello_make(&con, 1, aux4, &h);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns, &c), HS_OK);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 1, &p, &e), KHOR_ERR_AUTH);
	cr_assert_str_eq(e.text, "handshake: the peer could not prove the job secret (a stranger "
	                 "at that address, or its KHOR_SECRET differs)");
	/* The proof it sends anyway cannot pass, so the acceptor logs a secret mismatch. */
	cr_assert_not(hs_proof_check(&acc, &got, ns, &p));
}

Test(handshake, wrong_secret_at_the_connector_fails_the_acceptors_check)
{
	hs_self con = self_of(HS_TP_SHM, 0, "wrong"), acc = self_of(HS_TP_SHM, 1, "right");
	hs_hello h, got;
	hs_challenge c;
	hs_proof p;
	hs_result r;
	uint8_t ns[KAUTH_NONCE_LEN];
	kerr e;

	hs_hello_make(&con, 1, aux4, &h);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns, &c), HS_OK);
	/* The connector cannot verify the acceptor either (its own key is wrong)... */
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_ERR_AUTH);
	/* ...and even a connector that skipped that check and MACed with its wrong key fails. */
	con.secret = "right";
	con.secret_len = 5;
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_SUCCESS, "%s", e.text);
	acc.secret = "other";
	cr_assert_not(hs_proof_check(&acc, &got, ns, &p));
	hs_result_make(HS_BAD_AUTH, 0, &r);
	cr_assert_eq(hs_result_check(&r, &e), KHOR_ERR_AUTH);
	cr_assert_str_eq(e.text, "handshake refused by the peer: wrong job secret");
	hs_refusal(HS_BAD_AUTH, &c);
	cr_assert_eq(hs_challenge_check(&con, &h, &c, 0, &p, &e), KHOR_ERR_AUTH);
	hs_result_make(HS_DUPLICATE, 0, &r);
	cr_assert_eq(hs_result_check(&r, &e), KHOR_ERR_PROTOCOL);
	cr_assert(strstr(e.text, "duplicate") != NULL, "%s", e.text);
}

Test(handshake, a_replayed_proof_fails_against_a_fresh_nonce)
{
	hs_self con = self_of(HS_TP_TCP, 0, "k"), acc = self_of(HS_TP_TCP, 1, "k");
	hs_hello h, got;
	hs_challenge c1, c2;
	hs_proof p;
	uint8_t ns1[KAUTH_NONCE_LEN], ns2[KAUTH_NONCE_LEN];
	kerr e;

	hs_hello_make(&con, 1, aux4, &h);
	cr_assert_eq(accept_hello(&acc, &h, &got, ns1, &c1), HS_OK);
	cr_assert_eq(hs_challenge_check(&con, &h, &c1, 0, &p, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(hs_proof_check(&acc, &got, ns1, &p));
	/* An eavesdropper replays the same HELLO and PROOF to a new acceptor session. */
	cr_assert_eq(accept_hello(&acc, &h, &got, ns2, &c2), HS_OK);
	cr_assert_neq(memcmp(ns1, ns2, sizeof(ns1)), 0, "nonces must be fresh");
	cr_assert_not(hs_proof_check(&acc, &got, ns2, &p));
	/* A HELLO changed after the fact (aux are covered by the MACs) fails as well. */
	got.aux[0] ^= 1;
	cr_assert_not(hs_proof_check(&acc, &got, ns1, &p));
	/* So does a proof with the wrong magic. */
	got.aux[0] ^= 1;
	p.magic = 0;
	cr_assert_not(hs_proof_check(&acc, &got, ns1, &p));
}
