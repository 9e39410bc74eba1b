//! Messages over TCP, for jobs started by `torchrun` or `srun` without MPI: rank 0 listens at
//! `MASTER_ADDR:MASTER_PORT`, every rank registers the address of its own listener there and
//! receives everyone's (the rendezvous `torch.distributed`'s TCP store also does), then a rank
//! opens a connection to a peer the first time it sends to it.
//!
//! Each incoming connection has a reader thread that queues whole messages per sender, so a
//! stage's next input arrives while it computes; a connection that ends is queued as a
//! `Closed` marker, so a peer that died is an error at the next receive, not a hang.
//!
//! Frames: `hello = b"PCUT", u32 rank` once per connection, then `u32 tag, u64 length, bytes`.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::transport::{Transport, TransportError};
use crate::Error;

const MAGIC: &[u8; 4] = b"PCUT";
/// The largest message accepted: a stage boundary of 64 GiB is beyond any CPU stage's memory,
/// and a corrupt length must not become an allocation.
pub(super) const MAX_MESSAGE_BYTES: u64 = 64 << 30;

enum Frame {
    Data { tag: u32, bytes: Vec<u8> },
    Closed(String),
}

/// Whole messages received, per sending rank.
#[derive(Default)]
struct Inboxes {
    queues: Mutex<HashMap<usize, VecDeque<Frame>>>,
    arrived: Condvar,
}

impl Inboxes {
    fn push(&self, from: usize, frame: Frame) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(from).or_default().push_back(frame);
        self.arrived.notify_all();
    }
}

/// The TCP transport of one rank.
pub struct TcpTransport {
    rank: usize,
    world: usize,
    peers: Vec<SocketAddr>,
    outgoing: HashMap<usize, TcpStream>,
    inboxes: Arc<Inboxes>,
    connect_timeout: Duration,
}

impl TcpTransport {
    /// Joins the job's rendezvous at `master` (`host:port`) as `rank` of `world`, waiting at
    /// most `timeout` for every rank to join.
    pub fn join(
        rank: usize,
        world: usize,
        master: &str,
        timeout: Duration,
    ) -> Result<TcpTransport, Error> {
        let deadline = Instant::now() + timeout;
        let master_addr = resolve(master)?;
        let inboxes = Arc::new(Inboxes::default());
        let peers = if rank == 0 {
            let rendezvous = TcpListener::bind(master_addr).map_err(|e| {
                Error::Distributed(format!("rank 0 cannot listen at {master}: {e}"))
            })?;
            let own = listen(master_addr.ip(), Arc::clone(&inboxes))?;
            host_rendezvous(&rendezvous, world, own, deadline, master)?
        } else {
            let mut stream = connect_until(master_addr, deadline, master)?;
            let ip = stream.local_addr().map_err(io_error)?.ip();
            let own = listen(ip, Arc::clone(&inboxes))?;
            register(&mut stream, rank, world, own, deadline, master)?
        };
        Ok(TcpTransport {
            rank,
            world,
            peers,
            outgoing: HashMap::new(),
            inboxes,
            connect_timeout: timeout,
        })
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
        // Peers never write on a connection they accepted: anything readable is its end.
        let ended = match stream.peek(&mut [0u8; 1]) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        stream.set_nonblocking(false).is_ok() && !ended
    }

