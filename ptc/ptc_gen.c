/*
 * ptc_gen.c - schema generators for common models (`mlfs schema ...`).
 *
 * DESIGN
 * Each generator validates its arguments, then emits the schema.json object
 * of DESIGN.md section 4 with Megatron-LM tensor names:
 *   megatron-gpt  learned position embeddings, LayerNorm with biases, fused
 *                 QKV in three equal chunks, GELU MLP of width ffn (4H).
 *                 The QKV rows and the attention projection's columns are
 *                 split in whole heads ("unit": head size).
 *   llama         no biases or position embeddings, RMSNorm weights, fused
 *                 QKV with grouped-query attention (chunks [A*d, G*d, G*d]),
 *                 SwiGLU gate/up fused in two chunks, ffn 256-rounded 8H/3.
 *   moe           llama with each layer's MLP replaced by a router [E, H]
 *                 (replicated), E routed experts and optionally one shared
 *                 MLP of S experts' width, each a SwiGLU MLP of its own
 *                 tensors split by TP like llama's: expert parallelism over
 *                 DP ranks has no expression in a schema, whose splits are
 *                 over TP ranks only (docs/decisions.md, "Mixture of
 *                 experts: experts split by TP").
 * All pad the vocabulary to multiples of 128 per TP rank and tie
 * output_layer/weight to the word embeddings when asked. Every tensor has
 * the argument dtype; the optimizer moments are float32 states unless
 * asked otherwise (--moments-dtype).
 *
 * Building is a sequence of jansson calls on one struct gen; a failed
 * allocation only sets gen.failed (jansson accepts NULL and frees the
 * values it was handed), so the emitters stay free of error paths and the
 * generator reports out of memory once at the end.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "ptc/ptc.h"

#define GEN_PAD_MULTIPLE       128
#define GEN_DEFAULT_SEQ	       2048
#define GEN_LLAMA_FFN_MULTIPLE 256

struct gen {
	json_t *tensors; /* borrowed from the root object */
	const char *dtype;
	int failed;
};

/* ------------------------------------------------------------ validation */

static int check_min(const char *model, const char *flag, int v, int lo, struct ptc_error *err)
{
	if (v >= lo)
		return 0;
	return ptc_errorf(err, "%s: \"%s\" = %d is less than %d", model, flag, v, lo);
}

/* Checks that @v (flag @flag) divides @of (flag @of_flag); @v >= 1. */
static int check_divides(const char *model, const char *flag, int v, const char *of_flag, int of,
			 struct ptc_error *err)
{
	if (of % v == 0)
		return 0;
	return ptc_errorf(err, "%s: \"%s\" = %d does not divide \"%s\" = %d", model, flag, v,
			  of_flag, of);
}

/* Validates the arguments both models share (kv_heads is llama's own). */
static int check_common(const char *model, const struct ptc_gen_args *a, struct ptc_error *err)
{
	if (check_min(model, "--layers", a->layers, 1, err) ||
	    check_min(model, "--hidden", a->hidden, 1, err) ||
	    check_min(model, "--heads", a->heads, 1, err) ||
	    check_divides(model, "--heads", a->heads, "--hidden", a->hidden, err) ||
	    check_min(model, "--vocab", a->vocab, 1, err) ||
	    check_min(model, "--ffn", a->ffn, 0, err) || check_min(model, "--seq", a->seq, 0, err))
		return -EINVAL;
	if ((unsigned)a->dtype >= PTC_DTYPE_COUNT)
		return ptc_errorf(err, "%s: \"--dtype\" = %d is not a known dtype", model,
				  (int)a->dtype);
	return 0;
}

/* Refuses the moe flags for a dense model, rather than ignoring them. */
static int check_dense(const char *model, const struct ptc_gen_args *a, struct ptc_error *err)
{
	static const char *const flags[] = {"--experts", "--expert-ffn", "--shared-experts",
					    "--dense-layers"};
	int v[] = {a->experts, a->expert_ffn, a->shared_experts, a->dense_layers};

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		if (v[i])
			return ptc_errorf(err, "%s: \"%s\" is for moe only", model, flags[i]);
	return 0;
}

/* Validates --kv-heads (llama, moe and megatron-gpt); sets *@kv to the KV
 * heads (query groups). */
static int check_llama(const char *model, const struct ptc_gen_args *a, int *kv,
		       struct ptc_error *err)
{
	*kv = a->kv_heads ? a->kv_heads : a->heads;
	if (check_min(model, "--kv-heads", a->kv_heads, 0, err) ||
	    check_divides(model, "--kv-heads", *kv, "--heads", a->heads, err))
		return -EINVAL;
	return 0;
}

/* -------------------------------------------------------------- emitters */

