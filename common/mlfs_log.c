/*
 * mlfs_log.c - the daemon's log (common.h): stderr or syslog, one line
 * per event, level first.
 *
 * State: the sink and the minimum level, process-wide (one daemon a
 * process, as syslog is one a process); atomics, no lock; the rate limit
 * (LOG_PER_SECOND) under a lock of its own. A line is built
 * whole in a buffer on the caller's stack, then written with one write(2)
 * to stderr (lines of threads never interleave) or one syslog(3) call.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

/* Bytes of one line, "mlfs: <level>: " and the newline included. */
#define LOG_LINE_MAX 2048
/* Lines a second, at most: a fault repeated in a loop (a peer refusing
 * every fetch, a client hammering a bad request) must not fill the disk
 * or drown the one line that matters. The lines past it are counted and
 * the count said at the next second's first line. */
#define LOG_PER_SECOND 200

static atomic_int min_level = MLFS_LOG_INFO;
static atomic_bool to_syslog = false;
static atomic_bool with_time = false;

void mlfs_log_init(bool foreground, enum mlfs_log_level min)
{
	if (!foreground)
		openlog("mlfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	atomic_store(&to_syslog, !foreground);
	const char *t = getenv("MLFS_LOG_TIME");
	atomic_store(&with_time, t && strcmp(t, "1") == 0);
	mlfs_log_set_level(min);
}

void mlfs_log_set_level(enum mlfs_log_level min)
{
	atomic_store(&min_level, (int)min);
}

const char *mlfs_log_level_name(enum mlfs_log_level level)
{
	switch (level) {
	case MLFS_LOG_ERROR:
		return "error";
	case MLFS_LOG_WARNING:
		return "warning";
	case MLFS_LOG_INFO:
		return "info";
	case MLFS_LOG_DEBUG:
		return "debug";
	}
	return "?";
}

int mlfs_log_level_parse(const char *name, enum mlfs_log_level *level)
{
	static const enum mlfs_log_level all[] = {MLFS_LOG_ERROR, MLFS_LOG_WARNING, MLFS_LOG_INFO,
						  MLFS_LOG_DEBUG};

	for (size_t i = 0; name && i < sizeof(all) / sizeof(all[0]); i++) {
		if (!strcmp(name, mlfs_log_level_name(all[i]))) {
			*level = all[i];
			return 0;
		}
	}
	return -EINVAL;
}

/* Whether a line may go out now; *@dropped gets the lines suppressed in
 * the seconds before it, to say so first. */
static bool rate_ok(long *dropped)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static time_t second;
	static long lines, suppressed;
	struct timespec now;
	bool ok;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&lock);
	*dropped = 0;
	if (now.tv_sec != second) {
		second = now.tv_sec;
		lines = 0;
		*dropped = suppressed;
		suppressed = 0;
	}
	ok = lines++ < LOG_PER_SECOND;
	if (!ok)
		suppressed++;
	pthread_mutex_unlock(&lock);
	return ok;
}

static void emit(enum mlfs_log_level level, const char *fmt, va_list ap)
{
	char line[LOG_LINE_MAX];
	int head, n;

	head = snprintf(line, sizeof(line), "mlfs: %s: ", mlfs_log_level_name(level));
	if (atomic_load(&with_time)) { /* MLFS_LOG_TIME=1: CLOCK_MONOTONIC, to line up nodes */
		struct timespec t;
		clock_gettime(CLOCK_MONOTONIC, &t);
		head = snprintf(line, sizeof(line), "mlfs: %lld.%06ld %s: ", (long long)t.tv_sec,
				t.tv_nsec / 1000, mlfs_log_level_name(level));
	}
	n = vsnprintf(line + head, sizeof(line) - (size_t)head - 1, fmt, ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof(line) - (size_t)head - 1) { /* cut: say so */
		n = (int)(sizeof(line) - (size_t)head - 2);
		memcpy(line + head + n - 3, "...", 3);
	}
	n += head;
	for (char *c = line + head; c < line + n; c++) /* one event, one line */
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	if (atomic_load(&to_syslog)) {
		line[n] = '\0';
		syslog((int)level, "%s", line + strlen("mlfs: "));
	} else {
		line[n++] = '\n';
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(STDERR_FILENO, line + off, (size_t)(n - off));
			if (w > 0)
				off += w;
			else if (!(w < 0 && errno == EINTR))
				break; /* lost: there is nowhere to say so */
		}
	}
}

static void emitf(enum mlfs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void emitf(enum mlfs_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	emit(level, fmt, ap);
	va_end(ap);
}

void mlfs_log(enum mlfs_log_level level, const char *fmt, ...)
{
	int saved = errno;
	long dropped;
	va_list ap;

	if ((int)level > atomic_load(&min_level))
		return;
	bool ok = rate_ok(&dropped);
	if (dropped)
		emitf(MLFS_LOG_WARNING, "log: %ld lines suppressed (more than %d a second)",
		      dropped, LOG_PER_SECOND);
	if (ok) {
		va_start(ap, fmt);
		emit(level, fmt, ap);
		va_end(ap);
	}
	errno = saved;
}
