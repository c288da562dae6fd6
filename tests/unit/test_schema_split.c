/*
 * test_schema_split.c - schema.json parsing: the errors of how a tensor is
 * laid out: its split (dim, chunks, pad_multiple), its place (first or
 * last stage) and its tie to another tensor.
 */
#include "tests/unit/schema_fixture.h"

/* ----------------------------------------------------------------- split */

static void test_split_not_object(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4], 'split': 0}"),
		    "schema.json: tensors[0].split must be an object");
}

static void test_split_dim_missing(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4], 'split': {}}"),
		    "schema.json: tensors[0].split.dim is missing");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4], 'split': {'dim': '0'}}"),
	      "tensors[0].split.dim", "must be an integer");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [4], 'split': {'dim': 4294967296}}"),
	      "tensors[0].split.dim", "out of range");
}

static void test_split_dim_out_of_range(void **state)
{
	(void)state;
	FAILS_EXACT("{'tensors': [\n"
		    "  {'name': 'a', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'b', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'c', 'dtype': 'bool', 'shape': [1]},\n"
		    "  {'name': 'd', 'dtype': 'float32', 'shape': [64, 64], 'split': {'dim': 2}}]}",
		    "schema.json: tensors[3].split.dim = 2 is out of range for shape [64, 64]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [8], 'split': {'dim': -1}}"),
	      "tensors[0].split.dim = -1", "out of range for shape [8]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [], 'split': {'dim': 0}}"),
	      "tensors[0].split.dim = 0", "out of range for shape []");
}

static void test_split_chunks_not_dividing(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [10, 4], 'split': {'dim': 0, "
			"'chunks': 3}}"),
		    "schema.json: tensors[0].split.chunks = 3 does not divide dim 0 of shape "
		    "[10, 4] into at most 32 equal chunks");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [10], 'split': {'dim': 0, "
		  "'chunks': 0}}"),
	      "tensors[0].split.chunks = 0", "does not divide");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [10], 'split': {'dim': 0, "
		  "'chunks': -2}}"),
	      "tensors[0].split.chunks = -2", "does not divide");
	/* 64 divides 64 but more than 32 chunks would overflow the segment list. */
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [64], 'split': {'dim': 0, "
		  "'chunks': 64}}"),
	      "tensors[0].split.chunks = 64", "at most 32");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [10], 'split': {'dim': 0, "
			"'chunks': 'qkv'}}"),
		    "schema.json: tensors[0].split.chunks must be an integer or an array of "
		    "sizes");
}

static void test_split_chunk_array_invalid(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
			"'chunks': [8, 2, 3]}}"),
		    "schema.json: tensors[0].split.chunks sum to 13, not dim 0 of shape [12]");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
		  "'chunks': [4, 4]}}"),
	      "tensors[0].split.chunks sum to 8", "not dim 0");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
			"'chunks': [8, 13]}}"),
		    "schema.json: tensors[0].split.chunks sum to more than dim 0 of shape [12]");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
			"'chunks': [8, 0, 4]}}"),
		    "schema.json: tensors[0].split.chunks[1] must be a positive integer");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
		  "'chunks': [8, '4']}}"),
	      "tensors[0].split.chunks[1]", "positive integer");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [12], 'split': {'dim': 0, "
			"'chunks': []}}"),
		    "schema.json: tensors[0].split.chunks must list 1 to 32 sizes");
	/* 33 chunks of one row. */
	char text[1024] = "{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [33], "
			  "'split': {'dim': 0, 'chunks': [1";
	for (int i = 1; i < 33; i++)
		strcat(text, ", 1");
	strcat(text, "]}}]}");
	FAILS(text, "tensors[0].split.chunks must list 1 to 32 sizes");
}

static void test_split_pad_multiple_invalid(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
			"'chunks': 2, 'pad_multiple': 128}}"),
		    "schema.json: tensors[0].split.pad_multiple cannot be combined with chunks");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
		  "'chunks': [256, 256], 'pad_multiple': 128}}"),
	      "tensors[0].split.pad_multiple", "cannot be combined with chunks");
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
			"'pad_multiple': 128, 'unit': 64}}"),
		    "schema.json: tensors[0].split.unit cannot be combined with pad_multiple");
	FAILS_EXACT(
	    ONE("{'name': 'a', 'dtype': 'bool', 'shape': [96, 4], 'split': {'dim': 0, "
		"'chunks': [64, 16, 16], 'unit': 32}}"),
	    "schema.json: tensors[0].split.unit = 32 does not divide the 16 rows of chunk 1");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [96, 4], 'split': {'dim': 0, "
		  "'unit': 0}}"),
	      "tensors[0].split.unit", "out of range");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
		  "'pad_multiple': 0}}"),
	      "tensors[0].split.pad_multiple = 0", "out of range");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
		  "'pad_multiple': 1048577}}"),
	      "tensors[0].split.pad_multiple = 1048577", "out of range");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [512], 'split': {'dim': 0, "
		  "'pad_multiple': true}}"),
	      "tensors[0].split.pad_multiple", "must be an integer");
}

/* ----------------------------------------------------------------- place */

static void test_place_on_layer_tensor(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'layers/{L}/w', 'dtype': 'bool', 'shape': [1], "
			"'place': 'first'}"),
		    "schema.json: tensors[0].place cannot be set on a {L} tensor");
}

static void test_place_invalid(void **state)
{
	(void)state;
	FAILS_EXACT(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1], 'place': 'middle'}"),
		    "schema.json: tensors[0].place must be \"first\", \"last\" or \"all\"");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1], 'place': 0}"),
	      "tensors[0].place must be");
	FAILS(ONE("{'name': 'a', 'dtype': 'bool', 'shape': [1], 'place': 'Last'}"),
	      "tensors[0].place must be");
}

