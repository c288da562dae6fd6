/*
 * test_source.c - dataset sources and their block cache (mlfs/mlfs_source.c).
 *
 * The file:// tests read a temporary directory of random files and compare
 * every byte. The HTTP tests serve the same directory with
 * tests/e2e/rangeserver.py, run as a child process (unit_server.h: the binary
 * must run from the repository root, as `make unit` does; a server that does
 * not start is a failure, never a skip), and switch its failure injection at
 * run time through its /__set endpoint: whatever the server does wrong, a read either
 * returns exactly the file's bytes or fails with -EIO and writes nothing.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "dataset/dataset.h"
#include "tests/unit/unit.h"
#include "tests/unit/unit_server.h"

#define SENTINEL    0x5a
#define MAX_URI_LEN 512

/* The files served; content[i] holds file i's bytes. */
static const char *const names[] = {"a.bin", "b.bin", "small.bin", "empty.bin", "index.json"};
static const int64_t sizes[] = {300007, 65536, 100, 0, 0 /* set from the text */};
#define NFILES	  5
#define F_A	  0
#define F_B	  1
#define F_SMALL	  2
#define F_EMPTY	  3
#define F_INDEX	  4
#define INDEX_TXT "{\"records\": \"fixed\", \"dtype\": \"int32\", \"shape\": [129]}\n"

static char dir[64];
static uint8_t *content[NFILES];
static int64_t fsize[NFILES];

static struct unit_server srv = {.pid = -1};
/* Set once the HTTP group's server ran: the HTTP tests must not be skipped. */
static bool http_started;

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void file_uri(char *buf, int f)
{
	snprintf(buf, MAX_URI_LEN, "file://%s/%s", dir, names[f]);
}

static void http_uri(char *buf, int port, const char *name)
{
	snprintf(buf, MAX_URI_LEN, "http://127.0.0.1:%d/%s", port, name);
}

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ------------------------------------------------------------- fixtures */

static int make_files(void **state)
{
	(void)state;
	strcpy(dir, "/tmp/mlfs-src-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	for (int f = 0; f < NFILES; f++) {
		char path[MAX_URI_LEN];
		fsize[f] = f == F_INDEX ? (int64_t)strlen(INDEX_TXT) : sizes[f];
		content[f] = malloc((size_t)fsize[f] + 1);
		if (!content[f])
			return -1;
		if (f == F_INDEX)
			memcpy(content[f], INDEX_TXT, (size_t)fsize[f]);
		else
			for (int64_t i = 0; i < fsize[f]; i++)
				content[f][i] = (uint8_t)(rnd() >> 24);
		snprintf(path, sizeof(path), "%s/%s", dir, names[f]);
		FILE *fp = fopen(path, "wb");
		if (!fp || fwrite(content[f], 1, (size_t)fsize[f], fp) != (size_t)fsize[f])
			return -1;
		fclose(fp);
	}
	char sub[MAX_URI_LEN];
	snprintf(sub, sizeof(sub), "%s/subdir", dir);
	return mkdir(sub, 0700);
}

static void remove_files(void)
{
	char cmd[128];

	for (int f = 0; f < NFILES; f++)
		free(content[f]);
	if (dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "test_source: could not remove %s\n", dir);
	}
}

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

/* --------------------------------------------------------------- helpers */

static struct mlfs_src *src_new(int64_t block, int64_t cache, int64_t request, int retries)
{
	struct mlfs_src_opts o = {.block_bytes = block,
				  .cache_bytes = cache,
				  .max_request_bytes = request,
				  .retries = retries,
				  .backoff_ms = 1,
				  .max_backoff_ms = 4,
				  .timeout_ms = 5000,
				  .parallel = 4};
	struct mlfs_src *s = mlfs_src_new(&o);

	assert_non_null(s);
	return s;
}

static struct mlfs_src_stats stats(struct mlfs_src *s)
{
	struct mlfs_src_stats st;

	mlfs_src_stats(s, &st);
	return st;
}

/* Reads bytes [@off, @off + @len) of @uri into a scratch buffer; returns the readv's rc. */
static int read1(struct mlfs_src *s, const char *uri, int64_t off, int64_t len,
		 struct ptc_error *err)
{
	uint8_t *dst = malloc(len ? (size_t)len : 1);
	struct mlfs_range r = {.uri = uri, .off = off, .len = len, .dst = dst};

