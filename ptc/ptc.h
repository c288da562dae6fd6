/*
 * ptc.h - parallelizable tensor collections: schema, config, layout, plan.
 *
 * ptc is the pure core of mlfs. It reads schema.json, config.json and
 * cluster.json, computes where every partition of every tensor lives under a
 * parallel layout (Megatron rank order, pipeline stages, tensor-parallel
 * slices with padding and fused chunks), and computes the plan that turns
 * one layout into another with the least data movement.
 *
 * It does no I/O, starts no threads and keeps no globals: every function is
 * safe to call from any thread on distinct objects, and on the same object
 * from several threads when the object is only read.
 *
 * Errors: functions return 0 or a negative errno. Parse and validation
 * errors also fill a caller-owned struct ptc_error with one line naming the
 * file, the field and the reason, e.g.
 *   schema.json: tensors[3].split.dim = 2 is out of range for shape [64, 64]
 * and its code with the errno returned. struct ptc_error is every module's
 * error detail, not only ptc's (ptc_error_set).
 */
#ifndef MLFS_PTC_H
#define MLFS_PTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define PTC_MAX_DIMS 8

/*
 * Limits on what a schema and a config describe (docs/single-node.md, "Limits"). The
 * daemon's metadata (names, trees, the partition table) grows with them; it
 * is counted against --max-memory (store/mlfs_memsize.c), and each is also
 * bounded here and refused at parse with a message naming the field and the
 * limit. Paths stay within
 * the kernel's NAME_MAX and, with a mount point of up to 1000 bytes, its
 * PATH_MAX.
 */
#define PTC_MAX_LAYERS	   65536     /* "num_layers" */
#define PTC_MAX_TENSORS	   131072    /* tensors after {L} expansion */
#define PTC_MAX_STATES	   64	     /* states of a schema */
#define PTC_MAX_FILES	   (1 << 20) /* states x tensors: the files of full/ */
#define PTC_MAX_NAME	   255	     /* bytes of a path component, ".npy" included */
#define PTC_MAX_PATH	   3072	     /* bytes of "<state>/<tensor>.npy" */
#define PTC_MAX_PARTITIONS (1 << 24) /* one node's ranks x states x tensors */
/* ranks x states x tensors of the world, for a plan of the whole job (ptc_plan_compute,
 * ptc_plan_compute_backups; `mlfs plan` without --node): a plan per node has no such limit */
#define PTC_MAX_JOB_PARTITIONS (1 << 26)
/* The size of one dimension of a tensor (a schema's, a .npy file's), and
 * the elements of a schema's tensor: at most this. */
#define PTC_MAX_DIM_SIZE ((int64_t)1 << 40)

/* Largest dataset record (fixed or variable), in bytes. */
#define PTC_MAX_RECORD_BYTES ((int64_t)1 << 30)
#define PTC_ERROR_MAX	     512

/*
 * The one error detail of mlfs: a caller-owned message and the negative
 * errno returned with it. text is "" and code 0 when there is no error; a
 * function that returns rc < 0 and writes text sets code to rc. text comes
 * first so that `struct ptc_error e = {.text = ""}` (or `{0}`) clears both.
 */
struct ptc_error {
	char text[PTC_ERROR_MAX]; /* one line, always NUL-terminated, truncated to fit */
	int code;		  /* the negative errno returned with text; 0: none */
};

/* ---------------------------------------------------------------- dtypes */

enum ptc_dtype {
	PTC_FLOAT64,
	PTC_FLOAT32,
	PTC_FLOAT16,
	PTC_BFLOAT16,
	PTC_INT64,
	PTC_INT32,
	PTC_INT16,
	PTC_INT8,
	PTC_UINT8,
	PTC_BOOL,
	PTC_FLOAT8_E4M3FN,
	PTC_FLOAT8_E5M2,
	PTC_DTYPE_COUNT
};

/* Bytes per element of @dt. */
size_t ptc_dtype_size(enum ptc_dtype dt);
/* Schema name of @dt ("bfloat16"). */
const char *ptc_dtype_name(enum ptc_dtype dt);
/* NumPy descr used in .npy headers ("<f4"; bfloat16 is "<u2", fp8 "|u1"). */
const char *ptc_dtype_npy_descr(enum ptc_dtype dt);
/* Parses a schema dtype name. Returns 0, or -EINVAL for an unknown name. */
int ptc_dtype_parse(const char *name, enum ptc_dtype *out);

/* ---------------------------------------------------------------- schema */

enum ptc_place {
	PTC_PLACE_LAYER, /* a {L} tensor: the stage holding its layer */
	PTC_PLACE_FIRST, /* stage 0 */
	PTC_PLACE_LAST,	 /* stage pp-1 */
	PTC_PLACE_ALL,	 /* every stage */
};

/* One tensor of the schema, with {L} already expanded. */
struct ptc_tensor {
	char *name; /* expanded name, e.g. "layers/3/attn/qkv/weight" */
	enum ptc_dtype dtype;
	int ndim;
	int64_t shape[PTC_MAX_DIMS];
	int split_dim;	      /* -1 when replicated on every TP rank */
	int nchunks;	      /* >= 1 when split */
	int64_t *chunks;      /* nchunks sizes along split_dim, summing to shape[split_dim] */
	int64_t pad_multiple; /* 0 when unpadded */
	int64_t unit;	      /* rows kept on one TP rank (a head's), 1 by default */
	enum ptc_place place;
	int layer;  /* for PTC_PLACE_LAYER, else -1 */
	int tied;   /* index of the tensor this one copies, or -1 */
	int source; /* index in the schema file's "tensors" array */
};

