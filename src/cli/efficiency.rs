//! Throughput in tokens/s and model FLOPs utilisation, printed under the partition and
//! plan-cluster tables.
//!
//! MFU = model FLOPs / (time × peak): the FLOPs the model needs (forward, plus backward in
//! training; recomputation and idle time are not counted as useful), over the simulated step,
//! against the tensor-core peak of every GPU the step occupies at the model's weight dtype.

use crate::cost::{Cluster, CostModel, DeviceId, Mode, UnknownOpCost};
use crate::graph::{DType, Graph};

/// The sequence dim among bound dims: the first whose name says so (`seq`, `sequence`,
/// `seq_len`, `sequence_length`).
pub(crate) fn sequence_dim<'a>(
    dims: impl IntoIterator<Item = (&'a String, &'a u64)>,
) -> Option<(&'a str, u64)> {
    dims.into_iter()
        .find(|(name, _)| {
            let name = name.to_ascii_lowercase();
            name == "seq" || name.starts_with("seq_") || name.starts_with("sequence")
        })
        .map(|(name, &value)| (name.as_str(), value))
}

/// The dtype most parameter bytes have (fp32 for a model without float parameters): the
/// precision its matmuls run at, so the peak MFU is measured against.
pub(crate) fn weight_dtype(graph: &Graph) -> DType {
    let mut bytes_by_dtype: Vec<(DType, u64)> = Vec::new();
    for (_, tensor) in graph.tensors() {
        if let (Some(param), Some(dtype)) = (tensor.param(), tensor.dtype) {
            match bytes_by_dtype.iter_mut().find(|(d, _)| *d == dtype) {
                Some((_, bytes)) => *bytes += param.bytes,
                None => bytes_by_dtype.push((dtype, param.bytes)),
            }
        }
    }
    bytes_by_dtype
        .into_iter()
        .filter(|(d, _)| matches!(d, DType::F32 | DType::F16 | DType::BF16))
        .max_by_key(|&(_, bytes)| bytes)
        .map_or(DType::F32, |(d, _)| d)
}

/// One step's work and the devices it ran on.
pub(crate) struct StepWork<'a> {
    /// The graph as costed (one micro-batch).
    pub graph: &'a Graph,
    pub mode: Mode,
    pub unknown_ops: UnknownOpCost,
    /// Micro-batches in the step, over all replicas.
    pub microbatches: f64,
    /// Samples per micro-batch.
    pub microbatch_size: u64,
    /// Tokens per sample, when a sequence dim is bound.
    pub sequence: Option<(&'a str, u64)>,
    pub step_secs: f64,
    /// The forward FLOPs of one micro-batch where the solve counted them already
    /// ([`crate::partition::PartitionProblem::forward_flops`]); `None` costs the graph again.
    pub forward_flops: Option<f64>,
    pub cluster: &'a Cluster,
    /// Every device the step occupies.
    pub devices: Vec<DeviceId>,
}

/// "throughput … samples/s, … tokens/s; MFU …%" for a step, or why a figure is missing.
pub(crate) fn efficiency_line(work: &StepWork) -> anyhow::Result<String> {
    let Some(&first) = work.devices.first() else {
        return Ok(String::new());
    };
    let model = CostModel::new(work.cluster.device(first))
        .with_mode(work.mode)
        .with_unknown_ops(work.unknown_ops);
    let flops_per_microbatch = match work.forward_flops {
        Some(forward) => model.pass_flops(forward),
        None => model.model_flops(work.graph)?,
    };
    let dtype = weight_dtype(work.graph);
    let peak: f64 = work
        .devices
        .iter()
        .map(|&d| work.cluster.device(d).peak_flops(dtype))
        .sum();
    let step = work.step_secs;
    if step.is_nan() || step <= 0.0 {
        return Ok("throughput: the simulated step takes no time; no rate to report\n".into());
    }
    let samples_per_sec = work.microbatches * work.microbatch_size as f64 / step;
    let tokens = match work.sequence {
        Some((name, seq)) => format!(
            ", {} tokens/s ({name} = {seq})",
            grouped(samples_per_sec * seq as f64)
        ),
        None => ", tokens/s: bind a sequence dim (--dim seq=N) to count tokens".to_string(),
    };
    let mfu = work.microbatches * flops_per_microbatch / (step * peak);
    // Tiny models use a sliver of a GPU: keep two significant digits rather than print 0.0%.
    let percent = mfu * 100.0;
    let decimals = if percent >= 1.0 {
        1
    } else {
        (1.0 - percent.max(1e-9).log10().floor()).min(9.0) as usize
    };
    Ok(format!(
        "throughput {} samples/s{tokens}; MFU {percent:.decimals$}% (model FLOPs / (step × peak {} of {}))\n",
        grouped(samples_per_sec),
        dtype_name(dtype),
        crate::onnx::inspect::count_of(work.devices.len(), device_word(work)),
    ))
}

/// "CPU" when every device of the step is a CPU profile, "GPU" otherwise (the profiles' `kind`).
fn device_word(work: &StepWork) -> &'static str {
    let cpus = work
        .devices
        .iter()
        .all(|&d| work.cluster.device(d).kind.eq_ignore_ascii_case("cpu"));
    if cpus {
        "CPU"
    } else {
        "GPU"
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
        _ => "fp32",
    }
}

/// A rate with thousands separators and no decimals above 100 (`1,234,567`), else 3
/// significant digits.
fn grouped(value: f64) -> String {
    if value < 100.0 {
        return format!("{value:.3}");
    }
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_group_thousands() {
        assert_eq!(grouped(1_234_567.4), "1,234,567");
        assert_eq!(grouped(999.6), "1,000");
        assert_eq!(grouped(12.5), "12.500");
    }

    #[test]
    fn the_sequence_dim_is_found_by_name() {
        let dims: std::collections::BTreeMap<String, u64> =
            [("batch".to_string(), 4), ("seq".to_string(), 16)].into();
        assert_eq!(sequence_dim(&dims), Some(("seq", 16)));
        let dims: std::collections::BTreeMap<String, u64> =
            [("batch".to_string(), 4), ("sequence_length".to_string(), 8)].into();
        assert_eq!(sequence_dim(&dims), Some(("sequence_length", 8)));
        let dims: std::collections::BTreeMap<String, u64> = [("batch".to_string(), 4)].into();
        assert_eq!(sequence_dim(&dims), None);
    }
}
