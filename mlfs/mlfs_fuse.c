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

/* ---------------------------------------------------------------- inodes */

/*
 * The content a partition or full-tensor inode names, fixed for the inode's
 * life: the header and the buffers it was looked up with (one partition, or
 * the tp partitions a full tensor is assembled from). Every open of the
 * inode reads exactly this, so its kernel page cache and size can never mix
 * two versions. Reference-counted: the inode holds one, each open in
 * progress another. Pinned buffers stay counted in --max-memory until the
 * kernel forgets the inode (see notify_*: it is told to, after a commit).
 */
struct pin {
	atomic_int refs;
	int kind, rank, state, tensor; /* what it is (enum kind), for attributes */
	size_t hdr_len;
	char hdr[512];
	int nbufs; /* 1, or the layout's tp for a full tensor */
	struct xf_buf *bufs[];
};

static void pin_put(struct pin *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	for (int i = 0; i < p->nbufs; i++)
		xf_buf_put(p->bufs[i]);
	free(p);
}

static struct pin *pin_get(struct pin *p)
{
	if (p)
		atomic_fetch_add(&p->refs, 1);
	return p;
}

struct inode {
	uint64_t ino, nlookup;
	uint64_t gen;	 /* partitions, full tensors: identity of the pinned content */
	struct pin *pin; /* partitions and full tensors; NULL for the rest */
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

static void log_refusal(const char *what, const char *why);

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
			pin_put(inodes.byino[i]->pin);
			free(inodes.byino[i]->path);
			free(inodes.byino[i]);
		}
	free(inodes.byino);
	free(inodes.hash);
}

/* Path of @ino copied into @buf, and a reference to its pinned content into
 * @pin when given (NULL when it has none); -ESTALE when unknown. */
static int ino_get(fuse_ino_t ino, char *buf, size_t cap, struct pin **pin)
{
	int rc = -ESTALE;
	pthread_mutex_lock(&inodes.lock);
	if (ino < inodes.n && inodes.byino[ino]) {
		snprintf(buf, cap, "%s", inodes.byino[ino]->path);
		if (pin)
			*pin = pin_get(inodes.byino[ino]->pin);
		rc = 0;
	}
	pthread_mutex_unlock(&inodes.lock);
	return rc;
}

static int ino_path(fuse_ino_t ino, char *buf, size_t cap)
{
	return ino_get(ino, buf, cap, NULL);
}

static struct inode **hash_slot(const char *path, uint64_t gen)
{
	struct inode **pp = &inodes.hash[path_hash(path, gen) & (inodes.hcap - 1)];
	while (*pp && ((*pp)->gen != gen || strcmp((*pp)->path, path) != 0))
		pp = &(*pp)->hnext;
	return pp;
}

/* The inode of (@path, @gen), created if new, with one more lookup. A new
 * inode takes over @pin; an existing one keeps its own and @pin is put.
 * 0 on ENOMEM. */
static uint64_t ino_lookup(const char *path, uint64_t gen, struct pin *pin)
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
		in->pin = pin;
		pin = NULL;
		inodes.byino[in->ino] = in;
		*pp = in;
	}
	(*pp)->nlookup++;
	ino = (*pp)->ino;
out:
	pthread_mutex_unlock(&inodes.lock);
	pin_put(pin);
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
		} else {
			in = NULL;
		}
	} else {
		in = NULL;
	}
	pthread_mutex_unlock(&inodes.lock);
	if (in) { /* outside the lock: the last put of a pin frees buffers */
		pin_put(in->pin);
		free(in->path);
		free(in);
	}
}

/* --------------------------------------------------------- notifications */

/*
 * After a commit the kernel is told to drop the names whose content changed
 * (fuse_lowlevel_notify_inval_entry), so that it forgets the superseded
 * inodes as soon as no file holds them open, and their pinned buffers are
 * freed; without it they would stay until the next lookup of the same name
 * or memory pressure. A thread of its own sends them: the kernel takes the
 * directory's lock to drop a name, and a FUSE worker holding a request in
 * that directory must never wait for it. The queue is bounded: past
 * NOTIFY_MAX paths it collapses into one "everything" entry.
 */
#define NOTIFY_MAX 1024

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char *paths[NOTIFY_MAX];
	int n;
	bool all, stop, running;
	pthread_t thread;
	struct fuse_session *se;
} notes = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* Queues @path ("" = the whole ranks/ and full/ trees). Any thread. */
static void notify_path(const char *path)
{
	pthread_mutex_lock(&notes.lock);
	if (notes.running && !notes.all) {
		char *p = *path && notes.n < NOTIFY_MAX ? strdup(path) : NULL;
		if (p)
			notes.paths[notes.n++] = p;
		else
			notes.all = true;
		pthread_cond_signal(&notes.cond);
	}
	pthread_mutex_unlock(&notes.lock);
}

/* The store's "content changed" callback. */
static void notify_store_changed(void *arg, const char *prefix)
{
	(void)arg;
	notify_path(prefix);
}

