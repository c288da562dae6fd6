/*
 * ptc_safetensors.c - safetensors headers: parse, format, shards.
 *
 * DESIGN
 * A safetensors file is a u64 little-endian N, N bytes of JSON, then the
 * data buffer. The JSON maps each tensor's name to its dtype, shape and
 * data_offsets [begin, end) in the buffer; "__metadata__" maps strings to
 * strings. The parser treats the file as hostile: N is bounded by the file
 * and PTC_ST_MAX_HEADER before the JSON is read, duplicate keys are
 * refused by jansson, every number is bounded before it is multiplied, and
 * the entries, sorted by offset, must tile the buffer exactly (no overlap,
 * no hole, no tail), as the format's reference reader requires.
 *
 * The writer is canonical, so that two writers that follow docs/formats.md
 * produce the same bytes: tensors in the caller's order, back to back;
 * "__metadata__" {"format": "pt"} first; keys dtype, shape, data_offsets;
 * compact JSON; spaces to a multiple of 8 bytes.
 *
 * Pure: no I/O, no globals; any thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc.h"

static const char *const st_names[PTC_DTYPE_COUNT] = {
    [PTC_FLOAT64] = "F64",
    [PTC_FLOAT32] = "F32",
    [PTC_FLOAT16] = "F16",
    [PTC_BFLOAT16] = "BF16",
    [PTC_INT64] = "I64",
    [PTC_INT32] = "I32",
    [PTC_INT16] = "I16",
    [PTC_INT8] = "I8",
    [PTC_UINT8] = "U8",
    [PTC_BOOL] = "BOOL",
    [PTC_FLOAT8_E4M3FN] = "F8_E4M3",
    [PTC_FLOAT8_E5M2] = "F8_E5M2",
};

const char *ptc_st_dtype_name(enum ptc_dtype dt)
{
	return (unsigned)dt < PTC_DTYPE_COUNT ? st_names[dt] : "?";
}

int ptc_st_dtype_parse(const char *name, enum ptc_dtype *out)
{
	for (int i = 0; i < PTC_DTYPE_COUNT; i++)
		if (strcmp(name, st_names[i]) == 0) {
			*out = (enum ptc_dtype)i;
			return 0;
		}
	return -EINVAL;
}

/* ------------------------------------------------------------------ parse */

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Reads entry @e named @name into @t: 0, or -EINVAL with @err. */
static int parse_entry(const char *name, json_t *e, struct ptc_st_tensor *t, struct ptc_error *err)
{
	json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape");
	json_t *jo = json_object_get(e, "data_offsets");
	int64_t elems = 1;

	if (!json_is_object(e) || json_object_size(e) != 3 || !json_is_string(jd) ||
	    !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
		return ptc_errorf(
		    err, "tensor \"%s\": not {\"dtype\", \"shape\", \"data_offsets\"}", name);
	if (ptc_st_dtype_parse(json_string_value(jd), &t->dtype))
		return ptc_errorf(err, "tensor \"%s\": unknown dtype \"%s\"", name,
				  json_string_value(jd));
	if (json_array_size(js) > PTC_MAX_DIMS)
		return ptc_errorf(err, "tensor \"%s\": more than %d dimensions", name,
				  PTC_MAX_DIMS);
	t->ndim = (int)json_array_size(js);
	for (int i = 0; i < t->ndim; i++) {
		json_t *x = json_array_get(js, (size_t)i);
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) >= PTC_MAX_DIM_SIZE)
			return ptc_errorf(err, "tensor \"%s\": shape[%d] is not a size", name, i);
		t->shape[i] = json_integer_value(x);
		/* both below 2^40: the product is checked before it can overflow */
		elems =
		    elems > INT64_MAX / (t->shape[i] ? t->shape[i] : 1) ? -1 : elems * t->shape[i];
		if (elems < 0 || elems > (INT64_C(1) << 56))
			return ptc_errorf(err, "tensor \"%s\": too many elements", name);
	}
	for (int i = 0; i < 2; i++) {
		json_t *x = json_array_get(jo, (size_t)i);
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return ptc_errorf(err, "tensor \"%s\": data_offsets are not offsets", name);
	}
	t->begin = json_integer_value(json_array_get(jo, 0));
	t->end = json_integer_value(json_array_get(jo, 1));
	if (t->end < t->begin || t->end - t->begin != elems * (int64_t)ptc_dtype_size(t->dtype))
		return ptc_errorf(err,
				  "tensor \"%s\": data_offsets [%" PRId64 ", %" PRId64
				  "] do not hold its %" PRId64 " elements of %s",
				  name, t->begin, t->end, elems, st_names[t->dtype]);
	return 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const struct ptc_st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* The metadata must be an object of strings. */
