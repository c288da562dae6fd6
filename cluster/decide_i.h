/*
 * decide_i.h - the control plane's decisions as one pure function
 * (mlfs_decide.c): what this node knows of the job at one moment (etcd's
 * keys as last read, its own store's state) in, the actions to take out.
 * No I/O, no threads, no globals: the control thread reads the snapshot,
 * calls mlfs_decide, and carries the actions out (mlfs_cluster.c);
 * tests/unit/test_decide.c runs scripted sequences through it, and
 * tests/model/protocol.pml models the same rules for spin.
 */
#ifndef MLFS_DECIDE_I_H
#define MLFS_DECIDE_I_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "store/store.h"

/* A node's vote on the attempt in progress (one naming that attempt's id). */
enum mlfs_vote { MLFS_VOTE_NONE, MLFS_VOTE_READY, MLFS_VOTE_FAILED };

/* One node of the job, as its etcd entry (MLFS_KEYS_NODES <id>) and vote show it. */
struct mlfs_snap_node {
	const char *id;
	bool up;	     /* its entry exists: its lease is alive */
	int64_t version;     /* the layout version it serves (0: none) */
	bool lost;	     /* it says its partitions are not the job's */
	bool participant;    /* named in the attempt in progress */
	enum mlfs_vote vote; /* on the attempt in progress (a coordinator knows every
				participant's; another node only its own) */
	bool swap_waited;    /* took part in the last commit: the previous layout is
				kept until it serves the committed version */
	const char *reason;  /* of a failed vote */
	int64_t retained;    /* the layout version it retains (0: none) */
};

/* The attempt in etcd ("attempt" key), when there is one. */
struct mlfs_snap_attempt {
	const char *id; /* random, names its votes and its commit */
	int64_t from, to;
	const char *coordinator;
	int64_t deadline_ms;
};

/* What this node knows at one moment. Strings are borrowed. */
struct mlfs_snap {
	/* etcd, as last read */
	bool etcd_ok;	       /* the last read answered; false: nothing below is fresh */
	int64_t revision;      /* etcd's revision the keys below are at */
	bool lease_expired;    /* this node's lease expired (it was frozen or cut off) */
	bool has_schema;       /* the job's schema is in etcd */
	int64_t committed;     /* the version of "config" (0: none yet) */
	const char *commit_id; /* the attempt that committed it ("" for a first config) */
	int64_t saved_step;    /* the newest step the job ever saved ("saved" key; -1: none) */
	const struct mlfs_snap_attempt *attempt; /* NULL: none */
	const struct mlfs_snap_node *nodes;	 /* the job's nodes, this one included */
	int nnodes;
	/* The other nodes' entries were read: @nodes says who is up, at which
	 * version, lost (a node follows them only when it needs them; when
	 * false, only this node's own fields and the attempt's are known). */
	bool nodes_known;
	/* The "released" key: every participant of the commit of this version
	 * serves it (a node that saw so announced it); 0: none. */
	int64_t released;
	int me; /* index of this node in @nodes */
	int64_t now_ms;
	/* this node's store */
	bool store_schema;	       /* a schema is installed */
	int64_t have;		       /* the current layout's version (0: none) */
	bool hosts_ranks;	       /* the current layout places ranks on this node */
	bool lost;		       /* this node's partitions are not the job's */
	enum mlfs_reconf_state reconf; /* the store's reconfiguration state */
	int64_t target;		       /* of the store's attempt, when not idle */
	const char *prepare_id;	       /* the attempt whose prepare the store ran ("": none) */
	int64_t prepare_rev;	       /* the revision that created that attempt in etcd */
	bool coordinating;	       /* this node created the attempt in etcd */
	int64_t retained;	       /* the previous layout kept after a commit (0: none) */
	/* `mlfs resume` (etcd's "restore" key): lost nodes restore the
	 * committed version @restore_version from a snapshot. */
	const char *restore_id;	   /* NULL: no such key */
	int64_t restore_version;   /* the committed version it is for */
	const char *restore_tried; /* the restore this node last ran ("": none) */
	/* `mlfs import --every-node` (etcd's "import" key): every node at the
	 * committed version @import_version imports the checkpoint it names. */
	const char *import_id;	  /* NULL: no such key */
	int64_t import_version;	  /* the committed version it is for */
	const char *import_tried; /* the import this node last ran ("": none) */
};

