//! The CUDA backend: refused clearly without the `cuda` feature; with it, its kernels compile
//! under NVRTC (no GPU needed: the venv of `fixtures/pyenv.sh` carries libnvrtc), and its runs are
//! checked against onnxruntime and against the CPU runtime under a fake CUDA driver and cuBLAS
//! (`tests/fake_cuda/`, built here with g++), which run the project's kernels on the CPU and
//! check what a driver checks. Where a real GPU is present the fixtures run on it too.
//! Tests that need what this machine lacks print why and return.

mod common;
#[cfg(feature = "cuda")]
mod fake_cuda;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Runs `pipecut` with `args`, and `env` added to its environment.
fn pipecut(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pipecut"));
    command.args(args).current_dir(common::root());
    // The dynamic loader reads LD_LIBRARY_PATH when a process starts, so the fake driver's
    // directory is given to a child process rather than set in this one.
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let out = command.output().expect("pipecut runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn partition(dir: &Path, model: &str, stages: usize, dims: &[&str]) -> PathBuf {
    let plan = dir.join(format!("plan{stages}.json"));
    let stage_count = stages.to_string();
    let devices = vec!["L4"; stages].join(",");
    let mut args = vec![
        "partition",
        model,
        "--devices",
        &devices,
        "--stages",
        &stage_count,
        "--microbatches",
        "2",
    ];
    for d in dims {
        args.extend(["--dim", d]);
    }
    let out = plan.to_str().unwrap().to_string();
    args.extend(["--out", &out]);
    let (code, _, err) = pipecut(&args, &[]);
    assert_eq!(code, 0, "{err}");
    plan
}

#[test]
fn devices_reports_the_backend_and_why_no_gpu_is_usable() {
    let (code, out, err) = pipecut(&["devices", "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["cuda_built"], cfg!(feature = "cuda"));
    match report["gpus"].as_u64() {
        Some(n) => assert!(n > 0, "a GPU count is positive"),
        None => {
            let why = report["gpu_problem"].as_str().expect("a reason");
            assert!(!why.is_empty());
            eprintln!("no GPU: {why}");
        }
    }
}

/// Runs a small plan with `--backend cuda`, expecting the refusal (exit 2) to mention every one
/// of `expected`, with no panic and no outputs written.
fn assert_cuda_run_refused(expected: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/mlp.onnx";
    let plan = partition(dir.path(), model, 2, &["batch=4"]);
    let out_dir = dir.path().join("out");
    let (code, _, err) = try_run_plan(&plan, model, "cuda", &[], &out_dir, &[]);
    assert_eq!(code, 2, "{err}");
    for text in expected {
        assert!(err.contains(text), "'{text}' missing from: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out_dir.exists(), "no outputs are written");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn the_cuda_backend_is_refused_clearly_in_a_build_without_it() {
    assert_cuda_run_refused(&["built without CUDA support", "--features cuda"]);
}

/// The directory of the venv's `libnvrtc.so.12` (pip package nvidia-cuda-nvrtc-cu12).
#[cfg(feature = "cuda")]
fn venv_nvrtc() -> Option<PathBuf> {
    let lib = common::root().join(".venv/lib");
    std::fs::read_dir(lib).ok()?.find_map(|python| {
        let dir = python
            .ok()?
            .path()
            .join("site-packages/nvidia/cuda_nvrtc/lib");
        dir.join("libnvrtc.so.12").exists().then_some(dir)
    })
}

#[cfg(feature = "cuda")]
#[test]
fn nvrtc_compiles_every_kernel_the_backend_loads() {
    let Some(dir) = venv_nvrtc() else {
        common::skip(
            // Linux CI installs it (fixtures/pyenv.sh); elsewhere NVRTC has no pip wheel.
            if cfg!(target_os = "linux") {
                common::Need::Nvrtc
            } else {
                common::Need::Platform
            },
            "no libnvrtc in .venv (run `bash fixtures/pyenv.sh`; NVRTC has no macOS build)",
        );
        return;
    };
    // A cache of its own, so NVRTC compiles here, and runs once more to read what it wrote.
    let cache = tempfile::tempdir().unwrap();
    let env = [
        ("LD_LIBRARY_PATH".to_string(), dir.display().to_string()),
        (
            "PIPECUT_KERNEL_CACHE".to_string(),
            cache.path().display().to_string(),
        ),
    ];
    let (code, out, err) = pipecut(&["devices", "--json"], &env);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    let kernels: Vec<&str> = report["kernels"]
        .as_array()
        .unwrap_or_else(|| panic!("NVRTC did not compile the kernels: {report}"))
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    for name in [
        "unary_f32",
        "binary_f32",
        "where_f32",
        "gather_strided_f32",
        "copy_block_f32",
        "gather_axis_f32",
        "softmax_rows_f32",
        "norm_rows_f32",
        "reduce_rows_f32",
        "reduce_f32",
        "im2col_f32",
        "conv_direct_f32",
        "conv_transpose_f32",
        "pool_f32",
        "batch_norm_f32",
        "resize_axis_f32",
        "norm_channels_f32",
        "arg_reduce_f32",
        "cumsum_f32",
        "lrn_f32",
        "pool_nd_f32",
        "gather_rows_f32",
        "scatter_rows_f32",
        "einsum_f32",
        "dft_f32",
        "stft_frames_f32",
        "det_f32",
        "binarize_f32",
        "tree_leaves_f32",
        "tree_aggregate_f32",
        "trilu_f32",
        "top_k_block_f32",
        "top_k_load_f32",
        "top_k_step_f32",
        "top_k_chunk_f32",
        "top_k_store_f32",
        "col2im_f32",
        "one_hot_f32",
        "reduce_blocks_f32",
        "dequant_nbits_f32",
        "fft_load_f64",
        "fft_step_f64",
        "fft_multiply_f64",
        "fft_store_f32",
        "mel_weights_f32",
        "bernoulli_f32",
        "label_encode_f32",
    ] {
        assert!(kernels.contains(&name), "{name} missing from {kernels:?}");
    }
    // A cached image cut short (a full disk, a killed run) is compiled again, not loaded.
    let cached: Vec<PathBuf> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!cached.is_empty(), "NVRTC's output was cached");
    for file in &cached {
        std::fs::write(file, b"// cut").unwrap();
    }
    let (code, again, err) = pipecut(&["devices", "--json"], &env);
    assert_eq!(code, 0, "{err}");
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["kernels"], report["kernels"]);
}

/// Asserts `.npy` outputs within `atol + rtol·|expected|` of onnxruntime's references.
#[cfg(feature = "cuda")]
fn assert_close(what: &str, out_dir: &Path, reference: &Path) {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(reference.join("manifest.json")).expect("manifest"),
    )
    .expect("manifest is JSON");
    // GPU sums run in another order than onnxruntime's CPU ones.
    let (atol, rtol) = (1e-4f32, 1e-3f32);
    for (name, file) in manifest["outputs"].as_object().unwrap() {
        let want = pipecut::runtime::read_npy(&reference.join(file.as_str().unwrap()))
            .expect("reference")
            .tensor;
        let path = std::fs::read_dir(out_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_stem().is_some_and(|s| s.to_string_lossy() == *name))
            .unwrap_or_else(|| panic!("{what}: no output file for '{name}'"));
        let got = pipecut::runtime::read_npy(&path).expect("output").tensor;
        assert_eq!(got.shape(), want.shape(), "{what}: shape of '{name}'");
        let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
        let max_abs = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{what}: '{name}' max |error| {max_abs:.2e}");
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= atol + rtol * b.abs(),
                "{what}: '{name}'[{i}] is {a}, onnxruntime gives {b}"
            );
        }
    }
}

/// The environment of a child process that sees `gpu` through the fake driver, or `None` (the
/// skip recorded) where this machine cannot build it or has no NVRTC.
#[cfg(feature = "cuda")]
fn fake(gpu: fake_cuda::FakeGpu) -> Option<Vec<(String, String)>> {
    let Some(nvrtc) = venv_nvrtc() else {
        common::skip(
            if cfg!(target_os = "linux") {
                common::Need::Nvrtc
            } else {
                common::Need::Platform
            },
            "no libnvrtc in .venv (run `bash fixtures/pyenv.sh`), so the fake driver has no kernels",
        );
        return None;
    };
    match fake_cuda::environment(&gpu, &nvrtc) {
        Ok(env) => Some(env),
        Err(why) => {
            common::skip(common::Need::Toolchain, why);
            None
        }
    }
}

/// A fixture's dims and its reference inputs as `--input` arguments.
#[cfg(feature = "cuda")]
fn reference_run(name: &str) -> (PathBuf, Vec<String>, Vec<String>) {
    let reference = common::root().join("fixtures/reference/outputs").join(name);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(reference.join("manifest.json")).unwrap())
            .unwrap();
    let dims = manifest["dims"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let inputs = manifest["inputs"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, f)| format!("{k}={}", reference.join(f.as_str().unwrap()).display()))
        .collect();
    (reference, dims, inputs)
}

