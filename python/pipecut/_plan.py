"""Typed views of what the commands write: plans, model summaries, check reports, manifests.

Each object keeps the document it was read from (``raw``) and gives it back unchanged with
``to_json()``; the attributes are the fields a program usually needs, typed. The documents are
described in docs/plan-schema.md (plans) and the commands' ``--help``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class _Document:
    raw: Dict[str, Any]

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The document as JSON, as the command wrote it."""
        return json.dumps(self.raw, indent=indent) + "\n"


@dataclass(frozen=True)
class Device:
    """A GPU of the cluster: its index in the cluster and its profile's name."""

    id: int
    name: str


@dataclass(frozen=True)
class Stage(_Document):
    """One pipeline stage: its nodes, device, memory and times (per micro-batch)."""

    index: int
    device: Device
    nodes: List[str]
    first_node: str
    last_node: str
    param_bytes: int
    activation_bytes: int
    peak_memory_bytes: int
    capacity_bytes: int
    compute_secs: float
    stage_secs: float
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def _from(cls, raw: Mapping[str, Any]) -> "Stage":
        device = raw["device"]
        return cls(
            index=raw["stage"],
            device=Device(device["id"], device["name"]),
            nodes=list(raw["nodes"]),
            first_node=raw["first_node"],
            last_node=raw["last_node"],
            param_bytes=raw["param_bytes"],
            activation_bytes=raw["activation_bytes"],
            peak_memory_bytes=raw["peak_memory_bytes"],
            capacity_bytes=raw["capacity_bytes"],
            compute_secs=raw["compute_secs"],
            stage_secs=raw["stage_secs"],
            raw=dict(raw),
        )


@dataclass(frozen=True)
class TensorParallel:
    """Tensor parallelism of every stage: ``degree`` GPUs per stage (1: none)."""

    degree: int
    sequence_parallel: bool


@dataclass(frozen=True)
class Parallelism(_Document):
    """Data and tensor parallelism around the pipeline (plans from ``plan_cluster``)."""

    global_batch: int
    data_parallel: int
    microbatch_size: int
    placement: str
    replicas: List[List[int]]
    tensor_parallel: TensorParallel
    step_secs: float
    samples_per_sec: float
    bubble_fraction: float
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def _from(cls, raw: Mapping[str, Any]) -> "Parallelism":
        tp = raw.get("tensor_parallel") or {}
        return cls(
            global_batch=raw["global_batch"],
            data_parallel=raw["data_parallel"],
            microbatch_size=raw["microbatch_size"],
            placement=raw["placement"],
            replicas=[list(r) for r in raw["replicas"]],
            tensor_parallel=TensorParallel(
                int(tp.get("degree", 1)), bool(tp.get("sequence_parallel", False))
            ),
            step_secs=raw["step_secs"],
            samples_per_sec=raw["samples_per_sec"],
            bubble_fraction=raw["bubble_fraction"],
            raw=dict(raw),
        )


@dataclass(frozen=True)
class Plan(_Document):
    """A plan: the stages of the pipeline, the request that made it, and its proof.

    ``report`` is the table the command printed (empty for a plan read from a file).
    """

    schema_version: int
    model_file_name: str
    graph_sha256: Optional[str]
    dims: Dict[str, int]
    cluster: str
    mode: str
    schedule: str
    microbatches: int
    recompute: str
    zero_stage: int
    stages: List[Stage]
    bottleneck_secs: float
    lower_bound_secs: float
    status: Dict[str, Any]
    parallelism: Optional[Parallelism]
    raw: Dict[str, Any] = field(repr=False, compare=False)
    report: str = field(default="", repr=False, compare=False)

    @classmethod
    def from_json(cls, text: str, report: str = "") -> "Plan":
        """Reads a plan document (``pipecut partition --out`` or ``plan-cluster --out``).

        Only the fields are read here; ``pipecut.check`` verifies a plan against its model.
        """
        raw = json.loads(text)
        config = raw["config"]
        mode = config.get("mode", {})
        mode_name = mode.get("mode", "inference") if isinstance(mode, dict) else str(mode)
        zero = mode.get("zero", {}) if isinstance(mode, dict) else {}
        summary = raw["summary"]
        parallelism = raw.get("parallelism")
        return cls(
            schema_version=raw["schema_version"],
            model_file_name=raw["model"]["file_name"],
            graph_sha256=raw["model"].get("graph_sha256"),
            dims=dict(raw["model"]["dims"]),
            cluster=raw["cluster"]["description"],
            mode=mode_name,
            schedule=_schedule_name(config["schedule"]),
            microbatches=config["microbatches"],
            recompute=str(mode.get("recompute", "none")) if isinstance(mode, dict) else "none",
            zero_stage=int(zero.get("stage", 0)),
            stages=[Stage._from(s) for s in raw["stages"]],
            bottleneck_secs=summary["bottleneck_secs"],
            lower_bound_secs=summary["lower_bound_secs"],
            status=dict(summary["status"]),
            parallelism=Parallelism._from(parallelism) if parallelism else None,
            raw=raw,
            report=report,
        )

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        """Reads a plan file."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def save(self, path: PathLike) -> None:
        """Writes the plan document to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @property
    def optimal(self) -> bool:
        """Whether the solver proved the cut optimal for its cost model."""
        return self.status.get("kind") == "optimal"


def _schedule_name(schedule: Any) -> str:
    if isinstance(schedule, str):
        return schedule
    if isinstance(schedule, dict):
        # {"interleaved": {"chunks": 2}} and the like: the variant's name.
        return next(iter(schedule))
    return str(schedule)


@dataclass(frozen=True)
class ModelSummary(_Document):
    """What ``pipecut inspect`` reports: size, operators, parameters, FLOPs."""

    graph: str
    nodes: int
    opsets: Dict[str, int]
    op_histogram: Dict[str, int]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, text: str) -> "ModelSummary":
        raw = json.loads(text)
        return cls(
            graph=raw["graph"],
            nodes=raw["nodes"],
            opsets=dict(raw["opsets"]),
            op_histogram=dict(raw["op_histogram"]),
            raw=raw,
        )


@dataclass(frozen=True)
class CheckReport(_Document):
    """A plan that ``pipecut check`` found valid for its model: its figures re-derived."""

    valid: bool
    stages: int
    nodes: int
    bottleneck_secs: float
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, text: str) -> "CheckReport":
        raw = json.loads(text)
        return cls(
            valid=bool(raw["valid"]),
            stages=raw["stages"],
            nodes=raw["nodes"],
            bottleneck_secs=raw["bottleneck_secs"],
            raw=raw,
        )


@dataclass(frozen=True)
class Manifest(_Document):
    """What ``pipecut export`` wrote: one ONNX file per stage (and rank), and their routes."""

    out_dir: str
    files: List[str]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, text: str, out_dir: PathLike) -> "Manifest":
        raw = json.loads(text)
        out = os.fspath(out_dir)
        names = [s.get("file") for s in raw.get("stages", []) if isinstance(s, dict)]
        files = [os.path.join(out, n) for n in names if n]
        return cls(out_dir=out, files=files, raw=raw)
