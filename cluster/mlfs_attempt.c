/*
 * mlfs_attempt.c - a reconfiguration in progress across the nodes, as
 * every node follows it round after round (mlfs_cluster.c's DESIGN block
 * has the keys and the rules): a participant prepares the attempt beside
 * its current layout, stages its job/ and votes; the coordinator commits
 * it once every participant voted ready, or aborts it; every node commits
 * its prepared layout when etcd's "config" reaches the attempt's version,
 * and aborts it when the attempt vanished without a commit.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* ---------------------------------------------------------------- votes */

static void vote(struct mlfs_cluster *c, int64_t to, const char *attempt_id, const char *what)
{
	char k[512], v[1024];
	struct ptc_error why;
	mlfs_jobkeys_name(c, k, sizeof(k), "votes/%" PRId64 "/%s", to, c->me);
	snprintf(v, sizeof(v), "%s %s", attempt_id ? attempt_id : "-", what);
	if (net_etcd_put(c->etcd, k, v, strlen(v), 0, NULL, &why) == 0)
		snprintf(c->voted_id, sizeof(c->voted_id), "%s", attempt_id ? attempt_id : "");
}

void mlfs_attempt_vote_failed(struct mlfs_cluster *c, int64_t to, const char *aid,
			      const char *reason)
{
	char v[700];
	snprintf(v, sizeof(v), "failed: %s", reason);
	vote(c, to, aid, v);
}

/* The vote of @id on attempt @to: NULL when none. */
static const struct net_etcd_kv *vote_of(struct mlfs_cluster *c, const struct mlfs_jobkeys *k,
					 int64_t to, const char *id)
{
	char want[512];
	mlfs_jobkeys_name(c, want, sizeof(want), "votes/%" PRId64 "/%s", to, id);
	for (size_t i = 0; i < k->n; i++)
		if (strcmp(k->kvs[i].key, want) == 0)
			return &k->kvs[i];
	return NULL;
}

/* ---------------------------------------------------------- coordinator */

/* The coordinator ends its attempt: commit (@reason NULL) or abort. Only
 * while the attempt in etcd is still the one it created. */
static void finish(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to,
		   const char *reason)
{
	char ka[512], kc[512], kv[512], kr[512], res[600];
	struct ptc_error why;
	const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
	bool ok = false;

	mlfs_jobkeys_name(c, ka, sizeof(ka), "attempt");
	mlfs_jobkeys_name(c, kc, sizeof(kc), "config");
	mlfs_jobkeys_name(c, kv, sizeof(kv), "votes/%" PRId64 "/", to);
	mlfs_jobkeys_name(c, kr, sizeof(kr), "result/%" PRId64, to);
	snprintf(res, sizeof(res), reason ? "aborted: %s" : "committed", reason);
	pthread_mutex_lock(&c->lock);
	char *mine = c->mine ? strdup(c->mine) : NULL;
	pthread_mutex_unlock(&c->lock);
	if (!mine)
		return;
	struct net_etcd_cmp still = {.key = ka,
				     .target = NET_ETCD_VALUE,
				     .result = NET_ETCD_EQUAL,
				     .value = mine,
				     .len = strlen(mine)};
	struct net_etcd_op commit[] = {
	    {.kind = NET_ETCD_PUT, .key = kc, .value = config, .len = config ? strlen(config) : 0},
	    {.kind = NET_ETCD_DELETE, .key = ka},
	    {.kind = NET_ETCD_DELETE, .key = kv, .prefix = true},
	    {.kind = NET_ETCD_PUT, .key = kr, .value = res, .len = strlen(res)}};
	const struct net_etcd_op *ops = reason ? commit + 1 : commit;
	size_t nops = reason ? 3 : 4;
	if (net_etcd_txn(c->etcd, &still, 1, ops, nops, NULL, 0, &ok, NULL, NULL, &why) == 0 &&
	    ok) {
		pthread_mutex_lock(&c->lock);
		free(c->mine);
		c->mine = NULL;
		pthread_mutex_unlock(&c->lock);
	}
	free(mine);
}

