/*
 * net_etcd.c - an etcd v3 client over its gRPC API, on top of net_http:
 * keys and values, one-transaction compare-and-swap, leases
 * (net_etcd_watch.c follows changes as they happen).
 *
 * DESIGN
 * mlfs decides nothing by itself that needs consensus: which config is
 * current, who is alive and whether an attempt committed are etcd's
 * answers (DESIGN section 7). This file is the whole client: every call is
 * one unary gRPC call (net_http_post_grpc: HTTP/2, a protobuf message
 * written and its reply read by net_pb.c), the reply bounded
 * (NET_ETCD_MAX_REPLY). Reads and puts of a known value are idempotent and
 * retried by net_http; a transaction is not (it could have applied), and
 * is retried only when it cannot have reached etcd. Changes are followed
 * by a watch, a stream on a transfer of its own (net_etcd_watch.c), not by
 * polling.
 *
 * Why gRPC and not etcd's JSON gateway (POST /v3/kv/..., which this file
 * used first): the gateway is a gRPC client inside etcd that turns every
 * request and reply into JSON by reflection; for the small requests of a
 * control plane that was most of etcd's CPU per request (BENCHMARKS.md,
 * thirteenth session).
 *
 * Members: the client knows every member of the etcd cluster it was given
 * (cluster.json's "etcd"). Calls go to the current one; a call that fails
 * as another member might not goes to the next at once (call()), and the
 * member that answers becomes the current one, where the next calls and
 * watches go (net_etcd_watch.c ends a watch whose client moved on). A
 * transaction moves on only when it cannot have reached the member it
 * was sent to. With one member nothing changes: net_http retries it.
 *
 * Threads: any number at once on one client (net_http's rule); the
 * current member is an atomic.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/net.h"
#include "net/net_i.h"

/* ---------------------------------------------------------------- calls */

/* The member calls go to first: "http://host:port". */
static const char *base(struct net_etcd *e)
{
	return e->ep[atomic_load(&e->cur) % e->nep];
}

int net_etcd_new(const char *endpoint, const struct net_http_opts *o, struct net_etcd **out,
		 struct ptc_error *err)
{
	struct net_etcd *e = calloc(1, sizeof(*e));
	int rc = e && (e->ep = calloc(PTC_ETCD_MAX, sizeof(char *))) ? 0 : -ENOMEM;

	*out = NULL;
	for (const char *p = endpoint; rc == 0;) { /* "u1" or "u1,u2,..." */
		size_t n = strcspn(p, ",");
		if (e->nep == PTC_ETCD_MAX) {
			rc = ptc_error_set(err, -EINVAL, "%s: more than %d etcd members", endpoint,
					   PTC_ETCD_MAX);
		} else if (!(e->ep[e->nep] = strndup(p, n))) {
			rc = -ENOMEM;
		} else if ((rc = net_url_check(e->ep[e->nep++], err)) == 0) {
			char *m = e->ep[e->nep - 1];
			size_t len = n;
			while (len && m[len - 1] == '/')
				m[--len] = '\0';
			if (len >= NET_MAX_URL)
				rc = ptc_error_set(err, -EINVAL, "%.64s...: too long", m);
		}
		if (!p[n])
			break;
		p += n + 1;
	}
	/* gRPC goes to etcd itself: an HTTP proxy from the environment
	 * would take the h2c stream for a plain HTTP request */
	struct net_http_opts ho = o ? *o : (struct net_http_opts){0};
	ho.direct = true;
	if (rc == 0) {
		e->retries = ho.retries < 0 ? NET_DEF_RETRIES : ho.retries;
		e->backoff_ms = ho.backoff_ms > 0 ? ho.backoff_ms : NET_DEF_BACKOFF;
		e->max_backoff_ms = ho.max_backoff_ms > 0 ? ho.max_backoff_ms : NET_DEF_MAX_BACKOFF;
		e->timeout_ms = ho.timeout_ms > 0 ? ho.timeout_ms : NET_DEF_TIMEOUT;
		e->deadline_ms = ho.deadline_ms > 0 ? ho.deadline_ms : NET_DEF_DEADLINE;
		if (e->nep > 1) /* another member at once, not the same one again */
			ho.retries = 0;
		rc = net_http_new(&ho, &e->http, err);
	}
	if (rc) {
		if (rc == -ENOMEM)
			ptc_error_set(err, rc, "etcd client: out of memory");
		net_etcd_free(e);
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
	for (int i = 0; e->ep && i < e->nep; i++)
		free(e->ep[i]);
	free(e->ep);
	free(e);
}

void net_etcd_member_failed(struct net_etcd *e, int k)
{
	if (e->nep > 1) /* unless a call moved on meanwhile */
		atomic_compare_exchange_strong(&e->cur, &k, (k + 1) % e->nep);
}

int net_etcd_members(struct net_etcd *e, const char **current)
{
	if (current)
		*current = base(e);
	return e->nep;
}

/* Calls @method ("/etcdserverpb.KV/Range") with the message @req (freed
 * here); its reply message into *@reply (@n bytes; the caller's). With
 * several members: the current one first; after a failure another member
 * might not meet (net_http_call.retryable), the next at once, and after a
 * round of every member a backoff, until e->retries more rounds are spent
 * or the call's deadline comes; the member that answered becomes the
 * current one, unless another call moved it meanwhile. */
static int call(struct net_etcd *e, const char *method, struct net_pb_buf *req, bool idempotent,
		const struct net_http_call *budget, uint8_t **reply, size_t *n,
		struct ptc_error *err)
{
	char url[NET_MAX_URL + 64];
	int rc = req->err, first = atomic_load(&e->cur), tried = 0;
	bool again = false;

