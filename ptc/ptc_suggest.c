/*
 * ptc_suggest.c - `mlfs suggest`: the layouts worth running on a set of
 * nodes, ranked by an analytic step-time model.
 *
 * DESIGN
 * Every (tp, pp, dp) whose product is the devices of the chosen nodes is a
 * candidate. Each is placed with ptc_layout_init, which is the one judge of
 * what the schema admits (heads, units, chunks, stages against layers), so
 * suggest never disagrees with a mount about a layout's validity. Then, in
 * order, a candidate is dropped for the first of: the batch (dp must divide
 * the global batch into whole micro-batches), a TP group spanning nodes
 * (unless the profile allows it), the memory of its fullest device, and a
 * plan from the current config that cannot be computed. The rest are ranked
 * by the predicted step time; the formulas are in docs/cli.md ("mlfs
 * suggest") and in evaluate() below, term for term.
 *
 * Memory per device is exact for the states: the partition bytes of every
 * tensor a stage holds, in every schema state's dtype (ptc_partition_elems,
 * the largest TP rank), plus gradients in the tensor's dtype; activations
 * are Korthikanti et al. (2022)'s estimate per transformer layer.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

#define GIB ((double)(1 << 30))

/* ---------------------------------------------------------------- profile */

void ptc_suggest_profile_default(struct ptc_suggest_profile *p)
{
	*p = (struct ptc_suggest_profile){
	    .flops_per_device = 100e12,
	    .mfu = 0.4,
	    .memory_per_device_bytes = 80 * GIB,
	    .intra_node_bw = 200e9,
	    .inter_node_bw = 25e9,
	    .latency_s = 1e-5,
	    .mean_time_between_changes_s = 3600,
	    .layer_overhead_s = 0,
	    .p2p_latency_s = 0,
	    .shared_cores = 0,
	    .tp_across_nodes = false,
	};
}

/* The numeric keys of a profile: name, offset, whether 0 is allowed, upper bound. */
static const struct {
	const char *key;
	size_t off;
	bool zero_ok;
	double max;
} prof_keys[] = {
    {"flops_per_device", offsetof(struct ptc_suggest_profile, flops_per_device), false, INFINITY},
    {"mfu", offsetof(struct ptc_suggest_profile, mfu), false, 1},
    {"memory_per_device_bytes", offsetof(struct ptc_suggest_profile, memory_per_device_bytes),
     false, INFINITY},
    {"intra_node_bw", offsetof(struct ptc_suggest_profile, intra_node_bw), false, INFINITY},
    {"inter_node_bw", offsetof(struct ptc_suggest_profile, inter_node_bw), false, INFINITY},
    {"latency_s", offsetof(struct ptc_suggest_profile, latency_s), true, INFINITY},
    {"mean_time_between_changes_s",
     offsetof(struct ptc_suggest_profile, mean_time_between_changes_s), false, INFINITY},
    {"layer_overhead_s", offsetof(struct ptc_suggest_profile, layer_overhead_s), true, INFINITY},
    {"p2p_latency_s", offsetof(struct ptc_suggest_profile, p2p_latency_s), true, INFINITY},
    {"shared_cores", offsetof(struct ptc_suggest_profile, shared_cores), true, INFINITY},
};
#define NPROF (sizeof(prof_keys) / sizeof(prof_keys[0]))

static double *prof_field(struct ptc_suggest_profile *p, size_t k)
{
	return (double *)((char *)p + prof_keys[k].off);
}

/* Every value of @p in range; -EINVAL naming @name and the key. */
static int profile_check(const struct ptc_suggest_profile *p, const char *name,
			 struct ptc_error *err)
{
	for (size_t k = 0; k < NPROF; k++) {
		double v = *prof_field((struct ptc_suggest_profile *)p, k);
		if (!isfinite(v) || v < 0 || (v == 0 && !prof_keys[k].zero_ok) ||
		    v > prof_keys[k].max) {
			if (prof_keys[k].max < INFINITY)
				return ptc_errorf(err, "%s: \"%s\" = %g is out of range (0, %g]",
						  name, prof_keys[k].key, v, prof_keys[k].max);
			return ptc_errorf(err, "%s: \"%s\" = %g must be %s", name, prof_keys[k].key,
					  v,
					  prof_keys[k].zero_ok ? "at least 0" : "greater than 0");
		}
	}
	return 0;
}

