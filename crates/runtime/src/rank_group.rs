//! The group tensor-parallel ranks meet in at their collectives: each `ai.pipecut` `AllReduce`
//! a rank reaches sums its input over the group (a `ReduceScatter` sums it and keeps the rank's
//! share of one axis, an `AllGather` concatenates the ranks' shares). The sum is taken once, by
//! the last rank to arrive, in rank order, so every rank gets the same bits; a rank that fails
//! wakes the others with its error instead of leaving them waiting. Ranks that are threads meet
//! in a [`Group`]; ranks that are processes through another [`Collectives`]
//! (`runtime::distributed::collectives`). The CPU kernels of the collectives call this, and the
//! executors of `tensor_parallel.rs` run ranks in it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex};

use crate::tensor::{HostTensor, TensorData};
use crate::Error;

/// The shared state of one group's all-reduces.
#[derive(Debug)]
pub struct Group {
    size: usize,
    state: Mutex<Round>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct Round {
    contributions: Vec<Option<HostTensor>>,
    arrived: usize,
    /// Completed all-reduces; a rank waits for it to move past the one it joined.
    generation: u64,
    result: Option<Result<Arc<HostTensor>, String>>,
    aborted: Option<String>,
    /// The rank whose failure woke the others.
    failed_rank: Option<usize>,
}

/// How the running rank meets the other ranks of its group at a collective.
pub trait Collectives {
    /// Ranks in the group.
    fn size(&self) -> usize;

    /// This rank's place in the group.
    fn rank(&self) -> usize;

    /// Gives `x` to the current collective and returns `combine` of every rank's
    /// contribution in rank order (all ranks reach the same collectives in the same order:
    /// their graphs are one graph split).
    fn contribute(
        &self,
        x: &HostTensor,
        combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
    ) -> Result<HostTensor, String>;
}

/// A rank of a [`Group`] of threads.
struct ThreadMember {
    group: Arc<Group>,
    rank: usize,
}

impl Collectives for ThreadMember {
    fn size(&self) -> usize {
        self.group.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn contribute(
        &self,
        x: &HostTensor,
        combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
    ) -> Result<HostTensor, String> {
        self.group
            .contribute(self.rank, x, combine)
            .map(|s| (*s).clone())
    }
}

thread_local! {
    /// How the running thread meets its group, while it runs a rank.
    static MEMBERSHIP: RefCell<Option<Rc<dyn Collectives>>> = const { RefCell::new(None) };
}

/// Runs `run` on this thread as a rank whose collectives go through `member` (a process of a
/// distributed job: `runtime::distributed::collectives::TransportGroup`).
pub fn as_member<T>(member: Rc<dyn Collectives>, run: impl FnOnce() -> T) -> T {
    MEMBERSHIP.with(|m| *m.borrow_mut() = Some(member));
    // Cleared even if `run` panics, so that the thread is not left a member.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            MEMBERSHIP.with(|m| *m.borrow_mut() = None);
        }
    }
    let _leave = Leave;
    run()
}

impl Group {
    /// A group of `size` ranks.
    pub fn new(size: usize) -> Arc<Group> {
        Arc::new(Group {
            size,
            state: Mutex::new(Round {
                contributions: vec![None; size],
                ..Round::default()
            }),
            done: Condvar::new(),
        })
    }

