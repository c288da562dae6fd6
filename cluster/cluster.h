/*
 * cluster.h - a job of many nodes: the control plane on etcd, the peer
 * data plane, backups (DESIGN section 7). The daemon starts them in this
 * order, before the mount serves: mlfs_peer_start, mlfs_backup_start,
 * mlfs_cluster_start; and stops them after it stopped: the cluster, the
 * peer server (its threads read the backups), the backups.
 */
#ifndef MLFS_CLUSTER_H
#define MLFS_CLUSTER_H

#include <jansson.h>

#include "store/store.h"
#include "net/net.h"

/* ------------------------------------------------------------------------
 * The control plane of a job of many nodes, on etcd (mlfs_cluster.c and
 * the files it runs).
 */

struct mlfs_cluster;

/*
 * Joins the job of @st's cluster.json ("job", "etcd"): checks the job's
 * cluster is the same (the first node puts it), registers this node with a
 * lease, installs the job's schema and committed config if there are, and
 * starts the control thread; from then on schema.json and config.json
 * writes are proposed to etcd (st->propose) and status.json shows the job
 * (st->status_add). 0, or -EINVAL (no job or etcd, another cluster.json),
 * -EIO (etcd unreachable), -ENOMEM, with the reason in @err. Call after
 * mlfs_peer_start, before the mount serves.
 */
int mlfs_cluster_start(struct mlfs_store *st, struct mlfs_cluster **out, struct ptc_error *err);
/* Stops the control thread, leaves the job (revokes the lease: this node's
 * key vanishes at once) and frees @c (NULL: fine). */
void mlfs_cluster_stop(struct mlfs_cluster *c);

/* ------------------------------------------------------------------------
 * The data plane between nodes: this node's server for its peers
 * (mlfs_peerserver.c) and the fetches from theirs (mlfs_peerclient.c).
 */

struct mlfs_peer;

/*
 * Serves @st's partitions, job/ files and health on this node's "addr"
 * (cluster.json), or on @listen when not NULL (mlfs mount --peer-listen:
 * a proxy or a port forward in front of the node, at the addr its peers
 * connect to), to requests carrying @token (16 to 256 characters), and
 * sets st->fetch so that a reconfiguration fetches rows from peers with
 * it. 0, or -EINVAL (no addr, a bad token), -EADDRINUSE, -ENOMEM with the
 * reason in @err. Call before the mount serves; stop after it stopped.
 */
int mlfs_peer_start(struct mlfs_store *st, const char *listen, const char *token,
		    struct mlfs_peer **out, struct ptc_error *err);
/* Stops serving (waits for replies in flight; NULL: fine). Its client
 * still fetches: the backup thread may use it until mlfs_backup_stop. */
void mlfs_peer_stop(struct mlfs_peer *pe);
/* Stops serving if it still does and frees @pe and its client (NULL:
 * fine): no fetch may run any more (after mlfs_backup_stop). */
void mlfs_peer_free(struct mlfs_peer *pe);
/* The job/ file @path of cluster node @node, fetched with the token into a
 * new buffer (*@data, the caller's). Errors of net_http_get; -EHOSTUNREACH
 * without a data plane. Not from a FUSE worker. */
int mlfs_peer_job_get(struct mlfs_store *st, int node, const char *path, uint8_t **data,
		      size_t *len, struct ptc_error *err);
/* The job/ manifest (mlfs_job_manifest) of cluster node @node into *@out
 * (a new reference), within 2 s. Errors of net_http_get, -EIO (not a
 * manifest), -EHOSTUNREACH without a data plane, with @err. Not from a
 * FUSE worker. */
int mlfs_peer_job_manifest(struct mlfs_store *st, int node, json_t **out, struct ptc_error *err);
/* Cluster node @node's /v1/health ({"node", "version", "state",
 * "retained"}) into *@out (the caller's), within 2 s. Errors of
 * net_http_get; -EIO for a reply that is not a JSON object. */
int mlfs_peer_health(struct mlfs_store *st, int node, json_t **out, struct ptc_error *err);
/* A node's entry as its swap ack carries it to the coordinator, which puts
 * it with the others' in the transaction of its announcement
 * (mlfs_attempt.c): the entry's JSON text, the lease it is bound to, and
 * the mod revision of the node's key as the node last put it (the
 * transaction puts it only while the key is still that). */
struct mlfs_vote_entry {
	const char *entry;
	int64_t lease, rev;
};
/* This node's vote @vote ("ready", "failed: <reason>", or "swapped" with
 * its entry @e, or NULL) on attempt @aid to version @to, delivered to the
 * attempt's coordinator, cluster node @node (POST /v1/vote:
 * mlfs_votebox.c), within 2 s. Errors of net_http_post_json, -EHOSTUNREACH
 * without a data plane, with @err. Not from a FUSE worker. */
