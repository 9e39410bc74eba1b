//! `pipecut run PLAN MODEL --distributed`: this process is one rank of a job that a launcher
//! (`torchrun`, `mpirun`, `srun`) started; it runs its stage of its replica (its TP rank's shard
//! of it, on a tensor-parallel plan) and talks to the others over MPI or TCP
//! (`crate::runtime::distributed`). The collector (last stage of replica 0) writes the
//! outputs; every rank prints its own figures.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::plan::Plan;
use crate::runtime::cpu::split_microbatches;
use crate::runtime::distributed::{
    abort_job,
    auth::{self, JobKey},
    collectives::{SharedTransport, TransportGroup},
    metrics, run_rank,
    tcp::{TcpJob, TcpTransport},
    Launch, Place, RankFigures, RankJob, RankLayout, Rendezvous, SharedFigures, Transport,
};
use crate::runtime::tensor_parallel::{as_member, whole_rank_spec, RankShardExecutor};
use crate::runtime::{CpuExecutor, Executor, StageSpec, Tensors, Weights};
use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use super::{print_stdout, Backend};

/// The options of a multi-process run.
#[derive(Debug, Args)]
pub struct DistributedArgs {
    /// Run as one rank of a job started by torchrun, mpirun or srun: rank r runs TP rank
    /// r mod t of stage (r / t) mod K of replica r / (t·K) (t GPUs per stage, K stages, as many
    /// replicas as the plan's data parallelism), and the last stage of replica 0 writes the
    /// outputs.
    #[arg(long)]
    pub distributed: bool,
    /// How ranks exchange tensors: `mpi` (a build with `--features mpi`, started by an MPI
    /// launcher), `tcp` (rendezvous at MASTER_ADDR:MASTER_PORT, as torchrun sets), `nccl`
    /// (GPU ranks, `--backend cuda`, a build with `--features cuda`; NCCL meets at the same
    /// rendezvous), or `auto` (`nccl` with `--backend cuda`, else MPI when both apply).
    #[arg(long, value_enum, default_value_t = TransportKind::Auto, requires = "distributed")]
    transport: TransportKind,
    /// How long a rank waits for a peer (to join, or to send its next message) before it ends
    /// the job with an error naming that peer.
    #[arg(long, default_value = "300s", value_parser = super::partition::parse_duration, requires = "distributed")]
    peer_timeout: Duration,
    /// Serve this rank's figures in the Prometheus text format at http://HOST:PORT/metrics;
    /// rank r uses PORT + its local rank, so ranks on one machine do not collide.
    #[arg(long, value_name = "HOST:PORT", requires = "distributed")]
    metrics_addr: Option<SocketAddr>,
    /// Rewrite this file with the rank's figures every second (Prometheus text format, for
    /// node_exporter's textfile collector); `{rank}` in the name becomes the rank.
    #[arg(long, value_name = "PATH", requires = "distributed")]
    metrics_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TransportKind {
    Auto,
    Mpi,
    Tcp,
    Nccl,
}

/// What a rank ran, for `--json` and the one-line report.
#[derive(Debug, Serialize)]
struct RankReport {
    transport: &'static str,
    launcher: &'static str,
    /// The GPU this rank's stage ran on (`--backend cuda`).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<usize>,
    /// The model file the rank loaded (an exported stage file, or the whole model).
    model: String,
    #[serde(flatten)]
    figures: RankFigures,
    /// The rank's place in its stage's tensor-parallel group (absent without tensor
    /// parallelism).
    #[serde(skip_serializing_if = "Option::is_none")]
    tp_rank: Option<usize>,
    /// The plan's compute time for this stage, per micro-batch.
    predicted_busy_secs_per_microbatch: f64,
    /// The plan's transfer time into this stage, per micro-batch.
    predicted_transfer_secs_per_microbatch: f64,
    outputs: std::collections::BTreeMap<String, String>,
}

/// Everything `run` has prepared that a rank needs.
pub struct RankSetup<'a> {
    pub plan: &'a Plan,
    pub backend: Backend,
    /// Who this process is ([`place_in_job`]).
    pub launch: Launch,
    /// The model file this rank loaded: the whole model, or its stage's exported file.
    pub model_file: &'a Path,
    pub graph: &'a crate::graph::Graph,
    pub weights: &'a Weights,
    /// This rank's stage.
    pub spec: &'a StageSpec,
    /// On a tensor-parallel plan, this rank's shard of its stage (graph and weights), which it
    /// runs in place of the stage of `graph`.
    pub shard: Option<(&'a crate::graph::Graph, &'a Weights)>,
    /// Tensors this rank passes on from what it receives without reading them (an exported
    /// stage file holds only what its own nodes read; empty for the whole model).
    pub relay: Vec<String>,
    /// The plan file, whose digest every rank of the job must share.
    pub plan_file: &'a Path,
    /// sha256 (hex) of the model every rank of the job must run.
    pub model_sha256: &'a str,
    /// The run's dims (the plan's, with `--dim` over them).
    pub dims: std::collections::BTreeMap<String, u64>,
    /// The most times its declared size a tensor that may cross takes on the wire
    /// ([`wire_widening`] of the dtypes that may cross).
    pub wire_widening: u64,
    pub microbatches: usize,
    pub output_dir: &'a Path,
    pub protected: Vec<&'a Path>,
    pub json: bool,
    /// Set once this rank starts to join the job: a failure before that is reported by
    /// [`report_failures_before_joining`].
    pub joining: &'a Cell<bool>,
}

