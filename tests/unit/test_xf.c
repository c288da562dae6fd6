/*
 * test_xf.c - the plan executor of the transform module (xf_execute).
 *
 * The executor is checked as a property over random schemas and layouts:
 * old partitions hold synthetic bytes (a function of state, logical tensor
 * and global element; padding is garbage), the plan is executed with 1 and 3
 * threads, and every new partition must equal the data laid out per the new
 * layout (zero padding), except REUSEd ones, which must be the very same
 * buffer as the old partition. Row maps and placement come from model.h,
 * written independently of ptc's. Then fixed cases: ops cut into items,
 * fetch errors, reads from backups, malformed plans. test_xf_buf.c tests
 * the memory bound and buffers, test_xf_full.c full tensors.
 */
#include "tests/unit/xf_fixture.h"

/* Old padding bytes: never copied, kept only by REUSE. */
#define GARBAGE 0xAA

/* Old partitions of @node: allocated by xf_parts_alloc_zero, then filled. */
static void old_parts(struct xf_parts *p, const struct ptc_layout *l, int node, struct xf_mem *mem)
{
	const struct ptc_schema *s = l->schema;

	assert_int_equal(xf_parts_init(p, l, node), 0);
	assert_int_equal(xf_parts_alloc_zero(p, mem), 0);
	for (int r = 0; r < l->world; r++)
		for (int st = 0; st < s->nstates; st++)
			for (int t = 0; t < s->ntensors; t++) {
				struct xf_buf *b = xf_parts_at(p, r, st, t);
				if (node_of(l, r) != node || !holds(l, r, t)) {
					assert_null(b);
					continue;
				}
				int64_t size;
				uint8_t *want = expected_part(l, r, st, t, GARBAGE, &size);
				assert_non_null(b);
				assert_int_equal(b->size, size);
				memcpy(b->data, want, (size_t)size);
				free(want);
			}
}

/* Checks every entry of @p against the data laid out per its layout. New
 * partitions (refs 1) have zero padding; REUSEd ones are the old buffer
 * named by the plan and keep its padding. Returns bytes checked. */
static int64_t check_parts(const struct xf_parts *p, const struct ptc_plan *plan,
			   const struct xf_parts *from)
{
	const struct ptc_layout *l = p->layout;
	const struct ptc_schema *s = l->schema;
	size_t nops = plan ? plan->node_first_op[p->node + 1] - plan->node_first_op[p->node] : 0;
	const struct ptc_op *ops = plan ? plan->ops + plan->node_first_op[p->node] : NULL;
	int64_t total = 0;

	for (int r = 0; r < l->world; r++)
		for (int st = 0; st < s->nstates; st++)
			for (int t = 0; t < s->ntensors; t++) {
				struct xf_buf *b = xf_parts_at(p, r, st, t);
				if (node_of(l, r) != p->node || !holds(l, r, t)) {
					assert_null(b);
					continue;
				}
				assert_non_null(b);
				const struct ptc_op *reuse = NULL;
				for (size_t k = 0; k < nops; k++)
					if (ops[k].kind == PTC_OP_REUSE && ops[k].dst_rank == r &&
					    ops[k].state == st && ops[k].tensor == t)
						reuse = &ops[k];
				if (reuse) {
					assert_ptr_equal(b, xf_parts_at(from, reuse->src_rank, st,
									reuse->src_tensor));
					assert_true(atomic_load(&b->refs) >= 2);
				} else if (plan) {
					assert_int_equal(atomic_load(&b->refs), 1);
				}
				int64_t size;
				uint8_t *want =
				    expected_part(l, r, st, t, reuse || !plan ? GARBAGE : 0, &size);
				assert_int_equal(b->size, size);
				assert_memory_equal(b->data, want, (size_t)size);
				free(want);
				total += size;
			}
	return total;
}

static bool parts_empty(const struct xf_parts *p)
{
	size_t n = xf_parts_count(p);
	for (size_t i = 0; i < n; i++)
		if (p->bufs[i])
			return false;
	return true;
}

static size_t count_kind(const struct ptc_plan *p, int node, int kind)
{
	size_t n = 0;
	for (size_t k = p->node_first_op[node]; k < p->node_first_op[node + 1]; k++)
		n += p->ops[k].kind == kind;
	return n;
}

/* ----------------------------------------------------- fetch from a peer */

/* Serves FETCHes from in-memory copies of every node's old partitions. */
struct peers {
	struct xf_parts *old; /* per cluster node */
	int nnodes;
	int fail;	  /* when set, every fetch returns it */
	const bool *down; /* per node, or NULL: a down node serves only as a backup */
	atomic_int calls;
};

/* Fetch pieces of every execution, to see FETCH ops cut into pieces; calls
 * that carried more than one (a batch), and the pieces those carried. */
