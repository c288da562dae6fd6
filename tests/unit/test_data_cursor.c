/*
 * test_data_cursor.c - the dataset's order: the per-epoch permutation
 * (a bijection, its properties, its uniformity) and the cursor and its
 * slices (a property test over random reconfigurations and resumes).
 */
#include <inttypes.h>

#include "tests/unit/data_fixture.h"

/* ---------------------------------------------------------- permutation */

/* ptc_data_perm(seed, epoch, n, ., true) is a bijection on [0, n). */
static void check_bijection(uint64_t seed, int64_t epoch, int64_t n)
{
	unsigned char *seen = calloc((size_t)n, 1);

	assert_non_null(seen);
	for (int64_t i = 0; i < n; i++) {
		int64_t p = ptc_data_perm(seed, epoch, n, i, true);
		if (p < 0 || p >= n || seen[p]) {
			print_error("seed %" PRIu64 " epoch %" PRId64 " n %" PRId64
				    ": perm(%" PRId64 ") = %" PRId64 "%s\n",
				    seed, epoch, n, i, p, p >= 0 && p < n ? " twice" : "");
			fail();
		}
		seen[p] = 1;
	}
	free(seen);
}

/* Positions where two orders of [0, n) agree. */
static int64_t agreements(uint64_t s1, int64_t e1, uint64_t s2, int64_t e2, int64_t n)
{
	int64_t same = 0;

	for (int64_t i = 0; i < n; i++)
		same += ptc_data_perm(s1, e1, n, i, true) == ptc_data_perm(s2, e2, n, i, true);
	return same;
}

static void test_perm_bijection(void **state)
{
	static const int64_t ns[] = {1, 2, 3, 4, 5, 16, 17, 64, 1000, 4097, 65536, 100003};
	static const uint64_t seeds[] = {0, 1, 1234, UINT64_MAX};
	static const int64_t epochs[] = {0, 1, 7, INT32_MAX};

	(void)state;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (size_t b = 0; b < sizeof(seeds) / sizeof(seeds[0]); b++)
			for (size_t e = 0; e < sizeof(epochs) / sizeof(epochs[0]); e++)
				check_bijection(seeds[b], epochs[e], ns[a]);
	/* Many small n and seeds. */
	rng_state = 7;
	for (int64_t n = 1; n <= 300; n++)
		for (int k = 0; k < 4; k++)
			check_bijection(rnd64(), rnd(10), n);
}

static void test_perm_properties(void **state)
{
	static const int64_t ns[] = {64, 1000, 4097, 100003};

	(void)state;
	/* n = 1: the only order. */
	assert_int_equal(ptc_data_perm(99, 3, 1, 0, true), 0);
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
		int64_t n = ns[a];

		/* Deterministic: the same arguments, the same record. */
		for (int64_t i = 0; i < n; i += 1 + n / 97)
			assert_int_equal(ptc_data_perm(1234, 2, n, i, true),
					 ptc_data_perm(1234, 2, n, i, true));
		/* Another epoch, another seed: another order (two random orders agree at
		 * about one position). */
		assert_true(agreements(1234, 0, 1234, 1, n) < n / 8);
		assert_true(agreements(1234, 1, 1234, 2, n) < n / 8);
		assert_true(agreements(1234, 0, 1235, 0, n) < n / 8);
		assert_true(agreements(0, 0, 1ull << 63, 0, n) < n / 8);
		/* Shuffled at all: few fixed points. */
		int64_t fixed = 0;
		for (int64_t i = 0; i < n; i++)
			fixed += ptc_data_perm(5, 0, n, i, true) == i;
		assert_true(fixed < n / 8);
		/* No shuffle: the identity, whatever seed and epoch. */
		for (int64_t i = 0; i < n; i++) {
			assert_int_equal(ptc_data_perm(1234, 0, n, i, false), i);
			assert_int_equal(ptc_data_perm(UINT64_MAX, 9, n, i, false), i);
		}
	}
	/* Known values pin the order down: the order is part of every saved job (a
	 * resumed run must see the records its checkpoint did), so it may not change. */
	assert_int_equal(ptc_data_perm(1234, 0, 1000, 0, true), 253);
	assert_int_equal(ptc_data_perm(1234, 0, 1000, 999, true), 397);
	assert_int_equal(ptc_data_perm(1234, 1, 1000, 0, true), 243);
	assert_int_equal(ptc_data_perm(0, 0, 100003, 5, true), 18245);

	/* Huge n: in range, distinct over a sample, no shift past 64 bits. */
	static const int64_t big[] = {((int64_t)1 << 48), ((int64_t)1 << 62) + 1, INT64_MAX};
	for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++) {
		int64_t prev = -1;
		for (int64_t i = 0; i < 1000; i++) {
			int64_t p = ptc_data_perm(77, 1, big[k], i, true);
			assert_true(p >= 0 && p < big[k]);
			assert_true(p != prev);
			prev = p;
		}
		int64_t p = ptc_data_perm(77, 1, big[k], big[k] - 1, true);
		assert_true(p >= 0 && p < big[k]);
	}
}

