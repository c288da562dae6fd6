/*
 * test_elastic.c - the elastic controller's choice (cluster/mlfs_elastic.c)
 * on scripted jobs: nothing while the config's nodes are live, a layout on
 * the survivors that their state can serve when one dies, none when every
 * layout needs lost state (and one again with backups), min_nodes and
 * max_nodes, growing onto a node that joined but not onto one a person
 * left out, draining a node without losing its state, fewer nodes than
 * are live when no layout fits them all, a DP degree that keeps whole
 * micro-batches; and the "elastic" config key's checks.
 */
#include "cluster/elastic_i.h"
#include "tests/unit/unit.h"

UNIT_PARSER(schema, struct ptc_schema, "schema.json", ptc_schema_parse_text, ptc_schema_free)
UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)
UNIT_PARSER(cluster, struct ptc_cluster, "cluster.json", ptc_cluster_parse_text, ptc_cluster_free)

/* Four layers of two split tensors and a replicated one: tp 1, 2 or 4,
 * pp 1, 2 or 4; any dp. */
static const char schema_text[] =
    "{'model': 'm', 'num_layers': 4, 'states': {'model': {}},"
    " 'tensors': ["
    "  {'name': 'layers/{L}/w', 'dtype': 'float32', 'shape': [64, 64], 'split': {'dim': 0}},"
    "  {'name': 'layers/{L}/v', 'dtype': 'float32', 'shape': [64, 64], 'split': {'dim': 1}},"
    "  {'name': 'layers/{L}/b', 'dtype': 'float32', 'shape': [64]}]}";

/* Nodes n0..n3 of @devices devices each. */
static struct ptc_cluster *four(int devices)
{
	char text[512];
	snprintf(text, sizeof(text),
		 "{'nodes': [{'id': 'n0', 'devices': %d}, {'id': 'n1', 'devices': %d},"
		 " {'id': 'n2', 'devices': %d}, {'id': 'n3', 'devices': %d}]}",
		 devices, devices, devices, devices);
	return cluster_ok(text);
}

struct job {
	struct ptc_schema *s;
	struct ptc_cluster *cl;
	struct ptc_config *cur;
	bool live[4], base[4], drain[4];
	int backup_of[4];
	struct mlfs_elastic_out out;
};

static void job_init_schema(struct job *j, const char *schema, int devices, const char *config)
{
	memset(j, 0, sizeof(*j));
	j->s = schema_ok(schema);
	j->cl = four(devices);
	j->cur = config_ok(config);
	for (int i = 0; i < 4; i++)
		j->live[i] = j->base[i] = true, j->backup_of[i] = -1;
}

static void job_init(struct job *j, int devices, const char *config)
{
	job_init_schema(j, schema_text, devices, config);
}

static void job_free(struct job *j)
{
	json_decref(j->out.config);
	ptc_config_free(j->cur);
	ptc_cluster_free(j->cl);
	ptc_schema_free(j->s);
}

/* The decision; its config's nodes as "n0,n1" into @nodes (or "" for none). */
static void decide(struct job *j, bool backups, char *nodes, size_t cap)
{
	struct mlfs_elastic_in in = {.schema = j->s,
				     .cluster = j->cl,
				     .cur = j->cur,
				     .live = j->live,
				     .draining = j->drain,
				     .baseline = j->base,
				     .backup_of = backups ? j->backup_of : NULL};
	json_decref(j->out.config);
	assert_int_equal(mlfs_elastic_decide(&in, &j->out), 0);
	nodes[0] = '\0';
	size_t i, k = 0;
	json_t *n;
	json_array_foreach(json_object_get(j->out.config, "nodes"), i, n) k +=
	    (size_t)snprintf(nodes + k, cap - k, "%s%s", i ? "," : "", json_string_value(n));
}

/* The degrees of the proposed config. */
static int degree(const struct job *j, const char *key)
{
	return (int)json_integer_value(json_object_get(j->out.config, key));
}

static void test_nothing_while_every_node_is_live(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	job_init(&j, 1,
		 "{'version': 3, 'tp': 1, 'pp': 1, 'dp': 4, 'nodes': ['n0', 'n1', 'n2', 'n3'],"
		 " 'elastic': {'min_nodes': 2}}");
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	assert_non_null(strstr(j.out.why, "every node of version 3 is live"));
	/* Not elastic: nothing, whatever died. */
	ptc_config_free(j.cur);
	j.cur = config_ok("{'version': 3, 'tp': 1, 'pp': 1, 'dp': 4, 'nodes': ['n0', 'n1', 'n2', "
			  "'n3']}");
	j.live[2] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	assert_string_equal(j.out.why, "the config is not elastic");
	job_free(&j);
}

