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
  the ``nn.Linear``/``nn.Embedding`` whose weights the plan's shard layout splits on their output
  or input axis;
* ZeRO-3: FSDP2 ``fully_shard``; ZeRO-1 and 2: ``fully_shard(reshard_after_forward=False)``
  (weights stay gathered from forward to backward; gradients and optimizer state are sharded,
  which is ZeRO-2; torch has no ZeRO-1 that composes with its pipelines, so ZeRO-1 plans get
  ZeRO-2, which keeps less memory); no ZeRO: gradients all-reduced over the data-parallel group
  after each step, as DDP does;
* recomputation: ``checkpoint_wrapper`` around each numbered block (full) or each block's
  attention (selective); inside a pipeline stage, around the stage's forward;
* schedule: ``ScheduleGPipe`` or ``Schedule1F1B`` with the plan's micro-batch count.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _api
from ._plan import Plan

# The schedules apply() builds, by the plan's name for them. Interleaved and zero-bubble
# schedules put several stages on a rank; plan() searches only these two by default.
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}

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
    schedule: str
    microbatches: int
    microbatch_size: int
    global_batch: int
    block_family: Optional[str]
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


def _weight_modules(onnx_path: str) -> Dict[str, str]:
    """``{initializer: module}`` for each initializer an exported node reads, by the module
    scope the dynamo exporter records on the node (``pkg.torch.onnx.name_scopes``: the module
    path, then the op). The exporter's optimizer folds a linear layer's transposed weight into a
    new initializer (``val_237``), so a weight's name alone does not always name its module."""
    import ast

    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    owners: Dict[str, str] = {}
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
            if name in initializers:
                owners.setdefault(name, path[-2])
    return owners


def _torch_plan(
    plan: Plan, split: Dict[str, Any], model: Any, weight_modules: Dict[str, str]
) -> TorchPlan:
    par = plan.parallelism
    if par is None:
        raise ValueError("the plan has no parallelism section: it was not made by plan-cluster")
    if plan.schedule not in SCHEDULE_CLASSES:
        raise ValueError(
            f"the plan's schedule '{plan.schedule}' puts several stages on a rank; "
            f"pipecut.torch applies {sorted(SCHEDULE_CLASSES)} (pass schedule=...)"
        )
    stages = len(plan.stages)
    boundaries = split.get("boundaries", []) if split.get("outcome") == "split" else []
    if stages > 1 and len(boundaries) != stages - 1:
        raise ValueError(
            "the plan's stage boundaries do not fall on module boundaries: "
            + split.get("reason", "no numbered blocks")
        )
    tp = par.tensor_parallel.degree
    family = split.get("family")
    return TorchPlan(
        mesh={"pp": stages, "dp": par.data_parallel, "tp": tp},
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
        schedule=SCHEDULE_CLASSES[plan.schedule],
        microbatches=plan.microbatches,
        microbatch_size=par.microbatch_size,
        global_batch=par.global_batch,
        block_family=family,
        predicted_step_secs=par.step_secs,
        predicted_stage_secs=[s.stage_secs for s in plan.stages],
        plan=plan,
    )


def _data_parallel_wrapper(replicas: int, zero_stage: int) -> str:
    if replicas == 1:
        return "none"
    if zero_stage == 3:
        return "fully_shard"
    if zero_stage in (1, 2):
        return "fully_shard(reshard_after_forward=False)"
    return "all_reduce"


def _tensor_parallel_styles(
    shards: List[Dict[str, Any]], model: Any, weight_modules: Dict[str, str]
) -> Dict[str, str]:
    """``{module: "colwise" | "rowwise"}`` from the weights rank 0 holds a slice of.

    Each sliced initializer names its module (``_weight_modules``); the axis it is cut along,
    read on the module's own weight (the exported initializer may be its transpose), says how:
    an ``nn.Linear`` weight is ``[out, in]`` (axis 0 column-wise, axis 1 row-wise), an
    ``nn.Embedding`` weight ``[vocab, dim]`` (axis 0 row-wise, i.e. vocabulary-parallel).
    """
    import torch

    styles: Dict[str, str] = {}
    for stage in shards:
        for weight in stage["ranks"][0]["weights"]:
            owner = weight_modules.get(weight["name"], weight["name"].rpartition(".")[0])
            module = _submodule(model, owner) if owner else None
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                found = type(module).__name__ if module is not None else "no module"
                raise ValueError(
                    f"the plan splits weight '{weight['name']}' of {owner or 'no module'} "
                    f"({found}): parallelize_module splits only nn.Linear and nn.Embedding"
                )
            axis = _module_axis(module.weight.shape, weight["shape"], weight["axis"], weight["name"])
            if isinstance(module, torch.nn.Linear):
                styles[owner] = "colwise" if axis == 0 else "rowwise"
            else:
                styles[owner] = "rowwise" if axis == 0 else "colwise"
    return styles


