/*
 * mlfs_plan.c - `mlfs plan` and `mlfs schema`: the planner without a daemon;
 * and the file helpers of tools.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptc/ptc.h"
#include "tools/tools.h"

int tools_create_tmp(const char *dst, char *tmp, size_t cap)
{
	const char *slash = strrchr(dst, '/'), *base = slash ? slash + 1 : dst;
	int fd, err;
	mode_t mask;

	/* At most 240 bytes of the name keep the temporary's within NAME_MAX. */
	if ((size_t)snprintf(tmp, cap, "%.*s.%.240s.XXXXXX", (int)(base - dst), dst, base) >= cap) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
		return -1;
	mask = umask(0); /* read it: the command line has no other thread */
	umask(mask);
	if (fchmod(fd, 0644 & ~mask)) {
		err = errno;
		close(fd);
		unlink(tmp);
		errno = err;
		return -1;
	}
	return fd;
}

char *tools_read_stream(FILE *f, const char *path, size_t *len)
{
	char *buf = NULL;
	size_t cap = 0, n = 0;

	for (;;) {
		if (n + 4096 + 1 > cap) {
			cap = cap ? cap * 2 : 65536;
			char *p = realloc(buf, cap);
			if (!p) {
				fprintf(stderr, "mlfs: %s: out of memory\n", path);
				free(buf);
				return NULL;
			}
			buf = p;
		}
		size_t got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		fprintf(stderr, "mlfs: %s: read error\n", path);
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	*len = n;
	return buf;
}

char *tools_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");

	if (!f) {
		fprintf(stderr, "mlfs: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	char *buf = tools_read_stream(f, path, len);
	fclose(f);
	return buf;
}

/* Human-readable byte count. */
static const char *human(int64_t b, char *buf, size_t n)
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%" PRId64 " B", b);
	else
		snprintf(buf, n, "%.1f %s", v, units[u]);
	return buf;
}

struct plan_inputs {
	struct ptc_schema *schema;
	struct ptc_config *from, *to;
	struct ptc_cluster *cluster;
};

static void inputs_release(struct plan_inputs *in)
{
	ptc_schema_free(in->schema);
	ptc_config_free(in->from);
	ptc_config_free(in->to);
	ptc_cluster_free(in->cluster);
}

/* A cluster of every node the two configs name, 8 devices each. */
static struct ptc_cluster *default_cluster(const struct ptc_config *a, const struct ptc_config *b)
{
	char **ids = calloc((size_t)(a->nnodes + b->nnodes), sizeof(char *));
	int n = 0;

	if (!ids)
		return NULL;
	for (int k = 0; k < 2; k++) {
		const struct ptc_config *c = k ? b : a;
		for (int i = 0; i < c->nnodes; i++) {
			int j = 0;
			while (j < n && strcmp(ids[j], c->nodes[i]) != 0)
				j++;
			if (j == n)
				ids[n++] = c->nodes[i];
		}
	}
	struct ptc_cluster *cl = ptc_cluster_new_uniform(n, ids, 8);
	fprintf(stderr, "mlfs plan: no --cluster given: assuming 8 devices on each of");
	for (int i = 0; i < n; i++)
		fprintf(stderr, "%s %s", i ? "," : "", ids[i]);
	fprintf(stderr, "\n");
	free(ids);
	return cl;
}

static int load_inputs(struct plan_inputs *in, const char *schema, const char *from, const char *to,
		       const char *cluster)
{
	if (TOOLS_LOAD(schema, ptc_schema_parse_text, &in->schema) ||
	    TOOLS_LOAD(from, ptc_config_parse_text, &in->from) ||
	    TOOLS_LOAD(to, ptc_config_parse_text, &in->to))
		return -1;
	if (cluster)
		return TOOLS_LOAD(cluster, ptc_cluster_parse_text, &in->cluster);
	in->cluster = default_cluster(in->from, in->to);
	return in->cluster ? 0 : -1;
}

/* Parses "--down a,b" into cluster node indices. */
static int parse_down(const struct ptc_cluster *cl, char *list, int *down, int *ndown)
{
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		int n = ptc_cluster_find(cl, tok);
		if (n < 0) {
			fprintf(stderr, "mlfs plan: --down: node \"%s\" is not in the cluster\n",
				tok);
			return -1;
		}
		down[(*ndown)++] = n;
	}
	return 0;
}

