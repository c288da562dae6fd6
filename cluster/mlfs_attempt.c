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
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster_i.h"
#include "common/common.h"

/* ---------------------------------------------------------------- votes */

/* A vote the coordinator's peer server did not take (@why: the node is
 * cut off from its port alone, or it is down): put into this node's entry,
 * which the coordinator follows while its attempt runs. 0 when the entry
 * was put; else this node votes again at its next round. */
static int vote_in_entry(struct mlfs_cluster *c, int64_t to, const char *attempt_id,
			 const char *what, const struct ptc_error *why)
{
	struct ptc_error err = {.text = ""};
	json_t *v =
	    json_pack("{sIssss}", "to", (json_int_t)to, "attempt", attempt_id, "vote", what);

	if (!v)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	json_decref(c->entry_vote);
	c->entry_vote = v;
	pthread_mutex_unlock(&c->lock);
	int rc = mlfs_nodeentry_publish(c, &err);
	if (rc)
		mlfs_log(MLFS_LOG_WARNING,
			 "cluster: vote on version %" PRId64 ": %s; nor could it go into this "
			 "node's entry: %s",
			 to, why->text, err.text[0] ? err.text : strerror(-rc));
	else
		mlfs_log(MLFS_LOG_WARNING,
			 "cluster: vote on version %" PRId64 ": %s; put in this node's entry "
			 "instead",
			 to, why->text);
	return rc;
}

/* @what ("ready", "failed: <reason>", "swapped" with this node's entry
 * @e or NULL) on attempt @attempt_id to @to into the box of its
 * @coordinator: this node's own box when it is this node (NULL: this
 * node), else a POST to that node's peer server. 0, or why not with @why. */
static int to_coordinator(struct mlfs_cluster *c, const char *coordinator, int64_t to,
			  const char *attempt_id, const char *what, const struct mlfs_vote_entry *e,
			  struct ptc_error *why)
{
	struct mlfs_store *st = c->st;

	if (!coordinator || strcmp(coordinator, c->me) == 0)
		return st->votebox
			   ? mlfs_votebox_put_entry(st->votebox, c->me, to, attempt_id, what, e)
			   : ptc_error_set(why, -ENOTCONN, "this node has no votebox");
	pthread_mutex_lock(&st->lock);
	int n = ptc_cluster_find(mlfs_store_cluster(st), coordinator);
	pthread_mutex_unlock(&st->lock);
	return n < 0 ? ptc_error_set(why, -ENOENT, "the coordinator %s is not in the cluster",
				     coordinator)
		     : mlfs_peer_vote(st, n, to, attempt_id, what, e, why);
}

static void vote(struct mlfs_cluster *c, const char *coordinator, int64_t to,
		 const char *attempt_id, const char *what)
{
	struct ptc_error why = {.text = ""};

	if (!attempt_id || !*attempt_id)
		return; /* nothing to vote on */
	int rc = to_coordinator(c, coordinator, to, attempt_id, what, NULL, &why);
	if (rc && coordinator && strcmp(coordinator, c->me) != 0)
		rc = vote_in_entry(c, to, attempt_id, what, &why);
	if (rc == 0) {
		pthread_mutex_lock(&c->lock);
		snprintf(c->voted_id, sizeof(c->voted_id), "%s", attempt_id);
		c->voted_ready = strcmp(what, "ready") == 0;
		pthread_mutex_unlock(&c->lock);
	}
}

/* Whether this node's last vote was on attempt @aid. */
static bool voted_on(struct mlfs_cluster *c, const char *aid)
{
	pthread_mutex_lock(&c->lock);
	bool yes = strcmp(c->voted_id, aid) == 0;
	pthread_mutex_unlock(&c->lock);
	return yes;
}

void mlfs_attempt_vote_failed(struct mlfs_cluster *c, const char *coordinator, int64_t to,
			      const char *aid, const char *reason)
{
	char v[700];
	snprintf(v, sizeof(v), "failed: %s", reason);
	vote(c, coordinator, to, aid, v);
}

