/*
 * plan_fixture.h - the checker of plans shared by test_plan.c and
 * test_plan_backup.c: a scenario (schema, cluster, layouts A and B, down
 * nodes, backups) and check_plan, which applies a plan to synthetic data.
 *
 * check_plan:
 *  - lays out synthetic data per A (every byte a function of state, logical
 *    tensor and global element), applies the plan's ops in memory and checks
 *    every new partition equals the data laid out per B (zero padding);
 *  - checks every destination row is written exactly once, sources are where
 *    the op says, COPY/DUP stay on the node and FETCH never reads a down node;
 *  - checks network bytes equal a lower bound computed here row by row, and
 *    that unchanged partitions are reused, never copied;
 *  - checks balance: every serving node had served no more than any other
 *    candidate before its last piece;
 *  - with backups, checks that a FETCH marked backup reads a down node whose
 *    backup holder is up, only rows no surviving node holds, and is charged
 *    to that holder.
 * The row maps and stage placement (model.h) and the lower bound are
 * written independently of ptc's.
 */
#ifndef MLFS_TESTS_PLAN_FIXTURE_H
#define MLFS_TESTS_PLAN_FIXTURE_H

#include "tests/unit/model.h"

/* ------------------------------------------------------ partition buffers */

/* Partition buffers of one layout: [rank][state][tensor]. */
struct world {
	const struct ptc_layout *l;
	int ns, nt;
	uint8_t **buf;
	int64_t *rows;
	int64_t **map;
};

static size_t widx(const struct world *w, int r, int st, int t)
{
	return ((size_t)r * (size_t)w->ns + (size_t)st) * (size_t)w->nt + (size_t)t;
}

static void world_init(struct world *w, const struct ptc_layout *l, bool fill)
{
	const struct ptc_schema *s = l->schema;
	size_t n = (size_t)l->world * (size_t)s->nstates * (size_t)s->ntensors;

	w->l = l;
	w->ns = s->nstates;
	w->nt = s->ntensors;
	w->buf = calloc(n, sizeof(*w->buf));
	w->rows = calloc(n, sizeof(*w->rows));
	w->map = calloc(n, sizeof(*w->map));
	for (int r = 0; r < l->world; r++)
		for (int t = 0; t < s->ntensors; t++) {
			if (!holds(l, r, t))
				continue;
			const struct ptc_tensor *T = &s->tensors[t];
			int logical = T->tied >= 0 ? T->tied : t;
			int64_t outer, rowel, nrows, N;
			ptc_tensor_geometry(T, &outer, &rowel);
			N = T->split_dim < 0 ? 1 : T->shape[T->split_dim];
			for (int st = 0; st < s->nstates; st++) {
				size_t i = widx(w, r, st, t);
				int64_t es = esize(s, st, t);
				w->map[i] = rowmap(T, l->tp, r % l->tp, &nrows);
				w->rows[i] = nrows;
				size_t bytes = (size_t)(outer * nrows * rowel * es);
				w->buf[i] = malloc(bytes ? bytes : 1);
				memset(w->buf[i], fill ? 0xAA : 0x55, bytes);
				if (!fill)
					continue;
				for (int64_t o = 0; o < outer; o++)
					for (int64_t lr = 0; lr < nrows; lr++) {
						int64_t g = w->map[i][lr];
						if (g < 0)
							continue;
						for (int64_t e = 0; e < rowel; e++)
							for (int b = 0; b < es; b++)
								w->buf[i]
								      [((o * nrows + lr) * rowel +
									e) *
									   es +
								       b] =
								    data_byte(
									st, logical,
									(o * N + g) * rowel + e, b);
					}
			}
		}
}

static void world_free(struct world *w)
{
	size_t n = (size_t)w->l->world * (size_t)w->ns * (size_t)w->nt;
	for (size_t i = 0; i < n; i++) {
		free(w->buf[i]);
		free(w->map[i]);
	}
	free(w->buf);
	free(w->rows);
	free(w->map);
}

