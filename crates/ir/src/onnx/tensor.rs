//! Decoding `TensorProto` (initializers, tensor attributes) and `TypeProto` into IR types,
//! without ever reading external data.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::proto::tensor_shape_proto::dimension;
use super::proto::{type_proto, TensorProto, TypeProto, DATA_LOCATION_EXTERNAL};

use super::model::MissingExternalData;
use crate::graph::{
    ConstValue, DType, Dim, Param, Shape, Storage, SymInt, TensorLiteral, ValueKind,
    MAX_TRACKED_ELEMENTS,
};
use crate::Error;

/// A decoded tensor proto: everything the planner needs, and the value when small.
pub struct DecodedTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub dims: Vec<u64>,
    /// Size of the data.
    pub bytes: u64,
    /// Where the data lives (inline, or an external file's range).
    pub storage: Storage,
    /// The elements, when small enough to track at plan time.
    pub value: Option<ConstValue>,
}

impl DecodedTensor {
    /// The tensor as a constant of the graph.
    pub fn into_literal(self) -> TensorLiteral {
        TensorLiteral {
            dtype: self.dtype,
            dims: self.dims,
            value: self.value,
        }
    }

    /// The tensor as a weight of the graph.
    pub fn param(&self) -> Param {
        Param {
            bytes: self.bytes,
            storage: self.storage.clone(),
        }
    }
}

/// Resolves and checks external-data files, remembering each file's length so a model with
/// thousands of external tensors stats each file once.
pub struct ExternalFiles {
    base_dir: Option<PathBuf>,
    canonical_base: Option<PathBuf>,
    /// Each file's length as first looked up, `None` for an absent one: the million-node stack
    /// of `benches/scale.sh` names one absent file from 390,245 initializers, and asking the
    /// filesystem again for each was 2% of its load's samples in `perf record`.
    lengths: HashMap<PathBuf, Option<u64>>,
    /// References whose file does not exist: planning needs only their metadata (dtype and
    /// dims, from the protobuf), so they are collected for the caller to warn about or refuse.
    pub missing: Vec<MissingExternalData>,
}

impl ExternalFiles {
    /// External paths resolve under `base_dir` (the model's folder; `None` for bytes).
    pub fn new(base_dir: Option<PathBuf>) -> ExternalFiles {
        let canonical_base = base_dir.as_ref().and_then(|d| d.canonicalize().ok());
        ExternalFiles {
            base_dir,
            canonical_base,
            lengths: HashMap::new(),
            missing: Vec::new(),
        }
    }

    /// Records the reference of `tensor` to the absent file at `path`; returns the path.
    fn missing(&mut self, tensor: &str, location: &str, path: PathBuf) -> PathBuf {
        self.missing.push(MissingExternalData {
            tensor: tensor.to_string(),
            location: location.to_string(),
            path: path.clone(),
        });
        path
    }

