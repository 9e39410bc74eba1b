//! `pipecut run PLAN EXPORT_DIR --distributed`: each rank loads only its stage's file from
//! what `pipecut export` wrote (`stage_<k>.onnx` and `manifest.json`), not the whole model.
//!
//! A stage file holds only what its own nodes read, while the ranks pass tensors along the
//! chain (stage k sends only to stage k + 1): so each rank also relays, from what it receives,
//! the tensors that a later stage (or the model's outputs) needs from an earlier one. The
//! manifest's routes say which.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::super::run_distributed::{activation_dtypes, wire_widening};
use crate::graph::DType;
use crate::onnx::export::{Manifest, TensorSource};
use crate::onnx::shape::DimBindings;
use crate::plan::Plan;
use crate::runtime::{check_inputs, seeded_inputs, stage_specs, Tensors, Weights};
use anyhow::{bail, Context};

use super::RunArgs;

/// Runs this process's rank from the export directory `args.model`.
pub(super) fn run(
    args: &RunArgs,
    plan: &Plan,
    joining: &std::cell::Cell<bool>,
) -> anyhow::Result<ExitCode> {
    let dir = &args.model;
    if !args.distributed.distributed {
        bail!(
            "'{}' is a directory: an export's stage files run with --distributed, one rank per \
             stage (give the model file for a one-process run)",
            dir.display()
        );
    }
    let (manifest, manifest_sha256) = read_manifest(dir)?;
    check_manifest(&manifest, plan, dir)?;
    let replicas = super::super::run_distributed::replicas(plan);
    let microbatches = args
        .microbatches
        .unwrap_or(plan.config.microbatches as usize * replicas);
    if microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    crate::schedule::check_microbatches(microbatches as u64)?;
    if super::super::run_distributed::tensor_parallel_degree(plan) > 1 {
        bail!(
            "--distributed runs a tensor-parallel plan's ranks from the model file, not yet \
             from an export's rank files: give the model file"
        );
    }
    let (launch, place) = super::super::run_distributed::place_in_job(plan, microbatches)?;
    let stage = place.stage;

    let file = stage_file(&manifest, stage, dir)?;
    let model = load_stage(&file, plan, &args.dims)?;
    check_stage_file(&manifest, stage, &file, &model.sha256)?;
    let graph = &model.graph;
    let weights = Weights::load(&file, graph)
        .with_context(|| format!("cannot read the weights of '{}'", file.display()))?;
    let all_nodes: Vec<_> = graph.topological_order().to_vec();
    let mut spec = stage_specs(graph, &[all_nodes])?
        .pop()
        .context("a stage file makes one stage")?;
    spec.index = stage;
    // Only what crosses to the next stage leaves (not an output kept only so that a stage
    // whose results nobody reads is still a runnable model).
    let crossing = crossing(&manifest, stage);
    spec.sends
        .retain(|&t| crossing.contains(&graph.tensor(t).name));
    let relay = relayed(&manifest, stage, &crossing)?;

    let random_inputs = args.inputs.is_empty();
    let make_inputs = || -> anyhow::Result<Tensors> {
        let mut inputs = if random_inputs {
            seeded_inputs(graph, microbatches, args.seed)?
        } else {
            super::super::run_files::read_inputs(&args.inputs, graph)?
        };
        super::super::run_files::feed_plan_values(
            plan,
            graph,
            &mut inputs,
            &args.inputs,
            microbatches,
        )?;
        check_inputs(graph, &inputs, microbatches)?;
        Ok(inputs)
    };
    let mut protected = super::run_inputs(args);
    protected.push(&file);
    let setup = super::super::run_distributed::RankSetup {
        plan,
        backend: args.backend,
        launch,
        model_file: &file,
        graph,
        weights: &weights,
        spec: &spec,
        shard: None,
        relay,
        plan_file: &args.plan,
        // The manifest: it names the model the stages were cut from and each stage file's
        // digest, so ranks that agree on it run one export, each having hashed only its file.
        model_sha256: &manifest_sha256,
        dims: run_dims(plan, &args.dims)?,
        // A rank also relays tensors its own file does not declare.
        wire_widening: wire_widening(activation_dtypes(graph).chain(crossing_dtypes(&manifest))),
        microbatches,
        output_dir: &args.output_dir,
        protected,
        json: args.json,
        joining,
    };
    super::super::run_distributed::run(&args.distributed, setup, make_inputs)
}

/// The export's manifest and the sha256 (hex) of its bytes.
fn read_manifest(dir: &Path) -> anyhow::Result<(Manifest, String)> {
    let path = dir.join("manifest.json");
    if !path.exists() {
        anyhow::bail!(
            "'{}' has no manifest.json: is it a directory `pipecut export` wrote?",
            dir.display()
        );
    }
    let text = crate::io::read_json_text(&path, "manifest")?;
    let manifest = Manifest::from_json(&text).with_context(|| format!("'{}'", path.display()))?;
    Ok((manifest, crate::onnx::sha256_hex(text.as_bytes())))
}

