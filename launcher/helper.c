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
	char *buf = malloc(FRAME_MAX + 1), *path = NULL, *cwd = NULL, hostname[256] = "";
	char **argv = NULL, *fixed[1];
	char (*hslots)[NSLOTS][SLOT_LEN] = NULL;
	int *ids = NULL;
	size_t nfixed = 0, nargv = 0;
	int nranks = 0, rc = 1, bindm = 0;
	bool go = false, proto_ok = false;
	long long grace = DEFAULT_GRACE_MS;
	sigset_t old_mask;
	cpubind_cpus cpus = { 0 };
	char ebuf[128];

	memset(j, 0, sizeof(*j));
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
	while (!go) {
		char type;
		size_t n;

		if (!frame_read(&type, buf, &n, start_dl))
			goto out; /* khorrun went away (or fell silent) before "go": nothing started */
		switch (type) {
		case 'H': {
			char mine[128];

			snprintf(mine, sizeof(mine), "%s %d.%d.%d", HELPER_PROTO, KHOR_VERSION_MAJOR,
			         KHOR_VERSION_MINOR, KHOR_VERSION_PATCH);
			if (strcmp(buf, mine) != 0) {
				say("the khorrun here (%s) is not the one that started the job (%s); "
				    "install the same khor on every host", mine, buf);
				frame_sendf('F', "1");
				goto out;
			}
			proto_ok = true;
			break;
		}
		case 'C':
			free(cwd);
			cwd = strdup(buf);
			break;
		case 'A': {
			char **a = realloc(argv, (nargv + 2) * sizeof(*argv));

			if (a == NULL)
				goto out;
			argv = a;
			argv[nargv] = strdup(buf);
			if (argv[nargv] == NULL) {
				/* A short argument list would run another command line: stop instead. */
				say("out of memory for the program's arguments");
				frame_sendf('F', "1");
				goto out;
			}
			argv[++nargv] = NULL;
			break;
		}
		case 'V': {
			char *e = strdup(buf);

			/* The secret among them: only this process and the ranks hold it. */
			if (e == NULL) {
				/* A rank without one of the job's variables would fail later, and less
				 * clearly (the secret, the store's address): stop here instead. */
				say("out of memory for the job's environment");
				frame_sendf('F', "1");
				goto out;
			}
			if (strchr(e, '=') == NULL || putenv(e) != 0)
				free(e);
			break;
		}
		case 'R': {
			void *p = realloc(hslots, (size_t)(nranks + 1) * sizeof(*hslots));
			int *pi = realloc(ids, (size_t)(nranks + 1) * sizeof(*ids));
			const char *q = buf + strlen(buf) + 1;

			if (p != NULL)
				hslots = p;
			if (pi != NULL)
				ids = pi;
			if (p == NULL || pi == NULL || nranks >= MAX_RANKS)
				goto out;
			/* The frame's first word is the rank's id in khorrun's frames. */
			ids[nranks] = atoi(buf);
			memset(hslots[nranks], 0, sizeof(hslots[nranks]));
			for (size_t k = 0; k < NSLOTS && q < buf + n; k++) {
				kstrlcpy(hslots[nranks][k], q, SLOT_LEN);
				q += strlen(q) + 1;
			}
			nranks++;
			break;
		}
		case 'G':
			if (sscanf(buf, "%lld %d", &grace, &bindm) < 1)
				grace = DEFAULT_GRACE_MS;
			go = true;
			break;
		default:
			break;
		}
	}
	if (!proto_ok || argv == NULL || cwd == NULL || nranks == 0) {
		say("incomplete start-up from khorrun");
		frame_sendf('F', "1");
		goto out;
	}
	if (chdir(cwd) != 0) {
		say("cannot cd to %s on %s: %s (the ranks run in khorrun's working directory)", cwd,
		    hostname, kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		frame_sendf('F', "1");
		goto out;
	}
	j->o.prog_argv = argv;
	j->o.grace_ms = grace;
	j->o.np = nranks;
	rc = spawn_resolve_program(argv[0], &path);
	if (rc != 0) {
		frame_sendf('F', "%d", rc);
		rc = 1;
		goto out;
	}
	rc = 1;
	if (cpubind_load(&cpus) == 0 && cpus.n > 0 &&
	    asprintf(&fixed[0], "KHOR_LOCAL_CPUS=%d", cpus.n) >= 0)
		nfixed = 1;
	if (!spawn_ensure_fd_limit(nranks) || !procs_setup_signals(j, &old_mask)) {
		frame_sendf('F', "1");
		goto out;
	}
	j->ranks = calloc((size_t)nranks, sizeof(*j->ranks));
	if (j->ranks == NULL) {
		frame_sendf('F', "1");
		goto out_signals;
	}
	j->nstarted = nranks;
	for (int i = 0; i < nranks; i++)
		j->ranks[i].id = ids[i];
	if (!output_init_ranks(j)) {
		frame_sendf('F', "1");
		goto out_ranks;
	}
	spawn_all(j, path, fixed, nfixed, &old_mask,
	          bindm == 1 && cpus.n > 0 ? &cpus : NULL, 0, nranks, hslots);
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
	for (size_t i = 0; i < nargv; i++)
		free(argv[i]);
	free(argv);
	free(hslots);
	free(ids);
	free(cwd);
	free(path);
	free(buf);
	return rc;
}
