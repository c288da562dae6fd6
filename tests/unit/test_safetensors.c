/*
 * test_safetensors.c - safetensors headers and name maps (ptc/ptc_safetensors.c,
 * ptc/ptc_hfnames.c).
 *
 * The writer's bytes are compared with a header written out by hand; the
 * parser is given every kind of bad header an adversary can make and must
 * name the tensor and the cause; the Hugging Face maps are checked against
 * the schemas the generators make (q/k/v rows at the chunks' offsets,
 * GPT-2's columns interleaved per head), and scatter then gather must give
 * back the outside bytes.
 */
#include <stdbool.h>

#include "tests/unit/unit.h"

/* A file of @json's header (single quotes) and @data bytes of data. */
static uint8_t *st_file(const char *json, size_t data, size_t *len)
{
	char *j = unit_json(json);
	size_t n = strlen(j);
	uint8_t *f = calloc(1, 8 + n + data + 1);
	assert_non_null(f);
	for (int i = 0; i < 8; i++)
		f[i] = (uint8_t)(n >> (8 * i));
	memcpy(f + 8, j, n);
	free(j);
	*len = 8 + n + data;
	return f;
}

/* Parses a file of @json and @data bytes: its rc, message in @err. */
static int st_parse(const char *json, size_t data, struct ptc_st_header *h, struct ptc_error *err)
{
	size_t len, need = 0;
	uint8_t *f = st_file(json, data, &len);
	int rc = ptc_st_parse(f, len, len, h, &need, err);
	free(f);
	return rc;
}

#define ST_FAILS(json, data, want)                                                                 \
	do {                                                                                       \
		struct ptc_st_header h_ = {0};                                                     \
		struct ptc_error e_ = {.text = ""};                                                \
		assert_int_equal(st_parse(json, data, &h_, &e_), -EINVAL);                         \
		assert_string_equal(e_.text, want);                                                \
		assert_int_equal(e_.code, -EINVAL);                                                \
	} while (0)

static void test_dtype_names(void **state)
{
	(void)state;
	for (int i = 0; i < PTC_DTYPE_COUNT; i++) {
		enum ptc_dtype dt;
		assert_int_equal(ptc_st_dtype_parse(ptc_st_dtype_name(i), &dt), 0);
		assert_int_equal(dt, i);
	}
	assert_string_equal(ptc_st_dtype_name(PTC_BFLOAT16), "BF16");
	assert_string_equal(ptc_st_dtype_name(PTC_FLOAT8_E4M3FN), "F8_E4M3");
	enum ptc_dtype dt;
	assert_int_equal(ptc_st_dtype_parse("C64", &dt), -EINVAL);
}

static void test_format_canonical(void **state)
{
	struct ptc_st_tensor t[2] = {
	    {.name = "a/w", .dtype = PTC_BFLOAT16, .ndim = 2, .shape = {2, 3}},
	    {.name = "b", .dtype = PTC_FLOAT32, .ndim = 0},
	};
	const char *json = "{\"__metadata__\":{\"format\":\"pt\"},\"a/w\":{\"dtype\":\"BF16\","
			   "\"shape\":[2,3],\"data_offsets\":[0,12]},\"b\":{\"dtype\":\"F32\","
			   "\"shape\":[],\"data_offsets\":[12,16]}}";
	size_t len, jl = strlen(json), pad = (8 - jl % 8) % 8;
	(void)state;

	uint8_t *h = ptc_st_format(t, 2, &len);
	assert_non_null(h);
	assert_int_equal(len, 8 + jl + pad);
	assert_int_equal(len % 8, 0);
	assert_int_equal(h[0], jl + pad);
	assert_memory_equal(h + 8, json, jl);
	for (size_t i = 8 + jl; i < len; i++)
		assert_int_equal(h[i], ' ');
	assert_int_equal(t[1].begin, 12);
	assert_int_equal(t[1].end, 16);

	/* It parses back, in data order, with 16 data bytes after it. */
	uint8_t *f = calloc(1, len + 16);
	memcpy(f, h, len);
	struct ptc_st_header ph;
	struct ptc_error err = {.text = ""};
	size_t need;
	assert_int_equal(ptc_st_parse(f, 8, len + 16, &ph, &need, &err), -EAGAIN);
	assert_int_equal(need, len);
	assert_int_equal(ptc_st_parse(f, len, len + 16, &ph, &need, &err), 0);
	assert_int_equal(ph.n, 2);
	assert_string_equal(ph.t[0].name, "a/w");
	assert_int_equal(ph.t[0].dtype, PTC_BFLOAT16);
	assert_int_equal(ph.t[0].shape[1], 3);
	assert_int_equal(ph.t[1].ndim, 0);
	assert_int_equal(ph.data_start, (int64_t)len);
	assert_int_equal(ph.data_len, 16);
	ptc_st_header_release(&ph);
	free(f);
	free(h);
}

