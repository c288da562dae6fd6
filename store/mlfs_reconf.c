/*
 * mlfs_reconf.c - reconfiguration as a state machine: validate, prepare,
 * commit, abort.
 *
 * DESIGN
 * One attempt at a time moves the store from its current view to a new
 * one. Its states (enum mlfs_reconf_state, status.json's "state"), one
 * function per transition:
 *
 *   idle/failed --prepare--> preparing --built--> prepared --commit--> committing --> idle
 *                                |                    |
 *                          abort or error           abort
 *                                v                    v
 *                                +----> aborting <----+ --> failed
 *
 *  validate    parses the config text once and opens the dataset it names
 *              (an index may be read over the network: no lock held).
 *  plan        no lock held: pins the current view, checks the version, the
 *              saved steps and the dataset change, builds the new view
 *              (layout, partition table, name trees), carries the dataset
 *              cursor, computes the plan and the new step table.
 *  prepare     takes st->lock only to re-check what the plan started from
 *              (no attempt, the same current view, the same saved step,
 *              room in --max-memory) and to publish "preparing"; a
 *              transformer thread builds the new partitions (xf_execute;
 *              unchanged ones shared, not copied). A build that fetches
 *              nothing and copies at most MLFS_INLINE_BUILD_BYTES here,
 *              and waits for a commit (a job of many nodes), runs on the
 *              preparing thread instead (build_inline).
 *  prepared    the build ended: the attempt waits with the new view and its
 *              pin on the old one. With autocommit (config.json on one
 *              node) the thread commits at once.
 *  commit      swaps the view pointer and the step table under the lock;
 *              then, without it, tells the FUSE layer, queues the dataset
 *              prefetch and lets the old view go; then idle. In a job of
 *              many nodes the view planned from is retained instead
 *              (st->retained, with its step) until the control plane
 *              releases it: every node of the commit swapped
 *              (mlfs_store_release_retained); an attempt may be planned
 *              from it (mlfs_reconf_down.source).
 *  abort       from preparing (the build is discarded when it ends) or
 *              prepared (at once); a build error aborts likewise. The new
 *              partitions are freed without the lock, then failed, with the
 *              reason in status.json.
 * The first config is no reconfiguration: with no view yet, config.json
 * installs it at once, partitions zero-filled, under the lock (the schema
 * may change until a view exists; nothing reads partitions before).
 *
 * Invariants: st->view changes only in commit. From prepare until the end
 * of committing or aborting st->state is MLFS_TRANSFORMING: partition and
 * step writes and imports get EBUSY, so the old partitions the build reads
 * cannot change, and the old view, pinned by the attempt, stays current,
 * readable and servable. An attempt's memory is back in st->mem before its
 * state leaves aborting, and the old view's (unless open files pin it or
 * it is retained)
 * before committing ends. st->attempt belongs to the transformer thread
 * while preparing, and to whoever detaches it under the lock afterwards.
 *
 * Threads and locks: FUSE workers (control-file writes) call validate,
 * prepare, commit and abort; one transformer thread per attempt builds and
 * (autocommit) commits, unless the build runs inline (then the preparing
 * thread is the transformer until its prepare returns). st->lock guards the state, the attempt
 * pointer and the store fields; it is held to check and publish, never while planning, copying,
 * freeing large buffers or notifying. The previous attempt's thread is joined by the next prepare,
 * after it is published, or at unmount.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

/* One attempt from prepare to its end. */
struct mlfs_attempt {
	struct mlfs_store *st;
	struct mlfs_view *from; /* the view planned from, pinned */
	struct mlfs_view *to;	/* the new view; the build fills its partitions */
	struct ptc_plan *plan;
	int64_t plan_bytes; /* the plan's blocks, counted in st->mem while it lives */
	int64_t step;	    /* the step every rank of @from saved */
	int64_t *steps;	    /* @to's step table (all @step), the store's at commit */
	bool autocommit;    /* commit as soon as prepared */
	struct xf_stats stats;
	char what[16]; /* names the request in messages: "config.json", "prepare" */
	char id[24];   /* the control plane's id of it ("": none), and its revision */
	int64_t rev;
	bool from_retained;	   /* @from is st->retained, not the current view */
	struct mlfs_view *drop[2]; /* views the commit let go, put with the attempt */
	/* The nodes of @from that cannot serve (mlfs_reconf_down's: down, or
	 * restarted without their partitions): their ranks' steps are not
	 * the job's. */
	int *down;
	int ndown;
};

