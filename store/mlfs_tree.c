/*
 * mlfs_tree.c - name trees of "<state>/<tensor>.npy" paths (and full/'s
 * safetensors files), and job/ files.
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

#include "store/store.h"

static struct mlfs_tnode *tnode_new(const char *name, size_t n)
{
	struct mlfs_tnode *t = calloc(1, sizeof(*t));
	if (!t || !(t->name = strndup(name, n))) {
		free(t);
		return NULL;
	}
	t->state = t->tensor = -1;
	t->st_file = MLFS_TN_NOT_ST;
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
	int state, tensor, st_file;
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
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->st_file < y->st_file ? -1 : x->st_file > y->st_file;
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
		t->st_file = p[i].st_file;
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

/* Room for a state's safetensors names beyond the state's own. */
#define ST_NAME_EXTRA sizeof("-00000-of-00000.safetensors.index.json")

/* Writes the safetensors paths of state @si (@nshards files, and the index
 * when more than one) at @o; returns the end. */
static char *st_paths(const char *state, int si, int nshards, struct tpath *paths, size_t *n,
		      char *o)
{
	for (int k = 0; k < nshards; k++) {
		paths[(*n)++] = (struct tpath){o, si, -1, k};
		o += ptc_st_shard_name(state, k, nshards, o, strlen(state) + ST_NAME_EXTRA) + 1;
	}
	if (nshards > 1) {
		paths[(*n)++] = (struct tpath){o, si, -1, MLFS_TN_ST_INDEX};
		o += sprintf(o, "%s.safetensors.index.json", state) + 1;
	}
	return o;
}

/*
 * The tree of the "<state>/<tensor>.npy" paths of every state and of the
 * tensors @holds selects (@arg is passed to it), and with @nshards (one
 * count per state) the states' safetensors files: collected into one
 * buffer, sorted, then built in one pass (n log n; inserting path by path
 * into unsorted children was quadratic in the entries of a directory).
 * NULL when out of memory.
 */
static struct mlfs_tnode *tree_build(const struct ptc_schema *s,
				     bool (*holds)(const void *arg, int tensor), const void *arg,
				     const int *nshards)
{
	struct mlfs_tnode *root = tnode_new("", 0);
	struct tpath *paths = NULL;
	size_t n = 0, bytes = 0, slen = 0, extra = 0;
	char *buf = NULL, *o;

	if (!root)
		return NULL;
	for (int ti = 0; ti < s->ntensors; ti++)
		if (holds(arg, ti)) {
			n++;
			slen += strlen(s->tensors[ti].name) + sizeof(".npy");
		}
	for (int si = 0; si < s->nstates; si++) {
		bytes += slen + n * (strlen(s->states[si].name) + 1);
		if (nshards) /* its files, and the index */
			extra += (size_t)(nshards[si] + 1) *
				 (strlen(s->states[si].name) + ST_NAME_EXTRA + 1);
	}
	n *= (size_t)s->nstates;
	size_t nst = 0;
	for (int si = 0; nshards && si < s->nstates; si++)
		nst += (size_t)nshards[si] + 1;
	if (n + nst == 0)
		return root;
	if (!(paths = malloc((n + nst) * sizeof(*paths))) || !(buf = malloc(bytes + extra)))
		goto err_free;
	n = 0;
	o = buf;
	for (int si = 0; si < s->nstates; si++)
		for (int ti = 0; ti < s->ntensors; ti++) {
			if (!holds(arg, ti))
				continue;
			paths[n++] = (struct tpath){o, si, ti, MLFS_TN_NOT_ST};
			o += sprintf(o, "%s/%s.npy", s->states[si].name, s->tensors[ti].name) + 1;
		}
	assert(o == buf + bytes);
	for (int si = 0; nshards && si < s->nstates; si++)
		o = st_paths(s->states[si].name, si, nshards[si], paths, &n, o);
	assert(o <= buf + bytes + extra);
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
	return tree_build(l->schema, stage_holds, &a, NULL);
}

struct mlfs_tnode *mlfs_tree_build_full(const struct ptc_schema *s, int64_t shard_max)
{
	int *nshards = malloc((size_t)(s->nstates ? s->nstates : 1) * sizeof(int));
	struct mlfs_tnode *t = NULL;

	for (int si = 0; nshards && si < s->nstates; si++)
		if ((nshards[si] = mlfs_st_shard_count(s, si, shard_max)) < 0)
			goto out;
	if (nshards)
		t = tree_build(s, full_holds, s, nshards);
out:
	free(nshards);
	return t;
}
