//! `docs/guide.md`, run as a newcomer runs it: every ```sh block, in order, from the repository
//! root, with the freshly built `pipecut` first on PATH.
//!
//! The guide writes under `/tmp/pipecut-guide/`; the test replaces that path with a temporary
//! directory of its own, so that runs never share files and the repository stays clean. Blocks
//! that need the Python venv skip, saying so, when `.venv` has not been created
//! (`bash fixtures/pyenv.sh` creates it; `.ci/run` does).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh clone's layout: the tracked files only (no `target/`, no GPT-3 placeholder weights,
/// no fetched models), with `.venv` linked in when it exists, as after `bash fixtures/pyenv.sh`.
/// Outside a git checkout it says so and returns the repository itself.
fn fresh_clone(into: &Path) -> PathBuf {
    let root = common::root();
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output();
    let files = match listed {
        Ok(out) if out.status.success() && !out.stdout.is_empty() => out.stdout,
        _ => {
            common::skip(
                common::Need::Toolchain,
                "fresh-clone layout: not a git checkout, so the guide runs in the repository",
            );
            return root;
        }
    };
    let clone = into.join("clone");
    for file in files.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let relative = Path::new(std::str::from_utf8(file).unwrap());
        let from = root.join(relative);
        if !from.is_file() {
            continue; // deleted in the working tree but not yet in the index
        }
        let to = clone.join(relative);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, &to).unwrap();
    }
    let venv = root.join(".venv");
    if venv.exists() {
        #[cfg(unix)]
        std::os::unix::fs::symlink(&venv, clone.join(".venv")).unwrap();
    }
    clone
}

/// Where the guide's commands write.
const GUIDE_DIR: &str = "/tmp/pipecut-guide";

/// The ```sh blocks of a Markdown file, each with the line it starts on.
fn sh_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let fence = line.trim();
        match &mut current {
            None if fence == "```sh" => current = Some((index + 1, String::new())),
            Some(_) if fence == "```" => blocks.extend(current.take()),
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```sh block");
    blocks
}

#[test]
fn every_command_of_the_guide_runs() {
    let guide = std::fs::read_to_string(common::root().join("docs/guide.md")).unwrap();
    let blocks = sh_blocks(&guide);
    assert!(blocks.len() >= 10, "found {} ```sh blocks", blocks.len());

    let work = tempfile::tempdir().unwrap();
    let guide_dir = work.path().join("pipecut-guide");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_pipecut")).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let clone = fresh_clone(work.path());
    let venv = clone.join(".venv/bin/python");
    assert!(
        !clone
            .join("fixtures/models/gpt3_175b/gpt3_175b.weights")
            .exists()
            || clone == common::root(),
        "the clone has no GPT-3 placeholder weights"
    );

    let mut ran = 0;
    for (line, block) in &blocks {
        if block.contains("fixtures/pyenv.sh") && !venv.exists() {
            common::skip(
                common::Need::Venv,
                format!(
                    "the guide's block at docs/guide.md:{line}: {} is absent (run bash fixtures/pyenv.sh)",
                    venv.display()
                ),
            );
            continue;
        }
        let script = block.replace(GUIDE_DIR, &guide_dir.to_string_lossy());
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(&clone)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docs/guide.md:{line} failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert!(ran + 1 >= blocks.len(), "at most the Python block skips");

    // What the guide tells the reader to look at is there.
    let plan = std::fs::read_to_string(guide_dir.join("plan.json")).unwrap();
    let plan = pipecut::plan::Plan::from_json(&plan).unwrap();
    assert!((1..=4).contains(&plan.stages.len()));
    let manifest = std::fs::read_to_string(guide_dir.join("stages/manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert!(manifest.is_object());
    for stage in 0..plan.stages.len() {
        assert!(guide_dir
            .join(format!("stages/stage_{stage}.onnx"))
            .exists());
    }
    let svg = std::fs::read_to_string(guide_dir.join("timeline.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{svg:.80}"
    );
    assert!(guide_dir.join("stages.dot").exists());
    assert!(guide_dir.join("outputs/logits.npy").exists());
    pipecut::plan::Plan::from_json(
        &std::fs::read_to_string(guide_dir.join("cluster-plan.json")).unwrap(),
    )
    .unwrap();
    // The last suggestion: GPT-3 planned across 16 nodes without its weights file.
    let gpt3 = pipecut::plan::Plan::from_json(
        &std::fs::read_to_string(guide_dir.join("gpt3-plan.json")).unwrap(),
    )
    .unwrap();
    assert!(gpt3.stages.len() > 1, "GPT-3 needs a deep pipeline");
}

/// The examples `pipecut plan-cluster --help` ends with run as printed (from a fresh clone's
/// layout, writing into a temporary directory).
#[test]
fn the_plan_cluster_help_examples_run() {
    let help = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(["plan-cluster", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let examples: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pipecut plan-cluster "))
        .collect();
    assert!(examples.len() >= 2, "{help}");
    let work = tempfile::tempdir().unwrap();
    let clone = fresh_clone(work.path());
    for example in examples {
        let args: Vec<String> = example
            .split_whitespace()
            .map(|a| {
                if a == "plan.json" {
                    work.path().join("plan.json").display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .arg("plan-cluster")
            .args(&args)
            .current_dir(&clone)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pipecut plan-cluster {example}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_guide_writes_only_under_its_directory() {
    // Outputs outside GUIDE_DIR would dirty the checkout or escape the test's temporary directory.
    let guide = std::fs::read_to_string(common::root().join("docs/guide.md")).unwrap();
    for (line, block) in sh_blocks(&guide) {
        for flag in [
            "--out ",
            "--out-dir ",
            "--output-dir ",
            "--timeline ",
            "--graph ",
        ] {
            for (at, _) in block.match_indices(flag) {
                let target = block[at + flag.len()..].trim_start();
                assert!(
                    target.starts_with(GUIDE_DIR),
                    "docs/guide.md:{line}: {flag}{}",
                    target.lines().next().unwrap_or("")
                );
            }
        }
    }
}
