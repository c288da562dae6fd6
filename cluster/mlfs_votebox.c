/*
 * mlfs_votebox.c - the votes a coordinator received: each participant's
 * last vote, delivered to the coordinator's peer server (POST /v1/vote,
 * mlfs_peerserver.c) or, for its own, put here directly (mlfs_attempt.c).
 *
 * DESIGN
 * A vote is an input of the coordinator's decision alone: no other node
 * reads it, and the commit is etcd's transaction, which compares the
 * attempt the coordinator created (mlfs_attempt.c: finish). So the votes
 * travel to the coordinator and never through etcd: a vote put would cost
 * etcd a write (a raft entry, a WAL sync) and the coordinator's watch a
 * message, per participant per reconfiguration. A vote names its attempt
 * (the random id): one for an earlier attempt is never counted. A
 * participant whose vote did not arrive (the coordinator unreachable)
 * votes again at its next round; a coordinator that dies takes its
 * attempt with it (the attempt is bound to its lease), votes and all.
 *
 * One box per node (its peer server's), keyed by node id: a participant's
 * later vote replaces its earlier one. The coordinator's rounds decide on
 * the box when it can decide something: a failed vote, or the last of the
 * participants' "ready" votes (or "swapped" acks) on the attempt it
 * expects (mlfs_votebox_expect, set by propose before the attempt
 * exists); the N - 1 before wake nothing (a round each, at 32 nodes, was
 * 60 rounds per reconfiguration that decided nothing). Its deadline and
 * a participant's death wake it otherwise (the 1 s nap, the entries).
 * Threads: peer server threads (put), the rounds (copy, clear; round_lock
 * in mlfs_cluster.c), the start and stop of the cluster (listen), propose
 * (expect). Its lock is a leaf but for the wake-up hook,
 * which takes only the control thread's wake lock.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

/* ---------------------------------------------------------------- message */

char *mlfs_vote_body_entry(const char *node, int64_t to, const char *aid, const char *vote,
			   const struct mlfs_vote_entry *e)
{
	json_t *v = json_pack("{sssIssss}", "node", node, "to", (json_int_t)to, "attempt", aid,
			      "vote", vote);
	if (v && e && e->entry &&
	    (json_object_set_new(v, "entry", json_string(e->entry)) ||
	     json_object_set_new(v, "lease", json_integer(e->lease)) ||
	     json_object_set_new(v, "rev", json_integer(e->rev)))) {
		json_decref(v);
		return NULL;
	}
	char *body = v ? json_dumps(v, JSON_COMPACT) : NULL;
	json_decref(v);
	return body;
}

char *mlfs_vote_body(const char *node, int64_t to, const char *aid, const char *vote)
{
	return mlfs_vote_body_entry(node, to, aid, vote, NULL);
}

/* The entry fields of vote @v into @m (none: .entry NULL): 0, or -EINVAL
 * with @err naming the field. */
static int entry_parse(const json_t *v, struct mlfs_vote_msg *m, struct ptc_error *err)
{
	const json_t *e = json_object_get(v, "entry"), *lease = json_object_get(v, "lease"),
		     *rev = json_object_get(v, "rev");

	if (!e && !lease && !rev)
		return 0;
	if (strcmp(m->vote, "swapped") != 0)
		return ptc_error_set(err, -EINVAL, "\"entry\" goes only with the vote \"swapped\"");
	if (!json_is_string(e) || json_string_length(e) > MLFS_VOTE_ENTRY_MAX)
		return ptc_error_set(err, -EINVAL,
				     "expected \"entry\", the node's entry as JSON text (at most "
				     "%d bytes)",
				     MLFS_VOTE_ENTRY_MAX);
	json_t *obj = json_loadb(json_string_value(e), json_string_length(e), 0, NULL);
	bool ok = json_is_object(obj);
	json_decref(obj);
	if (!ok)
		return ptc_error_set(err, -EINVAL, "expected \"entry\" to be a JSON object's text");
	if (!json_is_integer(lease) || json_integer_value(lease) < 1)
		return ptc_error_set(err, -EINVAL,
				     "expected \"lease\", the lease the entry is bound to");
	if (!json_is_integer(rev) || json_integer_value(rev) < 1)
		return ptc_error_set(err, -EINVAL,
				     "expected \"rev\", the revision of the node's last entry put");
	m->entry = (struct mlfs_vote_entry){.entry = json_string_value(e),
					    .lease = json_integer_value(lease),
					    .rev = json_integer_value(rev)};
	return 0;
}

/* Whether @s is an attempt id: 1 to 23 letters and digits. */
static bool attempt_id_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n > 23)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]))
			return false;
	return true;
}

int mlfs_vote_parse(const char *body, size_t len, json_t **doc, struct mlfs_vote_msg *m,
		    struct ptc_error *err)
{
	json_error_t jerr;
	json_t *v = json_loadb(body ? body : "", body ? len : 0, 0, &jerr);
	json_t *to = json_object_get(v, "to");

