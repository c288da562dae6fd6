/*
 * mlfs_import.c - `mlfs import`: full tensors (NumPy .npy files of a directory,
 * one per state and tensor) sliced into this node's partitions of the
 * current view, published at once as the saved state of a step; or a
 * snapshot (mlfs_snapshot.c: zstd-compressed boxes and manifest.json) read
 * into them, the rows each partition needs streamed out of the boxes that
 * hold them; or safetensors files (mlfs_stimport.c). All commit through
 * mlfs_import_commit.
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
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

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

/* The one commit of every kind of import: see store.h. */
int mlfs_import_commit(struct mlfs_store *st, struct mlfs_view *v, struct xf_parts *np,
		       int64_t step, struct ptc_error *err)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = st->schema;
	bool saved = false;
	int rc;

	/* the snapshots replaced (with "replicas"): put after unlocking */
	size_t nold = (size_t)l->node_nranks[st->node] * (size_t)s->nstates * (size_t)s->ntensors;
	struct xf_buf **oldsnap = v->snap ? calloc(nold ? nold : 1, sizeof(*oldsnap)) : NULL;
	if (v->snap && !oldsnap) {
		rc = -ENOMEM;
		return rc;
	}
	pthread_mutex_lock(&st->lock);
	if (!(rc = import_busy(st, v, err))) {
		for (size_t i = 0; i < xf_parts_count(np); i++) {
			if (!np->bufs[i])
				continue; /* not imported: whatever was written stays */
			struct xf_buf *tmp = v->parts.bufs[i];
			v->parts.bufs[i] = np->bufs[i];
			np->bufs[i] = tmp;
		}
		for (int r = 0; r < l->world; r++)
			st->steps[r] = step;
		mlfs_store_saving(st, true); /* every partition is @step's now */
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
	return rc;
}

/* --------------------------------------------------------------- snapshots */

/*
 * A snapshot (mlfs_snapshot.c: manifest.json and zstd-compressed .npy
 * boxes) restored into the current layout, whatever it is. The manifest is
 * checked against the schema first (every file's tensor, state, dtype and
 * box; every row of every tensor this node needs covered), then only the
 * files whose rows some local partition needs are read, each once, in
 * parallel: streamed through zstd in pieces of ZSTD_DStreamOutSize(),
 * hashed on the way (XXH3 of the uncompressed .npy), its rows scattered
 * into every new partition that holds them. No full tensor is staged. A
 * file whose size, header, length or checksum is not the manifest's fails
 * the restore naming it, and nothing changes (mlfs_import_commit is reached
 * only when every file checked out).
 */

/* One copy out of a box: rows [brow, brow + rows) of the box (each outer
 * block) to rows [prow, ...) of a new partition of @prows rows. */
struct snap_target {
	struct xf_buf *dst;
	int64_t prows, prow, brow, rows;
};

struct snap_file {
	const char *path; /* relative, from the manifest */
	int state, tensor;
	int64_t global, len; /* the box's rows of the split dimension */
	int64_t bytes, zbytes;
	uint64_t sum;
	struct snap_target *tg;
	int ntg, captg;
	char why[512];
};

struct snap_read {
	const struct ptc_schema *s;
	const char *dir;
	struct snap_file *files;
	size_t n;
	_Atomic size_t next;
};

static int json_i64_array(json_t *a, int n, int64_t *out)
{
	if (!json_is_array(a) || (int)json_array_size(a) != n)
		return -1;
	for (int i = 0; i < n; i++) {
		json_t *x = json_array_get(a, (size_t)i);
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return -1;
		out[i] = json_integer_value(x);
	}
	return 0;
}

