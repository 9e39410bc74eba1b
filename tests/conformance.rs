//! Conformance test: the ONNX backend node cases of the pinned onnx package (the per-operator
//! cases `onnx.backend.test.case.node.collect_testcases(None)` generates; onnx 1.23.2 has 1,884)
//! through every phase pipecut has, against a committed list of expected failures; and the same
//! cases through the command line as a user runs them (`onnx_node_cases_through_the_cli`, at the
//! end), against a floor on the pass rate. docs/conformance.md has both figures.
//!
//! `fixtures/conformance.py` (run here with the project venv when `target/conformance/` is
//! missing or stale) writes each case's model, with the declared output shapes erased, and its
//! reference inputs and outputs. Each case then goes through, in order:
//!
//! 1. `load`: [`pipecut::onnx::load_model_from_bytes`];
//! 2. `shape`: shape inference with no bindings, given the reference inputs that can carry
//!    shapes (integers, 0-D and 1-D floats, strings) as plan-time sample values
//!    ([`ShapeInference::with_input_values`]); every output's inferred shape must equal the
//!    reference output's shape. A size that depends on data the phase was not given (the boxes
//!    NonMaxSuppression keeps) is a symbol `<tensor>.<axis>`, bound to the reference's size as a
//!    user binds it with `--dim`;
//! 3. `plan`: the library's `partition --stages 1` ([`Planner`] with one stage on one H100),
//!    which also exercises the cost rules;
//! 4. `run`: the CPU runtime on the reference inputs; every output must match the reference
//!    within the case's own tolerance, |actual − expected| ≤ atol + rtol·|expected| (the onnx
//!    backend runner's `np.testing.assert_allclose`, with NaN equal to NaN), compared in the
//!    runtime's dtype (it computes float16/float64 as float32, narrow integers as int64).
//!
//! A case's outcome is `pass` or the first phase that failed. `tests/conformance/
//! expected_failures.txt` lists every failing case with its phase and the error; the test fails
//! on a case that fails other than listed (a regression, or a listed failure moved to another
//! phase) and on a listed case that now passes, so the list stays true. After a change that
//! moves cases, regenerate the list with
//!
//! ```sh
//! PIPECUT_CONFORMANCE_BLESS=1 cargo test --test conformance
//! ```
//!
//! and review its diff. Without the venv the test cannot generate the cases: it says so on
//! stderr and passes, except under CI (`CI` set), where the venv is part of the setup
//! (`fixtures/pyenv.sh`) and its absence fails the test.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pipecut::cost::{Catalog, Cluster};
use pipecut::graph::{ConstValue, DType, Dim, Graph, ValueKind, MAX_TRACKED_ELEMENTS};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{Planner, StageCount};
use pipecut::runtime::{
    read_npy, read_npy_as, runtime_dtype, CpuExecutor, HostTensor, Value as RtValue, Values,
    Weights,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

const EXPECTED: &str = "tests/conformance/expected_failures.txt";

/// Errors can run over several lines (a shape list, a node dump); the list keeps one line of at
/// most this many characters per case, enough to name the op and the reason.
const REASON_CHARS: usize = 400;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Pass,
    Fail { phase: String, reason: String },
}

fn fail(phase: &str, reason: impl std::fmt::Display) -> Outcome {
    let text = reason.to_string();
    let line = text.lines().next().unwrap_or("").trim();
    Outcome::Fail {
        phase: phase.to_string(),
        reason: line.chars().take(REASON_CHARS).collect(),
    }
}

/// The venv's python, the way `fixtures/pyenv.sh` creates it.
fn python() -> PathBuf {
    common::root().join(".venv/bin/python")
}

/// The onnx version `fixtures/requirements.txt` pins.
fn pinned_onnx() -> String {
    let requirements =
        std::fs::read_to_string(common::root().join("fixtures/requirements.txt")).unwrap();
    requirements
        .lines()
        .find_map(|l| l.trim().strip_prefix("onnx=="))
        .expect("fixtures/requirements.txt pins onnx")
        .to_string()
}

