/*
 * net_http.c - the HTTP client: ranged GETs, whole-object GETs and JSON
 * POSTs over libcurl, with retries, a stall timeout and a total deadline.
 *
 * DESIGN
 * Threads: a call runs on its caller's thread, start to end (curl's easy
 * interface, blocking); any number of threads call one client at once.
 * c->lock guards the pool of idle handles only, and is never held across
 * I/O or a sleep. Counters are atomics. Options and the header list are
 * read-only after net_http_new.
 *
 * Connection reuse: a call takes an easy handle from the client's pool
 * (or makes one) and gives it back when done; curl_easy_reset between
 * attempts keeps a handle's live connections, so the next call to the same
 * host reuses one (keep-alive, no new TCP or TLS handshake). A handle's
 * connections are its own, so the pool hands out, when it has one, the
 * idle handle whose last call went to the same host (scheme, host and
 * port): with many hosts (a job of 32 nodes asking each for its job/
 * manifest at once), taking whichever handle came last opened a new
 * connection for most calls. At most opts.max_idle handles wait in the
 * pool; more are cleaned up, closing their connections. (A curl share of
 * the connection cache is not supported across concurrent threads.)
 *
 * Parsing: libcurl hands over header lines and body chunks; the reply
 * parser (net_http_parse.c, pure and fuzzed) says what each means. Body
 * bytes are written only into memory sized from the request: a range's
 * iovecs, or a buffer of at most max bytes; never sized from the reply.
 *
 * Checksums: a ranged GET with verify hashes its body (XXH3) as it arrives,
 * while the bytes are in the cache, and compares it with the reply's
 * X-Mlfs-XXH3 (parsed by net_http_parse.c) once the reply is whole; a
 * mismatch is a failed attempt, retried like a short reply.
 *
 * Retry and deadline policy: an attempt fails when nothing arrives for
 * timeout_ms (the stamp of the last header or body bytes, checked by curl's
 * progress callback about once a second while idle), not after a fixed
 * total, so a large range from a slow server that keeps sending is not
 * cut. A call has a deadline (start + deadline_ms), which caps each
 * attempt (CURLOPT_TIMEOUT), the backoff sleeps and the retries. Failed
 * attempts that another may not meet (connection errors, stalls, 5xx, 408,
 * 429, short or wrong replies) are retried after backoff_ms, doubled each
 * time up to max_backoff_ms, until retries are spent or the deadline
 * leaves no room for the next sleep; a POST not marked idempotent only
 * when it cannot have reached the server. A stop flag, checked before
 * each retry and by the progress callback during an attempt (at least
 * about once a second, even while nothing arrives), ends a call early
 * (-ECANCELED): an abort never waits for a hung server.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <xxhash.h>

#include "net/net.h"
#include "net/net_i.h"

#define NET_MAX_RETRIES 100
#define NET_DEF_IDLE	64
/* An HTTP/2 connection idle longer is not asked for again (libcurl closes
 * those idle for 118 s: CURLOPT_MAXAGE_CONN) */
#define NET_H2_REUSE_NS ((int64_t)60 * 1000000000)
#define NET_MAX_IDLE	1024
/* Bytes of an error reply's body quoted in a POST's message. */
#define NET_ERR_BODY 160

struct net_http {
	struct net_http_opts o;	 /* defaults applied; o.headers unused (see hdrs) */
	struct curl_slist *hdrs; /* opts.headers, or NULL; read-only after new */
	pthread_mutex_t lock;	 /* guards pool, origin and npool */
	CURL **pool;		 /* idle handles, each may hold live connections */
	char **origin;		 /* pool[i]'s last call's origin (url_origin; owned) */
	int64_t *h2_ns;		 /* pool[i]'s HTTP/2 connection there: when last used (0: none) */
	int npool;
	_Atomic int64_t requests, retries, failures, bytes;
};

enum xfer_kind { X_RANGE, X_WHOLE, X_POST };

