/*
 * gpu_check.h -- whether a GPU is usable here, and the skip that says why not, for every
 * test that runs on one (test_cuda_mem.c, test_cuda_reduce.c, test_nccl.c, test_device.c).
 *
 * GPU_NEED(probe, what) skips the Criterion test, saying what and the probe's reason, when
 * probe(why, len) is false. gpu_probe_in_child asks in a child process: CUDA does not
 * survive fork, so a test that forks ranks must not touch CUDA itself first.
 * gpu_cudart_usable is there for files that include cuda_runtime_api.h before this one
 * (test_nccl.c builds without CUDA and opens the driver itself).
 */
#ifndef KHOR_TESTS_GPU_CHECK_H
#define KHOR_TESTS_GPU_CHECK_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GPU_NEED(probe, what)                                                                      \
	do {                                                                                       \
		char why_[1024];                                                                   \
		if (!(probe)(why_, sizeof(why_)))                                                  \
			cr_skip_test("%s: %s", (what), why_);                                      \
	} while (0)

/* probe, run in a child of this process; its reason comes back in why. */
static inline bool gpu_probe_in_child(bool (*probe)(char *why, size_t len), char *why, size_t len)
{
	int fd[2];

	if (pipe(fd) != 0) {
		snprintf(why, len, "pipe failed");
		return false;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		char msg[1024] = "";
		bool ok = probe(msg, sizeof(msg));
		ssize_t w = write(fd[1], msg, strlen(msg));
		(void)w;
		_exit(ok ? 0 : 1);
	}
	close(fd[1]);
	ssize_t got = pid > 0 ? read(fd[0], why, len - 1) : -1;
	why[got > 0 ? got : 0] = '\0';
	close(fd[0]);
	int status = 1;
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		snprintf(why, len, "fork failed");
	return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#ifdef CUDART_VERSION
/*
 * Whether the CUDA runtime khor's kernels were built with accepts the driver and sees a
 * device: an older driver than the runtime's refuses it, though the driver API works.
 */
static inline bool gpu_cudart_usable(char *why, size_t len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		snprintf(why, len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
		         cudaGetErrorString(e));
		return false;
	}
	if (n == 0) {
		snprintf(why, len, "cudaGetDeviceCount found no CUDA device");
		return false;
	}
	return true;
}
#endif

#endif
