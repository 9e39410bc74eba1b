//! The rendezvous: rank 0 listens at the job's address, every other rank proves itself there
//! (and rank 0 to it), registers its own listener's port and reads back every rank's address.
//! The registration connections then carry the job's control channel ([`super::control`]).
//!
//! A rank that fails before it can join (loading its stage's weights, say) still comes, its
//! hello flagged as failed, and hands rank 0 its cause; rank 0 then sends every rank that registers the
//! cause in place of the table, so the whole job ends at once naming it rather than after the
//! peer timeout as "never joined". Rank 0 failing so serves the rendezvous only to say why.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use super::{io_error, listen, Shared, Slot, HANDSHAKE_TIMEOUT, SPARE_CONNECTIONS};
use crate::auth::{handshake, Peer, Refusal, Role};
use crate::Error;

/// The registration connections, by rank: the control channel's links.
pub(super) type Links = Vec<(usize, TcpStream)>;

/// What a rank that proved it belongs to the job brought to the rendezvous.
enum Arrival {
    /// Its listener's port: it joins.
    Port(u16),
    /// Why it failed before it could join.
    Failed(String),
}

/// A rank that proved it belongs to the job at the rendezvous, and what it brought.
type Registration = Result<(Peer, TcpStream, Arrival), Refusal>;

/// Rank 0: waits for every other rank's registration, then sends everyone the table. Gives the
/// table and the registration connections (the control channel). With `failure` (rank 0's
/// own, before it could join), or once a rank reports one, every rank that registered or
/// registers is sent the failure instead, and the job's error is that failure once every rank
/// has come (or the peer timeout passed).
pub(super) fn host_rendezvous(
    rendezvous: &TcpListener,
    shared: &Arc<Shared>,
    own: SocketAddr,
    deadline: Instant,
    master: &str,
    mut failure: Option<String>,
) -> Result<(Vec<SocketAddr>, Links), Error> {
    let world = shared.world;
    let mut peers: Vec<Option<SocketAddr>> = vec![None; world];
    peers[0] = Some(own);
    let mut joined: Links = Vec::new();
    let (sender, registrations) = mpsc::channel::<Registration>();
    let in_flight = Arc::new(AtomicUsize::new(0));
    rendezvous.set_nonblocking(true).map_err(io_error)?;
    while peers.iter().any(Option::is_none) {
        if let Ok(registration) = registrations.try_recv() {
            let (peer, stream, arrival) = match registration {
                Ok(joined) => joined,
                Err(Refusal::Mismatch(detail)) => {
                    return Err(Error::Distributed(format!("rank 0 at {master}: {detail}")))
                }
                // Not a rank of this job: ignored.
                Err(Refusal::Stranger(_) | Refusal::Unheard(_) | Refusal::JobFailed(_)) => continue,
            };
            let from = stream.peer_addr().map_err(io_error)?;
            if peer.rank == 0 || peer.rank >= world || peers[peer.rank].is_some() {
                return Err(Error::Distributed(format!(
                    "rank {} joined the rendezvous at {master} twice or out of range",
                    peer.rank
                )));
            }
            let port = match arrival {
                Arrival::Port(port) => port,
                Arrival::Failed(cause) => {
                    failure.get_or_insert_with(|| failed_before_joining(peer.rank, &cause));
                    0
                }
            };
            peers[peer.rank] = Some(SocketAddr::new(from.ip(), port));
            joined.push((peer.rank, stream));
            if let Some(failure) = &failure {
                // Told at once: these ranks end now, the others as they come.
                for (_, mut stream) in joined.drain(..) {
                    let _ = stream.write_all(&encode_failure(failure));
                }
            }
            continue;
        }
        match rendezvous.accept() {
            Ok((stream, _)) => authenticate_member(stream, shared, &sender, &in_flight),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(match failure {
                        Some(failure) => Error::Distributed(failure),
                        None => never_joined(&peers, master),
                    });
                }
                thread::sleep(Duration::from_millis(5));
            }
            // Out of descriptors or a connection reset before it was taken: wait, go on.
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
    if let Some(failure) = failure {
        return Err(Error::Distributed(failure));
    }
    let peers: Vec<SocketAddr> = peers.into_iter().map(|p| p.expect("all joined")).collect();
    let table = encode_table(&peers);
    for (_, stream) in &mut joined {
        stream.write_all(&table).map_err(io_error)?;
    }
    Ok((peers, joined))
}

/// The job's error when rank `rank` failed before it could join.
pub(super) fn failed_before_joining(rank: usize, cause: &str) -> String {
    format!("rank {rank} failed before it joined the job: {cause}")
}

