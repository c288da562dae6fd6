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
 *                    node is down (mlfs_nodeentry.c). "state" is the last
 *                    settled one (idle, failed, lost). A node's retained
 *                    layout (kept until every node of the last commit
 *                    swapped) is in its /v1/health, not here.
 *   schema, cluster  the first writer wins (a transaction on "absent"); a
 *                    node whose own differ refuses to join, saying so
 *                    (mlfs_propose.c, mlfs_join.c).
 *   config           the committed config, and config_id the attempt that
 *                    committed it: written only by the commit transaction.
 *   attempt          {"id","from","to","config","coordinator",
 *                    "participants","down","backups","deadline_ms","job",
 *                    "job_missing"}: created by the coordinator's
 *                    transaction that requires no attempt and "config"
 *                    unchanged since it was read; bound to the
 *                    coordinator's lease (mlfs_propose.c).
 *   votes/<to>/<id>  "<attempt id> ready", or "<attempt id> failed: <reason>",
 *                    under /mlfs-votes/<job>/ (not /mlfs/<job>/, which every
 *                    node watches: only the coordinator reads votes, with a
 *                    watch of its own while it coordinates): a vote counts
 *                    only for the attempt it names (the attempt's random
 *                    "id"), so votes a dead coordinator's attempt left
 *                    behind never count for a later one.
 *   result/<to>      "committed" or "aborted: <reason>" (for every node's
 *                    status.json and for mlfs reconfigure).
 *   saved/<id>       the newest step the node ever saved, bound to no
 *                    lease: a job whose nodes all restarted knows it had
 *                    state (mlfs_nodeentry.c; removed by mlfs reset).
 *
 * The node where config.json is written is the coordinator (propose, on an
 * I/O worker). Every node follows the job's keys in memory (mlfs_mirror.c:
 * one read, then a watch; an idle job costs etcd only the keep-alives) and
 * runs one control thread that wakes when they change, when its store's
 * reconfiguration state changes or its lease expired (and at least every
 * second while an attempt is in progress, for deadlines). Each round is a
 * snapshot handed to mlfs_decide (mlfs_decide.c, a pure function whose
 * rules are written there and modelled in tests/model/protocol.pml) and
 * its actions carried out (mlfs_attempt.c): install the schema and the
 * first config; prepare an attempt beside the current layout and vote;
 * as the coordinator, commit with one transaction (config and config_id
 * := the attempt's, attempt and votes deleted, only while the attempt is
 * still its own) or abort (delete it); commit a prepared layout only when
 * etcd committed that very attempt; discard one etcd will never commit;
 * a node that missed a commit, or started without the job's state, is
 * lost. That transaction is the single commit point; nothing else decides.
 * The lease is kept alive by a thread of its own (mlfs_nodeentry.c); one
 * that expired is granted again by the control thread, never silently.
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
 * A node that cannot reach etcd goes on serving its current layout and
 * decides nothing: a config written on it is refused (nothing starts
 * without the control plane); an attempt it prepared and voted on waits
 * for etcd's decision, its partition writes refused; status.json says
 * "etcd unreachable" and what it waits for ("waiting").
 *
 * Data: struct mlfs_cluster (cluster_i.h), one per daemon, says which lock
 * or thread owns each field. Threads: the control thread (cluster_main);
 * the keep-alive thread; the mirrors' watch threads (they only apply
 * events and wake the control thread); I/O workers run propose
 * (config.json and schema.json writes) and publish the node's entry after
 * a step write (steps_saved), as the backup thread does after a backup;
 * status.json readers run status_add. Lock order: c->lock and st->lock
 * are never held together (st->lock is taken only while c->lock is not,
 * to read or set the store); the backup's lock is taken under c->lock and
 * is a leaf; c->publock is held across the put of the node's entry only.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* The store's hook when its reconfiguration state changes: wake up (a
 * node whose prepare finished votes now). Store lock held: only signals. */
static void reconf_changed(void *arg)
{
	mlfs_cluster_wake(arg);
}

