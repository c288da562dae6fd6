/*
 * test_source.c - dataset sources and their block cache
 * (dataset/mlfs_source.c) on file:// URIs, and URI checks and joins.
 *
 * The tests read a temporary directory of random files (source_fixture.h)
 * and compare every byte. test_source_http.c reads the same files over
 * HTTP.
 */
#include "tests/unit/source_fixture.h"

/* --------------------------------------------------------------- file:// */

static void test_file_random(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 65536, 32768, 0);

	random_reads(s, 0, 300, 1);
	struct mlfs_src_stats st = stats(s);
	assert_true(st.hits > 0);
	assert_true(st.misses > 0);
	assert_true(st.cached_bytes <= 65536);
	assert_int_equal(st.failures, 0);
	assert_int_equal(st.retries, 0);
	mlfs_src_free(s);

	/* Default options, one read of a whole file. */
	char uri[MAX_URI_LEN];
	assert_non_null(s = mlfs_src_new(NULL));
	file_uri(uri, F_A);
	check_read(s, uri, F_A, 0, fsize[F_A]);
	mlfs_src_free(s);
	mlfs_src_free(NULL);
}

static void test_file_hits_coalesce(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 1 << 20, 32768, 0);
	char uri[MAX_URI_LEN];
	struct mlfs_src_stats st;

	file_uri(uri, F_A);
	check_read(s, uri, F_A, 0, 8 * 4096); /* 8 missing blocks: one request */
	st = stats(s);
	assert_int_equal(st.misses, 8);
	assert_int_equal(st.hits, 0);
	assert_int_equal(st.requests, 1);
	assert_int_equal(st.bytes_fetched, 8 * 4096);
	assert_int_equal(st.cached_bytes, 8 * 4096);
	assert_int_equal(st.cached_blocks, 8);
	check_read(s, uri, F_A, 0, 8 * 4096); /* all cached */
	check_read(s, uri, F_A, 100, 100);
	st = stats(s);
	assert_int_equal(st.hits, 9);
	assert_int_equal(st.requests, 1);
	check_read(s, uri, F_A, 6 * 4096 + 5, 6 * 4096); /* blocks 6-12: 2 hits, 5 misses */
	st = stats(s);
	assert_int_equal(st.hits, 11);
	assert_int_equal(st.misses, 13);
	assert_int_equal(st.requests, 2);
	/* The last, short block. */
	check_read(s, uri, F_A, fsize[F_A] - 10, 10);
	st = stats(s);
	assert_int_equal(st.cached_bytes, 13 * 4096 + fsize[F_A] % 4096);
	mlfs_src_free(s);

	/* Requests of at most 3 blocks: 8 blocks take 3. */
	s = src_new(4096, 1 << 20, 3 * 4096, 0);
	check_read(s, uri, F_A, 0, 8 * 4096);
	assert_int_equal(stats(s).requests, 3);
	mlfs_src_free(s);

	/* Two ranges of two files in one readv; a gap makes two requests. */
	char uri_b[MAX_URI_LEN];
	file_uri(uri_b, F_B);
	s = src_new(4096, 1 << 20, 1 << 20, 0);
	uint8_t d[4][5000];
	struct mlfs_range r[4] = {{uri, 0, 5000, d[0]},
				  {uri_b, 60000, 5000, d[1]},
				  {uri, 20000, 5000, d[2]},
				  {uri, 2000, 5000, d[3]}};
	struct ptc_error why;
	assert_int_equal(mlfs_src_readv(s, r, 4, &why), 0);
	assert_memory_equal(d[0], content[F_A], 5000);
	assert_memory_equal(d[1], content[F_B] + 60000, 5000);
	assert_memory_equal(d[2], content[F_A] + 20000, 5000);
	assert_memory_equal(d[3], content[F_A] + 2000, 5000);
	st = stats(s);
	assert_int_equal(st.misses, 2 + 3 + 2); /* a: 0-1 and 4-6, b: 14-15 */
	mlfs_src_free(s);
}

/* file_direct: file ranges are read with preadv into their dsts, adjacent
 * ones together, and never enter the block cache. */
