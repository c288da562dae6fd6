#!/usr/bin/python3
"""A Megatron-style GPT trained with tensor, pipeline and data parallelism,
all of its state and data read from an mlfs mount and saved back to it.

One process per rank (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), CPU and gloo. Each process:

  1. reads ranks/<RANK>/rank.json (its TP, PP and DP coordinates, its layers),
     config.json (the degrees, the global batch), schema.json (the shapes)
     and job/train.json (hyper-parameters that the schema does not hold);
  2. reads ranks/<RANK>/step: the number of steps trained, so the next step;
  3. loads its partitions of the three states: model, optim/exp_avg,
     optim/exp_avg_sq (each the rank's slice of the tensors of its stage);
  4. trains --steps steps on its DP slice of each global batch, read from
     ranks/<RANK>/data/<s>-<e>.npy (a window of steps);
  5. saves: every partition of every state, then ranks/<RANK>/step.

That is all a script needs to be elastic: it never asks which layout the
state was written in. Between two runs, a driver may write a config.json
with another tp/pp/dp (examples/elastic_train.py); the next run's rank.json,
partitions and data views are already those of the new layout, the moments
and the data cursor carried over.

The model is a Llama-flavoured GPT as Megatron builds it (schema from
`mlfs schema llama --tied`): a vocab-parallel embedding, pre-norm blocks of
RMSNorm, attention with rotary embeddings and grouped-query heads from one
fused QKV column-parallel linear (the schema's chunks [q, k, v]), a
row-parallel output projection, a SwiGLU MLP whose fused gate/up
column-parallel linear is the schema's chunks 2, a row-parallel down
projection, a final RMSNorm, and an output layer tied to the embedding (on
the last stage a copy, `output_layer/weight`, when pp > 1, whose gradient is
summed with the embedding's as Megatron's embedding group does). The
cross-entropy is vocab-parallel; logits of the padded vocab rows are masked,
so the padding (which depends on tp) changes neither the loss nor the
trained rows. Pipeline stages exchange activations and gradients for every
micro-batch (all forwards, then all backwards, as GPipe); data-parallel
ranks all-reduce their gradients; Adam's moments are the mount's optim/ states.

Output: one line per event, "@mlfs " and a JSON object, for the driver:
{"kind": "loss", "step", "loss"} from the last stage, {"kind": "ids", "step",
"d", "ids", "tokens_sum"} from the first rank of each DP group, {"kind": "time", ...}
from rank 0 (start-up, load, train and save seconds, and "step_s": each step's seconds
on rank 0, from the end of the previous step).
"""
import time

T_PROCESS = time.monotonic()  # before PyTorch is imported: the start-up cost is reported

import argparse  # noqa: E402
import json
import math
import os
import sys
import urllib.parse

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))  # the mlfs package, not installed
import mlfs  # noqa: E402
import mlfs.elastic  # noqa: E402

STATES = ("model", "optim/exp_avg", "optim/exp_avg_sq")


def emit(**kw):
    print("@mlfs " + json.dumps(kw), flush=True)


# --- process groups ------------------------------------------------------------------------

class Groups:
    """Megatron's process groups for one rank. Rank r = p*tp*dp + d*tp + t (TP fastest, the
    order of mlfs and of Megatron). Every process creates every group, in the same order."""

    def __init__(self, me):
        tp, pp, dp = me.tp, me.pp, me.dp

        def rank_of(t, p, d):
            return p * tp * dp + d * tp + t

        assert rank_of(me.t, me.p, me.d) == me.rank, "rank.json disagrees with the rank order"
        self.tp = self.dp = self.embedding = None  # None: a group of one, nothing to do
        for p in range(pp):
            for d in range(dp):
                g = dist.new_group([rank_of(t, p, d) for t in range(tp)]) if tp > 1 else None
                if (p, d) == (me.p, me.d):
                    self.tp = g
        for p in range(pp):
            for t in range(tp):
                g = dist.new_group([rank_of(t, p, d) for d in range(dp)]) if dp > 1 else None
                if (p, t) == (me.p, me.t):
                    self.dp = g
        if pp > 1:  # the first and last stage's copies of the tied embedding
            for d in range(dp):
                for t in range(tp):
                    g = dist.new_group([rank_of(t, 0, d), rank_of(t, pp - 1, d)])
                    if (t, d) == (me.t, me.d) and me.p in (0, pp - 1):
                        self.embedding = g
        self.prev = rank_of(me.t, me.p - 1, me.d) if me.p > 0 else None
        self.next = rank_of(me.t, me.p + 1, me.d) if me.p < pp - 1 else None


