//! What the pipeline needs from the machinery that moves bytes between processes: ordered,
//! tagged point-to-point messages, a receive that gives up after a timeout, and a word on how
//! many messages already wait. MPI (`mpi_transport.rs`, feature `mpi`) and TCP (`tcp.rs`, for
//! `torchrun` and builds without MPI) implement it.

use std::time::Duration;

/// Why a message did not arrive or leave.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportError {
    /// The peer closed its end (it exited or failed); the detail says how it was seen.
    Closed(String),
    /// Nothing came within the timeout.
    Timeout(Duration),
    /// The message came with another tag than the one expected (the peers disagree on the
    /// schedule, a bug or two different plans).
    WrongTag {
        /// The tag the receiver expected.
        expected: u32,
        /// The tag that came.
        got: u32,
    },
    /// The receiver took nothing sent to it for this long (stopped or wedged).
    Stalled(Duration),
    /// The job failed: `rank` reported `cause` (its own error line).
    Aborted {
        /// The rank that failed first.
        rank: usize,
        /// What it said.
        cause: String,
    },
    /// The job failed: rank `rank` was lost (`detail` says how, as a predicate).
    Lost {
        /// The rank that was lost first.
        rank: usize,
        /// How it was seen to end.
        detail: String,
    },
    /// Anything else the transport reports.
    Failed(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Closed(detail) => write!(f, "closed its connection ({detail})"),
            TransportError::Timeout(t) => write!(f, "sent nothing for {:.0} s", t.as_secs_f64()),
            TransportError::WrongTag { expected, got } => {
                write!(f, "sent message {got} where {expected} was expected")
            }
            TransportError::Stalled(t) => {
                write!(f, "took nothing sent to it for {:.0} s", t.as_secs_f64())
            }
            TransportError::Aborted { rank, cause } => write!(f, "rank {rank} failed: {cause}"),
            TransportError::Lost { rank, detail } => write!(f, "rank {rank} {detail}"),
            TransportError::Failed(detail) => f.write_str(detail),
        }
    }
}

/// Point-to-point messages between the ranks of a job.
pub trait Transport {
    /// The transport's name in reports (`tcp`, `mpi`).
    fn name(&self) -> &'static str;

    /// This process's rank.
    fn rank(&self) -> usize;

    /// How many ranks the job has.
    fn world(&self) -> usize;

    /// Sends `bytes` to rank `to` under `tag`; messages to one rank arrive in the order sent.
    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError>;

    /// The next message from rank `from`, which must carry `tag`; waits at most `timeout`.
    fn recv(&mut self, from: usize, tag: u32, timeout: Duration)
        -> Result<Vec<u8>, TransportError>;

    /// Messages from `from` that have arrived and not been received yet (a lower bound where
    /// the transport cannot count them all).
    fn waiting(&mut self, from: usize) -> usize;

    /// Ends the whole job after this rank failed with `cause` (its one-line error): TCP tells
    /// every rank through rank 0, MPI calls MPI_Abort; by default nothing, and peers see this
    /// process's connections close when it exits.
    fn abort(&mut self, _cause: &str) {}

    /// Says this rank ended well (after the collector's acknowledgement), so that its
    /// connections closing next is not taken for a failure.
    fn finished(&mut self) {}
}
