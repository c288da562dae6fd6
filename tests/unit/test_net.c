/*
 * test_net.c - the HTTP client (net/net_http.c) against a server.
 *
 * The client runs against tests/e2e/rangeserver.py (unit_server.h)
 * serving a temporary directory of random files: ranged GETs into
 * scattered buffers are compared byte for byte, failure modes are
 * switched on through the server's /__set endpoint, and POSTs of JSON go
 * to its echo, which returns what it received (path, content type,
 * headers, body). One control client, kept for the whole run, talks to
 * /__set and /__stats, so the connection counts the server reports are the
 * tested client's alone. test_net_parse.c tests the reply parser and the
 * checks that need no server.
 */
#include <inttypes.h>
#include <pthread.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "net/net.h"
#include "tests/unit/unit.h"
#include "tests/unit/unit_server.h"

#define MAX_URL 512
#define WHY_LEN (MAX_URL + 256)

static char dir[64];
static uint8_t *big; /* a.bin */
#define BIG_SIZE   300007
#define SMALL_SIZE 100 /* small.bin: big's first 100 bytes */
#define INDEX_TXT  "{\"shards\": [\"a.bin\"]}\n"

static struct unit_server srv = {.pid = -1};
/* test_pool_reuses_per_host's servers, stopped by the teardown too */
#define HOSTS 7
static struct unit_server hosts[HOSTS];
static struct net_http *ctl; /* /__set and /__stats */
static bool http_started;

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void url_of(char *buf, int port, const char *path)
{
	snprintf(buf, MAX_URL, "http://127.0.0.1:%d/%s", port, path);
}

static struct net_http *client(int retries)
{
	struct net_http_opts o = {
	    .retries = retries, .backoff_ms = 1, .max_backoff_ms = 4, .timeout_ms = 5000};
	struct net_http *c;
	struct ptc_error why;

	assert_int_equal(net_http_new(&o, &c, &why), 0);
	assert_non_null(c);
	return c;
}

static struct net_http_stats stats(struct net_http *c)
{
	struct net_http_stats st;

	net_http_stats(c, &st);
	return st;
}

/* ------------------------------------------------------------- fixtures */

static int write_file(const char *name, const void *data, size_t len)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!(f = fopen(path, "wb")) || fwrite(data, 1, len, f) != len)
		return -1;
	return fclose(f);
}

static int make_files(void)
{
	uint64_t x = 0x9e3779b97f4a7c15ULL;

	strcpy(dir, "/tmp/mlfs-net-XXXXXX");
	if (!mkdtemp(dir) || !(big = malloc(BIG_SIZE)))
		return -1;
	for (int i = 0; i < BIG_SIZE; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		big[i] = (uint8_t)(x >> 24);
	}
	return write_file("a.bin", big, BIG_SIZE) || write_file("small.bin", big, SMALL_SIZE) ||
	       write_file("empty.bin", "", 0) ||
	       write_file("index.json", INDEX_TXT, strlen(INDEX_TXT));
}

static void remove_files(void)
{
	char cmd[128];

	free(big);
	big = NULL;
	if (dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "test_net: could not remove %s\n", dir);
	}
}

/* GET /__set?@query on @port. */
static void server_set(int port, const char *query)
{
	char url[MAX_URL], q[256];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	snprintf(q, sizeof(q), "__set?%s", query);
	url_of(url, port, q);
	int rc = net_http_get(ctl, url, 4096, &data, &len, NULL, &why);
	if (rc)
		print_error("%s\n", why.text);
	assert_int_equal(rc, 0);
	free(data);
}

/* The server's counters: file requests and POSTs, failed ones, connections. */
static void server_stats(int port, long *requests, long *failed, long *connections)
{
	char url[MAX_URL];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	url_of(url, port, "__stats");
	assert_int_equal(net_http_get(ctl, url, 4096, &data, &len, NULL, &why), 0);
	assert_int_equal(
	    sscanf((char *)data, "{\"requests\": %ld, \"failed\": %ld", requests, failed), 2);
	const char *c = strstr((char *)data, "\"connections\": ");
	assert_non_null(c);
	*connections = strtol(c + 15, NULL, 10);
	free(data);
}

static int http_teardown(void **state)
{
	(void)state;
	net_http_free(ctl);
	ctl = NULL;
	unit_server_stop(&srv);
	for (int i = 0; i < HOSTS; i++)
		unit_server_stop(&hosts[i]);
	remove_files();
	return 0;
}

