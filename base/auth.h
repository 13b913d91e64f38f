/*
 * auth.h -- the job secret and the proofs made from it. Handshakes of the store and of
 * every link send a fresh nonce and expect HMAC-SHA256(secret, label || transcript) back,
 * so a process without the secret can neither join nor impersonate a rank. With no
 * secret configured the key is empty: the MAC then only proves the peer speaks khor.
 */
#ifndef KHOR_BASE_AUTH_H
#define KHOR_BASE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KAUTH_MAC_LEN 32
#define KAUTH_NONCE_LEN 16

/* mac_out = HMAC-SHA256(key, label || a || b). Returns false if libcrypto failed. */
bool kauth_mac(const void *key, size_t key_len, const char *label, const void *a, size_t a_len,
               const void *b, size_t b_len, uint8_t mac_out[KAUTH_MAC_LEN]);
bool kauth_equal(const uint8_t *x, const uint8_t *y, size_t len); /* constant time */
/* Cryptographic random bytes (getrandom). */
bool kauth_random(void *buf, size_t len);
/* A fresh secret as 64 hex characters plus NUL. */
bool kauth_new_secret(char out[65]);

#endif
