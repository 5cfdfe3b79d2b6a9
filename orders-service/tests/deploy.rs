//! The Kubernetes manifests (`deploy/k8s/base`) agree with the services: every setting in
//! the ConfigMaps is one the service's own parser accepts, the container ports are the
//! ports the services listen on, the probes hit the probe endpoints, the Services and
//! URLs point where they should, and the termination grace period outlasts the preStop
//! pause plus the drain the service computes from its maximum budget.
//!
//! The manifests' schema is checked by `kubernetes-validate` in CI; this checks what a
//! schema cannot: that the numbers agree with the code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use yaml_rust2::{Yaml, YamlLoader};

fn manifests() -> Vec<Yaml> {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/base");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&base).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            docs.extend(YamlLoader::load_from_str(&text).unwrap());
        }
    }
    docs
}

fn find<'a>(docs: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/k8s/base"))
}

/// A ConfigMap's data as environment variables.
fn env_of(docs: &[Yaml], config_map: &str) -> HashMap<String, String> {
    find(docs, "ConfigMap", config_map)["data"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Parses `env` with the service's own settings parser, as the service would at start-up:
/// a variable the service does not know is an error (a typo in a ConfigMap is silently
/// ignored by the service, so it must fail here).
fn parse<C: Parser>(env: &HashMap<String, String>, extra: &[(&str, &str)]) -> C {
    let command = C::command();
    let mut args = vec![command.get_name().to_owned()];
    let pairs = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra.iter().copied());
    for (key, value) in pairs {
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == key))
            .unwrap_or_else(|| panic!("{key} is not a setting of {}", command.get_name()));
        args.push(format!("--{}={value}", arg.get_long().unwrap()));
    }
    C::try_parse_from(args).unwrap_or_else(|err| panic!("{err}"))
}

/// The container's port named `name`.
fn port(deployment: &Yaml, name: &str) -> i64 {
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

/// Checks probes, preStop and the grace period of `deployment` for a service whose
/// largest budget is `max_budget` and whose readiness endpoint is `ready`.
///
/// Each probe has its one right endpoint: startup and liveness ask whether the process
/// serves (`/healthz`, which checks no dependency: a database outage must not restart
/// every pod), readiness whether it can serve orders now (`ready`).
fn check_lifecycle(deployment: &Yaml, max_budget: Duration, ready: &str, what: &str) {
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    for (probe, endpoint) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", ready),
    ] {
        let get = &container[probe]["httpGet"];
        let path = get["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no {probe}"));
        assert_eq!(path, endpoint, "{what}: {probe} hits {path}");
        assert_eq!(get["port"].as_str(), Some("http"), "{what}: {probe} port");
    }
    let pause: u64 = container["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{what}: preStop is not `sleep N`"));
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    let needed = Duration::from_secs(pause) + service_kit::server::drain_timeout(max_budget);
    assert!(
        Duration::from_secs(grace as u64) > needed,
        "{what}: terminationGracePeriodSeconds {grace} s must outlast preStop + drain = {needed:?}"
    );
}

fn service_port(docs: &[Yaml], name: &str, port_name: &str) -> i64 {
    find(docs, "Service", name)["spec"]["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(port_name))
        .and_then(|p| p["port"].as_i64())
        .unwrap_or_else(|| panic!("Service {name} has no port {port_name}"))
}

#[test]
fn orders_manifests_agree_with_orders_service() {
    let docs = manifests();
    let secret = find(&docs, "Secret", "database");
    let database_url = secret["stringData"]["DATABASE_URL"].as_str().unwrap();
    let config: orders_service::Config = parse(
        &env_of(&docs, "orders-config"),
        &[("DATABASE_URL", database_url)],
    );
    let deployment = find(&docs, "Deployment", "orders");
    assert_eq!(
        port(deployment, "http"),
        i64::from(config.listen_addr.port())
    );
    check_lifecycle(
        deployment,
        Duration::from_millis(config.deadline_max_ms),
        "/readyz",
        "orders",
    );
    let catalog = reqwest::Url::parse(&config.catalog_url).unwrap();
    assert_eq!(
        catalog.host_str(),
        Some("catalog"),
        "CATALOG_URL names the Service"
    );
    assert_eq!(
        i64::from(catalog.port().unwrap()),
        service_port(&docs, "catalog", "http")
    );
    let database = reqwest::Url::parse(database_url).unwrap();
    assert_eq!(database.host_str(), Some("postgres"));
    assert_eq!(
        i64::from(database.port().unwrap()),
        service_port(&docs, "postgres", "postgres")
    );
}

#[test]
fn catalog_manifests_agree_with_catalog_service() {
    let docs = manifests();
    let config: catalog_service::Config = parse(&env_of(&docs, "catalog-config"), &[]);
    let deployment = find(&docs, "Deployment", "catalog");
    let listen: SocketAddr = config.listen_addr;
    assert_eq!(port(deployment, "http"), i64::from(listen.port()));
    assert_eq!(
        port(deployment, "admin"),
        i64::from(config.admin_addr.port())
    );
    // The catalog has no dependency: ready when it serves.
    check_lifecycle(
        deployment,
        Duration::from_millis(config.deadline_max_ms),
        "/healthz",
        "catalog",
    );
}

/// shipping-worker's manifests: its settings parse, its port and probes are its own,
/// its grace period outlasts the longest attempt (the lease, which its shutdown waits
/// for), and it refuses to start no job that orders-service queues: both have the same
/// minimum useful time.
#[test]
fn shipping_manifests_agree_with_shipping_worker() {
    let docs = manifests();
    let secret = find(&docs, "Secret", "database");
    let database_url = secret["stringData"]["DATABASE_URL"].as_str().unwrap();
    let url = [("DATABASE_URL", database_url)];
    let config: shipping_worker::Config = parse(&env_of(&docs, "shipping-config"), &url);
    let deployment = find(&docs, "Deployment", "shipping");
    assert_eq!(
        port(deployment, "http"),
        i64::from(config.listen_addr.port())
    );
    let pod = &deployment["spec"]["template"]["spec"];
    for probe in ["startupProbe", "livenessProbe"] {
        assert_eq!(
            pod["containers"][0][probe]["httpGet"]["path"].as_str(),
            Some("/healthz")
        );
    }
    let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_i64().unwrap() as u64);
    assert!(
        grace > Duration::from_millis(config.lease_ms),
        "the grace period must outlast the lease"
    );
    let orders: orders_service::Config = parse(&env_of(&docs, "orders-config"), &url);
    assert_eq!(orders.queue_min_useful_ms, config.min_useful_ms);
}
