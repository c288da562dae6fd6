/*
 * test_schema_tensor.c - schema.json parsing: the errors of a tensor's
 * fields: unknown ones, its name (paths, lengths, NUL, a file that is also
 * a folder), dtype and shape; names that clash once {L} is expanded, or
 * use {L} without layers.
 */
#include "tests/unit/schema_fixture.h"

/* --------------------------------------------------------------- tensors */

static void test_tensor_unknown_field(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1], 'shard': 0}"),
		    "schema.json: tensors[0] has unknown field \"shard\"");
	FAILS_EXACT(TWO("{'name': 'b', 'dtype': 'bool', 'shape': [4], 'split': {'dim': 0, "
			"'chunk': 2}}"),
		    "schema.json: tensors[1].split has unknown field \"chunk\"");
}

static void test_name_missing(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'dtype': 'bool', 'shape': [1]}"),
		    "schema.json: tensors[0].name must be a string");
	FAILS_EXACT(TWO("{'name': ['b'], 'dtype': 'bool', 'shape': [1]}"),
		    "schema.json: tensors[1].name must be a string");
}

static void test_name_invalid_path(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a/../b', 'dtype': 'bool', 'shape': [1]}"),
		    "schema.json: tensors[0].name \"a/../b\" is not a valid tensor path");
	FAILS(ONE("{'name': 'a//b', 'dtype': 'bool', 'shape': [1]}"), "tensors[0].name \"a//b\"",
	      "not a valid tensor path");
	FAILS(ONE("{'name': '/a', 'dtype': 'bool', 'shape': [1]}"), "\"/a\"", "not a valid");
	FAILS(ONE("{'name': 'a/', 'dtype': 'bool', 'shape': [1]}"), "\"a/\"", "not a valid");
	FAILS(ONE("{'name': 'a/./b', 'dtype': 'bool', 'shape': [1]}"), "\"a/./b\"", "not a valid");
	FAILS(ONE("{'name': '..', 'dtype': 'bool', 'shape': [1]}"), "\"..\"", "not a valid");
	FAILS(ONE("{'name': '', 'dtype': 'bool', 'shape': [1]}"), "\"\"", "not a valid");
	FAILS(ONE("{'name': 'a b', 'dtype': 'bool', 'shape': [1]}"), "\"a b\"", "not a valid");
	FAILS(ONE("{'name': 'layers/{X}/w', 'dtype': 'bool', 'shape': [1]}"), "{X}", "not a valid");
	FAILS(ONE("{'name': 'layers/{L/w', 'dtype': 'bool', 'shape': [1]}"), "{L/w", "not a valid");
}

/* @n bytes of @c, with a '/' every @every bytes when @every > 0 (never
 * first or last). Caller frees. */
static char *filled(char c, size_t n, size_t every)
{
	char *s = malloc(n + 1);

	assert_non_null(s);
	memset(s, c, n);
	for (size_t i = every; every && i + 1 < n; i += every + 1)
		s[i] = '/';
	s[n] = '\0';
	return s;
}

/* @s (freed) followed by @tail. Caller frees. */
static char *suffixed(char *s, const char *tail)
{
	char *out;

	assert_true(asprintf(&out, "%s%s", s, tail) > 0);
	free(s);
	return out;
}

/* A schema of @layers layers, states @states (NULL: the default) and one
 * tensor named @name. Caller frees. */
static char *named(int layers, const char *states, const char *name)
{
	char *text;

	assert_true(asprintf(&text,
			     "{'num_layers': %d, %s%s%s'tensors': [{'name': '%s', 'dtype': "
			     "'bool', 'shape': [1]}]}",
			     layers, states ? "'states': {" : "", states ? states : "",
			     states ? "}, " : "", name) > 0);
	return text;
}

/* Parses named(@layers, @states, @name): 0 (freed) or the failure's -EINVAL
 * with @err filled. */
static int parse_named(int layers, const char *states, const char *name, struct ptc_error *err)
{
	char *text = named(layers, states, name);
	struct ptc_schema *s = NULL;
	int rc = parse_schema(text, &s, err);

	ptc_schema_free(s);
	free(text);
	return rc;
}

