/*
 * cluster_i.h - internals shared by the files of cluster/.
 *
 * Inside cluster/, a file calls only files below it in this list (besides
 * store, net, common, ptc and transform), never one above:
 *
 *   mlfs_cluster.c     start/stop, the control thread's round
 *                        -> propose (as st->propose), attempt, nodeentry,
 *                           join, jobkeys, mirror, backup
 *   mlfs_propose.c     schema.json and config.json writes proposed to etcd
 *                        -> attempt, join, jobkeys, jobsync, idset
 *   mlfs_attempt.c     a round: a snapshot, mlfs_decide, its actions carried
 *                      out (prepare, vote, commit, discard, lost)
 *                        -> round, decide, idset, nodeentry, jobkeys, jobsync
 *   mlfs_round.c       what a round knows: the snapshot mlfs_decide reads
 *                        -> decide, idset, jobkeys
 *   mlfs_decide.c      the decisions: a pure function (decide_i.h)
 *   mlfs_idset.c       node ids indexed and packed as ranges (decide_i.h)
 *   mlfs_nodeentry.c   this node's entry in etcd, the others' in status.json
 *                        -> jobkeys, backup
 *   mlfs_join.c        joining the job, the job's cluster.json growing
 *                        -> jobkeys
 *   mlfs_jobkeys.c     the job's etcd keys: names, one read of them all
 *                        -> mirror, idset
 *   mlfs_mirror.c      the job's keys in memory: a range, then a watch
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
#include "cluster/decide_i.h"
#include "store/store.h"

/* ---------------------------------------------------------- mlfs_mirror.c */

/* The job's etcd keys in memory: a range read, then a watch (DESIGN block
 * of mlfs_mirror.c). */
struct mlfs_mirror {
	struct net_etcd *etcd;
	char prefix[300];
	void (*changed)(void *arg); /* a change (or the watch's end) */
	void *arg;
	/* mlfs_mirror_lazy: puts of @lazy_key alone call @lazy, not @changed */
	char lazy_key[320];
	void (*lazy)(void *arg, const char *value, size_t len);
	struct net_etcd_watch *watch; /* the rounds' (round_lock) */
	pthread_mutex_t lock;	      /* the fields below; a leaf */
	struct net_etcd_kv *kvs;      /* sorted by key */
	size_t n, cap;
	int64_t revision;	/* etcd's revision the keys are at */
	int64_t floor;		/* of the read they came from: older events are in it */
	bool live;		/* read, and the watch in place */
	char error[256];	/* why not live */
	int64_t ranges, events; /* figures: reads of every key, events applied */
	/* While mlfs_mirror_sync reads the keys: the watch's events, kept to
	 * be applied after the read (@pend, @npend); whether etcd created
	 * the watch, or its stream ended (@cond signals either). */
	bool syncing, created, ended;
	bool tell; /* events came that @changed hears of when they settle */
	struct net_etcd_event *pend;
	size_t npend, pcap;
	pthread_cond_t cond;
};

/* Sets up @m for the keys under @prefix (not read yet: mlfs_mirror_sync);
 * @changed is called on the watch's thread after every batch of changes
 * (outside libcurl's callbacks: it may block and make requests) and when
 * the watch ends. 0 or -EINVAL (a prefix too long). */
int mlfs_mirror_init(struct mlfs_mirror *m, struct net_etcd *etcd, const char *prefix,
		     void (*changed)(void *arg), void *arg);
/* Puts of the key @suffix (under @m's prefix) are applied without calling
 * @changed: @lazy gets each one's value, on the watch's thread, inside
 * libcurl's callback (it must only note it). Before the first sync. */
void mlfs_mirror_lazy(struct mlfs_mirror *m, const char *suffix,
		      void (*lazy)(void *arg, const char *value, size_t len));
/* Whether @m is read and followed now. Any thread. */
bool mlfs_mirror_live(struct mlfs_mirror *m);
/* Stops the watch and frees the keys. */
void mlfs_mirror_release(struct mlfs_mirror *m);
/* Stops the watch and forgets the keys: not live until the next sync.
 * The rounds only (round_lock). */
void mlfs_mirror_stop(struct mlfs_mirror *m);
/* When the mirror is not live (first use, or its watch ended), starts a
 * watch from now, waits until etcd created it, then reads every key and
 * applies the events that came meanwhile and are newer than that read: 0,
 * or etcd's error with @err. The rounds only (round_lock). */
int mlfs_mirror_sync(struct mlfs_mirror *m, struct ptc_error *err);
/* A copy of the keys and their revision, in one block (the caller's:
 * free(*@kvs), not net_etcd_kvs_free); -EIO with @err (when not NULL)
 * when the mirror is not live, -ENOMEM. Any thread. */
