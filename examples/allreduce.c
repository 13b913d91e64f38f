/*
 * allreduce.c -- the smallest complete khor program: join the job, sum a vector over all
 * ranks, check the result, leave. Run it with `khorrun -np 4 ./example-allreduce`.
 */
#include <khor.h>

#include <stdio.h>

int main(void)
{
	char err[1024];
	khor_comm *comm;
	float grad[1000];

	if (khor_init(NULL, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "khor_init failed: %s\n", err);
		return 1;
	}
	for (int i = 0; i < 1000; i++)
		grad[i] = (float)(khor_rank(comm) + i);
	if (khor_allreduce(comm, grad, grad, 1000, KHOR_FLOAT32, KHOR_AVG) != KHOR_SUCCESS) {
		fprintf(stderr, "allreduce failed: %s\n", khor_comm_error(comm));
		khor_finalize(comm);
		return 1;
	}
	/* avg over ranks of (rank + i) = (size - 1) / 2 + i */
	float want = (float)(khor_size(comm) - 1) / 2.0f + 999.0f;
	printf("rank %d of %d: grad[999] = %g (expected %g)\n", khor_rank(comm), khor_size(comm),
	       grad[999], want);
	khor_finalize(comm);
	return grad[999] == want ? 0 : 1;
}
