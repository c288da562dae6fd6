/*
 * net.h - the HTTP client of mlfs: ranged GETs into a caller's buffers,
 * whole-object GETs, small JSON POSTs and unary gRPC calls, with retries,
 * a stall timeout, a total deadline and reused connections.
 *
 * net depends on libc, libcurl (with HTTP/2: nghttp2), pthreads and, for
 * its error detail (struct ptc_error), ptc/ptc.h; not on transform.
 * Its users: dataset shards and indexes (dataset/mlfs_source.c), the peer
 * fetches of a reconfiguration (row ranges of partitions, cluster/) and
 * etcd's v3 gRPC API (/etcdserverpb.KV/Range and friends, and a Watch
 * stream; the protobuf messages in net_pb.c).
 *
 * Errors: every int function returns 0 or a negative errno and writes one
 * line, naming the URL and the reason, into a caller's struct ptc_error
 * @err, its code the errno returned (@err may be NULL).
 *
 * Threads: one client may be used by any number of threads at once; only
 * net_http_free must not race with another call on the same client. Every
 * request blocks its caller until it is done (at most about the call's
 * deadline): never call them from a thread that must not block (a FUSE
 * worker).
 *
 * Link with libcurl (pkg-config libcurl) and -lpthread.
 */
#ifndef MLFS_NET_H
#define MLFS_NET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "ptc/ptc.h"

/* Longest URL accepted, in bytes. */
#define NET_MAX_URL 4096

/* --------------------------------------------------------------- client */

/* Options of a client. Zero (or negative, where noted) fields take defaults. */
struct net_http_opts {
	int retries;	    /* extra attempts after a failed one; < 0: 5 (at most 100) */
	int timeout_ms;	    /* an attempt that receives nothing this long (connecting
			       included) fails and is retried; <= 0: 10000 */
	int deadline_ms;    /* one call, every attempt and backoff included, fails after
			       this long; <= 0: 60000 (a call may give its own) */
	int backoff_ms;	    /* first retry delay, doubled each retry; <= 0: 20 */
	int max_backoff_ms; /* cap of one retry delay; <= 0: 2000 */
	int max_idle;	    /* idle connections kept for reuse; <= 0: 64 (at most 1024) */
	/* Never through a proxy named by the environment (http_proxy,
	 * HTTPS_PROXY, ALL_PROXY, which libcurl otherwise honours): a
	 * cluster's own traffic, to etcd and between the nodes. Else the
	 * environment decides, as for any libcurl program (a dataset's
	 * http:// source behind a site's proxy). */
	bool direct;
	/* Extra request headers, "Name: value", NULL-terminated (e.g. the
	 * cluster token); NULL: none. Copied by net_http_new. */
	const char *const *headers;
};

struct net_http;

/*
 * A new client with options @o (NULL: all defaults) in *@out; free it with
 * net_http_free. Initialises libcurl once per process (pthread_once).
 * Errors: -EINVAL a header without ':' or holding a CR, LF or NUL (named in
 * @err); -ENOMEM; -EIO libcurl cannot be initialised. Any thread.
 */
int net_http_new(const struct net_http_opts *o, struct net_http **out, struct ptc_error *err);

/* Frees @c (NULL is fine) and closes its idle connections. No call on @c
 * may be running or start. */
void net_http_free(struct net_http *c);

/* Counters since net_http_new; a snapshot (not one atomic read). Any thread. */
struct net_http_stats {
	int64_t requests; /* attempts sent, every retry counted */
	int64_t retries;  /* of those, the repeated attempts */
	int64_t failures; /* calls that failed for good (after their retries) */
	int64_t bytes;	  /* body bytes of successful replies */
};

void net_http_stats(struct net_http *c, struct net_http_stats *out);

/*
 * Checks that @url is one net may fetch: "http://" or "https://" (any
 * case), a host, at most NET_MAX_URL bytes, no space or control character.
 * 0 or -EINVAL, the reason in @err (e.g. "http://: URI without a host").
 * Pure; any thread.
 */
int net_url_check(const char *url, struct ptc_error *err);

/* ----------------------------------------------------------------- calls */

/*
 * What one call may spend; a NULL call, or zero fields, take the client's.
 * The call's deadline is @start_ns + @deadline_ms: several requests that
 * share a budget (the ranges of one dataset read) give the same start.
 */
