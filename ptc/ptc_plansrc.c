/*
 * ptc_plansrc.c - where a plan reads a tie group's rows from.
 *
 * For the current group: its old holders sorted by node, the row map from
 * logical row to old TP rank, and the candidates per old TP rank: the
 * first holder on each surviving node, or, when none survives, the first
 * holder on each down node whose backup holder is up (marked backup,
 * served by that holder). A plan of the whole job picks among them by
 * load (ptc_plan.c); a plan per node by ptc_plan_pick_source, which every
 * node evaluates alone. ptc_plan.c's DESIGN block has the rules.
 */
#include <stdint.h>
#include <stdlib.h>

#include "ptc/ptc_plan_i.h"

/*
 * The source a plan per node reads rows of old TP rank @t of the group of
 * logical tensor @logical in @state from, among @ncand candidates (sorted by
 * node), for destination node @dst: round robin by destination node, rotated
 * by a hash of the piece, so that a node fetching a large stage reads it
 * from every replica at once. Every node evaluates it alone from the
 * layouts, so a server knows what it will be asked without a global pass;
 * the rows cut do not enter it, so a node fetches all its rows of one old
 * TP rank (per state) from one source. A @small piece (ptc_plan_small) is
 * not rotated: a node takes every small piece from the same replica, in
 * batches of one request each (xf_execute), where a rotation would cost
 * a request per piece for bytes that take less time to send than to ask
 * for; the destinations still spread over the replicas.
 */
int ptc_plan_pick_source(int dst, int logical, int state, int t, int ncand, bool small)
{
	uint64_t h =
	    (uint64_t)logical * 0x9E3779B97F4A7C15ull ^ (uint64_t)state << 40 ^ (uint64_t)t << 20;

	h ^= h >> 31; /* splitmix64's finaliser */
	h *= 0xBF58476D1CE4E5B9ull;
	h ^= h >> 27;
	h *= 0x94D049BB133111EBull;
	h ^= h >> 31;
	if (small)
		h = 0;
	return (int)(((uint64_t)dst + h % (uint64_t)ncand) % (uint64_t)ncand);
}

int64_t ptc_plan_small_bytes = PTC_PLAN_SMALL;

bool ptc_plan_small(const struct plan_ctx *c, int t)
{
	int64_t bytes = 0;
	for (int st = 0; st < c->s->nstates; st++)
		bytes += c->old_sl[t].rows * c->row_bytes[st];
	return bytes <= ptc_plan_small_bytes;
}

static int cmp_holder(const void *a, const void *b)
{
	const struct plan_holder *x = a, *y = b;
	if (x->node != y->node)
		return x->node < y->node ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

static int cmp_rowseg(const void *a, const void *b)
{
	const struct plan_rowseg *x = a, *y = b;
	return (x->global > y->global) - (x->global < y->global);
}

/* Builds the old-layout index of the current group: holders sorted by node,
 * the row map and the surviving candidates per old TP rank. */
int ptc_plan_index_group(struct plan_ctx *c)
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
				    (struct plan_rowseg){sg->global, sg->len, sg->local, t};
		}
	qsort(c->rmap, (size_t)c->nrmap, sizeof(*c->rmap), cmp_rowseg);

	c->nhold = 0;
	for (int g = 0; g < c->ngroup; g++)
		for (int p = 0; p < f->pp; p++) {
			if (!ptc_layout_stage_holds(f, p, c->group[g]))
				continue;
			size_t need = c->nhold + (size_t)f->tp * (size_t)f->dp;
			if (ptc_plan_grow((void **)&c->hold, &c->caphold, need, sizeof(*c->hold)))
				return -ENOMEM;
			for (int r = p * f->tp * f->dp; r < (p + 1) * f->tp * f->dp; r++)
				c->hold[c->nhold++] = (struct plan_holder){
				    f->ranks[r].node, r, replicated ? 0 : f->ranks[r].t,
				    c->group[g]};
		}
	qsort(c->hold, c->nhold, sizeof(*c->hold), cmp_holder);
	if (ptc_plan_grow((void **)&c->cand, &c->capcand, c->nhold + 1, sizeof(*c->cand)))
		return -ENOMEM;

	/* Candidates per old TP rank: the first holder on each surviving node;
	 * when there is none, the first holder on each down node whose backup
	 * holder is up. */
	int n = 0;
	for (int t = 0; t < f->tp; t++) {
		c->cand_off[t] = n;
		int last = -1;
		for (size_t i = 0; i < c->nhold; i++) {
			const struct plan_holder *h = &c->hold[i];
			if (h->t != t || h->node == last || c->down[h->node])
				continue;
			c->cand[n++] =
			    (struct plan_cand){h->node, h->rank, h->tensor, h->node, false};
			last = h->node;
		}
		if (n > c->cand_off[t] || !c->backup_of)
			continue;
		for (size_t i = 0; i < c->nhold; i++) { /* every holder of t is down */
			const struct plan_holder *h = &c->hold[i];
			int b = c->backup_of[h->node];
			if (h->t != t || h->node == last || b < 0 || c->down[b])
				continue;
			c->cand[n++] = (struct plan_cand){h->node, h->rank, h->tensor, b, true};
			last = h->node;
		}
	}
	c->cand_off[f->tp] = n;
	return 0;
}

/* The old holders on @node: [*lo, *hi) of c->hold. */
void ptc_plan_local_holders(const struct plan_ctx *c, int node, size_t *lo, size_t *hi)
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
int ptc_plan_rmap_find(const struct plan_ctx *c, int64_t x)
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
