/*
 * ptc_config.c - config.json and cluster.json: parse and check ranges.
 *
 * Whether a config fits a cluster and a schema is checked by
 * ptc_layout_init; here only syntax, types and ranges.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

static const char *const config_keys[] = {"version",  "tp",	 "pp",	     "dp",	"nodes",
					  "replicas", "dataset", "snapshot", "elastic", NULL};
static const char *const elastic_keys[] = {"min_nodes", "max_nodes", "policy", "micro_batch", NULL};
static const char *const snapshot_keys[] = {"dir",	 "every", "keep", "threads",
					    "max_mib_s", "level", NULL};
static const char *const dataset_keys[] = {"index",   "seed",	"global_batch",
					   "shuffle", "epochs", NULL};
static const char *const cluster_keys[] = {"nodes", "token_file", "job", "etcd", NULL};

/* One etcd member's client URL @u (@n bytes) of cluster.json's "etcd": 0,
 * or -EINVAL naming it (the @i-th of a list when @list). */
static int endpoint_ok(const char *u, size_t n, bool list, size_t i, const char *file,
		       struct ptc_error *err)
{
	char where[48] = "";

	if (list)
		snprintf(where, sizeof(where), "[%zu]", i);
	bool scheme =
	    (n > 7 && strncmp(u, "http://", 7) == 0) || (n > 8 && strncmp(u, "https://", 8) == 0);
	for (size_t k = 0; k < n && scheme; k++) /* a comma separates two */
		scheme = (unsigned char)u[k] > 0x20 && (unsigned char)u[k] < 0x7f && u[k] != ',';
	if (!scheme)
		return ptc_errorf(err,
				  "%s: \"etcd\"%s = \"%.*s\" must be an http:// or https:// URL "
				  "(an etcd member's client URL)",
				  file, where, (int)(n > 200 ? 200 : n), u);
	return 0;
}

/*
 * cluster.json's "etcd": one member's client URL, several separated by
 * commas (as etcdctl's --endpoints), or an array of them; into *@out as
 * one comma-separated string (malloc'd), which net_etcd_new takes. 0, or
 * -EINVAL with @err naming the bad part, -ENOMEM.
 */
static int etcd_endpoints(const json_t *etcd, char **out, const char *file, struct ptc_error *err)
{
	json_t *list = json_is_array(etcd) ? json_incref((json_t *)etcd) : json_array();
	size_t i, total = 0;
	json_t *v;
	int rc = 0;

	*out = NULL;
	if (!list)
		return ptc_error_set(err, -ENOMEM, "%s: out of memory", file);
	if (json_is_string(etcd)) { /* "u1" or "u1,u2,..." */
		const char *s = json_string_value(etcd);
		for (size_t k = 0;;) {
			size_t n = strcspn(s + k, ",");
			json_array_append_new(list, json_stringn(s + k, n));
			if (!s[k + n])
				break;
			k += n + 1;
		}
	} else if (!json_is_array(etcd)) {
		rc = ptc_errorf(err,
				"%s: \"etcd\" must be an etcd member's http:// or https:// "
				"URL, several separated by commas, or an array of them",
				file);
	}
	if (rc == 0 && (json_array_size(list) == 0 || json_array_size(list) > PTC_ETCD_MAX))
		rc = ptc_errorf(err, "%s: \"etcd\" must list 1 to %d members' URLs, not %zu", file,
				PTC_ETCD_MAX, json_array_size(list));
	json_array_foreach(list, i, v)
	{
		if (rc)
			break;
		if (!json_is_string(v))
			rc = ptc_errorf(err, "%s: \"etcd\"[%zu] must be a string", file, i);
		else
			rc = endpoint_ok(json_string_value(v), json_string_length(v),
					 json_is_array(etcd), i, file, err);
		total += json_string_length(v) + 1;
	}
	if (rc == 0 && total > 4096)
		rc = ptc_errorf(err, "%s: \"etcd\" is longer than 4096 bytes", file);
	if (rc == 0 && !(*out = malloc(total)))
		rc = ptc_error_set(err, -ENOMEM, "%s: out of memory", file);
	for (size_t at = 0, k = 0; rc == 0 && k < json_array_size(list); k++) {
		v = json_array_get(list, k);
		memcpy(*out + at, json_string_value(v), json_string_length(v));
		at += json_string_length(v);
		(*out)[at++] = k + 1 < json_array_size(list) ? ',' : '\0';
	}
	json_decref(list);
	return rc;
}
static const char *const node_keys[] = {"id", "addr", "devices", NULL};

