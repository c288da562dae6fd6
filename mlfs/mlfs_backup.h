/*
 * mlfs_backup.h - backups of the saved state of the previous node, for a
 * config with "replicas": 1 (mlfs_backup.c; DESIGN section 7).
 */
#ifndef MLFS_MLFS_BACKUP_H
#define MLFS_MLFS_BACKUP_H

#include <jansson.h>

#include "mlfs/mlfs_i.h"

struct mlfs_backup;

/* Starts keeping backups for @st (a job of many nodes, with a data plane:
 * mlfs_peer_start first). 0, -ENOMEM, or a pthread error. */
int mlfs_backup_start(struct mlfs_store *st, struct mlfs_backup **out);
/* Stops the thread and frees the backups (NULL: fine). */
void mlfs_backup_stop(struct mlfs_backup *b);
/* The saved steps may have changed (a round of the control plane). */
void mlfs_backup_kick(struct mlfs_backup *b);
/* What this node holds, for its etcd entry and status.json:
 * {"of": node id, "version", "steps": {"<rank>": step}, "bytes"[, "error"]},
 * or NULL when it holds none (no "replicas" in the current config). */
json_t *mlfs_backup_describe(struct mlfs_backup *b);
/* The backup of partition (@rank, @state, @tensor) of layout @version,
 * pinned, its checksum verified (once); NULL with @why when there is none
 * or it is corrupt. Peer server threads. */
struct xf_buf *mlfs_backup_get(struct mlfs_backup *b, int64_t version, int rank, int state,
			       int tensor, char *why, size_t whylen);

#endif
