/*
 * mlfs_peerclient.c - the data plane's client: fetches rows of partitions
 * (a reconfiguration's FETCH ops), whole saved partitions (backups) and
 * job/ files from the other nodes' peer servers (mlfs_peerserver.c lists
 * the requests). Every request carries the cluster token.
 *
 * DESIGN
 * The fetch (mlfs_store.fetch) runs on transformer workers, one piece of
 * about 1 MiB rows per call (xf_execute cuts them): one ranged GET whose
 * reply is written straight into the destination partition, one iovec per
 * outer block, and hashed as it arrives: it must match the X-Mlfs-XXH3 the
 * sender computed over exactly those bytes from its committed buffer
 * (net_http_range.verify), or it is not used. net_http retries it twice on
 * the same node (a connection cut mid-reply, a checksum mismatch); its
 * deadline bounds it. When the source node cannot serve, every other
 * node holding the same rows (a DP replica) is tried, in rank order; rows
 * of a down node come from its backup holder, and from nowhere else. When
 * every copy failed, the error names the partition, its rows and every
 * node tried. A whole saved partition (a backup, mlfs_peer_get_part) keeps
 * the checksum its source published, verified over the bytes received.
 *
 * Threads: transformer workers (the fetch), the backup thread
 * (mlfs_peer_get_part), the control thread and I/O workers (job/ files),
 * all at once. Nothing here holds a lock but the store's, briefly, to pin
 * a view.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_i.h"

struct mlfs_peerclient {
	struct mlfs_store *st;
	struct net_http *http; /* carries the token */
};

