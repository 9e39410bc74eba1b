//! NVRTC compilation of `kernels.cu` for one GPU architecture.
//!
//! A CUBIN (machine code) for the device's architecture is what loads everywhere: any CUDA 12.x
//! NVRTC's CUBIN loads on any 12.x driver. PTX would be JIT-compiled by the driver, which
//! refuses a PTX ISA newer than itself, and NVRTC writes its own newest ISA (8.7 for 12.8, which
//! R535 and R550 drivers, common on clusters, refuse). So PTX is made only for a GPU newer than
//! every architecture this NVRTC knows, whose driver is then newer than this NVRTC.

use std::ffi::{c_char, c_int, CStr, CString};
use std::io::Write;
use std::path::PathBuf;

use cudarc::nvrtc::{result, sys, Ptx};
use sha2::{Digest, Sha256};

use crate::Error;

/// The kernels' CUDA C source.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// What NVRTC produced for an architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code for `sm_<arch>`.
    Cubin(u32),
    /// PTX for `compute_<arch>`, JIT-compiled by the driver.
    Ptx(u32),
}

impl std::fmt::Display for ImageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageKind::Cubin(arch) => write!(f, "CUBIN for sm_{arch}"),
            ImageKind::Ptx(arch) => write!(f, "PTX for compute_{arch} (JIT by the driver)"),
        }
    }
}

/// The kernels compiled for one architecture.
#[derive(Debug, Clone)]
pub struct KernelImage {
    /// CUBIN or PTX, and for which architecture.
    pub kind: ImageKind,
    /// The CUBIN's ELF bytes, or the PTX text.
    pub bytes: Vec<u8>,
}

impl KernelImage {
    /// The image in the form cudarc loads.
    pub(super) fn to_ptx(&self) -> Ptx {
        match self.kind {
            ImageKind::Cubin(_) => Ptx::from_binary(self.bytes.clone()),
            ImageKind::Ptx(_) => Ptx::from_src(String::from_utf8_lossy(&self.bytes).into_owned()),
        }
    }
}

/// Fails unless libnvrtc can be loaded.
pub(super) fn need_nvrtc() -> Result<(), Error> {
    // SAFETY: only tries to open the shared library.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Cuda(
            "NVRTC (libnvrtc.so) is not installed: it compiles pipecut's CUDA kernels".into(),
        ))
    }
}

/// The architectures this NVRTC compiles for, ascending (e.g. 50 … 120 for 12.8).
pub fn supported_archs() -> Result<Vec<u32>, Error> {
    need_nvrtc()?;
    let mut count: c_int = 0;
    // SAFETY: the out-pointers are valid for the calls' writes (count, then count ints).
    let archs = unsafe {
        sys::nvrtcGetNumSupportedArchs(&mut count)
            .result()
            .map_err(nvrtc_error)?;
        let mut archs = vec![0 as c_int; count.max(0) as usize];
        sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
            .result()
            .map_err(nvrtc_error)?;
        archs
    };
    let mut archs: Vec<u32> = archs.into_iter().map(|a| a as u32).collect();
    archs.sort_unstable();
    Ok(archs)
}

/// The integrated (Jetson and Drive) GPUs' architectures: Tegra X1 (5.3), X2 (6.2), Xavier
/// (7.2), Orin (8.7), Thor (10.1, 11.0 from CUDA 13). Their SASS is built for those chips; a
/// discrete GPU of the same major version (sm_89, sm_103) gets the discrete family's CUBIN.
const INTEGRATED_ARCHS: [u32; 6] = [53, 62, 72, 87, 101, 110];

/// Which image to make for a device of compute capability `arch` (major · 10 + minor) with an
/// NVRTC that knows `supported`: its own CUBIN, else a CUBIN of the same major version no newer
/// than it (binary compatible) and not an integrated GPU's ([`INTEGRATED_ARCHS`]: sm_103 got
/// Jetson Thor's sm_101 rather than sm_100), else PTX for the newest known one when the GPU is
/// newer.
pub fn image_for(arch: u32, supported: &[u32]) -> Result<ImageKind, String> {
    if supported.contains(&arch) {
        return Ok(ImageKind::Cubin(arch));
    }
    if let Some(&same_major) = supported
        .iter()
        .rev()
        .find(|&&a| a / 10 == arch / 10 && a <= arch && !INTEGRATED_ARCHS.contains(&a))
    {
        return Ok(ImageKind::Cubin(same_major));
    }
    match supported.last() {
        Some(&newest) if arch > newest => Ok(ImageKind::Ptx(newest)),
        _ => Err(format!(
            "this NVRTC compiles for sm_{} to sm_{}, not the GPU's sm_{arch}",
            supported.first().copied().unwrap_or(0),
            supported.last().copied().unwrap_or(0)
        )),
    }
}

