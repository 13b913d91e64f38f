/* test_config.c -- KHOR_* parsing: sources in order, strict values, clear refusals. */
#include "runtime/config.h"
#include "khor.h"
#include "tests/harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void clean_env(void)
{
	const char *vars[] = { "KHOR_RANK", "KHOR_SIZE", "KHOR_STORE_ADDR", "RANK", "WORLD_SIZE",
	                       "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
	                       "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
	                       "KHOR_TIMEOUT", "KHOR_LOCAL_RANK", "LOCAL_RANK", "KHOR_ALGO",
	                       "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST",
	                       "SLURM_NODELIST", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES",
	                       "JOB_COMPLETION_INDEX", "KHOR_K8S_SIZE", "KHOR_K8S_SERVICE",
	                       "KHOR_K8S_STORE_HOST", "KHOR_K8S_STORE_PORT", "KHOR_HOSTNAME",
	                       "KHOR_JOB_ID", "KHOR_LOG", "KHOR_SECRET", "LOCAL_WORLD_SIZE",
	                       "GROUP_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
	                       "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
	                       "PMIX_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	                       "KHOR_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME",
	                       "KHOR_INIT_TIMEOUT", "HOROVOD_GLOO_TIMEOUT_SECONDS", "KHOR_HIER",
	                       "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER" };
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

TestSuite(config, .init = clean_env);

Test(config, defaults_to_a_one_rank_job)
{
	settings s;
	kerr e;
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.rank, 0);
	cr_assert_eq(s.size, 1);
	cr_assert_eq(s.timeout_ms, 300000);
	cr_assert_eq(s.init_timeout_ms, 300000);
}

Test(config, khor_vars_then_torchrun_then_slurm)
{
	settings s;
	kerr e;
	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_JOB_NODELIST", "gpu[07-09],cpu1", 1);
	setenv("SLURM_JOB_ID", "1234", 1);
	setenv("SLURM_STEP_ID", "0", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.rank, 5);
	cr_assert_str_eq(s.source, "slurm");
	cr_assert_str_eq(s.store_host, "gpu07");
	cr_assert(!s.serve_store, "only rank 0 serves");
	setenv("RANK", "2", 1);
	setenv("WORLD_SIZE", "4", 1);
	setenv("MASTER_ADDR", "10.1.2.3", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("TORCHELASTIC_RUN_ID", "r1", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "torchrun");
	cr_assert_eq(s.rank, 2);
	cr_assert_eq(s.store_port, 29501, "torchrun's own store holds MASTER_PORT");
	setenv("KHOR_RANK", "1", 1);
	setenv("KHOR_SIZE", "3", 1);
	setenv("KHOR_STORE_ADDR", "127.0.0.1:4000", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.rank, 1);
	cr_assert_eq(s.size, 3);
	cr_assert_eq(s.store_port, 4000);
	cr_assert(!s.serve_store);
}

/* OpenMPI's mpirun and MPICH's Hydra: one job of their ranks, with MASTER_ADDR's store. */
Test(config, mpi_launchers_give_rank_size_and_local_rank)
{
	settings s;
	kerr e;
	/* OpenMPI 4 also sets PMIX_RANK; its own names come first (they carry the local rank). */
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	setenv("PMIX_RANK", "3", 1);
	setenv("MASTER_ADDR", "10.1.2.3", 1);
	setenv("MASTER_PORT", "29500", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "openmpi");
	cr_assert_eq(s.rank, 3);
	cr_assert_eq(s.size, 4);
	cr_assert_eq(s.local_rank, 1);
	cr_assert_eq(s.local_size, 2);
	cr_assert_str_eq(s.store_host, "10.1.2.3");
	cr_assert_eq(s.store_port, 29500, "no torchrun store on MASTER_PORT here");
	cr_assert(!s.serve_store, "rank 3 does not serve");
	setenv("OMPI_COMM_WORLD_RANK", "0", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(s.serve_store, "rank 0 serves the store at MASTER_ADDR:MASTER_PORT");
	/* khorrun's (and torchrun's) variables keep priority over the MPI launcher's. */
	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "torchrun");
	cr_assert_eq(s.size, 2);
	cr_assert_eq(s.local_rank, -1, "OpenMPI's local rank is not torchrun's");
	setenv("KHOR_RANK", "2", 1);
	setenv("KHOR_SIZE", "5", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "khor");
	cr_assert_eq(s.rank, 2);
	cr_assert_eq(s.size, 5);
	clean_env();
	/* Hydra (MPICH's mpiexec) as it sets them: PMI-1 and its local numbers. */
	setenv("PMI_RANK", "1", 1);
	setenv("PMI_SIZE", "2", 1);
	setenv("MPI_LOCALRANKID", "1", 1);
	setenv("MPI_LOCALNRANKS", "2", 1);
	setenv("KHOR_STORE_ADDR", "127.0.0.1:4000", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "pmi");
	cr_assert_eq(s.rank, 1);
	cr_assert_eq(s.size, 2);
	cr_assert_eq(s.local_rank, 1);
	cr_assert_eq(s.local_size, 2);
	cr_assert_eq(s.store_port, 4000);
	/* mpirun -np 1 needs no store. */
	clean_env();
	setenv("OMPI_COMM_WORLD_RANK", "0", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.size, 1);
}

/* Under an MPI launcher with no rendezvous address: a refusal naming it and what to set. */
Test(config, mpi_launcher_without_a_store_is_refused_saying_what_to_set)
{
	settings s;
	kerr e;
	setenv("OMPI_COMM_WORLD_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "rank 1 of 4: started by OpenMPI's mpirun "
	                         "(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=4)"), "%s", e.text);
	cr_assert(strstr(e.text, "set MASTER_ADDR and MASTER_PORT"), "%s", e.text);
	cr_assert(strstr(e.text, "KHOR_STORE_ADDR"), "%s", e.text);
	setenv("MASTER_ADDR", "10.1.2.3", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "(MASTER_ADDR is set, MASTER_PORT is not)"), "%s", e.text);
	clean_env();
	setenv("PMI_RANK", "0", 1);
	setenv("PMI_SIZE", "2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "MPICH's Hydra mpiexec"), "%s", e.text);
	cr_assert(strstr(e.text, "PMI_RANK=0, PMI_SIZE=2"), "%s", e.text);
	/* PMIx alone exports no size: refused, not a one-rank job. */
	clean_env();
	setenv("PMIX_RANK", "2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "PMIx launcher (prterun, srun --mpi=pmix) (PMIX_RANK=2), which "
	                         "does not export the number of ranks"), "%s", e.text);
}

