//! The peers' partitioners, reimplemented on pipecut's costs so that every plan can say how much
//! better it is than what a team would get from the tools they use today.
//!
//! Each baseline cuts a list of layers (see [`super::layers`]) or nodes into contiguous stages,
//! as its original does; pipecut then evaluates the result with the same stage times and memory
//! as its own plan.

use serde::{Deserialize, Serialize};

use super::layers::Layer;
use super::problem::PartitionProblem;

/// The peers' methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// DeepSpeed `PipelineModule(partition_method="uniform")`: equal numbers of layers per
    /// stage, the first stages taking one more when they do not divide
    /// (`deepspeed.runtime.utils.partition_uniform`).
    #[serde(rename = "deepspeed_uniform")]
    DeepSpeedUniform,
    /// DeepSpeed `partition_method="parameters"`: contiguous layers balancing parameter counts,
    /// the smallest possible maximum (`deepspeed.runtime.utils.partition_balanced`).
    #[serde(rename = "deepspeed_parameters")]
    DeepSpeedParameters,
    /// torchgpipe `balance_by_time`: per-layer times split by the optimal block partition
    /// (`torchgpipe.balance.blockpartition.solve`). pipecut's cost model stands in for the
    /// profiling run; transfers are not part of its objective.
    #[serde(rename = "torchgpipe_balance_by_time")]
    TorchGpipeByTime,
    /// PyTorch pipelining `split_into_equal_size` (from PiPPy): walks the nodes in order and cuts
    /// after the node where the accumulated parameter size reaches total / stages.
    #[serde(rename = "torch_pipelining_equal_size")]
    TorchEqualSize,
}

impl Baseline {
    /// All baselines, in the order plans list them.
    pub const ALL: [Baseline; 4] = [
        Baseline::DeepSpeedUniform,
        Baseline::DeepSpeedParameters,
        Baseline::TorchGpipeByTime,
        Baseline::TorchEqualSize,
    ];

    /// A short name for tables.
    pub fn label(self) -> &'static str {
        match self {
            Baseline::DeepSpeedUniform => "deepspeed uniform",
            Baseline::DeepSpeedParameters => "deepspeed parameters",
            Baseline::TorchGpipeByTime => "torchgpipe balance_by_time",
            Baseline::TorchEqualSize => "torch pipelining equal size",
        }
    }

    /// Stage start positions the method picks, or why it cannot make `K` stages.
    pub fn starts(
        self,
        problem: &PartitionProblem,
        layers: &[Layer],
    ) -> Result<Vec<usize>, String> {
        let k = problem.stage_count();
        let by_layers = |parts: Vec<usize>| parts.iter().map(|&l| layers[l].start).collect();
        let too_few = || format!("{} layers cannot fill {k} stages", layers.len());
        match self {
            Baseline::DeepSpeedUniform => {
                if layers.len() < k {
                    return Err(too_few());
                }
                Ok(by_layers(uniform_starts(layers.len(), k)))
            }
            Baseline::DeepSpeedParameters => {
                if layers.len() < k {
                    return Err(too_few());
                }
                let weights: Vec<f64> = layers
                    .iter()
                    .map(|l| layer_param_bytes(problem, l) as f64)
                    .collect();
                Ok(by_layers(balanced_starts(&weights, k)))
            }
            Baseline::TorchGpipeByTime => {
                if layers.len() < k {
                    return Err(too_few());
                }
                // torchgpipe profiles on one device; the first stage's device stands in.
                let weights: Vec<f64> = layers
                    .iter()
                    .map(|l| (l.start..l.end).map(|p| problem.node_secs(0, p)).sum())
                    .collect();
                Ok(by_layers(balanced_starts(&weights, k)))
            }
            Baseline::TorchEqualSize => equal_size_starts(problem),
        }
    }
}

/// Parameter bytes of a layer, each weight counted at its first reader in the layer.
fn layer_param_bytes(problem: &PartitionProblem, layer: &Layer) -> u64 {
    problem
        .params()
        .iter()
        .filter(|p| {
            p.uses
                .iter()
                .any(|&u| (layer.start..layer.end).contains(&(u as usize)))
        })
        .map(|p| p.footprint_bytes)
        .sum()
}

