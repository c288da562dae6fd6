/*
 * ptc_hfnames.c - name maps: checkpoints named otherwise (Hugging Face
 * Llama and GPT-2, or a mapping file) as pieces of the schema's tensors.
 *
 * DESIGN
 * A piece is one outside tensor. It fills runs of rows along dim 0 of one
 * schema tensor: a plain rename is one run of every row; Llama's q_proj,
 * k_proj and v_proj are the three chunks of the fused QKV ([A*d, G*d,
 * G*d] rows, the schema's declared "chunks"), gate_proj and up_proj the two
 * chunks of dense_h_to_4h; GPT-2's c_attn is Megatron's QKV interleaved
 * per head ([q_h, k_h, v_h] for each head h: the schema's "unit"), so it
 * is 3 runs per head. GPT-2 stores its Conv1D weights as [in, out]: such a
 * piece is transposed, its runs along the transposed tensor's rows. Rows
 * are copied as they are: no RoPE permutation is applied (the schema holds
 * what the training code reads).
 *
 * Every map, built in or parsed, is checked the same way: piece names are
 * unique, each piece's runs tile its own rows, and each untied schema
 * tensor's rows are covered once by its pieces. So an import that finds
 * every piece fills every row, and an export writes every row once.
 *
 * Pure: no I/O, no globals; any thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc.h"

/* Rows along dim 0 (a scalar is one row) and elements per row. */
static int64_t t_rows(const struct ptc_tensor *t)
{
	return t->ndim ? t->shape[0] : 1;
}

static int64_t t_row_elems(const struct ptc_tensor *t)
{
	int64_t e = 1;
	for (int d = 1; d < t->ndim; d++)
		e *= t->shape[d];
	return e;
}

static int64_t piece_rows(const struct ptc_hf_piece *p)
{
	int64_t r = 0;
	for (int i = 0; i < p->nruns; i++)
		r += p->runs[i].rows;
	return r;
}

void ptc_hf_map_release(struct ptc_hf_map *m)
{
	for (int i = 0; m->p && i < m->n; i++) {
		free(m->p[i].name);
		free(m->p[i].runs);
	}
	for (int i = 0; m->ignore && i < m->nignore; i++)
		free(m->ignore[i]);
	free(m->p);
	free(m->byname);
	free(m->ignore);
	*m = (struct ptc_hf_map){0};
}

/* Appends piece @name of schema tensor @ti with @nruns runs (copied); the
 * outside shape follows from the runs. 0 or -ENOMEM. */
static int add_piece(const struct ptc_schema *s, struct ptc_hf_map *m, const char *name, int ti,
		     bool transpose, const struct ptc_hf_run *runs, int nruns)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	struct ptc_hf_piece *np = realloc(m->p, (size_t)(m->n + 1) * sizeof(*np));
	if (!np)
		return -ENOMEM;
	m->p = np;
	struct ptc_hf_piece *p = &m->p[m->n];
	*p = (struct ptc_hf_piece){.tensor = ti, .transpose = transpose, .nruns = nruns};
	p->name = strdup(name);
	p->runs = malloc((size_t)(nruns ? nruns : 1) * sizeof(*runs));
	if (!p->name || !p->runs) {
		free(p->name);
		free(p->runs);
		return -ENOMEM;
	}
	memcpy(p->runs, runs, (size_t)nruns * sizeof(*runs));
	p->ndim = t->ndim;
	memcpy(p->shape, t->shape, sizeof(p->shape));
	if (t->ndim)
		p->shape[0] = piece_rows(p);
	if (transpose && t->ndim == 2) { /* stored [in, out] */
		p->shape[0] = t->shape[1];
		p->shape[1] = piece_rows(p);
	}
	m->n++;
	return 0;
}

static int add_whole(const struct ptc_schema *s, struct ptc_hf_map *m, const char *name, int ti,
		     bool transpose)
{
	struct ptc_hf_run r = {0, 0, t_rows(&s->tensors[ti])};
	return add_piece(s, m, name, ti, transpose, &r, 1);
}

/* ------------------------------------------------------------ checking */

