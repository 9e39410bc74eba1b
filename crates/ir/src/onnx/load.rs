//! Decoding a `ModelProto` into the graph IR.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::proto::{
    length_prefixed_stream, AttributeProto, AttributeType, EncodedNode, GraphProto, Message,
    ModelProto, NodeProto, SparseTensorProto, TensorProto,
};

use super::model::Model;
use super::opset::{check_legacy_node, opset_warnings};
use super::tensor::{decode_tensor, decode_type, decode_value_type, DecodedTensor, ExternalFiles};
use crate::graph::{
    Attribute, Attributes, DType, Graph, GraphBuilder, NodeSpec, Param, Storage, Subgraph,
};
use crate::Error;

/// sha256 of what planning depends on: the main `GraphProto` re-encoded as protobuf (fields in
/// onnx.proto's declaration order as rust-protobuf 3.4 wrote them, see [`super::proto`];
/// repeated fields in file order, since node order is the graph's topological
/// order) with every initializer and sparse initializer reduced to its name, dtype and dims. So
/// it covers the nodes (op types, domains, names, inputs, outputs, attributes, subgraphs), the
/// graph inputs, outputs and value infos with their dtypes and shapes, and the initializers'
/// names, dtypes and dims, but no initializer bytes and no external-data reference. The opset
/// imports are not hashed (they live outside the graph; the graph's node list is what is cut).
pub fn graph_sha256(graph: &GraphProto) -> String {
    graph_sha256_in_place(&mut graph.clone())
}

/// [`graph_sha256`] and [`weights_sha256`] as loading computes them: the graph's without a
/// copy of it (see [`graph_sha256_in_place`]).
pub fn digests_in_place(graph: &mut GraphProto) -> (String, String) {
    let weights = weights_sha256(graph);
    (graph_sha256_in_place(graph), weights)
}

/// [`graph_sha256`] without a copy of the graph: the initializers' data fields (and a sparse
/// initializer's indices) are set aside for the encoding and put back
/// ([`TensorProto::take_data`]), and the encoding streams into the hash (a copy and a buffer of
/// the whole graph were a fifth of loading a 100k-node model).
fn graph_sha256_in_place(graph: &mut GraphProto) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hash_graph_in_place(graph, &mut hasher);
    hex(&hasher.finalize())
}

/// Feeds the graph's encoding, its initializers reduced as [`graph_sha256`] reduces them, to
/// `hasher`.
fn hash_graph_in_place(graph: &mut GraphProto, hasher: &mut sha2::Sha256) {
    use sha2::Digest;
    let data: Vec<TensorProto> = graph
        .initializer
        .iter_mut()
        .map(TensorProto::take_data)
        .collect();
    let sparse_data: Vec<_> = graph
        .sparse_initializer
        .iter_mut()
        .map(|s| {
            (
                s.values.as_deref_mut().map(TensorProto::take_data),
                s.indices.take(),
            )
        })
        .collect();
    graph.encode_streaming(&mut |bytes| hasher.update(bytes));
    for (initializer, data) in graph.initializer.iter_mut().zip(data) {
        initializer.restore_data(data);
    }
    for (sparse, (values, indices)) in graph.sparse_initializer.iter_mut().zip(sparse_data) {
        if let (Some(kept), Some(values)) = (sparse.values.as_deref_mut(), values) {
            kept.restore_data(values);
        }
        sparse.indices = indices;
    }
}

/// [`hash_graph_in_place`] for a graph that is not needed afterwards: the initializers' data
/// are dropped as they are reduced, where keeping them to put back took a vector of every
/// initializer (a twentieth of loading the million-node stack of `benches/scale.sh`).
fn hash_graph_consumed(mut graph: GraphProto, hasher: &mut sha2::Sha256) {
    use sha2::Digest;
    for initializer in &mut graph.initializer {
        drop(initializer.take_data());
    }
    for sparse in &mut graph.sparse_initializer {
        if let Some(values) = sparse.values.as_deref_mut() {
            drop(values.take_data());
        }
        sparse.indices = None;
    }
    graph.encode_streaming(&mut |bytes| hasher.update(bytes));
}

/// sha256 over the initializers, in file order: each one's `TensorProto` encoding (name, dtype,
/// dims, the embedded bytes in whichever data field holds them, and for external data the
/// reference entries: location, offset, length, checksum), each prefixed with its length in
/// bytes (u64, little-endian). External-data files are never read: a plan must load without
/// the weights, so weights changed inside an external file keep the same digest.
pub fn weights_sha256(graph: &GraphProto) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    length_prefixed_stream(&graph.initializer, &mut |bytes| hasher.update(bytes));
    hex(&hasher.finalize())
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses model bytes. `origin` names them in errors; `base_dir` resolves external data.
pub(super) fn decode_model(
    bytes: &[u8],
    origin: &str,
    base_dir: Option<PathBuf>,
) -> Result<Model, Error> {
    if bytes.is_empty() {
        return Err(Error::NotOnnx {
            origin: origin.to_string(),
            detail: "the file is empty".into(),
        });
    }
    // The usual way: the main graph's nodes decoded one at a time as the graph is built. Any
    // error, a repeated graph field or a graph of Constant nodes alone takes the whole
    // decoding below, which says what is wrong in the same words for every file.
    if let Ok(Some((proto, nodes))) = ModelProto::decode_with_nodes_aside(bytes) {
        if let Ok(Some(model)) = load_streaming(proto, nodes, bytes, origin, base_dir.clone()) {
            return Ok(model);
        }
    }
    decode_whole(bytes, origin, base_dir)
}

