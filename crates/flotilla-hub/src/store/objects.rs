//! Content-addressed objects: `sha256/<hex>` holds the canonical resource bytes whose
//! digest is `sha256:<hex>`, in one of three places ([`ObjectsUrl`]):
//!
//! - the state dir (`<state dir>/objects/sha256/<hex>`, the default);
//! - a folder several hubs share (`file:///path` → `/path/sha256/<hex>`);
//! - S3 or an S3-compatible store (`s3://bucket/prefix` → `prefix/sha256/<hex>`),
//!   through the `object_store` crate, with the standard AWS environment variables.
//!
//! On disk every object is written to a temporary file, fsynced and renamed into
//! place, and the folder is fsynced once after a batch, so a crash leaves either the
//! whole object or none. Batches are written by several threads at once because the
//! file system commits concurrent fsyncs together (1,000 objects take about a quarter
//! of a second here instead of three and a half). In S3 a PUT is atomic by itself.
//!
//! Objects are named by their content, so several hubs may write the same object at
//! once: every write of a name writes the same bytes.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use object_store::{ObjectStore, ObjectStoreExt as _};

use flotilla_fs::Mode;

use flotilla_core::bundle::Digest;

/// How many threads write a batch of objects to disk, and how many requests a batch
/// keeps in flight to S3.
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
    #[error("cannot {what} {path}: {source}")]
    Remote {
        what: &'static str,
        path: String,
        source: Box<object_store::Error>,
    },
    #[error("{0}")]
    Open(String),
}

impl ObjectError {
    /// The object is not there (never written, or deleted once unused).
    pub fn is_not_found(&self) -> bool {
        match self {
            ObjectError::Read { source, .. } => source.kind() == io::ErrorKind::NotFound,
            ObjectError::Remote { source, .. } => {
                matches!(**source, object_store::Error::NotFound { .. })
            }
            _ => false,
        }
    }
}

/// Where the hub keeps its objects (`--objects URL`). URLs never carry secrets: S3
/// credentials come from the environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ObjectsUrl {
    /// `<state dir>/objects` (the default).
    #[default]
    StateDir,
    /// `file:///path`: a folder (several hubs may share it, on a shared file system).
    Dir(PathBuf),
    /// `s3://bucket/prefix`.
    S3(S3Location),
}

/// A bucket and a prefix in it, and settings that override the AWS environment
/// variables (none from a URL: tests set the endpoint and credentials here).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    pub prefix: String,
    /// `object_store` S3 configuration keys and values (`aws_endpoint`,
    /// `aws_access_key_id`, …), applied over the environment.
    pub settings: Vec<(String, String)>,
}

