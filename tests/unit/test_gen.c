/*
 * test_gen.c - schema generators: exact tensors, defaults, ties, argument
 * errors, out of memory, and that every generated schema parses with the
 * expected count, for megatron-gpt and llama; argument errors and out of
 * memory for moe too. test_gen_moe.c has the rest of moe.
 */
#include "tests/unit/gen_fixture.h"

typedef json_t *gen_fn(const struct ptc_gen_args *a, struct ptc_error *err);

/* ----------------------------------------------------------------- gpt */

/* Templates: 2 embeddings, 12 per layer, 2 final norms, 1 output. */
#define GPT_TEMPLATES  17
#define GPT_TENSORS(l) (5 + 12 * (l))

static void test_gpt_defaults(void **state)
{
	struct ptc_gen_args a = {
	    .layers = 2, .hidden = 64, .heads = 4, .vocab = 1000, .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_megatron_gpt(&a, &err);
	(void)state;

	assert_non_null(root);
	assert_common(root, "megatron-gpt", 2, "bfloat16", GPT_TEMPLATES);
	assert_shape(root, "embedding/word_embeddings/weight", 1000, 64);
	assert_shape(root, "embedding/position_embeddings/weight", 2048, 64);
	assert_replicated(root, "embedding/position_embeddings/weight");
	assert_place(root, "embedding/position_embeddings/weight", "first");
	assert_shape(root, "layers/{L}/input_layernorm/weight", 64, 0);
	assert_replicated(root, "layers/{L}/input_layernorm/bias");
	assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 192, 64);
	/* Megatron-Core's fused QKV: interleaved per query group (here 4 groups
	 * of one query, one key and one value head of 16 rows), no chunks: a TP
	 * rank holds the contiguous rows of its groups. */
	assert_split(root, "layers/{L}/self_attention/query_key_value/weight", 0, 0, 0);
	assert_shape(root, "layers/{L}/self_attention/query_key_value/bias", 192, 0);
	assert_split(root, "layers/{L}/self_attention/query_key_value/bias", 0, 0, 0);
	assert_shape(root, "layers/{L}/self_attention/dense/weight", 64, 64);
	assert_split(root, "layers/{L}/self_attention/dense/weight", 1, 0, 0);
	/* groups of 3 x 16 rows and heads of 16 stay whole: tp 4 fits, tp 8 would
	 * cut them */
	assert_unit(root, "layers/{L}/self_attention/query_key_value/weight", 48);
	assert_unit(root, "layers/{L}/self_attention/query_key_value/bias", 48);
	assert_unit(root, "layers/{L}/self_attention/dense/weight", 16);
	assert_layout(
	    root, "{\"version\": 1, \"tp\": 4, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}", NULL);
	assert_layout(root,
		      "{\"version\": 1, \"tp\": 8, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}",
		      "config.json: \"tp\" = 8 exceeds the 4 units of 48 rows (heads) of chunk 0 "
		      "of \"layers/0/self_attention/query_key_value/weight\" (dim 0): a unit is "
		      "never cut");
	assert_replicated(root, "layers/{L}/self_attention/dense/bias");
	assert_shape(root, "layers/{L}/post_attention_layernorm/bias", 64, 0);
	assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/weight", 256, 64);
	assert_split(root, "layers/{L}/mlp/dense_h_to_4h/weight", 0, 0, 0);
	assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/bias", 256, 0);
	assert_split(root, "layers/{L}/mlp/dense_h_to_4h/bias", 0, 0, 0);
	assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/weight", 64, 256);
	assert_split(root, "layers/{L}/mlp/dense_4h_to_h/weight", 1, 0, 0);
	assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/bias", 64, 0);
	assert_replicated(root, "layers/{L}/mlp/dense_4h_to_h/bias");
	assert_place(root, "final_layernorm/bias", "last");
	assert_shape(root, "output_layer/weight", 1000, 64);
	assert_null(json_object_get(tensor(root, "output_layer/weight"), "tied"));
	assert_parses(root, GPT_TENSORS(2), false);
	json_decref(root);
}

/* --kv-heads: Megatron-Core's GQA QKV, [ng, (np/ng + 2) * hn, h]; a TP split
 * is by whole groups. */
