/*
 * mlfs_npy.h - NumPy .npy headers: format, parse and check.
 *
 * Every tensor file mlfs serves is an .npy file (format 1.0): a header that
 * numpy.load reads, then the raw little-endian C-order data. bfloat16 and
 * fp8 have no NumPy dtype and are stored as "<u2" and "|u1" (DESIGN.md 6).
 *
 * All functions are pure: no I/O, no allocation, no globals. They are
 * reentrant and may be called from any thread at any time. Every pointer
 * argument is borrowed for the duration of the call only.
 */
#ifndef MLFS_MLFS_NPY_H
#define MLFS_MLFS_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ptc/ptc.h"

/* Largest header dict accepted by mlfs_npy_parse, in bytes. */
#define MLFS_NPY_MAX_HEADER 65536

/* Limits on a parsed shape: each dimension and the element count. */
#define MLFS_NPY_MAX_DIM   (INT64_C(1) << 40)
#define MLFS_NPY_MAX_ELEMS (INT64_C(1) << 48)

/* A parsed header. */
struct mlfs_npy {
	char descr[16]; /* NumPy dtype string, e.g. "<f4", NUL-terminated */
	bool fortran_order;
	int ndim;		     /* 0 .. PTC_MAX_DIMS */
	int64_t shape[PTC_MAX_DIMS]; /* ndim entries, each in [0, 2^40) */
	size_t header_len;	     /* bytes before the data */
};

/*
 * Formats an NPY 1.0 header for an array of @dt with @ndim dimensions
 * @shape into @buf: the magic "\x93NUMPY", version 1.0, the little-endian
 * u16 dict length, then the dict exactly as numpy.save writes it, e.g.
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * ("(3,)" for one dimension, "()" for none), followed by numpy's spare
 * spaces for growing the first axis (numpy >= 1.23), padding spaces and a
 * final '\n' so that the total length, which is where the data starts, is
 * a multiple of 64.
 *
 * Returns the header length. Returns 0 and writes nothing when @cap is too
 * small, or when @dt, @ndim (0 .. PTC_MAX_DIMS) or a dimension (negative)
 * is invalid. @buf is not NUL-terminated.
 */
size_t mlfs_npy_format(enum ptc_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap);

/*
 * Parses the .npy header at the start of @buf, the first @len bytes of a
 * file. Accepts format versions 1.0 (u16 dict length), 2.0 and 3.0 (u32).
 * The dict is read as the Python literal it is: keys in any order, single
 * or double quotes, whitespace anywhere between tokens, trailing commas.
 * It must hold exactly the keys 'descr' (a string of at most 15 printable
 * ASCII characters), 'fortran_order' (True or False) and 'shape' (a tuple
 * of at most PTC_MAX_DIMS non-negative ints, each below 2^40, their product
 * below 2^48). Reads no byte at or past @len.
 *
 * Returns 0 and fills *@out (fortran_order True is reported, not refused:
 * mlfs_npy_check refuses it). Returns -EAGAIN when the first @len bytes are
 * a valid prefix but too short to hold the whole header: the caller retries
 * with more bytes (or, at end of file, reports a truncated header).
 * Returns -EINVAL for anything malformed, with one line in @err (of
 * @errlen bytes, always NUL-terminated; @err may be NULL when @errlen is 0),
 * e.g. "bad magic", "unsupported version 4.0", "header length 70000 exceeds
 * 65536", "shape has more than 8 dims". *@out is left untouched on error.
 */
int mlfs_npy_parse(const uint8_t *buf, size_t len, struct mlfs_npy *out, char *err, size_t errlen);

/*
 * Checks parsed header @h against a partition of dtype @dt and shape
 * (@ndim, @shape). The descr must equal ptc_dtype_npy_descr(@dt), except
 * that for 1-byte types the byte-order marks '|' and '<' are interchangeable
 * ("<u1" for "|u1"); fortran_order must be False; the shape must be equal.
 *
 * Returns 0, or -EINVAL with one line in @err (same conventions as
 * mlfs_npy_parse), e.g.
 *   dtype '<f8' does not match partition dtype float32 ('<f4')
 *   shape (4, 3) does not match partition shape (3, 4)
 */
int mlfs_npy_check(const struct mlfs_npy *h, enum ptc_dtype dt, int ndim, const int64_t *shape,
		   char *err, size_t errlen);

#endif
