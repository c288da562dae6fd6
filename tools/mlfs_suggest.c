/*
 * mlfs_suggest.c - `mlfs suggest`: the fastest layouts for a set of nodes,
 * by ptc_suggest's cost model, without a daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc.h"
#include "tools/tools.h"

/* Human-readable byte count. */
static const char *bytes_str(double b, char *buf, size_t n)
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int u = 0;

	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%.0f B", b);
	else
		snprintf(buf, n, "%.1f %s", b, units[u]);
	return buf;
}

/* Human-readable seconds: s, ms or us. */
static const char *secs_str(double s, char *buf, size_t n)
{
	if (s == 0)
		snprintf(buf, n, "0");
	else if (s >= 1)
		snprintf(buf, n, "%.3g s", s);
	else if (s >= 1e-3)
		snprintf(buf, n, "%.3g ms", s * 1e3);
	else if (s >= 1e-6)
		snprintf(buf, n, "%.3g us", s * 1e6);
	else
		snprintf(buf, n, "%.3g ns", s * 1e9);
	return buf;
}

/* A count flag's value: 1 to 2^40, else a message naming @flag and -1. */
static int parse_count(const char *flag, const char *arg, int64_t *out)
{
	char *end = NULL;
	errno = 0;
	long long v = strtoll(arg, &end, 10);

	if (*arg == '\0' || *end != '\0' || errno || v < 1 || v > ((long long)1 << 40)) {
		fprintf(stderr, "mlfs suggest: %s \"%s\" is not a positive integer\n", flag, arg);
		return -1;
	}
	*out = v;
	return 0;
}

static void print_text(const struct ptc_suggest_result *r, int top)
{
	const struct ptc_suggest_params *p = &r->params;
	char b[10][32];
	int n = top < r->nfit ? top : r->nfit;

	printf("suggest \"%s\" on %d node%s (", r->schema->model, r->nnodes,
	       r->nnodes == 1 ? "" : "s");
	for (int i = 0; i < r->nnodes; i++) {
		if (i == 6 && r->nnodes > 8) { /* the first six, "...", the last */
			printf(", ...");
			i = r->nnodes - 1;
		}
		printf("%s%s", i ? ", " : "", r->cluster->nodes[r->nodes[i]].id);
	}
	printf("), %d devices: %d layouts, %d fit\n", r->devices, r->ncandidates, r->nfit);
	double pc = (double)r->params_count;
	printf("model: %.4g %s parameters, %d layers, hidden %" PRId64 "%s, heads %" PRId64
	       "%s; global batch %" PRId64 ", micro-batch %" PRId64 ", seq %" PRId64 "\n",
	       pc >= 1e9 ? pc / 1e9 : pc / 1e6, pc >= 1e9 ? "B" : "M", r->schema->num_layers,
	       p->hidden, r->hidden_inferred ? " (inferred)" : "", p->heads,
	       r->heads_inferred ? " (inferred)" : "", p->global_batch, p->micro_batch, p->seq);
	if (r->from)
		printf("from: v%" PRId64 " tp%d pp%d dp%d (reconfiguration amortized over %g s)\n",
		       r->from->version, r->from->tp, r->from->pp, r->from->dp,
		       r->profile.mean_time_between_changes_s);
	printf("\n");
	if (n > 0) {
		printf("%3s %-15s %10s %10s %10s %10s %10s %10s %10s %10s %11s %7s %12s\n", "#",
		       "layout", "step", "compute", "overhead", "tp comm", "pp comm", "bubble",
		       "dp comm", "reconf", "memory/dev", "bubble%", "reconf bytes");
		for (int i = 0; i < n; i++) {
			const struct ptc_suggestion *g = &r->fit[i];
			char lay[32];
			snprintf(lay, sizeof(lay), "tp%d pp%d dp%d%s", g->tp, g->pp, g->dp,
				 g->current ? "*" : "");
			printf("%3d %-15s %10s %10s %10s %10s %10s %10s %10s %10s %11s %6.1f%% "
			       "%12s\n",
			       i + 1, lay, secs_str(g->step_s, b[0], 32),
			       secs_str(g->compute_s, b[1], 32), secs_str(g->overhead_s, b[8], 32),
			       secs_str(g->tp_comm_s, b[2], 32), secs_str(g->pp_comm_s, b[9], 32),
			       secs_str(g->bubble_s, b[3], 32), secs_str(g->dp_comm_s, b[4], 32),
			       secs_str(g->reconf_s, b[5], 32),
			       bytes_str((double)g->memory_bytes, b[6], 32),
			       100 * g->bubble_fraction,
			       bytes_str((double)g->reconf_bytes, b[7], 32));
		}
		if (r->from)
			for (int i = 0; i < r->nfit; i++)
				if (r->fit[i].current) {
					printf("* the current layout (rank %d of %d)\n", i + 1,
					       r->nfit);
					break;
				}
	} else {
		printf("no layout fits\n");
	}
	int dropped = 0;
	for (int d = 0; d < PTC_SUGGEST_DROP_COUNT; d++)
		dropped += r->ndropped[d];
	printf("\ndropped: %d\n", dropped);
	static const char *const what[] = {"invalid for the schema", "batch not divisible",
					   "TP group across nodes", "does not fit memory",
					   "no plan from --from"};
	for (int d = 0; d < PTC_SUGGEST_DROP_COUNT; d++)
		if (r->ndropped[d])
			printf("  %-22s %3d  first: %s\n", what[d], r->ndropped[d],
			       r->first_reason[d]);
}

