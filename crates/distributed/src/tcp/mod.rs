//! Messages over TCP, for jobs started by `torchrun` or `srun` without MPI: rank 0 listens at
//! the rendezvous address, every rank registers the address of its own listener there and
//! receives everyone's, then a rank opens a connection to a peer the first time it sends to it.
//!
//! Every connection starts with the job's challenge-response ([`crate::auth`]): a process that
//! does not hold the job's secret is dropped before any frame of it is read, and a rank with
//! another plan or model is refused naming both digests. Each incoming link has a reader
//! thread that queues whole messages per sender (at most `max_queued`, then it stops reading,
//! so TCP pushes back on the sender), so a stage's next input arrives while it computes; a
//! frame longer than what the plan lets cross is refused from its header, before anything is
//! allocated, and a body is read only as fast as its bytes arrive.
//!
//! The registration connections stay open as the job's control channel, rank 0 its hub
//! ([`control`]): failures are relayed to every rank through it, and rank 0's pings find a
//! rank that was killed or stopped.
//!
//! Frames: `u32 tag, u64 length, bytes`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod control;
mod rendezvous;
mod torch_store;

use super::auth::{handshake, JobKey, Refusal, Role};
use super::transport::{Transport, TransportError};
use crate::launch::{join_host_port, Rendezvous};
use crate::Error;
use control::{Control, Failure};
use rendezvous::{failed_before_joining, host_rendezvous, register};
use torch_store::TorchStore;

/// How long a connecting process has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections being authenticated at once beyond the job's ranks; more are closed at once.
const SPARE_CONNECTIONS: usize = 8;
/// How long a closed link waits for the failure that closed it to be reported.
const CAUSE_GRACE: Duration = Duration::from_millis(500);

/// What a rank's TCP transport enforces, the same on every rank of the job.
#[derive(Debug, Clone)]
pub struct TcpJob {
    /// The secret and the digests every connection proves and compares.
    pub key: JobKey,
    /// The longest frame accepted, from what the plan says may cross.
    pub max_message: u64,
    /// Messages queued per sender before its reader stops reading (the most the schedule can
    /// send ahead of the receiver).
    pub max_queued: usize,
    /// How long a receive waits for a message and a send for the receiver to take bytes.
    pub peer_timeout: Duration,
}

enum Frame {
    Data {
        tag: u32,
        bytes: Vec<u8>,
    },
    /// The link ended; the detail says how, as a predicate of the sender.
    Closed(String),
    /// The sender broke the protocol (an oversized frame); the detail is a predicate.
    Broken(String),
}

#[derive(Default)]
struct State {
    queues: HashMap<usize, VecDeque<Frame>>,
    /// Ranks with an authenticated link into this one (one each; a second is refused).
    linked: HashSet<usize>,
    /// Clones of this rank's outgoing links, shut at the first failure.
    sending: Vec<TcpStream>,
    failed: Option<Failure>,
}

/// What this rank's reader threads and its transport share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    rank: usize,
    world: usize,
    job: TcpJob,
}