static atomic_int fetch_calls, batch_calls, batched_pieces;

static int fetch_one(struct peers *pe, const struct xf_piece *pc)
{
	const struct ptc_op *op = &pc->op;
	int64_t srows, so, srel, outer = pc->outer, row_bytes = pc->row_bytes;

	atomic_fetch_add(&pe->calls, 1);
	atomic_fetch_add(&fetch_calls, 1);
	if (pe->fail)
		return pe->fail;
	/* A backup FETCH names the down node whose state its holder keeps:
	 * old[src_node] stands for that copy. */
	if (op->kind != PTC_OP_FETCH || op->src_node < 0 || op->src_node >= pe->nnodes ||
	    op->src_node == op->dst_node || op->backup != (pe->down && pe->down[op->src_node]))
		return -EPROTO;
	const struct xf_parts *p = &pe->old[op->src_node];
	const struct ptc_layout *l = p->layout;
	const struct xf_buf *b = xf_parts_at(p, op->src_rank, op->state, op->src_tensor);
	if (!b)
		return -ENOENT;
	free(rowmap(&l->schema->tensors[op->src_tensor], l->tp, op->src_rank % l->tp, &srows));
	ptc_tensor_geometry(&l->schema->tensors[op->src_tensor], &so, &srel);
	if (so != outer || srel * esize(l->schema, op->state, op->src_tensor) != row_bytes ||
	    op->src_row < 0 || op->src_row + op->rows > srows || op->dst_row < 0 ||
	    op->dst_row + op->rows > pc->dst_rows || op->bytes != op->rows * outer * row_bytes)
		return -ERANGE;
	xf_copy_rows(pc->dst, pc->dst_rows, op->dst_row, b->data, srows, op->src_row, op->rows,
		     outer, row_bytes);
	return 0;
}

/* The executor's fetch: @n pieces, a batch when n > 1, whose rules
 * (xf_fetch_fn) are checked here: small pieces of one source, none from
 * a backup, within XF_BATCH_MAX and XF_BATCH_BYTES. */
static int peer_fetch(void *arg, const struct xf_piece *v, size_t n)
{
	struct peers *pe = arg;
	int64_t bytes = 0;

	if (n == 0 || n > XF_BATCH_MAX)
		return -E2BIG;
	if (n > 1) {
		atomic_fetch_add(&batch_calls, 1);
		atomic_fetch_add(&batched_pieces, (int)n);
		for (size_t i = 0; i < n; i++) {
			if (v[i].op.backup || v[i].op.src_node != v[0].op.src_node ||
			    v[i].op.bytes > XF_BATCH_BYTES / 4)
				return -EXDEV;
			bytes += v[i].op.bytes;
		}
		if (bytes > XF_BATCH_BYTES)
			return -E2BIG;
	}
	for (size_t i = 0; i < n; i++) {
		int rc = fetch_one(pe, &v[i]);
		if (rc)
			return rc;
	}
	return 0;
}

/* ------------------------------------------------------------- scenarios */

struct scenario {
	struct ptc_schema *schema;
	struct ptc_cluster *cluster;
	struct ptc_config *a, *b;
	struct ptc_layout la, lb;
	bool la_ok, lb_ok;
};

static void free_scenario(struct scenario *sc)
{
	if (sc->la_ok)
		ptc_layout_release(&sc->la);
	if (sc->lb_ok)
		ptc_layout_release(&sc->lb);
	ptc_config_free(sc->a);
	ptc_config_free(sc->b);
	ptc_cluster_free(sc->cluster);
	ptc_schema_free(sc->schema);
	memset(sc, 0, sizeof(*sc));
}

/* A random schema and two random layouts on @nnodes nodes of 1..@maxdev
 * devices (exactly @maxdev when @nnodes is 1). False when a layout does
 * not fit the schema. */
static bool make_scenario(struct scenario *sc, int nnodes, int maxdev)
{
	struct ptc_error err;
	json_t *js = random_schema();
	char *ids[8], names[8][16];

	assert_int_equal(ptc_schema_parse(js, "schema.json", &sc->schema, &err), 0);
	json_decref(js);
	for (int i = 0; i < nnodes; i++) {
		snprintf(names[i], sizeof(names[i]), "n%d", i);
		ids[i] = names[i];
	}
	sc->cluster = ptc_cluster_new_uniform(nnodes, ids, maxdev);
	for (int i = 0; i < nnodes && nnodes > 1; i++)
		sc->cluster->nodes[i].devices = rndi(1, maxdev);
	sc->a = random_config(sc->cluster, 1);
	sc->b = random_config(sc->cluster, 2);
	sc->la_ok = ptc_layout_init(&sc->la, sc->schema, sc->a, sc->cluster, "a.json", &err) == 0;
	sc->lb_ok = sc->la_ok &&
		    ptc_layout_init(&sc->lb, sc->schema, sc->b, sc->cluster, "b.json", &err) == 0;
	return sc->lb_ok;
}

