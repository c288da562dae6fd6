/*
 * mlfs_elastic.c - the elastic controller's choice of layout (elastic_i.h):
 * which nodes, and which (tp, pp, dp) on them, the job should run in now.
 *
 * DESIGN
 * The controller acts only when the nodes changed under the committed
 * config: a node of it is down or lost (its layout cannot serve) or
 * marked for draining, or a node joined since the config was first seen
 * (the job can grow). A draining node hosts no rank of the new layout but
 * is no down node: it still serves what it holds, so draining loses
 * nothing even without replicas. A
 * person's config therefore stands until then, whatever the controller
 * would have chosen. The nodes it chooses are the live ones, the config's
 * own first and in their order (their ranks keep their place where the
 * new layout allows, so most partitions are reused), then the others in
 * cluster order, at most max_nodes; fewer than min_nodes is no layout at
 * all (it waits). On them, ptc_suggest ranks every (tp, pp, dp) the schema
 * and the batch admit by its cost model (the DP degree must split the
 * dataset's global batch into whole micro-batches of elastic.micro_batch
 * samples: the training keeps its global batch), and the first whose plan
 * from the committed
 * layout exists with the down nodes' partitions taken from DP replicas or
 * backups (mlfs_decide_servable: the whole job's plan, or one node's at a
 * time past PTC_MAX_JOB_PARTITIONS) wins: a layout that needs state no
 * live node holds is not a candidate, whatever its speed. When no layout
 * of all the chosen nodes fits (6 devices, and a batch of 16 or 4 layers
 * that 3 cannot divide) or can be served, the first n - 1 of them are
 * tried, and so on down to min_nodes: the job runs on as many nodes as
 * some layout uses, the rest idle until the nodes change again.
 *
 * Pure: no I/O, no clock, no globals; the same inputs give the same
 * config.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/decide_i.h"
#include "cluster/elastic_i.h"

/* printf into @buf of @cap bytes, cut to fit. */
static void text(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void text(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, cap, fmt, ap);
	va_end(ap);
}

#define say(out, ...) text((out)->why, sizeof((out)->why), __VA_ARGS__)

/* Appends the ids of cluster nodes @idx (@n) to @buf, comma-separated. */
static void ids(const struct ptc_cluster *cl, const int *idx, int n, char *buf, size_t cap)
{
	size_t k = 0;
	buf[0] = '\0';
	for (int i = 0; i < n && k < cap; i++)
		k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? "," : "", cl->nodes[idx[i]].id);
}

/* Whether node @k may host ranks: live and not draining. */
static bool usable(const struct mlfs_elastic_in *in, int k)
{
	return in->live[k] && !(in->draining && in->draining[k]);
}

/* The nodes to run on into @pick (cluster indices): the config's usable
 * nodes in its order, then the other usable ones, at most @max. Their
 * number. */
static int choose_nodes(const struct mlfs_elastic_in *in, int max, int *pick)
{
	const struct ptc_cluster *cl = in->cluster;
	bool *taken = calloc((size_t)cl->nnodes, sizeof(*taken));
	int n = 0;

	if (!taken)
		return -ENOMEM;
	for (int i = 0; i < in->cur->nnodes && n < max; i++) {
		int k = ptc_cluster_find(cl, in->cur->nodes[i]);
		if (k >= 0 && usable(in, k) && !taken[k])
			taken[k] = true, pick[n++] = k;
	}
	for (int k = 0; k < cl->nnodes && n < max; k++)
		if (usable(in, k) && !taken[k])
			taken[k] = true, pick[n++] = k;
	free(taken);
	return n;
}

/* Whether the committed config needs a new layout: one of its nodes is
 * not live, or a live node not in it joined since the baseline (and there
 * is room for it). Its reason into @out. */
static bool changed(const struct mlfs_elastic_in *in, struct mlfs_elastic_out *out)
{
	const struct ptc_cluster *cl = in->cluster;
	int in_cfg = 0;

	for (int i = 0; i < in->cur->nnodes; i++) {
		int k = ptc_cluster_find(cl, in->cur->nodes[i]);
		if (k < 0 || !in->live[k]) {
			say(out, "node %s of version %lld is down or lost", in->cur->nodes[i],
			    (long long)in->cur->version);
			return true;
		}
		if (!usable(in, k)) {
			say(out, "node %s of version %lld is draining", in->cur->nodes[i],
			    (long long)in->cur->version);
			return true;
		}
		in_cfg++;
	}
	for (int k = 0; k < cl->nnodes; k++) {
		bool listed = false;
		for (int i = 0; i < in->cur->nnodes; i++)
			listed |= strcmp(in->cur->nodes[i], cl->nodes[k].id) == 0;
		if (!listed && usable(in, k) && !(in->baseline && in->baseline[k]) &&
		    in_cfg < in->cur->elastic_max) {
			say(out, "node %s joined", cl->nodes[k].id);
			return true;
		}
	}
	say(out, "every node of version %lld is live and none joined", (long long)in->cur->version);
	return false;
}

/* The first suggestion of @r servable from @from: its config (a new
 * reference) or NULL; *@refused counts those that were not, the first
 * one's reason in @first. */
