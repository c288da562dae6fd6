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
 * The daemon modelled is cluster/ as of commit eeede28. Each simulated node
 * is what one daemon's control plane does, with the daemon function it
 * replicates named where it happens below:
 *   - its lease: granted (TTL 5 s) by mlfs_nodeentry_register and kept
 *     alive by its own keep-alive "thread" 1 s after the previous one
 *     answered (mlfs_nodeentry_keepalive_main), one POST
 *     /v3/lease/keepalive each; etcd saying it expired flags it, and the
 *     next round registers again (mlfs_decide's REGISTER);
 *   - its view of the job's keys: one watch of /mlfs/<job>/ per node (the
 *     daemon's mlfs_mirror: a range, then a watch from the next revision),
 *     each event applied as mlfs_mirror.c's on_watch does and waking the
 *     node by mlfs_cluster.c's keys_changed rules: anything but nodes'
 *     entries and saved marks wakes it; an entry created or deleted wakes
 *     only a coordinator; an entry changing wakes no one;
 *   - its rounds (mlfs_cluster.c's round_once, mlfs_attempt.c's
 *     mlfs_attempt_round): a snapshot of its view and of its (simulated)
 *     store handed to the real mlfs_decide, the actions carried out with
 *     the daemon's etcd requests, then its entry put when what it says
 *     changed (mlfs_nodeentry_publish: settled states only). A round runs
 *     when woken (a key change as above; its store's state changing, the
 *     store's reconf_changed hook: a prepare starting or done, a commit, a
 *     discard; its lease expired) or when its nap ends (mlfs_cluster.c's
 *     nap_ms: 50 ms for 2 s after a commit while the retained layout waits
 *     for the swaps, then 1 s; 1 s while an attempt is in etcd; 30 s
 *     otherwise);
 *   - the coordinator (n0): mlfs_propose.c's propose_config (one read of
 *     the job as mlfs_jobkeys_read makes it, the attempt built with every
 *     live node a participant, created by one transaction), its votes
 *     followed by a second mirror while it coordinates (the real
 *     mlfs_mirror_init/sync/copy/stop on /mlfs-votes/<job>/), its commit
 *     transaction exactly as mlfs_attempt.c's finish() writes it.
 * The etcd requests of one reconfiguration, by the code above: each node
 * puts its vote (act_vote_ready) and its entry once (the new version, at
 * the round of its swap); the coordinator also reads the job (range),
 * creates the attempt (txn), reads and watches the votes (range, watch)
 * and commits (txn): 2N + 5. No release put (the retained layout's
 * version is in /v1/health, not in the entry), no passing states.
 *
 * How a simulated node differs from a daemon:
 *   - the daemon's CPU. A round's CPU in the daemon (mirror copy of every
 *     key, the parse of every entry, the snapshot's linear searches of the
 *     participants and swap_wait lists, and the coordinator's of the votes:
 *     quadratic in N) is spent on its own machine. The simulator measures
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
 *   - the view: what mlfs_mirror keeps (every key and value: about 230
 *     bytes per entry, 23 GB for 10,000 views of 10,000 entries) is kept
 *     as what the decision reads: per node entry its version, up and lost
 *     (4 bytes), the attempt parsed once per revision and shared;
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
 *     and starts its nodes' watches from that revision, --join-rate a
 *     second; a watch that ends during start-up starts again from the
 *     revision its stream reached (start_watchdog). A daemon registers and
 *     reads the job itself, one by one (N ranges of N keys, every later
 *     entry sent to every earlier watch: N^2 / 2 events), and reads every
 *     key again when its watch ends. Start-up is not what is measured;
 *     from the idle window on, a watch that ends is the daemon's case;
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
 * Not simulated: the job's cluster.json key and joins, saved/<id> marks and
 * step writes, job/ staging, backups, /v1/health, peers, status.json.
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
	C_EVENTS,   /* watch events received, every stream */
	C_MESSAGES, /* watch messages received */
	C_BYTES,    /* keys and values received by watches */
	C_STALE,    /* events at a revision the stream had applied an event of */
	C_EV_PUT,   /* of them: an entry put, */
	C_EV_DEL,   /* an entry deleted (its lease gone) */
	C_CREATED,  /* watches etcd confirmed */
	C_KA_N,
	C_KA_LAT,
	C_KA_ERR,
	C_EXPIRED,    /* a keep-alive answered that the lease is gone */
	C_ENTRY_GONE, /* a node's own watch saw its entry deleted: etcd expired its lease */
	C_REGISTERED,
	C_SWAPPED,   /* nodes at the target version (their store) */
	C_PUBLISHED, /* ... whose entry says so */
	C_RELEASED,  /* ... and which let their retained layout go */
	C_VOTES,
	C_DISCARDS,
	C_CPU_US, /* the process's CPU */
	C_KA_LAT_MAX,
	C_GAP_MAX,
	C_LAST_EVENT,
	C_LAST_SWAP,
	C_LAST_PUBLISHED,
	C_LAST_RELEASE,
	C_LAST_VOTE,
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

