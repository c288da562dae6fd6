/*
 * test_layout.c - rank coordinates, allocation, stages and slices against
 * hand-computed values; layout errors.
 */
#include "tests/unit/unit.h"

static const char design_schema[] =
    "{'model': 'gpt-tiny', 'num_layers': 4,"
    " 'states': {'model': {}, 'optim/exp_avg': {'dtype': 'float32'}},"
    " 'tensors': ["
    "  {'name': 'embedding/word/weight', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    "   'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'first'},"
    "  {'name': 'layers/{L}/attn/qkv/weight', 'dtype': 'bfloat16', 'shape': [192, 64],"
    "   'split': {'dim': 0}},"
    "  {'name': 'layers/{L}/attn/proj/weight', 'dtype': 'bfloat16', 'shape': [64, 64],"
    "   'split': {'dim': 1}},"
    "  {'name': 'layers/{L}/attn/proj/bias', 'dtype': 'bfloat16', 'shape': [64]},"
    "  {'name': 'layers/{L}/mlp/fc1/weight', 'dtype': 'bfloat16', 'shape': [512, 64],"
    "   'split': {'dim': 0, 'chunks': 2}},"
    "  {'name': 'final_norm/weight', 'dtype': 'float32', 'shape': [64], 'place': 'last'},"
    "  {'name': 'output/weight', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    "   'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'last',"
    "   'tied': 'embedding/word/weight'}]}";

/* Indices of design_schema tensors. */
enum { EMB = 0, QKV0 = 1, PROJ0 = 5, BIAS0 = 9, FC1_0 = 13, NORM = 17, OUT = 18 };

static const char two_nodes[] = "{'nodes': [{'id': 'n0', 'addr': 'h0:1', 'devices': 4},"
				" {'id': 'n1', 'addr': 'h1:1', 'devices': 2},"
				" {'id': 'n2', 'devices': 8}]}";