int mlfs_mirror_copy(struct mlfs_mirror *m, struct net_etcd_kv **kvs, size_t *n, int64_t *revision,
		     struct ptc_error *err);

/* ------------------------------------------------------------- votebox */

/* The votes a coordinator received (mlfs_votebox.c). */
struct mlfs_votebox;

/* A vote as POST /v1/vote carries it: {"node", "to", "attempt", "vote"},
 * and with "swapped" the node's entry: "entry", "lease", "rev". */
struct mlfs_vote_msg {
	/* vote: "ready" or "failed: <reason>"; "swapped": the node swapped to
	 * the layout that attempt committed (its ack, for the release) */
	const char *node, *attempt, *vote;
	int64_t to;
	struct mlfs_vote_entry entry; /* .entry NULL: none */
};
/* The most bytes of a vote's "vote", and of the entry a swap ack carries. */
#define MLFS_VOTE_MAX	    1024
#define MLFS_VOTE_ENTRY_MAX (64 * 1024)
/* The most entries the coordinator's announcement puts in its one
 * transaction (etcd refuses more than --max-txn-ops, 128 by default,
 * compares or puts); past it every node puts its own. */
#define MLFS_ANNOUNCE_ENTRIES_MAX 100
/*
 * The announcement of @version (key @k; @plain, its value without entries)
 * in one transaction with the entries the swap acks of a commit carried
 * (@ents: {id: {"entry", "lease", "rev"}}, the keys under @nprefix), each
 * put bound to its node's lease while its key is still at the revision the
 * node last put it; the value then names those nodes ({"version",
 * "entries"}). Were one put since (a step saved), @plain alone. 0 with
 * *@all whether the entries went (*@rev: their revision, else 0), or the
 * transaction's error (a lease gone). mlfs_attempt.c's act_announce, and
 * the simulator's.
 */
int mlfs_announce_entries(struct net_etcd *etcd, const char *nprefix, const char *k,
			  const char *plain, int64_t version, const json_t *ents, int64_t *rev,
			  bool *all, struct ptc_error *why);

/* The body of node @node's vote @vote on attempt @aid to version @to (the
 * caller's), or NULL (out of memory). */
char *mlfs_vote_body(const char *node, int64_t to, const char *aid, const char *vote);
/* mlfs_vote_body with the node's entry @e (NULL: none). */
char *mlfs_vote_body_entry(const char *node, int64_t to, const char *aid, const char *vote,
			   const struct mlfs_vote_entry *e);
/* The vote in @body (@len bytes) into @m, whose strings are borrowed from
 * *@doc (the caller's: json_decref, also on an error). 0, or -EINVAL with
 * @err naming the field that is missing or malformed; the node is checked
 * only for being a non-empty string (whether it is the cluster's is the
 * caller's to say). Pure. */
int mlfs_vote_parse(const char *body, size_t len, json_t **doc, struct mlfs_vote_msg *m,
		    struct ptc_error *err);
/* POST /v1/vote on a coordinator's peer server: the vote in @r's body read
 * (mlfs_vote_parse), its node one that @known(@arg, node) says is the
 * cluster's, put into @b, and answered: 200 "{}", a 400 naming the field,
 * or a 503. 0 when the vote went into @b. Peer server threads. */
int mlfs_vote_serve(struct mlfs_votebox *b, struct net_request *r,
		    bool (*known)(void *arg, const char *node), void *arg);

/* An empty box into *@out: 0 or -ENOMEM. */
int mlfs_votebox_new(struct mlfs_votebox **out);
/* Frees @b (NULL: fine); nothing may use it any more. */
void mlfs_votebox_free(struct mlfs_votebox *b);
/* @wake(@arg) on the votes put from now on (@wake NULL: none): on every
 * one, but those on an expected attempt that leave nothing to decide
 * (mlfs_votebox_expect); called under the box's lock. Control thread's
 * start and stop. */
void mlfs_votebox_listen(struct mlfs_votebox *b, void (*wake)(void *arg), void *arg);
/* Attempt @aid has @n participants: a vote on it wakes the listener only
 * when the coordinator may decide (a failed vote; the last participant's
 * "ready"; the last one's "swapped"), not at each of N. One attempt at a
 * time, the last one expected; votes on another wake at each. Any thread
 * (propose, before the attempt exists). */
void mlfs_votebox_expect(struct mlfs_votebox *b, const char *aid, size_t n);
/* Node @node's vote @vote ("ready", "failed: <reason>", "swapped") on attempt @aid to
 * version @to, replacing its earlier one. 0 or -ENOMEM. Any thread. */
