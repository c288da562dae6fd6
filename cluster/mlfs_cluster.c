/*
 * mlfs_cluster.c - the control plane of a job of many nodes, on etcd
 * (DESIGN section 7): registration, the job's schema and cluster, the
 * committed config, and one atomic reconfiguration across the nodes. This
 * file starts and stops it and runs the control thread's round; the files
 * it calls do the rest (cluster_i.h draws who calls whom).
 *
 * DESIGN
 * Keys under /mlfs/<job>/ (net_etcd; mlfs_jobkeys.c reads them):
 *   nodes/<id>       {"addr","devices","pid","version","state","steps",
 *                    "backup"}, bound to this node's lease (TTL
 *                    MLFS_LEASE_TTL s, kept alive every second): gone = the
 *                    node is down (mlfs_nodeentry.c).
 *   schema, cluster  the first writer wins (a transaction on "absent"); a
 *                    node whose own differ refuses to join, saying so
 *                    (mlfs_propose.c, mlfs_join.c).
 *   config           the committed config: written only by a transaction.
 *   attempt          {"id","from","to","config","coordinator",
 *                    "participants","down","backups","deadline_ms","job",
 *                    "job_missing"}: created by the coordinator's
 *                    transaction that requires no attempt and "config"
 *                    unchanged since it was read; bound to the
 *                    coordinator's lease (mlfs_propose.c).
 *   votes/<to>/<id>  "<attempt id> ready", or "<attempt id> failed: <reason>":
 *                    a vote counts only for the attempt it names (the
 *                    attempt's random "id"), so votes a dead coordinator's
 *                    attempt left behind never count for a later one.
 *   result/<to>      "committed" or "aborted: <reason>" (for every node's
 *                    status.json and for mlfs reconfigure).
 *
 * The node where config.json is written is the coordinator (propose, on an
 * I/O worker). Every node runs one control thread that reads the job's keys
 * when they change (or every 250 ms), and (mlfs_attempt.c):
 *   - installs the schema and the first config it finds in etcd;
 *   - as a participant (it hosts ranks in the old or the new layout)
 *     prepares the attempt beside its current layout (mlfs_reconf_prepare:
 *     fetches from peers through the peer client) and votes;
 *   - as the coordinator, commits with one transaction (config := new,
 *     attempt and votes deleted, only while the attempt is still its own)
 *     once every participant voted ready; aborts (deletes the attempt) on a
 *     failed vote, a participant's key gone, or the deadline;
 *   - commits its prepared layout when it sees "config" at the attempt's
 *     version, whenever that is (also after a restart of the thread);
 *     aborts it when the attempt is gone and "config" did not move (the
 *     coordinator aborted, or its lease expired with it).
 * That transaction is the single commit point; nothing else decides.
 *
 * job/ is the same on every node after a commit (mlfs_jobsync.c): the
 * coordinator asks every participant for its job/ manifest and puts their
 * union in the attempt (the newest copy of each file wins, naming the node
 * to fetch it from); each participant stages that tree before voting ready
 * and swaps it in at the commit.
 *
 * Backups ("replicas": 1, mlfs_backup.c): each node's entry says whose
 * saved state it holds at which steps; the coordinator names, in the
 * attempt's "backups", the holders of down nodes that hold every rank of
 * theirs at the job's step, and the plan reads what no DP replica has
 * from there (ptc_plan_compute_backups).
 *
 * Nodes join: a daemon whose cluster.json extends the job's (the same
 * nodes first, more after them) replaces the "cluster" key; every node
 * takes the longer one within a round (mlfs_join.c).
 *
 * Job-wide facts: every node publishes its ranks' saved steps in its key;
 * the control thread copies the other nodes' into the store's step table,
 * so a reconfiguration checks the steps of every rank of the job.
 *
 * A node that cannot reach etcd goes on serving its current layout; a
 * config written on it is refused (nothing starts without the control
 * plane), and status.json says "etcd unreachable".
 *
 * Data: struct mlfs_cluster (cluster_i.h), one per daemon, says which lock
 * or thread owns each field. Threads: the control thread (cluster_main);
 * I/O workers run propose (config.json and schema.json writes) and publish
 * the node's entry after a step write (steps_saved), as the backup thread
 * does after a backup; status.json readers run status_add. Lock order: c->lock and st->lock are
 * never held together (st->lock is taken only while c->lock is not, to read or set the store); the
 * backup's lock is taken under c->lock and is a leaf; c->publock is held across the put of the
 * node's entry only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* The store's hook when its reconfiguration state changes: wake up. */
static void reconf_changed(void *arg)
{
	struct mlfs_cluster *c = arg;
	atomic_store(&c->wake, 1);
}

