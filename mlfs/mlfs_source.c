/*
 * mlfs_source.c - dataset shard sources behind a byte-bounded block cache.
 *
 * DESIGN
 * Objects: one struct src_obj per URI ever named (a hash table by URI, kept
 * until mlfs_src_free) holds its kind, its size once known (file: fstat at
 * open; HTTP: the total of a Content-Range, or the length of a 200) and, for
 * files, an fd shared by all readers. fd_users counts the readvs using the fd;
 * past SRC_MAX_FDS open fds, the least recently used idle one is closed.
 *
 * Cache: blocks keyed by (object, block index) in a hash table and an LRU
 * list. Invariant: cached_bytes, the sum of the cached blocks' lengths, never
 * exceeds cache_bytes. Blocks are reference-counted: the cache holds one
 * reference and a readv copying from a block another, so an eviction never
 * frees bytes being copied. A block enters the cache only complete and
 * verified; the bytes of a failed attempt reach neither the cache nor a dst.
 *
 * readv: (1) resolve the objects, open the files, check the ranges against
 * known sizes; (2) list the distinct blocks needed, sorted by (object,
 * index); (3) pin the cached ones under the lock (hits) and copy them out;
 * (4) group runs of missing blocks into requests and run them on up to
 * `parallel` threads, the caller being one. A finished request copies its
 * blocks to the dsts, then hands them to the cache: a readv larger than the
 * cache holds at most parallel * max_request_bytes of its own. (5) Check the
 * ranges against the sizes learned meanwhile.
 *
 * file_direct: after (1), the ranges of file objects are cut into spans of
 * adjacent ranges. A pinned file is also mapped (read-only, shared), and
 * its spans are copied from the mapping on the caller's thread: from the
 * page cache that is a memcpy, 8x cheaper than a preadv per record. After
 * a copy that took long and whose next span is not in the page cache (a
 * read with RWF_NOWAIT: the slow copy waited for the disk, not for first
 * mappings of its pages), and for files
 * that could not be mapped, each span is one preadv into its dsts, tried
 * with RWF_NOWAIT (the page cache) and otherwise on up to `parallel`
 * threads, so a cold disk sees many requests at once (measured: better
 * than MADV_WILLNEED and copies). Such objects never enter (2)-(4): the
 * page cache is their cache. A file
 * that shrank under its mapping loses it before the copies (fstat once a
 * readv: a mapping reads the rest of a cut page as zeros), and one that
 * shrinks during them raises SIGBUS in the copy; our handler
 * (reinstalled if someone replaced it) turns it into EIO for that copy
 * (sigsetjmp guard, per thread) and the object is reopened when no readv
 * uses it any more, so the next readv sees its new size.
 *
 * HTTP: net/ does it (one client a source: its connections, retries,
 * timeout and deadline; see net_http.c). A request of step (4) is one
 * ranged GET into its blocks; every request of one readv shares the
 * readv's deadline (the call's start_ns), and a failed request stops the
 * others' retries (the call's stop flag).
 *
 * Files a user names (an index, offsets, shards) are opened with
 * O_NONBLOCK and refused unless fstat says regular: opening a FIFO for
 * reading would otherwise wait for a writer forever, uninterruptibly.
 *
 * Threads: s->lock guards the object table, the objects' size and fd fields
 * and the cache. It is never held across I/O, a sleep or a copy of block
 * bytes; there is no other lock (the HTTP client has its own). Counters are
 * atomics.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "mlfs/mlfs_source.h"
#include "net/net.h"

#define SRC_DEF_CACHE	 ((int64_t)1 << 30)
#define SRC_DEF_BLOCK	 ((int64_t)1 << 20)
#define SRC_DEF_REQUEST	 ((int64_t)16 << 20)
#define SRC_DEF_PARALLEL 8
#define SRC_MAX_PARALLEL 64
/* Open file descriptors kept beyond those in use. */
#define SRC_MAX_FDS 128
/* Idle HTTP connections kept. */
#define SRC_POOL 64
/* Distinct blocks one readv may name (16 TiB in 1 MiB blocks). */
#define SRC_MAX_NEED ((size_t)1 << 24)
/* Initial hash table sizes (powers of two). */
#define SRC_OBJ_BUCKETS 256
#define SRC_BLK_BUCKETS 1024

enum obj_kind { OBJ_FILE, OBJ_HTTP };

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

/* ---------------------------------------------------------------- helpers */

__attribute__((format(printf, 4, 5))) static int errf(char *why, size_t whylen, int rc,
						      const char *fmt, ...)
{
	va_list ap;

	if (why && whylen) {
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static void stat_add(_Atomic int64_t *c, int64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
	return h;
}

static uint64_t hash_blk(const struct src_obj *o, int64_t idx)
{
	uint64_t h = o->hash ^ ((uint64_t)idx * 0x9e3779b97f4a7c15ULL);

	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 32);
}

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static bool has_prefix(const char *s, const char *p)
{
	return strncasecmp(s, p, strlen(p)) == 0;
}

/* The kind of @uri, or -EINVAL with the reason in @why. */
static int uri_kind(const char *uri, enum obj_kind *kind, char *why, size_t whylen)
{
	int rc;

	if (!uri)
		return errf(why, whylen, -EINVAL, "no URI");
	if (strnlen(uri, MLFS_SRC_MAX_URI + 1) > MLFS_SRC_MAX_URI)
		return errf(why, whylen, -EINVAL, "%.64s...: URI longer than %d bytes", uri,
			    MLFS_SRC_MAX_URI);
	if (has_prefix(uri, "file://")) {
		if (uri[7] != '/' || !uri[8])
			return errf(why, whylen, -EINVAL,
				    "%s: not a local absolute file URI (file:///path)", uri);
		*kind = OBJ_FILE;
		return 0;
	}
	if (!has_prefix(uri, "http://") && !has_prefix(uri, "https://"))
		return errf(why, whylen, -EINVAL,
			    "%s: unsupported URI (file:///path, http:// or https:// expected)",
			    uri);
	if ((rc = net_url_check(uri, why, whylen)))
		return rc;
	*kind = OBJ_HTTP;
	return 0;
}

/* ------------------------------------------------------------ object table */

static int obj_table_grow(struct mlfs_src *s)
{
	size_t nb = s->nobj_buckets * 2;
	struct src_obj **t = calloc(nb, sizeof(*t));

	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < s->nobj_buckets; i++) {
		for (struct src_obj *o = s->objs[i], *next; o; o = next) {
			next = o->next;
			o->next = t[o->hash & (nb - 1)];
			t[o->hash & (nb - 1)] = o;
		}
	}
	free(s->objs);
	s->objs = t;
	s->nobj_buckets = nb;
	return 0;
}

