/*
 * mlfs_stexport.c - `mlfs export --format safetensors`: every state of the
 * mount as DIR/<state>.safetensors (or shards and an index), read from the
 * mount's live view full/<state>.safetensors, named as the schema or
 * through a name map (Hugging Face names: fused tensors split back).
 *
 * Each output file is written through a temporary file renamed into place.
 * Tensors go out in the order of the schema's tensors, a tensor's pieces
 * in their map's order, in shards of at most --shard-mib (ptc_st_shards,
 * ptc_st_format: docs/formats.md), with <state>.safetensors.index.json when
 * there is more than one. A piece that is a whole tensor is copied from the
 * live file; the others are cut from the tensor read whole (ptc_hf_gather).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptc/ptc.h"
#include "tools/tools.h"

/* One live file of a state and its parsed header. */
struct live_file {
	int fd;
	struct ptc_st_header h;
};

/* A state's live files, and where each schema tensor's bytes are. */
struct live {
	struct live_file *f;
	int nf;
	int *file, *entry; /* per schema tensor: -1 when absent */
};

static void live_release(struct live *l)
{
	for (int i = 0; i < l->nf; i++) {
		if (l->f[i].fd >= 0)
			close(l->f[i].fd);
		ptc_st_header_release(&l->f[i].h);
	}
	free(l->f);
	free(l->file);
	free(l->entry);
}

static int pread_all(int fd, void *buf, size_t n, off_t off)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		got += (size_t)r;
	}
	return 0;
}

/* Opens live file @path (one open: one version) and reads its header. */
static int live_open(const struct ptc_schema *s, struct live *l, const char *path)
{
	struct live_file *lf = &l->f[l->nf];
	struct ptc_error err = {.text = ""};
	uint8_t head[8], *buf = NULL;
	struct stat sb;
	size_t need = 0;
	int rc;

	lf->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (lf->fd < 0 || fstat(lf->fd, &sb)) {
		fprintf(stderr, "mlfs export: %s: %s\n", path, strerror(errno));
		return -1;
	}
	l->nf++;
	rc = pread_all(lf->fd, head, sizeof(head), 0);
	if (!rc)
		rc = ptc_st_parse(head, sizeof(head), (uint64_t)sb.st_size, &lf->h, &need, &err);
	if (rc == -EAGAIN && (buf = malloc(need)) && !(rc = pread_all(lf->fd, buf, need, 0)))
		rc = ptc_st_parse(buf, need, (uint64_t)sb.st_size, &lf->h, &need, &err);
	free(buf);
	if (rc) {
		fprintf(stderr, "mlfs export: %s: %s\n", path,
			err.text[0] ? err.text : strerror(-rc));
		return -1;
	}
	for (int e = 0; e < lf->h.n; e++) {
		int ti = ptc_schema_find(s, lf->h.t[e].name);
		if (ti >= 0) {
			l->file[ti] = l->nf - 1;
			l->entry[ti] = e;
		}
	}
	return 0;
}

/* The live view of state @si under @mnt: its index's shards, or its one file. */
static int live_init(const struct ptc_schema *s, const char *mnt, int si, struct live *l)
{
	const char *name = s->states[si].name;
	char path[PATH_MAX], dir[PATH_MAX];
	size_t n = (size_t)s->ntensors + 1;
	int rc = 0;

	*l = (struct live){0};
	l->file = malloc(n * sizeof(int));
	l->entry = malloc(n * sizeof(int));
	if (!l->file || !l->entry)
		return -1;
	memset(l->file, 0xff, n * sizeof(int));
	snprintf(path, sizeof(path), "%s/full/%s.safetensors.index.json", mnt, name);
	size_t len;
	char *text = access(path, F_OK) == 0 ? tools_read_file(path, &len) : NULL;
	json_t *idx = text ? json_loadb(text, len, 0, NULL) : NULL, *wm, *v;
	free(text);
	if (!idx) {
		snprintf(path, sizeof(path), "%s/full/%s.safetensors", mnt, name);
		l->f = calloc(1, sizeof(*l->f));
		return l->f ? live_open(s, l, path) : -1;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	wm = json_object_get(idx, "weight_map");
	l->f = calloc(json_object_size(wm) + 1, sizeof(*l->f));
	/* The shards in order of first mention; each opened once. */
	json_t *seen = json_object();
	const char *k;
	json_object_foreach(wm, k, v)
	{
		const char *f = json_string_value(v);
		if (rc || !f || json_object_get(seen, f))
			continue;
		json_object_set_new(seen, f, json_true());
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, f) >= sizeof(path))
			rc = -1;
		else
			rc = l->f ? live_open(s, l, path) : -1;
	}
	json_decref(seen);
	json_decref(idx);
	return l->f ? rc : -1;
}

/* ----------------------------------------------------------------- output */

