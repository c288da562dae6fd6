/*
 * ptc_plan.c - the plan: how to build layout `to` from layout `from`.
 *
 * DESIGN
 * Every tensor is cut only along its split dim, so a box is a row range
 * [lo, hi) of the logical tensor (a replicated tensor is one row). Tensors
 * are handled in tie groups: a tensor and the tensors tied to it hold the
 * same logical data, so any of their old partitions can serve any of their
 * new ones.
 *
 * For each group and each destination node N (ranks in order):
 *  1. a new partition whose slice equals an old partition's on N is REUSEd
 *     (shared, not copied);
 *  2. otherwise each logical row range is COPYed from an old partition on N
 *     when one holds it (the one reaching furthest, to keep ops few);
 *  3. rows no old partition on N holds are "missing": the first rank of N
 *     that needs them FETCHes them from a surviving remote holder, and later
 *     ranks of N DUP them from that rank's new partition (phase 1), so each
 *     missing row crosses the network once per node;
 *  4. padding rows are ZEROed.
 * Remote sources are chosen per state and per piece as the candidate node
 * that has served the fewest bytes so far (ties: lowest node index), which
 * spreads reads of replicated data over every holder, deterministically.
 *
 * Backups (ptc_plan_compute_backups): an old TP rank that no surviving node
 * holds is read from the backups of the down nodes that held it, when their
 * backup holders are up. Such a candidate keeps the down node and its old
 * rank as the source (the rows are laid out as that rank's), is marked
 * `backup`, and is charged to its backup holder, which serves it. Backups
 * are a last resort: a live replica, however loaded, always wins, and a
 * down node hosts no new rank, so its partitions are never REUSEd or
 * COPYed; a backup holder that needs the rows FETCHes them from itself.
 *
 * A plan per node (ptc_plan_compute_node) runs the same steps for one
 * destination node N, on the groups its new ranks hold (found through the
 * schema's layer and tie indexes, so in the size of N's partitions), and
 * picks each remote source by pick_source, a function of (N, tensor, state,
 * old TP rank) every node evaluates alone, instead of by the load, which
 * needs every node's fetches in order. Its ops are N's ops of the whole
 * plan but for FETCH sources. What N serves is computed the same way from
 * the other side: for each group N's old ranks (or the down nodes whose
 * backup it keeps) hold, for each node D whose new ranks hold it, D's
 * missing rows (exactly what D fetches) charged to pick_source's choice.
 *
 * Every lookup over the schema is an index (struct ptc_schema's tie_first,
 * tie_next, by_layer, layer_off): no pass over all tensors inside a loop
 * over tensors.
 *
 * Invariants checked by the tests: applying the ops reproduces the new
 * layout exactly; per node, total = reused + local + network + zero;
 * network bytes equal the lower bound (missing logical rows per node); the
 * union of the plans per node is such a plan, with the whole plan's bytes,
 * and each node's bytes_out is what the others' plans fetch from it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

/* backup lives in what was padding: plans keep their size and layout. */
_Static_assert(sizeof(struct ptc_op) == 64, "struct ptc_op grew");

struct holder {
	int node, rank, t, tensor;
};

/* An old logical segment, for finding which old TP rank holds a row. */
struct rowseg {
	int64_t global, len, local;
	int t;
};

struct cand {
	int node, rank, tensor;
	int serve;   /* the node that serves it: @node, or its backup holder */
	bool backup; /* read from the backup of down node @node */
};

/* Rows fetched into node N for the current group. */
struct fetched {
	int64_t lo, hi, row;
	int rank, tensor;
};

struct ivl {
	int64_t lo, hi;
};

struct ctx {
	const struct ptc_layout *from, *to;
	const struct ptc_schema *s;
	const bool *down;
	const int *backup_of; /* per node: its backup holder, or -1; NULL: none */
	struct ptc_op *ops;
	size_t nops, cap;
	struct ptc_node_stats *stats;
	int64_t lower_bound;

	/* per tie group */
	int *group, ngroup;		   /* a tensor and the tensors tied to it */
	int64_t row_bytes[PTC_MAX_STATES]; /* per state */
	struct ptc_slice *old_sl, *new_sl;
	struct holder *hold;
	size_t nhold, caphold;
	struct rowseg *rmap;
	int nrmap;
	struct cand *cand;
	size_t capcand;
	int *cand_off;
	struct fetched *fet;
	size_t nfet, capfet;
	struct ivl *need, *have;
	size_t capneed, caphave;

	bool *failed; /* per tensor */
	int nfailed;
	struct ptc_error *err;

	/* A plan per node (ptc_plan_compute_node): the node, or -1 for the
	 * whole job; remote sources then follow pick_source, not the load. */
	int only;
	struct ivl *miss; /* missing rows of one node for the current group */
	size_t nmiss, capmiss;
	int *list; /* group roots, destination nodes */
	size_t caplist;
	int64_t served; /* bytes @only serves, all destinations together */
};

const char *ptc_op_kind_name(enum ptc_op_kind k)
{
	static const char *const names[] = {"reuse", "copy", "fetch", "dup", "zero"};
	return k <= PTC_OP_ZERO ? names[k] : "?";
}

void ptc_plan_free(struct ptc_plan *p)
{
	if (!p)
		return;
	free(p->ops);
	free(p->node_first_op);
	free(p->per_node);
	free(p);
}

