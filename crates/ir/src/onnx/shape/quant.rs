//! Shape rules of the quantized linear-algebra ops that take their operands with scales and
//! zero points: QLinearMatMul (<https://onnx.ai/onnx/operators/onnx__QLinearMatMul.html>,
//! opsets 10–21) and QLinearConv (<https://onnx.ai/onnx/operators/onnx__QLinearConv.html>,
//! opset 10). Operands are inputs 0 and 3; the output takes the output zero point's type
//! (input 7), as the spec says. Also onnxruntime's com.microsoft MatMulNBits
//! (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MatMulNBits>):
//! `A [..., K]` times packed low-bit weights of `N` columns gives `[..., N]` in A's type.

use super::context::{Inferred, OpCtx, RuleResult};
use super::linalg::matmul_shape;
use super::nn::conv_shape;
use super::registry::Registry;

pub(super) fn register(r: &mut Registry) {
    r.add("", &["QLinearMatMul"], qlinear_matmul);
    r.add("", &["QLinearConv"], qlinear_conv);
    r.add("com.microsoft", &["MatMulNBits"], matmul_nbits);
}

fn matmul_nbits(ctx: &OpCtx) -> RuleResult {
    let a = ctx.shape(0)?;
    let n = u64::try_from(ctx.int_attr_or("N", -1)?).map_err(|_| "attribute N is required")?;
    let k = u64::try_from(ctx.int_attr_or("K", -1)?).map_err(|_| "attribute K is required")?;
    let Some(last) = a.last() else {
        return Err("A must have rank >= 1".into());
    };
    if let Some(a_k) = last.known() {
        if a_k != k {
            return Err(format!("A has {a_k} features but K is {k}"));
        }
    }
    let mut shape = a.clone();
    *shape.last_mut().expect("rank >= 1") = crate::graph::Dim::Known(n);
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

fn qlinear_matmul(ctx: &OpCtx) -> RuleResult {
    let shape = matmul_shape(ctx, ctx.shape(0)?, ctx.shape(3)?)?;
    Ok(vec![Inferred::new(ctx.dtype(7)?, shape)])
}

fn qlinear_conv(ctx: &OpCtx) -> RuleResult {
    let shape = conv_shape(ctx, ctx.shape(0)?, ctx.shape(3)?)?;
    Ok(vec![Inferred::new(ctx.dtype(7)?, shape)])
}

#[cfg(test)]
mod tests {
    use crate::graph::{Attribute, DType, Dim, Graph, NodeSpec};
    use crate::onnx::shape::{DimBindings, ShapeInference};

    #[test]
    fn qlinear_ops_take_operands_3_and_the_output_zero_point_type() {
        let mut b = Graph::builder("q");
        let f = |d: &[u64]| Some(d.iter().map(|&v| Dim::Known(v)).collect());
        b.input("x", Some(DType::U8), f(&[1, 2, 5, 5])).unwrap();
        b.input("a", Some(DType::U8), f(&[3, 4])).unwrap();
        b.input("bm", Some(DType::U8), f(&[4, 6])).unwrap();
        b.input("w", Some(DType::U8), f(&[7, 2, 3, 3])).unwrap();
        b.input("s", Some(DType::F32), f(&[])).unwrap();
        b.input("zu", Some(DType::U8), f(&[])).unwrap();
        b.input("zi", Some(DType::I8), f(&[])).unwrap();
        b.node(NodeSpec::new(
            "mm",
            "QLinearMatMul",
            &["a", "s", "zu", "bm", "s", "zu", "s", "zi"],
            &["y"],
        ))
        .unwrap();
        b.node(
            NodeSpec::new(
                "cv",
                "QLinearConv",
                &["x", "s", "zu", "w", "s", "zu", "s", "zu"],
                &["z"],
            )
            .attr("pads", Attribute::Ints(vec![1, 1, 1, 1])),
        )
        .unwrap();
        b.output("y");
        b.output("z");
        let mut g = b.build().unwrap();
        ShapeInference::new(DimBindings::new()).run(&mut g).unwrap();
        let y = g.tensor(g.tensor_id("y").unwrap());
        assert_eq!(y.dtype, Some(DType::I8));
        assert_eq!(
            g.concrete_shape(g.tensor_id("y").unwrap()).unwrap(),
            vec![3, 6]
        );
        assert_eq!(
            g.concrete_shape(g.tensor_id("z").unwrap()).unwrap(),
            vec![1, 7, 5, 5]
        );
    }
}
