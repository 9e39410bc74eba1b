//! Which default-domain (`ai.onnx`) opsets pipecut loads, and what it does with the operator
//! versions they import.
//!
//! An opset import fixes, for every operator, the newest version whose `since_version` is at most
//! the imported opset. Shape rules and kernels read the imported opset from their context
//! (`OpCtx::opset`, `Ctx::opset`) and switch on it where a version changed an attribute into an
//! input (Reduce axes at 13/18, Split and Squeeze/Unsqueeze at 13, Pad and Clip at 11, Slice at
//! 10, Resize/Upsample scales at 9/11, TopK's k at 10). Because versions grow with the opset,
//! "op version < V" is "opset < V" whenever V is one of the op's `since_version`s, so the checks
//! below need no per-op version table.
//!
//! - Opsets 1 to 6 load. Their operator versions are the same as opset 7's except for the forms
//!   [`check_legacy_node`] refuses, one line naming the op, the node and the reason, rather than
//!   computing something else: legacy broadcasting with an `axis` (binary ops before 7),
//!   Reshape's `shape` attribute (before 5), Cast's string `to` (before 6), Tile's `axis` input
//!   (before 6), Upsample's scale attributes (before 7), Pad's `paddings` (before 2), Concat
//!   without `axis` (before 4).
//! - Opsets 24 to 28 (onnx 1.19 to 1.23) load. Compared with opset 23 they add types (float8e8m0,
//!   int2/uint2), new ops (Swish, TensorScatter, BitCast, CumProd, LinearAttention,
//!   CausalConvWithState, SwiGLU) that are ordinary unknown ops until they get rules, and change
//!   the semantics of a few ops, listed in [`CHANGES_SINCE_23`]; a model that uses one of those
//!   loads with a warning naming it.
//! - An opset newer than [`NEWEST_KNOWN_OPSET`] loads with a warning naming every default-domain
//!   op the model uses: pipecut assumes each keeps its opset-28 semantics, which is what a new
//!   opset does for most ops.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use super::proto::{AttributeType, NodeProto};

use crate::Error;

/// Default-domain opsets that load. Opset 1 is the first ONNX release.
pub const SUPPORTED_DEFAULT_OPSETS: RangeInclusive<i64> = 1..=NEWEST_KNOWN_OPSET;

/// The newest opset whose changes were reviewed for pipecut (onnx 1.23's opset 28; the review is
/// [`CHANGES_SINCE_23`]). Newer opsets load with a warning.
pub const NEWEST_KNOWN_OPSET: i64 = 28;

/// Operator versions after opset 23 that change more than the type lists, as (op, the opset of the
/// change, what pipecut does not apply). Taken from the schemas of onnx 1.23.2
/// (`onnx.defs.get_all_schemas_with_history()`).
pub const CHANGES_SINCE_23: &[(&str, i64, &str)] = &[
    ("Attention", 24, "the nonpad_kv_seqlen input"),
    ("Cast", 24, "the round_mode attribute (float8 targets)"),
    ("CastLike", 24, "the round_mode attribute (float8 targets)"),
    (
        "Attention",
        25,
        "the left_window_size and right_window_size attributes",
    ),
    ("Range", 27, "the stash_type attribute"),
    ("SpaceToDepth", 28, "the mode attribute"),
];

fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// Refuses, in one line, a default-domain node of opset 1 to 6 whose imported version means
/// something pipecut does not compute (see the module doc). Later opsets pass unchecked.
///
/// `opset` is the imported default-domain opset, `None` when the model does not import the
/// default domain, where a default-domain node has no version at all and is refused.
pub(crate) fn check_legacy_node(node: &NodeProto, opset: Option<i64>) -> Result<(), Error> {
    if !is_default_domain(&node.domain) {
        return Ok(());
    }
    let Some(opset) = opset else {
        return Err(Error::UnsupportedOpset {
            domain: "ai.onnx".into(),
            version: 0,
            supported: format!(
                "a model with default-domain nodes (here '{}', op {}) that imports the default domain",
                node.name, node.op_type
            ),
        });
    };
    if opset >= 7 {
        return Ok(());
    }
    let attribute = |name: &str| node.attribute.iter().find(|a| a.name == name);
    let op = node.op_type.as_str();
    let reason = match op {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "And" | "Or" | "Xor" | "Equal" | "Greater"
        | "Less"
            if attribute("broadcast").is_some_and(|a| a.i != 0) && attribute("axis").is_some() =>
        {
            // Without `axis`, legacy broadcasting aligns the second input with the trailing dims
            // of the first, which numpy-style broadcasting also does.
            Some("legacy broadcasting with an 'axis' attribute (before opset 7) is not supported; convert the model to opset 7 or later")
        }
        "Reshape" if opset < 5 => {
            Some("Reshape takes its shape as an attribute before opset 5, which pipecut does not read; convert the model to opset 5 or later")
        }
        "Cast" if opset < 6 && attribute("to").is_some_and(|a| a.attribute_type() == AttributeType::STRING) => {
            Some("Cast names its target type as a string before opset 6, which pipecut does not read")
        }
        "Tile" if opset < 6 => {
            Some("Tile takes (tiles, axis) inputs before opset 6, which pipecut does not read")
        }
        "Upsample" => {
            Some("Upsample takes width_scale/height_scale attributes before opset 7, which pipecut does not read")
        }
        "Pad" if opset < 2 => {
            Some("Pad takes a 'paddings' attribute before opset 2, which pipecut does not read")
        }
        "Concat" if opset < 4 && attribute("axis").is_none() => {
            Some("Concat without 'axis' (axis 1 by default before opset 4) is not supported")
        }
        _ => None,
    };
    match reason {
        Some(detail) => Err(Error::LegacyOp {
            op: op.to_string(),
            node: node.name.clone(),
            opset,
            detail: detail.to_string(),
        }),
        None => Ok(()),
    }
}

