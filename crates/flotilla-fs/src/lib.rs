//! Durable file writes, shared by the hub's store, `publish` and the agent's state folder.
//!
//! A file is replaced by writing a temporary file beside it, fsyncing it, renaming it
//! over the old one, and (for [`write_atomically`]) fsyncing the folder so the rename
//! itself survives a power cut. A reader therefore sees the old file or the new one,
//! never half of either. [`Mode::Private`] makes files readable by their owner only
//! (bundles may hold Secrets, stores hold token hashes); [`Mode::Public`] leaves the
//! permissions to the umask (files a web server must read).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Who may read a file written here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Owner only: files 0600, folders 0700.
    Private,
    /// As the process's umask allows (for files served by a web server).
    Public,
}

/// The prefix of every temporary file this crate makes; [`is_temporary`] recognises it.
pub const TEMP_PREFIX: &str = ".flotilla-tmp-";

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary name unique within this process, and across processes even where
/// process ids repeat (every container's first process is pid 1): the pid, the
/// process's start time in nanoseconds and a counter.
fn temp_name() -> String {
    static STARTED: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    });
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{TEMP_PREFIX}{}-{started:x}-{n}", std::process::id())
}

/// Whether a file name is one of this crate's temporary files (left behind only by a
/// process killed mid-write; safe to remove when no writer runs).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Replaces `path` with `bytes` durably: temporary file, fsync, rename, fsync of the folder.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: Mode) -> io::Result<()> {
    replace_file(path, bytes, mode)?;
    sync_dir(parent_of(path))
}

/// [`write_atomically`] of what `write` writes, through a buffer of its own: a large
/// file (an agent's inventory of 100,000 resources) is never held whole in memory.
pub fn write_atomically_with(
    path: &Path,
    mode: Mode,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    replace_file_with(path, mode, |file| {
        let mut buffered = io::BufWriter::with_capacity(64 * 1024, file);
        write(&mut buffered)?;
        buffered.flush()
    })?;
    sync_dir(parent_of(path))
}

/// Replaces `path` with `bytes` through a temporary file in the same folder, so the file
/// is never seen half written. The rename is durable only once the caller has synced
/// the folder ([`sync_dir`]): one sync for many files is much cheaper than one each.
pub fn replace_file(path: &Path, bytes: &[u8], mode: Mode) -> io::Result<()> {
    replace_file_with(path, mode, |file| file.write_all(bytes))
}

/// [`replace_file`] with what `write` writes into the temporary file.
fn replace_file_with(
    path: &Path,
    mode: Mode,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = parent_of(path).join(temp_name());
    let result = (|| {
        let mut file = open_for_writing(&tmp, mode)?;
        write(&mut file)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes a rename or removal in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `path` and its missing parents; with [`Mode::Private`] the folders it makes
/// are 0700, and an existing `path` is narrowed to 0700 too.
pub fn create_dir(path: &Path, mode: Mode) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    if mode == Mode::Private {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)?;
    #[cfg(unix)]
    if mode == Mode::Private {
        use std::os::unix::fs::PermissionsExt;
        let current = fs::metadata(path)?.permissions().mode() & 0o777;
        if current & 0o077 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(current & 0o700))?;
        }
    }
    Ok(())
}

/// Removes the files of `dir` (not folders) whose names `is_temporary` accepts, and
/// syncs the folder if any was removed.
pub fn remove_temporary_files(
    dir: &Path,
    is_temporary: impl Fn(&str) -> bool,
) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_temporary(name) && entry.file_type()?.is_file() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

fn open_for_writing(path: &Path, mode: Mode) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if mode == Mode::Private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = mode;
    options.open(path)
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_a_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bundle.json");
        write_atomically(&path, b"one", Mode::Private).expect("writes");
        write_atomically(&path, b"two", Mode::Private).expect("writes again");
        assert_eq!(fs::read(&path).expect("reads"), b"two");
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["bundle.json"]);
    }

    #[test]
    fn a_file_written_as_it_is_made_replaces_the_old_one_only_when_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("inventory.json");
        write_atomically(&path, b"old", Mode::Private).expect("writes");
        // Larger than the buffer, in many writes.
        let line = [b'x'; 1000];
        write_atomically_with(&path, Mode::Private, |file| {
            (0..200).try_for_each(|_| file.write_all(&line))
        })
        .expect("writes");
        assert_eq!(fs::read(&path).expect("reads").len(), 200_000);
        // A writer that fails half way leaves the file as it was, and no temporary.
        let err = write_atomically_with(&path, Mode::Private, |file| {
            file.write_all(&line)?;
            Err(io::Error::other("the value cannot be written"))
        })
        .expect_err("fails");
        assert_eq!(err.to_string(), "the value cannot be written");
        assert_eq!(fs::read(&path).expect("reads").len(), 200_000);
        assert_eq!(fs::read_dir(dir.path()).expect("lists").count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn private_files_and_folders_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state/objects");
        create_dir(&state, Mode::Private).expect("creates");
        let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        let file = state.join("x");
        write_atomically(&file, b"secret", Mode::Private).expect("writes");
        assert_eq!(mode(&file), 0o600);

        let open = dir.path().join("open");
        fs::create_dir(&open).expect("creates");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).expect("chmod");
        create_dir(&open, Mode::Private).expect("narrows");
        assert_eq!(mode(&open), 0o700);
    }

    #[test]
    fn removes_only_temporary_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(temp_name()), b"half").expect("writes");
        fs::write(dir.path().join("kept"), b"whole").expect("writes");
        let removed = remove_temporary_files(dir.path(), is_temporary).expect("removes");
        assert_eq!(removed, 1);
        assert!(dir.path().join("kept").exists());
    }
}
