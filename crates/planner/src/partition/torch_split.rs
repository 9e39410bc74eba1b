//! PyTorch split points: a plan's stage boundaries moved to module boundaries, so that a team
//! can run the plan with the pipeline tools it already has instead of pipecut's stage ONNX files.
//!
//! Exporters write PyTorch module scopes into node names (`/model/layers.12/self_attn/MatMul`),
//! and [`super::layers`] recovers the family of numbered blocks from them (`/model/layers.0`,
//! `/model/layers.1`, …). A plan cuts the topological order anywhere; a PyTorch pipeline can
//! only cut between modules. For each cut of the plan this module picks the nearest boundary
//! between two consecutive numbered blocks whose whole assignment, re-evaluated with
//! [`PartitionProblem::evaluate`] (stages contiguous in the topological order), keeps the
//! bottleneck within a tolerance of the plan's, then states the resulting bottleneck and the
//! change. It writes the boundaries two ways:
//!
//! * the `split_spec` of `torch.distributed.pipelining.pipeline(module, mb_args,
//!   split_spec=...)`: `{"model.layers.12": SplitPoint.BEGINNING, ...}`, keyed by the module's
//!   qualified name as `named_modules()` spells it. The ONNX exporter writes a module at
//!   `/<attr>/<attr>.<index>`, the top module's attributes first, so the qualified name is the
//!   scope's segments joined by `.` (`/transformer/h.3` → `transformer.h.3`);
//! * DeepSpeed's layer boundaries: `PipelineModule` keeps `parts`, a list of `K + 1` layer
//!   indices where stage `s` holds layers `parts[s]..parts[s + 1]` (what a custom
//!   `_partition_layers` sets), over the layer list `[prologue, block 0, …, block N−1,
//!   epilogue]` that [`super::layers::find_layers_of_family`] recovers (the embeddings, the blocks, the
//!   final norm and head, as a DeepSpeed model lists its `LayerSpec`s).
//!
//! ```
//! use pipecut_cost::{Catalog, Cluster};
//! use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
//! use pipecut_planner::partition::torch_split::{torch_split, TorchSplitOutcome, DEFAULT_SPLIT_TOLERANCE};
//! use pipecut_planner::partition::{Planner, StageCount};
//!
//! let mut model = pipecut_ir::onnx::load_model("../../fixtures/models/gpt2_tiny.onnx")?;
//! ShapeInference::new(DimBindings::new().bind("batch", 8).bind("seq", 64)).run(&mut model.graph)?;
//! let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin())?;
//! let solution = Planner::new(&model.graph, &cluster)
//!     .with_stages(StageCount::Fixed(2))
//!     .solve()?;
//! let outcome = torch_split(&solution.problem, &solution.stage_of, DEFAULT_SPLIT_TOLERANCE)?;
//! let TorchSplitOutcome::Split(split) = outcome else { panic!("gpt2 has numbered blocks") };
//! assert!(split.split_spec_python().contains("SplitPoint.BEGINNING"));
//! assert!(split.boundaries[0].module.starts_with("transformer.h."));
//! # Ok::<(), pipecut_ir::Error>(())
//! ```
//!
//! # Complexity
//! With `B` block boundaries, `K` stages and `n` nodes: O(K · B · n) evaluations for the nearest
//! pass; when the nearest boundaries exceed the tolerance, O(min(C(B, K − 1), L) · n) to try every
//! choice of boundaries up to [`EXHAUSTIVE_LIMIT`] `L`, else O(R · K · B · n) for a local search
//! of at most [`MAX_SEARCH_ROUNDS`] rounds `R`.

use serde::Serialize;

use super::layers::{find_layers_of_family, repeated_family, BlockFamily, Layer};
use super::problem::{Evaluation, PartitionProblem, StageId};
use crate::Error;

/// Default tolerance on the bottleneck increase: 5 %. Module boundaries are coarse (a
/// transformer block is a few percent of a model's time), so an exact match is rare; 5 % is
/// below the spread of measured step times on shared clusters, so a user does not see it.
pub const DEFAULT_SPLIT_TOLERANCE: f64 = 0.05;

/// The local search stops after this many rounds over all cuts; each round that changes
/// nothing ends it earlier. Rounds only lower the bottleneck, and with `K ≤ 64` stages a few
/// rounds settle in practice; the bound keeps a pathological case from running long.
pub const MAX_SEARCH_ROUNDS: usize = 16;

