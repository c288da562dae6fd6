/*
 * mlfs_backup.c - with "replicas": 1 in the config, this node keeps a copy
 * of the saved state of the node before it in config.nodes (DESIGN
 * section 7), so that a config dropping that node when it is dead is
 * served from the copy where no DP replica survives.
 *
 * DESIGN
 * The saved state of a rank is what its partitions were when its step was
 * last written (or the layout installed or imported): the node that hosts
 * it pins those buffers (mlfs_view_snap; zero-copy, shared with the
 * partitions until a write replaces one) and serves them to this thread
 * as /v1/part?...&snap=<step>. This thread follows the steps that node
 * publishes in etcd (mlfs_nodeentry.c copies them into st->steps) and, for
 * each of its ranks whose step moved, fetches the rank's partitions at that
 * step into new buffers, each verified against the XXH3 its source stored
 * when the partition was committed and sent with it (X-Mlfs-XXH3; a reply
 * that does not match is retried, then the backup is not taken and
 * status.json's backup error says why), and swaps them in at
 * once: a rank's backup is one step, whole, never a mix. A fetch that
 * races a newer save gets a 409 and is tried again at the newer step.
 * The table is dropped when the layout version changes (the new layout's
 * saved state is backed up from scratch) and when the config has no
 * "replicas".
 *
 * What this node holds goes into its etcd entry ("backup"); the
 * coordinator of a config that drops a dead node uses a backup only when
 * it holds every rank of that node at the step the job agreed on, and
 * tells the plan so (the attempt's "backups"). The peer server then serves
 * those rows from here (/v1/part?...&backup=1), checking the checksum once.
 * So this file fetches with the peer client (mlfs_peer_get_part) and is
 * called by the peer server (mlfs_backup_get) and the control plane
 * (kick, describe); it calls neither of them (a backup taken is published
 * through the store's steps_saved hook).
 *
 * Memory: backups are counted in --max-memory like partitions; a backup
 * that does not fit is not taken (status.json's backup error says so).
 *
 * Threads: one backup thread; peer server threads (mlfs_backup_get);
 * the control thread, I/O workers and status.json readers (kick,
 * describe). b->lock guards the table; nothing is taken under it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "cluster/cluster.h"
#include "common/common.h"

struct mlfs_backup {
	struct mlfs_store *st;
	pthread_t thread;
	bool running;
	atomic_int stop;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool kicked;	  /* lock */
	bool kicked_lost; /* lock: the store's lost flag at the last kick */

	/* lock: the table, for layout @version, of node @of's ranks [r0, r0 + n) */
	int64_t version;
	int of; /* cluster node index, -1: none */
	int r0, n, nst, nt;
	int64_t *step;	      /* per rank: the step held, -1: none */
	struct xf_buf **bufs; /* per (rank, state, tensor) */
	uint64_t *sum;
	bool *verified; /* per slot: the checksum was checked since it was taken */
	int64_t bytes;
	char error[512];
};

static size_t slot(const struct mlfs_backup *b, int rank, int state, int tensor)
{
	return ((size_t)(rank - b->r0) * (size_t)b->nst + (size_t)state) * (size_t)b->nt +
	       (size_t)tensor;
}

/* Empties the table into a new one for @of's ranks of @v (of < 0: none).
 * Lock held; the old buffers go to *@old (put them after unlocking). */
static int reset(struct mlfs_backup *b, const struct mlfs_view *v, int of, struct xf_buf ***old,
		 size_t *nold)
{
	size_t n = (size_t)b->n * (size_t)b->nst * (size_t)b->nt;
	*old = b->bufs;
	*nold = b->bufs ? n : 0;
	free(b->step);
	free(b->sum);
	free(b->verified);
	b->bufs = NULL, b->step = NULL, b->sum = NULL, b->verified = NULL;
	b->n = 0, b->bytes = 0, b->of = of, b->version = v ? v->config->version : 0;
	b->error[0] = '\0';
	if (of < 0)
		return 0;
	const struct ptc_layout *l = &v->layout;
	b->r0 = l->node_first_rank[of];
	b->n = l->node_nranks[of];
	b->nst = l->schema->nstates;
	b->nt = l->schema->ntensors;
	n = (size_t)b->n * (size_t)b->nst * (size_t)b->nt;
	b->step = malloc((size_t)(b->n ? b->n : 1) * sizeof(*b->step));
	b->bufs = calloc(n ? n : 1, sizeof(*b->bufs));
	b->sum = calloc(n ? n : 1, sizeof(*b->sum));
	b->verified = calloc(n ? n : 1, sizeof(*b->verified));
	if (!b->step || !b->bufs || !b->sum || !b->verified) {
		b->of = -1;
		b->n = 0;
		return -ENOMEM;
	}
	for (int i = 0; i < b->n; i++)
		b->step[i] = -1;
	return 0;
}

/* The node whose ranks this node backs up under @v, or -1. */
static int backed_up(const struct mlfs_store *st, const struct mlfs_view *v)
{
	const struct ptc_layout *l = &v->layout;
	for (int i = 0; i < v->config->nnodes; i++) {
		int n = ptc_cluster_find(l->cluster, v->config->nodes[i]);
		if (n >= 0 && n != st->node && ptc_layout_backup_holder(l, n) == st->node)
			return n;
	}
	return -1;
}

