/*
 * mlfs_jobkeys.c - the job's keys in etcd (the table in mlfs_cluster.c's
 * DESIGN block): their names, and the one read of them all that each round
 * of the control thread, and each proposal, decides from; the nodes'
 * entries, under a prefix of their own, with it when they are read.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

void mlfs_jobkeys_name(const struct mlfs_cluster *c, char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	size_t n = (size_t)snprintf(buf, cap, "%s", c->prefix);
	va_start(ap, fmt);
	vsnprintf(buf + n, cap - n, fmt, ap);
	va_end(ap);
}

/* The version of a config text, or -1; whether it has an "elastic"
 * section into *@elastic. */
static int64_t config_version(const char *text, size_t len, bool *elastic)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	int64_t v = json_is_integer(json_object_get(j, "version"))
			? json_integer_value(json_object_get(j, "version"))
			: -1;
	*elastic = json_is_object(json_object_get(j, "elastic"));
	json_decref(j);
	return v;
}

void mlfs_jobkeys_free(struct mlfs_jobkeys *k)
{
	if (k->kvs_block)
		free(k->kvs);
	else
		net_etcd_kvs_free(k->kvs, k->n);
	net_etcd_kvs_free(k->votes, k->nvotes);
	json_decref(k->nodes);
	json_decref(k->attempt_j);
	json_decref(k->restore_j);
	json_decref(k->import_j);
	json_decref(k->draining);
	memset(k, 0, sizeof(*k));
}

/* Node entry @kv (<nprefix><@id>) parsed: a new reference, shared with the
 * cache of @c (read-only); an unreadable entry is {}. */
static json_t *entry_parsed(struct mlfs_cluster *c, const char *id, const struct net_etcd_kv *kv)
{
	json_t *j = NULL;
	pthread_mutex_lock(&c->parsed_lock);
	if (!c->parsed)
		c->parsed = json_object();
	json_t *hit = json_object_get(c->parsed, id);
	if (hit && json_integer_value(json_array_get(hit, 0)) == kv->mod_revision)
		j = json_incref(json_array_get(hit, 1));
	pthread_mutex_unlock(&c->parsed_lock);
	if (j)
		return j;
	if (!(j = json_loadb(kv->value, kv->len, 0, NULL)) || !json_is_object(j)) {
		json_decref(j);
		j = json_object();
	}
	pthread_mutex_lock(&c->parsed_lock);
	/* ids of nodes gone stay until the cache is four times the cluster */
	if (json_object_size(c->parsed) > 4 * (size_t)mlfs_store_cluster(c->st)->nnodes)
		json_object_clear(c->parsed);
	json_object_set_new(c->parsed, id, json_pack("[IO]", (json_int_t)kv->mod_revision, j));
	pthread_mutex_unlock(&c->parsed_lock);
	return j;
}

/* Whether @text (a cached copy, NUL-terminated) is @kv's value. */
static bool same_text(const char *text, const struct net_etcd_kv *kv)
{
	return text && strlen(text) == kv->len && memcmp(text, kv->value, kv->len) == 0;
}

/* The attempt @kv parsed, its participants unpacked (mlfs_ids_pack's
 * ranges, as the coordinator put them): a new reference, shared with the
 * cache of @c (read-only), or NULL when it is no JSON. */
static json_t *attempt_parsed(struct mlfs_cluster *c, const struct net_etcd_kv *kv)
{
	json_t *j = NULL;
	pthread_mutex_lock(&c->parsed_lock);
	if (c->parsed_att && same_text(c->parsed_att_text, kv))
		j = json_incref(c->parsed_att);
	pthread_mutex_unlock(&c->parsed_lock);
	if (j)
		return j;
	j = json_loadb(kv->value, kv->len, 0, NULL);
	const char *packed = json_string_value(json_object_get(j, "participants"));
	bool whole = true;
	if (packed) {
		struct ptc_error err;
		json_t *ids = mlfs_ids_unpack(packed, mlfs_store_cluster(c->st), &err);
		if (!ids) /* (a node that joined, not in this node's cluster yet:
			   * not cached, the next round unpacks it again) */
			mlfs_log(MLFS_LOG_WARNING, "cluster: etcd's attempt: %s", err.text);
		whole = ids != NULL;
		json_object_set_new(j, "participants", ids ? ids : json_array());
	}
	char *text = j && whole ? strndup(kv->value, kv->len) : NULL;
	/* the config it commits, as config_parsed will want it */
	const json_t *cfg = json_object_get(j, "config"), *to = json_object_get(j, "to"),
		     *el = json_object_get(j, "elastic");
	char *next = text && json_is_string(cfg) && json_is_integer(to) && json_is_boolean(el)
			 ? strdup(json_string_value(cfg))
			 : NULL;
	if (text) {
		pthread_mutex_lock(&c->parsed_lock);
		json_decref(c->parsed_att);
		free(c->parsed_att_text);
		c->parsed_att = json_incref(j);
		c->parsed_att_text = text;
		if (next) {
			free(c->parsed_next_text);
			c->parsed_next_text = next;
			c->parsed_next_version = json_integer_value(to);
			c->parsed_next_elastic = json_is_true(el);
		}
		pthread_mutex_unlock(&c->parsed_lock);
	}
	return j;
}