/* The files, the server and the control client. */
static int http_setup(void **state)
{
	struct ptc_error why;

	if (make_files()) {
		fprintf(stderr, "test_net: cannot write the test files\n");
		http_teardown(state);
		return -1;
	}
	unit_server_start(&srv, dir, NULL);
	assert_int_equal(net_http_new(NULL, &ctl, &why), 0);
	http_started = true;
	return 0;
}

/* ------------------------------------------------------------ the client */

static void check_range(struct net_http *c, const char *url, int64_t off, int64_t len, int nbuf,
			uint64_t seed)
{
	uint8_t *dst = malloc((size_t)len);
	struct iovec *iov = calloc((size_t)nbuf, sizeof(*iov));
	int64_t at = 0;
	struct ptc_error why;

	assert_true(dst && iov);
	memset(dst, 0x5a, (size_t)len);
	for (int i = 0; i < nbuf; i++) { /* sizes cut at random points, zeros included */
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		int64_t n =
		    i + 1 == nbuf ? len - at : (int64_t)((seed >> 33) % (uint64_t)(len - at + 1));
		iov[i] = (struct iovec){dst + at, (size_t)n};
		at += n;
	}
	struct net_http_range r = {.off = off, .len = len, .iov = iov, .iovcnt = nbuf};
	int rc = net_http_get_range(c, url, &r, NULL, &why);
	if (rc)
		print_error("%s\n", why.text);
	assert_int_equal(rc, 0);
	assert_int_equal(r.got, len);
	assert_int_equal(r.size, BIG_SIZE);
	assert_memory_equal(dst, big + off, (size_t)len);
	free(iov);
	free(dst);
}

static void test_range(void **state)
{
	(void)state;
	struct net_http *c = client(0);
	char url[MAX_URL];
	struct ptc_error why;
	long req, failed, conns;

	server_set(srv.port, "fail_rate=0&reset=1");
	url_of(url, srv.port, "a.bin");
	check_range(c, url, 0, BIG_SIZE, 1, 1);
	check_range(c, url, BIG_SIZE - 1, 1, 1, 2);
	for (int i = 0; i < 40; i++)
		check_range(c, url, i * 7001, 1 + i * 313, 1 + i % 9, (uint64_t)i);
	struct net_http_stats st = stats(c);
	assert_int_equal(st.requests, 42);
	assert_int_equal(st.retries + st.failures, 0);
	server_stats(srv.port, &req, &failed, &conns);
	assert_int_equal(req, 42);
	assert_int_equal(conns, 1); /* one connection, reused */

	/* Past the end: what is there, and the size. */
	uint8_t d[64];
	struct iovec v = {d, sizeof(d)};
	struct net_http_range r = {.off = 96, .len = 36, .iov = &v, .iovcnt = 1};
	v.iov_len = 36;
	url_of(url, srv.port, "small.bin");
	assert_int_equal(net_http_get_range(c, url, &r, NULL, &why), 0);
	assert_int_equal(r.got, 4);
	assert_int_equal(r.size, SMALL_SIZE);
	assert_memory_equal(d, big + 96, 4);
	r.off = 100; /* a 416 */
	assert_int_equal(net_http_get_range(c, url, &r, NULL, &why), 0);
	assert_int_equal(r.got, 0);
	assert_int_equal(r.size, SMALL_SIZE);
	url_of(url, srv.port, "empty.bin");
	r.off = 0;
	assert_int_equal(net_http_get_range(c, url, &r, NULL, &why), 0);
	assert_int_equal(r.got, 0);
	assert_int_equal(r.size, 0);

	/* Bad arguments: nothing sent. */
	int64_t before = stats(c).requests;
	struct iovec two[2] = {{d, 10}, {d + 10, 10}}, hole[2] = {{d, 10}, {NULL, 10}};
	struct net_http_range bad[] = {
	    {.off = -1, .len = 20, .iov = two, .iovcnt = 2},
	    {.off = 0, .len = 0, .iov = two, .iovcnt = 2},
	    {.off = INT64_MAX, .len = 20, .iov = two, .iovcnt = 2},
	    {.off = 0, .len = 20, .iov = NULL, .iovcnt = 2},
	    {.off = 0, .len = 20, .iov = two, .iovcnt = 0},
	    {.off = 0, .len = 21, .iov = two, .iovcnt = 2},
	    {.off = 0, .len = 19, .iov = two, .iovcnt = 2},
	    {.off = 0, .len = 20, .iov = hole, .iovcnt = 2},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		assert_int_equal(net_http_get_range(c, url, &bad[i], NULL, &why), -EINVAL);
		assert_non_null(strstr(why.text, url));
		assert_int_equal(why.code, -EINVAL);
	}
	r = (struct net_http_range){.off = 0, .len = 20, .iov = two, .iovcnt = 2};
	assert_int_equal(net_http_get_range(c, "s3://b/k", &r, NULL, &why), -EINVAL);
	assert_int_equal(stats(c).requests, before);
	net_http_free(c);
}

