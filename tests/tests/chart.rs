//! The Helm chart: `helm lint` is clean and what `helm template` renders is
//! accepted by a real API server (`kubectl apply --dry-run=server`, Kubernetes
//! 1.20 from kube-envtest), with the default values and with every toggle on.

use std::path::Path;
use std::process::Command;

use warren_e2e::kube::EnvTest;
use warren_e2e::skip_unless_root;

fn chart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/warren").display().to_string()
}

fn helm(args: &[&str]) -> String {
    let helm = warren_e2e::helm::helm().expect("helm available");
    let out = Command::new(helm).args(args).output().expect("helm runs");
    assert!(out.status.success(), "helm {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn chart_lints_and_renders_objects_the_api_server_accepts() {
    if skip_unless_root("chart_lints_and_renders_objects_the_api_server_accepts") {
        return;
    }
    let lint = helm(&["lint", "--strict", &chart()]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let k = EnvTest::start().unwrap();
    // The keys namespace is part of the chart; server dry-run cannot create
    // a namespace and objects in it in one apply, so it exists beforehand.
    for ns in ["warren-system", "warren-system-keys", "team-a"] {
        k.kubectl_ok(&["create", "namespace", ns]);
    }
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    for (name, extra) in [("default", vec![]), ("toggles", vec!["--set", "networkPolicy.enabled=false,serviceMonitor.enabled=true,nodeAgent.token=abcdefghijklmnopqrstuvwx,threads.store=s3,threads.s3.bucket=warren-threads,threads.s3.endpoint=http://minio.storage:9000,threads.s3.allowHttp=true,threads.s3.credentialsSecret=s3-creds,gateway.replicas=3,gateway.records.existingSecret=warren-records,gateway.webhooks.allowHosts={hooks.internal},gateway.publicUrl=https://warren.example.com,nodeAgent.localStorageRoots={/srv/warren-data},nodeAgent.allowEndpoints={10.96.0.10/32},tenantNamespaces={team-a},console.enabled=true,console.url=https://console.example.com,console.oidc.issuer=https://idp.example.com,console.oidc.clientSecretSecret=console-oidc,console.oidc.allowedGroups={platform-admins,team-a},console.oidc.usernameClaim=sub,console.oidc.groupsPrefix=oidc:,console.oidc.recheckSeconds=600,console.trustedProxies={10.0.0.0/8},console.ingress.enabled=true,console.ingress.host=console.example.com,console.ingress.tlsSecret=console-tls,tracing.otlpEndpoint=http://otel-collector.observability:4317"])] {
        let mut args = vec!["template", "warren", &chart[..], "--namespace", "warren-system", "--include-crds"];
        args.extend(extra);
        let rendered = helm(&args);
        for kind in ["CustomResourceDefinition", "Deployment", "DaemonSet", "Service", "ClusterRole", "Role", "ServiceAccount", "Secret", "Namespace"] {
            assert!(rendered.contains(&format!("kind: {kind}\n")), "{name}: no {kind}");
        }
        assert!(!rendered.contains("kind: ServiceMonitor"), "{name}: ServiceMonitor rendered without its CRD");
        assert_eq!(rendered.contains("--otlp-endpoint"), name == "toggles", "{name}: spans only with an endpoint");
        assert_eq!(rendered.contains("kind: NetworkPolicy"), name == "default", "{name}: NetworkPolicy is on by default, off when disabled");
        if name == "toggles" {
            assert!(rendered.contains("--thread-store=s3://warren-threads") && rendered.contains("http://minio.storage:9000"), "{rendered}");
            assert!(rendered.contains("secretRef: {name: s3-creds}"), "credentials come from the named Secret");
            assert!(rendered.contains("secretKeyRef: {name: warren-records, key: url}") && !rendered.contains("--records=sqlite"), "replicas share PostgreSQL");
            assert!(rendered.contains("--webhook-allow-host=hooks.internal") && rendered.contains("--public-url=https://warren.example.com"), "{rendered}");
            assert!(rendered.contains("--local-storage-root=/srv/warren-data") && rendered.contains("hostPath: {path: /srv/warren-data, type: Directory}"), "an admin's Local root is granted and mounted");
            assert!(rendered.contains("--allow-endpoint=10.96.0.10/32"), "{rendered}");
            assert_eq!(rendered.matches("--otlp-endpoint=http://otel-collector.observability:4317").count(), 2, "the gateway and the node-agent export spans: {rendered}");
            assert!(rendered.contains("--console-listen=0.0.0.0:8081") && rendered.contains("--console-oidc-issuer=https://idp.example.com"), "{rendered}");
            assert!(rendered.contains("resources: [apikeys]\n    verbs: [patch]"), "the console's one write: {rendered}");
            assert!(rendered.contains("--console-allowed-groups=platform-admins,team-a"), "{rendered}");
            // The API server's OIDC rules, quoted (a prefix may end in ':'), and the trusted proxies.
            for flag in ["\"--console-oidc-username-claim=sub\"", "\"--console-oidc-groups-prefix=oidc:\"", "--console-recheck-secs=600", "--console-trusted-proxies=10.0.0.0/8"] {
                assert!(rendered.contains(flag), "{flag}: {rendered}");
            }
            assert!(!rendered.contains("--console-oidc-username-prefix"), "unset: the API server's default");
            assert!(rendered.contains("kind: Ingress\n") && rendered.contains("secretName: console-tls") && rendered.contains("host: \"console.example.com\""), "the optional console Ingress: {rendered}");
            assert!(rendered.contains("name: warren-console\n") && rendered.contains("resources: [subjectaccessreviews]"), "the console's Service and its one cluster permission");
        } else {
            assert!(rendered.contains("--thread-store=dir:/var/lib/warren/thread-store"), "the default keeps threads on the node");
            assert!(rendered.contains("--records=sqlite:///var/lib/warren/gateway/records.db"), "one replica keeps its records in the pod");
            assert!(!rendered.contains("--local-storage-root") && !rendered.contains("--allow-endpoint"), "no host path and no node endpoint by default");
            assert!(!rendered.contains("--console-listen") && !rendered.contains("subjectaccessreviews"), "no console by default");
            assert!(!rendered.contains("kind: Ingress\n") && !rendered.contains("port: 8081"), "nothing of the console by default");
            assert!(rendered.contains("except: [\"169.254.0.0/16\"]") && rendered.contains("fieldPath: status.hostIP"), "the agent's egress avoids the metadata service; it knows the node's address");
        }
        assert!(rendered.contains("--keys-namespace=warren-system-keys") && rendered.contains("--publish-namespace=warren-system-keys"), "{name}");
        assert_gateway_reads_secrets_only_in_the_keys_namespace(&rendered);
        assert_operator_reads_secrets_only_in_tenant_namespaces(&rendered, if name == "toggles" { &["team-a"] } else { &[] });
        // Helm prints large numbers as floats unless told not to (the agent
        // refused `--max-output-bytes=1.048576e+06` on a real node).
        assert!(!rendered.lines().any(|l| l.trim_start().starts_with("- --") && l.contains("e+0")), "{name}: a float-formatted flag");
        assert!(rendered.contains("--max-output-bytes=1048576"), "{name}");
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        // CRDs first (dry-run cannot create them for the custom objects).
        let applied = k.kubectl_ok(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]);
        assert!(applied.contains("daemonset.apps/warren-node-agent created (server dry run)"), "{applied}");
        assert!(applied.contains("deployment.apps/warren-gateway created (server dry run)"), "{applied}");
    }
    // Replicas without a shared record database are refused at render time.
    let alone = Command::new(warren_e2e::helm::helm().unwrap()).args(["template", "warren", &chart[..], "--set", "gateway.replicas=2"]).output().unwrap();
    assert!(!alone.status.success() && String::from_utf8_lossy(&alone.stderr).contains("gateway.records.existingSecret"));
    // Warren's own namespace is never a tenant's (its Secrets hold the CA keys).
    let own = Command::new(warren_e2e::helm::helm().unwrap()).args(["template", "warren", &chart[..], "--namespace", "warren-system", "--set", "tenantNamespaces={warren-system}"]).output().unwrap();
    assert!(!own.status.success() && String::from_utf8_lossy(&own.stderr).contains("Warren's own namespace"));
    // With the default NetworkPolicy, the console's port is let in too.
    let policy = helm(&["template", "warren", &chart[..], "--set", "console.enabled=true,console.url=https://c.example.com,console.oidc.issuer=https://idp.example.com,console.oidc.clientSecretSecret=s"]);
    let gateway_policy = policy.split("\n---").find(|d| d.contains("kind: NetworkPolicy") && d.contains("name: warren-gateway\n")).expect("the gateway's NetworkPolicy");
    assert!(gateway_policy.contains("{port: 8080, protocol: TCP}") && gateway_policy.contains("{port: 8081, protocol: TCP}"), "{gateway_policy}");
    // A console without its identity provider is refused at render time.
    let console = Command::new(warren_e2e::helm::helm().unwrap()).args(["template", "warren", &chart[..], "--set", "console.enabled=true,console.url=https://c.example.com"]).output().unwrap();
    assert!(!console.status.success() && String::from_utf8_lossy(&console.stderr).contains("console.oidc.issuer is required"));
    // An s3 store without a bucket is refused at render time, with the reason.
    let missing = Command::new(warren_e2e::helm::helm().unwrap()).args(["template", "warren", &chart[..], "--set", "threads.store=s3"]).output().unwrap();
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("threads.s3.bucket is required"));
}

