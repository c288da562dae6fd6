/*
 * mlfs_cluster.c - the control plane of a job of many nodes, on etcd
 * (DESIGN section 7): registration, the job's schema and cluster, the
 * committed config, and one atomic reconfiguration across the nodes.
 *
 * DESIGN
 * Keys under /mlfs/<job>/ (net_etcd):
 *   nodes/<id>       {"addr","devices","pid","version","state","steps",
 *                    "backup"}, bound
 *                    to this node's lease (TTL MLFS_LEASE_TTL s, kept alive
 *                    every second): gone = the node is down.
 *   schema, cluster  the first writer wins (a transaction on "absent"); a
 *                    node whose own differ refuses to join, saying so.
 *   config           the committed config: written only by a transaction.
 *   attempt          {"from","to","config","coordinator","participants",
 *                    "down","backups","deadline_ms","job"}: created by the coordinator's transaction
 *                    that requires no attempt and "config" unchanged since it
 *                    was read; bound to the coordinator's lease.
 *   votes/<to>/<id>  "<attempt id> ready", or "<attempt id> failed: <reason>":
 *                    a vote counts only for the attempt it names (the
 *                    attempt's random "id"), so votes a dead coordinator's
 *                    attempt left behind never count for a later one.
 *   result/<to>      "committed" or "aborted: <reason>" (for every node's
 *                    status.json and for mlfs reconfigure).
 *
 * The node where config.json is written is the coordinator (propose). Every
 * node runs one control thread that reads the job's keys when they change
 * (or every 250 ms), and:
 *   - installs the schema and the first config it finds in etcd;
 *   - as a participant (it hosts ranks in the old or the new layout)
 *     prepares the attempt beside its current layout (mlfs_reconf_prepare:
 *     fetches from peers through mlfs_peer) and votes;
 *   - as the coordinator, commits with one transaction (config := new,
 *     attempt and votes deleted, only while the attempt is still its own)
 *     once every participant voted ready; aborts (deletes the attempt) on a
 *     failed vote, a participant's key gone, or the deadline;
 *   - commits its prepared layout when it sees "config" at the attempt's
 *     version, whenever that is (also after a restart of the thread);
 *     aborts it when the attempt is gone and "config" did not move (the
 *     coordinator aborted, or its lease expired with it).
 * That transaction is the single commit point; nothing else decides.
 *
 * job/ is the same on every node after a commit (mlfs_jobsync.c): the
 * coordinator asks every participant for its job/ manifest and puts their
 * union in the attempt (the newest copy of each file wins, naming the node
 * to fetch it from); each participant stages that tree before voting ready
 * and swaps it in at the commit.
 *
 * Backups ("replicas": 1, mlfs_backup.c): each node's entry says whose
 * saved state it holds at which steps; the coordinator names, in the
 * attempt's "backups", the holders of down nodes that hold every rank of
 * theirs at the job's step, and the plan reads what no DP replica has
 * from there (ptc_plan_compute_backups).
 *
 * Nodes join: a daemon whose cluster.json extends the job's (the same
 * nodes first, more after them) replaces the "cluster" key; every node
 * takes the longer one within a round (mlfs_store_grow_cluster).
 *
 * Job-wide facts: every node publishes its ranks' saved steps in its key;
 * the control thread copies the other nodes' into the store's step table,
 * so a reconfiguration checks the steps of every rank of the job.
 *
 * A node that cannot reach etcd goes on serving its current layout; a
 * config written on it is refused (nothing starts without the control
 * plane), and status.json says "etcd unreachable".
 *
 * Threads: the control thread; propose runs on an I/O worker (config.json
 * and schema.json writes). c->lock guards the fields marked so; st->lock
 * is taken (never while c->lock is held) to read or set the store.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster.h"
#include "cluster/cluster_i.h"
#include "common/common.h"

#define MLFS_LEASE_TTL 5	     /* seconds */
#define MLFS_ATTEMPT_MS (300 * 1000) /* an attempt's deadline */

struct mlfs_cluster {
	struct mlfs_store *st;
	struct net_etcd *etcd;
	char prefix[300]; /* "/mlfs/<job>/" */
	const char *me;
	int64_t lease;
	int64_t last_keepalive_ms;
	pthread_t thread;
	bool running;
	atomic_int stop;
	/* Set by stop and by the store's reconf_changed: ends the control
	 * thread's wait for etcd at once (a node whose prepare finished votes
	 * now, not at the next 250 ms round). */
	atomic_int wake;

