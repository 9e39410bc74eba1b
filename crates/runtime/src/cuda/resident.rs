//! Device-resident pipelines: micro-batches cross CUDA stages as device tensors, ordered by
//! events, never through the host.
//!
//! ```text
//! stage k:   run on stream k ── record `ready` ──▶ (values, ready) ──▶ stage k + 1
//! stage k+1: stream k+1 waits for `ready` (no host wait) ── a tensor of another GPU is copied
//!            peer to peer on stream k+1 ── run ── each received buffer's own stream waits for
//!            stream k+1 before the buffer is released (it is freed on the stream that made it)
//! last stage: its sends come back to the host on the run's calling thread, each micro-batch
//!             once its `ready` event fires, on a stream of their own (`Collector`), while the
//!             stages launch later micro-batches (up to `DEFERRED_OUTPUT_BYTES` held on the
//!             device at once; past that, the last stage downloads each as it is made)
//! ```
//!
//! Bringing a micro-batch's outputs back as soon as its last stage has launched its work made
//! that stage's thread wait for the device before launching the next micro-batch, so the
//! device sat idle while the host launched and the host while the device ran: gpt2_tiny's one
//! stage on an H200 spent 0.6–0.9 ms of its 2.0–2.5 ms per micro-batch waiting on that download
//! (`benches/gpu/host_times.sh`). Bringing them all back after the last launch left the
//! downloads on the run's critical path: 0.5 µs per KiB on the lent H200s (gVisor; likely the
//! host's first touch of the pages they fill), 0.54 ms a micro-batch for gpt2_tiny's 1 MiB of
//! logits and 2.1 ms for ppocr_v4_rec's 4.2 MB, as long as the device's whole micro-batch.
//!
//! Integer and boolean tensors (shapes, masks) were on the host all along and cross as they are.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream, DevicePtr};

use super::value::{DeviceTensor, Value};
use super::{CudaExecutor, CudaStage};
use crate::cpu::{pipeline_report, split_microbatches, stream_through_collecting};
use crate::Error;
use crate::{PipelineOptions, PipelineReport, Tensors};

/// Outputs held on the device until the run's end, at most: a run whose outputs are larger
/// brings the rest back as they are made. `PIPECUT_CUDA_DEFER=off` holds none (to compare).
const DEFERRED_OUTPUT_BYTES: u64 = 512 << 20;

fn deferred_output_bytes() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| match std::env::var("PIPECUT_CUDA_DEFER") {
        Ok(v) if v == "off" => 0,
        _ => DEFERRED_OUTPUT_BYTES,
    })
}

/// A micro-batch between stages: its tensors wherever they are, and an event recorded on the
/// producing stage's stream after its work (none for the pipeline's host inputs).
pub(super) struct Resident {
    values: BTreeMap<String, Value>,
    ready: Option<CudaEvent>,
}

impl Resident {
    /// Host tensors as a micro-batch, with nothing to wait for.
    fn on_host(tensors: Tensors) -> Resident {
        Resident {
            values: tensors
                .into_iter()
                .map(|(name, t)| (name, Value::host(t)))
                .collect(),
            ready: None,
        }
    }

    /// The tensors of a micro-batch already brought to the host (`Collector::bring_to_host`).
    fn into_host(self) -> Result<Tensors, Error> {
        self.values
            .into_iter()
            .map(|(name, value)| match value {
                Value::Host(t, _) => Ok((name, t)),
                _ => Err(Error::Cuda(format!("output '{name}' was not brought back"))),
            })
            .collect()
    }
}

