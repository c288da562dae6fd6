/*
 * test_plan_backup.c - plans that read backups, and the layout's view of
 * them: the backup holder of each node, the sole rank of a node without a
 * copy elsewhere, plans that read a down node's backup from its holder (or
 * fail when the holder died too), and live replicas winning over backups.
 * Each plan is checked by check_plan (plan_fixture.h) on synthetic data.
 */
#include "tests/unit/plan_fixture.h"

/* ---------------------------------------------------- the only copy */

/* Config @text (single quotes) laid out over @cl into *@l; the config, the
 * caller's to free after ptc_layout_release. */
static struct ptc_config *layout_of(const struct ptc_schema *sch, const struct ptc_cluster *cl,
				    const char *text, struct ptc_layout *l)
{
	struct ptc_config *c;
	struct ptc_error err;
	char *js = unit_json(text);
	assert_int_equal(ptc_config_parse_text(js, strlen(js), "c", &c, &err), 0);
	free(js);
	assert_int_equal(ptc_layout_init(l, sch, c, cl, "c", &err), 0);
	return c;
}

/* ptc_layout_sole_rank: the lowest rank of a node without a copy on another
 * node that is up (DP replica or backup holder). */
static void test_sole_rank(void **state)
{
	(void)state;
	static const char schema[] = "{'tensors': [{'name': 'w', 'dtype': 'int8', 'shape': [4]}]}";
	/* 2 devices per node: tp2 dp2 on n0, n1 puts dp 0 on n0, dp 1 on n1. */
	static const char *const configs[] = {
	    "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}",
	    "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1']}",
	    "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 1, 'replicas': 1, 'nodes': ['n0', 'n1']}",
	    "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0']}",
	};
	/* Per config: node n0's sole rank with n1 up, then with n1 down. */
	static const int want[][2] = {{-1, 0}, {0, 0}, {-1, 0}, {0, 0}};
	char *ids[] = {"n0", "n1"};
	struct ptc_cluster *cl = ptc_cluster_new_uniform(2, ids, 2);
	struct ptc_schema *sch;
	struct ptc_error err;
	char *js = unit_json(schema);

	assert_int_equal(ptc_schema_parse_text(js, strlen(js), "s", &sch, &err), 0);
	free(js);
	for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
		struct ptc_layout l;
		struct ptc_config *c = layout_of(sch, cl, configs[i], &l);
		bool up[2] = {true, true};
		assert_int_equal(ptc_layout_sole_rank(&l, 0, up), want[i][0]);
		up[1] = false;
		assert_int_equal(ptc_layout_sole_rank(&l, 0, up), want[i][1]);
		ptc_layout_release(&l);
		ptc_config_free(c);
	}
	/* Node n1's ranks of tp2 pp2 dp1: 2 and 3, the second stage. */
	struct ptc_layout l;
	struct ptc_config *c = layout_of(sch, cl, configs[1], &l);
	bool up[2] = {true, true};
	assert_int_equal(ptc_layout_sole_rank(&l, 1, up), 2);
	ptc_layout_release(&l);
	ptc_config_free(c);
	ptc_schema_free(sch);
	ptc_cluster_free(cl);
}

/* --------------------------------------------------------------- backups */

