/*
 * mlfs_data.c - dataset views: the records of one step for one DP rank.
 *
 * DESIGN
 * A view is named by its stream samples [first, first + count): the same
 * slice has the same bytes under any config, so assembled views are cached
 * by slice and survive reconfigurations that keep the slice. Assembly maps
 * each sample to its record (ptc_data_perm, ptc_index_locate) and reads all
 * records of the view in one mlfs_src_readv: file:// records are copied
 * from the shards' mappings (the page cache), HTTP ones coalesced into
 * block requests through the byte-bounded block cache. A window of steps
 * (mount/mlfs_resolve.c) is the views of its steps, each assembled and cached alone.
 *
 * A prefetch thread assembles the views of the next steps of each local DP
 * group (the next window's, after a window); a reader that asks for a view
 * being assembled waits for it rather than reading the shards twice. A
 * failed assembly is not cached: the next open tries again. Freed views'
 * buffers are kept for new views (as many as views may be cached): fresh
 * pages cost more than the copy into them.
 *
 * Threads: FUSE workers and the prefetch thread call mlfs_data_get; ds->lock
 * guards the view cache, the queue and the figures. No lock is held during
 * shard I/O.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset_i.h"

/* ---------------------------------------------------------------- views */

/* The memory the dataset may keep for views nobody reads: the cache's ready
 * views up to an eighth of --max-memory, the pool up to a 32nd (checkpoints
 * and reconfigurations share the bound). */
static int64_t mem_share(const struct mlfs_dataset *ds, int div)
{
	int64_t limit = ds->mem && ds->mem->limit > 0 ? ds->mem->limit : (int64_t)8 << 30;
	return limit / div;
}

static void drop_idle(struct mlfs_dataset *ds);

/* Lets the cache hold @n views, and the pool as many buffers. */
static void set_maxviews(struct mlfs_dataset *ds, int n)
{
	ds->maxviews = n;
	atomic_store(&ds->pool_max, n < POOL_SLOTS ? n : POOL_SLOTS);
}

/* A buffer of at least @len bytes for a view: a pooled one that is not much
 * larger, or a new one. NULL with *rc set. */
static struct xf_buf *buf_get(struct mlfs_dataset *ds, int64_t len, int *rc)
{
	int best = -1;
	pthread_mutex_lock(&ds->pool_lock);
	for (int i = 0; i < ds->npool; i++) {
		int64_t cap = ds->pool[i]->size;
		if (cap >= len && cap - len <= len / 8 + 4096 &&
		    (best < 0 || cap < ds->pool[best]->size))
			best = i;
	}
	struct xf_buf *b = best < 0 ? NULL : ds->pool[best];
	if (b) {
		ds->pool[best] = ds->pool[--ds->npool];
		ds->pool_bytes -= b->size;
	}
	pthread_mutex_unlock(&ds->pool_lock);
	if (b || (b = xf_buf_new(ds->mem, len, rc)) || *rc != -ENOSPC)
		return b;
	drop_idle(ds); /* --max-memory reached: give back what nobody reads */
	return xf_buf_new(ds->mem, len, rc);
}

/* Keeps @b for reuse when the pool has room (the newest win). */
static void buf_put(struct mlfs_dataset *ds, struct xf_buf *b)
{
	if (!b)
		return;
	struct xf_buf *drop[POOL_SLOTS + 1];
	int ndrop = 0;
	pthread_mutex_lock(&ds->pool_lock);
	if (atomic_load(&b->refs) != 1 || b->size > mem_share(ds, 32)) {
		drop[ndrop++] = b;
	} else { /* the oldest go first */
		while (ds->npool && (ds->npool >= atomic_load(&ds->pool_max) ||
				     ds->pool_bytes + b->size > mem_share(ds, 32))) {
			drop[ndrop++] = ds->pool[0];
			ds->pool_bytes -= ds->pool[0]->size;
			ds->pool[0] = ds->pool[--ds->npool];
		}
		ds->pool[ds->npool++] = b;
		ds->pool_bytes += b->size;
	}
	pthread_mutex_unlock(&ds->pool_lock);
	while (ndrop)
		xf_buf_put(drop[--ndrop]);
}

