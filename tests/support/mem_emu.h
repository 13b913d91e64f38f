/*
 * mem_emu.h -- the emulated device (mem_emu.c), a test double of the memory seam: what a
 * test needs to fill and read device buffers and to hold a stream back. Test-only: it is
 * built into the static library khor_mem_emu (tests/CMakeLists.txt), never into libkhor.
 *
 * The backend itself is kmem_emu_backend, which linking khor_mem_emu adds to the seam
 * (kmem_backend_add). KHOR_MEM_EMU_DELAY_US=N in the environment, this double's own knob,
 * makes every operation of every emu stream first sleep a pseudo-random 0..N us, so a
 * schedule that forgets a stream-ordered wait reads stale data.
 */
#ifndef KHOR_MEM_EMU_H
#define KHOR_MEM_EMU_H

#include "collectives/mem.h"

extern const kmem_backend kmem_emu_backend;

/* Enqueues a sleep of us microseconds on stream (NULL: the default stream). */
khor_status kmem_emu_delay(void *stream, unsigned us, kerr *err);

/* Emulated device memory of len bytes, or NULL (the reason is logged). */
void *kmem_emu_alloc(size_t len);
void kmem_emu_free(void *p);

/* A copy between any host and emu pointers on the default stream, waited for (60 s). */
khor_status kmem_emu_copy_sync(void *dst, const void *src, size_t len);

/* Waits (60 s) until everything enqueued on stream (NULL: the default stream) has run. */
khor_status kmem_emu_stream_sync(void *stream);

#endif
