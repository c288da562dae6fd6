/*
 * mlfs_peerserver.c - the data plane's server: this node serves its peers
 * rows of its partitions (a reconfiguration's fetches, backups), job/
 * files and health, to requests carrying the cluster token. Starting the
 * data plane (mlfs_peer_start) also starts its client (mlfs_peerclient.c),
 * with which this node fetches from theirs.
 *
 * DESIGN
 * Requests (net_server: token checked, bounded), all GET:
 *   /v1/health                   {"node", "version", "state", "retained"}
 *   /v1/part?version=V&rank=R&state=S&tensor=T&row=A&rows=N
 *       rows [A, A+N) of partition (R, S, T) of layout version V, for every
 *       outer block (ptc_tensor_geometry), back to back: outer * N * row
 *       bytes, with X-Mlfs-XXH3: the XXH3 of exactly those bytes, computed
 *       here from the committed buffer (for a whole partition, the checksum
 *       stored with it when it was committed: xf_buf.c), which the
 *       receiver checks before it uses them (mlfs_peerclient.c). Indices
 *       are the schema's (every node has the same schema: etcd's "schema"
 *       key says so). Gathered from the partition's buffer as the reply is
 *       sent (net_reply_stream): no copy of the range, and the buffer
 *       pinned until the reply ends, so a commit meanwhile cannot free it.
 *       With &snap=STEP: the rank's saved state at that step (a 409 when
 *       it saved another); with &backup=1: a dead node's rows from the
 *       backup this node holds (mlfs_backup.c); with &full=1: not counted
 *       in the reconfiguration's bytes served.
 *   /v1/parts?version=V&boxes=R.S.T.A.N,R.S.T.A.N,...
 *       several such ranges in one reply, back to back in the order asked
 *       (each as /v1/part sends it), with X-Mlfs-XXH3 over the whole body:
 *       the small pieces of one source a build batched (xf_execute). At
 *       most XF_BATCH_MAX boxes and XF_BATCH_BYTES bytes; hashed here and
 *       gathered from the pinned buffers as the reply is sent. A bad box
 *       is a 400 (404, 409) naming it; &full=1 as above.
 *   /v1/job?path=P               a job/ file's bytes
 *   /v1/jobmanifest              the job/ tree: paths, sizes, hashes, mtimes
 * and one POST:
 *   /v1/vote {"node", "to", "attempt", "vote"}
 *       a participant's vote ("ready", or "failed: <reason>") on the
 *       attempt this node coordinates (mlfs_votebox.c): 200 "{}" once it
 *       is in the box; a node that is not in the cluster, or a field
 *       missing or malformed, a 400 naming it.
 * The current layout is served (during an attempt that is the old one,
 * the one peers fetch from, until the commit), and the retained one (the
 * layout the last commit was planned from, until every node of that
 * commit swapped: mlfs_reconf.c). Every parameter is checked before use;
 * a bad one is a 400 naming it, an unknown partition a 404, a version
 * that is neither current nor retained a 409.
 *
 * Threads: server threads run the handlers. Nothing here holds a lock but
 * the store's, briefly, to pin a buffer (a partition's or a job/ file's)
 * or to list job/ for the manifest (paths, sizes and the hashes cached when
 * each file was written): no job/ file's bytes are copied or hashed under
 * it. A job/ file is sent from its pinned buffer (net_reply_pinned), put
 * when the reply ends.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_i.h"

struct mlfs_peer {
	struct mlfs_store *st;
	struct net_server *server;
	struct mlfs_peerclient *client;
};

/* A non-negative decimal argument below @max into *@v; false when absent
 * or malformed. */
static bool arg_int(struct net_request *r, const char *name, int64_t max, int64_t *v)
{
	const char *s = net_request_arg(r, name);
	char *end;
	if (!s || !*s || strlen(s) > 19 || s[0] == '-' || s[0] == '+')
		return false;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (*end || errno || x < 0 || x >= max)
		return false;
	*v = x;
	return true;
}

/* ------------------------------------------------------------ partitions */

/* Rows of a pinned partition, gathered block by block as they are sent. */
struct part_stream {
	struct mlfs_store *st;
	bool count; /* a reconfiguration's fetch: counted in st->served */
	struct xf_buf *buf;
	int64_t prows, row, rows, rb; /* partition rows; the range; row bytes */
};

