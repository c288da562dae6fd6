/*
 * test_data.c - the dataset: index.json parsing, ptc_index_locate, the
 * per-epoch permutation, the cursor and its slices (a property test over
 * random reconfigurations and resumes), ptc_dataset_change_ok and the
 * dataset fields of config.json.
 */
#include <inttypes.h>
#include <stdint.h>

#include "tests/unit/unit.h"

/* splitmix64: a fixed-seed generator, so every run tests the same cases. */
static uint64_t rng_state;

static uint64_t rnd64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0 (the modulo bias does not matter here). */
static int64_t rnd(int64_t n)
{
	assert_true(n > 0);
	return (int64_t)(rnd64() % (uint64_t)n);
}

/* ------------------------------------------------------------ index.json */

UNIT_PARSER(index, struct ptc_index, "index.json", ptc_index_parse_text, ptc_index_free)

#define INDEX_FAILS_EXACT(text, msg) index_fails_at(__FILE__, __LINE__, text, msg, NULL)
#define INDEX_FAILS(text, ...)	     index_fails_at(__FILE__, __LINE__, text, NULL, __VA_ARGS__, NULL)

/* A fixed index around @shards; a variable one. */
#define FIXED(shards)                                                                              \
	"{'records': 'fixed', 'dtype': 'int32', 'shape': [129], 'shards': [" shards "]}"
#define VAR(shards) "{'records': 'variable', 'shards': [" shards "]}"
#define SHARD	    "{'uri': 's.bin', 'count': 10}"
#define VSHARD	    "{'uri': 's.bin', 'offsets': 's.off', 'count': 10}"

static void test_index_fixed(void **state)
{
	struct ptc_index *ix = index_ok(
	    "{'records': 'fixed', 'dtype': 'int32', 'shape': [129],\n"
	    " 'shards': [{'uri': 'shard0.bin', 'count': 1000},\n"
	    "            {'uri': 'https://data.example.com/train/shard1.bin', 'count': 1000}]}");

	(void)state;
	assert_int_equal(ix->records, PTC_RECORDS_FIXED);
	assert_int_equal(ix->dtype, PTC_INT32);
	assert_int_equal(ix->ndim, 1);
	assert_int_equal(ix->shape[0], 129);
	assert_int_equal(ix->record_bytes, 4 * 129);
	assert_int_equal(ix->nshards, 2);
	assert_string_equal(ix->shards[0].uri, "shard0.bin");
	assert_null(ix->shards[0].offsets);
	assert_int_equal(ix->shards[0].first, 0);
	assert_int_equal(ix->shards[0].count, 1000);
	assert_string_equal(ix->shards[1].uri, "https://data.example.com/train/shard1.bin");
	assert_null(ix->shards[1].offsets);
	assert_int_equal(ix->shards[1].first, 1000);
	assert_int_equal(ix->shards[1].count, 1000);
	assert_int_equal(ix->total, 2000);
	ptc_index_free(ix);
	ptc_index_free(NULL);

	/* Several dims, empty shards anywhere, keys in any order. */
	ix = index_ok(
	    "{'shards': [{'count': 0, 'uri': 'a'}, {'uri': 'b', 'count': 3}, "
	    "{'uri': 'c', 'count': 0}, {'uri': 'd', 'count': 4}, {'uri': 'e', 'count': 0}], "
	    "'shape': [2, 3, 4], 'dtype': 'bfloat16', 'records': 'fixed'}");
	assert_int_equal(ix->dtype, PTC_BFLOAT16);
	assert_int_equal(ix->ndim, 3);
	assert_int_equal(ix->shape[0], 2);
	assert_int_equal(ix->shape[1], 3);
	assert_int_equal(ix->shape[2], 4);
	assert_int_equal(ix->record_bytes, 2 * 24);
	assert_int_equal(ix->nshards, 5);
	static const int64_t first[] = {0, 0, 3, 3, 7}, count[] = {0, 3, 0, 4, 0};
	for (int i = 0; i < 5; i++) {
		assert_int_equal(ix->shards[i].first, first[i]);
		assert_int_equal(ix->shards[i].count, count[i]);
	}
	assert_string_equal(ix->shards[4].uri, "e");
	assert_int_equal(ix->total, 7);
	ptc_index_free(ix);

	/* A scalar record; the largest record; the most dims. */
	ix = index_ok("{'records': 'fixed', 'dtype': 'float64', 'shape': [], 'shards': [" SHARD
		      "]}");
	assert_int_equal(ix->ndim, 0);
	assert_int_equal(ix->record_bytes, 8);
	ptc_index_free(ix);
	ix = index_ok("{'records': 'fixed', 'dtype': 'int32', 'shape': [65536, 4096], "
		      "'shards': [" SHARD "]}");
	assert_int_equal(ix->record_bytes, (int64_t)1 << 30);
	ptc_index_free(ix);
	ix = index_ok("{'records': 'fixed', 'dtype': 'uint8', 'shape': [1073741824], "
		      "'shards': [" SHARD "]}");
	assert_int_equal(ix->record_bytes, (int64_t)1 << 30);
	ptc_index_free(ix);
	ix = index_ok("{'records': 'fixed', 'dtype': 'bool', 'shape': [1, 2, 1, 2, 1, 2, 2], "
		      "'shards': [" SHARD "]}");
	assert_int_equal(ix->ndim, 7);
	assert_int_equal(ix->record_bytes, 16);
	ptc_index_free(ix);

	/* The most records: 2^48 in all. */
	ix = index_ok(FIXED("{'uri': 'a', 'count': 281474976710655}, {'uri': 'b', 'count': 1}"));
	assert_int_equal(ix->total, (int64_t)1 << 48);
	assert_int_equal(ix->shards[1].first, ((int64_t)1 << 48) - 1);
	ptc_index_free(ix);
}