int mlfs_votebox_put(struct mlfs_votebox *b, const char *node, int64_t to, const char *aid,
		     const char *vote);
/* mlfs_votebox_put with the node's entry @e (a "swapped" ack's; NULL:
 * none), kept with the vote and replaced with it. */
int mlfs_votebox_put_entry(struct mlfs_votebox *b, const char *node, int64_t to, const char *aid,
			   const char *vote, const struct mlfs_vote_entry *e);
/* The entries that the "swapped" acks on attempt @aid carried, of the
 * nodes whose last vote is that ack: {id: {"entry", "lease", "rev"}} (a
 * new reference; NULL: out of memory). Any thread. */
json_t *mlfs_votebox_entries(struct mlfs_votebox *b, const char *aid);
/* Every node's last vote as a key "<to>/<id>" and a value "<aid> <vote>"
 * (the caller's: net_etcd_kvs_free). 0 or -ENOMEM. Any thread. */
int mlfs_votebox_copy(struct mlfs_votebox *b, struct net_etcd_kv **kvs, size_t *n);
/* The votes on attempt @aid: {id: "ready", "swapped" or "failed: <reason>"} (a new
 * reference; NULL: out of memory). Any thread (status.json). */
json_t *mlfs_votebox_describe(struct mlfs_votebox *b, const char *aid);
/* (No clear: a decided attempt's votes stay until each node's next
 * replaces them, so that swap acks arriving before the commit's reply are
 * kept; a vote counts only for the attempt it names.) */

/* ------------------------------------------------------------- shared state */

/* The prefixes of a job's keys in etcd (a printf format of the job's
 * name): what every node follows; the nodes' entries and saved marks,
 * which only a node that needs them follows (mlfs_cluster.c's DESIGN
 * block). Votes are not in etcd (mlfs_votebox.c). */
#define MLFS_KEYS_JOB	"/mlfs/%s/"
#define MLFS_KEYS_NODES "/mlfs-nodes/%s/"

/*
 * One job's control plane on this node (mlfs_cluster_start). Threads: the
 * rounds' (round_lock held: the control thread's, cluster_main, or the
 * job mirror's watch thread's, keys_changed), I/O workers (st->propose,
 * st->steps_saved after a step write), the backup thread (st->steps_saved
 * after a backup), any thread reading status.json (st->status_add).
 * Lock order: c->lock and st->lock are never held together; the backup's
 * lock (mlfs_backup_describe) is taken under c->lock and is a leaf;
 * c->publock is held across the put of this node's entry, and nothing is
 * taken under it.
 */
/* Cluster indices of the nodes an id list names, found once per list:
 * @of (a reference held, so that its address names it) in cluster @cl. */
struct mlfs_snap_ids {
	json_t *of;
	const struct ptc_cluster *cl;
	int *idx; /* -1: not in @cl */
	size_t n;
};

struct mlfs_snap_cache {
	/* mlfs_snap_index of @cl's ids: clusters are replaced, never changed
	 * or freed while the store lives (mlfs_store_grow_cluster), so the
	 * address names one */
	const struct ptc_cluster *cl;
	struct mlfs_snap_key *keys;
	struct mlfs_snap_ids parts, waited;
};

/* Frees @m's indices (at the cluster's end). */
void mlfs_snap_cache_free(struct mlfs_snap_cache *m);

struct mlfs_cluster {
	/* Set by mlfs_cluster_start, fixed afterwards. */
	struct mlfs_store *st;
	struct net_etcd *etcd;
	char prefix[300];  /* MLFS_KEYS_JOB: every node follows it */
	char nprefix[300]; /* MLFS_KEYS_NODES: entries and saved marks */
	/* MLFS_FAILPOINT, for fault tests (docs/many-nodes.md): a named phase
	 * where the control thread or a proposal stalls ("" none). */
	char failpoint[32];
	const char *me; /* this node's id */
	pthread_t thread;
	bool running;

	pthread_t keepalive_thread;
	bool keepalive_running;