	pthread_mutex_t lock;
	json_t *nodes;	      /* lock: {id: entry} as last read */
	json_t *attempt;      /* lock: the attempt as last read, or NULL */
	char etcd_error[512]; /* lock: "" when etcd answers */
	/* The attempts (their random ids: a version may be tried again after
	 * an abort) this node started preparing and voted on. */
	char started_id[24]; /* lock */
	/* The attempt whose preparation the store runs (set once its prepare
	 * started there): the store's state speaks for that attempt only, not
	 * for an earlier one to the same version. */
	char prepared_id[24]; /* lock */
	char voted_id[24];
	char *mine;	      /* lock: the text of the attempt this node created */
	int64_t mine_to;
	/* job/ as the coordinator has it, staged for attempt @job_to (the
	 * copy is part of the attempt; swapped in at its commit). Only the
	 * control thread touches these. */
	struct mlfs_job *job;
	int64_t job_to;
	pthread_mutex_t publock; /* published, and the put of the node's key */
	char *published;	 /* the node entry last put */
	int64_t cluster_mod;	 /* lock: the "cluster" key's revision last taken */
};

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void key(const struct mlfs_cluster *c, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void key(const struct mlfs_cluster *c, char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	size_t n = (size_t)snprintf(buf, cap, "%s", c->prefix);
	va_start(ap, fmt);
	vsnprintf(buf + n, cap - n, fmt, ap);
	va_end(ap);
}

/* The version of a config text, or -1. */
static int64_t config_version(const char *text, size_t len)
{
	json_t *j = json_loadb(text, len, 0, NULL);
	int64_t v = json_is_integer(json_object_get(j, "version"))
			? json_integer_value(json_object_get(j, "version"))
			: -1;
	json_decref(j);
	return v;
}

static int64_t view_version(struct mlfs_store *st)
{
	struct mlfs_view *v = mlfs_store_view(st);
	int64_t ver = v ? v->config->version : 0;
	mlfs_view_put(v);
	return ver;
}

static struct mlfs_backup *st_backup(const struct mlfs_cluster *c)
{
	return __atomic_load_n(&c->st->backup, __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------------ node entry */

/* This node's entry: what it serves and its ranks' saved steps. */
static char *node_entry(struct mlfs_cluster *c)
{
	struct mlfs_store *st = c->st;
	const struct ptc_node *n = &mlfs_store_cluster(st)->nodes[st->node];
	json_t *steps = json_object();
	char rank[16];

	pthread_mutex_lock(&st->lock);
	int64_t version = st->view ? st->view->config->version : 0;
	const char *state = atomic_load(&st->lost) ? "lost" : mlfs_reconf_state_name(st->reconf);
	if (st->view) {
		const struct ptc_layout *l = &st->view->layout;
		int r0 = l->node_first_rank[st->node];
		for (int r = r0; r >= 0 && r < r0 + l->node_nranks[st->node]; r++) {
			snprintf(rank, sizeof(rank), "%d", r);
			json_object_set_new(steps, rank, json_integer(st->steps[r]));
		}
	}
	pthread_mutex_unlock(&st->lock);
	json_t *o = json_pack("{sssisisIsssO}", "addr", n->addr ? n->addr : "", "devices",
			      n->devices, "pid", (int)getpid(), "version", (json_int_t)version,
			      "state", state, "steps", steps);
	json_t *bk = mlfs_backup_describe(st_backup(c));
	if (o && bk)
		json_object_set_new(o, "backup", bk);
	else
		json_decref(bk);
	json_decref(steps);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	return s;
}

/* Puts this node's entry when it changed since the last put. */
static int publish(struct mlfs_cluster *c, char *why, size_t whylen)
{
	char k[512];
	int rc = 0;
	char *e = node_entry(c);

	if (!e)
		return -ENOMEM;
	pthread_mutex_lock(&c->publock);
	if (c->lease && (!c->published || strcmp(c->published, e) != 0)) {
		key(c, k, sizeof(k), "nodes/%s", c->me);
		if ((rc = net_etcd_put(c->etcd, k, e, strlen(e), c->lease, NULL, why, whylen)) == 0) {
			free(c->published);
			c->published = e;
			e = NULL;
		}
	}
	pthread_mutex_unlock(&c->publock);
	free(e);
	return rc;
}

/* The store's hook when its reconfiguration state changes: wake up. */
static void reconf_changed(void *arg)
{
	struct mlfs_cluster *c = arg;
	atomic_store(&c->wake, 1);
}

/* The store's hook after a step write or an import: publish at once. */
static void steps_saved(void *arg)
{
	char why[512];
	publish(arg, why, sizeof(why));
}

/* Registers (a new lease and the node's key) or keeps the lease alive;
 * puts the entry again when it changed. */
static int keep_registered(struct mlfs_cluster *c, char *why, size_t whylen)
{
	int rc;
	int64_t now = now_ms(), ttl;

	if (c->lease && now - c->last_keepalive_ms >= 1000) {
		rc = net_etcd_lease_keepalive(c->etcd, c->lease, &ttl, NULL, why, whylen);
		if (rc == -ENOENT) { /* expired: we were down as far as the job knows */
			c->lease = 0;
		} else if (rc) {
			return rc;
		} else {
			c->last_keepalive_ms = now;
		}
	}
	if (!c->lease) {
		if ((rc = net_etcd_lease_grant(c->etcd, MLFS_LEASE_TTL, &c->lease, NULL, why,
					       whylen)))
			return rc;
		c->last_keepalive_ms = now;
		pthread_mutex_lock(&c->publock);
		free(c->published);
		c->published = NULL;
		pthread_mutex_unlock(&c->publock);
	}
	return publish(c, why, whylen);
}

/* Copies the other nodes' ranks' saved steps into the store's table. */
static void sync_steps(struct mlfs_cluster *c, json_t *nodes)
{
	struct mlfs_store *st = c->st;
	const char *id;
	json_t *entry;

	pthread_mutex_lock(&st->lock);
	if (st->view) {
		int world = st->view->layout.world;
		json_object_foreach(nodes, id, entry)
		{
			if (strcmp(id, c->me) == 0)
				continue;
			if (json_integer_value(json_object_get(entry, "version")) !=
			    st->view->config->version)
				continue; /* steps of another layout's ranks */
			const char *rk;
			json_t *step;
			json_object_foreach(json_object_get(entry, "steps"), rk, step)
			{
				long r = strtol(rk, NULL, 10);
				if (r >= 0 && r < world && json_is_integer(step))
					st->steps[r] = json_integer_value(step);
			}
		}
	}
	pthread_mutex_unlock(&st->lock);
}

/* The ranks of down nodes (@down, @ndown cluster indices) take the step
 * the live ranks agree on: their partitions come from other copies, which
 * saved that step. */
static void fill_down_steps(struct mlfs_cluster *c, const int *down, int ndown)
{
	struct mlfs_store *st = c->st;
	pthread_mutex_lock(&st->lock);
	if (st->view && ndown) {
		const struct ptc_layout *l = &st->view->layout;
		int64_t step = -1;
		for (int r = 0; r < l->world && step < 0; r++) {
			bool dead = false;
			for (int i = 0; i < ndown; i++)
				dead |= l->ranks[r].node == down[i];
			if (!dead)
				step = st->steps[r];
		}
		for (int r = 0; r < l->world; r++)
			for (int i = 0; i < ndown; i++)
				if (l->ranks[r].node == down[i])
					st->steps[r] = step;
	}
	pthread_mutex_unlock(&st->lock);
}

/* ---------------------------------------------------------- job's keys */

/* What one read of the job's keys found. */
struct job_keys {
	struct net_etcd_kv *kvs;
	size_t n;
	const struct net_etcd_kv *schema, *cluster, *config, *attempt;
	json_t *nodes;	 /* {id: entry} */
	json_t *attempt_j; /* parsed */
	int64_t config_mod;
};

static void job_keys_free(struct job_keys *k)
{
	net_etcd_kvs_free(k->kvs, k->n);
	json_decref(k->nodes);
	json_decref(k->attempt_j);
	memset(k, 0, sizeof(*k));
}

static int read_job(struct mlfs_cluster *c, struct job_keys *k, char *why, size_t whylen)
{
	size_t plen = strlen(c->prefix);
	int rc;

	memset(k, 0, sizeof(*k));
	if ((rc = net_etcd_range(c->etcd, c->prefix, true, &k->kvs, &k->n, NULL, NULL, why,
				 whylen)))
		return rc;
	k->nodes = json_object();
	for (size_t i = 0; i < k->n; i++) {
		const struct net_etcd_kv *kv = &k->kvs[i];
		const char *name = kv->key + plen;
		if (strcmp(name, "schema") == 0)
			k->schema = kv;
		else if (strcmp(name, "cluster") == 0)
			k->cluster = kv;
		else if (strcmp(name, "config") == 0)
			k->config = kv, k->config_mod = kv->mod_revision;
		else if (strcmp(name, "attempt") == 0)
			k->attempt = kv;
		else if (strncmp(name, "nodes/", 6) == 0)
			json_object_set_new(k->nodes, name + 6,
					    json_loadb(kv->value, kv->len, 0, NULL) ?: json_object());
	}
	if (k->attempt)
		k->attempt_j = json_loadb(k->attempt->value, k->attempt->len, 0, NULL);
	return 0;
}

/* The vote of @id on attempt @to: NULL when none. */
static const struct net_etcd_kv *vote_of(struct mlfs_cluster *c, const struct job_keys *k,
					 int64_t to, const char *id)
{
	char want[512];
	key(c, want, sizeof(want), "votes/%" PRId64 "/%s", to, id);
	for (size_t i = 0; i < k->n; i++)
		if (strcmp(k->kvs[i].key, want) == 0)
			return &k->kvs[i];
	return NULL;
}

/* ------------------------------------------------------------ decisions */

static void vote(struct mlfs_cluster *c, int64_t to, const char *attempt_id, const char *what)
{
	char k[512], why[512], v[1024];
	key(c, k, sizeof(k), "votes/%" PRId64 "/%s", to, c->me);
	snprintf(v, sizeof(v), "%s %s", attempt_id ? attempt_id : "-", what);
	if (net_etcd_put(c->etcd, k, v, strlen(v), 0, NULL, why, sizeof(why)) == 0)
		snprintf(c->voted_id, sizeof(c->voted_id), "%s", attempt_id ? attempt_id : "");
}

/* The coordinator ends its attempt: commit (@reason NULL) or abort. Only
 * while the attempt in etcd is still the one it created. */
static void finish(struct mlfs_cluster *c, const struct job_keys *k, int64_t to,
		   const char *reason)
{
	char ka[512], kc[512], kv[512], kr[512], why[512], res[600];
	const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
	bool ok = false;

	key(c, ka, sizeof(ka), "attempt");
	key(c, kc, sizeof(kc), "config");
	key(c, kv, sizeof(kv), "votes/%" PRId64 "/", to);
	key(c, kr, sizeof(kr), "result/%" PRId64, to);
	snprintf(res, sizeof(res), reason ? "aborted: %s" : "committed", reason);
	pthread_mutex_lock(&c->lock);
	char *mine = c->mine ? strdup(c->mine) : NULL;
	pthread_mutex_unlock(&c->lock);
	if (!mine)
		return;
	struct net_etcd_cmp still = {.key = ka, .target = NET_ETCD_VALUE, .result = NET_ETCD_EQUAL,
				     .value = mine, .len = strlen(mine)};
	struct net_etcd_op commit[] = {
	    {.kind = NET_ETCD_PUT, .key = kc, .value = config, .len = config ? strlen(config) : 0},
	    {.kind = NET_ETCD_DELETE, .key = ka},
	    {.kind = NET_ETCD_DELETE, .key = kv, .prefix = true},
	    {.kind = NET_ETCD_PUT, .key = kr, .value = res, .len = strlen(res)}};
	const struct net_etcd_op *ops = reason ? commit + 1 : commit;
	size_t nops = reason ? 3 : 4;
	if (net_etcd_txn(c->etcd, &still, 1, ops, nops, NULL, 0, &ok, NULL, NULL, why,
			 sizeof(why)) == 0 &&
	    ok) {
		pthread_mutex_lock(&c->lock);
		free(c->mine);
		c->mine = NULL;
		pthread_mutex_unlock(&c->lock);
	}
	free(mine);
}

/* The coordinator's round: every participant up and voted? */
static void coordinate(struct mlfs_cluster *c, const struct job_keys *k, int64_t to)
{
	json_t *parts = json_object_get(k->attempt_j, "participants");
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));
	size_t i;
	json_t *p;
	bool all = true;
	char reason[600];

	if (now_ms() > json_integer_value(json_object_get(k->attempt_j, "deadline_ms"))) {
		finish(c, k, to, "the deadline passed before every node was ready");
		return;
	}
	json_array_foreach(parts, i, p)
	{
		const char *id = json_string_value(p);
		if (!id)
			continue;
		if (!json_object_get(k->nodes, id)) {
			snprintf(reason, sizeof(reason), "node %s is down (its lease expired)", id);
			finish(c, k, to, reason);
			return;
		}
		const struct net_etcd_kv *v = vote_of(c, k, to, id);
		size_t n = aid ? strlen(aid) : 0;
		if (!v || !aid || strncmp(v->value, aid, n) != 0 || v->value[n] != ' ') {
			all = false; /* none yet for this attempt */
		} else if (strncmp(v->value + n + 1, "failed", 6) == 0) {
			snprintf(reason, sizeof(reason), "node %s: %.500s", id, v->value + n + 1);
			finish(c, k, to, reason);
			return;
		}
	}
	if (all)
		finish(c, k, to, NULL);
}

/* Whether node @node hosts a rank of layout @l (NULL: none; a node that
 * joined after @l was made hosts none of it). */
static bool hosts(const struct ptc_layout *l, int node)
{
	return l && node < l->cluster->nnodes && l->node_nranks[node] > 0;
}

/*
 * The nodes of a move from the current view to config @cfg: the
 * participants (up, hosting ranks in either layout) into *@parts, and the
 * nodes of the current layout that are down (their partitions come from
 * other copies) into *@down, as JSON arrays of ids. 0, or -EINVAL with
 * @err: a bad config, or a down node that the new layout uses.
 */
static int move_nodes(struct mlfs_store *st, const struct ptc_config *cfg, const json_t *up,
		      json_t **parts, json_t **down, struct ptc_error *err)
{
	struct ptc_layout to;
	struct mlfs_view *v = mlfs_store_view(st);
	int rc = ptc_layout_init(&to, st->schema, cfg, mlfs_store_cluster(st), "config.json", err);

	*parts = *down = NULL;
	if (rc == 0) {
		*parts = json_array();
		*down = json_array();
		/* Every live node takes part (one with no ranks in either layout
		 * just moves to the new version); a node down, or restarted with
		 * its partitions lost, is no source and may host no rank. */
		for (int n = 0; n < mlfs_store_cluster(st)->nnodes && rc == 0; n++) {
			const char *id = mlfs_store_cluster(st)->nodes[n].id;
			json_t *e = json_object_get(up, id);
			const char *state = json_string_value(json_object_get(e, "state"));
			bool lost = state && strcmp(state, "lost") == 0;
			if (e && v && json_integer_value(json_object_get(e, "version")) !=
					   v->config->version) {
				/* cut off from etcd through a commit: behind */
				if (hosts(&to, n)) {
					rc = ptc_errorf(err,
							"config.json: node %s is at version %" JSON_INTEGER_FORMAT
							", not the job's %" PRId64
							" (it missed a commit): restart it",
							id, json_integer_value(json_object_get(e, "version")),
							v->config->version);
					break;
				}
				if (hosts(&v->layout, n))
					json_array_append_new(*down, json_string(id));
				continue;
			}
			if (hosts(&to, n) && !e)
				rc = ptc_errorf(err, "config.json: node %s is down", id);
			else if (hosts(&to, n) && lost)
				rc = ptc_errorf(err,
						"config.json: node %s restarted and lost its "
						"partitions: drop it from the config first (its "
						"state is served from the other nodes), then add it "
						"back",
						id);
			if (e)
				json_array_append_new(*parts, json_string(id));
			if ((!e || lost) && v && hosts(&v->layout, n))
				json_array_append_new(*down, json_string(id));
		}
		ptc_layout_release(&to);
	}
	mlfs_view_put(v);
	if (rc) {
		json_decref(*parts);
		json_decref(*down);
		*parts = *down = NULL;
	}
	return rc;
}

/* Attempt @att's "down" nodes and "backups" holders as cluster indices in
 * @dn (arrays malloc'd: down_free). 0 or -ENOMEM. */
static int attempt_down(struct mlfs_store *st, const json_t *att, struct mlfs_reconf_down *dn)
{
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	const json_t *down = json_object_get(att, "down"), *bk = json_object_get(att, "backups");
	int *d = malloc((json_array_size(down) + 1) * sizeof(int));
	int *b = malloc((size_t)cl->nnodes * sizeof(int));
	size_t i;
	const char *id;
	json_t *e;

	*dn = (struct mlfs_reconf_down){d, 0, b, cl->nnodes};
	if (!d || !b)
		return -ENOMEM;
	json_array_foreach(down, i, e)
	{
		int n = json_string_value(e) ? ptc_cluster_find(cl, json_string_value(e)) : -1;
		if (n >= 0)
			d[dn->ndown++] = n;
	}
	for (int n = 0; n < cl->nnodes; n++)
		b[n] = -1;
	json_object_foreach((json_t *)bk, id, e)
	{
		int n = ptc_cluster_find(cl, id);
		if (n >= 0 && json_string_value(e))
			b[n] = ptc_cluster_find(cl, json_string_value(e));
	}
	return 0;
}

static void down_free(struct mlfs_reconf_down *dn)
{
	free((int *)dn->down);
	free((int *)dn->backup_of);
	memset(dn, 0, sizeof(*dn));
}

/*
 * For each node of @down (ids) whose backup holder under the current
 * layout (ptc_layout_backup_holder) is up and published a backup of every
 * rank of it at @agreed, the step the live ranks saved (job_steps_agree):
 * {id: holder id}. The plan takes what no DP replica has from there.
 */
static json_t *usable_backups(struct mlfs_cluster *c, const struct job_keys *k,
			      const json_t *down, int64_t agreed)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	json_t *out = json_object(), *d;
	size_t i;

	if (!v || !v->config->replicas || !out)
		goto done;
	const struct ptc_layout *l = &v->layout;
	json_array_foreach(down, i, d)
	{
		const char *id = json_string_value(d);
		int n = id ? ptc_cluster_find(l->cluster, id) : -1;
		int h = n >= 0 ? ptc_layout_backup_holder(l, n) : -1;
		if (h < 0 || agreed < 0)
			continue;
		const char *hid = l->cluster->nodes[h].id;
		json_t *bk = json_object_get(json_object_get(k->nodes, hid), "backup");
		bool ok = json_equal(json_object_get(bk, "of"), d) &&
			  json_integer_value(json_object_get(bk, "version")) == v->config->version;
		for (int r = l->node_first_rank[n]; ok && r < l->node_first_rank[n] + l->node_nranks[n];
		     r++) {
			char rk[16];
			snprintf(rk, sizeof(rk), "%d", r);
			json_t *st = json_object_get(json_object_get(bk, "steps"), rk);
			ok = json_is_integer(st) && json_integer_value(st) == agreed;
		}
		if (ok)
			json_object_set_new(out, id, json_string(hid));
	}
done:
	mlfs_view_put(v);
	return out;
}