fn never_joined(peers: &[Option<SocketAddr>], master: &str) -> Error {
    let missing: Vec<String> = (0..peers.len())
        .filter(|&r| peers[r].is_none())
        .map(|r| r.to_string())
        .collect();
    Error::Distributed(format!(
        "rank(s) {} never joined the rendezvous at {master}",
        missing.join(", ")
    ))
}

/// In place of the table's length: the job failed before it started, and a cause follows.
const FAILED: u32 = u32::MAX;
/// The longest cause a rank reads: a one-line error, cut where longer.
pub(super) const MAX_CAUSE_BYTES: usize = 4096;

/// A cause as it crosses: its length, then its bytes (cut at [`MAX_CAUSE_BYTES`]).
fn encode_cause(cause: &str) -> Vec<u8> {
    let mut end = cause.len().min(MAX_CAUSE_BYTES);
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = (end as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&cause.as_bytes()[..end]);
    out
}

/// What rank 0 sends a registered rank in place of the table when the job failed.
fn encode_failure(failure: &str) -> Vec<u8> {
    let mut out = FAILED.to_le_bytes().to_vec();
    out.extend_from_slice(&encode_cause(failure));
    out
}

fn read_cause(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_CAUSE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a cause of {len} bytes"),
        ));
    }
    let mut cause = vec![0u8; len];
    stream.read_exact(&mut cause)?;
    // Printed on a terminal by the ranks it reaches: one line, no control characters.
    Ok(String::from_utf8_lossy(&cause)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect())
}