	/* This node's lease: granted by the control thread (REGISTER), kept
	 * alive by the keep-alive thread, which clears it and sets
	 * lease_expired when etcd says it expired (the node was frozen or
	 * cut off): the control thread then registers again, never silently
	 * (mlfs_decide's rule 2). Read by publish and propose. */
	_Atomic int64_t lease;
	atomic_bool lease_expired;
	atomic_int stop;
	/* The job's keys, followed by a watch (mlfs_mirror.c); the nodes'
	 * entries, followed only while this node needs them
	 * (need_peers in mlfs_cluster.c: it coordinates, announces a release,
	 * keeps backups). The rounds (round_lock: sync, stop; never the job's
	 * from its own watch's thread, whose inline round runs only while it
	 * is live); copies: any thread. */
	struct mlfs_mirror mirror;
	struct mlfs_mirror peers;
	/* The control thread sleeps on @cond until @wake: a change of the
	 * job's keys the watch's thread did not round on itself (keys_changed:
	 * a round in progress, the watch ended, the cluster stopping), of the
	 * store's reconfiguration state (reconf_changed),
	 * of the lease, a vote in the box (mlfs_votebox.c), or stop. */
	pthread_mutex_t wake_lock;
	pthread_cond_t cond;
	pthread_cond_t keepalive_cond; /* the keep-alive thread's (stop) */
	bool wake;		       /* wake_lock */
	/* wake_lock: when the control thread's next round is due without a
	 * wake-up (the end of the last round, by any thread, plus nap_ms),
	 * and until when it sleeps now (0: it does not) */
	int64_t due_ms, sleep_until_ms;
	/* Held across every round: the control thread's, and those the job
	 * mirror's watch thread runs itself (keys_changed). The fields
	 * marked "the control thread's" belong to whoever holds it. */
	pthread_mutex_t round_lock;
	atomic_bool inline_rounds; /* the watch's thread may run rounds */
	int64_t rounds;		   /* the control thread's, for figures */
	bool publish_failed;	   /* the control thread's: its entry put failed */
	int64_t publish_at_ms;	   /* the control thread's: no entry put before (after a commit) */
	/* the control thread's: the version this node swapped to and acked to
	 * its coordinator; its entry's put waits for etcd's "released" to reach
	 * it (or for publish_at_ms). 0: none. */
	int64_t publish_after;