    /// Adds rank `rank`'s tensor to the current collective and waits for the last rank to
    /// `combine` every rank's, in rank order (all ranks reach the same collectives in the same
    /// order: their graphs are one graph split).
    fn contribute(
        &self,
        rank: usize,
        x: &HostTensor,
        combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
    ) -> Result<Arc<HostTensor>, String> {
        let mut round = self.state.lock().map_err(|_| "a rank panicked")?;
        if let Some(reason) = &round.aborted {
            return Err(reason.clone());
        }
        round.contributions[rank] = Some(x.clone());
        round.arrived += 1;
        let joined = round.generation;
        if round.arrived == self.size {
            let parts: Vec<HostTensor> = round
                .contributions
                .iter_mut()
                .flat_map(Option::take)
                .collect();
            round.result = Some(combine(&parts).map(Arc::new));
            round.arrived = 0;
            round.generation += 1;
            self.done.notify_all();
        }
        while round.generation == joined && round.aborted.is_none() {
            round = self.done.wait(round).map_err(|_| "a rank panicked")?;
        }
        match (&round.aborted, &round.result) {
            (Some(reason), _) => Err(reason.clone()),
            (None, Some(result)) => result.clone(),
            (None, None) => Err("an all-reduce ended without a result".into()),
        }
    }

    /// Wakes every waiting rank with `reason`: rank `rank` failed, the others cannot finish.
    fn abort(&self, rank: usize, reason: String) {
        if let Ok(mut round) = self.state.lock() {
            if round.aborted.is_none() {
                round.aborted = Some(reason);
                round.failed_rank = Some(rank);
            }
            self.done.notify_all();
        }
    }

    /// The rank that failed first, if one did.
    pub(crate) fn failed_rank(&self) -> Option<usize> {
        self.state.lock().ok().and_then(|round| round.failed_rank)
    }
}

/// The element-wise sum of `parts`, in order.
fn sum(parts: &[HostTensor]) -> Result<HostTensor, String> {
    let first = parts.first().ok_or("an all-reduce of no tensors")?;
    if let Some(other) = parts.iter().find(|p| p.shape() != first.shape()) {
        return Err(format!(
            "ranks all-reduce different shapes: {:?} and {:?}",
            first.shape(),
            other.shape()
        ));
    }
    let data = match first.data() {
        TensorData::F32(_) => {
            let mut total = first.to_f32_vec();
            for p in &parts[1..] {
                for (t, x) in total.iter_mut().zip(p.as_f32()?) {
                    *t += x;
                }
            }
            TensorData::F32(total)
        }
        TensorData::I64(_) => {
            let mut total = first.to_i64_vec();
            for p in &parts[1..] {
                for (t, x) in total.iter_mut().zip(p.to_i64_vec()) {
                    *t = t.wrapping_add(x);
                }
            }
            TensorData::I64(total)
        }
        _ => {
            return Err(format!(
                "AllReduce sums float32 or int64, not {}",
                first.dtype()
            ))
        }
    };
    HostTensor::new(first.shape().to_vec(), data)
}

/// The `AllReduce` kernel's work: the sum of `x` over the running thread's group.
pub(crate) fn all_reduce(x: &HostTensor, group_size: usize) -> Result<HostTensor, String> {
    collective(x, group_size, "AllReduce", &sum)
}

/// The `AllGather` kernel's work: the ranks' `x` concatenated along `axis`, in rank order.
pub(crate) fn all_gather(
    x: &HostTensor,
    group_size: usize,
    axis: i64,
) -> Result<HostTensor, String> {
    let rank = x.rank() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Err(format!(
            "AllGather axis {axis} out of range for rank {rank}"
        ));
    }
    collective(x, group_size, "AllGather", &|parts| {
        concat(parts, axis as usize)
    })
}

/// The `ReduceScatter` kernel's work: the sum of `x` over the running thread's group, cut in
/// `group_size` equal pieces along `axis`, of which rank r keeps piece r (Megatron's
/// sequence-parallel `reduce_scatter_to_sequence_parallel_region`).
pub(crate) fn reduce_scatter(
    x: &HostTensor,
    group_size: usize,
    axis: i64,
) -> Result<HostTensor, String> {
    let axis = normalized_axis(x, axis, "ReduceScatter")?;
    let size = x.shape()[axis];
    if !size.is_multiple_of(group_size) {
        return Err(format!(
            "ReduceScatter: axis {axis} of size {size} does not split {group_size} ways"
        ));
    }
    let (total, rank) = collective_with_rank(x, group_size, "ReduceScatter", &sum)?;
    piece(&total, axis, rank, group_size)
}

