/*
 * test_decide.c - the control plane's decisions (cluster/mlfs_decide.c)
 * over scripted sequences: each step is a snapshot of what one node knows
 * (etcd's keys, its store), and the actions it must take, written as
 * "act(version)" words. The sequences are the cases that broke the
 * atomic promise before the function existed: a node frozen through an
 * aborted attempt, a re-proposed version, a lease lost and regained, a
 * death after the vote, restarts at version 1 and later, etcd gone at
 * each phase.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster.h"
#include "cluster/decide_i.h"
#include "unit.h"

UNIT_PARSER(schema, struct ptc_schema, "schema.json", ptc_schema_parse_text, ptc_schema_free)
UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)
UNIT_PARSER(cluster, struct ptc_cluster, "cluster.json", ptc_cluster_parse_text, ptc_cluster_free)

/* A job of up to 4 nodes, n0..n3, as node @me sees it. */
struct job {
	struct mlfs_snap s;
	struct mlfs_snap_node nodes[4];
	struct mlfs_snap_attempt att;
};

static void job_init(struct job *j, int me, int nnodes)
{
	static const char *ids[] = {"n0", "n1", "n2", "n3"};
	memset(j, 0, sizeof(*j));
	for (int i = 0; i < nnodes; i++)
		j->nodes[i] = (struct mlfs_snap_node){.id = ids[i], .up = true, .version = 1};
	j->s = (struct mlfs_snap){.etcd_ok = true,
				  .revision = 100,
				  .has_schema = true,
				  .committed = 1,
				  .commit_id = "",
				  .saved_step = 7,
				  .nodes = j->nodes,
				  .nnodes = nnodes,
				  .nodes_known = true,
				  .me = me,
				  .now_ms = 1000,
				  .store_schema = true,
				  .have = 1,
				  .hosts_ranks = true,
				  .reconf = MLFS_RECONF_IDLE,
				  .prepare_id = ""};
}

/* Attempt @id from @from to @to by @coordinator, every node taking part. */
static void job_attempt(struct job *j, const char *id, int64_t from, int64_t to,
			const char *coordinator)
{
	j->att = (struct mlfs_snap_attempt){
	    .id = id, .from = from, .to = to, .coordinator = coordinator, .deadline_ms = 60000};
	j->s.attempt = &j->att;
	for (int i = 0; i < j->s.nnodes; i++) {
		j->nodes[i].participant = true;
		j->nodes[i].vote = MLFS_VOTE_NONE;
	}
	j->s.coordinating = strcmp(coordinator, j->nodes[j->s.me].id) == 0;
}

/* The store of @j prepared (or prepares) attempt @id to @to. */
static void job_store(struct job *j, enum mlfs_reconf_state st, const char *id, int64_t to,
		      int64_t rev)
{
	j->s.reconf = st;
	j->s.prepare_id = id;
	j->s.target = to;
	j->s.prepare_rev = rev;
}

/* The decision as "act(version) act(version)"; reasons in @reasons. */
static const char *decide(const struct job *j, char *reasons, size_t cap)
{
	static char out[512];
	struct mlfs_action a[MLFS_DECIDE_MAX];
	int n = mlfs_decide(&j->s, a);
	size_t k = 0, r = 0;

	out[0] = '\0';
	if (reasons)
		reasons[0] = '\0';
	for (int i = 0; i < n; i++) {
		k += (size_t)snprintf(out + k, sizeof(out) - k, "%s%s(%lld)", i ? " " : "",
				      mlfs_act_name(a[i].kind), (long long)a[i].version);
		if (reasons)
			r += (size_t)snprintf(reasons + r, cap - r, "%s|", a[i].reason);
	}
	return out;
}

static void test_happy_path(void **state)
{
	(void)state;
	struct job j;

	/* n1 sees n0's attempt A (1 -> 2): prepares, then votes. */
	job_init(&j, 1, 3);
	job_attempt(&j, "A", 1, 2, "n0");
	assert_string_equal(decide(&j, NULL, 0), "prepare(2)");
	job_store(&j, MLFS_RECONF_PREPARING, "A", 2, 100);
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.reconf = MLFS_RECONF_PREPARED;
	assert_string_equal(decide(&j, NULL, 0), "vote-ready(2)");
	j.nodes[1].vote = MLFS_VOTE_READY;
	assert_string_equal(decide(&j, NULL, 0), "");
	/* The coordinator n0 commits once every participant is ready. */
	struct job c;
	job_init(&c, 0, 3);
	job_attempt(&c, "A", 1, 2, "n0");
	job_store(&c, MLFS_RECONF_PREPARED, "A", 2, 100);
	c.nodes[0].vote = c.nodes[1].vote = MLFS_VOTE_READY;
	assert_string_equal(decide(&c, NULL, 0), "");
	c.nodes[2].vote = MLFS_VOTE_READY;
	assert_string_equal(decide(&c, NULL, 0), "finish-commit(2)");
	/* etcd committed A: every participant commits it. */
	j.s.attempt = NULL;
	j.s.committed = 2;
	j.s.commit_id = "A";
	j.s.revision = 120;
	assert_string_equal(decide(&j, NULL, 0), "commit(2)");
	/* Swapped: the previous layout stays until every node serves 2. */
	job_store(&j, MLFS_RECONF_IDLE, "A", 2, 100);
	j.s.have = 2;
	j.s.retained = 1;
	for (int i = 0; i < 3; i++)
		j.nodes[i].swap_waited = true, j.nodes[i].participant = false;
	j.nodes[1].version = j.nodes[0].version = 2;
	assert_string_equal(decide(&j, NULL, 0), "");
	j.nodes[2].version = 2;
	assert_string_equal(decide(&j, NULL, 0), "announce-released(2) release-retained(1)");
}

