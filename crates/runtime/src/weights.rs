//! Loading a model's weights (initializers and `Constant` values) into host tensors.
//!
//! The planner never reads weight bytes ([`pipecut_ir::onnx`] records only where they live); the
//! runtime does. The model file and every external-data file are memory-mapped, so a weight is
//! read once, straight from the page cache into its fp32/int64 buffer, and external files are
//! never copied whole. Each external reference is checked again against the mapped file (the file
//! may have changed since the model was loaded): offset and length must lie inside it and the
//! length must hold the bytes the dims need.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use onnx_protobuf::{Message, ModelProto, TensorProto};

use super::tensor::{HostTensor, TensorData};
use crate::Error;
use pipecut_ir::graph::{DType, Graph, Storage, TensorId};

/// Every parameter of a graph as a host tensor, shared between stages without copies.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    by_tensor: HashMap<TensorId, Arc<HostTensor>>,
    /// The weights inside subgraphs (initializers and `Constant`s of `If` branches, `Loop`
    /// bodies), by name: ONNX names are unique across a model's scopes.
    in_subgraphs: Arc<HashMap<String, Arc<HostTensor>>>,
}

impl Weights {
    /// Reads every parameter of `graph` from the model file it was loaded from (`model_path`)
    /// and its external-data files.
    pub fn load(model_path: &Path, graph: &Graph) -> Result<Weights, Error> {
        Weights::from_model_bytes(&pipecut_ir::io::read_model_bytes(model_path)?, graph)
    }

    /// Reads only the parameters of `graph` that `nodes` read (one stage's): a rank of a
    /// distributed job touches no byte of another stage's external data, so a weight file it
    /// does not need may be absent, truncated or elsewhere.
    pub fn load_for_nodes(
        model_path: &Path,
        graph: &Graph,
        nodes: &[pipecut_ir::graph::NodeId],
    ) -> Result<Weights, Error> {
        let nodes: std::collections::HashSet<_> = nodes.iter().copied().collect();
        let bytes = pipecut_ir::io::read_model_bytes(model_path)?;
        Weights::decode(&bytes, graph, &|id| {
            graph.tensor(id).consumers.iter().any(|n| nodes.contains(n))
        })
    }

    /// Reads the parameters of `graph` stored inside the model file (`model_path`), leaving out
    /// those in external data: for a rewrite that reads only parts of those
    /// ([`pipecut_ir::onnx::export::rank_data`]).
    pub fn load_embedded(model_path: &Path, graph: &Graph) -> Result<Weights, Error> {
        let embedded = |id| !matches!(graph.tensor(id).param(), Some(p) if matches!(p.storage, Storage::External { .. }));
        Weights::decode(
            &pipecut_ir::io::read_model_bytes(model_path)?,
            graph,
            &embedded,
        )
    }

    /// Reads every parameter of `graph` from the model's protobuf bytes.
    pub fn from_model_bytes(bytes: &[u8], graph: &Graph) -> Result<Weights, Error> {
        Weights::decode(bytes, graph, &|_| true)
    }

    /// The parameters of `graph` that `wanted` picks, from the model's bytes.
    fn decode(
        bytes: &[u8],
        graph: &Graph,
        wanted: &dyn Fn(TensorId) -> bool,
    ) -> Result<Weights, Error> {
        let proto = ModelProto::parse_from_bytes(bytes).map_err(|e| Error::NotOnnx {
            origin: "<weights>".into(),
            detail: format!("protobuf decoding failed: {e}"),
        })?;
        let graph_proto = proto
            .graph
            .as_ref()
            .ok_or_else(|| Error::InvalidModel("the model has no graph".into()))?;
        let mut sources: HashMap<&str, TensorProto> = HashMap::new();
        for init in &graph_proto.initializer {
            sources.insert(&init.name, init.clone());
        }
        for node in &graph_proto.node {
            if node.op_type != "Constant" || !(node.domain.is_empty() || node.domain == "ai.onnx") {
                continue;
            }
            if let (Some(out), Some(literal)) = (node.output.first(), constant_tensor(node)) {
                sources.insert(out, literal);
            }
        }
        let mut external_reads = ExternalReads::default();
        let mut by_tensor = HashMap::new();
        for (id, tensor) in graph.parameters() {
            let Some(param) = tensor.param() else {
                continue;
            };
            if !wanted(id) {
                continue;
            }
            let proto = sources.get(tensor.name.as_str()).ok_or_else(|| {
                Error::InvalidModel(format!(
                    "parameter '{}' has no initializer or Constant in the model file",
                    tensor.name
                ))
            })?;
            let host = match &param.storage {
                Storage::External {
                    path,
                    offset,
                    length,
                } => {
                    let raw = external_reads.slice(&tensor.name, path, *offset, *length)?;
                    decode_raw(proto, &raw)
                }
                Storage::Embedded => decode_inline(proto),
                Storage::Declared => Err(format!(
                    "parameter '{}' was declared without bytes",
                    tensor.name
                )),
            }
            .map_err(|detail| {
                Error::InvalidModel(format!("cannot read weight '{}': {detail}", tensor.name))
            })?;
            by_tensor.insert(id, Arc::new(host));
        }
        let mut in_subgraphs = HashMap::new();
        for node in &graph_proto.node {
            subgraph_weights(node, &mut in_subgraphs)?;
        }
        Ok(Weights {
            by_tensor,
            in_subgraphs: Arc::new(in_subgraphs),
        })
    }

