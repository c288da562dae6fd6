/*
 * test_schema.c - schema.json parsing: the document's errors (JSON, top
 * level, limits, states) and the {L} expansion of schemas that parse.
 * test_schema_tensor.c has a tensor's name, dtype and shape errors,
 * test_schema_split.c its split, place and tied ones.
 */
#include "tests/unit/schema_fixture.h"

static const char design_example[] =
    "{\n"
    "  'model': 'gpt-tiny',\n"
    "  'num_layers': 4,\n"
    "  'states': {'model': {}, 'optim/exp_avg': {'dtype': 'float32'},\n"
    "             'optim/exp_avg_sq': {'dtype': 'float32'}},\n"
    "  'tensors': [\n"
    "    {'name': 'embedding/word/weight', 'dtype': 'bfloat16', 'shape': [1000, 64],\n"
    "     'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'first'},\n"
    "    {'name': 'layers/{L}/attn/qkv/weight', 'dtype': 'bfloat16', 'shape': [192, 64],\n"
    "     'split': {'dim': 0}},\n"
    "    {'name': 'layers/{L}/attn/proj/weight', 'dtype': 'bfloat16', 'shape': [64, 64],\n"
    "     'split': {'dim': 1}},\n"
    "    {'name': 'layers/{L}/attn/proj/bias', 'dtype': 'bfloat16', 'shape': [64]},\n"
    "    {'name': 'layers/{L}/mlp/fc1/weight', 'dtype': 'bfloat16', 'shape': [512, 64],\n"
    "     'split': {'dim': 0, 'chunks': 2}},\n"
    "    {'name': 'final_norm/weight', 'dtype': 'float32', 'shape': [64], 'place': 'last'},\n"
    "    {'name': 'output/weight', 'dtype': 'bfloat16', 'shape': [1000, 64],\n"
    "     'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'last',\n"
    "     'tied': 'embedding/word/weight'}\n"
    "  ]\n"
    "}\n";

/* ------------------------------------------------------------ top level */

static void test_bad_json(void **state)
{
	(void)state;
	/* The trailing comma is at line 3, column 1 (the closing brace). */
	FAILS("{\n  'num_layers': 2,\n}", "schema.json: invalid JSON at line 3 column 1");
	FAILS("", "schema.json: invalid JSON at line 1 column 0");
	FAILS("{'tensors': [}", "invalid JSON at line 1 column 14");
	/* Trailing garbage after a complete object is an error too. */
	FAILS("{} x", "invalid JSON at line 1");
	/* jansson rejects duplicate keys for us. */
	FAILS("{'model': 'a', 'model': 'b'}", "invalid JSON", "duplicate object key");
}

static void test_not_object(void **state)
{
	(void)state;
	FAILS_EXACT("[1, 2]", "schema.json: must be a JSON object");
}

static void test_unknown_top_field(void **state)
{
	(void)state;
	FAILS_EXACT("{'num_layers': 2, 'layerz': 3, 'tensors': []}",
		    "schema.json: unknown field \"layerz\"");
}

static void test_model_not_string(void **state)
{
	(void)state;
	FAILS_EXACT("{'model': 7, 'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: \"model\" must be a string");
}

static void test_num_layers_invalid(void **state)
{
	(void)state;
	FAILS("{'num_layers': 'four', 'tensors': []}", "\"num_layers\"", "must be an integer");
	FAILS("{'num_layers': 1.5, 'tensors': []}", "\"num_layers\"", "must be an integer");
	FAILS_EXACT("{'num_layers': -1, 'tensors': []}",
		    "schema.json: \"num_layers\" = -1 is out of range [0, 65536]");
	FAILS("{'num_layers': 65537, 'tensors': []}", "\"num_layers\" = 65537", "out of range");
}

