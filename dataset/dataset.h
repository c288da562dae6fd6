/*
 * dataset.h - the dataset: shard sources behind a block cache, and the
 * views of each step a DP rank reads.
 */
#ifndef MLFS_DATASET_H
#define MLFS_DATASET_H

/*
 * Sources (mlfs_source.c and mlfs_src*.c): dataset shard sources (file://, http://, https://)
 * behind a byte-bounded block cache.
 *
 * An object is named by a URI: "file:///abs/path", "http://host[:port]/path"
 * or "https://...". Objects are read in blocks of opts.block_bytes (block i
 * is bytes [i*B, (i+1)*B), the last one may be short) through an LRU cache
 * bounded by opts.cache_bytes. Objects are assumed immutable while a source
 * is alive: a cached block is never re-validated.
 *
 * Threads: every function may be called from any thread, and several threads
 * may use one source at once (FUSE workers, the prefetch thread), except that
 * mlfs_src_free must not race with any other call on the same source.
 * mlfs_src_readv and mlfs_src_fetch block on I/O (network included, with
 * retries, for at most about opts.deadline_ms over HTTP): do not call them
 * from a thread that must not block.
 *
 * HTTP goes through net/net.h (the project's one HTTP client): the retry,
 * timeout and deadline fields below are its options.
 *
 * A readv or fetch that fails to read an object (any error but -EINVAL)
 * also logs its message as a warning (common.h).
 */

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "ptc/ptc.h"

/* Longest URI accepted, in bytes. */
#define MLFS_SRC_MAX_URI 4096

/* Options of a source. Zero (or negative, where noted) fields take defaults. */
struct mlfs_src_opts {
	int64_t cache_bytes;	   /* block cache bound; <= 0: 1 GiB */
	int64_t block_bytes;	   /* cache block; <= 0: 1 MiB */
	int retries;		   /* extra attempts after a failed request; < 0: 5 (at most 100) */
	int timeout_ms;		   /* HTTP: a request that receives nothing this long (connecting
				      included) fails and is retried; <= 0: 10000 */
	int deadline_ms;	   /* HTTP: one readv or fetch, every attempt and backoff included,
				      fails after this long; <= 0: 60000 */
	int backoff_ms;		   /* first retry delay, doubled each retry; <= 0: 20 */
	int max_backoff_ms;	   /* cap of one retry delay; <= 0: 2000 */
	int64_t max_request_bytes; /* cap of one coalesced request; <= 0: 16 MiB (>= one block) */
	int parallel;		   /* concurrent requests of one readv; <= 0: 8 (at most 64) */
	bool file_direct;	   /* file:// ranges bypass the block cache (see readv) */
};

struct mlfs_src;

/*
 * A new source with options @o (NULL: all defaults). Initialises libcurl
 * globally once per process (pthread_once). Returns NULL when out of memory
 * or when libcurl cannot be initialised. Free with mlfs_src_free.
 */
struct mlfs_src *mlfs_src_new(const struct mlfs_src_opts *o);

/* Frees @s (NULL is fine): cached blocks, open files, HTTP connections. */
void mlfs_src_free(struct mlfs_src *s);

/*
 * Reads a whole object of at most @max bytes (an index, an offsets table),
 * bypassing the block cache. On success returns 0, *@data (malloc'd, owned
 * by the caller, never NULL, not NUL-terminated) and *@len. Over HTTP: a GET
 * without Range that must answer 200, retried like mlfs_src_readv.
 *
 * A file must be a regular file: it is opened without blocking (a FIFO
 * or a device is refused, never waited on).
 *
 * Errors (*@data = NULL, *@len = 0, one line in @err, its code the errno
 * returned; @err may be NULL):
 *   -EINVAL  bad or unsupported URI, or @max < 0
 *   -EFBIG   the object holds more than @max bytes
 *   -EIO     unreadable: the message names the URI and the reason, e.g.
 *            "http://h/index.json: HTTP 503 after 6 attempts",
 *            "file:///d/index.json: not a regular file",
 *            "http://h/index.json: timed out (nothing received for 10 s) after
 *            4 attempts, deadline of 60 s reached"
 *   -ENOMEM  out of memory
 */
int mlfs_src_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data, size_t *len,
		   struct ptc_error *err);

/* Bytes [off, off + len) of object @uri, to be copied to @dst. */
struct mlfs_range {
	const char *uri;
	int64_t off, len;
	void *dst;
};