/* The job's keys as one watch stream shows them (a daemon's mirror,
 * reduced to what its decisions read). */
struct group {
	int idx, first, count; /* its nodes: [first, first + count) */
	pthread_mutex_t lock;  /* the view; the watch's thread writes it */
	pthread_mutex_t sync_lock;
	struct net_etcd_watch *watch;
	bool live;
	bool created; /* etcd confirmed its watch */
	bool ended;   /* its watch ended during start-up (start_watchdog restarts it) */
	int64_t revision;
	int64_t last_event; /* the revision of the last event applied (or the read's) */
	bool has_schema;
	int64_t committed;
	char config_id[24];
	struct att *att;
	uint32_t *ent; /* per node of the job: E_UP | E_LOST | version (0: no entry) */
};

struct seen {
	char aid[24];
	int64_t attempt_mod;
	struct att *att; /* a reference */
	bool etcd_ok;
};

struct node {
	int idx;
	char id[16];
	struct group *g;
	_Atomic int64_t lease;
	atomic_bool lease_expired;
	atomic_bool coordinating; /* c->mine != NULL: keys_changed wakes it on nodes */
	/* Its store and control thread's state (struct mlfs_cluster's fields
	 * of the same names): touched by its rounds only, one at a time. */
	bool store_schema, lost, need_register, propose_pending;
	int64_t have, target, prepare_rev, retained, swap_since_ms;
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
	int64_t base;  /* mirror copy, the parse of every key, steps */
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
	char prefix[128], vprefix[128];
	char (*ids)[16];      /* every node's id */
	struct node *nodes;   /* [hi - lo] */
	struct group *groups; /* [ghi - glo] */
	/* the coordinator's (n0's process) */
	struct net_etcd *cetcd; /* its client (c->etcd): propose, the votes mirror */
	struct mlfs_mirror votes;
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
	} else if (strncmp(nm, "nodes/", 6) == 0) {
		int i = node_index(nm + 6, strlen(nm + 6));
		if (i < 0)
			return;
		if (deleted && (g->ent[i] & E_UP) && i >= g->first && i < g->first + g->count)
			c_add(C_ENTRY_GONE, 1);
		uint32_t e = 0;
		if (!deleted) {
			const char *v = strstr(kv->value, "\"version\":");
			e = E_UP | ((uint32_t)(v ? strtoll(v + 10, NULL, 10) : 0) & E_VERSION);
			if (strstr(kv->value, "\"state\":\"lost\""))
				e |= E_LOST;
		}
		g->ent[i] = e;
	}
}

static void view_reset(struct group *g)
{
	att_put(g->att);
	g->att = NULL;
	g->config_id[0] = '\0';
	g->has_schema = false;
	g->committed = 0;
	memset(g->ent, 0, (size_t)S.n * sizeof(*g->ent));
}

