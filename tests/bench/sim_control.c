/*
 * sim_control.c - the control plane of a job of N nodes, simulated against
 * one real etcd (issue 17, "Scale"): no FUSE, no store, no data; per node
 * the real decision function (cluster/mlfs_decide.c), the real etcd client
 * and watch (net/net_etcd*.c), on the daemon's keys, wake-ups and schedule.
 *
 *   sim_control --etcd http://127.0.0.1:2379 --nodes 1000 [--watches G]
 *       [--idle-seconds 10] [--etcd-pid P] [--job NAME] [--workers R]
 *       [--ka-workers K] [--keepalive-ms MS] [--lease-ttl S] [--timeout S]
 *       [--no-round-delay] [--join-rate NODES_PER_S] [--streams-per-process S]
 *
 * Prints one JSON object on stdout (the figures; bench_sim.py reads it),
 * progress on stderr. Exit 0 when every node swapped to version 2 and let
 * its retained layout go, 1 when something did not happen (the JSON says
 * how far it went: "failed"), 2 on bad usage.
 *
 * DESIGN
 * The daemon modelled is cluster/ as of the change that moved the nodes'
 * entries out of the job's keys (after commit c121aff: entries and saved
 * marks under /mlfs-nodes/<job>/, the "released" announcement, the
 * attempt's "step", the mirror's watch before its read). Each simulated
 * node is what one daemon's control plane does, with the daemon function
 * it replicates named where it happens below:
 *   - its lease: granted (TTL 5 s) by mlfs_nodeentry_register and kept
 *     alive by its own keep-alive "thread" 1 s after the previous one
 *     answered (mlfs_nodeentry_keepalive_main), one POST
 *     /v3/lease/keepalive each; etcd saying it expired flags it, and the
 *     next round registers again (mlfs_decide's REGISTER); its entry is
 *     /mlfs-nodes/<job>/<id>, bound to the lease;
 *   - what it watches (mlfs_cluster.c's three mirrors): /mlfs/<job>/
 *     always, one watch per node (c->mirror: mlfs_mirror.c's order, a
 *     watch from now, its "created" awaited, one range, the events that
 *     came meanwhile applied when newer than the range; afterwards only
 *     events newer than the mirror's revision), every event and the
 *     watch's end waking the node (keys_changed); /mlfs-nodes/<job>/ only
 *     while need_peers() holds (c->peers: it coordinates an attempt; it
 *     made the last commit and waits for every participant's swap to
 *     announce it; its retained layout waited 2 s for the announcement),
 *     a put, delete or the watch's end waking it only while it coordinates
 *     or waits for swaps (peers_changed); /mlfs-votes/<job>/ only while it
 *     coordinates (c->votes), every vote waking it. Each is started when
 *     needed and stopped (mlfs_mirror_stop) at the first round that no
 *     longer needs it. n0's votes and entries are followed by the real
 *     mlfs_mirror (init/sync/copy/stop, the new changed(arg) hook); any
 *     other node's entries, in the 2 s fallback, by a copy of its order
 *     that keeps per entry only what the decision reads;
 *   - its rounds (mlfs_cluster.c's round_once, mlfs_attempt.c's
 *     mlfs_attempt_round): the mirrors synced or stopped as above (and, at
 *     its first round, its saved/<id> mark read: one get), a snapshot of
 *     its views and of its (simulated) store handed to the real
 *     mlfs_decide (nodes_known: it follows the entries; released: the
 *     "released" key), the actions carried out with the daemon's etcd
 *     requests, then its entry put when what it says changed
 *     (mlfs_nodeentry_publish: settled states only). A round runs when
 *     woken (as above; its store's state changing, the store's
 *     reconf_changed hook: a prepare starting or done, a commit, a
 *     discard; its lease expired) or when its nap ends (mlfs_cluster.c's
 *     nap_ms: until 2 s after its swap while the retained layout waits for
 *     the announcement, then 1 s; 1 s while an attempt is in etcd; 30 s
 *     otherwise);
 *   - rule 8: the coordinator of the commit, following the entries, sees
 *     every participant serve the new version, puts /mlfs/<job>/released
 *     = "2" (ANNOUNCE_RELEASED, mlfs_attempt.c's act_announce) and drops
 *     its retained layout; every other node drops its own on that event,
 *     reading no entry; a node still waiting 2 s after its swap follows
 *     the entries itself (and, seeing every swap before the announcement,
 *     announces too);
 *   - the coordinator (n0): mlfs_propose.c's propose_config (one read of
 *     the job as mlfs_jobkeys_read makes it: a range of the job's keys and
 *     one of the entries; the attempt built with every live node a
 *     participant and the agreed "step", created by one transaction), its
 *     commit transaction exactly as mlfs_attempt.c's finish() writes it.
 * The etcd requests of one reconfiguration, by the code above: each node
 * puts its vote (act_vote_ready) and its entry once (the new version, at
 * the round of its swap): 2N. The coordinator also reads the job and the
 * entries (2 ranges), creates the attempt (txn), follows the votes (watch,
 * range) and the entries (watch, range) from the attempt until it
 * announces, commits (txn) and announces (put): 2N + 9 (puts 2N + 1,
 * ranges 4, txns 2, watches 2). Each node that falls back after 2 s adds a watch and a
 * range of N entries, and a put when it announces. Watch events: 6 per
 * job watch (the attempt; the commit's config, config_id, attempt and
 * result/2; "released"), N votes and at most N deletions of them to the
 * coordinator's votes watch (or its range), and each entry put at most
 * once to its entries watch (or its second range). No passing states.
 *
 * How a simulated node differs from a daemon:
 *   - the daemon's CPU. A round's CPU in the daemon (mirror copy of the
 *     job's keys, of every entry and their parse while it follows them,
 *     the snapshot's linear searches of the participants and swap_wait
 *     lists, and the coordinator's of the votes: quadratic in N) is spent
 *     on its own machine. The simulator measures
 *     it once at start on a copy of that code ("daemon_round_ms") and
 *     waits it between a round's decision and its actions (the daemon
 *     decides from the keys as copied at the start of its round); it does
 *     not spend it (--no-round-delay: no wait). What it does spend, on
 *     this machine, is every watch's parsing with the real client: at
 *     10,000 nodes that is more CPU than the machine has (the runs say
 *     how much; bench_sim.py runs the simulator below etcd's priority);
 *   - the store: only the fields mlfs_decide reads. A prepare takes no
 *     time: it is done at the end of the round that started it (the
 *     store's hook then wakes the node, whose next round votes); job/ is
 *     empty (nothing staged, no peer asked for its manifest); a commit
 *     swaps at once;
 *   - the views: what mlfs_mirror keeps of the job's keys is kept as what
 *     the decision reads (the attempt parsed once per revision and
 *     shared); a node but n0 that follows the entries keeps per entry its
 *     version, up and lost (4 bytes; mlfs_mirror keeps about 230 bytes,
 *     23 GB were 10,000 nodes to follow 10,000 entries at once);
 *   - threads and connections: rounds run on R worker threads and
 *     keep-alives on K (--workers, --ka-workers; 1,000 and 2,000 at most
 *     by default: more threads thrash this 2-core machine), each with its
 *     own etcd client; a daemon has its control and keep-alive threads and
 *     one client. So etcd sees fewer connections here and the same
 *     requests, except that when K keep-alives are in flight the next
 *     waits in the simulator's queue, where a daemon's would be sent and
 *     wait in etcd ("keepalive_gap_max_s" says how long a node went
 *     between two). A process holds at most --streams-per-process watches
 *     (3 descriptors each, under this machine's 20,000 open files): above
 *     that the nodes are split across processes (this program again,
 *     --child), which meet only in etcd, as daemons do, and report their
 *     counts to the first;
 *   - start-up: every node registers (its entry already at version 1, as
 *     if it had read the job first), then each process reads the job once
 *     and starts its nodes' watches from now, --join-rate a second
 *     (nothing is put under /mlfs/<job>/ meanwhile); a watch that ends
 *     during start-up starts again from the revision its stream reached
 *     (start_watchdog). A daemon starts its watch and reads the job itself
 *     (N ranges of a few keys), and does so again when its watch ends.
 *     Start-up is not what is measured; from the idle window on, a watch
 *     that ends is the daemon's case (group_sync);
 *   - the proposal is made again, up to 3 times, when it fails naming
 *     etcd (where `mlfs reconfigure` fails and an operator would run it
 *     again; a creation that timed out but applied is run by the
 *     coordinator's control thread, as in the daemon).
 * --watches G < N shares watch streams: G streams, each the view of N / G
 * nodes. That is NOT what the daemon does (the output says
 * "one_watch_per_node": false); it shows what etcd's fan-out costs. So do
 * --keepalive-ms and --lease-ttl other than 1000 and 5 ("daemon_schedule":
 * false).
 *
 * Not simulated: the job's cluster.json key and joins, saved/<id> puts and
 * step writes, job/ staging, backups ("replicas", which makes need_peers()
 * hold all the time), /v1/health, peers' HTTP, status.json and mlfs
 * snapshot (which read the entries when the node does not follow them).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/cluster_i.h"
#include "cluster/decide_i.h"
#include "net/net.h"

#define LEASE_TTL  5		/* s, as mlfs_nodeentry.c's MLFS_LEASE_TTL (--lease-ttl) */
#define ATTEMPT_MS (300 * 1000) /* an attempt's deadline, as mlfs_propose.c */
#define E_UP	   0x80000000u	/* a view's entry: the node is up, */
#define E_LOST	   0x40000000u	/* says it is lost, */
#define E_VERSION  0x3fffffffu	/* at this version */

/* ---------------------------------------------------------------- time */

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Wall-clock ns: comparable across the processes of one run. */
static int64_t wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t wall_ms(void)
{
	return wall_ns() / 1000000;
}

static void nap_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "sim_control: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		die("out of memory");
	return p;
}

/* ------------------------------------------------------------- counters */

/* What a process counts; the first sums (or takes the max or min of) every
 * process's. The first seven are etcd requests by kind. */
enum {
	C_RANGE,
	C_PUT,
	C_TXN,
	C_GRANT,
	C_KEEPALIVE,
	C_REVOKE,
	C_WATCH,
	C_ROUNDS,
	C_EVENTS,    /* watch events received by the job's streams (/mlfs/<job>/) */
	C_MESSAGES,  /* watch messages received by them */
	C_BYTES,     /* keys and values received by them */
	C_STALE,     /* events at a revision the stream had applied an event of */
	C_DROPPED,   /* new events the mirror's rule skipped (not newer than its revision) */
	C_CREATED,   /* the job's watches etcd confirmed */
	C_EN_EVENTS, /* events of the nodes' entries' watches (but n0's mirror's) */
	C_EN_READ,   /* entries their ranges read (n0's mirror's too) */
	C_STARTED,   /* nodes that read their saved/<id> mark (their first round) */
	C_KA_N,
	C_KA_LAT,
	C_KA_ERR,
	C_EXPIRED, /* a keep-alive answered that the lease is gone (etcd expired it) */
	C_REGISTERED,
	C_SWAPPED,   /* nodes at the target version (their store) */
	C_PUBLISHED, /* ... whose entry says so */
	C_RELEASED,  /* ... and which let their retained layout go */
	C_VOTES,
	C_DISCARDS,
	C_ANNOUNCED, /* "released" puts */
	C_FOLLOWS,   /* a node started following the entries (a range and a watch) */
	C_FALLBACKS, /* ... a node that does not coordinate: its 2 s ran out */
	C_CPU_US,    /* the process's CPU */
	C_KA_LAT_MAX,
	C_GAP_MAX,
	C_LAST_EVENT,
	C_LAST_SWAP,
	C_LAST_PUBLISHED,
	C_LAST_RELEASE,
	C_LAST_VOTE,
	C_LAST_ANNOUNCE,
	C_LAST_KA_ERR,
	C_LAST_EXPIRED,
	C_FIRST_SWAP,
	C_FIRST_KA_ERR,
	C_FIRST_EXPIRED,
	NC
};
#define NREQ	 7
#define MAX_FROM C_KA_LAT_MAX /* maxima from here, */
#define MIN_FROM C_FIRST_SWAP /* minima (0: none) from here */
static const char *const req_names[NREQ] = {"range",	 "put",	   "txn",  "grant",
					    "keepalive", "revoke", "watch"};

static _Atomic int64_t counts[NC];

