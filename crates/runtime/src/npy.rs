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
    let bytes = pipecut_ir::io::read_bounded(path, MAX_NPY_BYTES, ".npy input")?;
    parse_npy(&bytes, &path.display().to_string())
}

/// Decodes `.npy` bytes; `origin` names them in errors.
pub fn parse_npy(bytes: &[u8], origin: &str) -> Result<NpyArray, Error> {
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
    let (stored, size) = descr_dtype(&header.descr).ok_or_else(|| {
        fail(format!(
            "dtype '{}' is not supported (little-endian float16/32/64, int8/16/32/64, uint8/16/32, bool and unicode strings are)",
            header.descr
        ))
    })?;
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
    let values = decode(&header.descr, data).map_err(fail)?;
    let tensor = HostTensor::new(header.shape, values).map_err(fail)?;
    Ok(NpyArray { stored, tensor })
}

fn descr_dtype(descr: &str) -> Option<(DType, usize)> {
    Some(match descr {
        "<f4" => (DType::F32, 4),
        "<f8" => (DType::F64, 8),
        "<f2" => (DType::F16, 2),
        "<i8" => (DType::I64, 8),
        "<i4" => (DType::I32, 4),
        "<i2" => (DType::I16, 2),
        "|i1" => (DType::I8, 1),
        "|u1" => (DType::U8, 1),
        "<u2" => (DType::U16, 2),
        "<u4" => (DType::U32, 4),
        "|b1" => (DType::Bool, 1),
        _ => (DType::String, unicode_width(descr)?.checked_mul(4)?),
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

/// The values of `data` as `descr` stores them. Every buffer is allocated fallibly: `|u1` widens
/// to i64, 8 times the file, and a large file under a tight address space must be an error.
fn decode(descr: &str, data: &[u8]) -> Result<TensorData, String> {
    fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        data.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
    }
    use crate::tensor::try_collect;
    Ok(match descr {
        "<f4" => TensorData::F32(try_collect(
            data.len() / 4,
            chunks::<4>(data).map(f32::from_le_bytes),
        )?),
        "<f8" => TensorData::F32(try_collect(
            data.len() / 8,
            chunks::<8>(data).map(|b| f64::from_le_bytes(b) as f32),
        )?),
        "<f2" => TensorData::F32(try_collect(
            data.len() / 2,
            chunks::<2>(data).map(|b| half::f16::from_le_bytes(b).to_f32()),
        )?),
        "<i8" => TensorData::I64(try_collect(
            data.len() / 8,
            chunks::<8>(data).map(i64::from_le_bytes),
        )?),
        "<i4" => TensorData::I32(try_collect(
            data.len() / 4,
            chunks::<4>(data).map(i32::from_le_bytes),
        )?),
        "<i2" => TensorData::I64(try_collect(
            data.len() / 2,
            chunks::<2>(data).map(|b| i16::from_le_bytes(b) as i64),
        )?),
        "|i1" => TensorData::I64(try_collect(
            data.len(),
            data.iter().map(|&b| b as i8 as i64),
        )?),
        "|u1" => TensorData::I64(try_collect(data.len(), data.iter().map(|&b| b as i64))?),
        "<u2" => TensorData::I64(try_collect(
            data.len() / 2,
            chunks::<2>(data).map(|b| u16::from_le_bytes(b) as i64),
        )?),
        "<u4" => TensorData::I64(try_collect(
            data.len() / 4,
            chunks::<4>(data).map(|b| u32::from_le_bytes(b) as i64),
        )?),
        "|b1" => {
            if data.iter().any(|&b| b > 1) {
                return Err("invalid data: a bool that is neither 0 nor 1".into());
            }
            TensorData::Bool(try_collect(data.len(), data.iter().map(|&b| b == 1))?)
        }
        _ => TensorData::String(
            unicode_width(descr)
                .and_then(|width| decode_unicode(width, data))
                .ok_or("invalid data")?,
        ),
    })
}

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

/// Encodes a tensor as `.npy` version 1.0 bytes (float32 `<f4`, int64 `<i8`, int32 `<i4`, bool
/// `|b1`, strings `<U` as wide as the longest); the header is padded so the data starts at a
/// multiple of 64 bytes, as NumPy does.
pub fn encode_npy(tensor: &HostTensor) -> Vec<u8> {
    let string_width = match tensor.data() {
        TensorData::String(v) => v
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
            .max(1),
        _ => 0,
    };
    let descr = match tensor.data() {
        TensorData::F32(_) => "<f4".to_string(),
        TensorData::I64(_) => "<i8".to_string(),
        TensorData::I32(_) => "<i4".to_string(),
        TensorData::Bool(_) => "|b1".to_string(),
        TensorData::String(_) => format!("<U{string_width}"),
    };
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
    let mut out = Vec::with_capacity(10 + header.len() + tensor.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // The header of a shape with any plausible rank fits in u16; longer is refused by NumPy too.
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    match tensor.data() {
        TensorData::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        TensorData::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        TensorData::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        TensorData::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        TensorData::String(v) => {
            for text in v {
                let padding = string_width - text.chars().count();
                text.chars()
                    .map(u32::from)
                    .chain(std::iter::repeat_n(0, padding))
                    .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            }
        }
    }
    out
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
}
