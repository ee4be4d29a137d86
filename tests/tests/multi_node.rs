//! Warren on three real nodes (kube-envtest `start-node` + `add-node`) from
//! `helm install`: the agents' DaemonSet on every node (each with its own
//! state, `nodeAgent.statePerNode`), two gateway replicas sharing PostgreSQL
//! records, threads in the S3 store (the project's real S3 server), an OCI
//! Sandbox and a `host` one. Calls spread over the nodes (by the agents'
//! own counts), a thread's calls stay on one node, the image is warm on
//! every node. A node lost mid-call (`stop-node`): its calls end
//! `node_lost`, new calls run on the others within a stated bound, its
//! threads continue elsewhere from the store, its live sandbox is `failed`
//! with the reason; back, it takes calls again and its old sandboxes'
//! cgroups are gone. A gateway replica killed mid-call: the
//! other finishes its async record, and the key's concurrency limit still
//! holds. `kubectl drain` and a rolling `helm upgrade` of the agents keep
//! serving. Uninstall leaves nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use warren_e2e::chart_cluster::{agent_pid, api_server, cgroups_of, gateways, helm, jsonpath, key_in_secret, pods, pods_reach_the_api_server, ready, repo, rollout, warren_cgroups, warren_processes, NS};
use warren_e2e::forward::Forward;
use warren_e2e::gateway::wait_for;
use warren_e2e::kube::EnvTest;
use warren_e2e::s3::{S3Server, BUCKET};
use warren_e2e::services::{Postgres, PG_PASSWORD};
use warren_e2e::{http, skip_unless_root};

const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// After a node is lost, calls run on the others within this (the
/// gateways' silence limit, 10 s, plus a check and a retry; a killed
/// agent's refused connection takes it out at once).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

fn execute(addr: SocketAddr, key: &str, body: &Value) -> http::Response {
    http::raw(addr, &http::execute_request(addr, key, body, false)).expect("HTTP to a gateway pod")
}

fn get(addr: SocketAddr, key: &str, path: &str) -> http::Response {
    let auth = format!("Bearer {key}");
    http::request(addr, "GET", path, &[("authorization", auth.as_str())], b"")
}

/// Every node's own count of the executions it started, as the gateway at
/// `addr` last heard it from the agents (`warren_gateway_node_executions_started`).
fn node_counts(addr: SocketAddr) -> HashMap<String, u64> {
    let text = http::request(addr, "GET", "/metrics", &[], b"").text();
    text.lines()
        .filter_map(|l| l.strip_prefix("warren_gateway_node_executions_started{node=\""))
        .filter_map(|l| l.split_once("\"} "))
        .filter_map(|(node, n)| Some((node.to_string(), n.trim().parse().ok()?)))
        .collect()
}

/// The node that ran execution `id` (its record in the replicas' database).
fn node_of(pg: &Postgres, id: &str) -> String {
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "a trace id: {id:?}");
    pg.query(&format!("SELECT node FROM warren_executions WHERE trace_id = '{id}'")).trim().to_string()
}

/// Executions running now, per node.
fn running_per_node(pg: &Postgres) -> HashMap<String, usize> {
    let rows = pg.query("SELECT node, count(*) FROM warren_executions WHERE completed_ms IS NULL AND node <> '' GROUP BY node");
    rows.lines().filter_map(|l| l.split_once('|')).filter_map(|(n, c)| Some((n.to_string(), c.parse().ok()?))).collect()
}

/// A Sandbase/E2B-style call with the key.
fn sandbase(addr: SocketAddr, key: &str, method: &str, path: &str) -> http::Response {
    let auth = format!("Bearer {key}");
    let body = if method == "POST" { json!({"templateID": "base", "timeout": 900}).to_string() } else { String::new() };
    http::request(addr, method, path, &[("authorization", auth.as_str()), ("content-type", "application/json")], body.as_bytes())
}