/* Every failure mode always on: -EIO after the retries, the reason named. */
static void test_range_modes(void **state)
{
	(void)state;
	static const struct {
		const char *mode, *why; /* after "<url>: " */
	} modes[] = {
	    {"503", "HTTP 503 after 3 attempts"},
	    {"429", "HTTP 429 after 3 attempts"},
	    {"408", "HTTP 408 after 3 attempts"},
	    {"ignore-range", "HTTP 200 to a range request after 3 attempts"},
	    {"badrange",
	     "Content-Range bytes 5001-8000 for bytes 5000-7999 asked after 3 attempts"},
	    {"short", "Content-Range ends at byte 6499, 7999 expected after 3 attempts"},
	    {"truncate", NULL},
	    {"drop", NULL},
	};
	char url[MAX_URL], q[128], want[WHY_LEN];
	struct ptc_error why;
	uint8_t dst[3000];
	struct iovec v = {dst, sizeof(dst)};

	url_of(url, srv.port, "a.bin");
	for (size_t m = 0; m < sizeof(modes) / sizeof(*modes); m++) {
		struct net_http *c = client(2);
		struct net_http_range r = {.off = 5000, .len = sizeof(dst), .iov = &v, .iovcnt = 1};
		long req, failed, conns;
		snprintf(q, sizeof(q), "fail_rate=1&modes=%s&reset=1", modes[m].mode);
		server_set(srv.port, q);
		assert_int_equal(net_http_get_range(c, url, &r, NULL, &why), -EIO);
		assert_int_equal(why.code, -EIO);
		snprintf(want, sizeof(want), "%s: %s", url, modes[m].why ? modes[m].why : "");
		if (modes[m].why ? strcmp(why.text, want) != 0
				 : strncmp(why.text, want, strlen(want)) ||
				       !strstr(why.text, "after 3 attempts")) {
			print_error("mode %s: \"%s\"\n", modes[m].mode, why.text);
			fail();
		}
		assert_int_equal(r.got, 0);
		struct net_http_stats st = stats(c);
		assert_int_equal(st.requests, 3);
		assert_int_equal(st.retries, 2);
		assert_int_equal(st.failures, 1);
		assert_int_equal(st.bytes, 0);
		server_stats(srv.port, &req, &failed, &conns);
		assert_int_equal(req, 3);
		assert_int_equal(failed, 3);
		net_http_free(c);
	}
	server_set(srv.port, "fail_rate=0");
}

