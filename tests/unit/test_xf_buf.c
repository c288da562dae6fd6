/*
 * test_xf_buf.c - the memory bound and the reference-counted buffers of
 * the transform module (transform/xf_buf.c), and row copies between
 * partitions: exact figures, several threads reserving at once, mappings
 * for large buffers.
 */
#include <pthread.h>

#include "tests/unit/unit.h"
#include "transform/xf.h"

/* ---------------------------------------------------------- memory bound */

static void test_mem_limit(void **state)
{
	(void)state;
	struct xf_mem m = {.limit = 100};
	struct xf_buf *a, *b, *c;
	int rc = 1;

	a = xf_buf_new(&m, 60, &rc);
	assert_non_null(a);
	assert_int_equal(rc, 0);
	assert_int_equal(m.used, 60);
	b = xf_buf_new(&m, 41, &rc);
	assert_null(b);
	assert_int_equal(rc, -ENOSPC);
	assert_int_equal(m.used, 60);
	b = xf_buf_new(&m, 40, &rc);
	assert_non_null(b);
	assert_int_equal(m.used, 100);
	c = xf_buf_new(&m, 0, &rc);
	assert_non_null(c);
	assert_non_null(c->data);
	assert_int_equal(c->size, 0);
	assert_int_equal(xf_mem_reserve(&m, 1), -ENOSPC);
	assert_int_equal(xf_mem_reserve(&m, INT64_MAX), -ENOSPC);
	xf_buf_put(a);
	assert_int_equal(m.used, 40);
	xf_buf_put(b);
	xf_buf_put(c);
	assert_int_equal(m.used, 0);

	/* limit 0 = unlimited */
	struct xf_mem u = {0};
	assert_int_equal(xf_mem_reserve(&u, (int64_t)1 << 50), 0);
	assert_int_equal(u.used, (int64_t)1 << 50);
	xf_mem_release(&u, (int64_t)1 << 50);
	assert_int_equal(u.used, 0);
	/* no accounting at all */
	a = xf_buf_new(NULL, 10, &rc);
	assert_non_null(a);
	xf_buf_put(a);
}

struct mem_race {
	struct xf_mem *m;
	atomic_int over;
};

static void *mem_racer(void *arg)
{
	struct mem_race *r = arg;

	for (int i = 0; i < 20000; i++) {
		struct xf_buf *b = xf_buf_new(r->m, 7, NULL);
		if (atomic_load(&r->m->used) > r->m->limit)
			atomic_store(&r->over, 1);
		xf_buf_put(xf_buf_get(b));
		xf_buf_put(b);
	}
	return NULL;
}

/* Reservations from several threads never pass the limit and add up. */
static void test_mem_threads(void **state)
{
	(void)state;
	struct xf_mem m = {.limit = 20};
	struct mem_race r = {.m = &m};
	pthread_t t[4];

	atomic_init(&r.over, 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, mem_racer, &r), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(atomic_load(&r.over), 0);
	assert_int_equal(m.used, 0);
}

/* --------------------------------------------------------------- buffers */

static void test_buf_refs(void **state)
{
	(void)state;
	struct xf_mem m = {0};
	int rc;

	/* Small: calloc, zeroed. */
	struct xf_buf *s = xf_buf_new(&m, 1000, &rc);
	assert_non_null(s);
	assert_false(s->mapped);
	assert_int_equal(atomic_load(&s->refs), 1);
	for (int i = 0; i < 1000; i++)
		assert_int_equal(s->data[i], 0);

	/* Large: an anonymous mapping, zeroed, writable. */
	int64_t big = ((int64_t)1 << 20) + 3;
	struct xf_buf *l = xf_buf_new(&m, big, &rc);
	assert_non_null(l);
	assert_true(l->mapped);
	assert_int_equal(l->size, big);
	for (int64_t i = 0; i < big; i += 4093)
		assert_int_equal(l->data[i], 0);
	assert_int_equal(l->data[big - 1], 0);
	memset(l->data, 0x5A, (size_t)big);
	assert_int_equal(m.used, 1000 + big);

	assert_ptr_equal(xf_buf_get(l), l);
	assert_ptr_equal(xf_buf_get(l), l);
	assert_int_equal(atomic_load(&l->refs), 3);
	xf_buf_put(l);
	xf_buf_put(l);
	assert_int_equal(atomic_load(&l->refs), 1);
	assert_int_equal(m.used, 1000 + big);
	xf_buf_put(l);
	assert_int_equal(m.used, 1000);
	xf_buf_put(s);
	assert_int_equal(m.used, 0);

	assert_null(xf_buf_get(NULL));
	xf_buf_put(NULL);
	assert_null(xf_buf_new(&m, -1, &rc));
	assert_int_equal(rc, -EINVAL);
	assert_int_equal(m.used, 0);
}

/* -------------------------------------------------------------- row copy */

static void test_copy_rows(void **state)
{
	(void)state;
	/* A [2, 5, 3] uint8 tensor split along dim 1: outer 2, rows 5, rows of
	 * 3 bytes; element (o, r, e) = o * 15 + r * 3 + e. */
	uint8_t src[30], dst[12], mid[2 * 4 * 3];

	for (int i = 0; i < 30; i++)
		src[i] = (uint8_t)i;
	/* Rows [1, 3) into a 2-row partition. */
	memset(dst, 0xFF, sizeof(dst));
	xf_copy_rows(dst, 2, 0, src, 5, 1, 2, 2, 3);
	static const uint8_t want[12] = {3, 4, 5, 6, 7, 8, 18, 19, 20, 21, 22, 23};
	assert_memory_equal(dst, want, sizeof(want));

	/* Row 4 into row 2 of a 4-row partition; the rest untouched. */
	memset(mid, 0xFF, sizeof(mid));
	xf_copy_rows(mid, 4, 2, src, 5, 4, 1, 2, 3);
	static const uint8_t want_mid[24] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 12,   13,
					     14,   0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
					     0xFF, 0xFF, 27,   28,   29,   0xFF, 0xFF, 0xFF};
	assert_memory_equal(mid, want_mid, sizeof(want_mid));

	/* Whole partitions of one shape; and zero rows copy nothing. */
	uint8_t all[30];
	xf_copy_rows(all, 5, 0, src, 5, 0, 5, 2, 3);
	assert_memory_equal(all, src, sizeof(src));
	memset(dst, 0xEE, sizeof(dst));
	xf_copy_rows(dst, 2, 2, src, 5, 5, 0, 2, 3);
	for (int i = 0; i < 12; i++)
		assert_int_equal(dst[i], 0xEE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mem_limit),
	    cmocka_unit_test(test_mem_threads),
	    cmocka_unit_test(test_buf_refs),
	    cmocka_unit_test(test_copy_rows),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