/* The watch's function: mlfs_mirror.c's on_watch, then mlfs_cluster.c's
 * keys_changed for every node of the stream. */
static void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct group *g = arg;
	size_t plen = strlen(S.prefix);
	int64_t bytes = 0;
	/* mlfs_mirror.c's on_watch: URGENT for anything but entries and saved
	 * marks, and the stream's end; VOTES for an entry created or deleted */
	int urgent = n == 0 && revision < 0 ? MLFS_MIRROR_URGENT : 0;
	for (size_t i = 0; i < n; i++) {
		const char *nm = ev[i].kv.key + (strlen(ev[i].kv.key) >= plen ? plen : 0);
		if (strncmp(nm, "nodes/", 6) == 0 && (ev[i].deleted || ev[i].kv.version == 1))
			urgent |= MLFS_MIRROR_VOTES;
		else if (strncmp(nm, "nodes/", 6) && strncmp(nm, "saved/", 6))
			urgent |= MLFS_MIRROR_URGENT;
		bytes += (int64_t)(strlen(ev[i].kv.key) + ev[i].kv.len);
	}
	pthread_mutex_lock(&g->lock);
	int64_t stale = 0, last = g->last_event, puts = 0, dels = 0;
	for (size_t i = 0; i < n; i++) { /* etcd sent it before (to a slow watcher) */
		stale += ev[i].kv.mod_revision <= last;
		if (strlen(ev[i].kv.key) > plen && strncmp(ev[i].kv.key + plen, "nodes/", 6) == 0)
			*(ev[i].deleted ? &dels : &puts) += 1;
		if (ev[i].kv.mod_revision > g->last_event)
			g->last_event = ev[i].kv.mod_revision;
	}
	bool ended = n == 0 && revision < 0, setup = atomic_load(&S.in_setup);
	bool created = n == 0 && revision > 0 && !g->created && !ended;
	if (ended) {
		if (g->created)
			c_add(C_CREATED, -1);
		g->created = false;
		if (setup) /* start-up (not measured): restarted as it was */
			g->ended = true;
		else
			g->live = false;
		if (!atomic_load(&S.stop) && !setup)
			fprintf(stderr, "sim_control: stream %d: the watch ended: %s\n", g->idx,
				strerror((int)-revision));
	}
	if (created)
		g->created = true;
	for (size_t i = 0; i < n; i++)
		apply(g, &ev[i].kv, ev[i].deleted);
	if (revision > g->revision)
		g->revision = revision;
	pthread_mutex_unlock(&g->lock);
	if (n) {
		c_max(C_LAST_EVENT, wall_ns());
		c_add(C_EVENTS, (int64_t)n);
		c_add(C_MESSAGES, 1);
		c_add(C_BYTES, bytes);
		c_add(C_STALE, stale);
		c_add(C_EV_PUT, puts);
		c_add(C_EV_DEL, dels);
	} else if (created) {
		c_add(C_CREATED, 1); /* etcd's "created" */
	}
	if (!urgent || atomic_load(&S.stop) || (ended && setup))
		return;
	/* keys_changed: URGENT wakes every node, VOTES a coordinator */
	pthread_mutex_lock(&S.lock);
	for (int i = g->first; i < g->first + g->count; i++) {
		struct node *nd = node_at(i);
		if ((urgent & MLFS_MIRROR_URGENT) ||
		    ((urgent & MLFS_MIRROR_VOTES) && atomic_load(&nd->coordinating)))
			wake_locked(nd);
	}
	pthread_mutex_unlock(&S.lock);
}

/* mlfs_mirror_sync for stream @g: when it is not live, one range of the
 * job's keys and a watch from the next revision. */
