//! The recurrent layers [RNN](https://onnx.ai/onnx/operators/onnx__RNN.html),
//! [GRU](https://onnx.ai/onnx/operators/onnx__GRU.html) and
//! [LSTM](https://onnx.ai/onnx/operators/onnx__LSTM.html) (opsets 7–22) on the device, with the
//! CPU kernel's semantics (`kernels/recurrent.rs`, which computes in f64; here fp32).
//!
//! Per direction, one cuBLAS GEMM projects every step's input (X·Wᵀ); then each step is a GEMM
//! of the hidden state with Rᵀ and `recurrent_step_f32`, which applies the biases, peepholes,
//! clip and activations and updates the states in place (GRU without `linear_before_reset`
//! needs the reset gate before its candidate's GEMM: two kernels around a second GEMM). Rows
//! whose `sequence_lens` has ended keep their state and write zeros, so a reverse direction
//! starts each row at its own last step, as the CPU kernel does.

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{Ctx, RecurrentCell as Cell};
use pipecut_ir::graph::{Attribute, DType};

/// A direction's activations, laid out as `struct RecurrentActs` in `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Activations {
    code: [i32; 3],
    alpha: [f32; 3],
    beta: [f32; 3],
}

// SAFETY: `Activations` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for Activations {}

fn activations(ctx: &Ctx, cell: Cell, directions: usize) -> Option<Vec<Activations>> {
    let per = cell.default_activations().len();
    let names: Vec<String> = match ctx.attr("activations") {
        Some(Attribute::Strings(names)) => names.clone(),
        _ => (0..directions)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * directions {
        return None;
    }
    let floats = |name| match ctx.attr(name) {
        Some(Attribute::Floats(v)) => v.clone(),
        _ => Vec::new(),
    };
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let (mut next_alpha, mut next_beta) = (0, 0);
    let take = |default: Option<f32>, list: &[f32], next: &mut usize| {
        default.map_or(0.0, |d| {
            let value = list.get(*next).copied().unwrap_or(d);
            *next += 1;
            value
        })
    };
    let mut out = vec![Activations::default(); directions];
    for (k, name) in names.iter().enumerate() {
        let (code, alpha, beta) = match name.to_ascii_lowercase().as_str() {
            "relu" => (0, None, None),
            "tanh" => (1, None, None),
            "sigmoid" => (2, None, None),
            "affine" => (3, Some(1.0), Some(0.0)),
            "leakyrelu" => (4, Some(0.01), None),
            "thresholdedrelu" => (5, Some(1.0), None),
            "scaledtanh" => (6, Some(1.0), Some(1.0)),
            "hardsigmoid" => (7, Some(0.2), Some(0.5)),
            "elu" => (8, Some(1.0), None),
            "softsign" => (9, None, None),
            "softplus" => (10, None, None),
            _ => return None,
        };
        let slot = &mut out[k / per];
        slot.code[k % per] = code;
        slot.alpha[k % per] = take(alpha, &alphas, &mut next_alpha);
        slot.beta[k % per] = take(beta, &betas, &mut next_beta);
    }
    Some(out)
}

/// The layer's sizes.
#[derive(Clone, Copy)]
struct Sizes {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    directions: usize,
    batch_first: bool,
}

impl Sizes {
    /// The sizes `X`, `W` and `R` give, or `None` where they disagree (the CPU kernel says how).
    fn of(
        ctx: &Ctx,
        cell: Cell,
        direction: &str,
        (x, w, r): (&DeviceTensor, &DeviceTensor, &DeviceTensor),
    ) -> Option<Sizes> {
        let batch_first = ctx.int("layout", 0) != 0;
        let (seq, batch, input) = match (x.shape.as_slice(), batch_first) {
            (&[s, b, i], false) | (&[b, s, i], true) => (s, b, i),
            _ => return None,
        };
        let directions = if direction == "bidirectional" { 2 } else { 1 };
        let gates = cell.gates();
        let hidden = match r.shape.as_slice() {
            &[d, rows, h] if d == directions && rows == gates * h => h,
            _ => return None,
        };
        (w.shape == [directions, gates * hidden, input]).then_some(Sizes {
            seq,
            batch,
            input,
            hidden,
            directions,
            batch_first,
        })
    }
}

/// The optional operands on the device: biases, initial states and LSTM's peepholes (each
/// `None` when not given).
struct Optionals {
    bias: Option<DeviceTensor>,
    h0: Option<DeviceTensor>,
    c0: Option<DeviceTensor>,
    peepholes: Option<DeviceTensor>,
}

impl Optionals {
    /// The operands given, or `None` when one is given but not as a float tensor of its size.
    fn of(
        gpu: &Gpu,
        args: &[Option<Value>],
        cell: Cell,
        sizes: Sizes,
    ) -> Result<Option<Optionals>, String> {
        let Sizes {
            batch,
            hidden,
            directions,
            ..
        } = sizes;
        let given = |i: usize| args.get(i).is_some_and(|a| a.is_some());
        let optional = |i: usize, len: usize| -> Result<Option<Option<DeviceTensor>>, String> {
            if !given(i) {
                return Ok(Some(None));
            }
            Ok(device(gpu, args, i)?
                .filter(|t| numel(&t.shape) == len)
                .map(Some))
        };
        let state_len = directions * batch * hidden;
        let (Some(bias), Some(h0)) = (
            optional(3, directions * 2 * cell.gates() * hidden)?,
            optional(5, state_len)?,
        ) else {
            return Ok(None);
        };
        let (c0, peepholes) = if cell == Cell::Lstm {
            let (Some(c0), Some(p)) = (
                optional(6, state_len)?,
                optional(7, directions * 3 * hidden)?,
            ) else {
                return Ok(None);
            };
            (c0, p)
        } else {
            (None, None)
        };
        Ok(Some(Optionals {
            bias,
            h0,
            c0,
            peepholes,
        }))
    }
}

/// RNN, GRU or LSTM: outputs Y, Y_h (and LSTM's Y_c) in the node's layout.
pub(super) fn recurrent(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let cell = match ctx.node.op_type.as_str() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru,
        _ => Cell::Lstm,
    };
    let (Some(x), Some(w), Some(r)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let direction = ctx.string("direction", "forward");
    let Some(sizes) = Sizes::of(ctx, cell, &direction, (&x, &w, &r)) else {
        return Ok(None);
    };
    let Sizes {
        seq,
        batch,
        input,
        hidden,
        directions,
        batch_first,
    } = sizes;
    let Some(acts) = activations(ctx, cell, directions) else {
        return Ok(None);
    };
    let Some(optionals) = Optionals::of(gpu, args, cell, sizes)? else {
        return Ok(None);
    };
    let Some(lens) = sequence_lens(gpu, args, seq, batch)? else {
        return Ok(None);
    };
    let lens = gpu.upload(&lens)?;
    // X as [seq, batch, input] rows.
    let permuted;
    let x_rows = if batch_first {
        let strides = [input as i64, (seq * input) as i64, 1];
        permuted = gpu.gather_strided(&x.data, &[seq, batch, input], &strides, 0)?;
        &permuted
    } else {
        &*x.data
    };
    let mut h = initial_state(gpu, optionals.h0.as_ref(), sizes)?;
    let mut c = initial_state(gpu, optionals.c0.as_ref(), sizes)?;
    let mut y = gpu.alloc(seq * directions * batch * hidden)?;
    let layer = Layer {
        cell,
        sizes,
        w: &w.data,
        r: &r.data,
        bias: optionals.bias.as_ref().map(|b| &*b.data),
        peepholes: optionals.peepholes.as_ref().map(|p| &*p.data),
        lens: &lens,
        clip: ctx.float("clip", 0.0),
        input_forget: ctx.int("input_forget", 0) != 0,
        linear_before_reset: ctx.int("linear_before_reset", 0) != 0,
    };
    for (d, acts) in acts.iter().enumerate() {
        let reverse = direction == "reverse" || d == 1;
        layer.direction(gpu, x_rows, d, reverse, acts, (&mut h, &mut c, &mut y))?;
    }
    let mut outputs = vec![
        Value::Device(y_output(gpu, y, sizes)?),
        Value::Device(state_out(gpu, h, sizes)?),
    ];
    if cell == Cell::Lstm {
        outputs.push(Value::Device(state_out(gpu, c, sizes)?));
    }
    Ok(Some(outputs))
}

/// `Y` from `[seq, directions, batch, hidden]` to the node's layout.
fn y_output(gpu: &Gpu, y: CudaSlice<f32>, sizes: Sizes) -> Result<DeviceTensor, String> {
    let Sizes {
        seq,
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = sizes;
    if !batch_first {
        return Ok(DeviceTensor::new(vec![seq, directions, batch, hidden], y));
    }
    // [seq, directions, batch, hidden] → [batch, seq, directions, hidden].
    let shape = [batch, seq, directions, hidden];
    let strides = [hidden, directions * batch * hidden, batch * hidden, 1].map(|v| v as i64);
    Ok(DeviceTensor::new(
        shape.to_vec(),
        gpu.gather_strided(&y, &shape, &strides, 0)?,
    ))
}

/// `sequence_lens` as floats, each at most `seq` (all `seq` when absent); `None` for a
/// negative or mis-sized one, which the CPU kernel reports.
fn sequence_lens(
    gpu: &Gpu,
    args: &[Option<Value>],
    seq: usize,
    batch: usize,
) -> Result<Option<Vec<f32>>, String> {
    let Some(lens) = host(gpu, args, 4)? else {
        return Ok(Some(vec![seq as f32; batch]));
    };
    if !matches!(lens.dtype(), DType::I32 | DType::I64) {
        return Ok(None);
    }
    let lens = lens.to_i64_vec();
    if lens.len() != batch || lens.iter().any(|&l| l < 0) {
        return Ok(None);
    }
    Ok(Some(
        lens.iter().map(|&l| (l as usize).min(seq) as f32).collect(),
    ))
}

/// An initial state as `[directions, batch, hidden]` in a buffer of its own (the steps update
/// it in place): zeros when absent, moved from `[batch, directions, hidden]` under layout 1.
fn initial_state(
    gpu: &Gpu,
    given: Option<&DeviceTensor>,
    sizes: Sizes,
) -> Result<CudaSlice<f32>, String> {
    let (d, b, h) = (sizes.directions, sizes.batch, sizes.hidden);
    let Some(state) = given else {
        return gpu
            .stream
            .alloc_zeros::<f32>(d * b * h)
            .map_err(cuda_error("allocation"));
    };
    let strides = if sizes.batch_first {
        [h, d * h, 1]
    } else {
        [b * h, h, 1]
    };
    gpu.gather_strided(&state.data, &[d, b, h], &strides.map(|v| v as i64), 0)
}

/// A final state in the node's layout: `[directions, batch, hidden]`, or `[batch, directions,
/// hidden]` under layout 1.
fn state_out(gpu: &Gpu, state: CudaSlice<f32>, sizes: Sizes) -> Result<DeviceTensor, String> {
    let (d, b, h) = (sizes.directions, sizes.batch, sizes.hidden);
    if !sizes.batch_first {
        return Ok(DeviceTensor::new(vec![d, b, h], state));
    }
    let strides = [h, b * h, 1].map(|v| v as i64);
    let data = gpu.gather_strided(&state, &[b, d, h], &strides, 0)?;
    Ok(DeviceTensor::new(vec![b, d, h], data))
}

/// The weights and settings shared by the directions.
struct Layer<'a> {
    cell: Cell,
    sizes: Sizes,
    /// `[directions, gates · hidden, input]`.
    w: &'a CudaSlice<f32>,
    /// `[directions, gates · hidden, hidden]`.
    r: &'a CudaSlice<f32>,
    bias: Option<&'a CudaSlice<f32>>,
    peepholes: Option<&'a CudaSlice<f32>>,
    lens: &'a CudaSlice<f32>,
    clip: f32,
    input_forget: bool,
    linear_before_reset: bool,
}

/// The buffers a direction updates: the hidden and cell states and Y.
type States<'s> = (
    &'s mut CudaSlice<f32>,
    &'s mut CudaSlice<f32>,
    &'s mut CudaSlice<f32>,
);

