/*
 * mlfs_store.c - the store: views, schema and steps, partitions, import,
 * status.json.
 *
 * DESIGN
 * The store holds one current view (schema + config + this node's
 * partitions). Control-file writes validate fully before changing anything;
 * a refused write leaves the store as it was and says why in status.json.
 * Changing the config is a reconfiguration: mlfs_reconf.c, which swaps the
 * view pointer; everything here works on the view it finds current and
 * re-checks under the lock that it still is before changing it (-ESTALE,
 * -EBUSY while a reconfiguration holds the store).
 *
 * Threads: FUSE workers call everything here; the peer server will call
 * mlfs_store_part_get. store->lock guards all store fields and the buffer
 * pointers of the current view; it is never held during copies, file reads
 * or frees of large buffers.
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

/* ------------------------------------------------------------------ views */

struct mlfs_view *mlfs_view_get(struct mlfs_view *v)
{
	if (v)
		atomic_fetch_add(&v->refs, 1);
	return v;
}

void mlfs_view_put(struct mlfs_view *v)
{
	if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	xf_mem_release(v->mem, v->meta_bytes);
	xf_parts_release(&v->parts);
	if (v->snap)
		mlfs_bufs_put(v->snap, (size_t)v->layout.world * (size_t)v->parts.nstates *
					   (size_t)v->parts.ntensors);
	free(v->snap);
	free(v->snap_step);
	if (v->stage_tree)
		for (int p = 0; p < v->layout.pp; p++)
			mlfs_tree_free(v->stage_tree[p]);
	free(v->stage_tree);
	mlfs_tree_free(v->full_tree);
	ptc_layout_release(&v->layout);
	ptc_config_free(v->config);
	free(v->config_text);
	mlfs_dataset_put(v->ds);
	free(v->cursor.segs);
	free(v);
}

void mlfs_bufs_put(struct xf_buf **bufs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		xf_buf_put(bufs[i]);
		bufs[i] = NULL;
	}
}

void mlfs_view_snap(struct mlfs_store *st, struct mlfs_view *v, int rank, struct xf_buf **old)
{
	const struct xf_parts *p = &v->parts;
	if (!v->snap)
		return;
	for (int s = 0; s < p->nstates; s++)
		for (int t = 0; t < p->ntensors; t++) {
			size_t i = xf_parts_index(p, rank, s, t);
			struct xf_buf *was = v->snap[i];
			v->snap[i] = xf_buf_get(p->bufs[i]);
			if (old)
				old[s * p->ntensors + t] = was;
			else
				xf_buf_put(was);
		}
	v->snap_step[rank] = st->steps[rank];
}

void mlfs_view_snap_local(struct mlfs_store *st, struct mlfs_view *v, struct xf_buf **old)
{
	size_t per = (size_t)v->parts.nstates * (size_t)v->parts.ntensors;
	int r0 = v->layout.node_first_rank[st->node];
	for (int i = 0; v->snap && r0 >= 0 && i < v->layout.node_nranks[st->node]; i++)
		mlfs_view_snap(st, v, r0 + i, old ? old + (size_t)i * per : NULL);
}

struct xf_buf *mlfs_view_snap_get(struct mlfs_store *st, struct mlfs_view *v, int rank,
				  int state, int tensor, int64_t step, int64_t *have)
{
	const struct xf_parts *p = &v->parts;
	struct xf_buf *b = NULL;

	*have = -1;
	if (!v->snap || rank < 0 || rank >= v->layout.world || state < 0 || state >= p->nstates ||
	    tensor < 0 || tensor >= p->ntensors)
		return NULL;
	pthread_mutex_lock(&st->lock);
	*have = v->snap_step[rank];
	if (*have == step)
		b = xf_buf_get(v->snap[xf_parts_index(p, rank, state, tensor)]);
	pthread_mutex_unlock(&st->lock);
	return b;
}

