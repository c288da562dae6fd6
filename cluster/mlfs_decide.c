/*
 * mlfs_decide.c - the control plane's decisions, as one pure function of
 * what a node knows (decide_i.h).
 *
 * DESIGN
 * etcd holds every decision that involves other nodes (DESIGN section 7):
 * the committed config and the attempt that committed it, who is alive
 * (leases), the attempt in progress and its votes. A node only follows:
 *
 *  1. Without a fresh read of etcd it decides nothing. Its layout stays
 *     current and readable; an attempt it prepared and voted on waits for
 *     etcd's decision (the commit point lives there).
 *  2. A lease that expired (the node was frozen or cut off) is granted
 *     again, never silently: everything the node prepared meanwhile is
 *     judged against etcd's committed config like any other attempt.
 *  3. The store's attempt is committed only when etcd's committed config
 *     for its version was committed by that very attempt (its id); an
 *     attempt that etcd committed under another id, or that vanished from
 *     etcd without a commit, is discarded. A snapshot older than the
 *     attempt's creation decides nothing about it.
 *  4. A node whose layout is older than the committed one, other than by
 *     the attempt it is about to commit, missed a commit: its partitions
 *     are not the job's (lost) until a layout without ranks on it commits.
 *  5. A node that starts without a layout installs the committed config;
 *     when the job is past its first config, or this node saved state
 *     before (its saved/<id> key outlives the daemon: a step written, a
 *     checkpoint imported), its zero-filled partitions are not the job's:
 *     lost. (A node merely slow to install the first config, while others
 *     import theirs, saved nothing yet: its zeros are its state.)
 *  6. A participant prepares an attempt from its version, votes ready once
 *     prepared, failed when its prepare failed or it is at another version.
 *  7. The coordinator commits when every participant voted ready for its
 *     attempt; aborts on a failed vote, a participant down, or the deadline.
 *  8. The previous layout is released once every node of the last commit
 *     serves the committed version, up and not lost (a node dying before
 *     its swap, or restarting without its memory after it, leaves the
 *     survivors' copies of the previous layout in place). A node that
 *     reads the entries and sees it announces it (etcd's "released" key,
 *     the version); the others release on the announcement, without
 *     reading every entry, at their next round (the announcement wakes
 *     none: mlfs_cluster.c's released_put; the coordinator of the commit
 *     announces; any node still waiting 2 s after its swap, with no
 *     announcement, reads the entries itself).
 *  9. The coordinator plans an attempt from the current layout, unless
 *     nodes are down and it has no copy of some partition while the
 *     retained layout (rule 8 kept it: a node died before its swap) has a
 *     copy of everything on live nodes that still retain it: then from
 *     that (mlfs_decide_source), at the step it holds.
 * 10. A lost node whose layout is the committed version restores it from
 *     the snapshot that `mlfs resume` names in etcd's "restore" key for
 *     that version (once per key): it reads its ranks' boxes, and its
 *     partitions are the job's again (the command puts the key only while
 *     no node of the config is up with state in memory, so every node
 *     holds the snapshot's step; mlfs_resume_refusal).
 * 11. A node that serves the committed version, not lost and with no
 *     attempt in its store, runs the job-wide import that etcd's "import"
 *     key names for that version (`mlfs import --every-node`; once per
 *     key): into its own ranks, all or nothing, as a local import.
 * tests/model/protocol.pml models rules 1-8 for spin.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cluster/decide_i.h"

struct out {
	struct mlfs_action *acts;
	int n;
};

static void add(struct out *o, enum mlfs_act kind, int64_t version, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(struct out *o, enum mlfs_act kind, int64_t version, const char *fmt, ...)
{
	if (o->n >= MLFS_DECIDE_MAX)
		return;
	struct mlfs_action *a = &o->acts[o->n++];
	a->kind = kind;
	a->version = version;
	a->reason[0] = '\0';
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(a->reason, sizeof(a->reason), fmt, ap);
		va_end(ap);
	}
}

static bool same(const char *a, const char *b)
{
	return a && b && strcmp(a, b) == 0;
}

static bool store_active(const struct mlfs_snap *s)
{
	return s->reconf == MLFS_RECONF_PREPARING || s->reconf == MLFS_RECONF_PREPARED;
}

/* Rule 3: what becomes of the store's attempt. True when the node commits
 * it now or is about to (etcd committed it while it builds). */
