//! The recurrent layers RNN, GRU and LSTM (<https://onnx.ai/onnx/operators/onnx__LSTM.html> and
//! its siblings), every attribute of opsets 7–22: directions (forward, reverse,
//! bidirectional), `layout`, the activation lists with their alphas and betas, `clip`,
//! `sequence_lens`, initial states, LSTM's peepholes and `input_forget`, GRU's
//! `linear_before_reset`. Gate order in `W`, `R`, `B` is the spec's: LSTM `i o f c`, GRU
//! `z r h`. Computed in f32 as onnxruntime does: the input products of every step as one
//! matrix product, the recurrent products of each step as one for the whole batch.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;
use pipecut_ir::graph::Attribute;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["RNN"], |ctx, inputs| recurrent(ctx, inputs, Cell::Rnn));
    t.add(&["GRU"], |ctx, inputs| recurrent(ctx, inputs, Cell::Gru));
    t.add(&["LSTM"], |ctx, inputs| recurrent(ctx, inputs, Cell::Lstm));
}

/// Which recurrent layer (also what the CUDA backend's recurrent op dispatches on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    pub(crate) fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    /// Activations per direction and their defaults.
    pub(crate) fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation function with its parameters.
#[derive(Debug, Clone, Copy)]
struct Activation {
    kind: ActivationKind,
    alpha: f64,
    beta: f64,
}

#[derive(Debug, Clone, Copy)]
enum ActivationKind {
    Relu,
    Tanh,
    Sigmoid,
    Affine,
    LeakyRelu,
    ThresholdedRelu,
    ScaledTanh,
    HardSigmoid,
    Elu,
    Softsign,
    Softplus,
}

impl Activation {
    /// In f32, the logistic and tanh through `fast_math` (as onnxruntime's MLAS approximates
    /// them); the others, rare in exported models, in f64.
    fn apply(self, x: f32) -> f32 {
        match self.kind {
            ActivationKind::Sigmoid => super::fast_math::sigmoid(x),
            ActivationKind::Tanh => super::fast_math::tanh(x),
            _ => self.apply_f64(f64::from(x)) as f32,
        }
    }

    /// [`Activation::apply`] on each element: one loop per kind, which the compiler vectorises
    /// (for AVX2 too, where the CPU has it, for the logistic and tanh).
    fn apply_slice(self, values: &mut [f32]) {
        match self.kind {
            ActivationKind::Sigmoid => {
                super::fast_math::map_in_place(values, super::fast_math::sigmoid)
            }
            ActivationKind::Tanh => super::fast_math::map_in_place(values, super::fast_math::tanh),
            _ => values.iter_mut().for_each(|v| *v = self.apply(*v)),
        }
    }

    fn apply_f64(self, x: f64) -> f64 {
        let (a, b) = (self.alpha, self.beta);
        match self.kind {
            ActivationKind::Relu => x.max(0.0),
            ActivationKind::Tanh => x.tanh(),
            ActivationKind::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            ActivationKind::Affine => a * x + b,
            ActivationKind::LeakyRelu => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            ActivationKind::ThresholdedRelu => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            ActivationKind::ScaledTanh => a * (b * x).tanh(),
            ActivationKind::HardSigmoid => (a * x + b).clamp(0.0, 1.0),
            ActivationKind::Elu => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            ActivationKind::Softsign => x / (1.0 + x.abs()),
            ActivationKind::Softplus => (1.0 + x.exp()).ln(),
        }
    }
}

