/*
 * mlfs_fuse_i.h - internals shared by the files of the mount (the FUSE side
 * of the daemon): its types and the functions one file gives another.
 *
 * DESIGN
 * One daemon context (struct mlfs_daemon) per mount, handed to
 * fuse_session_new and reached by every handler with fuse_req_userdata();
 * it owns the store, the inode table, the notifier and the list of fresh
 * writers. The files, one job each:
 *   mlfs_daemon.c   start-up checks, the session, its loop, the ops table
 *   mlfs_inode.c    the inode table and the content each inode pins
 *   mlfs_resolve.c  paths resolved against the current view (struct target)
 *   mlfs_attr.c     attributes, lookup/forget, setattr, xattrs, statfs
 *   mlfs_open.c     open files (struct fh), reads, release
 *   mlfs_write.c    writes: staged partitions and control texts, flush
 *   mlfs_dir.c      directory listings and the job/ namespace
 *   mlfs_notify.c   telling the kernel which names a commit superseded
 *
 * Inodes are (path, content): a partition's or full tensor's inode pins the
 * buffers and header it was looked up with, and every open of it reads
 * them, so one open file is one version (bytes, size, maps, page cache) to
 * its end, even after its path is gone. Lookups of such names are never
 * cached, so an open after a commit finds the new inode. Partition writes
 * are staged privately (direct I/O) and committed at the flush that
 * completes them (mlfs_write.c says which flushes count). Control files
 * take effect when their JSON is complete; job/ behaves as tmpfs.
 *
 * Threads: libfuse's workers run every handler; the notifier thread sends
 * kernel notifications; the store's transformer thread reconfigures.
 * Locks, in order: fh->lock, then st->lock, then inodes.lock; notes.lock
 * and fresh.lock are leaves. None is held across a fuse_reply_*.
 */
#ifndef MLFS_MLFS_FUSE_I_H
#define MLFS_MLFS_FUSE_I_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "mount/mount.h"
#include "store/store.h"

#define NOTIFY_MAX 1024

/*
 * The content a partition or full-tensor inode names, fixed for the inode's
 * life: the header and the buffers it was looked up with (one partition, or
 * the tp partitions a full tensor is assembled from). Every open of the
 * inode reads exactly this, so its kernel page cache and size can never mix
 * two versions. Reference-counted: the inode holds one, each open in
 * progress another. Pinned buffers stay counted in --max-memory until the
 * kernel forgets the inode (see notify_*: it is told to, after a commit).
 */
struct pin {
	atomic_int refs;
	int kind, rank, state, tensor; /* what it is (enum kind), for attributes */
	size_t hdr_len;
	char hdr[512];
	/* A full tensor whose parts other nodes hold: for each part i with
	 * bufs[i] NULL, the rank and tensor index to fetch it from, in layout
	 * @version (its content is fetched at every open: not cached). */
	int64_t version;
	int *remote; /* [nbufs * 2]: rank, tensor; NULL when every part is here */
	int nbufs;   /* 1, or the layout's tp for a full tensor */
	struct xf_buf *bufs[];
};

struct inode {
	uint64_t ino, nlookup;
	uint64_t gen;	 /* partitions, full tensors: identity of the pinned content */
	struct pin *pin; /* partitions and full tensors; NULL for the rest */
	char *path;
	struct inode *hnext;
};

/* The inode table: (path, generation) <-> inode number. */
struct mlfs_inodes {
	pthread_mutex_t lock;
	struct inode **byino; /* index: ino */
	size_t n, cap;
	struct inode **hash;
	size_t hcap; /* power of two */
};

struct mlfs_notes {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char *paths[NOTIFY_MAX];
	int n;
	bool all, stop, running;
	pthread_t thread;
	struct fuse_session *se;
};

enum kind {
	K_ROOT,
	K_CONFIG,
	K_SCHEMA,
	K_CLUSTER,
	K_STATUS,
	K_CTL,
	K_JOB,
	K_RANKS,
	K_RANK,
	K_RANKJSON,
	K_STEP,
	K_TDIR,
	K_PART,
	K_FULL,
	K_FDIR,
	K_FFILE,
	K_DDIR,	 /* ranks/<r>/data */
	K_DFILE, /* ranks/<r>/data/<step>.<kind> */
};

