/*
 * test_gen_moe.c - the moe schema generator: exact tensors (routed and
 * shared experts, dense layers), defaults, DeepSeek-V3-size counts, plans
 * across a change of tp, and its own argument errors.
 */
#include "tests/unit/gen_fixture.h"

/* ----------------------------------------------------------------- moe */

static void test_moe_shapes(void **state)
{
	struct ptc_gen_args a = {.layers = 3,
				 .hidden = 64,
				 .heads = 8,
				 .kv_heads = 2,
				 .vocab = 1000,
				 .dtype = PTC_BFLOAT16,
				 .experts = 4,
				 .expert_ffn = 32,
				 .shared_experts = 2};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_moe(&a, &err);
	(void)state;

	assert_non_null(root);
	/* templates: embedding, 4 attention, router, 2 shared, 4 x 2 experts,
	 * final norm, output */
	assert_common(root, "moe", 3, "bfloat16", 18);
	/* attention exactly as llama's */
	assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 96, 64);
	assert_chunks(root, "layers/{L}/self_attention/query_key_value/weight", 64, 16);
	assert_unit(root, "layers/{L}/self_attention/query_key_value/weight", 8);
	assert_shape(root, "layers/{L}/post_attention_layernorm/weight", 64, 0);
	/* no dense MLP: the router, the shared MLP and the experts replace it */
	assert_null(find_tensor(root, "layers/{L}/mlp/dense_h_to_4h/weight"));
	assert_null(find_tensor(root, "layers/{L}/mlp/dense_4h_to_h/weight"));
	assert_shape(root, "layers/{L}/mlp/router/weight", 4, 64);
	assert_replicated(root, "layers/{L}/mlp/router/weight");
	/* 2 shared experts of width 32: one SwiGLU MLP of width 64 */
	assert_shape(root, "layers/{L}/mlp/shared_experts/dense_h_to_4h/weight", 128, 64);
	assert_split(root, "layers/{L}/mlp/shared_experts/dense_h_to_4h/weight", 0, 2, 0);
	assert_shape(root, "layers/{L}/mlp/shared_experts/dense_4h_to_h/weight", 64, 64);
	assert_split(root, "layers/{L}/mlp/shared_experts/dense_4h_to_h/weight", 1, 0, 0);
	for (int e = 0; e < 4; e++) {
		char up[96], down[96];

		snprintf(up, sizeof(up), "layers/{L}/mlp/experts/%d/dense_h_to_4h/weight", e);
		snprintf(down, sizeof(down), "layers/{L}/mlp/experts/%d/dense_4h_to_h/weight", e);
		assert_shape(root, up, 64, 64);
		assert_split(root, up, 0, 2, 0);
		assert_shape(root, down, 64, 32);
		assert_split(root, down, 1, 0, 0);
	}
	assert_null(find_tensor(root, "layers/{L}/mlp/experts/4/dense_h_to_4h/weight"));
	assert_parses(root, MOE_TENSORS(3, 4, 2), false);
	assert_int_equal(MOE_TENSORS(3, 4, 2), 48);

	struct ptc_schema *s = NULL;
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	int t = ptc_schema_find(s, "layers/2/mlp/experts/3/dense_4h_to_h/weight");
	assert_true(t >= 0);
	assert_int_equal(s->tensors[t].layer, 2);
	assert_int_equal(s->tensors[t].place, PTC_PLACE_LAYER);
	assert_int_equal(s->tensors[t].split_dim, 1);
	t = ptc_schema_find(s, "layers/1/mlp/router/weight");
	assert_true(t >= 0);
	assert_int_equal(s->tensors[t].layer, 1);
	assert_int_equal(s->tensors[t].split_dim, -1);
	/* each layer holds its own 15 tensors */
	for (int l = 0; l < 3; l++)
		assert_int_equal(s->layer_off[l + 1] - s->layer_off[l], 15);
	ptc_schema_free(s);
	json_decref(root);
}

/* Without shared experts there is no shared MLP; --expert-ffn defaults to
 * the dense width (--ffn, else llama's 8H/3 rounded), as Megatron-Core's. */
static void test_moe_defaults(void **state)
{
	struct ptc_gen_args a = {.layers = 2,
				 .hidden = 64,
				 .heads = 4,
				 .vocab = 100,
				 .tied = true,
				 .dtype = PTC_FLOAT32,
				 .experts = 3};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_moe(&a, &err);
	(void)state;

	assert_non_null(root);
	assert_common(root, "moe", 2, "float32", 3 + 4 + 1 + 2 * 3);
	assert_null(find_tensor(root, "layers/{L}/mlp/shared_experts/dense_h_to_4h/weight"));
	/* 8 * 64 / 3 = 170, rounded up to 256 */
	assert_shape(root, "layers/{L}/mlp/experts/2/dense_h_to_4h/weight", 512, 64);
	assert_shape(root, "layers/{L}/mlp/experts/2/dense_4h_to_h/weight", 64, 256);
	/* kv_heads 0: one per query head, chunks [64, 64, 64] */
	assert_chunks(root, "layers/{L}/self_attention/query_key_value/weight", 64, 64);
	assert_parses(root, MOE_TENSORS(2, 3, 0), true);
	json_decref(root);

	a.ffn = 100;
	assert_non_null(root = ptc_gen_moe(&a, &err));
	assert_shape(root, "layers/{L}/mlp/experts/0/dense_4h_to_h/weight", 64, 100);
	json_decref(root);
}

