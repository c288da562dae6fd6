/*
 * mlfs_job.c - the job/ directory: an in-memory tree of files and
 * directories shared by every rank of the job, with tmpfs semantics.
 *
 * DESIGN
 * A file's content is a reference-counted buffer (struct mlfs_jbuf,
 * store.h) holding its bytes and their hash, computed when the content is
 * set: an append continues the buffer's streaming XXH3 state (its cost is
 * the bytes appended), any other change hashes the new content whole. So
 * nothing hashes when reading: the manifest is O(files) and copies no
 * bytes. A buffer someone else pinned (the peer server sending it, a FUSE
 * read, a staged tree sharing it) never changes: a change to its file
 * makes a new buffer, copying the bytes kept; a buffer the file alone
 * holds is changed in place, so that a file written sequentially grows in
 * amortised linear time.
 *
 * A directory's children are a list (readdir's and the manifest's order)
 * and, from MLFS_JOB_INDEXED of them on, an open-addressing index by name
 * too: a job that writes a file per step gathers thousands in one
 * directory, and every lookup, create and unlink, and a reconfiguration's
 * staging of the whole tree (a lookup per file), would otherwise walk the
 * list (the staging of thousands of files took minutes under ASan, a
 * lookup at a time under the store lock, while another node's read of
 * this node's manifest waited). The index's slots are counted like the
 * nodes; refused, the list is searched.
 *
 * Every node and every byte of buffer capacity is counted in the store's
 * --max-memory (struct xf_mem): past it, creating or growing a file fails
 * with ENOSPC. A buffer shared by two trees (the live one and one staged
 * for a commit) is counted once, until its last put; a pinned buffer its
 * file replaced stays counted until its pin is put.
 *
 * Threads: callers hold the store lock for st->job (the tree has no lock of
 * its own; a staged tree is its builder's alone). References are taken
 * only under that lock and put from any thread (atomic counts): a count of
 * 1 seen under the lock cannot grow before it is released, which is what
 * makes a change in place safe.
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

static void index_free(struct mlfs_job *dir);

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
		index_free(j);
		xf_mem_release(j->mem, node_bytes(strlen(j->name)));
		mlfs_jbuf_put(j->buf);
		free(j->name);
		free(j);
	}
}

/* ------------------------------------------------------ children's index */

/* A removed child's slot: probes go on past it, an insert may take it. */
static struct mlfs_job index_tomb;

static bool named(const struct mlfs_job *c, const char *name, size_t n)
{
	return strncmp(c->name, name, n) == 0 && c->name[n] == '\0';
}

static void index_free(struct mlfs_job *dir)
{
	if (dir->index)
		xf_mem_release(dir->mem, (int64_t)(dir->index_cap * sizeof(*dir->index)));
	free(dir->index);
	dir->index = NULL;
	dir->index_cap = dir->index_used = 0;
}

/* The slot of the child named @name (@n bytes) in @dir's index, or of the
 * first empty slot after its probes (*slot NULL then). */
static struct mlfs_job **index_probe(const struct mlfs_job *dir, const char *name, size_t n)
{
	size_t mask = dir->index_cap - 1;
	for (size_t i = (size_t)mlfs_hash(name, n) & mask;; i = (i + 1) & mask) {
		struct mlfs_job **slot = &dir->index[i];
		if (!*slot || (*slot != &index_tomb && named(*slot, name, n)))
			return slot;
	}
}

/* @c into @dir's index at its first free or removed slot. */
static void index_put(struct mlfs_job *dir, struct mlfs_job *c)
{
	size_t mask = dir->index_cap - 1, n = strlen(c->name);
	for (size_t i = (size_t)mlfs_hash(c->name, n) & mask;; i = (i + 1) & mask)
		if (!dir->index[i] || dir->index[i] == &index_tomb) {
			dir->index_used += !dir->index[i];
			dir->index[i] = c;
			return;
		}
}

/* @dir's index made again for its children (none below MLFS_JOB_INDEXED;
 * the list alone when --max-memory or malloc refuse the slots). */
static void index_rebuild(struct mlfs_job *dir)
{
	index_free(dir);
	if (dir->nchildren < MLFS_JOB_INDEXED)
		return;
	size_t cap = 64;
	while (cap < 4 * dir->nchildren)
		cap *= 2;
	int64_t bytes = (int64_t)(cap * sizeof(*dir->index));
	if (xf_mem_reserve(dir->mem, bytes))
		return;
	if (!(dir->index = calloc(cap, sizeof(*dir->index)))) {
		xf_mem_release(dir->mem, bytes);
		return;
	}
	dir->index_cap = cap;
	for (struct mlfs_job *c = dir->first; c; c = c->next)
		index_put(dir, c);
}

struct mlfs_job *mlfs_job_child(const struct mlfs_job *dir, const char *name, size_t n)
{
	if (dir->index)
		return *index_probe(dir, name, n);
	for (struct mlfs_job *c = dir->first; c; c = c->next)
		if (named(c, name, n))
			return c;
	return NULL;
}

