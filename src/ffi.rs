//! The C ABI: plan a model from Python, C or C++ without the command line.
//!
//! ```text
//! model bytes + config JSON ──load──▶ Graph ──shape──▶ typed Graph ──partition──▶ Solution ──plan──▶ plan JSON
//!                            (onnx)            (onnx::shape)           (partition)           (plan)
//! ```
//!
//! One call runs the same phases as `pipecut partition --json`: [`pipecut_plan_json`] takes the
//! model's protobuf bytes and a JSON request (the fields of [`PlanRequest`], which mirror the
//! command's flags) and returns the plan document of `docs/plan-schema.md` as a C string that
//! the caller frees with [`pipecut_string_free`]. `include/pipecut.h` declares the functions;
//! `docs/embedding.md` shows the calls from C and from Python (`ctypes`).
//!
//! # Errors
//!
//! A failed call returns `NULL` and leaves a message naming the problem for
//! [`pipecut_last_error`] on the calling thread. A `NULL` return is the one error signal, so a
//! caller never has to parse a successful result to learn whether it is an error, and the plan
//! document keeps a single shape. Null pointers, invalid UTF-8, malformed requests, bad models,
//! plans that do not fit, and panics inside pipecut all take that path: no panic crosses the
//! boundary (every entry point runs under [`std::panic::catch_unwind`]).
//!
//! The same work is available to Rust callers without `unsafe` through [`plan_json`].

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::cost::{Catalog, Cluster, Mode, Schedule, UnknownOpCost};
use crate::onnx::shape::{DimBindings, ShapeInference};
use crate::partition::{
    CostSettings, CutConstraints, PartitionConfig, Planner, SolverChoice, StageCount,
};
use crate::plan::{Plan, PlanContext, PlanOptions};
use crate::{Error, Result};

/// The longest solve a request may ask for: 24 h, as `pipecut partition --time-limit` allows.
const MAX_TIME_LIMIT_SECS: f64 = 86_400.0;

/// What `config_json` may hold: the flags of `pipecut partition`, with the same defaults.
///
/// Exactly one of `cluster`, `devices` and `cluster_file` names the devices; every other field
/// is optional. Unknown fields are refused, so that a misspelt option is an error rather than a
/// silently ignored default.
///
/// ```json
/// {"cluster": "1x4xL4", "dims": {"batch": 8, "seq": 64}, "stages": 2}
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// Cluster shorthand NODESxGPUSxDEVICE, e.g. `2x8xH100-SXM`.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Devices of one machine in pipeline order, e.g. `A100-80GB,L4`.
    #[serde(default)]
    pub devices: Option<String>,
    /// A cluster JSON file (see `docs/cost-model.md`).
    #[serde(default)]
    pub cluster_file: Option<PathBuf>,
    /// Override the link inside each machine (a name from `cost-models/links`).
    #[serde(default)]
    pub intra_link: Option<String>,
    /// Override the network between machines.
    #[serde(default)]
    pub inter_link: Option<String>,
    /// Bindings of the model's symbolic dims, e.g. `{"batch": 8, "seq": 64}`; batch is per
    /// micro-batch.
    #[serde(default)]
    pub dims: BTreeMap<String, u64>,
    /// `"auto"` (the default) or a number of stages (`2` or `"2"`).
    #[serde(default = "default_stages", deserialize_with = "deserialize_stages")]
    pub stages: StageCount,
    /// Micro-batches per step (default 8; at most [`crate::schedule::MAX_MICROBATCHES`]).
    #[serde(default = "default_microbatches")]
    pub microbatches: u32,
    /// `"1f1b"` (default) or `"gpipe"`.
    #[serde(default)]
    pub schedule: Schedule,
    /// `"inference"` (default) or `"training"`.
    #[serde(default)]
    pub mode: ModeField,
    /// Fraction of each device's memory kept free for the runtime (default 0.10).
    #[serde(default = "default_memory_headroom")]
    pub memory_headroom: f64,
    /// Time budget of the whole solve in seconds (default 10).
    #[serde(default = "default_time_limit_secs")]
    pub time_limit_secs: f64,
    /// `"auto"` (default), `"dp"` or `"milp"`.
    #[serde(default)]
    pub solver: SolverChoice,
    /// Work units instead of the time limit, for the same plan on every machine (default:
    /// none; see `PartitionConfig::work_budget`).
    #[serde(default)]
    pub work_budget: Option<u64>,
    /// Tensors no cut may cross, as in the plan's `config.cut_constraints` (default: none
    /// forbidden, each MatMul kept with its bias Add).
    #[serde(default)]
    pub cut_constraints: CutConstraints,
    /// `"error"` (default), `"zero"` or `"bytes"`: how to cost ops without a rule.
    #[serde(default)]
    pub unknown_op_cost: UnknownOpCost,
    /// The file name the plan records for the model (default `<bytes>`); plans match models by
    /// their graph digest, so this is for people reading the plan.
    #[serde(default = "default_model_file_name")]
    pub model_file_name: String,
    /// Where the model's external-data files lie, for a model that has any.
    #[serde(default)]
    pub external_data_dir: Option<PathBuf>,
    /// Record the solver's wall-clock time in the plan (the plan then differs between runs).
    #[serde(default)]
    pub record_solve_time: bool,
    /// Measured times of nodes, seconds per micro-batch by node name, used instead of the cost
    /// model's estimates on every device (for a framework that profiled its own ops; see
    /// [`Planner::with_node_secs`]). Not a flag of `pipecut partition`.
    #[serde(default)]
    pub node_secs: BTreeMap<String, f64>,
    /// The regex of DeepSpeed's `partition_method="type:REGEX"` baseline, as `pipecut partition
    /// --baseline-layer-type` takes it (default: the numbered blocks).
    #[serde(default = "default_layer_type")]
    pub baseline_layer_type: String,
}

