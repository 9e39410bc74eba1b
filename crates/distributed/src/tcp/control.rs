//! The job's control channel: the registration connections stay open, rank 0 the hub.
//!
//! - A rank that fails sends its error line to rank 0 (`ABORT`), which relays the first
//!   failure to every rank; rank 0 relays its own.
//! - Rank 0 sends every rank a `PING` a few times per peer timeout, which the rank's control
//!   thread answers (`PONG`) as long as its process runs, busy or not. A rank whose connection
//!   closes without its goodbye (`BYE`: killed, crashed) or that stops answering for the peer
//!   timeout (stopped, hung) is lost, and rank 0 says so to every rank (`LOST`); a rank that
//!   hears nothing from rank 0 for the peer timeout takes rank 0 for lost.
//!
//! So every rank, whatever it waits for, ends within moments of a failure that is reported or
//! of a death that closes a socket, and within the peer timeout of a stop.
//!
//! Messages: `u8 kind, u32 rank, u32 length, text` (the text at most 4 KiB).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::Shared;

const ABORT: u8 = 1;
const BYE: u8 = 2;
const LOST: u8 = 3;
const PING: u8 = 4;
const PONG: u8 = 5;
/// The longest error text relayed.
const MAX_CAUSE_BYTES: usize = 4096;

/// The first failure anywhere in the job.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub rank: usize,
    /// The rank's own error line, or (`lost`) how it was seen to end, as a predicate.
    pub cause: String,
    pub lost: bool,
}

impl Failure {
    fn lost(rank: usize, how: String) -> Failure {
        Failure {
            rank,
            cause: how,
            lost: true,
        }
    }

    /// An empty message of `rank` (a goodbye, a ping, a pong).
    fn word(rank: usize) -> Failure {
        Failure {
            rank,
            cause: String::new(),
            lost: false,
        }
    }
}

/// This rank's end of the control channel.
pub(super) struct Control {
    side: Side,
    /// Set when this rank is done (finished or dropped): its threads stop pinging.
    done: Arc<AtomicBool>,
}

enum Side {
    Hub(Arc<Hub>),
    Member(Arc<Mutex<TcpStream>>),
}

/// Rank 0's writing ends of the control connections, by rank (`None` once a rank said goodbye).
struct Hub {
    links: Mutex<Vec<Option<TcpStream>>>,
}

impl Hub {
    /// Sends `kind` with `message` to every rank but `except`.
    fn broadcast(&self, kind: u8, message: &Failure, except: usize) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        for (rank, link) in links.iter_mut().enumerate() {
            if let Some(stream) = link.as_mut().filter(|_| rank != except) {
                let _ = send(stream, kind, message);
            }
        }
    }

    fn forget(&self, rank: usize) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links[rank] = None;
    }

    /// Relays `failure` to every rank but `from` where it is the job's first.
    fn relay(&self, shared: &Shared, failure: Failure, from: usize) {
        let (failure, first) = shared.fail(failure);
        if first {
            self.broadcast(ABORT, &failure, from);
        }
    }
}

