/*
 * mlfs_autosnap.c - periodic snapshots: with "snapshot": {"dir": D,
 * "every": N, "keep": K} in the config, every N-th saved step is written
 * to D/step-<step> in the background, and the K newest complete ones are
 * kept.
 *
 * DESIGN
 * A rank's step write is the moment its partitions are that step's: when
 * the step is a multiple of N, mlfs_store_set_step pins the rank's boxes
 * (mlfs_view_psnap: references to the committed buffers, no copy; a write
 * after it swaps in a new buffer and leaves the pinned one as it was). This
 * thread wakes, and once every rank of this node pinned the same step it
 * takes the pins, lets the view's go, and writes the boxes with the same
 * code as `mlfs snapshot` (mlfs_snap_write): so each node writes exactly
 * the step it pinned, and a manifest, written by the node hosting rank 0
 * once every owner node's list of that step and version is there, can
 * never mix steps. Nothing waits on other nodes before writing; nothing
 * stalls training: a step write only takes references.
 *
 * When a step is due while the previous one is still being written, its
 * pins wait; when yet another is due before they were taken, the newer
 * replaces them (the skipped step is counted). Rank 0's node stops waiting
 * for the other nodes' lists of a step once a newer step is pinned here
 * (a node that skipped it would never write it) or after 600 s.
 *
 * Bounds: "threads" writers (default 1: one core of zstd level 1, about
 * 0.6 GB/s of input on the development machine) and "max_mib_s" (default
 * 0: no bound) on the bytes they compress per second. Memory: the pinned
 * buffers live until written; a partition rewritten meanwhile exists
 * twice.
 *
 * After a manifest, rank 0's node removes the complete snapshots older
 * than the K newest, and the incomplete ones older than those it kept.
 * Every node rescans the directory for the newest complete snapshot
 * (status.json "snapshots").
 *
 * Threads: its own; st->lock (the condition variable waits on it).
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "store/snapshot_i.h"
#include "store/store.h"

#define WAIT_S 600 /* rank 0's node, for the other nodes' lists */

struct mlfs_autosnap {
	struct mlfs_store *st;
	pthread_t thread;
	pthread_cond_t cond; /* with st->lock */
	bool stop;
	/* Under st->lock: */
	int64_t done;	 /* the newest step this node wrote or gave up */
	int64_t writing; /* -1: none */
	int64_t newest;	 /* the newest complete snapshot in dir, -1: none */
	int64_t written, skipped;
	int64_t written_step; /* of the last part written here, -1: none */
	int polls;	      /* looks for its manifest since */
	char dir[3100];	      /* the config's "dir" the figures are of */
	int64_t manual;	      /* the step of the last `mlfs snapshot` here, -1: none */
	char manual_dir[3100];
	char error[PTC_ERROR_MAX];
};

/* Steps of complete snapshots in @dir, ascending; their count, or -errno. */
static int list_complete(const char *dir, int64_t **steps)
{
	DIR *d = opendir(dir);
	int n = 0, cap = 0;

	*steps = NULL;
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end, path[4096];
		if (strncmp(e->d_name, "step-", 5) != 0)
			continue;
		long long s = strtoll(e->d_name + 5, &end, 10);
		struct stat sb;
		snprintf(path, sizeof(path), "%s/%s/manifest.json", dir, e->d_name);
		if (*end || s < 0 || stat(path, &sb))
			continue;
		if (n == cap) {
			int64_t *p = realloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * 8);
			if (!p) {
				closedir(d);
				return -ENOMEM;
			}
			*steps = p;
		}
		(*steps)[n++] = s;
	}
	closedir(d);
	for (int i = 1; i < n; i++) /* insertion sort: a handful */
		for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
			int64_t t = (*steps)[j];
			(*steps)[j] = (*steps)[j - 1];
			(*steps)[j - 1] = t;
		}
	return n;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	if (flag == FTW_DP ? rmdir(path) : unlink(path))
		mlfs_log(MLFS_LOG_WARNING, "snapshot: cannot remove %s: %s", path, strerror(errno));
	return 0;
}