void mlfs_dview_put(struct mlfs_dview *v)
{
	if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	buf_put(v->ds, v->data);
	free(v->ids);
	free(v->offs);
	free(v);
}

static void lru_unlink(struct mlfs_dataset *ds, struct mlfs_dview *v)
{
	if (v->counted)
		ds->cached_bytes -= v->len;
	v->counted = false;
	*(v->prev ? &v->prev->next : &ds->head) = v->next;
	*(v->next ? &v->next->prev : &ds->tail) = v->prev;
	v->prev = v->next = NULL;
	ds->nviews--;
}

static void lru_push(struct mlfs_dataset *ds, struct mlfs_dview *v)
{
	v->prev = NULL;
	v->next = ds->head;
	*(ds->head ? &ds->head->prev : &ds->tail) = v;
	ds->head = v;
	ds->nviews++;
}

static struct mlfs_dview *lru_find(struct mlfs_dataset *ds, int64_t first, int64_t count)
{
	for (struct mlfs_dview *v = ds->head; v; v = v->next)
		if (v->first == first && v->count == count)
			return v;
	return NULL;
}

/* Drops the least recently used ready views past the bound; lock held. */
static void lru_evict(struct mlfs_dataset *ds)
{
	struct mlfs_dview *v = ds->tail;
	while ((ds->nviews > ds->maxviews || ds->cached_bytes > mem_share(ds, 8)) && v) {
		struct mlfs_dview *prev = v->prev;
		if (v->state == 1) {
			lru_unlink(ds, v);
			mlfs_dview_put(v);
		}
		v = prev;
	}
}

/* Frees the pooled buffers and the cached views nobody holds. */
static void drop_idle(struct mlfs_dataset *ds)
{
	struct xf_buf *bufs[POOL_SLOTS];
	int nbufs = 0;
	struct mlfs_dview *idle = NULL;

	pthread_mutex_lock(&ds->lock);
	for (struct mlfs_dview *v = ds->head, *next; v; v = next) {
		next = v->next;
		if (v->state == 1 && atomic_load(&v->refs) == 1) {
			lru_unlink(ds, v);
			v->next = idle; /* off the list: a private chain */
			idle = v;
		}
	}
	pthread_mutex_unlock(&ds->lock);
	pthread_mutex_lock(&ds->pool_lock);
	while (ds->npool)
		bufs[nbufs++] = ds->pool[--ds->npool];
	ds->pool_bytes = 0;
	pthread_mutex_unlock(&ds->pool_lock);
	while (nbufs)
		xf_buf_put(bufs[--nbufs]);
	while (idle) {
		struct mlfs_dview *v = idle;
		idle = v->next;
		v->next = NULL;
		xf_buf_put(v->data); /* not back to the pool */
		v->data = NULL;
		mlfs_dview_put(v);
	}
}

/* The record of stream sample @g: its shard and index there. */
int mlfs_data_sample_record(const struct mlfs_dataset *ds, int64_t g, int64_t *id, int64_t *local)
{
	int64_t n = ds->ix->total;
	*id = ptc_data_perm(ds->seed, g / n, n, g % n, ds->shuffle);
	return ptc_index_locate(ds->ix, *id, local);
}

int64_t mlfs_data_record_len(const struct mlfs_dataset *ds, int shard, int64_t local)
{
	if (ds->ix->records == PTC_RECORDS_FIXED)
		return ds->ix->record_bytes;
	return ds->offs[shard][local + 1] - ds->offs[shard][local];
}

int64_t mlfs_data_record_off(const struct mlfs_dataset *ds, int shard, int64_t local)
{
	if (ds->ix->records == PTC_RECORDS_FIXED)
		return local * ds->ix->record_bytes;
	return ds->offs[shard][local];
}