/* ------------------------------------------------------- executor checks */

/* Runs the plan on every node with @nthreads threads and checks the result
 * exactly; @old holds every node's old partitions. */
static void execute_and_check(const struct scenario *sc, const struct ptc_plan *p,
			      struct xf_parts *old, struct xf_mem *mem, int nthreads)
{
	int nn = sc->cluster->nnodes;
	struct peers pe = {.old = old, .nnodes = nn};
	int64_t used0 = mem->used;

	atomic_init(&pe.calls, 0);
	for (int n = 0; n < nn; n++) {
		struct xf_parts to;
		struct xf_stats st = {.seconds = -1};
		_Atomic int64_t progress = 0;
		const struct ptc_node_stats *ns = &p->per_node[n];

		assert_int_equal(xf_parts_init(&to, &sc->lb, n), 0);
		int rc =
		    xf_execute(p, n, &old[n], &to, mem, nthreads, peer_fetch, &pe, &progress, &st);
		if (rc)
			fail_msg("node %d: xf_execute = %d", n, rc);
		assert_int_equal(check_parts(&to, p, &old[n]), ns->bytes_total);
		assert_int_equal(st.bytes_reused, ns->bytes_reused);
		assert_int_equal(st.bytes_copied, ns->bytes_local);
		assert_int_equal(st.bytes_fetched, ns->bytes_in);
		assert_int_equal(st.bytes_zeroed, ns->bytes_zero);
		assert_true(st.seconds >= 0);
		assert_int_equal(progress, ns->bytes_total);
		assert_int_equal(mem->used, used0 + xf_plan_new_bytes(p, n));
		xf_parts_release(&to);
		assert_int_equal(mem->used, used0);
	}
	/* The old layout is untouched, padding included. */
	for (int n = 0; n < nn; n++)
		check_parts(&old[n], NULL, NULL);
}

/* A memory limit one byte short fails cleanly; an exact one fits. */
static void check_enospc(const struct scenario *sc, const struct ptc_plan *p, int node,
			 struct xf_parts *old, struct xf_mem *mem)
{
	int64_t need = xf_plan_new_bytes(p, node), used0 = mem->used;
	struct peers pe = {.old = old, .nnodes = sc->cluster->nnodes};
	struct xf_parts to;

	atomic_init(&pe.calls, 0);
	assert_int_equal(xf_parts_init(&to, &sc->lb, node), 0);
	if (need > 0) {
		mem->limit = used0 + need - 1;
		assert_int_equal(
		    xf_execute(p, node, &old[node], &to, mem, 2, peer_fetch, &pe, NULL, NULL),
		    -ENOSPC);
		assert_true(parts_empty(&to));
		assert_int_equal(mem->used, used0);
		assert_int_equal(atomic_load(&pe.calls), 0);
	}
	mem->limit = used0 + need;
	assert_int_equal(xf_execute(p, node, &old[node], &to, mem, 2, peer_fetch, &pe, NULL, NULL),
			 0);
	assert_int_equal(mem->used, used0 + need);
	xf_parts_release(&to);
	mem->limit = 0;
	assert_int_equal(mem->used, used0);
}

/* Without a fetch callback, a node with FETCH ops fails before copying. */
static void check_no_fetch(const struct scenario *sc, const struct ptc_plan *p, int node,
			   struct xf_parts *old, struct xf_mem *mem)
{
	int64_t used0 = mem->used;
	_Atomic int64_t progress = 0;
	struct xf_parts to;

	assert_int_equal(xf_parts_init(&to, &sc->lb, node), 0);
	assert_int_equal(xf_execute(p, node, &old[node], &to, mem, 3, NULL, NULL, &progress, NULL),
			 -EIO);
	assert_true(parts_empty(&to));
	assert_int_equal(progress, 0);
	assert_int_equal(mem->used, used0);
	xf_parts_release(&to);
}

/* Runs one scenario: plan, old partitions, 1 and 3 threads, limits. */
static void run_scenario(const struct scenario *sc, int *fetch_nodes, int *reuse_plans)
{
	int nn = sc->cluster->nnodes;
	struct xf_parts old[8];
	struct xf_mem mem = {0};
	struct ptc_plan *p;
	struct ptc_error err;

	int rc = ptc_plan_compute(&sc->la, &sc->lb, NULL, 0, &p, &err);
	if (rc)
		fail_msg("plan: %s", err.text);
	for (int n = 0; n < nn; n++)
		old_parts(&old[n], &sc->la, n, &mem);
	execute_and_check(sc, p, old, &mem, 1);
	execute_and_check(sc, p, old, &mem, 3);
	for (int n = 0; n < nn; n++) {
		check_enospc(sc, p, n, old, &mem);
		if (count_kind(p, n, PTC_OP_FETCH)) {
			check_no_fetch(sc, p, n, old, &mem);
			++*fetch_nodes;
		}
	}
	*reuse_plans += p->bytes_reused > 0;
	for (int n = 0; n < nn; n++)
		xf_parts_release(&old[n]);
	assert_int_equal(mem.used, 0);
	ptc_plan_free(p);
}

