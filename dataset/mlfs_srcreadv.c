/*
 * mlfs_srcreadv.c - mlfs_src_readv: the planner that turns a list of byte
 * ranges into cached blocks and requests, and runs the requests.
 *
 * (1) Resolve the objects, open the files, check the ranges against known
 * sizes; (2) list the distinct blocks needed, sorted by (object, index);
 * (3) pin the cached ones under the lock (hits) and copy them out; (4) group
 * runs of missing blocks into requests of at most max_request_bytes and run
 * them on up to `parallel` threads, the caller being one. A finished
 * request copies its blocks to the dsts, then hands them to the cache: a
 * readv larger than the cache holds at most parallel * max_request_bytes of
 * its own. (5) Check the ranges against the sizes learned meanwhile.
 *
 * With file_direct, the file objects' ranges are read after (1) by
 * mlfs_srcdirect.c and never enter (2)-(4).
 *
 * HTTP: a request of step (4) is one ranged GET (net/) into its blocks;
 * every request of one readv shares the readv's deadline (the call's
 * start_ns), and a failed request stops the others' retries (the call's
 * stop flag).
 *
 * Threads: the caller's and up to parallel - 1 more, joined before the call
 * returns; s->lock only inside the object table and cache functions and to
 * pin the hits.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset_i.h"
#include "net/net.h"

/* Distinct blocks one readv may name (16 TiB in 1 MiB blocks). */
#define SRC_MAX_NEED ((size_t)1 << 24)

/* A block a readv needs; needs are sorted by (grp, idx) and distinct. */
struct need {
	uint32_t grp;
	int64_t idx;
	struct src_blk *hit; /* pinned cached block, or NULL */
};

/* A run of missing blocks fetched as one request. */
struct src_req {
	uint32_t grp;
	int64_t first;
	int nblk;
	int rc; /* 0, -EIO, -ENOMEM, or -ECANCELED (not run) */
	struct ptc_error err;
};

static int cmp_ord(const void *pa, const void *pb, void *arg)
{
	const struct src_readv *rv = arg;
	size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
	uintptr_t oa = (uintptr_t)rv->robj[a], ob = (uintptr_t)rv->robj[b];

	if (oa != ob)
		return oa < ob ? -1 : 1;
	if (rv->r[a].off != rv->r[b].off)
		return rv->r[a].off < rv->r[b].off ? -1 : 1;
	return a < b ? -1 : a > b;
}

/* Copies bytes [@start, @start + @len) of group @g's object to the ranges holding them. */
static void copy_out(struct src_readv *rv, const struct src_grp *g, int64_t start,
		     const uint8_t *data, int64_t len)
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
static int check_sizes(struct src_readv *rv, struct ptc_error *err)
{
	for (size_t gi = 0; gi < rv->ngrps; gi++) {
		const struct src_grp *g = &rv->grps[gi];
		int64_t size = mlfs_srcobj_size(rv->s, g->obj);
		if (size < 0)
			continue;
		for (size_t k = g->lo; k < g->hi; k++) {
			const struct mlfs_range *r = &rv->r[rv->ord[k]];
			if (r->off + r->len <= size)
				continue;
			if (g->obj->kind == OBJ_FILE) /* it may grow: look again next time */
				mlfs_srcobj_reopen(rv->s, g->obj);
			return ptc_error_set(err, -EIO,
					     "%s: holds %" PRId64 " bytes, bytes %" PRId64
					     "-%" PRId64 " asked",
					     g->obj->uri, size, r->off, r->off + r->len - 1);
		}
	}
	return 0;
}

