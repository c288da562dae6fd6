/*
 * store.h - the store: one node's views of the job's layouts, their
 * partitions and saved steps, the reconfiguration state machine, job/, and
 * the control files. Used by cluster/ and mount/ (its public header).
 *
 * Lock order: store->lock, then inodes->lock (never the reverse); neither is
 * held across a fuse_reply_*, a notification or file I/O outside the store.
 */
#ifndef MLFS_STORE_H
#define MLFS_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common/common.h"
#include "dataset/dataset.h"
#include "ptc/ptc.h"
#include "transform/xf.h"

/* ------------------------------------------------------------ name trees */

/* A directory tree of "<state>/<tensor>.npy" paths; leaves name a tensor. */
struct mlfs_tnode {
	char *name;
	int nchild, capchild;
	struct mlfs_tnode **child; /* sorted by name once built */
	int state, tensor;	   /* leaf: >= 0; directory: -1 */
	int st_file; /* full/: a safetensors file of @state (tensor -1): its shard from 0, or
		      * MLFS_TN_ST_INDEX; MLFS_TN_NOT_ST for every other node */
};

#define MLFS_TN_NOT_ST	 (-1)
#define MLFS_TN_ST_INDEX (-2)

/* Whether @t is a directory (not a tensor's nor a safetensors file). */
static inline bool mlfs_tnode_is_dir(const struct mlfs_tnode *t)
{
	return t->tensor < 0 && t->st_file == MLFS_TN_NOT_ST;
}

/* ------------------------------------------------------------------ views */

/*
 * One layout version on this node. Immutable once published, except the
 * partition buffer pointers in parts.bufs, which writers swap under
 * store->lock. Reference-counted: lookups in flight, open files and a
 * reconfiguration that builds from it (its pin) keep an old view alive.
 */
struct mlfs_view {
	atomic_int refs;
	struct ptc_config *config;
	char *config_text;
	struct ptc_layout layout;
	struct xf_parts parts;
	struct mlfs_tnode **stage_tree; /* per stage; NULL if no local rank has it */
	struct mlfs_tnode *full_tree;	/* every state and untied tensor */
	struct timespec time;
	struct mlfs_dataset *ds; /* NULL when the config names none */
	struct xf_mem *mem;	 /* where meta_bytes are counted */
	/* What the view's metadata costs (mlfs_mem_view), its partition buffers'
	 * own allocations (mlfs_mem_parts) and the step table that goes with it
	 * (st->steps): counted in @mem while the view lives. */
	int64_t meta_bytes;
	struct ptc_cursor cursor; /* with ds: the samples each step consumes */
	/* With "replicas": 1, each local rank's partitions as they were when
	 * its step was last written (or the layout installed or imported):
	 * pinned buffers, shared with parts until a write replaces them, which
	 * the backup holder fetches (mlfs_backup.c). Indexed as parts; the
	 * step per rank. NULL without replicas. Store lock. */
	struct xf_buf **snap;
	int64_t *snap_step;
	/* With "snapshot" in the config, each local rank's boxes of a snapshot
	 * (mlfs_snapshot.c's owners) as they were when its step was written,
	 * for steps that are a multiple of "every": the periodic snapshot
	 * writes them (mlfs_autosnap.c) and lets them go. Indexed as parts;
	 * the step per rank (-1: none pinned). NULL without "snapshot". Store
	 * lock. */
	struct xf_buf **psnap;
	int64_t *psnap_step;
};

struct mlfs_store;

/* Pins rank @rank's current partitions of @v as its saved state at
 * st->steps[@rank] (no-op without replicas). Lock held; the replaced
 * snapshot's buffers go to *@old (nstates * ntensors entries, the
 * caller's; put them with mlfs_bufs_put after unlocking), or are put here
 * when @old is NULL (when none can be freed: a fresh view). */
void mlfs_view_snap(struct mlfs_store *st, struct mlfs_view *v, int rank, struct xf_buf **old);
/* The same for every rank of @v on this node; @old: their nstates *
 * ntensors entries each, in rank order, or NULL. */
void mlfs_view_snap_local(struct mlfs_store *st, struct mlfs_view *v, struct xf_buf **old);
void mlfs_bufs_put(struct xf_buf **bufs, size_t n);
/* With "snapshot" and @step a multiple of its "every": pins rank @rank's
 * boxes of @v as the periodic snapshot's of @step (the replaced ones to
 * *@old, as mlfs_view_snap) and wakes the snapshot thread. Lock held. */
void mlfs_view_psnap(struct mlfs_store *st, struct mlfs_view *v, int rank, int64_t step,
		     struct xf_buf **old);
/* Whether rank @r of @l writes tensor @t's rows in a snapshot: the lowest
 * rank holding them (mlfs_snapshot.c). */
bool mlfs_snap_owner(const struct ptc_layout *l, int r, int t);
/* Rank @rank's snapshot partition (@state, @tensor) of @v pinned, when it
 * was taken at @step; else NULL, and *@have = the snapshot's step (-1:
 * none). */
struct xf_buf *mlfs_view_snap_get(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
				  int tensor, int64_t step, int64_t *have);

/* Adds a reference to @v and returns it; NULL-safe. Any thread: the caller
 * must already hold a reference (mlfs_store_view gives the first). */
struct mlfs_view *mlfs_view_get(struct mlfs_view *v);
/* Drops a reference; the last frees the view, its partition table (each
 * buffer put) and trees. NULL-safe; any thread, no lock held. */
void mlfs_view_put(struct mlfs_view *v);

/* ---------------------------------------------------------------- job tree */