struct mlfs_view *mlfs_store_view(struct mlfs_store *st)
{
	pthread_mutex_lock(&st->lock);
	struct mlfs_view *v = mlfs_view_get(st->view);
	pthread_mutex_unlock(&st->lock);
	return v;
}

struct xf_buf *mlfs_store_part_get(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
				   int tensor)
{
	const struct xf_parts *p = &v->parts;
	struct xf_buf *b = NULL;

	if (rank < 0 || rank >= v->layout.world || state < 0 || state >= p->nstates || tensor < 0 ||
	    tensor >= p->ntensors)
		return NULL;
	pthread_mutex_lock(&st->lock);
	b = xf_buf_get(p->bufs[xf_parts_index(p, rank, state, tensor)]);
	pthread_mutex_unlock(&st->lock);
	return b;
}

/*
 * What a schema's tensors cost in a name tree (a node, its name and the
 * parent's pointer to it, with allocator overhead), per state: an estimate
 * counted in --max-memory, so that metadata that grows with the input is
 * bounded by it too (within the PTC_MAX_* limits).
 */
static int64_t tree_bytes(const struct ptc_schema *s)
{
	int64_t n = 0;
	for (int t = 0; t < s->ntensors; t++)
		n += 96 + (int64_t)strlen(s->tensors[t].name);
	return n * s->nstates;
}

/* The schema's own memory (tensors, names, text), estimated likewise. */
static int64_t schema_bytes(const struct ptc_schema *s, size_t textlen)
{
	int64_t n = (int64_t)textlen;
	for (int t = 0; t < s->ntensors; t++)
		n += (int64_t)sizeof(s->tensors[t]) + 32 + (int64_t)strlen(s->tensors[t].name) +
		     s->tensors[t].nchunks * 8;
	return n;
}

int mlfs_view_new(struct mlfs_store *st, struct ptc_config *config, struct mlfs_dataset *ds,
		  const char *text, size_t len, const char *what, struct mlfs_view **out,
		  struct ptc_error *err)
{
	struct mlfs_view *v = calloc(1, sizeof(*v));
	int rc = -ENOMEM;

	if (!v) {
		ptc_config_free(config);
		mlfs_dataset_put(ds);
		return -ENOMEM;
	}
	atomic_init(&v->refs, 1);
	v->config = config;
	v->ds = ds;
	clock_gettime(CLOCK_REALTIME, &v->time);
	if (!(v->config_text = strndup(text, len)))
		goto err_put;
	if ((rc = mlfs_config_supported(config, st->multinode, what, err)) ||
	    (rc = ptc_layout_init(&v->layout, st->schema, config, mlfs_store_cluster(st), what, err)))
		goto err_put;
	/* The partition table, the local stages' name trees and the full tree. */
	size_t nparts = (size_t)v->layout.world * (size_t)st->schema->nstates *
			(size_t)st->schema->ntensors;
	int64_t meta = (int64_t)nparts * (int64_t)sizeof(void *) * (config->replicas ? 2 : 1) +
		       tree_bytes(st->schema) * (1 + v->layout.pp);
	if ((rc = xf_mem_reserve(&st->mem, meta))) {
		ptc_errorf(err,
			   "%s: the metadata of this layout (about %" PRId64
			   " bytes) does not fit in --max-memory",
			   what, meta);
		goto err_put;
	}
	v->mem = &st->mem;
	v->meta_bytes = meta;
	rc = -ENOMEM;
	if (xf_parts_init(&v->parts, &v->layout, st->node))
		goto err_put;
	if (config->replicas) {
		if (!(v->snap = calloc(nparts, sizeof(*v->snap))) ||
		    !(v->snap_step = malloc((size_t)v->layout.world * sizeof(int64_t))))
			goto err_put;
		for (int r = 0; r < v->layout.world; r++)
			v->snap_step[r] = -1;
	}
	if (!(v->stage_tree = calloc((size_t)v->layout.pp, sizeof(*v->stage_tree))))
		goto err_put;
	int r0 = v->layout.node_first_rank[st->node];
	for (int r = r0; r >= 0 && r < r0 + v->layout.node_nranks[st->node]; r++) {
		int p = v->layout.ranks[r].p;
		if (!v->stage_tree[p] && !(v->stage_tree[p] = mlfs_tree_build_stage(&v->layout, p)))
			goto err_put;
	}
	if (!(v->full_tree = mlfs_tree_build_full(st->schema)))
		goto err_put;
	*out = v;
	return 0;

err_put:
	mlfs_view_put(v);
	return rc;
}

