/*
 * common.h - what every part of the daemon uses: the log, .npy headers,
 * hashing, parallel loops and guarded copies from file mappings.
 */
#ifndef MLFS_COMMON_H
#define MLFS_COMMON_H

/*
 * The log (mlfs_log.c): one line per event, level first
 * ("mlfs: warning: dataset source: http://h/s.bin: HTTP 503 after 6
 * attempts"), to stderr when the daemon runs in the foreground (-f) and to
 * syslog (facility daemon) otherwise.
 *
 * Which events: what would otherwise go unseen, such as a refused write
 * (its reason is also in status.json, until the next one replaces it), a
 * dataset source failing (a prefetch's failure reaches no reader), the
 * daemon's start and stop. Errors of the command line and of start-up are
 * printed by the command itself, not logged.
 *
 * Levels: error (the daemon cannot do what it must), warning (a request or
 * a read refused or failed; the daemon goes on), info (start, stop), debug.
 * A message is written when its level is at or above the minimum level
 * (default: info). Events a user can provoke at will (a bad write) are
 * warnings, never errors.
 *
 * Threads: every function may be called from any thread; a line is written
 * with one write(2) (or one syslog(3) call), so lines of concurrent threads
 * never mix.
 */

#include <stdbool.h>

/* Levels, most severe first; the values are syslog's priorities. */
enum mlfs_log_level {
	MLFS_LOG_ERROR = 3,
	MLFS_LOG_WARNING = 4,
	MLFS_LOG_INFO = 6,
	MLFS_LOG_DEBUG = 7,
};

/*
 * Where lines go from now on: stderr when @foreground, else syslog (opened
 * here as "mlfs", with the pid); and the minimum level @min. Until it is
 * called, lines go to stderr with the minimum level info. Call it from
 * main's thread before other threads log (the daemon's start-up).
 */
void mlfs_log_init(bool foreground, enum mlfs_log_level min);

/* Sets the minimum level; any thread, any time. */
void mlfs_log_set_level(enum mlfs_log_level min);

/*
 * Logs one line at @level: "mlfs: <level>: <message>", the message
 * formatted as printf does (%m included). Line breaks in the message become
 * spaces; a message longer than about 2 KiB is cut, ending in "...". Keeps
 * errno. Never fails (a line that cannot be written is lost).
 */
__attribute__((format(printf, 2, 3))) void mlfs_log(enum mlfs_log_level level, const char *fmt,
						    ...);

/* The name of @level ("error", "warning", "info", "debug"), or "?". */
const char *mlfs_log_level_name(enum mlfs_log_level level);

/* The level named @name (one of those names): 0, or -EINVAL. */
int mlfs_log_level_parse(const char *name, enum mlfs_log_level *level);

/*
 * NumPy .npy headers (mlfs_npy.c): format, parse and check.
 *
 * Every tensor file mlfs serves is an .npy file (format 1.0): a header that
 * numpy.load reads, then the raw little-endian C-order data. bfloat16 and
 * fp8 have no NumPy dtype and are stored as "<u2" and "|u1" (DESIGN.md 6).
 *
 * All functions are pure: no I/O, no allocation, no globals. They are
 * reentrant and may be called from any thread at any time. Every pointer
 * argument is borrowed for the duration of the call only.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include <xxhash.h>

#include "ptc/ptc.h"

/* Largest header dict accepted by mlfs_npy_parse, in bytes. */
#define MLFS_NPY_MAX_HEADER 65536

/* Limits on a parsed shape: each dimension below PTC_MAX_DIM_SIZE, and the
 * element count below this. */
#define MLFS_NPY_MAX_ELEMS (INT64_C(1) << 48)

/* A parsed header. */
struct mlfs_npy {
	char descr[16]; /* NumPy dtype string, e.g. "<f4", NUL-terminated */
	bool fortran_order;
	int ndim;		     /* 0 .. PTC_MAX_DIMS */
	int64_t shape[PTC_MAX_DIMS]; /* ndim entries, each in [0, 2^40) */
	size_t header_len;	     /* bytes before the data */
};

/*
 * Formats an NPY 1.0 header for an array of @dt with @ndim dimensions
 * @shape into @buf: the magic "\x93NUMPY", version 1.0, the little-endian
 * u16 dict length, then the dict exactly as numpy.save writes it, e.g.
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * ("(3,)" for one dimension, "()" for none), followed by numpy's spare
 * spaces for growing the first axis (numpy >= 1.23), padding spaces and a
 * final '\n' so that the total length, which is where the data starts, is
 * a multiple of 64.
 *
 * Returns the header length. Returns 0 and writes nothing when @cap is too
 * small, or when @dt, @ndim (0 .. PTC_MAX_DIMS) or a dimension (negative)
 * is invalid. @buf is not NUL-terminated.
 */
size_t mlfs_npy_format(enum ptc_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap);

