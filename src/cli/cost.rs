//! `pipecut cost MODEL --device NAME [--dim NAME=V]... [--mode training] [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cost::{Catalog, CostModel, Mode, NodeCost, UnknownOpCost};
use crate::onnx::inspect::{count_of, human_bytes};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::ModelArgs;

/// Bytes in a MiB: the table's columns use the binary units the rest of pipecut prints.
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Inference,
    Training,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Inference => Mode::Inference,
            ModeArg::Training => Mode::training(),
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum UnknownOpArg {
    Error,
    Zero,
    Bytes,
}

impl From<UnknownOpArg> for UnknownOpCost {
    fn from(u: UnknownOpArg) -> UnknownOpCost {
        match u {
            UnknownOpArg::Error => UnknownOpCost::Error,
            UnknownOpArg::Zero => UnknownOpCost::Zero,
            UnknownOpArg::Bytes => UnknownOpCost::Bytes,
        }
    }
}

#[derive(Debug, Args)]
pub struct CostArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Device to cost on: a name from cost-models/ (e.g. H100-SXM) or a profile .json file.
    #[arg(long)]
    device: String,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    /// Inference (forward only) or training (forward + backward).
    #[arg(long, value_enum, default_value = "inference")]
    mode: ModeArg,
    /// How to cost ops without a rule: refuse (error), as free (zero), or as a copy (bytes).
    #[arg(long, value_enum, default_value = "error")]
    unknown_op_cost: UnknownOpArg,
    /// Cost every floating-point tensor at this precision instead of the file's.
    #[arg(long, value_enum, value_name = "bf16|fp16|fp32")]
    dtype: Option<super::DtypeArg>,
    /// Rows of the per-node table to print (all with --json).
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct CostReport<'a> {
    device: &'a str,
    mode: Mode,
    total_time_secs: f64,
    total_flops: f64,
    total_bytes_moved: f64,
    total_param_bytes: u64,
    fallback_nodes: usize,
    nodes: Vec<NodeCost>,
}

/// Resolves `--device`: a catalog name, or a profile file (e.g. written by `pipecut calibrate`).
pub fn device_catalog(device: &str) -> anyhow::Result<(Catalog, String)> {
    let mut catalog = Catalog::builtin().with_user_profiles()?;
    let path = PathBuf::from(device);
    let name = if device.ends_with(".json") && path.exists() {
        catalog.add_file(&path)?
    } else {
        catalog.device(device)?.name.clone()
    };
    Ok((catalog, name))
}

pub fn run(args: CostArgs) -> anyhow::Result<ExitCode> {
    let (catalog, name) = device_catalog(&args.device)?;
    let device = catalog.device(&name)?;
    let mut model = args.model.load_bound(super::Weights::NotRead)?;
    if let Some(dtype) = args.dtype {
        let precision: crate::cost::Precision = dtype.into();
        model.graph.override_float_dtype(precision.dtype());
    }
    let dims: std::collections::BTreeMap<String, u64> = args.model.dims()?;
    args.measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &dims,
        &[device.name.as_str()],
    )?;
    let cost_model = CostModel::new(device)
        .with_mode(args.mode.into())
        .with_unknown_ops(args.unknown_op_cost.into());
    let nodes = slowest_first(&cost_model, &model.graph)?;
    let params: u64 = model
        .graph
        .parameters()
        .map(|(_, t)| t.param().map_or(0, |p| p.bytes))
        .sum();
    let report = CostReport {
        device: &device.name,
        mode: cost_model.mode(),
        total_time_secs: nodes.iter().map(|c| c.time_secs).sum(),
        total_flops: nodes.iter().map(|c| c.flops).sum(),
        total_bytes_moved: nodes.iter().map(|c| c.bytes_moved).sum(),
        total_param_bytes: params,
        fallback_nodes: nodes.iter().filter(|c| c.fallback).count(),
        nodes,
    };
    if args.json {
        return super::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into);
    }
    super::print_stdout(&table(&report, args.top)?)?;
    Ok(ExitCode::SUCCESS)
}

/// Every node's cost, slowest first (ties by name, so the order is stable); the nodes whose
/// cost is a guess are named on stderr, so `--json` stays clean.
fn slowest_first(
    cost_model: &CostModel<'_>,
    graph: &crate::graph::Graph,
) -> anyhow::Result<Vec<NodeCost>> {
    let mut nodes: Vec<NodeCost> = cost_model
        .node_costs(graph)?
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    let fallback: Vec<&str> = nodes
        .iter()
        .filter(|c| c.fallback)
        .map(|c| c.op.as_str())
        .collect();
    if !fallback.is_empty() {
        eprintln!(
            "note: {} node(s) costed by the --unknown-op-cost fallback or with an assumed \
             trip count (a loop run once): {}",
            fallback.len(),
            fallback.join(", ")
        );
    }
    nodes.sort_by(|a, b| {
        b.time_secs
            .total_cmp(&a.time_secs)
            .then_with(|| a.node.cmp(&b.node))
    });
    Ok(nodes)
}

/// The `--top` slowest nodes, then the totals.
fn table(report: &CostReport<'_>, top: usize) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    use std::fmt::Write;
    writeln!(
        out,
        "{:<48} {:<20} {:>12} {:>12} {:>11} {:>11} {:>11}",
        "node", "op", "GFLOP", "MiB moved", "time (us)", "params MiB", "out MiB"
    )?;
    for c in report.nodes.iter().take(top) {
        writeln!(
            out,
            "{:<48} {:<20} {:>12.3} {:>12.3} {:>11.2} {:>11.3} {:>11.3}",
            super::shorten_name(&c.node, 48),
            super::shorten_name(&c.op, 20),
            c.flops / 1e9,
            c.bytes_moved / MIB,
            c.time_secs * 1e6,
            c.param_bytes as f64 / MIB,
            c.output_bytes as f64 / MIB
        )?;
    }
    if report.nodes.len() > top {
        writeln!(
            out,
            "... {} more nodes (--top N, or --json for all)",
            report.nodes.len() - top
        )?;
    }
    writeln!(
        out,
        "total on {} ({}): {}, {:.3} GFLOP, {} moved, {:.1} us, params {}",
        report.device,
        match report.mode {
            Mode::Inference => "inference",
            Mode::Training { .. } => "training",
        },
        count_of(report.nodes.len(), "node"),
        report.total_flops / 1e9,
        human_bytes(report.total_bytes_moved as u64),
        report.total_time_secs * 1e6,
        human_bytes(report.total_param_bytes)
    )?;
    Ok(out)
}