/// The rendered object of `kind` named `name`, if any.
fn object(rendered: &str, kind: &str, name: &str) -> Option<serde_yaml::Value> {
    rendered.split("\n---").filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok()).find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
}

/// The gateway's HorizontalPodAutoscaler (issue #48): off by default (the
/// Deployment keeps its `replicas`); on, it scales the gateway Deployment
/// on the per-replica in-flight metric between its bounds, and the
/// Deployment names no replica count for `helm upgrade` to reset. On a
/// cluster without `autoscaling/v2` (the test API server is 1.20) it is
/// installed as `autoscaling/v2beta2`, which has the same fields.
#[test]
fn chart_gateway_autoscaling_is_off_by_default_and_owns_the_replicas_when_on() {
    if skip_unless_root("chart_gateway_autoscaling_is_off_by_default_and_owns_the_replicas_when_on") {
        return;
    }
    let chart = chart();
    let base = ["template", "warren", &chart[..], "--namespace", "warren-system"];
    let render = |set: &str| helm(&[&base[..], &["--set", set]].concat());
    let default = helm(&base);
    assert!(!default.contains("HorizontalPodAutoscaler"), "no HPA by default");
    let gateway = object(&default, "Deployment", "warren-gateway").expect("the gateway Deployment");
    assert_eq!(gateway["spec"]["replicas"], 1, "the Deployment sets its replicas without an HPA");

    let on = render("gateway.autoscaling.enabled=true,gateway.autoscaling.minReplicas=2,gateway.autoscaling.maxReplicas=6,gateway.autoscaling.inFlight.averageValue=12,gateway.autoscaling.targetCPUUtilizationPercentage=75,gateway.records.existingSecret=warren-records");
    let hpa = object(&on, "HorizontalPodAutoscaler", "warren-gateway").expect("the gateway's HPA");
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!((&hpa["spec"]["minReplicas"], &hpa["spec"]["maxReplicas"]), (&serde_yaml::Value::from(2), &serde_yaml::Value::from(6)));
    assert_eq!((&hpa["spec"]["scaleTargetRef"]["kind"], &hpa["spec"]["scaleTargetRef"]["name"]), (&serde_yaml::Value::from("Deployment"), &serde_yaml::Value::from("warren-gateway")));
    let metrics = hpa["spec"]["metrics"].as_sequence().expect("metrics");
    let pods = metrics.iter().find(|m| m["type"] == "Pods").expect("a Pods metric");
    assert_eq!(pods["pods"]["metric"]["name"], "warren_gateway_executions_in_flight", "the gateway's per-replica metric, by its Prometheus name");
    assert_eq!((&pods["pods"]["target"]["type"], &pods["pods"]["target"]["averageValue"]), (&serde_yaml::Value::from("AverageValue"), &serde_yaml::Value::from("12")));
    let cpu = metrics.iter().find(|m| m["type"] == "Resource").expect("the optional CPU target");
    assert_eq!((&cpu["resource"]["name"], &cpu["resource"]["target"]["averageUtilization"]), (&serde_yaml::Value::from("cpu"), &serde_yaml::Value::from(75)));
    let gateway = object(&on, "Deployment", "warren-gateway").expect("the gateway Deployment");
    assert!(gateway["spec"].get("replicas").is_none(), "the HPA owns the replica count: {:?}", gateway["spec"]);
    let operator = object(&on, "Deployment", "warren-operator").expect("the operator Deployment");
    assert_eq!(operator["spec"]["replicas"], 1, "only the gateway is scaled");
    // Without CPU, the in-flight metric alone.
    let in_flight_only = object(&render("gateway.autoscaling.enabled=true,gateway.records.existingSecret=r"), "HorizontalPodAutoscaler", "warren-gateway").unwrap();
    assert_eq!(in_flight_only["spec"]["metrics"].as_sequence().map(Vec::len), Some(1), "{in_flight_only:?}");

    // Refused at render time, with the reason: replicas that share no
    // records, and an HPA with nothing to scale on.
    let refused = |set: &str| {
        let out = Command::new(warren_e2e::helm::helm().unwrap()).args([&base[..], &["--set", set]].concat()).output().unwrap();
        assert!(!out.status.success(), "{set} renders");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused("gateway.autoscaling.enabled=true").contains("gateway.autoscaling.maxReplicas > 1 needs gateway.records.existingSecret"));
    assert!(refused("gateway.autoscaling.enabled=true,gateway.records.existingSecret=r,gateway.autoscaling.inFlight.enabled=false").contains("needs a metric"));
    assert!(refused("gateway.autoscaling.enabled=true,gateway.records.existingSecret=r,gateway.autoscaling.minReplicas=5,gateway.autoscaling.maxReplicas=2").contains("minReplicas must not exceed maxReplicas"));

    // Rendered for an older cluster without one to ask: the same object, v2beta2.
    let beta = object(&render("gateway.autoscaling.enabled=true,gateway.autoscaling.apiVersion=autoscaling/v2beta2,gateway.records.existingSecret=r"), "HorizontalPodAutoscaler", "warren-gateway").unwrap();
    assert_eq!(beta["apiVersion"], "autoscaling/v2beta2");

    // Installed on a real API server (1.20, no autoscaling/v2): the chart
    // asks the cluster, picks v2beta2, and the server keeps the HPA whole.
    let k = EnvTest::start().unwrap();
    let kubeconfig = k.kubeconfig().display().to_string();
    helm(&["install", "warren", &chart[..], "--namespace", "warren-system", "--create-namespace", "--kubeconfig", &kubeconfig, "--set", "gateway.autoscaling.enabled=true,gateway.autoscaling.minReplicas=2,gateway.autoscaling.maxReplicas=6,gateway.autoscaling.targetCPUUtilizationPercentage=75,gateway.records.existingSecret=r"]);
    let stored: serde_json::Value = serde_json::from_str(&k.kubectl_ok(&["get", "horizontalpodautoscalers.v2beta2.autoscaling", "warren-gateway", "-n", "warren-system", "-o", "json"])).unwrap();
    assert_eq!((&stored["spec"]["minReplicas"], &stored["spec"]["maxReplicas"]), (&serde_json::json!(2), &serde_json::json!(6)), "{stored}");
    assert_eq!(stored["spec"]["metrics"][0]["pods"]["metric"]["name"], "warren_gateway_executions_in_flight", "{stored}");
    assert_eq!(stored["spec"]["metrics"][1]["resource"]["target"]["averageUtilization"], 75, "{stored}");
    assert_eq!(stored["spec"]["scaleTargetRef"]["name"], "warren-gateway", "{stored}");
}