int ptc_suggest_profile_parse(const json_t *root, const char *name, struct ptc_suggest_profile *out,
			      struct ptc_error *err)
{
	static const char *const known[] = {"flops_per_device",
					    "mfu",
					    "memory_per_device_bytes",
					    "intra_node_bw",
					    "inter_node_bw",
					    "latency_s",
					    "mean_time_between_changes_s",
					    "layer_overhead_s",
					    "p2p_latency_s",
					    "shared_cores",
					    "tp_across_nodes",
					    NULL};
	struct ptc_suggest_profile p;
	int rc;

	ptc_suggest_profile_default(&p);
	if (!json_is_object(root))
		return ptc_errorf(err, "%s: a profile is a JSON object", name);
	if ((rc = ptc_json_known(root, known, name, "", err)))
		return rc;
	for (size_t k = 0; k < NPROF; k++) {
		json_t *v = json_object_get(root, prof_keys[k].key);
		if (!v)
			continue;
		if (!json_is_number(v))
			return ptc_errorf(err, "%s: \"%s\" must be a number", name,
					  prof_keys[k].key);
		*prof_field(&p, k) = json_number_value(v);
	}
	json_t *v = json_object_get(root, "tp_across_nodes");
	if (v && !json_is_boolean(v))
		return ptc_errorf(err, "%s: \"tp_across_nodes\" must be true or false", name);
	if (v)
		p.tp_across_nodes = json_is_true(v);
	if ((rc = profile_check(&p, name, err)))
		return rc;
	*out = p;
	return 0;
}

int ptc_suggest_profile_parse_text(const char *text, size_t len, const char *name,
				   struct ptc_suggest_profile *out, struct ptc_error *err)
{
	json_t *root = ptc_json_load(text, len, name, err);
	int rc;

	if (!root)
		return -EINVAL;
	rc = ptc_suggest_profile_parse(root, name, out, err);
	json_decref(root);
	return rc;
}

json_t *ptc_suggest_profile_to_json(const struct ptc_suggest_profile *p)
{
	json_t *o = json_object();

	for (size_t k = 0; o && k < NPROF; k++)
		json_object_set_new(o, prof_keys[k].key,
				    json_real(*prof_field((struct ptc_suggest_profile *)p, k)));
	if (o)
		json_object_set_new(o, "tp_across_nodes", json_boolean(p->tp_across_nodes));
	return o;
}

const char *ptc_suggest_drop_name(enum ptc_suggest_drop d)
{
	static const char *const names[] = {"schema", "batch", "tp_across_nodes", "memory", "plan"};
	return (unsigned)d < PTC_SUGGEST_DROP_COUNT ? names[d] : "?";
}

/* ------------------------------------------------------------ the model */

/* What every candidate shares. */
struct ctx {
	const struct ptc_schema *s;
	const struct ptc_cluster *cl;
	const struct ptc_config *from;
	const struct ptc_layout *from_layout; /* NULL without @from */
	const struct ptc_suggest_params *p;
	const struct ptc_suggest_profile *prof;
	struct ptc_config cfg; /* the candidate's config: nodes set, tp pp dp per candidate */
	int64_t *state_bpe;    /* per tensor: bytes per element over every state */
	int64_t *by_t_state, *by_t_grad; /* per TP rank: one stage's bytes */
};

/* Ring all-reduce of @bytes over @n devices on links of @bw bytes/s:
 * 2(n-1) steps, each of bytes/n and one latency. */
static double allreduce_s(double bytes, int n, double bw, double latency)
{
	if (n <= 1)
		return 0;
	return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency;
}