/// A real model's reference dims (`fixtures/reference/real/NAME.json`) as `--dim` values.
#[cfg(feature = "cuda")]
fn real_model_dims(name: &str) -> Vec<String> {
    let reference = common::root().join(format!("fixtures/reference/real/{name}.json"));
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    reference["dims"]
        .as_object()
        .map(|d| d.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default()
}

/// `pipecut run PLAN MODEL --backend BACKEND --output-dir OUT_DIR EXTRA…`: exit code, stdout,
/// stderr.
fn try_run_plan(
    plan: &Path,
    model: &str,
    backend: &str,
    extra: &[String],
    out_dir: &Path,
    env: &[(String, String)],
) -> (i32, String, String) {
    let mut args = vec![
        "run",
        plan.to_str().unwrap(),
        model,
        "--backend",
        backend,
        "--output-dir",
        out_dir.to_str().unwrap(),
    ];
    args.extend(extra.iter().map(String::as_str));
    pipecut(&args, env)
}

/// `pipecut run` of `model` on `backend` with `plan`, into `out_dir`; answers stdout.
#[cfg(feature = "cuda")]
fn run_plan(
    plan: &Path,
    model: &str,
    backend: &str,
    extra: &[String],
    out_dir: &Path,
    env: &[(String, String)],
) -> String {
    let (code, out, err) = try_run_plan(plan, model, backend, extra, out_dir, env);
    assert_eq!(code, 0, "{model} on {backend} with {extra:?}: {err}");
    assert!(
        !err.contains("fake lib"),
        "{model}: the fake driver objected: {err}"
    );
    out
}

/// Asserts that no stage of a `pipecut run --json` report copied a device tensor back to run an
/// op on the host: every float op of the run had a device kernel.
#[cfg(feature = "cuda")]
fn assert_no_host_fallbacks(what: &str, report: &str) {
    let report: Value = serde_json::from_str(report).expect("JSON report");
    for stage in report["stages"].as_array().unwrap() {
        let host_ops = stage["host_ops"].as_object().expect("host_ops");
        assert!(
            host_ops.is_empty(),
            "{what}: stage {} ran float ops on the host: {host_ops:?}",
            stage["stage"]
        );
    }
}

/// Every fixture, whole and in 2 to 4 stages, against onnxruntime's outputs, every float op on
/// the device.
#[cfg(feature = "cuda")]
fn fixtures_match_onnxruntime(env: &[(String, String)], stage_counts: &[usize]) {
    for name in common::FIXTURES {
        let (reference, dims, inputs) = reference_run(name);
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        let model = format!("fixtures/models/{name}.onnx");
        for &stages in stage_counts {
            let dir = tempfile::tempdir().unwrap();
            let plan = partition(dir.path(), &model, stages, &dims);
            let out_dir = dir.path().join("out");
            let mut extra = vec![
                "--microbatches".to_string(),
                "1".to_string(),
                "--json".to_string(),
            ];
            for input in &inputs {
                extra.extend(["--input".to_string(), input.clone()]);
            }
            let out = run_plan(&plan, &model, "cuda", &extra, &out_dir, env);
            let what = format!("{name} K={stages}");
            assert_no_host_fallbacks(&what, &out);
            assert_close(&what, &out_dir, &reference);
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_runs_match_onnxruntime_on_every_fixture_in_one_to_four_stages() {
    if let Some(env) = fake(fake_cuda::FakeGpu::current()) {
        fixtures_match_onnxruntime(&env, &[1, 2, 3, 4]);
    }
    match pipecut::runtime::cuda::device_count() {
        Ok(_) => fixtures_match_onnxruntime(&[], &[1, 2, 3, 4]),
        Err(why) => common::skip(common::Need::Gpu, format!("no real GPU: {why}")),
    }
}

#[cfg(feature = "cuda")]
#[test]
fn without_a_driver_the_cuda_backend_says_why() {
    let Err(why) = pipecut::runtime::cuda::device_count() else {
        common::skip(common::Need::Gpu, "this machine has a GPU");
        return;
    };
    assert_cuda_run_refused(&[&why]);
}

/// `pipecut devices --json` under `env`.
#[cfg(feature = "cuda")]
fn devices_report(env: &[(String, String)]) -> Value {
    let (code, out, err) = pipecut(&["devices", "--json"], env);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).expect("JSON report")
}

/// NVRTC 12.8 writes PTX ISA 8.7, which an R535 driver (CUDA 12.2, ISA 8.2) refuses: the
/// kernels go to the device as a CUBIN for its architecture, which `devices` loads and says.
#[cfg(feature = "cuda")]
#[test]
fn kernels_load_and_run_under_an_r535_driver() {
    for (gpu, cubin) in [
        (fake_cuda::FakeGpu::r535(), "CUBIN for sm_90"),
        (
            fake_cuda::FakeGpu {
                arch: 87,
                ..fake_cuda::FakeGpu::r535()
            },
            "CUBIN for sm_87",
        ),
    ] {
        let Some(env) = fake(gpu) else {
            return;
        };
        let report = devices_report(&env);
        let device = &report["devices"][0];
        assert_eq!(device["kernels"], cubin, "{report}");
        assert!(device["problem"].is_null(), "{report}");
    }
    let Some(env) = fake(fake_cuda::FakeGpu::r535()) else {
        return;
    };
    fixtures_match_onnxruntime(&env, &[1, 2]);
}

/// Only a GPU newer than every architecture NVRTC knows gets PTX; under an old driver that
/// PTX is refused, and `devices` says so before any run.
#[cfg(feature = "cuda")]
#[test]
fn devices_reports_a_gpu_whose_kernels_cannot_load() {
    let gpu = fake_cuda::FakeGpu {
        arch: 130,
        ..fake_cuda::FakeGpu::r535()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    let report = devices_report(&env);
    let problem = report["devices"][0]["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("PTX"), "{report}");
    assert!(report["devices"][0]["kernels"].is_null(), "{report}");
}

/// A machine with a driver and no cuBLAS: `devices` says so, and a run fails with the reason
/// (cudarc panics when it creates a handle without the library).
#[cfg(feature = "cuda")]
#[test]
fn without_cublas_a_run_fails_with_the_reason() {
    let Some(mut env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let fake_dir = fake_cuda::libraries(fake_cuda::Build::Plain).unwrap();
    let driver_only = tempfile::tempdir().unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::os::unix::fs::symlink(fake_dir.join("libcuda.so.1"), driver_only.path().join(name))
            .unwrap();
    }
    let path = &mut env[0].1;
    assert!(path.starts_with(fake_dir.to_str().unwrap()));
    *path = path.replacen(
        fake_dir.to_str().unwrap(),
        driver_only.path().to_str().unwrap(),
        1,
    );
    let report = devices_report(&env);
    assert!(
        report["cublas_problem"]
            .as_str()
            .is_some_and(|why| why.contains("cuBLAS")),
        "{report}"
    );
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/mlp.onnx";
    let plan = partition(dir.path(), model, 1, &["batch=4"]);
    let out_dir = dir.path().join("out");
    let (code, _, err) = try_run_plan(&plan, model, "cuda", &[], &out_dir, &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cuBLAS"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A kernel that faults leaves its context unusable (every later call fails): the run reports
/// the fault, and tearing the stages down (cuBLAS handles included) does not panic over it.
#[cfg(feature = "cuda")]
#[test]
fn a_device_fault_is_reported_and_teardown_does_not_panic() {
    let Some(mut env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    env.push(("PC_FAKE_CUDA_FAULT_AT_LAUNCH".into(), "5".into()));
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let plan = partition(dir.path(), model, 2, &["batch=2", "seq=8"]);
    let out_dir = dir.path().join("out");
    let (code, _, err) = try_run_plan(&plan, model, "cuda", &[], &out_dir, &env);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("fault injected"), "{err}");
    assert!(err.contains("ILLEGAL_ADDRESS"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Compares the `.npy` outputs of two runs of one model.
#[cfg(feature = "cuda")]
fn assert_same_outputs(what: &str, cuda: &Path, cpu: &Path) {
    let mut compared = 0;
    for entry in std::fs::read_dir(cpu).unwrap() {
        let path = entry.unwrap().path();
        let want = pipecut::runtime::read_npy(&path)
            .expect("cpu output")
            .tensor;
        let got = pipecut::runtime::read_npy(&cuda.join(path.file_name().unwrap()))
            .expect("cuda output")
            .tensor;
        assert_eq!(got.shape(), want.shape(), "{what}: {}", path.display());
        for (i, (a, b)) in got.to_f32_vec().iter().zip(want.to_f32_vec()).enumerate() {
            // Equal infinities and two NaNs are the same output too.
            assert!(
                *a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-4 + 1e-3 * b.abs(),
                "{what}: {}[{i}] is {a} on CUDA, {b} on the CPU",
                path.display()
            );
        }
        compared += 1;
    }
    assert!(compared > 0, "{what}: no outputs");
}

/// The largest absolute difference between the float outputs of two runs' directories (the
/// figure docs/cuda.md quotes for folds and fusions on against off).
#[cfg(feature = "cuda")]
fn largest_difference(a: &Path, b: &Path) -> f32 {
    let mut largest = 0f32;
    for entry in std::fs::read_dir(a).unwrap() {
        let path = entry.unwrap().path();
        let x = pipecut::runtime::read_npy(&path).expect("output").tensor;
        let y = pipecut::runtime::read_npy(&b.join(path.file_name().unwrap()))
            .expect("output")
            .tensor;
        for (u, v) in x.to_f32_vec().iter().zip(y.to_f32_vec()) {
            if u != &v {
                largest = largest.max((u - v).abs());
            }
        }
    }
    largest
}

/// Runs every fixture on both backends from the same seeded inputs at `dims`, split into
/// `stage_counts` stages, and compares.
#[cfg(feature = "cuda")]
fn cuda_matches_cpu(env: &[(String, String)], dims: &[&str], stage_counts: &[usize]) {
    for name in common::FIXTURES {
        let model = format!("fixtures/models/{name}.onnx");
        let (_, fixture_dims, _) = reference_run(name);
        let dims: Vec<&str> = dims
            .iter()
            .copied()
            .filter(|d| {
                let key = d.split('=').next().unwrap();
                fixture_dims
                    .iter()
                    .any(|f| f.starts_with(&format!("{key}=")))
            })
            .collect();
        for &stages in stage_counts {
            let dir = tempfile::tempdir().unwrap();
            let plan = partition(dir.path(), &model, stages, &dims);
            let extra = ["--microbatches".to_string(), "2".to_string()];
            let (cuda, cpu) = (dir.path().join("cuda"), dir.path().join("cpu"));
            let json = [&extra[..], &["--json".to_string()]].concat();
            let out = run_plan(&plan, &model, "cuda", &json, &cuda, env);
            run_plan(&plan, &model, "cpu", &extra, &cpu, &[]);
            let what = format!("{name} K={stages} {dims:?}");
            assert_no_host_fallbacks(&what, &out);
            assert_same_outputs(&what, &cuda, &cpu);
        }
    }
}

/// Shapes unlike the fixtures' (batch 3, sequence 11: odd, and unequal, so swapped strides or
/// dims show), in 1 and 3 stages, against the CPU runtime.
#[cfg(feature = "cuda")]
#[test]
fn cuda_matches_the_cpu_runtime_at_odd_shapes() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    cuda_matches_cpu(&env, &["batch=3", "seq=11"], &[1, 3]);
}

/// A real CNN (PaddleOCR's text-direction classifier: convolutions grouped, depthwise, strided
/// and pointwise, batch normalisation, HardSigmoid, both poolings) in 2 stages runs every float
/// op on the device and matches the CPU runtime.
#[cfg(feature = "cuda")]
#[test]
fn a_real_cnn_runs_wholly_on_the_device() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some((name, path)) = common::real_models()
        .into_iter()
        .find(|(name, _)| name == "ppocr_mobile_v2_cls")
    else {
        return;
    };
    let dims = real_model_dims(&name);
    let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
    let model = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plan = partition(dir.path(), model, 2, &dims);
    let extra = ["--microbatches".to_string(), "2".to_string()];
    let (cuda, cpu) = (dir.path().join("cuda"), dir.path().join("cpu"));
    let json = [&extra[..], &["--json".to_string()]].concat();
    let out = run_plan(&plan, model, "cuda", &json, &cuda, &env);
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    assert_no_host_fallbacks(&name, &out);
    assert_same_outputs(&name, &cuda, &cpu);
}

/// Tensors crossing stages stay on the device. The fake driver counts copies by direction
/// (`PC_FAKE_CUDA_STATS`): a 3-stage run downloads exactly what a 1-stage run does, the outputs
/// once per micro-batch, on one GPU and on two (where tensors cross by peer copies); and its
/// stream-order checks (memory used or freed on one stream after another stream's use, with no
/// event between) object to nothing. The outputs match the CPU runtime's. Each GPU's memory pool
/// keeps the plan's activation memory of its stages (peak less parameters).
#[cfg(feature = "cuda")]
#[test]
fn tensors_cross_stages_on_the_device_without_the_host() {
    const MICROBATCHES: usize = 4;
    for devices in [1, 2] {
        let gpu = fake_cuda::FakeGpu {
            devices,
            ..fake_cuda::FakeGpu::current()
        };
        let Some(env) = fake(gpu) else {
            return;
        };
        for name in ["gpt2_tiny", "resnet_tiny"] {
            let model = format!("fixtures/models/{name}.onnx");
            let (_, dims, _) = reference_run(name);
            let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
            let mut downloads = Vec::new();
            for stages in [1, 3] {
                let dir = tempfile::tempdir().unwrap();
                let plan = partition(dir.path(), &model, stages, &dims);
                let stats = dir.path().join("stats.json");
                let mut env = env.clone();
                env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
                let extra = ["--microbatches".to_string(), MICROBATCHES.to_string()];
                let (cuda, cpu) = (dir.path().join("cuda"), dir.path().join("cpu"));
                run_plan(&plan, &model, "cuda", &extra, &cuda, &env);
                run_plan(&plan, &model, "cpu", &extra, &cpu, &[]);
                let what = format!("{name} K={stages} on {devices} GPU(s)");
                assert_same_outputs(&what, &cuda, &cpu);
                let copies: Value =
                    serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
                eprintln!("{what}: copies {copies}");
                let outputs = std::fs::read_dir(&cuda).unwrap().count();
                assert_eq!(
                    copies["device_to_host"],
                    (outputs * MICROBATCHES) as u64,
                    "{what}: only the outputs come back to the host: {copies}"
                );
                if devices == 2 && stages > 1 {
                    assert!(copies["peer"].as_u64().unwrap() > 0, "{what}: {copies}");
                }
                let plan: Value =
                    serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
                let mut pools = vec![0u64; devices.min(stages as u32) as usize];
                for (k, stage) in plan["stages"].as_array().unwrap().iter().enumerate() {
                    let peak = stage["peak_memory_bytes"].as_u64().unwrap();
                    let params = stage["param_bytes"].as_u64().unwrap();
                    let device = k % pools.len();
                    pools[device] += peak - params;
                }
                let thresholds = copies["pool_release_threshold"].as_array().unwrap();
                for (device, bytes) in pools.iter().enumerate() {
                    assert_eq!(thresholds[device], *bytes, "{what}: pool of GPU {device}");
                }
                downloads.push(copies["device_to_host"].clone());
            }
            assert_eq!(downloads[0], downloads[1], "{name} on {devices} GPU(s)");
        }
    }
}

/// Small uploads and large downloads go through page-locked memory (`staging.rs`), so that an
/// upload does not wait for the stream, and the outputs come back on a stream that launches
/// nothing; the outputs are those of the pageable copies and of the CPU runtime.
/// `PIPECUT_CUDA_HOST_TIMES=spans` (and `device`, which also holds the stream before each
/// micro-batch) reports each op's host and device time.
#[cfg(feature = "cuda")]
#[test]
fn copies_go_through_page_locked_memory_and_change_no_output() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let model = "fixtures/models/gpt2_tiny.onnx";
    let (_, dims, _) = reference_run("gpt2_tiny");
    let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let plan = partition(dir.path(), model, 2, &dims);
    let extra = ["--microbatches".to_string(), "3".to_string()];
    let cpu = dir.path().join("cpu");
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    for pinned in ["on", "off"] {
        let stats = dir.path().join(format!("stats.{pinned}.json"));
        let mut env = env.clone();
        env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
        env.push(("PIPECUT_CUDA_PINNED".into(), pinned.into()));
        // `device` is `spans` with the stream held before each micro-batch.
        let spans = if pinned == "on" { "device" } else { "spans" };
        env.push(("PIPECUT_CUDA_HOST_TIMES".into(), spans.into()));
        let out = dir.path().join(pinned);
        let (code, _, err) = try_run_plan(&plan, model, "cuda", &extra, &out, &env);
        assert_eq!(code, 0, "{err}");
        assert_same_outputs(&format!("pinned {pinned}"), &out, &cpu);
        let copies: Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let page_locked = copies["page_locked"].as_u64().unwrap();
        if pinned == "on" {
            // The token ids, the masks and the 1 MB of logits each micro-batch at least.
            assert!(page_locked >= 3 * 2, "{copies}");
        } else {
            assert_eq!(page_locked, 0, "{copies}");
        }
        // The outputs come back on a stream of their own, never on a stage's between its
        // micro-batches (`resident.rs`: a stage does not wait for the device).
        assert_eq!(copies["launches_after_download"], 0, "{copies}");
        assert!(err.contains("host times per micro-batch (3)"), "{err}");
        let matmul = err
            .lines()
            .find(|l| l.trim_start().starts_with("MatMul: host"))
            .unwrap_or_else(|| panic!("no MatMul line: {err}"));
        assert!(matmul.contains(" device "), "{matmul}");
    }
}

/// `PIPECUT_CUDA_TF32`: `conv` lets cuBLAS multiply in TF32 for the convolutions only (one
/// product per Conv group here), `on` for every product of the stage, `off` (the default) for none.
/// The fake cuBLAS counts the products it was allowed TF32 for and computes them in full
/// precision all the same, so the outputs stay the CPU runtime's.
#[cfg(feature = "cuda")]
#[test]
fn tf32_reaches_the_products_it_is_asked_for() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let model = "fixtures/models/resnet_tiny.onnx";
    let (_, dims, _) = reference_run("resnet_tiny");
    let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
    // A Conv of g groups multiplies g times (one product per group).
    let conv_products: u64 = pipecut::onnx::load_model(common::root().join(model))
        .unwrap()
        .graph
        .nodes()
        .filter(|(_, n)| n.op_type == "Conv")
        .map(|(_, n)| match n.attributes.get("group") {
            Some(pipecut::graph::Attribute::Int(g)) => *g as u64,
            _ => 1,
        })
        .sum();
    let dir = tempfile::tempdir().unwrap();
    let plan = partition(dir.path(), model, 1, &dims);
    let extra = ["--microbatches".to_string(), "2".to_string()];
    let cpu = dir.path().join("cpu");
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    let mut products = std::collections::BTreeMap::new();
    for mode in ["off", "conv", "on"] {
        let stats = dir.path().join(format!("stats.{mode}.json"));
        let mut env = env.clone();
        env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
        env.push(("PIPECUT_CUDA_TF32".into(), mode.into()));
        let out = dir.path().join(mode);
        let (code, _, err) = try_run_plan(&plan, model, "cuda", &extra, &out, &env);
        assert_eq!(code, 0, "{err}");
        assert!(!err.contains("fake lib"), "the fake driver objected: {err}");
        assert_same_outputs(&format!("TF32 {mode}"), &out, &cpu);
        let stats: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let count = |name: &str| stats["launches"][name].as_u64().unwrap_or(0);
        products.insert(mode, (count("cublasSgemm"), count("cublasSgemm in TF32")));
    }
    let (all, _) = products["off"];
    assert!(conv_products > 0 && all > 2 * conv_products, "{products:?}");
    assert_eq!(products["off"], (all, 0), "off");
    let conv = (all, 2 * conv_products);
    assert_eq!(
        products["conv"], conv,
        "conv: each group's product, per micro-batch"
    );
    assert_eq!(products["on"], (all, all), "on: every product");
}

/// Launches that folding Conv chains must save at least, read from the graph: a Conv whose
/// output only a BatchNormalization reads, and a Relu alone reading that, take one launch each
/// when run by themselves and share the fold's one epilogue launch.
#[cfg(feature = "cuda")]
fn launches_folds_save(model: &str) -> (u64, u64) {
    let model = pipecut::onnx::load_model(common::root().join(model)).unwrap();
    let graph = &model.graph;
    let sole_reader = |tensor: Option<pipecut::graph::TensorId>, op: &str| {
        let tensor = graph.tensor(tensor?);
        let [reader] = tensor.consumers[..] else {
            return None;
        };
        let node = graph.node(reader);
        (node.op_type == op).then_some(node)
    };
    let (mut folds, mut saved) = (0, 0);
    for (_, conv) in graph.nodes().filter(|(_, n)| n.op_type == "Conv") {
        let Some(norm) = sole_reader(conv.outputs[0], "BatchNormalization") else {
            continue;
        };
        folds += 1;
        saved += sole_reader(norm.outputs[0], "Relu").is_some() as u64;
    }
    (folds, saved)
}

/// Conv chains folded on the device (`conv_fold.rs`, the CPU's folds of `runtime/fuse.rs`), on
/// resnet_tiny and the PP-OCR models: the outputs are the CPU runtime's with and without the folds (`PIPECUT_CUDA_FOLD=off`), in
/// one stage and two; one stage launches no BatchNormalization kernel for a normalisation
/// folded into its Conv, and saves at least the launches the graph's
/// Conv-BatchNormalization-Relu chains predict.
#[cfg(feature = "cuda")]
#[test]
fn conv_chains_fold_into_one_launch_and_change_no_output() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let mut models = vec![(
        "resnet_tiny".to_string(),
        "fixtures/models/resnet_tiny.onnx".into(),
    )];
    let (_, resnet_dims, _) = reference_run("resnet_tiny");
    let mut dims_of = vec![resnet_dims];
    for (name, path) in common::real_models() {
        if name.starts_with("ppocr") {
            dims_of.push(real_model_dims(&name));
            models.push((name, path.display().to_string()));
        }
    }
    for ((name, model), dims) in models.iter().zip(&dims_of) {
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        let (folds, saved) = launches_folds_save(model);
        assert!(
            folds > 0,
            "{name}: no Conv followed by a BatchNormalization"
        );
        for stages in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let plan = partition(dir.path(), model, stages, &dims);
            let extra = ["--microbatches".to_string(), "1".to_string()];
            let cpu = dir.path().join("cpu");
            run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
            let mut launches = std::collections::BTreeMap::new();
            for fold in ["on", "off"] {
                let stats = dir.path().join(format!("stats.{fold}.json"));
                let mut env = env.clone();
                env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
                env.push(("PIPECUT_CUDA_FOLD".into(), fold.into()));
                let out = dir.path().join(fold);
                let json = [&extra[..], &["--json".to_string()]].concat();
                let report = run_plan(&plan, model, "cuda", &json, &out, &env);
                let what = format!("{name} in {stages} stage(s), folds {fold}");
                assert_no_host_fallbacks(&what, &report);
                assert_same_outputs(&what, &out, &cpu);
                let stats: Value =
                    serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
                launches.insert(fold, stats["launches"].clone());
            }
            eprintln!(
                "{name} in {stages} stage(s): folds on and off differ by {:.2e} at most",
                largest_difference(&dir.path().join("on"), &dir.path().join("off"))
            );
            if stages > 1 {
                continue;
            }
            let count = |fold: &str, kernel: &str| launches[fold][kernel].as_u64().unwrap_or(0);
            let total = |fold: &str| total_launches(&launches[fold]);
            assert_eq!(count("off", "conv_epilogue_f32"), 0, "{name}");
            assert_eq!(
                count("on", "batch_norm_f32"),
                count("off", "batch_norm_f32") - folds,
                "{name}"
            );
            eprintln!(
                "{name}: {} launches a micro-batch with the folds, {} without",
                total("on"),
                total("off")
            );
            assert!(
                total("on") + saved <= total("off"),
                "{name}: {} launches with the folds, {} without, {saved} saved at least",
                total("on"),
                total("off")
            );
        }
    }
}

/// Two GPUs of another architecture: stages alternate between them, and every tensor crossing
/// stages moves between devices.
#[cfg(feature = "cuda")]
#[test]
fn cuda_runs_across_two_gpus() {
    let gpu = fake_cuda::FakeGpu {
        devices: 2,
        arch: 80,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    assert_eq!(devices_report(&env)["gpus"], 2);
    cuda_matches_cpu(&env, &["batch=3", "seq=5"], &[2, 4]);
}

/// The fake driver built with AddressSanitizer: a kernel reading or writing outside its
/// buffers, or past its dynamic shared memory, stops the run with a report.
#[cfg(feature = "cuda")]
#[test]
fn cuda_runs_are_clean_under_address_sanitizer() {
    let gpu = fake_cuda::FakeGpu {
        build: fake_cuda::Build::Asan,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    cuda_matches_cpu(&env, &["batch=3", "seq=7"], &[2]);
}

/// Shape and Size answer from the shape; no fixture op copies a device tensor back for them.
#[cfg(feature = "cuda")]
#[test]
fn shape_and_size_do_not_copy_device_tensors() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    for name in ["gpt2_tiny", "llama_tiny", "bert_tiny"] {
        let model = format!("fixtures/models/{name}.onnx");
        let dir = tempfile::tempdir().unwrap();
        let plan = partition(dir.path(), &model, 2, &["batch=2", "seq=8"]);
        let extra = ["--json".to_string()];
        let out = run_plan(&plan, &model, "cuda", &extra, &dir.path().join("out"), &env);
        let report: Value = serde_json::from_str(&out).expect("JSON report");
        for stage in report["stages"].as_array().unwrap() {
            let host_ops = &stage["host_ops"];
            assert!(host_ops.get("Shape").is_none(), "{name}: {host_ops}");
            assert!(host_ops.get("Size").is_none(), "{name}: {host_ops}");
        }
    }
}

/// ONNX backend node cases (written by `fixtures/conformance.py`, the onnx package's own) that
/// take or make float tensors, each on the CUDA backend against the case's reference outputs:
/// the per-op edge cases (transposed and broadcast GEMM operands, negative-step slices,
/// reductions with and without keepdims, uneven splits, 1-D and 3-D windows, …) of every op a
/// float model can hold, whether the device runs it or leaves it to the host. A case the CPU
/// runtime itself cannot plan or run (a data-dependent shape, an unsupported dtype) is another
/// test's business and is left out here.
///
/// The same runs are the op-coverage census of `docs/cuda.md`: per op, how many of these cases
/// hold it and in how many it ran on the host (`host_ops`). The test fails when the table there
/// is not the one it measures; `PIPECUT_CENSUS_BLESS=1` rewrites it.
///
/// While an op is being built, `PIPECUT_CENSUS_OPS=Attention,RotaryEmbedding` runs only the
/// cases holding one of the named ops (and prints their table instead of checking the docs),
/// and `PIPECUT_CENSUS_ASAN=1` runs them under the AddressSanitizer build of the fake driver.
#[cfg(feature = "cuda")]
#[test]
fn onnx_node_cases_with_float_tensors_pass_on_the_cuda_backend() {
    let only_ops: Option<std::collections::BTreeSet<String>> = std::env::var("PIPECUT_CENSUS_OPS")
        .ok()
        .map(|ops| ops.split(',').map(|op| op.trim().to_string()).collect());
    let gpu = if std::env::var_os("PIPECUT_CENSUS_ASAN").is_some() {
        fake_cuda::FakeGpu {
            build: fake_cuda::Build::Asan,
            ..fake_cuda::FakeGpu::current()
        }
    } else {
        fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            "no .venv: the ONNX node cases cannot be written",
        );
        return;
    }
    let cache = node_cases(&python);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("cases.json")).unwrap()).unwrap();
    let cases: Vec<&Value> = manifest["cases"].as_array().unwrap().iter().collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes = std::sync::Mutex::new(Vec::new());
    // Three workers: each case is two short child processes, mostly waiting on start-up.
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let outcome = run_node_case(&cache, case, &env, only_ops.as_ref());
                outcomes.lock().unwrap().push(outcome);
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let mut census = OpCensus::default();
    let (mut passed, mut left_out, mut failures) = (0, 0, Vec::new());
    for outcome in outcomes {
        match outcome {
            NodeCase::NotFloat => {}
            NodeCase::LeftOut => left_out += 1,
            NodeCase::Failed(why) => failures.push(why),
            NodeCase::NotOnCuda(name) => census.not_on_cuda.push(name),
            NodeCase::Passed { ops, host_ops } => {
                passed += 1;
                census.add(&ops, &host_ops);
            }
        }
    }
    eprintln!(
        "ONNX node cases with float tensors on the CUDA backend: {passed} ran, {} failed, \
         {left_out} left out (the CPU runtime cannot plan or run them)",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    if only_ops.is_some() {
        eprintln!("{}", census.table(passed));
        return;
    }
    assert!(passed > 800, "only {passed} cases ran");
    census.check_against_docs(passed);
}

/// What one node case gave on the CUDA backend.
#[cfg(feature = "cuda")]
enum NodeCase {
    /// No float input or output (or an input the case does not store), or none of the ops
    /// `PIPECUT_CENSUS_OPS` names.
    NotFloat,
    /// The CPU runtime cannot plan or run it either.
    LeftOut,
    /// The CPU backend runs it; the CUDA backend fails or differs from the reference: why.
    Failed(String),
    /// The CPU backend runs it, the CUDA backend has no kernel for one of its ops (ops on
    /// sequences, which only the CPU executor holds).
    NotOnCuda(String),
    /// Matched its reference; the model's ops and those that ran on the host.
    Passed {
        ops: std::collections::BTreeSet<String>,
        host_ops: std::collections::BTreeSet<String>,
    },
}

#[cfg(feature = "cuda")]
fn run_node_case(
    cache: &Path,
    case: &Value,
    env: &[(String, String)],
    only_ops: Option<&std::collections::BTreeSet<String>>,
) -> NodeCase {
    let name = case["name"].as_str().unwrap();
    let dir = cache.join("cases").join(name);
    let files = case["inputs"].as_array().unwrap();
    let outputs = case["outputs"].as_array().unwrap();
    if files.iter().any(|i| i["file"].as_str().is_none()) {
        return NodeCase::NotFloat;
    }
    let is_float = |v: &Value| {
        v["file"].as_str().is_some_and(|f| {
            pipecut::runtime::read_npy(&dir.join(f)).is_ok_and(|a| {
                matches!(
                    a.stored,
                    pipecut::graph::DType::F32
                        | pipecut::graph::DType::F16
                        | pipecut::graph::DType::BF16
                        | pipecut::graph::DType::F64
                )
            })
        })
    };
    if !files.iter().chain(outputs).any(is_float) {
        return NodeCase::NotFloat;
    }
    let model_path = dir.join("model.onnx");
    let Ok(model) = pipecut::onnx::load_model(&model_path) else {
        return NodeCase::LeftOut;
    };
    let ops: std::collections::BTreeSet<String> = model
        .graph
        .nodes()
        .map(|(_, n)| n.op_type.clone())
        .collect();
    if only_ops.is_some_and(|only| ops.is_disjoint(only)) {
        return NodeCase::NotFloat;
    }
    let model = model_path.display().to_string();
    let work = tempfile::tempdir().unwrap();
    let plan = work.path().join("plan.json");
    let plan_args = [
        "partition",
        &model,
        "--devices",
        "H100-SXM",
        "--stages",
        "1",
        "--out",
        plan.to_str().unwrap(),
    ];
    if pipecut(&plan_args, &[]).0 != 0 {
        return NodeCase::LeftOut;
    }
    let mut extra = vec!["--microbatches".to_string(), "1".to_string()];
    for input in files {
        let path = dir.join(input["file"].as_str().unwrap());
        extra.extend([
            "--input".into(),
            format!("{}={}", input["name"].as_str().unwrap(), path.display()),
        ]);
    }
    let run = |backend: &str, env: &[(String, String)]| {
        let out_dir = work.path().join(backend);
        let mut args = vec![
            "run",
            plan.to_str().unwrap(),
            &model,
            "--backend",
            backend,
            "--json",
            "--output-dir",
            out_dir.to_str().unwrap(),
        ];
        args.extend(extra.iter().map(String::as_str));
        let (code, out, err) = pipecut(&args, env);
        (code == 0 && !err.contains("fake lib"), out, err, out_dir)
    };
    let (ok, report, err, out_dir) = run("cuda", env);
    if !ok {
        if !run("cpu", &[]).0 {
            return NodeCase::LeftOut;
        }
        // A model that takes or gives sequences runs whole on the CPU only (`run` says so).
        if err.contains("no CPU kernel for op") || err.contains("run whole on the CPU backend only")
        {
            return NodeCase::NotOnCuda(name.to_string());
        }
        return NodeCase::Failed(format!("{name}: {}", err.trim()));
    }
    let (atol, rtol) = (
        case["atol"].as_f64().unwrap_or(1e-7).max(1e-5) as f32,
        case["rtol"].as_f64().unwrap_or(1e-3).max(1e-4) as f32,
    );
    for output in outputs {
        let Some(file) = output["file"].as_str() else {
            continue;
        };
        if !output_matches(&dir, output, &out_dir, (atol, rtol)) {
            // A reference the CPU runtime does not meet either is the CPU's business
            // (tests/conformance.rs lists those cases).
            let cpu_dir = work.path().join("cpu");
            if !run("cpu", &[]).0 || !output_matches(&dir, output, &cpu_dir, (atol, rtol)) {
                return NodeCase::LeftOut;
            }
            return NodeCase::Failed(format!("{name}: output {file} differs from the reference"));
        }
    }
    let report: Value = serde_json::from_str(&report).unwrap();
    let host_ops = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["host_ops"].as_object().unwrap().keys().cloned())
        .collect();
    NodeCase::Passed { ops, host_ops }
}

/// Whether the output `output` of the case in `dir`, written to `out_dir`, meets its reference
/// within the case's tolerances (`np.testing.assert_allclose`, NaN equal to NaN).
#[cfg(feature = "cuda")]
fn output_matches(dir: &Path, output: &Value, out_dir: &Path, (atol, rtol): (f32, f32)) -> bool {
    let want = pipecut::runtime::read_npy(&dir.join(output["file"].as_str().unwrap()))
        .unwrap()
        .tensor;
    let got_path = out_dir.join(format!("{}.npy", output["name"].as_str().unwrap()));
    let Ok(got) = pipecut::runtime::read_npy(&got_path) else {
        return false;
    };
    got.tensor.shape() == want.shape()
        && got
            .tensor
            .to_f32_vec()
            .iter()
            .zip(want.to_f32_vec())
            .all(|(a, b)| (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs())
}

/// Per op: the float node cases that hold it, and those in which it ran on the host.
#[cfg(feature = "cuda")]
#[derive(Default)]
struct OpCensus {
    ops: std::collections::BTreeMap<String, (usize, usize)>,
    not_on_cuda: Vec<String>,
}

#[cfg(feature = "cuda")]
impl OpCensus {
    const DOC: &'static str = "docs/cuda.md";
    const BEGIN: &'static str = "<!-- census:begin -->";
    const END: &'static str = "<!-- census:end -->";

    fn add(
        &mut self,
        ops: &std::collections::BTreeSet<String>,
        host_ops: &std::collections::BTreeSet<String>,
    ) {
        for op in ops.iter().filter(|op| op.as_str() != "Constant") {
            let entry = self.ops.entry(op.clone()).or_default();
            entry.0 += 1;
            entry.1 += host_ops.contains(op) as usize;
        }
    }

    /// The Markdown table: ops run wholly on the device first, then by host cases.
    fn table(&self, cases: usize) -> String {
        let mut rows: Vec<_> = self.ops.iter().collect();
        rows.sort_by_key(|(op, (_, host))| (*host > 0, op.to_string()));
        let device = rows.iter().filter(|(_, (_, host))| *host == 0).count();
        let mut out = format!(
            "{cases} cases, {} ops: {device} ran on the device in every case that holds them, {} \
             ran on the host in some.\n\n| op | cases | on the host in |\n|---|---:|---:|\n",
            rows.len(),
            rows.len() - device
        );
        for (op, (count, host)) in rows {
            out.push_str(&format!("| {op} | {count} | {host} |\n"));
        }
        let mut missing = self.not_on_cuda.clone();
        missing.sort();
        if !missing.is_empty() {
            out.push_str(&format!(
                "\nThe CUDA backend cannot run {} cases the CPU backend runs (ops on sequences, \
                 which only the CPU executor holds): {}.\n",
                missing.len(),
                missing.join(", ")
            ));
        }
        out
    }

    /// Fails when the table in `docs/cuda.md` is not this one (rewrites it under
    /// `PIPECUT_CENSUS_BLESS=1`).
    fn check_against_docs(&self, cases: usize) {
        let path = common::root().join(Self::DOC);
        let doc = std::fs::read_to_string(&path).unwrap();
        let (Some(begin), Some(end)) = (doc.find(Self::BEGIN), doc.find(Self::END)) else {
            panic!("{} lacks the census markers", Self::DOC);
        };
        let table = self.table(cases);
        let current = &doc[begin + Self::BEGIN.len()..end];
        if current.trim() == table.trim() {
            return;
        }
        if std::env::var_os("PIPECUT_CENSUS_BLESS").is_some() {
            let updated = format!(
                "{}\n{table}{}",
                &doc[..begin + Self::BEGIN.len()],
                &doc[end..]
            );
            std::fs::write(&path, updated).unwrap();
            return;
        }
        panic!(
            "the op census in {} is stale; rerun with PIPECUT_CENSUS_BLESS=1 and review the \
             diff. Measured:\n{table}",
            Self::DOC
        );
    }
}

/// The ONNX backend node cases, written once by `fixtures/conformance.py` with `python`.
#[cfg(feature = "cuda")]
fn node_cases(python: &Path) -> PathBuf {
    static WRITTEN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_node_cases");
    if !cache.join("cases.json").exists() {
        let status = Command::new(python)
            .arg(common::root().join("fixtures/conformance.py"))
            .arg("--out")
            .arg(&cache)
            .status()
            .expect("python starts");
        assert!(status.success(), "fixtures/conformance.py failed");
    }
    cache
}

/// The ONNX backend cases of Resize and Upsample (nearest, linear, cubic, antialiased, every
/// coordinate mode, up and down), with their scales, sizes and roi made constants
/// (`tests/fake_cuda/resize_cases.py`) so that a plan can be made: on the CUDA backend each
/// matches the case's reference and runs on the device, except tf_crop_and_resize's
/// extrapolation, which the device leaves to the host.
#[cfg(feature = "cuda")]
#[test]
fn resize_cases_match_their_references_on_the_device() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            "no .venv: the Resize cases cannot be written",
        );
        return;
    }
    let cases = node_cases(&python);
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/resize_cases.py"))
        .arg(&cases)
        .arg(dir.path())
        .status()
        .expect("python starts");
    assert!(status.success(), "resize_cases.py failed");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cases.json")).unwrap())
            .unwrap();
    let (mut on_device, mut failures) = (0, Vec::new());
    let list = manifest["cases"].as_array().unwrap();
    for case in list {
        let name = case["name"].as_str().unwrap();
        let case_dir = dir.path().join(name);
        let model = case_dir.join("model.onnx").display().to_string();
        let plan = case_dir.join("plan.json");
        let plan_args = [
            "partition",
            &model,
            "--devices",
            "H100-SXM",
            "--stages",
            "1",
            "--out",
            plan.to_str().unwrap(),
        ];
        let (code, _, err) = pipecut(&plan_args, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        let input = format!(
            "{}={}",
            case["input"].as_str().unwrap(),
            case_dir.join("x.npy").display()
        );
        let extra = [
            "--microbatches".to_string(),
            "1".to_string(),
            "--json".to_string(),
            "--input".to_string(),
            input,
        ];
        let out_dir = case_dir.join("out");
        let report = run_plan(&plan, &model, "cuda", &extra, &out_dir, &env);
        let report: Value = serde_json::from_str(&report).unwrap();
        if report["stages"][0]["host_ops"]
            .as_object()
            .is_some_and(|ops| ops.is_empty())
        {
            on_device += 1;
        }
        let want = pipecut::runtime::read_npy(&case_dir.join("expected.npy"))
            .unwrap()
            .tensor;
        let output = out_dir.join(format!("{}.npy", case["output"].as_str().unwrap()));
        let got = pipecut::runtime::read_npy(&output).unwrap().tensor;
        let (atol, rtol) = (
            case["atol"].as_f64().unwrap_or(1e-7).max(1e-5) as f32,
            case["rtol"].as_f64().unwrap_or(1e-3).max(1e-4) as f32,
        );
        let close = got.shape() == want.shape()
            && got
                .to_f32_vec()
                .iter()
                .zip(want.to_f32_vec())
                .all(|(a, b)| (a - b).abs() <= atol + rtol * b.abs());
        if !close {
            failures.push(name.to_string());
        }
    }
    eprintln!(
        "Resize cases: {} ran, {on_device} wholly on the device, {} differ",
        list.len(),
        failures.len()
    );
    assert!(list.len() >= 30, "only {} Resize cases", list.len());
    assert!(
        failures.is_empty(),
        "differ from the reference: {failures:?}"
    );
    assert!(
        on_device + 1 >= list.len(),
        "{on_device} of {} on the device",
        list.len()
    );
}

/// `pipecut profile --backend cuda` times every node through the executor `run` uses, and
/// `partition --profile` plans on the file.
#[cfg(feature = "cuda")]
#[test]
fn profile_times_every_node_on_the_cuda_backend() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let times = dir.path().join("times.json");
    let model = "fixtures/models/gpt2_tiny.onnx";
    let args = [
        "profile",
        model,
        "--dim",
        "batch=2",
        "--dim",
        "seq=8",
        "--backend",
        "cuda",
        "--device",
        "H100-SXM",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--out",
        times.to_str().unwrap(),
    ];
    let (code, _, err) = pipecut(&args, &env);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("fake lib"), "{err}");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&times).unwrap()).unwrap();
    assert_eq!(file["measured_with"]["backend"], "pipecut-cuda", "{file}");
    let nodes = file["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().any(|n| n["op"] == "MatMul"),
        "the device's MatMuls are timed: {file}"
    );
    let plan = dir.path().join("plan.json");
    let args = [
        "partition",
        model,
        "--devices",
        "H100-SXM,H100-SXM",
        "--stages",
        "2",
        "--dim",
        "batch=2",
        "--dim",
        "seq=8",
        "--profile",
        times.to_str().unwrap(),
        "--out",
        plan.to_str().unwrap(),
    ];
    let (code, _, err) = pipecut(&args, &[]);
    assert_eq!(code, 0, "{err}");
}