/*
 * A job/ file's content: @size bytes at @bytes, and @hash, their mlfs_hash,
 * computed when the content is set (appends continue the streaming state
 * @xs; other changes hash the whole content again), so that the manifest
 * and the peer server never hash. Reference-counted (mlfs_jbuf_get, _put;
 * atomic, the last put frees and releases @cap bytes from @mem): the file
 * holds one reference, and whoever pins the content under the store lock
 * (the peer server sending it, a FUSE read replying from it, a staged tree
 * sharing it) holds another. Immutable while shared: a change to a file
 * whose buffer someone else holds gives the file a new buffer (copy on
 * write); only a buffer the file alone holds is changed in place, under
 * the store lock. Pinning happens only under the store lock, so a count
 * of 1 read there stays 1 until the lock is released.
 */
struct mlfs_jbuf {
	_Atomic int refs;
	size_t size, cap;
	uint64_t hash;
	uint8_t *bytes;
	XXH3_state_t *xs;   /* mlfs_hash's state after bytes[0, size), or NULL */
	struct xf_mem *mem; /* where @cap is counted */
};

#define MLFS_JOB_INDEXED 16 /* children from which a directory indexes them */

struct mlfs_job {
	char *name;
	bool dir;
	struct mlfs_job *parent, *first, *next, *prev; /* children list (dirs) */
	/* A directory of MLFS_JOB_INDEXED children or more: its children by
	 * name (open addressing on mlfs_hash of the name, @index_cap slots, a
	 * power of two, at most half of them used, tombstones counted), so
	 * that a lookup, a create and an unlink cost the same with 10 or
	 * 100,000 files (a job writing a file per step). NULL below that,
	 * or when --max-memory refused its slots: the list is searched. */
	struct mlfs_job **index;
	size_t index_cap, index_used, nchildren;
	struct mlfs_jbuf *buf; /* file content; NULL when empty */
	size_t size;	       /* buf ? buf->size : 0 */
	struct timespec mtime;
	uint64_t id;	    /* content identity */
	struct xf_mem *mem; /* where its node is counted */
};

/* ------------------------------------------------------------------ store */

/*
 * Whether partition and step writes are open: MLFS_TRANSFORMING while a
 * reconfiguration attempt holds the store (preparing to the end of
 * committing or aborting). Follows store->reconf; written only by
 * mlfs_reconf.c, under the lock. Readers outside the lock use it as a hint
 * only (mlfs_store_commit_part re-checks under it).
 */
enum mlfs_state { MLFS_IDLE, MLFS_TRANSFORMING };

/*
 * The states of a reconfiguration (mlfs_reconf.c), as status.json names
 * them. One attempt at a time; the current view changes only in committing.
 */
enum mlfs_reconf_state {
	MLFS_RECONF_IDLE,	/* "idle": no attempt */
	MLFS_RECONF_PREPARING,	/* "preparing": the new layout is built beside the current one */
	MLFS_RECONF_PREPARED,	/* "prepared": built; waits for commit or abort */
	MLFS_RECONF_COMMITTING, /* "committing": the new layout is current, the old one let go */
	MLFS_RECONF_ABORTING,	/* "aborting": the new partitions are discarded */
	MLFS_RECONF_FAILED,	/* "failed": the last attempt failed or was aborted (error says
				 * why); the old layout is current and writable */
};

struct mlfs_attempt; /* one reconfiguration attempt: mlfs_reconf.c */

struct mlfs_store {
	pthread_mutex_t lock; /* everything below */
	/* The job's nodes (cluster.json): replaced, never changed, when nodes
	 * join (mlfs_store_grow_cluster); the replaced ones stay valid until
	 * the store is released (layouts point to them). Read them through
	 * mlfs_store_cluster()/mlfs_store_cluster_text() without the lock. */
	struct ptc_cluster *cluster;
	char *cluster_text;
	struct mlfs_retired_cluster *retired;
	int node; /* index in cluster */
	struct xf_mem mem;
	int threads;

	char *schema_text;
	struct ptc_schema *schema; /* fixed once view is set */
	int64_t schema_bytes;	   /* counted in mem: the schema's and its text's blocks */
	struct mlfs_view *view;	   /* NULL until schema and config are set; never NULL again */
	int64_t *steps;		   /* per rank of view->layout, -1 = never saved */
	/* Per rank of view->layout: MLFS_SAVE_* (mlfs_store_saving), reset
	 * with @steps (a new view) and by an import. Store lock. */
	uint8_t *saves;
	int saves_n;
	/* In a job of many nodes, the layout planned from by the last commit
	 * (the one current before it, or the one it recovered from), kept with
	 * the step it holds until every node of that commit serves the new
	 * version (mlfs_store_release_retained): a node that dies between its
	 * vote and its swap then loses nothing that this node's copies held,
	 * and the next plan may start from it (mlfs_reconf_down.source).
	 * Served to peers like the current one. NULL: none. */
	struct mlfs_view *retained;
	int64_t retained_step;

	enum mlfs_reconf_state reconf;
	enum mlfs_state state; /* follows reconf, see above */
	/* The control plane's id of the last attempt (mlfs_reconf_down.id;
	 * "" without one) and the revision that created it: set with its
	 * state "preparing", so that reconf speaks for that attempt only. */
	char attempt_id[24];
	int64_t attempt_rev;
	struct mlfs_attempt *attempt; /* from preparing until aborting or committing ends */
	char error[PTC_ERROR_MAX];
	int64_t target_version; /* of the last attempt */
	_Atomic int64_t progress;
	int64_t progress_total;
	struct xf_stats last; /* the last committed reconfiguration */
	int64_t last_from, last_to;
	bool has_last;
	pthread_t xf_thread; /* the last attempt's transformer thread */
	bool xf_joinable;

