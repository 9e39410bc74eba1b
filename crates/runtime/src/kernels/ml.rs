//! `ai.onnx.ml` kernels: LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor. The
//! semantics are the ONNX spec's, checked against its reference implementation
//! (`onnx/reference/ops/aionnxml`).

use std::collections::HashMap;

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::ml_predictors::PostTransform;
use crate::tensor::runtime_dtype;
use crate::tensor::{try_collect, HostTensor, TensorData};
use pipecut_ir::graph::{Attribute, ConstValue, DType};

const DOMAIN: &str = "ai.onnx.ml";

pub(super) fn register(t: &mut KernelTable) {
    t.add_in(DOMAIN, &["LabelEncoder"], label_encoder);
    t.add_in(DOMAIN, &["TreeEnsemble"], tree_ensemble);
    t.add_in(DOMAIN, &["Binarizer"], binarizer);
    t.add_in(DOMAIN, &["ArrayFeatureExtractor"], array_feature_extractor);
}

/// A list of LabelEncoder keys or values, from an attribute.
#[derive(Debug, Clone, PartialEq)]
enum Column {
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Texts(Vec<String>),
}

impl Column {
    /// The `<prefix>_int64s`, `<prefix>_floats`, `<prefix>_strings` or `<prefix>_tensor`
    /// attribute, the first present.
    fn from_attributes(ctx: &Ctx, prefix: &str) -> Result<Column, String> {
        let attr = |suffix: &str| ctx.attr(&format!("{prefix}_{suffix}"));
        match (
            attr("int64s"),
            attr("floats"),
            attr("strings"),
            attr("tensor"),
        ) {
            (Some(Attribute::Ints(v)), ..) => Ok(Column::Ints(v.clone())),
            (_, Some(Attribute::Floats(v)), ..) => Ok(Column::Floats(v.clone())),
            (_, _, Some(Attribute::Strings(v)), _) => Ok(Column::Texts(v.clone())),
            (.., Some(Attribute::Tensor(t))) => match (&t.value, t.dtype) {
                (Some(ConstValue::Strings(v)), _) => Ok(Column::Texts(v.clone())),
                (Some(value), dtype) if dtype.is_float() => Ok(Column::Floats(
                    value
                        .as_f64s()
                        .ok_or("a symbolic tensor")?
                        .into_iter()
                        .map(|x| x as f32)
                        .collect(),
                )),
                (Some(value), _) => Ok(Column::Ints(value.as_i64s().ok_or("a symbolic tensor")?)),
                (None, _) => Err(format!(
                    "{prefix}_tensor holds more than {} elements, which the loader does not keep",
                    pipecut_ir::graph::MAX_TRACKED_ELEMENTS
                )),
            },
            _ => Err(format!("no {prefix}_* attribute is given")),
        }
    }

    fn len(&self) -> usize {
        match self {
            Column::Ints(v) => v.len(),
            Column::Floats(v) => v.len(),
            Column::Texts(v) => v.len(),
        }
    }

    fn key(&self, i: usize) -> Key {
        match self {
            Column::Ints(v) => Key::Int(v[i]),
            Column::Floats(v) => Key::float(v[i]),
            Column::Texts(v) => Key::Text(v[i].clone()),
        }
    }
}

/// A hashable lookup key; floats by their bits, with every NaN one key and -0 equal to 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Int(i64),
    Float(u32),
    Text(String),
}

impl Key {
    fn float(x: f32) -> Key {
        let canonical = if x.is_nan() {
            f32::NAN
        } else if x == 0.0 {
            0.0
        } else {
            x
        };
        Key::Float(canonical.to_bits())
    }

