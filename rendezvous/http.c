/*
 * http.c -- the HTTP/1.1 client of http.h. The reply is parsed from a bounded input buffer
 * (in) as bytes arrive; its body is decoded (Content-Length or chunked) into a second
 * buffer (body) bounded by the caller's max_body. Nothing is trusted: a header line, a
 * chunk size or a body over its bound, or bytes that are not HTTP, end the exchange with
 * a sentence saying what came.
 */
#include "http.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* The input buffer: a head, chunk-size lines, and body bytes on their way to body. */
#define HTTP_IN_CAP 65536
#define HTTP_CHUNK_LINE_MAX 256
#define HTTP_TRAILERS_MAX 32

enum body_state {
	BODY_NONE,       /* no reply being read */
	BODY_LENGTH,     /* Content-Length: left bytes to go */
	BODY_CHUNK_SIZE, /* a chunk-size line next */
	BODY_CHUNK_DATA, /* left bytes of this chunk */
	BODY_CHUNK_END,  /* the CRLF after a chunk */
	BODY_TRAILER,    /* trailer lines until an empty one */
	BODY_DONE,
};

void http_init(struct http_conn *c, const ksockaddr *addr, const char *host)
{
	memset(c, 0, sizeof(*c));
	c->addr = *addr;
	kstrlcpy(c->host, host, sizeof(c->host));
	c->fd = -1;
}

void http_close(struct http_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->state = BODY_NONE;
	c->in_off = c->in_len = 0;
	c->body_len = c->line_taken = 0;
}

void http_free(struct http_conn *c)
{
	http_close(c);
	free(c->in);
	free(c->body);
	c->in = c->body = NULL;
	c->body_cap = 0;
}

khor_status http_connect(struct http_conn *c, kdeadline dl, kerr *err)
{
	khor_status st;

	http_close(c);
	if (c->in == NULL && (c->in = malloc(HTTP_IN_CAP)) == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "no memory for a connection's buffer");
	st = ksock_connect_deadline(&c->addr, dl, true, &c->fd, err);
	if (st != KHOR_SUCCESS)
		return st;
	ksock_tune_stream(c->fd, 0);
	return KHOR_SUCCESS;
}

bool http_idle_ok(struct http_conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };

	/* An idle connection has nothing to read: readable means closed, reset or junk. */
	return c->fd >= 0 && c->state == BODY_NONE && poll(&p, 1, 0) == 0;
}

/* Receives more bytes into in, waiting until dl. */
static khor_status fill(struct http_conn *c, kdeadline dl, const char *what, kerr *err)
{
	size_t n = 0;
	khor_status st;

	if (c->in_off > 0) {
		memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
		c->in_len -= c->in_off;
		c->in_off = 0;
	}
	if (c->in_len == HTTP_IN_CAP)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "%s: a line of the reply is over %d bytes",
		                what, HTTP_IN_CAP);
	st = ksock_read_some(c->fd, c->in + c->in_len, HTTP_IN_CAP - c->in_len, dl, what, &n, err);
	if (st == KHOR_ERR_TIMEOUT)
		kerr_set(err, KHOR_ERR_TIMEOUT, "%s: no answer before the deadline", what);
	c->in_len += n;
	return st;
}

/* The next CRLF-ended line of in (at most max bytes), consumed; NUL-terminated in place. */
static khor_status get_line(struct http_conn *c, size_t max, kdeadline dl, const char *what,
                            char **line_out, size_t *len_out, kerr *err)
{
	size_t scanned = 0;

	for (;;) {
		char *p = c->in + c->in_off;
		size_t avail = c->in_len - c->in_off;
		for (size_t i = scanned; i + 1 < avail; i++) {
			if (p[i] == '\r' && p[i + 1] == '\n') {
				if (i > max)
					break;
				p[i] = '\0';
				c->in_off += i + 2;
				*line_out = p;
				*len_out = i;
				return KHOR_SUCCESS;
			}
		}
		if (avail > max + 1)
			return kerr_set(err, KHOR_ERR_PROTOCOL,
			                "%s: a line of the reply is over %zu bytes", what, max);
		scanned = avail > 0 ? avail - 1 : 0;
		khor_status st = fill(c, dl, what, err);
		if (st != KHOR_SUCCESS)
			return st;
	}
}

