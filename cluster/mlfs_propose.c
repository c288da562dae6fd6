/*
 * mlfs_propose.c - schema.json and config.json written on this node's
 * mount go to the job (st->propose): a schema is put when the job has none
 * (the first writer wins; a different one is refused); the job's first
 * config is put likewise; a later one becomes an attempt, created by one
 * transaction when no other attempt exists and "config" did not move, with
 * this node as its coordinator (mlfs_attempt.c follows it from there).
 *
 * An attempt names, before any node prepares it: its participants (every
 * live node), the nodes of the current layout that are down (their
 * partitions come from other copies), the backup holders the plan may
 * read from (ptc_plan_compute_backups), and the job/ tree every node will
 * have (mlfs_jobsync_merge).
 *
 * Threads: I/O workers (one per write), beside the control thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

#define MLFS_ATTEMPT_MS	      (300 * 1000)	/* an attempt's deadline */
#define MLFS_ETCD_REQUEST_MAX ((size_t)3 << 19) /* etcd's --max-request-bytes default */

/* ---------------------------------------------------------------- schema */

static int propose_schema(struct mlfs_cluster *c, const char *text, size_t len,
			  struct ptc_error *err)
{
	struct ptc_schema *s;
	char k[512];
	struct ptc_error why;
	bool ok = false;
	int rc = ptc_schema_parse_text(text, len, "schema.json", &s, err);

	if (rc)
		return rc;
	ptc_schema_free(s);
	mlfs_jobkeys_name(c, k, sizeof(k), "schema");
	struct net_etcd_cmp absent = {
	    .key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_cmp same = {.key = k,
				    .target = NET_ETCD_VALUE,
				    .result = NET_ETCD_EQUAL,
				    .value = text,
				    .len = len};
	struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = k, .value = text, .len = len};
	if ((rc = net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, &why)))
		return ptc_error_set(err, -EIO,
				     "schema.json: the control plane (etcd) is unreachable: %s",
				     why.text);
	if (!ok &&
	    (rc = net_etcd_txn(c->etcd, &same, 1, NULL, 0, NULL, 0, &ok, NULL, NULL, &why)) == 0 &&
	    !ok)
		return ptc_errorf(err,
				  "schema.json: the job \"%s\" already has a different "
				  "schema (etcd key %s); a job's schema is fixed",
				  mlfs_store_cluster(c->st)->job, k);
	if (rc)
		return ptc_error_set(err, -EIO, "schema.json: etcd: %s", why.text);
	return mlfs_store_install_schema(c->st, text, len, err);
}

/* ------------------------------------------------------- the job's state */

/* Whether node entry @e says its node restarted and lost its partitions. */
static bool entry_lost(const json_t *e)
{
	const char *state = json_string_value(json_object_get(e, "state"));
	return state && strcmp(state, "lost") == 0;
}

/* The saved step of every rank of the current layout, from every node's
 * entry: 0 and that step in *@step (-1: no live rank), or -EINVAL naming
 * a rank that lags (or a node down). */
static int job_steps_agree(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t *step,
			   struct ptc_error *err)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	int rc = 0;
	*step = -1;
	if (!v)
		return 0;
	const struct ptc_layout *l = &v->layout;
	int64_t first = -1;
	int first_rank = -1;
	for (int r = 0; r < l->world && rc == 0; r++) {
		const char *id = l->cluster->nodes[l->ranks[r].node].id;
		json_t *e = json_object_get(k->nodes, id);
		char rk[16];
		snprintf(rk, sizeof(rk), "%d", r);
		json_t *s = json_object_get(json_object_get(e, "steps"), rk);
		if (!e || entry_lost(e)) {
			continue; /* down: the plan takes its ranks from other copies, or says */
		} else if (!json_is_integer(s) || json_integer_value(json_object_get(
						      e, "version")) != v->config->version) {
			rc = ptc_errorf(
			    err, "config.json: node %s has not published rank %d's step", id, r);
		} else if (first_rank < 0) {
			first = json_integer_value(s);
			first_rank = r;
		} else if (json_integer_value(s) != first) {
			rc = ptc_errorf(err,
					"config.json: ranks have not saved the same step: rank %d "
					"(node %s) saved step %" PRId64 " while rank %d saved "
					"step %" PRId64,
					r, id, (int64_t)json_integer_value(s), first_rank, first);
		}
	}
	mlfs_view_put(v);
	*step = first;
	return rc;
}