static void mark_prepared(struct mlfs_cluster *c, const char *aid)
{
	pthread_mutex_lock(&c->lock);
	snprintf(c->prepared_id, sizeof(c->prepared_id), "%s", aid);
	pthread_mutex_unlock(&c->lock);
}

/* This node's part in attempt @to, round after round. */
static void participate(struct mlfs_cluster *c, const struct job_keys *k, int64_t from,
			int64_t to)
{
	struct mlfs_store *st = c->st;
	struct ptc_error err = {""};
	json_t *parts = json_object_get(k->attempt_j, "participants");
	const char *aid = json_string_value(json_object_get(k->attempt_j, "id"));
	bool part = false;
	size_t i;
	json_t *p;

	json_array_foreach(parts, i, p) part |= json_string_value(p) &&
						strcmp(json_string_value(p), c->me) == 0;
	if (!part || !aid || view_version(st) != from)
		return;
	pthread_mutex_lock(&c->lock);
	bool start = strcmp(c->started_id, aid) != 0;
	if (start)
		snprintf(c->started_id, sizeof(c->started_id), "%s", aid);
	pthread_mutex_unlock(&c->lock);
	if (start) {
		const char *config = json_string_value(json_object_get(k->attempt_j, "config"));
		sync_steps(c, k->nodes);
		struct mlfs_reconf_down dn;
		int rc = attempt_down(st, k->attempt_j, &dn);
		if (rc == 0) {
			fill_down_steps(c, dn.down, dn.ndown);
			rc = config ? mlfs_reconf_prepare_down(st, config, strlen(config), "attempt",
							       false, &dn, &err)
				    : -EINVAL;
		}
		down_free(&dn);
		if (rc) {
			char v[700];
			snprintf(v, sizeof(v), "failed: %s", err.text[0] ? err.text : strerror(-rc));
			vote(c, to, aid, v);
			return;
		}
		mark_prepared(c, aid);
	}
	pthread_mutex_lock(&c->lock);
	bool ours = strcmp(c->prepared_id, aid) == 0;
	pthread_mutex_unlock(&c->lock);
	if (!ours || strcmp(c->voted_id, aid) == 0)
		return; /* (the coordinator's propose may still be starting it) */
	pthread_mutex_lock(&st->lock);
	enum mlfs_reconf_state s = st->reconf;
	int64_t target = st->target_version;
	char error[PTC_ERROR_MAX];
	snprintf(error, sizeof(error), "%s", st->error);
	pthread_mutex_unlock(&st->lock);
	if (target != to)
		return;
	json_t *miss;
	size_t mi;
	json_array_foreach(json_object_get(k->attempt_j, "job_missing"), mi, miss) if (
	    json_string_value(miss) && strcmp(json_string_value(miss), c->me) == 0 &&
	    s == MLFS_RECONF_PREPARED)
	{
		vote(c, to, aid, "failed: the coordinator could not read this node's job/");
		return;
	}
	if (s == MLFS_RECONF_PREPARED) {
		const char *co = json_string_value(json_object_get(k->attempt_j, "coordinator"));
		if (co && (c->job_to != to || !c->job)) {
			char why[512];
			struct mlfs_job *j;
			if (mlfs_jobsync_stage(c->st, json_object_get(k->attempt_j, "job"), co, &j, why,
				      sizeof(why))) {
				char v[700];
				snprintf(v, sizeof(v), "failed: %s", why);
				vote(c, to, aid, v);
				return;
			}
			mlfs_job_free(c->job);
			c->job = j;
			c->job_to = to;
		}
		vote(c, to, aid, "ready");
	} else if (s == MLFS_RECONF_FAILED) {
		char v[700];
		snprintf(v, sizeof(v), "failed: %s", error);
		vote(c, to, aid, v);
	}
}

