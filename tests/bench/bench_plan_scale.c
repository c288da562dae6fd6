/*
 * bench_plan_scale.c - the planner at scale (issue 21, item 5): per-node
 * (ptc_plan_compute_node, what each daemon computes) and whole-job
 * (ptc_plan_compute, `mlfs plan` without --node) plan time and peak memory,
 * against the floor of merely enumerating the node's own new partitions
 * (ranks x states x tensors it holds, each sliced), in the same run.
 *
 * Two series: GPT-3-size (`mlfs schema megatron-gpt --layers 96 --hidden
 * 12288 --heads 96 --vocab 51200 --tied`, 1,157 tensors x 3 states) at
 * 1,024 to 16,384 ranks, tp8 pp16 -> tp4 pp32 and tp8 pp16 -> tp8 pp8 at
 * the same device count; and the same generator with num_layers scaled to
 * 1,000 to 100,000 tensors at 512 ranks (tp8 pp16 dp4 -> tp4 pp32 dp4) and
 * at 32 ranks (tp4 pp4 dp2 -> tp2 pp8 dp2), where 100,000 fit the limit.
 * Then mixture of experts (issue 21, item 3): `mlfs schema moe` at
 * DeepSeek-V3's sizes (61 layers, hidden 7168, 128 heads, 8 KV heads, vocab
 * 129280, experts of 2048, one shared), 256 experts (31,662 tensors) and
 * 416 (51,182 tensors), at 256 to 1,024 ranks, tp and pp changes; there the
 * node planned is the one building the most partitions (`moe` as the only
 * argument runs these series alone).
 * 8 devices per node; the node planned is node 0. Each measurement runs in
 * a forked child so its peak RSS (ru_maxrss) is its own; "base" is the RSS
 * before planning (schema and layouts). A layout refused (the partition
 * limit) is reported with its reason. Growth exponents: the slope of log
 * time (and log peak memory above base) against log ranks or tensors,
 * between the smallest and largest case planned.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ptc/ptc.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double maxrss_mib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_maxrss / 1024.0;
}

static struct ptc_config *config(int tp, int pp, int dp, int nodes, int version)
{
	json_t *ids = json_array();
	char id[32];
	for (int i = 0; i < nodes; i++) {
		snprintf(id, sizeof(id), "n%d", i);
		json_array_append_new(ids, json_string(id));
	}
	json_t *j = json_pack("{sisisisiso}", "version", version, "tp", tp, "pp", pp, "dp", dp,
			      "nodes", ids);
	struct ptc_config *c;
	struct ptc_error err;
	if (ptc_config_parse(j, "bench", &c, &err)) {
		fprintf(stderr, "%s\n", err.text);
		exit(1);
	}
	json_decref(j);
	return c;
}

struct bcase {
	int layers;
	int a[3], b[3]; /* tp pp dp */
	int experts;	/* moe when > 0, else megatron-gpt */
};

/* What a child sends back. */
struct result {
	int ok;
	char why[PTC_ERROR_MAX];
	int ntensors, world, node;
	int64_t node_parts;
	double enum_s, node_s, job_s;
	double base_mib, node_mib, job_mib;
	size_t node_ops, job_ops;
};

/* The floor: node @node's new partitions enumerated and sliced. */
static double enumerate(const struct ptc_layout *l, int node, int64_t *parts)
{
	const struct ptc_schema *s = l->schema;
	struct ptc_slice sl;
	int64_t rows = 0;
	double t0 = now();
	*parts = 0;
	for (int r = l->node_first_rank[node]; r < l->node_first_rank[node] + l->node_nranks[node];
	     r++)
		for (int st = 0; st < s->nstates; st++)
			for (int t = 0; t < s->ntensors; t++)
				if (ptc_layout_holds(l, r, t)) {
					ptc_slice_compute(&s->tensors[t], l->tp, l->ranks[r].t,
							  &sl);
					++*parts;
					rows += sl.rows;
				}
	double dt = now() - t0;
	if (rows < 0)
		printf("?");
	return dt;
}

