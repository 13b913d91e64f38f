/* auth.c -- HMAC-SHA256 proofs and randomness for handshakes (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

bool kauth_mac(const void *key, size_t key_len, const char *label, const void *a, size_t a_len,
               const void *b, size_t b_len, uint8_t mac_out[KAUTH_MAC_LEN])
{
	EVP_MAC *mac;
	EVP_MAC_CTX *ctx;
	OSSL_PARAM params[2];
	size_t out_len = 0;
	bool ok = false;
	static const uint8_t empty_key[1] = { 0 };

	mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	if (mac == NULL)
		return false;
	ctx = EVP_MAC_CTX_new(mac);
	if (ctx == NULL)
		goto out_free_mac;
	params[0] = OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0);
	params[1] = OSSL_PARAM_construct_end();
	/* HMAC with a zero-length key is well defined; OpenSSL wants a non-NULL pointer. */
	if (!EVP_MAC_init(ctx, key_len ? key : empty_key, key_len, params))
		goto out_free_ctx;
	if (!EVP_MAC_update(ctx, (const unsigned char *)label, strlen(label)))
		goto out_free_ctx;
	if (a_len && !EVP_MAC_update(ctx, a, a_len))
		goto out_free_ctx;
	if (b_len && !EVP_MAC_update(ctx, b, b_len))
		goto out_free_ctx;
	ok = EVP_MAC_final(ctx, mac_out, &out_len, KAUTH_MAC_LEN) && out_len == KAUTH_MAC_LEN;
out_free_ctx:
	EVP_MAC_CTX_free(ctx);
out_free_mac:
	EVP_MAC_free(mac);
	return ok;
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