/* One call: the request, where its body goes, and the current attempt. */
struct xfer {
	enum xfer_kind kind;
	struct net_reply rep;
	/* X_RANGE: the iovecs, and where the next byte goes (at rep.got) */
	const struct iovec *iov;
	int iovcnt, cur;
	size_t cur_off;
	int64_t cur_pos;
	/* X_WHOLE, X_POST: the body kept (cap + 1 bytes allocated, for a NUL) */
	uint8_t *buf;
	size_t cap;
	/* X_POST: the request body, and the start of an error reply's body */
	const void *body;
	size_t body_len;
	char errbody[NET_ERR_BODY + 1];
	size_t errbody_len;
	/* the attempt */
	int fail_rc; /* set by a callback that aborted the transfer */
	struct ptc_error fail;
	int64_t last_ns;  /* when the attempt began or last received bytes */
	int64_t stall_ns; /* an attempt that receives nothing this long fails */
	bool stalled;	  /* this attempt did (a silent server, not a gone one) */
	int64_t size;	  /* the object's size from a successful reply, or -1 */
	atomic_int *stop; /* the call's stop flag: ends the attempt in flight too */
	XXH3_state_t *xs; /* X_RANGE with verify: the body's hash so far */
	/* a gRPC call (net_http_post_grpc): the status and message of the
	 * reply's trailers (-1: none yet) */
	bool grpc;
	long grpc_status;
	char grpc_msg[160];
	bool h2_reuse;	 /* this attempt reuses the handle's HTTP/2 connection */
	long h2_version; /* the HTTP version the attempt's reply came in */
};

/* ---------------------------------------------------------------- helpers */

/* Writes "@url: <fmt>" to @err (code @rc) and returns @rc. */
__attribute__((format(printf, 4, 5))) static int fail_url(struct ptc_error *err, int rc,
							  const char *url, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!err)
		return rc;
	n = snprintf(err->text, sizeof(err->text), "%s: ", url);
	if (n >= 0 && (size_t)n < sizeof(err->text)) {
		va_start(ap, fmt);
		vsnprintf(err->text + n, sizeof(err->text) - (size_t)n, fmt, ap);
		va_end(ap);
	}
	err->code = rc;
	return rc;
}

