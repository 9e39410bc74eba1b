//! onnx.proto's messages (the proto3 form of ONNX 1.16 that onnx-protobuf 0.2.3 was generated
//! from), decoded and encoded by a small codec of our own instead of a protobuf runtime.
//!
//! Why hand-written: the planner's clean build compiled rust-protobuf 3.4 and onnx-protobuf's
//! generated code, its largest units (about 32 s of unit time for `protobuf` alone); prost
//! would cost about 9 s of units of its own on top of the `syn` the planner already builds
//! (bytes, itertools, anyhow, either, prost-derive, prost: measured with `cargo build --release
//! --timings`, docs/benchmarks.md) and it re-encodes differently (field-number order, unknown
//! fields dropped), so the recorded `graph_sha256`/`weights_sha256` would still need an encoder
//! like the one here. These messages write their fields exactly as rust-protobuf's generated
//! code does (declaration order, onnx-protobuf's packed/unpacked choices, unknown fields last),
//! which `tests::digests_match_rust_protobuf` checks on every model under fixtures/.
//!
//! Fields are onnx.proto's, under the names onnx-protobuf gave them (`type` is `type_`); the
//! field docs are onnx.proto's.

#[cfg(test)]
mod rust_protobuf_digests;
#[cfg(test)]
mod tests;
mod wire;

pub use wire::DecodeError;
pub(crate) use wire::{length_prefixed_stream, Message};
use wire::{Bytes, DecodeError as E, Kind, Msg, Packed, Reader, Repeated, Single, Str, Writer};

/// Declares a message: its fields as `number name: type as Kind`, in the order rust-protobuf
/// writes them (onnx.proto's declaration order), and its decoding and encoding.
macro_rules! message {
    ($(#[$meta:meta])* $name:ident { $($number:literal $(| $alt:literal)* $field:ident: $ty:ty as $kind:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq)]
        #[allow(missing_docs)]
        pub struct $name {
            $(pub $field: $ty,)*
            unknown_fields: wire::UnknownFields,
            cached_len: wire::CachedLen,
        }

        impl $name {
            /// An empty message.
            pub fn new() -> Self {
                Self::default()
            }

            /// Decodes the message from its encoding.
            pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
                <Self as wire::Message>::decode(bytes)
            }

            /// The encoding, as rust-protobuf 3.4 wrote it.
            pub fn to_bytes(&self) -> Vec<u8> {
                <Self as wire::Message>::to_bytes(self)
            }

            /// Whether the message carried fields onnx.proto does not declare.
            #[allow(dead_code)]
            pub fn has_unknown_fields(&self) -> bool {
                !self.unknown_fields.is_empty()
            }
        }

        impl wire::Message for $name {
            fn merge_field(&mut self, number: u32, wire: u8, r: &mut Reader<'_>) -> Result<bool, E> {
                match number {
                    $($number $(| $alt)* => <$kind as Kind<$ty>>::merge(&mut self.$field, number, wire, r),)*
                    _ => Ok(false),
                }
            }
            fn unknown_fields_mut(&mut self) -> &mut wire::UnknownFields {
                &mut self.unknown_fields
            }
            fn encoded_len(&self) -> usize {
                let len = 0 $(+ <$kind as Kind<$ty>>::len(&self.$field, $number))* + self.unknown_fields.encoded_len();
                self.cached_len.set(len)
            }
            fn cached_len(&self) -> usize {
                self.cached_len.get()
            }
            fn encode(&self, w: &mut Writer<'_>) {
                $(<$kind as Kind<$ty>>::encode(&self.$field, $number, w);)*
                self.unknown_fields.encode(w);
            }
        }
    };
}

type Of<M> = Option<Box<M>>;

message!(
    /// A model: its graph and the opsets it imports.
    ModelProto {
        1 ir_version: i64 as Single,
        8 opset_import: Vec<OperatorSetIdProto> as Msg,
        2 producer_name: String as Str,
        3 producer_version: String as Str,
        4 domain: String as Str,
        5 model_version: i64 as Single,
        6 doc_string: String as Str,
        7 graph: Of<GraphProto> as Msg,
        14 metadata_props: Vec<StringStringEntryProto> as Msg,
        20 training_info: Vec<TrainingInfoProto> as Msg,
        25 functions: Vec<FunctionProto> as Msg,
    }
);