/*
 * srun --mpi=pmi2 sets PMI's numbers equal to Slurm's: the srun step (its store from the
 * step's nodes). mpirun in an allocation runs its daemons with srun, and its ranks inherit a
 * daemon's SLURM_PROCID and SLURM_NTASKS: there the MPI launcher's numbers count.
 */
Test(config, srun_mpi_is_the_step_and_mpirun_in_an_allocation_is_mpi)
{
	settings s;
	kerr e;
	setenv("SLURM_PROCID", "1", 1);
	setenv("SLURM_NTASKS", "2", 1);
	setenv("SLURM_STEP_ID", "0", 1);
	setenv("SLURM_JOB_ID", "77", 1);
	setenv("SLURM_STEP_NODELIST", "n[1-2]", 1);
	setenv("PMI_RANK", "1", 1);
	setenv("PMI_SIZE", "2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "slurm");
	cr_assert_str_eq(s.store_host, "n1");
	unsetenv("PMI_RANK");
	unsetenv("PMI_SIZE");
	setenv("OMPI_COMM_WORLD_RANK", "5", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	setenv("MASTER_ADDR", "n1", 1);
	setenv("MASTER_PORT", "29400", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "openmpi");
	cr_assert_eq(s.rank, 5);
	cr_assert_eq(s.size, 8);
	cr_assert_eq(s.local_rank, -1, "SLURM_LOCALID is the daemon's, not the rank's");
}

/* The interface: KHOR_SOCKET_IFNAME, then HOROVOD_GLOO_IFACE (exact), then NCCL's. */
Test(config, interface_aliases_in_order)
{
	settings s;
	kerr e;
	setenv("NCCL_SOCKET_IFNAME", "^docker,lo", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.ifname, "^docker,lo");
	setenv("HOROVOD_GLOO_IFACE", "eth0", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.ifname, "=eth0", "gloo's names are exact: not eth01");
	setenv("HOROVOD_GLOO_IFACE", "=eth1,eth2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.ifname, "=eth1,eth2");
	setenv("KHOR_SOCKET_IFNAME", "ib", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.ifname, "ib");
}

/* HOROVOD_GLOO_TIMEOUT_SECONDS bounds the rendezvous (init) only; KHOR_INIT_TIMEOUT wins. */
Test(config, gloo_timeout_is_the_init_timeout)
{
	settings s;
	kerr e;
	setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "7", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.init_timeout_ms, 7000);
	cr_assert_eq(s.timeout_ms, 300000, "collectives keep KHOR_TIMEOUT");
	setenv("KHOR_INIT_TIMEOUT", "2s", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.init_timeout_ms, 2000);
	unsetenv("KHOR_INIT_TIMEOUT");
	setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "soon", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "HOROVOD_GLOO_TIMEOUT_SECONDS='soon'"), "%s", e.text);
}