/// Device ops at their edges (models of `tests/fake_cuda/edge_models.py`): Concat parts whose
/// trailing dims differ only at run time and an Expand to a negative dim are refused with the
/// reason (the CPU runtime refuses them too); an Expand to rank 9, past the kernels' 8, runs on
/// the host and matches the CPU runtime.
#[cfg(feature = "cuda")]
#[test]
fn device_ops_refuse_bad_shapes_and_fall_back_past_rank_8() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            "no .venv: the edge-case models cannot be written",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/edge_models.py"))
        .arg(models)
        .status()
        .expect("python starts");
    assert!(status.success(), "edge_models.py failed");
    let plan_for = |name: &str, dims: &[&str]| {
        let plan = models.join(format!("{name}.plan.json"));
        let model = models.join(format!("{name}.onnx"));
        let mut args = vec![
            "partition",
            model.to_str().unwrap(),
            "--devices",
            "H100-SXM",
            "--stages",
            "1",
            "--microbatches",
            "1",
            "--out",
            plan.to_str().unwrap(),
        ];
        for d in dims {
            args.extend(["--dim", d]);
        }
        let (code, _, err) = pipecut(&args, &[]);
        assert_eq!(code, 0, "{name}: {err}");
        (plan, model)
    };
    let inputs = |name: &str, names: &[&str]| -> Vec<String> {
        names
            .iter()
            .flat_map(|input| {
                let file = models.join(format!("{name}.{input}.npy"));
                ["--input".to_string(), format!("{input}={}", file.display())]
            })
            .collect()
    };
    let refused = |name: &str, dims: &[&str], names: &[&str], reason: &str| {
        let (plan, model) = plan_for(name, dims);
        for (backend, env) in [("cpu", &[][..]), ("cuda", &env[..])] {
            let out_dir = models.join(format!("{name}-{backend}"));
            let mut args = vec![
                "run",
                plan.to_str().unwrap(),
                model.to_str().unwrap(),
                "--backend",
                backend,
                "--output-dir",
                out_dir.to_str().unwrap(),
            ];
            let extra = inputs(name, names);
            args.extend(extra.iter().map(String::as_str));
            let (code, _, err) = pipecut(&args, env);
            assert_eq!(code, 2, "{name} on {backend}: {err}");
            assert!(
                !err.contains("panicked") && !err.contains("fake lib"),
                "{err}"
            );
            if backend == "cuda" {
                assert!(err.contains(reason), "{name}: {err}");
            }
        }
    };
    refused(
        "concat_trailing",
        &["b.0=2", "b.1=3"],
        &["a", "flat", "shape"],
        "differ outside axis 0",
    );
    refused(
        "expand_runtime_shape",
        &[],
        &["x", "shape"],
        "negative entry -2",
    );

    let (plan, model) = plan_for("expand_rank9", &["batch=1"]);
    let model = model.to_str().unwrap().to_string();
    let (cuda, cpu) = (models.join("rank9-cuda"), models.join("rank9-cpu"));
    let extra = ["--json".to_string()];
    let out = run_plan(&plan, &model, "cuda", &extra, &cuda, &env);
    run_plan(&plan, &model, "cpu", &[], &cpu, &[]);
    assert_same_outputs("expand_rank9", &cuda, &cpu);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["stages"][0]["host_ops"]["Expand"], 1, "{report}");
}

