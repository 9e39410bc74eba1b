//! The peers' partitioners, reimplemented on pipecut's costs so that every plan can say how much
//! better it is than what a team would get from the tools they use today.
//!
//! Each baseline computes what the named release computes, decision for decision (ties, stop
//! rules and failures included), from the same inputs it would read: a list of layers (see
//! [`super::layers`]) for DeepSpeed and torchgpipe, the node order for PiPPy. pipecut then
//! evaluates the cut with the same stage times and memory as its own plan. Where the peer fails
//! (fewer layers than stages, an empty stage, an assertion), the baseline reports that failure
//! rather than repairing the cut: a team using the tool would get the error, not a plan.
//!
//! The releases read, and what each takes from pipecut's model in place of PyTorch:
//!
//! - DeepSpeed 0.19.8, `deepspeed/runtime/pipe/module.py` `PipelineModule._partition_layers` and
//!   `deepspeed/runtime/utils.py` `partition_uniform` / `partition_balanced` (unchanged since
//!   0.12). A layer's parameter count is the element count of every initializer its nodes read,
//!   a tied weight counted in each layer that reads it (DeepSpeed builds each `TiedLayerSpec`
//!   and counts its parameters per layer); a layer's type name is its scope name.
//! - torchgpipe 0.0.7, `torchgpipe/balance/__init__.py` `balance_by_time` and
//!   `torchgpipe/balance/blockpartition.py` `solve`. The profiled per-layer times are the cost
//!   model's times on the first stage's device. Training times are the forward times times one
//!   constant factor, which `solve`'s min–max normalisation cancels, so they stand in for the
//!   forward-only profile; the profiler's rounding to whole microseconds is not reproduced.
//! - PiPPy (`torchpippy`) 0.2.0, `pippy/ModelSplit.py` `split_into_equal_size`. ONNX nodes are
//!   the traced graph's `call_function` nodes and initializers its `get_attr` parameters.

use serde::{Deserialize, Serialize};

use super::layers::Layer;
use super::problem::PartitionProblem;

/// The regex DeepSpeed's `partition_method="type:REGEX"` is given unless `--baseline-layer-type`
/// says otherwise. Megatron-DeepSpeed's GPT passes `type:transformer`, which matches its
/// transformer-layer class; pipecut's layers are named after scopes, and the transformer blocks
/// are the numbered ones (`/model/layers.3`, `/transformer/h.11`), so the default matches a
/// name that ends in `.N`.
pub const DEFAULT_LAYER_TYPE: &str = r"\.[0-9]+$";

/// Checks a `type:REGEX` layer pattern before any solve: `Err` says why it is not a regex, in
/// one line.
pub fn check_layer_type(pattern: &str) -> Result<(), String> {
    regex_lite::Regex::new(pattern).map(|_| ()).map_err(|e| {
        let text = e.to_string();
        let why = text.lines().last().unwrap_or_default();
        format!("not a regex ({})", why.trim_start_matches("error: "))
    })
}

/// The peers' methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// DeepSpeed `PipelineModule(partition_method="uniform")`: equal numbers of layers per
    /// stage, the first stages taking one more when they do not divide
    /// (`deepspeed.runtime.utils.partition_uniform`).
    #[serde(rename = "deepspeed_uniform")]
    DeepSpeedUniform,
    /// DeepSpeed `partition_method="parameters"`: contiguous layers by parameter count, through
    /// `partition_balanced`'s dynamic programme, which keeps for each prefix the split with the
    /// smallest (heaviest − lightest) part and breaks ties towards the later cut.
    #[serde(rename = "deepspeed_parameters")]
    DeepSpeedParameters,
    /// DeepSpeed `partition_method="type:REGEX"` (Megatron-DeepSpeed's `type:transformer`):
    /// weight 1 for each layer whose name the regex matches, 0 for the others, then
    /// `partition_balanced`.
    #[serde(rename = "deepspeed_type")]
    DeepSpeedType,
    /// torchgpipe `balance_by_time`: per-layer times split by `blockpartition.solve`, a
    /// heuristic on min–max normalised times that stops once the heaviest block is within one
    /// (normalised) unit of the lightest.
    #[serde(rename = "torchgpipe_balance_by_time")]
    TorchGpipeByTime,
    /// PiPPy `split_into_equal_size` (`torchpippy` 0.2.0; torch.distributed.pipelining, which
    /// grew out of PiPPy, takes a `split_policy` like it but ships none): walks the nodes in
    /// order and starts a new stage before the node whose new parameters would push the stage
    /// past `total // stages` elements. The JSON name is the one plans have always used.
    #[serde(rename = "torch_pipelining_equal_size")]
    TorchEqualSize,
}