/// Who this process is in the job its launcher started, checked against the plan's layout
/// for a step of `microbatches`: the launch and this rank's place (stage, TP rank, replica).
pub fn place_in_job(plan: &Plan, microbatches: usize) -> anyhow::Result<(Launch, Place)> {
    let launch = Launch::from_env()?;
    let layout = layout(plan);
    layout.check_world(&launch, microbatches)?;
    let place = layout.place(launch.rank);
    Ok((launch, place))
}

/// The plan's t (1 without tensor parallelism).
pub fn tensor_parallel_degree(plan: &Plan) -> usize {
    plan.parallelism
        .as_ref()
        .map_or(1, |p| (p.tensor_parallel.degree as usize).max(1))
}

/// How the plan's ranks sit in the job.
fn layout(plan: &Plan) -> RankLayout {
    RankLayout {
        stages: plan.stages.len(),
        replicas: replicas(plan),
        tensor_parallel: tensor_parallel_degree(plan),
    }
}

/// Runs this process's rank; `make_inputs` is called only on stage 0.
pub fn run(
    args: &DistributedArgs,
    setup: RankSetup<'_>,
    make_inputs: impl FnOnce() -> anyhow::Result<Tensors>,
) -> anyhow::Result<ExitCode> {
    let launch = &setup.launch;
    let layout = layout(setup.plan);
    let place = layout.place(launch.rank);
    // Labelled before anything is published, so that a scrape during the rendezvous already
    // says which rank, stage and replica answers.
    let figures: SharedFigures = Arc::new(std::sync::Mutex::new(RankFigures {
        rank: place.rank,
        stage: place.stage,
        replica: place.replica,
        microbatches_total: layout
            .microbatches_of(place.replica, setup.microbatches)
            .len(),
        ..RankFigures::default()
    }));
    publish(args, launch, &figures, &setup.protected)?;

    let rank = Rank {
        args,
        setup: &setup,
        launch,
        figures: &figures,
    };
    let tcp = tcp_job(&setup, args, place)?;
    let transport = || connect(args, launch, None, tcp);
    let ran = match (setup.backend, setup.shard) {
        (Backend::Cpu, None) => {
            let executor = CpuExecutor::new(setup.graph, setup.weights);
            rank.run(&executor, transport, make_inputs, None)?
        }
        (Backend::Cpu, Some((shard, weights))) => {
            let executor = RankShardExecutor::new(
                setup.graph,
                CpuExecutor::new(shard, weights),
                whole_rank_spec(shard)?,
            );
            rank.run(&executor, transport, make_inputs, None)?
        }
        (Backend::Cuda, None) => run_on_gpu(&rank, make_inputs)?,
        (Backend::Cuda, Some(_)) => bail!(
            "--distributed runs a tensor-parallel plan's ranks on the CPU backend only: \
             run it in one process (`pipecut run --backend cuda`, the ranks as threads)"
        ),
    };
    let last = figures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let planned = &setup.plan.stages[place.stage];
    let report = RankReport {
        transport: ran.transport,
        launcher: launch.launcher,
        gpu: ran.gpu,
        model: setup.model_file.display().to_string(),
        figures: last,
        tp_rank: (layout.tensor_parallel > 1).then_some(place.tp_rank),
        predicted_busy_secs_per_microbatch: planned.stage_secs,
        predicted_transfer_secs_per_microbatch: planned
            .received
            .iter()
            .fold(0.0, |sum, r| sum + r.transfer_secs),
        outputs: ran.outputs,
    };
    let text = if setup.json {
        format!("{}\n", serde_json::to_string(&report)?)
    } else {
        line(&report)
    };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What a rank ran.
struct Ran {
    /// Its transport's name.
    transport: &'static str,
    /// Its GPU, on `--backend cuda`.
    gpu: Option<usize>,
    /// The output files written (on the collector only).
    outputs: std::collections::BTreeMap<String, String>,
}

/// This process's rank with what it was given.
struct Rank<'a> {
    args: &'a DistributedArgs,
    setup: &'a RankSetup<'a>,
    launch: &'a Launch,
    figures: &'a SharedFigures,
}