static bool judge_store_attempt(const struct mlfs_snap *s, struct out *o)
{
	if (!store_active(s) || !s->prepare_id[0])
		return false;
	if (s->committed >= s->target) {
		if (s->committed == s->target && same(s->commit_id, s->prepare_id)) {
			if (s->reconf == MLFS_RECONF_PREPARED)
				add(o, MLFS_ACT_COMMIT, s->target, NULL);
			return true;
		}
		add(o, MLFS_ACT_DISCARD, s->target,
		    "version %lld was committed by another attempt (%s), not this one (%s)",
		    (long long)s->committed, s->commit_id[0] ? s->commit_id : "a first config",
		    s->prepare_id);
		return false;
	}
	if (s->revision < s->prepare_rev)
		return false; /* etcd as read predates the attempt */
	if (!s->attempt || !same(s->attempt->id, s->prepare_id))
		add(o, MLFS_ACT_DISCARD, s->target,
		    "the attempt to version %lld vanished without a commit (its coordinator "
		    "aborted it, or is down or cut off from etcd)",
		    (long long)s->target);
	return false;
}

/* Rule 6: this node's part in the attempt in etcd. */
static void participate(const struct mlfs_snap *s, struct out *o)
{
	const struct mlfs_snap_attempt *a = s->attempt;
	const struct mlfs_snap_node *me = &s->nodes[s->me];
	bool ours = same(s->prepare_id, a->id);

	if (!me->participant || s->lease_expired || me->vote != MLFS_VOTE_NONE)
		return;
	if (!ours && s->have != a->from) {
		add(o, MLFS_ACT_VOTE_FAILED, a->to,
		    "node %s is at version %lld, not the attempt's %lld", me->id,
		    (long long)s->have, (long long)a->from);
	} else if (!ours) {
		if (!store_active(s) && s->reconf != MLFS_RECONF_COMMITTING &&
		    s->reconf != MLFS_RECONF_ABORTING)
			add(o, MLFS_ACT_PREPARE, a->to, NULL);
	} else if (s->reconf == MLFS_RECONF_PREPARED) {
		add(o, MLFS_ACT_VOTE_READY, a->to, NULL);
	} else if (s->reconf == MLFS_RECONF_FAILED || s->reconf == MLFS_RECONF_IDLE) {
		/* its prepare failed or was aborted: the store says why */
		add(o, MLFS_ACT_VOTE_FAILED, a->to, NULL);
	}
}

/* Rule 7: the coordinator's part. */
static void coordinate(const struct mlfs_snap *s, struct out *o)
{
	const struct mlfs_snap_attempt *a = s->attempt;
	bool all = true;

	if (!s->coordinating || !same(a->coordinator, s->nodes[s->me].id) || !s->nodes_known)
		return;
	if (s->now_ms > a->deadline_ms) {
		add(o, MLFS_ACT_FINISH_ABORT, a->to,
		    "the deadline passed before every node was ready");
		return;
	}
	for (int i = 0; i < s->nnodes; i++) {
		const struct mlfs_snap_node *n = &s->nodes[i];
		if (!n->participant)
			continue;
		if (!n->up) {
			add(o, MLFS_ACT_FINISH_ABORT, a->to, "node %s is down (its lease expired)",
			    n->id);
			return;
		}
		if (n->vote == MLFS_VOTE_FAILED) {
			add(o, MLFS_ACT_FINISH_ABORT, a->to, "node %s: failed: %s", n->id,
			    n->reason ? n->reason : "");
			return;
		}
		all &= n->vote == MLFS_VOTE_READY;
	}
	if (all)
		add(o, MLFS_ACT_FINISH_COMMIT, a->to, NULL);
}