static int cmp_run_dst(const void *a, const void *b)
{
	const struct ptc_hf_run *x = a, *y = b;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int cmp_run_src(const void *a, const void *b)
{
	const struct ptc_hf_run *x = a, *y = b;
	return x->src < y->src ? -1 : x->src > y->src;
}

/* Whether @runs, sorted by @cmp on the field at @off, tile [0, @total). */
static bool runs_tile(struct ptc_hf_run *runs, int n, int64_t total, bool by_dst)
{
	int64_t at = 0;
	qsort(runs, (size_t)n, sizeof(*runs), by_dst ? cmp_run_dst : cmp_run_src);
	for (int i = 0; i < n; i++) {
		int64_t b = by_dst ? runs[i].dst : runs[i].src;
		if (b != at || runs[i].rows < 1)
			return false;
		at += runs[i].rows;
	}
	return at == total;
}

/* Sorts the name index: insertion by binary search (qsort would need the
 * map in a global). */
static void sort_names(struct ptc_hf_map *m)
{
	for (int i = 0; i < m->n; i++) {
		int a = 0, b = i;
		while (a < b) {
			int mid = (a + b) / 2;
			if (strcmp(m->p[m->byname[mid]].name, m->p[i].name) <= 0)
				a = mid + 1;
			else
				b = mid;
		}
		memmove(m->byname + a + 1, m->byname + a, (size_t)(i - a) * sizeof(int));
		m->byname[a] = i;
	}
}

/* Checks @m against @s (see DESIGN) and builds its name index. */
static int map_check(const struct ptc_schema *s, struct ptc_hf_map *m, const char *what,
		     struct ptc_error *err)
{
	struct ptc_hf_run *all = NULL;
	int rc = 0;

	if (!(m->byname = malloc((size_t)(m->n ? m->n : 1) * sizeof(int))))
		return ptc_error_set(err, -ENOMEM, "out of memory");
	sort_names(m);
	for (int i = 1; i < m->n; i++)
		if (!strcmp(m->p[m->byname[i]].name, m->p[m->byname[i - 1]].name))
			return ptc_errorf(err, "%s: \"%s\" names two pieces", what,
					  m->p[m->byname[i]].name);
	for (int i = 0; i < m->n; i++) {
		struct ptc_hf_piece *p = &m->p[i];
		struct ptc_hf_run *r = malloc((size_t)p->nruns * sizeof(*r) + 1);
		if (!r)
			return ptc_error_set(err, -ENOMEM, "out of memory");
		memcpy(r, p->runs, (size_t)p->nruns * sizeof(*r));
		bool ok = runs_tile(r, p->nruns, piece_rows(p), false);
		free(r);
		if (!ok || (p->transpose && s->tensors[p->tensor].ndim != 2))
			return ptc_errorf(err, "%s: \"%s\": its rows are not one tiling%s", what,
					  p->name, ok ? " (transpose needs 2 dimensions)" : "");
	}
	/* Every untied tensor covered once: its pieces' runs tile its rows. */
	for (int ti = 0; ti < s->ntensors && !rc; ti++) {
		int n = 0;
		if (s->tensors[ti].tied >= 0)
			continue;
		for (int i = 0; i < m->n; i++)
			if (m->p[i].tensor == ti)
				for (int k = 0; k < m->p[i].nruns; k++) {
					void *np = realloc(all, (size_t)(n + 1) * sizeof(*all));
					if (!np) {
						free(all);
						return ptc_error_set(err, -ENOMEM, "out of memory");
					}
					all = np;
					all[n++] = m->p[i].runs[k];
				}
		if (!runs_tile(all, n, t_rows(&s->tensors[ti]), true))
			rc = ptc_errorf(err, "%s: the rows of \"%s\" are not covered once", what,
					s->tensors[ti].name);
	}
	free(all);
	return rc;
}

/* --------------------------------------------------------------- built in */

/* A schema name (after "layers/N/" when @layer) and its outside name
 * (after the layer's prefix when @layer). */
struct rule {
	const char *schema, *outside;
	bool layer, transpose;
	int split; /* 0 whole; 1 chunks (q/k/v or gate/up: outside has "%s"); 2 GPT-2 heads */
};

static const struct rule llama_rules[] = {
    {"embedding/word_embeddings/weight", "model.embed_tokens.weight", false, false, 0},
    {"final_layernorm/weight", "model.norm.weight", false, false, 0},
    {"output_layer/weight", "lm_head.weight", false, false, 0},
    {"input_layernorm/weight", "input_layernorm.weight", true, false, 0},
    {"self_attention/query_key_value/weight", "self_attn.%s_proj.weight", true, false, 1},
    {"self_attention/dense/weight", "self_attn.o_proj.weight", true, false, 0},
    {"post_attention_layernorm/weight", "post_attention_layernorm.weight", true, false, 0},
    {"mlp/dense_h_to_4h/weight", "mlp.%s_proj.weight", true, false, 1},
    {"mlp/dense_4h_to_h/weight", "mlp.down_proj.weight", true, false, 0},
    {NULL, NULL, false, false, 0},
};

static const struct rule gpt2_rules[] = {
    {"embedding/word_embeddings/weight", "transformer.wte.weight", false, false, 0},
    {"embedding/position_embeddings/weight", "transformer.wpe.weight", false, false, 0},
    {"final_layernorm/weight", "transformer.ln_f.weight", false, false, 0},
    {"final_layernorm/bias", "transformer.ln_f.bias", false, false, 0},
    {"output_layer/weight", "lm_head.weight", false, false, 0},
    {"input_layernorm/weight", "ln_1.weight", true, false, 0},
    {"input_layernorm/bias", "ln_1.bias", true, false, 0},
    {"self_attention/query_key_value/weight", "attn.c_attn.weight", true, true, 2},
    {"self_attention/query_key_value/bias", "attn.c_attn.bias", true, false, 2},
    {"self_attention/dense/weight", "attn.c_proj.weight", true, true, 0},
    {"self_attention/dense/bias", "attn.c_proj.bias", true, false, 0},
    {"post_attention_layernorm/weight", "ln_2.weight", true, false, 0},
    {"post_attention_layernorm/bias", "ln_2.bias", true, false, 0},
    {"mlp/dense_h_to_4h/weight", "mlp.c_fc.weight", true, true, 0},
    {"mlp/dense_h_to_4h/bias", "mlp.c_fc.bias", true, false, 0},
    {"mlp/dense_4h_to_h/weight", "mlp.c_proj.weight", true, true, 0},
    {"mlp/dense_4h_to_h/bias", "mlp.c_proj.bias", true, false, 0},
    {NULL, NULL, false, false, 0},
};

/* Llama's fused tensors: one piece per chunk, named by @parts. */
static int add_chunks(const struct ptc_schema *s, struct ptc_hf_map *m, const char *fmt, int ti,
		      const char *const *parts, int nparts, struct ptc_error *err)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	char name[512];
	int64_t at = 0;

	if (t->split_dim != 0 || t->nchunks != nparts)
		return ptc_errorf(err, "hf names: \"%s\" is not split in %d chunks along dim 0",
				  t->name, nparts);
	for (int c = 0; c < nparts; c++) {
		struct ptc_hf_run r = {0, at, t->chunks[c]};
		snprintf(name, sizeof(name), fmt, parts[c]);
		if (add_piece(s, m, name, ti, false, &r, 1))
			return ptc_error_set(err, -ENOMEM, "out of memory");
		at += t->chunks[c];
	}
	return 0;
}