/// When the nearest boundaries exceed the tolerance and at most this many ways exist to choose
/// the cuts among the block boundaries, all are tried, so the split is the best one possible
/// (e.g. 32 blocks, 4 stages: C(31, 3) = 4,495 is past it; 24 blocks, 4 stages: 1,771). Each
/// try is one O(n) evaluation, so the limit keeps this under a second for 10⁵-node graphs.
pub const EXHAUSTIVE_LIMIT: u64 = 4096;

/// `C(n, k)`, saturating.
fn combinations(n: usize, k: usize) -> u64 {
    let k = k.min(n.saturating_sub(k));
    let mut result: u64 = 1;
    for i in 0..k {
        // Exact at each step: the product of i + 1 consecutive numbers is divisible by (i + 1)!.
        result = result.saturating_mul((n - i) as u64) / (i as u64 + 1);
        if result > EXHAUSTIVE_LIMIT * 1024 {
            return u64::MAX;
        }
    }
    result
}

/// Advances `indices` (ascending, each `< n`) to the next combination in lexicographic order;
/// `false` after the last.
fn next_combination(indices: &mut [usize], n: usize) -> bool {
    let k = indices.len();
    for i in (0..k).rev() {
        if indices[i] < n - (k - i) {
            indices[i] += 1;
            for j in i + 1..k {
                indices[j] = indices[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// A stage boundary placed at the beginning of a numbered block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleBoundary {
    /// PyTorch qualified module name, e.g. `transformer.h.3`.
    pub module: String,
    /// The scope as the node names carry it, e.g. `/transformer/h.3`.
    pub scope: String,
    /// The block's index in its family (`3` for `h.3`).
    pub block_index: u64,
    /// The stage that starts at this block.
    pub stage: usize,
    /// Position of the block's first node in the topological order.
    pub position: usize,
    /// Position where the plan's stage started.
    pub plan_position: usize,
    /// The block's index in the DeepSpeed layer list ([`TorchSplit::layers`]).
    pub layer_index: usize,
}

/// The plan's boundaries moved to module boundaries, and what that costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchSplit {
    /// The block family as a qualified name, e.g. `transformer.h`.
    pub family: String,
    /// Numbered blocks found.
    pub block_count: usize,
    /// One boundary per cut: stage `s + 1` begins at `boundaries[s]`, ascending.
    pub boundaries: Vec<ModuleBoundary>,
    /// DeepSpeed's `parts`: `K + 1` layer indices, stage `s` holds layers `parts[s]..parts[s + 1]`.
    pub deepspeed_parts: Vec<usize>,
    /// The layer list `parts` indexes: `prologue`, the blocks' qualified names, `epilogue`.
    pub layers: Vec<String>,
    /// The plan's bottleneck ([`PartitionProblem::evaluate`] of its assignment).
    pub plan_bottleneck_secs: f64,
    /// The bottleneck with the stages starting at the module boundaries.
    pub bottleneck_secs: f64,
    /// `(bottleneck − plan bottleneck) / plan bottleneck`; negative when it is faster.
    pub bottleneck_change: f64,
    /// The tolerance asked for.
    pub tolerance: f64,
    /// Whether the change is within the tolerance.
    pub within_tolerance: bool,
    /// Whether every stage fits its device's memory.
    pub fits: bool,
    /// Whether the nearest boundaries exceeded the tolerance and a search picked others.
    pub searched: bool,
}

/// What [`torch_split`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TorchSplitOutcome {
    /// Every cut placed at a module boundary.
    Split(TorchSplit),
    /// The model has no usable module boundaries; the reason says why.
    NoModuleBoundaries {
        /// Why, in a sentence.
        reason: String,
    },
}

/// A candidate boundary: the start of a numbered block that follows another.
#[derive(Debug, Clone)]
struct Candidate {
    scope: String,
    block_index: u64,
    position: usize,
    layer_index: usize,
}

/// The qualified name (`named_modules()`) of the module at a scope: `/transformer/h.3` →
/// `transformer.h.3`, `/layer1/layer1.0` → `layer1.0`.
///
/// PyTorch's ONNX exporter names each module that runs by its *unqualified* name: the last
/// non-numeric atom of its qualified name and the numeric atoms after it
/// (`_unqualified_variable_name` in `torch/onnx/utils.py`), so `model.layers.12` is `layers.12`
/// and `layer1.0` stays `layer1.0`. Containers that do not run (`nn.ModuleList`) leave no
/// segment, so `/model/layers.12` is `model` then `layers.12`. Containers that do run
/// (`nn.Sequential`) leave their own segment, which the child's name repeats: `/layers/layers.0`
/// is `layers` then `layers.0`, i.e. `layers.0`. So a segment whose atoms extend the tail of the
/// path built so far adds only the new atoms; any other segment adds all of its atoms.
fn qualified_name(scope: &str) -> String {
    let mut atoms: Vec<&str> = Vec::new();
    for segment in scope.split('/').filter(|s| !s.is_empty()) {
        let segment_atoms: Vec<&str> = segment.split('.').collect();
        let overlap = (0..atoms.len())
            .map(|j| atoms.len() - j)
            .find(|&len| {
                len < segment_atoms.len() && atoms[atoms.len() - len..] == segment_atoms[..len]
            })
            .unwrap_or(0);
        atoms.extend_from_slice(&segment_atoms[overlap..]);
    }
    atoms.join(".")
}

/// `/transformer/h.3` → `("/transformer/h", 3)`, when the last segment is numbered.
fn numbered_scope(name: &str) -> Option<(&str, u64)> {
    if !name.starts_with('/') {
        return None;
    }
    let (family, index) = name.rsplit_once('.')?;
    let last = family.rsplit('/').next()?;
    if last.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((family, index.parse().ok()?))
}

/// The family whose blocks become the split points: the one the layer finder counts
/// ([`super::layers::repeated_family`]). Finer families give finer boundaries: a
/// sentence-transformers export wraps its encoder in an `nn.Sequential`
/// (`/model/model.0/encoder/layer.N`), and the encoder layers, not the two wrapper children, are
/// the blocks to cut between.
fn split_family(names: &[&str]) -> Option<BlockFamily> {
    repeated_family(names)
}

/// The numbered blocks of `family` among `layers`, as (layer index, family, block index).
fn blocks(layers: &[Layer], family: &str) -> Vec<(usize, String, u64)> {
    layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let (f, b) = numbered_scope(&l.name)?;
            (f == family).then(|| (i, f.to_string(), b))
        })
        .collect()
}

