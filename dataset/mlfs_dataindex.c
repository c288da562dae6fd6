/*
 * mlfs_dataindex.c - a dataset's index and names: reading the index and
 * the per-shard offset tables, the names of the view files under
 * ranks/<r>/data/ (steps, windows, kinds), and their sizes.
 *
 * Threads: any; the sizes cache has its own leaf lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset_i.h"

/* ----------------------------------------------------------- names, sizes */

/* Parses the decimal number at @name (no leading zero) into *@v; returns
 * its length, 0 when there is none. */
static size_t parse_step(const char *name, size_t n, int64_t *v)
{
	size_t digits = 0;
	int64_t s = 0;

	while (digits < n && name[digits] >= '0' && name[digits] <= '9') {
		if (s > (INT64_MAX - 9) / 10)
			return 0;
		s = s * 10 + (name[digits++] - '0');
	}
	if (digits > 1 && name[0] == '0')
		return 0;
	*v = s;
	return digits;
}

int mlfs_data_name(const struct mlfs_dataset *ds, const char *name, size_t n, int64_t *step,
		   int64_t *nsteps, enum mlfs_dfile *kind)
{
	static const struct {
		const char *suffix;
		enum mlfs_dfile kind;
		bool fixed, variable;
	} kinds[] = {
	    {".ids.npy", MLFS_DF_IDS, true, true},
	    {".offsets.npy", MLFS_DF_OFFSETS, false, true},
	    {".npy", MLFS_DF_NPY, true, false},
	    {".bin", MLFS_DF_BIN, false, true},
	};
	int64_t s, e = -1;
	size_t digits = parse_step(name, n, &s), more;

	if (digits == 0)
		return -ENOENT;
	if (digits < n && name[digits] == '-') { /* a window [s, e) */
		if (!(more = parse_step(name + digits + 1, n - digits - 1, &e)) || e <= s ||
		    e - s > MLFS_DATA_WINDOW_MAX)
			return -ENOENT;
		digits += 1 + more;
	}
	bool fixed = ds->ix->records == PTC_RECORDS_FIXED;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		size_t k = strlen(kinds[i].suffix);
		if (n - digits == k && memcmp(name + digits, kinds[i].suffix, k) == 0) {
			if (fixed ? !kinds[i].fixed : !kinds[i].variable)
				return -ENOENT;
			/* windows: fixed records only, and a step dimension more */
			if (e >= 0 && (!fixed || ds->ix->ndim + 2 > PTC_MAX_DIMS))
				return -ENOENT;
			*step = s;
			*nsteps = e >= 0 ? e - s : 0;
			*kind = kinds[i].kind;
			return 0;
		}
	}
	return -ENOENT;
}

void mlfs_data_format_name(int64_t step, enum mlfs_dfile kind, char *buf, size_t cap)
{
	static const char *const suffix[] = {".npy", ".ids.npy", ".bin", ".offsets.npy"};
	snprintf(buf, cap, "%" PRId64 "%s", step, suffix[kind]);
}

int mlfs_data_slice(const struct mlfs_dataset *ds, const struct ptc_cursor *c, int64_t step, int d,
		    int64_t *first, int64_t *count)
{
	int64_t limit = 0; /* no epoch limit, or one past int64 */
	if (ds->epochs && __builtin_mul_overflow(ds->epochs, ds->ix->total, &limit))
		limit = 0;
	/* Steps keep the dp they ran with: a DP rank that step did not have has
	 * no view of it. */
	return ptc_data_slice(c, step, ptc_cursor_dp(c, step), d, limit, first, count) ? -ENODATA
										       : 0;
}

int64_t mlfs_data_file_size(const struct mlfs_dataset *ds, int64_t first, int64_t count,
			    int64_t nsteps, enum mlfs_dfile kind, char *hdr, size_t cap,
			    size_t *hlen)
{
	const struct ptc_index *ix = ds->ix;
	int64_t shape[PTC_MAX_DIMS + 2] = {nsteps, count};
	int w = nsteps > 0; /* a window: the steps are the first dimension */
	int64_t n = nsteps > 0 ? nsteps * count : count;

	*hlen = 0;
	switch (kind) {
	case MLFS_DF_NPY:
		memcpy(shape + 2, ix->shape, (size_t)ix->ndim * sizeof(int64_t));
		*hlen = mlfs_npy_format(ix->dtype, ix->ndim + 1 + w, shape + 1 - w, hdr, cap);
		return (int64_t)*hlen + n * ix->record_bytes;
	case MLFS_DF_IDS:
		*hlen = mlfs_npy_format(PTC_INT64, 1 + w, shape + 1 - w, hdr, cap);
		return (int64_t)*hlen + n * 8;
	case MLFS_DF_OFFSETS:
		shape[0] = count + 1;
		*hlen = mlfs_npy_format(PTC_INT64, 1, shape, hdr, cap);
		return (int64_t)*hlen + (count + 1) * 8;
	case MLFS_DF_BIN: {
		struct sizes *c = ds->sizes;
		int64_t total = 0, id, local;
		size_t k =
		    (size_t)(((uint64_t)first * 0x9e3779b97f4a7c15ull ^ (uint64_t)count) >> 56) %
		    SIZE_SLOTS;
		pthread_mutex_lock(&c->lock);
		bool hit = count && c->e[k].count == count && c->e[k].first == first;
		total = hit ? c->e[k].bytes : 0;
		pthread_mutex_unlock(&c->lock);
		if (hit)
			return total;
		for (int64_t j = 0; j < count; j++) {
			int sh = mlfs_data_sample_record(ds, first + j, &id, &local);
			total += mlfs_data_record_len(ds, sh, local);
		}
		pthread_mutex_lock(&c->lock);
		c->e[k].first = first;
		c->e[k].count = count;
		c->e[k].bytes = total;
		pthread_mutex_unlock(&c->lock);
		return total;
	}
	}
	return 0;
}

