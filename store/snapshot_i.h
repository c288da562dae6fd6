/*
 * snapshot_i.h - what `mlfs snapshot` (mlfs_snapshot.c) and the periodic
 * snapshots (mlfs_autosnap.c) share: a node's boxes of a step, pinned, and
 * how they are written. Internal to store/.
 */
#ifndef MLFS_SNAPSHOT_I_H
#define MLFS_SNAPSHOT_I_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "store/store.h"

/* One file of a snapshot: rows [global, global + len) of a tensor's split
 * dimension, from a rank's partition. */
struct snap_box {
	int rank, state, tensor;
	int64_t global, len, local, prows; /* rows of the split dimension */
	struct xf_buf *buf;		   /* pinned */
	char path[1024];		   /* relative to the directory */
	uint64_t sum;			   /* of the uncompressed .npy bytes */
	int64_t bytes, zbytes;
	char why[256]; /* non-empty: it failed */
};

struct snap_opts {
	const char *dir;
	int level, threads;
	int64_t max_bytes_s; /* the writers' bound, 0: none */
	int wait_s;	     /* rank 0's node: for every owner node's list */
	/* Asked while rank 0's node waits: true stops waiting (NULL: never). */
	bool (*give_up)(void *arg, int64_t step);
	void *arg;
};

/* The boxes of @step that this node's ranks own in @v, each buffer pinned:
 * from the periodic pins (@periodic: v->psnap at @step; ranks pinned at
 * another step give none), else the backups' pins at @step or the
 * committed buffers. Store lock held. */
int mlfs_snap_collect(struct mlfs_store *st, struct mlfs_view *v, int64_t step, bool periodic,
		      struct snap_box **boxes, size_t *n, struct ptc_error *err);
void mlfs_snap_boxes_put(struct snap_box *boxes, size_t n);
/* Writes @boxes of @step into o->dir (no lock held) and this node's list
 * of them; on the node hosting rank 0, then waits for every owner node's
 * list and writes manifest.json. What it did goes into @out. */
int mlfs_snap_write(struct mlfs_store *st, struct mlfs_view *v, const struct snap_opts *o,
		    int64_t step, struct snap_box *boxes, size_t n, json_t *out,
		    struct ptc_error *err);

#endif
