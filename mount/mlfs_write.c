/*
 * mlfs_write.c - writes and the write policies: what a write to a partition
 * or a control text stages, what a flush commits (mlfs_write_flush), what
 * a release does with what is left (mlfs_write_release), and what a
 * truncation restarts (mlfs_write_truncate).
 *
 * The staging buffers themselves are mlfs_fh.c's (allocated, emptied,
 * handed over there); this file decides what goes in them and when they
 * are committed. Every function here that touches an open file's write
 * state or staging holds f->lock.
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

#include <jansson.h>

#include "mount/mount_i.h"
#include "common/common.h"

static void log_refusal(struct mlfs_daemon *d, const char *what, const char *why);

static void jscan_run(struct mlfs_jscan *j, const char *t, size_t len)
{
	for (; j->pos < len && !j->done; j->pos++) {
		char c = t[j->pos];
		if (j->str) {
			if (j->esc)
				j->esc = false;
			else if (c == '\\')
				j->esc = true;
			else if (c == '"')
				j->str = false;
		} else if (c == '"') {
			j->str = true;
		} else if (c == '{' || c == '[') {
			j->depth++;
			j->started = true;
		} else if (c == '}' || c == ']') {
			j->done = --j->depth <= 0; /* closed, or unbalanced: parse and say */
		}
	}
}

/* The most bytes a control file's text may have (documented in docs/single-node.md). */
static size_t text_limit(enum mlfs_kind k)
{
	switch (k) {
	case MLFS_K_SCHEMA:
		return MLFS_MAX_SCHEMA_TEXT;
	case MLFS_K_CONFIG:
		return MLFS_MAX_CONFIG_TEXT;
	case MLFS_K_CTL:
		return MLFS_MAX_CTL_TEXT;
	default:
		return 64; /* step */
	}
}

int mlfs_write_text(struct mlfs_fh *f, const char *buf, size_t size, off_t off)
{
	struct mlfs_daemon *d = f->d;
	size_t end = (size_t)off + size;
	if (end > text_limit(f->kind) || (size_t)off > text_limit(f->kind)) {
		char what[128];
		snprintf(what, sizeof(what), "more than %zu bytes; refused", text_limit(f->kind));
		log_refusal(d,
			    f->kind == MLFS_K_SCHEMA   ? "schema.json"
			    : f->kind == MLFS_K_CONFIG ? "config.json"
			    : f->kind == MLFS_K_CTL    ? MLFS_CTL_NAME
						       : "step",
			    what);
		return -EFBIG;
	}
	int rc = mlfs_fh_text_reserve(f, end);
	if (rc)
		return rc;
	if ((size_t)off > f->wlen)
		memset(f->w + f->wlen, 0, (size_t)off - f->wlen);
	if ((size_t)off < f->scan.pos) /* rewrites what was scanned: scan again */
		memset(&f->scan, 0, sizeof(f->scan));
	memcpy(f->w + off, buf, size);
	if (end > f->wlen)
		f->wlen = end;
	f->w[f->wlen] = '\0';
	return 0;
}

/* A refused write, in status.json's "error" and in the log. Tests refuse
 * writes on purpose: a warning, worded without "error". */
static void log_refusal(struct mlfs_daemon *d, const char *what, const char *why)
{
	char msg[PTC_ERROR_MAX];
	snprintf(msg, sizeof(msg), "%.300s: %.200s", what, why);
	mlfs_store_note_error(d->st, msg);
	mlfs_log(MLFS_LOG_WARNING, "write refused: %s", msg);
}

/* Logs a refused control write whose reason the store put in status.json
 * itself: @why, or @rc's text when @why is empty. */
static void log_ctl_refusal(const char *what, int rc, const char *why)
{
	if (why && why[0])
		mlfs_log(MLFS_LOG_WARNING, "write refused: %s", why);
	else
		mlfs_log(MLFS_LOG_WARNING, "write refused: %s: %s", what, strerror(-rc));
}

