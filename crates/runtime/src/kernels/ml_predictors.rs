//! The `ai.onnx.ml` predictors skl2onnx and onnxmltools write: LinearClassifier,
//! LinearRegressor, SVMClassifier, SVMRegressor, TreeEnsembleClassifier and
//! TreeEnsembleRegressor (ml opsets 1–3; opset 5 deprecates the trees in favour of TreeEnsemble,
//! but converters still emit them). Semantics: onnx's reference (`onnx/reference/ops/aionnxml`)
//! and onnxruntime, which agree on everything here.

use std::collections::HashMap;

use super::context::{input, Ctx, KernelResult, KernelTable};
use crate::tensor::{try_filled, HostTensor, TensorData};
use pipecut_ir::graph::Attribute;

const DOMAIN: &str = "ai.onnx.ml";

pub(super) fn register(t: &mut KernelTable) {
    t.add_in(DOMAIN, &["LinearClassifier"], linear_classifier);
    t.add_in(DOMAIN, &["LinearRegressor"], linear_regressor);
    t.add_in(DOMAIN, &["SVMClassifier"], svm_classifier);
    t.add_in(DOMAIN, &["SVMRegressor"], svm_regressor);
    t.add_in(
        DOMAIN,
        &["TreeEnsembleClassifier"],
        tree_ensemble_classifier,
    );
    t.add_in(DOMAIN, &["TreeEnsembleRegressor"], tree_ensemble_regressor);
}

/// The rows of `[N, F]` (or `[F]`, one row) as floats: `(rows, features, values)`.
fn rows_of(x: &HostTensor) -> Result<(usize, usize, Vec<f32>), String> {
    match *x.shape() {
        [features] => Ok((1, features, x.to_f32_vec())),
        [rows, features] => {
            // Every row gets an answer, even a row of no features: `[2^40, 0]` would ask for
            // terabytes of them.
            super::indexing::checked_size(&[rows])?;
            Ok((rows, features, x.to_f32_vec()))
        }
        _ => Err(format!(
            "the input must be [N, F] or [F], not {:?}",
            x.shape()
        )),
    }
}

/// Each row of `rows` rows of `features` values (empty rows when there are no features).
fn each_row(values: &[f32], rows: usize, features: usize) -> impl Iterator<Item = &[f32]> {
    (0..rows).map(move |r| values.get(r * features..(r + 1) * features).unwrap_or(&[]))
}

/// A tree attribute of floats, or its ml-opset-3 `<name>_as_tensor` form (what converters write
/// for double-precision models), as f32; empty when neither is given.
fn tree_floats(ctx: &Ctx, name: &str) -> Result<Vec<f32>, String> {
    let as_tensor = format!("{name}_as_tensor");
    match (ctx.attr(name), ctx.attr(&as_tensor)) {
        (Some(_), _) => super::ml::float_list(ctx, name),
        (None, Some(_)) => super::ml::float_list(ctx, &as_tensor),
        (None, None) => Ok(Vec::new()),
    }
}

fn floats(ctx: &Ctx, name: &str) -> Vec<f32> {
    match ctx.attr(name) {
        Some(Attribute::Floats(v)) => v.clone(),
        _ => Vec::new(),
    }
}

/// A classifier's or regressor's `post_transform`, applied to one row of scores (TreeEnsemble's
/// too, which names it by code).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum PostTransform {
    None,
    Softmax,
    Logistic,
    SoftmaxZero,
    Probit,
}

impl PostTransform {
    fn of(ctx: &Ctx) -> Result<PostTransform, String> {
        Ok(match ctx.string("post_transform", "NONE").as_str() {
            "NONE" => PostTransform::None,
            "SOFTMAX" => PostTransform::Softmax,
            "LOGISTIC" => PostTransform::Logistic,
            "SOFTMAX_ZERO" => PostTransform::SoftmaxZero,
            "PROBIT" => PostTransform::Probit,
            other => return Err(format!("post_transform '{other}' is not an ONNX one")),
        })
    }

    /// The transform of ml opset 5's TreeEnsemble, which gives it as a code (0 to 4).
    pub(super) fn of_code(code: i64) -> Result<PostTransform, String> {
        Ok(match code {
            0 => PostTransform::None,
            1 => PostTransform::Softmax,
            2 => PostTransform::Logistic,
            3 => PostTransform::SoftmaxZero,
            4 => PostTransform::Probit,
            other => {
                return Err(format!(
                    "post_transform {other} is not an ONNX one (0 to 4 are)"
                ))
            }
        })
    }