/* Rule 8 without the entries: a node that does not follow them releases
 * on the announcement of the version it serves, and only then; one that
 * reads them and sees every swap announces it, unless it is announced. */
static void test_release_announced(void **state)
{
	(void)state;
	struct job j;

	job_init(&j, 1, 3);
	j.s.committed = j.s.have = 2;
	j.s.commit_id = "A";
	j.s.retained = 1;
	j.s.nodes_known = false;
	for (int i = 0; i < 3; i++)
		j.nodes[i].swap_waited = true, j.nodes[i].up = false, j.nodes[i].version = 0;
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.released = 1; /* the previous commit's */
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.released = 2;
	assert_string_equal(decide(&j, NULL, 0), "release-retained(1)");
	/* Not while a reconfiguration runs here, nor for a node that missed
	 * the commit of a later version (rule 4 marks it lost instead). */
	job_store(&j, MLFS_RECONF_PREPARING, "B", 3, 130);
	assert_string_equal(decide(&j, NULL, 0), "");
	job_store(&j, MLFS_RECONF_IDLE, "", 0, 0);
	j.s.committed = 3;
	j.s.commit_id = "B";
	assert_string_equal(decide(&j, NULL, 0), "mark-lost(3)");
	/* Reading the entries: every swap seen, announced already. */
	j.s.committed = 2;
	j.s.commit_id = "A";
	j.s.nodes_known = true;
	for (int i = 0; i < 3; i++)
		j.nodes[i].up = true, j.nodes[i].version = 2;
	assert_string_equal(decide(&j, NULL, 0), "release-retained(1)");
	j.s.released = 1;
	assert_string_equal(decide(&j, NULL, 0), "announce-released(2) release-retained(1)");
	/* A coordinator that does not have the entries decides nothing about
	 * its attempt (who is down?) until it reads them. */
	struct job c;
	job_init(&c, 0, 3);
	job_attempt(&c, "C", 1, 2, "n0");
	job_store(&c, MLFS_RECONF_PREPARED, "C", 2, 100);
	for (int i = 0; i < 3; i++)
		c.nodes[i].vote = MLFS_VOTE_READY;
	c.s.nodes_known = false;
	assert_string_equal(decide(&c, NULL, 0), "");
	c.s.nodes_known = true;
	assert_string_equal(decide(&c, NULL, 0), "finish-commit(2)");
}

/* Issue 17, item 1: n3 votes ready for version 2 = X and is frozen; the
 * attempt dies with its coordinator; version 2 = Y without n3 commits;
 * n3 thaws. It must not commit X. */
static void test_frozen_through_an_aborted_attempt(void **state)
{
	(void)state;
	struct job j;
	char why[1024];

	job_init(&j, 3, 4);
	job_attempt(&j, "X", 1, 2, "n0");
	job_store(&j, MLFS_RECONF_PREPARED, "X", 2, 100);
	j.nodes[3].vote = MLFS_VOTE_READY;
	assert_string_equal(decide(&j, NULL, 0), "");
	/* Thawed: its lease expired, Y committed version 2, no attempt. */
	j.s.lease_expired = true;
	j.s.attempt = NULL;
	j.s.committed = 2;
	j.s.commit_id = "Y";
	j.s.revision = 300;
	for (int i = 0; i < 4; i++)
		j.nodes[i].participant = false, j.nodes[i].vote = MLFS_VOTE_NONE;
	assert_string_equal(decide(&j, why, sizeof(why)), "register(1) discard(2) mark-lost(2)");
	assert_non_null(strstr(why, "committed by another attempt (Y), not this one (X)"));
	assert_non_null(strstr(why, "missed the commit of version 2 (it holds version 1)"));
	/* The same with the same config text but another attempt id: still
	 * discarded (the committed bytes may be of another saved step). */
	j.s.lease_expired = false;
	assert_string_equal(decide(&j, NULL, 0), "discard(2) mark-lost(2)");
	/* Once lost, it is not marked again; still never commits. */
	j.s.lost = true;
	job_store(&j, MLFS_RECONF_FAILED, "X", 2, 100);
	assert_string_equal(decide(&j, NULL, 0), "");
}

/* A version aborted and proposed again: the old attempt's state in the
 * store never speaks for the new one. */
static void test_reproposed_version(void **state)
{
	(void)state;
	struct job j;

	job_init(&j, 1, 2);
	job_attempt(&j, "B", 1, 2, "n0");
	job_store(&j, MLFS_RECONF_FAILED, "A", 2, 100); /* A to 2 failed here */
	j.s.revision = 200;
	assert_string_equal(decide(&j, NULL, 0), "prepare(2)");
	/* Its prepare of B not started yet, the store still preparing A (its
	 * discard pending): neither a vote nor a second prepare. */
	job_store(&j, MLFS_RECONF_PREPARING, "A", 2, 100);
	assert_string_equal(decide(&j, NULL, 0), "discard(2)");
	/* The coordinator's own prepare ran before its control thread read
	 * the attempt it created: an older snapshot decides nothing. */
	struct job c;
	job_init(&c, 0, 2);
	job_store(&c, MLFS_RECONF_PREPARING, "B", 2, 250);
	c.s.revision = 240;
	assert_string_equal(decide(&c, NULL, 0), "");
	c.s.revision = 250;
	assert_string_equal(decide(&c, NULL, 0), "discard(2)"); /* gone at its own revision */
}