	*reply = NULL;
	*n = 0;
	if (rc) {
		net_pb_free(req);
		return ptc_error_set(err, rc, "%s%s: out of memory", e->ep[first], method);
	}
	struct net_http_call c = budget ? *budget : (struct net_http_call){0};
	c.idempotent = idempotent;
	c.retryable = &again;
	if (e->nep > 1 && c.attempt_ms <= 0) /* then the next member */
		c.attempt_ms = e->timeout_ms;
	if (!c.start_ns) /* one deadline for every member */
		c.start_ns = net_now_ns();
	int64_t delay = e->backoff_ms;
	int deadline_ms = c.deadline_ms > 0 ? c.deadline_ms : e->deadline_ms;
	for (int t = 0;; t++) {
		int k = (first + t) % e->nep;
		snprintf(url, sizeof(url), "%s%s", e->ep[k], method);
		again = false;
		rc = net_http_post_grpc(e->http, url, req->p, req->n, NET_ETCD_MAX_REPLY, reply, n,
					&c, err);
		tried++;
		if (rc == 0) {
			if (k != first) /* the next calls start there */
				atomic_compare_exchange_strong(&e->cur, &first, k);
			break;
		}
		if (e->nep == 1 || !again || t + 1 >= (e->retries + 1) * e->nep)
			break;
		if ((t + 1) % e->nep == 0) { /* every member failed once more */
			int64_t left_ms =
			    (c.start_ns + (int64_t)deadline_ms * 1000000 - net_now_ns()) / 1000000;
			if (left_ms <= delay || (c.stop && atomic_load(c.stop)))
				break; /* the last member's error says why */
			net_sleep_ms(delay);
			delay = delay * 2 > e->max_backoff_ms ? e->max_backoff_ms : delay * 2;
		}
	}
	net_pb_free(req);
	if (rc && tried > 1 && err) {
		char last[sizeof(err->text)];
		snprintf(last, sizeof(last), "%s", err->text);
		ptc_error_set(err, rc,
			      "etcd: the call failed on %d tries of %d members, the last: %s",
			      tried, e->nep, last);
	}
	return rc;
}

/* A malformed reply of @method: -EIO. */
static int malformed(struct net_etcd *e, const char *method, struct ptc_error *err)
{
	return ptc_error_set(err, -EIO, "%s%s: a malformed reply", base(e), method);
}

/* The varint field @num of the message at @p (@def when absent), or
 * -EINVAL into *@rc when the message is malformed. */
static int64_t field_int(const uint8_t *p, size_t n, uint32_t num, int64_t def, int *rc)
{
	const uint8_t *end = p + n;
	struct net_pb_field f;
	int r;

	while ((r = net_pb_next(&p, end, &f)) == 1)
		if (f.num == num && !f.p)
			def = (int64_t)f.v;
	if (r < 0)
		*rc = -EINVAL;
	return def;
}

/* The header's revision of the reply at @p (0 when absent), or -EINVAL
 * into *@rc. */
static int64_t reply_revision(const uint8_t *p, size_t n, int *rc)
{
	const uint8_t *end = p + n;
	struct net_pb_field f;
	int64_t rev = 0;
	int r;

	while ((r = net_pb_next(&p, end, &f)) == 1)
		if (f.num == 1 && f.p && net_pb_header_revision(f.p, f.n, &rev) < 0)
			r = -EINVAL;
	if (r < 0)
		*rc = -EINVAL;
	return rev;
}

void net_etcd_kvs_free(struct net_etcd_kv *kvs, size_t n)
{
	for (size_t i = 0; kvs && i < n; i++) {
		free(kvs[i].key);
		free(kvs[i].value);
	}
	free(kvs);
}

int net_etcd_range(struct net_etcd *e, const char *key, bool prefix, struct net_etcd_kv **kvs,
		   size_t *n, int64_t *revision, const struct net_http_call *budget,
		   struct ptc_error *err)
{
	static const char method[] = "/etcdserverpb.KV/Range";
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t len;
	int64_t rev = 0;
	int rc;