/* Horovod's hierarchical switches set their own collective; a given KHOR_HIER wins. */
Test(config, hierarchical_aliases_per_collective)
{
	settings s;
	kerr e;
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.hier_allreduce, -1);
	cr_assert_eq(s.hier_allgather, -1);
	setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1", 1);
	setenv("HOROVOD_HIERARCHICAL_ALLGATHER", "0", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.hier, 2, "KHOR_HIER's auto for the others");
	cr_assert_eq(s.hier_allreduce, 1);
	cr_assert_eq(s.hier_allgather, 0);
	setenv("KHOR_HIER", "off", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.hier, 0);
	cr_assert_eq(s.hier_allreduce, -1);
	cr_assert_eq(s.hier_allgather, -1);
	unsetenv("KHOR_HIER");
	setenv("HOROVOD_HIERARCHICAL_ALLGATHER", "sometimes", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "HOROVOD_HIERARCHICAL_ALLGATHER='sometimes'"), "%s", e.text);
}

/* What a rank writes on fd 2 during f(), read back from a temp file. */
static void capture_stderr(void (*f)(void *), void *arg, char *out, size_t len)
{
	char path[] = "/tmp/khor-test-stderr-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	cr_assert(fd >= 0 && saved >= 0);
	unlink(path);
	dup2(fd, 2);
	f(arg);
	dup2(saved, 2);
	close(saved);
	ssize_t n = pread(fd, out, len - 1, 0);
	close(fd);
	out[n > 0 ? n : 0] = '\0';
}

static void init_twice(void *arg)
{
	khor_comm *comm;
	char err[512];
	(void)arg;
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(khor_init(NULL, err, sizeof(err), &comm), KHOR_SUCCESS, "%s", err);
		khor_finalize(comm);
	}
}

static int count_of(const char *text, const char *what)
{
	int n = 0;
	for (const char *p = strstr(text, what); p != NULL; p = strstr(p + 1, what))
		n++;
	return n;
}

/* A HOROVOD_* variable khor does not read is named once at init; the ones it reads are not. */
Test(config, unread_horovod_variables_are_named_once)
{
	char out[8192];
	/* Only this test's: none the environment that runs the tests carries. */
	for (char **e = environ; *e != NULL;) {
		char name[128];
		const char *eq = strchr(*e, '=');
		if (strncmp(*e, "HOROVOD_", 8) != 0 || eq == NULL || eq - *e >= (long)sizeof(name)) {
			e++;
			continue;
		}
		snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
		unsetenv(name); /* environ shifts down: look at *e again */
	}
	setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1", 1);
	setenv("HOROVOD_NO_SUCH_SETTING", "1", 1);
	setenv("HOROVOD_FUSION_THRESHOLD", "1048576", 1);
	setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
	setenv("HOROVOD_RANK", "0", 1);
	setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1", 1);
	setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "30", 1);
	capture_stderr(init_twice, NULL, out, sizeof(out));
	cr_assert_eq(count_of(out, "HOROVOD_NO_SUCH_SETTING is set but khor does not read it"), 1,
	             "%s", out);
	cr_assert_eq(count_of(out, "HOROVOD_GLOO_RENDEZVOUS_ADDR is set but khor does not read "
	                           "it"), 1, "%s", out);
	cr_assert_eq(count_of(out, " is set but khor does not read it"), 2, "%s", out);
	cr_assert(config_horovod_read("HOROVOD_CACHE_CAPACITY"));
	cr_assert(config_horovod_read("HOROVOD_LOCAL_SIZE"));
	cr_assert(!config_horovod_read("HOROVOD_GPU_OPERATIONS"));
}