static void test_file_direct(void **state)
{
	(void)state;
	struct mlfs_src_opts o = {
	    .block_bytes = 4096, .max_request_bytes = 1 << 20, .parallel = 4, .file_direct = true};
	struct mlfs_src *s = mlfs_src_new(&o);
	struct mlfs_src_stats st;
	char uri[MAX_URI_LEN];
	struct ptc_error why;

	assert_non_null(s);
	random_reads(s, 0, 300, 7);
	st = stats(s);
	assert_int_equal(st.hits + st.misses + st.cached_bytes + st.cached_blocks, 0);
	assert_true(st.direct_reads > 0);
	assert_int_equal(st.failures, 0);

	/* Adjacent ranges given out of order: one preadv; a gap makes two; the
	 * same range twice fills both dsts. */
	file_uri(uri, F_A);
	uint8_t d[5][1000];
	struct mlfs_range r[5] = {{uri, 1100, 1000, d[0]},
				  {uri, 100, 1000, d[1]},
				  {uri, 2100, 1000, d[2]},
				  {uri, 9000, 1000, d[3]},
				  {uri, 9000, 1000, d[4]}};
	int64_t before = stats(s).direct_reads;
	assert_int_equal(mlfs_src_readv(s, r, 3, &why), 0);
	assert_int_equal(stats(s).direct_reads, before + 1);
	assert_int_equal(mlfs_src_readv(s, r, 5, &why), 0);
	assert_int_equal(stats(s).direct_reads, before + 1 + 3);
	for (int i = 0; i < 5; i++)
		assert_memory_equal(d[i], content[F_A] + r[i].off, 1000);

	/* Past the end: named, as through the cache. */
	file_uri(uri, F_SMALL);
	assert_int_equal(read1(s, uri, 96, 36, &why), -EIO);
	assert_non_null(strstr(why.text, "holds 100 bytes, bytes 96-131 asked"));
	assert_int_equal(why.code, -EIO);

	/* A file that shrank after it was opened: EIO naming it, not short data. */
	char path[128];
	snprintf(path, sizeof(path), "%s/shrinks.bin", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(content[F_A], 1, 50000, f), 50000);
	assert_int_equal(fclose(f), 0);
	snprintf(uri, sizeof(uri), "file://%s", path);
	assert_int_equal(read1(s, uri, 0, 50000, &why), 0);
	assert_int_equal(truncate(path, 9000), 0);
	/* Not the mapping's zeros for bytes 9000-12287 (the rest of the cut
	 * page): the read names the end; the next one, reopened, the size. */
	assert_int_equal(read1(s, uri, 9000, 100, &why), -EIO);
	assert_non_null(
	    strstr(why.text, "shrinks.bin: ends at byte 9000, shorter than when opened"));
	assert_int_equal(read1(s, uri, 20000, 100, &why), -EIO);
	assert_non_null(strstr(why.text, "shrinks.bin: holds 9000 bytes, bytes 20000-20099 asked"));
	uint8_t back[100];
	struct mlfs_range r100 = {.uri = uri, .off = 100, .len = 100, .dst = back};
	assert_int_equal(mlfs_src_readv(s, &r100, 1, &why), 0);
	assert_memory_equal(back, content[F_A] + 100, 100);

	/* A file that shrinks during a copy from its mapping: SIGBUS, caught. */
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	const uint8_t *map = mmap(NULL, 9000, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(map != MAP_FAILED);
	uint8_t got[4000];
	assert_int_equal(mlfs_mapcopy(got, map + 4096, 4000), 0);
	assert_memory_equal(got, content[F_A] + 4096, 4000);
	assert_int_equal(truncate(path, 100), 0);
	assert_int_equal(mlfs_mapcopy(got, map + 4096, 4000), -EIO);
	assert_int_equal(mlfs_mapcopy(got, map + 4096, 4000), -EIO); /* and again */
	assert_int_equal(mlfs_mapcopy(got, map, 100), 0);
	assert_memory_equal(got, content[F_A], 100);
	munmap((void *)map, 9000);
	close(fd);
	unlink(path);
	mlfs_src_free(s);
}

static void test_file_lru(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 4 * 4096, 4096, 0);
	char uri[MAX_URI_LEN];
	struct mlfs_src_stats st;

	file_uri(uri, F_A);
	for (int b = 0; b < 4; b++)
		check_read(s, uri, F_A, b * 4096, 4096);
	st = stats(s);
	assert_int_equal(st.cached_blocks, 4);
	assert_int_equal(st.cached_bytes, 4 * 4096);
	check_read(s, uri, F_A, 0, 10);		 /* block 0 now most recent */
	check_read(s, uri, F_A, 4 * 4096, 4096); /* evicts block 1, the LRU */
	st = stats(s);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.cached_bytes, 4 * 4096);
	check_read(s, uri, F_A, 0, 10);
	assert_int_equal(stats(s).hits, 2);
	check_read(s, uri, F_A, 4096, 10);
	st = stats(s);
	assert_int_equal(st.hits, 2);
	assert_int_equal(st.misses, 6);

	/* One readv of 16 times the cache. */
	check_read(s, uri, F_A, 1000, 64 * 4096);
	st = stats(s);
	assert_true(st.cached_bytes <= 4 * 4096);
	assert_int_equal(st.cached_blocks, 4);
	/* A cache smaller than one block keeps nothing, reads still work. */
	mlfs_src_free(s);
	s = src_new(4096, 1000, 4096, 0);
	check_read(s, uri, F_A, 0, 10000);
	check_read(s, uri, F_A, 0, 10000);
	st = stats(s);
	assert_int_equal(st.cached_bytes, 0);
	assert_int_equal(st.hits, 0);
	mlfs_src_free(s);
}

