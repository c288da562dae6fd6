/*
 * test_log.c - the daemon's log (mlfs/mlfs_log.c): one line per event, and
 * a fault repeated in a loop is cut at LOG_PER_SECOND lines a second, the
 * rest counted and said at the next second's first line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/common.h"

/* Runs @fn with stderr going to a temporary file; returns what it wrote. */
static char *captured(void (*fn)(void))
{
	FILE *tmp = tmpfile();
	int saved = dup(STDERR_FILENO);
	assert_non_null(tmp);
	assert_true(saved >= 0);
	fflush(stderr);
	assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
	fn();
	fflush(stderr);
	assert_true(dup2(saved, STDERR_FILENO) >= 0);
	close(saved);
	off_t n = lseek(fileno(tmp), 0, SEEK_END);
	assert_true(n >= 0);
	char *out = calloc(1, (size_t)n + 1);
	assert_non_null(out);
	assert_int_equal(pread(fileno(tmp), out, (size_t)n, 0), n);
	fclose(tmp);
	return out;
}

static int lines_with(const char *text, const char *what)
{
	int n = 0;
	for (const char *p = text; (p = strstr(p, what)); p++)
		n++;
	return n;
}

/* Waits for the start of the next second of CLOCK_MONOTONIC. */
static void next_second(void)
{
	struct timespec t, nap;
	clock_gettime(CLOCK_MONOTONIC, &t);
	nap = (struct timespec){0, 1000000000L - t.tv_nsec + 1000000L};
	nanosleep(&nap, NULL);
}

static void burst(void)
{
	next_second();
	for (int i = 0; i < 500; i++)
		mlfs_log(MLFS_LOG_WARNING, "fetch %d failed\nagain", i);
	next_second();
	mlfs_log(MLFS_LOG_INFO, "after the burst");
}

static void test_rate_limit(void **state)
{
	(void)state;
	mlfs_log_init(true, MLFS_LOG_INFO);
	char *out = captured(burst);
	/* 200 lines of the burst (a second is long enough for 500 writes), its
	 * newline folded; then the count, then the next line */
	assert_int_equal(lines_with(out, "mlfs: warning: fetch "), 200);
	assert_int_equal(lines_with(out, " again\n"), 200);
	assert_non_null(strstr(out, "mlfs: warning: fetch 199 failed again\n"));
	assert_null(strstr(out, "fetch 200 "));
	assert_non_null(strstr(out, "mlfs: warning: log: 300 lines suppressed (more than 200 a "
				    "second)\nmlfs: info: after the burst\n"));
	free(out);
}

static void quiet(void)
{
	mlfs_log(MLFS_LOG_DEBUG, "not shown");
	mlfs_log(MLFS_LOG_ERROR, "shown");
}

static void test_level(void **state)
{
	(void)state;
	mlfs_log_init(true, MLFS_LOG_WARNING);
	char *out = captured(quiet);
	assert_string_equal(out, "mlfs: error: shown\n");
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_rate_limit),
	    cmocka_unit_test(test_level),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
