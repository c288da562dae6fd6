/*
 * sim_coord.c - the coordinator (n0): its proposal of config 2
 * (mlfs_propose.c's propose_config), its commit or abort transaction
 * (mlfs_attempt.c's finish), its peer server receiving the votes into its
 * real votebox (mlfs_vote_serve, as mlfs_peerserver.c calls it), and the
 * hooks of that box and of its real entries mirror.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

static void abort_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void abort_run(const char *fmt, ...)
{
	int64_t zero = 0;
	if (!atomic_compare_exchange_strong(&S.aborted, &zero, 1))
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(S.abort_reason, sizeof(S.abort_reason), fmt, ap);
	va_end(ap);
	fprintf(stderr, "sim_control: %s\n", S.abort_reason);
}

/* mlfs_attempt.c's finish(): the coordinator's commit (@reason NULL) or
 * abort, one transaction, only while the attempt is still its own. */
void finish(struct worker *w, struct node *nd, const struct att *a, int64_t to, const char *reason)
{
	char ka[256], kc[256], ki[256], kr[256], res[600];
	struct ptc_error err;
	bool ok = false;

	if (!nd->mine || !a)
		return;
	name(ka, sizeof(ka), "attempt");
	name(kc, sizeof(kc), "config");
	name(ki, sizeof(ki), "config_id");
	name(kr, sizeof(kr), "result/%" PRId64, to);
	snprintf(res, sizeof(res), reason ? "aborted: %s" : "committed", reason);
	struct net_etcd_cmp still = {.key = ka,
				     .target = NET_ETCD_VALUE,
				     .result = NET_ETCD_EQUAL,
				     .value = nd->mine,
				     .len = strlen(nd->mine)};
	struct net_etcd_op commit[] = {
	    {.kind = NET_ETCD_PUT,
	     .key = kc,
	     .value = a->config,
	     .len = a->config ? strlen(a->config) : 0},
	    {.kind = NET_ETCD_PUT, .key = ki, .value = a->id, .len = strlen(a->id)},
	    {.kind = NET_ETCD_DELETE, .key = ka},
	    {.kind = NET_ETCD_PUT, .key = kr, .value = res, .len = strlen(res)}};
	const struct net_etcd_op *ops = reason ? commit + 2 : commit;
	size_t nops = reason ? 2 : 4;
	int64_t sent = wall_ns();
	c_add(C_TXN, 1);
	if (net_etcd_txn(w->etcd, &still, 1, ops, nops, NULL, 0, &ok, NULL, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: finish: %s\n", nd->id, err.text);
		return;
	}
	if (!ok)
		return;
	/* The box is not cleared: the participants' swap acks may arrive
	 * before this reply (a vote counts only for the attempt it names). */
	free(nd->mine);
	nd->mine = NULL;
	atomic_store(&nd->coordinating, false);
	if (reason) {
		abort_run("the coordinator aborted: %s", reason);
	} else {
		nd->announce = to; /* it follows the swaps and says when all are done */
		snprintf(nd->acked_id, sizeof(nd->acked_id), "%s", a->id);
		atomic_store(&S.commit_sent_wall, sent);
		atomic_store(&S.commit_wall, wall_ns());
	}
}

/*
 * mlfs_propose.c's propose_config on coordinator @nd for config 2: the
 * job's keys read (read_agreed: mlfs_jobkeys_read's two ranges, the job's
 * keys and the nodes' entries, again every 100 ms up to 20 times until
 * every live node published the committed version and its rank's step),
 * the attempt built (propose_build, move_nodes: every live node at the
 * committed version takes part; job/ empty; no node down; "step" the one
 * every live rank saved); the entries followed from then on (c->proposing:
 * the daemon's control thread starts their watch and its read while the
 * I/O worker builds the attempt, so that the watch is live before the
 * attempt exists; here the same requests, in sequence); the attempt
 * created by one transaction that requires no attempt and "config"
 * unmoved, bound to its lease (propose_create: the attempt's put alone);
 * then its prepare starts at once (propose_attempt). On the daemon an I/O
 * worker runs it. 0: created;
 * 1: `mlfs reconfigure` would fail, naming etcd (an operator runs it
 * again); -1: refused.
 */
static int propose_once(struct node *nd)
{
	struct net_etcd_kv *kvs = NULL, *ekvs = NULL;
	size_t n = 0, en = 0, plen = strlen(S.prefix), nplen = strlen(S.nprefix);
	struct ptc_error err;
	char ka[256], kc[256], aid[24];
	bool ok = false, has_config = false, has_attempt = false;
	int64_t rev = 0, committed = 0, config_mod = 0;
	json_t *nodes = NULL;

	for (int tries = 0;; tries++) {
		/* mlfs_jobkeys_read: one range of the job's keys, then one of
		 * the nodes' entries, every entry parsed (a proposal's read is
		 * fresh, not the mirrors') */
		c_add(C_RANGE, 1);
		int rrc = net_etcd_range(S.cetcd, S.prefix, true, &kvs, &n, &rev, NULL, &err);
		if (rrc == 0) {
			c_add(C_RANGE, 1);
			if ((rrc = net_etcd_range(S.cetcd, S.nprefix, true, &ekvs, &en, NULL, NULL,
						  &err)))
				net_etcd_kvs_free(kvs, n);
		}
		if (rrc) {
			fprintf(stderr, "sim_control: propose: read: %s\n", err.text);
			return 1; /* "the control plane (etcd) is unreachable" */
		}
		nodes = json_object();
		for (size_t i = 0; i < en; i++) /* parse_nodes: not the saved/<id> marks */
			if (!strchr(ekvs[i].key + nplen, '/'))
				json_object_set_new(nodes, ekvs[i].key + nplen,
						    json_loadb(ekvs[i].value, ekvs[i].len, 0, NULL)
							?: json_object());
		net_etcd_kvs_free(ekvs, en);
		has_config = has_attempt = false;
		for (size_t i = 0; i < n; i++) {
			const char *nm = kvs[i].key + plen;
			if (strcmp(nm, "config") == 0) {
				has_config = true;
				committed = config_version(kvs[i].value);
				config_mod = kvs[i].mod_revision;
			} else if (strcmp(nm, "attempt") == 0) {
				has_attempt = true;
			}
		}
		net_etcd_kvs_free(kvs, n);
		/* read_agreed: every live node published the committed version
		 * (versions_agree) and its rank's step (job_steps_agree) */
		bool agree = has_config && !has_attempt;
		const char *id;
		json_t *e;
		json_object_foreach(nodes, id, e)
		{
			int i = node_index(id, strlen(id));
			json_t *steps = json_object_get(e, "steps");
			agree &= json_integer_value(json_object_get(e, "version")) == committed;
			if (i >= 0 && committed == 1) { /* layout 1: rank i on node i */
				char rk[16];
				snprintf(rk, sizeof(rk), "%d", i);
				agree &= json_is_integer(json_object_get(steps, rk));
			}
		}
		if (agree || tries >= 20 || has_attempt)
			break;
		json_decref(nodes);
		nap_ms(100);
	}
	if (has_attempt || !has_config) {
		abort_run("propose: %s", has_attempt ? "an attempt is in progress" : "no config");
		json_decref(nodes);
		return -1;
	}
	json_t *parts = json_array();
	for (int i = 0; i < S.n; i++) {
		json_t *e = json_object_get(nodes, S.ids[i]);
		if (e && json_integer_value(json_object_get(e, "version")) == committed)
			json_array_append_new(parts, json_string(S.ids[i]));
	}
	json_decref(nodes);
	/* as mlfs_propose.c's propose_build puts them: index ranges */
	char *packed = mlfs_ids_pack(parts, &S.cl);
	if (!packed)
		die("out of memory");
	json_decref(parts);
	parts = json_string(packed);
	free(packed);
	uint64_t rnd = 0;
	if (getentropy(&rnd, sizeof(rnd)))
		rnd = (uint64_t)wall_ms() * 2654435761u ^ (uint64_t)getpid();
	snprintf(aid, sizeof(aid), "%016" PRIx64, rnd);
	json_t *a =
	    json_pack("{sssIsIsssssOsososIsososI}", "id", aid, "from", (json_int_t)committed, "to",
		      (json_int_t)2, "config", S.config2, "coordinator", nd->id, "participants",
		      parts, "down", json_array(), "backups", json_object(), "deadline_ms",
		      (json_int_t)(wall_ms() + ATTEMPT_MS), "job", json_array(), "job_missing",
		      json_array(), "step", (json_int_t)0);
	char *att = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(a);
	json_decref(parts);
	if (!att)
		die("out of memory");
	/* propose_attempt: c->proposing, the control thread follows the
	 * entries (an error: its next round tries again) */
	nd->proposing = true;
	if (mirror_follow(&S.peers, true, &err))
		fprintf(stderr, "sim_control: propose: entries: %s\n", err.text);
	name(ka, sizeof(ka), "attempt");
	name(kc, sizeof(kc), "config");
	struct net_etcd_cmp cmps[] = {
	    {.key = ka, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL},
	    {.key = kc, .target = NET_ETCD_MOD, .result = NET_ETCD_EQUAL, .num = config_mod}};
	struct net_etcd_op put[] = {{.kind = NET_ETCD_PUT,
				     .key = ka,
				     .value = att,
				     .len = strlen(att),
				     .lease = atomic_load(&nd->lease)}};
	free(nd->mine);
	nd->mine = att;
	atomic_store(&nd->coordinating, true);
	snprintf(nd->started_id, sizeof(nd->started_id), "%s", aid);
	c_add(C_TXN, 1);
	int rc = net_etcd_txn(S.cetcd, cmps, 2, put, 1, NULL, 0, &ok, &rev, NULL, &err);
	if (rc == 0 && !ok) {
		abort_run("propose: refused: another attempt, or the config moved");
		return -1;
	}
	if (rc) {
		/* EIO, and c->mine kept: when the transaction did apply, the
		 * control thread finds its attempt in etcd and runs it (its
		 * started_id cleared, it prepares it); else the operator tries
		 * again */
		struct net_etcd_kv cur;
		nd->started_id[0] = '\0';
		fprintf(stderr, "sim_control: propose: create: %s\n", err.text);
		c_add(C_RANGE, 1);
		if (net_etcd_get(S.cetcd, ka, &cur, NULL, &err) == 0) {
			bool mine = strcmp(cur.value, att) == 0;
			free(cur.key);
			free(cur.value);
			if (mine) {
				atomic_store(&S.created_wall, wall_ns());
				fprintf(stderr,
					"sim_control: attempt %s created (its creation "
					"timed out)\n",
					aid);
				return 0;
			}
		}
		return 1;
	}
	atomic_store(&S.created_wall, wall_ns());
	fprintf(stderr, "sim_control: attempt %s created (%zu bytes)\n", aid, strlen(att));
	struct att *mine = att_get(att, strlen(att), rev);
	prepare_start(nd, mine, rev);
	att_put(mine);
	prepare_done(nd);
	return 0;
}

/* `mlfs reconfigure`, run again by an operator when it failed naming etcd:
 * at most 3 times. */
void propose(struct node *nd)
{
	int rc = 1;
	for (int i = 0; i < 3 && rc == 1 && !atomic_load(&S.stop); i++) {
		S.propose_tries++;
		rc = propose_once(nd);
		nd->proposing = false; /* propose_attempt's end */
		if (rc == 1)
			nap_ms(1000);
	}
	if (rc == 1)
		abort_run("propose: etcd failed 3 times (see above)");
}

/* ---------------------------------------------------------------- votes */

/* mlfs_cluster.c's votes_changed, n0's box's hook: every vote put wakes
 * it (under the box's lock; wake takes only S.lock). */
static void votes_changed(void *arg)
{
	(void)arg;
	if (!atomic_load(&S.stop))
		wake(node_at(0));
}

/* Whether @node is one of the simulated cluster's (mlfs_vote_serve's
 * @known, as mlfs_peerserver.c's cluster_has). */
static bool cluster_has(void *arg, const char *node)
{
	(void)arg;
	return ptc_cluster_find(&S.cl, node) >= 0;
}

/* mlfs_peerserver.c's handle, reduced to the votes (no store to serve). */
static void handle(void *arg, struct net_request *r)
{
	(void)arg;
	if (strcmp(net_request_method(r), "POST") != 0 ||
	    strcmp(net_request_path(r), "/v1/vote") != 0)
		net_reply_error(r, 405, "only POST /v1/vote");
	else if (mlfs_vote_serve(S.box, r, cluster_has, NULL) == 0)
		c_add(C_VOTES_RECEIVED, 1);
}

/* n0's votebox (its hook: votes_changed) and peer server, as
 * mlfs_peer_start makes them (4 threads, 4 KiB bodies), on a free loopback
 * port with a fresh token: S.vote_url, S.token. */
void votes_serve(void)
{
	uint8_t rnd[16];
	struct ptc_error err;
	if (getentropy(rnd, sizeof(rnd)))
		die("getentropy: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(S.token + 2 * i, 3, "%02x", rnd[i]);
	if (mlfs_votebox_new(&S.box))
		die("out of memory");
	mlfs_votebox_listen(S.box, votes_changed, NULL);
	struct net_server_opts so = {
	    .addr = "127.0.0.1:0", .token = S.token, .threads = 4, .max_body = 4096};
	if (net_server_start(&so, handle, NULL, &S.server, &err))
		die("the peer server: %s", err.text);
	snprintf(S.vote_url, sizeof(S.vote_url), "http://127.0.0.1:%d/v1/vote",
		 net_server_port(S.server));
}

/* n0's peer server stopped (its handlers done) and its box freed; no vote
 * wakes n0 any more. */
void votes_stop(void)
{
	if (!S.box)
		return;
	mlfs_votebox_listen(S.box, NULL, NULL);
	net_server_stop(S.server);
	S.server = NULL;
	mlfs_votebox_free(S.box);
	S.box = NULL;
}

/* peers_changed for n0's real entries mirror (S.peers). */
void n0_peers_changed(void *arg)
{
	(void)arg;
	peers_changed(node_at(0));
}