/// DeepSpeed's `partition_uniform`: `items / parts` each, the remainder one each to the first.
pub fn uniform_starts(items: usize, parts: usize) -> Vec<usize> {
    let chunk = items / parts;
    let residual = items % parts;
    (0..parts).map(|p| p * chunk + p.min(residual)).collect()
}

/// Starts of the contiguous partition of `weights` into `parts` non-empty groups with the
/// smallest maximum group weight (bisection on the maximum with a greedy check, then the
/// greedy groups split further until there are exactly `parts`).
///
/// # Complexity
/// O(n · 64): 64 bisection steps of a linear greedy pass.
pub fn balanced_starts(weights: &[f64], parts: usize) -> Vec<usize> {
    let greedy = |bound: f64| -> Vec<usize> {
        let mut starts = vec![0usize];
        let mut sum = 0.0;
        for (i, &w) in weights.iter().enumerate() {
            if i > 0 && sum + w > bound {
                starts.push(i);
                sum = 0.0;
            }
            sum += w;
        }
        starts
    };
    let mut low = weights.iter().copied().fold(0.0, f64::max);
    let mut high = weights.iter().sum::<f64>().max(low);
    if greedy(low).len() > parts {
        for _ in 0..64 {
            let mid = 0.5 * (low + high);
            if greedy(mid).len() <= parts {
                high = mid;
            } else {
                low = mid;
            }
        }
    } else {
        high = low;
    }
    let mut starts = greedy(high);
    // Fewer groups than parts: split the last multi-item group, which never raises the maximum.
    while starts.len() < parts {
        let ends: Vec<usize> = starts
            .iter()
            .skip(1)
            .copied()
            .chain([weights.len()])
            .collect();
        let splittable = (0..starts.len())
            .rev()
            .find(|&g| ends[g] - starts[g] >= 2)
            .expect("there are at least as many items as parts");
        starts.insert(splittable + 1, ends[splittable] - 1);
    }
    starts
}

/// PiPPy's `split_into_equal_size`: cut after the node where accumulated parameter bytes reach
/// the per-stage share. When that makes fewer stages than asked, the last nodes become single
/// stages so the comparison still uses every device.
fn equal_size_starts(problem: &PartitionProblem) -> Result<Vec<usize>, String> {
    let n = problem.node_count();
    let k = problem.stage_count();
    if n < k {
        return Err(format!("{n} nodes cannot fill {k} stages"));
    }
    let mut first_use = vec![0u64; n];
    for param in problem.params() {
        first_use[param.uses[0] as usize] += param.footprint_bytes;
    }
    let total: u64 = first_use.iter().sum();
    let share = total / k as u64;
    let mut starts = vec![0usize];
    let mut accumulated = 0u64;
    for (p, &bytes) in first_use.iter().enumerate() {
        accumulated += bytes;
        if starts.len() < k && accumulated >= share && p + 1 < n && share > 0 {
            starts.push(p + 1);
            accumulated = 0;
        }
    }
    while starts.len() < k {
        let last = *starts.last().expect("starts is never empty");
        let free = (last + 1..n).rev().find(|q| !starts.contains(q));
        match free {
            Some(q) => {
                starts.push(q);
                starts.sort_unstable();
            }
            None => return Err("too few nodes after the last cut".into()),
        }
    }
    // Keep the stages non-empty and ordered.
    starts.sort_unstable();
    starts.dedup();
    if starts.len() != k {
        return Err("could not make distinct stages".into());
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_matches_deepspeed() {
        // deepspeed partition_uniform(10, 4) -> parts [0, 3, 6, 8, 10]
        assert_eq!(uniform_starts(10, 4), vec![0, 3, 6, 8]);
        assert_eq!(uniform_starts(8, 4), vec![0, 2, 4, 6]);
    }

    #[test]
    fn balanced_minimises_the_largest_group() {
        let starts = balanced_starts(&[1.0, 1.0, 1.0, 1.0, 4.0], 2);
        assert_eq!(starts, vec![0, 4]);
        let starts = balanced_starts(&[5.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3);
        // Max 5 is forced; the greedy groups [5][1,1,1,1,1] are split to three groups.
        assert_eq!(starts.len(), 3);
        assert_eq!(starts[0], 0);
        assert_eq!(starts[1], 1);
        assert_eq!(balanced_starts(&[1.0, 1.0, 1.0], 3), vec![0, 1, 2]);
    }
}
