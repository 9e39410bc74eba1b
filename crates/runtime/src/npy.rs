//! Reading and writing NumPy `.npy` files (format versions 1.0, 2.0 and 3.0).
//!
//! Format: <https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>. The
//! reader is written here rather than taken from a crate because what the runtime needs is
//! strictness, not breadth: every way a file can be wrong (bad magic, a header that is not the
//! dict NumPy writes, Fortran order, big-endian or unsupported dtypes, a shape whose element count
//! overflows, data shorter or longer than the shape) is a clear [`Error::Npy`], never a panic or
//! a silently reinterpreted buffer. It is about 200 lines; `npyz` would add a dependency for
//! features (structured dtypes, streaming) the runtime does not use.
//!
//! String tensors are NumPy's fixed-width unicode arrays (`<U8`: 8 UTF-32 code points per
//! element, shorter strings padded with NUL), the form `np.save` writes without pickling; as in
//! NumPy, trailing NULs are padding, so a string cannot end in one.

use std::path::Path;

use super::tensor::{checked_numel, HostTensor, TensorData};
use crate::Error;
use pipecut_ir::graph::DType;

const MAGIC: &[u8] = b"\x93NUMPY";

/// A decoded `.npy` array: the tensor (widened per [`super::tensor`]) and the dtype the file
/// stores, so that callers can refuse a file whose stored type differs from what they expect.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    /// The element type stored in the file.
    pub stored: DType,
    /// The values.
    pub tensor: HostTensor,
}

/// The largest `.npy` input read: 16 GiB, more than one input of a pipeline stage holds on the
/// machines the CPU runtime targets; a larger file (or `/dev/zero`) is refused, not read whole.
const MAX_NPY_BYTES: u64 = 16 << 30;

/// Reads a `.npy` file.
pub fn read_npy(path: &Path) -> Result<NpyArray, Error> {
    read_npy_as(path, None)
}

/// Reads a `.npy` file for a tensor `declared` to hold that type: raw bytes that name no type
/// (`<V1`, `<V2`, as `ml_dtypes` writes float8, float4, int4 and bfloat16 arrays) are read as
/// `declared`.
pub fn read_npy_as(path: &Path, declared: Option<DType>) -> Result<NpyArray, Error> {
    let bytes = pipecut_ir::io::read_bounded(path, MAX_NPY_BYTES, ".npy input")?;
    parse_npy_as(&bytes, &path.display().to_string(), declared)
}

/// Decodes `.npy` bytes; `origin` names them in errors.
pub fn parse_npy(bytes: &[u8], origin: &str) -> Result<NpyArray, Error> {
    parse_npy_as(bytes, origin, None)
}

/// [`parse_npy`] for a tensor declared `declared` (see [`read_npy_as`]).
pub fn parse_npy_as(
    bytes: &[u8],
    origin: &str,
    declared: Option<DType>,
) -> Result<NpyArray, Error> {
    let fail = |detail: String| Error::Npy {
        origin: origin.to_string(),
        detail,
    };
    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(fail(
            "it does not start with the .npy magic bytes \\x93NUMPY".into(),
        ));
    }
    let major = bytes[6];
    let (header_len, header_start) = match major {
        1 => {
            let b = bytes
                .get(8..10)
                .ok_or_else(|| fail("truncated header".into()))?;
            (u16::from_le_bytes([b[0], b[1]]) as usize, 10usize)
        }
        2 | 3 => {
            let b = bytes
                .get(8..12)
                .ok_or_else(|| fail("truncated header".into()))?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        v => {
            return Err(fail(format!(
                "format version {v} is not supported (1 to 3 are)"
            )))
        }
    };
    let header_end = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| fail("truncated header".into()))?;
    let header = std::str::from_utf8(&bytes[header_start..header_end])
        .map_err(|_| fail("the header is not text".into()))?;
    let header = parse_header(header).map_err(|d| fail(format!("bad header: {d}")))?;
    if header.fortran_order {
        return Err(fail(
            "Fortran-ordered arrays are not supported; save with np.ascontiguousarray".into(),
        ));
    }
    let (stored, size) = element_format(&header.descr, declared).map_err(fail)?;
    let elements = checked_numel(&header.shape)
        .ok_or_else(|| fail(format!("shape {:?} overflows", header.shape)))?;
    let data = &bytes[header_end..];
    let needed = elements
        .checked_mul(size)
        .ok_or_else(|| fail(format!("shape {:?} overflows", header.shape)))?;
    if data.len() != needed {
        return Err(fail(format!(
            "shape {:?} of {} needs {needed} data bytes but the file has {}{}",
            header.shape,
            stored,
            data.len(),
            if data.len() < needed {
                " (truncated)"
            } else {
                ""
            }
        )));
    }
    let values = decode(stored, size, data).map_err(fail)?;
    let tensor = HostTensor::new(header.shape, values).map_err(fail)?;
    Ok(NpyArray { stored, tensor })
}