static void test_death_served_from_replicas(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	/* dp 4 on four nodes: n2 dies, every partition has three replicas. */
	job_init(&j, 1,
		 "{'version': 3, 'tp': 1, 'pp': 1, 'dp': 4, 'nodes': ['n0', 'n1', 'n2', 'n3'],"
		 " 'elastic': {'min_nodes': 2, 'max_nodes': 4}, 'replicas': 0}");
	j.live[2] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0,n1,n3"); /* the survivors, in the config's order */
	assert_int_equal(degree(&j, "version"), 4);
	assert_int_equal(degree(&j, "tp") * degree(&j, "pp") * degree(&j, "dp"), 3);
	assert_non_null(json_object_get(j.out.config, "elastic")); /* it stays elastic */
	assert_non_null(strstr(j.out.why, "node n2 of version 3 is down or lost"));
	assert_non_null(strstr(j.out.why, "version 4 on n0,n1,n3"));
	/* Two more die: below min_nodes 2, it waits. */
	j.live[0] = j.live[1] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	assert_non_null(strstr(j.out.why, "fewer than min_nodes 2"));
	job_free(&j);
}

static void test_lost_state_is_no_candidate(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	/* tp 2, pp 2 on n0 (stage 0) and n1 (stage 1), no DP replica: with n1
	 * dead its stage is gone, and no layout of n0 can be served. */
	job_init(&j, 2,
		 "{'version': 5, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1'], 'replicas': 1,"
		 " 'elastic': {'min_nodes': 1, 'max_nodes': 2}}");
	j.live[1] = false;
	j.live[2] = j.live[3] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	assert_non_null(strstr(j.out.why, "can be served from the surviving state"));
	assert_non_null(strstr(j.out.why, "no surviving copy"));
	/* With n1's backup on n0 ("replicas": 1), its stage survives there. */
	j.backup_of[1] = 0;
	decide(&j, true, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0");
	assert_int_equal(degree(&j, "tp") * degree(&j, "pp") * degree(&j, "dp"), 2);
	assert_int_equal(degree(&j, "version"), 6);
	job_free(&j);
}

static void test_growth(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	job_init(&j, 1,
		 "{'version': 7, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n1', 'n0'],"
		 " 'elastic': {'min_nodes': 1, 'max_nodes': 3}}");
	/* n2 and n3 were live when version 7 was committed: a person left
	 * them out; that stands. */
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	/* n3 restarts (it was down at the baseline) and joins: the job grows
	 * onto it, the config's nodes first in their order; n2 stays out. */
	j.base[3] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_non_null(strstr(j.out.why, "node n3 joined"));
	assert_string_equal(nodes, "n1,n0,n2");
	assert_int_equal(degree(&j, "tp") * degree(&j, "pp") * degree(&j, "dp"), 3);
	/* At max_nodes already: a node joining changes nothing. */
	ptc_config_free(j.cur);
	j.cur = config_ok("{'version': 8, 'tp': 1, 'pp': 1, 'dp': 3, 'nodes': ['n1', 'n0', 'n2'],"
			  " 'elastic': {'min_nodes': 1, 'max_nodes': 3}}");
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	job_free(&j);
}

static void test_drain(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	/* tp 2, pp 2 on n0 and n1, no replicas; n2 and n3 down. n1 is marked
	 * for draining: it hosts nothing in the new layout, but it is no down
	 * node, so its stage is fetched from it and nothing is lost. */
	job_init(&j, 2,
		 "{'version': 2, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1'],"
		 " 'elastic': {'min_nodes': 1}}");
	j.live[2] = j.live[3] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	j.drain[1] = true;
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0");
	assert_non_null(strstr(j.out.why, "node n1 of version 2 is draining"));
	/* Drained (version 3 on n0; n1 was draining at its baseline), then
	 * undone: n1 counts as joined, and the job grows back onto it. */
	ptc_config_free(j.cur);
	j.cur = config_ok("{'version': 3, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
			  " 'elastic': {'min_nodes': 1}}");
	j.base[1] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config); /* still draining */
	j.drain[1] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0,n1");
	job_free(&j);
}

