//! A runtime value of any ONNX kind: a tensor, a sequence of tensors, or an optional. Only the
//! CPU reference runtime holds sequences and optionals; pipeline stages exchange tensors.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::tensor::HostTensor;
use pipecut_ir::graph::ValueKind;

/// A value a node reads or writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A tensor.
    Tensor(Arc<HostTensor>),
    /// A sequence of tensors, in order.
    Sequence(Vec<Arc<HostTensor>>),
    /// An optional: a tensor or sequence, or nothing.
    Optional(Option<Box<Value>>),
    /// A sequence of maps that share their keys (ZipMap's output): `keys` is `[C]`, and row
    /// `i` of `values` (`[N, C]`) holds map `i`'s values in the keys' order.
    MapSequence {
        /// The keys of every map, `[C]` int64 or strings.
        keys: Arc<HostTensor>,
        /// One row per map.
        values: Arc<HostTensor>,
    },
}

/// Values by name (the graph inputs and outputs of [`super::CpuExecutor::run_model_values`]).
pub type Values = BTreeMap<String, Value>;

impl Value {
    /// Bytes of the tensors it holds, in the runtime's dtypes.
    pub fn byte_len(&self) -> u64 {
        let tensor = |t: &HostTensor| t.dtype().bytes_for(t.len() as u64).unwrap_or(0);
        match self {
            Value::Tensor(t) => tensor(t),
            Value::Sequence(items) => items.iter().map(|t| tensor(t)).sum(),
            Value::Optional(inner) => inner.as_deref().map_or(0, Value::byte_len),
            Value::MapSequence { keys, values } => tensor(keys) + tensor(values),
        }
    }

    /// The kind of value, as the graph names it (an empty optional counts as an optional tensor).
    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Tensor(_) => ValueKind::Tensor,
            Value::Sequence(_) => ValueKind::Sequence,
            Value::Optional(Some(inner)) => inner.kind().optional(),
            Value::Optional(None) => ValueKind::OptionalTensor,
            Value::MapSequence { keys, .. } => ValueKind::MapSequence { key: keys.dtype() },
        }
    }

    /// The tensor, or an error naming what the value is instead.
    pub fn tensor(&self) -> Result<&Arc<HostTensor>, String> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(format!("expected a tensor, got a {}", other.kind())),
        }
    }

    /// The sequence's elements, or an error naming what the value is instead.
    pub fn sequence(&self) -> Result<&[Arc<HostTensor>], String> {
        match self {
            Value::Sequence(s) => Ok(s),
            other => Err(format!("expected a sequence, got a {}", other.kind())),
        }
    }
}
