/*
 * log.h -- khor's logger, the one piece of global state in base/. Level comes from
 * KHOR_LOG (error, warn, info, debug, trace; default warn); lines go to stderr as
 * "khor[rank R HOST] LEVEL message". The runtime sets the rank once it knows it.
 */
#ifndef KHOR_BASE_LOG_H
#define KHOR_BASE_LOG_H

enum klog_level { KLOG_ERROR = 0, KLOG_WARN, KLOG_INFO, KLOG_DEBUG, KLOG_TRACE };

extern int klog_threshold;

void klog_init_from_env(void);
void klog_set_identity(int rank, const char *host);
void klog_write(enum klog_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define KLOG(level, ...)                                   \
	do {                                               \
		if ((int)(level) <= klog_threshold)        \
			klog_write((level), __VA_ARGS__);  \
	} while (0)
#define KLOG_ERR(...) KLOG(KLOG_ERROR, __VA_ARGS__)
#define KLOG_WARN(...) KLOG(KLOG_WARN, __VA_ARGS__)
#define KLOG_INFO(...) KLOG(KLOG_INFO, __VA_ARGS__)
#define KLOG_DEBUG(...) KLOG(KLOG_DEBUG, __VA_ARGS__)

#endif