static void stat_add(_Atomic int64_t *c, int64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

int64_t net_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void net_sleep_ms(int64_t ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

int net_url_check(const char *url, struct ptc_error *err)
{
	const char *rest;

	if (err) {
		err->text[0] = 0;
		err->code = 0;
	}
	if (!url)
		return fail_url(err, -EINVAL, "(null)", "no URI");
	if (strnlen(url, NET_MAX_URL + 1) > NET_MAX_URL)
		return ptc_error_set(err, -EINVAL, "%.64s...: URI longer than %d bytes", url,
				     NET_MAX_URL);
	if (!strncasecmp(url, "http://", 7))
		rest = url + 7;
	else if (!strncasecmp(url, "https://", 8))
		rest = url + 8;
	else
		return fail_url(err, -EINVAL, url,
				"unsupported URI (http:// or https:// expected)");
	if (!*rest || *rest == '/' || *rest == '?' || *rest == '#')
		return fail_url(err, -EINVAL, url, "URI without a host");
	for (const char *p = url; *p; p++)
		if ((uint8_t)*p <= 0x20 || (uint8_t)*p == 0x7f)
			return fail_url(err, -EINVAL, url,
					"URI holds a space or control character");
	return 0;
}

/* ----------------------------------------------------------------- client */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Whether @h is "Name: value" with a token name and no CR, LF or NUL. */
static bool header_ok(const char *h)
{
	size_t name = strcspn(h, ":");

	if (!name || !h[name])
		return false;
	for (size_t i = 0; i < name; i++)
		if ((uint8_t)h[i] <= 0x20 || (uint8_t)h[i] >= 0x7f)
			return false;
	return !strpbrk(h, "\r\n");
}

int net_http_new(const struct net_http_opts *opts, struct net_http **out, struct ptc_error *err)
{
	struct net_http_opts o = opts ? *opts : (struct net_http_opts){0};
	struct net_http *c;

	*out = NULL;
	if (err) {
		err->text[0] = 0;
		err->code = 0;
	}
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_rc != CURLE_OK)
		return fail_url(err, -EIO, "libcurl", "%s", curl_easy_strerror(curl_init_rc));
	if (o.retries < 0)
		o.retries = NET_DEF_RETRIES;
	if (o.retries > NET_MAX_RETRIES)
		o.retries = NET_MAX_RETRIES;
	if (o.timeout_ms <= 0)
		o.timeout_ms = NET_DEF_TIMEOUT;
	if (o.deadline_ms <= 0)
		o.deadline_ms = NET_DEF_DEADLINE;
	if (o.backoff_ms <= 0)
		o.backoff_ms = NET_DEF_BACKOFF;
	if (o.max_backoff_ms <= 0)
		o.max_backoff_ms = NET_DEF_MAX_BACKOFF;
	if (o.max_idle <= 0)
		o.max_idle = NET_DEF_IDLE;
	if (o.max_idle > NET_MAX_IDLE)
		o.max_idle = NET_MAX_IDLE;

	if (!(c = calloc(1, sizeof(*c))) ||
	    !(c->pool = calloc((size_t)o.max_idle, sizeof(CURL *))) ||
	    !(c->origin = calloc((size_t)o.max_idle, sizeof(char *))) ||
	    !(c->h2_ns = calloc((size_t)o.max_idle, sizeof(int64_t))))
		goto err_nomem;
	for (const char *const *h = o.headers; h && *h; h++) {
		struct curl_slist *l;
		if (!header_ok(*h)) {
			net_http_free(c);
			return fail_url(err, -EINVAL, "net_http_opts.headers",
					"\"%.64s\" is not \"Name: value\" on one line", *h);
		}
		if (!(l = curl_slist_append(c->hdrs, *h)))
			goto err_nomem;
		c->hdrs = l;
	}
	o.headers = NULL;
	c->o = o;
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;

err_nomem:
	if (c) {
		curl_slist_free_all(c->hdrs);
		free(c->pool);
		free(c->origin);
		free(c->h2_ns);
		free(c);
	}
	return fail_url(err, -ENOMEM, "net_http_new", "out of memory");
}

void net_http_free(struct net_http *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->npool; i++) {
		curl_easy_cleanup(c->pool[i]);
		free(c->origin[i]);
	}
	curl_slist_free_all(c->hdrs);
	free(c->pool);
	free(c->origin);
	free(c->h2_ns);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

void net_http_stats(struct net_http *c, struct net_http_stats *out)
{
	out->requests = atomic_load(&c->requests);
	out->retries = atomic_load(&c->retries);
	out->failures = atomic_load(&c->failures);
	out->bytes = atomic_load(&c->bytes);
}

/* The length of @url's origin: "scheme://host[:port]", up to the path. */
static size_t url_origin(const char *url)
{
	const char *p = strstr(url, "://");
	p = p ? p + 3 : url;
	return (size_t)(p + strcspn(p, "/?#") - url);
}

/* An idle handle, the one whose last call went to @url's origin when the
 * pool has it (its connection there is reused), else the newest; *@h2_ns
 * says when its HTTP/2 connection there was last used (0: none). */
static CURL *pool_get(struct net_http *c, const char *url, int64_t *h2_ns)
{
	CURL *h = NULL;
	size_t n = url_origin(url);

	*h2_ns = 0;
	pthread_mutex_lock(&c->lock);
	if (c->npool) {
		int i = c->npool - 1;
		for (int j = c->npool - 1; j >= 0; j--)
			if (c->origin[j] && strlen(c->origin[j]) == n &&
			    memcmp(c->origin[j], url, n) == 0) {
				i = j;
				*h2_ns = c->h2_ns[j];
				break;
			}
		h = c->pool[i];
		free(c->origin[i]);
		c->npool--;
		c->pool[i] = c->pool[c->npool];
		c->origin[i] = c->origin[c->npool];
		c->h2_ns[i] = c->h2_ns[c->npool];
	}
	pthread_mutex_unlock(&c->lock);
	return h ? h : curl_easy_init();
}

/* Gives back @h, whose last call went to @url (its HTTP/2 connection
 * there last used at @h2_ns; 0: none). */
static void pool_put(struct net_http *c, CURL *h, const char *url, int64_t h2_ns)
{
	char *origin = strndup(url, url_origin(url)); /* NULL: matches nothing */

	pthread_mutex_lock(&c->lock);
	if (c->npool < c->o.max_idle) {
		c->pool[c->npool] = h;
		c->h2_ns[c->npool] = h2_ns;
		c->origin[c->npool++] = origin;
		h = NULL;
		origin = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	free(origin);
	if (h)
		curl_easy_cleanup(h);
}

/* -------------------------------------------------------- curl callbacks */

static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	int rc;

	x->last_ns = net_now_ns();
	if (x->grpc)
		net_grpc_trailer(line, size * n, &x->grpc_status, x->grpc_msg, sizeof(x->grpc_msg));
	rc = net_reply_header(&x->rep, line, size * n, &x->fail);
	if (rc == NET_HEADER_STATUS)
		x->errbody_len = 0; /* a new reply */
	if (rc < 0) {
		x->fail_rc = rc;
		return 0;
	}
	return size * n;
}

/* Copies @n bytes to the iovecs from byte @pos of the range on. */
static void scatter(struct xfer *x, int64_t pos, const char *data, size_t n)
{
	if (pos != x->cur_pos) { /* a new reply started over: find @pos */
		x->cur = 0;
		x->cur_off = 0;
		for (x->cur_pos = 0;
		     x->cur < x->iovcnt && x->cur_pos + (int64_t)x->iov[x->cur].iov_len <= pos;
		     x->cur++)
			x->cur_pos += (int64_t)x->iov[x->cur].iov_len;
		x->cur_off = (size_t)(pos - x->cur_pos);
		x->cur_pos = pos;
	}
	while (n) {
		/* net_reply_body kept the reply within the range: iovecs remain */
		assert(x->cur < x->iovcnt);
		size_t room = x->iov[x->cur].iov_len - x->cur_off, k = room < n ? room : n;
		memcpy((char *)x->iov[x->cur].iov_base + x->cur_off, data, k);
		data += k;
		n -= k;
		x->cur_pos += (int64_t)k;
		if ((x->cur_off += k) == x->iov[x->cur].iov_len) {
			x->cur++;
			x->cur_off = 0;
		}
	}
}

/* Appends @n bytes at byte @pos of the object to x->buf, growing it. */
static bool keep(struct xfer *x, int64_t pos, const char *data, size_t n)
{
	size_t want = (size_t)pos + n;

	if (want > x->cap) {
		size_t cap = x->cap * 2;
		if (cap < 65536)
			cap = 65536;
		if (x->rep.have_clen && (uint64_t)x->rep.clen > cap)
			cap = (size_t)x->rep.clen;
		if (cap < want)
			cap = want;
		if ((uint64_t)cap > (uint64_t)x->rep.max)
			cap = (size_t)x->rep.max; /* >= want: net_reply_body checked */
		uint8_t *buf = realloc(x->buf, cap + 1);
		if (!buf)
			return false;
		x->buf = buf;
		x->cap = cap;
	}
	memcpy(x->buf + pos, data, n);
	return true;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct xfer *x = arg;
	size_t n = size * nmemb, k;
	int64_t pos = x->rep.got;
	int rc = net_reply_body(&x->rep, n, &x->fail);

	x->last_ns = net_now_ns();
	if (rc == NET_BODY_DROP) {
		/* An error page: a POST quotes its start (a JSON API says why there). */
		k = NET_ERR_BODY - x->errbody_len < n ? NET_ERR_BODY - x->errbody_len : n;
		if (x->kind == X_POST && k) {
			memcpy(x->errbody + x->errbody_len, data, k);
			x->errbody_len += k;
		}
		return n;
	}
	if (rc < 0) {
		x->fail_rc = rc;
		return 0;
	}
	if (x->kind == X_RANGE) {
		scatter(x, pos, data, n);
		if (x->xs) /* hashed as it arrives, while in the cache */
			XXH3_64bits_update(x->xs, data, n);
	} else if (!keep(x, pos, data, n)) {
		x->fail_rc = ptc_error_set(&x->fail, -ENOMEM, "out of memory");
		return 0;
	}
	return n;
}

/* curl's progress callback: fails an attempt that received nothing for x->stall_ns. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
		       curl_off_t ulnow)
{
	struct xfer *x = arg;

	(void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
	if (x->stop && atomic_load(x->stop)) {
		x->fail_rc = ptc_error_set(&x->fail, -ECANCELED, "cancelled");
		return 1;
	}
	if (net_now_ns() - x->last_ns < x->stall_ns)
		return 0;
	x->fail_rc = ptc_error_set(&x->fail, -EIO, "timed out (nothing received for %g s)",
				   (double)x->stall_ns / 1e9);
	x->stalled = true;
	return 1;
}

/* ----------------------------------------------------------------- attempts */

static bool curl_retryable(CURLcode res)
{
	switch (res) {
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_FAILED_INIT:
	case CURLE_URL_MALFORMAT:
	case CURLE_NOT_BUILT_IN:
	case CURLE_OUT_OF_MEMORY:
	case CURLE_BAD_FUNCTION_ARGUMENT:
	case CURLE_TOO_MANY_REDIRECTS:
	case CURLE_UNKNOWN_OPTION:
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_LOGIN_DENIED:
		return false;
	default:
		return true;
	}
}

/* Whether a request that failed with @res cannot have reached the server. */
static bool curl_unsent(CURLcode res)
{
	return res == CURLE_COULDNT_CONNECT || res == CURLE_COULDNT_RESOLVE_HOST ||
	       res == CURLE_COULDNT_RESOLVE_PROXY;
}

/* Appends ": <the start of the error reply's body>" to @err's text, one line. */
static void quote_errbody(const struct xfer *x, struct ptc_error *err)
{
	char *msg = err->text;
	size_t n = strlen(msg), k = x->errbody_len;

	while (k && (uint8_t)x->errbody[k - 1] <= 0x20)
		k--;
	if (!k || n + 3 >= sizeof(err->text))
		return;
	msg[n++] = ':';
	msg[n++] = ' ';
	for (size_t i = 0; i < k && n + 1 < sizeof(err->text); i++) {
		uint8_t ch = (uint8_t)x->errbody[i];
		msg[n++] = ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
	}
	msg[n] = 0;
}

/* Judges a finished attempt; @err gets the reason of a failure (its code *@rc). */
static enum net_verdict judge(struct xfer *x, CURLcode res, const char *errbuf, bool idempotent,
			      int *rc, struct ptc_error *err)
{
	enum net_verdict v;
	bool unsent = false;

	*rc = -EIO;
	if (x->fail_rc) {
		*rc = x->fail_rc;
		ptc_error_set(err, *rc, "%s", x->fail.text);
		v = x->fail_rc == -EIO ? NET_RETRY : NET_FATAL;
	} else if (res != CURLE_OK) {
		if (res == CURLE_OUT_OF_MEMORY)
			*rc = -ENOMEM;
		ptc_error_set(err, *rc, "%s", errbuf[0] ? errbuf : curl_easy_strerror(res));
		v = curl_retryable(res) ? NET_RETRY : NET_FATAL;
		unsent = curl_unsent(res);
	} else {
		v = net_reply_end(&x->rep, &x->size, err);
		if (v != NET_OK && x->kind == X_POST)
			quote_errbody(x, err);
		unsent = x->rep.status == 429;
		if (x->grpc && x->h2_version != CURL_HTTP_VERSION_2_0 &&
		    x->h2_version != CURL_HTTP_VERSION_NONE && x->rep.status != 0) {
			/* a reused connection was gone: the HTTP/1.1 request
			 * went to another server on that port, and did nothing */
			ptc_error_set(err, -EIO, "HTTP %ld over HTTP/1.x, not a gRPC reply",
				      x->rep.status);
			*rc = -EIO;
			return NET_RETRY;
		}
		if (v == NET_OK && x->grpc && x->grpc_status != 0) {
			/* 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED: another attempt
			 * may meet them */
			if (x->grpc_status < 0)
				ptc_error_set(err, -EIO, "no gRPC status (the reply was cut)");
			else
				ptc_error_set(err, -EIO, "gRPC status %ld: %s", x->grpc_status,
					      x->grpc_msg[0] ? x->grpc_msg : "(no message)");
			*rc = err->code;
			v = x->grpc_status < 0 || x->grpc_status == 14 || x->grpc_status == 4
				? NET_RETRY
				: NET_FATAL;
		}
	}
	if (v == NET_RETRY && !idempotent && !unsent)
		v = NET_FATAL; /* it may have been carried out: not twice */
	return v;
}

/* Sets up @h for an attempt of @x that may take @left_ms at most. */
static void setup(struct net_http *c, CURL *h, const char *url, struct xfer *x,
		  struct curl_slist *hdrs, const char *range, char *errbuf, int64_t left_ms)
{
	/* Reset keeps the handle's live connections. */
	curl_easy_reset(h);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)(left_ms < c->o.timeout_ms ? left_ms : c->o.timeout_ms));
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left_ms);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
	curl_easy_setopt(h, CURLOPT_FAILONERROR, 0L);
	/* A POST that moved is an error: following it would re-send it as a GET. */
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, x->kind == X_POST ? 0L : 1L);
	curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
	curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	if (c->o.direct) /* "": no proxy, whatever the environment says */
		curl_easy_setopt(h, CURLOPT_PROXY, "");
	curl_easy_setopt(h, CURLOPT_USERAGENT, "mlfs");
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
	if (hdrs)
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	if (range)
		curl_easy_setopt(h, CURLOPT_RANGE, range);
	if (x->grpc && strncasecmp(url, "https:", 6) == 0) {
		curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
	} else if (x->grpc && x->h2_reuse) {
		/* Its live HTTP/2 connection, asked for as "HTTP/2": libcurl
		 * 7.88 (Debian 12's) fails a reused connection asked for with
		 * prior knowledge ("Error in the HTTP2 framing layer", curl
		 * issue 10634, fixed in 7.89). Were that connection gone, this
		 * asks with HTTP/1.1 and an upgrade, which etcd's port answers
		 * from its gateway (a 404): judge retries it anew. */
		curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2_0);
	} else if (x->grpc) { /* h2c from the first byte, on a new connection */
		curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
				 (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
		curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
	}
	if (x->kind == X_POST) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body_len);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, x->body ? x->body : "");
	}
}

