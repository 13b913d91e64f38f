/*
 * sock.h -- socket helpers shared by the store and the TCP transport, in the spirit of
 * Redis's anet: small functions that do one socket chore and, on failure, write a full
 * sentence with the system's message into the caller's kerr. The *_deadline functions are
 * the only blocking socket calls in khor and each is bounded by its deadline.
 */
#ifndef KHOR_BASE_SOCK_H
#define KHOR_BASE_SOCK_H

#include "clock.h"
#include "err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct ksockaddr {
	struct sockaddr_storage ss;
	socklen_t len;
} ksockaddr;

/* "host:port", "[v6addr]:port". host_out gets at least 256 bytes. */
bool ksock_split_hostport(const char *s, char *host_out, size_t host_len, uint16_t *port_out);
khor_status ksock_resolve(const char *host, uint16_t port, ksockaddr *out, kerr *err);
/* "ip:port" text of an address; buf of at least 64 bytes. */
const char *ksock_addr_str(const ksockaddr *a, char *buf, size_t len);
uint16_t ksock_addr_port(const ksockaddr *a);
void ksock_addr_set_port(ksockaddr *a, uint16_t port);
bool ksock_addr_is_loopback(const ksockaddr *a);

khor_status ksock_set_nonblock(int fd, kerr *err);
void ksock_tune_stream(int fd, int bufsize); /* TCP_NODELAY, buffers; best effort */

/* Binds to addr (port 0 = any) and listens; *addr is updated with the real port. */
khor_status ksock_listen(ksockaddr *addr, int backlog, int *fd_out, kerr *err);
/*
 * Connects, retrying refused connections every few ms until the deadline (the other side
 * may still be starting). Returns a non-blocking socket.
 */
khor_status ksock_connect_deadline(const ksockaddr *addr, kdeadline dl, bool retry_refused,
                                   int *fd_out, kerr *err);
/* Exact-length I/O on a non-blocking socket, bounded by the deadline. what names the step. */
khor_status ksock_write_all(int fd, const void *buf, size_t len, kdeadline dl, const char *what,
                            kerr *err);
khor_status ksock_read_all(int fd, void *buf, size_t len, kdeadline dl, const char *what,
                           kerr *err);

/*
 * Picks the local address to publish. spec (KHOR_SOCKET_IFNAME) may be NULL or a list like
 * "eth,ib" (name prefixes), "=eth0" (exact names), "^docker,lo" (exclude prefixes) or a CIDR
 * "198.18.0.0/15". Without spec: the interface on the same subnet as hint (the store's
 * address) if any, loopback when hint is loopback, else the first non-loopback interface
 * that is up. When nothing matches, the error lists the interfaces that exist.
 */
khor_status ksock_pick_address(const char *spec, const ksockaddr *hint, ksockaddr *out,
                               char *ifname_out, size_t ifname_len, kerr *err);

#endif