/* ------------------------------------------------------------------ tied */

static void test_tied_not_string(void **state)
{
	(void)state;
	FAILS_EXACT(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
			"'split': {'dim': 0}, 'place': 'last', 'tied': 0}"),
		    "schema.json: tensors[1].tied must be a tensor name");
}

static void test_tied_missing(void **state)
{
	(void)state;
	FAILS_EXACT(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
			"'split': {'dim': 0}, 'place': 'last', 'tied': 'embedding'}"),
		    "schema.json: tensors[1].tied = \"embedding\" names no tensor");
}

static void test_tied_to_self(void **state)
{
	(void)state;
	FAILS_EXACT(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
			"'split': {'dim': 0}, 'place': 'last', 'tied': 'out'}"),
		    "schema.json: tensors[1].tied = \"out\" is itself tied");
}

static void test_tied_to_tied(void **state)
{
	(void)state;
	static const char *const texts[] = {
	    /* The chain's target comes before and after the tied tensor. */
	    TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], 'split': {'dim': 0}, "
		"'place': 'last', 'tied': 'emb'}, "
		"{'name': 'out2', 'dtype': 'bfloat16', 'shape': [64, 8], 'split': {'dim': 0}, "
		"'place': 'last', 'tied': 'out'}"),
	    TWO("{'name': 'out2', 'dtype': 'bfloat16', 'shape': [64, 8], 'split': {'dim': 0}, "
		"'place': 'last', 'tied': 'out'}, "
		"{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], 'split': {'dim': 0}, "
		"'place': 'last', 'tied': 'emb'}"),
	};
	FAILS(texts[0], "tensors[2].tied = \"out\" is itself tied");
	FAILS(texts[1], "tensors[1].tied = \"out\" is itself tied");
	/* Two tensors tied to each other. */
	FAILS("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [1], 'place': 'last', "
	      "'tied': 'b'}, {'name': 'b', 'dtype': 'bool', 'shape': [1], 'place': 'last', "
	      "'tied': 'a'}]}",
	      "is itself tied");
}

static void test_tied_differs(void **state)
{
	(void)state;
	FAILS_EXACT(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 16], "
			"'split': {'dim': 0}, 'place': 'last', 'tied': 'emb'}"),
		    "schema.json: tensors[1].tied = \"emb\" differs in dtype, shape or split from "
		    "the tied tensor");
	FAILS(TWO("{'name': 'out', 'dtype': 'float32', 'shape': [64, 8], "
		  "'split': {'dim': 0}, 'place': 'last', 'tied': 'emb'}"),
	      "tensors[1].tied = \"emb\" differs");
	FAILS(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'split': {'dim': 1}, 'place': 'last', 'tied': 'emb'}"),
	      "tensors[1].tied = \"emb\" differs");
	FAILS(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'place': 'last', 'tied': 'emb'}"),
	      "tensors[1].tied = \"emb\" differs");
	FAILS(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'split': {'dim': 0, 'chunks': 2}, 'place': 'last', 'tied': 'emb'}"),
	      "tensors[1].tied = \"emb\" differs");
	FAILS(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'split': {'dim': 0, 'pad_multiple': 8}, 'place': 'last', 'tied': 'emb'}"),
	      "tensors[1].tied = \"emb\" differs");
	/* Same number of chunks, different sizes. */
	FAILS("{'tensors': [{'name': 'a', 'dtype': 'bool', 'shape': [8], "
	      "'split': {'dim': 0, 'chunks': [4, 4]}}, "
	      "{'name': 'b', 'dtype': 'bool', 'shape': [8], "
	      "'split': {'dim': 0, 'chunks': [6, 2]}, 'place': 'last', 'tied': 'a'}]}",
	      "tensors[1].tied = \"a\" differs");
}

static void test_tied_not_last(void **state)
{
	(void)state;
	FAILS_EXACT(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
			"'split': {'dim': 0}, 'tied': 'emb'}"),
		    "schema.json: tensors[1].tied requires place \"last\"");
	FAILS(TWO("{'name': 'out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'split': {'dim': 0}, 'place': 'first', 'tied': 'emb'}"),
	      "tensors[1].tied requires place \"last\"");
}

static void test_tied_layer_tensor(void **state)
{
	(void)state;
	FAILS(TWO("{'name': 'layers/{L}/out', 'dtype': 'bfloat16', 'shape': [64, 8], "
		  "'split': {'dim': 0}, 'tied': 'emb'}"),
	      "{L} tensor cannot be tied");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_split_not_object),
	    cmocka_unit_test(test_split_dim_missing),
	    cmocka_unit_test(test_split_dim_out_of_range),
	    cmocka_unit_test(test_split_chunks_not_dividing),
	    cmocka_unit_test(test_split_chunk_array_invalid),
	    cmocka_unit_test(test_split_pad_multiple_invalid),
	    cmocka_unit_test(test_place_on_layer_tensor),
	    cmocka_unit_test(test_place_invalid),
	    cmocka_unit_test(test_tied_not_string),
	    cmocka_unit_test(test_tied_missing),
	    cmocka_unit_test(test_tied_to_self),
	    cmocka_unit_test(test_tied_to_tied),
	    cmocka_unit_test(test_tied_differs),
	    cmocka_unit_test(test_tied_not_last),
	    cmocka_unit_test(test_tied_layer_tensor),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