static json_t *first_servable(const struct mlfs_elastic_in *in, const struct ptc_suggest_result *r,
			      const struct ptc_layout *from, const int *down, int ndown,
			      int *refused, struct ptc_error *first, int *rc)
{
	for (int i = 0; i < r->nfit; i++) {
		json_t *j = ptc_suggest_config_to_json(r, i);
		struct ptc_config *c = NULL;
		struct ptc_layout to;
		struct ptc_error why = {.text = ""};
		if (!j || ptc_config_parse(j, "elastic", &c, &why) ||
		    ptc_layout_init(&to, in->schema, c, in->cluster, "elastic", &why)) {
			json_decref(j);
			ptc_config_free(c);
			*rc = -ENOMEM; /* a suggestion is a valid layout: only memory fails */
			return NULL;
		}
		int s = mlfs_decide_servable(from, &to, down, ndown, in->backup_of, &why);
		ptc_layout_release(&to);
		ptc_config_free(c);
		if (s == 0)
			return j;
		json_decref(j);
		if (s < 0) {
			*rc = s;
			return NULL;
		}
		if ((*refused)++ == 0)
			*first = why;
	}
	return NULL;
}

/* The first reason ptc_suggest gave for dropping a layout. */
static const char *first_drop(const struct ptc_suggest_result *r)
{
	for (int d = 0; d < PTC_SUGGEST_DROP_COUNT; d++)
		if (r->ndropped[d])
			return r->first_reason[d];
	return "no layout has that many devices";
}

int mlfs_elastic_decide(const struct mlfs_elastic_in *in, struct mlfs_elastic_out *out)
{
	const struct ptc_cluster *cl = in->cluster;
	const struct ptc_config *cur = in->cur;
	int *pick = malloc((size_t)cl->nnodes * sizeof(int));
	int *down = malloc((size_t)cl->nnodes * sizeof(int)), ndown = 0, rc = 0;
	struct ptc_layout from;
	struct ptc_error why = {.text = ""};
	char names[PTC_ERROR_MAX / 2];

	out->config = NULL;
	out->why[0] = '\0';
	if (!pick || !down) {
		rc = -ENOMEM;
		goto out;
	}
	if (!cur->elastic) {
		say(out, "the config is not elastic");
		goto out;
	}
	if (!changed(in, out))
		goto out;
	char change[PTC_ERROR_MAX]; /* what changed, said first */
	memcpy(change, out->why, sizeof(change));
	int n = choose_nodes(in, cur->elastic_max, pick);
	if (n < 0) {
		rc = n;
		goto out;
	}
	if (n < cur->elastic_min) {
		say(out, "%s, and %d node(s) are live, fewer than min_nodes %d: waiting for more",
		    change, n, cur->elastic_min);
		goto out;
	}
	for (int i = 0; i < cur->nnodes; i++) {
		int k = ptc_cluster_find(cl, cur->nodes[i]);
		if (k >= 0 && !in->live[k])
			down[ndown++] = k;
	}
	struct ptc_suggest_profile prof;
	struct ptc_suggest_params params = {.from_name = "the committed config",
					    .micro_batch = cur->elastic_micro_batch};
	if (!in->profile)
		ptc_suggest_profile_default(&prof);
	if (ptc_layout_init(&from, in->schema, cur, cl, "the committed config", &why)) {
		say(out, "the committed config does not fit the cluster: %s", why.text);
		goto out;
	}
	/* All the chosen nodes, else the first n - 1 of them, ... down to
	 * min_nodes: the job runs on as many as some layout fits (a number of
	 * devices the schema or the batch cannot divide leaves a node idle). */
	char first_why[PTC_ERROR_MAX] = "";
	for (int k = n; k >= cur->elastic_min && !out->config && rc == 0; k--) {
		struct ptc_suggest_result r;
		rc = ptc_suggest(in->schema, cl, pick, k, cur, &params,
				 in->profile ? in->profile : &prof, &r, &why);
		if (rc == -ENOMEM)
			break;
		ids(cl, pick, k, names, sizeof(names));
		if (rc) {
			if (k == n)
				text(first_why, sizeof(first_why), "no layout on %s: %s", names,
				     why.text);
			rc = 0;
			continue;
		}
		int refused = 0;
		struct ptc_error first = {.text = ""};
		out->config = first_servable(in, &r, &from, down, ndown, &refused, &first, &rc);
		if (out->config)
			say(out,
			    "%s: version %lld on %s as tp%lld pp%lld dp%lld, the fastest of %d "
			    "layouts that fit whose state survives (%d needed lost state)%s%s",
			    change, (long long)cur->version + 1, names,
			    json_integer_value(json_object_get(out->config, "tp")),
			    json_integer_value(json_object_get(out->config, "pp")),
			    json_integer_value(json_object_get(out->config, "dp")), r.nfit, refused,
			    k < n ? "; " : "", k < n ? first_why : "");
		else if (rc == 0 && k == n && r.nfit == 0)
			text(first_why, sizeof(first_why), "no layout on %s fits: %s", names,
			     first_drop(&r));
		else if (rc == 0 && k == n)
			text(first_why, sizeof(first_why),
			     "none of the %d layouts on %s can be served from the surviving "
			     "state%s%s",
			     r.nfit, names, refused ? ": " : "", refused ? first.text : "");
		ptc_suggest_result_release(&r);
	}
	if (!out->config && rc == 0)
		say(out, "%s; %s%s", change, first_why,
		    n > cur->elastic_min ? " (nor on fewer of these nodes, down to min_nodes)"
					 : "");
	ptc_layout_release(&from);
out:
	free(pick);
	free(down);
	return rc;
}
