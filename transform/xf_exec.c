/*
 * xf_exec.c - partition tables and the parallel plan executor.
 *
 * DESIGN
 * Data model: a struct xf_parts maps (rank, state, tensor) of one layout on
 * one node, for the node's own ranks only (its table does not grow with the
 * world), to a buffer holding that partition: `outer` blocks of `rows` rows
 * of `row_bytes` bytes (ptc_tensor_geometry, the rank's TP slice). A plan op
 * moves a row range, i.e. `outer` contiguous segments of rows * row_bytes.
 *
 * xf_execute builds the `to` table of a node from the `from` table and the
 * node's ops (plan->node_first_op[node] .. [node + 1]) in four steps:
 *  1. validate, on the calling thread: every op names a rank of the node, a
 *     tensor that rank holds, equal geometry on both sides and row ranges
 *     inside both partitions; sources exist with the size their layout says
 *     on the node the op names (a FETCH from a backup excepted: the rank's
 *     node is down and another serves its rows);
 *     no op writes into a REUSEd partition, no two ops write the same row,
 *     and no DUP reads rows that phase 1 writes. A malformed plan is
 *     -EINVAL before anything is allocated or copied.
 *  2. allocate, on the calling thread: a REUSEd partition takes a reference
 *     on the old buffer (no copy); every other partition of the node is a
 *     new zeroed buffer from @mem. Past the limit: -ENOSPC, `to` emptied.
 *  3. cut every COPY, FETCH, DUP and ZERO op into items of about XF_PIECE
 *     bytes: groups of outer blocks when a block's segment is small, row
 *     ranges (or byte ranges of one huge row) within a block when it is
 *     large. FETCH ops are cut into pieces by rows only, across all
 *     blocks, because the fetch callback speaks in rows of whole
 *     partitions; then small pieces (at most XF_BATCH_BYTES / 4) of one
 *     source node are batched, up to XF_BATCH_MAX pieces and
 *     XF_BATCH_BYTES, into one item: one fetch call, one request (a
 *     piece from a backup goes alone: its source is resolved late).
 *  4. run phase 0 items, join, then phase 1 items (DUPs read new partitions
 *     that phase 0 filled), each phase on @nthreads transformer workers: the
 *     calling thread plus nthreads - 1 pthreads, all taking the next item
 *     from one atomic index. The first error stops every worker.
 *  5. seal every new partition (xf_buf_seal: its XXH3, kept with the
 *     buffer, which is committed as it is), one item per partition, largest
 *     first, on the same workers; a REUSEd buffer keeps the checksum it has.
 *     The bytes were just written by this node's workers, so a partition
 *     that fits in the caches is hashed from them; a larger one is read
 *     back once more (BENCHMARKS.md, "Checksums", has the cost).
 *
 * Threads and invariants: transformer workers share no lock. They read
 * `from` buffers, which may be shared with FUSE readers and HTTP senders and
 * are never written here; they write only new buffers of `to`, which nobody
 * else sees until xf_execute returns, and step 1 guarantees that the items
 * of one phase write disjoint bytes and read nothing another item of the
 * same phase writes. @progress and the error word are the only shared
 * writes (atomics). `from` is never modified; on failure every entry of
 * `to` is put and every byte this call reserved is back in @mem.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "transform/xf.h"

/* Target size of one work item. */
#define XF_PIECE ((int64_t)1 << 20)
/* ------------------------------------------------------------- partitions */

/* Bytes per element of @tensor in @state. */
static int64_t elem_bytes(const struct ptc_schema *s, int state, int tensor)
{
	return (int64_t)ptc_dtype_size(ptc_schema_dtype(s, state, tensor));
}

int64_t xf_partition_bytes(const struct ptc_layout *l, int rank, int state, int tensor)
{
	const struct ptc_tensor *t = &l->schema->tensors[tensor];

	return ptc_partition_elems(t, l->tp, l->ranks[rank].t) *
	       elem_bytes(l->schema, state, tensor);
}

static size_t parts_count(const struct xf_parts *p)
{
	return xf_parts_count(p);
}

