/*
 * mlfs_join.c - this node joins the job's cluster, and follows it as it
 * grows. The job's cluster.json is etcd's "cluster" key: the first node
 * puts its own; a node whose cluster.json extends the job's (the same
 * nodes first, more after them) replaces it; a node whose cluster.json
 * the job's extends takes the job's; any other refuses to join, saying
 * so. Every node takes a longer one within a round (mlfs_join_sync).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_i.h"
#include "common/common.h"

/* One try at joining the job's cluster (etcd key @k): 0, -EAGAIN when the
 * key changed meanwhile, or an error with @err. */
static int join_once(struct mlfs_cluster *c, const char *k, struct ptc_error *err)
{
	struct mlfs_store *st = c->st;
	const char *mine = mlfs_store_cluster_text(st);
	struct net_etcd_cmp absent = {
	    .key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_op put = {
	    .kind = NET_ETCD_PUT, .key = k, .value = mine, .len = strlen(mine)};
	struct net_etcd_kv kv;
	struct ptc_cluster *theirs = NULL;
	struct ptc_error differs = {.text = ""}, grow = {.text = ""}, e;
	bool ok = false;
	int rc;

	if (net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, &e) ||
	    (!ok && net_etcd_get(c->etcd, k, &kv, NULL, &e)))
		return ptc_error_set(err, -EIO, "etcd at %s: %s", mlfs_store_cluster(st)->etcd,
				     e.text);
	if (ok)
		return 0; /* the first node */
	if ((rc = ptc_cluster_parse_text(kv.value, kv.len, "the job's cluster.json", &theirs,
					 &differs)) == 0) {
		if (ptc_cluster_extends(theirs, mlfs_store_cluster(st), &differs) == 0) {
			if (theirs->nnodes < mlfs_store_cluster(st)->nnodes) { /* we add nodes */
				struct net_etcd_cmp same = {.key = k,
							    .target = NET_ETCD_MOD,
							    .result = NET_ETCD_EQUAL,
							    .num = kv.mod_revision};
				rc = net_etcd_txn(c->etcd, &same, 1, &put, 1, NULL, 0, &ok, NULL,
						  NULL, &e)
					 ? ptc_error_set(err, -EIO, "etcd at %s: %s",
							 mlfs_store_cluster(st)->etcd, e.text)
				     : ok ? 0
					  : -EAGAIN;
				if (rc == 0)
					mlfs_log(MLFS_LOG_INFO,
						 "cluster: this node's cluster.json adds %d nodes "
						 "to the job's %d",
						 mlfs_store_cluster(st)->nnodes - theirs->nnodes,
						 theirs->nnodes);
			}
		} else if (ptc_cluster_extends(mlfs_store_cluster(st), theirs, &grow) == 0) {
			/* nodes joined since our cluster.json was written */
			rc = mlfs_store_grow_cluster(st, kv.value, kv.len, &grow);
			rc = rc < 0 ? ptc_error_set(err, rc, "%s", grow.text) : 0;
		} else {
			rc = -EINVAL;
		}
	}
	if (rc == -EINVAL)
		ptc_error_set(
		    err, rc,
		    "cluster.json differs from the job \"%s\"'s (etcd key %s): %s; every "
		    "node mounts with the job's cluster.json, or one that adds nodes at its end",
		    mlfs_store_cluster(st)->job, k, differs.text);
	ptc_cluster_free(theirs);
	free(kv.key);
	free(kv.value);
	return rc;
}

int mlfs_join_cluster(struct mlfs_cluster *c, struct ptc_error *err)
{
	char k[512];
	int rc;

	mlfs_jobkeys_name(c, k, sizeof(k), "cluster");
	for (int tries = 0; (rc = join_once(c, k, err)) == -EAGAIN; tries++)
		if (tries == 20) {
			ptc_error_set(err, rc, "the job's cluster.json (etcd key %s) kept changing",
				      k);
			break;
		}
	return rc;
}

void mlfs_join_sync(struct mlfs_cluster *c, const struct mlfs_jobkeys *k)
{
	const char *have = mlfs_store_cluster_text(c->st);
	struct ptc_error err = {.text = ""};

	if (!k->cluster || (strlen(have) == k->cluster->len &&
			    memcmp(have, k->cluster->value, k->cluster->len) == 0))
		return;
	pthread_mutex_lock(&c->lock);
	bool seen = k->cluster->mod_revision == c->cluster_mod;
	c->cluster_mod = k->cluster->mod_revision;
	pthread_mutex_unlock(&c->lock);
	if (seen)
		return;
	int rc = mlfs_store_grow_cluster(c->st, k->cluster->value, k->cluster->len, &err);
	if (rc == 1)
		mlfs_log(MLFS_LOG_INFO, "cluster: nodes joined the job: it has %d nodes now",
			 mlfs_store_cluster(c->st)->nnodes);
	else if (rc < 0)
		mlfs_log(MLFS_LOG_WARNING,
			 "cluster: the job's cluster.json in etcd does not "
			 "extend this node's: %s",
			 err.text);
}
