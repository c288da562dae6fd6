/*
 * mlfs_stimport.c - `mlfs import` of safetensors: one file, or a
 * directory of <state>.safetensors files or sharded checkpoints
 * (<state>.safetensors.index.json, Hugging Face's model.safetensors.index.json
 * for the state "model"), named as the schema or through a name map
 * (ptc_hf_map: Hugging Face Llama and GPT-2 names, or a mapping file).
 *
 * DESIGN
 * A third source of the one import path (mlfs_import.c): every file is
 * mapped and its header checked against the map and the schema before
 * anything is built (dtype, shape, duplicates, the index's word, pieces
 * missing), every error collected and named by file and tensor; then each
 * schema tensor held here is assembled from its pieces (a whole untransposed
 * piece is sliced straight from the mapping, as a .npy file is; fused or
 * transposed ones through one full tensor at a time, counted in
 * --max-memory) and sliced into every local partition that holds it; then
 * mlfs_import_commit. Reads of a mapping go through mlfs_mapcopy, so a file
 * cut short meanwhile fails the import instead of killing the daemon.
 *
 * Threads: a FUSE worker (the .mlfs-ctl request), without the store lock
 * until the commit.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"

/* A mapping file is read whole; bounded like schema.json. */
#define ST_MAP_FILE_MAX (16 << 20)
/* Errors named before "and N more". */
#define ST_ERR_ROOM 40

struct st_file {
	char path[PATH_MAX];
	int state;
	void *map;
	size_t maplen;
	struct ptc_st_header h;
};

/* Where each piece of each imported state was found: file and entry. */
struct st_found {
	int file, entry; /* -1: not found */
};

struct st_import {
	struct mlfs_store *st;
	const struct ptc_schema *s;
	struct ptc_hf_map map;
	struct st_file *files;
	int nfiles;
	bool *states;		/* imported states */
	struct st_found *found; /* [state * map.n + piece] */
	json_t **index;		/* per state: its index's weight_map, or NULL */
	const char *from;	/* the file or directory imported, for messages */
	struct ptc_error *err;
	int omitted;
};

__attribute__((format(printf, 2, 3))) static void st_fail(struct st_import *im, const char *fmt,
							  ...)
{
	struct ptc_error *err = im->err;
	size_t used = strlen(err->text);
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (im->omitted == 0 && used + (size_t)n + ST_ERR_ROOM < sizeof(err->text))
		snprintf(err->text + used, sizeof(err->text) - used, "%s%s", used ? "; " : "",
			 line);
	else
		im->omitted++;
	err->code = -EINVAL;
}

static bool is_regular(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool mlfs_st_source(const struct ptc_schema *s, const char *from, int only)
{
	char path[PATH_MAX];

	if (is_regular(from))
		return true;
	for (int si = 0; si < s->nstates; si++) {
		if (only >= 0 && si != only)
			continue;
		snprintf(path, sizeof(path), "%s/%s.safetensors", from, s->states[si].name);
		if (is_regular(path))
			return true;
		snprintf(path, sizeof(path), "%s/%s.safetensors.index.json", from,
			 s->states[si].name);
		if (is_regular(path))
			return true;
	}
	return false;
}

/* ----------------------------------------------------------------- sources */

static int add_file(struct st_import *im, const char *path, int state)
{
	void *n = realloc(im->files, (size_t)(im->nfiles + 1) * sizeof(*im->files));
	if (!n)
		return -ENOMEM;
	im->files = n;
	struct st_file *f = &im->files[im->nfiles++];
	*f = (struct st_file){.state = state};
	if ((size_t)snprintf(f->path, sizeof(f->path), "%s", path) >= sizeof(f->path))
		return -ENAMETOOLONG;
	return 0;
}

/* The shards an index names, beside it: each once. */
static int add_index(struct st_import *im, const char *dir, const char *ipath, int state)
{
	json_error_t je;
	json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je), *v;
	json_t *wm = json_object_get(root, "weight_map");
	const char *k;
	int rc = 0;

	if (!json_is_object(wm)) {
		st_fail(im, "%s: not a safetensors index (\"weight_map\"): %s", ipath,
			root ? "no weight_map" : je.text);
		json_decref(root);
		return -EINVAL;
	}
	json_object_foreach(wm, k, v)
	{
		const char *f = json_string_value(v);
		bool seen = false;
		if (!f || !*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
			st_fail(im, "%s: \"%s\": its file is not a name beside the index", ipath,
				k);
			rc = -EINVAL;
			continue;
		}
		char path[PATH_MAX];
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, f) >= sizeof(path)) {
			st_fail(im, "%s: \"%s\": its file's path is too long", ipath, k);
			rc = -EINVAL;
			continue;
		}
		for (int i = 0; i < im->nfiles && !seen; i++)
			seen = !strcmp(im->files[i].path, path);
		if (!seen && (rc = add_file(im, path, state)))
			break;
	}
	im->index[state] = json_incref(wm);
	json_decref(root);
	return rc;
}

