/*
 * test_config.c - config.json and cluster.json parsing, ptc_config_to_json.
 */
#include "tests/unit/unit.h"

UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)
UNIT_PARSER(cluster, struct ptc_cluster, "cluster.json", ptc_cluster_parse_text, ptc_cluster_free)

#define CONFIG_FAILS_EXACT(text, msg)  config_fails_at(__FILE__, __LINE__, text, msg, NULL)
#define CONFIG_FAILS(text, ...)	       config_fails_at(__FILE__, __LINE__, text, NULL, __VA_ARGS__, NULL)
#define CLUSTER_FAILS_EXACT(text, msg) cluster_fails_at(__FILE__, __LINE__, text, msg, NULL)
#define CLUSTER_FAILS(text, ...)       cluster_fails_at(__FILE__, __LINE__, text, NULL, __VA_ARGS__, NULL)

/* A config with everything but the dataset; DS(x) appends a dataset. */
#define CFG(fields) "{'version': 2, 'tp': 2, 'pp': 2, 'dp': 2, 'nodes': ['n0', 'n1']" fields "}"
#define DS(fields)  CFG(", 'dataset': {" fields "}")

/* ---------------------------------------------------------- config errors */

static void test_config_bad_json(void **state)
{
	(void)state;
	CONFIG_FAILS("{'version': 2,\n 'tp': 2,,}",
		     "config.json: invalid JSON at line 2 column 10");
	CONFIG_FAILS("", "config.json: invalid JSON at line 1 column 0");
	CONFIG_FAILS("{'tp': 1, 'tp': 2}", "invalid JSON", "duplicate object key");
}

static void test_config_not_object(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT("[]", "config.json: must be a JSON object");
}

static void test_config_unknown_field(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT(CFG(", 'ep': 2"), "config.json: unknown field \"ep\"");
}

static void test_config_version(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT("{'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
			   "config.json: \"version\" is missing");
	CONFIG_FAILS_EXACT("{'version': '2', 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
			   "config.json: \"version\" must be an integer");
	CONFIG_FAILS_EXACT("{'version': -1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
			   "config.json: \"version\" = -1 is out of range [0, "
			   "9223372036854775807]");
	/* Out of jansson's integer range: a JSON error, not a wrapped value. */
	CONFIG_FAILS("{'version': 9223372036854775808, 'tp': 1, 'pp': 1, 'dp': 1, "
		     "'nodes': ['n0']}",
		     "invalid JSON", "too big");
}

static void test_config_degrees(void **state)
{
	static const char *const keys[] = {"tp", "pp", "dp"};

	(void)state;
	for (int i = 0; i < 3; i++) {
		char text[256], msg[128];
		const char *vals[3] = {"1", "1", "1"};

		/* missing */
		snprintf(text, sizeof(text), "{'version': 1, %s%s%s 'nodes': ['n0']}",
			 i == 0 ? "" : "'tp': 1,", i == 1 ? "" : "'pp': 1,",
			 i == 2 ? "" : "'dp': 1,");
		snprintf(msg, sizeof(msg), "config.json: \"%s\" is missing", keys[i]);
		CONFIG_FAILS_EXACT(text, msg);

		/* zero, negative, too large, not an integer */
		static const char *const bad[] = {"0", "-2", "65537", "2.0", "'2'", "null"};
		static const char *const why[] = {"= 0 is out of range [1, 65536]",
						  "= -2 is out of range [1, 65536]",
						  "= 65537 is out of range [1, 65536]",
						  "must be an integer",
						  "must be an integer",
						  "must be an integer"};
		for (int b = 0; b < 6; b++) {
			vals[i] = bad[b];
			snprintf(text, sizeof(text),
				 "{'version': 1, 'tp': %s, 'pp': %s, 'dp': %s, 'nodes': ['n0']}",
				 vals[0], vals[1], vals[2]);
			snprintf(msg, sizeof(msg), "config.json: \"%s\" %s", keys[i], why[b]);
			CONFIG_FAILS_EXACT(text, msg);
		}
	}
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 256, 'pp': 16, 'dp': 32, 'nodes': ['n0']}",
			   "config.json: tp * pp * dp = 131072 exceeds 65536 ranks");
	/* A product that would wrap 32 bits. */
	CONFIG_FAILS("{'version': 1, 'tp': 65536, 'pp': 65536, 'dp': 65536, 'nodes': ['n0']}",
		     "tp * pp * dp = 281474976710656 exceeds 65536 ranks");
}

