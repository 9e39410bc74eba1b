//! Messages over MPI (feature `mpi`): the transport for jobs that `mpirun` or `srun --mpi`
//! start, on the library the cluster already runs (Open MPI, MPICH and their vendor builds).
//!
//! Every message goes with MPI tag 0 and carries pipecut's own tag in its first four bytes:
//! MPI guarantees that messages from one sender on one communicator are received in the order
//! sent, which is all the pipeline needs, and MPI's tag range (at least 32,767) is smaller than
//! a step's micro-batch count may be. A receive polls `MPI_Improbe` so that it can give up
//! after the peer timeout instead of blocking forever on a rank that died.

use std::time::{Duration, Instant};

use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{Destination, Equivalence, Source};
use mpi::Rank;

use super::transport::{Transport, TransportError};
use crate::Error;

/// The MPI transport of one rank; finalizes MPI when dropped.
pub struct MpiTransport {
    world: SimpleCommunicator,
    // Dropped last: MPI_Finalize.
    _universe: mpi::environment::Universe,
}

impl MpiTransport {
    /// Initialises MPI (once per process).
    pub fn init() -> Result<MpiTransport, Error> {
        let universe = mpi::initialize().ok_or_else(|| {
            Error::Distributed("MPI was already initialised in this process".into())
        })?;
        Ok(MpiTransport {
            world: universe.world(),
            _universe: universe,
        })
    }

    fn peer(&self, rank: usize) -> mpi::topology::Process<'_> {
        self.world.process_at_rank(rank as Rank)
    }
}

impl Transport for MpiTransport {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world(&self) -> usize {
        self.world.size() as usize
    }

    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        let mut message = Vec::with_capacity(4 + bytes.len());
        message.extend_from_slice(&tag.to_le_bytes());
        message.extend_from_slice(bytes);
        // MPI's default error handler aborts the job on a failed send, so a return is success.
        self.peer(to).send(&message[..]);
        Ok(())
    }

    fn recv(
        &mut self,
        from: usize,
        tag: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(10);
        loop {
            if let Some((message, status)) = self.peer(from).immediate_matched_probe() {
                let count = status.count(u8::equivalent_datatype());
                let mut bytes = Vec::new();
                bytes
                    .try_reserve_exact(count.max(0) as usize)
                    .map_err(|_| TransportError::Failed(format!("no memory for {count} bytes")))?;
                bytes.resize(count.max(0) as usize, 0u8);
                message.matched_receive_into(&mut bytes[..]);
                if bytes.len() < 4 {
                    return Err(TransportError::Failed(format!(
                        "sent a message of {} bytes, too short to carry a tag",
                        bytes.len()
                    )));
                }
                let got = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
                if got != tag {
                    return Err(TransportError::WrongTag { expected: tag, got });
                }
                return Ok(bytes[4..].to_vec());
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Timeout(timeout));
            }
            // Poll quickly while a message is likely close, then back off to a millisecond.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn waiting(&mut self, from: usize) -> usize {
        usize::from(self.peer(from).immediate_probe().is_some())
    }

    fn abort(&mut self, cause: &str) {
        // MPI_Abort ends every rank of the job and does not return: say why first.
        eprintln!("error: {cause}");
        self.world.abort(1)
    }
}