/// Where each stage after the first starts when `stage_of` is read as contiguous segments of
/// the order: the number of nodes on earlier stages (the start itself for a contiguous plan,
/// such as the DP's; for the MILP's convex but non-contiguous stages, the nearest contiguous
/// reading).
fn plan_cuts(stage_of: &[StageId], stages: usize) -> Vec<usize> {
    let mut count = vec![0usize; stages];
    for s in stage_of {
        count[s.index()] += 1;
    }
    let mut cuts = Vec::with_capacity(stages.saturating_sub(1));
    let mut before = 0;
    for c in count.iter().take(stages.saturating_sub(1)) {
        before += c;
        cuts.push(before);
    }
    cuts
}

/// Bottleneck and fit of stages starting at `0` and at `cuts`.
fn evaluate_cuts(problem: &PartitionProblem, cuts: &[usize]) -> Evaluation {
    let mut starts = Vec::with_capacity(cuts.len() + 1);
    starts.push(0);
    starts.extend_from_slice(cuts);
    problem.evaluate(&problem.contiguous_assignment(&starts))
}

/// Ranks an evaluation: fitting first, then the smaller bottleneck.
fn rank(evaluation: &Evaluation) -> (bool, f64) {
    (!evaluation.fits(), evaluation.bottleneck_secs)
}

/// Whether rank `a` beats rank `b`: it fits where `b` does not, or both fit (or both do not)
/// and its bottleneck is smaller.
fn better(a: (bool, f64), b: (bool, f64)) -> bool {
    match (a.0, b.0) {
        (false, true) => true,
        (true, false) => false,
        _ => a.1 < b.1,
    }
}