static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 64;
	while (n < need)
		n *= 2;
	void *p = realloc(*buf, n * elem);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

/*
 * The source a plan per node reads rows of old TP rank @t of the group of
 * logical tensor @logical in @state from, among @ncand candidates (sorted by
 * node), for destination node @dst: round robin by destination node, rotated
 * by a hash of the piece. Every node evaluates it alone from the layouts, so
 * a server knows what it will be asked without a global pass; the rows
 * cut do not enter it, so a node fetches all its rows of one old TP rank
 * (per state) from one source.
 */
static int pick_source(int dst, int logical, int state, int t, int ncand)
{
	uint64_t h =
	    (uint64_t)logical * 0x9E3779B97F4A7C15ull ^ (uint64_t)state << 40 ^ (uint64_t)t << 20;

	h ^= h >> 31; /* splitmix64's finaliser */
	h *= 0xBF58476D1CE4E5B9ull;
	h ^= h >> 27;
	h *= 0x94D049BB133111EBull;
	h ^= h >> 31;
	return (int)(((uint64_t)dst + h % (uint64_t)ncand) % (uint64_t)ncand);
}

/* Appends one op per state with @rows rows; FETCH picks a source per state
 * among @cands, those of old TP rank @t. */
static int emit(struct ctx *c, const struct ptc_op *tmpl, const struct cand *cands, int ncand,
		int t)
{
	int nst = c->s->nstates;

	if (grow((void **)&c->ops, &c->cap, c->nops + (size_t)nst, sizeof(*c->ops)))
		return -ENOMEM;
	for (int st = 0; st < nst; st++) {
		struct ptc_op *op = &c->ops[c->nops++];
		*op = *tmpl;
		op->state = (uint16_t)st;
		op->bytes = tmpl->rows * c->row_bytes[st];
		struct ptc_node_stats *dst = &c->stats[op->dst_node];
		switch (op->kind) {
		case PTC_OP_REUSE:
			dst->bytes_reused += op->bytes;
			break;
		case PTC_OP_COPY:
		case PTC_OP_DUP:
			dst->bytes_local += op->bytes;
			break;
		case PTC_OP_ZERO:
			dst->bytes_zero += op->bytes;
			break;
		case PTC_OP_FETCH: {
			const struct cand *best = &cands[0];
			if (c->only >= 0)
				best = &cands[pick_source(op->dst_node, c->group[0], st, t, ncand)];
			for (int i = 1; i < ncand && c->only < 0; i++)
				if (c->stats[cands[i].serve].bytes_out <
				    c->stats[best->serve].bytes_out)
					best = &cands[i];
			op->src_node = best->node;
			op->src_rank = best->rank;
			op->src_tensor = best->tensor;
			op->backup = best->backup;
			dst->bytes_in += op->bytes;
			c->stats[best->serve].bytes_out += op->bytes;
			break;
		}
		}
		dst->bytes_total += op->bytes;
	}
	return 0;
}