/// A node of the main graph still encoded, as [`ModelProto::decode_with_nodes_aside`] set it
/// aside.
pub(crate) struct EncodedNode<'a>(Reader<'a>);

impl EncodedNode<'_> {
    /// The node, decoded as [`ModelProto::decode`] would have decoded it.
    pub(crate) fn decode(mut self) -> Result<NodeProto, DecodeError> {
        <NodeProto as wire::Message>::decode_from(&mut self.0)
    }
}

impl NodeProto {
    /// Streams the node's encoding as a field of its graph (tag, length, fields) into `drain`:
    /// its part of the graph's encoding, which [`crate::onnx::graph_sha256`] hashes.
    pub(crate) fn encode_as_graph_field(&self, drain: &mut dyn FnMut(&[u8])) {
        wire::Message::encoded_len(self);
        wire::encode_message(self, 1, &mut Writer::streaming(drain));
    }
}

impl ModelProto {
    /// Decodes a model but for its main graph's nodes, which stay encoded, in file order, for
    /// the loader to decode one at a time while it builds the graph: a million decoded nodes
    /// held at once took 1.4 GB (docs/benchmarks.md, "Limits at any size"). `None` for a file
    /// with more than one graph field, where the last one counts ([`ModelProto::decode`] reads
    /// such a file).
    pub(crate) fn decode_with_nodes_aside(
        bytes: &[u8],
    ) -> Result<Option<(ModelProto, Vec<EncodedNode<'_>>)>, DecodeError> {
        let mut graphs = 0;
        let mut nodes = Vec::new();
        let mut graph = None;
        let mut model: ModelProto =
            wire::decode_setting_aside(&mut Reader::new(bytes), 7, &mut |mut r| {
                graphs += 1;
                let mut set_aside = |node| {
                    nodes.push(EncodedNode(node));
                    Ok(())
                };
                graph = Some(wire::decode_setting_aside(&mut r, 1, &mut set_aside)?);
                Ok(())
            })?;
        if graphs > 1 {
            return Ok(None);
        }
        model.graph = graph.map(Box::new);
        Ok(Some((model, nodes)))
    }
}

message!(
    /// An opset import.
    OperatorSetIdProto {
        1 domain: String as Str,
        2 version: i64 as Single,
    }
);

message!(
    /// A key and a value (metadata, external-data references).
    StringStringEntryProto {
        1 key: String as Str,
        2 value: String as Str,
    }
);

message!(
    /// A graph: nodes in topological order, weights, inputs and outputs.
    GraphProto {
        1 node: Vec<NodeProto> as Msg,
        2 name: String as Str,
        5 initializer: Vec<TensorProto> as Msg,
        15 sparse_initializer: Vec<SparseTensorProto> as Msg,
        10 doc_string: String as Str,
        11 input: Vec<ValueInfoProto> as Msg,
        12 output: Vec<ValueInfoProto> as Msg,
        13 value_info: Vec<ValueInfoProto> as Msg,
        14 quantization_annotation: Vec<TensorAnnotation> as Msg,
        16 metadata_props: Vec<StringStringEntryProto> as Msg,
    }
);

message!(
    /// A node: one operator application.
    NodeProto {
        1 input: Vec<String> as Str,
        2 output: Vec<String> as Str,
        3 name: String as Str,
        4 op_type: String as Str,
        7 domain: String as Str,
        8 overload: String as Str,
        5 attribute: Vec<AttributeProto> as Msg,
        6 doc_string: String as Str,
        9 metadata_props: Vec<StringStringEntryProto> as Msg,
    }
);