struct ent {
	enum kind kind;
	int rank, state, tensor;
	int64_t step, first, count; /* K_DFILE: the step and its samples */
	int64_t nsteps;		    /* K_DFILE: a window of steps, or 0 */
	uint64_t whash;		    /* K_DFILE window: its steps' slices */
	enum mlfs_dfile dkind;
	const struct mlfs_tnode *tn;
	struct mlfs_job *job;
};

/* Resolves an inode under the lock: path, view ref, entity, and for
 * partitions and full tensors the content the inode names. */
struct target {
	struct mlfs_daemon *d;
	char path[4096];
	struct mlfs_view *v;
	struct ent e;
	struct pin *pin; /* a reference, or NULL */
	bool vanished;	 /* the path is gone from the current view; e is the pin's */
};

/* Where a control text's top-level JSON value ends, found incrementally as
 * the text grows (a text written 4 KiB at a time is scanned once, and parsed
 * once, by the store, when it is complete). */
struct jscan {
	size_t pos;
	int depth;
	bool str, esc, started, done;
};

/* An open file. Referenced by its open (until release) and by each read in
 * progress: a reply may still be read from its buffers after the kernel
 * completed the request and the file was released. Requests on one handle
 * can run at once (threads sharing a descriptor): @lock guards everything
 * a write, flush or setattr changes (text, staging, buf of a writer). */
struct fh {
	atomic_int refs;
	pthread_mutex_t lock;
	struct mlfs_daemon *d;
	enum kind kind;
	struct mlfs_view *v;
	char *path; /* partitions and job/ files: for messages and notifications */
	int rank, state, tensor;
	bool write, dirty, committed, truncated;
	pid_t wpid; /* the thread of the last write */
	int err; /* sticky: a refused write */
	/* reading: a buffer snapshot behind a header, or a text */
	struct xf_buf *buf;
	char hdr[512];
	size_t hdr_len;
	char *text;
	size_t text_len;
	/* writing text files: the text, its capacity (counted in --max-memory) */
	char *w;
	size_t wlen, wcap;
	struct jscan scan;
	/* writing partitions: staged header and data */
	uint8_t *whdr;
	size_t whave, wtotal; /* header bytes held; declared header length (0 = unknown) */
	struct xf_buf *wdata;
	bool wbase; /* not truncated: unwritten bytes are the current content */
	/* fresh writers (see fresh_*): opened, not yet written nor truncated */
	fuse_ino_t ino;
	pid_t pid;
	struct fh *fresh_next;
	atomic_bool fresh_listed;
	int64_t wend;
	struct pin *pin; /* full tensors: the sources, until assembled at open */
	/* dataset views: a step's (nsteps 0), or a window's, one a step */
	struct mlfs_dview **views; /* [nviews] */
	int64_t nviews;
	enum mlfs_dfile dkind;
	int64_t step, first, count, nsteps;
};

struct mlfs_fresh {
	pthread_mutex_t lock;
	struct fh *head;
};

/* The I/O workers (mlfs_io.c): a job answers its request itself. */
#define MLFS_IO_THREADS 8 /* as many slow requests wait at once without queueing */
#define MLFS_IO_THREADS_MAX 32
#define MLFS_IO_QUEUE_MAX 4096

struct mlfs_io_job {
	void (*run)(struct mlfs_io_job *j);    /* does the work, replies, frees j */
	void (*cancel)(struct mlfs_io_job *j); /* replies an error instead, frees j */
	struct mlfs_io_job *next;
};

struct mlfs_io {
	pthread_mutex_t lock; /* the queue */
	pthread_cond_t cond;
	struct mlfs_io_job *head, *tail;
	int queued, nthreads;
	bool stop;
	pthread_t threads[MLFS_IO_THREADS_MAX];
};

/* Starts @nthreads workers: 0 or a negative errno (none left running). */
int mlfs_io_start(struct mlfs_io *io, int nthreads);
/* Queues @j: 0, -EAGAIN when MLFS_IO_QUEUE_MAX jobs wait, -ESHUTDOWN when
 * stopping; on error @j is untouched (the caller replies). Any thread. */
int mlfs_io_submit(struct mlfs_io *io, struct mlfs_io_job *j);
/* Cancels the waiting jobs, waits for the running ones, joins. */
void mlfs_io_stop(struct mlfs_io *io);

