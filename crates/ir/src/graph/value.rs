//! Tensor values known while planning: the small integer and float tensors that exported models
//! use to compute shapes (`Shape → Gather → Unsqueeze → Concat → Reshape`).

use std::fmt;

use super::types::{Dim, SymDim};

/// One element of an integer tensor known at plan time: a literal, or a symbolic size that came
/// from a `Shape` of a tensor with unbound dims.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SymInt {
    /// A concrete integer.
    Lit(i64),
    /// A symbolic (non-negative) size.
    Sym(SymDim),
}

impl SymInt {
    /// The literal, if concrete.
    pub fn lit(&self) -> Option<i64> {
        match self {
            SymInt::Lit(v) => Some(*v),
            SymInt::Sym(_) => None,
        }
    }

    /// Interpret as a dimension (negative literals are not dims).
    pub fn to_dim(&self) -> Option<Dim> {
        match self {
            SymInt::Lit(v) => u64::try_from(*v).ok().map(Dim::Known),
            SymInt::Sym(s) => Some(Dim::Sym(s.clone())),
        }
    }
}

impl From<&Dim> for SymInt {
    fn from(d: &Dim) -> SymInt {
        match d {
            // Sizes above i64::MAX cannot come from a valid model; saturate rather than wrap.
            Dim::Known(v) => SymInt::Lit(i64::try_from(*v).unwrap_or(i64::MAX)),
            Dim::Sym(s) => SymInt::Sym(s.clone()),
        }
    }
}

impl fmt::Display for SymInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SymInt::Lit(v) => write!(f, "{v}"),
            SymInt::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// The contents of a tensor known at plan time, in row-major order. Its shape is the tensor's.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstValue {
    /// Integer and boolean tensors (booleans as 0/1).
    Ints(Vec<SymInt>),
    /// Floating-point tensors, widened to f64.
    Floats(Vec<f64>),
    /// String tensors (the text ops' inputs, string-keyed attributes), which carry no shape
    /// arithmetic but decide output sizes (`StringSplit`, `StringNormalizer`).
    Strings(Vec<String>),
}

impl ConstValue {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ConstValue::Ints(v) => v.len(),
            ConstValue::Floats(v) => v.len(),
            ConstValue::Strings(v) => v.len(),
        }
    }

    /// Whether the value has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All elements as concrete integers (floats truncated toward zero, as `Cast` does), or
    /// `None` if any element is symbolic or the value holds strings.
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        match self {
            ConstValue::Ints(v) => v.iter().map(SymInt::lit).collect(),
            ConstValue::Floats(v) => Some(v.iter().map(|x| *x as i64).collect()),
            ConstValue::Strings(_) => None,
        }
    }

    /// All elements as f64, or `None` if any element is symbolic or the value holds strings.
    pub fn as_f64s(&self) -> Option<Vec<f64>> {
        match self {
            ConstValue::Ints(v) => v.iter().map(|x| x.lit().map(|i| i as f64)).collect(),
            ConstValue::Floats(v) => Some(v.clone()),
            ConstValue::Strings(_) => None,
        }
    }

    /// The strings of a string value.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            ConstValue::Strings(v) => Some(v),
            _ => None,
        }
    }
}

/// Largest tensor whose contents inference tracks. Shape-computing tensors have a handful of
/// elements; 4096 covers position-id tables of small models while keeping the cost of folding
/// bounded (each folded op is at most a few thousand element operations).
pub const MAX_TRACKED_ELEMENTS: u64 = 4096;
