/*
 * mlfs_srccache.c - the block cache of a dataset source.
 *
 * Blocks keyed by (object, block index) in a hash table and an LRU list.
 * Invariant: cached_bytes, the sum of the cached blocks' lengths, never
 * exceeds cache_bytes. Blocks are reference-counted: the cache holds one
 * reference and a readv copying from a block another, so an eviction never
 * frees bytes being copied. A block enters the cache only complete and
 * verified (mlfs_srcreadv.c inserts it once its request succeeded), and a
 * block larger than the whole cache never enters it.
 *
 * Threads: the table, the list and the counters are under s->lock; block
 * bytes are copied without it (the reference keeps them).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "dataset/dataset_i.h"

/* Initial size of the block table (a power of two). */
#define SRC_BLK_BUCKETS 1024

static uint64_t hash_blk(const struct src_obj *o, int64_t idx)
{
	uint64_t h = o->hash ^ ((uint64_t)idx * 0x9e3779b97f4a7c15ULL);

	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 32);
}

struct src_blk *mlfs_srcblk_new(struct src_obj *o, int64_t idx, int64_t len)
{
	struct src_blk *b = malloc(sizeof(*b) + (size_t)len);

	if (!b)
		return NULL;
	b->hnext = b->prev = b->next = NULL;
	b->obj = o;
	b->idx = idx;
	b->len = len;
	atomic_init(&b->refs, 1);
	return b;
}

/* Drops a reference; true when it was the last (the caller frees). */
static bool blk_unref(struct src_blk *b)
{
	return atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1;
}

/* Lock held. */
static struct src_blk *cache_find(struct mlfs_src *s, struct src_obj *o, int64_t idx)
{
	struct src_blk *b = s->blks[hash_blk(o, idx) & (s->nblk_buckets - 1)];

	while (b && (b->obj != o || b->idx != idx))
		b = b->hnext;
	return b;
}

static void lru_unlink(struct src_blk *b)
{
	b->prev->next = b->next;
	b->next->prev = b->prev;
}

static void lru_push(struct mlfs_src *s, struct src_blk *b)
{
	b->prev = &s->lru;
	b->next = s->lru.next;
	s->lru.next->prev = b;
	s->lru.next = b;
}

/* Lock held. */
static void cache_table_grow(struct mlfs_src *s)
{
	size_t nb = s->nblk_buckets * 2;
	struct src_blk **t = calloc(nb, sizeof(*t));

	if (!t)
		return; /* chains just grow longer */
	for (size_t i = 0; i < s->nblk_buckets; i++) {
		for (struct src_blk *b = s->blks[i], *next; b; b = next) {
			next = b->hnext;
			size_t k = hash_blk(b->obj, b->idx) & (nb - 1);
			b->hnext = t[k];
			t[k] = b;
		}
	}
	free(s->blks);
	s->blks = t;
	s->nblk_buckets = nb;
}

/* Lock held. Removes @b from the table and list; returns it when unreferenced. */
static struct src_blk *cache_remove(struct mlfs_src *s, struct src_blk *b)
{
	struct src_blk **pp = &s->blks[hash_blk(b->obj, b->idx) & (s->nblk_buckets - 1)];

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	lru_unlink(b);
	s->cached_bytes -= b->len;
	s->cached_blocks--;
	return blk_unref(b) ? b : NULL;
}

void mlfs_srcblk_put(struct src_blk *b)
{
	if (blk_unref(b))
		free(b);
}

struct src_blk *mlfs_srccache_pin(struct mlfs_src *s, struct src_obj *o, int64_t idx)
{
	struct src_blk *b = cache_find(s, o, idx);

	if (b) {
		atomic_fetch_add(&b->refs, 1);
		lru_unlink(b);
		lru_push(s, b);
	}
	return b;
}

void mlfs_srccache_insert(struct mlfs_src *s, struct src_blk *b)
{
	struct src_blk *dead = NULL, *victim;

	pthread_mutex_lock(&s->lock);
	if (b->len > s->o.cache_bytes || cache_find(s, b->obj, b->idx)) {
		pthread_mutex_unlock(&s->lock);
		free(b); /* too big, or a concurrent readv cached it first */
		return;
	}
	if ((size_t)s->cached_blocks >= s->nblk_buckets * 2)
		cache_table_grow(s);
	size_t k = hash_blk(b->obj, b->idx) & (s->nblk_buckets - 1);
	b->hnext = s->blks[k];
	s->blks[k] = b;
	lru_push(s, b);
	s->cached_bytes += b->len;
	s->cached_blocks++;
	while (s->cached_bytes > s->o.cache_bytes) {
		victim = s->lru.prev;
		assert(victim != &s->lru && victim != b);
		if ((victim = cache_remove(s, victim))) {
			victim->hnext = dead;
			dead = victim;
		}
	}
	pthread_mutex_unlock(&s->lock);
	while (dead) {
		victim = dead;
		dead = dead->hnext;
		free(victim);
	}
}

int mlfs_srccache_init(struct mlfs_src *s)
{
	s->nblk_buckets = SRC_BLK_BUCKETS;
	if (!(s->blks = calloc(s->nblk_buckets, sizeof(*s->blks))))
		return -ENOMEM;
	s->lru.next = s->lru.prev = &s->lru;
	return 0;
}

void mlfs_srccache_release(struct mlfs_src *s)
{
	while (s->lru.next != &s->lru) {
		struct src_blk *b = s->lru.next;
		lru_unlink(b);
		free(b);
	}
	free(s->blks);
	s->blks = NULL;
}
