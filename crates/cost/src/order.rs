//! The order in which each device of a pipeline runs its forwards and backwards, schedule by
//! schedule. Memory (how many micro-batches a stage holds at once) depends on the order alone,
//! so it lives here below the planner; `pipecut_planner::schedule` adds the times.

use serde::Serialize;

/// A pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PipelineSchedule {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward in steady state.
    OneFOneB,
    /// 1F1B over `chunks` model chunks per device (virtual stages).
    Interleaved {
        /// Model chunks per device (≥ 2).
        chunks: usize,
    },
    /// ZB-H1 (Qi et al., ICLR'24): backwards split into input and weight gradients.
    ZeroBubble,
}

impl From<crate::Schedule> for PipelineSchedule {
    fn from(schedule: crate::Schedule) -> PipelineSchedule {
        match schedule {
            crate::Schedule::GPipe => PipelineSchedule::GPipe,
            crate::Schedule::OneFOneB => PipelineSchedule::OneFOneB,
            crate::Schedule::Interleaved { chunks } => PipelineSchedule::Interleaved {
                chunks: chunks as usize,
            },
            crate::Schedule::ZeroBubble => PipelineSchedule::ZeroBubble,
        }
    }
}

/// Forward, backward, or (zero-bubble only) the weight-gradient half of a backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A forward pass of one micro-batch through one stage.
    Forward,
    /// Its backward pass; under the zero-bubble schedule only the input gradient (Qi et al.'s
    /// B), which is all the previous stage waits for.
    Backward,
    /// The weight gradient (Qi et al.'s W), split from the backward by the zero-bubble
    /// schedule so that it can fill the pipeline's idle slots.
    WeightGradient,
}

/// The order in which device `device` runs its (kind, stage, micro-batch) operations.
pub fn device_order(
    schedule: PipelineSchedule,
    devices: usize,
    device: usize,
    microbatches: usize,
    training: bool,
) -> Vec<(OpKind, usize, usize)> {
    use OpKind::{Backward, Forward};
    let m = microbatches;
    match schedule {
        _ if !training => {
            let chunks = match schedule {
                PipelineSchedule::Interleaved { chunks } => chunks,
                _ => 1,
            };
            // Forward only: micro-batches in groups of `devices`, chunk by chunk, as Megatron
            // orders interleaved forwards; with one chunk this is plain 0..m.
            (0..m * chunks)
                .map(|j| {
                    (
                        Forward,
                        interleaved_chunk(j, devices, chunks, false) * devices + device,
                        interleaved_microbatch(j, devices, chunks),
                    )
                })
                .collect()
        }
        PipelineSchedule::GPipe => (0..m)
            .map(|i| (Forward, device, i))
            .chain((0..m).rev().map(|i| (Backward, device, i)))
            .collect(),
        PipelineSchedule::OneFOneB => {
            let warmup = (devices - device - 1).min(m);
            let mut order: Vec<_> = (0..warmup).map(|i| (Forward, device, i)).collect();
            for i in 0..m - warmup {
                order.push((Forward, device, warmup + i));
                order.push((Backward, device, i));
            }
            order.extend((m - warmup..m).map(|i| (Backward, device, i)));
            order
        }
        PipelineSchedule::ZeroBubble => zero_bubble_order(devices, device, m),
        PipelineSchedule::Interleaved { chunks } => {
            // Megatron-LM's interleaved schedule: forward j runs chunk (j / devices) % chunks of
            // micro-batch group j / (devices·chunks); backwards walk the chunks in reverse.
            let total = m * chunks;
            let warmup = ((devices - device - 1) * 2 + (chunks - 1) * devices).min(total);
            let forward = |j: usize| {
                (
                    Forward,
                    interleaved_chunk(j, devices, chunks, false) * devices + device,
                    interleaved_microbatch(j, devices, chunks),
                )
            };
            let backward = |j: usize| {
                (
                    Backward,
                    interleaved_chunk(j, devices, chunks, true) * devices + device,
                    interleaved_microbatch(j, devices, chunks),
                )
            };
            let mut order: Vec<_> = (0..warmup).map(forward).collect();
            for j in 0..total - warmup {
                order.push(forward(warmup + j));
                order.push(backward(j));
            }
            order.extend((total - warmup..total).map(backward));
            order
        }
    }
}

/// ZB-H1 (Qi et al., ICLR'24, § 2.1): 1F1B's warm-up of `K − d − 1` forwards, then one
/// forward and one input-gradient pass B per step, but device `d` runs the weight gradient W
/// of micro-batch `j` only after the B of micro-batch `j + d`. The B passes then reach the first
/// device without waiting for any W, and each device's deferred W passes fill the tail the
/// later stages idle through under 1F1B. Every device then holds at most `K` micro-batches
/// between their forward and their W, the first device's 1F1B peak.
fn zero_bubble_order(devices: usize, device: usize, m: usize) -> Vec<(OpKind, usize, usize)> {
    use OpKind::{Backward, Forward, WeightGradient};
    let warmup = (devices - device - 1).min(m);
    let delay = device;
    let mut order: Vec<_> = (0..warmup).map(|i| (Forward, device, i)).collect();
    let mut weights_done = 0;
    for j in 0..m {
        if warmup + j < m {
            order.push((Forward, device, warmup + j));
        }
        order.push((Backward, device, j));
        if j >= delay {
            order.push((WeightGradient, device, j - delay));
            weights_done = j - delay + 1;
        }
    }
    order.extend((weights_done..m).map(|i| (WeightGradient, device, i)));
    order
}