impl Baseline {
    /// All baselines, in the order plans list them.
    pub const ALL: [Baseline; 5] = [
        Baseline::DeepSpeedUniform,
        Baseline::DeepSpeedParameters,
        Baseline::DeepSpeedType,
        Baseline::TorchGpipeByTime,
        Baseline::TorchEqualSize,
    ];

    /// The release and method, for tables and plans: `deepspeed 0.19 parameters`. The type
    /// method names the regex it was given.
    pub fn peer(self, layer_type: &str) -> String {
        match self {
            Baseline::DeepSpeedUniform => "deepspeed 0.19 uniform".into(),
            Baseline::DeepSpeedParameters => "deepspeed 0.19 parameters".into(),
            Baseline::DeepSpeedType => format!("deepspeed 0.19 type:{layer_type}"),
            Baseline::TorchGpipeByTime => "torchgpipe 0.0.7 balance_by_time".into(),
            Baseline::TorchEqualSize => "pippy 0.2 split_into_equal_size".into(),
        }
    }

    /// Stage start positions the method picks, or why it fails to make `K` stages.
    /// `layer_type` is the type method's regex.
    pub fn starts(
        self,
        problem: &PartitionProblem,
        layers: &[Layer],
        layer_type: &str,
    ) -> Result<Vec<usize>, String> {
        let k = problem.stage_count();
        let by_layers = |bounds: Vec<usize>| -> Result<Vec<usize>, String> {
            // DeepSpeed returns empty parts when there are fewer layers than stages; the stage
            // that gets no layer has nothing to run.
            if let Some(stage) = bounds.windows(2).position(|w| w[0] >= w[1]) {
                return Err(format!(
                    "{} layers: stage {stage} gets none of them",
                    layers.len()
                ));
            }
            Ok(bounds[..k].iter().map(|&l| layers[l].start).collect())
        };
        match self {
            Baseline::DeepSpeedUniform => by_layers(partition_uniform(layers.len(), k)),
            Baseline::DeepSpeedParameters => {
                let counts: Vec<f64> = layers
                    .iter()
                    .map(|l| layer_param_elements(problem, l) as f64)
                    .collect();
                by_layers(partition_balanced(&counts, k)?)
            }
            Baseline::DeepSpeedType => {
                let weights = type_weights(layers, layer_type)?;
                by_layers(partition_balanced(&weights, k)?)
            }
            Baseline::TorchGpipeByTime => {
                // torchgpipe profiles on one device; the first stage's device stands in.
                let times: Vec<f64> = layers
                    .iter()
                    .map(|l| (l.start..l.end).map(|p| problem.node_secs(0, p)).sum())
                    .collect();
                by_layers(block_partition(&times, k)?)
            }
            Baseline::TorchEqualSize => {
                let elements: Vec<u64> = problem.params().iter().map(|p| p.elements).collect();
                equal_size_starts(&problem.node_params, &elements, k)
            }
        }
    }
}

/// Parameter elements of a layer: every initializer its nodes read, once per layer.
fn layer_param_elements(problem: &PartitionProblem, layer: &Layer) -> u64 {
    let mut read: Vec<u32> = (layer.start..layer.end)
        .flat_map(|p| problem.node_params[p].iter().copied())
        .collect();
    read.sort_unstable();
    read.dedup();
    read.iter()
        .map(|&i| problem.params()[i as usize].elements)
        .sum()
}

/// DeepSpeed's binary weights for `type:REGEX`. `_partition_layers` lowercases the whole method
/// string and keeps what lies between the first and second `:`, then searches each layer's
/// type name case-insensitively; no match at all is its `RuntimeError`.
fn type_weights(layers: &[Layer], layer_type: &str) -> Result<Vec<f64>, String> {
    let lowered = layer_type.to_lowercase();
    let pattern = lowered.split(':').next().unwrap_or_default();
    let regex = regex_lite::RegexBuilder::new(pattern)
        .case_insensitive(true)
        .build()
        .map_err(|e| format!("'{layer_type}' is not a regex: {e}"))?;
    let weights: Vec<f64> = layers
        .iter()
        .map(|l| if regex.is_match(&l.name) { 1.0 } else { 0.0 })
        .collect();
    if weights.iter().all(|&w| w == 0.0) {
        return Err(format!(
            "type:{layer_type} matches none of the {} layers",
            layers.len()
        ));
    }
    Ok(weights)
}

