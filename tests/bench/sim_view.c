/*
 * sim_view.c - what a simulated node sees of etcd (sim_control.c's DESIGN
 * block): the job's keys as one watch stream shows them (mlfs_mirror.c's
 * order: a watch from now, its "created" awaited, one range, the events
 * meanwhile applied when newer), and the nodes' entries while a node
 * follows them (a copy of that order for any node but n0, n0's real
 * mlfs_mirror).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/bench/sim_i.h"

/* ---------------------------------------------------------- the views */

/* A config's "version" (the texts here start with it), or -1. */
int64_t config_version(const char *v)
{
	const char *p = strstr(v, "\"version\":");
	return p ? strtoll(p + 10, NULL, 10) : -1;
}

/* Keeps a copy of @n events for after the read (mlfs_mirror.c's keep). */
static void pend_keep(struct pend *p, const struct net_etcd_event *ev, size_t n)
{
	if (p->n + n > p->cap) {
		p->cap = (p->n + n) * 2;
		p->ev = realloc(p->ev, p->cap * sizeof(*p->ev));
		if (!p->ev)
			die("out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		struct net_etcd_event *e = &p->ev[p->n++];
		*e = ev[i];
		e->kv.key = strdup(ev[i].kv.key);
		e->kv.value = malloc(ev[i].kv.len + 1);
		if (!e->kv.key || !e->kv.value)
			die("out of memory");
		if (ev[i].kv.len)
			memcpy(e->kv.value, ev[i].kv.value, ev[i].kv.len);
		e->kv.value[ev[i].kv.len] = '\0';
	}
}

void pend_free(struct pend *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->ev[i].kv.key);
		free(p->ev[i].kv.value);
	}
	free(p->ev);
	*p = (struct pend){0};
}

/* mlfs_mirror.c's wait_created: until etcd created the watch (@created)
 * or its stream ended (@dead), at most 5 s (@lock held): 0 or -EIO. */
static int wait_created(pthread_cond_t *cond, pthread_mutex_t *lock, const bool *created,
			const bool *dead, struct ptc_error *err)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += 5;
	while (!*created && !*dead)
		if (pthread_cond_timedwait(cond, lock, &t))
			break;
	if (*created && !*dead)
		return 0;
	snprintf(err->text, sizeof(err->text), "the watch %s",
		 *dead ? "ended" : "was not created within 5 s");
	return -EIO;
}

/* One put or delete into view @g (mlfs_mirror.c's apply, as
 * mlfs_jobkeys.c's parse then reads it). Lock held. */
void apply(struct group *g, const struct net_etcd_kv *kv, bool deleted)
{
	size_t plen = strlen(S.prefix);
	if (strncmp(kv->key, S.prefix, plen) != 0)
		return;
	const char *nm = kv->key + plen;
	if (strcmp(nm, "schema") == 0) {
		g->has_schema = !deleted;
	} else if (strcmp(nm, "config") == 0) {
		g->committed = deleted ? 0 : config_version(kv->value);
	} else if (strcmp(nm, "config_id") == 0) {
		snprintf(g->config_id, sizeof(g->config_id), "%s", deleted ? "" : kv->value);
	} else if (strcmp(nm, "attempt") == 0) {
		att_put(g->att);
		g->att = deleted ? NULL : att_get(kv->value, kv->len, kv->mod_revision);
	} else if (strcmp(nm, "released") == 0) { /* mlfs_jobkeys.c's released_parsed */
		json_decref(g->released_ids);
		g->released_ids = NULL;
		g->released_rev = kv->mod_revision;
		g->released = deleted ? 0 : strtoll(kv->value, NULL, 10);
		if (!deleted && kv->value[0] == '{') {
			json_t *j = json_loads(kv->value, 0, NULL), *id;
			size_t i;
			g->released = json_integer_value(json_object_get(j, "version"));
			g->released_ids = json_object();
			json_array_foreach(json_object_get(j, "entries"), i, id)
			    json_object_set_new(g->released_ids, json_string_value(id),
						json_true());
			json_decref(j);
		}
	}
}

static void view_reset(struct group *g)
{
	att_put(g->att);
	g->att = NULL;
	g->config_id[0] = '\0';
	g->has_schema = false;
	g->committed = g->released = 0;
	json_decref(g->released_ids);
	g->released_ids = NULL;
}

/* The watch's function: mlfs_mirror.c's on_watch (while group_sync reads,
 * the events are kept for after; else those newer than the view's
 * revision applied), then mlfs_cluster.c's keys_changed for every node of
 * the stream: any event, or the watch's end, wakes it. */
