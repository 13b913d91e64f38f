/*
 * test_settings.c -- an engine's settings come from runtime/config.c's table: KHOR_* over
 * Horovod's aliases, the table's defaults, and errors that name the variable that was read.
 */
#include "engine/settings.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static const char *const vars[] = {
	"KHOR_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "KHOR_CYCLE_TIME", "HOROVOD_CYCLE_TIME",
	"KHOR_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "KHOR_STALL_CHECK_TIME",
	"HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE", "KHOR_AUTOTUNE",
	"HOROVOD_AUTOTUNE", "KHOR_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
};

static void clean(void)
{
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

TestSuite(settings, .init = clean, .fini = clean);

Test(settings, defaults_are_the_tables)
{
	eng_settings s;
	kerr err;

	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.fusion_bytes, 64ull << 20);
	cr_expect_not(s.fusion_set);
	cr_expect_eq(s.cycle_ms, 0.0);
	cr_expect_not(s.cycle_set);
	cr_expect_eq(s.cache_capacity, 1024);
	cr_expect_eq(s.stall_check_s, 60.0);
	cr_expect_eq(s.stall_shutdown_s, 0.0);
	cr_expect_not(s.autotune);
	cr_expect_eq(s.warmup_samples, 3);
	cr_expect_eq(s.steps_per_sample, 10);
}

Test(settings, horovod_aliases_yield_to_khor)
{
	eng_settings s;
	kerr err;

	setenv("HOROVOD_FUSION_THRESHOLD", "1M", 1);
	setenv("HOROVOD_CYCLE_TIME", "2.5", 1);
	setenv("HOROVOD_AUTOTUNE", "yes", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.fusion_bytes, 1ull << 20);
	cr_expect(s.fusion_set);
	cr_expect_eq(s.cycle_ms, 2.5);
	cr_expect(s.cycle_set);
	cr_expect(s.autotune);
	setenv("KHOR_FUSION_THRESHOLD", "4M", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.fusion_bytes, 4ull << 20);
	/* A khor_config's value wins over both. */
	khor_config cfg = { .n = 1, .keys = { "KHOR_FUSION_THRESHOLD" }, .values = { "0" } };
	cr_assert_eq(settings_read(&cfg, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.fusion_bytes, 0);
}

Test(settings, errors_name_the_variable_read)
{
	eng_settings s;
	kerr err;

	setenv("HOROVOD_CACHE_CAPACITY", "lots", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_ERR_INVALID_ARG);
	cr_expect_str_eq(err.text, "HOROVOD_CACHE_CAPACITY='lots': expected entries from 0 to "
	                 "1048576 (0 = no cache)");
	setenv("KHOR_CACHE_CAPACITY", "-1", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_ERR_INVALID_ARG);
	cr_expect_str_eq(err.text, "KHOR_CACHE_CAPACITY='-1': expected entries from 0 to "
	                 "1048576 (0 = no cache)");
	unsetenv("KHOR_CACHE_CAPACITY");
	unsetenv("HOROVOD_CACHE_CAPACITY");
	setenv("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "-2", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_ERR_INVALID_ARG);
	cr_expect_str_eq(err.text, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES='-2': expected an integer "
	                 "from 0 to 100000");
}

Test(settings, stall_check_disable_unless_khor_says)
{
	eng_settings s;
	kerr err;

	setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "30", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.stall_check_s, 30.0);
	setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.stall_check_s, 0.0);
	setenv("KHOR_STALL_CHECK_TIME", "20s", 1);
	cr_assert_eq(settings_read(NULL, &s, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(s.stall_check_s, 20.0);
}
