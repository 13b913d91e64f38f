/*
 * handshake.c -- the messages, checks and proofs of the link handshake (handshake.h), shared
 * by every transport. Pure functions: the transports carry the bytes and keep the state.
 *
 * The MACs are HMAC(secret, "khor-<tp>-acceptor" | HELLO | nonce_s) and
 * HMAC(secret, "khor-<tp>-connector" | HELLO | nonce_s | nonce_c), over the HELLO's bytes as
 * they travel (host order: both ends run on the same architecture or are refused by version
 * and magic anyway). The acceptor makes the job id printable before it MACs the HELLO; a
 * real connector's job id already is, so the two ends MAC the same bytes.
 */
#include "handshake.h"

#include <stdio.h>
#include <string.h>

/* The wire format: a change here is a new protocol version of every transport. */
_Static_assert(sizeof(hs_hello) == 128 && sizeof(hs_challenge) == 64 &&
               sizeof(hs_proof) == 40 && sizeof(hs_result) == 16,
               "handshake messages changed size: bump the transports' versions");

static const char *const status_text[HS_STATUS_COUNT] = {
	[HS_OK] = "ok",
	[HS_BAD_VERSION] = "protocol version differs",
	[HS_BAD_JOB] = "job id differs",
	[HS_BAD_TARGET] = "addressed to another rank",
	[HS_BAD_AUTH] = "wrong job secret",
	[HS_DUPLICATE] = "duplicate connection",
	[HS_BAD_PARAMS] = ("the transport's parameters were refused (socket count, ring size or "
	                   "shared-memory segment; the peer's log says which)"),
	[HS_BAD_TRANSPORT] = "meant for another transport",
};

const char *hs_status_str(uint32_t status)
{
	return status < HS_STATUS_COUNT ? status_text[status] : "unknown reason";
}

static void label_of(const hs_self *self, const char *role, char *buf, size_t len)
{
	snprintf(buf, len, "khor-%s-%s", self->name, role);
}

/* The acceptor's MAC: over the HELLO and nonce_s. */
static bool mac_acceptor(const hs_self *self, const hs_hello *h,
                         const uint8_t nonce_s[KAUTH_NONCE_LEN], uint8_t out[KAUTH_MAC_LEN])
{
	char label[48];

	label_of(self, "acceptor", label, sizeof(label));
	return kauth_mac(self->secret, self->secret_len, label, h, sizeof(*h), nonce_s,
	                 KAUTH_NONCE_LEN, out);
}

/* The connector's MAC: over the HELLO, nonce_s and nonce_c (so it cannot be replayed). */
static bool mac_connector(const hs_self *self, const hs_hello *h,
                          const uint8_t nonce_s[KAUTH_NONCE_LEN], uint8_t out[KAUTH_MAC_LEN])
{
	uint8_t both[2 * KAUTH_NONCE_LEN];
	char label[48];

	memcpy(both, nonce_s, KAUTH_NONCE_LEN);
	memcpy(both + KAUTH_NONCE_LEN, h->nonce_c, KAUTH_NONCE_LEN);
	label_of(self, "connector", label, sizeof(label));
	return kauth_mac(self->secret, self->secret_len, label, h, sizeof(*h), both, sizeof(both),
	                 out);
}

void hs_hello_make(const hs_self *self, int to_rank, const uint64_t aux[4], hs_hello *out)
{
	memset(out, 0, sizeof(*out));
	out->magic = HS_MAGIC;
	out->transport = self->transport;
	out->version = self->version;
	out->from_rank = self->rank;
	out->to_rank = to_rank;
	memcpy(out->aux, aux, sizeof(out->aux));
	kstrlcpy(out->job_id, self->job_id, sizeof(out->job_id));
	/* getrandom does not fail once the pool is initialised (it blocks until then). */
	(void)kauth_random(out->nonce_c, sizeof(out->nonce_c));
}