#define MAX_DEGREE 65536

static bool id_valid(const char *s)
{
	return ptc_path_valid(s, false) && !strchr(s, '/') && strlen(s) <= 64;
}

void ptc_config_free(struct ptc_config *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->nnodes; i++)
		free(c->nodes[i]);
	free(c->nodes);
	free(c->dataset_index);
	free(c->snap_dir);
	free(c);
}

static int parse_dataset(struct ptc_config *c, const json_t *ds, const char *file,
			 struct ptc_error *err)
{
	int64_t v;
	int rc;

	if (!json_is_object(ds))
		return ptc_errorf(err, "%s: \"dataset\" must be an object", file);
	if (ptc_json_known(ds, dataset_keys, file, "dataset", err))
		return -EINVAL;
	json_t *idx = json_object_get(ds, "index");
	if (!json_is_string(idx) || !*json_string_value(idx))
		return ptc_errorf(err, "%s: dataset.index must be a non-empty URI string", file);
	if (!(c->dataset_index = strdup(json_string_value(idx))))
		return -ENOMEM;
	rc = ptc_json_int(ds, "seed", false, 0, INT64_MAX, &v, file, "dataset", err);
	if (rc < 0)
		return rc;
	c->dataset_seed = rc == 0 ? (uint64_t)v : 0;
	if (ptc_json_int(ds, "global_batch", true, 1, 1 << 30, &c->dataset_global_batch, file,
			 "dataset", err))
		return -EINVAL;
	json_t *sh = json_object_get(ds, "shuffle");
	if (sh && !json_is_boolean(sh))
		return ptc_errorf(err, "%s: dataset.shuffle must be true or false", file);
	c->dataset_shuffle = sh ? json_is_true(sh) : true;
	rc = ptc_json_int(ds, "epochs", false, 1, INT32_MAX, &v, file, "dataset", err);
	if (rc < 0)
		return rc;
	c->dataset_epochs = rc == 0 ? v : 0;
	c->has_dataset = true;
	return 0;
}

/* "elastic": {"min_nodes": N, "max_nodes": M, "policy": "auto",
 * "micro_batch": B}: the job's controller chooses the layout when nodes die
 * or join (cluster/mlfs_elastic.c), with a DP degree that splits the
 * dataset's global batch into whole micro-batches of B samples. */
static int parse_elastic(struct ptc_config *c, const json_t *o, const char *file,
			 struct ptc_error *err)
{
	int64_t lo = 1, hi = MAX_DEGREE, mb = 1;

	if (!json_is_object(o))
		return ptc_errorf(err, "%s: \"elastic\" must be an object", file);
	if (ptc_json_known(o, elastic_keys, file, "elastic", err))
		return -EINVAL;
	if (ptc_json_int(o, "min_nodes", false, 1, MAX_DEGREE, &lo, file, "elastic", err) < 0 ||
	    ptc_json_int(o, "max_nodes", false, 1, MAX_DEGREE, &hi, file, "elastic", err) < 0 ||
	    ptc_json_int(o, "micro_batch", false, 1, INT32_MAX, &mb, file, "elastic", err) < 0)
		return -EINVAL;
	if (lo > hi)
		return ptc_errorf(
		    err, "%s: elastic.min_nodes = %" PRId64 " is more than max_nodes = %" PRId64,
		    file, lo, hi);
	const json_t *p = json_object_get(o, "policy");
	if (p && !(json_is_string(p) && strcmp(json_string_value(p), "auto") == 0))
		return ptc_errorf(err, "%s: elastic.policy must be \"auto\" (the only policy)",
				  file);
	c->elastic = true;
	c->elastic_min = (int)lo;
	c->elastic_max = (int)hi;
	c->elastic_micro_batch = mb;
	return 0;
}

/* "snapshot": {"dir": "/abs", "every": N, "keep": K, "threads": T,
 * "max_mib_s": M, "level": L}: periodic snapshots (store/mlfs_autosnap.c). */
static int parse_snapshot(struct ptc_config *c, const json_t *o, const char *file,
			  struct ptc_error *err)
{
	int64_t v;
	int rc;

