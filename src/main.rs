//! The `pipecut` command line. Parsing, printing and exit codes only; the work is in the library.
//!
//! Exit codes: 0 success; 1 the request is understood but has no answer — the model does not fit
//! the devices, or a plan is invalid for its model; 2 bad input (unreadable or malformed files,
//! bad arguments, unsupported models). clap's own usage errors also exit with 2.

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
            ExitCode::from(exit_code(&err))
        }
    }
}

/// 1 when the library says the model does not fit or a plan is invalid, 2 for everything else.
fn exit_code(err: &anyhow::Error) -> u8 {
    let library = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<pipecut::Error>());
    match library {
        Some(pipecut::Error::Infeasible(_) | pipecut::Error::InvalidPlan(_)) => 1,
        _ => 2,
    }
}
