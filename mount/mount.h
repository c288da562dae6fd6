/*
 * mount.h - the mlfs daemon: one node's tensor store behind a FUSE mount.
 */
#ifndef MLFS_MOUNT_H
#define MLFS_MOUNT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

struct mlfs_options {
	const char *mountpoint;
	const char *node_id;
	const char *cluster_path;
	int64_t max_memory; /* bytes; 0 = 90% of physical memory */
	bool foreground;
	int threads;	      /* transformer threads; 0 = online CPUs */
	int64_t data_cache;   /* dataset block cache bytes; 0 = 1 GiB */
	int prefetch;	      /* dataset steps assembled ahead; < 0 = 4 */
	int http_timeout_ms;  /* dataset HTTP request receiving nothing this long fails; 0 = 10 s */
	int http_deadline_ms; /* one read of a dataset source, retries included; 0 = 60 s */
	enum mlfs_log_level log_level; /* least severe level logged; 0 = info (common.h) */
	const char *token_file;	       /* the cluster token; NULL: cluster.json's token_file */
	const char *peer_listen;       /* serve peers here; NULL: this node's cluster.json addr */
};

/*
 * Mounts the store at o->mountpoint and serves it until unmounted (or
 * SIGINT/SIGTERM). Returns the process exit status: 0 after a clean
 * unmount, 1 with a message on stderr when it cannot start. While it runs,
 * events are logged (mlfs_log, common/common.h) to stderr with
 * o->foreground, else to syslog. Call once, from main().
 */
int mlfs_daemon_run(const struct mlfs_options *o);

/* The most bytes a control file's text may have; a longer write fails with
 * EFBIG. Open writers' texts also count in --max-memory. */
#define MLFS_MAX_SCHEMA_TEXT ((size_t)16 << 20)
#define MLFS_MAX_CONFIG_TEXT ((size_t)1 << 20)
#define MLFS_MAX_CTL_TEXT    ((size_t)64 << 10)

/* Name of the control file at the mount root used by `mlfs import`. */
#define MLFS_CTL_NAME ".mlfs-ctl"

#endif
