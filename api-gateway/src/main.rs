//! `warren-gateway`: serve the HTTP API, or `check` a manifest directory.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("check") {
        argv.remove(1);
        let args = warren_api_gateway::Args::parse_from(argv);
        let ok = warren_api_gateway::local_config::check(&args.manifests);
        return if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE };
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
    match rt.block_on(warren_api_gateway::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "gateway failed");
            std::process::ExitCode::FAILURE
        }
    }
}