static void test_tensors_invalid(void **state)
{
	(void)state;
	FAILS_EXACT("{'num_layers': 2}", "schema.json: \"tensors\" must be a non-empty array");
	FAILS_EXACT("{'tensors': {}}", "schema.json: \"tensors\" must be a non-empty array");
	FAILS_EXACT("{'tensors': []}", "schema.json: \"tensors\" must be a non-empty array");
	FAILS_EXACT("{'tensors': [3]}", "schema.json: tensors[0] must be an object");
	FAILS("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]}, null]}",
	      "tensors[1] must be an object");
}

/* Text of a schema of @layers layers and @templates {L} tensors "t<i>/{L}",
 * @plain tensors "p<i>" after them and @states states "s<i>" (none: the
 * default). Caller frees. */
static char *generated(int layers, int templates, int plain, int states)
{
	size_t cap = 64 + (size_t)(templates + plain) * 64 + (size_t)states * 16, off;
	char *text = malloc(cap);

	assert_non_null(text);
	off = (size_t)snprintf(text, cap, "{'num_layers': %d, ", layers);
	for (int i = 0; i < states; i++)
		off += (size_t)snprintf(text + off, cap - off, "%s's%d': {}%s",
					i ? "" : "'states': {", i, i + 1 < states ? ", " : "}, ");
	off += (size_t)snprintf(text + off, cap - off, "'tensors': [");
	for (int i = 0; i < templates + plain; i++)
		off += (size_t)snprintf(
		    text + off, cap - off, "%s{'name': '%s%d%s', 'dtype': 'bool', 'shape': [1]}",
		    i ? ", " : "", i < templates ? "t" : "p", i, i < templates ? "/{L}" : "");
	snprintf(text + off, cap - off, "]}");
	return text;
}

static void test_too_many_tensors(void **state)
{
	char *text;

	(void)state;
	/* Issue 10's hostile schema: 16 {L} tensors x 2^16 layers, 3 states. It
	 * was accepted and cost minutes of CPU and 453 MiB in the daemon. */
	text = generated(65536, 16, 0, 3);
	FAILS_EXACT(text, "schema.json: \"num_layers\" = 65536 with 16 {L} tensors expands to "
			  "1048576 tensors, more than the limit 131072");
	free(text);
	/* Plain tensors count too. */
	text = generated(8192, 16, 1, 0);
	FAILS_EXACT(text, "schema.json: \"num_layers\" = 8192 with 16 {L} tensors expands to "
			  "131073 tensors, more than the limit 131072");
	free(text);
	/* The limit itself is accepted, expanded in template order. */
	text = generated(8192, 16, 0, 0);
	struct ptc_schema *s = schema_ok(text);
	assert_int_equal(s->ntensors, PTC_MAX_TENSORS);
	assert_string_equal(s->tensors[PTC_MAX_TENSORS - 1].name, "t15/8191");
	assert_int_equal(s->tensors[PTC_MAX_TENSORS - 1].layer, 8191);
	ptc_schema_free(s);
	free(text);

	/* Without templates: the array's length, before its entries are read. */
	size_t n = PTC_MAX_TENSORS + 1;
	text = malloc(n * 3 + 32);
	assert_non_null(text);
	char *o = stpcpy(text, "{'tensors': [1");
	for (size_t i = 1; i < n; i++)
		o = stpcpy(o, ", 1");
	strcpy(o, "]}");
	FAILS_EXACT(text, "schema.json: \"tensors\" lists 131073 tensors, more than the limit "
			  "131072");
	free(text);
}

static void test_too_many_states(void **state)
{
	char *text;

	(void)state;
	text = generated(0, 0, 1, PTC_MAX_STATES + 1);
	FAILS_EXACT(text, "schema.json: \"states\" has 65 states, more than the limit 64");
	free(text);
	text = generated(0, 0, 1, PTC_MAX_STATES);
	struct ptc_schema *s = schema_ok(text);
	assert_int_equal(s->nstates, 64);
	assert_string_equal(s->states[63].name, "s63");
	ptc_schema_free(s);
	free(text);
}

