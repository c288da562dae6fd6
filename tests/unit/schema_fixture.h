/*
 * schema_fixture.h - what the schema.json tests share (test_schema.c,
 * test_schema_tensor.c, test_schema_split.c): the parser's test wrappers
 * and schemas of one or two tensors around the one a test varies.
 */
#ifndef MLFS_TESTS_SCHEMA_FIXTURE_H
#define MLFS_TESTS_SCHEMA_FIXTURE_H

#include "tests/unit/unit.h"

/* parse_schema(); schema_fails_at(): the parse must fail with -EINVAL and a
 * message equal to @exact (when non-NULL) containing every string of the
 * NULL-terminated list. */
UNIT_PARSER(schema, struct ptc_schema, "schema.json", ptc_schema_parse_text, ptc_schema_free)

#define FAILS_EXACT(text, msg) schema_fails_at(__FILE__, __LINE__, text, msg, NULL)
#define FAILS(text, ...)       schema_fails_at(__FILE__, __LINE__, text, NULL, __VA_ARGS__, NULL)

/* A one-tensor schema: {'num_layers': 2, 'tensors': [<tensor>]}. */
#define ONE(tensor) "{'num_layers': 2, 'tensors': [" tensor "]}"
/* A two-tensor schema whose second tensor varies. */
#define TWO(tensor)                                                                                \
	"{'num_layers': 2, 'tensors': [{'name': 'emb', 'dtype': 'bfloat16', 'shape': [64, 8], "    \
	"'split': {'dim': 0}, 'place': 'first'}, " tensor "]}"

#endif