int xf_parts_init(struct xf_parts *p, const struct ptc_layout *l, int node)
{
	size_t n;

	memset(p, 0, sizeof(*p));
	if (node < 0 || node >= l->cluster->nnodes)
		return -EINVAL;
	p->layout = l;
	p->node = node;
	p->nstates = l->schema->nstates;
	p->ntensors = l->schema->ntensors;
	p->r0 = l->node_first_rank[node] < 0 ? 0 : l->node_first_rank[node];
	p->nranks = l->node_nranks[node];
	n = parts_count(p);
	p->bufs = calloc(n ? n : 1, sizeof(*p->bufs));
	return p->bufs ? 0 : -ENOMEM;
}

int xf_parts_alloc_zero(struct xf_parts *p, struct xf_mem *mem)
{
	const struct ptc_layout *l = p->layout;
	int r0 = l->node_first_rank[p->node], r1 = r0 + l->node_nranks[p->node];
	int rc;

	if (r0 < 0)
		return 0; /* no rank on the node */
	for (int r = r0; r < r1; r++)
		for (int st = 0; st < p->nstates; st++)
			for (int t = 0; t < p->ntensors; t++) {
				size_t i = xf_parts_index(p, r, st, t);
				if (p->bufs[i] || !ptc_layout_holds(l, r, t))
					continue;
				p->bufs[i] = xf_buf_new(mem, xf_partition_bytes(l, r, st, t), &rc);
				if (!p->bufs[i])
					return rc;
			}
	return 0;
}

/* Puts every entry of @p, keeping the table. */
static void parts_clear(struct xf_parts *p)
{
	size_t n = parts_count(p);

	for (size_t i = 0; i < n; i++) {
		xf_buf_put(p->bufs[i]);
		p->bufs[i] = NULL;
	}
}

void xf_parts_release(struct xf_parts *p)
{
	if (!p || !p->bufs)
		return;
	parts_clear(p);
	free(p->bufs);
	p->bufs = NULL;
}

int64_t xf_plan_new_bytes(const struct ptc_plan *plan, int node)
{
	if (node < 0 || node >= plan->nnodes)
		return 0;
	return plan->per_node[node].bytes_total - plan->per_node[node].bytes_reused;
}

/* -------------------------------------------------------------- validation */

/* A partition's shape as the executor sees it. */
struct geom {
	int64_t outer, rows, row_bytes;
};

static void geom_of(const struct ptc_layout *l, int rank, int state, int tensor, struct geom *g)
{
	const struct ptc_tensor *t = &l->schema->tensors[tensor];
	struct ptc_slice sl;
	int64_t row_elems;

	ptc_tensor_geometry(t, &g->outer, &row_elems);
	ptc_slice_compute(t, l->tp, l->ranks[rank].t, &sl);
	g->rows = sl.rows;
	g->row_bytes = row_elems * elem_bytes(l->schema, state, tensor);
}

/* Rows [row, row + n) lie inside a partition of @rows rows (no overflow). */
static bool rows_inside(int64_t row, int64_t n, int64_t rows)
{
	return row >= 0 && n >= 0 && row <= rows && n <= rows - row;
}

/* Rows of a new partition written by one op. */
struct span {
	size_t part;
	int64_t lo, hi;
	int phase;
};

static int cmp_span(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return (x->lo > y->lo) - (x->lo < y->lo);
}

/* What step 1 learns about the node's ops. */
struct check {
	const struct ptc_op *ops;
	size_t nops;
	size_t *reuse;	    /* per `to` entry: index in ops of its REUSE, or SIZE_MAX */
	struct span *spans; /* one per writing op, sorted */
	size_t nspans;
	bool has_fetch;
	struct xf_stats bytes;
};

/* Checks the source side of @op: the partition it reads exists with the
 * destination's geometry and holds the op's rows. A FETCH from a backup
 * reads old rank src_rank's rows from a node other than the rank's own (that
 * one is down), so the rank need not live on src_node. */
