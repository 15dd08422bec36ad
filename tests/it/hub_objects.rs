//! A hub whose objects are in S3 (`--objects s3://…`): it writes each digest's object
//! into the bucket, serves every cluster from it, and answers an unchanged poll (304)
//! and a repeated fetch (200) without asking the object store again. Needs an
//! S3-compatible server (`FLOTILLA_TEST_S3`, started by `.ci/s3`): skipped without one
//! outside CI, failed without one in CI.

use crate::support::hub::*;

use flotilla_core::bundle::verify_document;
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
