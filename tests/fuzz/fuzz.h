/*
 * fuzz.h - what the fuzz targets share: libFuzzer's entry point and CHECK,
 * which reports a broken invariant (file, line, condition) and aborts, so
 * that the driver or libFuzzer saves the input.
 */
#ifndef MLFS_TESTS_FUZZ_H
#define MLFS_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#endif
