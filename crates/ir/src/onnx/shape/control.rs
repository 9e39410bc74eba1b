//! Control flow (`If`, `Loop`, `Scan`, `SequenceMap`): each stays one node of the graph, and its
//! outputs are typed by inferring its subgraphs, given the types of the node's inputs and of the
//! outer tensors the subgraphs read (<https://onnx.ai/onnx/operators/onnx__If.html>, `Loop`,
//! `Scan`, `SequenceMap`). A body output the model declares no type for is typed so too.

use super::context::{normalize_axis, Inferred, OpCtx, RuleResult};
use super::declared;
use super::registry::Registry;
use super::sequence::merge_shapes;
use crate::graph::{ConstValue, DType, Dim, Graph, Shape, Subgraph, SymInt, ValueKind};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["If"], if_);
    r.add("", &["Loop"], loop_);
    r.add("", &["Scan"], scan);
    r.add("", &["SequenceMap"], sequence_map);
}

use declared::subgraph;

/// The type given to one of a body's declared inputs.
#[derive(Debug, Clone, PartialEq)]
struct Formal {
    kind: ValueKind,
    dtype: DType,
    shape: Option<Shape>,
    value: Option<ConstValue>,
}

impl Formal {
    fn tensor(dtype: DType, shape: Shape, value: Option<ConstValue>) -> Formal {
        Formal {
            kind: ValueKind::Tensor,
            dtype,
            shape: Some(shape),
            value,
        }
    }

    fn inferred(&self) -> Inferred {
        Inferred::of_kind(self.kind, self.dtype, self.shape.clone()).with_value(self.value.clone())
    }
}

