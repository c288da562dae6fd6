/*
 * test_npy_errors.c - .npy headers: every error path of the parser (magic,
 * version, length, the dict and its framing), the check of a header
 * against a partition's dtype and shape, and the caller's error detail.
 */
#include "tests/unit/npy_fixture.h"

/* ---------------------------------------------------------------- errors */

/* Parses @len bytes and checks -EINVAL with message @msg; prefixes must not crash. */
static void assert_parse_fails(const void *bytes, size_t len, const char *msg)
{
	struct mlfs_npy h, before;
	struct ptc_error err;
	int rc;

	memset(&before, 0x77, sizeof(before));
	h = before;
	rc = parse_exact(bytes, len, &h, &err);
	if (rc != -EINVAL || strcmp(err.text, msg) != 0 || err.code != rc) {
		print_error("rc %d \"%s\" (code %d)\nwant %d \"%s\"\n", rc, err.text, err.code,
			    -EINVAL, msg);
		fail();
	}
	/* Untouched on error. */
	assert_memory_equal(&h, &before, sizeof(h));
	for (size_t n = 0; n < len; n++) {
		rc = parse_exact(bytes, n, &h, &err);
		assert_true(rc == -EAGAIN || (rc == -EINVAL && err.text[0] && err.code == rc));
	}
}

static void assert_dict_fails(const char *dict, const char *msg)
{
	size_t len;
	uint8_t *b = wrap(dict, 1, &len);

	assert_parse_fails(b, len, msg);
	free(b);
}

static void test_parse_errors_prefix(void **state)
{
	uint8_t b[16];

	(void)state;
	/* Not an .npy file: refused from the first byte that differs. */
	assert_parse_fails("P", 1, "bad magic");
	assert_parse_fails("PK\x03\x04", 4, "bad magic");
	assert_parse_fails("\x93NUMPX\x01\x00", 8, "bad magic");
	assert_parse_fails("\x93NUMPY\x04\x00", 8, "unsupported version 4.0");
	assert_parse_fails("\x93NUMPY\x01\x01", 8, "unsupported version 1.1");
	assert_parse_fails("\x93NUMPY\x00\x00", 8, "unsupported version 0.0");
	/* A header too long is refused as soon as its length is known. */
	memcpy(b, "\x93NUMPY\x02\x00", 8);
	b[8] = 70000 & 0xff;
	b[9] = (70000 >> 8) & 0xff;
	b[10] = 70000 >> 16;
	b[11] = 0;
	assert_parse_fails(b, 12, "header length 70000 exceeds 65536");
	b[6] = 3;
	b[8] = 0xff;
	b[9] = 0xff;
	b[10] = 0xff;
	b[11] = 0xff;
	assert_parse_fails(b, 12, "header length 4294967295 exceeds 65536");
	/* 65536 itself is allowed: the header is merely incomplete. */
	b[8] = 0;
	b[9] = 0;
	b[10] = 1;
	b[11] = 0;
	assert_int_equal(mlfs_npy_parse(b, 12, NULL, NULL), -EAGAIN);
	/* An empty dict area. */
	assert_parse_fails("\x93NUMPY\x01\x00\x00\x00", 10,
			   "unexpected end of header, header is not a dict");
}

