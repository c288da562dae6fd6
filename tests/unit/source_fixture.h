/*
 * source_fixture.h - what the dataset source tests share (test_source.c,
 * test_source_http.c): a temporary directory of random files and their
 * bytes, sources with the tests' options, and reads that check every byte:
 * one range, random ranges, random ranges from several threads at once.
 */
#ifndef MLFS_TESTS_SOURCE_FIXTURE_H
#define MLFS_TESTS_SOURCE_FIXTURE_H

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

/* The test files in a new temporary directory; -1 when one cannot be
 * written. */
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

#endif
