/*
 * mlfs_store.c - the store: its life, the job's nodes, saved steps and
 * partition commits; what the reconfiguration state allows.
 *
 * DESIGN
 * The store holds one current view (schema + config + this node's
 * partitions). Control-file writes validate fully before changing anything;
 * a refused write leaves the store as it was and says why in status.json.
 * Changing the config is a reconfiguration: mlfs_reconf.c, which swaps the
 * view pointer; everything here works on the view it finds current and
 * re-checks under the lock that it still is before changing it (-ESTALE,
 * -EBUSY while a reconfiguration holds the store).
 *
 * The files of store/, each calling only those above it in this list:
 *   mlfs_tree.c    name trees of a layout's "<state>/<tensor>.npy" paths
 *   mlfs_job.c     the job/ directory's tree of files
 *   mlfs_view.c    views: partition tables, snapshots, .npy headers
 *   mlfs_store.c   the store's life, nodes, steps, partition commits, states
 *   mlfs_reconf.c  the reconfiguration state machine (and config.json's install)
 *   mlfs_import.c  `mlfs import`: full tensors into partitions
 *   mlfs_ctl.c     the dispatcher of control files and status.json
 *
 * Threads: FUSE workers call everything here; the peer server calls
 * mlfs_store_part_get. store->lock guards all store fields and the buffer
 * pointers of the current view; it is never held during copies, file reads
 * or frees of large buffers.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "dataset/dataset.h"

/* ------------------------------------------------------------------ store */

int mlfs_store_init(struct mlfs_store *st, struct ptc_cluster *cluster, char *cluster_text,
		    int node, int64_t max_memory, int threads)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_init(&st->lock, NULL);
	st->cluster = cluster;
	st->cluster_text = cluster_text;
	st->node = node;
	st->mem.limit = max_memory;
	st->threads = threads;
	clock_gettime(CLOCK_REALTIME, &st->start);
	if (!(st->job = mlfs_job_new_dir("job", &st->mem)))
		return -ENOMEM;
	return 0;
}

struct mlfs_retired_cluster {
	struct ptc_cluster *cluster;
	char *text;
	struct mlfs_retired_cluster *next;
};

int mlfs_store_grow_cluster(struct mlfs_store *st, const char *text, size_t len,
			    struct ptc_error *err)
{
	struct ptc_cluster *cl;
	struct mlfs_retired_cluster *old = malloc(sizeof(*old));
	char *copy = strndup(text, len);
	int rc =
	    old && copy ? ptc_cluster_parse_text(text, len, "cluster.json", &cl, err) : -ENOMEM;

	if (rc)
		goto out;
	pthread_mutex_lock(&st->lock);
	if ((rc = ptc_cluster_extends(st->cluster, cl, err)) == 0 &&
	    cl->nnodes > st->cluster->nnodes) {
		*old = (struct mlfs_retired_cluster){st->cluster, st->cluster_text, st->retired};
		st->retired = old;
		__atomic_store_n(&st->cluster_text, copy, __ATOMIC_RELEASE);
		__atomic_store_n(&st->cluster, cl, __ATOMIC_RELEASE);
		old = NULL, copy = NULL, cl = NULL;
		rc = 1;
	}
	pthread_mutex_unlock(&st->lock);
	ptc_cluster_free(cl);
out:
	free(old);
	free(copy);
	return rc;
}

void mlfs_store_release(struct mlfs_store *st)
{
	mlfs_view_put(st->view);
	mlfs_view_put(st->retained);
	ptc_schema_free(st->schema);
	while (st->retired) {
		struct mlfs_retired_cluster *r = st->retired;
		st->retired = r->next;
		ptc_cluster_free(r->cluster);
		free(r->text);
		free(r);
	}
	ptc_cluster_free(st->cluster);
	mlfs_job_free(st->job);
	free(st->schema_text);
	free(st->cluster_text);
	free(st->steps);
	free(st->saves);
	pthread_mutex_destroy(&st->lock);
}

void mlfs_store_changed(struct mlfs_store *st, const char *prefix)
{
	if (st->changed)
		st->changed(st->changed_arg, prefix);
}

void mlfs_store_status_changed(struct mlfs_store *st)
{
	atomic_fetch_add(&st->status_gen, 1);
	if (st->status_changed)
		st->status_changed(st->changed_arg);
}

void mlfs_store_job_changed(struct mlfs_store *st)
{
	atomic_fetch_add(&st->job_gen, 1);
	if (st->job_changed)
		st->job_changed(st->cluster_arg);
}

void mlfs_store_prefetch(struct mlfs_store *st, struct mlfs_view *v, int64_t step)
{
	if (!v || !v->ds)
		return;
	const struct ptc_layout *l = &v->layout;
	int r0 = l->node_first_rank[st->node];
	bool *seen = calloc((size_t)l->dp, sizeof(*seen));
	for (int r = r0; seen && r >= 0 && r < r0 + l->node_nranks[st->node]; r++) {
		int d = l->ranks[r].d;
		if (!seen[d]) {
			seen[d] = true;
			mlfs_data_prefetch(v->ds, &v->cursor, d, step < 0 ? 0 : step, 0);
		}
	}
	free(seen);
}

