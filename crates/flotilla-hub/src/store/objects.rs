//! Content-addressed objects on disk: `objects/sha256/<hex>` holds the canonical
//! resource bytes whose digest is `sha256:<hex>`.
//!
//! Every object is written to a temporary file, fsynced and renamed into place, and
//! the folder is fsynced once after a batch, so a crash leaves either the whole object
//! or none. Batches are written by several threads at once because the file system
//! commits concurrent fsyncs together (1,000 objects take about a quarter of a second
//! here instead of three and a half).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use flotilla_fs::Mode;

use flotilla_core::bundle::Digest;

/// How many threads write a batch of objects.
const WRITERS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("cannot write object {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("cannot read object {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error(
        "object {path} is corrupt: its content hashes to {actual}; delete it and the hub writes it again on the next render"
    )]
    Corrupt { path: String, actual: Digest },
}

#[derive(Debug, Clone)]
pub struct Objects {
    dir: PathBuf,
}

impl Objects {
    /// Opens (and creates, readable by the hub's user only) `<root>/objects/sha256`.
    pub fn open(root: &Path) -> io::Result<Objects> {
        let dir = root.join("objects").join("sha256");
        flotilla_fs::create_dir(&dir, Mode::Private)?;
        Ok(Objects { dir })
    }

    /// Objects under `dir` (`<root>/objects/sha256`) without creating anything.
    pub fn unopened(dir: &Path) -> Objects {
        Objects {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.path_of(digest).is_file()
    }

    /// Reads an object and checks that its content still has its digest.
    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, ObjectError> {
        let path = self.path_of(digest);
        let bytes = fs::read(&path).map_err(|source| ObjectError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(ObjectError::Corrupt {
                path: path.display().to_string(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Writes every object that is not on disk yet, durably, then fsyncs the folder.
    /// Objects already present are left alone: same name, same content.
    pub fn write_all(&self, objects: &[(&Digest, &[u8])]) -> Result<usize, ObjectError> {
        let missing: Vec<&(&Digest, &[u8])> = objects
            .iter()
            .filter(|(digest, _)| !self.contains(digest))
            .collect();
        if missing.is_empty() {
            return Ok(0);
        }
        let chunk = missing.len().div_ceil(WRITERS).max(1);
        let results: Vec<Result<(), ObjectError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = missing
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        for (digest, bytes) in part {
                            self.write_one(digest, bytes)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(ObjectError::Write {
                            path: self.dir.display().to_string(),
                            source: io::Error::other("an object writer thread panicked"),
                        })
                    })
                })
                .collect()
        });
        for result in results {
            result?;
        }
        flotilla_fs::sync_dir(&self.dir).map_err(|source| ObjectError::Write {
            path: self.dir.display().to_string(),
            source,
        })?;
        Ok(missing.len())
    }

    fn write_one(&self, digest: &Digest, bytes: &[u8]) -> Result<(), ObjectError> {
        let path = self.path_of(digest);
        // Bundles may hold Secrets: objects are readable by the hub's user only. The
        // folder is synced once for the whole batch by the caller.
        flotilla_fs::replace_file(&path, bytes, Mode::Private).map_err(|source| {
            ObjectError::Write {
                path: path.display().to_string(),
                source,
            }
        })
    }

    /// Deletes an object no bundle refers to any more. A missing object is fine.
    pub fn remove(&self, digest: &Digest) -> io::Result<()> {
        match fs::remove_file(self.path_of(digest)) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }

    /// The digests of every object on disk (temporary files and anything else that is
    /// not named as an object are left out).
    pub fn list(&self) -> io::Result<Vec<Digest>> {
        let mut digests = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Ok(digest) = Digest::parse(&format!("sha256:{name}")) {
                digests.push(digest);
            }
        }
        Ok(digests)
    }

    /// Removes temporary files a crash may have left behind.
    pub fn clean_temporaries(&self) {
        if let Err(err) = flotilla_fs::remove_temporary_files(&self.dir, flotilla_fs::is_temporary)
        {
            tracing::warn!(
                "cannot remove temporary files in {}: {err}",
                self.dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_and_detects_corruption() {
        let dir = tempfile::tempdir().expect("temp dir");
        let objects = Objects::open(dir.path()).expect("open");
        let a = b"[1]".as_slice();
        let digest = Digest::of(a);
        assert_eq!(objects.write_all(&[(&digest, a)]).expect("write"), 1);
        assert_eq!(objects.write_all(&[(&digest, a)]).expect("write"), 0);
        assert_eq!(objects.read(&digest).expect("read"), a);
        fs::write(objects.path_of(&digest), b"[2]").expect("tamper");
        assert!(matches!(
            objects.read(&digest),
            Err(ObjectError::Corrupt { .. })
        ));
    }
}
