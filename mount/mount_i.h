/*
 * mount_i.h - internals shared by the files of the mount (the FUSE side of
 * the daemon): its types and the functions one file gives another.
 *
 * DESIGN
 * One daemon context (struct mlfs_daemon) per mount, handed to
 * fuse_session_new and reached by every handler with fuse_req_userdata();
 * it owns the store, the inode table, the notifier, the I/O workers and the
 * list of fresh writers. The files, one job each:
 *   mlfs_daemon.c   start-up checks, the session, its loop, the ops table
 *   mlfs_inode.c    the inode table and the content each inode pins
 *   mlfs_resolve.c  paths resolved against the current view (mlfs_target)
 *   mlfs_attr.c     attributes, lookup/forget, setattr, xattrs, statfs
 *   mlfs_fh.c       the open-file object (struct mlfs_fh): its references,
 *                   its staging buffers' lifecycle, the fresh writers
 *   mlfs_open.c     open, read and release of files
 *   mlfs_write.c    writes and the write policies: what a write stages, what
 *                   a flush commits, what a release does with the rest
 *   mlfs_dir.c      directory listings and the job/ namespace
 *   mlfs_notify.c   telling the kernel which names a commit superseded, and
 *                   waking those who poll status.json
 *   mlfs_io.c       the I/O workers that answer requests which may block
 *
 * Inodes are (path, content): a partition's or full tensor's inode pins the
 * buffers and header it was looked up with, and every open of it reads
 * them, so one open file is one version (bytes, size, maps, page cache) to
 * its end, even after its path is gone. Lookups of such names are never
 * cached, so an open after a commit finds the new inode. Partition writes
 * are staged privately (direct I/O) and committed at the flush that
 * completes them (mlfs_write_flush says which flushes count). Control files
 * take effect when their JSON is complete; job/ behaves as tmpfs. Only
 * mlfs_fh.c (allocation, reset, hand-over) and mlfs_write.c (content,
 * commits) touch an open file's staging fields.
 *
 * Threads: libfuse's workers run every handler; the I/O workers run the
 * requests that may block (mlfs_io.c) and reply to them; the notifier thread
 * sends kernel notifications; the store's transformer thread reconfigures.
 * Locks, in order: fh->lock, then st->lock, then inodes.lock; notes.lock,
 * fresh.lock and io.lock are leaves. None is held across a fuse_reply_*.
 */
#ifndef MLFS_MOUNT_I_H
#define MLFS_MOUNT_I_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "mount/mount.h"
#include "store/store.h"

/* Paths queued for the notifier before the queue collapses into "all". */
#define MLFS_NOTIFY_MAX 1024

/* The most bytes of a partition's .npy header a writer may stage: the
 * header dict and the fixed part before it (magic, version, length). */
#define MLFS_STAGE_HDR_MAX (MLFS_NPY_MAX_HEADER + 12)

/* What a path of the mount names. */
enum mlfs_kind {
	MLFS_K_ROOT,
	MLFS_K_CONFIG,
	MLFS_K_SCHEMA,
	MLFS_K_CLUSTER,
	MLFS_K_STATUS,
	MLFS_K_CTL,
	MLFS_K_JOB,
	MLFS_K_RANKS,
	MLFS_K_RANK,
	MLFS_K_RANKJSON,
	MLFS_K_STEP,
	MLFS_K_TDIR,
	MLFS_K_PART,
	MLFS_K_FULL,
	MLFS_K_FDIR,
	MLFS_K_FFILE,
	MLFS_K_DDIR,   /* ranks/<r>/data */
	MLFS_K_DFILE,  /* ranks/<r>/data/<step>.<kind> */
	MLFS_K_SFILE,  /* full/<state>.safetensors, or a shard of it */
	MLFS_K_SINDEX, /* full/<state>.safetensors.index.json */
};

/*
 * The content a partition or full-tensor inode names, fixed for the inode's
 * life: the header and the buffers it was looked up with (one partition, or
 * the tp partitions a full tensor is assembled from). Every open of the
 * inode reads exactly this, so its kernel page cache and size can never mix
 * two versions. Reference-counted: the inode holds one, each open in
 * progress another. Pinned buffers stay counted in --max-memory until the
 * kernel forgets the inode (see mlfs_notify.c: it is told to, after a
 * commit).
 */
