//! The CUDA backend (cargo feature `cuda`), on cudarc with `dynamic-loading`: it builds without
//! the CUDA toolkit or a driver and looks for `libcuda`, `libnvrtc` and `libcublas` when an
//! executor is created.
//!
//! ```text
//! CudaExecutor::new ── NVRTC compiles kernels.cu per GPU architecture ──▶ loaded on each GPU
//!                      the stages use
//! prepare(stage)    ── device = stage index mod devices, own stream and cuBLAS handle,
//!                      the stage's float weights uploaded once
//! run(stage)        ── nodes in order on the stage's stream: float tensors and the masks device
//!                      ops make stay on the device, integer ones (shapes, indices) on the host
//!                      but for large broadcasts of them (`integers.rs`: a one-hot encoding);
//!                      a node the device ops do not take runs its CPU kernel on host copies
//!                      (counted); If, Loop and Scan run their bodies the same way, here
//!                      (`control_flow.rs`)
//! ```
//!
//! Stages implement the same [`Executor`] trait as the CPU backend (host tensors in and out, the
//! contract `profile` and embedding code use); `pipecut run` streams micro-batches through
//! [`CudaExecutor::run_resident_pipeline`] instead, where tensors cross stages on the device
//! (`resident.rs`), one thread per stage; several stages may share one GPU. Each GPU's memory
//! pool is sized from the plan ([`CudaExecutor::size_memory_pools`]).
//!
//! Files depend one way. At the bottom, what every device op works with: the values
//! (`value.rs`), the kernels' handles (`functions.rs`), the launch context and shared launches
//! (`gpu.rs`, `elementwise.rs`), how an op takes operands and gives results (`operands.rs`).
//! Above them the op families, one file each; `ops.rs` sends a node to its family; this module,
//! the executor, plans and runs the steps, and only `resident.rs` (its pipeline) reads it.

mod attention;
mod compile;
mod control_flow;
mod conv3d;
mod conv_fold;
mod deform_conv;
mod elementwise;
mod epilogue;
mod expanded;
mod fft;
mod flat;
mod functions;
mod fuse;
mod gpu;
mod grid_sample;
mod host_times;
mod index_ops;
mod integers;
mod layout_ops;
mod linalg;
mod losses;
mod masks;
mod mel_weights;
mod microsoft;
mod ml;
mod moments;
mod movement_ops;
mod ms_attention;
mod nbits;
mod operands;
mod ops;
mod quant;
mod random;
mod recurrent;
mod reductions;
mod resident;
mod resize;
mod roi_align;
mod row_ops;
mod spectral;
mod staging;
mod top_k;
mod value;
mod window_ops;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

pub use self::compile::{
    compile, compile_cached, image_for, kernel_resources, supported_archs, ImageKind, KernelImage,
    KernelResources, KERNEL_SOURCE,
};

use self::control_flow::Flow;
use self::functions::Functions;
use self::gpu::Gpu;
use self::operands::to_device;
use self::value::{DeviceTensor, Value};
use crate::kernels::{self, Ctx, Kernel};
use crate::steps::{plan_steps_with, store_outputs, Step};
use crate::tensor::{HostTensor, TensorData};
use crate::Error;
use crate::{Executor, StageSpec, Tensors, Weights};
use pipecut_ir::graph::{Graph, Node, NodeId, Subgraph, TensorId};

/// Whether the CUDA driver library can be loaded and how many devices it sees; `Err` says why
/// not, in words fit for a skipped test or an error message.
pub fn device_count() -> Result<usize, String> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver reports no device".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!("the CUDA driver cannot list devices: {e}")),
    }
}

/// Why cuBLAS cannot be used, or `None` when its library loads.
pub fn cublas_problem() -> Option<String> {
    // SAFETY: only tries to open the shared library.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        None
    } else {
        Some("no cuBLAS library (libcublas.so.12) on this machine: MatMul and Gemm need it".into())
    }
}

/// Compiles the kernels (no driver needed, only `libnvrtc`) and answers the names of the entry
/// points NVRTC produced: `pipecut devices` runs it.
pub fn check_kernels() -> Result<Vec<String>, Error> {
    let oldest = *supported_archs()?
        .first()
        .ok_or_else(|| Error::Cuda("NVRTC lists no architecture".into()))?;
    let ptx = compile_cached(ImageKind::Ptx(oldest))?;
    Ok(String::from_utf8_lossy(&ptx.bytes)
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix(".visible .entry ")?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect())
}

/// One GPU as `pipecut devices` reports it: the kernels are compiled for it and loaded on it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceReport {
    /// The driver's device number.
    pub ordinal: usize,
    /// Compute capability as `major.minor`.
    pub compute_capability: String,
    /// What was loaded (a CUBIN for its architecture, or PTX).
    pub kernels: Option<String>,
    /// Why the kernels cannot be loaded on it.
    pub problem: Option<String>,
}

/// Opens every GPU and loads the kernels on it, as a run would (empty without a driver).
pub fn device_reports() -> Vec<DeviceReport> {
    let Ok(count) = device_count() else {
        return Vec::new();
    };
    let mut images = ImageCache::default();
    (0..count)
        .map(|ordinal| match DeviceState::open(ordinal, &mut images) {
            Ok(state) => DeviceReport {
                ordinal,
                compute_capability: format!("{}.{}", state.arch / 10, state.arch % 10),
                kernels: Some(state.image.to_string()),
                problem: None,
            },
            Err((arch, e)) => DeviceReport {
                ordinal,
                compute_capability: arch.map_or("?".into(), |a| format!("{}.{}", a / 10, a % 10)),
                kernels: None,
                problem: Some(e.to_string()),
            },
        })
        .collect()
}

/// Kernel images compiled so far, by kind (devices of one architecture share one).
#[derive(Default)]
struct ImageCache {
    supported: Option<Vec<u32>>,
    images: Vec<KernelImage>,
}