impl Shared {
    fn new(rank: usize, world: usize, job: TcpJob) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            rank,
            world,
            job,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a frame from `from`, waiting while its queue is full and the job lives.
    fn push(&self, from: usize, frame: Frame) {
        let mut state = self.lock();
        while matches!(frame, Frame::Data { .. })
            && state.failed.is_none()
            && queued(&state, from) >= self.job.max_queued
        {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.queues.entry(from).or_default().push_back(frame);
        self.changed.notify_all();
    }

    /// Records a failure unless one came first; the failure now in force, and whether it is
    /// this one.
    fn fail(&self, failure: Failure) -> (Failure, bool) {
        let mut state = self.lock();
        let first = state.failed.is_none();
        let failure = state.failed.get_or_insert(failure).clone();
        if first {
            // A send blocked on a receiver that takes nothing returns now, not after its
            // timeout; the peers see the links end and hear the cause on the control channel.
            for stream in state.sending.drain(..) {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
        self.changed.notify_all();
        (failure, first)
    }

    fn failure(&self) -> Option<TransportError> {
        self.lock().failed.as_ref().map(aborted)
    }
}

fn aborted(f: &Failure) -> TransportError {
    if f.lost {
        TransportError::Lost {
            rank: f.rank,
            detail: f.cause.clone(),
        }
    } else {
        TransportError::Aborted {
            rank: f.rank,
            cause: f.cause.clone(),
        }
    }
}

fn queued(state: &State, from: usize) -> usize {
    state.queues.get(&from).map_or(0, |q| {
        q.iter().filter(|f| matches!(f, Frame::Data { .. })).count()
    })
}

/// The TCP transport of one rank.
pub struct TcpTransport {
    peers: Vec<SocketAddr>,
    outgoing: HashMap<usize, TcpStream>,
    shared: Arc<Shared>,
    control: Control,
}

impl TcpTransport {
    /// Joins the job's `rendezvous` as `rank` of `world`, waiting at most the job's peer
    /// timeout for every rank to join.
    pub fn join(
        rank: usize,
        world: usize,
        rendezvous: &Rendezvous,
        job: TcpJob,
    ) -> Result<TcpTransport, Error> {
        let deadline = Instant::now() + job.peer_timeout;
        let name = rendezvous.name();
        let shared = Shared::new(rank, world, job);
        let (peers, control) = if rank == 0 {
            let listener = open_rendezvous(rendezvous, deadline)?;
            let own = listen(
                listener.local_addr().map_err(io_error)?.ip(),
                Arc::clone(&shared),
            )?;
            let (peers, links) = host_rendezvous(&listener, &shared, own, deadline, &name, None)?;
            (peers, Control::hub(links, &shared))
        } else {
            let master_addr = find_rendezvous(rendezvous, deadline)?;
            let (stream, peers) = register(master_addr, &shared, deadline, &name)?;
            (peers, Control::member(stream, &shared).map_err(io_error)?)
        };
        Ok(TcpTransport {
            peers,
            outgoing: HashMap::new(),
            shared,
            control,
        })
    }

    /// Tells the job that this rank failed before it could join (while it loaded its stage,
    /// say), so that every rank ends now naming `cause`, not after the peer timeout as "never
    /// joined": rank 0 opens the rendezvous only to send each rank that registers the failure
    /// (until all have come, at most the peer timeout); any other rank proves itself to rank 0
    /// and hands it the cause. `job`'s model digest is not used: a failed rank may have none.
    pub fn report_failure(
        rank: usize,
        world: usize,
        rendezvous: &Rendezvous,
        job: TcpJob,
        cause: &str,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + job.peer_timeout;
        let name = rendezvous.name();
        let job = TcpJob {
            key: job.key.failed_before_joining(),
            ..job
        };
        let shared = Shared::new(rank, world, job);
        if rank != 0 {
            let master_addr = find_rendezvous(rendezvous, deadline)?;
            return rendezvous::report(master_addr, &shared, deadline, &name, cause);
        }
        let listener = open_rendezvous(rendezvous, deadline)?;
        let own = listener.local_addr().map_err(io_error)?;
        let failure = Some(failed_before_joining(0, cause));
        // Always an error (the failure): what matters is that the ranks that came were told.
        let _ = host_rendezvous(&listener, &shared, own, deadline, &name, failure);
        Ok(())
    }

    /// The longest message this job lets cross.
    pub fn max_message(&self) -> u64 {
        self.shared.job.max_message
    }

    /// Whether rank `to` still holds the connection this rank opened to it (by sending to it):
    /// a peer that exited has closed it, which a read sees at once as its end. True where no
    /// connection was opened yet.
    pub fn peer_alive(&self, to: usize) -> bool {
        let Some(stream) = self.outgoing.get(&to) else {
            return true;
        };
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        // After the handshake peers never write on a connection they accepted: anything
        // readable is its end.
        let ended = match stream.peek(&mut [0u8; 1]) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        stream.set_nonblocking(false).is_ok() && !ended
    }

    fn connection(&mut self, to: usize) -> Result<&mut TcpStream, TransportError> {
        if !self.outgoing.contains_key(&to) {
            let stream = self.dial(to)?;
            let clone = stream
                .try_clone()
                .map_err(|e| TransportError::Failed(e.to_string()))?;
            self.shared.lock().sending.push(clone);
            self.outgoing.insert(to, stream);
        }
        Ok(self.outgoing.get_mut(&to).expect("inserted above"))
    }

    /// A link that closed: a rank that failed said why on the control channel before it
    /// exited, which may arrive a moment after the end of its data link; that first cause
    /// is the one to name.
    fn failure_behind(&self, detail: String) -> TransportError {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .changed
            .wait_timeout_while(state, CAUSE_GRACE, |s| s.failed.is_none())
            .unwrap_or_else(|p| p.into_inner());
        state
            .failed
            .as_ref()
            .map_or(TransportError::Closed(detail), aborted)
    }

    /// Opens an authenticated link to rank `to`, trying again (until the peer timeout) where
    /// the connection failed before any proof: a rank's listener drops new connections while
    /// strangers hold all its slots, for at most the handshake's time limit.
    fn dial(&self, to: usize) -> Result<TcpStream, TransportError> {
        let addr = *self
            .peers
            .get(to)
            .ok_or_else(|| TransportError::Failed("is not a rank of this job".into()))?;
        let job = &self.shared.job;
        let deadline = Instant::now() + job.peer_timeout;
        let (rank, world) = (self.shared.rank, self.shared.world);
        let mut pause = Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut stream = TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1)))
                .map_err(|e| TransportError::Closed(format!("cannot connect to {addr}: {e}")))?;
            let _ = stream.set_nodelay(true);
            let timeout = left.min(HANDSHAKE_TIMEOUT);
            match handshake(&mut stream, &job.key, Role::Dialer, rank, world, timeout) {
                Ok(peer) if peer.rank == to => {
                    // A receiver that takes nothing for the peer timeout (stopped, wedged)
                    // fails the send.
                    stream
                        .set_write_timeout(Some(job.peer_timeout))
                        .map_err(|e| TransportError::Failed(e.to_string()))?;
                    return Ok(stream);
                }
                Ok(peer) => {
                    return Err(TransportError::Failed(format!(
                        "at {addr} answered as rank {}",
                        peer.rank
                    )))
                }
                Err(Refusal::Unheard(_)) if Instant::now() + pause < deadline => {
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    return Err(TransportError::Failed(format!(
                        "at {addr} was refused: {e}"
                    )))
                }
            }
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        if let Some(failed) = self.shared.failure() {
            return Err(failed);
        }
        let timeout = self.shared.job.peer_timeout;
        let stream = self.connection(to)?;
        let mut header = tag.to_le_bytes().to_vec();
        header.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        let written = stream
            .write_all(&header)
            .and_then(|()| stream.write_all(bytes));
        written.map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                TransportError::Stalled(timeout)
            }
            _ => self.failure_behind(e.to_string()),
        })
    }

    fn recv(
        &mut self,
        from: usize,
        tag: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some(failed) = &state.failed {
                return Err(aborted(failed));
            }
            if let Some(frame) = state.queues.get_mut(&from).and_then(VecDeque::pop_front) {
                self.shared.changed.notify_all();
                drop(state);
                return match frame {
                    Frame::Data { tag: got, bytes } if got == tag => Ok(bytes),
                    Frame::Data { tag: got, .. } => {
                        Err(TransportError::WrongTag { expected: tag, got })
                    }
                    Frame::Closed(detail) => Err(self.failure_behind(detail)),
                    Frame::Broken(detail) => Err(TransportError::Failed(detail)),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout(timeout));
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn waiting(&mut self, from: usize) -> usize {
        queued(&self.shared.lock(), from)
    }

    fn abort(&mut self, cause: &str) {
        let (failure, _) = self.shared.fail(Failure {
            rank: self.shared.rank,
            cause: cause.to_string(),
            lost: false,
        });
        self.control.report(&failure);
    }

    fn finished(&mut self) {
        self.control.finished(self.shared.rank);
    }
}

impl Drop for TcpTransport {
    /// Closes the control connections as exiting would: without a goodbye first, rank 0 takes
    /// it for a failure (their reader threads hold clones, which dropping would not close).
    fn drop(&mut self) {
        self.control.close();
    }
}

fn io_error(e: std::io::Error) -> Error {
    Error::Distributed(e.to_string())
}

fn resolve(address: &str) -> Result<SocketAddr, Error> {
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            Error::Distributed(format!("cannot resolve the rendezvous address '{address}'"))
        })
}