/* The share of the bubble a step loses. Each device computing on its own: all of
 * it. Ranks sharing fewer cores: some stage always works, and its @stage_ranks
 * ranks take the cores the idle ones leave; only the cores they cannot fill are
 * lost. */
static double bubble_lost(const struct ptc_suggest_profile *prof, int world, int stage_ranks)
{
	double c = prof->shared_cores;

	if (c <= 0 || world <= c)
		return 1;
	return stage_ranks >= c ? 0 : 1 - stage_ranks / c;
}

/* Counts a dropped candidate, keeping the first reason of its kind. */
static void drop(struct ptc_suggest_result *r, enum ptc_suggest_drop d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void drop(struct ptc_suggest_result *r, enum ptc_suggest_drop d, const char *fmt, ...)
{
	if (r->ndropped[d]++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->first_reason[d], PTC_ERROR_MAX, fmt, ap);
		va_end(ap);
	}
}

/* @b bytes for a message: "123 B", "1.50 MiB". */
static const char *human(double b, char buf[32])
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int u = 0;

	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	snprintf(buf, 32, u ? "%.2f %s" : "%.0f %s", b, units[u]);
	return buf;
}

/* Adds tensor @i's partitions on every TP rank to the per-rank sums. */
static void add_tensor(struct ctx *x, int tp, int i)
{
	const struct ptc_tensor *t = &x->s->tensors[i];
	int64_t dsz = (int64_t)ptc_dtype_size(t->dtype);

	for (int tr = 0; tr < tp; tr++) {
		int64_t e = ptc_partition_elems(t, tp, tr);
		x->by_t_state[tr] += e * x->state_bpe[i];
		x->by_t_grad[tr] += e * dsz;
	}
}

/* Evaluates candidate (tp, pp, dp): appends it to r->fit or drops it.
 * 0 or -ENOMEM. */