	struct mlfs_job *job; /* the job/ directory */
	/* Counts the changes to job/ through the mount (mlfs_store_job_changed);
	 * the control plane's entry says job/ is as it was at the last swap
	 * only while this has not moved (cluster/mlfs_nodeentry.c). */
	_Atomic uint64_t job_gen;
	struct mlfs_data_opts data_opts;
	struct timespec start;
	/* Called (without the lock) after content of these paths changed, so
	 * the FUSE layer can drop cached pages. */
	void (*changed)(void *arg, const char *prefix);
	void *changed_arg;
	/* What status.json says that a waiter looks at (state, version, lost,
	 * error, the job's nodes) changed: the generation moves and the FUSE
	 * layer wakes those who poll status.json (mlfs_store_status_changed).
	 * Called with any lock held: it may only take its own. */
	_Atomic uint64_t status_gen;
	void (*status_changed)(void *arg);
	/* Fetches pieces of partitions of layout @version from the nodes that
	 * hold them (the plan's FETCH ops, as xf_fetch_fn: @n > 1 pieces of
	 * one source travel in one request; cluster/mlfs_peerclient.c), or
	 * NULL on a daemon without peers. Called by transformer workers,
	 * concurrently; 0 or a negative errno. Set before the mount serves;
	 * fixed afterwards. */
	int (*fetch)(void *arg, int64_t version, const struct xf_piece *v, size_t n);
	void *fetch_arg;
	/* A job of many nodes (mlfs_cluster.c); all unset on one node. Set
	 * before the mount serves; fixed afterwards. */
	bool multinode; /* layouts may place ranks on other nodes */
	/* This node restarted into a layout whose partitions other nodes had
	 * filled: its own are empty and must never be served as the job's
	 * (mlfs_cluster.c sets and clears it; the peer server reads it). */
	atomic_bool lost;
	/* schema.json and config.json writes go to the control plane: 0 once
	 * etcd took them (the nodes then install them), or a refusal. */
	int (*propose)(void *arg, bool config, const char *text, size_t len, struct ptc_error *err);
	/* The reconfiguration state changed (prepared, failed, ...): the
	 * control plane wakes to vote or publish. Store lock held: it may only
	 * set a flag. */
	void (*reconf_changed)(void *arg);
	/* job/ changed through the mount (mlfs_store_job_changed). Store
	 * lock held: it may only set a flag. NULL on one node. */
	void (*job_changed)(void *arg);
	/* Adds the job's view (nodes, attempt) to status.json; no lock held. */
	void (*status_add)(void *arg, json_t *status);
	/* Publishes this node's saved steps at once (after a step write or an
	 * import), so a config written right after sees them; no lock held,
	 * may wait on etcd (I/O workers only). */
	void (*steps_saved)(void *arg);
	/* Reads the other nodes' ranks' saved steps into st->steps now (a
	 * node does not follow them all the time); no lock held, may wait on
	 * etcd. NULL on one node. */
	void (*steps_refresh)(void *arg);
	/* The same from what the control plane follows of them, no request
	 * (the backup thread, four times a second); NULL on one node. */
	void (*steps_mirrored)(void *arg);
	/* `mlfs drain`: marks a node of the job for draining (@undo: no
	 * longer); NULL on one node. I/O workers (.mlfs-ctl). */
	int (*drain)(void *arg, const char *node, bool undo, struct ptc_error *err);
	/* `mlfs import --every-node`: the .mlfs-ctl import request @req run by
	 * every node of the job, each into its own ranks; waits up to @wait_s
	 * seconds for all, each node's outcome into @out ("nodes"). NULL on
	 * one node. I/O workers (.mlfs-ctl). */
	int (*import_all)(void *arg, const json_t *req, int wait_s, json_t *out,
			  struct ptc_error *err);
	/* Set when an attempt aborts, cleared when one starts: fetches in
	 * flight give up at once (-ECANCELED) instead of running out their
	 * retries. */
	atomic_int cancel;
	/* Bytes the peer server sent (cluster/mlfs_peerserver.c), and the memory in use when
	 * the current attempt started: status.json's last.bytes_served and
	 * last.peak_extra_memory are taken against them. */
	_Atomic int64_t served;
	int64_t served_base, mem_base;
	int64_t last_served, last_peak; /* of the last committed attempt */
	void *cluster_arg;
	/* The backups this node keeps of another node's saved state
	 * (mlfs_backup.c); NULL on one node. Set before the control plane
	 * starts, freed after the peer server stopped. */
	struct mlfs_backup *backup;
	/* The votes this node received as a coordinator (mlfs_votebox.c):
	 * made by the peer server at its start, freed with it; NULL on one
	 * node. */
	struct mlfs_votebox *votebox;
	/* The periodic snapshots' thread (mlfs_autosnap.c); NULL when none. */
	struct mlfs_autosnap *autosnap;
};

int mlfs_store_init(struct mlfs_store *st, struct ptc_cluster *cluster, char *cluster_text,
		    int node, int64_t max_memory, int threads);
/* Frees the store, after mlfs_reconf_shutdown ended any reconfiguration.
 * Called once, when no other thread uses the store. */
void mlfs_store_release(struct mlfs_store *st);

static inline struct ptc_cluster *mlfs_store_cluster(const struct mlfs_store *st)
{
	return __atomic_load_n(&st->cluster, __ATOMIC_ACQUIRE);
}