/* The object of @uri, created on first use; lives until mlfs_src_free. */
static int obj_get(struct mlfs_src *s, const char *uri, struct src_obj **out, char *why,
		   size_t whylen)
{
	enum obj_kind kind;
	uint64_t h;
	struct src_obj *o;
	int rc = uri_kind(uri, &kind, why, whylen);

	if (rc)
		return rc;
	h = hash_str(uri);
	pthread_mutex_lock(&s->lock);
	for (o = s->objs[h & (s->nobj_buckets - 1)]; o; o = o->next)
		if (o->hash == h && !strcmp(o->uri, uri))
			goto found;
	if (s->nobjs >= s->nobj_buckets)
		obj_table_grow(s); /* on ENOMEM chains just grow longer */
	o = calloc(1, sizeof(*o));
	if (!o || !(o->uri = strdup(uri))) {
		free(o);
		pthread_mutex_unlock(&s->lock);
		return errf(why, whylen, -ENOMEM, "%s: out of memory", uri);
	}
	o->hash = h;
	o->kind = kind;
	o->size = -1;
	o->fd = -1;
	o->next = s->objs[h & (s->nobj_buckets - 1)];
	s->objs[h & (s->nobj_buckets - 1)] = o;
	s->nobjs++;
found:
	pthread_mutex_unlock(&s->lock);
	*out = o;
	return 0;
}

/* Has file object @o closed and opened again once no readv uses it, so the
 * next readv sees its size anew (it shrank, or may have grown). */
static void obj_reopen(struct mlfs_src *s, struct src_obj *o)
{
	pthread_mutex_lock(&s->lock);
	o->reopen = true;
	pthread_mutex_unlock(&s->lock);
}

static int64_t obj_size(struct mlfs_src *s, struct src_obj *o)
{
	pthread_mutex_lock(&s->lock);
	int64_t size = o->size;
	pthread_mutex_unlock(&s->lock);
	return size;
}

/* Records @size learned from a reply; -EIO when it contradicts an earlier one. */
static int obj_set_size(struct mlfs_src *s, struct src_obj *o, int64_t size, char *why,
			size_t whylen)
{
	int64_t old;

	pthread_mutex_lock(&s->lock);
	old = o->size;
	if (old < 0)
		o->size = size;
	pthread_mutex_unlock(&s->lock);
	if (old >= 0 && old != size)
		return errf(why, whylen, -EIO,
			    "%s: size changed from %" PRId64 " to %" PRId64 " bytes", o->uri, old,
			    size);
	return 0;
}

/* An open file detached from its object, to be closed without the lock. */
struct opened {
	int fd;
	const uint8_t *map;
	int64_t maplen;
};

static void opened_close(struct opened *c)
{
	if (c->map)
		munmap((void *)c->map, (size_t)c->maplen);
	if (c->fd >= 0)
		close(c->fd);
}

/* Detaches @o's open file into @c. Lock held. */
static void obj_detach(struct mlfs_src *s, struct src_obj *o, struct opened *c)
{
	*c = (struct opened){o->fd, o->map, o->maplen};
	o->fd = -1;
	o->map = NULL;
	o->reopen = false;
	s->nfds--;
}

/* Detaches the least recently pinned idle file, if any, into @c. Lock held. */
static void fd_evict(struct mlfs_src *s, struct opened *c)
{
	struct src_obj *idlest = NULL;

	for (size_t i = 0; i < s->nobj_buckets; i++)
		for (struct src_obj *o = s->objs[i]; o; o = o->next)
			if (o->fd >= 0 && !o->fd_users && (!idlest || o->fd_tick < idlest->fd_tick))
				idlest = o;
	if (idlest)
		obj_detach(s, idlest, c);
}

/*
 * Opens @path for reading without waiting on it: -EIO naming @uri unless it
 * is a regular file (a FIFO would block the open until a writer came, a
 * device could block its reads). On success the fd (blocking again) and
 * *@st.
 */
static int file_open(const char *uri, const char *path, struct stat *st, char *why, size_t whylen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), flags, e;

	if (fd < 0)
		return errf(why, whylen, -EIO, "%s: %m", uri);
	if (fstat(fd, st) || (flags = fcntl(fd, F_GETFL)) < 0)
		goto err_close;
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return errf(why, whylen, -EIO, "%s: not a regular file", uri);
	}
	if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK))
		goto err_close;
	return fd;

err_close:
	e = errno;
	close(fd);
	errno = e;
	return errf(why, whylen, -EIO, "%s: %m", uri);
}

/* Opens file object @o if needed and pins its fd (*@fd) and mapping (*@map,
 * NULL when there is none or the file shrank under it) until file_unpin. */
static int file_pin(struct mlfs_src *s, struct src_obj *o, int *fd, const uint8_t **map, char *why,
		    size_t whylen)
{
	struct stat st;
	int nfd;
	struct opened extra = {-1, NULL, 0}, idle = {-1, NULL, 0};
	const uint8_t *nmap = NULL;

	pthread_mutex_lock(&s->lock);
	if (o->fd >= 0) {
		o->fd_users++;
		o->fd_tick = ++s->tick;
		*fd = o->fd;
		*map = o->reopen ? NULL : o->map;
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	pthread_mutex_unlock(&s->lock);

	if ((nfd = file_open(o->uri, o->uri + 7, &st, why, whylen)) < 0)
		return nfd;
	if (s->o.file_direct && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, nfd, 0);
		nmap = m == MAP_FAILED ? NULL : m; /* no mapping: preadv only */
	}
	pthread_mutex_lock(&s->lock);
	if (o->fd >= 0) {
		extra = (struct opened){nfd, nmap, st.st_size}; /* another thread's meanwhile */
	} else {
		o->fd = nfd;
		o->map = nmap;
		o->maplen = st.st_size;
		o->size = st.st_size;
		s->nfds++;
	}
	o->fd_users++;
	o->fd_tick = ++s->tick;
	*fd = o->fd;
	*map = o->reopen ? NULL : o->map;
	if (s->nfds > SRC_MAX_FDS)
		fd_evict(s, &idle);
	pthread_mutex_unlock(&s->lock);
	opened_close(&extra);
	opened_close(&idle);
	return 0;
}