impl Rank<'_> {
    /// Prepares this rank's stage on `executor`, joins the job through `transport`, runs its
    /// micro-batches and writes the outputs on the collector.
    fn run<E: Executor>(
        &self,
        executor: &E,
        transport: impl FnOnce() -> anyhow::Result<Box<dyn Transport>>,
        make_inputs: impl FnOnce() -> anyhow::Result<Tensors>,
        gpu: Option<usize>,
    ) -> anyhow::Result<Ran> {
        let (args, setup, launch, figures) = (self.args, self.setup, self.launch, self.figures);
        let layout = layout(setup.plan);
        let place = layout.place(launch.rank);
        // Joined first, so that a rank failing to prepare its stage ends the job at once.
        setup.joining.set(true);
        let mut transport = SharedTransport::new(transport()?);
        let prepared = executor
            .prepare(setup.spec)
            .map_err(anyhow::Error::from)
            .and_then(|stage| {
                let inputs = match place.stage {
                    0 => split_microbatches(&make_inputs()?, setup.microbatches)?,
                    _ => Vec::new(),
                };
                Ok((stage, inputs))
            });
        let (stage, inputs) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                let cause = crate::Error::Distributed(super::one_line(&e));
                return Err(abort_job(&mut transport, &layout, cause).into());
            }
        };
        let job = RankJob {
            layout,
            microbatches: setup.microbatches,
            peer_timeout: args.peer_timeout,
            relay: setup.relay.clone(),
        };
        // The collector writes the outputs before any rank is acknowledged.
        let mut outputs = Default::default();
        let mut deliver = |joined: Tensors| {
            outputs = super::run_files::write_outputs(
                setup.output_dir,
                &joined,
                setup.graph,
                &setup.protected,
            )
            .map_err(|e| crate::Error::Distributed(super::one_line(&e)))?;
            Ok(())
        };
        // The shard's collectives meet the other ranks of its stage group over the transport.
        let group = TransportGroup::new(transport.clone(), &layout, place, args.peer_timeout);
        let outcome = as_member(std::rc::Rc::new(group), || {
            run_rank(
                executor,
                &stage,
                &mut transport,
                &job,
                &inputs,
                figures,
                &mut deliver,
            )
        });
        if let Some(path) = &args.metrics_file {
            let last = figures.lock().unwrap_or_else(|p| p.into_inner()).clone();
            metrics::write_file(&rank_path(path, place.rank), &last)?;
        }
        outcome?;
        Ok(Ran {
            transport: transport.name(),
            gpu,
            outputs,
        })
    }
}

/// A GPU rank: its stage on GPU `local rank mod GPUs`, so the ranks a launcher starts on one
/// machine take its GPUs in turn.
#[cfg(feature = "cuda")]
fn run_on_gpu(
    rank: &Rank<'_>,
    make_inputs: impl FnOnce() -> anyhow::Result<Tensors>,
) -> anyhow::Result<Ran> {
    let gpus = crate::runtime::cuda::device_count().map_err(crate::Error::Cuda)?;
    let gpu = rank.launch.local_rank % gpus;
    let setup = rank.setup;
    let executor = crate::runtime::cuda::CudaExecutor::on_device(setup.graph, setup.weights, gpu)?;
    let place = layout(setup.plan).place(rank.launch.rank);
    let tcp = tcp_job(setup, rank.args, place)?;
    let transport = || connect(rank.args, rank.launch, Some(gpu), tcp);
    rank.run(&executor, transport, make_inputs, Some(gpu))
}