/* @node: the plan is that node's part (ptc_plan_compute_node), or -1. */
static void print_summary(const struct ptc_plan *p, const struct ptc_layout *a,
			  const struct ptc_layout *b, int node)
{
	const struct ptc_schema *s = a->schema;
	size_t kinds[5] = {0}, nbackup = 0;
	int64_t backup_bytes = 0;
	char h[6][32];

	printf("plan v%" PRId64 " -> v%" PRId64 ": tp%d pp%d dp%d -> tp%d pp%d dp%d\n",
	       a->config->version, b->config->version, a->tp, a->pp, a->dp, b->tp, b->pp, b->dp);
	printf("schema \"%s\": %d tensors x %d states\n", s->model, s->ntensors, s->nstates);
	if (node >= 0)
		printf("node \"%s\" alone: what it builds, and serves to every node; other "
		       "nodes: what they serve it\n",
		       a->cluster->nodes[node].id);
	printf("\n");
	printf("%-12s %12s %12s %12s %12s %12s %12s\n", "node", "total", "reused", "local",
	       "fetched", "served", "zero");
	for (int n = 0; n < p->nnodes; n++) {
		const struct ptc_node_stats *st = &p->per_node[n];
		if (!st->bytes_total && !st->bytes_out)
			continue;
		printf("%-12s %12s %12s %12s %12s %12s %12s\n", a->cluster->nodes[n].id,
		       human(st->bytes_total, h[0], 32), human(st->bytes_reused, h[1], 32),
		       human(st->bytes_local, h[2], 32), human(st->bytes_in, h[3], 32),
		       human(st->bytes_out, h[4], 32), human(st->bytes_zero, h[5], 32));
	}
	if (node < 0)
		printf("%-12s %12s %12s %12s %12s %12s %12s\n", "all",
		       human(p->bytes_total, h[0], 32), human(p->bytes_reused, h[1], 32),
		       human(p->bytes_local, h[2], 32), human(p->bytes_network, h[3], 32),
		       human(p->bytes_network, h[4], 32), human(p->bytes_zero, h[5], 32));
	printf("\n");
	for (size_t i = 0; i < p->nops; i++) {
		kinds[p->ops[i].kind]++;
		if (p->ops[i].backup) {
			nbackup++;
			backup_bytes += p->ops[i].bytes;
		}
	}
	printf("network: %" PRId64 " bytes; lower bound %" PRId64 " bytes\n", p->bytes_network,
	       p->lower_bound_network);
	printf("operations: %zu (reuse %zu, copy %zu, fetch %zu, dup %zu, zero %zu)\n", p->nops,
	       kinds[PTC_OP_REUSE], kinds[PTC_OP_COPY], kinds[PTC_OP_FETCH], kinds[PTC_OP_DUP],
	       kinds[PTC_OP_ZERO]);
	if (nbackup)
		printf("from backups: %zu fetches, %" PRId64 " bytes (held only by down nodes)\n",
		       nbackup, backup_bytes);
}

/* The plan as ptc_plan_to_json's object, its operations written one at a
 * time (a whole job's plan at 16,384 ranks has tens of millions: as one
 * JSON tree it would take many GiB). 0 or -1. */
static int print_json(const struct ptc_plan *plan, const struct ptc_layout *la,
		      const struct ptc_layout *lb, const char *node)
{
	json_t *j = ptc_plan_to_json(plan, la, lb, false);
	if (j && node) /* per_node of the others: what they serve it */
		json_object_set_new(j, "node", json_string(node));
	char *head = j ? json_dumps(j, JSON_INDENT(1) | JSON_COMPACT) : NULL;
	json_decref(j);
	if (!head)
		return -1;
	head[strlen(head) - 1] = '\0'; /* the object goes on: its "}" last */
	int rc = fputs(head, stdout) < 0 || fputs(",\n \"operations\":[", stdout) < 0 ? -1 : 0;
	free(head);
	for (size_t i = 0; rc == 0 && i < plan->nops; i++) {
		json_t *op = ptc_plan_op_to_json(plan, i, lb);
		if (!op || (i && fputs(",", stdout) < 0) || fputs("\n  ", stdout) < 0 ||
		    json_dumpf(op, stdout, JSON_COMPACT) != 0)
			rc = -1;
		json_decref(op);
	}
	if (rc == 0 && printf("\n ]\n}\n") < 0)
		rc = -1;
	return rc;
}

