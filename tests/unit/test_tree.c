/*
 * test_tree.c - the name trees of "<state>/<tensor>.npy" (mlfs/mlfs_tree.c).
 *
 * Every tree is checked against the schema independently of how it was
 * built: each expected path resolves to a leaf naming its state and tensor,
 * children are strictly sorted (lookups are binary searches), there are as
 * many leaves as paths and no empty directory, so the tree is exactly the
 * paths' prefixes. The largest schema the parser accepts, all in one
 * directory, used to take minutes (issue 10); its build time is printed.
 */
#include <stdbool.h>
#include <time.h>

#include "store/store.h"
#include "tests/unit/unit.h"

UNIT_PARSER(schema, struct ptc_schema, "schema.json", ptc_schema_parse_text, ptc_schema_free)
UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)

/* Leaves and directories under @t (itself included); fails on unsorted
 * children or an empty directory below the root. */
static void walk(const struct mlfs_tnode *t, bool root, int64_t *leaves, int64_t *nodes)
{
	(*nodes)++;
	if (t->tensor >= 0) {
		(*leaves)++;
		assert_true(t->state >= 0);
	} else if (t->st_file != MLFS_TN_NOT_ST) { /* full/<state>.safetensors: counted apart */
		assert_true(t->state >= 0);
		assert_int_equal(t->nchild, 0);
	} else {
		assert_int_equal(t->state, -1);
		if (!root)
			assert_true(t->nchild > 0);
	}
	for (int i = 0; i < t->nchild; i++) {
		if (i > 0 && strcmp(t->child[i - 1]->name, t->child[i]->name) >= 0)
			fail_msg("children \"%s\" and \"%s\" of \"%s\" are not sorted",
				 t->child[i - 1]->name, t->child[i]->name, t->name);
		walk(t->child[i], false, leaves, nodes);
	}
}

/* Checks that @root is exactly the tree of tensors @holds selects. */
static void check_tree(const struct mlfs_tnode *root, const struct ptc_schema *s,
		       bool (*holds)(const void *arg, int tensor), const void *arg)
{
	int64_t paths = 0, leaves = 0, nodes = 0;
	char path[PTC_MAX_PATH + 1];

	assert_non_null(root);
	assert_string_equal(root->name, "");
	for (int si = 0; si < s->nstates; si++) {
		for (int ti = 0; ti < s->ntensors; ti++) {
			if (!holds(arg, ti))
				continue;
			snprintf(path, sizeof(path), "%s/%s.npy", s->states[si].name,
				 s->tensors[ti].name);
			const struct mlfs_tnode *t = root;
			for (const char *p = path; t && *p;) {
				size_t n = strcspn(p, "/");
				if (t != root)
					assert_int_equal(t->tensor, -1);
				t = mlfs_tree_child(t, p, n);
				p += n + (p[n] == '/');
			}
			if (!t)
				fail_msg("\"%s\" is not in the tree", path);
			assert_int_equal(t->state, si);
			assert_int_equal(t->tensor, ti);
			paths++;
		}
	}
	walk(root, true, &leaves, &nodes);
	assert_int_equal(leaves, paths);
}

struct stage {
	const struct ptc_layout *l;
	int p;
};

static bool stage_holds(const void *arg, int ti)
{
	const struct stage *a = arg;
	return ptc_layout_stage_holds(a->l, a->p, ti);
}

static bool full_holds(const void *arg, int ti)
{
	const struct ptc_schema *s = arg;
	return s->tensors[ti].tied < 0;
}

/* Names of @t's children, comma-separated, into @buf. */
static const char *children(const struct mlfs_tnode *t, char *buf, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < t->nchild && off < n; i++)
		off +=
		    (size_t)snprintf(buf + off, n - off, "%s%s", i ? "," : "", t->child[i]->name);
	return buf;
}

static const struct mlfs_tnode *at(const struct mlfs_tnode *t, const char *path)
{
	for (const char *p = path; t && *p;) {
		size_t n = strcspn(p, "/");
		t = mlfs_tree_child(t, p, n);
		p += n + (p[n] == '/');
	}
	assert_non_null(t);
	return t;
}