/*
 * Fills the @len bytes at each @r[i].dst with bytes [off, off + len) of
 * object @r[i].uri, through the cache. Missing blocks are fetched together:
 * runs of adjacent missing blocks of one object become one request of at
 * most max_request_bytes, up to opts.parallel requests at once. Ranges may
 * overlap and name any number of objects; zero-length ranges are ignored.
 *
 * With opts.file_direct, file:// ranges skip the block cache (the kernel's
 * page cache already holds file data): runs of adjacent ranges are read
 * with one preadv straight into their dsts, first without waiting for I/O
 * (RWF_NOWAIT: served from the page cache on the caller's thread), the rest
 * on up to opts.parallel threads so a cold disk sees many requests at once.
 *
 * HTTP requests are retried (connection errors, timeouts, 5xx, 408, 429,
 * short or wrong replies) until opts.retries are spent or opts.deadline_ms
 * has passed since the call began, whichever comes first; a request that
 * receives nothing for opts.timeout_ms is a failed attempt, a slow one that
 * keeps receiving is not.
 *
 * All or nothing: returns 0 when every range was filled, else an error and
 * the dst bytes are unspecified (partly written). Errors, with one line in
 * @err (conventions of mlfs_src_fetch):
 *   -EINVAL  a bad or unsupported URI, a negative offset or length
 *   -EIO     an object unreadable after the retries or the deadline, not a
 *            regular file, or a range past its end; the message names the
 *            URI and the reason, e.g.
 *            "http://h/x.bin: HTTP 500 after 6 attempts",
 *            "file:///d/s.bin: holds 100 bytes, bytes 96-131 asked"
 *   -ENOMEM  out of memory
 * Thread-safe; the ranges and dsts are borrowed for the call only.
 */
int mlfs_src_readv(struct mlfs_src *s, const struct mlfs_range *r, size_t n, struct ptc_error *err);

/* Counters since mlfs_src_new; a snapshot (not one atomic read). */
struct mlfs_src_stats {
	int64_t hits;	       /* blocks a readv found in the cache */
	int64_t misses;	       /* blocks a readv had to fetch */
	int64_t requests;      /* requests sent, every attempt counted (file reads, HTTP) */
	int64_t retries;       /* of those, the repeated attempts */
	int64_t failures;      /* requests that failed for good (after their retries) */
	int64_t bytes_fetched; /* bytes of successful replies (direct file reads too) */
	int64_t direct_reads;  /* file_direct spans read (a copy from a mapping or a preadv) */
	int64_t cached_bytes;  /* bytes now in the cache (<= cache_bytes) */
	int64_t cached_blocks; /* blocks now in the cache */
};

void mlfs_src_stats(struct mlfs_src *s, struct mlfs_src_stats *out);

/*
 * @ref resolved against @base (a URI with a scheme, e.g. an index's URI):
 * @ref itself when it has a scheme ("file://", "http://", "https://", or any
 * other "scheme://", which mlfs_src_* then refuse), else @base's directory
 * (up to its last '/', ignoring any "?query" or "#fragment") followed by
 * @ref. Refuses (NULL) an empty @ref, one that starts with '/' or holds a
 * ".." path component, and a @base without a scheme.
 * Returns a malloc'd string owned by the caller, NULL on error or ENOMEM.
 */
char *mlfs_uri_join(const char *base, const char *ref);

/*
 * Views (mlfs_data.c, mlfs_dataindex.c): records of a step for a DP rank, assembled
 * from the shards (above) in the order of ptc_data_perm.
 */

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "ptc/ptc.h"
#include "transform/xf.h"

struct mlfs_data_opts {
	int64_t cache_bytes;  /* block cache bound (--data-cache); 0 = 1 GiB */
	int prefetch;	      /* steps assembled ahead per DP group (--prefetch) */
	int http_timeout_ms;  /* an HTTP request receiving nothing this long fails
				 (--http-timeout); 0 = 10 s */
	int http_deadline_ms; /* one read of a source, HTTP retries included
				 (--http-deadline); 0 = 60 s */
};

struct mlfs_dataset;

/* Opens the dataset of config @c (has_dataset): reads and checks the index
 * and, for variable records, every shard's offsets. 0, or -EINVAL with @err
 * "config.json: dataset.index <uri>: <why>", -ENOMEM. Starts the prefetch
 * thread. Blocking I/O: call without locks held. */
int mlfs_dataset_open(const struct ptc_config *c, const struct mlfs_data_opts *o,
		      struct xf_mem *mem, struct mlfs_dataset **out, struct ptc_error *err);