static void attempt_free(struct mlfs_attempt *a)
{
	if (!a)
		return;
	mlfs_view_put(a->to);
	mlfs_view_put(a->from);
	mlfs_view_put(a->drop[0]);
	mlfs_view_put(a->drop[1]);
	ptc_plan_free(a->plan);
	free(a->steps);
	free(a->down);
	if (a->plan_bytes >= (1 << 20))
		malloc_trim(0); /* its pages back: RSS follows memory_used */
	if (a->plan_bytes)
		xf_mem_release(&a->st->mem, a->plan_bytes);
	free(a);
}

/* ------------------------------------------------------------------ states */

/* The one writer of st->reconf and of st->state, which follows it. Lock held. */
static void set_state(struct mlfs_store *st, enum mlfs_reconf_state s)
{
	st->reconf = s;
	st->state =
	    s == MLFS_RECONF_IDLE || s == MLFS_RECONF_FAILED ? MLFS_IDLE : MLFS_TRANSFORMING;
	if (st->reconf_changed) /* the control plane votes or publishes at once */
		st->reconf_changed(st->cluster_arg);
	mlfs_store_status_changed(st); /* mlfs reconfigure waits on it */
}

/*
 * 0 when an attempt to @version is in progress in one of the states of
 * @accepts (a mask of 1 << state); otherwise -EINVAL (no attempt, another
 * version) or -EBUSY (a state @op must wait out) with @err. Lock held.
 */
static int check_attempt(const struct mlfs_store *st, const char *op, unsigned accepts,
			 int64_t version, struct ptc_error *err)
{
	const char *name = mlfs_reconf_state_name(st->reconf);

	if (st->state != MLFS_TRANSFORMING)
		return ptc_errorf(err, "%s: no reconfiguration is in progress (state %s)", op,
				  name);
	if (!(accepts & 1u << st->reconf))
		return ptc_error_set(err, -EBUSY,
				     "%s: the reconfiguration to version %" PRId64 " is %s", op,
				     st->target_version, name);
	if (version != st->target_version)
		return ptc_errorf(err,
				  "%s: version %" PRId64
				  " is not the one in progress (version %" PRId64 ", %s)",
				  op, version, st->target_version, name);
	return 0;
}

/* ---------------------------------------------------------------- validate */

/* The dataset @c names: the current one, or opened (index read) now. No
 * lock held: reading an index may take network round trips. */
static int config_dataset(struct mlfs_store *st, const struct ptc_config *c, const char *what,
			  struct mlfs_dataset **ds, struct ptc_error *err)
{
	*ds = NULL;
	if (!c->has_dataset)
		return 0;
	struct mlfs_view *cur = mlfs_store_view(st);
	int rc = 0;
	if (cur && (rc = ptc_dataset_change_ok(cur->config, c, what, err)) == 0 &&
	    mlfs_dataset_is(cur->ds, c))
		*ds = mlfs_dataset_get(cur->ds);
	mlfs_view_put(cur);
	if (rc == 0 && !*ds)
		rc = mlfs_dataset_open(c, &st->data_opts, &st->mem, ds, err);
	return rc;
}

/* Parses @text once into *@c and opens its dataset into *@ds (NULL: none).
 * 0, or an error with @err and nothing to free. No lock held. */
static int reconf_validate(struct mlfs_store *st, const char *text, size_t len, const char *what,
			   struct ptc_config **c, struct mlfs_dataset **ds, struct ptc_error *err)
{
	int rc = ptc_config_parse_text(text, len, what, c, err);

	if (rc)
		return rc;
	if ((rc = config_dataset(st, *c, what, ds, err))) {
		ptc_config_free(*c);
		*c = NULL;
	}
	return rc;
}

/* ------------------------------------------------------------ first config */

/* A cursor of one segment: from @step on, @batch samples per step on @dp. */
static int cursor_init(struct ptc_cursor *c, int64_t step, int64_t batch, int dp)
{
	if (!(c->segs = malloc(sizeof(*c->segs))))
		return -ENOMEM;
	c->nsegs = 1;
	c->segs[0] = (struct ptc_cursor_seg){step, 0, batch, dp};
	return 0;
}

