//! The codec against rust-protobuf 3.4 + onnx-protobuf 0.2.3 (dev-dependencies only), which
//! decoded models before and whose re-encoding the digests that plans record are: every model
//! under fixtures/ and tests/ must decode alike (or fail alike), re-encode to the same bytes,
//! and give the same `graph_sha256` and `weights_sha256`.

use std::path::{Path, PathBuf};

use protobuf::Message as _;

use super::rust_protobuf_digests::old_digests;
use super::wire::DecodeError;
use super::{GraphProto, ModelProto};
use crate::onnx::{graph_sha256, weights_sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What both decoders make of `bytes`: the re-encoded model and its digests, or that both
/// refused it. Panics where they disagree.
fn compare(bytes: &[u8], what: &str) -> Option<bool> {
    let old = onnx_protobuf::ModelProto::parse_from_bytes(bytes);
    let new = ModelProto::decode(bytes);
    match (old, new) {
        (Err(old), Err(new)) => {
            if let Some(same) = same_kind(&old.to_string()) {
                assert_eq!(new, same, "{what}: rust-protobuf said {old}");
            }
            None
        }
        (Ok(_), Err(e)) => panic!("{what}: rust-protobuf reads it, the codec says: {e}"),
        (Err(e), Ok(_)) => panic!("{what}: the codec reads it, rust-protobuf says: {e}"),
        (Ok(old), Ok(new)) => {
            assert!(
                old.write_to_bytes().unwrap() == new.to_bytes(),
                "{what}: the re-encoded models differ"
            );
            if let (Some(old_graph), Some(new_graph)) = (old.graph.as_ref(), new.graph.as_deref()) {
                let (graph, weights) = old_digests(&mut old_graph.clone());
                assert_eq!(graph, graph_sha256(new_graph), "{what}: graph_sha256");
                assert_eq!(weights, weights_sha256(new_graph), "{what}: weights_sha256");
            }
            Some(has_unknown_fields(&new))
        }
    }
}

/// The codec's error for the rust-protobuf errors whose meaning pipecut's messages named
/// (truncation, a length past its message, nesting); `None` for the others.
fn same_kind(old: &str) -> Option<DecodeError> {
    if old.contains("New limit must not be greater than current limit") {
        Some(DecodeError::LengthOverrun)
    } else if old.contains("Unexpected EOF") {
        Some(DecodeError::UnexpectedEnd)
    } else if old.contains("recursion limit") {
        Some(DecodeError::TooDeep)
    } else {
        None
    }
}

/// Whether the model or its main graph's nodes, attributes, tensors or values carry fields
/// onnx.proto does not declare (a newer ONNX's, or a vendor's).
fn has_unknown_fields(model: &ModelProto) -> bool {
    fn graph_has(g: &GraphProto) -> bool {
        g.has_unknown_fields()
            || g.initializer.iter().any(|t| t.has_unknown_fields())
            || g.input
                .iter()
                .chain(&g.output)
                .chain(&g.value_info)
                .any(|v| {
                    v.has_unknown_fields()
                        || v.type_.as_ref().is_some_and(|t| t.has_unknown_fields())
                })
            || g.node.iter().any(|n| {
                n.has_unknown_fields()
                    || n.attribute.iter().any(|a| {
                        a.has_unknown_fields()
                            || a.t.as_ref().is_some_and(|t| t.has_unknown_fields())
                            || a.g.as_deref().into_iter().chain(&a.graphs).any(graph_has)
                    })
            })
    }
    model.has_unknown_fields()
        || model.opset_import.iter().any(|o| o.has_unknown_fields())
        || model.graph.as_deref().is_some_and(graph_has)
}

fn onnx_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            onnx_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "onnx") {
            out.push(path);
        }
    }
}

#[test]
fn every_fixture_decodes_and_digests_as_with_rust_protobuf() {
    let root = root();
    let cache = root.join("fixtures/real/cache");
    if !cache.is_dir() {
        let message = "the real models are left out: fixtures/real/cache is absent \
                       (bash fixtures/real/fetch.sh fetches them)";
        eprintln!(
            "SKIPPED part of every_fixture_decodes_and_digests_as_with_rust_protobuf: {message}"
        );
        // `.ci/run` fetches them before the tests: on CI their absence is a failure.
        assert!(std::env::var_os("CI").is_none(), "{message}");
    }
    let mut files = Vec::new();
    onnx_files(&root.join("fixtures"), &mut files);
    onnx_files(&root.join("tests"), &mut files);
    files.sort();
    let (mut read, mut refused, mut unknown) = (0, 0, Vec::new());
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        match compare(&bytes, &path.display().to_string()) {
            Some(has_unknown) => {
                read += 1;
                if has_unknown {
                    unknown.push(path.display().to_string());
                }
            }
            None => refused += 1,
        }
    }
    println!(
        "{read} models read alike, {refused} files refused by both; with unknown fields: {unknown:?}"
    );
    assert!(read > 80 && refused > 0, "{read} read, {refused} refused");
}

/// A deterministic generator for the mutations below.
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn corrupted_models_fail_or_read_alike() {
    let bytes = std::fs::read(root().join("fixtures/models/mlp.onnx")).unwrap();
    let mut state = 7;
    for round in 0..400 {
        let mut mutated = bytes.clone();
        for _ in 0..1 + round % 4 {
            let at = lcg(&mut state) as usize % mutated.len();
            mutated[at] = lcg(&mut state) as u8;
        }
        if round % 5 == 0 {
            mutated.truncate(lcg(&mut state) as usize % bytes.len());
        }
        compare(&mutated, &format!("mutation {round}"));
    }
}