static void test_file_errors(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(64, 1 << 20, 1 << 20, 0);
	char uri[MAX_URI_LEN], want[MAX_URI_LEN + 64];
	struct ptc_error why;

	file_uri(uri, F_SMALL);
	check_read(s, uri, F_SMALL, 0, 100);
	assert_int_equal(read1(s, uri, 96, 36, &why), -EIO);
	snprintf(want, sizeof(want), "%s: holds 100 bytes, bytes 96-131 asked", uri);
	assert_string_equal(why.text, want);
	assert_int_equal(read1(s, uri, 100, 1, &why), -EIO);
	assert_int_equal(read1(s, uri, 100, 0, &why), 0); /* empty: ignored */
	assert_int_equal(read1(s, uri, 5000, 0, &why), 0);

	file_uri(uri, F_EMPTY);
	assert_int_equal(read1(s, uri, 0, 1, &why), -EIO);
	assert_non_null(strstr(why.text, "holds 0 bytes"));

	snprintf(uri, sizeof(uri), "file://%s/missing.bin", dir);
	assert_int_equal(read1(s, uri, 0, 1, &why), -EIO);
	snprintf(want, sizeof(want), "%s: No such file or directory", uri);
	assert_string_equal(why.text, want);
	snprintf(uri, sizeof(uri), "file://%s/subdir", dir);
	assert_int_equal(read1(s, uri, 0, 1, &why), -EIO);
	assert_non_null(strstr(why.text, "not a regular file"));
	assert_int_equal(why.code, -EIO);

	/* A FIFO with no writer: refused at once, not waited on (the open
	 * blocked forever; SIGALRM ends the test if it ever does again). */
	char fifo[64 + 8];
	uint8_t *data;
	size_t len;
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	snprintf(uri, sizeof(uri), "file://%s", fifo);
	alarm(10);
	assert_int_equal(read1(s, uri, 0, 1, &why), -EIO);
	snprintf(want, sizeof(want), "%s: not a regular file", uri);
	assert_string_equal(why.text, want);
	assert_int_equal(mlfs_src_fetch(s, uri, 100, &data, &len, &why), -EIO);
	assert_string_equal(why.text, want);
	alarm(0);
	unlink(fifo);

	/* One bad range fails the readv, good ones beside it or not. */
	char good[MAX_URI_LEN];
	uint8_t d1[10], d2[10];
	file_uri(good, F_A);
	snprintf(uri, sizeof(uri), "file://%s/missing.bin", dir);
	struct mlfs_range r[2] = {{good, 0, 10, d1}, {uri, 0, 10, d2}};
	assert_int_equal(mlfs_src_readv(s, r, 2, &why), -EIO);
	assert_non_null(strstr(why.text, "missing.bin"));
	/* The message comes with its errno; NULL is fine. */
	assert_int_equal(why.code, -EIO);
	assert_int_equal(mlfs_src_readv(s, r, 2, NULL), -EIO);
	assert_int_equal(mlfs_src_readv(s, r, 0, &why), 0);
	mlfs_src_free(s);
}

