/*
 * mlfs_fuse.c - the mount: libfuse3 low-level operations over the store.
 *
 * DESIGN
 * Inodes name paths. The inode table maps (path, generation) <-> inode
 * number (numbers are never reused within a mount); every operation
 * resolves its path against the current view, so a reconfiguration that
 * changes the tree needs no inode bookkeeping: vanished paths answer ENOENT.
 *
 * A partition's generation is the id of the buffer that holds it, so every
 * new content (a committed write, a reconfiguration that rebuilt it) is a
 * new inode. Lookups are not cached (entry timeout 0), so new opens find
 * the new inode and a fresh page cache, while a file opened before keeps
 * the old inode: its page cache, its size and its buffer snapshot stay
 * those of the old content, to the end. Readers see the old or the new
 * content, never a mix, and the page cache of an unchanged partition is
 * kept across opens (keep_cache). A superseded ("stale") inode answers
 * getattr with the size it had. Writers use direct I/O, so nothing they
 * write reaches the page cache before the commit at close.
 *
 * Partition writes go to a private staging buffer and become visible at
 * close (flush), after the NPY header was checked against the partition
 * (as soon as it is complete: a wrong header fails that write with EINVAL).
 * Control files (config.json, schema.json, step) take effect when their
 * text is complete; job/ files behave as on tmpfs.
 *
 * Threads: libfuse's worker threads run every handler. Locks: store->lock
 * (store.c) then inodes.lock; neither is held across fuse_reply_*.
 */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "mlfs/mlfs_i.h"

#define MAX_JOB_FILE ((size_t)64 << 20)
#define MAX_CTL_TEXT ((size_t)64 << 20)

/* ---------------------------------------------------------------- inodes */

struct inode {
	uint64_t ino, nlookup;
	uint64_t gen; /* partitions: buffer id; 0 for everything else */
	off_t size;   /* partitions: st_size when this generation was current */
	char *path;
	struct inode *hnext;
};

static struct {
	pthread_mutex_t lock;
	struct inode **byino; /* index: ino */
	size_t n, cap;
	struct inode **hash;
	size_t hcap; /* power of two */
} inodes = {.lock = PTHREAD_MUTEX_INITIALIZER};

static struct mlfs_store *store;
static uid_t owner_uid;
static gid_t owner_gid;

static uint64_t path_hash(const char *p, uint64_t gen)
{
	uint64_t h = 1469598103934665603ull ^ gen;
	while (*p)
		h = (h ^ (uint8_t)*p++) * 1099511628211ull;
	return h;
}

static int inodes_init(void)
{
	inodes.cap = 1024;
	inodes.hcap = 4096;
	inodes.byino = calloc(inodes.cap, sizeof(*inodes.byino));
	inodes.hash = calloc(inodes.hcap, sizeof(*inodes.hash));
	struct inode *root = calloc(1, sizeof(*root));
	if (!inodes.byino || !inodes.hash || !root || !(root->path = strdup("")))
		return -ENOMEM;
	root->ino = FUSE_ROOT_ID;
	root->nlookup = 1;
	inodes.byino[FUSE_ROOT_ID] = root;
	inodes.hash[path_hash("", 0) & (inodes.hcap - 1)] = root;
	inodes.n = FUSE_ROOT_ID + 1;
	return 0;
}

static void inodes_release(void)
{
	for (size_t i = 0; i < inodes.n; i++)
		if (inodes.byino[i]) {
			free(inodes.byino[i]->path);
			free(inodes.byino[i]);
		}
	free(inodes.byino);
	free(inodes.hash);
}

/* Path of @ino copied into @buf, its generation and size into @gen and
 * @size when given; -ESTALE when unknown. */
static int ino_get(fuse_ino_t ino, char *buf, size_t cap, uint64_t *gen, off_t *size)
{
	int rc = -ESTALE;
	pthread_mutex_lock(&inodes.lock);
	if (ino < inodes.n && inodes.byino[ino]) {
		snprintf(buf, cap, "%s", inodes.byino[ino]->path);
		if (gen)
			*gen = inodes.byino[ino]->gen;
		if (size)
			*size = inodes.byino[ino]->size;
		rc = 0;
	}
	pthread_mutex_unlock(&inodes.lock);
	return rc;
}

static int ino_path(fuse_ino_t ino, char *buf, size_t cap)
{
	return ino_get(ino, buf, cap, NULL, NULL);
}

static struct inode **hash_slot(const char *path, uint64_t gen)
{
	struct inode **pp = &inodes.hash[path_hash(path, gen) & (inodes.hcap - 1)];
	while (*pp && ((*pp)->gen != gen || strcmp((*pp)->path, path) != 0))
		pp = &(*pp)->hnext;
	return pp;
}

/* The inode of (@path, @gen), created if new, with one more lookup; @size
 * is recorded for partitions. 0 on ENOMEM. */
static uint64_t ino_lookup(const char *path, uint64_t gen, off_t size)
{
	uint64_t ino = 0;
	pthread_mutex_lock(&inodes.lock);
	struct inode **pp = hash_slot(path, gen);
	if (!*pp) {
		struct inode *in = calloc(1, sizeof(*in));
		if (inodes.n == inodes.cap) {
			struct inode **b = realloc(inodes.byino, 2 * inodes.cap * sizeof(*b));
			if (b) {
				memset(b + inodes.cap, 0, inodes.cap * sizeof(*b));
				inodes.byino = b;
				inodes.cap *= 2;
			}
		}
		if (!in || inodes.n == inodes.cap || !(in->path = strdup(path))) {
			free(in);
			goto out;
		}
		in->ino = inodes.n++;
		in->gen = gen;
		in->size = size;
		inodes.byino[in->ino] = in;
		*pp = in;
	}
	(*pp)->nlookup++;
	ino = (*pp)->ino;
out:
	pthread_mutex_unlock(&inodes.lock);
	return ino;
}

static void ino_forget(fuse_ino_t ino, uint64_t n)
{
	pthread_mutex_lock(&inodes.lock);
	struct inode *in = ino < inodes.n ? inodes.byino[ino] : NULL;
	if (in && ino != FUSE_ROOT_ID) {
		in->nlookup = n >= in->nlookup ? 0 : in->nlookup - n;
		if (in->nlookup == 0) {
			*hash_slot(in->path, in->gen) = in->hnext;
			inodes.byino[ino] = NULL;
			free(in->path);
			free(in);
		}
	}
	pthread_mutex_unlock(&inodes.lock);
}

/* ----------------------------------------------------------- resolution */

enum kind {
	K_ROOT,
	K_CONFIG,
	K_SCHEMA,
	K_CLUSTER,
	K_STATUS,
	K_CTL,
	K_JOB,
	K_RANKS,
	K_RANK,
	K_RANKJSON,
	K_STEP,
	K_TDIR,
	K_PART,
	K_FULL,
	K_FDIR,
	K_FFILE,
	K_DDIR,	 /* ranks/<r>/data */
	K_DFILE, /* ranks/<r>/data/<step>.<kind> */
};

struct ent {
	enum kind kind;
	int rank, state, tensor;
	int64_t step, first, count; /* K_DFILE: the step and its samples */
	int64_t nsteps;		    /* K_DFILE: a window of steps, or 0 */
	uint64_t whash;		    /* K_DFILE window: its steps' slices */
	enum mlfs_dfile dkind;
	const struct mlfs_tnode *tn;
	struct mlfs_job *job;
};

static const struct {
	const char *name;
	enum kind kind;
} root_files[] = {
    {"config.json", K_CONFIG}, {"schema.json", K_SCHEMA}, {"cluster.json", K_CLUSTER},
    {"status.json", K_STATUS}, {MLFS_CTL_NAME, K_CTL},	  {"job", K_JOB},
    {"ranks", K_RANKS},	       {"full", K_FULL},
};