impl ImageCache {
    fn for_arch(&mut self, arch: u32) -> Result<&KernelImage, Error> {
        if self.supported.is_none() {
            self.supported = Some(supported_archs()?);
        }
        let supported = self.supported.as_deref().unwrap_or_default();
        let kind = image_for(arch, supported).map_err(Error::Cuda)?;
        if let Some(i) = self.images.iter().position(|image| image.kind == kind) {
            return Ok(&self.images[i]);
        }
        self.images.push(compile_cached(kind)?);
        Ok(self.images.last().expect("just pushed"))
    }
}

/// One device's context and compiled kernels.
#[derive(Debug)]
struct DeviceState {
    /// The driver's device number (a rank's executor holds one GPU, whatever its number).
    ordinal: usize,
    context: Arc<CudaContext>,
    functions: Functions,
    /// Compute capability, major · 10 + minor.
    arch: u32,
    image: ImageKind,
}

impl DeviceState {
    /// Opens GPU `ordinal` and loads the kernels compiled for its architecture; the error
    /// comes with the architecture when it was read.
    fn open(ordinal: usize, images: &mut ImageCache) -> Result<DeviceState, (Option<u32>, Error)> {
        let fail = |e: String| (None, Error::Cuda(e));
        let context = CudaContext::new(ordinal)
            .map_err(|e| fail(format!("cannot open GPU {ordinal}: {e}")))?;
        // SAFETY: cudarc's event tracking orders a buffer's use across streams; here a buffer
        // is made and written on one stage's one stream, and a tensor crossing to another
        // stage is ordered explicitly (`resident.rs`: the reader waits for the writer's event,
        // the buffer's own stream waits for the reader before freeing it), so per-allocation
        // events would only cost two creations and a record per allocation.
        unsafe { context.disable_event_tracking() };
        let attribute = |a| {
            context
                .attribute(a)
                .map_err(|e| fail(format!("GPU {ordinal}: cannot read its architecture: {e}")))
        };
        let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let arch = (major * 10 + minor) as u32;
        let image = images.for_arch(arch).map_err(|e| (Some(arch), e))?;
        let module = context.load_module(image.to_ptx()).map_err(|e| {
            let e = format!(
                "cannot load the kernels ({}) on GPU {ordinal}: {e}",
                image.kind
            );
            (Some(arch), Error::Cuda(e))
        })?;
        let functions = Functions::load(&module).map_err(|e| (Some(arch), Error::Cuda(e)))?;
        Ok(DeviceState {
            ordinal,
            context,
            functions,
            arch,
            image: image.kind,
        })
    }
}

/// The CUDA backend over one graph and its weights.
pub struct CudaExecutor<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    devices: Vec<DeviceState>,
}

/// A stage prepared by [`CudaExecutor`]: its stream, cuBLAS handle and uploaded weights. It is
/// `Send` but not `Sync`: a cuBLAS handle must not be used by two threads at once, and the
/// pipeline gives each stage to one thread.
pub struct CudaStage {
    spec: StageSpec,
    steps: Vec<Step<StepKernel>>,
    device: usize,
    stream: Arc<CudaStream>,
    /// Dropped by hand: see `Drop`.
    blas: ManuallyDrop<CudaBlas>,
    /// cuBLAS's workspace (`give_cublas_a_workspace`), dropped after the handle.
    _blas_workspace: Option<CudaSlice<u8>>,
    /// Float weights as host values whose device copy is already made: device ops read the
    /// copy, and a host fallback or an op's host-side operand (Clip's bounds, Resize's scales)
    /// the host tensor, with no download.
    weights: HashMap<TensorId, Value>,
    weight_bytes: u64,
    host_runs: Mutex<BTreeMap<String, usize>>,
    /// The subgraphs of its flow ops, prepared when first run (by the address of the body).
    bodies: Mutex<HashMap<usize, Arc<Body>>>,
    /// MatMulNBits weights expanded on the device, kept for the run.
    expanded: expanded::ExpandedWeights,
    not_sync: PhantomData<Cell<()>>,
}

/// A step's kernel on this backend: a CPU tensor kernel (the device ops are tried first; the
/// kernel is the fallback), a flow op the executor runs itself, a Conv with the nodes after it
/// folded in (`conv_fold.rs`), or nodes fused into one device step when the stage was prepared
/// (`fuse.rs`).
#[derive(Debug, Clone)]
enum StepKernel {
    Tensor(Kernel),
    Flow(Flow),
    FoldedConv(Arc<conv_fold::DeviceFold>),
    Fused(Arc<fuse::Fused<StepKernel>>),
}

/// The steps of `spec`'s nodes; refuses an op that has neither a CPU tensor kernel nor a flow
/// op here (sequences), naming op and node.
fn plan_device_steps(graph: &Graph, spec: &StageSpec) -> Result<Vec<Step<StepKernel>>, Error> {
    plan_steps_with(graph, spec, |node| {
        if let Some(flow) = Flow::of(&node.domain, &node.op_type) {
            return Some(StepKernel::Flow(flow));
        }
        (!node.has_subgraphs())
            .then(|| kernels::lookup(&node.domain, &node.op_type))
            .flatten()
            .map(StepKernel::Tensor)
    })
}

/// A subgraph body ready to run on a stage: its steps, its weights and their device copies
/// (uploaded once, however many iterations read them).
struct Body {
    steps: Vec<Step<StepKernel>>,
    weights: Weights,
    uploaded: HashMap<TensorId, Value>,
}

