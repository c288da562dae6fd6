/*
 * mlfs_open.c - opens, reads and releases of files: snapshots, views,
 * splice. The open-file object is mlfs_fh.c's; what a writer's open stages
 * and what its release commits are mlfs_write.c's.
 */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "mount/mount_i.h"
#include "common/common.h"

/* Text snapshot of a generated or control file; lock held. */
static char *snapshot_text(struct mlfs_daemon *d, const struct mlfs_ent *e,
			   const struct mlfs_view *v)
{
	switch (e->kind) {
	case MLFS_K_CONFIG:
		return strdup(v ? v->config_text : "");
	case MLFS_K_SCHEMA:
		return strdup(d->st->schema_text ? d->st->schema_text : "");
	case MLFS_K_CLUSTER:
		return strdup(mlfs_store_cluster_text(d->st));
	case MLFS_K_RANKJSON:
		return mlfs_rank_json(v, e->rank);
	case MLFS_K_STEP:
		return mlfs_step_text(d, e->rank);
	case MLFS_K_SINDEX:
		return mlfs_st_index_text(d->st->schema, e->state, mlfs_st_shard_max());
	default:
		return strdup("");
	}
}

/* Assembles (or finds) the records of a dataset view for @f, or of each
 * step of a window, and queues the next steps of its DP group. No lock
 * held. */
static int open_view(struct mlfs_fh *f)
{
	struct mlfs_daemon *d = f->d;
	char why[512] = "";
	int dp = f->v->layout.ranks[f->rank].d, rc = 0;
	int64_t n = f->nsteps ? f->nsteps : 1, count = f->count, firsts[MLFS_DATA_WINDOW_MAX];

	firsts[0] = f->first;
	if (f->nsteps && /* the slices mlfs_resolve() checked, under the same view */
	    (rc = mlfs_data_window(f->v->ds, &f->v->cursor, f->step, n, dp, firsts, &count)))
		snprintf(why, sizeof(why), "its steps have no views of one length");
	if (!(f->views = calloc((size_t)n, sizeof(*f->views))))
		return -ENOMEM;
	for (; f->nviews < n && rc == 0; f->nviews++) {
		struct ptc_error err;
		rc = mlfs_data_get(f->v->ds, firsts[f->nviews], count, &f->views[f->nviews], &err);
		/* at most 399 bytes of the reason: room in why for the step */
		if (rc && f->nsteps) /* a window: which step */
			snprintf(why, sizeof(why), "step %" PRId64 ": %.399s", f->step + f->nviews,
				 err.text);
		else if (rc)
			snprintf(why, sizeof(why), "%.399s", err.text);
	}
	if (rc) {
		char msg[700], name[64], one[48];
		mlfs_data_format_name(f->step, f->dkind, one, sizeof(one));
		if (f->nsteps) /* a window: "<s>-<e>" and the suffix */
			snprintf(name, sizeof(name), "%" PRId64 "-%" PRId64 "%s", f->step,
				 f->step + f->nsteps, strchr(one, '.'));
		else
			snprintf(name, sizeof(name), "%s", one);
		snprintf(msg, sizeof(msg), "dataset: ranks/%d/data/%s: %s", f->rank, name, why);
		mlfs_store_note_error(d->st, msg);
		mlfs_log(MLFS_LOG_WARNING, "open failed: %s", msg);
		return rc == -ENOSPC || rc == -ENOMEM ? rc : -EIO;
	}
	mlfs_data_prefetch(f->v->ds, &f->v->cursor, dp, f->step + n, f->nsteps);
	return 0;
}

static void open_reply(fuse_req_t req, struct fuse_file_info *fi, struct mlfs_fh *f, fuse_ino_t ino,
		       int rc);

/* An open of a dataset view, run by an I/O worker. */
struct open_job {
	struct mlfs_io_job job;
	fuse_req_t req;
	struct fuse_file_info fi;
	struct mlfs_fh *f;
	fuse_ino_t ino;
};