/* Over many seeds, where a given record lands and which record comes first
 * spread evenly over the epoch. Fixed seeds: not flaky. */
static void test_perm_uniform(void **state)
{
	enum { N = 16, SEEDS = 16000 };
	int64_t where0[N] = {0}, first[N] = {0}, last[N] = {0}, ordered = 0;

	(void)state;
	for (uint64_t seed = 0; seed < SEEDS; seed++) {
		for (int64_t i = 0; i < N; i++)
			if (ptc_data_perm(seed, 0, N, i, true) == 0)
				where0[i]++;
		first[ptc_data_perm(seed, 0, N, 0, true)]++;
		last[ptc_data_perm(seed, 3, N, N - 1, true)]++;
		ordered += ptc_data_perm(seed, 0, N, 1, true) > ptc_data_perm(seed, 0, N, 0, true);
	}
	/* Expected 1000 each; a binomial sd of about 31. */
	for (int i = 0; i < N; i++) {
		assert_in_range(where0[i], 850, 1150);
		assert_in_range(first[i], 850, 1150);
		assert_in_range(last[i], 850, 1150);
	}
	assert_in_range(ordered, SEEDS / 2 - 600, SEEDS / 2 + 600);

	/* A larger n over epochs of one seed: the first record, in 10 buckets. */
	int64_t buckets[10] = {0};
	for (int64_t e = 0; e < 50000; e++)
		buckets[ptc_data_perm(1234, e, 1000, 0, true) / 100]++;
	for (int i = 0; i < 10; i++)
		assert_in_range(buckets[i], 4500, 5500);
}

/* ----------------------------------------------------------------- cursor */

static void cursor_init(struct ptc_cursor *c, int64_t step, int64_t sample, int64_t batch, int dp)
{
	c->segs = malloc(sizeof(*c->segs));
	assert_non_null(c->segs);
	c->nsegs = 1;
	c->segs[0] = (struct ptc_cursor_seg){step, sample, batch, dp};
}

/*
 * Checks step @step of @c under @dp DP ranks: it consumes [@samples,
 * @samples + @batch), cut into @dp contiguous slices in rank order, the
 * first batch % dp one record larger.
 */
static void check_step(const struct ptc_cursor *c, int64_t step, int dp, int64_t samples,
		       int64_t batch)
{
	int64_t got_samples = -1, got_batch = -1, next = samples;

	assert_int_equal(ptc_cursor_samples(c, step, &got_samples, &got_batch), 0);
	assert_int_equal(got_samples, samples);
	assert_int_equal(got_batch, batch);
	assert_int_equal(ptc_cursor_dp(c, step), dp);
	for (int d = 0; d < dp; d++) {
		int64_t first = -1, count = -1;

		assert_int_equal(ptc_data_slice(c, step, dp, d, 0, &first, &count), 0);
		assert_int_equal(first, next);
		assert_int_equal(count, batch / dp + (d < batch % dp));
		assert_true(count >= 1);
		next += count;
	}
	assert_int_equal(next, samples + batch);
}