/// Loads a model decoded whole, its nodes all at once.
fn decode_whole(bytes: &[u8], origin: &str, base_dir: Option<PathBuf>) -> Result<Model, Error> {
    let proto = match ModelProto::decode(bytes) {
        Ok(proto) => proto,
        Err(e) => {
            return Err(
                sniffed_format(bytes, origin).unwrap_or_else(|| Error::NotOnnx {
                    origin: origin.to_string(),
                    detail: format!("protobuf decoding failed: {e}"),
                }),
            )
        }
    };
    check_is_model(&proto, bytes, origin)?;
    let opsets = read_opsets(&proto)?;
    let mut proto = proto;
    let mut graph_proto = proto.graph.take().expect("checked above");
    let warnings = opset_warnings(opsets.get("").copied(), &default_domain_ops(&graph_proto));
    let (graph_sha256, weights_sha256) = digests_in_place(&mut graph_proto);
    let (built, sha256) = beside_file_hash(bytes, || {
        let mut external = ExternalFiles::new(base_dir);
        build_graph(&graph_proto, &opsets, &mut external).map(|graph| (graph, external.missing))
    });
    drop(graph_proto);
    let (graph, missing_external_data) = built?;
    Ok(Model {
        graph,
        ir_version: proto.ir_version,
        producer: producer(&proto),
        file_bytes: bytes.len() as u64,
        sha256,
        graph_sha256,
        weights_sha256,
        warnings,
        missing_external_data,
    })
}

/// A file of another format fails to decode, or decodes as a message of unknown fields; in
/// both cases its first bytes say better than the decoder what the user passed.
fn sniffed_format(bytes: &[u8], origin: &str) -> Option<Error> {
    sniff_other_format(bytes).map(|format| Error::NotOnnx {
        origin: origin.to_string(),
        detail: format!("the file is {format}"),
    })
}

/// Protobuf accepts many byte strings as a message with unknown fields; a real model always
/// states its IR version and carries a graph.
fn check_is_model(proto: &ModelProto, bytes: &[u8], origin: &str) -> Result<(), Error> {
    if proto.ir_version > 0 && proto.graph.is_some() {
        return Ok(());
    }
    if let Some(error) = sniffed_format(bytes, origin) {
        return Err(error);
    }
    let missing = match proto.ir_version <= 0 {
        true => "IR version",
        false => "graph",
    };
    Err(Error::NotOnnx {
        origin: origin.to_string(),
        detail: format!("no {missing} found"),
    })
}

fn producer(proto: &ModelProto) -> String {
    format!("{} {}", proto.producer_name, proto.producer_version)
        .trim()
        .to_string()
}

/// Loads a model whose main graph's nodes are still encoded ([`ModelProto::decode_with_nodes_aside`]):
/// each is decoded, hashed and built in turn and then dropped, so the decoded nodes never
/// exist all at once. `None` where the whole decoding must say it: a node that does not decode,
/// or a graph of Constant nodes alone (which [`populate`] keeps as nodes).
fn load_streaming(
    mut proto: ModelProto,
    nodes: Vec<EncodedNode<'_>>,
    bytes: &[u8],
    origin: &str,
    base_dir: Option<PathBuf>,
) -> Result<Option<Model>, Error> {
    use sha2::{Digest, Sha256};
    check_is_model(&proto, bytes, origin)?;
    let opsets = read_opsets(&proto)?;
    let graph_proto = proto.graph.take().expect("checked above");
    // The graph's digest hashes its encoding, whose nodes come first (field 1).
    let mut graph_hasher = Sha256::new();
    let (built, sha256) = beside_file_hash(bytes, || {
        let mut external = ExternalFiles::new(base_dir);
        build_streaming(
            &graph_proto,
            nodes,
            &opsets,
            &mut external,
            &mut graph_hasher,
        )
        .map(|built| built.map(|built| (built, external.missing)))
    });
    let Some(((graph, ops), missing_external_data)) = built? else {
        return Ok(None);
    };
    let weights_sha256 = weights_sha256(&graph_proto);
    hash_graph_consumed(*graph_proto, &mut graph_hasher);
    let ops = ops.iter().map(String::as_str).collect();
    Ok(Some(Model {
        graph,
        ir_version: proto.ir_version,
        producer: producer(&proto),
        file_bytes: bytes.len() as u64,
        sha256,
        graph_sha256: hex(&graph_hasher.finalize()),
        weights_sha256,
        warnings: opset_warnings(opsets.get("").copied(), &ops),
        missing_external_data,
    }))
}

/// Nodes per message from the decoding thread to the builder: enough that the channel's cost
/// vanishes, few enough that the decoded nodes in flight stay small.
const NODES_PER_BATCH: usize = 256;