static void test_backup_holder(void **state)
{
	(void)state;
	static const char schema[] = "{'tensors': [{'name': 'w', 'dtype': 'int8', 'shape': [4]}]}";
	static const char *const configs[] = {
	    "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'replicas': 1, 'nodes': ['n2', 'n0', 'n1']}",
	    "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n2', 'n0', 'n1']}",
	    "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'replicas': 1, 'nodes': ['n3']}",
	    "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'replicas': 1, 'nodes': ['n3', 'n1']}",
	};
	/* Per config, the holder of n0..n3: config.nodes order, wrapping
	 * around; none without replicas, on a config of one node, or for a
	 * node the config does not name. */
	static const int want[][4] = {
	    {1, 2, 0, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, 3, -1, 1}};
	char *ids[] = {"n0", "n1", "n2", "n3"};
	struct ptc_cluster *cl = ptc_cluster_new_uniform(4, ids, 1);
	struct ptc_schema *sch;
	struct ptc_error err;
	char *js = unit_json(schema);

	assert_int_equal(ptc_schema_parse_text(js, strlen(js), "s", &sch, &err), 0);
	free(js);
	for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
		struct ptc_layout l;
		struct ptc_config *c = layout_of(sch, cl, configs[i], &l);
		for (int n = 0; n < 4; n++)
			assert_int_equal(ptc_layout_backup_holder(&l, n), want[i][n]);
		assert_int_equal(ptc_layout_backup_holder(&l, -1), -1);
		assert_int_equal(ptc_layout_backup_holder(&l, 4), -1);
		ptc_layout_release(&l);
		ptc_config_free(c);
	}
	ptc_schema_free(sch);
	ptc_cluster_free(cl);
}

/* Six float32 layers of a row-split and a replicated tensor; a padded
 * embedding on the first stage and its tied copy on the last. */
static const char backup_schema[] =
    "{'num_layers': 6, 'tensors': ["
    "{'name': 'emb', 'dtype': 'float32', 'shape': [10, 3],"
    " 'split': {'dim': 0, 'pad_multiple': 4}, 'place': 'first'},"
    "{'name': 'l/{L}/w', 'dtype': 'float32', 'shape': [8, 4], 'split': {'dim': 0}},"
    "{'name': 'l/{L}/norm', 'dtype': 'float32', 'shape': [4]},"
    "{'name': 'out', 'dtype': 'float32', 'shape': [10, 3],"
    " 'split': {'dim': 0, 'pad_multiple': 4}, 'place': 'last', 'tied': 'emb'}]}";

/* Layouts @a and @b on @nnodes nodes of @devices devices, nodes @down down;
 * backups as @a's config keeps them. */
static void backup_scenario(struct scenario *sc, int nnodes, int devices, const char *a,
			    const char *b, const int *down, int ndown)
{
	char *ids[] = {"n0", "n1", "n2", "n3"};
	char *js = unit_json(backup_schema), *ja = unit_json(a), *jb = unit_json(b);
	struct ptc_error err;

	memset(sc, 0, sizeof(*sc));
	if (ptc_schema_parse_text(js, strlen(js), "s", &sc->schema, &err))
		fail_msg("%s", err.text);
	sc->cluster = ptc_cluster_new_uniform(nnodes, ids, devices);
	assert_int_equal(ptc_config_parse_text(ja, strlen(ja), "a.json", &sc->a, &err), 0);
	assert_int_equal(ptc_config_parse_text(jb, strlen(jb), "b.json", &sc->b, &err), 0);
	assert_int_equal(ptc_layout_init(&sc->la, sc->schema, sc->a, sc->cluster, "a.json", &err),
			 0);
	assert_int_equal(ptc_layout_init(&sc->lb, sc->schema, sc->b, sc->cluster, "b.json", &err),
			 0);
	for (int i = 0; i < ndown; i++) {
		sc->down[sc->ndown++] = down[i];
		sc->isdown[down[i]] = true;
	}
	sc->backups = sc->a->replicas > 0;
	for (int n = 0; n < nnodes; n++)
		sc->backup_of[n] = ptc_layout_backup_holder(&sc->la, n);
	free(js);
	free(ja);
	free(jb);
}

/* Bytes of the plan's ops read from backups; the count in *@n. */
static int64_t backup_bytes(const struct ptc_plan *p, int dst_node, int *n)
{
	int64_t bytes = 0;

	*n = 0;
	for (size_t k = 0; k < p->nops; k++)
		if (p->ops[k].backup && (dst_node < 0 || p->ops[k].dst_node == dst_node)) {
			bytes += p->ops[k].bytes;
			++*n;
		}
	return bytes;
}

