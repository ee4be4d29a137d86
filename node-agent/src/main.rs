//! `warren-node-agent`: see the crate docs.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = warren_node_agent::Args::parse();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(args.worker_threads(cpus)).enable_all().build();
    match runtime {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(e) => {
            eprintln!("warren-node-agent: starting its runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: warren_node_agent::Args) -> std::process::ExitCode {
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