static void test_get(void **state)
{
	(void)state;
	struct net_http *c = client(3);
	char url[MAX_URL], want[WHY_LEN];
	struct ptc_error why;
	uint8_t *data = (uint8_t *)1;
	size_t len = 1;

	server_set(srv.port, "fail_rate=0&reset=1");
	url_of(url, srv.port, "index.json");
	assert_int_equal(net_http_get(c, url, 1 << 20, &data, &len, NULL, &why), 0);
	assert_int_equal(len, strlen(INDEX_TXT));
	assert_string_equal((char *)data, INDEX_TXT); /* NUL-terminated */
	free(data);
	url_of(url, srv.port, "a.bin");
	assert_int_equal(net_http_get(c, url, BIG_SIZE, &data, &len, NULL, &why), 0);
	assert_int_equal(len, BIG_SIZE);
	assert_memory_equal(data, big, BIG_SIZE);
	free(data);
	url_of(url, srv.port, "empty.bin");
	assert_int_equal(net_http_get(c, url, 0, &data, &len, NULL, &why), 0);
	assert_non_null(data);
	assert_int_equal(len, 0);
	assert_int_equal(data[0], 0);
	free(data);
	assert_int_equal(stats(c).bytes, (int64_t)strlen(INDEX_TXT) + BIG_SIZE);

	/* Too big: -EFBIG from the Content-Length, not retried. */
	url_of(url, srv.port, "a.bin");
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, NULL, &why), -EFBIG);
	assert_null(data);
	assert_int_equal(len, 0);
	snprintf(want, sizeof(want), "%s: holds %d bytes, more than 4096", url, BIG_SIZE);
	assert_string_equal(why.text, want);
	assert_int_equal(why.code, -EFBIG);
	/* 404: said at once. */
	url_of(url, srv.port, "missing.json");
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, NULL, &why), -EIO);
	snprintf(want, sizeof(want), "%s: HTTP 404", url);
	assert_string_equal(why.text, want);
	assert_int_equal(why.code, -EIO);
	struct net_http_stats st = stats(c);
	assert_int_equal(st.retries, 0);
	assert_int_equal(st.failures, 2);
	assert_int_equal(net_http_get(c, url, -1, &data, &len, NULL, &why), -EINVAL);
	assert_int_equal(net_http_get(c, "http://", 1, &data, &len, NULL, &why), -EINVAL);
	net_http_free(c);
}

static void test_post(void **state)
{
	(void)state;
	static const char *const hdrs[] = {"Authorization: Bearer s3cret", NULL};
	struct net_http_opts o = {.retries = 2, .backoff_ms = 1, .headers = hdrs};
	static const char body[] = "{\"key\": \"Zm9v\", \"range_end\": \"Zm9w\"}";
	static const char want[] = "{\"path\": \"/v3/kv/range\", \"content_type\": "
				   "\"application/json\", \"authorization\": \"Bearer s3cret\", "
				   "\"body\": \"{\\\"key\\\": \\\"Zm9v\\\", \\\"range_end\\\": "
				   "\\\"Zm9w\\\"}\"}";
	struct net_http *c;
	char url[MAX_URL];
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	assert_int_equal(net_http_new(&o, &c, &why), 0);
	server_set(srv.port, "fail_rate=0&reset=1");
	url_of(url, srv.port, "v3/kv/range");
	assert_int_equal(
	    net_http_post_json(c, url, body, strlen(body), 4096, &data, &len, NULL, &why), 0);
	assert_string_equal((char *)data, want);
	assert_int_equal(len, strlen(want));
	free(data);

	/* An empty body; a large one (no "Expect: 100-continue" wait). */
	assert_int_equal(net_http_post_json(c, url, NULL, 0, 4096, &data, &len, NULL, &why), 0);
	assert_non_null(strstr((char *)data, "\"body\": \"\"}"));
	free(data);
	char *large = malloc(200000);
	assert_non_null(large);
	memset(large, 'x', 200000);
	int64_t t0 = now_ms();
	assert_int_equal(
	    net_http_post_json(c, url, large, 200000, 1 << 20, &data, &len, NULL, &why), 0);
	assert_true(now_ms() - t0 < 900);
	assert_true(len > 200000);
	free(data);
	free(large);

	/* A reply larger than max. */
	assert_int_equal(
	    net_http_post_json(c, url, body, strlen(body), 10, &data, &len, NULL, &why), -EFBIG);
	assert_null(data);
	assert_non_null(strstr(why.text, "more than 10"));
	assert_int_equal(why.code, -EFBIG);
	assert_int_equal(net_http_post_json(c, url, NULL, 5, 10, &data, &len, NULL, &why), -EINVAL);
	net_http_free(c);
}

/* POST failures: the error body quoted; retried only when idempotent, or
 * when the request cannot have been carried out. */
