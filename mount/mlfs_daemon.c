/*
 * mlfs_daemon.c - the daemon: start-up checks, the FUSE session and its loop.
 *
 * Start-up errors are printed on stderr ("mlfs mount: ..."), where the
 * command's user sees them; from fuse_daemonize on, stderr may be gone
 * (/dev/null without -f), so what happens after it is logged (mlfs_log,
 * common/common.h: stderr with -f, else syslog), the start and the stop
 * included.
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

#include "cluster/cluster.h"
#include "mount/mount_i.h"
#include "common/common.h"

void mlfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	conn->max_write = 1 << 20;
	conn->max_readahead = 1 << 20;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
	/* No atomic O_TRUNC: with it the kernel sets the size of the inode a
	 * writer opened to 0 and drops its pages, under the feet of readers of
	 * the same inode (the same version). Without it, open(O_TRUNC) arrives
	 * as a setattr on the writer's handle, which restarts its staging and
	 * answers the inode's unchanged size. */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
}

static const struct fuse_lowlevel_ops ops = {
    .init = mlfs_op_init,
    .lookup = mlfs_op_lookup,
    .forget = mlfs_op_forget,
    .forget_multi = mlfs_op_forget_multi,
    .getattr = mlfs_op_getattr,
    .setattr = mlfs_op_setattr,
    .open = mlfs_op_open,
    .read = mlfs_op_read,
    .write = mlfs_op_write,
    .flush = mlfs_op_flush,
    .release = mlfs_op_release,
    .fsync = mlfs_op_fsync,
    .opendir = mlfs_op_opendir,
    .readdir = mlfs_op_readdir,
    .releasedir = mlfs_op_releasedir,
    .mkdir = mlfs_op_mkdir,
    .create = mlfs_op_create,
    .unlink = mlfs_op_unlink,
    .rmdir = mlfs_op_rmdir,
    .rename = mlfs_op_rename,
    .mknod = mlfs_op_mknod,
    .symlink = mlfs_op_symlink,
    .link = mlfs_op_link,
    .getxattr = mlfs_op_getxattr,
    .listxattr = mlfs_op_listxattr,
    .setxattr = mlfs_op_setxattr,
    .statfs = mlfs_op_statfs,
    .poll = mlfs_op_poll,
};

static int64_t default_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	return pages > 0 && psize > 0 ? (int64_t)pages * psize / 10 * 9 : (int64_t)1 << 32;
}

/*
 * The kernel caps a FUSE mount's readahead at the block layer's default
 * (128 KiB), which halves cold sequential reads of large partitions. Raise
 * it to 1 MiB (our request size) when we may; the device number comes from
 * /proc/self/mountinfo because stat() on the mount would call into
 * ourselves before the loop runs.
 */
static void raise_readahead(const char *mountpoint)
{
	char real[PATH_MAX], line[8192], path[128];
	unsigned maj, min;
	FILE *f;

	if (!realpath(mountpoint, real) || !(f = fopen("/proc/self/mountinfo", "r")))
		return;
	while (fgets(line, sizeof(line), f)) {
		char mnt[4096];
		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &maj, &min, mnt) != 3 ||
		    strcmp(mnt, real) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
		FILE *ra = fopen(path, "w");
		if (ra) {
			fputs("4096\n", ra);
			fclose(ra);
		}
	}
	fclose(f);
}

/* The text of cluster.json (a regular file of at most 1 MiB; a FIFO is
 * refused, not waited on), or NULL with a message on stderr. */
