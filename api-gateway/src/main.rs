//! `warren-gateway`: serve the HTTP API, `check` a manifest directory, or
//! print the `e2b-key` alias of the API key on standard input.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("check") {
        argv.remove(1);
        let args = warren_api_gateway::Args::parse_from(argv);
        let ok = warren_api_gateway::local_config::check(&args.manifests);
        return if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE };
    }
    if argv.get(1).map(String::as_str) == Some("e2b-key") {
        return e2b_key();
    }
    let args = warren_api_gateway::Args::parse_from(argv);
    warren_telemetry::init(&args.log_format);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren-gateway: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Some(endpoint) = &args.otlp_endpoint {
        if let Err(e) = rt.block_on(async { warren_telemetry::otlp::init(endpoint, "warren-gateway") }) {
            tracing::error!(error = %e, "gateway failed");
            return std::process::ExitCode::FAILURE;
        }
    }
    let ran = rt.block_on(warren_api_gateway::run(args));
    warren_telemetry::otlp::flush();
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "gateway failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints the E2B alias (`e2b_…`) of the Warren API key read from stdin.
fn e2b_key() -> std::process::ExitCode {
    let mut key = String::new();
    use std::io::Read as _;
    let _ = std::io::stdin().take(4096).read_to_string(&mut key);
    let key = key.trim();
    if !warren_config::key::is_well_formed(key) {
        eprintln!("warren-gateway e2b-key: standard input must hold a Warren API key (sk-wrn-…)");
        return std::process::ExitCode::FAILURE;
    }
    println!("{}", warren_config::key::e2b_alias(key));
    std::process::ExitCode::SUCCESS
}
