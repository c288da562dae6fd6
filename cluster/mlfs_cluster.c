/*
 * mlfs_cluster.c - the control plane of a job of many nodes, on etcd
 * (DESIGN section 7): registration, the job's schema and cluster, the
 * committed config, and one atomic reconfiguration across the nodes. This
 * file starts and stops it and runs the control thread's round; the files
 * it calls do the rest (cluster_i.h draws who calls whom).
 *
 * DESIGN
 * Keys under /mlfs/<job>/, which every node follows (net_etcd;
 * mlfs_jobkeys.c reads them):
 *   schema, cluster  the first writer wins (a transaction on "absent"); a
 *                    node whose own differ refuses to join, saying so
 *                    (mlfs_propose.c, mlfs_join.c).
 *   config           the committed config, and config_id the attempt that
 *                    committed it: written only by the commit transaction.
 *   attempt          {"id","from","to","config","coordinator",
 *                    "participants","down","backups","deadline_ms","job",
 *                    "job_missing","step"}: created by the coordinator's
 *                    transaction that requires no attempt and "config"
 *                    unchanged since it was read; bound to the
 *                    coordinator's lease (mlfs_propose.c).
 *   result/<to>      "committed" or "aborted: <reason>" (for every node's
 *                    status.json and for mlfs reconfigure).
 *   released         the newest version whose commit every participant
 *                    swapped to: the nodes drop the layout they retained
 *                    for it (mlfs_decide's rule 8).
 *   restore          `mlfs resume`'s request (mlfs_resume.c).
 * Votes are not in etcd: a participant sends its vote ("ready", or
 * "failed: <reason>", naming the attempt's random id) to the coordinator's
 * peer server (POST /v1/vote), whose box keeps each node's last one
 * (mlfs_votebox.c); the coordinator's rounds decide on them. A vote counts
 * only for the attempt it names, so one for an earlier attempt never
 * counts for a later one.
 * Keys under /mlfs-nodes/<job>/, which a node follows only while it needs
 * them (need_peers: it coordinates, or announces the release of its
 * commit, or waited 2 s for that announcement (longer past 1,000 nodes:
 * mlfs_release_wait_ms), or keeps backups);
 * status.json and mlfs snapshot read them when the node does not:
 *   <id>             {"addr","devices","pid","version","state","steps",
 *                    "backup","restore"}, bound to this node's lease (TTL
 *                    6 s, kept alive every 2 s; longer past 2,000
 *                    nodes: mlfs_lease_schedule): gone = the node is
 *                    down (mlfs_nodeentry.c). "state" is the last
 *                    settled one (idle, failed, lost). A node's retained
 *                    layout is in its /v1/health, not here.
 *   saved/<id>       the newest step the node ever saved, bound to no
 *                    lease: a job whose nodes all restarted knows it had
 *                    state (mlfs_nodeentry.c; removed by mlfs reset).
 * Why apart: every put under a prefix reaches every watch of it. With the
 * entries among the job's keys, each node's put after its swap, and after
 * every step it saved, reached every node: N^2 events per reconfiguration
 * and per training step, which made etcd and the daemons' watch threads
 * the cost of a reconfiguration at 32 nodes and more.
 *
 * The node where config.json is written is the coordinator (propose, on an
 * I/O worker). Every node follows the job's keys in memory (mlfs_mirror.c:
 * a watch, then one read; an idle job costs etcd only the keep-alives).
 * A change of them runs a round on the watch's thread itself, when no
 * other round runs (keys_changed); the control thread runs the others:
 * when its store's reconfiguration state changes, a vote arrives, its
 * lease expired, and when a round is due (every second while an attempt
 * is in progress, for deadlines; rounds are serialized by round_lock).
 * The announcement of a release ("released") wakes no node: each
 * releases at its next round, within about a second (released_put); a
 * node that saw it never falls back to reading the entries. A round on
 * the watch's thread holds the job's mirror where it was until it ends
 * (a restore or a job-wide import reads for long): other readers of the
 * mirror (the controller, propose) then see older keys, which etcd's
 * transactions compare anyway. Each round is a
 * snapshot handed to mlfs_decide (mlfs_decide.c, a pure function whose
 * rules are written there and modelled in tests/model/protocol.pml) and
 * its actions carried out (mlfs_attempt.c): install the schema and the
 * first config; prepare an attempt beside the current layout and vote;
 * as the coordinator, commit with one transaction (config and config_id
 * := the attempt's, the attempt deleted, only while the attempt is
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
 * Job-wide facts: every node publishes its ranks' saved steps in its
 * entry; the coordinator checks that every live rank saved the same step
 * before it proposes, and puts that step in the attempt ("step"), which
 * each participant takes for the other nodes' ranks; status.json and
 * mlfs snapshot read the entries when they need every rank's step.
 *
 * A node that cannot reach etcd goes on serving its current layout and
 * decides nothing: a config written on it is refused (nothing starts
 * without the control plane); an attempt it prepared and voted on waits
 * for etcd's decision, its partition writes refused; status.json says
 * "etcd unreachable" and what it waits for ("waiting").
 *
 * Data: struct mlfs_cluster (cluster_i.h), one per daemon, says which lock
 * or thread owns each field. Threads: the control thread (cluster_main);
 * the keep-alive thread; the mirrors' watch threads (they apply events;
 * the job's runs rounds, the entries' wakes the control thread); I/O workers run propose
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

/* Set by the control thread around the actions whose state changes are
 * its own round's (mlfs_cluster_own_changes). */
