/*
 * mlfs_attr.c - attributes, lookups, setattr, extended attributes, statfs.
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

static int64_t part_bytes(const struct mlfs_view *v, const struct mlfs_ent *e)
{
	return xf_partition_bytes(&v->layout, e->rank, e->state, e->tensor);
}

static int64_t full_bytes(struct mlfs_daemon *d, const struct mlfs_ent *e)
{
	const struct ptc_tensor *t = &d->st->schema->tensors[e->tensor];
	return ptc_tensor_elems(t) *
	       (int64_t)ptc_dtype_size(ptc_schema_dtype(d->st->schema, e->state, e->tensor));
}

/* The length of @s, a generated text only measured, which it frees; 0 for
 * NULL. */
static size_t text_len_free(char *s)
{
	size_t n = s ? strlen(s) : 0;
	free(s);
	return n;
}

char *mlfs_step_text(struct mlfs_daemon *d, int rank)
{
	char *s = NULL;
	if (asprintf(&s, "%" PRId64 "\n", d->st->steps[rank]) < 0)
		return NULL;
	return s;
}

/* The size of safetensors file @e, from the schema (its header and data). */
static int64_t st_file_size(struct mlfs_daemon *d, const struct mlfs_ent *e,
			    const struct mlfs_view *v)
{
	struct mlfs_st_shard sh;
	if (!v || mlfs_st_shard_init(d->st->schema, e->state, e->shard, mlfs_st_shard_max(),
				     v->layout.tp, &sh))
		return 0;
	int64_t size = sh.size;
	mlfs_st_shard_release(&sh);
	return size;
}

void mlfs_fill_attr(struct mlfs_daemon *d, const struct mlfs_ent *e, const struct mlfs_view *v,
		    const struct mlfs_pin *pin, struct stat *stb)
{
	char hdr[512];
	memset(stb, 0, sizeof(*stb));
	stb->st_uid = d->uid;
	stb->st_gid = d->gid;
	stb->st_nlink = 1;
	stb->st_mtim = v ? v->time : d->st->start;
	stb->st_ctim = stb->st_mtim;
	stb->st_atim = stb->st_mtim;
	switch (e->kind) {
	case MLFS_K_ROOT:
	case MLFS_K_RANKS:
	case MLFS_K_RANK:
	case MLFS_K_FULL:
		stb->st_mode = S_IFDIR | 0755;
		stb->st_nlink = 2;
		return;
	case MLFS_K_DDIR:
		stb->st_mode = S_IFDIR | 0555;
		stb->st_nlink = 2;
		return;
	case MLFS_K_DFILE: {
		size_t hlen;
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)mlfs_data_file_size(v->ds, e->first, e->count, e->nsteps,
							  e->dkind, hdr, sizeof(hdr), &hlen);
		return;
	}
	case MLFS_K_SFILE:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)(pin && pin->sh ? pin->sh->size : st_file_size(d, e, v));
		return;
	case MLFS_K_SINDEX:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)text_len_free(
		    mlfs_st_index_text(d->st->schema, e->state, mlfs_st_shard_max()));
		return;
	case MLFS_K_TDIR:
	case MLFS_K_FDIR:
		if (e->tn && mlfs_tnode_is_dir(e->tn)) {
			stb->st_mode = S_IFDIR | 0555;
			stb->st_nlink = 2;
			return;
		}
		break;
	case MLFS_K_JOB:
		stb->st_mode = e->job->dir ? S_IFDIR | 0755 : S_IFREG | 0644;
		stb->st_size = (off_t)e->job->size;
		stb->st_mtim = stb->st_ctim = e->job->mtime;
		return;
	case MLFS_K_CONFIG:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = v ? (off_t)strlen(v->config_text) : 0;
		return;
	case MLFS_K_SCHEMA:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = d->st->schema_text ? (off_t)strlen(d->st->schema_text) : 0;
		return;
	case MLFS_K_CLUSTER:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)strlen(mlfs_store_cluster_text(d->st));
		return;
	case MLFS_K_STATUS:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = 0; /* generated on open; direct I/O */
		return;
	case MLFS_K_CTL:
		stb->st_mode = S_IFREG | 0600;
		return;
	case MLFS_K_RANKJSON:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size = (off_t)text_len_free(mlfs_rank_json(v, e->rank));
		return;
	case MLFS_K_STEP:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size = (off_t)text_len_free(mlfs_step_text(d, e->rank));
		return;
	case MLFS_K_PART:
		stb->st_mode = S_IFREG | 0644;
		stb->st_size =
		    pin ? (off_t)(pin->hdr_len + (size_t)pin->bufs[0]->size)
			: (off_t)(mlfs_part_header(d->st->schema, &v->layout, e->rank, e->state,
						   e->tensor, hdr, sizeof(hdr)) +
				  (size_t)part_bytes(v, e));
		return;
	case MLFS_K_FFILE:
		stb->st_mode = S_IFREG | 0444;
		stb->st_size =
		    (off_t)(mlfs_full_header(d->st->schema, e->state, e->tensor, hdr, sizeof(hdr)) +
			    (size_t)full_bytes(d, e));
		return;
	}
	stb->st_mode = S_IFREG | 0644;
}

