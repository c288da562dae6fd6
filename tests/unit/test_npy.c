/*
 * test_npy.c - .npy headers: byte-exact against numpy, parse round trips,
 * every prefix of a header, headers from other writers. test_npy_errors.c
 * has every error path and the check of a header against a partition.
 */
#include "tests/unit/npy_fixture.h"

/* Asserts @n bytes at @got equal @want, printing both as text on failure. */
static void assert_bytes(const char *got, const char *want, size_t n)
{
	if (memcmp(got, want, n) != 0) {
		print_error("got  \"%.*s\"\nwant \"%.*s\"\n", (int)n - 10, got + 10, (int)n - 10,
			    want + 10);
		fail();
	}
}

/* Every proper prefix of a valid header is -EAGAIN; the whole one parses. */
static void assert_prefixes_again(const void *bytes, size_t len)
{
	struct mlfs_npy h;
	struct ptc_error err;

	for (size_t n = 0; n < len; n++) {
		int rc = parse_exact(bytes, n, &h, &err);
		if (rc != -EAGAIN) {
			print_error("prefix of %zu of %zu bytes: rc %d \"%s\"\n", n, len, rc,
				    err.text);
			fail();
		}
		assert_string_equal(err.text, "");
		assert_int_equal(err.code, 0);
	}
	assert_int_equal(parse_exact(bytes, len, &h, &err), 0);
	assert_int_equal(h.header_len, len);
}

static void assert_shape(const struct mlfs_npy *h, int ndim, const int64_t *shape)
{
	assert_int_equal(h->ndim, ndim);
	for (int i = 0; i < ndim; i++)
		assert_int_equal(h->shape[i], shape[i]);
}

/* ---------------------------------------------------------------- format */

static void check_format_table(const struct expect_header *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char buf[512];
		size_t len = mlfs_npy_format(t[i].dt, t[i].ndim, t[i].shape, buf, sizeof(buf));
		assert_int_equal(len, t[i].len);
		assert_bytes(buf, t[i].bytes, len);
	}
}

static void test_format_matches_numpy(void **state)
{
	(void)state;
	check_format_table(numpy_headers, ARRAY_LEN(numpy_headers));
	check_format_table(numpy_big_headers, ARRAY_LEN(numpy_big_headers));
}

/* fp8 has no NumPy dtype: its files are uint8 files. */
static void test_format_fp8(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(numpy_headers); i++) {
		const struct expect_header *e = &numpy_headers[i];
		char buf[512];
		if (e->dt != PTC_UINT8)
			continue;
		for (int dt = PTC_FLOAT8_E4M3FN; dt <= PTC_FLOAT8_E5M2; dt++) {
			size_t len = mlfs_npy_format(dt, e->ndim, e->shape, buf, sizeof(buf));
			assert_int_equal(len, e->len);
			assert_bytes(buf, e->bytes, len);
		}
	}
}

static void test_format_limits(void **state)
{
	const int64_t shape[PTC_MAX_DIMS + 1] = {3, 4, 1, 1, 1, 1, 1, 1, 1};
	const int64_t neg[2] = {3, -4};
	char buf[256];

	(void)state;
	/* Too small a buffer: 0 and nothing written. */
	memset(buf, 0x5a, sizeof(buf));
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, 2, shape, buf, 127), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		assert_int_equal((uint8_t)buf[i], 0x5a);
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, 2, shape, buf, 128), 128);
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, 2, shape, buf, 0), 0);
	/* Invalid arguments. */
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, -1, shape, buf, sizeof(buf)), 0);
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, PTC_MAX_DIMS + 1, shape, buf, sizeof(buf)),
			 0);
	assert_int_equal(mlfs_npy_format(PTC_FLOAT32, 2, neg, buf, sizeof(buf)), 0);
	assert_int_equal(mlfs_npy_format(PTC_DTYPE_COUNT, 2, shape, buf, sizeof(buf)), 0);
	/* The largest header there is still fits the format's u16 and 64-byte alignment. */
	const int64_t big[PTC_MAX_DIMS] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX,
					   INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
	size_t len = mlfs_npy_format(PTC_FLOAT64, PTC_MAX_DIMS, big, buf, sizeof(buf));
	assert_int_equal(len, 256);
	assert_int_equal(buf[len - 1], '\n');
}

/* ----------------------------------------------------------------- parse */