/* Fetches request @rq, copies its bytes to the dsts, hands its blocks to the cache. */
static int run_req(struct src_readv *rv, struct src_req *rq)
{
	struct mlfs_src *s = rv->s;
	const struct src_grp *g = &rv->grps[rq->grp];
	int64_t B = s->o.block_bytes, a = rq->first * B, span = (int64_t)rq->nblk * B, end;
	int64_t size = mlfs_srcobj_size(s, g->obj), got_end;
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
		return ptc_error_set(&rq->err, -ENOMEM, "%s: out of memory", g->obj->uri);
	for (int j = 0; j < nb; j++) {
		int64_t bs = a + j * B, bl = end - bs < B ? end - bs : B;
		if (!(blks[j] = mlfs_srcblk_new(g->obj, rq->first + j, bl))) {
			rc = ptc_error_set(&rq->err, -ENOMEM, "%s: out of memory", g->obj->uri);
			goto out;
		}
	}

	if (g->obj->kind == OBJ_FILE) {
		if ((rc = mlfs_srcfile_read_blocks(s, g->obj, g->fd, blks, nb, a, &rq->err))) {
			src_stat_add(&s->failures, 1);
			goto out;
		}
		got_end = end;
	} else {
		struct net_http_call call = {.start_ns = rv->start_ns, .stop = &rv->stop};
		struct net_http_range hr = {.off = a, .len = end - a, .iovcnt = nb};
		if (!(iov = malloc((size_t)nb * sizeof(*iov)))) {
			rc = ptc_error_set(&rq->err, -ENOMEM, "%s: out of memory", g->obj->uri);
			goto out;
		}
		for (int j = 0; j < nb; j++)
			iov[j] = (struct iovec){blks[j]->data, (size_t)blks[j]->len};
		hr.iov = iov;
		if ((rc = net_http_get_range(s->http, g->obj->uri, &hr, &call, &rq->err)))
			goto out;
		if (hr.size >= 0 && (rc = mlfs_srcobj_set_size(s, g->obj, hr.size, &rq->err)))
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
		mlfs_srccache_insert(s, k);
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
	struct src_readv *rv = arg;
	size_t i;

	while ((i = atomic_fetch_add(&rv->next, 1)) < rv->nreqs) {
		struct src_req *rq = &rv->reqs[i];
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
static void run_all(struct src_readv *rv)
{
	size_t want = rv->nreqs < (size_t)rv->s->o.parallel ? rv->nreqs : (size_t)rv->s->o.parallel;

	atomic_init(&rv->next, 0);
	atomic_init(&rv->stop, 0);
	mlfs_par_run((int)want, run_worker, rv);
}

/* Builds rv->grps and rv->pmax from the sorted rv->ord. */
static int make_groups(struct src_readv *rv)
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
			rv->grps[g++] = (struct src_grp){.obj = o, .lo = k, .hi = k, .fd = -1};
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
static int make_needs(struct src_readv *rv, struct need **out, size_t *nout, struct ptc_error *err)
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
					return ptc_error_set(
					    err, -ENOMEM, "%s: more than %zu blocks asked at once",
					    rv->grps[gi].obj->uri, SRC_MAX_NEED);
				for (int64_t i = first; pass && i <= lastb; i++)
					needs[n + (size_t)(i - first)] =
					    (struct need){.grp = (uint32_t)gi, .idx = i};
				n += (size_t)(lastb - first + 1);
				last = lastb;
			}
		}
		if (!pass && !(needs = calloc(n ? n : 1, sizeof(*needs))))
			return ptc_error_set(err, -ENOMEM, "out of memory");
	}
	*out = needs;
	*nout = n;
	return 0;
}

/* Pins the cached needed blocks, copies them out, unpins them. */
static void serve_hits(struct src_readv *rv, struct need *needs, size_t nneed)
{
	struct mlfs_src *s = rv->s;
	int64_t hits = 0;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < nneed; i++) {
		struct src_blk *b = mlfs_srccache_pin(s, rv->grps[needs[i].grp].obj, needs[i].idx);
		if (b) {
			needs[i].hit = b;
			hits++;
		}
	}
	pthread_mutex_unlock(&s->lock);
	src_stat_add(&s->hits, hits);
	src_stat_add(&s->misses, (int64_t)nneed - hits);
	for (size_t i = 0; i < nneed; i++) {
		struct src_blk *b = needs[i].hit;
		if (!b)
			continue;
		copy_out(rv, &rv->grps[needs[i].grp], b->idx * s->o.block_bytes, b->data, b->len);
		mlfs_srcblk_put(b); /* freed here if evicted while we copied */
	}
}