void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct group *g = arg;
	int64_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		bytes += (int64_t)(strlen(ev[i].kv.key) + ev[i].kv.len);
	pthread_mutex_lock(&g->lock);
	int64_t stale = 0, dropped = 0;
	bool ended = n == 0 && revision < 0, setup = atomic_load(&S.in_setup);
	bool created = n == 0 && revision > 0 && !g->created && !ended, syncing = g->syncing;
	if (ended) {
		if (g->created)
			c_add(C_CREATED, -1);
		g->created = false;
		g->dead = true;
		if (setup && !syncing) /* start-up (not measured): restarted as it was */
			g->ended = true;
		else
			g->live = false;
		if (!atomic_load(&S.stop) && !setup && !syncing)
			fprintf(stderr, "sim_control: stream %d: the watch ended: %s\n", g->idx,
				strerror((int)-revision));
	}
	if (created)
		g->created = true;
	if (syncing) {
		pend_keep(&g->pend, ev, n);
	} else {
		int64_t last = g->last_event; /* a message's events may share a revision */
		for (size_t i = 0; i < n; i++) {
			int64_t mod = ev[i].kv.mod_revision;
			stale += mod <= last; /* etcd sent it before (to a slow watcher) */
			dropped += mod > last && mod <= g->revision;
			if (mod > g->revision) /* mlfs_mirror.c's apply_new */
				apply(g, &ev[i].kv, ev[i].deleted);
			if (mod > g->last_event)
				g->last_event = mod;
		}
		if (revision > g->revision)
			g->revision = revision;
	}
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	if (n) {
		c_max(C_LAST_EVENT, wall_ns());
		c_add(C_EVENTS, (int64_t)n);
		c_add(C_MESSAGES, 1);
		c_add(C_BYTES, bytes);
		c_add(C_STALE, stale);
		c_add(C_DROPPED, dropped);
	} else if (created) {
		c_add(C_CREATED, 1); /* etcd's "created" */
	}
	if (syncing || !(n || ended) || atomic_load(&S.stop) || (ended && setup))
		return;
	pthread_mutex_lock(&S.lock); /* keys_changed */
	for (int i = g->first; i < g->first + g->count; i++)
		wake_locked(node_at(i));
	pthread_mutex_unlock(&S.lock);
}

/* mlfs_mirror_sync for stream @g: when it is not live, a watch from now,
 * its "created" awaited, one range of the job's keys, and the events that
 * came meanwhile applied when newer than the range. */
int group_sync(struct worker *w, struct group *g)
{
	struct net_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t rev = 0;
	struct ptc_error err = {.text = ""};
	int rc = 0;

	pthread_mutex_lock(&g->sync_lock);
	pthread_mutex_lock(&g->lock);
	bool live = g->live;
	pthread_mutex_unlock(&g->lock);
	if (live)
		goto out;
	net_etcd_watch_stop(g->watch);
	g->watch = NULL;
	pthread_mutex_lock(&g->lock);
	g->syncing = true;
	g->created = g->dead = false;
	pend_free(&g->pend);
	pthread_mutex_unlock(&g->lock);
	c_add(C_WATCH, 1);
	rc = net_etcd_watch_start(w->etcd, S.prefix, 0, on_watch, NULL, g, &g->watch, &err);
	pthread_mutex_lock(&g->lock);
	if (rc == 0)
		rc = wait_created(&g->cond, &g->lock, &g->created, &g->dead, &err);
	pthread_mutex_unlock(&g->lock);
	if (rc == 0) {
		c_add(C_RANGE, 1);
		rc = net_etcd_range(w->etcd, S.prefix, true, &kvs, &n, &rev, NULL, &err);
	}
	pthread_mutex_lock(&g->lock);
	if (rc == 0) {
		view_reset(g);
		for (size_t i = 0; i < n; i++)
			apply(g, &kvs[i], false);
		g->revision = rev;
		for (size_t i = 0; i < g->pend.n; i++)
			if (g->pend.ev[i].kv.mod_revision > rev)
				apply(g, &g->pend.ev[i].kv, g->pend.ev[i].deleted);
		for (size_t i = 0; i < g->pend.n; i++)
			if (g->pend.ev[i].kv.mod_revision > g->revision)
				g->revision = g->pend.ev[i].kv.mod_revision;
		g->last_event = g->revision;
		if (g->dead) {
			rc = -EIO;
			snprintf(err.text, sizeof(err.text), "the watch ended during the read");
		}
	}
	g->syncing = false;
	pend_free(&g->pend);
	g->live = rc == 0;
	pthread_mutex_unlock(&g->lock);
	net_etcd_kvs_free(kvs, n);
	if (rc)
		fprintf(stderr, "sim_control: stream %d: sync: %s\n", g->idx, err.text);
out:
	pthread_mutex_unlock(&g->sync_lock);
	return rc;
}