static void test_design_trees(void **state)
{
	struct ptc_schema *s = schema_ok(
	    "{'num_layers': 4, 'states': {'model': {}, 'optim/exp_avg': {}, "
	    "'optim/exp_avg_sq': {}}, 'tensors': ["
	    "{'name': 'embedding/word/weight', 'dtype': 'bool', 'shape': [8], 'place': 'first'},"
	    "{'name': 'layers/{L}/attn/qkv/weight', 'dtype': 'bool', 'shape': [8]},"
	    "{'name': 'layers/{L}/attn/proj/bias', 'dtype': 'bool', 'shape': [8]},"
	    "{'name': 'final_norm/weight', 'dtype': 'bool', 'shape': [8], 'place': 'last'},"
	    "{'name': 'output/weight', 'dtype': 'bool', 'shape': [8], 'place': 'last',"
	    " 'tied': 'embedding/word/weight'}]}");
	struct ptc_config *c =
	    config_ok("{'version': 1, 'tp': 1, 'pp': 2, 'dp': 1, 'nodes': ['n0']}");
	char *ids[] = {"n0"}, buf[256];
	struct ptc_cluster *cl = ptc_cluster_new_uniform(1, ids, 8);
	struct ptc_error err = {.text = ""};
	struct ptc_layout l;
	struct mlfs_tnode *t;

	(void)state;
	assert_int_equal(ptc_layout_init(&l, s, c, cl, "config.json", &err), 0);

	/* full/: every untied tensor of every state. */
	t = mlfs_tree_build_full(s, PTC_ST_SHARD_MAX);
	check_tree(t, s, full_holds, s);
	assert_string_equal(children(t, buf, sizeof(buf)), "model,model.safetensors,optim");
	assert_string_equal(children(at(t, "optim"), buf, sizeof(buf)),
			    "exp_avg,exp_avg.safetensors,exp_avg_sq,exp_avg_sq.safetensors");
	assert_int_equal(at(t, "optim/exp_avg_sq.safetensors")->state, 2);
	assert_int_equal(at(t, "optim/exp_avg_sq.safetensors")->st_file, 0);
	mlfs_tree_free(t);

	/* 10 tensors of 8 bytes in shards of at most 64: 8 and 2, and an index. */
	t = mlfs_tree_build_full(s, 64);
	check_tree(t, s, full_holds, s);
	assert_int_equal(at(t, "model.safetensors.index.json")->st_file, MLFS_TN_ST_INDEX);
	assert_int_equal(at(t, "model-00002-of-00002.safetensors")->st_file, 1);
	assert_string_equal(children(at(t, "model"), buf, sizeof(buf)),
			    "embedding,final_norm,layers");
	assert_string_equal(children(at(t, "model/layers"), buf, sizeof(buf)), "0,1,2,3");
	assert_string_equal(children(at(t, "optim/exp_avg_sq/layers/2/attn"), buf, sizeof(buf)),
			    "proj,qkv");
	assert_int_equal(at(t, "optim/exp_avg/layers/3/attn/qkv/weight.npy")->tensor, 4);
	assert_int_equal(at(t, "optim/exp_avg/layers/3/attn/qkv/weight.npy")->state, 1);
	mlfs_tree_free(t);

	/* Stage 0: the embedding and layers 0-1; stage 1 the rest and the tied
	 * output (pp > 1). */
	for (int p = 0; p < 2; p++) {
		struct stage a = {&l, p};
		t = mlfs_tree_build_stage(&l, p);
		check_tree(t, s, stage_holds, &a);
		assert_string_equal(children(at(t, "model"), buf, sizeof(buf)),
				    p ? "final_norm,layers,output" : "embedding,layers");
		assert_string_equal(children(at(t, "model/layers"), buf, sizeof(buf)),
				    p ? "2,3" : "0,1");
		mlfs_tree_free(t);
	}
	mlfs_tree_free(NULL);
	ptc_layout_release(&l);
	ptc_cluster_free(cl);
	ptc_config_free(c);
	ptc_schema_free(s);
}

static void test_component_order(void **state)
{
	/* Children sort by component, as strcmp orders names: "a" before "a-b"
	 * although "a/x" sorts after "a-b/x" as a whole path. */
	struct ptc_schema *s =
	    schema_ok("{'tensors': [{'name': 'a_b', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a/x', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a.b', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a-b/x', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'A', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a/x.npy.q', 'dtype': 'bool', 'shape': [1]}]}");
	struct mlfs_tnode *t = mlfs_tree_build_full(s, PTC_ST_SHARD_MAX);
	char buf[256];

	(void)state;
	check_tree(t, s, full_holds, s);
	assert_string_equal(children(t, buf, sizeof(buf)), "model,model.safetensors");
	assert_string_equal(children(at(t, "model"), buf, sizeof(buf)),
			    "A.npy,a,a-b,a.b.npy,a.npy,a_b.npy");
	assert_string_equal(children(at(t, "model/a"), buf, sizeof(buf)), "x.npy,x.npy.q.npy");
	assert_int_equal(at(t, "model/a.npy")->tensor, 4);
	assert_int_equal(at(t, "model/a/x.npy")->tensor, 1);
	mlfs_tree_free(t);
	ptc_schema_free(s);
}

