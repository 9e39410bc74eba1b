//! `pipecut profile MODEL --out times.json`: measure every node on this machine, so that
//! `partition --profile times.json` plans on measured times; or convert onnxruntime's profiler
//! output (`--from-onnxruntime trace.json --device NAME`) into the same file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::cost::measured::{MeasuredModel, NodeTimes};
use crate::runtime::profile::{profile, ProfileRuns, ProfileSubject};
use crate::runtime::{check_inputs, cuda::CudaExecutor, seeded_inputs, CpuExecutor, Weights};
use anyhow::Context;
use clap::Args;

use super::ModelArgs;

#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Where to write the node times (JSON, schema pipecut-node-times-v1).
    #[arg(long)]
    out: PathBuf,
    /// The catalog device the times stand for: plans cost the nodes of stages on this device
    /// from them. A profile file (`cal.json`) names its device.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where the nodes run: the CPU runtime, or the CUDA runtime (a build with `--features
    /// cuda`; each node timed to the end of its device work). A trace of onnxruntime's CUDA
    /// provider can be converted with --from-onnxruntime instead.
    #[arg(long, value_enum, default_value_t = ProfileBackend::Cpu)]
    backend: ProfileBackend,
    /// Unmeasured runs before the measured ones.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Measured runs; each node's time is the median over them.
    #[arg(long, default_value_t = 15)]
    repeats: usize,
    /// Threads a matrix product may use (the runtime's default is every physical core; a
    /// pipeline with one core per stage wants 1).
    #[arg(long)]
    threads: Option<usize>,
    /// A model input from a .npy file (repeatable). Without any, seeded random inputs of one
    /// micro-batch at the --dim sizes are used.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Convert this onnxruntime profile (SessionOptions.enable_profiling, run with
    /// graph_optimization_level ORT_DISABLE_ALL so its nodes are the model's) instead of
    /// measuring.
    #[arg(long, value_name = "TRACE.json")]
    from_onnxruntime: Option<PathBuf>,
}

/// Backends `profile` can time nodes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileBackend {
    /// The CPU reference runtime.
    Cpu,
    /// The CUDA runtime, as `run --backend cuda` runs it.
    Cuda,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<ExitCode> {
    super::check_output(&args.out, &[&args.model.model])?;
    let (catalog, device) = super::cost::device_catalog(&args.device)?;
    let device = catalog.device(&device)?.name.clone();
    let model = args.model.load_typed(super::Weights::NotRead)?;
    let dims: BTreeMap<String, u64> = args.model.dims()?;
    let measured_model = MeasuredModel {
        graph_sha256: model.graph_sha256.clone(),
        dims,
    };
    let times = match &args.from_onnxruntime {
        Some(trace) => from_onnxruntime(trace, &device, measured_model)?,
        None => {
            if let Some(threads) = args.threads {
                if threads == 0 {
                    anyhow::bail!("--threads must be at least 1");
                }
                // The matrix kernels read it at their first product, which is below.
                std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
            }
            let model = args
                .model
                .type_bound(super::load_model(&args.model.model, super::Weights::Read)?)?;
            let graph = &model.graph;
            let inputs = if args.inputs.is_empty() {
                seeded_inputs(graph, 1, 0)?
            } else {
                super::run_files::read_inputs(&args.inputs, graph)?
            };
            check_inputs(graph, &inputs, 1)?;
            let weights = Weights::load(&args.model.model, graph).with_context(|| {
                format!(
                    "cannot read the weights of '{}'",
                    args.model.model.display()
                )
            })?;
            eprintln!(
                "profiling {} nodes: {} warm-up + {} measured runs ...",
                graph.node_count(),
                args.warmup,
                args.repeats
            );
            let runs = ProfileRuns {
                warmup: args.warmup,
                repeats: args.repeats,
            };
            let subject = ProfileSubject {
                device,
                model: measured_model,
                threads: match args.backend {
                    ProfileBackend::Cpu => args.threads.or_else(matmul_threads),
                    ProfileBackend::Cuda => None,
                },
            };
            match args.backend {
                ProfileBackend::Cpu => {
                    let executor = CpuExecutor::new(graph, &weights);
                    profile(&executor, graph, &inputs, runs, subject)?
                }
                // The same executor `run --backend cuda` uses, each node timed to the end of
                // its device work.
                ProfileBackend::Cuda => {
                    let executor = CudaExecutor::for_stages(graph, &weights, 1)?;
                    profile(&executor, graph, &inputs, runs, subject)?
                }
            }
        }
    };
    super::write_atomically(&args.out, times.to_json().as_bytes(), &[&args.model.model])?;
    let m = &times.measured_with;
    super::print_stdout(&format!(
        "wrote {}: {} nodes on {} ({}), {:.3} ms per run (median of {}), spread {:.1}%{}\n",
        args.out.display(),
        times.nodes.len(),
        times.device,
        m.backend,
        m.total_secs * 1e3,
        m.repeats,
        m.total_spread * 100.0,
        if m.noisy {
            "\nwarning: the runs varied by more than 25%: the machine was busy; profile again when it is quiet for times to plan on"
        } else {
            ""
        }
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn from_onnxruntime(
    trace: &std::path::Path,
    device: &str,
    model: MeasuredModel,
) -> anyhow::Result<NodeTimes> {
    let text = crate::io::read_json_text(trace, "onnxruntime profile")?;
    let mut times = NodeTimes::from_onnxruntime_trace(&text, &trace.display().to_string(), device)?;
    // The trace does not say which model or dims it ran; the user says it by naming the model.
    times.model = model;
    Ok(times)
}

/// The thread count the matrix kernels will use: MATMUL_NUM_THREADS, else the cores (their
/// own rule), which the standard library approximates by the available parallelism.
fn matmul_threads() -> Option<usize> {
    std::env::var("MATMUL_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
}