static struct ptc_schema *schema(const char *text)
{
	char *s = unit_json(text);
	struct ptc_schema *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_schema_parse_text(s, strlen(s), "schema.json", &out, &err))
		print_error("schema: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

static struct ptc_config *config(const char *text)
{
	char *s = unit_json(text);
	struct ptc_config *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_config_parse_text(s, strlen(s), "config.json", &out, &err))
		print_error("config: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

static struct ptc_cluster *cluster(const char *text)
{
	char *s = unit_json(text);
	struct ptc_cluster *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_cluster_parse_text(s, strlen(s), "cluster.json", &out, &err))
		print_error("cluster: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

/* Everything a layout borrows, owned together. */
struct fixture {
	struct ptc_schema *s;
	struct ptc_config *c;
	struct ptc_cluster *cl;
	struct ptc_layout l;
	struct ptc_error err;
	int rc;
};

static void fixture_init(struct fixture *f, const char *schema_text, const char *config_text,
			 const char *cluster_text)
{
	memset(f, 0, sizeof(*f));
	f->s = schema(schema_text);
	f->c = config(config_text);
	f->cl = cluster(cluster_text);
	f->rc = ptc_layout_init(&f->l, f->s, f->c, f->cl, "config.json", &f->err);
}

static void fixture_release(struct fixture *f)
{
	ptc_layout_release(&f->l);
	ptc_config_free(f->c);
	ptc_cluster_free(f->cl);
	ptc_schema_free(f->s);
}

/* A layout that must succeed. */
static void layout_ok(struct fixture *f, const char *schema_text, const char *config_text,
		      const char *cluster_text)
{
	fixture_init(f, schema_text, config_text, cluster_text);
	if (f->rc)
		print_error("layout: %s\n", f->err.text);
	assert_int_equal(f->rc, 0);
}

/* ------------------------------------------------------------ coordinates */

static void test_megatron_coordinates(void **state)
{
	/* r: t = r % 2, d = (r / 2) % 2, p = r / 4 */
	static const int want[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
				       {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
	struct fixture f;

	(void)state;
	layout_ok(&f, design_schema,
		  "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 2, 'nodes': ['n0', 'n1', 'n2']}",
		  two_nodes);
	assert_int_equal(f.l.tp, 2);
	assert_int_equal(f.l.pp, 2);
	assert_int_equal(f.l.dp, 2);
	assert_int_equal(f.l.world, 8);
	assert_int_equal(f.l.ranks[5].t, 1);
	assert_int_equal(f.l.ranks[5].d, 0);
	assert_int_equal(f.l.ranks[5].p, 1);
	for (int r = 0; r < 8; r++) {
		assert_int_equal(f.l.ranks[r].t, want[r][0]);
		assert_int_equal(f.l.ranks[r].d, want[r][1]);
		assert_int_equal(f.l.ranks[r].p, want[r][2]);
		assert_int_equal(ptc_layout_rank(&f.l, want[r][0], want[r][1], want[r][2]), r);
	}
	fixture_release(&f);

	/* tp 4, dp 2, pp 1: rank 6 is t 2 of replica 1. */
	layout_ok(&f, design_schema, "{'version': 1, 'tp': 4, 'pp': 1, 'dp': 2, 'nodes': ['n2']}",
		  two_nodes);
	assert_int_equal(f.l.ranks[6].t, 2);
	assert_int_equal(f.l.ranks[6].d, 1);
	assert_int_equal(f.l.ranks[6].p, 0);
	assert_int_equal(ptc_layout_rank(&f.l, 3, 1, 0), 7);
	fixture_release(&f);

	/* tp 1, dp 3, pp 2: d varies fastest. */
	layout_ok(&f, design_schema, "{'version': 1, 'tp': 1, 'pp': 2, 'dp': 3, 'nodes': ['n2']}",
		  two_nodes);
	assert_int_equal(f.l.ranks[4].t, 0);
	assert_int_equal(f.l.ranks[4].d, 1);
	assert_int_equal(f.l.ranks[4].p, 1);
	assert_int_equal(ptc_layout_rank(&f.l, 0, 2, 0), 2);
	fixture_release(&f);
}

/* ------------------------------------------------------------- allocation */

static void test_allocation(void **state)
{
	struct fixture f;

	(void)state;
	/* n0 has 4 devices, n1 2: ranks 0-3 on n0, 4-5 on n1. */
	layout_ok(&f, design_schema,
		  "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 3, 'nodes': ['n0', 'n1']}", two_nodes);
	static const int node_a[6] = {0, 0, 0, 0, 1, 1}, dev_a[6] = {0, 1, 2, 3, 0, 1};
	for (int r = 0; r < 6; r++) {
		assert_int_equal(f.l.ranks[r].node, node_a[r]);
		assert_int_equal(f.l.ranks[r].device, dev_a[r]);
	}
	assert_int_equal(f.l.node_first_rank[0], 0);
	assert_int_equal(f.l.node_nranks[0], 4);
	assert_int_equal(f.l.node_first_rank[1], 4);
	assert_int_equal(f.l.node_nranks[1], 2);
	assert_int_equal(f.l.node_first_rank[2], -1);
	assert_int_equal(f.l.node_nranks[2], 0);
	fixture_release(&f);

	/* config.nodes order, not cluster order: n1's 2 devices first. */
	layout_ok(&f, design_schema,
		  "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 5, 'nodes': ['n1', 'n0']}", two_nodes);
	static const int node_b[5] = {1, 1, 0, 0, 0}, dev_b[5] = {0, 1, 0, 1, 2};
	for (int r = 0; r < 5; r++) {
		assert_int_equal(f.l.ranks[r].node, node_b[r]);
		assert_int_equal(f.l.ranks[r].device, dev_b[r]);
	}
	assert_int_equal(f.l.node_first_rank[1], 0);
	assert_int_equal(f.l.node_nranks[1], 2);
	assert_int_equal(f.l.node_first_rank[0], 2);
	assert_int_equal(f.l.node_nranks[0], 3);
	assert_int_equal(f.l.node_first_rank[2], -1);
	fixture_release(&f);

	/* Fewer ranks than devices: a listed node may host none. */
	layout_ok(&f, design_schema,
		  "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n1', 'n0', 'n2']}",
		  two_nodes);
	assert_int_equal(f.l.ranks[1].node, 1);
	assert_int_equal(f.l.ranks[1].device, 1);
	assert_int_equal(f.l.node_nranks[1], 2);
	assert_int_equal(f.l.node_first_rank[0], -1);
	assert_int_equal(f.l.node_nranks[0], 0);
	assert_int_equal(f.l.node_nranks[2], 0);
	fixture_release(&f);

	/* Exactly all 14 devices. */
	layout_ok(&f, design_schema,
		  "{'version': 1, 'tp': 7, 'pp': 1, 'dp': 2, 'nodes': ['n2', 'n1', 'n0']}",
		  two_nodes);
	assert_int_equal(f.l.ranks[7].node, 2);
	assert_int_equal(f.l.ranks[7].device, 7);
	assert_int_equal(f.l.ranks[8].node, 1);
	assert_int_equal(f.l.ranks[9].device, 1);
	assert_int_equal(f.l.ranks[10].node, 0);
	assert_int_equal(f.l.ranks[13].device, 3);
	assert_int_equal(f.l.node_first_rank[2], 0);
	assert_int_equal(f.l.node_first_rank[1], 8);
	assert_int_equal(f.l.node_first_rank[0], 10);
	assert_int_equal(f.l.node_nranks[0], 4);
	fixture_release(&f);
}

/* ----------------------------------------------------------------- stages */

/* A schema of @layers layers with one {L} tensor, one first, one last. */
static struct ptc_schema *layered(int layers)
{
	char text[512];

	snprintf(text, sizeof(text),
		 "{'num_layers': %d, 'tensors': ["
		 "{'name': 'emb', 'dtype': 'bool', 'shape': [4], 'place': 'first'},"
		 "{'name': 'l/{L}/w', 'dtype': 'bool', 'shape': [4]},"
		 "{'name': 'head', 'dtype': 'bool', 'shape': [4], 'place': 'last'}]}",
		 layers);
	return schema(text);
}

static void check_stages(int layers, int pp, const int *bounds)
{
	char text[128];
	struct fixture f;

	snprintf(text, sizeof(text), "{'version': 1, 'tp': 1, 'pp': %d, 'dp': 1, 'nodes': ['n2']}",
		 pp);
	memset(&f, 0, sizeof(f));
	f.s = layered(layers);
	f.c = config(text);
	f.cl = cluster(two_nodes);
	assert_int_equal(ptc_layout_init(&f.l, f.s, f.c, f.cl, "config.json", &f.err), 0);
	for (int p = 0; p < pp; p++) {
		assert_int_equal(f.l.ranks[p].p, p);
		assert_int_equal(f.l.ranks[p].layer_begin, bounds[p]);
		assert_int_equal(f.l.ranks[p].layer_end, bounds[p + 1]);
		/* Tensor 1 + l is layer l's tensor. */
		for (int l = 0; l < layers; l++)
			assert_int_equal(ptc_layout_stage_holds(&f.l, p, 1 + l),
					 l >= bounds[p] && l < bounds[p + 1]);
		assert_int_equal(ptc_layout_stage_holds(&f.l, p, 0), p == 0);
		assert_int_equal(ptc_layout_stage_holds(&f.l, p, 1 + layers), p == pp - 1);
	}
	fixture_release(&f);
}

static void test_uneven_stages(void **state)
{
	(void)state;
	check_stages(5, 2, (const int[]){0, 2, 5});
	check_stages(7, 3, (const int[]){0, 2, 4, 7});
	check_stages(4, 2, (const int[]){0, 2, 4});
	check_stages(4, 4, (const int[]){0, 1, 2, 3, 4});
	check_stages(10, 4, (const int[]){0, 2, 5, 7, 10});
	check_stages(3, 1, (const int[]){0, 3});
}

static void test_stage_holds(void **state)
{
	struct fixture f;

	(void)state;
	/* pp 2 over 4 layers. */
	layout_ok(&f, design_schema, "{'version': 1, 'tp': 1, 'pp': 2, 'dp': 1, 'nodes': ['n0']}",
		  two_nodes);
	assert_true(ptc_layout_stage_holds(&f.l, 0, EMB));
	assert_false(ptc_layout_stage_holds(&f.l, 1, EMB));
	assert_false(ptc_layout_stage_holds(&f.l, 0, NORM));
	assert_true(ptc_layout_stage_holds(&f.l, 1, NORM));
	/* The tied output copy exists on the last stage when pp > 1. */
	assert_false(ptc_layout_stage_holds(&f.l, 0, OUT));
	assert_true(ptc_layout_stage_holds(&f.l, 1, OUT));
	for (int l = 0; l < 4; l++) {
		assert_int_equal(ptc_layout_stage_holds(&f.l, 0, QKV0 + l), l < 2);
		assert_int_equal(ptc_layout_stage_holds(&f.l, 1, QKV0 + l), l >= 2);
		assert_int_equal(ptc_layout_stage_holds(&f.l, 1, FC1_0 + l), l >= 2);
		assert_int_equal(ptc_layout_holds(&f.l, 0, BIAS0 + l), l < 2);
		assert_int_equal(ptc_layout_holds(&f.l, 1, BIAS0 + l), l >= 2);
	}
	assert_true(ptc_layout_holds(&f.l, 1, OUT));
	assert_false(ptc_layout_holds(&f.l, 0, OUT));
	fixture_release(&f);

	/* pp 1: one stage holds everything except the tied copy. */
	layout_ok(&f, design_schema, "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 2, 'nodes': ['n0']}",
		  two_nodes);
	for (int t = 0; t < f.s->ntensors; t++)
		for (int r = 0; r < f.l.world; r++)
			assert_int_equal(ptc_layout_holds(&f.l, r, t), t != OUT);
	fixture_release(&f);

	/* "all" tensors on every stage, even stages without layers. */
	layout_ok(&f,
		  "{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1], 'place': 'all'},"
		  " {'name': 'b', 'dtype': 'bool', 'shape': [1]},"
		  " {'name': 'c', 'dtype': 'bool', 'shape': [1], 'place': 'last'},"
		  " {'name': 'd', 'dtype': 'bool', 'shape': [1], 'place': 'last', 'tied': 'b'}]}",
		  "{'version': 1, 'tp': 1, 'pp': 3, 'dp': 1, 'nodes': ['n0']}", two_nodes);
	for (int p = 0; p < 3; p++) {
		assert_true(ptc_layout_stage_holds(&f.l, p, 0));
		assert_true(ptc_layout_stage_holds(&f.l, p, 1));
		assert_int_equal(ptc_layout_stage_holds(&f.l, p, 2), p == 2);
		assert_int_equal(ptc_layout_stage_holds(&f.l, p, 3), p == 2);
		assert_int_equal(f.l.ranks[p].layer_begin, 0);
		assert_int_equal(f.l.ranks[p].layer_end, 0);
	}
	fixture_release(&f);
}

/* ----------------------------------------------------------------- slices */

/* A split tensor of @n rows (x 2 columns) on @dim, with @chunks and @pad. */
static struct ptc_tensor tensor(int64_t n, int nchunks, int64_t *chunks, int64_t pad)
{
	struct ptc_tensor t = {.name = "t",
			       .dtype = PTC_FLOAT32,
			       .ndim = 2,
			       .shape = {n, 2},
			       .split_dim = 0,
			       .nchunks = nchunks,
			       .chunks = chunks,
			       .pad_multiple = pad,
			       .place = PTC_PLACE_ALL,
			       .layer = -1,
			       .tied = -1};
	return t;
}

/* Checks slice @s against (local, global, len) triples. */
static void check_slice_at(const char *file, int line, const struct ptc_slice *s, int64_t rows,
			   int nsegs, const int64_t (*segs)[3])
{
	_assert_int_equal(s->rows, rows, file, line);
	_assert_int_equal(s->nsegs, nsegs, file, line);
	for (int i = 0; i < nsegs; i++) {
		_assert_int_equal(s->segs[i].local, segs[i][0], file, line);
		_assert_int_equal(s->segs[i].global, segs[i][1], file, line);
		_assert_int_equal(s->segs[i].len, segs[i][2], file, line);
	}
}

#define SLICE(t, tp, tpr, rows, ...)                                                               \
	do {                                                                                       \
		static const int64_t segs_[][3] = {__VA_ARGS__};                                   \
		struct ptc_slice s_;                                                               \
		ptc_slice_compute(t, tp, tpr, &s_);                                                \
		check_slice_at(__FILE__, __LINE__, &s_, rows, sizeof(segs_) / sizeof(segs_[0]),    \
			       segs_);                                                             \
	} while (0)

static void test_slice_even(void **state)
{
	int64_t c192[1] = {192};
	struct ptc_tensor qkv = tensor(192, 1, c192, 0);

	(void)state;
	SLICE(&qkv, 1, 0, 192, {0, 0, 192});
	SLICE(&qkv, 2, 0, 96, {0, 0, 96});
	SLICE(&qkv, 2, 1, 96, {0, 96, 96});
	SLICE(&qkv, 4, 3, 48, {0, 144, 48});
}

static void test_slice_uneven(void **state)
{
	int64_t c10[1] = {10};
	struct ptc_tensor t = tensor(10, 1, c10, 0);

	(void)state;
	/* [floor(t*10/4), floor((t+1)*10/4)): 0 2 5 7 10 */
	SLICE(&t, 4, 0, 2, {0, 0, 2});
	SLICE(&t, 4, 1, 3, {0, 2, 3});
	SLICE(&t, 4, 2, 2, {0, 5, 2});
	SLICE(&t, 4, 3, 3, {0, 7, 3});
	/* 10 rows over 3: 0 3 6 10 */
	SLICE(&t, 3, 0, 3, {0, 0, 3});
	SLICE(&t, 3, 1, 3, {0, 3, 3});
	SLICE(&t, 3, 2, 4, {0, 6, 4});
}

static void test_slice_chunks(void **state)
{
	/* GQA: q 8 rows, k 2, v 2; each TP rank takes its share of each. */
	int64_t gqa[3] = {8, 2, 2};
	struct ptc_tensor qkv = tensor(12, 3, gqa, 0);

	(void)state;
	SLICE(&qkv, 2, 0, 6, {0, 0, 4}, {4, 8, 1}, {5, 10, 1});
	SLICE(&qkv, 2, 1, 6, {0, 4, 4}, {4, 9, 1}, {5, 11, 1});
	/* With tp 1 the chunks are contiguous and merge into one segment. */
	SLICE(&qkv, 1, 0, 12, {0, 0, 12});

	/* SwiGLU gate/up: 2 chunks of 256. */
	int64_t fc1[2] = {256, 256};
	struct ptc_tensor t = tensor(512, 2, fc1, 0);
	SLICE(&t, 2, 0, 256, {0, 0, 128}, {128, 256, 128});
	SLICE(&t, 2, 1, 256, {0, 128, 128}, {128, 384, 128});
	/* Uneven chunks over an uneven tp: [5, 3] over 2 -> 2+1 / 3+2 */
	int64_t odd[2] = {5, 3};
	t = tensor(8, 2, odd, 0);
	SLICE(&t, 2, 0, 3, {0, 0, 2}, {2, 5, 1});
	SLICE(&t, 2, 1, 5, {0, 2, 3}, {3, 6, 2});
}

static void test_slice_units(void **state)
{
	/* GQA with heads of 2 rows ("unit": 2): q 4 heads, k and v 2 heads.
	 * tp 2: one KV head each, never half of one. */
	int64_t gqa[3] = {8, 4, 4};
	struct ptc_tensor qkv = tensor(16, 3, gqa, 0);
	qkv.unit = 2;

	(void)state;
	SLICE(&qkv, 2, 0, 8, {0, 0, 4}, {4, 8, 2}, {6, 12, 2});
	SLICE(&qkv, 2, 1, 8, {0, 4, 4}, {4, 10, 2}, {6, 14, 2});
	/* 3 heads of 2 rows over tp 2: whole heads, uneven (1 and 2), where
	 * rows alone would give 3 and 3 and cut the middle head. */
	int64_t three[1] = {6};
	struct ptc_tensor t = tensor(6, 1, three, 0);
	t.unit = 2;
	SLICE(&t, 2, 0, 2, {0, 0, 2});
	SLICE(&t, 2, 1, 4, {0, 2, 4});
	t.unit = 1;
	SLICE(&t, 2, 0, 3, {0, 0, 3});
}

static void test_slice_padding(void **state)
{
	int64_t c1000[1] = {1000};
	struct ptc_tensor emb = tensor(1000, 1, c1000, 128);

	(void)state;
	/* tp 2: padded to 1024, 512 each; rank 1 has 488 logical rows then 24 zeros. */
	SLICE(&emb, 2, 0, 512, {0, 0, 512});
	SLICE(&emb, 2, 1, 512, {0, 512, 488}, {488, -1, 24});
	/* tp 3: padded to a multiple of 384: 1152, 384 each. */
	SLICE(&emb, 3, 0, 384, {0, 0, 384});
	SLICE(&emb, 3, 1, 384, {0, 384, 384});
	SLICE(&emb, 3, 2, 384, {0, 768, 232}, {232, -1, 152});
	/* tp 1: padded to 1024. */
	SLICE(&emb, 1, 0, 1024, {0, 0, 1000}, {1000, -1, 24});
	/* tp 16: padded to 2048, 128 each; ranks past the data hold only padding. */
	SLICE(&emb, 16, 7, 128, {0, 896, 104}, {104, -1, 24});
	SLICE(&emb, 16, 8, 128, {0, -1, 128});
	SLICE(&emb, 16, 15, 128, {0, -1, 128});
	/* Already a multiple: no padding. */
	int64_t c1024[1] = {1024};
	struct ptc_tensor t = tensor(1024, 1, c1024, 128);
	SLICE(&t, 2, 1, 512, {0, 512, 512});
	SLICE(&t, 8, 7, 128, {0, 896, 128});
}

static void test_slice_replicated(void **state)
{
	struct ptc_tensor t = {.name = "b",
			       .dtype = PTC_FLOAT32,
			       .ndim = 2,
			       .shape = {3, 5},
			       .split_dim = -1,
			       .place = PTC_PLACE_ALL,
			       .layer = -1,
			       .tied = -1};
	int64_t shape[PTC_MAX_DIMS], outer, row;

	(void)state;
	SLICE(&t, 4, 3, 1, {0, 0, 1});
	assert_int_equal(ptc_partition_shape(&t, 4, 3, shape), 2);
	assert_int_equal(shape[0], 3);
	assert_int_equal(shape[1], 5);
	assert_int_equal(ptc_partition_elems(&t, 4, 3), 15);
	ptc_tensor_geometry(&t, &outer, &row);
	assert_int_equal(outer, 1);
	assert_int_equal(row, 15);

	/* A scalar. */
	t.ndim = 0;
	assert_int_equal(ptc_partition_shape(&t, 2, 0, shape), 0);
	assert_int_equal(ptc_partition_elems(&t, 2, 0), 1);
	ptc_tensor_geometry(&t, &outer, &row);
	assert_int_equal(outer, 1);
	assert_int_equal(row, 1);
}

static void test_partition_shapes(void **state)
{
	struct fixture f;
	int64_t shape[PTC_MAX_DIMS], outer, row;

	(void)state;
	layout_ok(&f, design_schema, "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
		  two_nodes);
	/* proj weight [64, 64] split on dim 1: [64, 32], 64 rows of 1 element. */
	const struct ptc_tensor *proj = &f.s->tensors[PROJ0];
	assert_int_equal(ptc_partition_shape(proj, 2, 1, shape), 2);
	assert_int_equal(shape[0], 64);
	assert_int_equal(shape[1], 32);
	assert_int_equal(ptc_partition_elems(proj, 2, 1), 64 * 32);
	ptc_tensor_geometry(proj, &outer, &row);
	assert_int_equal(outer, 64);
	assert_int_equal(row, 1);
	SLICE(proj, 2, 1, 32, {0, 32, 32});

	/* qkv [192, 64] on dim 0: [96, 64]; one outer block of 64-element rows. */
	const struct ptc_tensor *qkv = &f.s->tensors[QKV0 + 3];
	ptc_partition_shape(qkv, 2, 0, shape);
	assert_int_equal(shape[0], 96);
	assert_int_equal(shape[1], 64);
	ptc_tensor_geometry(qkv, &outer, &row);
	assert_int_equal(outer, 1);
	assert_int_equal(row, 64);

	/* Padded embedding [1000, 64] over 2: [512, 64] on both ranks. */
	ptc_partition_shape(&f.s->tensors[EMB], 2, 1, shape);
	assert_int_equal(shape[0], 512);
	assert_int_equal(ptc_partition_elems(&f.s->tensors[OUT], 2, 1), 512 * 64);

	/* Bias: replicated, full shape. */
	ptc_partition_shape(&f.s->tensors[BIAS0], 2, 1, shape);
	assert_int_equal(shape[0], 64);
	fixture_release(&f);

	/* A 3-d tensor split on its middle dim, unevenly: [3, 10, 5] over 4. */
	struct ptc_tensor t = {.name = "x",
			       .dtype = PTC_INT8,
			       .ndim = 3,
			       .shape = {3, 10, 5},
			       .split_dim = 1,
			       .nchunks = 1,
			       .chunks = (int64_t[]){10},
			       .place = PTC_PLACE_ALL,
			       .layer = -1,
			       .tied = -1};
	static const int64_t rows[4] = {2, 3, 2, 3};
	for (int r = 0; r < 4; r++) {
		assert_int_equal(ptc_partition_shape(&t, 4, r, shape), 3);
		assert_int_equal(shape[0], 3);
		assert_int_equal(shape[1], rows[r]);
		assert_int_equal(shape[2], 5);
		assert_int_equal(ptc_partition_elems(&t, 4, r), 3 * rows[r] * 5);
	}
	ptc_tensor_geometry(&t, &outer, &row);
	assert_int_equal(outer, 3);
	assert_int_equal(row, 5);
}

/* Property: for many sizes, chunkings, paddings and tp, the TP slices hold
 * every logical row exactly once, in chunk order, and equal local sizes when
 * padded. */
static void test_slice_cover(void **state)
{
	(void)state;
	for (int64_t n = 1; n <= 40; n++) {
		for (int tp = 1; tp <= 9; tp++) {
			for (int kind = 0; kind < 4; kind++) {
				int64_t chunks[3] = {n, 0, 0}, pad = 0;
				int nchunks = 1;
				if (kind == 1 && n % 2 == 0) {
					nchunks = 2;
					chunks[0] = chunks[1] = n / 2;
				} else if (kind == 2 && n >= 3) {
					nchunks = 3;
					chunks[0] = n - 2;
					chunks[1] = chunks[2] = 1;
				} else if (kind == 3) {
					pad = 1 + n % 5;
				}
				/* Unpadded chunks smaller than tp are refused by the layout. */
				bool fits = true;
				for (int c = 0; c < nchunks; c++)
					fits = fits && (pad || chunks[c] >= tp);
				if (!fits)
					continue;
				struct ptc_tensor t = tensor(n, nchunks, chunks, pad);
				int64_t *seen = calloc((size_t)n, sizeof(int64_t));
				int64_t total = 0, first_rows = -1;
				assert_non_null(seen);
				for (int r = 0; r < tp; r++) {
					struct ptc_slice s;
					int64_t local = 0;
					ptc_slice_compute(&t, tp, r, &s);
					assert_true(s.nsegs <= PTC_MAX_SEGS);
					for (int i = 0; i < s.nsegs; i++) {
						assert_int_equal(s.segs[i].local, local);
						assert_true(s.segs[i].len > 0);
						local += s.segs[i].len;
						if (s.segs[i].global < 0)
							continue;
						assert_true(s.segs[i].global + s.segs[i].len <= n);
						for (int64_t g = 0; g < s.segs[i].len; g++)
							seen[s.segs[i].global + g]++;
					}
					assert_int_equal(local, s.rows);
					total += s.rows;
					if (pad) {
						if (first_rows < 0)
							first_rows = s.rows;
						assert_int_equal(s.rows, first_rows);
					}
				}
				for (int64_t g = 0; g < n; g++)
					assert_int_equal(seen[g], 1);
				if (pad)
					assert_int_equal(total % (pad * tp), 0);
				else
					assert_int_equal(total, n);
				free(seen);
			}
		}
	}
}

/* ----------------------------------------------------------------- errors */

static void layout_fails_at(const char *file, int line, const char *schema_text,
			    const char *config_text, const char *exact)
{
	struct fixture f;

	fixture_init(&f, schema_text, config_text, two_nodes);
	_assert_int_equal(f.rc, -EINVAL, file, line);
	if (strcmp(f.err.text, exact) != 0) {
		print_error("%s:%d: message \"%s\"\n    want \"%s\"\n", file, line, f.err.text,
			    exact);
		_fail(file, line);
	}
	/* A failed init leaves nothing to free; release is still safe. */
	_assert_true(f.l.ranks == NULL, "ranks == NULL", file, line);
	fixture_release(&f);
}

#define LAYOUT_FAILS(schema_text, config_text, msg)                                                \
	layout_fails_at(__FILE__, __LINE__, schema_text, config_text, msg)

static void test_layout_errors(void **state)
{
	(void)state;
	LAYOUT_FAILS(design_schema,
		     "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0', 'n9']}",
		     "config.json: nodes[1] = \"n9\" is not in the cluster");
	LAYOUT_FAILS(design_schema,
		     "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 2, 'nodes': ['n0', 'n1']}",
		     "config.json: tp * pp * dp = 8 ranks exceed the 6 devices of its 2 nodes");
	LAYOUT_FAILS(design_schema, "{'version': 1, 'tp': 1, 'pp': 5, 'dp': 1, 'nodes': ['n2']}",
		     "config.json: \"pp\" = 5 exceeds the 4 layers of the schema");
	/* qkv has 192 rows, fc1 chunks 256: tp 8 fits, but the GQA chunks of 2 rows do not. */
	LAYOUT_FAILS("{'num_layers': 2, 'tensors': ["
		     "{'name': 'layers/{L}/fc1', 'dtype': 'bool', 'shape': [512],"
		     " 'split': {'dim': 0, 'chunks': 2}},"
		     "{'name': 'layers/{L}/qkv', 'dtype': 'bool', 'shape': [16, 12],"
		     " 'split': {'dim': 0, 'chunks': [8, 4, 4]}}]}",
		     "{'version': 1, 'tp': 8, 'pp': 1, 'dp': 1, 'nodes': ['n2']}",
		     "config.json: \"tp\" = 8 exceeds the 4 rows of chunk 1 of \"layers/0/qkv\" "
		     "(dim 0)");
	/* Split on dim 1 with 3 columns. */
	LAYOUT_FAILS("{'tensors': [{'name': 'w', 'dtype': 'bool', 'shape': [64, 3],"
		     " 'split': {'dim': 1}}]}",
		     "{'version': 1, 'tp': 4, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
		     "config.json: \"tp\" = 4 exceeds the 3 rows of chunk 0 of \"w\" (dim 1)");
}

static void test_layout_limits_ok(void **state)
{
	struct fixture f;

	(void)state;
	/* A padded tensor smaller than tp is fine: ranks past it hold padding. */
	layout_ok(&f,
		  "{'tensors': [{'name': 'v', 'dtype': 'bool', 'shape': [3],"
		  " 'split': {'dim': 0, 'pad_multiple': 1}}]}",
		  "{'version': 1, 'tp': 8, 'pp': 1, 'dp': 1, 'nodes': ['n2']}", two_nodes);
	SLICE(&f.s->tensors[0], 8, 2, 1, {0, 2, 1});
	SLICE(&f.s->tensors[0], 8, 3, 1, {0, -1, 1});
	fixture_release(&f);

	/* No layers: any pp, every stage empty. */
	layout_ok(&f, "{'tensors': [{'name': 'v', 'dtype': 'bool', 'shape': [3]}]}",
		  "{'version': 1, 'tp': 1, 'pp': 4, 'dp': 1, 'nodes': ['n0']}", two_nodes);
	assert_int_equal(f.l.ranks[3].p, 3);
	assert_int_equal(f.l.ranks[3].layer_end, 0);
	fixture_release(&f);

	/* pp equal to the layers, tp equal to the smallest chunk. */
	layout_ok(&f,
		  "{'num_layers': 2, 'tensors': [{'name': 'l{L}', 'dtype': 'bool', 'shape': [12],"
		  " 'split': {'dim': 0, 'chunks': [8, 2, 2]}}]}",
		  "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 2, 'nodes': ['n2']}", two_nodes);
	assert_string_equal(f.l.name, "config.json");
	assert_ptr_equal(f.l.schema, f.s);
	assert_int_equal(f.l.ranks[7].layer_begin, 1);
	assert_int_equal(f.l.ranks[7].layer_end, 2);
	fixture_release(&f);
}

static void test_too_many_partitions(void **state)
{
	static const char schema_text[] =
	    "{'num_layers': 65536, 'states': {'model': {}, 'm': {}, 'v': {}},"
	    " 'tensors': [{'name': 'l{L}', 'dtype': 'bool', 'shape': [1]}]}";
	static const char big[] = "{'nodes': [{'id': 'n0', 'devices': 4096}]}";
	struct fixture f;

	(void)state;
	/* A node's partition table has a slot per rank of the node, state and
	 * tensor: 128 ranks on one node x 3 states x 65536 tensors is 1.5 x 2^24. */
	fixture_init(&f, schema_text,
		     "{'version': 1, 'tp': 128, 'pp': 1, 'dp': 1, 'nodes': ['n0']}", big);
	assert_int_equal(f.rc, -EINVAL);
	assert_string_equal(f.err.text, "config.json: node \"n0\" hosts 128 ranks x 3 states x "
					"65536 tensors = 25165824 partitions, more than the limit "
					"16777216 per node");
	assert_null(f.l.ranks);
	fixture_release(&f);

	/* 85 ranks: 16711680 slots fit. */
	layout_ok(&f, schema_text, "{'version': 1, 'tp': 5, 'pp': 1, 'dp': 17, 'nodes': ['n0']}",
		  big);
	assert_int_equal(f.l.world, 85);
	assert_int_equal((int64_t)f.l.world * f.s->nstates * f.s->ntensors, 16711680);
	fixture_release(&f);

	/* The limit is per node: the same 128 ranks on two nodes of 64 (the
	 * world's 25165824 slots, each node's 12582912) fit; on nodes of 100
	 * and 28 devices the first node's 100 ranks do not. */
	layout_ok(&f, schema_text,
		  "{'version': 1, 'tp': 128, 'pp': 1, 'dp': 1, 'nodes': ['a', 'b']}",
		  "{'nodes': [{'id': 'a', 'devices': 64}, {'id': 'b', 'devices': 64}]}");
	assert_int_equal(f.l.world, 128);
	assert_int_equal(f.l.node_nranks[0], 64);
	assert_int_equal(f.l.node_nranks[1], 64);
	fixture_release(&f);
	fixture_init(&f, schema_text,
		     "{'version': 1, 'tp': 128, 'pp': 1, 'dp': 1, 'nodes': ['b', 'a']}",
		     "{'nodes': [{'id': 'a', 'devices': 28}, {'id': 'b', 'devices': 100}]}");
	assert_int_equal(f.rc, -EINVAL);
	assert_string_equal(f.err.text, "config.json: node \"b\" hosts 100 ranks x 3 states x "
					"65536 tensors = 19660800 partitions, more than the limit "
					"16777216 per node");
	fixture_release(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_megatron_coordinates), cmocka_unit_test(test_allocation),
	    cmocka_unit_test(test_uneven_stages),	 cmocka_unit_test(test_stage_holds),
	    cmocka_unit_test(test_slice_even),		 cmocka_unit_test(test_slice_uneven),
	    cmocka_unit_test(test_slice_chunks),	 cmocka_unit_test(test_slice_padding),
	    cmocka_unit_test(test_slice_units),		 cmocka_unit_test(test_slice_replicated),
	    cmocka_unit_test(test_partition_shapes),	 cmocka_unit_test(test_slice_cover),
	    cmocka_unit_test(test_layout_errors),	 cmocka_unit_test(test_layout_limits_ok),
	    cmocka_unit_test(test_too_many_partitions),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