static void test_empty_stage(void **state)
{
	/* No layers: stage 1 holds nothing, its tree is an empty root. */
	struct ptc_schema *s = schema_ok(
	    "{'tensors': [{'name': 'w', 'dtype': 'bool', 'shape': [1], 'place': 'first'}]}");
	struct ptc_config *c =
	    config_ok("{'version': 1, 'tp': 1, 'pp': 2, 'dp': 1, 'nodes': ['n0']}");
	char *ids[] = {"n0"};
	struct ptc_cluster *cl = ptc_cluster_new_uniform(1, ids, 8);
	struct ptc_error err = {.text = ""};
	struct ptc_layout l;

	(void)state;
	assert_int_equal(ptc_layout_init(&l, s, c, cl, "config.json", &err), 0);
	struct mlfs_tnode *t = mlfs_tree_build_stage(&l, 1);
	assert_non_null(t);
	assert_int_equal(t->nchild, 0);
	assert_null(t->child);
	mlfs_tree_free(t);
	t = mlfs_tree_build_stage(&l, 0);
	assert_int_equal(at(t, "model/w.npy")->tensor, 0);
	mlfs_tree_free(t);
	ptc_layout_release(&l);
	ptc_cluster_free(cl);
	ptc_config_free(c);
	ptc_schema_free(s);
}

static void test_longest_path(void **state)
{
	/* "<state>/<tensor>.npy" of PTC_MAX_PATH bytes (the tree once had a
	 * 1024-byte buffer and failed such a schema with ENOMEM). */
	char name[3055], *text;

	(void)state;
	memset(name, 'd', sizeof(name) - 1);
	for (size_t i = 200; i + 1 < sizeof(name) - 1; i += 201)
		name[i] = '/';
	name[sizeof(name) - 1] = '\0';
	assert_true(asprintf(&text,
			     "{'states': {'model': {}, 'optim/exp_avg': {}}, 'tensors': [{'name': "
			     "'%s', 'dtype': 'bool', 'shape': [1]}, {'name': 'w', 'dtype': 'bool', "
			     "'shape': [1]}]}",
			     name) > 0);
	struct ptc_schema *s = schema_ok(text);
	assert_int_equal(strlen("optim/exp_avg/") + strlen(s->tensors[0].name) + strlen(".npy"),
			 PTC_MAX_PATH);
	struct mlfs_tnode *t = mlfs_tree_build_full(s, PTC_ST_SHARD_MAX);
	check_tree(t, s, full_holds, s);
	mlfs_tree_free(t);
	ptc_schema_free(s);
	free(text);
}

static double seconds_since(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

static void test_largest_schema(void **state)
{
	/* PTC_MAX_TENSORS tensors (8192 layers x 16 templates), 3 states, every
	 * file of a state in one directory: the old insert scanned that
	 * directory's children for each name, 84 s here; sorted, 0.2 s. */
	size_t cap = 4096, off;
	char *text = malloc(cap);
	struct timespec t0;

	(void)state;
	assert_non_null(text);
	off = (size_t)snprintf(text, cap,
			       "{'num_layers': 8192, 'states': {'model': {}, "
			       "'optim/exp_avg': {}, 'optim/exp_avg_sq': {}}, "
			       "'tensors': [");
	for (int k = 0; k < 16; k++)
		off += (size_t)snprintf(text + off, cap - off,
					"%s{'name': 'h.{L}.w%d', 'dtype': 'bool', 'shape': [1]}",
					k ? ", " : "", k);
	snprintf(text + off, cap - off, "]}");
	struct ptc_schema *s = schema_ok(text);
	assert_int_equal(s->ntensors, PTC_MAX_TENSORS);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct mlfs_tnode *t = mlfs_tree_build_full(s, PTC_ST_SHARD_MAX);
	printf("tree: %d states x %d tensors in one directory each: built in %.3f s\n", s->nstates,
	       s->ntensors, seconds_since(&t0));
	check_tree(t, s, full_holds, s);
	assert_int_equal(at(t, "optim/exp_avg")->nchild, PTC_MAX_TENSORS);
	assert_string_equal(at(t, "model")->child[0]->name, "h.0.w0.npy");
	assert_string_equal(at(t, "model")->child[PTC_MAX_TENSORS - 1]->name, "h.999.w9.npy");
	mlfs_tree_free(t);
	ptc_schema_free(s);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_design_trees),   cmocka_unit_test(test_component_order),
	    cmocka_unit_test(test_empty_stage),	   cmocka_unit_test(test_longest_path),
	    cmocka_unit_test(test_largest_schema),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
