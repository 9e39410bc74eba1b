//! Tensor-parallel ranks as threads: the t rank models of a stage (see
//! [`pipecut_ir::onnx::export::shard`]) run on t threads, and each `ai.pipecut` `AllReduce` they
//! reach sums its input over the group (a `ReduceScatter` sums it and keeps the rank's share of
//! one axis, an `AllGather` concatenates the ranks' shares). The sum is taken once, by the last rank to arrive, in
//! rank order, so every rank gets the same bits; a rank that fails wakes the others with its
//! error instead of leaving them waiting. The same kernels serve ranks that are processes
//! (`run --distributed`): there a [`Collectives`] other than the thread group exchanges the
//! contributions (`runtime::distributed::collectives`), and each rank combines them in rank
//! order, so it gets the bits the threads would.

use std::path::Path;
use std::sync::Mutex;

pub use super::rank_group::{as_member, as_rank, Collectives, Group};
use super::{CpuExecutor, Executor, StageSpec, Tensors, Weights};
use crate::Error;
use pipecut_ir::graph::Graph;
use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

/// Runs the rank models of one tensor-parallel group on the same inputs, one thread each, and
/// gives rank 0's outputs (every rank's are the same after the last all-reduce).
///
/// # Errors
/// The first rank's error, by rank order.
pub fn run_ranks(ranks: &[CpuExecutor<'_>], inputs: &Tensors) -> Result<Tensors, Error> {
    run_group(ranks, |executor| executor.run_model(inputs))
}

/// Runs `run` on each of `ranks` on its own thread, as that rank of one group, and gives rank
/// 0's result; a failing rank's own error rather than the others' "stopped" ones.
fn run_group<T: Sync>(
    ranks: &[T],
    run: impl Fn(&T) -> Result<Tensors, Error> + Sync,
) -> Result<Tensors, Error> {
    let group = Group::new(ranks.len());
    let run = &run;
    let results: Vec<Result<Tensors, Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(rank, item)| {
                let group = group.clone();
                scope.spawn(move || as_rank(&group, rank, || run(item)))
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
    // The ranks woken by another's failure report that one: give the failing rank's own error.
    let failed = group.failed_rank();
    let mut results = results;
    match failed {
        Some(rank) => match results.swap_remove(rank) {
            Err(e) => Err(e),
            Ok(_) => Err(Error::Export(format!("rank {rank} stopped its group"))),
        },
        None => results
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(Error::Export("no ranks to run".into()))),
    }
}

/// Every stage's rank models, loaded: `graphs[stage][rank]` and their weights.
pub struct LoadedRanks {
    graphs: Vec<Vec<Graph>>,
    weights: Vec<Vec<Weights>>,
}

impl LoadedRanks {
    /// Loads `ranks[stage][rank]` (model bytes whose external data lies in `dir`), typed with
    /// `dims`, the dims their split shapes were made for.
    ///
    /// # Errors
    /// A rank that does not load, type or read its weights.
    pub fn load(
        ranks: &[Vec<Vec<u8>>],
        dir: &Path,
        dims: &DimBindings,
    ) -> Result<LoadedRanks, Error> {
        let mut graphs = Vec::with_capacity(ranks.len());
        let mut weights = Vec::with_capacity(ranks.len());
        for stage in ranks {
            let mut stage_graphs = Vec::with_capacity(stage.len());
            let mut stage_weights = Vec::with_capacity(stage.len());
            for bytes in stage {
                let mut model = pipecut_ir::onnx::load_model_from_bytes(bytes, Some(dir))?;
                let bindings = dims_named_in(&model.graph, dims);
                ShapeInference::new(bindings).run(&mut model.graph)?;
                stage_weights.push(Weights::from_model_bytes(bytes, &model.graph)?);
                stage_graphs.push(model.graph);
            }
            graphs.push(stage_graphs);
            weights.push(stage_weights);
        }
        Ok(LoadedRanks { graphs, weights })
    }

    /// Per stage, each rank's graph and weights.
    pub fn stages(&self) -> Vec<Vec<(&Graph, &Weights)>> {
        self.graphs
            .iter()
            .zip(&self.weights)
            .map(|(g, w)| g.iter().zip(w).collect())
            .collect()
    }

    /// An executor per rank, per stage.
    pub fn executors(&self) -> Vec<Vec<CpuExecutor<'_>>> {
        self.graphs
            .iter()
            .zip(&self.weights)
            .map(|(g, w)| {
                g.iter()
                    .zip(w)
                    .map(|(g, w)| CpuExecutor::new(g, w))
                    .collect()
            })
            .collect()
    }
}

