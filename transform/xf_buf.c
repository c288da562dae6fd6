/*
 * xf_buf.c - the memory bound, reference-counted partition buffers, row copies.
 *
 * A buffer's bytes are reserved from its struct xf_mem before anything is
 * allocated, so the bound holds even when several threads allocate at once:
 * the reservation is a compare-and-swap on the counter, never a check
 * followed by an add. Buffers of XF_MAP_MIN bytes or more are anonymous
 * private mappings: the kernel hands out zero pages lazily, so a large
 * partition that is mostly padding, or that is about to be overwritten,
 * costs nothing until it is written. Smaller ones come from calloc.
 *
 * Checksums: a buffer is written by one owner until it is committed
 * (a write's close, an import, a reconfiguration's build, a backup), then
 * never again: a later write swaps in a new buffer. Its XXH3 is computed
 * (xf_buf_seal) or set from a verified source (xf_buf_set_sum) at that
 * point, before the buffer is published, and kept with it; the peer server
 * sends it with a whole partition, and `mlfs verify` recomputes it. A
 * buffer never sealed (the zero partitions of a fresh layout) gets its
 * checksum at first use; two threads racing there store the same value.
 */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/common.h"
#include "transform/xf.h"

/* Buffers at least this large are anonymous mappings. */
#define XF_MAP_MIN ((int64_t)1 << 20)

/* Raises m->peak to @used if that is more. */
static void note_peak(struct xf_mem *m, int64_t used)
{
	int64_t p = atomic_load_explicit(&m->peak, memory_order_relaxed);
	while (used > p && !atomic_compare_exchange_weak_explicit(
			       &m->peak, &p, used, memory_order_relaxed, memory_order_relaxed))
		;
}

int xf_mem_reserve(struct xf_mem *m, int64_t n)
{
	int64_t cur;

	assert(n >= 0);
	if (!m)
		return 0;
	if (m->limit <= 0) {
		note_peak(m, atomic_fetch_add_explicit(&m->used, n, memory_order_relaxed) + n);
		return 0;
	}
	cur = atomic_load_explicit(&m->used, memory_order_relaxed);
	do {
		/* Written as a subtraction so that a huge @n cannot overflow. */
		if (n > m->limit - cur)
			return -ENOSPC;
	} while (!atomic_compare_exchange_weak_explicit(
	    &m->used, &cur, cur + n, memory_order_relaxed, memory_order_relaxed));
	note_peak(m, cur + n);
	return 0;
}

void xf_mem_release(struct xf_mem *m, int64_t n)
{
	assert(n >= 0);
	if (!m)
		return;
	int64_t old = atomic_fetch_sub_explicit(&m->used, n, memory_order_relaxed);
	assert(old >= n);
	(void)old;
}

static _Atomic uint64_t next_id = 1;

struct xf_buf *xf_buf_new(struct xf_mem *mem, int64_t size, int *rc)
{
	struct xf_buf *b;
	int err;

	if (size < 0 || (uint64_t)size > SIZE_MAX) {
		err = size < 0 ? -EINVAL : -ENOMEM;
		goto err_out;
	}
	if ((err = xf_mem_reserve(mem, size)))
		goto err_out;
	err = -ENOMEM;
	b = calloc(1, sizeof(*b));
	if (!b)
		goto err_release_mem;
	if (size >= XF_MAP_MIN) {
		void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			goto err_free_buf;
		/* Transparent huge pages: one fault per 2 MiB instead of per 4 KiB,
		 * which is most of the cost of filling a fresh buffer. */
		madvise(p, (size_t)size, MADV_HUGEPAGE);
		b->data = p;
		b->mapped = true;
	} else {
		/* Never NULL, even for size 0: memcpy(NULL, ..., 0) is undefined. */
		b->data = calloc(size ? (size_t)size : 1, 1);
		if (!b->data)
			goto err_free_buf;
	}
	atomic_init(&b->refs, 1);
	b->size = size;
	b->mem = mem;
	b->id = atomic_fetch_add(&next_id, 1);
	if (rc)
		*rc = 0;
	return b;

err_free_buf:
	free(b);
err_release_mem:
	xf_mem_release(mem, size);
err_out:
	if (rc)
		*rc = err;
	return NULL;
}