static void test_parse_refusals(void **state)
{
	struct ptc_st_header h = {0};
	struct ptc_error err = {.text = ""};
	size_t need;
	uint8_t big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
	(void)state;

	assert_int_equal(ptc_st_parse(big, 4, 4, &h, &need, &err), -EINVAL);
	assert_string_equal(err.text, "4 bytes: shorter than a header");
	assert_int_equal(ptc_st_parse(big, 16, 16, &h, &need, &err), -EINVAL);
	assert_string_equal(err.text, "header length 9223372036854775807 exceeds the limit "
				      "(104857600)");
	memset(big, 0, sizeof(big));
	big[0] = 9;
	assert_int_equal(ptc_st_parse(big, 16, 16, &h, &need, &err), -EINVAL);
	assert_string_equal(err.text, "header length 9 exceeds the file (8)");

	ST_FAILS("[1]", 0, "the header is not a JSON object");
	ST_FAILS("{'a': 1", 0, "the header is not JSON: '}' expected near end of file (column 7)");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]},"
		 " 'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [4, 8]}}",
		 8, "the header is not JSON: duplicate object key near '\"a\"' (column 65)");
	ST_FAILS("{'a': {'dtype': 'C64', 'shape': [1], 'data_offsets': [0, 8]}}", 8,
		 "tensor \"a\": unknown dtype \"C64\"");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'offsets': [0, 4]}}", 4,
		 "tensor \"a\": not {\"dtype\", \"shape\", \"data_offsets\"}");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1, 1, 1, 1, 1, 1, 1, 1, 1], "
		 "'data_offsets': [0, 4]}}",
		 4, "tensor \"a\": more than 8 dimensions");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [-1], 'data_offsets': [0, 4]}}", 4,
		 "tensor \"a\": shape[0] is not a size");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 4]}}", 4,
		 "tensor \"a\": data_offsets [0, 4] do not hold its 2 elements of F32");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]},"
		 " 'b': {'dtype': 'F32', 'shape': [1], 'data_offsets': [2, 6]}}",
		 8, "tensor \"b\": its data overlaps \"a\"'s");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [4, 8]}}", 8,
		 "tensor \"a\": a hole of 4 bytes before it");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}", 3,
		 "tensor \"a\": data_offsets end at 4, past the file's 3 data bytes");
	ST_FAILS("{'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}", 6,
		 "2 bytes after the last tensor");
	ST_FAILS("{'__metadata__': {'k': 1}}", 0, "\"__metadata__\": \"k\" is not a string");
	ST_FAILS("{'a': {'dtype': 'U8', 'shape': [1099511627775, 1099511627775], "
		 "'data_offsets': [0, 1]}}",
		 1, "tensor \"a\": too many elements");

	/* Empty tensors and metadata are fine. */
	assert_int_equal(st_parse("{'__metadata__': {'format': 'pt'}, 'e': {'dtype': 'I64', "
				  "'shape': [0, 3], 'data_offsets': [0, 0]}}",
				  0, &h, &err),
			 0);
	assert_int_equal(h.n, 1);
	ptc_st_header_release(&h);
}

static void test_shards(void **state)
{
	int64_t b[] = {3, 3, 5, 1, 20, 2};
	int s[6];
	char name[64];
	(void)state;

	assert_int_equal(ptc_st_shards(b, 6, 8, s), 4);
	int want[] = {0, 0, 1, 1, 2, 3};
	assert_memory_equal(s, want, sizeof(want));
	assert_int_equal(ptc_st_shards(b, 6, 100, s), 1);
	assert_int_equal(ptc_st_shards(b, 0, 8, s), 1);
	ptc_st_shard_name("exp_avg", 1, 3, name, sizeof(name));
	assert_string_equal(name, "exp_avg-00002-of-00003.safetensors");
	ptc_st_shard_name("model", 0, 1, name, sizeof(name));
	assert_string_equal(name, "model.safetensors");
}