static void test_gpt_gqa(void **state)
{
	struct ptc_gen_args a = {.layers = 1,
				 .hidden = 64,
				 .heads = 8,
				 .kv_heads = 2,
				 .vocab = 100,
				 .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_megatron_gpt(&a, &err);
	(void)state;

	assert_non_null(root);
	/* 8 query heads and 2 x 2 key/value heads of 8 rows; groups of 6 heads */
	assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 96, 64);
	assert_split(root, "layers/{L}/self_attention/query_key_value/weight", 0, 0, 0);
	assert_unit(root, "layers/{L}/self_attention/query_key_value/weight", 48);
	assert_shape(root, "layers/{L}/self_attention/query_key_value/bias", 96, 0);
	assert_layout(
	    root, "{\"version\": 1, \"tp\": 2, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}", NULL);
	assert_layout(root,
		      "{\"version\": 1, \"tp\": 4, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}",
		      "config.json: \"tp\" = 4 exceeds the 2 units of 48 rows (heads) of chunk 0 "
		      "of \"layers/0/self_attention/query_key_value/weight\" (dim 0): a unit is "
		      "never cut");
	json_decref(root);
	a.kv_heads = 3;
	assert_null(ptc_gen_megatron_gpt(&a, &err));
	assert_non_null(strstr(err.text, "--kv-heads"));
}

static void test_gpt_tied_custom(void **state)
{
	struct ptc_gen_args a = {.layers = 3,
				 .hidden = 96,
				 .heads = 12,
				 .vocab = 50257,
				 .ffn = 100,
				 .seq = 128,
				 .tied = true,
				 .dtype = PTC_FLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_megatron_gpt(&a, &err);
	(void)state;

	assert_non_null(root);
	assert_common(root, "megatron-gpt", 3, "float16", GPT_TEMPLATES);
	assert_shape(root, "embedding/position_embeddings/weight", 128, 96);
	assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 288, 96);
	assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/weight", 100, 96);
	assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/weight", 96, 100);
	assert_shape(root, "output_layer/weight", 50257, 96);
	assert_string_equal(
	    json_string_value(json_object_get(tensor(root, "output_layer/weight"), "tied")),
	    "embedding/word_embeddings/weight");
	assert_parses(root, GPT_TENSORS(3), true);
	json_decref(root);
}

/* --------------------------------------------------------------- llama */

/* Templates: 1 embedding, 6 per layer, 1 final norm, 1 output. */
#define LLAMA_TEMPLATES	 9
#define LLAMA_TENSORS(l) (3 + 6 * (l))

static void test_llama_gqa(void **state)
{
	struct ptc_gen_args a = {.layers = 3,
				 .hidden = 64,
				 .heads = 8,
				 .kv_heads = 2,
				 .vocab = 32000,
				 .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_llama(&a, &err), *t;
	size_t i;
	(void)state;

	assert_non_null(root);
	assert_common(root, "llama", 3, "bfloat16", LLAMA_TEMPLATES);
	json_array_foreach(json_object_get(root, "tensors"), i, t)
	{
		const char *name = json_string_value(json_object_get(t, "name"));
		assert_null(strstr(name, "bias"));
		assert_null(strstr(name, "position"));
	}
	assert_shape(root, "embedding/word_embeddings/weight", 32000, 64);
	assert_shape(root, "layers/{L}/input_layernorm/weight", 64, 0);
	/* head size 8: q 8 * 8 = 64 rows, k and v 2 * 8 = 16 rows each */
	assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 96, 64);
	assert_chunks(root, "layers/{L}/self_attention/query_key_value/weight", 64, 16);
	/* Heads of 8 rows stay whole: 2 KV heads admit tp 2, not tp 4 (Megatron
	 * requires the query groups to divide among TP ranks too). */
	assert_unit(root, "layers/{L}/self_attention/query_key_value/weight", 8);
	assert_unit(root, "layers/{L}/self_attention/dense/weight", 8);
	assert_layout(
	    root, "{\"version\": 1, \"tp\": 2, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}", NULL);
	assert_layout(root,
		      "{\"version\": 1, \"tp\": 4, \"pp\": 1, \"dp\": 1, \"nodes\": [\"n0\"]}",
		      "config.json: \"tp\" = 4 exceeds the 2 units of 8 rows (heads) of chunk 1 "
		      "of \"layers/0/self_attention/query_key_value/weight\" (dim 0): a unit is "
		      "never cut");
	assert_shape(root, "layers/{L}/self_attention/dense/weight", 64, 64);
	assert_split(root, "layers/{L}/self_attention/dense/weight", 1, 0, 0);
	assert_shape(root, "layers/{L}/post_attention_layernorm/weight", 64, 0);
	/* ffn: 8 * 64 / 3 = 170, rounded up to 256 */
	assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/weight", 512, 64);
	assert_split(root, "layers/{L}/mlp/dense_h_to_4h/weight", 0, 2, 0);
	assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/weight", 64, 256);
	assert_split(root, "layers/{L}/mlp/dense_4h_to_h/weight", 1, 0, 0);
	assert_shape(root, "final_layernorm/weight", 64, 0);
	assert_null(json_object_get(tensor(root, "output_layer/weight"), "tied"));
	assert_parses(root, LLAMA_TENSORS(3), false);

	struct ptc_schema *s = NULL;
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	int qkv = ptc_schema_find(s, "layers/2/self_attention/query_key_value/weight");
	assert_true(qkv >= 0);
	assert_int_equal(s->tensors[qkv].layer, 2);
	assert_int_equal(s->tensors[qkv].nchunks, 3);
	assert_int_equal(s->tensors[qkv].chunks[0], 64);
	assert_int_equal(s->tensors[qkv].chunks[1], 16);
	assert_int_equal(s->tensors[qkv].chunks[2], 16);
	ptc_schema_free(s);
	json_decref(root);
}