static int evaluate(struct ctx *x, int tp, int pp, int dp, struct ptc_suggest_result *r)
{
	const struct ptc_suggest_params *p = x->p;
	const struct ptc_suggest_profile *prof = x->prof;
	const struct ptc_schema *s = x->s;
	struct ptc_error e = {.text = ""};
	struct ptc_layout l;
	char name[64];
	int rc;

	snprintf(name, sizeof(name), "tp%d pp%d dp%d", tp, pp, dp);
	x->cfg.tp = tp;
	x->cfg.pp = pp;
	x->cfg.dp = dp;
	r->ncandidates++;
	if ((rc = ptc_layout_init(&l, s, &x->cfg, x->cl, name, &e))) {
		if (rc != -EINVAL)
			return rc;
		drop(r, PTC_SUGGEST_DROP_SCHEMA, "%s", e.text);
		return 0;
	}
	rc = 0;
	if (p->global_batch % dp) {
		drop(r, PTC_SUGGEST_DROP_BATCH,
		     "%s: dp = %d does not divide the global batch of %" PRId64, name, dp,
		     p->global_batch);
		goto out;
	}
	if (p->global_batch / dp % p->micro_batch) {
		drop(r, PTC_SUGGEST_DROP_BATCH,
		     "%s: the %" PRId64 " samples of a DP replica are not a multiple of the "
		     "micro-batch of %" PRId64,
		     name, p->global_batch / dp, p->micro_batch);
		goto out;
	}

	/* Which groups span nodes: a TP group (same d, p), a DP group (same t, p). */
	bool tp_x = false, dp_x = false;
	int tp_bad = -1;
	for (int rk = 0; rk < l.world; rk++) {
		const struct ptc_rank *k = &l.ranks[rk];
		if (k->node != l.ranks[ptc_layout_rank(&l, 0, k->d, k->p)].node && !tp_x)
			tp_x = true, tp_bad = rk;
		if (k->node != l.ranks[ptc_layout_rank(&l, k->t, 0, k->p)].node)
			dp_x = true;
	}
	if (tp_x && !prof->tp_across_nodes) {
		const struct ptc_rank *k = &l.ranks[tp_bad];
		int r0 = ptc_layout_rank(&l, 0, k->d, k->p);
		drop(r, PTC_SUGGEST_DROP_TP_NODES,
		     "%s: the TP group of ranks %d-%d spans nodes \"%s\" and \"%s\" (the profile's "
		     "\"tp_across_nodes\" is false)",
		     name, r0, r0 + tp - 1, x->cl->nodes[l.ranks[r0].node].id,
		     x->cl->nodes[k->node].id);
		goto out;
	}

	/* Memory of the fullest device, stage by stage. */
	int64_t m = p->global_batch / dp / p->micro_batch; /* micro-batches per replica */
	double act_layer = (double)p->seq * (double)p->micro_batch * (double)p->hidden *
			   (34.0 + 5.0 * (double)p->heads * (double)p->seq / (double)p->hidden) /
			   tp;
	struct ptc_suggestion g = {.tp = tp, .pp = pp, .dp = dp, .micro_batches = m};
	int layers_max = 0;
	int64_t grad_max = 0; /* what a DP group reduces: the largest device's gradients */
	for (int st = 0; st < pp; st++) {
		const struct ptc_rank *k = &l.ranks[ptc_layout_rank(&l, 0, 0, st)];
		int nl = k->layer_end - k->layer_begin;
		if (nl > layers_max)
			layers_max = nl;
		memset(x->by_t_state, 0, (size_t)tp * sizeof(int64_t));
		memset(x->by_t_grad, 0, (size_t)tp * sizeof(int64_t));
		/* The stage's layers' tensors, then every tensor outside layers. */
		if (s->num_layers > 0)
			for (int j = s->layer_off[k->layer_begin]; j < s->layer_off[k->layer_end];
			     j++)
				add_tensor(x, tp, s->by_layer[j]);
		for (int j = s->num_layers > 0 ? s->layer_off[s->num_layers] : 0; j < s->ntensors;
		     j++) {
			int i = s->num_layers > 0 ? s->by_layer[j] : j;
			if (s->tensors[i].place != PTC_PLACE_LAYER &&
			    ptc_layout_stage_holds(&l, st, i))
				add_tensor(x, tp, i);
		}
		/* 1F1B: stage st holds the activations of min(pp - st, m) micro-batches. */
		int64_t inflight = pp - st < m ? pp - st : m;
		int64_t act = (int64_t)llround(act_layer * nl * (double)inflight);
		for (int tr = 0; tr < tp; tr++) {
			int64_t tot = x->by_t_state[tr] + x->by_t_grad[tr] + act;
			if (x->by_t_grad[tr] > grad_max)
				grad_max = x->by_t_grad[tr];
			if (tot > g.memory_bytes) {
				g.memory_bytes = tot;
				g.state_bytes = x->by_t_state[tr];
				g.grad_bytes = x->by_t_grad[tr];
				g.act_bytes = act;
			}
		}
	}
	if ((double)g.memory_bytes > prof->memory_per_device_bytes) {
		char h[5][32];
		drop(r, PTC_SUGGEST_DROP_MEMORY,
		     "%s: %s on a device (states %s, gradients %s, activations %s) exceed "
		     "\"memory_per_device_bytes\" = %s",
		     name, human((double)g.memory_bytes, h[0]), human((double)g.state_bytes, h[1]),
		     human((double)g.grad_bytes, h[2]), human((double)g.act_bytes, h[3]),
		     human(prof->memory_per_device_bytes, h[4]));
		goto out;
	}
	/* Step time. */
	double tokens = (double)p->global_batch * (double)p->seq;
	double world = (double)tp * pp * dp;
	g.compute_s =
	    6.0 * (double)r->params_count * tokens / (world * prof->flops_per_device * prof->mfu);
	double tp_bytes = (double)p->seq * (double)p->micro_batch * (double)p->hidden * 2.0;
	g.tp_comm_s = (double)m * layers_max * 4.0 *
		      allreduce_s(tp_bytes, tp, tp_x ? prof->inter_node_bw : prof->intra_node_bw,
				  prof->latency_s);
	/* A framework's fixed cost per operator does not shrink with tp: per layer of
	 * the fullest stage and micro-batch. One activation forward and one gradient
	 * backward cross each stage boundary per micro-batch, on every stage's path. */
	g.overhead_s = (double)m * layers_max * prof->layer_overhead_s;
	g.pp_comm_s = pp > 1 ? 2.0 * (double)m * prof->p2p_latency_s : 0;
	g.bubble_fraction = (double)(pp - 1) / (double)(m + pp - 1);
	g.bubble_s = (g.compute_s + g.overhead_s + g.tp_comm_s + g.pp_comm_s) * (double)(pp - 1) /
		     (double)m * bubble_lost(prof, tp * pp * dp, tp * dp);
	g.dp_comm_s =
	    allreduce_s((double)grad_max, dp, dp_x ? prof->inter_node_bw : prof->intra_node_bw,
			prof->latency_s);
	g.tp_across_nodes = tp_x;
	g.dp_across_nodes = dp_x;
	double base =
	    g.compute_s + g.overhead_s + g.tp_comm_s + g.pp_comm_s + g.bubble_s + g.dp_comm_s;

	if (x->from_layout) {
		struct ptc_plan *plan = NULL;
		rc = ptc_plan_compute(x->from_layout, &l, NULL, 0, &plan, &e);
		if (rc == -ENOMEM)
			goto out;
		if (rc) {
			drop(r, PTC_SUGGEST_DROP_PLAN, "%s: no plan from %s: %s", name,
			     p->from_name, e.text);
			rc = 0;
			goto out;
		}
		/* Nodes move their bytes in parallel: the busiest node's link sets the time. */
		int64_t busiest = 0;
		for (int n = 0; n < plan->nnodes; n++) {
			const struct ptc_node_stats *ns = &plan->per_node[n];
			int64_t b = ns->bytes_in > ns->bytes_out ? ns->bytes_in : ns->bytes_out;
			if (b > busiest)
				busiest = b;
		}
		g.reconf_bytes = plan->bytes_network;
		g.reconf_total_s = busiest ? (double)busiest / prof->inter_node_bw : 0;
		g.reconf_s = g.reconf_total_s * base / prof->mean_time_between_changes_s;
		ptc_plan_free(plan);
		g.current = x->from->tp == tp && x->from->pp == pp && x->from->dp == dp &&
			    x->from->nnodes == x->cfg.nnodes;
		for (int i = 0; g.current && i < x->cfg.nnodes; i++)
			g.current = strcmp(x->from->nodes[i], x->cfg.nodes[i]) == 0;
	}
	g.step_s = base + g.reconf_s;
	r->fit[r->nfit++] = g;
out:
	ptc_layout_release(&l);
	return rc;
}