/* Next component of *p: returns its length and advances past it. */
static size_t next_comp(const char **p, const char **comp)
{
	while (**p == '/')
		(*p)++;
	*comp = *p;
	size_t n = strcspn(*p, "/");
	*p += n;
	return n;
}

static bool is_local_rank(const struct mlfs_view *v, int r)
{
	int r0 = v->layout.node_first_rank[store->node];
	return r0 >= 0 && r >= r0 && r < r0 + v->layout.node_nranks[store->node];
}

/* Resolves @path against the store; lock held (job nodes are only valid
 * under it). @v is the current view or NULL. 0 or -ENOENT. */
static int resolve(const char *path, struct mlfs_view *v, struct ent *e)
{
	const char *p = path, *c;
	size_t n = next_comp(&p, &c);

	memset(e, 0, sizeof(*e));
	e->kind = K_ROOT;
	if (n == 0)
		return 0;
	size_t i = 0;
	while (i < sizeof(root_files) / sizeof(root_files[0]) &&
	       !(strlen(root_files[i].name) == n && strncmp(root_files[i].name, c, n) == 0))
		i++;
	if (i == sizeof(root_files) / sizeof(root_files[0]))
		return -ENOENT;
	e->kind = root_files[i].kind;
	switch (e->kind) {
	case K_JOB:
		e->job = store->job;
		while ((n = next_comp(&p, &c))) {
			if (!e->job->dir || !(e->job = mlfs_job_child(e->job, c, n)))
				return -ENOENT;
		}
		return 0;
	case K_RANKS: {
		if ((n = next_comp(&p, &c)) == 0)
			return 0;
		char num[16];
		if (!v || n >= sizeof(num))
			return -ENOENT;
		memcpy(num, c, n);
		num[n] = '\0';
		char *end;
		long r = strtol(num, &end, 10);
		if (*end || (n > 1 && num[0] == '0') || r < 0 || r >= v->layout.world ||
		    !is_local_rank(v, (int)r))
			return -ENOENT;
		e->kind = K_RANK;
		e->rank = (int)r;
		if ((n = next_comp(&p, &c)) == 0)
			return 0;
		if (n == 9 && strncmp(c, "rank.json", 9) == 0 && !*p) {
			e->kind = K_RANKJSON;
			return 0;
		}
		if (n == 4 && strncmp(c, "step", 4) == 0 && !*p) {
			e->kind = K_STEP;
			return 0;
		}
		if (n == 4 && strncmp(c, "data", 4) == 0 && v->ds) {
			e->kind = K_DDIR;
			if ((n = next_comp(&p, &c)) == 0)
				return 0;
			if (mlfs_data_name(v->ds, c, n, &e->step, &e->nsteps, &e->dkind) ||
			    next_comp(&p, &c))
				return -ENOENT;
			e->kind = K_DFILE;
			if (!e->nsteps)
				return mlfs_data_slice(v->ds, &v->cursor, e->step,
						       v->layout.ranks[r].d, &e->first, &e->count);
			int64_t firsts[MLFS_DATA_WINDOW_MAX];
			int rc = mlfs_data_window(v->ds, &v->cursor, e->step, e->nsteps,
						  v->layout.ranks[r].d, firsts, &e->count);
			e->first = rc ? 0 : firsts[0];
			for (int64_t k = 0; k < e->nsteps && rc == 0; k++)
				e->whash = (e->whash ^ (uint64_t)firsts[k]) * 1099511628211ull;
			return rc;
		}
		e->kind = K_TDIR;
		e->tn = v->stage_tree[v->layout.ranks[r].p];
		break;
	}
	case K_FULL:
		if (!v)
			return *p ? -ENOENT : 0;
		e->kind = K_FDIR;
		e->tn = v->full_tree;
		if ((n = next_comp(&p, &c)) == 0)
			return 0;
		break;
	default:
		return next_comp(&p, &c) ? -ENOENT : 0;
	}
	/* Walk a name tree, starting with component c. */
	for (;;) {
		if (!(e->tn = mlfs_tree_child(e->tn, c, n)))
			return -ENOENT;
		if ((n = next_comp(&p, &c)) == 0)
			break;
	}
	if (e->tn->tensor >= 0) {
		e->kind = e->kind == K_TDIR ? K_PART : K_FFILE;
		e->state = e->tn->state;
		e->tensor = e->tn->tensor;
	}
	return 0;
}

/* --------------------------------------------------------------- attrs */

static int64_t part_bytes(const struct mlfs_view *v, const struct ent *e)
{
	return xf_partition_bytes(&v->layout, e->rank, e->state, e->tensor);
}

static int64_t full_bytes(const struct ent *e)
{
	const struct ptc_tensor *t = &store->schema->tensors[e->tensor];
	return ptc_tensor_elems(t) *
	       (int64_t)ptc_dtype_size(ptc_schema_dtype(store->schema, e->state, e->tensor));
}

static size_t text_len(char *s)
{
	size_t n = s ? strlen(s) : 0;
	free(s);
	return n;
}

static char *step_text(int rank)
{
	char *s = NULL;
	if (asprintf(&s, "%" PRId64 "\n", store->steps[rank]) < 0)
		return NULL;
	return s;
}

/* Fills @stb for @e; lock held. */
static void fill_attr(const struct ent *e, const struct mlfs_view *v, struct stat *stb)
{
	char hdr[512];
	memset(stb, 0, sizeof(*stb));
	stb->st_uid = owner_uid;
	stb->st_gid = owner_gid;
	stb->st_nlink = 1;
	stb->st_mtim = v ? v->time : store->start;
	stb->st_ctim = stb->st_mtim;
	stb->st_atim = stb->st_mtim;
	switch (e->kind) {
	case K_ROOT:
	case K_RANKS:
	case K_RANK:
	case K_FULL:
		stb->st_mode = S_IFDIR | 0755;
		stb->st_nlink = 2;
		return;
	case K_DDIR:
		stb->st_mode = S_IFDIR | 0555;
		stb->st_nlink = 2;
		return;
	case K_DFILE: {
		size_t hlen;
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)mlfs_data_file_size(v->ds, e->first, e->count, e->nsteps,
							  e->dkind, hdr, sizeof(hdr), &hlen);
		return;
	}
	case K_TDIR:
	case K_FDIR:
		if (e->tn && e->tn->tensor < 0) {
			stb->st_mode = S_IFDIR | 0555;
			stb->st_nlink = 2;
			return;
		}
		break;
	case K_JOB:
		stb->st_mode = e->job->dir ? S_IFDIR | 0755 : S_IFREG | 0644;
		stb->st_size = (off_t)e->job->size;
		stb->st_mtim = stb->st_ctim = e->job->mtime;
		return;
	case K_CONFIG:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = v ? (off_t)strlen(v->config_text) : 0;
		return;
	case K_SCHEMA:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = store->schema_text ? (off_t)strlen(store->schema_text) : 0;
		return;
	case K_CLUSTER:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)strlen(store->cluster_text);
		return;
	case K_STATUS:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = 0; /* generated on open; direct I/O */
		return;
	case K_CTL:
		stb->st_mode = S_IFREG | 0600;
		return;
	case K_RANKJSON:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)text_len(mlfs_rank_json(v, e->rank));
		return;
	case K_STEP:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = (off_t)text_len(step_text(e->rank));
		return;
	case K_PART:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = (off_t)(mlfs_part_header(store->schema, &v->layout, e->rank,
							e->state, e->tensor, hdr, sizeof(hdr)) +
				       (size_t)part_bytes(v, e));
		return;
	case K_FFILE:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size =
		    (off_t)(mlfs_full_header(store->schema, e->state, e->tensor, hdr, sizeof(hdr)) +
			    (size_t)full_bytes(e));
		return;
	}
	stb->st_mode = S_IFREG | 0644;
}

