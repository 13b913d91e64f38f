/*
 * ssh.h -- khorrun's side of each other host: one ssh connection whose remote command is
 * `khorrun --remote-helper` (helper.c), the setup frames it is sent, and what comes back
 * (frames on stdout, ssh's own words on stderr) until the host is finished.
 */
#ifndef KHOR_LAUNCHER_SSH_H
#define KHOR_LAUNCHER_SSH_H

#include "job.h"

/* Starts ssh to h with its helper and queues the setup frames; false with the reason said. */
bool ssh_start(struct job *j, struct host *h, const char *khorrun_path, const char *cwd,
               char **common, size_t ncommon, const sigset_t *child_mask);
/* "'...'" for sh, with ' written as '\'' (malloc'd; NULL when out of memory). */
char *ssh_quote(const char *s);
/* The ssh command line for h; free v[0] and v. NULL with the reason said. */
char **ssh_argv(const struct job *j, const struct host *h, const char *remote_cmd,
                char *timeout_opt);
/* The start of h failed (the reason said): the job stops with status code. */
void ssh_start_failed(struct job *j, struct host *h, int code);
/* Something of h ended (its ssh, one of its pipes): finishes h once all have. */
void ssh_check(struct job *j, struct host *h);
/* h's helper wrote frames (or text before its magic) on ssh's stdout. */
void ssh_read(struct job *j, struct host *h);
/* ssh, or the remote shell, wrote on stderr. */
void ssh_read_err(struct job *j, struct host *h);
/* --start-timeout passed: every host whose ranks have not started is a failed start. */
void ssh_start_timed_out(struct job *j);

#endif
