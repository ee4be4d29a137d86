//! `warren-operator`: reconciles Warren's custom resources.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = warren_operator::Args::parse();
    warren_telemetry::init(&args.log_format);
    match warren_operator::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "operator failed");
            std::process::ExitCode::FAILURE
        }
    }
}