static void round_once(struct mlfs_cluster *c)
{
	struct mlfs_jobkeys k;
	struct ptc_error why = {.text = ""};
	int rc = mlfs_mirror_sync(&c->mirror, &why);

	if (rc == 0)
		rc = mlfs_jobkeys_mirrored(c, &k, &why);
	/* The votes, followed while this node coordinates an attempt. */
	pthread_mutex_lock(&c->lock);
	bool coordinating = c->mine != NULL;
	pthread_mutex_unlock(&c->lock);
	if (!coordinating && c->votes.watch)
		mlfs_mirror_stop(&c->votes);
	if (rc == 0 && coordinating &&
	    ((rc = mlfs_mirror_sync(&c->votes, &why)) ||
	     (rc = mlfs_mirror_copy(&c->votes, &k.votes, &k.nvotes, &(int64_t){0}, &why))))
		mlfs_jobkeys_free(&k); /* the keys read above: not used this round */
	pthread_mutex_lock(&c->lock);
	snprintf(c->etcd_error, sizeof(c->etcd_error), "%s", rc ? why.text : "");
	pthread_mutex_unlock(&c->lock);
	if (rc) /* rule 1: without etcd nothing is decided */
		return;
	c->rounds++;
	mlfs_join_sync(c, &k);
	mlfs_nodeentry_sync_steps(c, k.nodes);
	mlfs_backup_kick(mlfs_backup_of(c->st));
	mlfs_attempt_round(c, &k, true);
	pthread_mutex_lock(&c->lock);
	json_decref(c->nodes);
	json_decref(c->attempt);
	c->nodes = json_incref(k.nodes);
	c->attempt = json_incref(k.attempt_j);
	pthread_mutex_unlock(&c->lock);
	mlfs_jobkeys_free(&k);
	/* What this round changed (a commit: the version; a state) is the
	 * job's at once: a config proposed right after a commit waits for
	 * every node's version. */
	mlfs_nodeentry_publish(c, &why);
}

/* How long the control thread may sleep without a wake-up: while etcd is
 * unreachable it retries every 200 ms; while an attempt is in progress
 * (a deadline may pass) every second; otherwise only a change wakes it
 * (a long nap, as a safety net). */
static int nap_ms(struct mlfs_cluster *c)
{
	pthread_mutex_lock(&c->lock);
	bool etcd = c->etcd_error[0] != '\0', att = c->attempt != NULL;
	/* a retained layout waits for the swaps: every 50 ms for 2 s after
	 * the commit (they come within milliseconds), then every second (a
	 * node that died before its swap keeps it until the next commit) */
	int64_t swap = c->swap_wait ? mlfs_cluster_now_ms() - c->swap_since_ms : -1;
	pthread_mutex_unlock(&c->lock);
	return etcd ? 200 : swap >= 0 && swap < 2000 ? 50 : att || swap >= 0 ? 1000 : 30000;
}

static void *cluster_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-control"); /* for top -H, perf */
	struct mlfs_cluster *c = arg;

	while (!atomic_load(&c->stop)) {
		round_once(c);
		int ms = nap_ms(c);
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_sec += ms / 1000;
		t.tv_nsec += (long)(ms % 1000) * 1000000L;
		if (t.tv_nsec >= 1000000000L)
			t.tv_sec++, t.tv_nsec -= 1000000000L;
		pthread_mutex_lock(&c->wake_lock);
		while (!c->wake && !atomic_load(&c->stop))
			if (pthread_cond_timedwait(&c->cond, &c->wake_lock, &t))
				break;
		c->wake = false;
		pthread_mutex_unlock(&c->wake_lock);
	}
	return NULL;
}

/* The store's status.json hook: the job's view (mlfs_nodeentry.c) and
 * what this node waits for. */
static void status_add(void *arg, json_t *o)
{
	char waiting[600];

	mlfs_nodeentry_status_add(arg, o);
	mlfs_attempt_waiting(arg, waiting, sizeof(waiting));
	if (waiting[0])
		json_object_set_new(o, "waiting", json_string(waiting));
}

/* The mirror's hook: the job's keys changed. Nodes coming or going wake
 * the coordinator only, and a node's entry changing (its version, state
 * or steps) wakes no one: a retained layout waiting for the swaps looks
 * at them on a short nap instead (nap_ms). Waking on every entry made
 * every node run a round per swap, each reading every entry: the work
 * grew as the cube of the nodes (every node's publish would
 * otherwise make every node run a round: rounds grew as the square of the nodes). */
static void keys_changed(void *arg, int urgent)
{
	struct mlfs_cluster *c = arg;
	bool wake = urgent & MLFS_MIRROR_URGENT;

	if (!wake && (urgent & MLFS_MIRROR_VOTES)) {
		pthread_mutex_lock(&c->lock);
		wake = c->mine != NULL; /* a coordinator sees nodes come and go */
		pthread_mutex_unlock(&c->lock);
	}
	if (wake)
		mlfs_cluster_wake(c);
}