static void round_once(struct mlfs_cluster *c)
{
	struct mlfs_jobkeys k;
	struct ptc_error why = {.text = ""};
	int rc = mlfs_nodeentry_keep_registered(c, &why);

	if (rc == 0)
		rc = mlfs_jobkeys_read(c, &k, &why);
	pthread_mutex_lock(&c->lock);
	snprintf(c->etcd_error, sizeof(c->etcd_error), "%s", rc ? why.text : "");
	pthread_mutex_unlock(&c->lock);
	if (rc)
		return;
	mlfs_join_sync(c, &k);
	mlfs_nodeentry_sync_steps(c, k.nodes);
	mlfs_backup_kick(mlfs_backup_of(c->st));
	mlfs_attempt_follow(c, &k);
	if (k.attempt_j) {
		int64_t from = json_integer_value(json_object_get(k.attempt_j, "from"));
		int64_t to = json_integer_value(json_object_get(k.attempt_j, "to"));
		const char *co = json_string_value(json_object_get(k.attempt_j, "coordinator"));
		mlfs_attempt_participate(c, &k, from, to);
		if (co && strcmp(co, c->me) == 0)
			mlfs_attempt_coordinate(c, &k, to);
	}
	pthread_mutex_lock(&c->lock);
	json_decref(c->nodes);
	json_decref(c->attempt);
	c->nodes = json_incref(k.nodes);
	c->attempt = json_incref(k.attempt_j);
	pthread_mutex_unlock(&c->lock);
	mlfs_jobkeys_free(&k);
	/* What this round changed (a commit: the version; a state) is the
	 * job's at once, not at the next round: a config proposed right after
	 * a commit waits for every node's version. */
	mlfs_nodeentry_publish(c, &why);
}

static void *cluster_main(void *arg)
{
	struct mlfs_cluster *c = arg;
	uint64_t state = 0;
	struct ptc_error why;

	while (!atomic_load(&c->stop)) {
		atomic_store(&c->wake, 0);
		round_once(c);
		int rc = net_etcd_wait(c->etcd, c->prefix, &state, 250, &c->wake, &why);
		if (rc && rc != -ETIMEDOUT && rc != -ECANCELED) {
			struct timespec nap = {0, 200 * 1000000L}; /* etcd down: retry later */
			nanosleep(&nap, NULL);
		}
	}
	return NULL;
}

int mlfs_cluster_start(struct mlfs_store *st, struct mlfs_cluster **out, struct ptc_error *err)
{
	struct mlfs_cluster *c;
	int rc;

	*out = NULL;
	if (!mlfs_store_cluster(st)->etcd || !mlfs_store_cluster(st)->job)
		return ptc_errorf(err, "cluster.json: a job of %d nodes needs \"job\" and \"etcd\"",
				  mlfs_store_cluster(st)->nnodes);
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->publock, NULL);
	c->st = st;
	c->me = mlfs_store_cluster(st)->nodes[st->node].id;
	snprintf(c->prefix, sizeof(c->prefix), "/mlfs/%s/", mlfs_store_cluster(st)->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 5000};
	if ((rc = net_etcd_new(mlfs_store_cluster(st)->etcd, &o, &c->etcd, err)))
		goto err_free;
	if ((rc = mlfs_join_cluster(c, err)))
		goto err_etcd;
	/* Register and read the job once before serving: a restarted node
	 * knows the current version as it mounts. */
	struct ptc_error e;
	if ((rc = mlfs_nodeentry_keep_registered(c, &e))) {
		ptc_error_set(err, rc, "etcd at %s: %s", mlfs_store_cluster(st)->etcd, e.text);
		goto err_etcd;
	}
	round_once(c);
	st->cluster_arg = c;
	st->multinode = true;
	st->propose = mlfs_propose;
	st->status_add = mlfs_nodeentry_status_add;
	st->steps_saved = mlfs_nodeentry_steps_saved;
	st->reconf_changed = reconf_changed;
	if ((rc = -pthread_create(&c->thread, NULL, cluster_main, c))) {
		ptc_error_set(err, rc, "cannot start a thread");
		st->propose = NULL, st->status_add = NULL, st->steps_saved = NULL;
		st->reconf_changed = NULL, st->cluster_arg = NULL;
		goto err_etcd;
	}
	c->running = true;
	*out = c;
	return 0;

err_etcd:
	net_etcd_free(c->etcd);
err_free:
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return rc;
}

void mlfs_cluster_stop(struct mlfs_cluster *c)
{
	struct ptc_error why;
	if (!c)
		return;
	atomic_store(&c->stop, 1);
	atomic_store(&c->wake, 1);
	if (c->running)
		pthread_join(c->thread, NULL);
	if (c->lease) /* leave at once rather than when the lease expires */
		net_etcd_lease_revoke(c->etcd, c->lease, NULL, &why);
	net_etcd_free(c->etcd);
	json_decref(c->nodes);
	json_decref(c->attempt);
	free(c->mine);
	free(c->published);
	mlfs_job_free(c->job);
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}