	if (!json_is_object(o))
		return ptc_errorf(err, "%s: \"snapshot\" must be an object", file);
	if (ptc_json_known(o, snapshot_keys, file, "snapshot", err))
		return -EINVAL;
	json_t *dir = json_object_get(o, "dir");
	if (!json_is_string(dir) || json_string_value(dir)[0] != '/' ||
	    strlen(json_string_value(dir)) > 3000)
		return ptc_errorf(err,
				  "%s: snapshot.dir must be an absolute path (a directory every "
				  "node of the job can reach)",
				  file);
	if (!(c->snap_dir = strdup(json_string_value(dir))))
		return -ENOMEM;
	if (ptc_json_int(o, "every", true, 1, INT32_MAX, &c->snap_every, file, "snapshot", err))
		return -EINVAL;
	if ((rc = ptc_json_int(o, "keep", false, 1, 1000, &v, file, "snapshot", err)) < 0)
		return rc;
	c->snap_keep = rc == 0 ? (int)v : 2;
	if ((rc = ptc_json_int(o, "threads", false, 1, 256, &v, file, "snapshot", err)) < 0)
		return rc;
	c->snap_threads = rc == 0 ? (int)v : 1;
	if ((rc = ptc_json_int(o, "max_mib_s", false, 0, 1 << 30, &v, file, "snapshot", err)) < 0)
		return rc;
	c->snap_max_mib_s = rc == 0 ? v : 0;
	if ((rc = ptc_json_int(o, "level", false, -7, 19, &v, file, "snapshot", err)) < 0)
		return rc;
	c->snap_level = rc == 0 ? (int)v : 1;
	return 0;
}

int ptc_config_parse(const json_t *root, const char *file, struct ptc_config **out,
		     struct ptc_error *err)
{
	struct ptc_config *c;
	int64_t v;
	int rc;

	*out = NULL;
	if (!json_is_object(root))
		return ptc_errorf(err, "%s: must be a JSON object", file);
	if (ptc_json_known(root, config_keys, file, "", err))
		return -EINVAL;
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	rc = -EINVAL;
	if (ptc_json_int(root, "version", true, 0, INT64_MAX, &c->version, file, "", err))
		goto err_free;
	if (ptc_json_int(root, "tp", true, 1, MAX_DEGREE, &v, file, "", err))
		goto err_free;
	c->tp = (int)v;
	if (ptc_json_int(root, "pp", true, 1, MAX_DEGREE, &v, file, "", err))
		goto err_free;
	c->pp = (int)v;
	if (ptc_json_int(root, "dp", true, 1, MAX_DEGREE, &v, file, "", err))
		goto err_free;
	c->dp = (int)v;
	if ((int64_t)c->tp * c->pp * c->dp > MAX_DEGREE) {
		ptc_errorf(err, "%s: tp * pp * dp = %" PRId64 " exceeds %d ranks", file,
			   (int64_t)c->tp * c->pp * c->dp, MAX_DEGREE);
		goto err_free;
	}
	v = 0;
	if (ptc_json_int(root, "replicas", false, 0, 1, &v, file, "", err) < 0)
		goto err_free;
	c->replicas = (int)v;

	json_t *nodes = json_object_get(root, "nodes");
	if (!json_is_array(nodes) || json_array_size(nodes) == 0 ||
	    json_array_size(nodes) > MAX_DEGREE) {
		ptc_errorf(err, "%s: \"nodes\" must be a non-empty array of node ids", file);
		goto err_free;
	}
	rc = -ENOMEM;
	if (!(c->nodes = calloc(json_array_size(nodes), sizeof(char *))))
		goto err_free;
	for (size_t i = 0; i < json_array_size(nodes); i++) {
		json_t *n = json_array_get(nodes, i);
		rc = -EINVAL;
		if (!json_is_string(n) || !id_valid(json_string_value(n))) {
			ptc_errorf(err, "%s: nodes[%zu] is not a valid node id", file, i);
			goto err_free;
		}
		for (int j = 0; j < c->nnodes; j++) {
			if (strcmp(c->nodes[j], json_string_value(n)) == 0) {
				ptc_errorf(err, "%s: nodes[%zu] = \"%s\" is listed twice", file, i,
					   c->nodes[j]);
				goto err_free;
			}
		}
		rc = -ENOMEM;
		if (!(c->nodes[c->nnodes] = strdup(json_string_value(n))))
			goto err_free;
		c->nnodes++;
	}
	json_t *ds = json_object_get(root, "dataset");
	if (ds && (rc = parse_dataset(c, ds, file, err)))
		goto err_free;
	json_t *sn = json_object_get(root, "snapshot");
	if (sn && (rc = parse_snapshot(c, sn, file, err)))
		goto err_free;
	json_t *el = json_object_get(root, "elastic");
	if (el && (rc = parse_elastic(c, el, file, err)))
		goto err_free;
	if (c->has_dataset && c->dataset_global_batch < c->dp) {
		rc = ptc_errorf(err,
				"%s: dataset.global_batch = %" PRId64 " is smaller than dp = %d "
				"(every DP rank needs a record per step)",
				file, c->dataset_global_batch, c->dp);
		goto err_free;
	}
	*out = c;
	return 0;

err_free:
	ptc_config_free(c);
	return rc;
}

