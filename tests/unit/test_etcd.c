/*
 * test_etcd.c - net_etcd against a real etcd (Debian's etcd-server, which
 * `make deps` installs), started here on free ports in a temporary
 * directory and stopped at the end: keys and values (binary, every base64
 * tail length), prefixes, transactions as compare-and-swap, leases and
 * their keys, a watch (puts and deletes in order, from a revision), and the
 * errors when etcd is gone.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/net.h"
#include "net/net_i.h"

static pid_t etcd_pid = -1;
static char etcd_dir[] = "/tmp/mlfs-test-etcd-XXXXXX";
static char endpoint[64];
static struct net_etcd *E;
static struct ptc_error why;

static int free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &len)) {
		perror("free_port");
		exit(1);
	}
	close(fd);
	return ntohs(a.sin_port);
}

static char peer[64];

/* Starts etcd on @endpoint and @peer with its data in etcd_dir. */
static int etcd_spawn(void)
{
	char data[160], cluster[160], log[160];
	const char *client = endpoint;

	snprintf(cluster, sizeof(cluster), "default=%s", peer);
	snprintf(data, sizeof(data), "%s/data", etcd_dir);
	snprintf(log, sizeof(log), "%s/etcd.log", etcd_dir);
	etcd_pid = fork();
	if (etcd_pid < 0)
		return -1;
	if (etcd_pid == 0) {
		if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
			_exit(126);
		execlp("etcd", "etcd", "--data-dir", data, "--listen-client-urls", client,
		       "--advertise-client-urls", client, "--listen-peer-urls", peer,
		       "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
		       (char *)NULL);
		_exit(127);
	}
	return 0;
}

/* Waits until etcd answers a read (a few hundred ms; 10 s at most). */
static int etcd_wait(void)
{
	char log[160];
	snprintf(log, sizeof(log), "%s/etcd.log", etcd_dir);
	for (int i = 0; i < 200; i++) {
		struct net_etcd_kv *kvs;
		size_t n;
		if (net_etcd_range(E, "/ping", false, &kvs, &n, NULL, NULL, &why) == 0) {
			net_etcd_kvs_free(kvs, n);
			return 0;
		}
		int st;
		if (waitpid(etcd_pid, &st, WNOHANG) == etcd_pid) {
			fprintf(stderr,
				"etcd exited (see %s): is etcd-server installed? (make deps)\n",
				log);
			etcd_pid = -1;
			return -1;
		}
		usleep(50000);
	}
	fprintf(stderr, "etcd did not answer in 10 s: %s\n", why.text);
	return -1;
}

static int etcd_start(void **state)
{
	(void)state;
	if (!mkdtemp(etcd_dir))
		return -1;
	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", free_port());
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", free_port());
	if (etcd_spawn())
		return -1;
	struct net_http_opts o = {.retries = 0, .timeout_ms = 2000, .deadline_ms = 5000};
	if (net_etcd_new(endpoint, &o, &E, &why)) {
		fprintf(stderr, "net_etcd_new: %s\n", why.text);
		return -1;
	}
	return etcd_wait();
}

static void etcd_stop(void)
{
	if (etcd_pid > 0) {
		kill(etcd_pid, SIGKILL);
		waitpid(etcd_pid, NULL, 0);
		etcd_pid = -1;
	}
}