/* LLaMA 7B, 13B and 65B: kv_heads 0 means one per query head; published ffn widths. */
static void test_llama_sizes(void **state)
{
	static const struct {
		int layers, hidden, heads;
		json_int_t ffn;
	} sizes[] = {{32, 4096, 32, 11008}, {40, 5120, 40, 13824}, {80, 8192, 64, 22016}};
	(void)state;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		struct ptc_gen_args a = {.layers = sizes[i].layers,
					 .hidden = sizes[i].hidden,
					 .heads = sizes[i].heads,
					 .vocab = 32000,
					 .tied = true,
					 .dtype = PTC_FLOAT32};
		struct ptc_error err = {.text = ""};
		json_t *root = ptc_gen_llama(&a, &err);
		json_int_t h = sizes[i].hidden;

		assert_non_null(root);
		assert_common(root, "llama", sizes[i].layers, "float32", LLAMA_TEMPLATES);
		assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/weight", 2 * sizes[i].ffn, h);
		assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/weight", h, sizes[i].ffn);
		assert_shape(root, "layers/{L}/self_attention/query_key_value/weight", 3 * h, h);
		assert_chunks(root, "layers/{L}/self_attention/query_key_value/weight", h, h);
		assert_string_equal(
		    json_string_value(json_object_get(tensor(root, "output_layer/weight"), "tied")),
		    "embedding/word_embeddings/weight");
		assert_parses(root, LLAMA_TENSORS(sizes[i].layers), true);
		json_decref(root);
	}
}

