//! What a shape rule sees of its node, and the helpers rules share (attributes, axes,
//! broadcasting, folding values).

use crate::graph::{Attribute, ConstValue, DType, Dim, Graph, Node, Shape, SymInt, ValueKind};
use crate::Error;

/// Type of one output as a rule infers it.
#[derive(Debug, Clone)]
pub(crate) struct Inferred {
    pub kind: ValueKind,
    pub dtype: DType,
    pub shape: Shape,
    /// False for a sequence or optional whose elements' shape (even rank) is not known; `shape`
    /// is then empty and meaningless.
    pub shape_known: bool,
    pub value: Option<ConstValue>,
}

impl Inferred {
    pub fn new(dtype: DType, shape: Shape) -> Inferred {
        Inferred {
            kind: ValueKind::Tensor,
            dtype,
            shape,
            shape_known: true,
            value: None,
        }
    }

    /// A value of any kind; `shape` is the elements' shape for a sequence or optional.
    pub fn of_kind(kind: ValueKind, dtype: DType, shape: Option<Shape>) -> Inferred {
        Inferred {
            kind,
            dtype,
            shape_known: shape.is_some(),
            shape: shape.unwrap_or_default(),
            value: None,
        }
    }

    /// The shape, if known.
    pub fn known_shape(&self) -> Option<&Shape> {
        self.shape_known.then_some(&self.shape)
    }

    pub fn with_value(mut self, value: Option<ConstValue>) -> Inferred {
        self.value = value;
        self
    }
}

/// A present input: its name, type and known value.
pub(crate) struct Input<'a> {
    pub kind: ValueKind,
    pub dtype: DType,
    /// For a sequence or optional: its elements' shape, empty when not known (see
    /// [`Input::known_shape`]).
    pub shape: &'a Shape,
    pub value: Option<&'a ConstValue>,
    pub name: &'a str,
}

impl<'a> Input<'a> {
    /// The shape, `None` for a sequence or optional whose elements' shape is not known.
    pub fn known_shape(&self) -> Option<&'a Shape> {
        (!std::ptr::eq(self.shape, &UNKNOWN_SHAPE)).then_some(self.shape)
    }
}

/// Stands for the shape of a sequence or optional whose elements' shape is not known.
static UNKNOWN_SHAPE: Shape = Vec::new();

/// Rule results: the outputs, or what is wrong in words (the driver adds node and op).
pub(crate) type RuleResult = Result<Vec<Inferred>, String>;

/// The node under inference.
pub(crate) struct OpCtx<'a> {
    pub node: &'a Node,
    /// The graph the node is in: subgraph rules read the tensors a body captures from it.
    pub graph: &'a Graph,
    pub opset: i64,
    inputs: Vec<Option<Input<'a>>>,
    output_names: Vec<Option<&'a str>>,
    infer_body: InferBody,
}

/// Shape inference over a subgraph body whose inputs are typed: the driver's own, handed to the
/// rules so that control flow types its bodies without the rules naming the driver.
pub(crate) type InferBody = fn(&mut Graph) -> Result<(), Error>;