	*kvs = NULL;
	*n = 0;
	net_pb_bytes(&req, 1, key, strlen(key)); /* RangeRequest.key */
	if (prefix)
		net_pb_prefix_end(&req, 2, key); /* .range_end */
	if ((rc = call(e, method, &req, true, budget, &reply, &len, err)))
		return rc;
	rc = net_pb_range_reply(reply, len, kvs, n, &rev);
	free(reply);
	if (rc == -EINVAL)
		return malformed(e, method, err);
	if (rc)
		return ptc_error_set(err, rc, "%s%s: out of memory", base(e), method);
	if (revision)
		*revision = rev;
	return 0;
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

/* PutRequest {key 1, value 2, lease 3} or DeleteRangeRequest {key 1,
 * range_end 2} of @op into @b. */
static void op_message(struct net_pb_buf *b, const struct net_etcd_op *op)
{
	net_pb_bytes(b, 1, op->key, strlen(op->key));
	if (op->kind == NET_ETCD_PUT) {
		net_pb_bytes(b, 2, op->value ? op->value : "", op->len);
		if (op->lease)
			net_pb_varint(b, 3, (uint64_t)op->lease);
	} else if (op->prefix) {
		net_pb_prefix_end(b, 2, op->key);
	}
}

/* A RequestOp (request_put 2, request_delete_range 3) of @op as field @num. */
static void request_op(struct net_pb_buf *b, uint32_t num, const struct net_etcd_op *op)
{
	struct net_pb_buf inner = {0}, wrap = {0};
	op_message(&inner, op);
	net_pb_message(&wrap, op->kind == NET_ETCD_PUT ? 2 : 3, &inner);
	net_pb_message(b, num, &wrap);
	net_pb_free(&inner);
	net_pb_free(&wrap);
}

/* A Compare {result 1, target 2, key 3; version 4, create_revision 5,
 * mod_revision 6 or value 7} of @c as field 1 of a TxnRequest. */
static void compare(struct net_pb_buf *b, const struct net_etcd_cmp *c)
{
	/* etcd's enums: CompareResult EQUAL 0, GREATER 1, LESS 2, NOT_EQUAL 3;
	 * CompareTarget VERSION 0, CREATE 1, MOD 2, VALUE 3 */
	static const uint64_t results[] = {[NET_ETCD_EQUAL] = 0,
					   [NET_ETCD_NOT_EQUAL] = 3,
					   [NET_ETCD_GREATER] = 1,
					   [NET_ETCD_LESS] = 2};
	static const uint64_t targets[] = {[NET_ETCD_VERSION] = 0,
					   [NET_ETCD_CREATE] = 1,
					   [NET_ETCD_MOD] = 2,
					   [NET_ETCD_VALUE] = 3};
	static const uint32_t fields[] = {[NET_ETCD_VERSION] = 4,
					  [NET_ETCD_CREATE] = 5,
					  [NET_ETCD_MOD] = 6,
					  [NET_ETCD_VALUE] = 7};
	struct net_pb_buf m = {0};

	net_pb_varint(&m, 1, results[c->result]);
	net_pb_varint(&m, 2, targets[c->target]);
	net_pb_bytes(&m, 3, c->key, strlen(c->key));
	if (c->target == NET_ETCD_VALUE) /* the oneof's member, even when empty */
		net_pb_bytes(&m, fields[c->target], c->value ? c->value : "", c->len);
	else
		net_pb_varint(&m, fields[c->target], (uint64_t)c->num);
	net_pb_message(b, 1, &m);
	net_pb_free(&m);
}

int net_etcd_txn(struct net_etcd *e, const struct net_etcd_cmp *cmps, size_t ncmp,
		 const struct net_etcd_op *then, size_t nthen, const struct net_etcd_op *otherwise,
		 size_t notherwise, bool *succeeded, int64_t *revision,
		 const struct net_http_call *budget, struct ptc_error *err)
{
	static const char method[] = "/etcdserverpb.KV/Txn";
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t len;
	int rc;

	for (size_t i = 0; i < ncmp; i++) /* TxnRequest.compare 1 */
		compare(&req, &cmps[i]);
	for (size_t i = 0; i < nthen; i++) /* .success 2 */
		request_op(&req, 2, &then[i]);
	for (size_t i = 0; i < notherwise; i++) /* .failure 3 */
		request_op(&req, 3, &otherwise[i]);
	if ((rc = call(e, method, &req, false, budget, &reply, &len, err)))
		return rc;
	/* TxnResponse {header 1, succeeded 2} */
	*succeeded = field_int(reply, len, 2, 0, &rc) != 0;
	int64_t rev = reply_revision(reply, len, &rc);
	free(reply);
	if (rc)
		return malformed(e, method, err);
	if (revision)
		*revision = rev;
	return 0;
}

int net_etcd_put_rev(struct net_etcd *e, const char *key, const void *value, size_t len,
		     int64_t lease, int64_t *revision, const struct net_http_call *budget,
		     struct ptc_error *err)
{
	static const char method[] = "/etcdserverpb.KV/Put";
	struct net_etcd_op op = {NET_ETCD_PUT, key, value, len, lease, false};
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t n;

