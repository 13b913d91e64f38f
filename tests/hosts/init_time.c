/*
 * init_time.c -- prints the wall-clock time (CLOCK_REALTIME) at which this rank's khor_init
 * returned, for bench_startup.sh: the start-up of a job is the latest of these less the
 * time the launcher was started.
 */
#include <khor.h>

#include <stdio.h>
#include <time.h>

int main(void)
{
	char err[1024];
	khor_comm *comm;
	struct timespec ts;

	if (khor_init(NULL, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "khor_init failed: %s\n", err);
		return 1;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	printf("init_done %lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
	fflush(stdout);
	khor_finalize(comm);
	return 0;
}