/* The coordinator the attempt @att names (NULL: none named). */
static const char *coordinator_of(const json_t *att)
{
	return json_string_value(json_object_get(att, "coordinator"));
}

/* ---------------------------------------------------------- coordinator */

/* The coordinator ends its attempt: commit (@reason NULL) or abort. Only
 * while the attempt in etcd is still the one it created. */
static void finish(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to,
		   const char *reason)
{
	char ka[512], kc[512], ki[512], kr[512], res[600];
	struct ptc_error why;
	const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));
	bool ok = false;

	mlfs_jobkeys_name(c, ka, sizeof(ka), "attempt");
	mlfs_jobkeys_name(c, kc, sizeof(kc), "config");
	mlfs_jobkeys_name(c, ki, sizeof(ki), "config_id");
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
	/* The commit: the config and the id of the attempt that committed it
	 * (a node commits what it prepared only under that id: mlfs_decide). */
	struct net_etcd_op commit[] = {
	    {.kind = NET_ETCD_PUT, .key = kc, .value = config, .len = config ? strlen(config) : 0},
	    {.kind = NET_ETCD_PUT, .key = ki, .value = aid, .len = aid ? strlen(aid) : 0},
	    {.kind = NET_ETCD_DELETE, .key = ka},
	    {.kind = NET_ETCD_PUT, .key = kr, .value = res, .len = strlen(res)}};
	const struct net_etcd_op *ops = reason ? commit + 2 : commit;
	size_t nops = reason ? 2 : 4;
	if (net_etcd_txn(c->etcd, &still, 1, ops, nops, NULL, 0, &ok, NULL, NULL, &why) == 0 &&
	    ok) {
		/* The box is not cleared: the participants' swap acks may
		 * arrive before this reply (a vote counts only for the
		 * attempt it names, so the old ones count for nothing). */
		pthread_mutex_lock(&c->lock);
		free(c->mine);
		c->mine = NULL;
		c->mine_rev = 0;
		if (!reason) { /* it follows the swaps and says when all are done */
			c->announce = to;
			c->acked_to = to;
			snprintf(c->acked_id, sizeof(c->acked_id), "%s", aid ? aid : "");
		}
		pthread_mutex_unlock(&c->lock);
	}
	free(mine);
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

	*dn =
	    (struct mlfs_reconf_down){.down = d,
				      .backup_of = b,
				      .nbackup = cl->nnodes,
				      .source = json_integer_value(json_object_get(att, "source"))};
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

/* The ranks of the other nodes take @step, the one the live ranks agreed
 * on when the attempt was proposed (mlfs_propose.c checked every live
 * rank's; the ranks of down nodes come from other copies, which saved
 * it): this node does not follow the other nodes' entries. -1: unknown,
 * the table stays. */
static void set_job_steps(struct mlfs_cluster *c, int64_t step)
{
	struct mlfs_store *st = c->st;
	pthread_mutex_lock(&st->lock);
	if (st->view && step >= 0) {
		const struct ptc_layout *l = &st->view->layout;
		for (int r = 0; r < l->world; r++)
			if (l->ranks[r].node != st->node)
				st->steps[r] = step;
	}
	pthread_mutex_unlock(&st->lock);
}