static inline const char *mlfs_store_cluster_text(const struct mlfs_store *st)
{
	return __atomic_load_n(&st->cluster_text, __ATOMIC_ACQUIRE);
}

/* Nodes join the job: @text is the job's cluster.json, which must extend
 * the store's (ptc_cluster_extends). 1 when it added nodes, 0 when it is
 * the same, or an error with @err (nothing changes). */
int mlfs_store_grow_cluster(struct mlfs_store *st, const char *text, size_t len,
			    struct ptc_error *err);

/* What a valid config may not ask of this daemon (@multinode: a job of
 * many nodes): 0, or -EINVAL with @err. */
static inline int mlfs_config_supported(const struct ptc_config *c, bool multinode,
					const char *what, struct ptc_error *err)
{
	if (c->replicas && (!multinode || c->nnodes < 2))
		return ptc_errorf(err,
				  "%s: \"replicas\": %d keeps each node's saved state on the "
				  "next node of \"nodes\": it needs a job of 2 or more nodes",
				  what, c->replicas);
	return 0;
}

/* The current view with a reference (NULL when unset). */
struct mlfs_view *mlfs_store_view(struct mlfs_store *st);
/* The view of layout @version with a reference: the current one or the
 * retained one; NULL when neither is that version. */
struct mlfs_view *mlfs_store_view_of(struct mlfs_store *st, int64_t version);
/* The retained layout's version (0: none) and, into *@step unless NULL,
 * the step it holds. */
int64_t mlfs_store_retained(struct mlfs_store *st, int64_t *step);
/* Lets the retained layout of @version go (freed once no reader or attempt
 * pins it): every node of the commit that retained it swapped. 1 when it
 * was released, 0 when none of that version is retained, -EBUSY while a
 * reconfiguration is in progress (it may be planned from it). */
int mlfs_store_release_retained(struct mlfs_store *st, int64_t version);

/*
 * The buffer of partition (@rank, @state, @tensor) of view @v, with a new
 * reference the caller puts (xf_buf_put): the bytes as they are now; a
 * later write swaps in another buffer and leaves this one intact. NULL
 * when @v holds no such partition on this node (a rank of another node, a
 * tensor the rank's stage does not hold, an index out of range: checked,
 * so indices may come from a peer). @v is the caller's (a reference from
 * mlfs_store_view or mlfs_view_get); it need not be current. Any thread:
 * FUSE workers, the peer server; takes st->lock briefly.
 */
struct xf_buf *mlfs_store_part_get(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
				   int tensor);

/*
 * A new view of config @config and dataset @ds (both taken over, freed on
 * error) with an empty partition table, its name trees built and its
 * metadata counted in st->mem; @text (@len bytes) is copied; @what names
 * the config in messages. 0, or -EINVAL/-ENOSPC with @err, -ENOMEM. The
 * schema must not change meanwhile: with st->lock held, or once a view is
 * set (the schema is fixed then). Any thread.
 */
int mlfs_view_new(struct mlfs_store *st, struct ptc_config *config, struct mlfs_dataset *ds,
		  const char *text, size_t len, const char *what, struct mlfs_view **out,
		  struct ptc_error *err);

/* A write of config.json (@config) or schema.json: 0 or a negative errno;
 * @err gets the reason, which also goes to status.json. One node installs
 * it (the _install functions); in a job of many nodes it is proposed to
 * the control plane (st->propose), which installs it on every node. */
int mlfs_store_set_control(struct mlfs_store *st, bool config, const char *text, size_t len,
			   struct ptc_error *err);
int mlfs_store_install_schema(struct mlfs_store *st, const char *text, size_t len,
			      struct ptc_error *err);
/* The first config is installed at once (partitions zeroed); a later one
 * is a reconfiguration that commits by itself (mlfs_reconf_prepare with
 * autocommit): 0 once it runs. */
int mlfs_store_install_config(struct mlfs_store *st, const char *text, size_t len,
			      struct ptc_error *err);
/* The job's first config on a node without a layout (the control thread):
 * 0 and nothing done when one is set already (the node that proposed it
 * installed it first). */
int mlfs_store_install_first_config(struct mlfs_store *st, const char *text, size_t len,
				    struct ptc_error *err);
/* A rank's save as the store saw it: no step written in this layout yet,
 * its step written and no partition since (its state is that step's), or
 * a partition written after its step (a save in progress, or one cut
 * short). */
enum { MLFS_SAVE_NONE, MLFS_SAVE_CLEAN, MLFS_SAVE_PARTIAL };

/* The first local rank of the current layout whose save is partial
 * (MLFS_SAVE_PARTIAL), or -1: a reconfiguration would build the new layout
 * from partitions newer than the step the ranks agree on. @reset: forget
 * every rank's (a new view, whose steps are new too; an import, which made
 * the partitions one step's). Lock held. */
int mlfs_store_saving(struct mlfs_store *st, bool reset);

int mlfs_store_set_step(struct mlfs_store *st, int rank, const char *text, size_t len,
			struct ptc_error *err);
/*
 * Runs a control request (JSON) of .mlfs-ctl: "import", and the
 * reconfiguration steps "prepare" {"config": text}, "commit" {"version"}
 * and "abort" {"version", "reason"} (mlfs_reconf_*). *reply gets a new JSON
 * text {"ok", "error"} (reconfiguration steps add "state", the state after
 * the request); a refusal's error also goes to status.json. Returns 0 or a
 * negative errno. FUSE workers; an import reads files meanwhile.
 */
