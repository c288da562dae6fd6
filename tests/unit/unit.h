/*
 * unit.h - helpers shared by the ptc unit tests (cmocka).
 *
 * JSON texts in the tests are written with single quotes for readability;
 * unit_json() turns them into double quotes (no test needs a literal ').
 */
#ifndef MLFS_TESTS_UNIT_H
#define MLFS_TESTS_UNIT_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ptc/ptc.h"

/* @text with every ' replaced by ". Caller frees. */
static inline char *unit_json(const char *text)
{
	char *s = strdup(text);

	assert_non_null(s);
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	return s;
}

/*
 * Checks a failed parse at @file:@line: @rc must be -EINVAL, @msg must start
 * with @prefix, equal @exact when non-NULL and contain every string of the
 * NULL-terminated list @ap.
 */
static inline void unit_check_error(const char *file, int line, int rc, const char *msg,
				    const char *prefix, const char *exact, va_list ap)
{
	if (rc != -EINVAL) {
		print_error("%s:%d: rc %d (want %d), message \"%s\"\n", file, line, rc, -EINVAL,
			    msg);
		_fail(file, line);
	}
	if (strncmp(msg, prefix, strlen(prefix)) != 0) {
		print_error("%s:%d: message \"%s\" does not start with \"%s\"\n", file, line, msg,
			    prefix);
		_fail(file, line);
	}
	if (exact && strcmp(msg, exact) != 0) {
		print_error("%s:%d: message \"%s\"\n    want \"%s\"\n", file, line, msg, exact);
		_fail(file, line);
	}
	for (const char *want; (want = va_arg(ap, const char *));) {
		if (!strstr(msg, want)) {
			print_error("%s:%d: message \"%s\" lacks \"%s\"\n", file, line, msg, want);
			_fail(file, line);
		}
	}
}

/*
 * UNIT_PARSER(name, type, file, parse_text, free_fn) defines, for a ptc
 * reader of @file:
 *   int parse_<name>(text, type **out, struct ptc_error *err): parses @text
 *     (single quotes as in unit_json) with @parse_text, named @file;
 *   type *<name>_ok(text): the parse must succeed, with no message; returns
 *     the result (free it with @free_fn);
 *   void <name>_fails_at(file, line, text, exact, ...): the parse must fail
 *     as unit_check_error says, with the message prefixed "<file>: " and
 *     *out NULL (a parse that succeeds is freed with @free_fn and fails).
 */
#define UNIT_PARSER(name, type, file_, parse_text, free_fn)                                        \
	__attribute__((unused)) static int parse_##name(const char *text, type **out,              \
							struct ptc_error *err)                     \
	{                                                                                          \
		char *s = unit_json(text);                                                         \
		int rc = parse_text(s, strlen(s), file_, out, err);                                \
		free(s);                                                                           \
		return rc;                                                                         \
	}                                                                                          \
	__attribute__((unused)) static type *name##_ok(const char *text)                           \
	{                                                                                          \
		type *out = NULL;                                                                  \
		struct ptc_error err = {.text = ""};                                               \
		int rc = parse_##name(text, &out, &err);                                           \
		if (rc)                                                                            \
			print_error(file_ " parse failed: %d %s\n", rc, err.text);                 \
		assert_int_equal(rc, 0);                                                           \
		assert_non_null(out);                                                              \
		assert_string_equal(err.text, "");                                                 \
		return out;                                                                        \
	}                                                                                          \
	__attribute__((unused)) static void name##_fails_at(                                       \
	    const char *file, int line, const char *text, const char *exact, ...)                  \
	{                                                                                          \
		type *out = (type *)1;                                                             \
		struct ptc_error err = {.text = ""};                                               \
		int rc = parse_##name(text, &out, &err);                                           \
		va_list ap;                                                                        \
		if (rc == 0)                                                                       \
			free_fn(out);                                                              \
		else                                                                               \
			_assert_true(out == NULL, "*out == NULL on error", file, line);            \
		va_start(ap, exact);                                                               \
		unit_check_error(file, line, rc, err.text, file_ ": ", exact, ap);                 \
		va_end(ap);                                                                        \
	}

#endif