/* Nodes joined: the job's cluster.json in etcd grew (a node started with
 * one that lists more nodes); this node's store takes it. */
static void sync_cluster(struct mlfs_cluster *c, const struct job_keys *k)
{
	const char *have = mlfs_store_cluster_text(c->st);
	struct ptc_error err = {""};

	if (!k->cluster ||
	    (strlen(have) == k->cluster->len && memcmp(have, k->cluster->value, k->cluster->len) == 0))
		return;
	pthread_mutex_lock(&c->lock);
	bool seen = k->cluster->mod_revision == c->cluster_mod;
	c->cluster_mod = k->cluster->mod_revision;
	pthread_mutex_unlock(&c->lock);
	if (seen)
		return;
	int rc = mlfs_store_grow_cluster(c->st, k->cluster->value, k->cluster->len, &err);
	if (rc == 1)
		mlfs_log(MLFS_LOG_INFO, "cluster: nodes joined the job: it has %d nodes now",
			 mlfs_store_cluster(c->st)->nnodes);
	else if (rc < 0)
		mlfs_log(MLFS_LOG_WARNING, "cluster: the job's cluster.json in etcd does not "
					   "extend this node's: %s",
			 err.text);
}

/* Follows the committed config: installs the first one, commits a
 * prepared attempt that etcd committed, aborts one that etcd dropped. */
