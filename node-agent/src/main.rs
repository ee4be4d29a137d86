//! `warren-node-agent`: see the crate docs.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = warren_node_agent::Args::parse();
    warren_telemetry::init(&args.log_format);
    if let Some(endpoint) = &args.otlp_endpoint {
        if let Err(e) = warren_telemetry::otlp::init(endpoint, "warren-node-agent") {
            tracing::error!(error = %e, "node-agent failed");
            return std::process::ExitCode::FAILURE;
        }
    }
    let ran = warren_node_agent::run(args).await;
    warren_telemetry::otlp::flush();
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "node-agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}