static void test_coordinator_aborts(void **state)
{
	(void)state;
	struct job c;
	char why[1024];

	job_init(&c, 0, 3);
	job_attempt(&c, "A", 1, 2, "n0");
	job_store(&c, MLFS_RECONF_PREPARED, "A", 2, 100);
	c.nodes[0].vote = MLFS_VOTE_READY;
	c.nodes[1].vote = MLFS_VOTE_FAILED;
	c.nodes[1].reason = "out of memory";
	assert_string_equal(decide(&c, why, sizeof(why)), "finish-abort(2)");
	assert_non_null(strstr(why, "node n1: failed: out of memory"));
	/* Issue 17, item 3: n2 voted ready and died before the commit. */
	c.nodes[1].vote = c.nodes[2].vote = MLFS_VOTE_READY;
	c.nodes[2].up = false;
	assert_string_equal(decide(&c, why, sizeof(why)), "finish-abort(2)");
	assert_non_null(strstr(why, "node n2 is down"));
	c.nodes[2].up = true;
	c.s.now_ms = 70000;
	c.nodes[2].vote = MLFS_VOTE_NONE;
	assert_string_equal(decide(&c, why, sizeof(why)), "finish-abort(2)");
	assert_non_null(strstr(why, "deadline"));
	/* Not its attempt (another node's): it only takes part. */
	c.s.coordinating = false;
	assert_string_equal(decide(&c, NULL, 0), "");
}

/* Issue 17, item 3: a participant dies between its ready vote and its
 * swap, after etcd committed: survivors keep the previous layout. */
static void test_death_after_the_vote(void **state)
{
	(void)state;
	struct job j;

	job_init(&j, 0, 3);
	j.s.committed = j.s.have = 2;
	j.s.commit_id = "A";
	j.s.retained = 1;
	for (int i = 0; i < 3; i++)
		j.nodes[i].swap_waited = true;
	j.nodes[0].version = j.nodes[1].version = 2;
	j.nodes[2].up = false; /* died at version 1 */
	assert_string_equal(decide(&j, NULL, 0), "");
	/* Restarted without its memory: up at version 2, but lost. */
	j.nodes[2].up = true;
	j.nodes[2].version = 2;
	j.nodes[2].lost = true;
	assert_string_equal(decide(&j, NULL, 0), "");
	/* A next commit (without n2) replaces what is waited for. */
	j.nodes[2].swap_waited = false;
	assert_string_equal(decide(&j, NULL, 0), "announce-released(2) release-retained(1)");
}

/* Issue 17, item 4: daemons restarted without their memory. */
static void test_restarts(void **state)
{
	(void)state;
	struct job j;
	char why[1024];

	/* At the first config, this node had saved step 8: zeros are not state. */
	job_init(&j, 0, 2);
	j.s.have = 0;
	j.s.saved_step = 8;
	j.s.store_schema = false;
	assert_string_equal(decide(&j, why, sizeof(why)),
			    "install-schema(0) install-config(1) mark-lost(1)");
	assert_non_null(strstr(why, "it saved step 8"));
	/* Nothing saved here yet at version 1 (a node slow to install the first
	 * config while others import): zeros are its state. */
	j.s.saved_step = -1;
	assert_string_equal(decide(&j, NULL, 0), "install-schema(0) install-config(1)");
	/* Later versions hold state whatever the steps say. */
	j.s.committed = 3;
	assert_string_equal(decide(&j, NULL, 0),
			    "install-schema(0) install-config(3) mark-lost(3)");
	/* A lost node stays lost while it hosts ranks; a config that drops
	 * it clears it. */
	j.s.have = 3;
	j.s.store_schema = true;
	j.s.lost = true;
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.hosts_ranks = false;
	assert_string_equal(decide(&j, NULL, 0), "clear-lost(3)");
}

/* Rule 10: `mlfs resume` restores lost nodes from a snapshot, once per
 * restore key, only at the version the key names, only when idle. */
static void test_resume_restores_lost_nodes(void **state)
{
	(void)state;
	struct job j;

	job_init(&j, 1, 2);
	j.s.committed = j.s.have = 3;
	j.s.lost = true;
	j.s.restore_tried = "";
	assert_string_equal(decide(&j, NULL, 0), ""); /* no key: stays lost */
	j.s.restore_id = "r1";
	j.s.restore_version = 2; /* of another version: not this layout */
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.restore_version = 3;
	assert_string_equal(decide(&j, NULL, 0), "restore(3)");
	j.s.reconf = MLFS_RECONF_PREPARING; /* never beside an attempt */
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.reconf = MLFS_RECONF_IDLE;
	j.s.restore_tried = "r1"; /* tried (it failed, or it restored): once */
	assert_string_equal(decide(&j, NULL, 0), "");
	j.s.restore_id = "r2"; /* the command run again */
	assert_string_equal(decide(&j, NULL, 0), "restore(3)");
	j.s.lost = false; /* a node with its state ignores it */
	assert_string_equal(decide(&j, NULL, 0), "");
	/* A node that starts lost later restores once it installed the config. */
	job_init(&j, 0, 2);
	j.s.committed = 3;
	j.s.have = 0;
	j.s.restore_id = "r2";
	j.s.restore_version = 3;
	j.s.restore_tried = "";
	assert_string_equal(decide(&j, NULL, 0), "install-config(3) mark-lost(3)");
	j.s.have = 3;
	j.s.lost = true;
	assert_string_equal(decide(&j, NULL, 0), "restore(3)");
}