static char *read_cluster(const char *path, size_t *len)
{
	const size_t max = (size_t)1 << 20;
	struct stat sb;
	char *text = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);

	if (fd < 0 || fstat(fd, &sb) < 0) {
		fprintf(stderr, "mlfs mount: %s: %s\n", path, strerror(errno));
	} else if (!S_ISREG(sb.st_mode)) {
		fprintf(stderr, "mlfs mount: %s: not a regular file\n", path);
	} else if ((size_t)sb.st_size > max) {
		fprintf(stderr, "mlfs mount: %s: %lld bytes, more than the limit %zu\n", path,
			(long long)sb.st_size, max);
	} else if (!(text = malloc((size_t)sb.st_size + 1))) {
		fprintf(stderr, "mlfs mount: out of memory\n");
	} else {
		ssize_t n = pread(fd, text, (size_t)sb.st_size, 0);
		if (n != (ssize_t)sb.st_size) {
			fprintf(stderr, "mlfs mount: %s: %s\n", path,
				n < 0 ? strerror(errno) : "changed while read");
			free(text);
			text = NULL;
		} else {
			text[n] = '\0';
			*len = (size_t)n;
		}
	}
	if (fd >= 0)
		close(fd);
	return text;
}

/*
 * Refuses a mount point that is not an empty-handed directory: a dead mount
 * left by a killed daemon (stat fails with ENOTCONN) or a live one would
 * otherwise be stacked under ours and resurface, stale, at our unmount.
 * 0, or 1 with a message on stderr.
 */
static int check_mountpoint(const char *mnt)
{
	char real[PATH_MAX], line[8192];
	struct statvfs vfs;
	struct stat sb;
	int busy = 0;

	/* statfs always asks the file system (stat may answer from a cache). */
	if (statvfs(mnt, &vfs) < 0 || stat(mnt, &sb) < 0) {
		if (errno == ENOTCONN)
			fprintf(stderr,
				"mlfs mount: %s: a dead mount is still there (its daemon was "
				"killed); run \"mlfs umount %s\" first\n",
				mnt, mnt);
		else
			fprintf(stderr, "mlfs mount: %s: %s\n", mnt, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "mlfs mount: %s: not a directory\n", mnt);
		return 1;
	}
	FILE *f = realpath(mnt, real) ? fopen("/proc/self/mountinfo", "r") : NULL;
	while (f && !busy && fgets(line, sizeof(line), f)) {
		char at[4096];
		busy = sscanf(line, "%*d %*d %*u:%*u %*s %4095s", at) == 1 && strcmp(at, real) == 0;
	}
	if (f)
		fclose(f);
	if (busy)
		fprintf(stderr,
			"mlfs mount: %s is already a mount point; unmount it first "
			"(\"mlfs umount %s\")\n",
			mnt, mnt);
	return busy;
}

/* A daemon context around @st (taken over), or NULL. */
static struct mlfs_daemon *daemon_new(struct mlfs_store *st)
{
	struct mlfs_daemon *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->st = st;
	pthread_mutex_init(&d->inodes.lock, NULL);
	pthread_mutex_init(&d->notes.lock, NULL);
	pthread_cond_init(&d->notes.cond, NULL);
	pthread_mutex_init(&d->polls.lock, NULL);
	pthread_mutex_init(&d->fresh.lock, NULL);
	d->uid = getuid();
	d->gid = getgid();
	if (mlfs_inodes_init(d)) {
		mlfs_inodes_release(d);
		free(d);
		return NULL;
	}
	return d;
}

static void daemon_free(struct mlfs_daemon *d)
{
	mlfs_inodes_release(d);
	pthread_mutex_destroy(&d->inodes.lock);
	pthread_mutex_destroy(&d->notes.lock);
	pthread_cond_destroy(&d->notes.cond);
	pthread_mutex_destroy(&d->polls.lock);
	pthread_mutex_destroy(&d->fresh.lock);
	free(d);
}

/* The cluster token: the first line of @path (a regular file of at most
 * 4 KiB), trimmed; NULL with a message on stderr. */
