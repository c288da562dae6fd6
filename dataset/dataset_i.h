/*
 * mlfs_source_i.h - internals shared by the files of the dataset source
 * (mlfs_source.h is its API): its types and the functions one file gives
 * another. The files, one job each:
 *   mlfs_source.c    a source's life, options and counters; the object
 *                    table; URI kinds; whole-object fetches (DESIGN block)
 *   mlfs_srccache.c  the block cache: blocks, their LRU list and bound
 *   mlfs_srcreadv.c  the readv planner: ranges -> blocks -> requests, run
 *                    on parallel threads; HTTP ranges through net/
 *   mlfs_srcdirect.c file_direct reads: spans of adjacent ranges copied
 *                    from mappings or read with preadv, past the cache
 *   mlfs_srcfile.c   file:// objects: opened without blocking, fds and
 *                    mappings pinned and evicted, preadv loops
 *   mlfs_mapcopy.c    copies from file mappings, SIGBUS turned into EIO
 *   mlfs_uri.c       joining a relative URI to its base (mlfs_uri_join)
 *
 * Locks: s->lock (struct mlfs_src) guards the object table, the objects'
 * size, fd and mapping fields, and the cache; it is never held across I/O,
 * a sleep or a copy of block bytes. Functions below say when they expect
 * it held. mlfs_mapcopy.c has its own leaf lock (installing the handler).
 */
#ifndef MLFS_MLFS_SOURCE_I_H
#define MLFS_MLFS_SOURCE_I_H

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

/* Writes the message to @why (when @whylen > 0); returns @rc. */
__attribute__((format(printf, 4, 5))) int mlfs_src_errf(char *why, size_t whylen, int rc,
							const char *fmt, ...);

/* Logs the failure of a readv or fetch (@rc, message @why) at warning
 * level, unless it refused its arguments (-EINVAL). */
void mlfs_src_log_failure(int rc, const char *why);

/* The object of @uri, created on first use; lives until mlfs_src_free.
 * -EINVAL (bad URI) or -ENOMEM, with the reason in @why. Lock not held. */
int mlfs_srcobj_get(struct mlfs_src *s, const char *uri, struct src_obj **out, char *why,
		    size_t whylen);

/* Has file object @o closed and opened again once no readv uses it, so the
 * next readv sees its size anew (it shrank, or may have grown). Lock not held. */
void mlfs_srcobj_reopen(struct mlfs_src *s, struct src_obj *o);

/* @o's size, -1 while unknown. Lock not held. */
int64_t mlfs_srcobj_size(struct mlfs_src *s, struct src_obj *o);

/* Records @size learned from a reply; -EIO when it contradicts an earlier
 * one. Lock not held. */
int mlfs_srcobj_set_size(struct mlfs_src *s, struct src_obj *o, int64_t size, char *why,
			 size_t whylen);

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
int mlfs_srcfile_pin(struct mlfs_src *s, struct src_obj *o, int *fd, const uint8_t **map, char *why,
		     size_t whylen);

/* Undoes one mlfs_srcfile_pin; the last unpin of a file that shrank closes
 * it. Lock not held. */
void mlfs_srcfile_unpin(struct mlfs_src *s, struct src_obj *o);

/* Closes @o's file if open; only from mlfs_src_free. */
void mlfs_srcfile_close(struct mlfs_src *s, struct src_obj *o);

/* mlfs_src_fetch of a file:// @uri (checked). */
int mlfs_srcfile_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data,
		       size_t *len, char *why, size_t whylen);

/* Fills the @nv iovecs at @v (@len bytes in all) from @fd (the file of
 * @uri) at @pos. With RWF_NOWAIT in @flags, -EAGAIN unless the page cache
 * held all of it (the caller then reads it again, blocking). -EIO naming
 * @uri on a failure or a file shorter than asked. Modifies @v. */
int mlfs_srcfile_preadv(int fd, const char *uri, struct iovec *v, int nv, int64_t pos, int64_t len,
			int flags, char *why, size_t whylen);

/* Reads the @nb adjacent blocks at @blks from byte @a of @o's pinned @fd. */
int mlfs_srcfile_read_blocks(struct mlfs_src *s, const struct src_obj *o, int fd,
			     struct src_blk **blks, int nb, int64_t a, char *why, size_t whylen);

/* --------------------------------------------------- mlfs_srcdirect.c */

/* Reads the ranges of @rv's direct groups (pinned files, file_direct)
 * straight into their dsts: 0, or -EIO / -ENOMEM with the reason in @why. */
int mlfs_srcdirect_read(struct src_readv *rv, char *why, size_t whylen);

#endif