static void file_unpin(struct mlfs_src *s, struct src_obj *o)
{
	struct opened c = {-1, NULL, 0};

	pthread_mutex_lock(&s->lock);
	assert(o->fd_users > 0);
	if (!--o->fd_users && o->reopen)
		obj_detach(s, o, &c);
	pthread_mutex_unlock(&s->lock);
	opened_close(&c);
}

/* ------------------------------------------------------------------ cache */

static struct src_blk *blk_new(struct src_obj *o, int64_t idx, int64_t len)
{
	struct src_blk *b = malloc(sizeof(*b) + (size_t)len);

	if (!b)
		return NULL;
	b->hnext = b->prev = b->next = NULL;
	b->obj = o;
	b->idx = idx;
	b->len = len;
	atomic_init(&b->refs, 1);
	return b;
}

/* Drops a reference; true when it was the last (the caller frees). */
static bool blk_unref(struct src_blk *b)
{
	return atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1;
}

/* Lock held. */
static struct src_blk *cache_find(struct mlfs_src *s, struct src_obj *o, int64_t idx)
{
	struct src_blk *b = s->blks[hash_blk(o, idx) & (s->nblk_buckets - 1)];

	while (b && (b->obj != o || b->idx != idx))
		b = b->hnext;
	return b;
}

static void lru_unlink(struct src_blk *b)
{
	b->prev->next = b->next;
	b->next->prev = b->prev;
}

static void lru_push(struct mlfs_src *s, struct src_blk *b)
{
	b->prev = &s->lru;
	b->next = s->lru.next;
	s->lru.next->prev = b;
	s->lru.next = b;
}

/* Lock held. */
static void cache_table_grow(struct mlfs_src *s)
{
	size_t nb = s->nblk_buckets * 2;
	struct src_blk **t = calloc(nb, sizeof(*t));

	if (!t)
		return; /* chains just grow longer */
	for (size_t i = 0; i < s->nblk_buckets; i++) {
		for (struct src_blk *b = s->blks[i], *next; b; b = next) {
			next = b->hnext;
			size_t k = hash_blk(b->obj, b->idx) & (nb - 1);
			b->hnext = t[k];
			t[k] = b;
		}
	}
	free(s->blks);
	s->blks = t;
	s->nblk_buckets = nb;
}

/* Lock held. Removes @b from the table and list; returns it when unreferenced. */
static struct src_blk *cache_remove(struct mlfs_src *s, struct src_blk *b)
{
	struct src_blk **pp = &s->blks[hash_blk(b->obj, b->idx) & (s->nblk_buckets - 1)];

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	lru_unlink(b);
	s->cached_bytes -= b->len;
	s->cached_blocks--;
	return blk_unref(b) ? b : NULL;
}

/* Hands complete block @b (one reference, ours) to the cache, evicting LRU blocks. */
static void cache_insert(struct mlfs_src *s, struct src_blk *b)
{
	struct src_blk *dead = NULL, *victim;

	pthread_mutex_lock(&s->lock);
	if (b->len > s->o.cache_bytes || cache_find(s, b->obj, b->idx)) {
		pthread_mutex_unlock(&s->lock);
		free(b); /* too big, or a concurrent readv cached it first */
		return;
	}
	if ((size_t)s->cached_blocks >= s->nblk_buckets * 2)
		cache_table_grow(s);
	size_t k = hash_blk(b->obj, b->idx) & (s->nblk_buckets - 1);
	b->hnext = s->blks[k];
	s->blks[k] = b;
	lru_push(s, b);
	s->cached_bytes += b->len;
	s->cached_blocks++;
	while (s->cached_bytes > s->o.cache_bytes) {
		victim = s->lru.prev;
		assert(victim != &s->lru && victim != b);
		if ((victim = cache_remove(s, victim))) {
			victim->hnext = dead;
			dead = victim;
		}
	}
	pthread_mutex_unlock(&s->lock);
	while (dead) {
		victim = dead;
		dead = dead->hnext;
		free(victim);
	}
}

/* ---------------------------------------------------------------- options */

struct mlfs_src *mlfs_src_new(const struct mlfs_src_opts *opts)
{
	struct mlfs_src_opts o = opts ? *opts : (struct mlfs_src_opts){0};
	struct net_http_opts ho = {.retries = o.retries,
				   .timeout_ms = o.timeout_ms,
				   .deadline_ms = o.deadline_ms,
				   .backoff_ms = o.backoff_ms,
				   .max_backoff_ms = o.max_backoff_ms,
				   .max_idle = SRC_POOL};
	struct mlfs_src *s;

	if (o.cache_bytes <= 0)
		o.cache_bytes = SRC_DEF_CACHE;
	if (o.block_bytes <= 0)
		o.block_bytes = SRC_DEF_BLOCK;
	if (o.block_bytes > ((int64_t)1 << 40))
		o.block_bytes = (int64_t)1 << 40;
	if (o.max_request_bytes <= 0)
		o.max_request_bytes = SRC_DEF_REQUEST;
	if (o.max_request_bytes < o.block_bytes)
		o.max_request_bytes = o.block_bytes;
	if (o.parallel <= 0)
		o.parallel = SRC_DEF_PARALLEL;
	if (o.parallel > SRC_MAX_PARALLEL)
		o.parallel = SRC_MAX_PARALLEL;

	if (!(s = calloc(1, sizeof(*s))))
		return NULL;
	s->o = o;
	s->nobj_buckets = SRC_OBJ_BUCKETS;
	s->nblk_buckets = SRC_BLK_BUCKETS;
	s->objs = calloc(s->nobj_buckets, sizeof(*s->objs));
	s->blks = calloc(s->nblk_buckets, sizeof(*s->blks));
	if (!s->objs || !s->blks || net_http_new(&ho, &s->http, NULL, 0)) {
		free(s->objs);
		free(s->blks);
		free(s);
		return NULL;
	}
	s->lru.next = s->lru.prev = &s->lru;
	pthread_mutex_init(&s->lock, NULL);
	return s;
}