message!(
    /// A node's attribute; `type_` says which value field is meant.
    AttributeProto {
        1 name: String as Str,
        21 ref_attr_name: String as Str,
        13 doc_string: String as Str,
        20 type_: i32 as Single,
        2 f: f32 as Single,
        3 i: i64 as Single,
        4 s: Vec<u8> as Bytes,
        5 t: Of<TensorProto> as Msg,
        6 g: Of<GraphProto> as Msg,
        22 sparse_tensor: Of<SparseTensorProto> as Msg,
        14 tp: Of<TypeProto> as Msg,
        7 floats: Vec<f32> as Repeated,
        8 ints: Vec<i64> as Repeated,
        9 strings: Vec<Vec<u8>> as Bytes,
        10 tensors: Vec<TensorProto> as Msg,
        11 graphs: Vec<GraphProto> as Msg,
        23 sparse_tensors: Vec<SparseTensorProto> as Msg,
        15 type_protos: Vec<TypeProto> as Msg,
    }
);

impl AttributeProto {
    /// `type_` as an [`AttributeType`]; values this onnx.proto does not name are `UNDEFINED`.
    pub fn attribute_type(&self) -> AttributeType {
        AttributeType::from_i32(self.type_)
    }
}

/// `AttributeProto.AttributeType`.
#[allow(missing_docs, non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum AttributeType {
    UNDEFINED = 0,
    FLOAT = 1,
    INT = 2,
    STRING = 3,
    TENSOR = 4,
    GRAPH = 5,
    SPARSE_TENSOR = 11,
    TYPE_PROTO = 13,
    FLOATS = 6,
    INTS = 7,
    STRINGS = 8,
    TENSORS = 9,
    GRAPHS = 10,
    SPARSE_TENSORS = 12,
    TYPE_PROTOS = 14,
}

impl AttributeType {
    const ALL: [AttributeType; 15] = [
        Self::UNDEFINED,
        Self::FLOAT,
        Self::INT,
        Self::STRING,
        Self::TENSOR,
        Self::GRAPH,
        Self::SPARSE_TENSOR,
        Self::TYPE_PROTO,
        Self::FLOATS,
        Self::INTS,
        Self::STRINGS,
        Self::TENSORS,
        Self::GRAPHS,
        Self::SPARSE_TENSORS,
        Self::TYPE_PROTOS,
    ];

    /// The type a code names; `UNDEFINED` for codes onnx.proto does not list.
    pub fn from_i32(code: i32) -> Self {
        Self::ALL
            .into_iter()
            .find(|t| *t as i32 == code)
            .unwrap_or(Self::UNDEFINED)
    }
}

impl From<AttributeType> for i32 {
    fn from(t: AttributeType) -> i32 {
        t as i32
    }
}

message!(
    /// A graph input, output or intermediate with its type.
    ValueInfoProto {
        1 name: String as Str,
        2 type_: Of<TypeProto> as Msg,
        3 doc_string: String as Str,
        4 metadata_props: Vec<StringStringEntryProto> as Msg,
    }
);

message!(
    /// Training-only graphs (read past, never used).
    TrainingInfoProto {
        1 initialization: Of<GraphProto> as Msg,
        2 algorithm: Of<GraphProto> as Msg,
        3 initialization_binding: Vec<StringStringEntryProto> as Msg,
        4 update_binding: Vec<StringStringEntryProto> as Msg,
    }
);

message!(
    /// A tensor's quantization parameters, by name.
    TensorAnnotation {
        1 tensor_name: String as Str,
        2 quant_parameter_tensor_names: Vec<StringStringEntryProto> as Msg,
    }
);

/// `TensorProto.DataLocation.EXTERNAL`: the bytes are in another file.
pub const DATA_LOCATION_EXTERNAL: i32 = 1;

