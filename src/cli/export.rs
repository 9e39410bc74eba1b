//! `pipecut export PLAN.json MODEL --out-dir DIR [--dim NAME=V]... [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::onnx::export::shard::shard_stages_each;
use crate::onnx::export::{export_stages_checked, rank_file_name, Manifest, TensorSource};
use crate::onnx::inspect::human_bytes;
use anyhow::Context;
use clap::Args;

use super::{print_stdout, ModelArgs};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for, and `--dim` bindings: boundary tensors the model does
    /// not declare carry a bound dim's size instead of its symbol. The plan's own dims are
    /// used where the model's shapes need sizes, and its sample values (`--value`) always.
    #[command(flatten)]
    model: ModelArgs,
    /// Directory for stage_<k>.onnx and manifest.json (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Print the manifest as JSON instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
}

/// Refuses an export file name that is one of the inputs (the plan saved as `manifest.json` in
/// the output directory, say). Other checks wait for the export, which creates the directory.
fn refuse_replacing(path: &std::path::Path, inputs: &[&std::path::Path]) -> anyhow::Result<()> {
    if let Some(input) = inputs.iter().find(|i| crate::io::same_file(path, i)) {
        anyhow::bail!(
            "refusing to export into '{}': it would replace the input '{}'",
            path.display(),
            input.display()
        );
    }
    Ok(())
}

