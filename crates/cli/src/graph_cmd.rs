//! `toolgraph graph`: inspect agent graphs.

use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum GraphCommand {
    /// Print the prebuilt agent's graph as a Mermaid flowchart.
    Show,
}

pub fn run(cmd: GraphCommand) -> ExitCode {
    match cmd {
        GraphCommand::Show => print!("{}", toolgraph_agents::react::mermaid()),
    }
    ExitCode::SUCCESS
}