/* The version of the config @kv (-1: none in it), and whether it is
 * elastic into *@elastic, parsed once per text; or not at all when it is
 * the config of the attempt this node saw, which says both (its "to" and
 * "elastic": the coordinator parsed the text), the usual case at a
 * commit. */
static int64_t config_parsed(struct mlfs_cluster *c, const struct net_etcd_kv *kv, bool *elastic)
{
	pthread_mutex_lock(&c->parsed_lock);
	if (!same_text(c->parsed_cfg_text, kv) && same_text(c->parsed_next_text, kv)) {
		free(c->parsed_cfg_text); /* the attempt's, committed */
		c->parsed_cfg_text = c->parsed_next_text;
		c->parsed_cfg_version = c->parsed_next_version;
		c->parsed_cfg_elastic = c->parsed_next_elastic;
		c->parsed_next_text = NULL;
	}
	bool hit = same_text(c->parsed_cfg_text, kv);
	int64_t v = c->parsed_cfg_version;
	*elastic = c->parsed_cfg_elastic;
	pthread_mutex_unlock(&c->parsed_lock);
	if (hit)
		return v;
	v = config_version(kv->value, kv->len, elastic);
	char *text = strndup(kv->value, kv->len);
	if (text) {
		pthread_mutex_lock(&c->parsed_lock);
		free(c->parsed_cfg_text);
		c->parsed_cfg_text = text;
		c->parsed_cfg_version = v;
		c->parsed_cfg_elastic = *elastic;
		pthread_mutex_unlock(&c->parsed_lock);
	}
	return v;
}

int64_t mlfs_released_parse(const char *value, size_t len, const char *me, bool *mine)
{
	if (mine)
		*mine = false;
	if (len == 0 || value[0] != '{') {
		char v[32];
		snprintf(v, sizeof(v), "%.*s", (int)(len < sizeof(v) ? len : sizeof(v) - 1), value);
		return strtoll(v, NULL, 10);
	}
	json_t *j = json_loadb(value, len, 0, NULL), *id;
	size_t i;
	int64_t version = json_integer_value(json_object_get(j, "version"));
	json_array_foreach(json_object_get(j, "entries"), i, id)
	{
		if (mine && me && json_is_string(id) && strcmp(json_string_value(id), me) == 0)
			*mine = true;
	}
	json_decref(j);
	return version;
}

/* The "released" key @kv into @k (mlfs_released_parse), parsed once per
 * revision. */
static void released_parsed(struct mlfs_cluster *c, const struct net_etcd_kv *kv,
			    struct mlfs_jobkeys *k)
{
	k->released_rev = kv->mod_revision;
	pthread_mutex_lock(&c->parsed_lock);
	bool hit = c->parsed_rel_rev == kv->mod_revision;
	k->released = c->parsed_rel_version;
	k->released_mine = c->parsed_rel_mine;
	pthread_mutex_unlock(&c->parsed_lock);
	if (hit)
		return;
	k->released = mlfs_released_parse(kv->value, kv->len, c->me, &k->released_mine);
	pthread_mutex_lock(&c->parsed_lock);
	c->parsed_rel_rev = kv->mod_revision;
	c->parsed_rel_version = k->released;
	c->parsed_rel_mine = k->released_mine;
	pthread_mutex_unlock(&c->parsed_lock);
}

/* Sorts the job's keys @kvs (@n of them, taken over) of a read at
 * @revision into @k. */
static void parse(struct mlfs_cluster *c, struct net_etcd_kv *kvs, size_t n, int64_t revision,
		  struct mlfs_jobkeys *k)
{
	size_t plen = strlen(c->prefix);

