/*
 * mlfs_view.c - views: one layout version on this node, its partition table and
 * name trees, its snapshots of saved state (backups), partition and full
 * tensor headers.
 *
 * Threads: any; st->lock guards the buffer pointers of the current view.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "dataset/dataset.h"

/* ------------------------------------------------------------------ views */

struct mlfs_view *mlfs_view_get(struct mlfs_view *v)
{
	if (v)
		atomic_fetch_add(&v->refs, 1);
	return v;
}

void mlfs_view_put(struct mlfs_view *v)
{
	if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	int64_t meta = v->meta_bytes;
	struct xf_mem *mem = v->mem;
	xf_parts_release(&v->parts);
	if (v->snap)
		mlfs_bufs_put(v->snap, xf_parts_count(&v->parts));
	free(v->snap);
	free(v->snap_step);
	if (v->psnap)
		mlfs_bufs_put(v->psnap, xf_parts_count(&v->parts));
	free(v->psnap);
	free(v->psnap_step);
	if (v->stage_tree)
		for (int p = 0; p < v->layout.pp; p++)
			mlfs_tree_free(v->stage_tree[p]);
	free(v->stage_tree);
	mlfs_tree_free(v->full_tree);
	ptc_layout_release(&v->layout);
	ptc_config_free(v->config);
	free(v->config_text);
	mlfs_dataset_put(v->ds);
	free(v->cursor.segs);
	free(v);
	/* Give the freed metadata's pages back, so that RSS follows memory_used
	 * (freed blocks amid the heap stay resident otherwise); uncounted only
	 * then, so that memory_used never drops before RSS can. */
	if (meta >= (1 << 20))
		malloc_trim(0);
	xf_mem_release(mem, meta);
}

void mlfs_bufs_put(struct xf_buf **bufs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		xf_buf_put(bufs[i]);
		bufs[i] = NULL;
	}
}

void mlfs_view_snap(struct mlfs_store *st, struct mlfs_view *v, int rank, struct xf_buf **old)
{
	const struct xf_parts *p = &v->parts;
	if (!v->snap)
		return;
	/* Buffers are snapshotted for the node's own ranks (its table's). */
	for (int s = 0; xf_parts_local(p, rank) && s < p->nstates; s++)
		for (int t = 0; t < p->ntensors; t++) {
			size_t i = xf_parts_index(p, rank, s, t);
			struct xf_buf *was = v->snap[i];
			v->snap[i] = xf_buf_get(p->bufs[i]);
			if (old)
				old[s * p->ntensors + t] = was;
			else
				xf_buf_put(was);
		}
	v->snap_step[rank] = st->steps[rank];
}

void mlfs_view_psnap(struct mlfs_store *st, struct mlfs_view *v, int rank, int64_t step,
		     struct xf_buf **old)
{
	const struct xf_parts *p = &v->parts;
	if (!v->psnap || step <= 0 || step % v->config->snap_every || !xf_parts_local(p, rank))
		return;
	for (int s = 0; s < p->nstates; s++)
		for (int t = 0; t < p->ntensors; t++) {
			size_t i = xf_parts_index(p, rank, s, t);
			struct xf_buf *was = v->psnap[i];
			v->psnap[i] = mlfs_snap_owner(&v->layout, rank, t) &&
					      ptc_layout_holds(&v->layout, rank, t)
					  ? xf_buf_get(p->bufs[i])
					  : NULL;
			old[s * p->ntensors + t] = was;
		}
	v->psnap_step[rank] = step;
	mlfs_autosnap_wake(st);
}

void mlfs_view_snap_local(struct mlfs_store *st, struct mlfs_view *v, struct xf_buf **old)
{
	size_t per = (size_t)v->parts.nstates * (size_t)v->parts.ntensors;
	int r0 = v->layout.node_first_rank[st->node];
	for (int i = 0; v->snap && r0 >= 0 && i < v->layout.node_nranks[st->node]; i++)
		mlfs_view_snap(st, v, r0 + i, old ? old + (size_t)i * per : NULL);
}

