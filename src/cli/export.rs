//! `pipecut export PLAN.json MODEL --out-dir DIR [--dim NAME=V]... [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use pipecut::onnx::export::{export_stages, Manifest, TensorSource};
use pipecut::onnx::inspect::human_bytes;
use pipecut::plan::Plan;

use super::{print_stdout, ModelArgs};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for, and `--dim` bindings: boundary tensors the model does
    /// not declare carry a bound dim's size instead of its symbol.
    #[command(flatten)]
    model: ModelArgs,
    /// Directory for stage_<k>.onnx and manifest.json (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Print the manifest as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("cannot read plan '{}'", args.plan.display()))?;
    let plan = Plan::from_json(&text).with_context(|| format!("'{}'", args.plan.display()))?;
    let model = args.model.load_typed(super::Weights::Read)?;
    let model_path = &args.model.model;
    let stages = plan
        .stage_nodes(&model.sha256, &model.graph)
        .with_context(|| format!("'{}'", args.plan.display()))?;
    let manifest = export_stages(model_path, &model.graph, &stages, &args.out_dir)
        .with_context(|| format!("cannot export '{}'", model_path.display()))?;
    if args.json {
        print_stdout(&manifest.to_json())?;
    } else {
        print_stdout(&table(&manifest, &args.out_dir))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn table(manifest: &Manifest, out_dir: &std::path::Path) -> String {
    let mut text = format!(
        "{} stages of {} written to {}\n\n",
        manifest.stages.len(),
        manifest.model.file_name,
        out_dir.display()
    );
    text.push_str(&format!(
        "{:>5}  {:<14}  {:>6}  {:>6}  {:>7}  {:>12}  {:>10}  {:>10}\n",
        "stage", "file", "nodes", "inputs", "outputs", "initializers", "params", "file size"
    ));
    for stage in &manifest.stages {
        text.push_str(&format!(
            "{:>5}  {:<14}  {:>6}  {:>6}  {:>7}  {:>12}  {:>10}  {:>10}\n",
            stage.stage,
            stage.file,
            stage.nodes,
            stage.inputs.len(),
            stage.outputs.len(),
            stage.parameters,
            human_bytes(stage.parameter_bytes),
            human_bytes(stage.file_bytes)
        ));
    }
    let from_stage: Vec<String> = manifest
        .outputs
        .iter()
        .map(|o| match o.from {
            TensorSource::Stage { stage } => format!("{} ← stage {stage}", o.tensor),
            TensorSource::ModelInput => format!("{} ← model input", o.tensor),
        })
        .collect();
    text.push_str(&format!("\nmodel outputs: {}\n", from_stage.join(", ")));
    for file in &manifest.external_data {
        text.push_str(&format!(
            "external data: {} ({:?})\n",
            file.location, file.placement
        ));
    }
    text.push_str("routes: manifest.json\n");
    text
}
