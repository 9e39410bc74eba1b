//! Subcommands and their arguments.

mod calibrate;
mod cost;
mod inspect;

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
    fn load_typed(&self) -> anyhow::Result<Model> {
        let mut model = pipecut::onnx::load_model(&self.model)
            .with_context(|| format!("cannot load '{}'", self.model.display()))?;
        ShapeInference::new(self.bindings()?)
            .run(&mut model.graph)
            .with_context(|| format!("'{}'", self.model.display()))?;
        Ok(model)
    }
}

/// Runs a parsed command line; `Err` is printed by `main` with exit code 2.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Cost(args) => cost::run(args),
        Command::Calibrate(args) => calibrate::run(args),
    }
}

/// Writes to stdout; a closed pipe (`pipecut inspect m.onnx | head`) is not an error.
pub(crate) fn print_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