/*
 * dp 1 on three nodes with backups: n0 stage 0 (emb, layers 0-1), n1 stage
 * 1 (layers 2-3), n2 stage 2 (layers 4-5, out). n1 dies; its backup is on
 * n2. The new layout on n0 and n2 (stages of layers 0-2 and 3-5) reads
 * layer 2 from the backup into n0 and layer 3 into n2 itself.
 */
static void test_backup_serves_down_node(void **state)
{
	(void)state;
	static const int down[] = {1};
	struct scenario sc;
	struct ptc_plan *p, *q;
	struct ptc_error err;
	int n;

	backup_scenario(&sc, 3, 2,
			"{'version': 1, 'tp': 2, 'pp': 3, 'dp': 1, 'replicas': 1,"
			" 'nodes': ['n0', 'n1', 'n2']}",
			"{'version': 2, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n2']}", down,
			1);
	assert_int_equal(sc.backup_of[0], 1);
	assert_int_equal(sc.backup_of[1], 2);
	assert_int_equal(sc.backup_of[2], 0);

	/* Without backups layers 2 and 3 are lost. */
	assert_int_equal(ptc_plan_compute(&sc.la, &sc.lb, down, 1, &p, &err), -EINVAL);
	assert_null(p);
	assert_string_equal(err.text, "no surviving copy of \"l/2/w\", \"l/3/w\", \"l/2/norm\", "
				      "\"l/3/norm\"");
	assert_int_equal(ptc_plan_compute_backups(&sc.la, &sc.lb, down, 1, NULL, &p, &err),
			 -EINVAL);
	assert_non_null(strstr(err.text, "no surviving copy of \"l/2/w\""));

	/* With them the plan is exact (check_plan applies it to the data) and
	 * every read of n1's ranks is a FETCH from its backup. */
	assert_int_equal(plan_scenario(&sc, &p, &err), 0);
	check_plan(&sc, p);
	for (size_t k = 0; k < p->nops; k++) {
		const struct ptc_op *op = &p->ops[k];
		bool reads_n1 = op->kind != PTC_OP_ZERO && op->kind != PTC_OP_DUP &&
				node_of(&sc.la, op->src_rank) == 1;
		assert_int_equal(reads_n1, op->backup);
		if (op->backup) {
			assert_int_equal(op->kind, PTC_OP_FETCH);
			assert_int_equal(op->src_node, 1);
		}
	}
	/* Layer 2 (w and norm: 128 + 16 bytes) into n0, layer 3 into n2: every
	 * byte served by n2, none by the dead n1. */
	assert_int_equal(backup_bytes(p, 0, &n), 144);
	assert_int_equal(n, 3); /* w into each of n0's two ranks; norm once, then DUP */
	assert_int_equal(backup_bytes(p, 2, &n), 144);
	assert_int_equal(p->per_node[1].bytes_out, 0);
	assert_int_equal(p->per_node[2].bytes_out, 288);
	assert_int_equal(p->per_node[0].bytes_out, 0);
	assert_int_equal(p->bytes_network, 288);
	assert_int_equal(p->lower_bound_network, 288);

	/* JSON marks them; nothing else is marked. */
	json_t *j = ptc_plan_to_json(p, &sc.la, &sc.lb, true), *op;
	size_t i;
	int marked = 0;
	json_array_foreach(json_object_get(j, "operations"), i, op)
	{
		json_t *b = json_object_get(op, "backup");
		if (!b)
			continue;
		assert_true(json_is_true(b));
		assert_string_equal(json_string_value(json_object_get(op, "op")), "fetch");
		assert_string_equal(json_string_value(json_object_get(op, "src_node")), "n1");
		marked++;
	}
	backup_bytes(p, -1, &n);
	assert_int_equal(marked, n);
	json_decref(j);

	/* Deterministic. */
	assert_int_equal(plan_scenario(&sc, &q, &err), 0);
	assert_int_equal(p->nops, q->nops);
	assert_memory_equal(p->ops, q->ops, p->nops * sizeof(*p->ops));
	ptc_plan_free(q);
	ptc_plan_free(p);

	/* A holder index outside the cluster is refused. */
	int bad[3] = {1, 3, 0};
	assert_int_equal(ptc_plan_compute_backups(&sc.la, &sc.lb, down, 1, bad, &p, &err), -EINVAL);
	assert_string_equal(err.text, "plan: backup holder 3 of node \"n1\" is out of range");
	free_scenario(&sc);
}

