//! The `pipecut` command line. Parsing, printing and exit codes only; the work is in the library.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            // `{:#}` prints the whole chain on one line: "cannot load x.onnx: ...: ...".
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