int mlfs_decide(const struct mlfs_snap *s, struct mlfs_action *acts)
{
	struct out o = {acts, 0};

	if (!s->etcd_ok)
		return 0; /* rule 1 */
	if (s->lease_expired)
		add(&o, MLFS_ACT_REGISTER, s->have, NULL); /* rule 2 */
	if (s->has_schema && !s->store_schema)
		add(&o, MLFS_ACT_INSTALL_SCHEMA, 0, NULL);
	if (s->committed > 0 && s->have == 0) { /* rule 5 */
		if (s->has_schema || s->store_schema) {
			add(&o, MLFS_ACT_INSTALL_CONFIG, s->committed, NULL);
			if (s->saved_step >= 0 || s->committed > 1)
				add(&o, MLFS_ACT_MARK_LOST, s->committed,
				    "this node started without the job's state (it saved step "
				    "%lld, the job is at version %lld): its partitions are empty, "
				    "not the job's; a config that drops it is served from the "
				    "other "
				    "nodes",
				    (long long)s->saved_step, (long long)s->committed);
		}
		return o.n;
	}
	bool committing = judge_store_attempt(s, &o);
	if (s->have && s->committed > s->have && !committing && !s->lost) /* rule 4 */
		add(&o, MLFS_ACT_MARK_LOST, s->committed,
		    "this node missed the commit of version %lld (it holds version %lld): restart "
		    "it to rejoin the job",
		    (long long)s->committed, (long long)s->have);
	if (s->lost && s->have >= s->committed && !s->hosts_ranks)
		add(&o, MLFS_ACT_CLEAR_LOST, s->have, NULL);
	else if (s->lost && s->restore_id && s->restore_version == s->committed &&
		 s->have == s->committed && s->reconf == MLFS_RECONF_IDLE &&
		 !same(s->restore_id, s->restore_tried)) /* rule 10 */
		add(&o, MLFS_ACT_RESTORE, s->have, NULL);
	if (s->import_id && s->import_version == s->committed && s->have == s->committed &&
	    !s->lost && (s->reconf == MLFS_RECONF_IDLE || s->reconf == MLFS_RECONF_FAILED) &&
	    !same(s->import_id, s->import_tried)) /* rule 11 */
		add(&o, MLFS_ACT_IMPORT, s->have, NULL);
	if (s->attempt) {
		participate(s, &o);
		coordinate(s, &o);
	}
	if (s->retained && !store_active(s)) { /* rule 8 */
		bool swapped = s->nodes_known;
		for (int i = 0; swapped && i < s->nnodes; i++)
			if (s->nodes[i].swap_waited)
				swapped &= s->nodes[i].up && !s->nodes[i].lost &&
					   s->nodes[i].version >= s->have;
		if (swapped && s->released < s->have && s->committed == s->have)
			add(&o, MLFS_ACT_ANNOUNCE_RELEASED, s->have, NULL);
		if (swapped || (s->released >= s->have && s->committed == s->have))
			add(&o, MLFS_ACT_RELEASE_RETAINED, s->retained, NULL);
	}
	return o.n;
}

int mlfs_decide_servable_by_node(const struct ptc_layout *from, const struct ptc_layout *to,
				 const int *down, int ndown, const int *backup_of,
				 struct ptc_error *why)
{
	int rc = 0;
	/* every row of @to is built by the node that hosts it: each such
	 * node's plan finds a source for every row it needs, or says which */
	for (int n = 0; n < to->cluster->nnodes && rc == 0; n++) {
		struct ptc_plan *p = NULL;
		if (to->node_nranks[n] > 0)
			rc = ptc_plan_compute_node(from, to, down, ndown, backup_of, n, &p, why);
		ptc_plan_free(p);
	}
	return rc == -ENOMEM ? rc : rc ? 1 : 0;
}