static void test_config_replicas(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT(CFG(", 'replicas': 2"),
			   "config.json: \"replicas\" = 2 is out of range [0, 1]");
	CONFIG_FAILS_EXACT(CFG(", 'replicas': -1"),
			   "config.json: \"replicas\" = -1 is out of range [0, 1]");
	CONFIG_FAILS_EXACT(CFG(", 'replicas': true"),
			   "config.json: \"replicas\" must be an integer");
}

static void test_config_snapshot(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': 3"), "config.json: \"snapshot\" must be an object");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': 'rel', 'every': 1}"),
			   "config.json: snapshot.dir must be an absolute path (a directory every "
			   "node of the job can reach)");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': '/s'}"),
			   "config.json: snapshot.every is missing");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': '/s', 'every': 0}"),
			   "config.json: snapshot.every = 0 is out of range [1, 2147483647]");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': '/s', 'every': 2, 'keep': 0}"),
			   "config.json: snapshot.keep = 0 is out of range [1, 1000]");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': '/s', 'every': 2, 'level': 20}"),
			   "config.json: snapshot.level = 20 is out of range [-7, 19]");
	CONFIG_FAILS_EXACT(CFG(", 'snapshot': {'dir': '/s', 'every': 2, 'often': 1}"),
			   "config.json: snapshot has unknown field \"often\"");

	struct ptc_config *c =
	    config_ok(CFG(", 'snapshot': {'dir': '/shared/snap', 'every': 100}"));
	assert_string_equal(c->snap_dir, "/shared/snap");
	assert_int_equal(c->snap_every, 100);
	assert_int_equal(c->snap_keep, 2); /* the defaults */
	assert_int_equal(c->snap_threads, 1);
	assert_int_equal(c->snap_max_mib_s, 0);
	assert_int_equal(c->snap_level, 1);
	ptc_config_free(c);
}

static void test_config_nodes(void **state)
{
	static const char *const msg =
	    "config.json: \"nodes\" must be a non-empty array of node ids";

	(void)state;
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1}", msg);
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': []}", msg);
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': 'n0'}", msg);
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': {'n0': 1}}", msg);
}

static void test_config_node_ids(void **state)
{
	static const char *const bad[] = {
	    "3", "null", "''", "'a/b'", "'..'", "'.'", "'n 0'", "'n0\\n'", "'{L}'",
	    /* 65 characters */
	    "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'"};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text),
			 "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0', %s]}", bad[i]);
		CONFIG_FAILS_EXACT(text, "config.json: nodes[1] is not a valid node id");
	}
	CONFIG_FAILS_EXACT("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0', 'n1', 'n0']}",
			   "config.json: nodes[2] = \"n0\" is listed twice");
}

static void test_config_dataset(void **state)
{
	(void)state;
	CONFIG_FAILS_EXACT(CFG(", 'dataset': 'file:///x'"),
			   "config.json: \"dataset\" must be an object");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json', 'global_batch': 8, 'epoch': 1"),
			   "config.json: dataset has unknown field \"epoch\"");
	CONFIG_FAILS_EXACT(DS("'global_batch': 8"),
			   "config.json: dataset.index must be a non-empty URI string");
	CONFIG_FAILS_EXACT(DS("'index': '', 'global_batch': 8"),
			   "config.json: dataset.index must be a non-empty URI string");
	CONFIG_FAILS_EXACT(DS("'index': 7, 'global_batch': 8"),
			   "config.json: dataset.index must be a non-empty URI string");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json', 'seed': -1, 'global_batch': 8"),
			   "config.json: dataset.seed = -1 is out of range [0, "
			   "9223372036854775807]");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json', 'seed': '1', 'global_batch': 8"),
			   "config.json: dataset.seed must be an integer");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json'"),
			   "config.json: dataset.global_batch is missing");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json', 'global_batch': 0"),
			   "config.json: dataset.global_batch = 0 is out of range [1, 1073741824]");
	CONFIG_FAILS(DS("'index': 'file:///i.json', 'global_batch': 1073741825"),
		     "dataset.global_batch = 1073741825", "out of range");
	CONFIG_FAILS(DS("'index': 'file:///i.json', 'global_batch': 8.5"), "dataset.global_batch",
		     "must be an integer");
	CONFIG_FAILS_EXACT(DS("'index': 'file:///i.json', 'global_batch': 8, 'shuffle': 1"),
			   "config.json: dataset.shuffle must be true or false");
}

