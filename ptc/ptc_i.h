/*
 * ptc_i.h - internals shared by the ptc/ files.
 */
#ifndef MLFS_PTC_I_H
#define MLFS_PTC_I_H

#include <errno.h>

#include "ptc/ptc.h"

/* Whether @s is a safe relative path: non-empty components of
 * [A-Za-z0-9_.-] (plus "{L}" when @allow_template), none "." or "..". */
bool ptc_path_valid(const char *s, bool allow_template);

/* Reads a JSON integer field in [lo, hi]. Returns 0, 1 when absent and
 * !required, or -EINVAL with @err "<file>: <where>"<key>" ...". */
int ptc_json_int(const json_t *obj, const char *key, bool required, int64_t lo, int64_t hi,
		 int64_t *out, const char *file, const char *where, struct ptc_error *err);

/* Checks that @obj has no keys outside the NULL-terminated @known. */
int ptc_json_known(const json_t *obj, const char *const *known, const char *file, const char *where,
		   struct ptc_error *err);

/* Parses @len bytes of JSON text; syntax errors name line and column. */
json_t *ptc_json_load(const char *text, size_t len, const char *file, struct ptc_error *err);

/*
 * Defines the public @fn (a *_parse_text function of ptc.h): loads the JSON
 * text with ptc_json_load() and hands the root to @parse, which has the
 * signature of ptc_schema_parse(). A syntax error sets *out to NULL and
 * returns -EINVAL. A macro, not a helper taking @parse as a pointer: the
 * parsers differ in their out type, and calling one through a cast function
 * pointer is undefined behaviour.
 */
#define PTC_DEFINE_PARSE_TEXT(fn, parse, type)                                                     \
	int fn(const char *text, size_t len, const char *file, type **out, struct ptc_error *err)  \
	{                                                                                          \
		json_t *root = ptc_json_load(text, len, file, err);                                \
		int rc;                                                                            \
                                                                                                   \
		if (!root) {                                                                       \
			*out = NULL;                                                               \
			return -EINVAL;                                                            \
		}                                                                                  \
		rc = parse(root, file, out, err);                                                  \
		json_decref(root);                                                                 \
		return rc;                                                                         \
	}

#endif