fn default_layer_type() -> String {
    crate::partition::baselines::DEFAULT_LAYER_TYPE.to_string()
}

/// Reads `stages`: `"auto"`, a positive JSON integer, or one written as text.
fn deserialize_stages<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<StageCount, D::Error> {
    use serde::de::Error as _;
    let value = serde_json::Value::deserialize(deserializer)?;
    let text = match &value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Number(n) if n.is_u64() => n.to_string(),
        other => {
            return Err(D::Error::custom(format!(
                "stages must be \"auto\" or a positive integer, got {other}"
            )))
        }
    };
    text.parse::<StageCount>()
        .map_err(|e| D::Error::custom(format!("stages: {e}")))
}

fn default_stages() -> StageCount {
    StageCount::Auto
}

/// `mode` in a [`PlanRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeField {
    /// Forward passes only.
    #[default]
    Inference,
    /// Forward and backward passes with Adam state ([`Mode::training`]).
    Training,
}

impl From<ModeField> for Mode {
    fn from(mode: ModeField) -> Mode {
        match mode {
            ModeField::Inference => Mode::Inference,
            ModeField::Training => Mode::training(),
        }
    }
}

fn default_microbatches() -> u32 {
    8
}

fn default_memory_headroom() -> f64 {
    CostSettings::default().memory_headroom
}

fn default_time_limit_secs() -> f64 {
    PartitionConfig::default().time_limit.as_secs_f64()
}

fn default_model_file_name() -> String {
    "<bytes>".into()
}

impl PlanRequest {
    /// Parses a request, refusing unknown fields and values of the wrong type.
    pub fn from_json(text: &str) -> Result<PlanRequest> {
        serde_json::from_str(text).map_err(|e| Error::InvalidRequest(format!("config_json: {e}")))
    }

