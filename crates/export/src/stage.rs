//! Step 2 of the export: one stage as a `ModelProto`, copied verbatim from the original file.
//!
//! [`ProtoIndex`] ties the IR back to the decoded protobuf (IR node → `NodeProto`, weight →
//! initializer or `Constant` node, tensor name → declared type); [`build_stage`] then copies the
//! stage's nodes, the weights they read and the declared types of its tensors, and types each
//! boundary tensor the model does not declare from the graph's inferred dtype and shape.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
use onnx_protobuf::{
    type_proto, GraphProto, Message, ModelProto, NodeProto, StringStringEntryProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};

use super::routes::{Destination, Routes, StageRoutes};
use crate::Error;
use pipecut_ir::graph::{Dim, Graph, NodeId, Storage, TensorId, TensorOrigin, ValueKind};
use pipecut_ir::onnx::tensor::{decode_tensor, ExternalFiles, ExternalRef};

/// Where each IR entity lives in the decoded model.
pub(crate) struct ProtoIndex<'a> {
    proto: &'a ModelProto,
    graph_proto: &'a GraphProto,
    /// `NodeProto` position of every IR node, by [`NodeId::index`].
    node_position: Vec<usize>,
    /// `Constant` nodes that the loader turned into weights, by output name.
    constant_position: HashMap<&'a str, usize>,
    initializer_position: HashMap<&'a str, usize>,
    sparse_position: HashMap<&'a str, usize>,
    declared_input: HashMap<&'a str, &'a ValueInfoProto>,
    declared_output: HashMap<&'a str, &'a ValueInfoProto>,
    declared_value_info: HashMap<&'a str, &'a ValueInfoProto>,
}

impl<'a> ProtoIndex<'a> {
    /// Indexes `proto`, checking that it is the model `graph` was loaded from: the loader adds
    /// one IR node per `NodeProto` in file order, except the `Constant` nodes it makes weights.
    pub fn new(proto: &'a ModelProto, graph: &Graph) -> Result<ProtoIndex<'a>, Error> {
        let graph_proto = proto
            .graph
            .as_ref()
            .ok_or_else(|| Error::Export("the model file has no graph".into()))?;
        let mismatch = |detail: String| {
            Error::Export(format!(
                "the model file is not the one the graph was loaded from: {detail}"
            ))
        };
        let mut node_position = Vec::with_capacity(graph.node_count());
        let mut constant_position = HashMap::new();
        for (position, node) in graph_proto.node.iter().enumerate() {
            let first_output = node.output.iter().find(|o| !o.is_empty());
            let made_a_weight = node.op_type == "Constant"
                && first_output
                    .and_then(|o| graph.tensor_id(o))
                    .is_some_and(|t| matches!(graph.tensor(t).origin, TensorOrigin::Parameter(_)));
            if made_a_weight {
                let output = first_output.expect("checked above");
                constant_position.insert(output.as_str(), position);
                continue;
            }
            let id = NodeId::from_index(node_position.len());
            if node_position.len() >= graph.node_count() {
                return Err(mismatch(format!(
                    "it has more nodes than the graph's {}",
                    graph.node_count()
                )));
            }
            let ir = graph.node(id);
            let ir_first_output = ir
                .outputs
                .iter()
                .flatten()
                .next()
                .map(|&t| graph.tensor(t).name.as_str());
            if ir.op_type != node.op_type || ir_first_output != first_output.map(String::as_str) {
                return Err(mismatch(format!(
                    "node #{position} is a {} in the file but '{}' ({}) in the graph",
                    node.op_type, ir.name, ir.op_type
                )));
            }
            node_position.push(position);
        }
        if node_position.len() != graph.node_count() {
            return Err(mismatch(format!(
                "it has {} operator nodes, the graph {}",
                node_position.len(),
                graph.node_count()
            )));
        }
        let by_name = |list: &'a [ValueInfoProto]| -> HashMap<&'a str, &'a ValueInfoProto> {
            list.iter().map(|v| (v.name.as_str(), v)).collect()
        };
        Ok(ProtoIndex {
            proto,
            graph_proto,
            node_position,
            constant_position,
            initializer_position: graph_proto
                .initializer
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.as_str(), i))
                .collect(),
            sparse_position: graph_proto
                .sparse_initializer
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.values.as_ref().map(|v| (v.name.as_str(), i)))
                .collect(),
            declared_input: by_name(&graph_proto.input),
            declared_output: by_name(&graph_proto.output),
            declared_value_info: by_name(&graph_proto.value_info),
        })
    }

    fn node(&self, id: NodeId) -> &'a NodeProto {
        &self.graph_proto.node[self.node_position[id.index()]]
    }
}