static void gen_set(struct gen *g, json_t *obj, const char *key, json_t *val)
{
	if (json_object_set_new(obj, key, val))
		g->failed = 1;
}

/* Appends a tensor named @name of shape @shape (consumed); returns it, borrowed. */
static json_t *gen_tensor(struct gen *g, const char *name, json_t *shape)
{
	json_t *t = json_object();

	if (json_array_append_new(g->tensors, t)) {
		json_decref(shape);
		g->failed = 1;
		return NULL;
	}
	gen_set(g, t, "name", json_string(name));
	gen_set(g, t, "dtype", json_string(g->dtype));
	gen_set(g, t, "shape", shape);
	return t;
}

static json_t *gen_vector(struct gen *g, const char *name, int64_t n)
{
	return gen_tensor(g, name, json_pack("[I]", (json_int_t)n));
}

static json_t *gen_matrix(struct gen *g, const char *name, int64_t rows, int64_t cols)
{
	return gen_tensor(g, name, json_pack("[I, I]", (json_int_t)rows, (json_int_t)cols));
}

/* Splits @t along @dim in @chunks (consumed; NULL for one), padded when @pad. */
static void gen_split(struct gen *g, json_t *t, int dim, json_t *chunks, bool pad)
{
	json_t *split = json_object();

	gen_set(g, split, "dim", json_integer(dim));
	if (chunks)
		gen_set(g, split, "chunks", chunks);
	if (pad)
		gen_set(g, split, "pad_multiple", json_integer(GEN_PAD_MULTIPLE));
	gen_set(g, t, "split", split);
}

/* The same, keeping heads of @d rows along @dim whole on one TP rank (a tp
 * that would cut one, e.g. more TP ranks than GQA's KV heads, is refused,
 * as Megatron refuses it). */
static void gen_split_heads(struct gen *g, json_t *t, int dim, json_t *chunks, int64_t d)
{
	gen_split(g, t, dim, chunks, false);
	if (d > 1)
		gen_set(g, json_object_get(t, "split"), "unit", json_integer(d));
}

static void gen_place(struct gen *g, json_t *t, const char *place)
{
	gen_set(g, t, "place", json_string(place));
}

/* The root object with its states (the moments in @moments) and an empty
 * "tensors" array. */
static json_t *gen_root(struct gen *g, const char *model, int layers, const char *moments)
{
	json_t *root = json_pack("{s:s, s:i, s:{s:{}, s:{s:s}, s:{s:s}}}", "model", model,
				 "num_layers", layers, "states", "model", "optim/exp_avg", "dtype",
				 moments, "optim/exp_avg_sq", "dtype", moments);

	g->tensors = json_array();
	if (json_object_set_new(root, "tensors", g->tensors)) {
		g->tensors = NULL; /* freed by jansson */
		g->failed = 1;
	}
	return root;
}

static json_t *gen_finish(struct gen *g, json_t *root, const char *model, struct ptc_error *err)
{
	if (!g->failed)
		return root;
	json_decref(root);
	ptc_error_set(err, -ENOMEM, "%s: out of memory", model);
	return NULL;
}

/* Word embeddings [V, H], vocabulary padded per TP rank, on the first stage. */
static void gen_embedding(struct gen *g, int64_t vocab, int64_t hidden)
{
	json_t *t = gen_matrix(g, "embedding/word_embeddings/weight", vocab, hidden);

	gen_split(g, t, 0, NULL, true);
	gen_place(g, t, "first");
}

/* Output projection [V, H] on the last stage, a copy of the embeddings when @tied. */
static void gen_output(struct gen *g, int64_t vocab, int64_t hidden, bool tied)
{
	json_t *t = gen_matrix(g, "output_layer/weight", vocab, hidden);

	gen_split(g, t, 0, NULL, true);
	gen_place(g, t, "last");
	if (tied)
		gen_set(g, t, "tied", json_string("embedding/word_embeddings/weight"));
}

/* --------------------------------------------------------- megatron-gpt */

/* A layer as Megatron-Core lays it out. The fused QKV is interleaved per
 * query group, [ng, (np/ng + 2) * hn, h]: each group's query heads, then
 * its key head, then its value head, so a TP rank's linear_qkv is the
 * contiguous block of its groups: a split of dim 0 whose unit is one group
 * (@nq query heads, @nkv groups, heads of @d rows). */
