//! Reading the files a user names and writing the files pipecut makes, safely.
//!
//! Every phase that touches the filesystem goes through here, so the guarantees of
//! `docs/robustness.md` ("What pipecut writes and reads") hold in one place:
//!
//! - **Reads are bounded** ([`read_bounded`]): only regular files are opened (a FIFO with no
//!   writer would block forever, `/dev/zero` never ends), and never more than a stated cap.
//! - **Writes are atomic and never follow a planted link** ([`write_atomically`]): the bytes go to
//!   a new file created with `O_EXCL` (`create_new`) under an unpredictable name in the target's
//!   own directory, then are renamed over the target. A symbolic link at the target is replaced,
//!   not followed; one at the temporary name cannot exist, since the name is chosen at random and
//!   created exclusively.
//! - **Outputs are checked before anything is written** ([`check_output`]): an output that is one
//!   of the inputs (same device and inode), that exists and is not a regular file (`/dev/null`, a
//!   directory), or whose directory does not exist is refused with a one-line error.
//! - **Outputs are no more readable than their source** ([`OutputMode`]): a file derived from a
//!   `0600` model is written `0600`.

use std::io::Read;
use std::path::Path;

use crate::Error;

/// The largest JSON document pipecut reads by default (plans, clusters, device profiles,
/// calibrations, node times, onnxruntime traces). The biggest real plan we make (GPT-3-175B
/// shape, 98 stages, 3,962 nodes) is about 1 MB; a plan for a million-node model about 40 MB.
/// Parsed, a document takes up to ~8 times its size (a short JSON string becomes a 24-byte
/// `String`), and checking a plan as much again: 64 MiB keeps the worst case near 1 GB, well
/// inside a 4 GiB address space, where 256 MiB aborted. [`MAX_JSON_ENV`] raises it.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Environment variable that sets the JSON limit in MiB, for a user whose legitimate plan or
/// trace is larger than [`MAX_JSON_BYTES`].
pub const MAX_JSON_ENV: &str = "PIPECUT_MAX_JSON_MIB";

/// The largest ONNX protobuf pipecut reads: protobuf's own 2 GiB message limit, beyond which an
/// ONNX model must keep its weights in external data files.
pub const MAX_MODEL_BYTES: u64 = 2 << 30;

/// The JSON limit in force: [`MAX_JSON_ENV`] when set (a positive number of MiB), else
/// [`MAX_JSON_BYTES`].
pub fn max_json_bytes() -> Result<u64, String> {
    let Some(value) = std::env::var_os(MAX_JSON_ENV) else {
        return Ok(MAX_JSON_BYTES);
    };
    value
        .to_str()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&mib| mib > 0)
        .and_then(|mib| mib.checked_mul(1 << 20))
        .ok_or_else(|| {
            format!(
                "{MAX_JSON_ENV}={} is not a positive number of MiB",
                value.to_string_lossy()
            )
        })
}

/// Reads a JSON document's text (`what` names its role in errors) within [`max_json_bytes`];
/// a larger file's error says how to raise the limit.
pub fn read_json_text(path: &Path, what: &str) -> Result<String, Error> {
    let cap = max_json_bytes().map_err(|detail| Error::Input {
        what: what.to_string(),
        path: path.to_path_buf(),
        detail,
    })?;
    let bytes = read_capped(
        path,
        cap,
        what,
        &format!(" (set {MAX_JSON_ENV} to raise it)"),
    )?;
    into_text(bytes, path, what)
}

/// Reads a whole ONNX model file, within [`MAX_MODEL_BYTES`]. The bytes are read, not mapped:
/// a map of a file that another process truncates faults (`SIGBUS`) at the first page past the
/// new end, killing the process, or the program embedding pipecut.
pub fn read_model_bytes(path: &Path) -> Result<Vec<u8>, Error> {
    read_bounded(path, MAX_MODEL_BYTES, "model")
}

/// `len` bytes of `file` from `offset`, read rather than mapped (see [`read_model_bytes`]): a
/// file shorter than that, truncated meanwhile included, is an error, as is a buffer that
/// cannot be allocated.
pub fn read_range(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    bytes
        .try_reserve_exact(len)
        .map_err(|_| std::io::Error::other(format!("cannot allocate {len} bytes")))?;
    bytes.resize(len, 0);
    read_exact_at(file, &mut bytes, offset)?;
    Ok(bytes)
}

#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(mut file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