/* The generation of an entity whose content changes: a partition's is the
 * id of its current buffer, a dataset view's its samples (high bit set);
 * 0 for the rest. Lock held. */
static uint64_t ent_gen(const struct mlfs_view *v, const struct ent *e)
{
	if (e->kind == K_PART)
		return v->parts.bufs[xf_parts_index(&v->parts, e->rank, e->state, e->tensor)]->id;
	if (e->kind != K_DFILE)
		return 0;
	uint64_t h =
	    path_hash("", (uint64_t)e->first * 0x9e3779b97f4a7c15ull ^ (uint64_t)e->count << 8 ^
			      (uint64_t)e->dkind ^ e->whash * 31 ^ (uint64_t)e->nsteps << 40);
	return h | 1ull << 63;
}

/* Resolves an inode under the lock: path, view ref, entity, attributes. */
struct target {
	char path[4096];
	struct mlfs_view *v;
	struct ent e;
	bool stale; /* a partition inode whose content was superseded */
	off_t size; /* its size then */
};

static int target_get(fuse_ino_t ino, struct target *t)
{
	uint64_t gen;
	int rc = ino_get(ino, t->path, sizeof(t->path), &gen, &t->size);
	if (rc)
		return rc;
	pthread_mutex_lock(&store->lock);
	t->v = store->view;
	if (t->v)
		atomic_fetch_add(&t->v->refs, 1);
	rc = resolve(t->path, t->v, &t->e);
	if (rc) {
		pthread_mutex_unlock(&store->lock);
		mlfs_view_put(t->v);
		t->v = NULL;
		return rc;
	}
	t->stale = gen != ent_gen(t->v, &t->e);
	return 0; /* the lock is held */
}

static void target_done(struct target *t)
{
	(void)t;
	pthread_mutex_unlock(&store->lock);
}

/* How long the kernel may cache a name (@entry) or attributes. Paths whose
 * inode never changes (the rank directories and data/: inodes are paths,
 * and operations resolve them against the current view, so a vanished one
 * answers ENOENT) are cached briefly, which saves a view open three lookups;
 * a view's attributes belong to its inode (keyed by its samples). Everything
 * else is looked up every time: a partition path gets a new inode per
 * content, a view path per slice. */
static double ent_timeout(const struct ent *e, bool entry)
{
	switch (e->kind) {
	case K_RANKS:
	case K_RANK:
	case K_DDIR:
		return 5.0;
	case K_ROOT:
	case K_FULL:
	case K_DFILE:
		return entry ? 0.0 : 5.0;
	case K_TDIR:
	case K_FDIR: /* a directory's attributes (the kernel checks them on every path walk) */
		return entry || !e->tn || e->tn->tensor >= 0 ? 0.0 : 5.0;
	default:
		return 0.0;
	}
}

