/*
 * test_jobimport.c - `mlfs import --every-node` (cluster/mlfs_jobimport.c):
 * mlfs_decide's rule 11 (which node imports, once per key), the command's
 * refusal before it puts the key, and its reading of the nodes' outcomes
 * (done, each node's word, the first failure named).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster.h"
#include "cluster/decide_i.h"
#include "unit.h"

UNIT_PARSER(config, struct ptc_config, "config.json", ptc_config_parse_text, ptc_config_free)

/* Node n1 of a job of two nodes, both at version 3, idle. */
struct job {
	struct mlfs_snap s;
	struct mlfs_snap_node nodes[2];
};

static void job_init(struct job *j)
{
	memset(j, 0, sizeof(*j));
	j->nodes[0] = (struct mlfs_snap_node){.id = "n0", .up = true, .version = 3};
	j->nodes[1] = (struct mlfs_snap_node){.id = "n1", .up = true, .version = 3};
	j->s = (struct mlfs_snap){.etcd_ok = true,
				  .revision = 100,
				  .has_schema = true,
				  .committed = 3,
				  .commit_id = "a3",
				  .saved_step = 7,
				  .nodes = j->nodes,
				  .nnodes = 2,
				  .nodes_known = true,
				  .me = 1,
				  .now_ms = 1000,
				  .store_schema = true,
				  .have = 3,
				  .hosts_ranks = true,
				  .reconf = MLFS_RECONF_IDLE,
				  .prepare_id = "",
				  .restore_tried = "",
				  .import_tried = ""};
}

static const char *decide(const struct job *j)
{
	static char out[512];
	struct mlfs_action a[MLFS_DECIDE_MAX];
	int n = mlfs_decide(&j->s, a);
	size_t k = 0;

	out[0] = '\0';
	for (int i = 0; i < n; i++)
		k += (size_t)snprintf(out + k, sizeof(out) - k, "%s%s(%lld)", i ? " " : "",
				      mlfs_act_name(a[i].kind), (long long)a[i].version);
	return out;
}

/* Rule 11: a node serving the key's version, not lost, with no attempt in
 * its store, imports once per key. */
static void test_rule_11(void **state)
{
	(void)state;
	struct job j;

	job_init(&j);
	assert_string_equal(decide(&j), ""); /* no key */
	j.s.import_id = "i1";
	j.s.import_version = 2; /* for another layout: a reconfiguration came since */
	assert_string_equal(decide(&j), "");
	j.s.import_version = 3;
	assert_string_equal(decide(&j), "import(3)");
	j.s.reconf = MLFS_RECONF_FAILED; /* a failed attempt left the layout current */
	assert_string_equal(decide(&j), "import(3)");
	static const enum mlfs_reconf_state busy[] = {MLFS_RECONF_PREPARING, MLFS_RECONF_PREPARED,
						      MLFS_RECONF_COMMITTING, MLFS_RECONF_ABORTING};
	for (size_t i = 0; i < sizeof(busy) / sizeof(*busy); i++) {
		j.s.reconf = busy[i]; /* never beside an attempt */
		assert_string_equal(decide(&j), "");
	}
	j.s.reconf = MLFS_RECONF_IDLE;
	j.s.lost = true; /* its partitions are not the job's: it does not answer */
	assert_string_equal(decide(&j), "");
	j.s.lost = false;
	j.s.have = 2; /* behind the committed version (it is marked lost) */
	assert_string_equal(decide(&j), "mark-lost(3)");
	j.s.have = 3;
	j.s.import_tried = "i1"; /* ran it (imported or failed): once */
	assert_string_equal(decide(&j), "");
	j.s.import_id = "i2"; /* the command run again: again */
	assert_string_equal(decide(&j), "import(3)");
	j.s.etcd_ok = false; /* rule 1 */
	assert_string_equal(decide(&j), "");
}

/* The refusal before the key is put: every node of the config up at its
 * version, not lost; no attempt in etcd. */