/// Encodes a tag and a length-delimited payload.
fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut put = |mut v: u64| {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    };
    put(u64::from(number) << 3 | 2);
    put(payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

/// A model whose graph nests `levels` messages below the model (graph, node, attribute, graph...).
fn nested(levels: usize) -> Vec<u8> {
    // Field numbers from the innermost message out: GraphProto.node, NodeProto.attribute,
    // AttributeProto.g, in a cycle, and the model's graph last.
    let mut message = Vec::new();
    for level in (1..levels).rev() {
        let number = [6, 1, 5][level % 3];
        message = field(number, &message);
    }
    let mut model = vec![0x08, 0x08]; // ir_version 8
    model.extend(field(7, &message));
    model
}

#[test]
fn nesting_is_limited_where_rust_protobuf_limited_it() {
    // The boundary, and a bomb far beyond it: an error, not a stack overflow.
    for levels in (95..=105).chain([5_000]) {
        let bytes = nested(levels);
        let read = compare(&bytes, &format!("{levels} levels"));
        assert_eq!(read.is_some(), levels <= 100, "{levels} levels");
        if levels > 100 {
            assert_eq!(
                ModelProto::decode(&bytes).unwrap_err(),
                DecodeError::TooDeep
            );
        }
    }
    let err = crate::onnx::load_model_from_bytes(&nested(5_000), None).unwrap_err();
    assert!(
        err.to_string().contains("nested more than 100 levels deep"),
        "{err}"
    );
}

#[test]
fn odd_encodings_re_encode_as_rust_protobuf_did() {
    let graph = field(1, &field(3, b"n0")); // one node named n0
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Unknown fields of several numbers and wire types, in the model and the graph: kept
        // and written after the known ones, in rust-protobuf's order.
        ("unknown fields", {
            let mut g = graph.clone();
            g.extend([0xa8, 0x06, 0x05]); // field 101 varint
            g.extend(field(102, b"xyz"));
            g.extend([0xb5, 0x06, 1, 2, 3, 4]); // field 102 fixed32
            g.extend([0xb9, 0x06, 1, 2, 3, 4, 5, 6, 7, 8]); // field 103 fixed64
            g.extend([0xa8, 0x06, 0x07]);
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &g));
            m.extend([0xf8, 0x07, 0x01]); // field 127 varint
            m
        }),
        // A known field with another wire type is an unknown field (name as a varint).
        ("wrong wire type", {
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &[graph.clone(), vec![0x10, 0x01]].concat()));
            m
        }),
        // Repeated numbers unpacked where they are written packed, and the reverse; a singular
        // field given twice keeps the last value; a group is skipped.
        ("packing and repeats", {
            let tensor = [
                vec![0x0a, 0x02, 0x02, 0x03], // dims packed
                vec![0x25, 0, 0, 0x80, 0x3f], // float_data unpacked
                vec![0x10, 0x01, 0x10, 0x07], // data_type twice
                field(8, b"w"),
                vec![0x9b, 0x06, 0x08, 0x01, 0x9c, 0x06], // group 99
            ]
            .concat();
            let mut m = vec![0x08, 0x08, 0x08, 0x09];
            m.extend(field(7, &field(5, &tensor)));
            m
        }),
        // Dimensions: a zero size and an empty name are still written (oneof members).
        ("oneof members", {
            let dims = [
                field(1, &[0x08, 0x00]),
                field(1, &field(2, b"")),
                field(1, &[]),
            ]
            .concat();
            let ty = field(1, &field(2, &dims));
            let value = [field(1, b"x"), field(2, &ty)].concat();
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &field(11, &value)));
            m
        }),
        // Negative int32 and enum values.
        ("negative int32", {
            let mut attr = field(1, b"a");
            attr.extend([
                0xa0, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]);
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &field(1, &field(5, &attr))));
            m
        }),
        // An int32 above 32 bits, a string that is not UTF-8: errors in both.
        ("int32 overflow", {
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &field(5, &[0x10, 0x80, 0x80, 0x80, 0x80, 0x10])));
            m
        }),
        ("not utf-8", {
            let mut m = vec![0x08, 0x08];
            m.extend(field(7, &field(2, &[0xff, 0xfe])));
            m
        }),
    ];
    for (what, bytes) in cases {
        let read = compare(&bytes, what);
        let expect_error = what == "int32 overflow" || what == "not utf-8";
        assert_eq!(read.is_none(), expect_error, "{what}");
        if what == "unknown fields" {
            assert_eq!(read, Some(true), "{what}");
        }
    }
}

#[test]
fn a_large_graph_reserves_its_node_list_once() {
    // Over a mebibyte of nodes, with a name, an initializer and a skipped group among them:
    // the count ahead steps over every other field, and the list is reserved exactly instead
    // of doubled into (here 65,536 slots).
    let nodes = 60_000;
    let mut graph = Vec::new();
    for i in 0..nodes {
        let node = [field(3, format!("node_{i}").as_bytes()), field(4, b"Relu")].concat();
        graph.extend(field(1, &node));
        if i == 10 {
            graph.extend(field(2, b"g"));
            graph.extend(field(5, &field(8, b"w")));
            graph.extend([0x9b, 0x06, 0x08, 0x01, 0x9c, 0x06]); // group 99
        }
    }
    assert!(graph.len() > super::wire::RESERVE_AHEAD_BYTES);
    let decoded = GraphProto::decode(&graph).unwrap();
    assert_eq!(decoded.node.len(), nodes);
    assert_eq!(decoded.node.capacity(), nodes);
    assert_eq!(decoded.node[nodes - 1].name, format!("node_{}", nodes - 1));
    assert_eq!(decoded.initializer.capacity(), 1);
    let model = [vec![0x08, 0x08], field(7, &graph)].concat();
    assert_eq!(compare(&model, "large graph"), Some(false));
}