static void test_cursor_design_example(void **state)
{
	struct ptc_cursor c;
	int64_t first, count;

	(void)state;
	/* global_batch 64 on dp 2, then 96 on dp 3 from saved step 100. */
	cursor_init(&c, 0, 0, 64, 2);
	check_step(&c, 0, 2, 0, 64);
	check_step(&c, 99, 2, 99 * 64, 64);
	/* A run of 150 samples: step 2 (from 128) is cut to 22, step 3 has none. */
	assert_int_equal(ptc_data_slice(&c, 2, 2, 1, 150, &first, &count), 0);
	assert_int_equal(first, 139);
	assert_int_equal(count, 11);
	assert_int_equal(ptc_data_slice(&c, 1, 2, 1, 150, &first, &count), 0);
	assert_int_equal(count, 32);
	assert_int_equal(ptc_data_slice(&c, 3, 2, 0, 150, &first, &count), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, 2, 2, 0, 128, &first, &count), -ENODATA);
	assert_int_equal(ptc_cursor_advance(&c, 100, 96, 3), 0);
	assert_int_equal(c.nsegs, 2);
	assert_int_equal(ptc_cursor_dp(&c, 99), 2);
	assert_int_equal(ptc_cursor_dp(&c, 100), 3);
	check_step(&c, 99, 2, 99 * 64, 64);
	check_step(&c, 100, 3, 6400, 96);
	check_step(&c, 101, 3, 6496, 96);
	assert_int_equal(ptc_data_slice(&c, 101, 3, 2, 0, &first, &count), 0);
	assert_int_equal(first, 6496 + 64);
	assert_int_equal(count, 32);

	/* 10 on dp 4: 3, 3, 2, 2. */
	assert_int_equal(ptc_cursor_advance(&c, 102, 10, 4), 0);
	static const int64_t want[] = {3, 3, 2, 2};
	for (int d = 0; d < 4; d++) {
		assert_int_equal(ptc_data_slice(&c, 102, 4, d, 0, &first, &count), 0);
		assert_int_equal(count, want[d]);
	}
	check_step(&c, 103, 4, 6592 + 10, 10);

	/* The same batch and dp again: nothing new. Twice at one step: the last
	 * wins. Another dp alone makes a segment too. */
	assert_int_equal(ptc_cursor_advance(&c, 110, 10, 4), 0);
	assert_int_equal(c.nsegs, 3);
	assert_int_equal(ptc_cursor_advance(&c, 110, 7, 4), 0);
	assert_int_equal(ptc_cursor_advance(&c, 110, 9, 1), 0);
	assert_int_equal(c.nsegs, 4);
	assert_int_equal(ptc_cursor_dp(&c, 110), 1);
	assert_int_equal(ptc_cursor_advance(&c, 110, 10, 4), 0); /* back: merged */
	assert_int_equal(c.nsegs, 3);
	assert_int_equal(ptc_cursor_advance(&c, 108, 10, 2), 0);
	assert_int_equal(c.nsegs, 4);
	assert_int_equal(ptc_cursor_dp(&c, 107), 4);
	assert_int_equal(ptc_cursor_dp(&c, 108), 2);
	check_step(&c, 108, 2, 6592 + 60, 10);
	assert_int_equal(ptc_cursor_advance(&c, 110, 9, 1), 0);
	assert_int_equal(c.nsegs, 5);
	check_step(&c, 110, 1, 6592 + 80, 9);

	/* Resume from step 101 (saved before the 10s): later segments are gone. */
	assert_int_equal(ptc_cursor_advance(&c, 101, 96, 3), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 102, 3, 6592, 96);
	check_step(&c, 110, 3, 6592 + 8 * 96, 96);
	/* Resume at a segment's own step with another batch: it is replaced. */
	assert_int_equal(ptc_cursor_advance(&c, 100, 50, 2), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 100, 2, 6400, 50);
	/* Back to the start. */
	assert_int_equal(ptc_cursor_advance(&c, 0, 64, 8), 0);
	assert_int_equal(c.nsegs, 1);
	check_step(&c, 150, 8, 150 * 64, 64);
	free(c.segs);
}