/* The first config (@c and @ds taken over): every local partition
 * zero-filled, current at once. Lock held: the schema may still change
 * until a view is set, so this one view is built under the lock; nothing
 * can read partitions yet. */
static int set_first_config(struct mlfs_store *st, struct ptc_config *c, struct mlfs_dataset *ds,
			    const char *text, size_t len, struct ptc_error *err)
{
	struct mlfs_view *v;
	int rc = mlfs_view_new(st, c, ds, text, len, "config.json", &v, err);

	if (rc)
		return rc;
	if (v->ds && cursor_init(&v->cursor, 0, c->dataset_global_batch, v->layout.dp)) {
		mlfs_view_put(v);
		return -ENOMEM;
	}
	if ((rc = xf_parts_alloc_zero(&v->parts, &st->mem))) {
		if (rc == -ENOSPC)
			ptc_error_set(err, rc,
				      "config.json: the partitions of this node do not fit in "
				      "--max-memory (%" PRId64 " bytes in use of %" PRId64 ")",
				      (int64_t)st->mem.used, st->mem.limit);
		mlfs_view_put(v);
		return rc;
	}
	int64_t *steps = calloc((size_t)v->layout.world, sizeof(int64_t));
	if (!steps) {
		mlfs_view_put(v);
		return -ENOMEM;
	}
	st->view = v;
	free(st->steps);
	st->steps = steps;
	mlfs_store_status_changed(st);
	mlfs_store_saving(st, true);
	mlfs_view_snap_local(st, v, NULL);
	return 0;
}

/* -------------------------------------------------------------------- plan */

/* Whether rank @r of layout @l is on one of attempt @a's down nodes. */
static bool rank_down(const struct mlfs_attempt *a, const struct ptc_layout *l, int r)
{
	for (int i = 0; i < a->ndown; i++)
		if (a->down[i] == l->ranks[r].node)
			return true;
	return false;
}

/* The step every rank of the current layout saved into *@step, or -EINVAL
 * naming a rank that lags. The ranks of @a's down nodes do not count: the
 * plan takes their partitions from other copies, which saved the step
 * (a node restarted without its state, a participant of the config that
 * drops it, holds step 0 for its own ranks). Lock held. */
static int saved_step(const struct mlfs_store *st, const struct mlfs_attempt *a, int64_t *step,
		      struct ptc_error *err)
{
	const struct ptc_layout *l = &st->view->layout;
	int lo = -1, hi = -1;

	for (int r = 0; r < l->world; r++) {
		if (rank_down(a, l, r))
			continue;
		lo = lo < 0 || st->steps[r] < st->steps[lo] ? r : lo;
		hi = hi < 0 || st->steps[r] > st->steps[hi] ? r : hi;
	}
	if (lo >= 0 && st->steps[lo] != st->steps[hi])
		return ptc_errorf(err,
				  "%s: ranks have not saved the same step: rank %d lags "
				  "at step %" PRId64 " while rank %d saved step %" PRId64,
				  a->what, lo, st->steps[lo], hi, st->steps[hi]);
	/* (every rank down: the plan refuses, naming what has no copy) */
	*step = lo < 0 || st->steps[lo] < 0 ? 0 : st->steps[lo];
	return 0;
}

/* The new view's cursor: the old one continued from the saved @step, or a
 * new one when the dataset appears. */
static int cursor_carry(const struct mlfs_view *old, struct mlfs_view *v, int64_t step,
			const char *what, struct ptc_error *err)
{
	if (!v->ds)
		return 0;
	if (!old->ds)
		return cursor_init(&v->cursor, step, v->config->dataset_global_batch, v->layout.dp);
	size_t n = (size_t)old->cursor.nsegs * sizeof(*old->cursor.segs);
	if (!(v->cursor.segs = malloc(n)))
		return -ENOMEM;
	memcpy(v->cursor.segs, old->cursor.segs, n);
	v->cursor.nsegs = old->cursor.nsegs;
	int rc =
	    ptc_cursor_advance(&v->cursor, step, v->config->dataset_global_batch, v->layout.dp);
	if (rc == -ERANGE)
		return ptc_errorf(err,
				  "%s: the ranks saved step %" PRId64
				  ", before the dataset's first step %" PRId64,
				  what, step, old->cursor.segs[0].step);
	return rc;
}

