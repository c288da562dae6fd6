/*
 * mlfs_mirror.c - the job's etcd keys in memory: one range read, then a
 * watch that applies every put and delete as it happens.
 *
 * DESIGN
 * The control thread reads the job's keys at every round; reading them
 * from etcd each time (and polling for changes) made an idle job of N
 * nodes cost etcd N ranges every few milliseconds. The mirror reads them
 * once and then follows a watch, so an idle job costs etcd nothing (the
 * lease keep-alives aside). The watch comes first: it is started from
 * "now", and once etcd says it is created the keys are read (a range at
 * revision R); the events that arrived meanwhile are kept aside and
 * applied after the read when newer than R, so nothing is missed or
 * applied twice. (A range at R followed by a watch from R + 1, the
 * obvious order, is right too but slow: when anything was put between
 * the two, etcd counts the watch as behind and catches it up only in its
 * sync loop, every 100 ms, delaying every event until then. That cost a
 * coordinator up to 100 ms on every reconfiguration: its watch of the
 * votes, when they were in etcd, started as the votes came in.) A change, or the watch's end, is
 * told to the owner (@changed): the changes of a batch once it is applied, outside libcurl's
 * callbacks (the watch's settled hook), so that the owner may act on them on this thread (the
 * job's mirror runs a round there); puts of a lazy key (mlfs_mirror_lazy: "released") are
 * applied and their value given to @lazy, without @changed. When the watch's stream ends
 * (etcd restarted or gone, a compaction) the mirror is no longer live: the next mlfs_mirror_sync
 * reads the keys again and starts a new watch; until then the control thread treats etcd as
 * unreachable and decides nothing. A node has two (mlfs_cluster.c): the job's keys, always; the
 * nodes' entries, while it needs them, started when needed and stopped (mlfs_mirror_stop) after.
 *
 * Threads: the watch's thread applies events and tells them; the rounds
 * (round_lock) sync and stop; any thread copies. m->lock guards the keys,
 * the revision and the state; it is a leaf, never held across I/O or a
 * call of the owner's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Keeps a copy of @n events @ev for after the read (lock held): 0 or
 * -ENOMEM. */
static int keep(struct mlfs_mirror *m, const struct net_etcd_event *ev, size_t n)
{
	if (m->npend + n > m->pcap) {
		size_t cap = (m->npend + n) * 2;
		struct net_etcd_event *a = realloc(m->pend, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		m->pend = a;
		m->pcap = cap;
	}
	for (size_t i = 0; i < n; i++) {
		m->pend[m->npend].deleted = ev[i].deleted;
		if (kv_copy(&m->pend[m->npend].kv, &ev[i].kv))
			return -ENOMEM;
		m->npend++;
	}
	return 0;
}

static void pend_free(struct mlfs_mirror *m)
{
	for (size_t i = 0; i < m->npend; i++)
		kv_release(&m->pend[i].kv);
	free(m->pend);
	m->pend = NULL;
	m->npend = m->pcap = 0;
}

/* Applies the events newer than the read the keys came from (@m->floor;
 * older ones are in it: the watch started before it, and may deliver
 * them after it); a delete's kv carries the revision of the delete. The
 * keys' revision follows the events applied, not the messages' headers:
 * etcd catching a watch up sends batches that each carry its current
 * revision, ahead of the batches still to come. Lock held. */
static int apply_new(struct mlfs_mirror *m, const struct net_etcd_event *ev, size_t n)
{
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (ev[i].kv.mod_revision <= m->floor)
			continue;
		rc = apply(m, &ev[i]);
		if (ev[i].kv.mod_revision > m->revision)
			m->revision = ev[i].kv.mod_revision;
	}
	return rc;
}

/* Whether @ev is a put of @m's lazy key (mlfs_mirror_lazy). */
static bool lazy_put(const struct mlfs_mirror *m, const struct net_etcd_event *ev)
{
	return m->lazy && !ev->deleted && strcmp(ev->kv.key, m->lazy_key) == 0;
}

static void on_watch(void *arg, const struct net_etcd_event *ev, size_t n, int64_t revision)
{
	struct mlfs_mirror *m = arg;
	int rc = 0;

	pthread_mutex_lock(&m->lock);
	if (n == 0 && revision < 0) {
		m->live = false;
		m->ended = true;
		snprintf(m->error, sizeof(m->error), "the watch of the job's keys ended: %s",
			 revision == -EAGAIN	  ? "the etcd client moved to another member"
			 : revision == -ETIMEDOUT ? "its etcd member did not create it in time"
						  : strerror((int)-revision));
	} else if (n == 0) {
		m->created = true;
	}
	if (m->syncing) /* the keys are being read: after that */
		rc = keep(m, ev, n);
	else
		rc = apply_new(m, ev, n);
	if (rc) {
		m->live = false;
		m->ended = true; /* the sync under way fails too */
		snprintf(m->error, sizeof(m->error), "the job's keys: out of memory");
	}
	m->events += n;
	/* a batch's changes are told when it settled (on_settled); the end
	 * of the watch (outside libcurl's callbacks) at once */
	bool lazy_only = true;
	for (size_t i = 0; i < n; i++)
		lazy_only &= lazy_put(m, &ev[i]);
	if (!m->syncing && n && !lazy_only)
		m->tell = true;
	bool ended = !m->syncing && n == 0 && revision < 0;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	for (size_t i = 0; i < n; i++)
		if (lazy_put(m, &ev[i]))
			m->lazy(m->arg, ev[i].kv.value, ev[i].kv.len);
	if (m->changed && ended)
		m->changed(m->arg);
}

