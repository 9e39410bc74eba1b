//! `pipecut run PLAN.json MODEL`: execute a plan on the CPU reference runtime, one thread per
//! stage, and compare the measured pipeline efficiency with the plan's prediction.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::graph::NodeId;
use crate::onnx::shape::DimBindings;
use crate::plan::Plan;
use crate::runtime::{
    check_inputs, cuda::CudaExecutor, run_pipeline, seeded_inputs, stage_specs, CpuExecutor,
    Executor, Tensors, Weights,
};
use crate::schedule::{simulate, StageTimes};
use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use super::run_files::{feed_plan_values, read_inputs, write_outputs};
use super::{print_stdout, Backend};

#[path = "run_exported.rs"]
mod exported;
#[path = "run_values.rs"]
mod values;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for.
    model: PathBuf,
    /// Override a dim the plan bound, e.g. `--dim seq=32` (repeatable). Dims describe one
    /// micro-batch; inputs hold `--microbatches` of them along axis 0.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// A model input from a .npy file (repeatable); a sequence input from a directory of
    /// `0.npy`, `1.npy`, …; a map input (ai.onnx.ml's DictVectorizer, CastMap) from a .json
    /// file holding one object, e.g. `{"a": 1.5, "b": 2}` (int64 keys as decimal strings; a
    /// key given twice, a key or value of the wrong type, a file over 64 MiB or over 2^20
    /// entries is refused). A model with sequence or map inputs runs whole: one stage, one
    /// micro-batch. Without any, seeded random inputs are used.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Micro-batches streamed through the pipeline (default: the plan's).
    #[arg(long)]
    microbatches: Option<usize>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the outputs, one .npy per graph output.
    #[arg(long, default_value = "pipecut-outputs")]
    output_dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Where the stages run: `cpu` (the reference runtime) or `cuda` (stage k on GPU k mod the
    /// GPU count; needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
    #[command(flatten)]
    distributed: super::run_distributed::DistributedArgs,
}

/// The plan's stages split into their tensor-parallel ranks (built by the sharding rewrite
/// for the run's dims, in memory), loaded.
fn load_ranks(
    model_path: &std::path::Path,
    graph: &crate::graph::Graph,
    weights: &Weights,
    stages: &[Vec<NodeId>],
    dims: &BTreeMap<String, u64>,
    tp: crate::partition::tensor_parallel::TensorParallelism,
) -> anyhow::Result<crate::runtime::tensor_parallel::LoadedRanks> {
    let sharded =
        crate::onnx::export::shard::shard_stages(model_path, graph, weights, stages, tp, false)
            .with_context(|| {
                format!(
                    "cannot split '{}' for tensor parallelism",
                    model_path.display()
                )
            })?;
    let mut bindings = DimBindings::new();
    for (name, value) in dims {
        bindings = bindings.bind(name, *value);
    }
    Ok(crate::runtime::tensor_parallel::LoadedRanks::load(
        &sharded.ranks,
        model_dir(model_path),
        &bindings,
    )?)
}

/// The shard of one rank of a distributed job (`place`: its stage and TP rank), made by the
/// sharding rewrite as [`load_ranks`] makes every one, and loaded alone.
fn load_rank(
    model_path: &std::path::Path,
    graph: &crate::graph::Graph,
    weights: &Weights,
    stages: &[Vec<NodeId>],
    dims: &BTreeMap<String, u64>,
    tp: crate::partition::tensor_parallel::TensorParallelism,
    place: crate::runtime::distributed::Place,
) -> anyhow::Result<crate::runtime::tensor_parallel::LoadedRanks> {
    let mut mine = None;
    crate::onnx::export::shard::shard_stages_each(
        model_path,
        graph,
        weights,
        stages,
        tp,
        false,
        |stage, rank, bytes, _| {
            if stage == place.stage && rank as usize == place.tp_rank {
                mine = Some(bytes);
            }
            Ok(())
        },
    )
    .with_context(|| {
        format!(
            "cannot split '{}' for tensor parallelism",
            model_path.display()
        )
    })?;
    let mine = mine.context("the sharding rewrite made no model for this rank")?;
    let mut bindings = DimBindings::new();
    for (name, value) in dims {
        bindings = bindings.bind(name, *value);
    }
    Ok(crate::runtime::tensor_parallel::LoadedRanks::load(
        &[vec![mine]],
        model_dir(model_path),
        &bindings,
    )?)
}

