/*
 * test_gen.c - schema generators: exact tensors, defaults, ties, argument
 * errors, and that every generated schema parses with the expected count;
 * for moe also DeepSeek-V3-size counts and plans across a change of tp.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ptc/ptc.h"

typedef json_t *gen_fn(const struct ptc_gen_args *a, struct ptc_error *err);

/* The template named @name, or NULL. */
static json_t *find_tensor(const json_t *root, const char *name)
{
	size_t i;
	json_t *t;

	json_array_foreach(json_object_get(root, "tensors"), i,
			   t) if (strcmp(json_string_value(json_object_get(t, "name")), name) ==
				  0) return t;
	return NULL;
}

static json_t *tensor(const json_t *root, const char *name)
{
	json_t *t = find_tensor(root, name);

	if (!t)
		fail_msg("no tensor \"%s\"", name);
	return t;
}

/* Asserts @name has shape [d0] (d1 = 0) or [d0, d1]. */
static void assert_shape(const json_t *root, const char *name, json_int_t d0, json_int_t d1)
{
	json_t *shape = json_object_get(tensor(root, name), "shape");

	assert_int_equal(json_array_size(shape), d1 ? 2 : 1);
	assert_int_equal(json_integer_value(json_array_get(shape, 0)), d0);
	if (d1)
		assert_int_equal(json_integer_value(json_array_get(shape, 1)), d1);
}

/* Asserts @name splits along @dim, with integer @chunks (0: absent) and @pad (0: absent). */
static void assert_split(const json_t *root, const char *name, int dim, int chunks, int pad)
{
	json_t *split = json_object_get(tensor(root, name), "split");

	assert_non_null(split);
	assert_int_equal(json_integer_value(json_object_get(split, "dim")), dim);
	if (chunks)
		assert_int_equal(json_integer_value(json_object_get(split, "chunks")), chunks);
	else
		assert_null(json_object_get(split, "chunks"));
	if (pad)
		assert_int_equal(json_integer_value(json_object_get(split, "pad_multiple")), pad);
	else
		assert_null(json_object_get(split, "pad_multiple"));
	assert_int_equal(json_object_size(split),
			 1 + !!chunks + !!pad + !!json_object_get(split, "unit"));
}

/* Asserts @name keeps heads of @unit rows whole ("split": {"unit"}). */
static void assert_unit(const json_t *root, const char *name, int unit)
{
	json_t *split = json_object_get(tensor(root, name), "split");
	assert_int_equal(json_integer_value(json_object_get(split, "unit")), unit);
}

/* Asserts the layout of @cfg (a config's text) over @root's schema fails
 * naming @want, or succeeds (@want NULL). */