static void test_too_many_files(void **state)
{
	char *text;

	(void)state;
	/* Every state holds every tensor: 64 x 16385 files in full/. */
	text = generated(16385, 1, 0, 64);
	FAILS_EXACT(text, "schema.json: 64 states x 16385 tensors = 1048640 files, more than the "
			  "limit 1048576");
	free(text);
	text = generated(16384, 1, 0, 64);
	struct ptc_schema *s = schema_ok(text);
	assert_int_equal(s->nstates * s->ntensors, PTC_MAX_FILES);
	ptc_schema_free(s);
	free(text);
}

/* ---------------------------------------------------------------- states */

static void test_states_not_object(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': [], 'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: \"states\" must be a non-empty object");
	FAILS_EXACT("{'states': {}, 'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: \"states\" must be a non-empty object");
}

static void test_state_invalid_name(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'a/../b': {}}, 'tensors': []}",
		    "schema.json: states.\"a/../b\" is not a valid path name");
	FAILS("{'states': {'optim//m': {}}, 'tensors': []}", "states.\"optim//m\"",
	      "not a valid path name");
	FAILS("{'states': {'': {}}, 'tensors': []}", "states.\"\"", "not a valid path name");
	/* {L} is a tensor template, not allowed in a state. */
	FAILS("{'states': {'m{L}': {}}, 'tensors': []}", "states.\"m{L}\"",
	      "not a valid path name");
}

static void test_state_reserved_data(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'model': {}, 'data': {}}, 'tensors': []}",
		    "schema.json: states.\"data\" is reserved for dataset views");
	FAILS("{'states': {'data/x': {}}, 'tensors': []}", "states.\"data/x\"",
	      "reserved for dataset views");
}

static void test_state_not_object(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'model': 'float32'}, 'tensors': []}",
		    "schema.json: states.\"model\" must be an object");
}

static void test_state_unknown_field(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'model': {'dtpye': 'float32'}}, 'tensors': []}",
		    "schema.json: states.\"model\" has unknown field \"dtpye\"");
}

static void test_state_bad_dtype(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'optim/m': {'dtype': 'float128'}}, 'tensors': []}",
		    "schema.json: states.\"optim/m\".dtype is not a known dtype");
	FAILS("{'states': {'optim/m': {'dtype': 4}}, 'tensors': []}", "states.\"optim/m\".dtype",
	      "not a known dtype");
}

static void test_state_overlap(void **state)
{
	(void)state;
	FAILS_EXACT("{'states': {'optim': {}, 'optim/exp_avg': {}}, 'tensors': []}",
		    "schema.json: states.\"optim/exp_avg\" and \"optim\" overlap as paths");
	/* Either order. */
	FAILS("{'states': {'optim/exp_avg': {}, 'optim': {}}, 'tensors': []}", "states.\"optim\"",
	      "\"optim/exp_avg\"", "overlap as paths");
}

/* -------------------------------------------------------------- successes */