struct net_http_call {
	int64_t start_ns; /* CLOCK_MONOTONIC ns the budget starts at; 0: now */
	int deadline_ms;  /* the budget; <= 0: opts.deadline_ms */
	/* Once *@stop is non-zero no further attempt starts and the one in
	 * flight ends within about a second, even when the server sends
	 * nothing (-ECANCELED, "cancelled"). NULL: never. */
	atomic_int *stop;
	/* POST only: repeating the request is harmless (a range read, a put of
	 * the same value). Otherwise a failed POST is retried only when it
	 * cannot have reached the server: refused connections, unresolved
	 * names, HTTP 429. GETs are always retried. */
	bool idempotent;
	/* One attempt ends after this long even while bytes arrive (<= 0: only
	 * opts.timeout_ms of silence ends it); the etcd client's, with several
	 * members, so that a frozen member costs one timeout, not two. */
	int attempt_ms;
	/* Out, when not NULL: set by a failed call to whether its last attempt
	 * failed as another server might not fail (a connection error, a
	 * stall, 5xx, 408, 429, gRPC UNAVAILABLE or DEADLINE_EXCEEDED) and the
	 * request may be sent again (idempotent, or it cannot have reached
	 * the server), with time left before the deadline; false otherwise
	 * (the server's answer, a bad request, cancelled, out of time). The
	 * etcd client tries another member then. */
	bool *retryable;
};

/*
 * The attempts of a call: one fails on a connection error, on receiving
 * nothing for opts.timeout_ms, on HTTP 5xx, 408 or 429, or on a short or
 * wrong reply, and is then retried after a backoff (opts.backoff_ms,
 * doubling up to opts.max_backoff_ms) until opts.retries are spent or the
 * deadline comes; other statuses (404, 403, ...) fail at once. Messages
 * name the URL and the last reason, e.g. "http://h/x: HTTP 503 after 6
 * attempts", "http://h/x: timed out (nothing received for 10 s) after 4
 * attempts, deadline of 60 s reached", "http://h/x: HTTP 404".
 */

/*
 * A ranged GET: bytes [@off, @off + @len) of an object, asked with
 * "Range: bytes=off-(off+len-1)", into @iov (@iovcnt buffers, in order,
 * whose lengths sum to @len). 206 replies must carry a Content-Range that
 * starts at @off; a 200 is accepted when @off is 0 and it holds no more
 * than @len bytes; a 416 whose Content-Range gives only the object's size
 * when the object ends at or before @off.
 */
/* The header carrying the XXH3 64 of a reply's body (16 hex digits),
 * "X-Mlfs-XXH3: 0123456789abcdef": set by the sender (net_reply_add_header),
 * checked by a ranged GET with @verify. */
#define NET_SUM_HEADER "x-mlfs-xxh3"

struct net_http_range {
	int64_t off, len; /* in: off >= 0, len > 0 */
	/* in: the reply must carry NET_SUM_HEADER and its body's XXH3 must
	 * equal it: hashed as the bytes arrive; a mismatch fails the attempt
	 * ("checksum mismatch ...") and is retried like a short reply, a
	 * missing header fails the call at once. */
	bool verify;
	uint64_t sum;		 /* out, with @verify: the checksum verified */
	const struct iovec *iov; /* in: borrowed for the call */
	int iovcnt;		 /* in: > 0 */
	int64_t got;		 /* out: bytes written to iov: len, or fewer when the
				    object ends first (then off + got == size, or got
				    is 0 and size <= off) */
	int64_t size;		 /* out: the object's size when the reply said, else -1 */
};

/*
 * Runs the ranged GET @r of @url under @call. All or nothing: on an error
 * the iov bytes are unspecified (partly written) and r->got is 0.
 * Errors: -EINVAL bad URL or range (iov lengths not summing to len, ...);
 * -EIO the object unreadable after the retries or the deadline;
 * -ECANCELED *call->stop was set; -ENOMEM. Any thread.
 */
int net_http_get_range(struct net_http *c, const char *url, struct net_http_range *r,
		       const struct net_http_call *call, struct ptc_error *err);

/*
 * A whole-object GET (no Range) that must answer 200 with at most @max
 * bytes. On success *@data (malloc'd, owned by the caller, never NULL, with
 * a NUL after its *@len bytes for text readers).
 * Errors (*@data = NULL, *@len = 0): -EINVAL bad URL or @max < 0; -EFBIG
 * the object holds more than @max bytes ("holds 300007 bytes, more than
 * 4096"), not retried; -EIO; -ECANCELED; -ENOMEM. Any thread.
 */
int net_http_get(struct net_http *c, const char *url, int64_t max, uint8_t **data, size_t *len,
		 const struct net_http_call *call, struct ptc_error *err);