/* Whether every live node published the committed config's version (one
 * that just committed publishes it within a round). */
static bool versions_agree(const struct mlfs_jobkeys *k)
{
	const char *id;
	json_t *e;
	json_object_foreach(k->nodes, id, e)
	{
		if (json_integer_value(json_object_get(e, "version")) != k->committed)
			return false;
	}
	return true;
}

/* Whether the attempt of @k is one the elastic controller proposed ("by":
 * "controller"): a person's config replaces it while it has not
 * committed (propose_create, on its exact value). */
static bool controllers(const struct mlfs_jobkeys *k)
{
	const char *by = json_string_value(json_object_get(k->attempt_j, "by"));
	return by && strcmp(by, "controller") == 0;
}

/*
 * Reads the job's keys into @k, giving the job a moment (about 2 s: ten
 * tries 10 ms apart, then 100 ms apart; none while an attempt is in
 * progress, unless @person and it is the controller's, which a person's
 * config replaces) to agree: steps are published within a round of being
 * written, versions just after the release of a commit (a participant's
 * entry put follows the coordinator's announcement, which `mlfs
 * reconfigure` may return before). 0 with *@agreed the step the live ranks
 * saved (-1: unknown), or job_steps_agree's refusal after the last try,
 * with @k read either way; -EIO when etcd is unreachable (@k empty).
 * Errors with @err.
 */
static int read_agreed(struct mlfs_cluster *c, struct mlfs_jobkeys *k, bool person, int64_t *agreed,
		       struct ptc_error *err)
{
	struct ptc_error why;
	int rc;

	for (int tries = 0;; tries++) {
		if (mlfs_jobkeys_read(c, k, &why))
			return ptc_error_set(err, -EIO,
					     "config.json: the control plane (etcd) is "
					     "unreachable: %s",
					     why.text);
		mlfs_join_sync(c, k); /* nodes that joined may be in the config */
		if (!k->config || (k->attempt && !(person && controllers(k))))
			return 0;
		/* (the check runs every round, the last included) */
		if (((rc = job_steps_agree(c, k, agreed, err)) == 0 && versions_agree(k)) ||
		    tries >= 29)
			return rc;
		mlfs_jobkeys_free(k);
		struct timespec nap = {0, (tries < 10 ? 10 : 100) * 1000000L};
		nanosleep(&nap, NULL);
	}
}

/* ----------------------------------------------------------- first config */

/* The job's first config @cfg (text @text): nothing to move; put when the
 * job still has none, then installed here (the others install it from
 * etcd). */
static int propose_first(struct mlfs_cluster *c, const struct ptc_config *cfg, const char *text,
			 size_t len, struct ptc_error *err)
{
	struct mlfs_store *st = c->st;
	struct ptc_layout l;
	char kc[512];
	struct ptc_error why;
	bool ok = false;
	int rc;

	mlfs_jobkeys_name(c, kc, sizeof(kc), "config");
	struct net_etcd_cmp absent = {
	    .key = kc, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = kc, .value = text, .len = len};
	if ((rc = ptc_layout_init(&l, st->schema, cfg, mlfs_store_cluster(st), "config.json", err)))
		return rc;
	ptc_layout_release(&l);
	if (net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, &why))
		rc = ptc_error_set(err, -EIO, "config.json: etcd: %s", why.text);
	else if (!ok)
		rc = ptc_errorf(err,
				"config.json: another node set the job's first config meanwhile");
	else /* nothing when the control thread installed it first */
		rc = mlfs_store_install_first_config(st, text, len, err);
	return rc;
}

