//! Matrix products: `MatMul` (numpy semantics, <https://onnx.ai/onnx/operators/onnx__MatMul.html>,
//! opsets 1–13), `Gemm` (opsets 7–13), `Einsum` (opset 12+) and `MatMulInteger` (opset 10+).

use std::collections::BTreeMap;

use super::context::{broadcast, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{format_shape, DType, Dim, Shape};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["MatMul"], matmul);
    r.add("", &["MatMulInteger"], matmul_integer);
    r.add("", &["Gemm"], gemm);
    r.add("", &["Einsum"], einsum);
    r.add("", &["Det"], det);
}

/// Det: `[*, M, M]` → `[*]`.
fn det(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if x.len() < 2 {
        return Err(format!("input has rank {}, Det needs [*, M, M]", x.len()));
    }
    Ok(vec![Inferred::new(
        ctx.dtype(0)?,
        x[..x.len() - 2].to_vec(),
    )])
}

/// Two dims that must agree (a contraction): equal, or at least one symbolic.
/// `what` is written only for an error: formatting MatMul's operand shapes for every node was
/// two thirds of its shape rule's instructions (callgrind, a 20k-node stack).
fn check_same(a: &Dim, b: &Dim, what: impl FnOnce() -> String) -> Result<(), String> {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) if x != y => Err(format!("{}: {x} vs {y}", what())),
        _ => Ok(()),
    }
}

/// Output shape of a numpy-style matrix product, with 1-D operands promoted and then dropped.
pub(super) fn matmul_shape(ctx: &OpCtx, a: &Shape, b: &Shape) -> Result<Shape, String> {
    if a.is_empty() || b.is_empty() {
        return Err("MatMul operands must have rank >= 1".into());
    }
    let (a_rows, a_k) = if a.len() == 1 {
        (None, &a[0])
    } else {
        (Some(&a[a.len() - 2]), &a[a.len() - 1])
    };
    let (b_k, b_cols) = if b.len() == 1 {
        (&b[0], None)
    } else {
        (&b[b.len() - 2], Some(&b[b.len() - 1]))
    };
    check_same(a_k, b_k, || {
        format!(
            "inner dimensions of {} and {} differ",
            format_shape(a),
            format_shape(b)
        )
    })?;
    let a_batch: Shape = a[..a.len().saturating_sub(2)].to_vec();
    let b_batch: Shape = b[..b.len().saturating_sub(2)].to_vec();
    let mut out = broadcast(&[&a_batch, &b_batch], ctx, 0)?;
    out.extend(a_rows.cloned());
    out.extend(b_cols.cloned());
    Ok(out)
}

fn matmul(ctx: &OpCtx) -> RuleResult {
    let shape = matmul_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

fn matmul_integer(ctx: &OpCtx) -> RuleResult {
    let shape = matmul_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    Ok(vec![Inferred::new(DType::I32, shape)])
}

/// Gemm: `Y = alpha·op(A)·op(B) + beta·C` with 2-D A and B; C broadcasts to `[M, N]`.
fn gemm(ctx: &OpCtx) -> RuleResult {
    let shape = gemm_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

/// `[M, N]` of Gemm's `A` and `B` under `transA` / `transB` (QGemm's operands too).
pub(super) fn gemm_shape(ctx: &OpCtx, a: &Shape, b: &Shape) -> Result<Shape, String> {
    if a.len() != 2 || b.len() != 2 {
        return Err(format!(
            "Gemm needs 2-D operands, got {} and {}",
            format_shape(a),
            format_shape(b)
        ));
    }
    let trans_a = ctx.int_attr_or("transA", 0)? != 0;
    let trans_b = ctx.int_attr_or("transB", 0)? != 0;
    let (m, ka) = if trans_a {
        (&a[1], &a[0])
    } else {
        (&a[0], &a[1])
    };
    let (kb, n) = if trans_b {
        (&b[1], &b[0])
    } else {
        (&b[0], &b[1])
    };
    check_same(ka, kb, || "inner dimensions differ".into())?;
    Ok(vec![m.clone(), n.clone()])
}

/// Splits an einsum term into its letters and whether (and where) it has an ellipsis.
fn parse_term(term: &str) -> Result<(Vec<char>, Option<usize>), String> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = term.trim();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("...") {
            if ellipsis.replace(letters.len()).is_some() {
                return Err(format!("term '{term}' has two ellipses"));
            }
            rest = after;
            continue;
        }
        let c = rest.chars().next().expect("non-empty");
        if !c.is_ascii_alphabetic() {
            return Err(format!("term '{term}' has invalid character '{c}'"));
        }
        letters.push(c);
        rest = &rest[1..];
    }
    Ok((letters, ellipsis))
}