    /// The weights of a subgraph's body (see [`pipecut_ir::graph::Subgraph`]), for running it.
    pub fn for_subgraph(&self, body: &Graph) -> Result<Weights, Error> {
        let by_tensor = body
            .parameters()
            .map(|(id, tensor)| {
                let weight = self.in_subgraphs.get(&tensor.name).ok_or_else(|| {
                    Error::InvalidModel(format!(
                        "subgraph weight '{}' has no initializer or Constant in the model file",
                        tensor.name
                    ))
                })?;
                Ok((id, Arc::clone(weight)))
            })
            .collect::<Result<_, Error>>()?;
        Ok(Weights {
            by_tensor,
            in_subgraphs: Arc::clone(&self.in_subgraphs),
        })
    }

    /// Gives tensor `id` the constant value `value`, as a weight: a subgraph's input that
    /// stands for a weight of an enclosing graph (`cpu::PreparedBodies`).
    pub(crate) fn insert(&mut self, id: TensorId, value: Arc<HostTensor>) {
        self.by_tensor.insert(id, value);
    }

    /// The weight held by a parameter tensor.
    pub fn get(&self, id: TensorId) -> Option<&Arc<HostTensor>> {
        self.by_tensor.get(&id)
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.by_tensor.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_tensor.is_empty()
    }
}

/// Decodes the initializers and `Constant`s of the subgraphs a node holds, at any depth. Those
/// kept in external data are left out: running their subgraph says so.
fn subgraph_weights(
    node: &onnx_protobuf::NodeProto,
    found: &mut HashMap<String, Arc<HostTensor>>,
) -> Result<(), Error> {
    let bad = |name: &str, detail: String| {
        Error::InvalidModel(format!("cannot read subgraph weight '{name}': {detail}"))
    };
    for attr in &node.attribute {
        for graph in attr.g.as_ref().into_iter().chain(&attr.graphs) {
            for init in graph
                .initializer
                .iter()
                .filter(|t| t.external_data.is_empty())
            {
                let host = decode_inline(init).map_err(|e| bad(&init.name, e))?;
                found.insert(init.name.clone(), Arc::new(host));
            }
            for inner in &graph.node {
                let is_constant = inner.op_type == "Constant"
                    && (inner.domain.is_empty() || inner.domain == "ai.onnx");
                if let (true, Some(out), Some(literal)) =
                    (is_constant, inner.output.first(), constant_tensor(inner))
                {
                    let host = decode_inline(&literal).map_err(|e| bad(out, e))?;
                    found.insert(out.clone(), Arc::new(host));
                }
                subgraph_weights(inner, found)?;
            }
        }
    }
    Ok(())
}

/// The tensor a `Constant` node holds, in the attribute forms that carry numbers or strings.
fn constant_tensor(node: &onnx_protobuf::NodeProto) -> Option<TensorProto> {
    let attr = node.attribute.first()?;
    let mut t = TensorProto::new();
    match attr.name.as_str() {
        "value" => return attr.t.as_ref().cloned(),
        "value_float" => {
            t.data_type = DType::F32.onnx_code();
            t.float_data = vec![attr.f];
        }
        "value_floats" => {
            t.data_type = DType::F32.onnx_code();
            t.dims = vec![attr.floats.len() as i64];
            t.float_data = attr.floats.clone();
        }
        "value_int" => {
            t.data_type = DType::I64.onnx_code();
            t.int64_data = vec![attr.i];
        }
        "value_ints" => {
            t.data_type = DType::I64.onnx_code();
            t.dims = vec![attr.ints.len() as i64];
            t.int64_data = attr.ints.clone();
        }
        "value_string" => {
            t.data_type = DType::String.onnx_code();
            t.string_data = vec![attr.s.clone()];
        }
        "value_strings" => {
            t.data_type = DType::String.onnx_code();
            t.dims = vec![attr.strings.len() as i64];
            t.string_data = attr.strings.clone();
        }
        _ => return None,
    }
    Some(t)
}