static void test_cursor_errors(void **state)
{
	struct ptc_cursor c;
	int64_t samples = -7, batch = -7, first = -7, count = -7;

	(void)state;
	/* The first segment starts at step 5, sample 1000. */
	cursor_init(&c, 5, 1000, 3, 3);
	assert_int_equal(ptc_cursor_samples(&c, -1, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MIN, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, 4, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, 0, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, 4, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, -1, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(samples, -7);
	assert_int_equal(first, -7);
	check_step(&c, 5, 3, 1000, 3);

	/* Huge steps: -ENODATA, not a wrapped sample. */
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX / 2, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&c, INT64_MAX / 2, 2, 1, 0, &first, &count), -ENODATA);
	/* The largest reachable step still works; its batch ends at INT64_MAX at most. */
	int64_t last = 5 + (INT64_MAX - 1000) / 3 - 1;
	assert_int_equal(ptc_cursor_samples(&c, last, &samples, &batch), 0);
	assert_true(samples <= INT64_MAX - batch);
	check_step(&c, last, 3, samples, 3);
	assert_int_equal(ptc_cursor_samples(&c, last + 1, &samples, &batch), -ENODATA);

	/* Batch 1: step INT64_MAX / 2 is reachable; the very last step is not. */
	assert_int_equal(ptc_cursor_advance(&c, 5, 1, 1), 0);
	check_step(&c, INT64_MAX / 2, 1, INT64_MAX / 2 - 5 + 1000, 1);
	assert_int_equal(ptc_cursor_samples(&c, INT64_MAX, &samples, &batch), -ENODATA);

	/* Bad advances leave the cursor as it was. */
	assert_int_equal(ptc_cursor_advance(&c, 5, 3, 3), 0);
	assert_int_equal(ptc_cursor_advance(&c, 10, 4, 4), 0);
	assert_int_equal(c.nsegs, 2);
	assert_int_equal(ptc_cursor_advance(&c, -1, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 4, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, INT64_MAX / 2, 4, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, 0, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, -3, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 1, 0, 4), -ERANGE);
	assert_int_equal(ptc_cursor_advance(&c, 12, 4, 0), -ERANGE);
	assert_int_equal(ptc_cursor_dp(&c, 4), 0);
	assert_int_equal(ptc_cursor_dp(&c, INT64_MAX), 0);
	assert_int_equal(c.nsegs, 2);
	check_step(&c, 9, 3, 1012, 3);
	check_step(&c, 12, 4, 1015 + 8, 4);

	/* Bad DP ranks. */
	assert_int_equal(ptc_data_slice(&c, 12, 0, 0, 0, &first, &count), -EINVAL);
	assert_int_equal(ptc_data_slice(&c, 12, 4, 4, 0, &first, &count), -EINVAL);
	assert_int_equal(ptc_data_slice(&c, 12, 4, -1, 0, &first, &count), -EINVAL);
	free(c.segs);

	/* A cursor without segments has no steps. */
	struct ptc_cursor empty = {0, NULL};
	assert_int_equal(ptc_cursor_samples(&empty, 0, &samples, &batch), -ENODATA);
	assert_int_equal(ptc_data_slice(&empty, 0, 1, 0, 0, &first, &count), -ENODATA);
	assert_int_equal(ptc_cursor_advance(&empty, 0, 1, 1), -ERANGE);
}