/* What the plan starts from: the current view (or, when @source names
 * another version, the retained one) pinned into a->from and the step it
 * holds, after the checks that need only the lock (no attempt, a layout to
 * change, a newer version, equal steps). */
static int plan_snapshot(struct mlfs_store *st, struct mlfs_attempt *a, int64_t version,
			 int64_t source, struct ptc_error *err)
{
	int rc;

	pthread_mutex_lock(&st->lock);
	if ((rc = mlfs_reconf_busy(st, a->what, err)))
		goto out;
	if (!st->view)
		rc = ptc_errorf(
		    err, "%s: no current layout: write schema.json and config.json first", a->what);
	else if (version <= st->view->config->version)
		rc = ptc_errorf(
		    err, "%s: \"version\" = %" PRId64 " is not greater than the current %" PRId64,
		    a->what, version, st->view->config->version);
	else if (source && source != st->view->config->version) {
		if (!st->retained || st->retained->config->version != source)
			rc = ptc_errorf(err,
					"%s: the attempt is planned from layout version %" PRId64
					", which this node does not retain (it holds version "
					"%" PRId64 "%s)",
					a->what, source, st->view->config->version,
					st->retained ? " and a retained older one" : "");
		else {
			a->from = mlfs_view_get(st->retained);
			a->from_retained = true;
			a->step = st->retained_step;
		}
	} else if ((rc = saved_step(st, a, &a->step, err)) == 0)
		a->from = mlfs_view_get(st->view);
out:
	pthread_mutex_unlock(&st->lock);
	return rc;
}

/* The plan of this node's part of @a past the nodes of @dn (NULL: none
 * down): ptc_plan_compute_node, in the size of this node's partitions, not
 * the job's. Its per_node[st->node] is exact (what the executor builds,
 * progress_total, xf_plan_new_bytes); for the other nodes it holds only
 * what this node fetches from them. */
static int plan_down(struct mlfs_attempt *a, const struct mlfs_reconf_down *dn,
		     struct ptc_error *err)
{
	int n = a->to->layout.cluster->nnodes, *backup_of = NULL;
	if (dn && dn->nbackup) { /* one entry per node of the new layout's cluster */
		if (!(backup_of = malloc((size_t)n * sizeof(int))))
			return -ENOMEM;
		for (int i = 0; i < n; i++)
			backup_of[i] = i < dn->nbackup ? dn->backup_of[i] : -1;
	}
	int rc = ptc_plan_compute_node(&a->from->layout, &a->to->layout, dn ? dn->down : NULL,
				       dn ? dn->ndown : 0, backup_of, a->st->node, &a->plan, err);
	free(backup_of);
	return rc;
}

/*
 * Plans an attempt to @c (and dataset @ds; both taken over) into *@out
 * without the lock: the new view, its cursor and step table, the plan.
 * The current view cannot be freed meanwhile (pinned) and the schema is
 * fixed once a view is set. 0, or an error with @err.
 */
static int reconf_plan(struct mlfs_store *st, struct ptc_config *c, struct mlfs_dataset *ds,
		       const char *text, size_t len, const char *what,
		       const struct mlfs_reconf_down *dn, struct mlfs_attempt **out,
		       struct ptc_error *err)
{
	struct mlfs_attempt *a = calloc(1, sizeof(*a));
	int rc = -ENOMEM;