static int by_step(const void *a, const void *b)
{
	const struct ptc_suggestion *x = a, *y = b;

	if (x->step_s != y->step_s)
		return x->step_s < y->step_s ? -1 : 1;
	if (x->memory_bytes != y->memory_bytes)
		return x->memory_bytes < y->memory_bytes ? -1 : 1;
	if (x->tp != y->tp)
		return x->tp - y->tp;
	return x->pp != y->pp ? x->pp - y->pp : x->dp - y->dp;
}

/* The most common dimension of layer 0's tensors (of every tensor without
 * layers); ties go to the larger. 0 when there is none. */
static int64_t infer_hidden(const struct ptc_schema *s)
{
	int64_t best = 0, best_n = 0;
	int lo = 0, hi = s->ntensors;

	if (s->num_layers > 0)
		lo = s->layer_off[0], hi = s->layer_off[1];
	for (int j = lo; j < hi; j++) {
		const struct ptc_tensor *t = &s->tensors[s->num_layers > 0 ? s->by_layer[j] : j];
		for (int d = 0; d < t->ndim; d++) {
			int64_t v = t->shape[d], n = 0;
			for (int j2 = lo; j2 < hi; j2++) {
				const struct ptc_tensor *u =
				    &s->tensors[s->num_layers > 0 ? s->by_layer[j2] : j2];
				for (int d2 = 0; d2 < u->ndim; d2++)
					n += u->shape[d2] == v;
			}
			if (n > best_n || (n == best_n && v > best))
				best = v, best_n = n;
		}
	}
	return best;
}

