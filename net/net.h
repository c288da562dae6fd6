/*
 * net.h - the HTTP client of mlfs: ranged GETs into a caller's buffers,
 * whole-object GETs and small JSON POSTs, with retries, a stall timeout, a
 * total deadline and reused connections.
 *
 * net depends on libc, libcurl and pthreads only (not on ptc or transform).
 * Its users: dataset shards and indexes (mlfs/mlfs_source.c), and next the
 * peer fetches of a reconfiguration (row ranges of partitions) and etcd's
 * v3 JSON gateway (POST /v3/kv/range and friends).
 *
 * Errors: every int function returns 0 or a negative errno and writes one
 * line, naming the URL and the reason, into a caller's buffer @why of
 * @whylen bytes (always NUL-terminated; @why may be NULL when @whylen is 0).
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
#include <sys/uio.h>

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
	/* Extra request headers, "Name: value", NULL-terminated (e.g. the
	 * cluster token); NULL: none. Copied by net_http_new. */
	const char *const *headers;
};

struct net_http;

/*
 * A new client with options @o (NULL: all defaults) in *@out; free it with
 * net_http_free. Initialises libcurl once per process (pthread_once).
 * Errors: -EINVAL a header without ':' or holding a CR, LF or NUL (named in
 * @why); -ENOMEM; -EIO libcurl cannot be initialised. Any thread.
 */
int net_http_new(const struct net_http_opts *o, struct net_http **out, char *why, size_t whylen);

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
 * 0 or -EINVAL, the reason in @why (e.g. "http://: URI without a host").
 * Pure; any thread.
 */
int net_url_check(const char *url, char *why, size_t whylen);

/* ----------------------------------------------------------------- calls */

/*
 * What one call may spend; a NULL call, or zero fields, take the client's.
 * The call's deadline is @start_ns + @deadline_ms: several requests that
 * share a budget (the ranges of one dataset read) give the same start.
 */
struct net_http_call {
	int64_t start_ns; /* CLOCK_MONOTONIC ns the budget starts at; 0: now */
	int deadline_ms;  /* the budget; <= 0: opts.deadline_ms */
	/* Once *@stop is non-zero no further attempt starts (-ECANCELED, no
	 * message); one in flight runs to its end. NULL: never. */
	atomic_int *stop;
	/* POST only: repeating the request is harmless (a range read, a put of
	 * the same value). Otherwise a failed POST is retried only when it
	 * cannot have reached the server: refused connections, unresolved
	 * names, HTTP 429. GETs are always retried. */
	bool idempotent;
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
struct net_http_range {
	int64_t off, len;	 /* in: off >= 0, len > 0 */
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
		       const struct net_http_call *call, char *why, size_t whylen);

/*
 * A whole-object GET (no Range) that must answer 200 with at most @max
 * bytes. On success *@data (malloc'd, owned by the caller, never NULL, with
 * a NUL after its *@len bytes for text readers).
 * Errors (*@data = NULL, *@len = 0): -EINVAL bad URL or @max < 0; -EFBIG
 * the object holds more than @max bytes ("holds 300007 bytes, more than
 * 4096"), not retried; -EIO; -ECANCELED; -ENOMEM. Any thread.
 */
int net_http_get(struct net_http *c, const char *url, int64_t max, uint8_t **data, size_t *len,
		 const struct net_http_call *call, char *why, size_t whylen);

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
		       char *why, size_t whylen);

#endif