int mlfs_data_window(const struct mlfs_dataset *ds, const struct ptc_cursor *c, int64_t step,
		     int64_t nsteps, int d, int64_t *firsts, int64_t *count)
{
	int rc = 0;

	for (int64_t i = nsteps - 1; i >= 0; i--) { /* the last first: past the end? */
		int64_t first, n;
		int err = mlfs_data_slice(ds, c, step + i, d, &first, &n);
		if (err)
			return err;
		if (i < nsteps - 1 && n != *count)
			rc = -EINVAL;
		*count = n;
		if (firsts)
			firsts[i] = first;
	}
	return rc;
}

/* ----------------------------------------------------------------- open */

/* Reads shard @i's offsets (raw little-endian int64 or an int64 .npy). */
static int load_offsets(struct mlfs_dataset *ds, int i, const char *uri, struct ptc_error *err)
{
	const struct ptc_shard *sh = &ds->ix->shards[i];
	int64_t n = sh->count + 1;
	uint8_t *data;
	size_t len;
	struct mlfs_npy h;
	int rc = mlfs_src_fetch(ds->src, uri, n * 8 + 4096, &data, &len, err);

	if (rc)
		return rc == -EFBIG ? ptc_errorf(err,
						 "%s: larger than %" PRId64 " offsets of %" PRId64
						 " records",
						 uri, n, sh->count)
				    : rc;
	size_t skip = 0;
	if (len >= 6 && memcmp(data, "\x93NUMPY", 6) == 0) {
		struct ptc_error e;
		if (mlfs_npy_parse(data, len, &h, &e) || mlfs_npy_check(&h, PTC_INT64, 1, &n, &e)) {
			ptc_errorf(err, "%s: %s", uri, e.text);
			free(data);
			return -EINVAL;
		}
		skip = h.header_len;
	}
	if ((int64_t)(len - skip) != n * 8) {
		ptc_errorf(err,
			   "%s: holds %zu bytes of offsets, expected %" PRId64 " (count + 1 int64)",
			   uri, len - skip, n * 8);
		free(data);
		return -EINVAL;
	}
	if (!(ds->offs[i] = malloc((size_t)n * sizeof(int64_t)))) {
		free(data);
		return -ENOMEM;
	}
	memcpy(ds->offs[i], data + skip, (size_t)n * 8);
	free(data);
	for (int64_t k = 0; k < n; k++) {
		int64_t o = ds->offs[i][k], prev = k ? ds->offs[i][k - 1] : 0;
		if (o < 0 || (k && (o < prev || o - prev > PTC_MAX_RECORD_BYTES)))
			return ptc_errorf(err,
					  "%s: offset %" PRId64 " = %" PRId64
					  " is not a valid record boundary (offsets must not "
					  "decrease; records are at most %" PRId64 " bytes)",
					  uri, k, o, PTC_MAX_RECORD_BYTES);
	}
	return 0;
}

int mlfs_data_load_index(struct mlfs_dataset *ds, struct ptc_error *err)
{
	uint8_t *text;
	size_t len;
	struct ptc_error perr;
	int rc = mlfs_src_fetch(ds->src, ds->index_uri, MAX_INDEX_BYTES, &text, &len, err);

	if (rc == -EFBIG)
		snprintf(err->text, sizeof(err->text), "larger than %" PRId64 " bytes",
			 MAX_INDEX_BYTES);
	if (rc) {
		err->code = rc == -ENOMEM ? rc : -EINVAL;
		return err->code;
	}
	rc = ptc_index_parse_text((const char *)text, len, "index.json", &ds->ix, &perr);
	free(text);
	if (rc)
		return ptc_error_set(err, rc, "%s", perr.text);
	int n = ds->ix->nshards;
	if (!(ds->uris = calloc((size_t)n, sizeof(*ds->uris))) ||
	    !(ds->offs = calloc((size_t)n, sizeof(*ds->offs))))
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		const struct ptc_shard *sh = &ds->ix->shards[i];
		if (!(ds->uris[i] = mlfs_uri_join(ds->index_uri, sh->uri)))
			return ptc_errorf(err,
					  "index.json: shards[%d].uri \"%s\" is not a valid URI", i,
					  sh->uri);
		if (ds->ix->records != PTC_RECORDS_VARIABLE)
			continue;
		char *off = mlfs_uri_join(ds->index_uri, sh->offsets);
		if (!off)
			return ptc_errorf(
			    err, "index.json: shards[%d].offsets \"%s\" is not a valid URI", i,
			    sh->offsets);
		rc = load_offsets(ds, i, off, err);
		free(off);
		if (rc) {
			err->code = rc == -ENOMEM ? rc : -EINVAL;
			return err->code;
		}
	}
	return 0;
}
