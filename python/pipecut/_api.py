"""The commands as Python functions.

Each function runs the ``pipecut`` subcommand of the same name in this process (the extension
module ``pipecut._native``), with the keyword arguments as the command's flags: ``dims={"batch":
8}`` is ``--dim batch=8``, ``time_limit="30s"`` is ``--time-limit 30s``, ``recompute=["none",
"full"]`` is ``--recompute none --recompute full``, ``json=True`` is ``--json``. Every flag of the
command is accepted this way (see ``pipecut <command> --help``); an unknown one raises
``BadInput`` naming it. Files the command writes go to a temporary folder unless the call names
where; the results come back as the typed objects of ``pipecut._plan``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _native
from ._plan import CheckReport, Manifest, ModelSummary, Plan, PathLike

ModelArg = Union[PathLike, bytes]
PlanArg = Union[Plan, PathLike]

# Flags whose values are NAME=VALUE pairs, given in Python as a mapping.
_PAIR_FLAGS = {"dims": "--dim", "values": "--value", "inputs": "--input"}


def command(*args: str) -> str:
    """Runs ``pipecut ARGS...`` in this process and returns what it printed.

    The escape hatch for anything the typed functions do not cover: ``pipecut.command("catalog",
    "--json")``. Raises ``NoAnswer`` (the command's exit code 1), ``BadInput`` (exit code 2) or
    ``InternalError``.
    """
    return _native.command([str(a) for a in args])


def flags(**options: Any) -> List[str]:
    """The command-line flags for keyword arguments (see the module's doc)."""
    out: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        # `--flag=value`, one word: a value that starts with `--` stays the flag's value and
        # can never be read as another flag (`cluster="--out=x"` must not name an output).
        if key in _PAIR_FLAGS:
            for name, item in dict(value).items():
                out.append(f"{_PAIR_FLAGS[key]}={name}={_text(item)}")
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [f"{flag}={_text(item)}" for item in value]
        else:
            out.append(f"{flag}={_text(value)}")
    return out


def _text(value: Any) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


class _Files:
    """A temporary folder for the files a call hands to the command or gets back from it."""

    def __enter__(self) -> "_Files":
        self._dir = tempfile.TemporaryDirectory(prefix="pipecut-")
        self.path = self._dir.name
        return self

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()

    def model(self, model: ModelArg) -> str:
        """A path to the model: the caller's, or its bytes written here."""
        if isinstance(model, (bytes, bytearray, memoryview)):
            path = os.path.join(self.path, "model.onnx")
            with open(path, "wb") as f:
                f.write(model)
            return path
        return os.fspath(model)

    def plan(self, plan: PlanArg) -> str:
        """A path to the plan: the caller's file, or the object written here."""
        if isinstance(plan, Plan):
            path = os.path.join(self.path, "plan.json")
            plan.save(path)
            return path
        return os.fspath(plan)

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)


def inspect(model: ModelArg, **options: Any) -> ModelSummary:
    """Reads a model and summarises it (``pipecut inspect --json``)."""
    with _Files() as files:
        text = command("inspect", files.model(model), "--json", *flags(**options))
    return ModelSummary.from_json(text)


def _planned(name: str, model: ModelArg, out: Optional[PathLike], options: Mapping[str, Any]) -> Plan:
    with _Files() as files:
        path = os.fspath(out) if out is not None else files.join("plan.json")
        report = command(name, files.model(model), "--out", path, *flags(**options))
        with open(path, encoding="utf-8") as f:
            return Plan.from_json(f.read(), report=report)


def partition(model: ModelArg, *, out: Optional[PathLike] = None, **options: Any) -> Plan:
    """Cuts a model into pipeline stages (``pipecut partition``).

    Name the devices with ``cluster="1x4xL4"``, ``devices="A100-80GB,L4"`` or
    ``cluster_file=...``; bind symbolic dims with ``dims={"batch": 8, "seq": 64}``. The solve
    runs without the GIL. ``out`` also keeps the plan in that file.
    """
    return _planned("partition", model, out, options)


def plan_cluster(model: ModelArg, *, out: Optional[PathLike] = None, **options: Any) -> Plan:
    """Plans a whole cluster: pipeline depth, data and tensor parallelism, micro-batching,
    schedule, ZeRO and recomputation (``pipecut plan-cluster``). Needs ``cluster`` and
    ``global_batch``; ``mode="training"`` plans training."""
    return _planned("plan-cluster", model, out, options)


def check(plan: PlanArg, model: ModelArg, **options: Any) -> CheckReport:
    """Verifies a plan against its model (``pipecut check --json``); raises ``NoAnswer`` naming
    what is wrong when the plan is invalid for the model."""
    with _Files() as files:
        text = command("check", files.plan(plan), files.model(model), "--json", *flags(**options))
    return CheckReport.from_json(text)


def export(plan: PlanArg, model: ModelArg, out_dir: PathLike, **options: Any) -> Manifest:
    """Writes one runnable ONNX file per stage (and tensor-parallel rank) and the manifest
    into ``out_dir`` (``pipecut export --json``)."""
    with _Files() as files:
        text = command(
            "export", files.plan(plan), files.model(model), "--out-dir", out_dir, "--json",
            *flags(**options),
        )
    return Manifest.from_json(text, out_dir)


def run(
    plan: PlanArg,
    model: ModelArg,
    inputs: Optional[Mapping[str, Any]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Runs a plan on the CPU reference runtime (``pipecut run``): numpy arrays in, numpy arrays
    out, one per graph output, by name.

    ``inputs`` maps each graph input to an array holding ``microbatches`` micro-batches along
    axis 0; without it the command's seeded random inputs are used.
    """
    import numpy as np

    with _Files() as files:
        paths = {}
        for name, array in (inputs or {}).items():
            path = files.join(f"input_{len(paths)}.npy")
            np.save(path, np.asarray(array), allow_pickle=False)
            paths[name] = path
        model_path = files.model(model)
        report = _run_report(files, files.plan(plan), model_path, paths, options)
        return {
            name: np.load(path, allow_pickle=False) for name, path in report["outputs"].items()
        }


def _run_report(
    files: _Files, plan: str, model: str, inputs: Mapping[str, str], options: Mapping[str, Any]
) -> Dict[str, Any]:
    import json

    out_dir = files.join("outputs")
    text = command(
        "run", plan, model, "--json", "--output-dir", out_dir,
        *flags(inputs=inputs, **options),
    )
    return json.loads(text)
