//! Calibration: replace a profile's efficiency defaults by measured ones.
//!
//! Runs one microbenchmark per op class at several sizes on the local device, takes the median
//! of repeated runs (robust to the runs a busy machine slows; their spread is recorded, and a
//! spread over 25% marks the measurement noisy), and writes a profile
//! whose efficiencies are `measured rate / profile peak`. Where the measured rate beats the
//! profile's peak (the profile underrates this machine), the peak is raised to the measurement
//! and the efficiency is 1.0, so that predicted times stay equal to measured ones.
//!
//! Only the CPU can be calibrated until the CUDA runtime exists: GPU kernels must be timed on the
//! GPU. Matrix products use the CPU runtime's own (the `gemm` crate),
//! with threads on every core, as the profile's peak counts every core.

use std::time::{Duration, Instant};

use crate::Error;
use pipecut_cost::hardware::{HardwareSpec, OpClass, Sourced};

/// One measurement: op class, size in words, and achieved fraction of the profile's peak.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The op class measured.
    pub class: OpClass,
    /// What ran, e.g. `sgemm 1024x1024x1024`.
    pub label: String,
    /// Achieved rate: FLOP/s for compute classes, bytes/s for memory classes (the median run).
    pub rate: f64,
    /// (p90 − p10) / median of the runs' times: above [`pipecut_cost::measured::NOISY_SPREAD`] the
    /// machine was too busy for the rate to be trusted.
    pub spread: f64,
}

/// A microbenchmark's repeated runs: the median (a busy machine slows some runs, rarely the
/// middle one) and the spread, (p90 − p10) / median.
#[derive(Debug, Clone, Copy)]
struct Timing {
    median_secs: f64,
    spread: f64,
}

/// Runs `f` until `budget` has passed (at least 5 times) after one warm-up run.
fn time_runs(budget: Duration, mut f: impl FnMut()) -> Timing {
    f(); // warm caches, page in buffers, start the matrix kernels' threads
    let start = Instant::now();
    let mut runs = Vec::new();
    while runs.len() < 5 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        runs.push(t.elapsed().as_secs_f64().max(1e-9));
    }
    let (median, p10, p90) = pipecut_cost::measured::percentiles(&runs);
    Timing {
        median_secs: median,
        spread: (p90 - p10) / median,
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Splits `out` into one chunk per core and runs `f(chunk_index, chunk)` on each.
fn parallel_chunks(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = out.len().div_ceil(threads());
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            let f = &f;
            s.spawn(move || f(i * chunk, part));
        }
    });
}

fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    crate::sgemm(m, k, n, 1.0, a, (k, 1), b, (n, 1), 0.0, c);
}

/// Problem sizes of the microbenchmarks.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Square GEMM sizes.
    pub matmul: Vec<usize>,
    /// Spatial side of the 64-channel 3x3 convolution.
    pub conv_side: usize,
    /// Element counts of the elementwise and reduction runs.
    pub vector: Vec<usize>,
    /// Sides of the square transposes.
    pub transpose: Vec<usize>,
}

impl Sizes {
    /// Sizes past the caches (vectors of 16M floats = 64 MB, a 4096² transpose = 128 MB
    /// moved), so memory-bound classes measure DRAM bandwidth as planned models see it.
    pub fn standard() -> Sizes {
        Sizes {
            matmul: vec![256, 512, 1024],
            conv_side: 56,
            vector: vec![1 << 22, 1 << 24],
            transpose: vec![1024, 4096],
        }
    }
}

