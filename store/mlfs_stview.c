/*
 * mlfs_stview.c - full/<state>.safetensors: a state as safetensors files,
 * assembled on read.
 *
 * DESIGN
 * A state's files follow from the schema alone: its untied tensors in
 * schema order, grouped into shards of at most mlfs_st_shard_max() data
 * bytes (4 GiB: one file for most states; a larger tensor alone), each
 * with the canonical header of ptc_st_format. So sizes, names and headers
 * are known without reading a byte of data, and an index
 * (<state>.safetensors.index.json, Hugging Face's shape) is text.
 *
 * A read copies the bytes it asks for from the partitions pinned when the
 * file was looked up (the tp parts of each split tensor, the one part of a
 * replicated one): no tensor is assembled whole. A position in a tensor is
 * a block, a global row and a byte in the row; the part whose slice holds
 * that row gives the bytes up to the end of its segment. Since the parts
 * are pinned, an open file reads one version to its end, as a
 * full/<state>/<tensor>.npy does.
 *
 * Threads: any; mlfs_view_st_sources under st->lock, the rest without.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

int64_t mlfs_st_shard_max(void)
{
	static _Atomic int64_t max; /* 0: not read yet */
	int64_t m = max;

	if (m == 0) {
		const char *h = getenv("MLFS_TEST_HOOKS"), *e = getenv("MLFS_ST_SHARD_BYTES");
		long long v = h && !strcmp(h, "1") && e ? atoll(e) : 0;
		m = v > 0 ? (int64_t)v : PTC_ST_SHARD_MAX;
		max = m;
	}
	return m;
}

/* The state's tensors (ptc_st_state_tensors), their bytes and shards. */
struct st_plan {
	struct ptc_st_tensor *t;
	int *idx, *shard, n, nshards;
	int64_t *bytes;
};

static void plan_release(struct st_plan *p)
{
	free(p->t);
	free(p->idx);
	free(p->shard);
	free(p->bytes);
}

static int plan_init(const struct ptc_schema *s, int state, int64_t max, struct st_plan *p)
{
	size_t n = (size_t)(s->ntensors ? s->ntensors : 1);

	*p = (struct st_plan){0};
	p->t = malloc(n * sizeof(*p->t));
	p->idx = malloc(n * sizeof(int));
	p->shard = malloc(n * sizeof(int));
	p->bytes = malloc(n * sizeof(int64_t));
	if (!p->t || !p->idx || !p->shard || !p->bytes) {
		plan_release(p);
		return -ENOMEM;
	}
	p->n = ptc_st_state_tensors(s, state, p->t, p->idx);
	for (int i = 0; i < p->n; i++)
		p->bytes[i] = xf_full_bytes(s, state, p->idx[i]);
	p->nshards = ptc_st_shards(p->bytes, p->n, max, p->shard);
	return 0;
}

int mlfs_st_shard_count(const struct ptc_schema *s, int state, int64_t max)
{
	struct st_plan p;
	if (plan_init(s, state, max, &p))
		return -ENOMEM;
	plan_release(&p);
	return p.nshards;
}

void mlfs_st_shard_release(struct mlfs_st_shard *sh)
{
	free(sh->tensor);
	free(sh->begin);
	free(sh->src0);
	free(sh->hdr);
	*sh = (struct mlfs_st_shard){0};
}

int mlfs_st_shard_init(const struct ptc_schema *s, int state, int shard, int64_t max, int tp,
		       struct mlfs_st_shard *sh)
{
	struct st_plan p;
	int a = 0, rc = -ENOMEM;

	*sh = (struct mlfs_st_shard){.state = state, .tp = tp};
	if (plan_init(s, state, max, &p))
		return -ENOMEM;
	if (shard < 0 || shard >= p.nshards) {
		plan_release(&p);
		return -ENOENT;
	}
	while (a < p.n && p.shard[a] != shard)
		a++;
	while (a + sh->n < p.n && p.shard[a + sh->n] == shard)
		sh->n++;
	size_t n = (size_t)sh->n + 1;
	if (!(sh->tensor = malloc(n * sizeof(int))) || !(sh->begin = malloc(n * sizeof(int64_t))) ||
	    !(sh->src0 = malloc(n * sizeof(int))) ||
	    !(sh->hdr = ptc_st_format(p.t + a, sh->n, &sh->hdr_len)))
		goto out;
	sh->src0[0] = 0;
	for (int i = 0; i < sh->n; i++) {
		const struct ptc_tensor *t = &s->tensors[p.idx[a + i]];
		sh->tensor[i] = p.idx[a + i];
		sh->begin[i] = (int64_t)sh->hdr_len + p.t[a + i].begin;
		sh->src0[i + 1] = sh->src0[i] + (t->split_dim < 0 ? 1 : tp);
	}
	sh->begin[sh->n] = sh->size = (int64_t)sh->hdr_len + (sh->n ? p.t[a + sh->n - 1].end : 0);
	rc = 0;
out:
	plan_release(&p);
	if (rc)
		mlfs_st_shard_release(sh);
	return rc;
}

