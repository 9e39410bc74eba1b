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
    keep_freed_memory();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", cli::terminal_safe(&cli::one_line(&err)));
            ExitCode::from(cli::exit_code(&err))
        }
    }
}

/// Tells glibc's allocator to keep the memory of freed tensors for the next ones. By default a
/// buffer above 128 KiB is its own `mmap`, returned to the system when freed, so every run of a
/// model paid a page fault per 4 KiB of each fresh intermediate tensor (9% of bert_tiny's
/// time, more on the convolutional models). The cost: the process keeps its peak heap until
/// it exits, which a run's own peak already needed. Buffers of 1 GiB and more are still mapped
/// on their own, so a huge model's one-off tensors do go back.
///
/// Small freed blocks go back to the heap at once instead of into glibc's "fastbins" (the
/// per-thread cache still keeps the last few of each size): a million-node model frees tens of
/// millions of small strings, and consolidating the fastbins they filled was 6% of the samples
/// of a partition of it and most of the time to free its decoded protobuf (docs/benchmarks.md,
/// "Loading a million nodes, by phase").
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it runs before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MXFAST, 0);
    }
}