static void test_parse_errors_dict(void **state)
{
	static const struct {
		const char *dict, *msg;
	} cases[] = {
	    /* Offsets are file offsets: the dict starts at byte 10. */
	    {"[1, 2]", "header is not a dict at byte 10"},
	    {"{}", "missing key 'descr'"},
	    {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
	    {"{'descr': '<f4', 'shape': ()}", "missing key 'fortran_order'"},
	    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", "unexpected key 'x'"},
	    {"{'descr': '<f4', 'descr': '<f4'}", "duplicate key 'descr'"},
	    {"{descr: '<f4'}", "expected a string key at byte 11"},
	    {"{,}", "expected a string key at byte 11"},
	    {"{'descr' '<f4'}", "expected ':' after key at byte 19"},
	    {"{'descr': '<f4' 'shape': ()}", "expected ',' or '}' in header dict at byte 26"},
	    {"{'descr': '<f4',, }", "expected a string key at byte 26"},
	    {"{'descr': 3}", "descr must be a string at byte 20"},
	    {"{'descr': [('a', '<f4')]}",
	     "descr must be a string, not a list (structured dtypes are not supported)"},
	    {"{'descr': '<f4444444444444444'}", "descr at byte 20 is longer than 15 characters"},
	    {"{'descr': '<f4\\n'}", "unsupported character 0x5c in string at byte 24"},
	    {"{'descr': '<f\x01'}", "unsupported character 0x01 in string at byte 23"},
	    {"{'descr': '<f\xe9'}", "unsupported character 0xe9 in string at byte 23"},
	    {"{'descr': '<f4\n'}", "unterminated string at byte 20"},
	    {"{'a_key_much_longer_than_any_real_one_is': 1}",
	     "key at byte 11 is longer than 32 characters"},
	    {"{'fortran_order': 'False'}", "fortran_order must be True or False at byte 28"},
	    {"{'fortran_order': 0}", "fortran_order must be True or False at byte 28"},
	    {"{'fortran_order': Falsey}", "fortran_order must be True or False at byte 28"},
	    {"{'fortran_order': }", "fortran_order must be True or False at byte 28"},
	    {"{'shape': [3, 4]}", "shape must be a tuple, not a list at byte 20"},
	    {"{'shape': 12}", "shape must be a tuple at byte 20"},
	    {"{'shape': (3)}", "shape (3) is not a tuple (a 1-d shape is written (3,))"},
	    {"{'shape': (-1,)}", "shape has a negative dimension at byte 21"},
	    {"{'shape': (3, -4)}", "shape has a negative dimension at byte 24"},
	    {"{'shape': (1, 2, 3, 4, 5, 6, 7, 8, 9)}", "shape has more than 8 dims"},
	    {"{'shape': (1099511627776,)}", "shape dimension at byte 21 is not below 2^40"},
	    {"{'shape': (99999999999999999999999999999,)}",
	     "shape dimension at byte 21 is not below 2^40"},
	    {"{'shape': (1048576, 1048576, 256)}",
	     "shape (1048576, 1048576, 256) has 2^48 or more elements"},
	    {"{'shape': (3.0,)}", "expected ',' or ')' in shape at byte 22"},
	    {"{'shape': (0x10,)}", "expected ',' or ')' in shape at byte 22"},
	    {"{'shape': (,)}", "expected an int in shape at byte 21"},
	    {"{'shape': ('3',)}", "expected an int in shape at byte 21"},
	    {"{'shape': (3, 4)", "unexpected end of header, expected ',' or '}' in header dict"},
	    {"{'shape': (3, 4", "unexpected end of header, expected ',' or ')' in shape"},
	    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }x",
	     "unexpected byte 0x78 after the header dict at byte 65"},
	    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }}",
	     "unexpected byte 0x7d after the header dict at byte 65"},
	};

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(cases); i++)
		assert_dict_fails(cases[i].dict, cases[i].msg);
}

/* A dict that ends before the header's last byte: the string runs into the padding. */
static void test_parse_errors_framing(void **state)
{
	uint8_t b[64];

	(void)state;
	memcpy(b, "\x93NUMPY\x01\x00\x06\x00{'desc", 16);
	assert_parse_fails(b, 16, "unterminated string at byte 11");
	/* A NUL in the middle of the dict. */
	memcpy(b, "\x93NUMPY\x01\x00\x03\x00{\x00}", 13);
	assert_parse_fails(b, 13, "expected a string key at byte 11");
}

/* ----------------------------------------------------------------- check */

static struct mlfs_npy header(const char *descr, int ndim, const int64_t *shape)
{
	struct mlfs_npy h = {.ndim = ndim, .header_len = 128};

	snprintf(h.descr, sizeof(h.descr), "%s", descr);
	for (int i = 0; i < ndim; i++)
		h.shape[i] = shape[i];
	return h;
}

static void assert_check(const char *descr, enum ptc_dtype dt, const char *msg)
{
	const int64_t shape[2] = {3, 4};
	struct mlfs_npy h = header(descr, 2, shape);
	struct ptc_error err = {.text = "junk", .code = 1};
	int rc = mlfs_npy_check(&h, dt, 2, shape, &err);

	if (rc != (msg ? -EINVAL : 0) || strcmp(err.text, msg ? msg : "") != 0 || err.code != rc) {
		print_error("%s vs dtype %d: rc %d \"%s\"\n", descr, (int)dt, rc, err.text);
		fail();
	}
}

