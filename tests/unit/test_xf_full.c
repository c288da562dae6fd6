/*
 * test_xf_full.c - full tensors (transform/xf_full.c): slicing a full
 * tensor into its TP partitions and assembling them back, as a property
 * over random schemas against model.h's independent layout model, and a
 * case by hand.
 */
#include "tests/unit/xf_fixture.h"

/* ---------------------------------------------------------- full tensors */

/* A checked copy for xf_full_slice: counts its calls and fails with -EIO
 * from call @copy_fail_at on (0 = never), like a mapping that shrank. */
static int copy_calls, copy_fail_at;

static int counting_copy(void *dst, const void *src, size_t len)
{
	if (copy_fail_at && ++copy_calls >= copy_fail_at)
		return -EIO;
	copy_calls += !copy_fail_at;
	memcpy(dst, src, len);
	return 0;
}

/* The full tensor of (@st, logical @t): the synthetic bytes in element order. */
static uint8_t *full_data(const struct ptc_schema *s, int st, int t, int64_t *size)
{
	int64_t es = esize(s, st, t), n = ptc_tensor_elems(&s->tensors[t]);
	uint8_t *b = malloc((size_t)(n * es > 0 ? n * es : 1));

	for (int64_t e = 0; e < n; e++)
		for (int k = 0; k < es; k++)
			b[e * es + k] = data_byte(st, t, e, k);
	*size = n * es;
	return b;
}

/*
 * Property: for random schemas and tp, slicing each full tensor into its TP
 * partitions gives the model's partitions (zero padding; a tied tensor's
 * from the tensor it is tied to), and assembling those gives the full
 * tensor back, byte for byte. Sizes that do not fit and a failing copy are
 * refused; every byte goes back to the memory bound.
 */
static void test_full_round_trip(void **state)
{
	(void)state;
	int cases = prop_cases(300), done = 0, padded = 0;
	char *ids[] = {"n0"};

	rng_state = 0xD1B54A32D192ED03ull;
	for (int c = 0; done < cases && c < 10 * cases; c++) {
		struct ptc_schema *s;
		struct ptc_error err;
		struct ptc_layout l;
		json_t *js = random_schema();
		int tp = rndi(1, 4);
		assert_int_equal(ptc_schema_parse(js, "schema.json", &s, &err), 0);
		json_decref(js);
		struct ptc_cluster *cl = ptc_cluster_new_uniform(1, ids, 8);
		json_t *jc = json_pack("{sisisisis[s]}", "version", 1, "tp", tp, "pp", 1, "dp", 1,
				       "nodes", "n0");
		struct ptc_config *cfg;
		assert_int_equal(ptc_config_parse(jc, "config.json", &cfg, &err), 0);
		json_decref(jc);
		if (ptc_layout_init(&l, s, cfg, cl, "config.json", &err)) {
			goto next; /* tp larger than some chunk */
		}
		struct xf_mem mem = {0};
		for (int st = 0; st < s->nstates; st++)
			for (int t = 0; t < s->ntensors; t++) {
				const struct ptc_tensor *T = &s->tensors[t];
				int logical = ptc_schema_logical(s, t),
				    n = T->split_dim < 0 ? 1 : tp;
				int64_t fsize, size;
				uint8_t *full = full_data(s, st, logical, &fsize);
				struct xf_buf *parts[4], *out = NULL;
				assert_int_equal(xf_full_bytes(s, st, logical), fsize);
				for (int k = 0; k < tp; k++) {
					uint8_t *want = expected_part(&l, k, st, t, 0, &size);
					struct xf_buf *b = xf_buf_new(&mem, size, NULL);
					copy_calls = copy_fail_at = 0;
					assert_int_equal(
					    xf_full_slice(s, st, t, tp, k, full, b,
							  k % 2 ? counting_copy : NULL),
					    0);
					assert_memory_equal(b->data, want, (size_t)size);
					int64_t nr, *m = rowmap(T, tp, k, &nr), logical_rows = 0;
					for (int64_t i = 0; i < nr; i++)
						logical_rows += m[i] >= 0;
					free(m);
					/* Through the copy function: every logical run. */
					assert_true(k % 2 == 0 ||
						    (copy_calls > 0) == (logical_rows > 0));
					padded += T->pad_multiple > 0;
					free(want);
					if (k < n)
						parts[k] = b;
					else
						xf_buf_put(b); /* a replica of parts[0] */
				}
				if (T->tied < 0) { /* full/ shows untied tensors */
					assert_int_equal(
					    xf_full_assemble(s, st, t, parts, n, &mem, &out), 0);
					assert_int_equal(out->size, fsize);
					assert_memory_equal(out->data, full, (size_t)fsize);
					xf_buf_put(out);
				}
				/* A part count or a part size that does not fit the tensor. */
				assert_int_equal(xf_full_assemble(s, st, t, parts, 0, &mem, &out),
						 -EINVAL);
				if (T->split_dim < 0) {
					struct xf_buf *two[2] = {parts[0], parts[0]};
					assert_int_equal(
					    xf_full_assemble(s, st, t, two, 2, &mem, &out),
					    -EINVAL);
				}
				struct xf_buf *small = xf_buf_new(&mem, parts[0]->size + 1, NULL);
				assert_int_equal(xf_full_slice(s, st, t, tp, 0, full, small, NULL),
						 -EINVAL);
				struct xf_buf *keep = parts[0];
				parts[0] = small;
				assert_int_equal(xf_full_assemble(s, st, t, parts, n, &mem, &out),
						 -EINVAL);
				parts[0] = keep;
				xf_buf_put(small);
				/* A copy that fails stops the slice with its error. */
				copy_calls = 0;
				copy_fail_at = 1;
				if (parts[0]->size > 0)
					assert_int_equal(xf_full_slice(s, st, t, tp, 0, full,
								       parts[0], counting_copy),
							 -EIO);
				copy_fail_at = 0;
				for (int k = 0; k < n; k++)
					xf_buf_put(parts[k]);
				free(full);
			}
		assert_int_equal(mem.used, 0);
		ptc_layout_release(&l);
		done++;
	next:
		ptc_config_free(cfg);
		ptc_cluster_free(cl);
		ptc_schema_free(s);
	}
	printf("xf full: %d schemas sliced and assembled exactly (%d padded partitions)\n", done,
	       padded);
	assert_int_equal(done, cases);
	assert_true(padded > 0);
}

