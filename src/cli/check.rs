//! `pipecut check plan.json MODEL`: is this plan valid for this model?

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::onnx::shape::{DimBindings, ShapeInference};
use crate::onnx::Model;
use crate::plan::{Plan, PlanValue};
use anyhow::Context;
use clap::Args;

use super::measured::MeasuredArgs;
use super::print_stdout;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for.
    model: PathBuf,
    /// Print the result as JSON (`{"valid": true, "stages", "nodes", "bottleneck_secs"}`).
    #[arg(long)]
    json: bool,
    /// Recompute every figure of a hand-edited plan from its node assignment (the `nodes` each
    /// stage lists) and write the corrected plan, with the status `hand_edited`. Move a node
    /// between stages in the JSON, then run this once. Writes over PLAN unless --out is given.
    #[arg(long)]
    rewrite: bool,
    /// With --rewrite: write the corrected plan here instead of over PLAN.
    #[arg(long, requires = "rewrite", value_name = "PATH")]
    out: Option<PathBuf>,
    #[command(flatten)]
    measured: MeasuredArgs,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
}

/// Reads a plan file.
pub(crate) fn read_plan(path: &Path) -> anyhow::Result<Plan> {
    let text = crate::io::read_json_text(path, "plan")?;
    Plan::from_json(&text).with_context(|| format!("'{}'", path.display()))
}

/// Loads the model a plan was made for, with the dims bound as the plan records them.
pub(crate) fn load_for_plan(
    plan: &Plan,
    plan_path: &Path,
    path: &Path,
    measured: &MeasuredArgs,
) -> anyhow::Result<Model> {
    let model = super::load_model(path, super::Weights::NotRead)?;
    super::match_plan_model(plan, &model, plan_path)?;
    type_for_plan(plan, model, path, measured)
}

/// Types a loaded model (`path` names it in errors) with the dims the plan records. The caller
/// has matched it to the plan ([`super::match_plan_model`]): another graph may lack the dims.
pub(crate) fn type_for_plan(
    plan: &Plan,
    mut model: Model,
    path: &Path,
    measured: &MeasuredArgs,
) -> anyhow::Result<Model> {
    require_value_inputs(plan, &model.graph, path)?;
    plan_inference(plan, &plan.model.dims, &model.graph)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", path.display()))?;
    if let Some(precision) = plan.config.dtype_override {
        model.graph.override_float_dtype(precision.dtype());
    }
    let devices = super::measured::plan_devices(plan);
    measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &plan.model.dims,
        &devices,
    )?;
    Ok(model)
}

/// Shape inference as the plan was made: `dims` bound (the plan's, or a run's overrides of
/// them) and the plan's sample values given to those of their inputs that `graph` has (a stage
/// file has only those its nodes read).
pub(crate) fn plan_inference(
    plan: &Plan,
    dims: &BTreeMap<String, u64>,
    graph: &crate::graph::Graph,
) -> ShapeInference {
    let mut bindings = DimBindings::new();
    for (name, value) in dims {
        bindings = bindings.bind(name, *value);
    }
    let is_input = |name: &str| {
        graph
            .tensor_id(name)
            .is_some_and(|id| graph.inputs().contains(&id))
    };
    let values = plan
        .model
        .values
        .iter()
        .filter(|(name, _)| is_input(name))
        .map(|(name, value)| (name.clone(), value.const_value()))
        .collect();
    ShapeInference::new(bindings).with_input_values(values)
}

/// Refuses a plan that records a sample value for a tensor that is not an input of the whole
/// model (an edited plan: stage files, which have fewer inputs, skip the values they lack).
pub(crate) fn require_value_inputs(
    plan: &Plan,
    graph: &crate::graph::Graph,
    model: &Path,
) -> anyhow::Result<()> {
    for name in plan.model.values.keys() {
        let is_input = graph
            .tensor_id(name)
            .is_some_and(|id| graph.inputs().contains(&id));
        if !is_input {
            anyhow::bail!(
                "the plan records a sample value for '{name}', which is not an input of '{}'",
                model.display()
            );
        }
    }
    Ok(())
}

