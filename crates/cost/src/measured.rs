//! Measured node times: what each node of one model took on one device, in place of the
//! roofline's prediction.
//!
//! A [`NodeTimes`] file (`pipecut profile --out times.json`, schema `pipecut-node-times-v1`)
//! holds, per node, the median of repeated runs and the spread of those runs; `partition`,
//! `plan-cluster` and `cost` take it with `--profile` and cost every node it names on stages of
//! its device from the measurement (the roofline only for the rest, and they say how many).
//! onnxruntime's profiler output (`SessionOptions.enable_profiling`) converts to the same file
//! ([`NodeTimes::from_onnxruntime_trace`]), so times measured on a GPU with onnxruntime plan too.
//!
//! Why a file of times and not calibrated efficiencies: a calibrated device profile still
//! predicts each op from its FLOPs and bytes, and on a CPU that misses by 2–10× per stage
//! (issue 16: the share of work between two stages off by up to 22 points); the measurement of
//! the node itself does not.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;
use pipecut_ir::graph::Graph;

/// The schema tag of a node-times file.
pub const NODE_TIMES_SCHEMA: &str = "pipecut-node-times-v1";

/// Spread of repeats ((p90 − p10) / median of the whole-model time) above which a measurement is
/// called noisy: the machine was busy, and plans made from it may not hold.
pub const NOISY_SPREAD: f64 = 0.25;

/// Measured times of one model's nodes on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeTimes {
    /// Always [`NODE_TIMES_SCHEMA`].
    pub schema: String,
    /// The catalog device these times stand for (`cpu`, `H100-SXM`, a profile file's name).
    pub device: String,
    /// How and where they were measured.
    pub measured_with: Measurement,
    /// The model measured: its graph digest and the dims bound.
    pub model: MeasuredModel,
    /// Every node measured, in execution order.
    pub nodes: Vec<MeasuredNode>,
}

/// How the times were taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// `pipecut-cpu`, `onnxruntime:CPUExecutionProvider`, …
    pub backend: String,
    /// Threads a kernel could use, when known.
    pub threads: Option<usize>,
    /// Unmeasured runs first (caches, allocator, thread pools).
    pub warmup: usize,
    /// Measured runs; each node's statistic is over these.
    pub repeats: usize,
    /// Always `median`: robust to the runs a busy machine slows down.
    pub statistic: String,
    /// Median of the whole model's time over the repeats.
    pub total_secs: f64,
    /// (p90 − p10) / median of the whole model's time over the repeats.
    pub total_spread: f64,
    /// Whether `total_spread` exceeded [`NOISY_SPREAD`].
    pub noisy: bool,
}

/// Which model, at which dims.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MeasuredModel {
    /// sha256 of the graph without initializer bytes (as plans record it); empty when unknown
    /// (an imported onnxruntime trace).
    pub graph_sha256: String,
    /// The symbolic dims bound for the measurement.
    pub dims: BTreeMap<String, u64>,
}

/// One node's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MeasuredNode {
    /// The node's name in the model.
    pub name: String,
    /// Its op type.
    pub op: String,
    /// Median time of one run of the node.
    pub secs: f64,
    /// 10th percentile over the repeats.
    pub p10_secs: f64,
    /// 90th percentile over the repeats.
    pub p90_secs: f64,
    /// Bytes of its outputs as run, when known.
    pub output_bytes: Option<u64>,
}

