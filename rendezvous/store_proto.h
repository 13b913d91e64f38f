/*
 * store_proto.h -- the wire format of the embedded TCP store, shared by the server
 * (store_server.c), the client (store_tcp.c) and the parser fuzzer. The format itself is
 * described at the top of store_server.c. Internal to the runtime layer.
 *
 * The parsers are pure functions over a byte buffer so that the fuzzer exercises exactly
 * the code the server runs on bytes from the network.
 */
#ifndef KHOR_RUNTIME_STORE_PROTO_H
#define KHOR_RUNTIME_STORE_PROTO_H

#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_PROTO_VERSION 1

#define STORE_MAGIC_SERVER_HELLO 0x4B535448u /* "KSTH" */
#define STORE_MAGIC_CLIENT_HELLO 0x4B535443u /* "KSTC" */
#define STORE_MAGIC_WELCOME 0x4B535457u      /* "KSTW" */
#define STORE_MAGIC_REQUEST 0x4B535251u      /* "KSRQ" */
#define STORE_MAGIC_REPLY 0x4B535250u        /* "KSRP" */

#define STORE_LABEL_CLIENT "khor-store-v1 client"
#define STORE_LABEL_SERVER "khor-store-v1 server"

#define STORE_JOB_ID_MAX 255
#define STORE_SERVER_HELLO_LEN 24 /* magic, version, 3 reserved, server nonce */
#define STORE_CLIENT_HELLO_LEN 56 /* magic, version, reserved, job len, nonce, mac; job id follows */
#define STORE_WELCOME_LEN 40      /* magic, version, status, 2 reserved, server proof */
#define STORE_REQ_HDR_LEN 24      /* magic, version, op, 2 reserved, key len, value len, arg */
#define STORE_REP_HDR_LEN 24      /* magic, version, status, 2 reserved, value len, 4 reserved, arg */
/* Error replies carry a short explanation as their value; the client trusts no more than this. */
#define STORE_REPLY_TEXT_MAX 512

enum store_op { STORE_OP_SET = 1, STORE_OP_GET = 2, STORE_OP_ADD = 3, STORE_OP_DEL = 4 };

enum store_reply_status {
	STORE_REPLY_OK = 0,
	STORE_REPLY_TIMEOUT = 1,   /* GET: the key was not set before the request's timeout */
	STORE_REPLY_MALFORMED = 2, /* the request broke the format; the server drops the client */
	STORE_REPLY_FULL = 3,      /* SET/ADD: the store's byte cap would be exceeded */
	STORE_REPLY_BAD_VALUE = 4  /* ADD: the stored value is not a decimal int64, or overflow */
};

enum store_welcome_status {
	STORE_WELCOME_OK = 0,
	STORE_WELCOME_BAD_VERSION = 1,
	STORE_WELCOME_BAD_JOB = 2,
	STORE_WELCOME_BAD_MAC = 3,
	STORE_WELCOME_MALFORMED = 4
};

enum store_parse_result { STORE_PARSE_OK, STORE_PARSE_NEED_MORE, STORE_PARSE_BAD };

/*
 * A parsed request. key and val point into the parsed buffer. On STORE_PARSE_NEED_MORE only
 * `total` is set (how many bytes the buffer must hold before parsing again); on
 * STORE_PARSE_BAD only `why` is set (a phrase for the log and the error reply).
 */
struct store_request {
	uint8_t op;
	const uint8_t *key;
	uint32_t key_len;
	const uint8_t *val;
	uint32_t val_len;
	int64_t arg; /* GET: timeout in ms (>= 0); ADD: delta; SET, DEL: 0 */
	size_t total;
	const char *why;
};

struct store_client_hello {
	uint8_t version;
	uint8_t nonce[16];
	uint8_t mac[32];
	const uint8_t *job_id;
	uint16_t job_len;
	size_t total;
	const char *why;
};

enum store_parse_result store_parse_request(const uint8_t *buf, size_t len,
                                            struct store_request *req);
enum store_parse_result store_parse_client_hello(const uint8_t *buf, size_t len,
                                                 struct store_client_hello *hello);
/* Strict decimal int64: optional '-', 1 to 19 digits, no spaces, no overflow. */
bool store_parse_int64(const uint8_t *s, size_t len, int64_t *value_out);

/*
 * Knobs the tests turn down so they run in milliseconds; read once by store_server_start.
 * Defaults: 10 s for a client to finish the handshake, 256 MiB of keys and values.
 */
extern int store_server_handshake_ms;
extern size_t store_server_bytes_max;

static inline void store_put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void store_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline void store_put_be64(uint8_t *p, uint64_t v)
{
	store_put_be32(p, (uint32_t)(v >> 32));
	store_put_be32(p + 4, (uint32_t)v);
}

static inline uint16_t store_get_be16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t store_get_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t store_get_be64(const uint8_t *p)
{
	return ((uint64_t)store_get_be32(p) << 32) | store_get_be32(p + 4);
}

#endif