/* One state root ("model", "optim/exp_avg"); every state holds every tensor. */
struct ptc_state {
	char *name;
	int has_dtype; /* when set, dtype overrides every tensor's dtype */
	enum ptc_dtype dtype;
};

struct ptc_schema {
	char *model;
	int num_layers;
	int nstates;
	struct ptc_state *states;
	int ntensors;
	struct ptc_tensor *tensors; /* template order, layers expanded in order */
	/* Indexes built by ptc_schema_parse, so that the planner finds a tie
	 * group or the tensors of a stage in the size of the answer: */
	int *tie_first; /* per tensor: the first tensor tied to it, or -1 */
	int *tie_next;	/* per tensor: the next tensor tied to the same one, or -1 */
	int *by_layer;	/* ntensors indices: {L} tensors by layer, then the others */
	int *layer_off; /* num_layers + 1 offsets into by_layer: layer l's tensors are
			 * [layer_off[l], layer_off[l + 1]); the rest are not {L} */
};

/*
 * Parses and validates a schema. @name is the file name used in messages.
 * On success returns 0 and *out owns a new schema (ptc_schema_free).
 * On error returns -EINVAL (-ENOMEM) and fills @err; a schema past one of
 * the PTC_MAX_* limits is refused before the tensors are expanded.
 */
int ptc_schema_parse(const json_t *root, const char *name, struct ptc_schema **out,
		     struct ptc_error *err);
/* Same from text of @len bytes; JSON syntax errors name line and column. */
int ptc_schema_parse_text(const char *text, size_t len, const char *name, struct ptc_schema **out,
			  struct ptc_error *err);
void ptc_schema_free(struct ptc_schema *s);
/* Index of the tensor named @name, or -1. */
int ptc_schema_find(const struct ptc_schema *s, const char *name);
/* Index of the state named @name, or -1. */
int ptc_schema_find_state(const struct ptc_schema *s, const char *name);
/* The dtype tensor @t has in state @st. */
enum ptc_dtype ptc_schema_dtype(const struct ptc_schema *s, int st, int t);
/* The tensor whose data tensor @t holds: its tie target, or itself. */
static inline int ptc_schema_logical(const struct ptc_schema *s, int t)
{
	return s->tensors[t].tied >= 0 ? s->tensors[t].tied : t;
}

/* Schema generators for common models. Return a new JSON object or NULL
 * with @err filled when the arguments are invalid. */
struct ptc_gen_args {
	int layers, hidden, heads, kv_heads, vocab, ffn, seq;
	bool tied;
	enum ptc_dtype dtype;
	bool has_moments_dtype;	      /* else the Adam moments are float32 */
	enum ptc_dtype moments_dtype; /* of the optim/exp_avg{,_sq} states */
	/* moe only (0 elsewhere): routed experts, their SwiGLU width (0: ffn),
	 * shared experts (one MLP of shared_experts x expert_ffn), dense layers */
	int experts, expert_ffn, shared_experts, dense_layers;
};
json_t *ptc_gen_megatron_gpt(const struct ptc_gen_args *a, struct ptc_error *err);
json_t *ptc_gen_llama(const struct ptc_gen_args *a, struct ptc_error *err);
/* llama with each layer's MLP replaced by a router and per-expert tensors. */
json_t *ptc_gen_moe(const struct ptc_gen_args *a, struct ptc_error *err);

/* --------------------------------------------------------- cluster/config */

struct ptc_node {
	char *id;
	char *addr; /* "host:port", may be NULL */
	int devices;
};

/* The most etcd members a cluster.json's "etcd" may list. */
#define PTC_ETCD_MAX 16

struct ptc_cluster {
	int nnodes;
	struct ptc_node *nodes;
	char *token_file; /* may be NULL */
	char *job;	  /* the job's name, may be NULL (one node) */
	char *etcd;	  /* the control plane: etcd members' client URLs, comma-separated
			     (at most PTC_ETCD_MAX); NULL: one node */
};

int ptc_cluster_parse(const json_t *root, const char *name, struct ptc_cluster **out,
		      struct ptc_error *err);
int ptc_cluster_parse_text(const char *text, size_t len, const char *name, struct ptc_cluster **out,
			   struct ptc_error *err);
/* A cluster of @nnodes nodes named @ids with @devices devices each. */
struct ptc_cluster *ptc_cluster_new_uniform(int nnodes, char *const *ids, int devices);
void ptc_cluster_free(struct ptc_cluster *c);
/* Index of node @id, or -1. */
int ptc_cluster_find(const struct ptc_cluster *c, const char *id);
/* 0 when @to extends @from: the same job, control plane and token file, and
 * @from's nodes first, in the same order, unchanged (@to may add nodes);
 * else -EINVAL with @err naming the difference. */
int ptc_cluster_extends(const struct ptc_cluster *from, const struct ptc_cluster *to,
			struct ptc_error *err);

