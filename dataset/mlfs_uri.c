/*
 * mlfs_uri.c - URI joining: a dataset index names its shards and offsets
 * tables relative to its own URI (mlfs_uri_join, declared in
 * dataset.h).
 *
 * Pure string work: no I/O, no state; any thread.
 */
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"

/* Length of @s's "scheme://" prefix, or 0. */
static size_t scheme_len(const char *s)
{
	size_t i = 0;

	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
		return 0;
	while ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
	       (s[i] >= '0' && s[i] <= '9') || s[i] == '+' || s[i] == '-' || s[i] == '.')
		i++;
	return strncmp(s + i, "://", 3) ? 0 : i + 3;
}

char *mlfs_uri_join(const char *base, const char *ref)
{
	size_t sl, dir, n;
	char *out;

	if (!base || !ref || !*ref)
		return NULL;
	if (scheme_len(ref))
		return strdup(ref);
	if (ref[0] == '/' || !(sl = scheme_len(base)))
		return NULL;
	for (const char *p = ref; *p;) {
		size_t c = strcspn(p, "/");
		if (c == 2 && p[0] == '.' && p[1] == '.')
			return NULL;
		p += c;
		if (*p)
			p++;
	}
	/* The directory: up to the last '/' of the path (before any query). */
	n = sl + strcspn(base + sl, "?#");
	dir = n;
	while (dir > sl && base[dir - 1] != '/')
		dir--;
	if (!(out = malloc(n + strlen(ref) + 2)))
		return NULL;
	if (dir > sl && (dir > sl + 1 || base[sl] == '/')) {
		/* "file:///d/x" -> "file:///d/"; "http://h/d/x" -> "http://h/d/" */
		memcpy(out, base, dir);
		out[dir] = 0;
	} else {
		/* "http://host" or "http://host?q": the root. */
		size_t hl = sl + strcspn(base + sl, "/?#");
		memcpy(out, base, hl);
		out[hl] = '/';
		out[hl + 1] = 0;
	}
	strcat(out, ref);
	return out;
}
