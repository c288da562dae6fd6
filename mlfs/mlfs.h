/*
 * mlfs.h - the mlfs daemon: one node's tensor store behind a FUSE mount.
 */
#ifndef MLFS_MLFS_H
#define MLFS_MLFS_H

#include <stdbool.h>
#include <stdint.h>

struct mlfs_options {
	const char *mountpoint;
	const char *node_id;
	const char *cluster_path;
	int64_t max_memory; /* bytes; 0 = 90% of physical memory */
	bool foreground;
	int threads;	    /* transformer threads; 0 = online CPUs */
	int64_t data_cache; /* dataset block cache bytes; 0 = 1 GiB */
	int prefetch;	    /* dataset steps assembled ahead; < 0 = 4 */
};

/*
 * Mounts the store at o->mountpoint and serves it until unmounted (or
 * SIGINT/SIGTERM). Returns the process exit status: 0 after a clean
 * unmount, 1 with a message on stderr when it cannot start.
 * Call once, from main().
 */
int mlfs_daemon_run(const struct mlfs_options *o);

/* Name of the control file at the mount root used by `mlfs import`. */
#define MLFS_CTL_NAME ".mlfs-ctl"

#endif