impl std::fmt::Debug for S3Location {
    // The settings may hold a secret key: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Location")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field(
                "settings",
                &self.settings.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Server-side encryption asked of S3 for every object written (`--s3-sse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Sse {
    /// No encryption header, whatever the environment says: for S3-compatible stores
    /// that refuse the header (AWS encrypts every object with its own keys anyway).
    None,
    /// `x-amz-server-side-encryption: AES256` (SSE-S3, keys the store manages).
    Aes256,
    /// `aws:kms` with this KMS key (SSE-KMS): reading needs access to the key too.
    Kms(String),
}

/// The setting [`S3Location::with_sse`] records the choice in, read by
/// [`Bucket::from_env`]: not an `object_store` key.
const SSE_SETTING: &str = "flotilla_sse";

impl FromStr for S3Sse {
    type Err = String;

    fn from_str(text: &str) -> Result<S3Sse, String> {
        match text {
            "none" => Ok(S3Sse::None),
            "aes256" | "AES256" => Ok(S3Sse::Aes256),
            _ => match text.strip_prefix("kms:") {
                Some(key) if !key.is_empty() => Ok(S3Sse::Kms(key.to_string())),
                _ => Err(format!(
                    "{text:?} is not a server-side encryption: give none, aes256 or kms:KEY (a KMS key id or ARN)"
                )),
            },
        }
    }
}

impl std::fmt::Display for S3Sse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            S3Sse::None => f.write_str("none"),
            S3Sse::Aes256 => f.write_str("aes256"),
            S3Sse::Kms(key) => write!(f, "kms:{key}"),
        }
    }
}

/// Whether an `object_store` setting is about server-side encryption.
fn is_encryption_setting(key: &str) -> bool {
    key.contains("server_side_encryption") || key.contains("sse_")
}

impl S3Location {
    /// Asks for `sse` on every object written, in place of any encryption the
    /// environment's `AWS_SERVER_SIDE_ENCRYPTION`, `AWS_SSE_KMS_KEY_ID`, ... set.
    pub fn with_sse(mut self, sse: &S3Sse) -> S3Location {
        self.settings
            .retain(|(key, _)| key != SSE_SETTING && !is_encryption_setting(key));
        self.settings
            .push((SSE_SETTING.to_string(), sse.to_string()));
        self
    }

    /// The encryption [`S3Location::with_sse`] chose, if it was called.
    fn sse(&self) -> Result<Option<S3Sse>, ObjectError> {
        self.settings
            .iter()
            .find(|(key, _)| key == SSE_SETTING)
            .map(|(_, value)| value.parse().map_err(ObjectError::Open))
            .transpose()
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

impl FromStr for ObjectsUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<ObjectsUrl, String> {
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "objects URL {url:?}: a file URL names an absolute folder, file:///path/to/objects"
                ));
            }
            return Ok(ObjectsUrl::Dir(PathBuf::from(path)));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if authority.contains('@') {
                // Never echo what stands before '@': it may be a secret.
                return Err(
                    "an s3:// objects URL carries no credentials: give them in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                        .to_string(),
                );
            }
            if authority.is_empty()
                || !authority
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return Err(format!(
                    "objects URL {url:?}: s3://BUCKET/PREFIX needs a bucket name (lowercase letters, digits, '-' and '.')"
                ));
            }
            let prefix = prefix.trim_matches('/').to_string();
            if prefix.contains("//") || prefix.split('/').any(|s| s == "." || s == "..") {
                return Err(format!(
                    "objects URL {url:?}: the prefix may not hold empty, '.' or '..' segments"
                ));
            }
            return Ok(ObjectsUrl::S3(S3Location {
                bucket: authority.to_string(),
                prefix,
                settings: Vec::new(),
            }));
        }
        let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
        Err(format!(
            "objects URL scheme {scheme:?} is not known: give file:///path (a folder) or s3://bucket/prefix"
        ))
    }
}

impl ObjectsUrl {
    /// Where the objects are, for messages.
    pub fn display(&self, state_dir: &Path) -> String {
        match self {
            ObjectsUrl::StateDir => state_dir.join("objects").display().to_string(),
            ObjectsUrl::Dir(path) => format!("file://{}", path.display()),
            ObjectsUrl::S3(location) => location.url(),
        }
    }

    /// Whether several hubs may share these objects (anything but the state dir).
    pub fn is_shared(&self) -> bool {
        !matches!(self, ObjectsUrl::StateDir)
    }
}

/// An S3 bucket (or a prefix in one), reached through `object_store`.
#[derive(Debug, Clone)]
pub struct Bucket {
    pub store: Arc<dyn ObjectStore>,
    /// The prefix every key starts with ("" for the bucket's root).
    pub prefix: String,
    /// `s3://bucket/prefix`, for messages.
    pub url: String,
    /// Whether an access key was given (else the instance's credentials are asked).
    access_key: bool,
    /// The server-side encryption chosen with `--s3-sse`, checked by [`Bucket::probe`].
    sse: Option<S3Sse>,
}

impl Bucket {
    /// A client for `s3://bucket/prefix`: region, endpoint (`AWS_ENDPOINT_URL`, with
    /// `AWS_ALLOW_HTTP=true` for a plain-HTTP one) and credentials from the standard
    /// AWS environment variables. Makes no request.
    pub fn from_env(location: &S3Location) -> Result<Bucket, ObjectError> {
        let url = location.url();
        let sse = location.sse()?;
        // Client options first: setting them replaces every client option, the
        // environment's AWS_ALLOW_HTTP included.
        let mut builder = object_store::aws::AmazonS3Builder::new()
            .with_retry(object_store::RetryConfig {
                max_retries: 3,
                retry_timeout: Duration::from_secs(20),
                ..object_store::RetryConfig::default()
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60)),
            );
        // The standard AWS environment variables, as `AmazonS3Builder::from_env`
        // reads them, then the location's own settings over them.
        let environment = std::env::vars_os().filter_map(|(key, value)| {
            let key = key.to_str()?.to_ascii_lowercase();
            key.starts_with("aws_")
                .then(|| Some((key, value.to_str()?.to_string())))
                .flatten()
        });
        for (key, value) in environment {
            // A chosen encryption replaces the environment's.
            if sse.is_some() && is_encryption_setting(&key) {
                continue;
            }
            if let Ok(key) = key.parse() {
                builder = builder.with_config(key, value);
            }
        }
        for (key, value) in location
            .settings
            .iter()
            .filter(|(key, _)| key != SSE_SETTING)
        {
            let key = key.parse().map_err(|_| {
                ObjectError::Open(format!("{key} is not an S3 setting (for {url})"))
            })?;
            builder = builder.with_config(key, value);
        }
        match &sse {
            None | Some(S3Sse::None) => {}
            Some(S3Sse::Aes256) => {
                if let Ok(key) = "aws_server_side_encryption".parse() {
                    builder = builder.with_config(key, "AES256");
                }
            }
            Some(S3Sse::Kms(key)) => builder = builder.with_sse_kms_encryption(key),
        }
        let store = builder
            .with_bucket_name(&location.bucket)
            .build()
            .map_err(|err| {
                ObjectError::Open(format!(
                    "cannot use the object store {url}: {err}; set AWS_REGION, and AWS_ENDPOINT_URL for an S3-compatible server"
                ))
            })?;
        let access_key = std::env::var_os("AWS_ACCESS_KEY_ID").is_some()
            || location
                .settings
                .iter()
                .any(|(key, _)| key == "aws_access_key_id" || key == "access_key_id");
        Ok(Bucket {
            store: Arc::new(store),
            prefix: location.prefix.clone(),
            url,
            access_key,
            sse,
        })
    }