/* Removes the complete snapshots of @dir older than its @keep newest and
 * the incomplete ones older than those kept. */
static void prune(const char *dir, int keep)
{
	int64_t *steps;
	int n = list_complete(dir, &steps);
	if (n <= keep) {
		free(steps);
		return;
	}
	int64_t oldest_kept = steps[n - keep];
	free(steps);
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char *end, path[4096];
		if (strncmp(e->d_name, "step-", 5) != 0)
			continue;
		long long s = strtoll(e->d_name + 5, &end, 10);
		if (*end || s >= oldest_kept)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	}
	if (d)
		closedir(d);
}

int64_t mlfs_snapshot_newest(const char *dir)
{
	int64_t *steps;
	int n = list_complete(dir, &steps);
	int64_t s = n > 0 ? steps[n - 1] : -1;
	free(steps);
	return s;
}

/* The step every rank of this node pinned, when it is newer than done;
 * else -1. Lock held. */
static int64_t ready_step(struct mlfs_autosnap *a, const struct mlfs_view *v)
{
	int r0 = v->layout.node_first_rank[a->st->node];
	int64_t s = -1;
	for (int i = 0; r0 >= 0 && i < v->layout.node_nranks[a->st->node]; i++) {
		int64_t p = v->psnap_step[r0 + i];
		if (p < 0 || (i > 0 && p != s))
			return -1;
		s = p;
	}
	return s > a->done ? s : -1;
}

/* Lets the view's pins of this node go: into @old, put after unlocking. */
static void take_pins(struct mlfs_store *st, struct mlfs_view *v, struct xf_buf **old)
{
	size_t per = (size_t)v->parts.nstates * (size_t)v->parts.ntensors;
	int r0 = v->layout.node_first_rank[st->node];
	for (int i = 0; r0 >= 0 && i < v->layout.node_nranks[st->node]; i++) {
		memcpy(old + (size_t)i * per, v->psnap + (size_t)i * per, per * sizeof(*old));
		memset(v->psnap + (size_t)i * per, 0, per * sizeof(*old));
		v->psnap_step[r0 + i] = -1;
	}
}

/* mlfs_snap_write's give_up: stopping, or a newer step pinned here. */
static bool newer_due(void *arg, int64_t step)
{
	struct mlfs_autosnap *a = arg;
	bool yes;
	pthread_mutex_lock(&a->st->lock);
	struct mlfs_view *v = a->st->view;
	int r0 = v ? v->layout.node_first_rank[a->st->node] : -1;
	yes = a->stop || (v && v->psnap && r0 >= 0 && v->psnap_step[r0] > step);
	pthread_mutex_unlock(&a->st->lock);
	return yes;
}

/* Writes step @step of @v from @boxes into its directory; lock not held. */
static void write_step(struct mlfs_autosnap *a, struct mlfs_view *v, int64_t step,
		       struct snap_box *boxes, size_t n)
{
	struct mlfs_store *st = a->st;
	const struct ptc_config *c = v->config;
	char dir[4096], path[4200];
	struct ptc_error err = {.text = ""};
	struct stat sb;
	int rc = 0;

