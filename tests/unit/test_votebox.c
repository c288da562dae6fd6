/*
 * test_votebox.c - the coordinator's box of votes (cluster/mlfs_votebox.c):
 * a node's later vote replaces its earlier one, the copy is what the
 * coordinator's round decides on (key "<to>/<id>", value "<aid> <vote>"),
 * status.json's description names only the votes on one attempt, every
 * put wakes the listener (none once it stopped listening) unless its
 * attempt is expected and nothing is decidable yet, the box
 * holds up under concurrent puts from the peer server's threads, and a
 * vote's body is read back as it was made, every malformed field named.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster_i.h"

static int wakes;

static void count_wake(void *arg)
{
	(void)arg;
	wakes++;
}

/* The value of key @key in @kvs (@n), or NULL. */
static const char *value_of(const struct net_etcd_kv *kvs, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(kvs[i].key, key) == 0)
			return kvs[i].value;
	return NULL;
}

static void test_later_vote_replaces_earlier(void **state)
{
	(void)state;
	struct mlfs_votebox *b;
	struct net_etcd_kv *kvs;
	size_t n;

	assert_int_equal(mlfs_votebox_new(&b), 0);
	assert_int_equal(mlfs_votebox_copy(b, &kvs, &n), 0);
	assert_int_equal(n, 0);
	net_etcd_kvs_free(kvs, n);

	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "aaaa", "ready"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "aaaa", "failed: no memory"), 0);
	/* n1 votes again, on a later attempt to version 3 */
	assert_int_equal(mlfs_votebox_put(b, "n1", 3, "bbbb", "ready"), 0);
	assert_int_equal(mlfs_votebox_copy(b, &kvs, &n), 0);
	assert_int_equal(n, 2);
	assert_null(value_of(kvs, n, "2/n1"));
	assert_string_equal(value_of(kvs, n, "3/n1"), "bbbb ready");
	assert_string_equal(value_of(kvs, n, "2/n2"), "aaaa failed: no memory");
	for (size_t i = 0; i < n; i++)
		assert_int_equal(kvs[i].len, strlen(kvs[i].value));
	net_etcd_kvs_free(kvs, n);

	/* the swap's ack replaces n1's vote; n2's stays */
	assert_int_equal(mlfs_votebox_put(b, "n1", 3, "bbbb", "swapped"), 0);
	assert_int_equal(mlfs_votebox_copy(b, &kvs, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(value_of(kvs, n, "3/n1"), "bbbb swapped");
	assert_string_equal(value_of(kvs, n, "2/n2"), "aaaa failed: no memory");
	net_etcd_kvs_free(kvs, n);
	mlfs_votebox_free(b);
}

static void test_describe_names_one_attempt(void **state)
{
	(void)state;
	struct mlfs_votebox *b;

	assert_int_equal(mlfs_votebox_new(&b), 0);
	assert_int_equal(mlfs_votebox_put(b, "n0", 2, "abc", "ready"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "abcd", "ready"), 0); /* another id */
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "abc", "failed: disk full"), 0);
	json_t *d = mlfs_votebox_describe(b, "abc");
	assert_non_null(d);
	assert_int_equal(json_object_size(d), 2);
	assert_string_equal(json_string_value(json_object_get(d, "n0")), "ready");
	assert_string_equal(json_string_value(json_object_get(d, "n2")), "failed: disk full");
	assert_null(json_object_get(d, "n1"));
	json_decref(d);
	d = mlfs_votebox_describe(b, "zzz");
	assert_int_equal(json_object_size(d), 0);
	json_decref(d);
	mlfs_votebox_free(b);
}

static void test_every_put_wakes_the_listener(void **state)
{
	(void)state;
	struct mlfs_votebox *b;

	assert_int_equal(mlfs_votebox_new(&b), 0);
	wakes = 0;
	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "a", "ready"), 0);
	assert_int_equal(wakes, 0); /* nobody listens yet */
	mlfs_votebox_listen(b, count_wake, NULL);
	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "a", "ready"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "a", "ready"), 0);
	assert_int_equal(wakes, 2);
	mlfs_votebox_listen(b, NULL, NULL);
	assert_int_equal(mlfs_votebox_put(b, "n3", 2, "a", "ready"), 0);
	assert_int_equal(wakes, 2);
	mlfs_votebox_free(b);
	mlfs_votebox_free(NULL);
}

/* An expected attempt of three participants: its "ready" votes wake the
 * listener only at the third, a failed vote at once, its "swapped" acks
 * only at the third again; a vote on another attempt wakes at each. */