impl<'a> OpCtx<'a> {
    pub fn new(graph: &'a Graph, node: &'a Node, opset: i64, infer_body: InferBody) -> OpCtx<'a> {
        let inputs = node
            .inputs
            .iter()
            .map(|slot| {
                slot.map(|id| {
                    let t = graph.tensor(id);
                    Input {
                        kind: t.kind,
                        dtype: t.dtype.expect("driver checks inputs are typed"),
                        shape: t.shape.as_ref().unwrap_or(&UNKNOWN_SHAPE),
                        value: t.value.as_ref(),
                        name: &t.name,
                    }
                })
            })
            .collect();
        let output_names = node
            .outputs
            .iter()
            .map(|o| o.map(|id| graph.tensor(id).name.as_str()))
            .collect();
        OpCtx {
            node,
            graph,
            opset,
            inputs,
            output_names,
            infer_body,
        }
    }

    /// Infers the types of `body`'s tensors, given its inputs' (control flow's subgraphs).
    pub fn infer_subgraph(&self, body: &mut Graph) -> Result<(), Error> {
        (self.infer_body)(body)
    }

    pub fn input_count(&self) -> usize {
        self.inputs.len()
    }

    pub fn input(&self, i: usize) -> Result<&Input<'a>, String> {
        self.opt_input(i)
            .ok_or_else(|| format!("required input {i} is missing"))
    }

    pub fn opt_input(&self, i: usize) -> Option<&Input<'a>> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    pub fn shape(&self, i: usize) -> Result<&'a Shape, String> {
        Ok(self.input(i)?.shape)
    }

    pub fn dtype(&self, i: usize) -> Result<DType, String> {
        Ok(self.input(i)?.dtype)
    }

    /// Number of output slots the node declares.
    pub fn output_count(&self) -> usize {
        self.output_names.len()
    }

    /// A fresh symbol for an output dim that depends on data (e.g. NonZero's count), named after
    /// the output tensor so that an error about it points at the right place.
    pub fn data_dependent_dim(&self, output: usize, axis: usize) -> Dim {
        let name = self
            .output_names
            .get(output)
            .copied()
            .flatten()
            .unwrap_or(&self.node.name);
        Dim::sym(&format!("{name}.{axis}"))
    }

    // ---- attributes ----

    pub fn attr(&self, name: &str) -> Option<&'a Attribute> {
        self.node.attributes.get(name)
    }

    pub fn int_attr(&self, name: &str) -> Result<Option<i64>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(Attribute::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(format!(
                "attribute '{name}' should be an int, found {other:?}"
            )),
        }
    }

    pub fn int_attr_or(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self.int_attr(name)?.unwrap_or(default))
    }

    pub fn ints_attr(&self, name: &str) -> Result<Option<&'a [i64]>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(Attribute::Ints(v)) => Ok(Some(v)),
            Some(other) => Err(format!(
                "attribute '{name}' should be a list of ints, found {other:?}"
            )),
        }
    }

    pub fn string_attr(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(Attribute::String(v)) => Ok(Some(v)),
            Some(other) => Err(format!(
                "attribute '{name}' should be a string, found {other:?}"
            )),
        }
    }

    // ---- values ----

    /// The concrete integer contents of input `i`, if known.
    pub fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
        self.opt_input(i)?.value?.as_i64s()
    }

    /// The integer contents of input `i`, possibly symbolic.
    pub fn sym_ints(&self, i: usize) -> Option<&'a [SymInt]> {
        match self.opt_input(i)?.value? {
            ConstValue::Ints(v) => Some(v),
            ConstValue::Floats(_) | ConstValue::Strings(_) => None,
        }
    }

    /// Integers given either as attribute `attr` (older opsets) or as input `input` (newer
    /// opsets); `Ok(None)` when neither is present. An input whose value is not known at plan
    /// time is an error, since the output shape depends on it.
    pub fn ints_from_attr_or_input(
        &self,
        attr: &str,
        input: usize,
    ) -> Result<Option<Vec<i64>>, String> {
        if let Some(v) = self.ints_attr(attr)? {
            return Ok(Some(v.to_vec()));
        }
        match self.opt_input(input) {
            None => Ok(None),
            Some(_) => self
                .const_ints(input)
                .map(Some)
                .ok_or_else(|| format!("'{attr}' (input {input}) is computed at run time; its value must be known to infer the shape")),
        }
    }
}

/// Normalises a possibly negative axis for a tensor of rank `rank`.
pub(crate) fn normalize_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Numpy-style multidirectional broadcasting of several shapes.
pub(crate) fn broadcast(shapes: &[&Shape], ctx: &OpCtx, output: usize) -> Result<Shape, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for axis in 0..rank {
        let mut result: Option<Dim> = None;
        for shape in shapes {
            let offset = rank - shape.len();
            if axis < offset {
                continue;
            }
            let dim = &shape[axis - offset];
            result = Some(match (result, dim) {
                (None, d) => d.clone(),
                (Some(Dim::Known(1)), d) => d.clone(),
                (Some(r), Dim::Known(1)) => r,
                (Some(r), d) if &r == d => r,
                (Some(Dim::Known(a)), Dim::Known(b)) => {
                    return Err(format!(
                        "shapes {} cannot be broadcast: {a} vs {b} at axis {axis}",
                        shapes
                            .iter()
                            .map(|s| crate::graph::format_shape(s))
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ))
                }
                // A symbol against a concrete size > 1: the symbol must be 1 or that size; either
                // way the result is the concrete size.
                (Some(Dim::Sym(_)), Dim::Known(b)) => Dim::Known(*b),
                (Some(Dim::Known(a)), Dim::Sym(_)) => Dim::Known(a),
                // Two different symbols: the result depends on their values.
                (Some(Dim::Sym(_)), Dim::Sym(_)) => ctx.data_dependent_dim(output, axis),
            });
        }
        out.push(result.unwrap_or(Dim::Known(1)));
    }
    Ok(out)
}

