/*
 * mlfs_nodeentry.c - the nodes' keys (MLFS_KEYS_NODES): this node's entry
 * (registered with a lease that is kept alive, put again whenever what it
 * says changed) and its saved/<id> mark, and what the other nodes'
 * entries say: their ranks' saved steps, copied into the store's step
 * table, and who is up at which version, for status.json. No node follows
 * these keys all the time (mlfs_cluster.c's DESIGN block says who does
 * when); status.json and mlfs snapshot read them when the node does not.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* This node's entry, but its state: what it serves (the current layout's
 * version) and its ranks' saved steps (not the retained layout's version:
 * its release would put every entry once more, and only a coordinator
 * recovering from it asks, through /v1/health);
 * its state into *@lost and *@reconf. NULL: out of memory. */
static json_t *node_entry(struct mlfs_cluster *c, bool *lost, enum mlfs_reconf_state *reconf)
{
	struct mlfs_store *st = c->st;
	const struct ptc_node *n = &mlfs_store_cluster(st)->nodes[st->node];
	json_t *steps = json_object();
	char rank[16];

	pthread_mutex_lock(&st->lock);
	int64_t version = st->view ? st->view->config->version : 0;
	*lost = atomic_load(&st->lost);
	*reconf = st->reconf;
	if (st->view) {
		const struct ptc_layout *l = &st->view->layout;
		int r0 = l->node_first_rank[st->node];
		for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++) {
			snprintf(rank, sizeof(rank), "%d", r);
			json_object_set_new(steps, rank, json_integer(st->steps[r]));
		}
	}
	pthread_mutex_unlock(&st->lock);
	json_t *o = json_pack("{sssisisIsO}", "addr", n->addr ? n->addr : "", "devices", n->devices,
			      "pid", (int)getpid(), "version", (json_int_t)version, "steps", steps);
	json_t *bk = mlfs_backup_describe(mlfs_backup_of(st));
	if (o && bk)
		json_object_set_new(o, "backup", bk);
	else
		json_decref(bk);
	uint64_t gen = atomic_load(&st->job_gen);
	pthread_mutex_lock(&c->lock);
	/* job/ as this node swapped it in (or had it at its registration),
	 * unchanged since: a coordinator with the same reads it as its own */
	if (o && c->job_digest[0] && gen == c->job_digest_gen)
		json_object_set_new(o, "job", json_string(c->job_digest));
	if (o && c->entry_vote) /* one the coordinator's peer server did not take */
		json_object_set(o, "vote", c->entry_vote);
	if (o && c->restore_tried[0])
		json_object_set_new(
		    o, "restore",
		    json_pack("{ssso}", "id", c->restore_tried, "error",
			      c->restore_error[0] ? json_string(c->restore_error) : json_null()));
	if (o && c->import_done[0])
		json_object_set_new(
		    o, "import",
		    json_pack("{ssso}", "id", c->import_done, "error",
			      c->import_error[0] ? json_string(c->import_error) : json_null()));
	pthread_mutex_unlock(&c->lock);
	json_decref(steps);
	return o;
}

/* The newest step this node's ranks saved (-1: none). */
static int64_t newest_step(struct mlfs_store *st)
{
	int64_t s = -1;
	pthread_mutex_lock(&st->lock);
	if (st->view) {
		const struct ptc_layout *l = &st->view->layout;
		int r0 = l->node_first_rank[st->node];
		for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++)
			if (st->steps[r] > s)
				s = st->steps[r];
	}
	pthread_mutex_unlock(&st->lock);
	return s;
}

/* This node's saved/<id> key into @k (@cap bytes). */
static void saved_key(const struct mlfs_cluster *c, char *k, size_t cap)
{
	snprintf(k, cap, "%ssaved/%s", c->nprefix, c->me);
}

/* This node's entry as JSON text (a new string; NULL: out of memory),
 * its settled state updated (c->entry_state). publock held. */
static char *entry_text(struct mlfs_cluster *c)
{
	bool lost;
	enum mlfs_reconf_state reconf;
	json_t *o = node_entry(c, &lost, &reconf);
	char *e = NULL;

	if (!o)
		return NULL;
	/* Its last settled state (idle, failed, lost): a reconfiguration's
	 * passing ones (preparing, prepared, committing, aborting) would put
	 * the entry four more times per node, and every put reaches every
	 * node's watch. */
	bool settled = reconf == MLFS_RECONF_IDLE || reconf == MLFS_RECONF_FAILED;
	if (lost)
		snprintf(c->entry_state, sizeof(c->entry_state), "lost");
	else if (settled || !c->entry_state[0])
		snprintf(c->entry_state, sizeof(c->entry_state), "%s",
			 mlfs_reconf_state_name(settled ? reconf : MLFS_RECONF_IDLE));
	if (json_object_set_new(o, "state", json_string(c->entry_state)) == 0)
		e = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(o);
	return e;
}