/* mlfs_resume_refusal: only while no node of the config is up with state. */
static void test_resume_refusal(void **state)
{
	(void)state;
	struct ptc_config *c = config_ok("{'version': 3, 'tp': 1, 'pp': 1, 'dp': 2, "
					 "'nodes': ['n0', 'n1']}");
	struct ptc_error err = {.text = ""};
	json_t *nodes = json_pack("{s{ss}s{ss}}", "n0", "state", "lost", "n1", "state", "lost");
	assert_int_equal(mlfs_resume_refusal(c, nodes, &err), 0);
	json_object_del(nodes, "n1"); /* down: it restores when it starts */
	assert_int_equal(mlfs_resume_refusal(c, nodes, &err), 0);
	json_object_set_new(nodes, "n1", json_pack("{ss}", "state", "idle"));
	assert_int_equal(mlfs_resume_refusal(c, nodes, &err), -EBUSY);
	assert_non_null(strstr(err.text, "node n1 is up and not lost"));
	json_object_clear(nodes);
	assert_int_equal(mlfs_resume_refusal(c, nodes, &err), -EAGAIN);
	assert_non_null(strstr(err.text, "no node of the job is up"));
	/* A node outside the config does not count. */
	json_object_set_new(nodes, "n0", json_pack("{ss}", "state", "lost"));
	json_object_set_new(nodes, "n7", json_pack("{ss}", "state", "idle"));
	assert_int_equal(mlfs_resume_refusal(c, nodes, &err), 0);
	json_decref(nodes);
	ptc_config_free(c);
}

/* Issue 17, item 5: etcd unreachable at every phase: nothing is decided,
 * a prepared attempt waits for etcd's decision. */
static void test_etcd_gone(void **state)
{
	(void)state;
	struct job j;
	enum mlfs_reconf_state states[] = {MLFS_RECONF_IDLE, MLFS_RECONF_PREPARING,
					   MLFS_RECONF_PREPARED, MLFS_RECONF_FAILED};

	for (size_t i = 0; i < sizeof(states) / sizeof(*states); i++) {
		job_init(&j, 1, 2);
		job_attempt(&j, "A", 1, 2, "n0");
		job_store(&j, states[i], "A", 2, 100);
		j.s.etcd_ok = false;
		assert_string_equal(decide(&j, NULL, 0), "");
		/* etcd back, the attempt gone with its coordinator's lease */
		j.s.etcd_ok = true;
		j.s.attempt = NULL;
		j.s.revision = 400;
		const char *want =
		    states[i] == MLFS_RECONF_PREPARING || states[i] == MLFS_RECONF_PREPARED
			? "discard(2)"
			: "";
		assert_string_equal(decide(&j, NULL, 0), want);
		/* etcd back, and it committed A meanwhile */
		j.s.committed = 2;
		j.s.commit_id = "A";
		want = states[i] == MLFS_RECONF_PREPARED    ? "commit(2)"
		       : states[i] == MLFS_RECONF_PREPARING ? ""
							    : "mark-lost(2)";
		assert_string_equal(decide(&j, NULL, 0), want);
	}
}

/* A lease lost while prepared: etcd committed this very attempt meanwhile. */
static void test_lease_lost_and_regained(void **state)
{
	(void)state;
	struct job j;

	job_init(&j, 1, 2);
	job_store(&j, MLFS_RECONF_PREPARED, "A", 2, 100);
	j.s.lease_expired = true;
	j.s.committed = 2;
	j.s.commit_id = "A";
	assert_string_equal(decide(&j, NULL, 0), "register(1) commit(2)");
	/* ... and a participant whose lease expired does not vote on a new
	 * attempt before it registered again. */
	job_init(&j, 1, 2);
	job_attempt(&j, "B", 1, 2, "n0");
	j.s.lease_expired = true;
	assert_string_equal(decide(&j, NULL, 0), "register(1)");
}

static void test_wrong_version_votes_failed(void **state)
{
	(void)state;
	struct job j;
	char why[512];

	job_init(&j, 1, 2);
	job_attempt(&j, "A", 2, 3, "n0");
	assert_string_equal(decide(&j, why, sizeof(why)), "vote-failed(3)");
	assert_non_null(strstr(why, "node n1 is at version 1, not the attempt's 2"));
	/* A prepare that failed in the store votes failed (the store says why). */
	job_attempt(&j, "A", 1, 2, "n0");
	job_store(&j, MLFS_RECONF_FAILED, "A", 2, 100);
	assert_string_equal(decide(&j, NULL, 0), "vote-failed(2)");
	j.nodes[1].vote = MLFS_VOTE_FAILED;
	assert_string_equal(decide(&j, NULL, 0), "");
}

/* ------------------------------------------------- rule 9: the source */

static const char src_schema[] =
    "{'model': 'm', 'num_layers': 2, 'states': {'model': {}},"
    " 'tensors': [{'name': 'emb', 'dtype': 'float32', 'shape': [8, 4], 'split': {'dim': 0},"
    "              'place': 'first'},"
    "             {'name': 'layers/{L}/w', 'dtype': 'float32', 'shape': [4, 4]}]}";
static const char src_cluster[] =
    "{'job': 'j', 'etcd': 'http://127.0.0.1:1', 'nodes': [{'id': 'n0', 'addr': 'h:1', "
    "'devices': 1}, {'id': 'n1', 'addr': 'h:2', 'devices': 1}, {'id': 'n2', 'addr': 'h:3', "
    "'devices': 1}, {'id': 'n3', 'addr': 'h:4', 'devices': 1}]}";

/* The layout of config @text on the four nodes, its config and schema kept
 * in @keep (freed by src_free). */