/// Measures every op class. `budget` is the time per size (the whole run takes about 10× it).
pub fn measure_cpu(sizes: &Sizes, budget: Duration) -> Vec<Measurement> {
    let mut results = Vec::new();
    for &n in &sizes.matmul {
        let a = vec![1.0f32; n * n];
        let b = vec![0.5f32; n * n];
        let mut c = vec![0.0f32; n * n];
        let timing = time_runs(budget, || sgemm(n, n, n, &a, &b, &mut c));
        results.push(Measurement {
            class: OpClass::Matmul,
            label: format!("sgemm {n}x{n}x{n}"),
            rate: 2.0 * (n * n * n) as f64 / timing.median_secs,
            spread: timing.spread,
        });
    }
    // A ResNet-style 3x3 convolution as im2col + GEMM: 64 → 64 channels on 56x56.
    let (channels, side, kernel) = (64usize, sizes.conv_side, 3usize);
    let input = vec![1.0f32; channels * side * side];
    let weights = vec![0.1f32; channels * channels * kernel * kernel];
    let rows = channels * kernel * kernel;
    let mut columns = vec![0.0f32; rows * side * side];
    let mut output = vec![0.0f32; channels * side * side];
    let timing = time_runs(budget, || {
        im2col_3x3(&input, channels, side, &mut columns);
        sgemm(channels, rows, side * side, &weights, &columns, &mut output);
    });
    let conv_flops = 2.0 * (channels * side * side * rows) as f64;
    results.push(Measurement {
        class: OpClass::Conv,
        label: format!("conv 3x3 64->64 {side}x{side} (im2col+sgemm)"),
        rate: conv_flops / timing.median_secs,
        spread: timing.spread,
    });

    for &elements in &sizes.vector {
        let a = vec![1.0f32; elements];
        let b = vec![2.0f32; elements];
        let mut c = vec![0.0f32; elements];
        let timing = time_runs(budget, || {
            parallel_chunks(&mut c, |start, part| {
                for (i, out) in part.iter_mut().enumerate() {
                    *out = a[start + i] + b[start + i];
                }
            })
        });
        results.push(Measurement {
            class: OpClass::Elementwise,
            label: format!("add {elements} f32"),
            rate: 12.0 * elements as f64 / timing.median_secs,
            spread: timing.spread,
        });

        let mut partial = vec![0.0f32; threads()];
        let timing = time_runs(budget, || {
            let chunk = elements.div_ceil(threads());
            parallel_chunks(&mut partial, |t, slot| {
                let part = &a[(t * chunk).min(elements)..((t + 1) * chunk).min(elements)];
                slot[0] = sum_lanes(part);
            });
        });
        results.push(Measurement {
            class: OpClass::Reduction,
            label: format!("sum {elements} f32"),
            rate: 4.0 * elements as f64 / timing.median_secs,
            spread: timing.spread,
        });
    }
    for &side in &sizes.transpose {
        let a = vec![1.0f32; side * side];
        let mut t = vec![0.0f32; side * side];
        let timing = time_runs(budget, || transpose(&a, side, &mut t));
        results.push(Measurement {
            class: OpClass::DataMovement,
            label: format!("transpose {side}x{side} f32"),
            rate: 8.0 * (side * side) as f64 / timing.median_secs,
            spread: timing.spread,
        });
    }
    results
}