int mlfs_store_control(struct mlfs_store *st, const char *text, size_t len, char **reply);
/*
 * The "import" request of .mlfs-ctl (mlfs_import.c): the full tensors of
 * directory @dir (<state>/<tensor>.npy; only state @only, or every state
 * when -1) sliced into this node's partitions of the current view, which
 * become the saved state of @step (-1: 0) on every local rank. When @dir
 * holds a snapshot (manifest.json, mlfs_snapshot.c), the boxes overlapping
 * this node's partitions are decompressed into them instead, each file's
 * size and XXH3 checked, and @step -1 is the snapshot's step. 0, or a negative
 * errno with @err saying why (every file that is missing or does not
 * match is named; nothing changes then): -EINVAL, -EBUSY (a
 * reconfiguration holds the store), -ENOSPC, -EIO, -ENOMEM. @err must
 * start empty (its text is appended to). A FUSE worker; reads files
 * without the lock.
 */
int mlfs_store_import(struct mlfs_store *st, const char *dir, int only, int64_t step,
		      struct ptc_error *err);
/*
 * Imports safetensors (mlfs_stimport.c): @from is one .safetensors file
 * (into state @only, or "model" when -1), or a directory holding
 * <state>.safetensors or <state>.safetensors.index.json and its shards for
 * each state imported (@only, or every state found). Tensors are named as
 * @names says ("schema" or "hf": ptc_hf_map_build) or as the mapping file
 * @map_file says (an absolute path; then @names is unused). Fused pieces
 * are assembled, transposed ones turned, and every local partition sliced
 * from them, then mlfs_import_commit makes them the saved state of @step
 * (-1: 0). Every file and tensor is checked first (header, dtype, shape,
 * offsets, index, duplicates, missing pieces); a file cut short while read
 * fails the import; nothing changes then. Errors and threads as
 * mlfs_store_import.
 */
int mlfs_store_import_st(struct mlfs_store *st, const char *from, int only, int64_t step,
			 const char *names, const char *map_file, struct ptc_error *err);
/* Whether @from holds safetensors for state @only (every state when -1):
 * a regular file, or a directory with <state>.safetensors or its index. */
bool mlfs_st_source(const struct ptc_schema *s, const char *from, int only);
/*
 * Swaps the built partitions @np (taken: those swapped in, the old ones
 * left in @np for the caller to release) into @v, which must still be
 * current with no reconfiguration, and makes @step every rank's saved
 * step. The one commit of every kind of import. 0, -EBUSY (@err says
 * why), -ENOMEM. Lock not held.
 */
int mlfs_import_commit(struct mlfs_store *st, struct mlfs_view *v, struct xf_parts *np,
		       int64_t step, struct ptc_error *err);
/*
 * The "snapshot" request of .mlfs-ctl (mlfs_snapshot.c, `mlfs snapshot`):
 * the saved step of every rank (the same everywhere, else -EINVAL naming
 * two ranks) written to directory @dir as zstd-compressed .npy boxes at
 * zstd @level, the boxes this node owns (each row range once in the job);
 * the node hosting rank 0 then waits up to @wait_s seconds for every
 * node's list and writes manifest.json last (atomic rename). Adds "step",
 * "node_files", "bytes", "compressed", "level", "seconds", "manifest" (and
 * "files" with it) to @out. 0, or a negative errno with @err: -EINVAL,
 * -EEXIST (@dir holds a snapshot), -EIO (a file could not be written),
 * -ETIMEDOUT, -ENOMEM. I/O workers; st->lock taken briefly to pin.
 */
#define MLFS_SNAP_LEVEL 1 /* zstd's level of a snapshot: mlfs_snapshot.c says why */
int mlfs_store_snapshot(struct mlfs_store *st, const char *dir, int level, int wait_s, json_t *out,
			struct ptc_error *err);

/* Periodic snapshots ("snapshot" in the config; mlfs_autosnap.c): the
 * thread that writes them, started before the mount serves and stopped
 * before the store is released. wake: lock held. status: the "snapshots"
 * object of status.json for config @c, lock held: "newest_step" and
 * "newest" (the newer of the periodic ones and the last `mlfs snapshot`
 * here, complete), and with "snapshot" its settings and figures; NULL
 * when there is neither. */
int mlfs_autosnap_start(struct mlfs_store *st);
void mlfs_autosnap_stop(struct mlfs_store *st);
void mlfs_autosnap_wake(struct mlfs_store *st);
json_t *mlfs_autosnap_status(struct mlfs_store *st, const struct ptc_config *c);
/* The step of the newest complete snapshot under @dir (its step-<N>
 * directories with a manifest.json), or -1. */
int64_t mlfs_snapshot_newest(const char *dir);
/* `mlfs snapshot` wrote this node's part of step @step into @dir: the
 * newest snapshot status.json names once dir's manifest is there. */
void mlfs_autosnap_note(struct mlfs_store *st, const char *dir, int64_t step);

/*
 * The "verify" request of .mlfs-ctl (mlfs_verify.c, `mlfs verify`): every
 * partition of this node's current view hashed again and compared with the
 * checksum kept since its commit; adds "version", "partitions", "bytes",
 * "unsealed" and "mismatches" (an array of {rank, state, tensor, bytes,
 * stored, now}) to @out. 0 (mismatches are not an error of the request),
 * -EINVAL without a layout, -ENOMEM. I/O workers; takes st->lock briefly.
 */