/* GPT-2's c_attn: [q | k | v] of A heads of d rows each, as Megatron's
 * [q_h k_h v_h] per head (the schema's unit is a head's 3d rows). */
static int add_heads(const struct ptc_schema *s, struct ptc_hf_map *m, const char *name, int ti,
		     bool transpose, struct ptc_error *err)
{
	const struct ptc_tensor *t = &s->tensors[ti];
	int64_t rows = t_rows(t), d = t->unit / 3, heads = d ? rows / (3 * d) : 0;

	if (t->unit < 3 || t->unit % 3 || heads * 3 * d != rows)
		return ptc_errorf(err,
				  "hf names: \"%s\": GPT-2 has as many key/value heads as query "
				  "heads; this schema's groups are not (unit %" PRId64 ")",
				  t->name, t->unit);
	struct ptc_hf_run *r = malloc((size_t)(3 * heads) * sizeof(*r));
	if (!r)
		return ptc_error_set(err, -ENOMEM, "out of memory");
	for (int64_t h = 0; h < heads; h++)
		for (int k = 0; k < 3; k++) /* q, k, v */
			r[3 * h + k] =
			    (struct ptc_hf_run){k * heads * d + h * d, h * 3 * d + k * d, d};
	int rc = add_piece(s, m, name, ti, transpose, r, (int)(3 * heads));
	free(r);
	return rc ? ptc_error_set(err, rc, "out of memory") : 0;
}

/* The pieces of schema tensor @ti under @rules (@layer_fmt names a layer's
 * prefix), or -EINVAL when no rule names it. */