int mlfs_nodeentry_publish(struct mlfs_cluster *c, struct ptc_error *err)
{
	char k[512];
	int rc = 0;
	int64_t lease = atomic_load(&c->lease), rev = 0;

	pthread_mutex_lock(&c->publock);
	char *e = entry_text(c);
	if (!e)
		rc = -ENOMEM;
	else if (lease && (!c->published || strcmp(c->published, e) != 0)) {
		snprintf(k, sizeof(k), "%s%s", c->nprefix, c->me);
		if ((rc = net_etcd_put_rev(c->etcd, k, e, strlen(e), lease, &rev, NULL, err)) ==
		    0) {
			free(c->published);
			c->published = e;
			c->published_rev = rev;
			e = NULL;
		} else {
			c->published_rev = 0; /* it may have landed: unknown */
		}
	}
	pthread_mutex_unlock(&c->publock);
	free(e);
	return rc;
}

int mlfs_nodeentry_for_ack(struct mlfs_cluster *c, int64_t to, struct mlfs_vote_entry *e)
{
	int64_t lease = atomic_load(&c->lease);
	int rc = 0;

	*e = (struct mlfs_vote_entry){0};
	pthread_mutex_lock(&c->publock);
	free(c->acked_entry);
	c->acked_entry = NULL;
	if (!lease || !c->published || !c->published_rev)
		rc = -EAGAIN;
	else if (!(c->acked_entry = entry_text(c)))
		rc = -ENOMEM;
	else {
		c->acked_entry_to = to;
		c->acked_entry_base = c->published_rev;
		*e = (struct mlfs_vote_entry){
		    .entry = c->acked_entry, .lease = lease, .rev = c->published_rev};
	}
	pthread_mutex_unlock(&c->publock);
	return rc;
}

void mlfs_nodeentry_acked(struct mlfs_cluster *c, bool ok)
{
	if (ok)
		return;
	pthread_mutex_lock(&c->publock);
	free(c->acked_entry);
	c->acked_entry = NULL;
	pthread_mutex_unlock(&c->publock);
}

void mlfs_nodeentry_adopt(struct mlfs_cluster *c, int64_t version, bool mine, int64_t rev)
{
	pthread_mutex_lock(&c->publock);
	if (c->acked_entry && mlfs_entry_adopted(c->acked_entry_to, c->acked_entry_base, version,
						 mine, c->published_rev)) {
		free(c->published);
		c->published = c->acked_entry;
		c->published_rev = rev;
		c->acked_entry = NULL;
	}
	if (c->acked_entry && version >= c->acked_entry_to) { /* not put: its own put follows */
		free(c->acked_entry);
		c->acked_entry = NULL;
	}
	pthread_mutex_unlock(&c->publock);
}

void mlfs_nodeentry_steps_saved(void *arg)
{
	struct mlfs_cluster *c = arg;
	struct ptc_error why;
	char k[512], v[32];

	if (mlfs_nodeentry_publish(c, &why))
		return;
	/* saved/<id>: the newest step this node saved (a step write, an
	 * import), bound to no lease, so that a job whose nodes all restarted
	 * knows it had state: zeros are not the job's then (mlfs_decide's
	 * rule 5). */
	int64_t step = newest_step(c->st);
	pthread_mutex_lock(&c->publock);
	if (step >= 0 && step > c->saved_put) {
		snprintf(v, sizeof(v), "%" PRId64, step);
		saved_key(c, k, sizeof(k));
		if (net_etcd_put(c->etcd, k, v, strlen(v), 0, NULL, &why) == 0)
			c->saved_put = step;
	}
	pthread_mutex_unlock(&c->publock);
}

int mlfs_nodeentry_read_saved(struct mlfs_cluster *c, struct ptc_error *err)
{
	struct net_etcd_kv kv;
	char k[512];

	if (c->saved_read)
		return 0;
	saved_key(c, k, sizeof(k));
	int rc = net_etcd_get(c->etcd, k, &kv, NULL, err);
	if (rc && rc != -ENOENT)
		return rc;
	pthread_mutex_lock(&c->publock);
	if (rc == 0 && strtoll(kv.value, NULL, 10) > c->saved_put)
		c->saved_put = strtoll(kv.value, NULL, 10);
	pthread_mutex_unlock(&c->publock);
	if (rc == 0) {
		free(kv.key);
		free(kv.value);
	}
	c->saved_read = true;
	return 0;
}