/// The activations of every direction, in order, with the alphas and betas consumed by those
/// that take them (the spec's defaults otherwise, as onnxruntime applies them).
fn activations(ctx: &Ctx, cell: Cell, directions: usize) -> Result<Vec<Activation>, String> {
    let names: Vec<String> = match ctx.attr("activations") {
        Some(Attribute::Strings(names)) => names.clone(),
        _ => (0..directions)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    let per_direction = cell.default_activations().len();
    if names.len() != per_direction * directions {
        return Err(format!(
            "{} activations for {directions} direction(s) of {per_direction}",
            names.len()
        ));
    }
    let floats = |name| match ctx.attr(name) {
        Some(Attribute::Floats(v)) => v.iter().map(|&x| f64::from(x)).collect(),
        _ => Vec::new(),
    };
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let (mut next_alpha, mut next_beta) = (0, 0);
    names
        .iter()
        .map(|name| {
            let (kind, alpha, beta) = match name.to_ascii_lowercase().as_str() {
                "relu" => (ActivationKind::Relu, None, None),
                "tanh" => (ActivationKind::Tanh, None, None),
                "sigmoid" => (ActivationKind::Sigmoid, None, None),
                "affine" => (ActivationKind::Affine, Some(1.0), Some(0.0)),
                "leakyrelu" => (ActivationKind::LeakyRelu, Some(0.01), None),
                "thresholdedrelu" => (ActivationKind::ThresholdedRelu, Some(1.0), None),
                "scaledtanh" => (ActivationKind::ScaledTanh, Some(1.0), Some(1.0)),
                "hardsigmoid" => (ActivationKind::HardSigmoid, Some(0.2), Some(0.5)),
                "elu" => (ActivationKind::Elu, Some(1.0), None),
                "softsign" => (ActivationKind::Softsign, None, None),
                "softplus" => (ActivationKind::Softplus, None, None),
                other => return Err(format!("unknown activation '{other}'")),
            };
            let take = |default: Option<f64>, list: &[f64], next: &mut usize| {
                default.map(|d| {
                    let value = list.get(*next).copied().unwrap_or(d);
                    *next += 1;
                    value
                })
            };
            Ok(Activation {
                kind,
                alpha: take(alpha, &alphas, &mut next_alpha).unwrap_or(0.0),
                beta: take(beta, &betas, &mut next_beta).unwrap_or(0.0),
            })
        })
        .collect()
}

/// The layer's dimensions and attributes.
struct Dims {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    directions: usize,
    batch_first: bool,
}

impl Dims {
    /// The sizes `X`, `W` and `R` give, checked against each other and the `direction`'s count.
    fn of(
        ctx: &Ctx,
        cell: Cell,
        direction: &str,
        (x, w, r): (&HostTensor, &HostTensor, &HostTensor),
    ) -> Result<Dims, String> {
        let batch_first = ctx.int("layout", 0) != 0;
        let (seq, batch, input_size) = match (x.shape(), batch_first) {
            (&[s, b, i], false) | (&[b, s, i], true) => (s, b, i),
            (shape, _) => return Err(format!("X must be 3-D, got {shape:?}")),
        };
        let directions = if direction == "bidirectional" { 2 } else { 1 };
        let gates = cell.gates();
        let hidden = match r.shape() {
            &[d, rows, h] if d == directions && rows == gates * h => h,
            shape => {
                return Err(format!(
                    "R has shape {shape:?}, expected [{directions}, {gates}·hidden, hidden]"
                ))
            }
        };
        if w.shape() != [directions, gates * hidden, input_size] {
            return Err(format!(
                "W has shape {:?}, expected [{directions}, {}, {input_size}]",
                w.shape(),
                gates * hidden
            ));
        }
        Ok(Dims {
            seq,
            batch,
            input: input_size,
            hidden,
            directions,
            batch_first,
        })
    }
}

fn recurrent(ctx: &Ctx, inputs: &[Option<&HostTensor>], cell: Cell) -> KernelResult {
    let x = input(inputs, 0)?;
    let (w, r) = (input(inputs, 1)?, input(inputs, 2)?);
    let direction = ctx.string("direction", "forward");
    let dims = Dims::of(ctx, cell, &direction, (x, w, r))?;
    let Dims {
        seq,
        batch,
        input: input_size,
        hidden,
        directions,
        ..
    } = dims;
    let gates = cell.gates();
    let acts = activations(ctx, cell, directions)?;
    // An optional input given as an empty tensor counts as absent.
    let given = |i: usize| optional(inputs, i).filter(|t| !t.is_empty());
    let clip = ctx.float("clip", 0.0);
    let clip = (clip > 0.0).then_some(clip);
    let lens = sequence_lens(given(4), &dims)?;
    let mut state_h = initial_state(given(5), &dims)?;
    let mut state_c = match cell {
        Cell::Lstm => initial_state(given(6), &dims)?,
        _ => Vec::new(),
    };
    // Borrowed where they are float already: a one-step LSTM spent a sixth of its time
    // copying W and R.
    let (w, r) = (w.f32_cow(), r.f32_cow());
    let bias = given(3).map(HostTensor::f32_cow);
    let peepholes = given(7)
        .filter(|_| cell == Cell::Lstm)
        .map(HostTensor::f32_cow);
    let x = x.f32_cow();
    let mut y = vec![0.0f32; seq * directions * batch * hidden];
    let (gh, state) = (gates * hidden, batch * hidden);
    let per = cell.default_activations().len();
    for d in 0..directions {
        let layer = Layer {
            cell,
            dims: &dims,
            w: &w[d * gh * input_size..(d + 1) * gh * input_size],
            r: &r[d * gh * hidden..(d + 1) * gh * hidden],
            bias: bias.as_ref().map(|b| &b[d * 2 * gh..(d + 1) * 2 * gh]),
            peepholes: peepholes
                .as_ref()
                .map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]),
            acts: &acts[d * per..(d + 1) * per],
            clip,
            input_forget: ctx.int("input_forget", 0) != 0,
            linear_before_reset: ctx.int("linear_before_reset", 0) != 0,
        };
        let reverse = direction == "reverse" || d == 1;
        let h = &mut state_h[d * state..(d + 1) * state];
        let c = match cell {
            Cell::Lstm => &mut state_c[d * state..(d + 1) * state],
            _ => &mut [][..],
        };
        layer.run(&x, (d, reverse, &lens), (h, c), &mut y);
    }
    let mut outputs = vec![reorder_y(&y, &dims), state_output(&state_h, &dims)];
    if cell == Cell::Lstm {
        outputs.push(state_output(&state_c, &dims));
    }
    Ok(outputs)
}

