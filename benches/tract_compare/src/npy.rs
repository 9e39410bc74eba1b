//! .npy files as tract tensors: the reference data of the ONNX node cases
//! (`fixtures/conformance.py`) and the inputs/outputs `benches/cpu_speed.py` exchanges with
//! this harness. Only what those writers produce: little-endian, C order, the numeric and bool
//! codes, and fixed-width unicode (`<U`) for strings.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use tract_onnx::prelude::*;

/// The dtype of a .npy `descr` code, or `None` for fixed-width unicode (strings).
fn datum_type(descr: &str) -> Result<Option<DatumType>> {
    Ok(Some(match descr {
        "<f2" => DatumType::F16,
        "<f4" => DatumType::F32,
        "<f8" => DatumType::F64,
        "|i1" => DatumType::I8,
        "<i2" => DatumType::I16,
        "<i4" => DatumType::I32,
        "<i8" => DatumType::I64,
        "|u1" => DatumType::U8,
        "<u2" => DatumType::U16,
        "<u4" => DatumType::U32,
        "<u8" => DatumType::U64,
        "|b1" => DatumType::Bool,
        d if d.starts_with("<U") => return Ok(None),
        d => bail!("unsupported .npy dtype {d}"),
    }))
}

/// The `descr` code of a dtype, for writing.
fn descr(dt: DatumType) -> Result<&'static str> {
    Ok(match dt {
        DatumType::F16 => "<f2",
        DatumType::F32 => "<f4",
        DatumType::F64 => "<f8",
        DatumType::I8 => "|i1",
        DatumType::I16 => "<i2",
        DatumType::I32 => "<i4",
        DatumType::I64 => "<i8",
        DatumType::U8 => "|u1",
        DatumType::U16 => "<u2",
        DatumType::U32 => "<u4",
        DatumType::U64 => "<u8",
        DatumType::Bool => "|b1",
        dt => bail!("no .npy code for {dt:?}"),
    })
}

/// The value of `key` in the header dict, up to the next top-level comma or brace.
fn header_field<'h>(header: &'h str, key: &str) -> Result<&'h str> {
    let start = header
        .find(&format!("'{key}':"))
        .with_context(|| format!("no '{key}' in .npy header"))?
        + key.len()
        + 3;
    let rest = header[start..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').context("unclosed shape")? + 1
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Ok(rest[..end].trim())
}

pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.starts_with(b"\x93NUMPY"),
        "{} is not .npy",
        path.display()
    );
    let (header_len, header_start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes(bytes[8..12].try_into()?) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[header_start..header_start + header_len])?;
    let data = &bytes[header_start + header_len..];
    let code = header_field(header, "descr")?.trim_matches('\'');
    ensure!(
        header_field(header, "fortran_order")? == "False",
        "Fortran order"
    );
    let shape: Vec<usize> = header_field(header, "shape")?
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    match datum_type(code)? {
        Some(dt) => unsafe { Tensor::from_raw_dt(dt, &shape, data) },
        None => strings(code, &shape, data),
    }
}

/// A `<U<width>` array: UTF-32 code points, NUL-padded to the width.
fn strings(code: &str, shape: &[usize], data: &[u8]) -> Result<Tensor> {
    let width: usize = code[2..].parse()?;
    let texts: Vec<String> = data
        .chunks(4 * width.max(1))
        .take(shape.iter().product())
        .map(|chunk| {
            chunk
                .chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .take_while(|&c| c != 0)
                .filter_map(char::from_u32)
                .collect()
        })
        .collect();
    Ok(tract_ndarray::ArrayD::from_shape_vec(shape, texts)?.into_tensor())
}

pub fn write(path: &Path, tensor: &Tensor) -> Result<()> {
    let shape: String = tensor.shape().iter().map(|d| format!("{d},")).collect();
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({shape}), }}",
        descr(tensor.datum_type())?
    );
    // The header, with the 10-byte preamble, pads to a multiple of 64 and ends in a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(tensor.as_bytes());
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