static void c_add(int k, int64_t v)
{
	atomic_fetch_add(&counts[k], v);
}

static void c_max(int k, int64_t v)
{
	int64_t m = atomic_load(&counts[k]);
	while (v > m && !atomic_compare_exchange_weak(&counts[k], &m, v))
		;
}

static void c_min(int k, int64_t v)
{
	int64_t m = atomic_load(&counts[k]);
	while ((m == 0 || v < m) && !atomic_compare_exchange_weak(&counts[k], &m, v))
		;
}

/* --------------------------------------------------------------- model */

/* An attempt as etcd holds it, parsed once per revision and shared by
 * every view that has it (refs under S.att_lock). */
struct att {
	int refs;
	int64_t mod;
	char *raw;
	size_t len;
	char *id, *coordinator, *config;
	int64_t from, to, deadline_ms;
	uint8_t *parts; /* participants: a bit per node of the job */
	struct att *next;
};

/* A watch's events kept while its mirror reads the keys (mlfs_mirror.c's
 * pend), applied after the read when newer than it. */
struct pend {
	struct net_etcd_event *ev;
	size_t n, cap;
};

/* The job's keys (/mlfs/<job>/) as one watch stream shows them (a daemon's
 * c->mirror, reduced to what its decisions read). */
struct group {
	int idx, first, count; /* its nodes: [first, first + count) */
	pthread_mutex_t lock;  /* the view; the watch's thread writes it */
	pthread_cond_t cond;   /* created or dead, for group_sync */
	pthread_mutex_t sync_lock;
	struct net_etcd_watch *watch;
	bool live;
	bool created; /* etcd confirmed its watch */
	bool ended;   /* its watch ended during start-up (start_watchdog restarts it) */
	bool dead;    /* its stream ended (while group_sync waits for "created") */
	bool syncing; /* group_sync reads the keys: events go to @pend */
	struct pend pend;
	int64_t revision;   /* mlfs_mirror's: events not newer are not applied */
	int64_t last_event; /* the revision of the last event applied (or the read's) */
	bool has_schema;
	int64_t committed, released;
	char config_id[24];
	struct att *att;
};

/* The nodes' entries (/mlfs-nodes/<job>/) as a node that follows them has
 * them (a daemon's c->peers, reduced to what its decisions read): the
 * nodes but n0, while need_peers() holds; n0 has the real mlfs_mirror
 * (S.peers). */
struct peers {
	pthread_mutex_t lock; /* the watch's thread writes it */
	pthread_cond_t cond;
	struct net_etcd_watch *watch;
	bool live, created, dead, syncing;
	struct pend pend;
	int64_t revision;
	struct node *nd;
	uint32_t *ent; /* per node of the job: E_UP | E_LOST | version (0: no entry) */
};

struct seen {
	char aid[24];
	int64_t attempt_mod;
	struct att *att; /* a reference */
	bool etcd_ok;
	bool nodes_known; /* it followed the entries: its round parsed them */
};

struct node {
	int idx;
	char id[16];
	struct group *g;
	_Atomic int64_t lease;
	atomic_bool lease_expired;
	atomic_bool coordinating; /* c->mine != NULL: peers_changed wakes it */
	atomic_bool swap_waiting; /* c->swap_wait != NULL: so does it then */
	/* Its store and control thread's state (struct mlfs_cluster's fields
	 * of the same names): touched by its rounds only, one at a time. */
	bool store_schema, lost, need_register, propose_pending, saved_read;
	int64_t have, target, prepare_rev, retained, swap_since_ms;
	int64_t announce; /* c->announce: the commit it made, to announce */
	struct peers *pv; /* c->peers while it follows the entries (not n0) */
	enum mlfs_reconf_state reconf;
	char prepare_id[24], voted_id[24], started_id[24];
	bool voted_ready;
	struct att *prep_parts, *swap_wait; /* c->prep_parts, c->swap_wait */
	char *mine;			    /* c->mine: the attempt it created */
	char *published;		    /* c->published */
	char entry_state[16];		    /* c->entry_state */
	bool attempt_seen;		    /* c->attempt != NULL */
	/* a round between its decision and its actions */
	struct mlfs_action acts[MLFS_DECIDE_MAX];
	int nacts;
	struct seen seen;
	bool acting;
	/* scheduling, under S.lock */
	bool wake, queued, running;
	_Atomic int64_t nap_at;
	int64_t ka_last;
	/* results */
	int64_t swapped_v, published_v, released_v;
	unsigned seed;
};

/* The daemon's round CPU at this N (ns), measured at start (daemon_cost). */
struct cost {
	int64_t base;  /* the job's keys copied and parsed, the snapshot's loop */
	int64_t peers; /* the entries copied and parsed, steps (while it follows them) */
	int64_t att;   /* the attempt copied and parsed */
	int64_t ids;   /* one linear search per node of an N-id list */
	int64_t votes; /* the coordinator's: votes copied, a linear search each */
};

static struct sim {
	const char *url;
	const char *job;
	int n;		  /* nodes of the job */
	int lo, hi;	  /* the nodes this process simulates */
	int ngroups, per; /* watch streams of the job, nodes per stream */
	int glo, ghi;	  /* this process's streams */
	int nworkers, nka, ka_ms, ttl, join_rate, join_rate_here;
	bool delay;
	struct cost cost;
	char prefix[128], vprefix[128], nprefix[128];
	char (*ids)[16];      /* every node's id */
	struct node *nodes;   /* [hi - lo] */
	struct group *groups; /* [ghi - glo] */
	/* the coordinator's (n0's process) */
	struct net_etcd *cetcd;		 /* its client (c->etcd): propose, the mirrors */
	struct mlfs_mirror votes, peers; /* c->votes, c->peers */
	bool votes_init;
	_Atomic int64_t votes_read; /* votes its ranges read (the others came by its watch) */
	/* wall ns: the attempt created; its commit transaction sent, answered */
	_Atomic int64_t created_wall, commit_sent_wall, commit_wall, aborted;
	int propose_tries; /* `mlfs reconfigure` runs (an operator retrying) */
	char abort_reason[300];
	atomic_int target;
	atomic_int stop;
	atomic_bool in_setup; /* start-up: a watch that ends is restarted (start_watchdog) */
	/* attempts */
	pthread_mutex_t att_lock;
	struct att *atts;
	/* queues, under lock */
	pthread_mutex_t lock;
	pthread_cond_t round_cond, ka_cond;
	int *rq, rq_head, rq_n;
	int *kq, kq_head, kq_n;
	/* timers */
	pthread_mutex_t tlock;
	pthread_cond_t tcond;
	struct tmr {
		int64_t t;
		int node, kind;
	} * heap;
	size_t nheap, capheap;
	char schema[512];
	char *config1, *config2;
} S;

enum { T_KA, T_NAP, T_ACT };

static struct node *node_at(int i)
{
	return i >= S.lo && i < S.hi ? &S.nodes[i - S.lo] : NULL;
}

/* The index of node id "n<i>" (@len bytes), or -1. */
static int node_index(const char *id, size_t len)
{
	if (len < 2 || id[0] != 'n')
		return -1;
	int v = 0;
	for (size_t i = 1; i < len; i++) {
		if (id[i] < '0' || id[i] > '9' || v > 100000000)
			return -1;
		v = v * 10 + (id[i] - '0');
	}
	return v < S.n ? v : -1;
}

static bool bit(const uint8_t *b, int i)
{
	return b && (b[i >> 3] >> (i & 7) & 1);
}

/* ------------------------------------------------------------- clients */

struct worker {
	pthread_t thread;
	struct net_etcd *etcd;
	bool ka;
	struct mlfs_snap_node *sn;	 /* a round's snapshot of every node */
	uint32_t *ent;			 /* a round's copy of the entries */
	const struct net_etcd_kv **vote; /* the coordinator's votes by node */
};

static struct net_etcd *client_with(int timeout_ms, int deadline_ms)
{
	struct net_http_opts o = {
	    .retries = 2, .timeout_ms = timeout_ms, .deadline_ms = deadline_ms};
	struct net_etcd *e;
	struct ptc_error err;
	if (net_etcd_new(S.url, &o, &e, &err))
		die("%s: %s", S.url, err.text);
	return e;
}

/* A client with mlfs_cluster_start's options: what every daemon's request
 * (and so every simulated node's) goes through. */
static struct net_etcd *client(void)
{
	return client_with(2000, 5000);
}

static void name(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void name(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	size_t n = (size_t)snprintf(buf, cap, "%s", S.prefix);
	va_start(ap, fmt);
	vsnprintf(buf + n, cap - n, fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------ attempts */

static void att_free(struct att *a)
{
	free(a->raw);
	free(a->id);
	free(a->coordinator);
	free(a->config);
	free(a->parts);
	free(a);
}

static struct att *att_ref(struct att *a)
{
	if (a) {
		pthread_mutex_lock(&S.att_lock);
		a->refs++;
		pthread_mutex_unlock(&S.att_lock);
	}
	return a;
}

static void att_put(struct att *a)
{
	if (!a)
		return;
	pthread_mutex_lock(&S.att_lock);
	bool last = --a->refs == 0;
	if (last)
		for (struct att **p = &S.atts; *p; p = &(*p)->next)
			if (*p == a) {
				*p = a->next;
				break;
			}
	pthread_mutex_unlock(&S.att_lock);
	if (last)
		att_free(a);
}

/* The attempt of etcd value @raw (@len bytes) put at revision @mod: the
 * shared copy, parsed on first sight (a new reference). */
static struct att *att_get(const char *raw, size_t len, int64_t mod)
{
	pthread_mutex_lock(&S.att_lock);
	for (struct att *a = S.atts; a; a = a->next)
		if (a->mod == mod && a->len == len) {
			a->refs++;
			pthread_mutex_unlock(&S.att_lock);
			return a;
		}
	pthread_mutex_unlock(&S.att_lock);
	struct att *a = xcalloc(1, sizeof(*a));
	json_t *j = json_loadb(raw, len, 0, NULL);
	a->mod = mod;
	a->len = len;
	a->raw = malloc(len + 1);
	if (!a->raw)
		die("out of memory");
	memcpy(a->raw, raw, len);
	a->raw[len] = '\0';
	a->id = strdup(json_string_value(json_object_get(j, "id")) ?: "");
	a->coordinator = strdup(json_string_value(json_object_get(j, "coordinator")) ?: "");
	const char *cfg = json_string_value(json_object_get(j, "config"));
	a->config = cfg ? strdup(cfg) : NULL;
	a->from = json_integer_value(json_object_get(j, "from"));
	a->to = json_integer_value(json_object_get(j, "to"));
	a->deadline_ms = json_integer_value(json_object_get(j, "deadline_ms"));
	a->parts = xcalloc((size_t)(S.n + 7) / 8, 1);
	size_t k;
	json_t *p;
	json_array_foreach(json_object_get(j, "participants"), k, p)
	{
		const char *s = json_string_value(p);
		int i = s ? node_index(s, strlen(s)) : -1;
		if (i >= 0)
			a->parts[i >> 3] |= (uint8_t)(1u << (i & 7));
	}
	json_decref(j);
	a->refs = 1;
	pthread_mutex_lock(&S.att_lock);
	for (struct att *b = S.atts; b; b = b->next)
		if (b->mod == mod && b->len == len) { /* another view parsed it meanwhile */
			b->refs++;
			pthread_mutex_unlock(&S.att_lock);
			att_free(a);
			return b;
		}
	a->next = S.atts;
	S.atts = a;
	pthread_mutex_unlock(&S.att_lock);
	return a;
}

/* ---------------------------------------------------------- scheduling */

static void timer_add(int64_t t, int node, int kind);

/* Lock held. */
static void enqueue_locked(struct node *nd)
{
	nd->queued = true;
	S.rq[(S.rq_head + S.rq_n++) % (S.hi - S.lo)] = nd->idx;
	pthread_cond_signal(&S.round_cond);
}

/* mlfs_cluster_wake: a round is due (at once unless one runs: then right
 * after it). Lock held. */
static void wake_locked(struct node *nd)
{
	nd->wake = true;
	if (!nd->queued && !nd->running)
		enqueue_locked(nd);
}

static void wake(struct node *nd)
{
	pthread_mutex_lock(&S.lock);
	wake_locked(nd);
	pthread_mutex_unlock(&S.lock);
}

static void timer_add(int64_t t, int node, int kind)
{
	pthread_mutex_lock(&S.tlock);
	if (S.nheap == S.capheap) {
		S.capheap = S.capheap ? S.capheap * 2 : 1024;
		S.heap = realloc(S.heap, S.capheap * sizeof(*S.heap));
		if (!S.heap)
			die("out of memory");
	}
	size_t i = S.nheap++;
	while (i > 0 && S.heap[(i - 1) / 2].t > t) {
		S.heap[i] = S.heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	S.heap[i] = (struct tmr){t, node, kind};
	if (i == 0)
		pthread_cond_signal(&S.tcond);
	pthread_mutex_unlock(&S.tlock);
}

/* The earliest timer. Lock held, heap not empty. */
static struct tmr timer_pop(void)
{
	struct tmr top = S.heap[0], last = S.heap[--S.nheap];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= S.nheap)
			break;
		if (c + 1 < S.nheap && S.heap[c + 1].t < S.heap[c].t)
			c++;
		if (S.heap[c].t >= last.t)
			break;
		S.heap[i] = S.heap[c];
		i = c;
	}
	if (S.nheap)
		S.heap[i] = last;
	return top;
}

static void *timer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&S.tlock);
	while (!atomic_load(&S.stop)) {
		if (S.nheap == 0) {
			pthread_cond_wait(&S.tcond, &S.tlock);
			continue;
		}
		int64_t t = S.heap[0].t, now = now_ns();
		if (t > now) {
			struct timespec ts = {t / 1000000000, t % 1000000000};
			pthread_cond_timedwait(&S.tcond, &S.tlock, &ts);
			continue;
		}
		struct tmr m = timer_pop();
		pthread_mutex_unlock(&S.tlock);
		struct node *nd = node_at(m.node);
		pthread_mutex_lock(&S.lock);
		if (m.kind == T_ACT) { /* its round's CPU spent: its actions now */
			enqueue_locked(nd);
		} else if (m.kind == T_KA) {
			S.kq[(S.kq_head + S.kq_n++) % (S.hi - S.lo)] = m.node;
			pthread_cond_signal(&S.ka_cond);
		} else if (atomic_load(&nd->nap_at) == m.t) { /* its nap ended */
			wake_locked(nd);
		}
		pthread_mutex_unlock(&S.lock);
		pthread_mutex_lock(&S.tlock);
	}
	pthread_mutex_unlock(&S.tlock);
	return NULL;
}

