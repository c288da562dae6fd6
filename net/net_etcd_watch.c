/*
 * net_etcd_watch.c - an etcd watch over the JSON gateway: the puts and
 * deletes under a prefix, as they happen, on a connection of their own.
 *
 * DESIGN
 * The gateway's POST /v3/watch answers with a stream that never ends:
 * one JSON object per message ({"result": {"header", "created",
 * "events", "canceled", "compact_revision"}}), each a whole value. A
 * watch is one thread holding one libcurl transfer (its own easy and multi
 * handles, not net_http's pool: a stream does not fit a bounded
 * request/reply client). Its write callback appends to a buffer and parses
 * every complete value in it (jansson's JSON_DISABLE_EOF_CHECK gives the
 * end of the first one); events go to the caller's function, in order,
 * with the revision of their message. The stream ending for any reason
 * (etcd gone or restarted, the watch canceled or compacted, a message
 * larger than NET_ETCD_MAX_REPLY, the watch stopped) is reported once,
 * as a call with no events and a negative errno; the caller then reads the
 * keys again and starts a new watch from the revision it read, so that
 * nothing between the two is missed. An idle watch costs etcd nothing.
 *
 * Threads: the watch's thread calls @fn; net_etcd_watch_stop from any
 * other thread wakes it (curl_multi_wakeup) and joins it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "net/net.h"
#include "net/net_i.h"

struct net_etcd_watch {
	CURLM *multi;
	CURL *easy;
	char url[NET_MAX_URL + 16];
	char *body;
	net_etcd_watch_fn fn;
	void *arg;
	pthread_t thread;
	atomic_int stop;
	int end;   /* the first error seen by the callback (0: none) */
	char *buf; /* bytes of an unfinished message */
	size_t len, cap;
	bool created;
	char why[256];
};

/* One message: its events to the caller. 0, or the error that ends the
 * watch (with w->why). */
static int take_message(struct net_etcd_watch *w, const json_t *msg)
{
	const json_t *res = json_object_get(msg, "result");
	if (!json_is_object(res)) {
		const char *m =
		    json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
		snprintf(w->why, sizeof(w->why), "etcd watch: %s",
			 m ? m : "a message without result");
		return -EIO;
	}
	int64_t rev = net_etcd_jint(json_object_get(res, "header"), "revision", 0);
	if (json_is_true(json_object_get(res, "canceled"))) {
		int64_t compact = net_etcd_jint(res, "compact_revision", 0);
		snprintf(w->why, sizeof(w->why), "etcd watch canceled%s",
			 compact ? " (compacted)" : "");
		return -ESTALE;
	}
	if (json_is_true(json_object_get(res, "created")))
		w->created = true;
	const json_t *evs = json_object_get(res, "events");
	size_t n = json_is_array(evs) ? json_array_size(evs) : 0;
	struct net_etcd_event *ev = calloc(n ? n : 1, sizeof(*ev));
	int rc = ev ? 0 : -ENOMEM;
	size_t got = 0;

	for (size_t i = 0; rc == 0 && i < n; i++, got++) {
		const json_t *e = json_array_get(evs, i);
		const char *type = json_string_value(json_object_get(e, "type"));
		ev[i].deleted = type && strcmp(type, "DELETE") == 0;
		if ((rc = net_etcd_parse_kv(json_object_get(e, "kv"), &ev[i].kv)))
			snprintf(w->why, sizeof(w->why), "etcd watch: an event without a key");
	}
	if (rc == 0 && (n || w->created))
		w->fn(w->arg, ev, n, rev);
	for (size_t i = 0; i < got; i++) {
		free(ev[i].kv.key);
		free(ev[i].kv.value);
	}
	free(ev);
	return rc;
}