/// ptxas's registers and spills for every kernel on sm_80 and sm_90 (what `.ci/run` prints):
/// every kernel is listed, and none spills, so a change that makes one spill fails here.
#[cfg(feature = "cuda")]
#[test]
fn no_kernel_spills_registers_on_sm80_or_sm90() {
    let Some(dir) = venv_nvrtc() else {
        common::skip(
            if cfg!(target_os = "linux") {
                common::Need::Nvrtc
            } else {
                common::Need::Platform
            },
            "no libnvrtc in .venv (run `bash fixtures/pyenv.sh`)",
        );
        return;
    };
    let env = [("LD_LIBRARY_PATH".to_string(), dir.display().to_string())];
    let (code, out, err) = pipecut(
        &["devices", "--json", "--ptxas", "80", "--ptxas", "90"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let names = report["kernels"].as_array().unwrap();
    let ptxas = report["ptxas"].as_array().unwrap();
    assert_eq!(ptxas.len(), 2, "{report}");
    for arch in ptxas {
        let kernels = arch["kernels"].as_array().unwrap();
        assert_eq!(kernels.len(), names.len(), "{arch}");
        for k in kernels {
            eprintln!("sm_{} {}", arch["arch"], k);
            assert!(names.contains(&k["kernel"]), "{k}");
            assert!(k["registers"].as_u64().unwrap() > 0, "{k}");
            assert_eq!(k["spill_store_bytes"], 0, "{k}");
            assert_eq!(k["spill_load_bytes"], 0, "{k}");
        }
    }
}

/// A run opens only the GPUs its stages use: a busy second GPU (exclusive-process mode, taken by
/// another job) does not fail a one-stage run, and fails a two-stage one with the reason.
#[cfg(feature = "cuda")]
#[test]
fn a_run_opens_only_the_gpus_its_stages_use() {
    let gpu = fake_cuda::FakeGpu {
        devices: 2,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(mut env) = fake(gpu) else {
        return;
    };
    env.push(("PC_FAKE_CUDA_BUSY_DEVICE".into(), "1".into()));
    let model = "fixtures/models/mlp.onnx";
    let dir = tempfile::tempdir().unwrap();
    let one = partition(dir.path(), model, 1, &["batch=4"]);
    run_plan(&one, model, "cuda", &[], &dir.path().join("one"), &env);
    let two = partition(dir.path(), model, 2, &["batch=4"]);
    let out_dir = dir.path().join("two");
    let (code, _, err) = try_run_plan(&two, model, "cuda", &[], &out_dir, &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("GPU 1") && err.contains("busy"), "{err}");
}

/// A tensor-parallel plan (t = 2 × 2 stages) on the CUDA backend: each rank a thread on its own
/// GPU (4 fake GPUs) or all on one, the collectives run on host copies of their operands; the
/// outputs match the CPU runtime's ranks-as-threads run of the same plan, with and without
/// sequence parallelism, and nothing but the collectives runs on the host.
#[cfg(feature = "cuda")]
#[test]
fn a_tensor_parallel_plan_runs_its_ranks_on_gpus() {
    for devices in [4, 1] {
        let gpu = fake_cuda::FakeGpu {
            devices,
            ..fake_cuda::FakeGpu::current()
        };
        let Some(env) = fake(gpu) else {
            return;
        };
        for sequence_parallel in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let model = "fixtures/models/gpt2_tiny.onnx";
            let plan = dir.path().join("tp.json");
            let plan_arg = plan.to_str().unwrap().to_string();
            let mut args = vec![
                "plan-cluster",
                model,
                "--cluster",
                "1x4xA100-80GB",
                "--dim",
                "seq=16",
                "--global-batch",
                "4",
                "--microbatch-sizes",
                "2",
                "--tp",
                "2",
                "--pp",
                "2",
                "--dp",
                "1",
                "--out",
                &plan_arg,
            ];
            if sequence_parallel {
                args.push("--sequence-parallel");
            }
            let (code, _, err) = pipecut(&args, &[]);
            assert_eq!(code, 0, "{err}");
            let extra = ["--microbatches".to_string(), "2".to_string()];
            let (cuda, cpu) = (dir.path().join("cuda"), dir.path().join("cpu"));
            let json = [&extra[..], &["--json".to_string()]].concat();
            let out = run_plan(&plan, model, "cuda", &json, &cuda, &env);
            run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
            let what = format!("gpt2_tiny t = 2 on {devices} GPUs, SP {sequence_parallel}");
            assert_same_outputs(&what, &cuda, &cpu);
            let report: Value = serde_json::from_str(&out).expect("JSON report");
            let staged = |op: &str| -> u64 {
                report["stages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|s| s["host_ops"][op].as_u64())
                    .sum()
            };
            // 2 micro-batches × 2 ranks × (8 blocks' reductions and the embedding's).
            let reductions = match sequence_parallel {
                false => staged("AllReduce"),
                true => staged("ReduceScatter"),
            };
            assert_eq!(reductions, 2 * 2 * 9, "{what}: {out}");
            assert!(staged("AllGather") >= 2 * 2, "{what}: {out}");
            for stage in report["stages"].as_array().unwrap() {
                let host_ops = stage["host_ops"].as_object().expect("host_ops");
                assert!(
                    host_ops.keys().all(
                        |op| ["AllReduce", "AllGather", "ReduceScatter"].contains(&op.as_str())
                    ),
                    "{what}: {host_ops:?}"
                );
            }
        }
    }
}

/// The venv's python, or `None` (the skip recorded) without the venv.
#[cfg(feature = "cuda")]
fn venv_python(what: &str) -> Option<PathBuf> {
    let python = common::root().join(".venv/bin/python");
    if python.exists() {
        Some(python)
    } else {
        common::skip(common::Need::Venv, format!("no .venv: {what}"));
        None
    }
}

/// Half-precision models (`fixtures/models/half/`, made by onnxconverter-common's float16
/// converter: fp16 weights, activations, and resnet_tiny's fp16 input and output) run every
/// float op on the device in 1 and 2 stages, give the CPU runtime's numbers, and match
/// onnxruntime running the same fp16 model on the CPU.
///
/// Tolerance against onnxruntime: its CPU kernels round every op's result to float16, where
/// pipecut computes in fp32 and rounds only at the model's Casts (as its CPU runtime does), so the
/// two differ by a few float16 roundings: |Δ| ≤ 2⁻¹⁰ + 2⁻⁸·|ref| (a float16 ULP is 2⁻¹⁰·|x|).
/// Measured: 3.2e-4 on gpt2_tiny's logits (|logits| ≤ 0.74), 2e-7 on resnet_tiny's (≤ 8e-4).
#[cfg(feature = "cuda")]
#[test]
fn half_precision_models_run_on_the_device_and_match_onnxruntime() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some(python) = venv_python("no onnxruntime to run the fp16 models") else {
        return;
    };
    for (name, fixture) in [
        ("gpt2_tiny_fp16", "gpt2_tiny"),
        ("resnet_tiny_fp16", "resnet_tiny"),
    ] {
        let model = format!("fixtures/models/half/{name}.onnx");
        let (_, dims, inputs) = reference_run(fixture);
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        let dir = tempfile::tempdir().unwrap();
        let ort = dir.path().join("ort");
        let status = Command::new(&python)
            .arg(common::root().join("tests/fake_cuda/ort_outputs.py"))
            .arg(common::root().join(&model))
            .arg(&ort)
            .args(&inputs)
            .status()
            .expect("python starts");
        assert!(status.success(), "ort_outputs.py failed on {name}");
        let mut extra = vec!["--microbatches".to_string(), "1".to_string()];
        for input in &inputs {
            let input_name = input.split('=').next().unwrap();
            let file = ort.join("inputs").join(format!("{input_name}.npy"));
            extra.extend(["--input".into(), format!("{input_name}={}", file.display())]);
        }
        for stages in [1, 2] {
            let what = format!("{name} K={stages}");
            let plan = partition(dir.path(), &model, stages, &dims);
            let (cuda, cpu) = (
                dir.path().join(format!("cuda{stages}")),
                dir.path().join(format!("cpu{stages}")),
            );
            let json = [&extra[..], &["--json".to_string()]].concat();
            let report = run_plan(&plan, &model, "cuda", &json, &cuda, &env);
            assert_no_host_fallbacks(&what, &report);
            run_plan(&plan, &model, "cpu", &extra, &cpu, &[]);
            assert_same_outputs(&what, &cuda, &cpu);
            for entry in std::fs::read_dir(&ort).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    continue;
                }
                let want = pipecut::runtime::read_npy(&path).unwrap().tensor;
                let got = pipecut::runtime::read_npy(&cuda.join(path.file_name().unwrap()))
                    .unwrap()
                    .tensor;
                assert_eq!(got.shape(), want.shape(), "{what}: {}", path.display());
                let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
                let max_abs = g
                    .iter()
                    .zip(&w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                eprintln!("{what}: max |CUDA − onnxruntime fp16| {max_abs:.2e}");
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!(
                        (a - b).abs() <= 2f32.powi(-10) + 2f32.powi(-8) * b.abs(),
                        "{what}: {}[{i}] is {a} on CUDA, onnxruntime's fp16 run gives {b}",
                        path.display()
                    );
                }
            }
        }
    }
}