static char *read_token(const char *path)
{
	char buf[4097];
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	ssize_t n = -1;

	if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size < 4097)
		n = pread(fd, buf, sizeof(buf) - 1, 0);
	else if (fd >= 0)
		errno = S_ISREG(sb.st_mode) ? EFBIG : EINVAL;
	int e = errno;
	if (fd >= 0)
		close(fd);
	if (n < 0) {
		fprintf(stderr, "mlfs mount: token file %s: %s\n", path,
			e == EINVAL ? "not a regular file" : strerror(e));
		return NULL;
	}
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	return strdup(buf);
}

/* A job of many nodes: serves the peers (mlfs_peer) and joins the control
 * plane (mlfs_cluster). 0, or 1 with a message on stderr. */
static int join_job(struct mlfs_store *st, const struct mlfs_options *o, struct mlfs_peer **peer,
		    struct mlfs_cluster **cluster)
{
	const char *tf = o->token_file ? o->token_file : st->cluster->token_file;
	struct ptc_error why;
	char *token;

	if (!tf) {
		fprintf(stderr,
			"mlfs mount: a job of %d nodes needs the cluster token: "
			"\"token_file\" in %s or --token-file\n",
			st->cluster->nnodes, o->cluster_path);
		return 1;
	}
	if (!(token = read_token(tf)))
		return 1;
	/* --peer-listen: the server binds there while peers still connect to
	 * this node's addr (a proxy in front of it). */
	int rc = mlfs_peer_start(st, o->peer_listen, token, peer, &why);
	free(token);
	if (rc) {
		fprintf(stderr, "mlfs mount: %s\n", why.text);
		return 1;
	}
	struct mlfs_backup *backup;
	if ((rc = mlfs_backup_start(st, &backup))) {
		fprintf(stderr, "mlfs mount: cannot start the backup thread: %s\n", strerror(-rc));
		mlfs_peer_free(*peer);
		*peer = NULL;
		return 1;
	}
	__atomic_store_n(&st->backup, backup, __ATOMIC_RELEASE);
	if (mlfs_cluster_start(st, cluster, &why)) {
		fprintf(stderr, "mlfs mount: %s\n", why.text);
		mlfs_peer_stop(*peer);
		mlfs_backup_stop(backup);
		st->backup = NULL;
		mlfs_peer_free(*peer);
		*peer = NULL;
		return 1;
	}
	return 0;
}