static int add_rule(const struct ptc_schema *s, struct ptc_hf_map *m, const struct rule *rules,
		    const char *layer_fmt, bool llama, int ti, struct ptc_error *err)
{
	static const char *const qkv[] = {"q", "k", "v"}, *const gu[] = {"gate", "up"};
	const char *name = s->tensors[ti].name, *rest = name;
	char out[512], prefix[64] = "";
	int layer, used = 0;

	if (sscanf(name, "layers/%d/%n", &layer, &used) == 1 && used > 0) {
		snprintf(prefix, sizeof(prefix), layer_fmt, layer);
		rest = name + used;
	}
	for (const struct rule *r = rules; r->schema; r++) {
		if (strcmp(rest, r->schema) || r->layer != (rest != name))
			continue;
		snprintf(out, sizeof(out), "%s%s", prefix, r->outside);
		if (r->split == 1)
			return add_chunks(s, m, out, ti, strstr(r->outside, "self_attn") ? qkv : gu,
					  strstr(r->outside, "self_attn") ? 3 : 2, err);
		if (r->split == 2)
			return add_heads(s, m, out, ti, r->transpose, err);
		if (add_whole(s, m, out, ti, r->transpose))
			return ptc_error_set(err, -ENOMEM, "out of memory");
		return 0;
	}
	return ptc_errorf(err, "hf names: schema tensor \"%s\" has no %s name", name,
			  llama ? "Llama" : "GPT-2");
}

static int add_ignore(struct ptc_hf_map *m, const char *name)
{
	char **ni = realloc(m->ignore, (size_t)(m->nignore + 1) * sizeof(*ni));
	if (!ni)
		return -ENOMEM;
	m->ignore = ni;
	if (!(m->ignore[m->nignore] = strdup(name)))
		return -ENOMEM;
	m->nignore++;
	return 0;
}

/* The built-in Hugging Face map of a "llama" or "megatron-gpt" schema. */
static int build_hf(const struct ptc_schema *s, struct ptc_hf_map *m, struct ptc_error *err)
{
	bool llama = s->model && !strcmp(s->model, "llama");
	bool gpt = s->model && !strcmp(s->model, "megatron-gpt");
	int rc = 0;

	if (!llama && !gpt)
		return ptc_errorf(err,
				  "hf names: model \"%s\" has no built-in map (llama and "
				  "megatron-gpt do); give a mapping file",
				  s->model ? s->model : "");
	for (int ti = 0; ti < s->ntensors && !rc; ti++)
		if (s->tensors[ti].tied < 0)
			rc = add_rule(s, m, llama ? llama_rules : gpt2_rules,
				      llama ? "model.layers.%d." : "transformer.h.%d.", llama, ti,
				      err);
	for (int l = 0; gpt && l < s->num_layers && !rc; l++) {
		char name[96];
		snprintf(name, sizeof(name), "transformer.h.%d.attn.bias", l);
		rc = add_ignore(m, name);
		snprintf(name, sizeof(name), "transformer.h.%d.attn.masked_bias", l);
		rc = rc ? rc : add_ignore(m, name);
		if (rc)
			ptc_error_set(err, rc, "out of memory");
	}
	if (gpt)
		m->prefix = "transformer.";
	return rc;
}

int ptc_hf_map_build(const struct ptc_schema *s, const char *names, struct ptc_hf_map *m,
		     struct ptc_error *err)
{
	int rc = 0;

	*m = (struct ptc_hf_map){0};
	if (!strcmp(names, "schema")) {
		for (int ti = 0; ti < s->ntensors && !rc; ti++)
			if (s->tensors[ti].tied < 0 &&
			    add_whole(s, m, s->tensors[ti].name, ti, false))
				rc = ptc_error_set(err, -ENOMEM, "out of memory");
	} else if (!strcmp(names, "hf")) {
		rc = build_hf(s, m, err);
	} else {
		rc = ptc_errorf(err, "names \"%s\": expected \"schema\" or \"hf\"", names);
	}
	if (!rc)
		rc = map_check(s, m, "hf names", err);
	if (rc)
		ptc_hf_map_release(m);
	return rc;
}

/* ------------------------------------------------------------ map files */