/* ------------------------------------------------------------------ store */

int mlfs_store_init(struct mlfs_store *st, struct ptc_cluster *cluster, char *cluster_text,
		    int node, int64_t max_memory, int threads)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_init(&st->lock, NULL);
	st->cluster = cluster;
	st->cluster_text = cluster_text;
	st->node = node;
	st->mem.limit = max_memory;
	st->threads = threads;
	clock_gettime(CLOCK_REALTIME, &st->start);
	if (!(st->job = mlfs_job_new_dir("job", &st->mem)))
		return -ENOMEM;
	return 0;
}

struct mlfs_retired_cluster {
	struct ptc_cluster *cluster;
	char *text;
	struct mlfs_retired_cluster *next;
};

int mlfs_store_grow_cluster(struct mlfs_store *st, const char *text, size_t len,
			    struct ptc_error *err)
{
	struct ptc_cluster *cl;
	struct mlfs_retired_cluster *old = malloc(sizeof(*old));
	char *copy = strndup(text, len);
	int rc = old && copy ? ptc_cluster_parse_text(text, len, "cluster.json", &cl, err) : -ENOMEM;

	if (rc)
		goto out;
	pthread_mutex_lock(&st->lock);
	if ((rc = ptc_cluster_extends(st->cluster, cl, err)) == 0 &&
	    cl->nnodes > st->cluster->nnodes) {
		*old = (struct mlfs_retired_cluster){st->cluster, st->cluster_text, st->retired};
		st->retired = old;
		__atomic_store_n(&st->cluster_text, copy, __ATOMIC_RELEASE);
		__atomic_store_n(&st->cluster, cl, __ATOMIC_RELEASE);
		old = NULL, copy = NULL, cl = NULL;
		rc = 1;
	}
	pthread_mutex_unlock(&st->lock);
	ptc_cluster_free(cl);
out:
	free(old);
	free(copy);
	return rc;
}

void mlfs_store_release(struct mlfs_store *st)
{
	mlfs_reconf_shutdown(st);
	mlfs_view_put(st->view);
	ptc_schema_free(st->schema);
	while (st->retired) {
		struct mlfs_retired_cluster *r = st->retired;
		st->retired = r->next;
		ptc_cluster_free(r->cluster);
		free(r->text);
		free(r);
	}
	ptc_cluster_free(st->cluster);
	mlfs_job_free(st->job);
	free(st->schema_text);
	free(st->cluster_text);
	free(st->steps);
	pthread_mutex_destroy(&st->lock);
}

/* Records a refusal for status.json; returns @rc. Lock held. */
static int refuse(struct mlfs_store *st, int rc, const struct ptc_error *err)
{
	snprintf(st->error, sizeof(st->error), "%s", err->text);
	return rc;
}

void mlfs_store_changed(struct mlfs_store *st, const char *prefix)
{
	if (st->changed)
		st->changed(st->changed_arg, prefix);
}

int mlfs_store_set_control(struct mlfs_store *st, bool config, const char *text, size_t len,
			   struct ptc_error *err)
{
	if (st->propose) {
		int rc = st->propose(st->cluster_arg, config, text, len, err);
		if (rc)
			mlfs_store_note_error(st, err->text);
		return rc;
	}
	return config ? mlfs_store_install_config(st, text, len, err)
		      : mlfs_store_install_schema(st, text, len, err);
}

int mlfs_store_install_schema(struct mlfs_store *st, const char *text, size_t len,
			      struct ptc_error *err)
{
	struct ptc_schema *s;
	int rc = ptc_schema_parse_text(text, len, "schema.json", &s, err);

