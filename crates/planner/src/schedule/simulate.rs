//! The simulator: every device runs its operations in the order the schedule gives, each as soon
//! as the device is free and the operation's inputs have arrived.

use serde::Serialize;

use crate::Error;
use pipecut_cost::order::{device_order, OpKind, PipelineSchedule};
use pipecut_cost::Mode;

/// The most micro-batches per step that pipecut plans, checks or simulates: 65,536.
///
/// Why a cap: the simulator materialises every operation of a step (the timeline draws each
/// one), so its memory and time grow with stages × micro-batches, and the number comes from
/// the command line, a plan file or a C caller. Why this value: a pipeline needs a few times
/// as many micro-batches as stages to hide its bubble (GPipe's rule of thumb is m ≥ 4K), and
/// published large runs use at most a few thousand per step (Megatron-LM's 1,536–3,072-sample
/// global batches at micro-batch size 1, before dividing by data parallelism); 65,536 leaves an
/// order of magnitude above those while keeping every simulation under [`MAX_SIMULATED_OPS`]
/// for up to 32 stages in training.
pub const MAX_MICROBATCHES: u32 = 1 << 16;

/// The most operations (forwards plus backwards over all stages and micro-batches) one
/// simulation runs: 2^22. Each costs about 90 bytes while simulating (the op list, the device
/// orders and the completion tables), so a simulation stays under ~400 MB and about a second,
/// far inside the 4 GiB address space pipecut's robustness tests run it in.
pub const MAX_SIMULATED_OPS: usize = 1 << 22;

/// Refuses a micro-batch count over [`MAX_MICROBATCHES`], before anything is sized by it.
pub fn check_microbatches(microbatches: u64) -> Result<(), Error> {
    if microbatches > MAX_MICROBATCHES as u64 {
        return Err(Error::OverLimit {
            what: "the number of micro-batches per step".into(),
            value: microbatches.into(),
            limit: MAX_MICROBATCHES.into(),
            why: "the schedule simulator runs every micro-batch of a step; use a larger \
                  micro-batch size instead"
                .into(),
        });
    }
    Ok(())
}

/// Per-stage times for one micro-batch. With interleaving, "stage" means a model chunk: stage
/// `s` runs on device `s % devices`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageTimes {
    /// Forward time of each stage.
    pub forward_secs: Vec<f64>,
    /// Backward time of each stage (empty for inference).
    pub backward_secs: Vec<f64>,
    /// Time to send a stage's activations to the next stage (and gradients back), per stage
    /// boundary: `send_secs[s]` is between stage `s` and `s + 1`.
    pub send_secs: Vec<f64>,
}

/// One stage's costed figures per micro-batch, as a partition or a plan records them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageFiguresSecs {
    /// Compute time: forward, plus backward in training.
    pub compute_secs: f64,
    /// Receiving the stage's input activations.
    pub receive_secs: f64,
    /// Receiving the gradients flowing back (training only).
    pub gradient_receive_secs: f64,
}

impl StageTimes {
    /// Splits costed stage figures into the forward and backward times the simulator runs:
    /// receiving activations belongs to the forward, receiving gradients to the backward, and
    /// compute divides in the proportion `1 : `[`Mode::backward_time_factor`] (a recomputed
    /// forward belongs to the backward).
    /// Transfers are already inside the stage times, so `send_secs` is zero.
    pub fn from_stage_figures(mode: Mode, stages: &[StageFiguresSecs]) -> StageTimes {
        let send_secs = vec![0.0; stages.len().saturating_sub(1)];
        match mode {
            Mode::Inference => StageTimes {
                forward_secs: stages
                    .iter()
                    .map(|s| s.compute_secs + s.receive_secs)
                    .collect(),
                backward_secs: Vec::new(),
                send_secs,
            },
            Mode::Training { .. } => {
                let factor = mode.backward_time_factor();
                let share = factor / (1.0 + factor);
                StageTimes {
                    forward_secs: stages
                        .iter()
                        .map(|s| s.compute_secs * (1.0 - share) + s.receive_secs)
                        .collect(),
                    backward_secs: stages
                        .iter()
                        .map(|s| s.compute_secs * share + s.gradient_receive_secs)
                        .collect(),
                    send_secs,
                }
            }
        }
    }
}