/// The dtype and element size a descr stores. Raw one- and two-byte elements (`<V1`, `<V2`:
/// NumPy has no name for ml_dtypes' types, so np.save writes them as void) are the `declared`
/// type when it is one of that size; ml_dtypes names float8 E5M2 `<f1`.
fn element_format(descr: &str, declared: Option<DType>) -> Result<(DType, usize), String> {
    let one_byte = |d: DType| {
        matches!(
            d,
            DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F8E8M0
                | DType::F4E2M1
                | DType::I4
                | DType::U4
                | DType::I2
                | DType::U2
        )
    };
    Ok(match descr {
        "<f4" => (DType::F32, 4),
        "<f8" => (DType::F64, 8),
        "<f2" => (DType::F16, 2),
        "<f1" => (DType::F8E5M2, 1),
        "<i8" => (DType::I64, 8),
        "<i4" => (DType::I32, 4),
        "<i2" => (DType::I16, 2),
        "|i1" => (DType::I8, 1),
        "|u1" => (DType::U8, 1),
        "<u2" => (DType::U16, 2),
        "<u4" => (DType::U32, 4),
        "<u8" => (DType::U64, 8),
        "|b1" => (DType::Bool, 1),
        "<V1" | "|V1" | "<V2" | "|V2" => {
            let size = if descr.ends_with('1') { 1 } else { 2 };
            match declared {
                Some(d) if size == 1 && one_byte(d) => (d, 1),
                Some(DType::BF16) if size == 2 => (DType::BF16, 2),
                _ => {
                    return Err(format!(
                        "it holds raw {size}-byte elements ('{descr}', as ml_dtypes writes {}), which are read only where the model declares such a type{}",
                        if size == 1 {
                            "float8, float4 and int4 arrays"
                        } else {
                            "bfloat16 arrays"
                        },
                        declared.map_or(String::new(), |d| format!(", and this tensor is {d}"))
                    ))
                }
            }
        }
        "|O" | "<O" | ">O" => {
            return Err(
                "it holds Python objects ('|O'), which NumPy saves with pickle, and pickles are not read (loading one can run code): save strings as a unicode array, np.array(values, dtype=str)"
                    .into(),
            )
        }
        _ => match unicode_width(descr).and_then(|w| w.checked_mul(4)) {
            Some(size) => (DType::String, size),
            None => {
                return Err(format!(
                    "dtype '{descr}' is not supported (little-endian float16/32/64, int8/16/32/64, uint8/16/32/64, bool, unicode strings, and ml_dtypes' bfloat16, float8, float4 and int4 are)"
                ))
            }
        },
    })
}

/// The code points per element of a little-endian unicode descr (`<U12` → 12); a width of 0
/// holds nothing and is refused.
fn unicode_width(descr: &str) -> Option<usize> {
    descr
        .strip_prefix("<U")?
        .parse::<usize>()
        .ok()
        .filter(|&w| w > 0)
}

/// Fixed-width UTF-32 elements as strings, trailing NUL padding removed; `None` on a value
/// that is not a Unicode scalar.
fn decode_unicode(width: usize, data: &[u8]) -> Option<Vec<String>> {
    data.chunks_exact(width * 4)
        .map(|element| {
            let mut text: String = element
                .chunks_exact(4)
                .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<Option<_>>()?;
            text.truncate(text.trim_end_matches('\0').len());
            Some(text)
        })
        .collect()
}

