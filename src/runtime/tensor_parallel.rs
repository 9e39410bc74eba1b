//! Tensor-parallel ranks as threads: the t rank models of a stage (see
//! [`crate::onnx::export::shard`]) run on t threads, and each `ai.pipecut` `AllReduce` they
//! reach sums its input over the group. The sum is taken once, by the last rank to arrive, in
//! rank order, so every rank gets the same bits; a rank that fails wakes the others with its
//! error instead of leaving them waiting.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex};

use super::tensor::{HostTensor, TensorData};
use super::{CpuExecutor, Tensors};
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
}

thread_local! {
    /// The group and rank of the running thread, while it runs a rank.
    static MEMBERSHIP: RefCell<Option<(Arc<Group>, usize)>> = const { RefCell::new(None) };
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

    /// Adds rank `rank`'s tensor to the current all-reduce and waits for the sum.
    fn contribute(&self, rank: usize, x: &HostTensor) -> Result<Arc<HostTensor>, String> {
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
            round.result = Some(sum(&parts).map(Arc::new));
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

    /// Wakes every waiting rank with `reason`: one rank failed, the others cannot finish.
    fn abort(&self, reason: String) {
        if let Ok(mut round) = self.state.lock() {
            round.aborted.get_or_insert(reason);
            self.done.notify_all();
        }
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
    MEMBERSHIP.with(|m| match &*m.borrow() {
        Some((group, rank)) if group.size == group_size => {
            group.contribute(*rank, x).map(|s| (*s).clone())
        }
        Some((group, _)) => Err(format!(
            "AllReduce of a group of {group_size} in a run of {} ranks",
            group.size
        )),
        None if group_size == 1 => Ok(x.clone()),
        None => Err(format!(
            "AllReduce of a group of {group_size} outside a tensor-parallel run \
             (run the ranks together: pipecut::runtime::tensor_parallel::run_ranks)"
        )),
    })
}

/// Runs rank `rank` of `group` on this thread: its all-reduces join the group's.
pub fn as_rank<T>(
    group: &Arc<Group>,
    rank: usize,
    run: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    MEMBERSHIP.with(|m| *m.borrow_mut() = Some((group.clone(), rank)));
    let result = run();
    MEMBERSHIP.with(|m| *m.borrow_mut() = None);
    if let Err(e) = &result {
        group.abort(format!("rank {rank} failed: {e}"));
    }
    result
}

/// Runs the rank models of one tensor-parallel group on the same inputs, one thread each, and
/// gives rank 0's outputs (every rank's are the same after the last all-reduce).
///
/// # Errors
/// The first rank's error, by rank order.
pub fn run_ranks(ranks: &[CpuExecutor<'_>], inputs: &Tensors) -> Result<Tensors, Error> {
    let group = Group::new(ranks.len());
    let results: Vec<Result<Tensors, Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(rank, executor)| {
                let group = group.clone();
                scope.spawn(move || as_rank(&group, rank, || executor.run_model(inputs)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Export("a rank panicked".into())))
            })
            .collect()
    });
    // A rank woken by another's failure reports that one: the root cause comes first.
    let mut outputs = None;
    let mut first_error = None;
    for result in results {
        match result {
            Ok(o) => {
                outputs.get_or_insert(o);
            }
            Err(e) if first_error.is_none() || !e.to_string().contains("failed: ") => {
                first_error = Some(e)
            }
            Err(_) => {}
        }
    }
    match (first_error, outputs) {
        (Some(e), _) => Err(e),
        (None, Some(o)) => Ok(o),
        (None, None) => Err(Error::Export("no ranks to run".into())),
    }
}