/* The files of state @si under @from, a directory: 1 when found, 0 when
 * none, or a negative errno. */
static int add_state(struct st_import *im, const char *from, int si)
{
	char path[PATH_MAX], dir[PATH_MAX];
	const char *name = im->s->states[si].name;

	snprintf(path, sizeof(path), "%s/%s.safetensors.index.json", from, name);
	if (is_regular(path)) {
		snprintf(dir, sizeof(dir), "%s", path);
		*strrchr(dir, '/') = '\0';
		int rc = add_index(im, dir, path, si);
		return rc ? rc : 1;
	}
	snprintf(path, sizeof(path), "%s/%s.safetensors", from, name);
	if (!is_regular(path))
		return 0;
	int rc = add_file(im, path, si);
	return rc ? rc : 1;
}

static int find_sources(struct st_import *im, const char *from, int only)
{
	const struct ptc_schema *s = im->s;
	int found = 0, rc = 0;

	if (is_regular(from)) {
		int si = only >= 0 ? only : ptc_schema_find_state(s, "model");
		if (si < 0)
			return ptc_errorf(im->err,
					  "import: %s: name the state (--state): the schema "
					  "has no state \"model\"",
					  from);
		im->states[si] = true;
		return add_file(im, from, si);
	}
	for (int si = 0; si < s->nstates && rc >= 0; si++) {
		if (only >= 0 && si != only)
			continue;
		if ((rc = add_state(im, from, si)) > 0) {
			im->states[si] = true;
			found++;
		}
	}
	if (rc < 0)
		return rc;
	if (!found)
		return ptc_errorf(im->err, "import: %s: no %s.safetensors nor its index", from,
				  only >= 0 ? s->states[only].name : "<state>");
	return 0;
}

/* ------------------------------------------------------------------ headers */