fn nvrtc_error(e: result::NvrtcError) -> Error {
    Error::Cuda(format!("NVRTC: {e:?}"))
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed once. A failure leaks the program.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Where compiled kernels are kept between runs (compiling a CUBIN takes about a second):
/// `PIPECUT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/pipecut/kernels`, else
/// `~/.cache/pipecut/kernels`; `PIPECUT_KERNEL_CACHE=off` (or empty) turns the cache off.
fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("PIPECUT_KERNEL_CACHE") {
        Some(dir) if dir.is_empty() || dir == "off" => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("pipecut/kernels")),
    }
}

/// The cache file of `kind`: named by the source, the NVRTC version and the target, so a
/// changed kernel or another NVRTC never reads a stale image.
fn cache_file(kind: ImageKind) -> Option<PathBuf> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the out-pointers are valid for the call's writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .ok()?;
    let mut hash = Sha256::new();
    hash.update(KERNEL_SOURCE.as_bytes());
    hash.update(format!("nvrtc {major}.{minor} {kind:?}").as_bytes());
    let hex: String = hash.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let extension = match kind {
        ImageKind::Cubin(_) => "cubin",
        ImageKind::Ptx(_) => "ptx",
    };
    Some(cache_dir()?.join(format!("{hex}.{extension}")))
}

/// Whether `bytes` look like an image of `kind` (a cut-short file is compiled again).
fn looks_whole(kind: ImageKind, bytes: &[u8]) -> bool {
    match kind {
        ImageKind::Cubin(_) => bytes.starts_with(b"\x7fELF") && bytes.len() > 64,
        ImageKind::Ptx(_) => bytes.windows(8).any(|w| w == b".version"),
    }
}

/// [`compile`], through the on-disk cache. The cache is a convenience: when it cannot be read
/// or written the kernels are compiled as if it were off.
pub fn compile_cached(kind: ImageKind) -> Result<KernelImage, Error> {
    need_nvrtc()?;
    let Some(path) = cache_file(kind) else {
        return compile(kind);
    };
    if let Ok(bytes) = std::fs::read(&path) {
        if looks_whole(kind, &bytes) {
            return Ok(KernelImage { kind, bytes });
        }
    }
    let image = compile(kind)?;
    // Written aside and renamed into place, so a concurrent run never reads half a file.
    let stored = path.parent().and_then(|dir| {
        std::fs::create_dir_all(dir).ok()?;
        let mut file = tempfile::NamedTempFile::new_in(dir).ok()?;
        file.write_all(&image.bytes).ok()?;
        file.persist(&path).ok()
    });
    let _ = stored;
    Ok(image)
}

/// What ptxas reports for one kernel compiled for an architecture.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelResources {
    /// The kernel's name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of local memory written for spilled registers, per thread.
    pub spill_store_bytes: u32,
    /// Bytes of local memory read back for spilled registers, per thread.
    pub spill_load_bytes: u32,
    /// Bytes of stack frame per thread.
    pub stack_bytes: u32,
}

/// Compiles a CUBIN for `sm_<arch>` with ptxas's report on (`-v`) and reads each kernel's
/// registers and spills from it: what CI records for sm_80 and sm_90 (`pipecut devices
/// --ptxas 80 --ptxas 90`), so a change that makes a kernel spill shows without a GPU.
pub fn kernel_resources(arch: u32) -> Result<Vec<KernelResources>, Error> {
    let (_, log) = compile_with(ImageKind::Cubin(arch), &["--ptxas-options=-v"])?;
    Ok(parse_ptxas_log(&log))
}

/// The per-kernel figures of a `ptxas -v` log.
fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let number_before = |line: &str, unit: &str| -> u32 {
        line.split(unit)
            .next()
            .and_then(|head| head.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut kernels: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            kernels.push(KernelResources {
                kernel: rest.split('\'').next().unwrap_or_default().to_string(),
                registers: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                stack_bytes: 0,
            });
        } else if let Some(k) = kernels.last_mut() {
            if line.contains("bytes spill stores") {
                k.stack_bytes = number_before(line, "bytes stack frame");
                k.spill_store_bytes = number_before(line, "bytes spill stores");
                k.spill_load_bytes = number_before(line, "bytes spill loads");
            } else if line.contains("registers") {
                k.registers = number_before(line, "registers");
            }
        }
    }
    kernels
}