/* Records why a write to @f's partition was refused; returns -EINVAL. */
static int part_refuse(const struct mlfs_fh *f, const char *why)
{
	struct mlfs_daemon *d = f->d;
	log_refusal(d, f->path ? f->path : "partition", why);
	return -EINVAL;
}

/* Validates the complete staged header against the partition. */
static int check_staged_header(struct mlfs_fh *f)
{
	struct mlfs_daemon *d = f->d;
	struct mlfs_npy h;
	struct ptc_error why;
	int64_t shape[PTC_MAX_DIMS];
	const struct ptc_tensor *T = &d->st->schema->tensors[f->tensor];
	int nd = ptc_partition_shape(T, f->v->layout.tp, f->v->layout.ranks[f->rank].t, shape);
	int rc = mlfs_npy_parse(f->whdr, f->wtotal, &h, &why);

	if (rc == 0 && h.header_len != f->wtotal)
		rc = ptc_errorf(&why, "inconsistent header length");
	if (rc == 0)
		rc = mlfs_npy_check(&h, ptc_schema_dtype(d->st->schema, f->state, f->tensor), nd,
				    shape, &why);
	return rc ? part_refuse(f, why.text) : 0;
}

/* Stages a write into a partition file. */
static int part_write(struct mlfs_fh *f, const uint8_t *buf, size_t size, int64_t off)
{
	int64_t dlen = (int64_t)f->buf->size;
	int rc = mlfs_fh_stage_header(f);

	if (rc)
		return rc;
	while (size > 0) {
		if (f->wtotal == 0 || off < (int64_t)f->wtotal) { /* header bytes */
			size_t cap = f->wtotal ? f->wtotal : MLFS_STAGE_HDR_MAX;
			if (off > (int64_t)f->whave || (size_t)off >= cap)
				return part_refuse(f, "the .npy header must be written first, "
						      "in order");
			size_t n = size < cap - (size_t)off ? size : cap - (size_t)off;
			memcpy(f->whdr + off, buf, n);
			if ((size_t)off + n > f->whave)
				f->whave = (size_t)off + n;
			struct ptc_error why;
			char msg[128];
			int64_t decl = mlfs_npy_header_len(f->whdr, f->whave, &why);
			if (decl < 0) {
				snprintf(msg, sizeof(msg), "not a .npy file: %.95s", why.text);
				return part_refuse(f, msg);
			}
			if (f->wtotal && decl && (size_t)decl != f->wtotal)
				return part_refuse(f, "the .npy header length changed while "
						      "writing");
			if (decl > 0) {
				f->wtotal = (size_t)decl;
				if (f->whave > f->wtotal)
					f->whave = f->wtotal;
			}
			if (f->wtotal && f->whave >= f->wtotal && (rc = check_staged_header(f)))
				return rc;
			if (f->wtotal && (size_t)off + n > f->wtotal)
				n = f->wtotal - (size_t)off;
			off += (int64_t)n;
			buf += n;
			size -= n;
			continue;
		}
		if (f->whave < f->wtotal)
			return part_refuse(f, "data written before the .npy header was complete");
		int64_t at = off - (int64_t)f->wtotal;
		if (at + (int64_t)size > dlen)
			return part_refuse(f, "written past the partition's size");
		if ((rc = mlfs_fh_stage_data(f)))
			return rc;
		memcpy(f->wdata->data + at, buf, size);
		off += (int64_t)size;
		size = 0;
	}
	if (off > f->wend)
		f->wend = off;
	return 0;
}

/* Applies a control text: config.json and schema.json at the write that
 * completes their JSON value (parsed once, then), .mlfs-ctl at every write
 * (one request each), step and any text that never completed at the flush
 * (@final). f->lock held. */
