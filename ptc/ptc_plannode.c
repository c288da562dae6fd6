/*
 * ptc_plannode.c - the plan of one node (ptc_plan_compute_node).
 *
 * The groups node N's new ranks hold, found through the schema's layer and
 * tie indexes (in the size of N's partitions), are planned for N alone;
 * then what N serves: for each group its old ranks, or the down nodes whose
 * backup it keeps, hold, and each node D whose new ranks hold it, D's
 * missing rows charged to the source ptc_plan_pick_source gives D.
 * ptc_plan.c's DESIGN block has the rules.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "ptc/ptc_plan_i.h"

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Appends to c->list, from index *@n, the roots of the groups of the
 * tensors stages [p0, p1] of @l hold: found through the schema's layer
 * index, so in the size of the answer (plus the tensors that are not
 * {L}, a handful). */
static int stage_roots(struct plan_ctx *c, const struct ptc_layout *l, int p0, int p1, size_t *n)
{
	const struct ptc_schema *s = c->s;
	int L = s->num_layers;

	for (int p = p0; p <= p1; p++) {
		int lb = (int)((int64_t)p * L / l->pp), le = (int)((int64_t)(p + 1) * L / l->pp);
		int a = s->layer_off[lb], b = s->layer_off[le], e = s->ntensors;
		if (ptc_plan_grow((void **)&c->list, &c->caplist,
				  *n + (size_t)(b - a + e - s->layer_off[L]), sizeof(int)))
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
static size_t list_unique(struct plan_ctx *c, size_t n)
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
 * old segments), charged to the source ptc_plan_pick_source gives it. */
static int serve_dst(struct plan_ctx *c, int dst)
{
	const struct ptc_layout *to = c->to;
	int r0 = to->node_first_rank[dst], r1 = r0 + to->node_nranks[dst];
	size_t hlo, hhi;
	int rc;

	ptc_plan_local_holders(c, dst, &hlo, &hhi);
	if ((rc = ptc_plan_missing_rows(c, r0, r1, hlo, hhi)))
		return rc;
	for (size_t i = 0; i < c->nmiss; i++)
		for (int64_t x = c->miss[i].lo; x < c->miss[i].hi;) {
			const struct plan_rowseg *rs = &c->rmap[ptc_plan_rmap_find(c, x)];
			int64_t end = rs->global + rs->len;
			end = end < c->miss[i].hi ? end : c->miss[i].hi;
			int nc = c->cand_off[rs->t + 1] - c->cand_off[rs->t];
			const struct plan_cand *cands = &c->cand[c->cand_off[rs->t]];
			bool small = ptc_plan_small(c, rs->t);
			for (int st = 0; nc && st < c->s->nstates; st++)
				if (cands[ptc_plan_pick_source(dst, c->group[0], st, rs->t, nc,
							       small)]
					.serve == c->only)
					c->served += (end - x) * c->row_bytes[st];
			x = end;
		}
	return 0;
}

/* What @c->only serves of the current group: to every node whose new ranks
 * hold the group (the nodes of the stages holding it, found rank range by
 * rank range), when it is a candidate at all. */
static int serve_group(struct plan_ctx *c)
{
	const struct ptc_layout *to = c->to;
	size_t n = 0;
	bool candidate = false;
	int rc;

	if ((rc = ptc_plan_start_group(c)))
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
			if (ptc_plan_grow((void **)&c->list, &c->caplist, n + 1, sizeof(int)))
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
int ptc_plan_node(struct plan_ctx *c)
{
	const struct ptc_layout *f = c->from, *to = c->to;
	int node = c->only, nnodes = to->cluster->nnodes;
	size_t n = 0, *roots = NULL;
	int rc;

	if ((rc = ptc_plan_ctx_alloc(c)))
		return rc;
	if (to->node_first_rank[node] >= 0) {
		int r0 = to->node_first_rank[node], r1 = r0 + to->node_nranks[node] - 1;
		if ((rc = stage_roots(c, to, to->ranks[r0].p, to->ranks[r1].p, &n)))
			return rc;
	}
	n = list_unique(c, n);
	for (size_t i = 0; i < n; i++) {
		ptc_plan_set_group(c, c->list[i]);
		if ((rc = ptc_plan_group(c, node, node + 1)))
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
		ptc_plan_set_group(c, (int)roots[i]);
		if ((rc = serve_group(c)))
			break;
	}
	free(roots);
	return rc;
}
