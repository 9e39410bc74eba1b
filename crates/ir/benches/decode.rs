//! Decoding a model and its two digests, pipecut-ir's codec against rust-protobuf 3.4 +
//! onnx-protobuf 0.2.3 (which loaded models before it), on the same bytes in one process:
//! the part of loading the codec replaced (building the graph and shape inference are the same
//! code either way).
//!
//! `cargo bench -p pipecut-ir --bench decode [-- MODEL.onnx ...]`: by default the largest
//! committed fixtures and the cached real models (fixtures/real/fetch.sh) that are present.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pipecut_ir::onnx::digests_in_place;
use pipecut_ir::onnx::proto::ModelProto;
use protobuf::Message as _;

#[path = "../src/onnx/proto/rust_protobuf_digests.rs"]
mod rust_protobuf_digests;

/// This thread's processor time: other builds on a shared machine inflate it less than wall
/// time.
fn cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn timed(f: &mut impl FnMut()) -> Duration {
    let start = cpu_time();
    f();
    cpu_time() - start
}

/// The medians of `runs` timings of `a` and of `b`, taken alternately so that both see the same
/// machine.
fn medians(runs: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    let (mut ta, mut tb): (Vec<Duration>, Vec<Duration>) =
        (0..runs).map(|_| (timed(&mut a), timed(&mut b))).unzip();
    ta.sort();
    tb.sort();
    (ta[runs / 2], tb[runs / 2])
}

fn compare(path: &Path) {
    let bytes = std::fs::read(path).expect("readable model");
    let runs = (400_000_000 / bytes.len().max(1)).clamp(11, 301);
    let (old, new) = medians(
        runs,
        || {
            let mut model = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).expect("decodes");
            let graph = model.graph.mut_or_insert_default();
            std::hint::black_box(rust_protobuf_digests::old_digests(graph));
        },
        || {
            let mut model = ModelProto::decode(&bytes).expect("decodes");
            let graph = model.graph.as_deref_mut().expect("graph");
            std::hint::black_box(digests_in_place(graph));
        },
    );
    println!(
        "{:<32} {:>9} bytes  rust-protobuf {:>9.3} ms  codec {:>9.3} ms  ({:.2}x), processor time, median of {runs}",
        path.file_name().unwrap().to_string_lossy(),
        bytes.len(),
        old.as_secs_f64() * 1e3,
        new.as_secs_f64() * 1e3,
        new.as_secs_f64() / old.as_secs_f64(),
    );
}

fn main() {
    let given: Vec<PathBuf> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let defaults = [
        "fixtures/models/gpt3_175b/model.onnx",
        "fixtures/models/gpt2_tiny.onnx",
        "fixtures/models/resnet_tiny.onnx",
        "fixtures/real/cache/paraphrase_minilm_l3_v2.onnx",
        "fixtures/real/cache/ppocr_v4_rec.onnx",
        "fixtures/real/cache/magika_standard_v3_3.onnx",
    ];
    let paths = match given.is_empty() {
        false => given,
        true => defaults
            .iter()
            .map(|p| root.join(p))
            .filter(|p| p.is_file())
            .collect(),
    };
    for path in paths {
        compare(&path);
    }
}