/* ------------------------------------------------------- config successes */

static void test_config_design_example(void **state)
{
	struct ptc_config *c = config_ok("{\n  'version': 2,\n  'tp': 2, 'pp': 2, 'dp': 2,\n"
					 "  'nodes': ['n0', 'n1'],\n"
					 "  'dataset': {'index': 'file:///data/train/index.json',"
					 " 'seed': 1234,\n   'global_batch': 64}\n}");

	(void)state;
	assert_int_equal(c->version, 2);
	assert_int_equal(c->tp, 2);
	assert_int_equal(c->pp, 2);
	assert_int_equal(c->dp, 2);
	assert_int_equal(c->nnodes, 2);
	assert_string_equal(c->nodes[0], "n0");
	assert_string_equal(c->nodes[1], "n1");
	assert_int_equal(c->replicas, 0);
	assert_true(c->has_dataset);
	assert_string_equal(c->dataset_index, "file:///data/train/index.json");
	assert_int_equal(c->dataset_seed, 1234);
	assert_int_equal(c->dataset_global_batch, 64);
	assert_true(c->dataset_shuffle);
	ptc_config_free(c);
	ptc_config_free(NULL);
}

static void test_config_minimal(void **state)
{
	struct ptc_config *c = config_ok("{'version': 0, 'tp': 1, 'pp': 1, 'dp': 1, "
					 "'nodes': ['node-7.a_B']}");

	(void)state;
	assert_int_equal(c->version, 0);
	assert_int_equal(c->nnodes, 1);
	assert_string_equal(c->nodes[0], "node-7.a_B");
	assert_false(c->has_dataset);
	assert_null(c->dataset_index);
	ptc_config_free(c);

	/* Limits are inclusive; a 64-character id is fine. */
	c = config_ok("{'version': 9223372036854775807, 'tp': 65536, 'pp': 1, 'dp': 1, "
		      "'replicas': 1, 'nodes': "
		      "['aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'], "
		      "'dataset': {'index': 'https://h/i.json', 'seed': 0, 'global_batch': "
		      "1073741824, 'shuffle': false}}");
	assert_int_equal(c->version, INT64_MAX);
	assert_int_equal(c->tp, 65536);
	assert_int_equal(c->replicas, 1);
	assert_int_equal(strlen(c->nodes[0]), 64);
	assert_int_equal(c->dataset_seed, 0);
	assert_int_equal(c->dataset_global_batch, 1 << 30);
	assert_false(c->dataset_shuffle);
	ptc_config_free(c);
}