    fn connection(&mut self, to: usize) -> Result<&mut TcpStream, TransportError> {
        if !self.outgoing.contains_key(&to) {
            let addr = self.peers[to];
            let mut stream = TcpStream::connect_timeout(&addr, self.connect_timeout)
                .map_err(|e| TransportError::Closed(format!("cannot connect to {addr}: {e}")))?;
            let _ = stream.set_nodelay(true);
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&(self.rank as u32).to_le_bytes());
            stream
                .write_all(&hello)
                .map_err(|e| TransportError::Closed(e.to_string()))?;
            self.outgoing.insert(to, stream);
        }
        Ok(self.outgoing.get_mut(&to).expect("inserted above"))
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        let stream = self.connection(to)?;
        let mut header = tag.to_le_bytes().to_vec();
        header.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        stream
            .write_all(&header)
            .and_then(|()| stream.write_all(bytes))
            .map_err(|e| TransportError::Closed(e.to_string()))
    }

    fn recv(
        &mut self,
        from: usize,
        tag: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let deadline = Instant::now() + timeout;
        let mut queues = self
            .inboxes
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(frame) = queues.get_mut(&from).and_then(VecDeque::pop_front) {
                return match frame {
                    Frame::Data { tag: got, bytes } if got == tag => Ok(bytes),
                    Frame::Data { tag: got, .. } => {
                        Err(TransportError::WrongTag { expected: tag, got })
                    }
                    Frame::Closed(detail) => Err(TransportError::Closed(detail)),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout(timeout));
            }
            queues = self
                .inboxes
                .arrived
                .wait_timeout(queues, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn waiting(&mut self, from: usize) -> usize {
        let queues = self
            .inboxes
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        queues.get(&from).map_or(0, |q| {
            q.iter().filter(|f| matches!(f, Frame::Data { .. })).count()
        })
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

/// Binds this rank's listener on `ip` and starts accepting peers' connections.
fn listen(ip: IpAddr, inboxes: Arc<Inboxes>) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| Error::Distributed(format!("cannot listen on {ip}: {e}")))?;
    let addr = listener.local_addr().map_err(io_error)?;
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let inboxes = Arc::clone(&inboxes);
            thread::spawn(move || read_peer(stream, &inboxes));
        }
    });
    Ok(addr)
}

/// Reads one peer's connection until it ends, queueing its messages.
fn read_peer(mut stream: TcpStream, inboxes: &Inboxes) {
    let mut hello = [0u8; 8];
    if stream.read_exact(&mut hello).is_err() || &hello[..4] != MAGIC {
        return; // not a pipecut rank: ignore it
    }
    let from = u32::from_le_bytes(hello[4..].try_into().expect("4 bytes")) as usize;
    let ended = loop {
        match read_frame(&mut stream) {
            Ok(Some((tag, bytes))) => inboxes.push(from, Frame::Data { tag, bytes }),
            Ok(None) => break "the connection ended".to_string(),
            Err(e) => break e,
        }
    };
    inboxes.push(from, Frame::Closed(ended));
}

/// One frame, `None` at a clean end of the connection.
fn read_frame(stream: &mut TcpStream) -> Result<Option<(u32, Vec<u8>)>, String> {
    let mut header = [0u8; 12];
    match stream.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let tag = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
    if len > MAX_MESSAGE_BYTES {
        return Err(format!(
            "a message of {len} bytes, over the limit of {MAX_MESSAGE_BYTES}"
        ));
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| format!("no memory for a message of {len} bytes"))?;
    bytes.resize(len as usize, 0);
    stream.read_exact(&mut bytes).map_err(|e| e.to_string())?;
    Ok(Some((tag, bytes)))
}