/* The node of @l whose ranks hold the most partitions (the lowest of equals):
 * per stage its tensors, then per node its ranks' stages. */
static int busiest_node(const struct ptc_layout *l)
{
	int *per_stage = calloc((size_t)l->pp, sizeof(int)), best = 0;
	int64_t most = -1;

	for (int p = 0; p < l->pp; p++)
		for (int t = 0; t < l->schema->ntensors; t++)
			per_stage[p] += ptc_layout_stage_holds(l, p, t);
	for (int n = 0; n < l->cluster->nnodes; n++) {
		int64_t held = 0;
		for (int r = l->node_first_rank[n];
		     r >= 0 && r < l->node_first_rank[n] + l->node_nranks[n]; r++)
			held += per_stage[l->ranks[r].p];
		if (held > most) {
			most = held;
			best = n;
		}
	}
	free(per_stage);
	return best;
}

static json_t *gen_schema(const struct bcase *bc, struct ptc_error *err)
{
	struct ptc_gen_args gpt = {.layers = bc->layers,
				   .hidden = 12288,
				   .heads = 96,
				   .vocab = 51200,
				   .tied = true,
				   .dtype = PTC_BFLOAT16};
	struct ptc_gen_args moe = {.layers = bc->layers,
				   .hidden = 7168,
				   .heads = 128,
				   .kv_heads = 8,
				   .vocab = 129280,
				   .dtype = PTC_BFLOAT16,
				   .experts = bc->experts,
				   .expert_ffn = 2048,
				   .shared_experts = 1};

	return bc->experts ? ptc_gen_moe(&moe, err) : ptc_gen_megatron_gpt(&gpt, err);
}

/* One measurement in this (child) process: @job selects the whole job's plan. */
static void measure(const struct bcase *bc, bool job, struct result *res)
{
	struct ptc_error err = {.text = ""};
	json_t *js = gen_schema(bc, &err);
	struct ptc_schema *s;
	memset(res, 0, sizeof(*res));
	res->world = bc->a[0] * bc->a[1] * bc->a[2];
	if (!js || ptc_schema_parse(js, "bench", &s, &err)) {
		snprintf(res->why, sizeof(res->why), "%s", err.text);
		return;
	}
	json_decref(js);
	res->ntensors = s->ntensors;
	int nodes = (res->world + 7) / 8;
	char **ids = malloc((size_t)nodes * sizeof(char *));
	for (int i = 0; i < nodes; i++) {
		ids[i] = malloc(16);
		snprintf(ids[i], 16, "n%d", i);
	}
	struct ptc_cluster *cl = ptc_cluster_new_uniform(nodes, ids, 8);
	struct ptc_config *ca = config(bc->a[0], bc->a[1], bc->a[2], nodes, 1);
	struct ptc_config *cb = config(bc->b[0], bc->b[1], bc->b[2], nodes, 2);
	struct ptc_layout la, lb;
	if (ptc_layout_init(&la, s, ca, cl, "a", &err) ||
	    ptc_layout_init(&lb, s, cb, cl, "b", &err)) {
		snprintf(res->why, sizeof(res->why), "%s", err.text);
		return;
	}
	res->node = bc->experts ? busiest_node(&lb) : 0;
	res->enum_s = enumerate(&lb, res->node, &res->node_parts);
	res->base_mib = maxrss_mib();
	struct ptc_plan *p = NULL;
	double best = 1e9;
	for (int i = 0; i < (job ? 1 : 3); i++) {
		ptc_plan_free(p);
		double t0 = now();
		int rc = job ? ptc_plan_compute(&la, &lb, NULL, 0, &p, &err)
			     : ptc_plan_compute_node(&la, &lb, NULL, 0, NULL, res->node, &p, &err);
		if (rc) {
			snprintf(res->why, sizeof(res->why), "%s", err.text);
			return;
		}
		double dt = now() - t0;
		best = dt < best ? dt : best;
	}
	if (job) {
		res->job_s = best;
		res->job_ops = p->nops;
		res->job_mib = maxrss_mib();
	} else {
		res->node_s = best;
		res->node_ops = p->nops;
		res->node_mib = maxrss_mib();
	}
	res->ok = 1;
}