int mlfs_peer_vote(struct mlfs_store *st, int node, int64_t to, const char *aid, const char *vote,
		   const struct mlfs_vote_entry *e, struct ptc_error *err);
/* The whole partition (@rank, @state, @tensor) of layout @l, as saved at
 * step @snap, from cluster node @node into @dst (its size); no new try
 * starts once *@stop is set. 0, -EINVAL (@dst's size), -EHOSTUNREACH
 * without a data plane, or net_http_get_range's errors (a 409: the node
 * saved another step meanwhile), with @err. Not from a FUSE worker. */
int mlfs_peer_get_part(struct mlfs_store *st, int node, const struct ptc_layout *l, int rank,
		       int state, int tensor, int64_t snap, struct xf_buf *dst, atomic_int *stop,
		       struct ptc_error *err);
/* The port the server listens on. Any thread. */
int mlfs_peer_port(const struct mlfs_peer *pe);

/* ------------------------------------------------------------------------
 * Backups of the saved state of the previous node, for a config with
 * "replicas": 1 (mlfs_backup.c).
 */

struct mlfs_backup;

/* Starts keeping backups for @st (a job of many nodes, with a data plane:
 * mlfs_peer_start first). 0, -ENOMEM, or a pthread error. */
int mlfs_backup_start(struct mlfs_store *st, struct mlfs_backup **out);
/* Stops the thread and frees the backups (NULL: fine). After the peer
 * server stopped. */
void mlfs_backup_stop(struct mlfs_backup *b);
/* Ends the backup thread alone (the table stays, served until
 * mlfs_backup_stop): before mlfs_cluster_stop, whose hooks the thread
 * calls (NULL: fine; again: fine). */
void mlfs_backup_halt(struct mlfs_backup *b);
/* The saved steps may have changed (a round of the control plane). NULL:
 * nothing. Any thread. */
void mlfs_backup_kick(struct mlfs_backup *b);
/* What this node holds, for its etcd entry and status.json:
 * {"of": node id, "version", "steps": {"<rank>": step}, "bytes"[, "error"]}
 * (a new reference), or NULL when it holds none (no "replicas" in the
 * current config; @b NULL). Any thread. */
json_t *mlfs_backup_describe(struct mlfs_backup *b);
/* The backup of partition (@rank, @state, @tensor) of layout @version,
 * pinned (the caller's: xf_buf_put), its checksum verified (once); NULL
 * with @err (not NULL) when there is none (code -ENOENT) or it is corrupt
 * (-EIO). Peer server threads. */
struct xf_buf *mlfs_backup_get(struct mlfs_backup *b, int64_t version, int rank, int state,
			       int tensor, struct ptc_error *err);

/*
 * `mlfs reset`: starts the job of @cl afresh (mlfs_reset.c): removes its
 * committed config, attempt, results and saved marks from etcd in
 * one transaction that requires every node of @cl to be down; the schema
 * and cluster stay. The names removed (relative to the job's prefix) are
 * appended to @removed (NULL: not wanted). 0, or -EBUSY (a node is up),
 * -EINVAL (no etcd in @cl), etcd's error, with @err. Any thread.
 */
int mlfs_cluster_reset(const struct ptc_cluster *cl, json_t *removed, struct ptc_error *err);

/*
 * `mlfs resume`: every node of the job of @cl lost its memory; restores
 * the snapshot @from (a snapshot, or a directory of step-<N> ones: the
 * newest; NULL: the newest under the committed config's "snapshot" dir)
 * into the committed layout (mlfs_resume.c): puts etcd's "restore" key,
 * then waits up to @wait_s seconds for every node that is up to say it
 * restored. @out gets "dir", "step", "version" and "nodes" {id: outcome}.
 * 0, or -EBUSY (a node holds state), -EIO (a node failed), ... with @err.
 */
int mlfs_cluster_resume(const struct ptc_cluster *cl, const char *from, int wait_s, json_t *out,
			struct ptc_error *err);
/* Whether `mlfs resume` may restore the job of config @c, whose node
 * entries in etcd are @nodes ({id: entry}): 0 when no node of @c is up
 * with state in memory (each is down or "lost") and one is up; else
 * -EBUSY or -EAGAIN with @err naming why. Pure. */
int mlfs_resume_refusal(const struct ptc_config *c, const json_t *nodes, struct ptc_error *err);

#endif
