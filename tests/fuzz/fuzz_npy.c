/*
 * fuzz_npy.c - fuzzes the .npy header parser and check.
 *
 * The input is the start of a file. mlfs_npy_parse must return 0, -EAGAIN
 * or -EINVAL (with a message) and never read past the input. On success:
 * the parsed values respect the documented bounds; every shorter prefix of
 * the header is -EAGAIN and the header alone parses the same; the header is
 * checked against a fixed float32 (3, 4) partition; and for every dtype it
 * matches, formatting that dtype and shape and parsing the result gives the
 * same shape back. abort() on any violation.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tests/fuzz/fuzz.h"

static bool same_header(const struct mlfs_npy *a, const struct mlfs_npy *b)
{
	if (strcmp(a->descr, b->descr) || a->fortran_order != b->fortran_order ||
	    a->ndim != b->ndim || a->header_len != b->header_len)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

static void check_bounds(const struct mlfs_npy *h, size_t size)
{
	int64_t elems = 1;

	CHECK(memchr(h->descr, '\0', sizeof(h->descr)) != NULL);
	CHECK(h->ndim >= 0 && h->ndim <= PTC_MAX_DIMS);
	CHECK(h->header_len >= 10 && h->header_len <= size);
	CHECK(h->header_len <= 12 + (size_t)MLFS_NPY_MAX_HEADER);
	for (int i = 0; i < h->ndim; i++) {
		CHECK(h->shape[i] >= 0 && h->shape[i] < PTC_MAX_DIM_SIZE);
		elems = h->shape[i] == 0 || elems == 0 ? 0 : elems * h->shape[i];
		CHECK(elems < MLFS_NPY_MAX_ELEMS);
	}
}

/* Formats @dt with @h's shape and parses it back. */
static void check_reformat(const struct mlfs_npy *h, enum ptc_dtype dt)
{
	char buf[512];
	struct ptc_error err;
	struct mlfs_npy g;
	size_t len = mlfs_npy_format(dt, h->ndim, h->shape, buf, sizeof(buf));

	CHECK(len > 0 && len % 64 == 0);
	CHECK(mlfs_npy_parse((const uint8_t *)buf, len, &g, &err) == 0);
	CHECK(g.header_len == len && !g.fortran_order && g.ndim == h->ndim);
	CHECK(strcmp(g.descr, ptc_dtype_npy_descr(dt)) == 0);
	for (int i = 0; i < h->ndim; i++)
		CHECK(g.shape[i] == h->shape[i]);
	CHECK(mlfs_npy_check(&g, dt, h->ndim, h->shape, &err) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int64_t part_shape[2] = {3, 4};
	struct mlfs_npy h, g;
	struct ptc_error err;
	int rc;

	err.text[0] = 'x';
	err.code = 1;
	rc = mlfs_npy_parse(data, size, &h, &err);
	CHECK(rc == 0 || rc == -EAGAIN || rc == -EINVAL);
	CHECK(memchr(err.text, '\0', sizeof(err.text)) != NULL);
	if (rc == -EINVAL)
		CHECK(err.text[0] != '\0' && err.code == rc);
	if (rc != 0)
		return 0;
	CHECK(err.text[0] == '\0' && err.code == 0);
	check_bounds(&h, size);

	/* The header alone parses the same; one byte less is not enough yet. */
	CHECK(mlfs_npy_parse(data, h.header_len, &g, &err) == 0);
	CHECK(same_header(&h, &g));
	CHECK(mlfs_npy_parse(data, h.header_len - 1, &g, &err) == -EAGAIN);

	rc = mlfs_npy_check(&h, PTC_FLOAT32, 2, part_shape, &err);
	CHECK(rc == 0 || (rc == -EINVAL && err.text[0] != '\0' && err.code == rc));
	for (int dt = 0; dt < PTC_DTYPE_COUNT; dt++) {
		rc = mlfs_npy_check(&h, dt, h.ndim, h.shape, &err);
		CHECK(rc == 0 || (rc == -EINVAL && err.text[0] != '\0' && err.code == rc));
		if (rc == 0)
			check_reformat(&h, dt);
	}
	return 0;
}