/// `axis` (negative from the end) as an index of `x`'s dims.
fn normalized_axis(x: &HostTensor, axis: i64, op: &str) -> Result<usize, String> {
    let rank = x.rank() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    match (0..rank).contains(&axis) {
        true => Ok(axis as usize),
        false => Err(format!("{op} axis {axis} out of range for rank {rank}")),
    }
}

/// Piece `index` of `pieces` equal pieces of `x` along `axis`.
fn piece(x: &HostTensor, axis: usize, index: usize, pieces: usize) -> Result<HostTensor, String> {
    let shape = x.shape();
    let outer: usize = shape[..axis].iter().product();
    let chunk: usize = shape[axis..].iter().product();
    let part = chunk / pieces;
    let pick = |o: usize| o * chunk + index * part..o * chunk + (index + 1) * part;
    let data = match x.data() {
        TensorData::F32(v) => {
            TensorData::F32((0..outer).flat_map(|o| v[pick(o)].to_vec()).collect())
        }
        TensorData::I64(v) => {
            TensorData::I64((0..outer).flat_map(|o| v[pick(o)].to_vec()).collect())
        }
        other => return Err(format!("a piece of a {} tensor", other.dtype())),
    };
    let mut out_shape = shape.to_vec();
    out_shape[axis] /= pieces;
    HostTensor::new(out_shape, data)
}

fn collective(
    x: &HostTensor,
    group_size: usize,
    op: &str,
    combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
) -> Result<HostTensor, String> {
    collective_with_rank(x, group_size, op, combine).map(|(result, _)| result)
}

/// As [`collective`], with the running thread's rank (0 outside a run, in a group of one).
fn collective_with_rank(
    x: &HostTensor,
    group_size: usize,
    op: &str,
    combine: &dyn Fn(&[HostTensor]) -> Result<HostTensor, String>,
) -> Result<(HostTensor, usize), String> {
    let member = MEMBERSHIP.with(|m| m.borrow().clone());
    match member {
        Some(member) if member.size() == group_size => member
            .contribute(x, combine)
            .map(|result| (result, member.rank())),
        Some(member) => Err(format!(
            "{op} of a group of {group_size} in a run of {} ranks",
            member.size()
        )),
        None if group_size == 1 => Ok((x.clone(), 0)),
        None => Err(format!(
            "{op} of a group of {group_size} outside a tensor-parallel run \
             (run the ranks together: pipecut::runtime::tensor_parallel::run_ranks)"
        )),
    }
}

/// `parts` (float32, equal shapes) concatenated along `axis`.
fn concat(parts: &[HostTensor], axis: usize) -> Result<HostTensor, String> {
    let first = parts.first().ok_or("an all-gather of no tensors")?;
    let shape = first.shape().to_vec();
    if parts.iter().any(|p| p.shape() != shape.as_slice()) {
        return Err("ranks all-gather different shapes".into());
    }
    let outer: usize = shape[..axis].iter().product();
    let chunk: usize = shape[axis..].iter().product();
    let values: Vec<&[f32]> = parts.iter().map(|p| p.as_f32()).collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(chunk * outer * parts.len());
    for o in 0..outer {
        for v in &values {
            out.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
        }
    }
    let mut out_shape = shape;
    out_shape[axis] *= parts.len();
    HostTensor::new(out_shape, TensorData::F32(out))
}