/*
 * POSTs the @body_len bytes at @body with "Content-Type: application/json"
 * and returns the reply, which must be a 200 of at most @max bytes, as
 * net_http_get does. The reason of another status ends with the start of
 * its body, which says why in a JSON API: "http://h/v3/kv/txn: HTTP 400:
 * {"error":"..."}". See net_http_call.idempotent for its retries.
 * Errors: those of net_http_get. Any thread.
 */
int net_http_post_json(struct net_http *c, const char *url, const void *body, size_t body_len,
		       int64_t max, uint8_t **data, size_t *len, const struct net_http_call *call,
		       struct ptc_error *err);

/*
 * One unary gRPC call over HTTP/2 (without TLS spoken from the first byte;
 * over https negotiated): POSTs the message @msg (@msg_len bytes of
 * protobuf, framed here) with "Content-Type: application/grpc" and returns
 * the reply's one message (at most @max bytes; the frame taken off). A
 * call succeeds only with grpc-status 0 in the reply's trailers; another
 * status is -EIO, its text ending with "gRPC status N: <grpc-message>";
 * UNAVAILABLE and DEADLINE_EXCEEDED
 * are retried like a 503 (net_http_call.idempotent). Any thread.
 */
int net_http_post_grpc(struct net_http *c, const char *url, const void *msg, size_t msg_len,
		       int64_t max, uint8_t **data, size_t *len, const struct net_http_call *call,
		       struct ptc_error *err);

/* ---------------------------------------------------------------- server */

/*
 * The HTTP server a node runs for its peers (libmicrohttpd, a thread
 * pool). Every request must carry "Authorization: Bearer <token>" (else
 * 401 "unauthorized", whatever the path); the path must be printable ASCII
 * without "..", at most NET_SERVER_MAX_ARGS query arguments, a POST body at
 * most max_body bytes (else 400 or 413 with a one-line reason). What passes
 * goes to the handler, which must answer with exactly one net_reply_* call
 * before returning (else 500).
 */
#define NET_SERVER_MAX_ARGS 16

struct net_server_opts {
	const char *addr;  /* "host:port" to bind (port 0: any free one) */
	const char *token; /* the cluster token, at least 16 characters */
	int threads;	   /* handler threads; <= 0: 4 */
	size_t max_body;   /* bytes of a POST body; 0: 1 MiB */
};

struct net_server;
struct net_request;
/* Runs on a server thread, several at once: must be thread-safe. */
typedef void (*net_handler_fn)(void *arg, struct net_request *r);

/* Starts serving; 0, -EINVAL (bad addr or token, said in @err),
 * -EADDRINUSE (cannot listen there), -ENOMEM. */
int net_server_start(const struct net_server_opts *o, net_handler_fn handler, void *arg,
		     struct net_server **out, struct ptc_error *err);
/* Stops and frees @s (NULL is fine), waiting for the handlers running. */
void net_server_stop(struct net_server *s);
/* The port it listens on (the one chosen for port 0). */
int net_server_port(const struct net_server *s);
/* Requests received and refused for a wrong or missing token. */
void net_server_counts(const struct net_server *s, int64_t *requests, int64_t *refused);

/* The request's method, path (without the query), a query argument (NULL
 * when absent), and POST body (NUL-terminated). Valid during the handler. */
const char *net_request_method(const struct net_request *r);
const char *net_request_path(const struct net_request *r);
const char *net_request_arg(const struct net_request *r, const char *name);
const char *net_request_body(const struct net_request *r, size_t *len);

/* Adds header "@name: @value" to the reply the handler is about to make
 * (before its net_reply_* call; at most 4, each under 200 bytes): 0, or
 * -E2BIG / -EINVAL (a CR, LF or ':' in @name, a CR or LF in @value). */
int net_reply_add_header(struct net_request *r, const char *name, const char *value);

/* Replies @len bytes at @data (copied). 0, -ENOMEM, -EALREADY. */
int net_reply_buf(struct net_request *r, int status, const void *data, size_t len,
		  const char *content_type);