/// The stamp `fixtures/conformance.py` writes into `cases.json`: the onnx version and the first
/// 16 hex digits of the script's sha256. A cache with another stamp is regenerated.
fn expected_stamp() -> String {
    let script = std::fs::read(common::root().join("fixtures/conformance.py")).unwrap();
    let digest = Sha256::digest(&script);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("onnx {}, script {}", pinned_onnx(), &hex[..16])
}

/// The case cache, generated when missing or stale; `None` (said loudly) without a venv.
fn case_cache() -> Option<PathBuf> {
    let cache = common::root().join("target/conformance");
    let manifest = cache.join("cases.json");
    let stamp = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|v| v["stamp"].as_str().map(str::to_string));
    if stamp.as_deref() == Some(expected_stamp().as_str()) {
        return Some(cache);
    }
    let python = python();
    if !python.exists() {
        let message = format!(
            "CONFORMANCE NOT RUN: {} is absent, so the ONNX node cases cannot be generated \
             (run `bash fixtures/pyenv.sh`)",
            python.display()
        );
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("\n*** {message} ***\n");
        return None;
    }
    let status = Command::new(&python)
        .arg(common::root().join("fixtures/conformance.py"))
        .arg("--out")
        .arg(&cache)
        .status()
        .expect("python starts");
    assert!(status.success(), "fixtures/conformance.py failed: {status}");
    Some(cache)
}

/// A reference value: a tensor, a sequence of tensors, or an absent optional.
enum Reference {
    Tensor(HostTensor),
    Sequence(Vec<HostTensor>),
    Absent,
}

/// Reads one reference value of any kind listed in `cases.json`.
fn reference_value(dir: &Path, entry: &Value) -> Result<Reference, String> {
    if entry["absent"].as_bool() == Some(true) {
        return Ok(Reference::Absent);
    }
    if let Some(elements) = entry["sequence"].as_array() {
        return elements
            .iter()
            .map(|e| reference(dir, e))
            .collect::<Result<_, _>>()
            .map(Reference::Sequence);
    }
    reference(dir, entry).map(Reference::Tensor)
}

/// The runtime value for a reference input of the kind the graph declares.
fn runtime_value(reference: Reference, kind: ValueKind) -> Result<RtValue, String> {
    let tensor = |t: HostTensor| -> Result<Arc<HostTensor>, String> {
        Ok(Arc::new(t.cast(runtime_dtype(t.dtype()))?))
    };
    let plain = match reference {
        Reference::Absent if !kind.is_tensor() && kind != ValueKind::Sequence => {
            return Ok(RtValue::Optional(None))
        }
        Reference::Absent => return Err(format!("an absent value for a {kind}")),
        Reference::Tensor(t) => RtValue::Tensor(tensor(t)?),
        Reference::Sequence(s) => {
            RtValue::Sequence(s.into_iter().map(tensor).collect::<Result<_, _>>()?)
        }
    };
    Ok(match kind {
        ValueKind::OptionalTensor | ValueKind::OptionalSequence => {
            RtValue::Optional(Some(Box::new(plain)))
        }
        _ => plain,
    })
}

/// Compares an output of any kind with its reference.
fn compare_value(
    name: &str,
    got: &RtValue,
    want: &Reference,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    match (got, want) {
        (RtValue::Optional(None), Reference::Absent) => Ok(()),
        (RtValue::Optional(Some(inner)), want) => compare_value(name, inner, want, rtol, atol),
        (RtValue::Tensor(t), Reference::Tensor(w)) => compare(name, t, w, rtol, atol),
        (RtValue::Sequence(s), Reference::Sequence(w)) => {
            if s.len() != w.len() {
                return Err(format!(
                    "output '{name}' has {} elements, the reference {}",
                    s.len(),
                    w.len()
                ));
            }
            s.iter()
                .zip(w)
                .enumerate()
                .try_for_each(|(i, (a, b))| compare(&format!("{name}[{i}]"), a, b, rtol, atol))
        }
        (got, _) => Err(format!(
            "output '{name}' is a {}, unlike the reference",
            got.kind()
        )),
    }
}

/// Reads one reference tensor listed in `cases.json`.
fn reference(dir: &Path, entry: &Value) -> Result<HostTensor, String> {
    if let Some(why) = entry["unstorable"].as_str() {
        return Err(format!(
            "reference '{}' is {why}",
            entry["name"].as_str().unwrap_or("?")
        ));
    }
    let file = dir.join(entry["file"].as_str().unwrap());
    read_npy(&file).map(|a| a.tensor).map_err(|e| e.to_string())
}