/* Shows the start of what came instead of HTTP, printable. */
static void describe_bytes(const char *s, size_t len, char *buf, size_t cap)
{
	size_t o = 0;

	for (size_t i = 0; i < len && i < 24 && o + 5 < cap; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch >= 0x20 && ch < 0x7f && ch != '\\')
			buf[o++] = (char)ch;
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
	}
	buf[o] = '\0';
}

static bool parse_u64(const char *s, int base, uint64_t *out)
{
	uint64_t v = 0;
	size_t n = 0;

	for (; *s != '\0'; s++, n++) {
		int d;
		if (*s >= '0' && *s <= '9')
			d = *s - '0';
		else if (base == 16 && (*s | 0x20) >= 'a' && (*s | 0x20) <= 'f')
			d = (*s | 0x20) - 'a' + 10;
		else
			return false;
		if (n >= 15) /* 2^60 is more than any reply we would take */
			return false;
		v = v * (uint64_t)base + (uint64_t)d;
	}
	*out = v;
	return n > 0;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = '\0';
	return s;
}

/* Reads the status line and the headers; sets up the body's framing. */
static khor_status read_head(struct http_conn *c, kdeadline dl, int *status_out, kerr *err)
{
	const char *what = "waiting for the reply";
	bool length = false, chunked = false;
	size_t total = 0, len;
	char *line, shown[128];
	khor_status st;

	/* Something else on the port (a khor store greets in binary) is told apart at once. */
	for (st = KHOR_SUCCESS; st == KHOR_SUCCESS && c->in_len - c->in_off < 7;)
		st = fill(c, dl, what, err);
	if (c->in_len - c->in_off > 0 &&
	    memcmp(c->in + c->in_off, "HTTP/1.",
	           c->in_len - c->in_off < 7 ? c->in_len - c->in_off : 7) != 0) {
		describe_bytes(c->in + c->in_off, c->in_len - c->in_off, shown, sizeof(shown));
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "the answer is not HTTP (it begins \"%s\"); is this the client port "
		                "of an etcd server?",
		                shown);
	}
	if (st == KHOR_SUCCESS)
		st = get_line(c, HTTP_HEAD_MAX, dl, what, &line, &len, err);
	if (st == KHOR_SUCCESS && (len < 12 || line[8] != ' '))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply's status line is malformed: \"%.80s\"",
		                line);
	if (st != KHOR_SUCCESS)
		return st;
	char code[4] = { line[9], line[10], line[11], '\0' };
	uint64_t status;
	if (!parse_u64(code, 10, &status) || status < 100 || (len > 12 && line[12] != ' '))
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply's status line is malformed: \"%.80s\"",
		                line);
	c->keep = line[7] == '1';
	for (;;) {
		total += len + 2;
		st = get_line(c, HTTP_HEAD_MAX, dl, what, &line, &len, err);
		if (st != KHOR_SUCCESS)
			return st;
		if (len == 0)
			break;
		if (total + len > HTTP_HEAD_MAX)
			return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply's header is over %d bytes",
			                HTTP_HEAD_MAX);
		char *colon = strchr(line, ':');
		if (colon == NULL || colon == line)
			return kerr_set(err, KHOR_ERR_PROTOCOL,
			                "the reply has a malformed header line: \"%.80s\"", line);
		*colon = '\0';
		char *val = trim(colon + 1);
		if (strcasecmp(line, "Content-Length") == 0) {
			if (length || !parse_u64(val, 10, &c->left))
				return kerr_set(err, KHOR_ERR_PROTOCOL,
				                "the reply has a bad Content-Length: \"%.40s\"", val);
			length = true;
		} else if (strcasecmp(line, "Transfer-Encoding") == 0) {
			if (strcasecmp(val, "chunked") != 0)
				return kerr_set(err, KHOR_ERR_PROTOCOL,
				                "the reply uses transfer encoding \"%.40s\", not chunked",
				                val);
			chunked = true;
		} else if (strcasecmp(line, "Connection") == 0) {
			if (strcasecmp(val, "close") == 0)
				c->keep = false;
		}
	}
	if (chunked == length)
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "the reply has %s Content-Length and chunked encoding",
		                chunked ? "both" : "neither");
	c->state = chunked ? BODY_CHUNK_SIZE : BODY_LENGTH;
	if (!chunked && c->left > c->max_body)
		return kerr_set(err, KHOR_ERR_PROTOCOL,
		                "the reply announces a %llu-byte body, over the limit of %zu",
		                (unsigned long long)c->left, c->max_body);
	*status_out = (int)status;
	return KHOR_SUCCESS;
}