static void test_bad_uris(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(64, 1 << 20, 1 << 20, 0);
	static const char *const bad[] = {
	    "",
	    "a.bin",
	    "/tmp/a.bin",
	    "file:/tmp/a.bin",
	    "file://host/a.bin",
	    "file://",
	    "file:///",
	    "ftp://h/a.bin",
	    "s3://b/a.bin",
	    "http://",
	    "http:///a.bin",
	    "https://",
	    "http://h/a b.bin",
	    "http://h/a\tb",
	    "HTTPX://h/a.bin",
	};
	char good[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t d[4], *data = (uint8_t *)1;
	size_t len = 1;

	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		assert_int_equal(read1(s, bad[i], 0, 1, &why), -EINVAL);
		assert_true(why.text[0]);
		assert_int_equal(why.code, -EINVAL);
		assert_int_equal(mlfs_src_fetch(s, bad[i], 100, &data, &len, &why), -EINVAL);
		assert_null(data);
		assert_int_equal(len, 0);
	}
	assert_int_equal(read1(s, NULL, 0, 1, &why), -EINVAL);
	char *longuri = malloc(MLFS_SRC_MAX_URI + 100);
	assert_non_null(longuri);
	memset(longuri, 'x', MLFS_SRC_MAX_URI + 99);
	memcpy(longuri, "file:///", 8);
	longuri[MLFS_SRC_MAX_URI + 99] = 0;
	assert_int_equal(read1(s, longuri, 0, 1, &why), -EINVAL);
	free(longuri);

	file_uri(good, F_A);
	struct mlfs_range r = {good, -1, 1, d};
	assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EINVAL);
	r = (struct mlfs_range){good, 0, -1, d};
	assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EINVAL);
	r = (struct mlfs_range){good, INT64_MAX, 1, d};
	assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EINVAL);
	r = (struct mlfs_range){good, 0, 1, NULL};
	assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EINVAL);
	assert_int_equal(mlfs_src_readv(s, NULL, 1, &why), -EINVAL);
	assert_int_equal(mlfs_src_fetch(s, good, -1, &data, &len, &why), -EINVAL);
	/* A huge range of a known file: past its end, not an allocation. */
	r = (struct mlfs_range){good, 0, INT64_MAX, d};
	assert_int_equal(mlfs_src_readv(s, &r, 1, &why), -EIO);
	assert_non_null(strstr(why.text, "holds 300007 bytes"));
	assert_int_equal(why.code, -EIO);
	mlfs_src_free(s);
}

