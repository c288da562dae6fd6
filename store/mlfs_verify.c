/*
 * mlfs_verify.c - `mlfs verify` (.mlfs-ctl "verify"): every partition of
 * this node recomputed against the checksum kept with it since it was
 * committed; and the test hook "flip", which corrupts one byte of a
 * committed partition in memory so that tests can see it found.
 *
 * DESIGN
 * A committed partition buffer is immutable and carries its XXH3 (xf_buf.c:
 * set by a write's close, an import, a reconfiguration's build, a backup).
 * verify pins the current view's buffers under st->lock, then hashes them
 * without it (a commit meanwhile swaps in a new buffer and leaves the
 * pinned one as it was), so a check of gigabytes never blocks the store.
 * A buffer never sealed (a fresh layout's zero partitions) is counted as
 * "unsealed" and sealed now: there is nothing to compare it with.
 *
 * "flip" is a test hook: it exists only when the daemon runs with
 * MLFS_TEST_HOOKS=1 in its environment (off by default; an unknown op
 * otherwise). It writes into a committed buffer, which nothing else may do.
 *
 * Threads: I/O workers (.mlfs-ctl); st->lock taken briefly to pin.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"
#include "store/store.h"

bool mlfs_test_hooks(void)
{
	const char *e = getenv("MLFS_TEST_HOOKS");
	return e && strcmp(e, "1") == 0;
}

/* Pins every partition of the current view (NULL entries where none);
 * the view into *@vout (put it), the table's length into *@n. */
static struct xf_buf **pin_all(struct mlfs_store *st, struct mlfs_view **vout, size_t *n)
{
	struct mlfs_view *v = mlfs_store_view(st);
	struct xf_buf **bufs = NULL;

	*vout = v;
	*n = 0;
	if (!v)
		return NULL;
	size_t k = xf_parts_count(&v->parts);
	if (!(bufs = calloc(k ? k : 1, sizeof(*bufs))))
		return NULL;
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < k; i++)
		bufs[i] = xf_buf_get(v->parts.bufs[i]);
	pthread_mutex_unlock(&st->lock);
	*n = k;
	return bufs;
}

int mlfs_store_verify(struct mlfs_store *st, json_t *out, struct ptc_error *err)
{
	struct mlfs_view *v;
	size_t n;
	struct xf_buf **bufs = pin_all(st, &v, &n);
	int64_t checked = 0, bytes = 0, unsealed = 0;
	json_t *bad = json_array();

	if (!v) {
		json_decref(bad);
		return ptc_errorf(err, "verify: no layout (set schema.json and config.json first)");
	}
	if (!bufs || !bad) {
		json_decref(bad);
		mlfs_view_put(v);
		return ptc_error_set(err, -ENOMEM, "verify: out of memory");
	}
	const struct ptc_schema *s = v->layout.schema;
	for (size_t i = 0; i < n; i++) {
		struct xf_buf *b = bufs[i];
		if (!b)
			continue;
		int t = (int)(i % (size_t)s->ntensors);
		int si = (int)(i / (size_t)s->ntensors % (size_t)s->nstates);
		int r = v->parts.r0 + (int)(i / (size_t)s->ntensors / (size_t)s->nstates);
		if (!xf_buf_sealed(b)) {
			xf_buf_seal(b);
			unsealed++;
		} else {
			uint64_t want = xf_buf_sum(b), got = mlfs_hash(b->data, (size_t)b->size);
			if (got != want) {
				char w[24], g[24];
				snprintf(w, sizeof(w), "%016" PRIx64, want);
				snprintf(g, sizeof(g), "%016" PRIx64, got);
				json_array_append_new(bad, json_pack("{sisssssIssss}", "rank", r,
								     "state", s->states[si].name,
								     "tensor", s->tensors[t].name,
								     "bytes", (json_int_t)b->size,
								     "stored", w, "now", g));
			}
		}
		checked++;
		bytes += b->size;
	}
	mlfs_bufs_put(bufs, n);
	free(bufs);
	json_object_set_new(out, "version", json_integer(v->config->version));
	json_object_set_new(out, "partitions", json_integer(checked));
	json_object_set_new(out, "bytes", json_integer(bytes));
	json_object_set_new(out, "unsealed", json_integer(unsealed));
	json_object_set_new(out, "mismatches", bad);
	mlfs_view_put(v);
	return 0;
}

int mlfs_store_flip(struct mlfs_store *st, int rank, const char *state, const char *tensor,
		    int64_t byte, struct ptc_error *err)
{
	struct mlfs_view *v = mlfs_store_view(st);
	int rc = 0;

	if (!v)
		return ptc_errorf(err, "flip: no layout");
	const struct ptc_schema *s = v->layout.schema;
	int si = state ? ptc_schema_find_state(s, state) : -1;
	int t = tensor ? ptc_schema_find(s, tensor) : -1;
	if (si < 0 || t < 0 || rank < 0 || rank >= v->layout.world) {
		rc = ptc_errorf(err, "flip: no partition (rank %d, %s, %s)", rank,
				state ? state : "?", tensor ? tensor : "?");
		goto out;
	}
	struct xf_buf *b = mlfs_store_part_get(st, v, rank, si, t);
	if (!b || byte < 0 || byte >= b->size) {
		rc = ptc_errorf(
		    err, "flip: partition (rank %d, %s, %s) is not here or has no byte %" PRId64,
		    rank, state, tensor, byte);
	} else {
		b->data[byte] ^= 1; /* the test hook's one write into a committed buffer */
		mlfs_log(MLFS_LOG_WARNING,
			 "test hook: flipped a bit of byte %" PRId64
			 " of partition (rank %d, %s, %s)",
			 byte, rank, state, tensor);
	}
	xf_buf_put(b);
out:
	mlfs_view_put(v);
	return rc;
}