int mlfs_attempt_prepare(struct mlfs_cluster *c, int64_t step, const char *aid, int64_t rev,
			 const char *config, size_t len, const struct mlfs_reconf_down *dn,
			 const json_t *parts, const char *coordinator, struct ptc_error *err)
{
	int rc;

	struct mlfs_reconf_down named = *dn;

	named.id = aid;
	named.rev = rev;
	pthread_mutex_lock(&c->lock);
	json_decref(c->prep_parts);
	c->prep_parts = json_deep_copy(parts);
	snprintf(c->prep_aid, sizeof(c->prep_aid), "%s", aid);
	snprintf(c->prep_coord, sizeof(c->prep_coord), "%s", coordinator ? coordinator : "");
	pthread_mutex_unlock(&c->lock);
	set_job_steps(c, step);
	rc = config ? mlfs_reconf_prepare_down(c->st, config, len, "attempt", false, &named, err)
		    : -EINVAL;
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

/* The step attempt @a says the live ranks agreed on (-1: none). */
static int64_t attempt_step(const json_t *a)
{
	const json_t *step = json_object_get(a, "step");
	return json_is_integer(step) ? json_integer_value(step) : -1;
}

/* PREPARE: starts preparing the attempt of @k in the store, once (the
 * coordinator's propose may be starting it: started_id says so). */
static void act_prepare(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, const char *aid,
			int64_t to)
{
	struct ptc_error err = {.text = ""};

	pthread_mutex_lock(&c->lock);
	bool start = strcmp(c->started_id, aid) != 0;
	if (start)
		snprintf(c->started_id, sizeof(c->started_id), "%s", aid);
	pthread_mutex_unlock(&c->lock);
	if (!start)
		return;
	const char *by = json_string_value(json_object_get(k->attempt_j, "by"));
	if (strcmp(c->failpoint, "ignore-controller-attempts") == 0 && by &&
	    strcmp(by, "controller") == 0) {
		/* a participant that never prepares the controller's attempts */
		mlfs_log(MLFS_LOG_WARNING, "cluster: failpoint ignore-controller-attempts: "
					   "not preparing");
		return;
	}
	const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
	struct mlfs_reconf_down dn;
	int rc = mlfs_attempt_down(c->st, k->attempt_j, &dn);
	if (rc == 0)
		rc = mlfs_attempt_prepare(
		    c, attempt_step(k->attempt_j), aid, k->attempt->mod_revision, config,
		    config ? strlen(config) : 0, &dn, json_object_get(k->attempt_j, "participants"),
		    coordinator_of(k->attempt_j), &err);
	mlfs_attempt_down_free(&dn);
	if (rc)
		mlfs_attempt_vote_failed(c, coordinator_of(k->attempt_j), to, aid,
					 err.text[0] ? err.text : strerror(-rc));
}

/* VOTE_READY: the prepared attempt's job/ staged, then the vote. */
static void act_vote_ready(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, const char *aid,
			   int64_t to)
{
	if (voted_on(c, aid))
		return; /* voted: the coordinator has it */
	if (mlfs_cluster_ids_has(json_object_get(k->attempt_j, "job_missing"), c->me)) {
		mlfs_attempt_vote_failed(c, coordinator_of(k->attempt_j), to, aid,
					 "the coordinator could not read this node's job/");
		return;
	}
	const char *co = json_string_value(json_object_get(k->attempt_j, "coordinator"));
	if (co && (c->job_to != to || !c->job)) {
		struct ptc_error why;
		struct mlfs_job *j;
		if (mlfs_jobsync_stage(c->st, json_object_get(k->attempt_j, "job"), co, &j, &why)) {
			mlfs_attempt_vote_failed(c, coordinator_of(k->attempt_j), to, aid,
						 why.text);
			return;
		}
		mlfs_job_free(c->job);
		c->job = j;
		c->job_to = to;
	}
	vote(c, co, to, aid, "ready");
}

/* This node swapped to @version, which attempt @aid committed: its ack
 * ("swapped") to that attempt's coordinator @co, which releases the
 * retained layouts once every participant's ack (or entry) shows the swap
 * (mlfs_decide's rule 8). The ack carries this node's new entry, which the
 * coordinator's announcement of the release puts with the others' in one
 * transaction (act_announce); when it did not, the node's own put follows
 * the release (round_once), off the path the release waits for. Whether
 * the coordinator took it; else the entry says it at once. */
static bool swap_ack(struct mlfs_cluster *c, int64_t version, const char *aid, const char *co)
{
	struct ptc_error why = {.text = ""};
	struct mlfs_vote_entry e;

	if (!*aid || !*co)
		return false;
	bool with = mlfs_nodeentry_for_ack(c, version, &e) == 0;
	if (strcmp(c->failpoint, "put-entry-after-ack") == 0) {
		/* a put of this node's own after its ack took the entry (a
		 * step saved before the announcement): the announcement must
		 * not put the older entry the ack carries over it */
		mlfs_log(MLFS_LOG_WARNING, "cluster: failpoint put-entry-after-ack");
		pthread_mutex_lock(&c->publock);
		free(c->published);
		c->published = NULL; /* puts it again, as it is */
		pthread_mutex_unlock(&c->publock);
		mlfs_nodeentry_publish(c, &why);
	}
	int rc = to_coordinator(c, co, version, aid, "swapped", with ? &e : NULL, &why);
	if (with)
		mlfs_nodeentry_acked(c, rc == 0);
	if (rc)
		mlfs_log(MLFS_LOG_WARNING,
			 "cluster: the swap to version %" PRId64
			 " cannot reach the coordinator: %s; this node's entry says it instead",
			 version, why.text[0] ? why.text : strerror(-rc));
	return rc == 0;
}

/* COMMIT: the prepared layout, which etcd committed, becomes current; the
 * coordinator's job/ with it. */
static void act_commit(struct mlfs_cluster *c, int64_t version)
{
	struct mlfs_store *st = c->st;
	struct ptc_error err = {.text = ""};

	if (strcmp(c->failpoint, "stall-before-swap") == 0) {
		/* a node that dies between its vote and its swap, its lease alive */
		mlfs_log(MLFS_LOG_WARNING, "cluster: failpoint stall-before-swap: stalled");
		while (!atomic_load(&c->stop))
			usleep(100 * 1000);
		return;
	}
	if (mlfs_reconf_commit(st, version, &err) != 0)
		return;
	char aid[sizeof(c->prep_aid)], co[sizeof(c->prep_coord)];
	pthread_mutex_lock(&c->lock); /* the retained layout waits for these */
	json_decref(c->swap_wait);
	c->swap_wait = c->prep_parts;
	c->swap_since_ms = mlfs_cluster_now_ms();
	c->swap_version = version;
	c->prep_parts = NULL;
	memcpy(aid, c->prep_aid, sizeof(aid));
	memcpy(co, c->prep_coord, sizeof(co));
	pthread_mutex_unlock(&c->lock);
	if (c->job && c->job_to == version) {
		/* This node's job/ writes since the coordinator read its
		 * manifest are newer than the staged tree's copies, or absent
		 * from it: taken in, so that none is lost (the next commit's
		 * union brings them to the other nodes). When they cannot be
		 * (memory; a file against a directory), the live tree stays:
		 * this node's job/ differs from the others' until then. */
		int kept = 0;
		pthread_mutex_lock(&st->lock);
		struct mlfs_job *old = st->job;
		int rc = mlfs_job_keep_newer(c->job, old, &kept);
		if (rc == 0)
			st->job = c->job;
		pthread_mutex_unlock(&st->lock);
		if (rc)
			mlfs_log(MLFS_LOG_WARNING,
				 "cluster: job/ of version %" PRId64 " not taken: this node's "
				 "job/ written during the reconfiguration cannot join it (%s); "
				 "it stays as it is until the next commit",
				 version, strerror(-rc));
		else if (kept)
			mlfs_log(MLFS_LOG_INFO,
				 "cluster: %d job/ file(s) written during the reconfiguration to "
				 "version %" PRId64 " kept",
				 kept, version);
		mlfs_job_free(rc ? c->job : old);
		c->job = NULL;
		c->job_to = 0;
	}
	/* the entry put after the release says what job/ is now: where no
	 * node wrote during the attempt, the same on every node */
	mlfs_jobsync_note_digest(c);
	/* the ack last: the entry it carries says job/ as swapped in */
	int nnodes = mlfs_store_cluster(st)->nnodes;
	if (swap_ack(c, version, aid, co)) {
		/* the entry's put waits for the release (round_once), or for
		 * as long as this node waits for it before it reads the
		 * entries itself (need_peers) */
		c->publish_after = version;
		c->publish_at_ms = mlfs_cluster_now_ms() + mlfs_release_wait_ms(nnodes);
	} else { /* the N entry puts after a commit, spread past 1,000 nodes */
		c->publish_after = 0;
		c->publish_at_ms = mlfs_cluster_now_ms() + mlfs_publish_delay_ms(nnodes, st->node);
	}
}

/* DISCARD: the store's attempt to @version, which etcd will never commit,
 * aborted; the coordinator's result, when etcd has it, says why. */
static void act_discard(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t version,
			const char *why)
{
	struct ptc_error err = {.text = ""};
	char kr[512];
	const char *reason = why;

	mlfs_jobkeys_name(c, kr, sizeof(kr), "result/%" PRId64, version);
	for (size_t i = 0; i < k->n; i++)
		if (strcmp(k->kvs[i].key, kr) == 0 && strncmp(k->kvs[i].value, "aborted: ", 9) == 0)
			reason = k->kvs[i].value + 9; /* the store says "aborted: " */
	mlfs_reconf_abort(c->st, version, reason, &err);
	mlfs_job_free(c->job);
	c->job = NULL;
	c->job_to = 0;
}

/* RELEASE_RETAINED: every node of the last commit swapped; the layout
 * planned from goes (/v1/health says so). */
static void act_release(struct mlfs_cluster *c, int64_t version)
{
	if (mlfs_store_release_retained(c->st, version) != 1)
		return;
	pthread_mutex_lock(&c->lock);
	json_decref(c->swap_wait);
	c->swap_wait = NULL;
	c->announce = 0;
	pthread_mutex_unlock(&c->lock);
	mlfs_log(MLFS_LOG_INFO,
		 "cluster: every node of the last commit swapped: layout version %" PRId64
		 " released",
		 version);
}

int mlfs_announce_entries(struct net_etcd *etcd, const char *nprefix, const char *k,
			  const char *plain, int64_t version, const json_t *ents, int64_t *rev,
			  bool *all, struct ptc_error *why)
{
	size_t n = json_object_size(ents), i = 0;
	struct net_etcd_cmp *cmps = calloc(n, sizeof(*cmps));
	struct net_etcd_op *ops = calloc(n + 1, sizeof(*ops));
	char **keys = calloc(n, sizeof(*keys));
	json_t *ids = json_array(), *e;
	const char *id;
	char *value = NULL;
	int rc = -ENOMEM;

	*rev = 0;
	*all = false;
	if (!cmps || !ops || !keys || !ids)
		goto out;
	json_object_foreach((json_t *)ents, id, e)
	{
		if (asprintf(&keys[i], "%s%s", nprefix, id) < 0) {
			keys[i] = NULL;
			goto out;
		}
		const char *text = json_string_value(json_object_get(e, "entry"));
		cmps[i] =
		    (struct net_etcd_cmp){.key = keys[i],
					  .target = NET_ETCD_MOD,
					  .result = NET_ETCD_EQUAL,
					  .num = json_integer_value(json_object_get(e, "rev"))};
		ops[i] =
		    (struct net_etcd_op){.kind = NET_ETCD_PUT,
					 .key = keys[i],
					 .value = text,
					 .len = strlen(text),
					 .lease = json_integer_value(json_object_get(e, "lease"))};
		json_array_append_new(ids, json_string(id));
		i++;
	}
	json_t *o = json_pack("{sIsO}", "version", (json_int_t)version, "entries", ids);
	value = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!value)
		goto out;
	ops[n] = (struct net_etcd_op){
	    .kind = NET_ETCD_PUT, .key = k, .value = value, .len = strlen(value)};
	struct net_etcd_op alone = {
	    .kind = NET_ETCD_PUT, .key = k, .value = plain, .len = strlen(plain)};
	rc = net_etcd_txn(etcd, cmps, n, ops, n + 1, &alone, 1, all, rev, NULL, why);
	if (rc || !*all)
		*rev = 0;
out:
	for (size_t j = 0; keys && j < n; j++)
		free(keys[j]);
	free(keys);
	free(cmps);
	free(ops);
	free(value);
	json_decref(ids);
	return rc;
}