pub fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let plan = super::check::read_plan(&args.plan)?;
    let model_path = &args.model.model;
    // Loaded once: export reads the weights, so absent external data is refused here first.
    let loaded = super::load_model(model_path, super::Weights::Read)?;
    // A plan that `check` refuses is refused here too, with the same message and exit code
    // (it is checked on the model typed with the plan's own dims, as `check` does).
    super::match_plan_model(&plan, &loaded, &args.plan)?;
    let for_check = super::check::type_for_plan(&plan, loaded.clone(), model_path, &args.measured)?;
    plan.check(
        for_check.digests(),
        &for_check.graph,
        &args.profiles.catalog(&[])?,
    )
    .with_context(|| format!("'{}'", args.plan.display()))?;
    // Rank files rewrite Reshape targets as constants: they are made for the plan's dims.
    let tp = plan
        .parallelism
        .as_ref()
        .map(|p| p.tensor_parallel)
        .unwrap_or_default();
    let degree = tp.degree as usize;
    let for_ranks = if degree > 1 {
        let mut model = loaded.clone();
        super::check::plan_inference(&plan, &plan.model.dims, &model.graph)
            .run(&mut model.graph)
            .with_context(|| format!("'{}'", model_path.display()))?;
        Some(model.graph)
    } else {
        None
    };
    let model = typed_for_stages(&args, &plan, loaded)?;
    let stages = plan
        .stage_nodes(model.digests(), &model.graph)
        .with_context(|| format!("'{}'", args.plan.display()))?;
    // Neither the model nor the plan may be among the files the export writes.
    let inputs = [model_path.as_path(), args.plan.as_path()];
    for stage in 0..stages.len() {
        let stage_file = args
            .out_dir
            .join(crate::onnx::export::stage_file_name(stage));
        refuse_replacing(&stage_file, &inputs)?;
    }
    refuse_replacing(
        &args.out_dir.join(crate::onnx::export::MANIFEST_FILE),
        &inputs,
    )?;
    if degree > 1 {
        for stage in 0..stages.len() {
            for rank in 0..degree {
                refuse_replacing(&args.out_dir.join(rank_file_name(stage, rank)), &inputs)?;
                let data = crate::onnx::export::shard::rank_data_name(stage, rank as u64);
                refuse_replacing(&args.out_dir.join(data), &inputs)?;
            }
        }
    }
    // Held until every file is written: a second export into this folder is refused.
    let _lock = crate::onnx::export::lock_out_dir(&args.out_dir)?;
    let manifest = export_stages_checked(
        model_path,
        model.digests().sha256,
        &model.graph,
        &stages,
        &args.out_dir,
    )
    .with_context(|| format!("cannot export '{}'", model_path.display()))?;
    let ranks = match &for_ranks {
        Some(graph) => write_ranks(model_path, graph, &stages, tp, &args.out_dir)?,
        None => String::new(),
    };
    if args.json {
        print_stdout(&manifest.to_json())?;
    } else {
        print_stdout(&table(&manifest, &args.out_dir))?;
        print_stdout(&ranks)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The model typed for the stage files, with the plan's sample values (a `--value` given again
/// must be the plan's). Its own symbolic dims are kept where shapes can be inferred with them
/// (and `--dim`), so that the stage files take any batch; a model whose shapes need sizes (a
/// `Range` or a `Reshape` on data-dependent dims) is typed at the plan's dims, `--dim` laid
/// over them, as the plan was costed.
fn typed_for_stages(
    args: &ExportArgs,
    plan: &crate::plan::Plan,
    loaded: crate::onnx::Model,
) -> anyhow::Result<crate::onnx::Model> {
    super::check::agree_with_plan_values(plan, &args.model.sample_values(&loaded.graph)?)?;
    let given = args.model.dims()?;
    let mut symbolic = loaded.clone();
    let symbolic_inference = super::check::plan_inference(plan, &given, &symbolic.graph);
    let unbound = match symbolic_inference.run(&mut symbolic.graph) {
        Ok(_) => return Ok(symbolic),
        Err(e) => e,
    };
    let mut dims = plan.model.dims.clone();
    dims.extend(given);
    let mut model = loaded;
    super::check::plan_inference(plan, &dims, &model.graph)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", args.model.model.display()))?;
    let bound: Vec<String> = dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!(
        "note: the stage files are typed at the plan's dims ({}): without them, {}",
        bound.join(", "),
        super::escape_controls(&unbound.to_string())
    );
    Ok(model)
}

/// Writes `stage_<k>.rank_<r>.onnx` for every stage and tensor-parallel rank, beside the
/// stage files (whose external data they share); gives the lines that list them.
fn write_ranks(
    model_path: &std::path::Path,
    graph: &crate::graph::Graph,
    stages: &[Vec<crate::graph::NodeId>],
    tp: crate::partition::tensor_parallel::TensorParallelism,
    out_dir: &std::path::Path,
) -> anyhow::Result<String> {
    let degree = tp.degree;
    // Weights in external data are read a rank's slice at a time, never whole.
    let weights = crate::runtime::Weights::load_embedded(model_path, graph)
        .with_context(|| format!("cannot read the weights of '{}'", model_path.display()))?;
    // Each rank is written as soon as it is made: one rank's slices in memory at a time.
    let mut sizes: Vec<Vec<u64>> = vec![Vec::new(); stages.len()];
    let layouts = shard_stages_each(
        model_path,
        graph,
        &weights,
        stages,
        tp,
        true,
        |stage, rank, bytes, data| {
            if let Some(data) = data {
                crate::onnx::export::write_atomically(&out_dir.join(&data.location), &data.bytes)?;
            }
            let name = rank_file_name(stage, rank as usize);
            crate::onnx::export::write_atomically(&out_dir.join(name), &bytes)?;
            sizes[stage].push(bytes.len() as u64);
            Ok(())
        },
    )
    .with_context(|| {
        format!(
            "cannot split '{}' for tensor parallelism",
            model_path.display()
        )
    })?;
    let collectives = match tp.sequence_parallel {
        false => "ai.pipecut AllReduce after each split block and embedding, AllGather after a split head",
        true => "sequence parallel: ai.pipecut ReduceScatter along the sequence after each split block and embedding, AllGather before each block and head",
    };
    let mut text = format!(
        "\ntensor parallelism: each stage split over {degree} ranks ({collectives})\n\n{:>5}  {:>4}  {:<22}  {:>6}  {:>6}  {:>5}  {:>10}\n",
        "stage", "rank", "file", "split", "whole", "vocab", "file size"
    );
    for (stage, (layout, sizes)) in layouts.iter().zip(&sizes).enumerate() {
        for (rank, size) in sizes.iter().enumerate() {
            let name = rank_file_name(stage, rank);
            text.push_str(&format!(
                "{stage:>5}  {rank:>4}  {name:<22}  {:>6}  {:>6}  {:>5}  {:>10}\n",
                layout.split.len(),
                layout.replicated.len(),
                layout.vocab.len(),
                human_bytes(*size)
            ));
        }
        for whole in &layout.replicated {
            text.push_str(&format!(
                "  stage {stage}: block ending in '{}' stays whole: {}\n",
                graph.node(whole.row).name,
                whole.reason
            ));
        }
    }
    Ok(text)
}

fn table(manifest: &Manifest, out_dir: &std::path::Path) -> String {
    let mut text = format!(
        "{} of {} written to {}\n\n",
        crate::onnx::inspect::count_of(manifest.stages.len(), "stage"),
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