/// Moves the stage boundaries of `stage_of` (an assignment of `problem`, e.g. a
/// [`super::Solution`]'s) to boundaries between consecutive numbered blocks.
///
/// For each cut in order, the candidates are tried nearest first (ties to the earlier block),
/// the later cuts still where the plan has them; the first whose whole assignment fits and
/// keeps the bottleneck within `tolerance` of the plan's is taken, else the best one. When the
/// result still exceeds the tolerance, a local search moves one cut at a time to the boundary
/// that lowers the bottleneck most, until no move helps; or, when there are at most
/// [`EXHAUSTIVE_LIMIT`] ways to choose the cuts, tries them all.
///
/// Returns [`TorchSplitOutcome::NoModuleBoundaries`] when the node names carry no family of
/// numbered blocks, or too few blocks for the plan's stages. Errors when `tolerance` is negative
/// or above 1, or when `stage_of` is not an assignment of `problem`.
pub fn torch_split(
    problem: &PartitionProblem,
    stage_of: &[StageId],
    tolerance: f64,
) -> Result<TorchSplitOutcome, Error> {
    // Above 1 is almost surely a percentage typed as a number (`5` for 5 %), not a wish to
    // accept a bottleneck twice the plan's.
    if !(0.0..=1.0).contains(&tolerance) {
        return Err(Error::PartitionConfig(format!(
            "the split tolerance must be a fraction between 0 and 1 (0.05 for 5 %), got {tolerance}"
        )));
    }
    problem.check_assignment(stage_of)?;
    let blocks = match ModuleBlocks::find(problem) {
        Ok(blocks) => blocks,
        Err(reason) => return Ok(TorchSplitOutcome::NoModuleBoundaries { reason }),
    };
    // The plan as it is (the MILP's stages need not be contiguous in this order); its cuts, read
    // as contiguous segments, are only where the search starts.
    let plan_bottleneck = problem.evaluate(stage_of).bottleneck_secs;
    let search = CutSearch {
        problem,
        candidates: &blocks.candidates,
        cuts: plan_cuts(stage_of, problem.stage_count()),
        limit: plan_bottleneck * (1.0 + tolerance),
    };
    let mut chosen = search.nearest()?;
    let mut evaluation = search.evaluate(&chosen);
    let searched = !search.acceptable(&evaluation);
    if searched {
        if combinations(search.candidates.len(), search.cuts.len()) <= EXHAUSTIVE_LIMIT {
            search.try_all(&mut chosen, &mut evaluation);
        } else {
            search.local_search(&mut chosen, &mut evaluation);
        }
    }

    let bottleneck = evaluation.bottleneck_secs;
    let change = if plan_bottleneck > 0.0 {
        (bottleneck - plan_bottleneck) / plan_bottleneck
    } else {
        0.0
    };
    let boundaries = search.boundaries(&chosen);
    let mut deepspeed_parts = Vec::with_capacity(problem.stage_count() + 1);
    deepspeed_parts.push(0);
    deepspeed_parts.extend(boundaries.iter().map(|b| b.layer_index));
    deepspeed_parts.push(blocks.layers.len());
    Ok(TorchSplitOutcome::Split(TorchSplit {
        block_count: blocks.block_count,
        boundaries,
        deepspeed_parts,
        layers: blocks.layer_names(),
        family: blocks.family,
        plan_bottleneck_secs: plan_bottleneck,
        bottleneck_secs: bottleneck,
        bottleneck_change: change,
        tolerance,
        within_tolerance: search.acceptable(&evaluation),
        fits: evaluation.fits(),
        searched,
    }))
}

/// A model's numbered blocks, and the boundaries between them that a cut may move to.
struct ModuleBlocks {
    /// The layer list DeepSpeed's `parts` index: prologue, the blocks, epilogue.
    layers: Vec<Layer>,
    /// Numbered blocks found.
    block_count: usize,
    /// The family as `named_modules()` spells it, e.g. `model.layers`.
    family: String,
    /// Boundaries between two consecutive blocks: the start of every block but the first.
    candidates: Vec<Candidate>,
}

