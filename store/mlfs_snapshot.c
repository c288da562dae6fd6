/*
 * mlfs_snapshot.c - `mlfs snapshot` (.mlfs-ctl "snapshot"): the job's saved
 * step written to a directory as zstd-compressed .npy boxes and a manifest.
 *
 * DESIGN
 * A snapshot of step N is a directory:
 *   <state>/<tensor>.npy.zst              a box covering the whole tensor
 *   <state>/<tensor>.<a>-<b>.npy.zst      rows [a, b) of the split dimension
 *   manifest.json                         written last: the snapshot exists
 * Each box file is one zstd frame (with zstd's content checksum) of an
 * ordinary .npy file: `zstd -d` then numpy.load reads it without mlfs. A box
 * is one logical segment of a partition (ptc_slice_compute): the rows
 * [a, b) of the split dimension, every other dimension whole; padding is
 * never written. bfloat16 and fp8 are stored as their raw "<u2" / "|u1"
 * (the manifest names the real dtype).
 *
 * Minimality: each row range is written once in the whole job. The owner
 * of a box is the lowest-numbered rank holding it: for a split tensor's
 * TP slice t, rank (t, dp 0, the first stage holding the tensor); for a
 * replicated tensor, rank (0, 0, that stage); tied tensors are written
 * once, under the tensor they copy. Each node writes the boxes of the
 * owner ranks it hosts, in parallel (mlfs_par_run on st->threads), each
 * read from the committed buffers pinned under the store lock and then
 * compressed with no lock held (a write meanwhile swaps in a new buffer;
 * the pinned one stays as it was). With "replicas", the pinned saved state
 * (v->snap) of the step is used.
 *
 * Level: MLFS_SNAP_LEVEL (1) by default. Measured with `zstd -b<L> -i2` on
 * 32 MiB of bf16 weights (N(0, 0.02)) and fp32 Adam moments on the
 * development machine: level 1 compresses bf16 1.282x at 654 MB/s a thread
 * and fp32 moments 1.082-1.084x at 693-697 MB/s; level 3 gives the same
 * ratios at 542-675 MB/s; level 9 gains 1% on bf16 (1.298x) at 81 MB/s;
 * level 19 nothing, at 2-4 MB/s. Floating-point state is mostly mantissa
 * noise: more effort buys nothing, so the fastest level wins
 * (docs/durability.md has the table).
 *
 * Manifest: every node writes the list of its files (path, tensor, state,
 * box, sizes, XXH3 of the uncompressed .npy bytes) to
 * .mlfs-part-<node>.json (a temporary file, fsync, rename). The node that
 * hosts rank 0 then waits until every node that owns a box has written
 * its list for the same step and version, merges them, and writes
 * manifest.json through manifest.json.tmp, fsync and rename, then fsyncs
 * the directory: a snapshot is complete or absent. Every box file is
 * fsync'ed before its node's list is written.
 *
 * Threads: an I/O or FUSE worker (the .mlfs-ctl request) and the threads
 * of mlfs_par_run; st->lock taken briefly to pin the buffers.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zstd.h>

#include "common/common.h"
#include "store/snapshot_i.h"
#include "store/store.h"

struct snap_run {
	const struct ptc_schema *s;
	const struct ptc_layout *l;
	const char *dir;
	int level;
	struct snap_box *boxes;
	size_t n;
	_Atomic size_t next;
	int64_t max_bytes_s; /* 0: no bound */
	_Atomic int64_t fed; /* bytes compressed so far, for the bound */
	struct timespec t0;
};

/* Holds the writers to max_bytes_s: sleeps until @n more bytes are due. */
static void throttle(struct snap_run *run, size_t n)
{
	if (run->max_bytes_s <= 0)
		return;
	int64_t fed = atomic_fetch_add(&run->fed, (int64_t)n) + (int64_t)n;
	double due = (double)fed / (double)run->max_bytes_s;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double ahead = due - ((double)(now.tv_sec - run->t0.tv_sec) +
			      (double)(now.tv_nsec - run->t0.tv_nsec) * 1e-9);
	if (ahead > 0) {
		struct timespec ts = {(time_t)ahead, (long)((ahead - (double)(time_t)ahead) * 1e9)};
		nanosleep(&ts, NULL);
	}
}

