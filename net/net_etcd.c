/*
 * net_etcd.c - an etcd v3 client over its JSON gateway (POST /v3/...),
 * on top of net_http: keys and values, one-transaction compare-and-swap,
 * leases (net_etcd_watch.c follows changes as they happen).
 *
 * DESIGN
 * mlfs decides nothing by itself that needs consensus: which config is
 * current, who is alive and whether an attempt committed are etcd's
 * answers (DESIGN section 7). This file is the whole client: every call is
 * one POST of a small JSON body built with jansson, keys and values base64
 * as the gateway wants them, the reply parsed and bounded (NET_ETCD_MAX_REPLY).
 * Reads and puts of a known value are idempotent and retried by net_http;
 * a transaction is not (it could have applied), and is retried only when it
 * cannot have reached etcd. Changes are followed by a watch, a stream on
 * a transfer of its own (net_etcd_watch.c), not by polling.
 *
 * Threads: any number at once on one client (net_http's rule).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "net/net.h"
#include "net/net_i.h"

/* ---------------------------------------------------------------- base64 */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* A new NUL-terminated base64 text of @n bytes at @p, or NULL. */
char *net_b64_encode(const void *p, size_t n)
{
	const uint8_t *s = p;
	char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
			     (i + 2 < n ? s[i + 2] : 0);
		*o++ = B64[v >> 18 & 63];
		*o++ = B64[v >> 12 & 63];
		*o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
		*o++ = i + 2 < n ? B64[v & 63] : '=';
	}
	*o = '\0';
	return out;
}

static int b64_val(char c)
{
	const char *p = c ? strchr(B64, c) : NULL;
	return p ? (int)(p - B64) : -1;
}

/* Decodes @s into a new buffer (NUL after its *@n bytes): 0, -EINVAL, -ENOMEM. */
int net_b64_decode(const char *s, char **out, size_t *n)
{
	size_t len = strlen(s);
	char *o = malloc(len / 4 * 3 + 1);
	size_t k = 0;
	if (!o)
		return -ENOMEM;
	if (len % 4) {
		free(o);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i += 4) {
		int a = b64_val(s[i]), b = b64_val(s[i + 1]);
		int c = s[i + 2] == '=' ? 0 : b64_val(s[i + 2]);
		int d = s[i + 3] == '=' ? 0 : b64_val(s[i + 3]);
		bool pad2 = s[i + 2] == '=', pad3 = s[i + 3] == '=';
		if (a < 0 || b < 0 || c < 0 || d < 0 || (pad2 && !pad3) ||
		    ((pad2 || pad3) && i + 4 < len)) {
			free(o);
			return -EINVAL;
		}
		uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
		o[k++] = (char)(v >> 16);
		if (!pad2)
			o[k++] = (char)(v >> 8 & 255);
		if (!pad3)
			o[k++] = (char)(v & 255);
	}
	o[k] = '\0';
	*out = o;
	*n = k;
	return 0;
}

/* ---------------------------------------------------------------- calls */

int net_etcd_new(const char *endpoint, const struct net_http_opts *o, struct net_etcd **out,
		 struct ptc_error *err)
{
	struct net_etcd *e;
	size_t n = strlen(endpoint);
	int rc = net_url_check(endpoint, err);

