//! The per-GPU part of a tensor-parallel plan: for each stage and tensor-parallel rank, the
//! GPUs that hold it (one per data-parallel replica) and the weight slices it holds, as
//! [`crate::partition::tensor_shard::ShardLayout`] derives them from the graph, and the blocks
//! of the stage left whole, with the reason. `pipecut export` writes the same slices into
//! `stage_<k>.rank_<r>.onnx`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::partition::tensor_parallel::TensorParallelBlocks;
use crate::partition::tensor_shard::ShardLayout;
use crate::Error;
use pipecut_ir::graph::{Graph, NodeId, TensorId};

/// One stage of a tensor-parallel plan, split over its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanStageShards {
    /// The stage.
    pub stage: u32,
    /// The row linear of each block split over the group (each followed by an `ai.pipecut`
    /// `AllReduce` in the exported rank files).
    pub split_blocks: Vec<String>,
    /// The blocks every rank runs whole, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whole_blocks: Vec<WholeBlock>,
    /// Each rank of the group.
    pub ranks: Vec<PlanRank>,
}

/// A block left whole on every rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WholeBlock {
    /// Its row linear.
    pub row: String,
    /// Why it is not split.
    pub reason: String,
}

/// One tensor-parallel rank of a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanRank {
    /// Rank in the group, 0-based.
    pub tp_rank: u32,
    /// The GPU of this rank in each data-parallel replica (replica order).
    pub devices: Vec<u32>,
    /// The weights it holds a slice of; every other weight of the stage it holds whole.
    pub weights: Vec<WeightSliceEntry>,
}

/// A slice of a weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WeightSliceEntry {
    /// The weight (initializer) name.
    pub name: String,
    /// The whole weight's shape.
    pub shape: Vec<u64>,
    /// The axis it is split along.
    pub axis: u32,
    /// The half-open index ranges along that axis this rank holds, in order (one per part of a
    /// fused weight).
    pub ranges: Vec<[u64; 2]>,
}

/// The entry of `param`, of which a rank holds `ranges` along `axis`.
fn slice_entry(
    graph: &Graph,
    param: TensorId,
    axis: usize,
    ranges: Vec<std::ops::Range<u64>>,
) -> WeightSliceEntry {
    WeightSliceEntry {
        name: graph.tensor(param).name.clone(),
        axis: axis as u32,
        ranges: ranges.into_iter().map(|r| [r.start, r.end]).collect(),
        shape: graph.concrete_shape(param).unwrap_or_default(),
    }
}

/// The shards of each stage of a plan whose stages are `stages` (node names), split `degree`
/// ways, with `replicas[replica][stage]` the first GPU of each stage's group.
pub(crate) fn tensor_parallel_shards(
    graph: &Graph,
    stages: &[Vec<String>],
    replicas: &[Vec<u32>],
    degree: u32,
) -> Result<Vec<PlanStageShards>, Error> {
    let by_name: BTreeMap<&str, NodeId> =
        graph.nodes().map(|(id, n)| (n.name.as_str(), id)).collect();
    let blocks = TensorParallelBlocks::find(graph);
    let whole = ShardLayout::new(graph, &blocks, degree as u64);
    let name = |n: NodeId| graph.node(n).name.clone();
    stages
        .iter()
        .enumerate()
        .map(|(s, nodes)| {
            let set: BTreeSet<NodeId> = nodes
                .iter()
                .map(|n| {
                    by_name.get(n.as_str()).copied().ok_or_else(|| {
                        Error::InvalidPlan(format!(
                            "stage {s} names node '{n}', which the model lacks"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?;
            let layout = whole.within(&set);
            let ranks = (0..degree)
                .map(|rank| PlanRank {
                    tp_rank: rank,
                    devices: replicas
                        .iter()
                        .filter_map(|r| r.get(s))
                        .map(|&d| d + rank)
                        .collect(),
                    weights: layout
                        .split
                        .iter()
                        .flat_map(|b| &b.weights)
                        .map(|w| {
                            let shape = graph.concrete_shape(w.param).unwrap_or_default();
                            let size = shape.get(w.split.axis).copied().unwrap_or(0);
                            let ranges = w.split.ranges(size, degree as u64, rank as u64);
                            slice_entry(graph, w.param, w.split.axis, ranges)
                        })
                        .chain(layout.vocab.iter().map(|v| {
                            let held = v.held(degree as u64, rank as u64);
                            slice_entry(graph, v.param, v.axis, vec![held])
                        }))
                        .collect(),
                })
                .collect();
            Ok(PlanStageShards {
                stage: s as u32,
                split_blocks: layout.split.iter().map(|b| name(b.row)).collect(),
                whole_blocks: layout
                    .replicated
                    .iter()
                    .map(|b| WholeBlock {
                        row: name(b.row),
                        reason: b.reason.clone(),
                    })
                    .collect(),
                ranks,
            })
        })
        .collect()
}