static void open_job_run(struct mlfs_io_job *j)
{
	struct open_job *o = (struct open_job *)j;
	open_reply(o->req, &o->fi, o->f, o->ino, open_view(o->f));
	free(o);
}

static void open_job_cancel(struct mlfs_io_job *j)
{
	struct open_job *o = (struct open_job *)j;
	open_reply(o->req, &o->fi, o->f, o->ino, -EINTR);
	free(o);
}

/*
 * Fetches part @t of @np of tensor (@state, @tensor), which rank
 * remote[0] of layout p->version holds as its tensor remote[1], whole into
 * a new buffer *@out from the node holding it (st->fetch: the bytes checked
 * against the peer's XXH3; it may wait on the network: I/O workers only).
 * 0, -ESTALE when the layout changed since the lookup (look up again), or
 * a negative errno.
 */
static int fetch_part(struct mlfs_store *st, const struct mlfs_pin *p, int state, int tensor, int t,
		      int np, const int *remote, struct xf_buf **out)
{
	const struct ptc_tensor *T = &st->schema->tensors[tensor];
	int64_t outer, rowel, rows = 1;
	int rc = 0;

	ptc_tensor_geometry(T, &outer, &rowel);
	if (T->split_dim >= 0) {
		struct ptc_slice sl;
		ptc_slice_compute(T, np, t, &sl);
		rows = sl.rows;
	}
	int64_t rb = rowel * (int64_t)ptc_dtype_size(ptc_schema_dtype(st->schema, state, tensor));
	if (!(*out = xf_buf_new(&st->mem, outer * rows * rb, &rc)))
		return rc;
	int r = remote[0];
	struct mlfs_view *v = mlfs_store_view(st);
	struct xf_piece pc = {
	    .op = {.kind = PTC_OP_FETCH,
		   .dst_node = -1, /* not an attempt's */
		   .state = (uint16_t)state,
		   .src_rank = r,
		   .src_tensor = remote[1],
		   .src_node = v && r < v->layout.world ? v->layout.ranks[r].node : 0,
		   .rows = rows,
		   .bytes = outer * rows * rb},
	    .dst = (*out)->data,
	    .dst_rows = rows,
	    .outer = outer,
	    .row_bytes = rb};
	bool same = v && v->config->version == p->version;
	mlfs_view_put(v);
	rc = same ? st->fetch(st->fetch_arg, p->version, &pc, 1) : -ESTALE;
	if (rc) {
		xf_buf_put(*out);
		*out = NULL;
	}
	return rc;
}

/*
 * Assembles the full tensor of @f from its pin: local parts as they are,
 * the others fetched whole from the nodes holding them (fetch_part: I/O
 * workers only). 0 or a negative errno.
 */
static int assemble_full(struct mlfs_fh *f)
{
	struct mlfs_store *st = f->d->st;
	struct mlfs_pin *p = f->pin;
	struct xf_buf **fetched = calloc((size_t)p->nbufs * 2, sizeof(*fetched));
	struct xf_buf **srcs = fetched + p->nbufs;
	int rc = 0;

	if (!fetched)
		return -ENOMEM;
	for (int t = 0; t < p->nbufs && rc == 0; t++) {
		srcs[t] = p->bufs[t];
		if (!srcs[t])
			rc = fetch_part(st, p, f->state, f->tensor, t, p->nbufs, p->remote + 2 * t,
					&fetched[t]);
		srcs[t] = srcs[t] ? srcs[t] : fetched[t];
	}
	if (rc == 0)
		rc = mlfs_full_assemble(st->schema, f->state, f->tensor, srcs, p->nbufs, &st->mem,
					&f->buf);
	for (int t = 0; t < p->nbufs; t++)
		xf_buf_put(fetched[t]);
	free(fetched);
	mlfs_pin_put(f->pin);
	f->pin = NULL;
	return rc;
}

