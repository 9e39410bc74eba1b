//! The C ABI (`pipecut::ffi`, `include/pipecut.h`): called from C through the built library, from
//! Python through ctypes, and from Rust on its error paths.

mod common;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use pipecut::ffi::{pipecut_last_error, pipecut_plan_json, pipecut_string_free};

const GPT2_REQUEST: &str = r#"{"cluster": "1x4xL4", "dims": {"batch": 2, "seq": 16}, "stages": 3, "solver": "dp", "model_file_name": "gpt2_tiny.onnx"}"#;

/// The directory cargo built the library and the binary into (`target/debug`).
fn build_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_pipecut"))
        .parent()
        .expect("the binary has a directory")
        .to_path_buf()
}

/// A C ABI library by file name: where `cargo build` puts it (`target/debug`), else where
/// `cargo test` itself built it (`target/debug/deps`: the lib's crate types include cdylib and
/// staticlib, so a plain `cargo test` on a fresh clone links against those).
fn built_library(name: &str) -> Result<PathBuf, String> {
    let candidates = [build_dir().join(name), build_dir().join("deps").join(name)];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| format!("{} was not built", candidates[1].display()))
}

/// The shared library cargo built, or why there is none to link.
fn shared_library() -> Result<PathBuf, String> {
    let name = if cfg!(target_os = "macos") {
        "libpipecut.dylib"
    } else if cfg!(target_os = "linux") {
        "libpipecut.so"
    } else {
        return Err("the C test links with cc on Linux and macOS only".into());
    };
    built_library(name)
}

/// `$CC` or `cc`, when it runs.
fn c_compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc).arg("--version").output() {
        Ok(out) if out.status.success() => Some(cc),
        _ => {
            common::skip(
                common::Need::Toolchain,
                format!("the C ABI test from C: no C compiler ('{cc}' does not run)"),
            );
            None
        }
    }
}

/// Compiles `source` against include/pipecut.h and the shared library, warnings as errors.
fn compile_c(cc: &str, source: &Path, exe: &Path) -> Result<(), String> {
    let library = shared_library()?;
    let dir = library.parent().unwrap();
    compile_c_with(
        cc,
        source,
        exe,
        &[
            format!("-L{}", dir.display()),
            format!("-Wl,-rpath,{}", dir.display()),
            "-lpipecut".into(),
        ],
    )
}