/* Rank 0 warns, the others do not: one line per job, not one per rank. */
static int warn_body(int rank, int n, khor_config *cfg, void *arg)
{
	char path[64], err[512];
	khor_comm *comm;
	(void)n;
	snprintf(path, sizeof(path), "%s.%d", (const char *)arg, rank);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return 20;
	dup2(fd, 2);
	close(fd);
	setenv("HOROVOD_NO_SUCH_SETTING", "1", 1);
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 21;
	khor_finalize(comm);
	return 0;
}

Test(config, only_rank_0_names_unread_horovod_variables, .timeout = 60)
{
	char base[] = "/tmp/khor-test-warn-XXXXXX", out[8192], path[64];
	int fd = mkstemp(base);
	cr_assert(fd >= 0);
	close(fd);
	harness_opts o = { .n = 2, .timeout = "20s", .deadline_s = 40 };
	harness_result res;
	cr_assert(harness_run(&o, warn_body, base, &res), "ranks exited %d %d", res.status[0],
	          res.status[1]);
	for (int r = 0; r < 2; r++) {
		snprintf(path, sizeof(path), "%s.%d", base, r);
		FILE *f = fopen(path, "r");
		cr_assert_not_null(f);
		size_t len = fread(out, 1, sizeof(out) - 1, f);
		out[len] = '\0';
		fclose(f);
		unlink(path);
		cr_assert_eq(count_of(out, "HOROVOD_NO_SUCH_SETTING is set but khor does not read it"),
		             r == 0 ? 1 : 0, "rank %d: %s", r, out);
	}
	unlink(base);
}

/* An etcd store: its address parsed, and no rank serves it, whatever else is set. */
Test(config, an_etcd_store_is_never_served_by_a_rank)
{
	settings s;
	kerr e;
	setenv("KHOR_RANK", "0", 1);
	setenv("KHOR_SIZE", "2", 1);
	setenv("MASTER_ADDR", "10.1.2.3", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("KHOR_STORE_ADDR", "etcd://etcd.example:2379", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(s.store_etcd);
	cr_assert_str_eq(s.store_host, "etcd.example");
	cr_assert_eq(s.store_port, 2379);
	cr_assert(!s.serve_store);
	setenv("KHOR_STORE_ADDR", "[fd00::5]:2379", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert(!s.store_etcd);
	cr_assert_str_eq(s.store_host, "fd00::5");
	setenv("KHOR_STORE_ADDR", "etcd://etcd.example", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "etcd://host:port"), "%s", e.text);
}

Test(config, caller_config_wins_and_bad_values_are_refused)
{
	settings s;
	kerr e;
	khor_config *c;
	setenv("KHOR_TIMEOUT", "10s", 1);
	khor_config_create(&c);
	cr_assert_eq(khor_config_set(c, "KHOR_TIMEOUT", "250ms"), KHOR_SUCCESS);
	cr_assert_eq(khor_config_set(c, "KHOR_NO_SUCH_THING", "1"), KHOR_ERR_INVALID_ARG);
	cr_assert_eq(config_parse(c, &s, &e), KHOR_SUCCESS);
	cr_assert_eq(s.timeout_ms, 250);
	khor_config_set(c, "KHOR_TIMEOUT", "soon");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "KHOR_TIMEOUT='soon'"), "%s", e.text);
	khor_config_set(c, "KHOR_TIMEOUT", "1s");
	khor_config_set(c, "KHOR_RANK", "4");
	khor_config_set(c, "KHOR_SIZE", "4");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG, "rank must be below size");
	khor_config_set(c, "KHOR_RANK", "0");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG, "4 ranks need a store");
	cr_assert(strstr(e.text, "khorrun"), "%s", e.text);
	khor_config_set(c, "KHOR_STORE_ADDR", "no-port");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG);
	khor_config_set(c, "KHOR_STORE_ADDR", "h:1");
	khor_config_set(c, "KHOR_ALGO", "bogus");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG);
	khor_config_set(c, "KHOR_ALGO", "ring");
	khor_config_set(c, "KHOR_SOCKET_NSOCKS", "17");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG);
	khor_config_destroy(c);
}

