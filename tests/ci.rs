//! What CI relies on to say what it did not check: the skip record of `tests/common` and its
//! summary `.ci/skips`, and the venv's requirements on platforms other than Linux.

mod common;

use std::path::Path;
use std::process::Command;

/// `bash .ci/skips` with skip records under `target_dir`, as CI (`CI=true`) or a user.
fn summary(target_dir: &Path, ci: bool) -> (bool, String, String) {
    let out = Command::new("bash")
        .arg(common::root().join(".ci/skips"))
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CI", if ci { "true" } else { "false" })
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_skip_is_recorded_with_its_test_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    common::record_skip(
        dir.path(),
        common::Need::Gpu,
        "not a skip: tests/ci.rs\tchecks the record",
    );
    let record = dir.path().join("ci.tsv");
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        text.lines().any(|l| l
            == "ci\ta_skip_is_recorded_with_its_test_and_reason\tgpu\tnot a skip: tests/ci.rs checks the record"),
        "{text}"
    );
}

#[test]
fn ci_fails_on_a_skip_it_could_have_run_and_lists_every_skip() {
    let target = tempfile::tempdir().unwrap();
    let (ok, out, _) = summary(target.path(), true);
    assert!(ok && out.contains("skipped tests: none"), "{out}");

    let skips = target.path().join("tmp/skips");
    std::fs::create_dir_all(&skips).unwrap();
    std::fs::write(
        skips.join("cuda.tsv"),
        "cuda\truns_on_a_gpu\tgpu\tno CUDA driver\n",
    )
    .unwrap();
    let (ok, out, err) = summary(target.path(), true);
    assert!(ok, "a GPU skip is allowed on CI: {out}{err}");
    assert!(
        out.contains("cuda::runs_on_a_gpu  [gpu]  no CUDA driver"),
        "{out}"
    );

    std::fs::write(
        skips.join("show.tsv"),
        "show\tgraph_svg\tgraphviz\tGraphviz is not installed\n",
    )
    .unwrap();
    let (ok, out, err) = summary(target.path(), true);
    assert!(
        !ok,
        "CI installs graphviz, so its skip fails the run: {out}"
    );
    assert!(out.contains("show::graph_svg  [graphviz]"), "{out}");
    assert!(err.contains("1 skip(s) above"), "{err}");
    // A user's run lists the same skips and does not fail.
    let (ok, out, _) = summary(target.path(), false);
    assert!(
        ok && out.contains("[graphviz]") && out.contains("[gpu]"),
        "{out}"
    );
}

/// The guide's step 6 runs `fixtures/pyenv.sh` on Linux and macOS: every pinned package must
/// install on both, so a Linux-only wheel (NVRTC) carries an environment marker.
#[test]
fn the_requirements_install_on_macos() {
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            format!(
                "{} is absent (run bash fixtures/pyenv.sh)",
                python.display()
            ),
        );
        return;
    }
    // `packaging` (pinned for onnxruntime) evaluates the PEP 508 markers as pip does.
    let script = r##"
import sys
from packaging.requirements import Requirement
mac = {"sys_platform": "darwin", "platform_system": "Darwin"}
linux = {"sys_platform": "linux", "platform_system": "Linux"}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    r = Requirement(line)
    on = [n for n, env in (("mac", mac), ("linux", linux)) if r.marker is None or r.marker.evaluate(env)]
    print(r.name, ",".join(on))
"##;
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(common::root().join("fixtures/requirements.txt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No macOS wheel exists for these: https://pypi.org/project/nvidia-cuda-nvrtc-cu12/#files
    let linux_only = ["nvidia-cuda-nvrtc-cu12"];
    for line in stdout.lines() {
        let (name, on) = line.split_once(' ').unwrap();
        if linux_only.contains(&name) {
            assert_eq!(on, "linux", "{name} is installed only on Linux");
        } else {
            assert_eq!(on, "mac,linux", "{name} is installed everywhere");
        }
    }
    assert!(stdout.contains("nvidia-cuda-nvrtc-cu12 linux"), "{stdout}");
}