static void test_name_too_long(void **state)
{
	struct ptc_error err = {.text = ""};
	char *name, *text;

	(void)state;
	/* The file name is the last component and ".npy": 251 + 4 fits NAME_MAX. */
	name = filled('a', 251, 0);
	assert_int_equal(parse_named(0, NULL, name, &err), 0);
	free(name);
	name = filled('a', 252, 0);
	text = named(0, NULL, name);
	FAILS_EXACT(text,
		    "schema.json: tensors[0].name \"aaaaaaaaaaaaaaaaaaaa...aaaaaaaaaaaaaaaaaaaa\" "
		    "has a component of 256 bytes (\".npy\" included), more than the limit "
		    "255");
	free(text);
	free(name);

	/* A directory component: 255 fits, 256 does not. */
	name = suffixed(filled('b', 255, 0), "/w");
	assert_int_equal(parse_named(0, NULL, name, &err), 0);
	free(name);
	name = suffixed(filled('b', 256, 0), "/w");
	text = named(0, NULL, name);
	FAILS(text, "tensors[0].name", "has a component of 256 bytes", "more than the limit 255");
	free(text);
	free(name);

	/* A template is checked on its longest expansion, the last layer's:
	 * 249 + "99" + ".npy" fits, 249 + "100" + ".npy" does not. */
	name = suffixed(filled('c', 249, 0), "{L}");
	assert_int_equal(parse_named(100, NULL, name, &err), 0);
	text = named(101, NULL, name);
	FAILS_EXACT(text, "schema.json: tensors[0].name \"cccccccccccccccccccc...cccccccccccccccc"
			  "c100\" has a component of 256 bytes (\".npy\" included), more than "
			  "the limit 255");
	free(text);
	free(name);
}

static void test_path_too_long(void **state)
{
	struct ptc_error err = {.text = ""};
	char *name, *text;

	(void)state;
	/* "optim/exp_avg" + "/" + 3054 + ".npy" = 3072 bytes: the limit. */
	name = filled('d', 3054, 200);
	assert_int_equal(parse_named(0, "'model': {}, 'optim/exp_avg': {}", name, &err), 0);
	/* The default state "model" is shorter. */
	free(name);
	name = filled('d', 3062, 200);
	assert_int_equal(parse_named(0, NULL, name, &err), 0);
	free(name);
	name = filled('d', 3055, 200);
	text = named(0, "'model': {}, 'optim/exp_avg': {}", name);
	FAILS_EXACT(text, "schema.json: tensors[0].name \"dddddddddddddddddddd...dddddddddddddddd"
			  "dddd\" in state \"optim/exp_avg\" makes a path "
			  "\"<state>/<tensor>.npy\" of 3073 bytes, more than the limit 3072");
	free(text);
	free(name);
}

static void test_state_too_long(void **state)
{
	struct ptc_error err = {.text = ""};
	char *key, *states, *text;

	(void)state;
	key = filled('e', 255, 0);
	assert_true(asprintf(&states, "'%s': {}", key) > 0);
	assert_int_equal(parse_named(0, states, "w", &err), 0);
	free(states);
	free(key);
	key = filled('e', 256, 0);
	assert_true(asprintf(&states, "'optim/%s': {}", key) > 0);
	text = named(0, states, "w");
	FAILS_EXACT(text, "schema.json: states.\"optim/eeeeeeeeeeeeee...eeeeeeeeeeeeeeeeeeee\" "
			  "has a component of 256 bytes, more than the limit 255");
	free(text);
	free(states);
	free(key);
}

static void test_name_nul(void **state)
{
	struct ptc_schema *s = (struct ptc_schema *)1;
	struct ptc_error err = {.text = ""};
	json_t *root;

	(void)state;
	/* JSON text cannot carry a NUL: jansson refuses "\u0000". */
	FAILS(ONE("{'name': 'a\\u0000b', 'dtype': 'bool', 'shape': [1]}"), "invalid JSON");
	/* A json_t built in memory can: the name would be cut to "a". */
	root = json_pack("{s:[{s:s%,s:s,s:[i]}]}", "tensors", "name", "a\0b", (size_t)3, "dtype",
			 "bool", "shape", 1);
	assert_non_null(root);
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), -EINVAL);
	assert_null(s);
	assert_string_equal(err.text,
			    "schema.json: tensors[0].name \"a\" is not a valid tensor path");
	json_decref(root);
	/* So can a state's key. */
	root = json_pack("{s:{},s:[{s:s,s:s,s:[i]}]}", "states", "tensors", "name", "w", "dtype",
			 "bool", "shape", 1);
	assert_non_null(root);
	assert_int_equal(
	    json_object_setn_new(json_object_get(root, "states"), "m\0x", 3, json_object()), 0);
	assert_int_equal(ptc_schema_parse(root, "schema.json", &s, &err), -EINVAL);
	assert_string_equal(err.text, "schema.json: states.\"m\" is not a valid path name");
	json_decref(root);
}