/// The median, 10th and 90th percentiles of `samples` (nearest rank; not empty).
pub fn percentiles(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

impl MeasuredNode {
    /// A node's statistics from its per-repeat `samples` (seconds, not empty).
    pub fn from_samples(name: &str, op: &str, samples: &[f64], output_bytes: Option<u64>) -> Self {
        let (secs, p10_secs, p90_secs) = percentiles(samples);
        MeasuredNode {
            name: name.to_string(),
            op: op.to_string(),
            secs,
            p10_secs,
            p90_secs,
            output_bytes,
        }
    }
}

impl Measurement {
    /// The whole-model statistics of `totals` (one per repeat, not empty).
    pub fn from_totals(
        backend: &str,
        threads: Option<usize>,
        warmup: usize,
        totals: &[f64],
    ) -> Self {
        let (median, p10, p90) = percentiles(totals);
        let spread = if median > 0.0 {
            (p90 - p10) / median
        } else {
            0.0
        };
        Measurement {
            backend: backend.to_string(),
            threads,
            warmup,
            repeats: totals.len(),
            statistic: "median".into(),
            total_secs: median,
            total_spread: spread,
            noisy: spread > NOISY_SPREAD,
        }
    }
}

/// The largest whole-model time per micro-batch that measured node times may add up to: 10^12 s
/// (about 31,700 years). Any real model is many orders of magnitude below it, so a larger total
/// is a unit mistake or hostile input; and it keeps every figure derived from stage times (steps
/// of up to 65,536 micro-batches over thousands of stages, throughputs, ratios) finite and
/// representable in the plan's JSON.
pub const MAX_TOTAL_SECS: f64 = 1e12;

/// Refuses a node time that is not a finite non-negative number, a node listed twice (which of
/// its times would the plan use?), and times that sum beyond [`MAX_TOTAL_SECS`]: a profile of
/// 1e308 s planned to a plan full of `null` figures that `check` then refused.
fn check_nodes(nodes: &[MeasuredNode]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0.0;
    for node in nodes {
        if !(node.secs.is_finite() && node.secs >= 0.0) {
            return Err(format!(
                "node '{}' has time {}, not a finite non-negative number of seconds",
                node.name, node.secs
            ));
        }
        if !seen.insert(node.name.as_str()) {
            return Err(format!("node '{}' is listed twice", node.name));
        }
        total += node.secs;
        if total > MAX_TOTAL_SECS {
            return Err(format!(
                "the node times sum beyond {MAX_TOTAL_SECS:e} s (at node '{}', {:e} s): is the unit wrong?",
                node.name, node.secs
            ));
        }
    }
    Ok(())
}

impl NodeTimes {
    /// Parses and checks a node-times file's text; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<NodeTimes, Error> {
        let bad = |detail: String| Error::Profile {
            origin: origin.to_string(),
            detail,
        };
        let times: NodeTimes = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if times.schema != NODE_TIMES_SCHEMA {
            return Err(bad(format!(
                "schema is '{}', expected '{NODE_TIMES_SCHEMA}'",
                times.schema
            )));
        }
        check_nodes(&times.nodes).map_err(bad)?;
        let whole = &times.measured_with;
        for (field, value) in [
            ("measured_with.total_secs", whole.total_secs),
            ("measured_with.total_spread", whole.total_spread),
        ] {
            if !(value.is_finite() && (0.0..=MAX_TOTAL_SECS).contains(&value)) {
                return Err(bad(format!(
                    "{field} is {value:e}, not between 0 and {MAX_TOTAL_SECS:e}"
                )));
            }
        }
        Ok(times)
    }

    /// The file's text as `pipecut profile` writes it.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("node times serialize");
        text.push('\n');
        text
    }

    /// Measured seconds per node name.
    pub fn by_name(&self) -> BTreeMap<&str, f64> {
        self.nodes
            .iter()
            .map(|n| (n.name.as_str(), n.secs))
            .collect()
    }

    /// Converts onnxruntime's profiler output (the Chrome-trace JSON array that
    /// `SessionOptions.enable_profiling` writes) into node times for `device`: every
    /// `"cat": "Node"` event named `<node>_kernel_time`, grouped by node, the median over the
    /// runs the trace holds. Run the session with `graph_optimization_level = ORT_DISABLE_ALL`
    /// so that its nodes are the model's (fused nodes carry names the model does not have, and
    /// are reported as unmatched when planning).
    pub fn from_onnxruntime_trace(
        text: &str,
        origin: &str,
        device: &str,
    ) -> Result<NodeTimes, Error> {
        let bad = |detail: String| Error::Profile {
            origin: origin.to_string(),
            detail,
        };
        let events: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| {
            bad(format!(
                "not an onnxruntime profile (a JSON array of events): {e}"
            ))
        })?;
        let mut samples: BTreeMap<String, (String, Vec<f64>, Option<u64>, usize)> = BTreeMap::new();
        let mut providers: Vec<String> = Vec::new();
        let mut runs: Vec<f64> = Vec::new();
        for event in &events {
            let name = event["name"].as_str().unwrap_or_default();
            let micros = event["dur"].as_f64();
            if event["cat"] == "Session" && name == "model_run" {
                runs.extend(micros.map(|us| us * 1e-6));
            }
            let (Some(node), Some(micros)) = (name.strip_suffix("_kernel_time"), micros) else {
                continue;
            };
            if event["cat"] != "Node" {
                continue;
            }
            let args = &event["args"];
            let op = args["op_name"].as_str().unwrap_or_default().to_string();
            if let Some(provider) = args["provider"].as_str() {
                if !providers.iter().any(|p| p == provider) {
                    providers.push(provider.to_string());
                }
            }
            let output_bytes = args["output_size"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .or_else(|| args["output_size"].as_u64());
            let order = samples.len();
            let entry =
                samples
                    .entry(node.to_string())
                    .or_insert((op, Vec::new(), output_bytes, order));
            entry.1.push(micros * 1e-6);
        }
        if samples.is_empty() {
            return Err(bad(
                "no node events (`\"cat\": \"Node\"`, `<node>_kernel_time`): was the session run with profiling enabled?".into(),
            ));
        }
        let repeats = samples.values().map(|s| s.1.len()).min().unwrap_or(0);
        let mut nodes: Vec<(usize, MeasuredNode)> = samples
            .iter()
            .map(|(name, (op, times, bytes, order))| {
                (*order, MeasuredNode::from_samples(name, op, times, *bytes))
            })
            .collect();
        nodes.sort_by_key(|(order, _)| *order);
        let nodes: Vec<MeasuredNode> = nodes.into_iter().map(|(_, n)| n).collect();
        check_nodes(&nodes).map_err(bad)?;
        if runs.is_empty() {
            runs.push(nodes.iter().map(|n| n.secs).sum());
        }
        Ok(NodeTimes {
            schema: NODE_TIMES_SCHEMA.into(),
            device: device.to_string(),
            measured_with: Measurement {
                repeats,
                ..Measurement::from_totals(
                    &format!("onnxruntime:{}", providers.join("+")),
                    None,
                    0,
                    &runs,
                )
            },
            model: MeasuredModel {
                graph_sha256: String::new(),
                dims: BTreeMap::new(),
            },
            nodes,
        })
    }
}