/* ANNOUNCE_RELEASED: this node saw every participant of the commit of
 * @version swap; the others, which do not read the entries, learn it from
 * the "released" key. When this node made that commit, the entries its
 * participants' swap acks carried go in the same transaction (the N entry
 * puts that would follow the release become one write). A failed put is
 * only logged: they read the entries themselves after 2 s. */
static void act_announce(struct mlfs_cluster *c, int64_t version)
{
	char k[512], v[32];
	struct ptc_error why;

	/* status.json now shows every node at @version (its swap acks): a
	 * waiting mlfs reconfigure returns */
	mlfs_store_status_changed(c->st);
	mlfs_jobkeys_name(c, k, sizeof(k), "released");
	snprintf(v, sizeof(v), "%" PRId64, version);
	pthread_mutex_lock(&c->lock);
	char aid[sizeof(c->acked_id)];
	snprintf(aid, sizeof(aid), "%s", c->acked_to == version ? c->acked_id : "");
	pthread_mutex_unlock(&c->lock);
	json_t *ents = aid[0] && c->st->votebox ? mlfs_votebox_entries(c->st->votebox, aid) : NULL;
	size_t n = json_object_size(ents);
	int64_t rev = 0;
	bool all = false;
	int rc =
	    n > 0 && n <= MLFS_ANNOUNCE_ENTRIES_MAX
		? mlfs_announce_entries(c->etcd, c->nprefix, k, v, version, ents, &rev, &all, &why)
		: -EAGAIN;
	if (rc == 0 && !all)
		mlfs_log(MLFS_LOG_INFO,
			 "cluster: a node put its entry after its swap ack to version %" PRId64
			 ": the release announced alone, every node puts its own",
			 version);
	if (rc == 0 && rev) /* its own entry, when its own ack carried it */
		mlfs_nodeentry_adopt(c, version, json_object_get(ents, c->me) != NULL, rev);
	json_decref(ents);
	if (rc && rc != -EAGAIN)
		mlfs_log(MLFS_LOG_INFO,
			 "cluster: the release of version %" PRId64
			 " announced without the entries: %s",
			 version, why.text);
	if (rc && net_etcd_put(c->etcd, k, v, strlen(v), 0, NULL, &why))
		mlfs_log(MLFS_LOG_WARNING,
			 "cluster: cannot announce the release of version %" PRId64 ": %s", version,
			 why.text);
	pthread_mutex_lock(&c->lock);
	if (c->announce <= version)
		c->announce = 0;
	pthread_mutex_unlock(&c->lock);
	if (c->publish_after && c->publish_after <= version) {
		c->publish_after = 0; /* its own entry, at the end of this round */
		c->publish_at_ms = 0;
	}
}