static void check_parse_table(const struct expect_header *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct mlfs_npy h;
		struct ptc_error err;
		uint8_t buf[600];

		int64_t elems = 1;
		for (int d = 0; d < t[i].ndim; d++)
			elems = elems < MLFS_NPY_MAX_ELEMS ? elems * t[i].shape[d] : elems;
		if (elems >= MLFS_NPY_MAX_ELEMS) {
			/* Formattable, but more elements than mlfs accepts from a file. */
			assert_int_equal(parse_exact(t[i].bytes, t[i].len, &h, &err), -EINVAL);
			assert_non_null(strstr(err.text, "has 2^48 or more elements"));
			continue;
		}
		/* The header alone, then followed by data. */
		assert_int_equal(parse_exact(t[i].bytes, t[i].len, &h, &err), 0);
		assert_string_equal(h.descr, ptc_dtype_npy_descr(t[i].dt));
		assert_false(h.fortran_order);
		assert_shape(&h, t[i].ndim, t[i].shape);
		assert_int_equal(h.header_len, t[i].len);
		memcpy(buf, t[i].bytes, t[i].len);
		memset(buf + t[i].len, 0xff, sizeof(buf) - t[i].len);
		assert_int_equal(mlfs_npy_parse(buf, sizeof(buf), &h, &err), 0);
		assert_int_equal(h.header_len, t[i].len);
		assert_int_equal(mlfs_npy_check(&h, t[i].dt, t[i].ndim, t[i].shape, &err), 0);
		assert_string_equal(err.text, "");
	}
}

static void test_parse_numpy(void **state)
{
	(void)state;
	check_parse_table(numpy_headers, ARRAY_LEN(numpy_headers));
	check_parse_table(numpy_big_headers, ARRAY_LEN(numpy_big_headers));
}

static void test_parse_versions_2_3(void **state)
{
	const int64_t shape[2] = {7, 5};
	struct mlfs_npy h;
	struct ptc_error err;

	(void)state;
	assert_int_equal(parse_exact(numpy_v2_header, sizeof(numpy_v2_header) - 1, &h, &err), 0);
	assert_string_equal(h.descr, "<f4");
	assert_shape(&h, 2, shape);
	assert_int_equal(h.header_len, 128);
	assert_int_equal(parse_exact(numpy_v3_header, sizeof(numpy_v3_header) - 1, &h, &err), 0);
	assert_shape(&h, 2, shape);
	assert_int_equal(h.header_len, 128);
	assert_prefixes_again(numpy_v2_header, sizeof(numpy_v2_header) - 1);
	assert_prefixes_again(numpy_v3_header, sizeof(numpy_v3_header) - 1);
}

/* Format then parse: every dtype, shapes of every rank, large dimensions. */
static void test_round_trip(void **state)
{
	static const int64_t shapes[][PTC_MAX_DIMS] = {
	    {0},
	    {1},
	    {3, 4},
	    {0, 7},
	    {(INT64_C(1) << 40) - 1, 255},
	    {2, 3, 4, 5, 6, 7, 8, 9},
	    {1, 1, 1, 1, 1, 1, 1, 1},
	    {INT64_C(1) << 24, INT64_C(1) << 23, 31},
	    {INT64_C(1) << 16, INT64_C(1) << 16, (INT64_C(1) << 16) - 1},
	    {(INT64_C(1) << 40) - 1, 0, (INT64_C(1) << 40) - 1},
	};
	static const int ndims[] = {0, 1, 2, 2, 2, 8, 8, 3, 3, 3};

	(void)state;
	for (int dt = 0; dt < PTC_DTYPE_COUNT; dt++) {
		for (size_t s = 0; s < ARRAY_LEN(shapes); s++) {
			struct mlfs_npy h;
			char buf[512];
			struct ptc_error err;
			size_t len = mlfs_npy_format(dt, ndims[s], shapes[s], buf, sizeof(buf));

			assert_true(len >= 128 && len % 64 == 0);
			/* Row 7 holds 2^48 elements or more; row 4 just fewer. */
			if (s == 7) {
				assert_int_equal(parse_exact(buf, len, &h, &err), -EINVAL);
				continue;
			}
			assert_int_equal(parse_exact(buf, len, &h, &err), 0);
			assert_string_equal(h.descr, ptc_dtype_npy_descr(dt));
			assert_shape(&h, ndims[s], shapes[s]);
			assert_int_equal(h.header_len, len);
			assert_int_equal(mlfs_npy_check(&h, dt, ndims[s], shapes[s], &err), 0);
		}
	}
}