	if (!a)
		goto err_free_config;
	a->st = st;
	snprintf(a->what, sizeof(a->what), "%s", what);
	if (dn && dn->id) {
		snprintf(a->id, sizeof(a->id), "%s", dn->id);
		a->rev = dn->rev;
	}
	if (dn && dn->ndown) {
		if (!(a->down = malloc((size_t)dn->ndown * sizeof(int))))
			goto err_free_config;
		memcpy(a->down, dn->down, (size_t)dn->ndown * sizeof(int));
		a->ndown = dn->ndown;
	}
	if ((rc = plan_snapshot(st, a, c->version, dn ? dn->source : 0, err)) ||
	    (rc = ptc_dataset_change_ok(a->from->config, c, what, err)))
		goto err_free_config;
	rc = mlfs_view_new(st, c, ds, text, len, what, &a->to, err); /* takes c and ds */
	if (rc || (rc = cursor_carry(a->from, a->to, a->step, what, err)))
		goto err_free_attempt;
	for (int k = 0; k < 2; k++) {
		const struct ptc_layout *l = k ? &a->to->layout : &a->from->layout;
		if (!st->multinode && l->node_nranks[st->node] != l->world) {
			rc = ptc_errorf(err,
					"%s: ranks on other nodes: reconfiguring across nodes "
					"needs the peer transport, which this build does not "
					"have yet",
					what);
			goto err_free_attempt;
		}
	}
	if ((rc = plan_down(a, dn, err)))
		goto err_free_attempt;
	int64_t pb = mlfs_mem_plan(a->plan);
	if ((rc = xf_mem_reserve(&st->mem, pb))) {
		ptc_error_set(err, rc,
			      "%s: the plan (%zu operations, %" PRId64 " bytes) does not fit in "
			      "--max-memory (%" PRId64 " bytes in use of %" PRId64 ")",
			      what, a->plan->nops, pb, (int64_t)st->mem.used, st->mem.limit);
		goto err_free_attempt;
	}
	a->plan_bytes = pb;
	rc = -ENOMEM;
	if (!(a->steps = malloc((size_t)a->to->layout.world * sizeof(int64_t))))
		goto err_free_attempt;
	for (int r = 0; r < a->to->layout.world; r++)
		a->steps[r] = a->step;
	*out = a;
	return 0;

err_free_config:
	ptc_config_free(c);
	mlfs_dataset_put(ds);
err_free_attempt:
	attempt_free(a);
	return rc;
}

/* ------------------------------------------------------------------ commit */

/* prepared -> committing: the new view and step table become current.
 * Lock held; @a detached from the store. */
static void commit_begin(struct mlfs_store *st, struct mlfs_attempt *a)
{
	struct mlfs_view *old = st->view;

	assert(st->reconf == MLFS_RECONF_PREPARED &&
	       (a->from_retained ? st->retained : old) == a->from);
	set_state(st, MLFS_RECONF_COMMITTING);
	st->view = a->to; /* takes over the attempt's reference */
	a->to = NULL;
	/* The store's references are put with the attempt, without the lock
	 * (a->from pins the view planned from; the others may be the last). */
	a->drop[0] = old;
	if (a->id[0]) { /* many nodes: the layout planned from is retained */
		a->drop[1] = st->retained;
		st->retained = mlfs_view_get(a->from);
		st->retained_step = a->step;
	}
	free(st->steps);
	st->steps = a->steps;
	a->steps = NULL;
	mlfs_store_saving(st, true);		  /* the new layout's ranks: no save yet */
	mlfs_view_snap_local(st, st->view, NULL); /* the saved state, for backups */
	st->last = a->stats;
	/* served to peers since the last commit: every attempt fetch is for
	 * the current version, and some start before this node's prepare */
	st->last_served = atomic_load(&st->served) - st->served_base;
	st->served_base = atomic_load(&st->served);
	st->last_peak = atomic_load(&st->mem.peak) - st->mem_base;
	st->last_from = a->from->config->version;
	st->last_to = st->view->config->version;
	st->has_last = true;
	st->error[0] = '\0';
}

/* committing -> idle: the FUSE layer told, the dataset prefetch queued,
 * the old view let go (freed here unless open files pin it). No lock. */
static void commit_finish(struct mlfs_store *st, struct mlfs_attempt *a)
{
	mlfs_store_changed(st, "");
	struct mlfs_view *now = mlfs_store_view(st);
	mlfs_store_prefetch(st, now, a->step);
	mlfs_view_put(now);
	attempt_free(a);
	pthread_mutex_lock(&st->lock);
	set_state(st, MLFS_RECONF_IDLE);
	pthread_mutex_unlock(&st->lock);
}

int mlfs_reconf_commit(struct mlfs_store *st, int64_t version, struct ptc_error *err)
{
	struct mlfs_attempt *a = NULL;
	int rc;

	pthread_mutex_lock(&st->lock);
	rc = check_attempt(st, "commit", 1u << MLFS_RECONF_PREPARED, version, err);
	if (rc == 0) {
		a = st->attempt;
		st->attempt = NULL;
		commit_begin(st, a);
	}
	pthread_mutex_unlock(&st->lock);
	if (a)
		commit_finish(st, a);
	return rc;
}

/* ------------------------------------------------------------------- abort */

