/*
 * mlfs_npy.c - NumPy .npy headers: format, parse and check.
 *
 * DESIGN
 * An .npy file starts with "\x93NUMPY", a version byte pair, the length of
 * the header dict (u16 little-endian in 1.0, u32 in 2.0 and 3.0), then the
 * dict as a Python literal, padded with spaces and '\n'; the data follows.
 *
 * Formatting reproduces numpy.save byte for byte (numpy 1.23 and later, which
 * add spare spaces for growing the first axis), so a file written by a
 * training script with numpy.save and the file mlfs serves have the same
 * header length and the data at the same offset.
 *
 * Parsing reads headers written by any writer, from bytes that may still be
 * arriving: it returns -EAGAIN while the bytes so far are a valid prefix of
 * a header, and -EINVAL as soon as they are not. It reads the dict with a
 * small recursive-descent scanner for exactly the Python subset a header
 * uses (strings, True/False, tuples of ints); every index is checked
 * against the end of the header before use and every size is bounded
 * before it is used (dict length <= MLFS_NPY_MAX_HEADER, at most
 * PTC_MAX_DIMS dimensions, each below 2^40, product below 2^48).
 *
 * No state, no allocation: everything here is reentrant.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

#define NPY_MAGIC     "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN     64
/* numpy.lib.format.GROWTH_AXIS_MAX_DIGITS: spare spaces after the dict. */
#define NPY_GROWTH_DIGITS 21
/* Longest key we name in a message; longer keys are unknown anyway. */
#define NPY_KEY_MAX 32

/* Writes @shape as Python writes a tuple: "()", "(3,)", "(3, 4)". */
static void format_shape(char *dst, size_t cap, int ndim, const int64_t *shape)
{
	size_t n = 0;

	n += (size_t)snprintf(dst, cap, "(");
	for (int i = 0; i < ndim && n < cap; i++)
		n += (size_t)snprintf(dst + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
	if (n < cap)
		snprintf(dst + n, cap - n, "%s)", ndim == 1 ? "," : "");
}

/* ----------------------------------------------------------------- format */

size_t mlfs_npy_format(enum ptc_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap)
{
	/* 8 dims of at most 19 digits: the tuple is < 200 bytes, the dict < 300. */
	char tuple[256], dict[512], first[24];
	size_t dictlen, hlen, pad, total;
	int n;

	if ((unsigned)dt >= PTC_DTYPE_COUNT || ndim < 0 || ndim > PTC_MAX_DIMS)
		return 0;
	for (int i = 0; i < ndim; i++)
		if (shape[i] < 0)
			return 0;
	format_shape(tuple, sizeof(tuple), ndim, shape);
	n = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
		     ptc_dtype_npy_descr(dt), tuple);
	if (n < 0 || (size_t)n >= sizeof(dict))
		return 0;
	dictlen = (size_t)n;
	if (ndim > 0) {
		/* numpy leaves room to grow shape[0] to GROWTH_AXIS_MAX_DIGITS digits. */
		size_t digits = (size_t)snprintf(first, sizeof(first), "%" PRId64, shape[0]);
		if (digits < NPY_GROWTH_DIGITS)
			dictlen += NPY_GROWTH_DIGITS - digits;
	}
	/* As numpy's _wrap_header: pad is 1..64, never 0, then the '\n'. */
	hlen = dictlen + 1;
	pad = NPY_ALIGN - (NPY_MAGIC_LEN + 2 + 2 + hlen) % NPY_ALIGN;
	total = NPY_MAGIC_LEN + 2 + 2 + hlen + pad;
	if (total > cap || hlen + pad > UINT16_MAX)
		return 0;

	memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
	buf[6] = 1;
	buf[7] = 0;
	buf[8] = (char)((hlen + pad) & 0xff);
	buf[9] = (char)((hlen + pad) >> 8);
	memcpy(buf + 10, dict, (size_t)n);
	memset(buf + 10 + n, ' ', total - 1 - 10 - (size_t)n);
	buf[total - 1] = '\n';
	return total;
}