static void test_expected_attempt_wakes_when_decidable(void **state)
{
	(void)state;
	struct mlfs_votebox *b;

	assert_int_equal(mlfs_votebox_new(&b), 0);
	mlfs_votebox_listen(b, count_wake, NULL);
	mlfs_votebox_expect(b, "att1", 3);
	wakes = 0;
	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "att1", "ready"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "att1", "ready"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "att1", "ready"), 0); /* again */
	assert_int_equal(wakes, 0);
	assert_int_equal(mlfs_votebox_put(b, "n3", 2, "att1", "ready"), 0);
	assert_int_equal(wakes, 1); /* every one ready: the commit */
	assert_int_equal(mlfs_votebox_put(b, "n1", 2, "att1", "swapped"), 0);
	assert_int_equal(mlfs_votebox_put(b, "n3", 2, "att1", "swapped"), 0);
	assert_int_equal(wakes, 1);
	assert_int_equal(mlfs_votebox_put(b, "n2", 2, "att1", "swapped"), 0);
	assert_int_equal(wakes, 2); /* every one swapped: the release */
	/* a failure wakes at once, whatever came before */
	mlfs_votebox_expect(b, "att2", 3);
	assert_int_equal(mlfs_votebox_put(b, "n1", 3, "att2", "ready"), 0);
	assert_int_equal(wakes, 2);
	assert_int_equal(mlfs_votebox_put(b, "n2", 3, "att2", "failed: out of memory"), 0);
	assert_int_equal(wakes, 3);
	/* votes on an attempt not expected (a stale one, or none set) */
	assert_int_equal(mlfs_votebox_put(b, "n3", 2, "att1", "ready"), 0);
	assert_int_equal(wakes, 4);
	mlfs_votebox_free(b);
}

struct putter {
	struct mlfs_votebox *b;
	int first;
};

static void *put_many(void *arg)
{
	struct putter *p = arg;
	char id[16];
	for (int round = 0; round < 50; round++)
		for (int i = 0; i < 40; i++) {
			snprintf(id, sizeof(id), "n%d", p->first + i);
			if (mlfs_votebox_put(p->b, id, 2, round == 49 ? "last" : "early", "ready"))
				return (void *)1;
		}
	return NULL;
}

/* Four peer server threads put 40 nodes' votes 50 times each while the
 * control thread copies: every copy is consistent, the last holds each
 * node's last vote. */
static void test_concurrent_puts(void **state)
{
	(void)state;
	struct mlfs_votebox *b;
	pthread_t t[4];
	struct putter p[4];
	struct net_etcd_kv *kvs;
	size_t n;

	assert_int_equal(mlfs_votebox_new(&b), 0);
	for (int i = 0; i < 4; i++) {
		p[i] = (struct putter){.b = b, .first = 40 * i};
		assert_int_equal(pthread_create(&t[i], NULL, put_many, &p[i]), 0);
	}
	for (int k = 0; k < 200; k++) {
		assert_int_equal(mlfs_votebox_copy(b, &kvs, &n), 0);
		assert_true(n <= 160);
		for (size_t i = 0; i < n; i++)
			assert_true(strcmp(kvs[i].value, "early ready") == 0 ||
				    strcmp(kvs[i].value, "last ready") == 0);
		net_etcd_kvs_free(kvs, n);
	}
	for (int i = 0; i < 4; i++) {
		void *rc;
		pthread_join(t[i], &rc);
		assert_null(rc);
	}
	assert_int_equal(mlfs_votebox_copy(b, &kvs, &n), 0);
	assert_int_equal(n, 160);
	for (size_t i = 0; i < n; i++)
		assert_string_equal(kvs[i].value, "last ready");
	net_etcd_kvs_free(kvs, n);
	mlfs_votebox_free(b);
}

static void test_vote_body_round_trip(void **state)
{
	(void)state;
	struct mlfs_vote_msg m;
	struct ptc_error err;
	json_t *doc;

	char *body = mlfs_vote_body("n7", 12, "a1B2", "failed: \"quoted\" reason");
	assert_non_null(body);
	assert_int_equal(mlfs_vote_parse(body, strlen(body), &doc, &m, &err), 0);
	assert_string_equal(m.node, "n7");
	assert_int_equal(m.to, 12);
	assert_string_equal(m.attempt, "a1B2");
	assert_string_equal(m.vote, "failed: \"quoted\" reason");
	json_decref(doc);
	free(body);

	/* a swap's ack, after the commit */
	body = mlfs_vote_body("n3", 4, "ff00", "swapped");
	assert_non_null(body);
	assert_int_equal(mlfs_vote_parse(body, strlen(body), &doc, &m, &err), 0);
	assert_string_equal(m.vote, "swapped");
	assert_int_equal(m.to, 4);
	json_decref(doc);
	free(body);
}

/* A swap ack carries the node's entry: it round-trips through the body, is
 * kept with the vote in the box, named by its attempt, and goes when a
 * later vote of the node replaces the ack. */