/* MARK_LOST: this node's partitions are not the job's, when its layout
 * places ranks on it. */
static void act_mark_lost(struct mlfs_cluster *c, const char *reason)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	bool hosts = v && v->layout.node_nranks[c->st->node] > 0;

	mlfs_view_put(v);
	if (!hosts || atomic_load(&c->st->lost))
		return;
	atomic_store(&c->st->lost, true);
	mlfs_store_note_error(c->st, reason);
	mlfs_log(MLFS_LOG_WARNING, "cluster: %s", reason);
}

/* RESTORE (rule 10): this lost node reads its ranks' boxes of the
 * snapshot that etcd's "restore" key names (`mlfs resume`); once they are
 * in, its partitions are the job's again. Runs once per key: the outcome
 * goes into the node's entry ("restore"), which the command waits for. */
static void act_restore(struct mlfs_cluster *c, const struct mlfs_jobkeys *k)
{
	struct mlfs_store *st = c->st;
	const char *id = json_string_value(json_object_get(k->restore_j, "id"));
	const char *dir = json_string_value(json_object_get(k->restore_j, "dir"));
	json_t *step = json_object_get(k->restore_j, "step");
	struct ptc_error err = {.text = ""};
	int rc;

	pthread_mutex_lock(&c->lock);
	snprintf(c->restore_tried, sizeof(c->restore_tried), "%s", id ? id : "");
	/* under way: an entry put meanwhile (a backup's, a step's) says this
	 * id and no error, not the previous restore's error under this id
	 * (the command would report that failure for this run) */
	c->restore_error[0] = '\0';
	pthread_mutex_unlock(&c->lock);
	if (!dir || !json_is_integer(step))
		rc = ptc_errorf(&err, "resume: the restore key names no snapshot");
	else
		rc = mlfs_store_import(st, dir, -1, json_integer_value(step), &err);
	if (rc == 0) {
		atomic_store(&st->lost, false);
		pthread_mutex_lock(&st->lock);
		st->error[0] = '\0';
		pthread_mutex_unlock(&st->lock);
		mlfs_store_status_changed(st);
		mlfs_log(MLFS_LOG_INFO, "cluster: restored step %" JSON_INTEGER_FORMAT " from %s",
			 json_integer_value(step), dir);
	} else {
		mlfs_log(MLFS_LOG_ERROR, "cluster: resume from %s: %s", dir ? dir : "?", err.text);
	}
	pthread_mutex_lock(&c->lock);
	snprintf(c->restore_error, sizeof(c->restore_error), "%s", rc ? err.text : "");
	pthread_mutex_unlock(&c->lock);
	if (st->steps_saved)
		st->steps_saved(st->cluster_arg); /* the entry and saved/<id>, now */
}

