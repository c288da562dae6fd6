/*
 * ptc_data.c - the dataset: index.json, the per-epoch order and the cursor.
 *
 * The samples of a job form one stream: epoch e's records, permuted by
 * (seed, e), then epoch e+1's. Step s of a config consumes global_batch
 * samples from a cursor; a reconfiguration starts a new cursor segment at
 * the saved step, so batch boundaries move but the stream does not.
 *
 * The permutation is a Feistel network over the smallest even number of
 * bits covering n, with cycle walking: O(1) memory and random access, so a
 * view of any step is computed without materializing an epoch.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

#define MAX_RECORDS ((int64_t)1 << 48)
#define MAX_SHARDS  (1 << 24)

static const char *const index_keys[] = {"records", "dtype", "shape", "shards", NULL};
static const char *const shard_keys[] = {"uri", "count", "offsets", NULL};

void ptc_index_free(struct ptc_index *ix)
{
	if (!ix)
		return;
	for (int i = 0; i < ix->nshards; i++) {
		free(ix->shards[i].uri);
		free(ix->shards[i].offsets);
	}
	free(ix->shards);
	free(ix);
}

static int parse_shard(struct ptc_index *ix, const json_t *o, size_t i, const char *file,
		       struct ptc_error *err)
{
	struct ptc_shard *sh = &ix->shards[ix->nshards];
	char where[48];

	snprintf(where, sizeof(where), "shards[%zu]", i);
	if (!json_is_object(o))
		return ptc_errorf(err, "%s: shards[%zu] must be an object", file, i);
	if (ptc_json_known(o, shard_keys, file, where, err))
		return -EINVAL;
	const json_t *uri = json_object_get(o, "uri"), *off = json_object_get(o, "offsets");
	if (!json_is_string(uri) || !*json_string_value(uri))
		return ptc_errorf(err, "%s: shards[%zu].uri must be a non-empty string", file, i);
	if (ix->records == PTC_RECORDS_VARIABLE &&
	    (!json_is_string(off) || !*json_string_value(off)))
		return ptc_errorf(
		    err, "%s: shards[%zu].offsets must name the offsets of variable records", file,
		    i);
	if (ix->records == PTC_RECORDS_FIXED && off)
		return ptc_errorf(err, "%s: shards[%zu].offsets is only for variable records", file,
				  i);
	if (ptc_json_int(o, "count", true, 0, MAX_RECORDS, &sh->count, file, where, err))
		return -EINVAL;
	sh->first = ix->total;
	if (ix->total + sh->count > MAX_RECORDS)
		return ptc_errorf(
		    err, "%s: shards[%zu].count = %" PRId64 " makes more than %" PRId64 " records",
		    file, i, sh->count, MAX_RECORDS);
	ix->total += sh->count;
	if (!(sh->uri = strdup(json_string_value(uri))) ||
	    (off && !(sh->offsets = strdup(json_string_value(off))))) {
		free(sh->uri);
		return -ENOMEM;
	}
	ix->nshards++;
	return 0;
}

int ptc_index_parse(const json_t *root, const char *file, struct ptc_index **out,
		    struct ptc_error *err)
{
	struct ptc_index *ix;
	int rc;

	*out = NULL;
	if (!json_is_object(root))
		return ptc_errorf(err, "%s: must be a JSON object", file);
	if (ptc_json_known(root, index_keys, file, "", err))
		return -EINVAL;
	if (!(ix = calloc(1, sizeof(*ix))))
		return -ENOMEM;
	rc = -EINVAL;
	const char *rec = json_string_value(json_object_get(root, "records"));
	if (!rec || (strcmp(rec, "fixed") && strcmp(rec, "variable"))) {
		ptc_errorf(err, "%s: \"records\" must be \"fixed\" or \"variable\"", file);
		goto err;
	}
	ix->records = strcmp(rec, "fixed") == 0 ? PTC_RECORDS_FIXED : PTC_RECORDS_VARIABLE;
	const json_t *dt = json_object_get(root, "dtype");
	ix->dtype = PTC_UINT8;
	if (!dt && ix->records == PTC_RECORDS_FIXED) {
		ptc_errorf(err, "%s: \"dtype\" is required for fixed records", file);
		goto err;
	}
	if (dt && !json_is_string(dt)) {
		ptc_errorf(err, "%s: \"dtype\" must be a string", file);
		goto err;
	}
	if (dt && ptc_dtype_parse(json_string_value(dt), &ix->dtype)) {
		ptc_errorf(err, "%s: \"dtype\" = \"%s\" is not a known dtype", file,
			   json_string_value(dt));
		goto err;
	}
	const json_t *shape = json_object_get(root, "shape");
	if (ix->records == PTC_RECORDS_VARIABLE && shape) {
		ptc_errorf(err, "%s: \"shape\" is only for fixed records", file);
		goto err;
	}
	ix->record_bytes = (int64_t)ptc_dtype_size(ix->dtype);
	if (ix->records == PTC_RECORDS_FIXED) {
		/* a view adds the batch dimension */
		if (!json_is_array(shape) || json_array_size(shape) > PTC_MAX_DIMS - 1) {
			ptc_errorf(err, "%s: \"shape\" must be an array of at most %d sizes", file,
				   PTC_MAX_DIMS - 1);
			goto err;
		}
		ix->ndim = (int)json_array_size(shape);
		for (int d = 0; d < ix->ndim; d++) {
			const json_t *v = json_array_get(shape, (size_t)d);
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    json_integer_value(v) > PTC_MAX_RECORD_BYTES ||
			    ix->record_bytes * json_integer_value(v) > PTC_MAX_RECORD_BYTES) {
				ptc_errorf(err,
					   "%s: shape[%d] must be a positive size (records of at "
					   "most %" PRId64 " bytes)",
					   file, d, PTC_MAX_RECORD_BYTES);
				goto err;
			}
			ix->shape[d] = json_integer_value(v);
			ix->record_bytes *= ix->shape[d];
		}
	}
	const json_t *shards = json_object_get(root, "shards");
	size_t n = json_array_size(shards);
	if (!json_is_array(shards) || n == 0 || n > MAX_SHARDS) {
		ptc_errorf(err, "%s: \"shards\" must be a non-empty array (at most %d)", file,
			   MAX_SHARDS);
		goto err;
	}
	rc = -ENOMEM;
	if (!(ix->shards = calloc(n, sizeof(*ix->shards))))
		goto err;
	for (size_t i = 0; i < n; i++)
		if ((rc = parse_shard(ix, json_array_get(shards, i), i, file, err)))
			goto err;
	if (ix->total == 0) {
		rc = ptc_errorf(err, "%s: \"shards\" hold no records (every count is 0)", file);
		goto err;
	}
	*out = ix;
	return 0;