uint32_t hs_hello_check(const hs_self *self, hs_hello *h)
{
	if (h->magic != HS_MAGIC)
		return HS_NOT_KHOR;
	h->job_id[HS_JOB_MAX - 1] = '\0';
	for (char *q = h->job_id; *q != '\0'; q++)
		if (*q < 0x20 || *q > 0x7e)
			*q = '?'; /* a stranger's bytes go into our log: keep them printable */
	if (h->transport != self->transport)
		return HS_BAD_TRANSPORT;
	if (h->version != self->version)
		return HS_BAD_VERSION;
	if (strcmp(h->job_id, self->job_id) != 0)
		return HS_BAD_JOB;
	if (h->to_rank != self->rank || h->from_rank < 0 || h->from_rank >= self->size ||
	    h->from_rank == self->rank)
		return HS_BAD_TARGET;
	return HS_OK;
}

void hs_challenge_make(const hs_self *self, const hs_hello *h, uint64_t aux,
                       uint8_t nonce_s_out[KAUTH_NONCE_LEN], hs_challenge *out)
{
	memset(out, 0, sizeof(*out));
	out->magic = HS_MAGIC;
	out->status = HS_OK;
	out->aux = aux;
	(void)kauth_random(out->nonce_s, sizeof(out->nonce_s));
	memcpy(nonce_s_out, out->nonce_s, KAUTH_NONCE_LEN);
	/* A failed MAC leaves zeros, which no connector accepts: the handshake fails safe. */
	(void)mac_acceptor(self, h, out->nonce_s, out->mac_s);
}

void hs_refusal(uint32_t status, hs_challenge *out)
{
	memset(out, 0, sizeof(*out));
	out->magic = HS_MAGIC;
	out->status = status;
}

static khor_status refused(uint32_t status, kerr *err)
{
	return kerr_set(err, status == HS_BAD_AUTH ? KHOR_ERR_AUTH : KHOR_ERR_PROTOCOL,
	                "handshake refused by the peer: %s", hs_status_str(status));
}

khor_status hs_challenge_check(const hs_self *self, const hs_hello *mine, const hs_challenge *c,
                               uint32_t aux, hs_proof *proof_out, kerr *err)
{
	uint8_t want[KAUTH_MAC_LEN];

	memset(proof_out, 0, sizeof(*proof_out));
	proof_out->magic = HS_MAGIC;
	if (c->magic != HS_MAGIC)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "handshake: the peer answered with bad magic "
		                "0x%08x (is another program listening at that address?)", c->magic);
	if (c->status != HS_OK)
		return refused(c->status, err);
	if (!mac_acceptor(self, mine, c->nonce_s, want))
		return kerr_set(err, KHOR_ERR_INTERNAL, "handshake: computing the HMAC failed "
		                "(libcrypto)");
	if (!kauth_equal(want, c->mac_s, KAUTH_MAC_LEN))
		return kerr_set(err, KHOR_ERR_AUTH, "handshake: the peer could not prove the job "
		                "secret (a stranger at that address, or its KHOR_SECRET differs)");
	if (!mac_connector(self, mine, c->nonce_s, proof_out->mac_c)) {
		memset(proof_out->mac_c, 0, sizeof(proof_out->mac_c));
		return kerr_set(err, KHOR_ERR_INTERNAL, "handshake: computing the HMAC failed "
		                "(libcrypto)");
	}
	proof_out->aux = aux;
	return KHOR_SUCCESS;
}

bool hs_proof_check(const hs_self *self, const hs_hello *h,
                    const uint8_t nonce_s[KAUTH_NONCE_LEN], const hs_proof *p)
{
	uint8_t want[KAUTH_MAC_LEN];

	if (p->magic != HS_MAGIC || !mac_connector(self, h, nonce_s, want))
		return false;
	return kauth_equal(want, p->mac_c, KAUTH_MAC_LEN);
}

void hs_result_make(uint32_t status, uint64_t aux, hs_result *out)
{
	memset(out, 0, sizeof(*out));
	out->magic = HS_MAGIC;
	out->status = status;
	out->aux = aux;
}

khor_status hs_result_check(const hs_result *r, kerr *err)
{
	if (r->magic != HS_MAGIC)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "handshake refused by the peer: malformed "
		                "answer");
	if (r->status != HS_OK)
		return refused(r->status, err);
	return KHOR_SUCCESS;
}
