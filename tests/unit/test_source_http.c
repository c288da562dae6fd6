/*
 * test_source_http.c - dataset sources (dataset/mlfs_source.c) on http://
 * URIs, and what they do when the server misbehaves.
 *
 * The tests serve the temporary directory of random files of
 * source_fixture.h with tests/e2e/rangeserver.py, run as a child process
 * (unit_server.h: the binary must run from the repository root, as `make
 * unit` does; a server that does not start is a failure, never a skip),
 * and switch its failure injection at run time through its /__set
 * endpoint: whatever the server does wrong, a read either returns exactly
 * the file's bytes or fails with -EIO and writes nothing.
 */
#include "tests/unit/source_fixture.h"
#include "tests/unit/unit_server.h"

#define SENTINEL 0x5a

static struct unit_server srv = {.pid = -1};
/* Set once the HTTP group's server ran: the HTTP tests must not be skipped. */
static bool http_started;

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ------------------------------------------------------------- fixtures */

static void server_start(struct unit_server *sv, const char *const *extra)
{
	unit_server_start(sv, dir, extra);
}

/* GET /__set?@query (through mlfs_src_fetch, which must work for this). */
static void server_set(int port, const char *query)
{
	struct mlfs_src *s = mlfs_src_new(NULL);
	char uri[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	assert_non_null(s);
	snprintf(uri, sizeof(uri), "http://127.0.0.1:%d/__set?%s", port, query);
	int rc = mlfs_src_fetch(s, uri, 4096, &data, &len, &why);
	if (rc)
		print_error("%s: %s\n", uri, why.text);
	assert_int_equal(rc, 0);
	free(data);
	mlfs_src_free(s);
}

/* The server's request counters. */
static void server_stats(int port, long *requests, long *failed)
{
	struct mlfs_src *s = mlfs_src_new(NULL);
	char uri[MAX_URI_LEN], text[512];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	assert_non_null(s);
	snprintf(uri, sizeof(uri), "http://127.0.0.1:%d/__stats", port);
	assert_int_equal(mlfs_src_fetch(s, uri, sizeof(text) - 1, &data, &len, &why), 0);
	memcpy(text, data, len);
	text[len] = 0;
	assert_int_equal(sscanf(text, "{\"requests\": %ld, \"failed\": %ld", requests, failed), 2);
	free(data);
	mlfs_src_free(s);
}

static int http_setup(void **state)
{
	(void)state;
	server_start(&srv, NULL);
	http_started = true;
	return 0;
}

static int http_teardown(void **state)
{
	(void)state;
	unit_server_stop(&srv);
	return 0;
}

/* ------------------------------------------------------------------ HTTP */

static void test_http_exact(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 65536, 32768, 2);
	char uri[MAX_URI_LEN], want[MAX_URI_LEN + 64];
	struct ptc_error why;
	long req, failed;
	struct mlfs_src_stats st;

	server_set(srv.port, "fail_rate=0&fail_always=0&reset=1");
	random_reads(s, srv.port, 200, 2);
	st = stats(s);
	assert_int_equal(st.retries, 0);
	assert_int_equal(st.failures, 0);
	assert_true(st.hits > 0);
	assert_true(st.cached_bytes <= 65536);
	server_stats(srv.port, &req, &failed);
	assert_int_equal(req, st.requests);
	assert_int_equal(failed, 0);
	mlfs_src_free(s);

	/* Whole files with default options (last block clamped by the reply). */
	assert_non_null(s = mlfs_src_new(NULL));
	http_uri(uri, srv.port, names[F_A]);
	check_read(s, uri, F_A, 0, fsize[F_A]);
	check_read(s, uri, F_A, fsize[F_A] - 1, 1);
	assert_int_equal(stats(s).hits, 1);
	mlfs_src_free(s);

	/* Coalescing: 8 missing blocks, one request to the server. */
	s = src_new(4096, 1 << 20, 32768, 2);
	server_set(srv.port, "reset=1");
	check_read(s, uri, F_A, 0, 8 * 4096);
	server_stats(srv.port, &req, &failed);
	assert_int_equal(req, 1);
	assert_int_equal(stats(s).requests, 1);
	mlfs_src_free(s);

	/* Past the end, the size learned from the reply: a short 206, then a 416. */
	http_uri(uri, srv.port, names[F_SMALL]);
	snprintf(want, sizeof(want), "%s: holds 100 bytes, bytes 96-131 asked", uri);
	s = src_new(64, 1 << 20, 1 << 20, 2);
	assert_int_equal(read1(s, uri, 96, 36, &why), -EIO);
	assert_string_equal(why.text, want);
	assert_int_equal(read1(s, uri, 96, 36, &why), -EIO); /* size now known */
	assert_string_equal(why.text, want);
	check_read(s, uri, F_SMALL, 0, 100);
	mlfs_src_free(s);
	s = src_new(64, 1 << 20, 1 << 20, 2);
	assert_int_equal(read1(s, uri, 200, 10, &why), -EIO);
	assert_non_null(strstr(why.text, "holds 100 bytes, bytes 200-209 asked"));
	assert_int_equal(stats(s).retries, 0);
	http_uri(uri, srv.port, names[F_EMPTY]);
	assert_int_equal(read1(s, uri, 0, 1, &why), -EIO);
	assert_non_null(strstr(why.text, "holds 0 bytes"));
	assert_int_equal(stats(s).cached_bytes, 0);
	mlfs_src_free(s);
}