message!(
    /// A tensor: dims, dtype and its bytes inline or a reference to external data.
    TensorProto {
        1 dims: Vec<i64> as Repeated,
        2 data_type: i32 as Single,
        3 segment: Of<Segment> as Msg,
        4 float_data: Vec<f32> as Packed,
        5 int32_data: Vec<i32> as Packed,
        6 string_data: Vec<Vec<u8>> as Bytes,
        7 int64_data: Vec<i64> as Packed,
        8 name: String as Str,
        12 doc_string: String as Str,
        9 raw_data: Vec<u8> as Bytes,
        13 external_data: Vec<StringStringEntryProto> as Msg,
        14 data_location: i32 as Single,
        10 double_data: Vec<f64> as Packed,
        11 uint64_data: Vec<u64> as Packed,
        16 metadata_props: Vec<StringStringEntryProto> as Msg,
    }
);

impl TensorProto {
    /// Moves every field out but the name, dtype and dims (what `graph_sha256` hashes of an
    /// initializer), which stay; [`TensorProto::restore_data`] puts the rest back. Neither
    /// allocates: a reduced copy per initializer was two strings and vectors each.
    pub(crate) fn take_data(&mut self) -> TensorProto {
        let mut data = std::mem::take(self);
        self.name = std::mem::take(&mut data.name);
        self.data_type = data.data_type;
        self.dims = std::mem::take(&mut data.dims);
        data
    }

    /// Undoes [`TensorProto::take_data`].
    pub(crate) fn restore_data(&mut self, mut data: TensorProto) {
        data.name = std::mem::take(&mut self.name);
        data.dims = std::mem::take(&mut self.dims);
        *self = data;
    }
}

message!(
    /// `TensorProto.Segment`.
    Segment {
        1 begin: i64 as Single,
        2 end: i64 as Single,
    }
);

message!(
    /// A sparse tensor: its values, their indices, and the dense dims.
    SparseTensorProto {
        1 values: Of<TensorProto> as Msg,
        2 indices: Of<TensorProto> as Msg,
        3 dims: Vec<i64> as Repeated,
    }
);

message!(
    /// A shape: one entry per axis.
    TensorShapeProto {
        1 dim: Vec<tensor_shape_proto::Dimension> as Msg,
    }
);

/// `TensorShapeProto`'s nested messages.
pub mod tensor_shape_proto {
    use super::wire::{Kind, Reader, Str, Writer};
    use super::*;

    message!(
        /// One axis: a size, a symbolic name, or neither.
        Dimension {
            3 denotation: String as Str,
            1 | 2 value: Option<dimension::Value> as DimensionValue,
        }
    );

    /// `Dimension`'s oneof.
    pub mod dimension {
        /// A size or a name.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Value {
            /// A fixed size.
            DimValue(i64),
            /// A symbolic name.
            DimParam(String),
        }
    }

    /// The oneof `value`: field 1 a size, field 2 a name; written even when zero or empty.
    struct DimensionValue;

    impl Kind<Option<dimension::Value>> for DimensionValue {
        fn merge(
            v: &mut Option<dimension::Value>,
            number: u32,
            wire: u8,
            r: &mut Reader<'_>,
        ) -> Result<bool, E> {
            let mut size = 0i64;
            let mut name = String::new();
            let read = match number {
                1 => Single::merge(&mut size, 1, wire, r)?
                    .then_some(dimension::Value::DimValue(size)),
                _ => Str::merge(&mut name, 2, wire, r)?.then_some(dimension::Value::DimParam(name)),
            };
            let known = read.is_some();
            if known {
                *v = read;
            }
            Ok(known)
        }
        fn len(v: &Option<dimension::Value>, _: u32) -> usize {
            match v {
                Some(dimension::Value::DimValue(size)) => {
                    wire::tag_len(1) + wire::varint_len(*size as u64)
                }
                Some(dimension::Value::DimParam(name)) => wire::len_delimited_len(2, name.len()),
                None => 0,
            }
        }
        fn encode(v: &Option<dimension::Value>, _: u32, w: &mut Writer<'_>) {
            match v {
                Some(dimension::Value::DimValue(size)) => {
                    w.tag(1, wire::VARINT);
                    w.varint(*size as u64);
                }
                Some(dimension::Value::DimParam(name)) => w.bytes_field(2, name.as_bytes()),
                None => {}
            }
        }
    }
}

