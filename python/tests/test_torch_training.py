"""pipecut.torch trains as one process does: real torchrun jobs on CPU with gloo.

Each case runs python/tests/train_equal.py under `torchrun` (2 or 4 processes) and compares
three AdamW steps with the same model trained alone on the whole batch: the losses within 1e-5
relative, every final parameter within 1e-3 of its tensor's largest magnitude (AdamW turns the
float reordering of near-zero gradients into whole-step differences; the figures measured are
in docs/python.md).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import need

HERE = pathlib.Path(__file__).resolve().parent

CASES = [
    # model, pp, dp, tp, zero, recompute
    ("gpt2", 2, 1, 1, 0, "none"),
    ("gpt2", 2, 1, 1, 0, "full"),
    ("gpt2", 2, 2, 1, 0, "none"),
    ("gpt2", 2, 2, 1, 3, "none"),
    ("llama", 2, 1, 1, 0, "selective"),
    ("llama", 2, 2, 1, 3, "full"),
    ("llama", 1, 1, 2, 0, "none"),
    ("llama", 1, 1, 2, 0, "full"),
    ("llama", 1, 2, 2, 3, "none"),
]


def case_id(case):
    model, pp, dp, tp, zero, recompute = case
    return f"{model}-pp{pp}-dp{dp}-tp{tp}-zero{zero}-{recompute}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_training_equals_one_process(case, tmp_path):
    need("torch", "pipecut.torch trains with torch.distributed")
    need("transformers", "the GPT-2 and Llama models come from Hugging Face configs")
    need("onnxscript", "torch.onnx's dynamo exporter")
    model, pp, dp, tp, zero, recompute = case
    out = tmp_path / "result.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={pp * dp * tp}", str(HERE / "train_equal.py"),
        "--model", model, "--pp", str(pp), "--dp", str(dp), "--tp", str(tp),
        "--zero", str(zero), "--recompute", recompute, "--out", str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    print(case_id(case), json.dumps(result))
    assert result["mesh"] == {"pp": pp, "dp": dp, "tp": tp}
    assert result["loss_rel_diff"] <= 1e-5, result
    assert result["param_rel_diff"] <= 1e-3, result
    # Every parameter of the model was compared, on every rank that holds it.
    assert result["params_compared"] == result["model_params"] * dp * tp
    if pp > 1:
        assert len(result["split_spec"]) == pp - 1
    if tp > 1:
        styles = set(result["tensor_parallel"].values())
        assert styles == {"colwise", "rowwise"}, result["tensor_parallel"]
    if recompute != "none":
        assert result["checkpointed_modules"] > 0
        assert result["forwards_per_microbatch"] == 2.0, result
    else:
        assert result["checkpointed_modules"] == 0


def test_a_pipeline_with_tensor_parallelism_is_refused_by_name(tmp_path):
    need("torch", "pipecut.torch trains with torch.distributed")
    need("transformers", "the Llama model comes from a Hugging Face config")
    need("onnxscript", "torch.onnx's dynamo exporter")
    out = tmp_path / "result.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        str(HERE / "train_equal.py"), "--model", "llama", "--pp", "2", "--tp", "2",
        "--out", str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode != 0
    assert "tensor parallelism without a pipeline only" in done.stderr