/* Parses @text, serializes it and parses the result: same fields. */
static void round_trip(const char *text)
{
	struct ptc_config *a = config_ok(text), *b = NULL;
	struct ptc_error err = {.text = ""};
	json_t *j = ptc_config_to_json(a);

	assert_non_null(j);
	assert_int_equal(ptc_config_parse(j, "config.json", &b, &err), 0);
	assert_int_equal(a->version, b->version);
	assert_int_equal(a->tp, b->tp);
	assert_int_equal(a->pp, b->pp);
	assert_int_equal(a->dp, b->dp);
	assert_int_equal(a->replicas, b->replicas);
	assert_int_equal(a->nnodes, b->nnodes);
	for (int i = 0; i < a->nnodes; i++)
		assert_string_equal(a->nodes[i], b->nodes[i]);
	assert_int_equal(a->has_dataset, b->has_dataset);
	if (a->has_dataset) {
		assert_string_equal(a->dataset_index, b->dataset_index);
		assert_int_equal(a->dataset_seed, b->dataset_seed);
		assert_int_equal(a->dataset_global_batch, b->dataset_global_batch);
		assert_int_equal(a->dataset_shuffle, b->dataset_shuffle);
	}
	assert_int_equal(!a->snap_dir, !b->snap_dir);
	if (a->snap_dir) {
		assert_string_equal(a->snap_dir, b->snap_dir);
		assert_int_equal(a->snap_every, b->snap_every);
		assert_int_equal(a->snap_keep, b->snap_keep);
		assert_int_equal(a->snap_threads, b->snap_threads);
		assert_int_equal(a->snap_max_mib_s, b->snap_max_mib_s);
		assert_int_equal(a->snap_level, b->snap_level);
	}

	/* And the serialized text parses back to the same JSON. */
	char *dump = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	json_t *k = json_loads(dump, 0, NULL);
	assert_non_null(k);
	assert_true(json_equal(j, k));
	json_decref(k);
	free(dump);
	json_decref(j);
	ptc_config_free(a);
	ptc_config_free(b);
}

static void test_config_to_json(void **state)
{
	(void)state;
	round_trip("{'version': 7, 'tp': 4, 'pp': 2, 'dp': 3, 'replicas': 1, "
		   "'nodes': ['c', 'a', 'b'], 'dataset': {'index': 'file:///d/index.json', "
		   "'seed': 9223372036854775807, 'global_batch': 96, 'shuffle': false}}");
	round_trip("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}");
	round_trip("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'], 'snapshot': "
		   "{'dir': '/s', 'every': 5, 'keep': 3, 'threads': 2, 'max_mib_s': 100, "
		   "'level': 3}}");

	/* The exact JSON of a full config: the input itself, all fields explicit. */
	const char *full = "{'version': 3, 'tp': 2, 'pp': 1, 'dp': 4, 'nodes': ['n1', 'n0'], "
			   "'replicas': 1, 'dataset': {'index': 'http://x/i.json', 'seed': 5, "
			   "'global_batch': 16, 'shuffle': true}}";
	char *text = unit_json(full);
	json_t *in = json_loads(text, 0, NULL), *out;
	struct ptc_config *c = config_ok(full);
	out = ptc_config_to_json(c);
	assert_true(json_equal(in, out));
	json_decref(out);
	ptc_config_free(c);

	/* Defaults are written out: replicas 0 is omitted, seed and shuffle are explicit. */
	c = config_ok(DS("'index': 'file:///i', 'global_batch': 2"));
	out = ptc_config_to_json(c);
	assert_null(json_object_get(out, "replicas"));
	json_t *ds = json_object_get(out, "dataset");
	assert_int_equal(json_integer_value(json_object_get(ds, "seed")), 0);
	assert_true(json_is_true(json_object_get(ds, "shuffle")));
	json_decref(out);
	ptc_config_free(c);
	json_decref(in);
	free(text);
}

/* --------------------------------------------------------- cluster errors */

static void test_cluster_errors_top(void **state)
{
	(void)state;
	CLUSTER_FAILS("{'nodes': [", "cluster.json: invalid JSON at line 1 column");
	CLUSTER_FAILS_EXACT("[{'id': 'n0', 'devices': 1}]", "cluster.json: must be a JSON object");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1}], 'token': 'x'}",
			    "cluster.json: unknown field \"token\"");
	CLUSTER_FAILS_EXACT("{}", "cluster.json: \"nodes\" must be a non-empty array");
	CLUSTER_FAILS_EXACT("{'nodes': []}", "cluster.json: \"nodes\" must be a non-empty array");
	CLUSTER_FAILS_EXACT("{'nodes': {'id': 'n0'}}",
			    "cluster.json: \"nodes\" must be a non-empty array");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1}], 'token_file': ''}",
			    "cluster.json: \"token_file\" must be a non-empty path");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1}], 'token_file': 1}",
			    "cluster.json: \"token_file\" must be a non-empty path");
}