static _Thread_local bool own_changes;

void mlfs_cluster_own_changes(bool on)
{
	own_changes = on;
}

/* The store's hook when its reconfiguration state changes: wake up (a
 * node whose prepare finished votes now), unless the change is the
 * control thread's own prepare or commit, whose round goes on to publish
 * it and whose next round would find nothing to do: two rounds of six per
 * participant per reconfiguration. Store lock held: only signals. */
static void reconf_changed(void *arg)
{
	if (!own_changes)
		mlfs_cluster_wake(arg);
}

/* The store's hook when job/ changes through the mount: the first change
 * since the digest this node's entry carries wakes the control thread,
 * whose round puts the entry without it (a coordinator reads this node's
 * job/ again from then on); later ones find the entry already without it.
 * Store lock held: only signals. */
static void job_changed(void *arg)
{
	struct mlfs_cluster *c = arg;
	if (!atomic_exchange(&c->job_woke, true))
		mlfs_cluster_wake(c);
}

/* Whether the release of the commit this node waits for (c->lock held) was
 * announced: its next round releases; no need to read the entries. */
static bool announced(struct mlfs_cluster *c)
{
	return c->swap_wait && atomic_load(&c->released_seen) >= c->swap_version;
}

/* Whether this node follows the nodes' entries now: it coordinates an
 * attempt, or is building one (who is down: rule 7; the watch is live
 * before the attempt exists, not started while every vote comes in), it
 * made the last commit and waits for every participant's swap to announce
 * it (rule 8), a retained layout waited for an announcement for 2 s
 * (mlfs_release_wait_ms; its coordinator may be gone: it looks itself),
 * or it keeps backups (the steps of the node it backs up). Otherwise no
 * node's entry put reaches it. */
static bool need_peers(struct mlfs_cluster *c)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	bool backups = v && v->config->replicas > 0;
	mlfs_view_put(v);
	pthread_mutex_lock(&c->lock);
	/* (announce is set by the commit transaction, before this node's
	 * own swap sets swap_wait: the entries stay followed between) */
	bool need = backups || c->mine != NULL || c->proposing || c->announce ||
		    mlfs_controller_leading(c->ctl) ||
		    (c->swap_wait && !announced(c) &&
		     mlfs_cluster_now_ms() - c->swap_since_ms >=
			 mlfs_release_wait_ms(mlfs_store_cluster(c->st)->nnodes));
	pthread_mutex_unlock(&c->lock);
	return need;
}

/* Starts or stops following @m as @need says: 0, or etcd's error. */
static int follow(struct mlfs_mirror *m, bool need, struct ptc_error *err)
{
	if (!need) {
		if (m->watch)
			mlfs_mirror_stop(m);
		return 0;
	}
	return mlfs_mirror_sync(m, err);
}

/* The attempt this node created vanished from etcd without its own
 * commit or abort (a person's config replaced the controller's): it no
 * longer coordinates it. Not before etcd as read is past its creation. */
static void forget_vanished(struct mlfs_cluster *c, const struct mlfs_jobkeys *k)
{
	pthread_mutex_lock(&c->lock);
	if (c->mine && c->mine_rev && k->revision >= c->mine_rev &&
	    !(k->attempt && strcmp(k->attempt->value, c->mine) == 0)) {
		free(c->mine);
		c->mine = NULL;
		c->mine_rev = 0;
	}
	pthread_mutex_unlock(&c->lock);
}