	memset(k, 0, sizeof(*k));
	k->kvs = kvs;
	k->n = n;
	k->revision = revision;
	k->config_id = "";
	k->nodes = json_object();
	k->draining = json_object();
	for (size_t i = 0; i < k->n; i++) {
		const struct net_etcd_kv *kv = &k->kvs[i];
		const char *name = kv->key + plen;
		if (strcmp(name, "schema") == 0)
			k->schema = kv;
		else if (strcmp(name, "cluster") == 0)
			k->cluster = kv;
		else if (strcmp(name, "config") == 0)
			k->config = kv, k->config_mod = kv->mod_revision;
		else if (strcmp(name, "config_id") == 0)
			k->config_id = kv->value;
		else if (strcmp(name, "attempt") == 0)
			k->attempt = kv;
		else if (strcmp(name, "controller") == 0)
			k->controller = kv;
		else if (strncmp(name, "drain/", 6) == 0)
			json_object_set_new(k->draining, name + 6, json_true());
		else if (strcmp(name, "released") == 0)
			released_parsed(c, kv, k);
		else if (strcmp(name, "restore") == 0)
			k->restore_j = json_loadb(kv->value, kv->len, 0, NULL);
		else if (strcmp(name, "import") == 0)
			k->import_j = json_loadb(kv->value, kv->len, 0, NULL);
	}
	if (k->attempt)
		k->attempt_j = attempt_parsed(c, k->attempt);
	k->committed = k->config ? config_parsed(c, k->config, &k->config_elastic) : 0;
}

/* {id: entry} of the nodes' keys @kvs (@n; entries and saved marks). */
static json_t *parse_nodes(struct mlfs_cluster *c, const struct net_etcd_kv *kvs, size_t n)
{
	size_t plen = strlen(c->nprefix);
	json_t *nodes = json_object();

	for (size_t i = 0; i < n && nodes; i++) {
		const char *id = kvs[i].key + plen;
		if (!strchr(id, '/')) /* not saved/<id> */
			json_object_set_new(nodes, id, entry_parsed(c, id, &kvs[i]));
	}
	return nodes;
}

json_t *mlfs_jobkeys_read_nodes(struct mlfs_cluster *c, struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;

	if (net_etcd_range(c->etcd, c->nprefix, true, &kvs, &n, NULL, NULL, err))
		return NULL;
	json_t *nodes = parse_nodes(c, kvs, n);
	net_etcd_kvs_free(kvs, n);
	if (!nodes)
		ptc_error_set(err, -ENOMEM, "out of memory");
	return nodes;
}

int mlfs_jobkeys_read(struct mlfs_cluster *c, struct mlfs_jobkeys *k, struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev = 0;
	int rc = net_etcd_range(c->etcd, c->prefix, true, &kvs, &n, &rev, NULL, err);
	json_t *nodes = rc ? NULL : mlfs_jobkeys_read_nodes(c, err);

	memset(k, 0, sizeof(*k));
	if (rc == 0 && !nodes) {
		net_etcd_kvs_free(kvs, n);
		return -EIO;
	}
	if (rc == 0) {
		parse(c, kvs, n, rev, k);
		json_decref(k->nodes);
		k->nodes = nodes;
		k->nodes_known = true;
	}
	return rc;
}

json_t *mlfs_jobkeys_mirrored_nodes(struct mlfs_cluster *c)
{
	struct net_etcd_kv *kvs;
	size_t n;

	if (mlfs_mirror_copy(&c->peers, &kvs, &n, &(int64_t){0}, NULL)) /* not followed */
		return NULL;
	json_t *nodes = parse_nodes(c, kvs, n);
	free(kvs);
	return nodes;
}

int mlfs_jobkeys_mirrored(struct mlfs_cluster *c, struct mlfs_jobkeys *k, struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev = 0;
	int rc = mlfs_mirror_copy(&c->mirror, &kvs, &n, &rev, err);

	memset(k, 0, sizeof(*k));
	if (rc)
		return rc;
	parse(c, kvs, n, rev, k);
	k->kvs_block = true;
	json_t *nodes = mlfs_jobkeys_mirrored_nodes(c); /* when this node follows them */
	if (nodes) {
		json_decref(k->nodes);
		k->nodes = nodes;
		k->nodes_known = true;
	}
	return 0;
}