static void test_file_dir_overlap(void **state)
{
	struct ptc_schema *s;

	(void)state;
	/* "a" is the file "a.npy", which "a.npy/b" would need as a directory. */
	FAILS_EXACT("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]},"
		    " {'name': 'x/a.npy/b', 'dtype': 'bool', 'shape': [1]},"
		    " {'name': 'a.npy/b', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: tensors[2].name \"a.npy/b\" and tensors[0].name \"a\" overlap "
		    "as paths (\"a.npy\" is a file)");
	/* Expanded names too. */
	FAILS_EXACT("{'num_layers': 3, 'tensors': [{'name': 'l2.npy/w', 'dtype': 'bool', "
		    "'shape': [1]}, {'name': 'l{L}', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: tensors[0].name \"l2.npy/w\" and tensors[1].name \"l2\" overlap "
		    "as paths (\"l2.npy\" is a file)");
	/* Names that only look alike are fine. */
	s = schema_ok("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a/b', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a.npy.x/b', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'a.npy', 'dtype': 'bool', 'shape': [1]},"
		      " {'name': 'b/a.npy/c', 'dtype': 'bool', 'shape': [1]}]}");
	assert_int_equal(s->ntensors, 5);
	ptc_schema_free(s);
}

static void test_dtype_invalid(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bf16', 'shape': [1]}"),
		    "schema.json: tensors[0].dtype \"bf16\" is not a known dtype");
	FAILS_EXACT(ONE("{'name': 'a', 'shape': [1]}"),
		    "schema.json: tensors[0].dtype must be a string");
	FAILS(ONE("{'name': 'a', 'dtype': 2, 'shape': [1]}"), "tensors[0].dtype",
	      "must be a string");
}

static void test_shape_invalid(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool'}"),
		    "schema.json: tensors[0].shape must be an array");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': 4}"), "tensors[0].shape",
	      "must be an array");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1, 1, 1, 1, 1, 1, 1, 1, 1]}"),
		    "schema.json: tensors[0].shape has 9 dims, more than 8");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4, 0]}"),
		    "schema.json: tensors[0].shape[1] must be an integer in [1, 2^40]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [-4]}"), "tensors[0].shape[0]",
	      "[1, 2^40]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4.0]}"), "tensors[0].shape[0]",
	      "must be an integer");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': ['4']}"), "tensors[0].shape[0]",
	      "must be an integer");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1099511627777]}"),
	      "tensors[0].shape[0]", "[1, 2^40]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [9223372036854775807]}"),
	      "tensors[0].shape[0]", "[1, 2^40]");
}

static void test_shape_overflow(void **state)
{
	(void)state;
	/* Each dim is in range, their product is 2^41 elements. */
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1048576, 1048576, 2]}"),
		    "schema.json: tensors[0].shape has more than 2^40 elements");
	/* Products that would wrap int64 are caught before they do. */
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1099511627776, 1099511627776, "
		  "1099511627776]}"),
	      "tensors[0].shape has more than 2^40 elements");
}

/* ----------------------------------------- names after the {L} expansion */

static void test_layers_zero(void **state)
{
	(void)state;
	FAILS_EXACT("{'num_layers': 0, 'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]},"
		    " {'name': 'layers/{L}/w', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: tensors[1].name uses {L} but \"num_layers\" is 0");
	/* num_layers defaults to 0. */
	FAILS("{'tensors': [{'name': 'layers/{L}/w', 'dtype': 'bool', 'shape': [1]}]}",
	      "tensors[0].name uses {L}", "\"num_layers\" is 0");
}

static void test_duplicate_names(void **state)
{
	(void)state;
	FAILS_EXACT("{'num_layers': 2, 'tensors': [\n"
		    "  {'name': 'layers/{L}/w', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'layers/1/w', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: tensors[0] and tensors[1] both name \"layers/1/w\"");
	/* Reported in file order whichever sorts first. */
	FAILS_EXACT("{'num_layers': 12, 'tensors': [\n"
		    "  {'name': 'x', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'x1{L}', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'x{L}', 'dtype': 'bool', 'shape': [1]}]}",
		    "schema.json: tensors[1] and tensors[2] both name \"x10\"");
	FAILS("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1]},"
	      " {'name': 'a', 'dtype': 'int8', 'shape': [2]}]}",
	      "tensors[0] and tensors[1] both name \"a\"");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tensor_unknown_field),
	    cmocka_unit_test(test_name_missing),
	    cmocka_unit_test(test_name_invalid_path),
	    cmocka_unit_test(test_name_too_long),
	    cmocka_unit_test(test_path_too_long),
	    cmocka_unit_test(test_state_too_long),
	    cmocka_unit_test(test_name_nul),
	    cmocka_unit_test(test_file_dir_overlap),
	    cmocka_unit_test(test_dtype_invalid),
	    cmocka_unit_test(test_shape_invalid),
	    cmocka_unit_test(test_shape_overflow),
	    cmocka_unit_test(test_layers_zero),
	    cmocka_unit_test(test_duplicate_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