void mlfs_attempt_coordinate(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to)
{
	json_t *parts = json_object_get(k->attempt_j, "participants");
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));
	size_t i;
	json_t *p;
	bool all = true;
	char reason[600];

	if (mlfs_cluster_now_ms() >
	    json_integer_value(json_object_get(k->attempt_j, "deadline_ms"))) {
		finish(c, k, to, "the deadline passed before every node was ready");
		return;
	}
	json_array_foreach(parts, i, p)
	{
		const char *id = json_string_value(p);
		if (!id)
			continue;
		if (!json_object_get(k->nodes, id)) {
			snprintf(reason, sizeof(reason), "node %s is down (its lease expired)", id);
			finish(c, k, to, reason);
			return;
		}
		const struct net_etcd_kv *v = vote_of(c, k, to, id);
		size_t n = aid ? strlen(aid) : 0;
		if (!v || !aid || strncmp(v->value, aid, n) != 0 || v->value[n] != ' ') {
			all = false; /* none yet for this attempt */
		} else if (strncmp(v->value + n + 1, "failed", 6) == 0) {
			snprintf(reason, sizeof(reason), "node %s: %.500s", id, v->value + n + 1);
			finish(c, k, to, reason);
			return;
		}
	}
	if (all)
		finish(c, k, to, NULL);
}

/* ---------------------------------------------------------- participant */

int mlfs_attempt_down(struct mlfs_store *st, const json_t *att, struct mlfs_reconf_down *dn)
{
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	const json_t *down = json_object_get(att, "down"), *bk = json_object_get(att, "backups");
	int *d = malloc((json_array_size(down) + 1) * sizeof(int));
	int *b = malloc((size_t)cl->nnodes * sizeof(int));
	size_t i;
	const char *id;
	json_t *e;

	*dn = (struct mlfs_reconf_down){d, 0, b, cl->nnodes};
	if (!d || !b)
		return -ENOMEM;
	json_array_foreach(down, i, e)
	{
		int n = json_string_value(e) ? ptc_cluster_find(cl, json_string_value(e)) : -1;
		if (n >= 0)
			d[dn->ndown++] = n;
	}
	for (int n = 0; n < cl->nnodes; n++)
		b[n] = -1;
	json_object_foreach((json_t *)bk, id, e)
	{
		int n = ptc_cluster_find(cl, id);
		if (n >= 0 && json_string_value(e))
			b[n] = ptc_cluster_find(cl, json_string_value(e));
	}
	return 0;
}

void mlfs_attempt_down_free(struct mlfs_reconf_down *dn)
{
	free((int *)dn->down);
	free((int *)dn->backup_of);
	memset(dn, 0, sizeof(*dn));
}

/* The ranks of down nodes (@down, @ndown cluster indices) take the step
 * the live ranks agree on: their partitions come from other copies, which
 * saved that step. */
static void fill_down_steps(struct mlfs_cluster *c, const int *down, int ndown)
{
	struct mlfs_store *st = c->st;
	pthread_mutex_lock(&st->lock);
	if (st->view && ndown) {
		const struct ptc_layout *l = &st->view->layout;
		int64_t step = -1;
		for (int r = 0; r < l->world && step < 0; r++) {
			bool dead = false;
			for (int i = 0; i < ndown; i++)
				dead |= l->ranks[r].node == down[i];
			if (!dead)
				step = st->steps[r];
		}
		for (int r = 0; r < l->world; r++)
			for (int i = 0; i < ndown; i++)
				if (l->ranks[r].node == down[i])
					st->steps[r] = step;
	}
	pthread_mutex_unlock(&st->lock);
}

int mlfs_attempt_prepare(struct mlfs_cluster *c, const json_t *nodes, const char *aid,
			 const char *config, size_t len, const struct mlfs_reconf_down *dn,
			 struct ptc_error *err)
{
	int rc;