/* The vote in this node's entry (mlfs_attempt.c's vote_in_entry) is
 * dropped once etcd as read @k has no longer its attempt: the entry's
 * next put (the swap's, at a commit) goes without it. */
static void drop_entry_vote(struct mlfs_cluster *c, const struct mlfs_jobkeys *k)
{
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));

	pthread_mutex_lock(&c->lock);
	const char *voted = json_string_value(json_object_get(c->entry_vote, "attempt"));
	if (c->entry_vote && !(aid && voted && strcmp(aid, voted) == 0)) {
		json_decref(c->entry_vote);
		c->entry_vote = NULL;
	}
	pthread_mutex_unlock(&c->lock);
}

static void round_once(struct mlfs_cluster *c)
{
	struct mlfs_jobkeys k;
	struct ptc_error why = {.text = ""};
	pthread_mutex_lock(&c->lock);
	/* decides on the votes, or on the swap acks of its commit */
	bool coordinating = c->mine != NULL || c->proposing || c->announce;
	pthread_mutex_unlock(&c->lock);
	int rc = mlfs_mirror_sync(&c->mirror, &why);

	if (rc == 0)
		rc = mlfs_nodeentry_read_saved(c, &why);
	bool peers = need_peers(c);
	if (rc == 0 && !peers && c->peers.watch)
		mlfs_nodeentry_keep_seen(c); /* status.json's, fresh as the mirror stops */
	if (rc == 0)
		rc = follow(&c->peers, peers, &why);
	if (rc == 0)
		rc = mlfs_jobkeys_mirrored(c, &k, &why);
	if (rc == 0 && coordinating && c->st->votebox &&
	    mlfs_votebox_copy(c->st->votebox, &k.votes, &k.nvotes))
		/* out of memory: no vote counts this round; the next one (a
		 * second at most while the attempt runs) copies them again */
		mlfs_log(MLFS_LOG_WARNING, "cluster: out of memory for the votes");
	pthread_mutex_lock(&c->lock);
	snprintf(c->etcd_error, sizeof(c->etcd_error), "%s", rc ? why.text : "");
	pthread_mutex_unlock(&c->lock);
	if (rc) /* rule 1: without etcd nothing is decided */
		return;
	c->rounds++;
	forget_vanished(c, &k);
	mlfs_join_sync(c, &k);
	if (k.nodes_known)
		mlfs_nodeentry_sync_steps(c, k.nodes);
	drop_entry_vote(c, &k);
	if (c->publish_after && k.released >= c->publish_after) {
		/* every participant swapped: this node's entry says so now
		 * (spread past 1,000 nodes), unless the announcement put the
		 * one its ack carried */
		mlfs_nodeentry_adopt(c, k.released, k.released_mine, k.released_rev);
		c->publish_after = 0;
		c->publish_at_ms =
		    mlfs_cluster_now_ms() +
		    mlfs_publish_delay_ms(mlfs_store_cluster(c->st)->nnodes, c->st->node);
	}
	mlfs_attempt_round(c, &k, true);
	/* after the actions: a first layout installed (or a commit) by this
	 * round is what the backup thread must see; kicked before it, the
	 * thread found no layout and waited for the next round, up to the
	 * 30 s nap when nothing else changed */
	mlfs_backup_kick(mlfs_backup_of(c->st));
	mlfs_controller_note(c->ctl, &k);
	pthread_mutex_lock(&c->lock);
	json_decref(c->attempt);
	c->attempt = json_incref(k.attempt_j);
	pthread_mutex_unlock(&c->lock);
	mlfs_jobkeys_free(&k);
	/* What this round changed (a commit: the version; a state) is the
	 * job's at once: a config proposed right after a commit waits for
	 * every node's version. */
	if (mlfs_cluster_now_ms() >= c->publish_at_ms) /* mlfs_publish_delay_ms */
		c->publish_failed = mlfs_nodeentry_publish(c, &why) != 0;
	/* This round may have changed the need for the entries: a release
	 * ends it (no put of theirs should reach this node until its next
	 * round), a first layout with backups starts it (the backup thread
	 * reads the steps from them). */
	bool need = need_peers(c);
	if (c->peers.watch && !need) {
		mlfs_nodeentry_keep_seen(c);
		mlfs_mirror_stop(&c->peers);
	} else if (need && !mlfs_mirror_live(&c->peers)) {
		follow(&c->peers, true, &why); /* else again after a short nap */
	}
}

