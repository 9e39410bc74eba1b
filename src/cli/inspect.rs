//! `pipecut inspect MODEL [--dim NAME=V]... [--json]`.

use std::collections::BTreeSet;
use std::process::ExitCode;

use crate::graph::Dim;
use crate::onnx::inspect::ModelSummary;
use anyhow::Context;
use clap::Args;

use super::ModelArgs;

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let bindings = args.model.bindings()?;
    let path = &args.model.model;
    let mut model = super::load_model(path, super::Weights::NotRead)?;
    let graph = &model.graph;
    let symbolic_dims: BTreeSet<String> = graph
        .inputs()
        .iter()
        .flat_map(|&id| graph.tensor(id).shape.iter().flatten())
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(s.to_string()),
            Dim::Known(_) => None,
        })
        .collect();
    // Lenient: report every node that cannot be inferred rather than stopping at the first.
    let report = args
        .model
        .shape_inference(&model.graph)?
        .lenient(true)
        .run(&mut model.graph)
        .with_context(|| format!("cannot infer shapes of '{}'", path.display()))?;
    let first_failure = report.failures.first().cloned();
    let bound = bindings.iter().map(|(k, v)| (k.to_string(), v)).collect();
    let summary = ModelSummary::new(&model, symbolic_dims, bound, report);
    if args.json {
        super::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&summary)?))?;
    } else {
        super::print_stdout(&summary.to_string())?;
    }
    match first_failure {
        // The summary is printed either way; a model whose shapes cannot all be inferred cannot
        // be planned, so the exit code says so.
        Some(failure) => anyhow::bail!("'{}': {failure}", path.display()),
        None => Ok(ExitCode::SUCCESS),
    }
}
