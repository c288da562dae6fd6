/*
 * mlfs_srcfile.c - file:// objects of a dataset source: opening, pinning
 * and closing their files, whole-file fetches, preadv loops.
 *
 * Files a user names (an index, offsets, shards) are opened with
 * O_NONBLOCK and refused unless fstat says regular: opening a FIFO for
 * reading would otherwise wait for a writer forever, uninterruptibly.
 *
 * A file object's fd (and, with file_direct, a read-only shared mapping of
 * the size it had at open) is shared by every readv: fd_users counts the
 * readvs pinning it. Past SRC_MAX_FDS open files, the least recently pinned
 * idle one is closed. A file found shorter than its mapping is marked
 * `reopen` (mlfs_srcobj_reopen): its pins see no mapping any more, and the
 * last unpin closes it, so the next readv opens it again and sees its new
 * size.
 *
 * Threads: the objects' fd, map, reopen and fd_users fields and s->nfds are
 * under s->lock; opening, mapping, closing and reading are done without it
 * (a file detached under the lock is closed after it is released).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dataset/dataset_i.h"

/* An open file detached from its object, to be closed without the lock. */
struct opened {
	int fd;
	const uint8_t *map;
	int64_t maplen;
};

static void opened_close(struct opened *c)
{
	if (c->map)
		munmap((void *)c->map, (size_t)c->maplen);
	if (c->fd >= 0)
		close(c->fd);
}

/* Detaches @o's open file into @c. Lock held. */
static void obj_detach(struct mlfs_src *s, struct src_obj *o, struct opened *c)
{
	*c = (struct opened){o->fd, o->map, o->maplen};
	o->fd = -1;
	o->map = NULL;
	o->reopen = false;
	s->nfds--;
}

/* Detaches the least recently pinned idle file, if any, into @c. Lock held. */
static void fd_evict(struct mlfs_src *s, struct opened *c)
{
	struct src_obj *idlest = NULL;

	for (size_t i = 0; i < s->nobj_buckets; i++)
		for (struct src_obj *o = s->objs[i]; o; o = o->next)
			if (o->fd >= 0 && !o->fd_users && (!idlest || o->fd_tick < idlest->fd_tick))
				idlest = o;
	if (idlest)
		obj_detach(s, idlest, c);
}

/*
 * Opens @path for reading without waiting on it: -EIO naming @uri unless it
 * is a regular file (a FIFO would block the open until a writer came, a
 * device could block its reads). On success the fd (blocking again) and
 * *@st.
 */
static int file_open(const char *uri, const char *path, struct stat *st, struct ptc_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), flags, e;

	if (fd < 0)
		return ptc_error_set(err, -EIO, "%s: %m", uri);
	if (fstat(fd, st) || (flags = fcntl(fd, F_GETFL)) < 0)
		goto err_close;
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return ptc_error_set(err, -EIO, "%s: not a regular file", uri);
	}
	if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK))
		goto err_close;
	return fd;

err_close:
	e = errno;
	close(fd);
	errno = e;
	return ptc_error_set(err, -EIO, "%s: %m", uri);
}

int mlfs_srcfile_pin(struct mlfs_src *s, struct src_obj *o, int *fd, const uint8_t **map,
		     struct ptc_error *err)
{
	struct stat st;
	int nfd;
	struct opened extra = {-1, NULL, 0}, idle = {-1, NULL, 0};
	const uint8_t *nmap = NULL;

	pthread_mutex_lock(&s->lock);
	if (o->fd >= 0) {
		o->fd_users++;
		o->fd_tick = ++s->tick;
		*fd = o->fd;
		*map = o->reopen ? NULL : o->map;
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	pthread_mutex_unlock(&s->lock);

	if ((nfd = file_open(o->uri, o->uri + 7, &st, err)) < 0)
		return nfd;
	if (s->o.file_direct && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, nfd, 0);
		nmap = m == MAP_FAILED ? NULL : m; /* no mapping: preadv only */
	}
	pthread_mutex_lock(&s->lock);
	if (o->fd >= 0) {
		extra = (struct opened){nfd, nmap, st.st_size}; /* another thread's meanwhile */
	} else {
		o->fd = nfd;
		o->map = nmap;
		o->maplen = st.st_size;
		o->size = st.st_size;
		s->nfds++;
	}
	o->fd_users++;
	o->fd_tick = ++s->tick;
	*fd = o->fd;
	*map = o->reopen ? NULL : o->map;
	if (s->nfds > SRC_MAX_FDS)
		fd_evict(s, &idle);
	pthread_mutex_unlock(&s->lock);
	opened_close(&extra);
	opened_close(&idle);
	return 0;
}