void mlfs_src_free(struct mlfs_src *s)
{
	if (!s)
		return;
	while (s->lru.next != &s->lru) {
		struct src_blk *b = s->lru.next;
		lru_unlink(b);
		free(b);
	}
	for (size_t i = 0; i < s->nobj_buckets; i++) {
		for (struct src_obj *o = s->objs[i], *next; o; o = next) {
			next = o->next;
			if (o->fd >= 0) {
				struct opened c;
				obj_detach(s, o, &c);
				opened_close(&c);
			}
			free(o->uri);
			free(o);
		}
	}
	net_http_free(s->http);
	free(s->objs);
	free(s->blks);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void mlfs_src_stats(struct mlfs_src *s, struct mlfs_src_stats *out)
{
	struct net_http_stats h;

	net_http_stats(s->http, &h);
	out->hits = atomic_load(&s->hits);
	out->misses = atomic_load(&s->misses);
	out->requests = atomic_load(&s->requests) + h.requests;
	out->retries = h.retries;
	out->failures = atomic_load(&s->failures) + h.failures;
	out->bytes_fetched = atomic_load(&s->bytes_fetched) + h.bytes;
	out->direct_reads = atomic_load(&s->direct_reads);
	pthread_mutex_lock(&s->lock);
	out->cached_bytes = s->cached_bytes;
	out->cached_blocks = s->cached_blocks;
	pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------------ fetch */

static int fetch_file(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data, size_t *len,
		      char *why, size_t whylen)
{
	struct stat st;
	uint8_t *buf;
	int64_t got = 0;
	int rc, fd = file_open(uri, uri + 7, &st, why, whylen);

	if (fd < 0)
		return fd;
	if (st.st_size > max) {
		rc = errf(why, whylen, -EFBIG, "%s: holds %" PRId64 " bytes, more than %" PRId64,
			  uri, (int64_t)st.st_size, max);
		goto err_close;
	}
	stat_add(&s->requests, 1);
	if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
		rc = errf(why, whylen, -ENOMEM, "%s: out of memory", uri);
		goto err_close;
	}
	while (got < st.st_size) {
		ssize_t n = pread(fd, buf + got, (size_t)(st.st_size - got), got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = errf(why, whylen, -EIO, "%s: %m", uri);
			stat_add(&s->failures, 1);
			goto err_free_buf;
		}
		if (n == 0)
			break; /* shrank meanwhile: what is there */
		got += n;
	}
	close(fd);
	stat_add(&s->bytes_fetched, got);
	*data = buf;
	*len = (size_t)got;
	return 0;

err_free_buf:
	free(buf);
err_close:
	close(fd);
	return rc;
}

int mlfs_src_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data, size_t *len,
		   char *why, size_t whylen)
{
	enum obj_kind kind;
	int rc;

	*data = NULL;
	*len = 0;
	if (why && whylen)
		why[0] = 0;
	if ((rc = uri_kind(uri, &kind, why, whylen)))
		return rc;
	if (max < 0)
		return errf(why, whylen, -EINVAL, "%s: negative size bound", uri);
	if (kind == OBJ_FILE)
		return fetch_file(s, uri, max, data, len, why, whylen);
	return net_http_get(s->http, uri, max, data, len, NULL, why, whylen);
}

/* ------------------------------------------------------------------ readv */

/* The ranges of one object: ord[lo, hi). */
struct grp {
	struct src_obj *obj;
	size_t lo, hi;
	int fd;		    /* file: pinned fd, else -1 */
	const uint8_t *map; /* file: pinned mapping, or NULL */
	bool direct;	    /* read with preadv, not through the cache (file_direct) */
};

/* A block a readv needs; needs are sorted by (grp, idx) and distinct. */
struct need {
	uint32_t grp;
	int64_t idx;
	struct src_blk *hit; /* pinned cached block, or NULL */
};

/* A run of missing blocks fetched as one request. */
struct req {
	uint32_t grp;
	int64_t first;
	int nblk;
	int rc; /* 0, -EIO, -ENOMEM, or -ECANCELED (not run) */
	char why[512];
};

struct rv {
	struct mlfs_src *s;
	const struct mlfs_range *r;
	struct src_obj **robj; /* per range */
	size_t *ord;	       /* ranges with len > 0, by (obj, off) */
	int64_t *pmax;	       /* pmax[k]: max end of the ranges ord[lo..k] of k's group */
	size_t nord;
	struct grp *grps;
	size_t ngrps;
	struct req *reqs;
	size_t nreqs;
	atomic_size_t next; /* next request to run */
	atomic_int stop;    /* a request failed: start no more */
	int64_t start_ns;   /* HTTP requests share a deadline from then (CLOCK_MONOTONIC) */
};

static int cmp_ord(const void *pa, const void *pb, void *arg)
{
	const struct rv *rv = arg;
	size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
	uintptr_t oa = (uintptr_t)rv->robj[a], ob = (uintptr_t)rv->robj[b];

	if (oa != ob)
		return oa < ob ? -1 : 1;
	if (rv->r[a].off != rv->r[b].off)
		return rv->r[a].off < rv->r[b].off ? -1 : 1;
	return a < b ? -1 : a > b;
}

/* Copies bytes [@start, @start + @len) of group @g's object to the ranges holding them. */
static void copy_out(struct rv *rv, const struct grp *g, int64_t start, const uint8_t *data,
		     int64_t len)
{
	int64_t end = start + len;
	size_t lo = g->lo, hi = g->hi;

	/* The first range that may reach @start: pmax is non-decreasing. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (rv->pmax[mid] > start)
			hi = mid;
		else
			lo = mid + 1;
	}
	for (size_t k = lo; k < g->hi; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		if (r->off >= end)
			break;
		int64_t a = r->off > start ? r->off : start;
		int64_t b = r->off + r->len < end ? r->off + r->len : end;
		if (a < b)
			memcpy((uint8_t *)r->dst + (a - r->off), data + (a - start),
			       (size_t)(b - a));
	}
}

/* Every range of a group whose object size is known must lie within it. */
static int check_sizes(struct rv *rv, char *why, size_t whylen)
{
	for (size_t gi = 0; gi < rv->ngrps; gi++) {
		const struct grp *g = &rv->grps[gi];
		int64_t size = obj_size(rv->s, g->obj);
		if (size < 0)
			continue;
		for (size_t k = g->lo; k < g->hi; k++) {
			const struct mlfs_range *r = &rv->r[rv->ord[k]];
			if (r->off + r->len <= size)
				continue;
			if (g->obj->kind == OBJ_FILE) /* it may grow: look again next time */
				obj_reopen(rv->s, g->obj);
			return errf(why, whylen, -EIO,
				    "%s: holds %" PRId64 " bytes, bytes %" PRId64 "-%" PRId64
				    " asked",
				    g->obj->uri, size, r->off, r->off + r->len - 1);
		}
	}
	return 0;
}

/* Ranges of one preadv: at most this many. */
#define SPAN_IOV 256

/* Fills the @nv iovecs at @v (@len bytes in all) from group @g's file at
 * @pos. With RWF_NOWAIT in @flags, -EAGAIN unless the page cache held all of
 * it (the caller then reads it again, blocking). */
static int file_preadv(const struct grp *g, struct iovec *v, int nv, int64_t pos, int64_t len,
		       int flags, char *why, size_t whylen)
{
	for (int64_t end = pos + len; pos < end;) {
		ssize_t got = preadv2(g->fd, v, nv, pos, flags);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && flags && (errno == EAGAIN || errno == EOPNOTSUPP))
			return -EAGAIN;
		if (got < 0)
			return errf(why, whylen, -EIO, "%s: %m", g->obj->uri);
		if (got == 0)
			return errf(why, whylen, -EIO,
				    "%s: ends at byte %" PRId64
				    ", shorter than when opened (changed?)",
				    g->obj->uri, pos);
		pos += got;
		while (got > 0) { /* consume the iovecs filled */
			if ((size_t)got >= v->iov_len) {
				got -= (ssize_t)v->iov_len;
				v++;
				nv--;
			} else {
				v->iov_base = (uint8_t *)v->iov_base + got;
				v->iov_len -= (size_t)got;
				got = 0;
			}
		}
	}
	return 0;
}