impl Layer<'_> {
    /// Runs direction `d` over every step (last to first when `reverse`).
    fn direction(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        d: usize,
        reverse: bool,
        acts: &Activations,
        (h, c, y): States,
    ) -> Result<(), String> {
        let Sizes {
            seq,
            batch,
            input,
            hidden,
            ..
        } = self.sizes;
        let rows = self.cell.gates() * hidden;
        let w = self.w.slice(d * rows * input..(d + 1) * rows * input);
        let mut xw = gpu.alloc(seq * batch * rows)?;
        let strides = (1, 0, 0, seq * batch * rows);
        gpu.gemm_views(
            (seq * batch, rows, input),
            (x, false, &w, true),
            &mut xw,
            (1.0, 0.0),
            strides,
        )?;
        // GRU without linear_before_reset multiplies R_h by r ⊙ h: the step's first GEMM takes
        // the z and r rows only.
        let two_phase = self.cell == Cell::Gru && !self.linear_before_reset;
        let rh_cols = if two_phase { 2 * hidden } else { rows };
        let r_dir = d * rows * hidden;
        let r_gates = self.r.slice(r_dir..r_dir + rh_cols * hidden);
        // The last gate's rows: GRU's candidate (h) gate, the only reader.
        let r_candidate = self
            .r
            .slice(r_dir + (rows - hidden) * hidden..r_dir + rows * hidden);
        let mut rh = gpu.alloc(batch * rh_cols)?;
        let mut gated = gpu.alloc(batch * hidden)?;
        let mut rh_candidate = gpu.alloc(batch * hidden)?;
        let state = d * batch * hidden..(d + 1) * batch * hidden;
        for step in 0..seq {
            let t = if reverse { seq - 1 - step } else { step };
            // The view of this direction's state ends with the GEMM, before the step writes it.
            let one = (1, 0, 0, batch * rh_cols);
            let shape = (batch, rh_cols, hidden);
            gpu.gemm_views(
                shape,
                (&h.slice(state.clone()), false, &r_gates, true),
                &mut rh,
                (1.0, 0.0),
                one,
            )?;
            let mut launch_phase =
                |phase: i32, rh_candidate: &CudaSlice<f32>, gated: &mut CudaSlice<f32>| {
                    self.step(
                        gpu,
                        (&xw, &rh, rh_candidate),
                        (d, t, rh_cols, phase),
                        acts,
                        (&mut *h, &mut *c, &mut *y, gated),
                    )
                };
            if two_phase {
                launch_phase(0, &rh_candidate, &mut gated)?;
                let one = (1, 0, 0, batch * hidden);
                let shape = (batch, hidden, hidden);
                let operands = (&gated, false, &r_candidate, true);
                gpu.gemm_views(shape, operands, &mut rh_candidate, (1.0, 0.0), one)?;
            }
            let mut unused = gpu.alloc(1)?;
            let gated_arg = if two_phase { &mut gated } else { &mut unused };
            launch_phase(1, &rh_candidate, gated_arg)?;
        }
        Ok(())
    }

    /// Launches `recurrent_step_f32` for step `t` of direction `d`.
    #[allow(clippy::type_complexity)]
    fn step(
        &self,
        gpu: &Gpu,
        (xw, rh, rh_candidate): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        (d, t, rh_cols, phase): (usize, usize, usize, i32),
        acts: &Activations,
        (h, c, y, gated): (
            &mut CudaSlice<f32>,
            &mut CudaSlice<f32>,
            &mut CudaSlice<f32>,
            &mut CudaSlice<f32>,
        ),
    ) -> Result<(), String> {
        let Sizes {
            batch,
            hidden,
            directions,
            ..
        } = self.sizes;
        let n = batch * hidden;
        let [batch_i, hidden_i, directions_i, d_i, t_i, rh_cols_i] =
            [batch, hidden, directions, d, t, rh_cols].map(|v| v as i64);
        let cell = match self.cell {
            Cell::Rnn => 0i32,
            Cell::Gru => 1,
            Cell::Lstm => 2,
        };
        // Absent biases and peepholes are never read; X·Wᵀ stands in for their pointers.
        let bias = self.bias.unwrap_or(xw);
        let peepholes = self.peepholes.unwrap_or(xw);
        let flags = [
            self.bias.is_some() as i32,
            self.peepholes.is_some() as i32,
            self.input_forget as i32,
            self.linear_before_reset as i32,
        ];
        let mut launch = gpu.stream.launch_builder(&gpu.functions.recurrent_step);
        launch
            .arg(xw)
            .arg(rh)
            .arg(rh_candidate)
            .arg(bias)
            .arg(peepholes)
            .arg(self.lens)
            .arg(h)
            .arg(c)
            .arg(gated)
            .arg(y)
            .arg(&batch_i)
            .arg(&hidden_i)
            .arg(&directions_i)
            .arg(&d_i)
            .arg(&t_i)
            .arg(&rh_cols_i)
            .arg(&cell)
            .arg(&phase)
            .arg(&flags[0])
            .arg(&flags[1])
            .arg(&flags[2])
            .arg(&flags[3])
            .arg(acts)
            .arg(&self.clip);
        // SAFETY: argument types match `recurrent_step_f32`; every buffer holds the sizes its
        // comment there gives (the states directions · batch · hidden, Y seq times that).
        unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
        Ok(())
    }
}
