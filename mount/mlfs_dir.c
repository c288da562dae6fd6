/*
 * mlfs_dir.c - directories and the job/ namespace.
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

#include "mount/mount_i.h"

struct dirbuf {
	atomic_int refs; /* the open's and each readdir's (see struct mlfs_fh) */
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
	st.st_ino = mlfs_path_hash(name, 0) | 1ull << 62;
	fuse_add_direntry(req, b->p + b->size, n, name, &st, (off_t)(b->size + n));
	b->size += n;
	b->ends[b->n++] = b->size;
}

/* ranks/<r>/data lists the views of the prefetch window from the rank's
 * saved step on (any reachable step can be opened by name). Lock held. */
static void list_views(fuse_req_t req, struct dirbuf *b, const struct mlfs_view *v, int rank)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	static const enum mlfs_dfile fixed[] = {MLFS_DF_NPY, MLFS_DF_IDS},
				     variable[] = {MLFS_DF_BIN, MLFS_DF_OFFSETS, MLFS_DF_IDS};
	bool isfixed = mlfs_dataset_index(v->ds)->records == PTC_RECORDS_FIXED;
	int64_t from = d->st->steps[rank] < 0 ? 0 : d->st->steps[rank], first, count;
	char name[64];
	int window = d->st->data_opts.prefetch < 1 ? 1 : d->st->data_opts.prefetch;

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

static struct dirbuf *dirbuf_get(struct dirbuf *b)
{
	atomic_fetch_add(&b->refs, 1);
	return b;
}

static void dirbuf_put(struct dirbuf *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
		free(b->p);
		free(b->ends);
		free(b);
	}
}

void mlfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	struct dirbuf *b = calloc(1, sizeof(*b));
	int rc = b ? mlfs_target_get(d, ino, &t) : -ENOMEM;
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
	case MLFS_K_ROOT:
		for (size_t i = 0; mlfs_root_files[i].name; i++)
			if (mlfs_root_files[i].kind != MLFS_K_CTL)
				dir_add(req, b, mlfs_root_files[i].name,
					mlfs_root_files[i].kind == MLFS_K_JOB ||
					    mlfs_root_files[i].kind == MLFS_K_RANKS ||
					    mlfs_root_files[i].kind == MLFS_K_FULL);
		break;
	case MLFS_K_RANKS:
		if (t.v) {
			int r0 = t.v->layout.node_first_rank[d->st->node];
			for (int r = r0; r >= 0 && r < r0 + t.v->layout.node_nranks[d->st->node];
			     r++) {
				snprintf(num, sizeof(num), "%d", r);
				dir_add(req, b, num, true);
			}
		}
		break;
	case MLFS_K_DDIR:
		list_views(req, b, t.v, t.e.rank);
		break;
	case MLFS_K_RANK:
		dir_add(req, b, "rank.json", false);
		dir_add(req, b, "step", false);
		if (t.v->ds)
			dir_add(req, b, "data", true);
		t.e.tn = t.v->stage_tree[t.v->layout.ranks[t.e.rank].p];
		/* fall through */
	case MLFS_K_TDIR:
	case MLFS_K_FDIR:
	case MLFS_K_FULL:
		if (t.e.kind == MLFS_K_FULL)
			break;
		if (!mlfs_tnode_is_dir(t.e.tn)) {
			rc = -ENOTDIR;
			break;
		}
		for (int i = 0; i < t.e.tn->nchild; i++)
			dir_add(req, b, t.e.tn->child[i]->name,
				mlfs_tnode_is_dir(t.e.tn->child[i]));
		break;
	case MLFS_K_JOB:
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
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	if (rc) {
		dirbuf_put(b);
		fuse_reply_err(req, -rc);
		return;
	}
	fi->fh = (uintptr_t)b;
	if (fuse_reply_open(req, fi))
		dirbuf_put(b);
}

void mlfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct dirbuf *b = (struct dirbuf *)(uintptr_t)fi->fh;
	(void)ino;
	if ((size_t)off >= b->size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	dirbuf_get(b);
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

void mlfs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	dirbuf_put((struct dirbuf *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

/* Resolves a job/ directory for a namespace change; lock held on success. */
static int job_dir(struct mlfs_daemon *d, fuse_ino_t parent, struct mlfs_target *t)
{
	int rc = mlfs_target_get(d, parent, t);
	if (rc)
		return rc;
	if (t->e.kind != MLFS_K_JOB) {
		mlfs_target_done(t);
		mlfs_target_put(t);
		return -EPERM; /* the rest of the tree is fixed by schema and config */
	}
	if (!t->e.job->dir) {
		mlfs_target_done(t);
		mlfs_target_put(t);
		return -ENOTDIR;
	}
	return 0;
}

static void job_reply_entry(fuse_req_t req, struct mlfs_target *t, const char *name,
			    struct mlfs_job *j)
{
	char path[4096 + 256];
	struct mlfs_ent e = {.kind = MLFS_K_JOB, .job = j};
	snprintf(path, sizeof(path), "%s/%s", t->path, name);
	struct mlfs_view *v = t->v;
	mlfs_reply_entry(req, path, &e, v); /* unlocks */
	mlfs_view_put(v);
}

/* Creates @name (a directory when @isdir) in job/ directory @parent: 0 with
 * the store lock held and *@t, *@j set, or an error already replied (a
 * name outside job/ is EPERM: the rest of the tree is fixed, as for mkdir,
 * unlink and rename there). */
static int job_new_entry(fuse_req_t req, fuse_ino_t parent, const char *name, bool isdir,
			 struct mlfs_target *t, struct mlfs_job **j)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	int rc = job_dir(d, parent, t);

	if (rc == 0 && (rc = mlfs_job_create(t->e.job, name, isdir, j))) {
		mlfs_target_done(t);
		mlfs_target_put(t);
	} else if (rc == 0) {
		mlfs_store_job_changed(d->st);
	}
	if (rc)
		fuse_reply_err(req, -rc);
	return rc;
}

void mlfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct mlfs_target t;
	struct mlfs_job *j;
	(void)mode;
	if (job_new_entry(req, parent, name, true, &t, &j) == 0)
		job_reply_entry(req, &t, name, j);
}

void mlfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		    struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	struct mlfs_job *j;
	(void)mode;
	if (job_new_entry(req, parent, name, false, &t, &j))
		return;
	struct fuse_entry_param ep = {0};
	struct mlfs_ent e = {.kind = MLFS_K_JOB, .job = j};
	char path[4096 + 256];
	snprintf(path, sizeof(path), "%s/%s", t.path, name);
	mlfs_fill_attr(d, &e, t.v, NULL, &ep.attr);
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	struct mlfs_fh *f = mlfs_fh_new(d, MLFS_K_JOB);
	if (!f || !(ep.ino = mlfs_ino_lookup(d, path, 0, NULL))) {
		mlfs_fh_put(f);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	f->write = true;
	ep.attr.st_ino = ep.ino;
	fi->fh = (uintptr_t)f;
	fi->direct_io = 1;
	if (fuse_reply_create(req, &ep, fi)) {
		mlfs_ino_forget(d, ep.ino, 1);
		mlfs_fh_put(f);
	}
}

static void job_remove(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	int rc = job_dir(d, parent, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if ((rc = mlfs_job_unlink(t.e.job, name, dir)) == 0)
		mlfs_store_job_changed(d->st);
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	fuse_reply_err(req, -rc);
}

void mlfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	job_remove(req, parent, name, false);
}

void mlfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	job_remove(req, parent, name, true);
}

void mlfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		    const char *newname, unsigned int flags)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	char from[4096], to[4096];
	struct mlfs_ent a, b;
	int rc = mlfs_ino_path(d, parent, from, sizeof(from));
	if (rc == 0)
		rc = mlfs_ino_path(d, newparent, to, sizeof(to));
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	pthread_mutex_lock(&d->st->lock);
	if (mlfs_resolve(d, from, d->st->view, &a) || mlfs_resolve(d, to, d->st->view, &b))
		rc = -ENOENT;
	else if (a.kind != MLFS_K_JOB || b.kind != MLFS_K_JOB)
		rc = -EPERM;
	else if (!a.job->dir || !b.job->dir)
		rc = -ENOTDIR;
	else if ((rc = mlfs_job_rename(a.job, name, b.job, newname, flags)) == 0)
		mlfs_store_job_changed(d->st);
	pthread_mutex_unlock(&d->st->lock);
	if (rc == 0) { /* the inode table maps paths: move the renamed subtree */
		char op[4096 + 256], np[4096 + 256];
		snprintf(op, sizeof(op), "%s/%s", from, name);
		snprintf(np, sizeof(np), "%s/%s", to, newname);
		size_t ol = strlen(op);
		pthread_mutex_lock(&d->inodes.lock);
		for (size_t i = 0; i < d->inodes.n; i++) {
			struct mlfs_inode *in = d->inodes.byino[i];
			if (!in || strncmp(in->path, op, ol) != 0 ||
			    (in->path[ol] != '\0' && in->path[ol] != '/'))
				continue;
			char *p = NULL;
			if (asprintf(&p, "%s%s", np, in->path + ol) < 0)
				continue;
			*mlfs_ino_slot(d, in->path, in->gen) = in->hnext;
			struct mlfs_inode **slot = mlfs_ino_slot(d, p, in->gen);
			if (*slot) { /* a stale inode of the replaced target */
				struct mlfs_inode *old = *slot;
				*slot = old->hnext;
				free(old->path);
				old->path = strdup("\x01stale");
				old->hnext = NULL;
			}
			free(in->path);
			in->path = p;
			in->hnext = NULL;
			*mlfs_ino_slot(d, p, in->gen) = in;
		}
		pthread_mutex_unlock(&d->inodes.lock);
	}
	fuse_reply_err(req, -rc);
}

static void op_refuse_name(fuse_req_t req)
{
	fuse_reply_err(req, EPERM);
}

void mlfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent, (void)name, (void)mode, (void)rdev;
	op_refuse_name(req);
}

void mlfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	(void)link, (void)parent, (void)name;
	op_refuse_name(req);
}

void mlfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	(void)ino, (void)newparent, (void)newname;
	op_refuse_name(req);
}
