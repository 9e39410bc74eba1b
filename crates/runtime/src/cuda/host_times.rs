//! Where a CUDA run's time goes (`PIPECUT_CUDA_HOST_TIMES=1`): each node's host time from its
//! inputs to its outputs without waiting for the device, and inside it the time in device
//! allocations, uploads, cuBLAS calls and releases; the final download's wait. With
//! `PIPECUT_CUDA_HOST_TIMES=spans`, also each node's span on the device between two timing
//! events recorded around it on the stream (which includes the device idling inside the node
//! while the host launches, and the events' own cost: about 5 us of host time per node on an
//! H200). With `PIPECUT_CUDA_HOST_TIMES=device`, the stream is also held for `HOLD_MS` before
//! each micro-batch (a host function that sleeps), so the host has queued the whole micro-batch
//! when the device starts it and the spans are the nodes' device times alone: the way to see
//! which kernels cost the device time of a run bound by the device. Printed to stderr when the run ends. A diagnostic for machines without a profiler (the lent GPUs have
//! no `perf` or `nsys`): a run whose node host times add up to its wall time is bound by the
//! host, one whose download waits are most of it by the device.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

/// The parts of a node's host time that are timed on their own.
#[derive(Clone, Copy)]
pub(super) enum Part {
    Alloc,
    Upload,
    Gemm,
    Release,
    Download,
}

const PARTS: [(&str, Part); 5] = [
    ("device allocations", Part::Alloc),
    (
        "uploads (pageable: each waits for the stream)",
        Part::Upload,
    ),
    ("cuBLAS calls", Part::Gemm),
    ("releases", Part::Release),
    (
        "downloads of the outputs (waits for the device)",
        Part::Download,
    ),
];

static NANOS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static COUNTS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static NODES: Mutex<BTreeMap<String, (u64, u64)>> = Mutex::new(BTreeMap::new());
static DEVICE: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

thread_local! {
    /// This thread's nodes whose device spans are not read yet: (op, start, end).
    static PENDING: RefCell<Vec<(String, CudaEvent, CudaEvent)>> = const { RefCell::new(Vec::new()) };
}

fn spans_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("PIPECUT_CUDA_HOST_TIMES").is_ok_and(|v| v == "spans" || v == "device")
    })
}

fn hold_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PIPECUT_CUDA_HOST_TIMES").is_ok_and(|v| v == "device"))
}

/// How long the stream is held before each micro-batch in `device` mode: longer than any
/// fixture's host time per micro-batch (at most about 3 ms on the lent H200s).
const HOLD_MS: u64 = 10;

/// In `device` mode, holds `stream` for `HOLD_MS` before the work queued next.
pub(super) fn hold(stream: &Arc<CudaStream>) {
    unsafe extern "C" fn sleep(_: *mut std::ffi::c_void) {
        std::thread::sleep(std::time::Duration::from_millis(HOLD_MS));
    }
    if !hold_enabled() || stream.context().bind_to_thread().is_err() {
        return;
    }
    // SAFETY: the function makes no CUDA call and reads no data.
    let _ = unsafe {
        cudarc::driver::sys::cuLaunchHostFunc(stream.cu_stream(), Some(sleep), std::ptr::null_mut())
    };
}

/// A timing event recorded now on `stream`, when device spans are asked for.
pub(super) fn mark(stream: &Arc<CudaStream>) -> Option<CudaEvent> {
    if !spans_enabled() {
        return None;
    }
    let event = stream
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .ok()?;
    event.record(stream).ok()?;
    Some(event)
}

/// Keeps a node's device span (from `start` to an event recorded now) to read later.
pub(super) fn span(op: &str, start: Option<CudaEvent>, stream: &Arc<CudaStream>) {
    if let (Some(start), Some(end)) = (start, mark(stream)) {
        PENDING.with(|p| p.borrow_mut().push((op.to_string(), start, end)));
    }
}

/// Reads this thread's pending device spans (waiting for their events).
pub(super) fn collect_spans() {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return;
    }
    let mut device = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    for (op, start, end) in pending {
        if let Ok(ms) = start.elapsed_ms(&end) {
            *device.entry(op).or_default() += ms as f64 * 1e3;
        }
    }
}

pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PIPECUT_CUDA_HOST_TIMES").is_some())
}

/// Runs `f`, adding its host time to `part` when enabled.
pub(super) fn timed<T>(part: Part, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let began = Instant::now();
    let out = f();
    NANOS[part as usize].fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
    COUNTS[part as usize].fetch_add(1, Ordering::Relaxed);
    out
}

/// Adds a node's host time under its op type.
pub(super) fn node(op: &str, began: Instant) {
    let nanos = began.elapsed().as_nanos() as u64;
    let mut nodes = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let entry = nodes.entry(op.to_string()).or_default();
    entry.0 += 1;
    entry.1 += nanos;
}

/// Prints the totals per micro-batch to stderr.
pub(super) fn report(microbatches: usize, wall_secs: f64) {
    if !enabled() {
        return;
    }
    let per = |nanos: u64| nanos as f64 / 1e3 / microbatches.max(1) as f64;
    let nodes = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let total: u64 = nodes.values().map(|v| v.1).sum();
    // Fused steps (`fuse.rs`) count as one each.
    let steps: u64 = nodes.values().map(|v| v.0).sum();
    eprintln!(
        "host times per micro-batch ({microbatches}): wall {:.1} us, nodes' host time {:.1} us \
         in {:.1} steps",
        wall_secs * 1e6 / microbatches.max(1) as f64,
        per(total),
        steps as f64 / microbatches.max(1) as f64
    );
    for (name, part) in PARTS {
        let (n, c) = (
            NANOS[part as usize].load(Ordering::Relaxed),
            COUNTS[part as usize].load(Ordering::Relaxed),
        );
        eprintln!(
            "  {name}: {:.1} us in {:.1} calls",
            per(n),
            c as f64 / microbatches.max(1) as f64
        );
    }
    let device = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "  nodes' device spans: {:.1} us",
        device.values().sum::<f64>() / microbatches.max(1) as f64
    );
    let mut ops: Vec<_> = nodes.iter().collect();
    ops.sort_by_key(|(_, v)| std::cmp::Reverse(v.1));
    for (op, (count, nanos)) in ops {
        let span = device.get(op).copied().unwrap_or(0.0);
        eprintln!(
            "  {op}: host {:.1} us, device {:.1} us in {} nodes ({:.2} / {:.2} us each)",
            per(*nanos),
            span / microbatches.max(1) as f64,
            count / microbatches.max(1) as u64,
            *nanos as f64 / 1e3 / (*count).max(1) as f64,
            span / (*count).max(1) as f64
        );
    }
}