static void act(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, const struct mlfs_round *r,
		const struct mlfs_action *a)
{
	struct mlfs_store *st = c->st;
	struct ptc_error err = {.text = ""};

	switch (a->kind) {
	case MLFS_ACT_REGISTER:
		if (mlfs_nodeentry_register(c, &err))
			mlfs_log(MLFS_LOG_WARNING, "cluster: cannot register again: %s", err.text);
		else
			mlfs_log(MLFS_LOG_WARNING, "cluster: this node's lease had expired (was it "
						   "frozen or cut off?): registered again");
		break;
	case MLFS_ACT_INSTALL_SCHEMA:
		mlfs_store_install_schema(st, k->schema->value, k->schema->len, &err);
		break;
	case MLFS_ACT_INSTALL_CONFIG:
		mlfs_store_install_first_config(st, k->config->value, k->config->len, &err);
		break;
	case MLFS_ACT_MARK_LOST:
		act_mark_lost(c, a->reason);
		break;
	case MLFS_ACT_CLEAR_LOST:
		atomic_store(&st->lost, false);
		mlfs_store_status_changed(st);
		break;
	case MLFS_ACT_RESTORE:
		act_restore(c, k);
		break;
	case MLFS_ACT_IMPORT:
		mlfs_jobimport_act(c, k->import_j);
		break;
	case MLFS_ACT_PREPARE:
		act_prepare(c, k, r->aid, a->version);
		break;
	case MLFS_ACT_VOTE_READY:
		act_vote_ready(c, k, r->aid, a->version);
		break;
	case MLFS_ACT_VOTE_FAILED:
		if (!voted_on(c, r->aid)) {
			struct ptc_error store;
			int64_t target;
			reconf_state(st, &target, &store);
			mlfs_attempt_vote_failed(c, coordinator_of(k->attempt_j), a->version,
						 r->aid, a->reason[0] ? a->reason : store.text);
		}
		break;
	case MLFS_ACT_COMMIT:
		act_commit(c, a->version);
		break;
	case MLFS_ACT_DISCARD:
		act_discard(c, k, a->version, a->reason);
		break;
	case MLFS_ACT_FINISH_COMMIT:
		finish(c, k, a->version, NULL);
		break;
	case MLFS_ACT_FINISH_ABORT:
		finish(c, k, a->version, a->reason);
		break;
	case MLFS_ACT_RELEASE_RETAINED:
		act_release(c, a->version);
		break;
	case MLFS_ACT_ANNOUNCE_RELEASED:
		act_announce(c, a->version);
		break;
	}
}