    fn cluster(&self, catalog: &Catalog) -> Result<Cluster> {
        let mut cluster = match (&self.cluster, &self.devices, &self.cluster_file) {
            (Some(spec), None, None) => Cluster::parse(spec, catalog)?,
            (None, Some(list), None) => Cluster::from_device_list(list, catalog)?,
            (None, None, Some(path)) => Cluster::from_file(path, catalog)?,
            (None, None, None) => {
                return Err(Error::InvalidRequest(
                    "name the devices with one of \"cluster\", \"devices\" or \"cluster_file\""
                        .into(),
                ))
            }
            _ => {
                return Err(Error::InvalidRequest(
                    "give only one of \"cluster\", \"devices\" and \"cluster_file\"".into(),
                ))
            }
        };
        if let Some(link) = &self.intra_link {
            cluster = cluster.with_intra_node_link(link, catalog)?;
        }
        if let Some(link) = &self.inter_link {
            cluster = cluster.with_inter_node_link(link, catalog)?;
        }
        Ok(cluster)
    }

    fn time_limit(&self) -> Result<Duration> {
        let secs = self.time_limit_secs;
        if !(secs.is_finite() && (0.0..=MAX_TIME_LIMIT_SECS).contains(&secs)) {
            return Err(Error::InvalidRequest(format!(
                "time_limit_secs must be between 0 and {MAX_TIME_LIMIT_SECS}, got {secs}"
            )));
        }
        Ok(Duration::from_secs_f64(secs))
    }
}

/// Plans a model given as ONNX protobuf bytes: the safe core of [`pipecut_plan_json`].
///
/// Runs load, shape inference, partition and plan as `pipecut partition --json` does and
/// returns the same document (byte for byte, given the same `model_file_name`, whenever the
/// solve finishes within its time limit).
///
/// ```
/// let model = std::fs::read("fixtures/models/mlp.onnx").unwrap();
/// let request = r#"{"devices": "L4,L4", "dims": {"batch": 4}, "stages": 2}"#;
/// let plan = pipecut::ffi::plan_json(&model, request)?;
/// let plan = pipecut::plan::Plan::from_json(&plan)?;
/// assert_eq!(plan.stages.len(), 2);
/// # Ok::<(), pipecut::Error>(())
/// ```
pub fn plan_json(model_bytes: &[u8], config_json: &str) -> Result<String> {
    let request = PlanRequest::from_json(config_json)?;
    let stages = request.stages;
    let time_limit = request.time_limit()?;
    crate::partition::baselines::check_layer_type(&request.baseline_layer_type)
        .map_err(|why| Error::InvalidRequest(format!("baseline_layer_type: {why}")))?;
    let catalog = Catalog::builtin();
    let cluster = request.cluster(&catalog)?;

    let mut model =
        crate::onnx::load_model_from_bytes(model_bytes, request.external_data_dir.as_deref())?;
    let bindings = request
        .dims
        .iter()
        .fold(DimBindings::new(), |b, (name, &value)| b.bind(name, value));
    ShapeInference::new(bindings).run(&mut model.graph)?;

    let config = PartitionConfig {
        stages,
        devices: Vec::new(),
        settings: CostSettings {
            mode: request.mode.into(),
            schedule: request.schedule,
            microbatches: request.microbatches,
            memory_headroom: request.memory_headroom,
            unknown_ops: request.unknown_op_cost,
        },
        time_limit,
        solver: request.solver,
        work_budget: request.work_budget,
        cut_constraints: request.cut_constraints.clone(),
        baseline_layer_type: request.baseline_layer_type.clone(),
    };
    let solution = Planner::new(&model.graph, &cluster)
        .with_config(config)
        .with_node_secs(request.node_secs.clone().into_iter().collect())
        .solve()?;
    let plan = Plan::from_solution(
        &solution,
        PlanContext {
            model: model.digests(),
            model_file_name: &request.model_file_name,
            graph: &model.graph,
            dims: &request.dims,
            cluster: &cluster,
            stages,
            time_limit_secs: time_limit.as_secs_f64(),
            dtype_override: None,
        },
        PlanOptions {
            record_solve_time: request.record_solve_time,
        },
    );
    plan.ensure_finite()?;
    Ok(plan.to_json())
}

thread_local! {
    /// The message of the last failed call on this thread (see [`pipecut_last_error`]).
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: Option<String>) {
    let message = message.map(|m| {
        // A message is text from pipecut or from the model (node names); a NUL inside it would
        // cut it short in C, so it is shown as U+FFFD instead.
        CString::new(m.replace('\0', "\u{FFFD}")).unwrap_or_default()
    });
    // `try_with` fails only while the thread is being torn down; the message is then lost, but
    // the call still returns its NULL.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = message);
}

