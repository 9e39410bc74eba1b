//! The CUDA backend (cargo feature `cuda`), on cudarc with `dynamic-loading`: it builds without
//! the CUDA toolkit or a driver and looks for `libcuda`, `libnvrtc` and `libcublas` when an
//! executor is created.
//!
//! ```text
//! CudaExecutor::new ── NVRTC compiles kernels.cu once ──▶ module loaded on every device
//! prepare(stage)    ── device = stage index mod devices, own stream and cuBLAS handle,
//!                      the stage's float weights uploaded once
//! run(stage)        ── nodes in order on the stage's stream: float tensors stay on the device,
//!                      integer and boolean ones (shapes, indices, masks) on the host; a node the
//!                      device ops do not take runs its CPU kernel on host copies (counted)
//! ```
//!
//! Stages implement the same [`Executor`] trait as the CPU backend, so [`super::run_pipeline`]
//! streams micro-batches through them, one thread per stage; several stages may share one GPU.
//! Tensors cross stages through host memory (the trait's contract). Not built yet: transfers
//! between devices without the host, a stage-sized memory pool, NCCL for several processes
//! (see `docs/cuda.md`).

mod ops;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use self::ops::{Functions, Gpu};
use super::cpu::{plan_steps, Step};
use super::kernels::Ctx;
use super::tensor::{HostTensor, TensorData};
use super::{Executor, StageSpec, Tensors, Weights};
use crate::graph::{Graph, TensorId};
use crate::Error;

/// The kernels' CUDA C source.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

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

/// Compiles the kernels with NVRTC (no driver needed, only `libnvrtc`). Architecture-neutral
/// PTX, JIT-compiled by the driver for the GPU it loads on.
pub fn compile_kernels() -> Result<Ptx, Error> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Cuda(
            "NVRTC (libnvrtc.so) is not installed: it compiles pipecut's CUDA kernels".into(),
        ));
    }
    let options = CompileOptions {
        name: Some("pipecut_kernels.cu".into()),
        ..CompileOptions::default()
    };
    compile_ptx_with_opts(KERNEL_SOURCE, options).map_err(|e| {
        let detail = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().trim().to_string(),
            other => format!("{other:?}"),
        };
        Error::Cuda(format!("NVRTC failed to compile the kernels: {detail}"))
    })
}

/// Compiles the kernels and answers the names of the entry points NVRTC produced (a check that
/// needs no GPU: `pipecut devices` runs it).
pub fn check_kernels() -> Result<Vec<String>, Error> {
    let ptx = compile_kernels()?.to_src();
    Ok(ptx
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix(".visible .entry ")?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect())
}

/// A float tensor in device memory. The buffer is shared, so reshapes and identities are free.
#[derive(Debug, Clone)]
pub(crate) struct DeviceTensor {
    shape: Vec<usize>,
    data: Arc<CudaSlice<f32>>,
}

impl DeviceTensor {
    fn new(shape: Vec<usize>, data: CudaSlice<f32>) -> DeviceTensor {
        DeviceTensor {
            shape,
            data: Arc::new(data),
        }
    }
}

/// A value during a stage's run: where it was made.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Host(Arc<HostTensor>),
    Device(DeviceTensor),
}

impl Value {
    fn shape(&self) -> &[usize] {
        match self {
            Value::Host(t) => t.shape(),
            Value::Device(t) => &t.shape,
        }
    }

    /// The device form of a float value (uploaded from the host when needed); `None` for other
    /// dtypes, which stay on the host.
    fn to_device(&self, gpu: &Gpu) -> Result<Option<DeviceTensor>, String> {
        match self {
            Value::Device(t) => Ok(Some(t.clone())),
            Value::Host(t) => match t.data() {
                TensorData::F32(v) if !v.is_empty() => {
                    let data = gpu
                        .stream
                        .clone_htod(v)
                        .map_err(|e| format!("CUDA host-to-device copy: {e}"))?;
                    Ok(Some(DeviceTensor::new(t.shape().to_vec(), data)))
                }
                _ => Ok(None),
            },
        }
    }

    /// The host form (downloaded from the device when needed; waits for the stream).
    fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Arc<HostTensor>, String> {
        match self {
            Value::Host(t) => Ok(Arc::clone(t)),
            Value::Device(t) => {
                let values = stream
                    .clone_dtoh(&*t.data)
                    .map_err(|e| format!("CUDA device-to-host copy: {e}"))?;
                Ok(Arc::new(HostTensor::new(
                    t.shape.clone(),
                    TensorData::F32(values),
                )?))
            }
        }
    }
}

/// One device's context and compiled kernels.
#[derive(Debug)]
struct DeviceState {
    context: Arc<CudaContext>,
    functions: Functions,
}

/// The CUDA backend over one graph and its weights.
pub struct CudaExecutor<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    devices: Vec<DeviceState>,
}

/// A stage prepared by [`CudaExecutor`]: its stream, cuBLAS handle and uploaded weights.
pub struct CudaStage {
    spec: StageSpec,
    steps: Vec<Step>,
    device: usize,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    weights: HashMap<TensorId, DeviceTensor>,
    weight_bytes: u64,
    host_runs: Mutex<BTreeMap<String, usize>>,
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

