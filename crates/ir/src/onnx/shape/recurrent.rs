//! Shape rules of the recurrent layers RNN, GRU and LSTM (opsets 7–22): `Y` is
//! `[seq, directions, batch, hidden]` (`layout` 0) or `[batch, seq, directions, hidden]`
//! (`layout` 1), `Y_h` (and LSTM's `Y_c`) `[directions, batch, hidden]` or
//! `[batch, directions, hidden]`.

use super::context::{Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::Dim;

pub(super) fn register(r: &mut Registry) {
    r.add("", &["RNN", "GRU", "LSTM"], recurrent);
    // onnxruntime's quantize_dynamic writes every LSTM as this, with int8 weights (`[D, I,
    // 4H]`, transposed) and their scales: the same outputs.
    r.add("com.microsoft", &["DynamicQuantizeLSTM"], recurrent);
}

fn recurrent(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if x.len() != 3 {
        return Err(format!("X has rank {}, expected 3", x.len()));
    }
    let batch_first = ctx.int_attr_or("layout", 0)? != 0;
    let (seq, batch) = if batch_first {
        (x[1].clone(), x[0].clone())
    } else {
        (x[0].clone(), x[1].clone())
    };
    let directions = match ctx.string_attr("direction")?.unwrap_or("forward") {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        other => return Err(format!("unknown direction '{other}'")),
    };
    let hidden = match ctx.int_attr("hidden_size")? {
        Some(h) if h > 0 => Dim::Known(h as u64),
        Some(h) => return Err(format!("hidden_size is {h}")),
        // R is [directions, gates · hidden, hidden] (DynamicQuantizeLSTM requires hidden_size).
        None => ctx
            .shape(2)?
            .get(2)
            .cloned()
            .ok_or("R must be 3-D to give the hidden size")?,
    };
    let dirs = Dim::Known(directions);
    let dtype = ctx.dtype(0)?;
    let y = if batch_first {
        vec![batch.clone(), seq, dirs.clone(), hidden.clone()]
    } else {
        vec![seq, dirs.clone(), batch.clone(), hidden.clone()]
    };
    let state = if batch_first {
        vec![batch, dirs, hidden]
    } else {
        vec![dirs, batch, hidden]
    };
    let states = if ctx.node.op_type.ends_with("LSTM") {
        2
    } else {
        1
    };
    let mut out = vec![Inferred::new(dtype, y)];
    for _ in 0..states {
        out.push(Inferred::new(dtype, state.clone()));
    }
    out.truncate(ctx.output_count().max(1));
    Ok(out)
}
