//! The ONNX backend node cases that `tests/conformance.rs` generates under `target/conformance`
//! (`fixtures/conformance.py`, from the pinned onnx), through tract, phase by phase:
//!
//! 1. `load`: tract parses the model, and every input's fact is set to its reference's dtype
//!    and shape (as tract's own ONNX suite does; tract has no Sequence or Optional values, so a
//!    case with one fails here). With `--sample-values`, the inputs pipecut's `shape` phase is
//!    given as plan-time sample values (`sample_values` in tests/conformance.rs: at most
//!    `MAX_TRACKED_ELEMENTS` elements, floats only 0-D or 1-D) are facts with their value, so
//!    tract may treat them as the constants it wants for Reduce axes, Resize sizes, Reshape's
//!    shape and the like;
//! 2. `optimize`: type and shape analysis, decluttering and kernel selection
//!    (`into_optimized`, `into_runnable`), tract's counterpart of pipecut's shape and plan phases;
//! 3. `run`: the plan on the reference inputs;
//! 4. `numbers`: every output within the case's tolerance, |got − want| ≤ atol + rtol·|want|
//!    (NaN equal to NaN), integers, bools and strings exactly.
//!
//! Each case runs in a child process of this binary, so a panic, an abort or a hang (killed
//! after `CASE_TIMEOUT`) fails that case in the phase it had reached and no other.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tract_onnx::prelude::*;

use crate::npy;

const CASE_TIMEOUT: Duration = Duration::from_secs(60);
const PHASES: [&str; 4] = ["load", "optimize", "run", "numbers"];
/// pipecut's `graph::MAX_TRACKED_ELEMENTS`: the largest value its shape phase tracks.
const MAX_TRACKED_ELEMENTS: usize = 4096;

/// Whether pipecut's conformance test gives this reference input to its shape phase as a
/// plan-time sample value.
fn is_sample_value(tensor: &Tensor) -> bool {
    tensor.len() <= MAX_TRACKED_ELEMENTS && (!tensor.datum_type().is_float() || tensor.rank() <= 1)
}

/// Runs one case in this process, announcing each phase on stdout before it starts, and
/// printing `pass` at the end; an error is printed as `fail <reason>`.
pub fn run_case(dir: &Path, case: &Value, sample_values: bool) -> Result<()> {
    let outcome = phases(dir, case, sample_values);
    let mut out = std::io::stdout();
    match outcome {
        Ok(()) => writeln!(out, "pass")?,
        Err(e) => writeln!(out, "fail {}", format!("{e:#}").replace('\n', " "))?,
    }
    Ok(())
}

fn announce(phase: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "phase {phase}");
    let _ = out.flush();
}

fn phases(dir: &Path, case: &Value, sample_values: bool) -> Result<()> {
    announce("load");
    let mut model = tract_onnx::onnx().model_for_path(dir.join("model.onnx"))?;
    let names: Vec<String> = model
        .input_outlets()?
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect();
    let mut feed = TVec::new();
    for (ix, name) in names.iter().enumerate() {
        let entry = case["inputs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"].as_str() == Some(name))
            .with_context(|| format!("no reference for input '{name}'"))?;
        let tensor = reference(dir, entry)?;
        let fact = if sample_values && is_sample_value(&tensor) {
            InferenceFact::from(tensor.clone())
        } else {
            InferenceFact::dt_shape(tensor.datum_type(), tensor.shape())
        };
        model.set_input_fact(ix, fact)?;
        feed.push(tensor.into_tvalue());
    }
    announce("optimize");
    let plan = model.into_optimized()?.into_runnable()?;
    announce("run");
    let outputs = plan.run(feed)?;
    announce("numbers");
    let wanted = case["outputs"].as_array().context("no outputs listed")?;
    ensure!(
        outputs.len() == wanted.len(),
        "{} outputs, the reference has {}",
        outputs.len(),
        wanted.len()
    );
    let rtol = case["rtol"].as_f64().unwrap_or(1e-3);
    let atol = case["atol"].as_f64().unwrap_or(1e-7);
    for (got, entry) in outputs.iter().zip(wanted) {
        let name = entry["name"].as_str().unwrap_or("?");
        let want = reference(dir, entry)?;
        compare(got, &want, rtol, atol).with_context(|| format!("output '{name}'"))?;
    }
    Ok(())
}

/// One reference tensor; sequences, absent optionals and values .npy cannot hold are errors.
fn reference(dir: &Path, entry: &Value) -> Result<Tensor> {
    let name = entry["name"].as_str().unwrap_or("?");
    if entry["absent"].as_bool() == Some(true) {
        bail!("'{name}' is an absent optional (tract has no Optional values)");
    }
    if entry.get("sequence").is_some() {
        bail!("'{name}' is a sequence (tract has no Sequence values)");
    }
    if let Some(why) = entry["unstorable"].as_str() {
        bail!("reference '{name}' is {why}");
    }
    npy::read(&dir.join(entry["file"].as_str().context("no file")?))
}

fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<()> {
    ensure!(
        got.shape() == want.shape(),
        "shape {:?}, the reference {:?}",
        got.shape(),
        want.shape()
    );
    if want.datum_type() == DatumType::String {
        ensure!(
            got.datum_type() == DatumType::String,
            "{:?}, not strings",
            got.datum_type()
        );
        ensure!(
            got.to_plain_array_view::<String>()? == want.to_plain_array_view::<String>()?,
            "strings differ"
        );
        return Ok(());
    }
    if want.datum_type().is_float() {
        let (got, want) = (got.cast_to::<f64>()?, want.cast_to::<f64>()?);
        for (i, (&a, &b)) in got
            .to_plain_array_view::<f64>()?
            .iter()
            .zip(want.to_plain_array_view::<f64>()?.iter())
            .enumerate()
        {
            let close =
                (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
            ensure!(close, "element {i} is {a}, the reference {b}");
        }
        return Ok(());
    }
    let (got, want) = (got.cast_to::<i64>()?, want.cast_to::<i64>()?);
    ensure!(
        got.to_plain_array_view::<i64>()? == want.to_plain_array_view::<i64>()?,
        "values differ"
    );
    Ok(())
}

/// The outcome of one case run in a child process: `pass`, or the phase it failed in and why.
fn spawn_case(dir: &Path, case: &Value, sample_values: bool) -> Result<(String, String)> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg(if sample_values {
            "case-with-sample-values"
        } else {
            "case"
        })
        .arg(dir)
        .arg(case.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > CASE_TIMEOUT {
            child.kill()?;
            child.wait()?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout)?;
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr)?;
    let mut phase = "load";
    for line in stdout.lines() {
        if let Some(p) = line.strip_prefix("phase ") {
            phase = PHASES.iter().find(|&&q| q == p).unwrap_or(&"load");
        } else if line == "pass" {
            return Ok(("pass".into(), String::new()));
        } else if let Some(reason) = line.strip_prefix("fail ") {
            return Ok((phase.into(), reason.chars().take(200).collect()));
        }
    }
    let why = match status {
        None => format!("no result within {} s", CASE_TIMEOUT.as_secs()),
        Some(s) => {
            let last = stderr
                .lines()
                .find(|l| l.contains("panicked"))
                .unwrap_or("");
            format!("crashed ({s}) {last}")
        }
    };
    Ok((phase.into(), why.chars().take(200).collect()))
}

/// Every case of `cases.json`; writes `name phase reason` lines to `results` and prints the
/// counts, and, given pipecut's expected-failures list, how the two overlap.
pub fn run_all(
    cache: &Path,
    results: &Path,
    pipecut_failures: Option<&Path>,
    sample_values: bool,
) -> Result<()> {
    let listing: Value = serde_json::from_str(&std::fs::read_to_string(cache.join("cases.json"))?)?;
    let cases = listing["cases"].as_array().context("no cases")?;
    let start = Instant::now();
    let mut outcomes = BTreeMap::new();
    let mut lines = String::new();
    for case in cases {
        let name = case["name"].as_str().context("unnamed case")?.to_string();
        let (phase, reason) = spawn_case(&cache.join("cases").join(&name), case, sample_values)?;
        lines += &format!("{name} {phase} {reason}\n");
        outcomes.insert(name, phase);
    }
    std::fs::write(results, lines)?;
    let mut by_phase: BTreeMap<&str, usize> = BTreeMap::new();
    for phase in outcomes.values() {
        *by_phase.entry(phase.as_str()).or_default() += 1;
    }
    println!(
        "tract-onnx{}: {} / {} ONNX node cases pass ({}), failures by phase {by_phase:?}; {:.1} s",
        if sample_values {
            " (sample values as constants)"
        } else {
            ""
        },
        by_phase.get("pass").copied().unwrap_or(0),
        outcomes.len(),
        listing["stamp"].as_str().unwrap_or("?"),
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = pipecut_failures {
        overlap(&outcomes, path)?;
    }
    Ok(())
}

/// Cases passing in both, in one only, in neither, with pipecut's failures read from its
/// `tests/conformance/expected_failures.txt`.
fn overlap(tract: &BTreeMap<String, String>, path: &Path) -> Result<()> {
    let failing: BTreeSet<String> = std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    let mut counts = [[0usize; 2]; 2];
    let mut tract_only = Vec::new();
    for (name, phase) in tract {
        let (p, t) = (!failing.contains(name), phase == "pass");
        counts[p as usize][t as usize] += 1;
        if t && !p {
            tract_only.push(name.as_str());
        }
    }
    println!(
        "both pass {}, pipecut only {}, tract only {}, neither {}",
        counts[1][1], counts[1][0], counts[0][1], counts[0][0]
    );
    println!("tract only: {}", tract_only.join(" "));
    Ok(())
}
