//! `pipecut calibrate --device NAME --out FILE`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cost::calibrate::{calibrated_profile, measure_cpu, Sizes};
use clap::Args;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The profile to calibrate (its peaks are the denominators of the measured efficiencies).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where to write the calibrated profile (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Time spent on each microbenchmark size, in milliseconds.
    #[arg(long, default_value_t = 300)]
    budget_ms: u64,
    /// Small sizes that fit in cache (a smoke test; efficiencies will be optimistic).
    #[arg(long)]
    quick: bool,
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<ExitCode> {
    let (catalog, name) = super::cost::device_catalog(&args.device)?;
    let base = catalog.device(&name)?;
    let sizes = if args.quick {
        Sizes {
            matmul: vec![64, 128],
            conv_side: 16,
            vector: vec![1 << 16],
            transpose: vec![256],
        }
    } else {
        Sizes::standard()
    };
    // Refuse GPUs before spending time on measurements.
    calibrated_profile(base, &[])?;
    eprintln!("calibrating '{}' on this machine ...", base.name);
    let measurements = measure_cpu(&sizes, Duration::from_millis(args.budget_ms));
    for m in &measurements {
        eprintln!(
            "  {:<44} {:>12.3e} /s  spread {:>5.1}%",
            m.label,
            m.rate,
            m.spread * 100.0
        );
    }
    let noisy: Vec<&str> = measurements
        .iter()
        .filter(|m| m.spread > crate::cost::measured::NOISY_SPREAD)
        .map(|m| m.label.as_str())
        .collect();
    if !noisy.is_empty() {
        eprintln!(
            "warning: the machine was busy: {} of {} measurements varied by more than 25% between runs ({}); calibrate again when it is quiet for a profile to trust",
            noisy.len(),
            measurements.len(),
            noisy.join(", ")
        );
    }
    let spec = calibrated_profile(base, &measurements)?;
    let json = serde_json::to_string_pretty(&spec)? + "\n";
    super::write_atomically(&args.out, json.as_bytes(), &[])?;
    let e = &spec.efficiency;
    super::print_stdout(&format!(
        "wrote {} ({}): efficiency matmul {:.2}, conv {:.2}, elementwise {:.2}, reduction {:.2}, data movement {:.2}\n",
        args.out.display(),
        spec.name,
        e.matmul.value,
        e.conv.value,
        e.elementwise.value,
        e.reduction.value,
        e.data_movement.value
    ))?;
    Ok(ExitCode::SUCCESS)
}
