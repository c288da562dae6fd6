/*
 * mlfs_nodeentry.c - the job's nodes/ keys: this node's entry (registered
 * with a lease that is kept alive, put again whenever what it says
 * changed), and what the other nodes' entries say: their ranks' saved
 * steps, copied into the store's step table, and who is up at which
 * version, for status.json.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

#define MLFS_LEASE_TTL 5 /* seconds */

/* This node's entry: what it serves and its ranks' saved steps. */
static char *node_entry(struct mlfs_cluster *c)
{
	struct mlfs_store *st = c->st;
	const struct ptc_node *n = &mlfs_store_cluster(st)->nodes[st->node];
	json_t *steps = json_object();
	char rank[16];

	pthread_mutex_lock(&st->lock);
	int64_t version = st->view ? st->view->config->version : 0;
	const char *state = atomic_load(&st->lost) ? "lost" : mlfs_reconf_state_name(st->reconf);
	if (st->view) {
		const struct ptc_layout *l = &st->view->layout;
		int r0 = l->node_first_rank[st->node];
		for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++) {
			snprintf(rank, sizeof(rank), "%d", r);
			json_object_set_new(steps, rank, json_integer(st->steps[r]));
		}
	}
	pthread_mutex_unlock(&st->lock);
	json_t *o = json_pack("{sssisisIsssO}", "addr", n->addr ? n->addr : "", "devices",
			      n->devices, "pid", (int)getpid(), "version", (json_int_t)version,
			      "state", state, "steps", steps);
	json_t *bk = mlfs_backup_describe(mlfs_backup_of(st));
	if (o && bk)
		json_object_set_new(o, "backup", bk);
	else
		json_decref(bk);
	json_decref(steps);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	return s;
}

int mlfs_nodeentry_publish(struct mlfs_cluster *c, struct ptc_error *err)
{
	char k[512];
	int rc = 0;
	char *e = node_entry(c);

	if (!e)
		return -ENOMEM;
	pthread_mutex_lock(&c->publock);
	if (c->lease && (!c->published || strcmp(c->published, e) != 0)) {
		mlfs_jobkeys_name(c, k, sizeof(k), "nodes/%s", c->me);
		if ((rc = net_etcd_put(c->etcd, k, e, strlen(e), c->lease, NULL, err)) == 0) {
			free(c->published);
			c->published = e;
			e = NULL;
		}
	}
	pthread_mutex_unlock(&c->publock);
	free(e);
	return rc;
}

void mlfs_nodeentry_steps_saved(void *arg)
{
	struct ptc_error why;
	mlfs_nodeentry_publish(arg, &why);
}

int mlfs_nodeentry_keep_registered(struct mlfs_cluster *c, struct ptc_error *err)
{
	int rc;
	int64_t now = mlfs_cluster_now_ms(), ttl;

	if (c->lease && now - c->last_keepalive_ms >= 1000) {
		rc = net_etcd_lease_keepalive(c->etcd, c->lease, &ttl, NULL, err);
		if (rc == -ENOENT) { /* expired: we were down as far as the job knows */
			c->lease = 0;
		} else if (rc) {
			return rc;
		} else {
			c->last_keepalive_ms = now;
		}
	}
	if (!c->lease) {
		if ((rc = net_etcd_lease_grant(c->etcd, MLFS_LEASE_TTL, &c->lease, NULL, err)))
			return rc;
		c->last_keepalive_ms = now;
		pthread_mutex_lock(&c->publock);
		free(c->published);
		c->published = NULL;
		pthread_mutex_unlock(&c->publock);
	}
	return mlfs_nodeentry_publish(c, err);
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

void mlfs_nodeentry_status_add(void *arg, json_t *o)
{
	struct mlfs_cluster *c = arg;
	json_t *nodes = json_array(), *job = json_object();
	struct mlfs_store *st = c->st;

	pthread_mutex_lock(&c->lock);
	for (int n = 0; n < mlfs_store_cluster(st)->nnodes; n++) {
		const char *id = mlfs_store_cluster(st)->nodes[n].id;
		json_t *e = json_object_get(c->nodes, id);
		json_array_append_new(
		    nodes, json_pack("{sssbsOsO}", "id", id, "up", e != NULL, "version",
				     e ? json_object_get(e, "version") : json_null(), "state",
				     e ? json_object_get(e, "state") : json_null()));
	}
	json_object_set_new(job, "job", json_string(mlfs_store_cluster(st)->job));
	json_object_set_new(job, "etcd", json_string(c->etcd_error[0] ? "unreachable" : "ok"));
	if (c->etcd_error[0])
		json_object_set_new(job, "etcd_error", json_string(c->etcd_error));
	json_object_set_new(job, "nodes", nodes);
	json_t *bk = mlfs_backup_describe(mlfs_backup_of(st));
	json_object_set_new(job, "backup", bk ? bk : json_null());
	json_t *a = c->attempt ? json_deep_copy(c->attempt) : json_null();
	json_object_del(a, "config");
	json_object_del(a, "job");
	json_object_set_new(job, "attempt", a);
	pthread_mutex_unlock(&c->lock);
	json_object_set_new(o, "cluster", job);
}