struct xf_buf *xf_buf_get(struct xf_buf *b)
{
	if (b) {
		int old = atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
		assert(old > 0);
		(void)old;
	}
	return b;
}

void xf_buf_put(struct xf_buf *b)
{
	if (!b)
		return;
	int old = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_release);
	assert(old > 0);
	if (old != 1)
		return;
	/* Every other holder's writes happen before the free. */
	atomic_thread_fence(memory_order_acquire);
	if (b->mapped)
		munmap(b->data, (size_t)b->size);
	else
		free(b->data);
	xf_mem_release(b->mem, b->size);
	free(b);
}

int xf_copy_rows_with(uint8_t *dst, int64_t dst_rows, int64_t dst_row, const uint8_t *src,
		      int64_t src_rows, int64_t src_row, int64_t rows, int64_t outer,
		      int64_t row_bytes, xf_copy_fn copy)
{
	int64_t seg = rows * row_bytes;
	int rc = 0;

	if (seg <= 0 || outer <= 0)
		return 0;
	/* Whole partitions of the same shape are one contiguous block. */
	if (rows == dst_rows && rows == src_rows) {
		if (copy)
			return copy(dst, src, (size_t)(outer * seg));
		memcpy(dst, src, (size_t)(outer * seg));
		return 0;
	}
	for (int64_t o = 0; o < outer && rc == 0; o++) {
		uint8_t *d = dst + (o * dst_rows + dst_row) * row_bytes;
		const uint8_t *s = src + (o * src_rows + src_row) * row_bytes;
		if (copy)
			rc = copy(d, s, (size_t)seg);
		else
			memcpy(d, s, (size_t)seg);
	}
	return rc;
}

void xf_copy_rows(uint8_t *dst, int64_t dst_rows, int64_t dst_row, const uint8_t *src,
		  int64_t src_rows, int64_t src_row, int64_t rows, int64_t outer, int64_t row_bytes)
{
	xf_copy_rows_with(dst, dst_rows, dst_row, src, src_rows, src_row, rows, outer, row_bytes,
			  NULL);
}

/* ------------------------------------------------------------- checksums */

void xf_buf_set_sum(struct xf_buf *b, uint64_t sum)
{
	atomic_store_explicit(&b->sum, sum, memory_order_relaxed);
	atomic_store_explicit(&b->summed, true, memory_order_release);
}

void xf_buf_seal(struct xf_buf *b)
{
	xf_buf_set_sum(b, mlfs_hash(b->data, (size_t)b->size));
}

bool xf_buf_sealed(const struct xf_buf *b)
{
	return atomic_load_explicit(&b->summed, memory_order_acquire);
}

uint64_t xf_buf_sum(struct xf_buf *b)
{
	if (!xf_buf_sealed(b))
		xf_buf_seal(b);
	return atomic_load_explicit(&b->sum, memory_order_relaxed);
}

uint64_t xf_rows_sum(const uint8_t *data, int64_t prows, int64_t row, int64_t rows, int64_t outer,
		     int64_t row_bytes)
{
	if (outer == 1 || rows == prows) /* one contiguous range */
		return mlfs_hash(data + row * row_bytes, (size_t)(outer * rows * row_bytes));
	struct xf_rows one = {data, prows, row, rows, outer, row_bytes};
	return xf_rows_sum_many(&one, 1);
}

uint64_t xf_rows_sum_many(const struct xf_rows *v, size_t n)
{
	XXH3_state_t *s = XXH3_createState();
	uint64_t h = 0;
	if (!s || XXH3_64bits_reset(s) != XXH_OK)
		goto out; /* 0: a checksum the receiver refuses, never a wrong pass */
	for (size_t i = 0; i < n; i++) {
		int64_t seg = v[i].rows * v[i].row_bytes;
		for (int64_t o = 0; o < v[i].outer; o++)
			XXH3_64bits_update(s,
					   v[i].data + (o * v[i].prows + v[i].row) * v[i].row_bytes,
					   (size_t)seg);
	}
	h = XXH3_64bits_digest(s);
out:
	XXH3_freeState(s);
	return h;
}

bool xf_sums_off(void)
{
	static atomic_int off = -1;
	int v = atomic_load(&off);
	if (v < 0) {
		const char *e = getenv("MLFS_BENCH_NOSUM");
		v = e && strcmp(e, "1") == 0;
		atomic_store(&off, v);
	}
	return v;
}
