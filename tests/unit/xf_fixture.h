/*
 * xf_fixture.h - what the executor and full-tensor tests of transform/
 * share (test_xf.c, test_xf_full.c): the bytes a partition must hold,
 * from model.h's independent layout model, and the number of random cases.
 */
#ifndef MLFS_TESTS_XF_FIXTURE_H
#define MLFS_TESTS_XF_FIXTURE_H

#include "tests/unit/model.h"
#include "tests/unit/unit.h"
#include "transform/xf.h"

/* The bytes partition (r, st, t) of @l must hold, padding bytes = @pad.
 * Returns a malloc'ed buffer and its size. */
static uint8_t *expected_part(const struct ptc_layout *l, int r, int st, int t, int pad,
			      int64_t *size)
{
	const struct ptc_schema *s = l->schema;
	const struct ptc_tensor *T = &s->tensors[t];
	int logical = T->tied >= 0 ? T->tied : t;
	int64_t outer, rowel, nrows, es = esize(s, st, t);
	int64_t N = T->split_dim < 0 ? 1 : T->shape[T->split_dim];
	int64_t *m = rowmap(T, l->tp, r % l->tp, &nrows);

	ptc_tensor_geometry(T, &outer, &rowel);
	*size = outer * nrows * rowel * es;
	uint8_t *buf = malloc((size_t)(*size ? *size : 1));
	for (int64_t o = 0; o < outer; o++)
		for (int64_t lr = 0; lr < nrows; lr++) {
			int64_t g = m[lr];
			for (int64_t e = 0; e < rowel; e++) {
				int64_t elem = (o * N + g) * rowel + e;
				uint8_t *out = buf + ((o * nrows + lr) * rowel + e) * es;
				for (int b = 0; b < es; b++)
					out[b] =
					    g < 0 ? (uint8_t)pad : data_byte(st, logical, elem, b);
			}
		}
	free(m);
	return buf;
}

/* Random cases per property test: @dflt, or $XF_PROP_CASES. */
static int prop_cases(int dflt)
{
	const char *env = getenv("XF_PROP_CASES");
	return env ? atoi(env) : dflt;
}

#endif