struct ptc_config {
	int64_t version;
	int tp, pp, dp;
	int nnodes;
	char **nodes;
	int replicas;
	bool has_dataset;
	char *dataset_index;
	uint64_t dataset_seed;
	int64_t dataset_global_batch;
	bool dataset_shuffle;	/* default true */
	int64_t dataset_epochs; /* 0: no limit */
	/* "snapshot": periodic snapshots of every snap_every-th saved step into
	 * snap_dir/step-<N>, the snap_keep newest kept; NULL snap_dir: none. */
	char *snap_dir;
	int64_t snap_every, snap_max_mib_s; /* 0: no bandwidth bound */
	int snap_keep, snap_threads, snap_level;
	/* "elastic": the job's controller chooses the layout for the live
	 * nodes, never fewer than elastic_min nor more than elastic_max; its
	 * DP degree divides the global batch into micro-batches of
	 * elastic_micro_batch samples (default 1). */
	bool elastic;
	int elastic_min, elastic_max;
	int64_t elastic_micro_batch;
};

/* Parses config syntax and ranges; fitting it to a cluster and schema is
 * ptc_layout_init's job. Same error conventions as ptc_schema_parse. */
int ptc_config_parse(const json_t *root, const char *name, struct ptc_config **out,
		     struct ptc_error *err);
int ptc_config_parse_text(const char *text, size_t len, const char *name, struct ptc_config **out,
			  struct ptc_error *err);
void ptc_config_free(struct ptc_config *c);
/* Serializes @c back to JSON (new reference). */
json_t *ptc_config_to_json(const struct ptc_config *c);

/* --------------------------------------------------------------- dataset */

enum ptc_records { PTC_RECORDS_FIXED, PTC_RECORDS_VARIABLE };

struct ptc_shard {
	char *uri;     /* as written: absolute, or relative to the index */
	char *offsets; /* variable records: URI of count + 1 int64 byte offsets */
	int64_t count; /* records */
	int64_t first; /* global id of its first record */
};

/* index.json (docs/dataset.md). */
struct ptc_index {
	enum ptc_records records;
	enum ptc_dtype dtype; /* fixed: the record's; variable: informational */
	int ndim;
	int64_t shape[PTC_MAX_DIMS];
	int64_t record_bytes; /* fixed records */
	int nshards;
	struct ptc_shard *shards;
	int64_t total; /* records */
};

int ptc_index_parse(const json_t *root, const char *name, struct ptc_index **out,
		    struct ptc_error *err);
int ptc_index_parse_text(const char *text, size_t len, const char *name, struct ptc_index **out,
			 struct ptc_error *err);
void ptc_index_free(struct ptc_index *ix);
/* The shard holding global record @id (0 <= id < total); *local its index there. */
int ptc_index_locate(const struct ptc_index *ix, int64_t id, int64_t *local);

/* Record id at position @i of epoch @epoch: a permutation of [0, n) seeded
 * by (seed, epoch), or the identity when !shuffle. O(1) memory. */
int64_t ptc_data_perm(uint64_t seed, int64_t epoch, int64_t n, int64_t i, bool shuffle);

/* The cursor: from segs[k].step on, step s consumes samples
 * [sample + (s - step) * batch, + batch) of the stream, cut into dp slices. */
struct ptc_cursor_seg {
	int64_t step, sample, batch;
	int dp; /* the data parallelism the segment's steps ran with */
};
struct ptc_cursor {
	int nsegs;
	struct ptc_cursor_seg *segs; /* by step; malloc'd */
};

/* Samples consumed before @step and the batch of @step; -ENODATA before the
 * first segment or on overflow. */
int ptc_cursor_samples(const struct ptc_cursor *c, int64_t step, int64_t *samples, int64_t *batch);
/* The data parallelism of @step (its segment's), or 0 when it has none. */
int ptc_cursor_dp(const struct ptc_cursor *c, int64_t step);
/* The stream samples of DP rank @d of @dp at @step: the balanced contiguous
 * slice d of the step's batch (the first batch % dp slices one sample
 * larger). With @limit > 0 (the samples of the whole run) a step whose batch
 * starts at or past @limit has none, and the batch that crosses it is cut
 * there. -EINVAL for a bad @dp or @d, -ENODATA for an unreachable step. */
int ptc_data_slice(const struct ptc_cursor *c, int64_t step, int dp, int d, int64_t limit,
		   int64_t *first, int64_t *count);
/* From @step on, steps consume @batch samples cut into @dp slices (a
 * reconfiguration saved at @step). Segments after @step are dropped.
 * 0, -ERANGE (bad step, batch or dp), -ENOMEM. */
int ptc_cursor_advance(struct ptc_cursor *c, int64_t step, int64_t batch, int dp);
/* Whether config @b may follow @a: only global_batch may change. */
int ptc_dataset_change_ok(const struct ptc_config *a, const struct ptc_config *b, const char *name,
			  struct ptc_error *err);

/* ---------------------------------------------------------------- layout */

struct ptc_rank {
	int t, d, p;		    /* Megatron coordinates */
	int node;		    /* index in the cluster */
	int device;		    /* device index on that node */
	int layer_begin, layer_end; /* [begin, end) schema layers of stage p */
};