/// The gateway's Roles: Secrets only in the keys namespace.
fn assert_gateway_reads_secrets_only_in_the_keys_namespace(rendered: &str) {
    let mut seen = 0;
    for doc in rendered.split("\n---") {
        let Ok(v) = serde_yaml::from_str::<serde_yaml::Value>(doc) else { continue };
        if v["kind"] != "Role" || !v["metadata"]["name"].as_str().unwrap_or("").contains("-gateway") {
            continue;
        }
        seen += 1;
        let ns = v["metadata"]["namespace"].as_str().unwrap();
        let grants_secrets = v["rules"].as_sequence().unwrap().iter().any(|r| r["resources"].as_sequence().unwrap().iter().any(|x| x == "secrets"));
        assert_eq!(grants_secrets, ns == "warren-system-keys", "gateway Role in {ns}: {doc}");
    }
    assert_eq!(seen, 2, "the gateway has a Role for pods and one for the published keys");
}

/// The operator's Secret access (#26: it had cluster-wide get/list/watch,
/// the CA keys included): no ClusterRole grants Secrets; a Role per tenant
/// namespace does, and only there. Its agent credential is the warming
/// token, not the gateways'.
fn assert_operator_reads_secrets_only_in_tenant_namespaces(rendered: &str, tenants: &[&str]) {
    let mut granted = Vec::new();
    for doc in rendered.split("\n---") {
        let Ok(v) = serde_yaml::from_str::<serde_yaml::Value>(doc) else { continue };
        let kind = v["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let secrets = v["rules"].as_sequence().unwrap().iter().any(|r| r["resources"].as_sequence().unwrap().iter().any(|x| x == "secrets"));
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if kind == "ClusterRole" {
            assert!(!secrets, "ClusterRole {name} grants Secrets: {doc}");
        } else if secrets && name.contains("-operator-secrets") {
            granted.push(v["metadata"]["namespace"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(granted, tenants, "the operator's Secret Roles");
    let operator = rendered.split("\n---").find(|d| d.contains("name: warren-operator\n") && d.contains("kind: Deployment")).expect("the operator Deployment");
    assert!(operator.contains("--agent-token-file=/etc/warren/warm-token/token") && !operator.contains("warren-agent-token"), "the operator holds only the warming token: {operator}");
    for t in tenants {
        assert!(operator.contains(&format!("--tenant-namespace={t}")), "{operator}");
    }
}

/// One Secret's data, decoded.
fn secret(k: &EnvTest, name: &str) -> (std::collections::BTreeMap<String, String>, serde_json::Value) {
    let json: serde_json::Value = serde_json::from_str(&k.kubectl_ok(&["get", "secret", name, "-n", "warren-system", "-o", "json"])).unwrap();
    let data = json["data"].as_object().unwrap().iter().map(|(key, v)| {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
        (key.clone(), String::from_utf8(bytes).unwrap())
    });
    (data.collect(), json["metadata"]["annotations"].clone())
}

fn certs_in(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

/// The chart's mutual TLS, installed for real: the certificates it makes
/// connect a gateway to an agent (and nothing else: the CAs differ), a plain
/// `helm upgrade` keeps them, an upgrade inside the renewal window renews the
/// leaves under the same CA and rolls the pods, and a CA renewal keeps the old
/// CA in the trust bundles so old and new pods talk during the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_tls_connects_gateway_to_agent_and_rotates_on_upgrade() {
    if skip_unless_root("chart_tls_connects_gateway_to_agent_and_rotates_on_upgrade") {
        return;
    }
    let k = EnvTest::start().unwrap();
    let kubeconfig = k.kubeconfig().display().to_string();
    let chart = chart();
    let helm_run = |verb: &str, extra: &[&str]| {
        let mut args = vec![verb, "warren", &chart[..], "--namespace", "warren-system", "--create-namespace", "--kubeconfig", &kubeconfig];
        args.extend(extra);
        helm(&args);
    };
    let revision = |k: &EnvTest, kind: &str, name: &str| {
        k.kubectl_ok(&["get", kind, name, "-n", "warren-system", "-o", "jsonpath={.spec.template.metadata.annotations.warren\\.dev/tls-revision}"])
    };
    helm_run("install", &[]);
    let (ca, _) = secret(&k, "warren-tls-ca");
    let (agent, agent_meta) = secret(&k, "warren-node-agent-tls");
    let (gateway, _) = secret(&k, "warren-gateway-tls");
    assert_eq!(agent_meta["warren.dev/revision"], "1");
    assert_eq!(agent["peer-ca.crt"], ca["gateway-ca.crt"], "agents trust the gateway CA");
    assert_eq!(gateway["peer-ca.crt"], ca["agent-ca.crt"], "gateways trust the agent CA");
    assert_ne!(ca["gateway-ca.crt"], ca["agent-ca.crt"], "two CAs");
    assert!(!agent.contains_key("gateway-ca.key") && !gateway.contains_key("agent-ca.key"), "no pod gets a CA key");

    // The generated files run a real gateway against a real agent over TCP.
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let token = write("token", "chart-token-0123456789abcdef");
    let (a_crt, a_key, a_ca) = (write("a.crt", &agent["tls.crt"]), write("a.key", &agent["tls.key"]), write("a-ca.crt", &agent["peer-ca.crt"]));
    let (g_crt, g_key, g_ca) = (write("g.crt", &gateway["tls.crt"]), write("g.key", &gateway["tls.key"]), write("g-ca.crt", &gateway["peer-ca.crt"]));
    let listen = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let _agent = warren_e2e::Agent::start_no_wait(&[
        "--listen-tcp", &listen, "--token-file", &token, "--pool-size", "0",
        "--tls-cert-file", &a_crt, "--tls-key-file", &a_key, "--tls-client-ca-file", &a_ca,
    ])
    .unwrap();
    assert!(warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || std::net::TcpStream::connect(&listen).is_ok()));
    let gw_args = ["--agent-token-file", &token, "--agent-tls-cert-file", &g_crt, "--agent-tls-key-file", &g_key, "--agent-tls-ca-file", &g_ca];
    let gw = warren_e2e::gateway::Gateway::start(&[format!("https://{listen}")], &gw_args, true).await.unwrap();
    let r = gw.execute(&warren_e2e::gateway::key("main"), &serde_json::json!({"code": "print(6 * 7)", "language": "python"}));
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("42\n")), "{}", r.text());

    // A plain upgrade keeps every certificate and does not roll the pods.
    helm_run("upgrade", &[]);
    assert_eq!(secret(&k, "warren-node-agent-tls").0, agent);
    assert_eq!(secret(&k, "warren-tls-ca").0, ca);
    assert_eq!(revision(&k, "daemonset", "warren-node-agent"), "1");

    // Inside the leaves' renewal window (not the CA's): new leaves, same CA, pods roll.
    helm_run("upgrade", &["--set", "tls.rotateBeforeDays=400"]);
    let (agent2, meta2) = secret(&k, "warren-node-agent-tls");
    assert_ne!(agent2["tls.crt"], agent["tls.crt"], "the agent certificate was renewed");
    assert_ne!(secret(&k, "warren-gateway-tls").0["tls.crt"], gateway["tls.crt"], "the gateway certificate was renewed");
    assert_eq!(secret(&k, "warren-tls-ca").0, ca, "the CAs stay");
    assert_eq!(meta2["warren.dev/revision"], "2");
    assert_eq!(revision(&k, "daemonset", "warren-node-agent"), "2");
    assert_eq!(revision(&k, "deployment", "warren-gateway"), "2");

    // Inside the CAs' window: new CAs, and the bundles still trust the old ones.
    helm_run("upgrade", &["--set", "tls.rotateBeforeDays=4000"]);
    let (ca3, _) = secret(&k, "warren-tls-ca");
    assert_ne!(ca3["gateway-ca.crt"], ca["gateway-ca.crt"]);
    let (agent3, meta3) = secret(&k, "warren-node-agent-tls");
    assert_eq!(certs_in(&agent3["peer-ca.crt"]), 2, "new and old gateway CA");
    assert!(agent3["peer-ca.crt"].contains(ca["gateway-ca.crt"].trim()), "the old gateway CA is still trusted");
    assert!(secret(&k, "warren-gateway-tls").0["peer-ca.crt"].contains(ca["agent-ca.crt"].trim()), "the old agent CA is still trusted");
    assert_eq!(meta3["warren.dev/revision"], "3");
}
