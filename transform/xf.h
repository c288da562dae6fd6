/*
 * xf.h - executes plans: partition buffers, box copies, the parallel executor,
 * slicing full tensors into partitions and assembling them back.
 *
 * transform depends on ptc only. It owns the byte buffers that hold
 * partitions (shared, reference-counted, between FUSE readers, HTTP senders
 * and the transformer) and the memory bound they live under.
 */
#ifndef MLFS_XF_H
#define MLFS_XF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ptc/ptc.h"

/* ------------------------------------------------------------ memory bound */

/* Bytes in use by buffers, and the limit (0 = none). Thread-safe. */
struct xf_mem {
	_Atomic int64_t used;
	int64_t limit;
	_Atomic int64_t peak; /* the most @used reached since someone reset it */
};

/* Reserves @n bytes: 0, or -ENOSPC when that would pass the limit. */
int xf_mem_reserve(struct xf_mem *m, int64_t n);
void xf_mem_release(struct xf_mem *m, int64_t n);

/* ----------------------------------------------------------------- buffers */

/*
 * A reference-counted, zero-initialised byte buffer. Large buffers are
 * anonymous mappings (zero pages until written). Any thread may get/put;
 * the last put frees it and returns its bytes to @mem.
 */
struct xf_buf {
	atomic_int refs;
	int64_t size;
	uint8_t *data;
	struct xf_mem *mem; /* may be NULL: not accounted */
	bool mapped;
	uint64_t id; /* unique per buffer for the life of the process (cache identity) */
	/* The checksum of the committed bytes (mlfs_hash, XXH3 64): set once
	 * when the buffer is committed (xf_buf_seal, xf_buf_set_sum), before it
	 * is published; the bytes never change after. 0 in @summed: none yet
	 * (a layout's zero buffers: computed at first use, xf_buf_sum). */
	_Atomic uint64_t sum;
	atomic_bool summed;
};

/* New zeroed buffer of @size bytes (size 0 allowed), refs = 1. Returns NULL
 * with *rc = -ENOSPC past the memory limit or -ENOMEM. */
struct xf_buf *xf_buf_new(struct xf_mem *mem, int64_t size, int *rc);
/* Adds a reference; returns @b. NULL-safe. */
struct xf_buf *xf_buf_get(struct xf_buf *b);
/* Drops a reference; frees on the last. NULL-safe. */
void xf_buf_put(struct xf_buf *b);

/*
 * Checksums (DESIGN of xf_buf.c). xf_buf_seal computes @b's XXH3 now and
 * keeps it: call it when the buffer is committed, its bytes final, before
 * anyone else sees it. xf_buf_set_sum keeps a checksum the caller verified
 * (a copy checked against its source's). xf_buf_sum is the kept checksum,
 * or, for a buffer never sealed (zero buffers), one computed now and kept.
 * xf_buf_sealed says whether @b has one. Any thread.
 */
void xf_buf_seal(struct xf_buf *b);
void xf_buf_set_sum(struct xf_buf *b, uint64_t sum);
uint64_t xf_buf_sum(struct xf_buf *b);
bool xf_buf_sealed(const struct xf_buf *b);
/* The XXH3 of rows [row, row + rows) of every outer block of a partition of
 * @prows rows of @row_bytes bytes at @data, back to back: the checksum of
 * exactly the bytes a /v1/part reply of that range carries. Any thread. */
uint64_t xf_rows_sum(const uint8_t *data, int64_t prows, int64_t row, int64_t rows, int64_t outer,
		     int64_t row_bytes);
/* Such row ranges of several partitions, one after the other: the checksum
 * of a /v1/parts reply. Any thread. */
struct xf_rows {
	const uint8_t *data;
	int64_t prows, row, rows, outer, row_bytes;
};
uint64_t xf_rows_sum_many(const struct xf_rows *v, size_t n);

/* ---------------------------------------------------------------- box copy */

/*
 * Copies rows [src_row, src_row + rows) of a partition with @src_rows rows
 * to rows [dst_row, ...) of one with @dst_rows rows; both are @outer blocks
 * of rows of @row_bytes bytes (ptc_tensor_geometry). Bounds are the caller's.
 */
void xf_copy_rows(uint8_t *dst, int64_t dst_rows, int64_t dst_row, const uint8_t *src,
		  int64_t src_rows, int64_t src_row, int64_t rows, int64_t outer,
		  int64_t row_bytes);