/// Compiles the kernels to `kind`.
pub fn compile(kind: ImageKind) -> Result<KernelImage, Error> {
    compile_with(kind, &[]).map(|(image, _)| image)
}

/// Compiles the kernels to `kind` with `extra` NVRTC options; answers the image and the log.
fn compile_with(kind: ImageKind, extra: &[&str]) -> Result<(KernelImage, String), Error> {
    need_nvrtc()?;
    let source = CString::new(KERNEL_SOURCE).expect("kernels.cu has no NUL byte");
    let name = CString::new("pipecut_kernels.cu").expect("no NUL byte");
    let program = Program(result::create_program(&source, Some(&name)).map_err(nvrtc_error)?);
    let arch = match kind {
        ImageKind::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
        ImageKind::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
    };
    let mut options = vec![arch];
    options.extend(extra.iter().map(|o| o.to_string()));
    // SAFETY: `program` is live; the log and image buffers are sized by NVRTC's own answers.
    unsafe {
        let compiled = result::compile_program(program.0, &options);
        let log = result::get_program_log(program.0).unwrap_or_default();
        let log = if log.is_empty() {
            String::new()
        } else {
            CStr::from_ptr(log.as_ptr() as *const c_char)
                .to_string_lossy()
                .trim()
                .to_string()
        };
        if let Err(e) = compiled {
            return Err(Error::Cuda(format!(
                "NVRTC failed to compile the kernels ({e:?}): {log}"
            )));
        }
        let bytes = match kind {
            ImageKind::Cubin(_) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(program.0, &mut size)
                    .result()
                    .map_err(nvrtc_error)?;
                let mut bytes = vec![0u8; size];
                sys::nvrtcGetCUBIN(program.0, bytes.as_mut_ptr() as *mut c_char)
                    .result()
                    .map_err(nvrtc_error)?;
                bytes
            }
            ImageKind::Ptx(_) => {
                let text = result::get_ptx(program.0).map_err(nvrtc_error)?;
                CStr::from_ptr(text.as_ptr())
                    .to_string_lossy()
                    .into_owned()
                    .into_bytes()
            }
        };
        Ok((KernelImage { kind, bytes }, log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_are_read_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'reduce_f32' for 'sm_80'\n\
            ptxas info    : Function properties for reduce_f32\n\
            ptxas         .     8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 38 registers, used 0 barriers, 916 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'unary_f32' for 'sm_80'\n\
            ptxas info    : Used 20 registers, 380 bytes cmem[0]";
        let kernels = parse_ptxas_log(log);
        assert_eq!(
            kernels[0],
            KernelResources {
                kernel: "reduce_f32".into(),
                registers: 38,
                spill_store_bytes: 12,
                spill_load_bytes: 4,
                stack_bytes: 8,
            }
        );
        assert_eq!(
            (kernels[1].kernel.as_str(), kernels[1].registers),
            ("unary_f32", 20)
        );
    }

    #[test]
    fn each_gpu_gets_a_cubin_unless_it_is_newer_than_nvrtc() {
        let known = [50, 52, 60, 70, 75, 80, 86, 89, 90, 100, 120];
        assert_eq!(image_for(90, &known), Ok(ImageKind::Cubin(90)));
        assert_eq!(image_for(80, &known), Ok(ImageKind::Cubin(80)));
        // sm_87 runs sm_86 code (same major, not newer).
        assert_eq!(image_for(87, &known), Ok(ImageKind::Cubin(86)));
        // A GPU newer than this NVRTC knows gets PTX its (newer) driver can JIT.
        assert_eq!(image_for(130, &known), Ok(ImageKind::Ptx(120)));
        assert!(image_for(35, &known).unwrap_err().contains("sm_35"));
    }

    /// A discrete GPU never gets an integrated GPU's SASS of the same major version: B300
    /// (sm_103) runs B200's sm_100, not Jetson Thor's sm_101; an sm_89 without its own CUBIN
    /// runs sm_86, not Orin's sm_87. The integrated GPUs keep their own.
    #[test]
    fn discrete_gpus_skip_integrated_gpus_cubins() {
        let known = [75, 80, 86, 87, 90, 100, 101, 120];
        assert_eq!(image_for(103, &known), Ok(ImageKind::Cubin(100)));
        assert_eq!(image_for(89, &known), Ok(ImageKind::Cubin(86)));
        assert_eq!(image_for(101, &known), Ok(ImageKind::Cubin(101)));
        assert_eq!(image_for(87, &known), Ok(ImageKind::Cubin(87)));
        assert_eq!(image_for(121, &known), Ok(ImageKind::Cubin(120)));
    }
}
