/*
 * net_i.h - internals shared by net's files: the reply parser and judge of
 * net_http_parse.c. net_http.c drives it from libcurl's callbacks;
 * tests/fuzz/fuzz_http.c drives it with arbitrary bytes.
 *
 * Pure: no I/O, no allocation, no globals; any thread, one reply a thread.
 */
#ifndef MLFS_NET_I_H
#define MLFS_NET_I_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ptc/ptc.h"

/* Numbers read from a reply have 1 to this many digits (below 2^63). */
#define NET_MAX_DIGITS 18

/*
 * One request and the reply to it, header line by header line and body
 * chunk by body chunk. Invariants (checked by fuzz_http): status is 0 or
 * 100-999; clen, cr_first, cr_last and cr_total are below 10^18;
 * cr_first <= cr_last; cr_total is -1 (unknown) or > cr_last (cr_unsat: >= 0);
 * got never passes the bytes asked (range) or max (whole).
 */
struct net_reply {
	/* The request, from net_reply_init: bytes [a, b] of an object, or
	 * (a < 0) the whole object, of at most max bytes. */
	int64_t a, b, max;
	/* The reply; a status line starts a new one (a redirect, 100 Continue). */
	long status;	  /* 0 until a valid status line */
	bool have_clen;	  /* a valid Content-Length */
	bool have_cr;	  /* a valid Content-Range "bytes first-last/total" */
	bool cr_unsat;	  /* a valid Content-Range "bytes * /total" (no space) */
	int64_t clen;	  /* -1 unless have_clen */
	int64_t cr_first; /* -1 unless have_cr */
	int64_t cr_last;  /* -1 unless have_cr */
	int64_t cr_total; /* -1: unknown */
	int64_t got;	  /* body bytes kept (NET_BODY_KEEP) */
	bool have_sum;	  /* a valid NET_SUM_HEADER: 16 hex digits */
	uint64_t sum;	  /* its value, 0 unless have_sum */
};

/* Starts @r for bytes [@a, @b] (0 <= a <= b) or, with @a < 0, for a whole
 * object of at most @max (>= 0) bytes. */
void net_reply_init(struct net_reply *r, int64_t a, int64_t b, int64_t max);

/*
 * Takes one header line of @len bytes (its CR LF may be there or not): a
 * status line ("HTTP/1.1 206 Partial Content") starts a new reply and
 * returns NET_HEADER_STATUS; Content-Length, Content-Range and
 * X-Mlfs-XXH3 (have_sum) are read, malformed ones ignored, other headers
 * too (0). -EFBIG, with the reason in @err, when a whole-object 200
 * announces more than max bytes.
 */
#define NET_HEADER_STATUS 1
int net_reply_header(struct net_reply *r, const char *line, size_t len, struct ptc_error *err);

/*
 * Judges the next @n body bytes: NET_BODY_KEEP (they are object bytes
 * [a + got, a + got + n) of the request, or bytes [got, got + n) of the
 * whole object, and got grows by @n: write them), NET_BODY_DROP (the body
 * of an error or redirect: not data), or -EIO (a wrong reply: a 206 whose
 * Content-Range is not what was asked, or a body longer than it says) or
 * -EFBIG (a whole object longer than max), with the reason in @err.
 */
#define NET_BODY_KEEP 0
#define NET_BODY_DROP 1
int net_reply_body(struct net_reply *r, size_t n, struct ptc_error *err);

enum net_verdict {
	NET_OK,	   /* the reply answers the request */
	NET_RETRY, /* a failure another attempt may not meet (5xx, short body, ...) */
	NET_FATAL, /* a failure it would meet again (404, ...) */
};

/*
 * Judges a reply received to its end. NET_OK: a range request got its
 * bytes, all of them (got = b - a + 1) or those before the object's end
 * (then *@size = a + got; or, after a 416, got = 0 and *@size <= a); a
 * whole request got
 * the object (*@size = got). *@size is the object's size when the reply
 * told it, else -1. Otherwise the reason in @err ("HTTP 503", "short body:
 * 10 of 20 bytes"), its code -EIO.
 */
enum net_verdict net_reply_end(const struct net_reply *r, int64_t *size, struct ptc_error *err);

/* Whether a reply of HTTP @status may succeed when asked again: 5xx, 408, 429. */
bool net_status_retryable(long status);

/* CLOCK_MONOTONIC in ns; a sleep of @ms (resumed after a signal). */
int64_t net_now_ns(void);
void net_sleep_ms(int64_t ms);

/* ------------------------------------------------- the etcd client's files */

#include "net/net.h"

/* The longest reply (or watch message) of etcd accepted. */
#define NET_ETCD_MAX_REPLY ((int64_t)64 << 20)

