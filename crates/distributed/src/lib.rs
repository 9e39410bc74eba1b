//! # pipecut-distributed
//!
//! Running a plan as many processes: one rank per (replica, stage), messages between them.
//!
//! ```text
//! launcher env ─▶ Launch ─▶ Transport (MPI, TCP or NCCL) ─┐
//! plan + model ─▶ StageSpec of this rank's stage ───┴▶ run_rank ─▶ outputs on the collector
//! ```
//!
//! Rank `r` runs tensor-parallel rank `r mod t` of stage `(r / t) mod K` of replica `r / (t·K)`
//! (t ranks per stage group, K stages, D replicas, `t·K·D` ranks; t = 1 without tensor
//! parallelism, where rank `r` is stage `r mod K` of replica `r / K`). The
//! step's micro-batches are split into D contiguous blocks, one per replica, exactly as the
//! one-process run numbers them, so every micro-batch sees the same rows and kernels as there
//! and the outputs are bit-for-bit the same. Stage 0 of a replica splits the inputs; stage k
//! receives micro-batch i from stage k − 1 (tag i), runs it and sends it on; the last stage of
//! every replica sends its outputs to the *collector* (the last stage of replica 0), which
//! joins them in micro-batch order and hands them to its caller to write. At the end every rank
//! reports to the collector and waits for its acknowledgement, which the collector sends only
//! once the outputs are written; a rank that fails tells the job through its transport
//! ([`Transport::abort`]), so every rank ends with an error naming the first cause.
//!
//! With tensor parallelism every rank of a stage group receives the same micro-batch from the
//! rank of the same TP rank in the group before it, runs its shard of the stage (its
//! `ai.pipecut` collectives exchanged with its group over the same transport:
//! [`collectives::TransportGroup`]) and sends on to the same TP rank of the next group; the
//! ranks of a group hold the same boundary tensors after their last collective, so only TP
//! rank 0 of the last stage hands outputs to the collector.

#![warn(missing_docs)]

pub mod auth;
pub mod collectives;
pub mod launch;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi_transport;
#[cfg(feature = "cuda")]
pub mod nccl_transport;
pub mod tcp;
pub mod transport;
pub mod wire;

use std::ops::Range;
use std::time::{Duration, Instant};

pub use launch::{Launch, Rendezvous};
pub use metrics::{RankFigures, SharedFigures};
pub use transport::{Transport, TransportError};

pub use pipecut_ir::{Error, Result};
use pipecut_runtime::cpu::{join_microbatches, thread_cpu_secs};
use pipecut_runtime::{Executor, Tensors};

/// Tag of the message a rank sends the collector when it has finished.
const DONE: u32 = u32::MAX;
/// Tag of the collector's reply once the outputs are complete.
const ACK: u32 = u32::MAX - 1;

/// How the job's ranks map onto the plan: `tensor_parallel` ranks per stage group, `stages`
/// groups per replica, `replicas` copies; the TP rank varies fastest (as Megatron-LM numbers
/// ranks), then the stage, then the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankLayout {
    /// Pipeline stages (K).
    pub stages: usize,
    /// Data-parallel replicas (D).
    pub replicas: usize,
    /// Ranks per stage group (t; 1 without tensor parallelism).
    pub tensor_parallel: usize,
}

/// Where one rank sits in the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The rank.
    pub rank: usize,
    /// Its stage.
    pub stage: usize,
    /// Its replica.
    pub replica: usize,
    /// Its rank within its stage's tensor-parallel group.
    pub tp_rank: usize,
}

impl RankLayout {
    /// Ranks the job needs.
    pub fn world(&self) -> usize {
        self.tensor_parallel * self.stages * self.replicas
    }

    /// The place of `rank`.
    pub fn place(&self, rank: usize) -> Place {
        let group = rank / self.tensor_parallel;
        Place {
            rank,
            stage: group % self.stages,
            replica: group / self.stages,
            tp_rank: rank % self.tensor_parallel,
        }
    }

    /// The rank running TP rank `tp_rank` of `stage` of `replica`.
    pub fn rank_of(&self, replica: usize, stage: usize, tp_rank: usize) -> usize {
        (replica * self.stages + stage) * self.tensor_parallel + tp_rank
    }

