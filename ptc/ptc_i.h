/*
 * ptc_i.h - internals shared by the ptc/ files.
 */
#ifndef MLFS_PTC_I_H
#define MLFS_PTC_I_H

#include "ptc/ptc.h"

/* Whether @s is a safe relative path: non-empty components of
 * [A-Za-z0-9_.-] (plus "{L}" when @allow_template), none "." or "..". */
bool ptc_path_valid(const char *s, bool allow_template);

/* Reads a JSON integer field in [lo, hi]. Returns 0, 1 when absent and
 * !required, or -EINVAL with @err "<file>: <where>"<key>" ...". */
int ptc_json_int(const json_t *obj, const char *key, bool required, int64_t lo, int64_t hi,
		 int64_t *out, const char *file, const char *where, struct ptc_error *err);

/* Checks that @obj has no keys outside the NULL-terminated @known. */
int ptc_json_known(const json_t *obj, const char *const *known, const char *file,
		   const char *where, struct ptc_error *err);

/* Parses @len bytes of JSON text; syntax errors name line and column. */
json_t *ptc_json_load(const char *text, size_t len, const char *file, struct ptc_error *err);

#endif
