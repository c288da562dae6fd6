/*
 * mlfs_controller.c - the elastic controller: with "elastic" in the
 * committed config, one daemon of the job chooses a new layout when nodes
 * die or join, and proposes it like any config.json write.
 *
 * DESIGN
 * Who: etcd decides. The controller is the node whose id is in the job's
 * "controller" key, created by a transaction that requires the key absent
 * and bound to that node's lease: when the node dies or freezes past its
 * lease, the key goes with it and the next node to see it absent takes it
 * (every node follows the job's keys; no other leader logic). What: the
 * pure function of mlfs_elastic.c, on what the controller sees: the
 * committed config, the nodes' entries (it follows them while it leads:
 * need_peers), and, as its baseline, which nodes were live when it first
 * saw that config (a node live then and left out by a person's config
 * stays out). When: whenever the job's keys or the entries change, at
 * most once per back-off after a proposal failed (1 s, doubling to 30 s;
 * 0.2 s first when it was refused with EBUSY: a save in progress, steps
 * not agreed yet; a change of the live nodes resets it), never while an attempt is in
 * progress. How: mlfs_propose, on this thread (not the control thread,
 * which must go on voting): it waits for the ranks' saved steps to agree,
 * builds the attempt with this node as its coordinator, and the control
 * plane does the rest as for any config. What it decided and why goes to
 * the log and to status.json ("elastic").
 *
 * status.json's "elastic": the controller's id, whether it is this node,
 * its last decision, and the version it last proposed with the decision
 * that made it ("why"), its refusal ("error"), when the change of nodes it
 * answered was seen ("seen_at": a dead node's lease expired, a node's
 * entry appeared) and when it proposed ("proposed_at"), wall-clock
 * seconds, so that a driver can split the time from a death to the new
 * layout into detection, decision and reconfiguration.
 *
 * Threads: one controller thread per daemon ("mlfs-elastic"), asleep
 * unless kicked (by the control thread's rounds when it may have work:
 * mlfs_controller_note; by the peers mirror while it leads) or 5 s
 * passed; t->lock guards what
 * status.json reads and the kick flag; nothing is taken under it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cluster/cluster_i.h"
#include "cluster/elastic_i.h"

struct mlfs_controller {
	struct mlfs_cluster *c;
	pthread_t thread;
	atomic_bool stop, leading;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool kicked; /* lock */
	/* The controller thread's own. */
	int64_t base_version; /* the committed version the baseline is of */
	bool *base;	      /* per cluster node: live when it was first seen */
	int base_n;
	bool *last_live;   /* the live nodes at the last decision */
	double changed_at; /* when it saw them change (wall clock, s) */
	int fails;
	int64_t next_ms; /* no proposal before (back-off) */
	/* The control thread's: the config last noted and whether elastic. */
	int64_t noted_mod, noted_holder; /* the config's and the controller key's revisions */
	bool noted_elastic;
	/* lock: for status.json */
	char holder[128];    /* the controller's id ("": none) */
	char decision[1024]; /* the last decision and why */
	char error[1024];    /* the last proposal's refusal ("": none) */
	int64_t proposed;    /* the version it last proposed (0: none) */
	/* the revision that created its last attempt (controller thread): a
	 * view of the keys older than that lacks the attempt, and must not
	 * propose the same config again (the rounds during a proposal kick) */
	int64_t proposed_rev;
	char proposed_why[1024]; /* the decision that proposed it */
	double seen_at;		 /* when the change it answered was seen (wall clock, s) */
	double proposed_at;	 /* when it was proposed (wall clock, s) */
};

/* The wall clock in seconds: status.json's times, comparable across nodes
 * and with a training script's (time.time()). */
static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void note(struct mlfs_controller *t, const char *decision, const char *error)
{
	pthread_mutex_lock(&t->lock);
	bool same = strcmp(t->decision, decision) == 0;
	snprintf(t->decision, sizeof(t->decision), "%s", decision);
	if (error)
		snprintf(t->error, sizeof(t->error), "%s", error);
	pthread_mutex_unlock(&t->lock);
	if (!same)
		mlfs_log(MLFS_LOG_INFO, "elastic: %s", decision);
}