/* ---------------------------------------------------------- the views */

/* A config's "version" (the texts here start with it), or -1. */
static int64_t config_version(const char *v)
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

static void pend_free(struct pend *p)
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
static void apply(struct group *g, const struct net_etcd_kv *kv, bool deleted)
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
	} else if (strcmp(nm, "released") == 0) {
		g->released = deleted ? 0 : strtoll(kv->value, NULL, 10);
	}
}

static void view_reset(struct group *g)
{
	att_put(g->att);
	g->att = NULL;
	g->config_id[0] = '\0';
	g->has_schema = false;
	g->committed = g->released = 0;
}

/* The watch's function: mlfs_mirror.c's on_watch (while group_sync reads,
 * the events are kept for after; else those newer than the view's
 * revision applied), then mlfs_cluster.c's keys_changed for every node of
 * the stream: any event, or the watch's end, wakes it. */
static void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
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
static int group_sync(struct worker *w, struct group *g)
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
	rc = net_etcd_watch_start(w->etcd, S.prefix, 0, on_watch, g, &g->watch, &err);
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
static void peers_changed(void *arg)
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
static void peers_stop(struct node *nd)
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
	int rc = net_etcd_watch_start(w->etcd, S.nprefix, 0, on_peers, p, &p->watch, err);
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
		c_add(C_FALLBACKS, !nd->mine && !nd->announce);
	}
	net_etcd_kvs_free(kvs, n);
	return rc;
}

/* mlfs_cluster.c's follow() on one of n0's real mirrors (the votes or
 * the entries, @entries): started when @need and not live, stopped when
 * not @need; its requests and what its read found counted. */
static int mirror_follow(struct mlfs_mirror *m, bool need, bool entries, struct ptc_error *err)
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
	int64_t found = entries ? entries_in(m->kvs, m->n) : (int64_t)m->n;
	pthread_mutex_unlock(&m->lock);
	if (!entries) {
		atomic_fetch_add(&S.votes_read, found);
		return rc;
	}
	struct node *nd = node_at(0);
	c_add(C_EN_READ, found);
	c_add(C_FOLLOWS, 1);
	c_add(C_FALLBACKS, !nd->mine && !nd->announce);
	return rc;
}

/* mlfs_cluster.c's need_peers: it coordinates an attempt; it made the
 * last commit (from its commit transaction on) and waits for every
 * participant's swap to announce it; or its retained layout waited 2 s
 * for the announcement. */
static bool need_peers(const struct node *nd)
{
	return nd->mine || nd->announce || (nd->swap_wait && wall_ms() - nd->swap_since_ms >= 2000);
}

/* follow(&c->peers, need_peers(c)) for @nd. */
static int follow_entries(struct worker *w, struct node *nd, struct ptc_error *err)
{
	bool need = need_peers(nd);
	if (nd->idx == 0 && S.votes_init)
		return mirror_follow(&S.peers, need, true, err);
	if (!need) {
		peers_stop(nd);
		return 0;
	}
	return peers_sync(w, nd, err);
}

/* The entries as @nd follows them into @ent (mlfs_jobkeys_mirrored's
 * nodes): true when it follows them (nodes_known). */
