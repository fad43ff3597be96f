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

pub async fn run(cmd: GraphCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        GraphCommand::Show { agent } => {
            let name = agent.unwrap_or_else(|| cfg.default_agent_name());
            let agents = cfg.effective_agents();
            let Some(settings) = agents.get(&name) else {
                let known = agents.keys().cloned().collect::<Vec<_>>().join(", ");
                anyhow::bail!("no agent named '{name}'; configured agents: {known}");
            };
            if settings.graph_file.is_none() {
                print!("{}", toolgraph_agents::assembly::mermaid(settings.graph));
                return Ok(ExitCode::SUCCESS);
            }
            // A declared graph is drawn as its checks pass it, against the agent's tools.
            let shared = toolgraph_agents::assembly::SharedParts {
                tools: crate::agent::all_tools(cfg, None).await?,
                local_model: None,
                schema_prompt: None,
                kinds: Default::default(),
                memory_store: None,
                item_index: None,
            };
            print!("{}", toolgraph_agents::assembly::mermaid_of(cfg, Some(&name), &shared)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