impl ModuleBlocks {
    /// The blocks of the family the node names carry; or why there are none, or too few for
    /// the problem's stages, in a sentence.
    fn find(problem: &PartitionProblem) -> Result<ModuleBlocks, String> {
        let stages = problem.stage_count();
        let names = problem.node_scopes();
        let (layers, blocks) = match split_family(&names) {
            Some(family) => {
                let layers = find_layers_of_family(&names, &family.family);
                let blocks = blocks(&layers, &family.family);
                (layers, blocks)
            }
            None => (Vec::new(), Vec::new()),
        };
        if blocks.len() < 2 {
            return Err(
                "no module boundaries found: the node names carry no family of numbered \
                        blocks (such as /model/layers.N/... or /transformer/h.N/...), so the plan \
                        cannot be expressed as PyTorch or DeepSpeed split points"
                    .into(),
            );
        }
        // `model.layers.0` → `model.layers`: the family as `named_modules()` spells it.
        let family = {
            let first = qualified_name(&format!("{}.{}", blocks[0].1, blocks[0].2));
            match first.rsplit_once('.') {
                Some((family, _)) => family.to_string(),
                None => first,
            }
        };
        let candidates: Vec<Candidate> = blocks
            .iter()
            .skip(1)
            .map(|(layer_index, f, block_index)| Candidate {
                scope: format!("{f}.{block_index}"),
                block_index: *block_index,
                position: layers[*layer_index].start,
                layer_index: *layer_index,
            })
            .collect();
        let cut_count = stages - 1;
        if candidates.len() < cut_count {
            return Err(format!(
                "no module boundaries for {stages} stages: the {} blocks of {family} leave {} \
                 {} between blocks, the plan needs {cut_count}",
                blocks.len(),
                candidates.len(),
                if candidates.len() == 1 {
                    "boundary"
                } else {
                    "boundaries"
                }
            ));
        }
        Ok(ModuleBlocks {
            layers,
            block_count: blocks.len(),
            family,
            candidates,
        })
    }

    /// The layer list by qualified name (`prologue` and `epilogue` as they are).
    fn layer_names(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|l| {
                if l.name.starts_with('/') {
                    qualified_name(&l.name)
                } else {
                    l.name.clone() // `prologue`, `epilogue`
                }
            })
            .collect()
    }
}

/// The search for module boundaries near a plan's cuts. A choice of boundaries is a list of
/// ascending indices into `candidates`, one per cut.
struct CutSearch<'a> {
    problem: &'a PartitionProblem,
    candidates: &'a [Candidate],
    /// The plan's cuts, read as contiguous segments of the order.
    cuts: Vec<usize>,
    /// The largest bottleneck within the tolerance of the plan's.
    limit: f64,
}