/* The headers of a POST: the client's, the content type, no "Expect:
 * 100-continue"; a gRPC call's say so and that trailers are read. */
static struct curl_slist *post_headers(const struct net_http *c, bool grpc)
{
	struct curl_slist *l = NULL, *t;
	static const char *const json[] = {"Content-Type: application/json", "Expect:"};
	static const char *const rpc[] = {"Content-Type: application/grpc", "TE: trailers",
					  "Expect:"};
	const char *const *own = grpc ? rpc : json;
	size_t nown = grpc ? 3 : 2;

	for (const struct curl_slist *h = c->hdrs; h; h = h->next) {
		if (!(t = curl_slist_append(l, h->data)))
			goto err_free;
		l = t;
	}
	for (size_t i = 0; i < nown; i++) {
		if (!(t = curl_slist_append(l, own[i])))
			goto err_free;
		l = t;
	}
	return l;

err_free:
	curl_slist_free_all(l);
	return NULL;
}

/*
 * Runs attempts of transfer @x of @url until one succeeds, one fails for
 * good, the retries are spent or the call's deadline comes; stops retrying
 * once *call->stop is set (-ECANCELED). On failure @err names @url and the
 * reason.
 */
static int run(struct net_http *c, const char *url, struct xfer *x,
	       const struct net_http_call *call, struct ptc_error *err)
{
	char errbuf[CURL_ERROR_SIZE], range[48];
	struct ptc_error msg = {.text = ""}, prev;
	int deadline_ms = call && call->deadline_ms > 0 ? call->deadline_ms : c->o.deadline_ms;
	int64_t start = call && call->start_ns ? call->start_ns : net_now_ns();
	int64_t deadline = start + (int64_t)deadline_ms * 1000000;
	int64_t delay = c->o.backoff_ms, left_ms;
	atomic_int *stop = call ? call->stop : NULL;
	bool idempotent = x->kind != X_POST || (call && call->idempotent);
	bool late = false; /* the deadline stopped the attempts */
	enum net_verdict res = NET_FATAL;
	struct curl_slist *hdrs = c->hdrs;
	int rc = -EIO, att;
	CURL *h;

	if (call && call->retryable)
		*call->retryable = false;
	if ((left_ms = (deadline - net_now_ns()) / 1000000) <= 0)
		return fail_url(err, -EIO, url,
				"timed out before its request, deadline of %g s reached",
				deadline_ms / 1e3);
	if (x->kind == X_POST && !(hdrs = post_headers(c, x->grpc)))
		return fail_url(err, -ENOMEM, url, "out of memory");
	int64_t h2_ns = 0;
	if (!(h = pool_get(c, url, &h2_ns))) {
		if (hdrs != c->hdrs)
			curl_slist_free_all(hdrs);
		return fail_url(err, -ENOMEM, url, "out of memory");
	}
	if (x->kind == X_RANGE)
		snprintf(range, sizeof(range), "%" PRId64 "-%" PRId64, x->rep.a, x->rep.b);
	bool at_once = false; /* the next attempt: no backoff, no retry spent */
	for (att = 0;; att++) {
		if (at_once) {
			at_once = false;
		} else if (att > 0) {
			if (stop && atomic_load(stop)) {
				rc = -ECANCELED;
				break;
			}
			left_ms = (deadline - net_now_ns()) / 1000000;
			if (left_ms <= delay) {
				late = true;
				break;
			}
			net_sleep_ms(delay);
			left_ms -= delay;
			delay = delay * 2 > c->o.max_backoff_ms ? c->o.max_backoff_ms : delay * 2;
			stat_add(&c->retries, 1);
		}
		net_reply_init(&x->rep, x->rep.a, x->rep.b, x->rep.max);
		x->grpc_status = -1;
		x->grpc_msg[0] = '\0';
		x->fail_rc = 0;
		x->fail.text[0] = 0;
		x->fail.code = 0;
		x->errbody_len = 0;
		x->size = -1;
		x->last_ns = net_now_ns();
		x->stall_ns = (int64_t)c->o.timeout_ms * 1000000;
		x->stalled = false;
		x->stop = stop;
		if (x->xs)
			XXH3_64bits_reset(x->xs);
		errbuf[0] = 0;
		x->h2_reuse = h2_ns && net_now_ns() - h2_ns < NET_H2_REUSE_NS;
		int64_t cap_ms = call && call->attempt_ms > 0 && call->attempt_ms < left_ms
				     ? call->attempt_ms
				     : left_ms;
		setup(c, h, url, x, hdrs, x->kind == X_RANGE ? range : NULL, errbuf, cap_ms);
		stat_add(&c->requests, 1);
		CURLcode cres = curl_easy_perform(h);
		x->h2_version = CURL_HTTP_VERSION_NONE;
		curl_easy_getinfo(h, CURLINFO_HTTP_VERSION, &x->h2_version);
		h2_ns =
		    cres == CURLE_OK && x->h2_version == CURL_HTTP_VERSION_2_0 ? net_now_ns() : 0;
		if (x->fail_rc == -ECANCELED) {
			rc = -ECANCELED;
			break;
		}
		prev = msg;
		res = judge(x, cres, errbuf, idempotent, &rc, &msg);
		if (res == NET_OK && x->xs) {
			uint64_t got = XXH3_64bits_digest(x->xs);
			if (!x->rep.have_sum) {
				res = NET_FATAL;
				rc = ptc_error_set(&msg, -EIO,
						   "no checksum (X-Mlfs-XXH3) in the reply");
			} else if (got != x->rep.sum) {
				res = NET_RETRY; /* corrupted on the way: asked again */
				rc = ptc_error_set(&msg, -EIO,
						   "checksum mismatch: the %" PRId64
						   " bytes received hash to %016" PRIx64
						   ", the sender's XXH3 is %016" PRIx64,
						   x->rep.got, got, x->rep.sum);
			}
		}
		if (res == NET_RETRY && cres == CURLE_OPERATION_TIMEDOUT &&
		    deadline - net_now_ns() < 10 * 1000000) {
			/* Cut by the deadline: the reason is the attempts before. */
			if (att)
				msg = prev;
			else
				ptc_error_set(&msg, rc, "timed out");
			late = true;
			break;
		}
		if (res == NET_RETRY && x->h2_reuse && !h2_ns && cres != CURLE_OPERATION_TIMEDOUT &&
		    !x->stalled) {
			/* the handle's HTTP/2 connection was gone (a restarted
			 * etcd): again at once, on a new one */
			at_once = true;
			att--;
			continue;
		}
		if (res != NET_RETRY || att >= c->o.retries)
			break;
	}
	pool_put(c, h, url, h2_ns);
	if (hdrs != c->hdrs)
		curl_slist_free_all(hdrs);
	if (call && call->retryable)
		*call->retryable = res == NET_RETRY && rc != -ECANCELED && !late;
	if (rc == -ECANCELED)
		return fail_url(err, rc, url, "cancelled");
	if (res == NET_OK) {
		stat_add(&c->bytes, x->rep.got);
		return 0;
	}
	stat_add(&c->failures, 1);
	if (late)
		return fail_url(err, rc, url, "%s after %d attempt%s, deadline of %g s reached",
				msg.text, att + 1, att ? "s" : "", deadline_ms / 1e3);
	if (res == NET_RETRY || att > 0)
		return fail_url(err, rc, url, "%s after %d attempt%s", msg.text, att + 1,
				att ? "s" : "");
	return fail_url(err, rc, url, "%s", msg.text);
}

