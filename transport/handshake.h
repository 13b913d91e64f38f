/*
 * handshake.h -- the handshake that opens every link, whatever the transport: one place for
 * its messages, its checks and its proofs, so tcp, shm and ib refuse the same strangers in
 * the same words. The transports only carry the bytes (a TCP stream, a Unix seqpacket
 * socket, ib's bootstrap socket); each message has a fixed size.
 *
 *     connector                                   acceptor
 *     HELLO {magic, transport, version, job id,
 *            from, to, aux[4], nonce_c}      --->
 *                                           <---  CHALLENGE {status, aux, nonce_s,
 *                                                  HMAC(secret, "khor-<tp>-acceptor"|HELLO|nonce_s)}
 *     PROOF {aux, HMAC(secret, "khor-<tp>-connector"|HELLO|nonce_s|nonce_c)} --->
 *                                           <---  RESULT {status, aux}
 *
 * The acceptor proves itself first so a connector never sends data to an impostor; the
 * connector's proof covers both nonces so it cannot be replayed; the transport's name is in
 * the MAC's label and its number in the HELLO, so a HELLO meant for one transport is
 * refused by another. aux words are the transport's own (tcp: socket index and count; shm:
 * ring size and the nonce's address for the CMA probe; ib: nothing yet): the HELLO's are
 * covered by both MACs, the others are not secret and are checked by the transport.
 *
 * Every function here is pure (no I/O, no locks, no allocation): the transports call them
 * under their own locks.
 */
#ifndef KHOR_TRANSPORT_HANDSHAKE_H
#define KHOR_TRANSPORT_HANDSHAKE_H

#include "base/auth.h"
#include "base/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HS_MAGIC 0x524f484bu /* "KHOR" little-endian */
#define HS_JOB_MAX 64

/* Which transport a HELLO is for. */
enum hs_transport { HS_TP_TCP = 1, HS_TP_SHM = 2, HS_TP_IB = 3 };

/* Why an acceptor refused; sent in CHALLENGE and RESULT. */
enum hs_status {
	HS_OK = 0,
	HS_BAD_VERSION,   /* protocol version differs */
	HS_BAD_JOB,       /* job id differs */
	HS_BAD_TARGET,    /* addressed to another rank, or from an impossible one */
	HS_BAD_AUTH,      /* wrong job secret */
	HS_DUPLICATE,     /* that rank already has this link */
	HS_BAD_PARAMS,    /* the transport's own parameters (aux) are refused */
	HS_BAD_TRANSPORT, /* a HELLO meant for another transport */
	HS_STATUS_COUNT,
	/* hs_hello_check only, never sent: no khor magic, so not a khor peer at all. The
	 * transport logs it and drops the connection without answering. */
	HS_NOT_KHOR = HS_STATUS_COUNT
};

typedef struct hs_hello {
	uint32_t magic;
	uint16_t transport; /* enum hs_transport */
	uint16_t version;   /* the transport's protocol version */
	int32_t from_rank;
	int32_t to_rank;
	uint64_t aux[4];
	char job_id[HS_JOB_MAX];
	uint8_t nonce_c[KAUTH_NONCE_LEN];
} hs_hello;

typedef struct hs_challenge {
	uint32_t magic;
	uint32_t status;
	uint64_t aux;
	uint8_t nonce_s[KAUTH_NONCE_LEN];
	uint8_t mac_s[KAUTH_MAC_LEN];
} hs_challenge;

typedef struct hs_proof {
	uint32_t magic;
	uint32_t aux;
	uint8_t mac_c[KAUTH_MAC_LEN];
} hs_proof;

typedef struct hs_result {
	uint32_t magic;
	uint32_t status;
	uint64_t aux;
} hs_result;

/* Who we are, for every check; filled once by the transport at create. */
typedef struct hs_self {
	uint16_t transport; /* enum hs_transport */
	uint16_t version;
	int rank, size;
	const char *name;   /* "tcp": the MAC labels' and the messages' */
	char job_id[HS_JOB_MAX];
	const void *secret;
	size_t secret_len;
} hs_self;

const char *hs_status_str(uint32_t status);

/* Connector: a HELLO to rank to, with a fresh nonce_c; aux is copied in. */
void hs_hello_make(const hs_self *self, int to_rank, const uint64_t aux[4], hs_hello *out);

/*
 * Acceptor: checks a HELLO that arrived (makes its job id printable in place, since it goes
 * into logs). HS_OK, or why it is refused; the transport then checks aux itself (and may
 * still refuse with HS_BAD_PARAMS) and sends hs_refusal() on refusal. HS_NOT_KHOR for bad
 * magic: log "bad magic 0x%08x (not a khor peer)" and drop it without an answer (the job
 * id is then left as it came).
 */
uint32_t hs_hello_check(const hs_self *self, hs_hello *h);

/* Acceptor: the CHALLENGE for an accepted HELLO; nonce_s_out must be kept for the proof. */
void hs_challenge_make(const hs_self *self, const hs_hello *h, uint64_t aux,
                       uint8_t nonce_s_out[KAUTH_NONCE_LEN], hs_challenge *out);

/* Acceptor: a refusing CHALLENGE (or RESULT: same first 8 bytes) for status. */
void hs_refusal(uint32_t status, hs_challenge *out);

/*
 * Connector: checks the CHALLENGE against our HELLO; on success writes the PROOF to send
 * (aux copied in). On failure err says why in a full sentence ("handshake refused by the
 * peer: wrong job secret", "the peer could not prove the job secret ...") with status
 * KHOR_ERR_AUTH or KHOR_ERR_PROTOCOL; *proof_out then holds a proof that cannot pass, to
 * send anyway so the acceptor logs a secret mismatch rather than a dropped connection.
 */
khor_status hs_challenge_check(const hs_self *self, const hs_hello *mine, const hs_challenge *c,
                               uint32_t aux, hs_proof *proof_out, kerr *err);

/* Acceptor: does the PROOF show the secret? */
bool hs_proof_check(const hs_self *self, const hs_hello *h,
                    const uint8_t nonce_s[KAUTH_NONCE_LEN], const hs_proof *p);

/* Acceptor: the RESULT to send (status HS_OK or a refusal). */
void hs_result_make(uint32_t status, uint64_t aux, hs_result *out);

/* Connector: checks the RESULT; err as for hs_challenge_check. */
khor_status hs_result_check(const hs_result *r, kerr *err);

#endif