/// The stage file is the one exported: its sha256 (`sha256`, computed as it loaded) is the
/// manifest's.
fn check_stage_file(
    manifest: &Manifest,
    stage: usize,
    file: &Path,
    sha256: &str,
) -> anyhow::Result<()> {
    match &manifest.stages[stage].sha256 {
        Some(exported) if exported == sha256 => Ok(()),
        Some(exported) => bail!(
            "'{}' is not the file that was exported (sha256 {sha256}, the manifest says              {exported}): export this plan again",
            file.display()
        ),
        None => bail!(
            "the manifest of '{}' records no digest of stage {stage}'s file (an older pipecut              wrote it): export this plan again",
            file.parent().map_or(file, |d| d).display()
        ),
    }
}

/// The export was cut from the plan's model file along the plan's stages.
fn check_manifest(manifest: &Manifest, plan: &Plan, dir: &Path) -> anyhow::Result<()> {
    if manifest.model.sha256 != plan.model.sha256 {
        bail!(
            "'{}' was exported from another model file ('{}') than the plan's ('{}'): export \
             this plan again",
            dir.display(),
            manifest.model.file_name,
            plan.model.file_name
        );
    }
    if manifest.stages.len() != plan.stages.len() {
        bail!(
            "'{}' holds {} stage(s), the plan {}: export this plan again",
            dir.display(),
            manifest.stages.len(),
            plan.stages.len()
        );
    }
    for (k, (exported, planned)) in manifest.stages.iter().zip(&plan.stages).enumerate() {
        let ends_in_stage = [&exported.first_node, &exported.last_node]
            .iter()
            .all(|n| planned.nodes.contains(n));
        if exported.stage != k || !ends_in_stage {
            bail!(
                "stage {k} of '{}' is not the plan's stage {k}: export this plan again",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The path of `stage`'s file, a plain name inside `dir`.
fn stage_file(manifest: &Manifest, stage: usize, dir: &Path) -> anyhow::Result<PathBuf> {
    let name = &manifest.stages[stage].file;
    let plain = Path::new(name)
        .file_name()
        .is_some_and(|f| f == name.as_str());
    if !plain {
        bail!("the manifest names stage {stage}'s file '{name}', which is not a file name in the export");
    }
    Ok(dir.join(name))
}

/// The stage file, typed at the plan's dims with `--dim` overrides laid over them.
/// The plan's dims with the `--dim` overrides laid over them.
fn run_dims(
    plan: &Plan,
    overrides: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut dims = plan.model.dims.clone();
    let mut parsed = DimBindings::new();
    for arg in overrides {
        parsed.parse_arg(arg)?;
    }
    for (name, value) in parsed.iter() {
        dims.insert(name.to_string(), value);
    }
    Ok(dims)
}

fn load_stage(
    file: &Path,
    plan: &Plan,
    overrides: &[String],
) -> anyhow::Result<crate::onnx::Model> {
    let dims = run_dims(plan, overrides)?;
    let mut model = super::super::load_model(file, super::super::Weights::Read)?;
    super::super::check::plan_inference(plan, &dims, &model.graph)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", file.display()))?;
    Ok(model)
}

/// Whether a tensor from `source` exists by the end of `stage` (a model input always does).
fn made_by(source: &TensorSource, stage: usize) -> bool {
    match source {
        TensorSource::ModelInput => true,
        TensorSource::Stage { stage: from } => *from <= stage,
    }
}

/// The tensors that cross the boundary after `stage`: read by a later stage, or a model
/// output, and made by then.
fn crossing(manifest: &Manifest, stage: usize) -> BTreeSet<String> {
    let later_inputs = manifest.stages[stage + 1..]
        .iter()
        .flat_map(|s| &s.inputs)
        .filter(|i| made_by(&i.from, stage))
        .map(|i| i.tensor.tensor.clone());
    let outputs = manifest
        .outputs
        .iter()
        .filter(|o| made_by(&o.from, stage))
        .map(|o| o.tensor.clone());
    later_inputs.chain(outputs).collect()
}

/// The dtypes the manifest gives what crosses between stages: every stage's inputs and outputs.
fn crossing_dtypes(manifest: &Manifest) -> Vec<DType> {
    manifest
        .stages
        .iter()
        .flat_map(|s| {
            let inputs = s.inputs.iter().map(|i| &i.tensor);
            inputs.chain(s.outputs.iter().map(|o| &o.tensor))
        })
        .filter_map(|t| DType::from_name(t.dtype.as_deref()?))
        .collect()
}

/// The tensors `stage` passes on without making them: those of `crossing` that its own file
/// does not output.
fn relayed(
    manifest: &Manifest,
    stage: usize,
    crossing: &BTreeSet<String>,
) -> anyhow::Result<Vec<String>> {
    let own: BTreeSet<&String> = manifest.stages[stage]
        .outputs
        .iter()
        .map(|o| &o.tensor.tensor)
        .collect();
    let relay: Vec<String> = crossing
        .iter()
        .filter(|t| !own.contains(t))
        .cloned()
        .collect();
    // Stage 0 has only the model inputs its own file declares: one that only later stages
    // read was never generated or read from --input here.
    if stage == 0 {
        let declared: BTreeSet<&String> = manifest.stages[0]
            .inputs
            .iter()
            .map(|i| &i.tensor.tensor)
            .collect();
        if let Some(missing) = relay.iter().find(|t| !declared.contains(t)) {
            bail!(
                "model input '{missing}' is read only by later stages, which the export's stage 0 \
                 cannot hand on: run the whole model file instead of the export"
            );
        }
    }
    Ok(relay)
}