/* Reads the records of @v; no lock held. */
static int assemble(struct mlfs_dataset *ds, struct mlfs_dview *v, struct ptc_error *err)
{
	struct mlfs_range *r = NULL;
	int rc = -ENOMEM;

	v->ids = malloc((size_t)(v->count ? v->count : 1) * sizeof(*v->ids));
	v->offs = malloc((size_t)(v->count + 1) * sizeof(*v->offs));
	r = malloc((size_t)(v->count ? v->count : 1) * sizeof(*r));
	if (!v->ids || !v->offs || !r)
		goto out;
	v->offs[0] = 0;
	for (int64_t j = 0; j < v->count; j++) {
		int64_t local;
		int sh = mlfs_data_sample_record(ds, v->first + j, &v->ids[j], &local);
		r[j].uri = ds->uris[sh];
		r[j].off = mlfs_data_record_off(ds, sh, local);
		r[j].len = mlfs_data_record_len(ds, sh, local);
		v->offs[j + 1] = v->offs[j] + r[j].len;
	}
	v->len = v->offs[v->count];
	if (!(v->data = buf_get(ds, v->len, &rc))) {
		ptc_error_set(err, rc, "%s",
			      rc == -ENOSPC ? "the view does not fit in --max-memory"
					    : "out of memory");
		goto out;
	}
	for (int64_t j = 0; j < v->count; j++)
		r[j].dst = v->data->data + v->offs[j];
	rc = mlfs_src_readv(ds->src, r, (size_t)v->count, err);
out:
	free(r);
	return rc;
}

int mlfs_data_get(struct mlfs_dataset *ds, int64_t first, int64_t count, struct mlfs_dview **out,
		  struct ptc_error *err)
{
	int rc;

	*out = NULL;
	pthread_mutex_lock(&ds->lock);
	struct mlfs_dview *v = lru_find(ds, first, count);
	if (v) {
		atomic_fetch_add(&v->refs, 1);
		lru_unlink(ds, v);
		lru_push(ds, v);
		ds->view_hits++;
		while (v->state == 0)
			pthread_cond_wait(&ds->ready, &ds->lock);
		rc = v->state < 0 ? v->state : 0;
		if (rc)
			ptc_error_set(err, rc, "%s", ds->error);
		pthread_mutex_unlock(&ds->lock);
		if (rc) {
			mlfs_dview_put(v);
			return rc;
		}
		*out = v;
		return 0;
	}
	if (!(v = calloc(1, sizeof(*v)))) {
		pthread_mutex_unlock(&ds->lock);
		return -ENOMEM;
	}
	atomic_init(&v->refs, 2); /* the cache's and ours */
	v->ds = ds;
	v->first = first;
	v->count = count;
	lru_push(ds, v);
	pthread_mutex_unlock(&ds->lock);

	rc = assemble(ds, v, err);

	pthread_mutex_lock(&ds->lock);
	v->state = rc ? rc : 1;
	if (rc) {
		lru_unlink(ds, v);
		mlfs_dview_put(v); /* the cache's */
		ds->failures++;
		snprintf(ds->error, sizeof(ds->error), "%s", err->text);
	} else {
		ds->assembled++;
		ds->cached_bytes += v->len;
		v->counted = true;
		lru_evict(ds);
	}
	pthread_cond_broadcast(&ds->ready);
	pthread_mutex_unlock(&ds->lock);
	if (rc) {
		mlfs_dview_put(v);
		return rc;
	}
	*out = v;
	return 0;
}

void mlfs_dview_body(const struct mlfs_dview *v, enum mlfs_dfile kind, const uint8_t **body,
		     size_t *len)
{
	switch (kind) {
	case MLFS_DF_NPY:
	case MLFS_DF_BIN:
		*body = v->data->data;
		*len = (size_t)v->len;
		return;
	case MLFS_DF_IDS:
		*body = (const uint8_t *)v->ids;
		*len = (size_t)v->count * sizeof(int64_t);
		return;
	case MLFS_DF_OFFSETS:
		*body = (const uint8_t *)v->offs;
		*len = (size_t)(v->count + 1) * sizeof(int64_t);
		return;
	}
}

