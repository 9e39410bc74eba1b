//! tract-onnx measured beside pipecut's CPU runtime (issue 15 item 4; docs/benchmarks.md,
//! "Own kernels or tract"). Its own cargo project, outside pipecut's build:
//!
//! ```sh
//! cd benches/tract_compare && cargo build --release
//! # one model, called by benches/cpu_speed.py with the inputs it feeds the others
//! target/release/tract_compare bench MODEL.onnx --repeats 15 --out DIR NAME=INPUT.npy ...
//! # the ONNX node cases pipecut's tests/conformance.rs generated under target/conformance
//! target/release/tract_compare conformance [--sample-values] ../../target/conformance \
//!     results.txt ../../tests/conformance/expected_failures.txt
//! ```

mod bench;
mod conformance;
mod npy;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: tract_compare bench MODEL --repeats N --out DIR NAME=NPY... | \
                     conformance [--sample-values] CACHE_DIR RESULTS [PIPECUT_EXPECTED_FAILURES]";

fn bench_args(args: &[String]) -> Result<bench::Args> {
    let mut parsed = bench::Args {
        model: PathBuf::from(args.first().context(USAGE)?),
        inputs: Vec::new(),
        repeats: 15,
        out_dir: PathBuf::from("."),
    };
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--repeats" => parsed.repeats = rest.next().context(USAGE)?.parse()?,
            "--out" => parsed.out_dir = PathBuf::from(rest.next().context(USAGE)?),
            input => {
                let (name, path) = input.split_once('=').context(USAGE)?;
                parsed.inputs.push((name.to_string(), PathBuf::from(path)));
            }
        }
    }
    Ok(parsed)
}

fn main_result() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench::run(&bench_args(&args[1..])?),
        Some("conformance") => {
            let sample_values = args.get(1).map(String::as_str) == Some("--sample-values");
            let paths = &args[1 + sample_values as usize..];
            if paths.len() < 2 {
                bail!(USAGE);
            }
            conformance::run_all(
                paths[0].as_ref(),
                paths[1].as_ref(),
                paths.get(2).map(|p| p.as_ref()),
                sample_values,
            )
        }
        Some(mode @ ("case" | "case-with-sample-values")) if args.len() == 3 => {
            let case = serde_json::from_str(&args[2])?;
            conformance::run_case(args[1].as_ref(), &case, mode == "case-with-sample-values")
        }
        _ => bail!(USAGE),
    }
}

fn main() {
    if let Err(e) = main_result() {
        eprintln!("tract_compare: {e:#}");
        std::process::exit(2);
    }
}