/*
 * The parts of the safetensors file of @f whose pin names some on other
 * nodes: the local ones with a new reference, the others fetched, all into
 * f->srcs, which its reads take instead of the pin's (fetched at each open:
 * every part of layout p->version, as the pin's are). 0 or a negative errno.
 */
static int fetch_st(struct mlfs_fh *f)
{
	struct mlfs_store *st = f->d->st;
	const struct mlfs_pin *p = f->pin;
	const struct mlfs_st_shard *sh = p->sh;
	int rc = 0;

	if (!(f->srcs = calloc((size_t)p->nbufs, sizeof(*f->srcs))))
		return -ENOMEM;
	f->nsrcs = p->nbufs;
	for (int i = 0; i < sh->n && rc == 0; i++) {
		int np = sh->src0[i + 1] - sh->src0[i];
		for (int k = sh->src0[i], t = 0; t < np && rc == 0; k++, t++)
			rc = p->bufs[k] ? ((f->srcs[k] = xf_buf_get(p->bufs[k])), 0)
					: fetch_part(st, p, sh->state, sh->tensor[i], t, np,
						     p->remote + 2 * k, &f->srcs[k]);
	}
	return rc;
}

static void st_job_run(struct mlfs_io_job *j)
{
	struct open_job *o = (struct open_job *)j;
	o->fi.direct_io = 1; /* fetched anew at every open: no page cache to go stale */
	open_reply(o->req, &o->fi, o->f, o->ino, fetch_st(o->f));
	free(o);
}

static void full_job_run(struct mlfs_io_job *j)
{
	struct open_job *o = (struct open_job *)j;
	o->fi.direct_io = 1; /* fetched anew at every open: no page cache to go stale */
	open_reply(o->req, &o->fi, o->f, o->ino, assemble_full(o->f));
	free(o);
}

/* Queues the open of @f, which @run finishes on an I/O worker (a view, or a
 * full tensor with parts on other nodes); 0, or an error for the caller to
 * reply. */
static int open_queue(struct mlfs_daemon *d, void (*run)(struct mlfs_io_job *), fuse_req_t req,
		      struct fuse_file_info *fi, struct mlfs_fh *f, fuse_ino_t ino)
{
	struct open_job *o = malloc(sizeof(*o));
	if (!o)
		return -ENOMEM;
	*o = (struct open_job){{run, open_job_cancel, NULL}, req, *fi, f, ino};
	int rc = mlfs_io_submit(&d->io, &o->job);
	if (rc)
		free(o);
	return rc;
}

void mlfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	int rc = mlfs_target_get(d, ino, &t), acc = fi->flags & O_ACCMODE;
	struct mlfs_fh *f = NULL;

	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	bool write = acc != O_RDONLY;
	if (t.vanished && write) { /* only its old content is left: to read */
		mlfs_target_done(&t);
		mlfs_target_put(&t);
		fuse_reply_err(req, ENOENT);
		return;
	}
	rc = -ENOMEM;
	if (!(f = mlfs_fh_new(d, t.e.kind)))
		goto out_locked;
	f->v = t.v;
	t.v = NULL;
	f->rank = t.e.rank;
	f->state = t.e.state;
	f->tensor = t.e.tensor;
	f->write = write;
	switch (t.e.kind) {
	case MLFS_K_ROOT:
	case MLFS_K_RANKS:
	case MLFS_K_RANK:
	case MLFS_K_FULL:
	case MLFS_K_TDIR:
	case MLFS_K_FDIR:
		rc = -EISDIR;
		if (t.e.kind == MLFS_K_TDIR || t.e.kind == MLFS_K_FDIR)
			rc = t.e.tn->tensor < 0 ? -EISDIR : 0;
		goto out_locked;
	case MLFS_K_JOB:
		rc = t.e.job->dir ? -EISDIR : 0;
		if (rc == 0 && (fi->flags & O_TRUNC) && write &&
		    (rc = mlfs_job_truncate(t.e.job, 0)) == 0)
			mlfs_store_job_changed(d->st);
		fi->direct_io = 1;
		break;
	case MLFS_K_CLUSTER:
	case MLFS_K_RANKJSON:
	case MLFS_K_STATUS:
		rc = write ? -EACCES : 0;
		fi->direct_io = 1;
		break;
	case MLFS_K_CONFIG:
	case MLFS_K_SCHEMA:
	case MLFS_K_STEP:
	case MLFS_K_CTL:
		fi->direct_io = 1;
		rc = 0;
		if (write && !(fi->flags & O_TRUNC) && t.e.kind != MLFS_K_CTL) {
			char *cur = snapshot_text(d, &t.e, f->v);
			rc = cur ? mlfs_write_text(f, cur, strlen(cur), 0) : -ENOMEM;
			free(cur);
		}
		break;
	case MLFS_K_PART:
		if (write && d->st->state == MLFS_TRANSFORMING) {
			rc = -EBUSY;
			break;
		}
		if (write && !(f->path = strdup(t.path))) {
			rc = -ENOMEM;
			break;
		}
		if (write || !t.pin) { /* writers stage against the current content */
			f->buf =
			    xf_buf_get(xf_parts_at(&f->v->parts, f->rank, f->state, f->tensor));
			f->hdr_len = mlfs_part_header(d->st->schema, &f->v->layout, f->rank,
						      f->state, f->tensor, f->hdr, sizeof(f->hdr));
		} else { /* readers read what the inode names */
			f->buf = xf_buf_get(t.pin->bufs[0]);
			memcpy(f->hdr, t.pin->hdr, t.pin->hdr_len);
			f->hdr_len = t.pin->hdr_len;
		}
		mlfs_fh_stage_start(f, !(fi->flags & O_TRUNC));
		rc = 0;
		break;
	case MLFS_K_FFILE:
		rc = write ? -EACCES : t.pin ? 0 : -ESTALE;
		if (rc == 0) {
			f->pin = mlfs_pin_get(t.pin);
			memcpy(f->hdr, t.pin->hdr, t.pin->hdr_len);
			f->hdr_len = t.pin->hdr_len;
		}
		break;
	case MLFS_K_SFILE: /* the parts pinned at the lookup: one version to its end */
		rc = write ? -EACCES : t.pin ? 0 : -ESTALE;
		f->pin = rc ? NULL : mlfs_pin_get(t.pin);
		break;
	case MLFS_K_SINDEX:
		rc = write ? -EACCES : 0;
		fi->direct_io = 1;
		break;
	case MLFS_K_DDIR:
		rc = -EISDIR;
		break;
	case MLFS_K_DFILE:
		rc = write ? -EACCES : 0;
		f->dkind = t.e.dkind;
		f->step = t.e.step;
		f->first = t.e.first;
		f->count = t.e.count;
		f->nsteps = t.e.nsteps;
		mlfs_data_file_size(f->v->ds, f->first, f->count, f->nsteps, f->dkind, f->hdr,
				    sizeof(f->hdr), &f->hdr_len);
		break;
	}
	if (rc == 0 &&
	    (t.e.kind == MLFS_K_STATUS ||
	     (!write && t.e.kind != MLFS_K_JOB && t.e.kind != MLFS_K_PART &&
	      t.e.kind != MLFS_K_FFILE && t.e.kind != MLFS_K_SFILE && t.e.kind != MLFS_K_CTL))) {
		f->text = t.e.kind == MLFS_K_STATUS ? NULL : snapshot_text(d, &t.e, f->v);
		if (t.e.kind != MLFS_K_STATUS && !f->text)
			rc = -ENOMEM;
		f->text_len = f->text ? strlen(f->text) : 0;
	}