#[cfg(not(feature = "cuda"))]
fn run_on_gpu(
    _rank: &Rank<'_>,
    _make_inputs: impl FnOnce() -> anyhow::Result<Tensors>,
) -> anyhow::Result<Ran> {
    bail!("this pipecut was built without CUDA support: rebuild with `cargo build --features cuda`")
}

/// The plan's data-parallel replicas (1 for a plan without a `parallelism` section).
pub fn replicas(plan: &Plan) -> usize {
    plan.parallelism
        .as_ref()
        .map_or(1, |p| p.data_parallel.max(1))
}

/// Starts the metrics endpoint and file, where asked.
fn publish(
    args: &DistributedArgs,
    launch: &Launch,
    figures: &SharedFigures,
    inputs: &[&Path],
) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics_addr {
        let port = usize::from(addr.port()) + launch.local_rank;
        let port = u16::try_from(port)
            .ok()
            .filter(|_| addr.port() != 0)
            .with_context(|| {
                format!(
                    "--metrics-addr {addr}: port + local rank {} is not a port",
                    launch.local_rank
                )
            })?;
        metrics::serve(SocketAddr::new(addr.ip(), port), Arc::clone(figures))?;
    }
    if let Some(path) = &args.metrics_file {
        let path = rank_path(path, launch.rank);
        // Checked like every output: never one of the job's own files (the plan, the model).
        crate::io::check_output(&path, inputs)?;
        metrics::publish_to_file(path, Arc::clone(figures));
    }
    Ok(())
}

/// `path` with `{rank}` replaced by the rank.
fn rank_path(path: &Path, rank: usize) -> PathBuf {
    PathBuf::from(path.to_string_lossy().replace("{rank}", &rank.to_string()))
}

/// What the TCP transport (also NCCL's control channel) enforces for this rank: the job's
/// key (secret and digests), the longest message the plan lets cross and the queue bound.
fn tcp_job(setup: &RankSetup<'_>, args: &DistributedArgs, place: Place) -> anyhow::Result<TcpJob> {
    let model =
        digest_from_hex(setup.model_sha256).context("the model's sha256 is not 64 hex digits")?;
    let key = job_key(setup.plan, setup.plan_file, model, &setup.launch)?;
    let layout = layout(setup.plan);
    // A link carries one message per micro-batch at most ahead of its receiver, but the
    // collector takes the other replicas' outputs only after its own micro-batches.
    let replica_share = layout.microbatches_of(0, setup.microbatches).len();
    let max_queued = if place.rank == layout.collector() {
        replica_share + QUEUE_SLACK
    } else {
        QUEUE_SLACK
    };
    Ok(TcpJob {
        key,
        max_message: max_message(setup.plan, &setup.dims, setup.wire_widening),
        max_queued,
        peer_timeout: args.peer_timeout,
    })
}

/// The job's key: its secret, and the digests of the plan file and of `model`.
fn job_key(
    plan: &Plan,
    plan_file: &Path,
    model: [u8; 32],
    launch: &Launch,
) -> anyhow::Result<JobKey> {
    let plan_bytes = std::fs::read(plan_file)
        .with_context(|| format!("cannot read '{}'", plan_file.display()))?;
    let rendezvous = launch
        .rendezvous
        .as_ref()
        .map(Rendezvous::name)
        .unwrap_or_default();
    let graph = plan
        .model
        .graph_sha256
        .as_deref()
        .unwrap_or(&plan.model.sha256);
    Ok(JobKey::from_vars(
        |name| std::env::var(name).ok(),
        auth::sha256(&plan_bytes),
        model,
        graph,
        &rendezvous,
        launch.world,
    )?)
}

