/*
 * mlfs_resume.c - `mlfs resume --cluster cluster.json [--from DIR]`: a job
 * whose nodes all lost their memory continues from a snapshot, in one
 * command.
 *
 * DESIGN
 * After a whole-job restart every node is lost (mlfs_decide's rule 5):
 * its layout is the committed one, its partitions are zeros. The command
 * finds the snapshot (DIR itself, the newest step-<N> under DIR, or the
 * newest under the committed config's "snapshot" dir), checks that it is
 * one of this job's schema, and puts etcd's "restore" key
 * {"id", "version", "dir", "step"}: every lost node whose layout is that
 * version reads its ranks' boxes from the snapshot, into whatever layout
 * the config has (rule 10), and is the job's again; a node down now does
 * the same when it starts. The key is put only while no node of the
 * config is up with state in memory (mlfs_resume_refusal, a pure function):
 * a node that kept its state would otherwise serve a newer step beside
 * nodes restored to an older one. The command then waits for every node
 * that is up to publish the outcome ("restore" in its entry).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cluster/cluster_i.h"

int mlfs_resume_refusal(const struct ptc_config *c, const json_t *nodes, struct ptc_error *err)
{
	int lost = 0;
	for (int i = 0; i < c->nnodes; i++) {
		const json_t *e = json_object_get(nodes, c->nodes[i]);
		const char *state = json_string_value(json_object_get(e, "state"));
		if (e && !(state && strcmp(state, "lost") == 0))
			return ptc_error_set(
			    err, -EBUSY,
			    "node %s is up and not lost: its memory holds the job's "
			    "state (mlfs resume restores a job whose every node "
			    "lost it; reconfigure instead)",
			    c->nodes[i]);
		lost += e != NULL;
	}
	if (!lost)
		return ptc_error_set(err, -EAGAIN,
				     "no node of the job is up: mount them first (they restore "
				     "when they start, too)");
	return 0;
}

/* The snapshot to restore into @dir (PATH_MAX) and its manifest: @from
 * itself, or its newest step-<N>; without @from, the newest under the
 * config's "snapshot" dir. */
static int find_snapshot(const char *from, const struct ptc_config *c, char *dir, size_t cap,
			 json_t **manifest, struct ptc_error *err)
{
	char path[4200];
	struct stat sb;

	if (!from && !c->snap_dir)
		return ptc_errorf(err, "the job's config has no \"snapshot\" dir: give --from DIR");
	const char *root = from ? from : c->snap_dir;
	snprintf(path, sizeof(path), "%s/manifest.json", root);
	if (from && stat(path, &sb) == 0) {
		snprintf(dir, cap, "%s", from);
	} else {
		int64_t step = mlfs_snapshot_newest(root);
		if (step < 0)
			return ptc_errorf(err,
					  "%s: no complete snapshot (a manifest.json, or "
					  "step-<N>/manifest.json)",
					  root);
		snprintf(dir, cap, "%s/step-%" PRId64, root, step);
	}
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	json_error_t je;
	*manifest = json_load_file(path, 0, &je);
	if (!*manifest || !json_is_integer(json_object_get(*manifest, "step")) ||
	    strcmp(json_string_value(json_object_get(*manifest, "format")) ?: "",
		   "mlfs-snapshot") != 0) {
		json_decref(*manifest);
		*manifest = NULL;
		return ptc_errorf(err, "%s: not an mlfs snapshot's manifest", path);
	}
	return 0;
}

/* The job's nodes' entries, {id: entry} (an unreadable one is {}), into
 * *@nodes (a new reference): 0 or etcd's error. */
static int read_entries(struct net_etcd *etcd, const char *job, json_t **nodes,
			struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;
	char prefix[300];

	snprintf(prefix, sizeof(prefix), MLFS_KEYS_NODES, job);
	*nodes = NULL;
	int rc = net_etcd_range(etcd, prefix, true, &kvs, &n, NULL, NULL, err);
	if (rc)
		return rc;
	*nodes = json_object();
	for (size_t i = 0; i < n && *nodes; i++) {
		const char *id = kvs[i].key + strlen(prefix);
		if (!strchr(id, '/')) /* not a saved/<id> mark */
			json_object_set_new(*nodes, id,
					    json_loadb(kvs[i].value, kvs[i].len, 0, NULL)
						?: json_object());
	}
	net_etcd_kvs_free(kvs, n);
	return *nodes ? 0 : -ENOMEM;
}

/* Every node of @c that is up has published the outcome of restore @id:
 * true, with the failures in @err (its text empty when none). */