struct xf_buf *mlfs_view_snap_get(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
				  int tensor, int64_t step, int64_t *have)
{
	const struct xf_parts *p = &v->parts;
	struct xf_buf *b = NULL;

	*have = -1;
	if (!v->snap || rank < 0 || rank >= v->layout.world || state < 0 || state >= p->nstates ||
	    tensor < 0 || tensor >= p->ntensors)
		return NULL;
	pthread_mutex_lock(&st->lock);
	*have = v->snap_step[rank];
	if (*have == step && xf_parts_local(p, rank))
		b = xf_buf_get(v->snap[xf_parts_index(p, rank, state, tensor)]);
	pthread_mutex_unlock(&st->lock);
	return b;
}

struct mlfs_view *mlfs_store_view(struct mlfs_store *st)
{
	pthread_mutex_lock(&st->lock);
	struct mlfs_view *v = mlfs_view_get(st->view);
	pthread_mutex_unlock(&st->lock);
	return v;
}

struct mlfs_view *mlfs_store_view_of(struct mlfs_store *st, int64_t version)
{
	struct mlfs_view *v = NULL;
	pthread_mutex_lock(&st->lock);
	if (st->view && st->view->config->version == version)
		v = mlfs_view_get(st->view);
	else if (st->retained && st->retained->config->version == version)
		v = mlfs_view_get(st->retained);
	pthread_mutex_unlock(&st->lock);
	return v;
}

int64_t mlfs_store_retained(struct mlfs_store *st, int64_t *step)
{
	pthread_mutex_lock(&st->lock);
	int64_t v = st->retained ? st->retained->config->version : 0;
	if (step)
		*step = st->retained_step;
	pthread_mutex_unlock(&st->lock);
	return v;
}

struct xf_buf *mlfs_store_part_get(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
				   int tensor)
{
	const struct xf_parts *p = &v->parts;
	struct xf_buf *b = NULL;

	if (rank < 0 || rank >= v->layout.world || state < 0 || state >= p->nstates || tensor < 0 ||
	    tensor >= p->ntensors)
		return NULL;
	pthread_mutex_lock(&st->lock);
	b = xf_buf_get(xf_parts_at(p, rank, state, tensor));
	pthread_mutex_unlock(&st->lock);
	return b;
}

int mlfs_view_new(struct mlfs_store *st, struct ptc_config *config, struct mlfs_dataset *ds,
		  const char *text, size_t len, const char *what, struct mlfs_view **out,
		  struct ptc_error *err)
{
	struct mlfs_view *v = calloc(1, sizeof(*v));
	int rc = -ENOMEM;

