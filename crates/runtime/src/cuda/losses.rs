//! The training losses on the device: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, with
//! the semantics of the CPU kernel (`kernels/loss.rs`): per position (n, d) of class
//! t = target[n, d] the loss −x[n, t, d]·w, w = weight[t] (1 without weights), x the scores or
//! (SoftmaxCrossEntropyLoss) their log-softmax over axis 1; a position whose target is
//! `ignore_index` has loss and weight 0; `mean` is Σ loss / Σ w.
//!
//! The targets are integers and so on the host, where they are checked and turned into the
//! offsets of the picked scores and weights; the device gathers (`gather_rows_f32`), multiplies,
//! and reduces. The sums run in f32 on the device, in f64 on the CPU.

use cudarc::driver::PushKernelArg;

use super::elementwise;
use super::gpu::{cuda_error, numel, Gpu};
use super::masks::choose;
use super::operands::{device, host, OpResult};
use super::row_ops::softmax_axis;
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;
use pipecut_ir::graph::DType;

/// Codes of the kernels used: `binary_f32`'s Mul and Div, `unary_f32`'s Neg, `reduce_rows_f32`'s
/// sum, and `softmax_rows_f32`'s LogSoftmax.
const MUL: i32 = 2;
const DIV: i32 = 3;
const NEG: i32 = 7;
const SUM: i32 = 0;
const LOG_SOFTMAX: i32 = 1;

/// `x[offsets[i]]` for every position, as a tensor of `shape`.
pub(super) fn pick(
    gpu: &Gpu,
    x: &DeviceTensor,
    offsets: &[i64],
    shape: &[usize],
) -> Result<DeviceTensor, String> {
    let n = offsets.len();
    let offsets = gpu.upload(offsets)?;
    let mut out = gpu.alloc(n)?;
    let (rows, inner) = (n as i64, 1i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.gather_rows);
    launch
        .arg(&*x.data)
        .arg(&offsets)
        .arg(&mut out)
        .arg(&rows)
        .arg(&inner);
    // SAFETY: argument types match `gather_rows_f32`; every offset was checked to lie in `x`.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::new(shape.to_vec(), out))
}

/// The sum of every element of `x`, as a scalar.
fn total(gpu: &Gpu, x: &DeviceTensor) -> Result<DeviceTensor, String> {
    let mut out = gpu.alloc(1)?;
    gpu.reduce_rows(&x.data, &mut out, (1, numel(&x.shape)), SUM)?;
    Ok(DeviceTensor::new(Vec::new(), out))
}

/// Where each position reads its score and its weight, and whether it counts (not ignored).
struct Picks {
    scores: Vec<i64>,
    classes: Vec<i64>,
    keep: Vec<f32>,
}

/// The picks of `targets` into scores of `[n, c, d]`, checked as the CPU kernel checks them.
fn picks(
    targets: &[i64],
    (n, c, d): (usize, usize, usize),
    ignore: Option<i64>,
    weights: Option<usize>,
) -> Result<Picks, String> {
    let mut picks = Picks {
        scores: Vec::with_capacity(n * d),
        classes: Vec::with_capacity(n * d),
        keep: Vec::with_capacity(n * d),
    };
    for i in 0..n {
        for k in 0..d {
            let t = targets[i * d + k];
            if Some(t) == ignore {
                // Any offset inside the tensors: the position is masked out afterwards.
                picks.scores.push(0);
                picks.classes.push(0);
                picks.keep.push(0.0);
                continue;
            }
            let class = usize::try_from(t)
                .ok()
                .filter(|&class| class < c)
                .ok_or_else(|| format!("target {t} is not a class of 0..{c}"))?;
            if weights.is_some_and(|len| class >= len) {
                return Err("weight is shorter than the class count".into());
            }
            picks.scores.push(((i * c + class) * d + k) as i64);
            picks.classes.push(class as i64);
            picks.keep.push(1.0);
        }
    }
    Ok(picks)
}

pub(super) fn loss(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], softmax: bool) -> OpResult {
    let (Some(scores), Some(target)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    if !matches!(target.dtype(), DType::I64 | DType::I32) {
        return Ok(None);
    }
    let weight = match args.get(2) {
        Some(Some(_)) => match device(gpu, args, 2)? {
            Some(w) => Some(w),
            None => return Ok(None),
        },
        _ => None,
    };
    let shape = scores.shape.clone();
    if shape.len() < 2 || target.shape().len() + 1 != shape.len() {
        return Err(format!(
            "scores {shape:?} and target {:?} do not match",
            target.shape()
        ));
    }
    let (n, c, d) = (shape[0], shape[1], numel(&shape[2..]));
    let ignore = ctx.attr("ignore_index").map(|_| ctx.int("ignore_index", 0));
    let weights = weight.as_ref().map(|w| numel(&w.shape));
    let picks = picks(&target.to_i64_vec(), (n, c, d), ignore, weights)?;
    let log_prob = if softmax {
        softmax_axis(gpu, &scores, 1, LOG_SOFTMAX)?
    } else {
        scores
    };
    let positions = target.shape();
    let keep = DeviceTensor::mask(positions.to_vec(), gpu.upload(&picks.keep)?);
    let zero = DeviceTensor::new(Vec::new(), gpu.upload(&[0.0f32])?);
    let w = match &weight {
        Some(weight) => choose(
            gpu,
            &keep,
            &pick(gpu, weight, &picks.classes, positions)?,
            &zero,
        )?,
        None => DeviceTensor::new(positions.to_vec(), gpu.upload(&picks.keep)?),
    };
    let picked = pick(gpu, &log_prob, &picks.scores, positions)?;
    let weighted = elementwise::binary(gpu, &picked, &w, MUL)?;
    let losses = choose(
        gpu,
        &keep,
        &elementwise::unary(gpu, &weighted, NEG, (0.0, 0.0))?,
        &zero,
    )?;
    let loss = match ctx.string("reduction", "mean").as_str() {
        "none" => losses,
        "sum" => total(gpu, &losses)?,
        "mean" => elementwise::binary(gpu, &total(gpu, &losses)?, &total(gpu, &w)?, DIV)?,
        other => return Err(format!("reduction '{other}' is none of none, mean, sum")),
    };
    Ok(Some(vec![Value::Device(loss), Value::Device(log_prob)]))
}