/// The directory a model's external data lies in.
fn model_dir(model_path: &std::path::Path) -> &std::path::Path {
    match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    }
}

/// Runs the plan's stages each as tensor-parallel ranks on threads.
fn run_tensor_parallel(
    graph: &crate::graph::Graph,
    ranks: &crate::runtime::tensor_parallel::LoadedRanks,
    specs: &[crate::runtime::StageSpec],
    inputs: &Tensors,
    microbatches: usize,
) -> anyhow::Result<crate::runtime::PipelineReport> {
    use crate::runtime::tensor_parallel::TensorParallelExecutor;
    let executor = TensorParallelExecutor::new(graph, ranks);
    let mut prepared = specs
        .iter()
        .map(|s| executor.prepare(s))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(run_pipeline(
        &executor,
        &mut prepared,
        inputs,
        microbatches,
    )?)
}

/// Runs the plan's stages each as tensor-parallel ranks on threads, each rank on a GPU (rank r
/// of stage k on GPU (k·t + r) mod the GPUs the driver sees, as the plan places a replica's
/// groups), its collectives staged through the host; gives the report and, per stage, the ops
/// that ran on the host summed over its ranks.
fn run_tensor_parallel_cuda(
    graph: &crate::graph::Graph,
    ranks: &crate::runtime::tensor_parallel::LoadedRanks,
    specs: &[crate::runtime::StageSpec],
    inputs: &Tensors,
    microbatches: usize,
) -> anyhow::Result<(crate::runtime::PipelineReport, Vec<BTreeMap<String, usize>>)> {
    use crate::runtime::tensor_parallel::{whole_rank_spec, RankGroupExecutor};
    let gpus = crate::runtime::cuda::device_count().map_err(crate::Error::Cuda)?;
    let mut groups = Vec::new();
    for (k, stage) in ranks.stages().into_iter().enumerate() {
        let t = stage.len();
        let mut group = Vec::with_capacity(t);
        for (r, (rank_graph, rank_weights)) in stage.into_iter().enumerate() {
            let gpu = (k * t + r) % gpus.max(1);
            let executor = CudaExecutor::on_device(rank_graph, rank_weights, gpu)?;
            group.push((executor, whole_rank_spec(rank_graph)?));
        }
        groups.push(group);
    }
    let executor = RankGroupExecutor::new(graph, groups);
    let mut prepared = specs
        .iter()
        .map(|s| executor.prepare(s))
        .collect::<Result<Vec<_>, _>>()?;
    let report = run_pipeline(&executor, &mut prepared, inputs, microbatches)?;
    let host_ops = prepared
        .iter()
        .map(|stage| {
            let mut total = BTreeMap::new();
            for rank in stage.ranks() {
                let runs = rank.lock().map(|r| r.host_runs()).unwrap_or_default();
                for (op, count) in runs {
                    *total.entry(op).or_insert(0) += count;
                }
            }
            total
        })
        .collect();
    Ok((report, host_ops))
}

#[derive(Debug, Serialize)]
struct StageRow {
    stage: usize,
    /// The device the plan costed the stage on.
    device: String,
    /// What executed it here: `CPU`, `GPU n` (the CUDA backend's ordinal) or `t GPU ranks`
    /// (a tensor-parallel stage on the CUDA backend).
    ran_on: String,
    nodes: usize,
    busy_secs: f64,
    idle_secs: f64,
    predicted_secs: f64,
    /// Nodes the CUDA backend ran on the host (CPU kernels) instead of the GPU, by op, over all
    /// micro-batches; empty on the CPU backend.
    host_ops: BTreeMap<String, usize>,
}

/// What running every stage in this process gave.
struct RanHere {
    report: crate::runtime::PipelineReport,
    /// Per stage, the ops that ran on the host (empty on the CPU backend).
    host_ops: Vec<BTreeMap<String, usize>>,
    /// Per stage, what executed it here (`CPU`, `GPU n`, `t GPU ranks`).
    ran_on: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    backend: Backend,
    microbatches: usize,
    dims: BTreeMap<String, u64>,
    random_inputs: bool,
    wall_secs: f64,
    measured_efficiency: f64,
    predicted_efficiency: f64,
    /// The plan's schedule, under which `predicted_efficiency` simulates the forward passes.
    schedule: String,
    stages: Vec<StageRow>,
    outputs: BTreeMap<String, String>,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let plan = super::check::read_plan(&args.plan)?;
    if !args.distributed.distributed {
        return run_plan(&args, &plan, &std::cell::Cell::new(false));
    }
    super::run_distributed::report_failures_before_joining(
        &args.distributed,
        &plan,
        &args.plan,
        |joining| run_plan(&args, &plan, joining),
    )
}