int mlfs_nodeentry_register(struct mlfs_cluster *c, struct ptc_error *err)
{
	int64_t lease;
	int ttl_s, every_ms;
	mlfs_lease_schedule(mlfs_store_cluster(c->st)->nnodes, &ttl_s, &every_ms);
	int rc = net_etcd_lease_grant(c->etcd, ttl_s, &lease, NULL, err);

	if (rc)
		return rc;
	pthread_mutex_lock(&c->publock);
	free(c->published); /* the entry went with the old lease */
	c->published = NULL;
	c->published_rev = 0;
	pthread_mutex_unlock(&c->publock);
	atomic_store(&c->lease, lease);
	atomic_store(&c->lease_expired, false);
	mlfs_jobsync_note_digest(c);
	return mlfs_nodeentry_publish(c, err);
}

void *mlfs_nodeentry_keepalive_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-keepalive"); /* for top -H, perf */
	struct mlfs_cluster *c = arg;
	struct ptc_error why;
	int64_t ttl;

	pthread_mutex_lock(&c->wake_lock);
	while (!atomic_load(&c->stop)) {
		struct timespec t;
		int ttl_s, every_ms;
		mlfs_lease_schedule(mlfs_store_cluster(c->st)->nnodes, &ttl_s, &every_ms);
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_sec += every_ms / 1000;
		t.tv_nsec += (long)(every_ms % 1000) * 1000000L;
		if (t.tv_nsec >= 1000000000L) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&c->keepalive_cond, &c->wake_lock, &t);
		if (atomic_load(&c->stop))
			break;
		int64_t lease = atomic_load(&c->lease);
		if (!lease)
			continue;
		pthread_mutex_unlock(&c->wake_lock);
		int rc = net_etcd_lease_keepalive(c->etcd, lease, &ttl, NULL, &why);
		pthread_mutex_lock(&c->wake_lock);
		if (rc == -ENOENT && atomic_load(&c->lease) == lease) {
			/* Expired: the job counts this node as down since then. */
			atomic_store(&c->lease, 0);
			atomic_store(&c->lease_expired, true);
			c->wake = true;
			pthread_cond_signal(&c->cond);
		}
	}
	pthread_mutex_unlock(&c->wake_lock);
	return NULL;
}

void mlfs_cluster_wake(struct mlfs_cluster *c)
{
	pthread_mutex_lock(&c->wake_lock);
	c->wake = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->wake_lock);
}

void mlfs_nodeentry_sync_steps(struct mlfs_cluster *c, const json_t *nodes)
{
	struct mlfs_store *st = c->st;
	const char *id;
	json_t *entry;

	pthread_mutex_lock(&st->lock);
	if (st->view) {
		int world = st->view->layout.world;
		json_object_foreach((json_t *)nodes, id, entry)
		{
			if (strcmp(id, c->me) == 0)
				continue;
			if (json_integer_value(json_object_get(entry, "version")) !=
			    st->view->config->version)
				continue; /* steps of another layout's ranks */
			const char *rk;
			json_t *step;
			json_object_foreach(json_object_get(entry, "steps"), rk, step)
			{
				long r = strtol(rk, NULL, 10);
				if (r >= 0 && r < world && json_is_integer(step))
					st->steps[r] = json_integer_value(step);
			}
		}
	}
	pthread_mutex_unlock(&st->lock);
}

/* The nodes' entries for status.json: the peers mirror's when this node
 * follows them, else as read at most a second ago (read again now when
 * older and etcd answers); a new reference, or NULL. */
static json_t *seen_nodes(struct mlfs_cluster *c)
{
	struct ptc_error why;
	json_t *followed = mlfs_jobkeys_mirrored_nodes(c);

	if (followed)
		return followed;
	pthread_mutex_lock(&c->seen_lock);
	pthread_mutex_lock(&c->lock);
	bool etcd = c->etcd_error[0] == '\0';
	pthread_mutex_unlock(&c->lock);
	if (etcd && (!c->seen || mlfs_cluster_now_ms() - c->seen_ms >= 1000)) {
		json_t *n = mlfs_jobkeys_read_nodes(c, &why);
		if (n) {
			json_decref(c->seen);
			c->seen = n;
			c->seen_ms = mlfs_cluster_now_ms();
			mlfs_nodeentry_sync_steps(c, n);
		}
	}
	json_t *n = json_incref(c->seen);
	pthread_mutex_unlock(&c->seen_lock);
	return n;
}

void mlfs_nodeentry_keep_seen(struct mlfs_cluster *c)
{
	json_t *nodes = mlfs_jobkeys_mirrored_nodes(c);

	if (!nodes)
		return;
	pthread_mutex_lock(&c->seen_lock);
	json_decref(c->seen);
	c->seen = nodes;
	c->seen_ms = mlfs_cluster_now_ms();
	pthread_mutex_unlock(&c->seen_lock);
	mlfs_store_status_changed(c->st); /* the nodes' versions, for a waiter */
}