/// The elements of `stored`, `size` bytes each, widened as the runtime holds them (`|u1` and
/// `|i1` stay bytes). Every buffer is allocated fallibly: `<i2` widens to i64, 4 times the file,
/// and a large file under a tight address space must be an error.
fn decode(stored: DType, size: usize, data: &[u8]) -> Result<TensorData, String> {
    use super::narrow::{byte_to_float, narrow_int, wrap_int};
    fn chunks<const N: usize>(data: &[u8]) -> impl ExactSizeIterator<Item = [u8; N]> + '_ {
        data.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
    }
    Ok(match stored {
        DType::F32 => TensorData::F32(
            chunks::<4>(data)
                .map(f32::from_le_bytes)
                .try_collect_vec()?,
        ),
        DType::F64 => TensorData::F32(
            chunks::<8>(data)
                .map(|b| f64::from_le_bytes(b) as f32)
                .try_collect_vec()?,
        ),
        DType::F16 => TensorData::F32(
            chunks::<2>(data)
                .map(|b| half::f16::from_le_bytes(b).to_f32())
                .try_collect_vec()?,
        ),
        DType::BF16 => TensorData::F32(
            chunks::<2>(data)
                .map(|b| half::bf16::from_le_bytes(b).to_f32())
                .try_collect_vec()?,
        ),
        DType::I64 => TensorData::I64(
            chunks::<8>(data)
                .map(i64::from_le_bytes)
                .try_collect_vec()?,
        ),
        // The runtime keeps uint64 in int64 storage, bit for bit (docs/conformance.md).
        DType::U64 => TensorData::I64(
            chunks::<8>(data)
                .map(i64::from_le_bytes)
                .try_collect_vec()?,
        ),
        DType::I32 => TensorData::I32(
            chunks::<4>(data)
                .map(i32::from_le_bytes)
                .try_collect_vec()?,
        ),
        DType::I16 => TensorData::I64(
            chunks::<2>(data)
                .map(|b| i16::from_le_bytes(b) as i64)
                .try_collect_vec()?,
        ),
        DType::I8 => TensorData::I8(data.iter().map(|&b| b as i8).try_collect_vec()?),
        DType::U8 => TensorData::U8(data.iter().copied().try_collect_vec()?),
        DType::U16 => TensorData::I64(
            chunks::<2>(data)
                .map(|b| u16::from_le_bytes(b) as i64)
                .try_collect_vec()?,
        ),
        DType::U32 => TensorData::I64(
            chunks::<4>(data)
                .map(|b| u32::from_le_bytes(b) as i64)
                .try_collect_vec()?,
        ),
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            let (bits, signed) = narrow_int(stored).expect("a narrow integer type");
            let mask = (1u8 << bits) - 1;
            let values = data
                .iter()
                .map(|&b| wrap_int(i64::from(b & mask), bits, signed));
            // Wrapped into the type's range: a byte of its signedness holds each exactly.
            match signed {
                true => TensorData::I8(values.map(|x| x as i8).try_collect_vec()?),
                false => TensorData::U8(values.map(|x| x as u8).try_collect_vec()?),
            }
        }
        DType::Bool => {
            if data.iter().any(|&b| b > 1) {
                return Err("invalid data: a bool that is neither 0 nor 1".into());
            }
            TensorData::Bool(data.iter().map(|&b| b == 1).try_collect_vec()?)
        }
        DType::String => TensorData::String(decode_unicode(size / 4, data).ok_or("invalid data")?),
        one_byte_float => {
            if data
                .iter()
                .any(|&b| byte_to_float(one_byte_float, b).is_none())
            {
                return Err("invalid data".into());
            }
            TensorData::F32(
                data.iter()
                    .map(|&b| byte_to_float(one_byte_float, b).unwrap_or(f32::NAN))
                    .try_collect_vec()?,
            )
        }
    })
}

/// `collect()` into a vector whose allocation may fail with an error instead of an abort.
trait TryCollectVec: ExactSizeIterator + Sized {
    fn try_collect_vec(self) -> Result<Vec<Self::Item>, String> {
        crate::tensor::try_collect(self.len(), self)
    }
}

impl<I: ExactSizeIterator> TryCollectVec for I {}

struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Parses the Python dict literal NumPy writes: `{'descr': '<f4', 'fortran_order': False,
/// 'shape': (2, 3), }` followed by space padding and a newline.
fn parse_header(text: &str) -> Result<Header, String> {
    let body = text
        .trim_end()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or("it is not a dict literal")?;
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or("expected a quoted key")?;
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or("expected ':' after a key")?
            .trim_start();
        let after = match key {
            "descr" => {
                let (value, after) = quoted(after).ok_or("descr is not a string")?;
                descr = Some(value.to_string());
                after
            }
            "fortran_order" => {
                if let Some(a) = after.strip_prefix("False") {
                    fortran = Some(false);
                    a
                } else if let Some(a) = after.strip_prefix("True") {
                    fortran = Some(true);
                    a
                } else {
                    return Err("fortran_order is not True or False".into());
                }
            }
            "shape" => {
                let inner = after.strip_prefix('(').ok_or("shape is not a tuple")?;
                let close = inner.find(')').ok_or("shape tuple is not closed")?;
                let dims = inner[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(|d| {
                        d.parse::<usize>()
                            .map_err(|_| format!("shape entry '{d}' is not a size"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                shape = Some(dims);
                &inner[close + 1..]
            }
            other => return Err(format!("unexpected key '{other}'")),
        };
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(a) => a.trim_start(),
            None if after.is_empty() => after,
            None => return Err("expected ',' between entries".into()),
        };
    }
    Ok(Header {
        descr: descr.ok_or("no 'descr'")?,
        fortran_order: fortran.ok_or("no 'fortran_order'")?,
        shape: shape.ok_or("no 'shape'")?,
    })
}

/// A `'...'` or `"..."` string at the start of `text`, and what follows it.
fn quoted(text: &str) -> Option<(&str, &str)> {
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let end = text[1..].find(quote)? + 1;
    Some((&text[1..end], &text[end + 1..]))
}

/// Encodes a tensor as `.npy` version 1.0 bytes of its own dtype (float32 `<f4`, int64 `<i8`,
/// int32 `<i4`, bool `|b1`, strings `<U` as wide as the longest).
pub fn encode_npy(tensor: &HostTensor) -> Vec<u8> {
    encode_npy_as(tensor, tensor.dtype()).expect("the runtime's own dtypes always encode")
}

/// Encodes a tensor as `.npy` version 1.0 bytes of the model's `dtype` for it, as NumPy (or,
/// for its types, `ml_dtypes`) saves such an array: uint8 as `|u1`, float16 as `<f2`, bfloat16
/// as `<V2`, float8, float4 and int4 as `<V1` (one element a byte; `np.load(f).view(
/// ml_dtypes.float8_e4m3fn)` reads them; ml_dtypes saves float8 E5M2 as `<f1`, which this
/// reader takes but `np.load` refuses), uint64 bit for bit from the int64 storage. Values are rounded to narrow
/// float types and wrapped into narrow integer ones, as a Cast would. The header is padded so
/// the data starts at a multiple of 64 bytes, as NumPy does.
pub fn encode_npy_as(tensor: &HostTensor, dtype: DType) -> Result<Vec<u8>, String> {
    let cast;
    let tensor = if super::tensor::runtime_dtype(dtype) == tensor.dtype() {
        tensor
    } else {
        cast = tensor.cast(dtype)?;
        &cast
    };
    let (descr, body) = element_bytes(tensor, dtype)?;
    let shape = match tensor.shape() {
        [one] => format!("({one},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // magic (6) + version (2) + length (2) + header + '\n' ≡ 0 (mod 64)
    let unpadded = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // The header of a shape with any plausible rank fits in u16; longer is refused by NumPy too.
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The descr and little-endian element bytes of `tensor` (held as the runtime holds `dtype`).
fn element_bytes(tensor: &HostTensor, dtype: DType) -> Result<(String, Vec<u8>), String> {
    fn each<T, const N: usize>(v: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(f).collect()
    }
    let descr = |d: &str| d.to_string();
    Ok(match (tensor.data(), dtype) {
        (TensorData::F32(v), DType::F32) => (descr("<f4"), each(v, |x| x.to_le_bytes())),
        (TensorData::F32(v), DType::F64) => {
            (descr("<f8"), each(v, |&x| f64::from(x).to_le_bytes()))
        }
        (TensorData::F32(v), DType::F16) => (
            descr("<f2"),
            each(v, |&x| half::f16::from_f32(x).to_le_bytes()),
        ),
        (TensorData::F32(v), DType::BF16) => (
            descr("<V2"),
            each(v, |&x| half::bf16::from_f32(x).to_le_bytes()),
        ),
        (TensorData::F32(v), narrow) => {
            let encoder = super::narrow::ByteEncoder::new(narrow)
                .ok_or_else(|| format!("a float tensor cannot be written as {narrow}"))?;
            (descr("<V1"), v.iter().map(|&x| encoder.encode(x)).collect())
        }
        (TensorData::I64(v), DType::I64 | DType::U64) => {
            let name = if dtype == DType::I64 { "<i8" } else { "<u8" };
            (descr(name), each(v, |x| x.to_le_bytes()))
        }
        (TensorData::I64(v), DType::I16) => (descr("<i2"), each(v, |&x| (x as i16).to_le_bytes())),
        (TensorData::I64(v), DType::U16) => (descr("<u2"), each(v, |&x| (x as u16).to_le_bytes())),
        (TensorData::I64(v), DType::U32) => (descr("<u4"), each(v, |&x| (x as u32).to_le_bytes())),
        (TensorData::I8(v), DType::I8) => (descr("|i1"), each(v, |&x| x.to_le_bytes())),
        (TensorData::U8(v), DType::U8) => (descr("|u1"), v.clone()),
        (TensorData::I8(_) | TensorData::U8(_), DType::I4 | DType::U4 | DType::I2 | DType::U2) => {
            let (bits, _) = super::narrow::narrow_int(dtype).expect("a sub-byte integer type");
            let mask = (1u8 << bits) - 1;
            let low_bits = tensor.to_i64_vec().into_iter().map(|x| x as u8 & mask);
            (descr("<V1"), low_bits.collect())
        }
        (TensorData::I32(v), DType::I32) => (descr("<i4"), each(v, |x| x.to_le_bytes())),
        (TensorData::Bool(v), DType::Bool) => (descr("|b1"), v.iter().map(|&b| b as u8).collect()),
        (TensorData::String(v), DType::String) => {
            let width = v
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut out = Vec::with_capacity(v.len() * width * 4);
            for text in v {
                let padding = width - text.chars().count();
                text.chars()
                    .map(u32::from)
                    .chain(std::iter::repeat_n(0, padding))
                    .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            }
            (format!("<U{width}"), out)
        }
        (_, other) => {
            return Err(format!(
                "a {} tensor cannot be written as {other}",
                tensor.dtype()
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn round_trips_every_written_dtype() {
        for t in [
            HostTensor::f32(vec![2, 3], vec![1.0, -2.5, 3.0, 0.0, 1e-8, 7.0]),
            HostTensor::i64(vec![3], vec![-1, 0, i64::MAX]),
            HostTensor::with_data(vec![2], TensorData::I32(vec![5, -6])),
            HostTensor::with_data(vec![1, 2], TensorData::Bool(vec![true, false])),
            HostTensor::f32(vec![], vec![4.0]),
            HostTensor::with_data(
                vec![3],
                TensorData::String(vec!["née".into(), "".into(), "a b".into()]),
            ),
            HostTensor::with_data(vec![3], TensorData::U8(vec![0, 7, 255])),
            HostTensor::with_data(vec![2], TensorData::I8(vec![-128, 127])),
        ] {
            let bytes = encode_npy(&t);
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0, "data is 64-byte aligned");
            let back = parse_npy(&bytes, "t").unwrap();
            assert_eq!(back.tensor, t);
            assert_eq!(back.stored, t.dtype());
        }
    }

    #[test]
    fn reads_numpy_unicode_strings() {
        // np.save of np.array([["ab", "ü"]]): '<U2', UTF-32LE, NUL padded.
        let data: Vec<u8> = ['a', 'b', 'ü', '\0']
            .iter()
            .flat_map(|&c| u32::from(c).to_le_bytes())
            .collect();
        let header = "{'descr': '<U2', 'fortran_order': False, 'shape': (1, 2), }\n";
        let a = parse_npy(&npy(header, &data), "t").unwrap();
        assert_eq!(a.stored, DType::String);
        assert_eq!(
            a.tensor.data(),
            &TensorData::String(vec!["ab".into(), "ü".into()])
        );
        let surrogate = 0xd800u32.to_le_bytes().repeat(2);
        assert!(parse_npy(&npy(header, &surrogate), "t").is_err());
        let empty_width = "{'descr': '<U0', 'fortran_order': False, 'shape': (2,), }\n";
        assert!(parse_npy(&npy(empty_width, &[]), "t").is_err());
    }

    #[test]
    fn reads_a_header_as_numpy_writes_it() {
        let data: Vec<u8> = [1.5f64, 2.5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse_npy(
            &npy(
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }   \n",
                &data,
            ),
            "t",
        )
        .unwrap();
        assert_eq!(a.stored, DType::F64);
        assert_eq!(a.tensor.as_f32().unwrap(), &[1.5, 2.5]);
    }

    #[test]
    fn refuses_bad_files_with_clear_errors() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"PK\x03\x04 not npy".to_vec(), "magic"),
            (
                npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n", &[0; 12]),
                "truncated",
            ),
            (
                npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", &[0; 8]),
                "Fortran",
            ),
            (
                npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", &[0; 8]),
                "not supported",
            ),
            (
                npy("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n", &[0; 8]),
                "not supported",
            ),
            (
                npy("{'descr': '<f4', 'shape': (1,), }\n", &[0; 4]),
                "fortran_order",
            ),
            (
                npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", &[0; 4]),
                "not a size",
            ),
            (
                npy(
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }\n",
                    &[],
                ),
                "overflows",
            ),
            (MAGIC.iter().copied().chain([1, 0, 200, 0]).collect(), "truncated header"),
            (
                npy("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }\n", &[7]),
                "invalid data",
            ),
        ];
        for (bytes, expected) in cases {
            let err = parse_npy(&bytes, "case.npy").unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should mention {expected}");
            assert!(err.contains("case.npy"), "{err}");
        }
    }

    #[test]
    fn reads_and_writes_the_types_numpy_and_ml_dtypes_save() {
        // uint64 above int64's range, bit for bit.
        let max = npy(
            "{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }\n",
            &[0xff; 8],
        );
        let a = parse_npy(&max, "t").unwrap();
        assert_eq!(a.stored, DType::U64);
        assert!(encode_npy_as(&a.tensor, DType::U64)
            .unwrap()
            .ends_with(&[0xff; 8]));
        // ml_dtypes' raw bytes take the declared type: float8 E4M3FN 448 and -0.5; as int4, -2 and 0.
        let raw = npy(
            "{'descr': '<V1', 'fortran_order': False, 'shape': (2,), }\n",
            &[126, 0xb0],
        );
        let a = parse_npy_as(&raw, "t", Some(DType::F8E4M3FN)).unwrap();
        assert_eq!(a.tensor.data(), &TensorData::F32(vec![448.0, -0.5]));
        assert!(encode_npy_as(&a.tensor, DType::F8E4M3FN)
            .unwrap()
            .ends_with(&[126, 0xb0]));
        let a = parse_npy_as(&raw, "t", Some(DType::I4)).unwrap();
        assert_eq!(a.tensor.data(), &TensorData::I8(vec![-2, 0]));
        let err = parse_npy_as(&raw, "t", Some(DType::F32))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("raw 1-byte elements") && err.contains("this tensor is float32"),
            "{err}"
        );
        // bfloat16 1.0 and float8 E5M2 as ml_dtypes names it.
        let bf16 = npy(
            "{'descr': '<V2', 'fortran_order': False, 'shape': (1,), }\n",
            &[0x80, 0x3f],
        );
        let a = parse_npy_as(&bf16, "t", Some(DType::BF16)).unwrap();
        assert_eq!(a.tensor.data(), &TensorData::F32(vec![1.0]));
        let e5m2 = npy(
            "{'descr': '<f1', 'fortran_order': False, 'shape': (1,), }\n",
            &[0x3c],
        );
        assert_eq!(
            parse_npy(&e5m2, "t").unwrap().tensor.data(),
            &TensorData::F32(vec![1.0])
        );
        // uint8 stays uint8 on the way out.
        let bytes = encode_npy_as(&HostTensor::i64(vec![2], vec![7, 255]), DType::U8).unwrap();
        let back = parse_npy(&bytes, "t").unwrap();
        assert_eq!(back.stored, DType::U8);
        assert_eq!(back.tensor.data(), &TensorData::U8(vec![7, 255]));
    }

    #[test]
    fn a_pickled_object_array_is_refused_not_unpickled() {
        let pickled = npy(
            "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n",
            b"\x80\x04",
        );
        let err = parse_npy(&pickled, "t").unwrap_err().to_string();
        assert!(err.contains("pickles are not read"), "{err}");
    }
}
