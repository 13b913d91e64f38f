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
/* Reads what has come, at least one byte and at most cap (a stream parsed as it arrives). */
khor_status ksock_read_some(int fd, void *buf, size_t cap, kdeadline dl, const char *what,
                            size_t *len_out, kerr *err);

/*
 * Picks the local address to publish. spec (KHOR_SOCKET_IFNAME) may be NULL or a list like
 * "eth,ib" (name prefixes), "=eth0" (exact names), "^docker,lo" (exclude prefixes), "^=lo"
 * (exclude exact names: NCCL_SOCKET_IFNAME's four forms) or a CIDR "198.18.0.0/15". Without spec: the interface on the same subnet as hint (the store's
 * address) if any, loopback when hint is loopback, else the first non-loopback interface
 * that is up. When nothing matches, the error lists the interfaces that exist.
 */
khor_status ksock_pick_address(const char *spec, const ksockaddr *hint, ksockaddr *out,
                               char *ifname_out, size_t ifname_len, kerr *err);

/*
 * Several addresses per rank (the tcp transport's address blob, "ip1:port,ip2:port"). A
 * host may have several networks whose interfaces are named differently on every host, so
 * instead of one address a rank publishes every address a peer might reach it on, best
 * first, and each connector picks among them by its own subnets (docs/DESIGN-NOTES.md,
 * "Bootstrap and store").
 */
#define KSOCK_MAX_CANDS 8
#define KSOCK_MAX_IFACES 64

/* One address of an interface of this host. */
typedef struct ksock_iface {
	char name[32];
	ksockaddr addr; /* port 0 */
	int prefix;     /* bits of its netmask; -1 when unknown */
	bool loopback;
	bool running;   /* IFF_RUNNING: it has a carrier (a cable, a veth peer that is up) */
} ksock_iface;

/* Every address of every interface that is up (not IPv6 link-local), in getifaddrs order
 * (interface index order on Linux). At most max; *n_out may be 0. */
khor_status ksock_list_ifaces(ksock_iface *out, int max, int *n_out, kerr *err);
/* Interfaces of containers and VMs (docker0, br-<id>, virbr0, veth..., cni0, ...): the same
 * address on every host, reaching only this host's guests; never published when another
 * interface exists. */
bool ksock_is_virtual_ifname(const char *name);
/* Same address family and the same first prefix bits (a /0 matches the whole family). */
bool ksock_same_subnet(const ksockaddr *a, const ksockaddr *b, int prefix);
bool ksock_same_ip(const ksockaddr *a, const ksockaddr *b);
/* "198.19.10.0/24" for an address and a prefix length. buf of at least 64 bytes. */
const char *ksock_subnet_str(const ksockaddr *a, int prefix, char *buf, size_t len);
/*
 * Which of this host's addresses to publish, best first (pure: ifs as ksock_list_ifaces
 * gives them): loopback alone when hint (the store) is loopback, since then the whole job
 * is on this host; else the addresses on the store's subnet, then every other non-loopback,
 * non-virtual one with a carrier; virtual or carrier-less ones only when there is nothing
 * else, loopback only when there is nothing at all. One address family: the store's (IPv4
 * without a store). An address appears once. Writes indices into ifs; returns how many (at
 * most max).
 */
int ksock_order_candidates(const ksock_iface *ifs, int n, const ksockaddr *hint, int *idx_out,
                           int max);
/*
 * Whether a store at host (as the user wrote it), resolved here to addr, puts the whole
 * job on this host: a loopback address written as such, or "localhost". Any other name that
 * resolves to loopback here does not (Debian's /etc/hosts maps a machine's own name to
 * 127.0.1.1, while the other hosts resolve it to a real address), so the caller should
 * then choose addresses as if it knew nothing of the store.
 */
bool ksock_store_is_local_only(const char *host, const ksockaddr *addr);
/* KHOR_SOCKET_IFNAME set: the one address ksock_pick_address picks, as before. Unset: the
 * addresses of ksock_order_candidates. The error lists the interfaces that exist. */
khor_status ksock_pick_candidates(const char *spec, const ksockaddr *hint, ksock_iface *out,
                                  int max, int *n_out, kerr *err);

/* "ip:port,ip:port,[v6]:port", numeric addresses only: how many were read (at most max),
 * or -1 when an entry is malformed or there is none. */
int ksock_parse_addr_list(const char *s, ksockaddr *out, int max);

/* How a peer's address relates to this host's addresses, best first. */
enum ksock_reach {
	KSOCK_REACH_LOCAL = 0,  /* every address the peer gave is one of ours: same host */
	KSOCK_REACH_SUBNET = 1, /* on the subnet of one of our interfaces */
	KSOCK_REACH_ROUTED = 2, /* on none of our subnets: a router must carry it */
	KSOCK_REACH_OWN = 3,    /* one of our own addresses while the others are not: it would
	                         * reach this host, not the peer (the same private subnet on
	                         * two hosts); tried last */
};
/*
 * The order in which to dial a peer's n addresses (pure): by enum ksock_reach, and in the
 * peer's order within one kind (it put the store's subnet first). order_out[i] is an index
 * into peer, kind_out[i] its kind and via_out[i] the index into mine of the interface whose
 * subnet it shares (-1 if none).
 */
void ksock_order_peer(const ksockaddr *peer, int n, const ksock_iface *mine, int nmine,
                      int *order_out, enum ksock_reach *kind_out, int *via_out);

#endif