/// The warnings a model's default-domain opset and op types call for (see the module doc), one
/// sentence each, naming the ops pipecut had to assume.
pub(crate) fn opset_warnings(opset: Option<i64>, op_types: &BTreeSet<&str>) -> Vec<String> {
    let Some(opset) = opset else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    if opset > NEWEST_KNOWN_OPSET {
        let ops: Vec<&str> = op_types.iter().copied().collect();
        warnings.push(format!(
            "opset {opset} is newer than pipecut knows ({NEWEST_KNOWN_OPSET}); it assumes these ops keep their opset-{NEWEST_KNOWN_OPSET} semantics: {}",
            ops.join(", ")
        ));
    }
    for (op, since, ignored) in CHANGES_SINCE_23 {
        if opset >= *since && op_types.contains(*op) {
            warnings.push(format!(
                "{op} of opset {opset} has version {since}, whose {ignored} pipecut does not apply"
            ));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::AttributeProto;

    fn node(op: &str, attributes: &[(&str, i64)]) -> NodeProto {
        let mut node = NodeProto::new();
        node.op_type = op.into();
        node.name = "n0".into();
        for (name, value) in attributes {
            let mut a = AttributeProto::new();
            a.name = (*name).into();
            a.i = *value;
            a.type_ = AttributeType::INT.into();
            node.attribute.push(a);
        }
        node
    }

    #[test]
    fn legacy_forms_are_refused_naming_op_node_and_opset() {
        let err =
            check_legacy_node(&node("Add", &[("broadcast", 1), ("axis", 1)]), Some(6)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("'Add'") && text.contains("'n0'") && text.contains("opset 6"),
            "{text}"
        );
        assert!(check_legacy_node(&node("Reshape", &[]), Some(4)).is_err());
        assert!(check_legacy_node(&node("Tile", &[]), Some(5)).is_err());
        assert!(check_legacy_node(&node("Concat", &[]), Some(3)).is_err());
        // A default-domain node in a model that imports no default opset has no version.
        let err = check_legacy_node(&node("Relu", &[]), None).unwrap_err();
        assert!(err.to_string().contains("'n0', op Relu"), "{err}");
    }

    #[test]
    fn forms_that_mean_the_same_pass() {
        // Legacy broadcasting without an axis is numpy's trailing alignment.
        assert!(check_legacy_node(&node("Add", &[("broadcast", 1)]), Some(6)).is_ok());
        assert!(check_legacy_node(&node("Reshape", &[]), Some(5)).is_ok());
        assert!(check_legacy_node(&node("Concat", &[("axis", 0)]), Some(1)).is_ok());
        // From opset 7 on nothing is checked here.
        assert!(check_legacy_node(&node("Add", &[("broadcast", 1), ("axis", 1)]), Some(7)).is_ok());
    }

    #[test]
    fn warnings_name_the_assumed_ops() {
        let ops: BTreeSet<&str> = ["Relu", "SpaceToDepth"].into();
        assert!(opset_warnings(Some(23), &ops).is_empty());
        let at_28 = opset_warnings(Some(28), &ops);
        assert_eq!(at_28.len(), 1);
        assert!(
            at_28[0].contains("SpaceToDepth") && at_28[0].contains("mode"),
            "{at_28:?}"
        );
        let at_30 = opset_warnings(Some(30), &ops);
        assert!(
            at_30[0].contains("opset 30") && at_30[0].contains("Relu, SpaceToDepth"),
            "{at_30:?}"
        );
    }
}
