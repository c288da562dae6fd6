/*
 * test_suggest.c - ptc_suggest: candidates, drops with their reasons, the
 * memory per device and the step-time model against hand-computed values,
 * the plan's bytes for a reconfiguration, ordering, and bad inputs.
 */
#include <math.h>

#include "tests/unit/unit.h"

/*
 * Two layers of a float16 [64, 64] weight split on dim 0 and a replicated
 * float32 bias, and a float16 [100, 64] embedding on the first stage; the
 * model state and one float32 optimizer state. Bytes per element over the
 * states: w 2 + 4, b 4 + 4, emb 2 + 4; gradients: w 2, b 4, emb 2.
 */
static const char mini_schema[] =
    "{'model': 'mini', 'num_layers': 2,"
    " 'states': {'model': {}, 'optim/m': {'dtype': 'float32'}},"
    " 'tensors': ["
    "  {'name': 'emb', 'dtype': 'float16', 'shape': [100, 64], 'place': 'first'},"
    "  {'name': 'layers/{L}/w', 'dtype': 'float16', 'shape': [64, 64], 'split': {'dim': 0}},"
    "  {'name': 'layers/{L}/b', 'dtype': 'float32', 'shape': [64]}]}";

/* Four heads of 16 rows: tp 1, 2 or 4. */
static const char heads_schema[] =
    "{'model': 'heads', 'num_layers': 4,"
    " 'states': {'model': {}, 'optim/m': {'dtype': 'float32'}, 'optim/v': {'dtype': 'float32'}},"
    " 'tensors': ["
    "  {'name': 'emb', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    "   'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'first'},"
    "  {'name': 'layers/{L}/qkv', 'dtype': 'bfloat16', 'shape': [192, 64],"
    "   'split': {'dim': 0, 'chunks': 3, 'unit': 16}},"
    "  {'name': 'layers/{L}/proj', 'dtype': 'bfloat16', 'shape': [64, 64],"
    "   'split': {'dim': 1, 'unit': 16}},"
    "  {'name': 'layers/{L}/fc1', 'dtype': 'bfloat16', 'shape': [256, 64], 'split': {'dim': 0}},"
    "  {'name': 'layers/{L}/fc2', 'dtype': 'bfloat16', 'shape': [64, 256], 'split': {'dim': 1}},"
    "  {'name': 'layers/{L}/norm', 'dtype': 'float32', 'shape': [64]},"
    "  {'name': 'out', 'dtype': 'bfloat16', 'shape': [1000, 64],"
    "   'split': {'dim': 0, 'pad_multiple': 128}, 'place': 'last', 'tied': 'emb'}]}";

