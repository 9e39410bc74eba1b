//! The `pipecut` command line. Parsing, printing and exit codes only; the work is in the library.
//!
//! Exit codes: 0 success; 1 the request is understood but has no answer — the model does not fit
//! the devices, or a plan is invalid for its model; 2 bad input (unreadable or malformed files,
//! bad arguments, unsupported models); 3 the memory decision is not finished — no plan was found
//! that fits, but the time limit or work budget ran out before "does not fit" was proven. clap's
//! own usage errors also exit with 2.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    keep_freed_memory();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", cli::terminal_safe(&one_line(&err)));
            ExitCode::from(exit_code(&err))
        }
    }
}

/// Tells glibc's allocator to keep the memory of freed tensors for the next ones. By default a
/// buffer above 128 KiB is its own `mmap`, returned to the system when freed, so every run of a
/// model paid a page fault per 4 KiB of each fresh intermediate tensor (9% of bert_tiny's
/// time, more on the convolutional models). The cost: the process keeps its peak heap until
/// it exits, which a run's own peak already needed. Buffers of 1 GiB and more are still mapped
/// on their own, so a huge model's one-off tensors do go back.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it runs before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The error chain on one line ("cannot load x.onnx: ...: ..."), each cause once: a library
/// error whose message already quotes its OS error is not followed by that error again.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// 1 when the library says the model does not fit or a plan is invalid, 3 when it could not
/// decide whether the model fits in time, 2 for everything else.
fn exit_code(err: &anyhow::Error) -> u8 {
    let library = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<pipecut::Error>());
    match library {
        Some(
            pipecut::Error::Infeasible(_)
            | pipecut::Error::InvalidPlan(_)
            | pipecut::Error::NotAPartition(_)
            | pipecut::Error::NonConvexStages { .. },
        ) => 1,
        Some(pipecut::Error::MemoryUndecided(_)) => 3,
        _ => 2,
    }
}