/* DeepSeek-V3's sizes (GQA in place of its MLA, every layer MoE): 256
 * experts of 2,048 and one shared, 61 layers: 31,662 tensors. 416 experts
 * make a 51,182-tensor schema, still under the limit; past the limit the
 * generator refuses before building anything. */
static void test_moe_deepseek_v3(void **state)
{
	struct ptc_gen_args a = {.layers = 61,
				 .hidden = 7168,
				 .heads = 128,
				 .kv_heads = 8,
				 .vocab = 129280,
				 .dtype = PTC_BFLOAT16,
				 .experts = 256,
				 .expert_ffn = 2048,
				 .shared_experts = 1};
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	json_t *root = ptc_gen_moe(&a, &err);
	(void)state;

	assert_non_null(root);
	assert_int_equal(json_array_size(json_object_get(root, "tensors")), 3 + 5 + 2 + 512);
	assert_shape(root, "layers/{L}/mlp/router/weight", 256, 7168);
	assert_shape(root, "layers/{L}/mlp/experts/255/dense_h_to_4h/weight", 4096, 7168);
	assert_parses(root, 31662, false);
	assert_int_equal(MOE_TENSORS(61, 256, 1), 31662);
	json_decref(root);

	a.experts = 416;
	assert_non_null(root = ptc_gen_moe(&a, &err));
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	assert_int_equal(s->ntensors, 51182);
	assert_true(ptc_schema_find(s, "layers/60/mlp/experts/415/dense_4h_to_h/weight") >= 0);
	ptc_schema_free(s);
	json_decref(root);

	a.experts = 1100; /* 61 x (5 + 2,200 + 2) + 3 */
	assert_null(ptc_gen_moe(&a, &err));
	assert_string_equal(err.text, "moe: \"--layers\" = 61 x \"--experts\" = 1100 expands to "
				      "134630 tensors, more than the limit 131072");
}

/* The experts split by TP like a dense MLP: a change of tp re-slices every
 * expert, and the plan moves exactly the logical bytes. */