/* The first stage holding tensor @t, or -1. */
static int first_stage(const struct ptc_layout *l, int t)
{
	for (int p = 0; p < l->pp; p++)
		if (ptc_layout_stage_holds(l, p, t))
			return p;
	return -1;
}

bool mlfs_snap_owner(const struct ptc_layout *l, int r, int t)
{
	const struct ptc_tensor *ts = &l->schema->tensors[t];
	int p = first_stage(l, t);

	if (ts->tied >= 0 || p < 0)
		return false;
	return r == ptc_layout_rank(l, ts->split_dim < 0 ? 0 : l->ranks[r].t, 0, p);
}

static void snap_box_path(const struct ptc_schema *s, int state, int tensor, int64_t a, int64_t b,
			  char *buf, size_t cap)
{
	const struct ptc_tensor *t = &s->tensors[tensor];
	int64_t n = t->split_dim < 0 ? 1 : t->shape[t->split_dim];

	if (a == 0 && b == n)
		snprintf(buf, cap, "%s/%s.npy.zst", s->states[state].name, t->name);
	else
		snprintf(buf, cap, "%s/%s.%" PRId64 "-%" PRId64 ".npy.zst", s->states[state].name,
			 t->name, a, b);
}

/* mkdir -p of the directories of @path (absolute). 0 or -errno. */
static int make_parents(const char *path)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s", path);
	for (char *c = p + 1; *c; c++) {
		if (*c != '/')
			continue;
		*c = '\0';
		if (mkdir(p, 0755) && errno != EEXIST)
			return -errno;
		*c = '/';
	}
	return 0;
}