	mlfs_nodeentry_sync_steps(c, nodes);
	fill_down_steps(c, dn->down, dn->ndown);
	rc = config ? mlfs_reconf_prepare_down(c->st, config, len, "attempt", false, dn, err)
		    : -EINVAL;
	if (rc == 0) {
		pthread_mutex_lock(&c->lock);
		snprintf(c->prepared_id, sizeof(c->prepared_id), "%s", aid);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

/* The store's reconfiguration state, its target version into *@target and
 * its error (status.json's "error"; code 0: no errno comes with it) into
 * @err (when not NULL). */
static enum mlfs_reconf_state reconf_state(struct mlfs_store *st, int64_t *target,
					   struct ptc_error *err)
{
	pthread_mutex_lock(&st->lock);
	enum mlfs_reconf_state s = st->reconf;
	*target = st->target_version;
	ptc_error_set(err, 0, "%s", st->error);
	pthread_mutex_unlock(&st->lock);
	return s;
}

/* Starts preparing attempt @aid (to @to) in the store, once: false when it
 * could not (a failed vote is in). */
static bool start_once(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to,
		       const char *aid)
{
	struct ptc_error err = {.text = ""};

	pthread_mutex_lock(&c->lock);
	bool start = strcmp(c->started_id, aid) != 0;
	if (start)
		snprintf(c->started_id, sizeof(c->started_id), "%s", aid);
	pthread_mutex_unlock(&c->lock);
	if (!start)
		return true;
	const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
	struct mlfs_reconf_down dn;
	int rc = mlfs_attempt_down(c->st, k->attempt_j, &dn);
	if (rc == 0)
		rc = mlfs_attempt_prepare(c, k->nodes, aid, config, config ? strlen(config) : 0,
					  &dn, &err);
	mlfs_attempt_down_free(&dn);
	if (rc) {
		mlfs_attempt_vote_failed(c, to, aid, err.text[0] ? err.text : strerror(-rc));
		return false;
	}
	return true;
}

/* Once the store prepared attempt @aid (to @to): stages the attempt's job/
 * and votes ready, or votes failed with the reason. */
static void vote_prepared(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to,
			  const char *aid)
{
	struct ptc_error error;
	int64_t target;
	enum mlfs_reconf_state s = reconf_state(c->st, &target, &error);

	if (target != to)
		return;
	if (s == MLFS_RECONF_PREPARED &&
	    mlfs_cluster_ids_has(json_object_get(k->attempt_j, "job_missing"), c->me)) {
		mlfs_attempt_vote_failed(c, to, aid,
					 "the coordinator could not read this node's job/");
		return;
	}
	if (s == MLFS_RECONF_PREPARED) {
		const char *co = json_string_value(json_object_get(k->attempt_j, "coordinator"));
		if (co && (c->job_to != to || !c->job)) {
			struct ptc_error why;
			struct mlfs_job *j;
			if (mlfs_jobsync_stage(c->st, json_object_get(k->attempt_j, "job"), co, &j,
					       &why)) {
				mlfs_attempt_vote_failed(c, to, aid, why.text);
				return;
			}
			mlfs_job_free(c->job);
			c->job = j;
			c->job_to = to;
		}
		vote(c, to, aid, "ready");
	} else if (s == MLFS_RECONF_FAILED) {
		mlfs_attempt_vote_failed(c, to, aid, error.text);
	}
}

void mlfs_attempt_participate(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t from,
			      int64_t to)
{
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));

	if (!mlfs_cluster_ids_has(json_object_get(k->attempt_j, "participants"), c->me) || !aid ||
	    mlfs_cluster_version(c->st) != from)
		return;
	if (!start_once(c, k, to, aid))
		return;
	pthread_mutex_lock(&c->lock);
	bool ours = strcmp(c->prepared_id, aid) == 0;
	pthread_mutex_unlock(&c->lock);
	if (!ours || strcmp(c->voted_id, aid) == 0)
		return; /* (the coordinator's propose may still be starting it) */
	vote_prepared(c, k, to, aid);
}