static void test_design_example(void **state)
{
	static const char *const names[] = {
	    "embedding/word/weight",
	    "layers/0/attn/qkv/weight",
	    "layers/1/attn/qkv/weight",
	    "layers/2/attn/qkv/weight",
	    "layers/3/attn/qkv/weight",
	    "layers/0/attn/proj/weight",
	    "layers/1/attn/proj/weight",
	    "layers/2/attn/proj/weight",
	    "layers/3/attn/proj/weight",
	    "layers/0/attn/proj/bias",
	    "layers/1/attn/proj/bias",
	    "layers/2/attn/proj/bias",
	    "layers/3/attn/proj/bias",
	    "layers/0/mlp/fc1/weight",
	    "layers/1/mlp/fc1/weight",
	    "layers/2/mlp/fc1/weight",
	    "layers/3/mlp/fc1/weight",
	    "final_norm/weight",
	    "output/weight",
	};
	struct ptc_schema *s = schema_ok(design_example);

	(void)state;
	assert_string_equal(s->model, "gpt-tiny");
	assert_int_equal(s->num_layers, 4);
	assert_int_equal(s->ntensors, 19);
	for (int i = 0; i < 19; i++) {
		assert_string_equal(s->tensors[i].name, names[i]);
		assert_int_equal(ptc_schema_find(s, names[i]), i);
	}
	assert_int_equal(ptc_schema_find(s, "layers/4/attn/qkv/weight"), -1);
	assert_int_equal(ptc_schema_find(s, "layers/{L}/attn/qkv/weight"), -1);
	assert_int_equal(ptc_schema_find(s, "embedding/word"), -1);

	/* Layer indices and template sources. */
	for (int i = 1; i <= 16; i++) {
		assert_int_equal(s->tensors[i].place, PTC_PLACE_LAYER);
		assert_int_equal(s->tensors[i].layer, (i - 1) % 4);
		assert_int_equal(s->tensors[i].source, 1 + (i - 1) / 4);
		assert_int_equal(s->tensors[i].tied, -1);
	}
	assert_int_equal(s->tensors[0].layer, -1);
	assert_int_equal(s->tensors[0].place, PTC_PLACE_FIRST);
	assert_int_equal(s->tensors[17].place, PTC_PLACE_LAST);
	assert_int_equal(s->tensors[17].source, 5);
	assert_int_equal(s->tensors[18].source, 6);

	/* embedding: padded, one chunk. */
	const struct ptc_tensor *emb = &s->tensors[0];
	assert_int_equal(emb->dtype, PTC_BFLOAT16);
	assert_int_equal(emb->ndim, 2);
	assert_int_equal(emb->shape[0], 1000);
	assert_int_equal(emb->shape[1], 64);
	assert_int_equal(emb->split_dim, 0);
	assert_int_equal(emb->nchunks, 1);
	assert_int_equal(emb->chunks[0], 1000);
	assert_int_equal(emb->pad_multiple, 128);

	/* proj weight split on dim 1; bias replicated. */
	assert_int_equal(s->tensors[6].split_dim, 1);
	assert_int_equal(s->tensors[6].nchunks, 1);
	assert_int_equal(s->tensors[6].chunks[0], 64);
	assert_int_equal(s->tensors[10].split_dim, -1);
	assert_int_equal(s->tensors[10].ndim, 1);
	assert_int_equal(s->tensors[10].shape[0], 64);
	assert_int_equal(s->tensors[10].pad_multiple, 0);

	/* fc1: two equal chunks, each layer its own copy. */
	for (int i = 13; i <= 16; i++) {
		const struct ptc_tensor *t = &s->tensors[i];
		assert_int_equal(t->split_dim, 0);
		assert_int_equal(t->nchunks, 2);
		assert_int_equal(t->chunks[0], 256);
		assert_int_equal(t->chunks[1], 256);
		assert_int_equal(t->pad_multiple, 0);
	}
	assert_ptr_not_equal(s->tensors[13].chunks, s->tensors[14].chunks);

	/* final norm float32, output tied to the embedding. */
	assert_int_equal(s->tensors[17].dtype, PTC_FLOAT32);
	assert_int_equal(s->tensors[17].split_dim, -1);
	assert_int_equal(s->tensors[18].tied, 0);
	assert_int_equal(ptc_schema_logical(s, 18), 0);
	assert_int_equal(ptc_schema_logical(s, 0), 0);
	assert_int_equal(ptc_schema_logical(s, 5), 5);

	/* States and their dtypes. */
	assert_int_equal(s->nstates, 3);
	assert_string_equal(s->states[0].name, "model");
	assert_string_equal(s->states[1].name, "optim/exp_avg");
	assert_string_equal(s->states[2].name, "optim/exp_avg_sq");
	assert_int_equal(s->states[0].has_dtype, 0);
	assert_int_equal(s->states[1].has_dtype, 1);
	assert_int_equal(ptc_schema_find_state(s, "optim/exp_avg_sq"), 2);
	assert_int_equal(ptc_schema_find_state(s, "optim"), -1);
	assert_int_equal(ptc_schema_dtype(s, 0, 0), PTC_BFLOAT16);
	assert_int_equal(ptc_schema_dtype(s, 0, 17), PTC_FLOAT32);
	assert_int_equal(ptc_schema_dtype(s, 1, 0), PTC_FLOAT32);
	assert_int_equal(ptc_schema_dtype(s, 2, 18), PTC_FLOAT32);
	ptc_schema_free(s);
}