static void test_http_flaky(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 32768, 16384, 20);
	struct mlfs_src_stats st;
	char uri[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	server_set(srv.port, "fail_rate=0.3&seed=7&reset=1&modes=500,503,429,408,drop,truncate,"
			     "ignore-range,short,badrange");
	random_reads(s, srv.port, 100, 3);
	race(s, srv.port);
	http_uri(uri, srv.port, names[F_INDEX]);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(mlfs_src_fetch(s, uri, 1 << 20, &data, &len, &why), 0);
		assert_int_equal(len, fsize[F_INDEX]);
		assert_memory_equal(data, content[F_INDEX], len);
		free(data);
	}
	st = stats(s);
	assert_true(st.retries > 0);
	assert_int_equal(st.failures, 0);
	assert_true(st.cached_bytes <= 32768);
	long req, failed;
	server_stats(srv.port, &req, &failed);
	assert_true(failed > 0);
	/* curl may resend a request dropped on a reused connection by itself. */
	assert_true(req >= st.requests);
	mlfs_src_free(s);

	/* A server ignoring Range half the time never yields wrong bytes. */
	server_set(srv.port, "fail_rate=0.5&modes=ignore-range");
	s = src_new(4096, 32768, 16384, 20);
	random_reads(s, srv.port, 60, 4);
	assert_true(stats(s).retries > 0);
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0");
}

