/*
 * mlfs_peer.h - the data plane between nodes (mlfs_peer.c): this node's
 * server for its peers and the fetch of partition rows from theirs.
 */
#ifndef MLFS_MLFS_PEER_H
#define MLFS_MLFS_PEER_H

#include "mlfs/mlfs_i.h"
#include "net/net.h"

struct mlfs_peer;

/*
 * Serves @st's partitions, job/ files and health on this node's "addr"
 * (cluster.json) to requests carrying @token (16 to 256 characters), and
 * sets st->fetch so that a reconfiguration fetches rows from peers with
 * it. 0, or -EINVAL (no addr, a bad token), -EADDRINUSE, -ENOMEM with the
 * reason in @why. Call before the mount serves; stop after it stopped.
 */
int mlfs_peer_start(struct mlfs_store *st, const char *token, struct mlfs_peer **out, char *why,
		    size_t whylen);
/* Stops serving (waits for replies in flight) and frees @pe (NULL: fine). */
void mlfs_peer_stop(struct mlfs_peer *pe);
/* The job/ file @path of cluster node @node, fetched with the token into a
 * new buffer (*@data, the caller's). Errors of net_http_get; -EHOSTUNREACH
 * without a data plane. Not from a FUSE worker. */
#define MLFS_JOB_FILE_MAX ((size_t)64 << 20)
int mlfs_peer_job_get(struct mlfs_store *st, int node, const char *path, uint8_t **data,
		      size_t *len, char *why, size_t whylen);
/* The job/ manifest (mlfs_job_manifest) of cluster node @node. */
int mlfs_peer_job_manifest(struct mlfs_store *st, int node, json_t **out, char *why,
			   size_t whylen);
/* The whole partition (@rank, @state, @tensor) of layout @l, as saved at
 * step @snap, from cluster node @node into @dst (its size); no new try
 * starts once *@stop is set. 0, -EINVAL (@dst's size), or
 * net_http_get_range's errors (a 409: the node saved another step
 * meanwhile), with @why. Not from a FUSE worker. */
int mlfs_peer_get_part(struct mlfs_store *st, int node, const struct ptc_layout *l, int rank,
		       int state, int tensor, int64_t snap, struct xf_buf *dst, atomic_int *stop,
		       char *why, size_t whylen);
/* The port the server listens on. */
int mlfs_peer_port(const struct mlfs_peer *pe);

#endif