	pthread_mutex_t lock;
	json_t *attempt;      /* lock: the attempt as last read, or NULL */
	char etcd_error[512]; /* lock: "" when etcd answers */
	/* The attempts (their random ids: a version may be tried again after
	 * an abort) this node started preparing and voted on. */
	char started_id[24]; /* lock */
	/* lock: written by vote (the control thread, and propose's failed
	 * vote on an I/O worker), read by the control thread: this node's
	 * last vote, on attempt @voted_id, ready or not. */
	char voted_id[24];
	bool voted_ready;
	/* lock: a vote this node could not deliver to the coordinator's peer
	 * server, put in its entry instead ({"to","attempt","vote"}), which
	 * the coordinator follows during its attempt (NULL: none). Dropped
	 * once the attempt it names is gone. */
	json_t *entry_vote;
	char *mine;	  /* lock: the text of the attempt this node created */
	int64_t mine_rev; /* lock: the revision that created it (0: not yet) */
	/* lock: config writes on this node building an attempt (propose): the
	 * control thread follows the entries from then on, so that their watch
	 * is live before the attempt exists, and decides on the votes */
	int proposing;
	int64_t cluster_mod; /* lock: the "cluster" key's revision last taken */
	int64_t saved_put;   /* publock: the step in saved/<id>, put or read (-1: none) */
	/* job/ as the coordinator has it, staged for attempt @job_to (the
	 * copy is part of the attempt; swapped in at its commit). Only the
	 * control thread touches these. */
	struct mlfs_job *job;
	int64_t job_to;
	/* lock: the digest of this node's job/ manifest
	 * (mlfs_jobsync_digest) when it last swapped one in, or registered;
	 * its entry carries it ("job") while st->job_gen is still
	 * @job_digest_gen: a coordinator whose own job/ has that digest reads
	 * this node's as its own, no request (mlfs_jobsync_merge). "": none. */
	char job_digest[17];
	uint64_t job_digest_gen;
	/* lock: the participants' job/ manifests read over HTTP for the last
	 * attempt this node built (status.json's cluster.job_manifests_read;
	 * -1: none built) */
	int64_t manifests_read;
	/* set by the first job/ change after the digest (mlfs_store_job_changed):
	 * one wake-up of the control thread, whose round puts the entry
	 * without it; later changes leave the entry as it is */
	atomic_bool job_woke;
	/* lock: the participants (ids) of the attempt this node prepared
	 * (prep_aid), and of the last one it committed: the nodes whose swap
	 * the retained layout waits for (mlfs_decide's rule 8; NULL: none). */
	json_t *prep_parts;
	char prep_aid[24];
	char prep_coord[256]; /* lock: the coordinator of attempt prep_aid (its swap ack's) */
	json_t *swap_wait;
	int64_t swap_since_ms; /* lock: when swap_wait was set */
	int64_t swap_version;  /* lock: the commit swap_wait waits for */
	/* The newest "released" a put of the key brought (mlfs_mirror_lazy):
	 * a node does not wake for it; its next round releases. */
	_Atomic int64_t released_seen;
	/* lock: the version whose commit this node made as coordinator: it
	 * follows the entries until every participant swapped and announces
	 * it ("released"; mlfs_decide's rule 8). 0: none. */
	int64_t announce;
	/* lock: the last commit this node made as coordinator (version and
	 * attempt id): status.json shows the nodes that acked their swap to
	 * it at that version before their entries say so. */
	int64_t acked_to;
	char acked_id[24];
	/* The elastic controller (mlfs_controller.c); set at start. */
	struct mlfs_controller *ctl;
	/* The saved/<id> mark as read when the daemon started (control
	 * thread): mlfs_decide's rule 5 asks for it. */
	bool saved_read;
	/* seen_lock: the nodes' entries for status.json when the peers mirror
	 * is not live: {id: entry} as last read (@seen_ms), read again when
	 * older than a second. */
	pthread_mutex_t seen_lock;
	json_t *seen;
	int64_t seen_ms;
	pthread_mutex_t publock; /* published, and the put of the node's key */
	char *published;	 /* the node entry last put */
	int64_t published_rev;	 /* publock: its key's mod revision (0: unknown) */
	/* publock: the entry this node's last swap ack carried (NULL: none),
	 * to version @acked_entry_to, when its key was at @acked_entry_base:
	 * the coordinator's announcement puts it (mlfs_nodeentry_adopt) */
	char *acked_entry;
	int64_t acked_entry_to, acked_entry_base;
	char entry_state[16]; /* publock: the settled state it says */
	/* lock: the last `mlfs resume` this node ran (mlfs_decide's rule 10):
	 * the restore key's id ("": none) and its error ("": it restored).
	 * Published in the node's entry as "restore". */
	char restore_tried[40];
	char restore_error[PTC_ERROR_MAX];
	/* lock: the last job-wide import this node started (mlfs_decide's
	 * rule 11, mlfs_jobimport.c), and the last it finished with its error
	 * ("": it imported): the import keys' ids ("": none). The finished one
	 * is published in the node's entry as "import". */
	char import_tried[40];
	char import_done[40];
	char import_error[PTC_ERROR_MAX];
	/* parsed_lock: node entries as parsed, {id: [mod_revision, entry]}:
	 * every round reads every entry, and most did not change since the
	 * last (mlfs_jobkeys.c). The entries are shared, read-only. */
	pthread_mutex_t parsed_lock;
	json_t *parsed;
	/* parsed_lock: the attempt and the config as last parsed, by their
	 * text (every round of an attempt parsed both again); the attempt is
	 * shared, read-only, its participants unpacked. */
	char *parsed_att_text, *parsed_cfg_text;
	int64_t parsed_cfg_version;
	bool parsed_cfg_elastic;
	json_t *parsed_att;
	/* parsed_lock: the config of the last attempt parsed, its version and
	 * whether it is elastic as the attempt says them (its "to" and
	 * "elastic"): the committed config once it commits, not parsed again */
	char *parsed_next_text;
	int64_t parsed_next_version;
	bool parsed_next_elastic;
	/* parsed_lock: the "released" key as last parsed, by its revision */
	int64_t parsed_rel_rev, parsed_rel_version;
	bool parsed_rel_mine;
	/* The control thread's (mlfs_round.c): the index of the cluster's ids
	 * and the indices of the nodes two id lists name (the attempt's
	 * participants, the ones the last commit waits for), kept from round
	 * to round: at 32 nodes, sorting and searching them again took a
	 * fifth of a round. */
	struct mlfs_snap_cache snap;
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
/* result/<v> keys of versions before the committed one: pruned by the
 * next attempt's transaction once this many piled up (mlfs_propose.c), at
 * most MLFS_RESULTS_PRUNED at a time (the oldest may wait for the next). */
#define MLFS_RESULTS_KEPT   8
#define MLFS_RESULTS_PRUNED 64

struct mlfs_jobkeys {
	struct net_etcd_kv *kvs;
	size_t n;
	bool kvs_block; /* @kvs is mlfs_mirror_copy's one block */
	/* the keys of these names, in @kvs, or NULL */
	const struct net_etcd_kv *schema, *cluster, *config, *attempt;
	const struct net_etcd_kv *controller; /* the elastic controller's id, or NULL */
	json_t *draining;		      /* {id: true}: the drain/<id> keys (mlfs drain) */
	json_t *nodes;			      /* {id: entry}; empty unless @nodes_known */
	bool nodes_known; /* the entries were read (not every round reads them) */
	int64_t released; /* the "released" key: 0 none (mlfs_decide's rule 8) */
	/* that key's mod revision, and whether it names this node among those
	 * whose entries its transaction put (mlfs_attempt.c's act_announce) */
	int64_t released_rev;
	bool released_mine;
	json_t *attempt_j; /* @attempt parsed, or NULL */
	json_t *restore_j; /* the "restore" key parsed (`mlfs resume`), or NULL */
	json_t *import_j;  /* the "import" key parsed (`mlfs import --every-node`), or NULL */
	int64_t config_mod;
	int64_t committed;     /* @config's version: 0 without one, -1 unreadable */
	bool config_elastic;   /* @config has an "elastic" section */
	const char *config_id; /* the attempt that committed it ("": a first config) */
	int64_t revision;      /* etcd's revision of the read */
	/* The votes in this node's box (mlfs_votebox_copy: keys "<to>/<id>")
	 * when it coordinates; else none. */
	struct net_etcd_kv *votes;
	size_t nvotes;
};

/* The etcd key "<prefix><@fmt ...>" of @c's job into @buf (@cap bytes,
 * truncated to fit). Any thread. */
void mlfs_jobkeys_name(const struct mlfs_cluster *c, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reads every key of @c's job from etcd into @k (the caller's:
 * mlfs_jobkeys_free), the nodes' entries included. 0, or net_etcd_range's
 * error with @err and @k empty. I/O workers (propose: a fresh read). */
int mlfs_jobkeys_read(struct mlfs_cluster *c, struct mlfs_jobkeys *k, struct ptc_error *err);
/* The same from the mirrors (no request to etcd), the entries only while
 * the peers mirror is live (@k->nodes_known): -EIO with @err while the
 * job's mirror is not live. Any thread. */
int mlfs_jobkeys_mirrored(struct mlfs_cluster *c, struct mlfs_jobkeys *k, struct ptc_error *err);
/* The nodes' entries as the peers mirror has them ({id: entry}, a new
 * reference), no request: NULL while this node does not follow them. Any
 * thread. */
json_t *mlfs_jobkeys_mirrored_nodes(struct mlfs_cluster *c);
/* The nodes' entries read from etcd now ({id: entry}, a new reference):
 * NULL with @err when etcd did not answer. Any thread. */
json_t *mlfs_jobkeys_read_nodes(struct mlfs_cluster *c, struct ptc_error *err);
/* Releases what mlfs_jobkeys_read put in @k (an empty @k: fine). */
void mlfs_jobkeys_free(struct mlfs_jobkeys *k);

/* ---------------------------------------------------- mlfs_nodeentry.c */

/* Puts this node's entry (MLFS_KEYS_NODES <id>: addr, devices, pid, version, state,
 * its ranks' saved steps, the backup it holds) when it changed since the
 * last put. 0, -ENOMEM, or net_etcd_put's error with @err. Any thread. */
int mlfs_nodeentry_publish(struct mlfs_cluster *c, struct ptc_error *err);
/* This node's entry as its swap ack to version @to carries it (what the
 * put after the release would say) into @e, a copy kept as
 * c->acked_entry: 0, or -EAGAIN when this node's key has no known
 * revision (the ack goes without it; the node puts its own). The caller
 * calls mlfs_nodeentry_acked(c, ok) once the ack went or failed. */
int mlfs_nodeentry_for_ack(struct mlfs_cluster *c, int64_t to, struct mlfs_vote_entry *e);
/* The ack with the entry reached the coordinator (@ok) or not (the copy
 * is dropped). */
void mlfs_nodeentry_acked(struct mlfs_cluster *c, bool ok);
/* The announcement of @version ("released") is etcd's at @rev, naming
 * this node among those whose entries it put (@mine): the entry its
 * ack carried is its published one, unless it put its key since
 * (mlfs_entry_adopted). The control thread. */
void mlfs_nodeentry_adopt(struct mlfs_cluster *c, int64_t version, bool mine, int64_t rev);
/* Registers: a new lease (lease_expired cleared) and this node's entry put
 * under it. 0 or an etcd error with @err. The control thread (and start,
 * before it runs). */
int mlfs_nodeentry_register(struct mlfs_cluster *c, struct ptc_error *err);
/* The keep-alive thread: the lease renewed every 2 s, on a thread of
 * its own so that no slow work delays it; an expired lease is cleared and
 * flagged (lease_expired), an unreachable etcd noted; either wakes the
 * control thread. @arg: the cluster. */
void *mlfs_nodeentry_keepalive_main(void *arg);
/* Wakes the control thread (any thread). */
void mlfs_cluster_wake(struct mlfs_cluster *c);
/* Copies the other nodes' ranks' saved steps from @nodes ({id: entry})
 * into the store's step table. Takes st->lock. Any thread. */
void mlfs_nodeentry_sync_steps(struct mlfs_cluster *c, const json_t *nodes);
/* The store's st->steps_saved hook (@arg: the cluster): publishes now. */
void mlfs_nodeentry_steps_saved(void *arg);
/* The store's st->status_add hook (@arg: the cluster): adds "cluster" (the
 * nodes up, their versions and states, etcd, the backup, the attempt
 * without its config and job/) to status.json @o. Takes c->lock. */
void mlfs_nodeentry_status_add(void *arg, json_t *o);
/* Keeps the peers mirror's entries as status.json's (c->seen), before
 * the mirror stops: they are fresh then. The control thread. */
void mlfs_nodeentry_keep_seen(struct mlfs_cluster *c);
/* The store's st->steps_refresh hook (@arg: the cluster): the other
 * nodes' ranks' saved steps read from etcd now (mlfs snapshot checks
 * every rank's). No lock held; may wait on etcd. */
void mlfs_nodeentry_steps_refresh(void *arg);
/* The store's st->steps_mirrored hook: the same from the peers mirror, when
 * this node follows the entries (it does while it keeps backups). */
void mlfs_nodeentry_steps_mirrored(void *arg);
/* Reads this node's saved/<id> mark into c->saved_put, once: 0, or
 * etcd's error with @err. The control thread. */
int mlfs_nodeentry_read_saved(struct mlfs_cluster *c, struct ptc_error *err);

/* ---------------------------------------------------- mlfs_controller.c */

/* The elastic controller of @c's job (its thread started): 0 or an
 * errno. mlfs_cluster_start. */
int mlfs_controller_start(struct mlfs_cluster *c, struct mlfs_controller **out);
/* Ends its thread (NULL: fine); kicks stay harmless until ... */
void mlfs_controller_stop(struct mlfs_controller *t);
/* ... it is freed, once no mirror can kick it (NULL: fine). */
void mlfs_controller_free(struct mlfs_controller *t);
/* Something changed: the job's keys, or the entries it follows. Any
 * thread, no lock held but the caller's leaves. */
void mlfs_controller_kick(struct mlfs_controller *t);
/* The control thread's round read the job's keys @k: the controller
 * thread is kicked when it may have work (an elastic config, and the
 * controller key absent or this node's), not at every change. The control
 * thread. */
void mlfs_controller_note(struct mlfs_controller *t, const struct mlfs_jobkeys *k);
/* The store's st->drain hook (@arg: the cluster): marks @node for
 * draining (etcd's drain/<id>, no lease: it stays until undone), or
 * (@undo) no longer. 0, or -EINVAL (no such node), -EIO (etcd) with
 * @err. I/O workers (.mlfs-ctl). */
int mlfs_controller_drain(void *arg, const char *node, bool undo, struct ptc_error *err);
/* Whether this node is the job's controller now. Any thread. */
bool mlfs_controller_leading(struct mlfs_controller *t);
/* Adds "elastic" (the controller, its last decision and why, the version
 * it last proposed and its refusal) to status.json @o. Any thread. */
void mlfs_controller_status(struct mlfs_controller *t, json_t *o);

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
 * Starts preparing attempt @aid in the store: the other nodes' ranks
 * given the step the live ranks agreed on (@step, the attempt's "step";
 * -1: unknown, the table as it is), then mlfs_reconf_prepare_down of config text @config (@len
 * bytes; NULL: -EINVAL) with @dn; its participants @parts (ids) are the
 * nodes whose swap the layout it is planned from waits for once it
 * commits (retained: mlfs_store_release_retained); its @coordinator gets
 * this node's swap ack. 0 once the store runs it (and the
 * attempt, created at etcd revision @rev, is marked prepared: the store's
 * state speaks for it from now on), or its error with @err. Control
 * thread and I/O workers (propose).
 */
