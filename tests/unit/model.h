/*
 * model.h - the test-side model of DESIGN.md sections 2-3 (rank layout and
 * slicing), shared by the plan and executor tests (plan_fixture.h,
 * xf_fixture.h: test_plan*.c, test_xf*.c).
 *
 * Written independently of ptc on purpose: the tests compare two
 * implementations, so nothing here calls ptc's row maps or placement; keep
 * it that way. Also the xorshift generator, the synthetic data and the
 * random schemas and configs of the property tests. Functions are static
 * inline: a file that includes it need not use them all.
 */
#ifndef MLFS_TESTS_MODEL_H
#define MLFS_TESTS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "tests/unit/unit.h"

/* -------------------------------------------------------------- randomness */

/* xorshift64; each test seeds it for a reproducible sequence. */
static uint64_t rng_state;

static inline uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static inline int rndi(int lo, int hi) /* inclusive */
{
	return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* Synthetic byte @b of global element @elem of a logical tensor in state @st. */
static inline uint8_t data_byte(int st, int logical, int64_t elem, int b)
{
	uint64_t h = (uint64_t)st * 0x9E3779B97F4A7C15ull ^
		     (uint64_t)logical * 0xC2B2AE3D27D4EB4Full ^
		     (uint64_t)elem * 0x165667B19E3779F9ull ^ (uint64_t)b;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	h ^= h >> 32;
	return (uint8_t)h;
}

/* ------------------------------------------------ independent layout model */

/* Global row (or -1 for padding) of each local row of TP rank @tr; the
 * count in *@nrows. Caller frees. */
static inline int64_t *rowmap(const struct ptc_tensor *t, int tp, int tr, int64_t *nrows)
{
	int64_t *m, n;

	if (t->split_dim < 0) {
		m = malloc(sizeof(int64_t));
		m[0] = 0;
		*nrows = 1;
		return m;
	}
	n = t->shape[t->split_dim];
	if (t->pad_multiple) {
		int64_t q = t->pad_multiple * tp, padded = (n + q - 1) / q * q, per = padded / tp;
		m = malloc((size_t)(per ? per : 1) * sizeof(int64_t));
		for (int64_t i = 0; i < per; i++)
			m[i] = tr * per + i < n ? tr * per + i : -1;
		*nrows = per;
		return m;
	}
	m = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
	int64_t k = 0, base = 0;
	for (int c = 0; c < t->nchunks; c++) {
		int64_t cn = t->chunks[c];
		for (int64_t g = base + tr * cn / tp; g < base + (tr + 1) * cn / tp; g++)
			m[k++] = g;
		base += cn;
	}
	*nrows = k;
	return m;
}

/* Whether rank @r of @l holds tensor @ti (its pipeline stage). */
static inline bool holds(const struct ptc_layout *l, int r, int ti)
{
	const struct ptc_tensor *t = &l->schema->tensors[ti];
	int p = (r / l->tp) / l->dp, L = l->schema->num_layers;

	if (t->tied >= 0)
		return l->pp > 1 && p == l->pp - 1;
	if (t->layer >= 0) {
		for (int q = 0; q < l->pp; q++)
			if (t->layer >= q * L / l->pp && t->layer < (q + 1) * L / l->pp)
				return q == p;
		return false;
	}
	if (t->place == PTC_PLACE_FIRST)
		return p == 0;
	if (t->place == PTC_PLACE_LAST)
		return p == l->pp - 1;
	return true;
}

/* Cluster index of the node rank @r of @l runs on. */
static inline int node_of(const struct ptc_layout *l, int r)
{
	int left = r;
	for (int i = 0; i < l->config->nnodes; i++) {
		int n = ptc_cluster_find(l->cluster, l->config->nodes[i]);
		if (left < l->cluster->nodes[n].devices)
			return n;
		left -= l->cluster->nodes[n].devices;
	}
	return -1;
}

/* Element size of tensor @t in state @st. */
static inline int64_t esize(const struct ptc_schema *s, int st, int t)
{
	return (int64_t)ptc_dtype_size(ptc_schema_dtype(s, st, t));
}

/* --------------------------------------------------- random inputs */

/* 1-6 layers, 1-3 states, 1-5 tensor templates of 0-3 dims, split evenly,
 * in chunks or padded, placed first, last or everywhere; sometimes a tied
 * copy of a "first" tensor. */
static inline json_t *random_schema(void)
{
	static const char *dts[] = {"float64", "float32", "bfloat16", "int8", "int32", "uint8"};
	json_t *root = json_object(), *tensors = json_array(), *states = json_object();
	int layers = rndi(1, 6), ntmpl = rndi(1, 5);

	json_object_set_new(root, "num_layers", json_integer(layers));
	int nst = rndi(1, 3);
	json_object_set_new(states, "model", json_object());
	if (nst > 1)
		json_object_set_new(states, "optim/m", json_pack("{ss}", "dtype", dts[rndi(0, 5)]));
	if (nst > 2)
		json_object_set_new(states, "optim/v", json_pack("{ss}", "dtype", "float32"));
	json_object_set_new(root, "states", states);
	int tie_target = -1;
	for (int i = 0; i < ntmpl; i++) {
		json_t *t = json_object(), *shape = json_array();
		int nd = rndi(0, 3), kind = rndi(0, 9);
		char name[32];
		snprintf(name, sizeof(name), kind < 6 ? "l/{L}/t%d" : "t%d", i);
		json_object_set_new(t, "name", json_string(name));
		json_object_set_new(t, "dtype", json_string(dts[rndi(0, 5)]));
		int64_t dims[3];
		for (int d = 0; d < nd; d++) {
			dims[d] = rndi(1, 12);
			json_array_append_new(shape, json_integer(dims[d]));
		}
		json_object_set_new(t, "shape", shape);
		if (nd > 0 && rndi(0, 3) > 0) {
			int dim = rndi(0, nd - 1);
			json_t *split = json_pack("{si}", "dim", dim);
			int how = rndi(0, 3);
			if (how == 1 && dims[dim] % 2 == 0) {
				json_object_set_new(split, "chunks", json_integer(2));
			} else if (how == 2 && dims[dim] >= 3) {
				int64_t a = rndi(1, (int)dims[dim] - 2);
				int64_t b = rndi(1, (int)(dims[dim] - a - 1));
				json_object_set_new(split, "chunks",
						    json_pack("[III]", a, b, dims[dim] - a - b));
			} else if (how == 3) {
				json_object_set_new(split, "pad_multiple",
						    json_integer(rndi(1, 4)));
			}
			json_object_set_new(t, "split", split);
		}
		if (kind >= 6)
			json_object_set_new(t, "place",
					    json_string(kind == 6   ? "first"
							: kind == 7 ? "last"
								    : "all"));
		if (kind == 6 && tie_target < 0)
			tie_target = i;
		json_array_append_new(tensors, t);
	}
	if (tie_target >= 0 && rndi(0, 1)) {
		json_t *src = json_array_get(tensors, (size_t)tie_target);
		json_t *t = json_deep_copy(src);
		char name[32];
		snprintf(name, sizeof(name), "t%d/tied", tie_target);
		json_object_set_new(t, "name", json_string(name));
		json_object_set_new(t, "place", json_string("last"));
		json_object_set_new(t, "tied",
				    json_string(json_string_value(json_object_get(src, "name"))));
		json_array_append_new(tensors, t);
	}
	json_object_set_new(root, "tensors", tensors);
	return root;
}

/* Some nodes of @cl in random order, tp 1-4, pp 1-3 and dp 1-3 shrunk to fit
 * their devices. */
static inline struct ptc_config *random_config(const struct ptc_cluster *cl, int64_t version)
{
	int n = rndi(1, cl->nnodes), order[16], devices = 0;
	json_t *nodes = json_array();

	for (int i = 0; i < cl->nnodes; i++)
		order[i] = i;
	for (int i = cl->nnodes - 1; i > 0; i--) {
		int j = rndi(0, i), x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	for (int i = 0; i < n; i++) {
		json_array_append_new(nodes, json_string(cl->nodes[order[i]].id));
		devices += cl->nodes[order[i]].devices;
	}
	int tp = rndi(1, 4), pp = rndi(1, 3), dp = rndi(1, 3);
	while (tp * pp * dp > devices) {
		if (dp > 1)
			dp--;
		else if (pp > 1)
			pp--;
		else
			tp--;
	}
	json_t *j = json_pack("{sIsisisiso}", "version", (json_int_t)version, "tp", tp, "pp", pp,
			      "dp", dp, "nodes", nodes);
	struct ptc_config *c = NULL;
	struct ptc_error err;
	assert_int_equal(ptc_config_parse(j, "config.json", &c, &err), 0);
	json_decref(j);
	return c;
}

#endif
