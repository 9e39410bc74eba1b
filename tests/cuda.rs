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
    let (code, _, err) = pipecut(
        &[
            "run",
            plan.to_str().unwrap(),
            model,
            "--backend",
            "cuda",
            "--output-dir",
            out_dir.to_str().unwrap(),
        ],
        &[],
    );
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
    let env = [("LD_LIBRARY_PATH".to_string(), dir.display().to_string())];
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
        "reduce_f32",
    ] {
        assert!(kernels.contains(&name), "{name} missing from {kernels:?}");
    }
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
    let (code, out, err) = pipecut(&args, env);
    assert_eq!(code, 0, "{model} on {backend} with {extra:?}: {err}");
    assert!(
        !err.contains("fake lib"),
        "{model}: the fake driver objected: {err}"
    );
    out
}

/// Every fixture, whole and in 2 to 4 stages, against onnxruntime's outputs.
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
            let mut extra = vec!["--microbatches".to_string(), "1".to_string()];
            for input in &inputs {
                extra.extend(["--input".to_string(), input.clone()]);
            }
            let out = run_plan(&plan, &model, "cuda", &extra, &out_dir, env);
            eprintln!("{name} K={stages}:\n{out}");
            assert_close(&format!("{name} K={stages}"), &out_dir, &reference);
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
