//! [TensorScatter](https://onnx.ai/onnx/operators/onnx__TensorScatter.html) (opset 24): a
//! key/value cache update. Each batch entry's `update` is written into `past_cache` along
//! `axis` (default −2) from that entry's `write_indices` position (default 0), wrapping around
//! the cache in `circular` mode; the rest of the cache is copied.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::normalize_axis;
use crate::tensor::{HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["TensorScatter"], tensor_scatter);
}

fn tensor_scatter(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (cache, update) = (input(inputs, 0)?, input(inputs, 1)?);
    let cs = cache.shape();
    let (offsets, inner) = tensor_scatter_rows(
        ctx,
        cs,
        update.shape(),
        optional(inputs, 2).map(|w| w.to_i64_vec()),
    )?;
    fn write<T: Copy>(
        cache: &[T],
        update: &[T],
        offsets: &[(usize, usize)],
        inner: usize,
    ) -> Vec<T> {
        let mut out = cache.to_vec();
        for &(to, from) in offsets {
            out[to..to + inner].copy_from_slice(&update[from..from + inner]);
        }
        out
    }
    let data = match (cache.data(), update.data()) {
        (TensorData::F32(c), TensorData::F32(u)) => TensorData::F32(write(c, u, &offsets, inner)),
        (TensorData::I64(c), TensorData::I64(u)) => TensorData::I64(write(c, u, &offsets, inner)),
        (TensorData::I32(c), TensorData::I32(u)) => TensorData::I32(write(c, u, &offsets, inner)),
        (TensorData::Bool(c), TensorData::Bool(u)) => {
            TensorData::Bool(write(c, u, &offsets, inner))
        }
        _ => return Err("the cache and the update differ in type".into()),
    };
    Ok(vec![HostTensor::new(cs.to_vec(), data)?])
}

/// Where each row of `inner` update values goes: `(cache offset, update offset)` pairs, after
/// checking that the update fits the cache and every write position (`write_indices`, one per
/// batch entry; 0 when absent) lands inside it. The CUDA backend moves the rows by these.
pub(crate) fn tensor_scatter_rows(
    ctx: &Ctx,
    cs: &[usize],
    us: &[usize],
    write_indices: Option<Vec<i64>>,
) -> Result<(Vec<(usize, usize)>, usize), String> {
    let axis = normalize_axis(ctx.int("axis", -2), cs.len())?;
    let fits = cs.len() == us.len()
        && axis > 0
        && (0..cs.len()).all(|i| {
            if i == axis {
                us[i] <= cs[i]
            } else {
                us[i] == cs[i]
            }
        });
    if !fits {
        return Err(format!(
            "update {us:?} does not fit cache {cs:?} along axis {axis}"
        ));
    }
    let circular = match ctx.string("mode", "linear").as_str() {
        "linear" => false,
        "circular" => true,
        other => return Err(format!("mode '{other}' is neither linear nor circular")),
    };
    let batch = cs[0];
    let starts = write_indices.unwrap_or_else(|| vec![0; batch]);
    if starts.len() != batch {
        return Err(format!(
            "{} write indices for a batch of {batch}",
            starts.len()
        ));
    }
    let (length, written) = (cs[axis], us[axis]);
    let inner: usize = cs[axis + 1..].iter().product();
    let prefixes: usize = cs[1..axis].iter().product();
    let mut offsets: Vec<(usize, usize)> = Vec::with_capacity(starts.len() * written);
    for (b, &start) in starts.iter().enumerate() {
        for p in 0..prefixes {
            for s in 0..written {
                let at = start.saturating_add(s as i64);
                let at = if circular {
                    at.rem_euclid(length as i64)
                } else {
                    at
                };
                let at = usize::try_from(at)
                    .ok()
                    .filter(|&a| a < length)
                    .ok_or_else(|| {
                        format!("batch {b} writes position {at}, outside a cache of {length}")
                    })?;
                let row = b * prefixes + p;
                offsets.push(((row * length + at) * inner, (row * written + s) * inner));
            }
        }
    }
    Ok((offsets, inner))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn circular_writes_wrap_around_the_cache() {
        let cache = f(&[1, 3, 1], &[0.0, 0.0, 0.0]);
        let update = f(&[1, 2, 1], &[7.0, 8.0]);
        let out = run(
            "TensorScatter",
            vec![("mode", Attribute::String("circular".into()))],
            &[&cache, &update, &i(&[1], &[2])],
        );
        assert_eq!(out[0].to_f32_vec(), vec![8.0, 0.0, 7.0]);
    }
}