/*
 * An elastic worker's id names it in the driver's plans and the store's keys: one made of
 * a KHOR_HOSTNAME with a space or a '/' is refused as a given KHOR_WORKER_ID is, naming
 * the fix; a job that is not elastic does not use it and runs. Found by
 * tests/runtime/fuzz_settings.c (its input is in tests/runtime/fuzz_corpus/settings).
 */
Test(config, an_elastic_id_made_of_a_bad_host_name_is_refused)
{
	settings s;
	kerr e;
	khor_config *c;
	khor_config_create(&c);
	khor_config_set(c, "KHOR_HOSTNAME", "rack 1/node-3");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_SUCCESS, "%s", e.text);
	khor_config_set(c, "KHOR_ELASTIC", "1");
	khor_config_set(c, "KHOR_STORE_ADDR", "h:1");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "'rack 1/node-3:0'") && strstr(e.text, "KHOR_WORKER_ID"), "%s",
	          e.text);
	khor_config_set(c, "KHOR_WORKER_ID", "node-3:0");
	cr_assert_eq(config_parse(c, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.worker_id, "node-3:0");
	khor_config_destroy(c);
}

Test(config, public_api_rejects_bad_arguments_without_poisoning)
{
	khor_comm *comm;
	char err[256];
	float x[4] = { 1, 2, 3, 4 };
	cr_assert_eq(khor_init(NULL, err, sizeof(err), &comm), KHOR_SUCCESS, "%s", err);
	cr_assert_eq(khor_allreduce(comm, x, x, 4, (khor_dtype)99, KHOR_SUM), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(khor_comm_error(comm), "dtype"), "%s", khor_comm_error(comm));
	cr_assert_eq(khor_allreduce(comm, x, x + 1, 3, KHOR_FLOAT32, KHOR_SUM), KHOR_ERR_INVALID_ARG);
	cr_assert_eq(khor_broadcast(comm, x, 4, KHOR_FLOAT32, 1), KHOR_ERR_INVALID_ARG);
	cr_assert_eq(khor_allreduce(comm, NULL, x, 4, KHOR_FLOAT32, KHOR_SUM), KHOR_ERR_INVALID_ARG);
	/* Still usable: bad arguments are not sticky. */
	cr_assert_eq(khor_allreduce(comm, x, x, 4, KHOR_FLOAT32, KHOR_SUM), KHOR_SUCCESS);
	cr_assert_eq(x[3], 4);
	cr_assert_str_eq(khor_strerror(KHOR_ERR_TIMEOUT), "timed out");
	cr_assert_str_eq(khor_version(), "0.1.0");
	khor_finalize(comm);
}

/* What srun gives each task: the step's first node serves, each step on a port of its own. */
Test(config, srun_step_store_on_the_steps_first_node)
{
	settings s;
	kerr e;
	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_JOB_ID", "81234", 1);
	setenv("SLURM_STEP_ID", "3", 1);
	setenv("SLURM_JOB_NODELIST", "gpu[07-09],cpu1", 1);
	setenv("SLURM_STEP_NODELIST", "gpu[08-09]", 1);
	setenv("SLURM_LOCALID", "1", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "slurm");
	cr_assert_eq(s.rank, 5);
	cr_assert_eq(s.size, 8);
	cr_assert_eq(s.local_rank, 1);
	cr_assert_str_eq(s.store_host, "gpu08", "the step's nodes, not the job's");
	cr_assert_eq(s.store_port, 20000 + 10 * 234 + 3);
	cr_assert_str_eq(s.job_id, "81234.3");
	cr_assert(!s.serve_store);
	setenv("SLURM_STEP_ID", "4", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.store_port, 20000 + 10 * 234 + 4, "the next step, the next port");
	setenv("SLURM_PROCID", "0", 1);
	setenv("SLURM_STEP_NODELIST", "rack[1-2]-n[08-09,11]-ib,login1", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.store_host, "rack1-n08-ib");
	cr_assert(s.serve_store, "SLURM_PROCID 0 serves the store");
	setenv("SLURM_STEP_NODELIST", "n[x1]", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "SLURM_STEP_NODELIST='n[x1]'"), "%s", e.text);
	cr_assert(strstr(e.text, "MASTER_ADDR"), "%s", e.text);
	/* MASTER_ADDR/MASTER_PORT overrides where the store is, rank 0 still serving it. */
	setenv("MASTER_ADDR", "10.0.0.9", 1);
	setenv("MASTER_PORT", "4100", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "slurm");
	cr_assert_str_eq(s.store_host, "10.0.0.9");
	cr_assert_eq(s.store_port, 4100);
	cr_assert(s.serve_store);
}