    fn of_tensor(x: &HostTensor) -> Vec<Key> {
        match x.data() {
            TensorData::String(v) => v.iter().cloned().map(Key::Text).collect(),
            TensorData::F32(v) => v.iter().map(|&f| Key::float(f)).collect(),
            _ => x.to_i64_vec().into_iter().map(Key::Int).collect(),
        }
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LabelEncoder.html>: each element mapped
/// through `keys_* → values_*`, the default (`default_int64` -1, `default_float` -0.0,
/// `default_string` "_Unused", or `default_tensor`) where no key matches.
fn label_encoder(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let keys = Column::from_attributes(ctx, "keys")?;
    let values = Column::from_attributes(ctx, "values")?;
    if keys.len() != values.len() {
        return Err(format!("{} keys but {} values", keys.len(), values.len()));
    }
    let table: HashMap<Key, usize> = (0..keys.len()).rev().map(|i| (keys.key(i), i)).collect();
    let default_tensor = match ctx.attr("default_tensor") {
        Some(Attribute::Tensor(_)) => Some(Column::from_attributes(ctx, "default")?),
        _ => None,
    };
    let slots: Vec<Option<usize>> = Key::of_tensor(x)
        .into_iter()
        .map(|k| table.get(&k).copied())
        .collect();
    let n = slots.len();
    let data = match (&values, default_tensor) {
        (Column::Ints(v), default) => {
            let fallback = match default {
                Some(Column::Ints(d)) if !d.is_empty() => d[0],
                _ => ctx.int("default_int64", -1),
            };
            TensorData::I64(try_collect(
                n,
                slots.iter().map(|s| s.map_or(fallback, |i| v[i])),
            )?)
        }
        (Column::Floats(v), default) => {
            let fallback = match default {
                Some(Column::Floats(d)) if !d.is_empty() => d[0],
                _ => ctx.float("default_float", -0.0),
            };
            TensorData::F32(try_collect(
                n,
                slots.iter().map(|s| s.map_or(fallback, |i| v[i])),
            )?)
        }
        (Column::Texts(v), default) => {
            let fallback = match default {
                Some(Column::Texts(d)) if !d.is_empty() => d[0].clone(),
                _ => ctx.string("default_string", "_Unused"),
            };
            TensorData::String(try_collect(
                n,
                slots
                    .iter()
                    .map(|s| s.map_or_else(|| fallback.clone(), |i| v[i].clone())),
            )?)
        }
    };
    let out = HostTensor::new(x.shape().to_vec(), data)?;
    // values_tensor may be int32 (kept as int32) or a narrower type (kept as int64).
    match ctx.output_dtypes.first().copied().flatten() {
        Some(declared) if runtime_dtype(declared) != out.dtype() => {
            Ok(vec![out.cast(runtime_dtype(declared))?])
        }
        _ => Ok(vec![out]),
    }
}

/// A LabelEncoder from float keys to float values as a table to search: the distinct keys
/// ascending (−0 as 0, the first of equal keys winning, as in [`label_encoder`]'s map), their
/// values, what a NaN maps to and the default.
#[cfg(feature = "cuda")]
pub(crate) struct FloatLabels {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub nan: f32,
    pub default: f32,
}

/// The node's table when its keys and values are floats; `None` otherwise, or when the CPU
/// kernel would refuse the attributes (so its error is the one reported).
#[cfg(feature = "cuda")]
pub(crate) fn float_labels(ctx: &Ctx) -> Option<FloatLabels> {
    let keys = Column::from_attributes(ctx, "keys").ok()?;
    let values = Column::from_attributes(ctx, "values").ok()?;
    let (Column::Floats(keys), Column::Floats(values)) = (keys, values) else {
        return None;
    };
    if keys.len() != values.len() {
        return None;
    }
    let default = match ctx.attr("default_tensor") {
        Some(Attribute::Tensor(_)) => match Column::from_attributes(ctx, "default").ok()? {
            Column::Floats(d) if !d.is_empty() => d[0],
            _ => ctx.float("default_float", -0.0),
        },
        _ => ctx.float("default_float", -0.0),
    };
    let first: HashMap<Key, usize> = (0..keys.len())
        .rev()
        .map(|i| (Key::float(keys[i]), i))
        .collect();
    let mut nan = default;
    let mut table = Vec::with_capacity(first.len());
    for (key, i) in first {
        let Key::Float(bits) = key else { continue };
        match f32::from_bits(bits) {
            k if k.is_nan() => nan = values[i],
            k => table.push((k, values[i])),
        }
    }
    table.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(FloatLabels {
        keys: table.iter().map(|e| e.0).collect(),
        values: table.iter().map(|e| e.1).collect(),
        nan,
        default,
    })
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Binarizer.html>: 1 where `x > threshold`,
/// else 0, in the input's type.
fn binarizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let threshold = ctx.float("threshold", 0.0);
    let flags: Vec<f32> = x
        .to_f32_vec()
        .into_iter()
        .map(|v| if v > threshold { 1.0 } else { 0.0 })
        .collect();
    let out = HostTensor::f32(x.shape().to_vec(), flags);
    match x.dtype() {
        DType::F32 => Ok(vec![out]),
        DType::String | DType::Bool => Err(format!("Binarizer does not accept {}", x.dtype())),
        other => Ok(vec![out.cast(other)?]),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html>: the elements of
/// the last axis at the given indices, `[..., K]`; 1-D data gives `[1, K]`.
fn array_feature_extractor(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (data, indices) = (input(inputs, 0)?, input(inputs, 1)?);
    let (&features, leading) = data
        .shape()
        .split_last()
        .ok_or("the data must have at least one axis")?;
    let picked: Vec<usize> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < features)
                .ok_or_else(|| format!("index {i} is outside the last axis of size {features}"))
        })
        .collect::<Result<_, _>>()?;
    let rows = data.len().checked_div(features).unwrap_or(0);
    let total = rows
        .checked_mul(picked.len())
        .filter(|&n| n <= super::indexing::MAX_ELEMENTS)
        .ok_or("the output has more elements than fit in memory")?;
    let offsets = try_collect(
        total,
        (0..rows).flat_map(|r| picked.iter().map(move |&i| r * features + i)),
    )?;
    let shape = if leading.is_empty() {
        vec![1, picked.len()]
    } else {
        leading.iter().copied().chain([picked.len()]).collect()
    };
    Ok(vec![HostTensor::new(
        shape,
        super::indexing::take(data.data(), &offsets)?,
    )?])
}

/// A TreeEnsemble node's test (`nodes_modes`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Test {
    Leq(f32),
    Lt(f32),
    Gte(f32),
    Gt(f32),
    Eq(f32),
    Neq(f32),
    Member(Vec<f32>),
}