/* Fetches rank @r's partitions of @v as saved at @step from node @of into
 * the table. 0, or an error with b->error set. */
static int take(struct mlfs_backup *b, const struct mlfs_view *v, int of, int r, int64_t step)
{
	struct mlfs_store *st = b->st;
	const struct ptc_layout *l = &v->layout;
	size_t per = (size_t)b->nst * (size_t)b->nt;
	struct xf_buf **got = calloc(per, sizeof(*got));
	uint64_t *sum = calloc(per, sizeof(*sum));
	struct ptc_error why = {.text = ""};
	int rc = got && sum ? 0 : -ENOMEM;
	int64_t bytes = 0;

	for (int s = 0; s < b->nst && rc == 0; s++)
		for (int t = 0; t < b->nt && rc == 0; t++) {
			if (!ptc_layout_holds(l, r, t))
				continue;
			int64_t size = xf_partition_bytes(l, r, s, t);
			size_t i = (size_t)s * (size_t)b->nt + (size_t)t;
			if (!(got[i] = xf_buf_new(&st->mem, size, &rc))) {
				ptc_error_set(&why, rc,
					      "rank %d: %" PRId64
					      " bytes do not fit in --max-memory",
					      r, size);
				break;
			}
			if ((rc = mlfs_peer_get_part(st, of, l, r, s, t, step, got[i], &b->stop,
						     &why)))
				break;
			/* the source's published checksum, verified over the bytes
			 * received by mlfs_peer_get_part (never one of our own) */
			sum[i] = xf_buf_sum(got[i]);
			bytes += size;
		}
	pthread_mutex_lock(&b->lock);
	if (rc == 0 && b->version == v->config->version && b->of == of) {
		/* swap: the table takes the new buffers, @got the old */
		for (size_t i = 0; i < per; i++) {
			size_t k = slot(b, r, 0, 0) + i;
			struct xf_buf *tmp = b->bufs[k];
			b->bytes += (got[i] ? got[i]->size : 0) - (tmp ? tmp->size : 0);
			b->bufs[k] = got[i];
			got[i] = tmp;
			b->sum[k] = sum[i];
			b->verified[k] = false;
		}
		b->step[r - b->r0] = step;
		b->error[0] = '\0';
	} else if (rc) {
		snprintf(b->error, sizeof(b->error), "%s", why.text[0] ? why.text : strerror(-rc));
	}
	pthread_mutex_unlock(&b->lock);
	if (got)
		mlfs_bufs_put(got, per);
	free(got);
	free(sum);
	return rc;
}

static void *backup_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-backup"); /* for top -H, perf */
	struct mlfs_backup *b = arg;
	struct mlfs_store *st = b->st;
	int failures = 0;

	while (!atomic_load(&b->stop)) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		int64_t ms = failures ? 1000 : 250;
		until.tv_nsec += ms * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		pthread_mutex_lock(&b->lock);
		/* Backing up no node (no "replicas"): only a kick (a round of
		 * the control thread, a new layout) can change that; else a look
		 * every 250 ms as a safety net. */
		while (!b->kicked && !atomic_load(&b->stop) &&
		       (b->of < 0 ? pthread_cond_wait(&b->cond, &b->lock)
				  : pthread_cond_timedwait(&b->cond, &b->lock, &until)) == 0)
			;
		b->kicked = false;
		pthread_mutex_unlock(&b->lock);
		if (atomic_load(&b->stop))
			break;

		struct mlfs_view *v = mlfs_store_view(st);
		int of = v && !atomic_load(&st->lost) ? backed_up(st, v) : -1;
		struct xf_buf **old = NULL;
		size_t nold = 0;
		pthread_mutex_lock(&b->lock);
		if (b->of != of || (v && b->version != v->config->version))
			reset(b, v, of, &old, &nold);
		pthread_mutex_unlock(&b->lock);
		if (old)
			mlfs_bufs_put(old, nold);
		free(old);
		failures = 0;
		/* The steps of the node backed up, as the entries the control
		 * plane follows say now (no request: no round of the control
		 * thread runs for another node's entry). */
		if (of >= 0 && st->steps_mirrored)
			st->steps_mirrored(st->cluster_arg);
		for (int r = v && of >= 0 ? v->layout.node_first_rank[of] : 0;
		     of >= 0 && r < v->layout.node_first_rank[of] + v->layout.node_nranks[of] &&
		     !atomic_load(&b->stop);
		     r++) {
			pthread_mutex_lock(&st->lock);
			int64_t want = st->view == v ? st->steps[r] : -1;
			pthread_mutex_unlock(&st->lock);
			pthread_mutex_lock(&b->lock);
			bool have = b->of == of && b->step && b->step[r - b->r0] == want;
			pthread_mutex_unlock(&b->lock);
			if (want < 0 || have)
				continue;
			if (take(b, v, of, r, want))
				failures++;
			else if (st->steps_saved)
				st->steps_saved(st->cluster_arg); /* the job sees it at once */
		}
		mlfs_view_put(v);
	}
	return NULL;
}