/// The main graph built from `proto` (its nodes aside) and `nodes`, with the default domain's
/// op types, for the opset's warnings. Another thread decodes the nodes and feeds each one's
/// encoding to `hasher` while this one builds the graph: on the million-node stack of
/// `benches/scale.sh` decoding and hashing the nodes were a tenth of the one thread's work.
fn build_streaming(
    proto: &GraphProto,
    nodes: Vec<EncodedNode<'_>>,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
    hasher: &mut sha2::Sha256,
) -> Result<Option<(Graph, BTreeSet<String>)>, Error> {
    let mut builder = Graph::builder(graph_name(proto));
    declare_values(&mut builder, proto, nodes.len(), opsets, external, &[])?;
    let count = nodes.len();
    let (decoded, added) = std::thread::scope(|scope| {
        let (sender, batches) = std::sync::mpsc::sync_channel(4);
        let (give_back, built_batches) = std::sync::mpsc::channel();
        let decoding = std::thread::Builder::new()
            .name("node-decoding".into())
            .spawn_scoped(scope, move || {
                decode_nodes(nodes, hasher, sender, &built_batches)
            });
        let Ok(decoding) = decoding else {
            // No thread to be had: the whole decoding, on this one, says the same.
            return (None, Ok(0));
        };
        let mut added = 0;
        let mut add_all = || {
            for batch in &batches {
                for node in &batch {
                    add_node(&mut builder, node, added, false, opsets, external)?;
                    added += 1;
                }
                // The decoding thread frees what it allocated, faster than this one could.
                let _ = give_back.send(batch);
            }
            Ok(())
        };
        let built: Result<(), Error> = add_all();
        // On an error the decoding thread finds the channel closed and stops.
        drop(batches);
        drop(give_back);
        let decoded = decoding
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (decoded, built.map(|()| added))
    });
    let added = added?;
    let Some(DecodedNodes {
        default_domain_ops,
        only_constants,
    }) = decoded
    else {
        return Ok(None);
    };
    if added < count || (only_constants && count > 0) {
        return Ok(None);
    }
    declare_outputs(&mut builder, proto)?;
    builder
        .build()
        .map(|graph| Some((graph, default_domain_ops)))
}

/// What the decoding thread learnt of the nodes on the way.
struct DecodedNodes {
    default_domain_ops: BTreeSet<String>,
    /// Every node is a default-domain Constant (see [`load_streaming`]).
    only_constants: bool,
}

/// Decodes `nodes` in order, feeds each one's encoding to `hasher` and sends them on in batches,
/// dropping those `built` gives back. `None` when a node does not decode; it stops early,
/// without saying so, when the builder hung up (an error the builder reports).
fn decode_nodes(
    nodes: Vec<EncodedNode<'_>>,
    hasher: &mut sha2::Sha256,
    batches: std::sync::mpsc::SyncSender<Vec<NodeProto>>,
    built: &std::sync::mpsc::Receiver<Vec<NodeProto>>,
) -> Option<DecodedNodes> {
    let learnt = decode_and_send(nodes, hasher, &batches, built);
    // The builder's loop ends with the channel, and gives back the last batches meanwhile.
    drop(batches);
    built.iter().for_each(drop);
    learnt
}

/// [`decode_nodes`] but for the last batches given back.
fn decode_and_send(
    nodes: Vec<EncodedNode<'_>>,
    hasher: &mut sha2::Sha256,
    batches: &std::sync::mpsc::SyncSender<Vec<NodeProto>>,
    built: &std::sync::mpsc::Receiver<Vec<NodeProto>>,
) -> Option<DecodedNodes> {
    use sha2::Digest;
    let mut learnt = DecodedNodes {
        default_domain_ops: BTreeSet::new(),
        only_constants: true,
    };
    let mut batch = Vec::with_capacity(NODES_PER_BATCH);
    for encoded in nodes {
        let node = encoded.decode().ok()?;
        node.encode_as_graph_field(&mut |bytes| hasher.update(bytes));
        learnt.only_constants &= is_default_constant(&node);
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if default_domain && !learnt.default_domain_ops.contains(&node.op_type) {
            learnt.default_domain_ops.insert(node.op_type.clone());
        }
        batch.push(node);
        if batch.len() == NODES_PER_BATCH {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(NODES_PER_BATCH));
            if batches.send(full).is_err() {
                return Some(learnt);
            }
            built.try_iter().for_each(drop);
        }
    }
    if !batch.is_empty() {
        // A closed channel here also means the builder stopped, which it reports.
        let _ = batches.send(batch);
    }
    Some(learnt)
}

/// The default domain's op types, for the opset's warnings.
fn default_domain_ops(graph: &GraphProto) -> BTreeSet<&str> {
    // Consecutive nodes often share their op; comparing with the last one inserted spares most
    // of a million-node graph's lookups in the set.
    let mut ops = BTreeSet::new();
    let mut last = None;
    for node in &graph.node {
        let op = node.op_type.as_str();
        if last != Some(op) && (node.domain.is_empty() || node.domain == "ai.onnx") {
            ops.insert(op);
            last = Some(op);
        }
    }
    ops
}