/* aborting -> failed: frees the attempt (its new partitions go back to
 * st->mem), then failed; st->error already says why. No lock; @a
 * detached from the store. */
static void abort_finish(struct mlfs_store *st, struct mlfs_attempt *a)
{
	attempt_free(a);
	pthread_mutex_lock(&st->lock);
	set_state(st, MLFS_RECONF_FAILED);
	pthread_mutex_unlock(&st->lock);
}

/* preparing or prepared -> aborting; status.json says "reconfiguration to
 * version N @how: @why" (a long reason cut). Lock held. */
static void abort_begin(struct mlfs_store *st, const char *how, const char *why)
{
	atomic_store(&st->cancel, 1);
	st->served_base = atomic_load(&st->served); /* what it served counts for none */
	snprintf(st->error, sizeof(st->error), "reconfiguration to version %" PRId64 " %s: %.400s",
		 st->target_version, how, why);
	set_state(st, MLFS_RECONF_ABORTING);
}

int mlfs_reconf_abort(struct mlfs_store *st, int64_t version, const char *reason,
		      struct ptc_error *err)
{
	struct mlfs_attempt *a = NULL;
	int rc;

	pthread_mutex_lock(&st->lock);
	rc = check_attempt(st, "abort", 1u << MLFS_RECONF_PREPARING | 1u << MLFS_RECONF_PREPARED,
			   version, err);
	if (rc == 0) {
		if (st->reconf == MLFS_RECONF_PREPARED) { /* else the build discards it */
			a = st->attempt;
			st->attempt = NULL;
		}
		abort_begin(st, "aborted", reason && *reason ? reason : "by request");
	}
	pthread_mutex_unlock(&st->lock);
	if (a)
		abort_finish(st, a);
	return rc;
}

/* ---------------------------------------------------------------- prepared */

/* preparing -> prepared when the build of @a ended with @rc; a build error
 * aborts, and so does an abort that came meanwhile; with autocommit,
 * commits. Transformer thread. */
static void reconf_prepared(struct mlfs_store *st, struct mlfs_attempt *a, int rc)
{
	pthread_mutex_lock(&st->lock);
	assert(st->attempt == a);
	if (st->reconf == MLFS_RECONF_PREPARING && rc) {
		/* what the build noted (a fetch names its peer), else the errno */
		char why[PTC_ERROR_MAX];
		snprintf(why, sizeof(why), "%s",
			 st->error[0]	 ? st->error
			 : rc == -ENOSPC ? "out of memory (--max-memory)"
					 : strerror(-rc));
		abort_begin(st, "failed", why);
	}
	if (st->reconf == MLFS_RECONF_ABORTING) {
		st->attempt = NULL;
		pthread_mutex_unlock(&st->lock);
		abort_finish(st, a);
		return;
	}
	set_state(st, MLFS_RECONF_PREPARED);
	mlfs_log(MLFS_LOG_DEBUG, "store: prepared version %" PRId64, st->target_version);
	if (!a->autocommit) {
		pthread_mutex_unlock(&st->lock);
		return;
	}
	st->attempt = NULL;
	commit_begin(st, a);
	pthread_mutex_unlock(&st->lock);
	commit_finish(st, a);
}

/* The executor's fetch callback: the store's, for the version built from. */
static int attempt_fetch(void *arg, const struct xf_piece *v, size_t n)
{
	struct mlfs_attempt *a = arg;
	struct mlfs_store *st = a->st;
	if (!st->fetch)
		return -EHOSTUNREACH;
	return st->fetch(st->fetch_arg, a->from->config->version, v, n);
}

/* The build of @a, then prepared (or aborted). */
static void prepare_run(struct mlfs_attempt *a)
{
	struct mlfs_store *st = a->st;
	int rc = xf_execute(a->plan, st->node, &a->from->parts, &a->to->parts, &st->mem,
			    st->threads, attempt_fetch, a, &st->progress, &a->stats);

	reconf_prepared(st, a, rc);
}

static void *prepare_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-prepare"); /* for top -H, perf */
	prepare_run(arg);
	return NULL;
}

/* Whether attempt @a's build runs on the thread that prepares it rather
 * than on a transformer thread of its own: it fetches nothing and copies
 * at most MLFS_INLINE_BUILD_BYTES on this node (a millisecond's work),
 * and it waits for a commit (an autocommit commits at the build's end and
 * tells the FUSE layer, which its caller, a FUSE worker, must not wait
 * for). Most attempts of a job of many nodes move nothing on most nodes:
 * a thread for each cost more than the build. */
