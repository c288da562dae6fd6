/*
 * ptc_layout.c - rank coordinates, allocation, pipeline stages, slicing.
 *
 * DESIGN
 * Rank r has Megatron coordinates t = r % tp, d = (r / tp) % dp,
 * p = r / (tp * dp). Ranks fill the devices of config.nodes in order, so
 * the ranks of one node are consecutive. Stage p holds layers
 * [floor(p*L/pp), floor((p+1)*L/pp)).
 *
 * A split tensor's TP slice is a list of segments along the split dim: for
 * each chunk, the balanced range [floor(t*n/tp), floor((t+1)*n/tp)) of that
 * chunk (counted in units of "unit" rows, 1 by default, so that a unit, an
 * attention head, is never cut); with pad_multiple m the dim is padded to a
 * multiple of m*tp and divided evenly, the rows past the logical size being
 * zero padding.
 *
 * With "replicas": 1 the nodes of config.nodes form a ring for backups: the
 * saved state of config.nodes[i] is kept by config.nodes[(i + 1) % k].
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

void ptc_layout_release(struct ptc_layout *l)
{
	free(l->ranks);
	free(l->node_first_rank);
	free(l->node_nranks);
	memset(l, 0, sizeof(*l));
}

/* Checks that every chunk of every split tensor has at least tp rows. */
static int check_tp(const struct ptc_layout *l, const char *file, struct ptc_error *err)
{
	const struct ptc_schema *s = l->schema;

	for (int i = 0; i < s->ntensors; i++) {
		const struct ptc_tensor *t = &s->tensors[i];
		if (t->pad_multiple) {
			/* Padding may grow the tensor: keep it within 2^40 elements. */
			int64_t q = t->pad_multiple * l->tp, n = t->shape[t->split_dim];
			int64_t outer, row;
			ptc_tensor_geometry(t, &outer, &row);
			int64_t padded = (n + q - 1) / q * q;
			if (padded > ((int64_t)1 << 40) / (outer * row))
				return ptc_errorf(err,
						  "%s: \"tp\" = %d pads \"%s\" past 2^40 elements",
						  file, l->tp, t->name);
		}
		if (t->split_dim < 0 || t->pad_multiple)
			continue;
		for (int c = 0; c < t->nchunks; c++)
			if (t->unit > 1 && t->chunks[c] / t->unit < l->tp)
				return ptc_errorf(err,
						  "%s: \"tp\" = %d exceeds the %" PRId64
						  " units of %" PRId64
						  " rows (heads) of chunk %d of "
						  "\"%s\" (dim %d): a unit is never cut",
						  file, l->tp, t->chunks[c] / t->unit, t->unit, c,
						  t->name, t->split_dim);
			else if (t->chunks[c] < l->tp)
				return ptc_errorf(err,
						  "%s: \"tp\" = %d exceeds the %" PRId64
						  " rows of chunk %d of \"%s\" (dim %d)",
						  file, l->tp, t->chunks[c], c, t->name,
						  t->split_dim);
	}
	return 0;
}