/* -------------------------------------------------------------- an attempt */

/* Whether node @node hosts a rank of layout @l (NULL: none; a node that
 * joined after @l was made hosts none of it). */
static bool hosts(const struct ptc_layout *l, int node)
{
	return l && node < l->cluster->nnodes && l->node_nranks[node] > 0;
}

/*
 * The nodes of a move from the current view to config @cfg: the
 * participants (up, hosting ranks in either layout) into *@parts, and the
 * nodes of the current layout that are down (their partitions come from
 * other copies) into *@down, as JSON arrays of ids. 0, or -EINVAL with
 * @err: a bad config, or a down node that the new layout uses.
 */
static int move_nodes(struct mlfs_store *st, const struct ptc_config *cfg, const json_t *up,
		      json_t **parts, json_t **down, struct ptc_error *err)
{
	struct ptc_layout to;
	struct mlfs_view *v = mlfs_store_view(st);
	int rc = ptc_layout_init(&to, st->schema, cfg, mlfs_store_cluster(st), "config.json", err);

	*parts = *down = NULL;
	if (rc == 0) {
		*parts = json_array();
		*down = json_array();
		/* Every live node takes part (one with no ranks in either layout
		 * just moves to the new version); a node down, or restarted with
		 * its partitions lost, is no source and may host no rank. */
		for (int n = 0; n < mlfs_store_cluster(st)->nnodes && rc == 0; n++) {
			const char *id = mlfs_store_cluster(st)->nodes[n].id;
			json_t *e = json_object_get(up, id);
			bool lost = entry_lost(e);
			if (e && v &&
			    json_integer_value(json_object_get(e, "version")) !=
				v->config->version) {
				/* cut off from etcd through a commit: behind */
				if (hosts(&to, n)) {
					rc = ptc_errorf(
					    err,
					    "config.json: node %s is at version "
					    "%" JSON_INTEGER_FORMAT ", not the job's %" PRId64
					    " (it missed a commit): restart it",
					    id, json_integer_value(json_object_get(e, "version")),
					    v->config->version);
					break;
				}
				if (hosts(&v->layout, n))
					json_array_append_new(*down, json_string(id));
				continue;
			}
			if (hosts(&to, n) && !e)
				rc = ptc_errorf(err, "config.json: node %s is down", id);
			else if (hosts(&to, n) && lost)
				rc =
				    ptc_errorf(err,
					       "config.json: node %s restarted and lost its "
					       "partitions: drop it from the config first (its "
					       "state is served from the other nodes), then add it "
					       "back",
					       id);
			if (e)
				json_array_append_new(*parts, json_string(id));
			if ((!e || lost) && v && hosts(&v->layout, n))
				json_array_append_new(*down, json_string(id));
		}
		ptc_layout_release(&to);
	}
	mlfs_view_put(v);
	if (rc) {
		json_decref(*parts);
		json_decref(*down);
		*parts = *down = NULL;
	}
	return rc;
}

/*
 * For each node of @down (ids) whose backup holder under the current
 * layout (ptc_layout_backup_holder) is up and published a backup of every
 * rank of it at @agreed, the step the live ranks saved (job_steps_agree):
 * {id: holder id}, a new reference. The plan takes what no DP replica has
 * from there.
 */