/// Connects to `addr`, trying again while nothing listens there yet; after `deadline`, the
/// last attempt's error.
fn connect_until(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Rank 0: listens where the others will look for it (under torchrun, on a port the system
/// picks, then published in the agent's store).
fn open_rendezvous(rendezvous: &Rendezvous, deadline: Instant) -> Result<TcpListener, Error> {
    let (address, published) = match rendezvous {
        Rendezvous::At(address) => (address.clone(), None),
        Rendezvous::TorchrunStore { host, store, key } => {
            (join_host_port(host, 0), Some((store, key)))
        }
    };
    let listener = TcpListener::bind(resolve(&address)?)
        .map_err(|e| Error::Distributed(format!("rank 0 cannot listen at {address}: {e}")))?;
    if let Some((store, key)) = published {
        let own = listener.local_addr().map_err(io_error)?.to_string();
        TorchStore::connect(store, deadline)?.set(key, own.as_bytes(), deadline)?;
    }
    Ok(listener)
}

/// Any other rank: where rank 0 listens (under torchrun, once rank 0 has published it).
fn find_rendezvous(rendezvous: &Rendezvous, deadline: Instant) -> Result<SocketAddr, Error> {
    match rendezvous {
        Rendezvous::At(address) => resolve(address),
        Rendezvous::TorchrunStore { store, key, .. } => {
            let value = TorchStore::connect(store, deadline)?.wait_get(key, deadline)?;
            let text = String::from_utf8_lossy(&value);
            text.parse().map_err(|_| {
                Error::Distributed(format!(
                    "torchrun's store at {store} holds {key} = {text:?}, not an address"
                ))
            })
        }
    }
}

/// Counts a connection's thread while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections on `listener` forever, each handed to `serve` on its own thread, at
/// most `limit` at once (more are closed at once); an accept or spawn that fails (out of file
/// descriptors or threads) backs off, up to a second, instead of spinning or ending.
fn accept_forever(
    listener: TcpListener,
    limit: usize,
    serve: impl Fn(TcpStream) + Send + Sync + 'static,
) {
    let serve = Arc::new(serve);
    let busy = Arc::new(AtomicUsize::new(0));
    let mut backoff = Duration::from_millis(10);
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        if busy.fetch_add(1, Ordering::SeqCst) >= limit {
            busy.fetch_sub(1, Ordering::SeqCst);
            continue; // dropped: closed
        }
        let slot = Slot(Arc::clone(&busy));
        let serve = Arc::clone(&serve);
        let spawned = thread::Builder::new().spawn(move || {
            let _slot = slot;
            serve(stream);
        });
        if spawned.is_err() {
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        } else {
            backoff = Duration::from_millis(10);
        }
    }
}

/// Binds this rank's listener on `ip` and starts accepting peers' connections.
fn listen(ip: IpAddr, shared: Arc<Shared>) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| Error::Distributed(format!("cannot listen on {ip}: {e}")))?;
    let addr = listener.local_addr().map_err(io_error)?;
    let limit = shared.world + SPARE_CONNECTIONS;
    thread::spawn(move || accept_forever(listener, limit, move |s| read_peer(s, &shared)));
    Ok(addr)
}

