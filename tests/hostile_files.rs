//! Hostile files and paths through the command line and the library (issue 18's filesystem
//! findings): nothing outside the named outputs changes, no input is overwritten, no read waits
//! forever, and text from a model cannot drive the terminal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
use onnx_protobuf::type_proto::{Tensor as TensorType, Value as TypeValue};
use onnx_protobuf::{
    GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use pipecut::onnx::shape::{DimBindings, ShapeInference};

const FLOAT: i32 = 1;

fn pipecut_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the pipecut binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(dimension::Value::DimValue(d)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto {
            value: Some(TypeValue::TensorType(TensorType {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto {
                    dim,
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// y = Relu(x · w) + x, with the 4×4 weight `w` stored externally; `external` lists the
/// `external_data` entries as written (a hostile file may repeat a key).
fn model_bytes(external: &[(&str, &str)], first_node_name: &str) -> Vec<u8> {
    let weight = TensorProto {
        name: "w".into(),
        data_type: FLOAT,
        dims: vec![4, 4],
        data_location: DataLocation::EXTERNAL.into(),
        external_data: external
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let graph = GraphProto {
        name: "hostile".into(),
        node: vec![
            node(first_node_name, "MatMul", &["x", "w"], "xw"),
            node("relu", "Relu", &["xw"], "r"),
            node("add", "Add", &["r", "x"], "y"),
        ],
        initializer: vec![weight],
        input: vec![value_info("x", &[2, 4])],
        output: vec![value_info("y", &[2, 4])],
        ..Default::default()
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
            ..Default::default()
        }],
        graph: Some(graph).into(),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap()
}

/// A folder holding `model/m.onnx` + `model/w.bin` (64 bytes) and a `victim.txt` beside
/// `model/`, which no command may change.
struct Scene {
    root: tempfile::TempDir,
}

impl Scene {
    fn new(external: &[(&str, &str)]) -> Scene {
        let root = tempfile::tempdir().unwrap();
        let model_dir = root.path().join("model");
        std::fs::create_dir(&model_dir).unwrap();
        std::fs::write(model_dir.join("w.bin"), [7u8; 64]).unwrap();
        std::fs::write(model_dir.join("m.onnx"), model_bytes(external, "matmul")).unwrap();
        std::fs::write(root.path().join("victim.txt"), b"precious").unwrap();
        Scene { root }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn run(&self, args: &[&str]) -> Output {
        pipecut_in(self.root.path(), args)
    }

    fn victim_untouched(&self) {
        assert_eq!(std::fs::read(self.path("victim.txt")).unwrap(), b"precious");
    }

    fn plan(&self) {
        let out = self.run(&[
            "partition",
            "model/m.onnx",
            "--cluster",
            "1x2xH100-SXM",
            "--stages",
            "2",
            "--out",
            "plan.json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

const PLAIN: &[(&str, &str)] = &[("location", "w.bin")];

#[test]
fn a_repeated_external_data_key_is_refused_and_nothing_outside_is_written() {
    // The loader used to check the last `location` while export linked the first one.
    let scene = Scene::new(&[("location", "../victim.txt"), ("location", "w.bin")]);
    let out = scene.run(&["inspect", "model/m.onnx"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("listed twice"), "{}", stderr(&out));
    scene.victim_untouched();
}

#[test]
fn a_model_swapped_after_loading_is_checked_again_by_export() {
    let scene = Scene::new(PLAIN);
    let model_path = scene.path("model/m.onnx");
    let mut model = pipecut::onnx::load_model(&model_path).unwrap();
    ShapeInference::new(DimBindings::new())
        .run(&mut model.graph)
        .unwrap();
    let order = model.graph.topological_order().to_vec();
    let stages = vec![order[..1].to_vec(), order[1..].to_vec()];
    let out_dir = scene.path("out");
    let first =
        pipecut::onnx::export::export_stages(&model_path, &model.graph, &stages, &out_dir).unwrap();
    let before: Vec<(PathBuf, Vec<u8>)> =
        ["manifest.json", "stage_0.onnx", "stage_1.onnx", "w.bin"]
            .iter()
            .map(|f| (out_dir.join(f), std::fs::read(out_dir.join(f)).unwrap()))
            .collect();
    assert_eq!(first.external_data[0].location, "w.bin");
    // Copied, not linked: editing the export must not edit the original.
    assert!(!pipecut::io::same_file(
        &out_dir.join("w.bin"),
        &scene.path("model/w.bin")
    ));

    // Swap the file for one that points its weights outside the model's folder.
    std::fs::write(
        &model_path,
        model_bytes(&[("location", "../victim.txt")], "matmul"),
    )
    .unwrap();
    let err = pipecut::onnx::export::export_stages(&model_path, &model.graph, &stages, &out_dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("leaves the model's directory"), "{err}");
    scene.victim_untouched();
    // The failed export left the earlier complete one as it was.
    for (path, bytes) in before {
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{}", path.display());
    }
    let names: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 4, "temporaries left behind: {names:?}");
}

#[cfg(unix)]
#[test]
fn linked_external_data_is_exported_as_its_bytes_and_modes_are_kept() {
    use std::os::unix::fs::PermissionsExt;
    let scene = Scene::new(PLAIN);
    let data = scene.path("model/data");
    std::fs::create_dir(&data).unwrap();
    std::fs::rename(scene.path("model/w.bin"), data.join("real.bin")).unwrap();
    std::os::unix::fs::symlink("data/real.bin", scene.path("model/w.bin")).unwrap();
    std::fs::set_permissions(
        scene.path("model/m.onnx"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    scene.plan();
    let out = scene.run(&["export", "plan.json", "model/m.onnx", "--out-dir", "out"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let placed = scene.path("out/w.bin");
    let meta = std::fs::symlink_metadata(&placed).unwrap();
    assert!(meta.is_file(), "exported as a link, not as the data");
    assert_eq!(std::fs::read(&placed).unwrap(), [7u8; 64]);
    for file in ["stage_0.onnx", "stage_1.onnx", "w.bin", "manifest.json"] {
        let mode = std::fs::metadata(scene.path("out").join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is {mode:o}, the model is 0600");
    }
}

#[test]
fn outputs_that_are_inputs_devices_directories_or_nowhere_are_refused() {
    let scene = Scene::new(PLAIN);
    let model_before = std::fs::read(scene.path("model/m.onnx")).unwrap();
    let partition = |out: &str| {
        scene.run(&[
            "partition",
            "model/m.onnx",
            "--cluster",
            "1x2xH100-SXM",
            "--out",
            out,
        ])
    };
    for (out, expected) in [
        ("model/m.onnx", "refusing to overwrite an input"),
        ("model/", "is a directory"),
        ("model", "is a directory"),
        ("missing/plan.json", "does not exist"),
        #[cfg(unix)]
        ("/dev/null", "not a regular file"),
    ] {
        let result = partition(out);
        let text = stderr(&result);
        assert_eq!(result.status.code(), Some(2), "{out}: {text}");
        assert!(text.contains(expected), "{out}: {text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{out}: {text}");
    }
    assert!(!scene.path("missing").exists(), "a directory was created");
    assert_eq!(
        std::fs::read(scene.path("model/m.onnx")).unwrap(),
        model_before
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let dev_null = std::fs::metadata("/dev/null").unwrap();
        assert!(dev_null.file_type().is_char_device());
    }

    // `show --timeline plan.json` must not replace the plan it reads.
    scene.plan();
    let plan_before = std::fs::read(scene.path("plan.json")).unwrap();
    let out = scene.run(&["show", "plan.json", "--timeline", "plan.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(std::fs::read(scene.path("plan.json")).unwrap(), plan_before);

    // A plan saved as manifest.json in the export folder is an input, not an old manifest.
    std::fs::create_dir(scene.path("out")).unwrap();
    std::fs::copy(scene.path("plan.json"), scene.path("out/manifest.json")).unwrap();
    let out = scene.run(&[
        "export",
        "out/manifest.json",
        "model/m.onnx",
        "--out-dir",
        "out",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("would replace the input"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(scene.path("out/manifest.json")).unwrap(),
        plan_before
    );
}

#[cfg(unix)]
#[test]
fn a_link_planted_at_an_output_is_replaced_never_followed() {
    let scene = Scene::new(PLAIN);
    std::os::unix::fs::symlink(scene.path("victim.txt"), scene.path("plan.json")).unwrap();
    // A temporary left by a `kill -9`ed run (a pid above the kernel's maximum never runs); only
    // Linux can tell that its writer is gone (by /proc).
    let stale = scene.path(".pipecut-tmp-4294967-x1Yz");
    if cfg!(target_os = "linux") {
        std::fs::write(&stale, b"half a plan").unwrap();
    }
    scene.plan();
    assert!(!stale.exists(), "a dead run's temporary was left");
    scene.victim_untouched();
    let plan = std::fs::symlink_metadata(scene.path("plan.json")).unwrap();
    assert!(plan.is_file());
    // No temporary is left beside it.
    let leftovers: Vec<_> = std::fs::read_dir(scene.root.path())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.contains("tmp").then_some(name)
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_fifo_or_a_directory_as_input_fails_at_once() {
    let scene = Scene::new(PLAIN);
    let fifo = scene.path("plan.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let started = std::time::Instant::now();
    for args in [
        vec!["check", "plan.fifo", "model/m.onnx"],
        vec!["inspect", "plan.fifo"],
        vec!["inspect", "model"],
    ] {
        let out = scene.run(&args);
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains("not a regular file") || text.contains("is a directory"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("os error"), "{args:?}: {text}");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "a read waited");
}

#[test]
fn messages_say_each_os_error_once_and_name_swapped_arguments() {
    let scene = Scene::new(PLAIN);
    let out = scene.run(&["inspect", "missing.onnx"]);
    let text = stderr(&out);
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "{text}"
    );
    scene.plan();
    let out = scene.run(&["check", "model/m.onnx", "plan.json"]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("is it an ONNX model"), "{text}");
}

#[test]
fn names_from_a_model_cannot_drive_the_terminal_or_break_pictures() {
    let scene = Scene::new(PLAIN);
    let evil = "mat\u{1b}]0;pwned\u{7}\u{1b}[2J\nmul";
    std::fs::write(scene.path("model/m.onnx"), model_bytes(PLAIN, evil)).unwrap();
    let out = scene.run(&[
        "partition",
        "model/m.onnx",
        "--cluster",
        "1x2xH100-SXM",
        "--stages",
        "2",
        "--out",
        "plan.json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !printed.contains('\u{1b}') && !printed.contains('\u{7}'),
        "{printed}"
    );
    let out = scene.run(&[
        "show",
        "plan.json",
        "model/m.onnx",
        "--graph",
        "graph.dot",
        "--timeline",
        "timeline.svg",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dot = std::fs::read_to_string(scene.path("graph.dot")).unwrap();
    assert!(
        !dot.contains('\u{1b}') && !dot.contains("pwned\u{7}"),
        "{dot}"
    );
    assert!(dot.contains("\\\\u{1b}"), "the escape is shown: {dot}");
    let svg = std::fs::read_to_string(scene.path("timeline.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("the timeline is well-formed XML");
}