int mlfs_store_verify(struct mlfs_store *st, json_t *out, struct ptc_error *err);
/* Whether the daemon runs with MLFS_TEST_HOOKS=1 (test hooks on). */
bool mlfs_test_hooks(void);
/* Test hook ("flip", only with mlfs_test_hooks()): flips the low bit of
 * byte @byte of partition (@rank, @state, @tensor) of the current view in
 * memory, its kept checksum unchanged. 0 or -EINVAL with @err. */
int mlfs_store_flip(struct mlfs_store *st, int rank, const char *state, const char *tensor,
		    int64_t byte, struct ptc_error *err);

/* New malloc'd texts of the generated files. */
char *mlfs_store_status_json(struct mlfs_store *st);
char *mlfs_rank_json(const struct mlfs_view *v, int rank);

/* Queues the dataset views of every local DP group from @step on. */
void mlfs_store_prefetch(struct mlfs_store *st, struct mlfs_view *v, int64_t step);
/* Records a failure of a dataset view for status.json. */
void mlfs_store_note_error(struct mlfs_store *st, const char *msg);
/* Tells the FUSE layer (st->changed) that content under @prefix ("" =
 * everything) changed. No lock held. */
void mlfs_store_changed(struct mlfs_store *st, const char *prefix);
/* status.json changed for a waiter: st->status_gen moves and the FUSE
 * layer wakes its pollers (st->status_changed, with st->changed_arg). Any
 * thread, any lock held. */
void mlfs_store_status_changed(struct mlfs_store *st);
/* A change to job/ through the mount (a file created, written, truncated,
 * removed or renamed) was made: st->job_gen moves, and the control plane
 * is told (st->job_changed). Store lock held. */
void mlfs_store_job_changed(struct mlfs_store *st);

/* Partition commit: swaps the buffer of (rank, state, tensor) in view @v if
 * @v is still current and no reconfiguration runs. 0, -ESTALE, -EBUSY. */
int mlfs_store_commit_part(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
			   int tensor, struct xf_buf *b);

/* The partitions a full tensor (state, tensor) is assembled from: one per
 * TP rank (one when the tensor is not split), from the local ranks of @v,
 * each with a new reference, into @srcs (room for v->layout.tp). Returns
 * their number, or -EIO when a part is not on this node. Lock held (the
 * buffer pointers of the current view change under it). */
int mlfs_view_full_sources(const struct mlfs_view *v, const struct ptc_schema *s, int node,
			   int state, int tensor, struct xf_buf **srcs);
/* Assembles the full tensor from mlfs_view_full_sources' @srcs into a new
 * buffer *@out from @mem: xf_full_assemble, kept under this name for the
 * FUSE files that call it. 0, -ENOSPC, -ENOMEM. Any thread, no lock. */
static inline int mlfs_full_assemble(const struct ptc_schema *s, int state, int tensor,
				     struct xf_buf *const *srcs, int nsrcs, struct xf_mem *mem,
				     struct xf_buf **out)
{
	return xf_full_assemble(s, state, tensor, srcs, nsrcs, mem, out);
}

/*
 * full/<state>.safetensors (mlfs_stview.c): the state's untied tensors in
 * schema order, in shards of at most mlfs_st_shard_max() data bytes
 * (ptc_st_shards), "<state>-0000k-of-0000n.safetensors" with
 * "<state>.safetensors.index.json" when more than one. The header comes
 * from the schema alone; the bytes are assembled on read from the pinned
 * partitions, as full/<state>/<tensor>.npy's are.
 */
struct mlfs_st_shard {
	int state, n;	/* tensors */
	int tp;		/* parts of a split tensor */
	int *tensor;	/* n schema indexes */
	int64_t *begin; /* n offsets in the file (header included) */
	int *src0;	/* n + 1: tensor i's parts are srcs[src0[i] .. src0[i + 1]) */
	uint8_t *hdr;	/* the header, hdr_len bytes */
	size_t hdr_len;
	int64_t size; /* the file's bytes */
};

/* The data bytes of a shard of full/: PTC_ST_SHARD_MAX, or with
 * MLFS_TEST_HOOKS=1 the environment's MLFS_ST_SHARD_BYTES (read once). */
int64_t mlfs_st_shard_max(void);
/* Shards of state @state of @s under @max data bytes each; -ENOMEM. */
int mlfs_st_shard_count(const struct ptc_schema *s, int state, int64_t max);
/* Shard @shard of state @state, with parts of @tp ranks per split tensor:
 * 0, -ENOENT (no such shard), -ENOMEM. Release with mlfs_st_shard_release. */
int mlfs_st_shard_init(const struct ptc_schema *s, int state, int shard, int64_t max, int tp,
		       struct mlfs_st_shard *sh);
void mlfs_st_shard_release(struct mlfs_st_shard *sh);
/* The index of state @state (a new text: the caller frees it), or NULL. */
char *mlfs_st_index_text(const struct ptc_schema *s, int state, int64_t max);
/* Pins the parts of every tensor of @sh in @v into @srcs (sh->src0[n]
 * entries, references): 0, or -EIO when some part is not on @node (the
 * references taken are put). st->lock held. */
int mlfs_view_st_sources(const struct mlfs_view *v, const struct ptc_schema *s, int node,
			 const struct mlfs_st_shard *sh, struct xf_buf **srcs);
/* Bytes [@off, @off + @len) of the file of @sh (within its size) into
 * @dst, from its header and the pinned parts @srcs. 0, -ENOMEM. Any
 * thread; no lock. */
int mlfs_st_read(const struct ptc_schema *s, const struct mlfs_st_shard *sh,
		 struct xf_buf *const *srcs, uint8_t *dst, int64_t off, size_t len);

