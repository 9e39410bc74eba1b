//! The `ai.pipecut` collectives (AllReduce, AllGather, ReduceScatter) of a tensor-parallel group
//! whose ranks are processes: each rank sends its contribution to every other rank of its group
//! over the job's transport and receives theirs, then combines all of them in rank order, as
//! the thread group does once for all ([`pipecut_runtime::tensor_parallel`]), so every rank gets
//! the bits the one-process run gets.
//!
//! The pipeline and the collectives share one transport: [`SharedTransport`] lends it to each
//! in turn (the rank loop between micro-batches, the kernels inside a stage's run), one call at
//! a time on the rank's one thread.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::transport::{Transport, TransportError};
use super::{wire, Place, RankLayout};
use pipecut_runtime::tensor::HostTensor;
use pipecut_runtime::tensor_parallel::Collectives;
use pipecut_runtime::Tensors;

/// Tags of collective messages: the high bit set, so that they never read as a micro-batch's
/// (a micro-batch tag is below the schedule's cap, far under 2³¹), and the DONE / ACK tags
/// (the top two) stay apart.
const COLLECTIVE_TAG: u32 = 1 << 31;
const COLLECTIVE_TAGS: u32 = (1 << 30) - 1;

/// One transport used by the rank loop and the collectives of one thread.
#[derive(Clone)]
pub struct SharedTransport(Rc<RefCell<Box<dyn Transport>>>);

impl SharedTransport {
    /// Shares `transport`.
    pub fn new(transport: Box<dyn Transport>) -> SharedTransport {
        SharedTransport(Rc::new(RefCell::new(transport)))
    }
}

impl Transport for SharedTransport {
    fn name(&self) -> &'static str {
        self.0.borrow().name()
    }

    fn rank(&self) -> usize {
        self.0.borrow().rank()
    }

    fn world(&self) -> usize {
        self.0.borrow().world()
    }

    fn send(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        self.0.borrow_mut().send(to, tag, bytes)
    }

    fn recv(
        &mut self,
        from: usize,
        tag: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        self.0.borrow_mut().recv(from, tag, timeout)
    }

    fn waiting(&mut self, from: usize) -> usize {
        self.0.borrow_mut().waiting(from)
    }

    fn abort(&mut self, cause: &str) {
        self.0.borrow_mut().abort(cause);
    }

    fn finished(&mut self) {
        self.0.borrow_mut().finished();
    }
}

/// This process's rank of a tensor-parallel group whose other ranks are processes of the job.
pub struct TransportGroup {
    transport: SharedTransport,
    /// The job ranks of the group, in TP rank order.
    members: Vec<usize>,
    /// The job's layout, which names ranks in errors.
    layout: RankLayout,
    /// This process's TP rank (its index in `members`).
    me: usize,
    /// Collectives completed, numbering the next one's messages.
    done: Cell<u32>,
    timeout: Duration,
}

impl TransportGroup {
    /// The rank at `place` of `layout`, in its stage group, talking over `transport`, waiting
    /// at most `timeout` for a peer's contribution.
    pub fn new(
        transport: SharedTransport,
        layout: &RankLayout,
        place: Place,
        timeout: Duration,
    ) -> TransportGroup {
        let members = layout.group_of(place);
        TransportGroup {
            transport,
            layout: *layout,
            members,
            me: place.tp_rank,
            done: Cell::new(0),
            timeout,
        }
    }

    /// Sends `bytes` to `peer` and receives its bytes, the lower job rank sending first (which
    /// keeps a transport whose sends wait for the receive, as MPI's may, from deadlocking).
    fn swap(&self, tp_rank: usize, tag: u32, bytes: &[u8]) -> Result<Vec<u8>, String> {
        let mut transport = self.transport.clone();
        let peer = self.members[tp_rank];
        let lost = |e: TransportError| super::peer_failed(&self.layout, peer, &e);
        let own = self.members[self.me];
        if own < peer {
            transport.send(peer, tag, bytes).map_err(lost)?;
            transport.recv(peer, tag, self.timeout).map_err(lost)
        } else {
            let theirs = transport.recv(peer, tag, self.timeout).map_err(lost)?;
            transport.send(peer, tag, bytes).map_err(lost)?;
            Ok(theirs)
        }
    }
}

impl Collectives for TransportGroup {
    fn size(&self) -> usize {
        self.members.len()
    }

    fn rank(&self) -> usize {
        self.me
    }

    fn contribute(
        &self,
        x: &HostTensor,
        combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
    ) -> Result<HostTensor, String> {
        let tag = COLLECTIVE_TAG | (self.done.get() & COLLECTIVE_TAGS);
        self.done.set(self.done.get().wrapping_add(1));
        let own: Tensors = [("x".to_string(), Arc::new(x.clone()))].into();
        let bytes = wire::encode(&own);
        let mut parts = Vec::with_capacity(self.members.len());
        for tp_rank in 0..self.members.len() {
            if tp_rank == self.me {
                parts.push(x.clone());
                continue;
            }
            let received = self.swap(tp_rank, tag, &bytes)?;
            let name = &self.layout.describe(self.members[tp_rank]);
            let tensors = wire::decode(&received, name).map_err(|e| e.to_string())?;
            let part = tensors
                .get("x")
                .ok_or_else(|| format!("{name} sent no tensor to a collective"))?;
            parts.push((**part).clone());
        }
        combine(&parts)
    }
}