err:
	ptc_index_free(ix);
	return rc;
}

PTC_DEFINE_PARSE_TEXT(ptc_index_parse_text, ptc_index_parse, struct ptc_index)

int ptc_index_locate(const struct ptc_index *ix, int64_t id, int64_t *local)
{
	int lo = 0, hi = ix->nshards - 1;
	while (lo < hi) { /* the last shard whose first <= id */
		int mid = lo + (hi - lo + 1) / 2;
		if (ix->shards[mid].first <= id)
			lo = mid;
		else
			hi = mid - 1;
	}
	while (lo < ix->nshards - 1 && ix->shards[lo].count == 0) /* empty shards share a first */
		lo++;
	*local = id - ix->shards[lo].first;
	return lo;
}

/* ------------------------------------------------------------------ order */

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

int64_t ptc_data_perm(uint64_t seed, int64_t epoch, int64_t n, int64_t i, bool shuffle)
{
	if (!shuffle || n <= 1)
		return i;
	int half = 1;
	while (half < 32 && ((uint64_t)1 << (2 * half)) < (uint64_t)n)
		half++; /* 4^32 would shift past 64 bits; 2^64 covers any n */
	uint64_t mask = ((uint64_t)1 << half) - 1, key = mix64(seed ^ mix64((uint64_t)epoch));
	uint64_t x = (uint64_t)i;
	do { /* cycle walking: a permutation of [0, 4^half) restricted to [0, n) */
		uint64_t l = x >> half, r = x & mask;
		for (uint64_t round = 0; round < 6; round++) {
			uint64_t f = mix64(key ^ (r * 0x100000001b3ull + round)) & mask;
			uint64_t t = l ^ f;
			l = r;
			r = t;
		}
		x = l << half | r;
	} while (x >= (uint64_t)n);
	return (int64_t)x;
}

/* ----------------------------------------------------------------- cursor */