static void gen_gpt_layer(struct gen *g, int64_t h, int64_t f, int64_t nq, int64_t nkv, int64_t d)
{
	int64_t rows = (nq + 2 * nkv) * d, group = (nq / nkv + 2) * d;
	json_t *t;

	gen_vector(g, "layers/{L}/input_layernorm/weight", h);
	gen_vector(g, "layers/{L}/input_layernorm/bias", h);
	t = gen_matrix(g, "layers/{L}/self_attention/query_key_value/weight", rows, h);
	gen_split_heads(g, t, 0, NULL, group);
	t = gen_vector(g, "layers/{L}/self_attention/query_key_value/bias", rows);
	gen_split_heads(g, t, 0, NULL, group);
	t = gen_matrix(g, "layers/{L}/self_attention/dense/weight", h, h);
	gen_split_heads(g, t, 1, NULL, d);
	gen_vector(g, "layers/{L}/self_attention/dense/bias", h);
	gen_vector(g, "layers/{L}/post_attention_layernorm/weight", h);
	gen_vector(g, "layers/{L}/post_attention_layernorm/bias", h);
	t = gen_matrix(g, "layers/{L}/mlp/dense_h_to_4h/weight", f, h);
	gen_split(g, t, 0, NULL, false);
	t = gen_vector(g, "layers/{L}/mlp/dense_h_to_4h/bias", f);
	gen_split(g, t, 0, NULL, false);
	t = gen_matrix(g, "layers/{L}/mlp/dense_4h_to_h/weight", h, f);
	gen_split(g, t, 1, NULL, false);
	gen_vector(g, "layers/{L}/mlp/dense_4h_to_h/bias", h);
}

json_t *ptc_gen_megatron_gpt(const struct ptc_gen_args *a, struct ptc_error *err)
{
	static const char model[] = "megatron-gpt";
	struct gen g = {0};
	json_t *root, *t;

	int kv;
	if (check_common(model, a, err) || check_dense(model, a, err) ||
	    check_llama(model, a, &kv, err))
		return NULL;
	int64_t h = a->hidden, v = a->vocab;
	int64_t f = a->ffn ? a->ffn : 4 * h;
	int64_t seq = a->seq ? a->seq : GEN_DEFAULT_SEQ;

	g.dtype = ptc_dtype_name(a->dtype);
	root = gen_root(&g, model, a->layers,
			ptc_dtype_name(a->has_moments_dtype ? a->moments_dtype : PTC_FLOAT32));
	gen_embedding(&g, v, h);
	t = gen_matrix(&g, "embedding/position_embeddings/weight", seq, h);
	gen_place(&g, t, "first");
	gen_gpt_layer(&g, h, f, a->heads, kv, h / a->heads);
	t = gen_vector(&g, "final_layernorm/weight", h);
	gen_place(&g, t, "last");
	t = gen_vector(&g, "final_layernorm/bias", h);
	gen_place(&g, t, "last");
	gen_output(&g, v, h, a->tied);
	return gen_finish(&g, root, model, err);
}

/* ----------------------------------------------------------------- llama */

/* A layer's norms and attention: @nq query heads and @nkv key/value heads
 * of size @d. */
static void gen_llama_attention(struct gen *g, int64_t h, int64_t nq, int64_t nkv, int64_t d)
{
	json_int_t q = nq * d, kv = nkv * d;
	json_t *t;

	gen_vector(g, "layers/{L}/input_layernorm/weight", h);
	t = gen_matrix(g, "layers/{L}/self_attention/query_key_value/weight", q + 2 * kv, h);
	gen_split_heads(g, t, 0, json_pack("[I, I, I]", q, kv, kv), d);
	t = gen_matrix(g, "layers/{L}/self_attention/dense/weight", h, q);
	gen_split_heads(g, t, 1, NULL, d);
	gen_vector(g, "layers/{L}/post_attention_layernorm/weight", h);
}

/* A SwiGLU MLP of width @f under @prefix: gate/up fused in two chunks (each
 * TP rank holds its rows of both), down split along its columns. */
static void gen_swiglu(struct gen *g, const char *prefix, int64_t h, int64_t f)
{
	char name[128];
	json_t *t;

	snprintf(name, sizeof(name), "%s/dense_h_to_4h/weight", prefix);
	t = gen_matrix(g, name, 2 * f, h);
	gen_split(g, t, 0, json_integer(2), false);
	snprintf(name, sizeof(name), "%s/dense_4h_to_h/weight", prefix);
	t = gen_matrix(g, name, h, f);
	gen_split(g, t, 1, NULL, false);
}

/* LLaMA's SwiGLU width: 2/3 of 4H, rounded up to a multiple of 256. */
static int64_t llama_default_ffn(int64_t h)
{
	int64_t m = GEN_LLAMA_FFN_MULTIPLE;

	return (8 * h / 3 + m - 1) / m * m;
}