/* A fixed case by hand: [2, 5, 3] uint8 split along dim 1 in chunks [3, 2]
 * for tp 2: rank 0 holds rows {0, 3}, rank 1 rows {1, 2, 4}. */
static void test_full_by_hand(void **state)
{
	(void)state;
	struct ptc_schema *s;
	struct ptc_error err;
	char *js = unit_json("{'num_layers': 0, 'states': {'model': {}}, 'tensors': [{'name': 'w',"
			     " 'dtype': 'uint8', 'shape': [2, 5, 3],"
			     " 'split': {'dim': 1, 'chunks': [3, 2]}}]}");
	uint8_t full[30];
	struct xf_mem mem = {0};

	assert_int_equal(ptc_schema_parse_text(js, strlen(js), "schema.json", &s, &err), 0);
	free(js);
	for (int i = 0; i < 30; i++)
		full[i] = (uint8_t)i;
	struct xf_buf *p0 = xf_buf_new(&mem, 12, NULL), *p1 = xf_buf_new(&mem, 18, NULL), *out;
	assert_int_equal(xf_full_slice(s, 0, 0, 2, 0, full, p0, NULL), 0);
	assert_int_equal(xf_full_slice(s, 0, 0, 2, 1, full, p1, NULL), 0);
	static const uint8_t want0[12] = {0, 1, 2, 9, 10, 11, 15, 16, 17, 24, 25, 26};
	static const uint8_t want1[18] = {3,  4,  5,  6,  7,  8,  12, 13, 14,
					  18, 19, 20, 21, 22, 23, 27, 28, 29};
	assert_memory_equal(p0->data, want0, 12);
	assert_memory_equal(p1->data, want1, 18);
	struct xf_buf *parts[2] = {p0, p1};
	assert_int_equal(xf_full_assemble(s, 0, 0, parts, 2, &mem, &out), 0);
	assert_memory_equal(out->data, full, 30);
	assert_int_equal(mem.used, 60);
	xf_buf_put(out);
	xf_buf_put(p0);
	xf_buf_put(p1);
	assert_int_equal(mem.used, 0);
	ptc_schema_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_full_by_hand),
	    cmocka_unit_test(test_full_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