impl CudaExecutor<'_> {
    /// Streams `inputs`, split into `microbatches` along axis 0, through the prepared `stages`
    /// (one thread each), keeping the tensors that cross stages on the device: only the
    /// pipeline's inputs are uploaded and only its outputs downloaded.
    pub fn run_resident_pipeline(
        &self,
        stages: &mut [CudaStage],
        inputs: &Tensors,
        microbatches: usize,
    ) -> Result<PipelineReport, Error> {
        let batches: Vec<Resident> = split_microbatches(inputs, microbatches)?
            .into_iter()
            .map(Resident::on_host)
            .collect();
        let last = stages.len().saturating_sub(1);
        let deferred = AtomicU64::new(0);
        let start = std::time::Instant::now();
        let run = |stage: &CudaStage, batch: Resident| {
            let last = (stage.spec.index == last).then_some(&deferred);
            self.run_resident(stage, batch, last)
        };
        let collector = Collector::default();
        let collect = |batch: Resident| {
            let (host, bytes) = collector.bring_to_host(batch)?;
            deferred.fetch_sub(bytes, Ordering::Relaxed);
            Ok(Resident::on_host(host))
        };
        let options = PipelineOptions::default();
        let (collected, busy) =
            stream_through_collecting(stages, batches, &run, &collect, options)?;
        let collected: Vec<Tensors> = collected?
            .into_iter()
            .map(Resident::into_host)
            .collect::<Result<_, Error>>()?;
        let wall_secs = start.elapsed().as_secs_f64();
        super::host_times::report(microbatches, wall_secs);
        pipeline_report(&collected, &busy, wall_secs)
    }

    /// Runs one micro-batch on `stage` after the stage that made it, without waiting on the
    /// host. The last stage (given the bytes of outputs waiting on the device, which the
    /// collector lowers as it brings them back) brings its sends to the host itself once that
    /// total passes `DEFERRED_OUTPUT_BYTES`, and otherwise leaves them for
    /// `Collector::bring_to_host`.
    fn run_resident(
        &self,
        stage: &CudaStage,
        inbound: Resident,
        last: Option<&AtomicU64>,
    ) -> Result<Resident, Error> {
        let index = stage.spec.index;
        let fail = |what: &str, e: cudarc::driver::DriverError| {
            Self::stage_error(index, format!("{what}: {e}"))
        };
        if let Some(ready) = &inbound.ready {
            stage
                .stream
                .wait(ready)
                .map_err(|e| fail("cannot wait for the previous stage", e))?;
        }
        let mut inputs = BTreeMap::new();
        for (name, value) in &inbound.values {
            let here = match value {
                Value::Device(t) if t.data.stream().context().ordinal() != stage.device => {
                    Value::Device(peer_copy(stage, t).map_err(|e| fail("peer copy", e))?)
                }
                other => other.clone(),
            };
            inputs.insert(name.clone(), here);
        }
        let sends = self.run_values(stage, &inputs, None)?;
        drop(inputs);
        release(stage, inbound.values).map_err(|e| fail("cannot order a release", e))?;
        let keep = last.is_some_and(|deferred| {
            let bytes: u64 = sends.values().map(Value::byte_len).sum();
            deferred.fetch_add(bytes, Ordering::Relaxed) + bytes <= deferred_output_bytes()
        });
        if last.is_some() && !keep {
            let mut host = BTreeMap::new();
            for (name, value) in &sends {
                let t = super::host_times::timed(super::host_times::Part::Download, || {
                    value.to_host(&stage.stream)
                })
                .map_err(|e| Self::stage_error(index, e))?;
                host.insert(name.clone(), Value::host(t));
            }
            // A tensor an earlier stage made and this one relays (a graph output made before
            // the last stage) is freed on its maker's stream once downloaded: ordered as any
            // received tensor.
            release(stage, sends).map_err(|e| fail("cannot order a release", e))?;
            super::host_times::collect_spans();
            return Ok(Resident {
                values: host,
                ready: None,
            });
        }
        let ready = stage
            .stream
            .record_event(None)
            .map_err(|e| fail("cannot record an event", e))?;
        super::host_times::collect_spans();
        Ok(Resident {
            values: sends,
            ready: Some(ready),
        })
    }
}