/* net_http_opts' defaults that net_etcd.c applies too (net.h says them). */
#define NET_DEF_RETRIES	    5
#define NET_DEF_TIMEOUT	    10000
#define NET_DEF_BACKOFF	    20
#define NET_DEF_MAX_BACKOFF 2000
#define NET_DEF_DEADLINE    60000

struct net_etcd {
	struct net_http *http; /* retries 0 with several members: call() retries */
	char **ep;	       /* the members' "http://host:port", @nep of them */
	int nep;
	atomic_int cur; /* the member calls go to first, and watches start on */
	int retries;	/* rounds over every member after the first (several) */
	int backoff_ms; /* between rounds, doubled up to max_backoff_ms */
	int max_backoff_ms;
	int timeout_ms;	 /* one attempt on a member, at most (several) */
	int deadline_ms; /* a call's, when it gives none */
};

/* The watch on member @k of @e could not be kept (its stream failed, or
 * was not created in time): calls and watches start at the next member,
 * unless they moved on already. */
void net_etcd_member_failed(struct net_etcd *e, int k);

/* ------------------------------------------------------------ net_pb.c */

/* A protobuf message being written: fields appended in order; @err is
 * -ENOMEM once an append failed (the rest are dropped). */
struct net_pb_buf {
	uint8_t *p;
	size_t n, cap;
	int err;
};
/* Field @field as a varint @v (written even when 0: a oneof's member). */
void net_pb_varint(struct net_pb_buf *b, uint32_t field, uint64_t v);
/* Field @field as @n bytes at @p (bytes, strings). */
void net_pb_bytes(struct net_pb_buf *b, uint32_t field, const void *p, size_t n);
/* Field @field as the message @m (its error carried over). */
void net_pb_message(struct net_pb_buf *b, uint32_t field, const struct net_pb_buf *m);
/* Field @field as the end of the range of keys starting with @key (a
 * range_end): @key with its last byte below 0xff raised, "\0" (every key)
 * when it has none. */
void net_pb_prefix_end(struct net_pb_buf *b, uint32_t field, const char *key);
void net_pb_free(struct net_pb_buf *b);
/* The length of the gRPC message whose 5-byte frame header is at @frame
 * (a compression flag, then 4 bytes big-endian). Pure. */
uint32_t net_grpc_length(const uint8_t *frame);
/* A header or trailer line of a gRPC reply (@len bytes, its CR LF there
 * or not): "grpc-status: N" into *@status, "grpc-message: ..." into @msg
 * (@cap bytes, percent-decoded, control bytes as spaces); any other line
 * changes nothing. Pure. */
void net_grpc_trailer(const char *line, size_t len, long *status, char *msg, size_t cap);
/* The gRPC message of @n bytes at @msg, framed (a compression flag of 0, a
 * 4-byte big-endian length, the bytes) into a new buffer: 0, -EFBIG,
 * -ENOMEM. */
int net_grpc_frame(const uint8_t *msg, size_t n, uint8_t **out, size_t *len);

/* A field read: its number, and its value: a varint (@v; @p NULL) or
 * length-delimited bytes (@p, @n); fixed-size fields are skipped (@p NULL,
 * @v 0). */
struct net_pb_field {
	uint32_t num;
	uint64_t v;
	const uint8_t *p;
	size_t n;
};
/* The next field of the message at *@p (before @end) into @f, *@p past it:
 * 1; 0 at the end; -EINVAL when malformed. Pure. */
int net_pb_next(const uint8_t **p, const uint8_t *end, struct net_pb_field *f);
/* ResponseHeader.revision of the header at @p (@n bytes) into *@revision
 * (left as it is when absent): 0 or -EINVAL. Pure. */
int net_pb_header_revision(const uint8_t *p, size_t n, int64_t *revision);
/* mvccpb.KeyValue at @p into *@kv (key and value new NUL-terminated
 * buffers): 0, -EINVAL (malformed, no key, or a NUL in it), -ENOMEM. */
int net_pb_kv(const uint8_t *p, size_t n, struct net_etcd_kv *kv);
/* RangeResponse at @p: its kvs (the caller's: net_etcd_kvs_free) and its
 * header's revision (unchanged when absent): 0, -EINVAL, -ENOMEM. */
int net_pb_range_reply(const uint8_t *p, size_t n, struct net_etcd_kv **kvs, size_t *nkvs,
		       int64_t *revision);
/* WatchResponse, as read (net_pb_watch_reply). */
struct net_pb_watch {
	int64_t revision, compact_revision;
	bool created, canceled;
	char cancel_reason[128];
	struct net_etcd_event *ev; /* @n of them, in order */
	size_t n;
};
/* WatchResponse at @p into @w (the caller's: net_pb_watch_free): 0,
 * -EINVAL (malformed: an event without a key), -ENOMEM. */
int net_pb_watch_reply(const uint8_t *p, size_t n, struct net_pb_watch *w);
void net_pb_watch_free(struct net_pb_watch *w);

#endif