def all_reduce(x, group, op=dist.ReduceOp.SUM):
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward (the input
    of a column-parallel linear is used by every TP rank)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.clone(), ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward (the partial sums of a row-parallel linear or a
    vocab-parallel embedding), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary rows among TP ranks (Megatron's
    _VocabParallelCrossEntropy), with the padded rows (>= vocab) masked out."""

    @staticmethod
    def forward(ctx, logits, target, lo, vocab, group):
        logits = logits.clone()
        n = logits.shape[-1]
        if lo + n > vocab:
            logits[:, max(vocab - lo, 0):] = -math.inf
        m = logits.max(dim=-1).values
        all_reduce(m, group, dist.ReduceOp.MAX)
        logits -= m[:, None]
        mine = (target >= lo) & (target < lo + n)
        local = (target - lo).masked_fill(~mine, 0)
        picked = logits.gather(1, local[:, None]).squeeze(1).masked_fill(~mine, 0.0)
        all_reduce(picked, group)
        exp = logits.exp()
        total = all_reduce(exp.sum(dim=-1), group)
        ctx.save_for_backward(exp.div_(total[:, None]), mine, local)
        return total.log() - picked

    @staticmethod
    def backward(ctx, g):
        softmax, mine, local = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0])
        grad[rows, local] -= mine.to(grad.dtype)
        return grad * g[:, None], None, None, None, None


# --- the model -------------------------------------------------------------------------------

class Stage:
    """This rank's pipeline stage of the GPT: the layers of rank.json and, on the first and
    last stages, the embedding and the head. @params maps schema names to this rank's
    partitions (leaf tensors); everything is sized from their shapes."""

    def __init__(self, me, schema, hp, params, groups):
        self.me, self.P, self.g = me, params, groups
        self.first, self.last = me.p == 0, me.p == me.pp - 1
        spec = {t["name"]: t for t in schema["tensors"]}
        qkv = spec["layers/{L}/self_attention/query_key_value/weight"]
        q, k, _ = qkv["split"]["chunks"]
        self.hidden = qkv["shape"][1]
        self.vocab = spec["embedding/word_embeddings/weight"]["shape"][0]
        self.heads = hp["heads"]
        self.head_dim = q // self.heads
        self.kv_heads = k // self.head_dim
        assert self.heads % me.tp == 0 and self.kv_heads % me.tp == 0, \
            "tp must divide the attention and KV heads (a head is never split)"
        self.local_heads, self.local_kv = self.heads // me.tp, self.kv_heads // me.tp
        self.eps, self.rope_base = hp["norm_eps"], hp["rope_base"]
        self.tied = spec["output_layer/weight"].get("tied") is not None
        self.dtype = params[f"layers/{me.layers.start}/input_layernorm/weight"].dtype

    def col(self, x, w):  # ColumnParallelLinear without bias: output split among TP ranks
        return F.linear(CopyToTP.apply(x, self.g.tp), w)

    def row(self, x, w):  # RowParallelLinear without bias: input split, outputs summed
        return ReduceFromTP.apply(F.linear(x, w), self.g.tp)

    def rms_norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):
        s, hd = x.shape[-2], x.shape[-1]
        inv = 1.0 / self.rope_base ** (torch.arange(0, hd, 2, dtype=x.dtype) / hd)
        ang = torch.outer(torch.arange(s, dtype=x.dtype), inv)
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def embed(self, tokens):
        w = self.P["embedding/word_embeddings/weight"]  # rows [lo, lo + n) of the padded vocab
        lo = self.me.t * w.shape[0]
        outside = (tokens < lo) | (tokens >= lo + w.shape[0])
        x = F.embedding((tokens - lo).masked_fill(outside, 0), w)
        return ReduceFromTP.apply(x.masked_fill(outside[..., None], 0.0), self.g.tp)

    def attention(self, i, x):
        b, s, _ = x.shape
        qkv = self.col(x, self.P[f"layers/{i}/self_attention/query_key_value/weight"])
        hd, nq, nkv = self.head_dim, self.local_heads, self.local_kv
        q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)  # this rank's chunks
        q = self.rope(q.view(b, s, nq, hd).transpose(1, 2))
        k = self.rope(k.view(b, s, nkv, hd).transpose(1, 2))
        v = v.view(b, s, nkv, hd).transpose(1, 2)
        k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = scores.masked_fill(causal, -math.inf).softmax(dim=-1) @ v
        out = att.transpose(1, 2).reshape(b, s, nq * hd)
        return self.row(out, self.P[f"layers/{i}/self_attention/dense/weight"])

    def mlp(self, i, x):
        gate, up = self.col(x, self.P[f"layers/{i}/mlp/dense_h_to_4h/weight"]).chunk(2, dim=-1)
        return self.row(F.silu(gate) * up, self.P[f"layers/{i}/mlp/dense_4h_to_h/weight"])

    def forward(self, x):
        for i in self.me.layers:
            norm1 = self.P[f"layers/{i}/input_layernorm/weight"]
            norm2 = self.P[f"layers/{i}/post_attention_layernorm/weight"]
            x = x + self.attention(i, self.rms_norm(x, norm1))
            x = x + self.mlp(i, self.rms_norm(x, norm2))
        return x

    def loss_sum(self, x, labels):
        """Sum over tokens of the cross-entropy (the last stage)."""
        x = self.rms_norm(x, self.P["final_layernorm/weight"])
        w = self.P["output_layer/weight" if "output_layer/weight" in self.P
                   else "embedding/word_embeddings/weight"]  # tied: pp == 1 holds one copy
        logits = self.col(x, w)
        ce = VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]),
                                             labels.reshape(-1), self.me.t * w.shape[0],
                                             self.vocab, self.g.tp)
        return ce.sum()


# --- data ------------------------------------------------------------------------------------

class MountData:
    """This DP rank's slices of the global batches, from the mount's views: exactly once
    per sample whatever the layout changes (the cursor is part of the job's state).
    Read WINDOW steps a file (data/<s>-<e>.npy): one open for many steps."""
    WINDOW = 16

    def __init__(self, me, start, steps):
        self.me, self.end = me, start + steps
        self.first, self.records, self.ids = start, None, None

    def batch(self, step):
        if self.records is None or not self.first <= step < self.first + len(self.ids):
            self.first = step
            self.records, self.ids = self.me.window(step, min(step + self.WINDOW, self.end))
        return self.records[step - self.first], self.ids[step - self.first]


class RestartedData:
    """What a loader without carried state does: each start of the job reads the
    dataset from its first record again (in mlfs's order for shuffle: false, so the
    first run of it is the same batches). Here only to show the damage."""

    def __init__(self, mnt, me, start, global_batch):
        index_uri = mnt.config()["dataset"]["index"]
        index_path = urllib.parse.urlparse(index_uri).path
        with open(index_path) as f:
            index = json.load(f)
        shape = [int(x) for x in index["shape"]]
        base = os.path.dirname(index_path)
        self.records = np.concatenate([
            np.fromfile(os.path.join(base, s["uri"]), dtype=index["dtype"]).reshape([-1] + shape)
            for s in index["shards"]])
        self.start, self.gb = start, global_batch
        n = global_batch // me.dp  # balanced slices as mlfs gives them (gb % dp == 0 here)
        self.lo, self.hi = me.d * n, (me.d + 1) * n

    def batch(self, step):
        j = step - self.start  # restarts at 0 at every start
        ids = (np.arange(j * self.gb, (j + 1) * self.gb) % len(self.records))[self.lo:self.hi]
        return self.records[ids], ids


# --- training --------------------------------------------------------------------------------

def train(args):
    t0 = T_PROCESS
    torch.set_num_threads(1)  # one process per rank, and the same sums in every run
    mnt = mlfs.Mount(args.mnt)
    me = mnt.rank(int(os.environ["RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    cfg, schema, hp = mnt.config(), mnt.schema(), mnt.job_json("train.json")
    assert world == me.tp * me.pp * me.dp == cfg["tp"] * cfg["pp"] * cfg["dp"], \
        f"WORLD_SIZE {world} is not tp*pp*dp of config.json"
    dist.init_process_group("gloo", rank=me.rank, world_size=world)
    groups = Groups(me)
    t_init = time.monotonic()

    start = me.saved_step()
    P = {n: t.requires_grad_() for n, t in me.load_state("model").items()}
    M = me.load_state("optim/exp_avg")
    V = me.load_state("optim/exp_avg_sq")
    names = sorted(P)
    stage = Stage(me, schema, hp, P, groups)
    gb = cfg["dataset"]["global_batch"]
    # The global batch is the config's in every layout: fewer DP ranks accumulate
    # more micro-batches (mlfs.elastic.batch_plan refuses a dp that cannot).
    local_batch, micro = mlfs.elastic.batch_plan(cfg, hp["micro_batch"], me.dp)
    mbs = hp["micro_batch"]
    end = args.until if args.until is not None else start + args.steps
    data = (MountData(me, start, end - start) if args.data == "mount"
            else RestartedData(mnt, me, start, gb))
    version = cfg["version"]
    t_load = time.monotonic()
    t_train = t_save = 0.0
    step_s = []  # each step's seconds, saves left out (tests/bench/bench_suggest.py)

    step = start
    while step < end:
        # --save-every K (elastic): save every K steps and stop when the layout changes;
        # else one save at the end.
        chunk_end = min(end, step + args.save_every) if args.save_every else end
        t = t_prev = time.monotonic()
        for step in range(step, chunk_end):
            train_step(step, data, stage, groups, P, M, V, names, hp, gb, local_batch, mbs,
                       micro, me, version)
            now = time.monotonic()
            step_s.append(now - t_prev)
            t_prev = now
        step = chunk_end
        t_train += time.monotonic() - t

        # The save: every partition of every state, then step (the rank's promise).
        t = time.monotonic()
        try:
            me.save_state({"model": P, "optim/exp_avg": M, "optim/exp_avg_sq": V}, step)
        except mlfs.MlfsError as e:
            if not mlfs.elastic.stale(e):
                raise
            emit(kind="relayout", rank=me.rank, step=step, why=str(e))
            sys.exit(mlfs.elastic.EXIT_RELAYOUT)  # the layout changed under the save
        t_save += time.monotonic() - t
        dist.barrier()
        if args.save_every and step < end:
            # Every rank stops, or none: the flag is all-reduced.
            flag = torch.tensor([1.0 if mlfs.elastic.layout_changed(mnt, version) else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                if me.rank == 0:
                    emit(kind="relayout", rank=me.rank, step=step, why="layout changed")
                sys.exit(mlfs.elastic.EXIT_RELAYOUT)
    if me.rank == 0:
        emit(kind="time", start=start, steps=end - start, init_s=t_init - t0,
             load_s=t_load - t_init, train_s=t_train, save_s=t_save,
             partitions=len(names) * len(STATES),
             step_s=step_s)
    dist.destroy_process_group()


def train_step(step, data, stage, groups, P, M, V, names, hp, gb, local_batch, mbs, micro, me,
               version):
    """One step of the global batch: micro-batches forward and backward through the
    pipeline, DP all-reduce, tied embedding, Adam."""
    records, ids = data.batch(step)
    assert len(records) == local_batch, (step, records.shape)
    tokens = torch.from_numpy(records[:, :-1].astype(np.int64))
    labels = torch.from_numpy(records[:, 1:].astype(np.int64))
    tokens_in_batch = gb * tokens.shape[1]
    for p in P.values():
        p.grad = None

    # All forwards, then all backwards (GPipe); activations and their gradients go
    # to the same TP rank of the neighbouring stage.
    ins, outs = [], []
    for k in range(micro):
        sl = slice(k * mbs, (k + 1) * mbs)
        if stage.first:
            x = stage.embed(tokens[sl])
        else:
            x = torch.empty(mbs, tokens.shape[1], stage.hidden, dtype=stage.dtype)
            dist.recv(x, groups.prev)
            x.requires_grad_()
        y = stage.forward(x)
        if stage.last:
            y = stage.loss_sum(y, labels[sl]) / tokens_in_batch
        else:
            dist.send(y.detach().contiguous(), groups.next)
        ins.append(x)
        outs.append(y)
    for k in range(micro):
        if stage.last:
            outs[k].backward()
        else:
            g = torch.empty_like(outs[k])
            dist.recv(g, groups.next)
            outs[k].backward(g)
        if not stage.first:
            dist.send(ins[k].grad.contiguous(), groups.prev)

    # Data parallelism: sum the gradients of the DP ranks (each is already divided
    # by the global token count), in one flat buffer as Megatron's DDP buckets do.
    grads = [P[n].grad for n in names]
    if groups.dp is not None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce(flat, groups.dp)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
    # Tied embedding: the first stage's input embedding and the last stage's output
    # layer are one parameter; each copy gets the sum of both gradients.
    if groups.embedding is not None:
        tied = "embedding/word_embeddings/weight" if stage.first else "output_layer/weight"
        all_reduce(P[tied].grad, groups.embedding)

    # Adam (no weight decay); the mount's step count is the bias correction's.
    b1, b2 = hp["betas"]
    n_upd = step + 1
    with torch.no_grad():
        for n in names:
            g, m, v = P[n].grad, M[n], V[n]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2 ** n_upd)).sqrt_().add_(hp["eps"])
            P[n].addcdiv_(m, denom, value=-hp["lr"] / (1 - b1 ** n_upd))

    if stage.last:
        loss = all_reduce(sum(o.detach() for o in outs).reshape(1), groups.dp)
        if me.t == 0 and me.d == 0:
            emit(kind="loss", step=step, loss=float(loss), version=version, t=time.time())
    if stage.first and me.t == 0:
        emit(kind="ids", step=step, d=me.d, version=version, ids=[int(i) for i in ids],
             tokens_sum=int(records.astype(np.int64).sum()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mnt", required=True, help="the mlfs mount point")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int,
                    help="steps to train from the saved step, then save and exit")
    g.add_argument("--until", type=int,
                   help="train until this step (elastic: run again after a change, "
                        "the workers go on from the saved step)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="save every K steps, and after each save stop with exit "
                         "code 75 if the layout changed (mlfs.elastic)")
    ap.add_argument("--data", choices=("mount", "restart"), default="mount",
                    help="mount: the mount's data views (exactly once); restart: a "
                         "loader that starts from the first record at every start")
    train(ap.parse_args())


if __name__ == "__main__":
    main()