	pthread_mutex_lock(&st->lock);
	if (rc) {
		rc = refuse(st, rc, err);
		goto out;
	}
	if (st->view) {
		bool same = st->schema_text && strlen(st->schema_text) == len &&
			    memcmp(st->schema_text, text, len) == 0;
		ptc_schema_free(s);
		if (!same) {
			ptc_errorf(err, "schema.json: cannot change the schema once config.json "
					"is set (unmount and start a new store)");
			rc = refuse(st, -EBUSY, err);
		}
		goto out;
	}
	int64_t bytes = schema_bytes(s, len);
	if (xf_mem_reserve(&st->mem, bytes)) {
		ptc_errorf(err,
			   "schema.json: its %d tensors (about %" PRId64 " bytes) do not fit "
			   "in --max-memory",
			   s->ntensors, bytes);
		ptc_schema_free(s);
		rc = refuse(st, -ENOSPC, err);
		goto out;
	}
	char *t = strndup(text, len);
	if (!t) {
		xf_mem_release(&st->mem, bytes);
		ptc_schema_free(s);
		rc = -ENOMEM;
		goto out;
	}
	xf_mem_release(&st->mem, st->schema_bytes);
	ptc_schema_free(st->schema);
	free(st->schema_text);
	st->schema = s;
	st->schema_text = t;
	st->schema_bytes = bytes;
	st->error[0] = '\0';
out:
	pthread_mutex_unlock(&st->lock);
	return rc;
}

void mlfs_store_prefetch(struct mlfs_store *st, struct mlfs_view *v, int64_t step)
{
	if (!v || !v->ds)
		return;
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[st->node];
	bool *seen = calloc((size_t)l->dp, sizeof(*seen));
	for (int r = r0; seen && r >= 0 && r < r0 + l->node_nranks[st->node]; r++) {
		int d = l->ranks[r].d;
		if (!seen[d]) {
			seen[d] = true;
			mlfs_data_prefetch(v->ds, &v->cursor, d, step < 0 ? 0 : step, 0);
		}
	}
	free(seen);
}

void mlfs_store_note_error(struct mlfs_store *st, const char *msg)
{
	pthread_mutex_lock(&st->lock);
	snprintf(st->error, sizeof(st->error), "%s", msg);
	pthread_mutex_unlock(&st->lock);
}

int mlfs_store_set_step(struct mlfs_store *st, int rank, const char *text, size_t len,
			struct ptc_error *err)
{
	char buf[32], *end;

	if (len == 0 || len >= sizeof(buf))
		return ptc_errorf(err, "ranks/%d/step: expected a step number", rank);
	struct xf_buf **old = NULL;
	size_t nold = 0;
	memcpy(buf, text, len);
	buf[len] = '\0';
	long long step = strtoll(buf, &end, 10);
	while (*end == '\n' || *end == ' ')
		end++;
	if (end == buf || *end || step < 0)
		return ptc_errorf(err, "ranks/%d/step: \"%.*s\" is not a step number", rank,
				  (int)strcspn(buf, "\n"), buf);
	pthread_mutex_lock(&st->lock);
	int rc = 0;
	if (!st->view || rank >= st->view->layout.world)
		rc = -ENOENT;
	else {
		char what[32];
		snprintf(what, sizeof(what), "ranks/%d/step", rank);
		if (st->view->snap) /* the old snapshot's buffers: put after unlocking */
			nold = (size_t)st->schema->nstates * (size_t)st->schema->ntensors;
		if (nold && !(old = calloc(nold, sizeof(*old))))
			rc = -ENOMEM;
		else if (!(rc = mlfs_reconf_busy(st, what, err))) {
			st->steps[rank] = step;
			mlfs_view_snap(st, st->view, rank, old);
		}
	}
	pthread_mutex_unlock(&st->lock);
	if (old)
		mlfs_bufs_put(old, nold);
	free(old);
	if (rc == 0 && st->steps_saved)
		st->steps_saved(st->cluster_arg);
	return rc;
}