static void test_post_retries(void **state)
{
	(void)state;
	static const struct {
		const char *mode;
		bool idempotent;
		long requests;
		const char *why; /* after "<url>: " */
	} cases[] = {
	    {"400", true, 1, "HTTP 400: {\"error\": \"injected 400\"}"},
	    {"503", false, 1, "HTTP 503: {\"error\": \"injected 503\"}"},
	    {"503", true, 3, "HTTP 503: {\"error\": \"injected 503\"} after 3 attempts"},
	    {"429", false, 3, "HTTP 429: {\"error\": \"injected 429\"} after 3 attempts"},
	    {"drop", false, 1, NULL},
	    {"drop", true, 3, NULL},
	    {"truncate", false, 1, NULL},
	};
	char url[MAX_URL], q[128], want[WHY_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;
	long req, failed, conns;

	url_of(url, srv.port, "v3/kv/txn");
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		struct net_http *c = client(2);
		struct net_http_call call = {.idempotent = cases[i].idempotent};
		snprintf(q, sizeof(q), "fail_rate=1&modes=%s&reset=1", cases[i].mode);
		server_set(srv.port, q);
		assert_int_equal(
		    net_http_post_json(c, url, "{}", 2, 4096, &data, &len, &call, &why), -EIO);
		snprintf(want, sizeof(want), "%s: %s", url, cases[i].why ? cases[i].why : "");
		if (cases[i].why ? strcmp(why.text, want) != 0
				 : strncmp(why.text, want, strlen(want)) != 0) {
			print_error("case %zu: \"%s\"\n", i, why.text);
			fail();
		}
		assert_int_equal(why.code, -EIO);
		server_stats(srv.port, &req, &failed, &conns);
		assert_int_equal(req, cases[i].requests);
		assert_int_equal(stats(c).requests, cases[i].requests);
		net_http_free(c);
	}
	server_set(srv.port, "fail_rate=0");

	/* Nobody listening: refused connections are retried, POST or not. */
	struct unit_server gone = {.pid = -1};
	unit_server_start(&gone, dir, NULL);
	url_of(url, gone.port, "v3/kv/txn");
	unit_server_stop(&gone);
	struct net_http *c = client(2);
	assert_int_equal(net_http_post_json(c, url, "{}", 2, 4096, &data, &len, NULL, &why), -EIO);
	assert_non_null(strstr(why.text, "after 3 attempts"));
	net_http_free(c);
}

/* The call's stop flag and deadline. */
static void test_call(void **state)
{
	(void)state;
	struct net_http_opts o = {.retries = 100, .backoff_ms = 50, .max_backoff_ms = 50};
	struct net_http *c;
	char url[MAX_URL], want[WHY_LEN];
	struct ptc_error why;
	uint8_t *data;
	size_t len;
	long req, failed, conns;
	atomic_int stop;

	assert_int_equal(net_http_new(&o, &c, &why), 0);

	/* A stop flag set before the call: its first attempt ends before its
	 * request reaches the server, and no other starts. */
	atomic_init(&stop, 1);
	struct net_http_call call = {.stop = &stop};
	server_set(srv.port, "fail_rate=1&modes=500&reset=1");
	url_of(url, srv.port, "index.json");
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, &call, &why), -ECANCELED);
	assert_int_equal(why.code, -ECANCELED);
	server_stats(srv.port, &req, &failed, &conns);
	assert_int_equal(req, 0);
	struct net_http_stats st = stats(c);
	assert_int_equal(st.requests, 1);
	assert_int_equal(st.failures, 0);

	/* A budget spent before the call: nothing sent. */
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	call = (struct net_http_call){.start_ns =
					  (int64_t)t.tv_sec * 1000000000 + t.tv_nsec - 2000000000LL,
				      .deadline_ms = 1500};
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, &call, &why), -EIO);
	snprintf(want, sizeof(want), "%s: timed out before its request, deadline of 1.5 s reached",
		 url);
	assert_string_equal(why.text, want);
	assert_int_equal(why.code, -EIO);
	assert_int_equal(stats(c).requests, 1);

	/* The call's own deadline ends the retries of a failing server. */
	call = (struct net_http_call){.deadline_ms = 300};
	int64_t t0 = now_ms();
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, &call, &why), -EIO);
	int64_t ms = now_ms() - t0;
	assert_true(ms >= 250 && ms < 2000);
	assert_non_null(strstr(why.text, "HTTP 500 after "));
	assert_non_null(strstr(why.text, "attempts, deadline of 0.3 s reached"));
	server_set(srv.port, "fail_rate=0");
	net_http_free(c);
}

struct stopper {
	atomic_int *stop;
	int after_ms;
};

static void *stop_later(void *arg)
{
	struct stopper *s = arg;
	usleep((useconds_t)s->after_ms * 1000);
	atomic_store(s->stop, 1);
	return NULL;
}

