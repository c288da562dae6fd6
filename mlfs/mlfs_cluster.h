/*
 * mlfs_cluster.h - the control plane of a job of many nodes, on etcd
 * (mlfs_cluster.c; DESIGN section 7).
 */
#ifndef MLFS_MLFS_CLUSTER_H
#define MLFS_MLFS_CLUSTER_H

#include "mlfs/mlfs_i.h"
#include "net/net.h"

struct mlfs_cluster;

/*
 * Joins the job of @st's cluster.json ("job", "etcd"): checks the job's
 * cluster is the same (the first node puts it), registers this node with a
 * lease, installs the job's schema and committed config if there are, and
 * starts the control thread; from then on schema.json and config.json
 * writes are proposed to etcd (st->propose) and status.json shows the job
 * (st->status_add). 0, or -EINVAL (no job or etcd, another cluster.json),
 * -EIO (etcd unreachable), -ENOMEM, with the reason in @why. Call after
 * mlfs_peer_start, before the mount serves.
 */
int mlfs_cluster_start(struct mlfs_store *st, struct mlfs_cluster **out, char *why, size_t whylen);
/* Stops the control thread, leaves the job (revokes the lease: this node's
 * key vanishes at once) and frees @c (NULL: fine). */
void mlfs_cluster_stop(struct mlfs_cluster *c);

#endif