void mlfs_nodeentry_steps_mirrored(void *arg)
{
	struct mlfs_cluster *c = arg;
	json_t *nodes = mlfs_jobkeys_mirrored_nodes(c);

	if (nodes)
		mlfs_nodeentry_sync_steps(c, nodes);
	json_decref(nodes);
}

void mlfs_nodeentry_steps_refresh(void *arg)
{
	struct mlfs_cluster *c = arg;
	struct ptc_error why;
	json_t *n = mlfs_jobkeys_read_nodes(c, &why);

	if (n)
		mlfs_nodeentry_sync_steps(c, n);
	json_decref(n);
}

void mlfs_nodeentry_status_add(void *arg, json_t *o)
{
	struct mlfs_cluster *c = arg;
	json_t *nodes = json_array(), *job = json_object(), *e;
	struct mlfs_store *st = c->st;
	const char *id;
	json_t *seen = seen_nodes(c);

	pthread_mutex_lock(&st->lock); /* rank 0's step, as the entries say */
	if (st->view)
		json_object_set_new(o, "step", json_integer(st->steps[0]));
	pthread_mutex_unlock(&st->lock);
	pthread_mutex_lock(&c->lock);
	json_t *att = c->attempt;
	/* the swap acks of this coordinator's last commit: those nodes serve
	 * its version before their entries (put after the release) say so */
	json_t *acks =
	    c->acked_to && st->votebox ? mlfs_votebox_describe(st->votebox, c->acked_id) : NULL;
	for (int n = 0; n < mlfs_store_cluster(st)->nnodes; n++) {
		id = mlfs_store_cluster(st)->nodes[n].id;
		e = json_object_get(seen, id);
		json_t *v = e ? json_object_get(e, "version") : json_null();
		const char *ack = json_string_value(json_object_get(acks, id));
		const char *state = json_string_value(json_object_get(e, "state"));
		if (e && ack && strcmp(ack, "swapped") == 0 &&
		    json_integer_value(v) < c->acked_to && !(state && strcmp(state, "lost") == 0))
			v = json_integer(c->acked_to);
		else
			json_incref(v);
		json_array_append_new(
		    nodes, json_pack("{sssbsosO}", "id", id, "up", e != NULL, "version", v, "state",
				     e ? json_object_get(e, "state") : json_null()));
	}
	json_decref(acks);
	json_object_set_new(job, "job", json_string(mlfs_store_cluster(st)->job));
	json_object_set_new(job, "etcd", json_string(c->etcd_error[0] ? "unreachable" : "ok"));
	if (c->etcd_error[0])
		json_object_set_new(job, "etcd_error", json_string(c->etcd_error));
	const char *member;
	net_etcd_members(c->etcd, &member);
	json_object_set_new(job, "etcd_member", json_string(member));
	json_object_set_new(job, "nodes", nodes);
	if (c->manifests_read >= 0)
		json_object_set_new(job, "job_manifests_read", json_integer(c->manifests_read));
	json_t *bk = mlfs_backup_describe(mlfs_backup_of(st));
	json_object_set_new(job, "backup", bk ? bk : json_null());
	/* The attempt as parsed, less its config and job/ manifest (of up to
	 * 1.5 MB): a new object sharing the other members, which no thread
	 * changes once parsed. A deep copy here cost every read of
	 * status.json, which mlfs reconfigure polls, the whole manifest,
	 * under the lock the control thread takes. */
	json_t *a = att ? json_object() : json_null();
	const char *key;
	json_t *val;
	json_object_foreach(att, key, val)
	{
		if (strcmp(key, "config") != 0 && strcmp(key, "job") != 0)
			json_object_set(a, key, val);
	}
	const char *aid = json_string_value(json_object_get(a, "id"));
	if (aid && c->mine && st->votebox) { /* the votes this coordinator has */
		json_t *votes = mlfs_votebox_describe(st->votebox, aid);
		json_object_foreach(seen, id, e) /* and those put in entries instead */
		{
			json_t *v = json_object_get(e, "vote");
			const char *va = json_string_value(json_object_get(v, "attempt"));
			if (va && strcmp(va, aid) == 0 && !json_object_get(votes, id))
				json_object_set(votes, id, json_object_get(v, "vote"));
		}
		json_object_set_new(a, "votes", votes);
	}
	json_object_set_new(job, "attempt", a);
	pthread_mutex_unlock(&c->lock);
	json_decref(seen);
	json_object_set_new(o, "cluster", job);
}