/* Drops the kernel's name @path, if it knows its directory. */
static void notify_one(const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];
	uint64_t dino = 0;
	size_t dlen = slash ? (size_t)(slash - path) : 0;

	if (dlen >= sizeof(dir))
		return;
	memcpy(dir, path, dlen);
	dir[dlen] = '\0';
	pthread_mutex_lock(&inodes.lock);
	struct inode *in = *hash_slot(dir, 0);
	if (in)
		dino = in->ino;
	pthread_mutex_unlock(&inodes.lock);
	const char *name = slash ? slash + 1 : path;
	if (dino) /* an error means the kernel had no such name: nothing to drop */
		fuse_lowlevel_notify_inval_entry(notes.se, dino, name, strlen(name));
}

static void *notify_main(void *arg)
{
	char *batch[NOTIFY_MAX];
	(void)arg;
	pthread_mutex_lock(&notes.lock);
	for (;;) {
		while (!notes.n && !notes.all && !notes.stop)
			pthread_cond_wait(&notes.cond, &notes.lock);
		if (notes.stop)
			break;
		int n = notes.n;
		bool all = notes.all;
		memcpy(batch, notes.paths, (size_t)n * sizeof(batch[0]));
		notes.n = 0;
		notes.all = false;
		pthread_mutex_unlock(&notes.lock);
		if (all) {
			notify_one("ranks");
			notify_one("full");
		}
		for (int i = 0; i < n; i++) {
			if (!all)
				notify_one(batch[i]);
			free(batch[i]);
		}
		pthread_mutex_lock(&notes.lock);
	}
	for (int i = 0; i < notes.n; i++)
		free(notes.paths[i]);
	notes.n = 0;
	pthread_mutex_unlock(&notes.lock);
	return NULL;
}

static int notify_start(struct fuse_session *se)
{
	notes.se = se;
	notes.running = true;
	int rc = -pthread_create(&notes.thread, NULL, notify_main, NULL);
	if (rc)
		notes.running = false;
	return rc;
}

/* Stops the thread; call once the session is unmounted (a notification in
 * flight then fails instead of waiting for a request nobody serves). Returns
 * false when the thread is still stuck in the kernel after a few seconds
 * (the session must then outlive it: it is not destroyed). */