/* Copies rows between two partitions of one tensor geometry. */
static void copy_rows(uint8_t *dst, int64_t dst_rows, int64_t dst_row, const uint8_t *src,
		      int64_t src_rows, int64_t src_row, int64_t rows, int64_t outer, int64_t rowb)
{
	for (int64_t o = 0; o < outer; o++)
		memcpy(dst + (o * dst_rows + dst_row) * rowb, src + (o * src_rows + src_row) * rowb,
		       (size_t)(rows * rowb));
}

/* -------------------------------------------------------------- the check */

struct scenario {
	struct ptc_schema *schema;
	struct ptc_cluster *cluster;
	struct ptc_config *a, *b;
	struct ptc_layout la, lb;
	int down[16], ndown;
	bool isdown[16];
	bool backups;	   /* A keeps backups: pass backup_of to the planner */
	int backup_of[16]; /* per cluster node: its backup holder, or -1 */
};

/* Whether a down node @n has a backup the plan may read. */
static bool backup_ok(const struct scenario *sc, int n)
{
	return sc->backups && sc->backup_of[n] >= 0 && !sc->isdown[sc->backup_of[n]];
}

/* The node that serves FETCH @op: its source, or the source's backup holder. */
static int serving_node(const struct scenario *sc, const struct ptc_op *op)
{
	return op->backup ? sc->backup_of[op->src_node] : op->src_node;
}

static int plan_scenario(const struct scenario *sc, struct ptc_plan **p, struct ptc_error *err)
{
	return ptc_plan_compute_backups(&sc->la, &sc->lb, sc->down, sc->ndown,
					sc->backups ? sc->backup_of : NULL, p, err);
}

/* Independent: logical rows every node needs that it lacks, in bytes; and
 * whether any needed row has no surviving holder. */
static int64_t lower_bound(const struct scenario *sc, bool *unsourced)
{
	const struct ptc_schema *s = sc->schema;
	int64_t total = 0;
	*unsourced = false;

	for (int L = 0; L < s->ntensors; L++) {
		if (s->tensors[L].tied >= 0)
			continue;
		const struct ptc_tensor *T = &s->tensors[L];
		int64_t N = T->split_dim < 0 ? 1 : T->shape[T->split_dim], outer, rowel;
		ptc_tensor_geometry(T, &outer, &rowel);
		bool *alive = calloc((size_t)N, 1);
		for (int r = 0; r < sc->la.world; r++)
			for (int t = 0; t < s->ntensors; t++) {
				int n = node_of(&sc->la, r);
				if ((t != L && s->tensors[t].tied != L) || !holds(&sc->la, r, t) ||
				    (sc->isdown[n] && !backup_ok(sc, n)))
					continue;
				int64_t nr,
				    *m = rowmap(&s->tensors[t], sc->la.tp, r % sc->la.tp, &nr);
				for (int64_t i = 0; i < nr; i++)
					if (m[i] >= 0)
						alive[m[i]] = true;
				free(m);
			}
		for (int n = 0; n < sc->cluster->nnodes; n++) {
			bool *need = calloc((size_t)N, 1), *have = calloc((size_t)N, 1);
			for (int k = 0; k < 2; k++) {
				const struct ptc_layout *l = k ? &sc->lb : &sc->la;
				for (int r = 0; r < l->world; r++) {
					if (node_of(l, r) != n)
						continue;
					for (int t = 0; t < s->ntensors; t++) {
						if ((t != L && s->tensors[t].tied != L) ||
						    !holds(l, r, t))
							continue;
						int64_t nr, *m = rowmap(&s->tensors[t], l->tp,
									r % l->tp, &nr);
						for (int64_t i = 0; i < nr; i++)
							if (m[i] >= 0)
								(k ? need : have)[m[i]] = true;
						free(m);
					}
				}
			}
			for (int64_t g = 0; g < N; g++) {
				if (!need[g] || have[g])
					continue;
				if (!alive[g])
					*unsourced = true;
				for (int st = 0; st < s->nstates; st++)
					total += outer * rowel * esize(s, st, L);
			}
			free(need);
			free(have);
		}
		free(alive);
	}
	return total;
}

