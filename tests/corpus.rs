//! The committed subset of the exporter corpus (`fixtures/corpus/subset/`: files torch.onnx and
//! onnxruntime's tools wrote, see docs/corpus.md) through every phase of
//! `fixtures/corpus/run.py`: inspect, cost, partition at K = 2, 4 and auto, check, export (the
//! chained stages equal the whole model in onnxruntime, bit for bit) and run (the CPU runtime
//! against onnxruntime, or the ONNX reference implementation for the opset-23 Llama that
//! onnxruntime 1.23.2 refuses). Every cell must pass. The full corpus needs torch to build and
//! runs with `bash fixtures/corpus/run.sh`; this subset needs only the pinned venv.

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn committed_corpus_subset_passes_every_phase() {
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            format!(
                "the corpus subset: {} is absent (run bash fixtures/pyenv.sh)",
                python.display()
            ),
        );
        return;
    }
    let work = tempfile::tempdir().expect("temporary directory");
    let results = work.path().join("results.json");
    let out = Command::new(&python)
        .arg(common::root().join("fixtures/corpus/run.py"))
        .arg("--pipecut")
        .arg(env!("CARGO_BIN_EXE_pipecut"))
        .arg("--cache")
        .arg(common::root().join("fixtures/corpus/subset"))
        .arg("--work")
        .arg(work.path().join("work"))
        .arg("--json")
        .arg(&results)
        .output()
        .expect("run.py starts");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "run.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&results).expect("results.json"))
            .expect("results are JSON");
    let rows = results["results"].as_object().expect("a results map");
    assert_eq!(rows.len(), 3, "the subset's three files were run:\n{table}");
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|(file, row)| {
            row.as_object()
                .expect("a row of phases")
                .iter()
                .filter(|(_, cell)| cell.as_str() != Some("pass"))
                .map(move |(phase, cell)| format!("{file} {phase}: {cell}"))
        })
        .collect();
    assert!(failed.is_empty(), "{}\n{table}", failed.join("\n"));
    assert_eq!(
        results["notes"]["llama.dynamo.op23.fp32.onnx"]["reference"], "onnx.reference",
        "onnxruntime 1.23.2 refuses the opset-23 RotaryEmbedding with a batch-1 cache"
    );
}
