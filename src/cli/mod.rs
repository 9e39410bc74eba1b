//! Subcommands and their arguments.

mod inspect;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

/// Runs a parsed command line; `Err` is printed by `main` with exit code 2.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => inspect::run(args),
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
