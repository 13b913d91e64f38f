/* err.c -- building error sentences into caller-owned buffers (see err.h). */
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

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
	/* Out of memory under an address-space limit: say which limit, once. */
	struct rlimit rl;
	size_t n = strlen(e->text);
	if (status == KHOR_ERR_NO_MEMORY && getrlimit(RLIMIT_AS, &rl) == 0 &&
	    rl.rlim_cur != RLIM_INFINITY && strstr(e->text, "(ulimit -v)") == NULL &&
	    n + 1 < sizeof(e->text))
		snprintf(e->text + n, sizeof(e->text) - n, " (the address-space limit is %llu MiB "
		         "(ulimit -v); raise it)", (unsigned long long)(rl.rlim_cur >> 20));
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

/* strerror_r's text into buf. */
static void errno_text(int errnum, char *buf, size_t len)
{
	/* The GNU strerror_r may return a static string instead of filling buf. */
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
	const char *t = strerror_r(errnum, buf, len);
	if (t != buf)
		kstrlcpy(buf, t, len);
#else
	if (strerror_r(errnum, buf, len) != 0)
		snprintf(buf, len, "errno %d", errnum);
#endif
}

/* " (ulimit ...: N)" for the limits behind EMFILE, ENFILE and ENOMEM, else "". */
static void limit_text(int errnum, char *buf, size_t len)
{
	struct rlimit rl;

	buf[0] = '\0';
	if (errnum == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
		snprintf(buf, len, ": the limit is %llu (ulimit -n); raise it or start fewer ranks "
		         "per host", (unsigned long long)rl.rlim_cur);
	else if (errnum == ENFILE)
		snprintf(buf, len, ": the system's table is full (sysctl fs.file-max)");
	else if (errnum == ENOMEM && getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		snprintf(buf, len, ": the address-space limit is %llu MiB (ulimit -v); raise it",
		         (unsigned long long)(rl.rlim_cur >> 20));
}

const char *kerr_errno_str(int errnum, char *buf, size_t len)
{
	char lim[200];
	size_t n;

	if (len == 0)
		return "";
	errno_text(errnum, buf, len);
	limit_text(errnum, lim, sizeof(lim));
	n = strlen(buf);
	if (lim[0] != '\0' && n + 1 < len)
		snprintf(buf + n, len - n, "%s", lim);
	return buf;
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