/*
 * A copy of @len bytes that may fail: 0, or a negative errno. For sources
 * whose reads can fault, such as a mapping of a file that may shrink (the
 * daemon passes a copy that catches the SIGBUS; transform installs no
 * signal handlers).
 */
typedef int (*xf_copy_fn)(void *dst, const void *src, size_t len);

/* xf_copy_rows through @copy (NULL = memcpy), one call per contiguous run:
 * 0, or @copy's first error (the rest is not copied). Any thread. */
int xf_copy_rows_with(uint8_t *dst, int64_t dst_rows, int64_t dst_row, const uint8_t *src,
		      int64_t src_rows, int64_t src_row, int64_t rows, int64_t outer,
		      int64_t row_bytes, xf_copy_fn copy);

/* ------------------------------------------------------------ full tensors */

/*
 * A full tensor is the logical tensor of the schema (unpadded, unsplit):
 * outer blocks of N rows (N = the split dimension's size; one "row" for a
 * tensor without split), as `mlfs import` reads and full/ shows it. These
 * are the copies between it and the TP partitions of DESIGN section 3.
 */

/* Bytes of full tensor @tensor in state @state (ptc_tensor_elems x dtype). */
int64_t xf_full_bytes(const struct ptc_schema *s, int state, int tensor);

/*
 * Copies TP rank @tpr of @tp's rows of the full tensor at @full
 * (xf_full_bytes bytes, the caller's bound) into @part, that partition
 * (ptc_partition_elems x dtype bytes). Padding rows are not written: a new
 * buffer's zeros. A tied tensor takes the full tensor it is tied to. Each
 * contiguous run is read through @copy (NULL = memcpy).
 * Returns 0, -EINVAL when @part's size is not the partition's (nothing
 * copied), or @copy's error (@part then partly written). Any thread; @full
 * and @part are borrowed.
 */
int xf_full_slice(const struct ptc_schema *s, int state, int tensor, int tp, int tpr,
		  const uint8_t *full, struct xf_buf *part, xf_copy_fn copy);

/*
 * Assembles full tensor @tensor of @state from @parts: TP rank t's
 * partition in @parts[t] of @nparts (the layout's tp; 1 for a tensor
 * without split, whose one partition is the whole tensor). Returns 0 and a
 * new buffer (refs 1) from @mem in *@out; -EINVAL when @nparts or a part's
 * size does not fit the tensor, -ENOSPC past @mem's limit, -ENOMEM. Any
 * thread; @parts are borrowed (the caller holds their references).
 */
int xf_full_assemble(const struct ptc_schema *s, int state, int tensor, struct xf_buf *const *parts,
		     int nparts, struct xf_mem *mem, struct xf_buf **out);

/* ------------------------------------------------------------- partitions */

/*
 * The partitions of one layout hosted on one node, and only those: the
 * node's ranks are consecutive (ptc_layout's node_first_rank, node_nranks),
 * so world rank r is local slot r - r0 when 0 <= r - r0 < nranks, and
 * bufs[((r - r0) * nstates + state) * ntensors + tensor] is its partition,
 * NULL where the rank does not hold the tensor. The table is the node's
 * ranks x states x tensors, whatever the size of the world. Each non-NULL
 * entry holds one reference.
 */
struct xf_parts {
	const struct ptc_layout *layout;
	int node;
	int r0, nranks; /* the node's ranks: [r0, r0 + nranks); r0 0 when none */
	int nstates, ntensors;
	struct xf_buf **bufs;
};

/* Whether world rank @rank is one of the table's (its node's). */
static inline bool xf_parts_local(const struct xf_parts *p, int rank)
{
	return rank >= p->r0 && rank - p->r0 < p->nranks;
}

/* The slot of (@rank, @state, @tensor): @rank must be local (xf_parts_local). */
static inline size_t xf_parts_index(const struct xf_parts *p, int rank, int state, int tensor)
{
	return ((size_t)(rank - p->r0) * (size_t)p->nstates + (size_t)state) * (size_t)p->ntensors +
	       (size_t)tensor;
}

/* Slots of the table: the node's ranks x states x tensors. */
static inline size_t xf_parts_count(const struct xf_parts *p)
{
	return (size_t)p->nranks * (size_t)p->nstates * (size_t)p->ntensors;
}