/* Every failure mode, always on: -EIO after the retries, nothing written or cached. */
static void test_http_modes(void **state)
{
	(void)state;
	static const char *const modes[] = {"500",	"503",	 "429",	     "408",	    "drop",
					    "truncate", "short", "badrange", "ignore-range"};
	char uri[MAX_URI_LEN], q[128];
	struct ptc_error why;
	uint8_t dst[3000];

	http_uri(uri, srv.port, names[F_A]);
	for (size_t m = 0; m < sizeof(modes) / sizeof(*modes); m++) {
		struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 2);
		struct mlfs_range r = {uri, 5000, sizeof(dst), dst};
		snprintf(q, sizeof(q), "fail_rate=1&modes=%s&reset=1", modes[m]);
		server_set(srv.port, q);
		memset(dst, SENTINEL, sizeof(dst));
		assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EIO);
		if (!strstr(why.text, uri) || !strstr(why.text, "after 3 attempts")) {
			print_error("mode %s: \"%s\"\n", modes[m], why.text);
			fail();
		}
		for (size_t i = 0; i < sizeof(dst); i++)
			assert_int_equal(dst[i], SENTINEL);
		struct mlfs_src_stats st = stats(s);
		assert_int_equal(st.cached_bytes, 0);
		assert_int_equal(st.requests, 3);
		assert_int_equal(st.retries, 2);
		assert_int_equal(st.failures, 1);
		assert_int_equal(st.bytes_fetched, 0);
		long req, failed;
		server_stats(srv.port, &req, &failed);
		assert_int_equal(req, 3);
		assert_int_equal(failed, 3);
		mlfs_src_free(s);
	}
	/* A status code names itself. */
	server_set(srv.port, "fail_rate=1&modes=503");
	struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 1);
	char want[MAX_URI_LEN + 64];
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	snprintf(want, sizeof(want), "%s: HTTP 503 after 2 attempts", uri);
	assert_string_equal(why.text, want);
	mlfs_src_free(s);

	/* A 200 with the whole object is fine when the whole object was asked. */
	server_set(srv.port, "fail_rate=1&modes=ignore-range&reset=1");
	s = src_new(4096, 1 << 20, 32768, 0);
	http_uri(uri, srv.port, names[F_SMALL]);
	check_read(s, uri, F_SMALL, 10, 50);
	check_read(s, uri, F_SMALL, 0, 100);
	assert_int_equal(stats(s).requests, 1);
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0");
}

static void test_http_404(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 5);
	char uri[MAX_URI_LEN], want[MAX_URI_LEN + 64];
	struct ptc_error why;
	uint8_t *data;
	size_t len;
	long req, failed;

	server_set(srv.port, "fail_rate=0&reset=1");
	http_uri(uri, srv.port, "missing.bin");
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	snprintf(want, sizeof(want), "%s: HTTP 404", uri);
	assert_string_equal(why.text, want);
	assert_int_equal(mlfs_src_fetch(s, uri, 100, &data, &len, &why), -EIO);
	assert_string_equal(why.text, want);
	struct mlfs_src_stats st = stats(s);
	assert_int_equal(st.retries, 0);
	assert_int_equal(st.requests, 2);
	assert_int_equal(st.failures, 2);
	server_stats(srv.port, &req, &failed);
	assert_int_equal(req, 2);

	/* Other statuses that are not retried. */
	server_set(srv.port, "fail_rate=1&modes=403");
	http_uri(uri, srv.port, names[F_A]);
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	assert_non_null(strstr(why.text, "HTTP 403"));
	assert_null(strstr(why.text, "attempts"));
	assert_int_equal(stats(s).retries, 0);
	server_set(srv.port, "fail_rate=0");
	mlfs_src_free(s);
}

static void test_http_fetch(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 20);
	char uri[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	server_set(srv.port, "fail_rate=0");
	http_uri(uri, srv.port, names[F_INDEX]);
	assert_int_equal(mlfs_src_fetch(s, uri, 1 << 20, &data, &len, &why), 0);
	assert_int_equal(len, fsize[F_INDEX]);
	assert_memory_equal(data, content[F_INDEX], len);
	free(data);
	assert_int_equal(mlfs_src_fetch(s, uri, 5, &data, &len, &why), -EFBIG);
	assert_null(data);
	assert_non_null(strstr(why.text, uri));
	http_uri(uri, srv.port, names[F_A]);
	assert_int_equal(mlfs_src_fetch(s, uri, 1 << 20, &data, &len, &why), 0);
	assert_int_equal(len, fsize[F_A]);
	assert_memory_equal(data, content[F_A], len);
	free(data);
	http_uri(uri, srv.port, names[F_EMPTY]);
	assert_int_equal(mlfs_src_fetch(s, uri, 0, &data, &len, &why), 0);
	assert_int_equal(len, 0);
	assert_non_null(data);
	free(data);
	assert_int_equal(stats(s).cached_bytes, 0);
	mlfs_src_free(s);
}

