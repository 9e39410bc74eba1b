//! Copies between the host and a stage's stream through page-locked memory.
//!
//! A copy from pageable memory to the device waits for everything queued on the stream before
//! it (CUDA's documented behaviour), so each small per-micro-batch upload (a mask, the token
//! ids, a resize table) stalled the host until the device caught up, and the two stopped
//! overlapping: gpt2_tiny's six uploads per micro-batch. Uploads up to `CHUNK_BYTES` are copied
//! into one of a ring of page-locked chunks and sent asynchronously; a chunk is written again
//! only after its last copy finished (its event). Downloads of at least `PINNED_DOWNLOAD_BYTES`
//! land in a page-locked buffer too (the driver stages a pageable download in small pieces): on
//! an H200 the wait for gpt2_tiny's 1 MB of logits went from 0.84–0.94 ms a micro-batch to
//! 0.61–0.68 ms (`benches/gpu/host_times.sh`, docs/benchmarks.md). `PIPECUT_CUDA_PINNED=off`
//! turns both off. Each thread keeps buffers per context, so a thread that downloads from
//! several GPUs in turn (the run's outputs) does not make them again at each switch.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, DriverError,
    PinnedHostSlice,
};

/// Each upload chunk's size: uploads larger than this are rare (inputs, big tables) and go the
/// pageable way.
const CHUNK_BYTES: usize = 1 << 20;
/// Chunks in the ring: an upload waits only if the one eight uploads back is still in flight.
const CHUNKS: usize = 8;
/// Downloads of at least this many bytes go through the page-locked buffer.
const PINNED_DOWNLOAD_BYTES: usize = 64 << 10;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PIPECUT_CUDA_PINNED").map_or(true, |v| v != "off"))
}

/// A page-locked chunk and the event recorded after the last copy out of it.
struct Chunk {
    host: *mut u8,
    sent: CudaEvent,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // Errors here mean the context is gone, and the memory with it.
        let _ = self.sent.synchronize();
        // SAFETY: allocated by `malloc_host` and freed once, after its last copy.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

/// One thread's page-locked buffers, for the context of the stream it last used.
struct Buffers {
    context: Arc<CudaContext>,
    chunks: Vec<Chunk>,
    next: usize,
    download: Option<PinnedHostSlice<u8>>,
}

thread_local! {
    static BUFFERS: RefCell<Vec<Buffers>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffers for `stream`'s context, made on first use.
fn with_buffers<R>(
    stream: &Arc<CudaStream>,
    f: impl FnOnce(&mut Buffers) -> Result<R, DriverError>,
) -> Result<R, DriverError> {
    BUFFERS.with(|cell| {
        let mut all = cell.borrow_mut();
        let index = match all.iter().position(|b| b.context == *stream.context()) {
            Some(index) => index,
            None => {
                all.push(Buffers {
                    context: Arc::clone(stream.context()),
                    chunks: Vec::new(),
                    next: 0,
                    download: None,
                });
                all.len() - 1
            }
        };
        f(&mut all[index])
    })
}

/// `values` in a new device buffer on `stream`, sent without waiting for the stream.
pub(super) fn upload<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    values: &[T],
) -> Result<CudaSlice<T>, DriverError> {
    let bytes = std::mem::size_of_val(values);
    if !enabled() || bytes == 0 || bytes > CHUNK_BYTES {
        return stream.clone_htod(values);
    }
    // SAFETY: the copy below writes every element before any kernel reads the buffer.
    let mut device = unsafe { stream.alloc::<T>(values.len()) }?;
    stream.context().bind_to_thread()?;
    with_buffers(stream, |buffers| {
        if buffers.chunks.len() < CHUNKS {
            // SAFETY: a fresh block of CHUNK_BYTES, freed by `Chunk`'s drop.
            let host = unsafe { result::malloc_host(CHUNK_BYTES, 0) }?.cast::<u8>();
            let sent = stream.context().new_event(None)?;
            buffers.chunks.push(Chunk { host, sent });
        }
        let index = buffers.next % buffers.chunks.len();
        buffers.next = buffers.next.wrapping_add(1);
        let chunk = &buffers.chunks[index];
        // The chunk's previous copy must have read it before it is written again.
        chunk.sent.synchronize()?;
        // SAFETY: `bytes` ≤ CHUNK_BYTES; `values` is plain data of `bytes` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), chunk.host, bytes);
        }
        {
            let (pointer, _guard) = device.device_ptr_mut(stream);
            // SAFETY: the chunk holds `bytes` bytes and stays untouched until `sent` fires;
            // the device buffer holds `values.len()` elements of T.
            unsafe {
                let source = std::slice::from_raw_parts(chunk.host.cast_const(), bytes);
                result::memcpy_htod_async(pointer, source, stream.cu_stream())?;
            }
        }
        chunk.sent.record(stream)
    })?;
    Ok(device)
}

/// `data` copied to the host, after the stream's work before it.
pub(super) fn download<T: DeviceRepr + Clone + Default>(
    stream: &Arc<CudaStream>,
    data: &CudaSlice<T>,
) -> Result<Vec<T>, DriverError> {
    let bytes = data.len() * std::mem::size_of::<T>();
    if !enabled() || bytes < PINNED_DOWNLOAD_BYTES {
        return stream.clone_dtoh(data);
    }
    let mut out = vec![T::default(); data.len()];
    stream.context().bind_to_thread()?;
    with_buffers(stream, |buffers| {
        if buffers.download.as_ref().is_none_or(|d| d.len() < bytes) {
            // Cacheable, not write-combined: the host reads it back.
            // SAFETY: the copy below writes the bytes that are read.
            let buffer = unsafe {
                stream
                    .context()
                    .alloc_pinned_with_flags::<u8>(bytes.next_power_of_two(), 0)
            }?;
            buffers.download = Some(buffer);
        }
        let buffer = buffers.download.as_mut().expect("made above");
        {
            let (pointer, _guard) = cudarc::driver::DevicePtr::device_ptr(data, stream);
            // SAFETY: the buffer holds at least `bytes` bytes.
            unsafe {
                let target = std::slice::from_raw_parts_mut(buffer.as_mut_ptr()?, bytes);
                result::memcpy_dtoh_async(target, pointer, stream.cu_stream())?;
            }
        }
        // The stream's own wait spins; the buffer's event would put the thread to sleep.
        stream.synchronize()?;
        // SAFETY: the copy finished; `out` has room for `bytes` bytes of T.
        unsafe {
            std::ptr::copy_nonoverlapping(buffer.as_ptr()?, out.as_mut_ptr().cast::<u8>(), bytes);
        }
        Ok(())
    })?;
    Ok(out)
}