/* The buffer of (@rank, @state, @tensor), borrowed; NULL when @rank is not
 * the node's or holds nothing there. */
static inline struct xf_buf *xf_parts_at(const struct xf_parts *p, int rank, int state, int tensor)
{
	return xf_parts_local(p, rank) ? p->bufs[xf_parts_index(p, rank, state, tensor)] : NULL;
}

/* Bytes of the partition of (@rank, @state, @tensor) under @l. */
int64_t xf_partition_bytes(const struct ptc_layout *l, int rank, int state, int tensor);

/* Sets up an empty table for @node of @l. 0 or -ENOMEM. */
int xf_parts_init(struct xf_parts *p, const struct ptc_layout *l, int node);
/* Fills every missing entry of @p with a new zeroed buffer. 0, -ENOSPC, -ENOMEM
 * (entries allocated before the failure stay). */
int xf_parts_alloc_zero(struct xf_parts *p, struct xf_mem *mem);
/* Puts every buffer and frees the table. */
void xf_parts_release(struct xf_parts *p);

/* ---------------------------------------------------------------- executor */

/*
 * One piece of a FETCH op: rows [op.src_row, op.src_row + op.rows) of old
 * partition (op.src_rank, op.state, op.src_tensor), for every outer block,
 * into rows [op.dst_row, ...) of the new partition at @dst (@outer blocks
 * of @dst_rows rows of @row_bytes bytes). op.bytes = outer * rows * row_bytes.
 */
struct xf_piece {
	struct ptc_op op;
	uint8_t *dst;
	int64_t dst_rows, outer, row_bytes;
};

/* Pieces one fetch call may carry at most, and their bytes: small pieces
 * of one source node travel together (xf_execute batches them), so that a
 * node fetching many small tensors makes one request per source and
 * megabyte, not one per tensor. The peer server refuses larger batches. */
#define XF_BATCH_MAX   64
#define XF_BATCH_BYTES ((int64_t)1 << 20)

/*
 * Fetches @n pieces (FETCH ops, or pieces of them) from other nodes into
 * their destinations. With n > 1 every piece is at most XF_BATCH_BYTES / 4
 * bytes, all together at most XF_BATCH_BYTES, all from the same src_node,
 * none from a backup, all with the same dst_node sign; a piece with
 * op.backup = 1 (alone) names a down node and its old rank: its rows come
 * from that node's backup holder, which may be this node. Called from
 * executor threads, concurrently. Returns 0 or a negative errno (the
 * execution then fails with it). Unused for local plans.
 */
typedef int (*xf_fetch_fn)(void *arg, const struct xf_piece *v, size_t n);

struct xf_stats {
	int64_t bytes_reused, bytes_copied, bytes_fetched, bytes_zeroed;
	int64_t bytes_summed; /* new partitions checksummed (xf_buf_seal) */
	double seconds;
	double seconds_sum; /* of @seconds, the checksum phase's */
};

/* Whether checksums are skipped (MLFS_BENCH_NOSUM=1 in the environment:
 * the checksum benchmark's baseline only; read once). Then xf_execute seals
 * nothing and the peer client verifies nothing. Any thread. */
bool xf_sums_off(void);

/*
 * Builds @to's partitions for @node from @from's, following @plan: REUSE
 * shares the old buffer (no copy), every other new partition is a new
 * buffer from @mem, then phase 0 ops and phase 1 ops run on @nthreads
 * threads, large ops split into pieces of about 1 MiB, then every new
 * partition is sealed (xf_buf_seal), one item per partition, on the same
 * threads. @progress (may be
 * NULL) is advanced by bytes done, for status readers.
 * @to must be initialised (xf_parts_init) and empty. On failure every entry
 * of @to is released and @from is untouched. Returns 0, -ENOSPC past the
 * memory limit, -EIO (or the fetch callback's errno), -ENOMEM.
 */
int xf_execute(const struct ptc_plan *plan, int node, const struct xf_parts *from,
	       struct xf_parts *to, struct xf_mem *mem, int nthreads, xf_fetch_fn fetch,
	       void *fetch_arg, _Atomic int64_t *progress, struct xf_stats *stats);

/* Bytes of new buffers xf_execute would allocate on @node (everything not
 * reused), to refuse a reconfiguration that cannot fit before it starts. */
int64_t xf_plan_new_bytes(const struct ptc_plan *plan, int node);

#endif
