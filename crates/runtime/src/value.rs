//! A runtime value of any ONNX kind: a tensor, a sequence of tensors, an optional, or the
//! `ai.onnx.ml` domain's maps and sequences of maps. Only the CPU reference runtime holds
//! values other than tensors; pipeline stages exchange tensors.

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
    /// A map (DictVectorizer's and CastMap's input): `keys` `[K]` int64 or strings, distinct and
    /// ascending, as onnxruntime's `std::map` holds and iterates them (CastMap's dense output
    /// follows that order); `values` `[K]`, entry `i` the value of key `i`.
    Map {
        /// The keys, distinct and ascending (strings by their bytes).
        keys: Arc<HostTensor>,
        /// The values, in the keys' order.
        values: Arc<HostTensor>,
    },
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
            Value::Map { keys, values } | Value::MapSequence { keys, values } => {
                tensor(keys) + tensor(values)
            }
        }
    }

    /// The kind of value, as the graph names it (an empty optional counts as an optional tensor).
    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Tensor(_) => ValueKind::Tensor,
            Value::Sequence(_) => ValueKind::Sequence,
            Value::Optional(Some(inner)) => inner.kind().optional(),
            Value::Optional(None) => ValueKind::OptionalTensor,
            Value::Map { keys, .. } => ValueKind::Map { key: keys.dtype() },
            Value::MapSequence { keys, .. } => ValueKind::MapSequence { key: keys.dtype() },
        }
    }

    /// A map from `keys` to `values` (`[K]` each), sorted by key; an error on a repeated key
    /// or lengths that differ.
    pub fn map(keys: HostTensor, values: HostTensor) -> Result<Value, String> {
        use crate::tensor::TensorData;
        if keys.rank() != 1 || values.shape() != keys.shape() {
            return Err(format!(
                "a map's keys {:?} and values {:?} must be [K] each",
                keys.shape(),
                values.shape()
            ));
        }
        let order: Vec<usize> = match keys.data() {
            TensorData::I64(k) => sorted_distinct(k)?,
            TensorData::String(k) => sorted_distinct(k)?,
            _ => {
                return Err(format!(
                    "a map's keys are int64 or strings, not {}",
                    keys.dtype()
                ))
            }
        };
        Ok(Value::Map {
            keys: Arc::new(reordered(&keys, &order)),
            values: Arc::new(reordered(&values, &order)),
        })
    }

    /// The map's keys and values, or an error naming what the value is instead.
    pub fn as_map(&self) -> Result<(&HostTensor, &HostTensor), String> {
        match self {
            Value::Map { keys, values } => Ok((keys, values)),
            other => Err(format!("expected a map, got a {}", other.kind())),
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

/// The positions of `keys` in ascending order; an error naming a key that appears twice.
fn sorted_distinct<K: Ord + std::fmt::Display>(keys: &[K]) -> Result<Vec<usize>, String> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    match order.windows(2).find(|w| keys[w[0]] == keys[w[1]]) {
        Some(w) => Err(format!("key '{}' appears twice in the map", keys[w[0]])),
        None => Ok(order),
    }
}

/// The elements of a `[K]` tensor in the order `order` gives.
fn reordered(tensor: &HostTensor, order: &[usize]) -> HostTensor {
    use crate::tensor::TensorData;
    fn pick<T: Clone>(items: &[T], order: &[usize]) -> Vec<T> {
        order.iter().map(|&i| items[i].clone()).collect()
    }
    let data = match tensor.data() {
        TensorData::F32(v) => TensorData::F32(pick(v, order)),
        TensorData::I64(v) => TensorData::I64(pick(v, order)),
        TensorData::I32(v) => TensorData::I32(pick(v, order)),
        TensorData::Bool(v) => TensorData::Bool(pick(v, order)),
        TensorData::String(v) => TensorData::String(pick(v, order)),
        TensorData::U8(v) => TensorData::U8(pick(v, order)),
        TensorData::I8(v) => TensorData::I8(pick(v, order)),
    };
    HostTensor::with_data(vec![order.len()], data)
}
