/*
 * sim_control.c - the control plane of a job of N nodes, simulated against
 * one real etcd (issue 17, "Scale"): no FUSE, no store, no data; per node
 * the real decision function (cluster/mlfs_decide.c), the real etcd client
 * and watch (net/net_etcd*.c), the real HTTP client, peer server and
 * votebox for the votes (net/net_http.c, net/net_server.c,
 * cluster/mlfs_votebox.c), on the daemon's keys, wake-ups and schedule.
 *
 *   sim_control --etcd http://127.0.0.1:2379 --nodes 1000 [--watches G]
 *       [--idle-seconds 10] [--etcd-pid P] [--job NAME] [--workers R]
 *       [--ka-workers K] [--keepalive-ms MS] [--lease-ttl S] [--timeout S]
 *       [--no-round-delay] [--join-rate NODES_PER_S] [--streams-per-process S]
 *       [--to-nodes K]
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
 * attempt's "step", the mirror's watch before its read), with the
 * attempt's participants packed as index ranges (mlfs_ids_pack), the
 * snapshot's ids indexed (mlfs_snap_index), the lease schedule of
 * mlfs_lease_schedule, and the votes out of etcd (each sent to the
 * coordinator's peer server, POST /v1/vote, into its votebox). Each simulated
 * node is what one daemon's control plane does, with the daemon function
 * it replicates named where it happens below:
 *   - its lease: granted (TTL 5 s; past 1,000 nodes longer, by
 *     mlfs_lease_schedule: 30 s at 10,000) by mlfs_nodeentry_register and
 *     kept alive by its own keep-alive "thread" every 2 s (10 s at 10,000 nodes)
 *     after the previous one answered (mlfs_nodeentry_keepalive_main), one
 *     LeaseKeepAlive call each; etcd saying it expired flags it, and the
 *     next round registers again (mlfs_decide's REGISTER); its entry is
 *     /mlfs-nodes/<job>/<id>, bound to the lease;
 *   - what it watches (mlfs_cluster.c's two mirrors): /mlfs/<job>/
 *     always, one watch per node (c->mirror: mlfs_mirror.c's order, a
 *     watch from now, its "created" awaited, one range, the events that
 *     came meanwhile applied when newer than the range; afterwards only
 *     events newer than the mirror's revision), every event and the
 *     watch's end waking the node (keys_changed); /mlfs-nodes/<job>/ only
 *     while need_peers() holds (c->peers: it builds (c->proposing: from
 *     its proposal's read on, so that the watch is live before the
 *     attempt exists) or coordinates an attempt; it made the last commit
 *     and waits for every participant's swap to announce it; its retained
 *     layout waited 2 s for the announcement), a put, delete or the
 *     watch's end waking it only while it coordinates or waits for swaps
 *     (peers_changed). It is started when needed and stopped
 *     (mlfs_mirror_stop) at the first round that no longer needs it. n0's
 *     entries are followed by the real mlfs_mirror (init/sync/copy/stop,
 *     the changed(arg) hook); any other node's, in the 2 s fallback, by a
 *     copy of its order that keeps per entry only what the decision reads;
 *   - its vote (mlfs_attempt.c's vote), on no etcd key: a participant
 *     other than the coordinator sends it to the coordinator's peer server
 *     (mlfs_peerclient.c's mlfs_peer_vote: POST /v1/vote {"node", "to",
 *     "attempt", "vote"} with net_http_post_json, "Authorization: Bearer
 *     <token>", a 2 s deadline, idempotent) from the worker thread that
 *     runs its round; n0 runs a real net_server (mlfs_peer_start's: 4
 *     threads, 4 KiB bodies) whose handler is the daemon's
 *     mlfs_vote_serve (the vote read and checked, put into n0's real
 *     votebox); n0's own vote goes straight into its
 *     box. Every put wakes n0 (the box's hook, votes_changed); n0's rounds,
 *     while it coordinates, decide on mlfs_votebox_copy of its box (votes_on:
 *     keys "<to>/<id>", a vote counting only for the attempt it names); the
 *     box is not cleared at the commit. A vote that failed is said (counted:
 *     "votes_http_failed"), and the node votes again at its next round
 *     (1 s later while an attempt is in etcd);
 *   - its rounds (mlfs_cluster.c's round_once, mlfs_attempt.c's
 *     mlfs_attempt_round): the mirrors synced or stopped as above (and, at
 *     its first round, its saved/<id> mark read: one get), a snapshot of
 *     its views and of its (simulated) store handed to the real
 *     mlfs_decide (nodes_known: it follows the entries; released: the
 *     "released" key), the actions carried out with the daemon's requests
 *     (etcd's, and the vote's POST), then its entry put when what it says
 *     changed
 *     (mlfs_nodeentry_publish: settled states only). A round runs when
 *     woken (as above; its store's state changing, the store's
 *     reconf_changed hook: a prepare starting or done, a commit, a
 *     discard; its lease expired) or when its nap ends (mlfs_cluster.c's
 *     nap_ms: until 2 s after its swap while the retained layout waits for
 *     the announcement, then 1 s; 1 s while an attempt is in etcd; 30 s
 *     otherwise);
 *   - each node's swap acked the same way ("swapped", mlfs_attempt.c's
 *     swap_ack) to the coordinator, whose rounds count an ack as an entry
 *     at the new version (acks_on); the node's entry put waits for the
 *     "released" announcement (then mlfs_publish_delay_ms), or for the
 *     2 s release wait; one whose ack was not taken puts it at once
 *     ("acks_failed");
 *   - rule 8: the coordinator of the commit, following the entries and the
 *     acks, sees every participant serve the new version, puts /mlfs/<job>/released
 *     = "2" (ANNOUNCE_RELEASED, mlfs_attempt.c's act_announce) and drops
 *     its retained layout; every other node drops its own on that event,
 *     reading no entry (the daemon at its next round instead, within a
 *     second: the event wakes no daemon, mlfs_cluster.c's released_put; so
 *     "commit_to_last_release_s" is when the daemons could release, the
 *     event's arrival); a node still waiting 2 s after its swap follows
 *     the entries itself (and, seeing every swap before the announcement,
 *     announces too);
 *   - the coordinator (n0): mlfs_propose.c's propose_config (one read of
 *     the job as mlfs_jobkeys_read makes it: a range of the job's keys and
 *     one of the entries; the attempt built with every live node a
 *     participant and the agreed "step", created by one transaction that
 *     puts it and nothing else), its commit transaction exactly as
 *     mlfs_attempt.c's finish() writes it (config, config_id, the attempt
 *     deleted, result/2: no vote to delete).
 * The etcd requests of one reconfiguration, by the code above: no node
 * puts its entry: each swap ack carries the node's new entry to the
 * coordinator, whose announcement puts them all in its transaction (up to
 * MLFS_ANNOUNCE_ENTRIES_MAX, 100; past it "released" alone, then each
 * node's put: N more); its vote and its swap ack are no etcd request. The
 * coordinator reads the job and the entries (2 ranges), follows the
 * entries (a watch and its range) from its proposal until it announces,
 * creates the attempt (txn), commits (txn) and announces (txn): 7 (ranges
 * 3, txns 3, watches 1; N + 7 past 100 nodes: puts N + 1, txns 2).
 * Besides etcd, N - 1 vote POSTs and N - 1 swap acks reach n0's peer
 * server (n0's own are no request; "peer_server_requests"), and its box
 * gets N votes and N acks ("votes_received", "acks"). Each node that falls back after 2 s adds a
 * watch and a range of N entries, and a put when it announces. Watch events: 6 per job watch (the
 * attempt; the commit's config, config_id, attempt and result/2; "released"): 6N in all. The
 * entries' puts come with the announcement, which no job watch sees (the
 * coordinator's entries watch may, as it stops); its entries range (before
 * the attempt existed) read every entry at version 1. No vote or ack
 * among them, no passing states.
 *
 * How a simulated node differs from a daemon:
 *   - the daemon's CPU. A round's CPU in the daemon (mirror copy of the
 *     job's keys, of every entry and their parse while it follows them,
 *     the snapshot's index of the nodes and the participants, swap_wait
 *     and the coordinator's votes found in it: N log N) is spent
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
 *     own etcd client, and each round worker with its own HTTP client to
 *     n0's peer server (its votes); a daemon has its control and
 *     keep-alive threads, one etcd client and one peer client. So etcd
 *     sees fewer connections here and the same requests, except that when
 *     K keep-alives are in flight the next waits in the simulator's queue,
 *     where a daemon's would be sent and wait in etcd
 *     ("keepalive_gap_max_s" says how long a node went between two); and
 *     n0's peer server sees at most R connections, where a coordinating
 *     daemon gets one from each of the N - 1 others (up to the server's
 *     limit, 1,024, the same here). A
 *     process holds at most --streams-per-process watches (3 descriptors
 *     each, under this machine's 20,000 open files): above that the nodes
 *     are split across processes (this program again, --child), which
 *     meet only in etcd and n0's peer server (its URL and token on their
 *     command line), as daemons do, and report their counts to the first;
 *   - n0's peer server runs in the first process, beside the nodes it
 *     simulates, and serves the votes only; its handlers' CPU is spent
 *     here (the real code), not waited as a round's is;
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
 *     coordinator's control thread, as in the daemon). It runs in n0's
 *     round, and starts following the entries (their watch and read)
 *     between its read and the attempt's creation, in sequence, where the
 *     daemon's control thread does so while its I/O worker builds the
 *     attempt.
 * --watches G < N shares watch streams: G streams, each the view of N / G
 * nodes. That is NOT what the daemon does (the output says
 * "one_watch_per_node": false); it shows what etcd's fan-out costs. So do
 * --keepalive-ms and --lease-ttl other than the daemon's at this N
 * (mlfs_lease_schedule: 1000 and 5 up to 1,000 nodes) ("daemon_schedule":
 * false).
 *
 * Not simulated: the job's cluster.json key and joins, saved/<id> puts and
 * step writes, job/ staging, backups ("replicas", which makes need_peers()
 * hold all the time), /v1/health, peers' HTTP but the votes, status.json
 * and mlfs snapshot (which read the entries when the node does not follow
 * them).
 *
 * The code: this file is the driver (usage, the run's steps, the JSON
 * output); sim_i.h lists the others (the views, a node's rounds, the
 * coordinator, the workers, the measures, the processes).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

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

/* ... and every entry put at the new version (after the release). */
static bool all_published(const int64_t *c)
{
	return (c[C_RELEASED] >= S.n && c[C_PUBLISHED] >= S.n) || c[C_DISCARDS] > 0;
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
		"       [--join-rate NODES_PER_S] [--streams-per-process S] [--to-nodes K]\n");
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
		else if (strcmp(a, "--to-nodes") == 0)
			S.to_nodes = atoi(v);
		else if (strcmp(a, "--streams-per-process") == 0)
			per_process = atoi(v);
		else if (strcmp(a, "--child") == 0)
			child = v;
		else if (strcmp(a, "--vote-url") == 0) /* a child's: n0's peer server */
			snprintf(S.vote_url, sizeof(S.vote_url), "%s", v);
		else if (strcmp(a, "--vote-token") == 0) /* ... and its token */
			snprintf(S.token, sizeof(S.token), "%s", v);
		else if (strcmp(a, "--cost") == 0) /* a child's: the first's measure */
			sscanf(v, "%" SCNd64 ":%" SCNd64 ":%" SCNd64 ":%" SCNd64 ":%" SCNd64,
			       &cost_ns[0], &cost_ns[1], &cost_ns[2], &cost_ns[3], &cost_ns[4]);
		else
			usage();
	}
	if (!S.url || S.n < 2 || S.n > 1000000 || per_process < 1)
		usage();
	snprintf(S.prefix, sizeof(S.prefix), MLFS_KEYS_JOB, S.job);
	snprintf(S.nprefix, sizeof(S.nprefix), MLFS_KEYS_NODES, S.job);
	int ttl_d, ka_d; /* the daemon's at this N (mlfs_nodeentry.c) */
	mlfs_lease_schedule(S.n, &ttl_d, &ka_d);
	if (S.ka_ms <= 0)
		S.ka_ms = ka_d;
	if (S.ttl <= 0)
		S.ttl = ttl_d;
	if (S.ngroups <= 0 || S.ngroups > S.n)
		S.ngroups = S.n; /* the daemon's: one watch per node */
	S.per = (S.n + S.ngroups - 1) / S.ngroups;
	S.ngroups = (S.n + S.per - 1) / S.per;
	/* Workers (a connection to etcd each, and a round worker's to n0's peer
	 * server): one of each kind per node up to 1,000 nodes (2,000 for
	 * keep-alives); above, 1,000 for rounds and 2,000 for keep-alives in
	 * all (--workers, --ka-workers: per process). Processes: at most
	 * --streams-per-process watches each, and 16,000 descriptors (3 per
	 * watch, 1 per keep-alive worker, 2 per round worker and 1 for its
	 * connection's other end in n0's server). */
	int rtotal = S.n < 1000 ? S.n : 1000;
	int ktotal = S.n < 2000 ? S.n : 2000;
	int nproc = (S.ngroups + per_process - 1) / per_process;
	int nfd = (3 * S.ngroups + 3 * rtotal + ktotal + 15999) / 16000;
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
	S.cl.nnodes = S.n;
	S.cl.nodes = xcalloc((size_t)S.n, sizeof(*S.cl.nodes));
	for (int i = 0; i < S.n; i++) {
		snprintf(S.ids[i], sizeof(S.ids[i]), "n%d", i);
		S.cl.nodes[i].id = S.ids[i];
	}
	snprintf(S.schema, sizeof(S.schema),
		 "{\"model\":\"tiny\",\"num_layers\":2,\"states\":{\"model\":{}},\"tensors\":["
		 "{\"name\":\"layers/{L}/w\",\"dtype\":\"float32\",\"shape\":[64,64],"
		 "\"split\":{\"dim\":0}}]}");
	S.config1 = config_text(1, S.n);
	if (S.to_nodes <= 0 || S.to_nodes > S.n)
		S.to_nodes = (S.n + 1) / 2;
	S.config2 = config_text(2, S.to_nodes);
	main_etcd = client();
	int rc = 1;
	if (child) {
		if (!S.vote_url[0] || strlen(S.token) < 16)
			usage();
		S.cost = (struct cost){cost_ns[0], cost_ns[1], cost_ns[2], cost_ns[3], cost_ns[4]};
		rc = child_main();
		goto end;
	}

	struct ptc_error err;
	if (net_http_new(NULL, &metrics_http, &err))
		die("%s", err.text);
	S.cost = daemon_cost();
	/* the coordinator's client and entries mirror; its votebox and peer
	 * server, which every process's nodes send their votes to */
	S.cetcd = client();
	if (mlfs_mirror_init(&S.peers, S.cetcd, S.nprefix, n0_peers_changed, NULL))
		die("mirrors");
	votes_serve();
	S.n0_here = true;
	double coord_ms =
	    (double)(S.cost.base + S.cost.peers + S.cost.att + S.cost.ids + S.cost.votes) / 1e6;
	fprintf(stderr,
		"sim_control: %d nodes, %d watch streams (%d nodes each) in %d processes, "
		"%d round and %d keep-alive workers here; a daemon's round: %.2f ms, with an "
		"attempt %.2f ms, coordinating %.2f ms; etcd %s; n0's votes %s\n",
		S.n, S.ngroups, S.per, nproc, S.nworkers, S.nka, (double)S.cost.base / 1e6,
		(double)(S.cost.base + S.cost.att + S.cost.ids) / 1e6, coord_ms, S.url, S.vote_url);

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
	/* the daemon's: a watch per node, a keep-alive every 2 s on a 6 s TTL */
	json_object_set_new(out, "daemon_schedule",
			    json_boolean(S.per == 1 && S.ka_ms == ka_d && S.ttl == ttl_d));
	json_object_set_new(out, "round_delay", json_boolean(S.delay));
	json_object_set_new(out, "join_rate", json_integer(S.join_rate));
	json_object_set_new(out, "to_nodes", json_integer(S.to_nodes));
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
	    kw_s[16], ttl_s[16], to_s[16];
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
	snprintf(to_s, sizeof(to_s), "%d", S.to_nodes);
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
			ttl_s,	       "--to-nodes",
			to_s,	       "--vote-url",
			S.vote_url,    "--vote-token",
			S.token,       "--no-round-delay"};
	int nbase = S.delay ? 29 : 30; /* all of @base, but its last without --no-round-delay */
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
	int64_t pm_events0 = mirror_events(&S.peers);
	take(&s3);
	node_at(0)->propose_pending = true;
	wake(node_at(0));
	ok = wait_for(all_released, timeout_s, "reconfiguration") &&
	     wait_for(all_published, timeout_s, "the entries after the release");
	take(&s4);
	json_t *rec = diff(&s3, &s4);
	/* the commit: when its transaction was sent (etcd applied it before
	 * its answer, which some nodes' swaps precede) */
	int64_t created = atomic_load(&S.created_wall), commit = atomic_load(&S.commit_sent_wall);
	const int64_t *c = s4.c;
	json_object_set_new(rec, "committed", json_boolean(commit != 0));
	json_object_set_new(rec, "votes", json_integer(c[C_VOTES]));
	/* what n0's box got (its server's and its own), the POSTs that failed */
	json_object_set_new(rec, "votes_received", json_integer(c[C_VOTES_RECEIVED]));
	json_object_set_new(rec, "votes_http_failed", json_integer(c[C_VOTES_HTTP_FAILED]));
	/* the swap acks n0's box took, and those it did not */
	json_object_set_new(rec, "acks", json_integer(c[C_ACKS]));
	json_object_set_new(rec, "acks_failed", json_integer(c[C_ACKS_FAILED]));
	/* what n0's peer server received: the other nodes' votes and swap
	 * acks (the token missing or wrong: refused) */
	int64_t posts, refused;
	net_server_counts(S.server, &posts, &refused);
	json_object_set_new(rec, "peer_server_requests", json_integer(posts));
	json_object_set_new(rec, "peer_server_refused", json_integer(refused));
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
	int64_t entries_ev =
	    mirror_events(&S.peers) - pm_events0 + c[C_EN_EVENTS] - s3.c[C_EN_EVENTS];
	/* the nodes' entries: who followed them (n0, and any node whose 2 s
	 * ran out), what their ranges read and their watches got */
	json_object_set_new(rec, "announced", json_integer(c[C_ANNOUNCED]));
	json_object_set_new(rec, "entries_follows", json_integer(c[C_FOLLOWS]));
	json_object_set_new(rec, "entries_follows_fallback", json_integer(c[C_FALLBACKS]));
	json_object_set_new(rec, "entries_read", json_integer(c[C_EN_READ] - s3.c[C_EN_READ]));
	json_object_set_new(rec, "entries_watch_events", json_integer(entries_ev));
	json_object_set_new(rec, "watch_events_all",
			    json_integer(s4.c[C_EVENTS] - s3.c[C_EVENTS] + entries_ev));
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