    pub(super) fn apply(self, scores: &mut [f32]) {
        let softmax = |scores: &mut [f32], keep_zeros: bool| {
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = if keep_zeros && *s == 0.0 {
                    0.0
                } else {
                    (*s - max).exp()
                };
                sum += *s;
            }
            scores.iter_mut().for_each(|s| *s /= sum);
        };
        match self {
            PostTransform::None => {}
            PostTransform::Softmax => softmax(scores, false),
            PostTransform::SoftmaxZero => softmax(scores, true),
            PostTransform::Logistic => scores.iter_mut().for_each(|s| *s = logistic(*s)),
            PostTransform::Probit => scores.iter_mut().for_each(|s| *s = probit(*s)),
        }
    }
}

fn logistic(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `√2 · erfinv(2p − 1)` with onnxruntime's erfinv approximation (Winitzki's, a = 0.147), so
/// that PROBIT scores match its bits closely.
fn probit(p: f32) -> f32 {
    let x = 2.0 * p - 1.0;
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let ln = ((1.0 - x) * (1.0 + x)).ln();
    let a = 0.147_f32;
    let v = 2.0 / (std::f32::consts::PI * a) + 0.5 * ln;
    let erfinv = sign * ((v * v - ln / a).sqrt() - v).sqrt();
    std::f32::consts::SQRT_2 * erfinv
}

/// A classifier's labels: `classlabels_ints`/`_int64s` or `classlabels_strings`.
enum Labels {
    Ints(Vec<i64>),
    Texts(Vec<String>),
}

impl Labels {
    fn of(ctx: &Ctx) -> Result<Labels, String> {
        let ints = ctx
            .ints("classlabels_ints")
            .or_else(|| ctx.ints("classlabels_int64s"));
        match (ints, ctx.attr("classlabels_strings")) {
            (Some(v), _) if !v.is_empty() => Ok(Labels::Ints(v)),
            (_, Some(Attribute::Strings(v))) if !v.is_empty() => Ok(Labels::Texts(v.clone())),
            _ => Err("no classlabels_ints/int64s or classlabels_strings is given".into()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Labels::Ints(v) => v.len(),
            Labels::Texts(v) => v.len(),
        }
    }

    /// The label tensor `[N]` for the chosen class of each row.
    fn pick(&self, classes: &[usize]) -> Result<HostTensor, String> {
        let missing = |c: usize| format!("class {c} has no label ({} labels)", self.len());
        let data = match self {
            Labels::Ints(v) => TensorData::I64(
                classes
                    .iter()
                    .map(|&c| v.get(c).copied().ok_or_else(|| missing(c)))
                    .collect::<Result<_, _>>()?,
            ),
            Labels::Texts(v) => TensorData::String(
                classes
                    .iter()
                    .map(|&c| v.get(c).cloned().ok_or_else(|| missing(c)))
                    .collect::<Result<_, _>>()?,
            ),
        };
        HostTensor::new(vec![classes.len()], data)
    }
}

/// The index of the first largest score (numpy's argmax).
fn argmax(scores: &[f32]) -> usize {
    scores
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &s)| {
            if s > best.1 {
                (i, s)
            } else {
                best
            }
        })
        .0
}