int ptc_layout_init(struct ptc_layout *l, const struct ptc_schema *schema,
		    const struct ptc_config *config, const struct ptc_cluster *cluster,
		    const char *file, struct ptc_error *err)
{
	int64_t devices = 0;
	int rc;

	memset(l, 0, sizeof(*l));
	l->schema = schema;
	l->config = config;
	l->cluster = cluster;
	l->name = file;
	l->tp = config->tp;
	l->pp = config->pp;
	l->dp = config->dp;
	l->world = config->tp * config->pp * config->dp;

	for (int i = 0; i < config->nnodes; i++) {
		int n = ptc_cluster_find(cluster, config->nodes[i]);
		if (n < 0)
			return ptc_errorf(err, "%s: nodes[%d] = \"%s\" is not in the cluster", file,
					  i, config->nodes[i]);
		devices += cluster->nodes[n].devices;
	}
	if (l->world > devices)
		return ptc_errorf(err,
				  "%s: tp * pp * dp = %d ranks exceed the %" PRId64
				  " devices of its %d nodes",
				  file, l->world, devices, config->nnodes);
	/* Each node keeps a partition table of its own ranks x states x tensors
	 * (struct xf_parts): the limit is per node, on the node hosting the
	 * most ranks (ranks fill config.nodes in order), whatever the world. */
	int64_t left = l->world, most = 0;
	const char *most_id = NULL;
	for (int i = 0; i < config->nnodes && left > 0; i++) {
		int64_t dev = cluster->nodes[ptc_cluster_find(cluster, config->nodes[i])].devices;
		int64_t nr = dev < left ? dev : left;
		if (nr > most)
			most = nr, most_id = config->nodes[i];
		left -= nr;
	}
	int64_t slots = most * schema->nstates * schema->ntensors;
	if (slots > PTC_MAX_PARTITIONS)
		return ptc_errorf(err,
				  "%s: node \"%s\" hosts %" PRId64
				  " ranks x %d states x %d tensors = %" PRId64
				  " partitions, more than the limit %d per node",
				  file, most_id, most, schema->nstates, schema->ntensors, slots,
				  PTC_MAX_PARTITIONS);
	if (schema->num_layers > 0 && config->pp > schema->num_layers)
		return ptc_errorf(err, "%s: \"pp\" = %d exceeds the %d layers of the schema", file,
				  config->pp, schema->num_layers);
	if ((rc = check_tp(l, file, err)))
		return rc;

	l->ranks = calloc((size_t)l->world, sizeof(*l->ranks));
	l->node_first_rank = malloc((size_t)cluster->nnodes * sizeof(int));
	l->node_nranks = calloc((size_t)cluster->nnodes, sizeof(int));
	if (!l->ranks || !l->node_first_rank || !l->node_nranks) {
		ptc_layout_release(l);
		return -ENOMEM;
	}
	for (int i = 0; i < cluster->nnodes; i++)
		l->node_first_rank[i] = -1;

	int ni = 0, node = ptc_cluster_find(cluster, config->nodes[0]), dev = 0;
	for (int r = 0; r < l->world; r++) {
		struct ptc_rank *rk = &l->ranks[r];
		while (dev == cluster->nodes[node].devices) {
			node = ptc_cluster_find(cluster, config->nodes[++ni]);
			dev = 0;
		}
		rk->t = r % l->tp;
		rk->d = (r / l->tp) % l->dp;
		rk->p = r / (l->tp * l->dp);
		rk->node = node;
		rk->device = dev++;
		rk->layer_begin = (int)((int64_t)rk->p * schema->num_layers / l->pp);
		rk->layer_end = (int)((int64_t)(rk->p + 1) * schema->num_layers / l->pp);
		if (l->node_first_rank[node] < 0)
			l->node_first_rank[node] = r;
		l->node_nranks[node]++;
	}
	return 0;
}

int ptc_layout_backup_holder(const struct ptc_layout *l, int node)
{
	const struct ptc_config *c = l->config;

	if (c->replicas < 1 || c->nnodes < 2 || node < 0 || node >= l->cluster->nnodes)
		return -1;
	/* The ring is config.nodes order, not cluster order: the config names
	 * who backs up whom, so a new config may pair nodes differently. */
	for (int i = 0; i < c->nnodes; i++)
		if (strcmp(c->nodes[i], l->cluster->nodes[node].id) == 0)
			return ptc_cluster_find(l->cluster, c->nodes[(i + 1) % c->nnodes]);
	return -1;
}

int ptc_layout_sole_rank(const struct ptc_layout *l, int node, const bool *up)
{
	int holder = ptc_layout_backup_holder(l, node);
	if (holder >= 0 && holder != node && up[holder])
		return -1;
	int r0 = l->node_first_rank[node];
	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[node]; r++) {
		const struct ptc_rank *rk = &l->ranks[r];
		bool copy = false;
		for (int d = 0; d < l->dp && !copy; d++) {
			int other = l->ranks[ptc_layout_rank(l, rk->t, d, rk->p)].node;
			copy = d != rk->d && other != node && up[other];
		}
		if (!copy)
			return r;
	}
	return -1;
}