int cmd_plan(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"schema", required_argument, NULL, 's'}, {"from", required_argument, NULL, 'f'},
	    {"to", required_argument, NULL, 't'},     {"cluster", required_argument, NULL, 'c'},
	    {"down", required_argument, NULL, 'd'},   {"json", no_argument, NULL, 'j'},
	    {"node", required_argument, NULL, 'n'},   {NULL, 0, NULL, 0}};
	const char *schema = NULL, *from = NULL, *to = NULL, *cluster = NULL, *nodeid = NULL;
	char *downlist = NULL;
	bool json = false;
	int c, rc = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			schema = optarg;
			break;
		case 'f':
			from = optarg;
			break;
		case 't':
			to = optarg;
			break;
		case 'c':
			cluster = optarg;
			break;
		case 'd':
			downlist = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'n':
			nodeid = optarg;
			break;
		default:
			return 2;
		}
	}
	if (!schema || !from || !to || optind != argc) {
		fprintf(stderr,
			"usage: mlfs plan --schema S --from A.json --to B.json "
			"[--cluster C] [--down ID,...] [--node ID] [--json]\n"
			"  --down ID,...  nodes that cannot serve; when A.json has\n"
			"                 \"replicas\": 1, what only they held is read from\n"
			"                 their backups (each node's is kept by the next node\n"
			"                 of A.json's \"nodes\")\n"
			"  --node ID      only that node's part: what it builds and serves\n");
		return 2;
	}

	struct plan_inputs in = {0};
	struct ptc_layout la, lb;
	struct ptc_error err = {.text = ""};
	struct ptc_plan *plan = NULL;
	int *down = NULL, ndown = 0, *backup_of = NULL, node = -1;

	if (load_inputs(&in, schema, from, to, cluster))
		goto out;
	if (ptc_layout_init(&la, in.schema, in.from, in.cluster, from, &err)) {
		fprintf(stderr, "mlfs: %s\n", err.text);
		goto out;
	}
	if (ptc_layout_init(&lb, in.schema, in.to, in.cluster, to, &err)) {
		fprintf(stderr, "mlfs: %s\n", err.text);
		goto out_la;
	}
	if (!(down = calloc((size_t)in.cluster->nnodes + 1, sizeof(int))))
		goto out_lb;
	if (downlist && parse_down(in.cluster, downlist, down, &ndown))
		goto out_lb;
	/* With "replicas": 1 in the source config every node kept a backup of
	 * its saved state on the next one, as the daemons do. */
	if (in.from->replicas >= 1) {
		if (!(backup_of = malloc((size_t)in.cluster->nnodes * sizeof(int))))
			goto out_lb;
		for (int n = 0; n < in.cluster->nnodes; n++)
			backup_of[n] = ptc_layout_backup_holder(&la, n);
	}
	if (nodeid && (node = ptc_cluster_find(in.cluster, nodeid)) < 0) {
		fprintf(stderr, "mlfs plan: --node: node \"%s\" is not in the cluster\n", nodeid);
		goto out_lb;
	}
	int prc = node < 0
		      ? ptc_plan_compute_backups(&la, &lb, down, ndown, backup_of, &plan, &err)
		      : ptc_plan_compute_node(&la, &lb, down, ndown, backup_of, node, &plan, &err);
	if (prc) {
		fprintf(stderr, "mlfs plan: %s\n", prc == -ENOMEM ? "out of memory" : err.text);
		goto out_lb;
	}
	if (json) {
		if (print_json(plan, &la, &lb, node >= 0 ? in.cluster->nodes[node].id : NULL)) {
			fprintf(stderr, "mlfs plan: cannot write JSON\n");
			goto out_lb;
		}
	} else {
		print_summary(plan, &la, &lb, node);
	}
	rc = 0;
out_lb:
	ptc_layout_release(&lb);
out_la:
	ptc_layout_release(&la);
out:
	ptc_plan_free(plan);
	free(backup_of);
	free(down);
	inputs_release(&in);
	return rc;
}

/* Prints the name map @names of generated schema @j (taken) as a mapping
 * file (`mlfs import --map`). */