/// A copy of another GPU's tensor on `stage`'s GPU, made on the stage's stream (which has
/// waited for the tensor's producer).
fn peer_copy(
    stage: &CudaStage,
    t: &DeviceTensor,
) -> Result<DeviceTensor, cudarc::driver::DriverError> {
    let stream = &stage.stream;
    stream.context().bind_to_thread()?;
    // SAFETY: the copy below writes every element.
    let mut copy = unsafe { stream.alloc::<f32>(t.data.len()) }?;
    let source_stream = t.data.stream();
    {
        let (src, _src_sync) = t.data.device_ptr(source_stream);
        let (dst, _dst_sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut copy, stream);
        // SAFETY: both buffers hold `len` floats and are alive; the copy is ordered on the
        // stage's stream after the producer's `ready` event.
        unsafe {
            result::memcpy_peer_async(
                stream.context().cu_ctx(),
                dst,
                source_stream.context().cu_ctx(),
                src,
                t.data.len() * std::mem::size_of::<f32>(),
                stream.cu_stream(),
            )
        }?;
    }
    Ok(DeviceTensor {
        shape: t.shape.clone(),
        data: Arc::new(copy),
        mask: t.mask,
        int: t.int,
    })
}

/// Brings the last stage's outputs to the host as each micro-batch is done, on a stream of
/// its own per GPU: a copy on the stage's stream would wait for the micro-batches the stage
/// launched after this one.
#[derive(Default)]
struct Collector {
    streams: std::sync::Mutex<Vec<Arc<CudaStream>>>,
}

impl Collector {
    /// The collector's stream on `context`'s GPU, made on first use.
    fn stream(&self, context: &Arc<CudaContext>) -> Result<Arc<CudaStream>, String> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = streams.iter().find(|s| s.context() == context) {
            return Ok(Arc::clone(stream));
        }
        let stream = context.new_stream().map_err(|e| e.to_string())?;
        streams.push(Arc::clone(&stream));
        Ok(stream)
    }

    /// A micro-batch's outputs on the host, and the bytes of them that were on the device:
    /// waits for the batch's `ready` event, downloads each device tensor, then frees it on
    /// the stream that made it (with that GPU's context current, as a free needs).
    fn bring_to_host(&self, batch: Resident) -> Result<(Tensors, u64), Error> {
        let fail = |e: String| Error::Cuda(format!("bringing the outputs back: {e}"));
        if let Some(ready) = &batch.ready {
            ready.synchronize().map_err(|e| fail(e.to_string()))?;
        }
        let mut host = Tensors::new();
        let mut bytes = 0;
        for (name, value) in batch.values {
            let t = match &value {
                Value::Host(t, _) => Arc::clone(t),
                Value::Device(d) => {
                    bytes += value.byte_len();
                    let stream = self.stream(d.data.stream().context()).map_err(fail)?;
                    let t = super::host_times::timed(super::host_times::Part::Download, || {
                        value.to_host(&stream)
                    })
                    .map_err(fail)?;
                    // The free is queued on the maker's stream, which must first wait for
                    // this copy on the collector's.
                    let owner = d.data.stream();
                    owner.join(&stream).map_err(|e| fail(e.to_string()))?;
                    owner
                        .context()
                        .bind_to_thread()
                        .map_err(|e| fail(e.to_string()))?;
                    drop(value);
                    t
                }
                Value::Optional(_) => {
                    return Err(Error::Cuda(format!(
                        "the last stage sent '{name}', an optional, where a tensor is needed"
                    )))
                }
            };
            host.insert(name, t);
        }
        Ok((host, bytes))
    }
}

/// Lets go of the tensors a stage received. A buffer is freed on the stream that made it when
/// its last holder drops it, and that stream knows nothing of this stage's reads: it first
/// waits for this stage's stream. The free needs its own GPU's context current.
fn release(
    stage: &CudaStage,
    values: BTreeMap<String, Value>,
) -> Result<(), cudarc::driver::DriverError> {
    for value in values.into_values() {
        if let Value::Device(t) = value {
            let owner = t.data.stream();
            if !Arc::ptr_eq(owner, &stage.stream) {
                owner.join(&stage.stream)?;
                owner.context().bind_to_thread()?;
            }
            drop(t);
        }
    }
    stage.stream.context().bind_to_thread()
}