/* The runs of entry @e of schema tensor @ti into *@runs: 0 or -EINVAL. */
static int entry_runs(const struct ptc_tensor *t, json_t *e, struct ptc_hf_run **runs, int *n)
{
	json_t *jr = json_object_get(e, "runs"), *jw = json_object_get(e, "rows");
	size_t k = jr ? json_array_size(jr) : 1;

	if ((jr && !json_is_array(jr)) || k == 0 || k > (1u << 20) || (jr && jw))
		return -EINVAL;
	if (!(*runs = calloc(k, sizeof(**runs))))
		return -ENOMEM;
	*n = (int)k;
	if (!jr && !jw) {
		(*runs)[0] = (struct ptc_hf_run){0, 0, t_rows(t)};
		return 0;
	}
	for (size_t i = 0; i < k; i++) {
		json_t *a = jr ? json_array_get(jr, i) : jw;
		size_t w = jr ? 3 : 2;
		int64_t v[3];
		if (!json_is_array(a) || json_array_size(a) != w)
			return -EINVAL;
		for (size_t j = 0; j < w; j++) {
			json_t *x = json_array_get(a, j);
			if (!json_is_integer(x) || json_integer_value(x) < 0 ||
			    json_integer_value(x) > t_rows(t))
				return -EINVAL;
			v[j] = json_integer_value(x);
		}
		(*runs)[i] = jr ? (struct ptc_hf_run){v[0], v[1], v[2]}
				: (struct ptc_hf_run){0, v[0], v[1] - v[0]};
		if ((*runs)[i].rows < 1 || (*runs)[i].dst + (*runs)[i].rows > t_rows(t))
			return -EINVAL;
	}
	return 0;
}

/* One entry of "tensors": outside name @k, value @v. */
static int parse_entry(const struct ptc_schema *s, struct ptc_hf_map *m, const char *file,
		       const char *k, json_t *v, bool *named, struct ptc_error *err)
{
	const char *to =
	    json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "to"));
	json_t *jt = json_is_object(v) ? json_object_get(v, "transpose") : NULL;
	struct ptc_hf_run *runs = NULL;
	int ti = to ? ptc_schema_find(s, to) : -1, n = 0, rc;

	if (!to || (jt && !json_is_boolean(jt)))
		return ptc_errorf(err, "%s: \"%s\": expected a schema name or {\"to\", ...}", file,
				  k);
	if (ti < 0 || s->tensors[ti].tied >= 0)
		return ptc_errorf(err, "%s: \"%s\": \"%s\" is not an untied tensor of the schema",
				  file, k, to);
	rc = json_is_object(v) ? entry_runs(&s->tensors[ti], v, &runs, &n)
			       : entry_runs(&s->tensors[ti], json_null(), &runs, &n);
	if (rc == 0)
		rc = add_piece(s, m, k, ti, jt && json_is_true(jt), runs, n);
	free(runs);
	if (rc == -ENOMEM)
		return ptc_error_set(err, rc, "out of memory");
	if (rc)
		return ptc_errorf(err,
				  "%s: \"%s\": \"rows\" [a, b] or \"runs\" [[src, dst, rows]] "
				  "outside \"%s\"",
				  file, k, to);
	named[ti] = true;
	return 0;
}

int ptc_hf_map_parse(const struct ptc_schema *s, const char *text, size_t len, const char *file,
		     struct ptc_hf_map *m, struct ptc_error *err)
{
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je), *v;
	bool *named = calloc((size_t)s->ntensors + 1, sizeof(bool));
	const char *k;
	int rc = 0;

	*m = (struct ptc_hf_map){0};
	json_t *jt = json_object_get(root, "tensors"), *ji = json_object_get(root, "ignore");
	if (!named)
		rc = ptc_error_set(err, -ENOMEM, "out of memory");
	else if (!root)
		rc = ptc_errorf(err, "%s: %s (line %d)", file, je.text, je.line);
	else if (!json_is_object(jt) || (ji && !json_is_array(ji)))
		rc = ptc_errorf(err, "%s: expected {\"tensors\": {...}, \"ignore\": [...]}", file);
	json_object_foreach(rc ? NULL : jt, k, v)
	{
		if ((rc = parse_entry(s, m, file, k, v, named, err)))
			break;
	}
	for (size_t i = 0; !rc && ji && i < json_array_size(ji); i++)
		if (!json_is_string(json_array_get(ji, i)) ||
		    add_ignore(m, json_string_value(json_array_get(ji, i))))
			rc = ptc_errorf(err, "%s: \"ignore\"[%zu] is not a name", file, i);
	for (int ti = 0; !rc && ti < s->ntensors; ti++)
		if (s->tensors[ti].tied < 0 && !named[ti] &&
		    add_whole(s, m, s->tensors[ti].name, ti, false))
			rc = ptc_error_set(err, -ENOMEM, "out of memory");
	if (!rc)
		rc = map_check(s, m, file, err);
	if (rc)
		ptc_hf_map_release(m);
	json_decref(root);
	free(named);
	return rc;
}

