/*
 * mlfs_memsize.c - what the store's metadata really costs in memory: the
 * allocations of a schema, a config, a layout, a view (partition table,
 * name trees, snapshots, its buffers' own allocations), a plan and a step
 * table, as the allocator sized them, so that st->mem (--max-memory,
 * status.json's memory_used) follows the daemon's resident memory.
 *
 * DESIGN
 * Every structure here is a tree of separate heap blocks whose free
 * functions are known (ptc_schema_free, mlfs_tree_free, ...): each block
 * costs its usable size (malloc_usable_size, which includes what the
 * allocator rounded up) plus the allocator's header (one size_t in glibc).
 * A block not yet allocated, of @n bytes, costs mlfs_mem_alloc(@n): the
 * same figure computed ahead (glibc's rounding), used for the partition
 * buffers a view will hold before they exist. Walks are O(blocks) and run
 * where the structure is built, never on a request's path.
 *
 * Threads: any; the structures walked must not change meanwhile.
 */
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>

#include "store/store.h"

/* The allocator's bookkeeping per block (glibc: the chunk's size field). */
#define ALLOC_HEADER ((int64_t)sizeof(size_t))
/* Blocks this large or larger are mappings of their own (glibc's
 * M_MMAP_THRESHOLD default; it may grow, which only moves blocks into the
 * heap at the same cost, rounded to pages). */
#define ALLOC_MMAP_MIN ((size_t)128 << 10)
/* The partition buffers that xf_buf.c maps rather than allocates
 * (XF_MAP_MIN there): their bytes are already counted as the partition's,
 * and their pages are touched only when written. */
#define BUF_MAP_MIN ((int64_t)1 << 20)

int64_t mlfs_mem_of(const void *p)
{
	return p ? (int64_t)malloc_usable_size((void *)p) + ALLOC_HEADER : 0;
}

int64_t mlfs_mem_alloc(size_t n)
{
	if (n >= ALLOC_MMAP_MIN) /* its own mapping: the header and a page's rounding */
		return (int64_t)((n + 2 * sizeof(size_t) + 4095) & ~(size_t)4095);
	/* a chunk: the request and its header, 16-byte aligned, at least 32 */
	size_t c = (n + sizeof(size_t) + 15) & ~(size_t)15;
	return (int64_t)(c < 32 ? 32 : c);
}

int64_t mlfs_mem_schema(const struct ptc_schema *s)
{
	if (!s)
		return 0;
	int64_t n = mlfs_mem_of(s) + mlfs_mem_of(s->model) + mlfs_mem_of(s->states) +
		    mlfs_mem_of(s->tensors) + mlfs_mem_of(s->tie_first) + mlfs_mem_of(s->tie_next) +
		    mlfs_mem_of(s->by_layer) + mlfs_mem_of(s->layer_off);
	for (int i = 0; i < s->nstates; i++)
		n += mlfs_mem_of(s->states[i].name);
	for (int i = 0; i < s->ntensors; i++)
		n += mlfs_mem_of(s->tensors[i].name) + mlfs_mem_of(s->tensors[i].chunks);
	return n;
}

int64_t mlfs_mem_tree(const struct mlfs_tnode *t)
{
	if (!t)
		return 0;
	int64_t n = mlfs_mem_of(t) + mlfs_mem_of(t->name) + mlfs_mem_of(t->child);
	for (int i = 0; i < t->nchild; i++)
		n += mlfs_mem_tree(t->child[i]);
	return n;
}

int64_t mlfs_mem_config(const struct ptc_config *c)
{
	if (!c)
		return 0;
	int64_t n = mlfs_mem_of(c) + mlfs_mem_of(c->nodes) + mlfs_mem_of(c->dataset_index) +
		    mlfs_mem_of(c->snap_dir);
	for (int i = 0; i < c->nnodes; i++)
		n += mlfs_mem_of(c->nodes[i]);
	return n;
}

int64_t mlfs_mem_layout(const struct ptc_layout *l)
{
	return mlfs_mem_of(l->ranks) + mlfs_mem_of(l->node_first_rank) +
	       mlfs_mem_of(l->node_nranks);
}

int64_t mlfs_mem_plan(const struct ptc_plan *p)
{
	return p ? mlfs_mem_of(p) + mlfs_mem_of(p->ops) + mlfs_mem_of(p->node_first_op) +
		       mlfs_mem_of(p->per_node)
		 : 0;
}

int64_t mlfs_mem_parts(const struct ptc_layout *l, int node)
{
	int64_t n = 0;
	int r0 = l->node_first_rank[node];
	int64_t head = mlfs_mem_alloc(sizeof(struct xf_buf));

	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[node]; r++)
		for (int s = 0; s < l->schema->nstates; s++)
			for (int t = 0; t < l->schema->ntensors; t++) {
				if (!ptc_layout_holds(l, r, t))
					continue;
				int64_t b = xf_partition_bytes(l, r, s, t);
				/* the struct, and a small buffer's block beyond its bytes
				 * (calloc of at least 1 byte) */
				n += head;
				if (b < BUF_MAP_MIN)
					n += mlfs_mem_alloc(b ? (size_t)b : 1) - b;
			}
	return n;
}

int64_t mlfs_mem_view(const struct mlfs_view *v)
{
	int64_t n = mlfs_mem_of(v) + mlfs_mem_config(v->config) + mlfs_mem_of(v->config_text) +
		    mlfs_mem_layout(&v->layout) + mlfs_mem_of(v->parts.bufs) +
		    mlfs_mem_of(v->snap) + mlfs_mem_of(v->snap_step) + mlfs_mem_of(v->psnap) +
		    mlfs_mem_of(v->psnap_step) + mlfs_mem_of(v->stage_tree) +
		    mlfs_mem_tree(v->full_tree) + mlfs_mem_of(v->cursor.segs);
	for (int p = 0; v->stage_tree && p < v->layout.pp; p++)
		n += mlfs_mem_tree(v->stage_tree[p]);
	return n;
}