/* Maps @f and parses its header through the SIGBUS guard. */
static int open_file(struct st_import *im, struct st_file *f)
{
	struct ptc_error why = {.text = ""};
	uint8_t head[8];
	uint8_t *buf = NULL;
	struct stat sb;
	size_t need = 0;
	int rc = -EINVAL;

	int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		st_fail(im, "%s: %s", f->path, fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	f->maplen = (size_t)sb.st_size;
	f->map = f->maplen ? mmap(NULL, f->maplen, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	close(fd);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		st_fail(im, "%s: empty or unreadable", f->path);
		return -EINVAL;
	}
	size_t hn = f->maplen < 8 ? f->maplen : 8;
	if (mlfs_mapcopy(head, f->map, hn))
		goto shrank;
	rc = ptc_st_parse(head, hn, f->maplen, &f->h, &need, &why);
	if (rc == -EAGAIN) {
		if (!(buf = malloc(need)))
			return ptc_error_set(im->err, -ENOMEM, "import: out of memory");
		if (mlfs_mapcopy(buf, f->map, need))
			goto shrank;
		rc = ptc_st_parse(buf, need, f->maplen, &f->h, &need, &why);
	}
	free(buf);
	if (rc == -ENOMEM)
		return ptc_error_set(im->err, rc, "import: out of memory");
	if (rc)
		st_fail(im, "%s: %s", f->path, why.text);
	return rc;
shrank:
	free(buf);
	st_fail(im, "%s: shorter than when opened (changed while imported?)", f->path);
	return -EINVAL;
}

/* Checks entry @e of file @fi against the map and the schema, and records it. */
static void check_entry(struct st_import *im, int fi, int e)
{
	const struct st_file *f = &im->files[fi];
	const struct ptc_st_tensor *t = &f->h.t[e];
	int pi = ptc_hf_map_find(&im->map, t->name);

	if (pi < 0) {
		if (!ptc_hf_map_ignored(&im->map, t->name))
			st_fail(im, "%s: \"%s\": not a tensor of the schema or its name map",
				f->path, t->name);
		return;
	}
	const struct ptc_hf_piece *p = &im->map.p[pi];
	enum ptc_dtype want = ptc_schema_dtype(im->s, f->state, p->tensor);
	bool shape = t->ndim == p->ndim && !memcmp(t->shape, p->shape, sizeof(int64_t) * t->ndim);
	const char *wf = json_string_value(json_object_get(im->index[f->state], t->name));
	const char *base = strrchr(f->path, '/') ? strrchr(f->path, '/') + 1 : f->path;
	struct st_found *fd = &im->found[(size_t)f->state * im->map.n + pi];

	if (t->dtype != want)
		st_fail(im, "%s: \"%s\": dtype %s, the schema's is %s (%s)", f->path, t->name,
			ptc_st_dtype_name(t->dtype), ptc_st_dtype_name(want), ptc_dtype_name(want));
	else if (!shape)
		st_fail(im,
			"%s: \"%s\": its shape is not the schema's for it (%d dims, [%" PRId64
			", ...] expected)",
			f->path, t->name, p->ndim, p->ndim ? p->shape[0] : 0);
	else if (im->index[f->state] && (!wf || strcmp(wf, base)))
		st_fail(im, "%s: \"%s\": the index places it in %s", f->path, t->name,
			wf ? wf : "no file");
	else if (fd->file >= 0)
		st_fail(im, "%s: \"%s\": also in %s", f->path, t->name, im->files[fd->file].path);
	else
		*fd = (struct st_found){fi, e};
}

/* Every file opened and checked, every piece of every imported state found. */
static void check_all(struct st_import *im)
{
	for (int fi = 0; fi < im->nfiles; fi++) {
		if (open_file(im, &im->files[fi]))
			continue;
		for (int e = 0; e < im->files[fi].h.n; e++)
			check_entry(im, fi, e);
	}
	if (im->err->code == -ENOMEM)
		return;
	for (int si = 0; si < im->s->nstates; si++)
		for (int pi = 0; im->states[si] && pi < im->map.n; pi++)
			if (im->found[(size_t)si * im->map.n + pi].file < 0)
				st_fail(im, "%s: state %s: tensor \"%s\" is in no file", im->from,
					im->s->states[si].name, im->map.p[pi].name);
}

/* ------------------------------------------------------------------- build */

static int plain_copy(void *dst, const void *src, size_t len)
{
	memcpy(dst, src, len);
	return 0;
}

/* The bytes of piece @pi of state @si in its file's mapping. */
static const uint8_t *piece_data(struct st_import *im, int si, int pi)
{
	struct st_found fd = im->found[(size_t)si * im->map.n + pi];
	const struct st_file *f = &im->files[fd.file];
	return (const uint8_t *)f->map + f->h.data_start + f->h.t[fd.entry].begin;
}

/* Full tensor @ti of state @si into *@full: straight from the mapping when
 * one whole piece holds it (*@tmp NULL, read through the guard), else
 * assembled into *@tmp. 0, -EIO (a file shrank), -ENOSPC, -ENOMEM. */
static int full_tensor(struct st_import *im, int si, int ti, const uint8_t **full,
		       struct xf_buf **tmp)
{
	size_t es = ptc_dtype_size(ptc_schema_dtype(im->s, si, ti));
	int np = 0, one = -1, rc;

	for (int pi = 0; pi < im->map.n; pi++)
		if (im->map.p[pi].tensor == ti)
			np++, one = pi;
	*tmp = NULL;
	if (np == 0) /* the map covers every untied tensor (ptc_hf_map_build checks it) */
		return -EINVAL;
	const struct ptc_hf_piece *p = &im->map.p[one];
	if (np == 1 && !p->transpose && p->nruns == 1 && p->runs[0].src == 0) {
		*full = piece_data(im, si, one);
		return 0;
	}
	if (!(*tmp = xf_buf_new(&im->st->mem, xf_full_bytes(im->s, si, ti), &rc)))
		return rc;
	for (int pi = 0; pi < im->map.n; pi++) {
		if (im->map.p[pi].tensor != ti)
			continue;
		int64_t n = ptc_hf_piece_bytes(&im->map.p[pi], es);
		uint8_t *stage = malloc(n ? (size_t)n : 1);
		if (!stage)
			return -ENOMEM;
		rc = mlfs_mapcopy(stage, piece_data(im, si, pi), (size_t)n);
		if (!rc)
			ptc_hf_scatter(im->s, &im->map.p[pi], es, stage, (*tmp)->data);
		free(stage);
		if (rc)
			return rc;
	}
	*full = (*tmp)->data;
	return 0;
}

/* Slices full tensor @ti of state @si into every local partition holding it
 * (@ti and the tensors tied to it). */
static int slice_local(struct st_import *im, struct mlfs_view *v, struct xf_parts *np, int si,
		       int ti, const uint8_t *full, xf_copy_fn copy)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = im->s;
	int r0 = l->node_first_rank[im->st->node], rc = 0;

	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[im->st->node]; r++)
		for (int a = ti; a >= 0; a = a == ti ? s->tie_first[ti] : s->tie_next[a]) {
			if (!ptc_layout_holds(l, r, a))
				continue;
			size_t i = xf_parts_index(np, r, si, a);
			if (!(np->bufs[i] =
				  xf_buf_new(&im->st->mem, xf_partition_bytes(l, r, si, a), &rc)))
				return rc;
			if ((rc = xf_full_slice(s, si, a, l->tp, l->ranks[r].t, full, np->bufs[i],
						copy)))
				return rc;
			xf_buf_seal(np->bufs[i]);
		}
	return 0;
}

