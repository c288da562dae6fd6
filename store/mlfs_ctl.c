/*
 * mlfs_ctl.c - the control files: schema.json and config.json writes
 * (installed here, or proposed to the control plane), .mlfs-ctl requests
 * (import, snapshot, verify, prepare, commit, abort; the test hook flip with
 * MLFS_TEST_HOOKS=1), status.json and rank.json.
 *
 * DESIGN
 * The dispatcher above both the store (mlfs_store.c, mlfs_view.c,
 * mlfs_import.c) and the reconfiguration (mlfs_reconf.c): neither calls
 * back into it. A refused write changes nothing and says why in
 * status.json.
 *
 * Threads: FUSE workers and I/O workers; st->lock taken briefly.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "store/store.h"
#include "dataset/dataset.h"

/* Records a refusal for status.json; returns @rc. Lock held. */
static int refuse(struct mlfs_store *st, int rc, const struct ptc_error *err)
{
	snprintf(st->error, sizeof(st->error), "%s", err->text);
	mlfs_store_status_changed(st);
	return rc;
}

/* The schema's own memory (tensors, names, indexes) and its text's copy. */
static int64_t schema_bytes(const struct ptc_schema *s, size_t textlen)
{
	return mlfs_mem_schema(s) + mlfs_mem_alloc(textlen + 1);
}

int mlfs_store_set_control(struct mlfs_store *st, bool config, const char *text, size_t len,
			   struct ptc_error *err)
{
	if (st->propose) {
		int rc = st->propose(st->cluster_arg, config, text, len, err);
		if (rc)
			mlfs_store_note_error(st, err->text);
		return rc;
	}
	return config ? mlfs_store_install_config(st, text, len, err)
		      : mlfs_store_install_schema(st, text, len, err);
}

int mlfs_store_install_schema(struct mlfs_store *st, const char *text, size_t len,
			      struct ptc_error *err)
{
	struct ptc_schema *s;
	int rc = ptc_schema_parse_text(text, len, "schema.json", &s, err);

	pthread_mutex_lock(&st->lock);
	if (rc) {
		rc = refuse(st, rc, err);
		goto out;
	}
	if (st->view) {
		bool same = st->schema_text && strlen(st->schema_text) == len &&
			    memcmp(st->schema_text, text, len) == 0;
		ptc_schema_free(s);
		if (!same) {
			ptc_error_set(err, -EBUSY,
				      "schema.json: cannot change the schema once config.json "
				      "is set (unmount and start a new store)");
			rc = refuse(st, -EBUSY, err);
		}
		goto out;
	}
	int64_t bytes = schema_bytes(s, len);
	if (xf_mem_reserve(&st->mem, bytes)) {
		ptc_error_set(err, -ENOSPC,
			      "schema.json: its %d tensors (%" PRId64 " bytes) do not fit "
			      "in --max-memory",
			      s->ntensors, bytes);
		ptc_schema_free(s);
		rc = refuse(st, -ENOSPC, err);
		goto out;
	}
	char *t = strndup(text, len);
	if (!t) {
		xf_mem_release(&st->mem, bytes);
		ptc_schema_free(s);
		rc = -ENOMEM;
		goto out;
	}
	xf_mem_release(&st->mem, st->schema_bytes);
	ptc_schema_free(st->schema);
	free(st->schema_text);
	st->schema = s;
	st->schema_text = t;
	st->schema_bytes = bytes;
	st->error[0] = '\0';
out:
	pthread_mutex_unlock(&st->lock);
	return rc;
}