void mlfs_store_note_error(struct mlfs_store *st, const char *msg)
{
	pthread_mutex_lock(&st->lock);
	snprintf(st->error, sizeof(st->error), "%s", msg);
	pthread_mutex_unlock(&st->lock);
	mlfs_store_status_changed(st);
}

/* st->saves sized for the current view's ranks (all MLFS_SAVE_NONE when
 * it had to be resized); false when it cannot be. Lock held. */
static bool saves_ready(struct mlfs_store *st)
{
	int n = st->view ? st->view->layout.world : 0;

	if (st->saves && st->saves_n == n)
		return true;
	uint8_t *s = realloc(st->saves, (size_t)(n ? n : 1));
	if (!s)
		return false;
	memset(s, MLFS_SAVE_NONE, (size_t)(n ? n : 1));
	st->saves = s;
	st->saves_n = n;
	return true;
}

int mlfs_store_saving(struct mlfs_store *st, bool reset)
{
	if (!saves_ready(st))
		return -1;
	for (int r = 0; r < st->saves_n; r++) {
		if (reset)
			st->saves[r] = MLFS_SAVE_NONE;
		else if (st->saves[r] == MLFS_SAVE_PARTIAL)
			return r;
	}
	return -1;
}

int mlfs_store_set_step(struct mlfs_store *st, int rank, const char *text, size_t len,
			struct ptc_error *err)
{
	char buf[32], *end;

	if (len == 0 || len >= sizeof(buf))
		return ptc_errorf(err, "ranks/%d/step: expected a step number", rank);
	struct xf_buf **old = NULL;
	size_t nold = 0;
	memcpy(buf, text, len);
	buf[len] = '\0';
	long long step = strtoll(buf, &end, 10);
	while (*end == '\n' || *end == ' ')
		end++;
	if (end == buf || *end || step < 0)
		return ptc_errorf(err, "ranks/%d/step: \"%.*s\" is not a step number", rank,
				  (int)strcspn(buf, "\n"), buf);
	pthread_mutex_lock(&st->lock);
	int rc = 0;
	if (!st->view || rank >= st->view->layout.world)
		rc = -ENOENT;
	else {
		char what[32];
		snprintf(what, sizeof(what), "ranks/%d/step", rank);
		/* the replaced pins' buffers (backups' and the periodic snapshot's):
		 * put after unlocking */
		if (st->view->snap || st->view->psnap)
			nold = (size_t)st->schema->nstates * (size_t)st->schema->ntensors;
		if (nold && !(old = calloc(2 * nold, sizeof(*old))))
			rc = -ENOMEM;
		else if (!(rc = mlfs_reconf_busy(st, what, err))) {
			st->steps[rank] = step;
			if (saves_ready(st))
				st->saves[rank] = MLFS_SAVE_CLEAN;
			mlfs_view_snap(st, st->view, rank, old);
			mlfs_view_psnap(st, st->view, rank, step, old ? old + nold : NULL);
		}
	}
	pthread_mutex_unlock(&st->lock);
	if (old)
		mlfs_bufs_put(old, 2 * nold);
	free(old);
	if (rc == 0 && st->steps_saved)
		st->steps_saved(st->cluster_arg);
	return rc;
}

int mlfs_store_commit_part(struct mlfs_store *st, struct mlfs_view *v, int rank, int state,
			   int tensor, struct xf_buf *b)
{
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	if (st->view != v) {
		rc = -ESTALE;
	} else if (st->state == MLFS_TRANSFORMING) {
		rc = -EBUSY;
	} else if (!xf_parts_local(&v->parts, rank)) {
		rc = -EINVAL; /* not a rank of this node */
	} else {
		size_t i = xf_parts_index(&v->parts, rank, state, tensor);
		struct xf_buf *old = v->parts.bufs[i];
		v->parts.bufs[i] = xf_buf_get(b);
		xf_buf_put(old);
		if (saves_ready(st) && st->saves[rank] == MLFS_SAVE_CLEAN)
			st->saves[rank] = MLFS_SAVE_PARTIAL; /* newer than its step */
	}
	pthread_mutex_unlock(&st->lock);
	return rc;
}

/* ---------------------------------------------------------------- states */

static const char *const state_names[] = {
    [MLFS_RECONF_IDLE] = "idle",	 [MLFS_RECONF_PREPARING] = "preparing",
    [MLFS_RECONF_PREPARED] = "prepared", [MLFS_RECONF_COMMITTING] = "committing",
    [MLFS_RECONF_ABORTING] = "aborting", [MLFS_RECONF_FAILED] = "failed",
};

const char *mlfs_reconf_state_name(enum mlfs_reconf_state s)
{
	return (size_t)s < sizeof(state_names) / sizeof(*state_names) ? state_names[s] : "?";
}

int mlfs_reconf_busy(const struct mlfs_store *st, const char *what, struct ptc_error *err)
{
	if (st->state != MLFS_TRANSFORMING)
		return 0;
	return ptc_error_set(err, -EBUSY,
			     "%s: a reconfiguration to version %" PRId64 " is in progress (%s)",
			     what, st->target_version, mlfs_reconf_state_name(st->reconf));
}