	*doc = v;
	*m = (struct mlfs_vote_msg){.node = json_string_value(json_object_get(v, "node")),
				    .attempt = json_string_value(json_object_get(v, "attempt")),
				    .vote = json_string_value(json_object_get(v, "vote")),
				    .to = json_integer_value(to)};
	if (!json_is_object(v))
		return ptc_error_set(err, -EINVAL, "the vote is not a JSON object: %s", jerr.text);
	if (!json_is_integer(to) || m->to < 1)
		return ptc_error_set(err, -EINVAL,
				     "expected \"to\", the version voted on (from 1)");
	if (!attempt_id_ok(m->attempt))
		return ptc_error_set(err, -EINVAL, "expected \"attempt\", an attempt's id");
	if (!m->vote ||
	    !(strcmp(m->vote, "ready") == 0 || strcmp(m->vote, "swapped") == 0 ||
	      strncmp(m->vote, "failed: ", 8) == 0) ||
	    strlen(m->vote) > MLFS_VOTE_MAX)
		return ptc_error_set(err, -EINVAL,
				     "expected \"vote\": \"ready\", \"swapped\" or \"failed: "
				     "<reason>\" (at most %d bytes)",
				     MLFS_VOTE_MAX);
	if (!m->node || !*m->node)
		return ptc_error_set(err, -EINVAL, "expected \"node\", a node of the cluster");
	return entry_parse(v, m, err);
}

int mlfs_vote_serve(struct mlfs_votebox *b, struct net_request *r,
		    bool (*known)(void *arg, const char *node), void *arg)
{
	struct mlfs_vote_msg m;
	struct ptc_error err;
	json_t *doc;
	size_t len;
	const char *body = net_request_body(r, &len);

	int rc = mlfs_vote_parse(body, len, &doc, &m, &err);
	if (rc == 0 && !known(arg, m.node))
		rc = ptc_error_set(&err, -EINVAL, "expected \"node\", a node of the cluster");
	if (rc)
		net_reply_error(r, 400, "%s", err.text);
	else if ((rc = mlfs_votebox_put_entry(b, m.node, m.to, m.attempt, m.vote,
					      m.entry.entry ? &m.entry : NULL)))
		net_reply_error(r, 503, "out of memory");
	else
		net_reply_buf(r, 200, "{}", 2, "application/json");
	json_decref(doc);
	return rc;
}

/* ------------------------------------------------------------------- box */

struct mlfs_votebox {
	pthread_mutex_t lock;
	json_t *votes; /* {id: "<to> <attempt id> <vote>"} */
	/* {id: {"attempt", "entry", "lease", "rev"}}: the entry the node's
	 * last vote (a "swapped" ack) carried; gone with the vote */
	json_t *entries;
	void (*wake)(void *arg);
	void *arg;
	/* mlfs_votebox_expect: attempt @expect_aid has @expect_n participants
	 * ("": none expected); @expect_got: how many of the box's votes are
	 * "ready" ([0]) and "swapped" ([1]) on it, kept as votes replace
	 * votes (a count per put, not a walk of N votes) */
	char expect_aid[24];
	size_t expect_n, expect_got[2];
};

int mlfs_votebox_new(struct mlfs_votebox **out)
{
	struct mlfs_votebox *b = calloc(1, sizeof(*b));

	*out = NULL;
	if (!b || !(b->votes = json_object()) || !(b->entries = json_object())) {
		if (b)
			json_decref(b->votes);
		free(b);
		return -ENOMEM;
	}
	pthread_mutex_init(&b->lock, NULL);
	*out = b;
	return 0;
}

