/*
 * mlfs_round.c - what a round of the control thread knows: the snapshot
 * that mlfs_decide reads (mlfs_decide.c, pure), built from the job's keys
 * as this node follows them (mlfs_jobkeys.c), the votes and swap acks in
 * the coordinator's box (mlfs_votebox.c) or in the entries, and this
 * node's store. mlfs_attempt.c decides on it and acts.
 *
 * Threads: the rounds' (round_lock: the control thread's, or the job
 * watch's: mlfs_cluster.c's keys_changed). It reads the store and @c under their
 * locks, one at a time, and holds none when it returns.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* The vote @v (a vote key's value) on attempt @aid, and its reason. */
static enum mlfs_vote vote_in(const struct net_etcd_kv *v, const char *aid, const char **reason)
{
	size_t n = strlen(aid);

	*reason = NULL;
	if (strncmp(v->value, aid, n) != 0 || v->value[n] != ' ')
		return MLFS_VOTE_NONE; /* none yet for this attempt */
	if (strcmp(v->value + n + 1, "ready") == 0 || strcmp(v->value + n + 1, "swapped") == 0)
		return MLFS_VOTE_READY; /* swapped: it was ready, and etcd committed it */
	*reason = v->value + n + 1;
	if (strncmp(*reason, "failed: ", 8) == 0)
		*reason += 8;
	return MLFS_VOTE_FAILED;
}

/* The participants' votes on attempt @aid (to @to) in @k (the votebox's:
 * a coordinator's) into @r's nodes, found by @keys. */
static void votes_on(const struct mlfs_jobkeys *k, int64_t to, const char *aid,
		     const struct mlfs_snap_key *keys, struct mlfs_round *r, int nnodes)
{
	char pre[32];
	snprintf(pre, sizeof(pre), "%" PRId64 "/", to);
	size_t plen = strlen(pre);
	for (size_t i = 0; i < k->nvotes; i++) {
		const char *key = k->votes[i].key;
		if (strncmp(key, pre, plen) != 0)
			continue;
		int n = mlfs_snap_find(keys, nnodes, key + plen, strlen(key + plen));
		if (n >= 0 && r->nodes[n].participant)
			r->nodes[n].vote = vote_in(&k->votes[i], aid, &r->nodes[n].reason);
	}
}

/* The votes on attempt @aid (to @to) that participants without one in
 * the box put in their entries (@k's nodes), because the coordinator's
 * peer server did not take them (mlfs_attempt.c's vote_in_entry). */
static void entry_votes_on(const struct mlfs_jobkeys *k, int64_t to, const char *aid,
			   struct mlfs_round *r, int nnodes)
{
	for (int n = 0; n < nnodes; n++) {
		struct mlfs_snap_node *sn = &r->nodes[n];
		const json_t *v = json_object_get(json_object_get(k->nodes, sn->id), "vote");
		const char *va = json_string_value(json_object_get(v, "attempt"));
		const char *vv = json_string_value(json_object_get(v, "vote"));
		if (!sn->participant || sn->vote != MLFS_VOTE_NONE || !va || !vv ||
		    strcmp(va, aid) != 0 || json_integer_value(json_object_get(v, "to")) != to)
			continue;
		bool ready = strcmp(vv, "ready") == 0;
		sn->vote = ready ? MLFS_VOTE_READY : MLFS_VOTE_FAILED;
		sn->reason = ready ? NULL : strncmp(vv, "failed: ", 8) == 0 ? vv + 8 : vv;
	}
}

/* The swap acks in @k's votes (the box's: a coordinator's) for the commit
 * @k has: a node that acked it serves its version, though its entry (put
 * after the release) says the one before. */
static void acks_on(const struct mlfs_jobkeys *k, const struct mlfs_snap_key *keys,
		    struct mlfs_round *r, int nnodes)
{
	char pre[32];
	snprintf(pre, sizeof(pre), "%" PRId64 "/", k->committed);
	size_t plen = strlen(pre), alen = strlen(k->config_id);
	for (size_t i = 0; i < k->nvotes; i++) {
		const char *key = k->votes[i].key, *v = k->votes[i].value;
		if (strncmp(key, pre, plen) != 0 || strncmp(v, k->config_id, alen) != 0 ||
		    strcmp(v + alen, " swapped") != 0)
			continue;
		int n = mlfs_snap_find(keys, nnodes, key + plen, strlen(key + plen));
		if (n >= 0 && r->nodes[n].up && !r->nodes[n].lost &&
		    r->nodes[n].version < k->committed)
			r->nodes[n].version = k->committed;
	}
}

