//! Step 4 of the export: putting files in the output directory without leaving half-written
//! ones, and making external weights reachable from it without copying them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// How an external data file was made reachable from the output directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// The output directory already holds this very file (e.g. it is the model's directory).
    AlreadyThere,
    /// A hard link: a second name for the same bytes, no copy.
    HardLink,
    /// A symbolic link to the original (another filesystem).
    Symlink,
    /// A full copy: neither kind of link could be made.
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

/// A temporary name beside `path`, unique to this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so that a failed or
/// interrupted write never leaves a half-written file under the final name.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = temporary_beside(path);
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    result.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Whether two paths name the same file (same inode on Unix; same canonical path elsewhere).
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
    }
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Makes `source` reachable as `target`: a hard link, else a symbolic link, else a copy, each
/// made under a temporary name and renamed into place.
pub(crate) fn place_external(source: &Path, target: &Path) -> Result<Placement, Error> {
    if target.exists() && same_file(source, target) {
        return Ok(Placement::AlreadyThere);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|source| Error::Write {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let tmp = temporary_beside(target);
    let _ = std::fs::remove_file(&tmp);
    let placement = if std::fs::hard_link(source, &tmp).is_ok() {
        Placement::HardLink
    } else if symlink(source, &tmp).is_ok() {
        Placement::Symlink
    } else {
        std::fs::copy(source, &tmp).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::Write {
                path: target.to_path_buf(),
                source: e,
            }
        })?;
        Placement::Copy
    };
    std::fs::rename(&tmp, target).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Write {
            path: target.to_path_buf(),
            source,
        }
    })?;
    Ok(placement)
}

/// A symbolic link to the absolute path of `source`, so that it resolves from any directory.
fn symlink(source: &Path, link: &Path) -> std::io::Result<()> {
    let absolute = source.canonicalize()?;
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(absolute, link)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::symlink_file(absolute, link)
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (absolute, link);
        Err(std::io::Error::other(
            "symbolic links are not supported here",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.onnx");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn failed_write_names_the_file_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("a.onnx");
        let err = write_atomically(&path, b"x").unwrap_err();
        assert!(err.to_string().contains("a.onnx"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn external_data_is_linked_not_copied() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("w.bin");
        std::fs::write(&source, b"weights").unwrap();
        let out = dir.path().join("out");
        let target = out.join("sub").join("w.bin");
        let placement = place_external(&source, &target).unwrap();
        assert_eq!(placement, Placement::HardLink);
        assert!(same_file(&source, &target));
        assert_eq!(
            place_external(&source, &target).unwrap(),
            Placement::AlreadyThere
        );
        assert_eq!(
            place_external(&source, &source).unwrap(),
            Placement::AlreadyThere
        );
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
