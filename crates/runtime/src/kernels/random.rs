//! The random generators: [Bernoulli](https://onnx.ai/onnx/operators/onnx__Bernoulli.html),
//! [RandomUniform](https://onnx.ai/onnx/operators/onnx__RandomUniform.html),
//! [RandomNormal](https://onnx.ai/onnx/operators/onnx__RandomNormal.html) and their `…Like`
//! forms. The spec leaves the generator to the runtime ("may not produce the same values in
//! different implementations even if a seed is specified"): this one is SplitMix64, seeded by
//! the `seed` attribute when given, else by a hash of the node's name, so that a run repeats
//! (a stage re-run on the same micro-batch draws the same values, and failures reproduce). No
//! value matches the ONNX reference's numpy draws; shapes and types do.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::checked_size;
use crate::tensor::runtime_dtype;
use crate::tensor::HostTensor;
use pipecut_ir::graph::{Attribute, DType};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Bernoulli"], bernoulli);
    t.add(&["RandomUniform", "RandomUniformLike"], |ctx, inputs| {
        let (low, high) = (ctx.float("low", 0.0), ctx.float("high", 1.0));
        generate(ctx, inputs, |rng| low + (high - low) * rng.uniform())
    });
    t.add(&["RandomNormal", "RandomNormalLike"], |ctx, inputs| {
        let (mean, scale) = (ctx.float("mean", 0.0), ctx.float("scale", 1.0));
        generate(ctx, inputs, |rng| mean + scale * rng.normal())
    });
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit state, one multiply-xorshift chain per draw.
struct SplitMix64(u64);

/// The generator's starting state: the `seed` attribute's bits, else an FNV-1a hash of the
/// node's name (fixed across processes, unlike std's hasher). Draw `i` (from 0) of the stream is
/// then `mix(state + (i + 1)·γ)`, which the device's Bernoulli computes per element.
pub(crate) fn draw_seed(ctx: &Ctx) -> u64 {
    match ctx.attr("seed") {
        Some(Attribute::Float(seed)) => seed.to_bits() as u64,
        Some(Attribute::Int(seed)) => *seed as u64,
        _ => ctx.node.name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
        }),
    }
}

impl SplitMix64 {
    fn new(ctx: &Ctx) -> SplitMix64 {
        SplitMix64(draw_seed(ctx))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 24 bits (every f32 step of that range equally likely).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal, by Box–Muller.
    fn normal(&mut self) -> f32 {
        let u = 1.0 - self.uniform() as f64;
        let v = self.uniform() as f64;
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// The output type: the `dtype` attribute, else the input's, else float.
pub(crate) fn output_dtype(ctx: &Ctx, like: Option<&HostTensor>) -> Result<DType, String> {
    match ctx.attr("dtype") {
        Some(Attribute::Int(code)) => DType::from_onnx(*code as i32)
            .ok_or_else(|| format!("dtype {code} is not an ONNX type")),
        _ => Ok(like.map_or(DType::F32, HostTensor::dtype)),
    }
}

/// RandomUniform/RandomNormal (shape attribute) and their `…Like` forms (the input's shape).
fn generate(
    ctx: &Ctx,
    inputs: &[Option<&HostTensor>],
    draw: impl Fn(&mut SplitMix64) -> f32,
) -> KernelResult {
    let like = inputs.first().copied().flatten();
    let shape: Vec<usize> = match (like, ctx.ints("shape")) {
        (Some(t), _) => t.shape().to_vec(),
        (None, Some(s)) => s
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("shape {s:?} has a negative dim")))
            .collect::<Result<_, _>>()?,
        (None, None) => return Err("attribute 'shape' is required".into()),
    };
    let mut rng = SplitMix64::new(ctx);
    let values = (0..checked_size(&shape)?).map(|_| draw(&mut rng)).collect();
    HostTensor::f32(shape, values)
        .cast(runtime_dtype(output_dtype(ctx, like)?))
        .map(|t| vec![t])
}

/// Bernoulli: 1 with the probability the input gives, else 0.
fn bernoulli(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let p = input(inputs, 0)?;
    let mut rng = SplitMix64::new(ctx);
    let values = p
        .to_f32_vec()
        .iter()
        .map(|&p| if rng.uniform() < p { 1.0 } else { 0.0 })
        .collect();
    HostTensor::f32(p.shape().to_vec(), values)
        .cast(runtime_dtype(output_dtype(ctx, Some(p))?))
        .map(|t| vec![t])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn a_seed_repeats_the_draws_and_certain_probabilities_hold() {
        let p = f(&[4], &[0.0, 1.0, 0.5, 0.5]);
        let seed = || vec![("seed", Attribute::Float(3.0))];
        let first = run("Bernoulli", seed(), &[&p]);
        assert_eq!(first, run("Bernoulli", seed(), &[&p]));
        let values = first[0].to_f32_vec();
        assert_eq!(&values[..2], &[0.0, 1.0]);
        let uniform = run(
            "RandomUniformLike",
            vec![
                ("low", Attribute::Float(2.0)),
                ("high", Attribute::Float(3.0)),
            ],
            &[&p],
        );
        assert!(uniform[0]
            .to_f32_vec()
            .iter()
            .all(|&v| (2.0..3.0).contains(&v)));
    }
}
