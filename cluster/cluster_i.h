/*
 * cluster_i.h - internals shared by the files of cluster/.
 *
 * Inside cluster/, a file calls only files below it in this list (besides
 * store, net, common, ptc and transform), never one above:
 *
 *   mlfs_cluster.c     start/stop, the control thread's round
 *                        -> propose (as st->propose), attempt, nodeentry,
 *                           join, jobkeys, backup
 *   mlfs_propose.c     schema.json and config.json writes proposed to etcd
 *                        -> attempt, join, jobkeys, jobsync
 *   mlfs_attempt.c     an attempt in progress: prepare, vote, commit, abort
 *                        -> nodeentry, jobkeys, jobsync
 *   mlfs_nodeentry.c   this node's entry in etcd, the others' in status.json
 *                        -> jobkeys, backup
 *   mlfs_join.c        joining the job, the job's cluster.json growing
 *                        -> jobkeys
 *   mlfs_jobkeys.c     the job's etcd keys: names, one read of them all
 *   mlfs_peerserver.c  the data plane's server: rows, job/ files, health
 *                        -> backup, jobsync, peerclient
 *   mlfs_jobsync.c     job/ across the nodes: merge, stage -> peerclient
 *   mlfs_backup.c      the previous node's saved state ("replicas": 1)
 *                        -> peerclient
 *   mlfs_peerclient.c  the data plane's client: fetches from peers
 *
 * So the data plane is client <- backup <- server, and the control plane
 * sits on the backups and the client (through jobsync) without knowing the
 * server. Only the store's hooks reach upward, at run time: the backup
 * thread publishes this node's entry through st->steps_saved.
 */
#ifndef MLFS_CLUSTER_I_H
#define MLFS_CLUSTER_I_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cluster/cluster.h"
#include "store/store.h"

/* ------------------------------------------------------------- shared state */

/*
 * One job's control plane on this node (mlfs_cluster_start). Threads: the
 * control thread (cluster_main: every round), I/O workers (st->propose,
 * st->steps_saved after a step write), the backup thread (st->steps_saved
 * after a backup), any thread reading status.json (st->status_add).
 * Lock order: c->lock and st->lock are never held together; the backup's
 * lock (mlfs_backup_describe) is taken under c->lock and is a leaf;
 * c->publock is held across the put of this node's entry, and nothing is
 * taken under it.
 */
struct mlfs_cluster {
	/* Set by mlfs_cluster_start, fixed afterwards. */
	struct mlfs_store *st;
	struct net_etcd *etcd;
	char prefix[300]; /* "/mlfs/<job>/" */
	const char *me;	  /* this node's id */
	pthread_t thread;
	bool running;

	/* Written by the control thread (and start, before it runs); read
	 * without a lock by publish and propose (I/O workers). */
	int64_t lease;
	int64_t last_keepalive_ms; /* the control thread's only */
	atomic_int stop;
	/* Set by stop and by the store's reconf_changed: ends the control
	 * thread's wait for etcd at once (a node whose prepare finished votes
	 * now, not at the next 250 ms round). */
	atomic_int wake;

	pthread_mutex_t lock;
	json_t *nodes;	      /* lock: {id: entry} as last read */
	json_t *attempt;      /* lock: the attempt as last read, or NULL */
	char etcd_error[512]; /* lock: "" when etcd answers */
	/* The attempts (their random ids: a version may be tried again after
	 * an abort) this node started preparing and voted on. */
	char started_id[24]; /* lock */
	/* The attempt whose preparation the store runs (set once its prepare
	 * started there): the store's state speaks for that attempt only, not
	 * for an earlier one to the same version. */
	char prepared_id[24]; /* lock */
	/* No lock: written by vote (the control thread, and propose's failed
	 * vote), read by the control thread. */
	char voted_id[24];
	char *mine;	     /* lock: the text of the attempt this node created */
	int64_t cluster_mod; /* lock: the "cluster" key's revision last taken */
	/* job/ as the coordinator has it, staged for attempt @job_to (the
	 * copy is part of the attempt; swapped in at its commit). Only the
	 * control thread touches these. */
	struct mlfs_job *job;
	int64_t job_to;
	pthread_mutex_t publock; /* published, and the put of the node's key */
	char *published;	 /* the node entry last put */
};

/* Wall-clock milliseconds (an attempt's deadline is one: every node
 * compares it with its own clock). */
static inline int64_t mlfs_cluster_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The version of @st's current view, 0 without one. Any thread. */
static inline int64_t mlfs_cluster_version(struct mlfs_store *st)
{
	struct mlfs_view *v = mlfs_store_view(st);
	int64_t ver = v ? v->config->version : 0;
	mlfs_view_put(v);
	return ver;
}

/* The backups @st keeps (NULL: none, or not started yet; the daemon sets
 * st->backup after mlfs_backup_start). Any thread. */