/// The external-data files a load reads, each opened once. Slices are read, not mapped: a
/// weight file truncated during the load is an error naming it, never a `SIGBUS`.
#[derive(Default)]
struct ExternalReads {
    files: HashMap<PathBuf, File>,
}

impl ExternalReads {
    fn slice(
        &mut self,
        tensor: &str,
        path: &Path,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, Error> {
        let fail = |detail: String| Error::ExternalData {
            tensor: tensor.to_string(),
            location: path.display().to_string(),
            detail,
        };
        if !self.files.contains_key(path) {
            let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
            self.files.insert(path.to_path_buf(), file);
        }
        let file = &self.files[path];
        let end = offset
            .checked_add(length)
            .ok_or_else(|| fail("offset + length overflows".into()))?;
        let file_len = file
            .metadata()
            .map_err(|e| fail(format!("cannot read: {e}")))?
            .len();
        if end > file_len {
            return Err(fail(format!(
                "needs bytes {offset}..{end} but the file has {file_len} bytes"
            )));
        }
        pipecut_ir::io::read_range(file, offset, length).map_err(|e| {
            fail(format!(
                "cannot read bytes {offset}..{end} (was the file changed meanwhile?): {e}"
            ))
        })
    }
}

fn dims_of(proto: &TensorProto) -> Result<Vec<usize>, String> {
    proto
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is negative")))
        .collect()
}

fn dtype_of(proto: &TensorProto) -> Result<DType, String> {
    DType::from_onnx(proto.data_type)
        .ok_or_else(|| format!("unknown data type {}", proto.data_type))
}

/// Decodes little-endian bytes of `proto`'s dtype and dims (raw data or an external slice).
fn decode_raw(proto: &TensorProto, raw: &[u8]) -> Result<HostTensor, String> {
    let dtype = dtype_of(proto)?;
    let dims = dims_of(proto)?;
    let elements = super::tensor::checked_numel(&dims).ok_or("the dims overflow")?;
    let size = match dtype {
        DType::F32 | DType::I32 | DType::U32 => 4,
        DType::F64 | DType::I64 | DType::U64 => 8,
        DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
        DType::I8 | DType::U8 | DType::Bool => 1,
        other => return Err(format!("the CPU runtime cannot hold {other} weights")),
    };
    let needed = elements.checked_mul(size).ok_or("the dims overflow")?;
    if raw.len() < needed {
        return Err(format!("{} bytes stored, {needed} needed", raw.len()));
    }
    let raw = &raw[..needed];
    fn le<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        raw.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
    }
    let data = match dtype {
        DType::F32 => TensorData::F32(le::<4>(raw).map(f32::from_le_bytes).collect()),
        DType::F64 => TensorData::F32(le::<8>(raw).map(|b| f64::from_le_bytes(b) as f32).collect()),
        DType::F16 => TensorData::F32(
            le::<2>(raw)
                .map(|b| half::f16::from_le_bytes(b).to_f32())
                .collect(),
        ),
        DType::BF16 => TensorData::F32(
            le::<2>(raw)
                .map(|b| half::bf16::from_le_bytes(b).to_f32())
                .collect(),
        ),
        DType::I64 => TensorData::I64(le::<8>(raw).map(i64::from_le_bytes).collect()),
        // uint64 values above i64::MAX do not occur as indices or shapes; they wrap.
        DType::U64 => TensorData::I64(le::<8>(raw).map(|b| u64::from_le_bytes(b) as i64).collect()),
        DType::I32 => TensorData::I32(le::<4>(raw).map(i32::from_le_bytes).collect()),
        DType::U32 => TensorData::I64(le::<4>(raw).map(|b| u32::from_le_bytes(b) as i64).collect()),
        DType::I16 => TensorData::I64(le::<2>(raw).map(|b| i16::from_le_bytes(b) as i64).collect()),
        DType::U16 => TensorData::I64(le::<2>(raw).map(|b| u16::from_le_bytes(b) as i64).collect()),
        DType::I8 => TensorData::I8(raw.iter().map(|&b| b as i8).collect()),
        DType::U8 => TensorData::U8(raw.to_vec()),
        DType::Bool => TensorData::Bool(raw.iter().map(|&b| b != 0).collect()),
        _ => unreachable!("sizes above cover exactly these types"),
    };
    HostTensor::new(dims, data)
}