/* A server started with --fail-always: -EIO after the retries, every one sent. */
static void test_http_fail_always(void **state)
{
	(void)state;
	static const char *const args[] = {"--fail-always", "--fail-modes", "500", NULL};
	struct unit_server sv = {.pid = -1};
	char uri[MAX_URI_LEN], want[MAX_URI_LEN + 64];
	struct ptc_error why;
	long req, failed;

	server_start(&sv, args);
	struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 3);
	http_uri(uri, sv.port, names[F_A]);
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	snprintf(want, sizeof(want), "%s: HTTP 500 after 4 attempts", uri);
	assert_string_equal(why.text, want);
	server_stats(sv.port, &req, &failed);
	assert_int_equal(req, 4);
	assert_int_equal(failed, 4);
	unit_server_stop(&sv);

	/* Nobody listening any more: connection errors, retried, then -EIO. */
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	assert_non_null(strstr(why.text, uri));
	assert_non_null(strstr(why.text, "after 4 attempts"));
	struct mlfs_src_stats st = stats(s);
	assert_int_equal(st.retries, 6);
	assert_int_equal(st.failures, 2);
	mlfs_src_free(s);
}

/* A server that does not answer in time: the timeout, retried. */
static void test_http_timeout(void **state)
{
	(void)state;
	struct mlfs_src_opts o = {
	    .block_bytes = 4096, .retries = 1, .backoff_ms = 1, .timeout_ms = 300};
	struct mlfs_src *s = mlfs_src_new(&o);
	char uri[MAX_URI_LEN];
	struct ptc_error why;

	assert_non_null(s);
	server_set(srv.port, "fail_rate=1&modes=stall");
	http_uri(uri, srv.port, names[F_A]);
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	assert_non_null(strstr(why.text, uri));
	assert_non_null(strstr(why.text, "after 2 attempts"));
	assert_non_null(strcasestr(why.text, "timed out"));
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0");
}

/* A slow server that keeps sending is not cut by the timeout: a range sent
 * in 10 parts 0.25 s apart (over 2 s) reads fine with a 1 s timeout (the
 * timeout was for the whole request, which failed it). */
static void test_http_slow(void **state)
{
	(void)state;
	struct mlfs_src_opts o = {.block_bytes = 1 << 20, .retries = 0, .timeout_ms = 1000};
	struct mlfs_src *s = mlfs_src_new(&o);
	char uri[MAX_URI_LEN];

	assert_non_null(s);
	server_set(srv.port, "fail_rate=1&modes=slow&slow_gap=0.25&reset=1");
	http_uri(uri, srv.port, names[F_A]);
	int64_t t0 = now_ms();
	check_read(s, uri, F_A, 0, fsize[F_A]);
	assert_true(now_ms() - t0 >= 2000);
	assert_int_equal(stats(s).retries, 0);
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0&slow_gap=0.2");
}

/* A server that stops sending in the middle of a body: the attempt fails
 * about the timeout after the last bytes, and is retried. */
static void test_http_stall_body(void **state)
{
	(void)state;
	struct mlfs_src_opts o = {
	    .block_bytes = 1 << 20, .retries = 1, .backoff_ms = 1, .timeout_ms = 1000};
	struct mlfs_src *s = mlfs_src_new(&o);
	char uri[MAX_URI_LEN], want[MAX_URI_LEN + 128];
	struct ptc_error why;

	assert_non_null(s);
	server_set(srv.port, "fail_rate=1&modes=stall-body&stall_seconds=30&reset=1");
	http_uri(uri, srv.port, names[F_A]);
	int64_t t0 = now_ms();
	assert_int_equal(read1(s, uri, 0, fsize[F_A], &why), -EIO);
	int64_t ms = now_ms() - t0;
	snprintf(want, sizeof(want), "%s: timed out (nothing received for 1 s) after 2 attempts",
		 uri);
	assert_string_equal(why.text, want);
	if (ms < 2000 || ms > 8000) {
		print_error("2 stalled attempts with a 1 s timeout took %" PRId64 " ms\n", ms);
		fail();
	}
	assert_int_equal(stats(s).cached_bytes, 0);
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0&stall_seconds=5");
}