/// Authenticates one incoming connection, then reads it until it ends, queueing its messages.
/// A stranger, an unknown rank or a second link from one rank is dropped unread.
fn read_peer(mut stream: TcpStream, shared: &Shared) {
    let (rank, world) = (shared.rank, shared.world);
    let key = &shared.job.key;
    let Ok(peer) = handshake(
        &mut stream,
        key,
        Role::Listener,
        rank,
        world,
        HANDSHAKE_TIMEOUT,
    ) else {
        return;
    };
    if peer.failed
        || peer.rank >= world
        || peer.rank == rank
        || !shared.lock().linked.insert(peer.rank)
    {
        return;
    }
    let ended = loop {
        match read_frame(&mut stream, shared.job.max_message) {
            Ok(Some((tag, bytes))) => shared.push(peer.rank, Frame::Data { tag, bytes }),
            Ok(None) => break Frame::Closed("the connection ended".to_string()),
            Err(frame) => break frame,
        }
    };
    shared.push(peer.rank, ended);
}

/// One frame, `None` at a clean end of the connection. Its length is checked against `max`
/// from the header, and its body is read as it arrives, never allocated ahead of it.
fn read_frame(stream: &mut TcpStream, max: u64) -> Result<Option<(u32, Vec<u8>)>, Frame> {
    let mut header = [0u8; 12];
    match stream.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Frame::Closed(e.to_string())),
    }
    let tag = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
    if len > max {
        return Err(Frame::Broken(format!(
            "sent a message of {len} bytes, over the {max} bytes the plan lets cross"
        )));
    }
    let mut bytes = Vec::new();
    let read = stream
        .take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| Frame::Closed(e.to_string()))?;
    if read as u64 != len {
        return Err(Frame::Closed(format!(
            "the connection ended {read} bytes into a message of {len}"
        )));
    }
    Ok(Some((tag, bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn job(timeout: Duration) -> TcpJob {
        TcpJob {
            key: JobKey::new(b"the test job's secret".to_vec(), [1; 32], [2; 32], "test").unwrap(),
            max_message: 1 << 20,
            max_queued: 8,
            peer_timeout: timeout,
        }
    }

    #[test]
    fn three_ranks_meet_and_exchange_ordered_messages() {
        let master = Rendezvous::At(format!("127.0.0.1:{}", free_port()));
        let second = Duration::from_secs(10);
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let master = master.clone();
                thread::spawn(move || {
                    let mut t = TcpTransport::join(rank, 3, &master, job(second)).unwrap();
                    let next = (rank + 1) % 3;
                    let prev = (rank + 2) % 3;
                    for i in 0..3u32 {
                        t.send(next, i, &vec![rank as u8; 1000 * i as usize])
                            .unwrap();
                    }
                    let got = (0..3u32)
                        .map(|i| t.recv(prev, i, second).unwrap())
                        .collect::<Vec<_>>();
                    t.finished();
                    got
                })
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            let got = h.join().unwrap();
            let prev = ((rank + 2) % 3) as u8;
            assert_eq!(
                got,
                (0..3).map(|i| vec![prev; 1000 * i]).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_missing_rank_and_a_closed_peer_are_errors_not_hangs() {
        let master = Rendezvous::At(format!("127.0.0.1:{}", free_port()));
        let err = TcpTransport::join(0, 3, &master, job(Duration::from_millis(300)))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("rank(s) 1, 2 never joined"),
            "{err}"
        );

        // A peer that ends well: its last message, then the link's end.
        let (mut t, peer) = pair(|mut t: TcpTransport| {
            t.send(0, 0, b"one").unwrap();
            t.finished();
        });
        peer.join().unwrap();
        assert_eq!(t.recv(1, 0, Duration::from_secs(10)).unwrap(), b"one");
        let closed = t.recv(1, 1, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(closed, TransportError::Closed(_)), "{closed:?}");
        // A peer that ends without its goodbye (as a killed process does) fails the job.
        let (mut t, peer) = pair(drop);
        peer.join().unwrap();
        let gone = t.recv(1, 0, Duration::from_secs(10)).unwrap_err();
        assert!(
            matches!(gone, TransportError::Lost { rank: 1, .. }),
            "{gone:?}"
        );
    }

    /// Rank 0 of a two-rank job, and the thread running rank 1 as `peer` says.
    fn pair(
        peer: impl FnOnce(TcpTransport) + Send + 'static,
    ) -> (TcpTransport, thread::JoinHandle<()>) {
        let master = Rendezvous::At(format!("127.0.0.1:{}", free_port()));
        let m = master.clone();
        let handle = thread::spawn(move || {
            peer(TcpTransport::join(1, 2, &m, job(Duration::from_secs(10))).unwrap());
        });
        let t = TcpTransport::join(0, 2, &master, job(Duration::from_secs(10))).unwrap();
        (t, handle)
    }

    #[test]
    fn a_forged_failure_report_is_ignored_and_a_real_one_arrives_as_one_bounded_line() {
        // A process with another secret reports rank 1 as failed: rank 0 does not listen to
        // it, and the job's two real ranks meet.
        let master = Rendezvous::At(format!("127.0.0.1:{}", free_port()));
        let m = master.clone();
        let stranger = thread::spawn(move || {
            let mut other = job(Duration::from_secs(3));
            let secret = b"another job's secret".to_vec();
            other.key = JobKey::new(secret, [1; 32], [2; 32], "test").unwrap();
            TcpTransport::report_failure(1, 2, &m, other, "forged")
        });
        let m = master.clone();
        let rank_1 = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            let mut t = TcpTransport::join(1, 2, &m, job(Duration::from_secs(10))).unwrap();
            t.send(0, 0, b"real").unwrap();
            t.finished();
        });
        let mut t = TcpTransport::join(0, 2, &master, job(Duration::from_secs(10))).unwrap();
        assert_eq!(t.recv(1, 0, Duration::from_secs(10)).unwrap(), b"real");
        rank_1.join().unwrap();
        assert!(stranger.join().unwrap().is_err());

        // Rank 1's own report, a megabyte with a newline and a terminal escape: one line, cut.
        let master = Rendezvous::At(format!("127.0.0.1:{}", free_port()));
        let m = master.clone();
        let reporter = thread::spawn(move || {
            let cause = format!("bad\n\x1b[2J{}", "x".repeat(1 << 20));
            TcpTransport::report_failure(1, 2, &m, job(Duration::from_secs(10)), &cause)
        });
        let joined = TcpTransport::join(0, 2, &master, job(Duration::from_secs(10)));
        let err = joined.err().unwrap().to_string();
        assert!(
            err.contains("rank 1 failed before it joined the job: bad  [2J"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1);
        assert!(
            err.len() < rendezvous::MAX_CAUSE_BYTES + 200,
            "{} bytes",
            err.len()
        );
        reporter.join().unwrap().unwrap();
    }

    #[test]
    fn a_frame_over_the_bound_is_refused_from_its_header() {
        let mut job = job(Duration::from_secs(5));
        job.max_message = 100;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut reader, _) = listener.accept().unwrap();
        let mut header = 7u32.to_le_bytes().to_vec();
        header.extend_from_slice(&(1u64 << 40).to_le_bytes());
        writer.write_all(&header).unwrap();
        let Err(Frame::Broken(detail)) = read_frame(&mut reader, job.max_message) else {
            panic!("a 1 TiB header is refused");
        };
        assert!(detail.contains("over the 100 bytes"), "{detail}");
    }
}