static int group_sync(struct worker *w, struct group *g)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev;
	struct ptc_error err;
	int rc = 0;

	pthread_mutex_lock(&g->sync_lock);
	pthread_mutex_lock(&g->lock);
	bool live = g->live;
	pthread_mutex_unlock(&g->lock);
	if (live)
		goto out;
	net_etcd_watch_stop(g->watch);
	g->watch = NULL;
	c_add(C_RANGE, 1);
	if ((rc = net_etcd_range(w->etcd, S.prefix, true, &kvs, &n, &rev, NULL, &err))) {
		fprintf(stderr, "sim_control: stream %d: range: %s\n", g->idx, err.text);
		goto out;
	}
	pthread_mutex_lock(&g->lock);
	view_reset(g);
	for (size_t i = 0; i < n; i++)
		apply(g, &kvs[i], false);
	g->revision = g->last_event = rev;
	g->live = true;
	pthread_mutex_unlock(&g->lock);
	net_etcd_kvs_free(kvs, n);
	c_add(C_WATCH, 1);
	if ((rc = net_etcd_watch_start(w->etcd, S.prefix, rev + 1, on_watch, g, &g->watch, &err))) {
		fprintf(stderr, "sim_control: stream %d: watch: %s\n", g->idx, err.text);
		pthread_mutex_lock(&g->lock);
		g->live = false;
		pthread_mutex_unlock(&g->lock);
	}
out:
	pthread_mutex_unlock(&g->sync_lock);
	return rc;
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

/* mlfs_nodeentry_publish: its entry put when it changed. */
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
	name(k, sizeof(k), "nodes/%s", nd->id);
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
		atomic_store(&S.commit_sent_wall, sent);
		atomic_store(&S.commit_wall, wall_ns());
	}
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
 * job's keys read (read_agreed: a range as mlfs_jobkeys_read, again every
 * 100 ms up to 20 times until every live node published the committed
 * version and its rank's step), the attempt built (propose_build,
 * move_nodes: every live node at the committed version takes part; job/
 * empty; no node down), created by one transaction that requires no
 * attempt and "config" unmoved, bound to its lease, deleting the votes an
 * earlier attempt to 2 left (propose_create); then its prepare starts at
 * once (propose_attempt). On the daemon an I/O worker runs it. 0: created;
 * 1: `mlfs reconfigure` would fail, naming etcd (an operator runs it
 * again); -1: refused.
 */