struct mlfs_pin {
	atomic_int refs;
	enum mlfs_kind kind; /* what it is, for attributes */
	int rank, state, tensor;
	size_t hdr_len;
	char hdr[512];
	/* A full tensor whose parts other nodes hold: for each part i with
	 * bufs[i] NULL, the rank and tensor index to fetch it from, in layout
	 * @version (its content is fetched at every open: not cached). */
	int64_t version;
	int *remote;		  /* [nbufs * 2]: rank, tensor; NULL when every part is here */
	struct mlfs_st_shard *sh; /* a safetensors file: its tensors and header; bufs
				   * are their parts (mlfs_stview.c) */
	int nbufs;		  /* 1, or the layout's tp for a full tensor */
	struct xf_buf *bufs[];
};

/* An inode: a path and, for content that changes, the generation of the
 * content it names (see mlfs_ent_pin). inodes.lock. */
struct mlfs_inode {
	uint64_t ino, nlookup;
	uint64_t gen;	      /* partitions, full tensors: identity of the pinned content */
	struct mlfs_pin *pin; /* partitions and full tensors; NULL for the rest */
	char *path;
	struct mlfs_inode *hnext;
};

/* The inode table: (path, generation) <-> inode number. @lock guards all. */
struct mlfs_inodes {
	pthread_mutex_t lock;
	struct mlfs_inode **byino; /* index: ino */
	size_t n, cap;
	struct mlfs_inode **hash;
	size_t hcap; /* power of two */
};

/* The notifier's queue (mlfs_notify.c). @lock guards all. */
struct mlfs_notes {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char *paths[MLFS_NOTIFY_MAX];
	int n;
	bool all, stop, running;
	pthread_t thread;
	struct fuse_session *se;
};

/* Those who poll status.json for a change (mlfs_notify.c): the kernel's
 * handles, woken and freed at the store's next status change. Bounded: a
 * full list is woken at once (a waiter then reads again). @lock guards
 * all. */
#define MLFS_POLLS_MAX 256
struct mlfs_polls {
	pthread_mutex_t lock;
	struct fuse_pollhandle *ph[MLFS_POLLS_MAX];
	int n;
};

/* A path resolved against a view: what it names. */
struct mlfs_ent {
	enum mlfs_kind kind;
	int rank, state, tensor;
	int shard;		    /* MLFS_K_SFILE: which file of the state */
	int64_t step, first, count; /* MLFS_K_DFILE: the step and its samples */
	int64_t nsteps;		    /* MLFS_K_DFILE: a window of steps, or 0 */
	uint64_t whash;		    /* MLFS_K_DFILE window: its steps' slices */
	enum mlfs_dfile dkind;
	const struct mlfs_tnode *tn;
	struct mlfs_job *job;
};

/* An inode resolved under the store lock: path, view ref, entity, and for
 * partitions and full tensors the content the inode names. */
struct mlfs_target {
	struct mlfs_daemon *d;
	char path[4096];
	struct mlfs_view *v;
	struct mlfs_ent e;
	struct mlfs_pin *pin; /* a reference, or NULL */
	bool vanished;	      /* the path is gone from the current view; e is the pin's */
};

/* Where a control text's top-level JSON value ends, found incrementally as
 * the text grows (a text written 4 KiB at a time is scanned once, and parsed
 * once, by the store, when it is complete). */
struct mlfs_jscan {
	size_t pos;
	int depth;
	bool str, esc, started, done;
};

/*
 * An open file (mlfs_fh.c). Referenced by its open (until release) and by
 * each read, queued write or flush in progress: a reply may still be read
 * from its buffers after the kernel completed the request and the file was
 * released. Requests on one handle can run at once (threads sharing a
 * descriptor): @lock guards everything a write, flush, setattr or release
 * changes (the write state, the staging, buf of a writer, text of
 * .mlfs-ctl).
 */