/* A stop flag set while a server sends nothing: the attempt in flight
 * ends within about a second, not at the stall timeout (an abort never
 * waits for a hung peer: issue 17, item 2). */
static void test_stop_in_flight(void **state)
{
	(void)state;
	struct net_http_opts o = {.retries = 3, .timeout_ms = 30000, .deadline_ms = 60000};
	struct net_http *c;
	char url[MAX_URL];
	struct ptc_error why;
	uint8_t *data;
	size_t len;
	atomic_int stop;
	pthread_t t;

	assert_int_equal(net_http_new(&o, &c, &why), 0);
	atomic_init(&stop, 0);
	struct stopper s = {&stop, 300};
	struct net_http_call call = {.stop = &stop};
	server_set(srv.port, "fail_rate=1&modes=stall&stall_seconds=20&reset=1");
	url_of(url, srv.port, "index.json");
	assert_int_equal(pthread_create(&t, NULL, stop_later, &s), 0);
	int64_t t0 = now_ms();
	assert_int_equal(net_http_get(c, url, 4096, &data, &len, &call, &why), -ECANCELED);
	int64_t ms = now_ms() - t0;
	pthread_join(t, NULL);
	assert_true(ms >= 250 && ms < 2500);
	assert_non_null(strstr(why.text, "cancelled"));
	assert_int_equal(why.code, -ECANCELED);
	assert_int_equal(stats(c).requests, 1); /* and no retry */
	server_set(srv.port, "fail_rate=0&stall_seconds=5");
	net_http_free(c);
}

/* Threads share one client: every byte right, connections reused. */
struct worker {
	struct net_http *c;
	char url[MAX_URL];
	int seed;
};

static void *range_worker(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < 25; i++) {
		int64_t off = (w->seed * 7919 + i * 104729) % (BIG_SIZE - 5000);
		check_range(w->c, w->url, off, 1 + (w->seed * 31 + i * 17) % 5000, 1 + i % 4,
			    (uint64_t)(w->seed * 100 + i));
	}
	return NULL;
}

static void test_threads(void **state)
{
	(void)state;
	struct net_http *c = client(20);
	struct worker w[4];
	pthread_t tid[4];
	long req, failed, conns;

	server_set(srv.port, "fail_rate=0&reset=1");
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.c = c, .seed = i + 1};
		url_of(w[i].url, srv.port, "a.bin");
		assert_int_equal(pthread_create(&tid[i], NULL, range_worker, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(tid[i], NULL);
	server_stats(srv.port, &req, &failed, &conns);
	assert_int_equal(req, 100);
	assert_true(conns >= 1 && conns <= 4);

	/* And through a flaky server: retried, never a wrong byte. */
	server_set(srv.port, "fail_rate=0.3&seed=5&reset=1&modes=500,503,drop,truncate,"
			     "ignore-range,short,badrange");
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&tid[i], NULL, range_worker, &w[i]), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(tid[i], NULL);
	assert_true(stats(c).retries > 0);
	assert_int_equal(stats(c).failures, 0);
	server_set(srv.port, "fail_rate=0");
	net_http_free(c);
}

/* One GET of small.bin from its own server (struct worker's url), as one of
 * many threads of a round. */
static void *origin_worker(void *arg)
{
	struct worker *w = arg;
	struct ptc_error why;
	uint8_t *data;
	size_t len;

	if (net_http_get(w->c, w->url, 1 << 20, &data, &len, NULL, &why) == 0)
		free(data);
	else
		w->seed = -1; /* failed: checked by the test */
	return NULL;
}

/* Many hosts at once (a coordinator asking every node): each call gets the
 * pooled handle that last went to its host, so each host sees one
 * connection however many rounds of concurrent calls go by. Every reply
 * waits 0.2 s (the server's stall), so that a round's calls are all in
 * flight together, as a coordinator's are: a call that ended before another
 * began would hand that one its handle. Taking whichever handle came back
 * last opened a new connection for most calls (a handle caches five). */
