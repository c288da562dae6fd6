/*
 * sim_node.c - a simulated node's rounds (mlfs_cluster.c's round_once,
 * mlfs_attempt.c's mlfs_attempt_round): the snapshot handed to the real
 * mlfs_decide, and the actions carried out with the daemon's requests (to
 * etcd: its entry, its lease, the announcement; to the coordinator's peer
 * server: its vote) on its simulated store.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

/* ------------------------------------------------------- node actions */

/* Layout 1 places rank i on node i; layout 2 rank i on node i of the
 * first half. */
static bool hosts_ranks(const struct node *nd)
{
	return nd->have == 1 || (nd->have == 2 && nd->idx < (S.n + 1) / 2);
}

/* Its entry as mlfs_nodeentry.c's node_entry and mlfs_nodeentry_publish
 * write it: addr, devices, pid, version, its ranks' saved steps, and its
 * last settled state (idle, failed, lost: never a passing one). */
char *entry_text(const struct node *nd, char *state)
{
	char addr[32], rank[16];
	json_t *steps = json_object();
	snprintf(addr, sizeof(addr), "10.%d.%d.%d:7070", nd->idx >> 16 & 255, nd->idx >> 8 & 255,
		 nd->idx & 255);
	if (hosts_ranks(nd)) {
		snprintf(rank, sizeof(rank), "%d", nd->idx);
		json_object_set_new(steps, rank, json_integer(0));
	}
	bool settled = nd->reconf == MLFS_RECONF_IDLE || nd->reconf == MLFS_RECONF_FAILED;
	if (nd->lost)
		snprintf(state, 16, "lost");
	else if (settled || !state[0])
		snprintf(state, 16, "%s",
			 mlfs_reconf_state_name(settled ? nd->reconf : MLFS_RECONF_IDLE));
	json_t *o = json_pack("{sssisisIsOss}", "addr", addr, "devices", 1, "pid", 4242 + nd->idx,
			      "version", (json_int_t)nd->have, "steps", steps, "state", state);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	json_decref(steps);
	if (!s)
		die("out of memory");
	return s;
}

/* mlfs_nodeentry_publish: its entry (/mlfs-nodes/<job>/<id>) put when it
 * changed. */