void mlfs_attempt_round(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, bool etcd_ok)
{
	struct mlfs_action acts[MLFS_DECIDE_MAX];
	/* A second pass when a prepare's build ended on this thread (it moved
	 * nothing over the network: mlfs_reconf_prepare's inline build): its
	 * vote goes now, not in a round of its own. */
	for (int pass = 0; pass < 2; pass++) {
		struct mlfs_round r;
		bool again = false;
		if (mlfs_round_snapshot(c, k, etcd_ok, &r))
			return;
		int n = mlfs_decide(&r.s, acts);
		for (int i = 0; i < n; i++) {
			mlfs_log(MLFS_LOG_DEBUG, "cluster: %s(%" PRId64 ")%s%s",
				 mlfs_act_name(acts[i].kind), acts[i].version,
				 acts[i].reason[0] ? ": " : "", acts[i].reason);
			/* A prepare's start and a commit change the store's state
			 * on this thread: no round follows them (nothing to do),
			 * unless the commit did not end idle (a failed commit: the
			 * next round sees it). The end of a prepare's build on its
			 * own thread wakes a round; one that ended here makes a
			 * second pass. */
			bool own =
			    acts[i].kind == MLFS_ACT_PREPARE || acts[i].kind == MLFS_ACT_COMMIT;
			mlfs_cluster_own_changes(own);
			act(c, k, &r, &acts[i]);
			mlfs_cluster_own_changes(false);
			int64_t target = 0;
			enum mlfs_reconf_state s =
			    own ? reconf_state(c->st, &target, NULL) : MLFS_RECONF_IDLE;
			if (acts[i].kind == MLFS_ACT_COMMIT && s != MLFS_RECONF_IDLE)
				mlfs_cluster_wake(c);
			if (acts[i].kind == MLFS_ACT_PREPARE && target == acts[i].version &&
			    (s == MLFS_RECONF_PREPARED || s == MLFS_RECONF_FAILED))
				again = true;
		}
		free(r.nodes);
		if (!again)
			break;
	}
}

