/*
 * mlfs_job.c - the job/ directory: an in-memory tree of files and
 * directories shared by every rank of the job, with tmpfs semantics.
 *
 * Every node and every byte of file data is counted in the store's
 * --max-memory (struct xf_mem): past it, creating or growing a file fails
 * with ENOSPC. Callers hold the store lock (the tree has no lock of its own).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"

static _Atomic uint64_t job_ids = 1;

/* What a node costs besides its data: counted like the data. */
static int64_t node_bytes(size_t namelen)
{
	return (int64_t)(sizeof(struct mlfs_job) + namelen + 1);
}

static struct mlfs_job *job_new(struct xf_mem *mem, const char *name, size_t n, bool dir, int *rc)
{
	if ((*rc = xf_mem_reserve(mem, node_bytes(n))))
		return NULL;
	struct mlfs_job *j = calloc(1, sizeof(*j));
	if (!j || !(j->name = strndup(name, n))) {
		free(j);
		xf_mem_release(mem, node_bytes(n));
		*rc = -ENOMEM;
		return NULL;
	}
	j->mem = mem;
	j->dir = dir;
	j->id = job_ids++;
	clock_gettime(CLOCK_REALTIME, &j->mtime);
	return j;
}

struct mlfs_job *mlfs_job_new_dir(const char *name, struct xf_mem *mem)
{
	int rc;
	return job_new(mem, name, strlen(name), true, &rc);
}

void mlfs_job_free(struct mlfs_job *j)
{
	while (j && j->first) {
		struct mlfs_job *c = j->first;
		j->first = c->next;
		mlfs_job_free(c);
	}
	if (j) {
		xf_mem_release(j->mem, (int64_t)j->cap + node_bytes(strlen(j->name)));
		free(j->data);
		free(j->name);
		free(j);
	}
}

struct mlfs_job *mlfs_job_child(const struct mlfs_job *dir, const char *name, size_t n)
{
	for (struct mlfs_job *c = dir->first; c; c = c->next)
		if (strncmp(c->name, name, n) == 0 && c->name[n] == '\0')
			return c;
	return NULL;
}

static void job_detach(struct mlfs_job *c)
{
	struct mlfs_job **pp = &c->parent->first;
	while (*pp != c)
		pp = &(*pp)->next;
	*pp = c->next;
	c->next = NULL;
	clock_gettime(CLOCK_REALTIME, &c->parent->mtime);
	c->parent = NULL;
}

static void job_attach(struct mlfs_job *dir, struct mlfs_job *c)
{
	c->parent = dir;
	c->next = dir->first;
	dir->first = c;
	clock_gettime(CLOCK_REALTIME, &dir->mtime);
}

int mlfs_job_create(struct mlfs_job *dir, const char *name, bool isdir, struct mlfs_job **out)
{
	if (!dir->dir)
		return -ENOTDIR;
	if (mlfs_job_child(dir, name, strlen(name)))
		return -EEXIST;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	int rc;
	struct mlfs_job *c = job_new(dir->mem, name, strlen(name), isdir, &rc);
	if (!c)
		return rc;
	job_attach(dir, c);
	*out = c;
	return 0;
}

int mlfs_job_unlink(struct mlfs_job *dir, const char *name, bool isdir)
{
	struct mlfs_job *c = mlfs_job_child(dir, name, strlen(name));
	if (!c)
		return -ENOENT;
	if (isdir && !c->dir)
		return -ENOTDIR;
	if (!isdir && c->dir)
		return -EISDIR;
	if (c->dir && c->first)
		return -ENOTEMPTY;
	job_detach(c);
	mlfs_job_free(c);
	return 0;
}

int mlfs_job_rename(struct mlfs_job *from, const char *name, struct mlfs_job *to,
		    const char *newname, unsigned flags)
{
	struct mlfs_job *c = mlfs_job_child(from, name, strlen(name));
	struct mlfs_job *old = mlfs_job_child(to, newname, strlen(newname));

	if (!c)
		return -ENOENT;
	if (flags & ~1u) /* only RENAME_NOREPLACE */
		return -EINVAL;
	if (strlen(newname) > 255)
		return -ENAMETOOLONG;
	for (struct mlfs_job *a = to; a; a = a->parent)
		if (a == c)
			return -EINVAL; /* into its own subtree */
	if (old == c)
		return 0;
	if (old) {
		if (flags & 1u)
			return -EEXIST;
		if (old->dir && !c->dir)
			return -EISDIR;
		if (!old->dir && c->dir)
			return -ENOTDIR;
		if (old->dir && old->first)
			return -ENOTEMPTY;
	}
	int64_t more = (int64_t)strlen(newname) - (int64_t)strlen(c->name);
	if (more > 0 && xf_mem_reserve(c->mem, more))
		return -ENOSPC;
	char *nn = strdup(newname);
	if (!nn) {
		if (more > 0)
			xf_mem_release(c->mem, more);
		return -ENOMEM;
	}
	if (more < 0)
		xf_mem_release(c->mem, -more);
	if (old) {
		job_detach(old);
		mlfs_job_free(old);
	}
	job_detach(c);
	free(c->name);
	c->name = nn;
	job_attach(to, c);
	return 0;
}

int mlfs_job_truncate(struct mlfs_job *f, size_t size)
{
	if (f->dir)
		return -EISDIR;
	if (size > f->cap) { /* grows geometrically: appends cost linear time */
		size_t cap = f->cap < 4096 ? 4096 : f->cap;
		while (cap < size)
			cap = cap > SIZE_MAX / 2 ? size : cap * 2;
		if (xf_mem_reserve(f->mem, (int64_t)(cap - f->cap)))
			return -ENOSPC;
		uint8_t *d = realloc(f->data, cap);
		if (!d) {
			xf_mem_release(f->mem, (int64_t)(cap - f->cap));
			return -ENOMEM;
		}
		f->data = d;
		f->cap = cap;
	} else if (size == 0 && f->cap) { /* emptied: give the memory back */
		xf_mem_release(f->mem, (int64_t)f->cap);
		free(f->data);
		f->data = NULL;
		f->cap = 0;
	}
	if (size > f->size)
		memset(f->data + f->size, 0, size - f->size);
	f->size = size;
	f->id = job_ids++;
	clock_gettime(CLOCK_REALTIME, &f->mtime);
	return 0;
}

int mlfs_job_set(struct mlfs_job *f, const uint8_t *data, size_t size)
{
	int rc = mlfs_job_truncate(f, 0);
	if (rc == 0 && (rc = mlfs_job_truncate(f, size)) == 0 && size)
		memcpy(f->data, data, size);
	return rc;
}

uint64_t mlfs_job_hash(const struct mlfs_job *f)
{
	return f->dir ? 0 : mlfs_hash(f->data, f->size);
}

static void manifest_walk(const struct mlfs_job *dir, const char *prefix, json_t *out)
{
	for (const struct mlfs_job *j = dir->first; j; j = j->next) {
		char path[4096], h[20];
		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "/" : "", j->name);
		snprintf(h, sizeof(h), "%016" PRIx64, mlfs_job_hash(j));
		json_array_append_new(out, json_pack("{sssbsIsssI}", "p", path, "d", j->dir, "n",
						     (json_int_t)j->size, "h", h, "m",
						     (json_int_t)(j->mtime.tv_sec * 1000000000LL +
								  j->mtime.tv_nsec)));
		if (j->dir)
			manifest_walk(j, path, out);
	}
}

json_t *mlfs_job_manifest(const struct mlfs_job *root)
{
	json_t *m = json_array();
	if (m)
		manifest_walk(root, "", m);
	return m;
}