/* Local plans: one node, several devices. */
static void test_execute_local(void **state)
{
	(void)state;
	int cases = prop_cases(300), done = 0, fetch_nodes = 0, reuse_plans = 0;

	rng_state = 0x2545F4914F6CDD1Dull;
	for (int c = 0; done < cases && c < 10 * cases; c++) {
		struct scenario sc = {0};
		if (make_scenario(&sc, 1, rndi(2, 8))) {
			run_scenario(&sc, &fetch_nodes, &reuse_plans);
			done++;
		}
		free_scenario(&sc);
	}
	printf("xf local: %d plans executed exactly (%d with reuse)\n", done, reuse_plans);
	assert_int_equal(done, cases);
	assert_int_equal(fetch_nodes, 0);
	assert_true(reuse_plans > cases / 4);
}

/* Plans across nodes: FETCH from peers, DUP within a node. */
static void test_execute_nodes(void **state)
{
	(void)state;
	int cases = prop_cases(300) / 2, done = 0, fetch_nodes = 0, reuse_plans = 0;

	rng_state = 0x9E3779B97F4A7C15ull;
	for (int c = 0; done < cases && c < 10 * cases; c++) {
		struct scenario sc = {0};
		if (make_scenario(&sc, rndi(2, 3), 4)) {
			run_scenario(&sc, &fetch_nodes, &reuse_plans);
			done++;
		}
		free_scenario(&sc);
	}
	printf("xf nodes: %d plans executed exactly (%d nodes fetched)\n", done, fetch_nodes);
	assert_int_equal(done, cases);
	assert_true(fetch_nodes > cases / 4);
}

/* ---------------------------------------------------------- fixed cases */

static void fixed_scenario(struct scenario *sc, const char *schema, int nnodes, int devices,
			   const char *a, const char *b)
{
	struct ptc_error err;
	char *ids[] = {"n0", "n1", "n2", "n3"};
	char *s = unit_json(schema), *ja = unit_json(a), *jb = unit_json(b);

	memset(sc, 0, sizeof(*sc));
	if (ptc_schema_parse_text(s, strlen(s), "schema.json", &sc->schema, &err))
		fail_msg("%s", err.text);
	sc->cluster = ptc_cluster_new_uniform(nnodes, ids, devices);
	assert_int_equal(ptc_config_parse_text(ja, strlen(ja), "a.json", &sc->a, &err), 0);
	assert_int_equal(ptc_config_parse_text(jb, strlen(jb), "b.json", &sc->b, &err), 0);
	if (ptc_layout_init(&sc->la, sc->schema, sc->a, sc->cluster, "a.json", &err))
		fail_msg("%s", err.text);
	sc->la_ok = true;
	if (ptc_layout_init(&sc->lb, sc->schema, sc->b, sc->cluster, "b.json", &err))
		fail_msg("%s", err.text);
	sc->lb_ok = true;
	free(s);
	free(ja);
	free(jb);
}

/*
 * Large tensors, so that ops are cut into ~1 MiB items along every path: a
 * replicated 2.4 MB tensor (one huge row: DUPed and COPYed in byte ranges,
 * FETCHed whole), a column-split one (2048 small blocks, grouped into
 * several items), a padded row-split one (row ranges, ZERO) and a 3-D fused
 * one (FETCHed in row ranges across both blocks). Two nodes; stage 1 lived
 * only on n1, so n0 FETCHes it and its second rank DUPs.
 */
static const char big_schema[] =
    "{'num_layers': 2, 'states': {'model': {}, 'optim/m': {'dtype': 'float32'}},"
    " 'tensors': ["
    "{'name': 'l/{L}/rep', 'dtype': 'float32', 'shape': [600, 1000]},"
    "{'name': 'l/{L}/col', 'dtype': 'bfloat16', 'shape': [2048, 1536], 'split': {'dim': 1}},"
    "{'name': 'emb', 'dtype': 'bfloat16', 'shape': [6000, 512],"
    " 'split': {'dim': 0, 'pad_multiple': 64}, 'place': 'first'},"
    "{'name': 'l/{L}/fused', 'dtype': 'float64', 'shape': [2, 1400, 400],"
    " 'split': {'dim': 1, 'chunks': 2}}]}";