    /// The ranks of the tensor-parallel group that `place` belongs to, in TP rank order.
    pub fn group_of(&self, place: Place) -> Vec<usize> {
        (0..self.tensor_parallel)
            .map(|r| self.rank_of(place.replica, place.stage, r))
            .collect()
    }

    /// The rank that gathers and writes the outputs: TP rank 0 of the last stage of replica 0.
    pub fn collector(&self) -> usize {
        self.rank_of(0, self.stages - 1, 0)
    }

    /// The micro-batches (of `microbatches` in the step) that `replica` runs: contiguous blocks,
    /// the first `M mod D` replicas one larger.
    pub fn microbatches_of(&self, replica: usize, microbatches: usize) -> Range<usize> {
        let (base, extra) = (microbatches / self.replicas, microbatches % self.replicas);
        let start = replica * base + replica.min(extra);
        start..start + base + usize::from(replica < extra)
    }

    /// Checks the launcher started the job this layout needs.
    pub fn check_world(&self, launch: &Launch, microbatches: usize) -> Result<(), Error> {
        if launch.world != self.world() {
            let tp = match self.tensor_parallel {
                1 => String::new(),
                t => format!("{t} tensor-parallel rank(s) × "),
            };
            return Err(Error::Distributed(format!(
                "the plan has {tp}{} stage(s) × {} replica(s) = {} ranks, but {} started {}",
                self.stages,
                self.replicas,
                self.world(),
                launch.launcher,
                launch.world
            )));
        }
        if microbatches < self.replicas {
            return Err(Error::Distributed(format!(
                "{microbatches} micro-batch(es) cannot be shared by {} replicas",
                self.replicas
            )));
        }
        Ok(())
    }

    /// "rank 3 (stage 1 of replica 1)", "rank 3 (TP rank 1 of stage 1 of replica 0)".
    pub fn describe(&self, rank: usize) -> String {
        let p = self.place(rank);
        let tp = match self.tensor_parallel {
            1 => String::new(),
            _ => format!("TP rank {} of ", p.tp_rank),
        };
        format!(
            "rank {rank} ({tp}stage {} of replica {})",
            p.stage, p.replica
        )
    }
}

/// What one rank runs and how long it waits for a peer.
#[derive(Debug, Clone)]
pub struct RankJob {
    /// The job's layout.
    pub layout: RankLayout,
    /// Micro-batches in the whole step (all replicas).
    pub microbatches: usize,
    /// How long a receive waits before the peer is declared lost.
    pub peer_timeout: Duration,
    /// Received tensors this rank passes on unread: a stage loaded from an exported stage file
    /// (which holds only what its nodes read) relays what later stages need from earlier ones.
    pub relay: Vec<String>,
}

/// Runs this rank's stage for its replica's micro-batches. `inputs` are the step's
/// micro-batches (read only on stage 0; others pass an empty list). On the collector `deliver`
/// gets the joined outputs (to write them) before any rank is acknowledged, so no rank ends
/// well unless they were written. `figures` is updated as the rank goes. A failure here is
/// reported to the whole job ([`abort_job`]); a success says so ([`Transport::finished`]).
pub fn run_rank<E: Executor>(
    executor: &E,
    stage: &E::Stage,
    transport: &mut dyn Transport,
    job: &RankJob,
    inputs: &[Tensors],
    figures: &SharedFigures,
    deliver: &mut dyn FnMut(Tensors) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut rank = RankLoop {
        job,
        place: job.layout.place(transport.rank()),
        transport,
        figures,
        start: Instant::now(),
    };
    match rank.run(executor, stage, inputs, deliver) {
        Ok(()) => {
            rank.transport.finished();
            Ok(())
        }
        Err(e) => Err(abort_job(rank.transport, &job.layout, e)),
    }
}

/// Tells every rank of the job that this one failed with `error` (its message, without the
/// rank's own name when it starts with it, which the others add), and gives the error back.
pub fn abort_job(transport: &mut dyn Transport, layout: &RankLayout, error: Error) -> Error {
    let me = format!("{}: ", layout.describe(transport.rank()));
    let text = match &error {
        Error::Distributed(text) => text.clone(),
        other => other.to_string(),
    };
    transport.abort(text.strip_prefix(&me).unwrap_or(&text));
    error
}

