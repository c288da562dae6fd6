/*
 * data_fixture.h - what the dataset tests share (test_data.c,
 * test_data_cursor.c): their random numbers.
 */
#ifndef MLFS_TESTS_DATA_FIXTURE_H
#define MLFS_TESTS_DATA_FIXTURE_H

#include <stdint.h>

#include "tests/unit/unit.h"

/* splitmix64: a fixed-seed generator, so every run tests the same cases. */
static uint64_t rng_state;

static uint64_t rnd64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0 (the modulo bias does not matter here). */
static int64_t rnd(int64_t n)
{
	assert_true(n > 0);
	return (int64_t)(rnd64() % (uint64_t)n);
}

#endif