static void ids_free(struct mlfs_snap_ids *m)
{
	json_decref(m->of);
	free(m->idx);
	memset(m, 0, sizeof(*m));
}

void mlfs_snap_cache_free(struct mlfs_snap_cache *m)
{
	free(m->keys);
	ids_free(&m->parts);
	ids_free(&m->waited);
	memset(m, 0, sizeof(*m));
}

/* The index of cluster @cl's ids (@nodes: its nodes, in order), built
 * once per cluster into @m; NULL: out of memory. */
static const struct mlfs_snap_key *cluster_index(struct mlfs_snap_cache *m,
						 const struct ptc_cluster *cl,
						 const struct mlfs_snap_node *nodes)
{
	if (m->cl != cl || !m->keys) {
		struct mlfs_snap_key *keys =
		    realloc(m->keys, (size_t)(cl->nnodes ? cl->nnodes : 1) * sizeof(*keys));
		if (!keys)
			return NULL;
		mlfs_snap_index(nodes, cl->nnodes, keys);
		m->keys = keys;
		m->cl = cl;
	}
	return m->keys;
}

/* The cluster indices of the nodes the JSON array @ids names, found by
 * @keys once per array (@m keeps them while it is the same one). Out of
 * memory: found again at every call, into nothing (*@n 0). */
static const int *ids_indexed(struct mlfs_snap_ids *m, const json_t *ids,
			      const struct ptc_cluster *cl, const struct mlfs_snap_key *keys,
			      size_t *n)
{
	if (m->of != ids || m->cl != cl) {
		ids_free(m);
		size_t cnt = json_array_size(ids);
		int *idx = malloc((cnt ? cnt : 1) * sizeof(*idx));
		if (!idx) {
			*n = 0;
			return NULL;
		}
		for (size_t i = 0; i < cnt; i++) {
			const json_t *p = json_array_get(ids, i);
			const char *id = json_string_value(p);
			idx[i] =
			    id ? mlfs_snap_find(keys, cl->nnodes, id, json_string_length(p)) : -1;
		}
		*m = (struct mlfs_snap_ids){json_incref((json_t *)ids), cl, idx, cnt};
	}
	*n = m->n;
	return m->idx;
}

/* Marks each node named in the JSON array @ids (@m: its indices, kept):
 * a participant of the attempt (@participant), else one the last commit
 * waits for (swap_waited). */
static void mark_ids(struct mlfs_snap_ids *m, const json_t *ids, const struct ptc_cluster *cl,
		     const struct mlfs_snap_key *keys, struct mlfs_round *r, bool participant)
{
	size_t n;
	const int *idx = ids ? ids_indexed(m, ids, cl, keys, &n) : NULL;

	for (size_t i = 0; idx && i < n; i++) {
		if (idx[i] < 0)
			continue;
		if (participant)
			r->nodes[idx[i]].participant = true;
		else
			r->nodes[idx[i]].swap_waited = true;
	}
}

/* This node's vote on attempt @aid, as it put it. */
static enum mlfs_vote own_vote(struct mlfs_cluster *c, const char *aid)
{
	pthread_mutex_lock(&c->lock);
	enum mlfs_vote v = strcmp(c->voted_id, aid) != 0 ? MLFS_VOTE_NONE
			   : c->voted_ready		 ? MLFS_VOTE_READY
							 : MLFS_VOTE_FAILED;
	pthread_mutex_unlock(&c->lock);
	return v;
}

int mlfs_round_snapshot(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, bool etcd_ok,
			struct mlfs_round *r)
{
	struct mlfs_store *st = c->st;
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	struct mlfs_snap *s = &r->s;
	const json_t *parts = k->attempt_j ? json_object_get(k->attempt_j, "participants") : NULL;

