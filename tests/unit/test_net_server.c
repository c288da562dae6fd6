/*
 * test_net_server.c - the peer HTTP server (net_server) against the project's
 * own client (net_http): the token on every request, bounds on paths,
 * arguments and bodies, one-line errors, and streamed replies pulled from a
 * read callback (the way partition rows are served) with their done
 * callback run once.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "net/net.h"

#define TOKEN "0123456789abcdef-token"

static struct net_server *S;
static struct net_http *C;     /* with the token */
static struct net_http *NOTOK; /* without */
static char base[64];
static struct ptc_error why;
static atomic_int streams_done;

static ssize_t gen_read(void *arg, uint64_t pos, char *buf, size_t max)
{
	int64_t len = *(int64_t *)arg;
	size_t n = (int64_t)pos + (int64_t)max > len ? (size_t)(len - (int64_t)pos) : max;
	if (pos > 0 && len == 777777)
		return -1; /* the "broken" stream */
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)((pos + i) % 251);
	return (ssize_t)n;
}

static void gen_done(void *arg)
{
	free(arg);
	atomic_fetch_add(&streams_done, 1);
}

static void handler(void *arg, struct net_request *r)
{
	(void)arg;
	const char *p = net_request_path(r);
	char out[512];
	if (strcmp(p, "/echo") == 0) {
		const char *a = net_request_arg(r, "a");
		int n = snprintf(out, sizeof(out), "%s %s a=%s", net_request_method(r), p,
				 a ? a : "(none)");
		net_reply_buf(r, 200, out, (size_t)n, "text/plain");
	} else if (strcmp(p, "/post") == 0) {
		size_t len;
		const char *b = net_request_body(r, &len);
		net_reply_buf(r, 200, b, len, "application/json");
	} else if (strcmp(p, "/stream") == 0) {
		int64_t *len = malloc(sizeof(*len));
		*len = strtoll(net_request_arg(r, "n"), NULL, 10);
		net_reply_stream(r, 200, *len, gen_read, gen_done, len, "application/octet-stream");
	} else if (strcmp(p, "/none") == 0) {
		/* no reply: the server answers 500 */
	} else {
		net_reply_error(r, 404, "no such thing \"%s\"\nsecond line", p);
	}
}

static int setup(void **state)
{
	(void)state;
	struct net_server_opts o = {.addr = "127.0.0.1:0", .token = TOKEN, .max_body = 1000};
	if (net_server_start(&o, handler, NULL, &S, &why)) {
		fprintf(stderr, "net_server_start: %s\n", why.text);
		return -1;
	}
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", net_server_port(S));
	const char *h[] = {"Authorization: Bearer " TOKEN, NULL};
	struct net_http_opts co = {.retries = 0, .timeout_ms = 5000, .headers = h};
	struct net_http_opts no = {.retries = 0, .timeout_ms = 5000};
	if (net_http_new(&co, &C, &why) || net_http_new(&no, &NOTOK, &why))
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	net_http_free(C);
	net_http_free(NOTOK);
	net_server_stop(S);
	return 0;
}

static int get(struct net_http *c, const char *path, char **out, size_t *len)
{
	char url[256];
	snprintf(url, sizeof(url), "%s%s", base, path);
	return net_http_get(c, url, 1 << 20, (uint8_t **)out, len, NULL, &why);
}

static void test_token(void **state)
{
	(void)state;
	char *out;
	size_t len;
	int64_t req0, ref0, req1, ref1;
	net_server_counts(S, &req0, &ref0);
	assert_int_equal(get(NOTOK, "/echo?a=1", &out, &len), -EIO);
	assert_non_null(strstr(why.text, "HTTP 401"));
	assert_non_null(strstr(why.text, "HTTP 401"));
	/* Wrong tokens: another, a prefix, a longer one, not a bearer. */
	const char *bad[] = {"Authorization: Bearer 0123456789abcdef-tokem",
			     "Authorization: Bearer 0123456789abcdef-toke",
			     "Authorization: Bearer " TOKEN "x", "Authorization: " TOKEN};
	for (int i = 0; i < 4; i++) {
		const char *h[] = {bad[i], NULL};
		struct net_http_opts o = {.retries = 0, .headers = h};
		struct net_http *c;
		assert_int_equal(net_http_new(&o, &c, &why), 0);
		assert_int_equal(get(c, "/anything/at/all", &out, &len), -EIO);
		assert_non_null(strstr(why.text, "HTTP 401"));
		net_http_free(c);
	}
	net_server_counts(S, &req1, &ref1);
	assert_int_equal(ref1 - ref0, 5);
	assert_int_equal(req1 - req0, 5);
	assert_int_equal(get(C, "/echo?a=1", &out, &len), 0);
	assert_string_equal(out, "GET /echo a=1");
	free(out);
}