void mlfs_attempt_waiting(struct mlfs_cluster *c, char *buf, size_t cap)
{
	struct mlfs_store *st = c->st;
	int64_t target;
	enum mlfs_reconf_state s = reconf_state(st, &target, NULL);

	buf[0] = '\0';
	if (s != MLFS_RECONF_PREPARED)
		return;
	char id[24];
	pthread_mutex_lock(&st->lock);
	snprintf(id, sizeof(id), "%s", st->attempt_id);
	pthread_mutex_unlock(&st->lock);
	pthread_mutex_lock(&c->lock);
	bool voted = c->voted_id[0] && strcmp(c->voted_id, id) == 0;
	const char *etcd = c->etcd_error,
		   *aid = json_string_value(json_object_get(c->attempt, "id"));
	const char *co = aid && strcmp(aid, id) == 0 ? coordinator_of(c->attempt) : NULL;
	if (voted)
		snprintf(buf, cap, "etcd's decision on version %" PRId64 "%s%s%s", target,
			 etcd[0] ? " (etcd unreachable: " : "", etcd, etcd[0] ? ")" : "");
	else if (co) /* its vote not delivered yet (the coordinator unreachable, or etcd) */
		snprintf(buf, cap,
			 "its vote on version %" PRId64 " to reach the coordinator %s, then "
			 "etcd's decision%s%s%s",
			 target, co, etcd[0] ? " (etcd unreachable: " : "", etcd,
			 etcd[0] ? ")" : "");
	pthread_mutex_unlock(&c->lock);
}
