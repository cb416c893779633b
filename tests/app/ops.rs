//! Every service serves `/metrics` that promtool accepts, and answers
//! `/livez` and `/readyz`, on its own ops listener when given one.

use crate::helpers::*;
use hindsight::backends::{BackendConfig, Backends, Uses};
use hindsight::services::api::ApiConfig;
use hindsight::services::ingest::IngestConfig;
use hindsight::services::{self, Listeners};
use hindsight_projector::ProjectorConfig;
use std::sync::Arc;

const DAY: i64 = 1_756_684_800;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_serves_metrics_promtool_accepts_and_probes() {
    let dir = temp_dir("services-metrics");
    // Each service over its own connections to the data directory, as
    // separate processes would be.
    let connect = |uses| {
        let cfg = BackendConfig {
            uses,
            ..BackendConfig::embedded(&dir)
        };
        async move { Backends::connect(&cfg).await.unwrap() }
    };
    let (for_ingest, for_projector, for_api) = (
        connect(Uses::INGEST).await,
        connect(Uses::CONSUME).await,
        connect(Uses::READ).await,
    );
    let with_ops = || async {
        Listeners {
            service: port0().await,
            ops: Some(port0().await),
        }
    };
    let ingest = services::ingest::build(
        &IngestConfig {
            token: INGEST_TOKEN.into(),
            max_body_bytes: 1 << 20,
            limits: Default::default(),
        },
        &for_ingest,
        with_ops().await,
    )
    .unwrap();
    let projector =
        services::projector::build(&ProjectorConfig::default(), &for_projector, port0().await)
            .unwrap();
    let api_cfg = ApiConfig {
        plans: Arc::new(Default::default()),
        clock: Arc::new(hindsight_schemas::time::SystemClock),
        cursors: services::api::cursor_keys(&[], &BackendConfig::embedded(&dir)).unwrap(),
        dashboard: Default::default(),
        export_jobs: Default::default(),
        page_cache_bytes: hindsight_api::cache::DEFAULT_PAGE_BYTES,
    };
    let api = services::api::build(&api_cfg, &for_api, with_ops().await)
        .await
        .unwrap();
    let (ingest_port, ingest_ops) = (ingest.local_addr(), ingest.ops_addr());
    let projector_ops = projector.ops_addr();
    let (api_port, api_ops) = (api.local_addr(), api.ops_addr());
    assert_ne!(ingest_port, ingest_ops);
    let _running: Vec<_> = [ingest, projector, api].into_iter().map(run).collect();

    for (name, ops) in [
        ("ingest", ingest_ops),
        ("projector", projector_ops),
        ("api", api_ops),
    ] {
        let base = format!("http://{ops}");
        let ready = client().get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "{name} is ready");
        assert_eq!(
            client()
                .get(format!("{base}/livez"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        // Some traffic so the families have samples.
        if name == "ingest" {
            let r = client()
                .post(format!("http://{ingest_port}/ingest/v1/events"))
                .bearer_auth(INGEST_TOKEN)
                .body(format!("{}\n{{bad", price_line("m", "t", DAY, 0.5)))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        if name == "api" {
            let r = client()
                .get(format!("http://{api_port}/v1/health"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401);
            // The service port does not serve /metrics when it has its own.
            let r = client()
                .get(format!("http://{api_port}/metrics"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 404);
        }
        let body = metrics_text(&base).await;
        assert!(body.contains("hindsight_"), "{name}: {body}");
        promtool_accepts(name, &body);
    }
}