/* What to do, in the order given. */
enum mlfs_act {
	MLFS_ACT_REGISTER,	    /* grant a new lease and put this node's entry */
	MLFS_ACT_INSTALL_SCHEMA,    /* etcd's schema into the store */
	MLFS_ACT_INSTALL_CONFIG,    /* etcd's committed config as the first layout */
	MLFS_ACT_MARK_LOST,	    /* this node's partitions are not the job's: @reason */
	MLFS_ACT_CLEAR_LOST,	    /* it hosts no rank of the job's layout any more */
	MLFS_ACT_PREPARE,	    /* build the attempt beside the current layout */
	MLFS_ACT_VOTE_READY,	    /* the prepared attempt (after staging job/) */
	MLFS_ACT_VOTE_FAILED,	    /* on the attempt: @reason */
	MLFS_ACT_COMMIT,	    /* the prepared attempt, which etcd committed */
	MLFS_ACT_DISCARD,	    /* the store's attempt, which etcd will never commit: @reason */
	MLFS_ACT_FINISH_COMMIT,	    /* the coordinator's commit transaction */
	MLFS_ACT_FINISH_ABORT,	    /* the coordinator deletes its attempt: @reason */
	MLFS_ACT_RELEASE_RETAINED,  /* every participant swapped: drop the previous layout */
	MLFS_ACT_ANNOUNCE_RELEASED, /* put "released" = @version: the others drop theirs */
	MLFS_ACT_RESTORE,	    /* a lost node fills its layout from `mlfs resume`'s snapshot */
	MLFS_ACT_IMPORT,	    /* this node imports the job-wide import's checkpoint */
};

struct mlfs_action {
	enum mlfs_act kind;
	int64_t version; /* of the layout or attempt it is about */
	char reason[256];
};

/* The most actions one decision returns. */
#define MLFS_DECIDE_MAX 8

/*
 * The actions this node takes now, given @s: their number (at most
 * MLFS_DECIDE_MAX) written to @acts. Pure: the same snapshot always gives
 * the same actions; any thread.
 */
int mlfs_decide(const struct mlfs_snap *s, struct mlfs_action *acts);

/*
 * Rule 9, the coordinator's: the layout a new attempt to @to is planned
 * from. @cur is the current layout with its down nodes (@down, @ndown
 * cluster indices) and their backup holders (@backup_of: NULL or one per
 * node of @to's cluster); @ret is the retained layout of version @rv
 * (NULL: none); @nodes (@nnodes, in the cluster's order) say who is up,
 * lost and retains which version. Returns 0 for the current layout; 1 for
 * the retained one, when the plan from @cur has no copy of a partition
 * while the plan from @ret does with its own down nodes (those hosting
 * ranks in it that are down, lost or do not retain it), written to @rdown
 * (room for @ret's nodes) and *@nrdown; or -ENOMEM. Pure: it computes
 * plans (ptc_plan_compute_backups) and nothing else.
 */
int mlfs_decide_source(const struct ptc_layout *cur, const int *down, int ndown,
		       const int *backup_of, const struct ptc_layout *ret, int64_t rv,
		       const struct ptc_layout *to, const struct mlfs_snap_node *nodes, int nnodes,
		       int *rdown, int *nrdown);

/* 0 when the plan from @from to @to exists with the down nodes @down
 * (@ndown) served from replicas or backups (@backup_of, NULL: none), 1
 * when it does not (the reason in @why), -ENOMEM. Pure: rule 9 and the
 * elastic controller's choice (mlfs_elastic.c) ask it. */
int mlfs_decide_servable(const struct ptc_layout *from, const struct ptc_layout *to,
			 const int *down, int ndown, const int *backup_of, struct ptc_error *why);
/* The same answer from one node's plan at a time (ptc_plan_compute_node,
 * for every node hosting ranks of @to), in memory that follows the
 * largest node's partitions: what mlfs_decide_servable does for a job past
 * the whole job's plan (PTC_MAX_JOB_PARTITIONS, -E2BIG; 512 ranks of a
 * 51,000-tensor mixture of experts). Pure. */
int mlfs_decide_servable_by_node(const struct ptc_layout *from, const struct ptc_layout *to,
				 const int *down, int ndown, const int *backup_of,
				 struct ptc_error *why);

/* `mlfs import --every-node` (mlfs_jobimport.c). Whether the import may
 * start for config @c given the nodes' entries @nodes ({id: entry}) and
 * whether an attempt is in etcd: 0, or -EBUSY / -EAGAIN with @err naming
 * the node (down, lost, at another version) or the attempt. Pure. */
int mlfs_jobimport_refusal(const struct ptc_config *c, const json_t *nodes, bool attempt,
			   struct ptc_error *err);
/* Where import @id of config @c stands given @nodes: true once every node
 * of @c answered or can no longer (down, lost, at another version), @out
 * then {id: "imported" | "failed: why"} (cleared and refilled: pending
 * nodes are absent) and @err the first failure ("node n2: why", code
 * -EIO; code 0 and empty when none). Pure. */
bool mlfs_jobimport_outcome(const struct ptc_config *c, const json_t *nodes, const char *id,
			    json_t *out, struct ptc_error *err);

/* The keep-alives a second a job's nodes send etcd, at most. */
#define MLFS_KEEPALIVES_PER_S 1000