/* ---------------------------------------------------------------- name maps */

static struct ptc_schema *gen(bool llama, int kv)
{
	struct ptc_gen_args a = {.layers = 2,
				 .hidden = 16,
				 .heads = 4,
				 .kv_heads = kv,
				 .vocab = 10,
				 .ffn = 24,
				 .seq = 8,
				 .dtype = PTC_FLOAT32};
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	json_t *j = llama ? ptc_gen_llama(&a, &err) : ptc_gen_megatron_gpt(&a, &err);
	assert_non_null(j);
	assert_int_equal(ptc_schema_parse(j, "schema.json", &s, &err), 0);
	json_decref(j);
	return s;
}

static const struct ptc_hf_piece *piece(const struct ptc_hf_map *m, const char *name)
{
	int i = ptc_hf_map_find(m, name);
	if (i < 0)
		fail_msg("no piece \"%s\"", name);
	return &m->p[i];
}

static void test_llama_map(void **state)
{
	struct ptc_schema *s = gen(true, 2); /* d = 4: q 16 rows, k and v 8 */
	struct ptc_hf_map m;
	struct ptc_error err = {.text = ""};
	(void)state;

	assert_int_equal(ptc_hf_map_build(s, "hf", &m, &err), 0);
	int qkv = ptc_schema_find(s, "layers/1/self_attention/query_key_value/weight");
	const struct ptc_hf_piece *k = piece(&m, "model.layers.1.self_attn.k_proj.weight");
	assert_int_equal(k->tensor, qkv);
	assert_int_equal(k->runs[0].dst, 16);
	assert_int_equal(k->runs[0].rows, 8);
	assert_int_equal(k->shape[0], 8);
	assert_int_equal(k->shape[1], 16);
	assert_int_equal(piece(&m, "model.layers.1.self_attn.v_proj.weight")->runs[0].dst, 24);
	const struct ptc_hf_piece *up = piece(&m, "model.layers.0.mlp.up_proj.weight");
	assert_int_equal(up->runs[0].dst, 24);
	assert_int_equal(up->tensor, ptc_schema_find(s, "layers/0/mlp/dense_h_to_4h/weight"));
	assert_int_equal(piece(&m, "model.norm.weight")->tensor,
			 ptc_schema_find(s, "final_layernorm/weight"));
	assert_int_equal(piece(&m, "lm_head.weight")->tensor,
			 ptc_schema_find(s, "output_layer/weight"));
	assert_int_equal(ptc_hf_map_find(&m, "transformer.wte.weight"), -1);
	assert_int_equal(m.n, 3 + 2 * 9);
	ptc_hf_map_release(&m);

	/* The schema's own names: one whole piece per untied tensor. */
	assert_int_equal(ptc_hf_map_build(s, "schema", &m, &err), 0);
	assert_int_equal(m.n, s->ntensors);
	assert_int_equal(piece(&m, "final_layernorm/weight")->runs[0].rows, 16);
	ptc_hf_map_release(&m);
	assert_int_equal(ptc_hf_map_build(s, "torch", &m, &err), -EINVAL);
	assert_string_equal(err.text, "names \"torch\": expected \"schema\" or \"hf\"");
	ptc_schema_free(s);
}

