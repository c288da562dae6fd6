/*
 * mlfs_srcdirect.c - file_direct reads of a readv: file objects' ranges
 * read straight into their dsts, past the block cache (the kernel's page
 * cache is their cache).
 *
 * After step (1) of the readv (mlfs_srcreadv.c: objects resolved, files
 * pinned), the ranges of file objects are cut into spans of adjacent
 * ranges. A pinned file is also mapped (read-only, shared), and its spans
 * are copied from the mapping on the caller's thread: from the page cache
 * that is a memcpy, 8x cheaper than a preadv per record. After a copy that
 * took long and whose next span is not in the page cache (a read with
 * RWF_NOWAIT: the slow copy waited for the disk, not for first mappings of
 * its pages), and for files that could not be mapped, each span is one
 * preadv into its dsts, tried with RWF_NOWAIT (the page cache) and
 * otherwise on up to `parallel` threads, so a cold disk sees many requests
 * at once (measured: better than MADV_WILLNEED and copies).
 *
 * A file that shrank under its mapping loses it before the copies (fstat
 * once a readv: a mapping reads the rest of a cut page as zeros), and one
 * that shrinks during them raises SIGBUS in the copy, which mlfs_mapcopy.c
 * turns into EIO for that copy; the object is then reopened when no readv
 * uses it any more (mlfs_srcfile.c), so the next readv sees its new size.
 *
 * Threads: the caller's and up to parallel - 1 more, joined before the
 * call returns; the groups' pins (fd, mapping) hold for the whole call.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "dataset/dataset_i.h"

/* A run of ranges ord[lo, hi) of one direct group, adjacent in its file. */
struct span {
	uint32_t grp;
	size_t lo, hi;
	int64_t off, len;
};

struct dv {
	struct src_readv *rv;
	struct span *spans;
	size_t nspans;
	size_t *todo; /* indices of pending spans */
	size_t ntodo;
	atomic_size_t next;
	atomic_int failed; /* the first failure writes why */
	int rc;
	char why[512];
};

/* Reads span @sp into its dsts (see mlfs_srcfile_preadv for @flags). */
static int span_read(struct src_readv *rv, const struct span *sp, int flags, struct ptc_error *err)
{
	struct iovec iov[SRC_SPAN_IOV];
	int nv = 0;

	for (size_t k = sp->lo; k < sp->hi; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		iov[nv++] = (struct iovec){r->dst, (size_t)r->len};
	}
	const struct src_grp *g = &rv->grps[sp->grp];
	int rc = mlfs_srcfile_preadv(g->fd, g->obj->uri, iov, nv, sp->off, sp->len, flags, err);
	if (rc)
		return rc;
	src_stat_add(&rv->s->direct_reads, 1);
	src_stat_add(&rv->s->bytes_fetched, sp->len);
	return 0;
}

/* Copies span @sp from its group's mapping into its dsts. */
static int span_copy(struct src_readv *rv, const struct span *sp, struct ptc_error *err)
{
	const struct src_grp *g = &rv->grps[sp->grp];

	for (size_t k = sp->lo; k < sp->hi; k++) {
		const struct mlfs_range *r = &rv->r[rv->ord[k]];
		if (mlfs_mapcopy_raw(r->dst, g->map + r->off, (size_t)r->len) == 0)
			continue;
		mlfs_srcobj_reopen(rv->s, g->obj);
		return ptc_error_set(
		    err, -EIO,
		    "%s: bytes %" PRId64 "-%" PRId64
		    " unreadable, shorter than when opened (changed?) or an I/O error",
		    g->obj->uri, r->off, r->off + r->len - 1);
	}
	src_stat_add(&rv->s->direct_reads, 1);
	src_stat_add(&rv->s->bytes_fetched, sp->len);
	return 0;
}

static void *direct_worker(void *arg)
{
	struct dv *d = arg;
	size_t i;
	struct ptc_error why;

	while ((i = atomic_fetch_add(&d->next, 1)) < d->ntodo && !atomic_load(&d->failed)) {
		int rc = span_read(d->rv, &d->spans[d->todo[i]], 0, &why);
		if (rc && !atomic_exchange(&d->failed, 1)) {
			d->rc = rc;
			snprintf(d->why, sizeof(d->why), "%s", why.text);
		}
	}
	return NULL;
}

/* The direct groups' spans, cut where ranges stop being adjacent. */
static int make_spans(struct src_readv *rv, struct span **out, size_t *nout)
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
			if (cur && r->off == cur->off + cur->len &&
			    cur->hi - cur->lo < SRC_SPAN_IOV && cur->len <= maxlen - r->len) {
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
static bool span_cached(struct src_readv *rv, const struct span *sp)
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
static void check_maps(struct src_readv *rv)
{
	struct stat st;

	for (size_t gi = 0; gi < rv->ngrps; gi++) {
		struct src_grp *g = &rv->grps[gi];
		if (!g->direct || !g->map)
			continue;
		/* maplen changes only when the file is opened again, which
		 * waits until no readv pins it: no lock needed while we do */
		if (fstat(g->fd, &st) == 0 && st.st_size >= g->obj->maplen)
			continue;
		mlfs_srcobj_reopen(rv->s, g->obj);
		g->map = NULL;
	}
}

/* Reads the direct groups: copies from the mappings on this thread until
 * one waited for the disk; then, and for files without a mapping, preadv:
 * page-cache hits on this thread, the rest on up to opts.parallel threads. */
int mlfs_srcdirect_read(struct src_readv *rv, struct ptc_error *err)
{
	struct dv d = {.rv = rv};
	int rc;

	if ((rc = make_spans(rv, &d.spans, &d.nspans)))
		return ptc_error_set(err, rc, "out of memory");
	check_maps(rv);
	for (size_t gi = 0; gi < rv->ngrps; gi++)
		if (rv->grps[gi].direct && rv->grps[gi].map) {
			mlfs_mapcopy_guard();
			break;
		}
	if (d.nspans && !(d.todo = malloc(d.nspans * sizeof(*d.todo)))) {
		free(d.spans);
		return ptc_error_set(err, -ENOMEM, "out of memory");
	}
	bool cold = false;
	for (size_t i = 0; i < d.nspans; i++) {
		if (rv->grps[d.spans[i].grp].map && !cold) {
			int64_t t0 = src_now_ns();
			if ((rc = span_copy(rv, &d.spans[i], err)))
				goto out;
			/* Slower than 50 us + 1 ns a byte: pages came from the
			 * disk (the rest may too: preadv, in parallel), or were
			 * only mapped for the first time (go on copying). */
			if (src_now_ns() - t0 > 50000 + d.spans[i].len && i + 1 < d.nspans)
				cold = !span_cached(rv, &d.spans[i + 1]);
			continue;
		}
		rc = span_read(rv, &d.spans[i], RWF_NOWAIT, err);
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
		mlfs_par_run((int)want, direct_worker, &d);
		if (atomic_load(&d.failed))
			rc = ptc_error_set(err, d.rc, "%s", d.why);
	}
out:
	free(d.todo);
	free(d.spans);
	return rc;
}
