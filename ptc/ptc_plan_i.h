/*
 * ptc_plan_i.h - internals shared by the plan's files (ptc.h is its API):
 * the state of one computation and the functions one file gives another.
 * The files, one job each:
 *   ptc_plan.c     the DESIGN block; a tie group's ops (REUSE, COPY, FETCH,
 *                  DUP, ZERO), the lower bound, the entry points
 *   ptc_plansrc.c  a group's old-layout index: its holders, row map and
 *                  source candidates per old TP rank (live replicas, else
 *                  backups), and the fixed source choice of a plan per node
 *   ptc_plannode.c the plan of one node: the groups its new ranks hold,
 *                  then what it serves the others
 *   ptc_planjson.c a plan and its ops as JSON (`mlfs plan`)
 *
 * Pure, as the rest of ptc/: a struct plan_ctx lives on the stack of one
 * call of ptc_plan_compute*, on one thread.
 */
#ifndef MLFS_PTC_PLAN_I_H
#define MLFS_PTC_PLAN_I_H

#include <stdlib.h>

#include "ptc/ptc_i.h"

/* An old partition of the current group: its node, rank, TP rank (0 for
 * every holder of a replicated tensor) and tensor. */
struct plan_holder {
	int node, rank, t, tensor;
};

/* An old logical segment, for finding which old TP rank holds a row. */
struct plan_rowseg {
	int64_t global, len, local;
	int t;
};

struct plan_cand {
	int node, rank, tensor;
	int serve;   /* the node that serves it: @node, or its backup holder */
	bool backup; /* read from the backup of down node @node */
};

/* Rows fetched into node N for the current group. */
struct plan_fetched {
	int64_t lo, hi, row;
	int rank, tensor;
};

struct plan_ivl {
	int64_t lo, hi;
};

struct plan_ctx {
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
	struct plan_holder *hold;
	size_t nhold, caphold;
	struct plan_rowseg *rmap;
	int nrmap;
	struct plan_cand *cand;
	size_t capcand;
	int *cand_off;
	struct plan_fetched *fet;
	size_t nfet, capfet;
	struct plan_ivl *need, *have;
	size_t capneed, caphave;

	bool *failed; /* per tensor */
	int nfailed;
	struct ptc_error *err;

	/* A plan per node (ptc_plan_compute_node): the node, or -1 for the
	 * whole job; remote sources then follow ptc_plan_pick_source, not the load. */
	int only;
	struct plan_ivl *miss; /* missing rows of one node for the current group */
	size_t nmiss, capmiss;
	int *list; /* group roots, destination nodes */
	size_t caplist;
	int64_t served; /* bytes @only serves, all destinations together */
};

/* Grows *@buf of *@cap elements of @elem bytes to hold @need, doubling.
 * Returns 0 or -ENOMEM (*@buf unchanged). */
static inline int ptc_plan_grow(void **buf, size_t *cap, size_t need, size_t elem)
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

/* ptc_plan.c */

/* The buffers every group uses, sized by the layouts' TP degrees. */
int ptc_plan_ctx_alloc(struct plan_ctx *c);
/* Makes untied tensor @i's tie group the current one. */
void ptc_plan_set_group(struct plan_ctx *c, int i);
/* The current group's row bytes per state and its old-layout index. */
int ptc_plan_start_group(struct plan_ctx *c);
/* Plans the current group on destination nodes [@n0, @n1). */
int ptc_plan_group(struct plan_ctx *c, int n0, int n1);
/* A node's missing rows of the current group into c->miss[0, nmiss). */
int ptc_plan_missing_rows(struct plan_ctx *c, int r0, int r1, size_t hlo, size_t hhi);

/* ptc_plansrc.c */

/* The source a plan per node reads from, among @ncand candidates. */
int ptc_plan_pick_source(int dst, int logical, int state, int t, int ncand, bool small);
/* Whether old TP rank @t's partitions of the current group, all states
 * together, are at most ptc_plan_small_bytes: a plan per node then takes
 * them from the destination's own replica (ptc_plan_pick_source). */
bool ptc_plan_small(const struct plan_ctx *c, int t);
/* Builds the old-layout index of the current group. */
int ptc_plan_index_group(struct plan_ctx *c);
/* The old holders on @node: [*lo, *hi) of c->hold. */
void ptc_plan_local_holders(const struct plan_ctx *c, int node, size_t *lo, size_t *hi);
/* Index in c->rmap of the old segment holding row @x. */
int ptc_plan_rmap_find(const struct plan_ctx *c, int64_t x);

/* ptc_plannode.c */

/* The plan of node c->only, and what it serves, into @c. */
int ptc_plan_node(struct plan_ctx *c);

#endif
