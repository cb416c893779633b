//! The committed `api/openapi.json` is the document the handlers generate:
//! a change to a route or a wire type shows up as a diff in review.

#[test]
fn committed_openapi_matches_the_generated_document() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    let committed = std::fs::read_to_string(path).expect("api/openapi.json is committed");
    let generated = hindsight_api::openapi::to_pretty_json();
    assert!(
        committed == generated,
        "api/openapi.json is stale: run `cargo run -- openapi > api/openapi.json` and commit it"
    );
}

#[test]
fn document_is_openapi_3_1_version_0_1_1_with_every_spec_route_and_the_additions() {
    let doc: serde_json::Value =
        serde_json::from_str(&hindsight_api::openapi::to_pretty_json()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], "0.1.1");
    let paths = doc["paths"].as_object().unwrap();
    for route in [
        "/v1/health",
        "/v1/usage",
        "/v1/series",
        "/v1/events",
        "/v1/markets",
        "/v1/markets/{id_or_slug}",
        "/v1/tags",
        "/v1/markets/{id_or_slug}/metrics",
        "/v1/markets/{id_or_slug}/prices",
        "/v1/tokens/{token_id}/prices",
        "/v1/markets/{id_or_slug}/books",
        "/v1/tokens/{token_id}/books",
        // Beyond SPEC.md.
        "/v1/markets/{id_or_slug}/candles",
        "/v1/tokens/{token_id}/candles",
        "/v1/estimate/{kind}",
        "/v1/export/prices",
        "/v1/export/books",
        "/v1/export/metrics",
        "/v1/export/trades",
        "/v1/export/candles",
        "/v1/exports",
        "/v1/exports/{id}",
        "/v1/exports/{id}/download",
        "/v1/tokens/{token_id}/trades",
        "/v1/tokens/{token_id}/book",
        "/v1/markets/{id_or_slug}/book",
    ] {
        assert!(paths.contains_key(route), "{route}");
    }
    assert_eq!(paths.len(), 26);
}

#[test]
fn every_link_names_an_operation_and_one_of_its_parameters() {
    let doc: serde_json::Value =
        serde_json::from_str(&hindsight_api::openapi::to_pretty_json()).unwrap();
    let mut parameters = std::collections::BTreeMap::new();
    for item in doc["paths"].as_object().unwrap().values() {
        let op = &item["get"];
        let names: Vec<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        parameters.insert(op["operationId"].as_str().unwrap().to_string(), names);
    }
    let mut links = 0;
    for item in doc["paths"].as_object().unwrap().values() {
        let from = item["get"]["operationId"].as_str().unwrap();
        let Some(found) = item["get"]["responses"]["200"]["links"].as_object() else {
            continue;
        };
        for (name, link) in found {
            let to = link["operationId"].as_str().unwrap();
            let known = parameters
                .get(to)
                .unwrap_or_else(|| panic!("{from}.{name}: no operation {to}"));
            for (parameter, value) in link["parameters"].as_object().unwrap() {
                assert!(
                    known.contains(parameter),
                    "{from}.{name}: {to} has no {parameter}"
                );
                assert!(value.as_str().unwrap().starts_with("$response.body#/"));
            }
            links += 1;
        }
    }
    assert!(links >= 10, "{links} links");
}

/// The edge refuses an over-long request target on every route before the
/// route runs: every operation documents that 414.
#[test]
fn every_operation_documents_the_edges_414() {
    let doc: serde_json::Value =
        serde_json::from_str(&hindsight_api::openapi::to_pretty_json()).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            assert!(
                op["responses"]["414"]["content"]["application/json"].is_object(),
                "{method} {path} does not document 414"
            );
        }
    }
    assert!(operations >= 27, "{operations} operations");
}