PTC_DEFINE_PARSE_TEXT(ptc_config_parse_text, ptc_config_parse, struct ptc_config)

json_t *ptc_config_to_json(const struct ptc_config *c)
{
	json_t *o = json_object(), *nodes = json_array();

	for (int i = 0; i < c->nnodes; i++)
		json_array_append_new(nodes, json_string(c->nodes[i]));
	json_object_set_new(o, "version", json_integer(c->version));
	json_object_set_new(o, "tp", json_integer(c->tp));
	json_object_set_new(o, "pp", json_integer(c->pp));
	json_object_set_new(o, "dp", json_integer(c->dp));
	json_object_set_new(o, "nodes", nodes);
	if (c->replicas)
		json_object_set_new(o, "replicas", json_integer(c->replicas));
	if (c->has_dataset) {
		json_t *ds = json_object();
		json_object_set_new(ds, "index", json_string(c->dataset_index));
		json_object_set_new(ds, "seed", json_integer((json_int_t)c->dataset_seed));
		json_object_set_new(ds, "global_batch", json_integer(c->dataset_global_batch));
		json_object_set_new(ds, "shuffle", json_boolean(c->dataset_shuffle));
		if (c->dataset_epochs)
			json_object_set_new(ds, "epochs", json_integer(c->dataset_epochs));
		json_object_set_new(o, "dataset", ds);
	}
	if (c->snap_dir)
		json_object_set_new(o, "snapshot",
				    json_pack("{sssIsisisIsi}", "dir", c->snap_dir, "every",
					      (json_int_t)c->snap_every, "keep", c->snap_keep,
					      "threads", c->snap_threads, "max_mib_s",
					      (json_int_t)c->snap_max_mib_s, "level",
					      c->snap_level));
	if (c->elastic) {
		json_t *el = json_pack("{sisiss}", "min_nodes", c->elastic_min, "max_nodes",
				       c->elastic_max, "policy", "auto");
		if (el && c->elastic_micro_batch != 1) /* the default left out */
			json_object_set_new(el, "micro_batch",
					    json_integer((json_int_t)c->elastic_micro_batch));
		json_object_set_new(o, "elastic", el);
	}
	return o;
}

/* ---------------------------------------------------------------- cluster */

void ptc_cluster_free(struct ptc_cluster *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->nnodes; i++) {
		free(c->nodes[i].id);
		free(c->nodes[i].addr);
	}
	free(c->nodes);
	free(c->token_file);
	free(c->job);
	free(c->etcd);
	free(c);
}

int ptc_cluster_find(const struct ptc_cluster *c, const char *id)
{
	for (int i = 0; i < c->nnodes; i++)
		if (strcmp(c->nodes[i].id, id) == 0)
			return i;
	return -1;
}