/// Float weights uploaded to `stream`, as host values whose device copy is already made (device
/// ops read the copy, a host fallback the host tensor), and their bytes.
fn upload_weights(
    stream: &Arc<CudaStream>,
    graph: &Graph,
    weights: &Weights,
    ids: impl IntoIterator<Item = TensorId>,
) -> Result<(HashMap<TensorId, Value>, u64), String> {
    let mut uploaded = HashMap::new();
    let mut bytes = 0u64;
    for id in ids {
        let Some(host) = weights.get(id) else {
            continue;
        };
        if let TensorData::F32(values) = host.data() {
            if values.is_empty() {
                continue;
            }
            let data = stream.clone_htod(values).map_err(|e| {
                format!(
                    "cannot upload weight '{}' ({} bytes): {e}",
                    graph.tensor(id).name,
                    values.len() * 4
                )
            })?;
            bytes += values.len() as u64 * 4;
            let copy = OnceLock::from(DeviceTensor::new(host.shape().to_vec(), data));
            uploaded.insert(id, Value::Host(Arc::clone(host), Arc::new(copy)));
        }
    }
    Ok((uploaded, bytes))
}

/// The nodes a run goes through and what they read besides the values they make: the stage's
/// graph or a subgraph body, its weights (with their device copies), and the enclosing graphs'
/// values by name (a body's outer scope; nothing for a stage).
struct Frame<'f> {
    graph: &'f Graph,
    steps: &'f [Step<StepKernel>],
    weights: &'f Weights,
    uploaded: &'f HashMap<TensorId, Value>,
    outer: &'f dyn Fn(&str) -> Option<Value>,
}

/// Values of the tensors a run holds, by id.
type Env = HashMap<TensorId, Value>;

impl Frame<'_> {
    fn fetch(&self, env: &Env, id: TensorId) -> Option<Value> {
        env.get(&id)
            .cloned()
            .or_else(|| self.uploaded.get(&id).cloned())
            .or_else(|| self.weights.get(id).cloned().map(Value::host))
    }

    /// The values of `node`'s inputs, by position (`None` for an omitted optional one).
    fn args(&self, env: &Env, node: &Node) -> Result<Vec<Option<Value>>, String> {
        node.inputs
            .iter()
            .map(|slot| match slot {
                None => Ok(None),
                Some(id) => self.fetch(env, *id).map(Some).ok_or_else(|| {
                    format!("input '{}' is not available", self.graph.tensor(*id).name)
                }),
            })
            .collect()
    }
}

/// Runs `kernel` on host copies of `args` (a download for each device tensor) and answers host
/// values; `counted` records it among the stage's host runs of the node's op.
fn on_host_copies(
    stage: &CudaStage,
    ctx: &Ctx,
    args: &[Option<Value>],
    counted: bool,
    kernel: impl FnOnce(&[Option<&HostTensor>]) -> kernels::KernelResult,
) -> Result<Vec<Value>, String> {
    if counted {
        if let Ok(mut counts) = stage.host_runs.lock() {
            *counts.entry(ctx.node.op_type.clone()).or_default() += 1;
        }
    }
    let host: Vec<Option<Arc<HostTensor>>> = args
        .iter()
        .map(|a| a.as_ref().map(|v| v.to_host(&stage.stream)).transpose())
        .collect::<Result<_, String>>()?;
    let refs: Vec<Option<&HostTensor>> = host.iter().map(|a| a.as_deref()).collect();
    Ok(kernel(&refs)?
        .into_iter()
        .map(|t| Value::host(Arc::new(t)))
        .collect())
}

impl Drop for CudaStage {
    fn drop(&mut self) {
        // After a device fault (a sticky error: every later call fails) cuBLAS cannot tear its
        // handle down, and cudarc's drop of it panics, hiding the error the run reports. The
        // context is lost by then anyway, so the handle is left to the process's exit.
        if self.stream.synchronize().is_ok() {
            // SAFETY: dropped once, here, and never used after.
            unsafe { ManuallyDrop::drop(&mut self.blas) };
        }
    }
}