/*
 * The daemon: everything one mount serves, reached by every handler through
 * fuse_req_userdata(). Locks: st->lock, then inodes.lock; fh->lock before
 * st->lock; notes.lock and fresh.lock are leaves.
 */
struct mlfs_daemon {
	struct mlfs_store *st;
	struct mlfs_inodes inodes;
	struct mlfs_notes notes;
	struct mlfs_fresh fresh;
	struct mlfs_io io;
	uid_t uid; /* owner of every file */
	gid_t gid;
};


/* mlfs_resolve.c: the names at the mount's root, ended by a NULL name */
struct mlfs_root_file {
	const char *name;
	enum kind kind;
};
extern const struct mlfs_root_file mlfs_root_files[];

/* mlfs_inode.c */
void mlfs_pin_put(struct pin *p);
struct pin *mlfs_pin_get(struct pin *p);
uint64_t mlfs_path_hash(const char *p, uint64_t gen);
int mlfs_inodes_init(struct mlfs_daemon *d);
void mlfs_inodes_release(struct mlfs_daemon *d);
int mlfs_ino_get(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap, struct pin **pin);
int mlfs_ino_path(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap);
struct inode **mlfs_hash_slot(struct mlfs_daemon *d, const char *path, uint64_t gen);
uint64_t mlfs_ino_lookup(struct mlfs_daemon *d, const char *path, uint64_t gen, struct pin *pin);
void mlfs_ino_forget(struct mlfs_daemon *d, fuse_ino_t ino, uint64_t n);
void mlfs_fresh_add(struct fh *f, fuse_ino_t ino, pid_t pid);
struct fh *mlfs_fresh_take(struct mlfs_daemon *d, struct fh *f, fuse_ino_t ino, pid_t pid);

/* mlfs_notify.c */
void mlfs_notify_store_changed(void *arg, const char *prefix);
int mlfs_notify_start(struct mlfs_daemon *d, struct fuse_session *se);
bool mlfs_notify_stop(struct mlfs_daemon *d);
void mlfs_notify_part(struct mlfs_daemon *d, const struct mlfs_view *v, int rank, int state, int tensor);

/* mlfs_resolve.c */
int mlfs_resolve(struct mlfs_daemon *d, const char *path, struct mlfs_view *v, struct ent *e);
int mlfs_ent_pin(struct mlfs_daemon *d, const struct mlfs_view *v, const struct ent *e, uint64_t *gen, struct pin **pin);
int mlfs_target_get(struct mlfs_daemon *d, fuse_ino_t ino, struct target *t);
void mlfs_target_done(struct target *t);
void mlfs_target_put(struct target *t);
int mlfs_child_path(struct mlfs_daemon *d, fuse_ino_t parent, const char *name, char *buf, size_t cap);

/* mlfs_attr.c */
size_t mlfs_text_len(char *s);
char *mlfs_step_text(struct mlfs_daemon *d, int rank);
void mlfs_fill_attr(struct mlfs_daemon *d, const struct ent *e, const struct mlfs_view *v, const struct pin *pin,
		      struct stat *stb);
void mlfs_reply_entry(fuse_req_t req, const char *path, const struct ent *e,
			const struct mlfs_view *v);
void mlfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void mlfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n);
void mlfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f);
void mlfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi);
void mlfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void mlfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void mlfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags);
void mlfs_op_statfs(fuse_req_t req, fuse_ino_t ino);

/* mlfs_open.c */
struct fh *mlfs_fh_new(struct mlfs_daemon *d, enum kind kind);
void mlfs_fh_free(struct fh *f);
struct fh *mlfs_fh_of(struct fuse_file_info *fi);
void mlfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi);
void mlfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);

/* mlfs_write.c */
int mlfs_text_append(struct fh *f, const char *buf, size_t size, off_t off);
int mlfs_part_refuse(const struct fh *f, const char *why);
int mlfs_ctl_try_commit(struct fh *f, bool final);
void mlfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi);
int mlfs_part_commit(struct fh *f);
void mlfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);

/* mlfs_dir.c */
void mlfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi);
void mlfs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void mlfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi);
void mlfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void mlfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void mlfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags);
void mlfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void mlfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void mlfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);

/* mlfs_daemon.c */
void mlfs_op_init(void *userdata, struct fuse_conn_info *conn);

#endif