static void test_bounds(void **state)
{
	(void)state;
	char *out;
	size_t len;
	assert_int_equal(get(C, "/a..b", &out, &len), -EIO);
	assert_non_null(strstr(why.text, "HTTP 400"));
	assert_int_equal(
	    get(C, "/echo?1=1&2=2&3=3&4=4&5=5&6=6&7=7&8=8&9=9&a=a&b=b&c=c&d=d&e=e&f=f&g=g&h=h",
		&out, &len),
	    -EIO);
	assert_non_null(strstr(why.text, "HTTP 400"));
	assert_int_equal(get(C, "/nope", &out, &len), -EIO);
	assert_non_null(strstr(why.text, "HTTP 404"));
	char nope[128];
	snprintf(nope, sizeof(nope), "%s/nope", base); /* a POST's error quotes the reason */
	assert_int_equal(
	    net_http_post_json(C, nope, "{}", 2, 4096, (uint8_t **)&out, &len, NULL, &why), -EIO);
	assert_non_null(strstr(why.text, "HTTP 404: no such thing \"/nope\" second line"));
	assert_int_equal(get(C, "/none", &out, &len), -EIO);
	assert_non_null(strstr(why.text, "HTTP 500"));
	/* POST bodies: echoed up to max_body, refused past it. */
	char url[128], body[1200];
	memset(body, 'x', sizeof(body));
	snprintf(url, sizeof(url), "%s/post", base);
	struct net_http_call idem = {.idempotent = true};
	assert_int_equal(
	    net_http_post_json(C, url, body, 1000, 4096, (uint8_t **)&out, &len, &idem, &why), 0);
	assert_int_equal(len, 1000);
	assert_memory_equal(out, body, 1000);
	free(out);
	assert_int_equal(
	    net_http_post_json(C, url, body, 1001, 4096, (uint8_t **)&out, &len, &idem, &why),
	    -EIO);
	assert_non_null(strstr(why.text, "HTTP 413"));
}

static void test_stream(void **state)
{
	(void)state;
	int before = atomic_load(&streams_done);
	for (int64_t n = 1; n <= (int64_t)40 << 20; n = n * 7 + 13) {
		char url[128];
		snprintf(url, sizeof(url), "%s/stream?n=%lld", base, (long long)n);
		char *buf = malloc((size_t)n);
		struct iovec iov = {buf, (size_t)n};
		struct net_http_range r = {.off = 0, .len = n, .iov = &iov, .iovcnt = 1};
		int rc = net_http_get_range(C, url, &r, NULL, &why);
		if (rc)
			fprintf(stderr, "%s\n", why.text);
		assert_int_equal(rc, 0);
		assert_int_equal(r.got, n);
		for (int64_t i = 0; i < n; i += 4093)
			assert_int_equal((uint8_t)buf[i], i % 251);
		assert_int_equal((uint8_t)buf[n - 1], (n - 1) % 251);
		free(buf);
	}
	/* A stream cut short by its reader is a failed transfer, not a short one. */
	char url[128];
	snprintf(url, sizeof(url), "%s/stream?n=777777", base);
	char *buf = malloc(777777);
	struct iovec iov = {buf, 777777};
	struct net_http_range r = {.off = 0, .len = 777777, .iov = &iov, .iovcnt = 1};
	assert_int_equal(net_http_get_range(C, url, &r, NULL, &why), -EIO);
	free(buf);
	int want = 0;
	for (int64_t n = 1; n <= (int64_t)40 << 20; n = n * 7 + 13)
		want++;
	for (int i = 0; i < 100 && atomic_load(&streams_done) - before < want + 1; i++)
		usleep(10000);
	assert_int_equal(atomic_load(&streams_done) - before, want + 1);
}

static void test_addresses(void **state)
{
	(void)state;
	struct net_server *s;
	struct net_server_opts o = {.addr = "127.0.0.1", .token = TOKEN};
	assert_int_equal(net_server_start(&o, handler, NULL, &s, &why), -EINVAL);
	assert_non_null(strstr(why.text, "expected host:port"));
	assert_int_equal(why.code, -EINVAL);
	o.addr = "127.0.0.1:99999";
	assert_int_equal(net_server_start(&o, handler, NULL, &s, &why), -EINVAL);
	char in_use[64];
	snprintf(in_use, sizeof(in_use), "127.0.0.1:%d", net_server_port(S));
	o.addr = in_use;
	assert_int_equal(net_server_start(&o, handler, NULL, &s, &why), -EADDRINUSE);
	o.addr = "10.255.255.1:7070"; /* not an address of this host */
	assert_int_equal(net_server_start(&o, handler, NULL, &s, &why), -EADDRINUSE);
	assert_int_equal(why.code, -EADDRINUSE);
	o.addr = "127.0.0.1:0";
	o.token = "short";
	assert_int_equal(net_server_start(&o, handler, NULL, &s, &why), -EINVAL);
	assert_non_null(strstr(why.text, "16 characters"));
	assert_int_equal(why.code, -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_token),
	    cmocka_unit_test(test_bounds),
	    cmocka_unit_test(test_stream),
	    cmocka_unit_test(test_addresses),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests_name("net_server", tests, setup, teardown) ? 1 : 0;
}
