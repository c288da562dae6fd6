/*
 * mlfs_io.c - the I/O workers: requests that may wait on the network or
 * the disk are answered from here, never from a FUSE worker.
 *
 * DESIGN
 * A FUSE handler whose work may block (opening a dataset view, which reads
 * shards over HTTP; applying a config.json that names a dataset index; an
 * import, which reads a checkpoint directory) fills a job and returns; one
 * of a few I/O threads runs it and calls fuse_reply_* itself (libfuse's
 * low-level API allows a reply from any thread). So however slow a source
 * is, the FUSE workers stay free for partition reads, status.json and the
 * rest of the mount.
 *
 * The queue is bounded (MLFS_IO_QUEUE_MAX jobs waiting): past it, a request
 * is answered EAGAIN at once rather than queued without end. At stop, jobs
 * still waiting are answered EINTR without running (the session is going);
 * running ones finish (their own timeouts bound them).
 *
 * Lock: io->lock guards the queue; never held while a job runs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "mount/mount_i.h"

static void *io_main(void *arg)
{
	pthread_setname_np(pthread_self(), "mlfs-io"); /* for top -H, perf */
	struct mlfs_io *io = arg;

	pthread_mutex_lock(&io->lock);
	for (;;) {
		while (!io->head && !io->stop)
			pthread_cond_wait(&io->cond, &io->lock);
		struct mlfs_io_job *j = io->head;
		if (!j)
			break; /* stopping, nothing left */
		io->head = j->next;
		if (!io->head)
			io->tail = NULL;
		io->queued--;
		bool stop = io->stop;
		pthread_mutex_unlock(&io->lock);
		if (stop)
			j->cancel(j);
		else
			j->run(j);
		pthread_mutex_lock(&io->lock);
	}
	pthread_mutex_unlock(&io->lock);
	return NULL;
}

int mlfs_io_start(struct mlfs_io *io, int nthreads)
{
	pthread_mutex_init(&io->lock, NULL);
	pthread_cond_init(&io->cond, NULL);
	io->head = io->tail = NULL;
	io->queued = 0;
	io->stop = false;
	io->nthreads = 0;
	if (nthreads > MLFS_IO_THREADS_MAX)
		nthreads = MLFS_IO_THREADS_MAX;
	for (int i = 0; i < nthreads; i++) {
		int rc = -pthread_create(&io->threads[i], NULL, io_main, io);
		if (rc) {
			mlfs_io_stop(io);
			return rc;
		}
		io->nthreads++;
	}
	return 0;
}

int mlfs_io_submit(struct mlfs_io *io, struct mlfs_io_job *j)
{
	int rc = 0;

	j->next = NULL;
	pthread_mutex_lock(&io->lock);
	if (io->stop || io->nthreads == 0) {
		rc = -ESHUTDOWN;
	} else if (io->queued >= MLFS_IO_QUEUE_MAX) {
		rc = -EAGAIN;
	} else {
		if (io->tail)
			io->tail->next = j;
		else
			io->head = j;
		io->tail = j;
		io->queued++;
		pthread_cond_signal(&io->cond);
	}
	pthread_mutex_unlock(&io->lock);
	return rc;
}

void mlfs_io_stop(struct mlfs_io *io)
{
	pthread_mutex_lock(&io->lock);
	io->stop = true;
	pthread_cond_broadcast(&io->cond);
	pthread_mutex_unlock(&io->lock);
	for (int i = 0; i < io->nthreads; i++)
		pthread_join(io->threads[i], NULL);
	io->nthreads = 0;
	pthread_mutex_destroy(&io->lock);
	pthread_cond_destroy(&io->cond);
}
