//! Stand-in for the CUDA backend in builds without the `cuda` feature: the same names, and every
//! entry point answers [`Error::CudaNotCompiled`], so callers need no `cfg` of their own.

use std::collections::BTreeMap;
use std::convert::Infallible;

use super::{Executor, StageSpec, Tensors, Weights};
use crate::Error;
use pipecut_ir::graph::Graph;

/// Why there is no device: this build has no CUDA backend.
pub fn device_count() -> Result<usize, String> {
    Err("pipecut was built without the `cuda` feature".into())
}

/// Why cuBLAS cannot be used: this build has no CUDA backend.
pub fn cublas_problem() -> Option<String> {
    Some("pipecut was built without the `cuda` feature".into())
}

/// One GPU as `pipecut devices` reports it (none in this build).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceReport {
    /// The driver's device number.
    pub ordinal: usize,
    /// Compute capability as `major.minor`.
    pub compute_capability: String,
    /// What was loaded.
    pub kernels: Option<String>,
    /// Why the kernels cannot be loaded on it.
    pub problem: Option<String>,
}

/// No GPU is opened in this build.
pub fn device_reports() -> Vec<DeviceReport> {
    Vec::new()
}

/// What ptxas reports for one kernel (never made in this build).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelResources {
    /// The kernel's name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of local memory written for spilled registers, per thread.
    pub spill_store_bytes: u32,
    /// Bytes of local memory read back for spilled registers, per thread.
    pub spill_load_bytes: u32,
    /// Bytes of stack frame per thread.
    pub stack_bytes: u32,
}

/// Always [`Error::CudaNotCompiled`] in this build.
pub fn kernel_resources(_arch: u32) -> Result<Vec<KernelResources>, Error> {
    Err(Error::CudaNotCompiled)
}

/// Always [`Error::CudaNotCompiled`] in this build.
pub fn check_kernels() -> Result<Vec<String>, Error> {
    Err(Error::CudaNotCompiled)
}

/// The CUDA backend; cannot be created in this build.
pub struct CudaExecutor<'a> {
    _never: Infallible,
    _graph: std::marker::PhantomData<&'a Graph>,
}

/// A prepared CUDA stage; cannot exist in this build.
pub struct CudaStage {
    _never: Infallible,
}

impl CudaStage {
    /// How many times each op ran on the host instead of the device.
    pub fn host_runs(&self) -> BTreeMap<String, usize> {
        match self._never {}
    }

    /// The device ordinal it runs on.
    pub fn device(&self) -> usize {
        match self._never {}
    }

    /// Bytes of weights uploaded to the device.
    pub fn weight_bytes(&self) -> u64 {
        match self._never {}
    }
}

impl<'a> CudaExecutor<'a> {
    /// Always [`Error::CudaNotCompiled`] in this build.
    pub fn new(_graph: &'a Graph, _weights: &'a Weights) -> Result<CudaExecutor<'a>, Error> {
        Err(Error::CudaNotCompiled)
    }

    /// Always [`Error::CudaNotCompiled`] in this build.
    pub fn for_stages(
        _graph: &'a Graph,
        _weights: &'a Weights,
        _stages: usize,
    ) -> Result<CudaExecutor<'a>, Error> {
        Err(Error::CudaNotCompiled)
    }

    /// Always [`Error::CudaNotCompiled`] in this build.
    pub fn on_device(
        _graph: &'a Graph,
        _weights: &'a Weights,
        _ordinal: usize,
    ) -> Result<CudaExecutor<'a>, Error> {
        Err(Error::CudaNotCompiled)
    }

    /// Number of GPUs the stages are spread over.
    pub fn device_count(&self) -> usize {
        match self._never {}
    }

    /// Sizes each GPU's memory pool from the plan's per-stage activation bytes.
    pub fn size_memory_pools(&self, _stage_bytes: &[u64]) -> Result<(), Error> {
        match self._never {}
    }

    /// Runs a pipeline whose tensors stay on the device between stages.
    pub fn run_resident_pipeline(
        &self,
        _stages: &mut [CudaStage],
        _inputs: &Tensors,
        _microbatches: usize,
    ) -> Result<super::PipelineReport, Error> {
        match self._never {}
    }
}

impl super::NodeTimer for CudaExecutor<'_> {
    const BACKEND: &'static str = "pipecut-cuda";

    fn run_observed(
        &self,
        _stage: &CudaStage,
        _inputs: &Tensors,
        _observe: &mut dyn FnMut(pipecut_ir::graph::NodeId, f64, u64),
    ) -> Result<Tensors, Error> {
        match self._never {}
    }
}

impl Executor for CudaExecutor<'_> {
    type Stage = CudaStage;

    fn prepare(&self, _spec: &StageSpec) -> Result<CudaStage, Error> {
        match self._never {}
    }

    fn run(&self, _stage: &CudaStage, _inputs: &Tensors) -> Result<Tensors, Error> {
        match self._never {}
    }
}
