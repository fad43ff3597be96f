//! `toolgraph agents`: the configured agents, and the checks of declared graphs
//! (docs/agents.md) without starting the service.

use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_config::Config;

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Check graph declarations: FILE against the agent's tools (`--agent`, default: every
    /// tool the configuration enables), or, without FILE, every agent's `graph_file`.
    Check {
        /// A graph declaration (TOML).
        file: Option<PathBuf>,
        /// Check against this agent's tools.
        #[arg(long)]
        agent: Option<String>,
    },
}

pub async fn run(cmd: AgentsCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let AgentsCommand::Check { file, agent } = cmd;
    let all = crate::agent::all_tools(cfg, None).await?;
    let agents = cfg.effective_agents();
    let tools_of = |name: &str| toolgraph_agents::assembly::agent_tools(cfg, Some(name), &all).map(|(_, _, t)| t);
    let targets: Vec<(String, PathBuf, toolgraph_tools::ToolRegistry)> = match file {
        Some(file) => {
            let tools = match &agent {
                Some(name) => tools_of(name)?,
                None => all.clone(),
            };
            vec![(agent.unwrap_or_else(|| "(every tool)".into()), file, tools)]
        }
        None => {
            let mut out = Vec::new();
            for (name, settings) in &agents {
                if let Some(file) = &settings.graph_file
                    && agent.as_ref().is_none_or(|a| a == name)
                {
                    out.push((name.clone(), file.clone(), tools_of(name)?));
                }
            }
            if out.is_empty() {
                println!("no agent declares its graph (`graph_file`); give a FILE to check one");
                return Ok(ExitCode::SUCCESS);
            }
            out
        }
    };
    let mut failed = false;
    for (agent, file, tools) in targets {
        // `toolgraph` has only the built-in node kinds; a program that adds its own checks its
        // declarations itself (docs/agents.md).
        match toolgraph_agents::assembly::declared_plan(cfg, &file, &tools, &Default::default()) {
            Ok(plan) => {
                let declared = plan.nodes.len();
                let about = plan.description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                println!("ok   {} ({agent}): {declared} nodes, starts at `{}`{about}", file.display(), plan.start);
            }
            Err(toolgraph_agents::AgentError::Declared(errors)) => {
                failed = true;
                eprintln!("FAIL {} ({agent}): {} problem(s)", file.display(), errors.0.len());
                for e in &errors.0 {
                    eprintln!("  {e}");
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