bool ptc_layout_stage_holds(const struct ptc_layout *l, int p, int ti)
{
	const struct ptc_tensor *t = &l->schema->tensors[ti];
	int64_t layers = l->schema->num_layers;

	switch (t->place) {
	case PTC_PLACE_LAYER:
		return t->layer >= p * layers / l->pp && t->layer < (p + 1) * layers / l->pp;
	case PTC_PLACE_FIRST:
		return p == 0;
	case PTC_PLACE_LAST:
		return p == l->pp - 1 && (t->tied < 0 || l->pp > 1);
	case PTC_PLACE_ALL:
		return true;
	}
	return false;
}

bool ptc_layout_holds(const struct ptc_layout *l, int r, int t)
{
	return ptc_layout_stage_holds(l, l->ranks[r].p, t);
}

static void seg_push(struct ptc_slice *s, int64_t global, int64_t len)
{
	struct ptc_seg *last = s->nsegs ? &s->segs[s->nsegs - 1] : NULL;

	if (len <= 0)
		return;
	if (last && ((global < 0 && last->global < 0) ||
		     (global >= 0 && last->global >= 0 && last->global + last->len == global))) {
		last->len += len;
	} else {
		s->segs[s->nsegs++] = (struct ptc_seg){s->rows, global, len};
	}
	s->rows += len;
}

void ptc_slice_compute(const struct ptc_tensor *t, int tp, int tpr, struct ptc_slice *out)
{
	out->nsegs = 0;
	out->rows = 0;
	if (t->split_dim < 0) {
		seg_push(out, 0, 1);
		return;
	}
	int64_t n = t->shape[t->split_dim];
	if (t->pad_multiple) {
		int64_t m = t->pad_multiple * tp;
		int64_t per = (n + m - 1) / m * m / tp;
		int64_t lo = tpr * per, hi = lo + per;
		int64_t end = hi < n ? hi : n;
		if (lo < n)
			seg_push(out, lo, end - lo);
		seg_push(out, -1, hi - (lo > n ? lo : n));
		return;
	}
	int64_t base = 0;
	for (int c = 0; c < t->nchunks; c++) {
		int64_t u = t->unit > 1 ? t->unit : 1, cn = t->chunks[c] / u; /* in units */
		int64_t lo = tpr * cn / tp * u, hi = (tpr + 1) * cn / tp * u;
		seg_push(out, base + lo, hi - lo);
		base += t->chunks[c];
	}
}

void ptc_tensor_geometry(const struct ptc_tensor *t, int64_t *outer, int64_t *row_elems)
{
	int64_t o = 1, r = 1;

	for (int i = 0; i < t->ndim; i++) {
		if (t->split_dim < 0 || i > t->split_dim)
			r *= t->shape[i];
		else if (i < t->split_dim)
			o *= t->shape[i];
	}
	*outer = o;
	*row_elems = r;
}

int ptc_partition_shape(const struct ptc_tensor *t, int tp, int tpr, int64_t *shape)
{
	memcpy(shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
	if (t->split_dim >= 0) {
		struct ptc_slice s;
		ptc_slice_compute(t, tp, tpr, &s);
		shape[t->split_dim] = s.rows;
	}
	return t->ndim;
}

int64_t ptc_tensor_elems(const struct ptc_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

int64_t ptc_partition_elems(const struct ptc_tensor *t, int tp, int tpr)
{
	int64_t shape[PTC_MAX_DIMS], n = 1;
	int nd = ptc_partition_shape(t, tp, tpr, shape);

	for (int i = 0; i < nd; i++)
		n *= shape[i];
	return n;
}