/* An output tensor: piece @piece of the map. */
struct out_tensor {
	int piece;
	int64_t bytes;
};

/* The schema tensor last read whole, for the pieces that share it. */
struct whole {
	int tensor;
	uint8_t *data;
};

static int write_all(int fd, const void *p, size_t n)
{
	for (size_t done = 0; done < n;) {
		ssize_t w = write(fd, (const char *)p + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		done += (size_t)w;
	}
	return 0;
}

/* Copies @n bytes of @in at @off to @out. */
static int copy_range(int in, off_t off, int64_t n, int out)
{
	static uint8_t buf[1 << 20];
	int rc = 0;
	while (n > 0 && !rc) {
		size_t k = n < (int64_t)sizeof(buf) ? (size_t)n : sizeof(buf);
		if (!(rc = pread_all(in, buf, k, off)))
			rc = write_all(out, buf, k);
		off += (off_t)k;
		n -= (int64_t)k;
	}
	return rc;
}

/* Writes piece @p of state @si to @out from the live view. */
static int write_piece(const struct ptc_schema *s, const struct live *l, int si,
		       const struct ptc_hf_piece *p, struct whole *w, int out)
{
	const struct live_file *lf = &l->f[l->file[p->tensor]];
	const struct ptc_st_tensor *t = &lf->h.t[l->entry[p->tensor]];
	off_t at = (off_t)(lf->h.data_start + t->begin);
	size_t es = ptc_dtype_size(ptc_schema_dtype(s, si, p->tensor));
	int rc;

	if (!p->transpose && p->nruns == 1 && p->runs[0].src == 0 && p->runs[0].dst == 0 &&
	    ptc_hf_piece_bytes(p, es) == t->end - t->begin)
		return copy_range(lf->fd, at, t->end - t->begin, out);
	if (w->tensor != p->tensor) {
		free(w->data);
		w->tensor = -1;
		if (!(w->data = malloc((size_t)(t->end - t->begin) + 1)))
			return -ENOMEM;
		if ((rc = pread_all(lf->fd, w->data, (size_t)(t->end - t->begin), at)))
			return rc;
		w->tensor = p->tensor;
	}
	int64_t n = ptc_hf_piece_bytes(p, es);
	uint8_t *buf = malloc((size_t)n + 1);
	if (!buf)
		return -ENOMEM;
	ptc_hf_gather(s, p, es, w->data, buf);
	rc = write_all(out, buf, (size_t)n);
	free(buf);
	return rc;
}

/* Writes shard @k (tensors @o[a, b)) to @dst through a temporary file. */
static int write_shard(const struct ptc_schema *s, const struct ptc_hf_map *m, const struct live *l,
		       int si, const struct out_tensor *o, int a, int b, char *dst, struct whole *w)
{
	struct ptc_st_tensor *t = calloc((size_t)(b - a) + 1, sizeof(*t));
	char tmp[PATH_MAX + 16];
	size_t hl = 0;
	uint8_t *hdr = NULL;
	int rc = -ENOMEM, fd = -1;

	for (int i = a; t && i < b; i++) {
		const struct ptc_hf_piece *p = &m->p[o[i].piece];
		t[i - a] = (struct ptc_st_tensor){
		    .name = p->name, .dtype = ptc_schema_dtype(s, si, p->tensor), .ndim = p->ndim};
		memcpy(t[i - a].shape, p->shape, sizeof(p->shape));
	}
	if (!t || !(hdr = ptc_st_format(t, b - a, &hl)))
		goto out;
	if ((fd = tools_create_tmp(dst, tmp, sizeof(tmp))) < 0) {
		rc = -errno;
		goto out;
	}
	rc = write_all(fd, hdr, hl);
	for (int i = a; i < b && !rc; i++)
		rc = write_piece(s, l, si, &m->p[o[i].piece], w, fd);
	if (close(fd) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, dst))
		rc = -errno;
	if (rc)
		unlink(tmp);
out:
	free(hdr);
	free(t);
	return rc;
}

/* The pieces in output order: by schema tensor, then as the map lists them. */
static int out_order(const struct ptc_hf_map *m, const struct ptc_schema *s, int si,
		     struct out_tensor *o)
{
	int n = 0;
	for (int ti = 0; ti < s->ntensors; ti++)
		for (int i = 0; i < m->n; i++)
			if (m->p[i].tensor == ti)
				o[n++] = (struct out_tensor){
				    i, ptc_hf_piece_bytes(
					   &m->p[i], ptc_dtype_size(ptc_schema_dtype(s, si, ti)))};
	return n;
}

