//! Builds the fake CUDA driver, cuBLAS and NCCL of this directory (C++, see `driver.cpp` and
//! `nccl.cpp`) into `target/tmp/fake_cuda/`, and describes the environment a `pipecut` child
//! process needs to load them: `LD_LIBRARY_PATH` (cudarc finds `libcuda.so`, `libcublas.so` and
//! `libnccl.so` by name) and the emulated driver version, device count and architecture.
//!
//! The kernel list and the `extern __shared__` arrays are read from `kernels.cu` into
//! `registry.inc`, so a new kernel needs no change here. A build is named by a hash of its
//! sources, so test binaries running at once share it and a changed source rebuilds it.

#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The sources, relative to the repository root.
const SOURCES: [&str; 7] = [
    "tests/fake_cuda/device.h",
    "tests/fake_cuda/fake.h",
    "tests/fake_cuda/kernels.cpp",
    "tests/fake_cuda/driver.cpp",
    "tests/fake_cuda/cublas.cpp",
    "tests/fake_cuda/nccl.cpp",
    "crates/runtime/src/cuda/kernels.cu",
];

/// How the fake libraries are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Build {
    Plain,
    /// Under AddressSanitizer: out-of-bounds reads and writes inside kernels (device memory is
    /// host memory here), and dynamic shared memory past the launch's size.
    Asan,
}

/// A machine for the fake driver to emulate.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    /// CUDA version of the driver, as `cuDriverGetVersion` reports it (12020 is R535).
    pub driver: u32,
    pub devices: u32,
    /// Compute capability, major · 10 + minor.
    pub arch: u32,
    pub build: Build,
}

impl FakeGpu {
    /// One H100 under a current driver (CUDA 12.8, R570).
    pub fn current() -> FakeGpu {
        FakeGpu {
            driver: 12080,
            devices: 1,
            arch: 90,
            build: Build::Plain,
        }
    }

    /// One H100 under R535 (CUDA 12.2), common on clusters: PTX ISA up to 8.2.
    pub fn r535() -> FakeGpu {
        FakeGpu {
            driver: 12020,
            ..FakeGpu::current()
        }
    }
}

/// The `g++` to build with (`CXX` when set).
fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".into())
}

/// Names read from `kernels.cu`: `PC_KERNEL(name)` per `extern "C" __global__` function and
/// `PC_SHARED(type, name)` per `extern __shared__` array.
fn registry(kernels: &str) -> String {
    let mut out = String::new();
    let mut shared = Vec::new();
    for line in kernels.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("extern \"C\" __global__ void ") {
            let name = rest.split('(').next().unwrap_or("").trim();
            out.push_str(&format!("PC_KERNEL({name})\n"));
        }
        if let Some(rest) = line.strip_prefix("extern __shared__ ") {
            let mut words = rest.trim_end_matches(';').split_whitespace();
            let (Some(ty), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            let name = name.trim_end_matches("[]").to_string();
            if !shared.iter().any(|(_, n)| n == &name) {
                shared.push((ty.to_string(), name));
            }
        }
    }
    for (ty, name) in shared {
        out.push_str(&format!("PC_SHARED({ty}, {name})\n"));
    }
    out
}

