/*
 * sim_proc.c - a process's slice of the job: its nodes, streams and
 * threads started and stopped, their registration and start-up read, the
 * start-up's watchdog; the first writer's keys; and the other processes
 * (this program again, --child): started, driven by lines, their counts
 * combined.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

/* ------------------------------------------------------------ processes */

struct child *children;
int nchildren;

/* A line to every child. */
void broadcast_send(const char *cmd)
{
	for (int i = 0; i < nchildren; i++)
		if (write(children[i].in, cmd, strlen(cmd)) != (ssize_t)strlen(cmd))
			die("child %d: %s", i + 1, strerror(errno));
}

/* Every child's reply (a counts line: combined with this process's into
 * @c, when not NULL). */
void broadcast_recv(int64_t *c)
{
	char line[4096];
	if (c) {
		counts_line(line, sizeof(line));
		char *p = line;
		for (int k = 0; k < NC; k++)
			c[k] = strtoll(p, &p, 10);
	}
	for (int i = 0; i < nchildren; i++) {
		if (!fgets(line, sizeof(line), children[i].out))
			die("child %d ended", i + 1);
		if (!c)
			continue;
		char *p = line;
		for (int k = 0; k < NC; k++) {
			int64_t v = strtoll(p, &p, 10);
			if (k < MAX_FROM)
				c[k] += v;
			else if (k < MIN_FROM)
				c[k] = v > c[k] ? v : c[k];
			else if (v && (!c[k] || v < c[k]))
				c[k] = v;
		}
	}
}

void broadcast(const char *cmd, int64_t *c)
{
	broadcast_send(cmd);
	broadcast_recv(c);
}

/* ---------------------------------------------------------- setup and run */

char *config_text(int64_t version, int nnodes)
{
	json_t *ids = json_array();
	for (int i = 0; i < nnodes; i++)
		json_array_append_new(ids, json_string(S.ids[i]));
	json_t *c = json_pack("{sIsisisisO}", "version", (json_int_t)version, "tp", 1, "pp", 1,
			      "dp", nnodes, "nodes", ids);
	char *s = json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(c);
	json_decref(ids);
	if (!s)
		die("out of memory");
	return s;
}

/* The first writer's schema and first config (mlfs_propose.c's
 * propose_schema and propose_first: a transaction each on the key being
 * absent). */
void put_first(struct net_etcd *e)
{
	char k[256];
	struct ptc_error err;
	const char *texts[] = {S.schema, S.config1}, *keys[] = {"schema", "config"};
	for (int i = 0; i < 2; i++) {
		bool ok = false;
		name(k, sizeof(k), "%s", keys[i]);
		struct net_etcd_cmp absent = {
		    .key = k, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL};
		struct net_etcd_op put = {
		    .kind = NET_ETCD_PUT, .key = k, .value = texts[i], .len = strlen(texts[i])};
		c_add(C_TXN, 1);
		if (net_etcd_txn(e, &absent, 1, &put, 1, NULL, 0, &ok, NULL, NULL, &err) || !ok)
			die("%s: %s", k,
			    ok ? err.text : "the job exists already (use a fresh --job)");
	}
}

static pthread_t timer_thread;
static struct worker *ws;
struct net_etcd *main_etcd;

/* This process's nodes, streams and threads. */
void start_slice(void)
{
	int m = S.hi - S.lo;
	S.nodes = xcalloc((size_t)m, sizeof(*S.nodes));
	S.groups = xcalloc((size_t)(S.ghi - S.glo), sizeof(*S.groups));
	S.rq = xcalloc((size_t)m, sizeof(int));
	S.kq = xcalloc((size_t)m, sizeof(int));
	for (int i = S.lo; i < S.hi; i++) {
		struct node *nd = node_at(i);
		nd->idx = i;
		snprintf(nd->id, sizeof(nd->id), "%s", S.ids[i]);
		nd->seed = (unsigned)i * 2654435761u;
		nd->reconf = MLFS_RECONF_IDLE;
		/* as if it had read the job before registering (start-up, DESIGN) */
		nd->have = 1;
		nd->need_register = true;
	}
	for (int gi = S.glo; gi < S.ghi; gi++) {
		struct group *g = &S.groups[gi - S.glo];
		g->idx = gi;
		g->first = gi * S.per;
		g->count = g->first + S.per <= S.n ? S.per : S.n - g->first;
		pthread_mutex_init(&g->lock, NULL);
		pthread_cond_init(&g->cond, NULL);
		pthread_mutex_init(&g->sync_lock, NULL);
		for (int i = g->first; i < g->first + g->count; i++)
			node_at(i)->g = g;
	}
	ws = xcalloc((size_t)(S.nworkers + S.nka), sizeof(*ws));
	if (pthread_create(&timer_thread, NULL, timer_main, NULL))
		die("cannot start threads");
	for (int i = 0; i < S.nworkers + S.nka; i++) {
		ws[i].etcd = client();
		ws[i].ka = i >= S.nworkers;
		if (!ws[i].ka) {
			ws[i].http = vote_client();
			ws[i].sn = xcalloc((size_t)S.n, sizeof(*ws[i].sn));
			ws[i].ent = xcalloc((size_t)S.n, sizeof(*ws[i].ent));
			ws[i].vote = xcalloc((size_t)S.n, sizeof(*ws[i].vote));
		}
		if (pthread_create(&ws[i].thread, NULL, ws[i].ka ? ka_main : round_main, &ws[i]))
			die("cannot start threads");
	}
}