message!(
    /// A value's type: a tensor, sequence, map, optional or sparse tensor.
    TypeProto {
        6 denotation: String as Str,
        1 | 4 | 5 | 9 | 8 value: Option<type_proto::Value> as TypeValue,
    }
);

/// `TypeProto`'s nested messages and oneof.
pub mod type_proto {
    use super::wire::{Kind, Msg, Single};
    use super::*;

    message!(
        /// A tensor type: element type and shape.
        Tensor {
            1 elem_type: i32 as Single,
            2 shape: Of<TensorShapeProto> as Msg,
        }
    );

    message!(
        /// A sequence type.
        Sequence {
            1 elem_type: Of<TypeProto> as Msg,
        }
    );

    message!(
        /// A map type.
        Map {
            1 key_type: i32 as Single,
            2 value_type: Of<TypeProto> as Msg,
        }
    );

    message!(
        /// An optional type.
        Optional {
            1 elem_type: Of<TypeProto> as Msg,
        }
    );

    message!(
        /// A sparse tensor type.
        SparseTensor {
            1 elem_type: i32 as Single,
            2 shape: Of<TensorShapeProto> as Msg,
        }
    );

    /// `TypeProto`'s oneof `value`.
    #[allow(missing_docs)]
    #[derive(Clone, Debug, PartialEq)]
    pub enum Value {
        TensorType(Tensor),
        SequenceType(Sequence),
        MapType(Map),
        OptionalType(Optional),
        SparseTensorType(SparseTensor),
    }
}

/// The oneof `TypeProto.value`: one message, replaced when another member follows.
struct TypeValue;

impl Kind<Option<type_proto::Value>> for TypeValue {
    fn merge(
        v: &mut Option<type_proto::Value>,
        number: u32,
        wire: u8,
        r: &mut Reader<'_>,
    ) -> Result<bool, E> {
        use type_proto::Value::*;
        let read = match number {
            1 => wire::read_message(wire, r)?.map(TensorType),
            4 => wire::read_message(wire, r)?.map(SequenceType),
            5 => wire::read_message(wire, r)?.map(MapType),
            9 => wire::read_message(wire, r)?.map(OptionalType),
            _ => wire::read_message(wire, r)?.map(SparseTensorType),
        };
        let known = read.is_some();
        if known {
            *v = read;
        }
        Ok(known)
    }
    fn len(v: &Option<type_proto::Value>, _: u32) -> usize {
        use type_proto::Value::*;
        match v {
            Some(TensorType(m)) => wire::message_len(m, 1),
            Some(SequenceType(m)) => wire::message_len(m, 4),
            Some(MapType(m)) => wire::message_len(m, 5),
            Some(OptionalType(m)) => wire::message_len(m, 9),
            Some(SparseTensorType(m)) => wire::message_len(m, 8),
            None => 0,
        }
    }
    fn encode(v: &Option<type_proto::Value>, _: u32, w: &mut Writer<'_>) {
        use type_proto::Value::*;
        match v {
            Some(TensorType(m)) => wire::encode_message(m, 1, w),
            Some(SequenceType(m)) => wire::encode_message(m, 4, w),
            Some(MapType(m)) => wire::encode_message(m, 5, w),
            Some(OptionalType(m)) => wire::encode_message(m, 9, w),
            Some(SparseTensorType(m)) => wire::encode_message(m, 8, w),
            None => {}
        }
    }
}

message!(
    /// A model-local function (read past; pipecut does not inline functions).
    FunctionProto {
        1 name: String as Str,
        4 input: Vec<String> as Str,
        5 output: Vec<String> as Str,
        6 attribute: Vec<String> as Str,
        11 attribute_proto: Vec<AttributeProto> as Msg,
        7 node: Vec<NodeProto> as Msg,
        8 doc_string: String as Str,
        9 opset_import: Vec<OperatorSetIdProto> as Msg,
        10 domain: String as Str,
        13 overload: String as Str,
        12 value_info: Vec<ValueInfoProto> as Msg,
        14 metadata_props: Vec<StringStringEntryProto> as Msg,
    }
);
