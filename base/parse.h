/*
 * parse.h -- strict parsers for the numbers people write in KHOR_* variables and on
 * command lines: integers, byte sizes with K/M/G suffixes, durations with ms/s/m suffixes.
 * Each rejects trailing junk, overflow and empty strings instead of guessing.
 */
#ifndef KHOR_BASE_PARSE_H
#define KHOR_BASE_PARSE_H

#include <stdbool.h>
#include <stdint.h>

bool kparse_i64(const char *s, int64_t *out);
/* "64", "64K", "8M", "1G", "4KiB": powers of 1024. */
bool kparse_size(const char *s, uint64_t *out);
/* "30" (seconds), "30s", "500ms", "2m"; "-1"/"inf"/"none" mean no deadline (-1). */
bool kparse_duration_ms(const char *s, int64_t *out);
bool kparse_bool(const char *s, bool *out);
/* Whether s is one of kparse_bool's "on" words (NULL and anything else: false). */
bool kparse_is_true(const char *s);

#endif