struct src_layouts {
	struct ptc_schema *s;
	struct ptc_cluster *cl;
	struct ptc_config *c[5];
	struct ptc_layout l[5];
	int n;
};

static struct ptc_layout *src_layout(struct src_layouts *k, const char *text)
{
	struct ptc_error err = {.text = ""};
	int i = k->n++;
	k->c[i] = config_ok(text);
	int rc = ptc_layout_init(&k->l[i], k->s, k->c[i], k->cl, "config.json", &err);
	if (rc)
		print_error("layout: %s\n", err.text);
	assert_int_equal(rc, 0);
	return &k->l[i];
}

static void src_free(struct src_layouts *k)
{
	for (int i = 0; i < k->n; i++) {
		ptc_layout_release(&k->l[i]);
		ptc_config_free(k->c[i]);
	}
	ptc_cluster_free(k->cl);
	ptc_schema_free(k->s);
}

static void test_source_after_a_death_before_the_swap(void **state)
{
	(void)state;
	struct src_layouts k = {.s = schema_ok(src_schema), .cl = cluster_ok(src_cluster)};
	/* v1: a replica on n0 and on n1 (retained); v2: everything on n3 alone,
	 * which died before its swap; v3: back on n0 and n1. */
	struct ptc_layout *v1 =
	    src_layout(&k, "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}");
	struct ptc_layout *v2 =
	    src_layout(&k, "{'version': 2, 'tp': 1, 'pp': 1, 'dp': 1, 'nodes': ['n3']}");
	struct ptc_layout *v3 =
	    src_layout(&k, "{'version': 3, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}");
	struct ptc_layout *v3c =
	    src_layout(&k, "{'version': 3, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n2']}");
	struct ptc_layout *v2b =
	    src_layout(&k, "{'version': 2, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n2', 'n3']}");
	struct mlfs_snap_node nodes[4] = {{.id = "n0", .up = true, .retained = 1},
					  {.id = "n1", .up = true, .retained = 1},
					  {.id = "n2", .up = true, .retained = 1},
					  {.id = "n3", .up = false}};
	int down[] = {3}, rdown[4], nr = -1;

	/* Every survivor retains version 1: planned from it, nobody down. */
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, v1, 1, v3, nodes, 4, rdown, &nr), 1);
	assert_int_equal(nr, 0);
	/* n1 restarted (it retains nothing): down for version 1, and n0's
	 * replica is enough for a layout on n0 and n2 (a down node hosts
	 * nothing new, so not for one on n1). */
	nodes[1].retained = 0;
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, v1, 1, v3c, nodes, 4, rdown, &nr),
			 1);
	assert_int_equal(nr, 1);
	assert_int_equal(rdown[0], 1);
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, v1, 1, v3, nodes, 4, rdown, &nr), 0);
	assert_int_equal(nr, 0);
	/* n0 lost too: no copy anywhere; the current layout, and its plan says why. */
	nodes[0].lost = true;
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, v1, 1, v3, nodes, 4, rdown, &nr), 0);
	assert_int_equal(nr, 0);
	nodes[0].lost = false;
	nodes[1].retained = 1;
	/* A retained layout of another version is no copy. */
	nodes[0].retained = nodes[1].retained = 4;
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, v1, 1, v3, nodes, 4, rdown, &nr), 0);
	nodes[0].retained = nodes[1].retained = 1;
	/* Nobody down, or no retained layout: the current one. */
	assert_int_equal(mlfs_decide_source(v2, down, 0, NULL, v1, 1, v3, nodes, 4, rdown, &nr), 0);
	assert_int_equal(mlfs_decide_source(v2, down, 1, NULL, NULL, 0, v3, nodes, 4, rdown, &nr),
			 0);
	/* The current layout has a replica of n3's on n2: planned from it. */
	assert_int_equal(mlfs_decide_source(v2b, down, 1, NULL, v1, 1, v3, nodes, 4, rdown, &nr),
			 0);
	src_free(&k);
}

/* mlfs_decide_servable_by_node answers what the whole job's plan answers. */
static void test_servable_by_node_agrees(void **state)
{
	(void)state;
	struct src_layouts k = {.s = schema_ok(src_schema), .cl = cluster_ok(src_cluster)};
	struct ptc_layout *v1 =
	    src_layout(&k, "{'version': 1, 'tp': 1, 'pp': 1, 'dp': 2, 'nodes': ['n0', 'n1']}");
	struct ptc_layout *v2 =
	    src_layout(&k, "{'version': 2, 'tp': 1, 'pp': 2, 'dp': 1, 'nodes': ['n2', 'n3']}");
	struct ptc_layout *v3 =
	    src_layout(&k, "{'version': 3, 'tp': 2, 'pp': 1, 'dp': 1, 'nodes': ['n1', 'n2']}");
	const struct ptc_layout *from[] = {v1, v1, v1, v1, v2, v2, v3};
	const struct ptc_layout *to[] = {v2, v2, v2, v3, v1, v3, v2};
	int down[][2] = {{-1, -1}, {0, -1}, {0, 1}, {1, -1}, {3, -1}, {2, -1}, {0, -1}};
	int ndown[] = {0, 1, 2, 1, 1, 1, 1};
	int servable[] = {0, 0, 1, 1, 1, 1, 0}; /* v3 uses n1 (down); n3 held stage 1 alone */
	for (size_t i = 0; i < sizeof(ndown) / sizeof(ndown[0]); i++) {
		struct ptc_error w1 = {.text = ""}, w2 = {.text = ""};
		int a = mlfs_decide_servable(from[i], to[i], down[i], ndown[i], NULL, &w1);
		int b = mlfs_decide_servable_by_node(from[i], to[i], down[i], ndown[i], NULL, &w2);
		if (a != servable[i] || b != servable[i])
			print_error("case %zu: whole job %d (%s), by node %d (%s)\n", i, a, w1.text,
				    b, w2.text);
		assert_int_equal(a, servable[i]);
		assert_int_equal(b, servable[i]);
		assert_int_equal(!w2.text[0], !servable[i]); /* a refusal says why */
	}
	src_free(&k);
}

