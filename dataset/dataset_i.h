/*
 * dataset_i.h - internals shared by the files of dataset/ (dataset.h is
 * its API): their types and the functions one file gives another. The
 * files, one job each:
 *   mlfs_data.c      views: the records of one step for one DP rank,
 *                    assembled, cached and prefetched; a dataset's life
 *   mlfs_dataindex.c the index and offset tables; view file names, sizes
 *   mlfs_source.c    a source's life, options and counters; the object
 *                    table; URI kinds; whole-object fetches (DESIGN block)
 *   mlfs_srccache.c  the block cache: blocks, their LRU list and bound
 *   mlfs_srcreadv.c  the readv planner: ranges -> blocks -> requests, run
 *                    on parallel threads; HTTP ranges through net/
 *   mlfs_srcdirect.c file_direct reads: spans of adjacent ranges copied
 *                    from mappings or read with preadv, past the cache
 *   mlfs_srcfile.c   file:// objects: opened without blocking, fds and
 *                    mappings pinned and evicted, preadv loops
 *   mlfs_uri.c       joining a relative URI to its base (mlfs_uri_join)
 *
 * Locks: s->lock (struct mlfs_src) guards the object table, the objects'
 * size, fd and mapping fields, and the cache; it is never held across I/O,
 * a sleep or a copy of block bytes. Functions below say when they expect
 * it held. Copies from mappings are guarded against SIGBUS by
 * common/mlfs_mapcopy.c (its own leaf lock). A dataset's ds->lock guards
 * its view cache and queue (mlfs_data.c); the sizes cache has a leaf lock.
 */
#ifndef MLFS_DATASET_I_H
#define MLFS_DATASET_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "common/common.h"
#include "dataset/dataset.h"

/* Threads one readv may use, the caller's included. */
#define SRC_MAX_PARALLEL 64
/* Open file descriptors kept beyond those in use. */
#define SRC_MAX_FDS 128
/* Ranges (or blocks) of one preadv: at most this many. */
#define SRC_SPAN_IOV 256

struct net_http;

enum obj_kind { OBJ_FILE, OBJ_HTTP };

/* One URI ever named: lives until mlfs_src_free (mlfs_source.c). */
struct src_obj {
	struct src_obj *next; /* hash chain */
	char *uri;
	uint64_t hash;
	enum obj_kind kind;
	int64_t size;	    /* -1 until known; s->lock */
	int fd;		    /* file: -1 while closed; s->lock */
	const uint8_t *map; /* file: read-only mapping while fd is open, or NULL; s->lock */
	int64_t maplen;	    /* its length (the size at open) */
	bool reopen;	    /* the file shrank under map: close it when idle; s->lock */
	int fd_users;	    /* readvs using fd (and map); s->lock */
	uint64_t fd_tick;   /* last pin, to close the idlest fd first; s->lock */
};

/* A cached block (mlfs_srccache.c): bytes [idx * B, idx * B + len) of obj. */
struct src_blk {
	struct src_blk *hnext;	     /* hash chain */
	struct src_blk *prev, *next; /* LRU list, most recent after s->lru */
	struct src_obj *obj;
	int64_t idx;
	int64_t len; /* bytes held (the capacity while being filled) */
	atomic_int refs;
	uint8_t data[];
};

struct mlfs_src {
	struct mlfs_src_opts o; /* defaults applied (net applies those of the HTTP fields) */
	pthread_mutex_t lock;
	struct src_obj **objs; /* hash table by URI */
	size_t nobj_buckets, nobjs;
	int nfds;
	uint64_t tick;
	struct src_blk **blks; /* hash table by (obj, idx) */
	size_t nblk_buckets;
	struct src_blk lru; /* sentinel of the LRU list */
	int64_t cached_bytes, cached_blocks;
	struct net_http *http; /* thread-safe on its own */
	_Atomic int64_t hits, misses, requests, failures, bytes_fetched, direct_reads; /* files */
};

