/*
 * test_net_parse.c - the HTTP reply parser (net/net_http_parse.c), alone,
 * header line by header line, with the values it must read and the
 * verdicts it must give; and the client's checks of URLs and options,
 * which need no server. test_net.c runs the client against one.
 */
#include <stdint.h>

#include "net/net.h"
#include "net/net_i.h"
#include "tests/unit/unit.h"

/* ------------------------------------------------------------- the parser */

/* Feeds @lines (NULL-terminated) to a reply of request [@a, @b] / @max. */
static int feed(struct net_reply *r, int64_t a, int64_t b, int64_t max, const char *const *lines,
		struct ptc_error *err)
{
	int rc = 0;

	net_reply_init(r, a, b, max);
	for (; *lines && rc >= 0; lines++)
		rc = net_reply_header(r, *lines, strlen(*lines), err);
	return rc;
}

static void test_parse_headers(void **state)
{
	(void)state;
	struct net_reply r;
	struct ptc_error msg;

	/* A 206, CR LF kept or not, names in any case, blanks around values. */
	const char *const ok[] = {"HTTP/1.1 206 Partial Content\r\n",
				  "content-length:\t100\r\n",
				  "Content-Range: bytes 0-99/300007",
				  "X-Other: 1\r\n",
				  "\r\n",
				  NULL};
	assert_int_equal(feed(&r, 0, 99, 100, ok, &msg), 0);
	assert_int_equal(r.status, 206);
	assert_true(r.have_clen && r.have_cr && !r.cr_unsat);
	assert_int_equal(r.clen, 100);
	assert_int_equal(r.cr_first, 0);
	assert_int_equal(r.cr_last, 99);
	assert_int_equal(r.cr_total, 300007);
	assert_int_equal(net_reply_header(&r, "HTTP/2 416", 10, &msg), NET_HEADER_STATUS);
	assert_int_equal(r.status, 416); /* a new reply forgets the last */
	assert_false(r.have_clen || r.have_cr);

	/* Malformed values are absent; numbers have at most 18 digits. */
	static const char *const bad[] = {
	    "Content-Range: bytes 5-4/10",
	    "Content-Range: bytes 0-10/10",
	    "Content-Range: bytes 0-1/2 x",
	    "Content-Range: items 0-1/2",
	    "Content-Range: bytes -1-2/3",
	    "Content-Range: bytes 0-1234567890123456789/*",
	    "Content-Range: bytes */",
	    "Content-Range: bytes 1-2",
	    "Content-Length: -1",
	    "Content-Length: 12a",
	    "Content-Length: 1234567890123456789",
	    "Content-Length 12",
	    "Content-Lengthy: 12",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		const char *lines[] = {"HTTP/1.1 206", bad[i], NULL};
		assert_int_equal(feed(&r, 0, 9, 10, lines, &msg), 0);
		if (r.have_cr || r.have_clen || r.cr_unsat)
			print_error("\"%s\" was read\n", bad[i]);
		assert_false(r.have_cr || r.have_clen || r.cr_unsat);
	}
	const char *const star[] = {"HTTP/1.0 416 Range Not Satisfiable",
				    "Content-Range: bytes */100", NULL};
	assert_int_equal(feed(&r, 200, 209, 10, star, &msg), 0);
	assert_true(r.cr_unsat && !r.have_cr);
	assert_int_equal(r.cr_total, 100);
	const char *const open[] = {"HTTP/1.1 206", "Content-Range: bytes 3-4/*", NULL};
	assert_int_equal(feed(&r, 3, 4, 2, open, &msg), 0);
	assert_true(r.have_cr);
	assert_int_equal(r.cr_total, -1);

	/* Bad status lines leave status 0; a whole 200 over max is -EFBIG at once. */
	const char *const nostat[] = {"HTTP/1.1 99 Low", NULL};
	assert_int_equal(feed(&r, -1, -1, 10, nostat, &msg), NET_HEADER_STATUS);
	assert_int_equal(r.status, 0);
	const char *const big_[] = {"HTTP/1.1 200 OK", "Content-Length: 11", NULL};
	assert_int_equal(feed(&r, -1, -1, 10, big_, &msg), -EFBIG);
	assert_string_equal(msg.text, "holds 11 bytes, more than 10");
	assert_int_equal(msg.code, -EFBIG);
}

/* Runs a reply of @lines and @body chunk sizes (0-terminated) through end. */
static enum net_verdict judge(int64_t a, int64_t b, int64_t max, const char *const *lines,
			      const size_t *chunks, int *body_rc, int64_t *size,
			      struct ptc_error *err)
{
	struct net_reply r;