/// Runs rank `rank` of `group` on this thread: its all-reduces join the group's.
pub fn as_rank<T>(
    group: &Arc<Group>,
    rank: usize,
    run: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let member = Rc::new(ThreadMember {
        group: group.clone(),
        rank,
    });
    // A rank that panics must still wake the others, or they would wait for it forever.
    let result = as_member(member, || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
    });
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            group.abort(rank, format!("rank {rank} failed: {e}"));
            Err(e)
        }
        Err(panic) => {
            group.abort(rank, format!("rank {rank} panicked"));
            std::panic::resume_unwind(panic)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(values: &[f32]) -> HostTensor {
        HostTensor::new(vec![values.len()], TensorData::F32(values.to_vec())).unwrap()
    }

    /// Runs `work(rank)` as each rank of a group of 3.
    fn on_three<T: Send>(work: impl Fn(usize) -> Result<T, Error> + Sync) -> Vec<Result<T, Error>> {
        let group = Group::new(3);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let (group, work) = (group.clone(), &work);
                    scope.spawn(move || as_rank(&group, rank, || work(rank)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_gets_the_same_sum_and_the_same_gathered_whole() {
        let results = on_three(|rank| {
            let x = vector(&[rank as f32, 0.5]);
            let sum = all_reduce(&x, 3).map_err(Error::Export)?;
            let gathered = all_gather(&x, 3, -1).map_err(Error::Export)?;
            // A second round reuses the group.
            let again = all_reduce(&sum, 3).map_err(Error::Export)?;
            Ok((sum.to_f32_vec(), gathered.to_f32_vec(), again.to_f32_vec()))
        });
        for result in results {
            let (sum, gathered, again) = result.unwrap();
            assert_eq!(sum, [3.0, 1.5]);
            assert_eq!(gathered, [0.0, 0.5, 1.0, 0.5, 2.0, 0.5]);
            assert_eq!(again, [9.0, 4.5]);
        }
    }

    #[test]
    fn each_rank_keeps_its_piece_of_the_sum_along_the_axis() {
        // 2 × 6 on each rank, the sum cut in three along axis 1: rank r keeps columns 2r, 2r+1.
        let results = on_three(|rank| {
            let x = HostTensor::new(
                vec![2, 6],
                TensorData::F32((0..12).map(|v| (v + rank) as f32).collect()),
            )
            .map_err(Error::Export)?;
            let piece = reduce_scatter(&x, 3, 1).map_err(Error::Export)?;
            Ok((piece.shape().to_vec(), piece.to_f32_vec()))
        });
        for (rank, result) in results.into_iter().enumerate() {
            let (shape, values) = result.unwrap();
            assert_eq!(shape, [2, 2]);
            // Σ over ranks of (v + rank) = 3v + 3.
            let column = 2.0 * rank as f32;
            let expected: Vec<f32> = [column, column + 1.0, column + 6.0, column + 7.0]
                .iter()
                .map(|v| 3.0 * v + 3.0)
                .collect();
            assert_eq!(values, expected, "rank {rank}");
        }
        // An axis the group does not divide is refused before anyone waits.
        let x = vector(&[1.0, 2.0]);
        assert!(reduce_scatter(&x, 3, 0)
            .unwrap_err()
            .contains("does not split"));
    }

    #[test]
    fn a_failing_rank_wakes_the_others_with_its_error() {
        let results = on_three(|rank| {
            if rank == 1 {
                return Err(Error::Export("no weights".into()));
            }
            all_reduce(&vector(&[1.0]), 3).map_err(Error::Export)
        });
        for (rank, result) in results.into_iter().enumerate() {
            let message = result.unwrap_err().to_string();
            match rank {
                1 => assert!(message.contains("no weights"), "{message}"),
                _ => assert!(
                    message.contains("rank 1 failed") && message.contains("no weights"),
                    "{message}"
                ),
            }
        }
    }

    #[test]
    fn a_collective_outside_a_group_is_refused_unless_the_group_is_one() {
        let x = vector(&[2.0]);
        assert_eq!(all_reduce(&x, 1).unwrap().to_f32_vec(), [2.0]);
        assert!(all_reduce(&x, 2)
            .unwrap_err()
            .contains("outside a tensor-parallel run"));
    }
}
