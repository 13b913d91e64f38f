/*
 * spawn.c -- starting the ranks of this host. The program is found before anything starts,
 * so a typo costs no store and no ranks; each rank gets its own process group, pipes for its
 * output, /dev/null for stdin and, with --bind cores, its own CPUs. In the helper a rank also
 * dies with the helper (PR_SET_PDEATHSIG), which posix_spawn cannot arrange.
 */
#include "spawn.h"

#include "base/err.h"
#include "base/log.h"
#include "frames.h"
#include "procs.h"
#include "say.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* 0 if path is a file we may execute; else an errno that says why not. */
static int check_exec(const char *path)
{
	struct stat st;

	if (stat(path, &st) != 0)
		return errno;
	if (S_ISDIR(st.st_mode))
		return EISDIR;
	if (access(path, X_OK) != 0)
		return errno;
	return 0;
}

/*
 * Finds prog the way a shell would, before anything is started, so a typo costs no store
 * and no ranks. Returns 0 with *path_out malloc'd, or a shell's exit status: 127 when not
 * found, 126 when found but not runnable. The reason is already on stderr.
 */
int spawn_resolve_program(const char *prog, char **path_out)
{
	char ebuf[128];
	const char *path_env;
	char *dirs, *save = NULL;
	int denied = 0;
	int rc;

	if (strchr(prog, '/') != NULL) {
		rc = check_exec(prog);
		if (rc == 0) {
			*path_out = strdup(prog);
			return *path_out != NULL ? 0 : 1;
		}
		say("cannot run '%s': %s%s", prog, kerr_errno_str(rc, ebuf, sizeof(ebuf)),
		    rc == EACCES ? " (is it executable? chmod +x it)" : "");
		return rc == ENOENT || rc == ENOTDIR ? 127 : 126;
	}
	if (prog[0] == '\0') {
		say("cannot run '': empty program name");
		return 127;
	}

	path_env = getenv("PATH");
	if (path_env == NULL)
		path_env = "/usr/local/bin:/usr/bin:/bin";
	dirs = strdup(path_env);
	if (dirs == NULL) {
		say("out of memory");
		return 1;
	}
	/*
	 * strtok_r skips empty PATH entries (which mean the current directory); that legacy
	 * meaning is a security trap, and "./prog" says it explicitly.
	 */
	for (char *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
		char *cand;

		if (asprintf(&cand, "%s/%s", d, prog) < 0) {
			free(dirs);
			say("out of memory");
			return 1;
		}
		rc = check_exec(cand);
		if (rc == 0) {
			free(dirs);
			*path_out = cand;
			return 0;
		}
		if (rc == EACCES || rc == EISDIR)
			denied = rc;
		free(cand);
	}
	free(dirs);
	if (denied != 0) {
		say("cannot run '%s': %s (found in PATH, but not as an executable file)", prog,
		    kerr_errno_str(denied, ebuf, sizeof(ebuf)));
		return 126;
	}
	say("cannot run '%s': command not found in PATH (%s)", prog, path_env);
	return 127;
}

/*
 * Each rank costs two pipe ends here and a store connection; raise the soft limit toward
 * the hard one when N is large rather than fail halfway through the start.
 */
bool spawn_ensure_fd_limit(int np)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)np * 3 + 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
		return true;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
		say("-np %d needs about %llu file descriptors, but the hard limit is %llu; "
		    "raise it (ulimit -Hn, /etc/security/limits.conf) or start fewer ranks",
		    np, (unsigned long long)need, (unsigned long long)rl.rlim_max);
		return false;
	}
	rl.rlim_cur = need;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
		say("cannot raise the open file limit to %llu for -np %d; raise it with ulimit -n",
		    (unsigned long long)need, np);
		return false;
	}
	return true;
}

static int spawn_exit_code(int err)
{
	if (err == ENOENT || err == ENOTDIR)
		return 127;
	if (err == EACCES || err == ENOEXEC || err == EISDIR || err == EPERM)
		return 126;
	return 1;
}

/*
 * The helper's way to start a rank (and an etcd agent's): as posix_spawn would (own
 * process group, khorrun's signal mask, SIGPIPE default), plus PR_SET_PDEATHSIG, which
 * posix_spawn cannot set: if the helper itself is killed (kill -9, the OOM killer), its
 * ranks die with it instead of running on unwatched. Both have one thread, so fork is safe. Returns 0 or exec's
 * errno, passed back on a CLOEXEC pipe.
 */