/// A stage model, serialized, with the figures the manifest reports.
pub(crate) struct BuiltStage {
    /// The `ModelProto` bytes.
    pub bytes: Vec<u8>,
    /// `Constant` nodes copied for the weights the stage reads.
    pub constant_nodes: usize,
    /// The external data files its initializers reference: each `location` as the stage file
    /// names it, with the file it resolved to, checked as the loader checks it.
    pub external_locations: BTreeMap<String, PathBuf>,
}

/// Builds stage `stage` of `routes` from the original model.
pub(crate) fn build_stage(
    index: &ProtoIndex<'_>,
    graph: &Graph,
    routes: &Routes,
    stage: usize,
    external: &mut ExternalFiles,
) -> Result<BuiltStage, Error> {
    let original = index.graph_proto;
    let plan = &routes.stages[stage];
    let mut out = GraphProto::new();
    out.name = if original.name.is_empty() {
        format!("stage_{stage}")
    } else {
        format!("{}_stage_{stage}", original.name)
    };
    out.doc_string = original.doc_string.clone();
    out.metadata_props = original.metadata_props.clone();
    let held = copy_weights(index, graph, plan, external, &mut out)?;
    for &node in &plan.nodes {
        out.node.push(index.node(node).clone());
    }
    let interface = declare_interface(index, graph, plan, &held.names, &mut out)?;
    copy_annotations(index, graph, plan, &held.names, &interface, &mut out);
    let model = stage_model(index.proto, out, stage, routes.stages.len());
    let bytes = model
        .write_to_bytes()
        .map_err(|e| Error::Export(format!("cannot encode stage {stage}: {e}")))?;
    Ok(BuiltStage {
        bytes,
        constant_nodes: held.constant_nodes,
        external_locations: held.external_locations,
    })
}

/// The weights a stage holds, as [`copy_weights`] copied them.
struct HeldWeights<'g> {
    names: HashSet<&'g str>,
    /// `Constant` nodes copied.
    constant_nodes: usize,
    /// External data locations, as [`BuiltStage::external_locations`].
    external_locations: BTreeMap<String, PathBuf>,
}

/// Copies the weights the stage's nodes read into `out`: initializers, sparse initializers, or
/// the `Constant` nodes that made them.
fn copy_weights<'g>(
    index: &ProtoIndex<'_>,
    graph: &'g Graph,
    plan: &StageRoutes,
    external: &mut ExternalFiles,
    out: &mut GraphProto,
) -> Result<HeldWeights<'g>, Error> {
    let original = index.graph_proto;
    let mut held = HeldWeights {
        names: HashSet::new(),
        constant_nodes: 0,
        external_locations: BTreeMap::new(),
    };
    for &tensor_id in &plan.parameters {
        let name = graph.tensor(tensor_id).name.as_str();
        held.names.insert(name);
        if let Some(&position) = index.constant_position.get(name) {
            out.node.push(original.node[position].clone());
            held.constant_nodes += 1;
        } else if let Some(&position) = index.initializer_position.get(name) {
            let tensor = &original.initializer[position];
            note_external(tensor, external, &mut held.external_locations)?;
            out.initializer.push(tensor.clone());
        } else if let Some(&position) = index.sparse_position.get(name) {
            let sparse = &original.sparse_initializer[position];
            for part in sparse
                .values
                .as_ref()
                .into_iter()
                .chain(sparse.indices.as_ref())
            {
                note_external(part, external, &mut held.external_locations)?;
            }
            out.sparse_initializer.push(sparse.clone());
        } else {
            return Err(Error::Export(format!(
                "weight '{name}' is neither an initializer nor a Constant node of the file"
            )));
        }
    }
    Ok(held)
}

/// Declares the stage's inputs and outputs in `out`, typed as the model declares them (or
/// from the graph); gives the names of both, its interface.
fn declare_interface<'g>(
    index: &ProtoIndex<'_>,
    graph: &'g Graph,
    plan: &StageRoutes,
    held_names: &HashSet<&str>,
    out: &mut GraphProto,
) -> Result<HashSet<&'g str>, Error> {
    let original = index.graph_proto;
    for &(tensor_id, source) in &plan.inputs {
        let name = graph.tensor(tensor_id).name.as_str();
        let declared = match source {
            super::routes::Source::ModelInput => index.declared_input.get(name).copied(),
            super::routes::Source::Stage(_) => boundary_declaration(index, name),
        };
        out.input.push(value_info(graph, tensor_id, declared)?);
    }
    // Before IR 4 every initializer is also a graph input; keep that listing for held weights.
    for declared in &original.input {
        if held_names.contains(declared.name.as_str())
            && !index.constant_position.contains_key(declared.name.as_str())
        {
            out.input.push(declared.clone());
        }
    }
    let mut interface: HashSet<&str> = plan
        .inputs
        .iter()
        .map(|&(t, _)| graph.tensor(t).name.as_str())
        .collect();
    for (tensor_id, destinations) in &plan.outputs {
        let name = graph.tensor(*tensor_id).name.as_str();
        let declared = if destinations.contains(&Destination::ModelOutput) {
            index.declared_output.get(name).copied()
        } else {
            boundary_declaration(index, name)
        };
        out.output.push(value_info(graph, *tensor_id, declared)?);
        interface.insert(name);
    }
    Ok(interface)
}