static void follow(struct mlfs_cluster *c, const struct job_keys *k)
{
	struct mlfs_store *st = c->st;
	struct ptc_error err = {""};
	int64_t have = view_version(st);
	int64_t committed = k->config ? config_version(k->config->value, k->config->len) : 0;

	if (k->schema && !st->schema)
		mlfs_store_install_schema(st, k->schema->value, k->schema->len, &err);
	if (k->config && have == 0 && st->schema) {
		/* A job that already saved state (the config changed since the
		 * first, or a rank saved a step): this node restarted, and its
		 * partitions, zeros now, are not the job's. */
		bool saved = k->config->version > 1;
		const char *id;
		json_t *e;
		json_object_foreach(k->nodes, id, e)
		{
			const char *rk;
			json_t *step;
			json_object_foreach(json_object_get(e, "steps"), rk, step) saved |=
			    json_integer_value(step) > 0;
		}
		if (mlfs_store_install_config(st, k->config->value, k->config->len, &err) == 0 &&
		    saved) {
			struct mlfs_view *v = mlfs_store_view(st);
			atomic_store(&st->lost, v && v->layout.node_nranks[st->node] > 0);
			mlfs_view_put(v);
			if (atomic_load(&st->lost))
				mlfs_store_note_error(st, "this node restarted: its partitions are "
							  "empty, not the job's; a config that "
							  "drops it is served from the other nodes");
		}
		return;
	}
	pthread_mutex_lock(&st->lock);
	enum mlfs_reconf_state s = st->reconf;
	int64_t target = st->target_version;
	pthread_mutex_unlock(&st->lock);
	bool active = s == MLFS_RECONF_PREPARING || s == MLFS_RECONF_PREPARED;
	if (have && committed > have && !active && !atomic_load(&st->lost)) {
		/* Cut off from etcd while the job moved on: what this node holds
		 * is an old layout's, not the job's. */
		char msg[256];
		snprintf(msg, sizeof(msg),
			 "this node missed the commit of version %" PRId64 " (it holds version %" PRId64
			 "): restart it to rejoin the job",
			 committed, have);
		atomic_store(&st->lost, true);
		mlfs_store_note_error(st, msg);
	}
	if (atomic_load(&st->lost) && have >= committed) { /* lost until it has no ranks */
		struct mlfs_view *v = mlfs_store_view(st);
		if (v && v->layout.node_nranks[st->node] == 0)
			atomic_store(&st->lost, false);
		mlfs_view_put(v);
	}
	if (active && committed == target) {
		if (s == MLFS_RECONF_PREPARED && mlfs_reconf_commit(st, target, &err) == 0 &&
		    c->job && c->job_to == target) {
			pthread_mutex_lock(&st->lock); /* the coordinator's job/, as committed */
			struct mlfs_job *old = st->job;
			st->job = c->job;
			pthread_mutex_unlock(&st->lock);
			mlfs_job_free(old);
			c->job = NULL;
			c->job_to = 0;
		}
		return; /* still building: committed once prepared */
	}
	int64_t att = k->attempt_j ? json_integer_value(json_object_get(k->attempt_j, "to")) : 0;
	if (active && att != target && committed != target) {
		char kr[512], why[512], reason[700] = "the attempt vanished (its coordinator is "
						       "down or lost etcd)";
		struct net_etcd_kv r;
		key(c, kr, sizeof(kr), "result/%" PRId64, target);
		if (net_etcd_get(c->etcd, kr, &r, NULL, why, sizeof(why)) == 0) {
			snprintf(reason, sizeof(reason), "%s", r.value);
			free(r.key);
			free(r.value);
		}
		mlfs_reconf_abort(st, target, reason, &err);
		mlfs_job_free(c->job);
		c->job = NULL;
		c->job_to = 0;
	}
}

static void round_once(struct mlfs_cluster *c)
{
	struct job_keys k;
	char why[512] = "";
	int rc = keep_registered(c, why, sizeof(why));

	if (rc == 0)
		rc = read_job(c, &k, why, sizeof(why));
	pthread_mutex_lock(&c->lock);
	snprintf(c->etcd_error, sizeof(c->etcd_error), "%s", rc ? why : "");
	pthread_mutex_unlock(&c->lock);
	if (rc)
		return;
	sync_cluster(c, &k);
	sync_steps(c, k.nodes);
	mlfs_backup_kick(st_backup(c));
	follow(c, &k);
	if (k.attempt_j) {
		int64_t from = json_integer_value(json_object_get(k.attempt_j, "from"));
		int64_t to = json_integer_value(json_object_get(k.attempt_j, "to"));
		const char *co = json_string_value(json_object_get(k.attempt_j, "coordinator"));
		participate(c, &k, from, to);
		if (co && strcmp(co, c->me) == 0)
			coordinate(c, &k, to);
	}
	pthread_mutex_lock(&c->lock);
	json_decref(c->nodes);
	json_decref(c->attempt);
	c->nodes = json_incref(k.nodes);
	c->attempt = json_incref(k.attempt_j);
	pthread_mutex_unlock(&c->lock);
	job_keys_free(&k);
	/* What this round changed (a commit: the version; a state) is the
	 * job's at once, not at the next round: a config proposed right after
	 * a commit waits for every node's version. */
	publish(c, why, sizeof(why));
}