/* How long the control thread may sleep without a wake-up: while etcd is
 * unreachable it retries every 200 ms; while an attempt is in progress
 * (a deadline may pass) every second; after its entry put failed, once
 * per keep-alive interval (mlfs_lease_schedule: 2 s up to 2,000 nodes,
 * then no more than 1,000 retries a second in the job); while a
 * retained layout waits for its announcement, until it has waited 2 s
 * (mlfs_release_wait_ms; then it follows the entries itself: need_peers)
 * and every second after, or a second once the release was announced (a
 * round of its own for it would meet every other node's, and the job's
 * resumed work, at once); until its entry put after a commit is due
 * (mlfs_publish_delay_ms); otherwise only a change wakes it (a long nap,
 * as a safety net). */
static int nap_ms(struct mlfs_cluster *c)
{
	pthread_mutex_lock(&c->lock);
	bool etcd = c->etcd_error[0] != '\0', att = c->attempt != NULL;
	int64_t swap = c->swap_wait ? mlfs_cluster_now_ms() - c->swap_since_ms : -1;
	bool released = announced(c);
	pthread_mutex_unlock(&c->lock);
	if (etcd || (need_peers(c) && !mlfs_mirror_live(&c->peers)))
		return 200;
	int wait = mlfs_release_wait_ms(mlfs_store_cluster(c->st)->nnodes);
	int ms = swap >= 0 && swap < wait && !released ? (int)(wait - swap) + 10
		 : att || swap >= 0		       ? 1000
						       : 30000;
	if (c->publish_failed) { /* the job has not seen what this node did */
		int ttl_s, every_ms;
		mlfs_lease_schedule(mlfs_store_cluster(c->st)->nnodes, &ttl_s, &every_ms);
		ms = every_ms < ms ? every_ms : ms;
	}
	int64_t put_in = c->publish_at_ms - mlfs_cluster_now_ms(); /* after a commit */
	if (put_in > 0 && put_in < ms)
		ms = (int)put_in + 1;
	return ms;
}

/* A round ended now, on any thread (round_lock held: the due time of the
 * last round to end wins, never an older one's), and the control thread's
 * next one is due @ms later: a control thread asleep past then wakes to
 * sleep less. Lock order: round_lock, then wake_lock. */
static void round_done(struct mlfs_cluster *c, int ms)
{
	int64_t due = mlfs_cluster_now_ms() + ms;

	pthread_mutex_lock(&c->wake_lock);
	c->due_ms = due;
	if (c->sleep_until_ms && due < c->sleep_until_ms)
		pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->wake_lock);
}

static void *cluster_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-control"); /* for top -H, perf */
	struct mlfs_cluster *c = arg;

	while (!atomic_load(&c->stop)) {
		pthread_mutex_lock(&c->round_lock);
		round_once(c);
		round_done(c, nap_ms(c));
		pthread_mutex_unlock(&c->round_lock);
		pthread_mutex_lock(&c->wake_lock);
		for (;;) {
			int64_t now = mlfs_cluster_now_ms();
			if (c->wake || atomic_load(&c->stop) || now >= c->due_ms)
				break;
			/* at most a second: an announced release makes a round
			 * due (released_put) without waking this thread, and a
			 * round on the watch's thread that starts an attempt
			 * (due a second later, for its deadline) then needs no
			 * wake-up of this one either (round_done) */
			int64_t until = c->due_ms < now + 1000 ? c->due_ms : now + 1000;
			c->sleep_until_ms = until;
			struct timespec t;
			clock_gettime(CLOCK_REALTIME, &t);
			int64_t ns = t.tv_nsec + (until - now) * 1000000L;
			t.tv_sec += ns / 1000000000L;
			t.tv_nsec = ns % 1000000000L;
			pthread_cond_timedwait(&c->cond, &c->wake_lock, &t);
		}
		c->sleep_until_ms = 0;
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

	struct mlfs_cluster *c = arg;
	mlfs_nodeentry_status_add(c, o);
	mlfs_controller_status(c->ctl, o);
	mlfs_attempt_waiting(c, waiting, sizeof(waiting));
	if (waiting[0])
		json_object_set_new(o, "waiting", json_string(waiting));
}

/* The job's mirror's hook: a key of the job changed (each may need a
 * decision: every node's rounds run on them), or the watch ended. On the
 * watch's thread, outside libcurl's callbacks (mlfs_mirror.c): when no
 * other round runs, the round runs here, at once; handing it to the
 * control thread cost every node a wake-up and a context switch per
 * change, three per reconfiguration (BENCHMARKS.md). Else (a round in
 * progress, the watch ended: its restart stops this very thread, the
 * cluster stopping) the control thread runs the next one. */
