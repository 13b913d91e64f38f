/*
 * filter.h -- a layer between the collectives and a real transport, in the shape of a
 * transport itself (transport.h's table, wrapping another's): frame checksums
 * (KHOR_CHECKSUM=1) and injected faults (KHOR_FAULTS, for tests), in the way SQLite's
 * fault-injecting VFS sits under its pager.
 *
 * The runtime puts it over every transport it creates when either setting is on, and not
 * at all otherwise, so a job without them runs the transports' own ops, with nothing in
 * between.
 *
 * Checksums: every frame is followed on its link by a 16-byte trailer frame (the same tag
 * with the top bit of step set, which no collective uses) holding kchecksum(payload) and
 * the length; the receiver sums what it got and fails the request and the link, naming
 * the peer, the tag and both sums, on a mismatch. tcp's own checksums cover each segment on
 * the wire, not the bytes between two processes' memories; shm and RDMA writes have none:
 * this is what finds a corruption anywhere on the way.
 *
 * Faults: KHOR_FAULTS is a list of rules, separated by ',' or ';':
 *
 *     FROM>TO:KIND[=VALUE][@AT]
 *
 * FROM and TO are ranks or '*'. The rule acts in rank FROM on its link to rank TO, on the
 * frames FROM sends there (AT counts their payload bytes, with k/M/G suffixes: the rule
 * fires on the first frame that reaches byte AT), except where said:
 *
 *     drop          the link is cut before that frame goes (the transport's sever op: the
 *                   peer sees its connection lost, as after a real reset)
 *     trunc         that frame goes with half its bytes (at least one fewer)
 *     hdr=FIELD     that frame's header is wrong: one high bit flipped in comm, seq or step
 *                   (the frame names a call nobody is in), meta's low bit (another
 *                   operation), or len (one byte short); FIELD defaults to seq
 *     data          one bit flipped in that frame's payload (byte AT, or its first byte)
 *     delay=MS      that frame and every later one wait MS milliseconds before they go
 *     stall=MS      the rank stops for MS milliseconds before that frame goes, as a process
 *                   that is alive but descheduled
 *     regfail       registration number AT (0 = the first) of the rank's instance fails,
 *                   as with a locked-memory limit (TO is not used; ib only: tcp and shm
 *                   register nothing)
 *     fail          completion number AT (0 = the first) of a transfer on the link, either
 *                   way, fails, as a verbs work completion with an error would, and the
 *                   link is cut
 *
 * Every rule but delay fires once. A rule that cannot apply to the transport (regfail over
 * tcp) is refused when the layer is made, naming the rule. The frames of the checksum are
 * not counted and not damaged (the faults act on the collectives' frames), but they
 * share the link's fate: cut, delayed, stalled.
 */
#ifndef KHOR_TRANSPORT_FILTER_H
#define KHOR_TRANSPORT_FILTER_H

#include "transport/transport.h"

#include <stdbool.h>

/* The most rules in KHOR_FAULTS. */
#define FILTER_RULES_MAX 32

enum filter_kind {
	FK_DROP, FK_TRUNC, FK_HDR, FK_DATA, FK_DELAY, FK_STALL, FK_REGFAIL, FK_FAIL,
};
enum filter_field { FF_COMM, FF_SEQ, FF_STEP, FF_META, FF_LEN };

typedef struct filter_rule {
	int from, to;            /* ranks; -1 = any */
	enum filter_kind kind;
	enum filter_field field; /* hdr */
	int64_t ms;              /* delay, stall */
	uint64_t at;             /* a byte of the link's stream, or a count (regfail, fail) */
} filter_rule;

/*
 * Parses KHOR_FAULTS' value into at most FILTER_RULES_MAX rules (*n_out of them); "" gives
 * none. KHOR_ERR_INVALID_ARG naming the rule and what is wrong with it otherwise.
 */
khor_status filter_parse(const char *spec, filter_rule *rules, int *n_out, kerr *err);

/*
 * A table that puts the layer over inner, with these settings (spec: KHOR_FAULTS' value,
 * "" or NULL for none; checksum: KHOR_CHECKSUM); *out is valid for the process's life.
 * At most four inner tables at a time; wrapping one again replaces its settings (the
 * runtime wraps again at every init). KHOR_ERR_INVALID_ARG for a spec that does not
 * parse or a rule the transport cannot carry out.
 */
khor_status filter_wrap(const struct transport_ops *inner, const char *spec, bool checksum,
                        const struct transport_ops **out, kerr *err);

#endif