static void *cluster_main(void *arg)
{
	struct mlfs_cluster *c = arg;
	uint64_t state = 0;
	char why[512];

	while (!atomic_load(&c->stop)) {
		atomic_store(&c->wake, 0);
		round_once(c);
		int rc = net_etcd_wait(c->etcd, c->prefix, &state, 250, &c->wake, why, sizeof(why));
		if (rc && rc != -ETIMEDOUT && rc != -ECANCELED) {
			struct timespec nap = {0, 200 * 1000000L}; /* etcd down: retry later */
			nanosleep(&nap, NULL);
		}
	}
	return NULL;
}

/* --------------------------------------------------------------- propose */

static int propose_schema(struct mlfs_cluster *c, const char *text, size_t len,
			  struct ptc_error *err)
{
	struct ptc_schema *s;
	char k[512], why[512];
	bool ok = false;
	int rc = ptc_schema_parse_text(text, len, "schema.json", &s, err);

	if (rc)
		return rc;
	ptc_schema_free(s);
	key(c, k, sizeof(k), "schema");
	struct net_etcd_cmp absent = {.key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_cmp same = {.key = k, .target = NET_ETCD_VALUE, .result = NET_ETCD_EQUAL,
				    .value = text, .len = len};
	struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = k, .value = text, .len = len};
	if ((rc = net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, why,
			       sizeof(why))))
		return (ptc_errorf(err, "schema.json: the control plane (etcd) is unreachable: %s",
				  why), -EIO);
	if (!ok && (rc = net_etcd_txn(c->etcd, &same, 1, NULL, 0, NULL, 0, &ok, NULL, NULL, why,
				      sizeof(why))) == 0 &&
	    !ok)
		return ptc_errorf(err, "schema.json: the job \"%s\" already has a different "
				       "schema (etcd key %s); a job's schema is fixed",
				  mlfs_store_cluster(c->st)->job, k);
	if (rc)
		return (ptc_errorf(err, "schema.json: etcd: %s", why), -EIO);
	return mlfs_store_install_schema(c->st, text, len, err);
}

/* The saved step of every rank of the current layout, from every node's
 * entry: 0 and that step in *@step (-1: no live rank), or -EINVAL naming
 * a rank that lags (or a node down). */
static int job_steps_agree(struct mlfs_cluster *c, const struct job_keys *k, int64_t *step,
			   struct ptc_error *err)
{
	struct mlfs_view *v = mlfs_store_view(c->st);
	int rc = 0;
	*step = -1;
	if (!v)
		return 0;
	const struct ptc_layout *l = &v->layout;
	int64_t first = -1;
	int first_rank = -1;
	for (int r = 0; r < l->world && rc == 0; r++) {
		const char *id = l->cluster->nodes[l->ranks[r].node].id;
		json_t *e = json_object_get(k->nodes, id);
		char rk[16];
		snprintf(rk, sizeof(rk), "%d", r);
		json_t *s = json_object_get(json_object_get(e, "steps"), rk);
		const char *state = json_string_value(json_object_get(e, "state"));
		if (!e || (state && strcmp(state, "lost") == 0)) {
			continue; /* down: the plan takes its ranks from other copies, or says */
		} else if (!json_is_integer(s) ||
			   json_integer_value(json_object_get(e, "version")) != v->config->version) {
			rc = ptc_errorf(err, "config.json: node %s has not published rank %d's step",
					id, r);
		} else if (first_rank < 0) {
			first = json_integer_value(s);
			first_rank = r;
		} else if (json_integer_value(s) != first) {
			rc = ptc_errorf(err,
					"config.json: ranks have not saved the same step: rank %d "
					"(node %s) saved step %" PRId64 " while rank %d saved "
					"step %" PRId64,
					r, id, (int64_t)json_integer_value(s), first_rank, first);
		}
	}
	mlfs_view_put(v);
	*step = first;
	return rc;
}

/* Whether every live node published the committed config's version (one
 * that just committed publishes it within a round). */
static bool versions_agree(const struct job_keys *k)
{
	int64_t committed = config_version(k->config->value, k->config->len);
	const char *id;
	json_t *e;
	json_object_foreach(k->nodes, id, e) if (json_integer_value(json_object_get(e, "version")) !=
						 committed) return false;
	return true;
}

static int propose_config(struct mlfs_cluster *c, const char *text, size_t len,
			  struct ptc_error *err)
{
	struct mlfs_store *st = c->st;
	struct ptc_config *cfg;
	struct job_keys k;
	char ka[512], kc[512], why[512];
	bool ok = false;
	int64_t agreed = -1; /* the step the live ranks saved */
	int rc = ptc_config_parse_text(text, len, "config.json", &cfg, err);