/// DeepSpeed's `partition_uniform`: the `parts + 1` boundaries of `items / parts` items each,
/// the remainder one each to the first parts; with no more items than parts, one item each and
/// the last parts empty.
pub fn partition_uniform(items: usize, parts: usize) -> Vec<usize> {
    if items <= parts {
        return (0..=parts).map(|p| p.min(items)).collect();
    }
    let chunk = items / parts;
    let residual = items % parts;
    (0..=parts).map(|p| p * chunk + p.min(residual)).collect()
}

/// Beyond this many inner steps (`n² · parts / 2`) DeepSpeed's dynamic programme is reported as
/// failing rather than run: about 5 ns each here, so 5·10⁷ steps are a quarter of a second
/// (minutes in DeepSpeed's Python loop), and a baseline must not eat the solve's time limit
/// (it runs twice, for `parameters` and `type:`). A count of work, not a deadline, so that
/// `pipecut check` re-derives the same answer. Reached by about 880 layers at 64 stages or
/// 2,200 at 10 (a 100k-node transformer of 2,438 layers at K = 64 is refused), and by models
/// without module scopes, where every node is its own layer.
const MAX_BALANCED_STEPS: f64 = 5e7;

/// DeepSpeed's `partition_balanced`: the `parts + 1` boundaries its dynamic programme picks.
///
/// For each prefix `i` and part count `j` it keeps one split: over the last cuts `k < i`, the one
/// whose parts' (max − min) is smallest, the later `k` on ties (`>=`), where max and min come
/// from the split kept for `(k, j − 1)`. That is not the split of the prefix with the smallest
/// spread, nor the smallest maximum. Infinite entries stand for the states DeepSpeed never
/// fills, with its `numpy.inf` arithmetic. With no more weights than parts it is
/// [`partition_uniform`].
///
/// # Complexity
/// O(n² · parts) time, O(n · parts) memory.
pub fn partition_balanced(weights: &[f64], parts: usize) -> Result<Vec<usize>, String> {
    let n = weights.len();
    let m = parts;
    if n <= m {
        return Ok(partition_uniform(n, m));
    }
    if (n as f64) * (n as f64) * (m as f64) / 2.0 > MAX_BALANCED_STEPS {
        return Err(format!(
            "its O(layers² · stages) search over {n} layers and {m} stages is out of reach"
        ));
    }
    let width = m + 1;
    let mut dp_max = vec![f64::INFINITY; (n + 1) * width];
    let mut dp_min = vec![f64::INFINITY; (n + 1) * width];
    let mut dp_cost = vec![f64::INFINITY; (n + 1) * width];
    let mut position = vec![0usize; (n + 1) * width];
    let mut prefix = vec![0.0; n + 1];
    for (i, &w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + w;
    }
    dp_max[0] = 0.0;
    dp_cost[0] = 0.0;
    for i in 1..=n {
        for j in 1..=i.min(m) {
            for k in 0..i {
                let segment = prefix[i] - prefix[k];
                let max_sum = dp_max[k * width + j - 1].max(segment);
                let min_sum = dp_min[k * width + j - 1].min(segment);
                let cost = max_sum - min_sum;
                let at = i * width + j;
                if dp_cost[at] >= cost {
                    dp_cost[at] = cost;
                    dp_max[at] = max_sum;
                    dp_min[at] = min_sum;
                    position[at] = k;
                }
            }
        }
    }
    let mut bounds = vec![n];
    for j in (1..=m).rev() {
        let last = *bounds.last().expect("bounds starts with n");
        bounds.push(position[last * width + j]);
    }
    bounds.reverse();
    Ok(bounds)
}

/// Beyond this many moves torchgpipe's `solve` is taken not to stop (its loop has no bound).
const MAX_BLOCK_MOVES: usize = 1_000_000;

