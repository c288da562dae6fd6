/*
 * mlfs_import.c - `mlfs import`: full tensors (NumPy .npy files of a directory,
 * one per state and tensor) sliced into this node's partitions of the
 * current view, published at once as the saved state of a step.
 *
 * Threads: a FUSE worker (the .mlfs-ctl request); files are mapped and read
 * without the lock, the new partitions swapped in under it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"
#include "dataset/dataset.h"

/* ------------------------------------------------------------------ import */

struct import_file {
	void *map;
	size_t maplen;
	const uint8_t *data;
};

/* Maps and checks DIR/<state>/<tensor>.npy. Returns 0 or -EINVAL with a
 * message appended to @err, or counted in @omitted when @err is full. */
static int import_open(const char *dir, const struct ptc_schema *s, int si, int ti,
		       struct import_file *f, struct ptc_error *err, int *omitted)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	char path[4096];
	struct ptc_error why;
	struct mlfs_npy h;
	struct stat sb;
	size_t used = strlen(err->text);
	int fd;

	snprintf(path, sizeof(path), "%s/%s/%s.npy", dir, s->states[si].name, t->name);
	/* O_NONBLOCK: a FIFO must not block the import (fstat refuses it). */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0) {
		ptc_errorf(&why, "%s", strerror(errno));
		goto bad;
	}
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		close(fd);
		ptc_errorf(&why, "not a regular file");
		goto bad;
	}

	f->maplen = (size_t)sb.st_size;
	f->map = f->maplen ? mmap(NULL, f->maplen, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
	close(fd);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		ptc_errorf(&why, "empty or unreadable");
		goto bad;
	}
	/* The file may shrink from now on: every read of the mapping is guarded
	 * (mlfs_mapcopy turns the SIGBUS into -EIO). */
	uint8_t head[MLFS_NPY_MAX_HEADER + 12];
	size_t hn = f->maplen < sizeof(head) ? f->maplen : sizeof(head);
	if (mlfs_mapcopy(head, f->map, hn)) {
		ptc_errorf(&why, "shorter than when opened (changed while imported?)");
		goto bad;
	}
	int rc = mlfs_npy_parse(head, hn, &h, &why);
	if (rc == -EAGAIN)
		ptc_errorf(&why, "truncated header");
	if (rc || mlfs_npy_check(&h, ptc_schema_dtype(s, si, ti), t->ndim, t->shape, &why))
		goto bad;
	int64_t want = xf_full_bytes(s, si, ti);
	if ((int64_t)(f->maplen - h.header_len) != want) {
		ptc_errorf(&why, "holds %zu data bytes, expected %" PRId64,
			   f->maplen - h.header_len, want);
		goto bad;
	}
	f->data = (const uint8_t *)f->map + h.header_len;
	return 0;
bad:;
	char line[4096 + 512];
	int n = snprintf(line, sizeof(line), "%s%s/%s.npy: %s", used ? "; " : "",
			 s->states[si].name, t->name, why.text);
	if (*omitted == 0 && used + (size_t)n + 32 < sizeof(err->text)) /* room for "and N more" */
		memcpy(err->text + used, line, (size_t)n + 1);
	else
		(*omitted)++;
	err->code = -EINVAL;
	return -EINVAL;
}

/* -EBUSY with @err when @v is no longer current or a reconfiguration holds
 * the store, else 0. Lock held. */
static int import_busy(struct mlfs_store *st, struct mlfs_view *v, struct ptc_error *err)
{
	struct ptc_error busy = {.text = ""};
	int rc = -EBUSY;

	if (st->view != v)
		ptc_error_set(err, rc, "import: the layout changed during the import");
	else if ((rc = mlfs_reconf_busy(st, "import", &busy)))
		ptc_error_set(err, rc, "%s", busy.text);
	return rc;
}

/* Imports full tensors from @dir into every local partition of the current
 * view, for one state (@only >= 0) or all. All or nothing: the partitions
 * are built aside, then only the imported ones are swapped in, under the
 * lock (a write to another state meanwhile stays). */
int mlfs_store_import(struct mlfs_store *st, const char *dir, int only, int64_t step,
		      struct ptc_error *err)
{
	bool saved = false;
	struct mlfs_view *v = mlfs_store_view(st);
	const struct ptc_schema *s = st->schema;
	struct import_file *files = NULL;
	struct xf_parts np;
	int rc = -ENOMEM;

