//! What a value flowing along an edge is. ONNX values are tensors, sequences of tensors,
//! optionals holding either, and the `ai.onnx.ml` domain's maps (DictVectorizer's and CastMap's
//! input) and sequences of maps (ZipMap's output); pipecut plans, exports and runs tensors on
//! every backend, and runs the others on the CPU reference runtime only.

use crate::graph::DType;

use std::fmt;

/// The kind of a graph value. A sequence's or optional's dtype and shape (on [`super::Tensor`])
/// are those of the tensors it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// A tensor.
    #[default]
    Tensor,
    /// A sequence of tensors of one element type.
    Sequence,
    /// A tensor or nothing.
    OptionalTensor,
    /// A sequence or nothing.
    OptionalSequence,
    /// A map from `key` (int64 or string) to the value's dtype; its shape is `[entries]`.
    Map {
        /// The keys' dtype.
        key: DType,
    },
    /// A sequence of maps from `key` to the value's dtype (ZipMap's output, one map per row);
    /// its shape is `[entries]`, the entries of every map.
    MapSequence {
        /// The keys' dtype.
        key: DType,
    },
}

impl ValueKind {
    /// The optional holding a value of this kind (an optional stays itself).
    pub fn optional(self) -> ValueKind {
        match self {
            ValueKind::Tensor | ValueKind::OptionalTensor => ValueKind::OptionalTensor,
            ValueKind::Sequence | ValueKind::OptionalSequence => ValueKind::OptionalSequence,
            // ONNX has optional maps in no operator; a map stays a map.
            map @ (ValueKind::Map { .. } | ValueKind::MapSequence { .. }) => map,
        }
    }

    /// The kind an optional holds (a non-optional stays itself).
    pub fn unwrap_optional(self) -> ValueKind {
        match self {
            ValueKind::Tensor | ValueKind::OptionalTensor => ValueKind::Tensor,
            ValueKind::Sequence | ValueKind::OptionalSequence => ValueKind::Sequence,
            map @ (ValueKind::Map { .. } | ValueKind::MapSequence { .. }) => map,
        }
    }

    /// Whether the value is a plain tensor.
    pub fn is_tensor(self) -> bool {
        self == ValueKind::Tensor
    }
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueKind::Tensor => f.write_str("tensor"),
            ValueKind::Sequence => f.write_str("sequence"),
            ValueKind::OptionalTensor => f.write_str("optional tensor"),
            ValueKind::OptionalSequence => f.write_str("optional sequence"),
            ValueKind::Map { key } => write!(f, "map from {key}"),
            ValueKind::MapSequence { key } => write!(f, "sequence of maps from {key}"),
        }
    }
}