static int print_names(json_t *j, const char *names)
{
	struct ptc_error err = {.text = ""};
	struct ptc_schema *s = NULL;
	struct ptc_hf_map map;
	json_t *out = NULL;
	int rc = ptc_schema_parse(j, "schema", &s, &err);

	json_decref(j);
	if (!rc && !(rc = ptc_hf_map_build(s, names, &map, &err))) {
		out = ptc_hf_map_to_json(s, &map);
		ptc_hf_map_release(&map);
	}
	ptc_schema_free(s);
	if (!out) {
		fprintf(stderr, "mlfs schema: %s\n", rc ? err.text : "out of memory");
		return 1;
	}
	json_dumpf(out, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(out);
	return 0;
}

int cmd_schema(int argc, char **argv)
{
	static const struct option opts[] = {{"layers", required_argument, NULL, 'l'},
					     {"hidden", required_argument, NULL, 'h'},
					     {"heads", required_argument, NULL, 'a'},
					     {"kv-heads", required_argument, NULL, 'g'},
					     {"vocab", required_argument, NULL, 'v'},
					     {"ffn", required_argument, NULL, 'f'},
					     {"seq", required_argument, NULL, 's'},
					     {"tied", no_argument, NULL, 't'},
					     {"dtype", required_argument, NULL, 'd'},
					     {"moments-dtype", required_argument, NULL, 'm'},
					     {"experts", required_argument, NULL, 'E'},
					     {"expert-ffn", required_argument, NULL, 'F'},
					     {"shared-experts", required_argument, NULL, 'S'},
					     {"dense-layers", required_argument, NULL, 'K'},
					     {"names", required_argument, NULL, 'N'},
					     {NULL, 0, NULL, 0}};
	static const struct {
		const char *name;
		json_t *(*fn)(const struct ptc_gen_args *a, struct ptc_error *err);
	} models[] = {
	    {"megatron-gpt", ptc_gen_megatron_gpt}, {"llama", ptc_gen_llama}, {"moe", ptc_gen_moe}};
	struct ptc_gen_args a = {.dtype = PTC_BFLOAT16};
	struct ptc_error err = {.text = ""};
	const char *names = NULL; /* --names: print the name map, not the schema */
	size_t m = 0;
	int c;

	while (argc >= 2 && m < sizeof(models) / sizeof(models[0]) &&
	       strcmp(argv[1], models[m].name) != 0)
		m++;
	if (argc < 2 || m == sizeof(models) / sizeof(models[0])) {
		fprintf(stderr, "usage: mlfs schema megatron-gpt|llama|moe --layers N --hidden H "
				"--heads A --vocab V [--ffn F] [--kv-heads G] [--seq S] [--tied] "
				"[--dtype D] [--moments-dtype D] [--names hf]\n"
				"       moe: --experts E [--expert-ffn F] [--shared-experts S] "
				"[--dense-layers 0]\n");
		return 2;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end = NULL;
		long v = optarg ? strtol(optarg, &end, 10) : 0;
		if (optarg && c != 'd' && c != 'm' && c != 'N' &&
		    (*optarg == '\0' || *end != '\0' || v < 0 || v > 1 << 30)) {
			fprintf(stderr, "mlfs schema: \"%s\" is not a count\n", optarg);
			return 2;
		}
		switch (c) {
		case 'l':
			a.layers = (int)v;
			break;
		case 'h':
			a.hidden = (int)v;
			break;
		case 'a':
			a.heads = (int)v;
			break;
		case 'g':
			a.kv_heads = (int)v;
			break;
		case 'v':
			a.vocab = (int)v;
			break;
		case 'f':
			a.ffn = (int)v;
			break;
		case 's':
			a.seq = (int)v;
			break;
		case 't':
			a.tied = true;
			break;
		case 'E':
			a.experts = (int)v;
			break;
		case 'F':
			a.expert_ffn = (int)v;
			break;
		case 'S':
			a.shared_experts = (int)v;
			break;
		case 'K':
			a.dense_layers = (int)v;
			break;
		case 'N':
			names = optarg;
			break;
		case 'd':
			if (ptc_dtype_parse(optarg, &a.dtype)) {
				fprintf(stderr,
					"mlfs schema: --dtype \"%s\" is not a known dtype\n",
					optarg);
				return 2;
			}
			break;
		case 'm':
			if (ptc_dtype_parse(optarg, &a.moments_dtype)) {
				fprintf(
				    stderr,
				    "mlfs schema: --moments-dtype \"%s\" is not a known dtype\n",
				    optarg);
				return 2;
			}
			a.has_moments_dtype = true;
			break;
		default:
			return 2;
		}
	}
	json_t *j = models[m].fn(&a, &err);
	if (!j) {
		fprintf(stderr, "mlfs schema: %s\n", err.text);
		return 1;
	}
	if (names)
		return print_names(j, names);
	json_dumpf(j, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(j);
	return 0;
}
