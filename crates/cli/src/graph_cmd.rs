//! `toolgraph graph`: inspect agent graphs.

use clap::Subcommand;
use std::process::ExitCode;
use toolgraph_config::Config;

#[derive(Debug, Subcommand)]
pub enum GraphCommand {
    /// Print an agent's graph as a Mermaid flowchart (default: the default agent's).
    Show {
        /// The agent (`[agents.NAME]`).
        #[arg(long)]
        agent: Option<String>,
    },
}

pub fn run(cmd: GraphCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        GraphCommand::Show { agent } => {
            let name = agent.unwrap_or_else(|| cfg.default_agent_name());
            let agents = cfg.effective_agents();
            let Some(settings) = agents.get(&name) else {
                let known = agents.keys().cloned().collect::<Vec<_>>().join(", ");
                anyhow::bail!("no agent named '{name}'; configured agents: {known}");
            };
            print!("{}", toolgraph_agents::assembly::mermaid(settings.graph));
        }
    }
    Ok(ExitCode::SUCCESS)
}