static int write_index(const struct ptc_hf_map *m, const struct out_tensor *o, const int *shard,
		       int n, int nshards, const char *base, char *dst)
{
	json_t *wm = json_object(), *root;
	char file[PATH_MAX], tmp[PATH_MAX + 16];
	int64_t total = 0;

	for (int i = 0; i < n; i++) {
		ptc_st_shard_name(base, shard[i], nshards, file, sizeof(file));
		json_object_set_new(wm, m->p[o[i].piece].name, json_string(file));
		total += o[i].bytes;
	}
	root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
			 "weight_map", wm);
	char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(root);
	int fd = text ? tools_create_tmp(dst, tmp, sizeof(tmp)) : -1, rc = fd < 0 ? -ENOMEM : 0;
	if (fd >= 0) {
		rc = write_all(fd, text, strlen(text));
		if (!rc)
			rc = write_all(fd, "\n", 1);
		if (close(fd) && !rc)
			rc = -errno;
		if (!rc && rename(tmp, dst))
			rc = -errno;
		if (rc)
			unlink(tmp);
	}
	free(text);
	return rc;
}

/* Exports state @si to @to; adds the files written to *@files. */
static int export_state(const struct ptc_schema *s, const struct ptc_hf_map *m, const char *mnt,
			const char *to, int si, int64_t shard_max, int *files)
{
	const char *name = s->states[si].name, *base = strrchr(name, '/');
	struct out_tensor *o = calloc((size_t)m->n + 1, sizeof(*o));
	int *shard = calloc((size_t)m->n + 1, sizeof(int)), rc = -ENOMEM;
	int64_t *bytes = calloc((size_t)m->n + 1, sizeof(int64_t));
	struct whole w = {-1, NULL};
	struct live l = {0};
	char dst[PATH_MAX];

	base = base ? base + 1 : name;
	if (!o || !shard || !bytes || live_init(s, mnt, si, &l)) {
		rc = o && shard && bytes ? -EIO : -ENOMEM;
		goto out;
	}
	int n = out_order(m, s, si, o);
	for (int i = 0; i < n; i++) {
		bytes[i] = o[i].bytes;
		if (l.file[m->p[o[i].piece].tensor] < 0) {
			fprintf(stderr, "mlfs export: full/%s.safetensors has no \"%s\"\n", name,
				s->tensors[m->p[o[i].piece].tensor].name);
			rc = -EIO;
			goto out;
		}
	}
	int ns = ptc_st_shards(bytes, n, shard_max, shard);
	rc = 0;
	for (int k = 0, a = 0; k < ns && !rc; k++) {
		int b = a;
		while (b < n && shard[b] == k)
			b++;
		/* to/<state's directory>/<its shard's name> */
		snprintf(dst, sizeof(dst), "%s/%s", to, name);
		size_t dl = (size_t)(strrchr(dst, '/') - dst);
		ptc_st_shard_name(base, k, ns, dst + dl + 1, sizeof(dst) - dl - 1);
		if (!(rc = tools_make_parents(dst)))
			rc = write_shard(s, m, &l, si, o, a, b, dst, &w);
		if (rc)
			fprintf(stderr, "mlfs export: %s: %s\n", dst, strerror(-rc));
		(*files)++;
		a = b;
	}
	if (!rc && ns > 1) {
		snprintf(dst, sizeof(dst), "%s/%s.safetensors.index.json", to, name);
		if ((rc = write_index(m, o, shard, n, ns, base, dst)))
			fprintf(stderr, "mlfs export: %s: %s\n", dst, strerror(-rc));
		(*files)++;
	}
out:
	if (rc == -ENOMEM)
		fprintf(stderr, "mlfs export: out of memory\n");
	live_release(&l);
	free(w.data);
	free(o);
	free(shard);
	free(bytes);
	return rc;
}

int tools_export_st(const char *mnt, const char *to, const char *names, const char *map_file,
		    int64_t shard_max)
{
	char path[PATH_MAX];
	struct ptc_schema *s = NULL;
	struct ptc_hf_map m;
	struct ptc_error err = {.text = ""};
	int rc = 0, files = 0;

	snprintf(path, sizeof(path), "%s/schema.json", mnt);
	if (TOOLS_LOAD(path, ptc_schema_parse_text, &s))
		return 1;
	if (map_file) {
		size_t len;
		char *text = tools_read_file(map_file, &len);
		rc = text ? ptc_hf_map_parse(s, text, len, map_file, &m, &err) : -1;
		free(text);
	} else {
		rc = ptc_hf_map_build(s, names ? names : "schema", &m, &err);
	}
	if (rc) {
		if (err.text[0])
			fprintf(stderr, "mlfs export: %s\n", err.text);
		ptc_schema_free(s);
		return 1;
	}
	for (int si = 0; si < s->nstates && !rc; si++)
		rc = export_state(s, &m, mnt, to, si, shard_max, &files);
	if (!rc)
		printf("exported %d files to %s\n", files, to);
	ptc_hf_map_release(&m);
	ptc_schema_free(s);
	return rc ? 1 : 0;
}