static void test_gpt2_map_interleaved(void **state)
{
	struct ptc_schema *s = gen(false, 0); /* 4 heads of 4 rows */
	struct ptc_hf_map m;
	struct ptc_error err = {.text = ""};
	(void)state;

	assert_int_equal(ptc_hf_map_build(s, "hf", &m, &err), 0);
	const struct ptc_hf_piece *p = piece(&m, "h.0.attn.c_attn.weight"); /* the prefix */
	assert_true(p->transpose);
	assert_int_equal(p->shape[0], 16);
	assert_int_equal(p->shape[1], 48);
	assert_int_equal(p->nruns, 12);
	assert_true(ptc_hf_map_ignored(&m, "h.1.attn.bias"));
	assert_false(ptc_hf_map_ignored(&m, "h.1.attn.c_attn.bias"));

	/* Scattered: Megatron row h*12 + k*4 + i is c_attn column k*16 + h*4 + i. */
	float in[16 * 48], full[48 * 16], back[16 * 48];
	for (int i = 0; i < 16 * 48; i++)
		in[i] = (float)i;
	ptc_hf_scatter(s, p, 4, (const uint8_t *)in, (uint8_t *)full);
	for (int h = 0; h < 4; h++)
		for (int k = 0; k < 3; k++)
			for (int i = 0; i < 4; i++)
				for (int c = 0; c < 16; c++)
					assert_true(full[(h * 12 + k * 4 + i) * 16 + c] ==
						    in[c * 48 + k * 16 + h * 4 + i]);
	ptc_hf_gather(s, p, 4, (const uint8_t *)full, (uint8_t *)back);
	assert_memory_equal(back, in, sizeof(in));
	ptc_hf_map_release(&m);
	ptc_schema_free(s);

	s = gen(false, 2); /* GQA: not GPT-2 */
	assert_int_equal(ptc_hf_map_build(s, "hf", &m, &err), -EINVAL);
	assert_non_null(strstr(err.text, "GPT-2 has as many key/value heads"));
	ptc_schema_free(s);
}

static int map_file(const struct ptc_schema *s, const char *json, struct ptc_hf_map *m,
		    struct ptc_error *err)
{
	char *j = unit_json(json);
	int rc = ptc_hf_map_parse(s, j, strlen(j), "map.json", m, err);
	free(j);
	return rc;
}

static void test_map_file(void **state)
{
	struct ptc_schema *s = gen(true, 4);
	struct ptc_hf_map m;
	struct ptc_error err = {.text = ""};
	(void)state;

	assert_int_equal(
	    map_file(s,
		     "{'tensors': {'emb': 'embedding/word_embeddings/weight',"
		     " 'a': {'to': 'layers/0/mlp/dense_h_to_4h/weight', 'rows': [0, 24]},"
		     " 'b': {'to': 'layers/0/mlp/dense_h_to_4h/weight', 'rows': [24, 48]}},"
		     " 'ignore': ['rotary']}",
		     &m, &err),
	    0);
	assert_int_equal(piece(&m, "b")->runs[0].dst, 24);
	assert_int_equal(piece(&m, "emb")->shape[0], 10);
	assert_int_equal(piece(&m, "final_layernorm/weight")->runs[0].rows, 16); /* unnamed */
	assert_int_equal(ptc_hf_map_find(&m, "embedding/word_embeddings/weight"), -1);
	assert_true(ptc_hf_map_ignored(&m, "rotary"));
	json_t *j = ptc_hf_map_to_json(s, &m);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(
				json_object_get(json_object_get(j, "tensors"), "a"), "to")),
			    "layers/0/mlp/dense_h_to_4h/weight");
	json_decref(j);
	ptc_hf_map_release(&m);

	assert_int_equal(
	    map_file(
		s,
		"{'tensors': {'a': {'to': 'layers/0/mlp/dense_h_to_4h/weight', 'rows': [0, 24]}}}",
		&m, &err),
	    -EINVAL);
	assert_string_equal(err.text,
			    "map.json: the rows of \"layers/0/mlp/dense_h_to_4h/weight\" are not "
			    "covered once");
	assert_int_equal(map_file(s, "{'tensors': {'a': 'nope'}}", &m, &err), -EINVAL);
	assert_string_equal(err.text, "map.json: \"a\": \"nope\" is not an untied tensor of the "
				      "schema");
	assert_int_equal(map_file(s,
				  "{'tensors': {'a': {'to': 'final_layernorm/weight', 'rows': "
				  "[0, 99]}}}",
				  &m, &err),
			 -EINVAL);
	assert_non_null(strstr(err.text, "outside \"final_layernorm/weight\""));
	assert_int_equal(map_file(s,
				  "{'tensors': {'x': 'final_layernorm/weight', "
				  "'y': 'final_layernorm/weight'}}",
				  &m, &err),
			 -EINVAL);
	assert_string_equal(err.text, "map.json: the rows of \"final_layernorm/weight\" are not "
				      "covered once");
	ptc_schema_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_dtype_names),	   cmocka_unit_test(test_format_canonical),
	    cmocka_unit_test(test_parse_refusals), cmocka_unit_test(test_shards),
	    cmocka_unit_test(test_llama_map),	   cmocka_unit_test(test_gpt2_map_interleaved),
	    cmocka_unit_test(test_map_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