static bool entries_of(struct node *nd, uint32_t *ent)
{
	if (nd->idx == 0 && S.votes_init) {
		struct net_etcd_kv *kvs;
		size_t n;
		int64_t rev;
		struct ptc_error err;
		if (mlfs_mirror_copy(&S.peers, &kvs, &n, &rev, &err))
			return false;
		memset(ent, 0, (size_t)S.n * sizeof(*ent));
		for (size_t i = 0; i < n; i++)
			entry_apply(ent, &kvs[i], false);
		net_etcd_kvs_free(kvs, n);
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

/* ------------------------------------------------------- node actions */

/* Layout 1 places rank i on node i; layout 2 rank i on node i of the
 * first half. */
static bool hosts_ranks(const struct node *nd)
{
	return nd->have == 1 || (nd->have == 2 && nd->idx < (S.n + 1) / 2);
}

/* Its entry as mlfs_nodeentry.c's node_entry and mlfs_nodeentry_publish
 * write it: addr, devices, pid, version, its ranks' saved steps, and its
 * last settled state (idle, failed, lost: never a passing one). */
static char *entry_text(const struct node *nd, char *state)
{
	char addr[32], rank[16];
	json_t *steps = json_object();
	snprintf(addr, sizeof(addr), "10.%d.%d.%d:7070", nd->idx >> 16 & 255, nd->idx >> 8 & 255,
		 nd->idx & 255);
	if (hosts_ranks(nd)) {
		snprintf(rank, sizeof(rank), "%d", nd->idx);
		json_object_set_new(steps, rank, json_integer(0));
	}
	bool settled = nd->reconf == MLFS_RECONF_IDLE || nd->reconf == MLFS_RECONF_FAILED;
	if (nd->lost)
		snprintf(state, 16, "lost");
	else if (settled || !state[0])
		snprintf(state, 16, "%s",
			 mlfs_reconf_state_name(settled ? nd->reconf : MLFS_RECONF_IDLE));
	json_t *o = json_pack("{sssisisIsOss}", "addr", addr, "devices", 1, "pid", 4242 + nd->idx,
			      "version", (json_int_t)nd->have, "steps", steps, "state", state);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	json_decref(steps);
	if (!s)
		die("out of memory");
	return s;
}

/* mlfs_nodeentry_publish: its entry (/mlfs-nodes/<job>/<id>) put when it
 * changed. */
static void publish(struct worker *w, struct node *nd)
{
	char k[256];
	struct ptc_error err;
	int64_t lease = atomic_load(&nd->lease);
	char *e = entry_text(nd, nd->entry_state);

	if (!lease || (nd->published && strcmp(nd->published, e) == 0)) {
		free(e);
		return;
	}
	snprintf(k, sizeof(k), "%s%s", S.nprefix, nd->id);
	c_add(C_PUT, 1);
	if (net_etcd_put(w->etcd, k, e, strlen(e), lease, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: put entry: %s\n", nd->id, err.text);
		free(e);
		return;
	}
	free(nd->published);
	nd->published = e;
	int target = atomic_load(&S.target);
	if (nd->have == target && nd->published_v != target) { /* the job sees its swap */
		nd->published_v = target;
		c_add(C_PUBLISHED, 1);
		c_max(C_LAST_PUBLISHED, wall_ns());
	}
}

/* mlfs_nodeentry_register: a new lease and its entry put under it. */
static int do_register(struct worker *w, struct node *nd)
{
	struct ptc_error err;
	int64_t lease;
	c_add(C_GRANT, 1);
	if (net_etcd_lease_grant(w->etcd, S.ttl, &lease, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: lease grant: %s\n", nd->id, err.text);
		return -1;
	}
	free(nd->published); /* the entry went with the old lease */
	nd->published = NULL;
	atomic_store(&nd->lease, lease);
	atomic_store(&nd->lease_expired, false);
	publish(w, nd);
	return 0;
}

/* mlfs_attempt.c's vote: "<attempt id> ready" or "... failed: <reason>"
 * under /mlfs-votes/<job>/<to>/<id>. */
static void vote(struct worker *w, struct node *nd, int64_t to, const char *aid, const char *what)
{
	char k[256], v[1024];
	struct ptc_error err;
	snprintf(k, sizeof(k), "%s%" PRId64 "/%s", S.vprefix, to, nd->id);
	snprintf(v, sizeof(v), "%s %s", aid, what);
	c_add(C_PUT, 1);
	if (net_etcd_put(w->etcd, k, v, strlen(v), 0, NULL, &err) == 0) {
		snprintf(nd->voted_id, sizeof(nd->voted_id), "%s", aid);
		nd->voted_ready = strcmp(what, "ready") == 0;
		c_add(C_VOTES, 1);
		c_max(C_LAST_VOTE, wall_ns());
	} else {
		fprintf(stderr, "sim_control: %s: vote: %s\n", nd->id, err.text);
	}
}

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
static void finish(struct worker *w, struct node *nd, const struct att *a, int64_t to,
		   const char *reason)
{
	char ka[256], kc[256], ki[256], kv[256], kr[256], res[600];
	struct ptc_error err;
	bool ok = false;

	if (!nd->mine || !a)
		return;
	name(ka, sizeof(ka), "attempt");
	name(kc, sizeof(kc), "config");
	name(ki, sizeof(ki), "config_id");
	snprintf(kv, sizeof(kv), "%s%" PRId64 "/", S.vprefix, to);
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
	    {.kind = NET_ETCD_DELETE, .key = kv, .prefix = true},
	    {.kind = NET_ETCD_PUT, .key = kr, .value = res, .len = strlen(res)}};
	const struct net_etcd_op *ops = reason ? commit + 2 : commit;
	size_t nops = reason ? 3 : 5;
	int64_t sent = wall_ns();
	c_add(C_TXN, 1);
	if (net_etcd_txn(w->etcd, &still, 1, ops, nops, NULL, 0, &ok, NULL, NULL, &err)) {
		fprintf(stderr, "sim_control: %s: finish: %s\n", nd->id, err.text);
		return;
	}
	if (!ok)
		return;
	free(nd->mine);
	nd->mine = NULL;
	atomic_store(&nd->coordinating, false);
	if (reason) {
		abort_run("the coordinator aborted: %s", reason);
	} else {
		nd->announce = to; /* it follows the swaps and says when all are done */
		atomic_store(&S.commit_sent_wall, sent);
		atomic_store(&S.commit_wall, wall_ns());
	}
}

/* mlfs_attempt.c's act_announce: "released" = @version, under the job's
 * keys (every node's watch); a failed put only said (the others follow
 * the entries themselves after 2 s). */
static void announce(struct worker *w, struct node *nd, int64_t version)
{
	char k[256], v[32];
	struct ptc_error err;
	name(k, sizeof(k), "released");
	snprintf(v, sizeof(v), "%" PRId64, version);
	c_add(C_PUT, 1);
	if (net_etcd_put(w->etcd, k, v, strlen(v), 0, NULL, &err) == 0) {
		c_add(C_ANNOUNCED, 1);
		c_max(C_LAST_ANNOUNCE, wall_ns());
	} else {
		fprintf(stderr, "sim_control: %s: announce: %s\n", nd->id, err.text);
	}
	if (nd->announce <= version)
		nd->announce = 0;
}

/* The store starts preparing attempt @a (mlfs_attempt_prepare, then the
 * store's prepare: state "preparing", its hook wakes the node). It takes
 * no time: done at the end of this round (round_act). */
static void prepare_start(struct node *nd, struct att *a, int64_t rev)
{
	nd->reconf = MLFS_RECONF_PREPARING;
	nd->target = a->to;
	nd->prepare_rev = rev;
	snprintf(nd->prepare_id, sizeof(nd->prepare_id), "%s", a->id);
	att_put(nd->prep_parts);
	nd->prep_parts = att_ref(a);
}

/* The prepare done (the build worker's set_state(PREPARED)): its hook
 * wakes the node. */
static bool prepare_done(struct node *nd)
{
	if (nd->reconf != MLFS_RECONF_PREPARING)
		return false;
	nd->reconf = MLFS_RECONF_PREPARED;
	return true;
}

/*
 * mlfs_propose.c's propose_config on coordinator @nd for config 2: the
 * job's keys read (read_agreed: mlfs_jobkeys_read's two ranges, the job's
 * keys and the nodes' entries, again every 100 ms up to 20 times until
 * every live node published the committed version and its rank's step),
 * the attempt built (propose_build, move_nodes: every live node at the
 * committed version takes part; job/ empty; no node down; "step" the one
 * every live rank saved), created by one transaction that requires no
 * attempt and "config" unmoved, bound to its lease, deleting the votes an
 * earlier attempt to 2 left (propose_create); then its prepare starts at
 * once (propose_attempt). On the daemon an I/O worker runs it. 0: created;
 * 1: `mlfs reconfigure` would fail, naming etcd (an operator runs it
 * again); -1: refused.
 */
static int propose_once(struct node *nd)
{
	struct net_etcd_kv *kvs = NULL, *ekvs = NULL;
	size_t n = 0, en = 0, plen = strlen(S.prefix), nplen = strlen(S.nprefix);
	struct ptc_error err;
	char ka[256], kc[256], kv[256], aid[24];
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
	name(ka, sizeof(ka), "attempt");
	name(kc, sizeof(kc), "config");
	snprintf(kv, sizeof(kv), "%s2/", S.vprefix);
	struct net_etcd_cmp cmps[] = {
	    {.key = ka, .target = NET_ETCD_VERSION, .result = NET_ETCD_EQUAL},
	    {.key = kc, .target = NET_ETCD_MOD, .result = NET_ETCD_EQUAL, .num = config_mod}};
	struct net_etcd_op put[] = {{.kind = NET_ETCD_PUT,
				     .key = ka,
				     .value = att,
				     .len = strlen(att),
				     .lease = atomic_load(&nd->lease)},
				    {.kind = NET_ETCD_DELETE, .key = kv, .prefix = true}};
	free(nd->mine);
	nd->mine = att;
	atomic_store(&nd->coordinating, true);
	snprintf(nd->started_id, sizeof(nd->started_id), "%s", aid);
	c_add(C_TXN, 1);
	int rc = net_etcd_txn(S.cetcd, cmps, 2, put, 2, NULL, 0, &ok, &rev, NULL, &err);
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
static void propose(struct node *nd)
{
	int rc = 1;
	for (int i = 0; i < 3 && rc == 1 && !atomic_load(&S.stop); i++) {
		S.propose_tries++;
		if ((rc = propose_once(nd)) == 1)
			nap_ms(1000);
	}
	if (rc == 1)
		abort_run("propose: etcd failed 3 times (see above)");
}

/* mlfs_attempt.c's act(): one action's etcd side, and the store's. Sets
 * *@woken when the store's state changed (its reconf_changed hook). */
static void act(struct worker *w, struct node *nd, const struct mlfs_action *a, bool *woken)
{
	const struct seen *v = &nd->seen;
	switch (a->kind) {
	case MLFS_ACT_REGISTER:
		if (do_register(w, nd) == 0)
			fprintf(stderr,
				"sim_control: %s: its lease had expired: registered again\n",
				nd->id);
		break;
	case MLFS_ACT_INSTALL_SCHEMA:
		nd->store_schema = true;
		break;
	case MLFS_ACT_INSTALL_CONFIG:
		nd->have = a->version;
		break;
	case MLFS_ACT_MARK_LOST: /* act_mark_lost */
		if (hosts_ranks(nd))
			nd->lost = true;
		break;
	case MLFS_ACT_CLEAR_LOST:
		nd->lost = false;
		break;
	case MLFS_ACT_PREPARE: /* act_prepare: once per attempt id */
		if (strcmp(nd->started_id, v->aid) != 0 && v->att) {
			snprintf(nd->started_id, sizeof(nd->started_id), "%s", v->aid);
			prepare_start(nd, v->att, v->attempt_mod);
			*woken = true;
		}
		break;
	case MLFS_ACT_VOTE_READY: /* act_vote_ready: job/ is empty, nothing staged */
		if (strcmp(nd->voted_id, v->aid) != 0)
			vote(w, nd, a->version, v->aid, "ready");
		break;
	case MLFS_ACT_VOTE_FAILED:
		if (strcmp(nd->voted_id, v->aid) != 0) {
			char r[300];
			snprintf(r, sizeof(r), "failed: %s", a->reason[0] ? a->reason : "prepare");
			vote(w, nd, a->version, v->aid, r);
		}
		break;
	case MLFS_ACT_COMMIT: /* act_commit: the planned-from layout retained */
		if (nd->reconf == MLFS_RECONF_PREPARED && nd->target == a->version) {
			nd->retained = nd->have;
			nd->have = a->version;
			nd->reconf = MLFS_RECONF_IDLE;
			att_put(nd->swap_wait);
			nd->swap_wait = nd->prep_parts;
			nd->prep_parts = NULL;
			nd->swap_since_ms = wall_ms();
			atomic_store(&nd->swap_waiting, true);
			*woken = true;
			if (nd->have == atomic_load(&S.target) && nd->swapped_v != nd->have) {
				nd->swapped_v = nd->have;
				int64_t t = wall_ns();
				c_add(C_SWAPPED, 1);
				c_max(C_LAST_SWAP, t);
				c_min(C_FIRST_SWAP, t);
			}
		}
		break;
	case MLFS_ACT_DISCARD: /* act_discard */
		nd->reconf = MLFS_RECONF_FAILED;
		att_put(nd->prep_parts);
		nd->prep_parts = NULL;
		*woken = true;
		if (atomic_fetch_add(&counts[C_DISCARDS], 1) == 0)
			fprintf(stderr, "sim_control: %s: discard: %s\n", nd->id, a->reason);
		break;
	case MLFS_ACT_FINISH_COMMIT:
		finish(w, nd, v->att, a->version, NULL);
		break;
	case MLFS_ACT_FINISH_ABORT:
		finish(w, nd, v->att, a->version, a->reason);
		break;
	case MLFS_ACT_RELEASE_RETAINED: /* act_release: nothing put */
		if (nd->retained == a->version) {
			nd->retained = 0;
			att_put(nd->swap_wait);
			nd->swap_wait = NULL;
			atomic_store(&nd->swap_waiting, false);
			nd->announce = 0;
		}
		break;
	case MLFS_ACT_ANNOUNCE_RELEASED:
		announce(w, nd, a->version);
		break;
	default: /* none other comes in this scenario (no node lost, no restore) */
		fprintf(stderr, "sim_control: %s: %s: not simulated\n", nd->id,
			mlfs_act_name(a->kind));
		break;
	}
}

/* The daemon's CPU for a round of @nd's, as measured (daemon_cost). */
static int64_t round_cost(const struct node *nd)
{
	if (!S.delay)
		return 0;
	return S.cost.base + (nd->seen.nodes_known ? S.cost.peers : 0) +
	       (nd->seen.att ? S.cost.att + S.cost.ids : 0) + (nd->swap_wait ? S.cost.ids : 0) +
	       (nd->mine ? S.cost.votes : 0);
}

/* mlfs_nodeentry_read_saved: this node's saved/<id> mark, read once (its
 * first round): 0, or etcd's error with @err. None is ever put here. */
static int read_saved(struct worker *w, struct node *nd, struct ptc_error *err)
{
	char k[256];
	struct net_etcd_kv kv;
	if (nd->saved_read)
		return 0;
	snprintf(k, sizeof(k), "%ssaved/%s", S.nprefix, nd->id);
	c_add(C_RANGE, 1);
	int rc = net_etcd_get(w->etcd, k, &kv, NULL, err);
	if (rc && rc != -ENOENT)
		return rc;
	if (rc == 0) {
		free(kv.key);
		free(kv.value);
	}
	nd->saved_read = true;
	c_add(C_STARTED, 1);
	return 0;
}

/*
 * A round's first half (mlfs_cluster.c's round_once up to mlfs_decide):
 * the job's mirror synced (a watch and a range when it is not live), the
 * saved/<id> mark read once, the entries followed while need_peers() says
 * so, the votes while this node coordinates (each stopped when no longer
 * needed), the snapshot (mlfs_attempt.c's snapshot) and the decision. The
 * actions wait for the daemon's CPU of this round (round_act).
 */
static void round_decide(struct worker *w, struct node *nd)
{
	struct group *g = nd->g;
	struct net_etcd_kv *vk = NULL;
	size_t nvk = 0;
	struct ptc_error err;
	struct mlfs_snap_attempt sa = {0};

	nd->nacts = 0;
	nd->seen = (struct seen){.aid = ""};
	if (nd->propose_pending) { /* config.json written on this node */
		nd->propose_pending = false;
		propose(nd);
	}
	bool coordinating = nd->mine != NULL;
	if (group_sync(w, g))
		return; /* rule 1: without etcd nothing is decided */
	if (read_saved(w, nd, &err)) {
		fprintf(stderr, "sim_control: %s: saved mark: %s\n", nd->id, err.text);
		return;
	}
	if (follow_entries(w, nd, &err)) {
		fprintf(stderr, "sim_control: %s: entries: %s\n", nd->id, err.text);
		return;
	}
	if (nd->idx == 0 && S.votes_init && mirror_follow(&S.votes, coordinating, false, &err)) {
		fprintf(stderr, "sim_control: %s: votes: %s\n", nd->id, err.text);
		return;
	}
	if (coordinating) {
		int64_t rev;
		if (mlfs_mirror_copy(&S.votes, &vk, &nvk, &rev, &err)) {
			fprintf(stderr, "sim_control: %s: votes: %s\n", nd->id, err.text);
			return;
		}
		/* vote_of's linear search, indexed here (its CPU is in the wait) */
		memset(w->vote, 0, (size_t)S.n * sizeof(*w->vote));
		size_t vl = strlen(S.vprefix);
		for (size_t i = 0; i < nvk; i++) {
			char *end;
			long long to = strtoll(vk[i].key + vl, &end, 10);
			int k = *end == '/' ? node_index(end + 1, strlen(end + 1)) : -1;
			if (k >= 0 && to == 2)
				w->vote[k] = &vk[i];
		}
	}
	c_add(C_ROUNDS, 1);
	char commit_id[24];
	bool known = entries_of(nd, w->ent);
	nd->seen.nodes_known = known;
	pthread_mutex_lock(&g->lock);
	struct att *a = att_ref(g->att);
	nd->seen.etcd_ok = g->live;
	nd->seen.attempt_mod = a ? a->mod : 0;
	struct mlfs_snap s = {
	    .etcd_ok = g->live,
	    .revision = g->revision,
	    .has_schema = g->has_schema,
	    .committed = g->committed > 0 ? g->committed : 0,
	    .commit_id = commit_id,
	    .saved_step = -1,
	    .nodes_known = known,
	    .released = g->released,
	};
	snprintf(commit_id, sizeof(commit_id), "%s", g->config_id);
	for (int i = 0; i < S.n; i++) {
		uint32_t e = known ? w->ent[i] : 0; /* mlfs_jobkeys: no entry when not read */
		w->sn[i] = (struct mlfs_snap_node){
		    .id = S.ids[i],
		    .up = e & E_UP,
		    .version = e & E_VERSION,
		    .lost = e & E_LOST,
		    .participant = a && bit(a->parts, i),
		    .swap_waited = nd->swap_wait && bit(nd->swap_wait->parts, i),
		};
	}
	pthread_mutex_unlock(&g->lock);
	if (a) {
		snprintf(nd->seen.aid, sizeof(nd->seen.aid), "%s", a->id);
		sa = (struct mlfs_snap_attempt){.id = a->id,
						.from = a->from,
						.to = a->to,
						.coordinator = a->coordinator,
						.deadline_ms = a->deadline_ms};
		s.attempt = &sa;
		/* every participant's vote for the coordinator (vote_on), this
		 * node's own as it put it for the others (own_vote) */
		size_t n = strlen(a->id);
		for (int i = 0; i < S.n; i++) {
			struct mlfs_snap_node *sn = &w->sn[i];
			const struct net_etcd_kv *v = vk ? w->vote[i] : NULL;
			if (!sn->participant)
				continue;
			if (vk && v && strncmp(v->value, a->id, n) == 0 && v->value[n] == ' ') {
				if (strncmp(v->value + n + 1, "ready", 5) == 0) {
					sn->vote = MLFS_VOTE_READY;
				} else {
					sn->vote = MLFS_VOTE_FAILED;
					sn->reason = v->value + n + 1;
					if (strncmp(sn->reason, "failed: ", 8) == 0)
						sn->reason += 8;
				}
			} else if (!vk && i == nd->idx && strcmp(nd->voted_id, a->id) == 0) {
				sn->vote = nd->voted_ready ? MLFS_VOTE_READY : MLFS_VOTE_FAILED;
			}
		}
	}
	s.lease_expired = atomic_load(&nd->lease_expired);
	s.nodes = w->sn;
	s.nnodes = S.n;
	s.me = nd->idx;
	s.now_ms = wall_ms();
	s.store_schema = nd->store_schema;
	s.have = nd->have;
	s.hosts_ranks = hosts_ranks(nd);
	s.lost = nd->lost;
	s.reconf = nd->reconf;
	s.target = nd->target;
	s.prepare_id = nd->prepare_id;
	s.prepare_rev = nd->prepare_rev;
	s.retained = nd->retained;
	s.coordinating = nd->mine && a && strcmp(nd->mine, a->raw) == 0;
	nd->nacts = mlfs_decide(&s, nd->acts); /* reasons are copied into acts */
	nd->seen.att = a;
	nd->attempt_seen = a != NULL; /* c->attempt, for nap_ms */
	net_etcd_kvs_free(vk, nvk);
}

/* A round's second half: its actions, its entry published (round_once's
 * last step), and the nap (mlfs_cluster.c's nap_ms). Returns the nap in
 * ms; *@woken when the store's hook woke it meanwhile. */
static int round_act(struct worker *w, struct node *nd, bool *woken)
{
	bool etcd_ok = nd->seen.etcd_ok;
	for (int i = 0; i < nd->nacts; i++)
		act(w, nd, &nd->acts[i], woken);
	att_put(nd->seen.att);
	nd->seen.att = NULL;
	nd->nacts = 0;
	if (etcd_ok)
		publish(w, nd);
	/* round_once's last step: a release this round may end the need for
	 * the entries */
	if (!need_peers(nd)) {
		if (nd->idx == 0 && S.votes_init)
			mirror_follow(&S.peers, false, true, &(struct ptc_error){0});
		else
			peers_stop(nd);
	}
	if (prepare_done(nd)) /* the build worker's set_state(PREPARED) */
		*woken = true;
	int target = atomic_load(&S.target);
	if (nd->have == target && nd->swapped_v == target && nd->retained == 0 &&
	    nd->released_v != target) {
		nd->released_v = target;
		c_add(C_RELEASED, 1);
		c_max(C_LAST_RELEASE, wall_ns());
	}
	/* nap_ms: a retained layout waits for the announcement until 2 s
	 * after its swap (then it follows the entries itself: need_peers),
	 * then every second */
	int64_t swap = nd->swap_wait ? wall_ms() - nd->swap_since_ms : -1;
	if (!etcd_ok)
		return 200;
	if (swap >= 0 && swap < 2000)
		return (int)(2000 - swap) + 10;
	return nd->attempt_seen || swap >= 0 ? 1000 : 30000;
}

static void *round_main(void *arg)
{
	struct worker *w = arg;
	pthread_mutex_lock(&S.lock);
	while (!atomic_load(&S.stop)) {
		if (S.rq_n == 0) {
			pthread_cond_wait(&S.round_cond, &S.lock);
			continue;
		}
		struct node *nd = node_at(S.rq[S.rq_head]);
		S.rq_head = (S.rq_head + 1) % (S.hi - S.lo);
		S.rq_n--;
		nd->queued = false;
		bool acting = nd->acting;
		if (!acting) { /* a new round: what woke it is in its snapshot */
			nd->running = true;
			nd->wake = false;
		}
		pthread_mutex_unlock(&S.lock);
		if (nd->need_register) { /* start-up: register, then wait for "sync" */
			nd->need_register = false;
			if (do_register(w, nd) == 0) {
				c_add(C_REGISTERED, 1);
				/* the first keep-alive 1 to 2 s after: daemons start at
				 * different times */
				nd->ka_last = now_ns();
				timer_add(nd->ka_last + S.ka_ms * 1000000LL +
					      (int64_t)(rand_r(&nd->seed) % (unsigned)S.ka_ms) *
						  1000000,
					  nd->idx, T_KA);
			} else { /* again in 200 ms */
				nd->need_register = true;
				int64_t t = now_ns() + 200000000LL;
				atomic_store(&nd->nap_at, t);
				timer_add(t, nd->idx, T_NAP);
			}
			pthread_mutex_lock(&S.lock);
			nd->running = false;
			continue;
		}
		if (!acting) {
			round_decide(w, nd);
			int64_t d = round_cost(nd);
			pthread_mutex_lock(&S.lock);
			nd->acting = true;
			if (d > 0) {
				timer_add(now_ns() + d, nd->idx, T_ACT);
				continue;
			}
			pthread_mutex_unlock(&S.lock);
		}
		bool woken = false;
		int ms = round_act(w, nd, &woken);
		int64_t t = now_ns() + (int64_t)ms * 1000000;
		atomic_store(&nd->nap_at, t);
		timer_add(t, nd->idx, T_NAP);
		pthread_mutex_lock(&S.lock);
		nd->acting = false;
		nd->running = false;
		if (woken || nd->wake)
			wake_locked(nd);
	}
	pthread_mutex_unlock(&S.lock);
	return NULL;
}

/* mlfs_nodeentry_keepalive_main: one keep-alive 1 s after the last
 * answered; an expired lease flagged and the node woken. */
static void *ka_main(void *arg)
{
	struct worker *w = arg;
	struct ptc_error err;
	int64_t ttl;

	pthread_mutex_lock(&S.lock);
	while (!atomic_load(&S.stop)) {
		if (S.kq_n == 0) {
			pthread_cond_wait(&S.ka_cond, &S.lock);
			continue;
		}
		struct node *nd = node_at(S.kq[S.kq_head]);
		S.kq_head = (S.kq_head + 1) % (S.hi - S.lo);
		S.kq_n--;
		pthread_mutex_unlock(&S.lock);
		int64_t lease = atomic_load(&nd->lease);
		if (lease) {
			c_add(C_KEEPALIVE, 1);
			int64_t t0 = now_ns();
			int rc = net_etcd_lease_keepalive(w->etcd, lease, &ttl, NULL, &err);
			int64_t lat = now_ns() - t0;
			c_add(C_KA_LAT, lat);
			c_add(C_KA_N, 1);
			c_max(C_KA_LAT_MAX, lat);
			if (rc == -ENOENT && atomic_load(&nd->lease) == lease) {
				atomic_store(&nd->lease, 0);
				atomic_store(&nd->lease_expired, true);
				c_add(C_EXPIRED, 1);
				c_max(C_LAST_EXPIRED, wall_ns());
				c_min(C_FIRST_EXPIRED, wall_ns());
				wake(nd);
			} else if (rc) { /* ignored, as the daemon does */
				if (atomic_fetch_add(&counts[C_KA_ERR], 1) == 0)
					fprintf(stderr, "sim_control: %s: keep-alive: %s\n", nd->id,
						err.text);
				c_max(C_LAST_KA_ERR, wall_ns());
				c_min(C_FIRST_KA_ERR, wall_ns());
			}
		}
		int64_t t = now_ns();
		c_max(C_GAP_MAX, t - nd->ka_last);
		nd->ka_last = t;
		timer_add(t + S.ka_ms * 1000000LL, nd->idx, T_KA);
		pthread_mutex_lock(&S.lock);
	}
	pthread_mutex_unlock(&S.lock);
	return NULL;
}

/* ------------------------------------------------ the daemon's round CPU */

static double cpu_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* mlfs_mirror.c's kv_copy of @n keys. */
static struct net_etcd_kv *kvs_copy(const struct net_etcd_kv *kv, size_t n)
{
	struct net_etcd_kv *c = xcalloc(n, sizeof(*c));
	for (size_t i = 0; i < n; i++) {
		c[i] = kv[i];
		c[i].key = strdup(kv[i].key);
		c[i].value = malloc(kv[i].len + 1);
		memcpy(c[i].value, kv[i].value, kv[i].len + 1);
	}
	return c;
}

/*
 * The CPU one round of the daemon's own code costs at this N, on a copy of
 * that code over keys shaped as the simulation's, the cheapest of three
 * tries of each part:
 *   base:  mlfs_mirror_copy of the job's keys, mlfs_jobkeys.c's parse (the
 *          config parsed), and the snapshot's loop over the nodes (no
 *          entries: this node does not follow them);
 *   peers: while it follows the entries (need_peers): mlfs_mirror_copy of
 *          them, parse_nodes (every entry from its cache of entries parsed
 *          per revision, entry_parsed), mlfs_nodeentry_sync_steps, and the
 *          snapshot's reading of each entry's fields;
 *   att:   the attempt copied and parsed (while one is in etcd);
 *   ids:   the snapshot's mlfs_cluster_ids_has for every node over an N-id
 *          list: paid once for the attempt's participants, once for
 *          swap_wait after a commit;
 *   votes: the coordinator's: mlfs_mirror_copy of the votes and vote_of's
 *          linear search for every participant.
 */
static struct cost daemon_cost(void)
{
	size_t n = (size_t)S.n, k = 0, nplen = strlen(S.nprefix);
	struct net_etcd_kv *kv = xcalloc(2, sizeof(*kv)), *ek = xcalloc(n, sizeof(*ek));
	struct net_etcd_kv *vk = xcalloc(n, sizeof(*vk));
	char key[256], val[128];
	struct node tmp = {0};
	json_t *parts = json_array();
	struct cost best = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};

	for (size_t i = 0; i < n; i++)
		json_array_append_new(parts, json_string(S.ids[i]));
	json_t *a = json_pack("{sssIsIsssssOsososIsososI}", "id", "0123456789abcdef", "from",
			      (json_int_t)1, "to", (json_int_t)2, "config", S.config2,
			      "coordinator", "n0", "participants", parts, "down", json_array(),
			      "backups", json_object(), "deadline_ms", (json_int_t)wall_ms(), "job",
			      json_array(), "job_missing", json_array(), "step", (json_int_t)0);
	const char *texts[] = {S.config1, S.schema}, *names[] = {"config", "schema"};
	for (int i = 0; i < 2; i++, k++) {
		name(key, sizeof(key), "%s", names[i]);
		kv[k].key = strdup(key);
		kv[k].value = strdup(texts[i]);
		kv[k].len = strlen(texts[i]);
	}
	for (size_t i = 0; i < n; i++) {
		char st[16] = "";
		tmp.idx = (int)i;
		tmp.have = 1;
		snprintf(key, sizeof(key), "%s%s", S.nprefix, S.ids[i]);
		ek[i].key = strdup(key);
		ek[i].value = entry_text(&tmp, st);
		ek[i].len = strlen(ek[i].value);
	}
	struct net_etcd_kv att = {.key = strdup("attempt"),
				  .value = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS)};
	att.len = strlen(att.value);
	json_decref(a);
	for (size_t i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "%s2/%s", S.vprefix, S.ids[i]);
		snprintf(val, sizeof(val), "0123456789abcdef ready");
		vk[i].key = strdup(key);
		vk[i].value = strdup(val);
		vk[i].len = strlen(val);
	}
	size_t plen = strlen(S.prefix);
	int64_t found = 0;
	json_t *parsed = json_object(); /* c->parsed: {id: [mod_revision, entry]} */
	for (size_t i = 0; i < n; i++)
		json_object_set_new(parsed, ek[i].key + nplen,
				    json_pack("[Io]", (json_int_t)ek[i].mod_revision,
					      json_loadb(ek[i].value, ek[i].len, 0, NULL)));
	for (int rep = 0; rep < 3; rep++) {
		double t0 = cpu_ns();
		struct net_etcd_kv *c = kvs_copy(kv, k);
		json_t *none = json_object();
		int64_t committed = 0;
		for (size_t i = 0; i < k; i++) {
			if (strcmp(c[i].key + plen, "config") == 0) {
				json_t *j = json_loadb(c[i].value, c[i].len, 0, NULL);
				committed = json_integer_value(json_object_get(j, "version"));
				json_decref(j);
			}
		}
		for (size_t i = 0; i < n; i++) { /* snapshot: no entry known */
			const json_t *en = json_object_get(none, S.ids[i]);
			found -= json_integer_value(json_object_get(en, "version"));
		}
		double t1 = cpu_ns();
		struct net_etcd_kv *ce = kvs_copy(ek, n);
		json_t *nodes = json_object();
		for (size_t i = 0; i < n; i++) { /* parse_nodes, entry_parsed: a hit */
			const char *id = ce[i].key + nplen;
			if (strchr(id, '/'))
				continue;
			json_t *hit = json_object_get(parsed, id), *j = NULL;
			if (hit && json_integer_value(json_array_get(hit, 0)) == ce[i].mod_revision)
				j = json_incref(json_array_get(hit, 1));
			json_object_set_new(nodes, id, j ?: json_object());
		}
		const char *id;
		json_t *e;
		json_object_foreach(nodes, id, e) /* mlfs_nodeentry_sync_steps */
		{
			const char *rk;
			json_t *step;
			if (json_integer_value(json_object_get(e, "version")) != committed)
				continue;
			json_object_foreach(json_object_get(e, "steps"), rk, step) found +=
			    json_is_integer(step);
		}
		for (size_t i = 0; i < n; i++) { /* snapshot: each node's entry */
			const json_t *en = json_object_get(nodes, S.ids[i]);
			found += json_string_value(json_object_get(en, "state")) != NULL;
			found += json_integer_value(json_object_get(en, "version"));
		}
		double t2 = cpu_ns();
		struct net_etcd_kv *ca = kvs_copy(&att, 1);
		json_t *aj = json_loadb(ca->value, ca->len, 0, NULL);
		double t3 = cpu_ns();
		const json_t *ps = json_object_get(aj, "participants");
		for (size_t i = 0; i < n; i++)
			found += mlfs_cluster_ids_has(ps, S.ids[i]);
		double t4 = cpu_ns();
		struct net_etcd_kv *cv = kvs_copy(vk, n);
		for (size_t i = 0; i < n; i++) { /* vote_of */
			char want[256];
			snprintf(want, sizeof(want), "%s%d/%s", S.vprefix, 2, S.ids[i]);
			for (size_t q = 0; q < n; q++)
				if (strcmp(cv[q].key, want) == 0) {
					found += strncmp(cv[q].value, "0123456789abcdef ", 17) == 0;
					break;
				}
		}
		double t5 = cpu_ns();
		json_decref(none);
		json_decref(nodes);
		json_decref(aj);
		net_etcd_kvs_free(c, k);
		net_etcd_kvs_free(ce, n);
		net_etcd_kvs_free(ca, 1);
		net_etcd_kvs_free(cv, n);
		int64_t p[5] = {(int64_t)(t1 - t0), (int64_t)(t2 - t1), (int64_t)(t3 - t2),
				(int64_t)(t4 - t3), (int64_t)(t5 - t4)};
		best.base = p[0] < best.base ? p[0] : best.base;
		best.peers = p[1] < best.peers ? p[1] : best.peers;
		best.att = p[2] < best.att ? p[2] : best.att;
		best.ids = p[3] < best.ids ? p[3] : best.ids;
		best.votes = p[4] < best.votes ? p[4] : best.votes;
	}
	if (found != (int64_t)(3 * 5 * n)) /* what each part looked for, every time */
		fprintf(stderr, "sim_control: round cost: %" PRId64 " found of %zu\n", found,
			3 * 5 * n);
	json_decref(parsed);
	net_etcd_kvs_free(kv, k);
	net_etcd_kvs_free(ek, n);
	net_etcd_kvs_free(vk, n);
	free(att.key);
	free(att.value);
	json_decref(parts);
	return best;
}

/* --------------------------------------------------------- measurement */

static int etcd_pid;
static struct net_http *metrics_http;

/* The CPU seconds of process @pid (utime + stime), or -1. */
static double proc_cpu_s(int pid)
{
	char path[64], buf[2048];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	unsigned long long ut = 0, st = 0;
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int64_t etcd_rss_kb(void)
{
	char path[64], line[256];
	long long kb = -1;
	if (!etcd_pid)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/status", etcd_pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lld", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* etcd's own counts from its /metrics: gRPC requests handled and started
 * (what the JSON gateway's requests become) and watch events sent. */
static void etcd_metrics(double *handled, double *started, double *events)
{
	char url[300];
	uint8_t *data;
	size_t len;
	struct ptc_error err;
	*handled = *started = *events = -1;
	snprintf(url, sizeof(url), "%s/metrics", S.url);
	if (net_http_get(metrics_http, url, 64 << 20, &data, &len, NULL, &err))
		return;
	*handled = *started = *events = 0;
	for (char *l = (char *)data; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		char *sp = strchr(l, '}');
		if (strncmp(l, "grpc_server_handled_total{", 26) == 0 && sp)
			*handled += strtod(sp + 1, NULL);
		else if (strncmp(l, "grpc_server_started_total{", 26) == 0 && sp)
			*started += strtod(sp + 1, NULL);
		else if (strncmp(l, "etcd_debugging_mvcc_events_total ", 33) == 0)
			*events = strtod(l + 33, NULL);
	}
	free(data);
}

static double self_cpu_s(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
	       (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

/* This process's counts as one line of numbers. */
static void counts_line(char *buf, size_t cap)
{
	size_t o = 0;
	atomic_store(&counts[C_CPU_US], (int64_t)(self_cpu_s() * 1e6));
	for (int k = 0; k < NC && o < cap; k++)
		o += (size_t)snprintf(buf + o, cap - o, "%" PRId64 "%s", atomic_load(&counts[k]),
				      k + 1 < NC ? " " : "\n");
}

/* Resets the counts of a window's maxima (and, with @target, of its swaps). */
static void counts_window(bool target)
{
	atomic_store(&counts[C_KA_LAT_MAX], 0);
	atomic_store(&counts[C_GAP_MAX], 0);
	atomic_store(&counts[C_LAST_KA_ERR], 0);
	atomic_store(&counts[C_LAST_EXPIRED], 0);
	atomic_store(&counts[C_FIRST_KA_ERR], 0);
	atomic_store(&counts[C_FIRST_EXPIRED], 0);
	if (!target)
		return;
	for (int k = C_SWAPPED; k <= C_FALLBACKS; k++)
		atomic_store(&counts[k], 0);
	for (int k = C_LAST_SWAP; k < NC; k++)
		if (k != C_LAST_KA_ERR && k != C_LAST_EXPIRED && k != C_FIRST_KA_ERR &&
		    k != C_FIRST_EXPIRED)
			atomic_store(&counts[k], 0);
}

/* ------------------------------------------------------------ processes */

struct child {
	pid_t pid;
	int in;
	FILE *out;
};

static struct child *children;
static int nchildren;

/* A line to every child. */
static void broadcast_send(const char *cmd)
{
	for (int i = 0; i < nchildren; i++)
		if (write(children[i].in, cmd, strlen(cmd)) != (ssize_t)strlen(cmd))
			die("child %d: %s", i + 1, strerror(errno));
}

/* Every child's reply (a counts line: combined with this process's into
 * @c, when not NULL). */
static void broadcast_recv(int64_t *c)
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

static void broadcast(const char *cmd, int64_t *c)
{
	broadcast_send(cmd);
	broadcast_recv(c);
}

/* ---------------------------------------------------------- setup and run */

static char *config_text(int64_t version, int nnodes)
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
static void put_first(struct net_etcd *e)
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
static struct net_etcd *main_etcd;

/* This process's nodes, streams and threads. */
static void start_slice(void)
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
			ws[i].sn = xcalloc((size_t)S.n, sizeof(*ws[i].sn));
			ws[i].ent = xcalloc((size_t)S.n, sizeof(*ws[i].ent));
			ws[i].vote = xcalloc((size_t)S.n, sizeof(*ws[i].vote));
		}
		if (pthread_create(&ws[i].thread, NULL, ws[i].ka ? ka_main : round_main, &ws[i]))
			die("cannot start threads");
	}
}

/* Its nodes register (a grant and their entry each), @rate a second. */
static void *register_main(void *arg)
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
static void sync_slice(void)
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
		if (net_etcd_watch_start(main_etcd, S.prefix, 0, on_watch, g, &g->watch, &err)) {
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

/* mlfs_cluster.c's votes_changed: the votes mirror (live only while n0
 * coordinates) wakes it. */
static void votes_changed(void *arg)
{
	(void)arg;
	if (!atomic_load(&S.stop))
		wake(node_at(0));
}

/* peers_changed for n0's real entries mirror (S.peers). */
static void n0_peers_changed(void *arg)
{
	(void)arg;
	peers_changed(node_at(0));
}

/* The events mirror @m applied (its watch's, every sync's). */
static int64_t mirror_events(struct mlfs_mirror *m)
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
				if (net_etcd_watch_start(e, S.prefix, from, on_watch, g, &g->watch,
							 &err)) {
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

static void watchdog_start(void)
{
	atomic_store(&S.in_setup, true);
	watchdog_running = pthread_create(&watchdog_thread, NULL, start_watchdog, client()) == 0;
}

/* Start-up is over (before the idle window). */
static void watchdog_end(void)
{
	atomic_store(&S.in_setup, false);
	if (watchdog_running)
		pthread_join(watchdog_thread, NULL);
	watchdog_running = false;
}

static void stop_slice(void)
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
		free(ws[i].sn);
		free(ws[i].ent);
		free(ws[i].vote);
	}
	free(ws);
	if (S.votes_init) { /* their watches' threads end first: they wake n0 */
		mlfs_mirror_release(&S.votes);
		mlfs_mirror_release(&S.peers);
	}
	for (int gi = 0; gi < S.ghi - S.glo; gi++) {
		struct group *g = &S.groups[gi];
		net_etcd_watch_stop(g->watch);
		att_put(g->att);
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
static int child_main(void)
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
static void child_start(struct child *c, char **base, int nbase, int lo, int hi, int glo, int ghi)
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

/* A window's figures: the processes' counts, etcd's CPU and metrics. */
struct snapshot {
	int64_t c[NC];
	int64_t t;
	double etcd_cpu, etcd_handled, etcd_started, etcd_events, children_cpu;
	int64_t etcd_rss_kb;
};

static void take(struct snapshot *s)
{
	s->t = now_ns();
	broadcast("status\n", s->c);
	s->etcd_cpu = etcd_pid ? proc_cpu_s(etcd_pid) : -1;
	s->etcd_rss_kb = etcd_rss_kb();
	etcd_metrics(&s->etcd_handled, &s->etcd_started, &s->etcd_events);
}

/* The window from @a to @b as a JSON object. */
static json_t *diff(const struct snapshot *a, const struct snapshot *b)
{
	json_t *o = json_object(), *r = json_object();
	double s = (double)(b->t - a->t) / 1e9;
	int64_t total = 0;
	for (int k = 0; k < NREQ; k++) {
		json_object_set_new(r, req_names[k], json_integer(b->c[k] - a->c[k]));
		total += b->c[k] - a->c[k];
	}
	int64_t kan = b->c[C_KA_N] - a->c[C_KA_N];
	json_object_set_new(o, "seconds", json_real(s));
	json_object_set_new(o, "requests", json_integer(total));
	json_object_set_new(o, "requests_by_kind", r);
	json_object_set_new(o, "requests_per_s", json_real((double)total / s));
	json_object_set_new(o, "rounds", json_integer(b->c[C_ROUNDS] - a->c[C_ROUNDS]));
	if (kan > 0)
		json_object_set_new(
		    o, "keepalive_latency_mean_s",
		    json_real((double)(b->c[C_KA_LAT] - a->c[C_KA_LAT]) / 1e9 / (double)kan));
	json_object_set_new(o, "keepalive_latency_max_s",
			    json_real((double)b->c[C_KA_LAT_MAX] / 1e9));
	json_object_set_new(o, "keepalive_gap_max_s", json_real((double)b->c[C_GAP_MAX] / 1e9));
	json_object_set_new(o, "keepalive_errors", json_integer(b->c[C_KA_ERR] - a->c[C_KA_ERR]));
	/* etcd expired a lease: the node's next keep-alive found it gone (no
	 * node watches the entries all the time, so none sees the delete) */
	json_object_set_new(o, "leases_expired", json_integer(b->c[C_EXPIRED] - a->c[C_EXPIRED]));
	json_object_set_new(o, "watch_events", json_integer(b->c[C_EVENTS] - a->c[C_EVENTS]));
	json_object_set_new(o, "watch_messages", json_integer(b->c[C_MESSAGES] - a->c[C_MESSAGES]));
	json_object_set_new(o, "watch_bytes", json_integer(b->c[C_BYTES] - a->c[C_BYTES]));
	json_object_set_new(o, "watch_events_stale", json_integer(b->c[C_STALE] - a->c[C_STALE]));
	json_object_set_new(o, "watch_events_dropped",
			    json_integer(b->c[C_DROPPED] - a->c[C_DROPPED]));
	bool cpu = a->etcd_cpu >= 0 && b->etcd_cpu >= 0; /* else /proc was not read */
	json_object_set_new(o, "etcd_cpu_s",
			    cpu ? json_real(b->etcd_cpu - a->etcd_cpu) : json_null());
	json_object_set_new(o, "etcd_cores",
			    cpu ? json_real((b->etcd_cpu - a->etcd_cpu) / s) : json_null());
	double sim = (double)(b->c[C_CPU_US] - a->c[C_CPU_US]) / 1e6;
	json_object_set_new(o, "sim_cpu_s", json_real(sim));
	json_object_set_new(o, "sim_cores", json_real(sim / s));
	json_object_set_new(o, "etcd_rss_mib",
			    b->etcd_rss_kb >= 0 ? json_real((double)b->etcd_rss_kb / 1024)
						: json_null());
	/* etcd's /metrics (null: it did not answer at one end) */
	bool m = a->etcd_handled >= 0 && b->etcd_handled >= 0;
	json_object_set_new(o, "etcd_grpc_handled",
			    m ? json_integer((int64_t)(b->etcd_handled - a->etcd_handled))
			      : json_null());
	json_object_set_new(o, "etcd_grpc_started",
			    m ? json_integer((int64_t)(b->etcd_started - a->etcd_started))
			      : json_null());
	json_object_set_new(o, "etcd_events_sent",
			    m ? json_integer((int64_t)(b->etcd_events - a->etcd_events))
			      : json_null());
	return o;
}

/* Waits (polling the processes) until @done says so or @timeout_s
 * passes; progress every 5 s. True when done. */
static bool wait_for(bool (*done)(const int64_t *c), double timeout_s, const char *what)
{
	int64_t t0 = now_ns(), next = t0 + 5000000000LL, c[NC];
	for (;;) {
		broadcast("status\n", c);
		if (done(c))
			return true;
		int64_t t = now_ns();
		if ((double)(t - t0) / 1e9 > timeout_s || atomic_load(&S.aborted))
			return false;
		if (t > next) {
			fprintf(stderr,
				"sim_control: %s (%.0f s): %" PRId64 " registered, %" PRId64
				" watches, %" PRId64 " votes, %" PRId64 " swapped, %" PRId64
				" released of %d; %" PRId64 " watch events, %" PRId64
				" leases expired\n",
				what, (double)(t - t0) / 1e9, c[C_REGISTERED], c[C_CREATED],
				c[C_VOTES], c[C_SWAPPED], c[C_RELEASED], S.n, c[C_EVENTS],
				c[C_EXPIRED]);
			next = t + 5000000000LL;
		}
		nap_ms(100);
	}
}

static bool all_registered(const int64_t *c)
{
	return c[C_REGISTERED] >= S.n;
}

static bool all_watching(const int64_t *c)
{
	return c[C_CREATED] >= S.ngroups;
}

static bool all_started(const int64_t *c)
{
	return c[C_STARTED] >= S.n;
}

static bool all_released(const int64_t *c)
{
	return c[C_RELEASED] >= S.n || c[C_DISCARDS] > 0;
}

static int64_t quiet_since; /* for quiet() */
static bool quiet(const int64_t *c)
{
	int64_t t = wall_ns();
	return t - c[C_LAST_EVENT] > 2000000000LL && t - quiet_since > 2000000000LL;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: sim_control --etcd URL --nodes N [--watches G] [--idle-seconds S]\n"
		"       [--etcd-pid P] [--job NAME] [--workers R] [--ka-workers K]\n"
		"       [--keepalive-ms MS] [--lease-ttl S] [--timeout S] [--no-round-delay]\n"
		"       [--join-rate NODES_PER_S] [--streams-per-process S]\n");
	exit(2);
}

static double secs(int64_t a, int64_t b)
{
	return (double)(b - a) / 1e9;
}

int main(int argc, char **argv)
{
	double idle_s = 10, timeout_s = 600;
	int per_process = 2500;
	const char *child = NULL;
	int64_t cost_ns[5] = {-1, -1, -1, -1, -1};

	S.job = "sim";
	S.delay = true;
	S.join_rate = 1000;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--no-round-delay") == 0) {
			S.delay = false;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (strcmp(a, "--etcd") == 0)
			S.url = v;
		else if (strcmp(a, "--nodes") == 0)
			S.n = atoi(v);
		else if (strcmp(a, "--watches") == 0)
			S.ngroups = atoi(v);
		else if (strcmp(a, "--idle-seconds") == 0)
			idle_s = atof(v);
		else if (strcmp(a, "--etcd-pid") == 0)
			etcd_pid = atoi(v);
		else if (strcmp(a, "--job") == 0)
			S.job = v;
		else if (strcmp(a, "--workers") == 0)
			S.nworkers = atoi(v);
		else if (strcmp(a, "--ka-workers") == 0)
			S.nka = atoi(v);
		else if (strcmp(a, "--timeout") == 0)
			timeout_s = atof(v);
		else if (strcmp(a, "--keepalive-ms") == 0)
			S.ka_ms = atoi(v);
		else if (strcmp(a, "--lease-ttl") == 0)
			S.ttl = atoi(v);
		else if (strcmp(a, "--join-rate") == 0)
			S.join_rate = atoi(v);
		else if (strcmp(a, "--streams-per-process") == 0)
			per_process = atoi(v);
		else if (strcmp(a, "--child") == 0)
			child = v;
		else if (strcmp(a, "--cost") == 0) /* a child's: the first's measure */
			sscanf(v, "%" SCNd64 ":%" SCNd64 ":%" SCNd64 ":%" SCNd64 ":%" SCNd64,
			       &cost_ns[0], &cost_ns[1], &cost_ns[2], &cost_ns[3], &cost_ns[4]);
		else
			usage();
	}
	if (!S.url || S.n < 2 || S.n > 1000000 || per_process < 1)
		usage();
	snprintf(S.prefix, sizeof(S.prefix), MLFS_KEYS_JOB, S.job);
	snprintf(S.vprefix, sizeof(S.vprefix), MLFS_KEYS_VOTES, S.job);
	snprintf(S.nprefix, sizeof(S.nprefix), MLFS_KEYS_NODES, S.job);
	if (S.ka_ms <= 0)
		S.ka_ms = 1000; /* mlfs_nodeentry_keepalive_main */
	if (S.ttl <= 0)
		S.ttl = LEASE_TTL;
	if (S.ngroups <= 0 || S.ngroups > S.n)
		S.ngroups = S.n; /* the daemon's: one watch per node */
	S.per = (S.n + S.ngroups - 1) / S.ngroups;
	S.ngroups = (S.n + S.per - 1) / S.per;
	/* Workers (a connection each): one of each kind per node up to 1,000
	 * nodes (2,000 for keep-alives); above, 1,000 for rounds and 2,000 for
	 * keep-alives in all (--workers, --ka-workers: per process). Processes:
	 * at most --streams-per-process watches each, and 16,000 descriptors (3
	 * per watch, 1 per worker). */
	int rtotal = S.n < 1000 ? S.n : 1000;
	int ktotal = S.n < 2000 ? S.n : 2000;
	int nproc = (S.ngroups + per_process - 1) / per_process;
	int nfd = (3 * S.ngroups + rtotal + ktotal + 15999) / 16000;
	nproc = nfd > nproc ? nfd : nproc;
	int gpp = (S.ngroups + nproc - 1) / nproc; /* streams per process */
	S.glo = 0;
	S.ghi = gpp < S.ngroups ? gpp : S.ngroups;
	if (child && sscanf(child, "%d:%d:%d:%d", &S.lo, &S.hi, &S.glo, &S.ghi) != 4)
		usage();
	if (!child) {
		S.lo = 0;
		S.hi = S.ghi * S.per < S.n ? S.ghi * S.per : S.n;
	}
	int m = S.hi - S.lo;
	int user_workers = S.nworkers, user_ka = S.nka; /* per process (0: the default) */
	/* --join-rate is the job's: each process its share */
	S.join_rate_here = S.join_rate > 0 ? (int)((int64_t)S.join_rate * m / S.n) + 1 : 0;
	if (S.nworkers <= 0) /* this process's share */
		S.nworkers = (int)(((int64_t)m * rtotal + S.n - 1) / S.n);
	if (S.nka <= 0)
		S.nka = (int)(((int64_t)m * ktotal + S.n - 1) / S.n);

	/* Many threads (a watch each): small stacks. */
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 << 10);
	pthread_setattr_default_np(&attr);
	pthread_attr_destroy(&attr);
	pthread_mutex_init(&S.lock, NULL);
	pthread_mutex_init(&S.att_lock, NULL);
	pthread_cond_init(&S.round_cond, NULL);
	pthread_cond_init(&S.ka_cond, NULL);
	pthread_mutex_init(&S.tlock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&S.tcond, &ca);
	pthread_condattr_destroy(&ca);
	S.ids = xcalloc((size_t)S.n, sizeof(*S.ids));
	for (int i = 0; i < S.n; i++)
		snprintf(S.ids[i], sizeof(S.ids[i]), "n%d", i);
	snprintf(S.schema, sizeof(S.schema),
		 "{\"model\":\"tiny\",\"num_layers\":2,\"states\":{\"model\":{}},\"tensors\":["
		 "{\"name\":\"layers/{L}/w\",\"dtype\":\"float32\",\"shape\":[64,64],"
		 "\"split\":{\"dim\":0}}]}");
	S.config1 = config_text(1, S.n);
	S.config2 = config_text(2, (S.n + 1) / 2);
	main_etcd = client();
	int rc = 1;
	if (child) {
		S.cost = (struct cost){cost_ns[0], cost_ns[1], cost_ns[2], cost_ns[3], cost_ns[4]};
		rc = child_main();
		goto end;
	}

	struct ptc_error err;
	if (net_http_new(NULL, &metrics_http, &err))
		die("%s", err.text);
	S.cost = daemon_cost();
	/* the coordinator's client, votes and entries mirrors */
	S.cetcd = client();
	if (mlfs_mirror_init(&S.votes, S.cetcd, S.vprefix, votes_changed, NULL) ||
	    mlfs_mirror_init(&S.peers, S.cetcd, S.nprefix, n0_peers_changed, NULL))
		die("mirrors");
	S.votes_init = true;
	double coord_ms =
	    (double)(S.cost.base + S.cost.peers + S.cost.att + S.cost.ids + S.cost.votes) / 1e6;
	fprintf(stderr,
		"sim_control: %d nodes, %d watch streams (%d nodes each) in %d processes, "
		"%d round and %d keep-alive workers here; a daemon's round: %.2f ms, with an "
		"attempt %.2f ms, coordinating %.2f ms; etcd %s\n",
		S.n, S.ngroups, S.per, nproc, S.nworkers, S.nka, (double)S.cost.base / 1e6,
		(double)(S.cost.base + S.cost.att + S.cost.ids) / 1e6, coord_ms, S.url);

	json_t *out = json_object();
	json_object_set_new(out, "nodes", json_integer(S.n));
	json_object_set_new(out, "watch_streams", json_integer(S.ngroups));
	json_object_set_new(out, "nodes_per_stream", json_integer(S.per));
	json_object_set_new(out, "one_watch_per_node", json_boolean(S.per == 1));
	json_object_set_new(out, "processes", json_integer(nproc));
	json_object_set_new(out, "round_workers",
			    json_integer(user_workers ? user_workers * nproc : rtotal));
	json_object_set_new(out, "keepalive_workers",
			    json_integer(user_ka ? user_ka * nproc : ktotal));
	json_object_set_new(out, "keepalive_ms", json_integer(S.ka_ms));
	json_object_set_new(out, "lease_ttl_s", json_integer(S.ttl));
	/* the daemon's: a watch per node, a keep-alive every second on a 5 s TTL */
	json_object_set_new(out, "daemon_schedule",
			    json_boolean(S.per == 1 && S.ka_ms == 1000 && S.ttl == LEASE_TTL));
	json_object_set_new(out, "round_delay", json_boolean(S.delay));
	json_object_set_new(out, "join_rate", json_integer(S.join_rate));
	json_object_set_new(out, "daemon_round_ms",
			    json_pack("{sfsfsfsfsf}", "idle", (double)S.cost.base / 1e6, "attempt",
				      (double)(S.cost.base + S.cost.att + S.cost.ids) / 1e6,
				      "after_commit", (double)(S.cost.base + S.cost.ids) / 1e6,
				      "after_commit_following_entries",
				      (double)(S.cost.base + S.cost.peers + S.cost.ids) / 1e6,
				      "coordinator", coord_ms));

	/* ---- setup: the job's schema and first config, then the other
	 * processes, every node registered, every stream's watch */
	struct snapshot s0, s1, s2, s3, s4;
	put_first(main_etcd);
	atomic_store(&S.target, 1);
	nchildren = nproc - 1;
	children = xcalloc((size_t)nproc, sizeof(*children));
	char costs[128], nodes_s[16], watches_s[16], ka_s[16], jr_s[16], spp_s[16], rw_s[16],
	    kw_s[16], ttl_s[16];
	snprintf(costs, sizeof(costs), "%" PRId64 ":%" PRId64 ":%" PRId64 ":%" PRId64 ":%" PRId64,
		 S.cost.base, S.cost.peers, S.cost.att, S.cost.ids, S.cost.votes);
	snprintf(nodes_s, sizeof(nodes_s), "%d", S.n);
	snprintf(watches_s, sizeof(watches_s), "%d", S.ngroups);
	snprintf(ka_s, sizeof(ka_s), "%d", S.ka_ms);
	snprintf(jr_s, sizeof(jr_s), "%d", S.join_rate * 1);
	snprintf(spp_s, sizeof(spp_s), "%d", per_process);
	snprintf(rw_s, sizeof(rw_s), "%d", user_workers);
	snprintf(kw_s, sizeof(kw_s), "%d", user_ka);
	snprintf(ttl_s, sizeof(ttl_s), "%d", S.ttl);
	char *base[] = {"sim_control", "--etcd",
			(char *)S.url, "--nodes",
			nodes_s,       "--watches",
			watches_s,     "--job",
			(char *)S.job, "--keepalive-ms",
			ka_s,	       "--join-rate",
			jr_s,	       "--streams-per-process",
			spp_s,	       "--cost",
			costs,	       "--workers",
			rw_s,	       "--ka-workers",
			kw_s,	       "--lease-ttl",
			ttl_s,	       "--no-round-delay"};
	int nbase = S.delay ? 23 : 24;
	for (int p = 1; p < nproc; p++) {
		int glo = p * gpp, ghi = (p + 1) * gpp < S.ngroups ? (p + 1) * gpp : S.ngroups;
		int lo = glo * S.per, hi = ghi * S.per < S.n ? ghi * S.per : S.n;
		child_start(&children[p - 1], base, nbase, lo, hi, glo, ghi);
	}
	start_slice();
	watchdog_start();
	take(&s0);
	int64_t t_setup = now_ns();
	pthread_t reg;
	if (pthread_create(&reg, NULL, register_main, NULL))
		die("cannot start threads");
	broadcast("register\n", NULL);
	bool ok = wait_for(all_registered, timeout_s, "registering");
	pthread_join(reg, NULL);
	if (ok) { /* the processes in parallel */
		broadcast_send("sync\n");
		sync_slice();
		broadcast_recv(NULL);
		ok = wait_for(all_watching, timeout_s, "watching");
	}
	if (ok) /* every node's first round done (its saved/<id> mark read) */
		ok = wait_for(all_started, timeout_s, "first rounds");
	quiet_since = wall_ns();
	if (ok) /* every stream's backlog delivered: no event for 2 s */
		ok = wait_for(quiet, timeout_s, "quiet");
	take(&s1);
	json_object_set_new(out, "setup", diff(&s0, &s1));
	json_object_set_new(out, "setup_s", json_real(secs(t_setup, now_ns())));
	if (!ok) {
		json_object_set_new(out, "failed",
				    json_sprintf("setup: %" PRId64 " of %d registered, %" PRId64
						 " of %d watches, %" PRId64
						 " first rounds after %.0f s",
						 s1.c[C_REGISTERED], S.n, s1.c[C_CREATED],
						 S.ngroups, s1.c[C_STARTED], timeout_s));
		goto report;
	}
	fprintf(stderr, "sim_control: every node registered and watching (%.1f s)\n",
		secs(t_setup, now_ns()));

	/* ---- idle */
	watchdog_end();
	counts_window(false);
	broadcast("window\n", NULL);
	take(&s2);
	nap_ms((int)(idle_s * 1000));
	take(&s3);
	json_t *idle = diff(&s2, &s3);
	json_object_set_new(idle, "watch_streams", json_integer(S.ngroups));
	json_object_set_new(out, "idle", idle);
	fprintf(stderr, "sim_control: idle: %.1f requests/s\n",
		json_real_value(json_object_get(idle, "requests_per_s")));

	/* ---- one reconfiguration touching every node: n0 coordinates */
	counts_window(true);
	atomic_store(&S.target, 2);
	broadcast("target 2\n", NULL);
	int64_t vm_events0 = mirror_events(&S.votes), pm_events0 = mirror_events(&S.peers);
	take(&s3);
	node_at(0)->propose_pending = true;
	wake(node_at(0));
	ok = wait_for(all_released, timeout_s, "reconfiguration");
	take(&s4);
	json_t *rec = diff(&s3, &s4);
	/* the commit: when its transaction was sent (etcd applied it before
	 * its answer, which some nodes' swaps precede) */
	int64_t created = atomic_load(&S.created_wall), commit = atomic_load(&S.commit_sent_wall);
	const int64_t *c = s4.c;
	json_object_set_new(rec, "committed", json_boolean(commit != 0));
	json_object_set_new(rec, "votes", json_integer(c[C_VOTES]));
	json_object_set_new(rec, "swapped", json_integer(c[C_SWAPPED]));
	json_object_set_new(rec, "swaps_published", json_integer(c[C_PUBLISHED]));
	json_object_set_new(rec, "released", json_integer(c[C_RELEASED]));
	json_object_set_new(rec, "discards", json_integer(c[C_DISCARDS]));
	if (created && c[C_LAST_VOTE])
		json_object_set_new(rec, "create_to_last_vote_s",
				    json_real(secs(created, c[C_LAST_VOTE])));
	if (created && commit)
		json_object_set_new(rec, "create_to_commit_s", json_real(secs(created, commit)));
	if (commit)
		json_object_set_new(rec, "commit_txn_s",
				    json_real(secs(commit, atomic_load(&S.commit_wall))));
	if (commit && c[C_FIRST_SWAP])
		json_object_set_new(rec, "commit_to_first_swap_s",
				    json_real(secs(commit, c[C_FIRST_SWAP])));
	if (commit && c[C_SWAPPED] == S.n)
		json_object_set_new(rec, "commit_to_last_swap_s",
				    json_real(secs(commit, c[C_LAST_SWAP])));
	if (commit && c[C_PUBLISHED] == S.n)
		json_object_set_new(rec, "commit_to_last_swap_published_s",
				    json_real(secs(commit, c[C_LAST_PUBLISHED])));
	if (commit && c[C_LAST_ANNOUNCE])
		json_object_set_new(rec, "commit_to_announce_s",
				    json_real(secs(commit, c[C_LAST_ANNOUNCE])));
	if (commit && c[C_RELEASED] == S.n)
		json_object_set_new(rec, "commit_to_last_release_s",
				    json_real(secs(commit, c[C_LAST_RELEASE])));
	/* when keep-alives failed and leases expired, from the attempt's creation */
	const char *at[] = {"keepalive_errors_from_s", "keepalive_errors_until_s",
			    "leases_expired_from_s", "leases_expired_until_s"};
	const int ks[] = {C_FIRST_KA_ERR, C_LAST_KA_ERR, C_FIRST_EXPIRED, C_LAST_EXPIRED};
	for (int i = 0; i < 4; i++)
		if (created && c[ks[i]])
			json_object_set_new(rec, at[i], json_real(secs(created, c[ks[i]])));
	int64_t votes_ev = mirror_events(&S.votes) - vm_events0;
	int64_t entries_ev =
	    mirror_events(&S.peers) - pm_events0 + c[C_EN_EVENTS] - s3.c[C_EN_EVENTS];
	json_object_set_new(rec, "votes_watch_events", json_integer(votes_ev));
	json_object_set_new(rec, "votes_read", json_integer(atomic_load(&S.votes_read)));
	/* the nodes' entries: who followed them (n0, and any node whose 2 s
	 * ran out), what their ranges read and their watches got */
	json_object_set_new(rec, "announced", json_integer(c[C_ANNOUNCED]));
	json_object_set_new(rec, "entries_follows", json_integer(c[C_FOLLOWS]));
	json_object_set_new(rec, "entries_follows_fallback", json_integer(c[C_FALLBACKS]));
	json_object_set_new(rec, "entries_read", json_integer(c[C_EN_READ] - s3.c[C_EN_READ]));
	json_object_set_new(rec, "entries_watch_events", json_integer(entries_ev));
	json_object_set_new(rec, "watch_events_all",
			    json_integer(s4.c[C_EVENTS] - s3.c[C_EVENTS] + votes_ev + entries_ev));
	json_object_set_new(rec, "proposals", json_integer(S.propose_tries));
	int64_t all = json_integer_value(json_object_get(rec, "requests"));
	int64_t kas = s4.c[C_KEEPALIVE] - s3.c[C_KEEPALIVE];
	json_object_set_new(rec, "requests_without_keepalives", json_integer(all - kas));
	json_object_set_new(rec, "requests_per_node_without_keepalives",
			    json_real((double)(all - kas) / S.n));
	json_object_set_new(rec, "watch_events_per_stream",
			    json_real((double)(s4.c[C_EVENTS] - s3.c[C_EVENTS]) / S.ngroups));
	json_object_set_new(out, "reconfigure", rec);
	if (atomic_load(&S.aborted))
		json_object_set_new(out, "failed", json_sprintf("%s", S.abort_reason));
	else if (c[C_DISCARDS])
		json_object_set_new(
		    out, "failed",
		    json_sprintf("%" PRId64 " nodes discarded the attempt", c[C_DISCARDS]));
	else if (!ok)
		json_object_set_new(out, "failed",
				    json_sprintf("reconfiguration: after %.0f s %s, %" PRId64
						 " of %d nodes "
						 "swapped, %" PRId64 " released",
						 timeout_s, commit ? "committed" : "not committed",
						 c[C_SWAPPED], S.n, c[C_RELEASED]));
	else
		rc = 0;
	fprintf(stderr, "sim_control: reconfiguration: %" PRId64 " of %d swapped\n", c[C_SWAPPED],
		S.n);

report:;
	char *text = json_dumps(out, JSON_COMPACT);
	printf("%s\n", text);
	fflush(stdout);
	free(text);
	json_decref(out);

	/* ---- the end: the children, threads and watches stopped */
	for (int i = 0; i < nchildren; i++) {
		close(children[i].in);
		fclose(children[i].out);
	}
	for (int i = 0; i < nchildren; i++)
		waitpid(children[i].pid, NULL, 0);
	free(children);
	stop_slice();
	net_etcd_free(S.cetcd);
	net_http_free(metrics_http);
end:
	net_etcd_free(main_etcd);
	free(S.ids);
	free(S.config1);
	free(S.config2);
	return rc;
}
