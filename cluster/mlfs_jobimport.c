/*
 * mlfs_jobimport.c - `mlfs import --every-node`: one checkpoint that every
 * node of a job can read (shared storage) imported by every node into its
 * own ranks' partitions, in one command.
 *
 * DESIGN
 * As `mlfs resume` (mlfs_resume.c) does for snapshots. The command is a
 * .mlfs-ctl request to any node (mlfs_jobimport_start): it reads the
 * job's keys, checks that every node of the committed config is up at
 * that version and not lost and that no reconfiguration is in progress
 * (mlfs_jobimport_refusal, pure), and puts etcd's "import" key
 * {"id", "version", "from", "state", "step", "names", "map"} in a
 * transaction that holds only while the config and the absence of an
 * attempt are as checked. Every node serving that version runs the import
 * it names once (mlfs_decide's rule 11; mlfs_jobimport_act) through the
 * one import path (mlfs_store_import, or mlfs_store_import_st for a name
 * map), exactly as a local `mlfs import` of the same source, and publishes
 * the outcome in its entry ("import": {"id", "error"}). The command waits
 * until every node of the config answered or can no longer
 * (mlfs_jobimport_outcome, pure) and reports each.
 *
 * Each node's import is all or nothing; the job's is not: when one node
 * fails, the others hold the imported step and the failed one its old
 * state, and the ranks' saved steps differ, so a reconfiguration is
 * refused until a run of the command succeeds. Running it again is the
 * fix: a new id, and every node imports again.
 *
 * Threads: mlfs_jobimport_start on an I/O worker (.mlfs-ctl), without
 * locks while it waits; mlfs_jobimport_act in a round (round_lock:
 * the control thread's, or the job watch's).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/cluster_i.h"
#include "cluster/decide_i.h"

int mlfs_jobimport_refusal(const struct ptc_config *c, const json_t *nodes, bool attempt,
			   struct ptc_error *err)
{
	if (attempt)
		return ptc_error_set(err, -EBUSY,
				     "import: a reconfiguration is in progress: run the import "
				     "again once it ended");
	for (int i = 0; i < c->nnodes; i++) {
		const json_t *e = json_object_get(nodes, c->nodes[i]);
		const char *state = json_string_value(json_object_get(e, "state"));
		int64_t v = json_integer_value(json_object_get(e, "version"));
		if (!e)
			return ptc_error_set(err, -EAGAIN,
					     "import: node %s of the job's config is down: its "
					     "ranks cannot be filled (mount it, or reconfigure "
					     "without it, then import)",
					     c->nodes[i]);
		if (state && strcmp(state, "lost") == 0)
			return ptc_error_set(err, -EBUSY,
					     "import: node %s is lost (its partitions are not the "
					     "job's): reconfigure or `mlfs resume` first",
					     c->nodes[i]);
		if (v != c->version)
			return ptc_error_set(err, -EBUSY,
					     "import: node %s serves version %" PRId64
					     ", not the job's %" PRId64
					     ": run the import again once "
					     "it took it",
					     c->nodes[i], v, c->version);
	}
	return 0;
}

bool mlfs_jobimport_outcome(const struct ptc_config *c, const json_t *nodes, const char *id,
			    json_t *out, struct ptc_error *err)
{
	bool done = true;
	int failed = 0;
	char first[PTC_ERROR_MAX] = "";

	json_object_clear(out);
	ptc_error_set(err, 0, "%s", "");
	for (int i = 0; i < c->nnodes; i++) {
		const char *node = c->nodes[i];
		const json_t *e = json_object_get(nodes, node);
		const json_t *r = json_object_get(e, "import");
		const char *rid = json_string_value(json_object_get(r, "id"));
		const char *why = json_string_value(json_object_get(r, "error"));
		const char *state = json_string_value(json_object_get(e, "state"));
		int64_t v = json_integer_value(json_object_get(e, "version"));
		char buf[128];
		const char *fail;
		if (e && rid && strcmp(rid, id) == 0) {
			if (!why) {
				json_object_set_new(out, node, json_string("imported"));
				continue;
			}
			fail = why;
		} else if (!e) {
			fail = "down (its lease expired) before it imported";
		} else if (state && strcmp(state, "lost") == 0) {
			fail = "lost before it imported";
		} else if (v != c->version) {
			snprintf(buf, sizeof(buf),
				 "at version %" PRId64 ", not %" PRId64
				 ": the layout changed before it imported",
				 v, c->version);
			fail = buf;
		} else {
			done = false; /* not yet */
			continue;
		}
		json_object_set_new(out, node, json_sprintf("failed: %s", fail));
		if (!failed++)
			snprintf(first, sizeof(first), "node %s: %s", node, fail);
	}
	if (failed) { /* the first failure, cut to leave room for the count */
		char more[64] = "";
		if (failed > 1)
			snprintf(more, sizeof(more), "; and %d more nodes failed (see \"nodes\")",
				 failed - 1);
		int room = (int)(sizeof(err->text) - 1 - strlen(more));
		ptc_error_set(err, -EIO, "%.*s%s", room, first, more);
	}
	return done;
}

/* The "import" key of the request @req for version @version, as text. */
static char *key_text(const json_t *req, const char *id, int64_t version)
{
	static const char *const fields[] = {"from", "state", "step", "names", "map"};
	json_t *o = json_pack("{sssI}", "id", id, "version", (json_int_t)version);
	for (size_t i = 0; o && i < sizeof(fields) / sizeof(*fields); i++) {
		json_t *f = json_object_get(req, fields[i]);
		if (f)
			json_object_set(o, fields[i], f);
	}
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return text;
}

/* Puts the key of @req, checked against @k: 0, or why not. The id into
 * @id (40 bytes), the config into *@cfg (the caller's). */
