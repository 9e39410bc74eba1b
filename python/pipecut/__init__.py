"""pipecut: automatic model parallelism for ONNX models and PyTorch modules.

The functions mirror the ``pipecut`` command's subcommands and run the same code in this
process (without the GIL while they work)::

    import pipecut
    plan = pipecut.partition("model.onnx", cluster="1x4xL4", dims={"batch": 8, "seq": 64})
    print(plan.report)                      # the command's table
    pipecut.check(plan, "model.onnx")       # re-derives every figure; raises if invalid
    outputs = pipecut.run(plan, "model.onnx", {"input_ids": ids})   # numpy in, numpy out

``pipecut.torch`` plans a ``torch.nn.Module`` and applies the plan with torch.distributed.
Failures raise ``pipecut.Error`` subclasses: ``NoAnswer`` (the model does not fit, the plan is
invalid), ``Undecided`` (the limit ran out before "fits" or "does not fit" was settled),
``BadInput`` (files, arguments, models), ``InternalError`` (a bug).
"""

from ._native import BadInput, Error, InternalError, NoAnswer, Undecided
from ._native import version as _version
from ._plan import (
    CheckReport,
    Device,
    Manifest,
    ModelSummary,
    Parallelism,
    Plan,
    Stage,
    TensorParallel,
)
from ._api import check, command, export, flags, inspect, partition, plan_cluster, run

__version__ = _version()

__all__ = [
    "BadInput",
    "CheckReport",
    "Device",
    "Error",
    "InternalError",
    "Manifest",
    "ModelSummary",
    "NoAnswer",
    "Parallelism",
    "Plan",
    "Stage",
    "TensorParallel",
    "Undecided",
    "check",
    "command",
    "export",
    "flags",
    "inspect",
    "partition",
    "plan_cluster",
    "run",
]