/* A layout: schema + config placed on a cluster. Borrows all three. */
struct ptc_layout {
	const struct ptc_schema *schema;
	const struct ptc_config *config;
	const struct ptc_cluster *cluster;
	int tp, pp, dp, world;
	struct ptc_rank *ranks; /* world entries */
	int *node_first_rank;	/* per cluster node: first rank, or -1 */
	int *node_nranks;	/* per cluster node: ranks hosted (consecutive) */
	const char *name;	/* file name for messages */
};

/*
 * Places @config on @cluster for @schema. Fails with -EINVAL and @err when
 * the layout does not fit (unknown node, too few devices, more stages than
 * layers, a TP degree larger than a chunk it must split, padding past 2^40
 * elements, a node hosting more than PTC_MAX_PARTITIONS ranks x states x
 * tensors: the limit is per node, not on the world).
 * Repeated nodes are refused by ptc_config_parse. @name is the config's
 * file name for messages. Release with ptc_layout_release.
 */
int ptc_layout_init(struct ptc_layout *l, const struct ptc_schema *schema,
		    const struct ptc_config *config, const struct ptc_cluster *cluster,
		    const char *name, struct ptc_error *err);
void ptc_layout_release(struct ptc_layout *l);

/* Rank of coordinates (t, d, p). */
static inline int ptc_layout_rank(const struct ptc_layout *l, int t, int d, int p)
{
	return p * l->tp * l->dp + d * l->tp + t;
}

/*
 * The cluster node index that keeps the backup of cluster node @node's saved
 * state under l->config: with "replicas": 1, node config.nodes[i]'s backup
 * is held by config.nodes[(i + 1) % nnodes] (DESIGN.md section 7). -1 when
 * the config keeps no backups (replicas 0), has one node (nothing to back
 * up to), or does not name @node.
 */
int ptc_layout_backup_holder(const struct ptc_layout *l, int node);

/*
 * A rank of cluster node @node whose partitions no other copy in memory
 * holds: no DP replica (same TP slice, same stage) on another node that is
 * @up, and no backup holder that is @up (with "replicas"). The lowest such
 * rank, or -1 when every rank of @node has a copy elsewhere (or @node has
 * none). @up: per cluster node; @node's own entry is ignored. Used by
 * `mlfs umount` to warn before the only copy of a step goes.
 */
int ptc_layout_sole_rank(const struct ptc_layout *l, int node, const bool *up);

/* Whether pipeline stage @p holds tensor @t. */
bool ptc_layout_stage_holds(const struct ptc_layout *l, int p, int t);
/* Whether rank @r holds tensor @t. */
bool ptc_layout_holds(const struct ptc_layout *l, int r, int t);

/*
 * A partition's geometry along the tensor's split dimension: a list of
 * segments in local order. A logical segment holds global rows
 * [global, global + len); a padding segment (global = -1) holds zeros.
 * Replicated tensors are one logical segment of one "row" covering all.
 */
#define PTC_MAX_SEGS 64
struct ptc_seg {
	int64_t local, global, len;
};
struct ptc_slice {
	int nsegs;
	int64_t rows; /* local size along the split dim */
	struct ptc_seg segs[PTC_MAX_SEGS];
};

/* Slice of tensor @t for TP rank @tpr of @tp. */
void ptc_slice_compute(const struct ptc_tensor *t, int tp, int tpr, struct ptc_slice *out);
/* Row geometry: the partition is outer blocks of rows x row_elems elements. */
void ptc_tensor_geometry(const struct ptc_tensor *t, int64_t *outer, int64_t *row_elems);
/* Shape of the partition of tensor @t held by TP rank @tpr of @tp; returns ndim. */
int ptc_partition_shape(const struct ptc_tensor *t, int tp, int tpr, int64_t *shape);
/* Element count of the logical (unpadded, unsplit) tensor. */
int64_t ptc_tensor_elems(const struct ptc_tensor *t);
/* Element count of that partition. */
int64_t ptc_partition_elems(const struct ptc_tensor *t, int tp, int tpr);

/* ------------------------------------------------------------------ plan */

enum ptc_op_kind {
	PTC_OP_REUSE, /* the whole partition equals old partition src: share it */
	PTC_OP_COPY,  /* copy rows from an old partition on the same node */
	PTC_OP_FETCH, /* fetch rows from an old partition on another node */
	PTC_OP_DUP,   /* copy rows from a new partition of this node (after phase 0) */
	PTC_OP_ZERO,  /* zero-fill padding rows */
};

/*
 * One operation. Rows are along the tensor's split dimension (for a
 * replicated tensor, row 0 is the whole tensor); a row range is "outer"
 * strided blocks of row_elems elements (ptc_tensor_geometry).
 * Phase 0 ops read only the old layout; phase 1 (DUP) ops read new
 * partitions filled in phase 0.
 */
struct ptc_op {
	uint8_t kind;
	uint8_t phase;
	uint16_t state;
	int32_t tensor;	    /* destination tensor */
	int32_t dst_rank;   /* new layout rank */
	int32_t dst_node;   /* cluster node index */
	int32_t src_rank;   /* old rank (REUSE, COPY, FETCH), new rank (DUP), -1 (ZERO) */
	int32_t src_node;   /* cluster node of the source, -1 for ZERO */
	int32_t src_tensor; /* source tensor (differs from tensor across a tie) */
	uint8_t backup;	    /* FETCH only: src_node is down; its backup holder serves the
			     * rows of old rank src_rank (ptc_plan_compute_backups) */
	int64_t dst_row, src_row, rows;
	int64_t bytes;
};