out_locked:
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	if (rc == 0 && f->kind == MLFS_K_STATUS) {
		/* Its text is all it reads: it pins no layout. A status.json kept
		 * open (a waiter polling it) would otherwise hold the layout a
		 * reconfiguration replaces, whose buffers it then copies instead
		 * of taking them over (twice the memory of a DP change). */
		mlfs_view_put(f->v);
		f->v = NULL;
		/* (read before the text: a poll sees the moves after it) */
		f->status_gen = atomic_load(&d->st->status_gen);
		f->text = mlfs_store_status_json(d->st);
		f->text_len = f->text ? strlen(f->text) : 0;
		rc = f->text ? 0 : -ENOMEM;
	}
	if (rc == 0 && f->kind == MLFS_K_DFILE) { /* may wait on the network: an I/O worker */
		rc = open_queue(d, open_job_run, req, fi, f, ino);
		if (rc == 0)
			return;
	}
	if (rc == 0 && (f->kind == MLFS_K_FFILE || f->kind == MLFS_K_SFILE) &&
	    f->pin->remote) { /* parts on peers */
		rc = open_queue(d, f->kind == MLFS_K_FFILE ? full_job_run : st_job_run, req, fi, f,
				ino);
		if (rc == 0)
			return;
	}
	if (rc == 0 && f->kind == MLFS_K_FFILE)
		rc = assemble_full(f);
	open_reply(req, fi, f, ino, rc);
}

/* Replies an open of @f (or its failure @rc, freeing @f). Any thread. */
static void open_reply(fuse_req_t req, struct fuse_file_info *fi, struct mlfs_fh *f, fuse_ino_t ino,
		       int rc)
{
	if (rc) {
		mlfs_fh_put(f);
		fuse_reply_err(req, -rc);
		return;
	}
	struct mlfs_daemon *d = f->d;
	bool write = f->write;
	if ((f->kind == MLFS_K_PART || f->kind == MLFS_K_FFILE || f->kind == MLFS_K_SFILE) &&
	    !write)
		fi->keep_cache = 1; /* this inode's pages are its pinned content's */
	else if (f->kind == MLFS_K_DFILE)
		fi->direct_io = 1; /* read once: straight to the reader, no page cache */
	else if (f->kind == MLFS_K_PART)
		fi->direct_io = 1; /* nothing staged reaches the page cache */
	fi->noflush = !write;	   /* a reader's flush does nothing: spare the round trip */
	fi->fh = (uintptr_t)f;
	if (mlfs_write_staged(f)) /* a truncation may follow: see mlfs_fresh_add */
		mlfs_fresh_add(f, ino, fuse_req_ctx(req)->pid);
	if (fuse_reply_open(req, fi)) {
		mlfs_fh_put(mlfs_fresh_take(d, f, 0, 0));
		mlfs_fh_put(f);
	}
}

/* Replies bytes [off, off+size) of header+data, with no copy on our side:
 * data alone through a pipe when @splice (large partitions: measured a
 * little faster cold), else one writev (dataset views: measured faster,
 * their replies being 1 MiB or less). */
static void reply_parts(fuse_req_t req, const char *hdr, size_t hlen, const uint8_t *data,
			size_t dlen, size_t size, off_t off, bool splice)
{
	size_t total = hlen + dlen, o = (size_t)off;
	if (o >= total) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > total - o)
		size = total - o;
	if (o >= hlen && splice) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
		bv.buf[0].mem = (void *)(data + (o - hlen));
		fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	if (o >= hlen) {
		struct iovec one = {(void *)(data + (o - hlen)), size};
		fuse_reply_iov(req, &one, 1);
		return;
	}
	struct iovec iov[2] = {{(void *)(hdr + o), hlen - o < size ? hlen - o : size},
			       {(void *)data, 0}};
	iov[1].iov_len = size - iov[0].iov_len;
	fuse_reply_iov(req, iov, iov[1].iov_len ? 2 : 1);
}

/* Bytes [off, off+size) of a dataset view or window: the header, then the
 * bodies of its views back to back (all of one length), in one writev. */
