/* auth.c -- HMAC-SHA256 proofs and randomness for handshakes (see auth.h). */
/* The SHA256_* block functions are deprecated in 3.0 but remain; see kauth_mac. */
#define OPENSSL_API_COMPAT 10101
#include "auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <string.h>
#include <sys/random.h>

/*
 * HMAC (RFC 2104) over OpenSSL's one-shot SHA-256 block functions rather than EVP_MAC. The
 * EVP path fetches the algorithm from the provider store under a global lock on every call;
 * a process that forks while another of its threads (the store server) holds that lock
 * leaves the child deadlocked in its own first handshake. The SHA256_* functions take no
 * lock, so neither the server thread nor a forked rank can be caught that way.
 */
bool kauth_mac(const void *key, size_t key_len, const char *label, const void *a, size_t a_len,
               const void *b, size_t b_len, uint8_t mac_out[KAUTH_MAC_LEN])
{
	uint8_t k0[SHA256_CBLOCK] = { 0 }, pad[SHA256_CBLOCK], inner[SHA256_DIGEST_LENGTH];
	SHA256_CTX ctx;

	if (key_len > sizeof(k0))
		SHA256(key, key_len, k0);
	else if (key_len > 0)
		memcpy(k0, key, key_len);
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k0[i] ^ 0x36;
	if (!SHA256_Init(&ctx) || !SHA256_Update(&ctx, pad, sizeof(pad)) ||
	    !SHA256_Update(&ctx, label, strlen(label)) || (a_len && !SHA256_Update(&ctx, a, a_len)) ||
	    (b_len && !SHA256_Update(&ctx, b, b_len)) || !SHA256_Final(inner, &ctx))
		return false;
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k0[i] ^ 0x5c;
	if (!SHA256_Init(&ctx) || !SHA256_Update(&ctx, pad, sizeof(pad)) ||
	    !SHA256_Update(&ctx, inner, sizeof(inner)) || !SHA256_Final(mac_out, &ctx))
		return false;
	OPENSSL_cleanse(k0, sizeof(k0));
	OPENSSL_cleanse(pad, sizeof(pad));
	OPENSSL_cleanse(&ctx, sizeof(ctx));
	return true;
}

bool kauth_equal(const uint8_t *x, const uint8_t *y, size_t len)
{
	return CRYPTO_memcmp(x, y, len) == 0;
}

bool kauth_random(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		p += n;
		len -= (size_t)n;
	}
	return true;
}

bool kauth_new_secret(char out[65])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t raw[32];

	if (!kauth_random(raw, sizeof(raw)))
		return false;
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[raw[i] >> 4];
		out[2 * i + 1] = hex[raw[i] & 15];
	}
	out[64] = '\0';
	return true;
}