	if (!v) {
		ptc_config_free(config);
		mlfs_dataset_put(ds);
		return -ENOMEM;
	}
	atomic_init(&v->refs, 1);
	v->config = config;
	v->ds = ds;
	clock_gettime(CLOCK_REALTIME, &v->time);
	if (!(v->config_text = strndup(text, len)))
		goto err_put;
	if ((rc = mlfs_config_supported(config, st->multinode, what, err)) ||
	    (rc = ptc_layout_init(&v->layout, st->schema, config, mlfs_store_cluster(st), what,
				  err)))
		goto err_put;
	/* Counted in two steps, so that what can be known before allocating is
	 * refused before: the partition table (and snapshots), the step table,
	 * the layout and the local buffers' own allocations first; then, once
	 * built, the trees and everything else, measured (mlfs_memsize.c). */
	/* The table is the node's ranks x states x tensors (struct xf_parts). */
	size_t nparts = (size_t)v->layout.node_nranks[st->node] * (size_t)st->schema->nstates *
			(size_t)st->schema->ntensors;
	int64_t meta = mlfs_mem_alloc(nparts * sizeof(void *)) *
			   (1 + (config->replicas ? 1 : 0) + (config->snap_dir ? 1 : 0)) +
		       mlfs_mem_alloc((size_t)v->layout.world * sizeof(int64_t)) +
		       mlfs_mem_layout(&v->layout) + mlfs_mem_parts(&v->layout, st->node);
	if ((rc = xf_mem_reserve(&st->mem, meta))) {
		ptc_error_set(err, rc,
			      "%s: the metadata of this layout (%" PRId64
			      " bytes: its partition table and buffers) does not fit in "
			      "--max-memory (%" PRId64 " bytes in use of %" PRId64 ")",
			      what, meta, (int64_t)st->mem.used, st->mem.limit);
		goto err_put;
	}
	v->mem = &st->mem;
	v->meta_bytes = meta;
	rc = -ENOMEM;
	if (xf_parts_init(&v->parts, &v->layout, st->node))
		goto err_put;
	if (config->replicas) {
		if (!(v->snap = calloc(nparts, sizeof(*v->snap))) ||
		    !(v->snap_step = malloc((size_t)v->layout.world * sizeof(int64_t))))
			goto err_put;
		for (int r = 0; r < v->layout.world; r++)
			v->snap_step[r] = -1;
	}
	if (config->snap_dir) {
		if (!(v->psnap = calloc(nparts, sizeof(*v->psnap))) ||
		    !(v->psnap_step = malloc((size_t)v->layout.world * sizeof(int64_t))))
			goto err_put;
		for (int r = 0; r < v->layout.world; r++)
			v->psnap_step[r] = -1;
	}
	if (!(v->stage_tree = calloc((size_t)v->layout.pp, sizeof(*v->stage_tree))))
		goto err_put;
	int r0 = v->layout.node_first_rank[st->node];
	for (int r = r0; r >= 0 && r < r0 + v->layout.node_nranks[st->node]; r++) {
		int p = v->layout.ranks[r].p;
		if (!v->stage_tree[p] && !(v->stage_tree[p] = mlfs_tree_build_stage(&v->layout, p)))
			goto err_put;
	}
	if (!(v->full_tree = mlfs_tree_build_full(st->schema, mlfs_st_shard_max())))
		goto err_put;
	/* The rest, measured: the trees, the texts, the config; the table's
	 * and the layout's blocks replace their figures computed above. */
	int64_t all = mlfs_mem_view(v) - mlfs_mem_layout(&v->layout) - mlfs_mem_of(v->parts.bufs) -
		      mlfs_mem_of(v->snap) - mlfs_mem_of(v->psnap) + meta;
	if (all > meta) {
		if ((rc = xf_mem_reserve(&st->mem, all - meta))) {
			ptc_error_set(err, rc,
				      "%s: the metadata of this layout (%" PRId64
				      " bytes: partition table, buffers and name trees) does not "
				      "fit in --max-memory (%" PRId64 " bytes in use of %" PRId64
				      ")",
				      what, all, (int64_t)st->mem.used, st->mem.limit);
			goto err_put;
		}
		v->meta_bytes = all;
	}
	*out = v;
	return 0;

err_put:
	mlfs_view_put(v);
	return rc;
}

/* ---------------------------------------------------------------- headers */

size_t mlfs_part_header(const struct ptc_schema *s, const struct ptc_layout *l, int rank, int state,
			int tensor, char *buf, size_t cap)
{
	int64_t shape[PTC_MAX_DIMS];
	const struct ptc_tensor *t = &s->tensors[tensor];
	int nd = ptc_partition_shape(t, l->tp, l->ranks[rank].t, shape);
	return mlfs_npy_format(ptc_schema_dtype(s, state, tensor), nd, shape, buf, cap);
}

size_t mlfs_full_header(const struct ptc_schema *s, int state, int tensor, char *buf, size_t cap)
{
	const struct ptc_tensor *t = &s->tensors[tensor];
	return mlfs_npy_format(ptc_schema_dtype(s, state, tensor), t->ndim, t->shape, buf, cap);
}

/* ----------------------------------------------------------- full tensors */

int mlfs_view_full_sources(const struct mlfs_view *v, const struct ptc_schema *s, int node,
			   int state, int tensor, struct xf_buf **srcs)
{
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[node], nr = l->node_nranks[node];
	int n = s->tensors[tensor].split_dim < 0 ? 1 : l->tp;

	for (int t = 0; t < n; t++) {
		srcs[t] = NULL;
		for (int r = r0; r >= 0 && r < r0 + nr && !srcs[t]; r++) {
			if (l->ranks[r].t != t)
				continue;
			/* @tensor, then the tensors tied to it (the schema's tie
			 * index: no pass over every tensor) */
			int a = s->tensors[tensor].tied < 0 ? tensor : s->tie_first[tensor];
			for (; a >= 0 && !srcs[t];
			     a = a == tensor ? s->tie_first[tensor] : s->tie_next[a])
				srcs[t] = xf_buf_get(xf_parts_at(&v->parts, r, state, a));
		}
		if (!srcs[t]) {
			while (t > 0)
				xf_buf_put(srcs[--t]);
			return -EIO;
		}
	}
	return n;
}
