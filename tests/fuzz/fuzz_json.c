/*
 * fuzz_json.c - fuzzes the schema, config, cluster and dataset index parsers,
 * the layout, and the reader of a peer's vote (POST /v1/vote).
 *
 * The whole input goes to each of the five parsers; a vote that parses has
 * every field within its bounds and reads back the same from the body
 * mlfs_vote_body makes of it; a parsed index has its
 * shard ids and ptc_index_locate checked. An input made of three
 * parts separated by lines "---" (schema, config, cluster) also has each
 * part parsed as its file and, when all three parse, is placed with
 * ptc_layout_init; then slices, stages and the config's JSON round trip are
 * checked against their invariants (abort() on a violation).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_i.h"
#include "ptc/ptc.h"
#include "tests/fuzz/fuzz.h"

/* A vote that parses is within its bounds and survives its own body. */
static void check_vote(const char *text, size_t size)
{
	struct mlfs_vote_msg m, m2;
	struct ptc_error err;
	json_t *doc, *doc2;

	int rc = mlfs_vote_parse(text, size, &doc, &m, &err);
	CHECK(rc == 0 || (rc == -EINVAL && err.text[0] != '\0'));
	if (rc == 0) {
		size_t n = strlen(m.attempt);
		CHECK(m.to >= 1 && n >= 1 && n <= 23 && m.node[0] != '\0');
		CHECK(strlen(m.vote) <= MLFS_VOTE_MAX);
		CHECK(strcmp(m.vote, "ready") == 0 || strncmp(m.vote, "failed: ", 8) == 0);
		char *body = mlfs_vote_body(m.node, m.to, m.attempt, m.vote);
		if (body) {
			CHECK(mlfs_vote_parse(body, strlen(body), &doc2, &m2, &err) == 0);
			CHECK(strcmp(m.node, m2.node) == 0 && m.to == m2.to &&
			      strcmp(m.attempt, m2.attempt) == 0 && strcmp(m.vote, m2.vote) == 0);
			json_decref(doc2);
			free(body);
		}
	}
	json_decref(doc);
}

/* A failed parse must leave *out NULL and say why. */
static void check_failed(int rc, const void *out, const struct ptc_error *err)
{
	if (rc == 0)
		return;
	CHECK(rc == -EINVAL || rc == -ENOMEM);
	CHECK(out == NULL);
	CHECK(rc == -ENOMEM || err->text[0] != '\0');
	CHECK(memchr(err->text, '\0', sizeof(err->text)) != NULL);
}

/* Parsing the config's own JSON gives the same config. */
static void check_config_round_trip(const struct ptc_config *c)
{
	json_t *j = ptc_config_to_json(c);
	struct ptc_config *d = NULL;
	struct ptc_error err;

	if (!j)
		return;
	if (ptc_config_parse(j, "config.json", &d, &err) == 0) {
		CHECK(d->version == c->version && d->tp == c->tp && d->pp == c->pp &&
		      d->dp == c->dp && d->replicas == c->replicas && d->nnodes == c->nnodes);
		for (int i = 0; i < c->nnodes; i++)
			CHECK(strcmp(d->nodes[i], c->nodes[i]) == 0);
		CHECK(d->has_dataset == c->has_dataset);
		if (c->has_dataset)
			CHECK(strcmp(d->dataset_index, c->dataset_index) == 0 &&
			      d->dataset_seed == c->dataset_seed &&
			      d->dataset_global_batch == c->dataset_global_batch &&
			      d->dataset_shuffle == c->dataset_shuffle &&
			      d->dataset_epochs == c->dataset_epochs);
		CHECK(!d->snap_dir == !c->snap_dir);
		if (c->snap_dir)
			CHECK(strcmp(d->snap_dir, c->snap_dir) == 0 &&
			      d->snap_every == c->snap_every && d->snap_keep == c->snap_keep &&
			      d->snap_threads == c->snap_threads &&
			      d->snap_max_mib_s == c->snap_max_mib_s &&
			      d->snap_level == c->snap_level);
		ptc_config_free(d);
	} else {
		CHECK(!"ptc_config_to_json output does not parse");
	}
	json_decref(j);
}

/* The TP slices of tensor @t cover its rows exactly once, in order. */
static void check_slices(const struct ptc_tensor *t, int tp)
{
	int64_t n = t->split_dim >= 0 ? t->shape[t->split_dim] : 1, logical = 0, next = 0;
	int64_t rows0 = -1;

	for (int r = 0; r < tp; r++) {
		struct ptc_slice s;
		int64_t local = 0, shape[PTC_MAX_DIMS];

		ptc_slice_compute(t, tp, r, &s);
		CHECK(s.nsegs >= 0 && s.nsegs <= PTC_MAX_SEGS);
		for (int i = 0; i < s.nsegs; i++) {
			const struct ptc_seg *g = &s.segs[i];
			CHECK(g->local == local && g->len > 0);
			local += g->len;
			if (g->global < 0)
				continue;
			CHECK(g->global + g->len <= n);
			logical += g->len;
			/* Unchunked tensors are cut into consecutive ranges. */
			if (t->split_dim >= 0 && t->nchunks == 1) {
				CHECK(g->global == next);
				next += g->len;
			}
		}
		CHECK(local == s.rows);
		if (t->pad_multiple) {
			if (rows0 < 0)
				rows0 = s.rows;
			CHECK(s.rows == rows0);
		}
		CHECK(ptc_partition_shape(t, tp, r, shape) == t->ndim);
		CHECK(ptc_partition_elems(t, tp, r) >= 0);
	}
	if (t->split_dim < 0)
		CHECK(logical == tp);
	else
		CHECK(logical == n);
}