static json_t *usable_backups(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
			      const json_t *down, int64_t agreed)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	json_t *out = json_object(), *d;
	size_t i;

	if (!v || !v->config->replicas || !out)
		goto done;
	const struct ptc_layout *l = &v->layout;
	json_array_foreach(down, i, d)
	{
		const char *id = json_string_value(d);
		int n = id ? ptc_cluster_find(l->cluster, id) : -1;
		int h = n >= 0 ? ptc_layout_backup_holder(l, n) : -1;
		if (h < 0 || agreed < 0)
			continue;
		const char *hid = l->cluster->nodes[h].id;
		json_t *bk = json_object_get(json_object_get(k->nodes, hid), "backup");
		bool ok = json_equal(json_object_get(bk, "of"), d) &&
			  json_integer_value(json_object_get(bk, "version")) == v->config->version;
		for (int r = l->node_first_rank[n];
		     ok && r < l->node_first_rank[n] + l->node_nranks[n]; r++) {
			char rk[16];
			snprintf(rk, sizeof(rk), "%d", r);
			json_t *st = json_object_get(json_object_get(bk, "steps"), rk);
			ok = json_is_integer(st) && json_integer_value(st) == agreed;
		}
		if (ok)
			json_object_set_new(out, id, json_string(hid));
	}
done:
	mlfs_view_put(v);
	return out;
}

/*
 * The layout attempt @a (JSON, its "down" and "backups" parsed into @dn)
 * is planned from (mlfs_decide_source, rule 9): the current one, or the
 * retained one when only it has a copy of everything on live nodes (each
 * says in its /v1/health which it retains); then
 * @a gets "source" (its version), its own "down" and no backups, and @dn
 * says the same. 0, or -ENOMEM.
 */
static int choose_source(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
			 const struct ptc_config *cfg, json_t *a, struct mlfs_reconf_down *dn)
{
	struct mlfs_store *st = c->st;
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	int64_t rv = mlfs_store_retained(st, NULL);
	struct mlfs_view *cur = mlfs_store_view(st), *ret = rv ? mlfs_store_view_of(st, rv) : NULL;
	struct mlfs_snap_node *nodes = calloc((size_t)cl->nnodes, sizeof(*nodes));
	int *rdown = malloc((size_t)cl->nnodes * sizeof(int)), nrdown = 0, rc = -ENOMEM;
	struct ptc_layout to;
	struct ptc_error why;

	if (!nodes || !rdown)
		goto out;
	rc = 0;
	if (!dn->ndown || !ret || !cur ||
	    ptc_layout_init(&to, st->schema, cfg, cl, "config.json", &why))
		goto out;
	/* Which layout each node retains: its /v1/health says (only here,
	 * when nodes are down and a layout is retained: rare). */
	for (int n = 0; n < cl->nnodes; n++) {
		const json_t *e = json_object_get(k->nodes, cl->nodes[n].id);
		json_t *h = NULL;
		nodes[n] = (struct mlfs_snap_node){
		    .id = cl->nodes[n].id, .up = e != NULL, .lost = entry_lost(e)};
		if (n == st->node)
			nodes[n].retained = rv;
		else if (e && !nodes[n].lost && n < ret->layout.cluster->nnodes &&
			 ret->layout.node_nranks[n] > 0 && mlfs_peer_health(st, n, &h, &why) == 0)
			nodes[n].retained = json_integer_value(json_object_get(h, "retained"));
		json_decref(h);
	}
	rc = mlfs_decide_source(&cur->layout, dn->down, dn->ndown, dn->backup_of, &ret->layout, rv,
				&to, nodes, cl->nnodes, rdown, &nrdown);
	ptc_layout_release(&to);
	if (rc != 1)
		goto out;
	mlfs_log(MLFS_LOG_WARNING,
		 "cluster: version %" PRId64 " lost partitions with its down nodes; version "
		 "%" PRId64 " is planned from the retained version %" PRId64,
		 cur->config->version, cfg->version, rv);
	json_t *down = json_array();
	for (int i = 0; i < nrdown && down; i++)
		json_array_append_new(down, json_string(cl->nodes[rdown[i]].id));
	mlfs_attempt_down_free(dn);
	rc = -ENOMEM;
	if (down && json_object_set_new(a, "down", down) == 0 &&
	    json_object_set_new(a, "backups", json_object()) == 0 &&
	    json_object_set_new(a, "source", json_integer(rv)) == 0 &&
	    (rc = mlfs_attempt_down(st, a, dn)) == 0)
		dn->source = rv;
out:
	free(nodes);
	free(rdown);
	mlfs_view_put(ret);
	mlfs_view_put(cur);
	return rc < 0 ? rc : 0;
}

