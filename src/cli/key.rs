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
    /// Make a signing key: KEY (private, mode 0600) and KEY.pub (one line); prints the
    /// key id. The hub's signing key (`serve`/`publish --signing-key`, agents trust
    /// KEY.pub with `--trust-key`) or the platform's tenant key (`key sign-tenants
    /// --key`, kept apart from the hub; agents take KEY.pub with `--tenant-key`).
    Generate {
        /// Where to write the private key; the public key goes to the same path with
        /// `.pub` added. Existing files are never overwritten.
        #[arg(long, value_name = "KEY")]
        out: PathBuf,
        /// Make an age identity instead (one file, mode 0600, as `age-keygen` writes
        /// it) for `serve --decryption-key`; prints its public key (`age1…`), the
        /// recipient to add to the fleet's `.sops.yaml`.
        #[arg(long)]
        age: bool,
    },
    /// Sign the fleet's tenant rules (its `tenants/*.yaml`) with the platform's key
    /// (from `key generate`, kept apart from the hub's signing key) into
    /// `tenants/rules.signed.json`, for agents started with `--tenant-key KEY.pub`.
    /// Commit the file; sign again after any change to `tenants/`.
    SignTenants {
        /// The platform's private key.
        #[arg(long, value_name = "KEY")]
        key: PathBuf,
        /// The fleet root on disk.
        #[arg(long, value_name = "DIR", default_value = ".")]
        fleet: PathBuf,
        /// A workload (name or glob) of the platform's own; with any, agents refuse a
        /// resource of a workload that is neither the platform's nor a tenant's.
        #[arg(long = "platform-workload", value_name = "NAME")]
        platform_workloads: Vec<String>,
    },
}

pub fn run_key(args: &KeyArgs) -> anyhow::Result<u8> {
    match &args.command {
        KeyCommand::Generate { out, age: false } => generate(out),
        KeyCommand::Generate { out, age: true } => generate_age(out),
        KeyCommand::SignTenants {
            key,
            fleet,
            platform_workloads,
        } => sign_tenants(key, fleet, platform_workloads),
    }
}

fn sign_tenants(key: &Path, fleet: &Path, platform_workloads: &[String]) -> anyhow::Result<u8> {
    refuse_if_shared(key, "--key")?;
    let text = std::fs::read_to_string(key)
        .with_context(|| format!("cannot read --key {}", key.display()))?;
    let key = flotilla_core::signing::SigningKey::parse(&text)
        .map_err(|err| anyhow::anyhow!("--key {}: {err}", key.display()))?;
    let snapshot = flotilla_hub::source::from_folder(fleet, "")
        .map_err(|err| anyhow::anyhow!("cannot read the fleet in {}: {err:?}", fleet.display()))?;
    let mut diagnostics = Vec::new();
    let loaded = flotilla_render::load::load(&snapshot, &mut diagnostics);
    let broken: Vec<String> = diagnostics
        .iter()
        .filter(|d| {
            d.is_error()
                && d.file
                    .as_deref()
                    .is_some_and(|f| f.starts_with("tenants/") && f != "tenants/rules.signed.json")
        })
        .map(ToString::to_string)
        .collect();
    if !broken.is_empty() {
        bail!(
            "the Tenant files have errors; fix them before signing:\n{}",
            broken.join("\n")
        );
    }
    if loaded.tenants.is_empty() {
        bail!(
            "no tenants in {}/tenants/: nothing to sign",
            fleet.display()
        );
    }
    let platform = (!platform_workloads.is_empty()).then(|| platform_workloads.to_vec());
    let rules = flotilla_render::tenancy::rules_of(&loaded.tenants, platform);
    let signed = flotilla_core::bundle::SignedTenantRules {
        sig: key.sign_tenant_rules(&rules.canonical()),
        key_id: key.key_id().to_string(),
        rules,
    };
    let out = fleet.join("tenants/rules.signed.json");
    let mut json = serde_json::to_string_pretty(&signed).context("signed rules as JSON")?;
    json.push('\n');
    std::fs::write(&out, json).with_context(|| format!("cannot write {}", out.display()))?;
    println!(
        "signed the rules of {} tenants with key {} into {}; commit it",
        loaded.tenants.len(),
        key.key_id(),
        out.display()
    );
    Ok(EXIT_OK)
}