/* n1 and n2 die: n1's backup died with n2, n2's lives on n0. */
static void test_backup_holder_down(void **state)
{
	(void)state;
	static const int down[] = {1, 2};
	struct scenario sc;
	struct ptc_plan *p;
	struct ptc_error err;

	backup_scenario(&sc, 3, 2,
			"{'version': 1, 'tp': 2, 'pp': 3, 'dp': 1, 'replicas': 1,"
			" 'nodes': ['n0', 'n1', 'n2']}",
			"{'version': 2, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n0']}", down, 2);
	assert_int_equal(plan_scenario(&sc, &p, &err), -EINVAL);
	assert_null(p);
	assert_string_equal(err.text, "no surviving copy of \"l/2/w\", \"l/3/w\", \"l/2/norm\", "
				      "\"l/3/norm\"");
	free_scenario(&sc);

	/* Only n2 down: n0 keeps its backup, the plan reads layers 4-5 from it
	 * (out is tied to emb, which n0 has). */
	static const int down2[] = {2};
	backup_scenario(&sc, 3, 2,
			"{'version': 1, 'tp': 2, 'pp': 3, 'dp': 1, 'replicas': 1,"
			" 'nodes': ['n0', 'n1', 'n2']}",
			"{'version': 2, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1']}", down2,
			1);
	assert_int_equal(plan_scenario(&sc, &p, &err), 0);
	check_plan(&sc, p);
	int n;
	/* n0 serves n2's layers 4-5 from the backup and out through the
	 * embedding it holds (10 rows x 3 x 4 bytes); n1 serves layer 2. */
	assert_int_equal(backup_bytes(p, -1, &n), 288);
	assert_int_equal(p->per_node[0].bytes_out, 288 + 120);
	assert_int_equal(p->per_node[1].bytes_out, 144);
	assert_int_equal(p->per_node[2].bytes_out, 0);
	for (size_t k = 0; k < p->nops; k++)
		if (p->ops[k].backup)
			assert_int_equal(p->ops[k].src_node, 2);
	ptc_plan_free(p);
	free_scenario(&sc);
}

/* Live DP replicas win over backups: no op reads one, the plan is the one
 * without backups. */
static void test_backup_unused_with_replicas(void **state)
{
	(void)state;
	static const int down[] = {1};
	struct scenario sc;
	struct ptc_plan *p, *q;
	struct ptc_error err;
	int n;

	backup_scenario(&sc, 3, 2,
			"{'version': 1, 'tp': 2, 'pp': 1, 'dp': 2, 'replicas': 1,"
			" 'nodes': ['n0', 'n1']}",
			"{'version': 2, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n2']}", down, 1);
	assert_int_equal(sc.backup_of[1], 0);
	assert_int_equal(plan_scenario(&sc, &p, &err), 0);
	check_plan(&sc, p);
	assert_int_equal(backup_bytes(p, -1, &n), 0);
	assert_int_equal(n, 0);
	assert_true(p->bytes_network > 0);
	assert_int_equal(p->per_node[0].bytes_out, p->bytes_network);
	assert_int_equal(ptc_plan_compute(&sc.la, &sc.lb, down, 1, &q, &err), 0);
	assert_int_equal(p->nops, q->nops);
	assert_memory_equal(p->ops, q->ops, p->nops * sizeof(*p->ops));
	ptc_plan_free(q);
	ptc_plan_free(p);
	free_scenario(&sc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_backup_holder),
	    cmocka_unit_test(test_sole_rank),
	    cmocka_unit_test(test_backup_serves_down_node),
	    cmocka_unit_test(test_backup_holder_down),
	    cmocka_unit_test(test_backup_unused_with_replicas),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