/// Runs a registration's handshake on a thread of its own (a silent connection must not hold
/// the rendezvous), at most `world + SPARE_CONNECTIONS` at once.
fn authenticate_member(
    mut stream: TcpStream,
    shared: &Arc<Shared>,
    registrations: &mpsc::Sender<Registration>,
    in_flight: &Arc<AtomicUsize>,
) {
    if in_flight.fetch_add(1, Ordering::SeqCst) >= shared.world + SPARE_CONNECTIONS {
        in_flight.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let slot = Slot(Arc::clone(in_flight));
    let (shared, registrations) = (Arc::clone(shared), registrations.clone());
    let _ = thread::Builder::new().spawn(move || {
        let _slot = slot;
        let registration = (|| {
            stream
                .set_nonblocking(false)
                .map_err(|e| Refusal::Stranger(e.to_string()))?;
            let (world, key) = (shared.world, &shared.job.key);
            let peer = handshake(
                &mut stream,
                key,
                Role::Listener,
                0,
                world,
                HANDSHAKE_TIMEOUT,
            )?;
            let mut port = [0u8; 2];
            stream
                .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                .map_err(|e| Refusal::Stranger(e.to_string()))?;
            let arrival = if peer.failed {
                read_cause(&mut stream).map(Arrival::Failed)
            } else {
                stream
                    .read_exact(&mut port)
                    .map(|()| Arrival::Port(u16::from_le_bytes(port)))
            };
            let arrival = arrival
                .and_then(|a| stream.set_read_timeout(None).map(|()| a))
                .map_err(|e| Refusal::Stranger(e.to_string()))?;
            Ok((peer, stream, arrival))
        })();
        let _ = registrations.send(registration);
    });
}

/// Any other rank: connects to rank 0's rendezvous (again where the connection failed
/// before any proof, as [`TcpTransport::dial`] does), opens its own listener, and registers
/// it; gives the control connection and every rank's address.
pub(super) fn register(
    master_addr: SocketAddr,
    shared: &Arc<Shared>,
    deadline: Instant,
    master: &str,
) -> Result<(TcpStream, Vec<SocketAddr>), Error> {
    let mut pause = Duration::from_millis(50);
    let mut own = None;
    loop {
        let mut stream = connect_until(master_addr, deadline, master)?;
        let own = match own {
            Some(addr) => addr,
            None => {
                let ip = stream.local_addr().map_err(io_error)?.ip();
                *own.insert(listen(ip, Arc::clone(shared))?)
            }
        };
        match join_rank_0(&mut stream, shared, own, deadline, master) {
            Ok(peers) => return Ok((stream, peers)),
            Err(Refusal::Unheard(_)) if Instant::now() + pause < deadline => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(refusal) => return Err(refused_by_rank_0(refusal, shared.rank, master)),
        }
    }
}

/// The error of a rank that rank 0 did not let join.
fn refused_by_rank_0(refusal: Refusal, rank: usize, master: &str) -> Error {
    Error::Distributed(match refusal {
        Refusal::Unheard(detail) | Refusal::Stranger(detail) => {
            format!("the process at the rendezvous {master} is not rank 0 of this job: {detail}")
        }
        Refusal::Mismatch(detail) => format!("rank {rank}: {detail}"),
        Refusal::JobFailed(failure) => failure,
    })
}

/// A rank that failed before it could join (its key says so): proves itself to rank 0 and
/// hands it `cause` (trying again while rank 0 is not there yet, until `deadline`).
pub(super) fn report(
    master_addr: SocketAddr,
    shared: &Arc<Shared>,
    deadline: Instant,
    master: &str,
    cause: &str,
) -> Result<(), Error> {
    let mut pause = Duration::from_millis(50);
    loop {
        let mut stream = connect_until(master_addr, deadline, master)?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let (rank, world) = (shared.rank, shared.world);
        let (key, wait) = (&shared.job.key, left.min(HANDSHAKE_TIMEOUT));
        match handshake(&mut stream, key, Role::Dialer, rank, world, wait) {
            Ok(_) => {
                stream
                    .write_all(&encode_cause(cause))
                    .and_then(|()| stream.flush())
                    .map_err(io_error)?;
                // Held until rank 0 has read it (and closes, having told the others).
                let _ = stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
                let _ = stream.read(&mut [0u8; 1]);
                return Ok(());
            }
            Err(Refusal::Unheard(_)) if Instant::now() + pause < deadline => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(refusal) => return Err(refused_by_rank_0(refusal, rank, master)),
        }
    }
}

/// Proves this rank to rank 0 (and rank 0 to it), registers its listener's port and reads
/// back every rank's address.
fn join_rank_0(
    stream: &mut TcpStream,
    shared: &Shared,
    own: SocketAddr,
    deadline: Instant,
    master: &str,
) -> Result<Vec<SocketAddr>, Refusal> {
    let (rank, world) = (shared.rank, shared.world);
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let wait = left().min(HANDSHAKE_TIMEOUT);
    let peer = handshake(stream, &shared.job.key, Role::Dialer, rank, world, wait)?;
    let fatal = |detail: String| Refusal::Mismatch(detail);
    if peer.rank != 0 {
        return Err(Refusal::Stranger(format!(
            "it says it is rank {}",
            peer.rank
        )));
    }
    stream
        .write_all(&own.port().to_le_bytes())
        .and_then(|()| stream.set_read_timeout(Some(left())))
        .map_err(|e| fatal(e.to_string()))?;
    let table = read_table(stream, world).map_err(|e| match e {
        TableError::JobFailed(failure) => Refusal::JobFailed(failure),
        TableError::Io(e) => fatal(format!(
            "rank 0 at {master} sent no table of ranks ({e}): did every rank start?"
        )),
    })?;
    stream
        .set_read_timeout(None)
        .map_err(|e| fatal(e.to_string()))?;
    decode_table(&table, world).ok_or_else(|| {
        fatal(format!(
            "the rendezvous at {master} sent a table that is not {world} addresses"
        ))
    })
}

/// The longest address in the table: `[IPv6%scope]:port`.
const MAX_ADDRESS_BYTES: usize = 64;

fn encode_table(peers: &[SocketAddr]) -> Vec<u8> {
    let text: Vec<String> = peers.iter().map(SocketAddr::to_string).collect();
    let text = text.join("\n").into_bytes();
    let mut out = (text.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out
}

/// Why no table came.
enum TableError {
    /// Rank 0 sent the job's failure instead.
    JobFailed(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for TableError {
    fn from(e: std::io::Error) -> TableError {
        TableError::Io(e)
    }
}

/// The table's bytes, at most what `world` addresses can take.
fn read_table(stream: &mut TcpStream, world: usize) -> Result<Vec<u8>, TableError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len == FAILED {
        return Err(TableError::JobFailed(read_cause(stream)?));
    }
    let len = len as usize;
    if len > world * (MAX_ADDRESS_BYTES + 1) {
        return Err(TableError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a table of {len} bytes for {world} ranks"),
        )));
    }
    let mut table = vec![0u8; len];
    stream.read_exact(&mut table)?;
    Ok(table)
}

fn decode_table(bytes: &[u8], world: usize) -> Option<Vec<SocketAddr>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let peers: Vec<SocketAddr> = text
        .lines()
        .map(|l| l.parse().ok())
        .collect::<Option<_>>()?;
    (peers.len() == world).then_some(peers)
}

/// Connects to rank 0's rendezvous, retrying while rank 0 is still starting.
fn connect_until(addr: SocketAddr, deadline: Instant, master: &str) -> Result<TcpStream, Error> {
    super::connect_until(addr, deadline).map_err(|e| {
        Error::Distributed(format!(
            "rank 0 never opened the rendezvous at {master}: {e}"
        ))
    })
}
