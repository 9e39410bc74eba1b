//! The recurrent layers RNN, GRU and LSTM (<https://onnx.ai/onnx/operators/onnx__LSTM.html> and
//! its siblings), every attribute of opsets 7–22: directions (forward, reverse,
//! bidirectional), `layout`, the activation lists with their alphas and betas, `clip`,
//! `sequence_lens`, initial states, LSTM's peepholes and `input_forget`, GRU's
//! `linear_before_reset`. Gate order in `W`, `R`, `B` is the spec's: LSTM `i o f c`, GRU
//! `z r h`. Computed in f64 per step, stored as f32.

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
    fn apply(self, x: f64) -> f64 {
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
    let clip = f64::from(ctx.float("clip", 0.0));
    let clip = (clip > 0.0).then_some(clip);
    let lens = sequence_lens(given(4), &dims)?;
    let initial_h = initial_state(given(5), &dims)?;
    let initial_c = if cell == Cell::Lstm {
        initial_state(given(6), &dims)?
    } else {
        Vec::new()
    };
    let (w, r) = (f64s(w), f64s(r));
    let bias = given(3).map(f64s);
    let peepholes = if cell == Cell::Lstm {
        given(7).map(f64s)
    } else {
        None
    };
    let x = f64s(x);
    let mut y = vec![0.0f64; seq * directions * batch * hidden];
    let mut y_h = vec![0.0f64; directions * batch * hidden];
    let mut y_c = vec![0.0f64; directions * batch * hidden];
    for d in 0..directions {
        let reverse = direction == "reverse" || d == 1;
        let per = cell.default_activations().len();
        let layer = Layer {
            cell,
            dims: &dims,
            w: &w[d * gates * hidden * input_size..(d + 1) * gates * hidden * input_size],
            r: &r[d * gates * hidden * hidden..(d + 1) * gates * hidden * hidden],
            bias: bias
                .as_ref()
                .map(|b| &b[d * 2 * gates * hidden..(d + 1) * 2 * gates * hidden]),
            peepholes: peepholes
                .as_ref()
                .map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]),
            acts: &acts[d * per..(d + 1) * per],
            clip,
            input_forget: ctx.int("input_forget", 0) != 0,
            linear_before_reset: ctx.int("linear_before_reset", 0) != 0,
        };
        for (b, &len) in lens.iter().enumerate() {
            let range = d * batch * hidden + b * hidden..d * batch * hidden + (b + 1) * hidden;
            let mut h = initial_h[range.clone()].to_vec();
            let mut c = if cell == Cell::Lstm {
                initial_c[range.clone()].to_vec()
            } else {
                Vec::new()
            };
            let sequence = Sequence {
                direction: d,
                batch_index: b,
                len,
                reverse,
            };
            layer.run(&x, sequence, (&mut h, &mut c), &mut y);
            y_h[range.clone()].copy_from_slice(&h);
            if cell == Cell::Lstm {
                y_c[range].copy_from_slice(&c);
            }
        }
    }
    let mut outputs = vec![reorder_y(&y, &dims), state_output(&y_h, &dims)];
    if cell == Cell::Lstm {
        outputs.push(state_output(&y_c, &dims));
    }
    Ok(outputs)
}

/// A tensor's values in f64, in which the layers compute.
fn f64s(t: &HostTensor) -> Vec<f64> {
    t.to_f32_vec().into_iter().map(f64::from).collect()
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
fn initial_state(state: Option<&HostTensor>, dims: &Dims) -> Result<Vec<f64>, String> {
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
            let mut out = vec![0.0; v.len()];
            for d in 0..directions {
                for b in 0..batch {
                    for h in 0..hidden {
                        let from = match batch_first {
                            false => (d * batch + b) * hidden + h,
                            true => (b * directions + d) * hidden + h,
                        };
                        out[(d * batch + b) * hidden + h] = f64::from(v[from]);
                    }
                }
            }
            Ok(out)
        }
        Some(t) => Err(format!("initial state has shape {:?}", t.shape())),
    }
}