/// Decodes a tensor stored inside the protobuf: `raw_data`, or the typed field its dtype uses.
fn decode_inline(proto: &TensorProto) -> Result<HostTensor, String> {
    if !proto.raw_data.is_empty() {
        return decode_raw(proto, &proto.raw_data);
    }
    let dims = dims_of(proto)?;
    let data = match dtype_of(proto)? {
        DType::F32 => TensorData::F32(proto.float_data.clone()),
        DType::F64 => TensorData::F32(proto.double_data.iter().map(|&x| x as f32).collect()),
        DType::F16 => TensorData::F32(
            proto
                .int32_data
                .iter()
                .map(|&v| half::f16::from_bits(v as u16).to_f32())
                .collect(),
        ),
        DType::BF16 => TensorData::F32(
            proto
                .int32_data
                .iter()
                .map(|&v| half::bf16::from_bits(v as u16).to_f32())
                .collect(),
        ),
        DType::I64 => TensorData::I64(proto.int64_data.clone()),
        DType::I32 => TensorData::I32(proto.int32_data.clone()),
        DType::I8 => TensorData::I8(proto.int32_data.iter().map(|&v| v as i8).collect()),
        DType::U8 => TensorData::U8(proto.int32_data.iter().map(|&v| v as u8).collect()),
        DType::I16 | DType::U16 => {
            TensorData::I64(proto.int32_data.iter().map(|&v| v as i64).collect())
        }
        DType::U32 | DType::U64 => {
            TensorData::I64(proto.uint64_data.iter().map(|&v| v as i64).collect())
        }
        DType::Bool => TensorData::Bool(proto.int32_data.iter().map(|&v| v != 0).collect()),
        DType::String => TensorData::String(
            proto
                .string_data
                .iter()
                .map(|bytes| {
                    String::from_utf8(bytes.clone())
                        .map_err(|_| "a string element is not UTF-8".to_string())
                })
                .collect::<Result<_, _>>()?,
        ),
        other => return Err(format!("the CPU runtime cannot hold {other} weights")),
    };
    HostTensor::new(dims, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_raw_and_typed_storage() {
        let mut t = TensorProto::new();
        t.data_type = DType::F16.onnx_code();
        t.dims = vec![2];
        t.raw_data = [half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        assert_eq!(decode_inline(&t).unwrap().as_f32().unwrap(), &[1.5, -2.0]);

        let mut t = TensorProto::new();
        t.data_type = DType::I64.onnx_code();
        t.dims = vec![1, 2];
        t.int64_data = vec![7, -8];
        assert_eq!(decode_inline(&t).unwrap().to_i64_vec(), vec![7, -8]);
    }

    #[test]
    fn decodes_string_tensors_and_string_constants() {
        let mut node = onnx_protobuf::NodeProto::new();
        node.attribute = vec![onnx_protobuf::AttributeProto {
            name: "value_strings".into(),
            strings: vec![b"a".to_vec(), "é".as_bytes().to_vec()],
            ..Default::default()
        }];
        let t = constant_tensor(&node).unwrap();
        assert_eq!(
            decode_inline(&t).unwrap().data(),
            &TensorData::String(vec!["a".into(), "é".into()])
        );
        let mut t = t;
        t.string_data[0] = vec![0xff];
        assert!(decode_inline(&t).unwrap_err().contains("not UTF-8"));
    }

    #[test]
    fn refuses_short_data_and_unsupported_types() {
        let mut t = TensorProto::new();
        t.data_type = DType::F32.onnx_code();
        t.dims = vec![4];
        assert!(decode_raw(&t, &[0u8; 12])
            .unwrap_err()
            .contains("12 bytes stored, 16 needed"));
        t.data_type = DType::String.onnx_code();
        assert!(decode_raw(&t, &[0u8; 64])
            .unwrap_err()
            .contains("cannot hold string"));
    }

    #[test]
    fn external_slices_outside_the_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        std::fs::write(&path, [0u8; 16]).unwrap();
        let mut files = ExternalReads::default();
        assert_eq!(files.slice("w", &path, 8, 8).unwrap().len(), 8);
        let err = files.slice("w", &path, 12, 8).unwrap_err().to_string();
        assert!(err.contains("needs bytes 12..20"), "{err}");
        assert!(files.slice("w", &path, u64::MAX, 2).is_err());
    }
}
