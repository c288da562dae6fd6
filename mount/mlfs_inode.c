/*
 * mlfs_inode.c - the inode table and the content each inode pins.
 */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "mount/mount_i.h"

void mlfs_pin_put(struct pin *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	for (int i = 0; i < p->nbufs; i++)
		xf_buf_put(p->bufs[i]);
	free(p->remote);
	free(p);
}

struct pin *mlfs_pin_get(struct pin *p)
{
	if (p)
		atomic_fetch_add(&p->refs, 1);
	return p;
}

uint64_t mlfs_path_hash(const char *p, uint64_t gen)
{
	uint64_t h = 1469598103934665603ull ^ gen;
	while (*p)
		h = (h ^ (uint8_t)*p++) * 1099511628211ull;
	return h;
}

int mlfs_inodes_init(struct mlfs_daemon *d)
{
	d->inodes.cap = 1024;
	d->inodes.hcap = 4096;
	d->inodes.byino = calloc(d->inodes.cap, sizeof(*d->inodes.byino));
	d->inodes.hash = calloc(d->inodes.hcap, sizeof(*d->inodes.hash));
	struct inode *root = calloc(1, sizeof(*root));
	if (!d->inodes.byino || !d->inodes.hash || !root || !(root->path = strdup("")))
		return -ENOMEM;
	root->ino = FUSE_ROOT_ID;
	root->nlookup = 1;
	d->inodes.byino[FUSE_ROOT_ID] = root;
	d->inodes.hash[mlfs_path_hash("", 0) & (d->inodes.hcap - 1)] = root;
	d->inodes.n = FUSE_ROOT_ID + 1;
	return 0;
}

void mlfs_inodes_release(struct mlfs_daemon *d)
{
	for (size_t i = 0; i < d->inodes.n; i++)
		if (d->inodes.byino[i]) {
			mlfs_pin_put(d->inodes.byino[i]->pin);
			free(d->inodes.byino[i]->path);
			free(d->inodes.byino[i]);
		}
	free(d->inodes.byino);
	free(d->inodes.hash);
}

/* Path of @ino copied into @buf, and a reference to its pinned content into
 * @pin when given (NULL when it has none); -ESTALE when unknown. */
int mlfs_ino_get(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap, struct pin **pin)
{
	int rc = -ESTALE;
	pthread_mutex_lock(&d->inodes.lock);
	if (ino < d->inodes.n && d->inodes.byino[ino]) {
		snprintf(buf, cap, "%s", d->inodes.byino[ino]->path);
		if (pin)
			*pin = mlfs_pin_get(d->inodes.byino[ino]->pin);
		rc = 0;
	}
	pthread_mutex_unlock(&d->inodes.lock);
	return rc;
}

int mlfs_ino_path(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap)
{
	return mlfs_ino_get(d, ino, buf, cap, NULL);
}

struct inode **mlfs_hash_slot(struct mlfs_daemon *d, const char *path, uint64_t gen)
{
	struct inode **pp = &d->inodes.hash[mlfs_path_hash(path, gen) & (d->inodes.hcap - 1)];
	while (*pp && ((*pp)->gen != gen || strcmp((*pp)->path, path) != 0))
		pp = &(*pp)->hnext;
	return pp;
}

/* The inode of (@path, @gen), created if new, with one more lookup. A new
 * inode takes over @pin; an existing one keeps its own and @pin is put.
 * 0 on ENOMEM. */
uint64_t mlfs_ino_lookup(struct mlfs_daemon *d, const char *path, uint64_t gen, struct pin *pin)
{
	uint64_t ino = 0;
	pthread_mutex_lock(&d->inodes.lock);
	struct inode **pp = mlfs_hash_slot(d, path, gen);
	if (!*pp) {
		struct inode *in = calloc(1, sizeof(*in));
		if (d->inodes.n == d->inodes.cap) {
			struct inode **b = realloc(d->inodes.byino, 2 * d->inodes.cap * sizeof(*b));
			if (b) {
				memset(b + d->inodes.cap, 0, d->inodes.cap * sizeof(*b));
				d->inodes.byino = b;
				d->inodes.cap *= 2;
			}
		}
		if (!in || d->inodes.n == d->inodes.cap || !(in->path = strdup(path))) {
			free(in);
			goto out;
		}
		in->ino = d->inodes.n++;
		in->gen = gen;
		in->pin = pin;
		pin = NULL;
		d->inodes.byino[in->ino] = in;
		*pp = in;
	}
	(*pp)->nlookup++;
	ino = (*pp)->ino;
out:
	pthread_mutex_unlock(&d->inodes.lock);
	mlfs_pin_put(pin);
	return ino;
}

void mlfs_ino_forget(struct mlfs_daemon *d, fuse_ino_t ino, uint64_t n)
{
	pthread_mutex_lock(&d->inodes.lock);
	struct inode *in = ino < d->inodes.n ? d->inodes.byino[ino] : NULL;
	if (in && ino != FUSE_ROOT_ID) {
		in->nlookup = n >= in->nlookup ? 0 : in->nlookup - n;
		if (in->nlookup == 0) {
			*mlfs_hash_slot(d, in->path, in->gen) = in->hnext;
			d->inodes.byino[ino] = NULL;
		} else {
			in = NULL;
		}
	} else {
		in = NULL;
	}
	pthread_mutex_unlock(&d->inodes.lock);
	if (in) { /* outside the lock: the last put of a pin frees buffers */
		mlfs_pin_put(in->pin);
		free(in->path);
		free(in);
	}
}

/*
 * Without atomic O_TRUNC (see mlfs_op_init) the kernel sends the truncation of an
 * open(O_TRUNC) as a setattr *without* the file handle, right after the
 * open, from the same thread. To apply it to that handle's staging (and not
 * to the content others read), writers are listed here from their open to
 * their first write or truncation, by inode and thread.
 */

void mlfs_fresh_add(struct fh *f, fuse_ino_t ino, pid_t pid)
{
	struct mlfs_daemon *d = f->d;
	pthread_mutex_lock(&d->fresh.lock);
	f->ino = ino;
	f->pid = pid;
	atomic_store(&f->fresh_listed, true);
	f->fresh_next = d->fresh.head;
	d->fresh.head = f;
	pthread_mutex_unlock(&d->fresh.lock);
}

/* Removes @f, or when @f is NULL the handle of (@ino, @pid), from the list;
 * returns it with a reference, or NULL. */
struct fh *mlfs_fresh_take(struct mlfs_daemon *d, struct fh *f, fuse_ino_t ino, pid_t pid)
{
	struct fh *found = NULL;
	if (f && !atomic_load(&f->fresh_listed))
		return NULL;
	pthread_mutex_lock(&d->fresh.lock);
	for (struct fh **pp = &d->fresh.head; *pp; pp = &(*pp)->fresh_next) {
		struct fh *c = *pp;
		if (f ? c == f : c->ino == ino && c->pid == pid) {
			*pp = c->fresh_next;
			atomic_store(&c->fresh_listed, false);
			atomic_fetch_add(&c->refs, 1);
			found = c;
			break;
		}
	}
	pthread_mutex_unlock(&d->fresh.lock);
	return found;
}