/* Whether some local rank holds @ti or a tensor tied to it. */
static bool held_here(struct st_import *im, struct mlfs_view *v, int ti)
{
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[im->st->node];
	for (int r = r0; r >= 0 && r < r0 + l->node_nranks[im->st->node]; r++)
		for (int a = ti; a >= 0; a = a == ti ? im->s->tie_first[ti] : im->s->tie_next[a])
			if (ptc_layout_holds(l, r, a))
				return true;
	return false;
}

static int build_parts(struct st_import *im, struct mlfs_view *v, struct xf_parts *np)
{
	const struct ptc_schema *s = im->s;

	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; im->states[si] && ti < s->ntensors; ti++) {
			if (s->tensors[ti].tied >= 0 || !held_here(im, v, ti))
				continue;
			const uint8_t *full = NULL;
			struct xf_buf *tmp = NULL;
			int rc = full_tensor(im, si, ti, &full, &tmp);
			if (!rc)
				rc = slice_local(im, v, np, si, ti, full,
						 tmp ? plain_copy : mlfs_mapcopy);
			xf_buf_put(tmp);
			if (rc == -EIO)
				return ptc_error_set(im->err, rc,
						     "import: state %s: tensor \"%s\": a file "
						     "shrank while it was read; nothing imported",
						     s->states[si].name, s->tensors[ti].name);
			if (rc)
				return ptc_error_set(im->err, rc, "import: %s",
						     rc == -ENOSPC ? "the partitions do not fit in "
								     "--max-memory"
								   : "out of memory");
		}
	return 0;
}

/* ------------------------------------------------------------------ driver */