/* Groups runs of missing blocks into requests of at most max_request_bytes. */
static int make_reqs(struct src_readv *rv, const struct need *needs, size_t nneed)
{
	int64_t maxblk = rv->s->o.max_request_bytes / rv->s->o.block_bytes;
	struct src_req *rq = NULL;

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
			rq->err.text[0] = 0;
			rq->err.code = 0;
		}
		rq->nblk++;
	}
	return 0;
}

int mlfs_src_readv(struct mlfs_src *s, const struct mlfs_range *r, size_t n, struct ptc_error *err)
{
	struct src_readv rv = {.s = s, .r = r, .start_ns = src_now_ns()};
	struct need *needs = NULL;
	size_t nneed = 0;
	struct ptc_error own;
	int rc = 0;

	if (!err) /* the log says why all the same */
		err = &own;
	err->text[0] = 0;
	err->code = 0;
	if (!n)
		return 0;
	if (!r)
		return ptc_error_set(err, -EINVAL, "no ranges");
	if (!(rv.robj = calloc(n, sizeof(*rv.robj))) || !(rv.ord = malloc(n * sizeof(*rv.ord)))) {
		rc = ptc_error_set(err, -ENOMEM, "out of memory");
		goto out;
	}

	/* 1. Objects, files opened, ranges checked against known sizes. */
	for (size_t i = 0; i < n; i++) {
		if (r[i].off < 0 || r[i].len < 0 || r[i].off > INT64_MAX - r[i].len ||
		    (r[i].len && !r[i].dst)) {
			rc = ptc_error_set(err, -EINVAL,
					   "%s: bad range %zu (offset %" PRId64 ", length %" PRId64
					   ")",
					   r[i].uri ? r[i].uri : "(null)", i, r[i].off, r[i].len);
			goto out;
		}
		if (i && r[i].uri && r[i - 1].uri && !strcmp(r[i].uri, r[i - 1].uri))
			rv.robj[i] = rv.robj[i - 1];
		else if ((rc = mlfs_srcobj_get(s, r[i].uri, &rv.robj[i], err)))
			goto out;
		if (r[i].len)
			rv.ord[rv.nord++] = i;
	}
	if (!rv.nord)
		goto out;
	qsort_r(rv.ord, rv.nord, sizeof(*rv.ord), cmp_ord, &rv);
	if ((rc = make_groups(&rv))) {
		rc = ptc_error_set(err, rc, "out of memory");
		goto out;
	}
	for (size_t gi = 0; gi < rv.ngrps; gi++) {
		struct src_grp *g = &rv.grps[gi];
		if (g->obj->kind == OBJ_FILE &&
		    (rc = mlfs_srcfile_pin(s, g->obj, &g->fd, &g->map, err)))
			goto out;
		g->direct = g->obj->kind == OBJ_FILE && s->o.file_direct;
	}
	if ((rc = check_sizes(&rv, err)))
		goto out;
	if (s->o.file_direct && (rc = mlfs_srcdirect_read(&rv, err)))
		goto out;

	/* 2, 3. The blocks needed; the cached ones served at once. */
	if ((rc = make_needs(&rv, &needs, &nneed, err)))
		goto out;
	serve_hits(&rv, needs, nneed);

	/* 4. The missing ones, fetched. */
	if ((rc = make_reqs(&rv, needs, nneed))) {
		rc = ptc_error_set(err, rc, "out of memory");
		goto out;
	}
	if (rv.nreqs)
		run_all(&rv);
	for (size_t i = 0; i < rv.nreqs; i++) {
		if (rv.reqs[i].rc && rv.reqs[i].rc != -ECANCELED) {
			rc = ptc_error_set(err, rv.reqs[i].rc, "%s", rv.reqs[i].err.text);
			goto out;
		}
	}

	/* 5. Sizes learned from the replies. */
	rc = check_sizes(&rv, err);
out:
	for (size_t gi = 0; gi < rv.ngrps; gi++)
		if (rv.grps[gi].fd >= 0)
			mlfs_srcfile_unpin(s, rv.grps[gi].obj);
	free(rv.reqs);
	free(needs);
	free(rv.grps);
	free(rv.pmax);
	free(rv.ord);
	free(rv.robj);
	if (rc)
		mlfs_src_log_failure(rc, err->text);
	return rc;
}
