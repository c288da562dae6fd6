/*
 * xf_full.c - full tensors: slicing one into a TP partition, assembling the
 * partitions back into it.
 *
 * DESIGN
 * A full tensor and each of its partitions are `outer` blocks of rows of
 * `row_bytes` bytes (ptc_tensor_geometry); they differ only in the rows a
 * block holds: N for the full tensor, the slice's rows for a partition.
 * ptc_slice_compute says which global rows each local run of a partition
 * holds (or that it is padding), so both directions are the same row copy
 * (xf_copy_rows_with) per logical run, with source and destination swapped.
 * Padding runs are never copied: zeros in a new partition, absent from the
 * full tensor.
 *
 * Sizes are checked against the schema before anything is copied, so a
 * buffer of the wrong size is -EINVAL, never an overrun. The full tensor's
 * own bound is the caller's (a file mapping or a buffer it sized with
 * xf_full_bytes). No state, no locks: any thread.
 */
#include <errno.h>
#include <stdint.h>

#include "transform/xf.h"

/* Bytes per element of @tensor in @state. */
static int64_t esize(const struct ptc_schema *s, int state, int tensor)
{
	return (int64_t)ptc_dtype_size(ptc_schema_dtype(s, state, tensor));
}

/* Rows of the full tensor along its split dimension (1 without split). */
static int64_t full_rows(const struct ptc_tensor *t)
{
	return t->split_dim < 0 ? 1 : t->shape[t->split_dim];
}

int64_t xf_full_bytes(const struct ptc_schema *s, int state, int tensor)
{
	return ptc_tensor_elems(&s->tensors[tensor]) * esize(s, state, tensor);
}

int xf_full_slice(const struct ptc_schema *s, int state, int tensor, int tp, int tpr,
		  const uint8_t *full, struct xf_buf *part, xf_copy_fn copy)
{
	const struct ptc_tensor *t = &s->tensors[tensor];
	int64_t outer, rowel, rb, n = full_rows(t);
	struct ptc_slice sl;

	if (tp < 1 || tpr < 0 || tpr >= tp ||
	    part->size != ptc_partition_elems(t, tp, tpr) * esize(s, state, tensor))
		return -EINVAL;
	ptc_tensor_geometry(t, &outer, &rowel);
	rb = rowel * esize(s, state, tensor);
	ptc_slice_compute(t, tp, tpr, &sl);
	for (int i = 0; i < sl.nsegs; i++) {
		const struct ptc_seg *g = &sl.segs[i];
		int rc = g->global < 0 ? 0
				       : xf_copy_rows_with(part->data, sl.rows, g->local, full, n,
							   g->global, g->len, outer, rb, copy);
		if (rc)
			return rc;
	}
	return 0;
}

int xf_full_assemble(const struct ptc_schema *s, int state, int tensor, struct xf_buf *const *parts,
		     int nparts, struct xf_mem *mem, struct xf_buf **out)
{
	const struct ptc_tensor *t = &s->tensors[tensor];
	int64_t outer, rowel, rb, n = full_rows(t);
	int rc;

	if (nparts < 1 || (t->split_dim < 0 && nparts != 1))
		return -EINVAL;
	for (int k = 0; k < nparts; k++)
		if (parts[k]->size != ptc_partition_elems(t, nparts, k) * esize(s, state, tensor))
			return -EINVAL;
	ptc_tensor_geometry(t, &outer, &rowel);
	rb = rowel * esize(s, state, tensor);
	struct xf_buf *b = xf_buf_new(mem, outer * n * rb, &rc);
	if (!b)
		return rc;
	for (int k = 0; k < nparts; k++) {
		struct ptc_slice sl;
		ptc_slice_compute(t, nparts, k, &sl);
		for (int i = 0; i < sl.nsegs; i++)
			if (sl.segs[i].global >= 0)
				xf_copy_rows(b->data, n, sl.segs[i].global, parts[k]->data, sl.rows,
					     sl.segs[i].local, sl.segs[i].len, outer, rb);
	}
	*out = b;
	return 0;
}
