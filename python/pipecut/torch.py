"""Train a ``torch.nn.Module`` with pipecut's plan, through torch.distributed.

``plan()`` exports the module to ONNX (``torch.onnx.export``, the dynamo exporter by default),
plans the cluster for training (``pipecut plan-cluster --mode training``) and maps the plan back
to module names. The result, a :class:`TorchPlan`, says how torch applies it: the device mesh,
the pipeline's ``split_spec``, the ``parallelize_module`` plan, the data-parallel wrapping for the
plan's ZeRO stage, activation checkpointing, the schedule class and the micro-batch count.
``apply()`` does it on one rank and returns that rank's stage module and its training step::

    import pipecut.torch as pt
    tplan = pt.plan(model, (ids[:2],), global_batch=8, cluster="1x4xL4")  # under torchrun
    stage, step = pt.apply(tplan, model, (ids[:2],), loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage.parameters())
    step.step(tplan.local_batch(ids, step.dp_rank), target=tplan.local_batch(labels, step.dp_rank))
    opt.step()

How each part of the plan reaches torch (docs/python.md has the table):

* pipeline stages: ``torch.distributed.pipelining.pipeline(module, mb_args, split_spec)`` with a
  ``SplitPoint.BEGINNING`` at each boundary pipecut moved to a module boundary;
* tensor parallelism: ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` for
  the ``nn.Linear``/``nn.Embedding`` (and Hugging Face ``Conv1D``) whose weights the plan's shard
  layout splits on their output or input axis; inside a traced pipeline stage, which calls aten
  ops rather than its modules, the same parameters become ``DTensor``s with the same placements
  and the stage's ops that meet them run under DTensor's rules;
* sequence parallelism: on traced stages (one without a pipeline), partial sums are
  reduce-scattered along the tokens instead of all-reduced, and each numbered block gathers its
  inputs whole, as the plan's export does;
* ZeRO-3: FSDP2 ``fully_shard``; ZeRO-1 and 2: ``fully_shard(reshard_after_forward=False)``
  (weights stay gathered from forward to backward; gradients and optimizer state are sharded,
  which is ZeRO-2; torch has no ZeRO-1 that composes with its pipelines, so ZeRO-1 plans get
  ZeRO-2, which keeps less memory); no ZeRO: gradients all-reduced over the data-parallel group
  after each step, as DDP does;
* recomputation: ``checkpoint_wrapper`` around each numbered block (full) or each block's
  attention (selective); inside a pipeline stage, around the stage's forward;
* schedule: ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` (the plan's
  chunks per rank, stage i on pipeline rank i mod pp) or, for zero-bubble,
  ``ScheduleInterleavedZeroBubble`` over one stage per rank, with the plan's micro-batch count.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # torch is imported where it is used: `import pipecut` does not need it
    import torch

from . import _api
from ._plan import Plan

# The schedules apply() builds, by the plan's name for them. An interleaved plan's stages are
# model chunks, stage i on pipeline rank i mod pp, as torch's interleaved schedule places them.
# Zero-bubble (ZB-H1, one stage per rank) runs as torch's ZB1P over one stage per rank: the
# backward split into input and weight gradients, weight gradients filling the bubble.
# plan() searches GPipe and 1F1B unless told otherwise.
SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
}

# Keys of the mesh, outermost first: ranks of one pipeline stage's tensor-parallel group are
# adjacent, as the plan's groups are consecutive GPUs of a node.
MESH_DIMS = ("pp", "dp", "tp")


@dataclass
class TorchPlan:
    """pipecut's plan in torch.distributed's terms (see the module's doc)."""

    mesh: Dict[str, int]
    split_spec: Dict[str, str]
    tensor_parallel: Dict[str, str]
    sequence_parallel: bool
    zero_stage: int
    data_parallel: str
    recompute: str
    checkpoint_modules: List[str]
    # The torch.distributed.pipelining class; None without a pipeline (pp 1), where the step
    # runs the micro-batches itself and no schedule class is built.
    schedule: Optional[str]
    chunks: int
    microbatches: int
    microbatch_size: int
    global_batch: int
    block_family: Optional[str]
    blocks: List[str]
    predicted_step_secs: float
    predicted_stage_secs: List[float]
    plan: Plan = field(repr=False)

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The torch plan as JSON (module names are JSON strings: data, never code)."""
        body = asdict(self)
        body.pop("plan")
        body["pipecut_plan"] = self.plan.raw
        return json.dumps(body, indent=indent) + "\n"

    @property
    def world_size(self) -> int:
        return self.mesh["pp"] * self.mesh["dp"] * self.mesh["tp"]

    def local_batch(self, batch: Any, dp_rank: int) -> Any:
        """This data-parallel rank's share of a global batch (rows ``dp_rank``·n … along axis 0)."""
        share = self.global_batch // self.mesh["dp"]
        return batch[dp_rank * share : (dp_rank + 1) * share]


def plan(
    model: "torch.nn.Module",
    example_inputs: Tuple[Any, ...],
    *,
    global_batch: int,
    cluster: Optional[str] = None,
    schedule: Sequence[str] = ("gpipe", "1f1b"),
    dynamo: bool = True,
    onnx_path: Optional[str] = None,
    **options: Any,
) -> TorchPlan:
    """Exports ``model`` called on ``example_inputs`` (axis 0 of each tensor is the batch) and
    plans training on ``cluster`` for ``global_batch`` samples per step.

    Other keywords are ``pipecut plan-cluster`` flags (``pp=2``, ``tp=2``, ``zero=[0, 3]``,
    ``recompute=["full"]``, ``microbatch_sizes=[2]``, ``time_limit="30s"``…). ``onnx_path`` keeps
    the exported file.

    Under an initialised ``torch.distributed`` job, rank 0 plans and sends the plan to every
    rank (a solve bounded by time could otherwise choose differently on a loaded rank); a
    failure there is raised on every rank.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return _plan_here(model, example_inputs, global_batch, cluster, schedule, dynamo, onnx_path, options)
    box: List[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = _plan_here(
                model, example_inputs, global_batch, cluster, schedule, dynamo, onnx_path, options
            )
        except Exception as err:  # every rank raises it, not only rank 0
            box[0] = err
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def _plan_here(
    model: Any,
    example_inputs: Tuple[Any, ...],
    global_batch: int,
    cluster: Optional[str],
    schedule: Sequence[str],
    dynamo: bool,
    onnx_path: Optional[str],
    options: Dict[str, Any],
) -> TorchPlan:
    with tempfile.TemporaryDirectory(prefix="pipecut-torch-") as tmp:
        path = onnx_path or os.path.join(tmp, "model.onnx")
        _export(model, example_inputs, path, dynamo)
        if cluster is not None:
            options["cluster"] = cluster
        weight_modules = _weight_modules(path)
        text = _api.command(
            "plan-cluster", path, "--mode", "training", "--global-batch", str(global_batch),
            "--batch-dim", "batch", "--json", "--emit", "torch-split-spec",
            *_api.flags(schedule=list(schedule), **options),
        )
    both = json.loads(text)
    plan_ = Plan.from_json(json.dumps(both["plan"]))
    return _torch_plan(plan_, both["torch_split"], model, weight_modules)


def _export(model: Any, example_inputs: Tuple[Any, ...], path: str, dynamo: bool) -> None:
    import torch

    inputs = tuple(example_inputs)
    batch = torch.export.Dim("batch")
    dynamic = tuple({0: batch} if isinstance(x, torch.Tensor) else None for x in inputs)
    was_training = model.training
    model.eval()
    try:
        if dynamo:
            torch.onnx.export(
                model, inputs, path, dynamo=True, dynamic_shapes=dynamic, external_data=False
            )
        else:
            names = [f"input_{i}" for i in range(len(inputs))]
            axes = {name: {0: "batch"} for name in names}
            torch.onnx.export(
                model, inputs, path, dynamo=False, input_names=names, dynamic_axes=axes
            )
    finally:
        model.train(was_training)


@dataclass
class WeightOwner:
    """The module an exported initializer belongs to, and the initializer itself (its values
    are compared with the module's weight only for the weights a plan splits)."""

    module: str
    initializer: Any = field(repr=False)

    def transposed(self, model: Any) -> Optional[bool]:
        """Whether the exporter stored the module's weight transposed (``None``: the
        initializer is neither that 2-D weight nor its transpose)."""
        return _orientation(self.initializer, _submodule(model, self.module))


def _weight_modules(onnx_path: str) -> Dict[str, WeightOwner]:
    """``{initializer: WeightOwner}`` for each initializer an exported node reads, by the
    module scope the dynamo exporter records on the node (``pkg.torch.onnx.name_scopes``: the
    module path, then the op). The exporter's optimizer folds a linear layer's transposed weight
    into a new initializer (``val_237``), so neither a weight's name nor its shape (a square
    weight reads the same both ways) says its orientation: its values, compared with the
    module's weight, do."""
    import ast

    import onnx

    graph = onnx.load(onnx_path).graph
    initializers = {t.name: t for t in graph.initializer}
    owners: Dict[str, WeightOwner] = {}
    for node in graph.node:
        scopes = next(
            (p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None
        )
        if scopes is None:
            continue
        path = ast.literal_eval(scopes)
        if len(path) < 2:
            continue
        for name in node.input:
            if name in initializers and name not in owners:
                owners[name] = WeightOwner(path[-2], initializers[name])
    return owners


def _orientation(initializer: Any, module: Any) -> Optional[bool]:
    """False where the initializer holds the module's 2-D weight as it is, True where it holds
    its transpose, None otherwise."""
    import numpy as np
    from onnx import numpy_helper

    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        return None
    value = numpy_helper.to_array(initializer)
    mine = weight.detach().cpu().numpy()
    if value.shape == mine.shape and np.array_equal(value, mine):
        return False
    if value.shape == mine.T.shape and np.array_equal(value, mine.T):
        return True
    return None


def _torch_plan(
    plan: Plan, split: Dict[str, Any], model: Any, weight_modules: Dict[str, WeightOwner]
) -> TorchPlan:
    par = plan.parallelism
    if par is None:
        raise ValueError("the plan has no parallelism section: it was not made by plan-cluster")
    if plan.schedule not in SCHEDULE_CLASSES:
        raise ValueError(
            f"the plan's schedule '{plan.schedule}' has no torch.distributed.pipelining class; "
            f"pipecut.torch applies {sorted(SCHEDULE_CLASSES)} (pass schedule=...)"
        )
    stages = len(plan.stages)
    chunks = _chunks(plan)
    boundaries = split.get("boundaries", []) if split.get("outcome") == "split" else []
    if stages > 1 and len(boundaries) != stages - 1:
        raise ValueError(
            "the plan's stage boundaries do not fall on module boundaries: "
            + split.get("reason", "no numbered blocks")
        )
    tp = par.tensor_parallel.degree
    family = split.get("family")
    return TorchPlan(
        mesh={"pp": stages // chunks, "dp": par.data_parallel, "tp": tp},
        split_spec={b["module"]: "BEGINNING" for b in boundaries},
        tensor_parallel=(
            _tensor_parallel_styles(par.raw.get("shards", []), model, weight_modules)
            if tp > 1
            else {}
        ),
        sequence_parallel=par.tensor_parallel.sequence_parallel,
        zero_stage=plan.zero_stage,
        data_parallel=_data_parallel_wrapper(par.data_parallel, plan.zero_stage),
        recompute=plan.recompute,
        checkpoint_modules=_checkpointed(plan.recompute, family, split, model),
        schedule=SCHEDULE_CLASSES[plan.schedule] if stages > chunks else None,
        chunks=chunks,
        microbatches=plan.microbatches,
        microbatch_size=par.microbatch_size,
        global_batch=par.global_batch,
        block_family=family,
        blocks=_blocks(family, split),
        predicted_step_secs=par.step_secs,
        predicted_stage_secs=[s.stage_secs for s in plan.stages],
        plan=plan,
    )


def _chunks(plan: Plan) -> int:
    """Model chunks per pipeline rank: the interleaved schedule's v, else 1."""
    schedule = plan.raw.get("config", {}).get("schedule")
    if isinstance(schedule, dict) and "interleaved" in schedule:
        return int(schedule["interleaved"].get("chunks", 2))
    return 1


def _data_parallel_wrapper(replicas: int, zero_stage: int) -> str:
    if replicas == 1:
        return "none"
    if zero_stage == 3:
        return "fully_shard"
    if zero_stage in (1, 2):
        return "fully_shard(reshard_after_forward=False)"
    return "all_reduce"


def _tensor_parallel_styles(
    shards: List[Dict[str, Any]], model: Any, weight_modules: Dict[str, WeightOwner]
) -> Dict[str, str]:
    """``{module: "colwise" | "rowwise"}`` from the weights rank 0 holds a slice of.

    Each sliced initializer names its module (``_weight_modules``); the axis it is cut along,
    read on the module's own weight (the exported initializer may be its transpose, which
    ``_weight_modules`` found by comparing values), says how: an ``nn.Linear`` weight is
    ``[out, in]`` (axis 0 column-wise, axis 1 row-wise), Hugging Face's ``Conv1D`` weight
    ``[in, out]`` (axis 1 column-wise), an ``nn.Embedding`` weight ``[vocab, dim]`` (axis 0
    row-wise, i.e. vocabulary-parallel).
    """
    styles: Dict[str, str] = {}
    for stage in shards:
        for weight in stage["ranks"][0]["weights"]:
            found = weight_modules.get(weight["name"])
            owner = found.module if found else weight["name"].rpartition(".")[0]
            module = _submodule(model, owner) if owner else None
            kind = _layer_kind(module)
            if kind is None:
                what = type(module).__name__ if module is not None else "no module"
                raise ValueError(
                    f"the plan splits weight '{weight['name']}' of {owner or 'no module'} "
                    f"({what}): pipecut.torch splits only nn.Linear, nn.Embedding and "
                    "Hugging Face's Conv1D"
                )
            if len(weight["shape"]) == 1:
                continue  # a bias follows its weight's split
            transposed = found.transposed(model) if found is not None else None
            if transposed is None:
                raise ValueError(
                    f"the plan splits exported weight '{weight['name']}', which holds neither "
                    f"{owner}'s weight nor its transpose: its axis cannot be mapped to the module"
                )
            axis = 1 - weight["axis"] if transposed else weight["axis"]
            column_axis = {"linear": 0, "conv1d": 1, "embedding": 1}[kind]
            styles[owner] = "colwise" if axis == column_axis else "rowwise"
    return styles


def _layer_kind(module: Any) -> Optional[str]:
    """``linear``, ``conv1d`` (Hugging Face's ``Conv1D``: ``x @ weight + bias``, the weight
    ``[in, out]``), ``embedding``, or None for a layer pipecut.torch does not split."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return "linear"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and module.weight.dim() == 2:
        return "conv1d"
    return None


def _submodule(model: Any, name: str) -> Any:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _blocks(family: Optional[str], split: Dict[str, Any]) -> List[str]:
    """The model's numbered blocks (``transformer.h.0``, …), as torch-split found them."""
    if not family:
        return []
    return [name for name in split.get("layers", []) if name.startswith(family + ".")]


def _checkpointed(recompute: str, family: Optional[str], split: Dict[str, Any], model: Any) -> List[str]:
    """The modules to wrap in ``checkpoint_wrapper``: each numbered block (full), or each
    block's attention (selective: Korthikanti et al.'s recomputation of the attention core)."""
    if recompute == "none" or not family:
        return []
    blocks = _blocks(family, split)
    if recompute == "full":
        return blocks
    attention = []
    for block in blocks:
        module = _submodule(model, block)
        children = dict(module.named_children()) if module is not None else {}
        names = [n for n in children if "attn" in n.lower() or "attention" in n.lower()]
        attention += [f"{block}.{n}" for n in names[:1]] or [block]
    return attention


def apply(
    tplan: TorchPlan,
    model: "torch.nn.Module",
    example_microbatch: Tuple[Any, ...],
    *,
    loss_fn: Any,
    mesh: Any = None,
) -> Tuple["torch.nn.Module", "Step"]:
    """Applies the plan on this rank; ``torch.distributed`` must be initialised with
    ``tplan.world_size`` processes. ``example_microbatch`` is one micro-batch of inputs (for the
    pipeline's trace); ``loss_fn(output, target)`` the loss of one micro-batch.

    Returns this rank's stage module (its parameters are what its optimizer steps) and a
    :class:`Step` that runs one training step's forward and backward. The model is consumed:
    its parameters become the stage's (sharded, wrapped), and torch's ``pipeline()`` leaves its
    split points in the module it traces, so apply a plan once per model.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.get_world_size() != tplan.world_size:
        raise ValueError(
            f"the plan needs {tplan.world_size} processes (pp {tplan.mesh['pp']} × dp "
            f"{tplan.mesh['dp']} × tp {tplan.mesh['tp']}); this job has {dist.get_world_size()}"
        )
    if mesh is None:
        shape = tuple(tplan.mesh[d] for d in MESH_DIMS)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=MESH_DIMS)
    if tplan.sequence_parallel and not tplan.blocks:
        raise ValueError(
            "the plan uses sequence parallelism, which pipecut.torch applies between numbered "
            "blocks, and this model has none that torch-split recognises"
        )
    if tplan.mesh["pp"] > 1 or tplan.sequence_parallel:
        # Sequence parallelism runs on traced stages (one stage without a pipeline), where
        # the values between blocks can stay split along the sequence.
        return _pipelined(tplan, model, example_microbatch, loss_fn, mesh)
    if tplan.mesh["tp"] > 1:
        _parallelize(tplan, model, mesh["tp"])
    _checkpoint_modules(model, tplan.checkpoint_modules)
    _wrap_data_parallel(tplan, model, mesh)
    return model, Step(tplan, None, model, loss_fn, mesh)


# How each layer's parameters are split for its style: (the weight's sharded dim, the bias's:
# a dim, or None where every rank holds the whole bias). Linear weights are [out, in],
# Hugging Face's Conv1D weights [in, out], embeddings [vocab, dim].
SHARD_DIMS = {
    ("linear", "colwise"): (0, 0),
    ("linear", "rowwise"): (1, None),
    ("conv1d", "colwise"): (1, 0),
    ("conv1d", "rowwise"): (0, None),
    ("embedding", "rowwise"): (0, None),
    ("embedding", "colwise"): (1, None),
}


def _parameter_placements(tplan: TorchPlan, model: Any) -> Dict[str, Any]:
    """``{parameter name: Placement}`` on the tensor-parallel mesh for every parameter of a
    split layer, from the plan's styles."""
    return {
        f"{name}.{param}": placement
        for name, style in tplan.tensor_parallel.items()
        for param, placement in _layer_placements(model.get_submodule(name), style).items()
    }


def _layer_placements(layer: Any, style: str) -> Dict[str, Any]:
    """``{"weight": Placement, "bias": Placement}`` of one split layer (``SHARD_DIMS``)."""
    weight_dim, bias_dim = SHARD_DIMS[(_layer_kind(layer), style)]
    placements = {"weight": _placement(weight_dim)}
    if getattr(layer, "bias", None) is not None:
        placements["bias"] = _placement(bias_dim)
    return placements


def _placement(dim: Optional[int]) -> Any:
    """``Shard(dim)``, or ``Replicate()`` for None (``SHARD_DIMS``)."""
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if dim is None else Shard(dim)


def _parallelize(tplan: TorchPlan, model: Any, tp_mesh: Any) -> None:
    """Tensor parallelism on the whole module, as torchtitan applies it: ``parallelize_module``
    with torch's styles (``_styles`` extends them to Hugging Face's ``Conv1D``)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    colwise, rowwise = _styles()
    styles = {}
    for name, style in tplan.tensor_parallel.items():
        # A column-wise layer whose output is not read by a row-wise one (a vocabulary-parallel
        # head) gives its output whole, as the plan's export gathers it.
        rowwise_next = any(s == "rowwise" and _same_block(name, n) for n, s in tplan.tensor_parallel.items())
        if style == "colwise":
            styles[name] = colwise() if rowwise_next else colwise(output_layouts=Replicate())
        elif _layer_kind(model.get_submodule(name)) == "embedding":
            # Vocabulary-parallel: every rank reads all the token ids.
            styles[name] = rowwise(input_layouts=Replicate())
        else:
            styles[name] = rowwise()
    parallelize_module(model, tp_mesh, styles)


def _styles() -> Tuple[Any, Any]:
    """torch's ``ColwiseParallel`` and ``RowwiseParallel``, extended to Hugging Face's ``Conv1D``
    (GPT-2's layers: ``x @ weight + bias`` with the weight ``[in, out]``, so its column-wise
    split is on dim 1). Inputs and outputs are laid out as for ``nn.Linear``."""
    from functools import partial

    from torch import nn
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def conv1d_apply(style: Any, kind: str, module: Any, mesh: Any) -> Any:
        def partition(_name: str, layer: Any, mesh: Any) -> None:
            for name, placement in _layer_placements(layer, kind).items():
                param = getattr(layer, name)
                sharded = distribute_tensor(param, mesh, [placement])
                layer.register_parameter(name, nn.Parameter(sharded, param.requires_grad))

        return distribute_module(
            module, mesh, partition,
            partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
            partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
        )

    class Colwise(ColwiseParallel):
        def _apply(self, module: Any, device_mesh: Any) -> Any:
            if _layer_kind(module) != "conv1d":
                return super()._apply(module, device_mesh)
            return conv1d_apply(self, "colwise", module, device_mesh)

    class Rowwise(RowwiseParallel):
        def _apply(self, module: Any, device_mesh: Any) -> Any:
            if _layer_kind(module) != "conv1d":
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)
            return conv1d_apply(self, "rowwise", module, device_mesh)

    return Colwise, Rowwise


def _shard_traced_stage(
    stage_module: Any, placements: Dict[str, Any], tp_mesh: Any, sequence_blocks: List[str]
) -> None:
    """Tensor parallelism inside a traced pipeline stage. ``pipeline()``'s stages call aten ops
    on their parameters rather than their ``nn.Linear`` modules, so ``parallelize_module`` has
    nothing to hook. Instead the split parameters become ``DTensor``s with the plan's placements,
    and every op of the stage's graphs that meets a ``DTensor`` runs under DTensor's rules
    (``_on_tensor_parallel_values``), which insert the collectives the placements call for.
    Values are handed back as plain tensors as soon as they are whole again, so the rest of
    the stage (attention, norms) runs on plain tensors, and the stage's outputs are whole.

    With sequence parallelism (``sequence_blocks``, the blocks of a plan that has it), a partial
    sum is reduce-scattered along the sequence (dim 1; dim 0 of a layer that flattened its
    tokens) instead, so the values between blocks stay split along it, and each block gathers
    its inputs whole as it starts: the plan's ReduceScatter after each split block and
    AllGather before each block."""
    from torch import nn
    from torch.distributed.tensor import distribute_tensor

    for name, param in list(stage_module.named_parameters()):
        placement = placements.get(name)
        if placement is None:
            continue
        parent, _, leaf = name.rpartition(".")
        holder = stage_module.get_submodule(parent) if parent else stage_module
        sharded = distribute_tensor(param.detach(), tp_mesh, [placement])
        setattr(holder, leaf, nn.Parameter(sharded, requires_grad=param.requires_grad))
    for module in stage_module.modules():
        graph = getattr(module, "graph", None)
        if graph is None:
            continue
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            if _is_unused_assertion(node):
                # aten._assert_tensor_metadata has no DTensor rule; it checks what the trace saw.
                graph.erase_node(node)
            else:
                node.target = _on_tensor_parallel_values(node.target, tp_mesh, bool(sequence_blocks))
        if hasattr(module, "recompile"):
            module.recompile()
    for name in sequence_blocks:
        block = _submodule(stage_module, name)
        if block is not None:
            block.register_forward_pre_hook(_whole_inputs, with_kwargs=True)
    stage_module.register_forward_hook(_whole_outputs)


def _is_unused_assertion(node: Any) -> bool:
    return not node.users and "_assert_" in getattr(node.target, "__name__", str(node.target))


def _on_tensor_parallel_values(target: Any, tp_mesh: Any, sequence_parallel: bool) -> Any:
    """``target`` as it runs in a tensor-parallel stage: untouched where no argument is a
    ``DTensor``; otherwise every plain tensor argument enters as replicated (autograd-aware:
    its gradient is reduced over the group, Megatron's "f") and each result that is whole again
    leaves as a plain tensor (a partial sum is reduced first, Megatron's "g")."""
    import torch
    import torch.utils._pytree as pytree
    from torch.distributed.tensor import DTensor, Replicate

    def call(*args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if not any(isinstance(a, DTensor) for a in flat):
            return target(*args, **kwargs)
        flat = [
            DTensor.from_local(a, tp_mesh, [Replicate()], run_check=False)
            if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
            else a
            for a in flat
        ]
        args, kwargs = pytree.tree_unflatten(flat, spec)
        return pytree.tree_map(lambda v: _settled(v, sequence_parallel), target(*args, **kwargs))

    call.__name__ = "tensor_parallel_" + getattr(target, "__name__", "op").replace(".", "_")
    return call


def _settled(value: Any, sequence_parallel: bool) -> Any:
    """A DTensor result as later ops take it: a partial sum reduced (an embedding split by
    vocabulary must be reduced at once: its mask does not survive further ops), whole or, under
    sequence parallelism, split along the sequence; a whole value as a plain tensor, a value
    still split kept as a DTensor."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(value, DTensor):
        return value
    partial = [p for p in value.placements if p.is_partial()]
    if partial:
        masked = any(type(p).__name__ == "MaskPartial" for p in partial)
        along = Replicate()
        if sequence_parallel and not masked and value.dim() >= 2:
            # [batch, sequence, …] splits along the sequence; a layer that flattened its
            # tokens to [batch·sequence, …] (Hugging Face's Conv1D) splits along them.
            along = Shard(1) if value.dim() >= 3 else Shard(0)
        value = value.redistribute(placements=[along] * len(value.placements))
    if all(p.is_replicate() for p in value.placements):
        return value.to_local()
    return value


def _whole_inputs(_module: Any, args: Any, kwargs: Any) -> Any:
    """A block's inputs gathered whole (sequence parallelism's AllGather before each block)."""
    return _whole((args, kwargs))


def _whole_outputs(_module: Any, _args: Any, outputs: Any) -> Any:
    """A stage's outputs whole on every rank of its group: what the next stage and the loss
    read (a vocabulary-parallel head's logits are gathered here)."""
    return _whole(outputs)


def _whole(values: Any) -> Any:
    """``values`` with every DTensor in them gathered into a plain tensor (autograd-aware)."""
    import torch.utils._pytree as pytree
    from torch.distributed.tensor import DTensor

    return pytree.tree_map(lambda v: v.full_tensor() if isinstance(v, DTensor) else v, values)


def _same_block(a: str, b: str) -> bool:
    return a.rpartition(".")[0] == b.rpartition(".")[0] and a != b


def _checkpoint_modules(model: Any, names: List[str]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name in names:
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, child, checkpoint_wrapper(getattr(holder, child)))


def _wrap_data_parallel(tplan: TorchPlan, module: Any, mesh: Any) -> None:
    if tplan.data_parallel.startswith("fully_shard"):
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=mesh["dp"], reshard_after_forward=tplan.zero_stage == 3)


def _pipelined(tplan: TorchPlan, model: Any, example: Tuple[Any, ...], loss_fn: Any, mesh: Any):
    """This rank's pipeline stages (one, or ``chunks`` of an interleaved plan: stages r,
    r + pp, …), each sharded, recomputed and wrapped as the plan says, and their schedule."""
    import torch
    from torch.distributed.pipelining import SplitPoint, pipeline

    _refuse_tied_parameters(model)
    split_spec = {name: SplitPoint.BEGINNING for name in tplan.split_spec}
    placements = _parameter_placements(tplan, model) if tplan.mesh["tp"] > 1 else {}
    pipe = pipeline(model, mb_args=tuple(example), split_spec=split_spec)
    if tplan.mesh["pp"] == 1:
        module = _prepared_stage(tplan, pipe.get_stage_module(0), placements, mesh)
        return module, Step(tplan, None, module, loss_fn, mesh)
    pp_rank, pp = mesh["pp"].get_local_rank(), tplan.mesh["pp"]
    modules, stages = [], []
    for index in range(pp_rank, pp * tplan.chunks, pp):
        module = _prepared_stage(tplan, pipe.get_stage_module(index), placements, mesh)
        stage = pipe.build_stage(index, torch.device("cpu"), group=mesh["pp"].get_group())
        if module is not stage.submod:
            stage.submod = module
        modules.append(module)
        stages.append(stage)
    if tplan.chunks == 1:
        return modules[0], Step(tplan, stages[0], modules[0], loss_fn, mesh)
    held = torch.nn.ModuleList(modules)
    return held, Step(tplan, stages, held, loss_fn, mesh)


def _prepared_stage(tplan: TorchPlan, module: Any, placements: Dict[str, Any], mesh: Any) -> Any:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if placements:
        blocks = tplan.blocks if tplan.sequence_parallel else []
        _shard_traced_stage(module, placements, mesh["tp"], blocks)
    if tplan.recompute != "none":
        # A traced stage does not call its blocks as modules: its whole forward is recomputed.
        module = checkpoint_wrapper(module)
    _wrap_data_parallel(tplan, module, mesh)
    return module


def _refuse_tied_parameters(model: Any) -> None:
    """torch's pipelines copy a parameter that several modules share into each stage that uses
    it, and the copies then train apart: training would differ from the model's."""
    names: Dict[int, List[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    tied = [group for group in names.values() if len(group) > 1]
    if tied:
        raise ValueError(
            f"the model ties parameters ({' = '.join(tied[0])}): torch's pipeline stages would "
            "train separate copies of them; untie them (e.g. tie_word_embeddings=False) to "
            "train with a pipeline"
        )


class Step:
    """One training step of this rank: the plan's schedule over its micro-batches, then the
    data-parallel gradient reduction the wrapper does not do itself.

    ``step(*inputs, target=..., losses=[])`` takes this data-parallel rank's share of the batch
    (``TorchPlan.local_batch``); only the first stage reads ``inputs`` and only the last stage
    reads ``target`` and fills ``losses`` with each micro-batch's loss. Gradients are the mean
    over the micro-batches, as for the whole batch's mean loss.
    """

    def __init__(self, tplan: TorchPlan, stage: Any, module: Any, loss_fn: Any, mesh: Any):
        import torch.distributed.pipelining.schedules as schedules

        self.tplan = tplan
        self.module = module
        self.loss_fn = loss_fn
        self.mesh = mesh
        self.schedule = None
        if stage is not None:
            cls = getattr(schedules, tplan.schedule)
            if issubclass(cls, schedules.PipelineScheduleMulti) and not isinstance(stage, list):
                stage = [stage]  # a multi-stage schedule over this rank's one stage
            self.schedule = cls(stage, n_microbatches=tplan.microbatches, loss_fn=loss_fn)

    @property
    def dp_rank(self) -> int:
        """This rank's place in its data-parallel group (which share of the batch it takes)."""
        return self.mesh["dp"].get_local_rank()

    @property
    def is_first(self) -> bool:
        return self.mesh["pp"].get_local_rank() == 0

    @property
    def is_last(self) -> bool:
        return self.mesh["pp"].get_local_rank() == self.tplan.mesh["pp"] - 1

    def step(self, *inputs: Any, target: Any = None, losses: Optional[list] = None) -> None:
        if self.schedule is not None:
            args = inputs if self.is_first else ()
            self.schedule.step(*args, target=target if self.is_last else None, losses=losses)
        else:
            self._microbatched(inputs, target, losses)
        if self.tplan.data_parallel == "all_reduce":
            self._all_reduce_gradients()

    def _microbatched(self, inputs: Tuple[Any, ...], target: Any, losses: Optional[list]) -> None:
        import torch

        m = self.tplan.microbatches
        chunks = [torch.tensor_split(x, m) for x in inputs]
        targets = torch.tensor_split(target, m)
        for i in range(m):
            loss = self.loss_fn(self.module(*[c[i] for c in chunks]), targets[i])
            (loss / m).backward()
            if losses is not None:
                losses.append(loss.detach())

    def _all_reduce_gradients(self) -> None:
        import torch.distributed as dist

        group = self.mesh["dp"].get_group()
        size = self.tplan.mesh["dp"]
        for parameter in self.module.parameters():
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad, group=group)
                parameter.grad.div_(size)
