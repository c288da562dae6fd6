/*
 * mlfs_tree.c - name trees of "<state>/<tensor>.npy" paths, and job/ files.
 *
 * A view builds one tree per pipeline stage its local ranks hold (ranks of a
 * stage hold the same tensors) and one for full/. Lookups are binary
 * searches over sorted children; readdir walks them in order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mlfs/mlfs_i.h"

static struct mlfs_tnode *tnode_new(const char *name, size_t n)
{
	struct mlfs_tnode *t = calloc(1, sizeof(*t));
	if (!t || !(t->name = strndup(name, n))) {
		free(t);
		return NULL;
	}
	t->state = t->tensor = -1;
	return t;
}

void mlfs_tree_free(struct mlfs_tnode *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->nchild; i++)
		mlfs_tree_free(t->child[i]);
	free(t->child);
	free(t->name);
	free(t);
}

static int cmp_tnode(const void *a, const void *b)
{
	const struct mlfs_tnode *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

struct mlfs_tnode *mlfs_tree_child(const struct mlfs_tnode *t, const char *name, size_t n)
{
	int a = 0, b = t->nchild;
	while (a < b) {
		int m = (a + b) / 2;
		int c = strncmp(t->child[m]->name, name, n);
		if (c == 0 && t->child[m]->name[n] != '\0')
			c = 1;
		if (c == 0)
			return t->child[m];
		if (c < 0)
			a = m + 1;
		else
			b = m;
	}
	return NULL;
}

/* Linear lookup while building (children unsorted). */
static struct mlfs_tnode *child_get(struct mlfs_tnode *t, const char *name, size_t n)
{
	for (int i = t->nchild - 1; i >= 0; i--)
		if (strncmp(t->child[i]->name, name, n) == 0 && t->child[i]->name[n] == '\0')
			return t->child[i];
	if (t->nchild == t->capchild) {
		int cap = t->capchild ? t->capchild * 2 : 4;
		struct mlfs_tnode **c = realloc(t->child, (size_t)cap * sizeof(*c));
		if (!c)
			return NULL;
		t->child = c;
		t->capchild = cap;
	}
	struct mlfs_tnode *c = tnode_new(name, n);
	if (c)
		t->child[t->nchild++] = c;
	return c;
}

/* Inserts "<state>/<tensor>.npy". */
static int insert(struct mlfs_tnode *root, const char *state, const char *tensor, int si, int ti)
{
	char path[1024];
	size_t len = (size_t)snprintf(path, sizeof(path), "%s/%s.npy", state, tensor);
	struct mlfs_tnode *t = root;

	if (len >= sizeof(path))
		return -ENAMETOOLONG;
	for (char *p = path; *p;) {
		char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (!(t = child_get(t, p, n)))
			return -ENOMEM;
		p += n + (slash ? 1 : 0);
	}
	t->state = si;
	t->tensor = ti;
	return 0;
}

static void tree_sort(struct mlfs_tnode *t)
{
	if (t->nchild > 1) /* child is NULL when there are none */
		qsort(t->child, (size_t)t->nchild, sizeof(*t->child), cmp_tnode);
	for (int i = 0; i < t->nchild; i++)
		tree_sort(t->child[i]);
}

struct mlfs_tnode *mlfs_tree_build_stage(const struct ptc_layout *l, int p)
{
	const struct ptc_schema *s = l->schema;
	struct mlfs_tnode *root = tnode_new("", 0);

	if (!root)
		return NULL;
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++)
			if (ptc_layout_stage_holds(l, p, ti) &&
			    insert(root, s->states[si].name, s->tensors[ti].name, si, ti)) {
				mlfs_tree_free(root);
				return NULL;
			}
	tree_sort(root);
	return root;
}

struct mlfs_tnode *mlfs_tree_build_full(const struct ptc_schema *s)
{
	struct mlfs_tnode *root = tnode_new("", 0);

	if (!root)
		return NULL;
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++)
			if (s->tensors[ti].tied < 0 &&
			    insert(root, s->states[si].name, s->tensors[ti].name, si, ti)) {
				mlfs_tree_free(root);
				return NULL;
			}
	tree_sort(root);
	return root;
}

/* ------------------------------------------------------------------ job/ */

static _Atomic uint64_t job_ids = 1;

static struct mlfs_job *job_new(const char *name, size_t n, bool dir)
{
	struct mlfs_job *j = calloc(1, sizeof(*j));
	if (!j || !(j->name = strndup(name, n))) {
		free(j);
		return NULL;
	}
	j->dir = dir;
	j->id = job_ids++;
	clock_gettime(CLOCK_REALTIME, &j->mtime);
	return j;
}

struct mlfs_job *mlfs_job_new_dir(const char *name)
{
	return job_new(name, strlen(name), true);
}

void mlfs_job_free(struct mlfs_job *j)
{
	while (j && j->first) {
		struct mlfs_job *c = j->first;
		j->first = c->next;
		mlfs_job_free(c);
	}
	if (j) {
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
	struct mlfs_job *c = job_new(name, strlen(name), isdir);
	if (!c)
		return -ENOMEM;
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
	char *nn = strdup(newname);
	if (!nn)
		return -ENOMEM;
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
	if (size > f->cap) {
		uint8_t *d = realloc(f->data, size);
		if (!d)
			return -ENOMEM;
		f->data = d;
		f->cap = size;
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