	if (rc == 0 && (rc = mlfs_config_supported(cfg, true, "config.json", err)))
		ptc_config_free(cfg);
	if (rc)
		return rc;
	if (!st->schema) {
		ptc_config_free(cfg);
		return ptc_errorf(err, "config.json: write schema.json first");
	}
	key(c, ka, sizeof(ka), "attempt");
	key(c, kc, sizeof(kc), "config");
	/* Steps are published within a round of being written: give the job a
	 * moment to agree before refusing. */
	for (int tries = 0;; tries++) {
		if ((rc = read_job(c, &k, why, sizeof(why)))) {
			ptc_config_free(cfg);
			return (ptc_errorf(err, "config.json: the control plane (etcd) is "
					       "unreachable: %s",
					  why), -EIO);
		}
		sync_cluster(c, &k); /* nodes that joined may be in the config */
		if (!k.config || k.attempt)
			break;
		/* (read_job reset rc: the check runs every round, the last included) */
		if (((rc = job_steps_agree(c, &k, &agreed, err)) == 0 && versions_agree(&k)) ||
		    tries >= 20)
			break;
		job_keys_free(&k);
		struct timespec nap = {0, 100 * 1000000L};
		nanosleep(&nap, NULL);
	}
	int64_t committed = k.config ? config_version(k.config->value, k.config->len) : 0;
	if (rc) {
		/* the steps' refusal is in err */
	} else if (k.attempt) {
		rc = ptc_errorf(err, "config.json: a reconfiguration to version %" PRId64
				     " is in progress (coordinator %s)",
				(int64_t)json_integer_value(json_object_get(k.attempt_j, "to")),
				json_string_value(json_object_get(k.attempt_j, "coordinator")));
		rc = -EBUSY;
	} else if (cfg->version <= committed) {
		rc = ptc_errorf(err,
				"config.json: \"version\" = %" PRId64
				" is not greater than the job's current %" PRId64,
				cfg->version, committed);
	} else if (!k.config) { /* the first config: nothing to move */
		struct net_etcd_cmp absent = {
		    .key = kc, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
		struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = kc, .value = text, .len = len};
		struct ptc_layout l;
		if ((rc = ptc_layout_init(&l, st->schema, cfg, mlfs_store_cluster(st), "config.json", err)) ==
		    0) {
			ptc_layout_release(&l);
			if (net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL,
					 why, sizeof(why)))
				rc = (ptc_errorf(err, "config.json: etcd: %s", why), -EIO);
			else if (!ok)
				rc = ptc_errorf(err, "config.json: another node set the job's "
						     "first config meanwhile");
			else if (view_version(st) == cfg->version)
				rc = 0; /* the control thread installed it first */
			else if ((rc = mlfs_store_install_config(st, text, len, err)) &&
				 view_version(st) == cfg->version) {
				rc = 0; /* ... while we tried */
				mlfs_store_note_error(st, "");
			}
		}
	} else {
		json_t *parts, *down;
		size_t i;
		json_t *p;
		bool me_in = false;
		uint64_t rnd = 0;
		char aid[24];
		if (getentropy(&rnd, sizeof(rnd)))
			rnd = (uint64_t)now_ms() * 2654435761u ^ (uint64_t)getpid();
		snprintf(aid, sizeof(aid), "%016" PRIx64, rnd);
		rc = move_nodes(st, cfg, k.nodes, &parts, &down, err);
		json_t *missing = json_array();
		json_t *job = rc ? NULL : mlfs_jobsync_merge(st, c->me, parts, missing, &rc);
		json_array_foreach(parts, i, p) me_in |= strcmp(json_string_value(p), c->me) == 0;
		json_t *a = rc ? NULL
			       : json_pack("{sssIsIsssssOsOsosIsosO}", "id", aid, "from",
					   (json_int_t)committed, "to",
					   (json_int_t)cfg->version, "config", text, "coordinator",
					   c->me, "participants", parts, "down", down, "backups",
					   usable_backups(c, &k, down, agreed), "deadline_ms",
					   (json_int_t)(now_ms() + MLFS_ATTEMPT_MS), "job",
					   job ? job : json_array(), "job_missing", missing);
		json_decref(missing);
		struct mlfs_reconf_down dn = {0};
		if (rc == 0 && a)
			rc = attempt_down(st, a, &dn);
		json_decref(down);
		char *att = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
		json_decref(a);
		json_decref(parts);
		if (rc == 0 && !att)
			rc = -ENOMEM;
		if (rc == 0) {
			struct net_etcd_cmp cmps[] = {
			    {.key = ka, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL},
			    {.key = kc, .target = NET_ETCD_MOD, .result = NET_ETCD_EQUAL,
			     .num = k.config_mod}};
			char kv[512];
			key(c, kv, sizeof(kv), "votes/%" PRId64 "/", cfg->version);
			struct net_etcd_op put[] = {
			    {.kind = NET_ETCD_PUT, .key = ka, .value = att, .len = strlen(att),
			     .lease = c->lease},
			    /* what an earlier attempt to this version left behind */
			    {.kind = NET_ETCD_DELETE, .key = kv, .prefix = true}};
			pthread_mutex_lock(&c->lock);
			free(c->mine);
			c->mine = att;
			c->mine_to = cfg->version;
			/* This thread prepares it (below): the control thread, which
			 * may see the attempt in etcd first, must not start it too. */
			if (me_in)
				snprintf(c->started_id, sizeof(c->started_id), "%s", aid);
			pthread_mutex_unlock(&c->lock);
			if (!c->lease)
				rc = (ptc_errorf(err, "config.json: this node is not registered "
						     "with etcd (yet)"), -EIO);
			else if (net_etcd_txn(c->etcd, cmps, 2, put, 2, NULL, 0, &ok, NULL,
					      NULL, why, sizeof(why)))
				rc = (ptc_errorf(err, "config.json: etcd: %s", why), -EIO);
			else if (!ok)
				rc = (ptc_errorf(err, "config.json: another reconfiguration started, "
						     "or the config changed, meanwhile"), -EBUSY);
			if (rc && me_in) { /* no attempt of ours: the next one starts */
				pthread_mutex_lock(&c->lock);
				if (strcmp(c->started_id, aid) == 0)
					c->started_id[0] = '\0';
				pthread_mutex_unlock(&c->lock);
			}
		}
		/* The coordinator prepares at once when it takes part: its
		 * status.json (which mlfs reconfigure reads) shows the attempt
		 * from now on. */
		if (rc == 0 && me_in) {
			struct ptc_error perr = {""};
			sync_steps(c, k.nodes);
			fill_down_steps(c, dn.down, dn.ndown);
			if ((rc = mlfs_reconf_prepare_down(st, text, len, "attempt", false, &dn,
							   &perr))) {
				/* the coordinator aborts the attempt at its next round */
				char v[700];
				snprintf(v, sizeof(v), "failed: %s", perr.text);
				vote(c, cfg->version, aid, v);
				snprintf(err->text, sizeof(err->text), "%s", perr.text);
			} else {
				mark_prepared(c, aid);
			}
		}
		down_free(&dn);
	}
	job_keys_free(&k);
	ptc_config_free(cfg);
	return rc;
}

static int propose(void *arg, bool config, const char *text, size_t len, struct ptc_error *err)
{
	struct mlfs_cluster *c = arg;
	return config ? propose_config(c, text, len, err) : propose_schema(c, text, len, err);
}

/* --------------------------------------------------------------- status */

static void status_add(void *arg, json_t *o)
{
	struct mlfs_cluster *c = arg;
	json_t *nodes = json_array(), *job = json_object();
	struct mlfs_store *st = c->st;

	pthread_mutex_lock(&c->lock);
	for (int n = 0; n < mlfs_store_cluster(st)->nnodes; n++) {
		const char *id = mlfs_store_cluster(st)->nodes[n].id;
		json_t *e = json_object_get(c->nodes, id);
		json_array_append_new(
		    nodes, json_pack("{sssbsOsO}", "id", id, "up", e != NULL, "version",
				     e ? json_object_get(e, "version") : json_null(), "state",
				     e ? json_object_get(e, "state") : json_null()));
	}
	json_object_set_new(job, "job", json_string(mlfs_store_cluster(st)->job));
	json_object_set_new(job, "etcd", json_string(c->etcd_error[0] ? "unreachable" : "ok"));
	if (c->etcd_error[0])
		json_object_set_new(job, "etcd_error", json_string(c->etcd_error));
	json_object_set_new(job, "nodes", nodes);
	json_t *bk = mlfs_backup_describe(st_backup(c));
	json_object_set_new(job, "backup", bk ? bk : json_null());
	json_t *a = c->attempt ? json_deep_copy(c->attempt) : json_null();
	json_object_del(a, "config");
	json_object_del(a, "job");
	json_object_set_new(job, "attempt", a);
	pthread_mutex_unlock(&c->lock);
	json_object_set_new(o, "cluster", job);
}