/* ------------------------------------------------------------------ parse */

/* A cursor over the dict bytes [pos, end) of the header; offsets are file offsets. */
struct cursor {
	const uint8_t *b;
	size_t pos, end;
	struct ptc_error *err;
};

/* The next byte, or -1 at the end of the header. */
static int peek(const struct cursor *c)
{
	return c->pos < c->end ? c->b[c->pos] : -1;
}

static void skip_ws(struct cursor *c)
{
	for (int ch; (ch = peek(c)) > 0 && strchr(" \t\n\r\f\v", ch); c->pos++)
		;
}

/* Fails with "<what> at byte N", or "unexpected end of header" past the end. */
static int syntax(struct cursor *c, const char *what)
{
	if (c->pos >= c->end)
		return ptc_errorf(c->err, "unexpected end of header, %s", what);
	return ptc_errorf(c->err, "%s at byte %zu", what, c->pos);
}

static int expect(struct cursor *c, int ch, const char *what)
{
	if (peek(c) != ch)
		return syntax(c, what);
	c->pos++;
	return 0;
}

/*
 * Reads a quoted string of printable ASCII (no escapes: no header needs
 * them) into @dst of @cap bytes. @what names it in messages ("key").
 */
static int read_string(struct cursor *c, char *dst, size_t cap, const char *what)
{
	size_t n = 0, start = c->pos;
	int q = peek(c);

	assert(q == '\'' || q == '"');
	c->pos++;
	for (int ch; (ch = peek(c)) != q; c->pos++) {
		/* Python strings end at the line; the padding ends with '\n'. */
		if (ch < 0 || ch == '\n')
			return ptc_errorf(c->err, "unterminated string at byte %zu", start);
		if (ch < 0x20 || ch > 0x7e || ch == '\\')
			return ptc_errorf(c->err,
					  "unsupported character 0x%02x in string at byte %zu", ch,
					  c->pos);
		if (n + 1 >= cap)
			return ptc_errorf(c->err, "%s at byte %zu is longer than %zu characters",
					  what, start, cap - 1);
		dst[n++] = (char)ch;
	}
	c->pos++;
	dst[n] = '\0';
	return 0;
}

static int read_descr(struct cursor *c, struct mlfs_npy *h)
{
	if (peek(c) == '[')
		return ptc_errorf(c->err,
				  "descr must be a string, not a list (structured dtypes are not "
				  "supported)");
	if (peek(c) != '\'' && peek(c) != '"')
		return syntax(c, "descr must be a string");
	return read_string(c, h->descr, sizeof(h->descr), "descr");
}