/* Writes all of @n bytes at @p to @fd: 0 or -errno. */
static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Compresses @len bytes at @src into @fd (ZSTD_e_end when @end). */
static int box_feed(ZSTD_CCtx *cc, int fd, const void *src, size_t len, bool end, uint8_t *out,
		    size_t outcap, int64_t *zbytes)
{
	ZSTD_inBuffer in = {src, len, 0};
	for (;;) {
		ZSTD_outBuffer o = {out, outcap, 0};
		size_t left = ZSTD_compressStream2(cc, &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
		if (ZSTD_isError(left))
			return -EIO;
		int rc = write_all(fd, out, o.pos);
		if (rc)
			return rc;
		*zbytes += (int64_t)o.pos;
		if (end ? left == 0 : in.pos == in.size)
			return 0;
	}
}

/* Writes one box file. 0, or a negative errno with bx->why set. */
static int box_write(struct snap_run *run, struct snap_box *bx, ZSTD_CCtx *cc, uint8_t *out,
		     size_t outcap)
{
	const struct ptc_tensor *t = &run->s->tensors[bx->tensor];
	enum ptc_dtype dt = ptc_schema_dtype(run->s, bx->state, bx->tensor);
	int64_t shape[PTC_MAX_DIMS], outer, rowel;
	char full[4096 + 1100], hdr[4096];
	XXH3_state_t *xs = XXH3_createState();
	int rc, fd = -1;

	if (!xs) {
		snprintf(bx->why, sizeof(bx->why), "out of memory");
		return -ENOMEM;
	}
	memcpy(shape, t->shape, sizeof(shape));
	if (t->split_dim >= 0)
		shape[t->split_dim] = bx->len;
	ptc_tensor_geometry(t, &outer, &rowel);
	int64_t rb = rowel * (int64_t)ptc_dtype_size(dt);
	size_t hl = mlfs_npy_format(dt, t->ndim, shape, hdr, sizeof(hdr));
	snprintf(full, sizeof(full), "%s/%s", run->dir, bx->path);
	if (!hl) {
		rc = -EINVAL;
		snprintf(bx->why, sizeof(bx->why), "cannot format its .npy header");
		goto out;
	}
	if ((rc = make_parents(full)) ||
	    (fd = open(full, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0) {
		rc = rc ? rc : -errno;
		snprintf(bx->why, sizeof(bx->why), "%s", strerror(-rc));
		goto out;
	}
	ZSTD_CCtx_reset(cc, ZSTD_reset_session_only);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, run->level);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
	bx->bytes = (int64_t)hl + outer * bx->len * rb;
	ZSTD_CCtx_setPledgedSrcSize(cc, (unsigned long long)bx->bytes);
	XXH3_64bits_reset(xs);
	XXH3_64bits_update(xs, hdr, hl);
	bx->zbytes = 0;
	rc = box_feed(cc, fd, hdr, hl, false, out, outcap, &bx->zbytes);
	for (int64_t o = 0; !rc && o < outer; o++) {
		const uint8_t *src = bx->buf->data + (o * bx->prows + bx->local) * rb;
		size_t left = (size_t)(bx->len * rb);
		XXH3_64bits_update(xs, src, left);
		while (!rc && left) { /* in pieces, so that a bandwidth bound is smooth */
			size_t n = left < (4u << 20) ? left : (4u << 20);
			rc = box_feed(cc, fd, src, n, false, out, outcap, &bx->zbytes);
			throttle(run, n);
			src += n;
			left -= n;
		}
	}
	if (!rc)
		rc = box_feed(cc, fd, NULL, 0, true, out, outcap, &bx->zbytes);
	if (!rc && fsync(fd))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	if (rc)
		snprintf(bx->why, sizeof(bx->why), "%s", strerror(-rc));
	bx->sum = XXH3_64bits_digest(xs);
out:
	XXH3_freeState(xs);
	return rc;
}

static void *snap_worker(void *arg)
{
	struct snap_run *run = arg;
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	size_t outcap = ZSTD_CStreamOutSize();
	uint8_t *out = malloc(outcap);

	for (;;) {
		size_t i = atomic_fetch_add(&run->next, 1);
		if (i >= run->n)
			break;
		if (!cc || !out)
			snprintf(run->boxes[i].why, sizeof(run->boxes[i].why), "out of memory");
		else
			box_write(run, &run->boxes[i], cc, out, outcap);
	}
	free(out);
	ZSTD_freeCCtx(cc);
	return NULL;
}

/* The manifest's entry of a box. */
static json_t *box_json(const struct ptc_schema *s, const struct snap_box *bx)
{
	const struct ptc_tensor *t = &s->tensors[bx->tensor];
	enum ptc_dtype dt = ptc_schema_dtype(s, bx->state, bx->tensor);
	json_t *shape = json_array(), *offs = json_array(), *tshape = json_array();
	char hex[24];

	for (int i = 0; i < t->ndim; i++) {
		bool sd = i == t->split_dim;
		json_array_append_new(shape, json_integer(sd ? bx->len : t->shape[i]));
		json_array_append_new(offs, json_integer(sd ? bx->global : 0));
		json_array_append_new(tshape, json_integer(t->shape[i]));
	}
	snprintf(hex, sizeof(hex), "%016" PRIx64, bx->sum);
	return json_pack("{sssssssssssosososIsIss}", "path", bx->path, "state",
			 s->states[bx->state].name, "tensor", t->name, "dtype", ptc_dtype_name(dt),
			 "npy_descr", ptc_dtype_npy_descr(dt), "offsets", offs, "shape", shape,
			 "tensor_shape", tshape, "bytes", (json_int_t)bx->bytes, "compressed",
			 (json_int_t)bx->zbytes, "xxh3", hex);
}

/* Writes @o to @dir/@name through a temporary file, fsync and rename. */
static int write_json_atomic(const char *dir, const char *name, json_t *o)
{
	char path[4096], tmp[4200];
	char *text = json_dumps(o, JSON_INDENT(1) | JSON_SORT_KEYS);
	int rc = 0, fd;

	if (!text)
		return -ENOMEM;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0) {
		rc = -errno;
		goto out;
	}
	rc = write_all(fd, text, strlen(text));
	if (!rc && (write_all(fd, "\n", 1) || fsync(fd)))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
out:
	free(text);
	return rc;
}

/* The nodes that own a box of @l: true in @need[node]. */
static void owner_nodes(const struct ptc_layout *l, bool *need)
{
	const struct ptc_schema *s = l->schema;
	for (int r = 0; r < l->world; r++)
		for (int t = 0; t < s->ntensors && !need[l->ranks[r].node]; t++)
			if (ptc_layout_holds(l, r, t) && mlfs_snap_owner(l, r, t))
				need[l->ranks[r].node] = true;
}

/* Node @id's list of files in @dir when it is of @step and @version (a
 * new reference), else NULL. */
static json_t *part_load(const char *dir, const char *id, int64_t step, int64_t version)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/.mlfs-part-%s.json", dir, id);
	json_t *o = json_load_file(path, 0, NULL);
	if (o && json_integer_value(json_object_get(o, "step")) == step &&
	    json_integer_value(json_object_get(o, "version")) == version &&
	    json_is_array(json_object_get(o, "files")))
		return o;
	json_decref(o);
	return NULL;
}