static int load_map(struct st_import *im, const char *names, const char *map_file)
{
	size_t len = 0;
	char *text = NULL;
	int rc;

	if (!map_file)
		return ptc_hf_map_build(im->s, names ? names : "schema", &im->map, im->err);
	FILE *fp = fopen(map_file, "re");
	if (fp) {
		text = malloc(ST_MAP_FILE_MAX + 1);
		len = text ? fread(text, 1, ST_MAP_FILE_MAX + 1, fp) : 0;
		fclose(fp);
	}
	if (!text || len > ST_MAP_FILE_MAX) {
		free(text);
		return ptc_errorf(im->err, "import: %s: %s", map_file,
				  !fp ? strerror(errno) : "unreadable or over 16 MiB");
	}
	rc = ptc_hf_map_parse(im->s, text, len, map_file, &im->map, im->err);
	free(text);
	return rc;
}

static void st_import_release(struct st_import *im)
{
	for (int i = 0; i < im->nfiles; i++) {
		if (im->files[i].map)
			munmap(im->files[i].map, im->files[i].maplen);
		ptc_st_header_release(&im->files[i].h);
	}
	for (int si = 0; im->index && si < im->s->nstates; si++)
		json_decref(im->index[si]);
	free(im->index);
	free(im->files);
	free(im->states);
	free(im->found);
	ptc_hf_map_release(&im->map);
}

/* Prefixes "import: " and appends "nothing imported" to a collected error. */
static int st_refused(struct st_import *im)
{
	char tmp[PTC_ERROR_MAX];
	if (im->omitted) {
		size_t used = strlen(im->err->text);
		snprintf(im->err->text + used, sizeof(im->err->text) - used, "; and %d more",
			 im->omitted);
	}
	memcpy(tmp, im->err->text, sizeof(tmp));
	return ptc_error_set(im->err, -EINVAL, "import: %.*s; nothing imported",
			     (int)(sizeof(tmp) - ST_ERR_ROOM), tmp);
}

/* With the map loaded: everything checked, then built aside and committed. */
static int st_import_run(struct st_import *im, struct mlfs_view *v, const char *from, int only,
			 int64_t step)
{
	struct xf_parts np;
	size_t ns = (size_t)im->s->nstates;
	int rc;

	im->states = calloc(ns, sizeof(bool));
	im->index = calloc(ns, sizeof(json_t *));
	im->found = malloc(ns * (size_t)(im->map.n ? im->map.n : 1) * sizeof(*im->found));
	if (!im->states || !im->index || !im->found)
		return ptc_error_set(im->err, -ENOMEM, "import: out of memory");
	memset(im->found, 0xff, ns * (size_t)(im->map.n ? im->map.n : 1) * sizeof(*im->found));
	if ((rc = find_sources(im, from, only)) || im->err->text[0])
		return im->err->text[0] && !rc ? st_refused(im) : rc;
	check_all(im);
	if (im->err->code == -ENOMEM)
		return -ENOMEM;
	if (im->err->text[0])
		return st_refused(im);
	if (xf_parts_init(&np, &v->layout, im->st->node))
		return ptc_error_set(im->err, -ENOMEM, "import: out of memory");
	rc = build_parts(im, v, &np);
	if (!rc)
		rc = mlfs_import_commit(im->st, v, &np, step < 0 ? 0 : step, im->err);
	xf_parts_release(&np);
	return rc;
}

int mlfs_store_import_st(struct mlfs_store *st, const char *from, int only, int64_t step,
			 const char *names, const char *map_file, struct ptc_error *err)
{
	struct mlfs_view *v = mlfs_store_view(st);
	struct st_import im = {.st = st, .s = st->schema, .from = from, .err = err};
	int rc;

	if (!v)
		return ptc_errorf(err, "import: set schema.json and config.json first");
	rc = load_map(&im, names, map_file);
	if (rc == 0)
		rc = st_import_run(&im, v, from, only, step);
	else if (rc == -EINVAL && strncmp(err->text, "import:", 7)) {
		char tmp[PTC_ERROR_MAX];
		memcpy(tmp, err->text, sizeof(tmp));
		ptc_error_set(err, rc, "import: %.*s", (int)sizeof(tmp) - 16, tmp);
	}
	st_import_release(&im);
	mlfs_view_put(v);
	return rc;
}