/// Device ops where the ONNX node cases do not reach (`tests/fake_cuda/differential_models.py`):
/// RNN, GRU and LSTM in both directions and reverse, layout 1, with sequence_lens, initial
/// states, peepholes, clip, input_forget, linear_before_reset 0 and 1, activations with alphas
/// and betas; Pad in every mode, with crops and axes; MeanVarianceNormalization over trailing and
/// inner axes; 3-D Conv and ConvTranspose. Every output on the device, equal to the CPU
/// runtime's, or to onnxruntime's where the script wrote them (3-D Conv, which the CPU runtime
/// lacks), under the AddressSanitizer build of the fake driver.
#[cfg(feature = "cuda")]
#[test]
fn device_ops_match_the_cpu_runtime_where_node_cases_do_not_reach() {
    models_match_on_the_device("differential_models.py", 14);
}

/// DFT, STFT, Det, Tile, Trilu, the ai.onnx.ml ops and reductions off the trailing axes where
/// their node cases do not reach (`tests/fake_cuda/coverage_models.py`): DFT of odd lengths at
/// batch 3, padded and truncated, onesided, inverse, the axis an attribute and an input, and at
/// 7 (direct), 64 (radix-2), 24, 1,000 and 4,097 (Bluestein) by launch counts; MelWeightMatrix,
/// Bernoulli and LabelEncoder of floats by their kernels' launches; TopK at lines of up to
/// 4,096 (a block's shared-memory sort) and 4,097, 5,000 and 20,000 (chunks in shared memory,
/// larger strides in global memory); MatMulNBits
/// over 4 micro-batches expanding its weight once; STFT of
/// real and complex signals with and without a window; Tile up to a rank-6 strided view; Trilu
/// upper and lower with every sign of k; Compress, CenterCropPad, AffineGrid, Col2Im (strides,
/// pads, dilations) and OneHot; TopK with ties,
/// infinities and NaNs, both outputs; onnxruntime's com.microsoft BiasAdd, Gelu family and
/// SkipLayerNormalization (every output) and its simplified form, its Attention (every mask
/// form, causal, attention_bias, unequal V heads, present), RotaryEmbedding (3-D and 4-D,
/// offset positions, interleaved, partial) and MatMulNBits (2, 4 and 8 bits, every zero-point
/// form, bias); Det of 1 × 1 matrices, singular 3 × 3
/// ones and row swaps, a [2, 3] batch of 6 × 6; TreeEnsemble with three trees and targets under
/// every aggregate function and post transform, NaN features and set membership; Binarizer;
/// ArrayFeatureExtractor of 3-D and 1-D data; reductions over leading and middle axes, which
/// take a block per output when the outputs are few and long (axis 0 of [1000, 3]: the fake
/// driver's launch counts show `reduce_blocks_f32`) and a thread per output otherwise. Every
/// output on the device and equal to the CPU runtime's, under the AddressSanitizer build of the
/// fake driver.
#[cfg(feature = "cuda")]
#[test]
fn more_device_ops_match_the_cpu_runtime_where_node_cases_do_not_reach() {
    models_match_on_the_device("coverage_models.py", 81);
}