struct mlfs_fh {
	atomic_int refs;
	pthread_mutex_t lock;
	/* set by the open, then fixed */
	struct mlfs_daemon *d;
	enum mlfs_kind kind;
	struct mlfs_view *v;
	char *path; /* partitions and job/ files: for messages and notifications */
	int rank, state, tensor;
	bool write;
	/* reading: a buffer snapshot behind a header, or a text */
	struct xf_buf *buf;
	char hdr[512];
	size_t hdr_len;
	char *text;
	size_t text_len;
	uint64_t status_gen;  /* status.json: the store's status_gen before its text */
	struct mlfs_pin *pin; /* full tensors: the sources, until assembled at open */
	/* a safetensors file with parts on other nodes: the pin's local parts
	 * and the ones fetched at the open, read instead of the pin's */
	struct xf_buf **srcs; /* [nsrcs] */
	int nsrcs;
	/* dataset views: a step's (nsteps 0), or a window's, one a step */
	struct mlfs_dview **views; /* [nviews] */
	int64_t nviews;
	enum mlfs_dfile dkind;
	int64_t step, first, count, nsteps;
	/* the write state (mlfs_write.c) */
	bool dirty, committed, truncated;
	pid_t wpid; /* the thread of the last write */
	int err;    /* sticky: a refused write */
	/* the staging: allocated, reset and handed over by mlfs_fh.c, written
	 * and committed by mlfs_write.c, touched by no other file.
	 * Control texts: the text, its capacity (counted in --max-memory). */
	char *w;
	size_t wlen, wcap;
	struct mlfs_jscan scan;
	/* Partitions: staged header and data, and the file's staged end. */
	uint8_t *whdr;
	size_t whave, wtotal; /* header bytes held; declared header length (0 = unknown) */
	struct xf_buf *wdata;
	int64_t wend;
	bool wbase; /* not truncated: unwritten bytes are the current content */
	/* fresh writers (mlfs_fresh_*): opened, not yet written nor truncated */
	fuse_ino_t ino;
	pid_t pid;
	struct mlfs_fh *fresh_next;
	atomic_bool fresh_listed;
};

/* The fresh writers (mlfs_fh.c). @lock guards the list. */
struct mlfs_fresh {
	pthread_mutex_t lock;
	struct mlfs_fh *head;
};

/* The I/O workers (mlfs_io.c): a job answers its request itself. */
#define MLFS_IO_THREADS	    8 /* as many slow requests wait at once without queueing */
#define MLFS_IO_THREADS_MAX 32
#define MLFS_IO_QUEUE_MAX   4096

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

/*
 * The daemon: everything one mount serves, reached by every handler through
 * fuse_req_userdata(). Locks: fh->lock, then st->lock, then inodes.lock;
 * notes.lock, fresh.lock and io.lock are leaves.
 */
struct mlfs_daemon {
	struct mlfs_store *st;
	struct mlfs_inodes inodes;
	struct mlfs_notes notes;
	struct mlfs_polls polls;
	struct mlfs_fresh fresh;
	struct mlfs_io io;
	uid_t uid; /* owner of every file */
	gid_t gid;
};

/* ---------------------------------------------------------------- mlfs_io.c */

/* Starts @nthreads workers (at most MLFS_IO_THREADS_MAX): 0 or a negative
 * errno (none left running). Once, before the session loop. */
int mlfs_io_start(struct mlfs_io *io, int nthreads);
/* Queues @j: 0, -EAGAIN when MLFS_IO_QUEUE_MAX jobs wait, -ESHUTDOWN when
 * stopping; on success @j is the worker's (run or cancel frees it), on error
 * it is untouched (the caller replies). Any thread. */
int mlfs_io_submit(struct mlfs_io *io, struct mlfs_io_job *j);
/* Cancels the waiting jobs, waits for the running ones, joins. Once, after
 * the session loop. */
void mlfs_io_stop(struct mlfs_io *io);

/* ------------------------------------------------------------- mlfs_inode.c */

/* Adds a reference to @p and returns it; NULL-safe. Any thread, holding a
 * reference already. */
struct mlfs_pin *mlfs_pin_get(struct mlfs_pin *p);
/* Drops a reference to @p; the last puts its buffers and frees it.
 * NULL-safe; any thread, no lock needed. */
void mlfs_pin_put(struct mlfs_pin *p);
/* The hash of (@p, @gen) that keys the inode table (and numbers directory
 * entries). Pure; any thread. */
uint64_t mlfs_path_hash(const char *p, uint64_t gen);
/* Creates the inode table with its root: 0 or -ENOMEM (then release it
 * anyway). Once, at start-up. */
int mlfs_inodes_init(struct mlfs_daemon *d);
/* Frees the inode table, putting every inode's pin. Once, at exit, no
 * request in flight. */
void mlfs_inodes_release(struct mlfs_daemon *d);
/* Copies the path of @ino into @buf (@cap bytes, truncated), and when @pin
 * is given a reference to its pinned content into *@pin (NULL when it has
 * none; the caller puts it): 0, or -ESTALE when @ino is unknown. Takes
 * inodes.lock; any thread. */
int mlfs_ino_get(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap,
		 struct mlfs_pin **pin);
/* mlfs_ino_get without the pin. */
int mlfs_ino_path(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap);
/* The table's slot for (@path, @gen): the link that points at its inode,
 * or the NULL link where it would go. inodes.lock held; valid until it is
 * released. */
