/*
 * net_server.c - the HTTP server of a node for its peers (libmicrohttpd):
 * authentication, request bounds, and replies that stream from the
 * caller's memory.
 *
 * DESIGN
 * The server knows nothing of tensors: it authenticates every request
 * (Authorization: Bearer <cluster token>, compared in constant time;
 * anything else gets 401 and nothing more, whatever the path), bounds it
 * (method GET or POST, a path of printable ASCII without "..", a query of
 * at most NET_SERVER_MAX_ARGS arguments, a POST body of at most
 * opts.max_body bytes), and hands it to one handler, which answers with
 * net_reply_*: a small buffer, a one-line error, or a stream that the
 * server pulls in pieces from a read callback, so a reply of gigabytes
 * (rows of a partition gathered from a strided layout) needs no copy of
 * itself.
 *
 * It binds to the address it is given ("10.0.0.5:7070"), never to every
 * interface unless that address is 0.0.0.0. Threads: a pool of
 * opts.threads threads (epoll), each running the handler of its
 * connections; handlers may run at once and must be thread-safe.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "net/net.h"

struct net_server {
	struct MHD_Daemon *mhd;
	net_handler_fn handler;
	void *arg;
	char *token;
	size_t token_len;
	size_t max_body;
	int port;
	_Atomic int64_t requests, refused;
};

/* One request while its handler runs. */
struct net_request {
	struct net_server *s;
	struct MHD_Connection *conn;
	const char *method, *path;
	const char *body;
	size_t body_len;
	bool replied;
	enum MHD_Result result;
	int nhdr; /* headers added to the reply (net_reply_header) */
	char hname[4][64], hvalue[4][200];
};

/* A POST body being received. */
struct body {
	char *data;
	size_t len;
	bool too_big;
};

static bool same_token(const struct net_server *s, const char *got)
{
	const char *p = "Bearer ";
	size_t n = got ? strlen(got) : 0;
	if (n < 7 || strncmp(got, p, 7) != 0)
		return false;
	got += 7;
	n -= 7;
	/* Constant time in the token's length: no early exit on a mismatch. */
	unsigned char diff = (unsigned char)(n != s->token_len);
	for (size_t i = 0; i < s->token_len; i++)
		diff |= (unsigned char)(s->token[i] ^ (i < n ? got[i] : 0));
	return diff == 0;
}

static bool path_ok(const char *p)
{
	if (p[0] != '/' || strlen(p) > 1024 || strstr(p, ".."))
		return false;
	for (; *p; p++)
		if (*p < 0x21 || *p > 0x7e)
			return false;
	return true;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *text)
{
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", "text/plain");
	enum MHD_Result res = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return res;
}

static enum MHD_Result count_arg(void *cls, enum MHD_ValueKind kind, const char *key,
				 const char *value)
{
	(void)kind, (void)key, (void)value;
	(*(int *)cls)++;
	return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct net_server *s = cls;
	struct body *b = *con_cls;
	(void)version;

	if (!b) { /* first call: headers only */
		if (!(b = calloc(1, sizeof(*b))))
			return MHD_NO;
		*con_cls = b;
		return MHD_YES;
	}
	if (*upload_size) { /* a piece of the body */
		if (b->len + *upload_size > s->max_body) {
			b->too_big = true;
		} else if (!b->too_big) {
			char *d = realloc(b->data, b->len + *upload_size + 1);
			if (!d)
				return MHD_NO;
			memcpy(d + b->len, upload, *upload_size);
			b->data = d;
			b->len += *upload_size;
			d[b->len] = '\0';
		}
		*upload_size = 0;
		return MHD_YES;
	}
	atomic_fetch_add(&s->requests, 1);
	const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
	if (!same_token(s, auth)) {
		atomic_fetch_add(&s->refused, 1);
		return send_text(conn, MHD_HTTP_UNAUTHORIZED, "unauthorized\n");
	}
	if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0)
		return send_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and POST\n");
	if (!path_ok(url))
		return send_text(conn, MHD_HTTP_BAD_REQUEST, "bad path\n");
	int nargs = 0;
	MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, count_arg, &nargs);
	if (nargs > NET_SERVER_MAX_ARGS)
		return send_text(conn, MHD_HTTP_BAD_REQUEST, "too many arguments\n");
	if (b->too_big)
		return send_text(conn, MHD_HTTP_CONTENT_TOO_LARGE, "body too large\n");
	struct net_request r = {.s = s,
				.conn = conn,
				.method = method,
				.path = url,
				.body = b->data ? b->data : "",
				.body_len = b->len,
				.result = MHD_NO};
	s->handler(s->arg, &r);
	if (!r.replied)
		return send_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "no reply\n");
	return r.result;
}