	if (!v)
		return ptc_errorf(err, "import: set schema.json and config.json first");
	/* Refused at once rather than after reading every file. */
	pthread_mutex_lock(&st->lock);
	rc = import_busy(st, v, err);
	pthread_mutex_unlock(&st->lock);
	if (rc) {
		mlfs_view_put(v);
		return rc;
	}
	rc = -ENOMEM;
	size_t nf = (size_t)s->nstates * (size_t)s->ntensors;
	if (!(files = calloc(nf, sizeof(*files))) || xf_parts_init(&np, &v->layout, st->node))
		goto out;
	int bad = 0, omitted = 0;
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++)
			if ((only < 0 || si == only) && s->tensors[ti].tied < 0 &&
			    import_open(dir, s, si, ti, &files[si * s->ntensors + ti], err,
					&omitted))
				bad++;
	if (bad) {
		if (omitted) {
			size_t used = strlen(err->text);
			snprintf(err->text + used, sizeof(err->text) - used, "; and %d more",
				 omitted);
		}
		rc = -EINVAL;
		err->code = rc;
		goto out_parts;
	}
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[st->node];
	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++)
		for (int si = 0; si < s->nstates; si++)
			for (int ti = 0; ti < s->ntensors; ti++) {
				size_t i = xf_parts_index(&np, r, si, ti);
				if (!ptc_layout_holds(l, r, ti) || (only >= 0 && si != only))
					continue;
				const struct import_file *f =
				    &files[si * s->ntensors + ptc_schema_logical(s, ti)];
				if (!(np.bufs[i] = xf_buf_new(
					  &st->mem, xf_partition_bytes(l, r, si, ti), &rc))) {
					ptc_error_set(err, rc, "import: %s",
						      rc == -ENOSPC
							  ? "the partitions do not fit in "
							    "--max-memory"
							  : "out of memory");
					goto out_parts;
				}
				/* The file may shrink meanwhile: read through the SIGBUS guard. */
				if ((rc = xf_full_slice(s, si, ti, l->tp, l->ranks[r].t, f->data,
							np.bufs[i], mlfs_mapcopy))) {
					ptc_error_set(
					    err, rc,
					    "import: %s/%s.npy: the file shrank while it was read; "
					    "nothing imported",
					    s->states[si].name,
					    s->tensors[ptc_schema_logical(s, ti)].name);
					goto out_parts;
				}
				xf_buf_seal(np.bufs[i]); /* committed below; hashed while hot */
			}
	/* the snapshots replaced (with "replicas"): put after unlocking */
	size_t nold = (size_t)l->node_nranks[st->node] * (size_t)s->nstates * (size_t)s->ntensors;
	struct xf_buf **oldsnap = v->snap ? calloc(nold ? nold : 1, sizeof(*oldsnap)) : NULL;
	if (v->snap && !oldsnap) {
		rc = -ENOMEM;
		goto out_parts;
	}
	pthread_mutex_lock(&st->lock);
	if (!(rc = import_busy(st, v, err))) {
		for (size_t i = 0; i < (size_t)l->world * (size_t)s->nstates * (size_t)s->ntensors;
		     i++) {
			if (!np.bufs[i])
				continue; /* not imported: whatever was written stays */
			struct xf_buf *tmp = v->parts.bufs[i];
			v->parts.bufs[i] = np.bufs[i];
			np.bufs[i] = tmp;
		}
		for (int r = 0; r < l->world; r++)
			st->steps[r] = step;
		mlfs_view_snap_local(st, v, oldsnap);
		saved = true;
		rc = 0;
	}
	pthread_mutex_unlock(&st->lock);
	if (oldsnap)
		mlfs_bufs_put(oldsnap, nold);
	free(oldsnap);
	if (saved && st->steps_saved)
		st->steps_saved(st->cluster_arg);
	if (rc == 0) {
		mlfs_store_changed(st, "");
		mlfs_store_prefetch(st, v, step);
	}
out_parts:
	xf_parts_release(&np);
out:
	for (size_t i = 0; files && i < nf; i++)
		if (files[i].map)
			munmap(files[i].map, files[i].maplen);
	free(files);
	mlfs_view_put(v);
	return rc;
}
