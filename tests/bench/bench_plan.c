/*
 * bench_plan.c - plan time and peak memory for a 96-layer GPT-style schema.
 *
 * Each case runs in a forked child so its peak RSS (ru_maxrss) is its own.
 * Reported: best-of-N plan time, operations, partitions of the new layout,
 * peak RSS, and time per new partition, to show growth with ranks and with
 * tensors. Reference in the same run: the time to merely enumerate and slice
 * every new partition (ptc_slice_compute), the floor any planner pays.
 *
 * Checked, since BENCHMARKS.md claims it: every plan's network bytes equal
 * the lower bound (missing logical bytes per node). A plan above it (or
 * below, which would mean the bound is wrong) is named on stderr, the other
 * cases still run, and the exit status is 1, as it is when a case fails.
 */
#include <inttypes.h>
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

static struct ptc_config *config(int tp, int pp, int dp, int nodes)
{
	json_t *ids = json_array();
	char id[32];
	for (int i = 0; i < nodes; i++) {
		snprintf(id, sizeof(id), "n%d", i);
		json_array_append_new(ids, json_string(id));
	}
	json_t *j =
	    json_pack("{sisisisiso}", "version", 1, "tp", tp, "pp", pp, "dp", dp, "nodes", ids);
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
};

/* Exit status of a case whose network bytes are not the lower bound. */
#define EXIT_NOT_LOWER_BOUND 3

/* Runs one case and prints its row: 0, or EXIT_NOT_LOWER_BOUND with a
 * message on stderr. */
static int run(const struct bcase *bc)
{
	struct ptc_gen_args ga = {.layers = bc->layers,
				  .hidden = 12288,
				  .heads = 96,
				  .vocab = 51200,
				  .tied = true,
				  .dtype = PTC_BFLOAT16};
	struct ptc_error err;
	json_t *js = ptc_gen_megatron_gpt(&ga, &err);
	struct ptc_schema *s;
	if (!js || ptc_schema_parse(js, "bench", &s, &err)) {
		fprintf(stderr, "%s\n", err.text);
		exit(1);
	}
	json_decref(js);
	int world = bc->a[0] * bc->a[1] * bc->a[2], nodes = (world + 7) / 8;
	char **ids = malloc((size_t)nodes * sizeof(char *));
	for (int i = 0; i < nodes; i++) {
		ids[i] = malloc(16);
		snprintf(ids[i], 16, "n%d", i);
	}
	struct ptc_cluster *cl = ptc_cluster_new_uniform(nodes, ids, 8);
	struct ptc_config *ca = config(bc->a[0], bc->a[1], bc->a[2], nodes);
	struct ptc_config *cb = config(bc->b[0], bc->b[1], bc->b[2], nodes);
	cb->version = 2;
	struct ptc_layout la, lb;
	if (ptc_layout_init(&la, s, ca, cl, "a", &err) ||
	    ptc_layout_init(&lb, s, cb, cl, "b", &err)) {
		fprintf(stderr, "%s\n", err.text);
		exit(1);
	}

	/* Reference: enumerate and slice every new partition. */
	double t0 = now();
	int64_t parts = 0, rows = 0;
	struct ptc_slice sl;
	for (int r = 0; r < lb.world; r++)
		for (int t = 0; t < s->ntensors; t++)
			if (ptc_layout_holds(&lb, r, t)) {
				ptc_slice_compute(&s->tensors[t], lb.tp, lb.ranks[r].t, &sl);
				parts += s->nstates;
				rows += sl.rows;
			}
	double enum_s = now() - t0;

	double best = 1e9;
	struct ptc_plan *p = NULL;
	for (int i = 0; i < 3; i++) {
		ptc_plan_free(p);
		t0 = now();
		if (ptc_plan_compute(&la, &lb, NULL, 0, &p, &err)) {
			fprintf(stderr, "%s\n", err.text);
			exit(1);
		}
		double dt = now() - t0;
		best = dt < best ? dt : best;
	}
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("| %5d | %4d | tp%d pp%d dp%d -> tp%d pp%d dp%d | %9" PRId64
	       " | %9zu | %8.3f | %6.0f | %7.1f | %5.1f | %s |\n",
	       world, s->ntensors, bc->a[0], bc->a[1], bc->a[2], bc->b[0], bc->b[1], bc->b[2],
	       parts, p->nops, best, best / (double)parts * 1e9, (double)ru.ru_maxrss / 1024.0,
	       best / enum_s, p->bytes_network == p->lower_bound_network ? "yes" : "NO");
	fflush(stdout);
	(void)rows;
	if (p->bytes_network != p->lower_bound_network) {
		fprintf(stderr,
			"bench_plan: tp%d pp%d dp%d -> tp%d pp%d dp%d: network bytes %" PRId64
			" %s the lower bound %" PRId64 "\n",
			bc->a[0], bc->a[1], bc->a[2], bc->b[0], bc->b[1], bc->b[2],
			p->bytes_network,
			p->bytes_network > p->lower_bound_network ? "exceed" : "are below",
			p->lower_bound_network);
		return EXIT_NOT_LOWER_BOUND;
	}
	return 0;
}

int main(void)
{
	static const struct bcase cases[] = {
	    {96, {8, 4, 2}, {4, 8, 2}},	    {96, {8, 16, 4}, {4, 32, 4}},
	    {96, {8, 16, 16}, {4, 32, 16}}, {96, {8, 16, 16}, {8, 8, 32}},
	    {24, {8, 16, 4}, {4, 8, 16}},   {48, {8, 16, 4}, {4, 8, 16}},
	    {96, {8, 16, 4}, {4, 8, 16}},
	};
	printf("plan time, 96-layer GPT-3-style schema (hidden 12288, vocab 51200, tied), "
	       "3 states, 8 devices per node\n\n");
	printf("| ranks | tensors | change | new partitions | operations | plan s | ns/partition | "
	       "peak RSS MiB | x enumerate | net = lower bound |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	size_t n = sizeof(cases) / sizeof(cases[0]), off_bound = 0, failed = 0;
	for (size_t i = 0; i < n; i++) {
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0) {
			perror("bench_plan: fork");
			return 1;
		}
		if (pid == 0)
			_exit(run(&cases[i]));
		int st;
		if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
			failed++;
		else if (WEXITSTATUS(st) == EXIT_NOT_LOWER_BOUND)
			off_bound++;
		else if (WEXITSTATUS(st))
			failed++;
	}
	if (off_bound)
		fprintf(stderr,
			"bench_plan: %zu of %zu plans move more or fewer network bytes than the "
			"lower bound (BENCHMARKS.md says every plan equals it)\n",
			off_bound, n);
	if (failed)
		fprintf(stderr, "bench_plan: %zu of %zu cases failed\n", failed, n);
	return off_bound || failed ? 1 : 0;
}