/* A job past the whole job's plan (2,048 ranks x 65,537 tensors): the
 * controller's question still has an answer, from one node at a time. */
static void test_servable_past_the_whole_job_plan(void **state)
{
	(void)state;
	enum { NODES = 256, LAYERS = 8192 };
	size_t cap = 1 << 16;
	char *text = malloc(cap), *ids[NODES];
	int n = snprintf(text, cap,
			 "{'model': 'm', 'num_layers': %d, 'states': {'model': {}}, 'tensors': "
			 "[{'name': 'emb', 'dtype': 'float32', 'shape': [8, 4], 'place': 'first'}",
			 LAYERS);
	for (int t = 0; t < 8; t++)
		n += snprintf(text + n, cap - (size_t)n,
			      ", {'name': 'layers/{L}/w%d', 'dtype': 'float32', 'shape': [4, 4]}",
			      t);
	snprintf(text + n, cap - (size_t)n, "]}");
	struct ptc_schema *s = schema_ok(text);
	for (int i = 0; i < NODES; i++) {
		ids[i] = malloc(16);
		snprintf(ids[i], 16, "n%d", i);
	}
	struct ptc_cluster *cl = ptc_cluster_new_uniform(NODES, ids, 8);
	assert_non_null(cl);
	/* from: pp 128 x dp 16 on every node (a stage's replicas on two nodes:
	 * Megatron's order puts DP next to TP); to: pp 128 x dp 8 on 128 nodes
	 * without n5 */
	n = snprintf(text, cap, "{'version': 1, 'tp': 1, 'pp': 128, 'dp': 16, 'nodes': [");
	for (int i = 0; i < NODES; i++)
		n += snprintf(text + n, cap - (size_t)n, "%s'n%d'", i ? ", " : "", i);
	snprintf(text + n, cap - (size_t)n, "]}");
	struct ptc_config *ca = config_ok(text);
	n = snprintf(text, cap, "{'version': 2, 'tp': 1, 'pp': 128, 'dp': 8, 'nodes': [");
	for (int i = 6; i < 6 + 128; i++)
		n += snprintf(text + n, cap - (size_t)n, "%s'n%d'", i > 6 ? ", " : "", i);
	snprintf(text + n, cap - (size_t)n, "]}");
	struct ptc_config *cb = config_ok(text);
	struct ptc_layout a, b;
	struct ptc_error why = {.text = ""};
	assert_int_equal(ptc_layout_init(&a, s, ca, cl, "a", &why), 0);
	assert_int_equal(ptc_layout_init(&b, s, cb, cl, "b", &why), 0);
	struct ptc_plan *p = NULL;
	assert_int_equal(ptc_plan_compute_backups(&a, &b, NULL, 0, NULL, &p, &why), -E2BIG);
	ptc_plan_free(p);

	/* n5 down: its stages have their other DP replica elsewhere */
	int down[8] = {5};
	why.text[0] = '\0';
	int rc = mlfs_decide_servable(&a, &b, down, 1, NULL, &why);
	if (rc)
		print_error("%s\n", why.text);
	assert_int_equal(rc, 0);
	/* the nodes of both replicas of rank 0's stage down: nothing holds it */
	int nd = 0;
	for (int r = 0; r < a.world; r++)
		if (a.ranks[r].p == 0) {
			bool seen = false;
			for (int i = 0; i < nd; i++)
				seen |= down[i] == a.ranks[r].node;
			if (!seen)
				down[nd++] = a.ranks[r].node;
		}
	assert_int_equal(nd, 2);
	why.text[0] = '\0';
	assert_int_equal(mlfs_decide_servable(&a, &b, down, nd, NULL, &why), 1);
	assert_non_null(strstr(why.text, "emb"));

	ptc_layout_release(&a);
	ptc_layout_release(&b);
	ptc_config_free(ca);
	ptc_config_free(cb);
	ptc_cluster_free(cl);
	ptc_schema_free(s);
	for (int i = 0; i < NODES; i++)
		free(ids[i]);
	free(text);
}

/* A job of @n nodes named "n<i>" in a shuffled order (ids like n1, n10,
 * n100 are prefixes of each other), so that the index has to sort. */
static void shuffled_nodes(struct mlfs_snap_node *nodes, char (*ids)[16], int n)
{
	for (int i = 0; i < n; i++)
		snprintf(ids[i], sizeof(ids[i]), "n%d", (i * 7919) % n);
	for (int i = 0; i < n; i++)
		nodes[i] = (struct mlfs_snap_node){.id = ids[i]};
}

static int linear_find(const struct mlfs_snap_node *nodes, int n, const char *id, size_t len)
{
	for (int i = 0; i < n; i++)
		if (strlen(nodes[i].id) == len && strncmp(nodes[i].id, id, len) == 0)
			return i;
	return -1;
}

/* mlfs_snap_index + mlfs_snap_find give what a linear search gives, for
 * every id of the job and for ids that are not: prefixes, extensions, a
 * key's tail ("<to>/<id>" bounded by its length), an empty id. */
