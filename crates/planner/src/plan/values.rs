//! The sample values a plan was made with (`partition --value NAME=FILE.npy`, schema version 9).
//!
//! A graph input that carries a shape (a Reshape's shape, Reduce axes, Slice starts, Resize
//! sizes, Pad pads) decides the sizes of what follows it. A plan costed with a sample value holds
//! for that value only, so the plan records it: `check`, `export` and `run` type the model with
//! it again without being told, `run` feeds it as that input, and a value given again on the
//! command line must be the same (compared by [`PlanValue::sha256`]).
//!
//! Shape inference tracks values of at most [`MAX_TRACKED_ELEMENTS`] elements, so every value a
//! plan can record is small, and the plan holds its elements, not only their digest: a plan
//! alone is then enough to run.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;
use pipecut_ir::graph::{ConstValue, DType, SymInt, MAX_TRACKED_ELEMENTS};

/// One graph input's sample value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanValue {
    /// Element type, numpy style (`int64`, `float32`, `string`, ...), as the file held it.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// The elements in row-major order: integers (booleans as 0/1), floats, or strings.
    pub data: ValueData,
    /// sha256 of the dtype, shape and elements ([`PlanValue::digest`]); `Plan::from_json`
    /// refuses a plan whose recorded elements do not give it.
    pub sha256: String,
}

/// The elements of a [`PlanValue`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum ValueData {
    /// Integer and boolean elements.
    Ints(Vec<i64>),
    /// Floating-point elements, widened to f64 (finite: JSON has no NaN or infinity).
    Floats(Vec<f64>),
    /// String elements.
    Strings(Vec<String>),
}