/* Reads the @nb adjacent blocks at @blks from byte @a on, SPAN_IOV a call. */
static int file_read(struct mlfs_src *s, const struct grp *g, struct src_blk **blks, int nb,
		     int64_t a, char *why, size_t whylen)
{
	struct iovec iov[SPAN_IOV];
	int64_t pos = a;

	stat_add(&s->requests, 1);
	for (int j = 0; j < nb;) {
		int nv = 0;
		int64_t len = 0;
		for (; j < nb && nv < SPAN_IOV; j++) {
			iov[nv++] = (struct iovec){blks[j]->data, (size_t)blks[j]->len};
			len += blks[j]->len;
		}
		int rc = file_preadv(g, iov, nv, pos, len, 0, why, whylen);
		if (rc)
			return rc;
		pos += len;
	}
	stat_add(&s->bytes_fetched, pos - a);
	return 0;
}

/* Fetches request @rq, copies its bytes to the dsts, hands its blocks to the cache. */
static int run_req(struct rv *rv, struct req *rq)
{
	struct mlfs_src *s = rv->s;
	const struct grp *g = &rv->grps[rq->grp];
	int64_t B = s->o.block_bytes, a = rq->first * B, span = (int64_t)rq->nblk * B, end;
	int64_t size = obj_size(s, g->obj), got_end;
	struct src_blk **blks;
	struct iovec *iov = NULL;
	int nb, rc = 0;

	if (span > INT64_MAX - a)
		span = INT64_MAX - a;
	end = a + span;
	if (size >= 0 && end > size)
		end = size;
	if (a >= end)
		return 0; /* past the end: check_sizes will say */
	nb = (int)((end - a + B - 1) / B);
	if (!(blks = calloc((size_t)nb, sizeof(*blks))))
		return errf(rq->why, sizeof(rq->why), -ENOMEM, "%s: out of memory", g->obj->uri);
	for (int j = 0; j < nb; j++) {
		int64_t bs = a + j * B, bl = end - bs < B ? end - bs : B;
		if (!(blks[j] = blk_new(g->obj, rq->first + j, bl))) {
			rc = errf(rq->why, sizeof(rq->why), -ENOMEM, "%s: out of memory",
				  g->obj->uri);
			goto out;
		}
	}

	if (g->obj->kind == OBJ_FILE) {
		if ((rc = file_read(s, g, blks, nb, a, rq->why, sizeof(rq->why)))) {
			stat_add(&s->failures, 1);
			goto out;
		}
		got_end = end;
	} else {
		struct net_http_call call = {.start_ns = rv->start_ns, .stop = &rv->stop};
		struct net_http_range hr = {.off = a, .len = end - a, .iovcnt = nb};
		if (!(iov = malloc((size_t)nb * sizeof(*iov)))) {
			rc = errf(rq->why, sizeof(rq->why), -ENOMEM, "%s: out of memory",
				  g->obj->uri);
			goto out;
		}
		for (int j = 0; j < nb; j++)
			iov[j] = (struct iovec){blks[j]->data, (size_t)blks[j]->len};
		hr.iov = iov;
		if ((rc = net_http_get_range(s->http, g->obj->uri, &hr, &call, rq->why,
					     sizeof(rq->why))))
			goto out;
		if (hr.size >= 0 &&
		    (rc = obj_set_size(s, g->obj, hr.size, rq->why, sizeof(rq->why))))
			goto out;
		got_end = a + hr.got;
	}

	for (int j = 0; j < nb; j++) {
		struct src_blk *k = blks[j];
		int64_t bs = a + j * B;
		blks[j] = NULL;
		if (bs >= got_end) {
			free(k); /* past the object's end */
			continue;
		}
		if (got_end - bs < k->len) {
			/* The object's last block: keep only its bytes. */
			struct src_blk *t = realloc(k, sizeof(*k) + (size_t)(got_end - bs));
			k = t ? t : k;
			k->len = got_end - bs;
		}
		copy_out(rv, g, bs, k->data, k->len);
		cache_insert(s, k);
	}
out:
	for (int j = 0; j < nb; j++)
		free(blks[j]);
	free(blks);
	free(iov);
	return rc;
}

static void *run_worker(void *arg)
{
	struct rv *rv = arg;
	size_t i;

	while ((i = atomic_fetch_add(&rv->next, 1)) < rv->nreqs) {
		struct req *rq = &rv->reqs[i];
		if (atomic_load(&rv->stop)) {
			rq->rc = -ECANCELED;
			continue;
		}
		if ((rq->rc = run_req(rv, rq)) && rq->rc != -ECANCELED)
			atomic_store(&rv->stop, 1);
	}
	return NULL;
}

/* Runs all requests on up to opts.parallel threads, the caller's included. */
static void run_all(struct rv *rv)
{
	pthread_t tid[SRC_MAX_PARALLEL];
	size_t want = rv->nreqs < (size_t)rv->s->o.parallel ? rv->nreqs : (size_t)rv->s->o.parallel;
	size_t nt = 0;

	atomic_init(&rv->next, 0);
	atomic_init(&rv->stop, 0);
	while (nt + 1 < want && !pthread_create(&tid[nt], NULL, run_worker, rv))
		nt++; /* on failure, fewer threads do the work */
	run_worker(rv);
	for (size_t i = 0; i < nt; i++)
		pthread_join(tid[i], NULL);
}

