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

#include "common/common.h"
#include "mount/mount_i.h"

void mlfs_pin_put(struct mlfs_pin *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	for (int i = 0; i < p->nbufs; i++)
		xf_buf_put(p->bufs[i]);
	free(p->remote);
	if (p->sh)
		mlfs_st_shard_release(p->sh);
	free(p->sh);
	free(p);
}

struct mlfs_pin *mlfs_pin_get(struct mlfs_pin *p)
{
	if (p)
		atomic_fetch_add(&p->refs, 1);
	return p;
}

uint64_t mlfs_path_hash(const char *p, uint64_t gen)
{
	return mlfs_hash_more(gen, p, strlen(p));
}

int mlfs_inodes_init(struct mlfs_daemon *d)
{
	d->inodes.cap = 1024;
	d->inodes.hcap = 4096;
	d->inodes.byino = calloc(d->inodes.cap, sizeof(*d->inodes.byino));
	d->inodes.hash = calloc(d->inodes.hcap, sizeof(*d->inodes.hash));
	struct mlfs_inode *root = calloc(1, sizeof(*root));
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

int mlfs_ino_get(struct mlfs_daemon *d, fuse_ino_t ino, char *buf, size_t cap,
		 struct mlfs_pin **pin)
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

struct mlfs_inode **mlfs_ino_slot(struct mlfs_daemon *d, const char *path, uint64_t gen)
{
	struct mlfs_inode **pp = &d->inodes.hash[mlfs_path_hash(path, gen) & (d->inodes.hcap - 1)];
	while (*pp && ((*pp)->gen != gen || strcmp((*pp)->path, path) != 0))
		pp = &(*pp)->hnext;
	return pp;
}

uint64_t mlfs_ino_lookup(struct mlfs_daemon *d, const char *path, uint64_t gen,
			 struct mlfs_pin *pin)
{
	uint64_t ino = 0;
	pthread_mutex_lock(&d->inodes.lock);
	struct mlfs_inode **pp = mlfs_ino_slot(d, path, gen);
	if (!*pp) {
		struct mlfs_inode *in = calloc(1, sizeof(*in));
		if (d->inodes.n == d->inodes.cap) {
			struct mlfs_inode **b =
			    realloc(d->inodes.byino, 2 * d->inodes.cap * sizeof(*b));
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
	struct mlfs_inode *in = ino < d->inodes.n ? d->inodes.byino[ino] : NULL;
	if (in && ino != FUSE_ROOT_ID) {
		in->nlookup = n >= in->nlookup ? 0 : in->nlookup - n;
		if (in->nlookup == 0) {
			*mlfs_ino_slot(d, in->path, in->gen) = in->hnext;
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
