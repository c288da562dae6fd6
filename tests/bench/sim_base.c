/*
 * sim_base.c - the simulator's basics (sim_control.c's DESIGN block has
 * the model): clocks, errors, the counts every process keeps, a node by
 * index or id, the etcd and peer clients, and the attempts that the
 * views share (parsed once per revision).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "tests/bench/sim_i.h"

/* ---------------------------------------------------------------- time */

int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Wall-clock ns: comparable across the processes of one run. */
int64_t wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t wall_ms(void)
{
	return wall_ns() / 1000000;
}

void nap_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "sim_control: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		die("out of memory");
	return p;
}

/* ------------------------------------------------------------- counters */

_Atomic int64_t counts[NC];

/* This process's simulation (struct sim, sim_i.h). */
struct sim S;

void c_add(int k, int64_t v)
{
	atomic_fetch_add(&counts[k], v);
}

void c_max(int k, int64_t v)
{
	int64_t m = atomic_load(&counts[k]);
	while (v > m && !atomic_compare_exchange_weak(&counts[k], &m, v))
		;
}

void c_min(int k, int64_t v)
{
	int64_t m = atomic_load(&counts[k]);
	while ((m == 0 || v < m) && !atomic_compare_exchange_weak(&counts[k], &m, v))
		;
}

/* --------------------------------------------------------------- model */

struct node *node_at(int i)
{
	return i >= S.lo && i < S.hi ? &S.nodes[i - S.lo] : NULL;
}

/* The index of node id "n<i>" (@len bytes), or -1. */
int node_index(const char *id, size_t len)
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

bool bit(const uint8_t *b, int i)
{
	return b && (b[i >> 3] >> (i & 7) & 1);
}

/* ------------------------------------------------------------- clients */

struct net_etcd *client_with(int timeout_ms, int deadline_ms)
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
struct net_etcd *client(void)
{
	return client_with(2000, 5000);
}

/* A client with mlfs_peerclient_new's options (its token in every
 * request's header), for a round worker's votes to n0's peer server. */
struct net_http *vote_client(void)
{
	char hdr[80];
	const char *headers[] = {hdr, NULL};
	struct net_http *h;
	struct ptc_error err;
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", S.token);
	struct net_http_opts o = {
	    .retries = 2, .timeout_ms = 10000, .deadline_ms = 120000, .headers = headers};
	if (net_http_new(&o, &h, &err))
		die("%s", err.text);
	return h;
}

void name(char *buf, size_t cap, const char *fmt, ...)
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

struct att *att_ref(struct att *a)
{
	if (a) {
		pthread_mutex_lock(&S.att_lock);
		a->refs++;
		pthread_mutex_unlock(&S.att_lock);
	}
	return a;
}

void att_put(struct att *a)
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
struct att *att_get(const char *raw, size_t len, int64_t mod)
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
	/* mlfs_jobkeys.c's parse: the packed ranges expanded */
	const char *packed = json_string_value(json_object_get(j, "participants"));
	json_t *ids = packed ? mlfs_ids_unpack(packed, &S.cl, &(struct ptc_error){0}) : NULL;
	json_array_foreach(ids, k, p)
	{
		const char *s = json_string_value(p);
		int i = s ? node_index(s, strlen(s)) : -1;
		if (i >= 0)
			a->parts[i >> 3] |= (uint8_t)(1u << (i & 7));
	}
	json_decref(ids);
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