/* One simulated job (see test_cursor_property). */
struct sim {
	int64_t n, epochs, end; /* records; epoch limit (0: none); samples to train on */
	uint64_t seed;
	bool shuffle;
	struct ptc_cursor c;
	int64_t nsteps, cap;
	int64_t *samples, *batch; /* per step run, as the cursor gave them */
	int *dp;
};

static void sim_record(struct sim *s, int64_t step, int64_t samples, int64_t batch, int dp)
{
	if (step >= s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->samples = realloc(s->samples, (size_t)s->cap * sizeof(*s->samples));
		s->batch = realloc(s->batch, (size_t)s->cap * sizeof(*s->batch));
		s->dp = realloc(s->dp, (size_t)s->cap * sizeof(*s->dp));
		assert_true(s->samples && s->batch && s->dp);
	}
	s->samples[step] = samples;
	s->batch[step] = batch;
	s->dp[step] = dp;
	s->nsteps = step + 1;
}

/* Steps before @upto still give what they gave when they ran. */
static void sim_check_history(const struct sim *s, int64_t upto, int spot)
{
	if (upto <= 0)
		return;
	if (spot) {
		for (int k = 0; k < spot; k++) {
			int64_t st = rnd(upto);
			check_step(&s->c, st, s->dp[st], s->samples[st], s->batch[st]);
		}
		return;
	}
	for (int64_t st = 0; st < upto; st++)
		check_step(&s->c, st, s->dp[st], s->samples[st], s->batch[st]);
}

/* Replays every step with the final cursor, as the DP ranks read them: the
 * samples are 0, 1, 2, ... and each epoch holds every record exactly once. */
static void sim_check_stream(const struct sim *s)
{
	int64_t full = s->end / s->n, epochs = full + 1, next = 0;
	unsigned char *seen = calloc((size_t)(epochs * s->n), 1);

	assert_non_null(seen);
	for (int64_t st = 0; st < s->nsteps; st++) {
		for (int d = 0; d < s->dp[st]; d++) {
			int64_t first, count;

			assert_int_equal(ptc_data_slice(&s->c, st, s->dp[st], d, 0, &first, &count),
					 0);
			for (int64_t g = first; g < first + count; g++) {
				assert_int_equal(g, next);
				next++;
				if (g >= s->end)
					continue; /* past the last epoch: ENODATA to the reader */
				int64_t e = g / s->n;
				int64_t r = ptc_data_perm(s->seed, e, s->n, g % s->n, s->shuffle);
				assert_true(r >= 0 && r < s->n);
				assert_int_equal(seen[e * s->n + r], 0);
				seen[e * s->n + r] = 1;
			}
		}
	}
	assert_true(next >= s->end);
	for (int64_t i = 0; i < full * s->n; i++)
		assert_int_equal(seen[i], 1);
	free(seen);
}

static void random_config(int64_t n, int *dp, int64_t *batch)
{
	*dp = 1 + (int)rnd(8);
	switch (rnd(4)) {
	case 0:
	case 1: /* small: many steps an epoch */
		*batch = *dp + rnd(8);
		break;
	case 2: /* about an epoch: batches span epoch boundaries */
		*batch = *dp + rnd(n + n / 2);
		break;
	default: /* several epochs a step */
		*batch = *dp + rnd(4 * n);
		break;
	}
}

/*
 * Thousands of random jobs: a dataset of 1..500 records, an epoch limit or
 * none, configs with random dp and global_batch taking effect at random saved
 * steps, and resumes from earlier checkpoints (possibly with a new config).
 * At every step the DP slices tile the step's batch; steps run before a
 * reconfiguration keep their slices; over the whole job the stream is
 * 0, 1, 2, ... and each epoch is exactly one pass over the records.
 */