/// Runs `build` while another thread hashes the file's bytes; returns what `build` returned
/// and the file's sha256. On the million-node stack of `benches/scale.sh` hashing the file
/// took 0.25 s, against seconds of building the graph (docs/benchmarks.md, "Limits at any size").
/// Without a thread, the hash comes after. (The protobuf's digests stay on this thread: its messages
/// cache their lengths in cells, which threads cannot share.)
fn beside_file_hash<T>(bytes: &[u8], build: impl FnOnce() -> T) -> (T, String) {
    let hash = || sha256_hex(bytes);
    std::thread::scope(|scope| {
        let hashing = std::thread::Builder::new()
            .name("file-sha256".into())
            .spawn_scoped(scope, hash);
        let built = build();
        let sha256 = match hashing {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => hash(),
        };
        (built, sha256)
    })
}

/// Names the format of files that are often passed by mistake, from their first bytes. Asked
/// only once decoding has failed, so a model whose bytes happen to start so is still read.
fn sniff_other_format(bytes: &[u8]) -> Option<&'static str> {
    const MAGICS: &[(&[u8], &str)] = &[
        (b"\x1f\x8b", "a gzip archive (decompress it first)"),
        (
            b"PK\x03\x04",
            "a zip archive (a PyTorch checkpoint or a zipped model?)",
        ),
        (b"\x89HDF", "an HDF5 file (a Keras model?)"),
        (b"\x80\x02", "a Python pickle"),
        (b"GGUF", "a GGUF file"),
        (b"\x7fELF", "an executable"),
    ];
    if let Some((_, name)) = MAGICS.iter().find(|(magic, _)| bytes.starts_with(magic)) {
        return Some(name);
    }
    // onnxruntime's ORT format is a FlatBuffer with file identifier "ORTM" at offset 4.
    if bytes.get(4..8) == Some(b"ORTM") {
        return Some("an onnxruntime .ort file (convert the .onnx it came from instead)");
    }
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') => Some("JSON text, not binary protobuf"),
        _ => None,
    }
}

fn read_opsets(proto: &ModelProto) -> Result<BTreeMap<String, i64>, Error> {
    let mut opsets = BTreeMap::new();
    for import in &proto.opset_import {
        let domain = if import.domain == "ai.onnx" {
            String::new()
        } else {
            import.domain.clone()
        };
        opsets.insert(domain, import.version);
    }
    // A model may import only other domains (ai.onnx.ml, training); it then has no default-
    // domain nodes to version. Opsets newer than pipecut knows load with a warning.
    if let Some(&default) = opsets.get("") {
        if default < 1 {
            return Err(Error::UnsupportedOpset {
                domain: "ai.onnx".into(),
                version: default,
                supported: "opsets from 1 on".into(),
            });
        }
    }
    Ok(opsets)
}

fn graph_name(proto: &GraphProto) -> String {
    match proto.name.is_empty() {
        true => "main".to_string(),
        false => proto.name.clone(),
    }
}

fn build_graph(
    proto: &GraphProto,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
) -> Result<Graph, Error> {
    let mut builder = Graph::builder(graph_name(proto));
    populate(&mut builder, proto, opsets, external, &[])?;
    builder.build()
}

/// Declares a graph's opsets, initializers, inputs (after them, `captures`: the enclosing
/// scopes' tensors a subgraph reads, as inputs of unknown type), nodes and outputs.
fn populate(
    builder: &mut GraphBuilder,
    proto: &GraphProto,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
    captures: &[String],
) -> Result<(), Error> {
    declare_values(builder, proto, proto.node.len(), opsets, external, captures)?;
    // A graph of Constant nodes alone (onnx's `test_constant`) would have no operator left once
    // they become parameters, and an empty graph has nothing to plan or run: they stay nodes
    // then, the whole model one stage that produces its constants.
    let only_constants = proto.node.iter().all(is_default_constant);
    for (index, node) in proto.node.iter().enumerate() {
        add_node(builder, node, index, only_constants, opsets, external)?;
    }
    declare_outputs(builder, proto)
}

/// Declares a graph's opsets, initializers and inputs (then `captures`), with room for
/// `nodes` nodes.
fn declare_values(
    builder: &mut GraphBuilder,
    proto: &GraphProto,
    nodes: usize,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
    captures: &[String],
) -> Result<(), Error> {
    for (domain, version) in opsets {
        builder.opset(domain, *version);
    }
    // Each node writes about one tensor; the weights and inputs are the rest.
    builder.reserve(nodes, nodes + proto.initializer.len() + proto.input.len());
    for init in &proto.initializer {
        let decoded = decode_tensor(init, external)?;
        let param = decoded.param();
        builder.parameter(
            &init.name,
            decoded.dtype,
            &decoded.dims,
            param,
            decoded.value,
        )?;
    }
    for sparse in &proto.sparse_initializer {
        sparse_parameter(builder, sparse, external)?;
    }
    for input in &proto.input {
        // Before IR 4, every initializer was also listed as an input; it stays a parameter.
        if builder.is_defined(&input.name) {
            continue;
        }
        let (kind, dtype, shape) = decode_value_type(&input.name, input.type_.as_deref())?;
        builder.input(&input.name, dtype, shape)?;
        builder.kind(&input.name, kind);
    }
    for name in captures {
        builder.input(name, None, None)?;
    }
    Ok(())
}