/// Concrete dims of a shape, if all are known.
pub(crate) fn concrete(shape: &[Dim]) -> Option<Vec<u64>> {
    shape.iter().map(Dim::known).collect()
}

/// Maps each element index of `out_shape` to the element index of a broadcast input.
fn broadcast_index(out_shape: &[u64], in_shape: &[u64], flat: usize) -> usize {
    let offset = out_shape.len() - in_shape.len();
    let mut rem = flat;
    let mut index = 0usize;
    let mut stride = 1usize;
    for axis in (0..out_shape.len()).rev() {
        let coord = rem % out_shape[axis] as usize;
        rem /= out_shape[axis] as usize;
        if axis >= offset {
            let d = in_shape[axis - offset] as usize;
            if d != 1 {
                index += coord * stride;
            }
            stride *= d;
        }
    }
    index
}

/// Folds an elementwise op over broadcast input values. `f` returns `None` where the element
/// cannot be computed (e.g. a symbolic operand), which drops the whole value.
pub(crate) fn fold_broadcast<T: Clone, U>(
    inputs: &[(&Shape, &[T])],
    out_shape: &Shape,
    f: impl Fn(&[&T]) -> Option<U>,
) -> Option<Vec<U>> {
    let out = concrete(out_shape)?;
    let count: u64 = out.iter().product();
    if count > crate::graph::MAX_TRACKED_ELEMENTS {
        return None;
    }
    let shapes: Vec<Vec<u64>> = inputs
        .iter()
        .map(|(s, _)| concrete(s))
        .collect::<Option<_>>()?;
    (0..count as usize)
        .map(|flat| {
            let args: Vec<&T> = inputs
                .iter()
                .zip(&shapes)
                .map(|((_, vals), shape)| vals.get(broadcast_index(&out, shape, flat)))
                .collect::<Option<_>>()?;
            f(&args)
        })
        .collect()
}

/// Row-major strides of a concrete shape.
pub(crate) fn strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Gathers elements of a value in row-major order over `out_shape`, where `source(coords)`
/// returns the flat source index of an output coordinate.
pub(crate) fn gather_value(
    value: &ConstValue,
    out_shape: &[u64],
    source: impl Fn(&[u64]) -> Option<usize>,
) -> Option<ConstValue> {
    let count: u64 = out_shape.iter().product();
    if count > crate::graph::MAX_TRACKED_ELEMENTS {
        return None;
    }
    let mut coords = vec![0u64; out_shape.len()];
    let mut indices = Vec::with_capacity(count as usize);
    for flat in 0..count {
        let mut rem = flat;
        for axis in (0..out_shape.len()).rev() {
            coords[axis] = rem % out_shape[axis];
            rem /= out_shape[axis];
        }
        indices.push(source(&coords)?);
    }
    Some(match value {
        ConstValue::Ints(v) => ConstValue::Ints(
            indices
                .iter()
                .map(|&i| v.get(i).cloned())
                .collect::<Option<_>>()?,
        ),
        ConstValue::Floats(v) => ConstValue::Floats(
            indices
                .iter()
                .map(|&i| v.get(i).copied())
                .collect::<Option<_>>()?,
        ),
        ConstValue::Strings(v) => ConstValue::Strings(
            indices
                .iter()
                .map(|&i| v.get(i).cloned())
                .collect::<Option<_>>()?,
        ),
    })
}

/// A one-output result with the input's shape and the given dtype.
pub(crate) fn same_shape(ctx: &OpCtx, dtype: DType) -> RuleResult {
    Ok(vec![Inferred::new(dtype, ctx.shape(0)?.clone())])
}