/* ------------------------------------------------ the nodes' entries */

/* Node entry @kv put or deleted into @ent (mlfs_jobkeys.c's parse_nodes,
 * reduced to what the decisions read; saved/<id> marks are skipped). */
static void entry_apply(uint32_t *ent, const struct net_etcd_kv *kv, bool deleted)
{
	size_t plen = strlen(S.nprefix);
	if (strncmp(kv->key, S.nprefix, plen) != 0 || strchr(kv->key + plen, '/'))
		return;
	int i = node_index(kv->key + plen, strlen(kv->key + plen));
	if (i < 0)
		return;
	uint32_t e = 0;
	if (!deleted) {
		const char *v = strstr(kv->value, "\"version\":");
		e = E_UP | ((uint32_t)(v ? strtoll(v + 10, NULL, 10) : 0) & E_VERSION);
		if (strstr(kv->value, "\"state\":\"lost\""))
			e |= E_LOST;
	}
	ent[i] = e;
}

/* How many of @n keys are entries (not saved/<id> marks). */
static int64_t entries_in(const struct net_etcd_kv *kvs, size_t n)
{
	size_t plen = strlen(S.nprefix);
	int64_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += strlen(kvs[i].key) > plen && !strchr(kvs[i].key + plen, '/');
	return k;
}

/* mlfs_cluster.c's peers_changed: a node's entry changed, came or went;
 * it wakes a node that coordinates or waits for the swaps of a commit. */
void peers_changed(void *arg)
{
	struct node *nd = arg;
	if (!atomic_load(&S.stop) &&
	    (atomic_load(&nd->coordinating) || atomic_load(&nd->swap_waiting)))
		wake(nd);
}

/* The watch's function of a node's entries (mlfs_mirror.c's on_watch),
 * then peers_changed. */
static void on_peers(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct peers *p = arg;
	pthread_mutex_lock(&p->lock);
	if (n == 0 && revision < 0) {
		p->live = false;
		p->dead = true;
	} else if (n == 0) {
		p->created = true;
	}
	bool syncing = p->syncing;
	if (syncing) {
		pend_keep(&p->pend, ev, n);
	} else {
		for (size_t i = 0; i < n; i++)
			if (ev[i].kv.mod_revision > p->revision)
				entry_apply(p->ent, &ev[i].kv, ev[i].deleted);
		if (revision > p->revision)
			p->revision = revision;
	}
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	c_add(C_EN_EVENTS, (int64_t)n);
	if (!syncing && (n || revision < 0))
		peers_changed(p->nd);
}

/* mlfs_mirror_stop of a node's entries (its view freed). */
void peers_stop(struct node *nd)
{
	struct peers *p = nd->pv;
	if (!p)
		return;
	net_etcd_watch_stop(p->watch); /* its thread ends first */
	nd->pv = NULL;
	pend_free(&p->pend);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	free(p->ent);
	free(p);
}

/* mlfs_mirror_sync of a node's entries: when not live, a watch from now,
 * its "created" awaited, one range, the events meanwhile applied. */