static struct ptc_schema *schema(const char *text)
{
	char *s = unit_json(text);
	struct ptc_schema *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_schema_parse_text(s, strlen(s), "schema.json", &out, &err))
		print_error("schema: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

static struct ptc_cluster *cluster(const char *text)
{
	char *s = unit_json(text);
	struct ptc_cluster *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_cluster_parse_text(s, strlen(s), "cluster.json", &out, &err))
		print_error("cluster: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

static struct ptc_config *config(const char *text)
{
	char *s = unit_json(text);
	struct ptc_config *out = NULL;
	struct ptc_error err = {.text = ""};

	if (ptc_config_parse_text(s, strlen(s), "from.json", &out, &err))
		print_error("config: %s\n", err.text);
	assert_non_null(out);
	free(s);
	return out;
}

static int parse_profile(const char *text, struct ptc_suggest_profile *p, struct ptc_error *err)
{
	char *s = unit_json(text);
	int rc = ptc_suggest_profile_parse_text(s, strlen(s), "prof.json", p, err);
	free(s);
	return rc;
}

/* The suggestion (tp, pp, dp) of @r, or NULL when it was dropped. */
static const struct ptc_suggestion *find(const struct ptc_suggest_result *r, int tp, int pp, int dp)
{
	for (int i = 0; i < r->nfit; i++)
		if (r->fit[i].tp == tp && r->fit[i].pp == pp && r->fit[i].dp == dp)
			return &r->fit[i];
	return NULL;
}

static void suggest_ok(const struct ptc_schema *s, const struct ptc_cluster *cl, const int *nodes,
		       int nnodes, const struct ptc_config *from,
		       const struct ptc_suggest_params *p, const struct ptc_suggest_profile *prof,
		       struct ptc_suggest_result *r)
{
	struct ptc_error err = {.text = ""};
	int rc = ptc_suggest(s, cl, nodes, nnodes, from, p, prof, r, &err);
	if (rc)
		print_error("ptc_suggest: %d %s\n", rc, err.text);
	assert_int_equal(rc, 0);
	assert_string_equal(err.text, "");
}

static void assert_close(double got, double want)
{
	if (fabs(got - want) > 1e-9 * fabs(want) + 1e-18) {
		print_error("got %.17g, want %.17g\n", got, want);
		fail();
	}
}

/* Activation bytes of one layer for the mini runs: seq 64, micro-batch 1,
 * hidden 64, 1 head: 64 * 1 * 64 * (34 + 5 * 1 * 64 / 64) = 159744. */
#define ACT_LAYER 159744

/* Memory per device by hand, one layout dropped for it with its reason. */
static void test_memory_and_drop(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(mini_schema);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 2}]}");
	struct ptc_suggest_params p = {
	    .global_batch = 4, .micro_batch = 1, .seq = 64, .hidden = 64, .heads = 1};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	ptc_suggest_profile_default(&prof);
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.devices, 2);
	assert_int_equal(r.ncandidates, 3); /* tp1 pp1 dp2, tp1 pp2 dp1, tp2 pp1 dp1 */
	assert_int_equal(r.nfit, 3);
	assert_int_equal(r.params_count, 100 * 64 + 2 * (64 * 64 + 64));

	/* tp1 pp1 dp2: every tensor; one micro-batch in flight (pp 1). */
	const struct ptc_suggestion *g = find(&r, 1, 1, 2);
	assert_non_null(g);
	assert_int_equal(g->state_bytes, 2 * 4096 * 6 + 2 * 64 * 8 + 6400 * 6);
	assert_int_equal(g->grad_bytes, 2 * 4096 * 2 + 2 * 64 * 4 + 6400 * 2);
	assert_int_equal(g->act_bytes, 2 * ACT_LAYER);
	assert_int_equal(g->memory_bytes, 88576 + 29696 + 2 * ACT_LAYER);
	assert_int_equal(g->micro_batches, 2);
	/* tp1 pp2 dp1: stage 0 (layer 0 and emb) is the fullest, with pp = 2
	 * micro-batches in flight under 1F1B. */
	g = find(&r, 1, 2, 1);
	assert_non_null(g);
	assert_int_equal(g->state_bytes, 4096 * 6 + 64 * 8 + 6400 * 6);
	assert_int_equal(g->grad_bytes, 4096 * 2 + 64 * 4 + 6400 * 2);
	assert_int_equal(g->act_bytes, 2 * ACT_LAYER);
	assert_int_equal(g->memory_bytes, 404224);
	/* tp2: half of every w, the rest replicated; activations / tp. */
	g = find(&r, 2, 1, 1);
	assert_non_null(g);
	assert_int_equal(g->state_bytes, 2 * 2048 * 6 + 2 * 64 * 8 + 6400 * 6);
	assert_int_equal(g->act_bytes, 2 * ACT_LAYER / 2);
	assert_int_equal(g->memory_bytes, 64000 + 21504 + ACT_LAYER);
	ptc_suggest_result_release(&r);

	/* 410,000 bytes per device: tp1 pp1 dp2 (437,760) no longer fits. */
	prof.memory_per_device_bytes = 410000;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.nfit, 2);
	assert_null(find(&r, 1, 1, 2));
	assert_non_null(find(&r, 1, 2, 1));
	assert_int_equal(r.ndropped[PTC_SUGGEST_DROP_MEMORY], 1);
	assert_string_equal(r.first_reason[PTC_SUGGEST_DROP_MEMORY],
			    "tp1 pp1 dp2: 427.50 KiB on a device (states 86.50 KiB, gradients "
			    "29.00 KiB, activations 312.00 KiB) exceed \"memory_per_device_bytes\" "
			    "= 400.39 KiB");
	json_t *j = ptc_suggest_to_json(&r, 0);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(
			     json_object_get(json_object_get(j, "dropped"), "memory"), "count")),
			 1);
	json_decref(j);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* The step-time model term by term, the bubble among them. */
