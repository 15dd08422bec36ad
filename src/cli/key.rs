//! `flotilla key generate`: the ed25519 key pair the hub and `publish` sign bundles
//! with, and agents trust (docs/security.md, "Signed bundles").

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use flotilla_core::signing::SigningKey;
use flotilla_fs::Mode;
use rand::TryRngCore as _;

use super::EXIT_OK;

#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Make a signing key: KEY (private, mode 0600, for `serve`/`publish
    /// --signing-key`) and KEY.pub (one line, for `agent --trust-key`); prints the key id.
    Generate {
        /// Where to write the private key; the public key goes to the same path with
        /// `.pub` added. Existing files are never overwritten.
        #[arg(long, value_name = "KEY")]
        out: PathBuf,
    },
}

pub fn run_key(args: &KeyArgs) -> anyhow::Result<u8> {
    match &args.command {
        KeyCommand::Generate { out } => generate(out),
    }
}

fn public_path(private: &Path) -> PathBuf {
    let mut name = private.as_os_str().to_owned();
    name.push(".pub");
    PathBuf::from(name)
}

fn generate(out: &Path) -> anyhow::Result<u8> {
    let public_out = public_path(out);
    for path in [out, public_out.as_path()] {
        if path.exists() {
            bail!(
                "{} exists; a signing key is never overwritten (agents may trust it): choose another --out, or remove it first",
                path.display()
            );
        }
    }
    let mut seed = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .context("cannot draw random bytes from the operating system")?;
    let key = SigningKey::from_seed(seed);
    flotilla_fs::write_atomically(out, key.to_file_text().as_bytes(), Mode::Private)
        .with_context(|| format!("cannot write the private key {}", out.display()))?;
    flotilla_fs::write_atomically(
        &public_out,
        key.public_key().to_file_text().as_bytes(),
        Mode::Public,
    )
    .with_context(|| format!("cannot write the public key {}", public_out.display()))?;
    eprintln!(
        "wrote the private key {} (keep it on the hub, mode 0600) and the public key {} (give it to agents: --trust-key)",
        out.display(),
        public_out.display()
    );
    println!("{}", key.key_id());
    Ok(EXIT_OK)
}

/// Reads `--signing-key`: the private key file `flotilla key generate` wrote. A key
/// readable by others is refused, as ssh refuses one.
pub fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let metadata = std::fs::metadata(path)
            .with_context(|| format!("cannot read --signing-key {}", path.display()))?;
        if metadata.permissions().mode() & 0o077 != 0 {
            bail!(
                "--signing-key {} can be read by other users (mode {:o}); make it private: chmod 600 {}",
                path.display(),
                metadata.permissions().mode() & 0o777,
                path.display()
            );
        }
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --signing-key {}", path.display()))?;
    SigningKey::parse(&text).with_context(|| format!("--signing-key {}", path.display()))
}