/* NPY header of a partition or full tensor; returns its length. */
size_t mlfs_part_header(const struct ptc_schema *s, const struct ptc_layout *l, int rank, int state,
			int tensor, char *buf, size_t cap);
size_t mlfs_full_header(const struct ptc_schema *s, int state, int tensor, char *buf, size_t cap);

/* -------------------------------------------------------- reconfiguration */

/* status.json's name of @s ("idle", "preparing", ...). */
const char *mlfs_reconf_state_name(enum mlfs_reconf_state s);
/* 0, or -EBUSY with @err "@what: a reconfiguration to version N is in
 * progress (<state>)" while an attempt holds the store. Lock held. */
int mlfs_reconf_busy(const struct mlfs_store *st, const char *what, struct ptc_error *err);

/*
 * Validates config text @text (@len bytes, copied; @what names it in
 * messages: "config.json", "prepare") and starts a reconfiguration to it:
 * plans without the lock (new view, cursor carry, plan), then takes
 * st->lock only to re-check what it planned from (no attempt in progress,
 * the same current view, the same saved step, room in --max-memory) and
 * publish state "preparing". A transformer thread then builds the new
 * layout beside the current one, which stays current, readable and pinned;
 * partition and step writes get EBUSY meanwhile. The build stops in
 * "prepared", or with @autocommit (one node: config.json) commits at once.
 * Returns 0 once the attempt runs (the build's own failure shows later as
 * "failed" in status.json); a build without @autocommit that fetches
 * nothing and copies at most MLFS_INLINE_BUILD_BYTES on this node runs on
 * the caller's thread and has ended ("prepared", or aborted) when this
 * returns. Otherwise nothing changed and @err says why:
 * -EINVAL (the config, its version not newer, ranks that saved different
 * steps, a dataset change, no current layout), -EBUSY (an attempt in
 * progress, or the store changed while planning: write it again),
 * -ENOSPC (the new partitions do not fit), -ENOMEM.
 * FUSE workers (any thread but the transformer); may read a dataset index
 * (network) before planning.
 */
/* The most bytes a build copies on the thread that prepares it (no
 * transformer thread; mlfs_reconf_prepare). */
#define MLFS_INLINE_BUILD_BYTES ((int64_t)1 << 20)
int mlfs_reconf_prepare(struct mlfs_store *st, const char *text, size_t len, const char *what,
			bool autocommit, struct ptc_error *err);
/* Nodes of the current layout that cannot serve: @down (ndown cluster
 * indices), and for each cluster node (@nbackup entries, 0: none) the node
 * that holds a backup of its saved state at the job's step, or -1. */
struct mlfs_reconf_down {
	const int *down;
	int ndown;
	const int *backup_of;
	int nbackup;
	/* The control plane's name for the attempt (its id, and the etcd
	 * revision that created it): the store shows it beside its state
	 * (st->attempt_id), so that the state is never read as another
	 * attempt's. NULL: none. */
	const char *id;
	int64_t rev;
	/* The version to plan from: 0 (or the current one's) for the current
	 * layout; otherwise the retained one (st->retained), at the step it
	 * holds: the coordinator's choice when the current layout lost
	 * partitions that only a node which never swapped into it held. */
	int64_t source;
};
/* The same, for a job whose nodes @dn->down cannot serve: the plan takes
 * their partitions from other copies (DP replicas, backups), or refuses
 * naming what has none (ptc_plan_compute_backups). */
int mlfs_reconf_prepare_down(struct mlfs_store *st, const char *text, size_t len, const char *what,
			     bool autocommit, const struct mlfs_reconf_down *dn,
			     struct ptc_error *err);
/*
 * Commits the prepared attempt to @version: the new view becomes current
 * under the lock (saved steps carried, dataset cursor continued), the FUSE
 * layer is told, the old view let go, then "idle". Returns 0 when done;
 * -EBUSY while the attempt is still preparing (or committing, aborting),
 * -EINVAL when nothing is prepared or @version is not the prepared one;
 * @err says which. Any thread but the transformer.
 */
int mlfs_reconf_commit(struct mlfs_store *st, int64_t version, struct ptc_error *err);
/*
 * Aborts the attempt to @version, preparing or prepared: its new
 * partitions are freed (a build in progress is discarded when it ends),
 * the current view stays as it was, then "failed" with "reconfiguration to
 * version N aborted: @reason" (NULL: "by request") in status.json. Returns
 * 0 once aborting (done when prepared); -EBUSY while committing or already
 * aborting, -EINVAL when no attempt is in progress or @version is not its
 * own; @err says which. Any thread but the transformer.
 */
int mlfs_reconf_abort(struct mlfs_store *st, int64_t version, const char *reason,
		      struct ptc_error *err);
/* At unmount: waits for the transformer thread and discards a prepared
 * attempt. Only when no other thread uses the store. */
void mlfs_reconf_shutdown(struct mlfs_store *st);

/* ------------------------------------------------------- memory counted */

/*
 * What metadata really costs (mlfs_memsize.c), counted in st->mem so that
 * memory_used follows the daemon's RSS: the usable size of each heap
 * block of the structure plus the allocator's header. mlfs_mem_of: one
 * block (NULL: 0); mlfs_mem_alloc: a block of @n bytes not yet allocated;
 * the others walk a whole structure: a schema (not its text), a name
 * tree, a config, a layout's tables, a plan, a view (its config, text,
 * layout, partition table, snapshots and trees; not its partitions), and
 * mlfs_mem_parts what node @node's partition buffers of @l cost beyond
 * the bytes xf_buf_new counts (their struct and a small buffer's rounding),
 * computed before they exist. Any thread; the structure must not change
 * meanwhile.
 */