static void test_llama_explicit_ffn(void **state)
{
	struct ptc_gen_args a = {.layers = 1,
				 .hidden = 32,
				 .heads = 4,
				 .kv_heads = 4,
				 .vocab = 7,
				 .ffn = 90,
				 .seq = 4096,
				 .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *root = ptc_gen_llama(&a, &err);
	(void)state;

	assert_non_null(root);
	assert_shape(root, "layers/{L}/mlp/dense_h_to_4h/weight", 180, 32);
	assert_shape(root, "layers/{L}/mlp/dense_4h_to_h/weight", 32, 90);
	assert_chunks(root, "layers/{L}/self_attention/query_key_value/weight", 32, 32);
	assert_parses(root, LLAMA_TENSORS(1), false);
	json_decref(root);
}

/* ---------------------------------------------------------- bad arguments */

static void test_bad_args(void **state)
{
	static const struct ptc_gen_args ok = {.layers = 2,
					       .hidden = 64,
					       .heads = 8,
					       .kv_heads = 2,
					       .vocab = 100,
					       .dtype = PTC_BFLOAT16};
	struct ptc_gen_args bad[16];
	const char *msg[16];
	int n = 0;
	(void)state;

#define BAD(field, value, text)                                                                    \
	do {                                                                                       \
		bad[n] = ok;                                                                       \
		bad[n].field = value;                                                              \
		msg[n++] = text;                                                                   \
	} while (0)
	BAD(layers, 0, "\"--layers\" = 0 is less than 1");
	BAD(hidden, 0, "\"--hidden\" = 0 is less than 1");
	BAD(hidden, -64, "\"--hidden\" = -64 is less than 1");
	BAD(heads, 0, "\"--heads\" = 0 is less than 1");
	BAD(heads, 5, "\"--heads\" = 5 does not divide \"--hidden\" = 64");
	BAD(vocab, 0, "\"--vocab\" = 0 is less than 1");
	BAD(ffn, -1, "\"--ffn\" = -1 is less than 0");
	BAD(seq, -2048, "\"--seq\" = -2048 is less than 0");
	BAD(dtype, PTC_DTYPE_COUNT, "\"--dtype\" = 12 is not a known dtype");
#undef BAD
	static gen_fn *const fns[] = {ptc_gen_megatron_gpt, ptc_gen_llama, ptc_gen_moe};
	static const char *const models[] = {"megatron-gpt", "llama", "moe"};

	for (int m = 0; m < 3; m++) {
		for (int i = 0; i < n; i++) {
			struct ptc_error err = {.text = ""};
			char want[PTC_ERROR_MAX];

			snprintf(want, sizeof(want), "%s: %s", models[m], msg[i]);
			bad[i].experts = m == 2 ? 4 : 0;
			assert_null(fns[m](&bad[i], &err));
			assert_string_equal(err.text, want);
		}
		struct ptc_error err = {.text = ""};
		struct ptc_gen_args a = ok;
		a.experts = m == 2 ? 4 : 0;
		json_t *root = fns[m](&a, &err);
		assert_non_null(root);
		assert_string_equal(err.text, "");
		json_decref(root);
	}
}

/* The dense models refuse the moe flags instead of ignoring them. */
static void test_dense_refuse_moe_flags(void **state)
{
	static const struct ptc_gen_args ok = {
	    .layers = 2, .hidden = 64, .heads = 8, .vocab = 100, .dtype = PTC_BFLOAT16};
	static const char *const flags[] = {"--experts", "--expert-ffn", "--shared-experts",
					    "--dense-layers"};
	static gen_fn *const fns[] = {ptc_gen_megatron_gpt, ptc_gen_llama};
	static const char *const models[] = {"megatron-gpt", "llama"};
	struct ptc_gen_args a[4] = {ok, ok, ok, ok};
	(void)state;

	a[0].experts = 8;
	a[1].expert_ffn = 32;
	a[2].shared_experts = 1;
	a[3].dense_layers = 1;
	for (int m = 0; m < 2; m++)
		for (int i = 0; i < 4; i++) {
			struct ptc_error err = {.text = ""};
			char want[PTC_ERROR_MAX];

			snprintf(want, sizeof(want), "%s: \"%s\" is for moe only", models[m],
				 flags[i]);
			assert_null(fns[m](&a[i], &err));
			assert_string_equal(err.text, want);
		}
}

static void test_bad_kv_heads(void **state)
{
	struct ptc_gen_args a = {.layers = 2,
				 .hidden = 64,
				 .heads = 8,
				 .kv_heads = 3,
				 .vocab = 100,
				 .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	(void)state;

	assert_null(ptc_gen_llama(&a, &err));
	assert_string_equal(err.text, "llama: \"--kv-heads\" = 3 does not divide \"--heads\" = 8");
	a.kv_heads = -1;
	assert_null(ptc_gen_llama(&a, &err));
	assert_string_equal(err.text, "llama: \"--kv-heads\" = -1 is less than 0");
	a.kv_heads = 16;
	assert_null(ptc_gen_llama(&a, &err));
	assert_string_equal(err.text, "llama: \"--kv-heads\" = 16 does not divide \"--heads\" = 8");
	/* common checks come first: the flag named is the first bad one */
	a.kv_heads = 3;
	a.layers = 0;
	assert_null(ptc_gen_llama(&a, &err));
	assert_string_equal(err.text, "llama: \"--layers\" = 0 is less than 1");
}

/* ------------------------------------------------------- out of memory */

static int allocs_left;

static void *failing_malloc(size_t n)
{
	return allocs_left-- > 0 ? malloc(n) : NULL;
}

/* Every failed jansson allocation gives NULL and "out of memory", never a
 * partial schema; leaks show under `make SANITIZE=address`. */
static void test_out_of_memory(void **state)
{
	struct ptc_gen_args a = {.layers = 2,
				 .hidden = 64,
				 .heads = 8,
				 .kv_heads = 2,
				 .vocab = 100,
				 .tied = true,
				 .dtype = PTC_BFLOAT16};
	static gen_fn *const fns[] = {ptc_gen_megatron_gpt, ptc_gen_llama, ptc_gen_moe};
	static const char *const want[] = {"megatron-gpt: out of memory", "llama: out of memory",
					   "moe: out of memory"};
	static const int ntensors[] = {GPT_TENSORS(2), LLAMA_TENSORS(2), MOE_TENSORS(2, 4, 1)};
	(void)state;

	for (int m = 0; m < 3; m++) {
		json_t *root = NULL;
		int limit;

		for (limit = 0; !root; limit++) {
			struct ptc_error err = {.text = ""};

			allocs_left = limit;
			a.experts = m == 2 ? 4 : 0;
			a.shared_experts = m == 2 ? 1 : 0;
			json_set_alloc_funcs(failing_malloc, free);
			root = fns[m](&a, &err);
			json_set_alloc_funcs(malloc, free);
			if (!root)
				assert_string_equal(err.text, want[m]);
		}
		assert_true(limit > 50);
		assert_parses(root, ntensors[m], true);
		json_decref(root);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_gpt_defaults),    cmocka_unit_test(test_gpt_gqa),
	    cmocka_unit_test(test_gpt_tied_custom), cmocka_unit_test(test_llama_gqa),
	    cmocka_unit_test(test_llama_sizes),	    cmocka_unit_test(test_llama_explicit_ffn),
	    cmocka_unit_test(test_bad_args),	    cmocka_unit_test(test_bad_kv_heads),
	    cmocka_unit_test(test_out_of_memory),   cmocka_unit_test(test_dense_refuse_moe_flags),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
