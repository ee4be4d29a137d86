//! What an `Unrestricted` network adds to a call, against `Blocked`, in one
//! run: N round trips of each, interleaved, through the real agent with its
//! warm pool (the veth, chain and shaping are built while a sandbox is
//! pooled; a call adds reading its refused-destination set and the
//! teardown after the answer), and an allowlisted call that resolves one
//! name (the DNS proxy's lookup and allow-set update). Also: one HTTP GET to the lab's public host
//! from inside the sandbox, to show the path works while measured. Needs
//! root.
//!
//! Then under load: C clients call bash `echo 1` back to back for S seconds,
//! first all `Blocked`, then all `Unrestricted`; p50/p99 of each and the
//! ratio of the p99s (pool misses build networks while others run).
//!
//! `cargo bench -p warren-e2e --bench network` (N from WARREN_BENCH_RUNS,
//! default 200; C from WARREN_BENCH_CLIENTS, default 16; S from
//! WARREN_BENCH_SECONDS, default 10).

use std::time::{Duration, Instant};

use warren_e2e::bench::{ms, percentile};
use warren_e2e::netlab::NetLab;
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent::{EgressRule, ExecuteRequest, Language, NetworkPolicy};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED network: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let gap = Duration::from_millis(std::env::var("WARREN_BENCH_GAP_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5));
    let lab = NetLab::start().expect("network lab");
    let args = lab.agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&args).await.expect("agent starts");
    let mut client = agent.client().await.expect("client");
    let req = |network: NetworkPolicy, egress: Vec<EgressRule>| ExecuteRequest { network: network as i32, egress, ..request(Language::Python, "print(1)", Duration::from_secs(30)) };
    let allow = || vec![EgressRule { host: "public.test".into(), ports: vec![80] }];
    // One allowlisted lookup per call: the proxy asks the resolver and adds
    // the answer to the sandbox's allow set before answering.
    let lookup = ExecuteRequest { code: "import socket; socket.gethostbyname('public.test'); print(1)".into(), ..req(NetworkPolicy::Unrestricted, allow()) };
    let variants = [
        ("blocked", req(NetworkPolicy::Blocked, vec![])),
        ("unrestricted", req(NetworkPolicy::Unrestricted, vec![])),
        ("allowlist", req(NetworkPolicy::Unrestricted, allow())),
        ("allow+lookup", lookup),
    ];
    let get = ExecuteRequest {
        code: "import urllib.request; print(urllib.request.urlopen('http://public.test/', timeout=5).read().decode().strip())".into(),
        ..variants[2].1.clone()
    };
    let fetched = agent.run_request(get).await.expect("GET from the sandbox");
    assert_eq!(fetched.stdout, "warren-lab\n", "{}", fetched.stderr);
    println!("network benchmark: {runs} runs per variant, interleaved (python print(1))");
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for (_, r) in &variants {
        for _ in 0..5 {
            agent.run_request(r.clone()).await.unwrap();
        }
    }
    for _ in 0..runs {
        for (i, (_, r)) in variants.iter().enumerate() {
            let t = Instant::now();
            let mut stream = client.execute(r.clone()).await.unwrap().into_inner();
            while let Some(ev) = stream.message().await.unwrap() {
                if let Some(warren_proto::agent::execute_event::Event::Exited(e)) = ev.event {
                    assert_eq!(e.exit_code, 0);
                }
            }
            times[i].push(t.elapsed());
            // Let the pool refill between calls, as between an agent's tool calls.
            tokio::time::sleep(gap).await;
        }
    }
    for t in &mut times {
        t.sort();
    }
    let (b50, b99) = (percentile(&times[0], 0.5), percentile(&times[0], 0.99));
    println!("{:<13} {:>10} {:>10} {:>10} {:>10}", "network", "p50", "p99", "Δ p50", "Δ p99");
    for (i, (name, _)) in variants.iter().enumerate() {
        let (p50, p99) = (percentile(&times[i], 0.5), percentile(&times[i], 0.99));
        println!("{:<13} {:>8.2}ms {:>8.2}ms {:>+8.2}ms {:>+8.2}ms", name, ms(p50), ms(p99), ms(p50) - ms(b50), ms(p99) - ms(b99));
    }
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (clients, seconds) = (env("WARREN_BENCH_CLIENTS", 16) as usize, Duration::from_secs(env("WARREN_BENCH_SECONDS", 10)));
    println!();
    println!("under load: {clients} clients, {} s each, bash `echo 1`", seconds.as_secs());
    println!("{:<13} {:>8} {:>8} {:>10} {:>10}", "network", "calls", "errors", "p50", "p99");
    let mut p99s = Vec::new();
    for (name, network) in [("blocked", NetworkPolicy::Blocked), ("unrestricted", NetworkPolicy::Unrestricted)] {
        let r = ExecuteRequest { network: network as i32, ..request(Language::Bash, "echo 1", Duration::from_secs(30)) };
        let (mut times, errors, first) = load(&agent, r, clients, seconds).await;
        if let Some(e) = first {
            println!("  first error: {e}");
        }
        times.sort();
        let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
        println!("{:<13} {:>8} {:>8} {:>8.2}ms {:>8.2}ms", name, times.len(), errors, ms(p50), ms(p99));
        p99s.push(p99);
    }
    println!("unrestricted p99 / blocked p99: {:.2}x", ms(p99s[1]) / ms(p99s[0]));
    drop(agent);
    drop(lab);
}

/// `clients` callers repeating `r` until `duration` ends: every call's
/// time, and how many failed (bounded: the calls end with the duration).
async fn load(agent: &Agent, r: ExecuteRequest, clients: usize, duration: Duration) -> (Vec<Duration>, u64, Option<String>) {
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (mut client, r) = (agent.client().await.expect("client"), r.clone());
        tasks.push(tokio::spawn(async move {
            let (mut times, mut errors, mut first) = (Vec::new(), 0u64, None);
            while Instant::now() < deadline {
                let t = Instant::now();
                let mut ok = false;
                match client.execute(r.clone()).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        while let Ok(Some(ev)) = stream.message().await {
                            if let Some(warren_proto::agent::execute_event::Event::Exited(e)) = ev.event {
                                ok = e.exit_code == 0;
                                if !ok {
                                    first.get_or_insert_with(|| format!("{e:?}"));
                                }
                            }
                        }
                    }
                    Err(e) => {
                        first.get_or_insert_with(|| format!("{}: {}", e.code(), e.message()));
                    }
                }
                match ok {
                    true => times.push(t.elapsed()),
                    false => errors += 1,
                }
            }
            (times, errors, first)
        }));
    }
    let mut all = (Vec::new(), 0, None);
    for t in tasks {
        let (times, errors, first) = t.await.expect("client task");
        all.0.extend(times);
        all.1 += errors;
        all.2 = all.2.or(first);
    }
    all
}
