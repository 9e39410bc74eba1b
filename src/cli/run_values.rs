//! `pipecut run` of a model that takes or gives sequences, or takes maps: the staged runner's
//! stages exchange tensors only, so such a model runs whole, in this process, on the CPU
//! runtime (`CpuExecutor::run_model_values`), under a one-stage plan and one micro-batch. A
//! sequence input is a directory of `0.npy`, `1.npy`, … and a sequence output is written the
//! same way (`run_files.rs`); a map is a JSON object (`run_maps.rs`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::{step_microbatches, table, Report, RunArgs, StageRow};
use crate::cli::run_files::{feed_plan_values, read_input_values, write_output_values};
use crate::cli::{print_stdout, Backend};
use crate::graph::{Graph, ValueKind};
use crate::plan::Plan;
use crate::runtime::{CpuExecutor, Tensors, Value, Weights};

/// Whether the model's graph inputs or outputs include a sequence (or an optional one), or its
/// inputs a map, which the staged runner cannot carry; an optional tensor it carries as a
/// tensor, and a sequence of maps (ZipMap's) output as its values.
pub(super) fn takes_or_gives_values(graph: &Graph) -> bool {
    let kind = |id: &crate::graph::TensorId| graph.tensor(*id).kind;
    let sequence = |k: ValueKind| matches!(k, ValueKind::Sequence | ValueKind::OptionalSequence);
    let map = |k: ValueKind| matches!(k, ValueKind::Map { .. });
    graph
        .inputs()
        .iter()
        .map(kind)
        .any(|k| sequence(k) || map(k) || matches!(k, ValueKind::MapSequence { .. }))
        || graph
            .outputs()
            .iter()
            .map(kind)
            .any(|k| sequence(k) || map(k))
}

/// Runs the whole model on the `--input` values and writes its outputs, with the report
/// `run` prints for a one-stage plan.
pub(super) fn run(
    args: &RunArgs,
    plan: &Plan,
    graph: &Graph,
    dims: &BTreeMap<String, u64>,
) -> anyhow::Result<ExitCode> {
    let one_stage = plan.stages.len() == 1 && step_microbatches(args, plan)? == 1;
    if !one_stage || args.backend != Backend::Cpu || args.distributed.distributed {
        bail!(
            "the model takes or gives sequences or maps, which run whole on the CPU backend \
             only: partition with --stages 1 and run with --microbatches 1"
        );
    }
    if args.inputs.is_empty() {
        bail!(
            "the model takes or gives sequences or maps: give every input with --input (a \
             sequence as a directory of 0.npy, 1.npy, …, a map as a .json object)"
        );
    }
    let mut inputs = read_input_values(&args.inputs, graph)?;
    with_plan_values(plan, graph, &mut inputs, &args.inputs)?;
    let weights = Weights::load(&args.model, graph)
        .with_context(|| format!("cannot read the weights of '{}'", args.model.display()))?;
    let start = std::time::Instant::now();
    let outputs = CpuExecutor::new(graph, &weights).run_model_values(&inputs)?;
    let wall_secs = start.elapsed().as_secs_f64();
    let files = write_output_values(&args.output_dir, &outputs, graph, &super::run_inputs(args))?;
    let stage = &plan.stages[0];
    let report = Report {
        model: args.model.display().to_string(),
        backend: args.backend,
        microbatches: 1,
        dims: dims.clone(),
        random_inputs: false,
        wall_secs,
        // One stage and one micro-batch: no bubble, measured or simulated.
        measured_efficiency: 1.0,
        predicted_efficiency: 1.0,
        schedule: plan.config.schedule.to_string(),
        stages: vec![StageRow {
            stage: 0,
            device: stage.device.name.clone(),
            ran_on: "CPU".to_string(),
            nodes: stage.node_count,
            busy_secs: wall_secs,
            idle_secs: 0.0,
            predicted_secs: stage.stage_secs,
            host_ops: BTreeMap::new(),
        }],
        outputs: files,
    };
    if args.json {
        print_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        print_stdout(&table(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan's sample values for tensor inputs, checked against (or standing in for) the
/// `--input` files, as the staged run feeds them.
fn with_plan_values(
    plan: &Plan,
    graph: &Graph,
    inputs: &mut crate::runtime::Values,
    read: &[String],
) -> anyhow::Result<()> {
    let mut tensors: Tensors = inputs
        .iter()
        .filter_map(|(name, v)| match v {
            Value::Tensor(t) => Some((name.clone(), std::sync::Arc::clone(t))),
            _ => None,
        })
        .collect();
    feed_plan_values(plan, graph, &mut tensors, read, 1)?;
    for (name, tensor) in tensors {
        inputs.insert(name, Value::Tensor(tensor));
    }
    Ok(())
}