/* The deadline stops the retries: a server that never answers, 100 retries
 * allowed, a 1 s timeout and a 3 s deadline: -EIO after about 3 s, for a
 * readv and a fetch alike (with no deadline the 101 attempts took 100 s). */
static void test_http_deadline(void **state)
{
	(void)state;
	struct mlfs_src_opts o = {.block_bytes = 4096,
				  .retries = 100,
				  .backoff_ms = 1,
				  .timeout_ms = 1000,
				  .deadline_ms = 3000};
	struct mlfs_src *s = mlfs_src_new(&o);
	char uri[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	assert_non_null(s);
	server_set(srv.port, "fail_rate=1&modes=stall&stall_seconds=30&reset=1");
	http_uri(uri, srv.port, names[F_A]);
	for (int fetch = 0; fetch < 2; fetch++) {
		int64_t t0 = now_ms();
		int rc = fetch ? mlfs_src_fetch(s, uri, 1 << 20, &data, &len, &why)
			       : read1(s, uri, 0, 10, &why);
		int64_t ms = now_ms() - t0;
		assert_int_equal(rc, -EIO);
		if (ms < 2900 || ms > 5000 || !strstr(why.text, uri) ||
		    !strstr(why.text, "timed out") ||
		    !strstr(why.text, "attempts, deadline of 3 s reached")) {
			print_error("%s after %" PRId64 " ms: \"%s\"\n", fetch ? "fetch" : "readv",
				    ms, why.text);
			fail();
		}
	}
	struct mlfs_src_stats st = stats(s);
	assert_true(st.requests >= 4 && st.requests <= 8);
	assert_int_equal(st.failures, 2);
	mlfs_src_free(s);

	/* A deadline shorter than the timeout cuts the attempt itself. */
	o.timeout_ms = 10000;
	o.deadline_ms = 1500;
	assert_non_null(s = mlfs_src_new(&o));
	int64_t t0 = now_ms();
	assert_int_equal(read1(s, uri, 0, 10, &why), -EIO);
	int64_t ms = now_ms() - t0;
	char want[MAX_URI_LEN + 128];
	snprintf(want, sizeof(want), "%s: timed out after 1 attempt, deadline of 1.5 s reached",
		 uri);
	assert_string_equal(why.text, want);
	assert_true(ms >= 1400 && ms < 3000);
	mlfs_src_free(s);
	server_set(srv.port, "fail_rate=0&stall_seconds=5");
}

int main(void)
{
	const struct CMUnitTest http_tests[] = {
	    cmocka_unit_test(test_http_exact),	    cmocka_unit_test(test_http_flaky),
	    cmocka_unit_test(test_http_modes),	    cmocka_unit_test(test_http_404),
	    cmocka_unit_test(test_http_fetch),	    cmocka_unit_test(test_http_fail_always),
	    cmocka_unit_test(test_http_timeout),    cmocka_unit_test(test_http_slow),
	    cmocka_unit_test(test_http_stall_body), cmocka_unit_test(test_http_deadline),
	};
	int failed;

	signal(SIGPIPE, SIG_IGN);
	if (make_files(NULL)) {
		fprintf(stderr, "test_source_http: cannot write the test files\n");
		remove_files();
		return 1;
	}
	failed = cmocka_run_group_tests_name("http", http_tests, http_setup, http_teardown);
	unit_server_stop(&srv);
	remove_files();
	if (!http_started)
		fprintf(stderr, "test_source_http: the HTTP tests did not run\n");
	return failed || !http_started ? 1 : 0;
}