/* Builds rv->grps and rv->pmax from the sorted rv->ord. */
static int make_groups(struct rv *rv)
{
	size_t g = 0;

	if (!(rv->pmax = malloc(rv->nord * sizeof(*rv->pmax))) ||
	    !(rv->grps = calloc(rv->nord, sizeof(*rv->grps))))
		return -ENOMEM;
	for (size_t k = 0; k < rv->nord; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		struct src_obj *o = rv->robj[rv->ord[k]];
		int64_t end = r->off + r->len;
		if (k == 0 || o != rv->grps[g - 1].obj) {
			rv->grps[g++] = (struct grp){.obj = o, .lo = k, .hi = k, .fd = -1};
		} else if (rv->pmax[k - 1] > end) {
			end = rv->pmax[k - 1];
		}
		rv->pmax[k] = end;
		rv->grps[g - 1].hi = k + 1;
	}
	rv->ngrps = g;
	return 0;
}

/* The distinct blocks the ranges need, sorted by (group, index). */
static int make_needs(struct rv *rv, struct need **out, size_t *nout, char *why, size_t whylen)
{
	int64_t B = rv->s->o.block_bytes;
	struct need *needs = NULL;
	size_t n = 0;

	for (int pass = 0; pass < 2; pass++) {
		n = 0;
		for (size_t gi = 0; gi < rv->ngrps; gi++) {
			int64_t last = -1;
			if (rv->grps[gi].direct)
				continue;
			for (size_t k = rv->grps[gi].lo; k < rv->grps[gi].hi; k++) {
				const struct mlfs_range *r = &rv->r[rv->ord[k]];
				int64_t first = r->off / B, lastb = (r->off + r->len - 1) / B;
				if (first <= last)
					first = last + 1;
				if (first > lastb)
					continue;
				if ((uint64_t)(lastb - first) >= SRC_MAX_NEED - n)
					return errf(why, whylen, -ENOMEM,
						    "%s: more than %zu blocks asked at once",
						    rv->grps[gi].obj->uri, SRC_MAX_NEED);
				for (int64_t i = first; pass && i <= lastb; i++)
					needs[n + (size_t)(i - first)] =
					    (struct need){.grp = (uint32_t)gi, .idx = i};
				n += (size_t)(lastb - first + 1);
				last = lastb;
			}
		}
		if (!pass && !(needs = calloc(n ? n : 1, sizeof(*needs))))
			return errf(why, whylen, -ENOMEM, "out of memory");
	}
	*out = needs;
	*nout = n;
	return 0;
}

/* Pins the cached needed blocks, copies them out, unpins them. */
static void serve_hits(struct rv *rv, struct need *needs, size_t nneed)
{
	struct mlfs_src *s = rv->s;
	int64_t hits = 0;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < nneed; i++) {
		struct src_blk *b = cache_find(s, rv->grps[needs[i].grp].obj, needs[i].idx);
		if (b) {
			atomic_fetch_add(&b->refs, 1);
			lru_unlink(b);
			lru_push(s, b);
			needs[i].hit = b;
			hits++;
		}
	}
	pthread_mutex_unlock(&s->lock);
	stat_add(&s->hits, hits);
	stat_add(&s->misses, (int64_t)nneed - hits);
	for (size_t i = 0; i < nneed; i++) {
		struct src_blk *b = needs[i].hit;
		if (!b)
			continue;
		copy_out(rv, &rv->grps[needs[i].grp], b->idx * s->o.block_bytes, b->data, b->len);
		if (blk_unref(b))
			free(b); /* evicted while we copied */
	}
}

/* Groups runs of missing blocks into requests of at most max_request_bytes. */
static int make_reqs(struct rv *rv, const struct need *needs, size_t nneed)
{
	int64_t maxblk = rv->s->o.max_request_bytes / rv->s->o.block_bytes;
	struct req *rq = NULL;

	if (maxblk > INT32_MAX)
		maxblk = INT32_MAX;
	if (!(rv->reqs = malloc((nneed ? nneed : 1) * sizeof(*rv->reqs))))
		return -ENOMEM;
	rv->nreqs = 0;
	for (size_t i = 0; i < nneed; i++) {
		if (needs[i].hit)
			continue;
		if (!rq || rq->grp != needs[i].grp || rq->first + rq->nblk != needs[i].idx ||
		    rq->nblk >= maxblk) {
			rq = &rv->reqs[rv->nreqs++];
			rq->grp = needs[i].grp;
			rq->first = needs[i].idx;
			rq->nblk = 0;
			rq->rc = 0;
			rq->why[0] = 0;
		}
		rq->nblk++;
	}
	return 0;
}

/* ---------------------------------------------------------- direct reads */

/* A run of ranges ord[lo, hi) of one direct group, adjacent in its file. */
struct span {
	uint32_t grp;
	size_t lo, hi;
	int64_t off, len;
};

struct dv {
	struct rv *rv;
	struct span *spans;
	size_t nspans;
	size_t *todo; /* indices of pending spans */
	size_t ntodo;
	atomic_size_t next;
	atomic_int failed; /* the first failure writes why */
	int rc;
	char why[512];
};

/* Reads span @sp into its dsts (see file_preadv for @flags). */
static int span_read(struct rv *rv, const struct span *sp, int flags, char *why, size_t whylen)
{
	struct iovec iov[SPAN_IOV];
	int nv = 0;

	for (size_t k = sp->lo; k < sp->hi; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		iov[nv++] = (struct iovec){r->dst, (size_t)r->len};
	}
	int rc = file_preadv(&rv->grps[sp->grp], iov, nv, sp->off, sp->len, flags, why, whylen);
	if (rc)
		return rc;
	stat_add(&rv->s->direct_reads, 1);
	stat_add(&rv->s->bytes_fetched, sp->len);
	return 0;
}

/* ------------------------------------------------ copies from a mapping */

/* The guard of this thread's copy from a mapping, while one runs. */
static __thread sigjmp_buf
    *volatile bus_guard; /* volatile: memcpy does not read it, the handler does */
static struct sigaction bus_prev;
static pthread_mutex_t bus_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
	(void)sig, (void)si, (void)ctx;
	if (bus_guard)
		siglongjmp(*bus_guard, 1);
	/* Not a guarded copy: back to the previous disposition, which the
	 * fault meets when the instruction runs again. */
	sigaction(SIGBUS, &bus_prev, NULL);
}

static bool bus_ours(void)
{
	struct sigaction cur;

	return sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
	       cur.sa_sigaction == on_sigbus;
}

/* Installs on_sigbus unless it is the handler already (checked before every
 * readv with mappings: a library or test harness may have replaced it). */
