/*
 * sim_pool.c - the scheduling of the simulated nodes: wake-ups (a
 * round due), the timers (naps, keep-alives, a round's CPU waited), and
 * the two worker pools, the round workers and the keep-alive workers
 * (mlfs_nodeentry_keepalive_main).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/bench/sim_i.h"

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
void wake_locked(struct node *nd)
{
	nd->wake = true;
	if (!nd->queued && !nd->running)
		enqueue_locked(nd);
}

void wake(struct node *nd)
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

void *timer_main(void *arg)
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

void *round_main(void *arg)
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
void *ka_main(void *arg)
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