    /// How many times each op copied device tensors to the host to run its CPU kernel, over
    /// every run so far (ops that only ever see host tensors, like shape arithmetic, are not
    /// counted).
    pub fn host_runs(&self) -> BTreeMap<String, usize> {
        self.host_runs.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl<'a> CudaExecutor<'a> {
    /// A backend for `graph` with its loaded `weights` on every visible GPU: compiles the
    /// kernels and loads them on each device (no compilation later).
    pub fn new(graph: &'a Graph, weights: &'a Weights) -> Result<CudaExecutor<'a>, Error> {
        let count = device_count().map_err(Error::Cuda)?;
        let ptx = compile_kernels()?;
        let devices = (0..count)
            .map(|ordinal| {
                let context = CudaContext::new(ordinal)
                    .map_err(|e| Error::Cuda(format!("cannot open GPU {ordinal}: {e}")))?;
                let module = context.load_module(ptx.clone()).map_err(|e| {
                    Error::Cuda(format!("cannot load the kernels on GPU {ordinal}: {e}"))
                })?;
                let functions = Functions::load(&module).map_err(Error::Cuda)?;
                Ok(DeviceState { context, functions })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(CudaExecutor {
            graph,
            weights,
            devices,
        })
    }

    /// Number of GPUs the stages are spread over (stage `k` on GPU `k mod count`).
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn stage_error(stage: usize, detail: String) -> Error {
        Error::Cuda(format!("stage {stage}: {detail}"))
    }
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
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| {
            Self::stage_error(spec.index, format!("cannot create a cuBLAS handle: {e:?}"))
        })?;
        let steps = plan_steps(graph, spec)?;
        let mut read_weights: Vec<TensorId> = spec
            .nodes
            .iter()
            .flat_map(|&n| graph.node(n).inputs.iter().flatten().copied())
            .filter(|&t| graph.tensor(t).param().is_some())
            .collect();
        // Float weights go to the device once; integer ones (shapes, indices) stay on the host.
        read_weights.sort();
        read_weights.dedup();
        let mut weights = HashMap::new();
        let mut weight_bytes = 0u64;
        for id in read_weights {
            let Some(host) = self.weights.get(id) else {
                continue;
            };
            if let TensorData::F32(values) = host.data() {
                if values.is_empty() {
                    continue;
                }
                let data = stream.clone_htod(values).map_err(|e| {
                    Self::stage_error(
                        spec.index,
                        format!(
                            "cannot upload weight '{}' ({} bytes): {e}",
                            graph.tensor(id).name,
                            values.len() * 4
                        ),
                    )
                })?;
                weight_bytes += values.len() as u64 * 4;
                weights.insert(id, DeviceTensor::new(host.shape().to_vec(), data));
            }
        }
        Ok(CudaStage {
            spec: spec.clone(),
            steps,
            device,
            stream,
            blas,
            weights,
            weight_bytes,
            host_runs: Mutex::new(BTreeMap::new()),
        })
    }

    fn run(&self, stage: &CudaStage, inputs: &Tensors) -> Result<Tensors, Error> {
        let graph = self.graph;
        let index = stage.spec.index;
        let gpu = Gpu {
            stream: &stage.stream,
            blas: &stage.blas,
            functions: &self.devices[stage.device].functions,
        };
        let mut env: HashMap<TensorId, Value> = HashMap::new();
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
            env.insert(id, Value::Host(Arc::clone(value)));
        }
        let fetch = |env: &HashMap<TensorId, Value>, id: TensorId| -> Option<Value> {
            env.get(&id)
                .cloned()
                .or_else(|| stage.weights.get(&id).cloned().map(Value::Device))
                .or_else(|| self.weights.get(id).cloned().map(Value::Host))
        };
        for step in &stage.steps {
            let node = graph.node(step.node);
            let kernel_error = |detail: String| Error::Kernel {
                node: node.name.clone(),
                op: node.op_type.clone(),
                detail: format!("stage {index} on GPU {}: {detail}", stage.device),
            };
            let args: Vec<Option<Value>> = node
                .inputs
                .iter()
                .map(|slot| match slot {
                    None => Ok(None),
                    Some(id) => fetch(&env, *id).map(Some).ok_or_else(|| {
                        kernel_error(format!(
                            "input '{}' is not available",
                            graph.tensor(*id).name
                        ))
                    }),
                })
                .collect::<Result<_, Error>>()?;
            let ctx = Ctx {
                node,
                opset: step.opset,
                output_dtypes: &step.output_dtypes,
            };
            let results = match ops::run(&gpu, &ctx, &args).map_err(kernel_error)? {
                Some(results) => results,
                None => {
                    // Host-only work (shape arithmetic, constants) is by design; what is counted
                    // is a device tensor copied back because no device op took the node.
                    let copies_back = args.iter().flatten().any(|v| matches!(v, Value::Device(_)));
                    if copies_back {
                        if let Ok(mut counts) = stage.host_runs.lock() {
                            *counts.entry(node.op_type.clone()).or_default() += 1;
                        }
                    }
                    let host: Vec<Option<Arc<HostTensor>>> = args
                        .iter()
                        .map(|a| a.as_ref().map(|v| v.to_host(&stage.stream)).transpose())
                        .collect::<Result<_, String>>()
                        .map_err(kernel_error)?;
                    let refs: Vec<Option<&HostTensor>> =
                        host.iter().map(|a| a.as_deref()).collect();
                    (step.kernel)(&ctx, &refs)
                        .map_err(kernel_error)?
                        .into_iter()
                        .map(|t| Value::Host(Arc::new(t)))
                        .collect()
                }
            };
            drop(args);
            let mut results = results.into_iter();
            for (position, slot) in node.outputs.iter().enumerate() {
                let value = results.next();
                if let Some(id) = slot {
                    let value = value.ok_or_else(|| {
                        kernel_error(format!("the op gives no output {position}"))
                    })?;
                    env.insert(*id, value);
                }
            }
            for t in &step.frees {
                env.remove(t);
            }
        }
        let mut sends = Tensors::new();
        for &id in &stage.spec.sends {
            let name = graph.tensor(id).name.clone();
            let value = fetch(&env, id).ok_or_else(|| {
                Error::RunInput(format!(
                    "stage {index} should send '{name}' but does not have it"
                ))
            })?;
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
}