static void test_step_time_formula(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(mini_schema);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 2}]}");
	struct ptc_suggest_params p = {
	    .global_batch = 4, .micro_batch = 1, .seq = 64, .hidden = 64, .heads = 1};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	ptc_suggest_profile_default(&prof);
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	double params = 100 * 64 + 2 * (64 * 64 + 64), tokens = 4 * 64;
	double compute = 6 * params * tokens / (2 * 100e12 * 0.4);

	/* tp1 pp2 dp1: m = 4 micro-batches, bubble (pp-1)/(m+pp-1) = 1/5. */
	const struct ptc_suggestion *g = find(&r, 1, 2, 1);
	assert_non_null(g);
	assert_close(g->compute_s, compute);
	assert_int_equal(g->micro_batches, 4);
	assert_close(g->bubble_fraction, 0.2);
	assert_close(g->bubble_s, compute * 1 / 4);
	assert_close(g->tp_comm_s, 0);
	assert_close(g->dp_comm_s, 0);
	assert_close(g->step_s, compute * 1.25);
	/* The bubble is the idle share of the pipeline: bubble / (busy + bubble). */
	assert_close(g->bubble_s / (g->compute_s + g->bubble_s), g->bubble_fraction);

	/* tp2 pp1 dp1: 4 all-reduces per layer per micro-batch of seq * mb *
	 * hidden * 2 bytes, ring over 2 devices of the node. */
	g = find(&r, 2, 1, 1);
	assert_non_null(g);
	double ar = 2.0 * 1 / 2 * (64 * 64 * 2) / 200e9 + 2.0 * 1 * 1e-5;
	assert_close(g->tp_comm_s, 4.0 * 2 * 4 * ar);
	assert_close(g->bubble_s, 0);
	assert_close(g->bubble_fraction, 0);
	assert_false(g->tp_across_nodes);

	/* tp1 pp1 dp2: the gradients of a device (29,696 bytes) reduced in the node. */
	g = find(&r, 1, 1, 2);
	assert_non_null(g);
	assert_close(g->dp_comm_s, 2.0 * 1 / 2 * 29696 / 200e9 + 2 * 1e-5);
	assert_close(g->step_s, compute + g->dp_comm_s);
	assert_false(g->dp_across_nodes);
	assert_close(g->reconf_s, 0);

	/* Ordered by predicted step time. */
	for (int i = 1; i < r.nfit; i++)
		assert_true(r.fit[i - 1].step_s <= r.fit[i].step_s);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* A calibrated profile's per-layer overhead, pipeline latency and shared cores:
 * the overhead is per layer of the fullest stage and micro-batch whatever tp, so
 * a split that shrinks the FLOPs does not shrink it; each micro-batch sends one
 * activation and one gradient across the pipeline; both are in the bubble, of
 * which ranks sharing fewer cores lose only the cores one stage cannot fill. */