/* ------------------------------------------------------------- prefetch */

static void *prefetch_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-prefetch"); /* for top -H, perf */
	struct mlfs_dataset *ds = arg;
	struct ptc_error why;

	pthread_mutex_lock(&ds->lock);
	for (;;) {
		while (!ds->stop && ds->qlen == 0)
			pthread_cond_wait(&ds->queued, &ds->lock);
		if (ds->stop)
			break;
		struct slice s = ds->queue[ds->qhead];
		ds->qhead = (ds->qhead + 1) % QUEUE_CAP;
		ds->qlen--;
		if (lru_find(ds, s.first, s.count))
			continue;
		pthread_mutex_unlock(&ds->lock);
		struct mlfs_dview *v;
		if (mlfs_data_get(ds, s.first, s.count, &v, &why) == 0)
			mlfs_dview_put(v);
		pthread_mutex_lock(&ds->lock);
	}
	pthread_mutex_unlock(&ds->lock);
	return NULL;
}

void mlfs_data_prefetch(struct mlfs_dataset *ds, const struct ptc_cursor *c, int d, int64_t from,
			int64_t n)
{
	pthread_mutex_lock(&ds->lock);
	if (n < ds->prefetch)
		n = ds->prefetch;
	else if (ds->maxviews < 8 * (n + 2)) /* windows: room for the next ones */
		set_maxviews(ds, (int)(8 * (n + 2)));
	for (int64_t s = from; s < from + n; s++) {
		struct slice sl;
		if (mlfs_data_slice(ds, c, s, d, &sl.first, &sl.count))
			break;
		if (lru_find(ds, sl.first, sl.count))
			continue;
		bool queued = false;
		for (int i = 0; i < ds->qlen && !queued; i++) {
			const struct slice *q = &ds->queue[(ds->qhead + i) % QUEUE_CAP];
			queued = q->first == sl.first && q->count == sl.count;
		}
		if (queued)
			continue;
		if (ds->qlen == QUEUE_CAP) { /* drop the oldest wish */
			ds->qhead = (ds->qhead + 1) % QUEUE_CAP;
			ds->qlen--;
		}
		ds->queue[(ds->qhead + ds->qlen) % QUEUE_CAP] = sl;
		ds->qlen++;
	}
	pthread_cond_signal(&ds->queued);
	pthread_mutex_unlock(&ds->lock);
}

static void dataset_free(struct mlfs_dataset *ds)
{
	if (ds->thread_started) {
		pthread_mutex_lock(&ds->lock);
		ds->stop = true;
		pthread_cond_broadcast(&ds->queued);
		pthread_mutex_unlock(&ds->lock);
		pthread_join(ds->thread, NULL);
	}
	while (ds->head) {
		struct mlfs_dview *v = ds->head;
		lru_unlink(ds, v);
		mlfs_dview_put(v);
	}
	while (ds->npool)
		xf_buf_put(ds->pool[--ds->npool]);
	for (int i = 0; ds->ix && i < ds->ix->nshards; i++) {
		if (ds->uris)
			free(ds->uris[i]);
		if (ds->offs)
			free(ds->offs[i]);
	}
	free(ds->uris);
	free(ds->offs);
	ptc_index_free(ds->ix);
	if (ds->src)
		mlfs_src_free(ds->src);
	free(ds->index_uri);
	pthread_mutex_destroy(&ds->pool_lock);
	if (ds->sizes)
		pthread_mutex_destroy(&ds->sizes->lock);
	free(ds->sizes);
	pthread_cond_destroy(&ds->ready);
	pthread_cond_destroy(&ds->queued);
	pthread_mutex_destroy(&ds->lock);
	free(ds);
}

int mlfs_dataset_open(const struct ptc_config *c, const struct mlfs_data_opts *o,
		      struct xf_mem *mem, struct mlfs_dataset **out, struct ptc_error *err)
{
	struct mlfs_dataset *ds = calloc(1, sizeof(*ds));
	struct ptc_error why = {.text = ""};
	int rc = -ENOMEM;