/* On the node hosting rank 0: waits up to @wait_s seconds for every
 * owner node's list, then writes manifest.json. */
static int write_manifest(struct mlfs_store *st, const struct mlfs_view *v,
			  const struct snap_opts *o, int64_t step, json_t *out,
			  struct ptc_error *err)
{
	const char *dir = o->dir;
	int level = o->level, wait_s = o->wait_s;
	const struct ptc_layout *l = &v->layout;
	const struct ptc_cluster *c = l->cluster;
	bool *need = calloc((size_t)c->nnodes, sizeof(*need));
	json_t **parts = calloc((size_t)c->nnodes, sizeof(*parts));
	int rc = 0, missing = -1;
	struct timespec t0;

	if (!need || !parts) {
		rc = ptc_error_set(err, -ENOMEM, "snapshot: out of memory");
		goto out;
	}
	owner_nodes(l, need);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		missing = -1;
		for (int k = 0; k < c->nnodes; k++)
			if (need[k] && !parts[k] &&
			    !(parts[k] = part_load(dir, c->nodes[k].id, step, v->config->version)))
				missing = k;
		if (missing < 0)
			break;
		if (o->give_up && o->give_up(o->arg, step)) {
			rc = ptc_error_set(err, -ECANCELED,
					   "snapshot: step %" PRId64
					   " given up: node \"%s\" has not "
					   "written its files to %s, and a newer step is due",
					   step, c->nodes[missing].id, dir);
			goto out;
		}
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec >= wait_s) {
			rc = ptc_error_set(err, -ETIMEDOUT,
					   "snapshot: node \"%s\" has not written its files of "
					   "step %" PRId64 " to %s after %d s (run `mlfs snapshot` "
					   "on every node); no manifest written",
					   c->nodes[missing].id, step, dir, wait_s);
			goto out;
		}
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	json_t *files = json_array();
	for (int k = 0; k < c->nnodes; k++)
		if (parts[k])
			json_array_extend(files, json_object_get(parts[k], "files"));
	json_error_t je;
	json_t *schema = json_loads(st->schema_text, 0, &je);
	json_t *config = json_loads(v->config_text, 0, &je);
	json_t *m = json_pack("{sssisIsIsisososo}", "format", "mlfs-snapshot", "format_version", 1,
			      "step", (json_int_t)step, "version", (json_int_t)v->config->version,
			      "level", level, "schema", schema ? schema : json_null(), "config",
			      config ? config : json_null(), "files", files);
	if (!m || (rc = write_json_atomic(dir, "manifest.json", m))) {
		rc = rc ? rc : -ENOMEM;
		ptc_error_set(err, rc, "snapshot: %s/manifest.json: %s", dir, strerror(-rc));
	} else {
		json_object_set_new(out, "files", json_integer((json_int_t)json_array_size(files)));
		json_object_set_new(out, "manifest", json_true());
		for (int k = 0; k < c->nnodes; k++) {
			char path[4096];
			snprintf(path, sizeof(path), "%s/.mlfs-part-%s.json", dir, c->nodes[k].id);
			if (parts[k])
				unlink(path);
		}
	}
	json_decref(m);