static void test_snap_index_finds_what_a_search_finds(void **state)
{
	(void)state;
	enum { N = 1009 };
	static struct mlfs_snap_node nodes[N];
	static char ids[N][16];
	static struct mlfs_snap_key keys[N];
	char probe[32];

	shuffled_nodes(nodes, ids, N);
	mlfs_snap_index(nodes, N, keys);
	for (int i = 1; i < N; i++)
		assert_true(strcmp(keys[i - 1].id, keys[i].id) < 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(mlfs_snap_find(keys, N, ids[i], strlen(ids[i])), i);
		/* the id as the tail of a vote key, bounded by its length */
		int len = snprintf(probe, sizeof(probe), "%sx", ids[i]);
		assert_int_equal(mlfs_snap_find(keys, N, probe, (size_t)len - 1), i);
		assert_int_equal(mlfs_snap_find(keys, N, probe, (size_t)len),
				 linear_find(nodes, N, probe, (size_t)len));
	}
	const char *absent[] = {"n", "n1009", "n10090", "m5", "o", "", "n-1", "n01"};
	for (size_t i = 0; i < sizeof(absent) / sizeof(*absent); i++) {
		assert_int_equal(linear_find(nodes, N, absent[i], strlen(absent[i])), -1);
		assert_int_equal(mlfs_snap_find(keys, N, absent[i], strlen(absent[i])), -1);
	}
	assert_int_equal(mlfs_snap_find(keys, N, "n1\0", 3), -1); /* no id holds a NUL */
	assert_int_equal(mlfs_snap_find(keys, 0, "n1", 2), -1);
	mlfs_snap_index(nodes, 1, keys);
	assert_int_equal(mlfs_snap_find(keys, 1, ids[0], strlen(ids[0])), 0);
}

/* The attempt's participants packed as index ranges: every subset
 * pattern round-trips to the same ids in the same order; ids that are not
 * the cluster's, or out of its order, are not packed; malformed or
 * out-of-range text is refused, naming it. */
static void test_participants_packed_as_ranges(void **state)
{
	(void)state;
	enum { N = 12 };
	struct ptc_node pn[N];
	char ids[N][8];
	struct ptc_cluster cl = {.nnodes = N, .nodes = pn};
	struct ptc_error err;

	for (int i = 0; i < N; i++) {
		snprintf(ids[i], sizeof(ids[i]), "n%d", (i * 5) % N);
		pn[i] = (struct ptc_node){.id = ids[i]};
	}
	for (unsigned mask = 0; mask < (1u << N); mask += 37) {
		json_t *a = json_array();
		for (int i = 0; i < N; i++)
			if (mask & (1u << i))
				json_array_append_new(a, json_string(ids[i]));
		char *p = mlfs_ids_pack(a, &cl);
		assert_non_null(p);
		json_t *b = mlfs_ids_unpack(p, &cl, &err);
		assert_non_null(b);
		assert_true(json_equal(a, b));
		json_decref(a);
		json_decref(b);
		free(p);
	}
	json_t *all = json_array(), *some = json_array();
	for (int i = 0; i < N; i++)
		json_array_append_new(all, json_string(ids[i]));
	char *p = mlfs_ids_pack(all, &cl);
	assert_string_equal(p, "0-11");
	free(p);
	json_array_append_new(some, json_string(ids[0]));
	json_array_append_new(some, json_string(ids[2]));
	json_array_append_new(some, json_string(ids[3]));
	json_array_append_new(some, json_string(ids[4]));
	json_array_append_new(some, json_string(ids[7]));
	assert_string_equal(p = mlfs_ids_pack(some, &cl), "0,2-4,7");
	free(p);
	json_array_append_new(some, json_string(ids[1])); /* out of the cluster's order */
	assert_null(mlfs_ids_pack(some, &cl));
	json_array_clear(some);
	json_array_append_new(some, json_string("n99")); /* not the cluster's */
	assert_null(mlfs_ids_pack(some, &cl));
	json_decref(some);
	json_decref(all);

	json_t *e = mlfs_ids_unpack("", &cl, &err);
	assert_int_equal(json_array_size(e), 0);
	json_decref(e);
	const char *bad[] = {"0-12", "3,2", "2,2", "4-3", "0,",	   ",0",
			     "0--1", "-1",  "a",   "0 1", "1-2-3", "0000000001"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		err.text[0] = '\0';
		assert_null(mlfs_ids_unpack(bad[i], &cl, &err));
		assert_non_null(strstr(err.text, bad[i]));
	}
}

/* The lease schedule: the daemon's 6 s / 2 s up to 2,000 nodes;
 * beyond, etcd sees 1,000 keep-alives a second; a lease always outlives
 * two missed keep-alives. */
static void test_lease_schedule_keeps_etcd_at_1000_keepalives(void **state)
{
	(void)state;
	int ttl, every;
	const int ns[] = {1, 4, 64, 1000, 1001, 2000, 5000, 10000, 100000};
	for (size_t i = 0; i < sizeof(ns) / sizeof(*ns); i++) {
		mlfs_lease_schedule(ns[i], &ttl, &every);
		assert_true(ttl >= 5);
		assert_true(ttl * 1000 >= 3 * every); /* two keep-alives may be lost */
		assert_true((double)ns[i] * 1000 / every <= MLFS_KEEPALIVES_PER_S + 1e-9);
	}
	mlfs_lease_schedule(4, &ttl, &every);
	assert_int_equal(ttl, 6);
	assert_int_equal(every, 2000);
	mlfs_lease_schedule(1000, &ttl, &every);
	assert_int_equal(ttl, 6);
	assert_int_equal(every, 2000);
	mlfs_lease_schedule(3000, &ttl, &every);
	assert_int_equal(ttl, 9);
	assert_int_equal(every, 3000);
	mlfs_lease_schedule(10000, &ttl, &every);
	assert_int_equal(ttl, 30);
	assert_int_equal(every, 10000);
	/* the release fallback: 2 s, then 2 ms per node */
	assert_int_equal(mlfs_release_wait_ms(4), 2000);
	assert_int_equal(mlfs_release_wait_ms(1000), 2000);
	assert_int_equal(mlfs_release_wait_ms(10000), 20000);
}