static int etcd_teardown(void **state)
{
	(void)state;
	net_etcd_free(E);
	E = NULL;
	etcd_stop();
	char cmd[200];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", etcd_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ tests */

static void test_put_get_delete(void **state)
{
	(void)state;
	struct net_etcd_kv kv;

	assert_int_equal(net_etcd_get(E, "/t1/none", &kv, NULL, &why), -ENOENT);
	/* Binary values of every base64 tail length, NULs included. */
	for (size_t len = 0; len < 8; len++) {
		char v[8] = {'\0', 'a', '\xff', '\n', 'b', '\0', '=', '/'};
		assert_int_equal(net_etcd_put(E, "/t1/k", v, len, 0, NULL, &why), 0);
		assert_int_equal(net_etcd_get(E, "/t1/k", &kv, NULL, &why), 0);
		assert_string_equal(kv.key, "/t1/k");
		assert_int_equal(kv.len, len);
		assert_memory_equal(kv.value, v, len);
		assert_int_equal(kv.value[len], '\0');
		assert_int_equal(kv.version, (int64_t)len + 1);
		free(kv.key);
		free(kv.value);
	}
	/* A prefix: only its keys, sorted; not "/t1x". */
	const char *keys[] = {"/t1/b", "/t1/a", "/t1/c/d", "/t1x", "/t0"};
	for (int i = 0; i < 5; i++)
		assert_int_equal(net_etcd_put(E, keys[i], keys[i], strlen(keys[i]), 0, NULL, &why),
				 0);
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev = 0;
	assert_int_equal(net_etcd_range(E, "/t1/", true, &kvs, &n, &rev, NULL, &why), 0);
	assert_int_equal(n, 4);
	assert_string_equal(kvs[0].key, "/t1/a");
	assert_string_equal(kvs[1].key, "/t1/b");
	assert_string_equal(kvs[2].key, "/t1/c/d");
	assert_string_equal(kvs[3].key, "/t1/k");
	assert_string_equal(kvs[1].value, "/t1/b");
	assert_true(rev >= kvs[1].mod_revision && kvs[1].mod_revision > 0);
	net_etcd_kvs_free(kvs, n);
	int64_t deleted = 0;
	assert_int_equal(net_etcd_delete(E, "/t1/", true, &deleted, NULL, &why), 0);
	assert_int_equal(deleted, 4);
	assert_int_equal(net_etcd_get(E, "/t1/a", &kv, NULL, &why), -ENOENT);
	assert_int_equal(net_etcd_get(E, "/t1x", &kv, NULL, &why), 0);
	free(kv.key);
	free(kv.value);
}

static void test_txn(void **state)
{
	(void)state;
	bool ok = false;
	/* Create only if absent: the first wins, the second is refused. */
	struct net_etcd_cmp absent = {
	    .key = "/t2/attempt", .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_op put1 = {
	    .kind = NET_ETCD_PUT, .key = "/t2/attempt", .value = "one", .len = 3};
	struct net_etcd_op put2 = {
	    .kind = NET_ETCD_PUT, .key = "/t2/attempt", .value = "two", .len = 3};
	struct net_etcd_op mark = {.kind = NET_ETCD_PUT, .key = "/t2/lost", .value = "x", .len = 1};
	assert_int_equal(net_etcd_txn(E, &absent, 1, &put1, 1, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_true(ok);
	assert_int_equal(net_etcd_txn(E, &absent, 1, &put2, 1, &mark, 1, &ok, NULL, NULL, &why), 0);
	assert_false(ok);
	struct net_etcd_kv kv;
	assert_int_equal(net_etcd_get(E, "/t2/attempt", &kv, NULL, &why), 0);
	assert_string_equal(kv.value, "one");
	free(kv.key);
	free(kv.value);
	assert_int_equal(net_etcd_get(E, "/t2/lost", &kv, NULL, &why), 0); /* else */
	free(kv.key);
	free(kv.value);
	/* A commit: "config" := new and "attempt" deleted, only while the
	 * attempt is still the one we made (its value). */
	struct net_etcd_cmp mine = {"/t2/attempt", NET_ETCD_VALUE, NET_ETCD_EQUAL, 0, "one", 3};
	struct net_etcd_cmp theirs = {"/t2/attempt", NET_ETCD_VALUE, NET_ETCD_EQUAL, 0, "two", 3};
	struct net_etcd_op commit[] = {
	    {.kind = NET_ETCD_PUT, .key = "/t2/config", .value = "v2", .len = 2},
	    {.kind = NET_ETCD_DELETE, .key = "/t2/attempt"}};
	assert_int_equal(net_etcd_txn(E, &theirs, 1, commit, 2, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_false(ok);
	assert_int_equal(net_etcd_get(E, "/t2/config", &kv, NULL, &why), -ENOENT);
	int64_t rev = 0;
	assert_int_equal(net_etcd_txn(E, &mine, 1, commit, 2, NULL, 0, &ok, &rev, NULL, &why), 0);
	assert_true(ok && rev > 0);
	assert_int_equal(net_etcd_get(E, "/t2/attempt", &kv, NULL, &why), -ENOENT);
	assert_int_equal(net_etcd_get(E, "/t2/config", &kv, NULL, &why), 0);
	assert_string_equal(kv.value, "v2");
	assert_int_equal(kv.mod_revision, rev);
	free(kv.key);
	free(kv.value);
	/* Greater / less on mod revisions. */
	struct net_etcd_cmp newer = {.key = "/t2/config",
				     .target = NET_ETCD_MOD,
				     .result = NET_ETCD_GREATER,
				     .num = rev - 1};
	assert_int_equal(net_etcd_txn(E, &newer, 1, NULL, 0, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_true(ok);
	newer.result = NET_ETCD_LESS;
	assert_int_equal(net_etcd_txn(E, &newer, 1, NULL, 0, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_false(ok);
}

static void test_leases(void **state)
{
	(void)state;
	int64_t id = 0, ttl = 0;
	struct net_etcd_kv kv;

	assert_int_equal(net_etcd_lease_grant(E, 5, &id, NULL, &why), 0);
	assert_true(id != 0);
	assert_int_equal(net_etcd_put(E, "/t3/nodes/n0", "up", 2, id, NULL, &why), 0);
	assert_int_equal(net_etcd_get(E, "/t3/nodes/n0", &kv, NULL, &why), 0);
	assert_int_equal(kv.lease, id);
	free(kv.key);
	free(kv.value);
	assert_int_equal(net_etcd_lease_keepalive(E, id, &ttl, NULL, &why), 0);
	assert_true(ttl > 0 && ttl <= 5);
	/* Revoked: its keys vanish at once, and it cannot be kept alive. */
	assert_int_equal(net_etcd_lease_revoke(E, id, NULL, &why), 0);
	assert_int_equal(net_etcd_get(E, "/t3/nodes/n0", &kv, NULL, &why), -ENOENT);
	assert_int_equal(net_etcd_lease_keepalive(E, id, &ttl, NULL, &why), -ENOENT);
	assert_non_null(strstr(why.text, "expired"));
	assert_int_equal(why.code, -ENOENT);
	/* A put bound to a lease that does not exist is refused by etcd. */
	assert_int_equal(net_etcd_put(E, "/t3/x", "y", 1, id, NULL, &why), -EIO);
	assert_non_null(strstr(why.text, "lease"));
	assert_int_equal(why.code, -EIO);
}

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* What a watch reported: its events as "P key=value@rev" / "D key@rev". */
struct seen {
	pthread_mutex_t lock;
	char log[4096];
	int64_t created, ended;
	int calls;
};

static void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct seen *s = arg;
	pthread_mutex_lock(&s->lock);
	s->calls++;
	if (n == 0 && revision > 0)
		s->created = revision;
	else if (n == 0)
		s->ended = revision;
	for (size_t i = 0; i < n; i++) {
		size_t k = strlen(s->log);
		if (ev[i].deleted)
			snprintf(s->log + k, sizeof(s->log) - k, "D %s@%lld;", ev[i].kv.key,
				 (long long)ev[i].kv.mod_revision);
		else if (ev[i].kv.len > 64) /* its length and last bytes */
			snprintf(s->log + k, sizeof(s->log) - k, "P %s=%zu...%s@%lld;",
				 ev[i].kv.key, ev[i].kv.len, ev[i].kv.value + ev[i].kv.len - 3,
				 (long long)ev[i].kv.mod_revision);
		else
			snprintf(s->log + k, sizeof(s->log) - k, "P %s=%.*s@%lld;", ev[i].kv.key,
				 (int)ev[i].kv.len, ev[i].kv.value,
				 (long long)ev[i].kv.mod_revision);
	}
	pthread_mutex_unlock(&s->lock);
}

/* Waits (at most 5 s) until @s's log holds @want. */
static bool seen_wait(struct seen *s, const char *want)
{
	for (int i = 0; i < 500; i++) {
		pthread_mutex_lock(&s->lock);
		bool ok = strstr(s->log, want) != NULL;
		pthread_mutex_unlock(&s->lock);
		if (ok)
			return true;
		usleep(10000);
	}
	fprintf(stderr, "watch log: %s (wanted %s)\n", s->log, want);
	return false;
}

static void test_watch(void **state)
{
	(void)state;
	struct seen s = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct net_etcd_watch *w;
	int64_t rev = 0, rev2 = 0;
	struct net_etcd_kv *kvs;
	size_t n;
	char want[128];

	/* A change made between the range and the watch is not missed: the
	 * watch starts at the revision after the range's. */
	assert_int_equal(net_etcd_put(E, "/t5/a", "1", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_range(E, "/t5/", true, &kvs, &n, &rev, NULL, &why), 0);
	net_etcd_kvs_free(kvs, n);
	assert_int_equal(net_etcd_put(E, "/t5/b", "2", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_watch_start(E, "/t5/", rev + 1, on_watch, NULL, &s, &w, &why), 0);
	assert_true(seen_wait(&s, "P /t5/b=2@"));
	assert_null(strstr(s.log, "/t5/a")); /* before the start revision */
	/* Puts and deletes under the prefix, in order; other keys not. */
	assert_int_equal(net_etcd_put(E, "/t6/x", "no", 2, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_put(E, "/t5/a", "3", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_delete(E, "/t5/b", false, NULL, NULL, &why), 0);
	assert_int_equal(net_etcd_range(E, "/t5/", true, &kvs, &n, &rev2, NULL, &why), 0);
	net_etcd_kvs_free(kvs, n);
	snprintf(want, sizeof(want), "D /t5/b@%lld;", (long long)rev2);
	assert_true(seen_wait(&s, want));
	assert_non_null(strstr(s.log, "P /t5/a=3@"));
	assert_true(strstr(s.log, "P /t5/a=3@") < strstr(s.log, "D /t5/b@"));
	assert_null(strstr(s.log, "/t6/"));
	assert_true(s.created > 0);
	/* A value larger than one read of the stream arrives whole. */
	size_t big = 300000;
	char *v = malloc(big);
	assert_non_null(v);
	memset(v, 'z', big);
	memcpy(v + big - 3, "end", 3);
	assert_int_equal(net_etcd_put(E, "/t5/big", v, big, 0, NULL, &why), 0);
	free(v);
	assert_true(seen_wait(&s, "P /t5/big=300000...end@"));
	/* An idle watch makes no request: stopping it ends it at once. */
	net_etcd_watch_stop(w);
	assert_int_equal(s.ended, -ECANCELED);
	int calls = s.calls;
	usleep(50000);
	assert_int_equal(s.calls, calls); /* nothing after the last call */
}

/* A watch with a settled hook: called after the events it read went to
 * the watch's function, once per batch, never for the creation or the
 * end; outside libcurl's callbacks, so that it can make a request of its
 * own (mlfs's control plane runs a round there). */
struct settled {
	struct seen s;
	int settled, requests_ok;
	size_t logged; /* the log's length at the last settled call */
};

static void on_settled(void *arg)
{
	struct settled *t = arg;
	struct net_etcd_kv *kvs;
	struct ptc_error e;
	size_t n;

	pthread_mutex_lock(&t->s.lock);
	t->settled++;
	t->logged = strlen(t->s.log);
	pthread_mutex_unlock(&t->s.lock);
	if (net_etcd_range(E, "/t10/", true, &kvs, &n, NULL, NULL, &e) == 0) {
		net_etcd_kvs_free(kvs, n);
		pthread_mutex_lock(&t->s.lock);
		t->requests_ok++;
		pthread_mutex_unlock(&t->s.lock);
	}
}

static void test_watch_settled(void **state)
{
	(void)state;
	struct settled t = {.s = {.lock = PTHREAD_MUTEX_INITIALIZER}};
	struct net_etcd_watch *w;

	assert_int_equal(net_etcd_watch_start(E, "/t10/", 0, on_watch, on_settled, &t, &w, &why),
			 0);
	for (int i = 0; i < 500 && !t.s.created; i++)
		usleep(10000);
	assert_true(t.s.created > 0);
	pthread_mutex_lock(&t.s.lock);
	assert_int_equal(t.settled, 0); /* the creation is no event */
	pthread_mutex_unlock(&t.s.lock);
	assert_int_equal(net_etcd_put(E, "/t10/a", "1", 1, 0, NULL, &why), 0);
	assert_true(seen_wait(&t.s, "P /t10/a=1@"));
	for (int i = 0; i < 500 && t.requests_ok < 1; i++)
		usleep(10000);
	pthread_mutex_lock(&t.s.lock);
	assert_int_equal(t.settled, 1);
	assert_int_equal(t.requests_ok, 1);	     /* its own request, from the watch's thread */
	assert_int_equal(t.logged, strlen(t.s.log)); /* after the event, not before */
	pthread_mutex_unlock(&t.s.lock);
	/* Three events of one transaction: one message, one settled call. */
	struct net_etcd_op ops[] = {{.kind = NET_ETCD_PUT, .key = "/t10/b", .value = "2", .len = 1},
				    {.kind = NET_ETCD_PUT, .key = "/t10/c", .value = "3", .len = 1},
				    {.kind = NET_ETCD_DELETE, .key = "/t10/a"}};
	bool ok = false;
	assert_int_equal(net_etcd_txn(E, NULL, 0, ops, 3, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_true(ok);
	assert_true(seen_wait(&t.s, "D /t10/a@"));
	for (int i = 0; i < 500 && t.requests_ok < 2; i++)
		usleep(10000);
	pthread_mutex_lock(&t.s.lock);
	assert_int_equal(t.settled, 2);
	assert_non_null(strstr(t.s.log, "P /t10/b=2@"));
	assert_non_null(strstr(t.s.log, "P /t10/c=3@"));
	assert_int_equal(t.logged, strlen(t.s.log));
	pthread_mutex_unlock(&t.s.lock);
	net_etcd_watch_stop(w);
	assert_int_equal(t.s.ended, -ECANCELED);
	assert_int_equal(t.settled, 2); /* not for the end */
}

/* A watch that carries more than HTTP/2's windows over its life: 40
 * values of 1 MiB, every one reported (a job/ manifest in each attempt,
 * which grows as the job writes files, is such a stream). */
static void test_watch_carries_many_large_values(void **state)
{
	(void)state;
	struct seen s = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct net_etcd_watch *w;
	size_t big = 1 << 20;
	char *v = malloc(big), want[64];

	assert_non_null(v);
	memset(v, 'y', big);
	assert_int_equal(net_etcd_watch_start(E, "/t9/", 0, on_watch, NULL, &s, &w, &why), 0);
	int64_t created = 0;
	for (int i = 0; i < 200 && !created; i++) {
		usleep(10000);
		pthread_mutex_lock(&s.lock); /* the watch's thread writes it */
		created = s.created;
		pthread_mutex_unlock(&s.lock);
	}
	assert_true(created > 0);
	for (int i = 0; i < 40; i++) {
		char tail[4];
		snprintf(tail, sizeof(tail), "%03d", i);
		memcpy(v + big - 3, tail, 3);
		assert_int_equal(net_etcd_put(E, "/t9/k", v, big, 0, NULL, &why), 0);
		snprintf(want, sizeof(want), "P /t9/k=%zu...%03d@", big, i);
		assert_true(seen_wait(&s, want));
	}
	free(v);
	net_etcd_watch_stop(w);
}

/* A watch from a revision etcd compacted away: etcd creates it, then
 * cancels it; the last call says -ESTALE and the error names the
 * compaction (the mirror reads the keys again then). */
static void test_watch_compacted(void **state)
{
	(void)state;
	struct seen s = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct net_etcd_watch *w;
	struct net_etcd_kv *kvs;
	struct net_http *http;
	int64_t first = 0, rev = 0;
	size_t n;
	char url[128], body[64];
	uint8_t *reply;
	size_t len;

	assert_int_equal(net_etcd_put(E, "/t8/a", "1", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_range(E, "/t8/", true, &kvs, &n, &first, NULL, &why), 0);
	net_etcd_kvs_free(kvs, n);
	assert_int_equal(net_etcd_put(E, "/t8/a", "2", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_put(E, "/t8/a", "3", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_range(E, "/t8/", true, &kvs, &n, &rev, NULL, &why), 0);
	net_etcd_kvs_free(kvs, n);
	/* (compaction is no call of net_etcd's: the gateway's, directly) */
	assert_int_equal(net_http_new(NULL, &http, &why), 0);
	snprintf(url, sizeof(url), "%s/v3/kv/compaction", endpoint);
	snprintf(body, sizeof(body), "{\"revision\": %lld}", (long long)rev);
	assert_int_equal(
	    net_http_post_json(http, url, body, strlen(body), 4096, &reply, &len, NULL, &why), 0);
	free(reply);
	net_http_free(http);
	assert_int_equal(net_etcd_watch_start(E, "/t8/", first, on_watch, NULL, &s, &w, &why), 0);
	for (int i = 0; i < 500 && !s.ended; i++)
		usleep(10000);
	assert_int_equal(s.ended, -ESTALE);
	assert_non_null(strstr(net_etcd_watch_error(w), "compacted"));
	assert_null(strstr(s.log, "/t8/a=2")); /* nothing from the compacted past */
	net_etcd_watch_stop(w);
}

static void etcd_stop(void);

/* etcd restarted on its port: the client's next call, whose pooled
 * handle held an HTTP/2 connection to the old process, succeeds at once
 * on a new one, with no retry to spend (this client has none). */
static void test_etcd_restarted(void **state)
{
	(void)state;
	struct net_etcd_kv kv;

	assert_int_equal(net_etcd_put(E, "/t9/a", "1", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_get(E, "/t9/a", &kv, NULL, &why), 0);
	free(kv.key);
	free(kv.value);
	etcd_stop();
	assert_int_equal(etcd_spawn(), 0);
	/* (another client waits for it: E's pooled handles stay as they were) */
	struct net_etcd *probe;
	struct net_http_opts o = {.retries = 0, .timeout_ms = 2000, .deadline_ms = 5000};
	assert_int_equal(net_etcd_new(endpoint, &o, &probe, &why), 0);
	struct net_etcd *keep = E;
	E = probe;
	assert_int_equal(etcd_wait(), 0);
	E = keep;
	net_etcd_free(probe);
	assert_int_equal(net_etcd_put(E, "/t9/a", "2", 1, 0, NULL, &why), 0);
	assert_int_equal(net_etcd_get(E, "/t9/a", &kv, NULL, &why), 0);
	assert_int_equal(kv.len, 1);
	assert_int_equal(kv.value[0], '2');
	free(kv.key);
	free(kv.value);
}

/* A port that takes connections and never answers (a frozen member: the
 * kernel completes the handshake, nobody reads); its socket into *@fd. */
static int frozen_port(int *fd)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	*fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(*fd >= 0);
	assert_int_equal(bind(*fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(*fd, 64), 0);
	assert_int_equal(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
	return ntohs(a.sin_port);
}

/* Several members: a call goes on to the next member when one is down
 * (refused) or frozen (nothing received), and stays there; a transaction
 * goes on only when it cannot have reached the first; a watch that cannot
 * be kept on a member moves the client to the next, where the next watch
 * starts. */
static void test_members_fail_over(void **state)
{
	(void)state;
	char list[256], dead[64], frozen[64];
	const char *cur;
	struct net_etcd *M, *T;
	struct net_etcd_kv kv;
	int ffd;
	bool ok = false;
	struct net_http_opts o = {.retries = 1, .timeout_ms = 300, .deadline_ms = 5000};

	snprintf(dead, sizeof(dead), "http://127.0.0.1:%d", free_port());
	snprintf(frozen, sizeof(frozen), "http://127.0.0.1:%d", frozen_port(&ffd));
	snprintf(list, sizeof(list), "%s,%s/,%s", dead, frozen, endpoint);
	assert_int_equal(net_etcd_new(list, &o, &M, &why), 0);
	assert_int_equal(net_etcd_members(M, &cur), 3);
	assert_string_equal(cur, dead);
	int64_t t0 = now_ms();
	assert_int_equal(net_etcd_put(M, "/t9/a", "1", 1, 0, NULL, &why), 0);
	assert_true(now_ms() - t0 >= 300); /* the frozen one's stall */
	assert_int_equal(net_etcd_members(M, &cur), 3);
	assert_string_equal(cur, endpoint);
	t0 = now_ms();
	assert_int_equal(net_etcd_get(M, "/t9/a", &kv, NULL, &why), 0); /* there at once */
	assert_true(now_ms() - t0 < 1500); /* not the frozen one's 300 ms again */
	assert_memory_equal(kv.value, "1", 1);
	free(kv.key);
	free(kv.value);

	/* A transaction: on from a refused member (it never got it), not from
	 * a frozen one (it may have: the request was sent). */
	struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = "/t9/t", .value = "x", .len = 1};
	snprintf(list, sizeof(list), "%s,%s", dead, endpoint);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	assert_int_equal(net_etcd_txn(T, NULL, 0, &put, 1, NULL, 0, &ok, NULL, NULL, &why), 0);
	assert_true(ok);
	net_etcd_free(T);
	snprintf(list, sizeof(list), "%s,%s", frozen, endpoint);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	put.value = "y";
	int rc = net_etcd_txn(T, NULL, 0, &put, 1, NULL, 0, &ok, NULL, NULL, &why);
	assert_int_equal(rc, -EIO);
	assert_non_null(strstr(why.text, frozen));
	assert_int_equal(net_etcd_get(E, "/t9/t", &kv, NULL, &why), 0);
	assert_memory_equal(kv.value, "x", 1); /* not carried out elsewhere */
	free(kv.key);
	free(kv.value);
	/* every member down: the error says how many were tried */
	net_etcd_free(T);
	snprintf(list, sizeof(list), "%s,%s", dead, dead);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	assert_int_equal(net_etcd_get(T, "/t9/a", &kv, NULL, &why), -EIO);
	assert_non_null(
	    strstr(why.text, "etcd: the call failed on 4 tries of 2 members, the last: "));
	assert_non_null(strstr(why.text, dead));
	net_etcd_free(T);

	/* A watch on a refused member ends and moves the client on; the next
	 * watch starts on the member that answers. */
	snprintf(list, sizeof(list), "%s,%s", dead, endpoint);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	struct seen s1 = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct seen s2 = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct net_etcd_watch *w;
	assert_int_equal(net_etcd_watch_start(T, "/t9/", 0, on_watch, NULL, &s1, &w, &why), 0);
	for (int i = 0; i < 500 && !s1.ended; i++)
		usleep(10000);
	assert_int_equal(s1.ended, -EIO);
	net_etcd_watch_stop(w);
	assert_int_equal(net_etcd_members(T, &cur), 2);
	assert_string_equal(cur, endpoint);
	assert_int_equal(net_etcd_watch_start(T, "/t9/", 0, on_watch, NULL, &s2, &w, &why), 0);
	for (int i = 0; i < 500 && !s2.created; i++)
		usleep(10000);
	assert_true(s2.created > 0);
	assert_int_equal(net_etcd_put(T, "/t9/w", "2", 1, 0, NULL, &why), 0);
	assert_true(seen_wait(&s2, "P /t9/w=2@"));
	/* A watch its member does not create (frozen) ends within 4 s and
	 * moves the client on. */
	net_etcd_watch_stop(w);
	net_etcd_free(T);
	snprintf(list, sizeof(list), "%s,%s", frozen, endpoint);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	struct seen s4 = {.lock = PTHREAD_MUTEX_INITIALIZER};
	t0 = now_ms();
	assert_int_equal(net_etcd_watch_start(T, "/t9/", 0, on_watch, NULL, &s4, &w, &why), 0);
	for (int i = 0; i < 700 && !s4.ended; i++)
		usleep(10000);
	assert_int_equal(s4.ended, -ETIMEDOUT);
	assert_true(now_ms() - t0 >= 3900 && now_ms() - t0 < 6000);
	assert_non_null(strstr(net_etcd_watch_error(w), "not created by"));
	assert_int_equal(net_etcd_members(T, &cur), 2);
	assert_string_equal(cur, endpoint);
	/* A call that moves the client on ends a watch on the member it left
	 * (a frozen member's watch would stay silent). */
	net_etcd_watch_stop(w);
	net_etcd_free(T);
	snprintf(list, sizeof(list), "%s,%s", endpoint, dead);
	assert_int_equal(net_etcd_new(list, &o, &T, &why), 0);
	struct seen s3 = {.lock = PTHREAD_MUTEX_INITIALIZER};
	assert_int_equal(net_etcd_watch_start(T, "/t9/", 0, on_watch, NULL, &s3, &w, &why), 0);
	for (int i = 0; i < 500 && !s3.created; i++)
		usleep(10000);
	assert_true(s3.created > 0);
	net_etcd_member_failed(T, 0); /* as a failed call would */
	for (int i = 0; i < 300 && !s3.ended; i++)
		usleep(10000);
	assert_int_equal(s3.ended, -EAGAIN);
	assert_non_null(strstr(net_etcd_watch_error(w), "moved from member"));
	net_etcd_watch_stop(w);
	net_etcd_free(T);
	net_etcd_free(M);
	close(ffd);
}

/* A watch whose etcd goes away ends with -EIO (see test_etcd_gone). */
static struct seen gone_seen = {.lock = PTHREAD_MUTEX_INITIALIZER};
static struct net_etcd_watch *gone_watch;

static void test_etcd_gone(void **state)
{
	(void)state;
	struct net_etcd_kv kv;
	struct net_etcd *bad;
	assert_int_equal(net_etcd_new("ftp://x", NULL, &bad, &why), -EINVAL);
	assert_int_equal(why.code, -EINVAL);
	assert_int_equal(
	    net_etcd_watch_start(E, "/t7/", 0, on_watch, NULL, &gone_seen, &gone_watch, &why), 0);
	for (int i = 0; i < 500 && !gone_seen.created; i++)
		usleep(10000);
	assert_true(gone_seen.created > 0);
	etcd_stop();
	/* The watch's stream ends with etcd: its last call says so. */
	for (int i = 0; i < 500 && !gone_seen.ended; i++)
		usleep(10000);
	assert_int_equal(gone_seen.ended, -EIO);
	assert_non_null(strstr(net_etcd_watch_error(gone_watch), "etcd watch"));
	net_etcd_watch_stop(gone_watch);
	int64_t t0 = now_ms();
	int rc = net_etcd_get(E, "/t1x", &kv, NULL, &why);
	assert_int_equal(rc, -EIO);
	assert_non_null(strstr(why.text, endpoint));
	assert_non_null(strstr(why.text, "/etcdserverpb.KV/Range"));
	assert_int_equal(why.code, rc);
	assert_true(now_ms() - t0 < 6000); /* the client's deadline (5 s) */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_put_get_delete),
	    cmocka_unit_test(test_txn),
	    cmocka_unit_test(test_leases),
	    cmocka_unit_test(test_watch),
	    cmocka_unit_test(test_watch_settled),
	    cmocka_unit_test(test_watch_compacted),
	    cmocka_unit_test(test_watch_carries_many_large_values),
	    cmocka_unit_test(test_etcd_restarted),
	    cmocka_unit_test(test_members_fail_over),
	    cmocka_unit_test(test_etcd_gone), /* last: stops etcd */
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests_name("etcd", tests, etcd_start, etcd_teardown) ? 1 : 0;
}
