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
    reserve_address_space_sparingly();
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

/// mimalloc reserves its address space in arenas of 1 GiB; under an address-space cap
/// (`ulimit -v`) each reservation counts whole, and a run that fitted glibc's allocator failed
/// one 512 MiB tensor early (tests/robustness.rs, `joining_2_gib_of_output_under_the_cap_…`).
/// Arenas of 64 MiB leave the cap to the model's data.
fn reserve_address_space_sparingly() {
    // `mi_option_arena_reserve` in `mi_option_t` of mimalloc 3.3.2 (include/mimalloc.h of
    // libmimalloc-sys 0.1.49, which Cargo.lock pins), in KiB; another release may number its
    // options differently, so only that one is told.
    const MIMALLOC_VERSION: std::ffi::c_int = 30302;
    const MI_OPTION_ARENA_RESERVE: std::ffi::c_int = 23;
    extern "C" {
        fn mi_version() -> std::ffi::c_int;
        fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
    // SAFETY: both are plain C calls of the linked mimalloc: a constant read, and a store of one
    // option that any thread may make.
    unsafe {
        if mi_version() == MIMALLOC_VERSION {
            mi_option_set(MI_OPTION_ARENA_RESERVE, 64 * 1024);
        }
    }
}