/* hidden / the "unit" (a head's rows) of the first split of layer 0 with one
 * that divides hidden; 1 when there is none. */
static int64_t infer_heads(const struct ptc_schema *s, int64_t hidden)
{
	if (s->num_layers <= 0)
		return 1;
	for (int j = s->layer_off[0]; j < s->layer_off[1]; j++) {
		const struct ptc_tensor *t = &s->tensors[s->by_layer[j]];
		if (t->split_dim >= 0 && t->unit > 1 && hidden % t->unit == 0)
			return hidden / t->unit;
	}
	return 1;
}

/* Resolves the defaults of @in into @out; -EINVAL naming the flag. */
static int resolve_params(const struct ptc_suggest_params *in, const struct ptc_config *from,
			  const struct ptc_schema *s, struct ptc_suggest_result *r,
			  struct ptc_error *err)
{
	struct ptc_suggest_params *p = &r->params;
	static const struct {
		const char *flag;
		size_t off;
	} ints[] = {
	    {"--global-batch", offsetof(struct ptc_suggest_params, global_batch)},
	    {"--micro-batch", offsetof(struct ptc_suggest_params, micro_batch)},
	    {"--seq", offsetof(struct ptc_suggest_params, seq)},
	    {"--hidden", offsetof(struct ptc_suggest_params, hidden)},
	    {"--heads", offsetof(struct ptc_suggest_params, heads)},
	};
	const int64_t limit = (int64_t)1 << 40;

	*p = *in;
	if (!p->from_name)
		p->from_name = "--from";
	for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
		int64_t v = *(const int64_t *)((const char *)in + ints[k].off);
		if (v < 0 || v > limit)
			return ptc_errorf(err, "%s = %" PRId64 " is out of range [1, %" PRId64 "]",
					  ints[k].flag, v, limit);
	}
	if (!p->global_batch)
		p->global_batch = from && from->has_dataset ? from->dataset_global_batch : 512;
	if (!p->micro_batch)
		p->micro_batch = 1;
	if (!p->seq)
		p->seq = 2048;
	if (p->micro_batch > p->global_batch)
		return ptc_errorf(
		    err, "--micro-batch = %" PRId64 " exceeds the global batch of %" PRId64,
		    p->micro_batch, p->global_batch);
	if (!p->hidden) {
		r->hidden_inferred = true;
		if (!(p->hidden = infer_hidden(s)))
			return ptc_errorf(err,
					  "--hidden: the schema has no tensor to infer it from");
	}
	if (!p->heads) {
		r->heads_inferred = true;
		p->heads = infer_heads(s, p->hidden);
	}
	return 0;
}

void ptc_suggest_result_release(struct ptc_suggest_result *r)
{
	free(r->nodes);
	free(r->fit);
	memset(r, 0, sizeof(*r));
}

int ptc_suggest(const struct ptc_schema *schema, const struct ptc_cluster *cluster,
		const int *nodes, int nnodes, const struct ptc_config *from,
		const struct ptc_suggest_params *params, const struct ptc_suggest_profile *profile,
		struct ptc_suggest_result *out, struct ptc_error *err)
{
	struct ptc_suggest_result r = {.schema = schema, .cluster = cluster, .from = from};
	struct ctx x = {.s = schema, .cl = cluster, .from = from, .p = &r.params, .prof = profile};
	struct ptc_layout fl;
	bool have_fl = false;
	int rc = -ENOMEM;