    /// Checks that `location` stays inside the model's directory, exists, and is long enough.
    /// Only file metadata is read, never contents.
    fn resolve(
        &mut self,
        tensor: &str,
        location: &str,
        offset: u64,
        length: u64,
    ) -> Result<PathBuf, Error> {
        let fail = |detail: String| Error::ExternalData {
            tensor: tensor.to_string(),
            location: location.to_string(),
            detail,
        };
        let relative = Path::new(location);
        if location.is_empty() {
            return Err(fail("the location is empty".into()));
        }
        // The ONNX spec requires a path relative to the model's directory; anything that climbs
        // out of it (`..`, absolute paths, drive prefixes) is refused before the filesystem is asked.
        if relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(fail(
                "the path leaves the model's directory; refusing to read it".into(),
            ));
        }
        let base = self.base_dir.as_ref().ok_or_else(|| {
            fail("the model was loaded from bytes without an external-data directory".into())
        })?;
        let path = base.join(relative);
        let file_len = match self.lengths.get(&path) {
            Some(&Some(len)) => len,
            Some(None) => return Ok(self.missing(tensor, location, path)),
            None => {
                // Absent (no file and no dangling link at the path): recorded, never read. The
                // checks above already refused a location outside the directory.
                if let Err(e) = std::fs::symlink_metadata(&path) {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        self.lengths.insert(path.clone(), None);
                        return Ok(self.missing(tensor, location, path));
                    }
                }
                let meta = std::fs::metadata(&path)
                    .map_err(|e| fail(format!("cannot open '{}': {e}", path.display())))?;
                // A symbolic link inside the directory may still point outside it.
                if let (Some(canonical_base), Ok(canonical)) =
                    (&self.canonical_base, path.canonicalize())
                {
                    if !canonical.starts_with(canonical_base) {
                        return Err(fail(
                            "the file resolves outside the model's directory; refusing to read it"
                                .into(),
                        ));
                    }
                }
                if !meta.is_file() {
                    return Err(fail(format!("'{}' is not a regular file", path.display())));
                }
                self.lengths.insert(path.clone(), Some(meta.len()));
                meta.len()
            }
        };
        let end = offset
            .checked_add(length)
            .ok_or_else(|| fail("offset + length overflows".into()))?;
        if end > file_len {
            return Err(fail(format!(
                "needs bytes {offset}..{end} but '{}' has {file_len} bytes",
                path.display()
            )));
        }
        Ok(path)
    }
}

/// Where a tensor's external data lives, from its `external_data` entries.
pub struct ExternalRef {
    /// The file, relative to the model's directory (not yet checked).
    pub location: String,
    /// The first byte.
    pub offset: u64,
    /// The byte count, when given.
    pub length: Option<u64>,
}

impl ExternalRef {
    /// The reference of an external tensor, `None` for one stored inline. A key listed twice is
    /// refused: readers disagree on which one counts (the loader took the last, the exporter the
    /// first), and that disagreement let a checked location stand in for an unchecked one.
    pub fn of(proto: &TensorProto) -> Result<Option<ExternalRef>, Error> {
        if proto.data_location != DATA_LOCATION_EXTERNAL {
            return Ok(None);
        }
        let name = &proto.name;
        let mut location: Option<String> = None;
        let mut offset: Option<u64> = None;
        let mut length: Option<u64> = None;
        for entry in &proto.external_data {
            let fail = |location: &Option<String>, detail: String| Error::ExternalData {
                tensor: name.clone(),
                location: location.clone().unwrap_or_default(),
                detail,
            };
            let count = || {
                entry.value.parse::<u64>().map_err(|_| {
                    let v = &entry.value;
                    fail(
                        &location,
                        format!("'{}' is not a byte count: '{v}'", entry.key),
                    )
                })
            };
            let already = match entry.key.as_str() {
                "location" => location.replace(entry.value.clone()).is_some(),
                "offset" => offset.replace(count()?).is_some(),
                "length" => length.replace(count()?).is_some(),
                _ => false,
            };
            if already {
                let detail = format!(
                    "the key '{}' is listed twice; refusing an ambiguous reference",
                    entry.key
                );
                return Err(fail(&location, detail));
            }
        }
        let location = location.ok_or_else(|| Error::ExternalData {
            tensor: name.clone(),
            location: String::new(),
            detail: "no 'location' entry".into(),
        })?;
        Ok(Some(ExternalRef {
            location,
            offset: offset.unwrap_or(0),
            length,
        }))
    }
}