int mlfs_store_commit_part(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
			   int tensor, struct xf_buf *b)
{
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	if (st->view != v) {
		rc = -ESTALE;
	} else if (st->state == MLFS_TRANSFORMING) {
		rc = -EBUSY;
	} else {
		size_t i = xf_parts_index(&v->parts, rank, state, tensor);
		struct xf_buf *old = v->parts.bufs[i];
		v->parts.bufs[i] = xf_buf_get(b);
		xf_buf_put(old);
	}
	pthread_mutex_unlock(&st->lock);
	return rc;
}

/* ---------------------------------------------------------------- headers */

size_t mlfs_part_header(const struct ptc_schema *s, const struct ptc_layout *l, int rank, int state,
			int tensor, char *buf, size_t cap)
{
	int64_t shape[PTC_MAX_DIMS];
	const struct ptc_tensor *t = &s->tensors[tensor];
	int nd = ptc_partition_shape(t, l->tp, l->ranks[rank].t, shape);
	return mlfs_npy_format(ptc_schema_dtype(s, state, tensor), nd, shape, buf, cap);
}

size_t mlfs_full_header(const struct ptc_schema *s, int state, int tensor, char *buf, size_t cap)
{
	const struct ptc_tensor *t = &s->tensors[tensor];
	return mlfs_npy_format(ptc_schema_dtype(s, state, tensor), t->ndim, t->shape, buf, cap);
}

/* ----------------------------------------------------------- full tensors */

int mlfs_view_full_sources(const struct mlfs_view *v, const struct ptc_schema *s, int node,
			   int state, int tensor, struct xf_buf **srcs)
{
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[node], nr = l->node_nranks[node];
	int n = s->tensors[tensor].split_dim < 0 ? 1 : l->tp;

	for (int t = 0; t < n; t++) {
		srcs[t] = NULL;
		for (int r = r0; r >= 0 && r < r0 + nr && !srcs[t]; r++) {
			if (l->ranks[r].t != t)
				continue;
			for (int a = 0; a < s->ntensors && !srcs[t]; a++)
				if (ptc_schema_logical(s, a) == tensor)
					srcs[t] = xf_buf_get(
					    v->parts.bufs[xf_parts_index(&v->parts, r, state, a)]);
		}
		if (!srcs[t]) {
			while (t > 0)
				xf_buf_put(srcs[--t]);
			return -EIO;
		}
	}
	return n;
}

/* ------------------------------------------------------------------ import */

struct import_file {
	void *map;
	size_t maplen;
	const uint8_t *data;
};

/* Maps and checks DIR/<state>/<tensor>.npy. Returns 0 or -EINVAL with a
 * message appended to @msg, or counted in @omitted when @msg is full. */
static int import_open(const char *dir, const struct ptc_schema *s, int si, int ti,
		       struct import_file *f, char *msg, size_t msglen, int *omitted)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	char path[4096], why[256];
	struct mlfs_npy h;
	struct stat sb;
	size_t used = strlen(msg);
	int fd;

	snprintf(path, sizeof(path), "%s/%s/%s.npy", dir, s->states[si].name, t->name);
	/* O_NONBLOCK: a FIFO must not block the import (fstat refuses it). */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0) {
		snprintf(why, sizeof(why), "%s", strerror(errno));
		goto bad;
	}
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		close(fd);
		snprintf(why, sizeof(why), "not a regular file");
		goto bad;
	}

	f->maplen = (size_t)sb.st_size;
	f->map = f->maplen ? mmap(NULL, f->maplen, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
	close(fd);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		snprintf(why, sizeof(why), "empty or unreadable");
		goto bad;
	}
	/* The file may shrink from now on: every read of the mapping is guarded
	 * (mlfs_mapcopy turns the SIGBUS into -EIO). */
	uint8_t head[MLFS_NPY_MAX_HEADER + 12];
	size_t hn = f->maplen < sizeof(head) ? f->maplen : sizeof(head);
	if (mlfs_mapcopy(head, f->map, hn)) {
		snprintf(why, sizeof(why), "shorter than when opened (changed while imported?)");
		goto bad;
	}
	int rc = mlfs_npy_parse(head, hn, &h, why, sizeof(why));
	if (rc == -EAGAIN)
		snprintf(why, sizeof(why), "truncated header");
	if (rc ||
	    mlfs_npy_check(&h, ptc_schema_dtype(s, si, ti), t->ndim, t->shape, why, sizeof(why)))
		goto bad;
	int64_t want = xf_full_bytes(s, si, ti);
	if ((int64_t)(f->maplen - h.header_len) != want) {
		snprintf(why, sizeof(why), "holds %zu data bytes, expected %" PRId64,
			 f->maplen - h.header_len, want);
		goto bad;
	}
	f->data = (const uint8_t *)f->map + h.header_len;
	return 0;