static void test_index_variable(void **state)
{
	struct ptc_index *ix =
	    index_ok("{'records': 'variable', 'shards': [{'uri': 'a.bin', "
		     "'offsets': 'a.off.npy', 'count': 3}, {'uri': "
		     "'file:///d/b.bin', 'offsets': 'http://h/b.off', 'count': 5}]}");

	(void)state;
	assert_int_equal(ix->records, PTC_RECORDS_VARIABLE);
	assert_int_equal(ix->dtype, PTC_UINT8);
	assert_int_equal(ix->ndim, 0);
	assert_int_equal(ix->nshards, 2);
	assert_string_equal(ix->shards[0].uri, "a.bin");
	assert_string_equal(ix->shards[0].offsets, "a.off.npy");
	assert_int_equal(ix->shards[0].first, 0);
	assert_int_equal(ix->shards[0].count, 3);
	assert_string_equal(ix->shards[1].uri, "file:///d/b.bin");
	assert_string_equal(ix->shards[1].offsets, "http://h/b.off");
	assert_int_equal(ix->shards[1].first, 3);
	assert_int_equal(ix->shards[1].count, 5);
	assert_int_equal(ix->total, 8);
	ptc_index_free(ix);

	/* dtype is informational for variable records. */
	ix = index_ok("{'records': 'variable', 'dtype': 'int16', 'shards': [" VSHARD "]}");
	assert_int_equal(ix->dtype, PTC_INT16);
	assert_int_equal(ix->total, 10);
	ptc_index_free(ix);
}

static void test_index_errors_top(void **state)
{
	(void)state;
	INDEX_FAILS("{'records': 'fixed',\n 'dtype': }",
		    "index.json: invalid JSON at line 2 column");
	INDEX_FAILS("", "index.json: invalid JSON at line 1 column 0");
	INDEX_FAILS("{'records': 'fixed', 'records': 'fixed'}", "invalid JSON", "duplicate");
	INDEX_FAILS_EXACT("[]", "index.json: must be a JSON object");
	INDEX_FAILS_EXACT("[" SHARD "]", "index.json: must be a JSON object");
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'int32', 'shape': [1], 'size': 3, "
			  "'shards': [" SHARD "]}",
			  "index.json: unknown field \"size\"");

	static const char *const recs_msg =
	    "index.json: \"records\" must be \"fixed\" or \"variable\"";
	INDEX_FAILS_EXACT("{'dtype': 'int32', 'shape': [1], 'shards': [" SHARD "]}", recs_msg);
	INDEX_FAILS_EXACT("{'records': 'Fixed', 'dtype': 'int32', 'shape': [1], "
			  "'shards': [" SHARD "]}",
			  recs_msg);
	INDEX_FAILS_EXACT("{'records': 'fixed ', 'shards': [" SHARD "]}", recs_msg);
	INDEX_FAILS_EXACT("{'records': 1, 'shards': [" SHARD "]}", recs_msg);
	INDEX_FAILS_EXACT("{'records': null, 'shards': [" SHARD "]}", recs_msg);
	INDEX_FAILS_EXACT("{'records': '', 'shards': [" SHARD "]}", recs_msg);

	INDEX_FAILS_EXACT("{'records': 'fixed', 'shape': [1], 'shards': [" SHARD "]}",
			  "index.json: \"dtype\" is required for fixed records");
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'float128', 'shape': [1], "
			  "'shards': [" SHARD "]}",
			  "index.json: \"dtype\" = \"float128\" is not a known dtype");
	INDEX_FAILS_EXACT("{'records': 'variable', 'dtype': 'u8', 'shards': [" VSHARD "]}",
			  "index.json: \"dtype\" = \"u8\" is not a known dtype");
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 4, 'shape': [1], 'shards': [" SHARD "]}",
			  "index.json: \"dtype\" must be a string");
	INDEX_FAILS_EXACT("{'records': 'variable', 'dtype': null, 'shards': [" VSHARD "]}",
			  "index.json: \"dtype\" must be a string");
}

static void test_index_errors_shape(void **state)
{
	static const char *const shape_msg =
	    "index.json: \"shape\" must be an array of at most 7 sizes";
	static const char *const bad_sizes[] = {"0", "-1", "'3'", "1.5", "null", "true"};

	(void)state;
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'int32', 'shards': [" SHARD "]}",
			  shape_msg);
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'int32', 'shape': 129, "
			  "'shards': [" SHARD "]}",
			  shape_msg);
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'int32', 'shape': {'0': 1}, "
			  "'shards': [" SHARD "]}",
			  shape_msg);
	/* 8 dimensions: a view's 9 (with the batch) would not fit a header */
	INDEX_FAILS_EXACT(
	    "{'records': 'fixed', 'dtype': 'int32', 'shape': [1, 1, 1, 1, 1, 1, 1, 1], "
	    "'shards': [" SHARD "]}",
	    shape_msg);
	for (size_t b = 0; b < sizeof(bad_sizes) / sizeof(bad_sizes[0]); b++) {
		char text[256];

		snprintf(text, sizeof(text),
			 "{'records': 'fixed', 'dtype': 'int32', 'shape': [4, %s], "
			 "'shards': [" SHARD "]}",
			 bad_sizes[b]);
		INDEX_FAILS_EXACT(text, "index.json: shape[1] must be a positive size (records of "
					"at most 1073741824 bytes)");
	}
	/* Records over 1 GiB, by one dim, by the product, by the dtype. */
	INDEX_FAILS("{'records': 'fixed', 'dtype': 'uint8', 'shape': [1073741825], "
		    "'shards': [" SHARD "]}",
		    "index.json: shape[0] must be a positive size", "1073741824 bytes");
	INDEX_FAILS("{'records': 'fixed', 'dtype': 'int32', 'shape': [65536, 4097], "
		    "'shards': [" SHARD "]}",
		    "index.json: shape[1] must be a positive size");
	INDEX_FAILS("{'records': 'fixed', 'dtype': 'float64', 'shape': [268435456], "
		    "'shards': [" SHARD "]}",
		    "index.json: shape[0] must be a positive size");
	INDEX_FAILS("{'records': 'fixed', 'dtype': 'uint8', 'shape': [1073741824, "
		    "1073741824, 1073741824], 'shards': [" SHARD "]}",
		    "index.json: shape[1] must be a positive size");
	INDEX_FAILS("{'records': 'fixed', 'dtype': 'uint8', 'shape': [9223372036854775807], "
		    "'shards': [" SHARD "]}",
		    "index.json: shape[0] must be a positive size");

	INDEX_FAILS_EXACT("{'records': 'variable', 'shape': [1], 'shards': [" VSHARD "]}",
			  "index.json: \"shape\" is only for fixed records");
	INDEX_FAILS_EXACT("{'records': 'variable', 'shape': [], 'shards': [" VSHARD "]}",
			  "index.json: \"shape\" is only for fixed records");
}