void mlfs_peer_part_geometry(const struct ptc_layout *l, int rank, int state, int tensor,
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

/* ----------------------------------------------------------------- fetch */

/* One GET of @url's @len bytes into @iov, exactly, verified against the
 * sender's checksum (its value into *@sum); no new try once *@stop. */
static int get_rows(struct mlfs_peerclient *cl, const char *url, struct iovec *iov, int iovcnt,
		    int64_t len, atomic_int *stop, uint64_t *sum, struct ptc_error *err)
{
	struct net_http_range rg = {
	    .off = 0, .len = len, .iov = iov, .iovcnt = iovcnt, .verify = !xf_sums_off()};
	struct net_http_call call = {.stop = stop};
	int rc = net_http_get_range(cl->http, url, &rg, &call, err);
	if (rc == 0 && rg.got != rg.len)
		rc = ptc_error_set(err, -EIO, "%.300s: %" PRId64 " bytes, expected %" PRId64, url,
				   rg.got, rg.len);
	if (sum)
		*sum = rg.sum;
	return rc;
}

/* One GET of rows of (@rank, op's state and source tensor) from @node. */
static int fetch_from(struct mlfs_peerclient *cl, int node, int rank, int64_t version,
		      const struct ptc_op *op, struct iovec *iov, int64_t outer, int64_t len,
		      struct ptc_error *err)
{
	const struct ptc_node *n = &mlfs_store_cluster(cl->st)->nodes[node];
	char url[NET_MAX_URL];

	snprintf(url, sizeof(url),
		 "http://%s/v1/part?version=%" PRId64 "&rank=%d&state=%d&tensor=%d&row=%" PRId64
		 "&rows=%" PRId64 "%s%s",
		 n->addr, version, rank, op->state, op->src_tensor, op->src_row, op->rows,
		 op->dst_node < 0 ? "&full=1" : "", op->backup ? "&backup=1" : "");
	return get_rows(cl, url, iov, (int)outer, len, &cl->st->cancel /* an abort ends it */, NULL,
			err);
}

/*
 * The plan's piece @pc: from its source node, and when that fails, from
 * every other node holding the same rows in layout @version (a DP replica:
 * the same TP rank of a stage that holds the tensor), in rank order.
 */
static int fetch_piece(struct mlfs_peerclient *cl, int64_t version, const struct xf_piece *pc)
{
	const struct ptc_op *op = &pc->op;
	uint8_t *dst = pc->dst;
	int64_t dst_rows = pc->dst_rows, outer = pc->outer, row_bytes = pc->row_bytes;
	struct ptc_error why, first = {.text = ""};
	struct iovec stack[64], *iov = outer <= 64 ? stack : malloc((size_t)outer * sizeof(*iov));

	if (!iov)
		return -ENOMEM;
	for (int64_t o = 0; o < outer; o++)
		iov[o] = (struct iovec){dst + (o * dst_rows + op->dst_row) * row_bytes,
					(size_t)(op->rows * row_bytes)};
	int64_t len = outer * op->rows * row_bytes;
	int src = op->src_node;
	if (op->backup) { /* src_node is down: its backup holder serves the rows */
		struct mlfs_view *cur = mlfs_store_view(cl->st);
		src = cur && cur->config->version == version
			  ? ptc_layout_backup_holder(&cur->layout, op->src_node)
			  : -1;
		mlfs_view_put(cur);
		if (src < 0) {
			if (iov != stack)
				free(iov);
			mlfs_store_note_error(cl->st, "fetch from a backup: the layout changed");
			return -ESTALE;
		}
	}
	const struct ptc_cluster *cc = mlfs_store_cluster(cl->st);
	char tried[300] = "";
	int rc = fetch_from(cl, src, op->src_rank, version, op, iov, outer, len, &first);
	snprintf(tried, sizeof(tried), "%s", cc->nodes[src].id);
	/* the layout fetched from: the current one or the retained one */
	struct mlfs_view *v = rc && !op->backup ? mlfs_store_view_of(cl->st, version) : NULL;
	const struct ptc_schema *sch = v ? v->layout.schema : NULL;
	char part[300] = "";
	if (sch)
		snprintf(part, sizeof(part),
			 "partition (rank %d, %s, %s) rows [%" PRId64 ", %" PRId64 ")",
			 op->src_rank, sch->states[op->state].name,
			 sch->tensors[op->src_tensor].name, op->src_row, op->src_row + op->rows);
	if (v) {
		const struct ptc_layout *l = &v->layout;
		for (int r = 0; r < l->world && rc && rc != -ECANCELED; r++) {
			int node = l->ranks[r].node;
			if (r == op->src_rank || node == op->src_node || node == cl->st->node ||
			    l->ranks[r].t != l->ranks[op->src_rank].t ||
			    !ptc_layout_holds(l, r, op->src_tensor))
				continue;
			rc = fetch_from(cl, node, r, version, op, iov, outer, len, &why);
			size_t n = strlen(tried);
			snprintf(tried + n, sizeof(tried) - n, ", %s", cc->nodes[node].id);
		}
	}
	if (rc && rc != -ECANCELED) { /* cancelled: the abort says why */
		char msg[1200];
		if (part[0])
			snprintf(msg, sizeof(msg), "fetch of %s from node%s %s%s: %s", part,
				 strchr(tried, ',') ? "s" : "", tried,
				 op->backup ? " (a backup)" : "", first.text);
		else
			snprintf(msg, sizeof(msg), "fetch from node %s%s: %s", tried,
				 op->backup ? " (a backup)" : "", first.text);
		mlfs_store_note_error(cl->st, msg);
	}
	mlfs_view_put(v);
	if (iov != stack)
		free(iov);
	return rc;
}

/*
 * @n > 1 small pieces of one source node (xf_execute batched them): one
 * GET of /v1/parts, its reply scattered into every piece's blocks and
 * verified as a whole against the sender's checksum. When it fails (the
 * source cannot serve one of them, a checksum mismatch after net_http's
 * retries, an old peer without /v1/parts), each piece is fetched alone,
 * with the replicas tried and the error named per piece (fetch_piece).
 */
static int fetch_batch(struct mlfs_peerclient *cl, int64_t version, const struct xf_piece *v,
		       size_t n)
{
	const struct ptc_node *src = &mlfs_store_cluster(cl->st)->nodes[v[0].op.src_node];
	char url[NET_MAX_URL];
	int64_t niov = 0, len = 0;
	int at =
	    snprintf(url, sizeof(url), "http://%s/v1/parts?version=%" PRId64 "%s&boxes=", src->addr,
		     version, v[0].op.dst_node < 0 ? "&full=1" : "");
	for (size_t i = 0; i < n; i++) {
		const struct ptc_op *op = &v[i].op;
		at += snprintf(url + at, sizeof(url) - (size_t)at,
			       "%s%d.%d.%d.%" PRId64 ".%" PRId64, i ? "," : "", op->src_rank,
			       op->state, op->src_tensor, op->src_row, op->rows);
		if ((size_t)at >= sizeof(url))
			goto alone; /* cannot happen for XF_BATCH_MAX pieces */
		niov += v[i].outer;
		len += op->bytes;
	}
	struct iovec *iov = malloc((size_t)niov * sizeof(*iov));
	if (!iov)
		goto alone;
	for (size_t i = 0, k = 0; i < n; i++)
		for (int64_t o = 0; o < v[i].outer; o++)
			iov[k++] = (struct iovec){v[i].dst + (o * v[i].dst_rows + v[i].op.dst_row) *
								 v[i].row_bytes,
						  (size_t)(v[i].op.rows * v[i].row_bytes)};
	struct ptc_error why = {.text = ""};
	int rc = get_rows(cl, url, iov, (int)niov, len, &cl->st->cancel, NULL, &why);
	free(iov);
	if (rc == 0 || rc == -ECANCELED)
		return rc;
	mlfs_log(MLFS_LOG_DEBUG, "fetch of %zu pieces from node %s in one request: %s; one by one",
		 n, src->id, why.text);
alone:
	for (size_t i = 0; i < n; i++) {
		int rc2 = fetch_piece(cl, version, &v[i]);
		if (rc2)
			return rc2;
	}
	return 0;
}

/* The store's fetch (xf_fetch_fn, for layout @version). */
static int peer_fetch(void *arg, int64_t version, const struct xf_piece *v, size_t n)
{
	struct mlfs_peerclient *cl = arg;
	return n == 1 ? fetch_piece(cl, version, v) : fetch_batch(cl, version, v, n);
}

/* The client @st fetches with (mlfs_peerclient_attach), or NULL: a daemon
 * without a data plane. */
static struct mlfs_peerclient *client_of(const struct mlfs_store *st)
{
	return st->fetch == peer_fetch ? st->fetch_arg : NULL;
}

/* ------------------------------------------------------ cluster.h fetches */

int mlfs_peer_get_part(struct mlfs_store *st, int node, const struct ptc_layout *l, int rank,
		       int state, int tensor, int64_t snap, struct xf_buf *dst, atomic_int *stop,
		       struct ptc_error *err)
{
	struct mlfs_peerclient *cl = client_of(st);
	char url[NET_MAX_URL];
	int64_t outer, prows, rb;

	if (!cl)
		return -EHOSTUNREACH;
	mlfs_peer_part_geometry(l, rank, state, tensor, &outer, &prows, &rb);
	if (dst->size != outer * prows * rb)
		return ptc_errorf(err, "rank %d's partition: %" PRId64 " bytes, expected %" PRId64,
				  rank, dst->size, outer * prows * rb);
	snprintf(url, sizeof(url),
		 "http://%s/v1/part?version=%" PRId64
		 "&rank=%d&state=%d&tensor=%d&row=0&rows=%" PRId64 "&snap=%" PRId64 "&full=1",
		 mlfs_store_cluster(st)->nodes[node].addr, l->config->version, rank, state, tensor,
		 prows, snap);
	struct iovec iov = {dst->data, (size_t)dst->size};
	uint64_t sum = 0;
	int rc = get_rows(cl, url, &iov, 1, dst->size, stop, &sum, err);
	if (rc == 0 && !xf_sums_off())
		xf_buf_set_sum(dst, sum); /* the source's, verified over these bytes */
	return rc;
}

int mlfs_peer_job_get(struct mlfs_store *st, int node, const char *path, uint8_t **data,
		      size_t *len, struct ptc_error *err)
{
	struct mlfs_peerclient *cl = client_of(st);
	char url[NET_MAX_URL];

	if (!cl)
		return -EHOSTUNREACH;
	size_t n = (size_t)snprintf(
	    url, sizeof(url), "http://%s/v1/job?path=", mlfs_store_cluster(st)->nodes[node].addr);
	for (const unsigned char *p = (const unsigned char *)path; *p && n + 4 < sizeof(url); p++)
		n += (size_t)snprintf(url + n, sizeof(url) - n,
				      isalnum(*p) || strchr("/._-~", *p) ? "%c" : "%%%02X", *p);
	return net_http_get(cl->http, url, (int64_t)MLFS_JOB_FILE_MAX, data, len, NULL, err);
}

/* GET http://<@node's addr>@path as JSON into *@out, within 2 s (a frozen
 * node must not stall the caller); -EIO unless it is of @type. */
static int get_json(struct mlfs_store *st, int node, const char *path, json_type type, json_t **out,
		    struct ptc_error *err)
{
	struct mlfs_peerclient *cl = client_of(st);
	char url[NET_MAX_URL];
	uint8_t *data = NULL;
	size_t len = 0;

	*out = NULL;
	if (!cl)
		return -EHOSTUNREACH;
	snprintf(url, sizeof(url), "http://%s%s", mlfs_store_cluster(st)->nodes[node].addr, path);
	struct net_http_call call = {.deadline_ms = 2000};
	int rc = net_http_get(cl->http, url, (int64_t)64 << 20, &data, &len, &call, err);
	if (rc)
		return rc;
	*out = json_loadb((const char *)data, len, 0, NULL);
	free(data);
	if (!*out || json_typeof(*out) != type) {
		json_decref(*out);
		*out = NULL;
		return ptc_error_set(err, -EIO, "%.300s: not the JSON expected", url);
	}
	return 0;
}

int mlfs_peer_health(struct mlfs_store *st, int node, json_t **out, struct ptc_error *err)
{
	return get_json(st, node, "/v1/health", JSON_OBJECT, out, err);
}

int mlfs_peer_job_manifest(struct mlfs_store *st, int node, json_t **out, struct ptc_error *err)
{
	return get_json(st, node, "/v1/jobmanifest", JSON_ARRAY, out, err);
}

int mlfs_peer_vote(struct mlfs_store *st, int node, int64_t to, const char *aid, const char *vote,
		   const struct mlfs_vote_entry *e, struct ptc_error *err)
{
	struct mlfs_peerclient *cl = client_of(st);
	char url[NET_MAX_URL];
	uint8_t *data = NULL;
	size_t len = 0;

	if (!cl)
		return -EHOSTUNREACH;
	const struct ptc_cluster *c = mlfs_store_cluster(st);
	char *body = mlfs_vote_body_entry(c->nodes[st->node].id, to, aid, vote, e);
	if (!body)
		return -ENOMEM;
	snprintf(url, sizeof(url), "http://%s/v1/vote", c->nodes[node].addr);
	/* within 2 s: a frozen coordinator must not stall this node's rounds;
	 * a vote given twice is the same vote */
	struct net_http_call call = {.deadline_ms = 2000, .idempotent = true};
	int rc =
	    net_http_post_json(cl->http, url, body, strlen(body), 4096, &data, &len, &call, err);
	free(body);
	free(data);
	return rc;
}

/* ------------------------------------------------------------- lifecycle */

int mlfs_peerclient_new(struct mlfs_store *st, const char *token, struct mlfs_peerclient **out,
			struct ptc_error *err)
{
	struct mlfs_peerclient *cl = calloc(1, sizeof(*cl));
	char hdr[300];
	int rc;

	*out = NULL;
	if (!cl)
		return -ENOMEM;
	cl->st = st;
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", token);
	const char *headers[] = {hdr, NULL};
	/* Two more tries on the same node after a failed one (a connection
	 * cut mid-reply), then the other holders: a peer whose replies stall
	 * gives up after 3 x 10 s unless its lease expires first (an abort
	 * then cancels the fetch at once). */
	struct net_http_opts ho = {.retries = 2,
				   .timeout_ms = 10000,
				   .deadline_ms = 120000,
				   .headers = headers,
				   .direct = true}; /* node to node, never via a proxy */
	if ((rc = net_http_new(&ho, &cl->http, err))) {
		free(cl);
		return rc;
	}
	*out = cl;
	return 0;
}

void mlfs_peerclient_attach(struct mlfs_peerclient *cl)
{
	cl->st->fetch = peer_fetch;
	cl->st->fetch_arg = cl;
}

void mlfs_peerclient_free(struct mlfs_peerclient *cl)
{
	if (!cl)
		return;
	net_http_free(cl->http);
	free(cl);
}