/// Rank 0: waits for every other rank's registration, then sends everyone the table.
fn host_rendezvous(
    rendezvous: &TcpListener,
    world: usize,
    own: SocketAddr,
    deadline: Instant,
    master: &str,
) -> Result<Vec<SocketAddr>, Error> {
    let mut peers: Vec<Option<SocketAddr>> = vec![None; world];
    peers[0] = Some(own);
    let mut joined: Vec<TcpStream> = Vec::new();
    rendezvous.set_nonblocking(true).map_err(io_error)?;
    while peers.iter().any(Option::is_none) {
        match rendezvous.accept() {
            Ok((mut stream, from)) => {
                stream.set_nonblocking(false).map_err(io_error)?;
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(io_error)?;
                let Ok((rank, their_world, port)) = read_registration(&mut stream) else {
                    continue; // a stray connection, not a rank
                };
                if their_world != world {
                    return Err(Error::Distributed(format!(
                        "rank {rank} was started with {their_world} ranks, rank 0 with {world}"
                    )));
                }
                if rank == 0 || rank >= world || peers[rank].is_some() {
                    return Err(Error::Distributed(format!(
                        "rank {rank} joined the rendezvous at {master} twice or out of range"
                    )));
                }
                peers[rank] = Some(SocketAddr::new(from.ip(), port));
                joined.push(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (0..world)
                        .filter(|&r| peers[r].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    return Err(Error::Distributed(format!(
                        "rank(s) {} never joined the rendezvous at {master}",
                        missing.join(", ")
                    )));
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    let peers: Vec<SocketAddr> = peers.into_iter().map(|p| p.expect("all joined")).collect();
    let table = encode_table(&peers);
    for mut stream in joined {
        stream.write_all(&table).map_err(io_error)?;
    }
    Ok(peers)
}

fn read_registration(stream: &mut TcpStream) -> std::io::Result<(usize, usize, u16)> {
    let mut b = [0u8; 14];
    stream.read_exact(&mut b)?;
    if &b[..4] != MAGIC {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let rank = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let world = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
    Ok((rank, world, u16::from_le_bytes([b[12], b[13]])))
}

/// Any other rank: registers with rank 0 and reads back every rank's address.
fn register(
    stream: &mut TcpStream,
    rank: usize,
    world: usize,
    own: SocketAddr,
    deadline: Instant,
    master: &str,
) -> Result<Vec<SocketAddr>, Error> {
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    hello.extend_from_slice(&own.port().to_le_bytes());
    stream.write_all(&hello).map_err(io_error)?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(wait)).map_err(io_error)?;
    let mut table = Vec::new();
    stream.read_to_end(&mut table).map_err(|e| {
        Error::Distributed(format!(
            "rank 0 at {master} sent no table of ranks ({e}): did every rank start?"
        ))
    })?;
    decode_table(&table, world).ok_or_else(|| {
        Error::Distributed(format!(
            "the rendezvous at {master} closed before every rank joined (rank 0 failed?)"
        ))
    })
}

fn encode_table(peers: &[SocketAddr]) -> Vec<u8> {
    let text: Vec<String> = peers.iter().map(SocketAddr::to_string).collect();
    text.join("\n").into_bytes()
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
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Distributed(format!(
                    "rank 0 never opened the rendezvous at {master}: {e}"
                )))
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
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

    #[test]
    fn three_ranks_meet_and_exchange_ordered_messages() {
        let master = format!("127.0.0.1:{}", free_port());
        let second = Duration::from_secs(10);
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let master = master.clone();
                thread::spawn(move || {
                    let mut t = TcpTransport::join(rank, 3, &master, second).unwrap();
                    let next = (rank + 1) % 3;
                    let prev = (rank + 2) % 3;
                    for i in 0..3u32 {
                        t.send(next, i, &vec![rank as u8; 1000 * i as usize])
                            .unwrap();
                    }
                    (0..3u32)
                        .map(|i| t.recv(prev, i, second).unwrap())
                        .collect::<Vec<_>>()
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
        let master = format!("127.0.0.1:{}", free_port());
        let err = TcpTransport::join(0, 3, &master, Duration::from_millis(300))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("rank(s) 1, 2 never joined"),
            "{err}"
        );

        let master = format!("127.0.0.1:{}", free_port());
        let m = master.clone();
        let peer = thread::spawn(move || {
            let mut t = TcpTransport::join(1, 2, &m, Duration::from_secs(10)).unwrap();
            t.send(0, 0, b"one").unwrap();
            // Dropped here: the connection closes.
        });
        let mut t = TcpTransport::join(0, 2, &master, Duration::from_secs(10)).unwrap();
        peer.join().unwrap();
        assert_eq!(t.recv(1, 0, Duration::from_secs(10)).unwrap(), b"one");
        let closed = t.recv(1, 1, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(closed, TransportError::Closed(_)), "{closed:?}");
        let nothing = t.recv(1, 1, Duration::from_millis(50)).unwrap_err();
        assert_eq!(nothing, TransportError::Timeout(Duration::from_millis(50)));
    }
}