static void test_index_errors_shards(void **state)
{
	static const char *const shards_msg =
	    "index.json: \"shards\" must be a non-empty array (at most 16777216)";

	(void)state;
	INDEX_FAILS_EXACT("{'records': 'fixed', 'dtype': 'int32', 'shape': [1]}", shards_msg);
	INDEX_FAILS_EXACT(FIXED(""), shards_msg);
	INDEX_FAILS_EXACT("{'records': 'variable', 'shards': " VSHARD "}", shards_msg);
	INDEX_FAILS_EXACT("{'records': 'variable', 'shards': 's.bin'}", shards_msg);
	INDEX_FAILS_EXACT("{'records': 'variable', 'shards': null}", shards_msg);

	INDEX_FAILS_EXACT(FIXED(SHARD ", 's.bin'"), "index.json: shards[1] must be an object");
	INDEX_FAILS_EXACT(FIXED("[]"), "index.json: shards[0] must be an object");
	INDEX_FAILS_EXACT(FIXED(SHARD ", {'uri': 'b', 'count': 1, 'bytes': 4}"),
			  "index.json: shards[1] has unknown field \"bytes\"");

	static const char *const uri_msg = "index.json: shards[0].uri must be a non-empty string";
	INDEX_FAILS_EXACT(FIXED("{'count': 1}"), uri_msg);
	INDEX_FAILS_EXACT(FIXED("{'uri': '', 'count': 1}"), uri_msg);
	INDEX_FAILS_EXACT(FIXED("{'uri': 3, 'count': 1}"), uri_msg);
	INDEX_FAILS_EXACT(FIXED("{'uri': ['a'], 'count': 1}"), uri_msg);

	INDEX_FAILS_EXACT(FIXED(SHARD ", {'uri': 'b'}"), "index.json: shards[1].count is missing");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'count': -1}"),
			  "index.json: shards[0].count = -1 is out of range [0, 281474976710656]");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'count': 281474976710657}"),
			  "index.json: shards[0].count = 281474976710657 is out of range [0, "
			  "281474976710656]");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'count': 1.5}"),
			  "index.json: shards[0].count must be an integer");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'count': '10'}"),
			  "index.json: shards[0].count must be an integer");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'count': null}"),
			  "index.json: shards[0].count must be an integer");
	/* Each count fits but the sum does not. */
	INDEX_FAILS_EXACT(
	    FIXED("{'uri': 'a', 'count': 281474976710656}, {'uri': 'b', 'count': 0}, "
		  "{'uri': 'c', 'count': 1}"),
	    "index.json: shards[2].count = 1 makes more than 281474976710656 records");

	static const char *const off_msg =
	    "index.json: shards[1].offsets must name the offsets of variable records";
	INDEX_FAILS_EXACT(VAR(VSHARD ", {'uri': 'b', 'count': 1}"), off_msg);
	INDEX_FAILS_EXACT(VAR(VSHARD ", {'uri': 'b', 'offsets': '', 'count': 1}"), off_msg);
	INDEX_FAILS_EXACT(VAR(VSHARD ", {'uri': 'b', 'offsets': 7, 'count': 1}"), off_msg);
	INDEX_FAILS_EXACT(VAR(VSHARD ", {'uri': 'b', 'offsets': null, 'count': 1}"), off_msg);
	INDEX_FAILS_EXACT(FIXED(SHARD ", {'uri': 'b', 'offsets': 'b.off', 'count': 1}"),
			  "index.json: shards[1].offsets is only for variable records");
	INDEX_FAILS_EXACT(FIXED("{'uri': 'b', 'offsets': null, 'count': 1}"),
			  "index.json: shards[0].offsets is only for variable records");

	static const char *const empty_msg =
	    "index.json: \"shards\" hold no records (every count is 0)";
	INDEX_FAILS_EXACT(FIXED("{'uri': 'a', 'count': 0}"), empty_msg);
	INDEX_FAILS_EXACT(VAR("{'uri': 'a', 'offsets': 'o', 'count': 0}, "
			      "{'uri': 'b', 'offsets': 'o', 'count': 0}"),
			  empty_msg);
}

/* Random indexes with empty shards: locate finds the non-empty shard of every id. */
static void test_index_locate(void **state)
{
	(void)state;
	rng_state = 42;
	for (int run = 0; run < 300; run++) {
		char text[8192];
		int nshards = 1 + (int)rnd(24), len;
		int64_t counts[24], total = 0;
		int empty_pct = (int)rnd(80);

		len = snprintf(text, sizeof(text),
			       "{\"records\": \"fixed\", \"dtype\": \"int8\", \"shape\": [3], "
			       "\"shards\": [");
		for (int i = 0; i < nshards; i++) {
			counts[i] = rnd(100) < empty_pct ? 0 : 1 + rnd(rnd(2) ? 5 : 200);
			if (i == nshards - 1 && total == 0 && counts[i] == 0)
				counts[i] = 1;
			total += counts[i];
			len += snprintf(text + len, sizeof(text) - (size_t)len,
					"%s{\"uri\": \"s%d.bin\", \"count\": %" PRId64 "}",
					i ? ", " : "", i, counts[i]);
		}
		len += snprintf(text + len, sizeof(text) - (size_t)len, "]}");
		assert_true(len < (int)sizeof(text));

		struct ptc_index *ix = index_ok(text);
		int64_t first = 0;
		assert_int_equal(ix->nshards, nshards);
		assert_int_equal(ix->total, total);
		for (int i = 0; i < nshards; i++) {
			assert_int_equal(ix->shards[i].first, first);
			assert_int_equal(ix->shards[i].count, counts[i]);
			first += counts[i];
		}
		/* Every id, walking the shards alongside. */
		int want = 0;
		for (int64_t id = 0; id < total; id++) {
			int64_t local = -1;
			while (id >= ix->shards[want].first + ix->shards[want].count)
				want++;
			int s = ptc_index_locate(ix, id, &local);
			assert_int_equal(s, want);
			assert_true(ix->shards[s].count > 0);
			assert_true(local >= 0 && local < ix->shards[s].count);
			assert_int_equal(ix->shards[s].first + local, id);
		}
		/* And random ids. */
		for (int k = 0; k < 50; k++) {
			int64_t id = rnd(total), local = -1;
			int s = ptc_index_locate(ix, id, &local);
			assert_true(s >= 0 && s < nshards);
			assert_true(ix->shards[s].count > 0);
			assert_true(local >= 0 && local < ix->shards[s].count);
			assert_int_equal(ix->shards[s].first + local, id);
		}
		ptc_index_free(ix);
	}

	/* Huge shards: ids near 2^48. */
	struct ptc_index *ix =
	    index_ok(FIXED("{'uri': 'a', 'count': 0}, {'uri': 'b', 'count': 140737488355328}, "
			   "{'uri': 'c', 'count': 0}, {'uri': 'd', 'count': 140737488355328}, "
			   "{'uri': 'e', 'count': 0}"));
	int64_t local;
	assert_int_equal(ptc_index_locate(ix, 0, &local), 1);
	assert_int_equal(local, 0);
	assert_int_equal(ptc_index_locate(ix, ((int64_t)1 << 47) - 1, &local), 1);
	assert_int_equal(local, ((int64_t)1 << 47) - 1);
	assert_int_equal(ptc_index_locate(ix, (int64_t)1 << 47, &local), 3);
	assert_int_equal(local, 0);
	assert_int_equal(ptc_index_locate(ix, ((int64_t)1 << 48) - 1, &local), 3);
	assert_int_equal(local, ((int64_t)1 << 47) - 1);
	ptc_index_free(ix);
}

