/*
 * mlfs_mirror.c - the job's etcd keys in memory: one range read, then a
 * watch that applies every put and delete as it happens.
 *
 * DESIGN
 * The control thread reads the job's keys at every round; reading them
 * from etcd each time (and polling for changes) made an idle job of N
 * nodes cost etcd N ranges every few milliseconds. The mirror reads them
 * once (a range at revision R) and then follows a watch from R + 1, so
 * nothing between the two is missed and an idle job costs etcd nothing
 * (the lease keep-alives aside). A change wakes the control thread
 * (@changed), at once when it may need a decision (anything but another
 * node's entry or saved mark; a node coming or going matters to a
 * coordinator only). When the watch's stream ends (etcd restarted or
 * gone, a compaction) the mirror is no longer live: the next
 * mlfs_mirror_sync reads the keys again and starts a new watch; until
 * then the control thread treats etcd as unreachable and decides nothing.
 * A coordinator follows the votes with a second mirror (c->votes, on
 * their own prefix), started when it creates an attempt and stopped
 * (mlfs_mirror_stop) when it no longer coordinates.
 *
 * Threads: the watch's thread applies events; the control thread syncs
 * and copies. m->lock guards the keys, the revision and the state; it is
 * a leaf, never held across I/O.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_i.h"

/* The index of @key in the sorted keys, or where it would go (*@found). */
static size_t find(const struct mlfs_mirror *m, const char *key, bool *found)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(m->kvs[mid].key, key);
		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

static void kv_release(struct net_etcd_kv *kv)
{
	free(kv->key);
	free(kv->value);
	memset(kv, 0, sizeof(*kv));
}

/* A copy of @src into *@dst (key and value new buffers, the value
 * NUL-terminated): 0 or -ENOMEM (nothing to free then). */
static int kv_copy(struct net_etcd_kv *dst, const struct net_etcd_kv *src)
{
	*dst = *src;
	dst->key = strdup(src->key);
	dst->value = malloc(src->len + 1);
	if (!dst->key || !dst->value) {
		free(dst->key);
		free(dst->value);
		return -ENOMEM;
	}
	memcpy(dst->value, src->value, src->len);
	dst->value[src->len] = '\0';
	return 0;
}

/* Applies one event. Lock held. 0 or -ENOMEM (the mirror is then stale:
 * the caller ends it, and the next sync reads every key again). */
static int apply(struct mlfs_mirror *m, const struct net_etcd_event *ev)
{
	bool found;
	size_t i = find(m, ev->kv.key, &found);

	if (ev->deleted) {
		if (found) {
			kv_release(&m->kvs[i]);
			memmove(&m->kvs[i], &m->kvs[i + 1], (m->n - i - 1) * sizeof(*m->kvs));
			m->n--;
		}
		return 0;
	}
	struct net_etcd_kv kv;
	if (kv_copy(&kv, &ev->kv))
		return -ENOMEM;
	if (found) {
		kv_release(&m->kvs[i]);
		m->kvs[i] = kv;
		return 0;
	}
	if (m->n == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 64;
		struct net_etcd_kv *a = realloc(m->kvs, cap * sizeof(*a));
		if (!a) {
			kv_release(&kv);
			return -ENOMEM;
		}
		m->kvs = a;
		m->cap = cap;
	}
	memmove(&m->kvs[i + 1], &m->kvs[i], (m->n - i) * sizeof(*m->kvs));
	m->kvs[i] = kv;
	m->n++;
	return 0;
}