static void test_defaults(void **state)
{
	struct ptc_schema *s = schema_ok("{'tensors': [{'name': 'w', 'dtype': 'int8', 'shape': []},"
					 " {'name': 'v', 'dtype': 'float16', 'shape': [3],"
					 "  'place': 'all'}]}");

	(void)state;
	assert_string_equal(s->model, "");
	assert_int_equal(s->num_layers, 0);
	/* Without "states" there is one state, "model", with the tensors' dtypes. */
	assert_int_equal(s->nstates, 1);
	assert_string_equal(s->states[0].name, "model");
	assert_int_equal(s->states[0].has_dtype, 0);
	assert_int_equal(ptc_schema_dtype(s, 0, 0), PTC_INT8);
	assert_int_equal(ptc_schema_dtype(s, 0, 1), PTC_FLOAT16);
	/* A scalar is a zero-dim tensor, replicated everywhere. */
	assert_int_equal(s->tensors[0].ndim, 0);
	assert_int_equal(s->tensors[0].split_dim, -1);
	assert_int_equal(s->tensors[0].nchunks, 0);
	assert_null(s->tensors[0].chunks);
	assert_int_equal(s->tensors[0].place, PTC_PLACE_ALL);
	assert_int_equal(s->tensors[0].layer, -1);
	assert_int_equal(s->tensors[0].tied, -1);
	assert_int_equal(s->tensors[1].place, PTC_PLACE_ALL);
	ptc_schema_free(s);
}

static void test_gqa_chunks_and_dtypes(void **state)
{
	static const char *const dts[] = {"float64", "float32", "float16",	 "bfloat16",
					  "int64",   "int32",	"int16",	 "int8",
					  "uint8",   "bool",	"float8_e4m3fn", "float8_e5m2"};
	char text[4096] = "{'description': 'all dtypes', 'num_layers': 3, 'tensors': ["
			  "{'name': 'layers/{L}/qkv', 'dtype': 'bfloat16', 'shape': [12, 8, 2],"
			  " 'split': {'dim': 0, 'chunks': [8, 2, 2]}},"
			  "{'name': 'l{L}/p{L}', 'dtype': 'bool', 'shape': [2],"
			  " 'split': {'dim': 0, 'chunks': 1, 'pad_multiple': 4}}";
	struct ptc_schema *s;

	(void)state;
	for (int i = 0; i < PTC_DTYPE_COUNT; i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text),
			 ", {'name': 'dt/%s', 'dtype': '%s', 'shape': [1]}", dts[i], dts[i]);
	strcat(text, "]}");
	s = schema_ok(text);
	assert_int_equal(s->ntensors, 6 + PTC_DTYPE_COUNT);
	for (int l = 0; l < 3; l++) {
		const struct ptc_tensor *t = &s->tensors[l];
		assert_int_equal(t->layer, l);
		assert_int_equal(t->nchunks, 3);
		assert_int_equal(t->chunks[0], 8);
		assert_int_equal(t->chunks[1], 2);
		assert_int_equal(t->chunks[2], 2);
		assert_int_equal(t->ndim, 3);
		assert_int_equal(t->shape[2], 2);
	}
	/* Every {L} of a name is expanded. */
	assert_string_equal(s->tensors[4].name, "l1/p1");
	assert_int_equal(s->tensors[4].pad_multiple, 4);
	assert_int_equal(s->tensors[4].nchunks, 1);
	for (int i = 0; i < PTC_DTYPE_COUNT; i++) {
		assert_int_equal(s->tensors[6 + i].dtype, i);
		assert_string_equal(ptc_dtype_name((enum ptc_dtype)i), dts[i]);
	}
	ptc_schema_free(s);
}