static void test_overhead_and_p2p(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(mini_schema);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 2}]}");
	struct ptc_suggest_params p = {
	    .global_batch = 4, .micro_batch = 1, .seq = 64, .hidden = 64, .heads = 1};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;
	struct ptc_error e = {.text = ""};

	/* Parsed, kept, written back; 0 by default, so the defaults rank as before. */
	assert_int_equal(parse_profile("{'layer_overhead_s': 1e-3, 'p2p_latency_s': 1e-3, "
				       "'latency_s': 4e-3, 'flops_per_device': 1e9, 'mfu': 1}",
				       &prof, &e),
			 0);
	assert_close(prof.layer_overhead_s, 1e-3);
	assert_close(prof.p2p_latency_s, 1e-3);
	json_t *pj = ptc_suggest_profile_to_json(&prof);
	assert_close(json_real_value(json_object_get(pj, "layer_overhead_s")), 1e-3);
	assert_close(json_real_value(json_object_get(pj, "p2p_latency_s")), 1e-3);
	json_decref(pj);
	struct ptc_suggest_profile def;
	ptc_suggest_profile_default(&def);
	assert_close(def.layer_overhead_s, 0);
	assert_close(def.p2p_latency_s, 0);

	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	double params = 100 * 64 + 2 * (64 * 64 + 64), tokens = 4 * 64;
	double compute = 6 * params * tokens / (2 * 1e9);

	/* tp1 pp2 dp1: m = 4, one layer a stage: 4 ms of overhead, 8 messages. */
	const struct ptc_suggestion *g = find(&r, 1, 2, 1);
	assert_non_null(g);
	assert_close(g->compute_s, compute);
	assert_close(g->overhead_s, 4 * 1 * 1e-3);
	assert_close(g->pp_comm_s, 2 * 4 * 1e-3);
	assert_close(g->bubble_s, (compute + 4e-3 + 8e-3) * 1 / 4);
	assert_close(g->step_s, (compute + 4e-3 + 8e-3) * 1.25);
	/* tp2 pp1 dp1: half the FLOPs a device, the same overhead as tp1 on both
	 * layers of m = 4 micro-batches; no pipeline. */
	g = find(&r, 2, 1, 1);
	assert_non_null(g);
	assert_close(g->compute_s, compute);
	assert_close(g->overhead_s, 4 * 2 * 1e-3);
	assert_close(g->pp_comm_s, 0);
	assert_close(g->bubble_s, 0);
	double ar = 2.0 * 1 / 2 * (64 * 64 * 2) / 200e9 + 2.0 * 1 * 4e-3;
	assert_close(g->step_s, compute + 8e-3 + 4.0 * 2 * 4 * ar);
	/* tp1 pp1 dp2: m = 2 micro-batches a replica, 2 layers: 4 ms. */
	g = find(&r, 1, 1, 2);
	assert_non_null(g);
	assert_close(g->overhead_s, 2 * 2 * 1e-3);
	assert_close(g->dp_comm_s, 2.0 * 1 / 2 * 29696 / 200e9 + 2 * 4e-3);
	assert_close(g->step_s, compute + 4e-3 + g->dp_comm_s);
	/* The JSON carries both parts. */
	json_t *j = ptc_suggest_to_json(&r, 0);
	json_t *sg = json_object_get(j, "suggestions");
	for (size_t i = 0; i < json_array_size(sg); i++) {
		json_t *x = json_array_get(sg, i);
		assert_close(json_real_value(json_object_get(x, "overhead_s")),
			     r.fit[i].overhead_s);
		assert_close(json_real_value(json_object_get(x, "pp_comm_s")), r.fit[i].pp_comm_s);
	}
	json_decref(j);
	/* With them DP wins (23.3 ms against the pipeline's 29.1); without them (the
	 * defaults' zeros) the pipeline (14.1 ms against 19.3). */
	assert_int_equal(r.fit[0].dp, 2);
	ptc_suggest_result_release(&r);

	/* Ranks sharing cores: the bubble's idle rank gives its core to the working
	 * stage's one rank, which fills 1 of 1.5 cores: a third of the bubble lost. */
	double full_bubble = (compute + 4e-3 + 8e-3) / 4;
	static const struct {
		double cores, lost;
	} share[] = {{1.5, 1.0 / 3}, {1, 0}, {0.5, 0}, {2, 1} /* a core each */, {0, 1}};
	for (size_t i = 0; i < sizeof(share) / sizeof(share[0]); i++) {
		prof.shared_cores = share[i].cores;
		suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
		g = find(&r, 1, 2, 1);
		assert_close(g->bubble_s, full_bubble * share[i].lost);
		assert_close(g->bubble_fraction, 0.2); /* the pipeline's, as before */
		assert_close(g->step_s, compute + 12e-3 + full_bubble * share[i].lost);
		ptc_suggest_result_release(&r);
	}
	prof.layer_overhead_s = prof.p2p_latency_s = 0;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.fit[0].pp, 2);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* A slow network between nodes keeps TP within a node, and DP within one
 * when the model says so; a fast one prefers DP over a pipeline's bubble. */
