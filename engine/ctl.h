/* ctl.h -- the cycle's messages on a set's control comm (ctl.c). */
#ifndef KHOR_ENGINE_CTL_H
#define KHOR_ENGINE_CTL_H

#include "bbuf.h"
#include "types.h"


#define MSG_MAGIC 0x4b4e4547u /* "KNEG" */
#define MSG_INLINE 240
#define MSG_MAX (256u << 20) /* a report or response: 4-byte slots or descriptors, far less */

enum { M_REQ = 1, M_GO, M_RESP, M_ABORT };

typedef struct msg_hdr {
	uint32_t magic;
	uint8_t type;
	uint8_t pad[3];
	uint32_t cycle;
	uint32_t len;
	uint8_t data[MSG_INLINE];
} msg_hdr;


/*
 * A wait that would sleep now, handed back to its caller instead (ctl_wait with a yield):
 * how long it would sleep, and in which of the ctl comm's transports (bit i = tps[i]).
 */
typedef struct ctl_yield {
	int ms;
	unsigned mask;
} ctl_yield;

/*
 * Waits until one of xs completes (*which = its index), or, with wake_ok, this set is woken
 * by an enqueue or a stop (*which = -1), or dl passes, or idle_ms (> 0) passes (*which = -2).
 * Spins for the comm's spin time first when spin. With y, a wait that would go to sleep
 * returns instead (*which = -3, *y filled): the idle wait of a turn, whose caller lets go of
 * the set's baton before it sleeps (ctl_sleep). Link errors come back with the peer named
 * by the transport.
 */
khor_status ctl_wait(eset *s, coll_xfer *xs, int nxs, bool wake_ok, kdeadline dl, bool spin,
                     int idle_ms, ctl_yield *y, int *which, kerr *err);
/*
 * Sleeps as ctl_wait would have (y), in the transports alone: it touches nothing of the ctl
 * comm's own state, so the thread need not hold the set's baton. It returns early when
 * anything moves or the set is woken; the next turn looks at what it was.
 */
void ctl_sleep(eset *s, const ctl_yield *y);
/*
 * For a wait with no deadline of its own (a worker's for the coordinator's answer, which
 * comes when every rank has asked for the same tensors, however late): once *next passed,
 * judges its peers quietly (coll_wait_alive_quiet): the wait is published, so that a peer
 * waiting for this rank in turn finds the deadlock (a lost or misdirected message), and a
 * dead peer fails it; *next is when to look again. t0: when the wait began.
 */
khor_status ctl_look(eset *s, coll_xfer *xs, int nxs, uint64_t t0, kdeadline *next, kerr *err);
/* The tag of this cycle's message at step. */
tp_tag ctl_tag(const eset *s, uint32_t step);
/* Sends a header (+ payload frame) to peer; the transfers go into xs[0..1]. */
khor_status ctl_send(eset *s, int peer, uint8_t type, uint32_t step, const bbuf *pl,
                     msg_hdr *hdr, coll_xfer *xs, kerr *err);
/* Waits for sends to finish (bounded). */
khor_status ctl_flush(eset *s, coll_xfer *xs, int nxs, kerr *err);
void ctl_drain(eset *s, coll_xfer *xs, int nxs);
/* Receives the payload that follows hdr (when it did not fit), into *out (malloc'd). */
khor_status ctl_payload(eset *s, int peer, const msg_hdr *hdr, uint32_t step, uint8_t **out,
                        kerr *err);
/* A header of this cycle, of a known type, of a length within bounds. */
khor_status ctl_check_hdr(const eset *s, const msg_hdr *h, int peer, kerr *err);
/* Tells every worker the set failed (best effort: a short wait, then give up). */
void ctl_abort(eset *s, const bool *go_sent, const kerr *cause);

#endif