/// Runs this process's rank (`rank`, given a flag it sets once it starts to join the job).
/// A failure before it joined (loading the model or its stage's weights, a bad option) is
/// still told to the job over the TCP rendezvous ([`TcpTransport::report_failure`]), so that
/// every rank ends at once naming it, not after the peer timeout as "never joined". Under MPI
/// the launcher ends the job when a rank exits with an error.
pub fn report_failures_before_joining(
    args: &DistributedArgs,
    plan: &Plan,
    plan_file: &Path,
    rank: impl FnOnce(&Cell<bool>) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    let joining = Cell::new(false);
    let outcome = rank(&joining);
    let Err(error) = &outcome else {
        return outcome;
    };
    let Ok(launch) = Launch::from_env() else {
        return outcome;
    };
    // A job whose size does not fit the plan: every rank finds that out for itself, and
    // there is no rendezvous of the plan's ranks to tell.
    if launch.world != layout(plan).world() || launch.rank >= launch.world {
        return outcome;
    }
    let by_mpi = args.transport == TransportKind::Mpi
        || (args.transport == TransportKind::Auto && cfg!(feature = "mpi") && launch.by_mpi);
    let (Some(rendezvous), false, false) = (&launch.rendezvous, joining.get(), by_mpi) else {
        return outcome;
    };
    // The model's digest is not compared with a failed rank's: it may not have one.
    if let Ok(key) = job_key(plan, plan_file, [0; 32], &launch) {
        let job = TcpJob {
            key,
            max_message: 0,
            max_queued: 0,
            peer_timeout: args.peer_timeout,
        };
        let cause = super::one_line(error);
        let _ = TcpTransport::report_failure(launch.rank, launch.world, rendezvous, job, &cause);
    }
    outcome
}

/// Messages a link may hold beyond what the schedule sends ahead: the end-of-job report and
/// a collective's exchange or two.
const QUEUE_SLACK: usize = 8;

/// The longest message the plan lets cross at the run's dims: anything a rank sends is a
/// tensor one of its stage's nodes made or one it received, so at most a stage's activations
/// plus what it receives per micro-batch, scaled where `--dim` grew a dim beyond the plan's
/// (a product of ratios, an over-estimate for tensors that grow in fewer dims) and by
/// `widening` (the plan counts declared bytes, the wire carries held ones: [`wire_widening`]),
/// doubled for the `.npy` framing and with a MiB for headers and names.
fn max_message(plan: &Plan, dims: &std::collections::BTreeMap<String, u64>, widening: u64) -> u64 {
    let largest = plan
        .stages
        .iter()
        .map(|s| s.activation_bytes.saturating_add(s.received_bytes))
        .max()
        .unwrap_or(0);
    let scale = plan
        .model
        .dims
        .iter()
        .fold(1u64, |scale, (name, &planned)| {
            let run = dims.get(name).copied().unwrap_or(planned);
            scale.saturating_mul(run.div_ceil(planned.max(1)).max(1))
        });
    largest
        .saturating_mul(scale)
        .saturating_mul(widening.max(1))
        .saturating_mul(2)
        .saturating_add(1 << 20)
}

/// The most times its declared size (what the plan counts) a tensor of one of `dtypes` takes
/// on the wire, which carries the `.npy` of the tensor the runtime holds: 4 for int16 and
/// uint16 (held as int64) and float8 (as f32), 2 for float16, 8 for float4, 1 for a model of
/// f32 and int64 only. One function, [`held_bytes`](crate::runtime::held_bytes), says what the
/// runtime holds for both, so the bound follows the runtime. Strings count as the plan counts
/// them.
pub(crate) fn wire_widening(dtypes: impl IntoIterator<Item = crate::graph::DType>) -> u64 {
    // Eight elements: a whole number of bytes in every packed type (float4 is half a byte).
    dtypes
        .into_iter()
        .filter(|&dtype| dtype != crate::graph::DType::String)
        .filter_map(|dtype| {
            let declared = dtype.bytes_for(8).filter(|&b| b > 0)?;
            Some(crate::runtime::held_bytes(dtype, 8)?.div_ceil(declared))
        })
        .max()
        .unwrap_or(1)
}

/// The dtypes of what may cross between ranks in `graph`: its inputs and what its nodes make
/// (weights never cross).
pub(crate) fn activation_dtypes(
    graph: &crate::graph::Graph,
) -> impl Iterator<Item = crate::graph::DType> + '_ {
    graph
        .tensors()
        .filter(|(_, t)| !matches!(t.origin, crate::graph::TensorOrigin::Parameter(_)))
        .filter_map(|(_, t)| t.dtype)
}