static khor_status body_append(struct http_conn *c, const char *p, size_t n, kerr *err)
{
	if (c->body_len + n > c->max_body)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply's body is over %zu bytes",
		                c->max_body);
	if (c->body_len + n + 1 > c->body_cap) {
		size_t cap = c->body_cap > 0 ? c->body_cap : 4096;
		while (cap < c->body_len + n + 1)
			cap *= 2;
		char *nb = realloc(c->body, cap);
		if (nb == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "no memory for a %zu-byte reply", cap);
		c->body = nb;
		c->body_cap = cap;
	}
	memcpy(c->body + c->body_len, p, n);
	c->body_len += n;
	c->body[c->body_len] = '\0';
	return KHOR_SUCCESS;
}

/* Moves body bytes from the socket into body: one step of progress, or an error. */
static khor_status body_step(struct http_conn *c, kdeadline dl, kerr *err)
{
	const char *what = "reading the reply's body";
	size_t avail = c->in_len - c->in_off, len;
	uint64_t size;
	char *line;
	khor_status st;

	switch (c->state) {
	case BODY_LENGTH:
	case BODY_CHUNK_DATA:
		if (c->left == 0) {
			c->state = c->state == BODY_LENGTH ? BODY_DONE : BODY_CHUNK_END;
			return KHOR_SUCCESS;
		}
		if (avail == 0)
			return fill(c, dl, what, err);
		len = avail < c->left ? avail : (size_t)c->left;
		st = body_append(c, c->in + c->in_off, len, err);
		c->in_off += len;
		c->left -= len;
		return st;
	case BODY_CHUNK_SIZE:
		st = get_line(c, HTTP_CHUNK_LINE_MAX, dl, what, &line, &len, err);
		if (st != KHOR_SUCCESS)
			return st;
		line[strcspn(line, ";")] = '\0'; /* chunk extensions mean nothing to us */
		if (!parse_u64(trim(line), 16, &size))
			return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply has a bad chunk size \"%.40s\"",
			                line);
		c->left = size;
		c->state = size == 0 ? BODY_TRAILER : BODY_CHUNK_DATA;
		return KHOR_SUCCESS;
	case BODY_CHUNK_END:
		st = get_line(c, 0, dl, what, &line, &len, err);
		if (st == KHOR_SUCCESS)
			c->state = BODY_CHUNK_SIZE;
		return st;
	case BODY_TRAILER:
		/* Bounded: left counts the trailer lines (gRPC's gateway sends one or two). */
		st = get_line(c, HTTP_CHUNK_LINE_MAX * 4, dl, what, &line, &len, err);
		if (st != KHOR_SUCCESS)
			return st;
		if (len == 0)
			c->state = BODY_DONE;
		else if (++c->left > HTTP_TRAILERS_MAX)
			return kerr_set(err, KHOR_ERR_PROTOCOL, "the reply has over %d trailer lines",
			                HTTP_TRAILERS_MAX);
		return KHOR_SUCCESS;
	default:
		return kerr_set(err, KHOR_ERR_INTERNAL, "http: no reply is being read");
	}
}