/// How far a profile covers a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Nodes costed from the measurement.
    pub measured: usize,
    /// Nodes the profile lacks, costed by the roofline (names, in order).
    pub unmeasured: Vec<String>,
    /// Entries of the profile that name no node of the model.
    pub unknown: usize,
    /// Whether the profile was measured on a graph with another digest.
    pub other_graph: bool,
}

impl NodeTimes {
    /// Makes `graph` cost the nodes this profile names, on stages of its device, from the
    /// measurement. The profile must have been measured at the dims `dims` binds: a time at
    /// batch 8 says little about batch 16.
    pub fn apply(
        &self,
        source_sha256: &str,
        graph: &mut Graph,
        graph_sha256: &str,
        dims: &BTreeMap<String, u64>,
    ) -> Result<Coverage, Error> {
        if let Some((name, measured)) = self
            .model
            .dims
            .iter()
            .find(|(name, value)| dims.get(*name).is_some_and(|v| v != *value))
        {
            return Err(Error::PartitionConfig(format!(
                "the node times were measured with {name}={measured}, but this plan binds {name}={}: profile again at these dims",
                dims[name]
            )));
        }
        let by_name = self.by_name();
        let mut secs = HashMap::new();
        let mut unmeasured = Vec::new();
        for &id in graph.topological_order() {
            let name = &graph.node(id).name;
            match by_name.get(name.as_str()) {
                Some(&t) => {
                    secs.insert(id, t);
                }
                None => unmeasured.push(name.clone()),
            }
        }
        let coverage = Coverage {
            measured: secs.len(),
            unknown: by_name.len() - secs.len(),
            unmeasured,
            other_graph: !self.model.graph_sha256.is_empty()
                && self.model.graph_sha256 != graph_sha256,
        };
        graph.set_measured_secs(&self.device, source_sha256, secs);
        Ok(coverage)
    }
}