impl CudaStage {
    /// The stage's description.
    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }

    /// The device ordinal it runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes of weights uploaded to the device.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// How many times each op with a float operand ran its CPU kernel because no device op took
    /// it, over every run so far (ops on integer and boolean tensors only, like shape
    /// arithmetic, run on the host by design and are not counted).
    pub fn host_runs(&self) -> BTreeMap<String, usize> {
        self.host_runs.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl<'a> CudaExecutor<'a> {
    /// A backend for `graph` with its loaded `weights` on every visible GPU: compiles the
    /// kernels and loads them on each device (no compilation later).
    pub fn new(graph: &'a Graph, weights: &'a Weights) -> Result<CudaExecutor<'a>, Error> {
        Self::for_stages(graph, weights, usize::MAX)
    }

    /// [`CudaExecutor::new`] for a plan of `stages` stages: only the GPUs they run on are
    /// opened (stage `k` on GPU `k mod count` uses the first `stages` GPUs), so a busy or broken
    /// GPU the plan does not need neither fails the run nor gets a context.
    pub fn for_stages(
        graph: &'a Graph,
        weights: &'a Weights,
        stages: usize,
    ) -> Result<CudaExecutor<'a>, Error> {
        let count = device_count().map_err(Error::Cuda)?.min(stages.max(1));
        if let Some(why) = cublas_problem() {
            return Err(Error::Cuda(why));
        }
        let mut images = ImageCache::default();
        let devices = (0..count)
            .map(|ordinal| DeviceState::open(ordinal, &mut images).map_err(|(_, e)| e))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(CudaExecutor {
            graph,
            weights,
            devices,
        })
    }

    /// A backend whose every stage runs on GPU `ordinal` alone: a rank of a multi-process run
    /// (`run --distributed`) opens only the GPU its launcher's local rank names.
    pub fn on_device(
        graph: &'a Graph,
        weights: &'a Weights,
        ordinal: usize,
    ) -> Result<CudaExecutor<'a>, Error> {
        let count = device_count().map_err(Error::Cuda)?;
        if ordinal >= count {
            return Err(Error::Cuda(format!(
                "GPU {ordinal} was asked for, but the driver sees {count}"
            )));
        }
        if let Some(why) = cublas_problem() {
            return Err(Error::Cuda(why));
        }
        let state = DeviceState::open(ordinal, &mut ImageCache::default()).map_err(|(_, e)| e)?;
        Ok(CudaExecutor {
            graph,
            weights,
            devices: vec![state],
        })
    }

    /// Number of GPUs the stages are spread over (stage `k` on GPU `k mod count`).
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Sizes each GPU's memory pool from the plan: `stage_bytes[k]` is what stage `k` holds
    /// beyond its weights (the plan's peak less its parameters), and a GPU's pool keeps the sum
    /// over its stages between micro-batches rather than handing it back to the driver at each
    /// synchronisation (the release threshold's default, 0, frees it every time).
    pub fn size_memory_pools(&self, stage_bytes: &[u64]) -> Result<(), Error> {
        let mut per_device = vec![0u64; self.devices.len()];
        for (k, &bytes) in stage_bytes.iter().enumerate() {
            let d = k % per_device.len().max(1);
            per_device[d] = per_device[d].saturating_add(bytes);
        }
        for (ordinal, (state, bytes)) in self.devices.iter().zip(per_device).enumerate() {
            if !state.context.has_async_alloc() {
                continue;
            }
            let fail = |e: cudarc::driver::DriverError| {
                Error::Cuda(format!("GPU {ordinal}: cannot size its memory pool: {e}"))
            };
            state.context.bind_to_thread().map_err(fail)?;
            let mut pool = std::ptr::null_mut();
            let mut threshold = bytes;
            // SAFETY: `pool` receives the device's default pool, which the attribute call
            // reads; the threshold is a u64, as CU_MEMPOOL_ATTR_RELEASE_THRESHOLD takes.
            unsafe {
                use cudarc::driver::sys;
                sys::cuDeviceGetDefaultMemPool(&mut pool, state.context.cu_device())
                    .result()
                    .map_err(fail)?;
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
                .result()
                .map_err(fail)?;
            }
        }
        Ok(())
    }

    fn stage_error(stage: usize, detail: String) -> Error {
        Error::Cuda(format!("stage {stage}: {detail}"))
    }
}

/// The ops whose device kernels call cuBLAS (`Gpu::gemm`, `gemm_views`, `conv_gemm_views`):
/// `ops.rs` (MatMul, Gemm), `window_ops.rs` (Conv, ConvTranspose), `attention.rs` and
/// `ms_attention.rs` (Attention in both domains), `recurrent.rs` (RNN, GRU, LSTM), `nbits.rs`
/// (MatMulNBits), `layout_ops.rs` (AffineGrid). Fused steps multiply only where a MatMul was.
/// `every_kernel_calling_cublas_is_in_the_gate` checks the list against those sources.
const CUBLAS_OPS: [&str; 10] = [
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "Attention",
    "RNN",
    "GRU",
    "LSTM",
    "MatMulNBits",
    "AffineGrid",
];

/// Whether `node` may call cuBLAS: its own kernel does, or a node in one of its subgraphs (an
/// `If` branch, a `Loop` or `Scan` body), at any depth. The stage's cuBLAS set-up (workspace,
/// TF32, warm-up) hangs on this: gated on four op names, Attention, the RNNs, MatMulNBits and
/// products inside control flow ran without them.
fn calls_cublas(node: &pipecut_ir::graph::Node) -> bool {
    use pipecut_ir::graph::Attribute;
    let in_body =
        |body: &pipecut_ir::graph::Subgraph| body.body.nodes().any(|(_, n)| calls_cublas(n));
    CUBLAS_OPS.contains(&node.op_type.as_str())
        || node.attributes.values().any(|a| match a {
            Attribute::Graph(body) => in_body(body),
            Attribute::Graphs(bodies) => bodies.iter().any(in_body),
            _ => false,
        })
}

/// A workspace of our own for the stage's cuBLAS handle, as NVIDIA recommends for Hopper
/// (32 MiB; 4 MiB before it): without one, cuBLAS takes its workspace from its own pool.
/// `PIPECUT_CUBLAS_WORKSPACE=0` leaves cuBLAS its own (to compare on a GPU; on the H200s of
/// docs/benchmarks.md the difference was within the run-to-run spread).
fn give_cublas_a_workspace(
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
) -> Result<Option<CudaSlice<u8>>, String> {
    use cudarc::driver::DevicePtr;
    if std::env::var("PIPECUT_CUBLAS_WORKSPACE").is_ok_and(|v| v == "0") {
        return Ok(None);
    }
    let major = stream
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| e.to_string())?;
    let bytes = if major >= 9 { 32 << 20 } else { 4 << 20 };
    let workspace = stream.alloc_zeros::<u8>(bytes).map_err(|e| e.to_string())?;
    {
        let (pointer, _guard) = workspace.device_ptr(stream);
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        // SAFETY: the handle is live and the buffer outlives it (dropped after it in the stage).
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                pointer as *mut std::ffi::c_void,
                bytes,
            )
        }
        .result()
        .map_err(|e| format!("{e:?}"))?;
    }
    Ok(Some(workspace))
}

/// `PIPECUT_CUDA_TF32=on` lets cuBLAS multiply every product of the stage in TF32 on tensor
/// cores (`gpu::Tf32`).
fn allow_tf32_if_asked(stream: &Arc<CudaStream>, blas: &CudaBlas) -> Result<(), String> {
    if gpu::tf32() != gpu::Tf32::On {
        return Ok(());
    }
    gpu::set_math_mode(
        stream,
        blas,
        cudarc::cublas::sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
    )
}