/* Checks manifest entry @e against the schema into @f: NULL, or why not. */
static const char *snap_entry(const struct ptc_schema *s, json_t *e, struct snap_file *f)
{
	const char *path = json_string_value(json_object_get(e, "path"));
	const char *tn = json_string_value(json_object_get(e, "tensor"));
	const char *sn = json_string_value(json_object_get(e, "state"));
	const char *dn = json_string_value(json_object_get(e, "dtype"));
	const char *hx = json_string_value(json_object_get(e, "xxh3"));
	json_t *jb = json_object_get(e, "bytes"), *jz = json_object_get(e, "compressed");
	int64_t off[PTC_MAX_DIMS], shp[PTC_MAX_DIMS], tsh[PTC_MAX_DIMS];
	char *end;

	if (!path || !*path || path[0] == '/' || strstr(path, "..") || !tn || !sn || !dn || !hx ||
	    !json_is_integer(jb) || !json_is_integer(jz) || json_integer_value(jb) < 0 ||
	    json_integer_value(jz) < 0)
		return "malformed entry (path, tensor, state, dtype, bytes, compressed, xxh3)";
	f->path = path;
	if ((f->tensor = ptc_schema_find(s, tn)) < 0 || s->tensors[f->tensor].tied >= 0)
		return "its tensor is not a tensor of this schema";
	if ((f->state = ptc_schema_find_state(s, sn)) < 0)
		return "its state is not a state of this schema";
	const struct ptc_tensor *t = &s->tensors[f->tensor];
	if (strcmp(dn, ptc_dtype_name(ptc_schema_dtype(s, f->state, f->tensor))))
		return "its dtype is not the schema's";
	if (json_i64_array(json_object_get(e, "tensor_shape"), t->ndim, tsh) ||
	    json_i64_array(json_object_get(e, "offsets"), t->ndim, off) ||
	    json_i64_array(json_object_get(e, "shape"), t->ndim, shp))
		return "its shapes do not have the tensor's dimensions";
	for (int i = 0; i < t->ndim; i++) {
		if (tsh[i] != t->shape[i])
			return "its tensor's shape is not the schema's";
		if (i != t->split_dim && (off[i] != 0 || shp[i] != t->shape[i]))
			return "its box is not whole along an unsplit dimension";
	}
	f->global = t->split_dim < 0 ? 0 : off[t->split_dim];
	f->len = t->split_dim < 0 ? 1 : shp[t->split_dim];
	if (t->split_dim >= 0 && (f->len < 1 || f->global + f->len > t->shape[t->split_dim]))
		return "its box is outside the tensor";
	f->bytes = json_integer_value(jb);
	f->zbytes = json_integer_value(jz);
	errno = 0;
	f->sum = strtoull(hx, &end, 16);
	if (errno || *end || strlen(hx) != 16)
		return "its xxh3 is not 16 hex digits";
	return NULL;
}