/// Sum with eight independent accumulators, so the compiler can vectorise it as a tuned
/// reduction kernel would (a single f32 accumulator serialises on the add latency).
fn sum_lanes(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = values.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

fn im2col_3x3(input: &[f32], channels: usize, side: usize, columns: &mut [f32]) {
    let pixels = side * side;
    for c in 0..channels {
        for ky in 0..3 {
            for kx in 0..3 {
                let row = (c * 9 + ky * 3 + kx) * pixels;
                for y in 0..side {
                    for x in 0..side {
                        let (sy, sx) = (y as isize + ky as isize - 1, x as isize + kx as isize - 1);
                        let inside =
                            sy >= 0 && sx >= 0 && (sy as usize) < side && (sx as usize) < side;
                        columns[row + y * side + x] = if inside {
                            input[c * pixels + sy as usize * side + sx as usize]
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// Blocked transpose, rows split across cores.
fn transpose(a: &[f32], side: usize, out: &mut [f32]) {
    const BLOCK: usize = 32;
    parallel_chunks(out, |start, part| {
        let first_row = start / side;
        let rows = part.len() / side;
        for rb in (0..rows).step_by(BLOCK) {
            for cb in (0..side).step_by(BLOCK) {
                for r in rb..(rb + BLOCK).min(rows) {
                    for c in cb..(cb + BLOCK).min(side) {
                        part[r * side + c] = a[c * side + first_row + r];
                    }
                }
            }
        }
    });
}

/// A copy of `base` with efficiencies (and, where exceeded, peaks) from `measurements`: the
/// largest size of each class decides, since planned models run large kernels.
pub fn calibrated_profile(
    base: &HardwareSpec,
    measurements: &[Measurement],
) -> Result<HardwareSpec, Error> {
    if base.kind != "cpu" {
        return Err(Error::Profile {
            origin: base.name.clone(),
            detail: "only CPU profiles can be calibrated in this build; GPU kernels must be timed on the GPU by the CUDA runtime".into(),
        });
    }
    let mut spec = base.clone();
    spec.name = format!("{}-calibrated", base.name);
    spec.aliases = Vec::new();
    for class in OpClass::ALL {
        let of_class: Vec<&Measurement> =
            measurements.iter().filter(|m| m.class == class).collect();
        let Some(largest) = of_class.last() else {
            continue;
        };
        let compute_bound = matches!(class, OpClass::Matmul | OpClass::Conv);
        let peak = if compute_bound {
            spec.peak_flops_per_sec
                .fp32
                .value
                .unwrap_or(f64::MIN_POSITIVE)
        } else {
            spec.memory_bandwidth_bytes_per_sec.value
        };
        let mut efficiency = largest.rate / peak;
        let all: Vec<String> = of_class
            .iter()
            .map(|m| {
                format!(
                    "{} {:.3e}/s (spread {:.0}%)",
                    m.label,
                    m.rate,
                    m.spread * 100.0
                )
            })
            .collect();
        let mut source = format!("measured by `pipecut calibrate` on this machine ({} threads): {}; efficiency = {:.3e} / {:.3e} peak", threads(), all.join(", "), largest.rate, peak);
        if efficiency > 1.0 {
            source.push_str(
                "; the measurement beat the profile's peak, so the peak was raised to it",
            );
            if compute_bound {
                spec.peak_flops_per_sec.fp32 = Sourced {
                    value: Some(largest.rate),
                    source: format!(
                        "raised to the rate measured by `pipecut calibrate` ({})",
                        largest.label
                    ),
                };
            } else {
                spec.memory_bandwidth_bytes_per_sec = Sourced {
                    value: largest.rate,
                    source: format!(
                        "raised to the rate measured by `pipecut calibrate` ({})",
                        largest.label
                    ),
                };
            }
            efficiency = 1.0;
        }
        *spec.efficiency.sourced_mut(class) = Sourced {
            value: efficiency,
            source,
        };
    }
    // Raised peaks change earlier efficiencies' denominators only for their own class, so a
    // second pass is not needed: every class compares with the peak it is timed against.
    spec.notes = format!("Calibrated from '{}'. {}", base.name, base.notes);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_cost::Catalog;

    #[test]
    fn calibration_writes_measured_efficiencies_in_range() {
        let catalog = Catalog::builtin();
        let cpu = catalog.device("cpu").unwrap();
        let sizes = Sizes {
            matmul: vec![64, 128],
            conv_side: 16,
            vector: vec![1 << 16],
            transpose: vec![256],
        };
        let measurements = measure_cpu(&sizes, Duration::from_millis(5));
        assert_eq!(measurements.len(), 2 + 1 + 2 + 1);
        let spec = calibrated_profile(cpu, &measurements).unwrap();
        for class in OpClass::ALL {
            let e = spec.efficiency.of(class);
            assert!(e > 0.0 && e <= 1.0, "{class:?}: {e}");
        }
        assert!(spec.efficiency.matmul.source.contains("sgemm 128x128x128"));
        // The calibrated profile is itself a valid profile.
        let mut catalog = catalog.clone();
        catalog
            .add_device_json(&serde_json::to_string(&spec).unwrap(), "calibrated")
            .unwrap();
    }

    #[test]
    fn gpus_are_not_calibrated_from_the_cpu() {
        let catalog = Catalog::builtin();
        let err = calibrated_profile(catalog.device("H100-SXM").unwrap(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("only CPU"), "{err}");
    }
}
