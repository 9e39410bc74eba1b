//! Shapes and offsets the kernels share: the size limit of what a kernel allocates, axes,
//! numpy broadcasting, and strided and gathered copies. Every kernel family may read this; it
//! reads none of them (only the vectorised loops of `fast_math.rs`).

use super::fast_math;
use crate::tensor::TensorData;

/// Largest tensor a kernel allocates from a shape it computed: 2^32 elements (16 GiB of f32).
/// Exported models stay far below it; a shape computed from corrupt data (a `Range` with a tiny
/// step, an `Expand` to a garbage shape) would otherwise abort the process on allocation instead
/// of failing with an error.
pub(crate) const MAX_ELEMENTS: usize = 1 << 32;

/// Element count of a computed shape, refusing overflow and sizes above [`MAX_ELEMENTS`].
pub(crate) fn checked_size(shape: &[usize]) -> Result<usize, String> {
    crate::tensor::checked_numel(shape)
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("shape {shape:?} holds more than {MAX_ELEMENTS} elements"))
}

/// `(outer, axis length, inner)` of the fibres along `axis` of `shape`, or with
/// `flatten_tail` (the pre-opset-13 Softmax, Hardmax) of everything from `axis` on as one fibre.
/// A shape with a zero dim has no fibres, `(0, 0, 0)`, however large its other dims: their
/// product (`[4, 2^62, 0]`) would overflow, and there is nothing to map.
pub(crate) fn fibres(shape: &[usize], axis: usize, flatten_tail: bool) -> (usize, usize, usize) {
    if shape.contains(&0) {
        return (0, 0, 0);
    }
    // A shape without zeros is a tensor that exists: its products fit.
    let outer = shape[..axis].iter().product();
    match flatten_tail {
        true => (outer, shape[axis..].iter().product(), 1),
        false => (
            outer,
            shape.get(axis).copied().unwrap_or(1),
            shape[axis.min(shape.len())..].iter().skip(1).product(),
        ),
    }
}

/// Resolves a possibly negative axis against `rank`.
pub(crate) fn normalize_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Numpy-style broadcast of several shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for shape in shapes {
        let offset = rank - shape.len();
        for (i, &d) in shape.iter().enumerate() {
            let o = &mut out[offset + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(format!("shapes {shapes:?} do not broadcast"));
            }
        }
    }
    Ok(out)
}