    /// The key of `relative` under the prefix.
    pub fn key(&self, relative: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(relative)
        } else {
            object_store::path::Path::from(format!("{}/{relative}", self.prefix))
        }
    }

    /// The URL of `relative`, for messages.
    pub fn url_of(&self, relative: &str) -> String {
        format!("{}/{relative}", self.url)
    }

    /// One request that needs the bucket to exist and the credentials to be good: a
    /// listing of the prefix's first level (a HEAD cannot tell a missing bucket from
    /// a missing key). With `--s3-sse` aes256 or kms, also a small object written
    /// with that encryption and removed, so a store that refuses the header (or a
    /// KMS key that cannot be used) stops the start, not the first render.
    pub async fn probe(&self) -> Result<(), ObjectError> {
        let prefix =
            (!self.prefix.is_empty()).then(|| object_store::path::Path::from(self.prefix.as_str()));
        if let Err(err) = self.store.list_with_delimiter(prefix.as_ref()).await {
            let credentials = if self.access_key {
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            } else {
                "no AWS_ACCESS_KEY_ID is set, so the instance's credentials were asked for"
            };
            return Err(ObjectError::Open(format!(
                "cannot reach the object store {}: {err}; check the bucket, AWS_REGION, AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for http://) and the credentials ({credentials})",
                self.url
            )));
        }
        match &self.sse {
            Some(sse @ (S3Sse::Aes256 | S3Sse::Kms(_))) => self.probe_sse(sse).await,
            _ => Ok(()),
        }
    }

    /// Writes and removes `.flotilla-sse-probe` under the prefix with `sse`.
    async fn probe_sse(&self, sse: &S3Sse) -> Result<(), ObjectError> {
        let key = self.key(".flotilla-sse-probe");
        let refused = |err: object_store::Error| {
            ObjectError::Open(format!(
                "the object store {} refused an object written with server-side encryption {sse} (--s3-sse): {err}; \
                 give --s3-sse none for a store that does not support it, or check the KMS key and the permission to use it",
                self.url
            ))
        };
        self.store
            .put(&key, bytes::Bytes::from_static(b"flotilla").into())
            .await
            .map_err(refused)?;
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(refused(err)),
        }
    }
}