static void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct mlfs_mirror *m = arg;
	int rc = 0;
	/* Whether a round must run now: for any node, a change to anything
	 * but the nodes' entries and saved marks, and the stream's end
	 * (MLFS_MIRROR_URGENT); for a coordinator, also a node coming or going
	 * (MLFS_MIRROR_VOTES; the votes themselves are in c->votes). A node's
	 * entry changing its version, state or steps needs no decision at once. */
	int urgent = n == 0 && revision < 0 ? MLFS_MIRROR_URGENT : 0;
	size_t plen = strlen(m->prefix);
	for (size_t i = 0; i < n; i++) {
		const char *name = ev[i].kv.key + (strlen(ev[i].kv.key) >= plen ? plen : 0);
		if (strncmp(name, "nodes/", 6) == 0 && (ev[i].deleted || ev[i].kv.version == 1))
			urgent |= MLFS_MIRROR_VOTES;
		else if (strncmp(name, "nodes/", 6) && strncmp(name, "saved/", 6))
			urgent |= MLFS_MIRROR_URGENT;
	}

	pthread_mutex_lock(&m->lock);
	if (n == 0 && revision < 0) {
		m->live = false;
		snprintf(m->error, sizeof(m->error), "the watch of the job's keys ended: %s",
			 strerror((int)-revision));
	}
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = apply(m, &ev[i]);
	if (rc) {
		m->live = false;
		snprintf(m->error, sizeof(m->error), "the job's keys: out of memory");
	} else if (revision > m->revision) {
		m->revision = revision;
	}
	m->events += n;
	pthread_mutex_unlock(&m->lock);
	if (m->changed)
		m->changed(m->arg, urgent);
}

int mlfs_mirror_init(struct mlfs_mirror *m, struct net_etcd *etcd, const char *prefix,
		     void (*changed)(void *arg, int urgent), void *arg)
{
	memset(m, 0, sizeof(*m));
	if (strlen(prefix) >= sizeof(m->prefix))
		return -EINVAL;
	snprintf(m->prefix, sizeof(m->prefix), "%s", prefix);
	m->etcd = etcd;
	m->changed = changed;
	m->arg = arg;
	pthread_mutex_init(&m->lock, NULL);
	return 0;
}

void mlfs_mirror_release(struct mlfs_mirror *m)
{
	net_etcd_watch_stop(m->watch);
	for (size_t i = 0; i < m->n; i++)
		kv_release(&m->kvs[i]);
	free(m->kvs);
	pthread_mutex_destroy(&m->lock);
}

void mlfs_mirror_stop(struct mlfs_mirror *m)
{
	net_etcd_watch_stop(m->watch); /* its thread ends first */
	m->watch = NULL;
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->n; i++)
		kv_release(&m->kvs[i]);
	m->n = 0;
	m->live = false;
	snprintf(m->error, sizeof(m->error), "stopped");
	pthread_mutex_unlock(&m->lock);
}

int mlfs_mirror_sync(struct mlfs_mirror *m, struct ptc_error *err)
{
	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev;
	int rc;

	pthread_mutex_lock(&m->lock);
	bool live = m->live;
	pthread_mutex_unlock(&m->lock);
	if (live)
		return 0;
	/* The old watch ended (or there was none): read every key again, then
	 * watch from the revision after that read. */
	net_etcd_watch_stop(m->watch);
	m->watch = NULL;
	if ((rc = net_etcd_range(m->etcd, m->prefix, true, &kvs, &n, &rev, NULL, err)))
		return rc;
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->n; i++)
		kv_release(&m->kvs[i]);
	free(m->kvs);
	m->kvs = kvs; /* sorted: etcd returns a range in key order */
	m->n = m->cap = n;
	m->revision = rev;
	m->live = true; /* before the watch: its end, if at once, is not lost */
	m->error[0] = '\0';
	m->ranges++;
	pthread_mutex_unlock(&m->lock);
	if ((rc = net_etcd_watch_start(m->etcd, m->prefix, rev + 1, on_watch, m, &m->watch, err))) {
		pthread_mutex_lock(&m->lock);
		m->live = false;
		pthread_mutex_unlock(&m->lock);
	}
	return rc;
}

int mlfs_mirror_copy(struct mlfs_mirror *m, struct net_etcd_kv **out, size_t *nout,
		     int64_t *revision, struct ptc_error *err)
{
	int rc = 0;

	*out = NULL;
	*nout = 0;
	pthread_mutex_lock(&m->lock);
	if (!m->live) {
		rc = ptc_error_set(err, -EIO, "etcd: %s", m->error[0] ? m->error : "not read yet");
		goto out;
	}
	struct net_etcd_kv *a = calloc(m->n ? m->n : 1, sizeof(*a));
	if (!a) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < m->n; i++) {
		if (kv_copy(&a[i], &m->kvs[i])) {
			net_etcd_kvs_free(a, i);
			rc = -ENOMEM;
			goto out;
		}
	}
	*out = a;
	*nout = m->n;
	*revision = m->revision;
out:
	pthread_mutex_unlock(&m->lock);
	return rc;
}
