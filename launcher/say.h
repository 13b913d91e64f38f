/*
 * say.h -- khorrun's own messages ("khorrun: ..." on stderr, or in the helper a frame to
 * khorrun) and the words for a wait status or a signal that every message uses.
 */
#ifndef KHOR_LAUNCHER_SAY_H
#define KHOR_LAUNCHER_SAY_H

#include <stddef.h>

void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* From here on say() sends its lines to khorrun as 'M' frames (the helper, see helper.c). */
void say_to_frames(void);
const char *say_sig_name(int sig, char *buf, size_t len);
void say_status(int wstatus, char *buf, size_t len);

#endif