/* Takes the "controller" key when it is absent: true when this node did. */
static bool campaign(struct mlfs_controller *t)
{
	struct mlfs_cluster *c = t->c;
	char k[512];
	struct ptc_error why;
	bool ok = false;
	int64_t lease = atomic_load(&c->lease);

	if (!lease)
		return false;
	mlfs_jobkeys_name(c, k, sizeof(k), "controller");
	struct net_etcd_cmp absent = {
	    .key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
	struct net_etcd_op put = {
	    .kind = NET_ETCD_PUT, .key = k, .value = c->me, .len = strlen(c->me), .lease = lease};
	if (net_etcd_txn(c->etcd, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, &why))
		return false;
	if (ok)
		mlfs_log(MLFS_LOG_INFO, "elastic: this node is the job's controller");
	return ok;
}

/* Per node of @cl: up (an entry) and not lost, from @nodes; marked for
 * draining, from @drain. */
static void live_nodes(const struct ptc_cluster *cl, const json_t *nodes, const json_t *drain,
		       bool *live, bool *draining)
{
	for (int i = 0; i < cl->nnodes; i++) {
		const json_t *e = json_object_get(nodes, cl->nodes[i].id);
		const char *state = json_string_value(json_object_get(e, "state"));
		live[i] = e && !(state && strcmp(state, "lost") == 0);
		draining[i] = json_object_get(drain, cl->nodes[i].id) != NULL;
	}
}

/* The backup holder of each node under @cur, when it is live (-1: none). */
static void backup_holders(struct mlfs_store *st, const struct ptc_config *cur, const bool *live,
			   int *backup_of)
{
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	struct ptc_layout l;
	struct ptc_error why;

	for (int i = 0; i < cl->nnodes; i++)
		backup_of[i] = -1;
	if (!cur->replicas || !st->schema ||
	    ptc_layout_init(&l, st->schema, cur, cl, "the committed config", &why))
		return;
	for (int i = 0; i < cl->nnodes; i++) {
		int h = ptc_layout_backup_holder(&l, i);
		backup_of[i] = h >= 0 && live[h] ? h : -1;
	}
	ptc_layout_release(&l);
}

/* The leader's turn: decide on @k and @cur, and propose. */
static void lead(struct mlfs_controller *t, const struct mlfs_jobkeys *k,
		 const struct ptc_config *cur)
{
	struct mlfs_cluster *c = t->c;
	struct mlfs_store *st = c->st;
	const struct ptc_cluster *cl = mlfs_store_cluster(st);
	int n = cl->nnodes;
	bool *live = calloc((size_t)n, sizeof(bool)), *drain = calloc((size_t)n, sizeof(bool));
	bool *usable = calloc((size_t)n, sizeof(bool));
	int *backup_of = calloc((size_t)n, sizeof(int));
	struct mlfs_elastic_out out = {0};

	if (!live || !drain || !usable || !backup_of || !st->schema)
		goto out;
	live_nodes(cl, k->nodes, k->draining, live, drain);
	for (int i = 0; i < n; i++) /* a drained node, undrained, joins again */
		usable[i] = live[i] && !drain[i];
	if (t->base_version != cur->version || t->base_n != n) { /* a new baseline */
		bool *b = realloc(t->base, (size_t)n * sizeof(bool));
		bool *l = realloc(t->last_live, (size_t)n * sizeof(bool));
		if (b)
			t->base = b;
		if (l)
			t->last_live = l;
		if (!b || !l)
			goto out;
		memcpy(t->base, usable, (size_t)n * sizeof(bool));
		memcpy(t->last_live, usable, (size_t)n * sizeof(bool));
		t->base_version = cur->version;
		t->base_n = n;
		t->changed_at = wall_s();
	}
	if (memcmp(t->last_live, usable, (size_t)n * sizeof(bool))) { /* the nodes changed */
		memcpy(t->last_live, usable, (size_t)n * sizeof(bool));
		t->changed_at = wall_s();
		t->fails = 0;
		t->next_ms = 0;
	}
	if (mlfs_cluster_now_ms() < t->next_ms)
		goto out;
	backup_holders(st, cur, live, backup_of);
	struct mlfs_elastic_in in = {.schema = st->schema,
				     .cluster = cl,
				     .cur = cur,
				     .live = live,
				     .draining = drain,
				     .baseline = t->base,
				     .backup_of = backup_of};
	if (mlfs_elastic_decide(&in, &out))
		goto out;
	if (!out.config) {
		note(t, out.why, NULL);
		goto out;
	}
	char *text = json_dumps(out.config, JSON_COMPACT);
	struct ptc_error err = {.text = ""};
	int64_t to = json_integer_value(json_object_get(out.config, "version"));
	note(t, out.why, "");
	int64_t created = 0;
	int rc =
	    text ? mlfs_propose_for_controller(c, text, strlen(text), &created, &err) : -ENOMEM;
	free(text);
	t->proposed_rev = created;
	pthread_mutex_lock(&t->lock);
	t->proposed = to;
	t->seen_at = t->changed_at;
	t->proposed_at = wall_s();
	snprintf(t->proposed_why, sizeof(t->proposed_why), "%s", out.why);
	snprintf(t->error, sizeof(t->error), "%s", rc ? err.text : "");
	pthread_mutex_unlock(&t->lock);
	if (rc) {
		/* EBUSY: a save in progress or the steps not yet agreed,
		 * which pass within a save: again soon, then backing off */
		int64_t base = rc == -EBUSY ? 200 : 1000;
		int64_t wait = base << (t->fails < 7 ? t->fails : 7);
		t->fails++;
		t->next_ms = mlfs_cluster_now_ms() + (wait < 30000 ? wait : 30000);
		mlfs_log(MLFS_LOG_WARNING,
			 "elastic: version %" PRId64 " refused: %s (again in %" PRId64
			 " s unless the nodes change)",
			 to, err.text, (t->next_ms - mlfs_cluster_now_ms() + 999) / 1000);
	} else {
		t->fails = 0;
		mlfs_log(MLFS_LOG_INFO, "elastic: proposed version %" PRId64, to);
	}
out:
	json_decref(out.config);
	free(live);
	free(drain);
	free(usable);
	free(backup_of);
}

static void tick(struct mlfs_controller *t)
{
	struct mlfs_cluster *c = t->c;
	struct mlfs_jobkeys k;
	struct ptc_error why;
	struct ptc_config *cur = NULL;

	if (mlfs_jobkeys_mirrored(c, &k, &why))
		return; /* etcd unreachable: the control thread says so */
	if (k.config)
		ptc_config_parse_text(k.config->value, k.config->len, "the committed config", &cur,
				      &why);
	const char *holder = k.controller ? k.controller->value : "";
	bool elastic = cur && cur->elastic;
	if (elastic && !k.controller && campaign(t))
		holder = c->me;
	bool leading = elastic && strcmp(holder, c->me) == 0 &&
		       (!k.controller || k.controller->lease == atomic_load(&c->lease));
	bool was = atomic_exchange(&t->leading, leading);
	pthread_mutex_lock(&t->lock);
	snprintf(t->holder, sizeof(t->holder), "%s", elastic ? holder : "");
	pthread_mutex_unlock(&t->lock);
	if (leading && !was)
		mlfs_cluster_wake(c); /* its control thread follows the entries now */
	if (!elastic)
		note(t, "the committed config is not elastic", NULL);
	else if (leading && !k.nodes_known)
		; /* the entries are not followed yet: the next kick */
	else if (leading && k.revision < t->proposed_rev)
		; /* its attempt not in this view yet: the round that brings it kicks */
	else if (leading && k.attempt)
		note(t, "a reconfiguration is in progress", NULL);
	else if (leading)
		lead(t, &k, cur);
	ptc_config_free(cur);
	mlfs_jobkeys_free(&k);
}

static void *controller_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-elastic"); /* for top -H, perf */
	struct mlfs_controller *t = arg;

	pthread_mutex_lock(&t->lock);
	while (!atomic_load(&t->stop)) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 5;
		while (!t->kicked && !atomic_load(&t->stop))
			if (pthread_cond_timedwait(&t->cond, &t->lock, &until))
				break;
		t->kicked = false;
		if (atomic_load(&t->stop))
			break;
		pthread_mutex_unlock(&t->lock);
		tick(t);
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int mlfs_controller_start(struct mlfs_cluster *c, struct mlfs_controller **out)
{
	struct mlfs_controller *t = calloc(1, sizeof(*t));
	int rc;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	t->c = c;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	if ((rc = -pthread_create(&t->thread, NULL, controller_main, t))) {
		pthread_cond_destroy(&t->cond);
		pthread_mutex_destroy(&t->lock);
		free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void mlfs_controller_stop(struct mlfs_controller *t)
{
	if (!t)
		return;
	atomic_store(&t->stop, true);
	pthread_mutex_lock(&t->lock);
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
}

void mlfs_controller_free(struct mlfs_controller *t)
{
	if (!t)
		return;
	pthread_cond_destroy(&t->cond);
	pthread_mutex_destroy(&t->lock);
	free(t->base);
	free(t->last_live);
	free(t);
}

void mlfs_controller_note(struct mlfs_controller *t, const struct mlfs_jobkeys *k)
{
	if (!t || !k->config)
		return;
	if (k->config_mod != t->noted_mod) { /* once per config */
		/* (a committed config passed the proposer's parse: its
		 * "elastic" section is a valid one) */
		bool was = t->noted_elastic;
		t->noted_elastic = k->config_elastic;
		t->noted_mod = k->config_mod;
		if (was != t->noted_elastic) {
			mlfs_controller_kick(t); /* elastic now, or no more */
			return;
		}
	}
	bool mine = k->controller && strcmp(k->controller->value, t->c->me) == 0;
	int64_t holder = k->controller ? k->controller->mod_revision : 0;
	bool moved = holder != t->noted_holder; /* status.json names the controller */
	t->noted_holder = holder;
	if (t->noted_elastic && (!k->controller || mine || moved))
		mlfs_controller_kick(t);
}

int mlfs_controller_drain(void *arg, const char *node, bool undo, struct ptc_error *err)
{
	struct mlfs_cluster *c = arg;
	char k[512];
	struct ptc_error why;

	if (ptc_cluster_find(mlfs_store_cluster(c->st), node) < 0)
		return ptc_errorf(err, "drain: no node \"%s\" in the job's cluster", node);
	mlfs_jobkeys_name(c, k, sizeof(k), "drain/%s", node);
	int rc = undo ? net_etcd_delete(c->etcd, k, false, NULL, NULL, &why)
		      : net_etcd_put(c->etcd, k, "1", 1, 0, NULL, &why);
	if (rc)
		return ptc_error_set(err, -EIO, "drain: etcd: %s", why.text);
	mlfs_log(MLFS_LOG_INFO, "elastic: node %s %s", node,
		 undo ? "no longer marked for draining" : "marked for draining");
	return 0;
}

void mlfs_controller_kick(struct mlfs_controller *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->kicked = true;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

bool mlfs_controller_leading(struct mlfs_controller *t)
{
	return t && atomic_load(&t->leading);
}

void mlfs_controller_status(struct mlfs_controller *t, json_t *o)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	if (t->holder[0] || t->decision[0])
		json_object_set_new(
		    o, "elastic",
		    json_pack("{sosbsssososo}", "controller",
			      t->holder[0] ? json_string(t->holder) : json_null(), "this_node",
			      atomic_load(&t->leading), "decision", t->decision, "proposed",
			      t->proposed ? json_integer(t->proposed) : json_null(), "why",
			      t->proposed ? json_string(t->proposed_why) : json_null(), "error",
			      t->error[0] ? json_string(t->error) : json_null()));
	json_t *el = json_object_get(o, "elastic");
	if (el && t->proposed) { /* the proposal's timeline: seen, then proposed */
		json_object_set_new(el, "seen_at", json_real(t->seen_at));
		json_object_set_new(el, "proposed_at", json_real(t->proposed_at));
	}
	pthread_mutex_unlock(&t->lock);
}