/// The message of a panic payload (`panic!` with a literal or with formatted text).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".into()
    }
}

/// Reads a NUL-terminated UTF-8 argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn utf8_arg<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        return Err(Error::InvalidRequest(format!("{name} is NULL")));
    }
    // SAFETY: non-null, and NUL-terminated and live by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) };
    bytes
        .to_str()
        .map_err(|e| Error::InvalidRequest(format!("{name} is not UTF-8: {e}")))
}

/// The body of [`pipecut_plan_json`], returning a Rust result.
///
/// # Safety
/// As for [`pipecut_plan_json`].
unsafe fn plan_json_raw(
    model_bytes: *const u8,
    model_len: usize,
    config_json: *const c_char,
) -> Result<CString> {
    if model_bytes.is_null() {
        return Err(Error::InvalidRequest("model_bytes is NULL".into()));
    }
    if model_len > isize::MAX as usize {
        return Err(Error::InvalidRequest(format!(
            "model_len {model_len} is larger than any buffer can be"
        )));
    }
    // SAFETY: non-null, at most isize::MAX bytes, and readable for `model_len` bytes during the
    // call by the caller's contract.
    let model = unsafe { std::slice::from_raw_parts(model_bytes, model_len) };
    // SAFETY: the caller's contract on `config_json`.
    let config = unsafe { utf8_arg(config_json, "config_json") }?;
    let plan = plan_json(model, config)?;
    CString::new(plan)
        .map_err(|_| Error::InvalidRequest("the plan JSON contains a NUL byte".into()))
}

/// Plans `model_bytes` (an ONNX protobuf of `model_len` bytes) as `config_json` asks and returns
/// the plan JSON, or `NULL` with the reason in [`pipecut_last_error`].
///
/// The returned string is owned by the caller, who frees it with [`pipecut_string_free`].
///
/// # Safety
/// `model_bytes` is NULL or readable for `model_len` bytes; `config_json` is NULL or a
/// NUL-terminated string; both stay valid and unchanged for the duration of the call. NULL
/// pointers and text that is not UTF-8 are reported as errors.
#[no_mangle]
pub unsafe extern "C" fn pipecut_plan_json(
    model_bytes: *const u8,
    model_len: usize,
    config_json: *const c_char,
) -> *mut c_char {
    set_last_error(None);
    // SAFETY: forwarded from this function's contract.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        plan_json_raw(model_bytes, model_len, config_json)
    }));
    match outcome {
        Ok(Ok(plan)) => plan.into_raw(),
        Ok(Err(error)) => {
            set_last_error(Some(error.to_string()));
            std::ptr::null_mut()
        }
        Err(payload) => {
            set_last_error(Some(format!(
                "internal error in pipecut (please report it): {}",
                panic_message(payload.as_ref())
            )));
            std::ptr::null_mut()
        }
    }
}

/// The message of the last failed [`pipecut_plan_json`] call on this thread, or `NULL` when the
/// last call succeeded (or none was made).
///
/// The string belongs to pipecut: do not free it; it stays valid until the next
/// `pipecut_plan_json` call on the same thread.
#[no_mangle]
pub extern "C" fn pipecut_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| {
            slot.borrow()
                .as_ref()
                .map_or(std::ptr::null(), |m| m.as_ptr())
        })
        .unwrap_or(std::ptr::null())
}

/// Frees a string returned by [`pipecut_plan_json`]; `NULL` is ignored.
///
/// # Safety
/// `text` is NULL or a pointer returned by `pipecut_plan_json` that has not been freed yet.
#[no_mangle]
pub unsafe extern "C" fn pipecut_string_free(text: *mut c_char) {
    if text.is_null() {
        return;
    }
    // SAFETY: `text` came from `CString::into_raw` in `pipecut_plan_json` and is freed once, by
    // the caller's contract. Dropping a CString cannot panic.
    drop(unsafe { CString::from_raw(text) });
}