static void test_cluster_errors_node(void **state)
{
	(void)state;
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1}, 'n1']}",
			    "cluster.json: nodes[1] must be an object");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1, 'gpus': 2}]}",
			    "cluster.json: nodes[0] has unknown field \"gpus\"");
	CLUSTER_FAILS_EXACT("{'nodes': [{'devices': 1}]}",
			    "cluster.json: nodes[0].id must be a node id of [A-Za-z0-9_.-]");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'a/b', 'devices': 1}]}",
			    "cluster.json: nodes[0].id must be a node id of [A-Za-z0-9_.-]");
	CLUSTER_FAILS("{'nodes': [{'id': '..', 'devices': 1}]}", "nodes[0].id must be a node id");
	CLUSTER_FAILS("{'nodes': [{'id': 5, 'devices': 1}]}", "nodes[0].id must be a node id");
	CLUSTER_FAILS("{'nodes': [{'id': 'n0', 'devices': 1}, {'id': 'n0:1', 'devices': 1}]}",
		      "nodes[1].id must be a node id");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 1}, {'id': 'n1', 'devices': 1}, "
			    "{'id': 'n0', 'devices': 2}]}",
			    "cluster.json: nodes[2].id = \"n0\" is listed twice");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'addr': '10.0.0.5', 'devices': 1}]}",
			    "cluster.json: nodes[0].addr must be \"host:port\"");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'addr': 7070, 'devices': 1}]}",
			    "cluster.json: nodes[0].addr must be \"host:port\"");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0'}]}",
			    "cluster.json: nodes[0].devices is missing");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': 0}]}",
			    "cluster.json: nodes[0].devices = 0 is out of range [1, 4096]");
	CLUSTER_FAILS("{'nodes': [{'id': 'n0', 'devices': 4097}]}", "nodes[0].devices = 4097",
		      "out of range");
	CLUSTER_FAILS_EXACT("{'nodes': [{'id': 'n0', 'devices': '4'}]}",
			    "cluster.json: nodes[0].devices must be an integer");
}

/* ------------------------------------------------------ cluster successes */

static void test_cluster_ok(void **state)
{
	struct ptc_cluster *c = NULL;
	struct ptc_error err = {.text = ""};

	(void)state;
	assert_int_equal(parse_cluster("{'nodes': [{'id': 'n0', 'addr': '10.0.0.5:7070', "
				       "'devices': 4}, {'id': 'n1', 'devices': 4096}], "
				       "'token_file': '/etc/mlfs/token'}",
				       &c, &err),
			 0);
	assert_int_equal(c->nnodes, 2);
	assert_string_equal(c->nodes[0].id, "n0");
	assert_string_equal(c->nodes[0].addr, "10.0.0.5:7070");
	assert_int_equal(c->nodes[0].devices, 4);
	assert_string_equal(c->nodes[1].id, "n1");
	assert_null(c->nodes[1].addr);
	assert_int_equal(c->nodes[1].devices, 4096);
	assert_string_equal(c->token_file, "/etc/mlfs/token");
	assert_int_equal(ptc_cluster_find(c, "n1"), 1);
	assert_int_equal(ptc_cluster_find(c, "n0"), 0);
	assert_int_equal(ptc_cluster_find(c, "n2"), -1);
	assert_int_equal(ptc_cluster_find(c, "n"), -1);
	ptc_cluster_free(c);
	ptc_cluster_free(NULL);

	assert_int_equal(parse_cluster("{'nodes': [{'id': 'x', 'devices': 1}]}", &c, &err), 0);
	assert_null(c->token_file);
	ptc_cluster_free(c);
}

/* "etcd": one member's URL, several separated by commas, or an array of
 * them; kept as one comma-separated string (net_etcd_new's). */