static void test_refusal(void **state)
{
	(void)state;
	struct ptc_config *c = config_ok("{'version': 3, 'tp': 2, 'pp': 1, 'dp': 1, "
					 "'nodes': ['n0', 'n1']}");
	struct ptc_error err = {.text = ""};
	json_t *nodes = json_pack("{s{sssi}s{sssi}}", "n0", "state", "idle", "version", 3, "n1",
				  "state", "failed", "version", 3);

	assert_int_equal(mlfs_jobimport_refusal(c, nodes, false, &err), 0);
	assert_int_equal(mlfs_jobimport_refusal(c, nodes, true, &err), -EBUSY);
	assert_string_equal(err.text, "import: a reconfiguration is in progress: run the import "
				      "again once it ended");
	json_object_set_new(nodes, "n7", json_pack("{sssi}", "state", "lost", "version", 1));
	assert_int_equal(mlfs_jobimport_refusal(c, nodes, false, &err), 0); /* not the job's */
	json_object_set_new(nodes, "n1", json_pack("{sssi}", "state", "idle", "version", 2));
	assert_int_equal(mlfs_jobimport_refusal(c, nodes, false, &err), -EBUSY);
	assert_string_equal(err.text, "import: node n1 serves version 2, not the job's 3: run the "
				      "import again once it took it");
	json_object_set_new(nodes, "n1", json_pack("{sssi}", "state", "lost", "version", 3));
	assert_int_equal(mlfs_jobimport_refusal(c, nodes, false, &err), -EBUSY);
	assert_string_equal(err.text, "import: node n1 is lost (its partitions are not the "
				      "job's): reconfigure or `mlfs resume` first");
	json_object_del(nodes, "n1");
	assert_int_equal(mlfs_jobimport_refusal(c, nodes, false, &err), -EAGAIN);
	assert_string_equal(err.text, "import: node n1 of the job's config is down: its ranks "
				      "cannot be filled (mount it, or reconfigure without it, then "
				      "import)");
	json_decref(nodes);
	ptc_config_free(c);
}

/* An entry of a node at @version in @state that answered import @id with
 * @why (NULL: imported; id NULL: no answer yet). */
static json_t *entry(int version, const char *state, const char *id, const char *why)
{
	json_t *e = json_pack("{siss}", "version", version, "state", state);
	if (id)
		json_object_set_new(
		    e, "import",
		    json_pack("{ssso}", "id", id, "error", why ? json_string(why) : json_null()));
	return e;
}

static const char *word(const json_t *out, const char *node)
{
	return json_string_value(json_object_get(out, node));
}

/* The outcome: pending until every node answered or cannot; every failure
 * named, the first in the error. */
static void test_outcome(void **state)
{
	(void)state;
	struct ptc_config *c = config_ok("{'version': 3, 'tp': 1, 'pp': 1, 'dp': 3, "
					 "'nodes': ['n0', 'n1', 'n2']}");
	struct ptc_error err = {.text = ""};
	json_t *out = json_object(), *nodes = json_object();

	json_object_set_new(nodes, "n0", entry(3, "idle", "i2", NULL));
	json_object_set_new(nodes, "n1", entry(3, "idle", "i1", NULL)); /* the last run's */
	json_object_set_new(nodes, "n2", entry(3, "idle", NULL, NULL));
	assert_false(mlfs_jobimport_outcome(c, nodes, "i2", out, &err));
	assert_string_equal(word(out, "n0"), "imported");
	assert_null(word(out, "n1"));
	assert_int_equal(err.code, 0);

	json_object_set_new(nodes, "n1", entry(3, "idle", "i2", NULL));
	json_object_set_new(nodes, "n2", entry(3, "idle", "i2", NULL));
	assert_true(mlfs_jobimport_outcome(c, nodes, "i2", out, &err));
	assert_int_equal(json_object_size(out), 3);
	assert_int_equal(err.code, 0);
	assert_string_equal(err.text, "");

	/* One node could not read it: done, that node named with its reason. */
	json_object_set_new(nodes, "n2", entry(3, "idle", "i2", "import: /ckpt: cannot open"));
	assert_true(mlfs_jobimport_outcome(c, nodes, "i2", out, &err));
	assert_string_equal(word(out, "n2"), "failed: import: /ckpt: cannot open");
	assert_string_equal(word(out, "n1"), "imported");
	assert_int_equal(err.code, -EIO);
	assert_string_equal(err.text, "node n2: import: /ckpt: cannot open");

	/* Nodes that can no longer answer are failures, not waited for. */
	json_object_del(nodes, "n0");
	json_object_set_new(nodes, "n1", entry(4, "idle", "i1", NULL));
	json_object_set_new(nodes, "n2", entry(3, "lost", NULL, NULL));
	assert_true(mlfs_jobimport_outcome(c, nodes, "i2", out, &err));
	assert_string_equal(word(out, "n0"), "failed: down (its lease expired) before it imported");
	assert_string_equal(word(out, "n1"),
			    "failed: at version 4, not 3: the layout changed before it imported");
	assert_string_equal(word(out, "n2"), "failed: lost before it imported");
	assert_string_equal(err.text, "node n0: down (its lease expired) before it imported; and "
				      "2 more nodes failed (see \"nodes\")");
	json_decref(nodes);
	json_decref(out);
	ptc_config_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_rule_11),
	    cmocka_unit_test(test_refusal),
	    cmocka_unit_test(test_outcome),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