/* The reconfiguration steps of .mlfs-ctl: "prepare", "commit", "abort". */
static int control_reconf(struct mlfs_store *st, const char *op, json_t *req, struct ptc_error *err)
{
	struct ptc_error step = {.text = ""};
	json_t *jv = json_object_get(req, "version"), *jc = json_object_get(req, "config");
	json_t *why = json_object_get(req, "reason");
	int rc;

	if (strcmp(op, "prepare") == 0) {
		if (!json_is_string(jc))
			return ptc_errorf(err,
					  "prepare: \"config\" must be the config's JSON text");
		rc = mlfs_reconf_prepare(st, json_string_value(jc), json_string_length(jc),
					 "prepare", false, &step);
	} else if (!json_is_integer(jv) || json_integer_value(jv) < 0) {
		return ptc_errorf(err, "%s: \"version\" must be the version being reconfigured to",
				  op);
	} else if (strcmp(op, "commit") == 0) {
		rc = mlfs_reconf_commit(st, json_integer_value(jv), &step);
	} else if (why && !json_is_string(why)) {
		return ptc_errorf(err, "abort: \"reason\" must be a string");
	} else {
		rc = mlfs_reconf_abort(st, json_integer_value(jv), json_string_value(why), &step);
	}
	if (rc)
		ptc_error_set(err, rc, "%s", step.text[0] ? step.text : strerror(-rc));
	return rc;
}