/* A new attempt's random id into @aid. */
static void attempt_id(char aid[24])
{
	uint64_t rnd = 0;
	if (getentropy(&rnd, sizeof(rnd)))
		rnd = (uint64_t)mlfs_cluster_now_ms() * 2654435761u ^ (uint64_t)getpid();
	snprintf(aid, 24, "%016" PRIx64, rnd);
}

/*
 * The attempt @aid from @k's committed version to config @cfg (text @text) as
 * the text of its etcd key, into *@att (the caller's, NULL on an error),
 * its down nodes and backup holders into @dn (mlfs_attempt_down_free, also
 * after an error), and whether this node takes part into *@me_in. 0, or
 * -EINVAL (a node the new layout uses is down or behind), -ENOMEM, with
 * @err.
 */
static int propose_build(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
			 const struct ptc_config *cfg, int64_t agreed, const char *text,
			 const char *aid, char **att, struct mlfs_reconf_down *dn, bool *me_in,
			 json_t **parts_out, const char *by, size_t *njob_out,
			 struct ptc_error *err)
{
	struct mlfs_store *st = c->st;
	json_t *parts, *down, *a = NULL;
	int rc = move_nodes(st, cfg, k->nodes, &parts, &down, err);
	json_t *missing = json_array();
	size_t nread = 0;
	json_t *job =
	    rc ? NULL : mlfs_jobsync_merge(st, c->me, parts, k->nodes, missing, &rc, &nread);
	if (job) {
		pthread_mutex_lock(&c->lock);
		c->manifests_read = (int64_t)nread;
		pthread_mutex_unlock(&c->lock);
	}

	*att = NULL;
	*dn = (struct mlfs_reconf_down){0};
	*me_in = mlfs_cluster_ids_has(parts, c->me);
	size_t njob = job ? json_array_size(job) : 0;
	if (rc == 0) {
		json_t *backups = usable_backups(c, k, down, agreed);
		/* "o": the attempt takes over @backups and @job */
		a = json_pack(
		    "{sssIsIsbsssssOsOsosIsosOsI}", "id", aid, "from", (json_int_t)k->committed,
		    "to", (json_int_t)cfg->version, "elastic", cfg->elastic, "config", text,
		    "coordinator", c->me, "participants", parts, "down", down, "backups", backups,
		    "deadline_ms", (json_int_t)(mlfs_cluster_now_ms() + MLFS_ATTEMPT_MS), "job",
		    job ? job : json_array(), "job_missing", missing, "step", (json_int_t)agreed);
		if (a && by) /* a person's config replaces the controller's attempt */
			json_object_set_new(a, "by", json_string(by));
	}
	json_decref(missing);
	if (rc == 0 && a && (rc = mlfs_attempt_down(st, a, dn)) == 0)
		rc = choose_source(c, k, cfg, a, dn);
	json_decref(down);
	/* every node's watch gets the attempt: its participants as ranges of
	 * node indices, a few bytes (mlfs_jobkeys.c's parse expands them) */
	char *packed = a ? mlfs_ids_pack(parts, mlfs_store_cluster(st)) : NULL;
	if (packed)
		json_object_set_new(a, "participants", json_string(packed));
	free(packed);
	*att = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(a);
	*parts_out = parts;
	if (rc == 0 && !*att)
		rc = -ENOMEM;
	*njob_out = njob;
	if (rc) {
		free(*att);
		*att = NULL;
	}
	return rc;
}

/* The result/<v> keys of @k for versions before the committed one, as
 * deletes into @ops (at most @cap; their names into @names), once
 * MLFS_RESULTS_KEPT or more of them piled up; their number (0 before).
 * Each reconfiguration puts one, and every node's rounds copy the job's
 * keys: without this they grew with every reconfiguration of the job's
 * life. A node reads a result of its own attempt's version only (why its
 * prepared attempt was discarded), never of an older one. */