/// Decodes a tensor proto's metadata and, for small numeric tensors stored inline, its value.
pub fn decode_tensor(
    proto: &TensorProto,
    external: &mut ExternalFiles,
) -> Result<DecodedTensor, Error> {
    let name = &proto.name;
    let dtype = DType::from_onnx(proto.data_type).ok_or_else(|| {
        Error::InvalidModel(format!(
            "tensor '{name}' has unknown data type {}",
            proto.data_type
        ))
    })?;
    let dims = proto
        .dims
        .iter()
        .map(|&d| {
            u64::try_from(d).map_err(|_| Error::InvalidDim {
                tensor: name.clone(),
                detail: format!("dimension {d} is negative"),
            })
        })
        .collect::<Result<Vec<u64>, Error>>()?;
    let elements = crate::graph::checked_element_count(&dims).ok_or_else(|| Error::InvalidDim {
        tensor: name.clone(),
        detail: format!("dims {dims:?} hold more elements than fit in 64 bits"),
    })?;
    let bytes = dtype.bytes_for(elements).ok_or_else(|| Error::InvalidDim {
        tensor: name.clone(),
        detail: format!(
            "dims {dims:?} ({elements} elements of {dtype}) need more bytes than fit in 64 bits"
        ),
    })?;

    if let Some(reference) = ExternalRef::of(proto)? {
        let ExternalRef {
            location,
            offset,
            length,
        } = reference;
        let length = length.unwrap_or(bytes);
        if length < bytes {
            return Err(Error::ExternalData {
                tensor: name.clone(),
                location,
                detail: format!("length {length} is smaller than the {bytes} bytes its dims need"),
            });
        }
        let path = external.resolve(name, &location, offset, length)?;
        return Ok(DecodedTensor {
            dtype,
            dims,
            bytes,
            storage: Storage::External {
                path,
                offset,
                length,
            },
            value: None,
        });
    }

    check_inline_size(proto, dtype, elements, bytes)?;
    let value = if elements <= MAX_TRACKED_ELEMENTS {
        inline_value(proto, dtype)
    } else {
        None
    };
    Ok(DecodedTensor {
        dtype,
        dims,
        bytes,
        storage: Storage::Embedded,
        value,
    })
}

/// Refuses inline data whose length disagrees with the dims, so that later phases can trust
/// `bytes` and a runtime never reads past the end.
fn check_inline_size(
    proto: &TensorProto,
    dtype: DType,
    elements: u64,
    bytes: u64,
) -> Result<(), Error> {
    let bad = |found: String| {
        Err(Error::InvalidModel(format!(
            "initializer '{}' ({dtype}, {elements} elements) stores {found}",
            proto.name
        )))
    };
    if !proto.raw_data.is_empty() {
        if proto.raw_data.len() as u64 != bytes {
            return bad(format!(
                "{} raw bytes but its dims need {bytes}",
                proto.raw_data.len()
            ));
        }
        return Ok(());
    }
    let typed = proto.float_data.len()
        + proto.int32_data.len()
        + proto.int64_data.len()
        + proto.double_data.len()
        + proto.uint64_data.len()
        + proto.string_data.len();
    // Complex numbers store two floats per element; 4-bit types pack two per int32 slot, 2-bit
    // types four.
    let expected = match dtype {
        DType::Complex64 | DType::Complex128 => elements.saturating_mul(2),
        DType::I4 | DType::U4 | DType::F4E2M1 => elements.div_ceil(2),
        DType::I2 | DType::U2 => elements.div_ceil(4),
        _ => elements,
    };
    if typed == 0 && elements > 0 {
        // No data at all: the declared size is all there is, and it is never allocated.
        return bad(format!(
            "no data (neither raw_data nor typed values) for its {}",
            crate::onnx::inspect::human_bytes(bytes)
        ));
    }
    if typed as u64 != expected && !(typed == 0 && elements == 0) {
        return bad(format!("{typed} typed values"));
    }
    Ok(())
}