/// Adds node #`index`: an operator, or (unless `constants_stay_nodes`) a parameter when it is a
/// default-domain Constant.
fn add_node(
    builder: &mut GraphBuilder,
    node: &NodeProto,
    index: usize,
    constants_stay_nodes: bool,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
) -> Result<(), Error> {
    let literal = match constants_stay_nodes {
        true => None,
        false => constant_literal(node)?,
    };
    if let Some(literal) = literal {
        return constant_parameter(builder, node, index, literal);
    }
    check_legacy_node(node, opsets.get("").copied())?;
    let spec = node_spec(node, index, opsets, external, builder)?;
    builder.node_reading(spec, node.input.iter().map(String::as_str))?;
    Ok(())
}

/// Declares a graph's outputs.
fn declare_outputs(builder: &mut GraphBuilder, proto: &GraphProto) -> Result<(), Error> {
    for output in &proto.output {
        builder.output(&output.name);
        let (kind, _, _) = decode_value_type(&output.name, output.type_.as_deref())?;
        if !kind.is_tensor() {
            builder.kind(&output.name, kind);
        }
    }
    Ok(())
}

/// Declares a sparse initializer as a parameter of its dense shape, whose memory is what the
/// sparse form stores: values plus indices.
fn sparse_parameter(
    builder: &mut GraphBuilder,
    sparse: &SparseTensorProto,
    external: &mut ExternalFiles,
) -> Result<(), Error> {
    let values = sparse
        .values
        .as_ref()
        .ok_or_else(|| Error::InvalidModel("a sparse initializer has no values tensor".into()))?;
    let dense_dims = sparse
        .dims
        .iter()
        .map(|&d| {
            u64::try_from(d).map_err(|_| Error::InvalidDim {
                tensor: values.name.clone(),
                detail: format!("sparse initializer dimension {d} is negative"),
            })
        })
        .collect::<Result<Vec<u64>, Error>>()?;
    let decoded_values = decode_tensor(values, external)?;
    let index_bytes = match sparse.indices.as_ref() {
        Some(ix) => decode_tensor(ix, external)?.bytes,
        None => 0,
    };
    let param = Param {
        bytes: decoded_values.bytes + index_bytes,
        storage: Storage::Embedded,
    };
    builder.parameter(&values.name, decoded_values.dtype, &dense_dims, param, None)?;
    Ok(())
}

/// Declares the output of Constant node #`index` as a parameter holding `literal`: a Constant
/// node is a weight written another way (Paddle2ONNX stores every weight so), placed and
/// counted like an initializer instead of being scheduled as an operator.
fn constant_parameter(
    builder: &mut GraphBuilder,
    node: &NodeProto,
    index: usize,
    literal: DecodedTensor,
) -> Result<(), Error> {
    let output = node
        .output
        .first()
        .filter(|o| !o.is_empty())
        .ok_or_else(|| {
            Error::InvalidModel(format!(
                "Constant node #{index} '{}' has no output",
                node.name
            ))
        })?;
    let param = Param {
        bytes: literal.bytes,
        storage: Storage::Embedded,
    };
    builder.parameter(output, literal.dtype, &literal.dims, param, literal.value)?;
    Ok(())
}

/// Whether a node is the default domain's `Constant`.
fn is_default_constant(node: &NodeProto) -> bool {
    node.op_type == "Constant" && (node.domain.is_empty() || node.domain == "ai.onnx")
}

/// The value of a default-domain `Constant` node, as a decoded tensor; `None` for other nodes.
fn constant_literal(node: &NodeProto) -> Result<Option<DecodedTensor>, Error> {
    if !is_default_constant(node) {
        return Ok(None);
    }
    let attr = node.attribute.first().ok_or_else(|| {
        Error::InvalidModel(format!(
            "Constant node '{}' has no value attribute",
            node.name
        ))
    })?;
    let mut literal = TensorProto::new();
    match attr.name.as_str() {
        "value" => match attr.t.as_ref() {
            Some(t) => literal = (**t).clone(),
            None => {
                return Err(Error::InvalidModel(format!(
                    "Constant node '{}' has an empty 'value'",
                    node.name
                )))
            }
        },
        "value_float" => {
            literal.data_type = DType::F32.onnx_code();
            literal.float_data = vec![attr.f];
        }
        "value_floats" => {
            literal.data_type = DType::F32.onnx_code();
            literal.dims = vec![attr.floats.len() as i64];
            literal.float_data = attr.floats.clone();
        }
        "value_int" => {
            literal.data_type = DType::I64.onnx_code();
            literal.int64_data = vec![attr.i];
        }
        "value_ints" => {
            literal.data_type = DType::I64.onnx_code();
            literal.dims = vec![attr.ints.len() as i64];
            literal.int64_data = attr.ints.clone();
        }
        "value_string" => {
            literal.data_type = DType::String.onnx_code();
            literal.string_data = vec![attr.s.clone()];
        }
        "value_strings" => {
            literal.data_type = DType::String.onnx_code();
            literal.dims = vec![attr.strings.len() as i64];
            literal.string_data = attr.strings.clone();
        }
        // Sparse constants and anything newer stay operators, inferred by the shape rule.
        _ => return Ok(None),
    }
    if literal.name.is_empty() {
        literal.name = node.output.first().cloned().unwrap_or_default();
    }
    decode_tensor(&literal, &mut ExternalFiles::new(None)).map(Some)
}