struct ptc_node_stats {
	int64_t bytes_in;     /* fetched by this node */
	int64_t bytes_out;    /* served by this node to others */
	int64_t bytes_local;  /* copied in memory on this node (COPY + DUP) */
	int64_t bytes_reused; /* partitions shared without copying */
	int64_t bytes_zero;   /* padding zero-filled */
	int64_t bytes_total;  /* new-layout bytes hosted on this node */
};

struct ptc_plan {
	size_t nops;
	struct ptc_op *ops;    /* sorted by dst_node, phase, dst_rank, state, tensor, dst_row */
	int nnodes;	       /* cluster nodes */
	size_t *node_first_op; /* nnodes + 1 offsets into ops, per dst_node */
	struct ptc_node_stats *per_node;
	int64_t bytes_total, bytes_reused, bytes_local, bytes_network, bytes_zero;
	int64_t lower_bound_network; /* missing logical bytes per node, summed */
};

/*
 * Computes the plan from layout @from to layout @to (same schema and
 * cluster). @down lists cluster node indices (ndown entries) that cannot
 * serve: they are never sources and must not host ranks of @to.
 * Deterministic: the same inputs give the same plan on every node.
 * Returns 0 and *out (ptc_plan_free), -EINVAL with @err naming the
 * tensors that have no surviving copy or the down node that @to uses,
 * -E2BIG when either layout has more than PTC_MAX_JOB_PARTITIONS ranks x
 * states x tensors (plan per node instead: ptc_plan_compute_node), or
 * -ENOMEM.
 */
int ptc_plan_compute(const struct ptc_layout *from, const struct ptc_layout *to, const int *down,
		     int ndown, struct ptc_plan **out, struct ptc_error *err);
/*
 * ptc_plan_compute, also reading the backups of down nodes. @backup_of is
 * NULL (no backups: exactly ptc_plan_compute) or has one entry per node of
 * to->cluster: the node holding a valid backup of that node's ranks of
 * @from, or -1 (@from's nodes come first, see ptc_cluster_extends; later
 * entries are -1). Rows that no surviving node holds are FETCHed from a down
 * node whose backup holder is up: the op names the down node and its old
 * rank as the source, with backup = 1; the holder serves them, also when it
 * is the destination, and per_node counts them as the holder's bytes_out.
 * Backups are never REUSEd or COPYed, and never read while a live replica
 * exists. Returns as ptc_plan_compute; also -EINVAL when an entry is out of
 * range. The caller owns @backup_of; the plan does not keep it.
 */
int ptc_plan_compute_backups(const struct ptc_layout *from, const struct ptc_layout *to,
			     const int *down, int ndown, const int *backup_of,
			     struct ptc_plan **out, struct ptc_error *err);
/*
 * The plan of cluster node @node alone (index in to->cluster), from the
 * same inputs as ptc_plan_compute_backups, in time and memory that follow
 * the node's own partitions (and the sources and destinations of each), not
 * the job's: the ops node @node executes, exactly those of the whole job's
 * plan but for the source of each FETCH, and the figures of what it serves.
 * A FETCH reads from the candidate a rule picks that every node evaluates
 * alone (round robin by destination node, rotated by a hash of the tensor,
 * state and old TP rank), not from the least loaded one: the network bytes
 * stay the lower bound; the load spreads over the holders but is not the
 * greedy balance of the whole job's plan. Small partitions (an old TP
 * rank's, all states together, at most ptc_plan_small_bytes) are not
 * rotated: a node takes all of them from one replica, where the executor
 * fetches them in batches, a request each (xf_execute).
 * per_node[@node] is exact: what it builds (bytes_total, _reused, _local,
 * _in, _zero) and in bytes_out what it serves to every node, itself
 * included when it keeps a backup it reads, as the other nodes' plans ask.
 * For every other node x only per_node[x].bytes_out is set: the bytes node
 * @node fetches from x (as x's server, for a backup). The plan's totals are
 * @node's (bytes_network = its bytes_in = lower_bound_network); nops and
 * node_first_op cover @node's ops only. Fails as ptc_plan_compute_backups
 * does, but only for rows @node needs; -EINVAL also for a bad @node.
 */
/* Bytes up to which ptc_plan_compute_node does not rotate the source: 64
 * KiB, where asking costs more than sending. The tests set it to check
 * the rotation's balance over small random schemas; nothing else writes it. */
#define PTC_PLAN_SMALL ((int64_t)64 << 10)
extern int64_t ptc_plan_small_bytes;
int ptc_plan_compute_node(const struct ptc_layout *from, const struct ptc_layout *to,
			  const int *down, int ndown, const int *backup_of, int node,
			  struct ptc_plan **out, struct ptc_error *err);
void ptc_plan_free(struct ptc_plan *p);
const char *ptc_op_kind_name(enum ptc_op_kind k);
/* The plan as JSON: figures, per_node and (when @with_ops) operations; an
 * op read from a backup has "backup": true. */