struct mlfs_inode **mlfs_ino_slot(struct mlfs_daemon *d, const char *path, uint64_t gen);
/* The inode of (@path, @gen), created if new, with one more lookup. A new
 * inode takes over the reference @pin; an existing one keeps its own and
 * @pin is put. Returns its number, or 0 on ENOMEM. Takes inodes.lock; any
 * thread. */
uint64_t mlfs_ino_lookup(struct mlfs_daemon *d, const char *path, uint64_t gen,
			 struct mlfs_pin *pin);
/* Drops @n lookups of @ino; the last removes the inode and puts its pin
 * (outside inodes.lock: the last put frees buffers). The root stays. Any
 * thread, no lock held. */
void mlfs_ino_forget(struct mlfs_daemon *d, fuse_ino_t ino, uint64_t n);

/* ------------------------------------------------------------ mlfs_notify.c */

/* The store's "content changed" callback (@arg is the daemon): queues
 * @prefix for the notifier ("" = the whole ranks/ and full/ trees). Any
 * thread; takes notes.lock only. */
void mlfs_notify_store_changed(void *arg, const char *prefix);
/* Starts the notifier thread on session @se: 0 or a negative errno. Once. */
int mlfs_notify_start(struct mlfs_daemon *d, struct fuse_session *se);
/* Stops the notifier; call once the session is unmounted (a notification
 * in flight then fails instead of waiting for a request nobody serves).
 * Returns false when the thread is still stuck in the kernel after a few
 * seconds (the session must then outlive it: it is not destroyed). */
bool mlfs_notify_stop(struct mlfs_daemon *d);
/* The store's "status.json changed" callback (@arg is the daemon): wakes
 * every poller. Any thread, any lock; takes polls.lock only. */
void mlfs_notify_status_changed(void *arg);
/* Wakes and frees the pollers left; once, after the session loop. */
void mlfs_notify_polls_end(struct mlfs_daemon *d);
/* FUSE poll: status.json is readable (POLLIN | POLLPRI) once the store's
 * status moved past what the handle's text says (a waiter then opens it
 * again); every other file always is. */
void mlfs_op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		  struct fuse_pollhandle *ph);
/* Queues the names whose content a commit of (@rank, @state, @tensor)
 * changed: the partition and its full tensor. Any thread; takes notes.lock
 * only. */
void mlfs_notify_part(struct mlfs_daemon *d, const struct mlfs_view *v, int rank, int state,
		      int tensor);

/* ----------------------------------------------------------- mlfs_resolve.c */

/* The names at the mount's root, ended by a NULL name. Constant. */
struct mlfs_root_file {
	const char *name;
	enum mlfs_kind kind;
};
extern const struct mlfs_root_file mlfs_root_files[];

/* Resolves @path (relative to the mount, no leading "/") against the store
 * and @v, the current view or NULL, into *@e: 0, -ENOENT, or the dataset's
 * error for a view whose step it cannot slice. st->lock held (job/ nodes
 * and *@e's pointers are only valid under it). */
int mlfs_resolve(struct mlfs_daemon *d, const char *path, struct mlfs_view *v, struct mlfs_ent *e);
/* The generation of @e's content and, for partitions and full tensors, a
 * new pin of that content (into *@pin, the caller's reference; NULL for the
 * rest): a partition's generation is the id of its current buffer, a full
 * tensor's a hash of its version and sources' ids (bit 62 set, 63 clear), a
 * dataset view's a hash of its samples (bit 63 set); 0 for the rest.
 * 0, -ENOMEM, or -EIO when a part of a full tensor is nowhere. st->lock
 * held. */
int mlfs_ent_pin(struct mlfs_daemon *d, const struct mlfs_view *v, const struct mlfs_ent *e,
		 uint64_t *gen, struct mlfs_pin **pin);
/* Resolves inode @ino into *@t: 0 with st->lock held and references to the
 * current view and the inode's pin in *@t (release with mlfs_target_done,
 * then mlfs_target_put); a path a reconfiguration removed still resolves
 * to its pinned content (t->vanished). -ESTALE for an unknown inode, else
 * mlfs_resolve's error for a path without content; on error nothing is
 * held. Any thread holding no lock. */
int mlfs_target_get(struct mlfs_daemon *d, fuse_ino_t ino, struct mlfs_target *t);
/* Releases st->lock taken by mlfs_target_get; the references stay the
 * caller's. */