struct RankLoop<'a> {
    job: &'a RankJob,
    place: Place,
    transport: &'a mut dyn Transport,
    figures: &'a SharedFigures,
    start: Instant,
}

impl RankLoop<'_> {
    fn run<E: Executor>(
        &mut self,
        executor: &E,
        stage: &E::Stage,
        inputs: &[Tensors],
        deliver: &mut dyn FnMut(Tensors) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let layout = self.job.layout;
        let mine = layout.microbatches_of(self.place.replica, self.job.microbatches);
        self.update(|f| {
            f.rank = self.place.rank;
            f.stage = self.place.stage;
            f.replica = self.place.replica;
            f.microbatches_total = mine.len();
        });
        let last = self.place.stage + 1 == layout.stages;
        let mut outputs = Vec::with_capacity(if last { mine.len() } else { 0 });
        for i in mine.clone() {
            let received = if self.place.stage == 0 {
                inputs.get(i).cloned().ok_or_else(|| {
                    Error::Distributed(format!("micro-batch {i} has no inputs on stage 0"))
                })?
            } else {
                let p = self.place;
                let from = layout.rank_of(p.replica, p.stage - 1, p.tp_rank);
                self.receive(from, i as u32)?
            };
            let began = Instant::now();
            let cpu_began = thread_cpu_secs();
            let mut sent = executor.run(stage, &received).map_err(|e| {
                Error::Distributed(format!("{}: {e}", layout.describe(self.place.rank)))
            })?;
            self.relay(&received, &mut sent)?;
            let busy = began.elapsed().as_secs_f64();
            let cpu = thread_cpu_secs() - cpu_began;
            self.update(|f| {
                f.busy_secs += busy;
                f.cpu_secs += cpu;
            });
            let p = self.place;
            if !last {
                let to = layout.rank_of(p.replica, p.stage + 1, p.tp_rank);
                self.send(to, i as u32, &sent)?;
            } else if p.tp_rank != 0 {
                // Its group's TP rank 0 holds the same outputs and hands them on.
            } else if p.rank != layout.collector() {
                self.send(layout.collector(), i as u32, &sent)?;
            } else {
                outputs.push(sent);
            }
            self.update(|f| f.microbatches_done += 1);
        }
        self.finish(outputs, deliver)
    }

    /// The end of the job: the collector gathers the other replicas' outputs and every rank's
    /// report, delivers the outputs, then acknowledges; everyone else reports and waits for the
    /// acknowledgement.
    fn finish(
        &mut self,
        mut outputs: Vec<Tensors>,
        deliver: &mut dyn FnMut(Tensors) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let layout = self.job.layout;
        let collector = layout.collector();
        if self.place.rank != collector {
            self.send_bytes(collector, DONE, &[])?;
            self.receive_bytes(collector, ACK)?;
            return Ok(());
        }
        for replica in 1..layout.replicas {
            let from = layout.rank_of(replica, layout.stages - 1, 0);
            for i in layout.microbatches_of(replica, self.job.microbatches) {
                outputs.push(self.receive(from, i as u32)?);
            }
        }
        for rank in (0..layout.world()).filter(|&r| r != collector) {
            self.receive_bytes(rank, DONE)?;
        }
        deliver(join_microbatches(&outputs)?)?;
        for rank in (0..layout.world()).filter(|&r| r != collector) {
            self.send_bytes(rank, ACK, &[])?;
        }
        Ok(())
    }

    /// Adds the tensors to relay from `received` to `sent`.
    fn relay(&self, received: &Tensors, sent: &mut Tensors) -> Result<(), Error> {
        for name in &self.job.relay {
            let tensor = received.get(name).ok_or_else(|| {
                Error::Distributed(format!(
                    "{}: tensor '{name}', which a later stage needs, was not received",
                    self.job.layout.describe(self.place.rank)
                ))
            })?;
            sent.insert(name.clone(), std::sync::Arc::clone(tensor));
        }
        Ok(())
    }

    fn send(&mut self, to: usize, tag: u32, tensors: &Tensors) -> Result<(), Error> {
        let began = Instant::now();
        let bytes = wire::encode(tensors);
        self.send_bytes(to, tag, &bytes)?;
        let secs = began.elapsed().as_secs_f64();
        self.update(|f| f.transfer_secs += secs);
        Ok(())
    }

    fn send_bytes(&mut self, to: usize, tag: u32, bytes: &[u8]) -> Result<(), Error> {
        self.transport
            .send(to, tag, bytes)
            .map_err(|e| self.lost(to, &e))?;
        self.update(|f| f.bytes_sent += bytes.len() as u64);
        Ok(())
    }

    fn receive(&mut self, from: usize, tag: u32) -> Result<Tensors, Error> {
        let bytes = self.receive_bytes(from, tag)?;
        let began = Instant::now();
        let tensors = wire::decode(&bytes, &self.job.layout.describe(from))?;
        let secs = began.elapsed().as_secs_f64();
        self.update(|f| f.transfer_secs += secs);
        Ok(tensors)
    }

    fn receive_bytes(&mut self, from: usize, tag: u32) -> Result<Vec<u8>, Error> {
        let began = Instant::now();
        let bytes = self
            .transport
            .recv(from, tag, self.job.peer_timeout)
            .map_err(|e| self.lost(from, &e))?;
        let waited = began.elapsed().as_secs_f64();
        let queued = self.transport.waiting(from);
        self.update(|f| {
            f.wait_secs += waited;
            f.bytes_received += bytes.len() as u64;
            f.queue_depth = queued;
        });
        Ok(bytes)
    }

    /// "rank 3 (stage 1 of replica 1): rank 2 (stage 0 of replica 1) closed its connection …".
    fn lost(&self, peer: usize, e: &TransportError) -> Error {
        let layout = &self.job.layout;
        Error::Distributed(format!(
            "{}: {}",
            layout.describe(self.place.rank),
            peer_failed(layout, peer, e)
        ))
    }

    fn update(&self, change: impl FnOnce(&mut RankFigures)) {
        let mut figures = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut figures);
        figures.wall_secs = self.start.elapsed().as_secs_f64();
    }
}

