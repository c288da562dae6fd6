/*
 * mlfs_jobsync.c - job/ across the nodes of a job: the coordinator merges
 * the participants' job/ trees into one manifest (in the attempt), and
 * each participant stages that tree before it votes (mlfs_attempt.c swaps
 * it in at the commit). The other nodes' trees and files come through the
 * peer client (mlfs_peer_job_manifest, mlfs_peer_job_get). A node whose
 * entry carries the digest of the coordinator's own tree (the tree it
 * swapped in, unchanged since: mlfs_jobsync_note_digest, and
 * st->job_gen) is not asked for its manifest. See cluster_i.h.
 *
 * Threads: the rounds' (round_lock; mlfs_cluster.c). Under the store lock it only lists job/
 * (the hashes are those cached when each file was written) and, for a
 * staged file this node already holds alike, shares that file's buffer:
 * no byte is copied or hashed under it. A fetched file is hashed once,
 * outside the lock, as the staged tree (this thread's alone) takes it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster/cluster_i.h"

struct mlfs_job *mlfs_jobsync_find(struct mlfs_job *root, const char *path)
{
	struct mlfs_job *j = root;
	while (j && *path) {
		size_t n = strcspn(path, "/");
		j = j->dir ? mlfs_job_child(j, path, n) : NULL;
		path += n;
		while (*path == '/')
			path++;
	}
	return j;
}

/* Whether node @from's job/ manifest names @path with the content @f holds
 * (size and hash) and an mtime after @m: that mtime, or 0 when it does
 * not (unreadable, gone, older), or -1 when its hash is another (changed
 * again since @f was fetched). */
static int64_t source_newer(struct mlfs_store *st, int from, const char *path,
			    const struct mlfs_job *f, int64_t m)
{
	struct ptc_error why;
	json_t *sm = NULL, *e;
	size_t i;
	int64_t newer = 0;

	if (mlfs_peer_job_manifest(st, from, &sm, &why))
		return 0;
	json_array_foreach(sm, i, e)
	{
		const char *p = json_string_value(json_object_get(e, "p"));
		if (!p || strcmp(p, path) != 0 || json_is_true(json_object_get(e, "d")))
			continue;
		const char *h = json_string_value(json_object_get(e, "h"));
		int64_t em = json_integer_value(json_object_get(e, "m"));
		if (h && strtoull(h, NULL, 16) == mlfs_job_hash(f) &&
		    (size_t)json_integer_value(json_object_get(e, "n")) == f->size)
			newer = em > m ? em : 0;
		else
			newer = -1;
		break;
	}
	json_decref(sm);
	return newer;
}

int mlfs_jobsync_stage(struct mlfs_store *st, const json_t *manifest, const char *coordinator,
		       struct mlfs_job **out, struct ptc_error *err)
{
	struct mlfs_job *root = mlfs_job_new_dir("job", &st->mem);
	int co = ptc_cluster_find(mlfs_store_cluster(st), coordinator);
	size_t i;
	json_t *e;
	int rc = root && co >= 0 ? 0 : -ENOMEM;