	memset(out, 0, sizeof(*out));
	if ((rc = profile_check(profile, "profile", err)))
		return rc;
	r.profile = *profile;
	if ((rc = resolve_params(params, from, schema, &r, err)))
		return rc;
	rc = -ENOMEM;
	if (!nodes)
		nnodes = cluster->nnodes;
	if (nnodes < 1)
		return ptc_errorf(err, "--nodes: no node chosen");
	if (!(r.nodes = malloc((size_t)nnodes * sizeof(int))) ||
	    !(x.cfg.nodes = malloc((size_t)nnodes * sizeof(char *))))
		goto out;
	for (int i = 0; i < nnodes; i++) {
		int n = nodes ? nodes[i] : i;
		if (n < 0 || n >= cluster->nnodes) {
			rc = ptc_errorf(err, "--nodes: node index %d is not in the cluster", n);
			goto out;
		}
		for (int j = 0; j < i; j++)
			if (r.nodes[j] == n) {
				rc = ptc_errorf(err, "--nodes: node \"%s\" is listed twice",
						cluster->nodes[n].id);
				goto out;
			}
		r.nodes[i] = n;
		x.cfg.nodes[i] = cluster->nodes[n].id;
		r.devices += cluster->nodes[n].devices;
	}
	r.nnodes = nnodes;
	x.cfg.nnodes = nnodes;
	x.cfg.version = from ? from->version + 1 : 1;

	if (from) {
		struct ptc_error e = {.text = ""};
		int frc = ptc_layout_init(&fl, schema, from, cluster, r.params.from_name, &e);
		if (frc == -EINVAL) {
			rc = ptc_error_set(err, -EINVAL, "%s", e.text);
			goto out;
		}
		if (frc)
			goto out;
		have_fl = true;
		x.from_layout = &fl;
	}

	/* Parameters (a tied tensor is its target's), bytes per element over states. */
	if (!(x.state_bpe = calloc((size_t)schema->ntensors + 1, sizeof(int64_t))) ||
	    !(x.by_t_state = calloc((size_t)r.devices, sizeof(int64_t))) ||
	    !(x.by_t_grad = calloc((size_t)r.devices, sizeof(int64_t))))
		goto out;
	for (int i = 0; i < schema->ntensors; i++) {
		if (schema->tensors[i].tied < 0)
			r.params_count += ptc_tensor_elems(&schema->tensors[i]);
		for (int st = 0; st < schema->nstates; st++)
			x.state_bpe[i] += (int64_t)ptc_dtype_size(ptc_schema_dtype(schema, st, i));
	}

	/* Candidates: tp | devices, pp | devices / tp; at most d(devices)^2 of them. */
	int ncand = 0;
	for (int tp = 1; tp <= r.devices; tp++)
		if (r.devices % tp == 0)
			for (int pp = 1; pp <= r.devices / tp; pp++)
				ncand += (r.devices / tp) % pp == 0;
	if (!(r.fit = calloc((size_t)ncand, sizeof(*r.fit))))
		goto out;
	for (int tp = 1; tp <= r.devices; tp++) {
		if (r.devices % tp)
			continue;
		for (int pp = 1; pp <= r.devices / tp; pp++) {
			if ((r.devices / tp) % pp)
				continue;
			if ((rc = evaluate(&x, tp, pp, r.devices / tp / pp, &r)))
				goto out;
		}
	}
	qsort(r.fit, (size_t)r.nfit, sizeof(*r.fit), by_step);
	*out = r;
	r.nodes = NULL;
	r.fit = NULL;
	rc = 0;
out:
	if (have_fl)
		ptc_layout_release(&fl);
	free(x.cfg.nodes);
	free(x.state_bpe);
	free(x.by_t_state);
	free(x.by_t_grad);
	free(r.nodes);
	free(r.fit);
	return rc;
}

/* ----------------------------------------------------------------- JSON */

json_t *ptc_suggest_config_to_json(const struct ptc_suggest_result *r, int i)
{
	const struct ptc_suggestion *g = &r->fit[i];
	struct ptc_config c = {.replicas = 0};
	char **ids = malloc((size_t)r->nnodes * sizeof(char *));
	json_t *j;

	if (!ids)
		return NULL;
	if (r->from)
		c = *r->from;
	for (int n = 0; n < r->nnodes; n++)
		ids[n] = r->cluster->nodes[r->nodes[n]].id;
	c.version = r->from ? r->from->version + 1 : 1;
	c.tp = g->tp;
	c.pp = g->pp;
	c.dp = g->dp;
	c.nnodes = r->nnodes;
	c.nodes = ids;
	j = ptc_config_to_json(&c);
	free(ids);
	return j;
}

