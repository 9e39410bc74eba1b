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
    /// Also compile the kernels for this architecture (e.g. 80, 90; repeatable) and report
    /// each kernel's registers and spills as ptxas gives them (needs NVRTC, not a GPU).
    #[arg(long, value_name = "SM")]
    ptxas: Vec<u32>,
}

/// ptxas's figures for the kernels on one architecture.
#[derive(Debug, Serialize)]
struct PtxasReport {
    arch: u32,
    kernels: Vec<crate::runtime::cuda::KernelResources>,
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
    devices: Vec<crate::runtime::cuda::DeviceReport>,
    /// Why cuBLAS cannot be used (a run needs it), when it cannot.
    cublas_problem: Option<String>,
    /// Registers and spills per kernel for each `--ptxas` architecture.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ptxas: Vec<PtxasReport>,
}

pub fn run(args: DevicesArgs) -> anyhow::Result<ExitCode> {
    use crate::runtime::cuda;
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
        ptxas: args
            .ptxas
            .iter()
            .map(|&arch| {
                Ok(PtxasReport {
                    arch,
                    kernels: cuda::kernel_resources(arch)?,
                })
            })
            .collect::<Result<_, crate::Error>>()?,
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
    for p in &report.ptxas {
        text.push_str(&format!("sm_{} (ptxas):\n", p.arch));
        for k in &p.kernels {
            text.push_str(&format!(
                "  {:<20} {:>3} registers, {} B spill stores, {} B spill loads, {} B stack\n",
                k.kernel, k.registers, k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes
            ));
        }
    }
    text.push_str("CPU backend: always built\n");
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
