/*
 * mlfs_data.h - dataset views: records of a step for a DP rank, assembled
 * from the shards (mlfs_source.h) in the order of ptc_data_perm.
 */
#ifndef MLFS_MLFS_DATA_H
#define MLFS_MLFS_DATA_H

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
 * prefetch in progress (waits), or assembled now. 0, -EIO (@why names the
 * shard and the reason), -ENOSPC, -ENOMEM. */
int mlfs_data_get(struct mlfs_dataset *ds, int64_t first, int64_t count, struct mlfs_dview **out,
		  char *why, size_t whylen);
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
