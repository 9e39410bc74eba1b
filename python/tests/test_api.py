"""The package's functions, through `pip install` and `import`, on the repository's fixtures."""

import json
import threading
import time

import numpy as np
import pytest

import pipecut
from conftest import GPT2_TINY

DIMS = {"batch": 2, "seq": 16}


@pytest.fixture(scope="module")
def plan():
    return pipecut.partition(GPT2_TINY, cluster="1x4xL4", dims=DIMS, stages=2)


def test_partition_returns_a_typed_plan(plan):
    assert isinstance(plan, pipecut.Plan)
    assert len(plan.stages) == 2
    assert all(isinstance(s, pipecut.Stage) for s in plan.stages)
    assert plan.stages[0].first_node == "/transformer/wte/Gather"
    assert sum(len(s.nodes) for s in plan.stages) == 177
    assert plan.dims == DIMS
    assert plan.optimal
    assert "stage" in plan.report and "proven optimal" in plan.report
    # to_json gives back the document the command wrote.
    assert json.loads(plan.to_json()) == plan.raw
    assert pipecut.Plan.from_json(plan.to_json()) == plan


def test_inspect_summarises_the_model():
    summary = pipecut.inspect(GPT2_TINY, dims=DIMS)
    assert summary.nodes == 177
    assert summary.op_histogram["MatMul"] == 33
    assert summary.opsets == {"ai.onnx": 17}


def test_check_accepts_the_plan_and_refuses_an_edited_one(plan, tmp_path):
    report = pipecut.check(plan, GPT2_TINY)
    assert report.valid and report.stages == 2 and report.nodes == 177
    edited = json.loads(plan.to_json())
    moved = edited["stages"][0]["nodes"].pop()
    edited["stages"][1]["nodes"].insert(0, moved)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(edited))
    with pytest.raises(pipecut.NoAnswer):
        pipecut.check(path, GPT2_TINY)


def test_run_takes_and_gives_numpy(plan, tmp_path):
    rng = np.random.default_rng(0)
    microbatches = plan.microbatches
    ids = rng.integers(0, 512, size=(DIMS["batch"] * microbatches, DIMS["seq"]), dtype=np.int64)
    outputs = pipecut.run(plan, GPT2_TINY, {"input_ids": ids})
    logits = outputs["logits"]
    assert logits.shape == (DIMS["batch"] * microbatches, DIMS["seq"], 512)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    # Two stages give what the whole model gives in one stage, bit for bit.
    whole = pipecut.partition(GPT2_TINY, cluster="1x4xL4", dims=DIMS, stages=1)
    np.testing.assert_array_equal(pipecut.run(whole, GPT2_TINY, {"input_ids": ids})["logits"], logits)


def test_export_writes_the_stage_files(plan, tmp_path):
    manifest = pipecut.export(plan, GPT2_TINY, tmp_path / "stages")
    assert [f.rsplit("/", 1)[-1] for f in manifest.files] == ["stage_0.onnx", "stage_1.onnx"]
    assert all((tmp_path / "stages" / name).stat().st_size > 0 for name in ("stage_0.onnx", "stage_1.onnx"))
    assert manifest.raw["model"]["file_name"] == "gpt2_tiny.onnx"


def test_model_bytes_are_accepted():
    summary = pipecut.inspect(GPT2_TINY.read_bytes(), dims=DIMS)
    assert summary.nodes == 177


def test_plan_cluster_plans_training():
    plan = pipecut.plan_cluster(
        GPT2_TINY, cluster="1x4xL4", dims={"seq": 16}, global_batch=8, mode="training",
        pp=2, dp=2, tp=1, microbatch_sizes=[2],
    )
    assert plan.mode == "training" and len(plan.stages) == 2
    assert plan.parallelism.data_parallel == 2 and plan.parallelism.global_batch == 8


def test_errors_are_exceptions_naming_the_problem(tmp_path):
    with pytest.raises(pipecut.BadInput, match="--no-such-flag"):
        pipecut.partition(GPT2_TINY, cluster="1x4xL4", no_such_flag=1)
    with pytest.raises(pipecut.BadInput, match="missing.onnx"):
        pipecut.inspect(tmp_path / "missing.onnx")
    with pytest.raises(pipecut.NoAnswer, match="does not fit"):
        pipecut.partition(GPT2_TINY, cluster="1x1xL4", dims={"batch": 100000, "seq": 64})
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07" + bytes(range(256)) * 4)
    with pytest.raises(pipecut.BadInput):
        pipecut.inspect(garbage)
    not_a_plan = tmp_path / "plan.json"
    not_a_plan.write_text('{"schema_version": 8, "stages": [')
    with pytest.raises(pipecut.Error, match="not JSON"):
        pipecut.check(not_a_plan, GPT2_TINY)
    # Each error is one line, as the command prints it.
    try:
        pipecut.inspect(garbage)
    except pipecut.Error as err:
        assert "\n" not in str(err)


def test_a_value_that_looks_like_a_flag_stays_a_value(tmp_path):
    target = tmp_path / "written.json"
    with pytest.raises(pipecut.BadInput):
        pipecut.partition(GPT2_TINY, cluster=f"--out={target}", dims=DIMS)
    assert not target.exists()


def test_every_error_is_a_pipecut_error():
    assert issubclass(pipecut.NoAnswer, pipecut.Error)
    assert issubclass(pipecut.BadInput, pipecut.Error)
    assert issubclass(pipecut.Undecided, pipecut.Error)
    assert issubclass(pipecut.InternalError, pipecut.Error)


def test_the_gil_is_released_while_a_command_works(plan):
    ticks = []
    done = threading.Event()

    def work():
        pipecut.run(plan, GPT2_TINY, microbatches=256)
        done.set()

    worker = threading.Thread(target=work)
    started = time.perf_counter()
    worker.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    elapsed = time.perf_counter() - started
    # Holding the GIL through the run would leave this thread one or two ticks.
    assert elapsed > 0.05, f"the run took only {elapsed:.3f} s: make it longer"
    assert len(ticks) > 10, f"{len(ticks)} ticks in {elapsed:.3f} s"


def test_the_package_ships_its_types():
    import importlib.resources as resources

    files = resources.files("pipecut")
    assert (files / "py.typed").is_file()
    assert (files / "_native.pyi").is_file()