/// Compares one output as the onnx backend runner does (`assert_allclose`, NaN equal to NaN).
fn compare(
    name: &str,
    got: &HostTensor,
    want: &HostTensor,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let want_dtype = runtime_dtype(want.dtype());
    if got.dtype() != want_dtype {
        return Err(format!(
            "output '{name}' is {} but the reference is {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "output '{name}' has shape {:?} but the reference {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let want = want.cast(want_dtype)?;
    match want_dtype {
        DType::F32 => {
            for (i, (&a, &b)) in got.to_f32_vec().iter().zip(&want.to_f32_vec()).enumerate() {
                let (a, b) = (a as f64, b as f64);
                let close =
                    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
                if !close {
                    return Err(format!(
                        "output '{name}' element {i} is {a} but the reference is {b} (rtol {rtol}, atol {atol})"
                    ));
                }
            }
        }
        DType::String => {
            if got.data() != want.data() {
                return Err(format!(
                    "output '{name}' is {:?} but the reference is {:?}",
                    got.data(),
                    want.data()
                ));
            }
        }
        _ => {
            let (got, want) = (got.to_i64_vec(), want.to_i64_vec());
            let differing: Vec<i64> = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a != b)
                .map(|(a, b)| (a - b).abs())
                .collect();
            if !differing.is_empty() {
                return Err(format!(
                    "output '{name}' differs from the reference in {} of {} elements, by at most {}",
                    differing.len(),
                    want.len(),
                    differing.iter().max().unwrap_or(&0)
                ));
            }
        }
    }
    Ok(())
}

/// The reference inputs that can carry shapes (integers, and 0-D and 1-D floats such as Resize
/// scales or Range bounds) or decide them (strings, which `StringSplit` splits), as the
/// plan-time sample values the `shape` phase is given: tensor inputs of concrete shape.
fn sample_values(
    dir: &Path,
    case: &Value,
    graph: &Graph,
) -> Result<BTreeMap<String, ConstValue>, String> {
    let mut values = BTreeMap::new();
    for entry in case["inputs"].as_array().unwrap() {
        let Some(id) = entry["name"].as_str().and_then(|n| graph.tensor_id(n)) else {
            continue;
        };
        if !graph.tensor(id).kind.is_tensor() || graph.concrete_shape(id).is_err() {
            continue;
        }
        let Ok(tensor) = reference(dir, entry) else {
            continue;
        };
        if tensor.len() as u64 > MAX_TRACKED_ELEMENTS {
            continue;
        }
        if tensor.dtype() == DType::F32 && tensor.rank() > 1 {
            continue;
        }
        let value = tensor.to_const_value();
        // NaN and infinity decide no shape, and a plan (JSON) cannot record them.
        if matches!(&value, ConstValue::Floats(v) if v.iter().any(|x| !x.is_finite())) {
            continue;
        }
        values.insert(entry["name"].as_str().unwrap().to_string(), value);
    }
    Ok(values)
}

/// Binds the symbolic dims of the inputs (`N` of a `[N]` input, of a sequence's elements) to
/// the sizes of the reference inputs, so that the plan is for the values the run gets.
fn reference_bindings(dir: &Path, case: &Value, graph: &Graph) -> DimBindings {
    let mut bound: BTreeMap<String, u64> = BTreeMap::new();
    for entry in case["inputs"].as_array().unwrap() {
        let Some(id) = entry["name"].as_str().and_then(|n| graph.tensor_id(n)) else {
            continue;
        };
        let Some(declared) = graph.tensor(id).shape.as_ref() else {
            continue;
        };
        let shapes: Vec<Vec<usize>> = match reference_value(dir, entry) {
            Ok(Reference::Tensor(t)) => vec![t.shape().to_vec()],
            Ok(Reference::Sequence(s)) => s.iter().map(|t| t.shape().to_vec()).collect(),
            _ => continue,
        };
        for shape in shapes.iter().filter(|s| s.len() == declared.len()) {
            for (dim, &size) in declared.iter().zip(shape) {
                let Dim::Sym(sym) = dim else { continue };
                let names: Vec<&str> = sym.symbols().collect();
                if let ([name], 1) = (names.as_slice(), sym.coefficient()) {
                    bound.entry(name.to_string()).or_insert(size as u64);
                }
            }
        }
    }
    bound
        .into_iter()
        .fold(DimBindings::new(), |b, (name, size)| b.bind(&name, size))
}

/// An output dim that depends on data inference could not see (NonMaxSuppression's count of
/// boxes kept, from float boxes that are no sample value) is a symbol named `<tensor>.<axis>`;
/// bind each to the reference's size, as a user does with `--dim selected_indices.0=N`. The
/// other dims are still checked, and the `run` phase checks the kernel finds that size itself.
fn data_dependent_bindings(
    graph: &pipecut::graph::Graph,
    report: &pipecut::onnx::shape::InferenceReport,
    outputs: &[Value],
) -> DimBindings {
    let mut bindings = DimBindings::new();
    for (entry, &id) in outputs.iter().zip(graph.outputs()) {
        let (Some(shape), Some(want)) = (&graph.tensor(id).shape, entry["shape"].as_array()) else {
            continue;
        };
        for (dim, want) in shape.iter().zip(want) {
            let (Dim::Sym(sym), Some(want)) = (dim, want.as_u64()) else {
                continue;
            };
            let names: Vec<&str> = sym.symbols().collect();
            let [name] = names[..] else { continue };
            if sym.coefficient() != 1 {
                continue;
            }
            if !report.unbound_symbols.contains(name)
                && !bindings.iter().any(|(bound, _)| bound == name)
            {
                bindings = bindings.bind(name, want);
            }
        }
    }
    bindings
}

/// The `--dim` bindings a user passes for a case.
struct UserBindings {
    /// The inputs' symbolic dims at the reference inputs' sizes, then the sizes inference
    /// leaves to data it was not given, at the reference's.
    bindings: DimBindings,
    /// Whether such data-dependent sizes were needed.
    data_dependent: bool,
    /// The graph typed with the inputs' bindings (its dtypes are those `run` writes).
    typed: Graph,
}

fn user_bindings(
    bytes: &[u8],
    dir: &Path,
    case: &Value,
    values: &BTreeMap<String, ConstValue>,
) -> Result<UserBindings, Outcome> {
    let mut model =
        pipecut::onnx::load_model_from_bytes(bytes, None).map_err(|e| fail("load", e))?;
    let inputs_bound = reference_bindings(dir, case, &model.graph);
    let report = ShapeInference::new(inputs_bound.clone())
        .with_input_values(values.clone())
        .run(&mut model.graph)
        .map_err(|e| fail("shape", e))?;
    let outputs = case["outputs"].as_array().unwrap();
    let data_bound = data_dependent_bindings(&model.graph, &report, outputs);
    let data_dependent = data_bound != DimBindings::new();
    let bindings = data_bound
        .iter()
        .fold(inputs_bound, |b, (name, size)| b.bind(name, size));
    Ok(UserBindings {
        bindings,
        data_dependent,
        typed: model.graph,
    })
}

/// Runs one case through every phase.
/// `bound` counts the cases whose data-dependent sizes were bound from the reference.
fn run_case(dir: &Path, case: &Value, cluster: &Cluster, bound: &AtomicUsize) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return fail("load", e),
    };
    let mut model = match pipecut::onnx::load_model_from_bytes(&bytes, None) {
        Ok(m) => m,
        Err(e) => return fail("load", e),
    };
    let values = match sample_values(dir, case, &model.graph) {
        Ok(v) => v,
        Err(e) => return fail("shape", e),
    };
    let outputs = case["outputs"].as_array().unwrap();
    let bindings = match user_bindings(&bytes, dir, case, &values) {
        Ok(user) => {
            if user.data_dependent {
                bound.fetch_add(1, Ordering::Relaxed);
            }
            user.bindings
        }
        Err(outcome) => return outcome,
    };
    if let Err(e) = ShapeInference::new(bindings)
        .with_input_values(values.clone())
        .run(&mut model.graph)
    {
        return fail("shape", e);
    }
    let graph = &model.graph;
    if outputs.len() != graph.outputs().len() {
        return fail(
            "shape",
            format!(
                "{} outputs, the reference has {}",
                graph.outputs().len(),
                outputs.len()
            ),
        );
    }
    for (entry, &id) in outputs.iter().zip(graph.outputs()) {
        let kind = graph.tensor(id).kind;
        let absent = entry["absent"].as_bool() == Some(true);
        if absent || entry["sequence"].is_array() {
            let fits = if absent {
                !kind.is_tensor() && kind != ValueKind::Sequence
            } else {
                matches!(kind, ValueKind::Sequence | ValueKind::OptionalSequence)
            };
            if !fits {
                let what = if absent { "absent" } else { "a sequence" };
                return fail(
                    "shape",
                    format!(
                        "output '{}' is inferred a {kind}, the reference is {what}",
                        graph.tensor(id).name
                    ),
                );
            }
            continue;
        }
        let Some(want) = entry["shape"].as_array() else {
            return fail(
                "shape",
                format!("reference '{}' is {}", entry["name"], entry["unstorable"]),
            );
        };
        let want: Vec<u64> = want.iter().map(|d| d.as_u64().unwrap()).collect();
        match graph.concrete_shape(id) {
            Ok(got) if got == want => {}
            Ok(got) => {
                return fail(
                    "shape",
                    format!(
                        "output '{}' inferred {got:?}, the reference has {want:?}",
                        graph.tensor(id).name
                    ),
                )
            }
            Err(e) => return fail("shape", e),
        }
    }
    if let Err(e) = Planner::new(graph, cluster)
        .with_stages(StageCount::Fixed(1))
        .solve()
    {
        return fail("plan", e);
    }
    let mut inputs = Values::new();
    for entry in case["inputs"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let kind = graph
            .tensor_id(name)
            .map_or(ValueKind::Tensor, |id| graph.tensor(id).kind);
        let value = match reference_value(dir, entry).and_then(|r| runtime_value(r, kind)) {
            Ok(v) => v,
            Err(e) => return fail("run", e),
        };
        inputs.insert(name.to_string(), value);
    }
    let weights = match Weights::from_model_bytes(&bytes, graph) {
        Ok(w) => w,
        Err(e) => return fail("run", e),
    };
    let executor = CpuExecutor::new(graph, &weights);
    let actual = match executor.run_model_values(&inputs) {
        Ok(out) => out,
        Err(e) => return fail("run", e),
    };
    let (rtol, atol) = (
        case["rtol"].as_f64().unwrap(),
        case["atol"].as_f64().unwrap(),
    );
    for entry in outputs {
        let name = entry["name"].as_str().unwrap();
        let want = match reference_value(dir, entry) {
            Ok(t) => t,
            Err(e) => return fail("run", e),
        };
        let Some(got) = actual.get(name) else {
            return fail("run", format!("the runtime gave no output '{name}'"));
        };
        if let Err(e) = compare_value(name, got, &want, rtol, atol) {
            return fail("run", e);
        }
    }
    Outcome::Pass
}

/// Parses the committed list: `name phase reason…` per line, `#` comments.
fn read_expected(path: &Path) -> BTreeMap<String, (String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            let name = parts.next().unwrap().to_string();
            let phase = parts.next().unwrap_or("").to_string();
            let reason = parts.next().unwrap_or("").to_string();
            (name, (phase, reason))
        })
        .collect()
}