/// A live sandbox on `node`: the other nodes cordoned meanwhile (the
/// gateways then send new work only there), uncordoned after.
fn live_sandbox_on(k: &EnvTest, gw: SocketAddr, pg: &Postgres, key: &str, node: &str) -> String {
    let others: Vec<&str> = NODES.iter().copied().filter(|n| *n != node).collect();
    let mut cordon = vec!["cordon"];
    cordon.extend(&others);
    k.kubectl_ok(&cordon);
    let echo = json!({"code": "echo 1", "language": "bash"});
    let there = wait_for(Duration::from_secs(30), || {
        let r = execute(gw, key, &echo);
        r.status == 200 && node_of(pg, r.json()["trace_id"].as_str().unwrap_or_default()) == node
    });
    assert!(there, "the gateway kept sending calls to cordoned nodes");
    let created = sandbase(gw, key, "POST", "/sandboxes");
    let mut uncordon = vec!["uncordon"];
    uncordon.extend(&others);
    k.kubectl_ok(&uncordon);
    assert_eq!(created.status, 201, "{}", created.text());
    let id = created.json()["sandboxID"].as_str().unwrap().to_string();
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{id:?}");
    assert_eq!(pg.query(&format!("SELECT node FROM warren_e2b_sandboxes WHERE id = '{id}'")).trim(), node, "the live sandbox's node");
    id
}