#[derive(Debug, Clone)]
enum Backend {
    /// A folder holding `<hex>` files.
    Dir(PathBuf),
    /// `<prefix>/sha256/<hex>` in a bucket.
    S3(Bucket),
}

#[derive(Debug, Clone)]
pub struct Objects {
    backend: Backend,
    /// Whether other hubs may write here too (`file://`, `s3://`).
    shared: bool,
    /// Requests made to a remote store (`flotilla_object_store_requests`).
    requests: prometheus_client::metrics::counter::Counter,
    /// The objects of the last render written to (or found in) a remote store, kept
    /// so that the first answer of each new digest does not read back what the hub
    /// wrote a moment ago; at most [`RECENT_BYTES`], until the next render.
    recent: Arc<std::sync::Mutex<Recent>>,
}

/// How many bytes of a render's new objects a hub with a remote store keeps after
/// writing them (their served clusters keep them anyway once asked for).
pub const RECENT_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug, Default)]
struct Recent {
    objects: std::collections::HashMap<Digest, bytes::Bytes>,
    bytes: usize,
}

impl Objects {
    /// Opens (and creates, readable by the hub's user only) `<root>/objects/sha256`.
    pub fn open(root: &Path) -> io::Result<Objects> {
        Objects::open_dir(&root.join("objects"))
    }

    /// Opens (and creates, readable by the hub's user only) `<dir>/sha256`.
    fn open_dir(dir: &Path) -> io::Result<Objects> {
        let dir = dir.join("sha256");
        flotilla_fs::create_dir(&dir, Mode::Private)?;
        Ok(Objects {
            backend: Backend::Dir(dir),
            shared: false,
            requests: Default::default(),
            recent: Default::default(),
        })
    }

    /// Opens the objects `url` names (`root` is the state dir); an S3 store is asked
    /// once, so a wrong bucket, endpoint or credentials fail here, not at the first
    /// render.
    pub async fn open_url(root: &Path, url: &ObjectsUrl) -> Result<Objects, ObjectError> {
        let shown = url.display(root);
        let opened = match url {
            ObjectsUrl::StateDir => Objects::open(root),
            ObjectsUrl::Dir(path) => Objects::open_dir(path).map(|objects| Objects {
                shared: true,
                ..objects
            }),
            ObjectsUrl::S3(location) => {
                let bucket = Bucket::from_env(location)?;
                bucket.probe().await?;
                return Ok(Objects {
                    backend: Backend::S3(bucket),
                    shared: true,
                    requests: Default::default(),
                    recent: Default::default(),
                });
            }
        };
        opened
            .map_err(|err| ObjectError::Open(format!("cannot open the objects in {shown}: {err}")))
    }

    /// Objects under `dir` (`<root>/objects/sha256`) without creating anything.
    pub fn unopened(dir: &Path) -> Objects {
        Objects {
            backend: Backend::Dir(dir.to_path_buf()),
            shared: false,
            requests: Default::default(),
            recent: Default::default(),
        }
    }

    /// The count of requests made to a remote store (none for a folder), shared by
    /// every clone of these objects.
    pub fn requests(&self) -> prometheus_client::metrics::counter::Counter {
        self.requests.clone()
    }

    /// Whether the objects are files on this machine (reading one is cheap: the page
    /// cache) rather than in a remote store (every read a request).
    pub fn is_local(&self) -> bool {
        matches!(self.backend, Backend::Dir(_))
    }