/* The votes mirror's hook (live only while this node coordinates). */
static void votes_changed(void *arg, int urgent)
{
	(void)urgent;
	mlfs_cluster_wake(arg);
}

/* Ends the control and keep-alive threads that run. */
static void stop_threads(struct mlfs_cluster *c)
{
	atomic_store(&c->stop, 1);
	pthread_mutex_lock(&c->wake_lock);
	pthread_cond_signal(&c->cond);
	pthread_cond_signal(&c->keepalive_cond);
	pthread_mutex_unlock(&c->wake_lock);
	if (c->running)
		pthread_join(c->thread, NULL);
	if (c->keepalive_running)
		pthread_join(c->keepalive_thread, NULL);
	c->running = c->keepalive_running = false;
}

/* Frees @c's locks and @c. */
static void cluster_free(struct mlfs_cluster *c)
{
	pthread_cond_destroy(&c->keepalive_cond);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->wake_lock);
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->parsed_lock);
	pthread_mutex_destroy(&c->lock);
	json_decref(c->parsed);
	free(c);
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
	pthread_mutex_init(&c->parsed_lock, NULL);
	pthread_mutex_init(&c->wake_lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_cond_init(&c->keepalive_cond, NULL);
	c->st = st;
	c->me = mlfs_store_cluster(st)->nodes[st->node].id;
	c->saved_put = -1;
	const char *fp = getenv("MLFS_FAILPOINT");
	snprintf(c->failpoint, sizeof(c->failpoint), "%s", fp ? fp : "");
	snprintf(c->prefix, sizeof(c->prefix), "/mlfs/%s/", mlfs_store_cluster(st)->job);
	snprintf(c->vprefix, sizeof(c->vprefix), "/mlfs-votes/%s/", mlfs_store_cluster(st)->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 5000};
	if ((rc = net_etcd_new(mlfs_store_cluster(st)->etcd, &o, &c->etcd, err)))
		goto err_free;
	if ((rc = mlfs_mirror_init(&c->mirror, c->etcd, c->prefix, keys_changed, c)) ||
	    (rc = mlfs_mirror_init(&c->votes, c->etcd, c->vprefix, votes_changed, c))) {
		ptc_error_set(err, rc, "cluster.json: the job's name is too long");
		goto err_etcd;
	}
	if ((rc = mlfs_join_cluster(c, err)))
		goto err_mirror;
	/* Register and read the job once before serving: a restarted node
	 * knows the current version as it mounts. */
	struct ptc_error e;
	if ((rc = mlfs_nodeentry_register(c, &e))) {
		ptc_error_set(err, rc, "etcd at %s: %s", mlfs_store_cluster(st)->etcd, e.text);
		goto err_mirror;
	}
	round_once(c);
	st->cluster_arg = c;
	st->multinode = true;
	st->propose = mlfs_propose;
	st->status_add = status_add;
	st->steps_saved = mlfs_nodeentry_steps_saved;
	st->reconf_changed = reconf_changed;
	if ((rc = -pthread_create(&c->keepalive_thread, NULL, mlfs_nodeentry_keepalive_main, c)) ||
	    (c->keepalive_running = true,
	     rc = -pthread_create(&c->thread, NULL, cluster_main, c))) {
		ptc_error_set(err, rc, "cannot start a thread");
		st->propose = NULL, st->status_add = NULL, st->steps_saved = NULL;
		st->reconf_changed = NULL, st->cluster_arg = NULL;
		goto err_threads;
	}
	c->running = true;
	*out = c;
	return 0;

err_threads:
	stop_threads(c);
err_mirror:
	mlfs_mirror_release(&c->mirror);
	mlfs_mirror_release(&c->votes);
err_etcd:
	net_etcd_free(c->etcd);
err_free:
	cluster_free(c);
	return rc;
}

void mlfs_cluster_stop(struct mlfs_cluster *c)
{
	struct ptc_error why;
	if (!c)
		return;
	stop_threads(c);
	mlfs_mirror_release(&c->mirror); /* its watch's thread ends first */
	mlfs_mirror_release(&c->votes);
	int64_t lease = atomic_load(&c->lease);
	if (lease) /* leave at once rather than when the lease expires */
		net_etcd_lease_revoke(c->etcd, lease, NULL, &why);
	net_etcd_free(c->etcd);
	json_decref(c->nodes);
	json_decref(c->attempt);
	free(c->mine);
	free(c->published);
	json_decref(c->prep_parts);
	json_decref(c->swap_wait);
	mlfs_job_free(c->job);
	cluster_free(c);
}