/// sha256 of a file's bytes, hex: how a plan names the node times it was made from.
pub fn content_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_nearest_ranks() {
        let samples = [5.0, 1.0, 4.0, 2.0, 3.0, 100.0, 3.0, 3.0, 2.0, 4.0, 3.0];
        // Sorted: 1 2 2 3 3 3 3 4 4 5 100; ranks 1, 5 and 9 of 0..10.
        assert_eq!(percentiles(&samples), (3.0, 2.0, 5.0));
        assert_eq!(percentiles(&[7.0]), (7.0, 7.0, 7.0));
    }

    #[test]
    fn a_busy_run_is_called_noisy() {
        let quiet = Measurement::from_totals("pipecut-cpu", Some(1), 2, &[1.0, 1.01, 0.99, 1.0]);
        assert!(!quiet.noisy, "{quiet:?}");
        let busy = Measurement::from_totals("pipecut-cpu", Some(1), 2, &[1.0, 1.6, 0.9, 2.0, 1.0]);
        assert!(busy.noisy && busy.total_spread > NOISY_SPREAD, "{busy:?}");
    }

    #[test]
    fn onnxruntime_traces_group_kernel_times_by_node() {
        // The shape of onnxruntime 1.x's profiler output, two runs of a two-node model.
        let trace = r#"[
          {"cat":"Session","name":"model_loading_uri","dur":900,"args":{}},
          {"cat":"Node","name":"mm_fence_before","dur":0,"args":{"op_name":"MatMul"}},
          {"cat":"Node","name":"mm_kernel_time","dur":40,"args":{"op_name":"MatMul","provider":"CUDAExecutionProvider","output_size":"4096"}},
          {"cat":"Node","name":"relu_kernel_time","dur":8,"args":{"op_name":"Relu","provider":"CUDAExecutionProvider","output_size":"4096"}},
          {"cat":"Session","name":"model_run","dur":60,"args":{}},
          {"cat":"Node","name":"mm_kernel_time","dur":44,"args":{"op_name":"MatMul","provider":"CUDAExecutionProvider","output_size":"4096"}},
          {"cat":"Node","name":"relu_kernel_time","dur":6,"args":{"op_name":"Relu","provider":"CUDAExecutionProvider","output_size":"4096"}},
          {"cat":"Session","name":"model_run","dur":58,"args":{}}
        ]"#;
        let times = NodeTimes::from_onnxruntime_trace(trace, "t.json", "H100-SXM").unwrap();
        assert_eq!(times.device, "H100-SXM");
        assert_eq!(
            times.measured_with.backend,
            "onnxruntime:CUDAExecutionProvider"
        );
        assert_eq!(times.measured_with.repeats, 2);
        let names: Vec<&str> = times.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["mm", "relu"]);
        // Two samples: the nearest-rank median of [40, 44] µs is the upper one.
        assert!(
            (times.nodes[0].secs - 44e-6).abs() < 1e-12,
            "{:?}",
            times.nodes[0]
        );
        assert_eq!(times.nodes[0].output_bytes, Some(4096));
        let again = NodeTimes::from_json(&times.to_json(), "again").unwrap();
        assert_eq!(again, times);
    }

    #[test]
    fn malformed_files_are_refused_with_the_reason() {
        let err = NodeTimes::from_onnxruntime_trace("{}", "x.json", "cpu").unwrap_err();
        assert!(err.to_string().contains("JSON array"), "{err}");
        let err = NodeTimes::from_onnxruntime_trace("[]", "x.json", "cpu").unwrap_err();
        assert!(err.to_string().contains("profiling enabled"), "{err}");
        let err = NodeTimes::from_json(r#"{"schema":"other"}"#, "y.json").unwrap_err();
        assert!(err.to_string().contains("y.json"), "{err}");
    }
}