/// One scheduled operation, with the times the simulation gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Op {
    /// Forward or backward.
    pub kind: OpKind,
    /// Stage (model chunk).
    pub stage: usize,
    /// Device running it.
    pub device: usize,
    /// Micro-batch.
    pub microbatch: usize,
    /// Start time.
    pub start_secs: f64,
    /// End time.
    pub end_secs: f64,
}

/// What the simulation found.
#[derive(Debug, Clone, Serialize)]
pub struct Simulation {
    /// Time from the first forward's start to the last operation's end.
    pub step_secs: f64,
    /// Idle share of the devices over the step: `1 − busy / (devices · step)`.
    pub bubble_fraction: f64,
    /// Most micro-batches whose activations each device holds at once (forward started,
    /// backward not finished); 1 for inference.
    pub peak_in_flight: Vec<usize>,
    /// Every operation, in start order.
    pub ops: Vec<Op>,
}

/// Simulates `microbatches` micro-batches through the stages under `schedule`.
///
/// # Complexity
/// O(S · m · D) for S stages, m micro-batches and D devices: each round scans the devices for
/// one whose next operation is ready.
pub fn simulate(
    times: &StageTimes,
    schedule: PipelineSchedule,
    microbatches: usize,
) -> Result<Simulation, Error> {
    let devices = step_devices(times, schedule, microbatches)?;
    let mut run = Run::new(times, schedule, devices, microbatches);
    loop {
        let mut progressed = false;
        for d in 0..devices {
            progressed |= run.run_next(d);
        }
        if !progressed {
            break;
        }
    }
    if run.next.iter().zip(&run.orders).any(|(n, o)| *n < o.len()) {
        return Err(unsimulable(
            "the schedule deadlocked (an operation waits for one that comes later on its device)"
                .into(),
        ));
    }
    Ok(run.finish())
}

/// The error of a step the simulator cannot run.
fn unsimulable(detail: String) -> Error {
    Error::InvalidGraph(format!("cannot simulate the schedule: {detail}"))
}

/// Checks that `microbatches` micro-batches through the stages of `times` under `schedule`
/// can be simulated (within [`MAX_MICROBATCHES`] and [`MAX_SIMULATED_OPS`]); gives the
/// devices the stages run on.
fn step_devices(
    times: &StageTimes,
    schedule: PipelineSchedule,
    microbatches: usize,
) -> Result<usize, Error> {
    let stages = times.forward_secs.len();
    let training = !times.backward_secs.is_empty();
    let chunks = match schedule {
        PipelineSchedule::Interleaved { chunks } => chunks,
        _ => 1,
    };
    if stages == 0 || microbatches == 0 {
        return Err(unsimulable(
            "it needs at least one stage and one micro-batch".into(),
        ));
    }
    if chunks == 0 || !stages.is_multiple_of(chunks) {
        return Err(unsimulable(format!(
            "{stages} stages cannot be split into {chunks} chunks per device"
        )));
    }
    if training && times.backward_secs.len() != stages {
        return Err(unsimulable(
            "backward times must be given for every stage".into(),
        ));
    }
    if times.send_secs.len() + 1 < stages {
        return Err(unsimulable(
            "send times must be given for every stage boundary".into(),
        ));
    }
    check_microbatches(microbatches as u64)?;
    let passes = match (training, schedule) {
        (false, _) => 1,
        (true, PipelineSchedule::ZeroBubble) => 3,
        (true, _) => 2,
    };
    let ops_needed = stages
        .checked_mul(microbatches)
        .and_then(|n| n.checked_mul(passes));
    if ops_needed.is_none_or(|n| n > MAX_SIMULATED_OPS) {
        return Err(Error::OverLimit {
            what: format!(
                "a step of {stages} stages × {microbatches} micro-batches, in operations"
            ),
            value: (stages as u128) * (microbatches as u128) * passes as u128,
            limit: MAX_SIMULATED_OPS as u128,
            why: "the simulator materialises every operation of the step; use fewer, larger \
                  micro-batches"
                .into(),
        });
    }
    let devices = stages / chunks;
    if chunks > 1 && training && !microbatches.is_multiple_of(devices) {
        return Err(unsimulable(format!("interleaving needs the micro-batches ({microbatches}) to be a multiple of the devices ({devices})")));
    }
    Ok(devices)
}