/* The batch script has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but is no step. */
Test(config, sbatch_script_itself_is_a_one_rank_job)
{
	settings s;
	kerr e;
	setenv("SLURM_PROCID", "0", 1);
	setenv("SLURM_NTASKS", "4", 1);
	setenv("SLURM_JOB_ID", "77", 1);
	setenv("SLURM_JOB_NODELIST", "localhost", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "khor");
	cr_assert_eq(s.size, 1);
	cr_assert(!s.serve_store);
	cr_assert_str_eq(s.job_id, "77");
	setenv("SLURM_STEPID", "0", 1); /* the older name */
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "slurm");
	cr_assert_eq(s.size, 4);
	cr_assert_str_eq(s.store_host, "localhost");
}

Test(config, kubernetes_indexed_job)
{
	settings s;
	kerr e;
	setenv("JOB_COMPLETION_INDEX", "2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_eq(s.size, 1, "an indexed Job without KHOR_K8S_SIZE: independent pods");
	cr_assert_str_eq(s.source, "khor");

	setenv("KHOR_K8S_SIZE", "4", 1);
	setenv("KHOR_HOSTNAME", "train-2", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG, "no store host");
	cr_assert(strstr(e.text, "KHOR_K8S_SERVICE"), "%s", e.text);
	setenv("KHOR_K8S_SERVICE", "train-svc", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "k8s");
	cr_assert_eq(s.rank, 2);
	cr_assert_eq(s.size, 4);
	cr_assert_str_eq(s.store_host, "train-0.train-svc");
	cr_assert_eq(s.store_port, 29500);
	cr_assert_str_eq(s.job_id, "train");
	cr_assert(!s.serve_store);

	setenv("KHOR_HOSTNAME", "my-job-12-0", 1);
	setenv("JOB_COMPLETION_INDEX", "0", 1);
	setenv("KHOR_K8S_STORE_PORT", "4000", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.store_host, "my-job-12-0.train-svc");
	cr_assert_eq(s.store_port, 4000);
	cr_assert(s.serve_store, "index 0 serves the store");

	setenv("KHOR_HOSTNAME", "worker", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "does not end in -<index>"), "%s", e.text);
	setenv("KHOR_K8S_STORE_HOST", "10.1.0.5", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.store_host, "10.1.0.5");
	cr_assert_str_eq(s.job_id, "default");

	setenv("JOB_COMPLETION_INDEX", "4", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG, "index 4 of 4");
	setenv("KHOR_K8S_STORE_PORT", "0", 1);
	setenv("JOB_COMPLETION_INDEX", "1", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "KHOR_K8S_STORE_PORT"), "%s", e.text);
	unsetenv("KHOR_K8S_STORE_PORT");

	/* torchrun inside the pod wins; KHOR_K8S_SIZE with no index is refused. */
	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "29600", 1);
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_SUCCESS, "%s", e.text);
	cr_assert_str_eq(s.source, "torchrun");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("JOB_COMPLETION_INDEX");
	cr_assert_eq(config_parse(NULL, &s, &e), KHOR_ERR_INVALID_ARG);
	cr_assert(strstr(e.text, "JOB_COMPLETION_INDEX"), "%s", e.text);
}