static void test_execute_big(void **state)
{
	(void)state;
	struct scenario sc;
	int fetch_nodes = 0, reuse_plans = 0;

	fixed_scenario(&sc, big_schema, 2, 2,
		       "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1']}",
		       "{'version': 2, 'tp': 4, 'pp': 1, 'dp': 1, 'nodes': ['n0', 'n1']}");
	struct ptc_plan *p;
	struct ptc_error err;
	assert_int_equal(ptc_plan_compute(&sc.la, &sc.lb, NULL, 0, &p, &err), 0);
	assert_true(count_kind(p, 0, PTC_OP_FETCH) > 0);
	assert_true(count_kind(p, 0, PTC_OP_DUP) > 0);
	assert_true(count_kind(p, 1, PTC_OP_ZERO) > 0);
	assert_true(count_kind(p, 0, PTC_OP_COPY) > 0);
	int nfetch = (int)(count_kind(p, 0, PTC_OP_FETCH) + count_kind(p, 1, PTC_OP_FETCH));
	ptc_plan_free(p);
	atomic_store(&fetch_calls, 0);
	run_scenario(&sc, &fetch_nodes, &reuse_plans);
	assert_int_equal(fetch_nodes, 2);
	/* Each FETCH ran 3 times (1 thread, 3 threads, the exact limit). */
	assert_true(atomic_load(&fetch_calls) > 3 * nfetch);
	free_scenario(&sc);

	/* Back: tp 4 -> 2 on one node keeps replicated tensors (REUSE) and
	 * merges the split ones. */
	reuse_plans = 0;
	fixed_scenario(&sc, big_schema, 1, 4,
		       "{'version': 1, 'tp': 4, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
		       "{'version': 2, 'tp': 2, 'pp': 1, 'dp': 2, 'nodes': ['n0']}");
	run_scenario(&sc, &fetch_nodes, &reuse_plans);
	assert_int_equal(reuse_plans, 1);
	free_scenario(&sc);
}

/* A fetch error aborts the execution everywhere, leaving nothing behind. */
static void test_fetch_error(void **state)
{
	(void)state;
	struct scenario sc;
	struct xf_parts old[2], to;
	struct xf_mem mem = {0};
	struct ptc_plan *p;
	struct ptc_error err;

	fixed_scenario(&sc, big_schema, 2, 2,
		       "{'version': 1, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n1']}",
		       "{'version': 2, 'tp': 2, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}");
	assert_int_equal(ptc_plan_compute(&sc.la, &sc.lb, NULL, 0, &p, &err), 0);
	for (int n = 0; n < 2; n++)
		old_parts(&old[n], &sc.la, n, &mem);
	int64_t used0 = mem.used;
	struct peers pe = {.old = old, .nnodes = 2, .fail = -ECONNRESET};
	atomic_init(&pe.calls, 0);
	assert_int_equal(xf_parts_init(&to, &sc.lb, 0), 0);
	assert_int_equal(xf_execute(p, 0, &old[0], &to, &mem, 3, peer_fetch, &pe, NULL, NULL),
			 -ECONNRESET);
	assert_true(atomic_load(&pe.calls) > 0);
	assert_true(parts_empty(&to));
	assert_int_equal(mem.used, used0);
	/* A positive return is not an errno: -EIO. */
	pe.fail = 1;
	assert_int_equal(xf_execute(p, 0, &old[0], &to, &mem, 1, peer_fetch, &pe, NULL, NULL),
			 -EIO);
	assert_true(parts_empty(&to));
	/* Non-empty destination tables are refused. */
	pe.fail = 0;
	assert_int_equal(xf_execute(p, 0, &old[0], &to, &mem, 1, peer_fetch, &pe, NULL, NULL), 0);
	assert_int_equal(xf_execute(p, 0, &old[0], &to, &mem, 1, peer_fetch, &pe, NULL, NULL),
			 -EINVAL);
	xf_parts_release(&to);
	xf_parts_release(&to); /* twice is harmless */
	for (int n = 0; n < 2; n++)
		check_parts(&old[n], NULL, NULL);
	for (int n = 0; n < 2; n++)
		xf_parts_release(&old[n]);
	assert_int_equal(mem.used, 0);
	ptc_plan_free(p);
	free_scenario(&sc);
}

/* ---------------------------------------------------------------- backups */

static const char backup_schema[] =
    "{'num_layers': 6, 'states': {'model': {}, 'optim/m': {'dtype': 'float32'}},"
    " 'tensors': ["
    "{'name': 'emb', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    " 'split': {'dim': 0, 'pad_multiple': 64}, 'place': 'first'},"
    "{'name': 'l/{L}/col', 'dtype': 'bfloat16', 'shape': [512, 768], 'split': {'dim': 1}},"
    "{'name': 'l/{L}/norm', 'dtype': 'float32', 'shape': [768]},"
    "{'name': 'out', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    " 'split': {'dim': 0, 'pad_multiple': 64}, 'place': 'last', 'tied': 'emb'}]}";