static void test_moe_plan_tp_change(void **state)
{
	struct ptc_gen_args a = {.layers = 2,
				 .hidden = 64,
				 .heads = 8,
				 .vocab = 1000,
				 .dtype = PTC_BFLOAT16,
				 .experts = 4,
				 .expert_ffn = 32,
				 .shared_experts = 1};
	static const char ca[] = "{\"version\": 1, \"tp\": 2, \"pp\": 2, \"dp\": 1, "
				 "\"nodes\": [\"n0\"]}";
	static const char cb[] = "{\"version\": 2, \"tp\": 4, \"pp\": 1, \"dp\": 1, "
				 "\"nodes\": [\"n1\"]}";
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	struct ptc_config *fa = NULL, *fb = NULL;
	struct ptc_layout la, lb;
	struct ptc_plan *p = NULL, *pn = NULL;
	char *ids[] = {"n0", "n1"};
	struct ptc_cluster *cl = ptc_cluster_new_uniform(2, ids, 4);
	json_t *root = ptc_gen_moe(&a, &err);
	int64_t shape[PTC_MAX_DIMS];
	(void)state;

	assert_non_null(root);
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	assert_int_equal(ptc_config_parse_text(ca, strlen(ca), "a.json", &fa, &err), 0);
	assert_int_equal(ptc_config_parse_text(cb, strlen(cb), "b.json", &fb, &err), 0);
	assert_int_equal(ptc_layout_init(&la, s, fa, cl, "a.json", &err), 0);
	assert_int_equal(ptc_layout_init(&lb, s, fb, cl, "b.json", &err), 0);

	/* tp 4: each expert's gate/up rows are 8 of gate then 8 of up */
	int t = ptc_schema_find(s, "layers/1/mlp/experts/3/dense_h_to_4h/weight");
	assert_int_equal(ptc_partition_shape(&s->tensors[t], 4, 3, shape), 2);
	assert_int_equal(shape[0], 16);
	assert_int_equal(shape[1], 64);
	t = ptc_schema_find(s, "layers/0/mlp/experts/0/dense_4h_to_h/weight");
	assert_int_equal(ptc_partition_shape(&s->tensors[t], 4, 0, shape), 2);
	assert_int_equal(shape[0], 64);
	assert_int_equal(shape[1], 8);

	/* Per layer: QKV 192 x 64, projection 64 x 64, two norms of 64, router
	 * 4 x 64, shared MLP 64 x 64 + 64 x 32, four experts of the same:
	 * 12,288 + 4,096 + 128 + 256 + 6,144 + 24,576 = 47,488 elements; two
	 * layers, two 1,000 x 64 embeddings and the final norm: 223,040, at 2 +
	 * 4 + 4 bytes (bf16 weights, fp32 moments). All move from n0 to n1. */
	assert_int_equal(ptc_plan_compute(&la, &lb, NULL, 0, &p, &err), 0);
	assert_int_equal(p->lower_bound_network, 2230400);
	assert_int_equal(p->bytes_network, 2230400);
	assert_int_equal(p->per_node[1].bytes_in, 2230400);
	assert_int_equal(p->per_node[0].bytes_out, 2230400);
	/* vocabulary padded to 1,024 rows at tp 4 (128 x 4): 24 zero rows in each
	 * of the two embeddings */
	assert_int_equal(p->bytes_zero, 2 * 24 * 64 * 10);
	/* the replicated tensors (norms, routers, final norm: 832 elements)
	 * are fetched once and copied to n1's three other ranks */
	assert_int_equal(p->bytes_local, 3 * 832 * 10);
	assert_int_equal(p->bytes_total, 2230400 + 3 * 832 * 10 + 2 * 24 * 64 * 10);

	/* n1's own plan finds the same bytes, as its daemon would */
	assert_int_equal(ptc_plan_compute_node(&la, &lb, NULL, 0, NULL, 1, &pn, &err), 0);
	assert_int_equal(pn->per_node[1].bytes_in, 2230400);
	assert_int_equal(pn->per_node[1].bytes_total, p->per_node[1].bytes_total);
	assert_int_equal(pn->nops, p->node_first_op[2] - p->node_first_op[1]);

	ptc_plan_free(pn);
	ptc_plan_free(p);
	ptc_layout_release(&lb);
	ptc_layout_release(&la);
	ptc_config_free(fb);
	ptc_config_free(fa);
	ptc_cluster_free(cl);
	ptc_schema_free(s);

	/* a tp the experts' rows cannot feed is refused, naming the first */
	a.expert_ffn = 2;
	a.shared_experts = 0;
	json_decref(root);
	assert_non_null(root = ptc_gen_moe(&a, &err));
	assert_layout(
	    root, "{\"version\": 1, \"tp\": 2, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}", NULL);
	assert_layout(root,
		      "{\"version\": 1, \"tp\": 4, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}",
		      "config.json: \"tp\" = 4 exceeds the 2 rows of chunk 0 of "
		      "\"layers/0/mlp/experts/0/dense_h_to_4h/weight\" (dim 0)");
	json_decref(root);
}

static void test_moe_bad_args(void **state)
{
	static const struct ptc_gen_args ok = {.layers = 2,
					       .hidden = 64,
					       .heads = 8,
					       .kv_heads = 2,
					       .vocab = 100,
					       .dtype = PTC_BFLOAT16,
					       .experts = 8,
					       .expert_ffn = 16};
	static const struct {
		int experts, expert_ffn, shared, dense, kv_heads;
		const char *msg;
	} bad[] = {
	    {0, 16, 0, 0, 2, "moe: \"--experts\" = 0 is less than 1"},
	    {-8, 16, 0, 0, 2, "moe: \"--experts\" = -8 is less than 1"},
	    {8, -1, 0, 0, 2, "moe: \"--expert-ffn\" = -1 is less than 0"},
	    {8, 16, -1, 0, 2, "moe: \"--shared-experts\" = -1 is less than 0"},
	    {8, 16, 0, -1, 2, "moe: \"--dense-layers\" = -1 is less than 0"},
	    {8, 16, 1, 3, 2,
	     "moe: \"--dense-layers\" = 3 is not supported: every {L} tensor is in every "
	     "layer, so a schema cannot give the first layers a dense MLP"},
	    /* llama's checks first */
	    {0, 16, 0, 0, 3, "moe: \"--kv-heads\" = 3 does not divide \"--heads\" = 8"},
	};
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct ptc_gen_args a = ok;
		struct ptc_error err = {.text = ""};

		a.experts = bad[i].experts;
		a.expert_ffn = bad[i].expert_ffn;
		a.shared_experts = bad[i].shared;
		a.dense_layers = bad[i].dense;
		a.kv_heads = bad[i].kv_heads;
		assert_null(ptc_gen_moe(&a, &err));
		assert_string_equal(err.text, bad[i].msg);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_moe_shapes),	    cmocka_unit_test(test_moe_defaults),
	    cmocka_unit_test(test_moe_deepseek_v3), cmocka_unit_test(test_moe_plan_tp_change),
	    cmocka_unit_test(test_moe_bad_args),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
