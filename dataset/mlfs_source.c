/*
 * mlfs_source.c - dataset shard sources behind a byte-bounded block cache:
 * a source's life, options and counters, its object table, whole-object
 * fetches. mlfs_source_i.h lists the other files of the source.
 *
 * DESIGN
 * Objects: one struct src_obj per URI ever named (a hash table by URI, kept
 * until mlfs_src_free) holds its kind, its size once known (file: fstat at
 * open; HTTP: the total of a Content-Range, or the length of a 200) and, for
 * files, an fd shared by all readers (mlfs_srcfile.c: opened without
 * blocking, pinned by the readvs using it, the idlest closed past
 * SRC_MAX_FDS).
 *
 * Cache (mlfs_srccache.c): blocks keyed by (object, block index), LRU,
 * reference-counted. Invariant: the bytes cached never exceed cache_bytes.
 * A block enters the cache only complete and verified; the bytes of a
 * failed attempt reach neither the cache nor a dst.
 *
 * readv (mlfs_srcreadv.c): ranges sorted by object, cut into the blocks
 * they need; cached blocks copied out, runs of missing ones fetched as one
 * request each on up to `parallel` threads. With file_direct, file objects
 * skip the cache (mlfs_srcdirect.c): the page cache is their cache, and
 * copies from their mappings are guarded against SIGBUS (mlfs_mapcopy.c).
 *
 * fetch: a whole object of bounded size past the cache (an index, an
 * offsets table): one read of a file, or one GET.
 *
 * HTTP: net/ does it (one client a source: its connections, retries,
 * timeout and deadline; see net_http.c).
 *
 * Failures: every readv or fetch that fails to read an object (not one
 * refused for its arguments, -EINVAL) is logged once, at warning level,
 * with the message its caller gets (common.h): a prefetch's failure is
 * otherwise seen by nobody. The caller decides what else to do with it
 * (status.json, EIO).
 *
 * Threads: s->lock guards the object table, the objects' size and fd fields
 * and the cache. It is never held across I/O, a sleep or a copy of block
 * bytes; there is no other lock (the HTTP client has its own, the SIGBUS
 * guard a leaf one to install its handler). Counters are atomics.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"
#include "dataset/dataset_i.h"
#include "net/net.h"

#define SRC_DEF_CACHE	 ((int64_t)1 << 30)
#define SRC_DEF_BLOCK	 ((int64_t)1 << 20)
#define SRC_DEF_REQUEST	 ((int64_t)16 << 20)
#define SRC_DEF_PARALLEL 8
/* Idle HTTP connections kept. */
#define SRC_POOL 64
/* Initial size of the object table (a power of two). */
#define SRC_OBJ_BUCKETS 256

/* ---------------------------------------------------------------- helpers */

static bool has_prefix(const char *s, const char *p)
{
	return strncasecmp(s, p, strlen(p)) == 0;
}

/* The kind of @uri, or -EINVAL with the reason in @err. */
static int uri_kind(const char *uri, enum obj_kind *kind, struct ptc_error *err)
{
	int rc;

	if (!uri)
		return ptc_error_set(err, -EINVAL, "no URI");
	if (strnlen(uri, MLFS_SRC_MAX_URI + 1) > MLFS_SRC_MAX_URI)
		return ptc_error_set(err, -EINVAL, "%.64s...: URI longer than %d bytes", uri,
				     MLFS_SRC_MAX_URI);
	if (has_prefix(uri, "file://")) {
		if (uri[7] != '/' || !uri[8])
			return ptc_error_set(
			    err, -EINVAL, "%s: not a local absolute file URI (file:///path)", uri);
		*kind = OBJ_FILE;
		return 0;
	}
	if (!has_prefix(uri, "http://") && !has_prefix(uri, "https://"))
		return ptc_error_set(
		    err, -EINVAL,
		    "%s: unsupported URI (file:///path, http:// or https:// expected)", uri);
	if ((rc = net_url_check(uri, err)))
		return rc;
	*kind = OBJ_HTTP;
	return 0;
}

void mlfs_src_log_failure(int rc, const char *why)
{
	if (rc != -EINVAL) /* a refused argument is its caller's to report */
		mlfs_log(MLFS_LOG_WARNING, "dataset source: %s", why);
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

int mlfs_srcobj_get(struct mlfs_src *s, const char *uri, struct src_obj **out,
		    struct ptc_error *err)
{
	enum obj_kind kind;
	uint64_t h;
	struct src_obj *o;
	int rc = uri_kind(uri, &kind, err);

	if (rc)
		return rc;
	h = mlfs_hash_str(uri);
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
		return ptc_error_set(err, -ENOMEM, "%s: out of memory", uri);
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

void mlfs_srcobj_reopen(struct mlfs_src *s, struct src_obj *o)
{
	pthread_mutex_lock(&s->lock);
	o->reopen = true;
	pthread_mutex_unlock(&s->lock);
}

int64_t mlfs_srcobj_size(struct mlfs_src *s, struct src_obj *o)
{
	pthread_mutex_lock(&s->lock);
	int64_t size = o->size;
	pthread_mutex_unlock(&s->lock);
	return size;
}

int mlfs_srcobj_set_size(struct mlfs_src *s, struct src_obj *o, int64_t size, struct ptc_error *err)
{
	int64_t old;

	pthread_mutex_lock(&s->lock);
	old = o->size;
	if (old < 0)
		o->size = size;
	pthread_mutex_unlock(&s->lock);
	if (old >= 0 && old != size)
		return ptc_error_set(err, -EIO,
				     "%s: size changed from %" PRId64 " to %" PRId64 " bytes",
				     o->uri, old, size);
	return 0;
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
	s->objs = calloc(s->nobj_buckets, sizeof(*s->objs));
	if (!s->objs)
		goto err_free_src;
	if (mlfs_srccache_init(s))
		goto err_free_objs;
	if (net_http_new(&ho, &s->http, NULL))
		goto err_release_cache;
	pthread_mutex_init(&s->lock, NULL);
	return s;

err_release_cache:
	mlfs_srccache_release(s);
err_free_objs:
	free(s->objs);
err_free_src:
	free(s);
	return NULL;
}

void mlfs_src_free(struct mlfs_src *s)
{
	if (!s)
		return;
	mlfs_srccache_release(s);
	for (size_t i = 0; i < s->nobj_buckets; i++) {
		for (struct src_obj *o = s->objs[i], *next; o; o = next) {
			next = o->next;
			mlfs_srcfile_close(s, o);
			free(o->uri);
			free(o);
		}
	}
	net_http_free(s->http);
	free(s->objs);
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

int mlfs_src_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data, size_t *len,
		   struct ptc_error *err)
{
	enum obj_kind kind;
	struct ptc_error own;
	int rc;

	*data = NULL;
	*len = 0;
	if (!err) /* the log says why all the same */
		err = &own;
	err->text[0] = 0;
	err->code = 0;
	if ((rc = uri_kind(uri, &kind, err)))
		return rc;
	if (max < 0)
		return ptc_error_set(err, -EINVAL, "%s: negative size bound", uri);
	if (kind == OBJ_FILE)
		rc = mlfs_srcfile_fetch(s, uri, max, data, len, err);
	else
		rc = net_http_get(s->http, uri, max, data, len, NULL, err);
	if (rc)
		mlfs_src_log_failure(rc, err->text);
	return rc;
}
