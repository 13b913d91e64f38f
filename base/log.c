/* log.c -- the logger (see log.h). One write() per line so ranks' lines do not interleave. */
#include "log.h"
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int klog_threshold = KLOG_WARN;
static char klog_ident[96] = "khor";

static const char *const level_names[] = { "ERROR", "WARN", "INFO", "DEBUG", "TRACE" };

void klog_init_from_env(void)
{
	const char *v = getenv("KHOR_LOG");

	/* Horovod's name for it; its levels (trace, debug, info, warning, error, fatal) are
	 * ours, fatal aside, which shows errors. */
	if (v == NULL || *v == '\0')
		v = getenv("HOROVOD_LOG_LEVEL");
	if (v == NULL || *v == '\0')
		return;
	if (strcasecmp(v, "fatal") == 0) {
		klog_threshold = KLOG_ERROR;
		return;
	}
	for (int i = 0; i < 5; i++) {
		if (strcasecmp(v, level_names[i]) == 0) {
			klog_threshold = i;
			return;
		}
	}
	if (strcasecmp(v, "warning") == 0)
		klog_threshold = KLOG_WARN;
	else if (v[0] >= '0' && v[0] <= '4')
		klog_threshold = v[0] - '0';
}

void klog_set_identity(int rank, const char *host)
{
	snprintf(klog_ident, sizeof(klog_ident), "khor[rank %d %s]", rank, host);
}

void klog_write(enum klog_level level, const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	n = snprintf(line, sizeof(line), "%s %s ", klog_ident, level_names[level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* Nowhere left to report a failed log write. */
	}
}