static void bus_ensure(void)
{
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};

	if (bus_ours())
		return;
	sigemptyset(&sa.sa_mask);
	pthread_mutex_lock(&bus_lock);
	if (!bus_ours())
		sigaction(SIGBUS, &sa, &bus_prev);
	pthread_mutex_unlock(&bus_lock);
}

/* Copies @len bytes of a file mapping at @src to @dst: 0, or -EIO when the
 * file no longer holds them (it shrank: SIGBUS). */
static int map_copy(void *dst, const uint8_t *src, size_t len)
{
	sigjmp_buf jb;

	if (sigsetjmp(jb, 0)) { /* 0: no sigprocmask call per copy */
		sigset_t bus;
		bus_guard = NULL;
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS); /* blocked since the handler ran */
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		return -EIO;
	}
	bus_guard = &jb;
	atomic_signal_fence(memory_order_seq_cst); /* the copy stays inside */
	memcpy(dst, src, len);
	atomic_signal_fence(memory_order_seq_cst);
	bus_guard = NULL;
	return 0;
}

int mlfs_src_map_copy(void *dst, const void *src, size_t len)
{
	bus_ensure();
	return map_copy(dst, src, len);
}

/* Copies span @sp from its group's mapping into its dsts. */
static int span_copy(struct rv *rv, const struct span *sp, char *why, size_t whylen)
{
	const struct grp *g = &rv->grps[sp->grp];

	for (size_t k = sp->lo; k < sp->hi; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		if (map_copy(r->dst, g->map + r->off, (size_t)r->len) == 0)
			continue;
		obj_reopen(rv->s, g->obj);
		return errf(why, whylen, -EIO,
			    "%s: bytes %" PRId64 "-%" PRId64
			    " unreadable, shorter than when opened (changed?) or an I/O error",
			    g->obj->uri, r->off, r->off + r->len - 1);
	}
	stat_add(&rv->s->direct_reads, 1);
	stat_add(&rv->s->bytes_fetched, sp->len);
	return 0;
}

static void *direct_worker(void *arg)
{
	struct dv *d = arg;
	size_t i;
	char why[512];

	while ((i = atomic_fetch_add(&d->next, 1)) < d->ntodo && !atomic_load(&d->failed)) {
		int rc = span_read(d->rv, &d->spans[d->todo[i]], 0, why, sizeof(why));
		if (rc && !atomic_exchange(&d->failed, 1)) {
			d->rc = rc;
			snprintf(d->why, sizeof(d->why), "%s", why);
		}
	}
	return NULL;
}

/* The direct groups' spans, cut where ranges stop being adjacent. */
static int make_spans(struct rv *rv, struct span **out, size_t *nout)
{
	int64_t maxlen = rv->s->o.max_request_bytes;
	struct span *sp = NULL, *cur = NULL;
	size_t n = 0, cap = 0;

	for (size_t gi = 0; gi < rv->ngrps; gi++) {
		if (!rv->grps[gi].direct)
			continue;
		cur = NULL;
		for (size_t k = rv->grps[gi].lo; k < rv->grps[gi].hi; k++) {
			const struct mlfs_range *r = &rv->r[rv->ord[k]];
			if (cur && r->off == cur->off + cur->len && cur->hi - cur->lo < SPAN_IOV &&
			    cur->len <= maxlen - r->len) {
				cur->hi = k + 1;
				cur->len += r->len;
				continue;
			}
			if (n == cap) {
				struct span *b =
				    realloc(sp, (cap = cap ? 2 * cap : 64) * sizeof(*sp));
				if (!b) {
					free(sp);
					return -ENOMEM;
				}
				sp = b;
			}
			cur = &sp[n++];
			*cur = (struct span){(uint32_t)gi, k, k + 1, r->off, r->len};
		}
	}
	*out = sp;
	*nout = n;
	return 0;
}

/* Whether the first and last byte of span @sp are in the page cache: a
 * read that may not wait (mincore would not do: it reports every page
 * resident to a process that could not open the file for writing). */
static bool span_cached(struct rv *rv, const struct span *sp)
{
	uint8_t b;
	struct iovec v = {&b, 1};
	int fd = rv->grps[sp->grp].fd;

	return preadv2(fd, &v, 1, sp->off, RWF_NOWAIT) == 1 &&
	       preadv2(fd, &v, 1, sp->off + sp->len - 1, RWF_NOWAIT) == 1;
}

/* Whether the files of the mapped groups still hold what was mapped (a
 * mapping reads the bytes between a new, shorter end and the end of its
 * page as zeros, where a read would fail); those that do not lose their
 * mapping: preadv then says what is missing, and the object is reopened. */
static void check_maps(struct rv *rv)
{
	struct stat st;

	for (size_t gi = 0; gi < rv->ngrps; gi++) {
		struct grp *g = &rv->grps[gi];
		if (!g->direct || !g->map)
			continue;
		/* maplen changes only when the file is opened again, which
		 * waits until no readv pins it: no lock needed while we do */
		if (fstat(g->fd, &st) == 0 && st.st_size >= g->obj->maplen)
			continue;
		obj_reopen(rv->s, g->obj);
		g->map = NULL;
	}
}

/* Reads the direct groups: copies from the mappings on this thread until
 * one waited for the disk; then, and for files without a mapping, preadv:
 * page-cache hits on this thread, the rest on up to opts.parallel threads. */
static int read_direct(struct rv *rv, char *why, size_t whylen)
{
	struct dv d = {.rv = rv};
	pthread_t tid[SRC_MAX_PARALLEL];
	size_t nt = 0;
	int rc;

	if ((rc = make_spans(rv, &d.spans, &d.nspans)))
		return errf(why, whylen, rc, "out of memory");
	check_maps(rv);
	for (size_t gi = 0; gi < rv->ngrps; gi++)
		if (rv->grps[gi].direct && rv->grps[gi].map) {
			bus_ensure();
			break;
		}
	if (d.nspans && !(d.todo = malloc(d.nspans * sizeof(*d.todo)))) {
		free(d.spans);
		return errf(why, whylen, -ENOMEM, "out of memory");
	}
	bool cold = false;
	for (size_t i = 0; i < d.nspans; i++) {
		if (rv->grps[d.spans[i].grp].map && !cold) {
			int64_t t0 = now_ns();
			if ((rc = span_copy(rv, &d.spans[i], why, whylen)))
				goto out;
			/* Slower than 50 us + 1 ns a byte: pages came from the
			 * disk (the rest may too: preadv, in parallel), or were
			 * only mapped for the first time (go on copying). */
			if (now_ns() - t0 > 50000 + d.spans[i].len && i + 1 < d.nspans)
				cold = !span_cached(rv, &d.spans[i + 1]);
			continue;
		}
		rc = span_read(rv, &d.spans[i], RWF_NOWAIT, why, whylen);
		if (rc == -EAGAIN)
			d.todo[d.ntodo++] = i;
		else if (rc)
			goto out;
	}
	rc = 0;
	if (d.ntodo) {
		size_t want =
		    d.ntodo < (size_t)rv->s->o.parallel ? d.ntodo : (size_t)rv->s->o.parallel;
		atomic_init(&d.next, 0);
		atomic_init(&d.failed, 0);
		while (nt + 1 < want && !pthread_create(&tid[nt], NULL, direct_worker, &d))
			nt++; /* on failure, fewer threads do the work */
		direct_worker(&d);
		for (size_t i = 0; i < nt; i++)
			pthread_join(tid[i], NULL);
		if (atomic_load(&d.failed))
			rc = errf(why, whylen, d.rc, "%s", d.why);
	}
out:
	free(d.todo);
	free(d.spans);
	return rc;
}