fn compile_c_with(cc: &str, source: &Path, exe: &Path, link: &[String]) -> Result<(), String> {
    let out = Command::new(cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(common::root().join("include"))
        .arg(source)
        .arg("-o")
        .arg(exe)
        .args(link)
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cc} failed on {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn stage_count(plan_json: &str) -> usize {
    let plan = pipecut::plan::Plan::from_json(plan_json).expect("a valid plan");
    plan.stages.len()
}

#[test]
fn a_c_program_plans_gpt2_through_the_shared_library() {
    let Some(cc) = c_compiler() else { return };
    if let Err(reason) = shared_library() {
        common::skip(
            common::Need::Toolchain,
            format!("the C ABI test from C: {reason}"),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("plan");
    compile_c(&cc, &common::root().join("tests/c/plan.c"), &exe).unwrap();
    let out = Command::new(&exe)
        .arg(common::fixture("gpt2_tiny"))
        .arg(GPT2_REQUEST)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plan = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stage_count(&plan), 3);

    // The same request through the command line gives the same bytes: one planner, two doors.
    let cli = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .current_dir(common::root())
        .args([
            "partition",
            "fixtures/models/gpt2_tiny.onnx",
            "--cluster",
            "1x4xL4",
            "--dim",
            "batch=2",
            "--dim",
            "seq=16",
            "--stages",
            "3",
            "--solver",
            "dp",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert_eq!(plan, String::from_utf8(cli.stdout).unwrap());
}

/// Requests that sized allocations by their numbers or summed to infinity (issue 18) fail with a
/// message, not an abort, in a C program that caps its address space at 4 GiB.
#[test]
fn hostile_requests_from_c_fail_without_aborting_the_host() {
    let Some(cc) = c_compiler() else { return };
    if let Err(reason) = shared_library() {
        eprintln!("skipping the hostile C ABI test: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("hostile");
    compile_c(&cc, &common::root().join("tests/c/hostile.c"), &exe).unwrap();
    // 5 million devices, 55 MB: under the JSON limit, so the count must refuse it.
    let cluster = dir.path().join("cluster.json");
    let devices = vec!["\"H100-SXM\""; 5_000_000].join(",");
    std::fs::write(
        &cluster,
        format!("{{\"nodes\": [{{\"devices\": [{devices}]}}]}}"),
    )
    .unwrap();
    let out = Command::new(&exe)
        .arg(common::fixture("mlp"))
        .arg(&cluster)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "status {:?} (a signal is an abort of the host)\n{stdout}\n{stderr}",
        out.status
    );
    assert_eq!(stdout.lines().count(), 6, "{stdout}");
}

#[test]
fn a_c_program_links_the_static_library() {
    let Some(cc) = c_compiler() else { return };
    if !cfg!(target_os = "linux") {
        common::skip(
            common::Need::Platform,
            "the static-library test: its system libraries are listed for Linux",
        );
        return;
    }
    let archive = match built_library("libpipecut.a") {
        Ok(archive) => archive,
        Err(reason) => {
            common::skip(
                common::Need::Toolchain,
                format!("the static-library test: {reason}"),
            );
            return;
        }
    };
    // The system libraries include/pipecut.h and docs/embedding.md tell static linkers to add
    // (from `--print native-static-libs`); the link fails if the list is short.
    let header = std::fs::read_to_string(common::root().join("include/pipecut.h")).unwrap();
    let native = header
        .lines()
        .find_map(|l| {
            l.split_once("on Linux: ")
                .map(|(_, libs)| libs.trim_end_matches(")."))
        })
        .expect("the header lists the native libraries for Linux");
    let mut link = vec![archive.display().to_string()];
    link.extend(native.split_whitespace().map(str::to_string));
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("plan-static");
    compile_c_with(&cc, &common::root().join("tests/c/plan.c"), &exe, &link).unwrap();
    let out = Command::new(&exe)
        .arg(common::fixture("mlp"))
        .arg(r#"{"devices": "L4,L4", "dims": {"batch": 4}, "stages": 2}"#)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stage_count(&String::from_utf8(out.stdout).unwrap()), 2);
}

/// The lines of the fenced blocks of `lang` in a Markdown file.
fn fenced_blocks(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim() == format!("```{lang}") => current = Some(String::new()),
            Some(block) if line.trim() == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

fn embedding_doc() -> String {
    std::fs::read_to_string(common::root().join("docs/embedding.md")).unwrap()
}

#[test]
fn the_c_example_in_the_embedding_guide_runs() {
    let Some(cc) = c_compiler() else { return };
    if let Err(reason) = shared_library() {
        common::skip(
            common::Need::Toolchain,
            format!("the embedding guide's C example: {reason}"),
        );
        return;
    }
    let blocks = fenced_blocks(&embedding_doc(), "c");
    assert_eq!(blocks.len(), 1, "docs/embedding.md has one C example");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("example.c");
    std::fs::write(&source, &blocks[0]).unwrap();
    let exe = dir.path().join("example");
    compile_c(&cc, &source, &exe).unwrap();
    let out = Command::new(&exe)
        .current_dir(common::root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The example prints the plan's bottleneck line and then the error of a bad request.
    assert!(stdout.contains("\"bottleneck_secs\""), "{stdout}");
    assert!(stdout.contains("unknown field `stage`"), "{stdout}");
}

#[test]
fn the_python_example_in_the_embedding_guide_runs() {
    let library = match shared_library() {
        Ok(library) => library,
        Err(reason) => {
            common::skip(
                common::Need::Toolchain,
                format!("the embedding guide's Python example: {reason}"),
            );
            return;
        }
    };
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if !Command::new(&python)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        common::skip(
            common::Need::Toolchain,
            format!("the embedding guide's Python example: '{python}' does not run"),
        );
        return;
    }
    let blocks = fenced_blocks(&embedding_doc(), "python");
    assert_eq!(blocks.len(), 1, "docs/embedding.md has one Python example");
    let out = Command::new(&python)
        .arg("-c")
        .arg(&blocks[0])
        .current_dir(common::root())
        .env("PIPECUT_LIB", &library)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The example prints the stage count and then a refused request's message.
    assert!(stdout.contains("2 stages"), "{stdout}");
    assert!(stdout.contains("refused: "), "{stdout}");
}

/// Exported names and signatures of `src/ffi.rs`, as C prototypes.
fn rust_prototypes() -> Vec<String> {
    let source = std::fs::read_to_string(common::root().join("src/ffi.rs")).unwrap();
    let mut prototypes = Vec::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[no_mangle]" {
            continue;
        }
        // The signature runs from the `pub ... extern "C" fn` line to the opening brace.
        let mut signature = String::new();
        for next in lines.by_ref() {
            signature.push_str(next.trim());
            signature.push(' ');
            if next.trim_end().ends_with('{') {
                break;
            }
        }
        let after_fn = signature.split(" fn ").nth(1).expect("an extern fn");
        let (name, rest) = after_fn.split_once('(').unwrap();
        let (params, ret) = rest.rsplit_once(')').unwrap();
        let c_type = |rust: &str| -> String {
            match rust.trim() {
                "*const u8" => "const uint8_t *",
                "*const c_char" => "const char *",
                "*mut c_char" => "char *",
                "usize" => "size_t",
                "" => "void",
                other => panic!("no C type for Rust type '{other}' in src/ffi.rs"),
            }
            .to_string()
        };
        let ret = ret.trim().trim_end_matches('{').trim();
        // `char *name`, `size_t name`: pointers bind to the name.
        let declare = |ty: String, name: &str| {
            if ty.ends_with('*') {
                format!("{ty}{name}")
            } else {
                format!("{ty} {name}")
            }
        };
        let ret = c_type(ret.strip_prefix("->").unwrap_or(ret));
        let params: Vec<String> = params
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                let (param, ty) = p.split_once(':').unwrap();
                declare(c_type(ty), param.trim())
            })
            .collect();
        let params = if params.is_empty() {
            "void".to_string()
        } else {
            params.join(", ")
        };
        prototypes.push(format!("{}({params});", declare(ret, name)));
    }
    prototypes.sort();
    prototypes
}

/// The prototypes of `include/pipecut.h`, whitespace normalised.
fn header_prototypes() -> Vec<String> {
    let header = std::fs::read_to_string(common::root().join("include/pipecut.h")).unwrap();
    let mut prototypes: Vec<String> = header
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('*') && !l.starts_with("/*") && !l.starts_with('#'))
        .filter(|l| l.contains("pipecut_") && l.ends_with(");"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    prototypes.sort();
    prototypes
}

#[test]
fn the_header_declares_exactly_the_exported_functions() {
    let rust = rust_prototypes();
    assert_eq!(rust.len(), 4, "{rust:?}");
    assert_eq!(header_prototypes(), rust);

    // And the shared library exports them (nm is in binutils; skip where it is not installed).
    let library = match shared_library() {
        Ok(library) => library,
        Err(reason) => {
            common::skip(
                common::Need::Toolchain,
                format!("the exported-symbol check: {reason}"),
            );
            return;
        }
    };
    match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&library)
        .output()
    {
        Ok(out) if out.status.success() => {
            let symbols = String::from_utf8_lossy(&out.stdout);
            for prototype in &rust {
                let name = prototype.split('(').next().unwrap();
                let name = name.rsplit(['*', ' ']).next().unwrap();
                assert!(
                    symbols.lines().any(|l| l.ends_with(&format!(" {name}"))),
                    "{name} is not exported by {}",
                    library.display()
                );
            }
        }
        _ => common::skip(
            common::Need::Toolchain,
            "the exported-symbol check: nm -D does not run",
        ),
    }
}

/// Calls the C entry point from Rust; `Err` carries pipecut_last_error().
fn call(model: Option<&[u8]>, config: Option<&CStr>) -> Result<String, String> {
    let (ptr, len) = model.map_or((std::ptr::null(), 0), |m| (m.as_ptr(), m.len()));
    let config = config.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: pointers are NULL or live for the call; `model` is readable for `len` bytes.
    let plan = unsafe { pipecut_plan_json(ptr, len, config) };
    if plan.is_null() {
        let message = pipecut_last_error();
        assert!(!message.is_null(), "a NULL return leaves a message");
        // SAFETY: a NUL-terminated string valid until the next call on this thread.
        return Err(unsafe { CStr::from_ptr(message) }
            .to_str()
            .unwrap()
            .to_string());
    }
    // SAFETY: a string returned by pipecut_plan_json, freed once below.
    let text = unsafe { CStr::from_ptr(plan) }
        .to_str()
        .unwrap()
        .to_string();
    // SAFETY: as above.
    unsafe { pipecut_string_free(plan) };
    Ok(text)
}

fn mlp() -> Vec<u8> {
    std::fs::read(common::fixture("mlp")).unwrap()
}

fn request(json: &str) -> CString {
    CString::new(json).unwrap()
}

#[test]
fn errors_are_returned_as_null_with_a_message_never_a_panic() {
    let model = mlp();
    let good = request(r#"{"devices": "L4,L4", "dims": {"batch": 4}, "stages": 2}"#);
    let cases: Vec<(&str, Option<&[u8]>, CString, &str)> = vec![
        ("NULL model", None, good.clone(), "model_bytes is NULL"),
        ("empty model", Some(&[]), good.clone(), "not an ONNX model"),
        (
            "truncated model",
            Some(&model[..model.len() / 3]),
            good.clone(),
            "not an ONNX model",
        ),
        (
            "config is not JSON",
            Some(&model),
            request("cluster=1x4xL4"),
            "config_json: expected value",
        ),
        (
            "unknown field",
            Some(&model),
            request(r#"{"devices": "L4,L4", "microbatch": 4}"#),
            "unknown field `microbatch`",
        ),
        (
            "no devices",
            Some(&model),
            request(r#"{"dims": {"batch": 4}}"#),
            "name the devices",
        ),
        (
            "two device sources",
            Some(&model),
            request(r#"{"cluster": "1x2xL4", "devices": "L4"}"#),
            "only one of",
        ),
        (
            "unknown device",
            Some(&model),
            request(r#"{"devices": "L5"}"#),
            "unknown device 'L5'",
        ),
        (
            "bad stages",
            Some(&model),
            request(r#"{"devices": "L4,L4", "stages": 0}"#),
            "at least 1",
        ),
        (
            "more stages than devices",
            Some(&model),
            request(r#"{"devices": "L4,L4", "dims": {"batch": 4}, "stages": 3}"#),
            "3 stages need 3 devices",
        ),
        (
            "bad time limit",
            Some(&model),
            request(r#"{"devices": "L4", "time_limit_secs": -1}"#),
            "time_limit_secs",
        ),
        (
            "unbound dim",
            Some(&model),
            request(r#"{"devices": "L4,L4", "stages": 2}"#),
            "not bound",
        ),
        (
            "a baseline layer type that is not a regex",
            Some(&model),
            request(
                r#"{"devices": "L4,L4", "dims": {"batch": 4}, "baseline_layer_type": "(unclosed"}"#,
            ),
            "baseline_layer_type: not a regex (found open group without closing ')')",
        ),
        (
            "bad headroom",
            Some(&model),
            request(r#"{"devices": "L4", "dims": {"batch": 4}, "memory_headroom": 1.5}"#),
            "headroom",
        ),
        (
            "a time for a node the model does not have",
            Some(&model),
            request(
                r#"{"devices": "L4,L4", "dims": {"batch": 4}, "node_secs": {"/no/such/node": 0.001}}"#,
            ),
            "'/no/such/node'",
        ),
        (
            "nothing fits",
            Some(&model),
            request(r#"{"devices": "L4", "dims": {"batch": 4}, "memory_headroom": 0.9999999999}"#),
            "does not fit",
        ),
    ];
    for (what, model, config, needle) in cases {
        let message = call(model, Some(&config)).expect_err(what);
        assert!(message.contains(needle), "{what}: {message}");
    }
    let message = call(Some(&model), None).unwrap_err();
    assert_eq!(message, "invalid request: config_json is NULL");
    let not_utf8 = CString::new(vec![b'{', b'"', 0xff, b'"', b'}']).unwrap();
    let message = call(Some(&model), Some(&not_utf8)).unwrap_err();
    assert!(message.contains("config_json is not UTF-8"), "{message}");

    // A success clears the last error.
    let plan = call(Some(&model), Some(&good)).unwrap();
    assert_eq!(stage_count(&plan), 2);
    assert!(pipecut_last_error().is_null());
}

/// The DeepSpeed `type:` baseline's regex reaches the plan from a C caller as from the CLI.
#[test]
fn the_baseline_layer_type_is_taken_and_recorded() {
    let model = std::fs::read(common::fixture("gpt2_tiny")).unwrap();
    let config = request(
        r#"{"devices": "L4,L4,L4", "stages": 3, "dims": {"batch": 4, "seq": 16},
            "baseline_layer_type": "H\\.[01]$"}"#,
    );
    let plan = pipecut::plan::Plan::from_json(&call(Some(&model), Some(&config)).unwrap()).unwrap();
    assert_eq!(plan.config.baseline_layer_type, r"H\.[01]$");
    let peers: Vec<&str> = plan
        .summary
        .baselines
        .iter()
        .map(|b| b.peer.as_str())
        .collect();
    assert!(
        peers.contains(&r"deepspeed 0.19 type:H\.[01]$"),
        "{peers:?}"
    );
}

#[test]
fn a_length_no_buffer_can_have_is_refused_before_reading() {
    let model = mlp();
    let config = request(r#"{"devices": "L4"}"#);
    // SAFETY: the length is refused before the pointer is read.
    let plan = unsafe { pipecut_plan_json(model.as_ptr(), usize::MAX, config.as_ptr()) };
    assert!(plan.is_null());
    // SAFETY: a NUL-terminated string valid until the next call on this thread.
    let message = unsafe { CStr::from_ptr(pipecut_last_error()) };
    assert!(
        message.to_str().unwrap().contains("model_len"),
        "{message:?}"
    );
}

#[test]
fn the_safe_entry_point_gives_the_same_plan() {
    let model = mlp();
    let config = r#"{"devices": "L4,L4", "dims": {"batch": 4}, "stages": 2, "solver": "dp"}"#;
    let via_c = call(Some(&model), Some(&request(config))).unwrap();
    let via_rust = pipecut::ffi::plan_json(&model, config).unwrap();
    assert_eq!(via_c, via_rust);
}

#[test]
fn measured_node_times_replace_the_estimates() {
    let model = mlp();
    let mut graph = pipecut::onnx::load_model_from_bytes(&model, None)
        .unwrap()
        .graph;
    pipecut::onnx::shape::ShapeInference::new(
        pipecut::onnx::shape::DimBindings::new().bind("batch", 4),
    )
    .run(&mut graph)
    .unwrap();
    // Every node measured at 1 ms: the stages' compute adds up to 1 ms per node.
    let node_secs: serde_json::Map<String, serde_json::Value> = graph
        .topological_order()
        .iter()
        .map(|&id| (graph.node(id).name.clone(), serde_json::json!(1e-3)))
        .collect();
    let config = serde_json::json!({
        "devices": "L4,L4", "dims": {"batch": 4}, "stages": 2, "node_secs": node_secs,
    });
    let plan = pipecut::ffi::plan_json(&model, &config.to_string()).unwrap();
    let plan = pipecut::plan::Plan::from_json(&plan).unwrap();
    let compute: f64 = plan.stages.iter().map(|s| s.compute_secs).sum();
    assert!(
        (compute - graph.node_count() as f64 * 1e-3).abs() < 1e-9,
        "{compute}"
    );
}
