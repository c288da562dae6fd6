/*
 * mlfs_peer.c - the data plane between nodes: this node's server for its
 * peers (rows of its partitions, job/ files, health) and the fetch of rows
 * from theirs during a reconfiguration.
 *
 * DESIGN
 * Requests (net_server: token checked, bounded), all GET:
 *   /v1/health                   {"node", "version", "state"}
 *   /v1/part?version=V&rank=R&state=S&tensor=T&row=A&rows=N
 *       rows [A, A+N) of partition (R, S, T) of layout version V, for every
 *       outer block (ptc_tensor_geometry), back to back: outer * N * row
 *       bytes. Indices are the schema's (every node has the same schema:
 *       etcd's "schema" key says so). Gathered from the partition's buffer
 *       as the reply is sent (net_reply_stream): no copy of the range, and
 *       the buffer pinned until the reply ends, so a commit meanwhile
 *       cannot free it.
 *   /v1/job?path=P               a job/ file's bytes
 *   /v1/jobmanifest              the job/ tree: paths, sizes, hashes, mtimes
 * Only the current layout is served: during an attempt that is the old
 * one (the one peers fetch from), until the commit. Every parameter is
 * checked before use; a bad one is a 400 naming it, an unknown partition a
 * 404, a version that is not (or no longer) current a 409.
 *
 * The fetch (mlfs_store.fetch) runs on transformer workers, one piece of
 * about 1 MiB rows per call (xf_execute cuts them): one ranged GET whose
 * reply is written straight into the destination partition, one iovec per
 * outer block. net_http retries it (another attempt on the same node);
 * its deadline bounds it.
 *
 * Threads: server threads run the handlers; transformer workers fetch.
 * Nothing here holds a lock but the store's, briefly, to pin a buffer.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster.h"

struct mlfs_peer {
	struct mlfs_store *st;
	struct net_server *server;
	struct net_http *http;
};

/* ---------------------------------------------------------------- server */

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