static void assert_layout(const json_t *root, const char *cfg, const char *want)
{
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	struct ptc_config *c = NULL;
	struct ptc_layout l;
	char *ids[] = {"n0"};
	struct ptc_cluster *cl = ptc_cluster_new_uniform(1, ids, 64);

	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	assert_int_equal(ptc_config_parse_text(cfg, strlen(cfg), "config.json", &c, &err), 0);
	int rc = ptc_layout_init(&l, s, c, cl, "config.json", &err);
	if (want) {
		assert_int_equal(rc, -EINVAL);
		assert_string_equal(err.text, want);
	} else {
		assert_int_equal(rc, 0);
		ptc_layout_release(&l);
	}
	ptc_config_free(c);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

static void assert_replicated(const json_t *root, const char *name)
{
	assert_null(json_object_get(tensor(root, name), "split"));
}

static void assert_place(const json_t *root, const char *name, const char *place)
{
	assert_string_equal(json_string_value(json_object_get(tensor(root, name), "place")), place);
}

/* Checks the parts every generated schema shares. */
static void assert_common(const json_t *root, const char *model, int layers, const char *dtype,
			  size_t ntemplates)
{
	json_t *states = json_object_get(root, "states"), *t;
	size_t i;

	assert_string_equal(json_string_value(json_object_get(root, "model")), model);
	assert_int_equal(json_integer_value(json_object_get(root, "num_layers")), layers);
	assert_true(json_is_integer(json_object_get(root, "num_layers")));
	assert_int_equal(json_object_size(states), 3);
	assert_int_equal(json_object_size(json_object_get(states, "model")), 0);
	assert_string_equal(
	    json_string_value(json_object_get(json_object_get(states, "optim/exp_avg"), "dtype")),
	    "float32");
	assert_string_equal(json_string_value(json_object_get(
				json_object_get(states, "optim/exp_avg_sq"), "dtype")),
			    "float32");
	assert_int_equal(json_array_size(json_object_get(root, "tensors")), ntemplates);
	json_array_foreach(json_object_get(root, "tensors"), i, t)
	{
		const char *name = json_string_value(json_object_get(t, "name"));
		assert_string_equal(json_string_value(json_object_get(t, "dtype")), dtype);
		if (strstr(name, "{L}"))
			assert_null(json_object_get(t, "place"));
		else
			assert_non_null(json_object_get(t, "place"));
	}
	assert_split(root, "embedding/word_embeddings/weight", 0, 0, 128);
	assert_place(root, "embedding/word_embeddings/weight", "first");
	assert_split(root, "output_layer/weight", 0, 0, 128);
	assert_place(root, "output_layer/weight", "last");
	assert_place(root, "final_layernorm/weight", "last");
}

/* Parses @root, from the object and from its text, and checks the expansion. */
static void assert_parses(const json_t *root, int ntensors, bool tied)
{
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	char *text = json_dumps(root, 0);

	assert_non_null(text);
	assert_int_equal(ptc_schema_parse_text(text, strlen(text), "schema.json", &s, &err), 0);
	assert_string_equal(err.text, "");
	ptc_schema_free(s);
	free(text);

	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), 0);
	assert_int_equal(s->ntensors, ntensors);
	assert_int_equal(s->nstates, 3);
	int st = ptc_schema_find_state(s, "optim/exp_avg_sq");
	int emb = ptc_schema_find(s, "embedding/word_embeddings/weight");
	int out = ptc_schema_find(s, "output_layer/weight");
	assert_true(st >= 0 && emb >= 0 && out >= 0);
	assert_int_equal(ptc_schema_dtype(s, st, emb), PTC_FLOAT32);
	assert_int_equal(s->tensors[out].tied, tied ? emb : -1);
	assert_int_equal(s->tensors[emb].place, PTC_PLACE_FIRST);
	assert_int_equal(s->tensors[out].place, PTC_PLACE_LAST);
	ptc_schema_free(s);
}

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

static void assert_chunks(const json_t *root, const char *name, json_int_t q, json_int_t kv)
{
	json_t *ch = json_object_get(json_object_get(tensor(root, name), "split"), "chunks");

	assert_int_equal(json_array_size(ch), 3);
	assert_int_equal(json_integer_value(json_array_get(ch, 0)), q);
	assert_int_equal(json_integer_value(json_array_get(ch, 1)), kv);
	assert_int_equal(json_integer_value(json_array_get(ch, 2)), kv);
}

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

/* ----------------------------------------------------------------- moe */

/* Tensors: 3 outside layers; per layer 4 of attention, the router, 2 per
 * routed expert and 2 for the shared MLP when there is one. */
#define MOE_TENSORS(l, e, s) (3 + (l) * (5 + 2 * (e) + ((s) ? 2 : 0)))

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
	    cmocka_unit_test(test_gpt_defaults),
	    cmocka_unit_test(test_gpt_gqa),
	    cmocka_unit_test(test_gpt_tied_custom),
	    cmocka_unit_test(test_llama_gqa),
	    cmocka_unit_test(test_llama_sizes),
	    cmocka_unit_test(test_llama_explicit_ffn),
	    cmocka_unit_test(test_bad_args),
	    cmocka_unit_test(test_bad_kv_heads),
	    cmocka_unit_test(test_out_of_memory),
	    cmocka_unit_test(test_moe_shapes),
	    cmocka_unit_test(test_moe_defaults),
	    cmocka_unit_test(test_moe_deepseek_v3),
	    cmocka_unit_test(test_moe_plan_tp_change),
	    cmocka_unit_test(test_moe_bad_args),
	    cmocka_unit_test(test_dense_refuse_moe_flags),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