static void test_check_dtype(void **state)
{
	(void)state;
	assert_check("<f4", PTC_FLOAT32, NULL);
	assert_check("<f8", PTC_FLOAT32,
		     "dtype '<f8' does not match partition dtype float32 ('<f4')");
	assert_check(">f4", PTC_FLOAT32,
		     "dtype '>f4' does not match partition dtype float32 ('<f4')");
	assert_check("|f4", PTC_FLOAT32,
		     "dtype '|f4' does not match partition dtype float32 ('<f4')");
	assert_check("<u2", PTC_BFLOAT16, NULL);
	assert_check("<f2", PTC_BFLOAT16,
		     "dtype '<f2' does not match partition dtype bfloat16 ('<u2')");
	assert_check("<i2", PTC_BFLOAT16,
		     "dtype '<i2' does not match partition dtype bfloat16 ('<u2')");
	/* 1-byte types: '|' and '<' mean the same. */
	assert_check("|u1", PTC_UINT8, NULL);
	assert_check("<u1", PTC_UINT8, NULL);
	assert_check("|i1", PTC_INT8, NULL);
	assert_check("<i1", PTC_INT8, NULL);
	assert_check("|b1", PTC_BOOL, NULL);
	assert_check("<b1", PTC_BOOL, NULL);
	assert_check("|u1", PTC_FLOAT8_E4M3FN, NULL);
	assert_check("<u1", PTC_FLOAT8_E5M2, NULL);
	assert_check("|i1", PTC_UINT8, "dtype '|i1' does not match partition dtype uint8 ('|u1')");
	assert_check("|b1", PTC_INT8, "dtype '|b1' does not match partition dtype int8 ('|i1')");
	assert_check("<f2", PTC_FLOAT8_E4M3FN,
		     "dtype '<f2' does not match partition dtype float8_e4m3fn ('|u1')");
	assert_check("|u1x", PTC_UINT8,
		     "dtype '|u1x' does not match partition dtype uint8 ('|u1')");
	assert_check("", PTC_FLOAT64, "dtype '' does not match partition dtype float64 ('<f8')");
	assert_check("<f4", PTC_DTYPE_COUNT, "unknown partition dtype 12");
}

static void test_check_shape(void **state)
{
	const int64_t s34[2] = {3, 4}, s43[2] = {4, 3}, s12[1] = {12}, s3[1] = {3};
	struct mlfs_npy h = header("<f4", 2, s43);
	struct ptc_error err;

	(void)state;
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, &err), -EINVAL);
	assert_string_equal(err.text, "shape (4, 3) does not match partition shape (3, 4)");
	assert_int_equal(err.code, -EINVAL);
	h = header("<f4", 1, s12);
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, &err), -EINVAL);
	assert_string_equal(err.text, "shape (12,) does not match partition shape (3, 4)");
	h = header("<f4", 0, NULL);
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 1, s3, &err), -EINVAL);
	assert_string_equal(err.text, "shape () does not match partition shape (3,)");
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 0, NULL, &err), 0);
	/* dtype is checked first, then fortran_order, then shape. */
	h = header("<f8", 2, s43);
	h.fortran_order = true;
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, &err), -EINVAL);
	assert_string_equal(err.text, "dtype '<f8' does not match partition dtype float32 ('<f4')");
	h = header("<f4", 2, s34);
	h.fortran_order = true;
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, &err), -EINVAL);
	assert_string_equal(err.text, "fortran_order must be False");
}

/* A caller's error detail: cleared on success (text and code), the whole
 * message with its errno on failure, truncated but terminated, or absent. */
static void test_error_buffer(void **state)
{
	const int64_t s34[2] = {3, 4}, s43[2] = {4, 3};
	struct mlfs_npy h = header("<f4", 2, s43);
	struct ptc_error err;
	size_t len;
	uint8_t *b = wrap("{'shape': (3)}", 1, &len);

	(void)state;
	assert_int_equal(mlfs_npy_parse(b, len, &h, &err), -EINVAL);
	assert_string_equal(err.text, "shape (3) is not a tuple (a 1-d shape is written (3,))");
	assert_int_equal(err.code, -EINVAL);
	assert_int_equal(mlfs_npy_parse(b, len, &h, NULL), -EINVAL);
	free(b);
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, &err), -EINVAL);
	assert_string_equal(err.text, "shape (4, 3) does not match partition shape (3, 4)");
	assert_int_equal(err.code, -EINVAL);
	assert_int_equal(mlfs_npy_check(&h, PTC_FLOAT32, 2, s34, NULL), -EINVAL);
	strcpy(err.text, "junk");
	err.code = -EIO;
	assert_int_equal(
	    mlfs_npy_parse((const uint8_t *)numpy_headers[0].bytes, numpy_headers[0].len, &h, &err),
	    0);
	assert_string_equal(err.text, "");
	assert_int_equal(err.code, 0);
	/* A message longer than the text is cut, terminated, with its code. */
	assert_int_equal(ptc_error_set(&err, -E2BIG, "%0900d", 7), -E2BIG);
	assert_int_equal(strlen(err.text), PTC_ERROR_MAX - 1);
	assert_int_equal(err.code, -E2BIG);
	assert_int_equal(ptc_error_set(NULL, -EIO, "nowhere"), -EIO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parse_errors_prefix),	 cmocka_unit_test(test_parse_errors_dict),
	    cmocka_unit_test(test_parse_errors_framing), cmocka_unit_test(test_check_dtype),
	    cmocka_unit_test(test_check_shape),		 cmocka_unit_test(test_error_buffer),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