int cmd_suggest(int argc, char **argv)
{
	static const struct option opts[] = {{"schema", required_argument, NULL, 's'},
					     {"cluster", required_argument, NULL, 'c'},
					     {"nodes", required_argument, NULL, 'n'},
					     {"from", required_argument, NULL, 'f'},
					     {"global-batch", required_argument, NULL, 'B'},
					     {"micro-batch", required_argument, NULL, 'M'},
					     {"seq", required_argument, NULL, 'L'},
					     {"hidden", required_argument, NULL, 'H'},
					     {"heads", required_argument, NULL, 'A'},
					     {"profile", required_argument, NULL, 'p'},
					     {"top", required_argument, NULL, 'k'},
					     {"json", no_argument, NULL, 'j'},
					     {NULL, 0, NULL, 0}};
	const char *schema_path = NULL, *cluster_path = NULL, *from_path = NULL,
		   *profile_path = NULL;
	char *nodelist = NULL;
	struct ptc_suggest_params params = {0};
	int64_t top = 5;
	bool json = false;
	int c, rc = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 's':
			schema_path = optarg;
			break;
		case 'c':
			cluster_path = optarg;
			break;
		case 'n':
			nodelist = optarg;
			break;
		case 'f':
			from_path = optarg;
			break;
		case 'p':
			profile_path = optarg;
			break;
		case 'B':
			bad = parse_count("--global-batch", optarg, &params.global_batch);
			break;
		case 'M':
			bad = parse_count("--micro-batch", optarg, &params.micro_batch);
			break;
		case 'L':
			bad = parse_count("--seq", optarg, &params.seq);
			break;
		case 'H':
			bad = parse_count("--hidden", optarg, &params.hidden);
			break;
		case 'A':
			bad = parse_count("--heads", optarg, &params.heads);
			break;
		case 'k':
			bad = parse_count("--top", optarg, &top);
			break;
		case 'j':
			json = true;
			break;
		default:
			return 2;
		}
		if (bad)
			return 2;
	}
	if (!schema_path || !cluster_path || optind != argc) {
		fprintf(
		    stderr,
		    "usage: mlfs suggest --schema S --cluster C [--nodes ID,...] [--from CONFIG]\n"
		    "                    [--global-batch B] [--micro-batch M] [--seq L]\n"
		    "                    [--hidden H] [--heads A] [--profile P.json] [--top K] "
		    "[--json]\n");
		return 2;
	}

	struct ptc_schema *schema = NULL;
	struct ptc_cluster *cluster = NULL;
	struct ptc_config *from = NULL;
	struct ptc_suggest_profile prof;
	struct ptc_suggest_result res = {0};
	struct ptc_error err = {.text = ""};
	int *nodes = NULL, nnodes = 0;

	ptc_suggest_profile_default(&prof);
	if (TOOLS_LOAD(schema_path, ptc_schema_parse_text, &schema) ||
	    TOOLS_LOAD(cluster_path, ptc_cluster_parse_text, &cluster) ||
	    (from_path && TOOLS_LOAD(from_path, ptc_config_parse_text, &from)) ||
	    (profile_path && TOOLS_LOAD(profile_path, ptc_suggest_profile_parse_text, &prof)))
		goto out;
	if (nodelist) {
		if (!(nodes = calloc((size_t)cluster->nnodes + strlen(nodelist) + 1, sizeof(int))))
			goto out;
		for (char *tok = strtok(nodelist, ","); tok; tok = strtok(NULL, ",")) {
			int n = ptc_cluster_find(cluster, tok);
			if (n < 0) {
				fprintf(stderr,
					"mlfs suggest: --nodes: node \"%s\" is not in the cluster "
					"%s\n",
					tok, cluster_path);
				goto out;
			}
			nodes[nnodes++] = n;
		}
		if (nnodes == 0) {
			fprintf(stderr, "mlfs suggest: --nodes: no node given\n");
			goto out;
		}
	}
	params.from_name = from_path;
	int src = ptc_suggest(schema, cluster, nodes, nnodes, from, &params, &prof, &res, &err);
	if (src) {
		fprintf(stderr, "mlfs suggest: %s\n", src == -ENOMEM ? "out of memory" : err.text);
		goto out;
	}
	if (json) {
		json_t *j = ptc_suggest_to_json(&res, (int)(top < 1 << 30 ? top : 1 << 30));
		if (!j || json_dumpf(j, stdout, JSON_INDENT(1)) != 0 || printf("\n") < 0) {
			json_decref(j);
			fprintf(stderr, "mlfs suggest: cannot write JSON\n");
			goto out;
		}
		json_decref(j);
	} else {
		print_text(&res, (int)(top < 1 << 30 ? top : 1 << 30));
	}
	rc = 0;
out:
	ptc_suggest_result_release(&res);
	free(nodes);
	ptc_config_free(from);
	ptc_cluster_free(cluster);
	ptc_schema_free(schema);
	return rc;
}