static int helper_fork_exec(struct job *j, pid_t *pid_out, const char *path, char **env,
                            int in, int out, int err_fd)
{
	int ep[2], e = 0;
	pid_t parent = getpid(), pid;
	ssize_t n;

	if (pipe2(ep, O_CLOEXEC) != 0)
		return errno;
	pid = fork();
	if (pid < 0) {
		e = errno;
		close(ep[0]);
		close(ep[1]);
		return e;
	}
	if (pid == 0) {
		(void)setpgid(0, 0);
		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127); /* the helper died before the line above */
		if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
		    dup2(err_fd, STDERR_FILENO) < 0)
			e = errno;
		if (e == 0) {
			signal(SIGPIPE, SIG_DFL);
			sigprocmask(SIG_SETMASK, &j->child_mask, NULL);
			execve(path, j->o.prog_argv, env);
			e = errno;
		}
		if (write(ep[1], &e, sizeof(e)) < 0) {
			/* nobody to tell */
		}
		_exit(127);
	}
	close(ep[1]);
	do
		n = read(ep[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(ep[0]);
	if (n == (ssize_t)sizeof(e)) {
		(void)waitpid(pid, NULL, 0);
		return e;
	}
	*pid_out = pid;
	return 0;
}

/* Starts rank r with its stdout and stderr on fresh pipes. Returns 0 or an errno. */
static int spawn_rank(struct job *j, int r, const char *path, char **env,
                      const posix_spawnattr_t *attr, int devnull)
{
	struct rank *rk = &j->ranks[r];
	posix_spawn_file_actions_t fa;
	int p[2][2] = { { -1, -1 }, { -1, -1 } };
	int err;

	for (int k = 0; k < 2; k++) {
		/* CLOEXEC: rank r+1 must not inherit rank r's pipes, or EOF would never come. */
		if (pipe2(p[k], O_CLOEXEC) != 0) {
			err = errno;
			goto fail_close_pipes;
		}
		(void)fcntl(p[k][0], F_SETFL, O_NONBLOCK);
	}
	err = posix_spawn_file_actions_init(&fa);
	if (err != 0)
		goto fail_close_pipes;
	if ((err = posix_spawn_file_actions_adddup2(&fa, devnull, STDIN_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, p[0][1], STDOUT_FILENO)) != 0 ||
	    (err = posix_spawn_file_actions_adddup2(&fa, p[1][1], STDERR_FILENO)) != 0)
		goto fail_destroy_actions;
	/* glibc's posix_spawn returns exec's own errno, so ENOENT etc. surface right here. */
	if (j->helper || j->die_with_khorrun)
		err = helper_fork_exec(j, &rk->pid, path, env, devnull, p[0][1], p[1][1]);
	else
		err = posix_spawn(&rk->pid, path, &fa, attr, j->o.prog_argv, env);
	if (err != 0)
		goto fail_destroy_actions;
	posix_spawn_file_actions_destroy(&fa);

	rk->running = true;
	for (int k = 0; k < 2; k++) {
		close(p[k][1]);
		rk->out[k].fd = p[k][0];
		rk->out[k].which = k;
		rk->out[k].len = 0;
	}
	j->nrunning++;
	j->nopen += 2;
	return 0;

fail_destroy_actions:
	posix_spawn_file_actions_destroy(&fa);
fail_close_pipes:
	for (int k = 0; k < 2; k++) {
		if (p[k][0] >= 0)
			close(p[k][0]);
		if (p[k][1] >= 0)
			close(p[k][1]);
	}
	return err;
}

/*
 * Puts khorrun's main thread on rank r's CPUs so the rank, spawned next, inherits them (the
 * store thread keeps its own). A rank that cannot be bound runs unbound, with a warning.
 */
static void bind_next(const cpubind_cpus *cpus, int np, int r)
{
	char list[256], ebuf[128];
	int first, count, err;

	cpubind_share(cpus->n, np, r, &first, &count);
	cpubind_format(cpus->cpu + first, count, list, sizeof(list));
	err = cpubind_apply(cpus, first, count);
	if (err != 0) {
		say("cannot bind rank %d to CPU %s (%s); it runs on khorrun's CPUs", r, list,
		    kerr_errno_str(err, ebuf, sizeof(ebuf)));
		(void)cpubind_apply(cpus, 0, 0);
		return;
	}
	KLOG_DEBUG("khorrun: rank %d runs on CPU %s", r, list);
}

static void unbind(const cpubind_cpus *cpus)
{
	char ebuf[128];
	int err;

	if (cpus == NULL)
		return;
	err = cpubind_apply(cpus, 0, 0);
	if (err != 0)
		say("cannot restore khorrun's own CPUs (%s)", kerr_errno_str(err, ebuf, sizeof(ebuf)));
}

/*
 * Starts the ranks of this host (in the helper: all of its ranks, whose identities khorrun
 * sent in hslots); on a failure stops those already running and records why.
 */
void spawn_all(struct job *j, const char *path, char **fixed, size_t nfixed,
               const sigset_t *child_mask, const cpubind_cpus *cpus, int first, int count,
               char (*hslots)[NSLOTS][SLOT_LEN])
{
	char slots[NSLOTS][SLOT_LEN];
	char **env = NULL;
	posix_spawnattr_t attr;
	sigset_t def;
	int devnull;
	int err;
	char ebuf[128];

	j->child_mask = *child_mask;
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (devnull < 0) {
		err = errno;
		say("cannot open /dev/null for the ranks' stdin: %s",
		    kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail;
	}
	/* The slots are rewritten per rank, but env_build reads their names (and which are
	 * empty) now. */
	if (hslots != NULL)
		memcpy(slots, hslots[0], sizeof(slots));
	else
		env_fill_slots(slots, &j->ranks[first]);
	env = env_build(&j->o, fixed, nfixed, slots);
	if (env == NULL) {
		err = ENOMEM;
		say("out of memory building the ranks' environment");
		goto fail_close_devnull;
	}
	err = posix_spawnattr_init(&attr);
	if (err != 0) {
		say("posix_spawnattr_init: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail_free_env;
	}
	/*
	 * Own process group per rank, so a stop reaches what the rank forked; the signal mask
	 * khorrun was started with (we block signals for the signalfd); SIGPIPE back to default
	 * (we ignore it, and an ignored disposition would survive exec).
	 */
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	if ((err = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
	                                                   POSIX_SPAWN_SETSIGDEF)) != 0 ||
	    (err = posix_spawnattr_setpgroup(&attr, 0)) != 0 ||
	    (err = posix_spawnattr_setsigmask(&attr, child_mask)) != 0 ||
	    (err = posix_spawnattr_setsigdefault(&attr, &def)) != 0) {
		say("posix_spawnattr: %s", kerr_errno_str(err, ebuf, sizeof(ebuf)));
		goto fail_destroy_attr;
	}

	for (int i = 0; i < count; i++) {
		int r = first + i;
		struct rank *rk = &j->ranks[r];

		if (hslots != NULL)
			memcpy(slots, hslots[i], sizeof(slots));
		else
			env_fill_slots(slots, rk);
		if (cpus != NULL)
			bind_next(cpus, count, i);
		err = spawn_rank(j, r, path, env, &attr, devnull);
		if (err != 0) {
			say("cannot start rank %d (%s): %s%s", rk->id, path,
			    kerr_errno_str(err, ebuf, sizeof(ebuf)),
			    err == EAGAIN || err == EMFILE || err == ENFILE
			            ? " (process or file limit reached; see ulimit -u / -n)"
			            : "");
			goto fail_destroy_attr;
		}
		if (j->helper)
			frame_sendf('P', "%d %d", rk->id, (int)rk->pid);
	}
	unbind(cpus);
	posix_spawnattr_destroy(&attr);
	free(env);
	close(devnull);
	return;

fail_destroy_attr:
	unbind(cpus);
	posix_spawnattr_destroy(&attr);
fail_free_env:
	free(env);
fail_close_devnull:
	close(devnull);
fail:
	j->cause = CAUSE_SPAWN;
	j->spawn_exit = spawn_exit_code(err);
	if (j->nrunning > 0 && !j->stopping)
		procs_begin_stop(j, SIGTERM);
}