static void test_cursor_property(void **state)
{
	int64_t total_steps = 0, total_reconfigs = 0, total_resumes = 0, max_segs = 0;

	(void)state;
	rng_state = 2024;
	for (int run = 0; run < 4000; run++) {
		struct sim s = {0};
		int dp, resumes = 0, reconfig_odds = 2 + (int)rnd(30);
		int64_t batch, next = 0, step = 0;

		s.n = 1 + rnd(500);
		s.epochs = rnd(3) ? 1 + rnd(3) : 0;
		s.end = s.epochs ? s.epochs * s.n : 1 + rnd(3 * s.n + 1);
		s.seed = rnd64();
		s.shuffle = rnd(4) != 0;
		random_config(s.n, &dp, &batch);
		cursor_init(&s.c, 0, 0, batch, dp);

		while (next < s.end) {
			/* A resume from an earlier checkpoint, maybe under a new config. */
			if (step > 0 && resumes < 3 && rnd(40) == 0) {
				int64_t r = rnd(step + 1), old_batch;
				if (r < step) {
					dp = s.dp[r];
					old_batch = s.batch[r];
					next = s.samples[r];
				} else {
					old_batch = batch;
				}
				batch = old_batch;
				if (rnd(2))
					random_config(s.n, &dp, &batch);
				assert_int_equal(ptc_cursor_advance(&s.c, r, batch, dp), 0);
				step = r;
				s.nsteps = r;
				resumes++;
				total_resumes++;
				for (int k = 0; k < s.c.nsegs; k++)
					assert_true(s.c.segs[k].step <= r);
				sim_check_history(&s, r, 0);
			}
			/* A reconfiguration saved at this step (sometimes two in a row). */
			if (step > 0 && rnd(reconfig_odds) == 0) {
				int nsegs = s.c.nsegs, old_dp = dp;
				int64_t old = batch;
				for (int k = 1 + (rnd(4) == 0); k > 0; k--) {
					random_config(s.n, &dp, &batch);
					if (rnd(4) == 0)
						batch = old; /* another dp, same global_batch */
					batch = batch < dp ? dp : batch;
					assert_int_equal(ptc_cursor_advance(&s.c, step, batch, dp),
							 0);
				}
				assert_true(s.c.nsegs <= nsegs + 1);
				if (batch == old && dp == old_dp)
					assert_true(s.c.nsegs <= nsegs);
				total_reconfigs++;
				sim_check_history(&s, step, 4);
			}
			check_step(&s.c, step, dp, next, batch);
			sim_record(&s, step, next, batch, dp);
			next += batch;
			step++;
		}
		/* The first step past the data is where an epoch-limited job stops. */
		int64_t after = -1, b = -1;
		assert_int_equal(ptc_cursor_samples(&s.c, step, &after, &b), 0);
		assert_true(after >= s.end);
		assert_true(s.c.nsegs >= 1 && s.c.segs[0].step == 0);
		for (int k = 1; k < s.c.nsegs; k++) { /* by step; each changes something */
			assert_true(s.c.segs[k].step > s.c.segs[k - 1].step);
			assert_true(s.c.segs[k].batch != s.c.segs[k - 1].batch ||
				    s.c.segs[k].dp != s.c.segs[k - 1].dp);
		}

		sim_check_history(&s, s.nsteps, 0);
		sim_check_stream(&s);
		total_steps += s.nsteps;
		max_segs = s.c.nsegs > max_segs ? s.c.nsegs : max_segs;
		free(s.c.segs);
		free(s.samples);
		free(s.batch);
		free(s.dp);
	}
	/* The generator did exercise what it is meant to. */
	assert_true(total_steps > 40000);
	assert_true(total_reconfigs > 3000);
	assert_true(total_resumes > 1000);
	assert_true(max_segs > 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_perm_bijection), cmocka_unit_test(test_perm_properties),
	    cmocka_unit_test(test_perm_uniform),   cmocka_unit_test(test_cursor_design_example),
	    cmocka_unit_test(test_cursor_errors),  cmocka_unit_test(test_cursor_property),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
