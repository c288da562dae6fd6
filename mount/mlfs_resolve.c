/*
 * mlfs_resolve.c - paths of the mount resolved against the current view.
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

#include "common/common.h"
#include "mount/mount_i.h"

const struct mlfs_root_file mlfs_root_files[] = {
    {"config.json", MLFS_K_CONFIG},
    {"schema.json", MLFS_K_SCHEMA},
    {"cluster.json", MLFS_K_CLUSTER},
    {"status.json", MLFS_K_STATUS},
    {MLFS_CTL_NAME, MLFS_K_CTL},
    {"job", MLFS_K_JOB},
    {"ranks", MLFS_K_RANKS},
    {"full", MLFS_K_FULL},
    {NULL, MLFS_K_ROOT},
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

static bool is_local_rank(struct mlfs_daemon *d, const struct mlfs_view *v, int r)
{
	int r0 = v->layout.node_first_rank[d->st->node];
	return r0 >= 0 && r >= r0 && r < r0 + v->layout.node_nranks[d->st->node];
}

int mlfs_resolve(struct mlfs_daemon *d, const char *path, struct mlfs_view *v, struct mlfs_ent *e)
{
	const char *p = path, *c;
	size_t n = next_comp(&p, &c);

	memset(e, 0, sizeof(*e));
	e->kind = MLFS_K_ROOT;
	if (n == 0)
		return 0;
	size_t i = 0;
	while (mlfs_root_files[i].name && !(strlen(mlfs_root_files[i].name) == n &&
					    strncmp(mlfs_root_files[i].name, c, n) == 0))
		i++;
	if (!mlfs_root_files[i].name)
		return -ENOENT;
	e->kind = mlfs_root_files[i].kind;
	switch (e->kind) {
	case MLFS_K_JOB:
		e->job = d->st->job;
		while ((n = next_comp(&p, &c))) {
			if (!e->job->dir || !(e->job = mlfs_job_child(e->job, c, n)))
				return -ENOENT;
		}
		return 0;
	case MLFS_K_RANKS: {
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
		    !is_local_rank(d, v, (int)r))
			return -ENOENT;
		e->kind = MLFS_K_RANK;
		e->rank = (int)r;
		if ((n = next_comp(&p, &c)) == 0)
			return 0;
		if (n == 9 && strncmp(c, "rank.json", 9) == 0 && !*p) {
			e->kind = MLFS_K_RANKJSON;
			return 0;
		}
		if (n == 4 && strncmp(c, "step", 4) == 0 && !*p) {
			e->kind = MLFS_K_STEP;
			return 0;
		}
		if (n == 4 && strncmp(c, "data", 4) == 0 && v->ds) {
			e->kind = MLFS_K_DDIR;
			if ((n = next_comp(&p, &c)) == 0)
				return 0;
			if (mlfs_data_name(v->ds, c, n, &e->step, &e->nsteps, &e->dkind) ||
			    next_comp(&p, &c))
				return -ENOENT;
			e->kind = MLFS_K_DFILE;
			if (!e->nsteps)
				return mlfs_data_slice(v->ds, &v->cursor, e->step,
						       v->layout.ranks[r].d, &e->first, &e->count);
			int64_t firsts[MLFS_DATA_WINDOW_MAX];
			int rc = mlfs_data_window(v->ds, &v->cursor, e->step, e->nsteps,
						  v->layout.ranks[r].d, firsts, &e->count);
			e->first = rc ? 0 : firsts[0];
			if (rc == 0) /* the window's identity: its steps' slices */
				e->whash = mlfs_hash(firsts, (size_t)e->nsteps * sizeof(firsts[0]));
			return rc;
		}
		e->kind = MLFS_K_TDIR;
		e->tn = v->stage_tree[v->layout.ranks[r].p];
		break;
	}
	case MLFS_K_FULL:
		if (!v)
			return *p ? -ENOENT : 0;
		e->kind = MLFS_K_FDIR;
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
	if (e->tn->st_file != MLFS_TN_NOT_ST) { /* full/<state>.safetensors and its index */
		e->kind = e->tn->st_file == MLFS_TN_ST_INDEX ? MLFS_K_SINDEX : MLFS_K_SFILE;
		e->state = e->tn->state;
		e->shard = e->tn->st_file;
	} else if (e->tn->tensor >= 0) {
		e->kind = e->kind == MLFS_K_TDIR ? MLFS_K_PART : MLFS_K_FFILE;
		e->state = e->tn->state;
		e->tensor = e->tn->tensor;
	}
	return 0;
}