/// The moments of device `device`'s ZB-H1 order at which it holds the most, as
/// `(full, weight_pending)`: `full` micro-batches forwarded whose B is pending (all their
/// activations) and `weight_pending` micro-batches past B whose W is pending (only what W
/// reads). Every moment of the order is at or below one of them in both counts. For m ≥ K
/// they are `(K − d, d)`, just after a forward, and `(K − d − 1, d + 1)`, just after a B:
/// which one is the peak depends on the bytes, so a stage is charged the larger.
pub fn zero_bubble_held(devices: usize, device: usize, microbatches: usize) -> Vec<(u64, u64)> {
    // The most pending W at each count of pending B; then, from the most pending B down, the
    // moments that hold more pending W than every moment with more pending B.
    let mut most_pending: Vec<u64> = vec![0];
    let (mut full, mut pending) = (0usize, 0u64);
    for (kind, _, _) in zero_bubble_order(devices, device, microbatches) {
        match kind {
            OpKind::Forward => full += 1,
            OpKind::Backward => {
                full -= 1;
                pending += 1;
            }
            OpKind::WeightGradient => pending -= 1,
        }
        if most_pending.len() <= full {
            most_pending.resize(full + 1, 0);
        }
        most_pending[full] = most_pending[full].max(pending);
    }
    let mut peaks = Vec::new();
    let mut beaten: Option<u64> = None;
    for (full, &pending) in most_pending.iter().enumerate().rev() {
        if beaten.is_none_or(|most| pending > most) {
            peaks.push((full as u64, pending));
            beaten = Some(pending);
        }
    }
    peaks
}

/// Most micro-batches of chunk `chunk` that device `device` holds at once (forward run,
/// backward not yet) under Megatron's interleaved order with `devices` devices, `chunks`
/// chunks each and `microbatches` micro-batches: what the memory model charges that chunk.
/// Counting needs only the device's order, not the times. The device's chunks never peak
/// together more than their sum, so the per-chunk peaks bound the device's.
pub fn interleaved_chunk_in_flight(
    devices: usize,
    chunks: usize,
    device: usize,
    chunk: usize,
    microbatches: usize,
) -> u64 {
    let stage = chunk * devices + device;
    let (mut held, mut peak) = (0u64, 0u64);
    for (kind, s, _) in device_order(
        PipelineSchedule::Interleaved { chunks },
        devices,
        device,
        microbatches,
        true,
    ) {
        if s != stage {
            continue;
        }
        match kind {
            OpKind::Forward => {
                held += 1;
                peak = peak.max(held);
            }
            _ => held = held.saturating_sub(1),
        }
    }
    peak
}

fn interleaved_chunk(j: usize, devices: usize, chunks: usize, backward: bool) -> usize {
    let chunk = (j / devices) % chunks;
    if backward {
        chunks - 1 - chunk
    } else {
        chunk
    }
}

fn interleaved_microbatch(j: usize, devices: usize, chunks: usize) -> usize {
    (j / (devices * chunks)) * devices + j % devices
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks every device's ZB-H1 order and records each moment's (pending B, pending W).
    fn moments(devices: usize, device: usize, m: usize) -> Vec<(u64, u64)> {
        let (mut full, mut pending) = (0u64, 0u64);
        let mut seen = Vec::new();
        for (kind, _, _) in device_order(PipelineSchedule::ZeroBubble, devices, device, m, true) {
            match kind {
                OpKind::Forward => full += 1,
                OpKind::Backward => {
                    full -= 1;
                    pending += 1;
                }
                OpKind::WeightGradient => pending -= 1,
            }
            seen.push((full, pending));
        }
        seen
    }

    #[test]
    fn zero_bubble_holds_one_f_one_b_counts_of_full_micro_batches_and_d_of_weight_inputs() {
        for devices in 1..=8 {
            for m in 1..=3 * devices + 2 {
                for d in 0..devices {
                    let seen = moments(devices, d, m);
                    let peaks = zero_bubble_held(devices, d, m);
                    // Every moment lies under a peak, and every peak is a moment.
                    assert!(seen
                        .iter()
                        .all(|&(f, w)| peaks.iter().any(|&(g, v)| g >= f && v >= w)));
                    assert!(peaks.iter().all(|p| seen.contains(p)));
                    // Pending B never exceeds 1F1B's count, K − d (Qi et al.: ZB-H1 peaks
                    // as 1F1B does); micro-batches held in either state never exceed K.
                    let one_f_one_b = (devices - d).min(m) as u64;
                    assert!(seen
                        .iter()
                        .all(|&(f, w)| f <= one_f_one_b && f + w <= devices as u64));
                    // More micro-batches never hold less (the memory memo relies on it).
                    let more = zero_bubble_held(devices, d, m + 1);
                    assert!(peaks
                        .iter()
                        .all(|&(f, w)| more.iter().any(|&(g, v)| g >= f && v >= w)));
                    if m >= devices {
                        let (k, d) = (devices as u64, d as u64);
                        let expected = vec![(k - d, d), (k - d - 1, d + 1)];
                        assert_eq!(peaks, expected, "K={devices} d={d} m={m}");
                    }
                }
            }
        }
    }
}