static int check_source(const struct ptc_op *op, const struct xf_parts *from,
			const struct xf_parts *to, const struct geom *dg)
{
	const struct ptc_layout *l = op->kind == PTC_OP_DUP ? to->layout : from->layout;
	struct geom sg;

	if (op->backup > 1 || (op->backup && op->kind != PTC_OP_FETCH))
		return -EINVAL; /* only a FETCH may read a backup */
	if (op->src_rank < 0 || op->src_rank >= l->world || op->src_tensor < 0 ||
	    op->src_tensor >= to->ntensors || op->src_node < 0 ||
	    op->src_node >= l->cluster->nnodes ||
	    (!op->backup && l->ranks[op->src_rank].node != op->src_node) ||
	    !ptc_layout_holds(l, op->src_rank, op->src_tensor))
		return -EINVAL;
	if (op->kind != PTC_OP_FETCH && op->src_node != to->node)
		return -EINVAL;
	geom_of(l, op->src_rank, op->state, op->src_tensor, &sg);
	if (sg.outer != dg->outer || sg.row_bytes != dg->row_bytes ||
	    !rows_inside(op->src_row, op->rows, sg.rows))
		return -EINVAL;
	if (op->kind == PTC_OP_REUSE &&
	    (op->src_row != 0 || op->dst_row != 0 || sg.rows != dg->rows || op->rows != dg->rows))
		return -EINVAL;
	if (op->kind == PTC_OP_COPY || op->kind == PTC_OP_REUSE) {
		const struct xf_buf *b = xf_parts_at(from, op->src_rank, op->state, op->src_tensor);
		if (!b || b->size != sg.outer * sg.rows * sg.row_bytes)
			return -EINVAL;
	}
	return 0;
}

/* Checks one op and records what it writes. */
static int check_op(struct check *c, size_t k, const struct xf_parts *from,
		    const struct xf_parts *to)
{
	const struct ptc_op *op = &c->ops[k];
	const struct ptc_layout *l = to->layout;
	struct geom dg;
	int rc;

	if (op->kind > PTC_OP_ZERO || op->phase != (op->kind == PTC_OP_DUP) ||
	    op->state >= to->nstates || op->tensor < 0 || op->tensor >= to->ntensors ||
	    op->dst_node != to->node || op->dst_rank < 0 || op->dst_rank >= l->world ||
	    l->ranks[op->dst_rank].node != to->node ||
	    !ptc_layout_holds(l, op->dst_rank, op->tensor))
		return -EINVAL;
	geom_of(l, op->dst_rank, op->state, op->tensor, &dg);
	if (!rows_inside(op->dst_row, op->rows, dg.rows) ||
	    op->bytes != dg.outer * op->rows * dg.row_bytes)
		return -EINVAL;
	if (op->kind != PTC_OP_ZERO && (rc = check_source(op, from, to, &dg)))
		return rc;

	size_t part = xf_parts_index(to, op->dst_rank, op->state, op->tensor);
	switch (op->kind) {
	case PTC_OP_REUSE:
		if (c->reuse[part] != SIZE_MAX)
			return -EINVAL;
		c->reuse[part] = k;
		c->bytes.bytes_reused += op->bytes;
		return 0;
	case PTC_OP_FETCH:
		c->has_fetch = true;
		c->bytes.bytes_fetched += op->bytes;
		break;
	case PTC_OP_ZERO:
		c->bytes.bytes_zeroed += op->bytes;
		break;
	default:
		c->bytes.bytes_copied += op->bytes;
		break;
	}
	c->spans[c->nspans++] = (struct span){part, op->dst_row, op->dst_row + op->rows, op->phase};
	return 0;
}

/* Whether any span of @part written in phase 1 meets rows [lo, hi). */
static bool phase1_writes(const struct check *c, size_t part, int64_t lo, int64_t hi)
{
	size_t a = 0, b = c->nspans;

	/* First span of @part ending after @lo: spans of a part are disjoint
	 * and sorted, so their ends are sorted too. */
	while (a < b) {
		size_t m = a + (b - a) / 2;
		const struct span *s = &c->spans[m];
		if (s->part < part || (s->part == part && s->hi <= lo))
			a = m + 1;
		else
			b = m;
	}
	for (; a < c->nspans && c->spans[a].part == part && c->spans[a].lo < hi; a++)
		if (c->spans[a].phase == 1)
			return true;
	return false;
}