static void reply_views(fuse_req_t req, struct mlfs_fh *f, size_t size, off_t off)
{
	struct iovec iov[MLFS_DATA_WINDOW_MAX + 1];
	int n = 0;
	size_t o = (size_t)off, hlen = f->hdr_len;

	if (o < hlen && size) {
		iov[n] = (struct iovec){f->hdr + o, hlen - o < size ? hlen - o : size};
		size -= iov[n++].iov_len;
		o = hlen;
	}
	for (int64_t i = 0; i < f->nviews && size; i++) {
		const uint8_t *body;
		size_t len;
		mlfs_dview_body(f->views[i], f->dkind, &body, &len);
		if (o >= hlen + len) { /* before the range */
			o -= len;
			continue;
		}
		size_t a = o - hlen, k = len - a < size ? len - a : size;
		iov[n++] = (struct iovec){(void *)(body + a), k};
		size -= k;
		o = hlen;
	}
	fuse_reply_iov(req, iov, n);
}

/* Bytes [off, off+size) of a safetensors file, assembled from its pin. */
static void reply_st(fuse_req_t req, struct mlfs_fh *f, size_t size, off_t off)
{
	const struct mlfs_st_shard *sh = f->pin->sh;
	size_t n = off < sh->size ? (size_t)(sh->size - off) : 0;
	n = n < size ? n : size;
	uint8_t *buf = n ? malloc(n) : NULL;
	int rc = n && !buf ? -ENOMEM : 0;

	if (n && !rc)
		rc = mlfs_st_read(f->d->st->schema, sh, f->srcs ? f->srcs : f->pin->bufs, buf, off,
				  n);
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, (const char *)buf, n);
	free(buf);
}

static void read_fh(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct mlfs_fh *f)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	if (f->kind == MLFS_K_PART || f->kind == MLFS_K_FFILE) {
		struct xf_buf *b = mlfs_fh_buf(f);
		reply_parts(req, f->hdr, f->hdr_len, b->data, (size_t)b->size, size, off, true);
		xf_buf_put(b);
		return;
	}
	if (f->kind == MLFS_K_DFILE) {
		reply_views(req, f, size, off);
		return;
	}
	if (f->kind == MLFS_K_SFILE) {
		reply_st(req, f, size, off);
		return;
	}
	if (f->kind == MLFS_K_JOB) {
		struct mlfs_target t;
		int rc = mlfs_target_get(d, ino, &t);
		if (rc) {
			fuse_reply_err(req, -rc);
			return;
		}
		/* Pinned, replied from without a copy: a write meanwhile gives
		 * the file a new buffer. */
		size_t n = t.e.job->size, o = (size_t)off;
		size_t len = o < n ? (size < n - o ? size : n - o) : 0;
		struct mlfs_jbuf *b = len ? mlfs_jbuf_get(t.e.job->buf) : NULL;
		mlfs_target_done(&t);
		mlfs_target_put(&t);
		fuse_reply_buf(req, b ? (const char *)b->bytes + o : NULL, len);
		mlfs_jbuf_put(b);
		return;
	}
	/* A text: the open's snapshot, or .mlfs-ctl's last reply, which a write
	 * on the same handle may replace meanwhile: copy the range under the
	 * lock. */
	pthread_mutex_lock(&f->lock);
	size_t n = f->text ? f->text_len : 0, o = (size_t)off;
	size_t len = o < n ? (size < n - o ? size : n - o) : 0;
	char *copy = len ? malloc(len) : NULL;
	if (copy)
		memcpy(copy, f->text + o, len);
	pthread_mutex_unlock(&f->lock);
	if (len && !copy)
		fuse_reply_err(req, ENOMEM);
	else
		fuse_reply_buf(req, copy, len);
	free(copy);
}

void mlfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct mlfs_fh *f = mlfs_fh_get(mlfs_fh_of(fi));
	read_fh(req, ino, size, off, f);
	mlfs_fh_put(f);
}

void mlfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_fh *f = mlfs_fh_of(fi);
	(void)ino;

	mlfs_fh_put(mlfs_fresh_take(d, f, 0, 0));
	mlfs_write_release(f);
	mlfs_fh_put(f);
	fuse_reply_err(req, 0);
}
