/*
 * mlfs_tree.c - name trees of "<state>/<tensor>.npy" paths, and job/ files.
 *
 * A view builds one tree per pipeline stage its local ranks hold (ranks of a
 * stage hold the same tensors) and one for full/. Lookups are binary
 * searches over sorted children; readdir walks them in order. A tree is
 * built from its sorted paths in one pass: O(n log n) for n paths, however
 * many names share a directory.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
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

/* One "<state>/<tensor>.npy" path of a tree being built; @rest is the part
 * below the node it is being placed under. */
struct tpath {
	const char *rest;
	int state, tensor;
};

/* Characters in the order of the tree's children: the end of a component
 * ('\0' or '/') before any other character, so "a" < "a/b" < "a-b" as
 * strcmp orders the components "a" < "a-b". */
static int path_char(unsigned char c)
{
	return c == '\0' ? 0 : c == '/' ? 1 : c + 2;
}

/* Orders paths component by component; equal paths (the schema refuses
 * them) by insertion order, so the last one names the leaf as it did. */
static int cmp_tpath(const void *a, const void *b)
{
	const struct tpath *x = a, *y = b;
	const unsigned char *p = (const unsigned char *)x->rest,
			    *q = (const unsigned char *)y->rest;

	for (; *p && *p == *q; p++, q++)
		;
	if (*p != *q)
		return path_char(*p) - path_char(*q);
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static size_t comp_len(const char *s)
{
	return strcspn(s, "/");
}

/* End of the run of paths from @i on that share p[i]'s first component. */
static size_t run_end(const struct tpath *p, size_t i, size_t n)
{
	size_t len = comp_len(p[i].rest), j = i + 1;

	while (j < n && comp_len(p[j].rest) == len && memcmp(p[j].rest, p[i].rest, len) == 0)
		j++;
	return j;
}

/*
 * Builds the subtree of @t from the sorted paths @p[0..n), all below @t.
 * Paths that end here name @t; the others come in runs, one per child, in
 * the children's order. Each path's bytes are looked at a bounded number of
 * times, so the tree costs the sort plus time linear in the paths' length.
 * Recursion depth is the number of components of the longest path.
 */
static int build(struct mlfs_tnode *t, struct tpath *p, size_t n)
{
	size_t i = 0, runs = 0;

	for (; i < n && !*p[i].rest; i++) {
		t->state = p[i].state;
		t->tensor = p[i].tensor;
	}
	for (size_t j = i; j < n; j = run_end(p, j, n))
		runs++;
	if (runs == 0)
		return 0;
	if (runs > INT_MAX || !(t->child = malloc(runs * sizeof(*t->child))))
		return -ENOMEM;
	t->capchild = (int)runs;
	while (i < n) {
		size_t len = comp_len(p[i].rest), e = run_end(p, i, n);
		struct mlfs_tnode *c = tnode_new(p[i].rest, len);
		int rc;

		if (!c)
			return -ENOMEM;
		t->child[t->nchild++] = c;
		for (size_t k = i; k < e; k++)
			p[k].rest += len + (p[k].rest[len] == '/');
		if ((rc = build(c, p + i, e - i)))
			return rc;
		i = e;
	}
	return 0;
}

/*
 * The tree of the "<state>/<tensor>.npy" paths of every state and of the
 * tensors @holds selects (@arg is passed to it): collected into one buffer,
 * sorted, then built in one pass (n log n; inserting path by path into
 * unsorted children was quadratic in the entries of a directory). NULL when
 * out of memory.
 */
static struct mlfs_tnode *tree_build(const struct ptc_schema *s,
				     bool (*holds)(const void *arg, int tensor), const void *arg)
{
	struct mlfs_tnode *root = tnode_new("", 0);
	struct tpath *paths = NULL;
	size_t n = 0, bytes = 0, slen = 0;
	char *buf = NULL, *o;

	if (!root)
		return NULL;
	for (int ti = 0; ti < s->ntensors; ti++)
		if (holds(arg, ti)) {
			n++;
			slen += strlen(s->tensors[ti].name) + sizeof(".npy");
		}
	for (int si = 0; si < s->nstates; si++)
		bytes += slen + n * (strlen(s->states[si].name) + 1);
	n *= (size_t)s->nstates;
	if (n == 0)
		return root;
	if (!(paths = malloc(n * sizeof(*paths))) || !(buf = malloc(bytes)))
		goto err_free;
	n = 0;
	o = buf;
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++) {
			if (!holds(arg, ti))
				continue;
			paths[n++] = (struct tpath){o, si, ti};
			o += sprintf(o, "%s/%s.npy", s->states[si].name, s->tensors[ti].name) + 1;
		}
	assert(o == buf + bytes);
	qsort(paths, n, sizeof(*paths), cmp_tpath);
	if (build(root, paths, n))
		goto err_free;
	free(buf);
	free(paths);
	return root;

err_free:
	free(buf);
	free(paths);
	mlfs_tree_free(root);
	return NULL;
}

struct stage_arg {
	const struct ptc_layout *l;
	int p;
};

static bool stage_holds(const void *arg, int ti)
{
	const struct stage_arg *a = arg;
	return ptc_layout_stage_holds(a->l, a->p, ti);
}

static bool full_holds(const void *arg, int ti)
{
	const struct ptc_schema *s = arg;
	return s->tensors[ti].tied < 0;
}

struct mlfs_tnode *mlfs_tree_build_stage(const struct ptc_layout *l, int p)
{
	struct stage_arg a = {l, p};
	return tree_build(l->schema, stage_holds, &a);
}

struct mlfs_tnode *mlfs_tree_build_full(const struct ptc_schema *s)
{
	return tree_build(s, full_holds, s);
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
