//! `pipecut devices`: what the CUDA backend can use on this machine, and why not.

use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use super::print_stdout;

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    /// Whether this binary has the CUDA backend (`--features cuda`).
    cuda_built: bool,
    /// GPUs the driver sees, when it can be loaded.
    gpus: Option<usize>,
    /// Why there are none to use.
    gpu_problem: Option<String>,
    /// The kernels NVRTC compiled, when it could.
    kernels: Option<Vec<String>>,
    /// Why the kernels could not be compiled.
    kernels_problem: Option<String>,
    /// Each GPU with the kernels compiled for its architecture and loaded on it.
    devices: Vec<pipecut::runtime::cuda::DeviceReport>,
    /// Why cuBLAS cannot be used (a run needs it), when it cannot.
    cublas_problem: Option<String>,
}

pub fn run(args: DevicesArgs) -> anyhow::Result<ExitCode> {
    use pipecut::runtime::cuda;
    let (gpus, gpu_problem) = match cuda::device_count() {
        Ok(n) => (Some(n), None),
        Err(why) => (None, Some(why)),
    };
    let (kernels, kernels_problem) = match cuda::check_kernels() {
        Ok(names) => (Some(names), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let report = Report {
        cuda_built: cfg!(feature = "cuda"),
        gpus,
        gpu_problem,
        kernels,
        kernels_problem,
        devices: cuda::device_reports(),
        cublas_problem: cuda::cublas_problem(),
    };
    if args.json {
        print_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = String::new();
    text.push_str(if report.cuda_built {
        "CUDA backend: built (cudarc, libraries loaded at run time)\n"
    } else {
        "CUDA backend: not built (rebuild with `--features cuda`)\n"
    });
    match (&report.gpus, &report.gpu_problem) {
        (Some(n), _) => text.push_str(&format!("GPUs: {n}\n")),
        (None, Some(why)) => text.push_str(&format!("GPUs: none usable: {why}\n")),
        _ => {}
    }
    match (&report.kernels, &report.kernels_problem) {
        (Some(names), _) => text.push_str(&format!(
            "kernels: {} compiled by NVRTC ({})\n",
            names.len(),
            names.join(", ")
        )),
        (None, Some(why)) => text.push_str(&format!("kernels: not compiled: {why}\n")),
        _ => {}
    }
    for d in &report.devices {
        match (&d.kernels, &d.problem) {
            (Some(image), _) => text.push_str(&format!(
                "GPU {} (compute capability {}): kernels loaded ({image})\n",
                d.ordinal, d.compute_capability
            )),
            (None, Some(why)) => text.push_str(&format!(
                "GPU {} (compute capability {}): kernels not loaded: {why}\n",
                d.ordinal, d.compute_capability
            )),
            _ => {}
        }
    }
    if report.cuda_built {
        if let Some(why) = &report.cublas_problem {
            text.push_str(&format!("cuBLAS: {why}\n"));
        }
    }
    text.push_str("CPU backend: always built\n");
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
