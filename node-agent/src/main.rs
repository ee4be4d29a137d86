//! `warren-node-agent`: see the crate docs.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = warren_node_agent::Args::parse();
    warren_telemetry::init(&args.log_format);
    match warren_node_agent::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "node-agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}