out:
	for (int k = 0; parts && k < c->nnodes; k++)
		json_decref(parts[k]);
	free(parts);
	free(need);
	return rc;
}

int mlfs_snap_collect(struct mlfs_store *st, struct mlfs_view *v, int64_t step, bool periodic,
		      struct snap_box **out, size_t *nout, struct ptc_error *err)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = st->schema;
	struct snap_box *boxes = NULL;
	size_t n = 0, cap = 0;
	int r0 = l->node_first_rank[st->node];

	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++)
		for (int si = 0; si < s->nstates; si++)
			for (int ti = 0; ti < s->ntensors; ti++) {
				if (!ptc_layout_holds(l, r, ti) || !mlfs_snap_owner(l, r, ti))
					continue;
				const struct ptc_tensor *t = &s->tensors[ti];
				struct ptc_slice sl;
				struct xf_buf *b;
				size_t i = xf_parts_index(&v->parts, r, si, ti);
				if (periodic)
					b = v->psnap_step[r] == step ? v->psnap[i] : NULL;
				else if (v->snap && v->snap_step[r] == step)
					b = v->snap[i];
				else
					b = v->parts.bufs[i];
				if (!b)
					continue;
				ptc_slice_compute(t, l->tp, l->ranks[r].t, &sl);
				for (int g = 0; g < sl.nsegs; g++) {
					if (sl.segs[g].global < 0)
						continue;
					if (n == cap) {
						size_t nc = cap ? 2 * cap : 64;
						struct snap_box *nb =
						    realloc(boxes, nc * sizeof(*boxes));
						if (!nb) {
							mlfs_snap_boxes_put(boxes, n);
							return ptc_error_set(err, -ENOMEM,
									     "snapshot: out of "
									     "memory");
						}
						boxes = nb;
						cap = nc;
					}
					struct snap_box *bx = &boxes[n++];
					memset(bx, 0, sizeof(*bx));
					bx->rank = r;
					bx->state = si;
					bx->tensor = ti;
					bx->global = sl.segs[g].global;
					bx->len = sl.segs[g].len;
					bx->local = sl.segs[g].local;
					bx->prows = sl.rows;
					bx->buf = xf_buf_get(b);
					snap_box_path(s, si, ti, bx->global, bx->global + bx->len,
						      bx->path, sizeof(bx->path));
				}
			}
	*out = boxes;
	*nout = n;
	return 0;
}

void mlfs_snap_boxes_put(struct snap_box *boxes, size_t n)
{
	for (size_t i = 0; i < n; i++)
		xf_buf_put(boxes[i].buf);
	free(boxes);
}