/// How often rank 0 pings: four times per peer timeout, between 50 ms and a second.
fn beat(shared: &Shared) -> Duration {
    (shared.job.peer_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl Control {
    /// Rank 0: a reader thread per rank's connection and a thread that pings them.
    pub(super) fn hub(links: super::rendezvous::Links, shared: &Arc<Shared>) -> Control {
        let mut writers: Vec<Option<TcpStream>> = (0..shared.world).map(|_| None).collect();
        let mut readers = Vec::new();
        for (rank, stream) in links {
            writers[rank] = stream.try_clone().ok();
            readers.push((rank, stream));
        }
        let hub = Arc::new(Hub {
            links: Mutex::new(writers),
        });
        for (rank, stream) in readers {
            let (hub, shared) = (Arc::clone(&hub), Arc::clone(shared));
            thread::spawn(move || serve_member(rank, stream, &hub, &shared));
        }
        let done = Arc::new(AtomicBool::new(false));
        let (pinger, stop, beat) = (Arc::clone(&hub), Arc::clone(&done), beat(shared));
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                pinger.broadcast(PING, &Failure::word(0), 0);
                thread::sleep(beat);
            }
        });
        Control {
            side: Side::Hub(hub),
            done,
        }
    }

    /// Any other rank: a thread that answers rank 0's pings and hears the job's failures.
    pub(super) fn member(stream: TcpStream, shared: &Arc<Shared>) -> std::io::Result<Control> {
        let reader = stream.try_clone()?;
        let writer = Arc::new(Mutex::new(stream));
        let (answer, shared) = (Arc::clone(&writer), Arc::clone(shared));
        thread::spawn(move || watch_hub(reader, &answer, &shared));
        Ok(Control {
            side: Side::Member(writer),
            done: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Tells the job this rank failed.
    pub(super) fn report(&self, failure: &Failure) {
        match &self.side {
            Side::Hub(hub) => hub.broadcast(ABORT, failure, 0),
            Side::Member(stream) => {
                let mut stream = stream.lock().unwrap_or_else(|p| p.into_inner());
                let _ = send(&mut stream, ABORT, failure);
            }
        }
    }

    /// Says goodbye: this rank ended well.
    pub(super) fn finished(&self, rank: usize) {
        self.done.store(true, Ordering::SeqCst);
        match &self.side {
            Side::Hub(hub) => hub.broadcast(BYE, &Failure::word(rank), 0),
            Side::Member(stream) => {
                let mut stream = stream.lock().unwrap_or_else(|p| p.into_inner());
                let _ = send(&mut stream, BYE, &Failure::word(rank));
            }
        }
    }

    /// Closes the connections (for every clone, as exiting would).
    pub(super) fn close(&self) {
        self.done.store(true, Ordering::SeqCst);
        match &self.side {
            Side::Member(stream) => {
                let stream = stream.lock().unwrap_or_else(|p| p.into_inner());
                let _ = stream.shutdown(Shutdown::Both);
            }
            Side::Hub(hub) => {
                let links = hub.links.lock().unwrap_or_else(|p| p.into_inner());
                for stream in links.iter().flatten() {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

/// Rank 0's reader of `rank`'s control connection: relays its failure, its end without a
/// goodbye, or its silence for the peer timeout, to every rank.
fn serve_member(rank: usize, mut stream: TcpStream, hub: &Hub, shared: &Shared) {
    let timeout = shared.job.peer_timeout;
    let _ = stream.set_read_timeout(Some(timeout));
    let failure = loop {
        match read(&mut stream) {
            Ok((PONG, _)) => continue,
            Ok((BYE, _)) => return hub.forget(rank),
            Ok((_, failure)) => break failure,
            Err(End::Silent) => break Failure::lost(rank, silent(timeout)),
            Err(End::Closed) => {
                let how = "closed its connection to rank 0 before the job finished (it exited)";
                break Failure::lost(rank, how.into());
            }
        }
    };
    hub.forget(rank);
    hub.relay(shared, failure, rank);
}

/// Any other rank's reader of its control connection to rank 0.
fn watch_hub(mut stream: TcpStream, answer: &Mutex<TcpStream>, shared: &Shared) {
    let timeout = shared.job.peer_timeout;
    let _ = stream.set_read_timeout(Some(timeout));
    let failure = loop {
        match read(&mut stream) {
            Ok((PING, _)) => {
                let mut answer = answer.lock().unwrap_or_else(|p| p.into_inner());
                let _ = send(&mut answer, PONG, &Failure::word(shared.rank));
            }
            Ok((BYE, _)) => return,
            Ok((_, failure)) => break failure,
            Err(End::Silent) => break Failure::lost(0, silent(timeout)),
            Err(End::Closed) => {
                let how = "closed its connection before the job finished (it exited)";
                break Failure::lost(0, how.into());
            }
        }
    };
    shared.fail(failure);
}

fn silent(timeout: Duration) -> String {
    format!(
        "answered nothing on the control channel for {:.0} s (stopped or hung)",
        timeout.as_secs_f64()
    )
}

fn send(stream: &mut TcpStream, kind: u8, message: &Failure) -> std::io::Result<()> {
    let kind = if kind == ABORT && message.lost {
        LOST
    } else {
        kind
    };
    let mut cause = message.cause.as_bytes();
    if cause.len() > MAX_CAUSE_BYTES {
        cause = &cause[..MAX_CAUSE_BYTES];
    }
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(message.rank as u32).to_le_bytes());
    bytes.extend_from_slice(&(cause.len() as u32).to_le_bytes());
    bytes.extend_from_slice(cause);
    // A stopped peer must not hold the sender: its socket buffer takes this much.
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&bytes)
}

/// Why no message came.
enum End {
    /// Nothing for the read timeout.
    Silent,
    /// The connection ended, or carried something that is not a control message.
    Closed,
}

fn read(stream: &mut TcpStream) -> Result<(u8, Failure), End> {
    let ended = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => End::Silent,
        _ => End::Closed,
    };
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).map_err(ended)?;
    let rank = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    let len = u32::from_le_bytes(head[5..].try_into().expect("4 bytes")) as usize;
    if len > MAX_CAUSE_BYTES || !(ABORT..=PONG).contains(&head[0]) {
        return Err(End::Closed);
    }
    let mut cause = vec![0u8; len];
    stream.read_exact(&mut cause).map_err(ended)?;
    let failure = Failure {
        rank,
        cause: String::from_utf8_lossy(&cause).into_owned(),
        lost: head[0] == LOST,
    };
    Ok((head[0], failure))
}