/// Einsum: sizes by letter from the operands, output letters from the equation (or, in implicit
/// mode, the letters used once, alphabetically, after the broadcast ellipsis dims).
fn einsum(ctx: &OpCtx) -> RuleResult {
    let equation = ctx
        .string_attr("equation")?
        .ok_or("attribute 'equation' is missing")?;
    let equation: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ctx.input_count() {
        return Err(format!(
            "equation has {} operands but the node has {} inputs",
            terms.len(),
            ctx.input_count()
        ));
    }
    let mut sizes: BTreeMap<char, Dim> = BTreeMap::new();
    let mut counts: BTreeMap<char, usize> = BTreeMap::new();
    let mut ellipsis_shapes: Vec<Shape> = Vec::new();
    for (i, term) in terms.iter().enumerate() {
        let shape = ctx.shape(i)?;
        let (letters, ellipsis) = parse_term(term)?;
        let ellipsis_rank = shape
            .len()
            .checked_sub(letters.len())
            .filter(|&r| ellipsis.is_some() || r == 0)
            .ok_or_else(|| {
                format!(
                    "operand {i} has shape {} but term '{term}' names {} axes",
                    format_shape(shape),
                    letters.len()
                )
            })?;
        let mut axis = 0;
        for (pos, &letter) in letters.iter().enumerate() {
            if ellipsis == Some(pos) {
                ellipsis_shapes.push(shape[axis..axis + ellipsis_rank].to_vec());
                axis += ellipsis_rank;
            }
            let dim = &shape[axis];
            axis += 1;
            *counts.entry(letter).or_default() += 1;
            match sizes.get(&letter) {
                Some(Dim::Known(1)) | None => {
                    sizes.insert(letter, dim.clone());
                }
                Some(existing) if *dim != Dim::Known(1) => check_same(existing, dim, || {
                    format!("letter '{letter}' has different sizes")
                })?,
                Some(_) => {}
            }
        }
        if ellipsis == Some(letters.len()) {
            ellipsis_shapes.push(shape[axis..axis + ellipsis_rank].to_vec());
        }
    }
    let refs: Vec<&Shape> = ellipsis_shapes.iter().collect();
    let ellipsis_dims = broadcast(&refs, ctx, 0)?;
    let mut out = Vec::new();
    match rhs {
        Some(rhs) => {
            let (letters, ellipsis) = parse_term(rhs)?;
            for (pos, letter) in letters.iter().enumerate() {
                if ellipsis == Some(pos) {
                    out.extend(ellipsis_dims.iter().cloned());
                }
                out.push(
                    sizes
                        .get(letter)
                        .cloned()
                        .ok_or_else(|| format!("output letter '{letter}' is not in any operand"))?,
                );
            }
            if ellipsis == Some(letters.len()) {
                out.extend(ellipsis_dims.iter().cloned());
            }
        }
        None => {
            out.extend(ellipsis_dims.iter().cloned());
            out.extend(
                counts
                    .iter()
                    .filter(|(_, &n)| n == 1)
                    .map(|(l, _)| sizes[l].clone()),
            );
        }
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}