	json_array_foreach(manifest, i, e)
	{
		if (rc)
			break;
		const char *path = json_string_value(json_object_get(e, "p"));
		if (!path) {
			rc = ptc_errorf(err, "job/: a bad manifest");
			break;
		}
		const char *slash = strrchr(path, '/');
		char parent[4096];
		snprintf(parent, sizeof(parent), "%.*s", slash ? (int)(slash - path) : 0, path);
		struct mlfs_job *dir = mlfs_jobsync_find(root, parent), *f;
		if (!dir || (rc = mlfs_job_create(dir, slash ? slash + 1 : path,
						  json_is_true(json_object_get(e, "d")), &f))) {
			rc = rc ? rc : -EINVAL;
			ptc_error_set(err, rc, "job/%s: cannot stage it", path);
			break;
		}
		if (f->dir)
			continue;
		uint64_t want = strtoull(json_string_value(json_object_get(e, "h")), NULL, 16);
		size_t size = (size_t)json_integer_value(json_object_get(e, "n"));
		/* the time its source wrote it, not now: the next union (and
		 * the swap's, mlfs_job_keep_newer) compares it */
		int64_t m = json_integer_value(json_object_get(e, "m"));
		const char *src = json_string_value(json_object_get(e, "s"));
		bool own = src && strcmp(src, mlfs_store_cluster(st)->nodes[st->node].id) == 0;
		/* Alike here (by the hash cached when it was written): the staged
		 * file shares its buffer, no copy. This node's own copy, which
		 * the manifest names, shared even when written since: it is
		 * newer than the manifest's, and the swap would keep it anyway
		 * (its mtime goes with it). */
		pthread_mutex_lock(&st->lock);
		struct mlfs_job *mine = mlfs_jobsync_find(st->job, path);
		bool alike =
		    mine && !mine->dir && mine->size == size && mlfs_job_hash(mine) == want;
		if (mine && !mine->dir && (alike || own)) {
			if (!alike)
				m = mlfs_job_mtime_ns(mine);
			rc = mlfs_job_share(f, mine->buf);
		} else {
			mine = NULL;
		}
		pthread_mutex_unlock(&st->lock);
		if (rc == 0 && mine)
			mlfs_job_set_mtime(f, m);
		if (rc || mine)
			continue;
		uint8_t *data = NULL;
		size_t len = 0;
		/* fetched through the data plane's client: the token is its */
		int from = src ? ptc_cluster_find(mlfs_store_cluster(st), src) : co;
		if (from < 0) {
			rc = ptc_errorf(err, "job/%s: no node \"%s\"", path, src);
			break;
		}
		for (int tries = 0;; tries++) {
			struct ptc_error why;
			rc = mlfs_peer_job_get(st, from, path, &data, &len, &why);
			if (rc) { /* a 404: deleted there since its manifest was read */
				ptc_error_set(err, rc, "job/%s: cannot fetch it from node %s: %s",
					      path, mlfs_store_cluster(st)->nodes[from].id,
					      why.text);
				break;
			}
			/* hashed once, here (the staged tree is ours) */
			rc = mlfs_job_set(f, data, len);
			free(data);
			data = NULL;
			if (rc || (len == size && mlfs_job_hash(f) == want))
				break;
			/* Written at its source since the manifest was read: the
			 * newer copy, when the source's manifest now names these
			 * very bytes (its hash, cached when written, verifies
			 * them), with its mtime; changed again meanwhile: again. */
			int64_t newer = tries < 3 ? source_newer(st, from, path, f, m) : 0;
			if (newer > 0) {
				m = newer;
				break;
			}
			if (newer == 0) {
				rc = ptc_error_set(
				    err, -EIO,
				    "job/%s: node %s's copy changed since the attempt "
				    "started (written during the reconfiguration)",
				    path, mlfs_store_cluster(st)->nodes[from].id);
				break;
			}
		}
		mlfs_job_set_mtime(f, m);
	}
	if (rc) {
		mlfs_job_free(root);
		return rc;
	}
	/* Directories too keep their source's mtime, once their children are
	 * in (adding one set it to now): the swap's merge compares a file of
	 * this node's against a directory of the union by these times. */
	json_array_foreach(manifest, i, e)
	{
		struct mlfs_job *d =
		    json_is_true(json_object_get(e, "d"))
			? mlfs_jobsync_find(root, json_string_value(json_object_get(e, "p")))
			: NULL;
		if (d && d->dir)
			mlfs_job_set_mtime(d, json_integer_value(json_object_get(e, "m")));
	}
	*out = root;
	return 0;
}

