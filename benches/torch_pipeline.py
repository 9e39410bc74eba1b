"""pipecut's pipeline cut against torch's equal split and DeepSpeed's `parameters` method, trained
for real with torch.distributed.pipelining (gloo, CPU, one thread per rank), side by side.

    torchrun --standalone --nproc-per-node 2 benches/torch_pipeline.py [--rounds 5]

The model is what balancing by count or by parameters gets wrong: a large embedding (heavy in
parameters, light in time), N equal MLP blocks, and a head as slow as several blocks. Rank 0
plans it with pipecut for two CPU stages (`pipecut.torch.plan(..., devices="cpu,cpu")`) and
costs every node (`pipecut cost --device cpu --mode training`), which predicts each split's
stage times. Each round then trains a few steps with each split in turn (so drift in the
machine's load touches all three alike) and keeps each split's median step. Last, each
layer's forward and backward is timed alone on one thread, giving the measured stage shares.
Prints one JSON document: per split, where stage 1 begins, predicted and measured stage shares,
the predicted and measured steps, and the measured and predicted speedups of pipecut's split.
"""

import argparse
import ast
import copy
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, SplitPoint, pipeline

import pipecut
import pipecut.torch as pt

VOCAB, WIDTH, BLOCKS, SEQ = 16384, 256, 8, 32
MICROBATCH, MICROBATCHES = 4, 8


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Unequal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def layers(model):
    """The layer list DeepSpeed and pipecut's baselines cut: prologue, blocks, epilogue."""
    return [model.embed] + list(model.blocks) + [model.head]


def loss_fn(logits, target):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def deepspeed_parameters_cut(model):
    """DeepSpeed's `partition_method="parameters"` for two stages: the first block index of
    stage 1 that makes the heavier stage's parameter count least (ds_utils.partition_balanced,
    for two parts)."""
    weights = [sum(p.numel() for p in layer.parameters()) for layer in layers(model)]
    best = min(range(1, len(weights)), key=lambda i: max(sum(weights[:i]), sum(weights[i:])))
    return best


def node_layers(onnx_path):
    """Each ONNX node's layer index in `layers()` from the module scope dynamo records."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    out = {}
    for node in graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
        path = ast.literal_eval(scopes)
        names = [s for s in path if s.startswith("blocks.")]
        if names:
            out[node.name] = 1 + int(names[0].split(".")[1])
        elif any(s == "head" for s in path):
            out[node.name] = BLOCKS + 1
        else:
            out[node.name] = 0
    return out


def predicted_layer_secs(onnx_path):
    """pipecut's training-mode cost of each layer on the `cpu` profile, one micro-batch."""
    text = pipecut.command(
        "cost", onnx_path, "--device", "cpu", "--mode", "training", "--dim",
        f"batch={MICROBATCH}", "--json", "--top", "100000",
    )
    report = json.loads(text)
    where = node_layers(onnx_path)
    secs = [0.0] * (BLOCKS + 2)
    for row in report["nodes"]:
        secs[where.get(row["node"], 0)] += row["time_secs"]
    return secs


def measured_layer_secs(model, rounds=5):
    """Each layer's forward and backward alone on one thread, median of `rounds`."""
    ids = torch.randint(0, VOCAB, (MICROBATCH, SEQ))
    x = model.embed(ids).detach()
    inputs = [ids] + [x.clone().requires_grad_()] * (BLOCKS + 1)
    out = []
    for layer, given in zip(layers(model), inputs):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            y = layer(given)
            y.float().square().mean().backward()
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times))
    return out


def shares(layer_secs, cut):
    """Each stage's share of the work, and the 1F1B step it predicts: with two stages whose
    forward and backward take t0 and t1 per micro-batch, the step is (m - 1) * max(t0, t1) +
    t0 + t1 (the first micro-batch's pass through both, then one slowest stage per further
    micro-batch)."""
    stages = [sum(layer_secs[:cut]), sum(layer_secs[cut:])]
    total = sum(stages)
    step = (MICROBATCHES - 1) * max(stages) + total
    return [s / total for s in stages], step


def train_steps(model, cut, ids, labels, steps):
    """Median step of 1F1B over `cut` (stage 1 begins at layer `cut`, i.e. block cut-1)."""
    split_spec = {f"blocks.{cut - 1}": SplitPoint.BEGINNING}
    # pipeline() leaves its split points in the module it traces: each split gets a copy.
    pipe = pipeline(copy.deepcopy(model), mb_args=(ids[:MICROBATCH],), split_spec=split_spec)
    rank = dist.get_rank()
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        schedule.step(*((ids,) if rank == 0 else ()), target=labels if rank == 1 else None, losses=[])
        dist.barrier()
        times.append(time.perf_counter() - start)
    return times[1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Unequal()
    batch = MICROBATCH * MICROBATCHES
    ids = torch.randint(0, VOCAB, (batch, SEQ))
    labels = torch.randint(0, VOCAB, (batch, SEQ))

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "unequal.onnx")
        tplan = pt.plan(
            model, (ids[:MICROBATCH],), global_batch=batch, devices="cpu,cpu", pp=2, dp=1, tp=1,
            microbatch_sizes=[MICROBATCH], schedule=["1f1b"], onnx_path=onnx_path,
        )
        predicted = predicted_layer_secs(onnx_path) if dist.get_rank() == 0 else None
    (boundary,) = tplan.split_spec
    cuts = {
        "pipecut": 1 + int(boundary.rsplit(".", 1)[1]),
        "torch equal blocks": 1 + BLOCKS // 2,
        "deepspeed parameters": deepspeed_parameters_cut(model),
    }
    if dist.get_rank() == 0:
        print(json.dumps({"cuts": cuts, "pipecut_split_spec": tplan.split_spec}), flush=True)
    steps = {name: [] for name in cuts}
    for _ in range(args.rounds):
        for name, cut in cuts.items():
            steps[name] += train_steps(model, cut, ids, labels, args.steps)
    if dist.get_rank() == 0:
        measured = measured_layer_secs(model)
        report(cuts, steps, predicted, measured)
    dist.destroy_process_group()


def report(cuts, steps, predicted, measured):
    rows = {}
    for name, cut in cuts.items():
        predicted_shares, predicted_step = shares(predicted, cut)
        measured_shares, _ = shares(measured, cut)
        rows[name] = {
            "stage_1_begins_at_layer": cut,
            "predicted_stage_shares": [round(s, 3) for s in predicted_shares],
            "measured_stage_shares": [round(s, 3) for s in measured_shares],
            "predicted_step_secs": predicted_step,
            "measured_step_secs": statistics.median(steps[name]),
        }
    ours = rows["pipecut"]
    for name, row in rows.items():
        row["measured_speedup_of_pipecut"] = row["measured_step_secs"] / ours["measured_step_secs"]
        row["predicted_speedup_of_pipecut"] = row["predicted_step_secs"] / ours["predicted_step_secs"]
    print(json.dumps({"model": {"vocab": VOCAB, "width": WIDTH, "blocks": BLOCKS, "seq": SEQ,
                                "microbatch": MICROBATCH, "microbatches": MICROBATCHES},
                      "splits": rows}, indent=1))


if __name__ == "__main__":
    main()