static void on_done(void *cls, struct MHD_Connection *conn, void **con_cls,
		    enum MHD_RequestTerminationCode toe)
{
	struct body *b = *con_cls;
	(void)cls, (void)conn, (void)toe;
	if (b) {
		free(b->data);
		free(b);
		*con_cls = NULL;
	}
}

/* "host:port" into @sa (IPv4 literals or names resolved once). */
static int parse_addr(const char *addr, struct sockaddr_in *sa, struct ptc_error *err)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	char *end;
	long port = colon ? strtol(colon + 1, &end, 10) : -1;

	if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof(host) || *end || port < 0 ||
	    port > 65535)
		return ptc_error_set(err, -EINVAL, "\"%s\": expected host:port", addr);
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = '\0';
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host, &sa->sin_addr) == 1)
		return 0;
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
	if (getaddrinfo(host, NULL, &hints, &res) != 0)
		return ptc_error_set(err, -EINVAL, "\"%s\": cannot resolve \"%s\"", addr, host);
	sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	return 0;
}

int net_server_start(const struct net_server_opts *o, net_handler_fn handler, void *arg,
		     struct net_server **out, struct ptc_error *err)
{
	struct sockaddr_in sa;
	struct net_server *s;
	int rc;

	*out = NULL;
	if (!o->token || strlen(o->token) < 16)
		return ptc_error_set(err, -EINVAL,
				     "the cluster token must have at least 16 characters");
	if ((rc = parse_addr(o->addr, &sa, err)))
		return rc;
	if (!(s = calloc(1, sizeof(*s))) || !(s->token = strdup(o->token))) {
		free(s);
		return -ENOMEM;
	}
	s->token_len = strlen(s->token);
	s->handler = handler;
	s->arg = arg;
	s->max_body = o->max_body ? o->max_body : (size_t)1 << 20;
	unsigned threads = o->threads > 0 ? (unsigned)o->threads : 4;
	s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL, NULL,
				  on_request, s, MHD_OPTION_SOCK_ADDR, &sa,
				  MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_NOTIFY_COMPLETED,
				  on_done, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024, MHD_OPTION_END);
	if (!s->mhd) {
		ptc_error_set(err, -EADDRINUSE,
			      "%s: cannot listen (in use, or not an address of this host)",
			      o->addr);
		free(s->token);
		free(s);
		return -EADDRINUSE;
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
	s->port = info ? info->port : ntohs(sa.sin_port);
	*out = s;
	return 0;
}

int net_server_port(const struct net_server *s)
{
	return s->port;
}

void net_server_counts(const struct net_server *s, int64_t *requests, int64_t *refused)
{
	*requests = atomic_load(&s->requests);
	*refused = atomic_load(&s->refused);
}

void net_server_stop(struct net_server *s)
{
	if (!s)
		return;
	MHD_stop_daemon(s->mhd);
	free(s->token);
	free(s);
}

/* ---------------------------------------------------------------- requests */

const char *net_request_method(const struct net_request *r)
{
	return r->method;
}

const char *net_request_path(const struct net_request *r)
{
	return r->path;
}

