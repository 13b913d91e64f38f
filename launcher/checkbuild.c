/*
 * checkbuild.c -- `khorrun --check-build`, horovodrun's report of what was built in, from
 * build_info_string() (runtime/build_info.c, the string of khor_build_info()), so that it says what libkhor says. khor's
 * frameworks are pure Python over libkhor (khor.torch), so "PyTorch" means whether the
 * python3 on PATH can import torch; that is asked, under a deadline, not assumed.
 */
#include "checkbuild.h"

#include "khor.h"
#include "runtime/build_info.h"

#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* How long `python3 -c "import torch"` may take: a cold import of torch takes seconds. */
#define TORCH_PROBE_MS 30000

/* 1 when python3 imports torch, 0 when it does not, -1 when there is no python3 to ask. */
static int python_imports_torch(void)
{
	char *argv[] = { "python3", "-c", "import torch", NULL };
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int st = 0, rc;

	if (posix_spawn_file_actions_init(&fa) != 0)
		return -1;
	(void)posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", 0, 0);
	(void)posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", 1, 0);
	(void)posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", 1, 0);
	rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0)
		return -1;
	for (int waited = 0;; waited += 20) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			break;
		if (w < 0)
			return -1;
		if (waited >= TORCH_PROBE_MS) {
			(void)kill(pid, SIGKILL);
			(void)waitpid(pid, &st, 0);
			return 0;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* "1" or "0" of key in khor_build_info()'s words. */
static bool built(const char *info, const char *key)
{
	char want[32];
	const char *p;

	snprintf(want, sizeof(want), "%s=1", key);
	for (p = strstr(info, want); p != NULL; p = strstr(p + 1, want)) {
		if ((p == info || p[-1] == ' ') && (p[strlen(want)] == ' ' || p[strlen(want)] == '\0'))
			return true;
	}
	return false;
}

static const char *mark(bool on)
{
	return on ? "X" : " ";
}

int checkbuild_print(bool verbose)
{
	const char *info = build_info_string();
	int torch = python_imports_torch();

	printf("%skhor v%d.%d.%d:\n"
	       "\n"
	       "Available Frameworks:\n"
	       "    [%s] PyTorch (khor.torch, pure Python over libkhor; %s)\n"
	       "    [ ] TensorFlow\n"
	       "    [ ] MXNet\n"
	       "\n"
	       "Available Controllers:\n"
	       "    [X] khorrun (its own store; horovodrun's Gloo role)\n"
	       "    [ ] MPI\n"
	       "\n"
	       "Available Transports:\n"
	       "    [%s] tcp\n"
	       "    [%s] shm\n"
	       "    [%s] ib (verbs; libibverbs is loaded at run time)\n"
	       "\n"
	       "Available Tensor Operations:\n"
	       "    [%s] CUDA (device buffers)\n"
	       "    [%s] NCCL (inside a node; libnccl.so.2 is loaded at run time)\n"
	       "    [%s] GPUDirect RDMA (ib with CUDA)\n"
	       "\n"
	       "%s\n",
	       verbose ? "\n" : "", KHOR_VERSION_MAJOR, KHOR_VERSION_MINOR, KHOR_VERSION_PATCH,
	       mark(torch == 1),
	       torch == 1   ? "the python3 on PATH imports torch"
	       : torch == 0 ? "the python3 on PATH cannot import torch"
	                    : "no python3 on PATH",
	       mark(built(info, "tcp")), mark(built(info, "shm")), mark(built(info, "ib")),
	       mark(built(info, "cuda")), mark(built(info, "nccl")), mark(built(info, "gdr")), info);
	return 0;
}