static void keys_changed(void *arg)
{
	struct mlfs_cluster *c = arg;

	if (mlfs_mirror_live(&c->mirror) && pthread_mutex_trylock(&c->round_lock) == 0) {
		if (atomic_load(&c->inline_rounds)) {
			round_once(c);
			round_done(c, nap_ms(c));
			pthread_mutex_unlock(&c->round_lock);
			return;
		}
		pthread_mutex_unlock(&c->round_lock);
	}
	mlfs_cluster_wake(c);
}

/* The job's mirror's hook for a put of "released" (mlfs_mirror_lazy), in
 * the watch's callback: its version noted (mlfs_released_parse: the
 * announcement is JSON when it put entries), and this node's next round made due
 * now, which the control thread runs within a second (cluster_main), not
 * at once: the announcement reaches every node together, as the job
 * resumes its work, and what it frees can wait that long. */
static void released_put(void *arg, const char *value, size_t len)
{
	struct mlfs_cluster *c = arg;

	/* etcd's order: the newest */
	atomic_store(&c->released_seen, mlfs_released_parse(value, len, NULL, NULL));
	int64_t now = mlfs_cluster_now_ms();
	pthread_mutex_lock(&c->wake_lock);
	if (c->due_ms > now)
		c->due_ms = now;
	pthread_mutex_unlock(&c->wake_lock);
}

/* The votebox's hook: a participant's vote arrived that leaves something
 * to decide (mlfs_votebox.c): the last swap ack of a commit among them,
 * which status.json shows at once (its swap acks), so its pollers wake
 * now, not after the round that announces it. */
static void votes_changed(void *arg)
{
	struct mlfs_cluster *c = arg;
	mlfs_cluster_wake(c);
	mlfs_store_status_changed(c->st);
}

/* The peers mirror's hook: a node's entry changed, came or went. A round
 * runs when it may decide something: this node coordinates (a
 * participant down aborts) or waits for the swaps of a commit; a node
 * that follows the entries only for its backups does not wake (the
 * backup thread looks at the steps four times a second). */
static void peers_changed(void *arg)
{
	struct mlfs_cluster *c = arg;
	pthread_mutex_lock(&c->lock);
	bool wake = c->mine != NULL || c->swap_wait != NULL;
	pthread_mutex_unlock(&c->lock);
	if (wake)
		mlfs_cluster_wake(c);
	if (mlfs_controller_leading(c->ctl)) /* a node died, joined or changed */
		mlfs_controller_kick(c->ctl);
}

/* Ends the control and keep-alive threads that run. */
static void stop_threads(struct mlfs_cluster *c)
{
	atomic_store(&c->inline_rounds, false);
	atomic_store(&c->stop, 1);
	pthread_mutex_lock(&c->wake_lock);
	pthread_cond_signal(&c->cond);
	pthread_cond_signal(&c->keepalive_cond);
	pthread_mutex_unlock(&c->wake_lock);
	if (c->running)
		pthread_join(c->thread, NULL);
	if (c->keepalive_running)
		pthread_join(c->keepalive_thread, NULL);
	/* a round the job's watch runs itself ends before this returns */
	pthread_mutex_lock(&c->round_lock);
	pthread_mutex_unlock(&c->round_lock);
	c->running = c->keepalive_running = false;
}

/* Frees @c's locks and @c. */
static void cluster_free(struct mlfs_cluster *c)
{
	pthread_cond_destroy(&c->keepalive_cond);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->wake_lock);
	pthread_mutex_destroy(&c->round_lock);
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->parsed_lock);
	pthread_mutex_destroy(&c->seen_lock);
	pthread_mutex_destroy(&c->lock);
	json_decref(c->parsed);
	json_decref(c->parsed_att);
	free(c->parsed_att_text);
	mlfs_snap_cache_free(&c->snap);
	free(c->parsed_cfg_text);
	free(c->parsed_next_text);
	json_decref(c->seen);
	free(c);
}

/* The store's hooks into the control plane, all gone (@st's lock held,
 * or no other thread yet). */