static void test_tied_ok(void **state)
{
	struct ptc_schema *s = schema_ok(
	    TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], 'split': {'dim': 0}, "
		"'place': 'last', 'tied': 'emb'}"));

	(void)state;
	assert_int_equal(s->ntensors, 2);
	assert_int_equal(s->tensors[0].tied, -1);
	assert_int_equal(s->tensors[1].tied, 0);
	assert_int_equal(s->tensors[1].place, PTC_PLACE_LAST);
	ptc_schema_free(s);

	/* A tensor tied to one that follows it in the file. */
	s = schema_ok("{'tensors': [{'name': 'b', 'dtype': 'bool', 'shape': [4], 'place': 'last', "
		      "'tied': 'z/a'}, {'name': 'z/a', 'dtype': 'bool', 'shape': [4]}]}");
	assert_int_equal(s->tensors[0].tied, 1);
	assert_int_equal(ptc_schema_logical(s, 0), 1);
	ptc_schema_free(s);
}

static void test_parse_json_object(void **state)
{
	/* ptc_schema_parse on a json_t, as the daemon calls it. */
	char *text = unit_json(design_example);
	json_t *root = json_loads(text, 0, NULL);
	struct ptc_schema *s = NULL;
	struct ptc_error err = {.text = ""};

	(void)state;
	assert_non_null(root);
	assert_int_equal(ptc_schema_parse(root, "x.json", &s, &err), 0);
	assert_int_equal(s->ntensors, 19);
	ptc_schema_free(s);
	ptc_schema_free(NULL);
	json_decref(root);

	root = json_integer(3);
	s = (struct ptc_schema *)1;
	assert_int_equal(ptc_schema_parse(root, "x.json", &s, &err), -EINVAL);
	assert_null(s);
	assert_string_equal(err.text, "x.json: must be a JSON object");
	json_decref(root);
	free(text);
}

static void test_not_nul_terminated(void **state)
{
	/* The text is @len bytes, not a C string: what follows must be ignored. */
	char *text = unit_json("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]}]}"
			       "garbage");
	struct ptc_schema *s = NULL;
	struct ptc_error err = {.text = ""};

	(void)state;
	assert_int_equal(ptc_schema_parse_text(text, strlen(text) - 7, "s", &s, &err), 0);
	assert_int_equal(s->ntensors, 1);
	ptc_schema_free(s);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_bad_json),
	    cmocka_unit_test(test_not_object),
	    cmocka_unit_test(test_unknown_top_field),
	    cmocka_unit_test(test_model_not_string),
	    cmocka_unit_test(test_num_layers_invalid),
	    cmocka_unit_test(test_tensors_invalid),
	    cmocka_unit_test(test_too_many_tensors),
	    cmocka_unit_test(test_too_many_states),
	    cmocka_unit_test(test_too_many_files),
	    cmocka_unit_test(test_states_not_object),
	    cmocka_unit_test(test_state_invalid_name),
	    cmocka_unit_test(test_state_reserved_data),
	    cmocka_unit_test(test_state_not_object),
	    cmocka_unit_test(test_state_unknown_field),
	    cmocka_unit_test(test_state_bad_dtype),
	    cmocka_unit_test(test_state_overlap),
	    cmocka_unit_test(test_design_example),
	    cmocka_unit_test(test_defaults),
	    cmocka_unit_test(test_gqa_chunks_and_dtypes),
	    cmocka_unit_test(test_tied_ok),
	    cmocka_unit_test(test_parse_json_object),
	    cmocka_unit_test(test_not_nul_terminated),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