	*out = NULL;
	if (!ds)
		return -ENOMEM;
	atomic_init(&ds->refs, 1);
	pthread_mutex_init(&ds->lock, NULL);
	pthread_mutex_init(&ds->pool_lock, NULL);
	pthread_cond_init(&ds->ready, NULL);
	pthread_cond_init(&ds->queued, NULL);
	ds->seed = c->dataset_seed;
	ds->shuffle = c->dataset_shuffle;
	ds->epochs = c->dataset_epochs;
	ds->mem = mem;
	ds->prefetch = o->prefetch;
	set_maxviews(ds, 8 * (o->prefetch + 2) < 16 ? 16 : 8 * (o->prefetch + 2));
	struct mlfs_src_opts so = {.cache_bytes = o->cache_bytes,
				   .retries = -1,
				   .timeout_ms = o->http_timeout_ms,
				   .deadline_ms = o->http_deadline_ms,
				   .file_direct = true};
	if (!(ds->index_uri = strdup(c->dataset_index)) || !(ds->src = mlfs_src_new(&so)) ||
	    !(ds->sizes = calloc(1, sizeof(*ds->sizes))))
		goto err;
	pthread_mutex_init(&ds->sizes->lock, NULL);
	if ((rc = mlfs_data_load_index(ds, &why))) {
		if (rc != -ENOMEM)
			ptc_error_set(err, rc, "config.json: dataset.index %s: %s", ds->index_uri,
				      why.text);
		goto err;
	}
	if ((rc = -pthread_create(&ds->thread, NULL, prefetch_main, ds)))
		goto err;
	ds->thread_started = true;
	*out = ds;
	return 0;
err:
	dataset_free(ds);
	return rc;
}

struct mlfs_dataset *mlfs_dataset_get(struct mlfs_dataset *ds)
{
	if (ds)
		atomic_fetch_add(&ds->refs, 1);
	return ds;
}

void mlfs_dataset_put(struct mlfs_dataset *ds)
{
	if (ds && atomic_fetch_sub(&ds->refs, 1) == 1)
		dataset_free(ds);
}

bool mlfs_dataset_is(const struct mlfs_dataset *ds, const struct ptc_config *c)
{
	return ds && c->has_dataset && strcmp(ds->index_uri, c->dataset_index) == 0 &&
	       ds->seed == c->dataset_seed && ds->shuffle == c->dataset_shuffle &&
	       ds->epochs == c->dataset_epochs;
}

const struct ptc_index *mlfs_dataset_index(const struct mlfs_dataset *ds)
{
	return ds->ix;
}

json_t *mlfs_data_status(struct mlfs_dataset *ds)
{
	struct mlfs_src_stats s;
	mlfs_src_stats(ds->src, &s);
	pthread_mutex_lock(&ds->lock);
	json_t *o = json_pack(
	    "{ss sI sI ss sI sI sI sI s{sI sI sI sI sI sI sI sI} so}", "index", ds->index_uri,
	    "records", (json_int_t)ds->ix->total, "shards", (json_int_t)ds->ix->nshards, "kind",
	    ds->ix->records == PTC_RECORDS_FIXED ? "fixed" : "variable", "views_assembled",
	    (json_int_t)ds->assembled, "view_hits", (json_int_t)ds->view_hits, "view_failures",
	    (json_int_t)ds->failures, "views_cached", (json_int_t)ds->nviews, "cache", "hits",
	    (json_int_t)s.hits, "misses", (json_int_t)s.misses, "requests", (json_int_t)s.requests,
	    "retries", (json_int_t)s.retries, "failures", (json_int_t)s.failures, "bytes_fetched",
	    (json_int_t)s.bytes_fetched, "direct_reads", (json_int_t)s.direct_reads, "cached_bytes",
	    (json_int_t)s.cached_bytes, "last_error",
	    ds->error[0] ? json_string(ds->error) : json_null());
	pthread_mutex_unlock(&ds->lock);
	return o;
}