void mlfs_srcfile_unpin(struct mlfs_src *s, struct src_obj *o)
{
	struct opened c = {-1, NULL, 0};

	pthread_mutex_lock(&s->lock);
	assert(o->fd_users > 0);
	if (!--o->fd_users && o->reopen)
		obj_detach(s, o, &c);
	pthread_mutex_unlock(&s->lock);
	opened_close(&c);
}

void mlfs_srcfile_close(struct mlfs_src *s, struct src_obj *o)
{
	struct opened c;

	if (o->fd < 0)
		return;
	obj_detach(s, o, &c);
	opened_close(&c);
}

/* ------------------------------------------------------------------ reads */

int mlfs_srcfile_fetch(struct mlfs_src *s, const char *uri, int64_t max, uint8_t **data,
		       size_t *len, struct ptc_error *err)
{
	struct stat st;
	uint8_t *buf;
	int64_t got = 0;
	int rc, fd = file_open(uri, uri + 7, &st, err);

	if (fd < 0)
		return fd;
	if (st.st_size > max) {
		rc = ptc_error_set(err, -EFBIG, "%s: holds %" PRId64 " bytes, more than %" PRId64,
				   uri, (int64_t)st.st_size, max);
		goto err_close;
	}
	src_stat_add(&s->requests, 1);
	if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
		rc = ptc_error_set(err, -ENOMEM, "%s: out of memory", uri);
		goto err_close;
	}
	while (got < st.st_size) {
		ssize_t n = pread(fd, buf + got, (size_t)(st.st_size - got), got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = ptc_error_set(err, -EIO, "%s: %m", uri);
			src_stat_add(&s->failures, 1);
			goto err_free_buf;
		}
		if (n == 0)
			break; /* shrank meanwhile: what is there */
		got += n;
	}
	close(fd);
	src_stat_add(&s->bytes_fetched, got);
	*data = buf;
	*len = (size_t)got;
	return 0;

err_free_buf:
	free(buf);
err_close:
	close(fd);
	return rc;
}

int mlfs_srcfile_preadv(int fd, const char *uri, struct iovec *v, int nv, int64_t pos, int64_t len,
			int flags, struct ptc_error *err)
{
	for (int64_t end = pos + len; pos < end;) {
		ssize_t got = preadv2(fd, v, nv, pos, flags);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && flags && (errno == EAGAIN || errno == EOPNOTSUPP))
			return -EAGAIN;
		if (got < 0)
			return ptc_error_set(err, -EIO, "%s: %m", uri);
		if (got == 0)
			return ptc_error_set(err, -EIO,
					     "%s: ends at byte %" PRId64
					     ", shorter than when opened (changed?)",
					     uri, pos);
		pos += got;
		while (got > 0) { /* consume the iovecs filled */
			if ((size_t)got >= v->iov_len) {
				got -= (ssize_t)v->iov_len;
				v++;
				nv--;
			} else {
				v->iov_base = (uint8_t *)v->iov_base + got;
				v->iov_len -= (size_t)got;
				got = 0;
			}
		}
	}
	return 0;
}

/* SRC_SPAN_IOV blocks a call. */
int mlfs_srcfile_read_blocks(struct mlfs_src *s, const struct src_obj *o, int fd,
			     struct src_blk **blks, int nb, int64_t a, struct ptc_error *err)
{
	struct iovec iov[SRC_SPAN_IOV];
	int64_t pos = a;

	src_stat_add(&s->requests, 1);
	for (int j = 0; j < nb;) {
		int nv = 0;
		int64_t len = 0;
		for (; j < nb && nv < SRC_SPAN_IOV; j++) {
			iov[nv++] = (struct iovec){blks[j]->data, (size_t)blks[j]->len};
			len += blks[j]->len;
		}
		int rc = mlfs_srcfile_preadv(fd, o->uri, iov, nv, pos, len, 0, err);
		if (rc)
			return rc;
		pos += len;
	}
	src_stat_add(&s->bytes_fetched, pos - a);
	return 0;
}