int mlfs_src_readv(struct mlfs_src *s, const struct mlfs_range *r, size_t n, char *why,
		   size_t whylen)
{
	struct rv rv = {.s = s, .r = r, .start_ns = now_ns()};
	struct need *needs = NULL;
	size_t nneed = 0;
	int rc = 0;

	if (why && whylen)
		why[0] = 0;
	if (!n)
		return 0;
	if (!r)
		return errf(why, whylen, -EINVAL, "no ranges");
	if (!(rv.robj = calloc(n, sizeof(*rv.robj))) || !(rv.ord = malloc(n * sizeof(*rv.ord)))) {
		rc = errf(why, whylen, -ENOMEM, "out of memory");
		goto out;
	}

	/* 1. Objects, files opened, ranges checked against known sizes. */
	for (size_t i = 0; i < n; i++) {
		if (r[i].off < 0 || r[i].len < 0 || r[i].off > INT64_MAX - r[i].len ||
		    (r[i].len && !r[i].dst)) {
			rc = errf(why, whylen, -EINVAL,
				  "%s: bad range %zu (offset %" PRId64 ", length %" PRId64 ")",
				  r[i].uri ? r[i].uri : "(null)", i, r[i].off, r[i].len);
			goto out;
		}
		if (i && r[i].uri && r[i - 1].uri && !strcmp(r[i].uri, r[i - 1].uri))
			rv.robj[i] = rv.robj[i - 1];
		else if ((rc = obj_get(s, r[i].uri, &rv.robj[i], why, whylen)))
			goto out;
		if (r[i].len)
			rv.ord[rv.nord++] = i;
	}
	if (!rv.nord)
		goto out;
	qsort_r(rv.ord, rv.nord, sizeof(*rv.ord), cmp_ord, &rv);
	if ((rc = make_groups(&rv))) {
		rc = errf(why, whylen, rc, "out of memory");
		goto out;
	}
	for (size_t gi = 0; gi < rv.ngrps; gi++) {
		struct grp *g = &rv.grps[gi];
		if (g->obj->kind == OBJ_FILE &&
		    (rc = file_pin(s, g->obj, &g->fd, &g->map, why, whylen)))
			goto out;
		g->direct = g->obj->kind == OBJ_FILE && s->o.file_direct;
	}
	if ((rc = check_sizes(&rv, why, whylen)))
		goto out;
	if (s->o.file_direct && (rc = read_direct(&rv, why, whylen)))
		goto out;

	/* 2, 3. The blocks needed; the cached ones served at once. */
	if ((rc = make_needs(&rv, &needs, &nneed, why, whylen)))
		goto out;
	serve_hits(&rv, needs, nneed);

	/* 4. The missing ones, fetched. */
	if ((rc = make_reqs(&rv, needs, nneed))) {
		rc = errf(why, whylen, rc, "out of memory");
		goto out;
	}
	if (rv.nreqs)
		run_all(&rv);
	for (size_t i = 0; i < rv.nreqs; i++) {
		if (rv.reqs[i].rc && rv.reqs[i].rc != -ECANCELED) {
			rc = errf(why, whylen, rv.reqs[i].rc, "%s", rv.reqs[i].why);
			goto out;
		}
	}

	/* 5. Sizes learned from the replies. */
	rc = check_sizes(&rv, why, whylen);
out:
	for (size_t gi = 0; gi < rv.ngrps; gi++)
		if (rv.grps[gi].fd >= 0)
			file_unpin(s, rv.grps[gi].obj);
	free(rv.reqs);
	free(needs);
	free(rv.grps);
	free(rv.pmax);
	free(rv.ord);
	free(rv.robj);
	return rc;
}

/* -------------------------------------------------------------------- URIs */

/* Length of @s's "scheme://" prefix, or 0. */
static size_t scheme_len(const char *s)
{
	size_t i = 0;

	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
		return 0;
	while ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
	       (s[i] >= '0' && s[i] <= '9') || s[i] == '+' || s[i] == '-' || s[i] == '.')
		i++;
	return strncmp(s + i, "://", 3) ? 0 : i + 3;
}

char *mlfs_uri_join(const char *base, const char *ref)
{
	size_t sl, dir, n;
	char *out;

	if (!base || !ref || !*ref)
		return NULL;
	if (scheme_len(ref))
		return strdup(ref);
	if (ref[0] == '/' || !(sl = scheme_len(base)))
		return NULL;
	for (const char *p = ref; *p;) {
		size_t c = strcspn(p, "/");
		if (c == 2 && p[0] == '.' && p[1] == '.')
			return NULL;
		p += c;
		if (*p)
			p++;
	}
	/* The directory: up to the last '/' of the path (before any query). */
	n = sl + strcspn(base + sl, "?#");
	dir = n;
	while (dir > sl && base[dir - 1] != '/')
		dir--;
	if (!(out = malloc(n + strlen(ref) + 2)))
		return NULL;
	if (dir > sl && (dir > sl + 1 || base[sl] == '/')) {
		/* "file:///d/x" -> "file:///d/"; "http://h/d/x" -> "http://h/d/" */
		memcpy(out, base, dir);
		out[dir] = 0;
	} else {
		/* "http://host" or "http://host?q": the root. */
		size_t hl = sl + strcspn(base + sl, "/?#");
		memcpy(out, base, hl);
		out[hl] = '/';
		out[hl + 1] = 0;
	}
	strcat(out, ref);
	return out;
}
