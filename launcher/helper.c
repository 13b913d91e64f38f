/*
 * helper.c -- `khorrun --remote-helper`, what ssh runs on another host. It is khorrun
 * itself, so the far side starts, watches and stops its ranks with the same code as this
 * side (spawn.c, loop.c, procs.c) and a lost connection stops them there. It does no
 * placement and no line splitting: khorrun does both, alike for every host.
 */
#include "helper.h"

#include "base/err.h"
#include "env.h"
#include "frames.h"
#include "job.h"
#include "khor.h"
#include "loop.h"
#include "output.h"
#include "procs.h"
#include "say.h"
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * How long the helper waits for khorrun's start-up frames: khorrun sends them as soon as
 * ssh is up and gives up itself after --start-timeout (30 s by default), closing the
 * connection; this bounds a connection that stays open but silent.
 */
#define HELPER_START_MS (10 * 60 * 1000)

void helper_start_init(struct helper_start *hs)
{
	memset(hs, 0, sizeof(*hs));
	hs->grace = DEFAULT_GRACE_MS;
}

void helper_start_free(struct helper_start *hs)
{
	for (size_t i = 0; i < hs->nargv; i++)
		free(hs->argv[i]);
	free(hs->argv);
	for (size_t i = 0; i < hs->nenv; i++)
		free(hs->env[i]);
	free(hs->env);
	free(hs->hslots);
	free(hs->ids);
	free(hs->cwd);
	memset(hs, 0, sizeof(*hs));
}

/* The start-up frames (see host_setup_frames): the only bytes a helper reads before "go". */
int helper_take(struct helper_start *hs, char type, const char *buf, size_t n)
{
	switch (type) {
	case 'H': {
		char mine[128];

		snprintf(mine, sizeof(mine), "%s %d.%d.%d", HELPER_PROTO, KHOR_VERSION_MAJOR,
		         KHOR_VERSION_MINOR, KHOR_VERSION_PATCH);
		if (strcmp(buf, mine) != 0) {
			snprintf(hs->why, sizeof(hs->why), "the khorrun here (%s) is not the one that "
			         "started the job (%.100s); install the same khor on every host", mine,
			         buf);
			return -1;
		}
		hs->proto_ok = true;
		return 0;
	}
	case 'C':
		free(hs->cwd);
		hs->cwd = strdup(buf);
		return 0;
	case 'A': {
		char **a = realloc(hs->argv, (hs->nargv + 2) * sizeof(*hs->argv));

		if (a == NULL)
			return -1;
		hs->argv = a;
		hs->argv[hs->nargv] = strdup(buf);
		if (hs->argv[hs->nargv] == NULL) {
			/* A short argument list would run another command line: stop instead. */
			snprintf(hs->why, sizeof(hs->why), "out of memory for the program's arguments");
			return -1;
		}
		hs->argv[++hs->nargv] = NULL;
		return 0;
	}
	case 'V': {
		/* The secret among them: only this process and the ranks hold it. */
		if (strchr(buf, '=') == NULL)
			return 0;
		char **v = realloc(hs->env, (hs->nenv + 1) * sizeof(*hs->env));
		char *e = strdup(buf);
		if (v != NULL)
			hs->env = v;
		if (v == NULL || e == NULL) {
			/* A rank without one of the job's variables would fail later, and less
			 * clearly (the secret, the store's address): stop here instead. */
			free(e);
			snprintf(hs->why, sizeof(hs->why), "out of memory for the job's environment");
			return -1;
		}
		hs->env[hs->nenv++] = e;
		return 0;
	}
	case 'R': {
		if (hs->nranks >= MAX_RANKS)
			return -1;
		void *p = realloc(hs->hslots, (size_t)(hs->nranks + 1) * sizeof(*hs->hslots));
		int *pi = realloc(hs->ids, (size_t)(hs->nranks + 1) * sizeof(*hs->ids));
		const char *q = buf + strlen(buf) + 1;

		if (p != NULL)
			hs->hslots = p;
		if (pi != NULL)
			hs->ids = pi;
		if (p == NULL || pi == NULL)
			return -1;
		/* The frame's first word is the rank's id in khorrun's frames. */
		hs->ids[hs->nranks] = atoi(buf);
		memset(hs->hslots[hs->nranks], 0, sizeof(hs->hslots[hs->nranks]));
		for (size_t k = 0; k < NSLOTS && q < buf + n; k++) {
			kstrlcpy(hs->hslots[hs->nranks][k], q, SLOT_LEN);
			q += strlen(q) + 1;
		}
		hs->nranks++;
		return 0;
	}
	case 'G':
		/* "grace bind"; a grace khorrun's --grace would refuse (negative) is not taken. */
		if (sscanf(buf, "%lld %d", &hs->grace, &hs->bindm) < 1 || hs->grace < 0)
			hs->grace = DEFAULT_GRACE_MS;
		hs->go = true;
		return 1;
	default:
		return 0;
	}
}