/// A unique, non-empty node name: ONNX allows empty and repeated names, but plans list nodes by
/// name, so the loader names them `<op>_<index>` or suffixes repeats with `__<index>`.
/// The node's name, made non-empty and unique among the nodes built so far.
fn unique_node_name(node: &NodeProto, index: usize, builder: &GraphBuilder) -> String {
    let name = if node.name.is_empty() {
        format!("{}_{index}", node.op_type)
    } else {
        node.name.clone()
    };
    if builder.has_node(&name) {
        return format!("{name}__{index}");
    }
    name
}

/// The node to build. Its strings are copied, not moved out of the protobuf: freeing the moved
/// ones during the build left holes in the decoded file's memory that the graph then filled,
/// and the scattered graph slowed a million-node solve by half (docs/benchmarks.md).
fn node_spec(
    node: &NodeProto,
    index: usize,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
    builder: &GraphBuilder,
) -> Result<NodeSpec, Error> {
    let name = unique_node_name(node, index, builder);
    let mut attributes = Attributes::with_capacity(node.attribute.len());
    let mut captures = BTreeSet::new();
    for attr in &node.attribute {
        let value = decode_attribute(attr, &name, opsets, external)?;
        for graph in attr.g.as_deref().into_iter().chain(&attr.graphs) {
            outer_scope_reads(graph, &mut captures);
        }
        attributes.insert(attr.name.clone(), value);
    }
    Ok(NodeSpec {
        name,
        op_type: node.op_type.clone(),
        domain: node.domain.clone(),
        // Lent to the builder instead (`GraphBuilder::node_reading`).
        inputs: Vec::new(),
        outputs: node.output.clone(),
        attributes,
        captures: captures.into_iter().collect(),
        module_scope: node
            .metadata_props
            .iter()
            .find(|entry| entry.key == super::scopes::NAME_SCOPES_KEY)
            .and_then(|entry| super::scopes::scope_path(&entry.value)),
    })
}