/*
 * Many small tensors and one large one, all of stage 0 on n0; DP grows onto
 * n1, which fetches every one of them from n0. The small pieces travel in
 * batches (one fetch call each, within XF_BATCH_MAX and XF_BATCH_BYTES:
 * peer_fetch checks), the large tensor's pieces alone, and the result is
 * exact (execute_and_check).
 */
static void test_fetch_batches(void **state)
{
	(void)state;
	struct scenario sc;
	int fetch_nodes = 0, reuse_plans = 0;
	/* 2 layers x 40 tensors of 16 KiB (float32 [64, 64]), and 2.4 MB */
	static const char many_schema[] =
	    "{'num_layers': 2, 'states': {'model': {}},"
	    " 'tensors': [{'name': 'l/{L}/rep', 'dtype': 'float32', 'shape': [600, 1000]},"
	    "{'name': 'l/{L}/a0', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a1', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a2', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a3', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a4', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a5', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a6', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a7', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a8', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/a9', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b0', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b1', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b2', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b3', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b4', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b5', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b6', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b7', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b8', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/b9', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c0', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c1', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c2', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c3', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c4', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c5', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c6', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c7', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c8', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/c9', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d0', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d1', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d2', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d3', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d4', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d5', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d6', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d7', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d8', 'dtype': 'float32', 'shape': [64, 64]},"
	    "{'name': 'l/{L}/d9', 'dtype': 'float32', 'shape': [64, 64]}]}";

	fixed_scenario(&sc, many_schema, 2, 1,
		       "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n0']}",
		       "{'version': 2, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}");
	atomic_store(&fetch_calls, 0);
	atomic_store(&batch_calls, 0);
	atomic_store(&batched_pieces, 0);
	run_scenario(&sc, &fetch_nodes, &reuse_plans);
	assert_int_equal(fetch_nodes, 1);
	/* 80 small tensors, 16 KiB each: two batches (XF_BATCH_MAX is 64) per
	 * execution; the 2.4 MB ones (one huge row each) alone */
	int pieces = atomic_load(&fetch_calls), batches = atomic_load(&batch_calls);
	assert_true(batches > 0);
	assert_int_equal(atomic_load(&batched_pieces) % 80, 0);
	assert_int_equal(atomic_load(&batched_pieces) / 80, batches / 2);
	assert_int_equal(pieces - atomic_load(&batched_pieces), 2 * (batches / 2));
	free_scenario(&sc);
}

/* A plan whose node-0 ops are @ops, run on node 0 with @fetch. */
static int run_node0(const struct ptc_plan *p, const struct ptc_op *ops, size_t nops,
		     struct xf_parts *old, const struct ptc_layout *lb, struct xf_mem *mem,
		     xf_fetch_fn fetch, void *arg)
{
	struct ptc_plan q = *p;
	size_t first[2] = {0, nops};
	struct xf_parts to;

	q.ops = (struct ptc_op *)ops;
	q.nops = nops;
	q.node_first_op = first;
	assert_int_equal(xf_parts_init(&to, lb, 0), 0);
	int rc = xf_execute(&q, 0, old, &to, mem, 2, fetch, arg, NULL, NULL);
	xf_parts_release(&to);
	return rc;
}

/*
 * dp 1 on three nodes keeping backups; n1 dies and the new layout on n0
 * and n2 reads its layers from its backup on n2 (n0 over the network, n2
 * from itself). Every surviving node builds its layout exactly, and a
 * backup FETCH is valid while its rank's node is not the one it names.
 */
