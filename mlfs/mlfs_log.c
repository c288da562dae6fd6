/*
 * mlfs_log.c - the daemon's log (mlfs_log.h): stderr or syslog, one line
 * per event, level first.
 *
 * State: the sink and the minimum level, process-wide (one daemon a
 * process, as syslog is one a process); atomics, no lock. A line is built
 * whole in a buffer on the caller's stack, then written with one write(2)
 * to stderr (lines of threads never interleave) or one syslog(3) call.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "mlfs/mlfs_log.h"

/* Bytes of one line, "mlfs: <level>: " and the newline included. */
#define LOG_LINE_MAX 2048

static atomic_int min_level = MLFS_LOG_INFO;
static atomic_bool to_syslog = false;

void mlfs_log_init(bool foreground, enum mlfs_log_level min)
{
	if (!foreground)
		openlog("mlfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	atomic_store(&to_syslog, !foreground);
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

void mlfs_log(enum mlfs_log_level level, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	int saved = errno, head, n;
	va_list ap;

	if ((int)level > atomic_load(&min_level))
		return;
	head = snprintf(line, sizeof(line), "mlfs: %s: ", mlfs_log_level_name(level));
	va_start(ap, fmt);
	n = vsnprintf(line + head, sizeof(line) - (size_t)head - 1, fmt, ap);
	va_end(ap);
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
	errno = saved;
}