	memset(r, 0, sizeof(*r));
	if (!(r->nodes = calloc((size_t)(cl->nnodes ? cl->nnodes : 1), sizeof(*r->nodes))))
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	json_t *swap_wait = json_incref(c->swap_wait); /* replaced, never changed */
	pthread_mutex_unlock(&c->lock);
	r->aid = k->attempt_j ? json_string_value(json_object_get(k->attempt_j, "id")) : NULL;
	if (r->aid) {
		r->att = (struct mlfs_snap_attempt){
		    .id = r->aid,
		    .from = json_integer_value(json_object_get(k->attempt_j, "from")),
		    .to = json_integer_value(json_object_get(k->attempt_j, "to")),
		    .coordinator = json_string_value(json_object_get(k->attempt_j, "coordinator")),
		    .deadline_ms =
			json_integer_value(json_object_get(k->attempt_j, "deadline_ms"))};
		s->attempt = &r->att;
	}
	bool entries = json_object_size(k->nodes) > 0; /* (a node that follows them) */
	for (int n = 0; n < cl->nnodes; n++) {
		struct mlfs_snap_node *sn = &r->nodes[n];
		const json_t *e = entries ? json_object_get(k->nodes, cl->nodes[n].id) : NULL;
		const char *state = json_string_value(json_object_get(e, "state"));
		sn->id = cl->nodes[n].id;
		sn->up = e != NULL;
		sn->version = json_integer_value(json_object_get(e, "version"));
		sn->lost = state && strcmp(state, "lost") == 0;
	}
	const struct mlfs_snap_key *keys = cluster_index(&c->snap, cl, r->nodes);
	if (!keys) {
		json_decref(swap_wait);
		free(r->nodes);
		r->nodes = NULL;
		return -ENOMEM;
	}
	if (r->aid)
		mark_ids(&c->snap.parts, parts, cl, keys, r, true);
	mark_ids(&c->snap.waited, swap_wait, cl, keys, r, false);
	/* Every participant's vote as the coordinator's box has it, for the
	 * coordinator; this node's own as it sent it (the others see no
	 * votes). */
	if (r->aid && k->votes)
		votes_on(k, r->att.to, r->aid, keys, r, cl->nnodes);
	else if (r->aid && r->nodes[st->node].participant)
		r->nodes[st->node].vote = own_vote(c, r->aid);
	if (r->aid && k->nodes_known && r->att.coordinator &&
	    strcmp(r->att.coordinator, c->me) == 0) /* the votes the box did not take */
		entry_votes_on(k, r->att.to, r->aid, r, cl->nnodes);
	if (k->votes && k->committed > 0 && k->config_id) /* swap acks */
		acks_on(k, keys, r, cl->nnodes);
	s->etcd_ok = etcd_ok;
	s->revision = k->revision;
	s->lease_expired = atomic_load(&c->lease_expired);
	s->has_schema = k->schema != NULL;
	s->committed = k->committed > 0 ? k->committed : 0;
	s->commit_id = k->config_id;
	pthread_mutex_lock(&c->publock);
	s->saved_step = c->saved_put; /* read when the daemon started, or put since */
	pthread_mutex_unlock(&c->publock);
	s->nodes = r->nodes;
	s->nnodes = cl->nnodes;
	s->nodes_known = k->nodes_known;
	s->released = k->released;
	s->me = st->node;
	s->now_ms = mlfs_cluster_now_ms();

	/* The store's state and the attempt it speaks for, read together. */
	pthread_mutex_lock(&st->lock);
	s->store_schema = st->schema != NULL;
	s->have = st->view ? st->view->config->version : 0;
	s->hosts_ranks = st->view && st->view->layout.node_nranks[st->node] > 0;
	s->reconf = st->reconf;
	s->target = st->target_version;
	snprintf(r->prepared_id, sizeof(r->prepared_id), "%s", st->attempt_id);
	s->prepare_rev = st->attempt_rev;
	pthread_mutex_unlock(&st->lock);
	s->lost = atomic_load(&st->lost);
	s->prepare_id = r->prepared_id;
	s->retained = mlfs_store_retained(st, NULL);
	json_decref(swap_wait);

	s->restore_id = json_string_value(json_object_get(k->restore_j, "id"));
	s->restore_version = json_integer_value(json_object_get(k->restore_j, "version"));
	pthread_mutex_lock(&c->lock);
	s->coordinating = c->mine && k->attempt && strcmp(c->mine, k->attempt->value) == 0;
	snprintf(r->restore_tried, sizeof(r->restore_tried), "%s", c->restore_tried);
	snprintf(r->import_tried, sizeof(r->import_tried), "%s", c->import_tried);
	pthread_mutex_unlock(&c->lock);
	s->restore_tried = r->restore_tried;
	s->import_id = json_string_value(json_object_get(k->import_j, "id"));
	s->import_version = json_integer_value(json_object_get(k->import_j, "version"));
	s->import_tried = r->import_tried;
	return 0;
}