/// Reads a whole regular file of at most `cap` bytes. `what` names the file's role in errors
/// ("plan", "cluster file").
pub fn read_bounded(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>, Error> {
    read_capped(path, cap, what, "")
}

/// [`read_bounded`], with `hint` after the error of a file over the cap.
fn read_capped(path: &Path, cap: u64, what: &str, hint: &str) -> Result<Vec<u8>, Error> {
    let fail = |detail: String| Error::Input {
        what: what.to_string(),
        path: path.to_path_buf(),
        detail,
    };
    let too_large = || {
        fail(format!(
            "it is larger than {} MiB, the most pipecut reads for a {what}{hint}",
            cap >> 20
        ))
    };
    let file = open_regular(path).map_err(&fail)?;
    let len = file.metadata().map_err(|e| fail(e.to_string()))?.len();
    if len > cap {
        return Err(too_large());
    }
    // Reserved before reading, fallibly: a file near the cap under a tight address space is an
    // error, never an abort, and the buffer does not double as it grows.
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize + 1)
        .map_err(|_| fail(format!("cannot allocate {len} bytes to read it")))?;
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > cap {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text; a binary file says what it probably is.
pub fn read_text_bounded(path: &Path, cap: u64, what: &str) -> Result<String, Error> {
    into_text(read_bounded(path, cap, what)?, path, what)
}

fn into_text(bytes: Vec<u8>, path: &Path, what: &str) -> Result<String, Error> {
    String::from_utf8(bytes).map_err(|_| Error::Input {
        what: what.to_string(),
        path: path.to_path_buf(),
        detail: format!("it is not text (is it an ONNX model given where a {what} belongs?)"),
    })
}

/// Opens `path` for reading if, and only if, it is a regular file. The type is checked before
/// opening (so a FIFO is never opened) and again on the open file (so a swap in between is seen).
pub fn open_regular(path: &Path) -> Result<std::fs::File, String> {
    let kind = |meta: &std::fs::Metadata| -> Result<(), String> {
        let file_type = meta.file_type();
        if file_type.is_file() {
            Ok(())
        } else if file_type.is_dir() {
            Err("it is a directory, not a file".into())
        } else {
            Err("it is not a regular file (a pipe, socket or device?)".into())
        }
    };
    let meta = std::fs::metadata(path).map_err(|e| os_reason(&e))?;
    kind(&meta)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        // O_NONBLOCK: should the path have become a FIFO since the check, open does not wait
        // for a writer; on a regular file the flag has no effect.
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| os_reason(&e))?;
    kind(&file.metadata().map_err(|e| os_reason(&e))?)?;
    Ok(file)
}

/// Copies a whole file, keeping its holes: external weights are often sparse placeholders
/// (the GPT-3 fixture's 349 GB file holds no data), and a plain copy would write every zero.
/// Where the filesystem cannot report holes, the bytes are copied as they read.
pub fn copy_keeping_holes(
    input: &mut std::fs::File,
    output: &mut std::fs::File,
) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let len = input.metadata()?.len();
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = input.as_raw_fd();
        let mut position: u64 = 0;
        while position < len {
            let seek = |from: u64, whence| {
                let offset = i64::try_from(from).map_err(std::io::Error::other)?;
                // SAFETY: lseek on a descriptor this function borrows; no memory is touched.
                let at = unsafe { libc::lseek(fd, offset, whence) };
                if at < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(at as u64)
                }
            };
            let data = match seek(position, libc::SEEK_DATA) {
                Ok(at) => at,
                // No data after `position`: the rest is a hole.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
                // The filesystem cannot tell: copy everything from here.
                Err(_) => {
                    input.seek(SeekFrom::Start(position))?;
                    output.seek(SeekFrom::Start(position))?;
                    std::io::copy(input, output)?;
                    return Ok(());
                }
            };
            let hole = seek(data, libc::SEEK_HOLE)?.min(len);
            input.seek(SeekFrom::Start(data))?;
            output.seek(SeekFrom::Start(data))?;
            std::io::copy(&mut Read::by_ref(input).take(hole - data), output)?;
            position = hole;
        }
        output.set_len(len)?;
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        input.seek(SeekFrom::Start(0))?;
        std::io::copy(input, output)?;
        output.set_len(len)
    }
}

