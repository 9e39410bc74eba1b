//! The collective ops of pipecut's custom domain `ai.pipecut`, as a tensor-parallel rank file
//! holds them: [`crate::shard`] inserts them after split blocks, [`crate::sequence`] turns them
//! into their sequence-parallel forms. `docs/export.md` specifies the domain.

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto};

/// The custom domain of pipecut's collective ops.
pub const COLLECTIVE_DOMAIN: &str = "ai.pipecut";
/// Sums its input over the ranks of the group (attribute `group_size`); every rank gets the sum.
pub const ALL_REDUCE: &str = "AllReduce";
/// Concatenates the ranks' inputs in rank order along `axis`; every rank gets the whole.
pub const ALL_GATHER: &str = "AllGather";
/// Sums its input over the group and cuts the sum along `axis`; rank r gets piece r.
pub const REDUCE_SCATTER: &str = "ReduceScatter";

/// A collective node of the `ai.pipecut` domain.
pub(crate) fn collective(
    name: &str,
    op: &str,
    input: &str,
    output: &str,
    group_size: u64,
    axis: Option<i64>,
) -> NodeProto {
    let mut node = NodeProto::new();
    node.name = name.into();
    node.op_type = op.into();
    node.domain = COLLECTIVE_DOMAIN.into();
    node.input.push(input.into());
    node.output.push(output.into());
    let int = |name: &str, value: i64| {
        let mut attribute = AttributeProto::new();
        attribute.name = name.into();
        attribute.type_ = AttributeType::INT.into();
        attribute.i = value;
        attribute
    };
    node.attribute.push(int("group_size", group_size as i64));
    if let Some(axis) = axis {
        node.attribute.push(int("axis", axis));
    }
    node
}
