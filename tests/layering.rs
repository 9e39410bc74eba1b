//! The workspace's layering, held by its dependency graph (docs/architecture.md): each crate
//! may depend only on the crates of the phases before it, the planner on no runtime, kernel,
//! codec, BLAS or GPU binding, and nothing on the CLI. Read from `cargo tree`, which resolves
//! each crate's features as building that crate alone would.

use std::collections::BTreeSet;
use std::process::Command;

mod common;

/// Every package `krate` compiles with, through normal (not dev or build) dependencies.
fn normal_dependencies(krate: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(common::root())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", krate])
        .output()
        .expect("cargo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree -p {krate}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != krate)
        .map(str::to_string)
        .collect()
}

/// What no build of the planner may compile: kernels, codecs, BLAS, GPU and MPI bindings.
const RUNTIME_ONLY: &[&str] = &[
    "gemm",
    "gemm-common",
    "image",
    "zune-jpeg",
    "png",
    "cudarc",
    "mpi",
    "rayon",
];

fn assert_none(krate: &str, forbidden: &[&str]) {
    let deps = normal_dependencies(krate);
    let found: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(found.is_empty(), "{krate} depends on {found:?}");
}

#[test]
fn each_phase_depends_only_on_the_phases_before_it() {
    let order = [
        "pipecut-ir",
        "pipecut-cost",
        "pipecut-planner",
        "pipecut-runtime",
        "pipecut-export",
    ];
    for (position, krate) in order.iter().enumerate() {
        let later: Vec<&str> = order[position + 1..]
            .iter()
            .copied()
            .chain(["pipecut-distributed", "pipecut"])
            .collect();
        assert_none(krate, &later);
    }
    assert_none("pipecut-distributed", &["pipecut-export", "pipecut"]);
}

#[test]
fn the_planner_compiles_no_kernel_codec_blas_or_gpu_binding() {
    for krate in ["pipecut-ir", "pipecut-cost", "pipecut-planner"] {
        assert_none(krate, RUNTIME_ONLY);
    }
    // The check can fail: the runtime does compile them.
    let runtime = normal_dependencies("pipecut-runtime");
    assert!(
        runtime.contains("gemm") && runtime.contains("image"),
        "{runtime:?}"
    );
}

/// What an embedder who only plans need not compile (docs/benchmarks.md, "Builds"): the full
/// regex engine (DeepSpeed's `type:` baseline matches layer names with `regex-lite`), the plan's
/// JSON Schema generator (feature `schema`), the temporary-file crate of atomic outputs (feature
/// `output` of pipecut-ir), `half` with the `zerocopy` it requires, and a protobuf runtime
/// with generated ONNX messages (pipecut-ir decodes ONNX with its own codec, src/onnx/proto; the
/// export still writes stage files with onnx-protobuf).
const NOT_FOR_PLANNING: &[&str] = &[
    "regex",
    "regex-automata",
    "schemars",
    "tempfile",
    "half",
    "zerocopy",
    "protobuf",
    "protobuf-support",
    "onnx-protobuf",
];

#[test]
fn the_planner_compiles_only_what_planning_needs() {
    assert_none("pipecut-planner", NOT_FOR_PLANNING);
    // The check can fail: the command turns the features on.
    let command = normal_dependencies("pipecut");
    assert!(
        ["schemars", "tempfile", "regex", "onnx-protobuf"]
            .iter()
            .all(|name| command.contains(*name)),
        "{command:?}"
    );
}
