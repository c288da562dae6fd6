/*
 * sim_i.h - internals shared by the files of sim_control (tests/bench/),
 * the control plane of N nodes simulated against one etcd. sim_control.c's
 * DESIGN block describes the simulation; the files:
 *
 *   sim_control.c   the driver: usage, the run's steps, the JSON output
 *   sim_proc.c      a process's slice of nodes, start-up, the children
 *   sim_pool.c      wake-ups, timers, the round and keep-alive workers
 *   sim_node.c      a node's rounds: its snapshot, decisions and actions
 *   sim_coord.c     the coordinator's proposal, votes (its peer server) and commit
 *   sim_view.c      a node's views of etcd: the job's keys, the entries
 *   sim_measure.c   the daemon's round CPU, etcd's figures, the windows
 *   sim_base.c      clocks, errors, counts, clients, shared attempts
 */
#ifndef MLFS_SIM_I_H
#define MLFS_SIM_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

#include "cluster/cluster_i.h"
#include "cluster/decide_i.h"
#include "net/net.h"

#define ATTEMPT_MS (300 * 1000) /* an attempt's deadline, as mlfs_propose.c */
#define E_UP	   0x80000000u	/* a view's entry: the node is up, */
#define E_LOST	   0x40000000u	/* says it is lost, */
#define E_VERSION  0x3fffffffu	/* at this version */

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
	C_SWAPPED,	     /* nodes at the target version (their store) */
	C_PUBLISHED,	     /* ... whose entry says so */
	C_RELEASED,	     /* ... and which let their retained layout go */
	C_VOTES,	     /* votes delivered (n0's own put into its box, the others' POSTs) */
	C_VOTES_RECEIVED,    /* votes n0's box got (its peer server's and its own) */
	C_VOTES_HTTP_FAILED, /* vote POSTs that failed (the node votes again next round) */
	C_ACKS,		     /* swap acks n0's box took ("swapped", after the commit) */
	C_ACKS_FAILED,	     /* ... that it did not take (the entry says the swap at once) */
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
	int64_t released_rev;
	json_t *released_ids; /* {id: true}: the entries the announcement put */
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
	bool proposing; /* c->proposing: it builds an attempt (n0) */
	int64_t have, target, prepare_rev, retained, swap_since_ms;
	int64_t announce; /* c->announce: the commit it made, to announce */
	struct peers *pv; /* c->peers while it follows the entries (not n0) */
	enum mlfs_reconf_state reconf;
	char prepare_id[24], voted_id[24], started_id[24];
	bool voted_ready;
	struct att *prep_parts, *swap_wait; /* c->prep_parts, c->swap_wait */
	char *mine;			    /* c->mine: the attempt it created */
	char *published;		    /* c->published */
	int64_t published_rev;		    /* c->published_rev */
	char *acked_entry;		    /* c->acked_entry, and: */
	int64_t acked_entry_to, acked_entry_base;
	char acked_id[24];     /* c->acked_id: the attempt it committed */
	bool publish_failed;   /* c->publish_failed */
	int64_t publish_at_ms; /* c->publish_at_ms (wall) */
	int64_t publish_after; /* c->publish_after: its swap, acked */
	char entry_state[16];  /* c->entry_state */
	bool attempt_seen;     /* c->attempt != NULL */
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
	int64_t ids;   /* an N-id list marked through the index (mlfs_snap_find) */
	int64_t votes; /* the coordinator's: its votebox copied, each vote found in the index */
};

struct sim {
	const char *url;
	const char *job;
	int n;		  /* nodes of the job */
	int lo, hi;	  /* the nodes this process simulates */
	int ngroups, per; /* watch streams of the job, nodes per stream */
	int glo, ghi;	  /* this process's streams */
	int nworkers, nka, ka_ms, ttl, join_rate, join_rate_here;
	int to_nodes; /* the nodes of the config moved to (--to-nodes; N / 2) */
	bool delay;
	struct cost cost;
	char prefix[128], nprefix[128];
	char (*ids)[16];       /* every node's id */
	struct ptc_cluster cl; /* the same ids as a cluster's nodes (mlfs_ids_pack) */
	struct node *nodes;    /* [hi - lo] */
	struct group *groups;  /* [ghi - glo] */
	/* n0's peer server, which every process's nodes send their votes to
	 * (POST /v1/vote with the token: the children get both on their
	 * command line) */
	char vote_url[64], token[40];
	/* the coordinator's (n0's process) */
	bool n0_here;		   /* this process is n0's: the fields below are set */
	struct net_etcd *cetcd;	   /* its client (c->etcd): propose, the entries mirror */
	struct mlfs_mirror peers;  /* c->peers */
	struct mlfs_votebox *box;  /* st->votebox: the votes it received */
	struct net_server *server; /* its peer server (mlfs_peer_start's), /v1/vote only */
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
};
extern struct sim S;