static inline struct mlfs_backup *mlfs_backup_of(const struct mlfs_store *st)
{
	return __atomic_load_n(&st->backup, __ATOMIC_ACQUIRE);
}

/* Whether the JSON array @ids holds the string @id. */
static inline bool mlfs_cluster_ids_has(const json_t *ids, const char *id)
{
	size_t i;
	json_t *p;
	json_array_foreach(ids, i, p)
	{
		if (json_string_value(p) && strcmp(json_string_value(p), id) == 0)
			return true;
	}
	return false;
}

/* ------------------------------------------------------ mlfs_jobkeys.c */

/* What one read of the job's keys found; mlfs_jobkeys_free releases it. */
struct mlfs_jobkeys {
	struct net_etcd_kv *kvs;
	size_t n;
	/* the keys of these names, in @kvs, or NULL */
	const struct net_etcd_kv *schema, *cluster, *config, *attempt;
	json_t *nodes;	   /* {id: entry} */
	json_t *attempt_j; /* @attempt parsed, or NULL */
	int64_t config_mod;
	int64_t committed; /* @config's version: 0 without one, -1 unreadable */
};

/* The etcd key "<prefix><@fmt ...>" of @c's job into @buf (@cap bytes,
 * truncated to fit). Any thread. */
void mlfs_jobkeys_name(const struct mlfs_cluster *c, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reads every key of @c's job into @k (the caller's: mlfs_jobkeys_free).
 * 0, or net_etcd_range's error with @err and @k empty. Control thread and
 * I/O workers (propose). */
int mlfs_jobkeys_read(struct mlfs_cluster *c, struct mlfs_jobkeys *k, struct ptc_error *err);
/* Releases what mlfs_jobkeys_read put in @k (an empty @k: fine). */
void mlfs_jobkeys_free(struct mlfs_jobkeys *k);

/* ---------------------------------------------------- mlfs_nodeentry.c */

/* Puts this node's entry (nodes/<id>: addr, devices, pid, version, state,
 * its ranks' saved steps, the backup it holds) when it changed since the
 * last put. 0, -ENOMEM, or net_etcd_put's error with @err. Any thread. */
int mlfs_nodeentry_publish(struct mlfs_cluster *c, struct ptc_error *err);
/* Registers (a new lease and the node's key) or keeps the lease alive
 * (once a second); puts the entry again when it changed. 0 or an etcd
 * error with @err. The control thread (and start, before it runs). */
int mlfs_nodeentry_keep_registered(struct mlfs_cluster *c, struct ptc_error *err);
/* Copies the other nodes' ranks' saved steps from @nodes ({id: entry})
 * into the store's step table. Takes st->lock. Any thread. */
void mlfs_nodeentry_sync_steps(struct mlfs_cluster *c, const json_t *nodes);
/* The store's st->steps_saved hook (@arg: the cluster): publishes now. */
void mlfs_nodeentry_steps_saved(void *arg);
/* The store's st->status_add hook (@arg: the cluster): adds "cluster" (the
 * nodes up, their versions and states, etcd, the backup, the attempt
 * without its config and job/) to status.json @o. Takes c->lock. */
void mlfs_nodeentry_status_add(void *arg, json_t *o);

/* ---------------------------------------------------------- mlfs_join.c */

/* Joins the job's cluster (its "cluster" key): ours (the first node puts
 * it), one ours extends (nodes join: ours replaces it), or one that
 * extends ours (nodes joined before us: the store takes it). 0; -EINVAL
 * (another cluster.json), -EIO (etcd), -EAGAIN (the key kept changing), or
 * mlfs_store_grow_cluster's error, each with @err. mlfs_cluster_start. */
int mlfs_join_cluster(struct mlfs_cluster *c, struct ptc_error *err);
/* Nodes joined: when the job's cluster.json in @k grew since the last
 * call, this node's store takes it (logged; one that does not extend ours
 * is logged and left). Control thread and I/O workers (propose). */
void mlfs_join_sync(struct mlfs_cluster *c, const struct mlfs_jobkeys *k);

/* ------------------------------------------------------- mlfs_attempt.c */

/* Attempt @att's "down" nodes and "backups" holders as cluster indices in
 * @dn (arrays malloc'd: mlfs_attempt_down_free, also after an error). 0 or
 * -ENOMEM. Any thread. */
int mlfs_attempt_down(struct mlfs_store *st, const json_t *att, struct mlfs_reconf_down *dn);
/* Frees @dn's arrays and empties it (an empty @dn: fine). */
void mlfs_attempt_down_free(struct mlfs_reconf_down *dn);
/*
 * Starts preparing attempt @aid in the store: the other nodes' steps
 * (@nodes) copied in, the down nodes' ranks given the step the live ranks
 * agree on, then mlfs_reconf_prepare_down of config text @config (@len
 * bytes; NULL: -EINVAL) with @dn. 0 once the store runs it (and the
 * attempt is marked prepared: the store's state speaks for it from now
 * on), or its error with @err. Control thread and I/O workers (propose).
 */
