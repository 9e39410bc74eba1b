//! The values a stage's run holds on the CUDA backend: a tensor in device memory
//! ([`DeviceTensor`]), or a host tensor with its device copy once made, or an optional
//! ([`Value`]). Every device op reads and makes these; bringing one back to the host is here,
//! sending one to the device is the launch context's (`operands.rs`).

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream};

use super::staging;
use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::DType;

/// A float tensor in device memory, or a boolean one (`mask`) held as floats 0 and 1
/// (`masks.rs`): a comparison's result stays on the device for the Where that reads it; or an
/// integer one (`int`, its host dtype) held as floats exact within ±2²⁴, a large broadcast of
/// host integers (`integers.rs`). The buffer is shared, so reshapes and identities are free.
#[derive(Debug, Clone)]
pub(crate) struct DeviceTensor {
    pub(super) shape: Vec<usize>,
    pub(super) data: Arc<CudaSlice<f32>>,
    pub(super) mask: bool,
    /// `Some(I32, I64, U8 or I8)`: integers, which only the ops of `integers.rs`, comparisons
    /// and views take; every other op reads them on the host.
    pub(super) int: Option<DType>,
}

impl DeviceTensor {
    pub(super) fn new(shape: Vec<usize>, data: CudaSlice<f32>) -> DeviceTensor {
        DeviceTensor {
            shape,
            data: Arc::new(data),
            mask: false,
            int: None,
        }
    }

    /// An integer tensor of `dtype` (I32, I64, U8 or I8) whose values, exact in f32, are `data`.
    pub(super) fn integers(shape: Vec<usize>, data: CudaSlice<f32>, dtype: DType) -> Self {
        DeviceTensor {
            int: Some(dtype),
            ..DeviceTensor::new(shape, data)
        }
    }

    /// A boolean tensor whose elements are the floats 0 and 1 of `data`.
    pub(super) fn mask(shape: Vec<usize>, data: CudaSlice<f32>) -> DeviceTensor {
        DeviceTensor {
            mask: true,
            ..DeviceTensor::new(shape, data)
        }
    }
}

/// A value during a stage's run: where it was made. A host float tensor keeps its device copy
/// once a device op has needed it (shared by every clone of the value), so a stage input read by
/// several ops is uploaded once.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Host(Arc<HostTensor>, Arc<OnceLock<DeviceTensor>>),
    Device(DeviceTensor),
    /// An optional (`Optional`, an `If` branch's or a body's): a value where it was made, or
    /// nothing. Only the flow ops and Identity take one; stages exchange tensors.
    Optional(Option<Box<Value>>),
}

impl Value {
    /// A host value, not uploaded yet.
    pub(crate) fn host(tensor: Arc<HostTensor>) -> Value {
        Value::Host(tensor, Arc::default())
    }

    /// Whether it is a float tensor, or a device tensor other than integers (a mask on the
    /// device is copied back as a float tensor would be).
    pub(super) fn is_float(&self) -> bool {
        match self {
            Value::Host(t, _) => t.dtype() == DType::F32,
            Value::Device(t) => t.int.is_none(),
            Value::Optional(inner) => inner.as_deref().is_some_and(Value::is_float),
        }
    }

    /// The tensor's shape (an optional's element's; an empty optional's is `[]`).
    pub(super) fn shape(&self) -> &[usize] {
        match self {
            Value::Host(t, _) => t.shape(),
            Value::Device(t) => &t.shape,
            Value::Optional(inner) => inner.as_deref().map_or(&[], Value::shape),
        }
    }

    /// Bytes of the tensor, wherever it is.
    pub(super) fn byte_len(&self) -> u64 {
        match self {
            Value::Host(t, _) => t.dtype().bytes_for(t.len() as u64).unwrap_or(0),
            Value::Device(t) => t.data.len() as u64 * 4,
            Value::Optional(inner) => inner.as_deref().map_or(0, Value::byte_len),
        }
    }

    /// The host form (downloaded from the device when needed; waits for the stream).
    pub(super) fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Arc<HostTensor>, String> {
        match self {
            Value::Host(t, _) => Ok(Arc::clone(t)),
            Value::Device(t) => {
                let values = staging::download(stream, &t.data)
                    .map_err(|e| format!("CUDA device-to-host copy: {e}"))?;
                let data = if let Some(dtype) = t.int {
                    to_host_data(values, dtype)
                } else if t.mask {
                    TensorData::Bool(values.into_iter().map(|v| v != 0.0).collect())
                } else {
                    TensorData::F32(values)
                };
                Ok(Arc::new(HostTensor::new(t.shape.clone(), data)?))
            }
            Value::Optional(_) => Err("an optional where a tensor is needed".into()),
        }
    }
}

/// The host form of an integer device tensor's values (downloaded as floats): its dtype's, one
/// byte each for uint8 and int8 (wrapping, as the CPU runtime's integer arithmetic does).
pub(super) fn to_host_data(values: Vec<f32>, dtype: DType) -> TensorData {
    match dtype {
        DType::I32 => TensorData::I32(values.into_iter().map(|v| v as i32).collect()),
        DType::U8 => TensorData::U8(values.into_iter().map(|v| v as i64 as u8).collect()),
        DType::I8 => TensorData::I8(values.into_iter().map(|v| v as i64 as i8).collect()),
        _ => TensorData::I64(values.into_iter().map(|v| v as i64).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_come_back_in_their_dtype() {
        let values = vec![-16_777_216.0, -1.0, 0.0, 256.0, 16_777_216.0];
        assert_eq!(
            to_host_data(values.clone(), DType::I32),
            TensorData::I32(vec![-16_777_216, -1, 0, 256, 16_777_216])
        );
        assert_eq!(
            to_host_data(values, DType::I64),
            TensorData::I64(vec![-16_777_216, -1, 0, 256, 16_777_216])
        );
        let bytes = vec![0.0, 255.0, 256.0, -1.0];
        assert_eq!(
            to_host_data(bytes.clone(), DType::U8),
            TensorData::U8(vec![0, 255, 0, 255])
        );
        assert_eq!(
            to_host_data(bytes, DType::I8),
            TensorData::I8(vec![0, -1, 0, -1])
        );
    }
}