int mlfs_attempt_prepare(struct mlfs_cluster *c, int64_t step, const char *aid, int64_t rev,
			 const char *config, size_t len, const struct mlfs_reconf_down *dn,
			 const json_t *parts, const char *coordinator, struct ptc_error *err);
/* Votes "failed: <@reason>" on attempt @aid to @to, to its coordinator
 * @coordinator (this node's own box when it is this node; an unreachable
 * coordinator is logged and ignored: this node votes again at its next
 * round, or the attempt ends with the coordinator's lease). */
void mlfs_attempt_vote_failed(struct mlfs_cluster *c, const char *coordinator, int64_t to,
			      const char *aid, const char *reason);
/* One round of this node's decisions on the job's keys @k (@etcd_ok:
 * they are fresh): a snapshot of @k and the store, mlfs_decide, and its
 * actions carried out (register, install, prepare, vote, commit, discard,
 * the coordinator's commit or abort, lost). Control thread. */
void mlfs_attempt_round(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, bool etcd_ok);
/* What this node waits for, for status.json's "waiting" ("" when
 * nothing): etcd's decision on a prepared attempt it voted on. */
void mlfs_attempt_waiting(struct mlfs_cluster *c, char *buf, size_t cap);

/* The store's state changes this thread makes from now on (@on) are its
 * round's own: they wake no round (mlfs_cluster.c's reconf_changed). The
 * control thread, around a prepare or a commit. */