/// The bindings of `dims` whose symbols `graph` declares: a later stage's file carries the
/// sizes of its boundary tensors, not the model's symbols.
fn dims_named_in(graph: &Graph, dims: &DimBindings) -> DimBindings {
    let declared: std::collections::BTreeSet<&str> = graph
        .tensors()
        .flat_map(|(_, t)| t.shape.iter().flatten())
        .flat_map(|d| match d {
            pipecut_ir::graph::Dim::Sym(s) => s.symbols().collect::<Vec<_>>(),
            pipecut_ir::graph::Dim::Known(_) => Vec::new(),
        })
        .collect();
    dims.iter()
        .filter(|(name, _)| declared.contains(name))
        .fold(DimBindings::new(), |b, (name, value)| b.bind(name, value))
}

/// A pipeline backend whose stages each run as a tensor-parallel group of CPU threads.
pub struct TensorParallelExecutor<'a> {
    whole: &'a Graph,
    stages: Vec<Vec<CpuExecutor<'a>>>,
}

/// A stage ready to run: its position and the tensors it hands on.
#[derive(Debug)]
pub struct TensorParallelStage {
    index: usize,
    sends: Vec<String>,
}

impl<'a> TensorParallelExecutor<'a> {
    /// The executor of the stages of `whole` split into `ranks`.
    pub fn new(whole: &'a Graph, ranks: &'a LoadedRanks) -> TensorParallelExecutor<'a> {
        let stages = ranks
            .graphs
            .iter()
            .zip(&ranks.weights)
            .map(|(g, w)| {
                g.iter()
                    .zip(w)
                    .map(|(g, w)| CpuExecutor::new(g, w))
                    .collect()
            })
            .collect();
        TensorParallelExecutor { whole, stages }
    }
}

impl Executor for TensorParallelExecutor<'_> {
    type Stage = TensorParallelStage;

    fn prepare(&self, spec: &StageSpec) -> Result<TensorParallelStage, Error> {
        if self.stages.get(spec.index).is_none_or(Vec::is_empty) {
            return Err(Error::Export(format!(
                "stage {} has no tensor-parallel ranks",
                spec.index
            )));
        }
        Ok(TensorParallelStage {
            index: spec.index,
            sends: spec
                .sends
                .iter()
                .map(|&t| self.whole.tensor(t).name.clone())
                .collect(),
        })
    }

    fn run(&self, stage: &TensorParallelStage, inputs: &Tensors) -> Result<Tensors, Error> {
        let ranks = &self.stages[stage.index];
        let outputs = run_ranks(ranks, inputs)?;
        Ok(relay(&stage.sends, inputs, outputs))
    }
}

/// A stage's sends from its ranks' `outputs`: a tensor the ranks do not make (one a later
/// stage needs from an earlier one) passes through from `inputs`.
fn relay(sends: &[String], inputs: &Tensors, mut outputs: Tensors) -> Tensors {
    for name in sends {
        if !outputs.contains_key(name) {
            if let Some(t) = inputs.get(name) {
                outputs.insert(name.clone(), t.clone());
            }
        }
    }
    outputs.retain(|name, _| sends.contains(name));
    outputs
}

/// The nodes of a rank graph as one stage: a rank runs its whole graph.
///
/// # Errors
/// As [`super::stage_specs`].
pub fn whole_rank_spec(graph: &Graph) -> Result<StageSpec, Error> {
    let nodes = graph.topological_order().to_vec();
    super::stage_specs(graph, &[nodes])?
        .pop()
        .ok_or_else(|| Error::Export("a rank graph gave no stage".into()))
}

/// A pipeline backend whose stages each run as a tensor-parallel group of executors of any
/// backend `E` (the CUDA one: `run --backend cuda`), one per rank, each running its rank graph
/// whole on its own thread; the group's collectives are the CPU kernels', which that backend
/// runs on host copies of their operands (staged through the host).
pub struct RankGroupExecutor<'a, E: Executor> {
    whole: &'a Graph,
    /// Per stage, per rank: the rank's executor and its graph as one stage.
    stages: Vec<Vec<(E, StageSpec)>>,
}