static void test_swap_ack_carries_the_entry(void **state)
{
	(void)state;
	struct mlfs_vote_msg m;
	struct ptc_error err;
	struct mlfs_votebox *b;
	json_t *doc;
	const char *text = "{\"addr\":\"127.0.0.1:1\",\"version\":4}";
	struct mlfs_vote_entry e = {.entry = text, .lease = 77, .rev = 123};

	char *body = mlfs_vote_body_entry("n3", 4, "ff00", "swapped", &e);
	assert_int_equal(mlfs_vote_parse(body, strlen(body), &doc, &m, &err), 0);
	assert_string_equal(m.entry.entry, text);
	assert_int_equal(m.entry.lease, 77);
	assert_int_equal(m.entry.rev, 123);
	json_decref(doc);
	free(body);
	body = mlfs_vote_body("n3", 4, "ff00", "swapped"); /* none */
	assert_int_equal(mlfs_vote_parse(body, strlen(body), &doc, &m, &err), 0);
	assert_null(m.entry.entry);
	json_decref(doc);
	free(body);

	assert_int_equal(mlfs_votebox_new(&b), 0);
	assert_int_equal(mlfs_votebox_put_entry(b, "n1", 4, "ff00", "swapped", &e), 0);
	assert_int_equal(mlfs_votebox_put_entry(b, "n2", 4, "ff00", "swapped", NULL), 0);
	assert_int_equal(mlfs_votebox_put_entry(b, "n3", 4, "ee00", "swapped", &e), 0);
	json_t *got = mlfs_votebox_entries(b, "ff00");
	assert_int_equal(json_object_size(got), 1); /* n2 carried none, n3 another attempt */
	json_t *n1 = json_object_get(got, "n1");
	assert_string_equal(json_string_value(json_object_get(n1, "entry")), text);
	assert_int_equal(json_integer_value(json_object_get(n1, "lease")), 77);
	assert_int_equal(json_integer_value(json_object_get(n1, "rev")), 123);
	json_decref(got);
	/* a later vote of n1 replaces the ack, and its entry with it */
	assert_int_equal(mlfs_votebox_put(b, "n1", 5, "dd00", "ready"), 0);
	got = mlfs_votebox_entries(b, "ff00");
	assert_int_equal(json_object_size(got), 0);
	json_decref(got);
	got = mlfs_votebox_entries(b, "ee00");
	assert_int_equal(json_object_size(got), 1);
	json_decref(got);
	mlfs_votebox_free(b);
}

static void test_vote_parse_names_the_field(void **state)
{
	(void)state;
	char longvote[1100];
	memset(longvote, 'x', sizeof(longvote));
	memcpy(longvote, "failed: ", 8);
	longvote[sizeof(longvote) - 1] = '\0';
	char *toolong = mlfs_vote_body("n1", 2, "abc", longvote);
	const struct {
		const char *body, *named;
	} bad[] = {
	    {"", "JSON object"},
	    {"nonsense", "JSON object"},
	    {"[1]", "JSON object"},
	    {"{\"node\":\"n1\",\"attempt\":\"abc\",\"vote\":\"ready\"}", "\"to\""},
	    {"{\"node\":\"n1\",\"to\":0,\"attempt\":\"abc\",\"vote\":\"ready\"}", "\"to\""},
	    {"{\"node\":\"n1\",\"to\":\"2\",\"attempt\":\"abc\",\"vote\":\"ready\"}", "\"to\""},
	    {"{\"node\":\"n1\",\"to\":2,\"vote\":\"ready\"}", "\"attempt\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"a/b\",\"vote\":\"ready\"}", "\"attempt\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"aaaaaaaaaaaaaaaaaaaaaaaa\",\"vote\":"
	     "\"ready\"}",
	     "\"attempt\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"maybe\"}", "\"vote\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped \"}", "\"vote\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":3}", "\"vote\""},
	    {toolong, "\"vote\""},
	    {"{\"to\":2,\"attempt\":\"abc\",\"vote\":\"ready\"}", "\"node\""},
	    {"{\"node\":\"\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"ready\"}", "\"node\""},
	    /* the entry a swap ack carries */
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"ready\",\"entry\":\"{}\","
	     "\"lease\":1,\"rev\":1}",
	     "\"swapped\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped\",\"entry\":3,"
	     "\"lease\":1,\"rev\":1}",
	     "\"entry\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped\",\"entry\":\"[1]\","
	     "\"lease\":1,\"rev\":1}",
	     "\"entry\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped\",\"entry\":\"{}\","
	     "\"rev\":1}",
	     "\"lease\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped\",\"entry\":\"{}\","
	     "\"lease\":1,\"rev\":0}",
	     "\"rev\""},
	    {"{\"node\":\"n1\",\"to\":2,\"attempt\":\"abc\",\"vote\":\"swapped\",\"lease\":1}",
	     "\"entry\""},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mlfs_vote_msg m;
		struct ptc_error err;
		json_t *doc;
		int rc = mlfs_vote_parse(bad[i].body, strlen(bad[i].body), &doc, &m, &err);
		if (rc != -EINVAL || !strstr(err.text, bad[i].named))
			fail_msg("body %zu: rc %d, \"%s\" does not name %s", i, rc, err.text,
				 bad[i].named);
		json_decref(doc);
	}
	free(toolong);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_later_vote_replaces_earlier),
	    cmocka_unit_test(test_describe_names_one_attempt),
	    cmocka_unit_test(test_every_put_wakes_the_listener),
	    cmocka_unit_test(test_expected_attempt_wakes_when_decidable),
	    cmocka_unit_test(test_concurrent_puts),
	    cmocka_unit_test(test_vote_body_round_trip),
	    cmocka_unit_test(test_swap_ack_carries_the_entry),
	    cmocka_unit_test(test_vote_parse_names_the_field),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
