//! `graph_sha256` and `weights_sha256` as pipecut computed them with rust-protobuf 3.4 and
//! onnx-protobuf 0.2.3 before its own codec (load.rs at 1a10717): the reference the codec's
//! tests (src/onnx/proto/tests.rs) and its speed comparison (benches/decode.rs) hold it to.

use onnx_protobuf::{GraphProto, Message as _, TensorProto};
use sha2::{Digest, Sha256};

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn shape_only(tensor: &TensorProto) -> TensorProto {
    let mut shape = TensorProto::new();
    shape.name = tensor.name.clone();
    shape.data_type = tensor.data_type;
    shape.dims = tensor.dims.clone();
    shape
}

/// (graph digest, weights digest), the graph's initializers set aside and put back as before.
pub fn old_digests(graph: &mut GraphProto) -> (String, String) {
    let mut weights = Sha256::new();
    for init in &graph.initializer {
        let bytes = init.write_to_bytes().unwrap_or_default();
        weights.update((bytes.len() as u64).to_le_bytes());
        weights.update(&bytes);
    }
    let initializers = std::mem::take(&mut graph.initializer);
    let sparse = std::mem::take(&mut graph.sparse_initializer);
    graph.initializer = initializers.iter().map(shape_only).collect();
    graph.sparse_initializer = sparse
        .iter()
        .map(|s| {
            let mut shape = s.clone();
            shape.values = s.values.as_ref().map(shape_only).into();
            shape.indices.clear();
            shape
        })
        .collect();
    let mut hasher = Sha256::new();
    graph.write_to_writer(&mut hasher).expect("in memory");
    graph.initializer = initializers;
    graph.sparse_initializer = sparse;
    (hex(&hasher.finalize()), hex(&weights.finalize()))
}