int mlfs_store_control(struct mlfs_store *st, const char *text, size_t len, char **reply)
{
	struct ptc_error err = {.text = ""};
	json_error_t je;
	json_t *req = json_loadb(text, len, 0, &je);
	int rc = -EINVAL;
	bool reconf = false;
	json_t *extra = NULL; /* fields of a verify's reply */

	const char *op = json_string_value(json_object_get(req, "op"));
	if (!req || !op) {
		ptc_errorf(&err, "control: expected {\"op\": ...}");
	} else if (strcmp(op, "import") == 0) {
		const char *dir = json_string_value(json_object_get(req, "from"));
		const char *state = json_string_value(json_object_get(req, "state"));
		json_t *jstep = json_object_get(req, "step");
		const char *names = json_string_value(json_object_get(req, "names"));
		const char *map = json_string_value(json_object_get(req, "map"));
		json_t *every = json_object_get(req, "every_node"),
		       *jw = json_object_get(req, "wait");
		int only = -1;
		if (!dir || dir[0] != '/') {
			ptc_errorf(&err, "import: \"from\" must be an absolute path");
		} else if (jstep && (!json_is_integer(jstep) || json_integer_value(jstep) < 0)) {
			ptc_errorf(&err, "import: \"step\" must be a non-negative integer");
		} else if (!st->schema) {
			ptc_errorf(&err, "import: set schema.json and config.json first");
		} else if (state && (only = ptc_schema_find_state(st->schema, state)) < 0) {
			ptc_errorf(&err, "import: the schema has no state \"%s\"", state);
		} else if (map && map[0] != '/') {
			ptc_errorf(&err, "import: \"map\" must be an absolute path");
		} else if (every && !json_is_boolean(every)) {
			ptc_errorf(&err, "import: \"every_node\" must be true or false");
		} else if (jw && (!json_is_integer(jw) || json_integer_value(jw) < 1 ||
				  json_integer_value(jw) > 86400)) {
			ptc_errorf(&err, "import: \"wait\" must be 1 to 86400 seconds");
		} else if (json_is_true(every)) { /* every node of the job, its own ranks */
			if (!st->import_all)
				ptc_errorf(&err, "import: \"every_node\": a job of one node has no "
						 "other node");
			else if (!(extra = json_object()))
				rc = ptc_error_set(&err, -ENOMEM, "out of memory");
			else
				rc = st->import_all(st->cluster_arg, req,
						    jw ? (int)json_integer_value(jw) : 600, extra,
						    &err);
		} else if (names || map) { /* safetensors named otherwise */
			rc = mlfs_store_import_st(st, dir, only,
						  jstep ? json_integer_value(jstep) : -1, names,
						  map, &err);
		} else {
			rc = mlfs_store_import(st, dir, only,
					       jstep ? json_integer_value(jstep) : -1, &err);
		}
		if (rc == 0 && st->import_all && !json_is_true(every))
			extra = json_pack("{ss}", "note",
					  "filled this node's ranks only: the job's other nodes "
					  "import theirs with `--every-node` (or each its own)");
	} else if (strcmp(op, "snapshot") == 0) {
		const char *dir = json_string_value(json_object_get(req, "to"));
		json_t *jl = json_object_get(req, "level"), *jw = json_object_get(req, "wait");
		if (!dir || dir[0] != '/')
			ptc_errorf(&err, "snapshot: \"to\" must be an absolute path");
		else if (jl && (!json_is_integer(jl) || json_integer_value(jl) < -7 ||
				json_integer_value(jl) > 19))
			ptc_errorf(&err, "snapshot: \"level\" must be a zstd level, -7 to 19");
		else if (jw && (!json_is_integer(jw) || json_integer_value(jw) < 0 ||
				json_integer_value(jw) > 86400))
			ptc_errorf(&err, "snapshot: \"wait\" must be 0 to 86400 seconds");
		else if (!(extra = json_object()))
			rc = ptc_error_set(&err, -ENOMEM, "out of memory");
		else
			rc = mlfs_store_snapshot(
			    st, dir, jl ? (int)json_integer_value(jl) : MLFS_SNAP_LEVEL,
			    jw ? (int)json_integer_value(jw) : 600, extra, &err);
	} else if (strcmp(op, "drain") == 0) {
		const char *node = json_string_value(json_object_get(req, "node"));
		json_t *undo = json_object_get(req, "undo");
		if (!node)
			ptc_errorf(&err, "drain: \"node\" must be a node id");
		else if (undo && !json_is_boolean(undo))
			ptc_errorf(&err, "drain: \"undo\" must be true or false");
		else if (!st->drain)
			ptc_errorf(&err, "drain: a job of one node has no node to drain");
		else
			rc = st->drain(st->cluster_arg, node, json_is_true(undo), &err);
	} else if (strcmp(op, "verify") == 0) {
		rc = (extra = json_object()) ? mlfs_store_verify(st, extra, &err)
					     : ptc_error_set(&err, -ENOMEM, "out of memory");
	} else if (strcmp(op, "flip") == 0 && mlfs_test_hooks()) {
		json_t *jr = json_object_get(req, "rank"), *jb = json_object_get(req, "byte");
		rc = mlfs_store_flip(st, json_is_integer(jr) ? (int)json_integer_value(jr) : -1,
				     json_string_value(json_object_get(req, "state")),
				     json_string_value(json_object_get(req, "tensor")),
				     json_is_integer(jb) ? json_integer_value(jb) : -1, &err);
	} else if (strcmp(op, "prepare") == 0 || strcmp(op, "commit") == 0 ||
		   strcmp(op, "abort") == 0) {
		rc = control_reconf(st, op, req, &err);
		reconf = true;
	} else {
		ptc_errorf(&err, "control: unknown op \"%s\"", op);
	}
	json_decref(req);
	json_t *r = json_pack("{sbss}", "ok", rc == 0, "error", err.text);
	if (r && extra)
		json_object_update(r, extra);
	json_decref(extra);
	if (r && reconf) {
		pthread_mutex_lock(&st->lock);
		json_object_set_new(r, "state", json_string(mlfs_reconf_state_name(st->reconf)));
		pthread_mutex_unlock(&st->lock);
	}
	*reply = r ? json_dumps(r, JSON_COMPACT) : NULL;
	json_decref(r);
	if (rc)
		mlfs_store_note_error(st, err.text);
	return rc;
}

/* ---------------------------------------------------------------- status */