/* Whether the last byte of @buf (@len) that is not white space is '}'. */
static bool ends_object(const char *buf, size_t len)
{
	while (len && strchr(" \t\r\n", buf[len - 1]))
		len--;
	return len && buf[len - 1] == '}';
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
	struct net_etcd_watch *w = arg;
	size_t n = size * nmemb;

	if (w->end)
		return 0;
	if (w->len + n > (size_t)NET_ETCD_MAX_REPLY) {
		snprintf(w->why, sizeof(w->why), "etcd watch: a message over %" PRId64 " bytes",
			 NET_ETCD_MAX_REPLY);
		w->end = -EFBIG;
		return 0;
	}
	if (w->len + n + 1 > w->cap) {
		size_t cap = (w->len + n + 1) * 2;
		char *b = realloc(w->buf, cap);
		if (!b) {
			w->end = -ENOMEM;
			return 0;
		}
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	/* A message ends with '}' (and, from etcd's gateway, a newline): the
	 * buffer is parsed only when these bytes may end one, not again from
	 * its start at each piece of a large message (an attempt of 50 KB came
	 * in pieces, and parsing it at each was quadratic). */
	if (!memchr(p, '\n', n) && !ends_object(w->buf, w->len))
		return n;
	/* Every complete value at the front of the buffer. */
	size_t pos = 0;
	while (pos < w->len) {
		while (pos < w->len && strchr(" \t\r\n", w->buf[pos]))
			pos++;
		if (pos == w->len)
			break;
		json_error_t je;
		json_t *msg = json_loadb(w->buf + pos, w->len - pos, JSON_DISABLE_EOF_CHECK, &je);
		if (!msg)
			break; /* incomplete: wait for more */
		int rc = take_message(w, msg);
		json_decref(msg);
		pos += (size_t)je.position;
		if (rc) {
			w->end = rc;
			return 0;
		}
	}
	memmove(w->buf, w->buf + pos, w->len - pos);
	w->len -= pos;
	return n;
}

static void *watch_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-watch"); /* for top -H, perf */
	struct net_etcd_watch *w = arg;
	int running = 1, rc = 0;

	while (running && !atomic_load(&w->stop)) {
		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			rc = -EIO;
			break;
		}
		if (running)
			curl_multi_poll(w->multi, NULL, 0, 1000, NULL);
	}
	if (atomic_load(&w->stop)) {
		rc = -ECANCELED;
		snprintf(w->why, sizeof(w->why), "etcd watch stopped");
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
		if (!rc) {
			rc = -EIO;
			if (code != CURLE_OK)
				snprintf(w->why, sizeof(w->why), "etcd watch: %s",
					 curl_easy_strerror(code));
			else
				snprintf(w->why, sizeof(w->why),
					 "etcd watch: the stream ended (HTTP %ld)", status);
		}
	}
	w->fn(w->arg, NULL, 0, rc);
	return NULL;
}

int net_etcd_watch_start(struct net_etcd *e, const char *prefix, int64_t start_revision,
			 net_etcd_watch_fn fn, void *arg, struct net_etcd_watch **out,
			 struct ptc_error *err)
{
	struct net_etcd_watch *w = calloc(1, sizeof(*w));
	json_t *req = json_object(), *create = json_object();
	int rc = w && req && create ? 0 : -ENOMEM;

	*out = NULL;
	if (rc == 0 && (rc = net_etcd_set_b64(create, "key", prefix, strlen(prefix))) == 0)
		rc = net_etcd_set_prefix_end(create, prefix);
	if (rc == 0 && start_revision > 0 &&
	    json_object_set_new(create, "start_revision", json_integer(start_revision)))
		rc = -ENOMEM;
	if (rc == 0 && json_object_set(req, "create_request", create))
		rc = -ENOMEM;
	if (rc == 0 && !(w->body = json_dumps(req, JSON_COMPACT)))
		rc = -ENOMEM;
	json_decref(create);
	json_decref(req);
	if (rc == 0) {
		snprintf(w->url, sizeof(w->url), "%s/v3/watch", e->base);
		w->fn = fn;
		w->arg = arg;
		w->multi = curl_multi_init();
		w->easy = curl_easy_init();
		if (!w->multi || !w->easy)
			rc = -ENOMEM;
	}
	if (rc == 0) {
		CURL *h = w->easy;
		curl_easy_setopt(h, CURLOPT_URL, w->url);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
		curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
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
	atomic_store(&w->stop, 1);
	curl_multi_wakeup(w->multi);
	pthread_join(w->thread, NULL);
	curl_multi_remove_handle(w->multi, w->easy);
	curl_easy_cleanup(w->easy);
	curl_multi_cleanup(w->multi);
	free(w->body);
	free(w->buf);
	free(w);
}

const char *net_etcd_watch_error(const struct net_etcd_watch *w)
{
	return w->why;
}