static void test_cluster_etcd_members(void **state)
{
	static const struct {
		const char *text, *want;
	} ok[] = {
	    {"'http://e:1'", "http://e:1"},
	    {"'http://e1:2379,https://e2:2379,http://10.0.0.3:2379'",
	     "http://e1:2379,https://e2:2379,http://10.0.0.3:2379"},
	    {"['http://e1:2379', 'http://e2:2379']", "http://e1:2379,http://e2:2379"},
	    {"['https://e:1']", "https://e:1"},
	};
	char text[512];

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct ptc_cluster *c = NULL;
		struct ptc_error err = {.text = ""};
		snprintf(text, sizeof(text),
			 "{'job': 'j', 'etcd': %s, 'nodes': [{'id': 'n0', 'devices': 1}]}",
			 ok[i].text);
		int rc = parse_cluster(text, &c, &err);
		if (rc)
			print_error("%s: %s\n", ok[i].text, err.text);
		assert_int_equal(rc, 0);
		assert_string_equal(c->etcd, ok[i].want);
		ptc_cluster_free(c);
	}
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': 'e:2379', 'nodes': [{'id': 'n0', 'devices': 1}]}",
			    "cluster.json: \"etcd\" = \"e:2379\" must be an http:// or https:// "
			    "URL (an etcd member's client URL)");
	/* a space after the comma is part of the next URL: named */
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': 'http://a:1, http://b:1', 'nodes': [{'id': "
			    "'n0', 'devices': 1}]}",
			    "cluster.json: \"etcd\" = \" http://b:1\" must be an http:// or "
			    "https:// URL (an etcd member's client URL)");
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': 'http://a:1,', 'nodes': [{'id': 'n0', "
			    "'devices': 1}]}",
			    "cluster.json: \"etcd\" = \"\" must be an http:// or https:// URL "
			    "(an etcd member's client URL)");
	CLUSTER_FAILS_EXACT(
	    "{'job': 'j', 'etcd': ['http://a:1', 'ftp://b'], 'nodes': [{'id': "
	    "'n0', 'devices': 1}]}",
	    "cluster.json: \"etcd\"[1] = \"ftp://b\" must be an http:// or https:// "
	    "URL (an etcd member's client URL)");
	CLUSTER_FAILS_EXACT(
	    "{'job': 'j', 'etcd': ['http://a:1,http://b:1'], 'nodes': [{'id': "
	    "'n0', 'devices': 1}]}",
	    "cluster.json: \"etcd\"[0] = \"http://a:1,http://b:1\" must be an http:// "
	    "or https:// URL (an etcd member's client URL)");
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': ['http://a:1', 2], 'nodes': [{'id': 'n0', "
			    "'devices': 1}]}",
			    "cluster.json: \"etcd\"[1] must be a string");
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': [], 'nodes': [{'id': 'n0', 'devices': 1}]}",
			    "cluster.json: \"etcd\" must list 1 to 16 members' URLs, not 0");
	CLUSTER_FAILS_EXACT("{'job': 'j', 'etcd': 7, 'nodes': [{'id': 'n0', 'devices': 1}]}",
			    "cluster.json: \"etcd\" must be an etcd member's http:// or https:// "
			    "URL, several separated by commas, or an array of them");
	CLUSTER_FAILS_EXACT("{'etcd': ['http://a:1'], 'nodes': [{'id': 'n0', 'devices': 1}]}",
			    "cluster.json: \"etcd\" needs a \"job\" (its keys live under "
			    "/mlfs/<job>/)");
	/* 17 members */
	char many[1024] = "{'job': 'j', 'etcd': '";
	for (int i = 0; i < 17; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%shttp://e%d:1",
			 i ? "," : "", i);
	snprintf(many + strlen(many), sizeof(many) - strlen(many),
		 "', 'nodes': [{'id': 'n0', 'devices': 1}]}");
	CLUSTER_FAILS_EXACT(many, "cluster.json: \"etcd\" must list 1 to 16 members' URLs, not 17");
}

static void test_cluster_uniform(void **state)
{
	char *const ids[] = {"a", "b", "c"};
	struct ptc_cluster *c = ptc_cluster_new_uniform(3, ids, 8);

	(void)state;
	assert_non_null(c);
	assert_int_equal(c->nnodes, 3);
	for (int i = 0; i < 3; i++) {
		assert_string_equal(c->nodes[i].id, ids[i]);
		assert_ptr_not_equal(c->nodes[i].id, ids[i]);
		assert_int_equal(c->nodes[i].devices, 8);
		assert_null(c->nodes[i].addr);
		assert_int_equal(ptc_cluster_find(c, ids[i]), i);
	}
	assert_null(c->token_file);
	ptc_cluster_free(c);
}

