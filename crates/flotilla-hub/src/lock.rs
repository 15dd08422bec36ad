//! The lock that lets one hub at a time serve from a state dir.
//!
//! Two hubs on one state dir would both render, write and delete objects, and answer
//! from a store the other changes under them. `serve` holds an exclusive advisory lock
//! on `<state dir>/hub.lock` for as long as it runs; the file also names the process
//! holding it, so a second hub can say which one is in the way. The kernel releases
//! the lock when the process ends, however it ends. Commands that only read the store
//! or add to it (`token`, `publish --state-dir`, `rollout`) do not take the lock.
//! A SQLite database given with `--database` outside the state dir gets a lock of its
//! own beside it (`<file>.hub.lock`): hubs share only PostgreSQL.
//!
//! The lock belongs to the open file, not to the descriptor: a process started by any
//! thread of this one holds a copy of every descriptor from its fork until its exec
//! (close-on-exec closes them only then), and closing ours does not release the lock
//! while a copy is open. So dropping the lock unlocks the file first, and a hub started
//! again in the same process (a test, a program embedding the hub) finds it free at
//! once, however many processes are being started around it.

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
    #[error(
        "another hub is already serving from the SQLite database {database}{holder}: hubs \
         cannot share a SQLite file (each would take every rollout decision and delete the \
         other's objects); stop it first, or share a PostgreSQL database between hubs"
    )]
    DatabaseHeld { database: PathBuf, holder: String },
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
    file: File,
}

impl Drop for StateDirLock {
    fn drop(&mut self) {
        // Released now, even while a process being started holds a copy of the
        // descriptor (see the module's documentation).
        if let Err(err) = self.file.unlock() {
            tracing::warn!("cannot unlock the state dir: {err}");
        }
    }
}

impl StateDirLock {
    /// Takes the lock on `state_dir` (which must exist) or says who holds it.
    pub fn acquire(state_dir: &Path) -> Result<StateDirLock, LockError> {
        StateDirLock::acquire_file(&state_dir.join(LOCK_FILE), |holder| LockError::Held {
            state_dir: state_dir.to_path_buf(),
            holder,
        })
    }

    /// Takes the lock beside a SQLite database given with `--database` outside the
    /// state dir (`<file>.hub.lock`): two hubs with state dirs of their own must not
    /// share it either.
    pub fn acquire_database(database: &Path) -> Result<StateDirLock, LockError> {
        // One lock however the file is named (a relative path, a symlink on the way):
        // its folder as the file system resolves it, and its own name.
        let folder = match database.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let resolved = match (std::fs::canonicalize(folder), database.file_name()) {
            (Ok(folder), Some(file)) => folder.join(file),
            _ => database.to_path_buf(),
        };
        let resolved = std::fs::canonicalize(&resolved).unwrap_or(resolved);
        let mut name = resolved.into_os_string();
        name.push(".hub.lock");
        StateDirLock::acquire_file(Path::new(&name), |holder| LockError::DatabaseHeld {
            database: database.to_path_buf(),
            holder,
        })
    }

    fn acquire_file(
        path: &Path,
        held: impl FnOnce(String) -> LockError,
    ) -> Result<StateDirLock, LockError> {
        let path = path.to_path_buf();
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
                return Err(held(holder));
            }
            Err(TryLockError::Error(source)) => return Err(io_error(source)),
        }
        // Ours now (and released again if what follows fails): say who holds it, for
        // the next hub that tries.
        let mut lock = StateDirLock { file };
        lock.file.set_len(0).map_err(io_error)?;
        lock.file.rewind().map_err(io_error)?;
        writeln!(lock.file, "{}", std::process::id()).map_err(io_error)?;
        Ok(lock)
    }
}

/// Whether a hub holds the lock on `state_dir` (for tests and diagnostics).
pub fn is_held(state_dir: &Path) -> io::Result<bool> {
    let file = match File::open(state_dir.join(LOCK_FILE)) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    match file.try_lock_shared() {
        // Unlocked before the file closes, for the same reason as a StateDirLock.
        Ok(()) => file.unlock().map(|()| false),
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

    /// A process started while the lock is held keeps a copy of its descriptor until
    /// its exec; a process given the descriptor as its stdin keeps one as long as it
    /// runs, which makes that moment last. The lock is free as soon as it is dropped.
    #[test]
    fn a_dropped_lock_is_free_at_once_while_another_process_holds_its_descriptor() {
        let dir = tempfile::tempdir().expect("dir");
        let lock = StateDirLock::acquire(dir.path()).expect("lock");
        let copy = lock.file.try_clone().expect("copy of the descriptor");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(copy)
            .spawn()
            .expect("sleep runs");
        drop(lock);
        let again = StateDirLock::acquire(dir.path());
        let _ = child.kill();
        let _ = child.wait();
        again.expect("free at once");
    }
}
