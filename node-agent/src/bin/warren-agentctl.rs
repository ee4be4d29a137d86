//! `warren-agentctl`: talk to a node-agent over its Unix socket.
//!
//! ```text
//! warren-agentctl --socket /run/warren/agent.sock status
//! warren-agentctl --socket /run/warren/agent.sock run python 'print(1)'
//! ```

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use warren_proto::client::AgentAddress;
use warren_proto::agent::{self as pb, execute_event::Event, node_agent_client::NodeAgentClient};

#[derive(Parser)]
#[command(name = "warren-agentctl", about = "Client for warren-node-agent")]
struct Cli {
    /// The agent's Unix socket.
    #[arg(long, env = "WARREN_AGENT_SOCKET", default_value = "/run/warren/agent.sock")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Node name, isolation features, load.
    Status,
    /// Run code once: `run <python|node|bash> <code>`; prints its output, exits with its status.
    Run {
        language: String,
        code: String,
        /// Wall-clock limit in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u32,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let channel = warren_proto::client::connect(&AgentAddress::Unix(cli.socket.clone()), &None)
        .await
        .with_context(|| format!("connecting to {}", cli.socket.display()))?;
    let mut client = NodeAgentClient::new(channel);
    match cli.command {
        Cmd::Status => {
            let s = client.status(pb::StatusRequest {}).await?.into_inner();
            println!("{s:#?}");
        }
        Cmd::Run { language, code, timeout } => {
            let language = match language.as_str() {
                "python" => pb::Language::Python,
                "node" => pb::Language::Node,
                "bash" => pb::Language::Bash,
                other => anyhow::bail!("unknown language {other:?}: use python, node or bash"),
            };
            let req = pb::ExecuteRequest { language: language as i32, code, timeout_ms: timeout * 1000, ..Default::default() };
            let mut stream = client.execute(req).await?.into_inner();
            while let Some(ev) = stream.message().await? {
                match ev.event {
                    Some(Event::Stdout(c)) => std::io::stdout().write_all(&c.data)?,
                    Some(Event::Stderr(c)) => std::io::stderr().write_all(&c.data)?,
                    Some(Event::Exited(e)) => {
                        eprintln!(
                            "[exit {} | {:.1} ms wall | {:.1} ms cpu | {} peak{}{}]",
                            e.exit_code,
                            e.wall_micros as f64 / 1000.0,
                            e.cpu_micros as f64 / 1000.0,
                            e.peak_memory_bytes.map_or("unknown".to_string(), |b| format!("{} KiB", b / 1024)),
                            if e.timed_out { " | timed out" } else { "" },
                            if e.oom_killed { " | OOM-killed" } else { "" },
                        );
                        std::process::exit(e.exit_code.clamp(0, 255));
                    }
                    _ => {}
                }
            }
            anyhow::bail!("the agent ended the stream without a result");
        }
    }
    Ok(())
}