/* ---------------------------------------------------------- permutation */

/* ptc_data_perm(seed, epoch, n, ., true) is a bijection on [0, n). */
static void check_bijection(uint64_t seed, int64_t epoch, int64_t n)
{
	unsigned char *seen = calloc((size_t)n, 1);

	assert_non_null(seen);
	for (int64_t i = 0; i < n; i++) {
		int64_t p = ptc_data_perm(seed, epoch, n, i, true);
		if (p < 0 || p >= n || seen[p]) {
			print_error("seed %" PRIu64 " epoch %" PRId64 " n %" PRId64
				    ": perm(%" PRId64 ") = %" PRId64 "%s\n",
				    seed, epoch, n, i, p, p >= 0 && p < n ? " twice" : "");
			fail();
		}
		seen[p] = 1;
	}
	free(seen);
}

/* Positions where two orders of [0, n) agree. */
static int64_t agreements(uint64_t s1, int64_t e1, uint64_t s2, int64_t e2, int64_t n)
{
	int64_t same = 0;

	for (int64_t i = 0; i < n; i++)
		same += ptc_data_perm(s1, e1, n, i, true) == ptc_data_perm(s2, e2, n, i, true);
	return same;
}

static void test_perm_bijection(void **state)
{
	static const int64_t ns[] = {1, 2, 3, 4, 5, 16, 17, 64, 1000, 4097, 65536, 100003};
	static const uint64_t seeds[] = {0, 1, 1234, UINT64_MAX};
	static const int64_t epochs[] = {0, 1, 7, INT32_MAX};

	(void)state;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (size_t b = 0; b < sizeof(seeds) / sizeof(seeds[0]); b++)
			for (size_t e = 0; e < sizeof(epochs) / sizeof(epochs[0]); e++)
				check_bijection(seeds[b], epochs[e], ns[a]);
	/* Many small n and seeds. */
	rng_state = 7;
	for (int64_t n = 1; n <= 300; n++)
		for (int k = 0; k < 4; k++)
			check_bijection(rnd64(), rnd(10), n);
}

static void test_perm_properties(void **state)
{
	static const int64_t ns[] = {64, 1000, 4097, 100003};

	(void)state;
	/* n = 1: the only order. */
	assert_int_equal(ptc_data_perm(99, 3, 1, 0, true), 0);
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
		int64_t n = ns[a];

		/* Deterministic: the same arguments, the same record. */
		for (int64_t i = 0; i < n; i += 1 + n / 97)
			assert_int_equal(ptc_data_perm(1234, 2, n, i, true),
					 ptc_data_perm(1234, 2, n, i, true));
		/* Another epoch, another seed: another order (two random orders agree at
		 * about one position). */
		assert_true(agreements(1234, 0, 1234, 1, n) < n / 8);
		assert_true(agreements(1234, 1, 1234, 2, n) < n / 8);
		assert_true(agreements(1234, 0, 1235, 0, n) < n / 8);
		assert_true(agreements(0, 0, 1ull << 63, 0, n) < n / 8);
		/* Shuffled at all: few fixed points. */
		int64_t fixed = 0;
		for (int64_t i = 0; i < n; i++)
			fixed += ptc_data_perm(5, 0, n, i, true) == i;
		assert_true(fixed < n / 8);
		/* No shuffle: the identity, whatever seed and epoch. */
		for (int64_t i = 0; i < n; i++) {
			assert_int_equal(ptc_data_perm(1234, 0, n, i, false), i);
			assert_int_equal(ptc_data_perm(UINT64_MAX, 9, n, i, false), i);
		}
	}
	/* Known values pin the order down: the order is part of every saved job (a
	 * resumed run must see the records its checkpoint did), so it may not change. */
	assert_int_equal(ptc_data_perm(1234, 0, 1000, 0, true), 253);
	assert_int_equal(ptc_data_perm(1234, 0, 1000, 999, true), 397);
	assert_int_equal(ptc_data_perm(1234, 1, 1000, 0, true), 243);
	assert_int_equal(ptc_data_perm(0, 0, 100003, 5, true), 18245);

	/* Huge n: in range, distinct over a sample, no shift past 64 bits. */
	static const int64_t big[] = {((int64_t)1 << 48), ((int64_t)1 << 62) + 1, INT64_MAX};
	for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++) {
		int64_t prev = -1;
		for (int64_t i = 0; i < 1000; i++) {
			int64_t p = ptc_data_perm(77, 1, big[k], i, true);
			assert_true(p >= 0 && p < big[k]);
			assert_true(p != prev);
			prev = p;
		}
		int64_t p = ptc_data_perm(77, 1, big[k], big[k] - 1, true);
		assert_true(p >= 0 && p < big[k]);
	}
}

/* Over many seeds, where a given record lands and which record comes first
 * spread evenly over the epoch. Fixed seeds: not flaky. */