static int read_fortran_order(struct cursor *c, struct mlfs_npy *h)
{
	size_t start = c->pos, n;
	int ch;

	while ((ch = peek(c)) >= 0 && (ch == '_' || (ch >= 'a' && ch <= 'z') ||
				       (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
		c->pos++;
	n = c->pos - start;
	if (n == 4 && memcmp(c->b + start, "True", 4) == 0)
		h->fortran_order = true;
	else if (n == 5 && memcmp(c->b + start, "False", 5) == 0)
		h->fortran_order = false;
	else
		return ptc_errorf(c->err, "fortran_order must be True or False at byte %zu", start);
	return 0;
}

/* Reads one dimension: decimal digits (an old Python 2 'L' suffix allowed). */
static int read_dim(struct cursor *c, int64_t *out)
{
	size_t start = c->pos;
	int64_t v = 0;
	int ch;

	if (peek(c) == '-')
		return ptc_errorf(c->err, "shape has a negative dimension at byte %zu", start);
	if ((ch = peek(c)) < '0' || ch > '9')
		return syntax(c, "expected an int in shape");
	while ((ch = peek(c)) >= '0' && ch <= '9') {
		v = v * 10 + (ch - '0');
		if (v >= PTC_MAX_DIM_SIZE)
			return ptc_errorf(c->err, "shape dimension at byte %zu is not below 2^40",
					  start);
		c->pos++;
	}
	if (ch == 'L' || ch == 'l')
		c->pos++;
	*out = v;
	return 0;
}

static int read_shape(struct cursor *c, struct mlfs_npy *h)
{
	bool comma = false;
	int64_t elems = 1;
	int rc, n = 0;

	if (peek(c) == '[')
		return syntax(c, "shape must be a tuple, not a list");
	if ((rc = expect(c, '(', "shape must be a tuple")))
		return rc;
	skip_ws(c);
	if (peek(c) == ')') {
		c->pos++;
		goto done;
	}
	for (;;) {
		int64_t d = 0;
		if (n == PTC_MAX_DIMS)
			return ptc_errorf(c->err, "shape has more than %d dims", PTC_MAX_DIMS);
		if ((rc = read_dim(c, &d)))
			return rc;
		h->shape[n++] = d;
		skip_ws(c);
		if (peek(c) == ',') {
			c->pos++;
			comma = true;
			skip_ws(c);
			if (peek(c) == ')') {
				c->pos++;
				break;
			}
			continue;
		}
		comma = false;
		if ((rc = expect(c, ')', "expected ',' or ')' in shape")))
			return rc;
		break;
	}
	/* "(3)" is the int 3 in Python, not a tuple: numpy.load refuses it. */
	if (n == 1 && !comma)
		return ptc_errorf(c->err,
				  "shape (%" PRId64
				  ") is not a tuple (a 1-d shape is written (%" PRId64 ",))",
				  h->shape[0], h->shape[0]);
done:
	h->ndim = n;
	for (int i = 0; i < n; i++)
		if (h->shape[i] == 0)
			return 0;
	for (int i = 0; i < n; i++) {
		if (elems > (MLFS_NPY_MAX_ELEMS - 1) / h->shape[i]) {
			char tuple[256];
			format_shape(tuple, sizeof(tuple), n, h->shape);
			return ptc_errorf(c->err, "shape %s has 2^48 or more elements", tuple);
		}
		elems *= h->shape[i];
	}
	return 0;
}

enum { KEY_DESCR, KEY_FORTRAN, KEY_SHAPE, NKEYS };
static const char *const key_names[NKEYS] = {"descr", "fortran_order", "shape"};

static int read_dict(struct cursor *c, struct mlfs_npy *h)
{
	bool seen[NKEYS] = {false};
	int rc;

	skip_ws(c);
	if (peek(c) != '{')
		return syntax(c, "header is not a dict");
	c->pos++;
	skip_ws(c);
	if (peek(c) == '}') {
		c->pos++;
		goto end;
	}
	for (;;) {
		char key[NPY_KEY_MAX + 1];
		int k;

		if (peek(c) != '\'' && peek(c) != '"')
			return syntax(c, "expected a string key");
		if ((rc = read_string(c, key, sizeof(key), "key")))
			return rc;
		for (k = 0; k < NKEYS && strcmp(key, key_names[k]); k++)
			;
		if (k == NKEYS)
			return ptc_errorf(c->err, "unexpected key '%s'", key);
		if (seen[k])
			return ptc_errorf(c->err, "duplicate key '%s'", key);
		seen[k] = true;
		skip_ws(c);
		if ((rc = expect(c, ':', "expected ':' after key")))
			return rc;
		skip_ws(c);
		rc = k == KEY_DESCR	? read_descr(c, h)
		     : k == KEY_FORTRAN ? read_fortran_order(c, h)
					: read_shape(c, h);
		if (rc)
			return rc;
		skip_ws(c);
		if (peek(c) == ',') {
			c->pos++;
			skip_ws(c);
			if (peek(c) != '}')
				continue;
		}
		if ((rc = expect(c, '}', "expected ',' or '}' in header dict")))
			return rc;
		break;
	}
end:
	skip_ws(c);
	if (c->pos < c->end)
		return ptc_errorf(c->err,
				  "unexpected byte 0x%02x after the header dict at byte %zu",
				  c->b[c->pos], c->pos);
	for (int k = 0; k < NKEYS; k++)
		if (!seen[k])
			return ptc_errorf(c->err, "missing key '%s'", key_names[k]);
	return 0;
}

int64_t mlfs_npy_header_len(const uint8_t *buf, size_t len, struct ptc_error *err)
{
	size_t lensize, hlen;

	if (err) {
		err->text[0] = '\0';
		err->code = 0;
	}
	if (len && memcmp(buf, NPY_MAGIC, len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN))
		return ptc_errorf(err, "bad magic");
	if (len < NPY_MAGIC_LEN + 2)
		return 0;
	if (buf[6] < 1 || buf[6] > 3 || buf[7] != 0)
		return ptc_errorf(err, "unsupported version %u.%u", buf[6], buf[7]);
	lensize = buf[6] == 1 ? 2 : 4;
	if (len < NPY_MAGIC_LEN + 2 + lensize)
		return 0;
	hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
	if (lensize == 4)
		hlen |= (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
	if (hlen > MLFS_NPY_MAX_HEADER)
		return ptc_errorf(err, "header length %zu exceeds %d", hlen, MLFS_NPY_MAX_HEADER);
	return (int64_t)(NPY_MAGIC_LEN + 2 + lensize + hlen);
}

int mlfs_npy_parse(const uint8_t *buf, size_t len, struct mlfs_npy *out, struct ptc_error *err)
{
	struct mlfs_npy h;
	int64_t total = mlfs_npy_header_len(buf, len, err);
	int rc;

	if (total < 0)
		return (int)total;
	if (total == 0 || len < (size_t)total)
		return -EAGAIN;
	size_t start = buf[6] == 1 ? NPY_MAGIC_LEN + 4 : NPY_MAGIC_LEN + 6;

	memset(&h, 0, sizeof(h));
	struct cursor c = {.b = buf, .pos = start, .end = (size_t)total};
	c.err = err;
	if ((rc = read_dict(&c, &h)))
		return rc;
	h.header_len = (size_t)total;
	*out = h;
	return 0;
}

/* ------------------------------------------------------------------ check */

/* Whether descr @got names dtype descr @want; for 1-byte types '|' and '<' are the same. */
static bool descr_matches(const char *got, const char *want, size_t size)
{
	if (strcmp(got, want) == 0)
		return true;
	return size == 1 && strlen(got) == 3 && strlen(want) == 3 && strchr("|<", got[0]) &&
	       strchr("|<", want[0]) && strcmp(got + 1, want + 1) == 0;
}

int mlfs_npy_check(const struct mlfs_npy *h, enum ptc_dtype dt, int ndim, const int64_t *shape,
		   struct ptc_error *err)
{
	char got[256], want[256];
	bool same;

	if (err) {
		err->text[0] = '\0';
		err->code = 0;
	}
	if ((unsigned)dt >= PTC_DTYPE_COUNT)
		return ptc_errorf(err, "unknown partition dtype %d", (int)dt);
	if (h->ndim < 0 || h->ndim > PTC_MAX_DIMS || ndim < 0 || ndim > PTC_MAX_DIMS)
		return ptc_errorf(err, "shape has more than %d dims", PTC_MAX_DIMS);
	if (!descr_matches(h->descr, ptc_dtype_npy_descr(dt), ptc_dtype_size(dt)))
		return ptc_errorf(err, "dtype '%s' does not match partition dtype %s ('%s')",
				  h->descr, ptc_dtype_name(dt), ptc_dtype_npy_descr(dt));
	if (h->fortran_order)
		return ptc_errorf(err, "fortran_order must be False");
	same = h->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = h->shape[i] == shape[i];
	if (same)
		return 0;
	format_shape(got, sizeof(got), h->ndim, h->shape);
	format_shape(want, sizeof(want), ndim, shape);
	return ptc_errorf(err, "shape %s does not match partition shape %s", got, want);
}
