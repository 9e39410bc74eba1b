//! [TopK](https://onnx.ai/onnx/operators/onnx__TopK.html), opsets 1 to 24: the k largest (or,
//! with `largest = 0`, smallest) elements along `axis` and their indices. `k` is the attribute
//! before opset 10 and the second input from 10 on, so a k computed at run time works. Equal
//! values keep their order (the lower index first), as the ONNX reference's stable sort does;
//! the output is always sorted, which `sorted = 0` allows.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::normalize_axis;
use crate::tensor::{HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["TopK"], top_k);
}

fn top_k(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", -1), x.rank())?;
    let k = match optional(inputs, 1) {
        Some(k) => *k.to_i64_vec().first().ok_or("k is empty")?,
        None => ctx.int("k", -1),
    };
    let shape = x.shape();
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k <= shape[axis])
        .ok_or_else(|| {
            format!(
                "k {k} is outside 0..={} (the size of axis {axis})",
                shape[axis]
            )
        })?;
    let largest = ctx.int("largest", 1) != 0;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let keys: Vec<f64> = match x.data() {
        TensorData::I64(v) => v.iter().map(|&e| e as f64).collect(),
        _ => x.to_f32_vec().into_iter().map(f64::from).collect(),
    };
    let mut picked = Vec::with_capacity(outer * k * inner);
    let mut indices = vec![0i64; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(shape[axis]);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * shape[axis] + j) * inner + i;
            order.clear();
            order.extend(0..shape[axis]);
            order.sort_by(|&a, &b| {
                let (ka, kb) = (keys[at(a)], keys[at(b)]);
                let by_value = if largest {
                    kb.total_cmp(&ka)
                } else {
                    ka.total_cmp(&kb)
                };
                by_value.then(a.cmp(&b))
            });
            for (rank, &j) in order[..k].iter().enumerate() {
                indices[(o * k + rank) * inner + i] = j as i64;
            }
        }
    }
    for o in 0..outer {
        for rank in 0..k {
            for i in 0..inner {
                let j = indices[(o * k + rank) * inner + i] as usize;
                picked.push((o * shape[axis] + j) * inner + i);
            }
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = k;
    let values = match x.data() {
        TensorData::F32(v) => TensorData::F32(picked.iter().map(|&p| v[p]).collect()),
        TensorData::I64(v) => TensorData::I64(picked.iter().map(|&p| v[p]).collect()),
        TensorData::I32(v) => TensorData::I32(picked.iter().map(|&p| v[p]).collect()),
        TensorData::Bool(v) => TensorData::Bool(picked.iter().map(|&p| v[p]).collect()),
        TensorData::U8(v) => TensorData::U8(picked.iter().map(|&p| v[p]).collect()),
        TensorData::I8(v) => TensorData::I8(picked.iter().map(|&p| v[p]).collect()),
        TensorData::String(_) => return Err("TopK does not accept string".into()),
    };
    Ok(vec![
        HostTensor::new(out_shape.clone(), values)?,
        HostTensor::new(out_shape, TensorData::I64(indices))?,
    ])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::run;
    use crate::tensor::{HostTensor, TensorData};

    /// Ties keep the lower index first; k comes from the second input.
    #[test]
    fn top_two_with_a_tie() {
        let x = HostTensor::f32(vec![1, 4], vec![1.0, 3.0, 3.0, 2.0]);
        let k = HostTensor::new(vec![1], TensorData::I64(vec![2])).unwrap();
        let out = run("TopK", vec![], &[&x, &k]);
        assert_eq!(out[0].to_f32_vec(), vec![3.0, 3.0]);
        assert_eq!(out[1].to_i64_vec(), vec![1, 2]);
    }
}