/*
 * Parses the .npy header at the start of @buf, the first @len bytes of a
 * file. Accepts format versions 1.0 (u16 dict length), 2.0 and 3.0 (u32).
 * The dict is read as the Python literal it is: keys in any order, single
 * or double quotes, whitespace anywhere between tokens, trailing commas.
 * It must hold exactly the keys 'descr' (a string of at most 15 printable
 * ASCII characters), 'fortran_order' (True or False) and 'shape' (a tuple
 * of at most PTC_MAX_DIMS non-negative ints, each below 2^40, their product
 * below 2^48). Reads no byte at or past @len.
 *
 * Returns 0 and fills *@out (fortran_order True is reported, not refused:
 * mlfs_npy_check refuses it). Returns -EAGAIN when the first @len bytes are
 * a valid prefix but too short to hold the whole header: the caller retries
 * with more bytes (or, at end of file, reports a truncated header).
 * Returns -EINVAL for anything malformed, with one line in @err (its code
 * -EINVAL; @err may be NULL), e.g. "bad magic", "unsupported version 4.0",
 * "header length 70000 exceeds 65536", "shape has more than 8 dims". *@out
 * is left untouched on error.
 */
int mlfs_npy_parse(const uint8_t *buf, size_t len, struct mlfs_npy *out, struct ptc_error *err);

/*
 * The length of the header framed in the first @len bytes of @buf (magic,
 * version, header length; the dict is not read): the bytes before the
 * data, or 0 when @len bytes do not tell yet, or -EINVAL with one line in
 * @err ("bad magic", "unsupported version 4.0", "header length N exceeds
 * 65536"). What mlfs_npy_parse checks first; writers call it to learn how
 * many bytes the header needs before they parse it.
 */
int64_t mlfs_npy_header_len(const uint8_t *buf, size_t len, struct ptc_error *err);

/*
 * Checks parsed header @h against a partition of dtype @dt and shape
 * (@ndim, @shape). The descr must equal ptc_dtype_npy_descr(@dt), except
 * that for 1-byte types the byte-order marks '|' and '<' are interchangeable
 * ("<u1" for "|u1"); fortran_order must be False; the shape must be equal.
 *
 * Returns 0, or -EINVAL with one line in @err (same conventions as
 * mlfs_npy_parse), e.g.
 *   dtype '<f8' does not match partition dtype float32 ('<f4')
 *   shape (4, 3) does not match partition shape (3, 4)
 */
int mlfs_npy_check(const struct mlfs_npy *h, enum ptc_dtype dt, int ndim, const int64_t *shape,
		   struct ptc_error *err);

/* ---------------------------------------------------------------- hashing */

/*
 * The project's one non-cryptographic hash: XXH3 64 (libxxhash), for hash
 * tables, content identities and checksums. mlfs_hash is the hash of @n
 * bytes at @p; mlfs_hash_more continues @h with @n more bytes (a hash of a
 * sequence of pieces, each piece's bytes seeding the next); mlfs_hash_str
 * hashes a NUL-terminated string; mlfs_hash_u64 continues @h with the bytes
 * of @v. Pure; any thread.
 */
static inline uint64_t mlfs_hash(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

static inline uint64_t mlfs_hash_more(uint64_t h, const void *p, size_t n)
{
	return XXH3_64bits_withSeed(p, n, h);
}

static inline uint64_t mlfs_hash_str(const char *s)
{
	return XXH3_64bits(s, strlen(s));
}

static inline uint64_t mlfs_hash_u64(uint64_t h, uint64_t v)
{
	return XXH3_64bits_withSeed(&v, sizeof(v), h);
}

/* ----------------------------------------------------------- mlfs_par.c */

/* The most threads one mlfs_par_run uses, the caller's included. */
#define MLFS_PAR_MAX 256

/*
 * Runs @worker(@arg) on the calling thread and on up to @n - 1 threads
 * started for this call (at most MLFS_PAR_MAX in all; fewer when threads
 * cannot be started), and returns once every one has returned: the number
 * that ran. The workers take their items from @arg themselves (an atomic
 * cursor), so any number of them does all the work. Any thread.
 */
int mlfs_par_run(int n, void *(*worker)(void *), void *arg);

/* ------------------------------------------------ mlfs_mapcopy.c */

/* Installs the SIGBUS handler of mlfs_mapcopy_raw unless it is installed
 * (a library or test harness may have replaced it): before copies. */
void mlfs_mapcopy_guard(void);

/* Copies @len bytes of a file mapping at @src to @dst: 0, or -EIO when the
 * file no longer holds them (it shrank: SIGBUS). mlfs_mapcopy_guard first. */
int mlfs_mapcopy_raw(void *dst, const uint8_t *src, size_t len);

/*
 * Copies @len bytes at @src, in a shared mapping of a file, to @dst: 0, or
 * -EIO when the file no longer holds them (it shrank meanwhile: the SIGBUS
 * of the copy is caught by a handler installed if needed, with a guard per
 * thread; a SIGBUS outside such a copy keeps its previous disposition).
 */
int mlfs_mapcopy(void *dst, const void *src, size_t len);

#endif