/* Its nodes register (a grant and their entry each), @rate a second. */
void *register_main(void *arg)
{
	(void)arg;
	int m = S.hi - S.lo, rate = S.join_rate_here > 0 ? S.join_rate_here : m;
	int64_t t0 = now_ns();
	for (int i = 0; i < m && !atomic_load(&S.stop); i++) {
		int64_t due = t0 + (int64_t)i * 1000000000LL / rate;
		while (now_ns() < due)
			nap_ms(1);
		wake(&S.nodes[i]);
	}
	return NULL;
}

/* "sync": one read of the job, every stream's view from it and its watch
 * from now (start-up, DESIGN: nothing is put under /mlfs/<job>/ between
 * the read and the watches, so none is missed), then every node's first
 * round. */
void sync_slice(void)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev;
	struct ptc_error err;
	struct group tpl = {0};
	/* not a daemon's request: a patient client (etcd may be busy with the
	 * keep-alives of thousands of nodes) */
	struct net_etcd *e = client_with(60000, 120000);

	for (int tries = 0;; tries++) {
		c_add(C_RANGE, 1);
		if (net_etcd_range(e, S.prefix, true, &kvs, &n, &rev, NULL, &err) == 0)
			break;
		fprintf(stderr, "sim_control: the start-up's read: %s\n", err.text);
		if (tries >= 5)
			die("range: %s", err.text);
	}
	net_etcd_free(e);
	for (size_t i = 0; i < n; i++)
		apply(&tpl, &kvs[i], false);
	net_etcd_kvs_free(kvs, n);
	int64_t t0 = now_ns();
	int rate = S.join_rate_here > 0 ? S.join_rate_here : S.ghi - S.glo;
	for (int gi = 0; gi < S.ghi - S.glo; gi++) {
		struct group *g = &S.groups[gi];
		int64_t due = t0 + (int64_t)gi * S.per * 1000000000LL / rate;
		while (now_ns() < due) /* the nodes start --join-rate a second */
			nap_ms(1);
		pthread_mutex_lock(&g->lock);
		g->has_schema = tpl.has_schema;
		g->committed = tpl.committed;
		g->released = tpl.released;
		memcpy(g->config_id, tpl.config_id, sizeof(g->config_id));
		g->att = att_ref(tpl.att);
		g->revision = g->last_event = rev;
		g->live = true;
		pthread_mutex_unlock(&g->lock);
		c_add(C_WATCH, 1);
		if (net_etcd_watch_start(main_etcd, S.prefix, 0, on_watch, NULL, g, &g->watch,
					 &err)) {
			fprintf(stderr, "sim_control: stream %d: watch: %s\n", g->idx, err.text);
			pthread_mutex_lock(&g->lock);
			g->live = false; /* the node's next round syncs it */
			pthread_mutex_unlock(&g->lock);
		}
	}
	att_put(tpl.att);
	for (int i = S.lo; i < S.hi; i++)
		wake(node_at(i));
}

/* The events mirror @m applied (its watch's, every sync's). */
int64_t mirror_events(struct mlfs_mirror *m)
{
	pthread_mutex_lock(&m->lock);
	int64_t n = m->events;
	pthread_mutex_unlock(&m->lock);
	return n;
}

/* Start-up only (not measured): a watch that ended (etcd busy with
 * thousands of nodes starting) starts again from the revision its stream
 * reached; once start-up is over, one that ended then is left to its
 * nodes' next round (mlfs_mirror_sync: a range, then a watch), as a
 * daemon's. */
static void *start_watchdog(void *arg)
{
	struct net_etcd *e = arg;
	struct ptc_error err;
	bool last = false;
	while (!last) {
		nap_ms(500);
		last = !atomic_load(&S.in_setup) || atomic_load(&S.stop);
		for (int gi = 0; gi < S.ghi - S.glo; gi++) {
			struct group *g = &S.groups[gi];
			pthread_mutex_lock(&g->sync_lock);
			pthread_mutex_lock(&g->lock);
			bool ended = g->ended;
			int64_t from = g->last_event + 1;
			g->ended = false;
			if (ended && last) { /* too late: the daemon's way */
				g->live = false;
				for (int i = g->first; i < g->first + g->count; i++)
					wake(node_at(i));
			}
			pthread_mutex_unlock(&g->lock);
			if (ended && !last) {
				net_etcd_watch_stop(g->watch);
				g->watch = NULL;
				c_add(C_WATCH, 1);
				if (net_etcd_watch_start(e, S.prefix, from, on_watch, NULL, g,
							 &g->watch, &err)) {
					pthread_mutex_lock(&g->lock);
					g->ended = true;
					pthread_mutex_unlock(&g->lock);
				}
			}
			pthread_mutex_unlock(&g->sync_lock);
		}
	}
	net_etcd_free(e);
	return NULL;
}