fn write_expected(path: &Path, outcomes: &BTreeMap<String, Outcome>, stamp: &str) {
    let mut text = String::new();
    writeln!(
        text,
        "# ONNX backend node cases that fail a pipecut phase: `name phase reason` (the first line of\n\
         # the error). Checked by tests/conformance.rs; regenerate with\n\
         #   PIPECUT_CONFORMANCE_BLESS=1 cargo test --test conformance\n\
         # Cases from {stamp}."
    )
    .unwrap();
    for (name, outcome) in outcomes {
        if let Outcome::Fail { phase, reason } = outcome {
            writeln!(text, "{name} {phase} {reason}").unwrap();
        }
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn onnx_node_cases_match_the_expected_failures() {
    let Some(cache) = locked_case_cache() else {
        return;
    };
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("cases.json")).unwrap()).unwrap();
    let cases: Vec<Value> = manifest["cases"].as_array().unwrap().clone();
    let cluster = Cluster::parse("1x1xH100-SXM", &Catalog::builtin()).unwrap();
    let start = std::time::Instant::now();

    // A panic in a phase is a bug to list like any other failure; keep its message, not the
    // default hook's noise on stderr for each one.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let next = AtomicUsize::new(0);
    let bound = AtomicUsize::new(0);
    let outcomes = Mutex::new(BTreeMap::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let name = case["name"].as_str().unwrap().to_string();
                let outcome = if let Some(why) = case["unstorable"].as_str() {
                    fail("load", why)
                } else {
                    let dir = cache.join("cases").join(&name);
                    catch_unwind(AssertUnwindSafe(|| run_case(&dir, case, &cluster, &bound)))
                        .unwrap_or_else(|payload| {
                            let message = payload
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            fail("panic", message)
                        })
                };
                outcomes.lock().unwrap().insert(name, outcome);
            });
        }
    });
    std::panic::set_hook(default_hook);
    let outcomes = outcomes.into_inner().unwrap();

    let passed = outcomes.values().filter(|o| **o == Outcome::Pass).count();
    let mut by_phase: BTreeMap<&str, usize> = BTreeMap::new();
    for outcome in outcomes.values() {
        if let Outcome::Fail { phase, .. } = outcome {
            *by_phase.entry(phase).or_default() += 1;
        }
    }
    eprintln!(
        "conformance: {passed} / {} ONNX node cases pass every phase ({:.1}%), {}; failures by phase: {by_phase:?}; {} cases bound data-dependent sizes to the reference's; {:.1} s",
        outcomes.len(),
        100.0 * passed as f64 / outcomes.len() as f64,
        manifest["stamp"].as_str().unwrap(),
        bound.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );

    let path = common::root().join(EXPECTED);
    if std::env::var_os("PIPECUT_CONFORMANCE_BLESS").is_some() {
        write_expected(&path, &outcomes, manifest["stamp"].as_str().unwrap());
        eprintln!("wrote {}", path.display());
        return;
    }
    let expected = read_expected(&path);
    let mut problems = Vec::new();
    for (name, outcome) in &outcomes {
        match (outcome, expected.get(name)) {
            (Outcome::Pass, Some((phase, _))) => problems.push(format!(
                "{name}: listed as failing at {phase} but now passes; remove it from the list"
            )),
            (Outcome::Fail { phase, reason }, None) => {
                problems.push(format!("{name}: REGRESSION, fails at {phase}: {reason}"))
            }
            (Outcome::Fail { phase, reason }, Some((listed, _))) if phase != listed => problems
                .push(format!(
                    "{name}: listed as failing at {listed}, now fails at {phase}: {reason}"
                )),
            _ => {}
        }
    }
    for name in expected.keys().filter(|n| !outcomes.contains_key(*n)) {
        problems.push(format!(
            "{name}: listed, but the onnx package has no such case"
        ));
    }
    assert!(
        problems.is_empty(),
        "{} cases differ from {EXPECTED} (after an intended change: \
         PIPECUT_CONFORMANCE_BLESS=1 cargo test --test conformance):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---- The same cases through the command line, as a user runs them (docs/conformance.md,
// "Through the command line") ----

/// The share of the cases (with data) that must pass through the CLI; the measured figure is
/// in docs/conformance.md. Below it, the harness fails and lists the failures.
const CLI_FLOOR_PERCENT: f64 = 97.5;

/// Serializes the cache check of the two tests, which may otherwise both write it at once.
static CACHE: Mutex<()> = Mutex::new(());

fn locked_case_cache() -> Option<PathBuf> {
    let _guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    case_cache()
}

/// The file a user passes for a reference value: as they save it (ml_dtypes' arrays, uint64)
/// where that differs from the widened file the library test reads.
fn user_file(dir: &Path, entry: &Value) -> Option<PathBuf> {
    let file = entry["as_saved"].as_str().or(entry["file"].as_str())?;
    Some(dir.join(file))
}

/// Runs `pipecut <args>`; `Err` holds the first line of its error.
fn pipecut_cli(args: &[String]) -> Result<String, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error"))
        .or_else(|| stderr.lines().find(|l| !l.trim().is_empty()))
        .unwrap_or("no message");
    Err(format!("{} ({})", line.trim(), output.status))
}