static ssize_t part_read(void *arg, uint64_t pos, char *out, size_t max)
{
	struct part_stream *p = arg;
	int64_t seg = p->rows * p->rb, done = 0;
	while ((size_t)done < max) {
		int64_t at = (int64_t)pos + done, o = at / seg, off = at % seg;
		int64_t n = seg - off < (int64_t)max - done ? seg - off : (int64_t)max - done;
		if ((o + 1) * p->prows * p->rb > p->buf->size)
			break; /* past the last block */
		memcpy(out + done, p->buf->data + (o * p->prows + p->row) * p->rb + off, (size_t)n);
		done += n;
	}
	if (p->count)
		atomic_fetch_add(&p->st->served, done);
	return done ? done : -1;
}

static void part_done(void *arg)
{
	struct part_stream *p = arg;
	xf_buf_put(p->buf);
	free(p);
}

static void serve_part(struct mlfs_peer *pe, struct net_request *r)
{
	struct mlfs_store *st = pe->st;
	int64_t version, rank, state, tensor, row, rows;

	if (!arg_int(r, "version", INT64_MAX, &version)) {
		net_reply_error(r, 400, "expected version, a layout version (a decimal number)");
		return;
	}
	/* the current layout, or the retained one (mlfs_store_release_retained) */
	struct mlfs_view *v = mlfs_store_view_of(st, version);
	if (!v) {
		struct mlfs_view *cur = mlfs_store_view(st);
		net_reply_error(r, 409,
				"layout version %" PRId64 " is neither current (%" PRId64
				") nor retained on this node",
				version, cur ? cur->config->version : (int64_t)0);
		mlfs_view_put(cur);
		return;
	}
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = l->schema;
	if (atomic_load(&st->lost)) {
		net_reply_error(r, 409, "node %s restarted and lost its partitions",
				mlfs_store_cluster(st)->nodes[st->node].id);
		goto out;
	}
	if (!arg_int(r, "rank", l->world, &rank) || !arg_int(r, "state", s->nstates, &state) ||
	    !arg_int(r, "tensor", s->ntensors, &tensor) ||
	    !arg_int(r, "row", INT64_MAX / 2, &row) || !arg_int(r, "rows", INT64_MAX / 2, &rows) ||
	    rows == 0) {
		net_reply_error(r, 400,
				"expected rank < %d, state < %d, tensor < %d, "
				"row and rows > 0, each a decimal number",
				l->world, s->nstates, s->ntensors);
		goto out;
	}
	const struct ptc_tensor *T = &s->tensors[tensor];
	int64_t outer, prows, rb;
	mlfs_peer_part_geometry(l, (int)rank, (int)state, (int)tensor, &outer, &prows, &rb);
	struct xf_buf *b = NULL;
	int64_t snap, have;
	struct ptc_error why = {.text = ""};
	if (net_request_arg(r, "snap")) { /* the saved state, for a backup */
		if (!arg_int(r, "snap", INT64_MAX, &snap)) {
			net_reply_error(r, 400, "snap must be a step number");
			goto out;
		}
		if (!(b = mlfs_view_snap_get(st, v, (int)rank, (int)state, (int)tensor, snap,
					     &have)) &&
		    have != snap) {
			net_reply_error(r, 409,
					"rank %" PRId64 "'s saved state is at step %" PRId64
					", not %" PRId64,
					rank, have, snap);
			goto out;
		}
	} else if (net_request_arg(r, "backup")) { /* a dead node's, from its backup */
		if (!(b = mlfs_backup_get(mlfs_backup_of(st), version, (int)rank, (int)state,
					  (int)tensor, &why))) {
			net_reply_error(r, 404, "%s", why.text);
			goto out;
		}
	} else {
		b = mlfs_store_part_get(st, v, (int)rank, (int)state, (int)tensor);
	}
	if (!b) {
		net_reply_error(r, 404, "partition (rank %" PRId64 ", %s, %s) is not on this node",
				rank, s->states[state].name, T->name);
		goto out;
	}
	if (row + rows > prows || b->size != outer * prows * rb) {
		net_reply_error(r, 400,
				"rows [%" PRId64 ", %" PRId64 ") past the %" PRId64
				" rows of %s/%s of rank %" PRId64,
				row, row + rows, prows, s->states[state].name, T->name, rank);
		xf_buf_put(b);
		goto out;
	}
	struct part_stream *p = malloc(sizeof(*p));
	if (!p) {
		xf_buf_put(b);
		net_reply_error(r, 503, "out of memory");
		goto out;
	}
	*p = (struct part_stream){st, !net_request_arg(r, "full"), b, prows, row, rows, rb};
	if (!xf_sums_off()) {
		/* the checksum of exactly the bytes sent, from the committed
		 * (immutable) buffer: the stored one for a whole partition */
		char hex[24];
		uint64_t sum = row == 0 && rows == prows
				   ? xf_buf_sum(b)
				   : xf_rows_sum(b->data, prows, row, rows, outer, rb);
		snprintf(hex, sizeof(hex), "%016" PRIx64, sum);
		net_reply_add_header(r, NET_SUM_HEADER, hex);
	}
	if (outer == 1 || (row == 0 && rows == prows)) {
		/* one contiguous range of the pinned buffer: sent from it as it is */
		if (p->count)
			atomic_fetch_add(&st->served, outer * rows * rb);
		net_reply_pinned(r, 200, b->data + row * rb, (size_t)(outer * rows * rb), part_done,
				 p, "application/octet-stream");
	} else {
		net_reply_stream(r, 200, outer * rows * rb, part_read, part_done, p,
				 "application/octet-stream");
	}
out:
	mlfs_view_put(v);
}