/*
 * The @n parts of full tensor (@state, @tensor) into @bufs and @remote
 * ([n * 2]): part t is a local partition pinned in bufs[t] (remote[2t] -1),
 * or, when no rank of this node holds it, bufs[t] NULL and remote[2t],
 * remote[2t + 1] the rank of another node holding it and the tensor index
 * that rank holds (a tied tensor's copy). Returns @n, or -EIO when a part is
 * nowhere (nothing held then). Lock held.
 */
static int part_sources(struct mlfs_daemon *d, const struct mlfs_view *v, int state, int tensor,
			struct xf_buf **bufs, int *remote)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = d->st->schema;
	int n = s->tensors[tensor].split_dim < 0 ? 1 : l->tp;

	for (int t = 0; t < n; t++) {
		bufs[t] = NULL;
		remote[2 * t] = -1;
		/* pass 0: a rank of this node; pass 1: any other */
		for (int pass = 0; pass < 2 && !bufs[t] && remote[2 * t] < 0; pass++)
			for (int r = 0; r < l->world && !bufs[t] && remote[2 * t] < 0; r++) {
				if (l->ranks[r].t != t || (l->ranks[r].node == d->st->node) == pass)
					continue;
				for (int a = tensor; a >= 0;
				     a = a == tensor ? s->tie_first[tensor] : s->tie_next[a]) {
					if (!ptc_layout_holds(l, r, a))
						continue;
					if (pass == 0)
						bufs[t] =
						    xf_buf_get(xf_parts_at(&v->parts, r, state, a));
					else
						remote[2 * t] = r, remote[2 * t + 1] = a;
					break;
				}
			}
		if (!bufs[t] && remote[2 * t] < 0) {
			while (t > 0)
				xf_buf_put(bufs[--t]), bufs[t] = NULL;
			return -EIO;
		}
	}
	return n;
}

/* The parts of the full tensor of @e not all here: p->bufs and p->remote
 * (part_sources) in layout p->version. */
static int remote_sources(struct mlfs_daemon *d, const struct mlfs_view *v,
			  const struct mlfs_ent *e, struct mlfs_pin *p)
{
	int n = d->st->schema->tensors[e->tensor].split_dim < 0 ? 1 : v->layout.tp;

	if (!(p->remote = malloc((size_t)n * 2 * sizeof(int))))
		return -ENOMEM;
	p->version = v->config->version;
	return part_sources(d, v, e->state, e->tensor, p->bufs, p->remote);
}

/* The parts of a safetensors file's tensors into p->bufs; where some are
 * on other nodes (a job of many nodes), p->remote names them as for a full
 * tensor, fetched at each open. 0 or a negative errno (nothing held). */
static int st_sources(struct mlfs_daemon *d, const struct mlfs_view *v, struct mlfs_pin *p)
{
	const struct mlfs_st_shard *sh = p->sh;
	int rc = mlfs_view_st_sources(v, d->st->schema, d->st->node, sh, p->bufs);

	if (rc != -EIO || !d->st->fetch)
		return rc;
	if (!(p->remote = malloc((size_t)sh->src0[sh->n] * 2 * sizeof(int))))
		return -ENOMEM;
	for (int i = 0; i < sh->n; i++) {
		int k = sh->src0[i];
		rc = part_sources(d, v, sh->state, sh->tensor[i], p->bufs + k, p->remote + 2 * k);
		if (rc >= 0)
			continue;
		for (k = 0; k < sh->src0[i]; k++)
			xf_buf_put(p->bufs[k]), p->bufs[k] = NULL;
		return rc;
	}
	return 0;
}

/* The pin of a safetensors file: its shard and the parts of its tensors
 * (here, or named on other nodes: st_sources). */
static int st_pin(struct mlfs_daemon *d, const struct mlfs_view *v, const struct mlfs_ent *e,
		  uint64_t *gen, struct mlfs_pin **pin)
{
	const struct ptc_schema *s = d->st->schema;
	struct mlfs_st_shard *sh = calloc(1, sizeof(*sh));
	int rc;

	if (!sh)
		return -ENOMEM;
	if ((rc = mlfs_st_shard_init(s, e->state, e->shard, mlfs_st_shard_max(), v->layout.tp,
				     sh))) {
		free(sh);
		return rc;
	}
	int n = sh->src0[sh->n];
	struct mlfs_pin *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(p->bufs[0]));
	if (!p) {
		mlfs_st_shard_release(sh);
		free(sh);
		return -ENOMEM;
	}
	atomic_init(&p->refs, 1);
	p->kind = e->kind;
	p->state = e->state;
	p->tensor = -1;
	p->sh = sh;
	p->version = v->config->version;
	if ((rc = st_sources(d, v, p))) {
		mlfs_pin_put(p); /* no part is held */
		return rc;
	}
	p->nbufs = n;
	uint64_t h = mlfs_hash_u64(0, (uint64_t)p->version);
	for (int i = 0; i < n; i++) /* a remote part: 0 */
		h = mlfs_hash_u64(h, p->bufs[i] ? p->bufs[i]->id : 0);
	*gen = (h & ~(3ull << 62)) | 1ull << 62;
	*pin = p;
	return 0;
}

