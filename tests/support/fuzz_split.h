/*
 * fuzz_split.h -- the first step every libFuzzer harness here takes: the input's first
 * byte picks one of its parsers, which gets the rest as an exact-size heap copy, so that
 * AddressSanitizer sees any read past the end of what arrived. Inputs over max bytes
 * (0: no limit) are passed over.
 */
#ifndef KHOR_TESTS_SUPPORT_FUZZ_SPLIT_H
#define KHOR_TESTS_SUPPORT_FUZZ_SPLIT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*fuzz_part)(const uint8_t *d, size_t n);

static inline void fuzz_split(const uint8_t *data, size_t size, size_t max,
                              const fuzz_part *parts, size_t nparts)
{
	uint8_t *copy;

	if (size == 0 || (max > 0 && size > max))
		return;
	copy = malloc(size - 1 ? size - 1 : 1);
	if (copy == NULL)
		return;
	memcpy(copy, data + 1, size - 1);
	parts[data[0] % nparts](copy, size - 1);
	free(copy);
}

#endif