	snprintf(dir, sizeof(dir), "%s/step-%" PRId64, c->snap_dir, step);
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (stat(path, &sb) == 0) {
		mlfs_log(MLFS_LOG_INFO, "snapshot: %s is complete already", dir);
	} else if (mkdir(c->snap_dir, 0755) && errno != EEXIST) {
		rc = ptc_errorf(&err, "snapshot: %s: %s", c->snap_dir, strerror(errno));
	} else {
		struct snap_opts o = {.dir = dir,
				      .level = c->snap_level,
				      .threads = c->snap_threads,
				      .max_bytes_s = c->snap_max_mib_s << 20,
				      .wait_s = WAIT_S,
				      .give_up = newer_due,
				      .arg = a};
		json_t *out = json_object();
		rc = out ? mlfs_snap_write(st, v, &o, step, boxes, n, out, &err) : -ENOMEM;
		if (!rc)
			mlfs_log(MLFS_LOG_INFO,
				 "snapshot: step %" PRId64 ": %" PRId64 " files, %" PRId64
				 " bytes in %.2f s%s",
				 step, (int64_t)n,
				 (int64_t)json_integer_value(json_object_get(out, "bytes")),
				 json_real_value(json_object_get(out, "seconds")),
				 json_is_true(json_object_get(out, "manifest"))
				     ? "; manifest written"
				     : "");
		json_decref(out);
		if (!rc && v->layout.ranks[0].node == st->node)
			prune(c->snap_dir, c->snap_keep);
	}
	if (rc && rc != -ECANCELED)
		mlfs_log(MLFS_LOG_ERROR, "%s", err.text);
	else if (rc)
		mlfs_log(MLFS_LOG_WARNING, "%s", err.text);
	int64_t newest = mlfs_snapshot_newest(c->snap_dir);
	pthread_mutex_lock(&st->lock);
	a->writing = -1;
	a->newest = newest;
	if (rc == -ECANCELED)
		a->skipped++;
	else if (rc)
		snprintf(a->error, sizeof(a->error), "%s", err.text);
	else {
		a->written++;
		a->written_step = step;
		a->polls = 0;
		a->error[0] = '\0';
	}
	pthread_mutex_unlock(&st->lock);
}

static void *autosnap_main(void *arg)
{
	struct mlfs_autosnap *a = arg;
	struct mlfs_store *st = a->st;

	pthread_setname_np(pthread_self(), "mlfs-snapshot");
	pthread_mutex_lock(&st->lock);
	while (!a->stop) {
		struct mlfs_view *v = st->view;
		if (v && v->config->snap_dir && strcmp(a->dir, v->config->snap_dir) != 0) {
			/* a new directory: what is there already */
			snprintf(a->dir, sizeof(a->dir), "%s", v->config->snap_dir);
			pthread_mutex_unlock(&st->lock);
			int64_t newest = mlfs_snapshot_newest(a->dir);
			pthread_mutex_lock(&st->lock);
			a->newest = newest;
			a->done = newest > a->done ? newest : a->done;
			continue;
		}
		int64_t step = v && v->psnap ? ready_step(a, v) : -1;
		if (step < 0 && a->written_step > a->newest && a->polls < WAIT_S) {
			/* This node's part of a step is written; rank 0's node writes
			 * the manifest when every part is there: look again in a
			 * second. */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec++;
			pthread_cond_timedwait(&a->cond, &st->lock, &ts);
			a->polls++;
			pthread_mutex_unlock(&st->lock);
			int64_t newest = mlfs_snapshot_newest(a->dir);
			pthread_mutex_lock(&st->lock);
			a->newest = newest > a->newest ? newest : a->newest;
			continue;
		}
		if (step < 0) {
			pthread_cond_wait(&a->cond, &st->lock);
			continue;
		}
		size_t nold = (size_t)v->layout.node_nranks[st->node] * (size_t)v->parts.nstates *
			      (size_t)v->parts.ntensors;
		struct xf_buf **old = calloc(nold ? nold : 1, sizeof(*old));
		struct snap_box *boxes = NULL;
		size_t n = 0;
		struct ptc_error err = {.text = ""};
		int rc = old ? mlfs_snap_collect(st, v, step, true, &boxes, &n, &err) : -ENOMEM;
		if (rc) {
			/* mlfs_snap_collect fails only for memory */
			snprintf(a->error, sizeof(a->error),
				 "snapshot: step %" PRId64 ": out of memory", step);
			a->done = step;
			free(old);
			continue;
		}
		take_pins(st, v, old);
		a->done = step;
		a->writing = step;
		mlfs_view_get(v);
		pthread_mutex_unlock(&st->lock);
		mlfs_bufs_put(old, nold);
		free(old);
		write_step(a, v, step, boxes, n);
		mlfs_snap_boxes_put(boxes, n);
		mlfs_view_put(v);
		pthread_mutex_lock(&st->lock);
	}
	pthread_mutex_unlock(&st->lock);
	return NULL;
}