int64_t mlfs_mem_of(const void *p);
int64_t mlfs_mem_alloc(size_t n);
int64_t mlfs_mem_schema(const struct ptc_schema *s);
int64_t mlfs_mem_tree(const struct mlfs_tnode *t);
int64_t mlfs_mem_config(const struct ptc_config *c);
int64_t mlfs_mem_layout(const struct ptc_layout *l);
int64_t mlfs_mem_plan(const struct ptc_plan *p);
int64_t mlfs_mem_parts(const struct ptc_layout *l, int node);
int64_t mlfs_mem_view(const struct mlfs_view *v);

/* ---------------------------------------------------------------- trees */

struct mlfs_tnode *mlfs_tree_build_stage(const struct ptc_layout *l, int p);
/* full/'s tree: every state's untied tensors, and its safetensors files
 * (shards of at most @shard_max data bytes, with an index when more than
 * one: mlfs_stview.c). */
struct mlfs_tnode *mlfs_tree_build_full(const struct ptc_schema *s, int64_t shard_max);
void mlfs_tree_free(struct mlfs_tnode *t);
/* Child named @name (length @n) of @t, or NULL. */
struct mlfs_tnode *mlfs_tree_child(const struct mlfs_tnode *t, const char *name, size_t n);

/* ---------------------------------------------------------------- job/ ops */

/* The largest job/ file, in bytes: a longer write fails with EFBIG, and a
 * peer's reply longer than this is refused. */
#define MLFS_JOB_FILE_MAX ((size_t)64 << 20)

struct mlfs_job *mlfs_job_new_dir(const char *name, struct xf_mem *mem);
void mlfs_job_free(struct mlfs_job *j);
struct mlfs_job *mlfs_job_child(const struct mlfs_job *dir, const char *name, size_t n);
int mlfs_job_create(struct mlfs_job *dir, const char *name, bool isdir, struct mlfs_job **out);
int mlfs_job_unlink(struct mlfs_job *dir, const char *name, bool isdir);
int mlfs_job_rename(struct mlfs_job *from, const char *name, struct mlfs_job *to,
		    const char *newname, unsigned flags);
/*
 * Changes to file @f's content (not a directory: -EISDIR), each setting its
 * mtime: mlfs_job_set makes it a copy of the @size bytes at @data (hashed
 * once); mlfs_job_share makes it @b (a new reference; NULL: empty), no
 * copy and no hash; mlfs_job_truncate cuts it or extends it with zeros;
 * mlfs_job_write writes @n bytes of @data at @off, extending it (with
 * zeros up to @off) when it ends past the end. Each keeps a buffer others
 * pin unchanged (a new one replaces it) and costs, besides the bytes
 * written, hashing the new bytes when it only extends the file, the whole
 * content when it changes bytes already there. 0, -ENOSPC (past
 * --max-memory), -ENOMEM: then @f is unchanged. The caller holds the lock
 * of the tree @f is in (the store lock for st->job; none for a tree only
 * it sees).
 */
int mlfs_job_set(struct mlfs_job *f, const uint8_t *data, size_t size);
int mlfs_job_share(struct mlfs_job *f, struct mlfs_jbuf *b);
int mlfs_job_truncate(struct mlfs_job *f, size_t size);
int mlfs_job_write(struct mlfs_job *f, size_t off, const uint8_t *data, size_t n);
/* A file's content hash (mlfs_hash of its bytes, cached: no hashing; 0 for
 * a directory). Under the tree's lock. */
uint64_t mlfs_job_hash(const struct mlfs_job *f);
/* Adds a reference to @b (NULL-safe) and returns it. Pin a file's content
 * with mlfs_jbuf_get(f->buf) under the tree's lock; use it after. */
struct mlfs_jbuf *mlfs_jbuf_get(struct mlfs_jbuf *b);
/* Drops a reference; the last frees @b. NULL-safe; any thread, no lock
 * needed (hold none when it may be the last of a large buffer). */
void mlfs_jbuf_put(struct mlfs_jbuf *b);
/* Sets @j's mtime to @ns (ns since the epoch): a staged copy keeps the
 * time its source wrote it, which the next merge of the nodes' trees
 * compares. */
void mlfs_job_set_mtime(struct mlfs_job *j, int64_t ns);
/* @j's mtime in ns since the epoch (the manifest's "m"). */
int64_t mlfs_job_mtime_ns(const struct mlfs_job *j);
/*
 * Takes into the tree @into (a staged tree, its builder's alone) every
 * file of @from (the live tree, store lock held) that @into lacks or holds
 * with an older mtime: the union's "newest copy wins" applied once more at
 * the swap, so that a job/ write made while an attempt was under way
 * (after the coordinator read this node's manifest) is not lost. Content
 * is shared, not copied. *@kept counts the files taken. 0; -EEXIST when a
 * newer file of @from meets a directory of @into, or the other way round
 * (no merge can keep both); -ENOSPC, -ENOMEM: @into is then partly merged
 * and must not be installed.
 */
int mlfs_job_keep_newer(struct mlfs_job *into, const struct mlfs_job *from, int *kept);
/* The tree under @root as [{"p": path, "d": dir, "n": size, "h": hash in
 * hex, "m": mtime in ns}], parents before children; a new reference (NULL
 * on ENOMEM). Store lock held: O(files), the hashes are the cached ones,
 * no file's bytes are read. */
json_t *mlfs_job_manifest(const struct mlfs_job *root);

#endif