static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* One pod of the job below: env alone, as Kubernetes and the Job's YAML would set it. */
static int k8s_pod(int index, const char *log)
{
	char idx[16], host[32], err[1024];
	khor_comm *comm;
	double x[1000], b[16];

	if (freopen(log, "w", stderr) == NULL)
		return 10;
	snprintf(idx, sizeof(idx), "%d", index);
	snprintf(host, sizeof(host), "train-%d", index);
	setenv("JOB_COMPLETION_INDEX", idx, 1);
	setenv("KHOR_HOSTNAME", host, 1); /* a pod's name: its own host, the Job's name in it */
	if (khor_init(NULL, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "khor_init: %s\n", err);
		return 11;
	}
	int n = khor_size(comm), r = khor_rank(comm);
	for (int i = 0; i < 1000; i++)
		x[i] = r + i;
	for (int i = 0; i < 16; i++)
		b[i] = r == 2 ? 7 * i : -1;
	if (khor_allreduce(comm, x, x, 1000, KHOR_FLOAT64, KHOR_SUM) != KHOR_SUCCESS ||
	    khor_broadcast(comm, b, 16, KHOR_FLOAT64, 2) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: %s\n", r, khor_comm_error(comm));
		return 12;
	}
	int bad = r != index || n != 4;
	for (int i = 0; i < 1000; i++)
		bad += x[i] != n * (n - 1) / 2.0 + (double)n * i;
	for (int i = 0; i < 16; i++)
		bad += b[i] != 7 * i;
	khor_finalize(comm);
	return bad ? 13 : 0;
}

/*
 * Four processes as the four pods of an indexed Job (train-0 to train-3, four hosts to
 * khor), their store on 127.0.0.1 through KHOR_K8S_STORE_HOST: an allreduce and a broadcast
 * right on every rank, each logging that it joined job 'train' via k8s.
 */
Test(config, kubernetes_indexed_job_runs_with_env_alone, .timeout = 60)
{
	char port[16], dir[] = "/tmp/khor-k8s.XXXXXX", log[4][64];
	pid_t pid[4];

	cr_assert_not_null(mkdtemp(dir));
	snprintf(port, sizeof(port), "%u", free_port());
	setenv("KHOR_K8S_SIZE", "4", 1);
	setenv("KHOR_K8S_STORE_HOST", "127.0.0.1", 1);
	setenv("KHOR_K8S_STORE_PORT", port, 1);
	setenv("KHOR_TIMEOUT", "20s", 1);
	setenv("KHOR_LOG", "info", 1);
	for (int i = 0; i < 4; i++) {
		snprintf(log[i], sizeof(log[i]), "%s/pod%d.log", dir, i);
		pid[i] = fork();
		cr_assert(pid[i] >= 0);
		if (pid[i] == 0)
			_exit(k8s_pod(i, log[i]));
	}
	int failed = 0;
	time_t deadline = time(NULL) + 40;
	for (int i = 0; i < 4; i++) {
		int status = 0;
		pid_t w;
		while ((w = waitpid(pid[i], &status, WNOHANG)) == 0 && time(NULL) < deadline)
			usleep(10000);
		if (w == 0) {
			for (int k = i; k < 4; k++)
				kill(pid[k], SIGKILL);
			waitpid(pid[i], &status, 0);
		}
		bool ok = w == pid[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0, via = false;
		FILE *f = fopen(log[i], "r");
		char line[2048];
		while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
			if (!ok)
				fprintf(stderr, "pod %d: %s", i, line);
			via = via || (strstr(line, "joined job 'train'") && strstr(line, "via k8s"));
		}
		if (f != NULL)
			fclose(f);
		cr_expect(ok, "pod %d: %s, status %d", i, w == 0 ? "killed after 40 s" : "exited",
		          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		cr_expect(via, "pod %d did not log \"joined job 'train' ... via k8s\"", i);
		failed += !ok || !via;
		unlink(log[i]);
	}
	rmdir(dir);
	cr_assert_eq(failed, 0);
}

/* The README's variable table is config_vars[], row for row: no default or meaning drifts. */
Test(config, readme_table_is_the_config_table)
{
	FILE *f = fopen(KHOR_SOURCE_DIR "/README.md", "r");
	char line[1024], want[1024];
	int row = 0;

	cr_assert_not_null(f, "cannot open %s", KHOR_SOURCE_DIR "/README.md");
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, "| `KHOR_", 8) != 0)
			continue;
		cr_assert_lt(row, config_nvars, "README has a row config.c lacks: %s", line);
		snprintf(want, sizeof(want), "| `%s` | %s%s%s | %s |\n", config_vars[row].name,
		         config_vars[row].def ? "`" : "", config_vars[row].def ? config_vars[row].def : "—",
		         config_vars[row].def ? "`" : "", config_vars[row].help);
		cr_assert_str_eq(line, want, "README row %d differs from runtime/config.c", row);
		row++;
	}
	fclose(f);
	cr_assert_eq(row, config_nvars, "README lists %d of config.c's %d variables", row,
	             config_nvars);
}
