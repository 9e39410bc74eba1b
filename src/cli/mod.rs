//! Subcommands and their arguments.

mod calibrate;
mod check;
mod cost;
mod devices;
mod export;
mod inspect;
mod partition;
mod plan_cluster;
mod run;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::onnx::Model;

/// Automatic pipeline-parallel partitioning of ONNX models.
#[derive(Debug, Parser)]
#[command(name = "pipecut", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a model, infer shapes, and print what it contains.
    #[command(
        after_help = "Examples:\n  pipecut inspect fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=32\n  pipecut inspect model.onnx --json"
    )]
    Inspect(inspect::InspectArgs),
    /// Cost every node of a model on a device (FLOPs, bytes, roofline time), slowest first.
    #[command(
        after_help = "Examples:\n  pipecut cost fixtures/models/gpt2_tiny.onnx --device H100-SXM --dim batch=8 --dim seq=64\n  pipecut cost model.onnx --device A100-80GB --mode training --json"
    )]
    Cost(cost::CostArgs),
    /// Measure this machine's achievable rates and write a calibrated device profile.
    #[command(
        after_help = "Examples:\n  pipecut calibrate --device cpu --out cost-models/calibrated/cpu.json\n  pipecut cost model.onnx --device cost-models/calibrated/cpu.json --dim batch=1"
    )]
    Calibrate(calibrate::CalibrateArgs),
    /// Cut a model into pipeline stages for a cluster: print the stage table, write the plan.
    #[command(
        after_help = "Examples:\n  pipecut partition fixtures/models/gpt2_tiny.onnx --cluster 1x4xL4 --dim batch=8 --dim seq=64 --out plan.json\n  pipecut partition model.onnx --devices A100-80GB,A100-80GB,L4,L4 --stages 4 --mode training --microbatches 16\n  pipecut partition model.onnx --cluster 2x8xH100-SXM --stages auto --schedule gpipe --time-limit 30s --json"
    )]
    Partition(partition::PartitionArgs),
    /// Validate a plan against its model: every node once, convex ordered stages, memory, figures.
    #[command(after_help = "Examples:\n  pipecut check plan.json fixtures/models/gpt2_tiny.onnx")]
    Check(check::CheckArgs),
    /// Write one ONNX file per stage of a plan, and manifest.json routing the tensors between them.
    #[command(
        after_help = "Tensors that cross a stage boundary keep the model's symbolic dims unless --dim binds them.\nSee docs/export.md for the files and the manifest.\n\nExamples:\n  pipecut export plan.json fixtures/models/gpt2_tiny.onnx --out-dir stages/\n  pipecut export plan.json model.onnx --out-dir stages/ --dim batch=8 --json"
    )]
    Export(export::ExportArgs),
    /// Use a whole cluster: choose pipeline depth, data-parallel replicas, micro-batching,
    /// schedule and placement; print the best configurations and write the chosen plan.
    #[command(
        after_help = "Examples:\n  pipecut plan-cluster fixtures/models/gpt2_tiny.onnx --cluster 2x4xA100-80GB --global-batch 64 --dim seq=64\n  pipecut plan-cluster fixtures/models/gpt3_175b/model.onnx --cluster 16x8xH100-SXM --global-batch 64 --dim seq=2048 --time-limit 10s --out plan.json\n\nNot modelled yet: activation recomputation and ZeRO sharding, so training at GPT-3 scale (global batch 1536, --mode training) is refused as not fitting."
    )]
    PlanCluster(plan_cluster::PlanClusterArgs),
    /// Show a plan: its table and simulated step, the schedule timeline, the graph by stage.
    #[command(
        after_help = "Examples:\n  pipecut show plan.json\n  pipecut show plan.json --timeline timeline.svg\n  pipecut show plan.json fixtures/models/gpt2_tiny.onnx --graph stages.dot\n  pipecut show plan.json model.onnx --graph stages.svg   (needs Graphviz `dot`)"
    )]
    Show(show::ShowArgs),
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  pipecut completions bash > ~/.local/share/bash-completion/completions/pipecut\n  pipecut completions zsh > ~/.zfunc/_pipecut\n  pipecut completions fish > ~/.config/fish/completions/pipecut.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the JSON Schema of the plan document (the copy in docs/plan.schema.json).
    #[command(after_help = "Examples:\n  pipecut schema > plan.schema.json")]
    Schema,
    /// Run a plan: one thread per stage, micro-batches streamed, on the CPU reference runtime or
    /// (built with `--features cuda`) on GPUs.
    #[command(
        after_help = "Examples:\n  pipecut run plan.json fixtures/models/gpt2_tiny.onnx --microbatches 16\n  pipecut run plan.json model.onnx --input input_ids=ids.npy --output-dir out --json\n  pipecut run plan.json model.onnx --backend cuda   (stage k on GPU k mod the GPU count)"
    )]
    Run(run::RunArgs),
    /// Say what the CUDA backend can use here: whether it is built, the GPUs the driver sees,
    /// whether NVRTC compiles the kernels (and why not, for each).
    #[command(after_help = "Examples:\n  pipecut devices\n  pipecut devices --json")]
    Devices(devices::DevicesArgs),
}