/* Runs measure() in a child; its result through a pipe. */
static void forked(const struct bcase *bc, bool job, struct result *res)
{
	int fd[2];
	memset(res, 0, sizeof(*res));
	if (pipe(fd)) {
		perror("pipe");
		exit(1);
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		close(fd[0]);
		struct result r;
		measure(bc, job, &r);
		if (write(fd[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
			_exit(1);
		_exit(0);
	}
	close(fd[1]);
	if (read(fd[0], res, sizeof(*res)) != (ssize_t)sizeof(*res))
		snprintf(res->why, sizeof(res->why), "the child died");
	close(fd[0]);
	waitpid(pid, NULL, 0);
}

/* Slope of log y against log x between two points. */
static double expo(double x0, double y0, double x1, double y1)
{
	return y0 > 0 && y1 > 0 && x1 > x0 ? log(y1 / y0) / log(x1 / x0) : NAN;
}

/* One series: rows, then exponents of node time, node memory above base,
 * job time, floor time, against @x (0: ranks, 1: tensors). */
static void series(const char *title, const struct bcase *cs, int n, int x, bool job)
{
	struct result first = {0}, last = {0};
	printf("\n%s\n\n", title);
	printf("| ranks | tensors | change | node | node partitions | enumerate s | node plan s | "
	       "node ops | node peak MiB (base) | x enumerate | job plan s | job ops | job peak "
	       "MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n; i++) {
		struct result rn, rj = {0};
		const struct bcase *bc = &cs[i];
		forked(bc, false, &rn);
		if (rn.ok && job)
			forked(bc, true, &rj);
		printf("| %5d | %6d | tp%d pp%d dp%d -> tp%d pp%d dp%d | ", rn.world, rn.ntensors,
		       bc->a[0], bc->a[1], bc->a[2], bc->b[0], bc->b[1], bc->b[2]);
		if (!rn.ok) {
			printf("| refused: %s |||||||||\n", rn.why);
			continue;
		}
		printf("n%d | ", rn.node);
		printf("%7" PRId64 " | %.4f | %.4f | %6zu | %6.1f (%5.1f) | %5.1f | ",
		       rn.node_parts, rn.enum_s, rn.node_s, rn.node_ops, rn.node_mib, rn.base_mib,
		       rn.node_s / rn.enum_s);
		if (rj.ok)
			printf("%.3f | %8zu | %6.1f |\n", rj.job_s, rj.job_ops, rj.job_mib);
		else
			printf("%s |||\n", job ? rj.why : "-");
		rn.job_s = rj.job_s;
		if (!first.ok)
			first = rn;
		last = rn;
	}
	if (first.ok && last.ok &&
	    (x ? last.ntensors > first.ntensors : last.world > first.world)) {
		double x0 = x ? first.ntensors : first.world, x1 = x ? last.ntensors : last.world;
		printf("\ngrowth exponents (%s %.0f -> %.0f): node plan time %.2f, node peak "
		       "memory above base %.2f, enumerate %.2f, job plan time %.2f\n",
		       x ? "tensors" : "ranks", x0, x1, expo(x0, first.node_s, x1, last.node_s),
		       expo(x0, first.node_mib - first.base_mib, x1, last.node_mib - last.base_mib),
		       expo(x0, first.enum_s, x1, last.enum_s),
		       expo(x0, first.job_s, x1, last.job_s));
	}
}

/* DeepSeek-V3-size mixture of experts (gen_schema): 61 layers. */
static void moe_series(void)
{
	/* 416 experts: 61 x (5 + 832 + 2) + 3 = 51,182 tensors */
	static const struct bcase tpc[] = {
	    {61, {8, 16, 2}, {4, 16, 4}, 416},
	    {61, {8, 16, 4}, {4, 16, 8}, 416},
	    {61, {8, 16, 8}, {4, 16, 16}, 416},
	};
	static const struct bcase ppc[] = {
	    {61, {8, 16, 2}, {8, 8, 4}, 416},
	    {61, {8, 16, 4}, {8, 8, 8}, 416},
	    {61, {8, 16, 8}, {8, 8, 16}, 416},
	    {61, {8, 16, 8}, {4, 32, 8}, 416},
	};
	/* 256 experts, DeepSeek-V3's: 31,662 tensors */
	static const struct bcase v3[] = {
	    {61, {8, 16, 2}, {4, 16, 4}, 256},
	    {61, {8, 16, 8}, {4, 16, 16}, 256},
	    {61, {8, 16, 8}, {8, 8, 16}, 256},
	};
	printf("\nmixture of experts: `mlfs schema moe --layers 61 --hidden 7168 --heads 128 "
	       "--kv-heads 8 --vocab 129280 --experts E --expert-ffn 2048 --shared-experts 1`, "
	       "3 states, 8 devices per node; the plan of the node building the most "
	       "partitions\n");
	series("moe, 416 experts (51,182 tensors), tp change", tpc, 3, 0, true);
	series("moe, 416 experts (51,182 tensors), pp change", ppc, 4, 0, true);
	series("moe, 256 experts (31,662 tensors, DeepSeek-V3's)", v3, 3, 0, true);
}

int main(int argc, char **argv)
{
	static const struct bcase tpc[] = {
	    {96, {8, 16, 8}, {4, 32, 8}, 0},	 {96, {8, 16, 16}, {4, 32, 16}, 0},
	    {96, {8, 16, 32}, {4, 32, 32}, 0},	 {96, {8, 16, 64}, {4, 32, 64}, 0},
	    {96, {8, 16, 128}, {4, 32, 128}, 0},
	};
	static const struct bcase ppc[] = {
	    {96, {8, 16, 8}, {8, 8, 16}, 0},	{96, {8, 16, 16}, {8, 8, 32}, 0},
	    {96, {8, 16, 32}, {8, 8, 64}, 0},	{96, {8, 16, 64}, {8, 8, 128}, 0},
	    {96, {8, 16, 128}, {8, 8, 256}, 0},
	};
	/* megatron-gpt: 12 tensors per layer and 5 others. */
	static const struct bcase tens[] = {
	    {83, {8, 16, 4}, {4, 32, 4}, 0},   {416, {8, 16, 4}, {4, 32, 4}, 0},
	    {833, {8, 16, 4}, {4, 32, 4}, 0},  {4166, {8, 16, 4}, {4, 32, 4}, 0},
	    {8333, {8, 16, 4}, {4, 32, 4}, 0},
	};
	/* 32 ranks, so that 100,000 tensors stay inside the partition limit. */
	static const struct bcase tens32[] = {
	    {83, {4, 4, 2}, {2, 8, 2}, 0},
	    {833, {4, 4, 2}, {2, 8, 2}, 0},
	    {4166, {4, 4, 2}, {2, 8, 2}, 0},
	    {8333, {4, 4, 2}, {2, 8, 2}, 0},
	};
	if (argc > 1 && strcmp(argv[1], "moe") == 0) {
		moe_series();
		return 0;
	}
	printf("the planner at scale: megatron-gpt (hidden 12288, heads 96, vocab 51200, tied), "
	       "3 states, 8 devices per node; node 0's plan\n");
	series("GPT-3-size (96 layers), tp change", tpc, 5, 0, true);
	series("GPT-3-size (96 layers), pp/dp change", ppc, 5, 0, true);
	series("tensors scaled (num_layers), 512 ranks", tens, 5, 1, true);
	series("tensors scaled (num_layers), 32 ranks", tens32, 4, 1, true);
	moe_series();
	return 0;
}