static int ctl_try_commit(struct mlfs_fh *f, bool final)
{
	struct mlfs_daemon *d = f->d;
	struct ptc_error err = {.text = ""};
	const char *w = f->w ? f->w : "";
	int rc = 0;

	if (f->committed)
		return 0;
	if (!final && (f->kind == MLFS_K_CONFIG || f->kind == MLFS_K_SCHEMA)) {
		jscan_run(&f->scan, w, f->wlen);
		if (!f->scan.done)
			return 0; /* incomplete yet */
	} else if (!final && f->kind != MLFS_K_CTL) {
		return 0;
	}
	switch (f->kind) {
	case MLFS_K_CONFIG:
		if ((rc = mlfs_store_set_control(d->st, true, w, f->wlen, &err)))
			log_ctl_refusal("config.json", rc, err.text);
		break;
	case MLFS_K_SCHEMA:
		if ((rc = mlfs_store_set_control(d->st, false, w, f->wlen, &err)))
			log_ctl_refusal("schema.json", rc, err.text);
		break;
	case MLFS_K_STEP:
		/* Every refusal into status.json: a script that ignores the close's
		 * error (Python's garbage-collected files, `echo > step`) can still
		 * see why its step was not saved. */
		rc = mlfs_store_set_step(d->st, f->rank, w, f->wlen, &err);
		if (rc)
			log_refusal(d, "step", err.text[0] ? err.text : strerror(-rc));
		break;
	case MLFS_K_CTL: {
		char *reply = NULL;
		rc = mlfs_store_control(d->st, w, f->wlen, &reply);
		if (rc) { /* the reply says why: {"ok": false, "error": "..."} */
			json_t *j = reply ? json_loads(reply, 0, NULL) : NULL;
			log_ctl_refusal(MLFS_CTL_NAME, rc,
					json_string_value(json_object_get(j, "error")));
			json_decref(j);
		}
		free(f->text);
		f->text = reply;
		f->text_len = reply ? strlen(reply) : 0;
		f->wlen = 0;
		return rc;
	}
	default:
		break;
	}
	f->committed = true;
	return rc;
}

/* Writes to a job/ file (store lock taken here). */
static int job_write(struct mlfs_daemon *d, fuse_ino_t ino, const char *buf, size_t size, off_t off)
{
	struct mlfs_target t;
	int rc = mlfs_target_get(d, ino, &t);
	if (rc)
		return rc;
	size_t end = (size_t)off + size;
	if (end > MLFS_JOB_FILE_MAX)
		rc = -EFBIG;
	else /* in place, or into a new buffer when a reader pinned it */
		rc = mlfs_job_write(t.e.job, (size_t)off, (const uint8_t *)buf, size);
	if (rc == 0)
		mlfs_store_job_changed(d->st);
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	return rc;
}

static bool all_space(const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t')
			return false;
	return true;
}

/* A write to @f of the request's bytes, by thread @pid: 0 or a negative
 * errno. */