static void test_truncated(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(numpy_headers); i++)
		assert_prefixes_again(numpy_headers[i].bytes, numpy_headers[i].len);
	/* Those within the element limit. */
	assert_prefixes_again(numpy_big_headers[0].bytes, numpy_big_headers[0].len);
	assert_prefixes_again(numpy_big_headers[3].bytes, numpy_big_headers[3].len);
	assert_prefixes_again(numpy_big_headers[4].bytes, numpy_big_headers[4].len);
	/* A NULL buffer of no bytes is just too short. */
	assert_int_equal(mlfs_npy_parse(NULL, 0, NULL, NULL), -EAGAIN);
}

/* Dicts other writers produce, all meaning float32 (3, 4) in C order. */
static void test_parse_variants(void **state)
{
	static const char *const dicts[] = {
	    "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
	    "{'shape': (3, 4), 'fortran_order': False, 'descr': '<f4'}",
	    "{'fortran_order': False, 'descr': '<f4', 'shape': (3, 4)}",
	    "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3, 4)}",
	    "{\"descr\": '<f4', 'fortran_order': False, \"shape\": (3, 4,),}",
	    "{'descr':'<f4','fortran_order':False,'shape':(3,4)}",
	    "\n\t{ 'descr' : '<f4' ,\n 'fortran_order' :\tFalse ,\r\n 'shape' : ( 3 , 4 , ) , }\n",
	    "{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }",
	};
	const int64_t shape[2] = {3, 4};

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(dicts); i++) {
		for (int major = 1; major <= 3; major++) {
			struct mlfs_npy h;
			struct ptc_error err;
			size_t len;
			uint8_t *b = wrap(dicts[i], major, &len);
			int rc = parse_exact(b, len, &h, &err);
			if (rc != 0) {
				print_error("dict %zu v%d: rc %d \"%s\"\n", i, major, rc, err.text);
				fail();
			}
			assert_string_equal(h.descr, "<f4");
			assert_false(h.fortran_order);
			assert_shape(&h, 2, shape);
			assert_int_equal(h.header_len, len);
			assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, shape, &err), 0);
			assert_prefixes_again(b, len);
			free(b);
		}
	}
}

/* Other shapes written differently, and fortran_order True (parsed, refused by check). */
static void test_parse_shapes(void **state)
{
	static const struct {
		const char *shape;
		int ndim;
		int64_t dims[PTC_MAX_DIMS];
	} cases[] = {
	    {"()", 0, {0}},
	    {"( )", 0, {0}},
	    {"(7,)", 1, {7}},
	    {"( 7 , )", 1, {7}},
	    {"(0, 1099511627775, 1099511627775)", 3, {0, 1099511627775, 1099511627775}},
	    {"(1048576, 1048576, 255)", 3, {1048576, 1048576, 255}},
	    {"(1, 2, 3, 4, 5, 6, 7, 8,)", 8, {1, 2, 3, 4, 5, 6, 7, 8}},
	};
	char dict[256];
	struct ptc_error err;
	struct mlfs_npy h;
	size_t len;

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		snprintf(dict, sizeof(dict), "{'descr': '|b1', 'fortran_order': True, 'shape': %s}",
			 cases[i].shape);
		uint8_t *b = wrap(dict, 1, &len);
		int rc = parse_exact(b, len, &h, &err);
		if (rc != 0) {
			print_error("shape %s: rc %d \"%s\"\n", cases[i].shape, rc, err.text);
			fail();
		}
		assert_true(h.fortran_order);
		assert_shape(&h, cases[i].ndim, cases[i].dims);
		assert_int_equal(mlfs_npy_check(&h, PTC_BOOL, cases[i].ndim, cases[i].dims, &err),
				 -EINVAL);
		assert_string_equal(err.text, "fortran_order must be False");
		free(b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_format_matches_numpy),
	    cmocka_unit_test(test_format_fp8),
	    cmocka_unit_test(test_format_limits),
	    cmocka_unit_test(test_parse_numpy),
	    cmocka_unit_test(test_parse_versions_2_3),
	    cmocka_unit_test(test_round_trip),
	    cmocka_unit_test(test_truncated),
	    cmocka_unit_test(test_parse_variants),
	    cmocka_unit_test(test_parse_shapes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
