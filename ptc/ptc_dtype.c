/*
 * ptc_dtype.c - element types and error formatting.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ptc/ptc.h"

static const struct {
	const char *name;
	const char *descr;
	size_t size;
} dtypes[PTC_DTYPE_COUNT] = {
    [PTC_FLOAT64] = {"float64", "<f8", 8},
    [PTC_FLOAT32] = {"float32", "<f4", 4},
    [PTC_FLOAT16] = {"float16", "<f2", 2},
    [PTC_BFLOAT16] = {"bfloat16", "<u2", 2},
    [PTC_INT64] = {"int64", "<i8", 8},
    [PTC_INT32] = {"int32", "<i4", 4},
    [PTC_INT16] = {"int16", "<i2", 2},
    [PTC_INT8] = {"int8", "|i1", 1},
    [PTC_UINT8] = {"uint8", "|u1", 1},
    [PTC_BOOL] = {"bool", "|b1", 1},
    [PTC_FLOAT8_E4M3FN] = {"float8_e4m3fn", "|u1", 1},
    [PTC_FLOAT8_E5M2] = {"float8_e5m2", "|u1", 1},
};

size_t ptc_dtype_size(enum ptc_dtype dt)
{
	return dtypes[dt].size;
}

const char *ptc_dtype_name(enum ptc_dtype dt)
{
	return dtypes[dt].name;
}

const char *ptc_dtype_npy_descr(enum ptc_dtype dt)
{
	return dtypes[dt].descr;
}

int ptc_dtype_parse(const char *name, enum ptc_dtype *out)
{
	for (int i = 0; i < PTC_DTYPE_COUNT; i++) {
		if (strcmp(name, dtypes[i].name) == 0) {
			*out = (enum ptc_dtype)i;
			return 0;
		}
	}
	return -EINVAL;
}

/* Formats into @err (when not NULL) and sets its code; returns @code. */
static int error_vset(struct ptc_error *err, int code, const char *fmt, va_list ap)
{
	if (err) {
		vsnprintf(err->text, sizeof(err->text), fmt, ap);
		err->code = code;
	}
	return code;
}

int ptc_error_set(struct ptc_error *err, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_vset(err, code, fmt, ap);
	va_end(ap);
	return code;
}

int ptc_errorf(struct ptc_error *err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_vset(err, -EINVAL, fmt, ap);
	va_end(ap);
	return -EINVAL;
}