/* How long the kernel may cache a name (@entry) or attributes. Paths whose
 * inode never changes (the rank directories and data/: inodes are paths,
 * and operations mlfs_resolve them against the current view, so a vanished one
 * answers ENOENT) are cached briefly, which saves a view open three lookups;
 * a view's attributes belong to its inode (keyed by its samples). Everything
 * else is looked up every time: a partition path gets a new inode per
 * content, a view path per slice. */
static double ent_timeout(const struct mlfs_ent *e, bool entry)
{
	switch (e->kind) {
	case MLFS_K_RANKS:
	case MLFS_K_RANK:
	case MLFS_K_DDIR:
		return 5.0;
	case MLFS_K_ROOT:
	case MLFS_K_FULL:
	case MLFS_K_DFILE:
		return entry ? 0.0 : 5.0;
	case MLFS_K_TDIR:
	case MLFS_K_FDIR: /* a directory's attributes (the kernel checks them on every path walk) */
		return entry || !e->tn || !mlfs_tnode_is_dir(e->tn) ? 0.0 : 5.0;
	default:
		return 0.0;
	}
}

void mlfs_reply_entry(fuse_req_t req, const char *path, const struct mlfs_ent *e,
		      const struct mlfs_view *v)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct fuse_entry_param ep = {0};
	struct mlfs_pin *pin;
	uint64_t gen;
	int rc = mlfs_ent_pin(d, v, e, &gen, &pin);
	if (rc) {
		pthread_mutex_unlock(&d->st->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	mlfs_fill_attr(d, e, v, pin, &ep.attr);
	ep.entry_timeout = ent_timeout(e, true);
	ep.attr_timeout = ent_timeout(e, false);
	pthread_mutex_unlock(&d->st->lock);
	if (!(ep.ino = mlfs_ino_lookup(d, path, gen, pin))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ep.attr.st_ino = ep.ino;
	if (fuse_reply_entry(req, &ep))
		mlfs_ino_forget(d, ep.ino, 1);
}

void mlfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	int rc = mlfs_child_path(d, parent, name, t.path, sizeof(t.path));
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	pthread_mutex_lock(&d->st->lock);
	t.v = d->st->view;
	if ((rc = mlfs_resolve(d, t.path, t.v, &t.e))) {
		pthread_mutex_unlock(&d->st->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	mlfs_reply_entry(req, t.path, &t.e, t.v); /* unlocks */
}

void mlfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	mlfs_ino_forget(d, ino, n);
	fuse_reply_none(req);
}

void mlfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	for (size_t i = 0; i < count; i++)
		mlfs_ino_forget(d, f[i].ino, f[i].nlookup);
	fuse_reply_none(req);
}

void mlfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	struct stat stb;
	int rc = mlfs_target_get(d, ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	(void)fi; /* an inode's attributes are its pinned content's, open or not */
	mlfs_fill_attr(d, &t.e, t.v, t.pin, &stb);
	double timeout = ent_timeout(&t.e, false);
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	stb.st_ino = ino;
	fuse_reply_attr(req, &stb, timeout);
}

void mlfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		     struct fuse_file_info *fi)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	struct stat stb;
	bool restaged = false;
	struct mlfs_fh *f =
	    mlfs_fresh_take(d, fi ? mlfs_fh_of(fi) : NULL, ino, fuse_req_ctx(req)->pid);

	if (!f && fi)
		f = mlfs_fh_get(mlfs_fh_of(fi));
	/* open(O_TRUNC) (a setattr without the handle: see mlfs_fresh_add) or
	 * ftruncate(fd, 0) on an open writer restarts its staging. The inode
	 * keeps its size (its content is unchanged until a commit); the lock is
	 * the handle's, taken before the store's. */
	if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size == 0 && f)
		restaged = mlfs_write_truncate(f);
	mlfs_fh_put(f);
	int rc = mlfs_target_get(d, ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (t.vanished && !restaged)
		rc = -ENOENT;
	else if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		rc = -EPERM;
	else if ((to_set & FUSE_SET_ATTR_SIZE) && !restaged) {
		mlfs_fill_attr(d, &t.e, t.v, t.pin, &stb);
		if (t.e.kind == MLFS_K_JOB)
			rc = attr->st_size > (off_t)MLFS_JOB_FILE_MAX
				 ? -EFBIG
				 : mlfs_job_truncate(t.e.job, (size_t)attr->st_size);
		else if (attr->st_size != stb.st_size) {
			rc = t.e.kind == MLFS_K_PART ? -EINVAL : -EACCES;
		}
	}
	if (rc == 0 && t.e.kind == MLFS_K_JOB &&
	    (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW))) {
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &t.e.job->mtime);
		else
			t.e.job->mtime = attr->st_mtim;
	}
	if (rc == 0 && t.e.kind == MLFS_K_JOB &&
	    (to_set & (FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)))
		mlfs_store_job_changed(d->st);
	mlfs_fill_attr(d, &t.e, t.v, t.pin, &stb);
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	stb.st_ino = ino;
	fuse_reply_attr(req, &stb, 0);
}

