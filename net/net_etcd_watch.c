/*
 * net_etcd_watch.c - an etcd watch over etcd's gRPC API: the puts and
 * deletes under a prefix, as they happen, on a connection of their own.
 *
 * DESIGN
 * POST /etcdserverpb.Watch/Watch over HTTP/2 (spoken from the first byte
 * without TLS: etcd's client port tells gRPC from HTTP/1.1 by its
 * preface) carries one WatchRequest, whose create_request names the
 * prefix's range and the revision to start from; the request's end does
 * not end the watch (etcd stops reading, not sending). The reply is a
 * stream that never ends: gRPC messages (a compression flag, a 4-byte
 * length, a WatchResponse), each {header {revision}, created, canceled,
 * compact_revision, cancel_reason, events [{type, kv}]}, read from the
 * protobuf wire format by net_pb.c.
 *
 * Why not the JSON gateway's /v3/watch, which this file used first: etcd
 * sends each message of a gateway watch through its own gRPC client and
 * marshals it to JSON by reflection. A reconfiguration of a tiny model at
 * 32 nodes is three messages to each of 32 watchers, and those were most
 * of etcd's CPU (BENCHMARKS.md, thirteenth session); over gRPC its CPU
 * per command fell by about 40%.
 *
 * A watch is one thread holding one libcurl transfer (its own easy and
 * multi handles, not net_http's pool: a stream does not fit a bounded
 * request/reply client). Its write callback appends to a buffer and takes
 * every whole message in it; events go to the caller's function, in
 * order, with the revision of their message. The stream ending for any
 * reason (etcd gone or restarted, the watch canceled or compacted, a
 * message larger than NET_ETCD_MAX_REPLY, a malformed one, the watch
 * stopped) is reported once, as a call with no events and a negative
 * errno, with the gRPC status when etcd sent one; the caller then reads
 * the keys again and starts a new watch from the revision it read, so
 * that nothing between the two is missed. An idle watch costs etcd
 * nothing.
 *
 * With several etcd members (net_etcd.c), a watch reads from the member
 * its client's calls go to when it starts, and ends (-EAGAIN) once they go
 * to another: a frozen member's stream is silent, not broken, and only the
 * calls' timeouts tell. It also ends when etcd did not create it within
 * NET_ETCD_WATCH_CREATE_S, and, asked with the gRPC metadata "hasleader",
 * when its member loses the cluster's leader. A watch that failed moves
 * the client on to the next member (net_etcd_member_failed).
 *
 * After each curl_multi_perform that delivered events, the caller's
 * @settled (when it gave one) runs on the same thread outside libcurl's
 * callbacks: there a caller may act on the events itself (a round of
 * mlfs's control plane, with transfers of its own) instead of handing
 * them to another thread.
 *
 * Threads: the watch's thread calls @fn and @settled; net_etcd_watch_stop from any
 * other thread wakes it (curl_multi_wakeup) and joins it.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "net/net.h"
#include "net/net_i.h"

/* A watch etcd has not said it created this long after its request ends
 * (its member frozen, or without a leader): before mlfs_mirror.c's 5 s. */
#define NET_ETCD_WATCH_CREATE_S 4

struct net_etcd_watch {
	CURLM *multi;
	CURL *easy;
	struct curl_slist *headers;
	char url[NET_MAX_URL + 32];
	uint8_t *body; /* the create request, framed (body_len bytes) */
	size_t body_len;
	net_etcd_watch_fn fn;
	net_etcd_watch_settled_fn settled;
	bool delivered; /* events went to fn since settled was last called */
	void *arg;
	pthread_t thread;
	atomic_int stop;
	int end;      /* the first error seen by the callback (0: none) */
	uint8_t *buf; /* bytes of an unfinished message */
	size_t len, cap;
	bool created;
	long grpc_status; /* the stream's trailer (-1: none yet) */
	char grpc_message[128];
	char why[256];
	bool transport;	    /* the stream failed as its member's fault */
	struct net_etcd *e; /* the client: its current member (e->cur) */
	int member;	    /* the member this watch reads from */
};

/* One WatchResponse: its events to the caller. 0, or the error that ends
 * the watch (with w->why). */
static int take_message(struct net_etcd_watch *w, const uint8_t *p, size_t len)
{
	struct net_pb_watch m;
	int rc = net_pb_watch_reply(p, len, &m);

	if (rc) {
		snprintf(w->why, sizeof(w->why), "etcd watch: %s",
			 rc == -ENOMEM ? "out of memory" : "a malformed message");
		return rc == -ENOMEM ? rc : -EIO;
	}
	if (m.canceled) {
		snprintf(w->why, sizeof(w->why), "etcd watch canceled%s%s%s",
			 m.compact_revision ? " (compacted)" : "", m.cancel_reason[0] ? ": " : "",
			 m.cancel_reason);
		net_pb_watch_free(&m);
		return -ESTALE;
	}
	w->created = w->created || m.created;
	if (m.n || w->created)
		w->fn(w->arg, m.ev, m.n, m.revision);
	w->delivered = w->delivered || m.n > 0;
	net_pb_watch_free(&m);
	return 0;
}