/* ------------------------------------------------------------------- calls */

int net_http_get_range(struct net_http *c, const char *url, struct net_http_range *r,
		       const struct net_http_call *call, struct ptc_error *err)
{
	struct xfer x = {.kind = X_RANGE, .iov = r->iov, .iovcnt = r->iovcnt};
	int64_t sum = 0;
	int rc;

	r->got = 0;
	r->size = -1;
	if ((rc = net_url_check(url, err)))
		return rc;
	if (r->off < 0 || r->len <= 0 || r->off > INT64_MAX - r->len || !r->iov || r->iovcnt <= 0)
		return fail_url(err, -EINVAL, url,
				"bad range (offset %" PRId64 ", length %" PRId64 ", %d buffers)",
				r->off, r->len, r->iovcnt);
	for (int i = 0; i < r->iovcnt; i++) {
		if ((r->iov[i].iov_len && !r->iov[i].iov_base) ||
		    r->iov[i].iov_len > (uint64_t)(r->len - sum))
			return fail_url(err, -EINVAL, url,
					"buffers do not hold the %" PRId64 " bytes asked", r->len);
		sum += (int64_t)r->iov[i].iov_len;
	}
	if (sum != r->len)
		return fail_url(err, -EINVAL, url,
				"buffers do not hold the %" PRId64 " bytes asked", r->len);
	net_reply_init(&x.rep, r->off, r->off + r->len - 1, r->len);
	if (r->verify && !(x.xs = XXH3_createState()))
		return fail_url(err, -ENOMEM, url, "out of memory");
	rc = run(c, url, &x, call, err);
	if (rc == 0 && x.xs)
		r->sum = x.rep.sum;
	XXH3_freeState(x.xs);
	if (rc)
		return rc;
	r->got = x.rep.got;
	r->size = x.size;
	return 0;
}