static void test_perm_uniform(void **state)
{
	enum { N = 16, SEEDS = 16000 };
	int64_t where0[N] = {0}, first[N] = {0}, last[N] = {0}, ordered = 0;

	(void)state;
	for (uint64_t seed = 0; seed < SEEDS; seed++) {
		for (int64_t i = 0; i < N; i++)
			if (ptc_data_perm(seed, 0, N, i, true) == 0)
				where0[i]++;
		first[ptc_data_perm(seed, 0, N, 0, true)]++;
		last[ptc_data_perm(seed, 3, N, N - 1, true)]++;
		ordered += ptc_data_perm(seed, 0, N, 1, true) > ptc_data_perm(seed, 0, N, 0, true);
	}
	/* Expected 1000 each; a binomial sd of about 31. */
	for (int i = 0; i < N; i++) {
		assert_in_range(where0[i], 850, 1150);
		assert_in_range(first[i], 850, 1150);
		assert_in_range(last[i], 850, 1150);
	}
	assert_in_range(ordered, SEEDS / 2 - 600, SEEDS / 2 + 600);

	/* A larger n over epochs of one seed: the first record, in 10 buckets. */
	int64_t buckets[10] = {0};
	for (int64_t e = 0; e < 50000; e++)
		buckets[ptc_data_perm(1234, e, 1000, 0, true) / 100]++;
	for (int i = 0; i < 10; i++)
		assert_in_range(buckets[i], 4500, 5500);
}

/* ----------------------------------------------------------------- cursor */

static void cursor_init(struct ptc_cursor *c, int64_t step, int64_t sample, int64_t batch, int dp)
{
	c->segs = malloc(sizeof(*c->segs));
	assert_non_null(c->segs);
	c->nsegs = 1;
	c->segs[0] = (struct ptc_cursor_seg){step, sample, batch, dp};
}

/*
 * Checks step @step of @c under @dp DP ranks: it consumes [@samples,
 * @samples + @batch), cut into @dp contiguous slices in rank order, the
 * first batch % dp one record larger.
 */
static void check_step(const struct ptc_cursor *c, int64_t step, int dp, int64_t samples,
		       int64_t batch)
{
	int64_t got_samples = -1, got_batch = -1, next = samples;

	assert_int_equal(ptc_cursor_samples(c, step, &got_samples, &got_batch), 0);
	assert_int_equal(got_samples, samples);
	assert_int_equal(got_batch, batch);
	assert_int_equal(ptc_cursor_dp(c, step), dp);
	for (int d = 0; d < dp; d++) {
		int64_t first = -1, count = -1;

		assert_int_equal(ptc_data_slice(c, step, dp, d, 0, &first, &count), 0);
		assert_int_equal(first, next);
		assert_int_equal(count, batch / dp + (d < batch % dp));
		assert_true(count >= 1);
		next += count;
	}
	assert_int_equal(next, samples + batch);
}

static void test_cursor_design_example(void **state)
{
	struct ptc_cursor c;
	int64_t first, count;

	(void)state;
	/* global_batch 64 on dp 2, then 96 on dp 3 from saved step 100. */
	cursor_init(&c, 0, 0, 64, 2);
	check_step(&c, 0, 2, 0, 64);
	check_step(&c, 99, 2, 99 * 64, 64);
	/* A run of 150 samples: step 2 (from 128) is cut to 22, step 3 has none. */
	assert_int_equal(ptc_data_slice(&c, 2, 2, 1, 150, &first, &count), 0);
	assert_int_equal(first, 139);
	assert_int_equal(count, 11);
	assert_int_equal(ptc_data_slice(&c, 1, 2, 1, 150, &first, &count), 0);
	assert_int_equal(count, 32);
	assert_int_equal(ptc_data_slice(&c, 3, 2, 0, 150, &first, &count), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, 2, 2, 0, 128, &first, &count), -ENODATA);
	assert_int_equal(ptc_cursor_advance(&c, 100, 96, 3), 0);
	assert_int_equal(c.nsegs, 2);
	assert_int_equal(ptc_cursor_dp(&c, 99), 2);
	assert_int_equal(ptc_cursor_dp(&c, 100), 3);
	check_step(&c, 99, 2, 99 * 64, 64);
	check_step(&c, 100, 3, 6400, 96);
	check_step(&c, 101, 3, 6496, 96);
	assert_int_equal(ptc_data_slice(&c, 101, 3, 2, 0, &first, &count), 0);
	assert_int_equal(first, 6496 + 64);
	assert_int_equal(count, 32);

	/* 10 on dp 4: 3, 3, 2, 2. */
	assert_int_equal(ptc_cursor_advance(&c, 102, 10, 4), 0);
	static const int64_t want[] = {3, 3, 2, 2};
	for (int d = 0; d < 4; d++) {
		assert_int_equal(ptc_data_slice(&c, 102, 4, d, 0, &first, &count), 0);
		assert_int_equal(count, want[d]);
	}
	check_step(&c, 103, 4, 6592 + 10, 10);

	/* The same batch and dp again: nothing new. Twice at one step: the last
	 * wins. Another dp alone makes a segment too. */
	assert_int_equal(ptc_cursor_advance(&c, 110, 10, 4), 0);
	assert_int_equal(c.nsegs, 3);
	assert_int_equal(ptc_cursor_advance(&c, 110, 7, 4), 0);
	assert_int_equal(ptc_cursor_advance(&c, 110, 9, 1), 0);
	assert_int_equal(c.nsegs, 4);
	assert_int_equal(ptc_cursor_dp(&c, 110), 1);
	assert_int_equal(ptc_cursor_advance(&c, 110, 10, 4), 0); /* back: merged */
	assert_int_equal(c.nsegs, 3);
	assert_int_equal(ptc_cursor_advance(&c, 108, 10, 2), 0);
	assert_int_equal(c.nsegs, 4);
	assert_int_equal(ptc_cursor_dp(&c, 107), 4);
	assert_int_equal(ptc_cursor_dp(&c, 108), 2);
	check_step(&c, 108, 2, 6592 + 60, 10);
	assert_int_equal(ptc_cursor_advance(&c, 110, 9, 1), 0);
	assert_int_equal(c.nsegs, 5);
	check_step(&c, 110, 1, 6592 + 80, 9);

	/* Resume from step 101 (saved before the 10s): later segments are gone. */
	assert_int_equal(ptc_cursor_advance(&c, 101, 96, 3), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 102, 3, 6592, 96);
	check_step(&c, 110, 3, 6592 + 8 * 96, 96);
	/* Resume at a segment's own step with another batch: it is replaced. */
	assert_int_equal(ptc_cursor_advance(&c, 100, 50, 2), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 100, 2, 6400, 50);
	/* Back to the start. */
	assert_int_equal(ptc_cursor_advance(&c, 0, 64, 8), 0);
	assert_int_equal(c.nsegs, 1);
	check_step(&c, 150, 8, 150 * 64, 64);
	free(c.segs);
}