def _module_axis(module_shape: Any, onnx_shape: List[int], axis: int, name: str) -> int:
    """The plan's split axis of an exported weight, as an axis of the module's weight."""
    shape = list(module_shape)
    if shape == list(onnx_shape):
        return axis
    if len(shape) == 2 and shape == list(reversed(onnx_shape)):
        return 1 - axis
    raise ValueError(f"weight '{name}' has shape {onnx_shape}, its module's weight {shape}")


def _submodule(model: Any, name: str) -> Any:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _checkpointed(recompute: str, family: Optional[str], split: Dict[str, Any], model: Any) -> List[str]:
    """The modules to wrap in ``checkpoint_wrapper``: each numbered block (full), or each
    block's attention (selective: Korthikanti et al.'s recomputation of the attention core)."""
    if recompute == "none" or not family:
        return []
    blocks = [name for name in split.get("layers", []) if name.startswith(family + ".")]
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
    import torch
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
    if tplan.sequence_parallel:
        raise ValueError(
            "the plan uses sequence parallelism, which pipecut.torch does not apply yet: "
            "plan without --sequence-parallel"
        )
    if tplan.mesh["tp"] > 1:
        if tplan.mesh["pp"] > 1:
            raise ValueError(
                "pipecut.torch applies tensor parallelism without a pipeline only: "
                "torch's traced pipeline stages do not call their nn.Linear modules"
            )
        _parallelize(tplan, model, mesh["tp"])
    if tplan.mesh["pp"] > 1:
        return _pipelined(tplan, model, example_microbatch, loss_fn, mesh)
    _checkpoint_modules(model, tplan.checkpoint_modules)
    _wrap_data_parallel(tplan, model, mesh)
    return model, Step(tplan, None, model, loss_fn, mesh)


def _parallelize(tplan: TorchPlan, model: Any, tp_mesh: Any) -> None:
    import torch
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {}
    for name, style in tplan.tensor_parallel.items():
        # A column-wise layer whose output is not read by a row-wise one (a vocabulary-parallel
        # head) gives its output whole, as the plan's export gathers it.
        rowwise_next = any(s == "rowwise" and _same_block(name, n) for n, s in tplan.tensor_parallel.items())
        if style == "colwise":
            styles[name] = ColwiseParallel() if rowwise_next else ColwiseParallel(output_layouts=Replicate())
        elif isinstance(model.get_submodule(name), torch.nn.Embedding):
            # Vocabulary-parallel: every rank reads all the token ids.
            styles[name] = RowwiseParallel(input_layouts=Replicate())
        else:
            styles[name] = RowwiseParallel()
    parallelize_module(model, tp_mesh, styles)


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
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.pipelining import SplitPoint, pipeline

    _refuse_tied_parameters(model)
    split_spec = {name: SplitPoint.BEGINNING for name in tplan.split_spec}
    pipe = pipeline(model, mb_args=tuple(example), split_spec=split_spec)
    pp_rank = mesh["pp"].get_local_rank()
    stage_module = pipe.get_stage_module(pp_rank)
    if tplan.recompute != "none":
        # A traced stage does not call its blocks as modules: its whole forward is recomputed.
        stage_module = checkpoint_wrapper(stage_module)
    _wrap_data_parallel(tplan, stage_module, mesh)
    stage = pipe.build_stage(pp_rank, torch.device("cpu"), group=mesh["pp"].get_group())
    if stage_module is not stage.submod:
        stage.submod = stage_module
    return stage_module, Step(tplan, stage, stage_module, loss_fn, mesh)


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