/* Runs whole-object transfer @x; hands its body to *@data and *@len. */
static int run_whole(struct net_http *c, const char *url, struct xfer *x, int64_t max,
		     uint8_t **data, size_t *len, const struct net_http_call *call,
		     struct ptc_error *err)
{
	int rc;

	*data = NULL;
	*len = 0;
	if (max < 0)
		return fail_url(err, -EINVAL, url, "negative size bound");
	net_reply_init(&x->rep, -1, -1, max);
	if ((rc = run(c, url, x, call, err))) {
		free(x->buf);
		return rc;
	}
	if (!x->buf && !(x->buf = malloc(1)))
		return fail_url(err, -ENOMEM, url, "out of memory");
	x->buf[x->rep.got] = 0;
	*data = x->buf;
	*len = (size_t)x->rep.got;
	return 0;
}

int net_http_get(struct net_http *c, const char *url, int64_t max, uint8_t **data, size_t *len,
		 const struct net_http_call *call, struct ptc_error *err)
{
	struct xfer x = {.kind = X_WHOLE};
	int rc;

	*data = NULL;
	*len = 0;
	if ((rc = net_url_check(url, err)))
		return rc;
	return run_whole(c, url, &x, max, data, len, call, err);
}

int net_http_post_json(struct net_http *c, const char *url, const void *body, size_t body_len,
		       int64_t max, uint8_t **data, size_t *len, const struct net_http_call *call,
		       struct ptc_error *err)
{
	struct xfer x = {.kind = X_POST, .body = body, .body_len = body_len};
	int rc;