/// pipecut's version (`CARGO_PKG_VERSION`), for callers that check what they loaded. The
/// string is static: do not free it.
#[no_mangle]
pub extern "C" fn pipecut_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(version) => version,
            Err(_) => panic!("the package version contains a NUL byte"),
        };
    VERSION.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> Option<String> {
        let ptr = pipecut_last_error();
        if ptr.is_null() {
            None
        } else {
            // SAFETY: a live NUL-terminated string owned by this thread's slot.
            Some(unsafe { CStr::from_ptr(ptr) }.to_str().unwrap().to_string())
        }
    }

    #[test]
    fn defaults_match_the_command_line() {
        let request = PlanRequest::from_json(r#"{"cluster": "1x4xL4"}"#).unwrap();
        assert_eq!(request.microbatches, 8);
        assert_eq!(request.schedule, Schedule::OneFOneB);
        assert_eq!(request.mode, ModeField::Inference);
        assert_eq!(request.memory_headroom, 0.10);
        assert_eq!(request.time_limit_secs, 10.0);
        assert_eq!(request.solver, SolverChoice::Auto);
        assert_eq!(request.unknown_op_cost, UnknownOpCost::Error);
        assert_eq!(request.stages, StageCount::Auto);
    }

    #[test]
    fn stages_accept_numbers_text_and_auto() {
        for (json, want) in [
            ("3", StageCount::Fixed(3)),
            ("\"3\"", StageCount::Fixed(3)),
            ("\"AUTO\"", StageCount::Auto),
        ] {
            let request =
                PlanRequest::from_json(&format!(r#"{{"cluster": "1x4xL4", "stages": {json}}}"#))
                    .unwrap();
            assert_eq!(request.stages, want, "{json}");
        }
        for bad in ["0", "\"two\"", "-1", "2.5"] {
            let parsed =
                PlanRequest::from_json(&format!(r#"{{"cluster": "1x4xL4", "stages": {bad}}}"#));
            let message = parsed.unwrap_err().to_string();
            assert!(message.contains("stages"), "{bad}: {message}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_enums_are_refused() {
        let message = PlanRequest::from_json(r#"{"cluster": "1x4xL4", "stage": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(message.contains("unknown field `stage`"), "{message}");
        let message = PlanRequest::from_json(r#"{"cluster": "1x4xL4", "schedule": "zb"}"#)
            .unwrap_err()
            .to_string();
        assert!(message.contains("zb"), "{message}");
    }

    #[test]
    fn the_last_error_is_per_call_and_per_thread() {
        let config = CString::new(r#"{"cluster": "1x2xL4"}"#).unwrap();
        // SAFETY: a NULL model pointer is an error the function checks for.
        let plan = unsafe { pipecut_plan_json(std::ptr::null(), 0, config.as_ptr()) };
        assert!(plan.is_null());
        assert_eq!(
            last_error().as_deref(),
            Some("invalid request: model_bytes is NULL")
        );
        let other_thread = std::thread::spawn(last_error).join().unwrap();
        assert_eq!(other_thread, None);
        assert!(last_error().is_some(), "reading the error keeps it");
    }

    #[test]
    fn panics_become_errors() {
        let outcome = catch_unwind(|| -> usize { panic!("boom {}", 7) });
        assert_eq!(panic_message(outcome.unwrap_err().as_ref()), "boom 7");
        let outcome = catch_unwind(|| -> usize { panic!("literal") });
        assert_eq!(panic_message(outcome.unwrap_err().as_ref()), "literal");
    }

    #[test]
    fn nul_bytes_in_messages_are_replaced() {
        set_last_error(Some("node 'a\0b' failed".into()));
        assert_eq!(last_error().as_deref(), Some("node 'a\u{FFFD}b' failed"));
        set_last_error(None);
        assert_eq!(last_error(), None);
    }

    #[test]
    fn the_version_is_the_package_version() {
        // SAFETY: a static NUL-terminated string.
        let version = unsafe { CStr::from_ptr(pipecut_version()) };
        assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