static int cmp_holder(const void *a, const void *b)
{
	const struct holder *x = a, *y = b;
	if (x->node != y->node)
		return x->node < y->node ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

static int cmp_rowseg(const void *a, const void *b)
{
	const struct rowseg *x = a, *y = b;
	return (x->global > y->global) - (x->global < y->global);
}

static bool slice_equal(const struct ptc_slice *a, const struct ptc_slice *b)
{
	return a->rows == b->rows && a->nsegs == b->nsegs &&
	       memcmp(a->segs, b->segs, (size_t)a->nsegs * sizeof(a->segs[0])) == 0;
}

/* Builds the old-layout index of the current group: holders sorted by node,
 * the row map and the surviving candidates per old TP rank. */
static int index_group(struct ctx *c)
{
	const struct ptc_layout *f = c->from;
	const struct ptc_tensor *t0 = &c->s->tensors[c->group[0]];

	for (int t = 0; t < f->tp; t++)
		ptc_slice_compute(t0, f->tp, t, &c->old_sl[t]);
	for (int t = 0; t < c->to->tp; t++)
		ptc_slice_compute(t0, c->to->tp, t, &c->new_sl[t]);

	/* A replicated tensor is the same on every TP rank: index all its
	 * holders as TP rank 0 so that every one of them is a candidate. */
	bool replicated = t0->split_dim < 0;
	c->nrmap = 0;
	for (int t = 0; t < (replicated ? 1 : f->tp); t++)
		for (int i = 0; i < c->old_sl[t].nsegs; i++) {
			const struct ptc_seg *sg = &c->old_sl[t].segs[i];
			if (sg->global >= 0)
				c->rmap[c->nrmap++] =
				    (struct rowseg){sg->global, sg->len, sg->local, t};
		}
	qsort(c->rmap, (size_t)c->nrmap, sizeof(*c->rmap), cmp_rowseg);

	c->nhold = 0;
	for (int g = 0; g < c->ngroup; g++)
		for (int p = 0; p < f->pp; p++) {
			if (!ptc_layout_stage_holds(f, p, c->group[g]))
				continue;
			size_t need = c->nhold + (size_t)f->tp * (size_t)f->dp;
			if (grow((void **)&c->hold, &c->caphold, need, sizeof(*c->hold)))
				return -ENOMEM;
			for (int r = p * f->tp * f->dp; r < (p + 1) * f->tp * f->dp; r++)
				c->hold[c->nhold++] =
				    (struct holder){f->ranks[r].node, r,
						    replicated ? 0 : f->ranks[r].t, c->group[g]};
		}
	qsort(c->hold, c->nhold, sizeof(*c->hold), cmp_holder);
	if (grow((void **)&c->cand, &c->capcand, c->nhold + 1, sizeof(*c->cand)))
		return -ENOMEM;

	/* Candidates per old TP rank: the first holder on each surviving node;
	 * when there is none, the first holder on each down node whose backup
	 * holder is up. */
	int n = 0;
	for (int t = 0; t < f->tp; t++) {
		c->cand_off[t] = n;
		int last = -1;
		for (size_t i = 0; i < c->nhold; i++) {
			const struct holder *h = &c->hold[i];
			if (h->t != t || h->node == last || c->down[h->node])
				continue;
			c->cand[n++] = (struct cand){h->node, h->rank, h->tensor, h->node, false};
			last = h->node;
		}
		if (n > c->cand_off[t] || !c->backup_of)
			continue;
		for (size_t i = 0; i < c->nhold; i++) { /* every holder of t is down */
			const struct holder *h = &c->hold[i];
			int b = c->backup_of[h->node];
			if (h->t != t || h->node == last || b < 0 || c->down[b])
				continue;
			c->cand[n++] = (struct cand){h->node, h->rank, h->tensor, b, true};
			last = h->node;
		}
	}
	c->cand_off[f->tp] = n;
	return 0;
}

/* The old holders on @node: [*lo, *hi) of c->hold. */
static void local_holders(const struct ctx *c, int node, size_t *lo, size_t *hi)
{
	size_t a = 0, b = c->nhold;
	while (a < b) {
		size_t m = (a + b) / 2;
		if (c->hold[m].node < node)
			a = m + 1;
		else
			b = m;
	}
	*lo = a;
	while (a < c->nhold && c->hold[a].node == node)
		a++;
	*hi = a;
}

/* Index in rmap of the old segment holding row @x (rows are all covered). */
static int rmap_find(const struct ctx *c, int64_t x)
{
	int a = 0, b = c->nrmap;
	while (b - a > 1) {
		int m = (a + b) / 2;
		if (c->rmap[m].global <= x)
			a = m;
		else
			b = m;
	}
	return a;
}

/* Remembers that @tensor has rows no surviving node holds. */
static void note_failure(struct ctx *c, int tensor)
{
	const char *name = c->s->tensors[tensor].name;
	size_t n = strlen(c->err->text);

	if (c->failed[tensor])
		return;
	c->failed[tensor] = true;
	if (c->nfailed == 0)
		snprintf(c->err->text, sizeof(c->err->text), "no surviving copy of \"%s\"", name);
	else if (c->nfailed < 8)
		snprintf(c->err->text + n, sizeof(c->err->text) - n, ", \"%s\"", name);
	c->nfailed++;
}

/* FETCHes missing rows [lo, hi) into (rank, tensor) at local row @row,
 * one op per old segment crossed, and remembers them for DUPs. */
static int fetch(struct ctx *c, int node, int rank, int tensor, int64_t lo, int64_t hi, int64_t row)
{
	if (grow((void **)&c->fet, &c->capfet, c->nfet + 1, sizeof(*c->fet)))
		return -ENOMEM;
	c->fet[c->nfet++] = (struct fetched){lo, hi, row, rank, tensor};
	for (int64_t x = lo; x < hi;) {
		const struct rowseg *rs = &c->rmap[rmap_find(c, x)];
		int64_t end = rs->global + rs->len < hi ? rs->global + rs->len : hi;
		int nc = c->cand_off[rs->t + 1] - c->cand_off[rs->t];
		if (nc == 0) {
			note_failure(c, tensor);
		} else {
			struct ptc_op op = {.kind = PTC_OP_FETCH,
					    .tensor = tensor,
					    .dst_rank = rank,
					    .dst_node = node,
					    .dst_row = row + (x - lo),
					    .src_row = rs->local + (x - rs->global),
					    .rows = end - x};
			if (emit(c, &op, &c->cand[c->cand_off[rs->t]], nc, rs->t))
				return -ENOMEM;
		}
		x = end;
	}
	return 0;
}

/* Missing rows [lo, hi) for (rank, tensor) at local row @row: DUP what this
 * node already fetched, FETCH the rest. */
static int missing(struct ctx *c, int node, int rank, int tensor, int64_t lo, int64_t hi,
		   int64_t row)
{
	for (int64_t x = lo; x < hi;) {
		int64_t next = hi;
		const struct fetched *hit = NULL;
		for (size_t i = 0; i < c->nfet; i++) {
			const struct fetched *f = &c->fet[i];
			if (f->lo <= x && x < f->hi) {
				hit = f;
				break;
			}
			if (f->lo > x && f->lo < next)
				next = f->lo;
		}
		if (hit) {
			int64_t end = hit->hi < hi ? hit->hi : hi;
			struct ptc_op op = {.kind = PTC_OP_DUP,
					    .phase = 1,
					    .tensor = tensor,
					    .dst_rank = rank,
					    .dst_node = node,
					    .src_rank = hit->rank,
					    .src_node = node,
					    .src_tensor = hit->tensor,
					    .dst_row = row + (x - lo),
					    .src_row = hit->row + (x - hit->lo),
					    .rows = end - x};
			if (emit(c, &op, NULL, 0, 0))
				return -ENOMEM;
			x = end;
		} else {
			if (fetch(c, node, rank, tensor, x, next, row + (x - lo)))
				return -ENOMEM;
			x = next;
		}
	}
	return 0;
}

/* Builds logical rows [g, g + len) of (rank, tensor) at local row @row. */
static int build_rows(struct ctx *c, int node, size_t hlo, size_t hhi, int rank, int tensor,
		      int64_t g, int64_t len, int64_t row)
{
	for (int64_t x = g; x < g + len;) {
		const struct holder *best = NULL;
		const struct ptc_seg *bseg = NULL;
		int64_t next = g + len;
		for (size_t h = hlo; h < hhi; h++) {
			const struct ptc_slice *sl = &c->old_sl[c->hold[h].t];
			for (int i = 0; i < sl->nsegs; i++) {
				const struct ptc_seg *sg = &sl->segs[i];
				if (sg->global < 0)
					continue;
				if (sg->global <= x && x < sg->global + sg->len) {
					if (!bseg ||
					    sg->global + sg->len > bseg->global + bseg->len) {
						best = &c->hold[h];
						bseg = sg;
					}
				} else if (sg->global > x && sg->global < next) {
					next = sg->global;
				}
			}
		}
		if (bseg) {
			int64_t end = bseg->global + bseg->len;
			end = end < g + len ? end : g + len;
			struct ptc_op op = {.kind = PTC_OP_COPY,
					    .tensor = tensor,
					    .dst_rank = rank,
					    .dst_node = node,
					    .src_rank = best->rank,
					    .src_node = node,
					    .src_tensor = best->tensor,
					    .dst_row = row + (x - g),
					    .src_row = bseg->local + (x - bseg->global),
					    .rows = end - x};
			if (emit(c, &op, NULL, 0, 0))
				return -ENOMEM;
			x = end;
		} else {
			if (missing(c, node, rank, tensor, x, next, row + (x - g)))
				return -ENOMEM;
			x = next;
		}
	}
	return 0;
}

/* Builds the new partition of @tensor on @rank (hosted on @node). */
static int build_partition(struct ctx *c, int node, size_t hlo, size_t hhi, int rank, int tensor)
{
	const struct ptc_slice *ns = &c->new_sl[c->to->ranks[rank].t];

	for (size_t h = hlo; h < hhi; h++) {
		if (slice_equal(&c->old_sl[c->hold[h].t], ns)) {
			struct ptc_op op = {.kind = PTC_OP_REUSE,
					    .tensor = tensor,
					    .dst_rank = rank,
					    .dst_node = node,
					    .src_rank = c->hold[h].rank,
					    .src_node = node,
					    .src_tensor = c->hold[h].tensor,
					    .rows = ns->rows};
			return emit(c, &op, NULL, 0, 0);
		}
	}
	for (int i = 0; i < ns->nsegs; i++) {
		const struct ptc_seg *sg = &ns->segs[i];
		if (sg->global < 0) {
			struct ptc_op op = {.kind = PTC_OP_ZERO,
					    .tensor = tensor,
					    .dst_rank = rank,
					    .dst_node = node,
					    .src_rank = -1,
					    .src_node = -1,
					    .src_tensor = -1,
					    .dst_row = sg->local,
					    .rows = sg->len};
			if (emit(c, &op, NULL, 0, 0))
				return -ENOMEM;
		} else if (build_rows(c, node, hlo, hhi, rank, tensor, sg->global, sg->len,
				      sg->local)) {
			return -ENOMEM;
		}
	}
	return 0;
}

static int cmp_ivl(const void *a, const void *b)
{
	const struct ivl *x = a, *y = b;
	return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorts and merges @n intervals in place; returns the new count. */
static size_t ivl_union(struct ivl *v, size_t n)
{
	size_t m = 0;
	qsort(v, n, sizeof(*v), cmp_ivl);
	for (size_t i = 0; i < n; i++) {
		if (m && v[i].lo <= v[m - 1].hi) {
			if (v[i].hi > v[m - 1].hi)
				v[m - 1].hi = v[i].hi;
		} else {
			v[m++] = v[i];
		}
	}
	return m;
}

/* The logical rows new ranks [r0, r1) of a node need for the group that no
 * old partition on the node (holders [hlo, hhi)) holds: c->miss[0, nmiss),
 * sorted and disjoint. */
static int missing_rows(struct ctx *c, int r0, int r1, size_t hlo, size_t hhi)
{
	size_t nn = 0, nh = 0,
	       need = ((size_t)(r1 - r0) * (size_t)c->ngroup + (hhi - hlo)) * PTC_MAX_SEGS;
	if (grow((void **)&c->need, &c->capneed, need, sizeof(struct ivl)) ||
	    grow((void **)&c->have, &c->caphave, need, sizeof(struct ivl)))
		return -ENOMEM;
	for (int r = r0; r < r1; r++)
		for (int g = 0; g < c->ngroup; g++) {
			if (!ptc_layout_holds(c->to, r, c->group[g]))
				continue;
			const struct ptc_slice *sl = &c->new_sl[c->to->ranks[r].t];
			for (int i = 0; i < sl->nsegs; i++)
				if (sl->segs[i].global >= 0)
					c->need[nn++] =
					    (struct ivl){sl->segs[i].global,
							 sl->segs[i].global + sl->segs[i].len};
		}
	for (size_t h = hlo; h < hhi; h++) {
		const struct ptc_slice *sl = &c->old_sl[c->hold[h].t];
		for (int i = 0; i < sl->nsegs; i++)
			if (sl->segs[i].global >= 0)
				c->have[nh++] = (struct ivl){sl->segs[i].global,
							     sl->segs[i].global + sl->segs[i].len};
	}
	nn = ivl_union(c->need, nn);
	nh = ivl_union(c->have, nh);
	/* Each have interval cuts a need interval at most once more. */
	if (grow((void **)&c->miss, &c->capmiss, nn + nh + 1, sizeof(struct ivl)))
		return -ENOMEM;
	c->nmiss = 0;
	for (size_t i = 0, j = 0; i < nn; i++) {
		int64_t lo = c->need[i].lo;
		for (; j < nh && c->have[j].hi <= lo; j++)
			;
		for (size_t k = j; k < nh && c->have[k].lo < c->need[i].hi; k++) {
			if (c->have[k].lo > lo)
				c->miss[c->nmiss++] = (struct ivl){lo, c->have[k].lo};
			if (c->have[k].hi > lo)
				lo = c->have[k].hi;
		}
		if (lo < c->need[i].hi)
			c->miss[c->nmiss++] = (struct ivl){lo, c->need[i].hi};
	}
	return 0;
}

/* Adds to c->lower_bound the group's missing rows of new ranks [r0, r1) of
 * a node (missing_rows), in bytes over every state. */
static int lower_bound(struct ctx *c, int r0, int r1, size_t hlo, size_t hhi)
{
	int64_t rows = 0;
	int rc = missing_rows(c, r0, r1, hlo, hhi);

	if (rc)
		return rc;
	for (size_t i = 0; i < c->nmiss; i++)
		rows += c->miss[i].hi - c->miss[i].lo;
	for (int st = 0; st < c->s->nstates; st++)
		c->lower_bound += rows * c->row_bytes[st];
	return 0;
}

/* The row bytes of the current group per state, and its old-layout index. */
static int start_group(struct ctx *c)
{
	const struct ptc_tensor *t0 = &c->s->tensors[c->group[0]];
	int64_t outer, row_elems;

	ptc_tensor_geometry(t0, &outer, &row_elems);
	for (int st = 0; st < c->s->nstates; st++)
		c->row_bytes[st] = outer * row_elems *
				   (int64_t)ptc_dtype_size(ptc_schema_dtype(c->s, st, c->group[0]));
	return index_group(c);
}

/* Plans one tie group: every new partition of its tensors on nodes
 * [n0, n1), node by node. */
static int plan_group(struct ctx *c, int n0, int n1)
{
	const struct ptc_layout *to = c->to;
	int rc;

	if ((rc = start_group(c)))
		return rc;
	for (int node = n0; node < n1; node++) {
		int r0 = to->node_first_rank[node], r1 = r0 + to->node_nranks[node];
		size_t hlo, hhi;
		if (r0 < 0)
			continue;
		local_holders(c, node, &hlo, &hhi);
		c->nfet = 0;
		for (int r = r0; r < r1; r++)
			for (int g = 0; g < c->ngroup; g++)
				if (ptc_layout_holds(to, r, c->group[g]) &&
				    (rc = build_partition(c, node, hlo, hhi, r, c->group[g])))
					return rc;
		if ((rc = lower_bound(c, r0, r1, hlo, hhi)))
			return rc;
	}
	return 0;
}

static int cmp_op(const void *a, const void *b)
{
	const struct ptc_op *x = a, *y = b;
#define CMP(f)                                                                                     \
	do {                                                                                       \
		if (x->f != y->f)                                                                  \
			return x->f < y->f ? -1 : 1;                                               \
	} while (0)
	CMP(dst_node);
	CMP(phase);
	CMP(dst_rank);
	CMP(state);
	CMP(tensor);
	CMP(dst_row);
#undef CMP
	return 0;
}

static int check_inputs(const struct ptc_layout *from, const struct ptc_layout *to,
			const bool *down, struct ptc_error *err)
{
	if (from->schema != to->schema)
		return ptc_errorf(err, "plan: both layouts must share one schema");
	if (ptc_cluster_extends(from->cluster, to->cluster, err))
		return -EINVAL; /* nodes may join between the layouts, never leave */
	if (from->schema->nstates > PTC_MAX_STATES)
		return ptc_errorf(err, "plan: more than %d states", PTC_MAX_STATES);
	for (int n = 0; n < to->cluster->nnodes; n++)
		if (down[n] && to->node_nranks[n] > 0)
			return ptc_errorf(err, "%s: node \"%s\" is down but hosts ranks", to->name,
					  to->cluster->nodes[n].id);
	return 0;
}

/* The group of untied tensor @i: @i, then the tensors tied to it. */
static void set_group(struct ctx *c, int i)
{
	c->ngroup = 0;
	c->group[c->ngroup++] = i;
	for (int j = c->s->tie_first[i]; j >= 0; j = c->s->tie_next[j])
		c->group[c->ngroup++] = j;
}

/* The buffers every group uses, sized by the layouts' TP degrees. */
static int ctx_alloc(struct ctx *c)
{
	const struct ptc_schema *s = c->s;
	int maxtp = c->from->tp > c->to->tp ? c->from->tp : c->to->tp;
	size_t segs = (size_t)c->from->tp * PTC_MAX_SEGS;

	c->old_sl = malloc((size_t)c->from->tp * sizeof(*c->old_sl));
	c->new_sl = malloc((size_t)c->to->tp * sizeof(*c->new_sl));
	c->rmap = malloc(segs * sizeof(*c->rmap));
	c->cand_off = malloc(((size_t)maxtp + 1) * sizeof(int));
	c->failed = calloc((size_t)s->ntensors, sizeof(bool));
	c->group = malloc((size_t)s->ntensors * sizeof(int));
	if (!c->group || !c->old_sl || !c->new_sl || !c->rmap || !c->cand_off || !c->failed)
		return -ENOMEM;
	return 0;
}

static int plan_all(struct ctx *c)
{
	const struct ptc_schema *s = c->s;
	int rc;

	if ((rc = ctx_alloc(c)))
		return rc;
	for (int i = 0; i < s->ntensors; i++) {
		if (s->tensors[i].tied >= 0)
			continue;
		set_group(c, i);
		if ((rc = plan_group(c, 0, c->to->cluster->nnodes)))
			return rc;
	}
	return 0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Appends to c->list, from index *@n, the roots of the groups of the
 * tensors stages [p0, p1] of @l hold: found through the schema's layer
 * index, so in the size of the answer (plus the tensors that are not
 * {L}, a handful). */
static int stage_roots(struct ctx *c, const struct ptc_layout *l, int p0, int p1, size_t *n)
{
	const struct ptc_schema *s = c->s;
	int L = s->num_layers;

	for (int p = p0; p <= p1; p++) {
		int lb = (int)((int64_t)p * L / l->pp), le = (int)((int64_t)(p + 1) * L / l->pp);
		int a = s->layer_off[lb], b = s->layer_off[le], e = s->ntensors;
		if (grow((void **)&c->list, &c->caplist, *n + (size_t)(b - a + e - s->layer_off[L]),
			 sizeof(int)))
			return -ENOMEM;
		for (int i = a; i < b; i++)
			c->list[(*n)++] = ptc_schema_logical(s, s->by_layer[i]);
		for (int i = s->layer_off[L]; i < e; i++)
			if (ptc_layout_stage_holds(l, p, s->by_layer[i]))
				c->list[(*n)++] = ptc_schema_logical(s, s->by_layer[i]);
	}
	return 0;
}

/* Sorts c->list[0, n) and drops repeats; returns the new count. */
static size_t list_unique(struct ctx *c, size_t n)
{
	size_t m = 0;

	if (n == 0)
		return 0; /* c->list may be NULL */
	qsort(c->list, n, sizeof(int), cmp_int);
	for (size_t i = 0; i < n; i++)
		if (!m || c->list[m - 1] != c->list[i])
			c->list[m++] = c->list[i];
	return m;
}

/* Bytes that @c->only serves node @dst of the current group: @dst's missing
 * rows (the rows it FETCHes: its plan fetches each exactly once, cut at the
 * old segments), charged to the source pick_source gives it. */
static int serve_dst(struct ctx *c, int dst)
{
	const struct ptc_layout *to = c->to;
	int r0 = to->node_first_rank[dst], r1 = r0 + to->node_nranks[dst];
	size_t hlo, hhi;
	int rc;

	local_holders(c, dst, &hlo, &hhi);
	if ((rc = missing_rows(c, r0, r1, hlo, hhi)))
		return rc;
	for (size_t i = 0; i < c->nmiss; i++)
		for (int64_t x = c->miss[i].lo; x < c->miss[i].hi;) {
			const struct rowseg *rs = &c->rmap[rmap_find(c, x)];
			int64_t end = rs->global + rs->len;
			end = end < c->miss[i].hi ? end : c->miss[i].hi;
			int nc = c->cand_off[rs->t + 1] - c->cand_off[rs->t];
			const struct cand *cands = &c->cand[c->cand_off[rs->t]];
			for (int st = 0; nc && st < c->s->nstates; st++)
				if (cands[pick_source(dst, c->group[0], st, rs->t, nc)].serve ==
				    c->only)
					c->served += (end - x) * c->row_bytes[st];
			x = end;
		}
	return 0;
}

/* What @c->only serves of the current group: to every node whose new ranks
 * hold the group (the nodes of the stages holding it, found rank range by
 * rank range), when it is a candidate at all. */
static int serve_group(struct ctx *c)
{
	const struct ptc_layout *to = c->to;
	size_t n = 0;
	bool candidate = false;
	int rc;

	if ((rc = start_group(c)))
		return rc;
	for (int i = 0; i < c->cand_off[c->from->tp] && !candidate; i++)
		candidate = c->cand[i].serve == c->only;
	if (!candidate)
		return 0;
	for (int p = 0; p < to->pp; p++) {
		bool holds = false;
		for (int g = 0; g < c->ngroup && !holds; g++)
			holds = ptc_layout_stage_holds(to, p, c->group[g]);
		for (int r = p * to->tp * to->dp; holds && r < (p + 1) * to->tp * to->dp;) {
			int node = to->ranks[r].node;
			if (grow((void **)&c->list, &c->caplist, n + 1, sizeof(int)))
				return -ENOMEM;
			c->list[n++] = node;
			r = to->node_first_rank[node] + to->node_nranks[node];
		}
	}
	n = list_unique(c, n);
	for (size_t i = 0; i < n; i++)
		if ((rc = serve_dst(c, c->list[i])))
			return rc;
	return 0;
}

/*
 * The plan of node c->only: the groups its new ranks hold, planned for it
 * alone; then what it serves: the groups its old ranks hold, and those of
 * the down nodes whose backup it keeps, for every node that needs them.
 */
static int plan_node(struct ctx *c)
{
	const struct ptc_layout *f = c->from, *to = c->to;
	int node = c->only, nnodes = to->cluster->nnodes;
	size_t n = 0, *roots = NULL;
	int rc;

	if ((rc = ctx_alloc(c)))
		return rc;
	if (to->node_first_rank[node] >= 0) {
		int r0 = to->node_first_rank[node], r1 = r0 + to->node_nranks[node] - 1;
		if ((rc = stage_roots(c, to, to->ranks[r0].p, to->ranks[r1].p, &n)))
			return rc;
	}
	n = list_unique(c, n);
	for (size_t i = 0; i < n; i++) {
		set_group(c, c->list[i]);
		if ((rc = plan_group(c, node, node + 1)))
			return rc;
	}

	/* The groups it may serve: its old ranks', and its down wards'. */
	n = 0;
	for (int x = 0; x < nnodes && x < f->cluster->nnodes; x++) {
		bool mine = x == node || (c->backup_of && c->down[x] && c->backup_of[x] == node);
		int r0 = f->node_first_rank[x], r1 = r0 + f->node_nranks[x] - 1;
		if (mine && r0 >= 0 && (rc = stage_roots(c, f, f->ranks[r0].p, f->ranks[r1].p, &n)))
			return rc;
	}
	n = list_unique(c, n);
	if (n && !(roots = malloc(n * sizeof(*roots))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		roots[i] = (size_t)c->list[i];
	for (size_t i = 0; i < n; i++) {
		set_group(c, (int)roots[i]);
		if ((rc = serve_group(c)))
			break;
	}
	free(roots);
	return rc;
}

int ptc_plan_compute(const struct ptc_layout *from, const struct ptc_layout *to, const int *down,
		     int ndown, struct ptc_plan **out, struct ptc_error *err)
{
	return ptc_plan_compute_backups(from, to, down, ndown, NULL, out, err);
}

/* The plan of the whole job (@node -1) or of @node alone. */
static int plan_compute(const struct ptc_layout *from, const struct ptc_layout *to, const int *down,
			int ndown, const int *backup_of, int node, struct ptc_plan **out,
			struct ptc_error *err)
{
	struct ptc_error scratch;
	struct ctx c = {.from = from,
			.to = to,
			.s = from->schema,
			.backup_of = backup_of,
			.only = node,
			.err = err ? err : &scratch};
	int nnodes = to->cluster->nnodes; /* from's nodes come first */
	bool *isdown = calloc((size_t)nnodes, sizeof(bool));
	struct ptc_plan *p = calloc(1, sizeof(*p));
	int rc = -ENOMEM;

	*out = NULL;
	c.err->text[0] = '\0';
	c.err->code = 0;
	c.stats = calloc((size_t)nnodes, sizeof(*c.stats));
	if (!isdown || !p || !c.stats)
		goto out;
	for (int i = 0; i < ndown; i++) {
		if (down[i] < 0 || down[i] >= nnodes) {
			rc = ptc_errorf(c.err, "plan: down node index %d is out of range", down[i]);
			goto out;
		}
		isdown[down[i]] = true;
	}
	for (int n = 0; backup_of && n < nnodes; n++)
		if (backup_of[n] < -1 || backup_of[n] >= nnodes) {
			rc = ptc_errorf(c.err,
					"plan: backup holder %d of node \"%s\" is out of range",
					backup_of[n], to->cluster->nodes[n].id);
			goto out;
		}
	c.down = isdown;
	if ((rc = check_inputs(from, to, isdown, c.err)))
		goto out;
	if (node >= nnodes) {
		rc = ptc_errorf(c.err, "plan: node index %d is out of range", node);
		goto out;
	}
	/* The whole job's ops follow the world's partitions; a node's plan
	 * follows its own only (its layouts are bounded per node). */
	for (int k = 0; node < 0 && k < 2; k++) {
		const struct ptc_layout *l = k ? to : from;
		int64_t slots = (int64_t)l->world * c.s->nstates * c.s->ntensors;
		if (slots > PTC_MAX_JOB_PARTITIONS) {
			rc = ptc_error_set(c.err, -E2BIG,
					   "plan: %s: %d ranks x %d states x %d tensors = %" PRId64
					   " partitions, more than the limit %d of a plan of the "
					   "whole job: plan one node at a time",
					   l->name, l->world, c.s->nstates, c.s->ntensors, slots,
					   PTC_MAX_JOB_PARTITIONS);
			goto out;
		}
	}
	if ((rc = node < 0 ? plan_all(&c) : plan_node(&c)))
		goto out;
	if (node >= 0) /* what it serves, itself included (a backup it keeps) */
		c.stats[node].bytes_out = c.served;
	if (c.nfailed) {
		size_t n = strlen(c.err->text);
		if (c.nfailed > 8)
			snprintf(c.err->text + n, sizeof(c.err->text) - n, " and %d more",
				 c.nfailed - 8);
		rc = -EINVAL;
		c.err->code = rc;
		goto out;
	}

	rc = -ENOMEM;
	/* A node may have nothing to build: ops is never NULL, for the executor's
	 * ops + node_first_op[node]. */
	if (!c.ops && !(c.ops = malloc(sizeof(*c.ops))))
		goto out;
	qsort(c.ops, c.nops, sizeof(*c.ops), cmp_op);
	if (!(p->node_first_op = calloc((size_t)nnodes + 1, sizeof(size_t))))
		goto out;
	for (size_t i = 0; i < c.nops; i++)
		p->node_first_op[c.ops[i].dst_node + 1]++;
	for (int n = 0; n < nnodes; n++) {
		p->node_first_op[n + 1] += p->node_first_op[n];
		struct ptc_node_stats *st = &c.stats[n];
		p->bytes_total += st->bytes_total;
		p->bytes_reused += st->bytes_reused;
		p->bytes_local += st->bytes_local;
		p->bytes_network += st->bytes_in;
		p->bytes_zero += st->bytes_zero;
	}
	p->ops = c.ops;
	p->nops = c.nops;
	p->nnodes = nnodes;
	p->per_node = c.stats;
	p->lower_bound_network = c.lower_bound;
	c.ops = NULL;
	c.stats = NULL;
	*out = p;
	p = NULL;
	rc = 0;
out:
	free(c.old_sl);
	free(c.new_sl);
	free(c.rmap);
	free(c.cand);
	free(c.cand_off);
	free(c.hold);
	free(c.fet);
	free(c.need);
	free(c.have);
	free(c.failed);
	free(c.group);
	free(c.miss);
	free(c.list);
	free(c.ops);
	free(c.stats);
	free(isdown);
	ptc_plan_free(p);
	return rc;
}

int ptc_plan_compute_backups(const struct ptc_layout *from, const struct ptc_layout *to,
			     const int *down, int ndown, const int *backup_of,
			     struct ptc_plan **out, struct ptc_error *err)
{
	return plan_compute(from, to, down, ndown, backup_of, -1, out, err);
}

int ptc_plan_compute_node(const struct ptc_layout *from, const struct ptc_layout *to,
			  const int *down, int ndown, const int *backup_of, int node,
			  struct ptc_plan **out, struct ptc_error *err)
{
	if (node < 0) {
		*out = NULL;
		return ptc_errorf(err, "plan: node index %d is out of range", node);
	}
	return plan_compute(from, to, down, ndown, backup_of, node, out, err);
}

json_t *ptc_plan_op_to_json(const struct ptc_plan *p, size_t i, const struct ptc_layout *to)
{
	const struct ptc_schema *s = to->schema;
	const struct ptc_op *op = &p->ops[i];
	json_t *j = json_pack("{sssisssssssisIsIsI}", "op", ptc_op_kind_name(op->kind), "phase",
			      op->phase, "node", to->cluster->nodes[op->dst_node].id, "state",
			      s->states[op->state].name, "tensor", s->tensors[op->tensor].name,
			      "rank", op->dst_rank, "row", (json_int_t)op->dst_row, "rows",
			      (json_int_t)op->rows, "bytes", (json_int_t)op->bytes);
	if (j && op->src_rank >= 0) {
		json_object_set_new(j, "src_node",
				    json_string(to->cluster->nodes[op->src_node].id));
		json_object_set_new(j, "src_rank", json_integer(op->src_rank));
		json_object_set_new(j, "src_tensor", json_string(s->tensors[op->src_tensor].name));
		json_object_set_new(j, "src_row", json_integer(op->src_row));
	}
	if (j && op->backup)
		json_object_set_new(j, "backup", json_true());
	return j;
}

json_t *ptc_plan_to_json(const struct ptc_plan *p, const struct ptc_layout *from,
			 const struct ptc_layout *to, bool with_ops)
{
	json_t *o = json_object(), *nodes = json_object();

	json_object_set_new(o, "from_version", json_integer(from->config->version));
	json_object_set_new(o, "to_version", json_integer(to->config->version));
	json_object_set_new(o, "bytes_total", json_integer(p->bytes_total));
	json_object_set_new(o, "bytes_reused", json_integer(p->bytes_reused));
	json_object_set_new(o, "bytes_local", json_integer(p->bytes_local));
	json_object_set_new(o, "bytes_network", json_integer(p->bytes_network));
	json_object_set_new(o, "bytes_zero", json_integer(p->bytes_zero));
	json_object_set_new(o, "lower_bound_network", json_integer(p->lower_bound_network));
	json_object_set_new(o, "num_operations", json_integer((json_int_t)p->nops));
	for (int n = 0; n < p->nnodes; n++) {
		const struct ptc_node_stats *st = &p->per_node[n];
		json_object_set_new(
		    nodes, to->cluster->nodes[n].id,
		    json_pack("{sIsIsIsIsIsI}", "bytes_in", (json_int_t)st->bytes_in, "bytes_out",
			      (json_int_t)st->bytes_out, "bytes_local", (json_int_t)st->bytes_local,
			      "bytes_reused", (json_int_t)st->bytes_reused, "bytes_zero",
			      (json_int_t)st->bytes_zero, "bytes_total",
			      (json_int_t)st->bytes_total));
	}
	json_object_set_new(o, "per_node", nodes);
	if (!with_ops)
		return o;
	json_t *ops = json_array();
	for (size_t i = 0; i < p->nops; i++)
		json_array_append_new(ops, ptc_plan_op_to_json(p, i, to));
	json_object_set_new(o, "operations", ops);
	return o;
}
