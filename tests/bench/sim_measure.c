/*
 * sim_measure.c - what is measured: the daemon's round CPU at this N
 * (daemon_cost, on a copy of that code), etcd's CPU, memory and
 * /metrics, this process's counts as a line, and a window's figures as
 * the JSON of sim_control.c's output.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

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
 *   att:   the attempt copied and parsed (while one is in etcd), its
 *          participants' ranges expanded (mlfs_ids_unpack);
 *   ids:   the snapshot's index of the nodes (mlfs_snap_index) and every
 *          id of an N-id list found in it (mlfs_snap_find): paid once for
 *          the attempt's participants, once for swap_wait after a commit;
 *   votes: the coordinator's: mlfs_votebox_copy of its box (a vote of
 *          every node, the real box) and each vote's node found in the
 *          index (votes_on).
 */
struct cost daemon_cost(void)
{
	size_t n = (size_t)S.n, k = 0, nplen = strlen(S.nprefix);
	struct net_etcd_kv *kv = xcalloc(2, sizeof(*kv)), *ek = xcalloc(n, sizeof(*ek));
	struct mlfs_votebox *box;
	char key[256];
	struct node tmp = {0};
	json_t *parts = json_array();
	struct cost best = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
	struct mlfs_snap_node *sn = xcalloc(n, sizeof(*sn));
	struct mlfs_snap_key *keys = xcalloc(n, sizeof(*keys));

	for (size_t i = 0; i < n; i++)
		json_array_append_new(parts, json_string(S.ids[i]));
	char *packed = mlfs_ids_pack(parts, &S.cl);
	json_decref(parts);
	parts = json_string(packed ? packed : "");
	free(packed);
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
	if (mlfs_votebox_new(&box))
		die("out of memory");
	for (size_t i = 0; i < n; i++)
		if (mlfs_votebox_put(box, S.ids[i], 2, "0123456789abcdef", "ready"))
			die("out of memory");
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
		const char *pk = json_string_value(json_object_get(aj, "participants"));
		json_t *ps = pk ? mlfs_ids_unpack(pk, &S.cl, &(struct ptc_error){0}) : NULL;
		double t3 = cpu_ns();
		/* the snapshot: its index of the nodes, each listed id marked */
		for (size_t i = 0; i < n; i++)
			sn[i] = (struct mlfs_snap_node){.id = S.ids[i]};
		mlfs_snap_index(sn, (int)n, keys);
		size_t q;
		json_t *pid;
		json_array_foreach(ps, q, pid)
		{
			int x = mlfs_snap_find(keys, (int)n, json_string_value(pid),
					       strlen(json_string_value(pid)));
			if (x >= 0)
				sn[x].participant = true;
		}
		for (size_t i = 0; i < n; i++)
			found += sn[i].participant;
		double t4 = cpu_ns();
		struct net_etcd_kv *cv;
		size_t nv;
		if (mlfs_votebox_copy(box, &cv, &nv))
			die("out of memory");
		char pre[32];
		size_t prelen = (size_t)snprintf(pre, sizeof(pre), "%d/", 2);
		for (size_t i = 0; i < nv; i++) { /* votes_on */
			if (strncmp(cv[i].key, pre, prelen) != 0)
				continue;
			int x = mlfs_snap_find(keys, (int)n, cv[i].key + prelen,
					       strlen(cv[i].key + prelen));
			if (x >= 0 && sn[x].participant)
				found += strncmp(cv[i].value, "0123456789abcdef ", 17) == 0;
		}
		double t5 = cpu_ns();
		json_decref(ps);
		json_decref(none);
		json_decref(nodes);
		json_decref(aj);
		net_etcd_kvs_free(c, k);
		net_etcd_kvs_free(ce, n);
		net_etcd_kvs_free(ca, 1);
		net_etcd_kvs_free(cv, nv);
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
	mlfs_votebox_free(box);
	free(att.key);
	free(att.value);
	json_decref(parts);
	free(sn);
	free(keys);
	return best;
}

/* --------------------------------------------------------- measurement */

static const char *const req_names[NREQ] = {"range",	 "put",	   "txn",  "grant",
					    "keepalive", "revoke", "watch"};

int etcd_pid;
struct net_http *metrics_http;

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
 * (what every request is, the daemons' over gRPC) and watch events sent. */
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
void counts_line(char *buf, size_t cap)
{
	size_t o = 0;
	atomic_store(&counts[C_CPU_US], (int64_t)(self_cpu_s() * 1e6));
	for (int k = 0; k < NC && o < cap; k++)
		o += (size_t)snprintf(buf + o, cap - o, "%" PRId64 "%s", atomic_load(&counts[k]),
				      k + 1 < NC ? " " : "\n");
}

/* Resets the counts of a window's maxima (and, with @target, of its swaps). */
void counts_window(bool target)
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

void take(struct snapshot *s)
{
	s->t = now_ns();
	broadcast("status\n", s->c);
	s->etcd_cpu = etcd_pid ? proc_cpu_s(etcd_pid) : -1;
	s->etcd_rss_kb = etcd_rss_kb();
	etcd_metrics(&s->etcd_handled, &s->etcd_started, &s->etcd_events);
}

/* The window from @a to @b as a JSON object. */
json_t *diff(const struct snapshot *a, const struct snapshot *b)
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