/* The stream's bytes: gRPC messages, each a compression flag (0: etcd
 * compresses nothing unless asked), a 4-byte big-endian length and a
 * WatchResponse. */
static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
	struct net_etcd_watch *w = arg;
	size_t n = size * nmemb;

	if (w->end)
		return 0;
	if (w->len + n > (size_t)NET_ETCD_MAX_REPLY + 5) {
		snprintf(w->why, sizeof(w->why), "etcd watch: a message over %" PRId64 " bytes",
			 NET_ETCD_MAX_REPLY);
		w->end = -EFBIG;
		return 0;
	}
	if (w->len + n > w->cap) {
		size_t cap = (w->len + n) * 2;
		uint8_t *b = realloc(w->buf, cap);
		if (!b) {
			w->end = -ENOMEM;
			return 0;
		}
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	size_t pos = 0;
	while (w->len - pos >= 5) {
		const uint8_t *m = w->buf + pos;
		uint32_t mlen = net_grpc_length(m);
		if (m[0] != 0 || mlen > (uint64_t)NET_ETCD_MAX_REPLY) {
			snprintf(w->why, sizeof(w->why), "etcd watch: %s",
				 m[0] ? "a compressed message" : "a message over the limit");
			w->end = m[0] ? -EIO : -EFBIG;
			return 0;
		}
		if (w->len - pos - 5 < mlen)
			break; /* incomplete: wait for more */
		int rc = take_message(w, m + 5, mlen);
		pos += 5 + (size_t)mlen;
		if (rc) {
			w->end = rc;
			return 0;
		}
	}
	memmove(w->buf, w->buf + pos, w->len - pos);
	w->len -= pos;
	return n;
}

/* The stream's headers and trailers: grpc-status and grpc-message say why
 * it ended. */
static size_t on_header(char *p, size_t size, size_t nmemb, void *arg)
{
	struct net_etcd_watch *w = arg;
	net_grpc_trailer(p, size * nmemb, &w->grpc_status, w->grpc_message,
			 sizeof(w->grpc_message));
	return size * nmemb;
}

static void *watch_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-watch"); /* for top -H, perf */
	struct net_etcd_watch *w = arg;
	int running = 1, rc = 0;

	bool moved = false, late = false;
	int64_t until = net_now_ns() / 1000000 + NET_ETCD_WATCH_CREATE_S * 1000; /* to be created */
	while (running && !atomic_load(&w->stop)) {
		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			rc = -EIO;
			break;
		}
		if (w->delivered && w->settled && !w->end) {
			w->delivered = false;
			w->settled(w->arg);
		}
		/* the client's calls went to another member (this one down,
		 * frozen or cut off): a silent stream here may be a dead one */
		if ((moved = atomic_load(&w->e->cur) % w->e->nep != w->member))
			break;
		int64_t left = w->created ? 1000 : until - net_now_ns() / 1000000;
		if ((late = left <= 0))
			break;
		if (running)
			curl_multi_poll(w->multi, NULL, 0, left < 1000 ? (int)left : 1000, NULL);
	}
	if (atomic_load(&w->stop)) {
		rc = -ECANCELED;
		snprintf(w->why, sizeof(w->why), "etcd watch stopped");
	} else if (late && !w->end) {
		rc = -ETIMEDOUT;
		snprintf(w->why, sizeof(w->why), "etcd watch: not created by %s within %d s",
			 w->e->ep[w->member], NET_ETCD_WATCH_CREATE_S);
	} else if (moved && !w->end) {
		rc = -EAGAIN;
		snprintf(w->why, sizeof(w->why),
			 "etcd watch: the client moved from member %s to %s: watching there",
			 w->e->ep[w->member], w->e->ep[atomic_load(&w->e->cur) % w->e->nep]);
	} else if (w->end) {
		rc = w->end;
	} else {
		CURLMsg *m;
		int left;
		CURLcode code = CURLE_OK;
		while ((m = curl_multi_info_read(w->multi, &left)))
			if (m->msg == CURLMSG_DONE)
				code = m->data.result;
		long status = 0;
		curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
		rc = -EIO;
		/* gone, cut, or etcd's UNAVAILABLE (no leader: hasleader) or
		 * DEADLINE_EXCEEDED */
		w->transport = code != CURLE_OK || w->grpc_status == 14 || w->grpc_status == 4 ||
			       w->grpc_status < 0;
		if (code != CURLE_OK)
			snprintf(w->why, sizeof(w->why), "etcd watch: %s",
				 curl_easy_strerror(code));
		else if (w->grpc_status > 0)
			snprintf(w->why, sizeof(w->why),
				 "etcd watch: the stream ended (gRPC status %ld%s%s)",
				 w->grpc_status, w->grpc_message[0] ? ": " : "", w->grpc_message);
		else
			snprintf(w->why, sizeof(w->why), "etcd watch: the stream ended (HTTP %ld)",
				 status);
	}
	/* the member's fault, not the watch's (canceled after a compaction,
	 * a message over the limit): the next watch elsewhere */
	if (late || w->transport)
		net_etcd_member_failed(w->e, w->member);
	w->fn(w->arg, NULL, 0, rc);
	return NULL;
}