fn utf8(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn decode_attribute(
    attr: &AttributeProto,
    node: &str,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
) -> Result<Attribute, Error> {
    let mut no_files = ExternalFiles::new(None);
    Ok(match attr.attribute_type() {
        AttributeType::INT => Attribute::Int(attr.i),
        AttributeType::FLOAT => Attribute::Float(attr.f),
        AttributeType::STRING => Attribute::String(utf8(&attr.s)),
        AttributeType::INTS => Attribute::Ints(attr.ints.clone()),
        AttributeType::FLOATS => Attribute::Floats(attr.floats.clone()),
        AttributeType::STRINGS => {
            Attribute::Strings(attr.strings.iter().map(|s| utf8(s)).collect())
        }
        AttributeType::TENSOR => {
            let tensor = attr.t.as_ref().ok_or_else(|| {
                Error::InvalidModel(format!(
                    "attribute '{}' of node '{node}' has no tensor",
                    attr.name
                ))
            })?;
            Attribute::Tensor(decode_tensor(tensor, &mut no_files)?.into_literal())
        }
        AttributeType::GRAPH => match attr.g.as_ref() {
            Some(g) => Attribute::Graph(load_subgraph(g, opsets, external)?),
            None => Attribute::Other("graph"),
        },
        AttributeType::GRAPHS => Attribute::Graphs(
            attr.graphs
                .iter()
                .map(|g| load_subgraph(g, opsets, external))
                .collect::<Result<_, _>>()?,
        ),
        AttributeType::TENSORS => Attribute::Other("tensors"),
        AttributeType::SPARSE_TENSOR | AttributeType::SPARSE_TENSORS => {
            Attribute::Other("sparse tensor")
        }
        AttributeType::TYPE_PROTO => match attr.tp.as_ref() {
            Some(tp) => {
                let (kind, dtype, shape) = decode_value_type(&attr.name, Some(tp))?;
                Attribute::Type(kind, dtype, shape)
            }
            None => Attribute::Other("type"),
        },
        AttributeType::TYPE_PROTOS => Attribute::Other("types"),
        AttributeType::UNDEFINED => Attribute::Other("undefined"),
    })
}

/// A subgraph with its body built like a model's graph.
fn load_subgraph(
    graph: &GraphProto,
    opsets: &BTreeMap<String, i64>,
    external: &mut ExternalFiles,
) -> Result<Subgraph, Error> {
    let mut captures = BTreeSet::new();
    outer_scope_reads(graph, &mut captures);
    let captures: Vec<String> = captures.into_iter().collect();
    let mut builder = Graph::builder(graph.name.clone());
    populate(&mut builder, graph, opsets, external, &captures)?;
    let body = builder.build_subgraph()?;
    let outputs = graph
        .output
        .iter()
        .map(|o| {
            let (dtype, shape) = decode_type(&o.name, o.type_.as_deref())?;
            Ok::<_, Error>((o.name.clone(), dtype, shape))
        })
        .collect::<Result<Vec<(String, Option<DType>, _)>, Error>>()?;
    Ok(Subgraph {
        name: graph.name.clone(),
        node_count: count_nodes(graph),
        outputs,
        formal_inputs: body.inputs().len() - captures.len(),
        body: Arc::new(body),
    })
}

fn count_nodes(graph: &GraphProto) -> usize {
    graph
        .node
        .iter()
        .map(|n| {
            1 + n
                .attribute
                .iter()
                .flat_map(|a| a.g.as_deref().into_iter().chain(&a.graphs))
                .map(count_nodes)
                .sum::<usize>()
        })
        .sum()
}

/// Names a subgraph reads from the enclosing scope: read somewhere inside (at any depth) but
/// defined nowhere inside. ONNX forbids shadowing, so this set is exact.
fn outer_scope_reads(graph: &GraphProto, captures: &mut BTreeSet<String>) {
    let mut defined = HashSet::new();
    let mut read = Vec::new();
    collect_names(graph, &mut defined, &mut read);
    captures.extend(
        read.into_iter()
            .filter(|n| !n.is_empty() && !defined.contains(n)),
    );
}

fn collect_names(graph: &GraphProto, defined: &mut HashSet<String>, read: &mut Vec<String>) {
    defined.extend(graph.input.iter().map(|i| i.name.clone()));
    defined.extend(graph.initializer.iter().map(|i| i.name.clone()));
    for node in &graph.node {
        defined.extend(node.output.iter().cloned());
        read.extend(node.input.iter().cloned());
        for attr in &node.attribute {
            for sub in attr.g.as_deref().into_iter().chain(&attr.graphs) {
                collect_names(sub, defined, read);
            }
        }
    }
    read.extend(graph.output.iter().map(|o| o.name.clone()));
}

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod streaming_tests {
    use super::*;
    use std::path::Path;

    fn onnx_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                onnx_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "onnx") {
                out.push(path);
            }
        }
    }

    /// What a test compares of two loads: the digests, warnings, and every node and tensor
    /// as the graph holds them.
    fn summary(model: &Model) -> String {
        let graph = &model.graph;
        let nodes: Vec<_> = graph
            .nodes()
            .map(|(id, n)| format!("{id:?} {n:?}"))
            .collect();
        let tensors: Vec<_> = graph
            .tensors()
            .map(|(id, t)| format!("{id:?} {t:?}"))
            .collect();
        format!(
            "{} {} {} {:?} {:?} {:?} {:?} {nodes:?} {tensors:?}",
            model.sha256,
            model.graph_sha256,
            model.weights_sha256,
            model.warnings,
            model.producer,
            graph.inputs(),
            graph.outputs()
        )
    }

    #[test]
    fn nodes_decoded_one_at_a_time_load_as_the_whole_decoding_does() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        onnx_files(&root.join("fixtures"), &mut files);
        onnx_files(&root.join("tests"), &mut files);
        files.sort();
        let mut streamed = 0;
        for path in &files {
            let bytes = std::fs::read(path).unwrap();
            let origin = path.display().to_string();
            let dir = path.parent().map(Path::to_path_buf);
            let whole = decode_whole(&bytes, &origin, dir.clone());
            let Ok(Some((proto, nodes))) = ModelProto::decode_with_nodes_aside(&bytes) else {
                assert!(whole.is_err() || bytes.is_empty(), "{origin}: set aside");
                continue;
            };
            match (load_streaming(proto, nodes, &bytes, &origin, dir), whole) {
                (Ok(Some(streaming)), Ok(whole)) => {
                    assert_eq!(summary(&streaming), summary(&whole), "{origin}");
                    streamed += 1;
                }
                (Ok(Some(_)), Err(e)) => panic!("{origin}: only the whole decoding fails: {e}"),
                // The loader falls back to the whole decoding for these.
                (Ok(None) | Err(_), _) => {}
            }
        }
        println!("{streamed} of {} files streamed", files.len());
        // 75 with fixtures/real/cache; the rest are the malformed models of tests/.
        assert!(streamed >= 70, "{streamed} streamed");
    }

    #[test]
    fn a_model_with_two_graph_fields_is_decoded_whole_and_the_last_counts() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut bytes = std::fs::read(root.join("fixtures/models/mlp.onnx")).unwrap();
        let gpt2 = std::fs::read(root.join("fixtures/models/gpt2_tiny.onnx")).unwrap();
        let graph = ModelProto::decode(&gpt2).unwrap().graph.unwrap().to_bytes();
        bytes.push(7 << 3 | 2);
        let mut len = graph.len();
        while len >= 0x80 {
            bytes.push(len as u8 | 0x80);
            len >>= 7;
        }
        bytes.push(len as u8);
        bytes.extend_from_slice(&graph);
        assert!(matches!(
            ModelProto::decode_with_nodes_aside(&bytes),
            Ok(None)
        ));
        let loaded = decode_model(&bytes, "m", None).unwrap();
        assert_eq!(
            summary(&loaded),
            summary(&decode_whole(&bytes, "m", None).unwrap())
        );
        let gpt2 = decode_model(&gpt2, "g", None).unwrap();
        assert_eq!(loaded.graph.node_count(), gpt2.graph.node_count());
        assert_eq!(loaded.graph_sha256, gpt2.graph_sha256);
    }

    /// mlp.onnx's input through a chain of `count` Relu nodes, so long that the decoding
    /// thread fills the channel and waits on the builder.
    fn relu_chain(count: usize) -> ModelProto {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let bytes = std::fs::read(root.join("fixtures/models/mlp.onnx")).unwrap();
        let mut model = ModelProto::decode(&bytes).unwrap();
        let graph = model.graph.as_mut().unwrap();
        graph.initializer.clear();
        graph.input.truncate(1);
        graph.output.truncate(1);
        graph.value_info.clear();
        let mut last = graph.input[0].name.clone();
        graph.node = (0..count)
            .map(|index| {
                let out = format!("t{index}");
                let mut node = NodeProto::default();
                node.input = vec![std::mem::replace(&mut last, out.clone())];
                node.output = vec![out];
                node.name = format!("relu{index}");
                node.op_type = "Relu".into();
                node
            })
            .collect();
        graph.output[0].name = last;
        model
    }

    /// Loads `bytes` both ways: what `decode_model` returns, streamed where it could be, and
    /// whether the streaming took it.
    fn both_ways(bytes: &[u8]) -> (Result<Model, Error>, Result<Model, Error>, bool) {
        let (proto, nodes) = ModelProto::decode_with_nodes_aside(bytes).unwrap().unwrap();
        let streamed = matches!(load_streaming(proto, nodes, bytes, "m", None), Ok(Some(_)));
        (
            decode_model(bytes, "m", None),
            decode_whole(bytes, "m", None),
            streamed,
        )
    }

    #[test]
    fn a_long_chain_streams_through_the_decoding_thread() {
        let bytes = relu_chain(20 * NODES_PER_BATCH + 7).to_bytes();
        let (loaded, whole, streamed) = both_ways(&bytes);
        assert!(streamed);
        assert_eq!(summary(&loaded.unwrap()), summary(&whole.unwrap()));
    }

    #[test]
    fn a_builder_error_early_stops_the_decoding_thread_and_the_whole_decoding_says_it() {
        let mut model = relu_chain(20 * NODES_PER_BATCH);
        // Node 1 writes the graph's input: two producers of one tensor.
        let graph = model.graph.as_mut().unwrap();
        graph.node[1].output[0] = graph.input[0].name.clone();
        graph.node[2].input[0] = graph.input[0].name.clone();
        let (loaded, whole, streamed) = both_ways(&model.to_bytes());
        assert!(!streamed);
        let error = loaded.expect_err("two producers").to_string();
        assert_eq!(error, whole.err().unwrap().to_string());
        assert!(error.contains("relu1"), "{error}");
    }

    #[test]
    fn a_node_that_does_not_decode_late_in_the_graph_is_reported_by_the_whole_decoding() {
        let mut model = relu_chain(20 * NODES_PER_BATCH);
        let graph = model.graph.as_mut().unwrap();
        let last = graph.node.len() - 1;
        graph.node[last].name = "NOT-UTF-8-NAME".into();
        let mut bytes = model.to_bytes();
        let at = bytes
            .windows(14)
            .position(|w| w == b"NOT-UTF-8-NAME")
            .unwrap();
        bytes[at] = 0xff;
        let (loaded, whole, streamed) = both_ways(&bytes);
        assert!(!streamed);
        let error = loaded.expect_err("not UTF-8").to_string();
        assert_eq!(error, whole.err().unwrap().to_string());
    }

    #[test]
    fn corrupted_models_load_or_fail_as_the_whole_decoding_does() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let bytes = std::fs::read(root.join("fixtures/models/gpt2_tiny.onnx")).unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        for round in 0..300 {
            let mut corrupt = bytes.clone();
            for _ in 0..=round % 4 {
                let at = next() % corrupt.len();
                corrupt[at] = next() as u8;
            }
            if round % 5 == 0 {
                corrupt.truncate(next() % corrupt.len());
            }
            let loaded = decode_model(&corrupt, "m", None).map(|m| summary(&m));
            let whole = decode_whole(&corrupt, "m", None).map(|m| summary(&m));
            match (loaded, whole) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "round {round}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "round {round}"),
                (a, b) => panic!("round {round}: {:?} against {:?}", a.err(), b.err()),
            }
        }
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    fn mlp() -> ModelProto {
        let bytes = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/models/mlp.onnx"
        ))
        .expect("fixture");
        ModelProto::decode(&bytes).expect("decodes")
    }

    #[test]
    fn changed_weights_keep_the_graph_digest() {
        let original = mlp();
        let mut tuned = original.clone();
        let graph = tuned.graph.as_mut().expect("graph");
        let init = graph
            .initializer
            .iter_mut()
            .find(|t| !t.raw_data.is_empty() || !t.float_data.is_empty())
            .expect("an embedded initializer");
        if let Some(b) = init.raw_data.first_mut() {
            *b ^= 0xff;
        } else {
            init.float_data[0] += 1.0;
        }
        let (a, b) = (
            original.graph.as_ref().unwrap(),
            tuned.graph.as_ref().unwrap(),
        );
        assert_eq!(graph_sha256(a), graph_sha256(b));
        assert_ne!(weights_sha256(a), weights_sha256(b));
    }

    #[test]
    fn a_changed_node_changes_the_graph_digest() {
        let original = mlp();
        let mut edited = original.clone();
        edited.graph.as_mut().unwrap().node[0].op_type.push('X');
        let (a, b) = (
            original.graph.as_ref().unwrap(),
            edited.graph.as_ref().unwrap(),
        );
        assert_ne!(graph_sha256(a), graph_sha256(b));
        assert_eq!(weights_sha256(a), weights_sha256(b));
        assert_eq!(graph_sha256(a), graph_sha256(&a.clone()));
    }
}