/// A simulation under way: each device's operations in schedule order, how far it has got,
/// and when each operation ended.
struct Run<'a> {
    times: &'a StageTimes,
    stages: usize,
    training: bool,
    /// Zero-bubble runs a backward as B then W; the activations stay until W.
    split_backward: bool,
    /// The share of the backward time one backward operation takes.
    backward_share: f64,
    /// Per device, its operations (kind, stage, micro-batch) in the schedule's order.
    orders: Vec<Vec<(OpKind, usize, usize)>>,
    /// `forward_done[stage][microbatch]` = end time, once run.
    forward_done: Vec<Vec<Option<f64>>>,
    /// `backward_done[stage][microbatch]` = end time, once run.
    backward_done: Vec<Vec<Option<f64>>>,
    /// Per device, the index of its next operation.
    next: Vec<usize>,
    free_at: Vec<f64>,
    busy: Vec<f64>,
    in_flight: Vec<usize>,
    peak_in_flight: Vec<usize>,
    ops: Vec<Op>,
}

impl<'a> Run<'a> {
    fn new(
        times: &'a StageTimes,
        schedule: PipelineSchedule,
        devices: usize,
        microbatches: usize,
    ) -> Run<'a> {
        let stages = times.forward_secs.len();
        let training = !times.backward_secs.is_empty();
        let orders: Vec<Vec<(OpKind, usize, usize)>> = (0..devices)
            .map(|d| device_order(schedule, devices, d, microbatches, training))
            .collect();
        // Zero-bubble runs a backward as B then W, each half of the backward time (Qi et al.
        // take T_B ≈ T_W; pipecut's backward is twice the forward, so each half is one
        // forward); the activations stay until W.
        let split_backward = training && schedule == PipelineSchedule::ZeroBubble;
        let ops = Vec::with_capacity(orders.iter().map(Vec::len).sum());
        Run {
            times,
            stages,
            training,
            split_backward,
            backward_share: if split_backward { 0.5 } else { 1.0 },
            orders,
            forward_done: vec![vec![None::<f64>; microbatches]; stages],
            backward_done: vec![vec![None::<f64>; microbatches]; stages],
            next: vec![0usize; devices],
            free_at: vec![0.0f64; devices],
            busy: vec![0.0f64; devices],
            in_flight: vec![0usize; devices],
            peak_in_flight: vec![if training { 0 } else { 1 }; devices],
            ops,
        }
    }

    /// Runs device `d`'s next operation when its inputs have arrived; whether it ran one.
    fn run_next(&mut self, d: usize) -> bool {
        let Some(&(kind, stage, mb)) = self.orders[d].get(self.next[d]) else {
            return false;
        };
        let times = self.times;
        let send = |s: usize| times.send_secs.get(s).copied().unwrap_or(0.0);
        let ready = match kind {
            OpKind::Forward if stage == 0 => Some(0.0),
            OpKind::Forward => self.forward_done[stage - 1][mb].map(|t| t + send(stage - 1)),
            OpKind::Backward if stage + 1 == self.stages => self.forward_done[stage][mb],
            OpKind::Backward => self.backward_done[stage + 1][mb]
                .map(|t| t + send(stage))
                .and_then(|t| self.forward_done[stage][mb].map(|f| t.max(f))),
            OpKind::WeightGradient => self.backward_done[stage][mb],
        };
        let Some(ready) = ready else { return false };
        let duration = match kind {
            OpKind::Forward => times.forward_secs[stage],
            OpKind::Backward | OpKind::WeightGradient => {
                times.backward_secs[stage] * self.backward_share
            }
        };
        let start = ready.max(self.free_at[d]);
        let end = start + duration;
        self.free_at[d] = end;
        self.busy[d] += duration;
        match kind {
            OpKind::Forward => {
                self.forward_done[stage][mb] = Some(end);
                if self.training {
                    self.in_flight[d] += 1;
                    self.peak_in_flight[d] = self.peak_in_flight[d].max(self.in_flight[d]);
                }
            }
            OpKind::Backward => {
                self.backward_done[stage][mb] = Some(end);
                if !self.split_backward {
                    self.in_flight[d] -= 1;
                }
            }
            OpKind::WeightGradient => self.in_flight[d] -= 1,
        }
        self.ops.push(Op {
            kind,
            stage,
            device: d,
            microbatch: mb,
            start_secs: start,
            end_secs: end,
        });
        self.next[d] += 1;
        true
    }

    /// The step's figures, its operations in start order.
    fn finish(self) -> Simulation {
        let devices = self.next.len();
        let mut ops = self.ops;
        let step_secs = ops.iter().map(|o| o.end_secs).fold(0.0, f64::max);
        let bubble_fraction = if step_secs > 0.0 {
            1.0 - self.busy.iter().sum::<f64>() / (devices as f64 * step_secs)
        } else {
            0.0
        };
        ops.sort_by(|a, b| {
            a.start_secs
                .total_cmp(&b.start_secs)
                .then(a.device.cmp(&b.device))
        });
        // The per-chunk in-flight count is per device; a device with v chunks holds v stages'
        // worth.
        Simulation {
            step_secs,
            bubble_fraction,
            peak_in_flight: self.peak_in_flight,
            ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn equal(stages: usize, forward: f64, backward: Option<f64>) -> StageTimes {
        StageTimes {
            forward_secs: vec![forward; stages],
            backward_secs: backward.map_or(Vec::new(), |b| vec![b; stages]),
            send_secs: vec![0.0; stages.saturating_sub(1)],
        }
    }

    #[test]
    fn gpipe_matches_the_closed_form_bubble() {
        for (k, m) in [(4usize, 8usize), (2, 1), (8, 32)] {
            let sim = simulate(&equal(k, 1.0, Some(2.0)), PipelineSchedule::GPipe, m).unwrap();
            // (m + K − 1)(t_f + t_b), bubble (K − 1)/(m + K − 1).
            assert!(
                (sim.step_secs - (m + k - 1) as f64 * 3.0).abs() < 1e-9,
                "{k} {m}: {}",
                sim.step_secs
            );
            let expected = (k - 1) as f64 / (m + k - 1) as f64;
            assert!((sim.bubble_fraction - expected).abs() < 1e-9);
            assert!(sim.peak_in_flight.iter().all(|&p| p == m));
        }
    }

    #[test]
    fn one_f_one_b_has_gpipes_step_but_bounded_memory() {
        let (k, m) = (4, 8);
        let sim = simulate(&equal(k, 1.0, Some(2.0)), PipelineSchedule::OneFOneB, m).unwrap();
        assert!(
            (sim.step_secs - (m + k - 1) as f64 * 3.0).abs() < 1e-9,
            "{}",
            sim.step_secs
        );
        assert_eq!(sim.peak_in_flight, vec![4, 3, 2, 1]);
    }

    #[test]
    fn inference_streams_forwards() {
        let sim = simulate(&equal(3, 2.0, None), PipelineSchedule::GPipe, 5).unwrap();
        assert!((sim.step_secs - (5 + 3 - 1) as f64 * 2.0).abs() < 1e-9);
    }

    #[test]
    fn transfers_and_the_slowest_stage_set_the_pace() {
        let times = StageTimes {
            forward_secs: vec![1.0, 3.0, 1.0],
            backward_secs: Vec::new(),
            send_secs: vec![0.5, 0.5],
        };
        let sim = simulate(&times, PipelineSchedule::GPipe, 4).unwrap();
        // First micro-batch: 1 + 0.5 + 3 + 0.5 + 1 = 6; then one every 3 s from the bottleneck.
        assert!(
            (sim.step_secs - (6.0 + 3.0 * 3.0)).abs() < 1e-9,
            "{}",
            sim.step_secs
        );
    }

    #[test]
    fn interleaving_shrinks_the_bubble() {
        let (devices, m) = (4, 8);
        let plain = simulate(
            &equal(devices, 2.0, Some(4.0)),
            PipelineSchedule::OneFOneB,
            m,
        )
        .unwrap();
        // The same model in 2 chunks per device: 8 stages of half the time each.
        let interleaved = simulate(
            &equal(2 * devices, 1.0, Some(2.0)),
            PipelineSchedule::Interleaved { chunks: 2 },
            m,
        )
        .unwrap();
        assert!(
            interleaved.step_secs < plain.step_secs,
            "{} vs {}",
            interleaved.step_secs,
            plain.step_secs
        );
        assert!(interleaved.bubble_fraction < plain.bubble_fraction);
        let count = interleaved.ops.len();
        assert_eq!(count, 2 * 2 * devices * m);
    }

    #[test]
    fn zero_bubble_matches_the_papers_bubble_at_one_f_one_bs_memory() {
        // Qi et al. (ICLR'24, § 2): 1F1B's step is m·(F + B + W) + (K − 1)(F + B + W), ZB-H1's
        // m·(F + B + W) + (K − 1)(F + B − W): a third of the bubble when F = B = W. Here the
        // backward of 2 s splits into B = W = 1 s; with F = 1.5 s the bubble is (K − 1)·1.5.
        for (k, m) in [(4usize, 8usize), (4, 4), (8, 32), (3, 7), (1, 3)] {
            for forward in [1.0, 1.5] {
                let times = equal(k, forward, Some(2.0));
                let zb = simulate(&times, PipelineSchedule::ZeroBubble, m).unwrap();
                let per_microbatch = forward + 2.0;
                let expected = m as f64 * per_microbatch + (k - 1) as f64 * forward;
                assert!(
                    (zb.step_secs - expected).abs() < 1e-9,
                    "K={k} m={m} F={forward}: {} against {expected}",
                    zb.step_secs
                );
                let one_f_one_b = simulate(&times, PipelineSchedule::OneFOneB, m).unwrap();
                let bubble = |step: f64| step - m as f64 * per_microbatch;
                if k > 1 && forward == 1.0 {
                    assert!(
                        (bubble(one_f_one_b.step_secs) - 3.0 * bubble(zb.step_secs)).abs() < 1e-9
                    );
                }
                // Every device holds K micro-batches from forward to W, 1F1B's first-device
                // peak; of those, device d holds K − d before B (1F1B's count) and the rest
                // past B, as the memory model charges them.
                for (device, &peak) in zb.peak_in_flight.iter().enumerate() {
                    assert_eq!(peak, k.min(m));
                    let held = pipecut_cost::memory::held_at_peaks(
                        Mode::training(),
                        pipecut_cost::Schedule::ZeroBubble,
                        device,
                        k,
                        m as u32,
                    );
                    let most = held.iter().map(|h| h.activations + h.weight_inputs).max();
                    assert_eq!(most, Some(peak as u64));
                    let before_b = held.iter().map(|h| h.activations).max();
                    assert_eq!(before_b, Some((k - device).min(m) as u64));
                }
                assert_eq!(zb.ops.len(), 3 * k * m);
            }
        }
    }

    #[test]
    fn interleaving_matches_megatrons_bubble_and_memory() {
        // Narayanan et al. 2021, § 2.2.2: with v chunks per device the bubble is
        // (K − 1)/v · (t_f + t_b), so the step is (m + (K − 1)/v)(t_f + t_b) for whole-device
        // times t_f, t_b; the first device holds (1 + (K − 1)/(v·K))·K devices' worth of
        // micro-batches, v·K + K − 1 chunk micro-batches.
        for (k, v, m) in [
            (4usize, 2usize, 8usize),
            (4, 2, 4),
            (2, 3, 4),
            (4, 4, 8),
            (8, 2, 16),
        ] {
            let times = equal(v * k, 1.0 / v as f64, Some(2.0 / v as f64));
            let sim = simulate(&times, PipelineSchedule::Interleaved { chunks: v }, m).unwrap();
            let expected = (m as f64 + (k - 1) as f64 / v as f64) * 3.0;
            assert!(
                (sim.step_secs - expected).abs() < 1e-9,
                "K={k} v={v} m={m}: {} against {expected}",
                sim.step_secs
            );
            let first = (1.0 + (k - 1) as f64 / (v * k) as f64) * k as f64 * v as f64;
            assert_eq!(sim.peak_in_flight[0], (first.round() as usize).min(v * m));
            // The memory model charges each chunk its own peak: together at least the device's
            // (so a device whose chunks fit their shares fits).
            for device in 0..k {
                let charged: u64 = (0..v)
                    .map(|chunk| {
                        pipecut_cost::memory::in_flight_microbatches(
                            Mode::training(),
                            pipecut_cost::Schedule::Interleaved { chunks: v as u32 },
                            chunk * k + device,
                            v * k,
                            m as u32,
                        )
                    })
                    .sum();
                assert!(charged >= sim.peak_in_flight[device] as u64);
                // Chunks peak at different moments; the sum overstates by under a round of K
                // per extra chunk (24 against 19 at K = 4, v = 4).
                let slack = ((v - 1) * k) as u64;
                assert!(
                    charged <= sim.peak_in_flight[device] as u64 + slack,
                    "K={k} v={v} m={m} d={device}: {charged} vs {}",
                    sim.peak_in_flight[device]
                );
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(simulate(
            &equal(3, 1.0, Some(1.0)),
            PipelineSchedule::Interleaved { chunks: 2 },
            4
        )
        .is_err());
        assert!(simulate(
            &equal(4, 1.0, Some(1.0)),
            PipelineSchedule::Interleaved { chunks: 2 },
            3
        )
        .is_err());
        assert!(simulate(&equal(4, 1.0, None), PipelineSchedule::GPipe, 0).is_err());
    }

    #[test]
    fn counts_over_the_limits_are_refused_before_allocating() {
        // u32::MAX micro-batches once allocated a 103 GB table and aborted.
        let message = simulate(
            &equal(4, 1.0, None),
            PipelineSchedule::GPipe,
            u32::MAX as usize,
        )
        .unwrap_err()
        .to_string();
        assert!(
            message.contains("micro-batches per step is 4294967295"),
            "{message}"
        );
        let message = simulate(&equal(4, 1.0, None), PipelineSchedule::GPipe, usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("over pipecut's limit of 65536"),
            "{message}"
        );
        // Within the micro-batch cap, but stages × micro-batches over the operation budget.
        let stages = 2 * MAX_SIMULATED_OPS / MAX_MICROBATCHES as usize;
        let message = simulate(
            &equal(stages, 1.0, Some(1.0)),
            PipelineSchedule::OneFOneB,
            MAX_MICROBATCHES as usize,
        )
        .unwrap_err()
        .to_string();
        assert!(message.contains("in operations"), "{message}");
        // The largest allowed inference step runs.
        let most = simulate(
            &equal(1, 1.0, None),
            PipelineSchedule::GPipe,
            MAX_MICROBATCHES as usize,
        )
        .unwrap();
        assert_eq!(most.ops.len(), MAX_MICROBATCHES as usize);
    }
}
