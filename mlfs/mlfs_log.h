/*
 * mlfs_log.h - the daemon's log: one line per event, level first
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
#ifndef MLFS_MLFS_LOG_H
#define MLFS_MLFS_LOG_H

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

#endif
