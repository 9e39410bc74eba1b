//! Messages between GPU ranks over NCCL (feature `cuda`): the payload of every message goes
//! GPU to GPU with `ncclSend`/`ncclRecv`, while a TCP control channel (the rendezvous and
//! connections of [`TcpTransport`]) carries what NCCL cannot: the communicator's unique id
//! (rank 0 makes it and sends it to every rank), each message's tag and length (a receiver
//! must post a receive of the exact size), and a peer's death (its connections close).
//!
//! ```text
//! send(to, tag, bytes): control ── tag, length ──▶ to;  bytes ─▶ device buffer ─ ncclSend ─▶
//! recv(from, tag):      control ◀── tag, length ── from; ncclRecv ─▶ device buffer ─▶ bytes
//! ```
//!
//! First version: the stage hands the [`Transport`] host bytes, so a message is uploaded, sent
//! over NCCL and downloaded at the other end (the GPUs' link carries it, the host still
//! stages it). NCCL calls can block forever on a peer that died, so the communicator is
//! non-blocking (`blocking = 0`) and every call and its completion are polled
//! (`ncclCommGetAsyncError`, a CUDA event): its initialisation and a receive (whose sender
//! has already announced it) until the peer timeout; a send, which completes only when the
//! receiver takes it, for as long as the receiver lives (its end of the TCP connection is
//! open), since a receiver may be busy for long (the collector finishes its own micro-batches
//! before it takes the other replicas'). A communicator that failed is aborted
//! (`ncclCommAbort`) rather than waited on.

use std::ffi::CStr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys;

use super::launch::Rendezvous;
use super::tcp::{TcpJob, TcpTransport};
use super::transport::{Transport, TransportError};
use crate::Error;

/// Tag of the message that carries the communicator's unique id from rank 0.
const UNIQUE_ID: u32 = u32::MAX - 2;

/// `NCCL_CONFIG_UNDEF_INT`: a field NCCL fills with its default.
const UNDEF_INT: i32 = i32::MIN;

/// The NCCL transport of one rank.
pub struct NcclTransport {
    control: TcpTransport,
    comm: Communicator,
}

/// An NCCL communicator on one GPU's stream; aborted when dropped after a failure, finalized
/// and destroyed otherwise.
struct Communicator {
    raw: sys::ncclComm_t,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    healthy: bool,
}

impl NcclTransport {
    /// Joins the job: the TCP `rendezvous`, then an NCCL communicator over every rank, this
    /// one on GPU `ordinal`; waits at most `timeout` for the others.
    pub fn join(
        rank: usize,
        world: usize,
        rendezvous: &Rendezvous,
        ordinal: usize,
        job: TcpJob,
    ) -> Result<NcclTransport, Error> {
        nccl_present()?;
        let timeout = job.peer_timeout;
        let mut control = TcpTransport::join(rank, world, rendezvous, job)?;
        let context = CudaContext::new(ordinal).map_err(|e| {
            Error::Distributed(format!("rank {rank}: cannot open GPU {ordinal}: {e}"))
        })?;
        let stream = context.new_stream().map_err(|e| {
            Error::Distributed(format!("rank {rank}: no stream on GPU {ordinal}: {e}"))
        })?;
        let id = share_unique_id(&mut control, timeout)?;
        let comm = Communicator::init(context, stream, rank, world, id, timeout)?;
        Ok(NcclTransport { control, comm })
    }
}

/// Whether libnccl can be loaded, in words for the error when not.
fn nccl_present() -> Result<(), Error> {
    // SAFETY: only tries to open the shared library.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Distributed(
        "no NCCL library: --transport nccl loads libnccl.so (the libnccl-dev package, or a \
         symlink libnccl.so -> libnccl.so.2 on LD_LIBRARY_PATH); or use --transport tcp"
            .into(),
    ))
}

/// Rank 0 makes the unique id and sends it to every rank over the control channel.
fn share_unique_id(
    control: &mut TcpTransport,
    timeout: Duration,
) -> Result<sys::ncclUniqueId, Error> {
    if control.rank() == 0 {
        let id = cudarc::nccl::result::get_uniqueid()
            .map_err(|e| Error::Distributed(format!("ncclGetUniqueId: {}", describe(e.0))))?;
        let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        for peer in 1..control.world() {
            control.send(peer, UNIQUE_ID, &bytes).map_err(|e| {
                Error::Distributed(format!("rank 0: rank {peer} {e} before NCCL started"))
            })?;
        }
        return Ok(id);
    }
    let bytes = control.recv(0, UNIQUE_ID, timeout).map_err(|e| {
        Error::Distributed(format!(
            "rank {}: rank 0 {e} before NCCL started",
            control.rank()
        ))
    })?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    if bytes.len() != id.internal.len() {
        return Err(Error::Distributed(format!(
            "rank 0 sent an NCCL unique id of {} bytes, not {}",
            bytes.len(),
            id.internal.len()
        )));
    }
    for (to, from) in id.internal.iter_mut().zip(&bytes) {
        *to = *from as core::ffi::c_char;
    }
    Ok(id)
}