/* A partition's geometry: @outer blocks of @prows rows of @rb bytes. */
static void part_geometry(const struct ptc_layout *l, int rank, int state, int tensor,
			  int64_t *outer, int64_t *prows, int64_t *rb)
{
	const struct ptc_tensor *T = &l->schema->tensors[tensor];
	int64_t rowel;
	ptc_tensor_geometry(T, outer, &rowel);
	*prows = 1;
	if (T->split_dim >= 0) {
		struct ptc_slice sl;
		ptc_slice_compute(T, l->tp, l->ranks[rank].t, &sl);
		*prows = sl.rows;
	}
	*rb = rowel * (int64_t)ptc_dtype_size(ptc_schema_dtype(l->schema, state, tensor));
}

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
	struct mlfs_view *v = mlfs_store_view(st);
	int64_t version, rank, state, tensor, row, rows;

	if (!v) {
		net_reply_error(r, 409, "no layout yet");
		return;
	}
	const struct ptc_layout *l = &v->layout;
	const struct ptc_schema *s = l->schema;
	if (atomic_load(&st->lost)) {
		net_reply_error(r, 409, "node %s restarted and lost its partitions",
				mlfs_store_cluster(st)->nodes[st->node].id);
		goto out;
	}
	if (!arg_int(r, "version", INT64_MAX, &version) || !arg_int(r, "rank", l->world, &rank) ||
	    !arg_int(r, "state", s->nstates, &state) || !arg_int(r, "tensor", s->ntensors, &tensor) ||
	    !arg_int(r, "row", INT64_MAX / 2, &row) || !arg_int(r, "rows", INT64_MAX / 2, &rows) ||
	    rows == 0) {
		net_reply_error(r, 400, "expected version, rank < %d, state < %d, tensor < %d, "
					"row and rows > 0, each a decimal number",
				l->world, s->nstates, s->ntensors);
		goto out;
	}
	if (version != v->config->version) {
		net_reply_error(r, 409, "layout version %" PRId64 " is not current (%" PRId64 ")",
				version, v->config->version);
		goto out;
	}
	const struct ptc_tensor *T = &s->tensors[tensor];
	int64_t outer, prows, rb;
	part_geometry(l, (int)rank, (int)state, (int)tensor, &outer, &prows, &rb);
	struct xf_buf *b = NULL;
	int64_t snap, have;
	char why[256] = "";
	if (net_request_arg(r, "snap")) { /* the saved state, for a backup */
		if (!arg_int(r, "snap", INT64_MAX, &snap)) {
			net_reply_error(r, 400, "snap must be a step number");
			goto out;
		}
		if (!(b = mlfs_view_snap_get(st, v, (int)rank, (int)state, (int)tensor, snap,
					     &have)) &&
		    have != snap) {
			net_reply_error(r, 409, "rank %" PRId64 "'s saved state is at step %" PRId64
						", not %" PRId64,
					rank, have, snap);
			goto out;
		}
	} else if (net_request_arg(r, "backup")) { /* a dead node's, from its backup */
		if (!(b = mlfs_backup_get(__atomic_load_n(&st->backup, __ATOMIC_ACQUIRE), version, (int)rank, (int)state, (int)tensor,
					  why, sizeof(why)))) {
			net_reply_error(r, 404, "%s", why);
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
		net_reply_error(r, 400, "rows [%" PRId64 ", %" PRId64 ") past the %" PRId64
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

static void serve_job(struct mlfs_peer *pe, struct net_request *r)
{
	struct mlfs_store *st = pe->st;
	const char *path = net_request_arg(r, "path");
	if (!path || !*path || strlen(path) > 4096 || strstr(path, "..")) {
		net_reply_error(r, 400, "expected path, a job/ file's path without \"..\"");
		return;
	}
	pthread_mutex_lock(&st->lock);
	struct mlfs_job *j = st->job;
	const char *p = path;
	while (j && *p) {
		while (*p == '/')
			p++;
		size_t n = strcspn(p, "/");
		if (n == 0)
			break;
		j = j->dir ? mlfs_job_child(j, p, n) : NULL;
		p += n;
	}
	uint8_t *copy = j && !j->dir ? malloc(j->size ? j->size : 1) : NULL;
	size_t size = copy ? j->size : 0;
	if (copy)
		memcpy(copy, j->data, size);
	bool found = j && !j->dir;
	pthread_mutex_unlock(&st->lock);
	if (!found)
		net_reply_error(r, 404, "job/%s: no such file", path);
	else if (!copy)
		net_reply_error(r, 503, "out of memory");
	else
		net_reply_buf(r, 200, copy, size, "application/octet-stream");
	free(copy);
}

static void handle(void *arg, struct net_request *r)
{
	struct mlfs_peer *pe = arg;
	const char *path = net_request_path(r);

	if (strcmp(net_request_method(r), "GET") != 0) {
		net_reply_error(r, 405, "only GET");
	} else if (strcmp(path, "/v1/part") == 0) {
		serve_part(pe, r);
	} else if (strcmp(path, "/v1/job") == 0) {
		serve_job(pe, r);
	} else if (strcmp(path, "/v1/jobmanifest") == 0) {
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
	} else if (strcmp(path, "/v1/health") == 0) {
		struct mlfs_store *st = pe->st;
		char out[256];
		pthread_mutex_lock(&st->lock);
		int n = snprintf(out, sizeof(out), "{\"node\":\"%s\",\"version\":%" PRId64
						   ",\"state\":\"%s\"}\n",
				 mlfs_store_cluster(st)->nodes[st->node].id,
				 st->view ? st->view->config->version : (int64_t)-1,
				 mlfs_reconf_state_name(st->reconf));
		pthread_mutex_unlock(&st->lock);
		net_reply_buf(r, 200, out, (size_t)n, "application/json");
	} else {
		net_reply_error(r, 404, "no such request \"%s\"", path);
	}
}

/* ----------------------------------------------------------------- fetch */

/* One GET of @url's @len bytes into @iov, exactly; no new try once *@stop. */
static int get_rows(struct mlfs_peer *pe, const char *url, struct iovec *iov, int iovcnt,
		    int64_t len, atomic_int *stop, char *why, size_t whylen)
{
	struct net_http_range rg = {.off = 0, .len = len, .iov = iov, .iovcnt = iovcnt};
	struct net_http_call call = {.stop = stop};
	int rc = net_http_get_range(pe->http, url, &rg, &call, why, whylen);
	if (rc == 0 && rg.got != rg.len) {
		snprintf(why, whylen, "%.300s: %" PRId64 " bytes, expected %" PRId64, url, rg.got,
			 rg.len);
		rc = -EIO;
	}
	return rc;
}

/* One GET of rows of (@rank, op's state and source tensor) from @node. */
static int fetch_from(struct mlfs_peer *pe, int node, int rank, int64_t version,
		      const struct ptc_op *op, struct iovec *iov, int64_t outer, int64_t len,
		      char *why, size_t whylen)
{
	const struct ptc_node *n = &mlfs_store_cluster(pe->st)->nodes[node];
	char url[NET_MAX_URL];

	snprintf(url, sizeof(url),
		 "http://%s/v1/part?version=%" PRId64 "&rank=%d&state=%d&tensor=%d&row=%" PRId64
		 "&rows=%" PRId64 "%s%s",
		 n->addr, version, rank, op->state, op->src_tensor, op->src_row, op->rows,
		 op->dst_node < 0 ? "&full=1" : "", op->backup ? "&backup=1" : "");
	return get_rows(pe, url, iov, (int)outer, len, &pe->st->cancel /* an abort ends it */, why,
			whylen);
}

/*
 * The plan's piece @op: from its source node, and when that fails, from
 * every other node holding the same rows in layout @version (a DP replica:
 * the same TP rank of a stage that holds the tensor), in rank order.
 */
static int peer_fetch(void *arg, int64_t version, const struct ptc_op *op, uint8_t *dst,
		      int64_t dst_rows, int64_t outer, int64_t row_bytes)
{
	struct mlfs_peer *pe = arg;
	char why[512], first[512] = "";
	struct iovec stack[64], *iov = outer <= 64 ? stack : malloc((size_t)outer * sizeof(*iov));

	if (!iov)
		return -ENOMEM;
	for (int64_t o = 0; o < outer; o++)
		iov[o] = (struct iovec){dst + (o * dst_rows + op->dst_row) * row_bytes,
					(size_t)(op->rows * row_bytes)};
	int64_t len = outer * op->rows * row_bytes;
	int src = op->src_node;
	if (op->backup) { /* src_node is down: its backup holder serves the rows */
		struct mlfs_view *cur = mlfs_store_view(pe->st);
		src = cur && cur->config->version == version
			  ? ptc_layout_backup_holder(&cur->layout, op->src_node)
			  : -1;
		mlfs_view_put(cur);
		if (src < 0) {
			if (iov != stack)
				free(iov);
			mlfs_store_note_error(pe->st, "fetch from a backup: the layout changed");
			return -ESTALE;
		}
	}
	int rc = fetch_from(pe, src, op->src_rank, version, op, iov, outer, len, first,
			    sizeof(first));
	struct mlfs_view *v = rc && !op->backup ? mlfs_store_view(pe->st) : NULL;
	if (v && v->config->version == version) {
		const struct ptc_layout *l = &v->layout;
		for (int r = 0; r < l->world && rc && rc != -ECANCELED; r++) {
			int node = l->ranks[r].node;
			if (r == op->src_rank || node == op->src_node || node == pe->st->node ||
			    l->ranks[r].t != l->ranks[op->src_rank].t ||
			    !ptc_layout_holds(l, r, op->src_tensor))
				continue;
			rc = fetch_from(pe, node, r, version, op, iov, outer, len, why, sizeof(why));
		}
	}
	mlfs_view_put(v);
	if (iov != stack)
		free(iov);
	if (rc) {
		char msg[700];
		snprintf(msg, sizeof(msg), "fetch from node %s%s: %s",
			 mlfs_store_cluster(pe->st)->nodes[src].id,
			 op->backup ? " (a backup)" : "", first);
		mlfs_store_note_error(pe->st, msg);
	}
	return rc;
}

int mlfs_peer_get_part(struct mlfs_store *st, int node, const struct ptc_layout *l, int rank,
		       int state, int tensor, int64_t snap, struct xf_buf *dst, atomic_int *stop,
		       char *why, size_t whylen)
{
	struct mlfs_peer *pe = st->fetch_arg;
	char url[NET_MAX_URL];
	int64_t outer, prows, rb;

	if (!pe || st->fetch != peer_fetch)
		return -EHOSTUNREACH;
	part_geometry(l, rank, state, tensor, &outer, &prows, &rb);
	if (dst->size != outer * prows * rb) {
		snprintf(why, whylen, "rank %d's partition: %" PRId64 " bytes, expected %" PRId64,
			 rank, dst->size, outer * prows * rb);
		return -EINVAL;
	}
	snprintf(url, sizeof(url),
		 "http://%s/v1/part?version=%" PRId64 "&rank=%d&state=%d&tensor=%d&row=0&rows=%" PRId64
		 "&snap=%" PRId64 "&full=1",
		 mlfs_store_cluster(st)->nodes[node].addr, l->config->version, rank, state, tensor,
		 prows, snap);
	struct iovec iov = {dst->data, (size_t)dst->size};
	return get_rows(pe, url, &iov, 1, dst->size, stop, why, whylen);
}

int mlfs_peer_job_get(struct mlfs_store *st, int node, const char *path, uint8_t **data,
		      size_t *len, char *why, size_t whylen)
{
	struct mlfs_peer *pe = st->fetch_arg;
	char url[NET_MAX_URL];
	size_t n = (size_t)snprintf(url, sizeof(url), "http://%s/v1/job?path=",
				    mlfs_store_cluster(st)->nodes[node].addr);

	if (!pe || st->fetch != peer_fetch)
		return -EHOSTUNREACH;
	for (const unsigned char *p = (const unsigned char *)path; *p && n + 4 < sizeof(url); p++)
		n += (size_t)snprintf(url + n, sizeof(url) - n,
				      isalnum(*p) || strchr("/._-~", *p) ? "%c" : "%%%02X", *p);
	return net_http_get(pe->http, url, (int64_t)MLFS_JOB_FILE_MAX, data, len, NULL, why,
			    whylen);
}

int mlfs_peer_job_manifest(struct mlfs_store *st, int node, json_t **out, char *why,
			   size_t whylen)
{
	struct mlfs_peer *pe = st->fetch_arg;
	char url[NET_MAX_URL];
	uint8_t *data = NULL;
	size_t len = 0;
	json_error_t je;

	*out = NULL;
	if (!pe || st->fetch != peer_fetch)
		return -EHOSTUNREACH;
	snprintf(url, sizeof(url), "http://%s/v1/jobmanifest", mlfs_store_cluster(st)->nodes[node].addr);
	struct net_http_call call = {.deadline_ms = 2000}; /* a frozen node must not stall a write */
	int rc = net_http_get(pe->http, url, (int64_t)64 << 20, &data, &len, &call, why, whylen);
	if (rc)
		return rc;
	*out = json_loadb((const char *)data, len, 0, &je);
	free(data);
	if (!json_is_array(*out)) {
		json_decref(*out);
		*out = NULL;
		snprintf(why, whylen, "%.300s: not a job/ manifest", url);
		return -EIO;
	}
	return 0;
}

/* ---------------------------------------------------------------- start */

int mlfs_peer_start(struct mlfs_store *st, const char *token, struct mlfs_peer **out, char *why,
		    size_t whylen)
{
	const struct ptc_node *me = &mlfs_store_cluster(st)->nodes[st->node];
	struct mlfs_peer *pe;
	char hdr[300];
	int rc;

	*out = NULL;
	if (!me->addr) {
		snprintf(why, whylen, "cluster.json: node \"%s\" has no \"addr\" to serve its peers",
			 me->id);
		return -EINVAL;
	}
	if (!token || strlen(token) < 16 || strlen(token) > 256 || strpbrk(token, "\r\n ")) {
		snprintf(why, whylen, "the cluster token must be 16 to 256 characters without "
				      "spaces (token_file in cluster.json, or --token-file)");
		return -EINVAL;
	}
	if (!(pe = calloc(1, sizeof(*pe))))
		return -ENOMEM;
	pe->st = st;
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", token);
	const char *headers[] = {hdr, NULL};
	struct net_http_opts ho = {.timeout_ms = 10000, .deadline_ms = 120000, .headers = headers};
	if ((rc = net_http_new(&ho, &pe->http, why, whylen)))
		goto err_free;
	struct net_server_opts so = {.addr = me->addr, .token = token, .threads = 4};
	if ((rc = net_server_start(&so, handle, pe, &pe->server, why, whylen)))
		goto err_http;
	st->fetch = peer_fetch;
	st->fetch_arg = pe;
	*out = pe;
	return 0;

err_http:
	net_http_free(pe->http);
err_free:
	free(pe);
	return rc;
}

void mlfs_peer_stop(struct mlfs_peer *pe)
{
	if (!pe)
		return;
	net_server_stop(pe->server);
	net_http_free(pe->http);
	free(pe);
}

int mlfs_peer_port(const struct mlfs_peer *pe)
{
	return net_server_port(pe->server);
}