/*
 * The lease of a node of a job of @nnodes nodes: its TTL in seconds into
 * *@ttl_s, the interval between its keep-alives in ms into *@every_ms.
 * A TTL of 6 s (a dead node is seen within 6 s) renewed every 2 s, a
 * third of it, as etcd's own client renews (two keep-alives may be lost
 * or late): each keep-alive costs etcd's JSON gateway about a range's
 * CPU (1-1.5 ms on a slow day), and 32 idle nodes kept a 2-core etcd at
 * 0.04-0.06 of a core at one a second, 0.045-0.052 of daemons and etcd
 * every 1,666 ms. Past 2,000 nodes, one keep-alive per node every N ms, so that
 * etcd sees at most MLFS_KEEPALIVES_PER_S a second whatever N (7,400 a
 * second took most of a 2-core etcd at 10,000 nodes), with a TTL of 3
 * intervals: 10 s and 30 s at 10,000 nodes, as Kubernetes renews a
 * node's lease of 40 s every 10 s. Pure.
 */
void mlfs_lease_schedule(int nnodes, int *ttl_s, int *every_ms);

/*
 * How long (ms) a node whose layout is retained after a commit waits for
 * its coordinator's announcement (rule 8) before it reads every node's
 * entry itself (its coordinator may be gone), in a job of @nnodes nodes:
 * 2 s up to 1,000 nodes, 2 ms per node beyond (20 s at 10,000). The
 * coordinator announces once it saw every participant's swap, which at
 * 10,000 nodes takes etcd seconds (10,000 entry puts); a fallback before
 * that made each of 10,000 nodes read 10,000 entries (2 MB each). Pure.
 */
int mlfs_release_wait_ms(int nnodes);

/*
 * How long (ms) node @node (its index in the cluster) of a job of @nnodes
 * nodes waits after a commit before it puts its entry: 0 up to 1,000
 * nodes; beyond, its index in ms, so that the N puts after a commit reach
 * etcd at 1,000 a second (as the keep-alives do) instead of at once: at
 * 10,000 nodes most of 10,000 puts at once timed out on the client's 2 s.
 * The coordinator's announcement (rule 8) comes up to N ms later. Pure.
 */
int mlfs_publish_delay_ms(int nnodes, int node);
/* The version the value (@len bytes, not NUL-terminated) of the "released"
 * key announces: "<version>", or {"version", "entries": [ids]} when the
 * announcement put those nodes' entries (mlfs_attempt.c's act_announce);
 * *@mine (when @mine is not NULL) says whether the entries name @me. 0
 * when the value says no version. Pure (mlfs_jobkeys.c). */
int64_t mlfs_released_parse(const char *value, size_t len, const char *me, bool *mine);
/* Whether the entry a node's swap ack to @acked_to carried, when its key
 * was at revision @base, is its entry in etcd once the announcement of
 * @released names the node (@mine): the same version, and no put of the
 * node's own since (its key still at @base as the node last put it,
 * @published_rev). Then the announcement's transaction put it (it
 * compared the key with @base); else the node puts its own. Pure. */
bool mlfs_entry_adopted(int64_t acked_to, int64_t base, int64_t released, bool mine,
			int64_t published_rev);

/* One node of a snapshot by id (mlfs_snap_index). */
struct mlfs_snap_key {
	const char *id; /* borrowed from the node */
	int node;	/* its index in the snapshot's nodes */
};

/*
 * @keys (room for @nnodes) := the ids of @nodes sorted (strcmp), for
 * mlfs_snap_find: the snapshot marks the attempt's participants, the last
 * commit's and the coordinator's votes through it, once per id listed,
 * not once per node and id listed (quadratic: 0.35 s a round at 10,000
 * nodes). Pure; any thread.
 */
void mlfs_snap_index(const struct mlfs_snap_node *nodes, int nnodes, struct mlfs_snap_key *keys);

/* The index in the snapshot's nodes of the node whose id is exactly the
 * @len bytes at @id (no NUL needed), by @keys (mlfs_snap_index of
 * @nnodes nodes); -1 when none. O(log N), pure; any thread. */
int mlfs_snap_find(const struct mlfs_snap_key *keys, int nnodes, const char *id, size_t len);

/*
 * The node ids @ids (a JSON array of @cl's ids, in @cl's order, no
 * repeats) as ranges of their indices in @cl, "0-4999,5001": what the
 * attempt in etcd holds as its participants, so that every node's watch
 * gets a few bytes, not every id. A new string (free()), or NULL when an
 * id is not @cl's or out of its order, or out of memory (the caller then
 * keeps the array). Pure; any thread.
 */
char *mlfs_ids_pack(const json_t *ids, const struct ptc_cluster *cl);

/* The ids @packed names (mlfs_ids_pack's form) as a new JSON array of
 * @cl's ids in its order; NULL with @err when @packed is malformed, not
 * ascending or names a node outside @cl, or out of memory. Pure; any
 * thread. */
json_t *mlfs_ids_unpack(const char *packed, const struct ptc_cluster *cl, struct ptc_error *err);

/* The name of @a ("commit", "vote-ready", ...), for logs and tests. */
const char *mlfs_act_name(enum mlfs_act a);

#endif