	*data = NULL;
	*len = 0;
	if ((rc = net_url_check(url, err)))
		return rc;
	if (body_len && !body)
		return fail_url(err, -EINVAL, url, "no body");
	return run_whole(c, url, &x, max, data, len, call, err);
}

int net_http_post_grpc(struct net_http *c, const char *url, const void *msg, size_t msg_len,
		       int64_t max, uint8_t **data, size_t *len, const struct net_http_call *call,
		       struct ptc_error *err)
{
	struct xfer x = {.kind = X_POST, .grpc = true};
	uint8_t *body, *reply;
	size_t body_len, n;
	int rc;

	*data = NULL;
	*len = 0;
	if ((rc = net_url_check(url, err)))
		return rc;
	if ((rc = net_grpc_frame(msg, msg_len, &body, &body_len)))
		return fail_url(err, rc, url, "%s", strerror(-rc));
	x.body = body;
	x.body_len = body_len;
	rc = run_whole(c, url, &x, max + 5, &reply, &n, call, err);
	free(body);
	if (rc)
		return rc;
	/* one message: a flag (0: not compressed), its length, its bytes */
	if (n < 5 || reply[0] != 0 || net_grpc_length(reply) != n - 5) {
		free(reply);
		return fail_url(err, -EIO, url, "not one gRPC message (%zu bytes)", n);
	}
	memmove(reply, reply + 5, n - 5);
	reply[n - 5] = '\0';
	*data = reply;
	*len = n - 5;
	return 0;
}