static void test_cluster_extends(void **state)
{
	const char *base =
	    "{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', "
	    "'addr': 'a:1', 'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 2}]}";
	struct {
		const char *text, *msg; /* msg NULL: extends base */
	} cases[] = {
	    {"{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 2}, {'id': 'n2', 'addr': "
	     "'a:3', 'devices': 4}]}",
	     NULL},
	    {"{'etcd': 'http://e:1', 'job': 'j', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 2}]}",
	     NULL},
	    {"{'job': 'k', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 2}]}",
	     "cluster.json: \"job\", \"etcd\" and \"token_file\" must stay the same"},
	    {"{'job': 'j', 'etcd': 'http://e:1', 'token_file': '/t', 'nodes': [{'id': 'n0', "
	     "'addr': 'a:1', 'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 2}]}",
	     "cluster.json: \"job\", \"etcd\" and \"token_file\" must stay the same"},
	    {"{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}]}",
	     "cluster.json: 1 nodes, fewer than the job's 2 (nodes are added, never removed: a "
	     "config leaves them out)"},
	    {"{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n1', 'addr': 'a:2', "
	     "'devices': 2}, {'id': 'n0', 'addr': 'a:1', 'devices': 2}]}",
	     "cluster.json: node 0 is \"n1\" (a:2, 2 devices) where the job has \"n0\" (a:1, 2 "
	     "devices): the job's nodes come first, in order, unchanged"},
	    {"{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}, {'id': 'n1', 'addr': 'a:9', 'devices': 2}, {'id': 'n2', 'devices': "
	     "1}]}",
	     "cluster.json: node 1 is \"n1\" (a:9, 2 devices) where the job has \"n1\" (a:2, 2 "
	     "devices): the job's nodes come first, in order, unchanged"},
	    {"{'job': 'j', 'etcd': 'http://e:1', 'nodes': [{'id': 'n0', 'addr': 'a:1', "
	     "'devices': 2}, {'id': 'n1', 'addr': 'a:2', 'devices': 3}]}",
	     "cluster.json: node 1 is \"n1\" (a:2, 3 devices) where the job has \"n1\" (a:2, 2 "
	     "devices): the job's nodes come first, in order, unchanged"},
	};
	struct ptc_cluster *a = NULL, *b = NULL;
	struct ptc_error err = {.text = ""};

	(void)state;
	assert_int_equal(parse_cluster(base, &a, &err), 0);
	assert_int_equal(ptc_cluster_extends(a, a, &err), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err.text[0] = '\0';
		assert_int_equal(parse_cluster(cases[i].text, &b, &err), 0);
		int rc = ptc_cluster_extends(a, b, &err);
		if (cases[i].msg) {
			assert_int_equal(rc, -EINVAL);
			assert_string_equal(err.text, cases[i].msg);
		} else {
			assert_int_equal(rc, 0);
		}
		ptc_cluster_free(b);
	}
	ptc_cluster_free(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_config_bad_json),	  cmocka_unit_test(test_config_not_object),
	    cmocka_unit_test(test_config_unknown_field),  cmocka_unit_test(test_config_version),
	    cmocka_unit_test(test_config_degrees),	  cmocka_unit_test(test_config_replicas),
	    cmocka_unit_test(test_config_snapshot),	  cmocka_unit_test(test_config_nodes),
	    cmocka_unit_test(test_config_node_ids),	  cmocka_unit_test(test_config_dataset),
	    cmocka_unit_test(test_config_design_example), cmocka_unit_test(test_config_minimal),
	    cmocka_unit_test(test_config_to_json),	  cmocka_unit_test(test_cluster_errors_top),
	    cmocka_unit_test(test_cluster_errors_node),	  cmocka_unit_test(test_cluster_ok),
	    cmocka_unit_test(test_cluster_etcd_members),  cmocka_unit_test(test_cluster_uniform),
	    cmocka_unit_test(test_cluster_extends),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