/// What happened with `peer`, naming the rank at fault: "rank 2 (stage 0 of replica 1) closed
/// its connection (…)", or where the job failed elsewhere first, that rank and its cause.
pub fn peer_failed(layout: &RankLayout, peer: usize, e: &TransportError) -> String {
    match e {
        TransportError::Aborted { rank, cause } => {
            format!("the job failed at {}: {cause}", layout.describe(*rank))
        }
        TransportError::Lost { rank, detail } => format!("{} {detail}", layout.describe(*rank)),
        e => format!("{} {e}", layout.describe(peer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_stage_major_within_a_replica() {
        let layout = RankLayout {
            stages: 2,
            replicas: 3,
            tensor_parallel: 1,
        };
        assert_eq!(layout.world(), 6);
        assert_eq!(
            layout.place(3),
            Place {
                rank: 3,
                stage: 1,
                replica: 1,
                tp_rank: 0,
            }
        );
        assert_eq!(layout.rank_of(2, 0, 0), 4);
        assert_eq!(layout.collector(), 1);
        assert_eq!(layout.describe(5), "rank 5 (stage 1 of replica 2)");
    }

    #[test]
    fn tensor_parallel_ranks_vary_fastest_then_stages_then_replicas() {
        let layout = RankLayout {
            stages: 2,
            replicas: 2,
            tensor_parallel: 2,
        };
        assert_eq!(layout.world(), 8);
        assert_eq!(
            layout.place(5),
            Place {
                rank: 5,
                stage: 0,
                replica: 1,
                tp_rank: 1,
            }
        );
        assert_eq!(layout.rank_of(1, 1, 0), 6);
        assert_eq!(layout.group_of(layout.place(3)), [2, 3]);
        assert_eq!(layout.collector(), 2);
        assert_eq!(
            layout.describe(3),
            "rank 3 (TP rank 1 of stage 1 of replica 0)"
        );
    }

    #[test]
    fn replicas_take_contiguous_blocks_covering_the_step_once() {
        let layout = RankLayout {
            stages: 1,
            replicas: 3,
            tensor_parallel: 1,
        };
        let blocks: Vec<Range<usize>> = (0..3).map(|r| layout.microbatches_of(r, 8)).collect();
        assert_eq!(blocks, vec![0..3, 3..6, 6..8]);
        let one = RankLayout {
            stages: 4,
            replicas: 1,
            tensor_parallel: 1,
        };
        assert_eq!(one.microbatches_of(0, 5), 0..5);
    }
}
