//! Step 4 of the export: putting files in the output directory without leaving half-written
//! ones, and copying the external weights the stages read beside them.
//!
//! Every file is first written to an exclusive temporary in the output directory
//! ([`pipecut_ir::io::Staged`]); only when all of them are complete are they renamed into place, so a
//! failed export leaves an earlier complete one as it was. External data is **copied** (the OS
//! shares extents where the filesystem can, `copy_file_range`), never linked: a hard link makes
//! editing the output edit the original and is refused by onnx >= 1.20 ("potential hardlink
//! attack"); a symbolic link can dangle or point anywhere.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::Error;
use pipecut_ir::io::{OutputMode, Staged};

/// How an external data file was made reachable from the output directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// The output directory already holds this very file (e.g. it is the model's directory).
    AlreadyThere,
    /// A copy of the bytes (sharing extents where the filesystem can).
    Copy,
}

/// Creates `dir` (and its parents) and checks that it is a directory.
pub(crate) fn prepare_out_dir(dir: &Path) -> Result<(), Error> {
    let fail = |detail: String| Error::OutDir {
        path: dir.to_path_buf(),
        detail,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(fail("it exists and is not a directory".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let meta = std::fs::metadata(dir).map_err(|e| fail(e.to_string()))?;
    if !meta.is_dir() {
        return Err(fail("it is not a directory".into()));
    }
    if meta.permissions().readonly() {
        return Err(fail("it is read-only".into()));
    }
    Ok(())
}

/// Writes `bytes` to `path` through an exclusive temporary file beside it and a rename, so that
/// a failed or interrupted write never leaves a half-written file under the final name.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    pipecut_ir::io::write_atomically(path, bytes, OutputMode::Default)
}

/// `bytes` staged for `target`, to be committed with the rest of the export.
pub(crate) fn stage_bytes(target: &Path, bytes: &[u8], mode: OutputMode) -> Result<Staged, Error> {
    use std::io::Write;
    let mut staged = Staged::new(target, mode)?;
    staged
        .file()
        .write_all(bytes)
        .map_err(|source| Error::Write {
            path: target.to_path_buf(),
            source,
        })?;
    Ok(staged)
}

/// Stages a copy of `source` (an external data file the loader's checks resolved) at
/// `out_dir/location`. `location` must be relative and stay inside `out_dir`, and so must every
/// directory on the way, links included. `None` when the target already is the source.
pub(crate) fn stage_external(
    source: &Path,
    out_dir: &Path,
    location: &str,
    mode: OutputMode,
) -> Result<Option<Staged>, Error> {
    let target = out_dir.join(location);
    if pipecut_ir::io::same_file(source, &target) {
        return Ok(None);
    }
    let outside = || Error::OutDir {
        path: out_dir.to_path_buf(),
        detail: format!("the external data location '{location}' leaves it; refusing to write"),
    };
    if !Path::new(location)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(outside());
    }
    let parent = target.parent().unwrap_or(out_dir);
    std::fs::create_dir_all(parent).map_err(|source| Error::Write {
        path: parent.to_path_buf(),
        source,
    })?;
    // A directory inside the output that is a link may lead anywhere: the resolved parent must
    // still be inside the resolved output directory.
    let inside = match (parent.canonicalize(), out_dir.canonicalize()) {
        (Ok(p), Ok(o)) => p.starts_with(o),
        _ => false,
    };
    if !inside {
        return Err(outside());
    }
    let write_error = |source| Error::Write {
        path: target.clone(),
        source,
    };
    let mut input = pipecut_ir::io::open_regular(source).map_err(|detail| Error::Input {
        what: "external data file".into(),
        path: source.to_path_buf(),
        detail,
    })?;
    let mut staged = Staged::new(&target, mode)?;
    pipecut_ir::io::copy_keeping_holes(&mut input, staged.file()).map_err(write_error)?;
    Ok(Some(staged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_names_the_file_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("a.onnx");
        let err = write_atomically(&path, b"x").unwrap_err();
        assert!(err.to_string().contains("a.onnx"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn external_data_is_copied_not_linked() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("w.bin");
        std::fs::write(&source, b"weights").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let staged = stage_external(&source, &out, "sub/w.bin", OutputMode::Default).unwrap();
        staged.expect("a copy").commit().unwrap();
        let target = out.join("sub").join("w.bin");
        assert_eq!(std::fs::read(&target).unwrap(), b"weights");
        assert!(
            !pipecut_ir::io::same_file(&source, &target),
            "a link, not a copy"
        );
        // Exporting into the model's own directory keeps the file where it is.
        assert!(
            stage_external(&source, dir.path(), "w.bin", OutputMode::Default)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_external_location_cannot_leave_the_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("w.bin");
        std::fs::write(&source, b"weights").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        for location in ["../victim.txt", "/tmp/x", "a/../../b"] {
            let err = stage_external(&source, &out, location, OutputMode::Default)
                .err()
                .expect("refused");
            assert!(err.to_string().contains("leaves it"), "{location}: {err}");
        }
        #[cfg(unix)]
        {
            let elsewhere = dir.path().join("elsewhere");
            std::fs::create_dir(&elsewhere).unwrap();
            std::os::unix::fs::symlink(&elsewhere, out.join("link")).unwrap();
            let err = stage_external(&source, &out, "link/w.bin", OutputMode::Default)
                .err()
                .expect("refused");
            assert!(err.to_string().contains("leaves it"), "{err}");
            assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        }
    }

    #[test]
    fn an_out_dir_under_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let err = prepare_out_dir(&file.join("out")).unwrap_err();
        assert!(matches!(err, Error::OutDir { .. }), "{err}");
        let err = prepare_out_dir(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
}