static int propose_once(struct node *nd)
{
	struct net_etcd_kv *kvs = NULL;
	size_t n = 0, plen = strlen(S.prefix);
	struct ptc_error err;
	char ka[256], kc[256], kv[256], aid[24];
	bool ok = false, has_config = false, has_attempt = false;
	int64_t rev = 0, committed = 0, config_mod = 0;
	json_t *nodes = NULL;

	for (int tries = 0;; tries++) {
		/* mlfs_jobkeys_read: one range of the job's keys, every entry
		 * parsed (a proposal's read is fresh, not the mirror's) */
		c_add(C_RANGE, 1);
		if (net_etcd_range(S.cetcd, S.prefix, true, &kvs, &n, &rev, NULL, &err)) {
			fprintf(stderr, "sim_control: propose: read: %s\n", err.text);
			return 1; /* "the control plane (etcd) is unreachable" */
		}
		nodes = json_object();
		has_config = has_attempt = false;
		for (size_t i = 0; i < n; i++) {
			const char *nm = kvs[i].key + plen;
			if (strcmp(nm, "config") == 0) {
				has_config = true;
				committed = config_version(kvs[i].value);
				config_mod = kvs[i].mod_revision;
			} else if (strcmp(nm, "attempt") == 0) {
				has_attempt = true;
			} else if (strncmp(nm, "nodes/", 6) == 0) {
				json_object_set_new(nodes, nm + 6,
						    json_loadb(kvs[i].value, kvs[i].len, 0, NULL)
							?: json_object());
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
	json_t *a = json_pack("{sssIsIsssssOsososIsoso}", "id", aid, "from", (json_int_t)committed,
			      "to", (json_int_t)2, "config", S.config2, "coordinator", nd->id,
			      "participants", parts, "down", json_array(), "backups", json_object(),
			      "deadline_ms", (json_int_t)(wall_ms() + ATTEMPT_MS), "job",
			      json_array(), "job_missing", json_array());
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
		}
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
	return S.cost.base + (nd->seen.att ? S.cost.att + S.cost.ids : 0) +
	       (nd->swap_wait ? S.cost.ids : 0) + (nd->mine ? S.cost.votes : 0);
}

/*
 * A round's first half (mlfs_cluster.c's round_once up to mlfs_decide):
 * the mirror synced (a range and a watch when it is not live), the votes
 * mirror synced and copied while this node coordinates (stopped when it no
 * longer does), the snapshot (mlfs_attempt.c's snapshot) and the decision.
 * The actions wait for the daemon's CPU of this round (round_act).
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
	if (group_sync(w, g))
		return; /* rule 1: without etcd nothing is decided */
	if (!nd->mine && S.votes_init && S.votes.watch && nd->idx == 0)
		mlfs_mirror_stop(&S.votes);
	if (nd->mine) {
		pthread_mutex_lock(&S.votes.lock);
		bool live = S.votes.live;
		pthread_mutex_unlock(&S.votes.lock);
		int64_t ranges = S.votes.ranges, rev;
		if (!live)
			c_add(C_RANGE, 1);
		int rc = mlfs_mirror_sync(&S.votes, &err);
		if (S.votes.ranges > ranges) {
			c_add(C_WATCH, 1);
			pthread_mutex_lock(&S.votes.lock);
			atomic_fetch_add(&S.votes_read, (int64_t)S.votes.n);
			pthread_mutex_unlock(&S.votes.lock);
		}
		if (rc || mlfs_mirror_copy(&S.votes, &vk, &nvk, &rev, &err)) {
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
	};
	snprintf(commit_id, sizeof(commit_id), "%s", g->config_id);
	for (int i = 0; i < S.n; i++) {
		uint32_t e = g->ent[i];
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
	if (prepare_done(nd)) /* the build worker's set_state(PREPARED) */
		*woken = true;
	int target = atomic_load(&S.target);
	if (nd->have == target && nd->swapped_v == target && nd->retained == 0 &&
	    nd->released_v != target) {
		nd->released_v = target;
		c_add(C_RELEASED, 1);
		c_max(C_LAST_RELEASE, wall_ns());
	}
	/* nap_ms: a retained layout waits for the swaps every 50 ms for 2 s
	 * after the commit, then every second */
	int64_t swap = nd->swap_wait ? wall_ms() - nd->swap_since_ms : -1;
	return !etcd_ok			       ? 200
	       : swap >= 0 && swap < 2000      ? 50
	       : nd->attempt_seen || swap >= 0 ? 1000
					       : 30000;
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
 *   base:  mlfs_mirror_copy of the job's keys, mlfs_jobkeys.c's parse (every
 *          entry from its cache of entries parsed per revision,
 *          entry_parsed; the config parsed), mlfs_nodeentry_sync_steps, and
 *          the snapshot's loop over the nodes (their entries' fields);
 *   att:   the attempt copied and parsed (while one is in etcd);
 *   ids:   the snapshot's mlfs_cluster_ids_has for every node over an N-id
 *          list: paid once for the attempt's participants, once for
 *          swap_wait after a commit;
 *   votes: the coordinator's: mlfs_mirror_copy of the votes and vote_of's
 *          linear search for every participant.
 */
static struct cost daemon_cost(void)
{
	size_t n = (size_t)S.n, k = 0;
	struct net_etcd_kv *kv = xcalloc(n + 3, sizeof(*kv)), *vk = xcalloc(n, sizeof(*vk));
	char key[256], val[128];
	struct node tmp = {0};
	json_t *parts = json_array();
	struct cost best = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};

	for (size_t i = 0; i < n; i++)
		json_array_append_new(parts, json_string(S.ids[i]));
	json_t *a =
	    json_pack("{sssIsIsssssOsososIsoso}", "id", "0123456789abcdef", "from", (json_int_t)1,
		      "to", (json_int_t)2, "config", S.config2, "coordinator", "n0", "participants",
		      parts, "down", json_array(), "backups", json_object(), "deadline_ms",
		      (json_int_t)wall_ms(), "job", json_array(), "job_missing", json_array());
	const char *texts[] = {S.config1, S.schema}, *names[] = {"config", "schema"};
	for (int i = 0; i < 2; i++, k++) {
		name(key, sizeof(key), "%s", names[i]);
		kv[k].key = strdup(key);
		kv[k].value = strdup(texts[i]);
		kv[k].len = strlen(texts[i]);
	}
	for (size_t i = 0; i < n; i++, k++) {
		char st[16] = "";
		tmp.idx = (int)i;
		tmp.have = 1;
		name(key, sizeof(key), "nodes/%s", S.ids[i]);
		kv[k].key = strdup(key);
		kv[k].value = entry_text(&tmp, st);
		kv[k].len = strlen(kv[k].value);
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
	for (size_t i = 0; i < k; i++)
		if (strncmp(kv[i].key + plen, "nodes/", 6) == 0)
			json_object_set_new(parsed, kv[i].key + plen + 6,
					    json_pack("[Io]", (json_int_t)kv[i].mod_revision,
						      json_loadb(kv[i].value, kv[i].len, 0, NULL)));
	for (int rep = 0; rep < 3; rep++) {
		double t0 = cpu_ns();
		struct net_etcd_kv *c = kvs_copy(kv, k);
		json_t *nodes = json_object();
		int64_t committed = 0;
		for (size_t i = 0; i < k; i++) {
			const char *nm = c[i].key + plen;
			if (strncmp(nm, "nodes/", 6) == 0) { /* entry_parsed: a hit */
				json_t *hit = json_object_get(parsed, nm + 6), *j = NULL;
				if (hit &&
				    json_integer_value(json_array_get(hit, 0)) == c[i].mod_revision)
					j = json_incref(json_array_get(hit, 1));
				json_object_set_new(nodes, nm + 6, j ?: json_object());
			} else if (strcmp(nm, "config") == 0) {
				json_t *j = json_loadb(c[i].value, c[i].len, 0, NULL);
				committed = json_integer_value(json_object_get(j, "version"));
				json_decref(j);
			}
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
		double t1 = cpu_ns();
		struct net_etcd_kv *ca = kvs_copy(&att, 1);
		json_t *aj = json_loadb(ca->value, ca->len, 0, NULL);
		double t2 = cpu_ns();
		const json_t *ps = json_object_get(aj, "participants");
		for (size_t i = 0; i < n; i++)
			found += mlfs_cluster_ids_has(ps, S.ids[i]);
		double t3 = cpu_ns();
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
		double t4 = cpu_ns();
		json_decref(nodes);
		json_decref(aj);
		net_etcd_kvs_free(c, k);
		net_etcd_kvs_free(ca, 1);
		net_etcd_kvs_free(cv, n);
		int64_t p[4] = {(int64_t)(t1 - t0), (int64_t)(t2 - t1), (int64_t)(t3 - t2),
				(int64_t)(t4 - t3)};
		best.base = p[0] < best.base ? p[0] : best.base;
		best.att = p[1] < best.att ? p[1] : best.att;
		best.ids = p[2] < best.ids ? p[2] : best.ids;
		best.votes = p[3] < best.votes ? p[3] : best.votes;
	}
	if (found != (int64_t)(3 * 5 * n)) /* what each part looked for, every time */
		fprintf(stderr, "sim_control: round cost: %" PRId64 " found of %zu\n", found,
			3 * 5 * n);
	json_decref(parsed);
	net_etcd_kvs_free(kv, k);
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
	for (int k = C_SWAPPED; k <= C_VOTES; k++)
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
		pthread_mutex_init(&g->sync_lock, NULL);
		g->ent = xcalloc((size_t)S.n, sizeof(*g->ent));
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
 * from the next revision (start-up, DESIGN), then every node's first
 * round. */
static void sync_slice(void)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev;
	struct ptc_error err;
	struct group tpl = {.ent = xcalloc((size_t)S.n, sizeof(uint32_t))};
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
		memcpy(g->ent, tpl.ent, (size_t)S.n * sizeof(uint32_t));
		g->has_schema = tpl.has_schema;
		g->committed = tpl.committed;
		memcpy(g->config_id, tpl.config_id, sizeof(g->config_id));
		g->att = att_ref(tpl.att);
		g->revision = g->last_event = rev;
		g->live = true;
		pthread_mutex_unlock(&g->lock);
		c_add(C_WATCH, 1);
		if (net_etcd_watch_start(main_etcd, S.prefix, rev + 1, on_watch, g, &g->watch,
					 &err)) {
			fprintf(stderr, "sim_control: stream %d: watch: %s\n", g->idx, err.text);
			pthread_mutex_lock(&g->lock);
			g->live = false; /* the node's next round syncs it */
			pthread_mutex_unlock(&g->lock);
		}
	}
	att_put(tpl.att);
	free(tpl.ent);
	for (int i = S.lo; i < S.hi; i++)
		wake(node_at(i));
}

/* mlfs_cluster.c's votes_changed: the votes mirror (live only while n0
 * coordinates) wakes it. */
static void votes_changed(void *arg, int urgent)
{
	(void)arg;
	(void)urgent;
	if (!atomic_load(&S.stop))
		wake(node_at(0));
}

static int64_t votes_events(void)
{
	pthread_mutex_lock(&S.votes.lock);
	int64_t n = S.votes.events;
	pthread_mutex_unlock(&S.votes.lock);
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
		free(ws[i].vote);
	}
	free(ws);
	if (S.votes_init) /* its watch's thread ends first: it wakes n0 */
		mlfs_mirror_release(&S.votes);
	for (int gi = 0; gi < S.ghi - S.glo; gi++) {
		struct group *g = &S.groups[gi];
		net_etcd_watch_stop(g->watch);
		att_put(g->att);
		free(g->ent);
		pthread_mutex_destroy(&g->lock);
		pthread_mutex_destroy(&g->sync_lock);
	}
	for (int i = S.lo; i < S.hi; i++) {
		struct node *nd = node_at(i);
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
	json_object_set_new(o, "leases_expired",
			    json_integer(b->c[C_ENTRY_GONE] - a->c[C_ENTRY_GONE]));
	json_object_set_new(o, "expiries_noticed", json_integer(b->c[C_EXPIRED] - a->c[C_EXPIRED]));
	json_object_set_new(o, "watch_events", json_integer(b->c[C_EVENTS] - a->c[C_EVENTS]));
	json_object_set_new(o, "watch_messages", json_integer(b->c[C_MESSAGES] - a->c[C_MESSAGES]));
	json_object_set_new(o, "watch_bytes", json_integer(b->c[C_BYTES] - a->c[C_BYTES]));
	json_object_set_new(o, "watch_events_stale", json_integer(b->c[C_STALE] - a->c[C_STALE]));
	json_object_set_new(o, "watch_events_entry_puts",
			    json_integer(b->c[C_EV_PUT] - a->c[C_EV_PUT]));
	json_object_set_new(o, "watch_events_entry_deletes",
			    json_integer(b->c[C_EV_DEL] - a->c[C_EV_DEL]));
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
				c[C_ENTRY_GONE]);
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
	int64_t cost_ns[4] = {-1, -1, -1, -1};

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
			sscanf(v, "%" SCNd64 ":%" SCNd64 ":%" SCNd64 ":%" SCNd64, &cost_ns[0],
			       &cost_ns[1], &cost_ns[2], &cost_ns[3]);
		else
			usage();
	}
	if (!S.url || S.n < 2 || S.n > 1000000 || per_process < 1)
		usage();
	snprintf(S.prefix, sizeof(S.prefix), "/mlfs/%s/", S.job);
	snprintf(S.vprefix, sizeof(S.vprefix), "/mlfs-votes/%s/", S.job);
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
		S.cost = (struct cost){cost_ns[0], cost_ns[1], cost_ns[2], cost_ns[3]};
		rc = child_main();
		goto end;
	}

	struct ptc_error err;
	if (net_http_new(NULL, &metrics_http, &err))
		die("%s", err.text);
	S.cost = daemon_cost();
	/* the coordinator's client and votes mirror */
	S.cetcd = client();
	if (mlfs_mirror_init(&S.votes, S.cetcd, S.vprefix, votes_changed, NULL))
		die("votes mirror");
	S.votes_init = true;
	fprintf(stderr,
		"sim_control: %d nodes, %d watch streams (%d nodes each) in %d processes, "
		"%d round and %d keep-alive workers here; a daemon's round: %.2f ms, with an "
		"attempt %.2f ms, coordinating %.2f ms; etcd %s\n",
		S.n, S.ngroups, S.per, nproc, S.nworkers, S.nka, (double)S.cost.base / 1e6,
		(double)(S.cost.base + S.cost.att + S.cost.ids) / 1e6,
		(double)(S.cost.base + S.cost.att + S.cost.ids + S.cost.votes) / 1e6, S.url);

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
	json_object_set_new(
	    out, "daemon_round_ms",
	    json_pack("{sfsfsfsf}", "idle", (double)S.cost.base / 1e6, "attempt",
		      (double)(S.cost.base + S.cost.att + S.cost.ids) / 1e6, "after_commit",
		      (double)(S.cost.base + S.cost.ids) / 1e6, "coordinator",
		      (double)(S.cost.base + S.cost.att + S.cost.ids + S.cost.votes) / 1e6));

	/* ---- setup: the job's schema and first config, then the other
	 * processes, every node registered, every stream's watch */
	struct snapshot s0, s1, s2, s3, s4;
	put_first(main_etcd);
	atomic_store(&S.target, 1);
	nchildren = nproc - 1;
	children = xcalloc((size_t)nproc, sizeof(*children));
	char costs[128], nodes_s[16], watches_s[16], ka_s[16], jr_s[16], spp_s[16], rw_s[16],
	    kw_s[16], ttl_s[16];
	snprintf(costs, sizeof(costs), "%" PRId64 ":%" PRId64 ":%" PRId64 ":%" PRId64, S.cost.base,
		 S.cost.att, S.cost.ids, S.cost.votes);
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
	quiet_since = wall_ns();
	if (ok) /* every stream's backlog delivered: no event for 2 s */
		ok = wait_for(quiet, timeout_s, "quiet");
	take(&s1);
	json_object_set_new(out, "setup", diff(&s0, &s1));
	json_object_set_new(out, "setup_s", json_real(secs(t_setup, now_ns())));
	if (!ok) {
		json_object_set_new(out, "failed",
				    json_sprintf("setup: %" PRId64 " of %d registered, %" PRId64
						 " of %d watches after %.0f s",
						 s1.c[C_REGISTERED], S.n, s1.c[C_CREATED],
						 S.ngroups, timeout_s));
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
	int64_t vm_events0 = votes_events();
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
	json_object_set_new(rec, "votes_watch_events", json_integer(votes_events() - vm_events0));
	json_object_set_new(rec, "votes_read", json_integer(atomic_load(&S.votes_read)));
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
