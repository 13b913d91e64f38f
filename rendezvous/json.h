/*
 * json.h -- a small, strict JSON reader for the replies of etcd's JSON gateway, and the
 * base64 that gateway wraps every key and value in.
 *
 * json_parse checks the whole text against the JSON grammar (RFC 8259) and cuts it into
 * tokens in a caller's array, jsmn-style: no allocation, nothing copied, a bounded depth
 * and token count, so a reply that is malformed, truncated or too large is an error with
 * the byte where it went wrong, never a crash or an unbounded walk. The lookups below then
 * find members by name. Strings stay raw (escapes undecoded) until asked for.
 *
 * etcd's gateway writes protobuf's JSON mapping: 64-bit integers as decimal strings
 * ("revision":"5"), bytes as base64 strings, enums by name, and fields at their zero value
 * left out (an absent "succeeded" is false, an absent "kvs" is none).
 */
#ifndef KHOR_RENDEZVOUS_JSON_H
#define KHOR_RENDEZVOUS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json_tok {
	uint8_t type;   /* enum json_type */
	uint32_t start; /* offset of the value's text; for a string, just past the quote */
	uint32_t len;   /* its length; for a string, without the quotes */
	uint32_t next;  /* index of the token after this value and everything inside it */
	uint32_t count; /* array: elements; object: members (a key token, then its value) */
};

typedef struct json_doc {
	const char *text;
	const struct json_tok *tok;
	int ntok; /* token 0 is the top-level value */
} json_doc;

#define JSON_MAX_DEPTH 32
/* Texts longer than this are refused (token offsets are 32-bit). */
#define JSON_MAX_TEXT (64u << 20)

/*
 * Parses text[0..len) (one value, whitespace around it allowed). On failure writes why
 * (e.g. "at byte 17: expected ':'") into why (at least 96 bytes) and returns false.
 */
bool json_parse(const char *text, size_t len, struct json_tok *toks, int max_toks,
                json_doc *doc_out, char *why, size_t why_len);

/* The value of member name in object obj, or -1 (obj not an object, or no such member). */
int json_member(const json_doc *d, int obj, const char *name);
/* Walks an array: the first element (or -1), then the one after elem (or -1). */
int json_first(const json_doc *d, int arr);
int json_after(const json_doc *d, int arr, int elem);

/* A string holding a decimal int64 (protobuf's mapping) or an integer number. */
bool json_i64(const json_doc *d, int t, int64_t *out);
bool json_bool(const json_doc *d, int t, bool *out);
/* Whether string token t is exactly s (no escapes). */
bool json_str_is(const json_doc *d, int t, const char *s);
/* Decodes string token t into buf (cap >= 1; cut short if need be); false if not a string. */
bool json_str(const json_doc *d, int t, char *buf, size_t cap);
/* Decodes base64 string token t: *out is malloc'd, NUL-terminated past *len_out. */
bool json_b64(const json_doc *d, int t, uint8_t **out, size_t *len_out);

/* Base64 (standard alphabet, padded): writes 4 * ceil(len / 3) chars and a NUL. */
size_t json_b64_len(size_t len);
void json_b64_encode(const void *src, size_t len, char *dst);

#endif