	assert_non_null(dst);
	int rc = mlfs_src_readv(s, &r, 1, err);
	free(dst);
	return rc;
}

/* Reads [@off, @off + @len) of file @f through @uri and checks every byte. */
static void check_read(struct mlfs_src *s, const char *uri, int f, int64_t off, int64_t len)
{
	uint8_t *dst = malloc(len ? (size_t)len : 1);
	struct mlfs_range r = {.uri = uri, .off = off, .len = len, .dst = dst};
	struct ptc_error why;

	assert_non_null(dst);
	int rc = mlfs_src_readv(s, &r, 1, &why);
	if (rc)
		print_error("%s bytes %" PRId64 "+%" PRId64 ": %s\n", uri, off, len, why.text);
	assert_int_equal(rc, 0);
	assert_memory_equal(dst, content[f] + off, (size_t)len);
	free(dst);
}

/*
 * @iters readvs of 1 to 6 random ranges (of random files, some overlapping,
 * some zero-length) through URIs made by @mk; every byte checked.
 */
static void random_reads(struct mlfs_src *s, int port, int iters, uint64_t seed)
{
	uint64_t st = seed * 0x2545f4914f6cdd1dULL + 1;
	char uris[6][MAX_URI_LEN];
	struct ptc_error why;

	for (int it = 0; it < iters; it++) {
		struct mlfs_range r[6];
		int fi[6], n = 1 + (int)((st = st * 6364136223846793005ULL + 1) >> 61) % 6;
		for (int i = 0; i < n; i++) {
			st = st * 6364136223846793005ULL + 1442695040888963407ULL;
			fi[i] = (int)((st >> 33) % 3); /* a, b or small */
			int64_t size = fsize[fi[i]];
			int64_t off = (int64_t)((st >> 20) % (uint64_t)size);
			int64_t len = (int64_t)((st >> 5) % (uint64_t)(size - off + 1));
			if (i == 2)
				len = len % 64; /* short ones too, 0 included */
			if (port)
				http_uri(uris[i], port, names[fi[i]]);
			else
				file_uri(uris[i], fi[i]);
			r[i] = (struct mlfs_range){.uri = uris[i], .off = off, .len = len};
			r[i].dst = malloc(len ? (size_t)len : 1);
			assert_non_null(r[i].dst);
		}
		int rc = mlfs_src_readv(s, r, (size_t)n, &why);
		if (rc)
			print_error("readv: %s\n", why.text);
		assert_int_equal(rc, 0);
		for (int i = 0; i < n; i++) {
			assert_memory_equal(r[i].dst, content[fi[i]] + r[i].off, (size_t)r[i].len);
			free(r[i].dst);
		}
	}
}

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

struct racer {
	struct mlfs_src *s;
	int port;
	uint64_t seed;
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;

	random_reads(r->s, r->port, 40, r->seed);
	return NULL;
}

/* Several threads on one source with a small cache: evictions under reads. */
static void race(struct mlfs_src *s, int port)
{
	pthread_t t[4];
	struct racer rc[4];

	for (int i = 0; i < 4; i++) {
		rc[i] = (struct racer){s, port, 100 + (uint64_t)i};
		assert_int_equal(pthread_create(&t[i], NULL, racer_main, &rc[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
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
	const struct CMUnitTest file_tests[] = {
	    cmocka_unit_test(test_file_random),	 cmocka_unit_test(test_file_hits_coalesce),
	    cmocka_unit_test(test_file_lru),	 cmocka_unit_test(test_file_direct),
	    cmocka_unit_test(test_file_errors),	 cmocka_unit_test(test_bad_uris),
	    cmocka_unit_test(test_uri_join),	 cmocka_unit_test(test_file_fetch),
	    cmocka_unit_test(test_file_threads),
	};
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
		fprintf(stderr, "test_source: cannot write the test files\n");
		remove_files();
		return 1;
	}
	failed = cmocka_run_group_tests_name("file", file_tests, NULL, NULL);
	failed += cmocka_run_group_tests_name("http", http_tests, http_setup, http_teardown);
	unit_server_stop(&srv);
	remove_files();
	if (!http_started)
		fprintf(stderr, "test_source: the HTTP tests did not run\n");
	return failed || !http_started ? 1 : 0;
}
