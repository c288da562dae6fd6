/*
 * mlfs_i.h - internals shared by the daemon's files.
 *
 * Lock order: store->lock, then inodes->lock (never the reverse); neither is
 * held across a fuse_reply_*, a notification or file I/O outside the store.
 */
#ifndef MLFS_MLFS_I_H
#define MLFS_MLFS_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "mlfs/mlfs.h"
#include "mlfs/mlfs_data.h"
#include "mlfs/mlfs_npy.h"
#include "ptc/ptc.h"
#include "transform/xf.h"

/* ------------------------------------------------------------ name trees */

/* A directory tree of "<state>/<tensor>.npy" paths; leaves name a tensor. */
struct mlfs_tnode {
	char *name;
	int nchild, capchild;
	struct mlfs_tnode **child; /* sorted by name once built */
	int state, tensor;	   /* leaf: >= 0; directory: -1 */
};

/* ------------------------------------------------------------------ views */

/*
 * One layout version on this node. Immutable once published, except the
 * partition buffer pointers in parts.bufs, which writers swap under
 * store->lock. Reference-counted: lookups in flight keep an old view alive.
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
	struct mlfs_dataset *ds;  /* NULL when the config names none */
	struct xf_mem *mem;	  /* where meta_bytes are counted */
	int64_t meta_bytes;	  /* estimate of the table and trees */
	struct ptc_cursor cursor; /* with ds: the samples each step consumes */
};

void mlfs_view_put(struct mlfs_view *v);

/* ---------------------------------------------------------------- job tree */

struct mlfs_job {
	char *name;
	bool dir;
	struct mlfs_job *parent, *first, *next; /* children list (dirs) */
	uint8_t *data;				/* file content */
	size_t size, cap;
	struct timespec mtime;
	uint64_t id;	     /* content identity */
	struct xf_mem *mem; /* where its node and data are counted */
};

/* ------------------------------------------------------------------ store */

enum mlfs_state { MLFS_IDLE, MLFS_TRANSFORMING, MLFS_FAILED };

struct mlfs_store {
	pthread_mutex_t lock; /* everything below */
	struct ptc_cluster *cluster;
	char *cluster_text;
	int node; /* index in cluster */
	struct xf_mem mem;
	int threads;

	char *schema_text;
	struct ptc_schema *schema;
	int64_t schema_bytes; /* counted in mem: an estimate */
	struct mlfs_view *view; /* NULL until schema and config are set */
	int64_t *steps;		/* per rank of view->layout, -1 = never saved */

	enum mlfs_state state;
	char error[PTC_ERROR_MAX];
	int64_t target_version;
	_Atomic int64_t progress;
	int64_t progress_total;
	struct xf_stats last;
	int64_t last_from, last_to;
	bool has_last;
	pthread_t xf_thread;
	bool xf_joinable;

	struct mlfs_job *job; /* the job/ directory */
	struct mlfs_data_opts data_opts;
	struct timespec start;
	/* Called (without the lock) after content of these paths changed, so
	 * the FUSE layer can drop cached pages. */
	void (*changed)(void *arg, const char *prefix);
	void *changed_arg;
};

int mlfs_store_init(struct mlfs_store *st, struct ptc_cluster *cluster, char *cluster_text,
		    int node, int64_t max_memory, int threads);
void mlfs_store_release(struct mlfs_store *st);

/* The current view with a reference (NULL when unset). */
struct mlfs_view *mlfs_store_view(struct mlfs_store *st);

/* Control file writes: 0 or a negative errno; @err gets the reason. */
int mlfs_store_set_schema(struct mlfs_store *st, const char *text, size_t len,
			  struct ptc_error *err);
int mlfs_store_set_config(struct mlfs_store *st, const char *text, size_t len,
			  struct ptc_error *err);
int mlfs_store_set_step(struct mlfs_store *st, int rank, const char *text, size_t len,
			struct ptc_error *err);
/* Runs a control request (JSON) synchronously; *reply gets a new JSON text. */
int mlfs_store_control(struct mlfs_store *st, const char *text, size_t len, char **reply);

/* New malloc'd texts of the generated files. */
char *mlfs_store_status_json(struct mlfs_store *st);
char *mlfs_rank_json(const struct mlfs_view *v, int rank);

/* Queues the dataset views of every local DP group from @step on. */
void mlfs_store_prefetch(struct mlfs_store *st, struct mlfs_view *v, int64_t step);
/* Records a failure of a dataset view for status.json. */
void mlfs_store_note_error(struct mlfs_store *st, const char *msg);

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
 * buffer *@out from @mem. 0, -ENOSPC, -ENOMEM. Any thread, no lock. */
int mlfs_full_assemble(const struct ptc_schema *s, int state, int tensor,
		       struct xf_buf *const *srcs, int nsrcs, struct xf_mem *mem,
		       struct xf_buf **out);

/* NPY header of a partition or full tensor; returns its length. */
size_t mlfs_part_header(const struct ptc_schema *s, const struct ptc_layout *l, int rank, int state,
			int tensor, char *buf, size_t cap);
size_t mlfs_full_header(const struct ptc_schema *s, int state, int tensor, char *buf, size_t cap);

/* ---------------------------------------------------------------- trees */

struct mlfs_tnode *mlfs_tree_build_stage(const struct ptc_layout *l, int p);
struct mlfs_tnode *mlfs_tree_build_full(const struct ptc_schema *s);
void mlfs_tree_free(struct mlfs_tnode *t);
/* Child named @name (length @n) of @t, or NULL. */
struct mlfs_tnode *mlfs_tree_child(const struct mlfs_tnode *t, const char *name, size_t n);

/* ---------------------------------------------------------------- job/ ops */

struct mlfs_job *mlfs_job_new_dir(const char *name, struct xf_mem *mem);
void mlfs_job_free(struct mlfs_job *j);
struct mlfs_job *mlfs_job_child(const struct mlfs_job *dir, const char *name, size_t n);
int mlfs_job_create(struct mlfs_job *dir, const char *name, bool isdir, struct mlfs_job **out);
int mlfs_job_unlink(struct mlfs_job *dir, const char *name, bool isdir);
int mlfs_job_rename(struct mlfs_job *from, const char *name, struct mlfs_job *to,
		    const char *newname, unsigned flags);
int mlfs_job_set(struct mlfs_job *f, const uint8_t *data, size_t size);
int mlfs_job_truncate(struct mlfs_job *f, size_t size);

#endif
