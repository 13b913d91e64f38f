/*
 * http.h -- the little HTTP/1.1 client etcd's JSON gateway needs, over base/sock.h's
 * non-blocking sockets: POST requests on a kept-alive connection, replies framed by
 * Content-Length or chunked (trailers read and dropped), and replies that stream
 * newline-delimited messages (etcd's watch). Every read and write has a deadline and every
 * size is bounded; a reply that breaks the format is an error sentence, never a crash.
 *
 * Errors describe the step ("waiting for the reply: connection closed by the other side");
 * the caller puts the server, operation and key in front.
 *
 * One thread at a time per connection.
 */
#ifndef KHOR_RENDEZVOUS_HTTP_H
#define KHOR_RENDEZVOUS_HTTP_H

#include "base/sock.h"

#include <stdbool.h>
#include <stddef.h>

/* A reply's status line and headers together. */
#define HTTP_HEAD_MAX 16384

struct http_conn {
	ksockaddr addr;
	char host[300]; /* the Host header: "127.0.0.1:2379" */
	int fd;         /* -1 when not connected */
	bool sent;      /* some of the last request went out (it may have been acted on) */
	bool keep;      /* the server keeps the connection after this reply */
	int state;      /* where in the reply's body (http.c) */
	uint64_t left;  /* bytes left of the body or the chunk */
	size_t max_body;
	char *in;       /* received, not yet parsed: in[in_off .. in_len) */
	size_t in_off, in_len;
	char *body;     /* the body decoded so far */
	size_t body_len, body_cap, line_taken;
};

struct http_reply {
	int status;
	char *body; /* malloc'd, NUL-terminated past len */
	size_t len;
};

void http_init(struct http_conn *c, const ksockaddr *addr, const char *host);
/* Closes the socket (if open); the connection can connect again. */
void http_close(struct http_conn *c);
/* Closes and frees the buffers. */
void http_free(struct http_conn *c);
/* Connects, retrying refused connections until dl (the server may be restarting). */
khor_status http_connect(struct http_conn *c, kdeadline dl, kerr *err);
/* Whether a connected, idle connection still looks usable: the server may have closed it. */
bool http_idle_ok(struct http_conn *c);

/*
 * Sends a POST with a JSON body and reads the whole reply (any status) into *rep_out, its
 * body at most max_body bytes. A failure closes the connection.
 */
khor_status http_post(struct http_conn *c, const char *path, const char *body, size_t len,
                      size_t max_body, kdeadline dl, struct http_reply *rep_out, kerr *err);
/*
 * The same, but a 200 reply's body is left to http_next_line (rep_out->body is then NULL);
 * another status's body is read whole.
 */
khor_status http_post_stream(struct http_conn *c, const char *path, const char *body, size_t len,
                             size_t max_line, kdeadline dl, struct http_reply *rep_out,
                             kerr *err);
/*
 * The next '\n'-ended line of a streamed body, NUL-terminated in place and valid until the
 * next call. KHOR_ERR_TIMEOUT at dl leaves the stream where it was; the end of the body is
 * KHOR_ERR_REMOTE.
 */
khor_status http_next_line(struct http_conn *c, kdeadline dl, char **line_out, size_t *len_out,
                           kerr *err);

#endif