static const char XATTR[] = "user.mlfs.dtype";

void mlfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	int rc = mlfs_target_get(d, ino, &t);
	const char *val = NULL;

	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if ((t.e.kind == MLFS_K_PART || t.e.kind == MLFS_K_FFILE) && strcmp(name, XATTR) == 0)
		val = ptc_dtype_name(ptc_schema_dtype(d->st->schema, t.e.state, t.e.tensor));
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	if (!val)
		fuse_reply_err(req, ENODATA);
	else if (size == 0)
		fuse_reply_xattr(req, strlen(val));
	else if (size < strlen(val))
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, val, strlen(val));
}

void mlfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_target t;
	int rc = mlfs_target_get(d, ino, &t);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	bool has = t.e.kind == MLFS_K_PART || t.e.kind == MLFS_K_FFILE;
	mlfs_target_done(&t);
	mlfs_target_put(&t);
	size_t n = has ? sizeof(XATTR) : 0;
	if (size == 0)
		fuse_reply_xattr(req, n);
	else if (size < n)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, XATTR, n);
}

void mlfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
		      size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	fuse_reply_err(req, ENOTSUP);
}

void mlfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct statvfs s = {0};
	(void)ino;
	s.f_bsize = s.f_frsize = 4096;
	s.f_blocks = (fsblkcnt_t)(d->st->mem.limit / 4096);
	s.f_bfree = s.f_bavail = (fsblkcnt_t)((d->st->mem.limit - d->st->mem.used) / 4096);
	s.f_namemax = 255;
	fuse_reply_statfs(req, &s);
}