void mlfs_target_done(struct mlfs_target *t);
/* Puts the references of *@t (after mlfs_target_done, no lock held). */
void mlfs_target_put(struct mlfs_target *t);
/* The path of @name in directory inode @parent, into @buf (@cap bytes):
 * 0, -ESTALE for an unknown @parent, -ENAMETOOLONG. Any thread. */
int mlfs_child_path(struct mlfs_daemon *d, fuse_ino_t parent, const char *name, char *buf,
		    size_t cap);

/* -------------------------------------------------------------- mlfs_attr.c */

/* The text of rank @rank's step file, newly allocated (the caller frees
 * it), or NULL on ENOMEM. st->lock held. */
char *mlfs_step_text(struct mlfs_daemon *d, int rank);
/* Fills *@stb (all but st_ino) for @e of view @v, whose content is @pin's
 * when given. st->lock held. */
void mlfs_fill_attr(struct mlfs_daemon *d, const struct mlfs_ent *e, const struct mlfs_view *v,
		    const struct mlfs_pin *pin, struct stat *stb);
/* Replies @req with the entry of @e at @path in @v (a new inode lookup) or
 * an error. Called with st->lock held; releases it before replying. */
void mlfs_reply_entry(fuse_req_t req, const char *path, const struct mlfs_ent *e,
		      const struct mlfs_view *v);

/*
 * The FUSE handlers (struct fuse_lowlevel_ops, mlfs_daemon.c), run by
 * libfuse's workers. Each replies to @req exactly once, itself or from an
 * I/O worker it queued the request to, with errors as the negative errno of
 * the failing step; none holds a lock across its reply.
 */
/* mlfs_attr.c: a name's entry, reference counts, attributes (setattr to
 * size 0 on a staging writer restarts its staging), xattrs, statfs. */
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

/* ---------------------------------------------------------------- mlfs_fh.c */

/* A new open file of @kind for daemon @d, with one reference (the open's),
 * or NULL on ENOMEM. Any thread. */
struct mlfs_fh *mlfs_fh_new(struct mlfs_daemon *d, enum mlfs_kind kind);
/* Adds a reference to @f and returns it; NULL-safe. Any thread holding a
 * reference already (the open's, until the release). */
struct mlfs_fh *mlfs_fh_get(struct mlfs_fh *f);
/* Drops a reference to @f; the last frees it and what it holds (view, pin,
 * buffers, texts, staging, the staged text's --max-memory). NULL-safe; any
 * thread, f->lock not held. */
void mlfs_fh_put(struct mlfs_fh *f);
/* The open file of @fi (set by the open); the reference stays the open's. */
struct mlfs_fh *mlfs_fh_of(const struct fuse_file_info *fi);
/* A reference to the content @f reads now (a writer's commit replaces it);
 * the caller puts it. Takes f->lock. */
struct xf_buf *mlfs_fh_buf(struct mlfs_fh *f);
/* Sets where @f's staging starts: from its current content (@base: bytes
 * not written keep it) or from nothing (opened with O_TRUNC). At the open,
 * before the file is shared. */
void mlfs_fh_stage_start(struct mlfs_fh *f, bool base);
/* Grows @f's staged text to hold @len bytes and a NUL, counting its
 * capacity in --max-memory (released at the last put): 0, -ENOSPC,
 * -ENOMEM (the text unchanged). f->lock held. */
int mlfs_fh_text_reserve(struct mlfs_fh *f, size_t len);
/* Allocates @f's staged header (MLFS_STAGE_HDR_MAX bytes) unless it has
 * one: from a base, a copy of the current header, the staged file being as
 * long as the current content. 0 or -ENOMEM. f->lock held. */
int mlfs_fh_stage_header(struct mlfs_fh *f);
/* Allocates @f's staged data (f->buf's size) unless it has some: from a
 * base, a copy of the current data, else zeros. 0, -ENOSPC, -ENOMEM.
 * f->lock held. */
int mlfs_fh_stage_data(struct mlfs_fh *f);
/* Empties @f's staging, as a truncation to 0 does: no text, header nor
 * data staged, and bytes not written are zeros, not the current content.
 * The text keeps its capacity. f->lock held. */
void mlfs_fh_stage_truncate(struct mlfs_fh *f);
/* After a commit of @f's staged data: the data becomes what @f reads
 * (f->buf), the staging is emptied, and later writes stage from the new
 * content. f->lock held. */