static void publish(struct worker *w, struct node *nd)
{
	char k[256];
	struct ptc_error err;
	int64_t lease = atomic_load(&nd->lease);
	char *e = entry_text(nd, nd->entry_state);

	if (!lease || (nd->published && strcmp(nd->published, e) == 0)) {
		free(e);
		return;
	}
	snprintf(k, sizeof(k), "%s%s", S.nprefix, nd->id);
	c_add(C_PUT, 1);
	int64_t rev = 0;
	if (net_etcd_put_rev(w->etcd, k, e, strlen(e), lease, &rev, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: put entry: %s\n", nd->id, err.text);
		nd->publish_failed = true;
		nd->published_rev = 0;
		free(e);
		return;
	}
	nd->publish_failed = false;
	free(nd->published);
	nd->published = e;
	nd->published_rev = rev;
	int target = atomic_load(&S.target);
	if (nd->have == target && nd->published_v != target) { /* the job sees its swap */
		nd->published_v = target;
		c_add(C_PUBLISHED, 1);
		c_max(C_LAST_PUBLISHED, wall_ns());
	}
}

/* mlfs_nodeentry_register: a new lease and its entry put under it. */
int do_register(struct worker *w, struct node *nd)
{
	struct ptc_error err;
	int64_t lease;
	c_add(C_GRANT, 1);
	if (net_etcd_lease_grant(w->etcd, S.ttl, &lease, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: lease grant: %s\n", nd->id, err.text);
		return -1;
	}
	free(nd->published); /* the entry went with the old lease */
	nd->published = NULL;
	nd->published_rev = 0;
	atomic_store(&nd->lease, lease);
	atomic_store(&nd->lease_expired, false);
	publish(w, nd);
	return 0;
}

/* mlfs_attempt.c's vote: "ready" or "failed: <reason>" on attempt @aid
 * to @to, to its @coordinator: the coordinator's own straight into its box
 * (mlfs_votebox_put), any other node's by mlfs_peerclient.c's
 * mlfs_peer_vote (POST /v1/vote to n0's peer server, the token in its
 * header, within 2 s; a vote given twice is the same vote). One that
 * failed is only said: the node votes again at its next round. Also the
 * swap's ack ("swapped", mlfs_attempt.c's swap_ack). Whether it was
 * taken. */
static bool vote(struct worker *w, struct node *nd, const char *coordinator, int64_t to,
		 const char *aid, const char *what)
{
	bool ack = strcmp(what, "swapped") == 0;
	struct ptc_error err = {.text = ""};
	struct mlfs_vote_entry e = {0};
	int rc;

	if (!aid || !*aid)
		return false;  /* nothing to vote on */
	free(nd->acked_entry); /* mlfs_nodeentry_for_ack: its swap ack carries its entry */
	nd->acked_entry = NULL;
	if (ack && atomic_load(&nd->lease) && nd->published && nd->published_rev) {
		nd->acked_entry = entry_text(nd, nd->entry_state);
		nd->acked_entry_to = to;
		nd->acked_entry_base = nd->published_rev;
		e = (struct mlfs_vote_entry){.entry = nd->acked_entry,
					     .lease = atomic_load(&nd->lease),
					     .rev = nd->published_rev};
	}
	if (!coordinator || strcmp(coordinator, nd->id) == 0) {
		rc = S.box
			 ? mlfs_votebox_put_entry(S.box, nd->id, to, aid, what, e.entry ? &e : NULL)
			 : -ENOTCONN;
		if (rc == 0)
			c_add(C_VOTES_RECEIVED, 1);
		else
			snprintf(err.text, sizeof(err.text), "its own box: %s", strerror(-rc));
	} else if (ptc_cluster_find(&S.cl, coordinator) != 0) {
		/* n0 is the only coordinator simulated: the only peer server */
		rc = ptc_error_set(&err, -ENOENT, "the coordinator %s is not simulated",
				   coordinator);
	} else {
		char *body = mlfs_vote_body_entry(nd->id, to, aid, what, e.entry ? &e : NULL);
		uint8_t *data = NULL;
		size_t len = 0;
		if (!body)
			die("out of memory");
		struct net_http_call call = {.deadline_ms = 2000, .idempotent = true};
		rc = net_http_post_json(w->http, S.vote_url, body, strlen(body), 4096, &data, &len,
					&call, &err);
		free(body);
		free(data);
		if (rc)
			c_add(C_VOTES_HTTP_FAILED, 1);
	}
	if (rc == 0 && ack) {
		c_add(C_ACKS, 1);
	} else if (rc == 0) {
		snprintf(nd->voted_id, sizeof(nd->voted_id), "%s", aid);
		nd->voted_ready = strcmp(what, "ready") == 0;
		c_add(C_VOTES, 1);
		c_max(C_LAST_VOTE, wall_ns());
	} else {
		free(nd->acked_entry); /* mlfs_nodeentry_acked(c, false) */
		nd->acked_entry = NULL;
		if (ack)
			c_add(C_ACKS_FAILED, 1);
		fprintf(stderr, "sim_control: %s: %s on version %" PRId64 ": %s\n", nd->id,
			ack ? "swap ack" : "vote", to, err.text);
	}
	return rc == 0;
}

/* mlfs_nodeentry_adopt: the announcement of @version at @rev put the
 * entry its ack carried (@mine): its published one now. */
static void adopt(struct node *nd, int64_t version, bool mine, int64_t rev)
{
	if (nd->acked_entry && mlfs_entry_adopted(nd->acked_entry_to, nd->acked_entry_base, version,
						  mine, nd->published_rev)) {
		free(nd->published);
		nd->published = nd->acked_entry;
		nd->published_rev = rev;
		nd->acked_entry = NULL;
		int target = atomic_load(&S.target);
		if (nd->have == target && nd->published_v != target) { /* as publish's */
			nd->published_v = target;
			c_add(C_PUBLISHED, 1);
			c_max(C_LAST_PUBLISHED, wall_ns());
		}
	}
	if (nd->acked_entry && version >= nd->acked_entry_to) {
		free(nd->acked_entry);
		nd->acked_entry = NULL;
	}
}

/* mlfs_attempt.c's act_announce: "released" = @version, under the job's
 * keys (every node's watch), with the entries its commit's swap acks
 * carried (up to MLFS_ANNOUNCE_ENTRIES_MAX; past it "released" alone and
 * every node puts its own); a failed put only said (the others follow
 * the entries themselves after 2 s). */
static void announce(struct worker *w, struct node *nd, int64_t version)
{
	char k[256], v[32];
	struct ptc_error err;
	name(k, sizeof(k), "released");
	snprintf(v, sizeof(v), "%" PRId64, version);
	json_t *ents = nd->acked_id[0] && S.box ? mlfs_votebox_entries(S.box, nd->acked_id) : NULL;
	size_t n = json_object_size(ents);
	int64_t rev = 0;
	bool all = false;
	int rc = -EAGAIN;
	if (n > 0 && n <= MLFS_ANNOUNCE_ENTRIES_MAX) {
		c_add(C_TXN, 1);
		rc = mlfs_announce_entries(w->etcd, S.nprefix, k, v, version, ents, &rev, &all,
					   &err);
	}
	if (rc == 0 && rev)
		adopt(nd, version, json_object_get(ents, nd->id) != NULL, rev);
	json_decref(ents);
	if (rc) {
		c_add(C_PUT, 1);
		rc = net_etcd_put(w->etcd, k, v, strlen(v), 0, NULL, &err);
	}
	if (rc == 0) {
		c_add(C_ANNOUNCED, 1);
		c_max(C_LAST_ANNOUNCE, wall_ns());
	} else {
		fprintf(stderr, "sim_control: %s: announce: %s\n", nd->id, err.text);
	}
	if (nd->announce <= version)
		nd->announce = 0;
	if (nd->publish_after && nd->publish_after <= version) {
		nd->publish_after = 0; /* its own entry, at the end of this round */
		nd->publish_at_ms = 0;
	}
}

/* The store starts preparing attempt @a (mlfs_attempt_prepare, then the
 * store's prepare: state "preparing", its hook wakes the node). It takes
 * no time: done at the end of this round (round_act). */
void prepare_start(struct node *nd, struct att *a, int64_t rev)
{
	nd->reconf = MLFS_RECONF_PREPARING;
	nd->target = a->to;
	nd->prepare_rev = rev;
	snprintf(nd->prepare_id, sizeof(nd->prepare_id), "%s", a->id);
	att_put(nd->prep_parts);
	nd->prep_parts = att_ref(a);
}

/* The prepare done (the build worker's set_state(PREPARED)): its hook
 * wakes the node. */
bool prepare_done(struct node *nd)
{
	if (nd->reconf != MLFS_RECONF_PREPARING)
		return false;
	nd->reconf = MLFS_RECONF_PREPARED;
	return true;
}

/* mlfs_attempt.c's act(): one action's etcd side, and the store's. Sets
 * *@woken when the store's state changed (its reconf_changed hook). */
static void act(struct worker *w, struct node *nd, const struct mlfs_action *a, bool *woken)
{
	const struct seen *v = &nd->seen;
	switch (a->kind) {
	case MLFS_ACT_REGISTER:
		if (do_register(w, nd) == 0)
			fprintf(stderr,
				"sim_control: %s: its lease had expired: registered again\n",
				nd->id);
		break;
	case MLFS_ACT_INSTALL_SCHEMA:
		nd->store_schema = true;
		break;
	case MLFS_ACT_INSTALL_CONFIG:
		nd->have = a->version;
		break;
	case MLFS_ACT_MARK_LOST: /* act_mark_lost */
		if (hosts_ranks(nd))
			nd->lost = true;
		break;
	case MLFS_ACT_CLEAR_LOST:
		nd->lost = false;
		break;
	case MLFS_ACT_PREPARE: /* act_prepare: once per attempt id */
		if (strcmp(nd->started_id, v->aid) != 0 && v->att) {
			snprintf(nd->started_id, sizeof(nd->started_id), "%s", v->aid);
			prepare_start(nd, v->att, v->attempt_mod);
			*woken = true;
		}
		break;
	case MLFS_ACT_VOTE_READY: /* act_vote_ready: job/ is empty, nothing staged */
		if (strcmp(nd->voted_id, v->aid) != 0)
			vote(w, nd, v->att ? v->att->coordinator : NULL, a->version, v->aid,
			     "ready");
		break;
	case MLFS_ACT_VOTE_FAILED:
		if (strcmp(nd->voted_id, v->aid) != 0) {
			char r[300];
			snprintf(r, sizeof(r), "failed: %s", a->reason[0] ? a->reason : "prepare");
			vote(w, nd, v->att ? v->att->coordinator : NULL, a->version, v->aid, r);
		}
		break;
	case MLFS_ACT_COMMIT: /* act_commit: the planned-from layout retained */
		if (nd->reconf == MLFS_RECONF_PREPARED && nd->target == a->version) {
			char co[64] = "";
			if (nd->prep_parts && nd->prep_parts->coordinator)
				snprintf(co, sizeof(co), "%s", nd->prep_parts->coordinator);
			nd->retained = nd->have;
			nd->have = a->version;
			nd->reconf = MLFS_RECONF_IDLE;
			att_put(nd->swap_wait);
			nd->swap_wait = nd->prep_parts;
			nd->prep_parts = NULL;
			nd->swap_since_ms = wall_ms();
			/* swap_ack: the entry's put waits for the release (or
			 * for the release wait); one the coordinator did not
			 * take is put at once */
			if (vote(w, nd, co, a->version, nd->prepare_id, "swapped")) {
				nd->publish_after = a->version;
				nd->publish_at_ms = wall_ms() + mlfs_release_wait_ms(S.n);
			} else {
				nd->publish_after = 0;
				nd->publish_at_ms = wall_ms() + mlfs_publish_delay_ms(S.n, nd->idx);
			}
			atomic_store(&nd->swap_waiting, true);
			*woken = true;
			if (nd->have == atomic_load(&S.target) && nd->swapped_v != nd->have) {
				nd->swapped_v = nd->have;
				int64_t t = wall_ns();
				c_add(C_SWAPPED, 1);
				c_max(C_LAST_SWAP, t);
				c_min(C_FIRST_SWAP, t);
			}
		}
		break;
	case MLFS_ACT_DISCARD: /* act_discard */
		nd->reconf = MLFS_RECONF_FAILED;
		att_put(nd->prep_parts);
		nd->prep_parts = NULL;
		*woken = true;
		if (atomic_fetch_add(&counts[C_DISCARDS], 1) == 0)
			fprintf(stderr, "sim_control: %s: discard: %s\n", nd->id, a->reason);
		break;
	case MLFS_ACT_FINISH_COMMIT:
		finish(w, nd, v->att, a->version, NULL);
		break;
	case MLFS_ACT_FINISH_ABORT:
		finish(w, nd, v->att, a->version, a->reason);
		break;
	case MLFS_ACT_RELEASE_RETAINED: /* act_release: nothing put */
		if (nd->retained == a->version) {
			nd->retained = 0;
			att_put(nd->swap_wait);
			nd->swap_wait = NULL;
			atomic_store(&nd->swap_waiting, false);
			nd->announce = 0;
		}
		break;
	case MLFS_ACT_ANNOUNCE_RELEASED:
		announce(w, nd, a->version);
		break;
	default: /* none other comes in this scenario (no node lost, no restore) */
		fprintf(stderr, "sim_control: %s: %s: not simulated\n", nd->id,
			mlfs_act_name(a->kind));
		break;
	}
}

/* The daemon's CPU for a round of @nd's, as measured (daemon_cost). */
int64_t round_cost(const struct node *nd)
{
	if (!S.delay)
		return 0;
	return S.cost.base + (nd->seen.nodes_known ? S.cost.peers : 0) +
	       (nd->seen.att ? S.cost.att + S.cost.ids : 0) + (nd->swap_wait ? S.cost.ids : 0) +
	       (nd->mine ? S.cost.votes : 0);
}

/* mlfs_nodeentry_read_saved: this node's saved/<id> mark, read once (its
 * first round): 0, or etcd's error with @err. None is ever put here. */
static int read_saved(struct worker *w, struct node *nd, struct ptc_error *err)
{
	char k[256];
	struct net_etcd_kv kv;
	if (nd->saved_read)
		return 0;
	snprintf(k, sizeof(k), "%ssaved/%s", S.nprefix, nd->id);
	c_add(C_RANGE, 1);
	int rc = net_etcd_get(w->etcd, k, &kv, NULL, err);
	if (rc && rc != -ENOENT)
		return rc;
	if (rc == 0) {
		free(kv.key);
		free(kv.value);
	}
	nd->saved_read = true;
	c_add(C_STARTED, 1);
	return 0;
}

/*
 * A round's first half (mlfs_cluster.c's round_once up to mlfs_decide):
 * the job's mirror synced (a watch and a range when it is not live), the
 * saved/<id> mark read once, the entries followed while need_peers() says
 * so (stopped when no longer needed), the votes in its box copied while
 * this node coordinates, the snapshot (mlfs_attempt.c's snapshot) and the
 * decision. The actions wait for the daemon's CPU of this round
 * (round_act).
 */
void round_decide(struct worker *w, struct node *nd)
{
	struct group *g = nd->g;
	struct net_etcd_kv *vk = NULL;
	size_t nvk = 0;
	struct ptc_error err;
	struct mlfs_snap_attempt sa = {0};

	nd->nacts = 0;
	nd->seen = (struct seen){.aid = ""};
	if (nd->propose_pending) { /* config.json written on this node */
		nd->propose_pending = false;
		propose(nd);
	}
	/* it decides on the votes, or on the swap acks of its commit */
	bool coordinating = nd->mine != NULL || nd->announce;
	if (group_sync(w, g))
		return; /* rule 1: without etcd nothing is decided */
	pthread_mutex_lock(&g->lock);
	int64_t released = g->released, released_rev = g->released_rev;
	bool mine = g->released_ids && json_object_get(g->released_ids, nd->id);
	pthread_mutex_unlock(&g->lock);
	if (nd->publish_after && released >= nd->publish_after) {
		/* every participant swapped: its entry says so now (spread
		 * past 1,000 nodes), unless the announcement put the one its
		 * ack carried */
		adopt(nd, released, mine, released_rev);
		nd->publish_after = 0;
		nd->publish_at_ms = wall_ms() + mlfs_publish_delay_ms(S.n, nd->idx);
	}
	if (read_saved(w, nd, &err)) {
		fprintf(stderr, "sim_control: %s: saved mark: %s\n", nd->id, err.text);
		return;
	}
	if (follow_entries(w, nd, &err)) {
		fprintf(stderr, "sim_control: %s: entries: %s\n", nd->id, err.text);
		return;
	}
	if (coordinating && S.box) {
		if (mlfs_votebox_copy(S.box, &vk, &nvk)) {
			fprintf(stderr, "sim_control: %s: out of memory for the votes\n", nd->id);
			return;
		}
		/* votes_on (keys "<to>/<id>"), indexed here by node number (its
		 * CPU is in the wait) */
		memset(w->vote, 0, (size_t)S.n * sizeof(*w->vote));
		for (size_t i = 0; i < nvk; i++) {
			char *end;
			long long to = strtoll(vk[i].key, &end, 10);
			int k = *end == '/' ? node_index(end + 1, strlen(end + 1)) : -1;
			if (k >= 0 && to == 2)
				w->vote[k] = &vk[i];
		}
	}
	c_add(C_ROUNDS, 1);
	char commit_id[24];
	bool known = entries_of(nd, w->ent);
	nd->seen.nodes_known = known;
	pthread_mutex_lock(&g->lock);
	struct att *a = att_ref(g->att);
	nd->seen.etcd_ok = g->live;
	nd->seen.attempt_mod = a ? a->mod : 0;
	struct mlfs_snap s = {
	    .etcd_ok = g->live,
	    .revision = g->revision,
	    .has_schema = g->has_schema,
	    .committed = g->committed > 0 ? g->committed : 0,
	    .commit_id = commit_id,
	    .saved_step = -1,
	    .nodes_known = known,
	    .released = g->released,
	};
	snprintf(commit_id, sizeof(commit_id), "%s", g->config_id);
	for (int i = 0; i < S.n; i++) {
		uint32_t e = known ? w->ent[i] : 0; /* mlfs_jobkeys: no entry when not read */
		w->sn[i] = (struct mlfs_snap_node){
		    .id = S.ids[i],
		    .up = e & E_UP,
		    .version = e & E_VERSION,
		    .lost = e & E_LOST,
		    .participant = a && bit(a->parts, i),
		    .swap_waited = nd->swap_wait && bit(nd->swap_wait->parts, i),
		};
		/* acks_on: a node that acked its swap to this coordinator's
		 * commit serves its version, though its entry (put after the
		 * release) says the one before */
		const struct net_etcd_kv *v = vk ? w->vote[i] : NULL;
		size_t cl = strlen(commit_id);
		struct mlfs_snap_node *sn = &w->sn[i];
		if (v && s.committed == 2 && cl && strncmp(v->value, commit_id, cl) == 0 &&
		    strcmp(v->value + cl, " swapped") == 0 && sn->up && !sn->lost &&
		    sn->version < s.committed)
			sn->version = s.committed;
	}
	pthread_mutex_unlock(&g->lock);
	if (a) {
		snprintf(nd->seen.aid, sizeof(nd->seen.aid), "%s", a->id);
		sa = (struct mlfs_snap_attempt){.id = a->id,
						.from = a->from,
						.to = a->to,
						.coordinator = a->coordinator,
						.deadline_ms = a->deadline_ms};
		s.attempt = &sa;
		/* every participant's vote for the coordinator (votes_on: its
		 * box's copy), this node's own as it voted for the others
		 * (own_vote) */
		size_t n = strlen(a->id);
		for (int i = 0; i < S.n; i++) {
			struct mlfs_snap_node *sn = &w->sn[i];
			const struct net_etcd_kv *v = vk ? w->vote[i] : NULL;
			if (!sn->participant)
				continue;
			if (vk && v && strncmp(v->value, a->id, n) == 0 && v->value[n] == ' ') {
				if (strcmp(v->value + n + 1, "ready") == 0 ||
				    strcmp(v->value + n + 1, "swapped") == 0) {
					sn->vote = MLFS_VOTE_READY;
				} else {
					sn->vote = MLFS_VOTE_FAILED;
					sn->reason = v->value + n + 1;
					if (strncmp(sn->reason, "failed: ", 8) == 0)
						sn->reason += 8;
				}
			} else if (!vk && i == nd->idx && strcmp(nd->voted_id, a->id) == 0) {
				sn->vote = nd->voted_ready ? MLFS_VOTE_READY : MLFS_VOTE_FAILED;
			}
		}
	}
	s.lease_expired = atomic_load(&nd->lease_expired);
	s.nodes = w->sn;
	s.nnodes = S.n;
	s.me = nd->idx;
	s.now_ms = wall_ms();
	s.store_schema = nd->store_schema;
	s.have = nd->have;
	s.hosts_ranks = hosts_ranks(nd);
	s.lost = nd->lost;
	s.reconf = nd->reconf;
	s.target = nd->target;
	s.prepare_id = nd->prepare_id;
	s.prepare_rev = nd->prepare_rev;
	s.retained = nd->retained;
	s.coordinating = nd->mine && a && strcmp(nd->mine, a->raw) == 0;
	nd->nacts = mlfs_decide(&s, nd->acts); /* reasons are copied into acts */
	nd->seen.att = a;
	nd->attempt_seen = a != NULL; /* c->attempt, for nap_ms */
	net_etcd_kvs_free(vk, nvk);
}

/* A round's second half: its actions, its entry published (round_once's
 * last step), and the nap (mlfs_cluster.c's nap_ms). Returns the nap in
 * ms; *@woken when the store's hook woke it meanwhile. */
int round_act(struct worker *w, struct node *nd, bool *woken)
{
	bool etcd_ok = nd->seen.etcd_ok;
	for (int i = 0; i < nd->nacts; i++)
		act(w, nd, &nd->acts[i], woken);
	att_put(nd->seen.att);
	nd->seen.att = NULL;
	nd->nacts = 0;
	if (etcd_ok && wall_ms() >= nd->publish_at_ms) /* mlfs_publish_delay_ms */
		publish(w, nd);
	/* round_once's last step: a release this round may end the need for
	 * the entries */
	if (!need_peers(nd)) {
		if (nd->idx == 0 && S.n0_here)
			mirror_follow(&S.peers, false, &(struct ptc_error){0});
		else
			peers_stop(nd);
	}
	if (prepare_done(nd)) /* the build worker's set_state(PREPARED) */
		*woken = true;
	int target = atomic_load(&S.target);
	if (nd->have == target && nd->swapped_v == target && nd->retained == 0 &&
	    nd->released_v != target) {
		nd->released_v = target;
		c_add(C_RELEASED, 1);
		c_max(C_LAST_RELEASE, wall_ns());
	}
	/* nap_ms: a retained layout waits for the announcement until 2 s
	 * after its swap (mlfs_release_wait_ms: 20 s at 10,000 nodes; then it
	 * follows the entries itself: need_peers), then every second */
	int64_t swap = nd->swap_wait ? wall_ms() - nd->swap_since_ms : -1;
	if (!etcd_ok)
		return 200;
	int wait = mlfs_release_wait_ms(S.n);
	int ms = swap >= 0 && swap < wait	 ? (int)(wait - swap) + 10
		 : nd->attempt_seen || swap >= 0 ? 1000
						 : 30000;
	if (nd->publish_failed && S.ka_ms < ms) /* once per keep-alive interval */
		ms = S.ka_ms;
	int64_t put_in = nd->publish_at_ms - wall_ms(); /* after a commit */
	if (put_in > 0 && put_in < ms)
		ms = (int)put_in + 1;
	return ms;
}