/// Each move rescans every block (`O(n)`): past this many item visits the loop is also taken
/// not to stop, so that a long model's baseline stays within a fraction of a second (a count
/// of work, not a deadline, for the reason of [`MAX_BALANCED_STEPS`]).
const MAX_BLOCK_VISITS: usize = 100_000_000;

/// torchgpipe's `blockpartition.solve`: the `parts + 1` boundaries of its block partition of
/// `costs`, or its error.
///
/// Costs are normalised to `[0, 1]` (all zero when they are equal). Blocks start as `n / parts`
/// items each, the last taking the rest. Then: (1) take the heaviest block `p` (the last one on
/// ties); (2) stop when that weight, as taken in (1), is at most the lightest block's plus one;
/// (3) otherwise take the lightest block `q` (the first one on ties) and move into it the
/// neighbouring item on `p`'s side, going back to (1) when the block it came from is `p` and to
/// (2) otherwise. Boundaries may cross: a block then reads as Python reads the slice (empty, or
/// counted from the end when negative). `GPipe` refuses a balance with an empty block, so that
/// is this method failing.
///
/// # Complexity
/// O(parts · n) per move, at most [`MAX_BLOCK_MOVES`] moves.
pub fn block_partition(costs: &[f64], parts: usize) -> Result<Vec<usize>, String> {
    let n = costs.len();
    if n < parts {
        return Err(format!(
            "sequence is shorter than intended partitions ({n} < {parts})"
        ));
    }
    let minimum = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let range = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max) - minimum;
    let normal: Vec<f64> = if range == 0.0 {
        vec![0.0; n]
    } else {
        costs.iter().map(|&x| (x - minimum) / range).collect()
    };
    let mut splits: Vec<i64> = (0..parts - 1)
        .map(|x| ((n / parts) * (x + 1)) as i64)
        .chain([n as i64])
        .collect();
    let block_size = |splits: &[i64], i: usize| -> f64 {
        let (start, stop) = block_span(splits, i, n);
        normal[start..stop].iter().fold(0.0, |sum, &x| sum + x)
    };
    let mut moves = 0usize;
    loop {
        // Python's max over (size, index) tuples: the largest size, then the largest index.
        let (max_size, p) = (0..parts).map(|i| (block_size(&splits, i), i)).fold(
            (f64::NEG_INFINITY, 0),
            |best, next| {
                if next.0 >= best.0 {
                    next
                } else {
                    best
                }
            },
        );
        loop {
            // Python's min over the same tuples: the smallest size, then the smallest index.
            let (min_size, q) = (0..parts).map(|i| (block_size(&splits, i), i)).fold(
                (f64::INFINITY, 0),
                |best, next| {
                    if next.0 < best.0 {
                        next
                    } else {
                        best
                    }
                },
            );
            if max_size <= min_size + 1.0 {
                return gpipe_balance_bounds(&splits, n);
            }
            let h = if p < q {
                splits[q - 1] -= 1;
                q - 1
            } else {
                splits[q] += 1;
                q + 1
            };
            moves += 1;
            let limit = MAX_BLOCK_MOVES.min(MAX_BLOCK_VISITS / (n + parts));
            if moves > limit {
                return Err(format!("it did not settle after {limit} moves"));
            }
            if p == h {
                break;
            }
        }
    }
}

/// Block `i`'s items, `sequence[splits[i - 1]:splits[i]]` as Python slices it: a negative
/// index counts from the end, indices clamp to the sequence, and a reversed span is empty.
fn block_span(splits: &[i64], i: usize, n: usize) -> (usize, usize) {
    let clamp = |index: i64| -> usize {
        let index = if index < 0 { index + n as i64 } else { index };
        index.clamp(0, n as i64) as usize
    };
    let start = clamp(if i > 0 { splits[i - 1] } else { 0 });
    let stop = clamp(splits[i]);
    (start, stop.max(start))
}