static void test_fewer_nodes_when_none_fits(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	/* Two layers: with n3 dead, no layout fits the three survivors' three
	 * devices (pp 3 > 2 layers, 64 rows in 3, a batch of 16 in 3): the job
	 * runs on two of them, the config's first, from the replicas. */
	job_init_schema(
	    &j,
	    "{'model': 'm', 'num_layers': 2, 'states': {'model': {}},"
	    " 'tensors': [{'name': 'layers/{L}/w', 'dtype': 'float32', 'shape': [64, 64],"
	    " 'split': {'dim': 0}}]}",
	    1,
	    "{'version': 2, 'tp': 1, 'pp': 1, 'dp': 4, 'nodes': ['n0', 'n1', 'n2', 'n3'],"
	    " 'dataset': {'index': 'file:///d/index.json', 'global_batch': 16},"
	    " 'elastic': {'min_nodes': 2}}");
	j.live[3] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0,n1");
	assert_int_equal(degree(&j, "tp") * degree(&j, "pp") * degree(&j, "dp"), 2);
	assert_non_null(strstr(j.out.why, "version 3 on n0,n1"));
	assert_non_null(strstr(j.out.why, "no layout on n0,n1,n2"));
	/* n2, live but idle, was live at that version's baseline: nothing joined. */
	ptc_config_free(j.cur);
	j.cur = config_ok("{'version': 3, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1'],"
			  " 'dataset': {'index': 'file:///d/index.json', 'global_batch': 16},"
			  " 'elastic': {'min_nodes': 2}}");
	j.base[3] = false;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	/* With min_nodes 3, two nodes are not enough: nothing, and why. */
	ptc_config_free(j.cur);
	j.cur =
	    config_ok("{'version': 2, 'tp': 1, 'pp': 1, 'dp': 4, 'nodes': ['n0', 'n1', 'n2', 'n3'],"
		      " 'dataset': {'index': 'file:///d/index.json', 'global_batch': 16},"
		      " 'elastic': {'min_nodes': 3}}");
	j.base[3] = true;
	decide(&j, false, nodes, sizeof(nodes));
	assert_null(j.out.config);
	assert_non_null(strstr(j.out.why, "no layout on n0,n1,n2"));
	job_free(&j);
}

static void test_whole_micro_batches(void **state)
{
	(void)state;
	struct job j;
	char nodes[64];

	/* A global batch of 16 in micro-batches of 8: at most dp 2, whatever
	 * the devices; the key is kept in the proposal. */
	job_init(&j, 2,
		 "{'version': 4, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0'],"
		 " 'dataset': {'index': 'file:///d/index.json', 'global_batch': 16},"
		 " 'elastic': {'min_nodes': 1, 'micro_batch': 8}}");
	j.base[1] = j.base[2] = j.base[3] = false; /* n1..n3 joined */
	decide(&j, false, nodes, sizeof(nodes));
	assert_non_null(j.out.config);
	assert_string_equal(nodes, "n0,n1,n2,n3");
	assert_int_equal(degree(&j, "tp") * degree(&j, "pp") * degree(&j, "dp"), 8);
	assert_true(degree(&j, "dp") <= 2);
	assert_int_equal(json_integer_value(json_object_get(
			     json_object_get(j.out.config, "elastic"), "micro_batch")),
			 8);
	job_free(&j);
}

static void test_elastic_key(void **state)
{
	(void)state;
	struct ptc_config *c =
	    config_ok("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
		      " 'elastic': {'min_nodes': 2, 'max_nodes': 9, 'policy': "
		      "'auto'}}");
	assert_true(c->elastic);
	assert_int_equal(c->elastic_min, 2);
	assert_int_equal(c->elastic_max, 9);
	assert_int_equal(c->elastic_micro_batch, 1);
	json_t *j = ptc_config_to_json(c);
	assert_int_equal(
	    json_integer_value(json_object_get(json_object_get(j, "elastic"), "max_nodes")), 9);
	assert_null(json_object_get(json_object_get(j, "elastic"), "micro_batch")); /* default */
	json_decref(j);
	ptc_config_free(c);
	config_fails_at(__FILE__, __LINE__,
			"{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
			" 'elastic': {'min_nodes': 3, 'max_nodes': 2}}",
			"config.json: elastic.min_nodes = 3 is more than max_nodes = 2", NULL);
	config_fails_at(__FILE__, __LINE__,
			"{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
			" 'elastic': {'policy': 'manual'}}",
			"config.json: elastic.policy must be \"auto\" (the only policy)", NULL);
	config_fails_at(__FILE__, __LINE__,
			"{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
			" 'elastic': {'min': 1}}",
			NULL, "elastic", "min", NULL);
	config_fails_at(__FILE__, __LINE__,
			"{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'], 'elastic': 3}",
			"config.json: \"elastic\" must be an object", NULL);
	config_fails_at(__FILE__, __LINE__,
			"{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0'],"
			" 'elastic': {'micro_batch': 0}}",
			NULL, "elastic", "micro_batch", NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_nothing_while_every_node_is_live),
	    cmocka_unit_test(test_death_served_from_replicas),
	    cmocka_unit_test(test_lost_state_is_no_candidate),
	    cmocka_unit_test(test_growth),
	    cmocka_unit_test(test_drain),
	    cmocka_unit_test(test_fewer_nodes_when_none_fits),
	    cmocka_unit_test(test_whole_micro_batches),
	    cmocka_unit_test(test_elastic_key),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