json_t *ptc_suggest_to_json(const struct ptc_suggest_result *r, int top)
{
	const struct ptc_suggest_params *p = &r->params;
	json_t *o = json_object(), *nodes = json_array(), *sugg = json_array(),
	       *dropped = json_object();
	int n = top > 0 && top < r->nfit ? top : r->nfit;

	if (!o || !nodes || !sugg || !dropped) {
		json_decref(o);
		json_decref(nodes);
		json_decref(sugg);
		json_decref(dropped);
		return NULL;
	}
	for (int i = 0; i < r->nnodes; i++)
		json_array_append_new(nodes, json_string(r->cluster->nodes[r->nodes[i]].id));
	json_object_set_new(o, "model", json_string(r->schema->model));
	json_object_set_new(o, "nodes", nodes);
	json_object_set_new(o, "devices", json_integer(r->devices));
	json_object_set_new(
	    o, "inputs",
	    json_pack("{sIsIsIsIsIsbsbsIsi}", "global_batch", (json_int_t)p->global_batch,
		      "micro_batch", (json_int_t)p->micro_batch, "seq", (json_int_t)p->seq,
		      "hidden", (json_int_t)p->hidden, "heads", (json_int_t)p->heads,
		      "hidden_inferred", r->hidden_inferred, "heads_inferred", r->heads_inferred,
		      "params", (json_int_t)r->params_count, "num_layers", r->schema->num_layers));
	json_object_set_new(o, "profile", ptc_suggest_profile_to_json(&r->profile));
	json_object_set_new(o, "from",
			    r->from
				? json_pack("{sIsisisi}", "version", (json_int_t)r->from->version,
					    "tp", r->from->tp, "pp", r->from->pp, "dp", r->from->dp)
				: json_null());
	json_object_set_new(o, "candidates", json_integer(r->ncandidates));
	json_object_set_new(o, "fit", json_integer(r->nfit));
	for (int i = 0; i < n; i++) {
		const struct ptc_suggestion *g = &r->fit[i];
		json_t *s = json_pack(
		    "{sisisisfsfsfsfsfsfsfsfsfsfsIsIs{sIsIsI}sIsbsbsb}", "tp", g->tp, "pp", g->pp,
		    "dp", g->dp, "step_s", g->step_s, "compute_s", g->compute_s, "overhead_s",
		    g->overhead_s, "tp_comm_s", g->tp_comm_s, "pp_comm_s", g->pp_comm_s, "bubble_s",
		    g->bubble_s, "dp_comm_s", g->dp_comm_s, "reconf_s", g->reconf_s,
		    "reconf_total_s", g->reconf_total_s, "bubble_fraction", g->bubble_fraction,
		    "micro_batches", (json_int_t)g->micro_batches, "memory_bytes",
		    (json_int_t)g->memory_bytes, "memory", "states", (json_int_t)g->state_bytes,
		    "gradients", (json_int_t)g->grad_bytes, "activations", (json_int_t)g->act_bytes,
		    "reconf_bytes", (json_int_t)g->reconf_bytes, "tp_across_nodes",
		    g->tp_across_nodes, "dp_across_nodes", g->dp_across_nodes, "current",
		    g->current);
		if (s)
			json_object_set_new(s, "config", ptc_suggest_config_to_json(r, i));
		json_array_append_new(sugg, s);
	}
	json_object_set_new(o, "suggestions", sugg);
	for (int d = 0; d < PTC_SUGGEST_DROP_COUNT; d++)
		if (r->ndropped[d])
			json_object_set_new(dropped, ptc_suggest_drop_name(d),
					    json_pack("{siss}", "count", r->ndropped[d], "first",
						      r->first_reason[d]));
	json_object_set_new(o, "dropped", dropped);
	return o;
}