/* The ranges of one object in a readv: ord[lo, hi). */
struct src_grp {
	struct src_obj *obj;
	size_t lo, hi;
	int fd;		    /* file: pinned fd, else -1 */
	const uint8_t *map; /* file: pinned mapping, or NULL */
	bool direct;	    /* read with preadv, not through the cache (file_direct) */
};

struct src_req;

/* One readv's plan (mlfs_srcreadv.c), read by the direct reads too. */
struct src_readv {
	struct mlfs_src *s;
	const struct mlfs_range *r;
	struct src_obj **robj; /* per range */
	size_t *ord;	       /* ranges with len > 0, by (obj, off) */
	int64_t *pmax;	       /* pmax[k]: max end of the ranges ord[lo..k] of k's group */
	size_t nord;
	struct src_grp *grps;
	size_t ngrps;
	struct src_req *reqs;
	size_t nreqs;
	atomic_size_t next; /* next request to run */
	atomic_int stop;    /* a request failed: start no more */
	int64_t start_ns;   /* HTTP requests share a deadline from then (CLOCK_MONOTONIC) */
};

static inline void src_stat_add(_Atomic int64_t *c, int64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static inline int64_t src_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ------------------------------------------------------ mlfs_source.c */

/* Logs the failure of a readv or fetch (@rc, message @why) at warning
 * level, unless it refused its arguments (-EINVAL). */
void mlfs_src_log_failure(int rc, const char *why);

/* The object of @uri, created on first use; lives until mlfs_src_free.
 * -EINVAL (bad URI) or -ENOMEM, with the reason in @err. Lock not held. */
int mlfs_srcobj_get(struct mlfs_src *s, const char *uri, struct src_obj **out,
		    struct ptc_error *err);

/* Has file object @o closed and opened again once no readv uses it, so the
 * next readv sees its size anew (it shrank, or may have grown). Lock not held. */
void mlfs_srcobj_reopen(struct mlfs_src *s, struct src_obj *o);

/* @o's size, -1 while unknown. Lock not held. */
int64_t mlfs_srcobj_size(struct mlfs_src *s, struct src_obj *o);

/* Records @size learned from a reply; -EIO when it contradicts an earlier
 * one. Lock not held. */
int mlfs_srcobj_set_size(struct mlfs_src *s, struct src_obj *o, int64_t size,
			 struct ptc_error *err);

/* ---------------------------------------------------- mlfs_srccache.c */

/* The empty cache of @s: 0 or -ENOMEM. */
int mlfs_srccache_init(struct mlfs_src *s);

/* Frees every cached block; no other call may run on @s. */
void mlfs_srccache_release(struct mlfs_src *s);

/* A new block of @len bytes (to be filled) with one reference, or NULL. */
struct src_blk *mlfs_srcblk_new(struct src_obj *o, int64_t idx, int64_t len);

/* Drops a reference to @b, freeing it on the last. */
void mlfs_srcblk_put(struct src_blk *b);

/* Block @idx of @o with a reference for the caller (most recently used
 * now), or NULL when not cached. Lock held. */
struct src_blk *mlfs_srccache_pin(struct mlfs_src *s, struct src_obj *o, int64_t idx);

/* Hands complete block @b (one reference, the caller's) to the cache,
 * evicting the least recently used blocks past the bound. Lock not held. */
void mlfs_srccache_insert(struct mlfs_src *s, struct src_blk *b);

/* ----------------------------------------------------- mlfs_srcfile.c */

/* Opens file object @o if needed and pins its fd (*@fd) and mapping (*@map,
 * NULL when there is none or the file shrank under it) until
 * mlfs_srcfile_unpin. -EIO naming the URI when it cannot be opened or is
 * not a regular file. Lock not held. */
int mlfs_srcfile_pin(struct mlfs_src *s, struct src_obj *o, int *fd, const uint8_t **map,
		     struct ptc_error *err);

/* Undoes one mlfs_srcfile_pin; the last unpin of a file that shrank closes
 * it. Lock not held. */
void mlfs_srcfile_unpin(struct mlfs_src *s, struct src_obj *o);

/* Closes @o's file if open; only from mlfs_src_free. */
void mlfs_srcfile_close(struct mlfs_src *s, struct src_obj *o);

/* mlfs_src_fetch of a file:// @uri (checked). */
int mlfs_srcfile_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data,
		       size_t *len, struct ptc_error *err);