static void test_pool_reuses_per_host(void **state)
{
	(void)state;
	enum { ROUNDS = 10 };
	struct unit_server *sv = hosts;
	struct net_http *c = client(2);
	struct worker w[HOSTS];
	pthread_t tid[HOSTS];
	long req, failed, conns;

	for (int i = 0; i < HOSTS; i++) {
		unit_server_start(&sv[i], dir, NULL);
		server_set(sv[i].port, "fail_rate=1&modes=stall&stall_seconds=0.2&reset=1");
	}
	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < HOSTS; i++) {
			w[i] = (struct worker){.c = c, .seed = i};
			url_of(w[i].url, sv[(i + r) % HOSTS].port, "small.bin");
			assert_int_equal(pthread_create(&tid[i], NULL, origin_worker, &w[i]), 0);
		}
		for (int i = 0; i < HOSTS; i++) {
			pthread_join(tid[i], NULL);
			assert_true(w[i].seed >= 0);
		}
	}
	for (int i = 0; i < HOSTS; i++) {
		server_stats(sv[i].port, &req, &failed, &conns);
		assert_int_equal(req, ROUNDS);
		/* the tested client's one, and server_stats' own when the control
		 * client's (one handle, five connections, seven hosts) was dropped */
		assert_true(conns >= 1 && conns <= 2);
		unit_server_stop(&sv[i]);
	}
	net_http_free(c);
}

/* A proxy named by the environment: a client as created carries its POST
 * there, as libcurl does for any program; one with opts.direct (the job's
 * own traffic: etcd, peers) goes straight to the server named. The
 * "proxy" is a second test server, which answers the forwarded request
 * itself; each server's request count says which one got it. */
static void test_direct_ignores_proxy_env(void **state)
{
	(void)state;
	struct unit_server *proxy = &hosts[0];
	struct net_http_opts o = {.retries = 0, .backoff_ms = 1};
	static const char body[] = "{}";
	static const char *const vars[] = {"no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"};
	struct net_http *via, *direct;
	char url[MAX_URL], env[MAX_URL];
	struct ptc_error why;
	uint8_t *data;
	size_t len;
	long req_srv, req_proxy, failed, conns;

	unit_server_start(proxy, dir, NULL);
	server_set(srv.port, "fail_rate=0&reset=1");
	server_set(proxy->port, "fail_rate=0&reset=1");
	assert_int_equal(net_http_new(&o, &via, &why), 0);
	o.direct = true;
	assert_int_equal(net_http_new(&o, &direct, &why), 0);
	url_of(url, srv.port, "v3/kv/range");
	snprintf(env, sizeof(env), "http://127.0.0.1:%d", proxy->port);
	char *saved[sizeof(vars) / sizeof(vars[0])];
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
		unsetenv(vars[i]);
	}
	setenv("http_proxy", env, 1);
	/* read per transfer: the control client's calls below come after */
	int rc_via = net_http_post_json(via, url, body, 2, 4096, &data, &len, NULL, &why);
	if (rc_via == 0)
		free(data);
	int rc_direct = net_http_post_json(direct, url, body, 2, 4096, &data, &len, NULL, &why);
	if (rc_direct == 0)
		free(data);
	unsetenv("http_proxy");
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		if (saved[i])
			setenv(vars[i], saved[i], 1);
		free(saved[i]);
	}
	assert_int_equal(rc_via, 0);
	assert_int_equal(rc_direct, 0);
	server_stats(srv.port, &req_srv, &failed, &conns);
	server_stats(proxy->port, &req_proxy, &failed, &conns);
	assert_int_equal(req_proxy, 1); /* the first client's, forwarded */
	assert_int_equal(req_srv, 1);	/* the direct client's */
	net_http_free(via);
	net_http_free(direct);
	unit_server_stop(proxy);
}

int main(void)
{
	const struct CMUnitTest http_tests[] = {
	    cmocka_unit_test(test_range),
	    cmocka_unit_test(test_range_modes),
	    cmocka_unit_test(test_get),
	    cmocka_unit_test(test_post),
	    cmocka_unit_test(test_post_retries),
	    cmocka_unit_test(test_call),
	    cmocka_unit_test(test_stop_in_flight),
	    cmocka_unit_test(test_threads),
	    cmocka_unit_test(test_pool_reuses_per_host),
	    cmocka_unit_test(test_direct_ignores_proxy_env),
	};
	int failed;

	signal(SIGPIPE, SIG_IGN);
	failed = cmocka_run_group_tests_name("http", http_tests, http_setup, http_teardown);
	if (!http_started)
		fprintf(stderr, "test_net: the HTTP tests did not run\n");
	return failed || !http_started ? 1 : 0;
}