/// A stage of a [`RankGroupExecutor`]: each rank's prepared stage, used by its thread alone.
pub struct RankGroupStage<S> {
    index: usize,
    sends: Vec<String>,
    ranks: Vec<Mutex<S>>,
}

impl<S> RankGroupStage<S> {
    /// Each rank's prepared stage.
    pub fn ranks(&self) -> &[Mutex<S>] {
        &self.ranks
    }
}

impl<'a, E: Executor> RankGroupExecutor<'a, E> {
    /// The stages of `whole` run by `stages[k][r]`: rank r of stage k's executor and the
    /// rank graph it runs, as one stage ([`whole_rank_spec`]).
    pub fn new(whole: &'a Graph, stages: Vec<Vec<(E, StageSpec)>>) -> RankGroupExecutor<'a, E> {
        RankGroupExecutor { whole, stages }
    }
}

impl<E: Executor> Executor for RankGroupExecutor<'_, E> {
    type Stage = RankGroupStage<E::Stage>;

    fn prepare(&self, spec: &StageSpec) -> Result<Self::Stage, Error> {
        let ranks = self
            .stages
            .get(spec.index)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| {
                Error::Export(format!("stage {} has no tensor-parallel ranks", spec.index))
            })?;
        Ok(RankGroupStage {
            index: spec.index,
            sends: spec
                .sends
                .iter()
                .map(|&t| self.whole.tensor(t).name.clone())
                .collect(),
            ranks: ranks
                .iter()
                .map(|(executor, rank_spec)| executor.prepare(rank_spec).map(Mutex::new))
                .collect::<Result<_, _>>()?,
        })
    }

    fn run(&self, stage: &Self::Stage, inputs: &Tensors) -> Result<Tensors, Error> {
        let ranks: Vec<(&E, &Mutex<E::Stage>)> = self.stages[stage.index]
            .iter()
            .map(|(executor, _)| executor)
            .zip(&stage.ranks)
            .collect();
        let outputs = run_group(&ranks, |(executor, prepared)| {
            let prepared = prepared
                .lock()
                .map_err(|_| Error::Export("a rank's stage was poisoned".into()))?;
            executor.run(&prepared, inputs)
        })?;
        Ok(relay(&stage.sends, inputs, outputs))
    }
}

/// One rank of a stage's tensor-parallel group, alone in its process (`run --distributed`):
/// the pipeline's stage of `whole` is run as this rank's graph, whole, on `E`, its collectives
/// going wherever the thread's [`Collectives`] sends them ([`as_member`]).
pub struct RankShardExecutor<'a, E: Executor> {
    whole: &'a Graph,
    executor: E,
    /// The rank graph as one stage ([`whole_rank_spec`]).
    rank_spec: StageSpec,
}

/// A stage of a [`RankShardExecutor`]: the rank's prepared graph and the stage's sends.
pub struct RankShardStage<S> {
    rank: S,
    sends: Vec<String>,
}

impl<'a, E: Executor> RankShardExecutor<'a, E> {
    /// The executor of one rank of a stage of `whole`, running `rank_spec` on `executor`.
    pub fn new(whole: &'a Graph, executor: E, rank_spec: StageSpec) -> RankShardExecutor<'a, E> {
        RankShardExecutor {
            whole,
            executor,
            rank_spec,
        }
    }
}

impl<E: Executor> Executor for RankShardExecutor<'_, E> {
    type Stage = RankShardStage<E::Stage>;

    fn prepare(&self, spec: &StageSpec) -> Result<Self::Stage, Error> {
        Ok(RankShardStage {
            rank: self.executor.prepare(&self.rank_spec)?,
            sends: spec
                .sends
                .iter()
                .map(|&t| self.whole.tensor(t).name.clone())
                .collect(),
        })
    }

    fn run(&self, stage: &Self::Stage, inputs: &Tensors) -> Result<Tensors, Error> {
        let outputs = self.executor.run(&stage.rank, inputs)?;
        Ok(relay(&stage.sends, inputs, outputs))
    }
}