/// The flags a user gives `inspect`, `partition` and `run` for a case: `--dim` for the inputs'
/// symbolic dims (and the sizes left to data), `--value` for the inputs that decide shapes, and
/// `--input` for every input (a sequence as a directory of `0.npy`, `1.npy`, … made in `work`).
/// `Err` when a value has no form `run` takes (an absent optional).
#[derive(Default)]
struct CliFlags {
    shape: Vec<String>,
    inputs: Vec<String>,
    /// The dtype of each output as inference types it, which `run` writes it in.
    output_dtypes: BTreeMap<String, DType>,
}

fn cli_flags(dir: &Path, case: &Value, work: &Path) -> Result<CliFlags, Outcome> {
    let bytes = std::fs::read(dir.join("model.onnx")).map_err(|e| fail("load", e))?;
    let model = pipecut::onnx::load_model_from_bytes(&bytes, None);
    // A model the library cannot load gets no flags: `inspect` then says why.
    let Ok(model) = model else {
        return Ok(CliFlags::default());
    };
    let values = sample_values(dir, case, &model.graph).map_err(|e| fail("shape", e))?;
    let (bindings, output_dtypes) = match user_bindings(&bytes, dir, case, &values) {
        Ok(user) => {
            let dtypes = user
                .typed
                .outputs()
                .iter()
                .filter_map(|&id| {
                    let tensor = user.typed.tensor(id);
                    Some((tensor.name.clone(), tensor.dtype?))
                })
                .collect();
            (user.bindings, dtypes)
        }
        Err(_) => Default::default(),
    };
    let mut shape: Vec<String> = bindings
        .iter()
        .map(|(name, size)| format!("--dim={name}={size}"))
        .collect();
    let mut inputs = Vec::new();
    for entry in case["inputs"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let file = match entry["sequence"].as_array() {
            Some(elements) => sequence_dir(dir, elements, &work.join("inputs").join(name)),
            None => user_file(dir, entry),
        };
        let Some(file) = file else {
            return Err(fail(
                "run",
                format!("input '{name}' is an absent optional, which `run --input` cannot give"),
            ));
        };
        if values.contains_key(name) {
            shape.push(format!("--value={name}={}", file.display()));
        }
        inputs.push(format!("--input={name}={}", file.display()));
    }
    Ok(CliFlags {
        shape,
        inputs,
        output_dtypes,
    })
}