static bool notify_stop(void)
{
	pthread_mutex_lock(&notes.lock);
	bool running = notes.running;
	notes.stop = true;
	notes.running = false;
	pthread_cond_signal(&notes.cond);
	pthread_mutex_unlock(&notes.lock);
	if (!running)
		return true;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	return pthread_timedjoin_np(notes.thread, NULL, &until) == 0;
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

/* Fills @stb for @e, whose content is @pin's when given; lock held. */
static void fill_attr(const struct ent *e, const struct mlfs_view *v, const struct pin *pin,
		      struct stat *stb)
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
		stb->st_size = pin ? (off_t)(pin->hdr_len + (size_t)pin->bufs[0]->size)
				   : (off_t)(mlfs_part_header(store->schema, &v->layout, e->rank,
							      e->state, e->tensor, hdr,
							      sizeof(hdr)) +
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

/* The generation of an entity whose content changes, and for partitions and
 * full tensors a new pin of that content (into @pin, NULL for the rest): a
 * partition's generation is the id of its current buffer, a full tensor's a
 * hash of its sources' ids (bit 62 set), a dataset view's its samples (bit
 * 63 set); 0 for the rest. Lock held. 0 or -ENOMEM, -EIO. */
static int ent_pin(const struct mlfs_view *v, const struct ent *e, uint64_t *gen, struct pin **pin)
{
	*gen = 0;
	*pin = NULL;
	if (e->kind == K_DFILE) {
		uint64_t h = path_hash("", (uint64_t)e->first * 0x9e3779b97f4a7c15ull ^
					       (uint64_t)e->count << 8 ^ (uint64_t)e->dkind ^
					       e->whash * 31 ^ (uint64_t)e->nsteps << 40);
		*gen = h | 1ull << 63;
		return 0;
	}
	if (e->kind != K_PART && e->kind != K_FFILE)
		return 0;
	int n = e->kind == K_PART ? 1 : v->layout.tp;
	struct pin *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(p->bufs[0]));
	if (!p)
		return -ENOMEM;
	atomic_init(&p->refs, 1);
	p->nbufs = n;
	p->kind = e->kind;
	p->rank = e->rank;
	p->state = e->state;
	p->tensor = e->tensor;
	if (e->kind == K_PART) {
		p->bufs[0] = xf_buf_get(
		    v->parts.bufs[xf_parts_index(&v->parts, e->rank, e->state, e->tensor)]);
		p->hdr_len = mlfs_part_header(store->schema, &v->layout, e->rank, e->state,
					      e->tensor, p->hdr, sizeof(p->hdr));
		*gen = p->bufs[0]->id;
	} else {
		int rc = mlfs_view_full_sources(v, store->schema, store->node, e->state, e->tensor,
						p->bufs);
		if (rc < 0) {
			pin_put(p);
			return rc;
		}
		p->nbufs = rc;
		p->hdr_len = mlfs_full_header(store->schema, e->state, e->tensor, p->hdr,
					      sizeof(p->hdr));
		uint64_t h = 1469598103934665603ull;
		for (int i = 0; i < p->nbufs; i++)
			h = (h ^ p->bufs[i]->id) * 1099511628211ull;
		*gen = (h & ~(3ull << 62)) | 1ull << 62;
	}
	*pin = p;
	return 0;
}

/* Resolves an inode under the lock: path, view ref, entity, and for
 * partitions and full tensors the content the inode names. */
struct target {
	char path[4096];
	struct mlfs_view *v;
	struct ent e;
	struct pin *pin; /* a reference, or NULL */
	bool vanished;	 /* the path is gone from the current view; e is the pin's */
};

static int target_get(fuse_ino_t ino, struct target *t)
{
	int rc = ino_get(ino, t->path, sizeof(t->path), &t->pin);
	if (rc)
		return rc;
	pthread_mutex_lock(&store->lock);
	t->v = store->view;
	if (t->v)
		atomic_fetch_add(&t->v->refs, 1);
	rc = resolve(t->path, t->v, &t->e);
	t->vanished = false;
	if (rc && t->pin) {
		/* A reconfiguration removed the path after the lookup: the inode
		 * still names its content, which open files go on reading and
		 * whose attributes they ask for. */
		memset(&t->e, 0, sizeof(t->e));
		t->e.kind = (enum kind)t->pin->kind;
		t->e.rank = t->pin->rank;
		t->e.state = t->pin->state;
		t->e.tensor = t->pin->tensor;
		t->vanished = true;
		return 0;
	}
	if (rc) {
		pthread_mutex_unlock(&store->lock);
		mlfs_view_put(t->v);
		pin_put(t->pin);
		t->v = NULL;
		t->pin = NULL;
		return rc;
	}
	return 0; /* the lock is held */
}

/* Unlocks; the view and pin references stay the caller's (target_put). */
static void target_done(struct target *t)
{
	(void)t;
	pthread_mutex_unlock(&store->lock);
}

static void target_put(struct target *t)
{
	mlfs_view_put(t->v);
	pin_put(t->pin);
	t->v = NULL;
	t->pin = NULL;
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

/* Replies the entry of @e (lock held; unlocks). */
static void reply_entry(fuse_req_t req, const char *path, const struct ent *e,
			const struct mlfs_view *v)
{
	struct fuse_entry_param ep = {0};
	struct pin *pin;
	uint64_t gen;
	int rc = ent_pin(v, e, &gen, &pin);
	if (rc) {
		pthread_mutex_unlock(&store->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	fill_attr(e, v, pin, &ep.attr);
	ep.entry_timeout = ent_timeout(e, true);
	ep.attr_timeout = ent_timeout(e, false);
	pthread_mutex_unlock(&store->lock);
	if (!(ep.ino = ino_lookup(path, gen, pin))) {
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

/* Where a control text's top-level JSON value ends, found incrementally as
 * the text grows (a text written 4 KiB at a time is scanned once, and parsed
 * once, by the store, when it is complete). */
struct jscan {
	size_t pos;
	int depth;
	bool str, esc, started, done;
};

static void jscan_run(struct jscan *j, const char *t, size_t len)
{
	for (; j->pos < len && !j->done; j->pos++) {
		char c = t[j->pos];
		if (j->str) {
			if (j->esc)
				j->esc = false;
			else if (c == '\\')
				j->esc = true;
			else if (c == '"')
				j->str = false;
		} else if (c == '"') {
			j->str = true;
		} else if (c == '{' || c == '[') {
			j->depth++;
			j->started = true;
		} else if (c == '}' || c == ']') {
			j->done = --j->depth <= 0; /* closed, or unbalanced: parse and say */
		}
	}
}

/* An open file. Referenced by its open (until release) and by each read in
 * progress: a reply may still be read from its buffers after the kernel
 * completed the request and the file was released. Requests on one handle
 * can run at once (threads sharing a descriptor): @lock guards everything
 * a write, flush or setattr changes (text, staging, buf of a writer). */
struct fh {
	atomic_int refs;
	pthread_mutex_t lock;
	enum kind kind;
	struct mlfs_view *v;
	char *path; /* partitions and job/ files: for messages and notifications */
	int rank, state, tensor;
	bool write, dirty, committed, truncated;
	pid_t wpid; /* the thread of the last write */
	int err; /* sticky: a refused write */
	/* reading: a buffer snapshot behind a header, or a text */
	struct xf_buf *buf;
	char hdr[512];
	size_t hdr_len;
	char *text;
	size_t text_len;
	/* writing text files: the text, its capacity (counted in --max-memory) */
	char *w;
	size_t wlen, wcap;
	struct jscan scan;
	/* writing partitions: staged header and data */
	uint8_t *whdr;
	size_t whave, wtotal; /* header bytes held; declared header length (0 = unknown) */
	struct xf_buf *wdata;
	bool wbase; /* not truncated: unwritten bytes are the current content */
	/* fresh writers (see fresh_*): opened, not yet written nor truncated */
	fuse_ino_t ino;
	pid_t pid;
	struct fh *fresh_next;
	atomic_bool fresh_listed;
	int64_t wend;
	struct pin *pin; /* full tensors: the sources, until assembled at open */
	/* dataset views: a step's (nsteps 0), or a window's, one a step */
	struct mlfs_dview **views; /* [nviews] */
	int64_t nviews;
	enum mlfs_dfile dkind;
	int64_t step, first, count, nsteps;
};

static struct fh *fh_new(enum kind kind)
{
	struct fh *f = calloc(1, sizeof(*f));
	if (f) {
		atomic_init(&f->refs, 1);
		pthread_mutex_init(&f->lock, NULL);
		f->kind = kind;
	}
	return f;
}

static void fh_free(struct fh *f)
{
	if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	if (f->w)
		xf_mem_release(&store->mem, (int64_t)f->wcap + 1);
	pthread_mutex_destroy(&f->lock);
	free(f->path);
	xf_buf_put(f->buf);
	xf_buf_put(f->wdata);
	for (int64_t i = 0; i < f->nviews; i++)
		mlfs_dview_put(f->views[i]);
	free(f->views);
	mlfs_view_put(f->v);
	pin_put(f->pin);
	free(f->text);
	free(f->w);
	free(f->whdr);
	free(f);
}

/*
 * Without atomic O_TRUNC (see op_init) the kernel sends the truncation of an
 * open(O_TRUNC) as a setattr *without* the file handle, right after the
 * open, from the same thread. To apply it to that handle's staging (and not
 * to the content others read), writers are listed here from their open to
 * their first write or truncation, by inode and thread.
 */
static struct {
	pthread_mutex_t lock;
	struct fh *head;
} fresh = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void fresh_add(struct fh *f, fuse_ino_t ino, pid_t pid)
{
	pthread_mutex_lock(&fresh.lock);
	f->ino = ino;
	f->pid = pid;
	atomic_store(&f->fresh_listed, true);
	f->fresh_next = fresh.head;
	fresh.head = f;
	pthread_mutex_unlock(&fresh.lock);
}

/* Removes @f, or when @f is NULL the handle of (@ino, @pid), from the list;
 * returns it with a reference, or NULL. */
static struct fh *fresh_take(struct fh *f, fuse_ino_t ino, pid_t pid)
{
	struct fh *found = NULL;
	if (f && !atomic_load(&f->fresh_listed))
		return NULL;
	pthread_mutex_lock(&fresh.lock);
	for (struct fh **pp = &fresh.head; *pp; pp = &(*pp)->fresh_next) {
		struct fh *c = *pp;
		if (f ? c == f : c->ino == ino && c->pid == pid) {
			*pp = c->fresh_next;
			atomic_store(&c->fresh_listed, false);
			atomic_fetch_add(&c->refs, 1);
			found = c;
			break;
		}
	}
	pthread_mutex_unlock(&fresh.lock);
	return found;
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
	(void)fi; /* an inode's attributes are its pinned content's, open or not */
	fill_attr(&t.e, t.v, t.pin, &stb);
	double timeout = ent_timeout(&t.e, false);
	target_done(&t);
	target_put(&t);
	stb.st_ino = ino;
	fuse_reply_attr(req, &stb, timeout);
}

/* The most bytes a control file's text may have (documented in the README). */
static size_t text_limit(enum kind k)
{
	switch (k) {
	case K_SCHEMA:
		return MLFS_MAX_SCHEMA_TEXT;
	case K_CONFIG:
		return MLFS_MAX_CONFIG_TEXT;
	case K_CTL:
		return MLFS_MAX_CTL_TEXT;
	default:
		return 64; /* step */
	}
}

/* Writes @size bytes at @off of a control file's text; its buffer is
 * counted in --max-memory. f->lock held. 0, -EFBIG, -ENOSPC, -ENOMEM. */
static int text_append(struct fh *f, const char *buf, size_t size, off_t off)
{
	size_t end = (size_t)off + size;
	if (end > text_limit(f->kind) || (size_t)off > text_limit(f->kind)) {
		char what[128];
		snprintf(what, sizeof(what), "more than %zu bytes; refused", text_limit(f->kind));
		log_refusal(f->kind == K_SCHEMA	  ? "schema.json"
			    : f->kind == K_CONFIG ? "config.json"
			    : f->kind == K_CTL	  ? MLFS_CTL_NAME
						  : "step",
			    what);
		return -EFBIG;
	}
	if (end > f->wcap || !f->w) {
		size_t cap = f->wcap ? f->wcap : 4096;
		while (cap < end)
			cap *= 2;
		int64_t more = (int64_t)cap + 1 - (f->w ? (int64_t)f->wcap + 1 : 0);
		int rc = xf_mem_reserve(&store->mem, more);
		if (rc)
			return rc;
		char *w = realloc(f->w, cap + 1);
		if (!w) {
			xf_mem_release(&store->mem, more);
			return -ENOMEM;
		}
		f->w = w;
		f->wcap = cap;
	}
	if ((size_t)off > f->wlen)
		memset(f->w + f->wlen, 0, (size_t)off - f->wlen);
	if ((size_t)off < f->scan.pos) /* rewrites what was scanned: scan again */
		memset(&f->scan, 0, sizeof(f->scan));
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
	if (t.vanished && write) { /* only its old content is left: to read */
		target_done(&t);
		target_put(&t);
		fuse_reply_err(req, ENOENT);
		return;
	}
	rc = -ENOMEM;
	if (!(f = fh_new(t.e.kind)))
		goto out_locked;
	f->v = t.v;
	t.v = NULL;
	f->rank = t.e.rank;
	f->state = t.e.state;
	f->tensor = t.e.tensor;
	f->write = write;
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
	case K_PART:
		if (write && store->state == MLFS_TRANSFORMING) {
			rc = -EBUSY;
			break;
		}
		if (write && !(f->path = strdup(t.path))) {
			rc = -ENOMEM;
			break;
		}
		if (write || !t.pin) { /* writers stage against the current content */
			size_t i = xf_parts_index(&f->v->parts, f->rank, f->state, f->tensor);
			f->buf = xf_buf_get(f->v->parts.bufs[i]);
			f->hdr_len = mlfs_part_header(store->schema, &f->v->layout, f->rank,
						      f->state, f->tensor, f->hdr, sizeof(f->hdr));
		} else { /* readers read what the inode names */
			f->buf = xf_buf_get(t.pin->bufs[0]);
			memcpy(f->hdr, t.pin->hdr, t.pin->hdr_len);
			f->hdr_len = t.pin->hdr_len;
		}
		f->wbase = !(fi->flags & O_TRUNC);
		rc = 0;
		break;
	case K_FFILE:
		rc = write ? -EACCES : t.pin ? 0 : -ESTALE;
		if (rc == 0) {
			f->pin = pin_get(t.pin);
			memcpy(f->hdr, t.pin->hdr, t.pin->hdr_len);
			f->hdr_len = t.pin->hdr_len;
		}
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
	target_put(&t);
	if (rc == 0 && f->kind == K_STATUS) {
		f->text = mlfs_store_status_json(store);
		f->text_len = f->text ? strlen(f->text) : 0;
		rc = f->text ? 0 : -ENOMEM;
	}
	if (rc == 0 && f->kind == K_DFILE)
		rc = open_view(f);
	if (rc == 0 && f->kind == K_FFILE) {
		rc = mlfs_full_assemble(store->schema, f->state, f->tensor, f->pin->bufs,
					f->pin->nbufs, &store->mem, &f->buf);
		pin_put(f->pin);
		f->pin = NULL;
	}
	if (rc) {
		fh_free(f);
		fuse_reply_err(req, -rc);
		return;
	}
	if ((f->kind == K_PART || f->kind == K_FFILE) && !write)
		fi->keep_cache = 1; /* this inode's pages are its pinned content's */
	else if (f->kind == K_DFILE)
		fi->direct_io = 1; /* read once: straight to the reader, no page cache */
	else if (f->kind == K_PART)
		fi->direct_io = 1; /* nothing staged reaches the page cache */
	fi->noflush = !write;	   /* a reader's flush does nothing: spare the round trip */
	fi->fh = (uintptr_t)f;
	if (write && (f->kind == K_PART || f->kind == K_CONFIG || f->kind == K_SCHEMA ||
		      f->kind == K_STEP))
		fresh_add(f, ino, fuse_req_ctx(req)->pid);
	if (fuse_reply_open(req, fi)) {
		fh_free(fresh_take(f, 0, 0));
		fh_free(f);
	}
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
		pthread_mutex_lock(&f->lock); /* a writer's flush replaces buf */
		struct xf_buf *b = xf_buf_get(f->buf);
		pthread_mutex_unlock(&f->lock);
		reply_parts(req, f->hdr, f->hdr_len, b->data, (size_t)b->size, size, off, true);
		xf_buf_put(b);
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
		target_put(&t);
		if (len && !copy)
			fuse_reply_err(req, ENOMEM);
		else
			fuse_reply_buf(req, copy, len);
		free(copy);
		return;
	}
	/* A text: the open's snapshot, or .mlfs-ctl's last reply, which a write
	 * on the same handle may replace meanwhile: copy the range under the
	 * lock. */
	pthread_mutex_lock(&f->lock);
	size_t n = f->text ? f->text_len : 0, o = (size_t)off;
	size_t len = o < n ? (size < n - o ? size : n - o) : 0;
	char *copy = len ? malloc(len) : NULL;
	if (copy)
		memcpy(copy, f->text + o, len);
	pthread_mutex_unlock(&f->lock);
	if (len && !copy)
		fuse_reply_err(req, ENOMEM);
	else
		fuse_reply_buf(req, copy, len);
	free(copy);
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
	char msg[PTC_ERROR_MAX];
	snprintf(msg, sizeof(msg), "%.300s: %.200s", what, why);
	mlfs_store_note_error(store, msg);
}

/* Queues the names whose content a commit of (rank, state, tensor) of @v
 * changed: the partition and its full tensor. */
static void notify_part(const struct mlfs_view *v, int rank, int state, int tensor)
{
	const struct ptc_schema *s = store->schema;
	char path[4096];
	(void)v;
	snprintf(path, sizeof(path), "ranks/%d/%s/%s.npy", rank, s->states[state].name,
		 s->tensors[tensor].name);
	notify_path(path);
	snprintf(path, sizeof(path), "full/%s/%s.npy", s->states[state].name,
		 s->tensors[ptc_schema_logical(s, tensor)].name);
	notify_path(path);
}

/* Records why a write to @f's partition was refused; returns -EINVAL. */
static int part_refuse(const struct fh *f, const char *why)
{
	log_refusal(f->path ? f->path : "partition", why);
	return -EINVAL;
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
	return rc ? part_refuse(f, why) : 0;
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
				return part_refuse(f, "the .npy header must be written first, "
						      "in order");
			size_t n = size < cap - (size_t)off ? size : cap - (size_t)off;
			memcpy(f->whdr + off, buf, n);
			if ((size_t)off + n > f->whave)
				f->whave = (size_t)off + n;
			int64_t decl = npy_declared_len(f->whdr, f->whave);
			if (decl < 0)
				return part_refuse(f, "not a .npy file (bad magic, version or "
						      "header length)");
			if (f->wtotal && decl && (size_t)decl != f->wtotal)
				return part_refuse(f, "the .npy header length changed while "
						      "writing");
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
			return part_refuse(f, "data written before the .npy header was complete");
		int64_t d = off - (int64_t)f->wtotal;
		if (d + (int64_t)size > dlen)
			return part_refuse(f, "written past the partition's size");
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

/* Applies a control text: config.json and schema.json at the write that
 * completes their JSON value (parsed once, then), .mlfs-ctl at every write
 * (one request each), step and any text that never completed at the flush
 * (@final). f->lock held. */
static int ctl_try_commit(struct fh *f, bool final)
{
	struct ptc_error err = {""};
	const char *w = f->w ? f->w : "";
	int rc = 0;

	if (f->committed)
		return 0;
	if (!final && (f->kind == K_CONFIG || f->kind == K_SCHEMA)) {
		jscan_run(&f->scan, w, f->wlen);
		if (!f->scan.done)
			return 0; /* incomplete yet */
	} else if (!final && f->kind != K_CTL) {
		return 0;
	}
	switch (f->kind) {
	case K_CONFIG:
		rc = mlfs_store_set_config(store, w, f->wlen, &err);
		break;
	case K_SCHEMA:
		rc = mlfs_store_set_schema(store, w, f->wlen, &err);
		break;
	case K_STEP:
		rc = mlfs_store_set_step(store, f->rank, w, f->wlen, &err);
		if (rc == -EINVAL)
			log_refusal("step", err.text);
		break;
	case K_CTL: {
		char *reply = NULL;
		rc = mlfs_store_control(store, w, f->wlen, &reply);
		free(f->text);
		f->text = reply;
		f->text_len = reply ? strlen(reply) : 0;
		f->wlen = 0;
		return rc;
	}
	default:
		break;
	}
	f->committed = true;
	return rc;
}

/* Writes to a job/ file (store lock taken here). */
static int job_write(fuse_ino_t ino, const char *buf, size_t size, off_t off)
{
	struct target t;
	int rc = target_get(ino, &t);
	if (rc)
		return rc;
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
	target_put(&t);
	return rc;
}

static bool all_space(const char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t')
			return false;
	return true;
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);

	fh_free(fresh_take(f, 0, 0)); /* written: no longer fresh */
	pthread_mutex_lock(&f->lock);
	int rc = f->err;
	if (rc == 0) {
		switch (f->kind) {
		case K_PART:
			rc = part_write(f, (const uint8_t *)buf, size, off);
			break;
		case K_JOB:
			rc = job_write(ino, buf, size, off);
			break;
		case K_CONFIG:
		case K_SCHEMA:
		case K_STEP:
		case K_CTL:
			if (f->committed) /* one text per open; trailing blanks are harmless */
				rc = all_space(buf, size) ? 0 : -EINVAL;
			else if ((rc = text_append(f, buf, size, f->kind == K_CTL ? 0 : off)) == 0)
				rc = ctl_try_commit(f, f->kind == K_CTL);
			break;
		default:
			rc = -EACCES;
		}
	}
	if (rc == 0) {
		f->dirty = true;
		f->wpid = fuse_req_ctx(req)->pid;
	} else if (f->kind == K_PART || f->kind == K_CONFIG || f->kind == K_SCHEMA)
		f->err = rc;
	pthread_mutex_unlock(&f->lock);
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_write(req, size);
}

/* Commits a staged partition write; 0 or a negative errno. f->lock held. */
static int part_commit(struct fh *f)
{
	int64_t dlen = (int64_t)f->buf->size;
	int rc;

	if (!f->whdr || f->wtotal == 0 || f->whave < f->wtotal)
		return part_refuse(f, "closed before its header was complete; previous content "
				      "kept");
	if (f->wend != (int64_t)f->wtotal + dlen) {
		char why[128];
		snprintf(why, sizeof(why),
			 "file is %" PRId64 " bytes, expected %" PRId64 "; previous content kept",
			 f->wend, (int64_t)f->wtotal + dlen);
		return part_refuse(f, why);
	}
	if (!f->wdata) { /* header rewritten, data unchanged */
		if (!(f->wdata = xf_buf_new(&store->mem, dlen, &rc)))
			return rc;
		if (f->wbase)
			memcpy(f->wdata->data, f->buf->data, (size_t)dlen);
	}
	rc = mlfs_store_commit_part(store, f->v, f->rank, f->state, f->tensor, f->wdata);
	if (rc == -ESTALE)
		part_refuse(f, "the layout changed while the file was open");
	else if (rc == -EBUSY)
		part_refuse(f, "a reconfiguration is running; previous content kept");
	if (rc)
		return rc;
	/* Later writes restage from the new content. */
	xf_buf_put(f->buf);
	f->buf = f->wdata;
	f->wdata = NULL;
	free(f->whdr);
	f->whdr = NULL;
	f->whave = f->wtotal = 0;
	f->wbase = true;
	f->committed = true;
	notify_part(f->v, f->rank, f->state, f->tensor);
	return 0;
}

/* Whether a partition's staged content is whole: header and every byte.
 * f->lock held. */
static bool part_complete(const struct fh *f)
{
	return f->whdr && f->wtotal && f->whave >= f->wtotal &&
	       f->wend == (int64_t)f->wtotal + f->buf->size;
}

/*
 * Every close of a descriptor of the file (its duplicates, a forked child's
 * copies closed at its exec) sends a flush; the last one is followed by the
 * release. A flush commits what was written since the open or the last
 * commit when it is complete, or when the thread that wrote last closes: a
 * partition must then be whole (else EINVAL, previous content kept), a
 * control text applies. Other flushes do nothing: a shell redirect opens
 * with O_TRUNC, duplicates the descriptor and closes the original before
 * anything is written; a child forked by the writer closes its copy at
 * exec, in the middle of the writer's writes. What is still incomplete at
 * the release is refused there (status.json says why).
 */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);
	(void)ino;

	pthread_mutex_lock(&f->lock);
	int rc = f->err;
	bool writer = fuse_req_ctx(req)->pid == f->wpid;
	if (rc == 0 && f->write && f->dirty &&
	    (writer || (f->kind == K_PART ? part_complete(f)
				       : f->kind == K_STEP || f->committed))) {
		if (f->kind == K_PART)
			rc = part_commit(f);
		else if (f->kind == K_CONFIG || f->kind == K_SCHEMA || f->kind == K_STEP)
			rc = ctl_try_commit(f, true);
		if (rc == 0)
			f->dirty = false;
		else
			f->err = rc;
	}
	pthread_mutex_unlock(&f->lock);
	fuse_reply_err(req, -rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fh *f = FH(fi);
	(void)ino;

	fh_free(fresh_take(f, 0, 0));
	if (f->kind == K_PART && f->write) {
		pthread_mutex_lock(&f->lock);
		if (f->err == 0 && f->dirty) /* written after the last commit */
			part_commit(f);
		else if (f->err == 0 && f->truncated && !f->committed)
			part_refuse(f, "truncated, then closed without a write; previous content "
				       "kept");
		pthread_mutex_unlock(&f->lock);
	} else if (f->write && (f->kind == K_CONFIG || f->kind == K_SCHEMA || f->kind == K_STEP)) {
		pthread_mutex_lock(&f->lock); /* closed by a thread that did not write it */
		if (f->err == 0 && f->dirty && !f->committed)
			ctl_try_commit(f, true); /* a refusal is in status.json */
		pthread_mutex_unlock(&f->lock);
	}
	fh_free(f);
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
	bool restaged = false;
	struct fh *f = fresh_take(fi ? FH(fi) : NULL, ino, fuse_req_ctx(req)->pid);

	if (!f && fi)
		f = FH(fi), atomic_fetch_add(&f->refs, 1);
	/* open(O_TRUNC) or ftruncate(fd, 0) on an open writer: restart its
	 * staging. The inode keeps its size (its content is unchanged until a
	 * commit); the lock is the handle's, taken before the store's. */
	if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size == 0 && f && f->write &&
	    (f->kind == K_PART || f->kind == K_CONFIG || f->kind == K_SCHEMA ||
	     f->kind == K_STEP)) {
		pthread_mutex_lock(&f->lock);
		f->wlen = 0;
		memset(&f->scan, 0, sizeof(f->scan));
		f->whave = f->wtotal = 0;
		f->wbase = false;
		f->truncated = true;
		f->wend = 0;
		xf_buf_put(f->wdata);
		f->wdata = NULL;
		free(f->whdr);
		f->whdr = NULL;
		pthread_mutex_unlock(&f->lock);
		restaged = true;
	}
	fh_free(f);
	int rc = target_get(ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (t.vanished && !restaged)
		rc = -ENOENT;
	else if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		rc = -EPERM;
	else if ((to_set & FUSE_SET_ATTR_SIZE) && !restaged) {
		fill_attr(&t.e, t.v, t.pin, &stb);
		if (t.e.kind == K_JOB)
			rc = attr->st_size > (off_t)MAX_JOB_FILE
				 ? -EFBIG
				 : mlfs_job_truncate(t.e.job, (size_t)attr->st_size);
		else if (attr->st_size != stb.st_size) {
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
	fill_attr(&t.e, t.v, t.pin, &stb);
	target_done(&t);
	target_put(&t);
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
	target_put(&t);
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
		target_put(t);
		return -EPERM; /* the rest of the tree is fixed by schema and config */
	}
	if (!t->e.job->dir) {
		target_done(t);
		target_put(t);
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
		target_put(&t);
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
		/* O_CREAT of a new name: fixed trees do not allow new names (EPERM,
		 * as mkdir, unlink and rename there). */
		fuse_reply_err(req, -rc);
		return;
	}
	rc = mlfs_job_create(t.e.job, name, false, &j);
	if (rc) {
		target_done(&t);
		target_put(&t);
		fuse_reply_err(req, -rc);
		return;
	}
	struct fuse_entry_param ep = {0};
	struct ent e = {.kind = K_JOB, .job = j};
	char path[4096 + 256];
	snprintf(path, sizeof(path), "%s/%s", t.path, name);
	fill_attr(&e, t.v, NULL, &ep.attr);
	target_done(&t);
	target_put(&t);
	struct fh *f = fh_new(K_JOB);
	if (!f || !(ep.ino = ino_lookup(path, 0, NULL))) {
		fh_free(f);
		fuse_reply_err(req, ENOMEM);
		return;
	}
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
	target_put(&t);
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
	target_put(&t);
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
	target_put(&t);
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
	/* No atomic O_TRUNC: with it the kernel sets the size of the inode a
	 * writer opened to 0 and drops its pages, under the feet of readers of
	 * the same inode (the same version). Without it, open(O_TRUNC) arrives
	 * as a setattr on the writer's handle, which restarts its staging and
	 * answers the inode's unchanged size. */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
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

/* The text of cluster.json (a regular file of at most 1 MiB; a FIFO is
 * refused, not waited on), or NULL with a message on stderr. */
static char *read_cluster(const char *path, size_t *len)
{
	const size_t max = (size_t)1 << 20;
	struct stat sb;
	char *text = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);

	if (fd < 0 || fstat(fd, &sb) < 0) {
		fprintf(stderr, "mlfs mount: %s: %s\n", path, strerror(errno));
	} else if (!S_ISREG(sb.st_mode)) {
		fprintf(stderr, "mlfs mount: %s: not a regular file\n", path);
	} else if ((size_t)sb.st_size > max) {
		fprintf(stderr, "mlfs mount: %s: %lld bytes, more than the limit %zu\n", path,
			(long long)sb.st_size, max);
	} else if (!(text = malloc((size_t)sb.st_size + 1))) {
		fprintf(stderr, "mlfs mount: out of memory\n");
	} else {
		ssize_t n = pread(fd, text, (size_t)sb.st_size, 0);
		if (n != (ssize_t)sb.st_size) {
			fprintf(stderr, "mlfs mount: %s: %s\n", path,
				n < 0 ? strerror(errno) : "changed while read");
			free(text);
			text = NULL;
		} else {
			text[n] = '\0';
			*len = (size_t)n;
		}
	}
	if (fd >= 0)
		close(fd);
	return text;
}

/*
 * Refuses a mount point that is not an empty-handed directory: a dead mount
 * left by a killed daemon (stat fails with ENOTCONN) or a live one would
 * otherwise be stacked under ours and resurface, stale, at our unmount.
 * 0, or 1 with a message on stderr.
 */
static int check_mountpoint(const char *mnt)
{
	char real[PATH_MAX], line[8192];
	struct statvfs vfs;
	struct stat sb;
	int busy = 0;

	/* statfs always asks the file system (stat may answer from a cache). */
	if (statvfs(mnt, &vfs) < 0 || stat(mnt, &sb) < 0) {
		if (errno == ENOTCONN)
			fprintf(stderr,
				"mlfs mount: %s: a dead mount is still there (its daemon was "
				"killed); run \"mlfs umount %s\" first\n",
				mnt, mnt);
		else
			fprintf(stderr, "mlfs mount: %s: %s\n", mnt, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "mlfs mount: %s: not a directory\n", mnt);
		return 1;
	}
	FILE *f = realpath(mnt, real) ? fopen("/proc/self/mountinfo", "r") : NULL;
	while (f && !busy && fgets(line, sizeof(line), f)) {
		char at[4096];
		busy = sscanf(line, "%*d %*d %*u:%*u %*s %4095s", at) == 1 && strcmp(at, real) == 0;
	}
	if (f)
		fclose(f);
	if (busy)
		fprintf(stderr,
			"mlfs mount: %s is already a mount point; unmount it first "
			"(\"mlfs umount %s\")\n",
			mnt, mnt);
	return busy;
}

int mlfs_daemon_run(const struct mlfs_options *o)
{
	struct ptc_error err = {""};
	struct ptc_cluster *cl;
	static struct mlfs_store st;
	size_t len;
	int rc = 1;

	if (check_mountpoint(o->mountpoint))
		return 1;
	char *text = read_cluster(o->cluster_path, &len);
	if (!text)
		return 1;
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
	st.data_opts.http_timeout_ms = o->http_timeout_ms;
	st.data_opts.http_deadline_ms = o->http_deadline_ms;
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
	if (notify_start(se) == 0) {
		st.changed = notify_store_changed;
		rc = fuse_session_loop_mt(se, lc) ? 1 : 0;
	} else {
		fprintf(stderr, "mlfs mount: cannot start a thread\n");
	}
	fuse_loop_cfg_destroy(lc);
out_unmount:
	fuse_session_unmount(se);
	if (!notify_stop()) {
		fprintf(stderr, "mlfs mount: a kernel notification did not return; exiting "
				"without closing the session\n");
		return rc;
	}
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_store:
	mlfs_store_release(&st);
	inodes_release();
	return rc;
}
