/*
 * mlfs_reset.c - `mlfs reset`: a job started afresh, for an operator
 * whose nodes all lost their memory (DESIGN section 7: a daemon that
 * restarted without its memory is lost at every version, and no config
 * makes zero-filled partitions current state).
 *
 * What it removes from etcd, in one transaction that requires every node
 * of cluster.json to be down (no entry under MLFS_KEYS_NODES: its lease is
 * gone): the committed config and the attempt that committed it, an
 * attempt in progress, results, the "released", "restore" and "import" keys,
 * and the saved/<id> marks that say the job had state. The schema and
 * the job's cluster stay. The daemons mounted afterwards find no config:
 * the operator writes one and imports a checkpoint, or resumes from a
 * snapshot (mlfs resume).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cluster/cluster_i.h"

int mlfs_cluster_reset(const struct ptc_cluster *cl, json_t *removed, struct ptc_error *err)
{
	struct net_etcd *etcd;
	struct net_etcd_kv *kvs = NULL, *nkvs = NULL;
	size_t n = 0, nn = 0;
	char prefix[300], nprefix[300], keys[8][340], *nodes = NULL;
	bool ok = false;
	int rc;

	if (!cl->etcd || !cl->job)
		return ptc_errorf(err, "cluster.json: a job of many nodes (\"job\" and \"etcd\") "
				       "has nothing to reset");
	snprintf(prefix, sizeof(prefix), MLFS_KEYS_JOB, cl->job);
	snprintf(nprefix, sizeof(nprefix), MLFS_KEYS_NODES, cl->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 10000};
	if ((rc = net_etcd_new(cl->etcd, &o, &etcd, err)))
		return rc;
	if ((rc = net_etcd_range(etcd, prefix, true, &kvs, &n, NULL, NULL, err)) ||
	    (rc = net_etcd_range(etcd, nprefix, true, &nkvs, &nn, NULL, NULL, err)))
		goto out;
	/* Every node down: a live daemon would go on serving the old state. */
	size_t nplen = strlen(nprefix);
	for (size_t i = 0; i < nn; i++)
		if (!strchr(nkvs[i].key + nplen, '/')) { /* an entry, not a saved mark */
			rc = ptc_error_set(err, -EBUSY,
					   "node %s is up (its lease is alive): unmount every node "
					   "of the job (mlfs umount) before a reset",
					   nkvs[i].key + nplen);
			goto out;
		}
	struct net_etcd_cmp *cmps = calloc((size_t)cl->nnodes, sizeof(*cmps));
	nodes = calloc((size_t)cl->nnodes, 340);
	if (!cmps || !nodes) {
		free(cmps);
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < cl->nnodes; i++) {
		snprintf(nodes + (size_t)i * 340, 340, "%s%s", nprefix, cl->nodes[i].id);
		cmps[i] = (struct net_etcd_cmp){.key = nodes + (size_t)i * 340,
						.target = NET_ETCD_VERSION,
						.result = NET_ETCD_EQUAL};
	}
	/* The job's keys but the schema and cluster; then the saved marks,
	 * under their own prefix. */
	static const char *const names[] = {"config",	"config_id", "attempt", "result/",
					    "released", "restore",   "import",	"saved/"};
	struct net_etcd_op ops[8];
	for (int i = 0; i < 8; i++) {
		snprintf(keys[i], sizeof(keys[i]), "%s%s", i < 7 ? prefix : nprefix, names[i]);
		ops[i] = (struct net_etcd_op){.kind = NET_ETCD_DELETE,
					      .key = keys[i],
					      .prefix = names[i][strlen(names[i]) - 1] == '/'};
	}
	rc = net_etcd_txn(etcd, cmps, (size_t)cl->nnodes, ops, 8, NULL, 0, &ok, NULL, NULL, err);
	free(cmps);
	if (rc == 0 && !ok)
		rc = ptc_error_set(err, -EBUSY,
				   "a node of the job came up meanwhile: unmount "
				   "every node before a reset");
	for (size_t i = 0; rc == 0 && removed && i < n; i++) {
		const char *name = kvs[i].key + strlen(prefix);
		for (int j = 0; j < 7; j++)
			if (strncmp(name, names[j], strlen(names[j])) == 0 &&
			    (ops[j].prefix || strcmp(name, names[j]) == 0))
				json_array_append_new(removed, json_string(name));
	}
	for (size_t i = 0; rc == 0 && removed && i < nn; i++) /* the saved marks */
		json_array_append_new(removed, json_string(nkvs[i].key + nplen));
out:
	free(nodes);
	net_etcd_kvs_free(kvs, n);
	net_etcd_kvs_free(nkvs, nn);
	net_etcd_free(etcd);
	return rc;
}
