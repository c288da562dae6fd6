/*
 * mlfs_notify.c - telling the kernel which names a commit superseded.
 *
 * DESIGN
 * After a commit the kernel is told to drop the names whose content changed
 * (fuse_lowlevel_notify_inval_entry), so that it forgets the superseded
 * inodes as soon as no file holds them open, and their pinned buffers are
 * freed; without it they would stay until the next lookup of the same name
 * or memory pressure. A thread of its own sends them: the kernel takes the
 * directory's lock to drop a name, and a FUSE worker holding a request in
 * that directory must never wait for it. The queue is bounded: past
 * MLFS_NOTIFY_MAX paths it collapses into one "everything" entry.
 *
 * status.json can be polled: `mlfs reconfigure` (or any script) reads it,
 * keeps the file open and polls it; the handle turns readable when what a
 * waiter looks at changed since its open (the store's status_gen: state,
 * version, lost, error, every node swapped), and the waiter opens it again
 * for the new text. The kernel's handle for a poll that found nothing new
 * is kept until the store's next change, which wakes (fuse_lowlevel_notify_
 * poll: a write to the session's device that takes no lock of the kernel's
 * a FUSE request could hold) and frees every one kept.
 */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "mount/mount_i.h"

/* Queues @path ("" = the whole ranks/ and full/ trees). Any thread. */
static void notify_path(struct mlfs_daemon *d, const char *path)
{
	pthread_mutex_lock(&d->notes.lock);
	if (d->notes.running && !d->notes.all) {
		char *p = *path && d->notes.n < MLFS_NOTIFY_MAX ? strdup(path) : NULL;
		if (p)
			d->notes.paths[d->notes.n++] = p;
		else
			d->notes.all = true;
		pthread_cond_signal(&d->notes.cond);
	}
	pthread_mutex_unlock(&d->notes.lock);
}

/* The store's "content changed" callback. */
void mlfs_notify_store_changed(void *arg, const char *prefix)
{
	notify_path(arg, prefix);
}

/* Drops the kernel's name @path, if it knows its directory. */
static void notify_one(struct mlfs_daemon *d, const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];
	uint64_t dino = 0;
	size_t dlen = slash ? (size_t)(slash - path) : 0;

	if (dlen >= sizeof(dir))
		return;
	memcpy(dir, path, dlen);
	dir[dlen] = '\0';
	pthread_mutex_lock(&d->inodes.lock);
	struct mlfs_inode *in = *mlfs_ino_slot(d, dir, 0);
	if (in)
		dino = in->ino;
	pthread_mutex_unlock(&d->inodes.lock);
	const char *name = slash ? slash + 1 : path;
	if (dino) /* an error means the kernel had no such name: nothing to drop */
		fuse_lowlevel_notify_inval_entry(d->notes.se, dino, name, strlen(name));
}

static void *notify_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-notify"); /* for top -H, perf */
	struct mlfs_daemon *d = arg;
	char *batch[MLFS_NOTIFY_MAX];
	(void)arg;
	pthread_mutex_lock(&d->notes.lock);
	for (;;) {
		while (!d->notes.n && !d->notes.all && !d->notes.stop)
			pthread_cond_wait(&d->notes.cond, &d->notes.lock);
		if (d->notes.stop)
			break;
		int n = d->notes.n;
		bool all = d->notes.all;
		memcpy(batch, d->notes.paths, (size_t)n * sizeof(batch[0]));
		d->notes.n = 0;
		d->notes.all = false;
		pthread_mutex_unlock(&d->notes.lock);
		if (all) {
			notify_one(d, "ranks");
			notify_one(d, "full");
		}
		for (int i = 0; i < n; i++) {
			if (!all)
				notify_one(d, batch[i]);
			free(batch[i]);
		}
		pthread_mutex_lock(&d->notes.lock);
	}
	for (int i = 0; i < d->notes.n; i++)
		free(d->notes.paths[i]);
	d->notes.n = 0;
	pthread_mutex_unlock(&d->notes.lock);
	return NULL;
}