/// One 8 × 8 product on `blas`, waited for. A process's first cuBLAS product costs 70–120 ms
/// on an H200 (the library loading its kernels: `benches/gpu/cold_start.sh`), which would
/// otherwise land in the first micro-batch of the first stage that multiplies and make the
/// pipeline's start look like a slow stage.
fn warm_up_cublas(stream: &Arc<CudaStream>, blas: &CudaBlas) -> Result<(), String> {
    use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    const N: i32 = 8;
    let a = stream
        .alloc_zeros::<f32>((N * N) as usize)
        .map_err(|e| e.to_string())?;
    let mut c = stream
        .alloc_zeros::<f32>((N * N) as usize)
        .map_err(|e| e.to_string())?;
    let config = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: N,
        n: N,
        k: N,
        alpha: 1.0f32,
        lda: N,
        ldb: N,
        beta: 0.0,
        ldc: N,
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| e.to_string())?;
    // SAFETY: three 8 × 8 matrices, as `config` says.
    unsafe { blas.gemm(config, &a, &a, &mut c) }.map_err(|e| format!("{e:?}"))?;
    stream.synchronize().map_err(|e| e.to_string())
}

impl Executor for CudaExecutor<'_> {
    type Stage = CudaStage;

    fn prepare(&self, spec: &StageSpec) -> Result<CudaStage, Error> {
        let graph = self.graph;
        let device = spec.index % self.devices.len();
        let state = &self.devices[device];
        let stream = state
            .context
            .new_stream()
            .map_err(|e| Self::stage_error(spec.index, format!("cannot create a stream: {e}")))?;
        // `devices` and `new` checked the library is there, so this does not panic.
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| {
            Self::stage_error(spec.index, format!("cannot create a cuBLAS handle: {e:?}"))
        })?;
        let multiplies = spec.nodes.iter().any(|&n| calls_cublas(graph.node(n)));
        let blas_workspace = if multiplies {
            let workspace = give_cublas_a_workspace(&stream, &blas)
                .map_err(|e| Self::stage_error(spec.index, format!("cuBLAS workspace: {e}")))?;
            allow_tf32_if_asked(&stream, &blas).map_err(|e| Self::stage_error(spec.index, e))?;
            warm_up_cublas(&stream, &blas)
                .map_err(|e| Self::stage_error(spec.index, format!("cuBLAS warm-up: {e}")))?;
            workspace
        } else {
            None
        };
        let mut steps = plan_device_steps(graph, spec)?;
        if conv_fold::enabled() {
            steps = crate::fuse::fold_conv_chains(graph, self.weights, spec, steps, |f| {
                StepKernel::FoldedConv(Arc::new(conv_fold::DeviceFold::new(f)))
            });
        }
        // After the folds: a node a fold took is no step, so no fusion takes it too.
        if fuse::enabled() {
            let is_tensor_kernel = |k: &StepKernel| matches!(k, StepKernel::Tensor(_));
            steps = fuse::fuse_steps(
                graph,
                self.weights,
                spec,
                steps,
                is_tensor_kernel,
                StepKernel::Fused,
            );
        }
        let mut read_weights: Vec<TensorId> = spec
            .nodes
            .iter()
            .flat_map(|&n| {
                // A subgraph's reads of the stage's weights are the node's captures.
                let node = graph.node(n);
                node.inputs.iter().flatten().chain(&node.captures).copied()
            })
            .filter(|&t| graph.tensor(t).param().is_some())
            .collect();
        // Float weights go to the device once; integer ones (shapes, indices) stay on the host.
        read_weights.sort();
        read_weights.dedup();
        let (weights, weight_bytes) = upload_weights(&stream, graph, self.weights, read_weights)
            .map_err(|e| Self::stage_error(spec.index, e))?;
        Ok(CudaStage {
            spec: spec.clone(),
            steps,
            device,
            stream,
            blas: ManuallyDrop::new(blas),
            _blas_workspace: blas_workspace,
            weights,
            weight_bytes,
            host_runs: Mutex::new(BTreeMap::new()),
            bodies: Mutex::new(HashMap::new()),
            expanded: expanded::ExpandedWeights::default(),
            not_sync: PhantomData,
        })
    }

    fn run(&self, stage: &CudaStage, inputs: &Tensors) -> Result<Tensors, Error> {
        self.run_nodes(stage, inputs, None)
    }
}

impl crate::NodeTimer for CudaExecutor<'_> {
    const BACKEND: &'static str = "pipecut-cuda";

    /// Runs the stage with each node timed to the end of its device work (the stream is
    /// synchronised after every node, which a plain run does not do).
    fn run_observed(
        &self,
        stage: &CudaStage,
        inputs: &Tensors,
        observe: &mut dyn FnMut(pipecut_ir::graph::NodeId, f64, u64),
    ) -> Result<Tensors, Error> {
        self.run_nodes(stage, inputs, Some(observe))
    }
}