static int cmp_range(const void *a, const void *b)
{
	const int64_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Copies the piece [pos, pos + n) of a box's data into its targets. */
static void snap_scatter(struct snap_file *f, int64_t rb, int64_t pos, const uint8_t *p, size_t n)
{
	int64_t blk = f->len * rb; /* one outer block of the box */
	if (blk == 0)
		return;
	for (int k = 0; k < f->ntg; k++) {
		struct snap_target *g = &f->tg[k];
		int64_t lo = g->brow * rb, hi = (g->brow + g->rows) * rb;
		for (int64_t o = pos / blk; o * blk < pos + (int64_t)n; o++) {
			int64_t a = o * blk + lo, b = o * blk + hi;
			if (a < pos)
				a = pos;
			if (b > pos + (int64_t)n)
				b = pos + (int64_t)n;
			if (a >= b)
				continue;
			int64_t in = a - o * blk - lo; /* bytes into the target's rows */
			memcpy(g->dst->data + (o * g->prows + g->prow) * rb + in, p + (a - pos),
			       (size_t)(b - a));
		}
	}
}

/* Reads, checks and scatters one file: 0, or -EINVAL with f->why. */
static int snap_file_read(const struct snap_read *sr, struct snap_file *f, ZSTD_DCtx *dc,
			  uint8_t *in, size_t incap, uint8_t *out, size_t outcap)
{
	const struct ptc_tensor *t = &sr->s->tensors[f->tensor];
	enum ptc_dtype dt = ptc_schema_dtype(sr->s, f->state, f->tensor);
	int64_t outer, rowel, shape[PTC_MAX_DIMS];
	uint8_t head[MLFS_NPY_MAX_HEADER + 12];
	size_t hn = 0, hl = 0;
	int64_t got = 0, zgot = 0;
	char path[4096];
	struct stat sb;
	struct ptc_error why = {.text = ""};
	XXH3_state_t *xs = XXH3_createState();
	int fd = -1;
	size_t last = 1;

	ptc_tensor_geometry(t, &outer, &rowel);
	int64_t rb = rowel * (int64_t)ptc_dtype_size(dt);
	memcpy(shape, t->shape, sizeof(shape));
	if (t->split_dim >= 0)
		shape[t->split_dim] = f->len;
	snprintf(path, sizeof(path), "%s/%s", sr->dir, f->path);
	if (!xs) {
		snprintf(f->why, sizeof(f->why), "out of memory");
		return -ENOMEM;
	}
	XXH3_64bits_reset(xs);
	ZSTD_DCtx_reset(dc, ZSTD_reset_session_only);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0) {
		snprintf(f->why, sizeof(f->why), "%s", strerror(errno));
		goto bad;
	}
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		snprintf(f->why, sizeof(f->why), "not a regular file");
		goto bad;
	}
	if (sb.st_size != f->zbytes) {
		snprintf(f->why, sizeof(f->why),
			 "%" PRId64 " bytes, the manifest says %" PRId64 " (truncated or replaced)",
			 (int64_t)sb.st_size, f->zbytes);
		goto bad;
	}
	for (;;) {
		ssize_t r = read(fd, in, incap);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(f->why, sizeof(f->why), "%s", strerror(errno));
			goto bad;
		}
		if (r == 0)
			break;
		zgot += r;
		ZSTD_inBuffer ib = {in, (size_t)r, 0};
		while (ib.pos < ib.size) {
			ZSTD_outBuffer ob = {out, outcap, 0};
			last = ZSTD_decompressStream(dc, &ob, &ib);
			if (ZSTD_isError(last)) {
				snprintf(f->why, sizeof(f->why), "corrupt zstd data (%s)",
					 ZSTD_getErrorName(last));
				goto bad;
			}
			if (last == 0 && ib.pos < ib.size) {
				snprintf(f->why, sizeof(f->why), "data after the zstd frame");
				goto bad;
			}
			if (got + (int64_t)ob.pos > f->bytes) {
				snprintf(f->why, sizeof(f->why),
					 "decompresses to more than the manifest's %" PRId64
					 " bytes",
					 f->bytes);
				goto bad;
			}
			XXH3_64bits_update(xs, out, ob.pos);
			size_t skip = 0;
			if (!hl) { /* the .npy header, gathered until it parses */
				size_t take =
				    ob.pos < sizeof(head) - hn ? ob.pos : sizeof(head) - hn;
				memcpy(head + hn, out, take);
				hn += take;
				struct mlfs_npy h;
				int prc = mlfs_npy_parse(head, hn, &h, &why);
				if (prc == -EAGAIN && hn < sizeof(head))
					skip = ob.pos;
				else if (prc || mlfs_npy_check(&h, dt, t->ndim, shape, &why)) {
					snprintf(f->why, sizeof(f->why), "%s",
						 prc == -EAGAIN ? "truncated header" : why.text);
					goto bad;
				} else {
					hl = h.header_len;
					if ((int64_t)hl + outer * f->len * rb != f->bytes) {
						snprintf(f->why, sizeof(f->why),
							 "its header and the manifest disagree on "
							 "its size");
						goto bad;
					}
					skip = hl > (size_t)got ? hl - (size_t)got : 0;
				}
			}
			if (hl && skip < ob.pos)
				snap_scatter(f, rb, got + (int64_t)skip - (int64_t)hl, out + skip,
					     ob.pos - skip);
			got += (int64_t)ob.pos;
		}
	}
	if (last != 0 || got != f->bytes || zgot != f->zbytes) {
		snprintf(f->why, sizeof(f->why),
			 "ends early: %" PRId64 " of %" PRId64 " bytes (truncated)", got, f->bytes);
		goto bad;
	}
	uint64_t sum = XXH3_64bits_digest(xs);
	if (sum != f->sum) {
		snprintf(f->why, sizeof(f->why),
			 "checksum mismatch: xxh3 %016" PRIx64 ", the manifest says %016" PRIx64,
			 sum, f->sum);
		goto bad;
	}
	close(fd);
	XXH3_freeState(xs);
	return 0;
bad:
	if (fd >= 0)
		close(fd);
	XXH3_freeState(xs);
	return -EINVAL;
}

static void *snap_read_worker(void *arg)
{
	struct snap_read *sr = arg;
	ZSTD_DCtx *dc = ZSTD_createDCtx();
	size_t incap = ZSTD_DStreamInSize(), outcap = ZSTD_DStreamOutSize();
	uint8_t *in = malloc(incap), *out = malloc(outcap);

	for (;;) {
		size_t i = atomic_fetch_add(&sr->next, 1);
		if (i >= sr->n)
			break;
		if (!sr->files[i].ntg)
			continue; /* no row of it is needed here */
		if (!dc || !in || !out)
			snprintf(sr->files[i].why, sizeof(sr->files[i].why), "out of memory");
		else
			snap_file_read(sr, &sr->files[i], dc, in, incap, out, outcap);
	}
	free(in);
	free(out);
	ZSTD_freeDCtx(dc);
	return NULL;
}

