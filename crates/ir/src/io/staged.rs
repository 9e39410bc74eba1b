//! Outputs written under a temporary name beside their target and renamed into place.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{parent_dir, OutputMode};
use crate::Error;

/// Prefix of pipecut's temporary files, followed by the writing process's id: a later run can
/// then remove the ones a killed process left behind (see [`remove_stale_temporaries`]).
const TEMP_PREFIX: &str = ".pipecut-tmp-";

/// A file being written under a temporary name in its target's directory; [`Staged::commit`]
/// renames it into place, dropping it removes it.
pub struct Staged {
    file: tempfile::NamedTempFile,
    target: PathBuf,
}

impl Staged {
    /// Creates the temporary file beside `target` (exclusively, at an unpredictable name).
    pub fn new(target: &Path, mode: OutputMode) -> Result<Staged, Error> {
        let dir = parent_dir(target);
        let prefix = format!("{TEMP_PREFIX}{}-", std::process::id());
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // The mode goes to open(2), so the user's umask still applies.
            builder.permissions(std::fs::Permissions::from_mode(mode.bits()));
        }
        #[cfg(not(unix))]
        let _ = mode;
        let file = builder.tempfile_in(dir).map_err(|source| Error::Write {
            path: target.to_path_buf(),
            source,
        })?;
        Ok(Staged {
            file,
            target: target.to_path_buf(),
        })
    }

    /// The open temporary file, to write into.
    pub fn file(&mut self) -> &mut std::fs::File {
        self.file.as_file_mut()
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes the bytes and renames the file over its target (replacing a link there rather
    /// than following it).
    pub fn commit(self) -> Result<(), Error> {
        let target = self.target;
        let fail = |source| Error::Write {
            path: target.clone(),
            source,
        };
        self.file.as_file().sync_data().map_err(fail)?;
        self.file.persist(&target).map_err(|e| fail(e.error))?;
        Ok(())
    }
}

/// Writes `bytes` to `path` atomically: a failed or interrupted write never leaves a
/// half-written file under the final name, and nothing outside `path` is touched.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: OutputMode) -> Result<(), Error> {
    write_atomically_with(path, mode, |file| file.write_all(bytes))
}

/// [`write_atomically`] with the bytes written by `write` as it makes them (`write` buffers
/// them): a 46 MB plan then never exists whole in memory before it is written.
pub fn write_atomically_with(
    path: &Path,
    mode: OutputMode,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), Error> {
    let mut staged = Staged::new(path, mode)?;
    write(staged.file()).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })?;
    staged.commit()
}

/// Removes the temporary files that pipecut processes which no longer run (killed with
/// `kill -9`, say) left in `dir`. Only names with pipecut's prefix and a dead writer's id are
/// touched; where liveness cannot be told (no `/proc`), nothing is removed.
pub fn remove_stale_temporaries(dir: &Path) {
    let proc_root = Path::new("/proc/self");
    if !proc_root.exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomically(&path, b"one", OutputMode::Default).unwrap();
        write_atomically(&path, b"two", OutputMode::Default).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_link_at_the_target_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("plan.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_atomically(&path, b"plan", OutputMode::Default).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"plan");
    }

    #[cfg(unix)]
    #[test]
    fn outputs_are_no_more_readable_than_their_source() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.onnx");
        std::fs::write(&model, b"x").unwrap();
        std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = dir.path().join("stage_0.onnx");
        write_atomically(&out, b"y", OutputMode::like(&model)).unwrap();
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn temporaries_of_dead_writers_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum (2^22) never runs.
        let dead = dir.path().join(format!("{TEMP_PREFIX}4294967-abc"));
        let ours = dir
            .path()
            .join(format!("{TEMP_PREFIX}{}-abc", std::process::id()));
        let other = dir.path().join("stage_0.onnx");
        for p in [&dead, &ours, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        remove_stale_temporaries(dir.path());
        assert!(!dead.exists());
        assert!(ours.exists() && other.exists());
    }
}