void mlfs_votebox_free(struct mlfs_votebox *b)
{
	if (!b)
		return;
	json_decref(b->votes);
	json_decref(b->entries);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

void mlfs_votebox_listen(struct mlfs_votebox *b, void (*wake)(void *arg), void *arg)
{
	pthread_mutex_lock(&b->lock);
	b->wake = wake;
	b->arg = arg;
	pthread_mutex_unlock(&b->lock);
}

/* Which count of the expected attempt the vote @v ("<to> <aid> <vote>")
 * is in: 0 "ready", 1 "swapped", -1 none (another attempt, a failure, or
 * no attempt expected). Lock held. */
static int expected_kind(const struct mlfs_votebox *b, const char *v)
{
	const char *a = v ? strchr(v, ' ') : NULL;
	size_t n = strlen(b->expect_aid);
	if (!a || !n || strncmp(a + 1, b->expect_aid, n) != 0 || a[1 + n] != ' ')
		return -1;
	const char *vote = a + 2 + n;
	return strcmp(vote, "ready") == 0 ? 0 : strcmp(vote, "swapped") == 0 ? 1 : -1;
}

void mlfs_votebox_expect(struct mlfs_votebox *b, const char *aid, size_t n)
{
	const char *id;
	json_t *v;

	pthread_mutex_lock(&b->lock);
	snprintf(b->expect_aid, sizeof(b->expect_aid), "%s", aid);
	b->expect_n = n;
	b->expect_got[0] = b->expect_got[1] = 0;
	json_object_foreach(b->votes, id, v) /* (none yet, when it comes first) */
	{
		int k = expected_kind(b, json_string_value(v));
		if (k >= 0)
			b->expect_got[k]++;
	}
	pthread_mutex_unlock(&b->lock);
}

int mlfs_votebox_put_entry(struct mlfs_votebox *b, const char *node, int64_t to, const char *aid,
			   const char *vote, const struct mlfs_vote_entry *e)
{
	char *v = NULL;
	json_t *ent = e && e->entry
			  ? json_pack("{sssssIsI}", "attempt", aid, "entry", e->entry, "lease",
				      (json_int_t)e->lease, "rev", (json_int_t)e->rev)
			  : NULL;

	if ((e && e->entry && !ent) || asprintf(&v, "%" PRId64 " %s %s", to, aid, vote) < 0) {
		json_decref(ent);
		return -ENOMEM;
	}
	pthread_mutex_lock(&b->lock);
	int was = expected_kind(b, json_string_value(json_object_get(b->votes, node)));
	int rc = json_object_set_new(b->votes, node, json_string(v)) ? -ENOMEM : 0;
	/* the entry before the wake-up below: the round it wakes sees it */
	if (rc == 0 && ent)
		rc = json_object_set_new(b->entries, node, ent) ? -ENOMEM : 0;
	else if (rc == 0)
		json_object_del(b->entries, node);
	else
		json_decref(ent);
	if (rc == 0) {
		/* The coordinator's rounds decide after a vote other than
		 * "ready" or "swapped" (a failure aborts), one on an attempt
		 * not expected, or the last of the expected participants' votes
		 * of its kind (every one ready: the commit; every one swapped:
		 * the release). */
		int now = expected_kind(b, v);
		if (was >= 0)
			b->expect_got[was]--;
		if (now >= 0)
			b->expect_got[now]++;
		if (b->wake && (now < 0 || b->expect_got[now] >= b->expect_n))
			b->wake(b->arg);
	}
	pthread_mutex_unlock(&b->lock);
	free(v);
	return rc;
}

int mlfs_votebox_put(struct mlfs_votebox *b, const char *node, int64_t to, const char *aid,
		     const char *vote)
{
	return mlfs_votebox_put_entry(b, node, to, aid, vote, NULL);
}

json_t *mlfs_votebox_entries(struct mlfs_votebox *b, const char *aid)
{
	json_t *out = json_object(), *e;
	const char *id;

	pthread_mutex_lock(&b->lock);
	json_object_foreach(b->entries, id, e)
	{
		if (!out)
			break;
		if (strcmp(json_string_value(json_object_get(e, "attempt")), aid) == 0)
			json_object_set_new(out, id,
					    json_pack("{sOsOsO}", "entry",
						      json_object_get(e, "entry"), "lease",
						      json_object_get(e, "lease"), "rev",
						      json_object_get(e, "rev")));
	}
	pthread_mutex_unlock(&b->lock);
	return out;
}

int mlfs_votebox_copy(struct mlfs_votebox *b, struct net_etcd_kv **kvs, size_t *n)
{
	const char *id;
	json_t *v;

	*kvs = NULL;
	*n = 0;
	pthread_mutex_lock(&b->lock);
	size_t cap = json_object_size(b->votes);
	struct net_etcd_kv *out = calloc(cap ? cap : 1, sizeof(*out));
	int rc = out ? 0 : -ENOMEM;
	json_object_foreach(b->votes, id, v)
	{
		if (rc)
			break;
		/* "<to> <aid> <vote>" as the key "<to>/<id>" and the value "<aid> <vote>" */
		const char *s = json_string_value(v), *sp = strchr(s, ' ');
		struct net_etcd_kv *kv = &out[*n];
		if (asprintf(&kv->key, "%.*s/%s", (int)(sp - s), s, id) < 0) {
			kv->key = NULL;
			rc = -ENOMEM;
		} else if (!(kv->value = strdup(sp + 1))) {
			free(kv->key);
			kv->key = NULL;
			rc = -ENOMEM;
		} else {
			kv->len = strlen(kv->value);
			++*n;
		}
	}
	pthread_mutex_unlock(&b->lock);
	if (rc) {
		net_etcd_kvs_free(out, *n);
		*n = 0;
		return rc;
	}
	*kvs = out;
	return 0;
}

json_t *mlfs_votebox_describe(struct mlfs_votebox *b, const char *aid)
{
	json_t *out = json_object(), *v;
	size_t n = strlen(aid);
	const char *id;

	pthread_mutex_lock(&b->lock);
	json_object_foreach(b->votes, id, v)
	{
		const char *s = strchr(json_string_value(v), ' '); /* after "<to>" */
		if (out && s && strncmp(s + 1, aid, n) == 0 && s[1 + n] == ' ')
			json_object_set_new(out, id, json_string(s + 2 + n));
	}
	pthread_mutex_unlock(&b->lock);
	return out;
}