static void test_slow_inter_node(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(heads_schema);
	struct ptc_cluster *cl =
	    cluster("{'nodes': [{'id': 'a', 'devices': 2}, {'id': 'b', 'devices': 2}]}");
	struct ptc_suggest_params p = {.global_batch = 64, .micro_batch = 2, .seq = 128};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	/* Heads and hidden from the schema: 64, 64 / 16 = 4. Links as fast between
	 * nodes as within, no latency. */
	ptc_suggest_profile_default(&prof);
	prof.inter_node_bw = prof.intra_node_bw;
	prof.latency_s = 0;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.params.hidden, 64);
	assert_int_equal(r.params.heads, 4);
	assert_true(r.hidden_inferred && r.heads_inferred);
	/* tp4 spans both nodes: dropped, the profile forbids it. */
	assert_null(find(&r, 4, 1, 1));
	assert_int_equal(r.ndropped[PTC_SUGGEST_DROP_TP_NODES], 1);
	assert_string_equal(r.first_reason[PTC_SUGGEST_DROP_TP_NODES],
			    "tp4 pp1 dp1: the TP group of ranks 0-3 spans nodes \"a\" and \"b\" "
			    "(the profile's \"tp_across_nodes\" is false)");
	/* pp4 = layers 4: valid; 6 candidates in all, 5 fit. */
	assert_int_equal(r.ncandidates, 6);
	assert_int_equal(r.nfit, 5);
	/* Same fast links everywhere: no bubble and no TP (all DP) beats the rest. */
	assert_int_equal(r.fit[0].tp, 1);
	assert_int_equal(r.fit[0].pp, 1);
	assert_int_equal(r.fit[0].dp, 4);
	assert_true(r.fit[0].dp_across_nodes);
	ptc_suggest_result_release(&r);

	/* 1 kB/s between nodes, TP allowed across: tp4 is a candidate, and loses. */
	ptc_suggest_profile_default(&prof);
	prof.inter_node_bw = 1e3;
	prof.tp_across_nodes = true;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.nfit, 6);
	const struct ptc_suggestion *t4 = find(&r, 4, 1, 1);
	assert_non_null(t4);
	assert_true(t4->tp_across_nodes);
	double ar = 2.0 * 3 / 4 * (128 * 2 * 64 * 2) / 1e3 + 2.0 * 3 * 1e-5;
	assert_close(t4->tp_comm_s, 32.0 * 4 * 4 * ar); /* m = 64 / 2 */
	/* The winner crosses nodes with neither TP nor DP: a pipeline whose stages
	 * are on the two nodes (tp1 pp2 dp2 keeps each DP group, ranks 0-1 and 2-3,
	 * on one node). Every layout that reduces across nodes comes last. */
	assert_false(r.fit[0].tp_across_nodes);
	assert_false(r.fit[0].dp_across_nodes);
	assert_true(r.fit[0].pp > 1);
	const struct ptc_suggestion *p2 = find(&r, 1, 2, 2);
	assert_false(p2->tp_across_nodes || p2->dp_across_nodes);
	int first_slow = r.nfit;
	for (int i = 0; i < r.nfit; i++) {
		bool slow = r.fit[i].tp_across_nodes || r.fit[i].dp_across_nodes;
		if (slow && first_slow == r.nfit)
			first_slow = i;
		assert_true(slow == (i >= first_slow));
	}
	assert_int_equal(first_slow, 3); /* tp1 pp2 dp2, tp1 pp4 dp1, tp2 pp2 dp1 */
	assert_true(find(&r, 1, 1, 4)->step_s > find(&r, 1, 2, 2)->step_s * 100);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* With a current config, each candidate pays its plan's network bytes. */