static pthread_t watchdog_thread;
static bool watchdog_running;

void watchdog_start(void)
{
	atomic_store(&S.in_setup, true);
	watchdog_running = pthread_create(&watchdog_thread, NULL, start_watchdog, client()) == 0;
}

/* Start-up is over (before the idle window). */
void watchdog_end(void)
{
	atomic_store(&S.in_setup, false);
	if (watchdog_running)
		pthread_join(watchdog_thread, NULL);
	watchdog_running = false;
}

void stop_slice(void)
{
	atomic_store(&S.stop, 1);
	watchdog_end();
	pthread_mutex_lock(&S.lock);
	pthread_cond_broadcast(&S.round_cond);
	pthread_cond_broadcast(&S.ka_cond);
	pthread_mutex_unlock(&S.lock);
	pthread_mutex_lock(&S.tlock);
	pthread_cond_broadcast(&S.tcond);
	pthread_mutex_unlock(&S.tlock);
	pthread_join(timer_thread, NULL);
	for (int i = 0; i < S.nworkers + S.nka; i++) {
		pthread_join(ws[i].thread, NULL);
		net_etcd_free(ws[i].etcd);
		net_http_free(ws[i].http);
		free(ws[i].sn);
		free(ws[i].ent);
		free(ws[i].vote);
	}
	free(ws);
	votes_stop();  /* n0's peer server: its handlers wake n0 */
	if (S.n0_here) /* its watch's thread ends first: it wakes n0 */
		mlfs_mirror_release(&S.peers);
	for (int gi = 0; gi < S.ghi - S.glo; gi++) {
		struct group *g = &S.groups[gi];
		net_etcd_watch_stop(g->watch);
		att_put(g->att);
		json_decref(g->released_ids);
		pend_free(&g->pend);
		pthread_mutex_destroy(&g->lock);
		pthread_cond_destroy(&g->cond);
		pthread_mutex_destroy(&g->sync_lock);
	}
	for (int i = S.lo; i < S.hi; i++) {
		struct node *nd = node_at(i);
		peers_stop(nd);
		free(nd->mine);
		free(nd->published);
		free(nd->acked_entry);
		att_put(nd->prep_parts);
		att_put(nd->swap_wait);
		att_put(nd->seen.att);
	}
	free(S.groups);
	free(S.nodes);
	free(S.rq);
	free(S.kq);
	free(S.heap);
}

/* A child process: its slice of nodes, driven by lines on stdin
 * ("register", "sync", "window", "target V", "status"), a counts line
 * answering each; it ends at end of input. */
int child_main(void)
{
	char line[256], out[4096];
	pthread_t reg;
	bool registering = false;

	start_slice();
	watchdog_start();
	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "register", 8) == 0) {
			registering = pthread_create(&reg, NULL, register_main, NULL) == 0;
		} else if (strncmp(line, "sync", 4) == 0) {
			sync_slice();
		} else if (strncmp(line, "window", 6) == 0) {
			watchdog_end();
			counts_window(false);
		} else if (strncmp(line, "target ", 7) == 0) {
			counts_window(true);
			atomic_store(&S.target, atoi(line + 7));
		}
		counts_line(out, sizeof(out));
		fputs(out, stdout);
		fflush(stdout);
	}
	if (registering)
		pthread_join(reg, NULL);
	stop_slice();
	return 0;
}

/* Starts child @i for nodes [lo, hi) and streams [glo, ghi). */
void child_start(struct child *c, char **base, int nbase, int lo, int hi, int glo, int ghi)
{
	int pin[2], pout[2];
	char slice[64];
	posix_spawn_file_actions_t fa;
	char **argv = xcalloc((size_t)nbase + 4, sizeof(char *));

	snprintf(slice, sizeof(slice), "%d:%d:%d:%d", lo, hi, glo, ghi);
	memcpy(argv, base, (size_t)nbase * sizeof(char *));
	argv[nbase] = "--child";
	argv[nbase + 1] = slice;
	if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC))
		die("pipe: %s", strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
	posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
	extern char **environ;
	int rc = posix_spawn(&c->pid, "/proc/self/exe", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	free(argv);
	close(pin[0]);
	close(pout[1]);
	if (rc)
		die("cannot start a child: %s", strerror(rc));
	c->in = pin[1];
	c->out = fdopen(pout[0], "r");
}