	assert_true(feed(&r, a, b, max, lines, err) >= 0);
	*body_rc = NET_BODY_KEEP;
	for (; *chunks; chunks++)
		if ((*body_rc = net_reply_body(&r, *chunks, err)) < 0)
			return NET_FATAL;
	return net_reply_end(&r, size, err);
}

static void test_parse_judge(void **state)
{
	(void)state;
	struct ptc_error msg;
	int64_t size;
	int brc;
	static const size_t n30[] = {10, 20, 0}, n31[] = {31, 0}, n20[] = {20, 0}, none[] = {0};

	/* The bytes asked, or those before the object's end. */
	const char *const full[] = {"HTTP/1.1 206", "Content-Range: bytes 10-39/1000", NULL};
	assert_int_equal(judge(10, 39, 30, full, n30, &brc, &size, &msg), NET_OK);
	assert_int_equal(size, 1000);
	const char *const tail[] = {"HTTP/1.1 206", "Content-Range: bytes 10-29/30", NULL};
	assert_int_equal(judge(10, 39, 30, tail, n20, &brc, &size, &msg), NET_OK);
	assert_int_equal(size, 30);
	const char *const past[] = {"HTTP/1.1 416", "Content-Range: bytes */10", NULL};
	assert_int_equal(judge(10, 39, 30, past, n20, &brc, &size, &msg), NET_OK);
	assert_int_equal(brc, NET_BODY_DROP);
	assert_int_equal(size, 10);
	const char *const whole[] = {"HTTP/1.1 200", "Content-Length: 20", NULL};
	assert_int_equal(judge(0, 39, 40, whole, n20, &brc, &size, &msg), NET_OK);
	assert_int_equal(size, 20);

	/* A 416 whose size says the range exists contradicts itself. */
	const char *const lie[] = {"HTTP/1.1 416", "Content-Range: bytes */1000", NULL};
	assert_int_equal(judge(10, 39, 30, lie, none, &brc, &size, &msg), NET_FATAL);
	assert_string_equal(msg.text, "HTTP 416");
	assert_int_equal(msg.code, -EIO);
	assert_int_equal(size, -1);

	/* Wrong replies. */
	const char *const shifted[] = {"HTTP/1.1 206", "Content-Range: bytes 11-40/1000", NULL};
	assert_int_equal(judge(10, 39, 30, shifted, n30, &brc, &size, &msg), NET_FATAL);
	assert_int_equal(brc, -EIO);
	assert_string_equal(msg.text, "Content-Range bytes 11-40 for bytes 10-39 asked");
	assert_int_equal(msg.code, brc);
	assert_int_equal(judge(10, 39, 30, full, n31, &brc, &size, &msg), NET_FATAL);
	assert_string_equal(msg.text, "body longer than its Content-Range");
	assert_int_equal(judge(10, 39, 30, full, n20, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "short body: 20 of 30 bytes");
	assert_int_equal(msg.code, -EIO);
	const char *const early[] = {"HTTP/1.1 206", "Content-Range: bytes 10-29/1000", NULL};
	assert_int_equal(judge(10, 39, 30, early, n20, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "Content-Range ends at byte 29, 39 expected");
	const char *const nocr[] = {"HTTP/1.1 206", NULL};
	assert_int_equal(judge(10, 39, 30, nocr, none, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "HTTP 206 without a valid Content-Range");
	assert_int_equal(judge(10, 39, 30, whole, n20, &brc, &size, &msg), NET_FATAL);
	assert_string_equal(msg.text, "HTTP 200 to a range request");
	const char *const noclen[] = {"HTTP/1.1 200", NULL};
	assert_int_equal(judge(0, 39, 40, noclen, n20, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "HTTP 200 without a matching Content-Length");
	assert_int_equal(judge(0, 9, 10, whole, n20, &brc, &size, &msg), NET_FATAL);
	assert_string_equal(msg.text, "HTTP 200 with more than the 10 bytes asked");

	/* Statuses: retried or not; error pages dropped; no status at all. */
	const char *const s503[] = {"HTTP/1.1 503", NULL}, *const s404[] = {"HTTP/1.1 404", NULL};
	assert_int_equal(judge(0, 9, 10, s503, n20, &brc, &size, &msg), NET_RETRY);
	assert_int_equal(brc, NET_BODY_DROP);
	assert_string_equal(msg.text, "HTTP 503");
	assert_int_equal(judge(-1, -1, 10, s404, n20, &brc, &size, &msg), NET_FATAL);
	assert_string_equal(msg.text, "HTTP 404");
	const char *const nothing[] = {NULL};
	assert_int_equal(judge(-1, -1, 10, nothing, none, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "no HTTP status");
	for (long st = 100; st < 1000; st++)
		assert_int_equal(net_status_retryable(st), st >= 500 || st == 408 || st == 429);

	/* Whole objects: max bounds the body, Content-Length must match. */
	assert_int_equal(judge(-1, -1, 20, whole, n20, &brc, &size, &msg), NET_OK);
	assert_int_equal(size, 20);
	const char *const nolen[] = {"HTTP/1.1 200", NULL};
	assert_int_equal(judge(-1, -1, 19, nolen, n20, &brc, &size, &msg), NET_FATAL);
	assert_int_equal(brc, -EFBIG);
	assert_string_equal(msg.text, "holds more than 19 bytes");
	assert_int_equal(msg.code, brc);
	const char *const more[] = {"HTTP/1.1 200", "Content-Length: 30", NULL};
	assert_int_equal(judge(-1, -1, 40, more, n20, &brc, &size, &msg), NET_RETRY);
	assert_string_equal(msg.text, "short body: 20 of 30 bytes");
}

/* ------------------------------------------------------------ the client */

static void test_url_check(void **state)
{
	(void)state;
	static const struct {
		const char *url, *why;
	} cases[] = {
	    {"http://h/x", ""},
	    {"HTTPS://h:8443/x?y=1", ""},
	    {"http://h", ""},
	    {"ftp://h/x", "ftp://h/x: unsupported URI (http:// or https:// expected)"},
	    {"file:///x", "file:///x: unsupported URI (http:// or https:// expected)"},
	    {"http://", "http://: URI without a host"},
	    {"https:///x", "https:///x: URI without a host"},
	    {"http://?q", "http://?q: URI without a host"},
	    {"http://h/a b", "http://h/a b: URI holds a space or control character"},
	    {"http://h/a\r\nX: y", "http://h/a\r\nX: y: URI holds a space or control character"},
	};
	struct ptc_error why;

	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		int rc = net_url_check(cases[i].url, &why);
		assert_int_equal(rc, cases[i].why[0] ? -EINVAL : 0);
		assert_string_equal(why.text, cases[i].why);
		assert_int_equal(why.code, rc);
	}
	assert_int_equal(net_url_check(NULL, &why), -EINVAL);
	assert_int_equal(net_url_check(NULL, NULL), -EINVAL);
	char *longurl = malloc(NET_MAX_URL + 2);
	assert_non_null(longurl);
	memset(longurl, 'x', NET_MAX_URL + 1);
	memcpy(longurl, "http://", 7);
	longurl[NET_MAX_URL + 1] = 0;
	assert_int_equal(net_url_check(longurl, &why), -EINVAL);
	assert_non_null(strstr(why.text, "...: URI longer than 4096 bytes"));
	longurl[NET_MAX_URL] = 0;
	assert_int_equal(net_url_check(longurl, &why), 0);
	free(longurl);
}

static void test_new(void **state)
{
	(void)state;
	static const char *const good[] = {"Authorization: Bearer t", "X-A:", NULL};
	static const char *const bad[] = {"NoColon", ": v", "Bad Name: v", "X: a\r\nY: b"};
	struct net_http_opts o = {.headers = good};
	struct net_http *c = (struct net_http *)1;
	struct ptc_error why;

	assert_int_equal(net_http_new(&o, &c, &why), 0);
	assert_string_equal(why.text, "");
	assert_int_equal(why.code, 0);
	net_http_free(c);
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		const char *one[] = {bad[i], NULL};
		o.headers = one;
		assert_int_equal(net_http_new(&o, &c, &why), -EINVAL);
		assert_null(c);
		assert_non_null(strstr(why.text, "net_http_opts.headers: \""));
		assert_non_null(strstr(why.text, "is not \"Name: value\" on one line"));
		assert_int_equal(why.code, -EINVAL);
	}
	net_http_free(NULL);
}

/* Bytes [@off, @off + @len) of a.bin into @nbuf buffers of random sizes. */
int main(void)
{
	const struct CMUnitTest parse_tests[] = {
	    cmocka_unit_test(test_parse_headers),
	    cmocka_unit_test(test_parse_judge),
	    cmocka_unit_test(test_url_check),
	    cmocka_unit_test(test_new),
	};

	return cmocka_run_group_tests_name("parse", parse_tests, NULL, NULL);
}
