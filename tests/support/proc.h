/*
 * proc.h -- a khorrun (or any program) run by a test as a child, with its stdout and stderr
 * read as they come, so a test can act on a line (kill the rank it names) and then check
 * the rest: the exit status, the messages, and that nothing it started outlived it.
 * Failures are Criterion assertions naming what was seen.
 */
#ifndef KHOR_TESTS_SUPPORT_PROC_H
#define KHOR_TESTS_SUPPORT_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct buf {
	char *data;
	size_t len, cap;
	bool eof;
};

/* A running khorrun with its stdout (b[0]) and stderr (b[1]) captured. */
struct proc {
	pid_t pid;
	int fd[2];
	struct buf b[2];
	int status;
	double secs; /* from start to exit */
};

double now_s(void);
/* $KHORRUN, else ./khorrun. */
const char *khorrun_path(void);
/* Starts khorrun with args (NULL-terminated, without argv[0]); env is "NAME=VALUE"s or NULL. */
void proc_start(struct proc *p, const char *const *args, const char *const *env);
/* Reads what is there (waiting up to ms); returns false once both pipes are at EOF. */
bool proc_pump(struct proc *p, int ms);
/* Collects the rest of the output and the exit status; fails the test after timeout_s. */
void proc_finish(struct proc *p, double timeout_s);
void proc_free(struct proc *p);
/* Its exit status (it must have exited, not been killed). */
int exit_code(const struct proc *p);
/* proc_start then proc_finish. */
struct proc run(const char *const *args, double timeout_s);
size_t count_str(const char *hay, const char *needle);
/* Waits until stdout (wait_for) or stream k holds n occurrences of needle. */
void wait_for(struct proc *p, const char *needle, size_t n, double timeout_s);
void wait_for_in(struct proc *p, int k, const char *needle, size_t n, double timeout_s);
/* Every number that follows key ("pid=") in text, up to max. */
size_t collect_pids(const char *text, const char *key, pid_t *pids, size_t max);
/* No process has this pid any more (zombies count as alive: nobody reaped them). */
bool pid_gone(pid_t pid);
void assert_all_gone(const pid_t *pids, size_t n);

#endif