	*out = NULL;
	if (rc)
		return rc;
	while (n && endpoint[n - 1] == '/')
		n--;
	if (n >= sizeof(e->base))
		return ptc_error_set(err, -EINVAL, "%s: too long", endpoint);
	if (!(e = calloc(1, sizeof(*e))))
		return -ENOMEM;
	memcpy(e->base, endpoint, n);
	if ((rc = net_http_new(o, &e->http, err))) {
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

void net_etcd_free(struct net_etcd *e)
{
	if (!e)
		return;
	net_http_free(e->http);
	free(e);
}

/* POSTs @req (taken over) to @path; the reply parsed into *@reply. */
static int call(struct net_etcd *e, const char *path, json_t *req, bool idempotent,
		const struct net_http_call *budget, json_t **reply, struct ptc_error *err)
{
	char url[NET_MAX_URL + 64];
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	uint8_t *data = NULL;
	size_t len = 0;
	int rc;

	json_decref(req);
	*reply = NULL;
	if (!body)
		return -ENOMEM;
	snprintf(url, sizeof(url), "%s%s", e->base, path);
	struct net_http_call c = budget ? *budget : (struct net_http_call){0};
	c.idempotent = idempotent;
	rc = net_http_post_json(e->http, url, body, strlen(body), NET_ETCD_MAX_REPLY, &data, &len,
				&c, err);
	free(body);
	if (rc)
		return rc;
	json_error_t je;
	*reply = json_loadb((const char *)data, len, 0, &je);
	free(data);
	if (!*reply || !json_is_object(*reply)) {
		json_decref(*reply);
		*reply = NULL;
		return ptc_error_set(err, -EIO, "%s: the reply is not a JSON object", url);
	}
	return 0;
}

/* An int64 the gateway sends as a JSON string (or a number); @def if absent. */
int64_t net_etcd_jint(const json_t *o, const char *k, int64_t def)
{
	const json_t *v = json_object_get(o, k);
	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_string(v))
		return strtoll(json_string_value(v), NULL, 10);
	return def;
}

/* Adds "key" (and "value") base64 to @o: 0 or -ENOMEM. */
int net_etcd_set_b64(json_t *o, const char *field, const void *p, size_t n)
{
	char *s = net_b64_encode(p, n);
	if (!s || json_object_set_new(o, field, json_string(s))) {
		free(s);
		return -ENOMEM;
	}
	free(s);
	return 0;
}

int net_etcd_prefix_end(const char *prefix, char *end, size_t *n)
{
	size_t k = strlen(prefix);
	memcpy(end, prefix, k);
	while (k && (uint8_t)end[k - 1] == 0xff)
		k--;
	if (k == 0) { /* every key */
		end[0] = '\0';
		*n = 1;
	} else {
		end[k - 1]++;
		*n = k;
	}
	return 0;
}

/* The end of the range of keys starting with @prefix ("" when none). */
int net_etcd_set_prefix_end(json_t *o, const char *prefix)
{
	char *end = malloc(strlen(prefix) + 1);
	size_t n;
	int rc = end ? net_etcd_prefix_end(prefix, end, &n) : -ENOMEM;
	if (rc == 0)
		rc = net_etcd_set_b64(o, "range_end", end, n);
	free(end);
	return rc;
}

void net_etcd_kvs_free(struct net_etcd_kv *kvs, size_t n)
{
	for (size_t i = 0; kvs && i < n; i++) {
		free(kvs[i].key);
		free(kvs[i].value);
	}
	free(kvs);
}

int net_etcd_parse_kv(const json_t *kv, struct net_etcd_kv *out)
{
	const char *k = json_string_value(json_object_get(kv, "key"));
	const char *v = json_string_value(json_object_get(kv, "value"));
	size_t kn;
	int rc = k ? net_b64_decode(k, &out->key, &kn) : -EINVAL;

	if (rc == 0 && (rc = net_b64_decode(v ? v : "", &out->value, &out->len))) {
		free(out->key);
		out->key = NULL;
	}
	if (rc)
		return rc;
	out->mod_revision = net_etcd_jint(kv, "mod_revision", 0);
	out->create_revision = net_etcd_jint(kv, "create_revision", 0);
	out->version = net_etcd_jint(kv, "version", 0);
	out->lease = net_etcd_jint(kv, "lease", 0);
	return 0;
}

/* The "kvs" of a range reply into a new array. */
static int parse_kvs(const json_t *reply, struct net_etcd_kv **out, size_t *n)
{
	const json_t *kvs = json_object_get(reply, "kvs");
	size_t cnt = json_is_array(kvs) ? json_array_size(kvs) : 0;
	struct net_etcd_kv *a = calloc(cnt ? cnt : 1, sizeof(*a));

	*out = NULL;
	*n = 0;
	if (!a)
		return -ENOMEM;
	for (size_t i = 0; i < cnt; i++) {
		int rc = net_etcd_parse_kv(json_array_get(kvs, i), &a[i]);
		if (rc) {
			net_etcd_kvs_free(a, cnt);
			return rc;
		}
	}
	*out = a;
	*n = cnt;
	return 0;
}

int net_etcd_range(struct net_etcd *e, const char *key, bool prefix, struct net_etcd_kv **kvs,
		   size_t *n, int64_t *revision, const struct net_http_call *budget,
		   struct ptc_error *err)
{
	json_t *req = json_object(), *reply;
	int rc = req ? net_etcd_set_b64(req, "key", key, strlen(key)) : -ENOMEM;