static khor_status send_request(struct http_conn *c, const char *path, const char *body,
                                size_t len, kdeadline dl, kerr *err)
{
	char head[1024];
	int n;
	khor_status st;

	c->sent = false;
	if (c->fd < 0)
		return kerr_set(err, KHOR_ERR_INTERNAL, "http: not connected");
	n = snprintf(head, sizeof(head),
	             "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
	             "Content-Length: %zu\r\n\r\n",
	             path, c->host, len);
	if (n < 0 || (size_t)n >= sizeof(head))
		return kerr_set(err, KHOR_ERR_INTERNAL, "http: request head too long");
	c->sent = true;
	st = ksock_write_all(c->fd, head, (size_t)n, dl, "sending the request", err);
	if (st == KHOR_SUCCESS && len > 0)
		st = ksock_write_all(c->fd, body, len, dl, "sending the request", err);
	c->state = BODY_NONE;
	c->in_off = c->in_len = 0;
	c->body_len = c->line_taken = 0;
	return st;
}

/* Reads the rest of a body into *rep_out (which takes the buffer). */
static khor_status read_whole_body(struct http_conn *c, kdeadline dl, struct http_reply *rep_out,
                                   kerr *err)
{
	khor_status st = KHOR_SUCCESS;

	while (c->state != BODY_DONE && st == KHOR_SUCCESS)
		st = body_step(c, dl, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (c->body == NULL && (st = body_append(c, "", 0, err)) != KHOR_SUCCESS)
		return st;
	rep_out->body = c->body;
	rep_out->len = c->body_len;
	c->body = NULL;
	c->body_len = c->body_cap = 0;
	c->state = BODY_NONE;
	/* Bytes after the reply belong to no request: the stream is out of step. */
	if (!c->keep || c->in_off != c->in_len)
		http_close(c);
	return KHOR_SUCCESS;
}

/* Sends the request and reads the reply's head. */
static khor_status exchange(struct http_conn *c, const char *path, const char *body, size_t len,
                            size_t max_body, kdeadline dl, struct http_reply *rep_out, kerr *err)
{
	khor_status st;

	c->max_body = max_body;
	rep_out->body = NULL;
	rep_out->len = 0;
	st = send_request(c, path, body, len, dl, err);
	return st == KHOR_SUCCESS ? read_head(c, dl, &rep_out->status, err) : st;
}

khor_status http_post(struct http_conn *c, const char *path, const char *body, size_t len,
                      size_t max_body, kdeadline dl, struct http_reply *rep_out, kerr *err)
{
	khor_status st = exchange(c, path, body, len, max_body, dl, rep_out, err);

	if (st == KHOR_SUCCESS)
		st = read_whole_body(c, dl, rep_out, err);
	if (st != KHOR_SUCCESS)
		http_close(c);
	return st;
}

khor_status http_post_stream(struct http_conn *c, const char *path, const char *body, size_t len,
                             size_t max_line, kdeadline dl, struct http_reply *rep_out,
                             kerr *err)
{
	khor_status st = exchange(c, path, body, len, max_line, dl, rep_out, err);

	if (st == KHOR_SUCCESS && rep_out->status != 200)
		st = read_whole_body(c, dl, rep_out, err);
	if (st != KHOR_SUCCESS)
		http_close(c);
	return st;
}

khor_status http_next_line(struct http_conn *c, kdeadline dl, char **line_out, size_t *len_out,
                           kerr *err)
{
	size_t scanned = 0;

	if (c->fd < 0 || c->state == BODY_NONE)
		return kerr_set(err, KHOR_ERR_INTERNAL, "http: no stream is open");
	if (c->line_taken > 0) {
		memmove(c->body, c->body + c->line_taken, c->body_len - c->line_taken);
		c->body_len -= c->line_taken;
		c->line_taken = 0;
	}
	for (;;) {
		char *nl = c->body_len > scanned ? memchr(c->body + scanned, '\n',
		                                          c->body_len - scanned)
		                                 : NULL;
		if (nl != NULL) {
			*nl = '\0';
			*line_out = c->body;
			*len_out = (size_t)(nl - c->body);
			c->line_taken = *len_out + 1;
			return KHOR_SUCCESS;
		}
		scanned = c->body_len;
		if (c->state == BODY_DONE)
			return kerr_set(err, KHOR_ERR_REMOTE, "the server ended the stream");
		khor_status st = body_step(c, dl, err);
		if (st == KHOR_ERR_TIMEOUT)
			return st;
		if (st != KHOR_SUCCESS) {
			http_close(c);
			return st;
		}
	}
}