impl CudaExecutor<'_> {
    /// Runs the stage on host tensors and answers host tensors, its stream synchronised; with
    /// `observe`, times each node (see `run_observed`).
    fn run_nodes(
        &self,
        stage: &CudaStage,
        inputs: &Tensors,
        observe: Option<&mut dyn FnMut(pipecut_ir::graph::NodeId, f64, u64)>,
    ) -> Result<Tensors, Error> {
        let index = stage.spec.index;
        let values = inputs
            .iter()
            .map(|(name, t)| (name.clone(), Value::host(Arc::clone(t))))
            .collect();
        let mut sends = Tensors::new();
        for (name, value) in self.run_values(stage, &values, observe)? {
            let host = value
                .to_host(&stage.stream)
                .map_err(|e| Self::stage_error(index, e))?;
            sends.insert(name, host);
        }
        stage
            .stream
            .synchronize()
            .map_err(|e| Self::stage_error(index, format!("stream failed: {e}")))?;
        Ok(sends)
    }

    /// Runs the stage's nodes in order on its stream, from the values it receives (by name) to
    /// the values it sends, wherever they are: nothing waits for the device here. A host value
    /// is sent without its device copy, which belongs to this stage's stream.
    fn run_values(
        &self,
        stage: &CudaStage,
        inputs: &BTreeMap<String, Value>,
        observe: Option<&mut dyn FnMut(NodeId, f64, u64)>,
    ) -> Result<BTreeMap<String, Value>, Error> {
        let graph = self.graph;
        let index = stage.spec.index;
        let gpu = Gpu {
            stream: &stage.stream,
            blas: &stage.blas,
            functions: &self.devices[stage.device].functions,
            expanded: &stage.expanded,
        };
        host_times::hold(&stage.stream);
        let mut env = Env::new();
        for &id in &stage.spec.receives {
            let name = &graph.tensor(id).name;
            if graph.tensor(id).param().is_some() {
                continue;
            }
            let value = inputs.get(name).ok_or_else(|| {
                Error::RunInput(format!(
                    "stage {index} needs tensor '{name}', which was not given"
                ))
            })?;
            env.insert(id, value.clone());
        }
        let frame = Frame {
            graph,
            steps: &stage.steps,
            weights: self.weights,
            uploaded: &stage.weights,
            outer: &|_| None,
        };
        let env = self.execute(stage, &gpu, &frame, env, observe)?;
        let mut sends = BTreeMap::new();
        for &id in &stage.spec.sends {
            let name = graph.tensor(id).name.clone();
            let value = frame.fetch(&env, id).ok_or_else(|| {
                Error::RunInput(format!(
                    "stage {index} should send '{name}' but does not have it"
                ))
            })?;
            let value = match value {
                Value::Host(t, _) => Value::host(t),
                Value::Optional(_) => {
                    return Err(Error::RunInput(format!(
                        "'{name}' is an optional: stages exchange tensors only (run a model \
                         with sequences or optionals whole, on the CPU)"
                    )))
                }
                device => device,
            };
            sends.insert(name, value);
        }
        Ok(sends)
    }

    /// Runs `frame`'s steps in order on the stage's stream over `env`, answering the values
    /// left. A node the device ops do not take runs its CPU kernel on host copies (counted in
    /// the stage's host runs, inside subgraphs too); a flow op runs its subgraphs here.
    fn execute(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        frame: &Frame,
        mut env: Env,
        mut observe: Option<&mut dyn FnMut(NodeId, f64, u64)>,
    ) -> Result<Env, Error> {
        let index = stage.spec.index;
        for step in frame.steps {
            if let StepKernel::Fused(fused) = &step.kernel {
                env = self.run_fused_observed(stage, gpu, frame, env, step, fused, &mut observe)?;
                continue;
            }
            let node = frame.graph.node(step.node);
            let kernel_error = |detail: String| Error::Kernel {
                node: node.name.clone(),
                op: node.op_type.clone(),
                detail: format!(
                    "stage {index} on GPU {}: {detail}",
                    self.devices[stage.device].ordinal
                ),
            };
            let args = frame.args(&env, node).map_err(kernel_error)?;
            let ctx = Ctx {
                node,
                opset: step.opset,
                output_dtypes: &step.output_dtypes,
                input_dtypes: &step.input_dtypes,
            };
            let began = std::time::Instant::now();
            let device_start = host_times::mark(&stage.stream);
            let results = self
                .run_step(stage, gpu, frame, &env, step, &ctx, &args)
                .map_err(kernel_error)?;
            host_times::timed(host_times::Part::Release, || drop(args));
            if let Some(observe) = observe.as_mut() {
                stage
                    .stream
                    .synchronize()
                    .map_err(|e| kernel_error(format!("stream failed: {e}")))?;
                let bytes = results.iter().map(Value::byte_len).sum();
                observe(step.node, began.elapsed().as_secs_f64(), bytes);
                if let StepKernel::FoldedConv(fold) = &step.kernel {
                    // As on the CPU: the Conv's time covers the nodes folded into it.
                    for &folded in &fold.fold.folded {
                        observe(folded, 0.0, bytes);
                    }
                }
            }
            let output_slots = match &step.kernel {
                StepKernel::FoldedConv(fold) => &fold.fold.output[..],
                _ => &node.outputs[..],
            };
            store_outputs(&mut env, output_slots, results).map_err(kernel_error)?;
            host_times::timed(host_times::Part::Release, || {
                for t in &step.frees {
                    env.remove(t);
                }
            });
            if host_times::enabled() {
                host_times::span(&node.op_type, device_start, &stage.stream);
                host_times::node(&node.op_type, began);
            }
        }
        Ok(env)
    }

    /// One step's kernel on its arguments: a flow op (its subgraphs in the scope of `env`, then
    /// the frame's outer scope), a node on tensors, or a Conv with nodes folded in.
    #[allow(clippy::too_many_arguments)]
    fn run_step(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        frame: &Frame,
        env: &Env,
        step: &Step<StepKernel>,
        ctx: &Ctx,
        args: &[Option<Value>],
    ) -> Result<Vec<Value>, String> {
        match &step.kernel {
            StepKernel::Flow(flow) => {
                let scope = |name: &str| {
                    frame
                        .graph
                        .tensor_id(name)
                        .and_then(|id| frame.fetch(env, id))
                        .or_else(|| (frame.outer)(name))
                };
                let run_body = |sub: &Subgraph, formals: &[Value]| {
                    self.run_body(stage, gpu, sub, formals, &scope)
                        .map_err(|e| format!("in subgraph '{}': {e}", sub.name))
                };
                flow.run(gpu, ctx, args, &run_body)
            }
            &StepKernel::Tensor(kernel) => self.run_tensor_node(stage, gpu, ctx, kernel, args),
            StepKernel::FoldedConv(fold) => self.run_folded_conv(stage, gpu, ctx, fold, args),
            // Fused steps run before this (`run_fused`).
            StepKernel::Fused(_) => Err("a fused step taken as one node".into()),
        }
    }

    /// [`CudaExecutor::run_fused`] timed for `PIPECUT_CUDA_HOST_TIMES` and, when `observe` is
    /// given, waited for and reported to it as the step's node.
    #[allow(clippy::too_many_arguments)]
    fn run_fused_observed(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        frame: &Frame,
        env: Env,
        step: &Step<StepKernel>,
        fused: &fuse::Fused<StepKernel>,
        observe: &mut Option<&mut dyn FnMut(NodeId, f64, u64)>,
    ) -> Result<Env, Error> {
        let began = std::time::Instant::now();
        let device_start = host_times::mark(&stage.stream);
        let env = self.run_fused(stage, gpu, frame, env, step, fused)?;
        if host_times::enabled() {
            host_times::span(fused.fusion.name(), device_start, &stage.stream);
        }
        if let Some(observe) = observe.as_mut() {
            stage
                .stream
                .synchronize()
                .map_err(|e| Self::stage_error(stage.spec.index, format!("stream failed: {e}")))?;
            let bytes = env.get(&fused.output).map_or(0, Value::byte_len);
            observe(step.node, began.elapsed().as_secs_f64(), bytes);
        }
        Ok(env)
    }

    /// A fused step (`fuse.rs`): its kernel on the device, or, when its inputs do not fit it,
    /// the steps it replaced one by one; answers `env` with its output and its frees done.
    fn run_fused(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        frame: &Frame,
        mut env: Env,
        step: &Step<StepKernel>,
        fused: &fuse::Fused<StepKernel>,
    ) -> Result<Env, Error> {
        let began = std::time::Instant::now();
        let fail = |detail: String| {
            let node = frame.graph.node(step.node);
            Error::Kernel {
                node: node.name.clone(),
                op: fused.fusion.name().into(),
                detail: format!("stage {}: {detail}", stage.spec.index),
            }
        };
        let mut inputs = Vec::new();
        for id in fused.fusion.inputs() {
            let value = frame.fetch(&env, id).ok_or_else(|| {
                fail(format!(
                    "input '{}' is not available",
                    frame.graph.tensor(id).name
                ))
            })?;
            match to_device(gpu, &value).map_err(&fail)? {
                Some(t) => inputs.push(t),
                None => break,
            }
        }
        let all_on_device = inputs.len() == fused.fusion.inputs().len();
        let made = if all_on_device {
            fuse::run(gpu, &fused.fusion, &inputs).map_err(&fail)?
        } else {
            None
        };
        drop(inputs);
        match made {
            Some(out) => {
                env.insert(fused.output, Value::Device(out));
            }
            None => {
                let unfused = Frame {
                    steps: &fused.steps,
                    ..*frame
                };
                env = self.execute(stage, gpu, &unfused, env, None)?;
            }
        }
        for t in &step.frees {
            env.remove(t);
        }
        if host_times::enabled() {
            host_times::node(fused.fusion.name(), began);
        }
        Ok(env)
    }

    /// One node on tensors: its device op, or else its CPU `kernel` on host copies.
    fn run_tensor_node(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        ctx: &Ctx,
        kernel: Kernel,
        args: &[Option<Value>],
    ) -> Result<Vec<Value>, String> {
        if args
            .iter()
            .flatten()
            .any(|a| matches!(a, Value::Optional(_)))
        {
            // Identity passes an optional on, as the CPU runtime's kernel on values does.
            return match (ctx.node.op_type.as_str(), args) {
                ("Identity", [Some(v)]) => Ok(vec![v.clone()]),
                _ => Err("it takes tensors, and an input is an optional".into()),
            };
        }
        if let Some(results) = ops::run(gpu, ctx, args)? {
            return Ok(results);
        }
        // Host-only integer work (shape arithmetic, indices) is by design; what is counted is
        // a float op no device op took: its float operands (on the device, or graph inputs and
        // constants on the host) are computed on the CPU.
        let floats = args.iter().flatten().any(Value::is_float);
        on_host_copies(stage, ctx, args, floats, |refs| {
            kernels::call(kernel, ctx, refs)
        })
    }

    /// A Conv with nodes folded in: on the device, or else the CPU's folded kernel on host
    /// copies (counted as a host run of the Conv).
    fn run_folded_conv(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        ctx: &Ctx,
        fold: &conv_fold::DeviceFold,
        args: &[Option<Value>],
    ) -> Result<Vec<Value>, String> {
        if let Some(results) = conv_fold::run(gpu, ctx, args, fold)? {
            return Ok(results);
        }
        on_host_copies(stage, ctx, args, true, |refs| {
            kernels::conv_then(ctx, refs, &fold.fold.epilogue)
        })
    }

    /// Runs a subgraph of a flow node on its declared inputs (`formals`), on the stage's
    /// stream; the outer tensors it reads come from `scope`, wherever they are.
    fn run_body(
        &self,
        stage: &CudaStage,
        gpu: &Gpu,
        sub: &Subgraph,
        formals: &[Value],
        scope: &dyn Fn(&str) -> Option<Value>,
    ) -> Result<Vec<Value>, Error> {
        if formals.len() != sub.formal_inputs {
            return Err(Error::RunInput(format!(
                "it declares {} inputs, the node gives it {}",
                sub.formal_inputs,
                formals.len()
            )));
        }
        let graph = &*sub.body;
        let body = self.prepared_body(stage, sub)?;
        let mut env = Env::new();
        for (i, &id) in graph.inputs().iter().enumerate() {
            let name = &graph.tensor(id).name;
            let value = match formals.get(i) {
                Some(v) => v.clone(),
                None => scope(name).ok_or_else(|| {
                    Error::RunInput(format!("it reads '{name}', which is not available"))
                })?,
            };
            env.insert(id, value);
        }
        let frame = Frame {
            graph,
            steps: &body.steps,
            weights: &body.weights,
            uploaded: &body.uploaded,
            outer: scope,
        };
        let env = self.execute(stage, gpu, &frame, env, None)?;
        graph
            .outputs()
            .iter()
            .map(|&id| {
                frame.fetch(&env, id).ok_or_else(|| {
                    Error::RunInput(format!("it did not make '{}'", graph.tensor(id).name))
                })
            })
            .collect()
    }

    /// `sub`'s body prepared for `stage`: planned, and its float weights uploaded, when first
    /// run; every later iteration and micro-batch reuses it.
    fn prepared_body(&self, stage: &CudaStage, sub: &Subgraph) -> Result<Arc<Body>, Error> {
        let key = Arc::as_ptr(&sub.body) as usize;
        let mut bodies = stage
            .bodies
            .lock()
            .map_err(|_| Error::Cuda("a subgraph's preparation failed earlier".into()))?;
        if let Some(body) = bodies.get(&key) {
            return Ok(Arc::clone(body));
        }
        let graph = &*sub.body;
        let weights = self.weights.for_subgraph(graph)?;
        let spec = StageSpec {
            index: stage.spec.index,
            nodes: graph.topological_order().to_vec(),
            receives: graph.inputs().to_vec(),
            sends: graph.outputs().to_vec(),
        };
        let steps = plan_device_steps(graph, &spec)?;
        let params: Vec<TensorId> = graph.parameters().map(|(id, _)| id).collect();
        let (uploaded, _) = upload_weights(&stage.stream, graph, &weights, params)
            .map_err(|e| Self::stage_error(stage.spec.index, e))?;
        let body = Arc::new(Body {
            steps,
            weights,
            uploaded,
        });
        bodies.insert(key, Arc::clone(&body));
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `IS_SYNC` is the inherent constant when `T: Sync` and the trait's otherwise: a probe that
    /// compiles either way, so a stage that became `Sync` again fails here rather than nowhere.
    struct Probe<T>(PhantomData<T>);
    trait NotSync {
        const IS_SYNC: bool = false;
    }
    impl<T> NotSync for Probe<T> {}
    impl<T: Sync> Probe<T> {
        #[allow(dead_code)]
        const IS_SYNC: bool = true;
    }

    /// The CUDA sources that multiply through cuBLAS, and the ops they serve, all in
    /// [`CUBLAS_OPS`]; a file here that stops calling `gemm` fails, so the list is kept honest.
    #[test]
    fn every_kernel_calling_cublas_is_in_the_gate() {
        let sources = [
            ("ops.rs", include_str!("ops.rs"), &["MatMul", "Gemm"][..]),
            (
                "window_ops.rs",
                include_str!("window_ops.rs"),
                &["Conv", "ConvTranspose"],
            ),
            ("attention.rs", include_str!("attention.rs"), &["Attention"]),
            (
                "ms_attention.rs",
                include_str!("ms_attention.rs"),
                &["Attention"],
            ),
            (
                "recurrent.rs",
                include_str!("recurrent.rs"),
                &["RNN", "GRU", "LSTM"],
            ),
            ("nbits.rs", include_str!("nbits.rs"), &["MatMulNBits"]),
            (
                "layout_ops.rs",
                include_str!("layout_ops.rs"),
                &["AffineGrid"],
            ),
            ("fuse.rs", include_str!("fuse.rs"), &["MatMul"]),
        ];
        for (file, text, ops) in sources {
            assert!(
                text.contains("gemm"),
                "{file} no longer calls cuBLAS: update the gate"
            );
            for op in ops {
                assert!(CUBLAS_OPS.contains(op), "{op} ({file}) calls cuBLAS");
            }
        }
    }

    /// The gate looks into subgraphs at any depth and knows the products beyond MatMul, Gemm
    /// and Conv.
    #[test]
    fn cublas_set_up_follows_attention_rnns_nbits_and_control_flow_bodies() {
        use pipecut_ir::graph::{Attribute, Graph, NodeSpec, Subgraph};
        let node = |op: &str, attributes: Vec<(&str, Attribute)>| {
            let mut node = crate::kernels::test_util::node(op, attributes);
            node.domain = String::new();
            node
        };
        for op in [
            "Attention",
            "LSTM",
            "GRU",
            "RNN",
            "MatMulNBits",
            "MatMul",
            "Conv",
        ] {
            assert!(calls_cublas(&node(op, vec![])), "{op}");
        }
        assert!(!calls_cublas(&node("Relu", vec![])));
        let body = |op: &str| {
            let mut b = Graph::builder("body");
            b.input("a", None, None).unwrap();
            b.input("b", None, None).unwrap();
            b.node(NodeSpec::new("inner", op, &["a", "b"], &["c"]))
                .unwrap();
            b.output("c");
            Subgraph {
                name: "body".into(),
                node_count: 1,
                outputs: Vec::new(),
                body: Arc::new(b.build_subgraph().unwrap()),
                formal_inputs: 0,
            }
        };
        let branch = |op: &str| {
            node(
                "If",
                vec![
                    ("then_branch", Attribute::Graph(body(op))),
                    ("else_branch", Attribute::Graph(body("Add"))),
                ],
            )
        };
        assert!(calls_cublas(&branch("MatMul")));
        assert!(!calls_cublas(&branch("Mul")));
        let nested = node(
            "Loop",
            vec![("body", Attribute::Graphs(vec![body("Gemm")]))],
        );
        assert!(calls_cublas(&nested));
    }

    #[test]
    fn a_stage_moves_to_its_thread_but_is_not_shared_between_threads() {
        fn sendable<T: Send>() {}
        sendable::<CudaStage>();
        const { assert!(!Probe::<CudaStage>::IS_SYNC) };
        // The probe tells Sync types apart.
        const { assert!(Probe::<DeviceState>::IS_SYNC) };
    }
}
