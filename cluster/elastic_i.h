/*
 * elastic_i.h - the elastic controller's choice (mlfs_elastic.c) as one
 * pure function: the job's schema, cluster, committed config and which
 * nodes are live in; the config to propose (or none, and why) out. No
 * I/O, no threads: mlfs_controller.c gathers the inputs from etcd and
 * proposes what it returns; tests/unit/test_elastic.c runs it on scripted
 * cases.
 */
#ifndef MLFS_ELASTIC_I_H
#define MLFS_ELASTIC_I_H

#include <stdbool.h>

#include <jansson.h>

#include "ptc/ptc.h"

/* What the controller knows of the job at one moment. */
struct mlfs_elastic_in {
	const struct ptc_schema *schema;
	const struct ptc_cluster *cluster; /* the job's, joined nodes included */
	const struct ptc_config *cur;	   /* the committed config */
	/* Per cluster node: its lease alive and its partitions the job's
	 * (not lost): it can serve them. */
	const bool *live;
	/* Per cluster node: marked for draining (mlfs drain): no layout
	 * places it, though it still serves what it holds; NULL: none. */
	const bool *draining;
	/* Per cluster node: live when the committed config was first seen
	 * (the baseline): a node that joined since is new; NULL: none. */
	const bool *baseline;
	/* Per cluster node: the node holding its backup (-1: none); NULL: no
	 * backups. Only the entries of down nodes matter. */
	const int *backup_of;
	const struct ptc_suggest_profile *profile; /* NULL: the defaults */
};

/* Its decision: a config text to propose (@config, a new reference), or
 * NULL; @why says what it decided and why either way. */
struct mlfs_elastic_out {
	json_t *config;
	char why[PTC_ERROR_MAX];
};

/*
 * The layout the job should run in, given @in:
 *  - nothing while the config is not elastic, or every node of it is live
 *    and not draining and no node joined since the baseline (a person's
 *    config stands until the nodes change);
 *  - nothing below min_nodes live nodes (it waits for more);
 *  - else the fastest layout by ptc_suggest on the live nodes (the
 *    config's own first, in its order, then the others in cluster order,
 *    at most max_nodes) whose plan from the committed layout can be
 *    served by the surviving state: the down nodes' partitions from DP
 *    replicas or backups (ptc_plan_compute_backups refuses a layout that
 *    needs lost state: it is not a candidate).
 * Returns 0 with @out filled, or -ENOMEM. Pure.
 */
int mlfs_elastic_decide(const struct mlfs_elastic_in *in, struct mlfs_elastic_out *out);

#endif