struct mlfs_dataset *mlfs_dataset_get(struct mlfs_dataset *ds);
void mlfs_dataset_put(struct mlfs_dataset *ds);
/* Whether @ds is the dataset @c names (same index URI). */
bool mlfs_dataset_is(const struct mlfs_dataset *ds, const struct ptc_config *c);
const struct ptc_index *mlfs_dataset_index(const struct mlfs_dataset *ds);

/* The files of a view. */
enum mlfs_dfile { MLFS_DF_NPY, MLFS_DF_IDS, MLFS_DF_BIN, MLFS_DF_OFFSETS };

/* Longest window of steps one file may hold ("<s>-<e>.npy"). */
#define MLFS_DATA_WINDOW_MAX 64

/* Parses a view name ("12.npy", "12.ids.npy", "12.bin", "12.offsets.npy";
 * for fixed records also windows "12-20.npy", "12-20.ids.npy": steps
 * [12, 20)) of @n bytes: its first step, its kind and *@nsteps, 0 for a
 * step's view, e - s for a window of at most MLFS_DATA_WINDOW_MAX steps.
 * -ENOENT when it is none or not of this dataset's kind. */
int mlfs_data_name(const struct mlfs_dataset *ds, const char *name, size_t n, int64_t *step,
		   int64_t *nsteps, enum mlfs_dfile *kind);
/* Formats the name of (@step, @kind) into @buf. */
void mlfs_data_format_name(int64_t step, enum mlfs_dfile kind, char *buf, size_t cap);

/* The stream samples [*first, *first + *count) of DP rank @d of @dp at
 * @step; -ENODATA when the step is before the cursor or past the last epoch. */
int mlfs_data_slice(const struct mlfs_dataset *ds, const struct ptc_cursor *c, int64_t step, int d,
		    int64_t *first, int64_t *count);

/* The slices of DP rank @d at steps [@step, @step + @nsteps): firsts[i]
 * (when @firsts is not NULL) and their common *@count. -ENODATA when a
 * step has none, -EINVAL when their lengths differ (the last batch of a
 * run, or a change of dp or global_batch within the window). */
int mlfs_data_window(const struct mlfs_dataset *ds, const struct ptc_cursor *c, int64_t step,
		     int64_t nsteps, int d, int64_t *firsts, int64_t *count);

/* Size in bytes of file @kind of the view of samples [first, first+count),
 * or with @nsteps > 0 of a window of @nsteps such views (fixed records:
 * arrays [nsteps, count, ...]); its .npy header (if any) is formatted into
 * @hdr. Cheap: no shard I/O. */
int64_t mlfs_data_file_size(const struct mlfs_dataset *ds, int64_t first, int64_t count,
			    int64_t nsteps, enum mlfs_dfile kind, char *hdr, size_t cap,
			    size_t *hlen);

/* An assembled view: the records of samples [first, first + count). */
struct mlfs_dview {
	atomic_int refs;
	struct mlfs_dataset *ds; /* outlives its views: every holder holds it too */
	int64_t first, count;
	struct xf_buf *data;		/* the records, back to back (maybe a larger buffer) */
	int64_t len;			/* bytes of records in data */
	int64_t *ids;			/* [count] */
	int64_t *offs;			/* [count + 1] byte offsets into data */
	int state;			/* 0 being assembled, 1 ready, < 0 failed (-errno) */
	bool counted;			/* its bytes are in the cache's cached_bytes */
	struct mlfs_dview *prev, *next; /* cache LRU */
};

/* The assembled view of [first, first+count): from the cache, from a
 * prefetch in progress (waits), or assembled now. 0, -EIO (@err names the
 * shard and the reason), -ENOSPC, -ENOMEM. */
int mlfs_data_get(struct mlfs_dataset *ds, int64_t first, int64_t count, struct mlfs_dview **out,
		  struct ptc_error *err);
void mlfs_dview_put(struct mlfs_dview *v);
/* The body of file @kind of @v (after its header). */
void mlfs_dview_body(const struct mlfs_dview *v, enum mlfs_dfile kind, const uint8_t **body,
		     size_t *len);

/* Queues the views of DP rank @d for steps [from, from + max(prefetch, @n))
 * for assembly in the background (those not cached). */
void mlfs_data_prefetch(struct mlfs_dataset *ds, const struct ptc_cursor *c, int d, int64_t from,
			int64_t n);

/* Figures for status.json (new reference). */
json_t *mlfs_data_status(struct mlfs_dataset *ds);

#endif