static void on_settled(void *arg)
{
	struct mlfs_mirror *m = arg;

	pthread_mutex_lock(&m->lock);
	bool tell = m->tell;
	m->tell = false;
	pthread_mutex_unlock(&m->lock);
	if (m->changed && tell)
		m->changed(m->arg);
}

int mlfs_mirror_init(struct mlfs_mirror *m, struct net_etcd *etcd, const char *prefix,
		     void (*changed)(void *arg), void *arg)
{
	memset(m, 0, sizeof(*m));
	if (strlen(prefix) >= sizeof(m->prefix))
		return -EINVAL;
	snprintf(m->prefix, sizeof(m->prefix), "%s", prefix);
	m->etcd = etcd;
	m->changed = changed;
	m->arg = arg;
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	return 0;
}

void mlfs_mirror_lazy(struct mlfs_mirror *m, const char *suffix,
		      void (*lazy)(void *arg, const char *value, size_t len))
{
	snprintf(m->lazy_key, sizeof(m->lazy_key), "%s%s", m->prefix, suffix);
	m->lazy = lazy;
}

void mlfs_mirror_release(struct mlfs_mirror *m)
{
	net_etcd_watch_stop(m->watch);
	for (size_t i = 0; i < m->n; i++)
		kv_release(&m->kvs[i]);
	free(m->kvs);
	pend_free(m);
	pthread_cond_destroy(&m->cond);
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

/* Waits (lock held) until etcd created the watch or its stream ended, at
 * most 5 s: 0, or -EIO with @err. */
static int wait_created(struct mlfs_mirror *m, struct ptc_error *err)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += 5;
	while (!m->created && !m->ended)
		if (pthread_cond_timedwait(&m->cond, &m->lock, &t))
			break;
	if (m->created && !m->ended)
		return 0;
	return ptc_error_set(err, -EIO, "etcd: the watch of %s %s", m->prefix,
			     m->ended ? m->error : "was not created within 5 s");
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
	/* The old watch ended (or there was none): watch from now, then read
	 * every key (the DESIGN block says why in this order). */
	net_etcd_watch_stop(m->watch);
	m->watch = NULL;
	pthread_mutex_lock(&m->lock);
	m->syncing = true;
	m->created = m->ended = m->tell = false;
	pend_free(m);
	pthread_mutex_unlock(&m->lock);
	rc = net_etcd_watch_start(m->etcd, m->prefix, 0, on_watch, on_settled, m, &m->watch, err);
	pthread_mutex_lock(&m->lock);
	if (rc == 0)
		rc = wait_created(m, err);
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		rc = net_etcd_range(m->etcd, m->prefix, true, &kvs, &n, &rev, NULL, err);
	pthread_mutex_lock(&m->lock);
	if (rc == 0) {
		for (size_t i = 0; i < m->n; i++)
			kv_release(&m->kvs[i]);
		free(m->kvs);
		m->kvs = kvs; /* sorted: etcd returns a range in key order */
		m->n = m->cap = n;
		m->revision = m->floor = rev;
		if ((rc = apply_new(m, m->pend, m->npend)))
			rc = ptc_error_set(err, rc, "the job's keys: out of memory");
	}
	if (rc == 0 && m->ended) /* it ended while the keys were read */
		rc = ptc_error_set(err, -EIO, "etcd: %s", m->error);
	m->syncing = false;
	pend_free(m);
	m->live = rc == 0;
	if (rc == 0) {
		m->error[0] = '\0';
		m->ranges++;
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}

bool mlfs_mirror_live(struct mlfs_mirror *m)
{
	pthread_mutex_lock(&m->lock);
	bool live = m->live;
	pthread_mutex_unlock(&m->lock);
	return live;
}

int mlfs_mirror_copy(struct mlfs_mirror *m, struct net_etcd_kv **out, size_t *nout,
		     int64_t *revision, struct ptc_error *err)
{
	int rc = 0;

	*out = NULL;
	*nout = 0;
	pthread_mutex_lock(&m->lock);
	if (!m->live) {
		rc = err ? ptc_error_set(err, -EIO, "etcd: %s",
					 m->error[0] ? m->error : "not read yet")
			 : -EIO;
		goto out;
	}
	/* one block: the array, then every key and value (a round copies
	 * them all; one allocation instead of two per key) */
	size_t bytes = (m->n ? m->n : 1) * sizeof(**out);
	for (size_t i = 0; i < m->n; i++)
		bytes += strlen(m->kvs[i].key) + 1 + m->kvs[i].len + 1;
	struct net_etcd_kv *a = malloc(bytes);
	if (!a) {
		rc = -ENOMEM;
		goto out;
	}
	char *p = (char *)(a + (m->n ? m->n : 1));
	for (size_t i = 0; i < m->n; i++) {
		const struct net_etcd_kv *src = &m->kvs[i];
		size_t kl = strlen(src->key) + 1;
		a[i] = *src;
		a[i].key = memcpy(p, src->key, kl);
		p += kl;
		a[i].value = memcpy(p, src->value, src->len);
		p[src->len] = '\0';
		p += src->len + 1;
	}
	*out = a;
	*nout = m->n;
	*revision = m->revision;
out:
	pthread_mutex_unlock(&m->lock);
	return rc;
}