enum { T_KA, T_NAP, T_ACT };

/* ------------------------------------------------------------- clients */

struct worker {
	pthread_t thread;
	struct net_etcd *etcd;
	struct net_http *http; /* a round worker's, to n0's peer server: the votes */
	bool ka;
	struct mlfs_snap_node *sn;	 /* a round's snapshot of every node */
	uint32_t *ent;			 /* a round's copy of the entries */
	const struct net_etcd_kv **vote; /* the coordinator's votes by node */
};

/* ------------------------------------------------------------ processes */

struct child {
	pid_t pid;
	int in;
	FILE *out;
};

/* A window's figures: the processes' counts, etcd's CPU and metrics. */
struct snapshot {
	int64_t c[NC];
	int64_t t;
	double etcd_cpu, etcd_handled, etcd_started, etcd_events, children_cpu;
	int64_t etcd_rss_kb;
};

/* ----------------------------------------------------------- sim_base.c */

extern _Atomic int64_t counts[NC];

int64_t now_ns(void);
int64_t wall_ns(void);
int64_t wall_ms(void);
void nap_ms(int ms);
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void *xcalloc(size_t n, size_t size);
void c_add(int k, int64_t v);
void c_max(int k, int64_t v);
void c_min(int k, int64_t v);
struct node *node_at(int i);
int node_index(const char *id, size_t len);
bool bit(const uint8_t *b, int i);
struct net_etcd *client_with(int timeout_ms, int deadline_ms);
struct net_etcd *client(void);
struct net_http *vote_client(void);
void name(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
struct att *att_ref(struct att *a);
void att_put(struct att *a);
struct att *att_get(const char *raw, size_t len, int64_t mod);

/* ----------------------------------------------------------- sim_view.c */

int64_t config_version(const char *v);
void pend_free(struct pend *p);
void apply(struct group *g, const struct net_etcd_kv *kv, bool deleted);
void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision);
int group_sync(struct worker *w, struct group *g);
void peers_changed(void *arg);
void peers_stop(struct node *nd);
int mirror_follow(struct mlfs_mirror *m, bool need, struct ptc_error *err);
bool need_peers(const struct node *nd);
int follow_entries(struct worker *w, struct node *nd, struct ptc_error *err);
bool entries_of(struct node *nd, uint32_t *ent);

/* ----------------------------------------------------------- sim_node.c */

char *entry_text(const struct node *nd, char *state);
int do_register(struct worker *w, struct node *nd);
void prepare_start(struct node *nd, struct att *a, int64_t rev);
bool prepare_done(struct node *nd);
int64_t round_cost(const struct node *nd);
void round_decide(struct worker *w, struct node *nd);
int round_act(struct worker *w, struct node *nd, bool *woken);

/* ---------------------------------------------------------- sim_coord.c */

void finish(struct worker *w, struct node *nd, const struct att *a, int64_t to, const char *reason);
void propose(struct node *nd);
void votes_serve(void);
void votes_stop(void);
void n0_peers_changed(void *arg);

/* ----------------------------------------------------------- sim_pool.c */

void wake_locked(struct node *nd);
void wake(struct node *nd);
void *timer_main(void *arg);
void *round_main(void *arg);
void *ka_main(void *arg);

/* -------------------------------------------------------- sim_measure.c */

extern int etcd_pid;
extern struct net_http *metrics_http;

struct cost daemon_cost(void);
void counts_line(char *buf, size_t cap);
void counts_window(bool target);
void take(struct snapshot *s);
json_t *diff(const struct snapshot *a, const struct snapshot *b);

/* ----------------------------------------------------------- sim_proc.c */

extern struct child *children;
extern int nchildren;
extern struct net_etcd *main_etcd;

void broadcast_send(const char *cmd);
void broadcast_recv(int64_t *c);
void broadcast(const char *cmd, int64_t *c);
char *config_text(int64_t version, int nnodes);
void put_first(struct net_etcd *e);
void start_slice(void);
void *register_main(void *arg);
void sync_slice(void);
int64_t mirror_events(struct mlfs_mirror *m);
void watchdog_start(void);
void watchdog_end(void);
void stop_slice(void);
int child_main(void);
void child_start(struct child *c, char **base, int nbase, int lo, int hi, int glo, int ghi);

#endif
