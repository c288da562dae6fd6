/*
 * ptc_planjson.c - a plan as JSON (`mlfs plan`): its figures, in all and
 * per node, and its operations, each naming its nodes, state and tensors
 * (an op read from a backup marked "backup": true); the op kinds' names.
 */
#include <jansson.h>

#include "ptc/ptc.h"

const char *ptc_op_kind_name(enum ptc_op_kind k)
{
	static const char *const names[] = {"reuse", "copy", "fetch", "dup", "zero"};
	return k <= PTC_OP_ZERO ? names[k] : "?";
}

json_t *ptc_plan_op_to_json(const struct ptc_plan *p, size_t i, const struct ptc_layout *to)
{
	const struct ptc_schema *s = to->schema;
	const struct ptc_op *op = &p->ops[i];
	json_t *j = json_pack("{sssisssssssisIsIsI}", "op", ptc_op_kind_name(op->kind), "phase",
			      op->phase, "node", to->cluster->nodes[op->dst_node].id, "state",
			      s->states[op->state].name, "tensor", s->tensors[op->tensor].name,
			      "rank", op->dst_rank, "row", (json_int_t)op->dst_row, "rows",
			      (json_int_t)op->rows, "bytes", (json_int_t)op->bytes);
	if (j && op->src_rank >= 0) {
		json_object_set_new(j, "src_node",
				    json_string(to->cluster->nodes[op->src_node].id));
		json_object_set_new(j, "src_rank", json_integer(op->src_rank));
		json_object_set_new(j, "src_tensor", json_string(s->tensors[op->src_tensor].name));
		json_object_set_new(j, "src_row", json_integer(op->src_row));
	}
	if (j && op->backup)
		json_object_set_new(j, "backup", json_true());
	return j;
}

json_t *ptc_plan_to_json(const struct ptc_plan *p, const struct ptc_layout *from,
			 const struct ptc_layout *to, bool with_ops)
{
	json_t *o = json_object(), *nodes = json_object();

	json_object_set_new(o, "from_version", json_integer(from->config->version));
	json_object_set_new(o, "to_version", json_integer(to->config->version));
	json_object_set_new(o, "bytes_total", json_integer(p->bytes_total));
	json_object_set_new(o, "bytes_reused", json_integer(p->bytes_reused));
	json_object_set_new(o, "bytes_local", json_integer(p->bytes_local));
	json_object_set_new(o, "bytes_network", json_integer(p->bytes_network));
	json_object_set_new(o, "bytes_zero", json_integer(p->bytes_zero));
	json_object_set_new(o, "lower_bound_network", json_integer(p->lower_bound_network));
	json_object_set_new(o, "num_operations", json_integer((json_int_t)p->nops));
	for (int n = 0; n < p->nnodes; n++) {
		const struct ptc_node_stats *st = &p->per_node[n];
		json_object_set_new(
		    nodes, to->cluster->nodes[n].id,
		    json_pack("{sIsIsIsIsIsI}", "bytes_in", (json_int_t)st->bytes_in, "bytes_out",
			      (json_int_t)st->bytes_out, "bytes_local", (json_int_t)st->bytes_local,
			      "bytes_reused", (json_int_t)st->bytes_reused, "bytes_zero",
			      (json_int_t)st->bytes_zero, "bytes_total",
			      (json_int_t)st->bytes_total));
	}
	json_object_set_new(o, "per_node", nodes);
	if (!with_ops)
		return o;
	json_t *ops = json_array();
	for (size_t i = 0; i < p->nops; i++)
		json_array_append_new(ops, ptc_plan_op_to_json(p, i, to));
	json_object_set_new(o, "operations", ops);
	return o;
}