static void test_cursor_errors(void **state)
{
	struct ptc_cursor c;
	int64_t samples = -7, batch = -7, first = -7, count = -7;

	(void)state;
	/* The first segment starts at step 5, sample 1000. */
	cursor_init(&c, 5, 1000, 3, 3);
	assert_int_equal(ptc_cursor_samples(&c, -1, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MIN, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, 4, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, 0, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, 4, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, -1, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(samples, -7);
	assert_int_equal(first, -7);
	check_step(&c, 5, 3, 1000, 3);

	/* Huge steps: -ENODATA, not a wrapped sample. */
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX / 2, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, INT64_MAX / 2, 2, 1, 0, &first, &count), -ENODATA);
	/* The largest reachable step still works; its batch ends at INT64_MAX at most. */
	int64_t last = 5 + (INT64_MAX - 1000) / 3 - 1;
	assert_int_equal(ptc_cursor_samples(&c, last, &samples, &batch), 0);
	assert_true(samples <= INT64_MAX - batch);
	check_step(&c, last, 3, samples, 3);
	assert_int_equal(ptc_cursor_samples(&c, last + 1, &samples, &batch), -ENODATA);

	/* Batch 1: step INT64_MAX / 2 is reachable; the very last step is not. */
	assert_int_equal(ptc_cursor_advance(&c, 5, 1, 1), 0);
	check_step(&c, INT64_MAX / 2, 1, INT64_MAX / 2 - 5 + 1000, 1);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX, &samples, &batch), -ENODATA);

	/* Bad advances leave the cursor as it was. */
	assert_int_equal(ptc_cursor_advance(&c, 5, 3, 3), 0);
	assert_int_equal(ptc_cursor_advance(&c, 10, 4, 4), 0);
	assert_int_equal(c.nsegs, 2);
	assert_int_equal(ptc_cursor_advance(&c, -1, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 4, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, INT64_MAX / 2, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, 0, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, -3, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 1, 0, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, 4, 0), -ERANGE);
	assert_int_equal(ptc_cursor_dp(&c, 4), 0);
	assert_int_equal(ptc_cursor_dp(&c, INT64_MAX), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 9, 3, 1012, 3);
	check_step(&c, 12, 4, 1015 + 8, 4);

	/* Bad DP ranks. */
	assert_int_equal(ptc_data_slice(&c, 12, 0, 0, 0, &first, &count), -EINVAL);
	assert_int_equal(ptc_data_slice(&c, 12, 4, 4, 0, &first, &count), -EINVAL);
	assert_int_equal(ptc_data_slice(&c, 12, 4, -1, 0, &first, &count), -EINVAL);
	free(c.segs);

	/* A cursor without segments has no steps. */
	struct ptc_cursor empty = {0, NULL};
	assert_int_equal(ptc_cursor_samples(&empty, 0, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&empty, 0, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(ptc_cursor_advance(&empty, 0, 1, 1), -ERANGE);
}

/* One simulated job (see test_cursor_property). */
struct sim {
	int64_t n, epochs, end; /* records; epoch limit (0: none); samples to train on */
	uint64_t seed;
	bool shuffle;
	struct ptc_cursor c;
	int64_t nsteps, cap;
	int64_t *samples, *batch; /* per step run, as the cursor gave them */
	int *dp;
};

static void sim_record(struct sim *s, int64_t step, int64_t samples, int64_t batch, int dp)
{
	if (step >= s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->samples = realloc(s->samples, (size_t)s->cap * sizeof(*s->samples));
		s->batch = realloc(s->batch, (size_t)s->cap * sizeof(*s->batch));
		s->dp = realloc(s->dp, (size_t)s->cap * sizeof(*s->dp));
		assert_true(s->samples && s->batch && s->dp);
	}
	s->samples[step] = samples;
	s->batch[step] = batch;
	s->dp[step] = dp;
	s->nsteps = step + 1;
}

/* Steps before @upto still give what they gave when they ran. */
static void sim_check_history(const struct sim *s, int64_t upto, int spot)
{
	if (upto <= 0)
		return;
	if (spot) {
		for (int k = 0; k < spot; k++) {
			int64_t st = rnd(upto);
			check_step(&s->c, st, s->dp[st], s->samples[st], s->batch[st]);
		}
		return;
	}
	for (int64_t st = 0; st < upto; st++)
		check_step(&s->c, st, s->dp[st], s->samples[st], s->batch[st]);
}

/* Replays every step with the final cursor, as the DP ranks read them: the
 * samples are 0, 1, 2, ... and each epoch holds every record exactly once. */
static void sim_check_stream(const struct sim *s)
{
	int64_t full = s->end / s->n, epochs = full + 1, next = 0;
	unsigned char *seen = calloc((size_t)(epochs * s->n), 1);

	assert_non_null(seen);
	for (int64_t st = 0; st < s->nsteps; st++) {
		for (int d = 0; d < s->dp[st]; d++) {
			int64_t first, count;

			assert_int_equal(ptc_data_slice(&s->c, st, s->dp[st], d, 0, &first, &count),
					 0);
			for (int64_t g = first; g < first + count; g++) {
				assert_int_equal(g, next);
				next++;
				if (g >= s->end)
					continue; /* past the last epoch: ENODATA to the reader */
				int64_t e = g / s->n;
				int64_t r = ptc_data_perm(s->seed, e, s->n, g % s->n, s->shuffle);
				assert_true(r >= 0 && r < s->n);
				assert_int_equal(seen[e * s->n + r], 0);
				seen[e * s->n + r] = 1;
			}
		}
	}
	assert_true(next >= s->end);
	for (int64_t i = 0; i < full * s->n; i++)
		assert_int_equal(seen[i], 1);
	free(seen);
}

static void random_config(int64_t n, int *dp, int64_t *batch)
{
	*dp = 1 + (int)rnd(8);
	switch (rnd(4)) {
	case 0:
	case 1: /* small: many steps an epoch */
		*batch = *dp + rnd(8);
		break;
	case 2: /* about an epoch: batches span epoch boundaries */
		*batch = *dp + rnd(n + n / 2);
		break;
	default: /* several epochs a step */
		*batch = *dp + rnd(4 * n);
		break;
	}
}

/*
 * Thousands of random jobs: a dataset of 1..500 records, an epoch limit or
 * none, configs with random dp and global_batch taking effect at random saved
 * steps, and resumes from earlier checkpoints (possibly with a new config).
 * At every step the DP slices tile the step's batch; steps run before a
 * reconfiguration keep their slices; over the whole job the stream is
 * 0, 1, 2, ... and each epoch is exactly one pass over the records.
 */
static void test_cursor_property(void **state)
{
	int64_t total_steps = 0, total_reconfigs = 0, total_resumes = 0, max_segs = 0;

	(void)state;
	rng_state = 2024;
	for (int run = 0; run < 4000; run++) {
		struct sim s = {0};
		int dp, resumes = 0, reconfig_odds = 2 + (int)rnd(30);
		int64_t batch, next = 0, step = 0;

		s.n = 1 + rnd(500);
		s.epochs = rnd(3) ? 1 + rnd(3) : 0;
		s.end = s.epochs ? s.epochs * s.n : 1 + rnd(3 * s.n + 1);
		s.seed = rnd64();
		s.shuffle = rnd(4) != 0;
		random_config(s.n, &dp, &batch);
		cursor_init(&s.c, 0, 0, batch, dp);

		while (next < s.end) {
			/* A resume from an earlier checkpoint, maybe under a new config. */
			if (step > 0 && resumes < 3 && rnd(40) == 0) {
				int64_t r = rnd(step + 1), old_batch;
				if (r < step) {
					dp = s.dp[r];
					old_batch = s.batch[r];
					next = s.samples[r];
				} else {
					old_batch = batch;
				}
				batch = old_batch;
				if (rnd(2))
					random_config(s.n, &dp, &batch);
				assert_int_equal(ptc_cursor_advance(&s.c, r, batch, dp), 0);
				step = r;
				s.nsteps = r;
				resumes++;
				total_resumes++;
				for (int k = 0; k < s.c.nsegs; k++)
					assert_true(s.c.segs[k].step <= r);
				sim_check_history(&s, r, 0);
			}
			/* A reconfiguration saved at this step (sometimes two in a row). */
			if (step > 0 && rnd(reconfig_odds) == 0) {
				int nsegs = s.c.nsegs, old_dp = dp;
				int64_t old = batch;
				for (int k = 1 + (rnd(4) == 0); k > 0; k--) {
					random_config(s.n, &dp, &batch);
					if (rnd(4) == 0)
						batch = old; /* another dp, same global_batch */
					batch = batch < dp ? dp : batch;
					assert_int_equal(ptc_cursor_advance(&s.c, step, batch, dp),
							 0);
				}
				assert_true(s.c.nsegs <= nsegs + 1);
				if (batch == old && dp == old_dp)
					assert_true(s.c.nsegs <= nsegs);
				total_reconfigs++;
				sim_check_history(&s, step, 4);
			}
			check_step(&s.c, step, dp, next, batch);
			sim_record(&s, step, next, batch, dp);
			next += batch;
			step++;
		}
		/* The first step past the data is where an epoch-limited job stops. */
		int64_t after = -1, b = -1;
		assert_int_equal(ptc_cursor_samples(&s.c, step, &after, &b), 0);
		assert_true(after >= s.end);
		assert_true(s.c.nsegs >= 1 && s.c.segs[0].step == 0);
		for (int k = 1; k < s.c.nsegs; k++) { /* by step; each changes something */
			assert_true(s.c.segs[k].step > s.c.segs[k - 1].step);
			assert_true(s.c.segs[k].batch != s.c.segs[k - 1].batch ||
				    s.c.segs[k].dp != s.c.segs[k - 1].dp);
		}

		sim_check_history(&s, s.nsteps, 0);
		sim_check_stream(&s);
		total_steps += s.nsteps;
		max_segs = s.c.nsegs > max_segs ? s.c.nsegs : max_segs;
		free(s.c.segs);
		free(s.samples);
		free(s.batch);
		free(s.dp);
	}
	/* The generator did exercise what it is meant to. */
	assert_true(total_steps > 40000);
	assert_true(total_reconfigs > 3000);
	assert_true(total_resumes > 1000);
	assert_true(max_segs > 10);
}

/* ------------------------------------------------------ config and change */

UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)