/* Replies a one-line text reason (a 4xx or 5xx). */
int net_reply_error(struct net_request *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/*
 * Replies @len bytes pulled later, on a server thread, by @read(@arg, pos,
 * buf, max): it fills buf with up to max bytes at offset pos and returns
 * how many (> 0), or -1 to cut the reply short (the peer sees a broken
 * transfer). @done(@arg) runs once the reply is over or abandoned, also
 * when this call fails (then with -ENOMEM): pin what @read reads until
 * then.
 */
typedef ssize_t (*net_read_fn)(void *arg, uint64_t pos, char *buf, size_t max);
/* Replies the @len bytes at @data, sent from there without a copy: they
 * must stay as they are until @done(@arg) runs (once the reply is over or
 * abandoned, also when this call fails). 0, -ENOMEM, -EALREADY. */
int net_reply_pinned(struct net_request *r, int status, const void *data, size_t len,
		     void (*done)(void *arg), void *arg, const char *content_type);
int net_reply_stream(struct net_request *r, int status, int64_t len, net_read_fn read,
		     void (*done)(void *arg), void *arg, const char *content_type);

/* ------------------------------------------------------------------ etcd */

/*
 * An etcd v3 client over its gRPC API (etcd 3.4 and later: KV Range, Put,
 * DeleteRange, Txn; Lease LeaseGrant, LeaseKeepAlive, LeaseRevoke; each a
 * unary call of net_http_post_grpc), built on net_http (retries, timeouts,
 * deadlines as above; reads, puts and deletes are idempotent, a
 * transaction and a lease grant are retried only when they cannot have
 * reached etcd). Keys are text, values bytes. Errors: those of
 * net_http_post_grpc (etcd's refusals: -EIO with its gRPC status and
 * message), -ENOENT (no such key, an expired lease), -EIO a reply that is
 * not etcd's. Every call may take a NULL budget (the client's deadline).
 * Any thread, as net_http.
 */
struct net_etcd;

/* A key and its value as etcd holds them (owned by the array's holder). */
struct net_etcd_kv {
	char *key;
	char *value; /* NUL after its len bytes */
	size_t len;
	int64_t mod_revision, create_revision, version, lease;
};

/*
 * A client of the etcd cluster whose members' client URLs are @endpoint:
 * one ("http://127.0.0.1:2379") or several separated by commas (at most
 * PTC_ETCD_MAX), with the HTTP options @o (NULL: defaults). With several,
 * a call that fails as another member might not (the member down, frozen,
 * or without a leader: net_http_call.retryable) goes to the next member
 * at once, within the call's deadline, every member o->retries + 1 times
 * at most, with o->backoff_ms between rounds; the member that answered is
 * where the next calls and watches start. A transaction goes to another
 * member only when it cannot have reached the first. 0, -EINVAL (a bad
 * URL, named in @err), -ENOMEM.
 */
int net_etcd_new(const char *endpoint, const struct net_http_opts *o, struct net_etcd **out,
		 struct ptc_error *err);
/* How many members @e knows, and in *@current (when not NULL; valid until
 * net_etcd_free) the one its calls now go to first. Any thread. */
int net_etcd_members(struct net_etcd *e, const char **current);
void net_etcd_free(struct net_etcd *e);
void net_etcd_kvs_free(struct net_etcd_kv *kvs, size_t n);

/* The key @key, or every key starting with it (@prefix), sorted; the
 * store's revision into *@revision when given. The array is the caller's
 * (net_etcd_kvs_free); none found is 0 with *@n = 0. */
int net_etcd_range(struct net_etcd *e, const char *key, bool prefix, struct net_etcd_kv **kvs,
		   size_t *n, int64_t *revision, const struct net_http_call *budget,
		   struct ptc_error *err);
/* One key into *@kv (its key and value the caller's to free): -ENOENT if
 * absent. */
int net_etcd_get(struct net_etcd *e, const char *key, struct net_etcd_kv *kv,
		 const struct net_http_call *budget, struct ptc_error *err);
/* Puts @len bytes at @value under @key, bound to @lease (0: none). */
int net_etcd_put(struct net_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
		 const struct net_http_call *budget, struct ptc_error *err);
/* net_etcd_put, and the revision of the put (the key's new mod revision)
 * into *@revision. */
int net_etcd_put_rev(struct net_etcd *e, const char *key, const void *value, size_t len,
		     int64_t lease, int64_t *revision, const struct net_http_call *budget,
		     struct ptc_error *err);
/* Deletes @key (or the keys starting with it); how many into *@deleted. */
int net_etcd_delete(struct net_etcd *e, const char *key, bool prefix, int64_t *deleted,
		    const struct net_http_call *budget, struct ptc_error *err);

/* A condition of a transaction: @key's @target compared to @num (or to the
 * @len bytes at @value for NET_ETCD_VALUE). A missing key has version,
 * create and mod revisions 0. */
enum net_etcd_target { NET_ETCD_VERSION, NET_ETCD_CREATE, NET_ETCD_MOD, NET_ETCD_VALUE };
enum net_etcd_result { NET_ETCD_EQUAL, NET_ETCD_NOT_EQUAL, NET_ETCD_GREATER, NET_ETCD_LESS };
struct net_etcd_cmp {
	const char *key;
	enum net_etcd_target target;
	enum net_etcd_result result;
	int64_t num;
	const void *value;
	size_t len;
};
/* A put (of @len bytes at @value, bound to @lease) or a delete (of @key, or
 * of the keys starting with it when @prefix). */
struct net_etcd_op {
	enum { NET_ETCD_PUT, NET_ETCD_DELETE } kind;
	const char *key;
	const void *value;
	size_t len;
	int64_t lease;
	bool prefix;
};
/* One atomic transaction: if every condition of @cmps holds, the @then ops,
 * else the @otherwise ops; which into *@succeeded. The single commit point
 * of a reconfiguration is one of these. */
int net_etcd_txn(struct net_etcd *e, const struct net_etcd_cmp *cmps, size_t ncmp,
		 const struct net_etcd_op *then, size_t nthen, const struct net_etcd_op *otherwise,
		 size_t notherwise, bool *succeeded, int64_t *revision,
		 const struct net_http_call *budget, struct ptc_error *err);

/* Leases: a grant of @ttl_s seconds (its id into *@id), one keep-alive (the
 * seconds left into *@ttl_s; -ENOENT once it expired), a revoke (its keys
 * vanish at once). */
int net_etcd_lease_grant(struct net_etcd *e, int ttl_s, int64_t *id,
			 const struct net_http_call *budget, struct ptc_error *err);
int net_etcd_lease_keepalive(struct net_etcd *e, int64_t id, int64_t *ttl_s,
			     const struct net_http_call *budget, struct ptc_error *err);
int net_etcd_lease_revoke(struct net_etcd *e, int64_t id, const struct net_http_call *budget,
			  struct ptc_error *err);

/* ------------------------------------------------------------ etcd watch */

/* One change under a watched prefix: a put (the key's new value and
 * revisions) or a delete (@deleted; the key and its mod_revision only). */
struct net_etcd_event {
	bool deleted;
	struct net_etcd_kv kv;
};

/*
 * What a watch calls, on its own thread, in etcd's order: @n events (each
 * borrowed for the call) of the message of revision @revision; @n = 0 with
 * @revision > 0 once, when the watch is in place (changes after the
 * revision the caller read are now reported); and last @n = 0 with
 * @revision a negative errno when the stream ended (-ECANCELED: stopped;
 * -ESTALE: etcd canceled it, e.g. compacted; -EIO: etcd unreachable or
 * gone, -EFBIG, -ENOMEM): no call follows that one. It must not call
 * net_etcd_watch_stop on its own watch.
 */
typedef void (*net_etcd_watch_fn)(void *arg, const struct net_etcd_event *ev, size_t n,
				  int64_t revision);
/*
 * What a watch calls, on its own thread, after the events of the bytes it
 * read at once went to its net_etcd_watch_fn: outside libcurl's
 * callbacks (where that function runs), so it may block and make other
 * transfers, even stop another watch; no event is read until it
 * returns. It must not call net_etcd_watch_stop on its own watch.
 */
typedef void (*net_etcd_watch_settled_fn)(void *arg);
struct net_etcd_watch;

/*
 * Watches the keys starting with @prefix, from @start_revision on (0: from
 * now; the revision after a range's is what makes range + watch miss
 * nothing), on a connection and thread of its own: no request is made
 * while nothing changes. @fn gets the events, @settled (NULL: none) the
 * end of each batch of them, both with @arg. 0 and *@out, or -ENOMEM / a
 * pthread error with @err. Any thread.
 */
int net_etcd_watch_start(struct net_etcd *e, const char *prefix, int64_t start_revision,
			 net_etcd_watch_fn fn, net_etcd_watch_settled_fn settled, void *arg,
			 struct net_etcd_watch **out, struct ptc_error *err);
/* Stops the watch (its last call to fn, -ECANCELED unless the stream had
 * ended already, is made before this returns) and frees it; NULL: fine.
 * Not from the watch's own thread (its function or settled hook). */
void net_etcd_watch_stop(struct net_etcd_watch *w);
/* Why the stream ended, once fn was told (a text of the watch's). */
const char *net_etcd_watch_error(const struct net_etcd_watch *w);

#endif
