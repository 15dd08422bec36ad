//! A hub whose objects are in S3 (`--objects s3://…`): it writes each digest's object
//! into the bucket, serves every cluster from it, and answers an unchanged poll (304)
//! and a repeated fetch (200) without asking the object store again. Needs an
//! S3-compatible server (`FLOTILLA_TEST_S3`, started by `.ci/s3`): skipped without one
//! outside CI, failed without one in CI.

use crate::support::hub::*;

use flotilla_core::bundle::verify_document;
use flotilla_hub::store::objects::S3Sse;
use flotilla_hub::store::{ObjectsUrl, S3Location};

/// `flotilla_object_store_requests_total` from the hub's /metrics.
async fn object_store_requests(client: &reqwest::Client, hub: &Running) -> f64 {
    metric(client, &hub.base, "flotilla_object_store_requests_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_with_its_objects_in_s3_answers_unchanged_polls_from_memory() {
    let test = "hub_objects::a_hub_with_its_objects_in_s3_answers_unchanged_polls_from_memory";
    let Some(bucket) = flotilla_testkit::s3_bucket(test) else {
        return;
    };
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.objects = ObjectsUrl::S3(S3Location {
        bucket: bucket.bucket.clone(),
        prefix: "hub".into(),
        settings: bucket.settings(),
    });
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    let clusters: Vec<(String, String)> = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("name").to_string(),
                c["desired"].as_str().expect("digest").to_string(),
            )
        })
        .collect();
    assert!(clusters.len() > 10, "{fleet}");
    // Every served digest's object is in the bucket, and nothing in the state dir.
    let stored = bucket.keys("hub/sha256/");
    for (name, digest) in &clusters {
        let key = format!("hub/sha256/{}", digest.trim_start_matches("sha256:"));
        assert!(stored.contains(&key), "{name}: {key} not in {stored:?}");
    }
    assert!(
        std::fs::read_dir(state.path().join("objects/sha256"))
            .map(|entries| entries.count() == 0)
            .unwrap_or(true),
        "objects written into the state dir"
    );

    // The first fetch of each cluster does not read back the object the hub's render
    // has just written: it kept it.
    let written = object_store_requests(&client, &hub).await;
    assert!(written > 0.0, "the render wrote into the bucket");
    let mut served = Vec::new();
    for (name, digest) in &clusters {
        let url = hub.url(&format!("/v1/clusters/{name}/bundle"));
        let (status, etag, body) = get_bundle(&client, &url, &admin, None).await;
        assert_eq!(status, 200, "{name}");
        let document = verify_document(&body, Some(name)).expect("verified");
        assert_eq!(document.digest.as_str(), digest);
        served.push((url, etag.expect("ETag"), body));
    }
    let before = object_store_requests(&client, &hub).await;
    assert_eq!(
        before, written,
        "the first fetches read back what the hub wrote"
    );

    // Unchanged polls and repeated fetches: answered from memory.
    for (url, etag, body) in &served {
        for _ in 0..3 {
            let (status, _, _) = get_bundle(&client, url, &admin, Some(etag)).await;
            assert_eq!(status, 304, "{url}");
        }
        let (status, _, again) = get_bundle(&client, url, &admin, None).await;
        assert_eq!((status, &again), (200, body), "{url}");
    }
    assert_eq!(
        object_store_requests(&client, &hub).await,
        before,
        "an unchanged poll or a repeated fetch asked the object store"
    );
    hub.stop().await;
}

/// The server-side encryption the test server recorded for each key of `bucket`
/// under `prefix`: `(key, encryption, KMS key)`. Read from moto's own state dump
/// (`/moto-api/data.json`), since an object's encryption shows only in response
/// headers the S3 client does not hand back.
async fn encryption_of(
    bucket: &flotilla_testkit::TestBucket,
    prefix: &str,
) -> Vec<(String, Option<String>, Option<String>)> {
    let state: serde_json::Value = client()
        .get(format!("{}/moto-api/data.json", bucket.endpoint))
        .send()
        .await
        .expect("the test server's state")
        .json()
        .await
        .expect("JSON");
    let text = |value: &serde_json::Value| value.as_str().map(str::to_string);
    let mut keys: Vec<(String, Option<String>, Option<String>)> = state["s3"]["FakeKey"]
        .as_array()
        .expect("the test server lists its keys")
        .iter()
        .filter(|key| {
            key["bucket_name"] == bucket.bucket.as_str()
                && !key["disposed"].as_bool().unwrap_or(false)
        })
        .filter_map(|key| {
            let name = key["name"].as_str()?;
            name.starts_with(prefix).then(|| {
                (
                    name.to_string(),
                    text(&key["encryption"]),
                    text(&key["kms_key_id"]),
                )
            })
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_and_publish_ask_s3_for_the_server_side_encryption_they_are_given() {
    let test =
        "hub_objects::the_hub_and_publish_ask_s3_for_the_server_side_encryption_they_are_given";
    let Some(bucket) = flotilla_testkit::s3_bucket(test) else {
        return;
    };
    let repo = Repo::new();

    // The hub, with --s3-sse aes256: every object it writes asks for SSE-S3.
    let state = tempfile::tempdir().expect("state dir");
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.objects = ObjectsUrl::S3(
        S3Location {
            bucket: bucket.bucket.clone(),
            prefix: "hub".into(),
            settings: bucket.settings(),
        }
        .with_sse(&S3Sse::Aes256),
    );
    let hub = Running::start_ready(config).await;
    let written = encryption_of(&bucket, "hub/").await;
    assert!(written.len() > 5, "{written:?}");
    for (key, encryption, _) in &written {
        assert_eq!(encryption.as_deref(), Some("AES256"), "{key}");
    }
    hub.stop().await;

    // publish, with --s3-sse kms:KEY: its documents ask for SSE-KMS with that key,
    // and the object written to check the store at start is gone.
    let publish = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["publish", "--repo"])
            .arg(repo.path())
            .args(args)
            .envs(bucket.env())
            .output()
            .expect("flotilla publish runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let mirror = format!("s3://{}/mirror", bucket.bucket);
    let (published, stderr) = publish(&["--objects", &mirror, "--s3-sse", "kms:flotilla-test-key"]);
    assert!(published, "{stderr}");
    let written = encryption_of(&bucket, "mirror/").await;
    assert!(
        written.iter().any(|(key, _, _)| key.ends_with("/bundle")),
        "{written:?}"
    );
    for (key, encryption, kms_key) in &written {
        assert!(
            !key.contains("sse-probe"),
            "the probe object was left: {key}"
        );
        assert_eq!(
            (encryption.as_deref(), kms_key.as_deref()),
            (Some("aws:kms"), Some("flotilla-test-key")),
            "{key}"
        );
    }

    // The flag means S3: with a folder it is refused, not ignored.
    let out = tempfile::tempdir().expect("out");
    let (published, stderr) = publish(&[
        "--out",
        &out.path().display().to_string(),
        "--s3-sse",
        "aes256",
    ]);
    assert!(
        !published && stderr.contains("--s3-sse applies to --objects s3://"),
        "{stderr}"
    );
    let (published, stderr) = publish(&["--objects", &mirror, "--s3-sse", "rot13"]);
    assert!(
        !published && stderr.contains("give none, aes256 or kms:KEY"),
        "{stderr}"
    );
}