void mlfs_cluster_own_changes(bool on);

/* ------------------------------------------------------- mlfs_propose.c */

/* The store's st->propose hook (@arg: the cluster): a schema.json
 * (@config false) or config.json write @text proposed to the job. 0 once
 * etcd took it (and, for a config, once this node prepares the attempt or
 * installed the first config); -EINVAL (a bad or refused text), -EBUSY
 * (another attempt), -EIO (etcd), -ENOMEM, with the reason in @err. I/O
 * workers. */
int mlfs_propose(void *arg, bool config, const char *text, size_t len, struct ptc_error *err);
/* The same for a config the elastic controller proposes: its attempt says
 * so ("by": "controller"), and a person's config replaces it while it has
 * not committed; the revision that created the attempt into *@created
 * (0 when none was). The controller thread. */
int mlfs_propose_for_controller(struct mlfs_cluster *c, const char *text, size_t len,
				int64_t *created, struct ptc_error *err);

/* ------------------------------------------------------- mlfs_jobsync.c */

/*
 * The job/ every node will have after an attempt: the union of the job/
 * trees of the nodes @parts (ids; this node, @me, read locally, the others
 * through their peer servers), the most recently modified copy of each
 * file winning (ties: the first of @parts), each entry naming the node to
 * fetch it from ("s"), sorted so that directories come before what they
 * hold. A node whose entry in @entries (the nodes' entries by id, or NULL)
 * says its job/ has the digest of this node's is taken as this node's,
 * without a request; the others are read, their count into *@nread. A
 * node whose tree cannot be read is appended to @missing (its vote then
 * fails: its job/ would be lost otherwise). A new reference; NULL with
 * *@rc = -ENOMEM. I/O workers (propose).
 */