    /// An object of the last render this hub wrote to a remote store, if it kept it.
    pub fn recent(&self, digest: &Digest) -> Option<bytes::Bytes> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.objects.get(digest).cloned()
    }

    /// Forgets the objects kept from the last render (a new one is being written).
    pub fn forget_recent(&self) {
        *self.recent.lock().unwrap_or_else(|e| e.into_inner()) = Recent::default();
    }

    /// Where an object is, for messages (a path or an s3:// URL).
    pub fn location_of(&self, digest: &Digest) -> String {
        match &self.backend {
            Backend::Dir(dir) => dir.join(digest.hex()).display().to_string(),
            Backend::S3(bucket) => bucket.url_of(&format!("sha256/{}", digest.hex())),
        }
    }

    /// The file of an object kept on disk (none in a remote store).
    pub fn path_of(&self, digest: &Digest) -> Option<PathBuf> {
        match &self.backend {
            Backend::Dir(dir) => Some(dir.join(digest.hex())),
            Backend::S3(_) => None,
        }
    }

    fn key_of(bucket: &Bucket, digest: &Digest) -> object_store::path::Path {
        bucket.key(&format!("sha256/{}", digest.hex()))
    }

    fn remote(
        &self,
        what: &'static str,
        digest: &Digest,
        source: object_store::Error,
    ) -> ObjectError {
        ObjectError::Remote {
            what,
            path: self.location_of(digest),
            source: Box::new(source),
        }
    }

    /// Whether the object is there (one HEAD request in a remote store; an error
    /// counts as absent, so the caller writes it again).
    pub async fn contains(&self, digest: &Digest) -> bool {
        match &self.backend {
            Backend::Dir(dir) => dir.join(digest.hex()).is_file(),
            Backend::S3(bucket) => {
                self.requests.inc();
                bucket
                    .store
                    .head(&Objects::key_of(bucket, digest))
                    .await
                    .is_ok()
            }
        }
    }

    /// Whether the object is known to be missing without asking a remote store: on
    /// disk, whether its file is absent; in S3, never (no request is made).
    pub fn known_missing(&self, digest: &Digest) -> bool {
        match &self.backend {
            Backend::Dir(dir) => !dir.join(digest.hex()).is_file(),
            Backend::S3(_) => false,
        }
    }

    /// [`Objects::read`] for a blocking thread (one of `spawn_blocking`'s): from disk
    /// at once, from S3 through the runtime the thread belongs to, unless the last
    /// render kept the object (then it is shared, not copied).
    pub fn read_blocking(&self, digest: &Digest) -> Result<bytes::Bytes, ObjectError> {
        match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(digest.hex());
                let bytes = fs::read(&path).map_err(|source| ObjectError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                self.checked(digest, bytes).map(bytes::Bytes::from)
            }
            Backend::S3(_) => {
                if let Some(bytes) = self.recent(digest) {
                    return Ok(bytes);
                }
                let handle =
                    tokio::runtime::Handle::try_current().map_err(|err| ObjectError::Read {
                        path: self.location_of(digest),
                        source: io::Error::other(err.to_string()),
                    })?;
                handle.block_on(self.read(digest)).map(bytes::Bytes::from)
            }
        }
    }

    fn checked(&self, digest: &Digest, bytes: Vec<u8>) -> Result<Vec<u8>, ObjectError> {
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(ObjectError::Corrupt {
                path: self.location_of(digest),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Reads an object and checks that its content still has its digest.
    pub async fn read(&self, digest: &Digest) -> Result<Vec<u8>, ObjectError> {
        let bytes = match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(digest.hex());
                let read = path.clone();
                tokio::task::spawn_blocking(move || fs::read(read))
                    .await
                    .map_err(|err| io::Error::other(err.to_string()))
                    .and_then(|read| read)
                    .map_err(|source| ObjectError::Read {
                        path: path.display().to_string(),
                        source,
                    })?
            }
            Backend::S3(bucket) => {
                let key = Objects::key_of(bucket, digest);
                self.requests.inc();
                let got = match bucket.store.get(&key).await {
                    Ok(got) => got.bytes().await,
                    Err(err) => Err(err),
                };
                got.map_err(|err| self.remote("read object", digest, err))?
                    .to_vec()
            }
        };
        self.checked(digest, bytes)
    }

    /// Writes every object that is not there yet (durably, on disk), and returns how
    /// many it wrote. Objects already present are left alone: same name, same content.
    pub async fn write_all(&self, objects: Vec<(Digest, Vec<u8>)>) -> Result<usize, ObjectError> {
        match &self.backend {
            Backend::Dir(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || write_all_to_dir(&dir, &objects))
                    .await
                    .map_err(|err| ObjectError::Write {
                        path: "the objects folder".to_string(),
                        source: io::Error::other(err.to_string()),
                    })?
            }
            Backend::S3(bucket) => {
                let objects: Vec<(Digest, bytes::Bytes)> = objects
                    .into_iter()
                    .map(|(digest, bytes)| (digest, bytes::Bytes::from(bytes)))
                    .collect();
                {
                    let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
                    for (digest, bytes) in &objects {
                        if recent.bytes + bytes.len() <= RECENT_BYTES
                            && !recent.objects.contains_key(digest)
                        {
                            recent.bytes += bytes.len();
                            recent.objects.insert(digest.clone(), bytes.clone());
                        }
                    }
                }
                let written = futures::stream::iter(objects)
                    .map(|(digest, bytes)| async move {
                        let key = Objects::key_of(bucket, &digest);
                        self.requests.inc();
                        if bucket.store.head(&key).await.is_ok() {
                            return Ok(0);
                        }
                        self.requests.inc();
                        bucket
                            .store
                            .put(&key, bytes.into())
                            .await
                            .map(|_| 1)
                            .map_err(|err| self.remote("write object", &digest, err))
                    })
                    .buffer_unordered(WRITERS)
                    .try_fold(0, |sum, one| async move { Ok(sum + one) })
                    .await?;
                Ok(written)
            }
        }
    }

    /// Deletes an object no bundle refers to any more. A missing object is fine.
    pub async fn remove(&self, digest: &Digest) -> Result<(), ObjectError> {
        match &self.backend {
            Backend::Dir(dir) => match fs::remove_file(dir.join(digest.hex())) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => Err(ObjectError::Write {
                    path: self.location_of(digest),
                    source: err,
                }),
                _ => Ok(()),
            },
            Backend::S3(bucket) => {
                self.requests.inc();
                match bucket.store.delete(&Objects::key_of(bucket, digest)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(err) => Err(self.remote("delete object", digest, err)),
                }
            }
        }
    }

    /// The digests of every object there (temporary files and anything else that is
    /// not named as an object are left out).
    pub async fn list(&self) -> Result<Vec<Digest>, ObjectError> {
        fn named(name: &str) -> Option<Digest> {
            Digest::parse(&format!("sha256:{name}")).ok()
        }
        match &self.backend {
            Backend::Dir(dir) => {
                let error = |source| ObjectError::Read {
                    path: dir.display().to_string(),
                    source,
                };
                let mut digests = Vec::new();
                for entry in fs::read_dir(dir).map_err(error)? {
                    let name = entry.map_err(error)?.file_name();
                    if let Some(digest) = name.to_str().and_then(named) {
                        digests.push(digest);
                    }
                }
                Ok(digests)
            }
            Backend::S3(bucket) => {
                let prefix = bucket.key("sha256");
                // One request per page of 1,000 keys; counted as one.
                self.requests.inc();
                let listed: Vec<object_store::ObjectMeta> = bucket
                    .store
                    .list(Some(&prefix))
                    .try_collect()
                    .await
                    .map_err(|source| ObjectError::Remote {
                        what: "list",
                        path: bucket.url_of("sha256/"),
                        source: Box::new(source),
                    })?;
                Ok(listed
                    .iter()
                    .filter_map(|meta| meta.location.filename().and_then(named))
                    .collect())
            }
        }
    }

    /// Removes temporary files a crash may have left behind (on disk; S3 has none). In
    /// a folder other hubs share, only those older than an hour: a younger one may be
    /// another hub's write under way.
    pub fn clean_temporaries(&self) {
        let Backend::Dir(dir) = &self.backend else {
            return;
        };
        let shared = self.shared;
        let old = |name: &str| {
            let aged = || {
                let modified = fs::metadata(dir.join(name)).ok()?.modified().ok()?;
                Some(modified.elapsed().ok()? > Duration::from_secs(3600))
            };
            flotilla_fs::is_temporary(name) && (!shared || aged().unwrap_or(false))
        };
        if let Err(err) = flotilla_fs::remove_temporary_files(dir, old) {
            tracing::warn!("cannot remove temporary files in {}: {err}", dir.display());
        }
    }
}