/* ------------------------------------------------------ committed config */

void mlfs_attempt_follow(struct mlfs_cluster *c, const struct mlfs_jobkeys *k)
{
	struct mlfs_store *st = c->st;
	struct ptc_error err = {.text = ""};
	int64_t have = mlfs_cluster_version(st);
	int64_t committed = k->committed;

	if (k->schema && !st->schema)
		mlfs_store_install_schema(st, k->schema->value, k->schema->len, &err);
	if (k->config && have == 0 && st->schema) {
		/* A job that already saved state (the config changed since the
		 * first, or a rank saved a step): this node restarted, and its
		 * partitions, zeros now, are not the job's. */
		bool saved = k->config->version > 1;
		const char *id;
		json_t *e;
		json_object_foreach(k->nodes, id, e)
		{
			const char *rk;
			json_t *step;
			json_object_foreach(json_object_get(e, "steps"), rk, step)
			{
				saved |= json_integer_value(step) > 0;
			}
		}
		if (mlfs_store_install_config(st, k->config->value, k->config->len, &err) == 0 &&
		    saved) {
			struct mlfs_view *v = mlfs_store_view(st);
			atomic_store(&st->lost, v && v->layout.node_nranks[st->node] > 0);
			mlfs_view_put(v);
			if (atomic_load(&st->lost))
				mlfs_store_note_error(st,
						      "this node restarted: its partitions are "
						      "empty, not the job's; a config that "
						      "drops it is served from the other nodes");
		}
		return;
	}
	int64_t target;
	enum mlfs_reconf_state s = reconf_state(st, &target, NULL);
	bool active = s == MLFS_RECONF_PREPARING || s == MLFS_RECONF_PREPARED;
	if (have && committed > have && !active && !atomic_load(&st->lost)) {
		/* Cut off from etcd while the job moved on: what this node holds
		 * is an old layout's, not the job's. */
		char msg[256];
		snprintf(msg, sizeof(msg),
			 "this node missed the commit of version %" PRId64
			 " (it holds version %" PRId64 "): restart it to rejoin the job",
			 committed, have);
		atomic_store(&st->lost, true);
		mlfs_store_note_error(st, msg);
	}
	if (atomic_load(&st->lost) && have >= committed) { /* lost until it has no ranks */
		struct mlfs_view *v = mlfs_store_view(st);
		if (v && v->layout.node_nranks[st->node] == 0)
			atomic_store(&st->lost, false);
		mlfs_view_put(v);
	}
	if (active && committed == target) {
		if (s == MLFS_RECONF_PREPARED && mlfs_reconf_commit(st, target, &err) == 0 &&
		    c->job && c->job_to == target) {
			pthread_mutex_lock(&st->lock); /* the coordinator's job/, as committed */
			struct mlfs_job *old = st->job;
			st->job = c->job;
			pthread_mutex_unlock(&st->lock);
			mlfs_job_free(old);
			c->job = NULL;
			c->job_to = 0;
		}
		return; /* still building: committed once prepared */
	}
	int64_t att = k->attempt_j ? json_integer_value(json_object_get(k->attempt_j, "to")) : 0;
	if (active && att != target && committed != target) {
		char kr[512], reason[700] = "the attempt vanished (its coordinator is "
					    "down or lost etcd)";
		struct ptc_error why;
		struct net_etcd_kv r;
		mlfs_jobkeys_name(c, kr, sizeof(kr), "result/%" PRId64, target);
		if (net_etcd_get(c->etcd, kr, &r, NULL, &why) == 0) {
			snprintf(reason, sizeof(reason), "%s", r.value);
			free(r.key);
			free(r.value);
		}
		mlfs_reconf_abort(st, target, reason, &err);
		mlfs_job_free(c->job);
		c->job = NULL;
		c->job_to = 0;
	}
}