/// A node's subgraphs as its rule typed them, by attribute name.
type Bodies = Vec<(&'static str, Graph)>;

/// Infers a body given its declared inputs' types; the inputs after them (the outer tensors it
/// reads) take the types they have in the node's graph. Gives the body outputs' types and the
/// typed body.
fn infer_body(
    ctx: &OpCtx,
    sub: &Subgraph,
    formals: &[Formal],
) -> Result<(Vec<Inferred>, Graph), String> {
    if formals.len() != sub.formal_inputs {
        return Err(format!(
            "subgraph '{}' declares {} inputs, the node gives it {}",
            sub.name,
            sub.formal_inputs,
            formals.len()
        ));
    }
    let mut body: Graph = (*sub.body).clone();
    for (i, id) in body.inputs().to_vec().into_iter().enumerate() {
        let tensor = body.tensor_mut(id);
        if let Some(formal) = formals.get(i) {
            tensor.kind = formal.kind;
            tensor.dtype = Some(formal.dtype);
            tensor.shape = formal.shape.clone();
            tensor.value = formal.value.clone();
            continue;
        }
        let outer = ctx
            .graph
            .tensor_id(&tensor.name)
            .map(|o| ctx.graph.tensor(o))
            .ok_or_else(|| {
                format!(
                    "subgraph '{}' reads '{}', which no enclosing graph defines",
                    sub.name, tensor.name
                )
            })?;
        tensor.kind = outer.kind;
        tensor.dtype = outer.dtype;
        tensor.shape = outer.shape.clone();
        tensor.value = outer.value.clone();
    }
    ctx.infer_subgraph(&mut body)
        .map_err(|e| format!("in subgraph '{}': {e}", sub.name))?;
    let outputs = body
        .outputs()
        .iter()
        .map(|&id| {
            let t = body.tensor(id);
            let dtype = t.dtype.ok_or_else(|| {
                format!("subgraph output '{}' has no inferred element type", t.name)
            })?;
            Ok(Inferred::of_kind(t.kind, dtype, t.shape.clone()).with_value(t.value.clone()))
        })
        .collect::<Result<_, String>>()?;
    Ok((outputs, body))
}

/// The subgraphs of a control-flow node typed for its inputs (for costing and running them);
/// none where the bodies cannot be inferred and the rule fell back to the declared types.
pub(super) fn typed_bodies(ctx: &OpCtx) -> Bodies {
    let typed = match ctx.node.op_type.as_str() {
        "If" => if_typed(ctx),
        "Loop" => loop_typed(ctx),
        "Scan" => scan_typed(ctx),
        "SequenceMap" => sequence_map_typed(ctx),
        _ => return Vec::new(),
    };
    typed.map(|(_, bodies)| bodies).unwrap_or_default()
}

/// Where the bodies cannot be inferred (an op inside without a shape rule), the outputs the
/// model declares for them, if it declares them all; else the inference's error.
fn or_declared(
    inferred: Result<(Vec<Inferred>, Bodies), String>,
    declared: impl FnOnce() -> RuleResult,
) -> RuleResult {
    match inferred {
        Ok((outputs, _)) => Ok(outputs),
        Err(error) => declared().map_err(|_| error),
    }
}

fn if_(ctx: &OpCtx) -> RuleResult {
    or_declared(if_typed(ctx), || declared::if_declared(ctx))
}

fn loop_(ctx: &OpCtx) -> RuleResult {
    or_declared(loop_typed(ctx), || declared::loop_declared(ctx))
}

fn scan(ctx: &OpCtx) -> RuleResult {
    or_declared(scan_typed(ctx), || declared::scan_declared(ctx))
}

fn sequence_map(ctx: &OpCtx) -> RuleResult {
    Ok(sequence_map_typed(ctx)?.0)
}

/// The single integer or boolean a value holds, if known.
fn scalar(value: Option<&ConstValue>) -> Option<i64> {
    match value?.as_i64s()?.as_slice() {
        [v] => Some(*v),
        _ => None,
    }
}

/// Two types a node output may have (the branches of an If): equal kinds and dtypes; dims
/// they disagree on depend on the run. Branches of different ranks (silero-vad's `op15`
/// export, whose branches agree only once its dims are bound) give a tensor of unknown rank:
/// `inspect` lists what follows it as not inferred, and the commands that need sizes say which
/// tensor has none, instead of the If failing the whole model.
fn merge(ctx: &OpCtx, output: usize, a: &Inferred, b: &Inferred) -> Result<Inferred, String> {
    if a.kind != b.kind || a.dtype != b.dtype {
        return Err(format!(
            "the branches give output {output} different types: {} of {} and {} of {}",
            a.kind, a.dtype, b.kind, b.dtype
        ));
    }
    let shape = merge_shapes(ctx, output, a.known_shape(), b.known_shape());
    Ok(Inferred::of_kind(a.kind, a.dtype, shape))
}

/// If: the branch the condition picks when it is known at plan time, else both merged.
fn if_typed(ctx: &OpCtx) -> Result<(Vec<Inferred>, Bodies), String> {
    let (then, other) = (subgraph(ctx, "then_branch")?, subgraph(ctx, "else_branch")?);
    match scalar(ctx.input(0)?.value) {
        Some(0) => {
            let (outputs, body) = infer_body(ctx, other, &[])?;
            Ok((outputs, vec![("else_branch", body)]))
        }
        Some(_) => {
            let (outputs, body) = infer_body(ctx, then, &[])?;
            Ok((outputs, vec![("then_branch", body)]))
        }
        None => {
            let (a, then_body) = infer_body(ctx, then, &[])?;
            let (b, else_body) = infer_body(ctx, other, &[])?;
            if a.len() != b.len() {
                return Err(format!(
                    "the branches have {} and {} outputs",
                    a.len(),
                    b.len()
                ));
            }
            let outputs = a
                .iter()
                .zip(&b)
                .enumerate()
                .map(|(i, (x, y))| merge(ctx, i, x, y))
                .collect::<Result<_, String>>()?;
            Ok((
                outputs,
                vec![("then_branch", then_body), ("else_branch", else_body)],
            ))
        }
    }
}

/// Rounds of re-inferring a Loop body with the carried types widened by the previous round; a
/// carried dim that changes becomes a symbol in the first round, so two suffice in practice.
const LOOP_ROUNDS: usize = 4;

/// Loop: body inputs are (iteration, cond, carried…), outputs (cond, carried…, scan…); node
/// outputs are (carried…, scan…). Carried types are inferred to a fixed point: a dim the body
/// changes is a symbol. Scan outputs gain a leading axis of the iteration count, known when the
/// trip count is and the condition provably stays true (absent, or true and kept true by the
/// body).
fn loop_typed(ctx: &OpCtx) -> Result<(Vec<Inferred>, Bodies), String> {
    if let Some(unrolled) = unrolled_loop(ctx)? {
        return Ok(unrolled);
    }
    let body = subgraph(ctx, "body")?;
    let trip_count = ctx.opt_input(0).and_then(|m| scalar(m.value));
    let cond = ctx.opt_input(1);
    let mut carried: Vec<Formal> = (2..ctx.input_count())
        .map(|i| {
            let input = ctx.input(i)?;
            Ok(Formal {
                kind: input.kind,
                dtype: input.dtype,
                shape: input.known_shape().cloned(),
                value: None,
            })
        })
        .collect::<Result<_, String>>()?;
    // With a condition known true, the body sees `cond = true`; if it then provably returns
    // true, every iteration does.
    let mut assume_true = cond.is_some_and(|c| scalar(c.value).is_some_and(|v| v != 0));
    let mut stays_true = cond.is_none();
    let mut outputs = Vec::new();
    let mut typed = None;
    for _ in 0..LOOP_ROUNDS {
        let cond_value = assume_true.then(|| ConstValue::Ints(vec![SymInt::Lit(1)]));
        let mut formals = vec![
            Formal::tensor(DType::I64, vec![], None),
            Formal::tensor(DType::Bool, vec![], cond_value),
        ];
        formals.extend(carried.iter().cloned());
        let (inferred, graph) = infer_body(ctx, body, &formals)?;
        outputs = inferred;
        typed = Some(graph);
        let keeps_true = outputs.first().and_then(|c| scalar(c.value.as_ref())) == Some(1);
        if assume_true && !keeps_true {
            assume_true = false;
            continue;
        }
        stays_true |= assume_true;
        let mut changed = false;
        for (k, formal) in carried.iter_mut().enumerate() {
            let out = outputs
                .get(1 + k)
                .ok_or_else(|| format!("the body has no output for carried value {k}"))?;
            let widened = Formal {
                kind: out.kind,
                dtype: formal.dtype,
                shape: merge_shapes(ctx, k, formal.shape.as_ref(), out.known_shape()),
                value: None,
            };
            if widened != *formal {
                *formal = widened;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let iterations = match trip_count {
        Some(m) if stays_true => Some(Dim::Known(m.max(0) as u64)),
        _ => None,
    };
    let mut result: Vec<Inferred> = carried.iter().map(Formal::inferred).collect();
    for (j, out) in outputs.iter().enumerate().skip(1 + carried.len()) {
        let position = j - 1;
        let mut shape = out
            .known_shape()
            .cloned()
            .ok_or_else(|| format!("the shape of scan output {position} is not known"))?;
        shape.insert(
            0,
            iterations
                .clone()
                .unwrap_or_else(|| ctx.data_dependent_dim(position, 0)),
        );
        result.push(Inferred::new(out.dtype, shape));
    }
    Ok((result, typed.map(|g| ("body", g)).into_iter().collect()))
}

/// Most iterations a Loop is inferred one by one for (see [`unrolled_loop`]).
const MAX_UNROLLED: i64 = 64;

/// A Loop of a few iterations known at plan time (trip count known, condition absent or known
/// at every step) inferred iteration by iteration, with the iteration number and the carried
/// values' contents known: exact where a body slices by the iteration number or grows a
/// sequence. `None` where that does not apply, or the body cannot be inferred so.
fn unrolled_loop(ctx: &OpCtx) -> Result<Option<(Vec<Inferred>, Bodies)>, String> {
    let body = subgraph(ctx, "body")?;
    let Some(trip_count) = ctx.opt_input(0).and_then(|m| scalar(m.value)) else {
        return Ok(None);
    };
    let cond_given = ctx.opt_input(1).is_some();
    let mut cond = match ctx.opt_input(1) {
        Some(c) => match scalar(c.value) {
            Some(v) => v != 0,
            None => return Ok(None),
        },
        None => true,
    };
    if !(1..=MAX_UNROLLED).contains(&trip_count) || !cond {
        return Ok(None);
    }
    let mut carried: Vec<Formal> = (2..ctx.input_count())
        .map(|i| {
            let input = ctx.input(i)?;
            Ok(Formal {
                kind: input.kind,
                dtype: input.dtype,
                shape: input.known_shape().cloned(),
                value: input.value.cloned(),
            })
        })
        .collect::<Result<_, String>>()?;
    let mut scans: Vec<Inferred> = Vec::new();
    let mut typed = None;
    let mut iterations = 0u64;
    while cond && (iterations as i64) < trip_count {
        let mut formals = vec![
            Formal::tensor(
                DType::I64,
                vec![],
                Some(ConstValue::Ints(vec![SymInt::Lit(iterations as i64)])),
            ),
            Formal::tensor(
                DType::Bool,
                vec![],
                Some(ConstValue::Ints(vec![SymInt::Lit(1)])),
            ),
        ];
        formals.extend(carried.iter().cloned());
        let Ok((outputs, graph)) = infer_body(ctx, body, &formals) else {
            return Ok(None);
        };
        if cond_given {
            match outputs.first().and_then(|c| scalar(c.value.as_ref())) {
                Some(v) => cond = v != 0,
                None => return Ok(None),
            }
        }
        for (k, formal) in carried.iter_mut().enumerate() {
            let out = outputs
                .get(1 + k)
                .ok_or_else(|| format!("the body has no output for carried value {k}"))?;
            *formal = Formal {
                kind: out.kind,
                dtype: out.dtype,
                shape: out.known_shape().cloned(),
                value: out.value.clone(),
            };
        }
        let step_scans = &outputs[(1 + carried.len()).min(outputs.len())..];
        scans = if scans.is_empty() {
            step_scans.to_vec()
        } else {
            scans
                .iter()
                .zip(step_scans)
                .enumerate()
                .map(|(j, (a, b))| merge(ctx, carried.len() + j, a, b))
                .collect::<Result<_, String>>()?
        };
        typed = Some(graph);
        iterations += 1;
    }
    let mut result: Vec<Inferred> = carried.iter().map(Formal::inferred).collect();
    for (j, out) in scans.into_iter().enumerate() {
        let mut shape = out
            .known_shape()
            .cloned()
            .ok_or_else(|| format!("the shape of scan output {j} is not known"))?;
        shape.insert(0, Dim::Known(iterations));
        result.push(Inferred::new(out.dtype, shape));
    }
    Ok(Some((
        result,
        typed.map(|g| ("body", g)).into_iter().collect(),
    )))
}

/// Scan: the body sees the states and one slice of each scanned input (its scan axis
/// removed); scan outputs stack the body's along their scan output axis, as many as the first
/// scanned input's scan axis is long. Scan-8 (opsets 8) has an optional `sequence_lens` input
/// first and a batch axis 0 on every input and output, which the body does not see.
fn scan_typed(ctx: &OpCtx) -> Result<(Vec<Inferred>, Bodies), String> {
    let body = subgraph(ctx, "body")?;
    let declared::ScanLayout {
        scan_inputs,
        batched,
        first_state,
        states,
    } = declared::ScanLayout::of(ctx)?;
    let input_axes = ctx.ints_attr("scan_input_axes")?.unwrap_or(&[]);
    let output_axes = ctx.ints_attr("scan_output_axes")?.unwrap_or(&[]);
    let mut formals = Vec::new();
    let mut batch = None;
    for i in first_state..first_state + states {
        let mut shape = ctx.shape(i)?.clone();
        if batched && !shape.is_empty() {
            batch = Some(shape.remove(0));
        }
        formals.push(Formal::tensor(ctx.dtype(i)?, shape, None));
    }
    let mut length = None;
    for j in 0..scan_inputs {
        let i = first_state + states + j;
        let mut shape = ctx.shape(i)?.clone();
        if batched && !shape.is_empty() {
            batch = Some(shape.remove(0));
        }
        let axis = normalize_axis(input_axes.get(j).copied().unwrap_or(0), shape.len())?;
        let scanned = shape.remove(axis);
        length.get_or_insert(scanned);
        formals.push(Formal::tensor(ctx.dtype(i)?, shape, None));
    }
    let (outputs, typed) = infer_body(ctx, body, &formals)?;
    let outputs = outputs
        .into_iter()
        .enumerate()
        .map(|(i, out)| {
            let mut shape = out
                .known_shape()
                .cloned()
                .ok_or_else(|| format!("the shape of body output {i} is not known"))?;
            if i >= states {
                let axis = output_axes.get(i - states).copied().unwrap_or(0);
                let axis = normalize_axis(axis, shape.len() + 1)?;
                let dim = length
                    .clone()
                    .unwrap_or_else(|| ctx.data_dependent_dim(i, axis));
                shape.insert(axis, dim);
            }
            if batched {
                let dim = batch
                    .clone()
                    .unwrap_or_else(|| ctx.data_dependent_dim(i, 0));
                shape.insert(0, dim);
            }
            let value = if i < states { out.value } else { None };
            Ok(Inferred::new(out.dtype, shape).with_value(value))
        })
        .collect::<Result<_, String>>()?;
    Ok((outputs, vec![("body", typed)]))
}

/// SequenceMap: the body runs once per element of the first (sequence) input, seeing one
/// element of each sequence input and the whole of each tensor input; every output is a
/// sequence of the body's outputs.
fn sequence_map_typed(ctx: &OpCtx) -> Result<(Vec<Inferred>, Bodies), String> {
    let body = subgraph(ctx, "body")?;
    let formals: Vec<Formal> = (0..ctx.input_count())
        .map(|i| {
            let input = ctx.input(i)?;
            let shape = input.known_shape().cloned().ok_or_else(|| {
                format!("the shape of the elements of '{}' is not known", input.name)
            })?;
            let value = input.value.cloned().filter(|_| input.kind.is_tensor());
            Ok(Formal::tensor(input.dtype, shape, value))
        })
        .collect::<Result<_, String>>()?;
    if ctx.input(0)?.kind != ValueKind::Sequence {
        return Err("input 0 of SequenceMap must be a sequence".into());
    }
    let (outputs, typed) = infer_body(ctx, body, &formals)?;
    let outputs = outputs
        .into_iter()
        .map(|out| {
            let shape = out.known_shape().cloned();
            Inferred::of_kind(ValueKind::Sequence, out.dtype, shape)
        })
        .collect();
    Ok((outputs, vec![("body", typed)]))
}