impl PlanValue {
    /// The record of `value`, of element type `dtype` and dimensions `shape`. Refuses a value
    /// plans cannot hold: a symbolic element, a NaN or infinity, more than
    /// [`MAX_TRACKED_ELEMENTS`] elements, or elements that are not the shape's count.
    pub fn new(
        name: &str,
        dtype: DType,
        shape: &[u64],
        value: &ConstValue,
    ) -> Result<PlanValue, Error> {
        let bad = |detail: String| Error::InvalidPlan(format!("sample value '{name}': {detail}"));
        let data = match value {
            ConstValue::Ints(v) => ValueData::Ints(
                v.iter()
                    .map(SymInt::lit)
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("it has a symbolic element".into()))?,
            ),
            ConstValue::Floats(v) if v.iter().all(|x| x.is_finite()) => {
                ValueData::Floats(v.clone())
            }
            ConstValue::Floats(_) => {
                return Err(bad(
                    "it holds a NaN or infinity, which a plan cannot record".into(),
                ))
            }
            ConstValue::Strings(v) => ValueData::Strings(v.clone()),
        };
        let mut record = PlanValue {
            dtype: dtype.name().to_string(),
            shape: shape.to_vec(),
            data,
            sha256: String::new(),
        };
        record.sha256 = record.digest();
        record.validate(name)?;
        Ok(record)
    }

    /// sha256 of the dtype name, the shape and the elements as compact JSON, one per line: the
    /// same value read from any file gives the same digest.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.dtype.as_bytes());
        hasher.update(b"\n");
        hasher.update(serde_json::to_string(&self.shape).expect("shapes serialize"));
        hasher.update(b"\n");
        hasher.update(serde_json::to_string(&self.data).expect("values serialize"));
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The element type.
    pub fn element_type(&self) -> Option<DType> {
        DType::from_name(&self.dtype)
    }

    /// Gives an empty value the element kind of its dtype: JSON's `[]` parses as integers
    /// whatever the dtype, and an empty float or string value read back as integers types its
    /// consumers otherwise than the plan was costed (an empty Split input) and is not the
    /// `--input` file `run` compares it with (an empty string tensor).
    pub fn type_empty_data(&mut self) {
        let empty = match &self.data {
            ValueData::Ints(v) => v.is_empty(),
            _ => false,
        };
        match self.element_type() {
            Some(DType::String) if empty => self.data = ValueData::Strings(Vec::new()),
            Some(d) if empty && d.is_float() => self.data = ValueData::Floats(Vec::new()),
            _ => {}
        }
    }

    /// The value as shape inference takes it.
    pub fn const_value(&self) -> ConstValue {
        match &self.data {
            ValueData::Ints(v) => ConstValue::Ints(v.iter().copied().map(SymInt::Lit).collect()),
            ValueData::Floats(v) => ConstValue::Floats(v.clone()),
            ValueData::Strings(v) => ConstValue::Strings(v.clone()),
        }
    }

    /// Refuses a record whose parts disagree: an unknown dtype, elements of another kind than
    /// the dtype's, a count that is not the shape's, too many elements, or a digest that is not
    /// the elements' (a hand-edited value).
    pub fn validate(&self, name: &str) -> Result<(), Error> {
        let bad = |detail: String| Error::InvalidPlan(format!("sample value '{name}': {detail}"));
        let dtype = self.element_type().ok_or_else(|| {
            bad(format!(
                "dtype '{}' is not an ONNX element type",
                self.dtype
            ))
        })?;
        let (len, fits) = match &self.data {
            ValueData::Ints(v) => (v.len(), !dtype.is_float() && dtype != DType::String),
            ValueData::Floats(v) => (v.len(), dtype.is_float()),
            ValueData::Strings(v) => (v.len(), dtype == DType::String),
        };
        // An empty list parses as integers whatever the dtype.
        if !fits && len > 0 {
            return Err(bad(format!("its elements are not {dtype} values")));
        }
        let count = self
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {:?} overflows", self.shape)))?;
        if count != len as u64 {
            return Err(bad(format!(
                "shape {:?} has {count} elements but {len} are recorded",
                self.shape
            )));
        }
        if count > MAX_TRACKED_ELEMENTS {
            return Err(bad(format!(
                "it has {count} elements; plan-time values hold at most {MAX_TRACKED_ELEMENTS}"
            )));
        }
        if self.sha256 != self.digest() {
            return Err(bad(format!(
                "its sha256 is recorded as {} but its elements give {}: the value was edited; make a new plan with `pipecut partition --value`",
                self.sha256,
                self.digest()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes() -> PlanValue {
        let value = ConstValue::Ints(vec![SymInt::Lit(4), SymInt::Lit(-1)]);
        PlanValue::new("r", DType::I64, &[2], &value).unwrap()
    }

    #[test]
    fn a_value_round_trips_through_json_and_keeps_its_digest() {
        let value = axes();
        let text = serde_json::to_string(&value).unwrap();
        let back: PlanValue = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
        back.validate("r").unwrap();
        assert_eq!(back.const_value(), value.const_value());
        assert_eq!(back.element_type(), Some(DType::I64));
    }

    #[test]
    fn an_empty_value_keeps_its_kind_through_json() {
        for (dtype, value) in [
            (DType::F32, ConstValue::Floats(Vec::new())),
            (DType::String, ConstValue::Strings(Vec::new())),
            (DType::I64, ConstValue::Ints(Vec::new())),
        ] {
            let recorded = PlanValue::new("e", dtype, &[0], &value).unwrap();
            let text = serde_json::to_string(&recorded).unwrap();
            let mut back: PlanValue = serde_json::from_str(&text).unwrap();
            back.validate("e").unwrap();
            back.type_empty_data();
            assert_eq!(back.const_value(), value, "{dtype}");
            assert_eq!(back, recorded, "{dtype}");
        }
    }

    #[test]
    fn an_edited_element_is_caught_by_its_digest() {
        let mut value = axes();
        value.data = ValueData::Ints(vec![4, -2]);
        let err = value.validate("r").unwrap_err().to_string();
        assert!(err.contains("the value was edited"), "{err}");
    }

    #[test]
    fn values_a_plan_cannot_hold_are_refused() {
        let nan = ConstValue::Floats(vec![f64::NAN]);
        assert!(PlanValue::new("s", DType::F32, &[1], &nan).is_err());
        let short = ConstValue::Ints(vec![SymInt::Lit(1)]);
        assert!(PlanValue::new("s", DType::I64, &[2], &short).is_err());
        let floats = ConstValue::Floats(vec![1.5]);
        assert!(PlanValue::new("s", DType::I64, &[1], &floats).is_err());
    }
}