/// NCCL's words for a result.
fn describe(result: sys::ncclResult_t) -> String {
    // SAFETY: NCCL returns a static string for every result.
    let text = unsafe { sys::ncclGetErrorString(result) };
    if text.is_null() {
        return format!("{result:?}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    format!("{text} ({result:?})")
}

impl Communicator {
    fn init(
        context: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: sys::ncclUniqueId,
        timeout: Duration,
    ) -> Result<Communicator, Error> {
        let fail = |what: String| Error::Distributed(format!("rank {rank}: NCCL: {what}"));
        context
            .bind_to_thread()
            .map_err(|e| fail(format!("cannot bind the GPU's context: {e}")))?;
        let mut config = non_blocking_config();
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` and `config` outlive the call; the id came from ncclGetUniqueId.
        let started = unsafe {
            sys::ncclCommInitRankConfig(&mut raw, world as i32, id, rank as i32, &mut config)
        };
        let mut comm = Communicator {
            raw,
            context,
            stream,
            healthy: false,
        };
        if !matches!(
            started,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) || raw.is_null()
        {
            return Err(fail(format!(
                "ncclCommInitRankConfig: {}",
                describe(started)
            )));
        }
        comm.settle(Instant::now() + timeout, timeout)
            .map_err(|e| {
                fail(format!(
                    "the communicator of {world} ranks did not form: {e}"
                ))
            })?;
        comm.healthy = true;
        Ok(comm)
    }

    /// Waits until the communicator's last call is done (no longer `ncclInProgress`), at most
    /// until `deadline`.
    fn settle(&self, deadline: Instant, timeout: Duration) -> Result<(), TransportError> {
        self.enqueued(&mut || until_timeout(deadline, timeout))
    }

    /// Waits until the last call is enqueued (no longer `ncclInProgress`), polling while
    /// `waiting()` allows.
    fn enqueued(
        &self,
        waiting: &mut impl FnMut() -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        let mut pause = Duration::from_micros(10);
        while self.in_progress()? {
            waiting()?;
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The communicator's asynchronous error, if any.
    fn failed(&self) -> Result<(), TransportError> {
        self.in_progress().map(|_| ())
    }

    /// Whether the last call is still in progress; `Err` when the communicator failed.
    fn in_progress(&self) -> Result<bool, TransportError> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is a live communicator.
        let asked = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        if asked != sys::ncclResult_t::ncclSuccess {
            return Err(TransportError::Failed(format!(
                "ncclCommGetAsyncError: {}",
                describe(asked)
            )));
        }
        match state {
            sys::ncclResult_t::ncclSuccess => Ok(false),
            sys::ncclResult_t::ncclInProgress => Ok(true),
            failed => Err(self.failure(failed)),
        }
    }

    /// An NCCL error with NCCL's own last message.
    fn failure(&self, result: sys::ncclResult_t) -> TransportError {
        // SAFETY: `raw` is a live communicator; the text is NUL-terminated.
        let last = unsafe {
            let text = sys::ncclGetLastError(self.raw);
            (!text.is_null()).then(|| CStr::from_ptr(text).to_string_lossy().into_owned())
        };
        let detail = match last.filter(|t| !t.is_empty()) {
            Some(last) => format!("{}: {last}", describe(result)),
            None => describe(result),
        };
        if result == sys::ncclResult_t::ncclRemoteError {
            TransportError::Closed(format!("NCCL: {detail}"))
        } else {
            TransportError::Failed(format!("NCCL: {detail}"))
        }
    }

    /// Runs one point-to-point call and waits for its transfer to complete on the stream,
    /// polling while `waiting()` says the wait may go on.
    fn transfer(
        &mut self,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> sys::ncclResult_t,
        mut waiting: impl FnMut() -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        let cuda = |e: cudarc::driver::DriverError| TransportError::Failed(format!("CUDA: {e}"));
        self.context.bind_to_thread().map_err(cuda)?;
        let result = call(self.raw, self.stream.cu_stream() as sys::cudaStream_t);
        if !matches!(
            result,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            self.healthy = false;
            return Err(self.failure(result));
        }
        let outcome = self.enqueued(&mut waiting).and_then(|()| {
            let done = self.context.new_event(None).map_err(cuda)?;
            done.record(&self.stream).map_err(cuda)?;
            let mut pause = Duration::from_micros(10);
            while !done.try_is_complete().map_err(cuda)? {
                self.failed()?;
                waiting()?;
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
            Ok(())
        });
        if outcome.is_err() {
            self.healthy = false;
        }
        outcome
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.context.bind_to_thread();
        // SAFETY: `raw` is live and never used after; a failed communicator is aborted (its
        // pending work may never finish), a healthy one finalized (flushing it) then destroyed.
        unsafe {
            if self.healthy
                && matches!(
                    sys::ncclCommFinalize(self.raw),
                    sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                )
                && self
                    .settle(
                        Instant::now() + Duration::from_secs(10),
                        Duration::from_secs(10),
                    )
                    .is_ok()
            {
                sys::ncclCommDestroy(self.raw);
            } else {
                sys::ncclCommAbort(self.raw);
            }
        }
    }
}

/// `Ok` until `deadline`, then the timeout error.
fn until_timeout(deadline: Instant, timeout: Duration) -> Result<(), TransportError> {
    if Instant::now() < deadline {
        Ok(())
    } else {
        Err(TransportError::Timeout(timeout))
    }
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
fn non_blocking_config() -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 30, 0), the layout of these bindings' config: an older NCCL reads
        // the first `size` bytes it knows and ignores the rest.
        version: 23000,
        blocking: 0,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
    }
}

impl Transport for NcclTransport {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.control.rank()
    }

    fn world(&self) -> usize {
        self.control.world()
    }

    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        self.control
            .send(to, tag, &(bytes.len() as u64).to_le_bytes())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = Arc::clone(&self.comm.stream);
        let cuda = |e: cudarc::driver::DriverError| TransportError::Failed(format!("CUDA: {e}"));
        let buffer = stream.clone_htod(bytes).map_err(cuda)?;
        let (ptr, _sync) = buffer.device_ptr(&stream);
        // A send completes when the receiver takes it, which may be long after a busy receiver
        // (the collector finishing its own micro-batches first): no deadline, only the
        // receiver's life (its end of the connection the header went over).
        let control = &self.control;
        let receiver_alive = || {
            if control.peer_alive(to) {
                Ok(())
            } else {
                Err(TransportError::Closed("while NCCL sent to it".into()))
            }
        };
        self.comm.transfer(
            // SAFETY: the buffer holds `bytes.len()` bytes on this stream's device and lives
            // until the transfer completed (or the communicator is aborted).
            |comm, s| unsafe {
                sys::ncclSend(
                    ptr as *const _,
                    bytes.len(),
                    sys::ncclDataType_t::ncclUint8,
                    to as i32,
                    comm,
                    s,
                )
            },
            receiver_alive,
        )
    }

    fn recv(
        &mut self,
        from: usize,
        tag: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let header = self.control.recv(from, tag, timeout)?;
        let length: [u8; 8] = header.as_slice().try_into().map_err(|_| {
            TransportError::Failed(format!(
                "sent a control message of {} bytes where a length of 8 was expected",
                header.len()
            ))
        })?;
        let length = u64::from_le_bytes(length);
        if length == 0 {
            return Ok(Vec::new());
        }
        let length = usize::try_from(length)
            .ok()
            .filter(|&n| n as u64 <= self.control.max_message())
            .ok_or_else(|| {
                TransportError::Failed(format!(
                    "announced a message of {length} bytes, over the {} bytes the plan lets cross",
                    self.control.max_message()
                ))
            })?;
        let deadline = Instant::now() + timeout;
        let stream = Arc::clone(&self.comm.stream);
        let cuda = |e: cudarc::driver::DriverError| TransportError::Failed(format!("CUDA: {e}"));
        let mut buffer = stream.alloc_zeros::<u8>(length).map_err(cuda)?;
        {
            let (ptr, _sync) = buffer.device_ptr_mut(&stream);
            self.comm.transfer(
                // SAFETY: the buffer holds `length` bytes on this stream's device and lives
                // until the transfer completed (or the communicator is aborted).
                |comm, s| unsafe {
                    sys::ncclRecv(
                        ptr as *mut _,
                        length,
                        sys::ncclDataType_t::ncclUint8,
                        from as i32,
                        comm,
                        s,
                    )
                },
                // The sender posts its send right after the header that came.
                || until_timeout(deadline, timeout),
            )?;
        }
        stream.clone_dtoh(&buffer).map_err(cuda)
    }

    fn waiting(&mut self, from: usize) -> usize {
        self.control.waiting(from)
    }

    fn abort(&mut self, cause: &str) {
        self.control.abort(cause);
    }

    fn finished(&mut self) {
        self.control.finished();
    }
}