static bool same_str(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

int ptc_cluster_extends(const struct ptc_cluster *from, const struct ptc_cluster *to,
			struct ptc_error *err)
{
	if (from == to)
		return 0;
	if (!same_str(from->job, to->job) || !same_str(from->etcd, to->etcd) ||
	    !same_str(from->token_file, to->token_file))
		return ptc_errorf(err, "cluster.json: \"job\", \"etcd\" and \"token_file\" "
				       "must stay the same");
	if (to->nnodes < from->nnodes)
		return ptc_errorf(err,
				  "cluster.json: %d nodes, fewer than the job's %d (nodes "
				  "are added, never removed: a config leaves them out)",
				  to->nnodes, from->nnodes);
	for (int i = 0; i < from->nnodes; i++) {
		const struct ptc_node *a = &from->nodes[i], *b = &to->nodes[i];
		if (strcmp(a->id, b->id) != 0 || !same_str(a->addr, b->addr) ||
		    a->devices != b->devices)
			return ptc_errorf(err,
					  "cluster.json: node %d is \"%s\" (%s, %d devices) "
					  "where the job has \"%s\" (%s, %d devices): the "
					  "job's nodes come first, in order, unchanged",
					  i, b->id, b->addr ? b->addr : "no addr", b->devices,
					  a->id, a->addr ? a->addr : "no addr", a->devices);
	}
	return 0;
}

struct ptc_cluster *ptc_cluster_new_uniform(int nnodes, char *const *ids, int devices)
{
	struct ptc_cluster *c = calloc(1, sizeof(*c));

	if (!c || !(c->nodes = calloc((size_t)nnodes, sizeof(*c->nodes))))
		goto err_free;
	for (; c->nnodes < nnodes; c->nnodes++) {
		c->nodes[c->nnodes].devices = devices;
		if (!(c->nodes[c->nnodes].id = strdup(ids[c->nnodes])))
			goto err_free;
	}
	return c;

err_free:
	ptc_cluster_free(c);
	return NULL;
}

int ptc_cluster_parse(const json_t *root, const char *file, struct ptc_cluster **out,
		      struct ptc_error *err)
{
	struct ptc_cluster *c;
	int rc = -EINVAL;

	*out = NULL;
	if (!json_is_object(root))
		return ptc_errorf(err, "%s: must be a JSON object", file);
	if (ptc_json_known(root, cluster_keys, file, "", err))
		return -EINVAL;
	json_t *nodes = json_object_get(root, "nodes");
	if (!json_is_array(nodes) || json_array_size(nodes) == 0 ||
	    json_array_size(nodes) > MAX_DEGREE)
		return ptc_errorf(err, "%s: \"nodes\" must be a non-empty array", file);
	if (!(c = calloc(1, sizeof(*c))) ||
	    !(c->nodes = calloc(json_array_size(nodes), sizeof(*c->nodes)))) {
		free(c);
		return -ENOMEM;
	}
	json_t *tok = json_object_get(root, "token_file");
	if (tok && (!json_is_string(tok) || !*json_string_value(tok))) {
		ptc_errorf(err, "%s: \"token_file\" must be a non-empty path", file);
		goto err_free;
	}
	if (tok && !(c->token_file = strdup(json_string_value(tok)))) {
		rc = -ENOMEM;
		goto err_free;
	}
	json_t *job = json_object_get(root, "job"), *etcd = json_object_get(root, "etcd");
	if (job && (!json_is_string(job) || !id_valid(json_string_value(job)))) {
		ptc_errorf(err, "%s: \"job\" must be a job name of [A-Za-z0-9_.-]", file);
		goto err_free;
	}
	char *endpoints = NULL;
	int erc = etcd ? etcd_endpoints(etcd, &endpoints, file, err) : 0;
	if (erc) {
		rc = erc;
		goto err_free;
	}
	if (etcd && !job) {
		free(endpoints);
		ptc_errorf(err, "%s: \"etcd\" needs a \"job\" (its keys live under /mlfs/<job>/)",
			   file);
		goto err_free;
	}
	c->etcd = endpoints;
	if (job && !(c->job = strdup(json_string_value(job)))) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (size_t i = 0; i < json_array_size(nodes); i++) {
		json_t *n = json_array_get(nodes, i);
		struct ptc_node *nd = &c->nodes[i];
		char where[32];
		int64_t dev;

		snprintf(where, sizeof(where), "nodes[%zu]", i);
		if (!json_is_object(n)) {
			ptc_errorf(err, "%s: %s must be an object", file, where);
			goto err_free;
		}
		if (ptc_json_known(n, node_keys, file, where, err))
			goto err_free;
		json_t *id = json_object_get(n, "id"), *addr = json_object_get(n, "addr");
		if (!json_is_string(id) || !id_valid(json_string_value(id))) {
			ptc_errorf(err, "%s: %s.id must be a node id of [A-Za-z0-9_.-]", file,
				   where);
			goto err_free;
		}
		if (ptc_cluster_find(c, json_string_value(id)) >= 0) {
			ptc_errorf(err, "%s: %s.id = \"%s\" is listed twice", file, where,
				   json_string_value(id));
			goto err_free;
		}
		if (addr && (!json_is_string(addr) || !strchr(json_string_value(addr), ':'))) {
			ptc_errorf(err, "%s: %s.addr must be \"host:port\"", file, where);
			goto err_free;
		}
		if (ptc_json_int(n, "devices", true, 1, 4096, &dev, file, where, err))
			goto err_free;
		nd->devices = (int)dev;
		rc = -ENOMEM;
		if (!(nd->id = strdup(json_string_value(id))) ||
		    (addr && !(nd->addr = strdup(json_string_value(addr))))) {
			c->nnodes++;
			goto err_free;
		}
		c->nnodes++;
		rc = -EINVAL;
	}
	*out = c;
	return 0;

err_free:
	ptc_cluster_free(c);
	return rc;
}

PTC_DEFINE_PARSE_TEXT(ptc_cluster_parse_text, ptc_cluster_parse, struct ptc_cluster)