static void test_execute_backup(void **state)
{
	(void)state;
	static const int down[] = {1};
	static const bool isdown[3] = {false, true, false};
	struct scenario sc;
	struct xf_parts old[3];
	struct xf_mem mem = {0};
	struct ptc_plan *p;
	struct ptc_error err;
	int backup_of[3];

	fixed_scenario(&sc, backup_schema, 3, 2,
		       "{'version': 1, 'tp': 2, 'pp': 3, 'dp': 1, 'replicas': 1,"
		       " 'nodes': ['n0', 'n1', 'n2']}",
		       "{'version': 2, 'tp': 2, 'pp': 2, 'dp': 1, 'nodes': ['n0', 'n2']}");
	for (int n = 0; n < 3; n++)
		backup_of[n] = ptc_layout_backup_holder(&sc.la, n);
	assert_int_equal(backup_of[1], 2);
	assert_int_equal(ptc_plan_compute_backups(&sc.la, &sc.lb, down, 1, backup_of, &p, &err), 0);
	for (int n = 0; n < 3; n++)
		old_parts(&old[n], &sc.la, n, &mem);

	struct peers pe = {.old = old, .nnodes = 3, .down = isdown};
	atomic_init(&pe.calls, 0);
	size_t backups[3] = {0};
	for (int n = 0; n < 3; n += 2) {
		struct xf_parts to;
		struct xf_stats st;
		for (size_t k = p->node_first_op[n]; k < p->node_first_op[n + 1]; k++)
			backups[n] += p->ops[k].backup;
		assert_int_equal(xf_parts_init(&to, &sc.lb, n), 0);
		assert_int_equal(
		    xf_execute(p, n, &old[n], &to, &mem, 3, peer_fetch, &pe, NULL, &st), 0);
		assert_int_equal(check_parts(&to, p, &old[n]), p->per_node[n].bytes_total);
		assert_int_equal(st.bytes_fetched, p->per_node[n].bytes_in);
		xf_parts_release(&to);
	}
	assert_true(backups[0] > 0 && backups[2] > 0);

	/* Validation, on node 0's ops: a backup FETCH may name the holder
	 * instead of the rank's node (it gets as far as wanting a fetch
	 * callback); without the mark it may not; only a FETCH is marked. */
	size_t n0 = p->node_first_op[1], b = SIZE_MAX, reuse = SIZE_MAX, dup = SIZE_MAX;
	struct ptc_op *ops = malloc(n0 * sizeof(*ops));
	for (size_t k = 0; k < n0; k++) {
		if (p->ops[k].backup && b == SIZE_MAX)
			b = k;
		if (p->ops[k].kind == PTC_OP_REUSE && reuse == SIZE_MAX)
			reuse = k;
		if (p->ops[k].kind == PTC_OP_DUP && dup == SIZE_MAX)
			dup = k;
	}
	assert_true(b != SIZE_MAX && reuse != SIZE_MAX && dup != SIZE_MAX);
#define MUTATE(k, stmt, want)                                                                      \
	do {                                                                                       \
		memcpy(ops, p->ops, n0 * sizeof(*ops));                                            \
		struct ptc_op *op = &ops[k];                                                       \
		stmt;                                                                              \
		assert_int_equal(run_node0(p, ops, n0, &old[0], &sc.lb, &mem, NULL, NULL), want);  \
	} while (0)
	MUTATE(b, (void)op, -EIO);
	MUTATE(b, op->src_node = 2, -EIO);
	MUTATE(b, op->src_node = 0, -EIO);
	MUTATE(b, (op->src_node = 2, op->backup = 0), -EINVAL);
	MUTATE(b, op->backup = 0, -EIO); /* a plain FETCH from n1: the plan's word */
	MUTATE(b, op->backup = 2, -EINVAL);
	MUTATE(b, op->src_node = 3, -EINVAL);
	MUTATE(b, op->src_node = -1, -EINVAL);
	MUTATE(b, op->src_rank = sc.la.world, -EINVAL);
	MUTATE(b, op->src_rank = 0, -EINVAL); /* stage 0 does not hold the layer */
	MUTATE(reuse, op->backup = 1, -EINVAL);
	MUTATE(dup, op->backup = 1, -EINVAL);
#undef MUTATE
	memcpy(ops, p->ops, n0 * sizeof(*ops));
	assert_int_equal(run_node0(p, ops, n0, &old[0], &sc.lb, &mem, peer_fetch, &pe), 0);
	free(ops);

	for (int n = 0; n < 3; n++)
		xf_parts_release(&old[n]);
	assert_int_equal(mem.used, 0);
	ptc_plan_free(p);
	free_scenario(&sc);
}

/* ------------------------------------------------------ malformed plans */

/* A plan whose ops for node 0 are @ops (a private copy of @p's). */
static int run_ops(const struct ptc_plan *p, const struct ptc_op *ops, size_t nops,
		   struct xf_parts *old, const struct ptc_layout *lb, struct xf_mem *mem)
{
	struct ptc_plan q = *p;
	size_t first[2] = {0, nops};
	struct xf_parts to;
	int64_t used0 = mem->used;

	q.ops = (struct ptc_op *)ops;
	q.nops = nops;
	q.node_first_op = first;
	assert_int_equal(xf_parts_init(&to, lb, 0), 0);
	int rc = xf_execute(&q, 0, old, &to, mem, 2, NULL, NULL, NULL, NULL);
	if (rc) {
		assert_true(parts_empty(&to));
		assert_int_equal(mem->used, used0);
	}
	xf_parts_release(&to);
	return rc;
}