/// Each sequence's length (`sequence_lens`, capped at the sequence's; all of it when absent).
fn sequence_lens(lens: Option<&HostTensor>, dims: &Dims) -> Result<Vec<usize>, String> {
    let lens: Vec<usize> = match lens {
        Some(l) => l
            .to_i64_vec()
            .iter()
            .map(|&v| usize::try_from(v).map(|v| v.min(dims.seq)))
            .collect::<Result<_, _>>()
            .map_err(|_| "sequence_lens has a negative entry")?,
        None => vec![dims.seq; dims.batch],
    };
    if lens.len() != dims.batch {
        return Err(format!(
            "sequence_lens has {} entries for batch {}",
            lens.len(),
            dims.batch
        ));
    }
    Ok(lens)
}

/// An initial state (`initial_h` or `initial_c`) as `[directions, batch, hidden]` (zeros when
/// absent), from `[batch, directions, hidden]` under layout 1.
fn initial_state(state: Option<&HostTensor>, dims: &Dims) -> Result<Vec<f32>, String> {
    let Dims {
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = *dims;
    match state {
        None => Ok(vec![0.0; directions * batch * hidden]),
        Some(t) if t.len() == directions * batch * hidden => {
            let v = t.to_f32_vec();
            if !batch_first {
                return Ok(v);
            }
            let mut out = vec![0.0; v.len()];
            for d in 0..directions {
                for b in 0..batch {
                    let from = (b * directions + d) * hidden;
                    let to = (d * batch + b) * hidden;
                    out[to..to + hidden].copy_from_slice(&v[from..from + hidden]);
                }
            }
            Ok(out)
        }
        Some(t) => Err(format!("initial state has shape {:?}", t.shape())),
    }
}

/// A final state (`Y_h` or `Y_c`) from the internal `[directions, batch, hidden]` to the
/// layout's order.
fn state_output(v: &[f32], dims: &Dims) -> HostTensor {
    let Dims {
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = *dims;
    if !batch_first {
        return HostTensor::f32(vec![directions, batch, hidden], v.to_vec());
    }
    let mut out = vec![0.0f32; v.len()];
    for d in 0..directions {
        for b in 0..batch {
            let (from, to) = ((d * batch + b) * hidden, (b * directions + d) * hidden);
            out[to..to + hidden].copy_from_slice(&v[from..from + hidden]);
        }
    }
    HostTensor::f32(vec![batch, directions, hidden], out)
}

/// `Y` from the internal `[seq, directions, batch, hidden]` to the layout's order.
fn reorder_y(y: &[f32], dims: &Dims) -> HostTensor {
    let Dims {
        seq,
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = *dims;
    if !batch_first {
        return HostTensor::f32(vec![seq, directions, batch, hidden], y.to_vec());
    }
    let mut out = vec![0.0f32; y.len()];
    for t in 0..seq {
        for d in 0..directions {
            for b in 0..batch {
                let from = ((t * directions + d) * batch + b) * hidden;
                let to = ((b * seq + t) * directions + d) * hidden;
                out[to..to + hidden].copy_from_slice(&y[from..from + hidden]);
            }
        }
    }
    HostTensor::f32(vec![batch, seq, directions, hidden], out)
}

/// One direction's weights and settings.
struct Layer<'a> {
    cell: Cell,
    dims: &'a Dims,
    /// `[gates · hidden, input]`.
    w: &'a [f32],
    /// `[gates · hidden, hidden]`.
    r: &'a [f32],
    /// `[2 · gates · hidden]`: `Wb` then `Rb`.
    bias: Option<&'a [f32]>,
    /// LSTM `[3 · hidden]`: `Pi`, `Po`, `Pf`.
    peepholes: Option<&'a [f32]>,
    acts: &'a [Activation],
    clip: Option<f32>,
    input_forget: bool,
    linear_before_reset: bool,
}

/// `out = rows · B (+ bias)`: `rows` is m × k, `B` the k × n matrix that `weights` holds with
/// `strides` (row, column), n the width of `out`.
fn project(
    rows: &[f32],
    [m, k]: [usize; 2],
    (weights, strides): (&[f32], (usize, usize)),
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let n = out.len() / m.max(1);
    super::sgemm(m, k, n, 1.0, rows, (k, 1), weights, strides, 0.0, out);
    add_to_rows(out, n, bias);
}

/// `bias` (`n` wide, if given) added to every row of `out`.
fn add_to_rows(out: &mut [f32], n: usize, bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        for row in out.chunks_mut(n.max(1)) {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
    }
}

/// `R` (`[gates · hidden, hidden]`, row-major) as each step's product `h·Rᵀ` reads it best.
/// Chosen by the number of steps, which splitting the batch leaves alone, so a micro-batch's
/// states are the whole batch's bit for bit.
enum RecurrentWeights<'a> {
    /// Transposed once per run, `[hidden, gates · hidden]`, for gemm: a product of the whole
    /// batch per step reads it row by row (taking `R`'s rows as gemm's columns made it pack all
    /// of `R` at every step, two thirds of an LSTM's time).
    Transposed { r_t: Vec<f32>, hidden: usize },
    /// As it is, for one or two steps: each output the dot product of a state's row with one
    /// of `R`'s rows (`matmul::row_dots`). A streaming model calls one step at a time, and
    /// transposing `R` for it was most of its time.
    Rows { r: &'a [f32], hidden: usize },
}

impl<'a> RecurrentWeights<'a> {
    fn for_steps(r: &'a [f32], seq: usize, hidden: usize, gh: usize) -> RecurrentWeights<'a> {
        if seq <= 2 {
            return RecurrentWeights::Rows { r, hidden };
        }
        let mut r_t = vec![0.0f32; hidden * gh];
        for (n, weights) in r.chunks_exact(hidden.max(1)).enumerate() {
            for (k, &v) in weights.iter().enumerate() {
                r_t[k * gh + n] = v;
            }
        }
        RecurrentWeights::Transposed { r_t, hidden }
    }

    /// `out = h·R[first..first + n]ᵀ + bias` for the rows of `h` (`[m, hidden]`), where `n` is
    /// `out`'s width: the products of `R`'s rows from `first` on.
    fn product(&self, h: &[f32], first: usize, bias: Option<&[f32]>, out: &mut [f32]) {
        match self {
            RecurrentWeights::Transposed { r_t, hidden } => {
                let gh = r_t.len() / (*hidden).max(1);
                let m = h.len() / (*hidden).max(1);
                project(h, [m, *hidden], (&r_t[first..], (gh, 1)), bias, out);
            }
            RecurrentWeights::Rows { r, hidden } => {
                let m = h.len() / (*hidden).max(1);
                let n = out.len() / m.max(1);
                let rows = &r[first * hidden..(first + n) * hidden];
                super::matmul::row_dots(h, rows, *hidden, out);
                add_to_rows(out, n, bias);
            }
        }
    }
}

impl Layer<'_> {
    /// Runs every sequence of the batch in direction `d` (`reverse` from each sequence's own
    /// last step) from the state `(h, c)` (`[batch, hidden]` each) over `x` (all of `X`), writing
    /// each step's `h` into `y` (`[seq, directions, batch, hidden]`); leaves the final state in
    /// `(h, c)`. The input products of every step are one matrix product up front, and each
    /// step's recurrent products one for the whole batch, as onnxruntime computes them.
    fn run(
        &self,
        x: &[f32],
        (d, reverse, lens): (usize, bool, &[usize]),
        (h, c): (&mut [f32], &mut [f32]),
        y: &mut [f32],
    ) {
        let Dims {
            seq,
            batch,
            input,
            hidden,
            directions,
            batch_first,
        } = *self.dims;
        let gh = self.cell.gates() * hidden;
        let (wb, rb) = match self.bias {
            Some(b) => (Some(&b[..gh]), Some(&b[gh..])),
            None => (None, None),
        };
        // Rows in X's own order: (t, b) is row t·batch + b, or b·seq + t under layout 1.
        let mut xw = vec![0.0f32; seq * batch * gh];
        project(x, [seq * batch, input], (self.w, (1, input)), wb, &mut xw);
        let recurrent_weights = RecurrentWeights::for_steps(self.r, seq, hidden, gh);
        let row = |t: usize, b: usize| {
            if batch_first {
                b * seq + t
            } else {
                t * batch + b
            }
        };
        // The GRU's candidate reads `R_h·(r ⊙ h)` unless `linear_before_reset`: a second product.
        let split_candidate = self.cell == Cell::Gru && !self.linear_before_reset;
        let first_rows = if split_candidate { 2 * hidden } else { gh };
        let mut rh = vec![0.0f32; batch * gh];
        let mut products = vec![0.0f32; batch * first_rows];
        let mut gated = vec![0.0f32; batch * hidden];
        let mut pre = vec![0.0f32; gh];
        for s in 0..seq {
            // The step of sequence b at s (from its own last step in reverse), None once done.
            let step_of = |b: usize| {
                let len = lens[b];
                (s < len).then(|| if reverse { len - 1 - s } else { s })
            };
            let rb_first = rb.map(|b| &b[..first_rows]);
            if split_candidate {
                recurrent_weights.product(h, 0, rb_first, &mut products);
                for b in 0..batch {
                    rh[b * gh..b * gh + first_rows]
                        .copy_from_slice(&products[b * first_rows..(b + 1) * first_rows]);
                }
            } else {
                recurrent_weights.product(h, 0, rb_first, &mut rh);
            }
            if split_candidate {
                for b in 0..batch {
                    let at = step_of(b).map_or(0, |t| row(t, b) * gh + hidden);
                    let reset = &mut pre[..hidden];
                    let recurrent = &rh[b * gh + hidden..b * gh + 2 * hidden];
                    for ((r, x), rh) in reset.iter_mut().zip(&xw[at..at + hidden]).zip(recurrent) {
                        *r = x + rh;
                    }
                    self.activate(0, reset);
                    let state = &h[b * hidden..(b + 1) * hidden];
                    for ((g, r), h) in gated[b * hidden..].iter_mut().zip(&*reset).zip(state) {
                        *g = r * h;
                    }
                }
                let rb_h = self.bias.map(|b| &b[gh + 2 * hidden..]);
                let candidate = &mut products[..batch * hidden];
                recurrent_weights.product(&gated, 2 * hidden, rb_h, candidate);
                for b in 0..batch {
                    rh[b * gh + 2 * hidden..(b + 1) * gh]
                        .copy_from_slice(&products[b * hidden..(b + 1) * hidden]);
                }
            }
            for b in 0..batch {
                let Some(t) = step_of(b) else { continue };
                let at = row(t, b) * gh;
                let state = b * hidden..(b + 1) * hidden;
                let c_b = if c.is_empty() {
                    &mut [][..]
                } else {
                    &mut c[state.clone()]
                };
                let products = (&xw[at..at + gh], &rh[b * gh..(b + 1) * gh]);
                self.step(products, &mut pre, &mut h[state.clone()], c_b);
                let out = ((t * directions + d) * batch + b) * hidden;
                y[out..out + hidden].copy_from_slice(&h[state]);
            }
        }
    }

    /// Clips (when `clip` is set) and applies activation `i` to each value.
    fn activate(&self, i: usize, values: &mut [f32]) {
        if let Some(c) = self.clip {
            values.iter_mut().for_each(|v| *v = v.clamp(-c, c));
        }
        self.acts[i].apply_slice(values);
    }

    /// Advances one sequence's `h` (and LSTM's `c`) from its input products `xw` (`W·x + Wb`)
    /// and recurrent products `rh` (`R·h + Rb`, the GRU candidate's as the cell needs it);
    /// `pre` (gates · hidden) holds the gates. Gate by gate over the whole hidden vector, so
    /// each activation is one vectorised loop.
    fn step(&self, (xw, rh): (&[f32], &[f32]), pre: &mut [f32], h: &mut [f32], c: &mut [f32]) {
        let hidden = self.dims.hidden;
        for ((p, x), r) in pre.iter_mut().zip(xw).zip(rh) {
            *p = x + r;
        }
        match self.cell {
            Cell::Rnn => {
                self.activate(0, pre);
                h.copy_from_slice(pre);
            }
            Cell::Gru => {
                let (z, rest) = pre.split_at_mut(hidden);
                let (reset, candidate) = rest.split_at_mut(hidden);
                self.activate(0, z);
                self.activate(0, reset);
                for j in 0..hidden {
                    candidate[j] = match self.linear_before_reset {
                        true => xw[2 * hidden + j] + reset[j] * rh[2 * hidden + j],
                        // `rh` holds R_h·(r ⊙ h) + Rb_h already.
                        false => candidate[j],
                    };
                }
                self.activate(1, candidate);
                for j in 0..hidden {
                    h[j] = (1.0 - z[j]) * candidate[j] + z[j] * h[j];
                }
            }
            Cell::Lstm => self.lstm_step(pre, h, c),
        }
    }

    /// The LSTM's gates from their pre-activations in `pre` (rows i, o, f, c; peepholes i, o,
    /// f), into `h` and `c`.
    fn lstm_step(&self, pre: &mut [f32], h: &mut [f32], c: &mut [f32]) {
        let hidden = self.dims.hidden;
        let (i, rest) = pre.split_at_mut(hidden);
        let (o, rest) = rest.split_at_mut(hidden);
        let (f, candidate) = rest.split_at_mut(hidden);
        if let Some(p) = self.peepholes {
            for j in 0..hidden {
                i[j] += p[j] * c[j];
                f[j] += p[2 * hidden + j] * c[j];
            }
        }
        self.activate(0, i);
        match self.input_forget {
            true => f.iter_mut().zip(&*i).for_each(|(f, i)| *f = 1.0 - i),
            false => self.activate(0, f),
        }
        self.activate(1, candidate);
        for j in 0..hidden {
            c[j] = f[j] * c[j] + i[j] * candidate[j];
        }
        if let Some(p) = self.peepholes {
            for j in 0..hidden {
                o[j] += p[hidden + j] * c[j];
            }
        }
        self.activate(0, o);
        // h = o ⊙ act₂(c), act₂(c) in the input gate's row, which is spent.
        i.copy_from_slice(c);
        self.activate(2, i);
        for j in 0..hidden {
            h[j] = o[j] * i[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};

    #[test]
    fn a_one_unit_rnn_by_hand() {
        // h1 = tanh(0.5·1 + 0.25·0) = tanh(0.5); h2 = tanh(0.5·2 + 0.25·h1).
        let x = f(&[2, 1, 1], &[1.0, 2.0]);
        let w = f(&[1, 1, 1], &[0.5]);
        let r = f(&[1, 1, 1], &[0.25]);
        let out = run("RNN", vec![], &[&x, &w, &r]);
        let h1 = 0.5f64.tanh();
        let h2 = (1.0 + 0.25 * h1).tanh();
        assert_close(&out[0], &[2, 1, 1, 1], &[h1 as f32, h2 as f32]);
        assert_close(&out[1], &[1, 1, 1], &[h2 as f32]);
    }

    #[test]
    fn an_lstm_with_zero_weights_keeps_half_its_cell() {
        // All pre-activations 0: i = f = o = 0.5, candidate 0, so c halves each step and
        // h = 0.5·tanh(c).
        let x = f(&[1, 1, 2], &[3.0, -1.0]);
        let w = f(&[1, 4, 2], &[0.0; 8]);
        let r = f(&[1, 4, 1], &[0.0; 4]);
        let empty = f(&[0], &[]);
        let h0 = f(&[1, 1, 1], &[0.0]);
        let c0 = f(&[1, 1, 1], &[2.0]);
        let out = super::super::test_util::run(
            "LSTM",
            vec![],
            &[&x, &w, &r, &f(&[1, 8], &[0.0; 8]), &empty, &h0, &c0],
        );
        assert_close(&out[2], &[1, 1, 1], &[1.0]);
        assert_close(&out[1], &[1, 1, 1], &[(0.5 * 1.0f64.tanh()) as f32]);
    }
}