int mlfs_attempt_prepare(struct mlfs_cluster *c, const json_t *nodes, const char *aid,
			 const char *config, size_t len, const struct mlfs_reconf_down *dn,
			 struct ptc_error *err);
/* Votes "<@aid> failed: <@reason>" on attempt @to (an etcd error is
 * ignored: the coordinator's deadline ends the attempt then). */
void mlfs_attempt_vote_failed(struct mlfs_cluster *c, int64_t to, const char *aid,
			      const char *reason);
/* This node's part in attempt @to (from @from) of @k, round after round:
 * prepares it once, stages the attempt's job/, votes. Control thread. */
void mlfs_attempt_participate(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t from,
			      int64_t to);
/* The coordinator's round for its attempt @to: commits it once every
 * participant voted ready, aborts it on a failed vote, a participant down
 * or the deadline. Control thread. */
void mlfs_attempt_coordinate(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, int64_t to);
/* Follows the committed config of @k: installs the schema and the first
 * config, commits a prepared attempt that etcd committed, aborts one that
 * etcd dropped, marks the node lost when it missed a commit. Control
 * thread. */
void mlfs_attempt_follow(struct mlfs_cluster *c, const struct mlfs_jobkeys *k);

/* ------------------------------------------------------- mlfs_propose.c */

/* The store's st->propose hook (@arg: the cluster): a schema.json
 * (@config false) or config.json write @text proposed to the job. 0 once
 * etcd took it (and, for a config, once this node prepares the attempt or
 * installed the first config); -EINVAL (a bad or refused text), -EBUSY
 * (another attempt), -EIO (etcd), -ENOMEM, with the reason in @err. I/O
 * workers. */
int mlfs_propose(void *arg, bool config, const char *text, size_t len, struct ptc_error *err);

/* ------------------------------------------------------- mlfs_jobsync.c */

/*
 * The job/ every node will have after an attempt: the union of the job/
 * trees of the nodes @parts (ids; this node, @me, read locally, the others
 * through their peer servers), the most recently modified copy of each
 * file winning (ties: the first of @parts), each entry naming the node to
 * fetch it from ("s"), sorted so that directories come before what they
 * hold. A node whose tree cannot be read is appended to @missing (its vote
 * then fails: its job/ would be lost otherwise). A new reference; NULL
 * with *@rc = -ENOMEM. I/O workers (propose).
 */
json_t *mlfs_jobsync_merge(struct mlfs_store *st, const char *me, const json_t *parts,
			   json_t *missing, int *rc);

/*
 * Builds the job/ tree of @manifest (mlfs_jobsync_merge's) into *@out (the
 * caller's: mlfs_job_free): files this node has alike (size and hash) are
 * copied, the others fetched from the node the entry names (else
 * @coordinator) and checked against the manifest's size and hash. 0, or
 * -ENOMEM, -EINVAL (a bad manifest), -EIO (a copy changed), or the
 * fetch's error, with @err. The control thread.
 */
int mlfs_jobsync_stage(struct mlfs_store *st, const json_t *manifest, const char *coordinator,
		       struct mlfs_job **out, struct ptc_error *err);

/* The job/ node at @path ("a/b", components split by one or more '/')
 * under @root, or NULL. The store lock held when @root is st->job. */
struct mlfs_job *mlfs_jobsync_find(struct mlfs_job *root, const char *path);

/* ---------------------------------------------------- mlfs_peerclient.c */

/* The data plane's client: one libcurl handle set carrying the token. */
struct mlfs_peerclient;

/* A client for @st's peers whose requests carry @token (checked by the
 * caller). 0, or net_http_new's error with @err. */
int mlfs_peerclient_new(struct mlfs_store *st, const char *token, struct mlfs_peerclient **out,
			struct ptc_error *err);
/* Makes @cl the store's fetch (st->fetch, st->fetch_arg), which the
 * mlfs_peer_* fetches of cluster.h use too. Before the mount serves. */
void mlfs_peerclient_attach(struct mlfs_peerclient *cl);
/* Frees @cl (NULL: fine); no fetch may be running. */
void mlfs_peerclient_free(struct mlfs_peerclient *cl);
/* The geometry of partition (@rank, @state, @tensor) of @l: @outer blocks
 * of @prows rows of @rb bytes (one row when the tensor is not split). */
void mlfs_peer_part_geometry(const struct ptc_layout *l, int rank, int state, int tensor,
			     int64_t *outer, int64_t *prows, int64_t *rb);

#endif
