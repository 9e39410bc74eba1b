"""What torch keeps for the backward pass against what pipecut charges for it.

    /work/torchenv/bin/python benches/activation_memory.py [--pipecut target/debug/pipecut]

Builds, in torch, the GPT of fixtures/models/gpt2_tiny.onnx (fixtures/generate.py `build_gpt`:
token and learned position embeddings, pre-norm blocks of causal attention and an exact-GELU MLP,
a final LayerNorm and the tied head), with attention through
`torch.nn.functional.scaled_dot_product_attention` as the `torch` memory model assumes. For a few
micro-batch shapes it runs the forward under `torch.autograd.graph.saved_tensors_hooks` and sums
the bytes of the distinct storages autograd saved, leaving out the weights and the token ids
(pipecut charges neither as activations). It then asks pipecut for the same model on one stage in
training (`partition --stages 1 --mode training --memory-model M --json`) and prints, per shape
and memory model, pipecut's `activation_bytes` and its ratio to torch's. One JSON document.

The model's sizes are read from the ONNX file; the head count is not stored there and is taken
from --heads (generate.py's default, 4).
"""

import argparse
import json
import math
import os
import subprocess
import sys

import onnx
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_sizes(path):
    """Layers, width, MLP width and vocabulary of a build_gpt model, from its initializers."""
    dims = {i.name: list(i.dims) for i in onnx.load(path, load_external_data=False).graph.initializer}
    vocab, width = dims["transformer.wte.weight"]
    ffn = dims["transformer.h.0.mlp.c_fc.weight"][1]
    layers = sum(1 for name in dims if name.endswith(".ln_1.weight"))
    return layers, width, ffn, vocab, dims["transformer.wpe.weight"][0]


class Block(torch.nn.Module):
    def __init__(self, width, ffn, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(width)
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.v = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)
        self.ln_2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, ffn)
        self.proj = torch.nn.Linear(ffn, width)

    def forward(self, h):
        b, s, d = h.shape
        x = self.ln_1(h)
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
        )
        h = h + self.out(o.transpose(1, 2).reshape(b, s, d))
        return h + self.proj(F.gelu(self.fc(self.ln_2(h))))


class Gpt(torch.nn.Module):
    def __init__(self, layers, width, ffn, vocab, positions, heads):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(positions, width)
        self.blocks = torch.nn.ModuleList(Block(width, ffn, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]).unsqueeze(0))
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h) @ self.wte.weight.t()


def saved_bytes(model, ids):
    """Bytes of the distinct storages autograd saves in one forward, weights and ids left out."""
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded.add(ids.untyped_storage().data_ptr())
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(ids)
    logits.float().sum().backward()
    return sum(storages.values())


def pipecut_bytes(binary, model_path, batch, seq, memory_model):
    out = subprocess.run(
        [binary, "partition", model_path, "--cluster", "1x1xH100-SXM", "--stages", "1",
         "--dim", f"batch={batch}", "--dim", f"seq={seq}", "--mode", "training",
         "--memory-model", memory_model, "--json"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    return sum(s["activation_bytes"] for s in json.loads(out.stdout)["stages"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipecut", default=os.path.join(REPO, "target", "debug", "pipecut"))
    ap.add_argument("--model", default=os.path.join(REPO, "fixtures", "models", "gpt2_tiny.onnx"))
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers, width, ffn, vocab, positions = model_sizes(args.model)
    model = Gpt(layers, width, ffn, vocab, positions, args.heads)
    rows = []
    for batch, seq in [(1, 16), (2, 32), (4, 64), (8, 64)]:
        ids = torch.randint(0, vocab, (batch, seq))
        measured = saved_bytes(model, ids)
        row = {"batch": batch, "seq": seq, "torch_saved_bytes": measured}
        for memory_model in ["torch", "megatron", "onnx"]:
            charged = pipecut_bytes(args.pipecut, args.model, batch, seq, memory_model)
            row[f"pipecut_{memory_model}_bytes"] = charged
            row[f"{memory_model}_over_torch"] = round(charged / measured, 3)
        rows.append(row)
    json.dump({"torch": torch.__version__, "model": os.path.relpath(args.model, REPO),
               "layers": layers, "width": width, "heads": args.heads, "rows": rows},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