static bool all_answered(const struct ptc_config *c, const json_t *nodes, const char *id,
			 json_t *out, struct ptc_error *err)
{
	bool done = true;
	json_object_clear(out);
	for (int i = 0; i < c->nnodes; i++) {
		const json_t *e = json_object_get(nodes, c->nodes[i]);
		const json_t *r = json_object_get(e, "restore");
		const char *rid = json_string_value(json_object_get(r, "id"));
		const char *why = json_string_value(json_object_get(r, "error"));
		const char *state = json_string_value(json_object_get(e, "state"));
		if (!e) {
			json_object_set_new(out, c->nodes[i],
					    json_string("down: it restores when it starts"));
		} else if (!rid || strcmp(rid, id) != 0 ||
			   (!why && state && !strcmp(state, "lost"))) {
			done = false;
		} else if (why) {
			json_object_set_new(out, c->nodes[i], json_sprintf("failed: %s", why));
			if (!err->text[0])
				ptc_errorf(err, "node %s: %s", c->nodes[i], why);
		} else {
			json_object_set_new(out, c->nodes[i], json_string("restored"));
		}
	}
	return done;
}

int mlfs_cluster_resume(const struct ptc_cluster *cl, const char *from, int wait_s, json_t *out,
			struct ptc_error *err)
{
	struct net_etcd *etcd;
	struct net_etcd_kv *kvs = NULL;
	size_t n = 0;
	char prefix[300], key[400], dir[4096];
	struct ptc_config *c = NULL;
	json_t *manifest = NULL, *nodes = NULL, *schema = NULL;
	int rc;

	if (!cl->etcd || !cl->job)
		return ptc_errorf(err, "cluster.json: a job of many nodes (\"job\" and \"etcd\") "
				       "has nothing to resume");
	snprintf(prefix, sizeof(prefix), MLFS_KEYS_JOB, cl->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 10000};
	if ((rc = net_etcd_new(cl->etcd, &o, &etcd, err)))
		goto out_nodes;
	if ((rc = net_etcd_range(etcd, prefix, true, &kvs, &n, NULL, NULL, err)) ||
	    (rc = read_entries(etcd, cl->job, &nodes, err)))
		goto out;
	const struct net_etcd_kv *config = NULL;
	size_t plen = strlen(prefix);
	for (size_t i = 0; i < n; i++) {
		const char *name = kvs[i].key + plen;
		if (strcmp(name, "config") == 0)
			config = &kvs[i];
		else if (strcmp(name, "schema") == 0)
			schema = json_loadb(kvs[i].value, kvs[i].len, 0, NULL);
	}
	if (!config || !schema) {
		rc = ptc_errorf(err,
				"job \"%s\" has no committed config in etcd: write config.json "
				"and import instead",
				cl->job);
		goto out;
	}
	if ((rc = ptc_config_parse_text(config->value, config->len, "the job's config", &c, err)) ||
	    (rc = mlfs_resume_refusal(c, nodes, err)) ||
	    (rc = find_snapshot(from, c, dir, sizeof(dir), &manifest, err)))
		goto out;
	if (!json_equal(json_object_get(manifest, "schema"), schema)) {
		rc = ptc_errorf(err, "%s: the snapshot is of another schema than job \"%s\"'s", dir,
				cl->job);
		goto out;
	}
	int64_t step = json_integer_value(json_object_get(manifest, "step"));
	char id[40];
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(id, sizeof(id), "%llx-%x",
		 (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec,
		 (unsigned)getpid());
	json_t *req = json_pack("{sssIsssI}", "id", id, "version", (json_int_t)c->version, "dir",
				dir, "step", (json_int_t)step);
	char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!text) {
		rc = -ENOMEM;
		goto out;
	}
	/* Only while the config is still the one checked. */
	snprintf(key, sizeof(key), "%srestore", prefix);
	struct net_etcd_cmp cmp = {.key = config->key,
				   .target = NET_ETCD_MOD,
				   .result = NET_ETCD_EQUAL,
				   .num = config->mod_revision};
	struct net_etcd_op op = {
	    .kind = NET_ETCD_PUT, .key = key, .value = text, .len = strlen(text)};
	bool ok = false;
	rc = net_etcd_txn(etcd, &cmp, 1, &op, 1, NULL, 0, &ok, NULL, NULL, err);
	free(text);
	if (rc == 0 && !ok)
		rc = ptc_errorf(err, "the job's config changed meanwhile: run it again");
	if (rc)
		goto out;
	json_object_set_new(out, "dir", json_string(dir));
	json_object_set_new(out, "step", json_integer(step));
	json_object_set_new(out, "version", json_integer(c->version));
	json_t *each = json_object();
	json_object_set_new(out, "nodes", each);
	struct ptc_error failed = {.text = ""};
	for (int waited = 0;; waited += 200) {
		json_t *now_nodes;
		if (read_entries(etcd, cl->job, &now_nodes, &failed) == 0) {
			failed.text[0] = '\0';
			bool done = all_answered(c, now_nodes, id, each, &failed);
			json_decref(now_nodes);
			if (done)
				break;
		}
		if (waited >= wait_s * 1000) {
			rc = ptc_errorf(err,
					"not every node restored step %" PRId64 " within %d s "
					"(see each node's status.json)",
					step, wait_s);
			goto out;
		}
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (failed.text[0])
		rc = ptc_error_set(err, -EIO, "%s", failed.text);
out:
	json_decref(manifest);
	json_decref(schema);
	ptc_config_free(c);
	net_etcd_kvs_free(kvs, n);
	net_etcd_free(etcd);
out_nodes:
	json_decref(nodes);
	return rc;
}