static bool build_inline(const struct mlfs_store *st, const struct mlfs_attempt *a)
{
	const struct ptc_node_stats *n = &a->plan->per_node[st->node];
	return !a->autocommit && n->bytes_in == 0 &&
	       n->bytes_local + n->bytes_zero <= MLFS_INLINE_BUILD_BYTES;
}

/* ----------------------------------------------------------------- prepare */

/*
 * idle or failed -> preparing: publishes planned attempt @a (taken over)
 * if the store is still as it was planned from, and starts its build.
 */
static int reconf_publish(struct mlfs_store *st, struct mlfs_attempt *a, struct ptc_error *err)
{
	int64_t need = xf_plan_new_bytes(a->plan, st->node), step;
	pthread_t prev;
	bool join_prev;
	int rc;

	pthread_mutex_lock(&st->lock);
	if ((rc = mlfs_reconf_busy(st, a->what, err)))
		goto err_unlock;
	if ((a->from_retained ? st->retained : st->view) != a->from) {
		rc = ptc_error_set(err, -EBUSY,
				   "%s: the layout changed to version %" PRId64
				   " while this reconfiguration was planned from version %" PRId64
				   "; write it again",
				   a->what, st->view->config->version, a->from->config->version);
		goto err_unlock;
	}
	if (a->from_retained)
		step = a->step; /* the retained layout's, fixed */
	else if ((rc = saved_step(st, a, &step, err)))
		goto err_unlock;
	if (step != a->step) {
		rc = ptc_error_set(err, -EBUSY,
				   "%s: the ranks saved step %" PRId64
				   " while this reconfiguration was planned at step %" PRId64
				   "; write it again",
				   a->what, step, a->step);
		goto err_unlock;
	}
	int partial = a->from_retained ? -1 : mlfs_store_saving(st, false);
	if (partial >= 0) { /* its partitions are newer than the step agreed */
		rc = ptc_error_set(
		    err, -EBUSY,
		    "%s: rank %d is saving: a partition was written after its step %" PRId64
		    " (a save in progress, or one cut short: write its step again when "
		    "its save is whole); write it again",
		    a->what, partial, st->steps[partial]);
		goto err_unlock;
	}
	if (st->mem.limit && st->mem.used + need > st->mem.limit) {
		rc = ptc_error_set(err, -ENOSPC,
				   "%s: reconfiguration needs %" PRId64 " bytes for changed "
				   "partitions; %" PRId64 " of --max-memory %" PRId64 " are free",
				   a->what, need, st->mem.limit - (int64_t)st->mem.used,
				   st->mem.limit);
		goto err_unlock;
	}
	prev = st->xf_thread;
	join_prev = st->xf_joinable;
	snprintf(st->attempt_id, sizeof(st->attempt_id), "%s", a->id);
	st->attempt_rev = a->rev;
	set_state(st, MLFS_RECONF_PREPARING);
	st->attempt = a;
	st->target_version = a->to->config->version;
	atomic_store(&st->cancel, 0);
	st->mem_base = atomic_load(&st->mem.used);
	atomic_store(&st->mem.peak, st->mem_base);
	st->progress = 0;
	st->progress_total = a->plan->per_node[st->node].bytes_total;
	st->error[0] = '\0';
	bool here = build_inline(st, a);
	if (!here && (rc = -pthread_create(&st->xf_thread, NULL, prepare_main, a))) {
		ptc_error_set(err, rc, "%s: cannot start a transformer thread: %s", a->what,
			      strerror(-rc));
		snprintf(st->error, sizeof(st->error), "%s", err->text);
		st->xf_thread = prev;
		st->attempt = NULL;
		set_state(st, MLFS_RECONF_FAILED);
		goto err_unlock;
	}
	st->xf_joinable = !here; /* (the previous one is joined below) */
	pthread_mutex_unlock(&st->lock);
	/* The previous attempt ended (the store was idle or failed); its thread
	 * may still be letting go of its old view. */
	if (join_prev)
		pthread_join(prev, NULL);
	if (here)
		prepare_run(a);
	return 0;

err_unlock:
	pthread_mutex_unlock(&st->lock);
	attempt_free(a);
	return rc;
}