/// Runs `plan` (a rank of it, with `--distributed`: `joining` is set once the rank starts to
/// join the job).
fn run_plan(
    args: &RunArgs,
    plan: &Plan,
    joining: &std::cell::Cell<bool>,
) -> anyhow::Result<ExitCode> {
    if args.model.is_dir() {
        return exported::run(args, plan, joining);
    }
    let (model, dims) = checked_model(args, plan)?;
    let graph = &model.graph;
    if values::takes_or_gives_values(graph) {
        return values::run(args, plan, graph, &dims);
    }
    let microbatches = step_microbatches(args, plan)?;

    let random_inputs = args.inputs.is_empty();
    let make_inputs = || -> anyhow::Result<Tensors> {
        let mut inputs = if random_inputs {
            seeded_inputs(graph, microbatches, args.seed)?
        } else {
            read_inputs(&args.inputs, graph)?
        };
        feed_plan_values(plan, graph, &mut inputs, &args.inputs, microbatches)?;
        check_inputs(graph, &inputs, microbatches)?;
        Ok(inputs)
    };

    let stages = stage_nodes(plan, graph)?;
    let weights = load_weights(args, plan, graph, &stages, microbatches)
        .with_context(|| format!("cannot read the weights of '{}'", args.model.display()))?;
    let specs = stage_specs(graph, &stages)?;
    let staged = StagedRun {
        args,
        plan,
        graph,
        model_sha256: &model.sha256,
        dims: &dims,
        weights: &weights,
        stages: &stages,
        specs: &specs,
        tensor_parallel: plan
            .parallelism
            .as_ref()
            .map(|p| p.tensor_parallel)
            .filter(|tp| tp.degree > 1),
        microbatches,
    };
    if args.distributed.distributed {
        return staged.run_as_rank(make_inputs, joining);
    }
    let inputs = make_inputs()?;
    let ran = staged.run_here(&inputs)?;
    let summary = staged.summary(ran, random_inputs)?;
    if args.json {
        print_stdout(&format!("{}\n", serde_json::to_string_pretty(&summary)?))?;
    } else {
        print_stdout(&table(&summary))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether this process reads only one stage's weights: a rank of a distributed job without
/// tensor parallelism (whose ranks cut their shards from the whole model).
fn reads_one_stage(args: &RunArgs, plan: &Plan) -> bool {
    args.distributed.distributed && super::run_distributed::tensor_parallel_degree(plan) == 1
}

/// The weights this process runs: a rank reading one stage ([`reads_one_stage`]) reads only
/// what its stage's nodes read, so another stage's weight file may be absent or damaged.
fn load_weights(
    args: &RunArgs,
    plan: &Plan,
    graph: &crate::graph::Graph,
    stages: &[Vec<NodeId>],
    microbatches: usize,
) -> anyhow::Result<Weights> {
    if !reads_one_stage(args, plan) {
        return Ok(Weights::load(&args.model, graph)?);
    }
    let (_, place) = super::run_distributed::place_in_job(plan, microbatches)?;
    Ok(Weights::load_for_nodes(
        &args.model,
        graph,
        &stages[place.stage],
    )?)
}

/// The model checked against the plan, typed with the dims the run uses (the plan's, with
/// `--dim` laid over them), and those dims.
fn checked_model(
    args: &RunArgs,
    plan: &Plan,
) -> anyhow::Result<(crate::onnx::Model, BTreeMap<String, u64>)> {
    // The plan is checked against the model typed as the plan was costed: same file, every node
    // once, convex stages, figures as recorded.
    let mut model = typed_model(args, plan, &plan.model.dims)?;
    super::match_plan_model(plan, &model, &args.plan)?;
    // A plan costed at another precision (--dtype) is checked on the graph as it was costed;
    // the run itself uses the file's own dtypes.
    let mut costed = model.graph.clone();
    if let Some(precision) = plan.config.dtype_override {
        costed.override_float_dtype(precision.dtype());
    }
    let devices = super::measured::plan_devices(plan);
    args.measured
        .apply(&mut costed, &model.graph_sha256, &plan.model.dims, &devices)?;
    plan.check(model.digests(), &costed, &args.profiles.catalog(&[])?)
        .with_context(|| format!("'{}'", args.plan.display()))?;
    let mut dims = plan.model.dims.clone();
    if !args.dims.is_empty() {
        // Parsed as every command parses --dim (positive, each name once), then laid over the
        // plan's own dims.
        let mut overrides = DimBindings::new();
        for arg in &args.dims {
            overrides.parse_arg(arg)?;
        }
        for (name, value) in overrides.iter() {
            dims.insert(name.to_string(), value);
        }
        model = typed_model(args, plan, &dims)?;
    }
    Ok((model, dims))
}

/// The model file, refused when it is not the plan's, typed with `bindings`.
fn typed_model(
    args: &RunArgs,
    plan: &Plan,
    bindings: &BTreeMap<String, u64>,
) -> anyhow::Result<crate::onnx::Model> {
    let read = if reads_one_stage(args, plan) {
        super::Weights::OneStage
    } else {
        super::Weights::Read
    };
    let mut model = super::load_model(&args.model, read)?;
    // Refuse another model before binding the plan's dims, which it may not even have.
    plan.model_match(model.digests())
        .with_context(|| format!("'{}'", args.plan.display()))?;
    super::check::require_value_inputs(plan, &model.graph, &args.model)?;
    super::check::plan_inference(plan, bindings, &model.graph)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", args.model.display()))?;
    Ok(model)
}

/// The micro-batches of the run's step: `--microbatches`, else the plan's for every replica
/// (a distributed run's step is every replica's micro-batches; one process runs one
/// replica's).
fn step_microbatches(args: &RunArgs, plan: &Plan) -> anyhow::Result<usize> {
    let replicas = if args.distributed.distributed {
        super::run_distributed::replicas(plan)
    } else {
        1
    };
    let microbatches = args
        .microbatches
        .unwrap_or(plan.config.microbatches as usize * replicas);
    if microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    // The run ends with a simulation of the same step, which has this cap: refuse before
    // allocating inputs for micro-batches that could not be compared with it.
    crate::schedule::check_microbatches(microbatches as u64)?;
    Ok(microbatches)
}

/// Each stage's nodes, found by the names the plan lists.
fn stage_nodes(plan: &Plan, graph: &crate::graph::Graph) -> anyhow::Result<Vec<Vec<NodeId>>> {
    let by_name: HashMap<&str, NodeId> =
        graph.nodes().map(|(id, n)| (n.name.as_str(), id)).collect();
    plan.stages
        .iter()
        .map(|s| {
            s.nodes
                .iter()
                .map(|n| {
                    by_name.get(n).copied().with_context(|| {
                        format!("the plan names node '{n}', which the model lacks")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .collect()
}

/// A plan's stages ready to run: the model typed with the run's dims, its weights, each stage's
/// nodes and spec, and the plan's tensor parallelism (none below degree 2).
struct StagedRun<'a> {
    args: &'a RunArgs,
    plan: &'a Plan,
    graph: &'a crate::graph::Graph,
    /// sha256 of the model file, which every rank of a job must share.
    model_sha256: &'a str,
    dims: &'a BTreeMap<String, u64>,
    weights: &'a Weights,
    stages: &'a [Vec<NodeId>],
    specs: &'a [crate::runtime::StageSpec],
    tensor_parallel: Option<crate::partition::tensor_parallel::TensorParallelism>,
    microbatches: usize,
}

impl StagedRun<'_> {
    /// Runs this process's rank of a distributed job: its stage (its TP rank's shard of it, on
    /// a tensor-parallel plan) of its replica.
    fn run_as_rank(
        &self,
        make_inputs: impl FnOnce() -> anyhow::Result<Tensors>,
        joining: &std::cell::Cell<bool>,
    ) -> anyhow::Result<ExitCode> {
        let args = self.args;
        let (launch, place) = super::run_distributed::place_in_job(self.plan, self.microbatches)?;
        let shard = match self.tensor_parallel {
            Some(tp) => Some(load_rank(
                &args.model,
                self.graph,
                self.weights,
                self.stages,
                self.dims,
                tp,
                place,
            )?),
            None => None,
        };
        let setup = super::run_distributed::RankSetup {
            plan: self.plan,
            backend: args.backend,
            launch,
            model_file: &args.model,
            graph: self.graph,
            weights: self.weights,
            spec: &self.specs[place.stage],
            shard: shard.as_ref().map(|ranks| ranks.stages()[0][0]),
            relay: Vec::new(),
            plan_file: &args.plan,
            model_sha256: self.model_sha256,
            dims: self.dims.clone(),
            wire_widening: super::run_distributed::wire_widening(
                super::run_distributed::activation_dtypes(self.graph),
            ),
            microbatches: self.microbatches,
            output_dir: &args.output_dir,
            protected: run_inputs(args),
            json: args.json,
            joining,
        };
        super::run_distributed::run(&args.distributed, setup, make_inputs)
    }

    /// Runs every stage in this process on the chosen backend; gives the report and, per stage,
    /// the ops that ran on the host (empty on the CPU backend) and what executed it here, which
    /// need not be the device the plan costed it on.
    fn run_here(&self, inputs: &Tensors) -> anyhow::Result<RanHere> {
        let (args, graph, specs, microbatches) =
            (self.args, self.graph, self.specs, self.microbatches);
        let loaded_ranks =
            |tp| load_ranks(&args.model, graph, self.weights, self.stages, self.dims, tp);
        let (report, host_ops, ran_on) = match (args.backend, self.tensor_parallel) {
            (Backend::Cpu, Some(tp)) => {
                let ranks = loaded_ranks(tp)?;
                let report = run_tensor_parallel(graph, &ranks, specs, inputs, microbatches)?;
                let ran_on = vec!["CPU".to_string(); specs.len()];
                (report, vec![BTreeMap::new(); specs.len()], ran_on)
            }
            (Backend::Cuda, Some(tp)) => {
                let ranks = loaded_ranks(tp)?;
                let (report, host_ops) =
                    run_tensor_parallel_cuda(graph, &ranks, specs, inputs, microbatches)?;
                let ran_on = vec![format!("{} GPU ranks", tp.degree); specs.len()];
                (report, host_ops, ran_on)
            }
            (Backend::Cpu, None) => {
                let executor = CpuExecutor::new(graph, self.weights);
                let mut prepared = specs
                    .iter()
                    .map(|s| executor.prepare(s))
                    .collect::<Result<Vec<_>, _>>()?;
                let report = run_pipeline(&executor, &mut prepared, inputs, microbatches)?;
                let ran_on = vec!["CPU".to_string(); prepared.len()];
                (report, vec![BTreeMap::new(); prepared.len()], ran_on)
            }
            (Backend::Cuda, None) => {
                let executor = CudaExecutor::for_stages(graph, self.weights, specs.len())?;
                let activation_bytes: Vec<u64> = self
                    .plan
                    .stages
                    .iter()
                    .map(|s| s.peak_memory_bytes.saturating_sub(s.param_bytes))
                    .collect();
                executor.size_memory_pools(&activation_bytes)?;
                let mut prepared = specs
                    .iter()
                    .map(|s| executor.prepare(s))
                    .collect::<Result<Vec<_>, _>>()?;
                let report = executor.run_resident_pipeline(&mut prepared, inputs, microbatches)?;
                let host_ops = prepared.iter().map(|s| s.host_runs()).collect();
                // Stage k runs on GPU k mod the GPU count (`CudaExecutor::for_stages`).
                let gpus = executor.device_count().max(1);
                let ran_on = (0..prepared.len())
                    .map(|k| format!("GPU {}", k % gpus))
                    .collect();
                (report, host_ops, ran_on)
            }
        };
        Ok(RanHere {
            report,
            host_ops,
            ran_on,
        })
    }

    /// The run's report: measured against the plan's predicted efficiency (its stage times in a
    /// simulation of the plan's schedule; the run executes forward passes only, so without
    /// backwards), with the outputs written.
    fn summary(&self, ran: RanHere, random_inputs: bool) -> anyhow::Result<Report> {
        let RanHere {
            report,
            host_ops,
            ran_on,
        } = ran;
        let (args, plan) = (self.args, self.plan);
        let predicted = simulate(
            &StageTimes {
                forward_secs: plan.stages.iter().map(|s| s.stage_secs).collect(),
                backward_secs: Vec::new(),
                send_secs: vec![0.0; plan.stages.len().saturating_sub(1)],
            },
            plan.config.schedule.into(),
            self.microbatches,
        )?;
        let outputs = write_outputs(
            &args.output_dir,
            &report.outputs,
            self.graph,
            &run_inputs(args),
        )?;
        Ok(Report {
            model: args.model.display().to_string(),
            backend: args.backend,
            microbatches: self.microbatches,
            dims: self.dims.clone(),
            random_inputs,
            wall_secs: report.wall_secs,
            measured_efficiency: report.efficiency(),
            predicted_efficiency: 1.0 - predicted.bubble_fraction,
            schedule: plan.config.schedule.to_string(),
            stages: report
                .stages
                .iter()
                .zip(&plan.stages)
                .zip(host_ops)
                .zip(ran_on)
                .map(|(((t, s), host_ops), ran_on)| StageRow {
                    stage: t.stage,
                    device: s.device.name.clone(),
                    ran_on,
                    nodes: s.node_count,
                    busy_secs: t.busy_secs,
                    idle_secs: t.idle_secs,
                    predicted_secs: s.stage_secs,
                    host_ops,
                })
                .collect(),
            outputs,
        })
    }
}

/// The files a run reads, which its outputs must never replace: the model first (outputs are no
/// more readable than it), the plan, and every `--input` file.
fn run_inputs(args: &RunArgs) -> Vec<&Path> {
    let npy_files = args
        .inputs
        .iter()
        .filter_map(|spec| spec.split_once('=').map(|(_, file)| Path::new(file)));
    [args.model.as_path(), args.plan.as_path()]
        .into_iter()
        .chain(npy_files)
        .collect()
}

fn table(r: &Report) -> String {
    let mut out = format!(
        "ran {} on {}: {}, {}{}, {:.1} ms wall\n\n",
        r.model,
        match r.backend {
            Backend::Cpu => "the CPU reference runtime",
            Backend::Cuda => "the CUDA runtime",
        },
        crate::onnx::inspect::count_of(r.stages.len(), "stage"),
        crate::onnx::inspect::count_of(r.microbatches, "micro-batch"),
        if r.random_inputs {
            " of seeded random inputs"
        } else {
            ""
        },
        r.wall_secs * 1e3
    );
    // The device column says what ran the stage and what the plan was made for.
    let devices: Vec<String> = r
        .stages
        .iter()
        .map(|s| format!("{} (plan made for {})", s.ran_on, s.device))
        .collect();
    let width = devices.iter().map(|d| d.chars().count()).max().unwrap_or(0);
    out.push_str(&format!(
        "stage  {:<width$} {:>6} {:>10} {:>10} {:>11}\n",
        "device", "nodes", "busy ms", "idle ms", "plan ms/mb"
    ));
    for (s, device) in r.stages.iter().zip(&devices) {
        out.push_str(&format!(
            "{:>5}  {:<width$} {:>6} {:>10.2} {:>10.2} {:>11.4}\n",
            s.stage,
            device,
            s.nodes,
            s.busy_secs * 1e3,
            s.idle_secs * 1e3,
            s.predicted_secs * 1e3
        ));
    }
    out.push_str(&format!(
        "\npipeline efficiency: measured {:.1}% (Σ busy / (K · wall)), predicted {:.1}% (plan's stage times, {} simulation of the forward passes)\n",
        r.measured_efficiency * 100.0,
        r.predicted_efficiency * 100.0,
        r.schedule
    ));
    for s in r.stages.iter().filter(|s| !s.host_ops.is_empty()) {
        let ops: Vec<String> = s
            .host_ops
            .iter()
            .map(|(op, n)| format!("{op} ×{n}"))
            .collect();
        out.push_str(&format!(
            "stage {} ran on the host (no device kernel for these inputs): {}\n",
            s.stage,
            ops.join(", ")
        ));
    }
    for (name, file) in &r.outputs {
        out.push_str(&format!("wrote {name} → {file}\n"));
    }
    out
}