/* Appends "; <msg>" (or "<msg>") to @err while it has room. */
static void err_append(struct ptc_error *err, int *omitted, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void err_append(struct ptc_error *err, int *omitted, const char *fmt, ...)
{
	char line[1024];
	size_t used = strlen(err->text);
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (*omitted == 0 && used + (size_t)n + 40 < sizeof(err->text))
		snprintf(err->text + used, sizeof(err->text) - used, "%s%s", used ? "; " : "",
			 line);
	else
		(*omitted)++;
	err->code = -EINVAL;
}

/* The snapshot in @dir (its manifest.json) into this node's partitions of
 * @v: see above. @step < 0: the snapshot's. */
static int snap_import(struct mlfs_store *st, struct mlfs_view *v, const char *dir, int only,
		       int64_t step, struct ptc_error *err)
{
	const struct ptc_schema *s = st->schema;
	const struct ptc_layout *l = &v->layout;
	struct snap_file *files = NULL;
	struct xf_parts np;
	char path[4096];
	json_error_t je;
	int rc, omitted = 0;
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	json_t *m = json_load_file(path, 0, &je);
	if (!m)
		return ptc_errorf(err, "import: %s: %s (line %d)", path, je.text, je.line);
	json_t *jf = json_object_get(m, "files"), *js = json_object_get(m, "step");
	if (!json_is_string(json_object_get(m, "format")) ||
	    strcmp(json_string_value(json_object_get(m, "format")), "mlfs-snapshot") ||
	    json_integer_value(json_object_get(m, "format_version")) != 1 || !json_is_array(jf) ||
	    !json_is_integer(js) || json_integer_value(js) < 0) {
		rc = ptc_errorf(err, "import: %s: not an mlfs snapshot manifest (format 1)", path);
		goto out_m;
	}
	if (step < 0)
		step = json_integer_value(js);
	n = json_array_size(jf);
	rc = -ENOMEM;
	if (!(files = calloc(n ? n : 1, sizeof(*files))) || xf_parts_init(&np, l, st->node)) {
		free(files);
		ptc_error_set(err, rc, "import: out of memory");
		goto out_m;
	}
	for (size_t i = 0; i < n; i++) {
		const char *why = snap_entry(s, json_array_get(jf, i), &files[i]);
		if (why)
			err_append(err, &omitted, "manifest.json: files[%zu] (%s): %s", i,
				   files[i].path ? files[i].path : "?", why);
	}
	if (err->text[0])
		goto bad;
	/* Every row of every (state, tensor) a local rank holds is covered. */
	int64_t(*rng)[2] = calloc(n ? n : 1, sizeof(*rng));
	if (!rng) {
		rc = ptc_error_set(err, -ENOMEM, "import: out of memory");
		goto out_parts;
	}
	int r0 = l->node_first_rank[st->node], nr = r0 < 0 ? 0 : l->node_nranks[st->node];
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++) {
			const struct ptc_tensor *t = &s->tensors[ti];
			bool held = false;
			for (int r = r0; r < r0 + nr && !held; r++)
				for (int tj = 0; tj < s->ntensors && !held; tj++)
					held = ptc_schema_logical(s, tj) == ti &&
					       ptc_layout_holds(l, r, tj);
			if (t->tied >= 0 || (only >= 0 && si != only) || !held)
				continue;
			size_t k = 0;
			for (size_t i = 0; i < n; i++)
				if (files[i].state == si && files[i].tensor == ti) {
					rng[k][0] = files[i].global;
					rng[k++][1] = files[i].global + files[i].len;
				}
			qsort(rng, k, sizeof(*rng), cmp_range);
			int64_t at = 0, want = t->split_dim < 0 ? 1 : t->shape[t->split_dim];
			for (size_t j = 0; j < k && rng[j][0] <= at; j++)
				at = rng[j][1] > at ? rng[j][1] : at;
			if (at < want)
				err_append(err, &omitted,
					   "manifest.json: no file holds rows %" PRId64
					   " to %" PRId64 " of %s/%s",
					   at, want, s->states[si].name, t->name);
		}
	free(rng);
	if (err->text[0])
		goto bad;
	/* The new partitions, and what each file gives them. */
	for (int r = r0; r < r0 + nr; r++)
		for (int si = 0; si < s->nstates; si++)
			for (int ti = 0; ti < s->ntensors; ti++) {
				if (!ptc_layout_holds(l, r, ti) || (only >= 0 && si != only))
					continue;
				size_t pi = xf_parts_index(&np, r, si, ti);
				struct xf_buf *b =
				    xf_buf_new(&st->mem, xf_partition_bytes(l, r, si, ti), &rc);
				if (!(np.bufs[pi] = b)) {
					ptc_error_set(err, rc, "import: %s",
						      rc == -ENOSPC
							  ? "the partitions do not fit in "
							    "--max-memory"
							  : "out of memory");
					goto out_parts;
				}
				struct ptc_slice sl;
				ptc_slice_compute(&s->tensors[ti], l->tp, l->ranks[r].t, &sl);
				int logical = ptc_schema_logical(s, ti);
				for (size_t i = 0; i < n; i++) {
					struct snap_file *f = &files[i];
					if (f->state != si || f->tensor != logical)
						continue;
					for (int g = 0; g < sl.nsegs; g++) {
						const struct ptc_seg *sg = &sl.segs[g];
						int64_t a = sg->global, e = sg->global + sg->len;
						if (sg->global < 0)
							continue;
						a = a > f->global ? a : f->global;
						e = e < f->global + f->len ? e : f->global + f->len;
						if (a >= e)
							continue;
						if (f->ntg == f->captg) {
							int nc = f->captg ? 2 * f->captg : 4;
							void *p = realloc(
							    f->tg, (size_t)nc * sizeof(*f->tg));
							if (!p) {
								rc = ptc_error_set(
								    err, -ENOMEM,
								    "import: out of memory");
								goto out_parts;
							}
							f->tg = p;
							f->captg = nc;
						}
						f->tg[f->ntg++] = (struct snap_target){
						    .dst = b,
						    .prows = sl.rows,
						    .prow = sg->local + (a - sg->global),
						    .brow = a - f->global,
						    .rows = e - a};
					}
				}
			}
	struct snap_read sr = {.s = s, .dir = dir, .files = files, .n = n};
	atomic_init(&sr.next, 0);
	mlfs_par_run(st->threads > 0 ? st->threads : 1, snap_read_worker, &sr);
	for (size_t i = 0; i < n; i++)
		if (files[i].why[0])
			err_append(err, &omitted, "%s/%s: %s", dir, files[i].path, files[i].why);
	if (err->text[0])
		goto bad;
	for (size_t i = 0; i < xf_parts_count(&np); i++)
		if (np.bufs[i])
			xf_buf_seal(np.bufs[i]);
	rc = mlfs_import_commit(st, v, &np, step, err);
	goto out_parts;
bad:
	if (omitted) {
		size_t used = strlen(err->text);
		snprintf(err->text + used, sizeof(err->text) - used, "; and %d more", omitted);
	}
	char tmp[PTC_ERROR_MAX];
	memcpy(tmp, err->text, sizeof(tmp));
	rc = ptc_error_set(err, -EINVAL, "import: %.*s; nothing imported", (int)(sizeof(tmp) - 40),
			   tmp);
out_parts:
	xf_parts_release(&np);
	for (size_t i = 0; i < n; i++)
		free(files[i].tg);
	free(files);
out_m:
	json_decref(m);
	return rc;
}

/* Imports full tensors from @dir into every local partition of the current
 * view, for one state (@only >= 0) or all. All or nothing: the partitions
 * are built aside, then only the imported ones are swapped in, under the
 * lock (a write to another state meanwhile stays). */
int mlfs_store_import(struct mlfs_store *st, const char *dir, int only, int64_t step,
		      struct ptc_error *err)
{
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
	char mpath[4096];
	snprintf(mpath, sizeof(mpath), "%s/manifest.json", dir);
	if (mlfs_st_source(st->schema, dir, only)) { /* safetensors */
		mlfs_view_put(v);
		return mlfs_store_import_st(st, dir, only, step, "schema", NULL, err);
	}
	if (access(mpath, F_OK) == 0) { /* a snapshot */
		rc = snap_import(st, v, dir, only, step, err);
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
	rc = mlfs_import_commit(st, v, &np, step < 0 ? 0 : step, err);
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