/// A sequence input as a user passes it: a directory of `0.npy`, `1.npy`, … (copies of the
/// cache's element files).
fn sequence_dir(dir: &Path, elements: &[Value], to: &Path) -> Option<PathBuf> {
    std::fs::create_dir_all(to).ok()?;
    for (j, element) in elements.iter().enumerate() {
        std::fs::copy(user_file(dir, element)?, to.join(format!("{j}.npy"))).ok()?;
    }
    Some(to.to_path_buf())
}

/// One case through `inspect`, `partition --out` and `run --input`, the outputs read back from
/// the files `run` wrote and compared with the reference as the library test compares them.
fn cli_case(dir: &Path, case: &Value, work: &Path) -> Outcome {
    let flags = match cli_flags(dir, case, work) {
        Ok(f) => f,
        Err(outcome) => return outcome,
    };
    let model = dir.join("model.onnx").display().to_string();
    let plan = work.join("plan.json").display().to_string();
    let out_dir = work.join("out").display().to_string();
    let with = |head: &[&str], tail: &[String]| -> Vec<String> {
        head.iter()
            .map(|s| s.to_string())
            .chain(tail.iter().cloned())
            .collect()
    };
    if let Err(e) = pipecut_cli(&with(&["inspect", &model], &flags.shape)) {
        return fail("inspect", e);
    }
    let partition = [
        "partition",
        &model,
        "--stages=1",
        "--microbatches=1",
        "--cluster=1x1xH100-SXM",
        "--out",
        &plan,
    ];
    if let Err(e) = pipecut_cli(&with(&partition, &flags.shape)) {
        return fail("partition", e);
    }
    let run = [
        "run",
        &plan,
        &model,
        "--microbatches=1",
        "--json",
        "--output-dir",
        &out_dir,
    ];
    let report = match pipecut_cli(&with(&run, &flags.inputs)) {
        Ok(stdout) => stdout,
        Err(e) => return fail("run", e),
    };
    match compare_cli_outputs(dir, case, &report, &flags.output_dtypes) {
        Ok(()) => Outcome::Pass,
        Err(e) => fail("compare", e),
    }
}