fn generate_age(out: &Path) -> anyhow::Result<u8> {
    use age::secrecy::ExposeSecret as _;
    if out.exists() {
        bail!(
            "{} exists; a decryption key is never overwritten (SOPS files are encrypted to it): choose another --out, or remove it first",
            out.display()
        );
    }
    let identity = age::x25519::Identity::generate();
    let recipient = identity.to_public().to_string();
    let created = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let text = format!(
        "# created: {created}\n# public key: {recipient}\n{}\n",
        identity.to_string().expose_secret()
    );
    flotilla_fs::write_atomically(out, text.as_bytes(), Mode::Private)
        .with_context(|| format!("cannot write the age identity {}", out.display()))?;
    eprintln!(
        "wrote the age identity {} (keep it on the hub, mode 0600: serve --decryption-key {}); add its public key to the age recipients of your .sops.yaml",
        out.display(),
        out.display()
    );
    println!("{recipient}");
    Ok(EXIT_OK)
}

/// Reads `--decryption-key` files (age identity files). A file readable by others is
/// refused, as for `--signing-key`.
pub fn read_decryption_keys(
    paths: &[PathBuf],
) -> anyhow::Result<flotilla_render::sops::DecryptionKeys> {
    let mut keys = flotilla_render::sops::DecryptionKeys::default();
    for given in paths {
        // `TENANT=FILE`: that tenant's identities. A file whose name holds `=` is
        // read as a file when no tenant prefix fits (`./a=b.txt`).
        let (tenant, path) = match given.to_str().and_then(|s| s.split_once('=')) {
            Some((tenant, file)) if flotilla_core::names::dns1123_label(tenant).is_ok() => {
                (Some(tenant), Path::new(file))
            }
            _ => (None, given.as_path()),
        };
        refuse_if_shared(path, "--decryption-key")?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --decryption-key {}", path.display()))?;
        let added = match tenant {
            Some(tenant) => keys.add_tenant_identity_file(tenant, &text),
            None => keys.add_identity_file(&text),
        };
        added
            .map_err(|reason| anyhow::anyhow!("--decryption-key {}: {reason}", given.display()))?;
    }
    Ok(keys)
}

/// Refuses a private key file other users can read (as ssh does).
fn refuse_if_shared(path: &Path, flag: &str) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let metadata = std::fs::metadata(path)
            .with_context(|| format!("cannot read {flag} {}", path.display()))?;
        if metadata.permissions().mode() & 0o077 != 0 {
            bail!(
                "{flag} {} can be read by other users (mode {:o}); make it private: chmod 600 {}",
                path.display(),
                metadata.permissions().mode() & 0o777,
                path.display()
            );
        }
    }
    let _ = (path, flag);
    Ok(())
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
        "wrote the private key {} (mode 0600) and the public key {}. As the hub's signing key: keep the private key on the hub (serve/publish --signing-key) and give agents the public one (agent --trust-key). As the platform's tenant key: keep the private key apart from the hub (key sign-tenants --key) and give agents the public one (agent --tenant-key)",
        out.display(),
        public_out.display()
    );
    println!("{}", key.key_id());
    Ok(EXIT_OK)
}

/// Reads `--signing-key`: the private key file `flotilla key generate` wrote. A key
/// readable by others is refused, as ssh refuses one.
pub fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    refuse_if_shared(path, "--signing-key")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --signing-key {}", path.display()))?;
    SigningKey::parse(&text).with_context(|| format!("--signing-key {}", path.display()))
}