int mlfs_backup_start(struct mlfs_store *st, struct mlfs_backup **out)
{
	struct mlfs_backup *b = calloc(1, sizeof(*b));
	int rc;

	*out = NULL;
	if (!b)
		return -ENOMEM;
	b->st = st;
	b->of = -1;
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cond, NULL);
	if ((rc = -pthread_create(&b->thread, NULL, backup_main, b))) {
		pthread_cond_destroy(&b->cond);
		pthread_mutex_destroy(&b->lock);
		free(b);
		return rc;
	}
	b->running = true;
	*out = b;
	return 0;
}

void mlfs_backup_halt(struct mlfs_backup *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->lock);
	atomic_store(&b->stop, 1);
	pthread_cond_signal(&b->cond);
	pthread_mutex_unlock(&b->lock);
	if (b->running)
		pthread_join(b->thread, NULL);
	b->running = false;
}

void mlfs_backup_stop(struct mlfs_backup *b)
{
	struct xf_buf **old = NULL;
	size_t nold = 0;

	if (!b)
		return;
	mlfs_backup_halt(b);
	reset(b, NULL, -1, &old, &nold);
	if (old)
		mlfs_bufs_put(old, nold);
	free(old);
	pthread_cond_destroy(&b->cond);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

void mlfs_backup_kick(struct mlfs_backup *b)
{
	if (!b)
		return;
	struct mlfs_view *v = mlfs_store_view(b->st);
	int64_t version = v ? v->config->version : 0;
	bool replicas = v && v->config->replicas > 0;
	bool lost = atomic_load(&b->st->lost);
	mlfs_view_put(v);
	pthread_mutex_lock(&b->lock);
	/* Only when it may change something: a node backed up (its steps
	 * move), a new layout with backups, or the node lost or no longer
	 * lost under one. A thread woken at every round of the control thread
	 * for nothing cost every node a context switch per round; one woken at
	 * every commit of a job without backups, one per reconfiguration. */
	if (b->of >= 0 || (replicas && (version != b->version || lost != b->kicked_lost))) {
		b->kicked = true;
		b->kicked_lost = lost;
		pthread_cond_signal(&b->cond);
	}
	pthread_mutex_unlock(&b->lock);
}

json_t *mlfs_backup_describe(struct mlfs_backup *b)
{
	json_t *o = NULL;
	if (!b)
		return NULL;
	pthread_mutex_lock(&b->lock);
	if (b->of >= 0) {
		json_t *steps = json_object();
		char rk[16];
		for (int i = 0; i < b->n; i++) {
			snprintf(rk, sizeof(rk), "%d", b->r0 + i);
			json_object_set_new(steps, rk, json_integer(b->step[i]));
		}
		o = json_pack("{sssIsosI}", "of", mlfs_store_cluster(b->st)->nodes[b->of].id,
			      "version", (json_int_t)b->version, "steps", steps, "bytes",
			      (json_int_t)b->bytes);
		if (o && b->error[0])
			json_object_set_new(o, "error", json_string(b->error));
	}
	pthread_mutex_unlock(&b->lock);
	return o;
}

struct xf_buf *mlfs_backup_get(struct mlfs_backup *b, int64_t version, int rank, int state,
			       int tensor, struct ptc_error *err)
{
	struct xf_buf *buf = NULL;
	uint64_t sum = 0;
	size_t k = 0;
	bool verified = false;

	if (!b) {
		ptc_error_set(err, -ENOENT, "this node keeps no backups");
		return NULL;
	}
	pthread_mutex_lock(&b->lock);
	if (b->of < 0 || b->version != version || rank < b->r0 || rank >= b->r0 + b->n ||
	    state < 0 || state >= b->nst || tensor < 0 || tensor >= b->nt) {
		ptc_error_set(err, -ENOENT, "no backup of rank %d of layout version %" PRId64, rank,
			      version);
	} else if (!(buf = xf_buf_get(b->bufs[k = slot(b, rank, state, tensor)]))) {
		ptc_error_set(err, -ENOENT, "no backup of that partition of rank %d", rank);
	} else {
		sum = b->sum[k];
		verified = b->verified[k];
	}
	pthread_mutex_unlock(&b->lock);
	if (!buf || verified)
		return buf;
	/* once per backup: the copy was not changed since it was taken */
	if (XXH3_64bits(buf->data, (size_t)buf->size) != sum) {
		ptc_error_set(err, -EIO, "the backup of rank %d is corrupt (checksum)", rank);
		mlfs_log(MLFS_LOG_ERROR, "backup: %s", err->text);
		xf_buf_put(buf);
		return NULL;
	}
	pthread_mutex_lock(&b->lock);
	if (b->version == version && b->bufs && b->of >= 0 && rank >= b->r0 &&
	    rank < b->r0 + b->n && b->bufs[k] == buf)
		b->verified[k] = true;
	pthread_mutex_unlock(&b->lock);
	return buf;
}