static void reply_entry(fuse_req_t req, const char *path, const struct ent *e,
			const struct mlfs_view *v)
{
	struct fuse_entry_param ep = {0};
	fill_attr(e, v, &ep.attr);
	ep.entry_timeout = ent_timeout(e, true);
	ep.attr_timeout = ent_timeout(e, false);
	uint64_t gen = ent_gen(v, e);
	pthread_mutex_unlock(&store->lock);
	if (!(ep.ino = ino_lookup(path, gen, ep.attr.st_size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ep.attr.st_ino = ep.ino;
	if (fuse_reply_entry(req, &ep))
		ino_forget(ep.ino, 1);
}

static int child_path(fuse_ino_t parent, const char *name, char *buf, size_t cap)
{
	char pp[4096];
	int rc = ino_path(parent, pp, sizeof(pp));
	if (rc)
		return rc;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	if ((size_t)snprintf(buf, cap, "%s%s%s", pp, *pp ? "/" : "", name) >= cap)
		return -ENAMETOOLONG;
	return 0;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct target t;
	int rc = child_path(parent, name, t.path, sizeof(t.path));
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	pthread_mutex_lock(&store->lock);
	t.v = store->view;
	if ((rc = resolve(t.path, t.v, &t.e))) {
		pthread_mutex_unlock(&store->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	reply_entry(req, t.path, &t.e, t.v); /* unlocks */
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n)
{
	ino_forget(ino, n);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	for (size_t i = 0; i < count; i++)
		ino_forget(f[i].ino, f[i].nlookup);
	fuse_reply_none(req);
}

/* ---------------------------------------------------------- file handles */

/* An open file. Referenced by its open (until release) and by each read in
 * progress: a reply may still be read from its buffers after the kernel
 * completed the request and the file was released. */
struct fh {
	atomic_int refs;
	enum kind kind;
	struct mlfs_view *v;
	int rank, state, tensor;
	bool write, dirty, committed;
	int err; /* sticky: a refused write */
	/* reading: a buffer snapshot behind a header, or a text */
	struct xf_buf *buf;
	char hdr[512];
	size_t hdr_len;
	char *text;
	size_t text_len;
	/* writing text files */
	char *w;
	size_t wlen, wcap;
	/* writing partitions: staged header and data */
	uint8_t *whdr;
	size_t whave, wtotal; /* header bytes held; declared header length (0 = unknown) */
	struct xf_buf *wdata;
	bool wbase; /* not truncated: unwritten bytes are the current content */
	int64_t wend;
	/* dataset views: a step's (nsteps 0), or a window's, one a step */
	struct mlfs_dview **views; /* [nviews] */
	int64_t nviews;
	enum mlfs_dfile dkind;
	int64_t step, first, count, nsteps;
};

static void fh_free(struct fh *f)
{
	if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	xf_buf_put(f->buf);
	xf_buf_put(f->wdata);
	for (int64_t i = 0; i < f->nviews; i++)
		mlfs_dview_put(f->views[i]);
	free(f->views);
	mlfs_view_put(f->v);
	free(f->text);
	free(f->w);
	free(f->whdr);
	free(f);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct target t;
	struct stat stb;
	int rc = target_get(ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	fill_attr(&t.e, t.v, &stb);
	const struct fh *f = fi ? (const struct fh *)(uintptr_t)fi->fh : NULL;
	if (f && f->kind == K_PART && !f->write) /* fstat: the open snapshot */
		stb.st_size = (off_t)(f->hdr_len + (size_t)f->buf->size);
	else if (t.stale)
		stb.st_size = t.size;
	double timeout = t.stale ? 0.0 : ent_timeout(&t.e, false);
	target_done(&t);
	mlfs_view_put(t.v);
	stb.st_ino = ino;
	fuse_reply_attr(req, &stb, timeout);
}

static int text_append(struct fh *f, const char *buf, size_t size, off_t off)
{
	if ((size_t)off + size > MAX_CTL_TEXT)
		return -EFBIG;
	size_t end = (size_t)off + size;
	if (end > f->wcap) {
		size_t cap = f->wcap ? f->wcap : 4096;
		while (cap < end)
			cap *= 2;
		char *w = realloc(f->w, cap + 1);
		if (!w)
			return -ENOMEM;
		f->w = w;
		f->wcap = cap;
	}
	if ((size_t)off > f->wlen)
		memset(f->w + f->wlen, 0, (size_t)off - f->wlen);
	memcpy(f->w + off, buf, size);
	if (end > f->wlen)
		f->wlen = end;
	f->w[f->wlen] = '\0';
	return 0;
}

/* Text snapshot of a generated or control file; lock held. */
static char *snapshot_text(const struct ent *e, const struct mlfs_view *v)
{
	switch (e->kind) {
	case K_CONFIG:
		return strdup(v ? v->config_text : "");
	case K_SCHEMA:
		return strdup(store->schema_text ? store->schema_text : "");
	case K_CLUSTER:
		return strdup(store->cluster_text);
	case K_RANKJSON:
		return mlfs_rank_json(v, e->rank);
	case K_STEP:
		return step_text(e->rank);
	default:
		return strdup("");
	}
}

/* Assembles (or finds) the records of a dataset view for @f, or of each
 * step of a window, and queues the next steps of its DP group. No lock
 * held. */
static int open_view(struct fh *f)
{
	char why[512] = "";
	int d = f->v->layout.ranks[f->rank].d, rc = 0;
	int64_t n = f->nsteps ? f->nsteps : 1, count = f->count, firsts[MLFS_DATA_WINDOW_MAX];

	firsts[0] = f->first;
	if (f->nsteps && /* the slices resolve() checked, under the same view */
	    (rc = mlfs_data_window(f->v->ds, &f->v->cursor, f->step, n, d, firsts, &count)))
		snprintf(why, sizeof(why), "its steps have no views of one length");
	if (!(f->views = calloc((size_t)n, sizeof(*f->views))))
		return -ENOMEM;
	for (; f->nviews < n && rc == 0; f->nviews++) {
		char err[400];
		rc = mlfs_data_get(f->v->ds, firsts[f->nviews], count, &f->views[f->nviews], err,
				   sizeof(err));
		if (rc && f->nsteps) /* a window: which step */
			snprintf(why, sizeof(why), "step %" PRId64 ": %s", f->step + f->nviews,
				 err);
		else if (rc)
			snprintf(why, sizeof(why), "%s", err);
	}
	if (rc) {
		char msg[700], name[64], one[48];
		mlfs_data_format_name(f->step, f->dkind, one, sizeof(one));
		if (f->nsteps) /* a window: "<s>-<e>" and the suffix */
			snprintf(name, sizeof(name), "%" PRId64 "-%" PRId64 "%s", f->step,
				 f->step + f->nsteps, strchr(one, '.'));
		else
			snprintf(name, sizeof(name), "%s", one);
		snprintf(msg, sizeof(msg), "dataset: ranks/%d/data/%s: %s", f->rank, name, why);
		mlfs_store_note_error(store, msg);
		return rc == -ENOSPC || rc == -ENOMEM ? rc : -EIO;
	}
	mlfs_data_prefetch(f->v->ds, &f->v->cursor, d, f->step + n, f->nsteps);
	return 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct target t;
	int rc = target_get(ino, &t), acc = fi->flags & O_ACCMODE;
	struct fh *f = NULL;

	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	bool write = acc != O_RDONLY;
	rc = -ENOMEM;
	if (!(f = calloc(1, sizeof(*f))))
		goto out_locked;
	atomic_init(&f->refs, 1);
	f->kind = t.e.kind;
	f->v = t.v;
	t.v = NULL;
	f->rank = t.e.rank;
	f->state = t.e.state;
	f->tensor = t.e.tensor;
	f->write = write;
	bool stale = t.stale;
	switch (t.e.kind) {
	case K_ROOT:
	case K_RANKS:
	case K_RANK:
	case K_FULL:
	case K_TDIR:
	case K_FDIR:
		rc = -EISDIR;
		if (t.e.kind == K_TDIR || t.e.kind == K_FDIR)
			rc = t.e.tn->tensor < 0 ? -EISDIR : 0;
		goto out_locked;
	case K_JOB:
		rc = t.e.job->dir ? -EISDIR : 0;
		if (rc == 0 && (fi->flags & O_TRUNC) && write)
			rc = mlfs_job_truncate(t.e.job, 0);
		fi->direct_io = 1;
		break;
	case K_CLUSTER:
	case K_RANKJSON:
	case K_STATUS:
		rc = write ? -EACCES : 0;
		fi->direct_io = 1;
		break;
	case K_CONFIG:
	case K_SCHEMA:
	case K_STEP:
	case K_CTL:
		fi->direct_io = 1;
		rc = 0;
		if (write && !(fi->flags & O_TRUNC) && t.e.kind != K_CTL) {
			char *cur = snapshot_text(&t.e, f->v);
			rc = cur ? text_append(f, cur, strlen(cur), 0) : -ENOMEM;
			free(cur);
		}
		break;
	case K_PART: {
		size_t i = xf_parts_index(&f->v->parts, f->rank, f->state, f->tensor);
		if (write && store->state == MLFS_TRANSFORMING) {
			rc = -EBUSY;
			break;
		}
		f->buf = xf_buf_get(f->v->parts.bufs[i]);
		f->hdr_len = mlfs_part_header(store->schema, &f->v->layout, f->rank, f->state,
					      f->tensor, f->hdr, sizeof(f->hdr));
		f->wbase = !(fi->flags & O_TRUNC);
		rc = 0;
		break;
	}
	case K_FFILE:
		rc = write ? -EACCES : 0;
		break;
	case K_DDIR:
		rc = -EISDIR;
		break;
	case K_DFILE:
		rc = write ? -EACCES : 0;
		f->dkind = t.e.dkind;
		f->step = t.e.step;
		f->first = t.e.first;
		f->count = t.e.count;
		f->nsteps = t.e.nsteps;
		mlfs_data_file_size(f->v->ds, f->first, f->count, f->nsteps, f->dkind, f->hdr,
				    sizeof(f->hdr), &f->hdr_len);
		break;
	}
	if (rc == 0 &&
	    (t.e.kind == K_STATUS || (!write && t.e.kind != K_JOB && t.e.kind != K_PART &&
				      t.e.kind != K_FFILE && t.e.kind != K_CTL))) {
		f->text = t.e.kind == K_STATUS ? NULL : snapshot_text(&t.e, f->v);
		if (t.e.kind != K_STATUS && !f->text)
			rc = -ENOMEM;
		f->text_len = f->text ? strlen(f->text) : 0;
	}
out_locked:
	target_done(&t);
	mlfs_view_put(t.v);
	if (rc == 0 && f->kind == K_STATUS) {
		f->text = mlfs_store_status_json(store);
		f->text_len = f->text ? strlen(f->text) : 0;
		rc = f->text ? 0 : -ENOMEM;
	}
	if (rc == 0 && f->kind == K_DFILE)
		rc = open_view(f);
	if (rc == 0 && f->kind == K_FFILE) {
		f->hdr_len =
		    mlfs_full_header(store->schema, f->state, f->tensor, f->hdr, sizeof(f->hdr));
		rc = mlfs_store_assemble(store, f->v, f->state, f->tensor, &f->buf);
	}
	if (rc) {
		fh_free(f);
		fuse_reply_err(req, -rc);
		return;
	}
	if (f->kind == K_PART && !write)
		fi->keep_cache = !stale; /* this inode's pages are this content's */
	else if (f->kind == K_DFILE)
		fi->direct_io = 1; /* read once: straight to the reader, no page cache */
	else if (f->kind == K_PART)
		fi->direct_io = 1; /* nothing staged reaches the page cache */
	fi->noflush = !write;	   /* a reader's flush does nothing: spare the round trip */
	fi->fh = (uintptr_t)f;
	if (fuse_reply_open(req, fi))
		fh_free(f);
}

static struct fh *FH(struct fuse_file_info *fi)
{
	return (struct fh *)(uintptr_t)fi->fh;
}

/* Replies bytes [off, off+size) of header+data, with no copy on our side:
 * data alone through a pipe when @splice (large partitions: measured a
 * little faster cold), else one writev (dataset views: measured faster,
 * their replies being 1 MiB or less). */
static void reply_parts(fuse_req_t req, const char *hdr, size_t hlen, const uint8_t *data,
			size_t dlen, size_t size, off_t off, bool splice)
{
	size_t total = hlen + dlen, o = (size_t)off;
	if (o >= total) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > total - o)
		size = total - o;
	if (o >= hlen && splice) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
		bv.buf[0].mem = (void *)(data + (o - hlen));
		fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	if (o >= hlen) {
		struct iovec one = {(void *)(data + (o - hlen)), size};
		fuse_reply_iov(req, &one, 1);
		return;
	}
	struct iovec iov[2] = {{(void *)(hdr + o), hlen - o < size ? hlen - o : size},
			       {(void *)data, 0}};
	iov[1].iov_len = size - iov[0].iov_len;
	fuse_reply_iov(req, iov, iov[1].iov_len ? 2 : 1);
}

/* Bytes [off, off+size) of a dataset view or window: the header, then the
 * bodies of its views back to back (all of one length), in one writev. */
static void reply_views(fuse_req_t req, struct fh *f, size_t size, off_t off)
{
	struct iovec iov[MLFS_DATA_WINDOW_MAX + 1];
	int n = 0;
	size_t o = (size_t)off, hlen = f->hdr_len;

	if (o < hlen && size) {
		iov[n] = (struct iovec){f->hdr + o, hlen - o < size ? hlen - o : size};
		size -= iov[n++].iov_len;
		o = hlen;
	}
	for (int64_t i = 0; i < f->nviews && size; i++) {
		const uint8_t *body;
		size_t len;
		mlfs_dview_body(f->views[i], f->dkind, &body, &len);
		if (o >= hlen + len) { /* before the range */
			o -= len;
			continue;
		}
		size_t a = o - hlen, k = len - a < size ? len - a : size;
		iov[n++] = (struct iovec){(void *)(body + a), k};
		size -= k;
		o = hlen;
	}
	fuse_reply_iov(req, iov, n);
}

static void read_fh(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fh *f);

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);
	atomic_fetch_add(&f->refs, 1);
	read_fh(req, ino, size, off, f);
	fh_free(f);
}

static void read_fh(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fh *f)
{
	if (f->kind == K_PART || f->kind == K_FFILE) {
		reply_parts(req, f->hdr, f->hdr_len, f->buf->data, (size_t)f->buf->size, size, off,
			    true);
		return;
	}
	if (f->kind == K_DFILE) {
		reply_views(req, f, size, off);
		return;
	}
	if (f->kind == K_JOB) {
		struct target t;
		int rc = target_get(ino, &t);
		if (rc) {
			fuse_reply_err(req, -rc);
			return;
		}
		size_t n = t.e.job->size, o = (size_t)off;
		size_t len = o < n ? (size < n - o ? size : n - o) : 0;
		char *copy = len ? malloc(len) : NULL;
		if (copy)
			memcpy(copy, t.e.job->data + o, len);
		target_done(&t);
		mlfs_view_put(t.v);
		if (len && !copy)
			fuse_reply_err(req, ENOMEM);
		else
			fuse_reply_buf(req, copy, len);
		free(copy);
		return;
	}
	const char *text = f->text ? f->text : "";
	size_t n = f->text ? f->text_len : 0;
	if (f->kind == K_CTL) {
		text = f->text ? f->text : "";
		n = f->text ? strlen(f->text) : 0;
	}
	reply_parts(req, "", 0, (const uint8_t *)text, n, size, off, false);
}

/* Declared header length from the first bytes, 0 when unknown yet. */
static int64_t npy_declared_len(const uint8_t *b, size_t have)
{
	if (have < 8)
		return memcmp(b, "\x93NUMPY", have < 6 ? have : 6) ? -EINVAL : 0;
	if (memcmp(b, "\x93NUMPY", 6) || b[6] < 1 || b[6] > 3)
		return -EINVAL;
	if (b[6] == 1)
		return have < 10 ? 0 : 10 + (int64_t)(b[8] | b[9] << 8);
	if (have < 12)
		return 0;
	int64_t n = 12 + (int64_t)((uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 |
				   (uint32_t)b[11] << 24);
	return n > MLFS_NPY_MAX_HEADER + 12 ? -EINVAL : n;
}

static void log_refusal(const char *what, const char *why)
{
	char msg[512];
	snprintf(msg, sizeof(msg), "%.200s: %.300s", what, why);
	mlfs_store_note_error(store, msg);
}

/* Validates the complete staged header against the partition. */
static int check_staged_header(struct fh *f)
{
	struct mlfs_npy h;
	char why[256];
	int64_t shape[PTC_MAX_DIMS];
	const struct ptc_tensor *T = &store->schema->tensors[f->tensor];
	int nd = ptc_partition_shape(T, f->v->layout.tp, f->v->layout.ranks[f->rank].t, shape);
	int rc = mlfs_npy_parse(f->whdr, f->wtotal, &h, why, sizeof(why));

	if (rc == 0 && h.header_len != f->wtotal)
		rc = -EINVAL, snprintf(why, sizeof(why), "inconsistent header length");
	if (rc == 0)
		rc = mlfs_npy_check(&h, ptc_schema_dtype(store->schema, f->state, f->tensor), nd,
				    shape, why, sizeof(why));
	if (rc) {
		char what[600];
		snprintf(what, sizeof(what), "ranks/%d/%s/%s.npy", f->rank,
			 store->schema->states[f->state].name, T->name);
		log_refusal(what, why);
		return -EINVAL;
	}
	return 0;
}

/* Stages a write into a partition file. */
static int part_write(struct fh *f, const uint8_t *buf, size_t size, int64_t off)
{
	int64_t dlen = (int64_t)f->buf->size;
	int rc;

	if (!f->whdr) {
		if (!(f->whdr = malloc(MLFS_NPY_MAX_HEADER + 12)))
			return -ENOMEM;
		if (f->wbase) { /* start from the current content */
			memcpy(f->whdr, f->hdr, f->hdr_len);
			f->whave = f->wtotal = f->hdr_len;
			f->wend = (int64_t)f->hdr_len + dlen;
		}
	}
	while (size > 0) {
		if (f->wtotal == 0 || off < (int64_t)f->wtotal) { /* header bytes */
			size_t cap = f->wtotal ? f->wtotal : MLFS_NPY_MAX_HEADER + 12;
			if (off > (int64_t)f->whave || (size_t)off >= cap)
				return -EINVAL; /* header must be written first, in order */
			size_t n = size < cap - (size_t)off ? size : cap - (size_t)off;
			memcpy(f->whdr + off, buf, n);
			if ((size_t)off + n > f->whave)
				f->whave = (size_t)off + n;
			int64_t decl = npy_declared_len(f->whdr, f->whave);
			if (decl < 0)
				return -EINVAL;
			if (f->wtotal && decl && (size_t)decl != f->wtotal)
				return -EINVAL;
			if (decl > 0) {
				f->wtotal = (size_t)decl;
				if (f->whave > f->wtotal)
					f->whave = f->wtotal;
			}
			if (f->wtotal && f->whave >= f->wtotal && (rc = check_staged_header(f)))
				return rc;
			if (f->wtotal && (size_t)off + n > f->wtotal)
				n = f->wtotal - (size_t)off;
			off += (int64_t)n;
			buf += n;
			size -= n;
			continue;
		}
		if (f->whave < f->wtotal)
			return -EINVAL;
		int64_t d = off - (int64_t)f->wtotal;
		if (d + (int64_t)size > dlen)
			return -EINVAL; /* past the partition's size */
		if (!f->wdata) {
			if (!(f->wdata = xf_buf_new(&store->mem, dlen, &rc)))
				return rc;
			if (f->wbase)
				memcpy(f->wdata->data, f->buf->data, (size_t)dlen);
		}
		memcpy(f->wdata->data + d, buf, size);
		off += (int64_t)size;
		size = 0;
	}
	if (off > f->wend)
		f->wend = off;
	return 0;
}

/* Applies a complete control text at write time when it parses as JSON. */
static int ctl_try_commit(struct fh *f, bool final)
{
	struct ptc_error err = {""};
	int rc = 0;

	if (f->committed)
		return 0;
	if (!final && f->kind != K_STEP) {
		json_t *j = json_loadb(f->w ? f->w : "", f->wlen, 0, NULL);
		if (!j)
			return 0; /* incomplete yet */
		json_decref(j);
	}
	if (!final && f->kind == K_STEP)
		return 0;
	switch (f->kind) {
	case K_CONFIG:
		rc = mlfs_store_set_config(store, f->w ? f->w : "", f->wlen, &err);
		break;
	case K_SCHEMA:
		rc = mlfs_store_set_schema(store, f->w ? f->w : "", f->wlen, &err);
		break;
	case K_STEP:
		rc = mlfs_store_set_step(store, f->rank, f->w ? f->w : "", f->wlen, &err);
		if (rc == -EINVAL)
			log_refusal("step", err.text);
		break;
	case K_CTL:
		free(f->text);
		f->text = NULL;
		rc = mlfs_store_control(store, f->w ? f->w : "", f->wlen, &f->text);
		f->wlen = 0;
		return rc;
	default:
		break;
	}
	f->committed = true;
	return rc;
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);
	int rc = f->err;

	if (rc == 0) {
		switch (f->kind) {
		case K_PART:
			rc = part_write(f, (const uint8_t *)buf, size, off);
			break;
		case K_JOB: {
			struct target t;
			if ((rc = target_get(ino, &t)))
				break;
			size_t end = (size_t)off + size;
			if (end > MAX_JOB_FILE)
				rc = -EFBIG;
			else if (end > t.e.job->size)
				rc = mlfs_job_truncate(t.e.job, end);
			if (rc == 0) {
				memcpy(t.e.job->data + off, buf, size);
				clock_gettime(CLOCK_REALTIME, &t.e.job->mtime);
			}
			target_done(&t);
			mlfs_view_put(t.v);
			break;
		}
		case K_CONFIG:
		case K_SCHEMA:
		case K_STEP:
		case K_CTL:
			if (f->committed)
				rc = -EINVAL; /* one text per open */
			else if ((rc = text_append(f, buf, size, f->kind == K_CTL ? 0 : off)) == 0)
				rc = ctl_try_commit(f, f->kind == K_CTL);
			break;
		default:
			rc = -EACCES;
		}
	}
	if (rc) {
		if (f->kind == K_PART || f->kind == K_CONFIG || f->kind == K_SCHEMA)
			f->err = rc;
		fuse_reply_err(req, -rc);
		return;
	}
	f->dirty = true;
	fuse_reply_write(req, size);
}

/* Commits a staged partition write; 0 or a negative errno. */
static int part_commit(struct fh *f)
{
	int64_t dlen = (int64_t)f->buf->size;
	int rc;

	if (!f->whdr) { /* truncated and nothing written */
		log_refusal("partition", "closed empty after truncation; previous content kept");
		return -EINVAL;
	}
	if (f->wtotal == 0 || f->whave < f->wtotal)
		return -EINVAL;
	if (f->wend != (int64_t)f->wtotal + dlen) {
		char why[128];
		snprintf(why, sizeof(why),
			 "file is %" PRId64 " bytes, expected %" PRId64 "; previous content kept",
			 f->wend, (int64_t)f->wtotal + dlen);
		log_refusal("partition write", why);
		return -EINVAL;
	}
	if (!f->wdata) { /* header rewritten, data unchanged */
		if (!(f->wdata = xf_buf_new(&store->mem, dlen, &rc)))
			return rc;
		if (f->wbase)
			memcpy(f->wdata->data, f->buf->data, (size_t)dlen);
	}
	rc = mlfs_store_commit_part(store, f->v, f->rank, f->state, f->tensor, f->wdata);
	if (rc == -ESTALE)
		log_refusal("partition write", "the layout changed while the file was open");
	return rc;
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);
	int rc = f->err;
	(void)ino;

	if (rc == 0 && f->write && (f->dirty || (f->kind == K_PART && !f->wbase))) {
		if (f->kind == K_PART)
			rc = part_commit(f);
		else if (f->kind == K_CONFIG || f->kind == K_SCHEMA || f->kind == K_STEP)
			rc = ctl_try_commit(f, true);
		if (rc == 0) {
			f->dirty = false;
			f->wbase = true;
			if (f->kind == K_PART) { /* later writes restage from the new content */
				xf_buf_put(f->buf);
				f->buf = f->wdata;
				f->wdata = NULL;
				free(f->whdr);
				f->whdr = NULL;
				f->whave = f->wtotal = 0;
			}
		}
		if (rc)
			f->err = rc;
	}
	fuse_reply_err(req, -rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fh_free(FH(fi));
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* -------------------------------------------------------------- setattr */

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct target t;
	struct stat stb;
	int rc = target_get(ino, &t);

	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		rc = -EPERM;
	else if (to_set & FUSE_SET_ATTR_SIZE) {
		struct fh *f = fi ? FH(fi) : NULL;
		fill_attr(&t.e, t.v, &stb);
		if (t.e.kind == K_JOB)
			rc = attr->st_size > (off_t)MAX_JOB_FILE
				 ? -EFBIG
				 : mlfs_job_truncate(t.e.job, (size_t)attr->st_size);
		else if (f && f->write && attr->st_size == 0 &&
			 (f->kind == K_PART || f->kind == K_CONFIG || f->kind == K_SCHEMA ||
			  f->kind == K_STEP)) {
			/* ftruncate(fd, 0) on an open writer: restart staging */
			f->wlen = 0;
			f->whave = f->wtotal = 0;
			f->wbase = false;
			f->wend = 0;
			xf_buf_put(f->wdata);
			f->wdata = NULL;
		} else if (attr->st_size != stb.st_size) {
			rc = t.e.kind == K_PART ? -EINVAL : -EACCES;
		}
	}
	if (rc == 0 && t.e.kind == K_JOB &&
	    (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW))) {
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &t.e.job->mtime);
		else
			t.e.job->mtime = attr->st_mtim;
	}
	fill_attr(&t.e, t.v, &stb);
	target_done(&t);
	mlfs_view_put(t.v);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	stb.st_ino = ino;
	fuse_reply_attr(req, &stb, 0);
}

/* ------------------------------------------------------------ directories */

struct dirbuf {
	atomic_int refs; /* the open's and each readdir's (see struct fh) */
	char *p;
	size_t size, cap;
	size_t *ends; /* end offset of each entry */
	size_t n, capn;
};

static void dir_add(fuse_req_t req, struct dirbuf *b, const char *name, bool dir)
{
	struct stat st = {.st_ino = 0, .st_mode = dir ? S_IFDIR : S_IFREG};
	size_t n = fuse_add_direntry(req, NULL, 0, name, NULL, 0);
	if (b->size + n > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap < b->size + n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return;
		b->p = p;
		b->cap = cap;
	}
	if (b->n == b->capn) {
		size_t cap = b->capn ? b->capn * 2 : 64;
		size_t *e = realloc(b->ends, cap * sizeof(*e));
		if (!e)
			return;
		b->ends = e;
		b->capn = cap;
	}
	st.st_ino = path_hash(name, 0) | 1ull << 62;
	fuse_add_direntry(req, b->p + b->size, n, name, &st, (off_t)(b->size + n));
	b->size += n;
	b->ends[b->n++] = b->size;
}

/* ranks/<r>/data lists the views of the prefetch window from the rank's
 * saved step on (any reachable step can be opened by name). Lock held. */
static void list_views(fuse_req_t req, struct dirbuf *b, const struct mlfs_view *v, int rank)
{
	static const enum mlfs_dfile fixed[] = {MLFS_DF_NPY, MLFS_DF_IDS},
				     variable[] = {MLFS_DF_BIN, MLFS_DF_OFFSETS, MLFS_DF_IDS};
	bool isfixed = mlfs_dataset_index(v->ds)->records == PTC_RECORDS_FIXED;
	int64_t from = store->steps[rank] < 0 ? 0 : store->steps[rank], first, count;
	char name[64];
	int window = store->data_opts.prefetch < 1 ? 1 : store->data_opts.prefetch;

	for (int64_t s = from; s < from + window; s++) {
		if (mlfs_data_slice(v->ds, &v->cursor, s, v->layout.ranks[rank].d, &first, &count))
			break;
		for (int k = 0; k < (isfixed ? 2 : 3); k++) {
			mlfs_data_format_name(s, isfixed ? fixed[k] : variable[k], name,
					      sizeof(name));
			dir_add(req, b, name, false);
		}
	}
}

static void dirbuf_put(struct dirbuf *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
		free(b->p);
		free(b->ends);
		free(b);
	}
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct target t;
	struct dirbuf *b = calloc(1, sizeof(*b));
	int rc = b ? target_get(ino, &t) : -ENOMEM;
	char num[16];

	if (b)
		atomic_init(&b->refs, 1);
	if (rc) {
		free(b);
		fuse_reply_err(req, -rc);
		return;
	}
	dir_add(req, b, ".", true);
	dir_add(req, b, "..", true);
	switch (t.e.kind) {
	case K_ROOT:
		for (size_t i = 0; i < sizeof(root_files) / sizeof(root_files[0]); i++)
			if (root_files[i].kind != K_CTL)
				dir_add(req, b, root_files[i].name,
					root_files[i].kind == K_JOB ||
					    root_files[i].kind == K_RANKS ||
					    root_files[i].kind == K_FULL);
		break;
	case K_RANKS:
		if (t.v) {
			int r0 = t.v->layout.node_first_rank[store->node];
			for (int r = r0; r >= 0 && r < r0 + t.v->layout.node_nranks[store->node];
			     r++) {
				snprintf(num, sizeof(num), "%d", r);
				dir_add(req, b, num, true);
			}
		}
		break;
	case K_DDIR:
		list_views(req, b, t.v, t.e.rank);
		break;
	case K_RANK:
		dir_add(req, b, "rank.json", false);
		dir_add(req, b, "step", false);
		if (t.v->ds)
			dir_add(req, b, "data", true);
		t.e.tn = t.v->stage_tree[t.v->layout.ranks[t.e.rank].p];
		/* fall through */
	case K_TDIR:
	case K_FDIR:
	case K_FULL:
		if (t.e.kind == K_FULL)
			break;
		if (t.e.tn->tensor >= 0) {
			rc = -ENOTDIR;
			break;
		}
		for (int i = 0; i < t.e.tn->nchild; i++)
			dir_add(req, b, t.e.tn->child[i]->name, t.e.tn->child[i]->tensor < 0);
		break;
	case K_JOB:
		if (!t.e.job->dir) {
			rc = -ENOTDIR;
			break;
		}
		for (struct mlfs_job *c = t.e.job->first; c; c = c->next)
			dir_add(req, b, c->name, c->dir);
		break;
	default:
		rc = -ENOTDIR;
	}
	target_done(&t);
	mlfs_view_put(t.v);
	if (rc) {
		dirbuf_put(b);
		fuse_reply_err(req, -rc);
		return;
	}
	fi->fh = (uintptr_t)b;
	if (fuse_reply_open(req, fi)) {
		free(b->p);
		free(b->ends);
		free(b);
	}
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct dirbuf *b = (struct dirbuf *)(uintptr_t)fi->fh;
	(void)ino;
	if ((size_t)off >= b->size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	atomic_fetch_add(&b->refs, 1);
	/* Offsets are entry boundaries; send whole entries only. */
	size_t end = (size_t)off, o = (size_t)off;
	for (size_t i = 0; i < b->n; i++) {
		if (b->ends[i] <= o)
			continue;
		if (b->ends[i] - o > size)
			break;
		end = b->ends[i];
	}
	fuse_reply_buf(req, b->p + o, end - o);
	dirbuf_put(b);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	dirbuf_put((struct dirbuf *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

/* -------------------------------------------------------- job/ namespace */

/* Resolves a job/ directory for a namespace change; lock held on success. */
static int job_dir(fuse_ino_t parent, struct target *t)
{
	int rc = target_get(parent, t);
	if (rc)
		return rc;
	if (t->e.kind != K_JOB) {
		target_done(t);
		mlfs_view_put(t->v);
		return -EPERM; /* the rest of the tree is fixed by schema and config */
	}
	if (!t->e.job->dir) {
		target_done(t);
		mlfs_view_put(t->v);
		return -ENOTDIR;
	}
	return 0;
}

static void job_reply_entry(fuse_req_t req, struct target *t, const char *name, struct mlfs_job *j)
{
	char path[4096 + 256];
	struct ent e = {.kind = K_JOB, .job = j};
	snprintf(path, sizeof(path), "%s/%s", t->path, name);
	struct mlfs_view *v = t->v;
	reply_entry(req, path, &e, v); /* unlocks */
	mlfs_view_put(v);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct target t;
	struct mlfs_job *j;
	int rc = job_dir(parent, &t);
	(void)mode;
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if ((rc = mlfs_job_create(t.e.job, name, true, &j))) {
		target_done(&t);
		mlfs_view_put(t.v);
		fuse_reply_err(req, -rc);
		return;
	}
	job_reply_entry(req, &t, name, j);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct target t;
	struct mlfs_job *j;
	int rc = job_dir(parent, &t);
	(void)mode;

	if (rc) {
		/* O_CREAT on an existing fixed file arrives here only if the kernel
		 * saw no entry; fixed trees do not allow new names. */
		fuse_reply_err(req, rc == -EPERM ? EACCES : -rc);
		return;
	}
	rc = mlfs_job_create(t.e.job, name, false, &j);
	if (rc) {
		target_done(&t);
		mlfs_view_put(t.v);
		fuse_reply_err(req, -rc);
		return;
	}
	struct fuse_entry_param ep = {0};
	struct ent e = {.kind = K_JOB, .job = j};
	char path[4096 + 256];
	snprintf(path, sizeof(path), "%s/%s", t.path, name);
	fill_attr(&e, t.v, &ep.attr);
	target_done(&t);
	mlfs_view_put(t.v);
	struct fh *f = calloc(1, sizeof(*f));
	if (f)
		atomic_init(&f->refs, 1);
	if (!f || !(ep.ino = ino_lookup(path, 0, 0))) {
		free(f);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	f->kind = K_JOB;
	f->write = true;
	ep.attr.st_ino = ep.ino;
	fi->fh = (uintptr_t)f;
	fi->direct_io = 1;
	if (fuse_reply_create(req, &ep, fi)) {
		ino_forget(ep.ino, 1);
		fh_free(f);
	}
}

static void job_remove(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
	struct target t;
	int rc = job_dir(parent, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	rc = mlfs_job_unlink(t.e.job, name, dir);
	target_done(&t);
	mlfs_view_put(t.v);
	fuse_reply_err(req, -rc);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	job_remove(req, parent, name, false);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	job_remove(req, parent, name, true);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	char from[4096], to[4096];
	struct ent a, b;
	int rc = ino_path(parent, from, sizeof(from));
	if (rc == 0)
		rc = ino_path(newparent, to, sizeof(to));
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	pthread_mutex_lock(&store->lock);
	if (resolve(from, store->view, &a) || resolve(to, store->view, &b))
		rc = -ENOENT;
	else if (a.kind != K_JOB || b.kind != K_JOB)
		rc = -EPERM;
	else if (!a.job->dir || !b.job->dir)
		rc = -ENOTDIR;
	else
		rc = mlfs_job_rename(a.job, name, b.job, newname, flags);
	pthread_mutex_unlock(&store->lock);
	if (rc == 0) { /* the inode table maps paths: move the renamed subtree */
		char op[4096 + 256], np[4096 + 256];
		snprintf(op, sizeof(op), "%s/%s", from, name);
		snprintf(np, sizeof(np), "%s/%s", to, newname);
		size_t ol = strlen(op);
		pthread_mutex_lock(&inodes.lock);
		for (size_t i = 0; i < inodes.n; i++) {
			struct inode *in = inodes.byino[i];
			if (!in || strncmp(in->path, op, ol) != 0 ||
			    (in->path[ol] != '\0' && in->path[ol] != '/'))
				continue;
			char *p = NULL;
			if (asprintf(&p, "%s%s", np, in->path + ol) < 0)
				continue;
			*hash_slot(in->path, in->gen) = in->hnext;
			struct inode **slot = hash_slot(p, in->gen);
			if (*slot) { /* a stale inode of the replaced target */
				struct inode *old = *slot;
				*slot = old->hnext;
				free(old->path);
				old->path = strdup("\x01stale");
				old->hnext = NULL;
			}
			free(in->path);
			in->path = p;
			in->hnext = NULL;
			*hash_slot(p, in->gen) = in;
		}
		pthread_mutex_unlock(&inodes.lock);
	}
	fuse_reply_err(req, -rc);
}

static void op_refuse_name(fuse_req_t req)
{
	fuse_reply_err(req, EPERM);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent, (void)name, (void)mode, (void)rdev;
	op_refuse_name(req);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	(void)link, (void)parent, (void)name;
	op_refuse_name(req);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	(void)ino, (void)newparent, (void)newname;
	op_refuse_name(req);
}

/* ---------------------------------------------------------------- xattrs */

static const char XATTR[] = "user.mlfs.dtype";

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct target t;
	int rc = target_get(ino, &t);
	const char *val = NULL;

	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if ((t.e.kind == K_PART || t.e.kind == K_FFILE) && strcmp(name, XATTR) == 0)
		val = ptc_dtype_name(ptc_schema_dtype(store->schema, t.e.state, t.e.tensor));
	target_done(&t);
	mlfs_view_put(t.v);
	if (!val)
		fuse_reply_err(req, ENODATA);
	else if (size == 0)
		fuse_reply_xattr(req, strlen(val));
	else if (size < strlen(val))
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, val, strlen(val));
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct target t;
	int rc = target_get(ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	bool has = t.e.kind == K_PART || t.e.kind == K_FFILE;
	target_done(&t);
	mlfs_view_put(t.v);
	size_t n = has ? sizeof(XATTR) : 0;
	if (size == 0)
		fuse_reply_xattr(req, n);
	else if (size < n)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, XATTR, n);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	fuse_reply_err(req, ENOTSUP);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs s = {0};
	(void)ino;
	s.f_bsize = s.f_frsize = 4096;
	s.f_blocks = (fsblkcnt_t)(store->mem.limit / 4096);
	s.f_bfree = s.f_bavail = (fsblkcnt_t)((store->mem.limit - store->mem.used) / 4096);
	s.f_namemax = 255;
	fuse_reply_statfs(req, &s);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	conn->max_write = 1 << 20;
	conn->max_readahead = 1 << 20;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .flush = op_flush,
    .release = op_release,
    .fsync = op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .mkdir = op_mkdir,
    .create = op_create,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .mknod = op_mknod,
    .symlink = op_symlink,
    .link = op_link,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .setxattr = op_setxattr,
    .statfs = op_statfs,
};

/* ------------------------------------------------------------------- main */

static int64_t default_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	return pages > 0 && psize > 0 ? (int64_t)pages * psize / 10 * 9 : (int64_t)1 << 32;
}

/*
 * The kernel caps a FUSE mount's readahead at the block layer's default
 * (128 KiB), which halves cold sequential reads of large partitions. Raise
 * it to 1 MiB (our request size) when we may; the device number comes from
 * /proc/self/mountinfo because stat() on the mount would call into
 * ourselves before the loop runs.
 */
static void raise_readahead(const char *mountpoint)
{
	char real[PATH_MAX], line[8192], path[128];
	unsigned maj, min;
	FILE *f;

	if (!realpath(mountpoint, real) || !(f = fopen("/proc/self/mountinfo", "r")))
		return;
	while (fgets(line, sizeof(line), f)) {
		char mnt[4096];
		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &maj, &min, mnt) != 3 ||
		    strcmp(mnt, real) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
		FILE *ra = fopen(path, "w");
		if (ra) {
			fputs("4096\n", ra);
			fclose(ra);
		}
	}
	fclose(f);
}

int mlfs_daemon_run(const struct mlfs_options *o)
{
	struct ptc_error err = {""};
	struct ptc_cluster *cl;
	static struct mlfs_store st;
	size_t len;
	int rc = 1;

	FILE *fp = fopen(o->cluster_path, "rb");
	char *text = NULL;
	if (!fp) {
		fprintf(stderr, "mlfs mount: %s: %s\n", o->cluster_path, strerror(errno));
		return 1;
	}
	text = malloc(1 << 20);
	len = text ? fread(text, 1, (1 << 20) - 1, fp) : 0;
	fclose(fp);
	if (!text)
		return 1;
	text[len] = '\0';
	if (ptc_cluster_parse_text(text, len, o->cluster_path, &cl, &err)) {
		fprintf(stderr, "mlfs mount: %s\n", err.text);
		free(text);
		return 1;
	}
	int node = ptc_cluster_find(cl, o->node_id);
	if (node < 0) {
		fprintf(stderr, "mlfs mount: --node \"%s\" is not in %s\n", o->node_id,
			o->cluster_path);
		ptc_cluster_free(cl);
		free(text);
		return 1;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (mlfs_store_init(&st, cl, text, node, o->max_memory ? o->max_memory : default_memory(),
			    o->threads ? o->threads : (int)(cpus > 0 ? cpus : 1)) ||
	    inodes_init()) {
		fprintf(stderr, "mlfs mount: out of memory\n");
		return 1;
	}
	st.data_opts.cache_bytes = o->data_cache;
	st.data_opts.prefetch = o->prefetch < 0 ? 4 : o->prefetch;
	store = &st;
	owner_uid = getuid();
	owner_gid = getgid();

	char *argv[] = {"mlfs", "-o", "fsname=mlfs,subtype=mlfs,default_permissions", NULL};
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	fuse_opt_free_args(&args); /* the session keeps what it needs */
	if (!se)
		goto out_store;
	if (fuse_set_signal_handlers(se))
		goto out_session;
	if (fuse_session_mount(se, o->mountpoint)) {
		fprintf(stderr, "mlfs mount: cannot mount at %s\n", o->mountpoint);
		goto out_signals;
	}
	raise_readahead(o->mountpoint);
	fuse_daemonize(o->foreground);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	if (!lc)
		goto out_unmount;
	fuse_loop_cfg_set_max_threads(lc, 16);
	fuse_loop_cfg_set_idle_threads(lc, 8);
	rc = fuse_session_loop_mt(se, lc) ? 1 : 0;
	fuse_loop_cfg_destroy(lc);
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_store:
	mlfs_store_release(&st);
	inodes_release();
	return rc;
}