/// A final state (`Y_h` or `Y_c`) from the internal `[directions, batch, hidden]` to the
/// layout's order.
fn state_output(v: &[f64], dims: &Dims) -> HostTensor {
    let Dims {
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = *dims;
    let (shape, data) = if batch_first {
        let mut out = vec![0.0f32; v.len()];
        for d in 0..directions {
            for b in 0..batch {
                for h in 0..hidden {
                    out[(b * directions + d) * hidden + h] = v[(d * batch + b) * hidden + h] as f32;
                }
            }
        }
        (vec![batch, directions, hidden], out)
    } else {
        (
            vec![directions, batch, hidden],
            v.iter().map(|&x| x as f32).collect(),
        )
    };
    HostTensor::f32(shape, data)
}

/// `Y` from the internal `[seq, directions, batch, hidden]` to the layout's order.
fn reorder_y(y: &[f64], dims: &Dims) -> HostTensor {
    let Dims {
        seq,
        batch,
        hidden,
        directions,
        batch_first,
        ..
    } = *dims;
    if !batch_first {
        return HostTensor::f32(
            vec![seq, directions, batch, hidden],
            y.iter().map(|&v| v as f32).collect(),
        );
    }
    let mut out = vec![0.0f32; y.len()];
    for t in 0..seq {
        for d in 0..directions {
            for b in 0..batch {
                for h in 0..hidden {
                    out[((b * seq + t) * directions + d) * hidden + h] =
                        y[((t * directions + d) * batch + b) * hidden + h] as f32;
                }
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
    w: &'a [f64],
    /// `[gates · hidden, hidden]`.
    r: &'a [f64],
    /// `[2 · gates · hidden]`: `Wb` then `Rb`.
    bias: Option<&'a [f64]>,
    /// LSTM `[3 · hidden]`: `Pi`, `Po`, `Pf`.
    peepholes: Option<&'a [f64]>,
    acts: &'a [Activation],
    clip: Option<f64>,
    input_forget: bool,
    linear_before_reset: bool,
}

/// Which sequence of the batch a layer runs, in which direction, and for how many steps.
#[derive(Debug, Clone, Copy)]
struct Sequence {
    direction: usize,
    batch_index: usize,
    len: usize,
    reverse: bool,
}

impl Layer<'_> {
    /// Runs `sequence` from the state `(h, c)` over `x` (all of `X`, `[seq, batch, input]` or
    /// `[batch, seq, input]`), writing each step's `h` into `y` (`[seq, directions, batch,
    /// hidden]`); leaves the final state in `(h, c)`.
    fn run(
        &self,
        x: &[f64],
        sequence: Sequence,
        (h, c): (&mut Vec<f64>, &mut Vec<f64>),
        y: &mut [f64],
    ) {
        let Dims {
            seq,
            batch,
            input,
            hidden,
            directions,
            batch_first,
        } = *self.dims;
        let Sequence {
            direction: d,
            batch_index: b,
            len,
            reverse,
        } = sequence;
        let steps: Vec<usize> = if reverse {
            (0..len).rev().collect()
        } else {
            (0..len).collect()
        };
        for t in steps {
            let at = match batch_first {
                false => (t * batch + b) * input,
                true => (b * seq + t) * input,
            };
            self.step(&x[at..at + input], h, c);
            let out = ((t * directions + d) * batch + b) * hidden;
            y[out..out + hidden].copy_from_slice(h);
        }
    }

    /// `W_g·x + Wb_g` and `R_g·h + Rb_g` for gate `g`, unit `j`.
    fn gate(&self, g: usize, j: usize, x: &[f64], h: &[f64]) -> (f64, f64) {
        let (input, hidden, gates) = (self.dims.input, self.dims.hidden, self.cell.gates());
        let row = g * hidden + j;
        let wx: f64 = self.w[row * input..(row + 1) * input]
            .iter()
            .zip(x)
            .map(|(a, b)| a * b)
            .sum();
        let rh: f64 = self.r[row * hidden..(row + 1) * hidden]
            .iter()
            .zip(h)
            .map(|(a, b)| a * b)
            .sum();
        let (wb, rb) = self
            .bias
            .map_or((0.0, 0.0), |b| (b[row], b[gates * hidden + row]));
        (wx + wb, rh + rb)
    }

    fn clip(&self, v: f64) -> f64 {
        self.clip.map_or(v, |c| v.clamp(-c, c))
    }

    /// Advances `h` (and LSTM's `c`) by one input `x`.
    fn step(&self, x: &[f64], h: &mut Vec<f64>, c: &mut Vec<f64>) {
        let hidden = self.dims.hidden;
        let act = |i: usize, v: f64| self.acts[i].apply(self.clip(v));
        match self.cell {
            Cell::Rnn => {
                let next: Vec<f64> = (0..hidden)
                    .map(|j| {
                        let (wx, rh) = self.gate(0, j, x, h);
                        act(0, wx + rh)
                    })
                    .collect();
                *h = next;
            }
            Cell::Gru => {
                let z: Vec<f64> = (0..hidden)
                    .map(|j| {
                        let (wx, rh) = self.gate(0, j, x, h);
                        act(0, wx + rh)
                    })
                    .collect();
                let reset: Vec<f64> = (0..hidden)
                    .map(|j| {
                        let (wx, rh) = self.gate(1, j, x, h);
                        act(0, wx + rh)
                    })
                    .collect();
                let gated: Vec<f64> = h.iter().zip(&reset).map(|(a, b)| a * b).collect();
                let next: Vec<f64> = (0..hidden)
                    .map(|j| {
                        let candidate = if self.linear_before_reset {
                            let (wx, rh) = self.gate(2, j, x, h);
                            act(1, wx + reset[j] * rh)
                        } else {
                            let (wx, rh) = self.gate(2, j, x, &gated);
                            act(1, wx + rh)
                        };
                        (1.0 - z[j]) * candidate + z[j] * h[j]
                    })
                    .collect();
                *h = next;
            }
            Cell::Lstm => {
                let peep = |k: usize, j: usize| self.peepholes.map_or(0.0, |p| p[k * hidden + j]);
                let mut next_h = vec![0.0; hidden];
                let mut next_c = vec![0.0; hidden];
                for j in 0..hidden {
                    // Gate rows: i = 0, o = 1, f = 2, c = 3; peepholes i, o, f.
                    let pre = |g: usize| {
                        let (wx, rh) = self.gate(g, j, x, h);
                        wx + rh
                    };
                    let i = act(0, pre(0) + peep(0, j) * c[j]);
                    let f = if self.input_forget {
                        1.0 - i
                    } else {
                        act(0, pre(2) + peep(2, j) * c[j])
                    };
                    let candidate = act(1, pre(3));
                    next_c[j] = f * c[j] + i * candidate;
                    let o = act(0, pre(1) + peep(1, j) * next_c[j]);
                    next_h[j] = o * act(2, next_c[j]);
                }
                *h = next_h;
                *c = next_c;
            }
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