int mlfs_decide_servable(const struct ptc_layout *from, const struct ptc_layout *to,
			 const int *down, int ndown, const int *backup_of, struct ptc_error *why)
{
	struct ptc_plan *p = NULL;
	int rc = ptc_plan_compute_backups(from, to, down, ndown, backup_of, &p, why);
	ptc_plan_free(p);
	if (rc == -E2BIG) /* past the whole job's plan: one node's at a time */
		return mlfs_decide_servable_by_node(from, to, down, ndown, backup_of, why);
	return rc == -ENOMEM ? rc : rc ? 1 : 0;
}

int mlfs_decide_source(const struct ptc_layout *cur, const int *down, int ndown,
		       const int *backup_of, const struct ptc_layout *ret, int64_t rv,
		       const struct ptc_layout *to, const struct mlfs_snap_node *nodes, int nnodes,
		       int *rdown, int *nrdown)
{
	struct ptc_error why;
	int rc;

	*nrdown = 0;
	if (!ndown || !ret || ret == cur ||
	    (rc = mlfs_decide_servable(cur, to, down, ndown, backup_of, &why)) == 0)
		return 0;
	if (rc == -ENOMEM)
		return rc;
	for (int n = 0; n < ret->cluster->nnodes; n++) {
		const struct mlfs_snap_node *e = n < nnodes ? &nodes[n] : NULL;
		if (ret->node_nranks[n] > 0 && (!e || !e->up || e->lost || e->retained != rv))
			rdown[(*nrdown)++] = n;
	}
	if ((rc = mlfs_decide_servable(ret, to, rdown, *nrdown, NULL, &why)) == -ENOMEM)
		return rc;
	if (rc)
		*nrdown = 0;
	return rc == 0;
}

void mlfs_lease_schedule(int nnodes, int *ttl_s, int *every_ms)
{
	int64_t spread = (int64_t)nnodes * 1000 / MLFS_KEEPALIVES_PER_S;
	*every_ms = spread > 2000 ? (int)spread : 2000;
	*ttl_s = *every_ms * 3 / 1000 > 6 ? *every_ms * 3 / 1000 : 6;
}

int mlfs_release_wait_ms(int nnodes)
{
	return nnodes > 1000 ? 2 * nnodes : 2000;
}

int mlfs_publish_delay_ms(int nnodes, int node)
{
	int ttl_s, every_ms;
	mlfs_lease_schedule(nnodes, &ttl_s, &every_ms);
	return nnodes > MLFS_KEEPALIVES_PER_S && node >= 0 && node < nnodes
		   ? (int)((int64_t)node * every_ms / nnodes)
		   : 0;
}

bool mlfs_entry_adopted(int64_t acked_to, int64_t base, int64_t released, bool mine,
			int64_t published_rev)
{
	return mine && acked_to > 0 && released == acked_to && base > 0 && published_rev == base;
}

const char *mlfs_act_name(enum mlfs_act a)
{
	static const char *const names[] = {
	    [MLFS_ACT_REGISTER] = "register",
	    [MLFS_ACT_INSTALL_SCHEMA] = "install-schema",
	    [MLFS_ACT_INSTALL_CONFIG] = "install-config",
	    [MLFS_ACT_MARK_LOST] = "mark-lost",
	    [MLFS_ACT_CLEAR_LOST] = "clear-lost",
	    [MLFS_ACT_RESTORE] = "restore",
	    [MLFS_ACT_IMPORT] = "import",
	    [MLFS_ACT_PREPARE] = "prepare",
	    [MLFS_ACT_VOTE_READY] = "vote-ready",
	    [MLFS_ACT_VOTE_FAILED] = "vote-failed",
	    [MLFS_ACT_COMMIT] = "commit",
	    [MLFS_ACT_DISCARD] = "discard",
	    [MLFS_ACT_FINISH_COMMIT] = "finish-commit",
	    [MLFS_ACT_FINISH_ABORT] = "finish-abort",
	    [MLFS_ACT_RELEASE_RETAINED] = "release-retained",
	    [MLFS_ACT_ANNOUNCE_RELEASED] = "announce-released",
	};
	return (size_t)a < sizeof(names) / sizeof(*names) && names[a] ? names[a] : "?";
}