static int write_fh(struct mlfs_fh *f, fuse_ino_t ino, pid_t pid, const char *buf, size_t size,
		    off_t off)
{
	struct mlfs_daemon *d = f->d;

	mlfs_fh_put(mlfs_fresh_take(d, f, 0, 0)); /* written: no longer fresh */
	pthread_mutex_lock(&f->lock);
	int rc = f->err;
	if (rc == 0) {
		switch (f->kind) {
		case MLFS_K_PART:
			rc = part_write(f, (const uint8_t *)buf, size, off);
			break;
		case MLFS_K_JOB:
			rc = job_write(d, ino, buf, size, off);
			break;
		case MLFS_K_CONFIG:
		case MLFS_K_SCHEMA:
		case MLFS_K_STEP:
		case MLFS_K_CTL:
			if (f->committed) /* one text per open; trailing blanks are harmless */
				rc = all_space(buf, size) ? 0 : -EINVAL;
			else if ((rc = mlfs_write_text(f, buf, size,
						       f->kind == MLFS_K_CTL ? 0 : off)) == 0)
				rc = ctl_try_commit(f, f->kind == MLFS_K_CTL);
			break;
		default:
			rc = -EACCES;
		}
	}
	if (rc == 0) {
		f->dirty = true;
		f->wpid = pid;
	} else if (f->kind == MLFS_K_PART || f->kind == MLFS_K_CONFIG || f->kind == MLFS_K_SCHEMA) {
		f->err = rc;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

/* Whether a write or flush of @f may wait on the network or the disk: a
 * config.json may name a dataset index to fetch, .mlfs-ctl runs imports. */
static bool may_block(const struct mlfs_fh *f)
{
	/* a step is published to etcd at once, and schema.json proposed to
	 * it, in a job of many nodes: never on a FUSE worker */
	return f->kind == MLFS_K_CONFIG || f->kind == MLFS_K_CTL ||
	       (f->kind == MLFS_K_STEP && f->d->st->steps_saved) ||
	       (f->kind == MLFS_K_SCHEMA && f->d->st->propose);
}

/* A write or a flush run by an I/O worker (may_block). */
struct write_job {
	struct mlfs_io_job job;
	fuse_req_t req;
	struct mlfs_fh *f; /* a reference */
	fuse_ino_t ino;
	pid_t pid;
	bool flush;
	off_t off;
	size_t size;
	char data[]; /* the request's bytes: libfuse's buffer is gone once we return */
};

static void write_job_run(struct mlfs_io_job *j)
{
	struct write_job *w = (struct write_job *)j;
	int rc = w->flush ? mlfs_write_flush(w->f, w->pid)
			  : write_fh(w->f, w->ino, w->pid, w->data, w->size, w->off);
	if (rc || w->flush)
		fuse_reply_err(w->req, -rc);
	else
		fuse_reply_write(w->req, w->size);
	mlfs_fh_put(w->f);
	free(w);
}

static void write_job_cancel(struct mlfs_io_job *j)
{
	struct write_job *w = (struct write_job *)j;
	fuse_reply_err(w->req, EINTR);
	mlfs_fh_put(w->f);
	free(w);
}

/* Queues a write (@buf, @size) or a flush (@buf NULL) of @f: 0, or an error
 * for the caller to reply. */
static int queue_write(fuse_req_t req, struct mlfs_fh *f, fuse_ino_t ino, const char *buf,
		       size_t size, off_t off)
{
	struct write_job *w = malloc(sizeof(*w) + (buf ? size : 0));
	if (!w)
		return -ENOMEM;
	*w = (struct write_job){.job = {write_job_run, write_job_cancel, NULL},
				.req = req,
				.f = mlfs_fh_get(f), /* the job's reference */
				.ino = ino,
				.pid = fuse_req_ctx(req)->pid,
				.flush = !buf,
				.off = off,
				.size = size};
	if (buf)
		memcpy(w->data, buf, size);
	int rc = mlfs_io_submit(&f->d->io, &w->job);
	if (rc) {
		mlfs_fh_put(f); /* not the last: the open's reference remains */
		free(w);
	}
	return rc;
}

void mlfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	struct mlfs_fh *f = mlfs_fh_of(fi);
	int rc;

	if (may_block(f)) {
		if ((rc = queue_write(req, f, ino, buf, size, off)) == 0)
			return;
	} else {
		rc = write_fh(f, ino, fuse_req_ctx(req)->pid, buf, size, off);
	}
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_write(req, size);
}

/* Commits a staged partition write; 0 or a negative errno. f->lock held. */
static int part_commit(struct mlfs_fh *f)
{
	struct mlfs_daemon *d = f->d;
	int64_t dlen = (int64_t)f->buf->size;
	int rc;

	if (!f->whdr || f->wtotal == 0 || f->whave < f->wtotal)
		return part_refuse(f, "closed before its header was complete; previous content "
				      "kept");
	if (f->wend != (int64_t)f->wtotal + dlen) {
		char why[128];
		snprintf(why, sizeof(why),
			 "file is %" PRId64 " bytes, expected %" PRId64 "; previous content kept",
			 f->wend, (int64_t)f->wtotal + dlen);
		return part_refuse(f, why);
	}
	if ((rc = mlfs_fh_stage_data(f))) /* none when only the header was rewritten */
		return rc;
	/* the bytes are final: their checksum goes with them (xf_buf.c) */
	xf_buf_seal(f->wdata);
	rc = mlfs_store_commit_part(d->st, f->v, f->rank, f->state, f->tensor, f->wdata);
	if (rc == -ESTALE)
		part_refuse(f, "the layout changed while the file was open");
	else if (rc == -EBUSY)
		part_refuse(f, "a reconfiguration is running; previous content kept");
	if (rc)
		return rc;
	mlfs_fh_stage_promote(f); /* later writes restage from the new content */
	f->committed = true;
	mlfs_notify_part(d, f->v, f->rank, f->state, f->tensor);
	return 0;
}

/* Whether a partition's staged content is whole: header and every byte.
 * f->lock held. */
static bool part_complete(const struct mlfs_fh *f)
{
	return f->whdr && f->wtotal && f->whave >= f->wtotal &&
	       f->wend == (int64_t)f->wtotal + f->buf->size;
}

/* The flush policy (mount_i.h says which flushes commit, and why). */
int mlfs_write_flush(struct mlfs_fh *f, pid_t pid)
{
	pthread_mutex_lock(&f->lock);
	int rc = f->err;
	bool writer = pid == f->wpid;
	if (rc == 0 && f->write && f->dirty &&
	    (writer || (f->kind == MLFS_K_PART ? part_complete(f)
					       : f->kind == MLFS_K_STEP || f->committed))) {
		if (f->kind == MLFS_K_PART)
			rc = part_commit(f);
		else if (f->kind == MLFS_K_CONFIG || f->kind == MLFS_K_SCHEMA ||
			 f->kind == MLFS_K_STEP)
			rc = ctl_try_commit(f, true);
		if (rc == 0)
			f->dirty = false;
		else
			f->err = rc;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

bool mlfs_write_staged(const struct mlfs_fh *f)
{
	return f->write && (f->kind == MLFS_K_PART || f->kind == MLFS_K_CONFIG ||
			    f->kind == MLFS_K_SCHEMA || f->kind == MLFS_K_STEP);
}

/* open(O_TRUNC) or ftruncate(fd, 0) on an open writer restarts its
 * staging; the inode's content is unchanged until a commit. */
bool mlfs_write_truncate(struct mlfs_fh *f)
{
	if (!mlfs_write_staged(f))
		return false;
	pthread_mutex_lock(&f->lock);
	mlfs_fh_stage_truncate(f);
	f->truncated = true;
	pthread_mutex_unlock(&f->lock);
	return true;
}

void mlfs_write_release(struct mlfs_fh *f)
{
	if (!mlfs_write_staged(f))
		return;
	pthread_mutex_lock(&f->lock);
	if (f->kind == MLFS_K_PART) {
		if (f->err == 0 && f->dirty) /* written after the last commit */
			part_commit(f);
		else if (f->err == 0 && f->truncated && !f->committed)
			part_refuse(f, "truncated, then closed without a write; previous content "
				       "kept");
	} else if (f->err == 0 && f->dirty && !f->committed) {
		/* closed by a thread that did not write it */
		ctl_try_commit(f, true); /* a refusal is in status.json */
	}
	pthread_mutex_unlock(&f->lock);
}

void mlfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs_fh *f = mlfs_fh_of(fi);
	int rc;

	if (!may_block(f) || (rc = queue_write(req, f, ino, NULL, 0, 0)))
		rc = mlfs_write_flush(f, fuse_req_ctx(req)->pid);
	else
		return;
	fuse_reply_err(req, -rc);
}

void mlfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, 0);
}