/* Step 1. Fills @c; -EINVAL for a malformed plan, -ENOMEM. */
static int check_plan(struct check *c, const struct ptc_plan *plan, int node,
		      const struct xf_parts *from, const struct xf_parts *to)
{
	size_t n = parts_count(to);
	int rc;

	c->ops = plan->ops + plan->node_first_op[node];
	c->nops = plan->node_first_op[node + 1] - plan->node_first_op[node];
	c->reuse = malloc((n ? n : 1) * sizeof(*c->reuse));
	c->spans = malloc((c->nops ? c->nops : 1) * sizeof(*c->spans));
	if (!c->reuse || !c->spans)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		c->reuse[i] = SIZE_MAX;
	for (size_t k = 0; k < c->nops; k++)
		if ((rc = check_op(c, k, from, to)))
			return rc;

	qsort(c->spans, c->nspans, sizeof(*c->spans), cmp_span);
	for (size_t i = 0; i < c->nspans; i++) {
		const struct span *s = &c->spans[i];
		if (c->reuse[s->part] != SIZE_MAX)
			return -EINVAL; /* would write into a buffer shared with `from` */
		if (i && s[-1].part == s->part && s[-1].hi > s->lo)
			return -EINVAL; /* two ops write the same row */
	}
	for (size_t k = 0; k < c->nops; k++) {
		const struct ptc_op *op = &c->ops[k];
		if (op->kind == PTC_OP_DUP &&
		    phase1_writes(c, xf_parts_index(to, op->src_rank, op->state, op->src_tensor),
				  op->src_row, op->src_row + op->rows))
			return -EINVAL;
	}
	return 0;
}

/* ------------------------------------------------------------- allocation */

/* Step 2: every partition of the node, shared or new. */
static int alloc_parts(const struct check *c, const struct xf_parts *from, struct xf_parts *to,
		       struct xf_mem *mem)
{
	const struct ptc_layout *l = to->layout;
	int r0 = l->node_first_rank[to->node], r1 = r0 + l->node_nranks[to->node];
	int rc;

	if (r0 < 0)
		return 0; /* no rank on the node */
	for (int r = r0; r < r1; r++)
		for (int st = 0; st < to->nstates; st++)
			for (int t = 0; t < to->ntensors; t++) {
				size_t i = xf_parts_index(to, r, st, t);
				if (!ptc_layout_holds(l, r, t))
					continue;
				if (c->reuse[i] != SIZE_MAX) {
					const struct ptc_op *op = &c->ops[c->reuse[i]];
					to->bufs[i] = xf_buf_get(from->bufs[xf_parts_index(
					    from, op->src_rank, op->state, op->src_tensor)]);
					continue;
				}
				to->bufs[i] = xf_buf_new(mem, xf_partition_bytes(l, r, st, t), &rc);
				if (!to->bufs[i])
					return rc;
			}
	return 0;
}

/* ------------------------------------------------------------------ items */

/* A piece of one op: bytes [lo, hi) of its segment in outer blocks [o0, o1);
 * or fetch pieces [p0, p1) of the phase's (p1 > p0). */
struct item {
	const struct ptc_op *op;
	uint8_t *dst;
	const uint8_t *src; /* NULL for ZERO and FETCH */
	int64_t dst_rows, src_rows, outer, row_bytes;
	int64_t o0, o1, lo, hi;
	size_t p0, p1;
	int64_t bytes; /* written: for the progress count */
};

struct items {
	struct item *v;
	size_t n, cap;
	struct xf_piece *pieces; /* FETCH pieces, batched into items by batch_fetches */
	size_t np, pcap;
};

/* Room in *@v (*@cap elements of @elem bytes) for one more past @n,
 * doubling: 0 or -ENOMEM (*@v unchanged). */