static void test_reconfiguration_bytes(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(heads_schema);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 2},"
					 " {'id': 'b', 'devices': 2}, {'id': 'c', 'devices': 4}]}");
	struct ptc_config *from = config("{'version': 7, 'tp': 2, 'pp': 2, 'dp': 1,"
					 " 'nodes': ['a', 'b'],"
					 " 'dataset': {'index': 'file:///i.json', 'seed': 1,"
					 " 'global_batch': 48}}");
	struct ptc_suggest_params p = {.seq = 128, .from_name = "from.json"};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;
	struct ptc_error err = {.text = ""};
	int nodes[] = {0, 1};

	ptc_suggest_profile_default(&prof);
	prof.mean_time_between_changes_s = 60;
	suggest_ok(s, cl, nodes, 2, from, &p, &prof, &r);
	/* The global batch comes from the config's dataset. */
	assert_int_equal(r.params.global_batch, 48);
	assert_int_equal(r.params.micro_batch, 1);
	const struct ptc_suggestion *cur = find(&r, 2, 2, 1);
	assert_non_null(cur);
	assert_true(cur->current);
	assert_int_equal(cur->reconf_bytes, 0);
	assert_close(cur->reconf_s, 0);
	int ncurrent = 0;
	for (int i = 0; i < r.nfit; i++) {
		const struct ptc_suggestion *g = &r.fit[i];
		ncurrent += g->current;
		/* The same plan by hand. */
		char text[256];
		snprintf(text, sizeof(text),
			 "{'version': 8, 'tp': %d, 'pp': %d, 'dp': %d, 'nodes': ['a', 'b']}", g->tp,
			 g->pp, g->dp);
		struct ptc_config *to = config(text);
		struct ptc_layout la, lb;
		struct ptc_plan *plan = NULL;
		assert_int_equal(ptc_layout_init(&la, s, from, cl, "from.json", &err), 0);
		assert_int_equal(ptc_layout_init(&lb, s, to, cl, "to.json", &err), 0);
		assert_int_equal(ptc_plan_compute(&la, &lb, NULL, 0, &plan, &err), 0);
		assert_int_equal(g->reconf_bytes, plan->bytes_network);
		int64_t busiest = 0;
		for (int n = 0; n < plan->nnodes; n++) {
			int64_t b = plan->per_node[n].bytes_in > plan->per_node[n].bytes_out
					? plan->per_node[n].bytes_in
					: plan->per_node[n].bytes_out;
			busiest = b > busiest ? b : busiest;
		}
		assert_close(g->reconf_total_s, (double)busiest / 25e9);
		double base = g->compute_s + g->tp_comm_s + g->bubble_s + g->dp_comm_s;
		assert_close(g->reconf_s, g->reconf_total_s * base / 60);
		assert_close(g->step_s, base + g->reconf_s);
		ptc_plan_free(plan);
		ptc_layout_release(&lb);
		ptc_layout_release(&la);
		ptc_config_free(to);
	}
	assert_int_equal(ncurrent, 1);
	/* Some candidate moves bytes: tp1 pp1 dp4 needs all of both stages on each node. */
	assert_true(find(&r, 1, 1, 4)->reconf_bytes > 0);

	/* The suggested config follows the current one: next version, same dataset. */
	json_t *c = ptc_suggest_config_to_json(&r, 0);
	char *txt = json_dumps(c, 0);
	struct ptc_config *next = NULL;
	assert_int_equal(ptc_config_parse_text(txt, strlen(txt), "next.json", &next, &err), 0);
	assert_int_equal(next->version, 8);
	assert_int_equal(next->tp, r.fit[0].tp);
	assert_int_equal(next->nnodes, 2);
	assert_string_equal(next->nodes[1], "b");
	assert_int_equal(next->dataset_global_batch, 48);
	assert_int_equal(ptc_dataset_change_ok(from, next, "next.json", &err), 0);
	ptc_config_free(next);
	free(txt);
	json_decref(c);
	ptc_suggest_result_release(&r);

	/* On node c alone (4 devices), everything crosses the network. */
	int only_c[] = {2};
	suggest_ok(s, cl, only_c, 1, from, &p, &prof, &r);
	assert_int_equal(r.devices, 4);
	for (int i = 0; i < r.nfit; i++) {
		assert_false(r.fit[i].current);
		assert_true(r.fit[i].reconf_bytes > 0);
	}
	ptc_suggest_result_release(&r);
	ptc_config_free(from);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* top K of the JSON is the K fastest, in order. */