json_t *ptc_hf_map_to_json(const struct ptc_schema *s, const struct ptc_hf_map *m)
{
	json_t *root = json_object(), *tensors = json_object(), *ign = json_array();

	json_object_set_new(root, "tensors", tensors);
	json_object_set_new(root, "ignore", ign);
	for (int i = 0; i < m->n; i++) {
		const struct ptc_hf_piece *p = &m->p[i];
		json_t *runs = json_array();
		for (int k = 0; k < p->nruns; k++)
			json_array_append_new(runs,
					      json_pack("[I, I, I]", (json_int_t)p->runs[k].src,
							(json_int_t)p->runs[k].dst,
							(json_int_t)p->runs[k].rows));
		json_object_set_new(tensors, p->name,
				    json_pack("{s:s, s:o, s:b}", "to", s->tensors[p->tensor].name,
					      "runs", runs, "transpose", p->transpose));
	}
	for (int i = 0; i < m->nignore; i++)
		json_array_append_new(ign, json_string(m->ignore[i]));
	if (json_object_size(tensors) != (size_t)m->n ||
	    json_array_size(ign) != (size_t)m->nignore) {
		json_decref(root);
		return NULL;
	}
	return root;
}

/* ----------------------------------------------------------------- lookups */

static int find_exact(const struct ptc_hf_map *m, const char *name)
{
	int a = 0, b = m->n;
	while (a < b) {
		int mid = (a + b) / 2, c = strcmp(m->p[m->byname[mid]].name, name);
		if (c == 0)
			return m->byname[mid];
		if (c < 0)
			a = mid + 1;
		else
			b = mid;
	}
	return -1;
}

int ptc_hf_map_find(const struct ptc_hf_map *m, const char *name)
{
	char full[1024];
	int i = find_exact(m, name);

	if (i >= 0 || !m->prefix || !strncmp(name, m->prefix, strlen(m->prefix)))
		return i;
	if ((size_t)snprintf(full, sizeof(full), "%s%s", m->prefix, name) >= sizeof(full))
		return -1;
	return find_exact(m, full);
}

bool ptc_hf_map_ignored(const struct ptc_hf_map *m, const char *name)
{
	size_t pl = m->prefix ? strlen(m->prefix) : 0;
	for (int i = 0; i < m->nignore; i++)
		if (!strcmp(m->ignore[i], name) || (pl && !strncmp(m->ignore[i], m->prefix, pl) &&
						    !strcmp(m->ignore[i] + pl, name)))
			return true;
	return false;
}

/* -------------------------------------------------------------- copying */

int64_t ptc_hf_piece_bytes(const struct ptc_hf_piece *p, size_t esize)
{
	int64_t e = (int64_t)esize;
	for (int d = 0; d < p->ndim; d++)
		e *= p->shape[d];
	return e;
}

/* Copies between the piece's bytes @out (outside layout) and the schema
 * tensor's @full, in the direction @to_full. */
static void piece_copy(const struct ptc_schema *s, const struct ptc_hf_piece *p, size_t es,
		       uint8_t *out, uint8_t *full, bool to_full)
{
	const struct ptc_tensor *t = &s->tensors[p->tensor];
	int64_t re = t_row_elems(t), total = piece_rows(p);

	for (int k = 0; k < p->nruns; k++) {
		const struct ptc_hf_run *r = &p->runs[k];
		if (!p->transpose) {
			uint8_t *a = out + (size_t)(r->src * re) * es;
			uint8_t *b = full + (size_t)(r->dst * re) * es;
			size_t n = (size_t)(r->rows * re) * es;
			memcpy(to_full ? b : a, to_full ? a : b, n);
			continue;
		}
		/* outside [re, total] holds schema rows as its columns */
		for (int64_t i = 0; i < re; i++)
			for (int64_t j = 0; j < r->rows; j++) {
				uint8_t *a = out + (size_t)(i * total + r->src + j) * es;
				uint8_t *b = full + (size_t)((r->dst + j) * re + i) * es;
				memcpy(to_full ? b : a, to_full ? a : b, es);
			}
	}
}

void ptc_hf_scatter(const struct ptc_schema *s, const struct ptc_hf_piece *p, size_t esize,
		    const uint8_t *src, uint8_t *full)
{
	piece_copy(s, p, esize, (uint8_t *)src, full, true);
}

void ptc_hf_gather(const struct ptc_schema *s, const struct ptc_hf_piece *p, size_t esize,
		   const uint8_t *full, uint8_t *dst)
{
	piece_copy(s, p, esize, dst, (uint8_t *)full, false);
}