static bool same_map(const int64_t *a, int64_t na, const int64_t *b, int64_t nb)
{
	return na == nb && memcmp(a, b, (size_t)na * sizeof(int64_t)) == 0;
}

/* A FETCH from a backup: allowed by the scenario, reading the old rank of
 * the down node it names, and only rows that no surviving node holds.
 * @srcmap is the global row of each local row of the source partition. */
static void check_backup_op(const struct scenario *sc, const struct ptc_op *op,
			    const int64_t *srcmap)
{
	const struct ptc_schema *s = sc->schema;
	int logical = ptc_schema_logical(s, op->tensor);

	assert_true(backup_ok(sc, op->src_node));
	assert_int_equal(node_of(&sc->la, op->src_rank), op->src_node);
	for (int r = 0; r < sc->la.world; r++) {
		if (sc->isdown[node_of(&sc->la, r)])
			continue;
		for (int t = 0; t < s->ntensors; t++) {
			if (ptc_schema_logical(s, t) != logical || !holds(&sc->la, r, t))
				continue;
			int64_t nr, *m = rowmap(&s->tensors[t], sc->la.tp, r % sc->la.tp, &nr);
			for (int64_t i = 0; i < nr; i++)
				for (int64_t k = 0; k < op->rows; k++)
					assert_true(m[i] < 0 || m[i] != srcmap[op->src_row + k]);
			free(m);
		}
	}
}

/* Checks plan @p of the whole job; @greedy: also its greedy balance (the
 * whole job's plan; the union of plans per node follows another rule). */