impl Test {
    fn passes(&self, x: f32) -> bool {
        match self {
            Test::Leq(s) => x <= *s,
            Test::Lt(s) => x < *s,
            Test::Gte(s) => x >= *s,
            Test::Gt(s) => x > *s,
            Test::Eq(s) => x == *s,
            Test::Neq(s) => x != *s,
            Test::Member(set) => set.contains(&x),
        }
    }
}

/// Where a branch goes: another node or a leaf, by index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Branch {
    Node(usize),
    Leaf(usize),
}

/// A decoded TreeEnsemble: the node tests and branches, the leaves, the roots (the CUDA
/// backend walks the same decoding on the device).
pub(crate) struct Forest {
    pub(crate) features: Vec<usize>,
    pub(crate) tests: Vec<Test>,
    /// Per node, whether a NaN feature takes the true branch (shorter lists mean false).
    pub(crate) missing_goes_true: Vec<bool>,
    pub(crate) true_branch: Vec<Branch>,
    pub(crate) false_branch: Vec<Branch>,
    pub(crate) leaf_weights: Vec<f32>,
    pub(crate) leaf_targets: Vec<usize>,
    pub(crate) roots: Vec<Branch>,
}

pub(super) fn float_list(ctx: &Ctx, name: &str) -> Result<Vec<f32>, String> {
    match ctx.attr(name) {
        Some(Attribute::Tensor(t)) => t
            .value
            .as_ref()
            .and_then(ConstValue::as_f64s)
            .map(|v| v.into_iter().map(|x| x as f32).collect())
            .ok_or_else(|| {
                format!(
                    "'{name}' holds more than {} elements, which the loader does not keep",
                    pipecut_ir::graph::MAX_TRACKED_ELEMENTS
                )
            }),
        Some(Attribute::Floats(v)) => Ok(v.clone()),
        _ => Err(format!("attribute '{name}' is missing")),
    }
}

