/*
 * mlfs_fh.c - the open-file object: its references, its staging buffers'
 * lifecycle, and the list of fresh writers.
 *
 * An open file (struct mlfs_fh) is made by an open or a create, whose
 * reply hands the kernel its first reference; a read, a queued write or
 * flush and a setattr each hold another while they use it, and the release
 * drops the kernel's. The last put frees it with everything it holds.
 *
 * The staging (a control text; a partition's header and data) is
 * allocated, emptied and handed over here, so that what it holds and what
 * --max-memory counts for it are settled in one file; what a write stages
 * and when a flush or release commits it are mlfs_write.c's policies.
 */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mount/mount_i.h"

struct mlfs_fh *mlfs_fh_new(struct mlfs_daemon *d, enum mlfs_kind kind)
{
	struct mlfs_fh *f = calloc(1, sizeof(*f));
	if (f) {
		atomic_init(&f->refs, 1);
		pthread_mutex_init(&f->lock, NULL);
		f->d = d;
		f->kind = kind;
	}
	return f;
}

struct mlfs_fh *mlfs_fh_get(struct mlfs_fh *f)
{
	if (f)
		atomic_fetch_add(&f->refs, 1);
	return f;
}

void mlfs_fh_put(struct mlfs_fh *f)
{
	if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	if (f->w)
		xf_mem_release(&f->d->st->mem, (int64_t)f->wcap + 1);
	pthread_mutex_destroy(&f->lock);
	free(f->path);
	xf_buf_put(f->buf);
	xf_buf_put(f->wdata);
	for (int64_t i = 0; i < f->nviews; i++)
		mlfs_dview_put(f->views[i]);
	free(f->views);
	for (int i = 0; i < f->nsrcs; i++)
		xf_buf_put(f->srcs[i]);
	free(f->srcs);
	mlfs_view_put(f->v);
	mlfs_pin_put(f->pin);
	free(f->text);
	free(f->w);
	free(f->whdr);
	free(f);
}

struct mlfs_fh *mlfs_fh_of(const struct fuse_file_info *fi)
{
	return (struct mlfs_fh *)(uintptr_t)fi->fh;
}

struct xf_buf *mlfs_fh_buf(struct mlfs_fh *f)
{
	pthread_mutex_lock(&f->lock); /* a writer's commit replaces buf */
	struct xf_buf *b = xf_buf_get(f->buf);
	pthread_mutex_unlock(&f->lock);
	return b;
}

/* ---------------------------------------------------------------- staging */

void mlfs_fh_stage_start(struct mlfs_fh *f, bool base)
{
	f->wbase = base;
}

int mlfs_fh_text_reserve(struct mlfs_fh *f, size_t len)
{
	struct mlfs_daemon *d = f->d;

	if (len <= f->wcap && f->w)
		return 0;
	size_t cap = f->wcap ? f->wcap : 4096;
	while (cap < len)
		cap *= 2;
	/* the NUL's byte too: the put releases wcap + 1 */
	int64_t more = (int64_t)cap + 1 - (f->w ? (int64_t)f->wcap + 1 : 0);
	int rc = xf_mem_reserve(&d->st->mem, more);
	if (rc)
		return rc;
	char *w = realloc(f->w, cap + 1);
	if (!w) {
		xf_mem_release(&d->st->mem, more);
		return -ENOMEM;
	}
	f->w = w;
	f->wcap = cap;
	return 0;
}

int mlfs_fh_stage_header(struct mlfs_fh *f)
{
	if (f->whdr)
		return 0;
	if (!(f->whdr = malloc(MLFS_STAGE_HDR_MAX)))
		return -ENOMEM;
	if (f->wbase) { /* start from the current content */
		memcpy(f->whdr, f->hdr, f->hdr_len);
		f->whave = f->wtotal = f->hdr_len;
		f->wend = (int64_t)f->hdr_len + f->buf->size;
	}
	return 0;
}

int mlfs_fh_stage_data(struct mlfs_fh *f)
{
	int64_t dlen = f->buf->size;
	int rc;

	if (f->wdata)
		return 0;
	if (!(f->wdata = xf_buf_new(&f->d->st->mem, dlen, &rc))) {
		if (rc == -ENOSPC) { /* refused: status.json says why, as for other refusals */
			struct mlfs_store *st = f->d->st;
			char msg[PTC_ERROR_MAX];
			snprintf(msg, sizeof(msg),
				 "%.300s: staging its %" PRId64
				 " bytes does not fit in --max-memory "
				 "(%" PRId64 " bytes in use of %" PRId64 "); previous content kept",
				 f->path ? f->path : "partition", dlen, (int64_t)st->mem.used,
				 st->mem.limit);
			mlfs_store_note_error(st, msg);
			mlfs_log(MLFS_LOG_WARNING, "write refused: %s", msg);
		}
		return rc;
	}
	if (f->wbase)
		memcpy(f->wdata->data, f->buf->data, (size_t)dlen);
	return 0;
}

void mlfs_fh_stage_truncate(struct mlfs_fh *f)
{
	f->wlen = 0;
	memset(&f->scan, 0, sizeof(f->scan));
	f->whave = f->wtotal = 0;
	f->wbase = false;
	f->wend = 0;
	xf_buf_put(f->wdata);
	f->wdata = NULL;
	free(f->whdr);
	f->whdr = NULL;
}

void mlfs_fh_stage_promote(struct mlfs_fh *f)
{
	assert(f->wdata);
	xf_buf_put(f->buf);
	f->buf = f->wdata;
	f->wdata = NULL;
	free(f->whdr);
	f->whdr = NULL;
	f->whave = f->wtotal = 0;
	f->wbase = true;
}

/* ---------------------------------------------------------- fresh writers */

void mlfs_fresh_add(struct mlfs_fh *f, fuse_ino_t ino, pid_t pid)
{
	struct mlfs_daemon *d = f->d;
	pthread_mutex_lock(&d->fresh.lock);
	f->ino = ino;
	f->pid = pid;
	atomic_store(&f->fresh_listed, true);
	f->fresh_next = d->fresh.head;
	d->fresh.head = f;
	pthread_mutex_unlock(&d->fresh.lock);
}

struct mlfs_fh *mlfs_fresh_take(struct mlfs_daemon *d, struct mlfs_fh *f, fuse_ino_t ino, pid_t pid)
{
	struct mlfs_fh *found = NULL;
	if (f && !atomic_load(&f->fresh_listed))
		return NULL;
	pthread_mutex_lock(&d->fresh.lock);
	for (struct mlfs_fh **pp = &d->fresh.head; *pp; pp = &(*pp)->fresh_next) {
		struct mlfs_fh *c = *pp;
		if (f ? c == f : c->ino == ino && c->pid == pid) {
			*pp = c->fresh_next;
			atomic_store(&c->fresh_listed, false);
			found = mlfs_fh_get(c);
			break;
		}
	}
	pthread_mutex_unlock(&d->fresh.lock);
	return found;
}