static int peers_sync(struct worker *w, struct node *nd, struct ptc_error *err)
{
	struct peers *p = nd->pv;
	struct net_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t rev = 0;

	if (!p) {
		p = nd->pv = xcalloc(1, sizeof(*p));
		pthread_mutex_init(&p->lock, NULL);
		pthread_cond_init(&p->cond, NULL);
		p->nd = nd;
		p->ent = xcalloc((size_t)S.n, sizeof(*p->ent));
	}
	pthread_mutex_lock(&p->lock);
	bool live = p->live;
	pthread_mutex_unlock(&p->lock);
	if (live)
		return 0;
	net_etcd_watch_stop(p->watch);
	p->watch = NULL;
	pthread_mutex_lock(&p->lock);
	p->syncing = true;
	p->created = p->dead = false;
	pend_free(&p->pend);
	pthread_mutex_unlock(&p->lock);
	c_add(C_WATCH, 1);
	int rc = net_etcd_watch_start(w->etcd, S.nprefix, 0, on_peers, NULL, p, &p->watch, err);
	pthread_mutex_lock(&p->lock);
	if (rc == 0)
		rc = wait_created(&p->cond, &p->lock, &p->created, &p->dead, err);
	pthread_mutex_unlock(&p->lock);
	if (rc == 0) {
		c_add(C_RANGE, 1);
		rc = net_etcd_range(w->etcd, S.nprefix, true, &kvs, &n, &rev, NULL, err);
	}
	pthread_mutex_lock(&p->lock);
	if (rc == 0) {
		memset(p->ent, 0, (size_t)S.n * sizeof(*p->ent));
		for (size_t i = 0; i < n; i++)
			entry_apply(p->ent, &kvs[i], false);
		p->revision = rev;
		for (size_t i = 0; i < p->pend.n; i++)
			if (p->pend.ev[i].kv.mod_revision > rev)
				entry_apply(p->ent, &p->pend.ev[i].kv, p->pend.ev[i].deleted);
		for (size_t i = 0; i < p->pend.n; i++)
			if (p->pend.ev[i].kv.mod_revision > p->revision)
				p->revision = p->pend.ev[i].kv.mod_revision;
		if (p->dead) {
			rc = -EIO;
			snprintf(err->text, sizeof(err->text), "the watch ended during the read");
		}
	}
	p->syncing = false;
	pend_free(&p->pend);
	p->live = rc == 0;
	pthread_mutex_unlock(&p->lock);
	if (rc == 0) {
		c_add(C_EN_READ, entries_in(kvs, n));
		c_add(C_FOLLOWS, 1);
		c_add(C_FALLBACKS, !nd->mine && !nd->proposing && !nd->announce);
	}
	net_etcd_kvs_free(kvs, n);
	return rc;
}

/* mlfs_cluster.c's follow() on n0's real entries mirror @m: started when
 * @need and not live, stopped when not @need; its requests and what its
 * read found counted. */
int mirror_follow(struct mlfs_mirror *m, bool need, struct ptc_error *err)
{
	if (!need) {
		if (m->watch)
			mlfs_mirror_stop(m);
		return 0;
	}
	if (mlfs_mirror_live(m))
		return 0;
	int64_t ranges = m->ranges;
	c_add(C_WATCH, 1);
	int rc = mlfs_mirror_sync(m, err);
	if (m->ranges == ranges)
		return rc;
	c_add(C_RANGE, 1);
	pthread_mutex_lock(&m->lock);
	int64_t found = entries_in(m->kvs, m->n);
	pthread_mutex_unlock(&m->lock);
	struct node *nd = node_at(0);
	c_add(C_EN_READ, found);
	c_add(C_FOLLOWS, 1);
	c_add(C_FALLBACKS, !nd->mine && !nd->proposing && !nd->announce);
	return rc;
}

/* mlfs_cluster.c's need_peers: it coordinates or builds an attempt; it
 * made the last commit (from its commit transaction on) and waits for every
 * participant's swap to announce it; or its retained layout waited 2 s
 * for the announcement. */
bool need_peers(const struct node *nd)
{
	return nd->mine || nd->proposing || nd->announce ||
	       (nd->swap_wait && wall_ms() - nd->swap_since_ms >= mlfs_release_wait_ms(S.n));
}

/* follow(&c->peers, need_peers(c)) for @nd. */
int follow_entries(struct worker *w, struct node *nd, struct ptc_error *err)
{
	bool need = need_peers(nd);
	if (nd->idx == 0 && S.n0_here)
		return mirror_follow(&S.peers, need, err);
	if (!need) {
		peers_stop(nd);
		return 0;
	}
	return peers_sync(w, nd, err);
}

/* The entries as @nd follows them into @ent (mlfs_jobkeys_mirrored's
 * nodes): true when it follows them (nodes_known). */
bool entries_of(struct node *nd, uint32_t *ent)
{
	if (nd->idx == 0 && S.n0_here) {
		struct net_etcd_kv *kvs;
		size_t n;
		int64_t rev;
		struct ptc_error err;
		if (mlfs_mirror_copy(&S.peers, &kvs, &n, &rev, &err))
			return false;
		memset(ent, 0, (size_t)S.n * sizeof(*ent));
		for (size_t i = 0; i < n; i++)
			entry_apply(ent, &kvs[i], false);
		free(kvs);
		return true;
	}
	struct peers *p = nd->pv;
	if (!p)
		return false;
	pthread_mutex_lock(&p->lock);
	bool live = p->live;
	if (live)
		memcpy(ent, p->ent, (size_t)S.n * sizeof(*ent));
	pthread_mutex_unlock(&p->lock);
	return live;
}