/// A model file and the bindings of its symbolic dims, shared by the commands that plan.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// Bind a symbolic dim, e.g. `--dim batch=8` (repeatable). Batch is per micro-batch.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
}

impl ModelArgs {
    fn bindings(&self) -> anyhow::Result<DimBindings> {
        let mut bindings = DimBindings::new();
        for dim in &self.dims {
            bindings.parse_arg(dim)?;
        }
        Ok(bindings)
    }

    /// Loads the model and infers every shape, stopping at the first node that fails.
    /// `weights`: the command reads the weight bytes, so absent external data is refused.
    fn load_typed(&self, weights: Weights) -> anyhow::Result<Model> {
        let mut model = load_model(&self.model, weights)?;
        ShapeInference::new(self.bindings()?)
            .run(&mut model.graph)
            .with_context(|| format!("'{}'", self.model.display()))?;
        Ok(model)
    }
}

/// Whether a command reads the weight bytes of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Weights {
    /// Planning (inspect, cost, partition, plan-cluster, check, show): dtypes and dims are in
    /// the protobuf, so absent external-data files are a warning.
    NotRead,
    /// Export and run: absent external data is an error.
    Read,
}

/// Loads a model, warning about (or, when `weights` are read, refusing) absent external data.
pub(crate) fn load_model(path: &std::path::Path, weights: Weights) -> anyhow::Result<Model> {
    let model = pipecut::onnx::load_model(path)
        .with_context(|| format!("cannot load '{}'", path.display()))?;
    if weights == Weights::Read {
        model
            .require_external_data()
            .with_context(|| format!("cannot load '{}'", path.display()))?;
        return Ok(model);
    }
    let mut warned = std::collections::BTreeSet::new();
    for missing in &model.missing_external_data {
        if warned.insert(&missing.path) {
            let count = model
                .missing_external_data
                .iter()
                .filter(|m| m.path == missing.path)
                .count();
            eprintln!(
                "warning: '{}' does not exist: the weights of {count} initializer(s) are not \
                 there; planning needs only their shapes, export and run will need the file",
                missing.path.display()
            );
        }
    }
    Ok(model)
}

/// Runs a parsed command line; `Err` is printed by `main` with exit code 2.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Cost(args) => cost::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Partition(args) => partition::run(args),
        Command::Check(args) => check::run(args),
        Command::PlanCluster(args) => plan_cluster::run(args),
        Command::Show(args) => show::run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "pipecut", &mut script);
            print_stdout(&String::from_utf8_lossy(&script))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema => {
            print_stdout(&pipecut::plan::Plan::json_schema())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(args) => export::run(args),
        Command::Run(args) => run::run(args),
        Command::Devices(args) => devices::run(args),
    }
}

/// Writes to stdout; a closed pipe (`pipecut inspect m.onnx | head`) is not an error.
/// The model's file name as the plan records it (`""` for a path without one).
pub(crate) fn model_file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(crate) fn print_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so that an
/// interrupted or failed run never leaves a half-written file that looks complete.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create '{}'", dir.display()))?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = std::fs::write(&tmp, bytes)
        .with_context(|| format!("cannot write '{}'", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot write '{}'", path.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A spinner on stderr for work that may take more than a moment; hidden when stderr is not a
/// terminal (indicatif's default), so scripts and tests see clean output.
pub(crate) fn spinner(message: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}