fn inline_value(proto: &TensorProto, dtype: DType) -> Option<ConstValue> {
    use DType::*;
    let raw = &proto.raw_data;
    let ints = |v: Vec<i64>| Some(ConstValue::Ints(v.into_iter().map(SymInt::Lit).collect()));
    if !raw.is_empty() {
        return match dtype {
            I64 => ints(
                raw.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            I32 => ints(
                raw.chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            U32 => ints(
                raw.chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            I16 => ints(
                raw.chunks_exact(2)
                    .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            U16 => ints(
                raw.chunks_exact(2)
                    .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            I8 => ints(raw.iter().map(|&b| b as i8 as i64).collect()),
            U8 | Bool => ints(raw.iter().map(|&b| b as i64).collect()),
            U64 => ints(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            F32 => floats(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64),
            ),
            F64 => floats(
                raw.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap())),
            ),
            F16 => floats(
                raw.chunks_exact(2)
                    .map(|c| f16_to_f64(u16::from_le_bytes([c[0], c[1]]))),
            ),
            BF16 => floats(
                raw.chunks_exact(2)
                    .map(|c| bf16_to_f64(u16::from_le_bytes([c[0], c[1]]))),
            ),
            _ => None,
        };
    }
    match dtype {
        I64 => ints(proto.int64_data.clone()),
        I32 | I16 | I8 | U16 | U8 | Bool => {
            ints(proto.int32_data.iter().map(|&v| v as i64).collect())
        }
        U32 | U64 => ints(proto.uint64_data.iter().map(|&v| v as i64).collect()),
        F32 => floats(proto.float_data.iter().map(|&v| v as f64)),
        F64 => floats(proto.double_data.iter().copied()),
        F16 => floats(proto.int32_data.iter().map(|&v| f16_to_f64(v as u16))),
        BF16 => floats(proto.int32_data.iter().map(|&v| bf16_to_f64(v as u16))),
        // Not UTF-8: no value (the text ops refuse it when they run).
        String => proto
            .string_data
            .iter()
            .map(|bytes| std::string::String::from_utf8(bytes.clone()).ok())
            .collect::<Option<_>>()
            .map(ConstValue::Strings),
        _ => None,
    }
}

fn floats(values: impl Iterator<Item = f64>) -> Option<ConstValue> {
    Some(ConstValue::Floats(values.collect()))
}

/// Kind, element type and element shape of a `TypeProto`: a tensor, a sequence of tensors, an
/// optional of either, a map or a sequence of maps (the map's value dtype; the number of entries
/// is not typed); sparse tensors decode as an untyped tensor, as before. No type (`None`) is an
/// untyped tensor.
pub(crate) fn decode_value_type(
    tensor: &str,
    ty: Option<&TypeProto>,
) -> Result<(ValueKind, Option<DType>, Option<Shape>), Error> {
    let element = |inner: &Option<Box<TypeProto>>| match inner.as_deref() {
        Some(inner) => decode_value_type(tensor, Some(inner)),
        None => Ok((ValueKind::Tensor, None, None)),
    };
    match ty.and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::SequenceType(seq)) => {
            let (kind, dtype, shape) = element(&seq.elem_type)?;
            match kind {
                ValueKind::Map { key } => Ok((ValueKind::MapSequence { key }, dtype, None)),
                _ => Ok((ValueKind::Sequence, dtype, shape)),
            }
        }
        Some(type_proto::Value::MapType(map)) => {
            let key = DType::from_onnx(map.key_type).ok_or_else(|| Error::InvalidDim {
                tensor: tensor.to_string(),
                detail: format!("its map key type {} is not an ONNX type", map.key_type),
            })?;
            let (_, dtype, _) = element(&map.value_type)?;
            Ok((ValueKind::Map { key }, dtype, None))
        }
        Some(type_proto::Value::OptionalType(opt)) => {
            let (kind, dtype, shape) = element(&opt.elem_type)?;
            Ok((kind.optional(), dtype, shape))
        }
        _ => {
            let (dtype, shape) = decode_type(tensor, ty)?;
            Ok((ValueKind::Tensor, dtype, shape))
        }
    }
}

/// Element type and shape of a `TypeProto`, for tensor types. Unnamed dims (no value, `?`, or
/// -1) get the name `<tensor>.<axis>` so that the user can still bind them (`--dim x.0=8`).
pub(crate) fn decode_type(
    tensor: &str,
    ty: Option<&TypeProto>,
) -> Result<(Option<DType>, Option<Shape>), Error> {
    let Some(type_proto::Value::TensorType(tt)) = ty.and_then(|t| t.value.as_ref()) else {
        return Ok((None, None));
    };
    let dtype = DType::from_onnx(tt.elem_type);
    let Some(shape) = tt.shape.as_ref() else {
        return Ok((dtype, None));
    };
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(axis, d)| match &d.value {
            // Paddle2ONNX and some older exporters write -1 for a dynamic dim, as onnxruntime
            // reads it; any other negative value is an error.
            Some(dimension::Value::DimValue(-1)) => Ok(Dim::sym(&format!("{tensor}.{axis}"))),
            Some(dimension::Value::DimValue(v)) => {
                u64::try_from(*v)
                    .map(Dim::Known)
                    .map_err(|_| Error::InvalidDim {
                        tensor: tensor.to_string(),
                        detail: format!("dimension {axis} is {v}, which is negative"),
                    })
            }
            // "?" is used by several exporters for unrelated unknown dims: treat it as unnamed.
            Some(dimension::Value::DimParam(p)) if !p.is_empty() && p != "?" => Ok(Dim::sym(p)),
            _ => Ok(Dim::sym(&format!("{tensor}.{axis}"))),
        })
        .collect::<Result<Shape, Error>>()?;
    Ok((dtype, Some(dims)))
}

