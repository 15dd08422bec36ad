//! `flotilla publish`: the bundles of one render laid out as static files under the
//! API's own paths, so any static web server, an object store or a `file://` reader
//! can stand in for the hub (without token checks: a static server cannot check them).
//!
//! ```text
//! OUT/v1/clusters/<cluster>/bundle               the current Bundle document
//! OUT/v1/clusters/<cluster>/bundles/<digest>     the same document, by digest
//! ```

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::store::objects::sync_dir;
use flotilla_render::RenderOutput;

#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct PublishError {
    pub path: String,
    pub source: io::Error,
}

/// What one publish wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub clusters: usize,
    pub written: usize,
    pub unchanged: usize,
    pub removed: Vec<String>,
}

/// Writes every bundle of a clean render under `out`. Files are replaced atomically
/// (temporary file, fsync, rename), so a web server never serves half a bundle.
/// Earlier `bundles/<digest>` files stay, which gives mirrors a history; clusters that
/// left the fleet are removed.
pub fn publish(output: &RenderOutput, out: &Path) -> Result<Published, PublishError> {
    let clusters_dir = out.join("v1").join("clusters");
    create_dir(&clusters_dir)?;
    let mut published = Published {
        clusters: output.bundles.len(),
        ..Published::default()
    };
    for (name, bundle) in &output.bundles {
        let dir = clusters_dir.join(name);
        let by_digest = dir.join("bundles");
        create_dir(&by_digest)?;
        let document = bundle.document(&output.revision);
        let digest_file = by_digest.join(bundle.digest.as_str());
        // A digest file's content is fixed by its digest, except for the revision in it:
        // the first one written stays, as on the hub.
        let digest_document = match fs::read(&digest_file) {
            Ok(existing) => existing,
            Err(_) => {
                write_atomically(&digest_file, &document)?;
                sync(&by_digest)?;
                document
            }
        };
        let current = dir.join("bundle");
        if fs::read(&current).is_ok_and(|existing| existing == digest_document) {
            published.unchanged += 1;
        } else {
            write_atomically(&current, &digest_document)?;
            sync(&dir)?;
            published.written += 1;
        }
    }
    let keep: BTreeSet<&str> = output.bundles.keys().map(String::as_str).collect();
    let entries = fs::read_dir(&clusters_dir).map_err(|source| error(&clusters_dir, source))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !keep.contains(name.as_str()) && entry.path().join("bundle").is_file() {
            fs::remove_dir_all(entry.path()).map_err(|source| error(&entry.path(), source))?;
            published.removed.push(name);
        }
    }
    sync(&clusters_dir)?;
    Ok(published)
}

fn error(path: &Path, source: io::Error) -> PublishError {
    PublishError {
        path: path.display().to_string(),
        source,
    }
}

fn create_dir(path: &Path) -> Result<(), PublishError> {
    fs::create_dir_all(path).map_err(|source| error(path, source))
}

fn sync(dir: &Path) -> Result<(), PublishError> {
    sync_dir(dir).map_err(|source| error(dir, source))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp: PathBuf = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result.map_err(|source| error(path, source))
}
