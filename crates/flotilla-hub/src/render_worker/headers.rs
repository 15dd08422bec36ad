//! The sealing headers a render keeps in the hub's state folder, for the next
//! render process.
//!
//! Sealing a cluster's Secrets to its agent costs two X25519 operations per agent
//! for the age header all its Secrets share (see `flotilla_render::seal`). A render
//! process works each out once and keeps it; this file keeps them across processes,
//! so a hub that restarts, or whose render process is replaced, does not work out
//! every agent's header again on its next render. The headers are public (every
//! bundle of an agent carries its own), the file is private anyway, and a header
//! read from it is used only when its MAC verifies under the hub's sealing key.

use std::path::{Path, PathBuf};

use flotilla_render::seal::{KEPT_HEADERS_LONGEST_FILE, Sealer, headers_made, offer_headers};

/// The file, in the hub's state folder.
pub const SEALING_HEADERS_FILE: &str = "sealing-headers";

/// The file of one render process (or of the hub's own renders): read once, before
/// the first render; written after each render that worked out a header.
#[derive(Debug)]
pub struct KeptHeaders {
    path: PathBuf,
    offered: bool,
    /// [`headers_made`] when the file was last written or read.
    made: u64,
}

impl KeptHeaders {
    pub fn new(path: impl Into<PathBuf>) -> KeptHeaders {
        KeptHeaders {
            path: path.into(),
            offered: false,
            made: headers_made(),
        }
    }

    /// The file, in the state folder `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> KeptHeaders {
        KeptHeaders::new(state_dir.join(SEALING_HEADERS_FILE))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Offers the file's headers to this process's sealers, the first time only; a
    /// missing file offers nothing. Returns what could not be read.
    pub fn offer(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.offered, true) {
            return Ok(());
        }
        let read = || -> std::io::Result<Vec<u8>> {
            use std::io::Read as _;
            // Looked at before it is opened: opening a FIFO would wait for a writer.
            if !std::fs::metadata(&self.path)?.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            let file = std::fs::File::open(&self.path)?;
            let mut bytes = Vec::new();
            file.take(KEPT_HEADERS_LONGEST_FILE)
                .read_to_end(&mut bytes)?;
            Ok(bytes)
        };
        match read() {
            Ok(bytes) => {
                offer_headers(&bytes);
                Ok(())
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(format!(
                "cannot read the kept sealing headers {}: {err}",
                self.path.display()
            )),
        }
    }

    /// After a render with the hub's `seed` and sealing secret (from its decryption
    /// keys): writes the headers this process holds for that sealing key when it
    /// worked out any since the file was last written.
    pub fn keep(&mut self, seed: &[u8; 32], secret: Option<&[u8; 32]>) -> Result<(), String> {
        let made = headers_made();
        if made == self.made {
            return Ok(());
        }
        let file = Sealer::new(seed, secret).kept_headers();
        flotilla_fs::write_atomically(&self.path, &file, flotilla_fs::Mode::Private).map_err(
            |err| {
                format!(
                    "cannot keep the sealing headers in {}: {err}",
                    self.path.display()
                )
            },
        )?;
        self.made = made;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_render::seal::AgentKey;

    /// What a hub with a decryption key sealed is kept, under the key it sealed with
    /// (the seed and the secret of its decryption identity), not left out.
    #[test]
    fn the_headers_of_a_hub_with_a_decryption_key_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (seed, secret) = ([21; 32], [22; 32]);
        let mut kept = KeptHeaders::new(dir.path().join(SEALING_HEADERS_FILE));
        let agent =
            AgentKey::parse("age1zvkyg2lqzraa2lnjvqej32nkuu0ues2s82hzrye869xeexvn73equnujwj")
                .expect("a recipient");
        Sealer::new(&seed, Some(&secret)).seal(&agent, "v1/Secret/shop/db", b"hunter2");
        kept.keep(&seed, Some(&secret)).expect("written");
        let file = std::fs::read(dir.path().join(SEALING_HEADERS_FILE)).expect("read");
        let without_entries = Sealer::new(&[23; 32], Some(&secret)).kept_headers();
        assert!(
            file.len() > without_entries.len(),
            "{} bytes kept, as many as a file with no header",
            file.len()
        );
    }
}
