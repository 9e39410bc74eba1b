//! The `pipecut` command line. Parsing, printing and exit codes only; the work is in the library.
//!
//! Exit codes: 0 success; 1 the request is understood but has no answer — the model does not fit
//! the devices, or a plan is invalid for its model; 2 bad input (unreadable or malformed files,
//! bad arguments, unsupported models); 3 the memory decision is not finished — no plan was found
//! that fits, but the time limit or work budget ran out before "does not fit" was proven. clap's
//! own usage errors also exit with 2.

use std::process::ExitCode;

use clap::Parser;

use pipecut::cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", cli::terminal_safe(&cli::one_line(&err)));
            ExitCode::from(cli::exit_code(&err))
        }
    }
}

/// mimalloc, not glibc's allocator: loading a million-node model makes and frees tens of
/// millions of small strings and lists, and glibc's `malloc`, `free` and the merging of freed
/// blocks were a third of its samples; mimalloc keeps the freed blocks of each size on their own
/// pages for the next ones of that size. In alternating runs of `inspect` on that model it
/// took 0.4 to 0.6 of the time (docs/benchmarks.md, "Limits at any size").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
