/*
 * say.c -- khorrun's own messages. Each is one write of one line, so it never lands inside a
 * rank's line; in the helper the same calls become frames, so the user reads them on
 * khorrun's terminal with the host's name in front.
 */
#include "say.h"

#include "frames.h"

#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* In the helper, say() sends its line to khorrun as a frame (see helper_main). */
static bool say_as_frame;

void say_to_frames(void)
{
	say_as_frame = true;
}

/* khorrun's own messages: one write per line, so they never split a rank's line. */
void say(const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	n = say_as_frame ? 0 : snprintf(line, sizeof(line), "khorrun: ");
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	if (say_as_frame) {
		frame_send('M', line, (size_t)n, NULL, 0);
		return;
	}
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* stderr is gone; there is nowhere left to say anything. */
	}
}

const char *say_sig_name(int sig, char *buf, size_t len)
{
	const char *abbrev = sigabbrev_np(sig);

	if (abbrev != NULL)
		snprintf(buf, len, "SIG%s", abbrev);
	else
		snprintf(buf, len, "signal %d", sig);
	return buf;
}

/* "exited with status 3" / "killed by signal SIGKILL (9)" */
void say_status(int wstatus, char *buf, size_t len)
{
	char name[32];

	if (WIFEXITED(wstatus))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(wstatus));
	else if (WIFSIGNALED(wstatus))
		snprintf(buf, len, "killed by signal %s (%d)%s",
		         say_sig_name(WTERMSIG(wstatus), name, sizeof(name)), WTERMSIG(wstatus),
		         WCOREDUMP(wstatus) ? " (core dumped)" : "");
	else
		snprintf(buf, len, "ended with wait status 0x%x", (unsigned)wstatus);
}