json_t *mlfs_jobsync_merge(struct mlfs_store *st, const char *me, const json_t *parts,
			   const json_t *entries, json_t *missing, int *rc, size_t *nread);

/* The digest of a job/ @manifest (mlfs_job_manifest's; its entries in any
 * order) into @out (16 hex digits): equal for two trees with the same
 * paths, kinds, sizes, hashes and times. 0, or -ENOMEM. */
int mlfs_jobsync_digest(const json_t *manifest, char out[17]);

/* This node's job/ as it is now (store lock not held): its digest into
 * c->job_digest, with the st->job_gen it stands for (mlfs_nodeentry.c's
 * entry carries it until job/ changes). After a swap and at registration. */
void mlfs_jobsync_note_digest(struct mlfs_cluster *c);

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

/* -------------------------------------------------------- mlfs_round.c */

/* What a round knows: the snapshot mlfs_decide reads, and its storage. */
struct mlfs_round {
	struct mlfs_snap s;
	struct mlfs_snap_attempt att;
	struct mlfs_snap_node *nodes;
	char prepared_id[24];
	char restore_tried[40];
	char import_tried[40];
	const char *aid; /* the attempt in etcd's id, or NULL */
};

/* Fills @r from @k (read with etcd answering: @etcd_ok) and this node's
 * store: 0 or -ENOMEM. Frees nothing of @k; @r->nodes is the caller's
 * (free). The control thread. */
int mlfs_round_snapshot(struct mlfs_cluster *c, const struct mlfs_jobkeys *k, bool etcd_ok,
			struct mlfs_round *r);

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

/* ---------------------------------------------------- mlfs_jobimport.c */

/* `mlfs import --every-node` (the store's import_all): puts etcd's
 * "import" key for the .mlfs-ctl import request @req and waits up to
 * @wait_s seconds for every node of the committed config to run it; @out
 * gets "version" and "nodes" {id: "imported" | "failed: why"}. 0, or the
 * refusal or the first node's failure with @err. I/O workers. */
int mlfs_jobimport_start(void *arg, const json_t *req, int wait_s, json_t *out,
			 struct ptc_error *err);
/* IMPORT (rule 11): runs the import that etcd's "import" key @key names
 * into this node's ranks and publishes the outcome. Control thread. */
void mlfs_jobimport_act(struct mlfs_cluster *c, const json_t *key);

#endif