/// Refuses sample values given again on the command line (`--value`) that are not the ones
/// the plan was made with, or that it was made without: the plan holds for its own only.
pub(crate) fn agree_with_plan_values(
    plan: &Plan,
    given: &BTreeMap<String, PlanValue>,
) -> anyhow::Result<()> {
    for (name, value) in given {
        let Some(recorded) = plan.model.values.get(name) else {
            anyhow::bail!(
                "--value {name}: the plan was made without a sample value for '{name}'; make a new plan with `pipecut partition --value {name}=FILE.npy`"
            );
        };
        let same = recorded.shape == value.shape && recorded.const_value() == value.const_value();
        if !same {
            anyhow::bail!(
                "--value {name} is not the value the plan was made with (sha256 {}…, given {}…): the plan holds for its own value only; leave --value out, or make a new plan with this one",
                &recorded.sha256[..12.min(recorded.sha256.len())],
                &value.sha256[..12]
            );
        }
    }
    Ok(())
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let plan = read_plan(&args.plan)?;
    let model = load_for_plan(&plan, &args.plan, &args.model, &args.measured)?;
    if args.rewrite {
        return rewrite(&args, &plan, &model);
    }
    let report = plan
        .check(model.digests(), &model.graph, &args.profiles.catalog(&[])?)
        .with_context(|| format!("'{}'", args.plan.display()))?;
    if let Some(note) = &report.note {
        eprintln!("note: {}", super::escape_controls(note));
    }
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["valid"] = serde_json::Value::Bool(true);
        print_stdout(&format!("{value}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    print_stdout(&format!(
        "{}: valid plan for {} — {} on {}, every stage within memory, figures recomputed (bottleneck {:.3} ms)\n",
        args.plan.display(),
        args.model.display(),
        crate::onnx::inspect::count_of(report.nodes, "node"),
        crate::onnx::inspect::count_of(report.stages, "stage"),
        report.bottleneck_secs * 1e3
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `check --rewrite`: the plan with its figures recomputed, written where asked, then checked.
fn rewrite(args: &CheckArgs, plan: &Plan, model: &Model) -> anyhow::Result<ExitCode> {
    let catalog = args.profiles.catalog(&[])?;
    let rewritten = plan
        .rewrite(model.digests(), &model.graph, &catalog)
        .with_context(|| format!("cannot rewrite '{}'", args.plan.display()))?;
    // The rewritten plan must pass the check it was made for; anything else is a bug here.
    let report = rewritten
        .check(model.digests(), &model.graph, &catalog)
        .with_context(|| format!("the rewritten '{}' does not check", args.plan.display()))?;
    let out = args.out.as_ref().unwrap_or(&args.plan);
    let unchanged = rewritten == *plan;
    if !unchanged || args.out.is_some() {
        // Rewriting in place is the point; only the model must never be replaced.
        super::write_atomically(out, rewritten.to_json().as_bytes(), &[&args.model])?;
    }
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["valid"] = serde_json::Value::Bool(true);
        value["rewritten"] = serde_json::Value::Bool(!unchanged);
        value["out"] = serde_json::Value::String(out.display().to_string());
        print_stdout(&format!("{value}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = if unchanged {
        format!(
            "{}: every figure already matches its node assignment; {} unchanged\n",
            args.plan.display(),
            if args.out.is_some() { "copied" } else { "left" }
        )
    } else {
        format!(
            "wrote {}: every figure recomputed from the node assignment ({} on {}, bottleneck {:.3} ms); status hand_edited: not proven optimal, within {:.2}% of the lower bound\n",
            out.display(),
            crate::onnx::inspect::count_of(report.nodes, "node"),
            crate::onnx::inspect::count_of(report.stages, "stage"),
            report.bottleneck_secs * 1e3,
            rewritten.summary.gap * 100.0
        )
    };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