#define CONFIG_FAILS_EXACT(text, msg) config_fails_at(__FILE__, __LINE__, text, msg, NULL)
#define CONFIG_FAILS(text, ...)	      config_fails_at(__FILE__, __LINE__, text, NULL, __VA_ARGS__, NULL)

/* A config of @dp DP ranks with a dataset of @fields. */
#define DSCFG(dp, fields)                                                                          \
	"{'version': 1, 'tp': 1, 'pp': 1, 'dp': " dp ", 'nodes': ['n0'], 'dataset': {" fields "}}"

static void test_config_epochs(void **state)
{
	struct ptc_config *c;

	(void)state;
	c = config_ok(DSCFG("2", "'index': 'file:///i.json', 'global_batch': 8"));
	assert_int_equal(c->dataset_epochs, 0);
	ptc_config_free(c);
	c = config_ok(DSCFG("2", "'index': 'file:///i.json', 'global_batch': 8, 'epochs': 3"));
	assert_int_equal(c->dataset_epochs, 3);
	ptc_config_free(c);
	c = config_ok(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': 2147483647"));
	assert_int_equal(c->dataset_epochs, INT32_MAX);
	ptc_config_free(c);

	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': 0"),
			   "config.json: dataset.epochs = 0 is out of range [1, 2147483647]");
	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': -1"),
			   "config.json: dataset.epochs = -1 is out of range [1, 2147483647]");
	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': 2147483648"),
			   "config.json: dataset.epochs = 2147483648 is out of range [1, "
			   "2147483647]");
	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': '3'"),
			   "config.json: dataset.epochs must be an integer");
	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': null"),
			   "config.json: dataset.epochs must be an integer");
	CONFIG_FAILS_EXACT(DSCFG("2", "'index': 'i', 'global_batch': 8, 'epochs': 1.0"),
			   "config.json: dataset.epochs must be an integer");
}