fn index_list(ctx: &Ctx, name: &str) -> Result<Vec<usize>, String> {
    let values = match ctx.attr(name) {
        Some(Attribute::Tensor(_)) => float_list(ctx, name)?
            .into_iter()
            .map(|x| x as i64)
            .collect(),
        _ => ctx
            .ints(name)
            .ok_or_else(|| format!("attribute '{name}' is missing"))?,
    };
    values
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| format!("'{name}' holds {v}")))
        .collect()
}

impl Forest {
    pub(crate) fn new(ctx: &Ctx) -> Result<Forest, String> {
        let features = index_list(ctx, "nodes_featureids")?;
        let splits = float_list(ctx, "nodes_splits")?;
        let modes = index_list(ctx, "nodes_modes")?;
        let count = features.len();
        let list = |name: &str| -> Result<Vec<usize>, String> {
            let v = index_list(ctx, name)?;
            if v.len() == count {
                Ok(v)
            } else {
                Err(format!(
                    "'{name}' has {} entries for {count} nodes",
                    v.len()
                ))
            }
        };
        let branches = |ids: Vec<usize>, leafs: Vec<usize>| -> Vec<Branch> {
            ids.into_iter()
                .zip(leafs)
                .map(|(i, leaf)| {
                    if leaf != 0 {
                        Branch::Leaf(i)
                    } else {
                        Branch::Node(i)
                    }
                })
                .collect()
        };
        let (true_ids, true_leafs) = (list("nodes_truenodeids")?, list("nodes_trueleafs")?);
        let (false_ids, false_leafs) = (list("nodes_falsenodeids")?, list("nodes_falseleafs")?);
        // The roots whose both branches are the same leaf are that leaf (a one-leaf tree); the
        // reference takes the root's own index as the leaf's.
        let roots = index_list(ctx, "tree_roots")?
            .into_iter()
            .map(|r| {
                let degenerate = true_leafs.get(r).is_some_and(|&l| l != 0)
                    && false_leafs.get(r).is_some_and(|&l| l != 0)
                    && true_ids.get(r) == false_ids.get(r);
                if degenerate {
                    Branch::Leaf(r)
                } else {
                    Branch::Node(r)
                }
            })
            .collect();
        // Members of each BRANCH_MEMBER node, in node order, each set ended by a NaN.
        let mut members = match ctx.attr("membership_values") {
            Some(_) => float_list(ctx, "membership_values")?,
            None => Vec::new(),
        }
        .into_iter();
        let mut tests = Vec::with_capacity(count);
        for (i, &mode) in modes.iter().enumerate() {
            let split = *splits
                .get(i)
                .ok_or_else(|| format!("nodes_splits has no entry for node {i}"))?;
            tests.push(match mode {
                0 => Test::Leq(split),
                1 => Test::Lt(split),
                2 => Test::Gte(split),
                3 => Test::Gt(split),
                4 => Test::Eq(split),
                5 => Test::Neq(split),
                6 => Test::Member(members.by_ref().take_while(|m| !m.is_nan()).collect()),
                other => return Err(format!("node {i} has mode {other}, not 0 to 6")),
            });
        }
        if tests.len() != count {
            return Err(format!("{} nodes_modes for {count} nodes", tests.len()));
        }
        let missing_goes_true = match ctx.ints("nodes_missing_value_tracks_true") {
            Some(v) => v.into_iter().map(|t| t != 0).collect(),
            None => vec![false; count],
        };
        Ok(Forest {
            features,
            tests,
            missing_goes_true,
            true_branch: branches(true_ids, true_leafs),
            false_branch: branches(false_ids, false_leafs),
            leaf_weights: float_list(ctx, "leaf_weights")?,
            leaf_targets: index_list(ctx, "leaf_targetids")?,
            roots,
        })
    }