bad:;
	char line[4096 + 512];
	int n = snprintf(line, sizeof(line), "%s%s/%s.npy: %s", used ? "; " : "",
			 s->states[si].name, t->name, why);
	if (*omitted == 0 && used + (size_t)n + 32 < msglen) /* room for "and N more" */
		memcpy(msg + used, line, (size_t)n + 1);
	else
		(*omitted)++;
	return -EINVAL;
}

/* -EBUSY with @msg when @v is no longer current or a reconfiguration holds
 * the store, else 0. Lock held. */
static int import_busy(struct mlfs_store *st, struct mlfs_view *v, char *msg, size_t msglen)
{
	struct ptc_error err = {""};
	int rc = -EBUSY;

	if (st->view != v)
		snprintf(msg, msglen, "import: the layout changed during the import");
	else if ((rc = mlfs_reconf_busy(st, "import", &err)))
		snprintf(msg, msglen, "%s", err.text);
	return rc;
}

/* Imports full tensors from @dir into every local partition of the current
 * view, for one state (@only >= 0) or all. All or nothing: the partitions
 * are built aside, then only the imported ones are swapped in, under the
 * lock (a write to another state meanwhile stays). */
static int store_import(struct mlfs_store *st, const char *dir, int only, int64_t step, char *msg,
			size_t msglen)
{
	bool saved = false;
	struct mlfs_view *v = mlfs_store_view(st);
	const struct ptc_schema *s = st->schema;
	struct import_file *files = NULL;
	struct xf_parts np;
	int rc = -ENOMEM;

	if (!v) {
		snprintf(msg, msglen, "import: set schema.json and config.json first");
		return -EINVAL;
	}
	/* Refused at once rather than after reading every file. */
	pthread_mutex_lock(&st->lock);
	rc = import_busy(st, v, msg, msglen);
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
			    import_open(dir, s, si, ti, &files[si * s->ntensors + ti], msg, msglen,
					&omitted))
				bad++;
	if (bad) {
		if (omitted) {
			size_t used = strlen(msg);
			snprintf(msg + used, msglen - used, "; and %d more", omitted);
		}
		rc = -EINVAL;
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
					snprintf(msg, msglen, "import: %s",
						 rc == -ENOSPC ? "the partitions do not fit in "
								 "--max-memory"
							       : "out of memory");
					goto out_parts;
				}
				/* The file may shrink meanwhile: read through the SIGBUS guard. */
				if ((rc = xf_full_slice(s, si, ti, l->tp, l->ranks[r].t, f->data,
							np.bufs[i], mlfs_mapcopy))) {
					snprintf(
					    msg, msglen,
					    "import: %s/%s.npy: the file shrank while it was read; "
					    "nothing imported",
					    s->states[si].name,
					    s->tensors[ptc_schema_logical(s, ti)].name);
					goto out_parts;
				}
			}
	/* the snapshots replaced (with "replicas"): put after unlocking */
	size_t nold = (size_t)l->node_nranks[st->node] * (size_t)s->nstates * (size_t)s->ntensors;
	struct xf_buf **oldsnap = v->snap ? calloc(nold ? nold : 1, sizeof(*oldsnap)) : NULL;
	if (v->snap && !oldsnap) {
		rc = -ENOMEM;
		goto out_parts;
	}
	pthread_mutex_lock(&st->lock);
	if (!(rc = import_busy(st, v, msg, msglen))) {
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

/* The reconfiguration steps of .mlfs-ctl: "prepare", "commit", "abort". */
static int control_reconf(struct mlfs_store *st, const char *op, json_t *req, char *msg,
			  size_t msglen)
{
	struct ptc_error err = {""};
	json_t *jv = json_object_get(req, "version"), *jc = json_object_get(req, "config");
	json_t *why = json_object_get(req, "reason");
	int rc;

	if (strcmp(op, "prepare") == 0) {
		if (!json_is_string(jc)) {
			snprintf(msg, msglen, "prepare: \"config\" must be the config's JSON text");
			return -EINVAL;
		}
		rc = mlfs_reconf_prepare(st, json_string_value(jc), json_string_length(jc),
					 "prepare", false, &err);
	} else if (!json_is_integer(jv) || json_integer_value(jv) < 0) {
		snprintf(msg, msglen, "%s: \"version\" must be the version being reconfigured to",
			 op);
		return -EINVAL;
	} else if (strcmp(op, "commit") == 0) {
		rc = mlfs_reconf_commit(st, json_integer_value(jv), &err);
	} else if (why && !json_is_string(why)) {
		snprintf(msg, msglen, "abort: \"reason\" must be a string");
		return -EINVAL;
	} else {
		rc = mlfs_reconf_abort(st, json_integer_value(jv), json_string_value(why), &err);
	}
	if (rc)
		snprintf(msg, msglen, "%s", err.text[0] ? err.text : strerror(-rc));
	return rc;
}

int mlfs_store_control(struct mlfs_store *st, const char *text, size_t len, char **reply)
{
	char msg[PTC_ERROR_MAX] = "";
	json_error_t je;
	json_t *req = json_loadb(text, len, 0, &je);
	int rc = -EINVAL;
	bool reconf = false;

	const char *op = json_string_value(json_object_get(req, "op"));
	if (!req || !op) {
		snprintf(msg, sizeof(msg), "control: expected {\"op\": ...}");
	} else if (strcmp(op, "import") == 0) {
		const char *dir = json_string_value(json_object_get(req, "from"));
		const char *state = json_string_value(json_object_get(req, "state"));
		json_t *jstep = json_object_get(req, "step");
		int only = -1;
		if (!dir || dir[0] != '/') {
			snprintf(msg, sizeof(msg), "import: \"from\" must be an absolute path");
		} else if (jstep && (!json_is_integer(jstep) || json_integer_value(jstep) < 0)) {
			snprintf(msg, sizeof(msg),
				 "import: \"step\" must be a non-negative integer");
		} else if (!st->schema) {
			snprintf(msg, sizeof(msg), "import: set schema.json and config.json first");
		} else if (state && (only = ptc_schema_find_state(st->schema, state)) < 0) {
			snprintf(msg, sizeof(msg), "import: the schema has no state \"%s\"", state);
		} else {
			rc = store_import(st, dir, only, jstep ? json_integer_value(jstep) : 0, msg,
					  sizeof(msg));
		}
	} else if (strcmp(op, "prepare") == 0 || strcmp(op, "commit") == 0 ||
		   strcmp(op, "abort") == 0) {
		rc = control_reconf(st, op, req, msg, sizeof(msg));
		reconf = true;
	} else {
		snprintf(msg, sizeof(msg), "control: unknown op \"%s\"", op);
	}
	json_decref(req);
	json_t *r = json_pack("{sbss}", "ok", rc == 0, "error", msg);
	if (r && reconf) {
		pthread_mutex_lock(&st->lock);
		json_object_set_new(r, "state", json_string(mlfs_reconf_state_name(st->reconf)));
		pthread_mutex_unlock(&st->lock);
	}
	*reply = r ? json_dumps(r, JSON_COMPACT) : NULL;
	json_decref(r);
	if (rc)
		mlfs_store_note_error(st, msg);
	return rc;
}

/* ---------------------------------------------------------------- status */

char *mlfs_store_status_json(struct mlfs_store *st)
{
	json_t *o = json_object();

	pthread_mutex_lock(&st->lock);
	json_object_set_new(o, "node", json_string(mlfs_store_cluster(st)->nodes[st->node].id));
	json_object_set_new(o, "version",
			    st->view ? json_integer(st->view->config->version) : json_null());
	json_object_set_new(o, "state", json_string(mlfs_reconf_state_name(st->reconf)));
	json_object_set_new(o, "step", st->view ? json_integer(st->steps[0]) : json_null());
	if (st->state == MLFS_TRANSFORMING)
		json_object_set_new(o, "target_version", json_integer(st->target_version));
	json_object_set_new(o, "progress_bytes", json_integer(st->progress));
	json_object_set_new(o, "progress_total", json_integer(st->progress_total));
	json_object_set_new(o, "memory_used", json_integer(st->mem.used));
	json_object_set_new(o, "memory_limit", json_integer(st->mem.limit));
	if (st->has_last)
		json_object_set_new(
		    o, "last",
		    json_pack("{sIsIsIsIsIsIsf}", "from_version", (json_int_t)st->last_from,
			      "to_version", (json_int_t)st->last_to, "bytes_reused",
			      (json_int_t)st->last.bytes_reused, "bytes_copied",
			      (json_int_t)st->last.bytes_copied, "bytes_fetched",
			      (json_int_t)st->last.bytes_fetched, "bytes_zeroed",
			      (json_int_t)st->last.bytes_zeroed, "seconds", st->last.seconds));
	if (st->has_last) {
		json_t *l = json_object_get(o, "last");
		json_object_set_new(l, "bytes_served", json_integer(st->last_served));
		json_object_set_new(l, "peak_extra_memory",
				    json_integer(st->last_peak > 0 ? st->last_peak : 0));
	}
	json_object_set_new(o, "error", st->error[0] ? json_string(st->error) : json_null());
	struct mlfs_view *v = mlfs_view_get(st->view);
	pthread_mutex_unlock(&st->lock);
	if (v && v->ds) {
		json_t *d = mlfs_data_status(v->ds);
		json_t *segs = json_array();
		for (int k = 0; k < v->cursor.nsegs; k++)
			json_array_append_new(
			    segs,
			    json_pack("{sIsIsIsi}", "step", (json_int_t)v->cursor.segs[k].step,
				      "sample", (json_int_t)v->cursor.segs[k].sample,
				      "global_batch", (json_int_t)v->cursor.segs[k].batch, "dp",
				      v->cursor.segs[k].dp));
		json_object_set_new(d, "cursor", segs);
		json_object_set_new(o, "dataset", d);
	}
	mlfs_view_put(v);
	if (st->status_add)
		st->status_add(st->cluster_arg, o);
	char *s = json_dumps(o, JSON_INDENT(1));
	json_decref(o);
	return s;
}

char *mlfs_rank_json(const struct mlfs_view *v, int rank)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_rank *rk = &l->ranks[rank];
	json_t *o = json_pack("{sisisisisssis[ii]}", "rank", rank, "tp", rk->t, "pp", rk->p, "dp",
			      rk->d, "node", l->cluster->nodes[rk->node].id, "device", rk->device,
			      "layers", rk->layer_begin, rk->layer_end);
	json_object_set_new(o, "tp_size", json_integer(l->tp));
	json_object_set_new(o, "pp_size", json_integer(l->pp));
	json_object_set_new(o, "dp_size", json_integer(l->dp));
	json_object_set_new(o, "version", json_integer(v->config->version));
	char *s = json_dumps(o, JSON_INDENT(1));
	json_decref(o);
	return s;
}