char *mlfs_st_index_text(const struct ptc_schema *s, int state, int64_t max)
{
	const char *name = s->states[state].name, *base = strrchr(name, '/');
	json_t *root = json_object(), *wm = json_object();
	struct st_plan p;
	int64_t total = 0;
	char file[PTC_MAX_NAME + 32], *text = NULL;

	base = base ? base + 1 : name;
	if (plan_init(s, state, max, &p) == 0) {
		for (int i = 0; i < p.n; i++) {
			ptc_st_shard_name(base, p.shard[i], p.nshards, file, sizeof(file));
			json_object_set_new(wm, p.t[i].name, json_string(file));
			total += p.bytes[i];
		}
		json_object_set_new(root, "metadata", json_pack("{sI}", "total_size", total));
		json_object_set(root, "weight_map", wm);
		if (json_object_size(wm) == (size_t)p.n)
			text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
		plan_release(&p);
	}
	json_decref(wm);
	json_decref(root);
	return text;
}

int mlfs_view_st_sources(const struct mlfs_view *v, const struct ptc_schema *s, int node,
			 const struct mlfs_st_shard *sh, struct xf_buf **srcs)
{
	for (int i = 0; i < sh->n; i++) {
		int rc = mlfs_view_full_sources(v, s, node, sh->state, sh->tensor[i],
						srcs + sh->src0[i]);
		if (rc == sh->src0[i + 1] - sh->src0[i])
			continue;
		for (int k = 0; rc > 0 && k < rc; k++)
			xf_buf_put(srcs[sh->src0[i] + k]);
		while (i > 0) {
			i--;
			for (int k = sh->src0[i]; k < sh->src0[i + 1]; k++)
				xf_buf_put(srcs[k]);
		}
		return -EIO;
	}
	return 0;
}

/* Bytes [@a, @b) of tensor @ti's data (full C order) into @dst from its
 * @np parts, whose slices are @sl. */
static void tensor_read(const struct ptc_schema *s, int state, int ti, struct xf_buf *const *parts,
			const struct ptc_slice *sl, int np, uint8_t *dst, int64_t a, int64_t b)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	int64_t outer, rowel, n = t->split_dim < 0 ? 1 : t->shape[t->split_dim];

	ptc_tensor_geometry(t, &outer, &rowel);
	int64_t rb = rowel * (int64_t)ptc_dtype_size(ptc_schema_dtype(s, state, ti));
	while (a < b) {
		int64_t o = a / (n * rb), row = a % (n * rb) / rb, c = a % rb, got = 0;
		for (int k = 0; k < np && !got; k++)
			for (int g = 0; g < sl[k].nsegs && !got; g++) {
				const struct ptc_seg *sg = &sl[k].segs[g];
				if (sg->global < 0 || row < sg->global ||
				    row >= sg->global + sg->len)
					continue;
				int64_t lrow = sg->local + (row - sg->global);
				got = (sg->global + sg->len - row) * rb - c;
				got = got < b - a ? got : b - a;
				memcpy(dst, parts[k]->data + (o * sl[k].rows + lrow) * rb + c,
				       (size_t)got);
			}
		if (!got) /* a row no part holds: the layout's slices say it cannot be */
			break;
		dst += got;
		a += got;
	}
}

int mlfs_st_read(const struct ptc_schema *s, const struct mlfs_st_shard *sh,
		 struct xf_buf *const *srcs, uint8_t *dst, int64_t off, size_t len)
{
	int64_t end = off + (int64_t)len;
	struct ptc_slice *sl = NULL;

	if (off < (int64_t)sh->hdr_len) {
		size_t n =
		    (size_t)((int64_t)sh->hdr_len < end ? (int64_t)sh->hdr_len : end) - (size_t)off;
		memcpy(dst, sh->hdr + off, n);
		dst += n;
		off += (int64_t)n;
	}
	if (off >= end)
		return 0;
	if (!(sl = malloc((size_t)sh->tp * sizeof(*sl))))
		return -ENOMEM;
	int i = 0;
	while (i < sh->n && sh->begin[i + 1] <= off)
		i++;
	for (; i < sh->n && off < end; i++) {
		const struct ptc_tensor *t = &s->tensors[sh->tensor[i]];
		int np = sh->src0[i + 1] - sh->src0[i];
		for (int k = 0; k < np; k++)
			ptc_slice_compute(t, np, k, &sl[k]);
		int64_t b = end < sh->begin[i + 1] ? end : sh->begin[i + 1];
		tensor_read(s, sh->state, sh->tensor[i], srcs + sh->src0[i], sl, np, dst,
			    off - sh->begin[i], b - sh->begin[i]);
		dst += b - off;
		off = b;
	}
	free(sl);
	return 0;
}
