//! `--profile FILE`: plan, check or run on measured node times (`pipecut profile`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cost::measured::{content_sha256, NodeTimes};
use crate::graph::Graph;
use anyhow::Context;
use clap::Args;

use super::escape_controls;

#[derive(Debug, Args, Default)]
pub struct MeasuredArgs {
    /// Cost nodes from measured times (`pipecut profile --out FILE`, or an onnxruntime trace
    /// converted by it) on stages of the device the file names; the roofline costs the nodes it
    /// lacks. Repeatable, one file per device kind.
    #[arg(long = "profile", value_name = "TIMES.json")]
    node_times: Vec<PathBuf>,
}

impl MeasuredArgs {
    /// Reads every file and makes `graph` cost from it, printing how much each covers.
    /// `devices` are the device names the plan may use (a file for none of them is refused);
    /// `dims` the dims bound (a file measured at others is refused). Returns the files read.
    pub fn apply(
        &self,
        graph: &mut Graph,
        graph_sha256: &str,
        dims: &BTreeMap<String, u64>,
        devices: &[&str],
    ) -> anyhow::Result<Vec<NodeTimes>> {
        let mut applied = Vec::new();
        for path in &self.node_times {
            let text = crate::io::read_json_text(path, "node times")?;
            let origin = path.display().to_string();
            let times = NodeTimes::from_json(&text, &origin)?;
            if !devices.is_empty() && !devices.contains(&times.device.as_str()) {
                anyhow::bail!(
                    "'{}' holds node times for '{}', which is not a device of this plan ({})",
                    escape_controls(&origin),
                    escape_controls(&times.device),
                    devices.join(", ")
                );
            }
            let coverage = times
                .apply(&content_sha256(text.as_bytes()), graph, graph_sha256, dims)
                .with_context(|| format!("'{}'", escape_controls(&origin)))?;
            let mut note = format!(
                "note: '{}': {} of {} nodes costed from times measured on {} ({})",
                escape_controls(&origin),
                coverage.measured,
                coverage.measured + coverage.unmeasured.len(),
                times.device,
                times.measured_with.backend
            );
            if let Some(first) = coverage.unmeasured.first() {
                note += &format!(
                    "; the roofline costs the other {} (first: '{}')",
                    coverage.unmeasured.len(),
                    escape_controls(first)
                );
            }
            if coverage.unknown > 0 {
                note += &format!("; {} measured names are not in the model", coverage.unknown);
            }
            if coverage.other_graph {
                note += "; measured on a graph with another digest (nodes matched by name)";
            }
            if times.measured_with.noisy {
                note += "; the measurement was noisy (spread over 25%)";
            }
            eprintln!("{note}");
            applied.push(times);
        }
        Ok(applied)
    }
}

/// The distinct device names of a cluster, in order.
pub fn device_names(cluster: &crate::cost::Cluster) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for node in cluster.nodes() {
        for device in &node.devices {
            if !names.contains(&device.name.as_str()) {
                names.push(&device.name);
            }
        }
    }
    names
}

/// The device names a plan's stages use (its profile hashes name them).
pub fn plan_devices(plan: &crate::plan::Plan) -> Vec<&str> {
    plan.cost_model
        .keys()
        .filter_map(|k| k.strip_prefix("device:"))
        .collect()
}