static void test_top_k_json(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(heads_schema);
	struct ptc_cluster *cl =
	    cluster("{'nodes': [{'id': 'a', 'devices': 4}, {'id': 'b', 'devices': 4}]}");
	struct ptc_suggest_params p = {.global_batch = 64, .seq = 256};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	ptc_suggest_profile_default(&prof);
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_true(r.nfit > 3);
	json_t *j = ptc_suggest_to_json(&r, 3);
	json_t *sg = json_object_get(j, "suggestions");
	assert_int_equal(json_array_size(sg), 3);
	for (int i = 0; i < 3; i++) {
		json_t *e = json_array_get(sg, (size_t)i);
		assert_int_equal(json_integer_value(json_object_get(e, "tp")), r.fit[i].tp);
		assert_int_equal(json_integer_value(json_object_get(e, "pp")), r.fit[i].pp);
		assert_int_equal(json_integer_value(json_object_get(e, "dp")), r.fit[i].dp);
		assert_close(json_real_value(json_object_get(e, "step_s")), r.fit[i].step_s);
		assert_true(i == 0 || r.fit[i - 1].step_s <= r.fit[i].step_s);
		json_t *c = json_object_get(e, "config");
		assert_int_equal(json_integer_value(json_object_get(c, "version")), 1);
		assert_int_equal(json_array_size(json_object_get(c, "nodes")), 2);
	}
	assert_int_equal(json_integer_value(json_object_get(j, "fit")), r.nfit);
	assert_true(json_is_null(json_object_get(j, "from")));
	json_decref(j);
	j = ptc_suggest_to_json(&r, 0);
	assert_int_equal(json_array_size(json_object_get(j, "suggestions")), (size_t)r.nfit);
	json_decref(j);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* Layouts the schema or the batch refuse, with the first reason of each kind. */
static void test_schema_and_batch_drops(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(heads_schema);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 8}]}");
	struct ptc_suggest_params p = {.global_batch = 6, .micro_batch = 3, .seq = 16};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	ptc_suggest_profile_default(&prof);
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	/* 8 devices: (tp, pp) in {1,2,4,8} x divisors: 10 candidates. tp8 exceeds
	 * the 4 heads; pp8 exceeds the 4 layers. */
	assert_int_equal(r.ncandidates, 10);
	assert_int_equal(r.ndropped[PTC_SUGGEST_DROP_SCHEMA], 2);
	assert_string_equal(r.first_reason[PTC_SUGGEST_DROP_SCHEMA],
			    "tp1 pp8 dp1: \"pp\" = 8 exceeds the 4 layers of the schema");
	/* dp 4 (twice) and dp 8 do not divide 6; dp 2 leaves 3 samples: one micro-batch. */
	assert_int_equal(r.ndropped[PTC_SUGGEST_DROP_BATCH], 3);
	assert_string_equal(r.first_reason[PTC_SUGGEST_DROP_BATCH],
			    "tp1 pp1 dp8: dp = 8 does not divide the global batch of 6");
	assert_non_null(find(&r, 4, 1, 2));
	assert_null(find(&r, 8, 1, 1));
	assert_int_equal(r.nfit, 5);
	ptc_suggest_result_release(&r);

	/* A micro-batch that does not divide a replica's samples. */
	p.global_batch = 8;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_string_equal(r.first_reason[PTC_SUGGEST_DROP_BATCH],
			    "tp1 pp1 dp8: the 1 samples of a DP replica are not a multiple of the "
			    "micro-batch of 3");
	assert_int_equal(r.ndropped[PTC_SUGGEST_DROP_BATCH], 8);
	assert_int_equal(r.nfit, 0);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

#define FAILS(call, msg)                                                                           \
	do {                                                                                       \
		struct ptc_error e_ = {.text = ""};                                                \
		struct ptc_suggest_result r_;                                                      \
		int rc_ = (call);                                                                  \
		if (rc_ == 0)                                                                      \
			ptc_suggest_result_release(&r_);                                           \
		assert_int_equal(rc_, -EINVAL);                                                    \
		assert_string_equal(e_.text, (msg));                                               \
		assert_int_equal(e_.code, -EINVAL);                                                \
	} while (0)