static void check_layout(const struct ptc_layout *l)
{
	const struct ptc_schema *s = l->schema;
	int64_t budget = 1 << 16;

	CHECK(l->world == l->tp * l->pp * l->dp);
	for (int r = 0; r < l->world; r++) {
		const struct ptc_rank *rk = &l->ranks[r];
		CHECK(ptc_layout_rank(l, rk->t, rk->d, rk->p) == r);
		CHECK(rk->node >= 0 && rk->node < l->cluster->nnodes);
		CHECK(rk->device >= 0 && rk->device < l->cluster->nodes[rk->node].devices);
		CHECK(r >= l->node_first_rank[rk->node] &&
		      r < l->node_first_rank[rk->node] + l->node_nranks[rk->node]);
		CHECK(rk->layer_begin <= rk->layer_end);
		CHECK(r == 0 || rk->layer_begin == l->ranks[r - 1].layer_begin ||
		      rk->layer_begin == l->ranks[r - 1].layer_end);
	}
	/* Every non-tied tensor is on some stage; bound the work on huge inputs. */
	for (int t = 0; t < s->ntensors && budget > 0; t++) {
		int stages = 0;
		for (int p = 0; p < l->pp && p < 64; p++)
			stages += ptc_layout_stage_holds(l, p, t);
		CHECK(stages > 0 || s->tensors[t].tied >= 0 || l->pp > 64);
		budget -= l->pp < 64 ? l->pp : 64;
		if (l->tp <= 1024) {
			check_slices(&s->tensors[t], l->tp);
			budget -= l->tp;
		}
	}
}

/* Shards number their records back to back; locate finds each id's shard. */
static void check_index(const struct ptc_index *ix)
{
	int64_t total = 0;

	CHECK(ix->nshards > 0 && ix->total > 0);
	CHECK(ix->records == PTC_RECORDS_VARIABLE || ix->record_bytes > 0);
	for (int i = 0; i < ix->nshards; i++) {
		const struct ptc_shard *sh = &ix->shards[i];
		CHECK(sh->uri && sh->uri[0]);
		CHECK((ix->records == PTC_RECORDS_VARIABLE) == (sh->offsets != NULL));
		CHECK(sh->first == total && sh->count >= 0);
		total += sh->count;
	}
	CHECK(total == ix->total);
	/* The first and last ids and a few between, with the shards' edges. */
	for (int64_t k = 0; k <= 64; k++) {
		int64_t id = k == 64 ? ix->total - 1 : ix->total / 64 * k, local = -1;
		int s = ptc_index_locate(ix, id, &local);
		CHECK(s >= 0 && s < ix->nshards && ix->shards[s].count > 0);
		CHECK(local >= 0 && local < ix->shards[s].count);
		CHECK(ix->shards[s].first + local == id);
	}
}

/* Splits @text at lines "---" into at most @max parts; returns the count. */
static int split_parts(const char *text, size_t len, const char **parts, size_t *lens, int max)
{
	int n = 0;
	size_t start = 0;

	for (size_t i = 0; i + 4 <= len && n < max - 1; i++) {
		if (memcmp(text + i, "\n---", 4) == 0 && (i + 4 == len || text[i + 4] == '\n')) {
			parts[n] = text + start;
			lens[n++] = i - start;
			start = i + 4;
			i += 3;
		}
	}
	parts[n] = text + start;
	lens[n++] = len - start;
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data, *parts[3];
	struct ptc_schema *s = NULL;
	struct ptc_config *c = NULL;
	struct ptc_cluster *cl = NULL;
	struct ptc_index *ix = NULL;
	struct ptc_error err;
	size_t lens[3];
	int rc;

	rc = ptc_schema_parse_text(text, size, "schema.json", &s, &err);
	check_failed(rc, s, &err);
	ptc_schema_free(s);
	rc = ptc_config_parse_text(text, size, "config.json", &c, &err);
	check_failed(rc, c, &err);
	if (c)
		check_config_round_trip(c);
	ptc_config_free(c);
	rc = ptc_cluster_parse_text(text, size, "cluster.json", &cl, &err);
	check_failed(rc, cl, &err);
	ptc_cluster_free(cl);
	rc = ptc_index_parse_text(text, size, "index.json", &ix, &err);
	check_failed(rc, ix, &err);
	if (ix)
		check_index(ix);
	ptc_index_free(ix);
	check_vote(text, size);

	if (split_parts(text, size, parts, lens, 3) != 3)
		return 0;
	s = NULL;
	c = NULL;
	cl = NULL;
	if (ptc_schema_parse_text(parts[0], lens[0], "schema.json", &s, &err) == 0 &&
	    ptc_config_parse_text(parts[1], lens[1], "config.json", &c, &err) == 0 &&
	    ptc_cluster_parse_text(parts[2], lens[2], "cluster.json", &cl, &err) == 0) {
		struct ptc_layout l;
		rc = ptc_layout_init(&l, s, c, cl, "config.json", &err);
		if (rc == 0)
			check_layout(&l);
		else
			CHECK(rc == -ENOMEM || (rc == -EINVAL && err.text[0]));
		ptc_layout_release(&l);
	}
	ptc_cluster_free(cl);
	ptc_config_free(c);
	ptc_schema_free(s);
	return 0;
}
