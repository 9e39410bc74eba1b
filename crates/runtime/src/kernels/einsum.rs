//! Einsum (<https://onnx.ai/onnx/operators/onnx__Einsum.html>): products of operand elements
//! summed over the labels absent from the output. Repeated labels in one operand take its
//! diagonal, `...` stands for broadcast leading dims, and without `->` the output is the
//! ellipsis then the labels used once, in alphabetical order (numpy's implicit mode).
//!
//! The loop runs over every combination of label values once (output labels outermost), so
//! it costs the product of all label sizes: the same as a matrix product for the contractions
//! exporters emit, with no blocking. Accumulates in f64.

use std::collections::BTreeMap;

use super::context::{Ctx, KernelResult, KernelTable};
use super::indexing::checked_size;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Einsum"], einsum);
}

fn einsum(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let operands: Vec<&HostTensor> = inputs
        .iter()
        .map(|t| t.ok_or("Einsum's inputs cannot be omitted"))
        .collect::<Result<_, _>>()?;
    let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape()).collect();
    let loops = einsum_loops(ctx, &shapes)?;
    let total = checked_size(&loops.out_shape)?;
    let summed_count: usize = loops.summed_shape.iter().product();
    let values: Vec<Vec<f32>> = operands.iter().map(|t| t.to_f32_vec()).collect();
    let offset = |index: usize, shape: &[usize], strides: &[usize]| {
        let mut rest = index;
        let mut at = 0;
        for axis in (0..shape.len()).rev() {
            at += rest % shape[axis] * strides[axis];
            rest /= shape[axis];
        }
        at
    };
    let mut out = Vec::with_capacity(total);
    for o in 0..total {
        let bases: Vec<usize> = loops
            .out_strides
            .iter()
            .map(|strides| offset(o, &loops.out_shape, strides))
            .collect();
        let mut sum = 0.0f64;
        for s in 0..summed_count {
            let mut product = 1.0f64;
            for (k, strides) in loops.summed_strides.iter().enumerate() {
                let at = bases[k] + offset(s, &loops.summed_shape, strides);
                product *= f64::from(values[k][at]);
            }
            sum += product;
        }
        out.push(sum as f32);
    }
    Ok(vec![HostTensor::f32(loops.out_shape, out)])
}

/// An Einsum as two nested loops: over the output's labels, then over the summed labels, with
/// each operand's element stride along every label of both (the sum of its axes' strides for a
/// label repeated in it, a diagonal; 0 where it broadcasts). The CUDA backend runs the same
/// loops.
pub(crate) struct EinsumLoops {
    pub(crate) out_shape: Vec<usize>,
    pub(crate) summed_shape: Vec<usize>,
    /// Per operand, its stride along each output label.
    pub(crate) out_strides: Vec<Vec<usize>>,
    /// Per operand, its stride along each summed label.
    pub(crate) summed_strides: Vec<Vec<usize>>,
}

/// The loops of the node's equation over operands of `shapes`, checked.
pub(crate) fn einsum_loops(ctx: &Ctx, shapes: &[&[usize]]) -> Result<EinsumLoops, String> {
    let equation: String = ctx.string("equation", "").split_whitespace().collect();
    let spec = Spec::parse(&equation, shapes)?;
    let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
    for (labels, shape) in spec.inputs.iter().zip(shapes) {
        for (&label, &size) in labels.iter().zip(shape.iter()) {
            let known = sizes.entry(label).or_insert(size);
            if *known == 1 {
                *known = size;
            } else if size != 1 && size != *known {
                return Err(format!("label '{label}' has sizes {known} and {size}"));
            }
        }
    }
    let summed: Vec<char> = sizes
        .keys()
        .copied()
        .filter(|l| !spec.output.contains(l))
        .collect();
    let label_strides: Vec<BTreeMap<char, usize>> = spec
        .inputs
        .iter()
        .zip(shapes)
        .map(|(labels, shape)| {
            let mut strides = BTreeMap::new();
            let mut stride = 1;
            for axis in (0..labels.len()).rev() {
                if shape[axis] != 1 {
                    *strides.entry(labels[axis]).or_insert(0) += stride;
                }
                stride *= shape[axis];
            }
            strides
        })
        .collect();
    let along = |labels: &[char]| -> Vec<Vec<usize>> {
        label_strides
            .iter()
            .map(|strides| {
                labels
                    .iter()
                    .map(|l| strides.get(l).copied().unwrap_or(0))
                    .collect()
            })
            .collect()
    };
    Ok(EinsumLoops {
        out_shape: spec.output.iter().map(|l| sizes[l]).collect(),
        summed_shape: summed.iter().map(|l| sizes[l]).collect(),
        out_strides: along(&spec.output),
        summed_strides: along(&summed),
    })
}

struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

impl Spec {
    fn parse(equation: &str, operands: &[&[usize]]) -> Result<Spec, String> {
        let (lhs, rhs) = match equation.split_once("->") {
            Some((lhs, rhs)) => (lhs, Some(rhs)),
            None => (equation, None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != operands.len() {
            return Err(format!(
                "the equation '{equation}' has {} operands, the node {}",
                terms.len(),
                operands.len()
            ));
        }
        let ellipsis_rank = terms
            .iter()
            .zip(operands)
            .filter(|(t, _)| t.contains("..."))
            .map(|(t, o)| o.len().saturating_sub(t.replace("...", "").len()))
            .max()
            .unwrap_or(0);
        let broadcast: Vec<char> = (0..ellipsis_rank)
            .map(|i| char::from_digit(i as u32, 36).unwrap_or('#'))
            .collect();
        let expand = |term: &str, rank: usize| -> Result<Vec<char>, String> {
            let explicit = term.replace("...", "");
            if !explicit.chars().all(|c| c.is_ascii_alphabetic()) {
                return Err(format!("'{term}' has a label that is not a letter"));
            }
            let labels: Vec<char> = match term.split_once("...") {
                None => term.chars().collect(),
                Some((before, after)) => {
                    let own = rank.checked_sub(explicit.len()).ok_or("too many labels")?;
                    before
                        .chars()
                        .chain(broadcast[ellipsis_rank - own..].iter().copied())
                        .chain(after.chars())
                        .collect()
                }
            };
            if labels.len() != rank {
                return Err(format!(
                    "'{term}' has {} labels for rank {rank}",
                    labels.len()
                ));
            }
            Ok(labels)
        };
        let inputs = terms
            .iter()
            .zip(operands)
            .map(|(t, o)| expand(t, o.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let output = match rhs {
            Some(rhs) => {
                let mut labels: Vec<char> = Vec::new();
                match rhs.split_once("...") {
                    None => labels.extend(rhs.chars()),
                    Some((before, after)) => {
                        labels.extend(before.chars());
                        labels.extend(&broadcast);
                        labels.extend(after.chars());
                    }
                }
                labels
            }
            None => {
                let mut counts: BTreeMap<char, usize> = BTreeMap::new();
                for label in inputs.iter().flatten().filter(|l| l.is_ascii_alphabetic()) {
                    *counts.entry(*label).or_default() += 1;
                }
                broadcast
                    .iter()
                    .copied()
                    .chain(counts.into_iter().filter(|&(_, n)| n == 1).map(|(l, _)| l))
                    .collect()
            }
        };
        if let Some(stray) = output
            .iter()
            .find(|l| !inputs.iter().flatten().any(|i| i == *l))
        {
            return Err(format!("output label '{stray}' is in no operand"));
        }
        Ok(Spec { inputs, output })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    fn einsum(equation: &str, operands: &[&crate::tensor::HostTensor]) -> Vec<f32> {
        let eq = vec![("equation", Attribute::String(equation.into()))];
        run("Einsum", eq, operands)[0].to_f32_vec()
    }

    #[test]
    fn products_traces_transposes_and_implicit_outputs() {
        let a = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(einsum("ij,jk->ik", &[&a, &b]), vec![19.0, 22.0, 43.0, 50.0]);
        assert_eq!(einsum("ii->", &[&a]), vec![5.0]);
        assert_eq!(einsum("ij->ji", &[&a]), vec![1.0, 3.0, 2.0, 4.0]);
        // Implicit: "ij,jk" keeps i and k.
        assert_eq!(einsum("ij,jk", &[&a, &b]), vec![19.0, 22.0, 43.0, 50.0]);
        let batch = f(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = run(
            "Einsum",
            vec![("equation", Attribute::String("...ij,jk->...ik".into()))],
            &[&batch, &b],
        );
        assert_close(&out[0], &[2, 1, 2], &[19.0, 22.0, 43.0, 50.0]);
    }
}
