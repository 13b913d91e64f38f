/*
 * checksum.h -- a 64-bit checksum of a byte range, for KHOR_CHECKSUM (transport/filter):
 * fast enough to sit on every frame, strong enough that a flipped bit never goes unseen.
 *
 * Fletcher's pair of running sums over 64-bit words, four lanes wide (one 32-byte vector a
 * step, AVX2 where the CPU has it): s1 += w; s2 += s1, then the eight sums and the length
 * folded through a 64-bit mix. Any changed word changes its lane's s1, and s2 sees order
 * (swapped words), so damage of any shape goes unseen with odds near 2^-64. Not a MAC: it
 * finds damage, not an attacker (links are authenticated at their handshake,
 * docs/DESIGN.md).
 */
#ifndef KHOR_BASE_CHECKSUM_H
#define KHOR_BASE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t kchecksum(const void *p, size_t len);

#endif