int mlfs_autosnap_start(struct mlfs_store *st)
{
	struct mlfs_autosnap *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->st = st;
	a->done = a->writing = a->newest = a->manual = a->written_step = -1;
	pthread_cond_init(&a->cond, NULL);
	if (pthread_create(&a->thread, NULL, autosnap_main, a)) {
		pthread_cond_destroy(&a->cond);
		free(a);
		return -EAGAIN;
	}
	pthread_mutex_lock(&st->lock);
	st->autosnap = a;
	pthread_mutex_unlock(&st->lock);
	return 0;
}

void mlfs_autosnap_stop(struct mlfs_store *st)
{
	pthread_mutex_lock(&st->lock);
	struct mlfs_autosnap *a = st->autosnap;
	if (a) {
		a->stop = true;
		pthread_cond_signal(&a->cond);
	}
	pthread_mutex_unlock(&st->lock);
	if (!a)
		return;
	pthread_join(a->thread, NULL);
	pthread_mutex_lock(&st->lock);
	st->autosnap = NULL;
	pthread_mutex_unlock(&st->lock);
	pthread_cond_destroy(&a->cond);
	free(a);
}

void mlfs_autosnap_wake(struct mlfs_store *st)
{
	if (st->autosnap)
		pthread_cond_signal(&st->autosnap->cond);
}

void mlfs_autosnap_note(struct mlfs_store *st, const char *dir, int64_t step)
{
	pthread_mutex_lock(&st->lock);
	if (st->autosnap && strlen(dir) < sizeof(st->autosnap->manual_dir)) {
		st->autosnap->manual = step;
		snprintf(st->autosnap->manual_dir, sizeof(st->autosnap->manual_dir), "%s", dir);
	}
	pthread_mutex_unlock(&st->lock);
}

json_t *mlfs_autosnap_status(struct mlfs_store *st, const struct ptc_config *c)
{
	struct mlfs_autosnap *a = st->autosnap;
	bool periodic = c && c->snap_dir, same = periodic && a && strcmp(a->dir, c->snap_dir) == 0;
	char newest[4200] = "";
	int64_t step = -1;
	struct stat sb;

	if (same && a->newest >= 0) {
		step = a->newest;
		snprintf(newest, sizeof(newest), "%s/step-%" PRId64, a->dir, a->newest);
	}
	if (a && a->manual > step) { /* a complete one: its manifest is there */
		char m[4200];
		snprintf(m, sizeof(m), "%s/manifest.json", a->manual_dir);
		if (stat(m, &sb) == 0) {
			step = a->manual;
			snprintf(newest, sizeof(newest), "%s", a->manual_dir);
		}
	}
	if (!periodic && step < 0)
		return NULL;
	json_t *o = json_object();
	json_object_set_new(o, "newest_step", step >= 0 ? json_integer(step) : json_null());
	json_object_set_new(o, "newest", step >= 0 ? json_string(newest) : json_null());
	if (!periodic)
		return o;
	json_object_set_new(o, "dir", json_string(c->snap_dir));
	json_object_set_new(o, "every", json_integer(c->snap_every));
	json_object_set_new(o, "keep", json_integer(c->snap_keep));
	json_object_set_new(o, "writing",
			    a && a->writing >= 0 ? json_integer(a->writing) : json_null());
	json_object_set_new(o, "written", json_integer(a ? a->written : 0));
	json_object_set_new(o, "skipped", json_integer(a ? a->skipped : 0));
	json_object_set_new(o, "error", a && a->error[0] ? json_string(a->error) : json_null());
	return o;
}
