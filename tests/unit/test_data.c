/*
 * test_data.c - the dataset: index.json parsing, ptc_index_locate,
 * ptc_dataset_change_ok and the dataset fields of config.json.
 * test_data_cursor.c has the per-epoch permutation and the cursor.
 */
#include <inttypes.h>

#include "tests/unit/data_fixture.h"

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
	    cmocka_unit_test(test_config_epochs),
	    cmocka_unit_test(test_config_batch_vs_dp),
	    cmocka_unit_test(test_config_epochs_round_trip),
	    cmocka_unit_test(test_dataset_change),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