/// An OS error's reason without the "(os error N)" suffix, which says nothing to a user.
pub fn os_reason(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The permissions of a file pipecut writes.
#[derive(Debug, Clone, Copy, Default)]
pub enum OutputMode {
    /// Readable as the user's umask allows (`0666 & !umask`), like any new file.
    #[default]
    Default,
    /// No more readable than the file at this path (a model's weights stay `0600`).
    LikeSource(u32),
}

impl OutputMode {
    /// The mode of `source`'s permission bits, or the default where they cannot be read.
    pub fn like(source: &Path) -> OutputMode {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(source) {
                return OutputMode::LikeSource(meta.permissions().mode() & 0o666);
            }
        }
        let _ = source;
        OutputMode::Default
    }

    /// The permission bits to create a file with (`Staged` passes them to open(2)).
    #[cfg(feature = "output")]
    fn bits(self) -> u32 {
        match self {
            OutputMode::Default => 0o666,
            OutputMode::LikeSource(mode) => mode,
        }
    }
}

/// Refuses an output path before anything is written: an existing non-regular file, a missing
/// directory, a path naming a directory, or a file that is one of `inputs`.
pub fn check_output(path: &Path, inputs: &[&Path]) -> Result<(), Error> {
    let fail = |detail: String| Error::Output {
        path: path.to_path_buf(),
        detail,
    };
    if path.as_os_str().is_empty() {
        return Err(fail("the path is empty".into()));
    }
    let ends_with_separator = path
        .to_str()
        .is_some_and(|s| s.ends_with('/') || s.ends_with(std::path::MAIN_SEPARATOR));
    if ends_with_separator || path.is_dir() {
        return Err(fail("it is a directory; name a file inside it".into()));
    }
    let dir = parent_dir(path);
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(fail(format!("'{}' is not a directory", dir.display()))),
        Err(_) => {
            return Err(fail(format!(
                "the directory '{}' does not exist; create it first",
                dir.display()
            )))
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.is_file() && !meta.file_type().is_symlink() {
            return Err(fail(
                "it exists and is not a regular file; refusing to replace it".into(),
            ));
        }
    }
    for input in inputs {
        if same_file(path, input) {
            return Err(fail(format!(
                "it is the input '{}'; refusing to overwrite an input",
                input.display()
            )));
        }
    }
    Ok(())
}

/// The directory a path's file lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether two paths name the same existing file (same device and inode on Unix; same canonical
/// path elsewhere). A path that does not exist is no file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
        false
    }
    #[cfg(not(unix))]
    {
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

/// Writing outputs atomically (behind the feature `output`, which the export, the runtime and
/// the command turn on): an embedder that only plans compiles no temporary-file crate.
#[cfg(feature = "output")]
mod staged;
#[cfg(feature = "output")]
pub use staged::{remove_stale_temporaries, write_atomically, write_atomically_with, Staged};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_that_are_inputs_or_not_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.onnx");
        std::fs::write(&model, b"x").unwrap();
        let err = check_output(&model, &[&model]).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite an input"), "{err}");
        let err = check_output(dir.path(), &[]).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let missing = dir.path().join("nope").join("plan.json");
        let err = check_output(&missing, &[]).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        #[cfg(unix)]
        {
            let err = check_output(Path::new("/dev/null"), &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
        check_output(&dir.path().join("plan.json"), &[&model]).unwrap();
    }

    #[test]
    fn reads_are_bounded_and_only_of_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        std::fs::write(&path, vec![b' '; 2048]).unwrap();
        let err = read_bounded(&path, 1024, "plan").unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
        assert_eq!(read_bounded(&path, 4096, "plan").unwrap().len(), 2048);
        let err = read_bounded(dir.path(), 4096, "plan")
            .unwrap_err()
            .to_string();
        assert!(err.contains("directory"), "{err}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("plan.json");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(status.success());
        let err = read_bounded(&fifo, 4096, "plan").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn copies_keep_holes_and_bytes() {
        use std::io::{Seek, SeekFrom, Write as _};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("w.bin");
        let mut file = std::fs::File::create(&source).unwrap();
        file.seek(SeekFrom::Start(1 << 30)).unwrap();
        file.write_all(b"tail").unwrap();
        file.set_len((2 << 30) + 7).unwrap();
        let target = dir.path().join("copy.bin");
        let mut input = std::fs::File::open(&source).unwrap();
        let mut output = std::fs::File::create(&target).unwrap();
        copy_keeping_holes(&mut input, &mut output).unwrap();
        let meta = std::fs::metadata(&target).unwrap();
        assert_eq!(meta.len(), (2 << 30) + 7);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 64 << 20, "{} blocks", meta.blocks());
        let mut tail = [0u8; 4];
        let mut copy = std::fs::File::open(&target).unwrap();
        copy.seek(SeekFrom::Start(1 << 30)).unwrap();
        std::io::Read::read_exact(&mut copy, &mut tail).unwrap();
        assert_eq!(&tail, b"tail");
    }
}