void mlfs_fh_stage_promote(struct mlfs_fh *f);
/*
 * Without atomic O_TRUNC (see mlfs_op_init) the kernel sends the truncation
 * of an open(O_TRUNC) as a setattr *without* the file handle, right after
 * the open, from the same thread. To apply it to that handle's staging (and
 * not to the content others read), writers are listed from their open to
 * their first write or truncation, by inode and thread.
 */
/* Lists @f, opened on @ino by thread @pid, as fresh. The list holds no
 * reference: whoever drops the open's (the release, a failed open reply)
 * takes @f off it first. Once per open, before its reply. */
void mlfs_fresh_add(struct mlfs_fh *f, fuse_ino_t ino, pid_t pid);
/* Removes @f, or when @f is NULL the handle of (@ino, @pid), from the
 * list; returns it with a new reference (the caller puts it), or NULL when
 * it is not listed. Any thread; takes fresh.lock only. */
struct mlfs_fh *mlfs_fresh_take(struct mlfs_daemon *d, struct mlfs_fh *f, fuse_ino_t ino,
				pid_t pid);

/* -------------------------------------------------------------- mlfs_open.c */

/* mlfs_open.c: opens (dataset views and full tensors with remote parts are
 * opened by an I/O worker), reads (no copy of partitions; spliced), and the
 * release, which applies mlfs_write_release. */
void mlfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		  struct fuse_file_info *fi);
void mlfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);

/* ------------------------------------------------------------- mlfs_write.c */

/* Writes @size bytes at @off of @f's control text (config.json,
 * schema.json, step, .mlfs-ctl), zero-filling a gap: 0, -EFBIG past the
 * file's limit (logged as refused), -ENOSPC past --max-memory, -ENOMEM.
 * f->lock held, or at the open before the file is shared. */
int mlfs_write_text(struct mlfs_fh *f, const char *buf, size_t size, off_t off);
/* Whether @f stages what it writes until a commit, so that a truncation to
 * 0 restarts its staging and it is listed fresh at its open: a writer of a
 * partition, config.json, schema.json or a step. Any thread. */
bool mlfs_write_staged(const struct mlfs_fh *f);
/* A truncation to 0 (open(O_TRUNC), ftruncate(fd, 0)) of @f: restarts its
 * staging when mlfs_write_staged(@f) and returns true; the inode keeps its
 * content (and size) until a commit. Takes f->lock. */
bool mlfs_write_truncate(struct mlfs_fh *f);
/*
 * The flush policy. Every close of a descriptor of the file (its
 * duplicates, a forked child's copies closed at its exec) sends a flush;
 * the last one is followed by the release. A flush by thread @pid commits
 * what was written to @f since the open or the last commit when it is
 * complete (a partition's header and every byte; a control text already
 * applied, or a step), or when the thread that wrote last closes: a
 * partition must then be whole (else -EINVAL, previous content kept), a
 * control text applies. Other flushes do nothing: a shell redirect opens
 * with O_TRUNC, duplicates the descriptor and closes the original before
 * anything is written; a child forked by the writer closes its copy at
 * exec, in the middle of the writer's writes. 0, or the error of this or
 * an earlier refused write (sticky; status.json says why). Takes f->lock;
 * applying a config.json or a step of a job of many nodes may wait on the
 * network (mlfs_op_flush queues those to an I/O worker).
 */
int mlfs_write_flush(struct mlfs_fh *f, pid_t pid);
/*
 * The release policy: what is still staged in @f at its release is
 * committed if it was written after the last commit (a partition that is
 * not whole is refused, previous content kept), or applied if a control
 * text never was; a partition truncated and never written is refused.
 * Refusals are in status.json and the log (the release itself cannot fail).
 * Takes f->lock; a FUSE worker.
 */
void mlfs_write_release(struct mlfs_fh *f);
/* mlfs_write.c: writes and flushes (those that may wait on the network or
 * a disk, to config.json, .mlfs-ctl or a published step, by an I/O
 * worker); fsync does nothing (nothing is durable). */
void mlfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi);
void mlfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void mlfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);

/* --------------------------------------------------------------- mlfs_dir.c */

/* mlfs_dir.c: directory listings (snapshotted at opendir), and the job/
 * namespace: mkdir, create, unlink, rmdir, rename there; EPERM elsewhere,
 * and for mknod, symlink and link everywhere. */
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

/* ------------------------------------------------------------ mlfs_daemon.c */

/* The session's init: the connection's limits and capabilities (no atomic
 * O_TRUNC, splice when the kernel can). libfuse calls it once. */
void mlfs_op_init(void *userdata, struct fuse_conn_info *conn);

#endif