static size_t old_results(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
			  struct net_etcd_op *ops, char (*names)[512], size_t cap)
{
	char pre[512];
	size_t n = 0, old = 0;

	mlfs_jobkeys_name(c, pre, sizeof(pre), "result/");
	size_t plen = strlen(pre);
	for (size_t i = 0; i < k->n; i++) {
		char *end;
		if (strncmp(k->kvs[i].key, pre, plen) != 0)
			continue;
		long long v = strtoll(k->kvs[i].key + plen, &end, 10);
		if (*end != '\0' || v >= k->committed)
			continue;
		if (old++ < cap) {
			snprintf(names[n], sizeof(names[n]), "%s", k->kvs[i].key);
			ops[n] = (struct net_etcd_op){.kind = NET_ETCD_DELETE, .key = names[n]};
			n++;
		}
	}
	return old < MLFS_RESULTS_KEPT ? 0 : n;
}

/* The failpoint hold-before-create: a proposal held between its read of
 * etcd and its transaction until an attempt (key @ka) exists, another
 * node's (10 s at most), as when two configs are written at once and the
 * other one is created first; its transaction is then refused. */
static void hold_before_create(struct mlfs_cluster *c, const char *ka)
{
	mlfs_log(MLFS_LOG_WARNING, "cluster: failpoint hold-before-create: holding until "
				   "another attempt exists");
	for (int i = 0; i < 1000; i++) {
		struct net_etcd_kv *kvs;
		size_t n;
		int64_t rev;
		bool there = false;
		if (mlfs_mirror_copy(&c->mirror, &kvs, &n, &rev, NULL) == 0) {
			for (size_t j = 0; j < n; j++)
				there |= strcmp(kvs[j].key, ka) == 0;
			free(kvs);
		}
		if (there)
			return;
		usleep(10 * 1000);
	}
}

/*
 * Creates attempt @att (text; this node's from now on: c->mine) in etcd
 * with one transaction that requires no attempt and "config" unchanged
 * since @k was read, bound to this node's lease. When this node takes
 * part (@me_in) it marks the attempt started, so that the control thread
 * does not start it too. 0, -EBUSY (another attempt, or the config moved),
 * -EIO (etcd, or not registered yet), with @err.
 */