/// Runs `body` until it succeeds (through the gateways in turn), within `limit`.
fn until_ok(gws: &[SocketAddr], key: &str, body: &Value, limit: Duration) -> http::Response {
    let mut last = None;
    let mut i = 0;
    let ok = wait_for(limit, || {
        i += 1;
        let r = execute(gws[i % gws.len()], key, body);
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    let last = last.expect("one try");
    assert!(ok, "no call succeeded within {limit:?}: {} {}", last.status, last.text());
    last
}

/// Both gateway pods, once both run.
fn two_gateways(k: &EnvTest) -> Vec<SocketAddr> {
    let mut all = Vec::new();
    assert!(wait_for(Duration::from_secs(120), || {
        all = gateways(k);
        all.len() == 2
    }), "two gateway pods: {all:?}");
    all
}

/// The agent pods on the nodes, once there is one Running on each of `on`.
fn agents_on(k: &EnvTest, on: &[&str]) -> Vec<(String, String, std::net::IpAddr)> {
    let mut all = Vec::new();
    assert!(
        wait_for(Duration::from_secs(180), || {
            all = pods(k, "node-agent");
            on.iter().all(|n| all.iter().any(|(_, node, _)| node == n))
        }),
        "agents on {on:?}: {all:?}\n{}",
        warren_e2e::chart_cluster::pod_logs()
    );
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
// Long: one cluster brought up once (minutes) and taken through every scenario in order; each step is commented.
async fn three_nodes_two_gateways_spread_fail_over_and_drain() {
    if skip_unless_root("three_nodes_two_gateways_spread_fail_over_and_drain") {
        return;
    }
    let (warren, runtime) = warren_e2e::chart_cluster::images();
    let k = EnvTest::start().unwrap();
    k.start_node().unwrap();
    for n in &NODES[1..] {
        k.add_node(n).unwrap();
    }
    k.load_image(&warren).unwrap();

    // What the pods reach on this machine, through the bridge's address:
    // the API server, PostgreSQL, the S3 server and the image registry.
    let bridge = k.bridge_up().unwrap();
    let api = Forward::start(bridge, api_server(&k)).await.unwrap();
    let pg = Postgres::start().unwrap();
    let pg_fwd = Forward::start(bridge, SocketAddr::from(([127, 0, 0, 1], pg.port))).await.unwrap();
    let s3 = S3Server::start().unwrap();
    let s3_fwd = Forward::start(bridge, s3.addr).await.unwrap();
    let (_registry, registry_addr, image) = warren_e2e::chart_cluster::runtime_in_registry(bridge, &runtime);

    k.kubectl_ok(&["create", "namespace", NS]);
    let records = format!("url=postgres://agent:{PG_PASSWORD}@{}/app", pg_fwd.addr);
    k.kubectl_ok(&["create", "secret", "generic", "warren-records", "-n", NS, &format!("--from-literal={records}")]);
    let creds: Vec<String> = s3.env().into_iter().filter(|(k, _)| k.starts_with("AWS_ACCESS") || k.starts_with("AWS_SECRET")).map(|(k, v)| format!("--from-literal={k}={v}")).collect();
    let mut secret = vec!["create", "secret", "generic", "warren-s3", "-n", NS];
    secret.extend(creds.iter().map(String::as_str));
    k.kubectl_ok(&secret);

    let state = tempfile::Builder::new().prefix("warren-nodes-state-").tempdir().unwrap();
    let state_dir = state.path().display().to_string();
    let chart = repo("charts/warren").display().to_string();
    let values = [
        "--set", "image.pullPolicy=Never",
        "--set", &format!("nodeAgent.stateDir={state_dir}"),
        // The three kubelets share this machine's directories.
        "--set", "nodeAgent.statePerNode=true",
        "--set", "gateway.replicas=2",
        "--set", "gateway.records.existingSecret=warren-records",
        "--set", "threads.store=s3",
        "--set", &format!("threads.s3.bucket={BUCKET}"),
        "--set", &format!("threads.s3.endpoint=http://{}", s3_fwd.addr),
        "--set", "threads.s3.allowHttp=true",
        "--set", "threads.s3.credentialsSecret=warren-s3",
        "--set", &format!("nodeAgent.images.insecureRegistries={{{registry_addr}}}"),
        "--set", &format!("nodeAgent.allowEndpoints={{{bridge}/32}}"),
        "--set", "tenantNamespaces={default}",
        // The gateways and the operator on node1, which is never lost or
        // drained here: the node lost takes agents and sandboxes only (a
        // gateway replica lost is its own step).
        "--set", "gateway.nodeSelector.kubernetes\\.io/hostname=node1",
        "--set", "operator.nodeSelector.kubernetes\\.io/hostname=node1",
    ];
    let mut install = vec!["install", "warren", chart.as_str(), "--namespace", NS];
    install.extend(values);
    helm(&k, &install);
    pods_reach_the_api_server(&k, &api);
    rollout(&k, "daemonset/warren-node-agent");
    rollout(&k, "deployment/warren-gateway");
    rollout(&k, "deployment/warren-operator");
    agents_on(&k, &NODES);

    // The quickstart (OCI image) and a `host` Sandbox, each with a key.
    let quickstart = warren_e2e::kube::quickstart_with_image(&image);
    k.kubectl_ok(&["apply", "-n", "default", "-f", quickstart.path().to_str().unwrap()]);
    let host = tempfile::tempdir().unwrap();
    let host_yaml = host.path().join("host.yaml");
    std::fs::write(
        &host_yaml,
        "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: host-box}\nspec: {image: host}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: hostkey}\nspec: {sandboxRef: {name: host-box}, maxConcurrency: 2}\n",
    )
    .unwrap();
    k.kubectl_ok(&["apply", "-n", "default", "-f", host_yaml.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(300), || ready(&k, "sandbox", "default")), "Sandbox not Ready: {}", jsonpath(&k, &["get", "sandbox", "default", "-n", "default"], "{.status}"));
    // Warm on every node.
    let warm = jsonpath(&k, &["get", "sandbox", "default", "-n", "default"], "{.status.warmNodes}");
    assert_eq!(warm, r#"["node1","node2","node3"]"#, "the image is warm on every node");
    for key in ["agent", "hostkey"] {
        assert!(wait_for(Duration::from_secs(60), || ready(&k, "apikey", key)), "ApiKey {key} not Ready: {}", jsonpath(&k, &["get", "apikey", key, "-n", "default"], "{.status}"));
    }
    let (key, host_key) = (key_in_secret(&k, "agent-key"), key_in_secret(&k, "hostkey-key"));
    let gws = two_gateways(&k);
    let echo = json!({"code": "echo 1", "language": "bash"});
    until_ok(&gws, &key, &echo, Duration::from_secs(90));

    // Calls spread over the nodes: the agents' own counts all grow, through
    // either replica.
    let before = node_counts(gws[0]);
    for i in 0..30 {
        let r = execute(gws[i % 2], &key, &echo);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        wait_for(Duration::from_secs(10), || {
            let after = node_counts(gws[1]);
            NODES.iter().all(|n| after.get(*n).copied().unwrap_or(0) > before.get(*n).copied().unwrap_or(0))
        }),
        "calls did not reach every node: before {before:?}, after {:?}",
        node_counts(gws[1])
    );
    eprintln!("figures: 30 calls spread over the nodes: before {before:?}, after {:?}", node_counts(gws[1]));
    let node_lines = http::request(gws[1], "GET", "/metrics", &[], b"").text().lines().filter(|l| l.contains("node")).map(String::from).collect::<Vec<_>>();
    eprintln!("figures: node metrics: {node_lines:#?}\nwarm: {}", jsonpath(&k, &["get", "sandbox", "default", "-n", "default"], "{.status}"));
    // The host Sandbox runs too (the agent image's own bash).
    let r = execute(gws[1], &host_key, &json!({"code": "echo host-$((6*7))", "language": "bash"}));
    assert_eq!((r.status, r.json()["stdout"].clone()), (200, json!("host-42\n")), "{}", r.text());

    // Threads: each one's calls stay on one node, whichever replica takes
    // them. As many as it takes for two to live on the node lost below.
    let lost = "node3";
    let mut threads = Vec::new();
    let mut home: HashMap<String, String> = HashMap::new();
    for i in 0..40 {
        if i >= 6 && home.values().filter(|h| *h == lost).count() >= 2 {
            break;
        }
        let t = format!("t{i}");
        threads.push(t.clone());
        let t = &t;
        let mut nodes = Vec::new();
        for (i, code) in [format!("echo {t} > ~/note"), "cat ~/note".into(), "cat ~/note".into()].iter().enumerate() {
            let r = execute(gws[i % 2], &key, &json!({"code": code, "language": "bash", "thread_id": t}));
            assert_eq!(r.status, 200, "{t}: {}", r.text());
            nodes.push(node_of(&pg, r.json()["trace_id"].as_str().unwrap()));
        }
        assert!(nodes.iter().all(|n| n == &nodes[0]) && !nodes[0].is_empty(), "{t} moved between healthy nodes: {nodes:?}");
        home.insert(t.clone(), nodes[0].clone());
    }

    // A node lost mid-call. Calls running on every node (at least one each).
    let long = json!({"code": "sleep 25; echo survived", "language": "bash"});
    let running: Vec<_> = (0..6)
        .map(|i| {
            let (gw, key, long) = (gws[i % 2], key.clone(), long.clone());
            std::thread::spawn(move || {
                let r = execute(gw, &key, &long);
                (Instant::now(), r)
            })
        })
        .collect();
    assert!(wait_for(Duration::from_secs(20), || running_per_node(&pg).len() == NODES.len()), "the long calls did not reach every node: {:?}", running_per_node(&pg));
    assert!(home.values().filter(|h| *h == lost).count() >= 2, "threads on {lost}: {home:?}");
    // A live sandbox (E2B/Sandbase API) on the node to lose.
    let live = live_sandbox_on(&k, gws[0], &pg, &key, lost);
    // What the lost node's agent has made: its sandboxes' cgroups.
    let agent = agent_pid(lost).expect("the agent of the node to lose");
    let left = cgroups_of(agent);
    assert!(!left.is_empty(), "the agent on {lost} has sandboxes");
    k.stop_node(lost).unwrap();
    let stopped = Instant::now();
    // New calls run on the survivors within the bound, and then every one does.
    until_ok(&gws, &key, &echo, FAILOVER_BOUND);
    let failed_over = stopped.elapsed();
    for i in 0..20 {
        let r = execute(gws[i % 2], &key, &echo);
        assert_eq!(r.status, 200, "call {i} after the loss: {}", r.text());
        assert_ne!(node_of(&pg, r.json()["trace_id"].as_str().unwrap()), lost);
    }
    let mut outcomes = Vec::new();
    for t in running {
        let (ended, r) = t.join().unwrap();
        if r.status != 200 {
            assert!(ended.duration_since(stopped) < FAILOVER_BOUND, "a call on the lost node hung for {:?}", ended.duration_since(stopped));
        }
        outcomes.push((r.status, serde_json::from_str::<Value>(&r.text()).unwrap_or_else(|_| json!({"raw": r.text()}))));
    }
    let lost_calls: Vec<_> = outcomes.iter().filter(|(s, b)| *s == 502 && b["error"] == "node_lost").collect();
    let finished: Vec<_> = outcomes.iter().filter(|(s, b)| *s == 200 && b["stdout"] == "survived\n").collect();
    assert!(!lost_calls.is_empty() && lost_calls.len() + finished.len() == outcomes.len(), "each call ends node_lost or runs to its end: {outcomes:?}");
    eprintln!(
        "figures: {lost} lost: {} calls node_lost, {} ran to their end; a new call succeeded {} ms after the loss",
        lost_calls.len(),
        finished.len(),
        failed_over.as_millis()
    );
    // Its threads continue on another node from the store, as last saved.
    for t in &threads {
        let r = execute(gws[0], &key, &json!({"code": "cat ~/note", "language": "bash", "thread_id": t}));
        assert_eq!((r.status, r.json()["stdout"].clone()), (200, json!(format!("{t}\n"))), "{t} (was on {}): {}", home[t], r.text());
    }

    // Its live sandbox is `failed` with the reason (once its node has been
    // silent for the gateways' 30 s limit for live sandboxes).
    let info = || sandbase(gws[1], &key, "GET", &format!("/sandboxes/{live}")).json();
    assert!(wait_for(Duration::from_secs(120), || info()["status"] == "failed"), "the live sandbox on {lost}: {}", info());
    assert!(info()["statusReason"].as_str().is_some_and(|r| !r.is_empty()), "{}", info());

    // The node comes back: its agent restarts, rejoins and takes calls; the
    // sandboxes of its previous run are gone.
    k.add_node(lost).unwrap();
    agents_on(&k, &NODES);
    assert!(
        wait_for(Duration::from_secs(120), || {
            let _ = execute(gws[0], &key, &echo);
            node_counts(gws[0]).get(lost).copied().unwrap_or(0) > 0
        }),
        "{lost} never took a call again: {:?}",
        node_counts(gws[0])
    );
    let still: Vec<_> = left.iter().filter(|c| std::path::Path::new(c).exists()).collect();
    assert!(still.is_empty(), "the lost run's cgroups are left on {lost}: {still:?}");

    // A gateway replica killed mid-call: the other finishes its async record.
    let auth = format!("Bearer {key}");
    let submit = http::request(
        gws[0],
        "POST",
        "/v1/sandbox/execute",
        &[("authorization", auth.as_str()), ("content-type", "application/json"), ("prefer", "respond-async")],
        json!({"code": "sleep 20; echo late", "language": "bash"}).to_string().as_bytes(),
    );
    assert_eq!(submit.status, 202, "{}", submit.text());
    let id = submit.json()["trace_id"].as_str().unwrap().to_string();
    let victim = pods(&k, "gateway").into_iter().find(|(_, _, ip)| SocketAddr::new(*ip, 8080) == gws[0]).unwrap().0;
    k.kubectl_ok(&["delete", "pod", &victim, "-n", NS, "--grace-period=0", "--force"]);
    let survivor = gws[1];
    let status = || get(survivor, &key, &format!("/v1/executions/{id}")).json();
    assert!(wait_for(Duration::from_secs(90), || status()["status"] != "running"), "the async record stayed running: {}", status());
    assert_eq!(status()["error"], "gateway_lost", "{}", status());

    // The key's concurrency limit (2) holds across the replicas left and
    // the nodes: each call says when it ran (one clock: one machine), and
    // no instant has more than two of them.
    let gws = two_gateways(&k);
    let timed = json!({"code": "a=$(date +%s%N); sleep 2; echo $a $(date +%s%N)", "language": "bash"});
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let (gw, key, timed) = (gws[i % 2], host_key.clone(), timed.clone());
            std::thread::spawn(move || execute(gw, &key, &timed))
        })
        .collect();
    let mut spans = Vec::new();
    for c in calls {
        let r = c.join().unwrap();
        match r.status {
            200 => {
                let out = r.json()["stdout"].as_str().unwrap_or_default().to_string();
                let t: Vec<u128> = out.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                assert_eq!(t.len(), 2, "{out:?}");
                spans.push((t[0], t[1]));
            }
            429 => {}
            _ => panic!("{} {}", r.status, r.text()),
        }
    }
    let most = spans.iter().map(|(a, _)| spans.iter().filter(|(b, e)| b <= a && a < e).count()).max().unwrap_or(0);
    assert!(spans.len() >= 2 && most <= 2, "{most} of the key's calls ran at once (limit 2): {spans:?}");

    drain_and_upgrade(&k, &pg, &key, &chart, &values);

    // Uninstall: nothing of Warren stays on the machine.
    helm(&k, &["uninstall", "warren", "--namespace", NS, "--wait", "--timeout", "180s"]);
    let gone = wait_for(Duration::from_secs(120), || jsonpath(&k, &["get", "pods", "-n", NS], "{.items[*].metadata.name}").is_empty() && warren_processes().is_empty());
    assert!(gone, "pods or processes remain: {:?}", warren_processes());
    assert!(wait_for(Duration::from_secs(60), || warren_cgroups().is_empty()), "cgroups remain: {:?}", warren_cgroups());
    assert_eq!(warren_e2e::chart_cluster::mounts_below(state.path()), Vec::<String>::new(), "mounts remain under the state dir");
}

/// `kubectl drain` of a node: new calls stop going there, a call running
/// there finishes. Then a `helm upgrade` that rolls the agents one node at a
/// time while a bounded client calls: no call fails.
fn drain_and_upgrade(k: &EnvTest, pg: &Postgres, key: &str, chart: &str, values: &[&str]) {
    let gws = two_gateways(k);
    let drained = "node2";
    let long = json!({"code": "sleep 8; echo finished", "language": "bash"});
    // A call running on the node to drain (they spread: try until one lands there).
    let mut held = None;
    for _ in 0..12 {
        let (gw, key2, long2) = (gws[0], key.to_string(), long.clone());
        let t = std::thread::spawn(move || execute(gw, &key2, &long2));
        std::thread::sleep(Duration::from_millis(700));
        if running_per_node(pg).contains_key(drained) {
            held = Some(t);
            break;
        }
        assert_eq!(t.join().unwrap().status, 200);
    }
    let held = held.expect("a call ran on the node to drain");
    k.kubectl_ok(&["drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s"]);
    let r = held.join().unwrap();
    assert_eq!((r.status, r.json()["stdout"].clone()), (200, json!("finished\n")), "the running call finished: {}", r.text());
    let echo = json!({"code": "echo 1", "language": "bash"});
    let gws = two_gateways(k);
    // The gateways hear of the cordon within their watch: then nothing goes there.
    assert!(
        wait_for(Duration::from_secs(30), || {
            let r = execute(gws[0], key, &echo);
            r.status == 200 && node_of(pg, r.json()["trace_id"].as_str().unwrap()) != drained
        }),
        "calls still go to the drained node"
    );
    for i in 0..12 {
        let r = execute(gws[i % 2], key, &echo);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_ne!(node_of(pg, r.json()["trace_id"].as_str().unwrap()), drained, "a call went to the drained node");
    }
    k.kubectl_ok(&["uncordon", drained]);

    // A rolling upgrade of the agents (a changed setting), one node at a
    // time, with a client calling through it: no call fails.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (stop, key, gws) = (stop.clone(), key.to_string(), gws.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0, Vec::new());
            let started = Instant::now();
            // Bounded: at most 10 minutes or 3000 calls.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && started.elapsed() < Duration::from_secs(600) && ok + failed.len() < 3000 {
                let r = execute(gws[(ok + failed.len()) % 2], &key, &json!({"code": "echo 1", "language": "bash"}));
                if r.status == 200 {
                    ok += 1;
                } else {
                    failed.push(format!("{} {}", r.status, r.text()));
                }
            }
            (ok, failed)
        })
    };
    let mut upgrade = vec!["upgrade", "warren", chart, "--namespace", NS];
    upgrade.extend(values);
    upgrade.extend(["--set", "nodeAgent.poolSize=1"]);
    helm(k, &upgrade);
    rollout(k, "daemonset/warren-node-agent");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.join().unwrap();
    eprintln!("figures: rolling upgrade of the agents: {ok} calls, {} failed", failed.len());
    assert!(ok > 0 && failed.is_empty(), "{ok} calls succeeded, {} failed through the agents' rolling upgrade: {failed:?}", failed.len());
}