static void test_uri_join(void **state)
{
	(void)state;
	static const struct {
		const char *base, *ref, *want;
	} cases[] = {
	    {"file:///data/train/index.json", "shard0.bin", "file:///data/train/shard0.bin"},
	    {"file:///data/train/index.json", "sub/s.bin", "file:///data/train/sub/s.bin"},
	    {"file:///index.json", "s.bin", "file:///s.bin"},
	    {"file:///d/", "s.bin", "file:///d/s.bin"},
	    {"file:///d/i.json", "./s.bin", "file:///d/./s.bin"},
	    {"file:///d/i.json", "a..b.bin", "file:///d/a..b.bin"},
	    {"file:///d/i.json", "https://x.org/s.bin", "https://x.org/s.bin"},
	    {"file:///d/i.json", "file:///e/s.bin", "file:///e/s.bin"},
	    {"file:///d/i.json", "http://h/../s.bin", "http://h/../s.bin"},
	    {"http://h:8080/train/index.json", "s0.bin", "http://h:8080/train/s0.bin"},
	    {"https://h/a/b/index.json?sig=x/y", "s0.bin", "https://h/a/b/s0.bin"},
	    {"http://h/index.json#frag", "s0.bin", "http://h/s0.bin"},
	    {"http://h", "s0.bin", "http://h/s0.bin"},
	    {"http://h?q=1", "s0.bin", "http://h/s0.bin"},
	    {"file:///d/i.json", "..", NULL},
	    {"file:///d/i.json", "../s.bin", NULL},
	    {"file:///d/i.json", "a/../s.bin", NULL},
	    {"file:///d/i.json", "a/..", NULL},
	    {"file:///d/i.json", "/etc/passwd", NULL},
	    {"file:///d/i.json", "", NULL},
	    {"/d/i.json", "s.bin", NULL},
	    {"index.json", "s.bin", NULL},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		char *got = mlfs_uri_join(cases[i].base, cases[i].ref);
		if (!cases[i].want) {
			if (got)
				print_error("join(%s, %s) = %s, want NULL\n", cases[i].base,
					    cases[i].ref, got);
			assert_null(got);
			continue;
		}
		assert_non_null(got);
		assert_string_equal(got, cases[i].want);
		free(got);
	}
	assert_null(mlfs_uri_join(NULL, "a"));
	assert_null(mlfs_uri_join("file:///a", NULL));
}

static void test_file_fetch(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(64, 1 << 20, 1 << 20, 0);
	char uri[MAX_URI_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	file_uri(uri, F_INDEX);
	assert_int_equal(mlfs_src_fetch(s, uri, 1 << 20, &data, &len, &why), 0);
	assert_int_equal(len, fsize[F_INDEX]);
	assert_memory_equal(data, content[F_INDEX], len);
	free(data);
	assert_int_equal(mlfs_src_fetch(s, uri, fsize[F_INDEX], &data, &len, &why), 0);
	free(data);
	assert_int_equal(mlfs_src_fetch(s, uri, 5, &data, &len, &why), -EFBIG);
	assert_null(data);
	assert_non_null(strstr(why.text, uri));
	assert_int_equal(why.code, -EFBIG);
	file_uri(uri, F_EMPTY);
	assert_int_equal(mlfs_src_fetch(s, uri, 0, &data, &len, &why), 0);
	assert_non_null(data);
	assert_int_equal(len, 0);
	free(data);
	snprintf(uri, sizeof(uri), "file://%s/missing.json", dir);
	assert_int_equal(mlfs_src_fetch(s, uri, 100, &data, &len, &why), -EIO);
	assert_non_null(strstr(why.text, uri));
	assert_int_equal(stats(s).cached_bytes, 0);
	mlfs_src_free(s);
}

static void test_file_threads(void **state)
{
	(void)state;
	struct mlfs_src *s = src_new(4096, 8 * 4096, 16384, 0);

	race(s, 0);
	struct mlfs_src_stats st = stats(s);
	assert_true(st.cached_bytes <= 8 * 4096);
	assert_true(st.hits > 0);
	mlfs_src_free(s);
}

int main(void)
{
	const struct CMUnitTest file_tests[] = {
	    cmocka_unit_test(test_file_random),	 cmocka_unit_test(test_file_hits_coalesce),
	    cmocka_unit_test(test_file_lru),	 cmocka_unit_test(test_file_direct),
	    cmocka_unit_test(test_file_errors),	 cmocka_unit_test(test_bad_uris),
	    cmocka_unit_test(test_uri_join),	 cmocka_unit_test(test_file_fetch),
	    cmocka_unit_test(test_file_threads),
	};
	int failed;

	signal(SIGPIPE, SIG_IGN);
	if (make_files(NULL)) {
		fprintf(stderr, "test_source: cannot write the test files\n");
		remove_files();
		return 1;
	}
	failed = cmocka_run_group_tests_name("file", file_tests, NULL, NULL);
	remove_files();
	return failed ? 1 : 0;
}