/// Copies into `out` the declared types of the tensors the stage makes inside, in the model's
/// order, and the quantization annotations of those and of its interface.
fn copy_annotations(
    index: &ProtoIndex<'_>,
    graph: &Graph,
    plan: &StageRoutes,
    held_names: &HashSet<&str>,
    interface: &HashSet<&str>,
    out: &mut GraphProto,
) {
    let original = index.graph_proto;
    let made_inside: HashSet<&str> = plan
        .nodes
        .iter()
        .flat_map(|&n| graph.node(n).outputs.iter().flatten())
        .map(|&t| graph.tensor(t).name.as_str())
        .chain(held_names.iter().copied())
        .collect();
    out.value_info = original
        .value_info
        .iter()
        .filter(|v| made_inside.contains(v.name.as_str()) && !interface.contains(v.name.as_str()))
        .cloned()
        .collect();
    out.quantization_annotation = original
        .quantization_annotation
        .iter()
        .filter(|a| {
            let name = a.tensor_name.as_str();
            made_inside.contains(name) || interface.contains(name)
        })
        .cloned()
        .collect();
}

/// Stage `stage` of `stages` as a model: the original's header, opsets, metadata and local
/// functions around the stage's graph `out`.
fn stage_model(proto: &ModelProto, out: GraphProto, stage: usize, stages: usize) -> ModelProto {
    let mut model = ModelProto::new();
    model.ir_version = proto.ir_version;
    model.opset_import = proto.opset_import.clone();
    model.producer_name = proto.producer_name.clone();
    model.producer_version = proto.producer_version.clone();
    model.domain = proto.domain.clone();
    model.model_version = proto.model_version;
    model.doc_string = proto.doc_string.clone();
    model.metadata_props = proto.metadata_props.clone();
    let mut entry = StringStringEntryProto::new();
    entry.key = "pipecut_stage".into();
    entry.value = format!("{stage} of {stages}");
    model.metadata_props.push(entry);
    // Model-local functions are small and may be called from any stage; every stage keeps them.
    model.functions = proto.functions.clone();
    model.graph = Some(out).into();
    model
}

/// The model's own declaration of a tensor that crosses a stage boundary, if it has one.
fn boundary_declaration<'a>(index: &ProtoIndex<'a>, name: &str) -> Option<&'a ValueInfoProto> {
    index
        .declared_value_info
        .get(name)
        .or_else(|| index.declared_output.get(name))
        .copied()
}

/// The declared value info, or one typed from the graph's inferred dtype and shape.
fn value_info(
    graph: &Graph,
    tensor_id: TensorId,
    declared: Option<&ValueInfoProto>,
) -> Result<ValueInfoProto, Error> {
    if let Some(declared) = declared.filter(|d| d.type_.is_some()) {
        return Ok(declared.clone());
    }
    let tensor = graph.tensor(tensor_id);
    let dtype = tensor.dtype.ok_or_else(|| {
        Error::Export(format!(
            "tensor '{}' crosses a stage boundary but its element type is unknown; \
             run shape inference on the graph before exporting",
            tensor.name
        ))
    })?;
    let mut tensor_type = type_proto::Tensor::new();
    tensor_type.elem_type = dtype.onnx_code();
    // A map's shape counts its entries; its values are scalars.
    let map_key = match tensor.kind {
        ValueKind::Map { key } | ValueKind::MapSequence { key } => Some(key),
        _ => None,
    };
    if let Some(shape) = tensor.shape.as_ref().filter(|_| map_key.is_none()) {
        let mut shape_proto = TensorShapeProto::new();
        for dim in shape {
            let mut d = Dimension::new();
            d.value = Some(match dim {
                Dim::Known(v) => dimension::Value::DimValue(*v as i64),
                Dim::Sym(s) => dimension::Value::DimParam(s.to_string()),
            });
            shape_proto.dim.push(d);
        }
        tensor_type.shape = Some(shape_proto).into();
    }
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(tensor_type));
    if let Some(key) = map_key {
        let mut map = type_proto::Map::new();
        map.key_type = key.onnx_code();
        map.value_type = Some(ty).into();
        ty = TypeProto::new();
        ty.value = Some(type_proto::Value::MapType(map));
    }
    // A sequence or optional crossing a boundary: its elements' type, wrapped.
    if matches!(
        tensor.kind,
        ValueKind::Sequence | ValueKind::OptionalSequence | ValueKind::MapSequence { .. }
    ) {
        let mut sequence = type_proto::Sequence::new();
        sequence.elem_type = Some(ty).into();
        ty = TypeProto::new();
        ty.value = Some(type_proto::Value::SequenceType(sequence));
    }
    if matches!(
        tensor.kind,
        ValueKind::OptionalTensor | ValueKind::OptionalSequence
    ) {
        let mut optional = type_proto::Optional::new();
        optional.elem_type = Some(ty).into();
        ty = TypeProto::new();
        ty.value = Some(type_proto::Value::OptionalType(optional));
    }
    let mut info = ValueInfoProto::new();
    info.name = tensor.name.clone();
    info.type_ = Some(ty).into();
    Ok(info)
}