static void test_malformed(void **state)
{
	(void)state;
	static const char schema[] =
	    "{'num_layers': 1, 'tensors': ["
	    "{'name': 'a', 'dtype': 'float32', 'shape': [8, 6], 'split': {'dim': 0}},"
	    "{'name': 'b', 'dtype': 'int16', 'shape': [5]},"
	    "{'name': 'c', 'dtype': 'uint8', 'shape': [10, 4],"
	    " 'split': {'dim': 0, 'pad_multiple': 4}}]}";
	struct scenario sc;
	struct xf_parts old;
	struct xf_mem mem = {0};
	struct ptc_plan *p;
	struct ptc_error err;

	fixed_scenario(&sc, schema, 1, 4,
		       "{'version': 1, 'tp': 2, 'pp': 1, 'dp': 2, 'nodes': ['n0']}",
		       "{'version': 2, 'tp': 4, 'pp': 1, 'dp': 1, 'nodes': ['n0']}");
	assert_int_equal(ptc_plan_compute(&sc.la, &sc.lb, NULL, 0, &p, &err), 0);
	old_parts(&old, &sc.la, 0, &mem);
	size_t n = p->nops;
	struct ptc_op *ops = malloc((n + 1) * sizeof(*ops));
	size_t copy = SIZE_MAX, reuse = SIZE_MAX, zero = SIZE_MAX;
	for (size_t k = 0; k < n; k++) {
		if (p->ops[k].kind == PTC_OP_COPY && copy == SIZE_MAX)
			copy = k;
		if (p->ops[k].kind == PTC_OP_REUSE && reuse == SIZE_MAX)
			reuse = k;
		if (p->ops[k].kind == PTC_OP_ZERO && zero == SIZE_MAX)
			zero = k;
	}
	assert_true(copy != SIZE_MAX && reuse != SIZE_MAX && zero != SIZE_MAX);

	memcpy(ops, p->ops, n * sizeof(*ops));
	assert_int_equal(run_ops(p, ops, n, &old, &sc.lb, &mem), 0);

#define MUTATE(k, stmt)                                                                            \
	do {                                                                                       \
		memcpy(ops, p->ops, n * sizeof(*ops));                                             \
		struct ptc_op *op = &ops[k];                                                       \
		stmt;                                                                              \
		assert_int_equal(run_ops(p, ops, n, &old, &sc.lb, &mem), -EINVAL);                 \
	} while (0)
	/* Row ranges outside either partition, with consistent byte counts. */
	MUTATE(copy, op->dst_row = INT64_MAX - 1);
	MUTATE(copy, op->src_row = 100);
	MUTATE(copy, op->src_row = -1);
	MUTATE(copy, (op->rows = INT64_MAX / 2, op->bytes = 0));
	MUTATE(copy, op->bytes++);
	MUTATE(zero, (op->rows += 100, op->bytes *= 101));
	/* Bad indices and kinds. */
	MUTATE(copy, op->src_rank = sc.la.world);
	MUTATE(copy, op->src_rank = -5);
	MUTATE(copy, op->src_tensor = 99);
	MUTATE(copy, op->tensor = 99);
	MUTATE(copy, op->state = 7);
	MUTATE(copy, op->dst_rank = -1);
	MUTATE(copy, op->dst_node = 1);
	MUTATE(copy, op->src_node = 3);
	MUTATE(copy, op->kind = 9);
	MUTATE(copy, op->phase = 1);
	MUTATE(copy, op->src_tensor = (op->src_tensor + 1) % 3); /* other geometry */
	MUTATE(reuse, (op->rows--, op->bytes = 0));
	MUTATE(reuse, op->kind = PTC_OP_DUP);
	/* A DUP reading rows written in phase 1 (here: its own). */
	MUTATE(copy, (op->kind = PTC_OP_DUP, op->phase = 1, op->src_rank = op->dst_rank,
		      op->src_tensor = op->tensor, op->src_row = op->dst_row));
#undef MUTATE
	/* A second op writing the same rows; a write into a REUSEd buffer. */
	memcpy(ops, p->ops, n * sizeof(*ops));
	ops[n] = p->ops[copy];
	assert_int_equal(run_ops(p, ops, n + 1, &old, &sc.lb, &mem), -EINVAL);
	ops[n] = p->ops[copy];
	ops[n].dst_rank = p->ops[reuse].dst_rank;
	ops[n].tensor = p->ops[reuse].tensor;
	ops[n].src_tensor = p->ops[reuse].src_tensor;
	ops[n].src_rank = p->ops[reuse].src_rank;
	ops[n].dst_row = ops[n].src_row = 0;
	ops[n].rows = 1;
	ops[n].bytes = p->ops[reuse].bytes / p->ops[reuse].rows;
	assert_int_equal(run_ops(p, ops, n + 1, &old, &sc.lb, &mem), -EINVAL);
	check_parts(&old, NULL, NULL);
	xf_parts_release(&old);
	assert_int_equal(mem.used, 0);
	free(ops);
	ptc_plan_free(p);
	free_scenario(&sc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_malformed),	   cmocka_unit_test(test_fetch_error),
	    cmocka_unit_test(test_execute_big),	   cmocka_unit_test(test_fetch_batches),
	    cmocka_unit_test(test_execute_local),  cmocka_unit_test(test_execute_nodes),
	    cmocka_unit_test(test_execute_backup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