/* Fills the @nv iovecs at @v (@len bytes in all) from @fd (the file of
 * @uri) at @pos. With RWF_NOWAIT in @flags, -EAGAIN unless the page cache
 * held all of it (the caller then reads it again, blocking). -EIO naming
 * @uri on a failure or a file shorter than asked. Modifies @v. */
int mlfs_srcfile_preadv(int fd, const char *uri, struct iovec *v, int nv, int64_t pos, int64_t len,
			int flags, struct ptc_error *err);

/* Reads the @nb adjacent blocks at @blks from byte @a of @o's pinned @fd. */
int mlfs_srcfile_read_blocks(struct mlfs_src *s, const struct src_obj *o, int fd,
			     struct src_blk **blks, int nb, int64_t a, struct ptc_error *err);

/* --------------------------------------------------- mlfs_srcdirect.c */

/* Reads the ranges of @rv's direct groups (pinned files, file_direct)
 * straight into their dsts: 0, or -EIO / -ENOMEM with the reason in @err. */
int mlfs_srcdirect_read(struct src_readv *rv, struct ptc_error *err);

/* ------------------------------------------------ mlfs_data.c's dataset */

#define MAX_INDEX_BYTES ((int64_t)64 << 20)
#define QUEUE_CAP	256
#define POOL_SLOTS	1024
#define SIZE_SLOTS	256

struct slice {
	int64_t first, count;
};

/* Byte sizes of variable-record views (a sum over their records, asked at
 * every lookup and open), direct-mapped by slice. lock is a leaf. */
struct sizes {
	pthread_mutex_t lock;
	struct {
		int64_t first, count, bytes; /* count 0: empty */
	} e[SIZE_SLOTS];
};

struct mlfs_dataset {
	atomic_int refs;
	char *index_uri;
	uint64_t seed;
	bool shuffle;
	int64_t epochs; /* 0: no limit */
	struct ptc_index *ix;
	char **uris;	/* resolved shard URIs */
	int64_t **offs; /* variable records: count + 1 offsets per shard */
	struct mlfs_src *src;
	struct xf_mem *mem;
	int prefetch;

	pthread_mutex_t lock;
	pthread_cond_t ready;		/* a view left state 0 */
	pthread_cond_t queued;		/* the queue got work or stop */
	struct mlfs_dview *head, *tail; /* most recently used first */
	int nviews, maxviews;
	struct slice queue[QUEUE_CAP];
	int qhead, qlen;
	bool stop;
	pthread_t thread;
	bool thread_started;
	int64_t assembled, view_hits, failures;
	char error[512];
	/* Buffers of freed views, pages already mapped: a new view reuses one
	 * instead of faulting in fresh pages (most of the cost of assembly). */
	pthread_mutex_t pool_lock; /* a leaf: taken with or without ds->lock */
	struct xf_buf *pool[POOL_SLOTS];
	int npool;
	int64_t pool_bytes;
	atomic_int pool_max;  /* as many as views may be cached, POOL_SLOTS at most */
	int64_t cached_bytes; /* of the ready views in the cache; ds->lock */
	struct sizes *sizes;
};

/* The record of stream sample @g: its record id *@id, its shard
 * (returned) and its index *@local there. */
int mlfs_data_sample_record(const struct mlfs_dataset *ds, int64_t g, int64_t *id, int64_t *local);
/* The length and byte offset of record @local of shard @shard. */
int64_t mlfs_data_record_len(const struct mlfs_dataset *ds, int shard, int64_t local);
int64_t mlfs_data_record_off(const struct mlfs_dataset *ds, int shard, int64_t local);

/* --------------------------------------------------- mlfs_dataindex.c */

/* Reads and checks @ds's index (ds->index_uri) and, for variable records,
 * every shard's offsets: 0, or a negative errno with @err. At open. */
int mlfs_data_load_index(struct mlfs_dataset *ds, struct ptc_error *err);

#endif