static int check_metadata(json_t *m, struct ptc_error *err)
{
	const char *k;
	json_t *v;

	if (!json_is_object(m))
		return ptc_errorf(err, "\"__metadata__\" is not an object");
	json_object_foreach(m, k, v)
	{
		if (!json_is_string(v))
			return ptc_errorf(err, "\"__metadata__\": \"%s\" is not a string", k);
	}
	return 0;
}

/* Sorted by offset, the tensors must tile [0, data_len) exactly. */
static int check_tiling(struct ptc_st_header *h, struct ptc_error *err)
{
	int64_t at = 0;

	qsort(h->t, (size_t)h->n, sizeof(*h->t), cmp_begin);
	for (int i = 0; i < h->n; i++) {
		const struct ptc_st_tensor *t = &h->t[i];
		if (t->begin < at)
			return ptc_errorf(err, "tensor \"%s\": its data overlaps \"%s\"'s", t->name,
					  h->t[i - 1].name);
		if (t->begin > at)
			return ptc_errorf(err,
					  "tensor \"%s\": a hole of %" PRId64 " bytes before it",
					  t->name, t->begin - at);
		if (t->end > h->data_len)
			return ptc_errorf(err,
					  "tensor \"%s\": data_offsets end at %" PRId64
					  ", past the file's %" PRId64 " data bytes",
					  t->name, t->end, h->data_len);
		at = t->end;
	}
	if (at != h->data_len)
		return ptc_errorf(err, "%" PRId64 " bytes after the last tensor", h->data_len - at);
	return 0;
}

/* Fills @h from the header object @root. */
static int parse_root(json_t *root, struct ptc_st_header *h, struct ptc_error *err)
{
	const char *k;
	json_t *v;
	int rc;

	if (!json_is_object(root))
		return ptc_errorf(err, "the header is not a JSON object");
	size_t n = json_object_size(root);
	if (n > PTC_ST_MAX_TENSORS)
		return ptc_errorf(err, "more than %d tensors", PTC_ST_MAX_TENSORS);
	if (!(h->t = calloc(n ? n : 1, sizeof(*h->t))))
		return ptc_error_set(err, -ENOMEM, "out of memory");
	json_object_foreach(root, k, v)
	{
		if (strcmp(k, "__metadata__") == 0) {
			if ((rc = check_metadata(v, err)))
				return rc;
			continue;
		}
		struct ptc_st_tensor *t = &h->t[h->n];
		if (!*k)
			return ptc_errorf(err, "a tensor with an empty name");
		if ((rc = parse_entry(k, v, t, err)))
			return rc;
		if (!(t->name = strdup(k)))
			return ptc_error_set(err, -ENOMEM, "out of memory");
		h->n++;
	}
	return check_tiling(h, err);
}

int ptc_st_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct ptc_st_header *out,
		 size_t *need, struct ptc_error *err)
{
	struct ptc_st_header h = {0};
	json_error_t je;

	if (len < 8 || file_size < 8) {
		*need = 8;
		return file_size < 8
			   ? ptc_errorf(err, "%" PRIu64 " bytes: shorter than a header", file_size)
			   : -EAGAIN;
	}
	uint64_t n = le64(buf);
	if (n > PTC_ST_MAX_HEADER || n > file_size - 8)
		return ptc_errorf(err, "header length %" PRIu64 " exceeds the %s (%" PRIu64 ")", n,
				  n > PTC_ST_MAX_HEADER ? "limit" : "file",
				  n > PTC_ST_MAX_HEADER ? PTC_ST_MAX_HEADER : file_size - 8);
	if (len < 8 + n) {
		*need = (size_t)(8 + n);
		return -EAGAIN;
	}
	json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return ptc_errorf(err, "the header is not JSON: %s (column %d)", je.text,
				  je.column);
	h.data_start = (int64_t)(8 + n);
	h.data_len = (int64_t)(file_size - 8 - n);
	int rc = parse_root(root, &h, err);
	json_decref(root);
	if (rc) {
		ptc_st_header_release(&h);
		return rc;
	}
	*out = h;
	return 0;
}