static int put_key(struct mlfs_cluster *c, const json_t *req, const struct mlfs_jobkeys *k,
		   char *id, struct ptc_config **cfg, struct ptc_error *err)
{
	char key[400];
	struct timespec now;
	int rc;

	if (!k->config || k->committed <= 0)
		return ptc_errorf(err, "import: the job has no committed config: write "
				       "config.json first");
	if ((rc = ptc_config_parse_text(k->config->value, k->config->len, "the job's config", cfg,
					err)) ||
	    (rc = mlfs_jobimport_refusal(*cfg, k->nodes, k->attempt != NULL, err)))
		return rc;
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(id, 40, "%llx-%x",
		 (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec,
		 (unsigned)getpid());
	char *text = key_text(req, id, (*cfg)->version);
	if (!text)
		return ptc_error_set(err, -ENOMEM, "out of memory");
	mlfs_jobkeys_name(c, key, sizeof(key), "import");
	char akey[400];
	mlfs_jobkeys_name(c, akey, sizeof(akey), "attempt");
	/* Only while the config is the one checked and no attempt started. */
	struct net_etcd_cmp cmp[2] = {
	    {.key = k->config->key,
	     .target = NET_ETCD_MOD,
	     .result = NET_ETCD_EQUAL,
	     .num = k->config->mod_revision},
	    {.key = akey, .target = NET_ETCD_CREATE, .result = NET_ETCD_EQUAL, .num = 0}};
	struct net_etcd_op op = {
	    .kind = NET_ETCD_PUT, .key = key, .value = text, .len = strlen(text)};
	bool ok = false;
	struct ptc_error why = {.text = ""};
	rc = net_etcd_txn(c->etcd, cmp, 2, &op, 1, NULL, 0, &ok, NULL, NULL, &why);
	free(text);
	if (rc)
		return ptc_error_set(err, -EIO, "import: etcd: %s", why.text);
	if (!ok)
		return ptc_error_set(err, -EBUSY,
				     "import: the job's config changed or a reconfiguration "
				     "started meanwhile: run it again");
	return 0;
}

int mlfs_jobimport_start(void *arg, const json_t *req, int wait_s, json_t *out,
			 struct ptc_error *err)
{
	struct mlfs_cluster *c = arg;
	struct mlfs_jobkeys k;
	struct ptc_config *cfg = NULL;
	struct ptc_error why = {.text = ""};
	char id[40];
	int rc;

	if ((rc = mlfs_jobkeys_read(c, &k, &why)))
		return ptc_error_set(err, -EIO, "import: etcd: %s", why.text);
	rc = put_key(c, req, &k, id, &cfg, err);
	mlfs_jobkeys_free(&k);
	if (rc)
		goto out;
	mlfs_log(MLFS_LOG_INFO, "cluster: import %s from %s on every node of version %" PRId64, id,
		 json_string_value(json_object_get(req, "from")), cfg->version);
	json_t *each = json_object();
	json_object_set_new(out, "version", json_integer(cfg->version));
	json_object_set_new(out, "nodes", each);
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		json_t *nodes = mlfs_jobkeys_read_nodes(c, &why);
		bool done = nodes && mlfs_jobimport_outcome(cfg, nodes, id, each, err);
		json_decref(nodes);
		if (done) {
			rc = err->code;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec >= wait_s) {
			rc = ptc_error_set(err, -ETIMEDOUT,
					   "import: not every node answered within %d s (%s): "
					   "see each node's status.json",
					   wait_s, nodes ? "still importing" : why.text);
			break;
		}
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
out:
	ptc_config_free(cfg);
	return rc;
}

void mlfs_jobimport_act(struct mlfs_cluster *c, const json_t *key)
{
	struct mlfs_store *st = c->st;
	const char *id = json_string_value(json_object_get(key, "id"));
	const char *from = json_string_value(json_object_get(key, "from"));
	const char *state = json_string_value(json_object_get(key, "state"));
	const char *names = json_string_value(json_object_get(key, "names"));
	const char *map = json_string_value(json_object_get(key, "map"));
	json_t *jstep = json_object_get(key, "step");
	int64_t step = json_is_integer(jstep) ? json_integer_value(jstep) : -1;
	struct ptc_error err = {.text = ""};
	int only = -1, rc;

	pthread_mutex_lock(&c->lock);
	snprintf(c->import_tried, sizeof(c->import_tried), "%s", id ? id : "");
	pthread_mutex_unlock(&c->lock);
	if (!from || from[0] != '/')
		rc = ptc_errorf(&err, "import: the import key names no absolute path");
	else if (state && (only = ptc_schema_find_state(st->schema, state)) < 0)
		rc = ptc_errorf(&err, "import: the schema has no state \"%s\"", state);
	else if (names || map)
		rc = mlfs_store_import_st(st, from, only, step, names, map, &err);
	else
		rc = mlfs_store_import(st, from, only, step, &err);
	if (rc == 0)
		mlfs_log(MLFS_LOG_INFO, "cluster: imported %s (job-wide import %s)", from, id);
	else
		mlfs_log(MLFS_LOG_WARNING, "cluster: job-wide import %s of %s: %s", id ? id : "?",
			 from ? from : "?", err.text);
	if (rc)
		mlfs_store_note_error(st, err.text);
	pthread_mutex_lock(&c->lock); /* published together: the outcome of this id */
	snprintf(c->import_done, sizeof(c->import_done), "%s", id ? id : "");
	snprintf(c->import_error, sizeof(c->import_error), "%s",
		 rc ? (err.text[0] ? err.text : strerror(-rc)) : "");
	pthread_mutex_unlock(&c->lock);
	if (st->steps_saved)
		st->steps_saved(st->cluster_arg); /* the entry (and saved/<id>), now */
}
