/*
 * bcast.c -- pipelined chain broadcast.
 *
 * Ranks form a chain in ring order starting at the root; the buffer is cut into slices
 * and each rank forwards slice k to the next rank as soon as it has received it:
 *
 *   root -> r+1 -> r+2 -> ... -> r+n-1          (ranks modulo n)
 *   time ->  | k0 | k1 | k2 | k3 |
 *   hop 1    |=k0=|=k1=|=k2=|=k3=|
 *   hop 2         |=k0=|=k1=|=k2=|=k3=|
 *
 * For S slices the time is about (S + n - 2) slice transfers, so large buffers reach the
 * link's bandwidth. Small buffers pay n-1 hops; a binomial tree is the better choice
 * there (see the algorithm selection issue). At least one (possibly empty) slice is always
 * sent so that a disagreement on count or dtype shows up in the frame header.
 */
#include "base/dtype.h"
#include "ring.h"

#include <stdio.h>
#include <string.h>

khor_status chain_broadcast(coll_comm *cc, void *buf, size_t count, khor_dtype dtype, int root,
                            uint32_t seq, kerr *err)
{
	const int n = cc->size;
	const int pos = (cc->rank - root + n) % n;
	const int prev = (cc->rank - 1 + n) % n, next = (cc->rank + 1) % n;
	const bool has_prev = pos > 0, has_next = pos < n - 1;
	const size_t bytes = count * kdtype_size(dtype);
	size_t slice = cc->slice_bytes, nslices;
	size_t recv_posted = 0, recv_done = 0, send_posted = 0, send_done = 0;
	int window = cc->max_lanes < 1 ? 1 : (cc->max_lanes > 32 ? 32 : cc->max_lanes);
	coll_xfer rx[32], tx[32];
	uint8_t *p = buf;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return KHOR_SUCCESS;
	if (slice == 0)
		slice = 1 << 20;
	nslices = bytes == 0 ? 1 : (bytes + slice - 1) / slice;
	while (nslices >= UINT32_MAX) {
		slice *= 2;
		nslices = (bytes + slice - 1) / slice;
	}
	memset(rx, 0, sizeof(rx));
	memset(tx, 0, sizeof(tx));
	coll_wait_begin(cc, &w, "broadcast seq %u (root %d)", seq, root);
	const uint32_t meta = coll_meta_make(COLL_BROADCAST, dtype, 0);
	if (!has_prev)
		recv_posted = recv_done = nslices; /* the root has everything already */

	while (st == KHOR_SUCCESS &&
	       (recv_done < nslices || (has_next && send_done < nslices))) {
		bool moved = false;

		/* Keep `window` receives posted ahead. */
		while (recv_posted < nslices && recv_posted - recv_done < (size_t)window) {
			size_t k = recv_posted, off = k * slice;
			size_t len = bytes - off < slice ? bytes - off : slice;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &rx[k % (size_t)window], prev, false, p + off, len, tag, w.dl,
			               err);
			if (st != KHOR_SUCCESS)
				break;
			recv_posted++;
			moved = true;
		}
		while (st == KHOR_SUCCESS && recv_done < recv_posted &&
		       coll_done(cc, &rx[recv_done % (size_t)window], &st, err) && st == KHOR_SUCCESS) {
			recv_done++;
			moved = true;
		}
		/* Forward every slice we hold, `window` at a time. */
		while (st == KHOR_SUCCESS && has_next && send_posted < recv_done &&
		       send_posted - send_done < (size_t)window) {
			size_t k = send_posted, off = k * slice;
			size_t len = bytes - off < slice ? bytes - off : slice;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &tx[k % (size_t)window], next, true, p + off, len, tag, w.dl,
			               err);
			if (st != KHOR_SUCCESS)
				break;
			send_posted++;
			moved = true;
		}
		while (st == KHOR_SUCCESS && send_done < send_posted &&
		       coll_done(cc, &tx[send_done % (size_t)window], &st, err) && st == KHOR_SUCCESS) {
			send_done++;
			moved = true;
		}
		if (st != KHOR_SUCCESS)
			break;
		if (!moved && (recv_done < nslices || (has_next && send_done < nslices))) {
			coll_xfer xs[64];
			for (int i = 0; i < window; i++) {
				xs[i] = rx[i];
				xs[window + i] = tx[i];
			}
			st = coll_wait_step(cc, &w, xs, 2 * window, err);
		}
	}
	if (st != KHOR_SUCCESS) {
		coll_drain(cc, rx, window);
		coll_drain(cc, tx, window);
		coll_wait_fail(&w, err, " (chain)");
	}
	return st;
}