/* One box of /v1/parts: "R.S.T.A.N" (rank, state, tensor, row, rows),
 * each a decimal number; the rest of the list after it into *@end. */
static bool box_parse(const char *s, int64_t f[5], const char **end)
{
	for (int i = 0; i < 5; i++) {
		if (*s < '0' || *s > '9')
			return false;
		int64_t x = 0;
		for (int d = 0; *s >= '0' && *s <= '9'; s++, d++) {
			if (d >= 18)
				return false;
			x = x * 10 + (*s - '0');
		}
		f[i] = x;
		if (i < 4 && *s++ != '.')
			return false;
	}
	if (*s == ',' && s[1] != '\0')
		*end = s + 1;
	else if (*s == '\0')
		*end = s;
	else
		return false; /* junk, or a trailing comma */
	return true;
}

/* The boxes of a /v1/parts reply, pinned, sent one after the other. */
struct parts_stream {
	int n;
	struct part_box {
		struct xf_buf *b;
		int64_t prows, row, rows, outer, rb;
	} box[XF_BATCH_MAX];
};

static ssize_t parts_read(void *arg, uint64_t pos, char *out, size_t max)
{
	struct parts_stream *p = arg;
	int64_t at = (int64_t)pos, done = 0;
	for (int i = 0; i < p->n && (size_t)done < max; i++) {
		const struct part_box *x = &p->box[i];
		int64_t seg = x->rows * x->rb, size = x->outer * seg;
		if (at >= size) {
			at -= size;
			continue;
		}
		while (at < size && (size_t)done < max) {
			int64_t o = at / seg, off = at % seg;
			int64_t k =
			    seg - off < (int64_t)max - done ? seg - off : (int64_t)max - done;
			memcpy(out + done, x->b->data + (o * x->prows + x->row) * x->rb + off,
			       (size_t)k);
			done += k;
			at += k;
		}
		at = 0;
	}
	return done ? done : -1;
}

static void parts_done(void *arg)
{
	struct parts_stream *p = arg;
	for (int i = 0; i < p->n; i++)
		xf_buf_put(p->box[i].b);
	free(p);
}

/* /v1/parts: several boxes of one layout in one reply, sent from their
 * pinned buffers (the DESIGN above). */