/// Records the external file `tensor` reads, after checking its reference exactly as the loader
/// does, on the bytes being exported now (not on those loaded earlier, which may have been another
/// file): the location stays inside the model's directory, resolves to a regular file there, and
/// is long enough.
fn note_external(
    tensor: &TensorProto,
    external: &mut ExternalFiles,
    locations: &mut BTreeMap<String, PathBuf>,
) -> Result<(), Error> {
    if tensor.data_location.enum_value() != Ok(DataLocation::EXTERNAL) {
        return Ok(());
    }
    // The loader's checks read pipecut-ir's own message type. An external tensor holds no bytes,
    // so the round trip through its encoding copies a few names and numbers.
    let bytes = tensor.write_to_bytes().unwrap_or_default();
    let tensor = pipecut_ir::onnx::proto::TensorProto::decode(&bytes)
        .map_err(|e| Error::InvalidModel(format!("external tensor '{}': {e}", tensor.name)))?;
    let Some(reference) = ExternalRef::of(&tensor)? else {
        return Ok(());
    };
    if let Storage::External { path, .. } = decode_tensor(&tensor, external)?.storage {
        locations.insert(reference.location, path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_ir::graph::{Attribute, DType, NodeSpec};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    #[test]
    fn a_sequence_crossing_a_boundary_is_declared_a_sequence_of_its_elements() {
        let mut b = Graph::builder("seq");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![Dim::Known(4), Dim::Known(3)]),
        )
        .unwrap();
        b.node(NodeSpec::new("split", "SplitToSequence", &["x"], &["rows"]))
            .unwrap();
        b.output("rows");
        let mut graph = b.build().unwrap();
        ShapeInference::new(DimBindings::new())
            .run(&mut graph)
            .unwrap();
        let rows = graph.tensor_id("rows").unwrap();
        let info = value_info(&graph, rows, None).unwrap();
        let Some(type_proto::Value::SequenceType(sequence)) = &info.type_.value else {
            panic!("not a sequence type: {info:?}");
        };
        let Some(type_proto::Value::TensorType(element)) = &sequence.elem_type.value else {
            panic!("not a sequence of tensors: {sequence:?}");
        };
        assert_eq!(element.elem_type, DType::F32.onnx_code());
        let dims: Vec<_> = element.shape.dim.iter().map(|d| d.value.clone()).collect();
        assert_eq!(
            dims,
            vec![
                Some(dimension::Value::DimValue(1)),
                Some(dimension::Value::DimValue(3))
            ]
        );
    }

    #[test]
    fn zipmaps_sequence_of_maps_crossing_a_boundary_is_declared_with_its_map_type() {
        let mut b = Graph::builder("zip");
        b.opset("", 17).opset("ai.onnx.ml", 1);
        b.input(
            "scores",
            Some(DType::F32),
            Some(vec![Dim::Known(4), Dim::Known(2)]),
        )
        .unwrap();
        let mut zip = NodeSpec::new("zip", "ZipMap", &["scores"], &["maps"]).attr(
            "classlabels_strings",
            Attribute::Strings(vec!["a".into(), "b".into()]),
        );
        zip.domain = "ai.onnx.ml".into();
        b.node(zip).unwrap();
        b.output("maps");
        let mut graph = b.build().unwrap();
        ShapeInference::new(DimBindings::new())
            .run(&mut graph)
            .unwrap();
        let maps = graph.tensor_id("maps").unwrap();
        let info = value_info(&graph, maps, None).unwrap();
        let Some(type_proto::Value::SequenceType(sequence)) = &info.type_.value else {
            panic!("not a sequence type: {info:?}");
        };
        let Some(type_proto::Value::MapType(map)) = &sequence.elem_type.value else {
            panic!("not a sequence of maps: {sequence:?}");
        };
        assert_eq!(map.key_type, DType::String.onnx_code());
        let Some(type_proto::Value::TensorType(value)) = &map.value_type.value else {
            panic!("the map's values are not tensors: {map:?}");
        };
        assert_eq!(value.elem_type, DType::F32.onnx_code());
        assert!(value.shape.is_none(), "a map value is a scalar: {value:?}");
    }
}