json_t *ptc_plan_to_json(const struct ptc_plan *p, const struct ptc_layout *from,
			 const struct ptc_layout *to, bool with_ops);
/* Operation @i of @p as one object of ptc_plan_to_json's "operations" (a
 * new reference): for writing a large plan one operation at a time. */
json_t *ptc_plan_op_to_json(const struct ptc_plan *p, size_t i, const struct ptc_layout *to);

/*
 * Formats the message @fmt (printf-style, truncated to PTC_ERROR_MAX - 1
 * bytes) into @err->text and sets @err->code to @code; returns @code, for
 * `return ptc_error_set(err, -EIO, ...)`. @err may be NULL (nothing is
 * written; @code is still returned). Pure; any thread, on distinct @err.
 */
int ptc_error_set(struct ptc_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/*
 * ptc_error_set with @code -EINVAL, the error of a refused schema, config
 * or argument: formats into @err (NULL: nothing written), sets @err->code
 * to -EINVAL and returns -EINVAL, for `return ptc_errorf(...)`. Pure; any
 * thread, on distinct @err.
 */
int ptc_errorf(struct ptc_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------- suggest */
/* BEGIN ptc_suggest (ptc/ptc_suggest.c): `mlfs suggest`, the layouts worth
 * running on a set of nodes, by an analytic cost model (docs/cli.md,
 * "mlfs suggest"). Pure, like the rest of ptc. */

/* The devices and links the cost model assumes: a profile JSON file with
 * these keys, each optional (defaults in ptc_suggest_profile_default). */
struct ptc_suggest_profile {
	double flops_per_device;	    /* peak FLOP/s of a device: 100e12 */
	double mfu;			    /* model FLOPs utilization, (0, 1]: 0.4 */
	double memory_per_device_bytes;	    /* 80 GiB */
	double intra_node_bw;		    /* bytes/s between devices of a node: 200e9 */
	double inter_node_bw;		    /* bytes/s of a node's network: 25e9 */
	double latency_s;		    /* per message of a collective: 1e-5 */
	double mean_time_between_changes_s; /* amortizes a reconfiguration: 3600 */
	/* Seconds per layer and micro-batch (forward and backward) on a device, the same
	 * for every tp: a framework's cost per operator, which a split does not shrink: 0 */
	double layer_overhead_s;
	double p2p_latency_s; /* per pipeline message (activation or its gradient): 0 */
	/* CPU cores that all the job's ranks share (nodes on one machine): with more
	 * ranks than cores, a rank idle in the bubble gives its core to others: 0, none */
	double shared_cores;
	bool tp_across_nodes; /* may a TP group span nodes: false */
};

void ptc_suggest_profile_default(struct ptc_suggest_profile *p);
/* Parses a profile object over the defaults; unknown keys, non-numbers and
 * values out of range are -EINVAL with @err naming @name and the key. */
int ptc_suggest_profile_parse(const json_t *root, const char *name, struct ptc_suggest_profile *out,
			      struct ptc_error *err);
int ptc_suggest_profile_parse_text(const char *text, size_t len, const char *name,
				   struct ptc_suggest_profile *out, struct ptc_error *err);
json_t *ptc_suggest_profile_to_json(const struct ptc_suggest_profile *p);

/* The training step; 0 means the default. */
struct ptc_suggest_params {
	int64_t global_batch;  /* samples per step: @from's dataset.global_batch, else 512 */
	int64_t micro_batch;   /* samples per micro-batch: 1 */
	int64_t seq;	       /* tokens per sample: 2048 */
	int64_t hidden;	       /* inferred: the most common dimension of layer 0's tensors */
	int64_t heads;	       /* inferred: hidden / the "unit" of a layer 0 split, else 1 */
	const char *from_name; /* @from's file name in messages; NULL: "--from" */
};

/* Why a layout was dropped; each dropped layout counts under its first. */
enum ptc_suggest_drop {
	PTC_SUGGEST_DROP_SCHEMA,   /* ptc_layout_init refused it (tp, pp vs the schema) */
	PTC_SUGGEST_DROP_BATCH,	   /* dp does not divide the batch into micro-batches */
	PTC_SUGGEST_DROP_TP_NODES, /* a TP group spans nodes, and the profile forbids it */
	PTC_SUGGEST_DROP_MEMORY,   /* a device's memory is too small */
	PTC_SUGGEST_DROP_PLAN,	   /* no plan from @from (too large a job to plan whole) */
	PTC_SUGGEST_DROP_COUNT
};
/* "schema", "batch", "tp_across_nodes", "memory", "plan". */
const char *ptc_suggest_drop_name(enum ptc_suggest_drop d);

/* One layout that fits, with its predicted step (seconds) and its parts:
 * step_s = compute_s + overhead_s + tp_comm_s + pp_comm_s + bubble_s + dp_comm_s
 * + reconf_s. */
struct ptc_suggestion {
	int tp, pp, dp;
	double step_s, compute_s, overhead_s, tp_comm_s, pp_comm_s, bubble_s, dp_comm_s;
	double reconf_s;	/* the reconfiguration's time, amortized per step */
	double reconf_total_s;	/* the reconfiguration's time, once */
	double bubble_fraction; /* (pp - 1) / (m + pp - 1) */
	int64_t micro_batches;	/* m: per step per DP replica */
	/* the fullest device: states (every schema state) + gradients + activations */
	int64_t memory_bytes, state_bytes, grad_bytes, act_bytes;
	int64_t reconf_bytes; /* the plan's network bytes from @from; 0 without */
	bool tp_across_nodes, dp_across_nodes;
	bool current; /* the layout of @from, on the same nodes in the same order */
};

struct ptc_suggest_result {
	const struct ptc_schema *schema; /* borrowed from the call */
	const struct ptc_cluster *cluster;
	const struct ptc_config *from;	    /* NULL without */
	struct ptc_suggest_profile profile; /* as used */
	struct ptc_suggest_params params;   /* with the defaults and inferences filled */
	bool hidden_inferred, heads_inferred;
	int nnodes, *nodes;   /* the chosen cluster node indices, in order */
	int devices;	      /* their devices: tp * pp * dp of every candidate */
	int64_t params_count; /* the model's parameters (tied tensors once) */
	int ncandidates, nfit;
	struct ptc_suggestion *fit; /* nfit layouts, fastest first */
	int ndropped[PTC_SUGGEST_DROP_COUNT];
	char first_reason[PTC_SUGGEST_DROP_COUNT][PTC_ERROR_MAX]; /* "tp8 pp1 dp1: ..." */
};

/*
 * Every (tp, pp, dp) with tp * pp * dp = the devices of cluster nodes @nodes
 * (@nnodes indices into @cluster, in config order; NULL: every node), placed
 * as ptc_layout_init places it, checked, and those that fit ranked by the
 * cost model of docs/cli.md. @from (may be NULL) is the current config,
 * valid on @cluster: each candidate then pays its plan's network bytes.
 * Returns 0 with *@out filled (release with ptc_suggest_result_release;
 * nfit may be 0), or -EINVAL with @err naming the flag, the file or the
 * profile key of a bad input, or -ENOMEM.
 */
int ptc_suggest(const struct ptc_schema *schema, const struct ptc_cluster *cluster,
		const int *nodes, int nnodes, const struct ptc_config *from,
		const struct ptc_suggest_params *params, const struct ptc_suggest_profile *profile,
		struct ptc_suggest_result *out, struct ptc_error *err);
void ptc_suggest_result_release(struct ptc_suggest_result *r);
/* The config of suggestion @i: @from's with tp, pp, dp and nodes replaced and
 * the next version (1 without @from). A new reference. */
json_t *ptc_suggest_config_to_json(const struct ptc_suggest_result *r, int i);
/* The result as JSON, the @top fastest suggestions (all when @top <= 0). */
json_t *ptc_suggest_to_json(const struct ptc_suggest_result *r, int top);
/* END ptc_suggest */

/* ------------------------------------------------------------ safetensors */

/*
 * The safetensors format (ptc_safetensors.c): a u64 little-endian N, N
 * bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
 * "__metadata__": {str: str}}, then the data buffer; offsets are relative
 * to the buffer, each tensor contiguous, little-endian, C order. Pure: no
 * I/O; any thread. docs/formats.md has the rules mlfs writes by.
 */
#define PTC_ST_MAX_HEADER  ((uint64_t)100 << 20) /* bytes of JSON, as the reference reader */
#define PTC_ST_MAX_TENSORS (1 << 20)		 /* entries of one header */
#define PTC_ST_SHARD_MAX   ((int64_t)4 << 30)	 /* data bytes of one shard of full/ */

/* The safetensors name of @dt ("BF16", "F32", "F8_E4M3"). */
const char *ptc_st_dtype_name(enum ptc_dtype dt);
/* Parses a safetensors dtype name: 0, or -EINVAL for one mlfs has not. */
int ptc_st_dtype_parse(const char *name, enum ptc_dtype *out);

/* One tensor of a header. */
struct ptc_st_tensor {
	char *name; /* parsed: owned by the header; formatted: the caller's */
	enum ptc_dtype dtype;
	int ndim;
	int64_t shape[PTC_MAX_DIMS];
	int64_t begin, end; /* bytes of the data buffer */
};

/* A parsed header: its tensors in data order. */
struct ptc_st_header {
	int n;
	struct ptc_st_tensor *t;
	int64_t data_start; /* 8 + N: where the buffer starts in the file */
	int64_t data_len;   /* the buffer's bytes: the file's rest */
};

/*
 * Parses the header of a safetensors file of @file_size bytes from @buf,
 * its first @len bytes. When @len < 8 + N, returns -EAGAIN with *@need =
 * 8 + N (N already checked against @file_size and PTC_ST_MAX_HEADER).
 * Checks everything: N, the JSON (an object, no duplicate key), each entry
 * (exactly dtype, shape, data_offsets; a known dtype; at most PTC_MAX_DIMS
 * dimensions below PTC_MAX_DIM_SIZE; end - begin = the shape's bytes), and
 * the buffer (offsets in it, no overlap, no hole, nothing after the last
 * tensor). 0 with *@out filled (ptc_st_header_release), or -EINVAL with
 * @err naming the tensor and the cause, -ENOMEM.
 */
int ptc_st_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct ptc_st_header *out,
		 size_t *need, struct ptc_error *err);
void ptc_st_header_release(struct ptc_st_header *h);

/*
 * The header of a file holding tensors @t[0..n) back to back in that
 * order (each one's begin and end are set here): the u64 length, then
 * {"__metadata__":{"format":"pt"},name:{"dtype","shape","data_offsets"},...}
 * in compact JSON, padded with spaces to a multiple of 8 bytes. A new
 * buffer (the caller frees it) of *@len bytes, or NULL on ENOMEM.
 */
uint8_t *ptc_st_format(struct ptc_st_tensor *t, int n, size_t *len);

/* Groups @n tensors of @bytes each, in order, into shards of at most @max
 * bytes (a larger tensor alone): shard[i] for each; returns the count. */
int ptc_st_shards(const int64_t *bytes, int n, int64_t max, int *shard);

/* The name of shard @k of @n of @base: "<base>.safetensors" when @n is 1,
 * else "<base>-%05d-of-%05d.safetensors". snprintf's return. */
int ptc_st_shard_name(const char *base, int k, int n, char *buf, size_t cap);

/* The tensors of state @state of @s as the full/ view holds them: every
 * untied tensor in schema order, its schema name, dtype and shape, into
 * @out (s->ntensors entries; names borrowed from @s), their schema
 * indexes into @idx (may be NULL). Returns the count. */
int ptc_st_state_tensors(const struct ptc_schema *s, int state, struct ptc_st_tensor *out,
			 int *idx);

/* ------------------------------------------------------------ name maps */

/*
 * Name maps (ptc_hfnames.c): the tensors of a checkpoint named otherwise
 * (Hugging Face's Llama and GPT-2 names, or a mapping file's) as pieces of
 * the schema's tensors. A piece is one outside tensor: its name, the shape
 * it has outside, whether it is stored transposed ([in, out], GPT-2's
 * Conv1D), and runs of rows along dim 0 (of the transposed tensor when
 * so) that are rows of the schema tensor's dim 0: fused QKV and gate/up
 * tensors are several pieces. Pure; any thread.
 */
struct ptc_hf_run {
	int64_t src, dst, rows; /* outside rows [src, +rows) = schema rows [dst, +rows) */
};

struct ptc_hf_piece {
	char *name;
	int tensor; /* schema index (untied) */
	bool transpose;
	int ndim;
	int64_t shape[PTC_MAX_DIMS]; /* as stored outside */
	int nruns;
	struct ptc_hf_run *runs;
};

struct ptc_hf_map {
	int n;
	struct ptc_hf_piece *p; /* by schema tensor, then row */
	int *byname;		/* n indexes into p, sorted by name */
	int nignore;
	char **ignore;	    /* outside names skipped on import (GPT-2's attention masks) */
	const char *prefix; /* names may come without it (GPT-2's "transformer."), or NULL */
};

/*
 * Builds the map of @s named @names: "schema" (every untied tensor as
 * itself), or "hf": Hugging Face names, for a schema of model "llama"
 * (model.layers.N.self_attn.q_proj.weight, ...: q/k/v fused into the
 * QKV's chunks, gate/up into dense_h_to_4h's) or "megatron-gpt" (GPT-2:
 * transformer.h.N.attn.c_attn.weight, transposed, its q/k/v columns
 * interleaved per head into Megatron's QKV). 0, or -EINVAL with @err
 * (another model, heads that do not fit), -ENOMEM.
 */
int ptc_hf_map_build(const struct ptc_schema *s, const char *names, struct ptc_hf_map *m,
		     struct ptc_error *err);
/*
 * Builds the map of @s from a mapping file's text (@file names it in
 * messages): {"tensors": {outside: schema-name | {"to", "rows": [a, b] |
 * "runs": [[src, dst, rows], ...], "transpose"}}, "ignore": [...]};
 * schema tensors no entry names map to themselves. Every schema tensor
 * must be covered once, row for row. 0, -EINVAL with @err, -ENOMEM.
 */
int ptc_hf_map_parse(const struct ptc_schema *s, const char *text, size_t len, const char *file,
		     struct ptc_hf_map *m, struct ptc_error *err);
/* The map as a mapping file (runs written out): a new reference, or NULL. */
json_t *ptc_hf_map_to_json(const struct ptc_schema *s, const struct ptc_hf_map *m);
/* The piece named @name (or @name after the map's optional prefix), or -1. */
int ptc_hf_map_find(const struct ptc_hf_map *m, const char *name);
/* Whether the map skips outside tensor @name. */
bool ptc_hf_map_ignored(const struct ptc_hf_map *m, const char *name);
void ptc_hf_map_release(struct ptc_hf_map *m);
/* Copies piece @p's outside bytes @src into the schema tensor's bytes
 * @full (@esize bytes per element), row runs and transpose applied. */
void ptc_hf_scatter(const struct ptc_schema *s, const struct ptc_hf_piece *p, size_t esize,
		    const uint8_t *src, uint8_t *full);
/* The reverse: piece @p's outside bytes into @dst from the schema tensor's @full. */
void ptc_hf_gather(const struct ptc_schema *s, const struct ptc_hf_piece *p, size_t esize,
		   const uint8_t *full, uint8_t *dst);
/* Bytes of piece @p outside (@esize per element). */
int64_t ptc_hf_piece_bytes(const struct ptc_hf_piece *p, size_t esize);

#endif