int mlfs_notify_start(struct mlfs_daemon *d, struct fuse_session *se)
{
	d->notes.se = se;
	d->notes.running = true;
	int rc = -pthread_create(&d->notes.thread, NULL, notify_main, d);
	if (rc)
		d->notes.running = false;
	return rc;
}

/* Stops the thread; call once the session is unmounted (a notification in
 * flight then fails instead of waiting for a request nobody serves). Returns
 * false when the thread is still stuck in the kernel after a few seconds
 * (the session must then outlive it: it is not destroyed). */
bool mlfs_notify_stop(struct mlfs_daemon *d)
{
	pthread_mutex_lock(&d->notes.lock);
	bool running = d->notes.running;
	d->notes.stop = true;
	d->notes.running = false;
	pthread_cond_signal(&d->notes.cond);
	pthread_mutex_unlock(&d->notes.lock);
	if (!running)
		return true;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	return pthread_timedjoin_np(d->notes.thread, NULL, &until) == 0;
}

/* Wakes and frees the handles in polls.ph. */
static void polls_wake(struct mlfs_daemon *d)
{
	struct fuse_pollhandle *ph[MLFS_POLLS_MAX];

	pthread_mutex_lock(&d->polls.lock);
	int n = d->polls.n;
	memcpy(ph, d->polls.ph, (size_t)n * sizeof(ph[0]));
	d->polls.n = 0;
	pthread_mutex_unlock(&d->polls.lock);
	for (int i = 0; i < n; i++) {
		fuse_lowlevel_notify_poll(ph[i]); /* an error: the file is gone */
		fuse_pollhandle_destroy(ph[i]);
	}
}

void mlfs_notify_status_changed(void *arg)
{
	polls_wake(arg);
}

void mlfs_notify_polls_end(struct mlfs_daemon *d)
{
	polls_wake(d);
}

void mlfs_op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		  struct fuse_pollhandle *ph)
{
	struct mlfs_daemon *d = fuse_req_userdata(req);
	struct mlfs_fh *f = (struct mlfs_fh *)(uintptr_t)fi->fh;
	unsigned ready = POLLIN | POLLRDNORM;
	(void)ino;

	if (f->kind != MLFS_K_STATUS) {
		if (ph)
			fuse_pollhandle_destroy(ph);
		fuse_reply_poll(req, ready | (f->write ? POLLOUT | POLLWRNORM : 0));
		return;
	}
	pthread_mutex_lock(&d->polls.lock);
	/* (the generation is read under the lock that a change's wake-up
	 * takes after moving it: a change after this read wakes this handle) */
	bool moved = atomic_load(&d->st->status_gen) != f->status_gen;
	if (moved || !ph) {
		pthread_mutex_unlock(&d->polls.lock);
	} else {
		bool full = d->polls.n == MLFS_POLLS_MAX;
		if (!full)
			d->polls.ph[d->polls.n++] = ph;
		pthread_mutex_unlock(&d->polls.lock);
		if (full) { /* the waiters read again; this one keeps its place */
			polls_wake(d);
			pthread_mutex_lock(&d->polls.lock);
			d->polls.ph[d->polls.n++] = ph;
			pthread_mutex_unlock(&d->polls.lock);
		}
		ph = NULL;
	}
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, moved ? ready | POLLPRI : 0);
}

/* Queues the names whose content a commit of (rank, state, tensor) of @v
 * changed: the partition and its full tensor. */
void mlfs_notify_part(struct mlfs_daemon *d, const struct mlfs_view *v, int rank, int state,
		      int tensor)
{
	const struct ptc_schema *s = d->st->schema;
	char path[4096];
	(void)v;
	snprintf(path, sizeof(path), "ranks/%d/%s/%s.npy", rank, s->states[state].name,
		 s->tensors[tensor].name);
	notify_path(d, path);
	snprintf(path, sizeof(path), "full/%s/%s.npy", s->states[state].name,
		 s->tensors[ptc_schema_logical(s, tensor)].name);
	notify_path(d, path);
}