/// `x · Wᵀ + b` for every row: `weights` holds `outputs` rows of `features`.
fn affine(
    values: &[f32],
    features: usize,
    weights: &[f32],
    intercepts: &[f32],
) -> Result<(usize, Vec<f32>), String> {
    if features == 0 || !weights.len().is_multiple_of(features) {
        return Err(format!(
            "{} coefficients do not make rows of {features} features",
            weights.len()
        ));
    }
    let outputs = weights.len() / features;
    if !intercepts.is_empty() && intercepts.len() != outputs {
        return Err(format!(
            "{} intercepts for {outputs} outputs",
            intercepts.len()
        ));
    }
    let mut out = Vec::new();
    for row in values.chunks_exact(features) {
        for (o, w) in weights.chunks_exact(features).enumerate() {
            let dot: f32 = row.iter().zip(w).map(|(a, b)| a * b).sum();
            out.push(dot + intercepts.get(o).copied().unwrap_or(0.0));
        }
    }
    Ok((outputs, out))
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LinearClassifier.html>: one score per
/// coefficient row, post-transformed; a single row for two classes scores both as `(-s, s)`.
fn linear_classifier(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let labels = Labels::of(ctx)?;
    let (mut width, mut scores) = affine(
        &values,
        features,
        &floats(ctx, "coefficients"),
        &floats(ctx, "intercepts"),
    )?;
    if width == 1 && labels.len() == 2 {
        scores = scores.iter().flat_map(|&s| [-s, s]).collect();
        width = 2;
    }
    let post = PostTransform::of(ctx)?;
    let mut classes = Vec::with_capacity(rows);
    for row in scores.chunks_exact_mut(width) {
        post.apply(row);
        classes.push(argmax(row));
    }
    Ok(vec![
        labels.pick(&classes)?,
        HostTensor::f32(vec![rows, width], scores),
    ])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LinearRegressor.html>: `x · Wᵀ + b`,
/// post-transformed, `[N, targets]`.
fn linear_regressor(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let (width, mut out) = affine(
        &values,
        features,
        &floats(ctx, "coefficients"),
        &floats(ctx, "intercepts"),
    )?;
    let post = PostTransform::of(ctx)?;
    out.chunks_exact_mut(width.max(1))
        .for_each(|row| post.apply(row));
    Ok(vec![HostTensor::f32(vec![rows, width], out)])
}

/// An SVM's kernel (`kernel_type`, `kernel_params` = gamma, coef0, degree).
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Linear,
    Poly { gamma: f32, coef0: f32, degree: f32 },
    Rbf { gamma: f32 },
    Sigmoid { gamma: f32, coef0: f32 },
}

impl Kernel {
    fn of(ctx: &Ctx) -> Result<Kernel, String> {
        let params = floats(ctx, "kernel_params");
        let param = |i: usize| params.get(i).copied().unwrap_or(0.0);
        let (gamma, coef0, degree) = (param(0), param(1), param(2));
        Ok(match ctx.string("kernel_type", "LINEAR").as_str() {
            "LINEAR" => Kernel::Linear,
            "POLY" => Kernel::Poly {
                gamma,
                coef0,
                degree,
            },
            "RBF" => Kernel::Rbf { gamma },
            "SIGMOID" => Kernel::Sigmoid { gamma, coef0 },
            other => return Err(format!("kernel_type '{other}' is not an ONNX one")),
        })
    }

    fn eval(self, a: &[f32], b: &[f32]) -> f32 {
        let dot = || a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        match self {
            Kernel::Linear => dot(),
            Kernel::Poly {
                gamma,
                coef0,
                degree,
            } => (dot() * gamma + coef0).powf(degree),
            Kernel::Rbf { gamma } => {
                let squared: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
                (-gamma * squared).exp()
            }
            Kernel::Sigmoid { gamma, coef0 } => (dot() * gamma + coef0).tanh(),
        }
    }
}

/// The support vectors, `count` rows of the input's `features`.
fn support_vectors(ctx: &Ctx, count: usize, features: usize) -> Result<Vec<f32>, String> {
    let vectors = floats(ctx, "support_vectors");
    if vectors.len() != count * features {
        return Err(format!(
            "{} support_vectors values for {count} vectors of {features} features",
            vectors.len()
        ));
    }
    Ok(vectors)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_SVMRegressor.html>: `Σ coef_j · K(x, sv_j) +
/// rho` (a plain dot product without support vectors), `±1` for a one-class SVM.
fn svm_regressor(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let supports = usize::try_from(ctx.int("n_supports", 0)).map_err(|_| "n_supports < 0")?;
    let coefficients = floats(ctx, "coefficients");
    let rho = floats(ctx, "rho").first().copied().unwrap_or(0.0);
    let kernel = Kernel::of(ctx)?;
    let vectors = support_vectors(ctx, supports, features)?;
    if supports > 0 && coefficients.len() < supports {
        return Err(format!(
            "{} coefficients for {supports} supports",
            coefficients.len()
        ));
    }
    let one_class = ctx.int("one_class", 0) != 0;
    let post = PostTransform::of(ctx)?;
    let mut out = Vec::with_capacity(rows);
    for row in each_row(&values, rows, features) {
        let mut s = if supports > 0 {
            vectors
                .chunks_exact(features.max(1))
                .zip(&coefficients)
                .map(|(sv, c)| c * kernel.eval(row, sv))
                .sum::<f32>()
        } else {
            Kernel::Linear.eval(row, &coefficients)
        } + rho;
        if one_class {
            s = if s > 0.0 { 1.0 } else { -1.0 };
        }
        post.apply(std::slice::from_mut(&mut s));
        out.push(s);
    }
    Ok(vec![HostTensor::f32(vec![rows, 1], out)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_SVMClassifier.html>. A linear SVM (no
/// support vectors) scores each class; a kernel SVM scores each pair of classes one against
/// one (libsvm's layout: `vectors_per_class`, coefficients `[C-1, vectors]`, one `rho` per pair)
/// and the label is the class with most votes; two classes give the scores `(-s, s)`. With
/// `prob_a`/`prob_b` (scikit-learn's `probability=True`) the scores are libsvm's class
/// probabilities and the label the likeliest class, as in onnxruntime.
fn svm_classifier(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let labels = Labels::of(ctx)?;
    let sigmoids = (floats(ctx, "prob_a"), floats(ctx, "prob_b"));
    let per_class: Vec<usize> = ctx
        .ints("vectors_per_class")
        .unwrap_or_default()
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| format!("vectors_per_class holds {v}")))
        .collect::<Result<_, _>>()?;
    let coefficients = floats(ctx, "coefficients");
    let rho = floats(ctx, "rho");
    let post = PostTransform::of(ctx)?;
    let kernel = Kernel::of(ctx)?;
    let svm = OneVsOne::new(per_class, labels.len(), &coefficients, &rho)?;
    let vectors = support_vectors(ctx, svm.vectors, features)?;
    let all_positive = coefficients.iter().all(|&c| c >= 0.0);
    let mut scores = Vec::new();
    let mut classes = Vec::with_capacity(rows);
    for row in each_row(&values, rows, features) {
        let (class, row_scores) = if svm.vectors == 0 {
            let weights: Vec<f32> = coefficients
                .chunks(features.max(1))
                .map(|w| kernel.eval(row, w) + rho.first().copied().unwrap_or(0.0))
                .collect();
            (argmax(&weights), weights)
        } else {
            let kernels: Vec<f32> = vectors
                .chunks_exact(features.max(1))
                .map(|sv| kernel.eval(row, sv))
                .collect();
            svm.vote(&kernels, all_positive)
        };
        let (class, mut row_scores) = if sigmoids.0.is_empty() || svm.vectors == 0 {
            (class, row_scores)
        } else {
            let probabilities = coupled_probabilities(&row_scores, &sigmoids, labels.len())?;
            (argmax(&probabilities), probabilities)
        };
        if row_scores.len() == 1 {
            row_scores = vec![-row_scores[0], row_scores[0]];
        }
        post.apply(&mut row_scores);
        classes.push(class);
        scores.extend(row_scores);
    }
    let width = scores.len().checked_div(rows).unwrap_or(0);
    Ok(vec![
        labels.pick(&classes)?,
        HostTensor::f32(vec![rows, width], scores),
    ])
}

/// libsvm's class probabilities from the pair scores: each pair's Platt sigmoid
/// `1 / (1 + exp(s·A + B))`, clamped to [1e-7, 1 − 1e-7], coupled by Wu, Lin and Weng's second
/// method (`multiclass_probability` in libsvm's svm.cpp, which onnxruntime follows).
fn coupled_probabilities(
    pair_scores: &[f32],
    (prob_a, prob_b): &(Vec<f32>, Vec<f32>),
    classes: usize,
) -> Result<Vec<f32>, String> {
    let pairs = classes * classes.saturating_sub(1) / 2;
    if pair_scores.len() != pairs || prob_a.len() < pairs || prob_b.len() < pairs {
        return Err(format!(
            "{} prob_a and {} prob_b for {pairs} pairs of classes",
            prob_a.len(),
            prob_b.len()
        ));
    }
    let mut r = vec![0.0_f64; classes * classes];
    let mut pair = 0;
    for i in 0..classes {
        for j in i + 1..classes {
            let z = f64::from(pair_scores[pair] * prob_a[pair] + prob_b[pair]);
            let p = (1.0 / (1.0 + z.exp())).clamp(1e-7, 1.0 - 1e-7);
            r[i * classes + j] = p;
            r[j * classes + i] = 1.0 - p;
            pair += 1;
        }
    }
    Ok(couple(&r, classes).into_iter().map(|p| p as f32).collect())
}

/// libsvm's `multiclass_probability`: `p` minimising `Σ (r_ji p_i − r_ij p_j)²` on the simplex,
/// by its fixed-point iteration (at most max(100, k) sweeps, to a tolerance of 0.005 / k).
fn couple(r: &[f64], k: usize) -> Vec<f64> {
    let mut q = vec![0.0_f64; k * k];
    for t in 0..k {
        for j in 0..k {
            if j != t {
                q[t * k + t] += r[j * k + t] * r[j * k + t];
                q[t * k + j] = -r[j * k + t] * r[t * k + j];
            }
        }
    }
    let mut p = vec![1.0 / k as f64; k];
    let mut qp = vec![0.0_f64; k];
    for _ in 0..k.max(100) {
        for t in 0..k {
            qp[t] = (0..k).map(|j| q[t * k + j] * p[j]).sum();
        }
        let mut pqp: f64 = (0..k).map(|t| p[t] * qp[t]).sum();
        if qp.iter().all(|&v| (v - pqp).abs() < 0.005 / k as f64) {
            break;
        }
        for t in 0..k {
            let diff = (-qp[t] + pqp) / q[t * k + t];
            p[t] += diff;
            pqp =
                (pqp + diff * (diff * q[t * k + t] + 2.0 * qp[t])) / ((1.0 + diff) * (1.0 + diff));
            for j in 0..k {
                qp[j] = (qp[j] + diff * q[t * k + j]) / (1.0 + diff);
                p[j] /= 1.0 + diff;
            }
        }
    }
    p
}

/// A kernel SVM's one-against-one layout (libsvm's): the support vectors of each class in
/// turn, for each pair (i, j) the coefficients of i's vectors in row j−1 and of j's in row i.
struct OneVsOne<'a> {
    per_class: Vec<usize>,
    starts: Vec<usize>,
    vectors: usize,
    coefficients: &'a [f32],
    rho: &'a [f32],
}

impl<'a> OneVsOne<'a> {
    fn new(
        per_class: Vec<usize>,
        classes: usize,
        coefficients: &'a [f32],
        rho: &'a [f32],
    ) -> Result<OneVsOne<'a>, String> {
        let mut starts = Vec::with_capacity(per_class.len());
        let mut vectors = 0usize;
        for &count in &per_class {
            starts.push(vectors);
            vectors = vectors
                .checked_add(count)
                .ok_or("too many support vectors")?;
        }
        if vectors > 0 {
            let pairs = classes * classes.saturating_sub(1) / 2;
            if per_class.len() != classes || rho.len() < pairs {
                return Err(format!(
                    "{} vectors_per_class and {} rho for {classes} classes",
                    per_class.len(),
                    rho.len()
                ));
            }
            if coefficients.len() != classes.saturating_sub(1) * vectors {
                return Err(format!(
                    "{} coefficients for {classes} classes of {vectors} vectors",
                    coefficients.len()
                ));
            }
        }
        Ok(OneVsOne {
            per_class,
            starts,
            vectors,
            coefficients,
            rho,
        })
    }

    /// The winning class (most votes; with one pair, libsvm's sign rule) and the pair scores.
    fn vote(&self, kernels: &[f32], all_positive: bool) -> (usize, Vec<f32>) {
        let classes = self.per_class.len();
        let mut votes = vec![0.0_f32; classes];
        let mut scores = Vec::new();
        let part = |row: usize, class: usize| {
            let (start, count) = (self.starts[class], self.per_class[class]);
            let coefs = &self.coefficients[row * self.vectors + start..][..count];
            coefs
                .iter()
                .zip(&kernels[start..start + count])
                .map(|(c, k)| c * k)
                .sum::<f32>()
        };
        for i in 0..classes {
            for j in i + 1..classes {
                let s = self.rho[scores.len()] + part(j - 1, i) + part(i, j);
                votes[if s > 0.0 { i } else { j }] += 1.0;
                scores.push(s);
            }
        }
        let winner = argmax(&votes);
        let class = if self.rho.len() == 1 && all_positive && votes[winner] >= 0.5 {
            1
        } else {
            winner
        };
        (class, scores)
    }
}

/// A legacy tree ensemble (TreeEnsembleClassifier/Regressor): nodes named by (tree, node id),
/// tests as `nodes_modes` strings, and leaves that may hold weights for several targets.
struct LegacyForest {
    features: Vec<usize>,
    thresholds: Vec<f32>,
    modes: Vec<Mode>,
    missing_goes_true: Vec<bool>,
    true_next: Vec<usize>,
    false_next: Vec<usize>,
    /// Per node, the (target, weight) pairs of a leaf.
    leaf_weights: Vec<Vec<(usize, f32)>>,
    /// The first node of each tree, trees in ascending id order.
    roots: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Leaf,
}

impl LegacyForest {
    /// Decodes the `nodes_*` attributes and the leaves' `<prefix>_{treeids,nodeids,ids,weights}`
    /// (`target` for regressors, `class` for classifiers).
    fn new(ctx: &Ctx, prefix: &str) -> Result<LegacyForest, String> {
        let ints = |name: &str| {
            ctx.ints(name)
                .ok_or_else(|| format!("attribute '{name}' is missing"))
        };
        let trees = ints("nodes_treeids")?;
        let ids = ints("nodes_nodeids")?;
        let count = trees.len();
        let index: HashMap<(i64, i64), usize> = trees
            .iter()
            .copied()
            .zip(ids.iter().copied())
            .enumerate()
            .map(|(i, k)| (k, i))
            .collect();
        let next = |name: &str| -> Result<Vec<usize>, String> {
            let targets = ints(name)?;
            (0..count)
                .map(|i| {
                    let target = *targets.get(i).ok_or_else(|| format!("'{name}' is short"))?;
                    Ok(index
                        .get(&(trees[i], target))
                        .copied()
                        .unwrap_or(usize::MAX))
                })
                .collect()
        };
        let modes = match ctx.attr("nodes_modes") {
            Some(Attribute::Strings(v)) => v
                .iter()
                .map(|m| parse_mode(m))
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err("attribute 'nodes_modes' is missing".into()),
        };
        let features = ints("nodes_featureids")?
            .into_iter()
            .map(|f| usize::try_from(f).map_err(|_| format!("nodes_featureids holds {f}")))
            .collect::<Result<Vec<_>, _>>()?;
        let thresholds = tree_floats(ctx, "nodes_values")?;
        if modes.len() != count || features.len() != count || thresholds.len() != count {
            return Err(format!(
                "the nodes_* attributes do not all have {count} entries"
            ));
        }
        let mut leaf_weights = vec![Vec::new(); count];
        let (leaf_trees, leaf_nodes, targets) = (
            ints(&format!("{prefix}_treeids"))?,
            ints(&format!("{prefix}_nodeids"))?,
            ints(&format!("{prefix}_ids"))?,
        );
        let weights = tree_floats(ctx, &format!("{prefix}_weights"))?;
        for (((tree, node), target), weight) in leaf_trees
            .iter()
            .zip(&leaf_nodes)
            .zip(&targets)
            .zip(&weights)
        {
            let at = index
                .get(&(*tree, *node))
                .ok_or_else(|| format!("leaf ({tree}, {node}) is not a node"))?;
            let target = usize::try_from(*target).map_err(|_| format!("leaf target {target}"))?;
            leaf_weights[*at].push((target, *weight));
        }
        let mut roots: Vec<(i64, usize)> = Vec::new();
        for (i, &tree) in trees.iter().enumerate() {
            if !roots.iter().any(|&(t, _)| t == tree) {
                roots.push((tree, i));
            }
        }
        roots.sort();
        Ok(LegacyForest {
            features,
            thresholds,
            modes,
            missing_goes_true: ctx
                .ints("nodes_missing_value_tracks_true")
                .unwrap_or_default()
                .into_iter()
                .map(|t| t != 0)
                .collect(),
            true_next: next("nodes_truenodeids")?,
            false_next: next("nodes_falsenodeids")?,
            leaf_weights,
            roots: roots.into_iter().map(|(_, i)| i).collect(),
        })
    }

    /// The leaf `row` reaches from `root`; a walk longer than the node count has met a cycle.
    fn leaf(&self, root: usize, row: &[f32]) -> Result<usize, String> {
        let mut at = root;
        for _ in 0..=self.modes.len() {
            let mode = *self
                .modes
                .get(at)
                .ok_or("a branch goes to a node that does not exist")?;
            if mode == Mode::Leaf {
                return Ok(at);
            }
            let feature = self.features[at];
            let x = *row
                .get(feature)
                .ok_or_else(|| format!("feature {feature} is outside a row of {}", row.len()))?;
            let t = self.thresholds[at];
            let goes_true = if x.is_nan() {
                self.missing_goes_true.get(at) == Some(&true)
            } else {
                match mode {
                    Mode::Leq => x <= t,
                    Mode::Lt => x < t,
                    Mode::Gte => x >= t,
                    Mode::Gt => x > t,
                    Mode::Eq => x == t,
                    Mode::Neq => x != t,
                    Mode::Leaf => return Ok(at),
                }
            };
            at = if goes_true {
                self.true_next[at]
            } else {
                self.false_next[at]
            };
        }
        Err("the trees have a cycle".into())
    }

    /// Every row's per-target sums over the trees' leaves (or min / max, per `aggregate`),
    /// `[rows, targets]`, starting from `base` (per target; empty means 0).
    fn scores(
        &self,
        values: &[f32],
        rows: usize,
        features: usize,
        targets: usize,
        aggregate: &str,
        base: &[f32],
    ) -> Result<Vec<f32>, String> {
        let start = match aggregate {
            "SUM" | "AVERAGE" => 0.0,
            "MIN" => f32::MAX,
            "MAX" => f32::MIN,
            other => return Err(format!("aggregate_function '{other}' is not an ONNX one")),
        };
        let mut out = try_filled(
            rows.checked_mul(targets).ok_or("the output is too large")?,
            start,
        )?;
        for (row, scores) in
            each_row(values, rows, features).zip(out.chunks_exact_mut(targets.max(1)))
        {
            for &root in &self.roots {
                for &(target, weight) in &self.leaf_weights[self.leaf(root, row)?] {
                    let score = scores
                        .get_mut(target)
                        .ok_or_else(|| format!("leaf target {target} is not below {targets}"))?;
                    *score = match aggregate {
                        "MIN" => score.min(weight),
                        "MAX" => score.max(weight),
                        _ => *score + weight,
                    };
                }
            }
            if aggregate == "AVERAGE" {
                scores
                    .iter_mut()
                    .for_each(|s| *s /= self.roots.len().max(1) as f32);
            }
            if !base.is_empty() {
                for (i, s) in scores.iter_mut().enumerate() {
                    *s += base[i % base.len()];
                }
            }
        }
        Ok(out)
    }
}

fn parse_mode(mode: &str) -> Result<Mode, String> {
    Ok(match mode {
        "BRANCH_LEQ" => Mode::Leq,
        "BRANCH_LT" => Mode::Lt,
        "BRANCH_GTE" => Mode::Gte,
        "BRANCH_GT" => Mode::Gt,
        "BRANCH_EQ" => Mode::Eq,
        "BRANCH_NEQ" => Mode::Neq,
        "LEAF" => Mode::Leaf,
        other => return Err(format!("node mode '{other}' is not an ONNX one")),
    })
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsembleRegressor.html>: the leaves'
/// target weights aggregated over the trees, plus `base_values`, `[N, n_targets]`.
fn tree_ensemble_regressor(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let targets = usize::try_from(ctx.int("n_targets", 1)).map_err(|_| "n_targets < 0")?;
    let forest = LegacyForest::new(ctx, "target")?;
    let aggregate = ctx.string("aggregate_function", "SUM");
    let mut out = forest.scores(
        &values,
        rows,
        features,
        targets,
        &aggregate,
        &tree_floats(ctx, "base_values")?,
    )?;
    let post = PostTransform::of(ctx)?;
    out.chunks_exact_mut(targets.max(1))
        .for_each(|row| post.apply(row));
    Ok(vec![HostTensor::f32(vec![rows, targets], out)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsembleClassifier.html>: class weights
/// summed over the trees plus `base_values`; a binary model whose leaves score one class
/// scores `(1 − s, s)` (`(-s, s)` before a LOGISTIC or SOFTMAX), then post-transformed; the
/// label is the best class.
fn tree_ensemble_classifier(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (rows, features, values) = rows_of(input(inputs, 0)?)?;
    let labels = Labels::of(ctx)?;
    let width = labels.len().max(2);
    let forest = LegacyForest::new(ctx, "class")?;
    let mut scores = forest.scores(
        &values,
        rows,
        features,
        width,
        "SUM",
        &tree_floats(ctx, "base_values")?,
    )?;
    let class_ids = ctx.ints("class_ids").unwrap_or_default();
    // One class id for every leaf weight: the trees score that class alone.
    let binary = class_ids
        .first()
        .filter(|first| width == 2 && class_ids.iter().all(|c| c == *first))
        .and_then(|&id| usize::try_from(id).ok())
        .filter(|&id| id < 2);
    let post = PostTransform::of(ctx)?;
    let mut classes = Vec::with_capacity(rows);
    for row in scores.chunks_exact_mut(width) {
        if let Some(scored) = binary {
            let positive = row[scored];
            row[1] = positive;
            row[0] = if matches!(post, PostTransform::None | PostTransform::Probit) {
                1.0 - positive
            } else {
                -positive
            };
        }
        post.apply(row);
        classes.push(argmax(row));
    }
    Ok(vec![
        labels.pick(&classes)?,
        HostTensor::f32(vec![rows, width], scores),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run_in};
    use super::*;

    fn run(op: &str, attributes: Vec<(&str, Attribute)>, x: &HostTensor) -> Vec<HostTensor> {
        run_in(DOMAIN, op, attributes, &[x]).unwrap()
    }

    fn x() -> HostTensor {
        f(&[2, 2], &[1.0, 2.0, -3.0, 0.5])
    }

    fn text(s: &str) -> Attribute {
        Attribute::String(s.into())
    }

    /// Expected values: onnx's ReferenceEvaluator (onnx 1.23) on the same attributes.
    #[test]
    fn svm_regressor_kernels_match_the_reference() {
        let attrs = |kernel: &str| {
            vec![
                ("coefficients", Attribute::Floats(vec![0.5, -1.0])),
                ("kernel_params", Attribute::Floats(vec![0.5, 1.0, 2.0])),
                ("kernel_type", text(kernel)),
                ("n_supports", Attribute::Int(2)),
                ("rho", Attribute::Floats(vec![0.25])),
                (
                    "support_vectors",
                    Attribute::Floats(vec![1.0, 0.0, 0.0, 1.0]),
                ),
            ]
        };
        assert_close(
            &run("SVMRegressor", attrs("POLY"), &x())[0],
            &[2, 1],
            &[-2.625, -1.1875],
        );
        let sigmoid = &run("SVMRegressor", attrs("SIGMOID"), &x())[0];
        assert_close(sigmoid, &[2, 1], &[-0.261_453_5, -0.829_342_25]);
    }

    #[test]
    fn a_one_row_linear_classifier_scores_both_classes() {
        let out = run(
            "LinearClassifier",
            vec![
                ("coefficients", Attribute::Floats(vec![1.0, -1.0])),
                ("intercepts", Attribute::Floats(vec![0.5])),
                ("classlabels_ints", Attribute::Ints(vec![0, 1])),
                ("post_transform", text("LOGISTIC")),
            ],
            &x(),
        );
        assert_eq!(out[0].to_i64_vec(), vec![0, 0]);
        let scores = [0.622_459_35, 0.377_540_68, 0.952_574_13, 0.047_425_87];
        assert_close(&out[1], &[2, 2], &scores);
    }

    #[test]
    fn legacy_trees_aggregate_by_min_and_send_nan_where_told() {
        // Two stumps on feature 0 (x <= 0: leaf 1, else leaf 2); the first sends NaN to its
        // true branch, the second (tracks_true 0) to its false one.
        let attrs = vec![
            ("nodes_treeids", Attribute::Ints(vec![0, 0, 0, 1, 1, 1])),
            ("nodes_nodeids", Attribute::Ints(vec![0, 1, 2, 0, 1, 2])),
            ("nodes_featureids", Attribute::Ints(vec![0; 6])),
            ("nodes_values", Attribute::Floats(vec![0.0; 6])),
            (
                "nodes_modes",
                Attribute::Strings(
                    ["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LEQ", "LEAF", "LEAF"]
                        .map(String::from)
                        .to_vec(),
                ),
            ),
            ("nodes_truenodeids", Attribute::Ints(vec![1, 0, 0, 1, 0, 0])),
            (
                "nodes_falsenodeids",
                Attribute::Ints(vec![2, 0, 0, 2, 0, 0]),
            ),
            (
                "nodes_missing_value_tracks_true",
                Attribute::Ints(vec![1, 0, 0, 0, 0, 0]),
            ),
            ("target_treeids", Attribute::Ints(vec![0, 0, 1, 1])),
            ("target_nodeids", Attribute::Ints(vec![1, 2, 1, 2])),
            ("target_ids", Attribute::Ints(vec![0; 4])),
            (
                "target_weights",
                Attribute::Floats(vec![1.0, 2.0, 3.0, -4.0]),
            ),
            ("aggregate_function", text("MIN")),
        ];
        let x = f(&[2, 1], &[-1.0, f32::NAN]);
        // Row 0: leaves 1.0 and 3.0; row 1: tree 0's true leaf 1.0, tree 1's false leaf -4.0.
        assert_close(
            &run("TreeEnsembleRegressor", attrs, &x)[0],
            &[2, 1],
            &[1.0, -4.0],
        );
    }

    #[test]
    fn legacy_trees_read_the_as_tensor_attributes_of_ml_opset_3() {
        let tensor = |values: Vec<f64>| {
            Attribute::Tensor(pipecut_ir::graph::TensorLiteral {
                dtype: pipecut_ir::graph::DType::F64,
                dims: vec![values.len() as u64],
                value: Some(pipecut_ir::graph::ConstValue::Floats(values)),
            })
        };
        let modes = ["BRANCH_LEQ", "LEAF", "LEAF"].map(String::from).to_vec();
        let attrs = vec![
            ("nodes_treeids", Attribute::Ints(vec![0, 0, 0])),
            ("nodes_nodeids", Attribute::Ints(vec![0, 1, 2])),
            ("nodes_featureids", Attribute::Ints(vec![1, 0, 0])),
            ("nodes_values_as_tensor", tensor(vec![1.0, 0.0, 0.0])),
            ("nodes_modes", Attribute::Strings(modes)),
            ("nodes_truenodeids", Attribute::Ints(vec![1, 0, 0])),
            ("nodes_falsenodeids", Attribute::Ints(vec![2, 0, 0])),
            ("target_treeids", Attribute::Ints(vec![0, 0])),
            ("target_nodeids", Attribute::Ints(vec![1, 2])),
            ("target_ids", Attribute::Ints(vec![0, 0])),
            ("target_weights_as_tensor", tensor(vec![-2.0, 3.0])),
            ("base_values_as_tensor", tensor(vec![0.5])),
        ];
        // x[1] = 2 > 1 goes false (3), x[1] = 0.5 goes true (-2); plus the base 0.5.
        let out = run("TreeEnsembleRegressor", attrs, &x());
        assert_close(&out[0], &[2, 1], &[3.5, -1.5]);
    }

    #[test]
    fn bad_attributes_are_errors_not_panics() {
        let err = run_in(
            DOMAIN,
            "LinearRegressor",
            vec![("coefficients", Attribute::Floats(vec![1.0, 2.0, 3.0]))],
            &[&x()],
        )
        .unwrap_err();
        assert!(err.contains("do not make rows of 2 features"), "{err}");
        let err = run_in(
            DOMAIN,
            "SVMClassifier",
            vec![
                ("classlabels_ints", Attribute::Ints(vec![0, 1, 2])),
                ("vectors_per_class", Attribute::Ints(vec![1, 1, 1])),
                ("coefficients", Attribute::Floats(vec![1.0; 5])),
                ("rho", Attribute::Floats(vec![0.0; 3])),
                ("support_vectors", Attribute::Floats(vec![0.0; 6])),
            ],
            &[&x()],
        )
        .unwrap_err();
        assert!(err.contains("5 coefficients for 3 classes"), "{err}");
    }
}