static int grow(void **v, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return 0;
	size_t c = *cap ? 2 * *cap : 64;
	void *p = realloc(*v, c * elem);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

static int items_push(struct items *it, const struct item *tmpl, int64_t o0, int64_t o1, int64_t lo,
		      int64_t hi)
{
	if (grow((void **)&it->v, &it->cap, it->n, sizeof(*it->v)))
		return -ENOMEM;
	struct item *x = &it->v[it->n++];
	*x = *tmpl;
	x->o0 = o0;
	x->o1 = o1;
	x->lo = lo;
	x->hi = hi;
	x->bytes = (o1 - o0) * (hi - lo);
	return 0;
}

/* A FETCH piece: rows [a, b) of @op, into @tmpl's partition. */
static int pieces_push(struct items *it, const struct item *tmpl, int64_t a, int64_t b)
{
	if (grow((void **)&it->pieces, &it->pcap, it->np, sizeof(*it->pieces)))
		return -ENOMEM;
	struct xf_piece *p = &it->pieces[it->np++];
	*p = (struct xf_piece){.op = *tmpl->op,
			       .dst = tmpl->dst,
			       .dst_rows = tmpl->dst_rows,
			       .outer = tmpl->outer,
			       .row_bytes = tmpl->row_bytes};
	p->op.dst_row += a;
	p->op.src_row += a;
	p->op.rows = b - a;
	p->op.bytes = p->op.rows * p->outer * p->row_bytes;
	return 0;
}

static void items_free(struct items *it)
{
	free(it->v);
	free(it->pieces);
}

/* Pieces of one source that may share a request: the same node, not from a
 * backup (its holder is looked up per piece), the same dst_node sign. */
static bool batchable(const struct xf_piece *p)
{
	return !p->op.backup && p->op.bytes <= XF_BATCH_BYTES / 4;
}

/* The order of what a batch shares: batchable or not, the source node, the
 * dst_node sign; 0 when two pieces may share a request (both batchable). */
static int cmp_batch(const struct xf_piece *x, const struct xf_piece *y)
{
	int bx = batchable(x), by = batchable(y);
	if (bx != by)
		return bx - by;
	if (x->op.src_node != y->op.src_node)
		return x->op.src_node < y->op.src_node ? -1 : 1;
	return (x->op.dst_node < 0) - (y->op.dst_node < 0);
}

static int cmp_piece(const void *a, const void *b)
{
	const struct xf_piece *x = a, *y = b;
	int c = cmp_batch(x, y);
	if (c)
		return c;
	/* otherwise by destination: a total order, the same on every run */
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	return (x->op.dst_row > y->op.dst_row) - (x->op.dst_row < y->op.dst_row);
}

static bool same_batch(const struct xf_piece *a, const struct xf_piece *b)
{
	return batchable(a) && cmp_batch(a, b) == 0;
}

/* Step 3's end for one phase: its FETCH pieces into items, small pieces of
 * one source batched (XF_BATCH_MAX pieces, XF_BATCH_BYTES at most). */
static int batch_fetches(struct items *it)
{
	struct item tmpl = {0};
	int rc;

	if (it->np > 1)
		qsort(it->pieces, it->np, sizeof(*it->pieces), cmp_piece);
	for (size_t i = 0, j; i < it->np; i = j) {
		int64_t bytes = it->pieces[i].op.bytes;
		for (j = i + 1; j < it->np && j - i < XF_BATCH_MAX &&
				same_batch(&it->pieces[i], &it->pieces[j]) &&
				bytes + it->pieces[j].op.bytes <= XF_BATCH_BYTES;
		     j++)
			bytes += it->pieces[j].op.bytes;
		tmpl.op = &it->pieces[i].op;
		if ((rc = items_push(it, &tmpl, 0, 0, 0, 0)))
			return rc;
		struct item *x = &it->v[it->n - 1];
		x->p0 = i;
		x->p1 = j;
		x->bytes = bytes;
	}
	return 0;
}

/* Step 3 for one op. */
static int cut_op(struct items *it, const struct ptc_op *op, const struct xf_parts *from,
		  const struct xf_parts *to)
{
	struct item tmpl = {.op = op};
	struct geom dg, sg = {0};
	int64_t seg, rb;
	int rc;

	geom_of(to->layout, op->dst_rank, op->state, op->tensor, &dg);
	tmpl.dst = to->bufs[xf_parts_index(to, op->dst_rank, op->state, op->tensor)]->data;
	if (op->kind == PTC_OP_COPY || op->kind == PTC_OP_DUP) {
		const struct xf_parts *sp = op->kind == PTC_OP_DUP ? to : from;
		geom_of(sp->layout, op->src_rank, op->state, op->src_tensor, &sg);
		tmpl.src =
		    sp->bufs[xf_parts_index(sp, op->src_rank, op->state, op->src_tensor)]->data;
	}
	tmpl.dst_rows = dg.rows;
	tmpl.src_rows = sg.rows;
	tmpl.outer = dg.outer;
	tmpl.row_bytes = rb = dg.row_bytes;
	seg = op->rows * rb;
	if (seg == 0 || dg.outer == 0)
		return 0;

	if (op->kind == PTC_OP_FETCH) {
		int64_t per = XF_PIECE / (dg.outer * rb);
		per = per < 1 ? 1 : per;
		for (int64_t a = 0; a < op->rows; a += per) {
			int64_t b = op->rows - a < per ? op->rows : a + per;
			if ((rc = pieces_push(it, &tmpl, a, b)))
				return rc;
		}
	} else if (seg >= XF_PIECE) {
		/* Whole rows per piece, or byte ranges of a row larger than a piece. */
		int64_t chunk = rb <= XF_PIECE ? XF_PIECE / rb * rb : XF_PIECE;
		for (int64_t o = 0; o < dg.outer; o++)
			for (int64_t lo = 0; lo < seg; lo += chunk)
				if ((rc = items_push(it, &tmpl, o, o + 1, lo,
						     seg - lo < chunk ? seg : lo + chunk)))
					return rc;
	} else {
		int64_t k = XF_PIECE / seg;
		for (int64_t o = 0; o < dg.outer; o += k)
			if ((rc = items_push(it, &tmpl, o, dg.outer - o < k ? dg.outer : o + k, 0,
					     seg)))
				return rc;
	}
	return 0;
}

/* ---------------------------------------------------------------- workers */

struct run {
	const struct item *items;
	size_t nitems;
	const struct xf_piece *pieces;
	atomic_size_t next;
	atomic_int err;
	xf_fetch_fn fetch;
	void *fetch_arg;
	_Atomic int64_t *progress;
};

static int run_item(const struct run *r, const struct item *x)
{
	const struct ptc_op *op = x->op;
	int64_t rb = x->row_bytes, len = x->hi - x->lo;

	if (x->p1 > x->p0) {
		int rc = r->fetch(r->fetch_arg, r->pieces + x->p0, x->p1 - x->p0);
		return rc > 0 ? -EIO : rc;
	}
	for (int64_t o = x->o0; o < x->o1; o++) {
		uint8_t *d = x->dst + (o * x->dst_rows + op->dst_row) * rb + x->lo;
		if (op->kind == PTC_OP_ZERO)
			memset(d, 0, (size_t)len);
		else
			memcpy(d, x->src + (o * x->src_rows + op->src_row) * rb + x->lo,
			       (size_t)len);
	}
	return 0;
}

static void run_items(struct run *r)
{
	while (!atomic_load_explicit(&r->err, memory_order_relaxed)) {
		size_t i = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
		if (i >= r->nitems)
			return;
		const struct item *x = &r->items[i];
		int rc = run_item(r, x);
		if (rc) {
			int none = 0;
			atomic_compare_exchange_strong(&r->err, &none, rc);
			return;
		}
		if (r->progress)
			atomic_fetch_add_explicit(r->progress, x->bytes, memory_order_relaxed);
	}
}

static void *worker_main(void *arg)
{
	run_items(arg);
	return NULL;
}

/* Step 4 for one phase: the caller and up to nthreads - 1 workers. A worker
 * that cannot be started only makes the phase slower. */
static int run_phase(struct run *r, const struct items *it, int nthreads)
{
	r->items = it->v;
	r->nitems = it->n;
	r->pieces = it->pieces;
	atomic_store(&r->next, 0);
	if ((size_t)nthreads > it->n)
		nthreads = (int)it->n;
	mlfs_par_run(nthreads, worker_main, r);
	return atomic_load(&r->err);
}

/* ------------------------------------------------------------------ seals */

struct seals {
	struct xf_buf **v;
	size_t n;
	atomic_size_t next;
};

static void *seal_main(void *arg)
{
	struct seals *s = arg;
	for (;;) {
		size_t i = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
		if (i >= s->n)
			return NULL;
		xf_buf_seal(s->v[i]);
	}
}

static int cmp_size_desc(const void *a, const void *b)
{
	const struct xf_buf *x = *(struct xf_buf *const *)a, *y = *(struct xf_buf *const *)b;
	return (x->size < y->size) - (x->size > y->size);
}

/* Step 5: seals every buffer of @to that @c did not reuse; its bytes into
 * *@bytes. 0 or -ENOMEM. */
static int seal_parts(const struct check *c, struct xf_parts *to, int nthreads, int64_t *bytes)
{
	size_t n = parts_count(to);
	struct seals s = {.v = malloc((n ? n : 1) * sizeof(*s.v))};

	*bytes = 0;
	if (!s.v)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (to->bufs[i] && c->reuse[i] == SIZE_MAX) {
			s.v[s.n++] = to->bufs[i];
			*bytes += to->bufs[i]->size;
		}
	qsort(s.v, s.n, sizeof(*s.v), cmp_size_desc);
	atomic_init(&s.next, 0);
	mlfs_par_run((size_t)nthreads > s.n ? (int)(s.n ? s.n : 1) : nthreads, seal_main, &s);
	free(s.v);
	return 0;
}

/* --------------------------------------------------------------- executor */

/* The tables describe @node of two layouts of one schema; @to is empty. */
static bool tables_ok(const struct ptc_plan *plan, int node, const struct xf_parts *from,
		      const struct xf_parts *to)
{
	size_t n;

	if (!from->layout || !to->layout || !from->bufs || !to->bufs ||
	    from->layout->schema != to->layout->schema || node < 0 || node >= plan->nnodes ||
	    plan->nnodes != to->layout->cluster->nnodes || from->node != node || to->node != node ||
	    from->nstates != to->nstates || from->ntensors != to->ntensors ||
	    to->nstates != to->layout->schema->nstates ||
	    to->ntensors != to->layout->schema->ntensors ||
	    plan->node_first_op[node] > plan->node_first_op[node + 1] ||
	    plan->node_first_op[node + 1] > plan->nops)
		return false;
	n = parts_count(to);
	for (size_t i = 0; i < n; i++)
		if (to->bufs[i])
			return false;
	return true;
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int xf_execute(const struct ptc_plan *plan, int node, const struct xf_parts *from,
	       struct xf_parts *to, struct xf_mem *mem, int nthreads, xf_fetch_fn fetch,
	       void *fetch_arg, _Atomic int64_t *progress, struct xf_stats *stats)
{
	double t0 = now_seconds();
	struct check c = {0};
	struct items phase[2] = {{0}};
	struct run r = {.fetch = fetch, .fetch_arg = fetch_arg, .progress = progress};
	int rc;

	if (stats)
		memset(stats, 0, sizeof(*stats));
	if (!tables_ok(plan, node, from, to))
		return -EINVAL;
	atomic_init(&r.next, 0);
	atomic_init(&r.err, 0);
	nthreads = nthreads < 1 ? 1 : nthreads > MLFS_PAR_MAX ? MLFS_PAR_MAX : nthreads;

	if ((rc = check_plan(&c, plan, node, from, to)))
		goto err_free_check;
	if (c.has_fetch && !fetch) {
		rc = -EIO;
		goto err_free_check;
	}
	if ((rc = alloc_parts(&c, from, to, mem)))
		goto err_clear_to;
	for (size_t k = 0; k < c.nops; k++)
		if (c.ops[k].kind != PTC_OP_REUSE &&
		    (rc = cut_op(&phase[c.ops[k].phase], &c.ops[k], from, to)))
			goto err_free_items;
	if ((rc = batch_fetches(&phase[0])) || (rc = batch_fetches(&phase[1])))
		goto err_free_items;

	/* Shared partitions are done as soon as they are shared. */
	if (progress)
		atomic_fetch_add_explicit(progress, c.bytes.bytes_reused, memory_order_relaxed);
	if ((rc = run_phase(&r, &phase[0], nthreads)) || (rc = run_phase(&r, &phase[1], nthreads)))
		goto err_free_items;
	double t1 = now_seconds();
	int64_t summed = 0;
	if (!xf_sums_off() && (rc = seal_parts(&c, to, nthreads, &summed)))
		goto err_free_items;

	if (stats) {
		*stats = c.bytes;
		stats->bytes_summed = summed;
		stats->seconds = now_seconds() - t0;
		stats->seconds_sum = now_seconds() - t1;
	}
	items_free(&phase[0]);
	items_free(&phase[1]);
	free(c.reuse);
	free(c.spans);
	return 0;

err_free_items:
	items_free(&phase[0]);
	items_free(&phase[1]);
err_clear_to:
	parts_clear(to);
err_free_check:
	free(c.reuse);
	free(c.spans);
	return rc;
}
