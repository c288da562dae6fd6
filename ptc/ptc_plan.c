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
 * picks each remote source by ptc_plan_pick_source, a function of (N,
 * tensor, state, old TP rank) every node evaluates alone, instead of by
 * the load, which needs every node's fetches in order. Its ops are N's ops
 * of the whole plan but for FETCH sources. What N serves is computed the
 * same way from the other side: for each group N's old ranks (or the down
 * nodes whose backup it keeps) hold, for each node D whose new ranks hold
 * it, D's missing rows (exactly what D fetches) charged to
 * ptc_plan_pick_source's choice.
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
 *
 * Files (ptc_plan_i.h holds what they share): this one plans the groups
 * and holds the entry points; ptc_plansrc.c indexes a group's old holders
 * and chooses remote sources (live replicas, then backups); ptc_plannode.c
 * the plan per node and what the node serves; ptc_planjson.c the plan as
 * JSON.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_plan_i.h"

/* backup lives in what was padding: plans keep their size and layout. */
_Static_assert(sizeof(struct ptc_op) == 64, "struct ptc_op grew");

void ptc_plan_free(struct ptc_plan *p)
{
	if (!p)
		return;
	free(p->ops);
	free(p->node_first_op);
	free(p->per_node);
	free(p);
}

/* Appends one op per state with @rows rows; FETCH picks a source per state
 * among @cands, those of old TP rank @t. */