/// Integer tensors on the device (`crates/runtime/src/cuda/integers.rs`,
/// `tests/fake_cuda/integer_models.py`): an Expand of int32 and int64 host data to a large shape,
/// compared with a scalar, a vector and another integer device tensor, and magika's Equal of
/// host integers broadcast to a large output, each cast to float, run on the device (the launch
/// counts show the Expand and comparison kernels); int64 values past 2²⁴, not exact in f32,
/// stay on the host and come out right; an integer device tensor read by Shape, ReduceSum,
/// Gather's indices and an integer Add, cast to int32 and bool and sent out, gives the exact
/// integers. Equal to the CPU runtime's outputs, no float op on the host, under the
/// AddressSanitizer build of the fake driver.
#[cfg(feature = "cuda")]
#[test]
fn integer_tensors_on_the_device_match_the_cpu_runtime() {
    models_match_on_the_device("integer_models.py", 5);
}

/// magika's one-hot encoding (an Equal of its int32 bytes, `[B, 2048, 1]`, with the values
/// 0…256, `[1, 1, 257]`, then a Cast to float) runs on the device from the bytes: in 1 and 2
/// stages its outputs are the CPU runtime's, no float op falls back to the host, and a
/// micro-batch uploads what its input needs (the `B × 2048` int32 bytes and the 257 values)
/// where it uploaded the `[B, 2048, 257]` float one-hot (4.2 MB at B = 2). The bytes a
/// micro-batch uploads are the fake driver's count over 3 micro-batches less that over 1,
/// halved: the weights, uploaded once, cancel.
#[cfg(feature = "cuda")]
#[test]
fn magikas_one_hot_is_made_on_the_device() {
    const NAME: &str = "magika_standard_v3_3";
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some((_, path)) = common::real_models().into_iter().find(|(n, _)| n == NAME) else {
        common::skip(
            common::Need::RealModels,
            format!("{NAME} is not in the cache"),
        );
        return;
    };
    let model = path.to_str().unwrap();
    let reference = common::real_reference(NAME);
    let batch = reference.dims[0].1 as usize;
    let dims: Vec<String> = reference
        .dims
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
    const BYTES_PER_ROW: usize = 2048;
    let input_bytes = (batch * BYTES_PER_ROW * 4) as u64;
    let dir = tempfile::tempdir().unwrap();
    for stages in [1, 2] {
        let plan = partition(dir.path(), model, stages, &dims);
        let mut uploaded = Vec::new();
        for microbatches in [1usize, 3] {
            let work = dir.path().join(format!("k{stages}-m{microbatches}"));
            std::fs::create_dir_all(&work).unwrap();
            // Every byte value and the padding token 256, in a spread order.
            let n = microbatches * batch * BYTES_PER_ROW;
            let values = (0..n).map(|i| ((i * 131 + 7) % 257) as i32).collect();
            let data = pipecut::runtime::TensorData::I32(values);
            let shape = vec![microbatches * batch, BYTES_PER_ROW];
            let bytes = pipecut::runtime::HostTensor::new(shape, data).unwrap();
            let input = work.join("bytes.npy");
            std::fs::write(&input, pipecut::runtime::encode_npy(&bytes)).unwrap();
            let stats = work.join("stats.json");
            let mut env = env.clone();
            env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
            let extra = [
                "--microbatches".to_string(),
                microbatches.to_string(),
                "--input".to_string(),
                format!("bytes={}", input.display()),
            ];
            let json = [&extra[..], &["--json".to_string()]].concat();
            let (cuda, cpu) = (work.join("cuda"), work.join("cpu"));
            let what = format!("{NAME} K={stages} m={microbatches}");
            let report = run_plan(&plan, model, "cuda", &json, &cuda, &env);
            run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
            assert_no_host_fallbacks(&what, &report);
            assert_same_outputs(&what, &cuda, &cpu);
            let stats: Value =
                serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
            uploaded.push(stats["host_to_device_bytes"].as_u64().unwrap());
        }
        let per_microbatch = (uploaded[1] - uploaded[0]) / 2;
        eprintln!(
            "{NAME} K={stages}: {per_microbatch} bytes uploaded per micro-batch of {batch} \
             (its input: {input_bytes})"
        );
        let one_hot = input_bytes * 257;
        assert!(
            per_microbatch < 2 * input_bytes && per_microbatch < one_hot / 100,
            "{NAME} K={stages}: {per_microbatch} bytes uploaded per micro-batch"
        );
    }
}

/// Bernoulli on the device (`bernoulli_f32`, the CPU kernel's SplitMix64 draws computed per
/// element from the seed and the position): a seeded node and an unseeded one (seeded by its
/// name) give the same draws in two runs, and the draws follow their probabilities: over 20,000
/// elements of p = 0.3 and 20,000 of p = 0.9 the frequencies of 1 are within 5σ (σ ≈ 0.0032 and
/// 0.0021) of them, p = 0 gives only 0s and p = 1 only 1s, and no value is other than 0 or 1.
#[cfg(feature = "cuda")]
#[test]
fn bernoulli_draws_repeat_and_follow_their_probabilities() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some(python) = venv_python("the Bernoulli models cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper
out = sys.argv[1]
for name, attrs in [("seeded", {"seed": 11.0}), ("unseeded", {})]:
    node = helper.make_node("Bernoulli", ["X"], ["Y"], name=f"draw_{name}", **attrs)
    graph = helper.make_graph([node], name,
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 10000])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 10000])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]),
              f"{out}/{name}.onnx")
p = np.array([0.3, 0.9, 0.0, 1.0], np.float32)[:, None].repeat(10000, 1)
np.save(f"{out}/X.npy", p)
"#;
    let status = Command::new(&python)
        .args(["-c", script])
        .arg(dir.path())
        .status()
        .expect("python starts");
    assert!(status.success());
    let input = format!("X={}", dir.path().join("X.npy").display());
    let extra = ["--input", &input, "--json", "--microbatches", "1"].map(String::from);
    for name in ["seeded", "unseeded"] {
        let model = dir.path().join(format!("{name}.onnx"));
        let model = model.to_str().unwrap();
        let work = dir.path().join(name);
        std::fs::create_dir_all(&work).unwrap();
        let plan = partition(&work, model, 1, &[]);
        let draws: Vec<Vec<f32>> = (0..2)
            .map(|run| {
                let out = work.join(format!("run{run}"));
                let report = run_plan(&plan, model, "cuda", &extra, &out, &env);
                assert_no_host_fallbacks(name, &report);
                let y = pipecut::runtime::read_npy(&out.join("Y.npy")).expect("Y");
                y.tensor.to_f32_vec()
            })
            .collect();
        assert_eq!(
            draws[0], draws[1],
            "{name}: the second run drew other values"
        );
        assert!(draws[0].iter().all(|&v| v == 0.0 || v == 1.0), "{name}");
        let rows: Vec<&[f32]> = draws[0].chunks(10000).collect();
        let frequency = |row: &[f32]| row.iter().sum::<f32>() as f64 / row.len() as f64;
        for (row, p) in rows.iter().zip([0.3f64, 0.9, 0.0, 1.0]) {
            let sigma = (p * (1.0 - p) / 10000.0).sqrt();
            let f = frequency(row);
            assert!(
                (f - p).abs() <= 5.0 * sigma,
                "{name}: frequency {f} of 1s where p = {p}"
            );
        }
    }
}

/// Runs the models `tests/fake_cuda/<script>` writes (at least `at_least`) on the CUDA backend
/// under the AddressSanitizer build of the fake driver and on the CPU runtime (or against the
/// references the script wrote), and asserts equal outputs, no host fallback, and the kernel
/// launch counts in `NAME.launches.json` where the script wrote one.
#[cfg(feature = "cuda")]
fn models_match_on_the_device(script: &str, at_least: usize) {
    // Under the AddressSanitizer build: the fake driver's checks and the sanitizer's, for a few
    // seconds more on these small models.
    let gpu = fake_cuda::FakeGpu {
        build: fake_cuda::Build::Asan,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            "no .venv: the differential models cannot be written",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda").join(script))
        .arg(models)
        .status()
        .expect("python starts");
    assert!(status.success(), "{script} failed");
    let names = std::fs::read_to_string(models.join("models.txt")).unwrap();
    assert!(names.lines().count() >= at_least, "{names}");
    for name in names.lines() {
        let model = models.join(format!("{name}.onnx"));
        let model = model.to_str().unwrap();
        let work = models.join(name);
        let plan = partition(
            &std::fs::create_dir_all(&work)
                .map(|_| work.clone())
                .unwrap(),
            model,
            1,
            &[],
        );
        let input = format!("X={}", models.join(format!("{name}.X.npy")).display());
        // A model may ask for several micro-batches (`NAME.microbatches`), to count what a run
        // does once rather than per micro-batch.
        let microbatches = std::fs::read_to_string(models.join(format!("{name}.microbatches")))
            .map_or_else(|_| "1".to_string(), |m| m.trim().to_string());
        let extra =
            ["--input", &input, "--json", "--microbatches", &microbatches].map(String::from);
        let (cuda, cpu) = (work.join("cuda"), work.join("cpu"));
        let stats = work.join("stats.json");
        let mut env = env.clone();
        env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
        let report = run_plan(&plan, model, "cuda", &extra, &cuda, &env);
        let launches = models.join(format!("{name}.launches.json"));
        if launches.exists() {
            let want: Value = serde_json::from_str(&std::fs::read_to_string(launches).unwrap())
                .expect("launch counts");
            let got: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap())
                .expect("fake driver stats");
            for (kernel, count) in want.as_object().unwrap() {
                let launched = got["launches"][kernel].as_u64().unwrap_or(0);
                assert_eq!(Some(launched), count.as_u64(), "{name}: {kernel} launches");
            }
        }
        let reference = models.join(format!("{name}.reference"));
        if reference.is_dir() {
            assert_same_outputs(name, &cuda, &reference);
        } else {
            run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
            assert_same_outputs(name, &cuda, &cpu);
        }
        assert_no_host_fallbacks(name, &report);
    }
}