json_t *ptc_gen_llama(const struct ptc_gen_args *a, struct ptc_error *err)
{
	static const char model[] = "llama";
	struct gen g = {0};
	json_t *root, *t;
	int kv;

	if (check_common(model, a, err) || check_llama(model, a, &kv, err) ||
	    check_dense(model, a, err))
		return NULL;
	int64_t h = a->hidden, v = a->vocab;
	int64_t f = a->ffn ? a->ffn : llama_default_ffn(h);

	g.dtype = ptc_dtype_name(a->dtype);
	root = gen_root(&g, model, a->layers,
			ptc_dtype_name(a->has_moments_dtype ? a->moments_dtype : PTC_FLOAT32));
	gen_embedding(&g, v, h);
	gen_llama_attention(&g, h, a->heads, kv, h / a->heads);
	gen_swiglu(&g, "layers/{L}/mlp", h, f);
	t = gen_vector(&g, "final_layernorm/weight", h);
	gen_place(&g, t, "last");
	gen_output(&g, v, h, a->tied);
	return gen_finish(&g, root, model, err);
}

/* ------------------------------------------------------------------- moe */

/* Tensors of a moe schema once {L} is expanded: per layer 4 of attention,
 * the router, 2 per routed expert and 2 for the shared MLP; 3 outside. */
static int64_t moe_tensors(const struct ptc_gen_args *a)
{
	return 3 + (int64_t)a->layers * (5 + 2 * (int64_t)a->experts + 2 * !!a->shared_experts);
}

static int check_moe(const char *model, const struct ptc_gen_args *a, struct ptc_error *err)
{
	if (check_min(model, "--experts", a->experts, 1, err) ||
	    check_min(model, "--expert-ffn", a->expert_ffn, 0, err) ||
	    check_min(model, "--shared-experts", a->shared_experts, 0, err) ||
	    check_min(model, "--dense-layers", a->dense_layers, 0, err))
		return -EINVAL;
	/* A {L} template stands for the same tensor in every layer, and a
	 * tensor outside {L} belongs to no layer's stage: the first K layers
	 * cannot have an MLP of their own in this schema format. */
	if (a->dense_layers)
		return ptc_errorf(err,
				  "%s: \"--dense-layers\" = %d is not supported: every {L} tensor "
				  "is in every layer, so a schema cannot give the first layers a "
				  "dense MLP",
				  model, a->dense_layers);
	/* Refused here, before thousands of templates are built, rather than
	 * by the schema parser. */
	if (moe_tensors(a) > PTC_MAX_TENSORS)
		return ptc_errorf(err,
				  "%s: \"--layers\" = %d x \"--experts\" = %d expands to "
				  "%" PRId64 " tensors, more than the limit %d",
				  model, a->layers, a->experts, moe_tensors(a), PTC_MAX_TENSORS);
	return 0;
}

/* A layer's MLP: the router [E, H], replicated on every TP rank (it is
 * small and every rank routes every token), the shared MLP when @s > 0,
 * then each routed expert's SwiGLU of width @f. */
static void gen_moe_mlp(struct gen *g, int64_t h, int64_t f, int experts, int64_t s)
{
	char prefix[64];

	gen_matrix(g, "layers/{L}/mlp/router/weight", experts, h);
	if (s)
		gen_swiglu(g, "layers/{L}/mlp/shared_experts", h, s * f);
	for (int e = 0; e < experts && !g->failed; e++) {
		snprintf(prefix, sizeof(prefix), "layers/{L}/mlp/experts/%d", e);
		gen_swiglu(g, prefix, h, f);
	}
}

json_t *ptc_gen_moe(const struct ptc_gen_args *a, struct ptc_error *err)
{
	static const char model[] = "moe";
	struct gen g = {0};
	json_t *root, *t;
	int kv;

	if (check_common(model, a, err) || check_llama(model, a, &kv, err) ||
	    check_moe(model, a, err))
		return NULL;
	int64_t h = a->hidden, v = a->vocab;
	/* As Megatron-Core's moe_ffn_hidden_size: the dense width by default. */
	int64_t f = a->expert_ffn ? a->expert_ffn : a->ffn ? a->ffn : llama_default_ffn(h);

	g.dtype = ptc_dtype_name(a->dtype);
	root = gen_root(&g, model, a->layers,
			ptc_dtype_name(a->has_moments_dtype ? a->moments_dtype : PTC_FLOAT32));
	gen_embedding(&g, v, h);
	gen_llama_attention(&g, h, a->heads, kv, h / a->heads);
	gen_moe_mlp(&g, h, f, a->experts, a->shared_experts);
	t = gen_vector(&g, "final_layernorm/weight", h);
	gen_place(&g, t, "last");
	gen_output(&g, v, h, a->tied);
	return gen_finish(&g, root, model, err);
}
