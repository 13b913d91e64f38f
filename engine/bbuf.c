/* bbuf.c -- the sentences written into byte buffers (bbuf.h): formatted text, rank lists. */
#include "bbuf.h"

#include <stdarg.h>
#include <stdio.h>

void bbuf_rank_list(bbuf *b, const int *ranks, int n)
{
	char tmp[16];

	for (int i = 0; i < n; i++) {
		int l = snprintf(tmp, sizeof(tmp), "%s%d", i > 0 ? ", " : "", ranks[i]);
		bput(b, tmp, (size_t)l);
	}
}

void bbuf_printf(bbuf *b, const char *fmt, ...)
{
	char tmp[1024];
	va_list ap;

	va_start(ap, fmt);
	int l = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (l > 0)
		bput(b, tmp, (size_t)(l < (int)sizeof(tmp) ? l : (int)sizeof(tmp) - 1));
}