/// Casts to float16, bfloat16, float8 (saturating and not) and float4 round on the device to
/// the very bits the CPU runtime gives (ties to even, subnormals, overflow, NaN, infinities,
/// negative zero: `tests/fake_cuda/cast_models.py`), and a mask made by IsNaN, Less, Not and Or
/// stays on the device for the Where and the Cast that read it.
#[cfg(feature = "cuda")]
#[test]
fn device_casts_and_masks_give_the_cpu_runtimes_bits() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some(python) = venv_python("the cast model cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/cast_models.py"))
        .arg(dir.path())
        .status()
        .expect("python starts");
    assert!(status.success(), "cast_models.py failed");
    let x = dir.path().join("x.npy");
    let count = pipecut::runtime::read_npy(&x).unwrap().tensor.len();
    let model = dir.path().join("casts.onnx");
    let model = model.to_str().unwrap();
    let plan = partition(dir.path(), model, 1, &[&format!("n={count}")]);
    let extra = vec![
        "--microbatches".to_string(),
        "1".to_string(),
        "--input".to_string(),
        format!("x={}", x.display()),
    ];
    let (cuda, cpu) = (dir.path().join("cuda"), dir.path().join("cpu"));
    let json = [&extra[..], &["--json".to_string()]].concat();
    let report = run_plan(&plan, model, "cuda", &json, &cuda, &env);
    assert_no_host_fallbacks("casts", &report);
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    let mut compared = 0;
    for entry in std::fs::read_dir(&cpu).unwrap() {
        let path = entry.unwrap().path();
        let want = pipecut::runtime::read_npy(&path)
            .unwrap()
            .tensor
            .to_f32_vec();
        let got = pipecut::runtime::read_npy(&cuda.join(path.file_name().unwrap()))
            .unwrap()
            .tensor
            .to_f32_vec();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{}[{i}]: {a:e} on CUDA, {b:e} on the CPU",
                path.display()
            );
        }
        compared += 1;
    }
    assert_eq!(compared, 7, "one file per output");
}

/// Control flow as an exported decoder carries it (`tests/fake_cuda/control_flow_models.py`):
/// an If on a condition computed on the device whose branches read the enclosing graph's
/// tensors, a Loop carrying a device state and an int64 counter with a scan output (and an If
/// nested in its body, reading the body's and the graph's tensors), a Scan
/// over the sequence axis forwards and backwards. Whole, against onnxruntime; in 2 stages of 2
/// micro-batches (the two take different branches of the If), against the CPU runtime. Every
/// float op runs on the device, inside the bodies too, and the host downloads only the outputs
/// and the conditions (one per If, one per Loop iteration): carried values and scan outputs
/// stay on the device. A body op that falls back to the host is counted, once per iteration.
/// Under the AddressSanitizer build of the fake driver.
#[cfg(feature = "cuda")]
#[test]
fn control_flow_runs_on_the_device_and_matches_the_cpu_runtime() {
    const MICROBATCHES: usize = 2;
    const LOOP_TRIPS: usize = 4;
    let gpu = fake_cuda::FakeGpu {
        build: fake_cuda::Build::Asan,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    let Some(python) = venv_python("the control-flow model cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/control_flow_models.py"))
        .arg(models)
        .status()
        .expect("python starts");
    assert!(status.success(), "control_flow_models.py failed");
    let model = models.join("decoder.onnx");
    let model = model.to_str().unwrap();
    let input = format!("X={}", models.join("decoder.X.npy").display());
    let run = |stages: usize, batch: usize, microbatches: usize| {
        let work = models.join(format!("k{stages}"));
        std::fs::create_dir_all(&work).unwrap();
        let dims = [format!("batch={batch}"), format!("steps.0={LOOP_TRIPS}")];
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        let plan = partition(&work, model, stages, &dims);
        let stats = work.join("stats.json");
        let mut env = env.clone();
        env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
        let extra = [
            "--input",
            &input,
            "--microbatches",
            &microbatches.to_string(),
        ];
        let extra = extra.map(String::from);
        let json = [&extra[..], &["--json".to_string()]].concat();
        let (cuda, cpu) = (work.join("cuda"), work.join("cpu"));
        let report = run_plan(&plan, model, "cuda", &json, &cuda, &env);
        run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
        assert_no_host_fallbacks(&format!("decoder K={stages}"), &report);
        let copies: Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (cuda, cpu, copies)
    };
    let (cuda, _, _) = run(1, 6, 1);
    assert_same_outputs("decoder whole", &cuda, &models.join("decoder.reference"));
    let (cuda, cpu, copies) = run(2, 6 / MICROBATCHES, MICROBATCHES);
    assert_same_outputs("decoder K=2", &cuda, &cpu);
    let outputs = std::fs::read_dir(&cuda).unwrap().count();
    assert_eq!(outputs, 5);
    assert_eq!(
        copies["device_to_host"],
        (MICROBATCHES * (outputs + 1 + LOOP_TRIPS)) as u64,
        "only the outputs and the conditions come back to the host: {copies}"
    );
    // A body op the device does not take (a Cast to int32) falls back, and is counted, once
    // per iteration and micro-batch.
    let model = models.join("truncating_loop.onnx");
    let model = model.to_str().unwrap();
    let work = models.join("truncating");
    std::fs::create_dir_all(&work).unwrap();
    let plan = partition(&work, model, 1, &[&format!("batch={}", 6 / MICROBATCHES)]);
    let input = format!("X={}", models.join("truncating_loop.X.npy").display());
    let extra = [
        "--input",
        &input,
        "--microbatches",
        &MICROBATCHES.to_string(),
    ];
    let extra = extra.map(String::from);
    let json = [&extra[..], &["--json".to_string()]].concat();
    let (cuda, cpu) = (work.join("cuda"), work.join("cpu"));
    let report = run_plan(&plan, model, "cuda", &json, &cuda, &env);
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    assert_same_outputs("truncating loop", &cuda, &cpu);
    let report: Value = serde_json::from_str(&report).unwrap();
    let host_ops = &report["stages"][0]["host_ops"];
    assert_eq!(
        *host_ops,
        serde_json::json!({ "Cast": MICROBATCHES * LOOP_TRIPS }),
        "{report}"
    );
}

/// The element-wise fast path (`crates/runtime/src/cuda/flat.rs`: same-shaped operands, scalars and
/// trailing rows read with 32-bit indices) and the general kernels give the same bits on binary
/// ops, comparisons and Where, at odd sizes, over many blocks
/// (`tests/fake_cuda/elementwise_models.py`), and both the CPU runtime's numbers. The fake
/// driver's launch counts show which path ran: with the fast path on, the general kernels run
/// only for the broadcasts in the middle of a shape; with `PIPECUT_CUDA_FLAT=off`, never a
/// fast one. Under the AddressSanitizer build of the fake driver.
#[cfg(feature = "cuda")]
#[test]
fn elementwise_fast_path_and_general_kernels_agree() {
    let gpu = fake_cuda::FakeGpu {
        build: fake_cuda::Build::Asan,
        ..fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    let Some(python) = venv_python("the element-wise model cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/elementwise_models.py"))
        .arg(work)
        .status()
        .expect("python starts");
    assert!(status.success(), "elementwise_models.py failed");
    let model = work.join("elementwise.onnx");
    let model = model.to_str().unwrap();
    let plan = partition(work, model, 1, &[]);
    let mut extra = vec!["--microbatches".to_string(), "1".to_string()];
    for input in ["X", "Z"] {
        let path = work.join(format!("elementwise.{input}.npy"));
        extra.extend(["--input".to_string(), format!("{input}={}", path.display())]);
    }
    let run = |flat: &str| {
        let stats = work.join(format!("stats-{flat}.json"));
        let mut env = env.clone();
        env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
        env.push(("PIPECUT_CUDA_FLAT".into(), flat.into()));
        let out = work.join(format!("cuda-{flat}"));
        let json = [&extra[..], &["--json".to_string()]].concat();
        let report = run_plan(&plan, model, "cuda", &json, &out, &env);
        assert_no_host_fallbacks(&format!("PIPECUT_CUDA_FLAT={flat}"), &report);
        let stats: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (out, stats["launches"].clone())
    };
    let (fast, fast_launches) = run("on");
    let (general, general_launches) = run("off");
    let cpu = work.join("cpu");
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    assert_same_outputs("fast path", &fast, &cpu);
    assert_same_outputs("general kernels", &general, &cpu);
    for entry in std::fs::read_dir(&general).unwrap() {
        let path = entry.unwrap().path();
        let read = |p: &Path| pipecut::runtime::read_npy(p).unwrap().tensor.to_f32_vec();
        let (want, got) = (read(&path), read(&fast.join(path.file_name().unwrap())));
        let same_bits = want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same_bits && want.len() == got.len(), "{}", path.display());
    }
    eprintln!("launches with the fast path: {fast_launches}\nwithout: {general_launches}");
    // (general kernel, fast kernel, ops, of which the general kernel keeps): of the 14 binary
    // ops, Add of X and a [5, 1] column and Min of a [3, 1, 7] and a [5, 7] (broadcasts in the
    // middle); of the 3 comparisons, Greater of X and the column; of the two Wheres on a device
    // mask and of the two on a host boolean tensor, the one whose condition is a [5, 1] column.
    let expected = [
        ("binary_f32", "binary_flat_f32", 14, 2),
        ("mask_binary_f32", "mask_binary_flat_f32", 3, 1),
        ("where_mask_f32", "where_mask_flat_f32", 2, 1),
        ("where_f32", "where_flat_f32", 2, 1),
    ];
    let count = |launches: &Value, kernel: &str| launches[kernel].as_u64().unwrap_or(0);
    for (general, flat, ops, kept) in expected {
        let fast = (count(&fast_launches, general), count(&fast_launches, flat));
        assert_eq!(fast, (kept, ops - kept), "{general}: {fast_launches}");
        let off = (
            count(&general_launches, general),
            count(&general_launches, flat),
        );
        assert_eq!(off, (ops, 0), "{general}: {general_launches}");
    }
}

/// onnxruntime's com.microsoft Attention, RotaryEmbedding and MatMulNBits cases
/// (`fixtures/node_cases.py`, references from onnxruntime's CPU provider; masks and positions
/// fed as integer graph inputs) on the CUDA backend: every output equal to onnxruntime's, and
/// every float op on the device.
#[cfg(feature = "cuda")]
#[test]
fn microsoft_node_cases_match_onnxruntime_on_the_device() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some(python) = venv_python("the com.microsoft node cases cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(&python)
        .arg(common::root().join("fixtures/node_cases.py"))
        .arg(dir.path())
        .args([
            "com.microsoft:Attention",
            "com.microsoft:RotaryEmbedding",
            "com.microsoft:MatMulNBits",
        ])
        .output()
        .expect("python starts");
    assert!(output.status.success(), "node_cases.py failed");
    let names = String::from_utf8(output.stdout).unwrap();
    assert!(names.lines().count() >= 11, "{names}");
    for name in names.lines() {
        let case = dir.path().join(name);
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("manifest.json")).unwrap())
                .unwrap();
        let model = case.join("model.onnx");
        let model = model.to_str().unwrap();
        let plan = partition(&case, model, 1, &[]);
        let mut extra: Vec<String> = ["--json", "--microbatches", "1"].map(String::from).into();
        for (input, file) in manifest["inputs"].as_object().unwrap() {
            let path = case.join(file.as_str().unwrap());
            extra.extend(["--input".into(), format!("{input}={}", path.display())]);
        }
        let reference = case.join("reference");
        std::fs::create_dir_all(&reference).unwrap();
        for (out, file) in manifest["outputs"].as_object().unwrap() {
            let from = case.join(file.as_str().unwrap());
            std::fs::copy(from, reference.join(format!("{out}.npy"))).unwrap();
        }
        let cuda = case.join("cuda");
        let report = run_plan(&plan, model, "cuda", &extra, &cuda, &env);
        assert_same_outputs(name, &cuda, &reference);
        assert_no_host_fallbacks(name, &report);
    }
}

/// Launches a run of `model` made, by kernel (the fake driver's `PC_FAKE_CUDA_STATS`, cuBLAS
/// calls as `cublasSgemm`), with fusion on or off; its outputs go to `out`.
#[cfg(feature = "cuda")]
fn launches_with_fusion(
    env: &[(String, String)],
    (plan, model): (&Path, &str),
    extra: &[String],
    fuse: &str,
    out: &Path,
) -> Value {
    launches_and_steps(env, (plan, model), extra, fuse, out).0
}