/// Compares every output file `run` lists in its JSON report with the case's reference.
fn compare_cli_outputs(
    dir: &Path,
    case: &Value,
    report: &str,
    dtypes: &BTreeMap<String, DType>,
) -> Result<(), String> {
    let report: Value = serde_json::from_str(report).map_err(|e| format!("run --json: {e}"))?;
    let (rtol, atol) = (
        case["rtol"].as_f64().unwrap(),
        case["atol"].as_f64().unwrap(),
    );
    for entry in case["outputs"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let listed = report["outputs"][name].as_str().map(Path::new);
        let read = |file: &Path| -> Result<HostTensor, String> {
            let got = read_npy_as(file, dtypes.get(name).copied()).map_err(|e| e.to_string())?;
            got.tensor.cast(runtime_dtype(got.tensor.dtype()))
        };
        match (reference_value(dir, entry)?, listed) {
            (Reference::Absent, None) => {}
            (Reference::Absent, Some(file)) => {
                return Err(format!("output '{name}' is absent, but run wrote {file:?}"))
            }
            (_, None) => return Err(format!("run wrote no file for output '{name}'")),
            (Reference::Tensor(want), Some(file)) => {
                compare(name, &read(file)?, &want, rtol, atol)?
            }
            (Reference::Sequence(want), Some(folder)) => {
                if folder.join(format!("{}.npy", want.len())).exists() {
                    return Err(format!(
                        "output '{name}' has more than {} elements",
                        want.len()
                    ));
                }
                for (j, want) in want.iter().enumerate() {
                    let got = read(&folder.join(format!("{j}.npy")))?;
                    compare(&format!("{name}[{j}]"), &got, want, rtol, atol)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn onnx_node_cases_through_the_cli() {
    let Some(cache) = locked_case_cache() else {
        return;
    };
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("cases.json")).unwrap()).unwrap();
    let cases: Vec<&Value> = manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["unstorable"].is_null())
        .collect();
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance_cli");
    let _ = std::fs::remove_dir_all(&work);
    let start = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(BTreeMap::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let name = case["name"].as_str().unwrap().to_string();
                let case_work = work.join(&name);
                std::fs::create_dir_all(&case_work).unwrap();
                let outcome = cli_case(&cache.join("cases").join(&name), case, &case_work);
                if outcome == Outcome::Pass {
                    let _ = std::fs::remove_dir_all(&case_work);
                }
                outcomes.lock().unwrap().insert(name, outcome);
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let passed = outcomes.values().filter(|o| **o == Outcome::Pass).count();
    let percent = 100.0 * passed as f64 / outcomes.len() as f64;
    let mut failures = String::new();
    let mut by_phase: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, outcome) in &outcomes {
        if let Outcome::Fail { phase, reason } = outcome {
            *by_phase.entry(phase).or_default() += 1;
            writeln!(failures, "{name} {phase} {reason}").unwrap();
        }
    }
    let list = cache.join("cli_failures.txt");
    std::fs::write(&list, &failures).unwrap();
    eprintln!(
        "conformance through the CLI: {passed} / {} ONNX node cases with data pass inspect, \
         partition --out and run --input ({percent:.1}%, floor {CLI_FLOOR_PERCENT}%), {}; \
         failures by phase: {by_phase:?} (listed in {}); {:.0} s",
        outcomes.len(),
        manifest["stamp"].as_str().unwrap(),
        list.display(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        percent >= CLI_FLOOR_PERCENT,
        "{percent:.1}% of the node cases pass through the CLI, under the floor of \
         {CLI_FLOOR_PERCENT}%:\n{failures}"
    );
}