	op_message(&req, &op);
	int rc = call(e, method, &req, true, budget, &reply, &n, err);
	if (rc == 0 && revision) {
		*revision = reply_revision(reply, n, &rc); /* PutResponse.header */
		if (rc)
			rc = malformed(e, method, err);
	}
	free(reply);
	return rc;
}

int net_etcd_put(struct net_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
		 const struct net_http_call *budget, struct ptc_error *err)
{
	return net_etcd_put_rev(e, key, value, len, lease, NULL, budget, err);
}

int net_etcd_delete(struct net_etcd *e, const char *key, bool prefix, int64_t *deleted,
		    const struct net_http_call *budget, struct ptc_error *err)
{
	static const char method[] = "/etcdserverpb.KV/DeleteRange";
	struct net_etcd_op op = {NET_ETCD_DELETE, key, NULL, 0, 0, prefix};
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t n;
	int rc;

	op_message(&req, &op);
	if ((rc = call(e, method, &req, true, budget, &reply, &n, err)))
		return rc;
	int64_t d = field_int(reply, n, 2, 0, &rc); /* DeleteRangeResponse.deleted */
	free(reply);
	if (rc)
		return malformed(e, method, err);
	if (deleted)
		*deleted = d;
	return 0;
}

/* ---------------------------------------------------------------- leases */

int net_etcd_lease_grant(struct net_etcd *e, int ttl_s, int64_t *id,
			 const struct net_http_call *budget, struct ptc_error *err)
{
	static const char method[] = "/etcdserverpb.Lease/LeaseGrant";
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t n;
	int rc;

	net_pb_varint(&req, 1, (uint64_t)ttl_s); /* LeaseGrantRequest.TTL */
	if ((rc = call(e, method, &req, false, budget, &reply, &n, err)))
		return rc;
	*id = field_int(reply, n, 2, 0, &rc); /* LeaseGrantResponse.ID */
	free(reply);
	if (rc)
		return malformed(e, method, err);
	if (*id == 0)
		return ptc_error_set(err, -EIO, "%s%s: no lease in the reply", base(e), method);
	return 0;
}

int net_etcd_lease_keepalive(struct net_etcd *e, int64_t id, int64_t *ttl_s,
			     const struct net_http_call *budget, struct ptc_error *err)
{
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t n;
	int rc;

	/* A stream in etcd's API: one request, and its one reply, as a
	 * unary call (etcd answers it, then ends at the request's end). */
	net_pb_varint(&req, 1, (uint64_t)id); /* LeaseKeepAliveRequest.ID */
	if ((rc = call(e, "/etcdserverpb.Lease/LeaseKeepAlive", &req, true, budget, &reply, &n,
		       err)))
		return rc;
	*ttl_s = field_int(reply, n, 3, 0, &rc); /* LeaseKeepAliveResponse.TTL */
	free(reply);
	if (rc)
		return malformed(e, "/etcdserverpb.Lease/LeaseKeepAlive", err);
	if (*ttl_s <= 0)
		return ptc_error_set(err, -ENOENT, "lease %" PRId64 " expired", id);
	return 0;
}

int net_etcd_lease_revoke(struct net_etcd *e, int64_t id, const struct net_http_call *budget,
			  struct ptc_error *err)
{
	struct net_pb_buf req = {0};
	uint8_t *reply;
	size_t n;

	net_pb_varint(&req, 1, (uint64_t)id); /* LeaseRevokeRequest.ID */
	int rc = call(e, "/etcdserverpb.Lease/LeaseRevoke", &req, true, budget, &reply, &n, err);
	free(reply);
	return rc;
}