/* The entry puts after a commit: at once up to 1,000 nodes; beyond, each
 * node at its own ms within one keep-alive interval, 1,000 a second. */
static void test_entry_puts_after_a_commit_are_spread(void **state)
{
	(void)state;
	int ttl, every;
	for (int n = 0; n < 1000; n += 7)
		assert_int_equal(mlfs_publish_delay_ms(1000, n), 0);
	assert_int_equal(mlfs_publish_delay_ms(4, 3), 0);
	mlfs_lease_schedule(10000, &ttl, &every);
	static int per_s[11];
	for (int n = 0; n < 10000; n++) {
		int d = mlfs_publish_delay_ms(10000, n);
		assert_true(d >= 0 && d < every);
		per_s[d / 1000]++;
	}
	for (int i = 0; i < 10; i++)
		assert_int_equal(per_s[i], 1000);		  /* 1,000 puts in each second */
	assert_int_equal(mlfs_publish_delay_ms(10000, 10000), 0); /* not a node */
	assert_int_equal(mlfs_publish_delay_ms(10000, -1), 0);
}

/* The entry a swap ack carried is the node's in etcd once the announcement
 * names the node, for that version, and the node put nothing since. */
/* The "released" key's two forms, as a node's watch hands them over (the
 * value not NUL-terminated): the version in both (a node that read 0 from
 * the JSON form saw no announcement, and fell back to reading every entry
 * 2 s after its swap), and whether the entries name the node. */
static void test_released_key_parsed(void **state)
{
	(void)state;
	bool mine = true;
	const char *json = "{\"version\":12,\"entries\":[\"n1\",\"n3\"]}xx";
	size_t jlen = strlen(json) - 2;

	assert_int_equal(mlfs_released_parse("7", 1, "n3", &mine), 7);
	assert_false(mine);
	assert_int_equal(mlfs_released_parse("1234", 2, NULL, NULL), 12); /* only @len bytes */
	assert_int_equal(mlfs_released_parse(json, jlen, "n3", &mine), 12);
	assert_true(mine);
	assert_int_equal(mlfs_released_parse(json, jlen, "n2", &mine), 12);
	assert_false(mine);
	assert_int_equal(mlfs_released_parse(json, jlen, NULL, NULL), 12);
	assert_int_equal(mlfs_released_parse("{\"version\":", 11, "n1", &mine), 0);
	assert_false(mine);
	assert_int_equal(mlfs_released_parse("", 0, "n1", &mine), 0);
	char big[64];
	memset(big, '9', sizeof(big));
	assert_true(mlfs_released_parse(big, sizeof(big), NULL, NULL) > 0); /* cut, not overrun */
}

static void test_entry_adopted_from_the_announcement(void **state)
{
	(void)state;
	/* acked to 5 at revision 40; released 5 names it; no put since */
	assert_true(mlfs_entry_adopted(5, 40, 5, true, 40));
	assert_false(mlfs_entry_adopted(5, 40, 5, false, 40)); /* not named: its own put */
	assert_false(mlfs_entry_adopted(5, 40, 6, true, 40));  /* another version's */
	assert_false(mlfs_entry_adopted(5, 40, 4, true, 40));
	assert_false(mlfs_entry_adopted(5, 40, 5, true, 41)); /* it put its key since */
	assert_false(mlfs_entry_adopted(5, 40, 5, true, 0));  /* a put whose fate is unknown */
	assert_false(mlfs_entry_adopted(0, 40, 0, true, 40)); /* no ack */
	assert_false(mlfs_entry_adopted(5, 0, 5, true, 0));   /* no revision known */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_happy_path),
	    cmocka_unit_test(test_release_announced),
	    cmocka_unit_test(test_frozen_through_an_aborted_attempt),
	    cmocka_unit_test(test_reproposed_version),
	    cmocka_unit_test(test_coordinator_aborts),
	    cmocka_unit_test(test_death_after_the_vote),
	    cmocka_unit_test(test_restarts),
	    cmocka_unit_test(test_resume_restores_lost_nodes),
	    cmocka_unit_test(test_resume_refusal),
	    cmocka_unit_test(test_etcd_gone),
	    cmocka_unit_test(test_lease_lost_and_regained),
	    cmocka_unit_test(test_wrong_version_votes_failed),
	    cmocka_unit_test(test_source_after_a_death_before_the_swap),
	    cmocka_unit_test(test_servable_by_node_agrees),
	    cmocka_unit_test(test_servable_past_the_whole_job_plan),
	    cmocka_unit_test(test_snap_index_finds_what_a_search_finds),
	    cmocka_unit_test(test_participants_packed_as_ranges),
	    cmocka_unit_test(test_lease_schedule_keeps_etcd_at_1000_keepalives),
	    cmocka_unit_test(test_entry_puts_after_a_commit_are_spread),
	    cmocka_unit_test(test_entry_adopted_from_the_announcement),
	    cmocka_unit_test(test_released_key_parsed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