    /// The leaf `row` reaches from `root`: (weight, target). A walk longer than the node count
    /// has met a cycle.
    fn leaf(&self, root: Branch, row: &[f32]) -> Result<(f32, usize), String> {
        let mut at = root;
        for _ in 0..=self.tests.len() {
            let node = match at {
                Branch::Leaf(leaf) => {
                    return match (self.leaf_weights.get(leaf), self.leaf_targets.get(leaf)) {
                        (Some(&w), Some(&t)) => Ok((w, t)),
                        _ => Err(format!("leaf {leaf} does not exist")),
                    }
                }
                Branch::Node(node) => node,
            };
            let (test, feature) = self
                .tests
                .get(node)
                .zip(self.features.get(node))
                .ok_or_else(|| format!("node {node} does not exist"))?;
            let x = *row
                .get(*feature)
                .ok_or_else(|| format!("feature {feature} is outside a row of {}", row.len()))?;
            let missing = x.is_nan() && self.missing_goes_true.get(node) == Some(&true);
            at = if missing || test.passes(x) {
                self.true_branch[node]
            } else {
                self.false_branch[node]
            };
        }
        Err("the trees have a cycle".into())
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsemble.html>: every row walks every
/// tree to a leaf; the leaves' weights are aggregated per target (`aggregate_function`: 0
/// average, 1 sum, 2 min, 3 max), then `post_transform` (0 none, 1 softmax, 2 logistic, 3
/// softmax with zeros kept, 4 probit: the predictors' [`PostTransform`]) applies per row.
fn tree_ensemble(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let [rows, width] = *x.shape() else {
        return Err(format!("the input must be [N, F], not {:?}", x.shape()));
    };
    let targets = usize::try_from(ctx.int("n_targets", 0)).map_err(|_| "n_targets is negative")?;
    let forest = Forest::new(ctx)?;
    let transform = PostTransform::of_code(ctx.int("post_transform", 0))?;
    let aggregate = ctx.int("aggregate_function", 1);
    let start = match aggregate {
        0 | 1 => 0.0,
        2 => f32::MAX,
        3 => f32::MIN,
        other => return Err(format!("aggregate_function {other} is not 0 to 3")),
    };
    let values = x.to_f32_vec();
    let total = rows.checked_mul(targets).ok_or("the output is too large")?;
    let mut out = super::super::tensor::try_filled(total, start)?;
    let trees = forest.roots.len() as f32;
    for (row, scores) in values
        .chunks_exact(width.max(1))
        .zip(out.chunks_exact_mut(targets.max(1)))
        .take(rows)
    {
        for &root in &forest.roots {
            let (weight, target) = forest.leaf(root, row)?;
            let score = scores
                .get_mut(target)
                .ok_or_else(|| format!("leaf target {target} is not below n_targets {targets}"))?;
            *score = match aggregate {
                0 => *score + weight / trees,
                1 => *score + weight,
                2 => score.min(weight),
                _ => score.max(weight),
            };
        }
        transform.apply(scores);
    }
    let out = HostTensor::f32(vec![rows, targets], out);
    Ok(vec![out])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i};
    use super::*;
    use pipecut_ir::graph::TensorLiteral;

    fn run_ml(
        op: &str,
        attributes: Vec<(&str, Attribute)>,
        inputs: &[&HostTensor],
    ) -> Result<Vec<HostTensor>, String> {
        super::super::test_util::run_in(DOMAIN, op, attributes, inputs)
    }

    fn tensor(dtype: DType, value: ConstValue) -> Attribute {
        Attribute::Tensor(TensorLiteral {
            dtype,
            dims: vec![value.len() as u64],
            value: Some(value),
        })
    }

    #[test]
    fn label_encoder_maps_strings_with_a_default() {
        let x = HostTensor::new(
            vec![3],
            TensorData::String(vec!["a".into(), "c".into(), "z".into()]),
        )
        .unwrap();
        let out = run_ml(
            "LabelEncoder",
            vec![
                (
                    "keys_strings",
                    Attribute::Strings(vec!["a".into(), "c".into()]),
                ),
                ("values_int64s", Attribute::Ints(vec![5, 7])),
                ("default_int64", Attribute::Int(42)),
            ],
            &[&x],
        )
        .unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![5, 7, 42]);
        let out = run_ml(
            "LabelEncoder",
            vec![
                (
                    "keys_tensor",
                    tensor(DType::String, ConstValue::Strings(vec!["z".into()])),
                ),
                (
                    "values_tensor",
                    tensor(DType::F32, ConstValue::Floats(vec![0.5])),
                ),
            ],
            &[&x],
        )
        .unwrap();
        assert_close(&out[0], &[3], &[-0.0, -0.0, 0.5]);
    }