void ptc_st_header_release(struct ptc_st_header *h)
{
	for (int i = 0; h->t && i < h->n; i++)
		free(h->t[i].name);
	free(h->t);
	h->t = NULL;
	h->n = 0;
}

/* ----------------------------------------------------------------- format */

/* {"dtype","shape","data_offsets"} of @t, or NULL. */
static json_t *format_entry(const struct ptc_st_tensor *t)
{
	json_t *e = json_object(), *shape = json_array();

	for (int d = 0; shape && d < t->ndim; d++)
		json_array_append_new(shape, json_integer(t->shape[d]));
	json_object_set_new(e, "dtype", json_string(st_names[t->dtype]));
	json_object_set_new(e, "shape", shape);
	json_object_set_new(e, "data_offsets",
			    json_pack("[I, I]", (json_int_t)t->begin, (json_int_t)t->end));
	if (json_object_size(e) != 3) {
		json_decref(e);
		return NULL;
	}
	return e;
}

uint8_t *ptc_st_format(struct ptc_st_tensor *t, int n, size_t *len)
{
	json_t *root = json_object();
	int64_t at = 0;
	uint8_t *out = NULL;
	int failed = json_object_set_new(root, "__metadata__", json_pack("{ss}", "format", "pt"));

	for (int i = 0; i < n && !failed; i++) {
		int64_t elems = 1;
		for (int d = 0; d < t[i].ndim; d++)
			elems *= t[i].shape[d];
		t[i].begin = at;
		t[i].end = at += elems * (int64_t)ptc_dtype_size(t[i].dtype);
		failed = json_object_set_new(root, t[i].name, format_entry(&t[i]));
	}
	char *text = failed ? NULL : json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!text)
		return NULL;
	size_t tl = strlen(text), pad = (8 - tl % 8) % 8;
	if ((out = malloc(8 + tl + pad))) {
		for (int i = 0; i < 8; i++)
			out[i] = (uint8_t)((tl + pad) >> (8 * i));
		memcpy(out + 8, text, tl);
		memset(out + 8 + tl, ' ', pad);
		*len = 8 + tl + pad;
	}
	free(text);
	return out;
}

/* ----------------------------------------------------------------- shards */

int ptc_st_shards(const int64_t *bytes, int n, int64_t max, int *shard)
{
	int k = 0;
	int64_t used = 0;

	for (int i = 0; i < n; i++) {
		if (used > 0 && used + bytes[i] > max) {
			k++;
			used = 0;
		}
		shard[i] = k;
		used += bytes[i];
	}
	return n ? k + 1 : 1;
}

int ptc_st_shard_name(const char *base, int k, int n, char *buf, size_t cap)
{
	if (n <= 1)
		return snprintf(buf, cap, "%s.safetensors", base);
	return snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", base, k + 1, n);
}

int ptc_st_state_tensors(const struct ptc_schema *s, int state, struct ptc_st_tensor *out, int *idx)
{
	int n = 0;

	for (int ti = 0; ti < s->ntensors; ti++) {
		const struct ptc_tensor *t = &s->tensors[ti];
		if (t->tied >= 0)
			continue;
		out[n] = (struct ptc_st_tensor){
		    .name = t->name, .dtype = ptc_schema_dtype(s, state, ti), .ndim = t->ndim};
		memcpy(out[n].shape, t->shape, sizeof(out[n].shape));
		if (idx)
			idx[n] = ti;
		n++;
	}
	return n;
}