char *mlfs_store_status_json(struct mlfs_store *st)
{
	json_t *o = json_object();

	pthread_mutex_lock(&st->lock);
	json_object_set_new(o, "node", json_string(mlfs_store_cluster(st)->nodes[st->node].id));
	json_object_set_new(o, "version",
			    st->view ? json_integer(st->view->config->version) : json_null());
	/* "lost": this node's partitions are not the job's (a job of many
	 * nodes: it restarted without its memory, or missed a commit), shown
	 * while no reconfiguration runs here. */
	bool lost = atomic_load(&st->lost);
	json_object_set_new(o, "state",
			    json_string(lost && st->state == MLFS_IDLE
					    ? "lost"
					    : mlfs_reconf_state_name(st->reconf)));
	if (lost)
		json_object_set_new(o, "lost", json_true());
	json_object_set_new(o, "step", st->view ? json_integer(st->steps[0]) : json_null());
	if (st->state == MLFS_TRANSFORMING)
		json_object_set_new(o, "target_version", json_integer(st->target_version));
	json_object_set_new(o, "progress_bytes", json_integer(st->progress));
	json_object_set_new(o, "progress_total", json_integer(st->progress_total));
	json_object_set_new(o, "memory_used", json_integer(st->mem.used));
	json_object_set_new(o, "memory_limit", json_integer(st->mem.limit));
	if (st->has_last)
		json_object_set_new(
		    o, "last",
		    json_pack("{sIsIsIsIsIsIsf}", "from_version", (json_int_t)st->last_from,
			      "to_version", (json_int_t)st->last_to, "bytes_reused",
			      (json_int_t)st->last.bytes_reused, "bytes_copied",
			      (json_int_t)st->last.bytes_copied, "bytes_fetched",
			      (json_int_t)st->last.bytes_fetched, "bytes_zeroed",
			      (json_int_t)st->last.bytes_zeroed, "seconds", st->last.seconds));
	if (st->has_last) {
		json_t *l = json_object_get(o, "last");
		json_object_set_new(l, "bytes_served", json_integer(st->last_served));
		/* the checksums of the new partitions (xf_execute's last step) */
		json_object_set_new(l, "bytes_summed", json_integer(st->last.bytes_summed));
		json_object_set_new(l, "seconds_sum", json_real(st->last.seconds_sum));
		json_object_set_new(l, "peak_extra_memory",
				    json_integer(st->last_peak > 0 ? st->last_peak : 0));
	}
	json_object_set_new(o, "error", st->error[0] ? json_string(st->error) : json_null());
	json_t *sn = mlfs_autosnap_status(st, st->view ? st->view->config : NULL);
	if (sn)
		json_object_set_new(o, "snapshots", sn);
	struct mlfs_view *v = mlfs_view_get(st->view);
	pthread_mutex_unlock(&st->lock);
	if (v && v->ds) {
		json_t *d = mlfs_data_status(v->ds);
		json_t *segs = json_array();
		for (int k = 0; k < v->cursor.nsegs; k++)
			json_array_append_new(
			    segs,
			    json_pack("{sIsIsIsi}", "step", (json_int_t)v->cursor.segs[k].step,
				      "sample", (json_int_t)v->cursor.segs[k].sample,
				      "global_batch", (json_int_t)v->cursor.segs[k].batch, "dp",
				      v->cursor.segs[k].dp));
		json_object_set_new(d, "cursor", segs);
		json_object_set_new(o, "dataset", d);
	}
	mlfs_view_put(v);
	if (st->status_add)
		st->status_add(st->cluster_arg, o);
	char *s = json_dumps(o, JSON_INDENT(1));
	json_decref(o);
	return s;
}

char *mlfs_rank_json(const struct mlfs_view *v, int rank)
{
	const struct ptc_layout *l = &v->layout;
	const struct ptc_rank *rk = &l->ranks[rank];
	json_t *o = json_pack("{sisisisisssis[ii]}", "rank", rank, "tp", rk->t, "pp", rk->p, "dp",
			      rk->d, "node", l->cluster->nodes[rk->node].id, "device", rk->device,
			      "layers", rk->layer_begin, rk->layer_end);
	json_object_set_new(o, "tp_size", json_integer(l->tp));
	json_object_set_new(o, "pp_size", json_integer(l->pp));
	json_object_set_new(o, "dp_size", json_integer(l->dp));
	json_object_set_new(o, "version", json_integer(v->config->version));
	char *s = json_dumps(o, JSON_INDENT(1));
	json_decref(o);
	return s;
}