const char *net_request_arg(const struct net_request *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *net_request_body(const struct net_request *r, size_t *len)
{
	*len = r->body_len;
	return r->body;
}

/* Queues response @rs (taken over) as @r's reply. */
static int queue_reply(struct net_request *r, int status, struct MHD_Response *rs,
		       const char *content_type)
{
	if (content_type)
		MHD_add_response_header(rs, "Content-Type", content_type);
	for (int i = 0; i < r->nhdr && status < 300; i++)
		MHD_add_response_header(rs, r->hname[i], r->hvalue[i]);
	r->result = MHD_queue_response(r->conn, (unsigned)status, rs);
	MHD_destroy_response(rs);
	r->replied = true;
	return 0;
}

int net_reply_add_header(struct net_request *r, const char *name, const char *value)
{
	if (r->nhdr >= 4 || strlen(name) >= sizeof(r->hname[0]) ||
	    strlen(value) >= sizeof(r->hvalue[0]))
		return -E2BIG;
	if (!*name || strpbrk(name, "\r\n: ") || strpbrk(value, "\r\n"))
		return -EINVAL;
	snprintf(r->hname[r->nhdr], sizeof(r->hname[0]), "%s", name);
	snprintf(r->hvalue[r->nhdr], sizeof(r->hvalue[0]), "%s", value);
	r->nhdr++;
	return 0;
}

int net_reply_buf(struct net_request *r, int status, const void *data, size_t len,
		  const char *content_type)
{
	if (r->replied)
		return -EALREADY;
	struct MHD_Response *rs =
	    MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
	if (!rs)
		return -ENOMEM;
	return queue_reply(r, status, rs, content_type);
}

int net_reply_error(struct net_request *r, int status, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n] = '\n';
	line[n + 1] = '\0';
	for (char *p = line; p < line + n; p++) /* one line */
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	return net_reply_buf(r, status, line, (size_t)n + 1, "text/plain");
}

/* The stream's callbacks, adapted to libmicrohttpd's. */
struct stream {
	net_read_fn read;
	void (*done)(void *arg);
	void *arg;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	ssize_t n = st->read(st->arg, pos, buf, max);
	return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static void stream_free(void *cls)
{
	struct stream *st = cls;
	if (st->done)
		st->done(st->arg);
	free(st);
}

/* The reply @rs (NULL: out of memory) over @st, queued; @st is freed (and
 * its done run) by libmicrohttpd once the reply ends, or here. */
static int queue_stream(struct net_request *r, int status, struct MHD_Response *rs,
			struct stream *st, const char *content_type)
{
	if (!rs) {
		stream_free(st);
		return -ENOMEM;
	}
	return queue_reply(r, status, rs, content_type);
}

/* A stream for a reply to @r, or NULL (done run, *@rc set). */
static struct stream *stream_new(struct net_request *r, net_read_fn read, void (*done)(void *arg),
				 void *arg, int *rc)
{
	struct stream *st = r->replied ? NULL : malloc(sizeof(*st));
	if (!st) {
		if (done)
			done(arg);
		*rc = r->replied ? -EALREADY : -ENOMEM;
		return NULL;
	}
	*st = (struct stream){read, done, arg};
	return st;
}

int net_reply_pinned(struct net_request *r, int status, const void *data, size_t len,
		     void (*done)(void *arg), void *arg, const char *content_type)
{
	int rc;
	struct stream *st = stream_new(r, NULL, done, arg, &rc);
	if (!st)
		return rc;
	/* sent from @data itself (no copy into a reply buffer) */
	return queue_stream(r, status,
			    MHD_create_response_from_buffer_with_free_callback_cls(
				len, (void *)data, stream_free, st),
			    st, content_type);
}

int net_reply_stream(struct net_request *r, int status, int64_t len, net_read_fn read,
		     void (*done)(void *arg), void *arg, const char *content_type)
{
	int rc;
	struct stream *st = stream_new(r, read, done, arg, &rc);
	if (!st)
		return rc;
	return queue_stream(r, status,
			    MHD_create_response_from_callback((uint64_t)len, 256 << 10, stream_read,
							      st, stream_free),
			    st, content_type);
}