static void serve_parts(struct mlfs_peer *pe, struct net_request *r)
{
	struct mlfs_store *st = pe->st;
	int64_t version;
	const char *list = net_request_arg(r, "boxes");

	if (!arg_int(r, "version", INT64_MAX, &version)) {
		net_reply_error(r, 400, "expected version, a layout version (a decimal number)");
		return;
	}
	if (!list || !*list) {
		net_reply_error(r, 400,
				"expected boxes=R.S.T.A.N,... (rank, state, tensor, row, rows)");
		return;
	}
	struct mlfs_view *v = mlfs_store_view_of(st, version);
	if (!v) {
		net_reply_error(r, 409,
				"layout version %" PRId64
				" is neither current nor retained on this node",
				version);
		return;
	}
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = l->schema;
	struct parts_stream *p = calloc(1, sizeof(*p));
	int64_t total = 0;
	if (!p) {
		net_reply_error(r, 503, "out of memory");
		goto out;
	}
	if (atomic_load(&st->lost)) {
		net_reply_error(r, 409, "node %s restarted and lost its partitions",
				mlfs_store_cluster(st)->nodes[st->node].id);
		goto out;
	}
	for (const char *at = list; *at; p->n++) {
		int64_t f[5];
		struct part_box *x = &p->box[p->n];
		if (p->n == XF_BATCH_MAX) {
			net_reply_error(r, 400, "more than %d boxes; ask for fewer", XF_BATCH_MAX);
			goto out;
		}
		if (!box_parse(at, f, &at) || f[0] >= l->world || f[1] >= s->nstates ||
		    f[2] >= s->ntensors || f[4] == 0) {
			net_reply_error(r, 400,
					"box %d: expected R.S.T.A.N with rank < %d, state < %d, "
					"tensor < %d, rows > 0",
					p->n, l->world, s->nstates, s->ntensors);
			goto out;
		}
		x->row = f[3];
		x->rows = f[4];
		mlfs_peer_part_geometry(l, (int)f[0], (int)f[1], (int)f[2], &x->outer, &x->prows,
					&x->rb);
		x->b = mlfs_store_part_get(st, v, (int)f[0], (int)f[1], (int)f[2]);
		if (!x->b) {
			net_reply_error(r, 404,
					"box %d: partition (rank %" PRId64
					", %s, %s) is not on this node",
					p->n, f[0], s->states[f[1]].name, s->tensors[f[2]].name);
			goto out;
		}
		if (x->row > x->prows || x->rows > x->prows - x->row ||
		    x->b->size != x->outer * x->prows * x->rb) {
			net_reply_error(r, 400,
					"box %d: rows [%" PRId64 ", %" PRId64 ") past the %" PRId64
					" rows of %s/%s of rank %" PRId64,
					p->n, x->row, x->row + x->rows, x->prows,
					s->states[f[1]].name, s->tensors[f[2]].name, f[0]);
			xf_buf_put(x->b);
			goto out;
		}
		total += x->outer * x->rows * x->rb;
		if (total > XF_BATCH_BYTES) {
			net_reply_error(r, 400, "more than %" PRId64 " bytes; ask for fewer boxes",
					XF_BATCH_BYTES);
			xf_buf_put(x->b);
			goto out;
		}
	}
	if (!xf_sums_off()) {
		/* the checksum of the whole body, box after box, from the
		 * committed (immutable) buffers */
		struct xf_rows rows[XF_BATCH_MAX];
		for (int i = 0; i < p->n; i++)
			rows[i] =
			    (struct xf_rows){p->box[i].b->data, p->box[i].prows, p->box[i].row,
					     p->box[i].rows,	p->box[i].outer, p->box[i].rb};
		char hex[24];
		snprintf(hex, sizeof(hex), "%016" PRIx64, xf_rows_sum_many(rows, (size_t)p->n));
		net_reply_add_header(r, NET_SUM_HEADER, hex);
	}
	if (!net_request_arg(r, "full"))
		atomic_fetch_add(&st->served, total);
	net_reply_stream(r, 200, total, parts_read, parts_done, p, "application/octet-stream");
	p = NULL;
out:
	if (p)
		parts_done(p);
	mlfs_view_put(v);
}

/* ------------------------------------------------------------------ job/ */

/* The reply's end (or its failure to start): the pin goes. */
static void job_done(void *arg)
{
	mlfs_jbuf_put(arg);
}

/* Pins the file's buffer under the store lock and sends from it after:
 * no copy and no hash under the lock, and a write meanwhile gives the file
 * a new buffer, leaving this one as it was. */
static void serve_job(struct mlfs_peer *pe, struct net_request *r)
{
	struct mlfs_store *st = pe->st;
	const char *path = net_request_arg(r, "path");
	if (!path || !*path || strlen(path) > 4096 || strstr(path, "..")) {
		net_reply_error(r, 400, "expected path, a job/ file's path without \"..\"");
		return;
	}
	const char *rel = path + strspn(path, "/");
	pthread_mutex_lock(&st->lock);
	struct mlfs_job *j = mlfs_jobsync_find(st->job, rel);
	bool found = j && !j->dir;
	struct mlfs_jbuf *b = found ? mlfs_jbuf_get(j->buf) : NULL;
	pthread_mutex_unlock(&st->lock);
	if (!found)
		net_reply_error(r, 404, "job/%s: no such file", path);
	else if (!b) /* empty */
		net_reply_buf(r, 200, "", 0, "application/octet-stream");
	else /* puts b when the reply is over, or at once when it fails */
		net_reply_pinned(r, 200, b->bytes, b->size, job_done, b,
				 "application/octet-stream");
}

/* The manifest under the store lock: O(files), from the hashes cached
 * when the files were written; its text is made after. */
static void serve_manifest(struct mlfs_peer *pe, struct net_request *r)
{
	pthread_mutex_lock(&pe->st->lock);
	json_t *m = mlfs_job_manifest(pe->st->job);
	pthread_mutex_unlock(&pe->st->lock);
	char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	if (text)
		net_reply_buf(r, 200, text, strlen(text), "application/json");
	else
		net_reply_error(r, 503, "out of memory");
	free(text);
}