static void check_plan_with(const struct scenario *sc, const struct ptc_plan *p, bool greedy)
{
	const struct ptc_schema *s = sc->schema;
	struct world old, neu;
	size_t n;

	world_init(&old, &sc->la, true);
	world_init(&neu, &sc->lb, false);
	n = (size_t)sc->lb.world * (size_t)s->nstates * (size_t)s->ntensors;
	int64_t **cover = calloc(n, sizeof(*cover));
	bool *reused = calloc(n, sizeof(bool));
	for (size_t i = 0; i < n; i++)
		if (neu.buf[i])
			cover[i] = calloc((size_t)neu.rows[i], sizeof(int64_t));

	int64_t node_out[16] = {0}, node_in[16] = {0};
	for (size_t k = 0; k < p->nops; k++) {
		const struct ptc_op *op = &p->ops[k];
		assert_true(op->dst_rank >= 0 && op->dst_rank < sc->lb.world);
		assert_int_equal(op->dst_node, node_of(&sc->lb, op->dst_rank));
		assert_true(k == 0 || op->dst_node >= p->ops[k - 1].dst_node);
		assert_true(p->node_first_op[op->dst_node] <= k &&
			    k < p->node_first_op[op->dst_node + 1]);
		size_t di = widx(&neu, op->dst_rank, op->state, op->tensor);
		assert_non_null(neu.buf[di]);
		const struct ptc_tensor *T = &s->tensors[op->tensor];
		int64_t outer, rowel;
		ptc_tensor_geometry(T, &outer, &rowel);
		int64_t rowb = rowel * esize(s, op->state, op->tensor);
		assert_true(op->dst_row >= 0 && op->rows > 0 &&
			    op->dst_row + op->rows <= neu.rows[di]);
		assert_int_equal(op->bytes, op->rows * outer * rowb);
		for (int64_t r = op->dst_row; r < op->dst_row + op->rows; r++)
			cover[di][r]++;
		reused[di] = op->kind == PTC_OP_REUSE;
		if (op->kind == PTC_OP_ZERO) {
			for (int64_t r = op->dst_row; r < op->dst_row + op->rows; r++)
				assert_int_equal(neu.map[di][r], -1);
			uint8_t *z = calloc((size_t)(op->rows * rowb), 1);
			for (int64_t o = 0; o < outer; o++)
				memcpy(neu.buf[di] + (o * neu.rows[di] + op->dst_row) * rowb, z,
				       (size_t)(op->rows * rowb));
			free(z);
			continue;
		}
		int logical = T->tied >= 0 ? T->tied : op->tensor;
		int slogical = s->tensors[op->src_tensor].tied >= 0
				   ? s->tensors[op->src_tensor].tied
				   : op->src_tensor;
		assert_int_equal(logical, slogical);
		const struct world *src = op->kind == PTC_OP_DUP ? &neu : &old;
		const struct ptc_layout *sl = op->kind == PTC_OP_DUP ? &sc->lb : &sc->la;
		assert_true(op->src_rank >= 0 && op->src_rank < sl->world);
		assert_int_equal(op->src_node, node_of(sl, op->src_rank));
		size_t si = widx(src, op->src_rank, op->state, op->src_tensor);
		assert_non_null(src->buf[si]);
		assert_true(op->src_row >= 0 && op->src_row + op->rows <= src->rows[si]);
		switch (op->kind) {
		case PTC_OP_REUSE:
			assert_int_equal(op->dst_row, 0);
			assert_int_equal(op->rows, neu.rows[di]);
			assert_true(
			    same_map(neu.map[di], neu.rows[di], src->map[si], src->rows[si]));
			/* fall through */
		case PTC_OP_COPY:
			assert_int_equal(op->phase, 0);
			assert_int_equal(op->src_node, op->dst_node);
			break;
		case PTC_OP_FETCH:
			assert_int_equal(op->phase, 0);
			assert_int_not_equal(op->src_node, op->dst_node);
			assert_int_equal(sc->isdown[op->src_node], op->backup);
			if (op->backup)
				check_backup_op(sc, op, src->map[si]);
			node_out[serving_node(sc, op)] += op->bytes;
			node_in[op->dst_node] += op->bytes;
			break;
		case PTC_OP_DUP:
			assert_int_equal(op->phase, 1);
			assert_int_equal(op->src_node, op->dst_node);
			break;
		default:
			fail();
		}
		if (op->kind != PTC_OP_FETCH)
			assert_int_equal(op->backup, 0);
		for (int64_t r = 0; r < op->rows && op->kind != PTC_OP_REUSE; r++)
			assert_true(src->map[si][op->src_row + r] >= 0 &&
				    src->map[si][op->src_row + r] == neu.map[di][op->dst_row + r]);
		copy_rows(neu.buf[di], neu.rows[di], op->dst_row, src->buf[si], src->rows[si],
			  op->src_row, op->rows, outer, rowb);
	}

	/* Exact: every row written once, every byte as laid out per B. */
	struct world want;
	world_init(&want, &sc->lb, true);
	int64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		if (!neu.buf[i])
			continue;
		int t = (int)(i % (size_t)s->ntensors),
		    st = (int)(i / (size_t)s->ntensors) % s->nstates;
		int64_t outer, rowel;
		ptc_tensor_geometry(&s->tensors[t], &outer, &rowel);
		int64_t rowb = rowel * esize(s, st, t), bytes = outer * neu.rows[i] * rowb;
		total += bytes;
		for (int64_t r = 0; r < neu.rows[i]; r++) {
			assert_int_equal(cover[i][r], 1);
			/* Re-sliced padding is zero; a reused partition keeps its bytes. */
			if (want.map[i][r] < 0 && !reused[i])
				for (int64_t o = 0; o < outer; o++)
					for (int64_t b = 0; b < rowb; b++)
						want.buf[i][(o * neu.rows[i] + r) * rowb + b] = 0;
		}
		assert_memory_equal(neu.buf[i], want.buf[i], (size_t)bytes);
		free(cover[i]);
	}
	free(cover);
	free(reused);
	assert_int_equal(total, p->bytes_total);

	/* Figures add up; network equals the lower bound; reuse where possible. */
	bool unsourced;
	assert_int_equal(p->bytes_network, lower_bound(sc, &unsourced));
	assert_false(unsourced);
	assert_int_equal(p->lower_bound_network, p->bytes_network);
	assert_int_equal(p->bytes_total,
			 p->bytes_reused + p->bytes_local + p->bytes_network + p->bytes_zero);
	for (int k = 0; k < p->nnodes; k++) {
		const struct ptc_node_stats *st = &p->per_node[k];
		assert_int_equal(st->bytes_total, st->bytes_reused + st->bytes_local +
						      st->bytes_in + st->bytes_zero);
		assert_int_equal(st->bytes_in, node_in[k]);
		assert_int_equal(st->bytes_out, node_out[k]);
	}
	for (size_t k = 0; k < p->nops; k++) {
		const struct ptc_op *op = &p->ops[k];
		if (op->kind == PTC_OP_REUSE || op->dst_row != 0)
			continue;
		size_t di = widx(&neu, op->dst_rank, op->state, op->tensor);
		for (int r = 0; r < sc->la.world; r++) {
			if (node_of(&sc->la, r) != op->dst_node)
				continue;
			for (int t = 0; t < s->ntensors; t++) {
				size_t si = widx(&old, r, op->state, t);
				int lt = s->tensors[t].tied >= 0 ? s->tensors[t].tied : t;
				int ld = s->tensors[op->tensor].tied >= 0
					     ? s->tensors[op->tensor].tied
					     : op->tensor;
				if (old.buf[si] && lt == ld)
					assert_false(same_map(neu.map[di], neu.rows[di],
							      old.map[si], old.rows[si]));
			}
		}
	}

	/* Balance: each serving node's last piece went to it while it had served
	 * no more than any other candidate; checked on the final figures. The
	 * candidates of a piece read from a backup are the other down nodes that
	 * held it, served by their backup holders. */
	for (int x = 0; x < p->nnodes && greedy; x++) {
		if (!node_out[x])
			continue;
		bool ok = false;
		for (size_t k = 0; k < p->nops && !ok; k++) {
			const struct ptc_op *op = &p->ops[k];
			if (op->kind != PTC_OP_FETCH || serving_node(sc, op) != x)
				continue;
			bool fine = true;
			int64_t g0 = old.map[widx(&old, op->src_rank, op->state, op->src_tensor)]
					    [op->src_row];
			int slog = s->tensors[op->src_tensor].tied >= 0
				       ? s->tensors[op->src_tensor].tied
				       : op->src_tensor;
			for (int r = 0; r < sc->la.world && fine; r++) {
				int y = node_of(&sc->la, r);
				if (op->backup) {
					if (y == op->src_node || !backup_ok(sc, y) ||
					    !sc->isdown[y] || sc->backup_of[y] == x)
						continue;
					y = sc->backup_of[y];
				} else if (y == x || y == op->dst_node || sc->isdown[y]) {
					continue;
				}
				for (int t = 0; t < s->ntensors; t++) {
					size_t si = widx(&old, r, op->state, t);
					int lt = s->tensors[t].tied >= 0 ? s->tensors[t].tied : t;
					if (!old.buf[si] || lt != slog)
						continue;
					for (int64_t i = 0; i < old.rows[si]; i++)
						if (old.map[si][i] == g0 &&
						    node_out[x] - op->bytes > node_out[y])
							fine = false;
				}
			}
			ok = fine;
		}
		assert_true(ok);
	}
	world_free(&want);
	world_free(&old);
	world_free(&neu);
}

static void check_plan(const struct scenario *sc, const struct ptc_plan *p)
{
	check_plan_with(sc, p, true);
}

static void free_scenario(struct scenario *sc)
{
	ptc_layout_release(&sc->la);
	ptc_layout_release(&sc->lb);
	ptc_config_free(sc->a);
	ptc_config_free(sc->b);
	ptc_cluster_free(sc->cluster);
	ptc_schema_free(sc->schema);
}

#endif
