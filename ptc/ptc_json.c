/*
 * ptc_json.c - small checked readers over jansson used by the parsers.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ptc/ptc_i.h"

bool ptc_path_valid(const char *s, bool allow_template)
{
	size_t comp = 0;

	if (!s || !*s)
		return false;
	for (const char *p = s;; p++) {
		if (*p == '/' || *p == '\0') {
			if (comp == 0)
				return false;
			if ((comp == 1 && p[-1] == '.') ||
			    (comp == 2 && p[-1] == '.' && p[-2] == '.'))
				return false;
			if (*p == '\0')
				return true;
			comp = 0;
			continue;
		}
		if (allow_template && strncmp(p, "{L}", 3) == 0) {
			p += 2;
			comp += 3;
			continue;
		}
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '.'))
			return false;
		comp++;
	}
}

/* Field name as messages print it: "tp" at top level, tensors[3].split.dim inside. */
static const char *field(char *buf, size_t n, const char *where, const char *key)
{
	if (*where)
		snprintf(buf, n, "%s.%s", where, key);
	else
		snprintf(buf, n, "\"%s\"", key);
	return buf;
}

int ptc_json_int(const json_t *obj, const char *key, bool required, int64_t lo, int64_t hi,
		 int64_t *out, const char *file, const char *where, struct ptc_error *err)
{
	json_t *v = json_object_get(obj, key);
	char f[128];

	if (!v) {
		if (required)
			return ptc_errorf(err, "%s: %s is missing", file,
					  field(f, sizeof(f), where, key));
		return 1;
	}
	if (!json_is_integer(v))
		return ptc_errorf(err, "%s: %s must be an integer", file,
				  field(f, sizeof(f), where, key));
	int64_t x = json_integer_value(v);
	if (x < lo || x > hi)
		return ptc_errorf(err,
				  "%s: %s = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
				  file, field(f, sizeof(f), where, key), x, lo, hi);
	*out = x;
	return 0;
}

int ptc_json_known(const json_t *obj, const char *const *known, const char *file, const char *where,
		   struct ptc_error *err)
{
	const char *key;
	json_t *v;

	json_object_foreach((json_t *)obj, key, v)
	{
		const char *const *k = known;
		while (*k && strcmp(*k, key) != 0)
			k++;
		if (!*k)
			return ptc_errorf(err, "%s: %s%sunknown field \"%s\"", file, where,
					  *where ? " has " : "", key);
	}
	return 0;
}

json_t *ptc_json_load(const char *text, size_t len, const char *file, struct ptc_error *err)
{
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);

	if (!root)
		ptc_errorf(err, "%s: invalid JSON at line %d column %d: %s", file, je.line,
			   je.column, je.text);
	return root;
}