impl CutSearch<'_> {
    /// Whether a split fits and keeps the bottleneck within the tolerance.
    fn acceptable(&self, evaluation: &Evaluation) -> bool {
        evaluation.fits() && evaluation.bottleneck_secs <= self.limit
    }

    /// The positions where the chosen boundaries start their stages.
    fn positions(&self, chosen: &[usize]) -> Vec<usize> {
        chosen
            .iter()
            .map(|&c| self.candidates[c].position)
            .collect()
    }

    /// The stages that start at the chosen boundaries, evaluated.
    fn evaluate(&self, chosen: &[usize]) -> Evaluation {
        evaluate_cuts(self.problem, &self.positions(chosen))
    }

    /// The nearest pass: for each cut in order, the candidates nearest first (ties to the
    /// earlier block), the later cuts still where the plan has them; the first acceptable one,
    /// else the best.
    fn nearest(&self) -> Result<Vec<usize>, Error> {
        let (problem, candidates, cuts) = (self.problem, self.candidates, &self.cuts);
        let cut_count = cuts.len();
        let mut chosen: Vec<usize> = Vec::with_capacity(cut_count);
        for (i, &cut) in cuts.iter().enumerate() {
            let low = chosen.last().map_or(0, |&c| c + 1);
            let high = candidates.len() - (cut_count - i); // leaves one candidate per later cut
            let mut order: Vec<usize> = (low..=high).collect();
            order.sort_by_key(|&c| (candidates[c].position.abs_diff(cut), candidates[c].position));
            let mut best: Option<(usize, (bool, f64))> = None;
            for c in order {
                let mut trial = self.positions(&chosen);
                trial.push(candidates[c].position);
                // Later cuts where the plan has them, pushed right to keep the stages non-empty.
                let mut last = candidates[c].position;
                let mut valid = true;
                for &later in &cuts[i + 1..] {
                    let at = later.max(last + 1);
                    if at >= problem.node_count() {
                        valid = false;
                        break;
                    }
                    trial.push(at);
                    last = at;
                }
                if !valid {
                    continue;
                }
                let evaluation = evaluate_cuts(problem, &trial);
                if self.acceptable(&evaluation) {
                    best = Some((c, rank(&evaluation)));
                    break;
                }
                if best.is_none_or(|(_, r)| better(rank(&evaluation), r)) {
                    best = Some((c, rank(&evaluation)));
                }
            }
            // `low..=high` is never empty (enough candidates), and its last entry always leaves
            // room for the later cuts, so a candidate was ranked.
            let Some((c, _)) = best else {
                return Err(Error::PartitionConfig(format!(
                    "no module boundary could be placed for cut {} at position {cut}",
                    i + 1
                )));
            };
            chosen.push(c);
        }
        Ok(chosen)
    }

    /// Few enough choices to try them all: the best module boundaries, proven.
    fn try_all(&self, chosen: &mut Vec<usize>, evaluation: &mut Evaluation) {
        let mut trial: Vec<usize> = (0..self.cuts.len()).collect();
        loop {
            let candidate = self.evaluate(&trial);
            if better(rank(&candidate), rank(evaluation)) {
                *chosen = trial.clone();
                *evaluation = candidate;
            }
            if !next_combination(&mut trial, self.candidates.len()) {
                break;
            }
        }
    }

    /// Moves one cut at a time to the boundary that lowers the bottleneck most, for at most
    /// [`MAX_SEARCH_ROUNDS`] rounds, until no move helps.
    fn local_search(&self, chosen: &mut Vec<usize>, evaluation: &mut Evaluation) {
        for _ in 0..MAX_SEARCH_ROUNDS {
            let mut moved = false;
            for i in 0..self.cuts.len() {
                let low = if i == 0 { 0 } else { chosen[i - 1] + 1 };
                let high = chosen
                    .get(i + 1)
                    .map_or(self.candidates.len() - 1, |&c| c - 1);
                let current = chosen[i];
                for c in low..=high {
                    if c == current {
                        continue;
                    }
                    let mut trial = chosen.clone();
                    trial[i] = c;
                    let candidate = self.evaluate(&trial);
                    if better(rank(&candidate), rank(evaluation)) {
                        *chosen = trial;
                        *evaluation = candidate;
                        moved = true;
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// The chosen boundaries, each with the plan's cut it replaces.
    fn boundaries(&self, chosen: &[usize]) -> Vec<ModuleBoundary> {
        chosen
            .iter()
            .zip(&self.cuts)
            .enumerate()
            .map(|(i, (&c, &plan_position))| {
                let candidate = &self.candidates[c];
                ModuleBoundary {
                    module: qualified_name(&candidate.scope),
                    scope: candidate.scope.clone(),
                    block_index: candidate.block_index,
                    stage: i + 1,
                    position: candidate.position,
                    plan_position,
                    layer_index: candidate.layer_index,
                }
            })
            .collect()
    }
}

impl TorchSplit {
    /// The `split_spec` for `torch.distributed.pipelining.pipeline`, as Python source.
    pub fn split_spec_python(&self) -> String {
        let mut out = String::from(
            "from torch.distributed.pipelining import SplitPoint, pipeline\n\nsplit_spec = {\n",
        );
        for b in &self.boundaries {
            let module = python_string(&b.module);
            out.push_str(&format!("    {module}: SplitPoint.BEGINNING,\n"));
        }
        out.push_str("}\n# pipe = pipeline(model, mb_args=(microbatch,), split_spec=split_spec)\n");
        out
    }

    /// DeepSpeed's layer boundaries, as Python source with the layer list they index.
    pub fn deepspeed_parts_python(&self) -> String {
        let parts: Vec<String> = self.deepspeed_parts.iter().map(usize::to_string).collect();
        let layers: Vec<String> = self.layers.iter().map(|l| python_string(l)).collect();
        let mut out = format!(
            "# DeepSpeed PipelineModule: stage s holds layers parts[s]:parts[s + 1] of\n# [{}]\nparts = [{}]\n",
            layers.join(", "),
            parts.join(", ")
        );
        out.push_str(
            "# set self.parts to this list in a PipelineModule._partition_layers override\n",
        );
        out
    }
}

/// `text` as a Python string literal that evaluates to it and cannot end early: module names
/// come from the model's node names, which any bytes can be. JSON's string escapes (`\"`, `\\`,
/// `\n`, `\uXXXX` for control characters) are all Python's too, so a `"` or a line break in a
/// name stays inside the literal (and inside a comment line) instead of becoming code.
fn python_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::tests::chain;

    /// Issue 37: a node name with a quote and a line break put Python code in the snippet.
    #[test]
    fn hostile_module_names_stay_inside_string_literals() {
        let hostile = "h.1\"]\nimport os; os.system('touch PWNED')  # \u{7}";
        let split = TorchSplit {
            family: "h".into(),
            block_count: 2,
            boundaries: vec![ModuleBoundary {
                module: hostile.into(),
                scope: "/h.1".into(),
                block_index: 1,
                stage: 1,
                position: 1,
                plan_position: 1,
                layer_index: 2,
            }],
            deepspeed_parts: vec![0, 1, 2],
            layers: vec!["h.0".into(), hostile.into()],
            plan_bottleneck_secs: 1.0,
            bottleneck_secs: 1.0,
            bottleneck_change: 0.0,
            tolerance: 0.05,
            within_tolerance: true,
            fits: true,
            searched: false,
        };
        let spec = split.split_spec_python();
        assert!(!spec.lines().any(|l| l.starts_with("import os")), "{spec}");
        let entry = spec
            .lines()
            .find(|l| l.contains("SplitPoint.BEGINNING,"))
            .unwrap();
        let literal = entry.trim().trim_end_matches(": SplitPoint.BEGINNING,");
        assert_eq!(serde_json::from_str::<String>(literal).unwrap(), hostile);
        let parts = split.deepspeed_parts_python();
        assert_eq!(parts.lines().count(), 4, "{parts}");
        assert!(
            parts
                .lines()
                .all(|l| l.starts_with('#') || l.starts_with("parts = ")),
            "{parts}"
        );
    }
    use crate::partition::CostSettings;
    use pipecut_cost::{Catalog, Cluster, DeviceId};

    fn problem(stages: usize, nodes: usize) -> PartitionProblem {
        let graph = chain(nodes, 256, 64);
        let cluster = Cluster::parse(&format!("1x{stages}xH100-SXM"), &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..stages as u32).map(DeviceId).collect();
        PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    #[test]
    fn scopes_become_qualified_names() {
        assert_eq!(qualified_name("/transformer/h.3"), "transformer.h.3");
        assert_eq!(qualified_name("/model/layers.12"), "model.layers.12");
        assert_eq!(
            qualified_name("/bert/encoder/layer.1"),
            "bert.encoder.layer.1"
        );
        // nn.Sequential runs, so it has its own scope that the child's name repeats.
        assert_eq!(qualified_name("/layers/layers.3"), "layers.3");
        assert_eq!(qualified_name("/layer1/layer1.0"), "layer1.0");
        assert_eq!(qualified_name("/seq/seq.0/seq.0.1"), "seq.0.1");
        assert_eq!(
            numbered_scope("/model/layers.12"),
            Some(("/model/layers", 12))
        );
        assert_eq!(numbered_scope("prologue"), None);
        assert_eq!(numbered_scope("/conv1"), None);
    }

    #[test]
    fn combinations_are_counted_and_enumerated() {
        assert_eq!(combinations(5, 2), 10);
        assert_eq!(combinations(31, 3), 4495);
        assert_eq!(combinations(4, 0), 1);
        assert_eq!(combinations(10_000, 5), u64::MAX);
        let mut trial = vec![0, 1];
        let mut seen = vec![trial.clone()];
        while next_combination(&mut trial, 4) {
            seen.push(trial.clone());
        }
        assert_eq!(
            seen,
            [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]].map(|c| c.to_vec())
        );
    }

    /// `blocks` blocks of two equal MatMuls each, named as the exporter names
    /// `m.blocks[i].a` and `m.blocks[i].b`.
    fn two_node_blocks(blocks: usize) -> PartitionProblem {
        use pipecut_ir::graph::{DType, Dim, Graph, NodeSpec, Param, Storage};
        let width = 256;
        let mut b = Graph::builder("blocks");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F16),
            Some(vec![Dim::Known(64), Dim::Known(width)]),
        )
        .unwrap();
        let mut prev = "x".to_string();
        for i in 0..blocks {
            for half in ["a", "b"] {
                let w = format!("m.blocks.{i}.{half}.weight");
                let param = Param {
                    bytes: width * width * 2,
                    storage: Storage::Declared,
                };
                b.parameter(&w, DType::F16, &[width, width], param, None)
                    .unwrap();
                let out = format!("h{i}{half}");
                let name = format!("/m/blocks.{i}/{half}/MatMul");
                b.node(NodeSpec::new(&name, "MatMul", &[&prev, &w], &[&out]))
                    .unwrap();
                prev = out;
            }
        }
        b.output(&prev);
        let mut graph = b.build().unwrap();
        pipecut_ir::onnx::shape::ShapeInference::new(Default::default())
            .run(&mut graph)
            .unwrap();
        let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
        let devices = [DeviceId(0), DeviceId(1)];
        PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    #[test]
    fn a_cut_inside_a_block_moves_to_the_nearest_boundary_within_tolerance() {
        // Blocks at positions 0–1, 2–3, 4–5, 6–7; the plan cuts inside block 1, at 3 (3 | 5
        // nodes). Both neighbours are one position away: the earlier one (2 | 6 nodes) is
        // tried first and raises the bottleneck by about 20 %; the next (4 | 4) lowers it.
        let problem = two_node_blocks(4);
        let stage_of = problem.contiguous_assignment(&[0, 3]);
        let TorchSplitOutcome::Split(split) = torch_split(&problem, &stage_of, 0.05).unwrap()
        else {
            panic!("numbered blocks give boundaries");
        };
        assert_eq!(split.family, "m.blocks");
        let boundary = &split.boundaries[0];
        assert_eq!(
            (
                boundary.module.as_str(),
                boundary.position,
                boundary.plan_position
            ),
            ("m.blocks.2", 4, 3)
        );
        assert_eq!(
            split.layers,
            ["m.blocks.0", "m.blocks.1", "m.blocks.2", "m.blocks.3"]
        );
        assert_eq!(split.deepspeed_parts, vec![0, 2, 4]);
        assert!(split.bottleneck_change < 0.0 && split.within_tolerance && !split.searched);

        // With a 25 % tolerance the nearer, earlier boundary is good enough.
        let TorchSplitOutcome::Split(loose) = torch_split(&problem, &stage_of, 0.25).unwrap()
        else {
            panic!("numbered blocks give boundaries");
        };
        assert_eq!(loose.boundaries[0].module, "m.blocks.1");
        assert!(loose.bottleneck_change > 0.05 && loose.bottleneck_change <= 0.25);
    }

    #[test]
    fn a_plan_at_block_boundaries_is_kept() {
        let problem = problem(2, 8);
        let stage_of = problem.contiguous_assignment(&[0, 4]);
        let TorchSplitOutcome::Split(split) = torch_split(&problem, &stage_of, 0.0).unwrap() else {
            panic!("a chain of numbered blocks has boundaries");
        };
        assert_eq!(split.boundaries[0].module, "layers.4");
        assert_eq!(split.deepspeed_parts, vec![0, 4, 8]);
        assert!(split.bottleneck_change.abs() < 1e-12);
        assert!(split.within_tolerance && !split.searched);
    }

    #[test]
    fn one_block_per_stage_and_bad_tolerances() {
        let problem = problem(3, 3);
        let stage_of = problem.contiguous_assignment(&[0, 1, 2]);
        match torch_split(&problem, &stage_of, 0.05).unwrap() {
            TorchSplitOutcome::Split(split) => {
                assert_eq!(split.deepspeed_parts, vec![0, 1, 2, 3]);
                assert_eq!(split.layers, ["layers.0", "layers.1", "layers.2"]);
            }
            other => panic!("{other:?}"),
        }
        for bad in [-0.1, 5.0, f64::INFINITY] {
            let err = torch_split(&problem, &stage_of, bad).unwrap_err();
            assert!(err.to_string().contains("between 0 and 1"), "{err}");
        }
        let err = torch_split(&problem, &stage_of[..2], 0.05).unwrap_err();
        assert!(err.to_string().contains("nodes assigned"), "{err}");
    }
}