/// An IEEE 754 half-precision value, from its bits. Written out rather than taken from the `half`
/// crate, whose 2.7 release made `zerocopy` a required dependency: 6 s of the planner's clean
/// build for two conversions (the test checks all 65,536 values against `half`).
fn f16_to_f64(bits: u16) -> f64 {
    let negative = bits & 0x8000 != 0;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match exponent {
        // Zero and subnormals: mantissa × 2^-24, exact in f64.
        0 => f64::from(mantissa) * 2f64.powi(-24),
        // Infinities and NaNs keep their payload in the f32's top mantissa bits.
        0x1f => f64::from(f32::from_bits(0x7f80_0000 | (mantissa << 13))),
        _ => f64::from(f32::from_bits(((exponent + 112) << 23) | (mantissa << 13))),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// A bfloat16 value, from its bits: the top half of an f32.
fn bf16_to_f64(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file found absent stays absent for the rest of the load (each of a million-node
    /// model's 390,000 references once asked the filesystem), and every reference to it is
    /// still recorded for the warning and for `require_external_data`.
    #[test]
    fn an_absent_file_is_looked_up_once_and_every_reference_recorded() {
        let dir = std::env::temp_dir().join(format!("pipecut-absent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = ExternalFiles::new(Some(dir.clone()));
        let first = files.resolve("w0", "weights.bin", 0, 16).unwrap();
        // Appearing later does not change the answer: the first lookup stands.
        std::fs::write(&first, [0u8; 16]).unwrap();
        let second = files.resolve("w1", "weights.bin", 16, 16).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(first, second);
        let tensors: Vec<&str> = files.missing.iter().map(|m| m.tensor.as_str()).collect();
        assert_eq!(tensors, ["w0", "w1"]);
    }

    #[test]
    fn half_precision_bits_convert_as_the_half_crate_does() {
        for bits in 0..=u16::MAX {
            let (ours, theirs) = (f16_to_f64(bits), half::f16::from_bits(bits).to_f64());
            assert!(
                ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
                "f16 {bits:#06x}: {ours} against {theirs}"
            );
            let (ours, theirs) = (bf16_to_f64(bits), half::bf16::from_bits(bits).to_f64());
            assert!(
                ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
                "bf16 {bits:#06x}: {ours} against {theirs}"
            );
        }
    }
}