/* ---------------------------------------------------------------- health */

static void serve_health(struct mlfs_peer *pe, struct net_request *r)
{
	struct mlfs_store *st = pe->st;
	char out[256];
	pthread_mutex_lock(&st->lock);
	int n = snprintf(out, sizeof(out),
			 "{\"node\":\"%s\",\"version\":%" PRId64 ",\"state\":\"%s\","
			 "\"retained\":%" PRId64 "}\n",
			 mlfs_store_cluster(st)->nodes[st->node].id,
			 st->view ? st->view->config->version : (int64_t)-1,
			 mlfs_reconf_state_name(st->reconf),
			 st->retained ? st->retained->config->version : (int64_t)0);
	pthread_mutex_unlock(&st->lock);
	net_reply_buf(r, 200, out, (size_t)n, "application/json");
}

/* ------------------------------------------------------------------ votes */

/* Whether @node is one of the cluster's (mlfs_vote_serve's @known). */
static bool cluster_has(void *arg, const char *node)
{
	struct mlfs_store *st = arg;
	pthread_mutex_lock(&st->lock);
	bool known = ptc_cluster_find(mlfs_store_cluster(st), node) >= 0;
	pthread_mutex_unlock(&st->lock);
	return known;
}

static void handle(void *arg, struct net_request *r)
{
	struct mlfs_peer *pe = arg;
	const char *path = net_request_path(r);

	if (strcmp(net_request_method(r), "POST") == 0 && strcmp(path, "/v1/vote") == 0)
		mlfs_vote_serve(pe->st->votebox, r, cluster_has, pe->st);
	else if (strcmp(net_request_method(r), "GET") != 0)
		net_reply_error(r, 405, "only GET, and POST /v1/vote");
	else if (strcmp(path, "/v1/parts") == 0)
		serve_parts(pe, r);
	else if (strcmp(path, "/v1/part") == 0)
		serve_part(pe, r);
	else if (strcmp(path, "/v1/job") == 0)
		serve_job(pe, r);
	else if (strcmp(path, "/v1/jobmanifest") == 0)
		serve_manifest(pe, r);
	else if (strcmp(path, "/v1/health") == 0)
		serve_health(pe, r);
	else
		net_reply_error(r, 404, "no such request \"%s\"", path);
}

/* ------------------------------------------------------------- lifecycle */

int mlfs_peer_start(struct mlfs_store *st, const char *listen, const char *token,
		    struct mlfs_peer **out, struct ptc_error *err)
{
	const struct ptc_node *me = &mlfs_store_cluster(st)->nodes[st->node];
	struct mlfs_peer *pe;
	int rc;

	*out = NULL;
	if (!listen && !me->addr)
		return ptc_errorf(
		    err, "cluster.json: node \"%s\" has no \"addr\" to serve its peers", me->id);
	if (!token || strlen(token) < 16 || strlen(token) > 256 || strpbrk(token, "\r\n "))
		return ptc_errorf(err, "the cluster token must be 16 to 256 characters without "
				       "spaces (token_file in cluster.json, or --token-file)");
	if (!(pe = calloc(1, sizeof(*pe))))
		return -ENOMEM;
	pe->st = st;
	if ((rc = mlfs_votebox_new(&st->votebox)))
		goto err_free;
	if ((rc = mlfs_peerclient_new(st, token, &pe->client, err)))
		goto err_box;
	struct net_server_opts so = {
	    .addr = listen ? listen : me->addr, .token = token, .threads = 4, .max_body = 4096};
	if ((rc = net_server_start(&so, handle, pe, &pe->server, err)))
		goto err_client;
	mlfs_peerclient_attach(pe->client);
	*out = pe;
	return 0;

err_client:
	mlfs_peerclient_free(pe->client);
err_box:
	mlfs_votebox_free(st->votebox);
	st->votebox = NULL;
err_free:
	free(pe);
	return rc;
}

void mlfs_peer_stop(struct mlfs_peer *pe)
{
	if (pe && pe->server) {
		net_server_stop(pe->server);
		pe->server = NULL;
	}
}

void mlfs_peer_free(struct mlfs_peer *pe)
{
	if (!pe)
		return;
	mlfs_peer_stop(pe);
	mlfs_peerclient_free(pe->client);
	mlfs_votebox_free(pe->st->votebox);
	pe->st->votebox = NULL;
	free(pe);
}

int mlfs_peer_port(const struct mlfs_peer *pe)
{
	return net_server_port(pe->server);
}