/* The gRPC message that creates the watch into w->body: a WatchRequest
 * whose create_request (1) is {key 1, range_end 2, start_revision 3}. */
static int create_request(struct net_etcd_watch *w, const char *prefix, int64_t start_revision)
{
	struct net_pb_buf create = {0}, req = {0};

	net_pb_bytes(&create, 1, prefix, strlen(prefix));
	net_pb_prefix_end(&create, 2, prefix);
	if (start_revision > 0)
		net_pb_varint(&create, 3, (uint64_t)start_revision);
	net_pb_message(&req, 1, &create);
	net_pb_free(&create);
	int rc = req.err ? req.err : net_grpc_frame(req.p, req.n, &w->body, &w->body_len);
	net_pb_free(&req);
	return rc;
}

int net_etcd_watch_start(struct net_etcd *e, const char *prefix, int64_t start_revision,
			 net_etcd_watch_fn fn, net_etcd_watch_settled_fn settled, void *arg,
			 struct net_etcd_watch **out, struct ptc_error *err)
{
	struct net_etcd_watch *w = calloc(1, sizeof(*w));
	int rc = w ? create_request(w, prefix, start_revision) : -ENOMEM;

	*out = NULL;
	if (rc == 0) {
		w->e = e;
		w->member = atomic_load(&e->cur) % e->nep;
		snprintf(w->url, sizeof(w->url), "%s/etcdserverpb.Watch/Watch", e->ep[w->member]);
		w->fn = fn;
		w->settled = settled;
		w->arg = arg;
		w->grpc_status = -1;
		w->multi = curl_multi_init();
		w->easy = curl_easy_init();
		w->headers = curl_slist_append(NULL, "Content-Type: application/grpc");
		if (w->headers)
			w->headers = curl_slist_append(w->headers, "TE: trailers");
		/* gRPC metadata: a member without a leader (cut off from the
		 * others) ends the stream instead of keeping it open silent */
		if (w->headers)
			w->headers = curl_slist_append(w->headers, "hasleader: true");
		if (!w->multi || !w->easy || !w->headers)
			rc = -ENOMEM;
	}
	if (rc == 0) {
		CURL *h = w->easy;
		curl_easy_setopt(h, CURLOPT_URL, w->url);
		/* gRPC is HTTP/2: without TLS, spoken from the first byte (etcd's
		 * port tells it from HTTP/1.1 by its preface) */
		curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
				 (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, w->headers);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)w->body_len);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
		curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(h, CURLOPT_HEADERDATA, w);
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
		curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
		curl_easy_setopt(h, CURLOPT_PROXY, ""); /* to etcd itself (net_etcd_new) */
		curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
		if (curl_multi_add_handle(w->multi, h) != CURLM_OK)
			rc = -ENOMEM;
	}
	if (rc == 0 && (rc = -pthread_create(&w->thread, NULL, watch_main, w)))
		ptc_error_set(err, rc, "etcd watch: cannot start its thread");
	if (rc) {
		if (rc == -ENOMEM)
			ptc_error_set(err, rc, "etcd watch: out of memory");
		if (w) {
			if (w->multi && w->easy)
				curl_multi_remove_handle(w->multi, w->easy);
			curl_easy_cleanup(w->easy);
			curl_multi_cleanup(w->multi);
			curl_slist_free_all(w->headers);
			free(w->body);
			free(w);
		}
		return rc;
	}
	*out = w;
	return 0;
}

void net_etcd_watch_stop(struct net_etcd_watch *w)
{
	if (!w)
		return;
	/* from its own thread it would join itself, then free what runs */
	assert(!pthread_equal(w->thread, pthread_self()));
	atomic_store(&w->stop, 1);
	curl_multi_wakeup(w->multi);
	pthread_join(w->thread, NULL);
	curl_multi_remove_handle(w->multi, w->easy);
	curl_easy_cleanup(w->easy);
	curl_multi_cleanup(w->multi);
	curl_slist_free_all(w->headers);
	free(w->body);
	free(w->buf);
	free(w);
}

const char *net_etcd_watch_error(const struct net_etcd_watch *w)
{
	return w->why;
}