	*kvs = NULL;
	*n = 0;
	if (rc == 0 && prefix)
		rc = net_etcd_set_prefix_end(req, key);
	if (rc) {
		json_decref(req);
		return rc;
	}
	if ((rc = call(e, "/v3/kv/range", req, true, budget, &reply, err)))
		return rc;
	if (revision)
		*revision = net_etcd_jint(json_object_get(reply, "header"), "revision", 0);
	rc = parse_kvs(reply, kvs, n);
	json_decref(reply);
	return rc;
}

int net_etcd_get(struct net_etcd *e, const char *key, struct net_etcd_kv *kv,
		 const struct net_http_call *budget, struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int rc = net_etcd_range(e, key, false, &kvs, &n, NULL, budget, err);

	memset(kv, 0, sizeof(*kv));
	if (rc)
		return rc;
	if (n == 0) {
		net_etcd_kvs_free(kvs, n);
		return -ENOENT;
	}
	*kv = kvs[0];
	kvs[0] = (struct net_etcd_kv){0};
	net_etcd_kvs_free(kvs, n);
	return 0;
}

/* A request_put or request_delete_range of @op. */
static json_t *op_json(const struct net_etcd_op *op)
{
	json_t *r = json_object(), *w = json_object();
	int rc = r && w ? net_etcd_set_b64(r, "key", op->key, strlen(op->key)) : -ENOMEM;
	if (rc == 0 && op->kind == NET_ETCD_PUT) {
		rc = net_etcd_set_b64(r, "value", op->value ? op->value : "", op->len);
		if (rc == 0 && op->lease)
			rc = json_object_set_new(r, "lease", json_integer(op->lease)) ? -ENOMEM : 0;
	} else if (rc == 0 && op->prefix) {
		rc = net_etcd_set_prefix_end(r, op->key);
	}
	if (rc == 0 &&
	    json_object_set_new(
		w, op->kind == NET_ETCD_PUT ? "request_put" : "request_delete_range", r) == 0)
		return w;
	json_decref(w);
	if (rc)
		json_decref(r);
	return NULL;
}

static json_t *cmp_json(const struct net_etcd_cmp *c)
{
	static const char *const targets[] = {"VERSION", "CREATE", "MOD", "VALUE"};
	static const char *const fields[] = {"version", "create_revision", "mod_revision", "value"};
	static const char *const results[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
	json_t *o = json_object();
	int rc = o ? net_etcd_set_b64(o, "key", c->key, strlen(c->key)) : -ENOMEM;

	if (rc == 0 && (json_object_set_new(o, "target", json_string(targets[c->target])) ||
			json_object_set_new(o, "result", json_string(results[c->result]))))
		rc = -ENOMEM;
	if (rc == 0 && c->target == NET_ETCD_VALUE)
		rc = net_etcd_set_b64(o, "value", c->value ? c->value : "", c->len);
	else if (rc == 0 && json_object_set_new(o, fields[c->target], json_integer(c->num)))
		rc = -ENOMEM;
	if (rc) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int net_etcd_txn(struct net_etcd *e, const struct net_etcd_cmp *cmps, size_t ncmp,
		 const struct net_etcd_op *then, size_t nthen, const struct net_etcd_op *otherwise,
		 size_t notherwise, bool *succeeded, int64_t *revision,
		 const struct net_http_call *budget, struct ptc_error *err)
{
	json_t *req = json_object(), *c = json_array(), *s = json_array(), *f = json_array(),
	       *reply;
	int rc = req && c && s && f ? 0 : -ENOMEM;

	for (size_t i = 0; rc == 0 && i < ncmp; i++)
		rc = json_array_append_new(c, cmp_json(&cmps[i])) ? -ENOMEM : 0;
	for (size_t i = 0; rc == 0 && i < nthen; i++)
		rc = json_array_append_new(s, op_json(&then[i])) ? -ENOMEM : 0;
	for (size_t i = 0; rc == 0 && i < notherwise; i++)
		rc = json_array_append_new(f, op_json(&otherwise[i])) ? -ENOMEM : 0;
	if (rc == 0 && (json_object_set(req, "compare", c) || json_object_set(req, "success", s) ||
			json_object_set(req, "failure", f)))
		rc = -ENOMEM;
	json_decref(c);
	json_decref(s);
	json_decref(f);
	if (rc) {
		json_decref(req);
		return rc;
	}
	if ((rc = call(e, "/v3/kv/txn", req, false, budget, &reply, err)))
		return rc;
	*succeeded = json_is_true(json_object_get(reply, "succeeded"));
	if (revision)
		*revision = net_etcd_jint(json_object_get(reply, "header"), "revision", 0);
	json_decref(reply);
	return 0;
}

int net_etcd_put(struct net_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
		 const struct net_http_call *budget, struct ptc_error *err)
{
	struct net_etcd_op op = {NET_ETCD_PUT, key, value, len, lease, false};
	json_t *w = op_json(&op), *reply;
	json_t *req = json_incref(json_object_get(w, "request_put"));
	int rc;

	json_decref(w);
	if (!req)
		return -ENOMEM;
	if ((rc = call(e, "/v3/kv/put", req, true, budget, &reply, err)))
		return rc;
	json_decref(reply);
	return 0;
}

int net_etcd_delete(struct net_etcd *e, const char *key, bool prefix, int64_t *deleted,
		    const struct net_http_call *budget, struct ptc_error *err)
{
	struct net_etcd_op op = {NET_ETCD_DELETE, key, NULL, 0, 0, prefix};
	json_t *w = op_json(&op), *reply;
	json_t *req = json_incref(json_object_get(w, "request_delete_range"));
	int rc;

	json_decref(w);
	if (!req)
		return -ENOMEM;
	if ((rc = call(e, "/v3/kv/deleterange", req, true, budget, &reply, err)))
		return rc;
	if (deleted)
		*deleted = net_etcd_jint(reply, "deleted", 0);
	json_decref(reply);
	return 0;
}

/* ---------------------------------------------------------------- leases */

int net_etcd_lease_grant(struct net_etcd *e, int ttl_s, int64_t *id,
			 const struct net_http_call *budget, struct ptc_error *err)
{
	json_t *reply;
	int rc = call(e, "/v3/lease/grant", json_pack("{sI}", "TTL", (json_int_t)ttl_s), false,
		      budget, &reply, err);
	if (rc)
		return rc;
	*id = net_etcd_jint(reply, "ID", 0);
	json_decref(reply);
	if (*id == 0)
		return ptc_error_set(err, -EIO, "%s/v3/lease/grant: no lease in the reply",
				     e->base);
	return 0;
}

int net_etcd_lease_keepalive(struct net_etcd *e, int64_t id, int64_t *ttl_s,
			     const struct net_http_call *budget, struct ptc_error *err)
{
	json_t *reply;
	int rc = call(e, "/v3/lease/keepalive", json_pack("{sI}", "ID", (json_int_t)id), true,
		      budget, &reply, err);
	if (rc)
		return rc;
	/* The gateway wraps a stream's first message in "result". */
	const json_t *r = json_object_get(reply, "result");
	*ttl_s = net_etcd_jint(r ? r : reply, "TTL", 0);
	json_decref(reply);
	if (*ttl_s <= 0)
		return ptc_error_set(err, -ENOENT, "lease %" PRId64 " expired", id);
	return 0;
}

int net_etcd_lease_revoke(struct net_etcd *e, int64_t id, const struct net_http_call *budget,
			  struct ptc_error *err)
{
	json_t *reply;
	int rc = call(e, "/v3/lease/revoke", json_pack("{sI}", "ID", (json_int_t)id), true, budget,
		      &reply, err);
	json_decref(reply);
	return rc;
}