int mlfs_daemon_run(const struct mlfs_options *o)
{
	struct ptc_error err = {.text = ""};
	struct ptc_cluster *cl;
	struct mlfs_store *st;
	struct mlfs_daemon *d;
	size_t len;
	bool io = false;
	int rc = 1;

	mlfs_log_init(o->foreground, o->log_level ? o->log_level : MLFS_LOG_INFO);
	if (check_mountpoint(o->mountpoint))
		return 1;
	char *text = read_cluster(o->cluster_path, &len);
	if (!text)
		return 1;
	if (ptc_cluster_parse_text(text, len, o->cluster_path, &cl, &err)) {
		fprintf(stderr, "mlfs mount: %s\n", err.text);
		free(text);
		return 1;
	}
	int node = ptc_cluster_find(cl, o->node_id);
	if (node < 0) {
		fprintf(stderr, "mlfs mount: --node \"%s\" is not in %s\n", o->node_id,
			o->cluster_path);
		ptc_cluster_free(cl);
		free(text);
		return 1;
	}
	if (!(st = calloc(1, sizeof(*st)))) {
		fprintf(stderr, "mlfs mount: out of memory\n");
		ptc_cluster_free(cl);
		free(text);
		return 1;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	/* The store owns cl and text from here on, also when its init fails. */
	if (mlfs_store_init(st, cl, text, node, o->max_memory ? o->max_memory : default_memory(),
			    o->threads ? o->threads : (int)(cpus > 0 ? cpus : 1)) ||
	    !(d = daemon_new(st))) {
		fprintf(stderr, "mlfs mount: out of memory\n");
		goto out_free_store;
	}
	st->data_opts.cache_bytes = o->data_cache;
	st->data_opts.http_timeout_ms = o->http_timeout_ms;
	st->data_opts.http_deadline_ms = o->http_deadline_ms;
	st->data_opts.prefetch = o->prefetch < 0 ? 4 : o->prefetch;
	struct mlfs_peer *peer = NULL;
	struct mlfs_cluster *cluster = NULL;
	if (mlfs_autosnap_start(st)) {
		fprintf(stderr, "mlfs mount: cannot start a thread\n");
		goto out_daemon;
	}
	if (cl->nnodes > 1 && join_job(st, o, &peer, &cluster))
		goto out_daemon;

	char *argv[] = {"mlfs", "-o", "fsname=mlfs,subtype=mlfs,default_permissions", NULL};
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), d);
	fuse_opt_free_args(&args); /* the session keeps what it needs */
	if (!se) {
		fprintf(stderr, "mlfs mount: cannot start a FUSE session\n");
		goto out_daemon;
	}
	if (fuse_set_signal_handlers(se)) {
		fprintf(stderr, "mlfs mount: cannot set signal handlers\n");
		goto out_session;
	}
	if (fuse_session_mount(se, o->mountpoint)) {
		fprintf(stderr, "mlfs mount: cannot mount at %s\n", o->mountpoint);
		goto out_signals;
	}
	raise_readahead(o->mountpoint);
	fuse_daemonize(o->foreground);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	if (!lc) {
		mlfs_log(MLFS_LOG_ERROR, "cannot serve %s: out of memory", o->mountpoint);
		goto out_unmount;
	}
	fuse_loop_cfg_set_max_threads(lc, 16);
	fuse_loop_cfg_set_idle_threads(lc, 8);
	io = mlfs_io_start(&d->io, MLFS_IO_THREADS) == 0;
	if (io && mlfs_notify_start(d, se) == 0) {
		st->changed_arg = d;
		st->changed = mlfs_notify_store_changed;
		st->status_changed = mlfs_notify_status_changed;
		mlfs_log(MLFS_LOG_INFO, "serving %s as node \"%s\" (pid %d)", o->mountpoint,
			 o->node_id, (int)getpid());
		int lrc = fuse_session_loop_mt(se, lc);
		if (lrc < 0)
			mlfs_log(MLFS_LOG_ERROR, "%s: the FUSE session failed: %s", o->mountpoint,
				 strerror(-lrc));
		else if (lrc > 0)
			mlfs_log(MLFS_LOG_INFO, "%s: stopped by signal %d (%s)", o->mountpoint, lrc,
				 strsignal(lrc));
		rc = lrc ? 1 : 0;
	} else {
		mlfs_log(MLFS_LOG_ERROR, "cannot serve %s: cannot start a thread", o->mountpoint);
	}
	fuse_loop_cfg_destroy(lc);
out_unmount:
	fuse_session_unmount(se);
	if (io)
		mlfs_io_stop(&d->io);
	st->status_changed = NULL;
	mlfs_notify_polls_end(d);
	if (!mlfs_notify_stop(d)) {
		mlfs_log(MLFS_LOG_ERROR,
			 "%s: a kernel notification did not return; exiting "
			 "without closing the session",
			 o->mountpoint);
		return rc;
	}
	mlfs_log(MLFS_LOG_INFO, "%s: unmounted; exiting with status %d", o->mountpoint, rc);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_daemon:
	mlfs_autosnap_stop(st);
	mlfs_backup_halt(st->backup); /* it calls the control plane's hooks */
	mlfs_cluster_stop(cluster);
	mlfs_peer_stop(peer); /* its server threads read the backups ... */
	mlfs_backup_stop(st->backup);
	mlfs_peer_free(peer); /* ... whose thread fetches with its client */
	daemon_free(d);
out_free_store:
	mlfs_reconf_shutdown(st); /* the transformer thread, a prepared attempt */
	mlfs_store_release(st);
	free(st);
	return rc;
}