/* The segment of @step, or NULL before the first. */
static const struct ptc_cursor_seg *cursor_seg(const struct ptc_cursor *c, int64_t step)
{
	int k = c->nsegs - 1;
	while (k > 0 && c->segs[k].step > step)
		k--;
	return k < 0 || step < c->segs[k].step ? NULL : &c->segs[k];
}

int ptc_cursor_samples(const struct ptc_cursor *c, int64_t step, int64_t *samples, int64_t *batch)
{
	const struct ptc_cursor_seg *s = cursor_seg(c, step);
	int64_t n, first, end;
	/* The step's last sample must be representable too: callers add the batch. */
	if (!s || __builtin_mul_overflow(step - s->step, s->batch, &n) ||
	    __builtin_add_overflow(n, s->sample, &first) ||
	    __builtin_add_overflow(first, s->batch, &end))
		return -ENODATA;
	*samples = first;
	*batch = s->batch;
	return 0;
}

int ptc_cursor_dp(const struct ptc_cursor *c, int64_t step)
{
	int64_t samples, batch;
	return ptc_cursor_samples(c, step, &samples, &batch) ? 0 : cursor_seg(c, step)->dp;
}

int ptc_data_slice(const struct ptc_cursor *c, int64_t step, int dp, int d, int64_t limit,
		   int64_t *first, int64_t *count)
{
	int64_t base, batch;
	if (dp < 1 || d < 0 || d >= dp)
		return -EINVAL;
	if (ptc_cursor_samples(c, step, &base, &batch))
		return -ENODATA;
	/* The last step is the one whose batch starts before @limit; its batch
	 * stops there, so every DP rank agrees on it and nothing is dropped. */
	if (limit > 0) {
		if (base >= limit)
			return -ENODATA;
		if (batch > limit - base)
			batch = limit - base;
	}
	int64_t q = batch / dp, rem = batch % dp;
	*first = base + d * q + (d < rem ? d : rem);
	*count = q + (d < rem);
	return 0;
}

int ptc_cursor_advance(struct ptc_cursor *c, int64_t step, int64_t batch, int dp)
{
	int64_t samples, old;
	if (batch < 1 || dp < 1 || ptc_cursor_samples(c, step, &samples, &old))
		return -ERANGE;
	while (c->nsegs > 1 && c->segs[c->nsegs - 1].step > step)
		c->nsegs--; /* resumed from an earlier step: those segments never ran */
	struct ptc_cursor_seg *last = &c->segs[c->nsegs - 1];
	if (old == batch && last->dp == dp)
		return 0;
	if (last->step == step) {
		/* No step ran under the last segment: rewrite it, or drop it when the
		 * one before goes on like this (adjacent segments differ). */
		if (c->nsegs > 1 && last[-1].batch == batch && last[-1].dp == dp) {
			c->nsegs--;
		} else {
			last->batch = batch;
			last->dp = dp;
		}
		return 0;
	}
	struct ptc_cursor_seg *s = realloc(c->segs, (size_t)(c->nsegs + 1) * sizeof(*s));
	if (!s)
		return -ENOMEM;
	c->segs = s;
	c->segs[c->nsegs++] = (struct ptc_cursor_seg){step, samples, batch, dp};
	return 0;
}

int ptc_dataset_change_ok(const struct ptc_config *a, const struct ptc_config *b, const char *file,
			  struct ptc_error *err)
{
	if (!a->has_dataset || !b->has_dataset)
		return 0;
	if (strcmp(a->dataset_index, b->dataset_index) != 0)
		return ptc_errorf(
		    err, "%s: dataset.index may not change in a reconfiguration (%s -> %s)", file,
		    a->dataset_index, b->dataset_index);
	if (a->dataset_seed != b->dataset_seed)
		return ptc_errorf(err,
				  "%s: dataset.seed may not change in a reconfiguration (%" PRIu64
				  " -> %" PRIu64 "): the order of the run would change",
				  file, a->dataset_seed, b->dataset_seed);
	if (a->dataset_shuffle != b->dataset_shuffle)
		return ptc_errorf(err, "%s: dataset.shuffle may not change in a reconfiguration",
				  file);
	if (a->dataset_epochs != b->dataset_epochs)
		return ptc_errorf(err, "%s: dataset.epochs may not change in a reconfiguration",
				  file);
	return 0;
}
