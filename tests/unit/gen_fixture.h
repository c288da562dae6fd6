/*
 * gen_fixture.h - what the schema generator tests share (test_gen.c,
 * test_gen_moe.c): assertions on a generated schema's JSON (a tensor's
 * shape, split, place; the parts every model shares), that it parses with
 * the expected count, and the tensor count of a moe model.
 */
#ifndef MLFS_TESTS_GEN_FIXTURE_H
#define MLFS_TESTS_GEN_FIXTURE_H

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

/* Asserts @name's split has chunks [@q, @kv, @kv] (queries, keys, values). */
static void assert_chunks(const json_t *root, const char *name, json_int_t q, json_int_t kv)
{
	json_t *ch = json_object_get(json_object_get(tensor(root, name), "split"), "chunks");

	assert_int_equal(json_array_size(ch), 3);
	assert_int_equal(json_integer_value(json_array_get(ch, 0)), q);
	assert_int_equal(json_integer_value(json_array_get(ch, 1)), kv);
	assert_int_equal(json_integer_value(json_array_get(ch, 2)), kv);
}

/* Tensors: 3 outside layers; per layer 4 of attention, the router, 2 per
 * routed expert and 2 for the shared MLP when there is one. */
#define MOE_TENSORS(l, e, s) (3 + (l) * (5 + 2 * (e) + ((s) ? 2 : 0)))

#endif