static void job_detach(struct mlfs_job *c)
{
	struct mlfs_job *dir = c->parent;
	if (dir->index) { /* by its name, which a rename changes only after this */
		struct mlfs_job **slot = index_probe(dir, c->name, strlen(c->name));
		if (*slot == c) /* (always: the index holds every child) */
			*slot = &index_tomb;
	}
	if (--dir->nchildren < MLFS_JOB_INDEXED / 2 && dir->index)
		index_free(dir);
	if (c->prev)
		c->prev->next = c->next;
	else
		dir->first = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
	clock_gettime(CLOCK_REALTIME, &dir->mtime);
	c->parent = NULL;
}

static void job_attach(struct mlfs_job *dir, struct mlfs_job *c)
{
	c->parent = dir;
	c->prev = NULL;
	c->next = dir->first;
	if (dir->first)
		dir->first->prev = c;
	dir->first = c;
	dir->nchildren++;
	if (dir->index && 2 * (dir->index_used + 1) <= dir->index_cap)
		index_put(dir, c);
	else if (dir->index || dir->nchildren >= MLFS_JOB_INDEXED)
		index_rebuild(dir); /* grown, or rid of its removed slots */
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

/* ------------------------------------------------------------ buffers */

struct mlfs_jbuf *mlfs_jbuf_get(struct mlfs_jbuf *b)
{
	if (b)
		atomic_fetch_add(&b->refs, 1);
	return b;
}

void mlfs_jbuf_put(struct mlfs_jbuf *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	xf_mem_release(b->mem, (int64_t)b->cap);
	XXH3_freeState(b->xs);
	free(b->bytes);
	free(b);
}

/* A buffer of @cap bytes (> 0), empty, held once; NULL with *@rc set. */
static struct mlfs_jbuf *jbuf_new(struct xf_mem *mem, size_t cap, int *rc)
{
	if ((*rc = xf_mem_reserve(mem, (int64_t)cap)))
		return NULL;
	struct mlfs_jbuf *b = calloc(1, sizeof(*b));
	if (!b || !(b->bytes = malloc(cap))) {
		free(b);
		xf_mem_release(mem, (int64_t)cap);
		*rc = -ENOMEM;
		return NULL;
	}
	atomic_init(&b->refs, 1);
	b->cap = cap;
	b->mem = mem;
	return b;
}

/* The capacity for @size bytes growing from @cap: geometric, so that
 * appends cost linear time. */
static size_t grown(size_t cap, size_t size)
{
	cap = cap < 4096 ? 4096 : cap;
	while (cap < size)
		cap = cap > SIZE_MAX / 2 ? size : cap * 2;
	return cap;
}

/* @b->hash after its bytes [0, @from) kept their hashed value and
 * [@from, size) are new: the streaming state goes on when it covers the
 * kept bytes (made here when @b has none, hashing them once); otherwise,
 * or without memory for a state, the whole content is hashed again. */
static void jbuf_rehash(struct mlfs_jbuf *b, size_t from, bool kept)
{
	if (kept && !b->xs && (b->xs = XXH3_createState()) &&
	    (XXH3_64bits_reset(b->xs) != XXH_OK ||
	     XXH3_64bits_update(b->xs, b->bytes, from) != XXH_OK)) {
		XXH3_freeState(b->xs);
		b->xs = NULL;
	}
	if (!b->xs) {
		b->hash = mlfs_hash(b->bytes, b->size);
		return;
	}
	if (!kept) {
		from = 0;
		if (XXH3_64bits_reset(b->xs) != XXH_OK)
			goto whole;
	}
	if (XXH3_64bits_update(b->xs, b->bytes + from, b->size - from) != XXH_OK)
		goto whole;
	b->hash = XXH3_64bits_digest(b->xs);
	return;
whole: /* cannot fail with valid arguments; never trust a state that did */
	XXH3_freeState(b->xs);
	b->xs = NULL;
	b->hash = mlfs_hash(b->bytes, b->size);
}

/* ---------------------------------------------------------- file content */

static void touch(struct mlfs_job *f)
{
	f->id = job_ids++;
	clock_gettime(CLOCK_REALTIME, &f->mtime);
}

/* Replaces @f's buffer with @b (the file's reference) and puts the old:
 * not the last reference when someone pinned it. */
static void job_swap(struct mlfs_job *f, struct mlfs_jbuf *b)
{
	struct mlfs_jbuf *old = f->buf;
	f->buf = b;
	f->size = b ? b->size : 0;
	mlfs_jbuf_put(old);
}

/*
 * @f's content becomes its first min(size, @size) bytes, zeros up to
 * @size, and the @n bytes at @data written at @off (@off + @n <= @size).
 * In place when @f alone holds its buffer, else into a new one.
 */
static int job_change(struct mlfs_job *f, size_t size, size_t off, const uint8_t *data, size_t n)
{
	struct mlfs_jbuf *b = f->buf;
	size_t old = f->size, keep = old < size ? old : size;
	/* bytes [0, old) unchanged: the hash may go on from old */
	bool extends = size >= old && (n == 0 || off >= old);
	int rc;

	if (f->dir)
		return -EISDIR;
	if (size == 0) { /* emptied: give the memory back */
		job_swap(f, NULL);
		touch(f);
		return 0;
	}
	if (size == old && n == 0) { /* same bytes */
		touch(f);
		return 0;
	}
	if (b && atomic_load(&b->refs) == 1) { /* the file's alone: in place */
		if (size > b->cap) {
			size_t cap = grown(b->cap, size);
			if (xf_mem_reserve(b->mem, (int64_t)(cap - b->cap)))
				return -ENOSPC;
			uint8_t *d = realloc(b->bytes, cap);
			if (!d) {
				xf_mem_release(b->mem, (int64_t)(cap - b->cap));
				return -ENOMEM;
			}
			b->bytes = d;
			b->cap = cap;
		}
	} else { /* empty, or pinned by others: a new buffer */
		struct mlfs_jbuf *nb = jbuf_new(f->mem, grown(0, size), &rc);
		if (!nb)
			return rc;
		if (keep)
			memcpy(nb->bytes, b->bytes, keep);
		/* the hash goes on from a copy of the old state */
		if (extends && b && b->xs && (nb->xs = XXH3_createState()))
			XXH3_copyState(nb->xs, b->xs);
		job_swap(f, nb);
		b = nb;
	}
	memset(b->bytes + keep, 0, size - keep);
	if (n)
		memcpy(b->bytes + off, data, n);
	b->size = f->size = size;
	jbuf_rehash(b, old, extends);
	touch(f);
	return 0;
}

int mlfs_job_truncate(struct mlfs_job *f, size_t size)
{
	return job_change(f, size, 0, NULL, 0);
}

int mlfs_job_write(struct mlfs_job *f, size_t off, const uint8_t *data, size_t n)
{
	if (off > SIZE_MAX - n)
		return -EFBIG;
	size_t end = off + n;
	return job_change(f, end > f->size ? end : f->size, off, data, n);
}

int mlfs_job_set(struct mlfs_job *f, const uint8_t *data, size_t size)
{
	struct mlfs_jbuf *b = NULL;
	int rc;

	if (f->dir)
		return -EISDIR;
	if (size) {
		if (!(b = jbuf_new(f->mem, size, &rc)))
			return rc;
		memcpy(b->bytes, data, size);
		b->size = size;
		b->hash = mlfs_hash(b->bytes, size);
	}
	job_swap(f, b);
	touch(f);
	return 0;
}

int mlfs_job_share(struct mlfs_job *f, struct mlfs_jbuf *b)
{
	if (f->dir)
		return -EISDIR;
	job_swap(f, mlfs_jbuf_get(b && b->size ? b : NULL));
	touch(f);
	return 0;
}

int64_t mlfs_job_mtime_ns(const struct mlfs_job *j)
{
	return (int64_t)j->mtime.tv_sec * 1000000000LL + j->mtime.tv_nsec;
}

void mlfs_job_set_mtime(struct mlfs_job *j, int64_t ns)
{
	j->mtime.tv_sec = (time_t)(ns / 1000000000LL);
	j->mtime.tv_nsec = (long)(ns % 1000000000LL);
}

int mlfs_job_keep_newer(struct mlfs_job *into, const struct mlfs_job *from, int *kept)
{
	for (const struct mlfs_job *l = from->first; l; l = l->next) {
		struct mlfs_job *s = mlfs_job_child(into, l->name, strlen(l->name));
		int rc;
		if (s && s->dir != l->dir) {
			/* the union's kind wins when it is the newer (a staged
			 * directory has its source's mtime); this node's newer
			 * one cannot join it */
			if (mlfs_job_mtime_ns(l) > mlfs_job_mtime_ns(s))
				return -EEXIST;
			continue;
		}
		bool fresh = !s;
		if (fresh && (rc = mlfs_job_create(into, l->name, l->dir, &s)))
			return rc;
		if (l->dir) {
			if ((rc = mlfs_job_keep_newer(s, l, kept)))
				return rc;
		} else if (fresh ||
			   (s->buf != l->buf && mlfs_job_mtime_ns(l) > mlfs_job_mtime_ns(s))) {
			mlfs_job_share(s, l->buf);
			s->mtime = l->mtime;
			(*kept)++;
		}
	}
	return 0;
}

uint64_t mlfs_job_hash(const struct mlfs_job *f)
{
	if (f->dir)
		return 0;
	return f->buf ? f->buf->hash : mlfs_hash("", 0);
}

static void manifest_walk(const struct mlfs_job *dir, const char *prefix, json_t *out)
{
	for (const struct mlfs_job *j = dir->first; j; j = j->next) {
		char path[4096], h[20];
		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "/" : "", j->name);
		snprintf(h, sizeof(h), "%016" PRIx64, mlfs_job_hash(j));
		json_array_append_new(out, json_pack("{sssbsIsssI}", "p", path, "d", j->dir, "n",
						     (json_int_t)j->size, "h", h, "m",
						     (json_int_t)mlfs_job_mtime_ns(j)));
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