/* Bad inputs: refused with the flag, the file or the key named. */
static void test_bad_inputs(void **state)
{
	(void)state;
	struct ptc_schema *s = schema(mini_schema);
	struct ptc_cluster *cl =
	    cluster("{'nodes': [{'id': 'a', 'devices': 2}, {'id': 'b', 'devices': 2}]}");
	struct ptc_suggest_profile prof;
	struct ptc_suggest_params p = {0};
	int twice[] = {1, 1}, out_of[] = {0, 5};

	ptc_suggest_profile_default(&prof);
	p.global_batch = -1;
	FAILS(ptc_suggest(s, cl, NULL, 0, NULL, &p, &prof, &r_, &e_),
	      "--global-batch = -1 is out of range [1, 1099511627776]");
	p = (struct ptc_suggest_params){.global_batch = 4, .micro_batch = 8};
	FAILS(ptc_suggest(s, cl, NULL, 0, NULL, &p, &prof, &r_, &e_),
	      "--micro-batch = 8 exceeds the global batch of 4");
	p = (struct ptc_suggest_params){0};
	FAILS(ptc_suggest(s, cl, twice, 2, NULL, &p, &prof, &r_, &e_),
	      "--nodes: node \"b\" is listed twice");
	FAILS(ptc_suggest(s, cl, out_of, 2, NULL, &p, &prof, &r_, &e_),
	      "--nodes: node index 5 is not in the cluster");
	FAILS(ptc_suggest(s, cl, twice, 0, NULL, &p, &prof, &r_, &e_), "--nodes: no node chosen");
	struct ptc_config *from =
	    config("{'version': 1, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['z']}");
	p.from_name = "from.json";
	FAILS(ptc_suggest(s, cl, NULL, 0, from, &p, &prof, &r_, &e_),
	      "from.json: nodes[0] = \"z\" is not in the cluster");
	ptc_config_free(from);
	prof.mfu = 0;
	FAILS(ptc_suggest(s, cl, NULL, 0, NULL, &p, &prof, &r_, &e_),
	      "profile: \"mfu\" = 0 is out of range (0, 1]");

	/* Profile files. */
	struct ptc_suggest_profile q;
	struct ptc_error e = {.text = ""};
	assert_int_equal(
	    parse_profile("{'mfu': 0.5, 'tp_across_nodes': true, 'inter_node_bw': 1e9}", &q, &e),
	    0);
	assert_close(q.mfu, 0.5);
	assert_true(q.tp_across_nodes);
	assert_close(q.inter_node_bw, 1e9);
	assert_close(q.intra_node_bw, 200e9); /* the default */
	assert_close(q.memory_per_device_bytes, 80.0 * (1 << 30));
	static const struct {
		const char *text, *msg;
	} bad[] = {
	    {"{'mfu': 1.5}", "prof.json: \"mfu\" = 1.5 is out of range (0, 1]"},
	    {"{'flops': 1}", "prof.json: unknown field \"flops\""},
	    {"{'inter_node_bw': '25e9'}", "prof.json: \"inter_node_bw\" must be a number"},
	    {"{'inter_node_bw': 0}", "prof.json: \"inter_node_bw\" = 0 must be greater than 0"},
	    {"{'latency_s': -1}", "prof.json: \"latency_s\" = -1 must be at least 0"},
	    {"{'layer_overhead_s': -1e-3}",
	     "prof.json: \"layer_overhead_s\" = -0.001 must be at least 0"},
	    {"{'p2p_latency_s': 'fast'}", "prof.json: \"p2p_latency_s\" must be a number"},
	    {"{'shared_cores': -2}", "prof.json: \"shared_cores\" = -2 must be at least 0"},
	    {"{'tp_across_nodes': 1}", "prof.json: \"tp_across_nodes\" must be true or false"},
	    {"[1]", "prof.json: a profile is a JSON object"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ptc_suggest_profile_default(&q);
		e = (struct ptc_error){.text = ""};
		assert_int_equal(parse_profile(bad[i].text, &q, &e), -EINVAL);
		assert_string_equal(e.text, bad[i].msg);
		assert_close(q.mfu, 0.4); /* untouched */
	}
	e = (struct ptc_error){.text = ""};
	assert_int_equal(parse_profile("{'mfu': ", &q, &e), -EINVAL);
	assert_non_null(strstr(e.text, "prof.json: invalid JSON at line 1"));
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

/* Hidden and heads inferred from a generated schema. */
static void test_infer_from_generated(void **state)
{
	(void)state;
	struct ptc_gen_args a = {
	    .layers = 4, .hidden = 256, .heads = 8, .vocab = 1000, .dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	json_t *j = ptc_gen_megatron_gpt(&a, &err);
	struct ptc_schema *s = NULL;
	assert_int_equal(ptc_schema_parse(j, "gen", &s, &err), 0);
	json_decref(j);
	struct ptc_cluster *cl = cluster("{'nodes': [{'id': 'a', 'devices': 8}]}");
	struct ptc_suggest_params p = {0};
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result r;

	ptc_suggest_profile_default(&prof);
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.params.hidden, 256);
	assert_int_equal(r.params.heads, 8);
	assert_int_equal(r.params.global_batch, 512);
	assert_int_equal(r.params.micro_batch, 1);
	assert_int_equal(r.params.seq, 2048);
	assert_true(r.nfit > 0);
	ptc_suggest_result_release(&r);
	/* Given values win over inference. */
	p.hidden = 128;
	p.heads = 2;
	suggest_ok(s, cl, NULL, 0, NULL, &p, &prof, &r);
	assert_int_equal(r.params.hidden, 128);
	assert_false(r.hidden_inferred);
	ptc_suggest_result_release(&r);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_memory_and_drop),	   cmocka_unit_test(test_step_time_formula),
	    cmocka_unit_test(test_overhead_and_p2p),	   cmocka_unit_test(test_slow_inter_node),
	    cmocka_unit_test(test_reconfiguration_bytes),  cmocka_unit_test(test_top_k_json),
	    cmocka_unit_test(test_schema_and_batch_drops), cmocka_unit_test(test_bad_inputs),
	    cmocka_unit_test(test_infer_from_generated),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
