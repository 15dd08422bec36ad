//! The lock that lets one hub at a time serve from a state dir.
//!
//! Two hubs on one state dir would both render, write and delete objects, and answer
//! from a store the other changes under them. `serve` holds an exclusive advisory lock
//! on `<state dir>/hub.lock` for as long as it runs; the file also names the process
//! holding it, so a second hub can say which one is in the way. The kernel releases
//! the lock when the process ends, however it ends. Commands that only read the store
//! or add to it (`token`, `publish --state-dir`, `rollout`) do not take the lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside the state dir.
pub const LOCK_FILE: &str = "hub.lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another hub is already serving from {state_dir}{holder}: stop it first, or give this \
         one a --state-dir of its own"
    )]
    Held { state_dir: PathBuf, holder: String },
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Held for as long as the hub serves; dropping it releases the lock.
#[derive(Debug)]
pub struct StateDirLock {
    _file: File,
}

impl StateDirLock {
    /// Takes the lock on `state_dir` (which must exist) or says who holds it.
    pub fn acquire(state_dir: &Path) -> Result<StateDirLock, LockError> {
        let path = state_dir.join(LOCK_FILE);
        let io_error = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim() {
                    "" => String::new(),
                    pid => format!(" (process {pid}, see {})", path.display()),
                };
                return Err(LockError::Held {
                    state_dir: state_dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(source)) => return Err(io_error(source)),
        }
        // Ours now: say who holds it, for the next hub that tries.
        file.set_len(0).map_err(io_error)?;
        file.rewind().map_err(io_error)?;
        writeln!(file, "{}", std::process::id()).map_err(io_error)?;
        Ok(StateDirLock { _file: file })
    }
}

/// Whether the lock file exists but nobody holds it (for tests and diagnostics).
pub fn is_held(state_dir: &Path) -> io::Result<bool> {
    let file = match File::open(state_dir.join(LOCK_FILE)) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(err)) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let first = StateDirLock::acquire(dir.path()).expect("first");
        assert!(is_held(dir.path()).expect("check"));
        let err = StateDirLock::acquire(dir.path()).expect_err("second refused");
        let message = err.to_string();
        assert!(
            message.contains("another hub is already serving")
                && message.contains(&format!("process {}", std::process::id())),
            "{message}"
        );
        drop(first);
        assert!(!is_held(dir.path()).expect("check"));
        let _again = StateDirLock::acquire(dir.path()).expect("free again");
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).expect("read");
        assert_eq!(text.trim(), std::process::id().to_string());
    }
}