/* ---------------------------------------------------------------- start */

/* One try at joining the job's cluster (etcd key @k): 0, -EAGAIN when the
 * key changed meanwhile, or an error with @why. */
static int join_cluster(struct mlfs_cluster *c, const char *k, char *why, size_t whylen)
{
	struct mlfs_store *st = c->st;
	const char *mine = mlfs_store_cluster_text(st);
	struct net_etcd_cmp absent = {.key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_op put = {.kind = NET_ETCD_PUT, .key = k, .value = mine, .len = strlen(mine)};
	struct net_etcd_kv kv;
	struct ptc_cluster *theirs = NULL;
	struct ptc_error err = {""}, err2 = {""};
	char e[512];
	bool ok = false;
	int rc;

	if (net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, e, sizeof(e)) ||
	    (!ok && net_etcd_get(c->etcd, k, &kv, NULL, e, sizeof(e)))) {
		snprintf(why, whylen, "etcd at %s: %s", mlfs_store_cluster(st)->etcd, e);
		return -EIO;
	}
	if (ok)
		return 0; /* the first node */
	if ((rc = ptc_cluster_parse_text(kv.value, kv.len, "the job's cluster.json", &theirs,
					 &err)) == 0) {
		if (ptc_cluster_extends(theirs, mlfs_store_cluster(st), &err) == 0) {
			if (theirs->nnodes < mlfs_store_cluster(st)->nnodes) { /* we add nodes */
				struct net_etcd_cmp same = {.key = k, .target = NET_ETCD_MOD,
							    .result = NET_ETCD_EQUAL,
							    .num = kv.mod_revision};
				rc = net_etcd_txn(c->etcd, &same, 1, &put, 1, NULL, 0, &ok, NULL,
						  NULL, e, sizeof(e))
					 ? (snprintf(why, whylen, "etcd at %s: %s",
						     mlfs_store_cluster(st)->etcd, e),
					    -EIO)
				     : ok ? 0
					  : -EAGAIN;
				if (rc == 0)
					mlfs_log(MLFS_LOG_INFO,
						 "cluster: this node's cluster.json adds %d nodes "
						 "to the job's %d",
						 mlfs_store_cluster(st)->nnodes - theirs->nnodes,
						 theirs->nnodes);
			}
		} else if (ptc_cluster_extends(mlfs_store_cluster(st), theirs, &err2) == 0) {
			/* nodes joined since our cluster.json was written */
			rc = mlfs_store_grow_cluster(st, kv.value, kv.len, &err2);
			rc = rc < 0 ? (snprintf(why, whylen, "%s", err2.text), rc) : 0;
		} else {
			rc = -EINVAL;
		}
	}
	if (rc == -EINVAL)
		snprintf(why, whylen,
			 "cluster.json differs from the job \"%s\"'s (etcd key %s): %s; every "
			 "node mounts with the job's cluster.json, or one that adds nodes at its end",
			 mlfs_store_cluster(st)->job, k, err.text);
	ptc_cluster_free(theirs);
	free(kv.key);
	free(kv.value);
	return rc;
}

int mlfs_cluster_start(struct mlfs_store *st, struct mlfs_cluster **out, char *why, size_t whylen)
{
	struct mlfs_cluster *c;
	int rc;

	*out = NULL;
	if (!mlfs_store_cluster(st)->etcd || !mlfs_store_cluster(st)->job) {
		snprintf(why, whylen, "cluster.json: a job of %d nodes needs \"job\" and \"etcd\"",
			 mlfs_store_cluster(st)->nnodes);
		return -EINVAL;
	}
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->publock, NULL);
	c->st = st;
	c->me = mlfs_store_cluster(st)->nodes[st->node].id;
	snprintf(c->prefix, sizeof(c->prefix), "/mlfs/%s/", mlfs_store_cluster(st)->job);
	struct net_http_opts o = {.retries = 2, .timeout_ms = 2000, .deadline_ms = 5000};
	if ((rc = net_etcd_new(mlfs_store_cluster(st)->etcd, &o, &c->etcd, why, whylen)))
		goto err_free;
	/* Join: the job's cluster is ours (the first node puts it), or one
	 * that ours extends (nodes join: ours replaces it), or one that
	 * extends ours (nodes joined before us: we take it). */
	char k[512], e[512];
	key(c, k, sizeof(k), "cluster");
	for (int tries = 0; (rc = join_cluster(c, k, why, whylen)) == -EAGAIN; tries++)
		if (tries == 20) {
			snprintf(why, whylen, "the job's cluster.json (etcd key %s) kept changing", k);
			break;
		}
	if (rc)
		goto err_etcd;
	/* Register and read the job once before serving: a restarted node
	 * knows the current version as it mounts. */
	if ((rc = keep_registered(c, e, sizeof(e)))) {
		snprintf(why, whylen, "etcd at %s: %s", mlfs_store_cluster(st)->etcd, e);
		goto err_etcd;
	}
	round_once(c);
	st->cluster_arg = c;
	st->multinode = true;
	st->propose = propose;
	st->status_add = status_add;
	st->steps_saved = steps_saved;
	st->reconf_changed = reconf_changed;
	if ((rc = -pthread_create(&c->thread, NULL, cluster_main, c))) {
		snprintf(why, whylen, "cannot start a thread");
		st->propose = NULL, st->status_add = NULL, st->steps_saved = NULL;
		st->reconf_changed = NULL, st->cluster_arg = NULL;
		goto err_etcd;
	}
	c->running = true;
	*out = c;
	return 0;

err_etcd:
	net_etcd_free(c->etcd);
err_free:
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return rc;
}

void mlfs_cluster_stop(struct mlfs_cluster *c)
{
	char why[256];
	if (!c)
		return;
	atomic_store(&c->stop, 1);
	atomic_store(&c->wake, 1);
	if (c->running)
		pthread_join(c->thread, NULL);
	if (c->lease) /* leave at once rather than when the lease expires */
		net_etcd_lease_revoke(c->etcd, c->lease, NULL, why, sizeof(why));
	net_etcd_free(c->etcd);
	json_decref(c->nodes);
	json_decref(c->attempt);
	free(c->mine);
	free(c->published);
	mlfs_job_free(c->job);
	pthread_mutex_destroy(&c->publock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}
