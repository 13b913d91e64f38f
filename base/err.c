/* err.c -- building error sentences into caller-owned buffers (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

khor_status kerr_set(kerr *e, khor_status status, const char *fmt, ...)
{
	va_list ap;

	if (e == NULL)
		return status;
	e->status = status;
	e->peer = -1;
	va_start(ap, fmt);
	vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	return status;
}

void kerr_prefix(kerr *e, const char *fmt, ...)
{
	char old[KERR_TEXT_MAX];
	size_t n;
	va_list ap;

	kstrlcpy(old, e->text, sizeof(old));
	va_start(ap, fmt);
	n = (size_t)vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	if (n + 2 < sizeof(e->text)) {
		memcpy(e->text + n, ": ", 3);
		kstrlcpy(e->text + n + 2, old, sizeof(e->text) - n - 2);
	}
}

const char *kerr_errno_str(int errnum, char *buf, size_t len)
{
	/* The GNU strerror_r may return a static string instead of filling buf. */
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
	return strerror_r(errnum, buf, len);
#else
	if (strerror_r(errnum, buf, len) != 0)
		snprintf(buf, len, "errno %d", errnum);
	return buf;
#endif
}

size_t kstrlcpy(char *dst, const char *src, size_t size)
{
	size_t n = strlen(src);

	if (size > 0) {
		size_t c = n < size - 1 ? n : size - 1;
		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return n;
}