static void test_config_batch_vs_dp(void **state)
{
	struct ptc_config *c;

	(void)state;
	CONFIG_FAILS(DSCFG("4", "'index': 'i', 'global_batch': 3"), "dataset.global_batch = 3",
		     "dp = 4");
	CONFIG_FAILS(DSCFG("64", "'index': 'i', 'global_batch': 1"), "dataset.global_batch = 1",
		     "dp = 64");
	c = config_ok(DSCFG("4", "'index': 'i', 'global_batch': 4"));
	assert_int_equal(c->dataset_global_batch, 4);
	ptc_config_free(c);
	/* No dataset: no batch to check. */
	c = config_ok("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 64, 'nodes': ['n0']}");
	assert_false(c->has_dataset);
	ptc_config_free(c);
}

static void test_config_epochs_round_trip(void **state)
{
	static const char *const texts[] = {
	    DSCFG("2", "'index': 'file:///i.json', 'seed': 7, 'global_batch': 8, 'epochs': 3"),
	    DSCFG("2", "'index': 'file:///i.json', 'global_batch': 8, 'shuffle': false"),
	    DSCFG("1", "'index': 'i', 'global_batch': 1, 'epochs': 2147483647"),
	};

	(void)state;
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		struct ptc_config *a = config_ok(texts[i]), *b = NULL;
		struct ptc_error err = {.text = ""};
		json_t *j = ptc_config_to_json(a);
		json_t *ds = json_object_get(j, "dataset");

		assert_non_null(ds);
		if (a->dataset_epochs)
			assert_int_equal(json_integer_value(json_object_get(ds, "epochs")),
					 a->dataset_epochs);
		else
			assert_null(json_object_get(ds, "epochs")); /* no limit: omitted */
		assert_int_equal(ptc_config_parse(j, "config.json", &b, &err), 0);
		assert_int_equal(b->dataset_epochs, a->dataset_epochs);
		assert_int_equal(b->dataset_seed, a->dataset_seed);
		assert_int_equal(b->dataset_global_batch, a->dataset_global_batch);
		assert_int_equal(b->dataset_shuffle, a->dataset_shuffle);
		assert_string_equal(b->dataset_index, a->dataset_index);
		assert_int_equal(ptc_dataset_change_ok(a, b, "config.json", &err), 0);
		json_decref(j);
		ptc_config_free(a);
		ptc_config_free(b);
	}
}

static void change_fails(const char *a_text, const char *b_text, const char *field)
{
	struct ptc_config *a = config_ok(a_text), *b = config_ok(b_text);
	struct ptc_error err = {.text = ""};
	int rc = ptc_dataset_change_ok(a, b, "config.json", &err);

	if (rc != -EINVAL || strncmp(err.text, "config.json: ", 13) != 0 ||
	    !strstr(err.text, field) || !strstr(err.text, "may not change")) {
		print_error("rc %d, message \"%s\" (want %s)\n", rc, err.text, field);
		fail();
	}
	ptc_config_free(a);
	ptc_config_free(b);
}

static void change_ok(const char *a_text, const char *b_text)
{
	struct ptc_config *a = config_ok(a_text), *b = config_ok(b_text);
	struct ptc_error err = {.text = ""};

	assert_int_equal(ptc_dataset_change_ok(a, b, "config.json", &err), 0);
	assert_int_equal(ptc_dataset_change_ok(b, a, "config.json", &err), 0);
	ptc_config_free(a);
	ptc_config_free(b);
}

static void test_dataset_change(void **state)
{
	const char *base = DSCFG("2", "'index': 'file:///i.json', 'seed': 1, 'global_batch': 8, "
				      "'shuffle': true, 'epochs': 3");

	(void)state;
	change_fails(base,
		     DSCFG("2", "'index': 'file:///j.json', 'seed': 1, 'global_batch': 8, "
				"'shuffle': true, 'epochs': 3"),
		     "dataset.index");
	change_fails(base,
		     DSCFG("2", "'index': 'file:///i.json', 'seed': 2, 'global_batch': 8, "
				"'shuffle': true, 'epochs': 3"),
		     "dataset.seed");
	change_fails(base,
		     DSCFG("2", "'index': 'file:///i.json', 'seed': 1, 'global_batch': 8, "
				"'shuffle': false, 'epochs': 3"),
		     "dataset.shuffle");
	change_fails(base,
		     DSCFG("2", "'index': 'file:///i.json', 'seed': 1, 'global_batch': 8, "
				"'shuffle': true, 'epochs': 4"),
		     "dataset.epochs");
	/* Defaults count as values: no epochs is not 3 epochs, no seed is seed 0. */
	change_fails(base,
		     DSCFG("2", "'index': 'file:///i.json', 'seed': 1, 'global_batch': 8, "
				"'shuffle': true"),
		     "dataset.epochs");
	change_fails(DSCFG("2", "'index': 'i', 'global_batch': 8"),
		     DSCFG("2", "'index': 'i', 'seed': 5, 'global_batch': 8"), "dataset.seed");
	change_fails(DSCFG("2", "'index': 'i', 'global_batch': 8"),
		     DSCFG("2", "'index': 'i', 'global_batch': 8, 'shuffle': false"),
		     "dataset.shuffle");

	/* global_batch and dp may change; the defaults written out are the same. */
	change_ok(base, DSCFG("4", "'index': 'file:///i.json', 'seed': 1, 'global_batch': 96, "
				   "'shuffle': true, 'epochs': 3"));
	change_ok(DSCFG("2", "'index': 'i', 'global_batch': 8"),
		  DSCFG("8", "'index': 'i', 'seed': 0, 'global_batch': 8, 'shuffle': true"));
	change_ok(base, base);
	/* Configs without a dataset. */
	change_ok(base, "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0']}");
	change_ok("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0']}",
		  "{'version': 2, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_index_fixed),
	    cmocka_unit_test(test_index_variable),
	    cmocka_unit_test(test_index_errors_top),
	    cmocka_unit_test(test_index_errors_shape),
	    cmocka_unit_test(test_index_errors_shards),
	    cmocka_unit_test(test_index_locate),
	    cmocka_unit_test(test_perm_bijection),
	    cmocka_unit_test(test_perm_properties),
	    cmocka_unit_test(test_perm_uniform),
	    cmocka_unit_test(test_cursor_design_example),
	    cmocka_unit_test(test_cursor_errors),
	    cmocka_unit_test(test_cursor_property),
	    cmocka_unit_test(test_config_epochs),
	    cmocka_unit_test(test_config_batch_vs_dp),
	    cmocka_unit_test(test_config_epochs_round_trip),
	    cmocka_unit_test(test_dataset_change),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