fn digest_from_hex(hex: &str) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(digest)
}

/// Joins the job over the transport asked for; `gpu` is the rank's GPU on `--backend cuda`.
fn connect(
    args: &DistributedArgs,
    launch: &Launch,
    gpu: Option<usize>,
    tcp: TcpJob,
) -> anyhow::Result<Box<dyn Transport>> {
    let kind = match args.transport {
        TransportKind::Auto if gpu.is_some() => TransportKind::Nccl,
        TransportKind::Auto if cfg!(feature = "mpi") && launch.by_mpi => TransportKind::Mpi,
        TransportKind::Auto => TransportKind::Tcp,
        chosen => chosen,
    };
    if kind == TransportKind::Mpi {
        return mpi_transport(launch);
    }
    let Some(rendezvous) = &launch.rendezvous else {
        bail!(
            "--transport {} needs MASTER_ADDR and MASTER_PORT (torchrun sets them; under {} \
             export them, e.g. the first node's address and a free port)",
            if kind == TransportKind::Nccl {
                "nccl"
            } else {
                "tcp"
            },
            launch.launcher
        );
    };
    if kind == TransportKind::Nccl {
        let Some(gpu) = gpu else {
            bail!("--transport nccl moves tensors between GPUs: it needs --backend cuda");
        };
        return nccl_transport(launch, rendezvous, gpu, tcp);
    }
    Ok(Box::new(TcpTransport::join(
        launch.rank,
        launch.world,
        rendezvous,
        tcp,
    )?))
}

#[cfg(feature = "cuda")]
fn nccl_transport(
    launch: &Launch,
    rendezvous: &Rendezvous,
    gpu: usize,
    tcp: TcpJob,
) -> anyhow::Result<Box<dyn Transport>> {
    use crate::runtime::distributed::nccl_transport::NcclTransport;
    Ok(Box::new(NcclTransport::join(
        launch.rank,
        launch.world,
        rendezvous,
        gpu,
        tcp,
    )?))
}

#[cfg(not(feature = "cuda"))]
fn nccl_transport(
    _launch: &Launch,
    _rendezvous: &Rendezvous,
    _gpu: usize,
    _tcp: TcpJob,
) -> anyhow::Result<Box<dyn Transport>> {
    bail!("this pipecut was built without CUDA support: rebuild with `cargo build --features cuda`")
}

#[cfg(feature = "mpi")]
fn mpi_transport(launch: &Launch) -> anyhow::Result<Box<dyn Transport>> {
    let transport = crate::runtime::distributed::mpi_transport::MpiTransport::init()?;
    if transport.rank() != launch.rank || transport.world() != launch.world {
        bail!(
            "MPI numbers this process rank {} of {}, but {} said rank {} of {}",
            transport.rank(),
            transport.world(),
            launch.launcher,
            launch.rank,
            launch.world
        );
    }
    Ok(Box::new(transport))
}

#[cfg(not(feature = "mpi"))]
fn mpi_transport(_launch: &Launch) -> anyhow::Result<Box<dyn Transport>> {
    bail!("this pipecut was built without MPI: rebuild with `cargo build --features mpi`, or use --transport tcp")
}

fn line(r: &RankReport) -> String {
    let f = &r.figures;
    let per = |secs: f64| 1e3 * secs / f.microbatches_done.max(1) as f64;
    let mut out = format!(
        "rank {} ({}stage {} of replica {}, {} over {}): {} micro-batch(es), busy {:.3} ms each \
         (predicted {:.3}), transfer {:.3} ms each (predicted {:.3}), bubble {:.0}%, {} B sent\n",
        f.rank,
        r.tp_rank
            .map_or(String::new(), |t| format!("TP rank {t} of ")),
        f.stage,
        f.replica,
        r.launcher,
        r.transport,
        f.microbatches_done,
        per(f.busy_secs),
        1e3 * r.predicted_busy_secs_per_microbatch,
        per(f.transfer_secs),
        1e3 * r.predicted_transfer_secs_per_microbatch,
        100.0 * f.bubble(),
        f.bytes_sent,
    );
    for (name, path) in &r.outputs {
        out.push_str(&format!("  output {name}: {path}\n"));
    }
    out
}