fn run(command: &mut Command) -> Result<(), String> {
    let out = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Compiles the two libraries into `dir`.
fn compile(root: &Path, dir: &Path, build: Build) -> Result<(), String> {
    let kernels = root.join("crates/runtime/src/cuda/kernels.cu");
    let source = std::fs::read_to_string(&kernels).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("registry.inc"), registry(&source)).map_err(|e| e.to_string())?;
    let here = root.join("tests/fake_cuda");
    let mut flags: Vec<String> = [
        "-std=c++17",
        "-O2",
        "-g",
        "-fPIC",
        "-shared",
        "-pthread",
        "-Wall",
        "-Werror",
    ]
    .map(String::from)
    .to_vec();
    if build == Build::Asan {
        flags.extend([
            "-fsanitize=address".into(),
            "-fno-omit-frame-pointer".into(),
        ]);
    }
    flags.push(format!("-I{}", here.display()));
    flags.push(format!("-I{}", dir.display()));
    run(Command::new(compiler())
        .args(&flags)
        .arg(format!("-DPC_KERNEL_SOURCE=\"{}\"", kernels.display()))
        .arg(here.join("driver.cpp"))
        .arg(here.join("kernels.cpp"))
        .args(["-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so.1")))?;
    run(Command::new(compiler())
        .args(&flags)
        .arg(here.join("cublas.cpp"))
        .arg(format!("-L{}", dir.display()))
        .args(["-l:libcuda.so.1", "-Wl,-soname,libcublas.so.12", "-o"])
        .arg(dir.join("libcublas.so.12")))?;
    // NCCL (nccl.cpp): cudarc opens `libnccl.so`, the name NCCL's -dev package links.
    run(Command::new(compiler())
        .args(&flags)
        .arg(here.join("nccl.cpp"))
        .arg(format!("-L{}", dir.display()))
        .args(["-l:libcuda.so.1", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(dir.join("libnccl.so.2")))?;
    for (link, target) in [
        ("libcuda.so", "libcuda.so.1"),
        ("libcublas.so", "libcublas.so.12"),
        ("libnccl.so", "libnccl.so.2"),
    ] {
        std::os::unix::fs::symlink(target, dir.join(link)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The directory holding `libcuda.so` and `libcublas.so` built as `build`, compiled on first
/// use; `Err` says why it cannot be built (no C++ compiler).
pub fn libraries(build: Build) -> Result<PathBuf, String> {
    type Builds = Vec<(Build, Result<PathBuf, String>)>;
    static BUILT: OnceLock<Mutex<Builds>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some((_, result)) = built.iter().find(|(b, _)| *b == build) {
        return result.clone();
    }
    let result = build_once(build);
    built.push((build, result.clone()));
    result
}

fn build_once(build: Build) -> Result<PathBuf, String> {
    if Command::new(compiler()).arg("--version").output().is_err() {
        return Err(format!(
            "no C++ compiler ('{}') to build the fake CUDA driver",
            compiler()
        ));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut hasher = DefaultHasher::new();
    build.hash(&mut hasher);
    for source in SOURCES {
        std::fs::read(root.join(source))
            .map_err(|e| format!("{source}: {e}"))?
            .hash(&mut hasher);
    }
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake_cuda");
    let dir = base.join(format!("{build:?}-{:016x}", hasher.finish()).to_lowercase());
    if dir.join("libnccl.so").exists() {
        return Ok(dir);
    }
    // Built aside and renamed into place, so a concurrent test binary never sees half a build.
    let scratch = base.join(format!(".building-{}-{build:?}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    compile(&root, &scratch, build)?;
    if std::fs::rename(&scratch, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(dir)
}

/// The AddressSanitizer runtime to preload into a child process (the Rust binary is not
/// instrumented, so the runtime must come first).
fn asan_runtime() -> Result<String, String> {
    let out = Command::new(compiler())
        .arg("-print-file-name=libasan.so")
        .output()
        .map_err(|e| e.to_string())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if Path::new(&path).is_absolute() {
        Ok(path)
    } else {
        Err("the C++ compiler has no AddressSanitizer runtime".into())
    }
}

/// The directory of the venv's `libnvrtc.so.12` (pip package nvidia-cuda-nvrtc-cu12), which
/// the fake driver needs for the kernels.
pub fn venv_nvrtc() -> Option<PathBuf> {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(lib).ok()?.find_map(|python| {
        let dir = python
            .ok()?
            .path()
            .join("site-packages/nvidia/cuda_nvrtc/lib");
        dir.join("libnvrtc.so.12").exists().then_some(dir)
    })
}

/// The compiled-kernel cache the tests' runs share (not the user's).
pub fn kernel_cache() -> String {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kernel_cache")
        .display()
        .to_string()
}

/// Environment variables for a child process that should see `gpu`, with `nvrtc` (the
/// directory of `libnvrtc.so.12`) on the library path too.
pub fn environment(gpu: &FakeGpu, nvrtc: &Path) -> Result<Vec<(String, String)>, String> {
    let libraries = libraries(gpu.build)?;
    let mut path = format!("{}:{}", libraries.display(), nvrtc.display());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path = format!("{path}:{}", old.to_string_lossy());
    }
    let mut env = vec![
        ("LD_LIBRARY_PATH".to_string(), path),
        ("PC_FAKE_CUDA_DRIVER".to_string(), gpu.driver.to_string()),
        ("PC_FAKE_CUDA_DEVICES".to_string(), gpu.devices.to_string()),
        ("PC_FAKE_CUDA_ARCH".to_string(), gpu.arch.to_string()),
        ("PIPECUT_KERNEL_CACHE".to_string(), kernel_cache()),
    ];
    if gpu.build == Build::Asan {
        env.push(("LD_PRELOAD".into(), asan_runtime()?));
        // Rust's allocations live until exit on purpose; only memory errors matter here.
        env.push((
            "ASAN_OPTIONS".into(),
            "detect_leaks=0:abort_on_error=0:exitcode=86".into(),
        ));
    }
    Ok(env)
}