static int propose_create(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, char *att,
			  const char *aid, bool me_in, const struct net_etcd_kv *replace,
			  size_t njob, int64_t *rev, struct ptc_error *err)
{
	char ka[512], kc[512];
	struct ptc_error why;
	bool ok = false;
	int rc = 0;
	int64_t lease = atomic_load(&c->lease);

	mlfs_jobkeys_name(c, ka, sizeof(ka), "attempt");
	mlfs_jobkeys_name(c, kc, sizeof(kc), "config");
	if (strcmp(c->failpoint, "hold-before-create") == 0)
		hold_before_create(c, ka);
	struct net_etcd_cmp cmps[] = {
	    {.key = ka, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL},
	    {.key = kc, .target = NET_ETCD_MOD, .result = NET_ETCD_EQUAL, .num = k->config_mod}};
	if (replace) /* the controller's attempt, exactly as read: replaced */
		cmps[0] = (struct net_etcd_cmp){.key = ka,
						.target = NET_ETCD_VALUE,
						.result = NET_ETCD_EQUAL,
						.value = replace->value,
						.len = replace->len};
	struct net_etcd_op put[1 + MLFS_RESULTS_PRUNED] = {
	    {.kind = NET_ETCD_PUT, .key = ka, .value = att, .len = strlen(att), .lease = lease}};
	char names[MLFS_RESULTS_PRUNED][512];
	size_t nput = 1 + old_results(c, k, put + 1, names, MLFS_RESULTS_PRUNED);
	pthread_mutex_lock(&c->lock);
	free(c->mine);
	c->mine = att;
	/* This thread prepares it (propose_attempt): the control thread, which
	 * may see the attempt in etcd first, must not start it too. */
	if (me_in)
		snprintf(c->started_id, sizeof(c->started_id), "%s", aid);
	pthread_mutex_unlock(&c->lock);
	if (!lease)
		rc = ptc_error_set(err, -EIO,
				   "config.json: this node is not registered with etcd (yet)");
	else if (net_etcd_txn(c->etcd, cmps, 2, put, nput, NULL, 0, &ok, rev, NULL, &why) == 0) {
		if (!ok)
			rc = ptc_error_set(err, -EBUSY,
					   "config.json: another reconfiguration started, or the "
					   "config changed, meanwhile");
	} else if (strstr(why.text, "request is too large") ||
		   strstr(why.text, "larger than max") ||
		   (strlen(att) > MLFS_ETCD_REQUEST_MAX && strstr(why.text, "HTTP/2 framing")))
		/* etcd's --max-request-bytes (1.5 MiB by default), or its
		 * gateway's 2 MiB; past its gRPC limit (512 KiB more) etcd
		 * resets the stream while the request is still being sent (a
		 * transaction runs only on a whole request, so it did not).
		 * The attempt is mostly job/'s manifest. */
		rc = ptc_error_set(err, -EFBIG,
				   "config.json: the reconfiguration's attempt (%zu bytes) is "
				   "larger than etcd takes in one request: job/ holds %zu files "
				   "and directories, whose manifest (about 100 bytes each, with "
				   "their names) is most of it; keep job/ smaller, or raise "
				   "etcd's --max-request-bytes (etcd: %s)",
				   strlen(att), njob, why.text);
	else
		rc = ptc_error_set(err, -EIO, "config.json: etcd: %s", why.text);
	pthread_mutex_lock(&c->lock);
	if (rc == 0 && c->mine == att) /* from then on, its absence means it is gone */
		c->mine_rev = *rev;
	/* Refused: never this node's (etcd's answer is certain; a request too
	 * large is refused before it is applied). Not after -EIO: the
	 * transaction may have applied, and then the control thread
	 * coordinates it when it sees it. */
	if ((rc == -EBUSY || rc == -EFBIG) && c->mine == att) {
		free(c->mine);
		c->mine = NULL;
		c->mine_rev = 0;
	}
	pthread_mutex_unlock(&c->lock);
	if (rc && me_in) { /* no attempt of ours: the next one starts */
		pthread_mutex_lock(&c->lock);
		if (strcmp(c->started_id, aid) == 0)
			c->started_id[0] = '\0';
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

/* A config @cfg (text @text) after @k's committed one: an attempt, created
 * in etcd and, when this node takes part, prepared here at once. @agreed:
 * the step the live ranks saved. */
static int propose_attempt(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
			   const struct ptc_config *cfg, int64_t agreed, const char *text,
			   size_t len, const char *by, const struct net_etcd_kv *replace,
			   int64_t *created, struct ptc_error *err)
{
	struct mlfs_reconf_down dn;
	char aid[24], *att;
	bool me_in;

	int64_t rev = 0;

	attempt_id(aid);
	/* The control thread starts following the entries now: started once
	 * the attempt exists, their watch and its read met etcd busy with the
	 * participants' first requests. */
	pthread_mutex_lock(&c->lock);
	c->proposing++;
	pthread_mutex_unlock(&c->lock);
	mlfs_cluster_wake(c);
	json_t *parts = NULL;
	size_t njob = 0;
	int rc =
	    propose_build(c, k, cfg, agreed, text, aid, &att, &dn, &me_in, &parts, by, &njob, err);
	if (rc == 0 && c->st->votebox) /* votes may come before the reply */
		mlfs_votebox_expect(c->st->votebox, aid, json_array_size(parts));
	if (rc == 0)
		rc = propose_create(c, k, att, aid, me_in && !replace, replace, njob, &rev, err);
	if (rc == 0)
		mlfs_log(MLFS_LOG_DEBUG, "cluster: attempt %s to version %" PRId64 " created", aid,
			 cfg->version);
	if (rc == 0 && created)
		*created = rev;
	if (rc == 0 && replace)
		mlfs_log(MLFS_LOG_WARNING,
			 "elastic: a config written on node %s replaces the controller's attempt",
			 c->me);
	/* The coordinator prepares at once when it takes part: its
	 * status.json (which mlfs reconfigure reads) shows the attempt from
	 * now on. Not when it replaced the controller's attempt, which its
	 * store may be preparing: its control thread discards that one
	 * first, then prepares this one. */
	if (rc == 0 && me_in && !replace) {
		struct ptc_error perr = {.text = ""};
		if ((rc = mlfs_attempt_prepare(c, agreed, aid, rev, text, len, &dn, parts, c->me,
					       &perr))) {
			/* the coordinator aborts the attempt at its next round */
			mlfs_attempt_vote_failed(c, c->me, cfg->version, aid, perr.text);
			ptc_error_set(err, rc, "%s", perr.text);
		}
	}
	mlfs_attempt_down_free(&dn);
	json_decref(parts);
	pthread_mutex_lock(&c->lock);
	c->proposing--;
	pthread_mutex_unlock(&c->lock);
	if (rc)
		mlfs_cluster_wake(c); /* no attempt of this node's: the round stops following */
	return rc;
}

/* ------------------------------------------------------------------ config */

static int propose_config(struct mlfs_cluster *c, const char *text, size_t len, const char *by,
			  int64_t *created, struct ptc_error *err)
{
	struct ptc_config *cfg;
	struct mlfs_jobkeys k;
	int64_t agreed = -1; /* the step the live ranks saved */
	int rc = ptc_config_parse_text(text, len, "config.json", &cfg, err);

	if (rc == 0 && (rc = mlfs_config_supported(cfg, true, "config.json", err)))
		ptc_config_free(cfg);
	if (rc)
		return rc;
	if (!c->st->schema) {
		ptc_config_free(cfg);
		return ptc_errorf(err, "config.json: write schema.json first");
	}
	rc = read_agreed(c, &k, !by, &agreed, err);
	const struct net_etcd_kv *replace =
	    rc == 0 && k.attempt && !by && controllers(&k) ? k.attempt : NULL;
	if (rc) {
		/* etcd unreachable, or the steps' refusal: in err */
	} else if (k.attempt && !replace) {
		rc = ptc_errorf(err,
				"config.json: a reconfiguration to version %" PRId64
				" is in progress (coordinator %s)",
				(int64_t)json_integer_value(json_object_get(k.attempt_j, "to")),
				json_string_value(json_object_get(k.attempt_j, "coordinator")));
		rc = -EBUSY;
	} else if (cfg->version <= k.committed) {
		rc = ptc_errorf(err,
				"config.json: \"version\" = %" PRId64
				" is not greater than the job's current %" PRId64,
				cfg->version, k.committed);
	} else if (!k.config) {
		rc = propose_first(c, cfg, text, len, err);
	} else {
		rc = propose_attempt(c, &k, cfg, agreed, text, len, by, replace, created, err);
	}
	mlfs_jobkeys_free(&k);
	ptc_config_free(cfg);
	return rc;
}

int mlfs_propose(void *arg, bool config, const char *text, size_t len, struct ptc_error *err)
{
	struct mlfs_cluster *c = arg;
	return config ? propose_config(c, text, len, NULL, NULL, err)
		      : propose_schema(c, text, len, err);
}

int mlfs_propose_for_controller(struct mlfs_cluster *c, const char *text, size_t len,
				int64_t *created, struct ptc_error *err)
{
	*created = 0;
	return propose_config(c, text, len, "controller", created, err);
}