/// The boundaries `GPipe` makes of `solve`'s blocks: their lengths laid end to end (it takes
/// the lengths, not the slices), refused when a block is empty or the lengths do not add up to
/// the layers (`GPipe`'s "all balance numbers must be positive integer" and "module and sum of
/// balance have different length").
fn gpipe_balance_bounds(splits: &[i64], n: usize) -> Result<Vec<usize>, String> {
    let balance: Vec<usize> = (0..splits.len())
        .map(|i| {
            let (start, stop) = block_span(splits, i, n);
            stop - start
        })
        .collect();
    if balance.contains(&0) || balance.iter().sum::<usize>() != n {
        return Err(format!(
            "its balance {balance:?} of {n} layers is one GPipe refuses"
        ));
    }
    let mut bounds = vec![0];
    for length in balance {
        bounds.push(bounds.last().expect("bounds starts with 0") + length);
    }
    Ok(bounds)
}

/// PiPPy's `split_into_equal_size`: stage starts over the node order, from each node's
/// parameters (`node_params[p]`, indices into `param_elements`).
///
/// The threshold is `total // stages`, the total counting each parameter once. Walking the
/// nodes that read parameters, a node's parameters not yet in the current stage are new, those
/// already in it repeated. The node joins the stage when the stage's size plus the new ones stays
/// within the threshold. Otherwise, when the stage is still empty the node becomes a stage of its
/// own (the cut goes after it and the next stage starts empty, its size not reset to the node's);
/// else the cut goes before it and the new stage starts with its new and repeated parameters, so
/// a tied weight is counted again in every stage that reads it. Nodes without parameters stay
/// where the walk is. The first `stages - 1` cuts are kept; fewer fail PiPPy's
/// `assert rv_nstages == nstages`, and a cut after the last node leaves a stage with nothing.
///
/// # Complexity
/// O(nodes + parameter reads · log).
pub(crate) fn equal_size_starts<P: AsRef<[u32]>>(
    node_params: &[P],
    param_elements: &[u64],
    stages: usize,
) -> Result<Vec<usize>, String> {
    let n = node_params.len();
    let total: u64 = param_elements.iter().sum();
    let threshold = total / stages as u64;
    let mut cuts: Vec<usize> = Vec::new();
    let mut size = 0u64;
    let mut in_stage: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    for (p, params) in node_params.iter().enumerate() {
        let params = params.as_ref();
        if params.is_empty() {
            continue;
        }
        let (repeated, new): (Vec<u32>, Vec<u32>) =
            params.iter().partition(|i| in_stage.contains(i));
        let elements =
            |list: &[u32]| -> u64 { list.iter().map(|&i| param_elements[i as usize]).sum() };
        let new_size = elements(&new);
        if size + new_size <= threshold {
            size += new_size;
            in_stage.extend(new);
        } else if size == 0 && new_size > threshold {
            cuts.push(p + 1);
        } else {
            cuts.push(p);
            size = elements(&repeated) + new_size;
            in_stage = repeated.into_iter().chain(new).collect();
        }
    }
    cuts.truncate(stages - 1);
    if cuts.len() + 1 < stages {
        return Err(format!(
            "it makes {} stages, not {stages} (PiPPy's assertion fails)",
            cuts.len() + 1
        ));
    }
    if cuts.last().is_some_and(|&c| c >= n) {
        return Err("its last cut comes after the last node, leaving a stage with none".into());
    }
    Ok(std::iter::once(0).chain(cuts).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_matches_deepspeed() {
        // partition_uniform(10, 4): chunksize 2, residual 2; arange gives [0, 2, 4, 6, 8], then
        // parts[1:] += 1 and parts[2:] += 1 give [0, 3, 6, 8, 10].
        assert_eq!(partition_uniform(10, 4), vec![0, 3, 6, 8, 10]);
        assert_eq!(partition_uniform(8, 4), vec![0, 2, 4, 6, 8]);
        // The trivial case: min(p, items) for every boundary, so the last part is empty.
        assert_eq!(partition_uniform(2, 3), vec![0, 1, 2, 2]);
    }

    #[test]
    fn balanced_is_deepspeeds_spread_programme() {
        // partition_balanced([1, 5, 2, 3], 3), prefix sums [0, 1, 6, 8, 11].
        // j = 1: (i, 1) = (max, min) = (prefix[i], prefix[i]), cost 0, from k = 0.
        // (2, 2): k = 0 reads dp_max[0, 1] = inf: cost inf, taken (inf >= inf);
        //         k = 1: max(1, 5) - min(1, 5) = 4, taken: (5, 1), from 1.
        // (3, 2): k = 1: max(1, 7) - 1 = 6; k = 2: max(6, 2) - min(6, 2) = 4, taken: (6, 2).
        // (4, 3): k = 0, 1 read unfilled states: inf, k = 1 taken last;
        //         k = 2: (5, 1) with 11 - 6 = 5: 5 - 1 = 4, taken;
        //         k = 3: (6, 2) with 11 - 8 = 3: 6 - 2 = 4, taken again (4 >= 4).
        // Back from (4, 3): 3, then position[3, 2] = 2, then position[2, 1] = 0: [0, 2, 3, 4],
        // parts 6, 2, 3. The smallest maximum, [1] [5] [2, 3] (5), has the same spread, 4, and
        // loses the tie to the later cut.
        assert_eq!(
            partition_balanced(&[1.0, 5.0, 2.0, 3.0], 3),
            Ok(vec![0, 2, 3, 4])
        );
        // No more weights than parts: partition_uniform.
        assert_eq!(partition_balanced(&[7.0, 1.0], 3), Ok(vec![0, 1, 2, 2]));
    }

    #[test]
    fn type_method_balances_the_matching_layers() {
        let layer = |name: &str, at: usize| Layer {
            name: name.into(),
            start: at,
            end: at + 1,
        };
        let layers = [
            layer("prologue", 0),
            layer("/model/layers.0", 1),
            layer("/model/layers.1", 2),
            layer("/model/layers.2", 3),
            layer("/model/layers.3", 4),
            layer("epilogue", 5),
        ];
        // Weights [0, 1, 1, 1, 1, 0]. partition_balanced into 2, prefix [0, 0, 1, 2, 3, 4, 4]:
        // (6, 2) over k = 1..5 with (k, 1) = (prefix[k], prefix[k]) and segment 4 - prefix[k]:
        // k = 1: 4 - 0 = 4; k = 2: 3 - 1 = 2; k = 3: 2 - 2 = 0; k = 4: 3 - 1 = 2;
        // k = 5: 4 - 0 = 4. Only k = 3 reaches 0: [0, 3, 6], two blocks each.
        let weights = type_weights(&layers, DEFAULT_LAYER_TYPE).unwrap();
        assert_eq!(weights, [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        assert_eq!(partition_balanced(&weights, 2), Ok(vec![0, 3, 6]));
        // DeepSpeed lowercases the method and searches case-insensitively, and a regex that
        // matches nothing is its RuntimeError.
        assert_eq!(
            type_weights(&layers, "LAYERS").unwrap(),
            [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        );
        assert!(type_weights(&layers, "transformer")
            .unwrap_err()
            .contains("matches none"));
    }

    #[test]
    fn block_partition_stops_as_torchgpipe_does() {
        // solve([8, 8, 8, 8, 9], 3): normalised [0, 0, 0, 0, 1], splits [1, 2, 5], blocks
        // weigh 0, 0, 1. The heaviest (1) is within one of the lightest (0): stop at once, with
        // balance [1, 1, 3] and times 8, 8, 25, where [8, 8] [8, 8] [9] would give 16.
        assert_eq!(
            block_partition(&[8.0, 8.0, 8.0, 8.0, 9.0], 3),
            Ok(vec![0, 1, 2, 5])
        );
        // Scale does not matter: normalisation divides it out.
        assert_eq!(
            block_partition(&[0.8, 0.8, 0.8, 0.8, 0.9], 3),
            Ok(vec![0, 1, 2, 5])
        );
    }

    #[test]
    fn block_partition_can_empty_a_block_which_gpipe_refuses() {
        // solve([2, 2, 8, 8], 3): normalised [0, 0, 1, 1], splits [1, 2, 4], blocks 0, 0, 2.
        // (1) p = 2 (size 2). (2) q = 0 (size 0, first of the ties); 2 > 0 + 1.
        // (3) q < p: move into block 0 from block 1: splits [2, 2, 4]; h = 1 != p, back to (2).
        // (2) blocks 0, 0 (empty slice [2:2]), 2: q = 0 again; splits [3, 2, 4]; h = 1.
        // (2) blocks [0, 0, 1] = 1, [3:2] = 0, [2:4] = 2: q = 1, still 2 > 0 + 1 (the maximum
        //     is not re-read in this loop). q < p: splits[1] += 1: [3, 3, 4]; h = 2 = p, to (1).
        // (1) blocks 1, 0, 1: p = 2. (2) q = 1: 1 <= 0 + 1, stop: balance [3, 0, 1].
        let err = block_partition(&[2.0, 2.0, 8.0, 8.0], 3).unwrap_err();
        assert!(err.contains("[3, 0, 1]"), "{err}");
        assert!(block_partition(&[1.0, 2.0], 3).is_err());
    }

    #[test]
    fn block_partition_that_never_settles_fails() {
        // solve([0, 0, 0, 0, 3, 8], 5): normalised [0, 0, 0, 0, 0.375, 1], splits
        // [1, 2, 3, 4, 6], blocks 0, 0, 0, 0, 1.375. (1) p = 4, maximum 1.375.
        // (2)-(3) q = 0 (the first empty block) four times: splits[0] goes to 5 (block 0 is
        //     [0:5] = 0.375, block 1 the reversed [5:2], empty).
        // Then q = 1 four times: splits[1] goes to 6 (block 1 = [5:6] = 1).
        // Then q = 2 for ever: splits[2] = 6, 7, 8, … leaves blocks 2 ([6:x]) and 3 ([x:4])
        // empty, the block moved from is h = 3, never p = 4, so (1) is never re-entered and the
        // stale maximum 1.375 stays above 0 + 1. torchgpipe loops; pipecut reports it.
        let err = block_partition(&[0.0, 0.0, 0.0, 0.0, 3.0, 8.0], 5).unwrap_err();
        assert!(err.contains("did not settle"), "{err}");
    }

    #[test]
    fn balanced_refuses_a_search_out_of_reach() {
        // 30,000 layers into 10 stages: 30,000² · 10 / 2 = 4.5·10⁹ steps, over the 2·10⁹ cap,
        // refused before any table is allocated.
        let err = partition_balanced(&vec![1.0; 30_000], 10).unwrap_err();
        assert!(err.contains("out of reach"), "{err}");
    }

    #[test]
    fn python_slices_count_from_the_end() {
        // sequence[-1:4] of 4 items is the last one; sequence[3:1] is empty.
        assert_eq!(block_span(&[-1, 4], 1, 4), (3, 4));
        assert_eq!(block_span(&[3, 1], 1, 4), (3, 3));
        assert_eq!(block_span(&[9, 4], 0, 4), (0, 4));
    }

    #[test]
    fn equal_size_cuts_before_the_node_that_overflows() {
        // Nodes: 0 reads A, 1 reads B, 2 reads nothing, 3 reads C and A (tied), 4 reads D;
        // 4 elements each, 16 in all, 2 stages: threshold 16 // 2 = 8.
        // 0: 0 + 4 <= 8, size 4 {A}. 1: 4 + 4 <= 8, size 8 {A, B}. 2: no parameters, skipped.
        // 3: C is new (4), A repeated (4): 8 + 4 > 8 and the stage is not empty, so the cut
        //    goes before 3 and the new stage holds A and C: size 8.
        // 4: 8 + 4 > 8: a cut before 4, which is past the first stages - 1 = 1 cuts kept.
        // Starts [0, 3]: node 2 stays in the first stage, and A is counted in both.
        let node_params = vec![vec![0], vec![1], vec![], vec![2, 0], vec![3]];
        let elements = [4, 4, 4, 4];
        assert_eq!(
            equal_size_starts(&node_params, &elements, 2),
            Ok(vec![0, 3])
        );
    }

    #[test]
    fn equal_size_fails_where_pippy_asserts() {
        // 10 + 1 + 1 elements into 3 stages: threshold 4. Node 0 alone exceeds it with the
        // stage empty: it becomes a stage (cut before 1) and the size stays 0. Nodes 1 and 2
        // fit (sizes 1, 2). One cut, two stages: `assert rv_nstages == nstages` fails.
        let node_params = vec![vec![0], vec![1], vec![2]];
        let err = equal_size_starts(&node_params, &[10, 1, 1], 3).unwrap_err();
        assert!(err.contains("2 stages, not 3"), "{err}");
        // Node 1 alone exceeds the threshold (10 // 2 = 5) with nothing before it: the cut goes
        // after the last node, and the second stage would hold nothing.
        let err = equal_size_starts(&[vec![], vec![0]], &[10], 2).unwrap_err();
        assert!(err.contains("after the last node"), "{err}");
    }
}