/* By path: a directory before what it holds. */
static int cmp_paths(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_strs(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int mlfs_jobsync_digest(const json_t *manifest, char out[17])
{
	size_t n = json_array_size(manifest), i, len = 0;
	char **lines = calloc(n ? n : 1, sizeof(*lines));
	int rc = lines ? 0 : -ENOMEM;

	for (i = 0; i < n && rc == 0; i++)
		if (!(lines[i] = json_dumps(json_array_get(manifest, i),
					    JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)))
			rc = -ENOMEM;
		else
			len += strlen(lines[i]) + 1;
	char *all = rc ? NULL : malloc(len + 1), *p = all;
	if (rc == 0 && !all)
		rc = -ENOMEM;
	if (rc == 0) { /* the walk's order is each tree's own: sorted first */
		qsort(lines, n, sizeof(*lines), cmp_strs);
		for (i = 0; i < n; i++) {
			size_t k = strlen(lines[i]);
			memcpy(p, lines[i], k);
			p[k] = '\n';
			p += k + 1;
		}
		snprintf(out, 17, "%016" PRIx64, mlfs_hash(all, len));
	}
	for (i = 0; lines && i < n; i++)
		free(lines[i]);
	free(lines);
	free(all);
	return rc;
}

void mlfs_jobsync_note_digest(struct mlfs_cluster *c)
{
	char d[17] = "";
	struct mlfs_store *st = c->st;

	pthread_mutex_lock(&st->lock);
	uint64_t gen = atomic_load(&st->job_gen);
	json_t *m = mlfs_job_manifest(st->job);
	pthread_mutex_unlock(&st->lock);
	if (!m || mlfs_jobsync_digest(m, d))
		d[0] = '\0'; /* out of memory: no digest, the coordinator reads it */
	json_decref(m);
	pthread_mutex_lock(&c->lock);
	memcpy(c->job_digest, d, sizeof(d));
	c->job_digest_gen = gen;
	atomic_store(&c->job_woke, false);
	pthread_mutex_unlock(&c->lock);
}

/* The participants' manifests, read at once (a job of N nodes would
 * otherwise wait N round trips before its attempt exists). */
struct manifests {
	struct mlfs_store *st;
	const json_t *parts;
	json_t **m;  /* per participant; NULL: it did not answer */
	bool *known; /* per participant: this node's own, or the same (no request) */
	atomic_size_t next;
};

static void *manifest_worker(void *arg)
{
	struct manifests *w = arg;
	size_t i;
	while ((i = atomic_fetch_add(&w->next, 1)) < json_array_size(w->parts)) {
		const char *id = json_string_value(json_array_get(w->parts, i));
		struct ptc_error why;
		if (!id || w->known[i])
			continue;
		if (mlfs_peer_job_manifest(w->st, ptc_cluster_find(mlfs_store_cluster(w->st), id),
					   &w->m[i], &why))
			w->m[i] = NULL;
	}
	return NULL;
}

/* Marks in w->known this node (its manifest @mine into w->m) and every
 * participant whose entry in @entries carries @mine's digest: their job/
 * is this node's (the union gains nothing from them). The number of
 * participants left to read. */
static size_t known_manifests(struct manifests *w, const char *me, json_t *mine,
			      const json_t *entries)
{
	char d[17];
	size_t i, left = 0;
	json_t *p;
	bool digest = mine && mlfs_jobsync_digest(mine, d) == 0;

	json_array_foreach(w->parts, i, p)
	{
		const char *id = json_string_value(p);
		const char *theirs = json_string_value(
		    json_object_get(json_object_get(entries, id ? id : ""), "job"));
		if (id && strcmp(id, me) == 0) {
			w->known[i] = true;
			w->m[i] = json_incref(mine);
		} else if (id && digest && theirs && strcmp(theirs, d) == 0) {
			w->known[i] = true;
		} else {
			left++;
		}
	}
	return left;
}

json_t *mlfs_jobsync_merge(struct mlfs_store *st, const char *me, const json_t *parts,
			   const json_t *entries, json_t *missing, int *rc, size_t *nread)
{
	json_t *by = json_object(), *out = json_array(), *p;
	size_t i, np = json_array_size(parts);
	struct manifests w = {.st = st,
			      .parts = parts,
			      .m = calloc(np ? np : 1, sizeof(json_t *)),
			      .known = calloc(np ? np : 1, sizeof(bool))};
	pthread_mutex_lock(&st->lock);
	json_t *mine = mlfs_job_manifest(st->job);
	pthread_mutex_unlock(&st->lock);

	*nread = 0;
	if (!by || !out || !w.m || !w.known || !mine) {
		json_decref(by);
		json_decref(out);
		json_decref(mine);
		free(w.m);
		free(w.known);
		*rc = -ENOMEM;
		return NULL;
	}
	atomic_init(&w.next, 0);
	size_t left = known_manifests(&w, me, mine, entries);
	json_decref(mine);
	*nread = left;
	if (left) /* no thread when every node's job/ is known */
		mlfs_par_run(left < 32 ? (int)left : 32, manifest_worker, &w);
	json_array_foreach(parts, i, p) /* merged in the participants' order */
	{
		const char *id = json_string_value(p);
		json_t *m = w.m[i];
		if (!m && w.known[i])
			continue; /* the same as this node's, merged at its place */
		if (!m) {
			/* Frozen or slow: the attempt goes on, and that node's vote
			 * fails (its job/ would be lost otherwise). */
			json_array_append_new(missing, json_string(id));
			continue;
		}
		size_t j;
		json_t *e;
		json_array_foreach(m, j, e)
		{
			const char *path = json_string_value(json_object_get(e, "p"));
			json_t *have = path ? json_object_get(by, path) : NULL;
			if (!path || (have && json_integer_value(json_object_get(have, "m")) >=
						  json_integer_value(json_object_get(e, "m"))))
				continue;
			json_object_set_new(e, "s", json_string(id));
			json_object_set(by, path, e);
		}
		json_decref(m);
	}
	free(w.m);
	free(w.known);
	/* Sorted by path: a directory before what it holds. */
	size_t n = json_object_size(by), k = 0;
	const char **paths = malloc((n ? n : 1) * sizeof(*paths));
	const char *path;
	json_t *e;
	if (!paths) {
		json_decref(by);
		json_decref(out);
		*rc = -ENOMEM;
		return NULL;
	}
	json_object_foreach(by, path, e) paths[k++] = path;
	qsort(paths, n, sizeof(*paths), cmp_paths);
	/* A path that is a file on one node and a directory on another: the
	 * newest won above; when the file did, what the directory held has
	 * no place in the tree and goes (staging it under a file failed,
	 * and so did every attempt after). A parent sorts before its
	 * children, so it is decided first. */
	json_t *dirs = json_object();
	for (k = 0; k < n && dirs; k++) {
		const char *slash = strrchr(paths[k], '/');
		char parent[4096];
		snprintf(parent, sizeof(parent), "%.*s", slash ? (int)(slash - paths[k]) : 0,
			 paths[k]);
		if (slash && !json_object_get(dirs, parent))
			continue;
		e = json_object_get(by, paths[k]);
		if (json_is_true(json_object_get(e, "d")))
			json_object_set(dirs, paths[k], json_true());
		json_array_append(out, e);
	}
	free(paths);
	json_decref(by);
	if (!dirs) {
		json_decref(out);
		*rc = -ENOMEM;
		return NULL;
	}
	json_decref(dirs);
	*rc = 0;
	return out;
}