/// For each element of `out_shape` (row-major), its offset in a tensor of `in_shape` that
/// broadcasts to it. Fails, rather than aborting, when the offsets do not fit in memory.
pub(crate) fn broadcast_offsets(
    in_shape: &[usize],
    out_shape: &[usize],
) -> Result<Vec<usize>, String> {
    let rank = out_shape.len();
    // A zero-element output needs no offsets, whatever its other dims (`[0, 2^62]` once
    // overflowed here).
    let total = crate::tensor::checked_numel(out_shape)
        .ok_or_else(|| format!("shape {out_shape:?} has more elements than fit in memory"))?;
    let mut result = crate::tensor::try_with_capacity(total)?;
    if total == 0 {
        return Ok(result);
    }
    let in_strides = crate::tensor::strides_of(in_shape);
    let mut strides = vec![0usize; rank];
    let offset = rank - in_shape.len();
    for (i, &d) in in_shape.iter().enumerate() {
        if d != 1 {
            strides[offset + i] = in_strides[i];
        }
    }
    let inner = out_shape.last().copied().unwrap_or(1);
    let inner_stride = strides.last().copied().unwrap_or(0);
    let outer_rank = rank.saturating_sub(1);
    let mut index = vec![0usize; outer_rank];
    loop {
        let base: usize = (0..outer_rank).map(|i| index[i] * strides[i]).sum();
        result.extend((0..inner).map(|j| base + j * inner_stride));
        // odometer over the outer dims
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return Ok(result);
            }
            d -= 1;
            index[d] += 1;
            if index[d] < out_shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Walks a numpy broadcast of `N` inputs to `out_shape` one innermost row at a time: `row(bases,
/// steps, len)` gets each input's offset at the row's start, each input's step along the row (0
/// where it broadcasts) and the row's length. Rows come in row-major order, so the output is the
/// concatenation of the rows; no per-element offset table is built (the odometer runs once per
/// row, not per element, which is what makes broadcast element-wise ops cheap).
pub(crate) fn for_each_broadcast_row<const N: usize>(
    in_shapes: [&[usize]; N],
    out_shape: &[usize],
    mut row: impl FnMut([usize; N], [usize; N], usize),
) {
    let rank = out_shape.len();
    if out_shape.contains(&0) {
        return;
    }
    let full_strides: [Vec<usize>; N] = std::array::from_fn(|n| {
        let shape = in_shapes[n];
        let own = crate::tensor::strides_of(shape);
        let offset = rank - shape.len();
        let mut s = vec![0usize; rank];
        for (i, &d) in shape.iter().enumerate() {
            if d != 1 {
                s[offset + i] = own[i];
            }
        }
        s
    });
    // Adjacent dims that every input walks the same way (contiguously, or broadcast along both)
    // merge into one, so that rows are as long as they can be: `[8, 64, 384] + [1, 1, 384]`
    // runs as 512 rows of 384, `[N, C, H, W] · [1, C, 1, 1]` as N · C rows of H · W.
    let mut dims: Vec<usize> = Vec::with_capacity(rank);
    let mut strides: [Vec<usize>; N] = std::array::from_fn(|_| Vec::with_capacity(rank));
    for d in (0..rank).rev().filter(|&d| out_shape[d] != 1) {
        let merges = dims.last().is_some_and(|&inner_size| {
            (0..N).all(|n| full_strides[n][d] == strides[n][strides[n].len() - 1] * inner_size)
        });
        if merges {
            *dims.last_mut().expect("merges needs a dim") *= out_shape[d];
        } else {
            dims.push(out_shape[d]);
            for n in 0..N {
                strides[n].push(full_strides[n][d]);
            }
        }
    }
    dims.reverse();
    strides.iter_mut().for_each(|s| s.reverse());
    let (out_shape, rank) = (dims.as_slice(), dims.len());
    let inner = out_shape.last().copied().unwrap_or(1);
    let steps: [usize; N] = std::array::from_fn(|n| strides[n].last().copied().unwrap_or(0));
    let outer_rank = rank.saturating_sub(1);
    let mut index = vec![0usize; outer_rank];
    let mut bases = [0usize; N];
    loop {
        row(bases, steps, inner);
        // odometer over the outer dims, keeping each input's base offset in step
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            for n in 0..N {
                bases[n] += strides[n][d];
            }
            if index[d] < out_shape[d] {
                break;
            }
            for n in 0..N {
                bases[n] -= strides[n][d] * out_shape[d];
            }
            index[d] = 0;
        }
    }
}

/// Applies `f` element-wise over two broadcast slices.
pub(crate) fn zip_broadcast<A: Copy, B: Copy, O>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    f: impl Fn(A, B) -> O + Copy,
) -> Result<(Vec<usize>, Vec<O>), String> {
    let shape = broadcast_shapes(&[a_shape, b_shape])?;
    let total = crate::tensor::checked_numel(&shape)
        .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
    let mut out = crate::tensor::try_with_capacity(total)?;
    if a_shape == b_shape {
        fast_math::extend_zip(&mut out, a, 1, b, 1, total, f);
    } else {
        for_each_broadcast_row([a_shape, b_shape], &shape, |[i, j], [si, sj], len| {
            fast_math::extend_zip(&mut out, &a[i..], si, &b[j..], sj, len, f);
        });
    }
    Ok((shape, out))
}