/// [`launches_with_fusion`], and the steps the host ran per micro-batch, all stages together
/// (`PIPECUT_CUDA_HOST_TIMES`'s count: a fused step is one).
#[cfg(feature = "cuda")]
fn launches_and_steps(
    env: &[(String, String)],
    (plan, model): (&Path, &str),
    extra: &[String],
    fuse: &str,
    out: &Path,
) -> (Value, f64) {
    let stats = out.with_extension("stats.json");
    let mut env = env.to_vec();
    env.push(("PC_FAKE_CUDA_STATS".into(), stats.display().to_string()));
    env.push(("PIPECUT_CUDA_FUSE".into(), fuse.into()));
    env.push(("PIPECUT_CUDA_HOST_TIMES".into(), "1".into()));
    let json = [extra, &["--json".to_string()]].concat();
    let (code, report, err) = try_run_plan(plan, model, "cuda", &json, out, &env);
    assert_eq!(code, 0, "{model} PIPECUT_CUDA_FUSE={fuse}: {err}");
    assert!(
        !err.contains("fake lib"),
        "{model}: the fake driver objected: {err}"
    );
    assert_no_host_fallbacks(&format!("{model} PIPECUT_CUDA_FUSE={fuse}"), &report);
    let steps = err
        .lines()
        .find_map(|line| {
            let rest = line.split(" us in ").nth(1)?;
            rest.strip_suffix(" steps")?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("no step count in: {err}"));
    let stats: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    (stats["launches"].clone(), steps)
}

/// All launches (kernels and cuBLAS calls) in a `launches` object.
#[cfg(feature = "cuda")]
fn total_launches(launches: &Value) -> u64 {
    launches
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// Launches per micro-batch the fused steps of `crates/runtime/src/cuda/fuse.rs` must save on a
/// one-stage run of `model`, from its graph: each Gelu written out (an Erf read by `Add 1`, then
/// the two Muls; with the Div before it, five nodes) saves 4, one more when a bias Add made its
/// input; each written-out norm (a Sqrt of `Add ε` of a ReduceMean) saves 8 when a Sub centred
/// it (layer norm: 9 nodes) and 6 otherwise (RMS norm: 7 nodes); a Sigmoid read only by a Mul
/// by its input (SiLU) saves 1, and 1 more when that product is read only by a Mul by another
/// tensor (a gate); a MatMul whose bias sum is read only by an Add of another tensor saves the
/// Add's launch, and a MatMul of two activations read only by a Div or Mul by a scalar
/// (attention's scale) the Div's or Mul's.
#[cfg(feature = "cuda")]
fn launches_fusion_saves(model: &Path) -> u64 {
    let model = pipecut::onnx::load_model(model).expect("model loads");
    let graph = &model.graph;
    let made_by = |t: pipecut::graph::TensorId| graph.tensor(t).producer().map(|p| graph.node(p));
    let input = |node: &pipecut::graph::Node, i: usize| node.inputs.get(i).copied().flatten();
    let is_param = |t: pipecut::graph::TensorId| graph.tensor(t).param().is_some();
    let sole_reader = |t: pipecut::graph::TensorId| match graph.tensor(t).consumers.as_slice() {
        [reader] => Some(graph.node(*reader)),
        _ => None,
    };
    let mut saved = 0;
    for (_, node) in graph.nodes() {
        match node.op_type.as_str() {
            "Erf" => {
                let div = input(node, 0).and_then(made_by);
                let biased = div
                    .and_then(|d| input(d, 0))
                    .and_then(made_by)
                    .is_some_and(|a| {
                        a.op_type == "Add" && a.inputs.iter().flatten().any(|&t| is_param(t))
                    });
                saved += 4 + u64::from(biased);
            }
            "Sqrt" => {
                let mean = input(node, 0)
                    .and_then(made_by)
                    .filter(|a| a.op_type == "Add")
                    .and_then(|a| input(a, 0))
                    .and_then(made_by);
                let Some(mean) = mean.filter(|m| m.op_type == "ReduceMean") else {
                    continue;
                };
                let squared = input(mean, 0).and_then(made_by);
                let centred = squared
                    .and_then(|p| input(p, 0))
                    .and_then(made_by)
                    .is_some_and(|s| s.op_type == "Sub");
                saved += if centred { 8 } else { 6 };
            }
            "Sigmoid" => {
                let times_input = node.outputs[0]
                    .and_then(sole_reader)
                    .filter(|m| m.op_type == "Mul" && m.inputs.contains(&node.inputs[0]));
                let gated = times_input
                    .and_then(|m| m.outputs[0])
                    .and_then(sole_reader)
                    .is_some_and(|g| {
                        g.op_type == "Mul" && g.inputs.iter().flatten().all(|&t| !is_param(t))
                    });
                saved += u64::from(times_input.is_some()) + u64::from(gated);
            }
            "MatMul" if node.inputs.iter().flatten().all(|&t| !is_param(t)) => {
                let scaled = node.outputs[0].and_then(sole_reader).is_some_and(|s| {
                    matches!(s.op_type.as_str(), "Div" | "Mul")
                        && s.inputs.iter().flatten().any(|&t| {
                            graph.tensor(t).shape.as_ref().is_some_and(|d| d.len() <= 1)
                                && is_param(t)
                        })
                });
                saved += u64::from(scaled);
            }
            "MatMul" => {
                let bias_add = node.outputs[0].and_then(sole_reader).filter(|a| {
                    a.op_type == "Add" && a.inputs.iter().flatten().any(|&t| is_param(t))
                });
                let residual = bias_add
                    .and_then(|a| a.outputs[0])
                    .and_then(sole_reader)
                    .is_some_and(|r| {
                        r.op_type == "Add" && r.inputs.iter().flatten().all(|&t| !is_param(t))
                    });
                saved += u64::from(residual);
            }
            _ => {}
        }
    }
    saved
}

/// Fused transformer steps (`crates/runtime/src/cuda/fuse.rs`): bert_tiny, gpt2_tiny, llama_tiny and
/// the real MiniLM (when cached), whole and in 2 stages, give the CPU runtime's outputs with
/// fusion on and off (`PIPECUT_CUDA_FUSE=off`), and fusion saves at least the launches per
/// micro-batch the graphs' written-out norms, Gelus and biased MatMuls predict on one stage
/// (fewer in 2 stages, where a boundary may keep nodes apart). `PIPECUT_FUSE_ASAN=1` runs it
/// under the AddressSanitizer build of the fake driver (8–15 minutes on a 2-core VM).
#[cfg(feature = "cuda")]
#[test]
fn fused_transformer_steps_match_the_cpu_runtime_with_fewer_launches() {
    let gpu = if std::env::var_os("PIPECUT_FUSE_ASAN").is_some() {
        fake_cuda::FakeGpu {
            build: fake_cuda::Build::Asan,
            ..fake_cuda::FakeGpu::current()
        }
    } else {
        fake_cuda::FakeGpu::current()
    };
    let Some(env) = fake(gpu) else {
        return;
    };
    const MICROBATCHES: u64 = 2;
    let mut models: Vec<(String, PathBuf)> = ["bert_tiny", "gpt2_tiny", "llama_tiny"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                common::root().join(format!("fixtures/models/{n}.onnx")),
            )
        })
        .collect();
    models.extend(
        common::real_models()
            .into_iter()
            .filter(|(name, _)| name.starts_with("paraphrase_minilm")),
    );
    for (name, path) in models {
        let predicted = launches_fusion_saves(&path);
        assert!(predicted > 0, "{name}: nothing to fuse");
        let model = path.to_str().unwrap();
        let dims: Vec<String> = if path.starts_with(common::root().join("fixtures/models")) {
            reference_run(&name).1
        } else {
            real_model_dims(&name)
        };
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        for stages in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let plan = partition(dir.path(), model, stages, &dims);
            let extra = ["--microbatches".to_string(), MICROBATCHES.to_string()];
            let cpu = dir.path().join("cpu");
            run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
            let run = |fuse: &str| {
                let out = dir.path().join(format!("cuda-{fuse}"));
                let counts = launches_and_steps(&env, (&plan, model), &extra, fuse, &out);
                assert_same_outputs(&format!("{name} K={stages} fusion {fuse}"), &out, &cpu);
                counts
            };
            let ((fused, steps_on), (unfused, steps_off)) = (run("on"), run("off"));
            let (on, off) = (total_launches(&fused), total_launches(&unfused));
            let difference =
                largest_difference(&dir.path().join("cuda-on"), &dir.path().join("cuda-off"));
            eprintln!(
                "{name} K={stages}: launches per micro-batch {} fused, {} unfused (predicted \
                 saving on one stage {predicted}); host steps per micro-batch {steps_on} fused, \
                 {steps_off} unfused; fused and unfused outputs differ by {difference:.2e} at \
                 most; fused launches: {fused}",
                on as f64 / MICROBATCHES as f64,
                off as f64 / MICROBATCHES as f64,
            );
            assert!(
                steps_on < steps_off,
                "{name} K={stages}: {steps_on} steps fused"
            );
            let saved = off.saturating_sub(on);
            if stages == 1 {
                assert!(
                    saved >= predicted * MICROBATCHES,
                    "{name}: fusion saved {saved} launches, the graph predicts {predicted} per \
                     micro-batch"
                );
            } else {
                assert!(
                    on < off,
                    "{name} K={stages}: {on} launches fused, {off} unfused"
                );
            }
        }
    }
}

/// A fusion stays inside a stage and swallows no tensor read elsewhere
/// (`tests/fake_cuda/fusion_models.py`): a written-out layer norm, RMS norm and Gelu in a row,
/// planned in 1 to 4 stages, fuse exactly where a stage holds every node a pattern needs (the
/// plan says which; the input's last reader, between the layer norm's nodes, does not free it
/// before the fused step reads it), and the same patterns (and a MatMul with its bias Add) with
/// an intermediate that is also a graph output or read by another node do not fuse at all (nor
/// does a Gelu whose one-element bias the fused kernel declines at run time: its fused step
/// runs the nodes one by one); every run gives the CPU runtime's outputs.
#[cfg(feature = "cuda")]
#[test]
fn fusions_stop_at_stage_boundaries_and_at_tensors_read_elsewhere() {
    let Some(env) = fake(fake_cuda::FakeGpu::current()) else {
        return;
    };
    let Some(python) = venv_python("the fusion models cannot be written") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let status = Command::new(&python)
        .arg(common::root().join("tests/fake_cuda/fusion_models.py"))
        .arg(work)
        .status()
        .expect("python starts");
    assert!(status.success(), "fusion_models.py failed");
    let input = format!("X={}", work.join("X.npy").display());
    let extra = [
        "--microbatches".to_string(),
        "1".to_string(),
        "--input".to_string(),
        input,
    ];
    let patterns: Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("fusion_chain.json")).unwrap())
            .unwrap();
    let count = |launches: &Value, kernel: &str| launches[kernel].as_u64().unwrap_or(0);
    let mut split = 0;
    for stages in [1, 2, 3, 4] {
        let model = work.join("fusion_chain.onnx");
        let model = model.to_str().unwrap();
        let plan = partition(work, model, stages, &[]);
        let planned: Value =
            serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
        let stage_of = |node: &str| {
            planned["stages"]
                .as_array()
                .unwrap()
                .iter()
                .position(|s| s["nodes"].as_array().unwrap().iter().any(|n| n == node))
                .unwrap()
        };
        let cpu = work.join(format!("cpu-{stages}"));
        run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
        let out = work.join(format!("cuda-{stages}"));
        let launches = launches_with_fusion(&env, (&plan, model), &extra, "on", &out);
        assert_same_outputs(&format!("fusion_chain K={stages}"), &out, &cpu);
        for (kernel, groups) in patterns.as_object().unwrap() {
            let whole = groups
                .as_array()
                .unwrap()
                .iter()
                .filter(|nodes| {
                    let mut stages = nodes
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| stage_of(n.as_str().unwrap()));
                    let first = stages.next();
                    stages.all(|s| Some(s) == first)
                })
                .count() as u64;
            split += groups.as_array().unwrap().len() as u64 - whole;
            assert_eq!(
                count(&launches, kernel),
                whole,
                "K={stages}: {kernel} in {launches}"
            );
        }
    }
    assert!(
        split > 0,
        "no plan split a pattern: the boundary went untested"
    );

    let model = work.join("fusion_leaks.onnx");
    let model = model.to_str().unwrap();
    let plan = partition(work, model, 1, &[]);
    let cpu = work.join("cpu-leaks");
    run_plan(&plan, model, "cpu", &extra, &cpu, &[]);
    let runs = ["on", "off"].map(|fuse| {
        let out = work.join(format!("cuda-leaks-{fuse}"));
        let launches = launches_with_fusion(&env, (&plan, model), &extra, fuse, &out);
        assert_same_outputs(&format!("fusion_leaks fusion {fuse}"), &out, &cpu);
        launches
    });
    for kernel in ["norm_rows_f32", "fused_gelu_f32", "bias_rows_f32"] {
        assert_eq!(count(&runs[0], kernel), 0, "{kernel}: {}", runs[0]);
    }
    assert_eq!(
        runs[0], runs[1],
        "fusion changed the launches of a graph it cannot fuse"
    );
}
