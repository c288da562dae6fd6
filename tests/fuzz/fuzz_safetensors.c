/*
 * fuzz_safetensors.c - fuzzes the safetensors header parser and writer.
 *
 * The input is a whole file. ptc_st_parse must return 0, -EINVAL (with a
 * message) or -ENOMEM, and never read past the input. On success: the
 * tensors tile the data exactly, each the bytes of its shape; the header
 * alone (its 8 + N bytes) parses the same and one byte less asks for more
 * (-EAGAIN with the length); and the canonical writer's header of the same
 * tensors, in data order, parses back to the same tensors and offsets.
 * abort() on any violation.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc.h"
#include "tests/fuzz/fuzz.h"

static void check_tiling(const struct ptc_st_header *h)
{
	int64_t at = 0;
	for (int i = 0; i < h->n; i++) {
		int64_t elems = 1;
		for (int d = 0; d < h->t[i].ndim; d++)
			elems *= h->t[i].shape[d];
		CHECK(h->t[i].begin == at);
		CHECK(h->t[i].end - h->t[i].begin ==
		      elems * (int64_t)ptc_dtype_size(h->t[i].dtype));
		at = h->t[i].end;
	}
	CHECK(at == h->data_len);
}

static void check_same(const struct ptc_st_header *a, const struct ptc_st_header *b)
{
	CHECK(a->n == b->n);
	for (int i = 0; i < a->n; i++) {
		CHECK(strcmp(a->t[i].name, b->t[i].name) == 0);
		CHECK(a->t[i].dtype == b->t[i].dtype && a->t[i].ndim == b->t[i].ndim);
		CHECK(a->t[i].begin == b->t[i].begin && a->t[i].end == b->t[i].end);
		CHECK(!memcmp(a->t[i].shape, b->t[i].shape, sizeof(int64_t) * a->t[i].ndim));
	}
}

/* The writer's header of @h's tensors, followed by @h's data length. */
static void check_reformat(const struct ptc_st_header *h)
{
	struct ptc_st_tensor *t = calloc((size_t)h->n + 1, sizeof(*t));
	struct ptc_st_header g;
	struct ptc_error err;
	size_t len, need;

	CHECK(t != NULL);
	memcpy(t, h->t, (size_t)h->n * sizeof(*t));
	uint8_t *hdr = ptc_st_format(t, h->n, &len);
	CHECK(hdr != NULL && len % 8 == 0);
	CHECK(ptc_st_parse(hdr, len, len + (uint64_t)h->data_len, &g, &need, &err) == 0);
	check_same(h, &g);
	ptc_st_header_release(&g);
	free(hdr);
	free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ptc_st_header h, g;
	struct ptc_error err = {.text = "x", .code = 1};
	size_t need = 0;
	int rc = ptc_st_parse(data, size, size, &h, &need, &err);

	CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	CHECK(memchr(err.text, '\0', sizeof(err.text)) != NULL);
	if (rc == -EINVAL)
		CHECK(err.text[0] != '\0' && err.code == rc);
	if (rc != 0)
		return 0;
	check_tiling(&h);
	CHECK(ptc_st_parse(data, (size_t)h.data_start, size, &g, &need, &err) == 0);
	check_same(&h, &g);
	ptc_st_header_release(&g);
	CHECK(ptc_st_parse(data, (size_t)h.data_start - 1, size, &g, &need, &err) == -EAGAIN);
	CHECK(need == (size_t)h.data_start);
	check_reformat(&h);
	ptc_st_header_release(&h);
	return 0;
}