/* Plans and publishes an attempt to @c and @ds (taken over). */
static int reconf_start(struct mlfs_store *st, struct ptc_config *c, struct mlfs_dataset *ds,
			const char *text, size_t len, const char *what, bool autocommit,
			const struct mlfs_reconf_down *dn, struct ptc_error *err)
{
	struct mlfs_attempt *a;
	int rc = reconf_plan(st, c, ds, text, len, what, dn, &a, err);

	if (rc)
		return rc;
	a->autocommit = autocommit;
	return reconf_publish(st, a, err);
}

int mlfs_reconf_prepare(struct mlfs_store *st, const char *text, size_t len, const char *what,
			bool autocommit, struct ptc_error *err)
{
	return mlfs_reconf_prepare_down(st, text, len, what, autocommit, NULL, err);
}

int mlfs_reconf_prepare_down(struct mlfs_store *st, const char *text, size_t len, const char *what,
			     bool autocommit, const struct mlfs_reconf_down *dn,
			     struct ptc_error *err)
{
	struct ptc_config *c;
	struct mlfs_dataset *ds;
	int rc = reconf_validate(st, text, len, what, &c, &ds, err);

	return rc ? rc : reconf_start(st, c, ds, text, len, what, autocommit, dn, err);
}

/* @first_only: a config that only a node without a layout installs (the
 * control thread's copy of the job's first config, which may race with the
 * node that proposed it): nothing when a layout is already set. */
static int install_config(struct mlfs_store *st, const char *text, size_t len, bool first_only,
			  struct ptc_error *err)
{
	struct ptc_config *c;
	struct mlfs_dataset *ds;
	bool first = false;
	int rc = reconf_validate(st, text, len, "config.json", &c, &ds, err);

	if (rc == 0) {
		pthread_mutex_lock(&st->lock);
		if (!st->schema) {
			ptc_config_free(c);
			mlfs_dataset_put(ds);
			rc = ptc_errorf(err, "config.json: write schema.json first");
		} else if (!st->view) {
			first = true;
			if ((rc = set_first_config(st, c, ds, text, len, err)) == 0)
				st->error[0] = '\0';
		} else if (first_only) {
			ptc_config_free(c);
			mlfs_dataset_put(ds);
			pthread_mutex_unlock(&st->lock);
			return 0;
		}
		pthread_mutex_unlock(&st->lock);
		/* A view, once set, stays set: the rest is a reconfiguration. */
		if (rc == 0 && !first)
			rc = reconf_start(st, c, ds, text, len, "config.json", true, NULL, err);
	}
	if (rc) {
		mlfs_store_note_error(st, err->text);
	} else if (first) {
		mlfs_store_changed(st, "");
		struct mlfs_view *v = mlfs_store_view(st);
		mlfs_store_prefetch(st, v, 0);
		mlfs_view_put(v);
	}
	return rc;
}

int mlfs_store_install_config(struct mlfs_store *st, const char *text, size_t len,
			      struct ptc_error *err)
{
	return install_config(st, text, len, false, err);
}

int mlfs_store_install_first_config(struct mlfs_store *st, const char *text, size_t len,
				    struct ptc_error *err)
{
	return install_config(st, text, len, true, err);
}

int mlfs_store_release_retained(struct mlfs_store *st, int64_t version)
{
	struct mlfs_view *v = NULL;
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	if (st->state == MLFS_TRANSFORMING)
		rc = -EBUSY;
	else if (st->retained && st->retained->config->version == version) {
		v = st->retained;
		st->retained = NULL;
		rc = 1;
	}
	pthread_mutex_unlock(&st->lock);
	mlfs_view_put(v); /* freed here unless a reader or a reply pins it */
	return rc;
}

/* ---------------------------------------------------------------- shutdown */

void mlfs_reconf_shutdown(struct mlfs_store *st)
{
	if (st->xf_joinable)
		pthread_join(st->xf_thread, NULL);
	st->xf_joinable = false;
	pthread_mutex_lock(&st->lock);
	struct mlfs_attempt *a = st->attempt; /* prepared, never committed */
	st->attempt = NULL;
	if (a)
		abort_begin(st, "aborted", "unmounted");
	pthread_mutex_unlock(&st->lock);
	if (a)
		abort_finish(st, a);
}