fn write_all_to_dir(dir: &Path, objects: &[(Digest, Vec<u8>)]) -> Result<usize, ObjectError> {
    let missing: Vec<&(Digest, Vec<u8>)> = objects
        .iter()
        .filter(|(digest, _)| !dir.join(digest.hex()).is_file())
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
                        write_one(dir, digest, bytes)?;
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
                        path: dir.display().to_string(),
                        source: io::Error::other("an object writer thread panicked"),
                    })
                })
            })
            .collect()
    });
    for result in results {
        result?;
    }
    flotilla_fs::sync_dir(dir).map_err(|source| ObjectError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(missing.len())
}

fn write_one(dir: &Path, digest: &Digest, bytes: &[u8]) -> Result<(), ObjectError> {
    let path = dir.join(digest.hex());
    // Bundles may hold Secrets: objects are readable by the hub's user only. The
    // folder is synced once for the whole batch by the caller.
    flotilla_fs::replace_file(&path, bytes, Mode::Private).map_err(|source| ObjectError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every kind of object store must do: write once, read back, list, notice
    /// corruption, delete (twice is fine).
    async fn check(objects: Objects) {
        let a = b"[1]".to_vec();
        let digest = Digest::of(&a);
        assert!(!objects.contains(&digest).await);
        let write = vec![(digest.clone(), a.clone())];
        assert_eq!(objects.write_all(write.clone()).await.expect("write"), 1);
        assert_eq!(
            objects.write_all(write).await.expect("write"),
            0,
            "written once"
        );
        assert!(objects.contains(&digest).await);
        assert_eq!(objects.read(&digest).await.expect("read"), a);
        let read = objects.clone();
        let blocking = digest.clone();
        let again = tokio::task::spawn_blocking(move || read.read_blocking(&blocking))
            .await
            .expect("joins")
            .expect("reads on a blocking thread");
        assert_eq!(again, a);
        assert_eq!(objects.list().await.expect("list"), vec![digest.clone()]);

        // Bytes stored under a name they do not hash to are refused on reading.
        let other = Digest::of(b"[2]");
        objects
            .write_all(vec![(other.clone(), a.clone())])
            .await
            .expect("write");
        assert!(matches!(
            objects.read(&other).await,
            Err(ObjectError::Corrupt { .. })
        ));

        objects.remove(&digest).await.expect("remove");
        objects
            .remove(&digest)
            .await
            .expect("a missing object is fine");
        objects.remove(&other).await.expect("remove");
        assert!(!objects.contains(&digest).await);
        assert!(objects.list().await.expect("list").is_empty());
        assert!(matches!(
            objects.read(&digest).await,
            Err(ObjectError::Read { .. } | ObjectError::Remote { .. })
        ));
    }

    #[tokio::test]
    async fn objects_in_the_state_dir() {
        let dir = tempfile::tempdir().expect("temp dir");
        let objects = Objects::open_url(dir.path(), &ObjectsUrl::StateDir)
            .await
            .expect("open");
        assert_eq!(
            objects.location_of(&Digest::of(b"x")),
            dir.path()
                .join("objects/sha256")
                .join(Digest::of(b"x").hex())
                .display()
                .to_string()
        );
        check(objects).await;
    }

    #[tokio::test]
    async fn objects_in_a_shared_folder() {
        let dir = tempfile::tempdir().expect("temp dir");
        let shared = dir.path().join("shared");
        let url: ObjectsUrl = format!("file://{}", shared.display()).parse().expect("url");
        let objects = Objects::open_url(&dir.path().join("state"), &url)
            .await
            .expect("open");
        assert!(shared.join("sha256").is_dir());
        check(objects).await;
    }

    #[tokio::test]
    async fn objects_in_s3() {
        let Some(bucket) = flotilla_testkit::s3_bucket("store::objects::objects_in_s3") else {
            return;
        };
        let url = ObjectsUrl::S3(S3Location {
            bucket: bucket.bucket.clone(),
            prefix: "hub/objects".into(),
            settings: bucket.settings(),
        });
        let objects = Objects::open_url(Path::new("/nonexistent"), &url)
            .await
            .expect("open");
        let digest = Digest::of(b"[7]");
        objects
            .write_all(vec![(digest.clone(), b"[7]".to_vec())])
            .await
            .expect("write");
        // The layout: prefix/sha256/<hex>, readable through the S3 API.
        assert_eq!(
            bucket.keys("hub/"),
            vec![format!("hub/objects/sha256/{}", digest.hex())]
        );
        // The hub keeps what its last render wrote, so the first answer of a new
        // digest does not read it back; until the next render.
        let asked = objects.requests().get();
        assert_eq!(objects.recent(&digest).as_deref(), Some(&b"[7]"[..]));
        let other = Digest::of(b"[8]");
        objects
            .write_all(vec![(other.clone(), b"[8]".to_vec())])
            .await
            .expect("write");
        assert_eq!(objects.recent(&other).as_deref(), Some(&b"[8]"[..]));
        assert_eq!(
            objects.requests().get(),
            asked + 2,
            "a HEAD and a PUT, no GET"
        );
        objects.forget_recent();
        assert_eq!(objects.recent(&digest), None);
        assert_eq!(objects.read(&other).await.expect("read"), b"[8]");
        objects.remove(&other).await.expect("remove");
        objects.remove(&digest).await.expect("remove");
        check(objects).await;
    }

    #[tokio::test]
    async fn a_missing_bucket_is_named_at_open_without_secrets() {
        let Some(bucket) =
            flotilla_testkit::s3_bucket("store::objects::a_missing_bucket_is_named_at_open")
        else {
            return;
        };
        let url = ObjectsUrl::S3(S3Location {
            bucket: "no-such-bucket-here".into(),
            prefix: "p".into(),
            settings: bucket.settings(),
        });
        let err = Objects::open_url(Path::new("/nonexistent"), &url)
            .await
            .expect_err("no such bucket");
        let message = err.to_string();
        assert!(message.contains("s3://no-such-bucket-here/p"), "{message}");
        assert!(!message.contains("flotilla-test-secret"), "{message}");
    }

    #[test]
    fn objects_urls_are_read_and_bad_ones_refused() {
        let state = Path::new("/var/lib/flotilla");
        for (url, shown) in [
            ("file:///srv/objects", "file:///srv/objects"),
            ("s3://bucket", "s3://bucket"),
            ("s3://my-bucket/a/b/", "s3://my-bucket/a/b"),
        ] {
            let parsed: ObjectsUrl = url.parse().expect(url);
            assert_eq!(parsed.display(state), shown);
            assert!(parsed.is_shared());
        }
        assert_eq!(
            ObjectsUrl::StateDir.display(state),
            "/var/lib/flotilla/objects"
        );
        for (url, says) in [
            ("file://relative/path", "absolute"),
            ("s3://", "bucket name"),
            ("s3://Bucket_Upper/x", "bucket name"),
            ("s3://bucket/a//b", "segments"),
            ("s3://bucket/../x", "segments"),
            ("gs://bucket", "not known"),
            ("/just/a/path", "not known"),
        ] {
            let err = url.parse::<ObjectsUrl>().expect_err(url);
            assert!(err.contains(says), "{url}: {err}");
        }
        let err = "s3://AKIA:hunter2@bucket/x"
            .parse::<ObjectsUrl>()
            .expect_err("credentials");
        assert!(
            !err.contains("hunter2") && err.contains("AWS_ACCESS_KEY_ID"),
            "{err}"
        );
    }
}
