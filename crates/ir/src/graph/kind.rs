//! What a value flowing along an edge is. ONNX values are tensors, sequences of tensors, or
//! optionals holding either; pipecut plans, exports and runs tensors on every backend, and
//! runs sequences and optionals on the CPU reference runtime only.

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
}

impl ValueKind {
    /// The optional holding a value of this kind (an optional stays itself).
    pub fn optional(self) -> ValueKind {
        match self {
            ValueKind::Tensor | ValueKind::OptionalTensor => ValueKind::OptionalTensor,
            ValueKind::Sequence | ValueKind::OptionalSequence => ValueKind::OptionalSequence,
        }
    }

    /// The kind an optional holds (a non-optional stays itself).
    pub fn unwrap_optional(self) -> ValueKind {
        match self {
            ValueKind::Tensor | ValueKind::OptionalTensor => ValueKind::Tensor,
            ValueKind::Sequence | ValueKind::OptionalSequence => ValueKind::Sequence,
        }
    }

    /// Whether the value is a plain tensor.
    pub fn is_tensor(self) -> bool {
        self == ValueKind::Tensor
    }
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueKind::Tensor => "tensor",
            ValueKind::Sequence => "sequence",
            ValueKind::OptionalTensor => "optional tensor",
            ValueKind::OptionalSequence => "optional sequence",
        })
    }
}