int mlfs_ent_pin(struct mlfs_daemon *d, const struct mlfs_view *v, const struct mlfs_ent *e,
		 uint64_t *gen, struct mlfs_pin **pin)
{
	*gen = 0;
	*pin = NULL;
	if (e->kind == MLFS_K_DFILE) { /* its samples */
		uint64_t key[] = {(uint64_t)e->first, (uint64_t)e->count, (uint64_t)e->dkind,
				  e->whash, (uint64_t)e->nsteps};
		*gen = mlfs_hash(key, sizeof(key)) | 1ull << 63;
		return 0;
	}
	if (e->kind == MLFS_K_SFILE)
		return st_pin(d, v, e, gen, pin);
	if (e->kind != MLFS_K_PART && e->kind != MLFS_K_FFILE)
		return 0;
	int n = e->kind == MLFS_K_PART ? 1 : v->layout.tp;
	struct mlfs_pin *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(p->bufs[0]));
	if (!p)
		return -ENOMEM;
	atomic_init(&p->refs, 1);
	p->nbufs = n;
	p->kind = e->kind;
	p->rank = e->rank;
	p->state = e->state;
	p->tensor = e->tensor;
	if (e->kind == MLFS_K_PART) {
		p->bufs[0] = xf_buf_get(xf_parts_at(&v->parts, e->rank, e->state, e->tensor));
		p->hdr_len = mlfs_part_header(d->st->schema, &v->layout, e->rank, e->state,
					      e->tensor, p->hdr, sizeof(p->hdr));
		*gen = p->bufs[0]->id;
	} else {
		int rc = mlfs_view_full_sources(v, d->st->schema, d->st->node, e->state, e->tensor,
						p->bufs);
		if (rc == -EIO && d->st->fetch) /* parts on other nodes */
			rc = remote_sources(d, v, e, p);
		if (rc < 0) {
			mlfs_pin_put(p);
			return rc;
		}
		p->nbufs = rc;
		p->hdr_len =
		    mlfs_full_header(d->st->schema, e->state, e->tensor, p->hdr, sizeof(p->hdr));
		uint64_t h = mlfs_hash_u64(0, (uint64_t)p->version);
		for (int i = 0; i < p->nbufs; i++) /* a remote part: 0 */
			h = mlfs_hash_u64(h, p->bufs[i] ? p->bufs[i]->id : 0);
		*gen = (h & ~(3ull << 62)) | 1ull << 62;
	}
	*pin = p;
	return 0;
}

int mlfs_target_get(struct mlfs_daemon *d, fuse_ino_t ino, struct mlfs_target *t)
{
	t->d = d;
	int rc = mlfs_ino_get(d, ino, t->path, sizeof(t->path), &t->pin);
	if (rc)
		return rc;
	pthread_mutex_lock(&d->st->lock);
	t->v = mlfs_view_get(d->st->view);
	rc = mlfs_resolve(d, t->path, t->v, &t->e);
	t->vanished = false;
	if (rc && t->pin) {
		/* A reconfiguration removed the path after the lookup: the inode
		 * still names its content, which open files go on reading and
		 * whose attributes they ask for. */
		memset(&t->e, 0, sizeof(t->e));
		t->e.kind = t->pin->kind;
		t->e.rank = t->pin->rank;
		t->e.state = t->pin->state;
		t->e.tensor = t->pin->tensor;
		t->vanished = true;
		return 0;
	}
	if (rc) {
		pthread_mutex_unlock(&d->st->lock);
		mlfs_view_put(t->v);
		mlfs_pin_put(t->pin);
		t->v = NULL;
		t->pin = NULL;
		return rc;
	}
	return 0; /* the lock is held */
}

/* Unlocks; the view and pin references stay the caller's (mlfs_target_put). */
void mlfs_target_done(struct mlfs_target *t)
{
	pthread_mutex_unlock(&t->d->st->lock);
}

void mlfs_target_put(struct mlfs_target *t)
{
	mlfs_view_put(t->v);
	mlfs_pin_put(t->pin);
	t->v = NULL;
	t->pin = NULL;
}

int mlfs_child_path(struct mlfs_daemon *d, fuse_ino_t parent, const char *name, char *buf,
		    size_t cap)
{
	char pp[4096];
	int rc = mlfs_ino_path(d, parent, pp, sizeof(pp));
	if (rc)
		return rc;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	if ((size_t)snprintf(buf, cap, "%s%s%s", pp, *pp ? "/" : "", name) >= cap)
		return -ENAMETOOLONG;
	return 0;
}