/// Copies the strided view of `data` that starts at `base` and steps `strides[d]` elements per
/// index of dim `d` (negative for a reversed Slice), row by row: a row whose step is 1 is one
/// slice copy, and no per-element offset table is built. Slice and Transpose are such views.
pub(crate) fn take_strided(
    data: &TensorData,
    base: isize,
    shape: &[usize],
    strides: &[isize],
) -> Result<TensorData, String> {
    fn copy<T: Clone>(
        v: &[T],
        base: isize,
        shape: &[usize],
        strides: &[isize],
    ) -> Result<Vec<T>, String> {
        let total = crate::tensor::checked_numel(shape)
            .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
        let mut out = crate::tensor::try_with_capacity(total)?;
        let Some((&inner, outer_shape)) = shape.split_last() else {
            out.push(v[base as usize].clone());
            return Ok(out);
        };
        if total == 0 {
            return Ok(out);
        }
        let step = strides[shape.len() - 1];
        let mut index = vec![0usize; outer_shape.len()];
        let mut at = base;
        loop {
            if step == 1 {
                out.extend_from_slice(&v[at as usize..at as usize + inner]);
            } else {
                out.extend((0..inner as isize).map(|k| v[(at + k * step) as usize].clone()));
            }
            let mut d = outer_shape.len();
            loop {
                if d == 0 {
                    return Ok(out);
                }
                d -= 1;
                index[d] += 1;
                at += strides[d];
                if index[d] < outer_shape[d] {
                    break;
                }
                at -= strides[d] * outer_shape[d] as isize;
                index[d] = 0;
            }
        }
    }
    // Dims of size 1 drop out, and a dim merges into the next inner one where stepping it is
    // stepping that one past its end: `[16, 512, 508, 1]` sliced whole is one row.
    let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
    let mut steps: Vec<isize> = Vec::with_capacity(shape.len());
    for (&size, &stride) in shape
        .iter()
        .zip(strides)
        .rev()
        .filter(|(&size, _)| size != 1)
    {
        match (dims.last_mut(), steps.last()) {
            (Some(inner), Some(&inner_stride)) if stride == inner_stride * *inner as isize => {
                *inner *= size;
            }
            _ => {
                dims.push(size);
                steps.push(stride);
            }
        }
    }
    dims.reverse();
    steps.reverse();
    let (shape, strides) = (dims.as_slice(), steps.as_slice());
    Ok(match data {
        TensorData::F32(v) => TensorData::F32(copy(v, base, shape, strides)?),
        TensorData::I64(v) => TensorData::I64(copy(v, base, shape, strides)?),
        TensorData::I32(v) => TensorData::I32(copy(v, base, shape, strides)?),
        TensorData::Bool(v) => TensorData::Bool(copy(v, base, shape, strides)?),
        TensorData::String(v) => TensorData::String(copy(v, base, shape, strides)?),
        TensorData::U8(v) => TensorData::U8(copy(v, base, shape, strides)?),
        TensorData::I8(v) => TensorData::I8(copy(v, base, shape, strides)?),
    })
}

/// Gathers the elements of any tensor at `offsets` (a permutation, slice or broadcast),
/// allocating the result fallibly.
pub(crate) fn take(data: &TensorData, offsets: &[usize]) -> Result<TensorData, String> {
    use crate::tensor::try_collect;
    let n = offsets.len();
    Ok(match data {
        TensorData::F32(v) => TensorData::F32(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::I64(v) => TensorData::I64(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::I32(v) => TensorData::I32(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::Bool(v) => TensorData::Bool(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::String(v) => {
            TensorData::String(try_collect(n, offsets.iter().map(|&i| v[i].clone()))?)
        }
        TensorData::U8(v) => TensorData::U8(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::I8(v) => TensorData::I8(try_collect(n, offsets.iter().map(|&i| v[i]))?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_offsets_follow_numpy() {
        assert_eq!(broadcast_shapes(&[&[2, 1], &[3]]).unwrap(), vec![2, 3]);
        assert_eq!(
            broadcast_offsets(&[2, 1], &[2, 3]).unwrap(),
            vec![0, 0, 0, 1, 1, 1]
        );
        assert_eq!(
            broadcast_offsets(&[3], &[2, 3]).unwrap(),
            vec![0, 1, 2, 0, 1, 2]
        );
        // Zero elements with a huge dim: nothing to address (this overflowed and panicked).
        assert_eq!(
            broadcast_offsets(&[0, 1], &[0, 1 << 62]).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            broadcast_offsets(&[1 << 62, 4, 0], &[1 << 62, 4, 0]).unwrap(),
            Vec::<usize>::new()
        );
        assert!(broadcast_shapes(&[&[2], &[3]]).is_err());
    }
}