int mlfs_snap_write(struct mlfs_store *st, struct mlfs_view *v, const struct snap_opts *o,
		    int64_t step, struct snap_box *boxes, size_t n, json_t *out,
		    struct ptc_error *err)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = st->schema;
	const char *dir = o->dir;
	int rc = 0;

	if (mkdir(dir, 0755) && errno != EEXIST)
		return ptc_error_set(err, -errno, "snapshot: %s: %s", dir, strerror(errno));
	struct snap_run run = {.s = s,
			       .l = l,
			       .dir = dir,
			       .level = o->level,
			       .boxes = boxes,
			       .n = n,
			       .max_bytes_s = o->max_bytes_s};
	atomic_init(&run.next, 0);
	atomic_init(&run.fed, 0);
	clock_gettime(CLOCK_MONOTONIC, &run.t0);
	mlfs_par_run(o->threads > 0 ? o->threads : 1, snap_worker, &run);
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int64_t bytes = 0, zbytes = 0;
	json_t *files = json_array();
	for (size_t i = 0; i < n; i++) {
		if (boxes[i].why[0] && !rc)
			rc = ptc_error_set(err, -EIO, "snapshot: %s/%s: %s", dir, boxes[i].path,
					   boxes[i].why);
		bytes += boxes[i].bytes;
		zbytes += boxes[i].zbytes;
		json_t *e = box_json(s, &boxes[i]);
		if (!e && !rc)
			rc = ptc_error_set(err, -ENOMEM, "snapshot: out of memory");
		json_array_append_new(files, e);
	}
	if (rc) {
		json_decref(files);
		return rc;
	}
	const char *me = l->cluster->nodes[st->node].id;
	json_t *part = json_pack("{sssIsIso}", "node", me, "step", (json_int_t)step, "version",
				 (json_int_t)v->config->version, "files", files);
	char pname[512];
	snprintf(pname, sizeof(pname), ".mlfs-part-%s.json", me);
	if (n == 0) /* owns no box: no list to wait for (owner_nodes) */
		;
	else if (!part || (rc = write_json_atomic(dir, pname, part))) {
		rc = rc ? rc : -ENOMEM;
		ptc_error_set(err, rc, "snapshot: %s/%s: %s", dir, pname, strerror(-rc));
		json_decref(part);
		return rc;
	}
	json_decref(part);
	json_object_set_new(out, "step", json_integer(step));
	json_object_set_new(out, "node_files", json_integer((json_int_t)n));
	json_object_set_new(out, "bytes", json_integer(bytes));
	json_object_set_new(out, "compressed", json_integer(zbytes));
	json_object_set_new(out, "level", json_integer(o->level));
	json_object_set_new(out, "seconds",
			    json_real((double)(t1.tv_sec - run.t0.tv_sec) +
				      (double)(t1.tv_nsec - run.t0.tv_nsec) * 1e-9));
	json_object_set_new(out, "manifest", json_false());
	if (l->ranks[0].node == st->node)
		rc = write_manifest(st, v, o, step, out, err);
	return rc;
}

int mlfs_store_snapshot(struct mlfs_store *st, const char *dir, int level, int wait_s, json_t *out,
			struct ptc_error *err)
{
	struct mlfs_view *v = mlfs_store_view(st);
	struct snap_box *boxes = NULL;
	size_t n = 0;
	int64_t step = -1;
	int rc = 0;
	char path[4096];
	struct stat sb;

	if (!v)
		return ptc_errorf(err, "snapshot: set schema.json and config.json first");
	const struct ptc_layout *l = &v->layout;
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
		rc = ptc_errorf(err, "snapshot: %s is not a directory", dir);
		goto out;
	}
	if (stat(path, &sb) == 0) {
		rc = ptc_error_set(err, -EEXIST,
				   "snapshot: %s holds a snapshot already (manifest.json); "
				   "write each snapshot to a new directory",
				   dir);
		goto out;
	}
	if (st->steps_refresh) /* the other nodes' ranks' steps, as they are now */
		st->steps_refresh(st->cluster_arg);
	pthread_mutex_lock(&st->lock);
	int lo = 0, hi = 0;
	for (int r = 1; r < l->world; r++) {
		lo = st->steps[r] < st->steps[lo] ? r : lo;
		hi = st->steps[r] > st->steps[hi] ? r : hi;
	}
	if (st->view != v) {
		rc = ptc_error_set(err, -EBUSY, "snapshot: the layout changed; run it again");
	} else if (st->steps[lo] != st->steps[hi]) {
		rc = ptc_errorf(err,
				"snapshot: ranks have not saved the same step: rank %d lags at "
				"step %" PRId64 " while rank %d saved step %" PRId64,
				lo, st->steps[lo], hi, st->steps[hi]);
	} else if ((step = st->steps[0]) < 0) {
		rc = ptc_errorf(err, "snapshot: no step saved yet (write ranks/<r>/step, or "
				     "mlfs import)");
	} else {
		rc = mlfs_snap_collect(st, v, step, false, &boxes, &n, err);
	}
	pthread_mutex_unlock(&st->lock);
	if (!rc) {
		struct snap_opts o = {
		    .dir = dir, .level = level, .threads = st->threads, .wait_s = wait_s};
		rc = mlfs_snap_write(st, v, &o, step, boxes, n, out, err);
		mlfs_snap_boxes_put(boxes, n);
		if (!rc)
			mlfs_autosnap_note(st, dir, step);
	}
out:
	mlfs_view_put(v);
	return rc;
}