static int emit(struct plan_ctx *c, const struct ptc_op *tmpl, const struct plan_cand *cands,
		int ncand, int t)
{
	int nst = c->s->nstates;

	if (ptc_plan_grow((void **)&c->ops, &c->cap, c->nops + (size_t)nst, sizeof(*c->ops)))
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
			const struct plan_cand *best = &cands[0];
			if (c->only >= 0)
				best = &cands[ptc_plan_pick_source(op->dst_node, c->group[0], st, t,
								   ncand, ptc_plan_small(c, t))];
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

static bool slice_equal(const struct ptc_slice *a, const struct ptc_slice *b)
{
	return a->rows == b->rows && a->nsegs == b->nsegs &&
	       memcmp(a->segs, b->segs, (size_t)a->nsegs * sizeof(a->segs[0])) == 0;
}

/* Remembers that @tensor has rows no surviving node holds. */
static void note_failure(struct plan_ctx *c, int tensor)
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
static int fetch(struct plan_ctx *c, int node, int rank, int tensor, int64_t lo, int64_t hi,
		 int64_t row)
{
	if (ptc_plan_grow((void **)&c->fet, &c->capfet, c->nfet + 1, sizeof(*c->fet)))
		return -ENOMEM;
	c->fet[c->nfet++] = (struct plan_fetched){lo, hi, row, rank, tensor};
	for (int64_t x = lo; x < hi;) {
		const struct plan_rowseg *rs = &c->rmap[ptc_plan_rmap_find(c, x)];
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
static int missing(struct plan_ctx *c, int node, int rank, int tensor, int64_t lo, int64_t hi,
		   int64_t row)
{
	for (int64_t x = lo; x < hi;) {
		int64_t next = hi;
		const struct plan_fetched *hit = NULL;
		for (size_t i = 0; i < c->nfet; i++) {
			const struct plan_fetched *f = &c->fet[i];
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
static int build_rows(struct plan_ctx *c, int node, size_t hlo, size_t hhi, int rank, int tensor,
		      int64_t g, int64_t len, int64_t row)
{
	for (int64_t x = g; x < g + len;) {
		const struct plan_holder *best = NULL;
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
static int build_partition(struct plan_ctx *c, int node, size_t hlo, size_t hhi, int rank,
			   int tensor)
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
	const struct plan_ivl *x = a, *y = b;
	return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorts and merges @n intervals in place; returns the new count. */
static size_t ivl_union(struct plan_ivl *v, size_t n)
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
int ptc_plan_missing_rows(struct plan_ctx *c, int r0, int r1, size_t hlo, size_t hhi)
{
	size_t nn = 0, nh = 0,
	       need = ((size_t)(r1 - r0) * (size_t)c->ngroup + (hhi - hlo)) * PTC_MAX_SEGS;
	if (ptc_plan_grow((void **)&c->need, &c->capneed, need, sizeof(struct plan_ivl)) ||
	    ptc_plan_grow((void **)&c->have, &c->caphave, need, sizeof(struct plan_ivl)))
		return -ENOMEM;
	for (int r = r0; r < r1; r++)
		for (int g = 0; g < c->ngroup; g++) {
			if (!ptc_layout_holds(c->to, r, c->group[g]))
				continue;
			const struct ptc_slice *sl = &c->new_sl[c->to->ranks[r].t];
			for (int i = 0; i < sl->nsegs; i++)
				if (sl->segs[i].global >= 0)
					c->need[nn++] =
					    (struct plan_ivl){sl->segs[i].global,
							      sl->segs[i].global + sl->segs[i].len};
		}
	for (size_t h = hlo; h < hhi; h++) {
		const struct ptc_slice *sl = &c->old_sl[c->hold[h].t];
		for (int i = 0; i < sl->nsegs; i++)
			if (sl->segs[i].global >= 0)
				c->have[nh++] = (struct plan_ivl){
				    sl->segs[i].global, sl->segs[i].global + sl->segs[i].len};
	}
	nn = ivl_union(c->need, nn);
	nh = ivl_union(c->have, nh);
	/* Each have interval cuts a need interval at most once more. */
	if (ptc_plan_grow((void **)&c->miss, &c->capmiss, nn + nh + 1, sizeof(struct plan_ivl)))
		return -ENOMEM;
	c->nmiss = 0;
	for (size_t i = 0, j = 0; i < nn; i++) {
		int64_t lo = c->need[i].lo;
		for (; j < nh && c->have[j].hi <= lo; j++)
			;
		for (size_t k = j; k < nh && c->have[k].lo < c->need[i].hi; k++) {
			if (c->have[k].lo > lo)
				c->miss[c->nmiss++] = (struct plan_ivl){lo, c->have[k].lo};
			if (c->have[k].hi > lo)
				lo = c->have[k].hi;
		}
		if (lo < c->need[i].hi)
			c->miss[c->nmiss++] = (struct plan_ivl){lo, c->need[i].hi};
	}
	return 0;
}

/* Adds to c->lower_bound the group's missing rows of new ranks [r0, r1) of
 * a node (ptc_plan_missing_rows), in bytes over every state. */
static int lower_bound(struct plan_ctx *c, int r0, int r1, size_t hlo, size_t hhi)
{
	int64_t rows = 0;
	int rc = ptc_plan_missing_rows(c, r0, r1, hlo, hhi);

	if (rc)
		return rc;
	for (size_t i = 0; i < c->nmiss; i++)
		rows += c->miss[i].hi - c->miss[i].lo;
	for (int st = 0; st < c->s->nstates; st++)
		c->lower_bound += rows * c->row_bytes[st];
	return 0;
}

/* The row bytes of the current group per state, and its old-layout index. */
int ptc_plan_start_group(struct plan_ctx *c)
{
	const struct ptc_tensor *t0 = &c->s->tensors[c->group[0]];
	int64_t outer, row_elems;

	ptc_tensor_geometry(t0, &outer, &row_elems);
	for (int st = 0; st < c->s->nstates; st++)
		c->row_bytes[st] = outer * row_elems *
				   (int64_t)ptc_dtype_size(ptc_schema_dtype(c->s, st, c->group[0]));
	return ptc_plan_index_group(c);
}

/* Plans one tie group: every new partition of its tensors on nodes
 * [n0, n1), node by node. */
int ptc_plan_group(struct plan_ctx *c, int n0, int n1)
{
	const struct ptc_layout *to = c->to;
	int rc;

	if ((rc = ptc_plan_start_group(c)))
		return rc;
	for (int node = n0; node < n1; node++) {
		int r0 = to->node_first_rank[node], r1 = r0 + to->node_nranks[node];
		size_t hlo, hhi;
		if (r0 < 0)
			continue;
		ptc_plan_local_holders(c, node, &hlo, &hhi);
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
void ptc_plan_set_group(struct plan_ctx *c, int i)
{
	c->ngroup = 0;
	c->group[c->ngroup++] = i;
	for (int j = c->s->tie_first[i]; j >= 0; j = c->s->tie_next[j])
		c->group[c->ngroup++] = j;
}

/* The buffers every group uses, sized by the layouts' TP degrees. */
int ptc_plan_ctx_alloc(struct plan_ctx *c)
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

static int plan_all(struct plan_ctx *c)
{
	const struct ptc_schema *s = c->s;
	int rc;

	if ((rc = ptc_plan_ctx_alloc(c)))
		return rc;
	for (int i = 0; i < s->ntensors; i++) {
		if (s->tensors[i].tied >= 0)
			continue;
		ptc_plan_set_group(c, i);
		if ((rc = ptc_plan_group(c, 0, c->to->cluster->nnodes)))
			return rc;
	}
	return 0;
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
	struct plan_ctx c = {.from = from,
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
	if ((rc = node < 0 ? plan_all(&c) : ptc_plan_node(&c)))
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
