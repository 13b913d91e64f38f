/* test_config.c -- KHOR_* parsing: sources in order, strict values, clear refusals. */
#include "../../runtime/config.h"
#include "khor.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void clean_env(void)
{
	const char *vars[] = { "KHOR_RANK", "KHOR_SIZE", "KHOR_STORE_ADDR", "RANK", "WORLD_SIZE",
	                       "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
	                       "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
	                       "KHOR_TIMEOUT", "KHOR_LOCAL_RANK", "LOCAL_RANK", "KHOR_ALGO" };
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
