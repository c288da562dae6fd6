/*
 * cluster_i.h - internals shared by the files of cluster/.
 */
#ifndef MLFS_CLUSTER_I_H
#define MLFS_CLUSTER_I_H

/*
 * mlfs_jobsync.h - job/ is the same on every node after a commit
 * (mlfs_jobsync.c; used by the control plane, mlfs_cluster.c).
 */

#include <jansson.h>

#include "store/store.h"

/*
 * The job/ every node will have after an attempt: the union of the job/
 * trees of the nodes @parts (ids; this node, @me, read locally, the others
 * through their peer servers), the most recently modified copy of each
 * file winning (ties: the first of @parts), each entry naming the node to
 * fetch it from ("s"), sorted so that directories come before what they
 * hold. A node whose tree cannot be read is appended to @missing (its vote
 * then fails: its job/ would be lost otherwise). NULL with *@rc = -ENOMEM.
 */
json_t *mlfs_jobsync_merge(struct mlfs_store *st, const char *me, const json_t *parts,
			   json_t *missing, int *rc);

/*
 * Builds the job/ tree of @manifest (mlfs_jobsync_merge's) into *@out:
 * files this node has alike (size and hash) are copied, the others fetched
 * from the node the entry names (else @coordinator) and checked against
 * the manifest's size and hash. 0, or an error with @why.
 */
int mlfs_jobsync_stage(struct mlfs_store *st, const json_t *manifest, const char *coordinator,
		       struct mlfs_job **out, char *why, size_t whylen);

#endif