/*
 * The far side of one ssh connection: reads what khorrun sends (see host_setup_frames),
 * starts this host's ranks as khorrun would start local ones, and reports their output and
 * ends as frames until all are gone. Its ranks are stopped when khorrun says so, and when
 * the session ends (EOF on stdin). Its messages go to khorrun as frames too (say()).
 */
int helper_main(void)
{
	struct job job;
	struct job *j = &job;
	struct helper_start hs;
	char *buf = malloc(FRAME_MAX + 1), *path = NULL, hostname[256] = "";
	char *fixed[1];
	size_t nfixed = 0;
	int rc = 1;
	sigset_t old_mask;
	cpubind_cpus cpus = { 0 };
	char ebuf[128];

	memset(j, 0, sizeof(*j));
	helper_start_init(&hs);
	j->helper = true;
	j->sfd = -1;
	j->first_fail = -1;
	say_to_frames();
	signal(SIGPIPE, SIG_IGN);
	if (write(STDOUT_FILENO, frame_magic, FRAME_MAGIC_LEN) != (ssize_t)FRAME_MAGIC_LEN ||
	    buf == NULL)
		return 1;
	(void)gethostname(hostname, sizeof(hostname) - 1);
	const kdeadline start_dl = kdeadline_in_ms(HELPER_START_MS);
	while (!hs.go) {
		char type;
		size_t n;

		if (!frame_read(&type, buf, &n, start_dl))
			goto out; /* khorrun went away (or fell silent) before "go": nothing started */
		if (helper_take(&hs, type, buf, n) < 0) {
			if (hs.why[0] != '\0') {
				say("%s", hs.why);
				frame_sendf('F', "1");
			}
			goto out;
		}
	}
	/* The job's variables, the secret among them: only this process and the ranks hold it
	 * (putenv keeps the strings, which now belong to the environment). */
	for (size_t i = 0; i < hs.nenv; i++)
		if (putenv(hs.env[i]) != 0)
			free(hs.env[i]);
	hs.nenv = 0;
	if (!hs.proto_ok || hs.argv == NULL || hs.cwd == NULL || hs.nranks == 0) {
		say("incomplete start-up from khorrun");
		frame_sendf('F', "1");
		goto out;
	}
	if (chdir(hs.cwd) != 0) {
		say("cannot cd to %s on %s: %s (the ranks run in khorrun's working directory)", hs.cwd,
		    hostname, kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		frame_sendf('F', "1");
		goto out;
	}
	j->o.prog_argv = hs.argv;
	j->o.grace_ms = hs.grace;
	j->o.np = hs.nranks;
	rc = spawn_resolve_program(hs.argv[0], &path);
	if (rc != 0) {
		frame_sendf('F', "%d", rc);
		rc = 1;
		goto out;
	}
	rc = 1;
	if (cpubind_load(&cpus) == 0 && cpus.n > 0 &&
	    asprintf(&fixed[0], "KHOR_LOCAL_CPUS=%d", cpus.n) >= 0)
		nfixed = 1;
	if (!spawn_ensure_fd_limit(hs.nranks) || !procs_setup_signals(j, &old_mask)) {
		frame_sendf('F', "1");
		goto out;
	}
	j->ranks = calloc((size_t)hs.nranks, sizeof(*j->ranks));
	if (j->ranks == NULL) {
		frame_sendf('F', "1");
		goto out_signals;
	}
	j->nstarted = hs.nranks;
	for (int i = 0; i < hs.nranks; i++)
		j->ranks[i].id = hs.ids[i];
	if (!output_init_ranks(j)) {
		frame_sendf('F', "1");
		goto out_ranks;
	}
	spawn_all(j, path, fixed, nfixed, &old_mask,
	          hs.bindm == 1 && cpus.n > 0 ? &cpus : NULL, 0, hs.nranks, hs.hslots);
	if (j->cause == CAUSE_SPAWN)
		frame_sendf('F', "%d", j->spawn_exit);
	else
		frame_send('Y', NULL, 0, NULL, 0);
	(void)fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
	j->stdin_open = true;
	loop_run(j);
	loop_sweep_leftovers(j);
	frame_send('D', NULL, 0, NULL, 0);
	rc = 0;
out_ranks:
	output_free_ranks(j);
out_signals:
	close(j->sfd);
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
out:
	if (nfixed > 0)
		free(fixed[0]);
	cpubind_free(&cpus);
	helper_start_free(&hs);
	free(path);
	free(buf);
	return rc;
}