static void unhook(struct mlfs_store *st)
{
	st->propose = NULL, st->status_add = NULL, st->steps_saved = NULL;
	st->steps_refresh = NULL, st->steps_mirrored = NULL, st->drain = NULL;
	st->import_all = NULL;
	st->reconf_changed = NULL, st->job_changed = NULL, st->cluster_arg = NULL;
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
	pthread_mutex_init(&c->seen_lock, NULL);
	pthread_mutex_init(&c->wake_lock, NULL);
	pthread_mutex_init(&c->round_lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_cond_init(&c->keepalive_cond, NULL);
	c->st = st;
	c->me = mlfs_store_cluster(st)->nodes[st->node].id;
	c->saved_put = -1;
	c->manifests_read = -1;
	const char *fp = getenv("MLFS_FAILPOINT");
	snprintf(c->failpoint, sizeof(c->failpoint), "%s", fp ? fp : "");
	snprintf(c->prefix, sizeof(c->prefix), MLFS_KEYS_JOB, mlfs_store_cluster(st)->job);
	snprintf(c->nprefix, sizeof(c->nprefix), MLFS_KEYS_NODES, mlfs_store_cluster(st)->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 5000};
	if ((rc = net_etcd_new(mlfs_store_cluster(st)->etcd, &o, &c->etcd, err)))
		goto err_free;
	if ((rc = mlfs_mirror_init(&c->mirror, c->etcd, c->prefix, keys_changed, c)) ||
	    (rc = mlfs_mirror_init(&c->peers, c->etcd, c->nprefix, peers_changed, c))) {
		ptc_error_set(err, rc, "cluster.json: the job's name is too long");
		goto err_etcd;
	}
	mlfs_mirror_lazy(&c->mirror, "released", released_put);
	if ((rc = mlfs_controller_start(c, &c->ctl))) {
		ptc_error_set(err, rc, "cannot start the elastic controller's thread");
		goto err_mirror;
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
	pthread_mutex_lock(&c->round_lock);
	round_once(c);
	pthread_mutex_unlock(&c->round_lock);
	st->cluster_arg = c;
	st->multinode = true;
	st->propose = mlfs_propose;
	st->status_add = status_add;
	st->steps_saved = mlfs_nodeentry_steps_saved;
	st->steps_refresh = mlfs_nodeentry_steps_refresh;
	st->steps_mirrored = mlfs_nodeentry_steps_mirrored;
	st->drain = mlfs_controller_drain;
	st->import_all = mlfs_jobimport_start;
	st->reconf_changed = reconf_changed;
	st->job_changed = job_changed;
	if (st->votebox)
		mlfs_votebox_listen(st->votebox, votes_changed, c);
	if ((rc = -pthread_create(&c->keepalive_thread, NULL, mlfs_nodeentry_keepalive_main, c)) ||
	    (c->keepalive_running = true,
	     rc = -pthread_create(&c->thread, NULL, cluster_main, c))) {
		ptc_error_set(err, rc, "cannot start a thread");
		unhook(st);
		if (st->votebox)
			mlfs_votebox_listen(st->votebox, NULL, NULL);
		goto err_threads;
	}
	c->running = true;
	atomic_store(&c->inline_rounds, true);
	*out = c;
	return 0;

err_threads:
	stop_threads(c);
err_mirror:
	mlfs_controller_stop(c->ctl);
	mlfs_mirror_release(&c->mirror);
	mlfs_mirror_release(&c->peers);
	mlfs_controller_free(c->ctl);
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
	mlfs_controller_stop(c->ctl);	  /* a proposal in progress ends first */
	pthread_mutex_lock(&c->st->lock); /* no job/ change reaches @c any more */
	c->st->job_changed = NULL;
	pthread_mutex_unlock(&c->st->lock);
	if (c->st->votebox) /* no vote wakes this node any more */
		mlfs_votebox_listen(c->st->votebox, NULL, NULL);
	stop_threads(c);
	/* the store outlives @c: a transformer still running, or the abort of
	 * a prepared attempt at the unmount (mlfs_reconf_shutdown), changes
	 * its state after this */
	pthread_mutex_lock(&c->st->lock);
	unhook(c->st);
	pthread_mutex_unlock(&c->st->lock);
	mlfs_mirror_release(&c->mirror); /* its watch's thread ends first */
	mlfs_mirror_release(&c->peers);
	mlfs_controller_free(c->ctl); /* no mirror kicks it any more */
	int64_t lease = atomic_load(&c->lease);
	if (lease) /* leave at once rather than when the lease expires */
		net_etcd_lease_revoke(c->etcd, lease, NULL, &why);
	net_etcd_free(c->etcd);
	json_decref(c->attempt);
	json_decref(c->entry_vote);
	free(c->mine);
	free(c->published);
	free(c->acked_entry);
	json_decref(c->prep_parts);
	json_decref(c->swap_wait);
	mlfs_job_free(c->job);
	cluster_free(c);
}
