/*
 * bench_sum.c - the checksum's throughput (mlfs_hash: XXH3 64, one thread)
 * against memcpy of the same bytes, from a buffer that fits in the caches
 * (1 MiB, hashed again and again: bytes "hot", as right after a copy) and
 * from one that does not (256 MiB, cold). Prints one table.
 * Usage: bench_sum [MiB of the large buffer]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GB/s of the best of 5 passes over @reps x @n bytes. */
static void measure(size_t n, int reps)
{
	uint8_t *a = malloc(n), *b = malloc(n);
	volatile uint64_t sink = 0;
	double best_h = 1e30, best_m = 1e30;
	if (!a || !b) {
		fprintf(stderr, "bench_sum: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		a[i] = (uint8_t)(i * 2654435761u >> 13);
	memcpy(b, a, n); /* fault every page in */
	for (int pass = 0; pass < 5; pass++) {
		double t0 = now();
		for (int r = 0; r < reps; r++)
			sink += mlfs_hash(a, n);
		double t1 = now();
		for (int r = 0; r < reps; r++) {
			memcpy(b, a, n);
			sink += b[r % n];
		}
		double t2 = now();
		best_h = t1 - t0 < best_h ? t1 - t0 : best_h;
		best_m = t2 - t1 < best_m ? t2 - t1 : best_m;
	}
	double bytes = (double)n * reps;
	printf("%9.0f KiB x %5d  XXH3 %6.2f GB/s  memcpy %6.2f GB/s  XXH3/memcpy time %.2f\n",
	       n / 1024.0, reps, bytes / best_h / 1e9, bytes / best_m / 1e9, best_h / best_m);
	(void)sink;
	free(a);
	free(b);
}

int main(int argc, char **argv)
{
	size_t big = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 20;
	printf("== checksum (XXH3 64, one thread) against memcpy of the same bytes\n");
	measure((size_t)1 << 20, 512); /* hot: in the caches */
	measure(big, 2);	       /* cold: from memory */
	return 0;
}