    #[test]
    fn binarizer_and_feature_extractor() {
        let out = run_ml(
            "Binarizer",
            vec![("threshold", Attribute::Float(1.0))],
            &[&f(&[3], &[0.5, 1.0, 1.5])],
        )
        .unwrap();
        assert_close(&out[0], &[3], &[0.0, 0.0, 1.0]);
        let data = f(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let out = run_ml("ArrayFeatureExtractor", vec![], &[&data, &i(&[2], &[2, 0])]).unwrap();
        assert_close(&out[0], &[2, 2], &[2.0, 0.0, 5.0, 3.0]);
        let err = run_ml("ArrayFeatureExtractor", vec![], &[&data, &i(&[1], &[3])]).unwrap_err();
        assert!(err.contains("outside the last axis"), "{err}");
    }

    #[test]
    fn tree_ensemble_walks_to_leaves_and_sums_per_target() {
        // onnx's test_ai_onnx_ml_tree_ensemble_single_tree (as float32, the first split 3.14 moved
        // to 3.0, which routes these rows alike).
        let attrs = vec![
            ("aggregate_function", Attribute::Int(1)),
            ("leaf_targetids", Attribute::Ints(vec![0, 1, 0, 1])),
            (
                "leaf_weights",
                tensor(
                    DType::F32,
                    ConstValue::Floats(vec![5.23, 12.12, -12.23, 7.21]),
                ),
            ),
            ("n_targets", Attribute::Int(2)),
            ("nodes_falseleafs", Attribute::Ints(vec![0, 1, 1])),
            ("nodes_falsenodeids", Attribute::Ints(vec![2, 2, 3])),
            ("nodes_featureids", Attribute::Ints(vec![0, 0, 0])),
            (
                "nodes_modes",
                tensor(DType::U8, ConstValue::Floats(vec![0.0, 0.0, 0.0])),
            ),
            (
                "nodes_splits",
                tensor(DType::F32, ConstValue::Floats(vec![3.0, 1.2, 4.2])),
            ),
            ("nodes_trueleafs", Attribute::Ints(vec![0, 1, 1])),
            ("nodes_truenodeids", Attribute::Ints(vec![1, 0, 1])),
            ("tree_roots", Attribute::Ints(vec![0])),
        ];
        let x = f(&[3, 2], &[1.2, 3.4, -0.12, 1.66, 4.14, 1.77]);
        let out = run_ml("TreeEnsemble", attrs, &[&x]).unwrap();
        assert_close(&out[0], &[3, 2], &[5.23, 0.0, 5.23, 0.0, 0.0, 12.12]);
    }
}
